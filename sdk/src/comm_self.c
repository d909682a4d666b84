/* comm_self.c - the communicator of a one-process run. Every collective is
 * the identity (a copy where send and receive buffers differ), so plugins
 * written for many ranks run unchanged on one. Collectives finish when they
 * start; their request is a static token that wait and test accept. */
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_runtime.h"

/* The one request every self collective returns: already finished. */
static char self_done_token;
#define SELF_DONE ((vh_comm_request *)&self_done_token)

static vh_status finished(vh_comm_request **req) {
    if (req) *req = SELF_DONE;
    return VH_STATUS_OK;
}

static vh_status self_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)buf, (void)count, (void)stream;
    if (vh_dtype_size(dtype) == 0 || op < VH_REDUCE_OP_SUM || op > VH_REDUCE_OP_AVG)
        return VH_STATUS_ERR_INVALID_ARG;
    return finished(req);
}

static vh_status self_reduce_scatter(vh_comm *c, const void *send, void *recv, size_t count,
                                     vh_dtype dtype, vh_reduce_op op, vh_stream *stream,
                                     vh_comm_request **req) {
    (void)c, (void)stream;
    if (vh_dtype_size(dtype) == 0 || op < VH_REDUCE_OP_SUM || op > VH_REDUCE_OP_AVG)
        return VH_STATUS_ERR_INVALID_ARG;
    if (send != recv && count) memmove(recv, send, count * vh_dtype_size(dtype));
    return finished(req);
}

static vh_status self_all_gather(vh_comm *c, const void *send, void *recv, size_t count,
                                 vh_dtype dtype, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)stream;
    if (vh_dtype_size(dtype) == 0) return VH_STATUS_ERR_INVALID_ARG;
    if (send != recv && count) memmove(recv, send, count * vh_dtype_size(dtype));
    return finished(req);
}

static vh_status self_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                int32_t root, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)buf, (void)count, (void)stream;
    if (vh_dtype_size(dtype) == 0 || root != 0) return VH_STATUS_ERR_INVALID_ARG;
    return finished(req);
}

/* One rank: its part is the whole (counts[0] == count). */
static vh_status self_gather(vh_comm *c, const void *send, size_t count, void *recv,
                             const size_t *counts, vh_dtype dtype, int32_t root,
                             vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)stream;
    if (vh_dtype_size(dtype) == 0 || root != 0 || !counts || counts[0] != count ||
        (count && (!send || !recv)))
        return VH_STATUS_ERR_INVALID_ARG;
    if (send != recv && count) memmove(recv, send, count * vh_dtype_size(dtype));
    return finished(req);
}

static vh_status self_wait(vh_comm *c, vh_comm_request *req) {
    (void)c;
    return req == NULL || req == SELF_DONE ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}

static vh_status self_test(vh_comm *c, vh_comm_request *req, int *done) {
    (void)c;
    if (req != SELF_DONE || !done) return VH_STATUS_ERR_INVALID_ARG;
    *done = 1;
    return VH_STATUS_OK;
}

static vh_status self_barrier(vh_comm *c) {
    (void)c;
    return VH_STATUS_OK;
}

/* Nobody else to tell: the host exits by itself. */
static void self_abort(vh_comm *c, int code) { (void)c, (void)code; }

static const vh_comm_ops self_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce_start = self_all_reduce,
    .reduce_scatter_start = self_reduce_scatter,
    .all_gather_start = self_all_gather,
    .broadcast_start = self_broadcast,
    .wait = self_wait,
    .test = self_test,
    .barrier = self_barrier,
    .abort = self_abort,
    .gather_start = self_gather,
};

void vh_comm_self_init(vh_comm *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->backend = "self";
    out->rank = 0;
    out->world_size = 1;
    out->local_rank = 0;
    out->local_size = 1;
    out->ops = &self_ops;
    out->impl = NULL;
}

vh_status vh_comm_self_open(const vh_comm_open_args *args, vh_comm **out, char *err,
                            size_t err_len) {
    (void)args, (void)err, (void)err_len;
    vh_comm *c = malloc(sizeof *c);
    if (!c) return VH_STATUS_ERR_NOMEM;
    vh_comm_self_init(c);
    *out = c;
    return VH_STATUS_OK;
}

void vh_comm_self_close(vh_comm *comm) { free(comm); }
