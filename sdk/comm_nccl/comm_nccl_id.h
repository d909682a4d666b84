/* comm_nccl_id.h - how the ranks of an NCCL run agree on one ncclUniqueId:
 * plain C over MPI, so that the CPU tests check it without a GPU
 * (tests/sharding/test_nccl_id_mpi.c). Part of libvh_comm_nccl.so, never
 * installed. */
#ifndef VH_COMM_NCCL_ID_H
#define VH_COMM_NCCL_ID_H

#include <mpi.h>

/* NCCL_UNIQUE_ID_BYTES; comm_nccl.c asserts that the two agree. */
#define VH_NCCL_ID_BYTES 128

/* Collective over `comm`: every rank ends with root's VH_NCCL_ID_BYTES bytes
 * of id and root's *root_ok (1: root made an id; 0: it could not, and no rank
 * may go on to ncclCommInitRank, which would wait forever for it). On root
 * both are inputs; elsewhere their values on entry are ignored. Returns MPI's
 * error code (MPI_SUCCESS); on an error id and *root_ok are unchanged. */
int vh_nccl_exchange_id(MPI_Comm comm, int root, unsigned char id[VH_NCCL_ID_BYTES],
                        int *root_ok);

#endif
