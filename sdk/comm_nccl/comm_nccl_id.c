/* comm_nccl_id.c - see comm_nccl_id.h. */
#include "comm_nccl_id.h"

#include <string.h>

int vh_nccl_exchange_id(MPI_Comm comm, int root, unsigned char id[VH_NCCL_ID_BYTES],
                        int *root_ok) {
    /* One message: root's verdict first, then the id, so a root that failed
     * cannot leave the others holding a stale id they believe in. */
    unsigned char msg[1 + VH_NCCL_ID_BYTES];
    int rank = 0;
    int rc = MPI_Comm_rank(comm, &rank);
    if (rc != MPI_SUCCESS) return rc;
    memset(msg, 0, sizeof msg);
    if (rank == root) {
        msg[0] = *root_ok ? 1 : 0;
        memcpy(msg + 1, id, VH_NCCL_ID_BYTES);
    }
    rc = MPI_Bcast(msg, (int)sizeof msg, MPI_UNSIGNED_CHAR, root, comm);
    if (rc != MPI_SUCCESS) return rc;
    *root_ok = msg[0];
    memcpy(id, msg + 1, VH_NCCL_ID_BYTES);
    return MPI_SUCCESS;
}
