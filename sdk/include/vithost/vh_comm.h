/* vh_comm.h - the communicator: one interface, several backends.
 *
 * Backends: self (one process, in the SDK runtime), mpi (CPU processes, its
 * own shared object libvh_comm_mpi.so) and nccl (GPUs, libvh_comm_nccl.so).
 * The recipe chooses one (`run.comm`), the host loads it, and sharding and
 * precision plugins call it without knowing which is behind it.
 *
 * Every collective is started and later finished: *_start returns a request
 * handle, `wait` finishes it (and frees the handle), `test` asks without
 * blocking. The buffers belong to the collective until it is finished. Where
 * the device has streams the collective is ordered on `stream` (NULL: the
 * current stream) like a compute op. A backend whose collectives progress
 * only inside MPI calls is driven by `test`: call it between compute ops to
 * overlap communication with them.
 *
 * All collectives are collective: every rank starts them in the same order
 * with the same counts, dtypes and ops (a mismatch hangs or fails).
 *
 * Threads. Every call is made from the thread that opened the communicator
 * (the host's main thread, which also calls every plugin), one call at a
 * time: the mpi backend initialises MPI with MPI_THREAD_FUNNELED, so a call
 * from a plugin's worker or compute thread is undefined.
 *
 * Marks, for every call of vh_comm_ops (test_abi_marks holds them against
 * the host's comm_op_marks): @required, a backend must have it (the host
 * refuses a backend without it when it opens the communicator);
 * @optional(default: ...), it may be NULL or lie past a smaller (older)
 * struct_size, and stays NULL through the host's counting layer, so a caller
 * checks it first.
 */
#ifndef VITHOST_VH_COMM_H
#define VITHOST_VH_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "vh_device.h"
#include "vh_status.h"
#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_reduce_op {
    VH_REDUCE_OP_SUM = 0,
    VH_REDUCE_OP_MAX = 1,
    VH_REDUCE_OP_MIN = 2,
    VH_REDUCE_OP_AVG = 3, /* sum / world_size, in the reduction's dtype */
} vh_reduce_op;

typedef struct vh_comm vh_comm;
typedef struct vh_comm_request vh_comm_request; /* one collective in flight */

typedef struct vh_comm_ops {
    uint32_t struct_size;
    /* @required @thread(main). In place: buf holds count elements on every
     * rank. *req: @owns(the backend; freed by wait). */
    vh_status (*all_reduce_start)(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                  vh_reduce_op op, vh_stream *stream, vh_comm_request **req);
    /* @required @thread(main). send: world*count elements; recv: this
     * rank's count elements. */
    vh_status (*reduce_scatter_start)(vh_comm *c, const void *send, void *recv, size_t count,
                                      vh_dtype dtype, vh_reduce_op op, vh_stream *stream,
                                      vh_comm_request **req);
    /* @required @thread(main). send: count elements; recv: world*count
     * elements, rank-major. */
    vh_status (*all_gather_start)(vh_comm *c, const void *send, void *recv, size_t count,
                                  vh_dtype dtype, vh_stream *stream, vh_comm_request **req);
    /* @optional(default: none, the call stays NULL; a caller without it
     * keeps what each rank has: ddp then relies on load_unit's rule that
     * every rank is given the same values) @thread(main). In place: root's
     * count elements to every rank. */
    vh_status (*broadcast_start)(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 int32_t root, vh_stream *stream, vh_comm_request **req);
    /* @required @thread(main). Finishes a request and frees it; NULL is a
     * no-op. */
    vh_status (*wait)(vh_comm *c, vh_comm_request *req);
    /* @optional(default: none, the call stays NULL; a caller skips it and
     * the collective progresses in wait, with no overlap) @thread(main).
     * *done = 1 when the request has finished (it must still be waited on). */
    vh_status (*test)(vh_comm *c, vh_comm_request *req, int *done);
    /* @required @thread(main). The host calls it after every checkpoint. */
    vh_status (*barrier)(vh_comm *c);
    /* @required @thread(main). Ends every rank's run with an error after a
     * local failure, so no rank waits forever on a collective this one will
     * never start. The host calls it when a run of more than one rank
     * fails (not when it is interrupted); it need not return. */
    void (*abort)(vh_comm *c, int code);
    /* ---- ABI 2.3 ---- */
    /* @optional(default: none, the call stays NULL; the host then saves
     * optimizer state by summing each zero-padded tensor over the ranks
     * with all_reduce_start, as before 2.3) @thread(main). A gather of
     * unequal parts to one rank (MPI_Gatherv): every rank sends its `count`
     * elements of `send`; `root` receives them in `recv`, rank after rank
     * with no gaps (rank r's counts[r] elements start at element
     * counts[0] + ... + counts[r-1]). `recv` and `counts` (world_size
     * entries, counts[r] equal to rank r's count) are read on root only and
     * may be NULL elsewhere; they, and `send`, belong to the collective
     * until wait. The other ranks receive nothing: none needs a buffer of
     * the whole, which is what a checkpoint save of sharded state wants. */
    vh_status (*gather_start)(vh_comm *c, const void *send, size_t count, void *recv,
                              const size_t *counts, vh_dtype dtype, int32_t root,
                              vh_stream *stream, vh_comm_request **req);
} vh_comm_ops;

