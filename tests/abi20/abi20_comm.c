/* abi20_comm.c - a communicator backend as built against ABI 2.0: one
 * process (every collective is the identity, as the SDK's "self"), its
 * vh_comm and vh_comm_ops of 2.0's sizes.
 *
 * Built against tests/abi20/include only and never ported to newer headers:
 * it stands for a backend compiled once against 2.0 that every 2.x host must
 * still open and train with (tests/test_abi20.c). Right after its vh_comm and
 * after its ops lie words that are not pointers, so a host that reads either
 * past its 2.0 size (copies it by value at its own, larger size) calls or
 * dereferences one of them and fails the test.
 *
 * It counts the collectives the run starts through it and prints the count
 * when it is closed, so the test sees that this backend carried the run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_export.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_types.h"

#include "abi20_poison.h"

_Static_assert(VH_ABI_MAJOR == 2 && VH_ABI_MINOR == 0, "built against the ABI 2.0 headers");
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(vh_comm) == 48 && sizeof(vh_comm_ops) == 72,
               "vh_comm and vh_comm_ops as shipped in ABI 2.0");
#endif

typedef struct abi20_comm {
    vh_comm pub;          /* what vh_comm_open hands out: 2.0's size */
    uintptr_t poison[8];  /* abi20_poison.h: where a newer vh_comm's members would be */
    long long collectives;
} abi20_comm;

/* The one request every collective returns: already finished. */
static char done_token;
#define DONE ((vh_comm_request *)&done_token)

static vh_status started(vh_comm *c, vh_comm_request **req) {
    ((abi20_comm *)c->impl)->collectives++;
    if (req) *req = DONE;
    return VH_STATUS_OK;
}

static int valid(vh_dtype dtype) { return vh_dtype_size(dtype) > 0; }

static vh_status comm_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)buf, (void)count, (void)stream;
    if (!valid(dtype) || op < VH_REDUCE_OP_SUM || op > VH_REDUCE_OP_AVG)
        return VH_STATUS_ERR_INVALID_ARG;
    return started(c, req);
}

static vh_status comm_reduce_scatter(vh_comm *c, const void *send, void *recv, size_t count,
                                     vh_dtype dtype, vh_reduce_op op, vh_stream *stream,
                                     vh_comm_request **req) {
    (void)stream;
    if (!valid(dtype) || op < VH_REDUCE_OP_SUM || op > VH_REDUCE_OP_AVG)
        return VH_STATUS_ERR_INVALID_ARG;
    if (send != recv && count) memmove(recv, send, count * vh_dtype_size(dtype));
    return started(c, req);
}

static vh_status comm_all_gather(vh_comm *c, const void *send, void *recv, size_t count,
                                 vh_dtype dtype, vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    if (!valid(dtype)) return VH_STATUS_ERR_INVALID_ARG;
    if (send != recv && count) memmove(recv, send, count * vh_dtype_size(dtype));
    return started(c, req);
}

static vh_status comm_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                int32_t root, vh_stream *stream, vh_comm_request **req) {
    (void)buf, (void)count, (void)stream;
    if (!valid(dtype) || root != 0) return VH_STATUS_ERR_INVALID_ARG;
    return started(c, req);
}

static vh_status comm_wait(vh_comm *c, vh_comm_request *req) {
    (void)c;
    return req == NULL || req == DONE ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}

static vh_status comm_test(vh_comm *c, vh_comm_request *req, int *done) {
    (void)c;
    if (req != DONE || !done) return VH_STATUS_ERR_INVALID_ARG;
    *done = 1;
    return VH_STATUS_OK;
}

static vh_status comm_barrier(vh_comm *c) {
    (void)c;
    return VH_STATUS_OK;
}

static void comm_abort(vh_comm *c, int code) { (void)c, (void)code; }

static const struct {
    vh_comm_ops ops;
    uintptr_t poison[8]; /* abi20_poison.h: where a newer vh_comm_ops's calls would be */
} abi20_ops = {
    {.struct_size = sizeof(vh_comm_ops),
     .all_reduce_start = comm_all_reduce,
     .reduce_scatter_start = comm_reduce_scatter,
     .all_gather_start = comm_all_gather,
     .broadcast_start = comm_broadcast,
     .wait = comm_wait,
     .test = comm_test,
     .barrier = comm_barrier,
     .abort = comm_abort},
    ABI20_POISON,
};

VH_SDK_API vh_status vh_comm_open(const vh_comm_open_args *args, vh_comm **out, char *err,
                                  size_t err_len);
VH_SDK_API void vh_comm_close(vh_comm *comm);

vh_status vh_comm_open(const vh_comm_open_args *args, vh_comm **out, char *err, size_t err_len) {
    /* The host's args, read up to 2.0's size whatever the host's minor. */
    vh_comm_open_args a;
    if (!out || !vh_struct_upgrade(&a, sizeof a, args)) {
        snprintf(err, err_len, "abi20_comm: no open arguments");
        return VH_STATUS_ERR_INVALID_ARG;
    }
    if (a.abi_major != VH_ABI_MAJOR) {
        snprintf(err, err_len, "abi20_comm: built for ABI %d.%d, the host is %u.%u",
                 VH_ABI_MAJOR, VH_ABI_MINOR, (unsigned)a.abi_major, (unsigned)a.abi_minor);
        return VH_STATUS_ERR_UNSUPPORTED;
    }
    abi20_comm *c = malloc(sizeof *c);
    if (!c) {
        snprintf(err, err_len, "abi20_comm: out of memory");
        return VH_STATUS_ERR_NOMEM;
    }
    *c = (abi20_comm){
        .pub = {.struct_size = sizeof(vh_comm), .backend = "abi20_comm", .rank = 0,
                .world_size = 1, .local_rank = 0, .local_size = 1, .ops = &abi20_ops.ops,
                .impl = c},
        .poison = ABI20_POISON,
    };
    *out = &c->pub;
    return VH_STATUS_OK;
}

void vh_comm_close(vh_comm *comm) {
    if (!comm) return;
    abi20_comm *c = comm->impl;
    fprintf(stderr, "abi20_comm: closed after %lld collectives\n", c->collectives);
    free(c);
}
