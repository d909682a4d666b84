/* comm_self.c - the communicator of a one-process run. Every collective is
 * the identity (a copy where send and receive buffers differ), so plugins
 * written for many ranks run unchanged on one. Collectives finish when they
 * start; their request is a static token that wait and test accept. On a
 * GPU (vh_comm_self_init_device) the copies go through the device: the
 * buffers are device memory, which memmove cannot touch. */
#include <stdint.h>
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

/* recv <- send: through the device when the communicator has one (impl). */
static vh_status self_copy(vh_comm *c, void *recv, const void *send, size_t bytes,
                           vh_stream *stream) {
    const vh_device_ops *dev = c->impl;
    if (send == recv || bytes == 0) return VH_STATUS_OK;
    if (dev)
        return dev->copy(dev->device, recv, send, bytes, VH_COPY_KIND_DEVICE_TO_DEVICE, stream);
    memmove(recv, send, bytes);
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
    if (vh_dtype_size(dtype) == 0 || op < VH_REDUCE_OP_SUM || op > VH_REDUCE_OP_AVG)
        return VH_STATUS_ERR_INVALID_ARG;
    vh_status st = self_copy(c, recv, send, count * vh_dtype_size(dtype), stream);
    return st == VH_STATUS_OK ? finished(req) : st;
}

static vh_status self_all_gather(vh_comm *c, const void *send, void *recv, size_t count,
                                 vh_dtype dtype, vh_stream *stream, vh_comm_request **req) {
    if (vh_dtype_size(dtype) == 0) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st = self_copy(c, recv, send, count * vh_dtype_size(dtype), stream);
    return st == VH_STATUS_OK ? finished(req) : st;
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
    if (vh_dtype_size(dtype) == 0 || root != 0 || !counts || counts[0] != count ||
        (count && (!send || !recv)))
        return VH_STATUS_ERR_INVALID_ARG;
    vh_status st = self_copy(c, recv, send, count * vh_dtype_size(dtype), stream);
    return st == VH_STATUS_OK ? finished(req) : st;
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

void vh_comm_self_init_device(vh_comm *out, const vh_device_ops *dev) {
    vh_comm_self_init(out);
    /* (the CPU device's memory is host memory: memmove is its copy) */
    if (dev && dev->kind != VH_DEVICE_KIND_CPU && dev->copy) out->impl = (void *)(uintptr_t)dev;
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