struct vh_comm {
    uint32_t struct_size;
    const char *backend;   /* "self", "mpi", "nccl" */
    int32_t rank, world_size;
    int32_t local_rank, local_size; /* on this machine: picks the GPU */
    const vh_comm_ops *ops;
    void *impl;            /* backend state */
};

/* Blocking forms: start, then wait. vh_comm_broadcast and vh_comm_gather
 * call optional members: check them for NULL first (the table the host
 * hands plugins is this SDK's size; a backend's own table may be older). */
static inline vh_status vh_comm_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                           vh_reduce_op op) {
    vh_comm_request *r = NULL;
    vh_status st = c->ops->all_reduce_start(c, buf, count, dtype, op, NULL, &r);
    return st == VH_STATUS_OK ? c->ops->wait(c, r) : st;
}
static inline vh_status vh_comm_reduce_scatter(vh_comm *c, const void *send, void *recv,
                                               size_t count, vh_dtype dtype, vh_reduce_op op) {
    vh_comm_request *r = NULL;
    vh_status st = c->ops->reduce_scatter_start(c, send, recv, count, dtype, op, NULL, &r);
    return st == VH_STATUS_OK ? c->ops->wait(c, r) : st;
}
static inline vh_status vh_comm_all_gather(vh_comm *c, const void *send, void *recv,
                                           size_t count, vh_dtype dtype) {
    vh_comm_request *r = NULL;
    vh_status st = c->ops->all_gather_start(c, send, recv, count, dtype, NULL, &r);
    return st == VH_STATUS_OK ? c->ops->wait(c, r) : st;
}
static inline vh_status vh_comm_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                          int32_t root) {
    vh_comm_request *r = NULL;
    vh_status st = c->ops->broadcast_start(c, buf, count, dtype, root, NULL, &r);
    return st == VH_STATUS_OK ? c->ops->wait(c, r) : st;
}

static inline vh_status vh_comm_gather(vh_comm *c, const void *send, size_t count, void *recv,
                                       const size_t *counts, vh_dtype dtype, int32_t root) {
    vh_comm_request *r = NULL;
    vh_status st = c->ops->gather_start(c, send, count, recv, counts, dtype, root, NULL, &r);
    return st == VH_STATUS_OK ? c->ops->wait(c, r) : st;
}

/* A communicator backend's shared object (libvh_comm_<name>.so) exports
 * this function; the host calls it once per run, after the device is open
 * (NCCL needs it). `device` may be NULL for backends that do not need it.
 * On failure it writes a message into err. */
#define VH_COMM_OPEN_SYMBOL "vh_comm_open"
typedef struct vh_comm_open_args {
    uint32_t struct_size;
    uint16_t abi_major, abi_minor; /* of the host */
    const struct vh_device_ops *device;
} vh_comm_open_args;
typedef vh_status (*vh_comm_open_fn)(const vh_comm_open_args *args, vh_comm **out,
                                     char *err, size_t err_len);
typedef void (*vh_comm_close_fn)(vh_comm *comm);
#define VH_COMM_CLOSE_SYMBOL "vh_comm_close"

#ifdef __cplusplus
}
#endif
#endif
