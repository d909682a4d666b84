/* comm_stats.c - the counting layer over the run's communicator (see
 * comm_stats.h). */
#define _POSIX_C_SOURCE 200809L
#include "comm_stats.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static vh_comm_stats *stats_of(vh_comm *c) { return c->impl; }

/* (w-1)/w of n bytes: what each rank sends in a ring pass over n bytes. */
static double ring_share(const vh_comm_stats *s, double n) {
    double w = (double)s->inner.world_size;
    return w > 1 ? n * (w - 1.0) / w : 0.0;
}

static void count(vh_comm_stats *s, double bytes) {
    s->bytes += bytes;
    s->collectives++;
}

static vh_status stats_all_reduce(vh_comm *c, void *buf, size_t n, vh_dtype dtype,
                                  vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    vh_comm_stats *s = stats_of(c);
    vh_status st = s->inner.ops->all_reduce_start(&s->inner, buf, n, dtype, op, stream, req);
    if (st == VH_STATUS_OK) count(s, 2.0 * ring_share(s, (double)n * (double)vh_dtype_size(dtype)));
    return st;
}

static vh_status stats_reduce_scatter(vh_comm *c, const void *send, void *recv, size_t n,
                                      vh_dtype dtype, vh_reduce_op op, vh_stream *stream,
                                      vh_comm_request **req) {
    vh_comm_stats *s = stats_of(c);
    vh_status st =
        s->inner.ops->reduce_scatter_start(&s->inner, send, recv, n, dtype, op, stream, req);
    double full = (double)n * (double)s->inner.world_size * (double)vh_dtype_size(dtype);
    if (st == VH_STATUS_OK) count(s, ring_share(s, full));
    return st;
}

static vh_status stats_all_gather(vh_comm *c, const void *send, void *recv, size_t n,
                                  vh_dtype dtype, vh_stream *stream, vh_comm_request **req) {
    vh_comm_stats *s = stats_of(c);
    vh_status st = s->inner.ops->all_gather_start(&s->inner, send, recv, n, dtype, stream, req);
    double full = (double)n * (double)s->inner.world_size * (double)vh_dtype_size(dtype);
    if (st == VH_STATUS_OK) count(s, ring_share(s, full));
    return st;
}

static vh_status stats_broadcast(vh_comm *c, void *buf, size_t n, vh_dtype dtype, int32_t root,
                                 vh_stream *stream, vh_comm_request **req) {
    vh_comm_stats *s = stats_of(c);
    vh_status st = s->inner.ops->broadcast_start(&s->inner, buf, n, dtype, root, stream, req);
    if (st == VH_STATUS_OK && s->inner.world_size > 1)
        count(s, (double)n * (double)vh_dtype_size(dtype));
    return st;
}

/* What this rank sends: its part, unless it is the root (kept in place). */
static vh_status stats_gather(vh_comm *c, const void *send, size_t n, void *recv,
                              const size_t *counts, vh_dtype dtype, int32_t root,
                              vh_stream *stream, vh_comm_request **req) {
    vh_comm_stats *s = stats_of(c);
    vh_status st =
        s->inner.ops->gather_start(&s->inner, send, n, recv, counts, dtype, root, stream, req);
    if (st == VH_STATUS_OK && s->inner.rank != root)
        count(s, (double)n * (double)vh_dtype_size(dtype));
    else if (st == VH_STATUS_OK)
        s->collectives++;
    return st;
}

static vh_status stats_wait(vh_comm *c, vh_comm_request *req) {
    vh_comm_stats *s = stats_of(c);
    double t0 = now_seconds();
    vh_status st = s->inner.ops->wait(&s->inner, req);
    s->wait_seconds += now_seconds() - t0;
    return st;
}

static vh_status stats_test(vh_comm *c, vh_comm_request *req, int *done) {
    vh_comm_stats *s = stats_of(c);
    return s->inner.ops->test(&s->inner, req, done);
}

