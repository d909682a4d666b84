/* vh_comm.h - the communicator: one interface, several backends.
 *
 * Backends: self (one process, in the SDK runtime), MPI (CPU processes) and
 * NCCL (GPUs) in later versions. Sharding and precision plugins call these
 * and never know which backend is behind them. All calls are collective:
 * every rank calls them in the same order with the same counts.
 */
#ifndef VITHOST_VH_COMM_H
#define VITHOST_VH_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "vh_status.h"
#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_reduce_op {
    VH_REDUCE_OP_SUM = 0,
    VH_REDUCE_OP_MAX = 1,
    VH_REDUCE_OP_MIN = 2,
} vh_reduce_op;

typedef struct vh_comm vh_comm;

typedef struct vh_comm_ops {
    uint32_t struct_size;
    /* In place: buf holds count elements on every rank. */
    vh_status (*all_reduce)(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                            vh_reduce_op op);
    /* send: world*count elements; recv: this rank's count elements. */
    vh_status (*reduce_scatter)(vh_comm *c, const void *send, void *recv,
                                size_t count, vh_dtype dtype, vh_reduce_op op);
    /* send: count elements; recv: world*count elements, rank-major. */
    vh_status (*all_gather)(vh_comm *c, const void *send, void *recv,
                            size_t count, vh_dtype dtype);
    vh_status (*broadcast)(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                           int32_t root);
    vh_status (*barrier)(vh_comm *c);
} vh_comm_ops;

struct vh_comm {
    uint32_t struct_size;
    const char *backend;   /* "self", "mpi", "nccl" */
    int32_t rank, world_size;
    const vh_comm_ops *ops;
    void *impl;            /* backend state */
};

#ifdef __cplusplus
}
#endif
#endif
