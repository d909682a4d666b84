/* comm_self.c - the communicator of a one-process run. Every collective is
 * the identity (a copy where send and receive buffers differ), so plugins
 * written for many ranks run unchanged on one. */
#include <string.h>

#include "vithost/vh_runtime.h"

static vh_status self_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op) {
    (void)c, (void)buf, (void)count, (void)dtype, (void)op;
    return VH_STATUS_OK;
}

static vh_status self_reduce_scatter(vh_comm *c, const void *send, void *recv,
                                     size_t count, vh_dtype dtype, vh_reduce_op op) {
    (void)c, (void)op;
    if (send != recv) memmove(recv, send, count * vh_dtype_size(dtype));
    return VH_STATUS_OK;
}

static vh_status self_all_gather(vh_comm *c, const void *send, void *recv, size_t count,
                                 vh_dtype dtype) {
    (void)c;
    if (send != recv) memmove(recv, send, count * vh_dtype_size(dtype));
    return VH_STATUS_OK;
}

static vh_status self_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                int32_t root) {
    (void)c, (void)buf, (void)count, (void)dtype;
    return root == 0 ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}

static vh_status self_barrier(vh_comm *c) {
    (void)c;
    return VH_STATUS_OK;
}

static const vh_comm_ops self_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce = self_all_reduce,
    .reduce_scatter = self_reduce_scatter,
    .all_gather = self_all_gather,
    .broadcast = self_broadcast,
    .barrier = self_barrier,
};

void vh_comm_self_init(vh_comm *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->backend = "self";
    out->rank = 0;
    out->world_size = 1;
    out->ops = &self_ops;
    out->impl = NULL;
}