static vh_status stats_barrier(vh_comm *c) {
    vh_comm_stats *s = stats_of(c);
    double t0 = now_seconds();
    vh_status st = s->inner.ops->barrier(&s->inner);
    s->wait_seconds += now_seconds() - t0;
    return st;
}

static void stats_abort(vh_comm *c, int code) {
    vh_comm_stats *s = stats_of(c);
    s->inner.ops->abort(&s->inner, code);
}

static const vh_comm_ops stats_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce_start = stats_all_reduce,
    .reduce_scatter_start = stats_reduce_scatter,
    .all_gather_start = stats_all_gather,
    .broadcast_start = stats_broadcast,
    .wait = stats_wait,
    .test = stats_test,
    .barrier = stats_barrier,
    .abort = stats_abort,
    .gather_start = stats_gather,
};

#define COMM_REQUIRED(member) {#member, offsetof(vh_comm_ops, member), 1}
#define COMM_OPTIONAL(member) {#member, offsetof(vh_comm_ops, member), 0}
const comm_op_mark comm_op_marks[] = {
    COMM_REQUIRED(all_reduce_start), COMM_REQUIRED(reduce_scatter_start),
    COMM_REQUIRED(all_gather_start), COMM_OPTIONAL(broadcast_start),
    COMM_REQUIRED(wait),             COMM_OPTIONAL(test),
    COMM_REQUIRED(barrier),          COMM_REQUIRED(abort),
    COMM_OPTIONAL(gather_start),
};
const int comm_op_mark_count = (int)(sizeof comm_op_marks / sizeof comm_op_marks[0]);
_Static_assert(sizeof comm_op_marks / sizeof comm_op_marks[0] ==
                   (sizeof(vh_comm_ops) - sizeof(void *)) / sizeof(void *),
               "a call was added to vh_comm_ops: mark it in comm_op_marks");

static void *op_at(const vh_comm_ops *ops, size_t offset) {
    void *p;
    memcpy(&p, (const char *)ops + offset, sizeof p);
    return p;
}

vh_status comm_upgrade(vh_comm *dst, vh_comm_ops *ops, const vh_comm *src, char *why,
                       size_t why_len) {
    if (!vh_struct_upgrade(dst, sizeof *dst, src) ||
        dst->struct_size < offsetof(vh_comm, impl) + sizeof(void *) || !dst->ops) {
        snprintf(why, why_len, "the backend's vh_comm is malformed (struct_size %u)",
                 src ? (unsigned)src->struct_size : 0u);
        return VH_STATUS_ERR_COMM;
    }
    if (!vh_struct_upgrade(ops, sizeof *ops, dst->ops)) {
        snprintf(why, why_len, "the backend's vh_comm_ops is malformed");
        return VH_STATUS_ERR_COMM;
    }
    dst->ops = ops;
    for (int i = 0; i < comm_op_mark_count; i++) {
        if (!comm_op_marks[i].required || op_at(ops, comm_op_marks[i].offset)) continue;
        snprintf(why, why_len, "the backend has no %s (a required call of vh_comm_ops)",
                 comm_op_marks[i].name);
        return VH_STATUS_ERR_COMM;
    }
    return VH_STATUS_OK;
}

void comm_stats_install(vh_comm *comm, vh_comm_stats *stats) {
    if (comm_stats_installed(comm)) return;
    stats->inner = *comm;
    comm_stats_reset(stats);
    /* An optional call the backend lacks stays NULL, so a plugin that checks
     * for it (ddp: broadcast_start) sees the truth. */
    stats->ops = stats_ops;
    if (!comm->ops->broadcast_start) stats->ops.broadcast_start = NULL;
    if (!comm->ops->test) stats->ops.test = NULL;
    if (!comm->ops->gather_start) stats->ops.gather_start = NULL;
    comm->ops = &stats->ops;
    comm->impl = stats;
}

int comm_stats_installed(const vh_comm *comm) {
    return comm->ops && comm->ops->all_reduce_start == stats_all_reduce;
}

void comm_stats_reset(vh_comm_stats *stats) {
    stats->bytes = 0.0;
    stats->wait_seconds = 0.0;
    stats->collectives = 0;
}
