/* comm_nccl.c - the communicator of a run of GPU processes, over NCCL
 * (libvh_comm_nccl.so, loaded by the host when run.comm is nccl).
 *
 * Start-up. MPI starts the processes and says who is who: rank, world and
 * the rank's place on its machine (local_rank), as in comm_mpi.c. Rank 0
 * makes an ncclUniqueId, MPI carries it to the others (comm_nccl_id.c), and
 * every rank joins one NCCL communicator on its GPU: the host's device's
 * (it opens before the communicator), else local_rank % device count.
 *
 * Buffers are device memory of that GPU. Every collective runs on a CUDA
 * stream of this backend's own, after the work the caller issued to `stream`
 * (NULL: the thread's current stream): where the device has events
 * (event_record) we record one on the caller's stream and make ours wait for
 * it, so the host does not block; a device without them is synchronized
 * instead. A collective ends with an event on our stream: `test` asks it,
 * `wait` blocks the host until it has passed (so after wait the buffers hold
 * the result for any stream and for the host) and watches NCCL's
 * asynchronous errors meanwhile, so a failed peer does not hang it forever.
 *
 * Threads. As comm_mpi: MPI_THREAD_FUNNELED, every call from the main thread.
 *
 * Dtypes and ops are NCCL's own, f16 and bf16 included. AVG is ncclAvg:
 * integers sum and then divide (truncating), as comm_mpi does; floats
 * multiply each input by 1/world before summing, so f32/f16/bf16 averages may
 * differ from comm_mpi's sum-then-divide in the last bit unless world is a
 * power of two.
 *
 * Errors. Arguments are checked before any call, identically on every rank.
 * A CUDA, NCCL or MPI error becomes VH_STATUS_ERR_COMM (DEVICE for CUDA)
 * plus one line on stderr with the library's words; nothing here exits
 * except `abort`, whose job it is.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_nccl_id.h"
#include "vithost/vh_comm.h"
#include "vithost/vh_device.h"
#include "vithost/vh_export.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_types.h"

_Static_assert(sizeof(ncclUniqueId) == VH_NCCL_ID_BYTES, "NCCL's unique id changed size");

typedef struct nccl_comm {
    vh_comm pub;            /* what vh_comm_open hands out */
    MPI_Comm mpi;           /* a duplicate of MPI_COMM_WORLD: start-up and barrier */
    int we_initialised;     /* 1: MPI_Finalize in close */
    int gpu;                /* the CUDA ordinal of every buffer we are given */
    ncclComm_t nccl;        /* NULL until ncclCommInitRank succeeded */
    cudaStream_t stream;    /* every collective runs here */
    vh_device_ops device;   /* the host's device table (zero: none given) */
    vh_event *ready;        /* the device's event for ordering after the caller; may be NULL */
    int failed;             /* an NCCL error was seen: close aborts instead of flushing */
} nccl_comm;

/* One collective in flight: the point of our stream where it ends. */
struct vh_comm_request {
    cudaEvent_t done;
};

/* ---- errors ----------------------------------------------------------------- */

static vh_status cuda_fail(const nccl_comm *n, cudaError_t e, const char *call) {
    fprintf(stderr, "vithost: NCCL backend (rank %d): %s in %s\n", (int)n->pub.rank,
            cudaGetErrorString(e), call);
    return e == cudaErrorMemoryAllocation ? VH_STATUS_ERR_NOMEM : VH_STATUS_ERR_DEVICE;
}

static vh_status nccl_fail(nccl_comm *n, ncclResult_t rc, const char *call) {
    n->failed = 1;
    const char *detail = n->nccl ? ncclGetLastError(n->nccl) : NULL;
    fprintf(stderr, "vithost: NCCL (rank %d): %s in %s%s%s\n", (int)n->pub.rank,
            ncclGetErrorString(rc), call, detail && *detail ? ": " : "", detail ? detail : "");
    return VH_STATUS_ERR_COMM;
}

/* NCCL's error from a collective already in flight (a peer gone, a network
 * error), which no call returned to us. */
static vh_status async_check(nccl_comm *n) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(n->nccl, &async);
    if (rc != ncclSuccess) return nccl_fail(n, rc, "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress)
        return nccl_fail(n, async, "a collective in flight");
    return VH_STATUS_OK;
}

/* ---- dtypes and ops --------------------------------------------------------- */

static int nccl_type(vh_dtype dtype, ncclDataType_t *out) {
    switch (dtype) {
    case VH_DTYPE_F32: *out = ncclFloat32; return 1;
    case VH_DTYPE_F16: *out = ncclFloat16; return 1;
    case VH_DTYPE_BF16: *out = ncclBfloat16; return 1;
    case VH_DTYPE_I32: *out = ncclInt32; return 1;
    case VH_DTYPE_I64: *out = ncclInt64; return 1;
    case VH_DTYPE_U8: *out = ncclUint8; return 1;
    case VH_DTYPE_F64: *out = ncclFloat64; return 1;
    default: return 0;
    }
}

static int nccl_op(vh_reduce_op op, ncclRedOp_t *out) {
    switch (op) {
    case VH_REDUCE_OP_SUM: *out = ncclSum; return 1;
    case VH_REDUCE_OP_MAX: *out = ncclMax; return 1;
    case VH_REDUCE_OP_MIN: *out = ncclMin; return 1;
    case VH_REDUCE_OP_AVG: *out = ncclAvg; return 1;
    default: return 0;
    }
}

/* ---- ordering and requests -------------------------------------------------- */

static nccl_comm *state(vh_comm *c) { return c ? (nccl_comm *)c->impl : NULL; }

/* libvh_cuda's vh_event (sdk/cuda/cuda_internal.h) begins with its
 * cudaEvent_t: the one thing this backend reads of the device's objects. */
static cudaEvent_t native_event(const vh_event *e) {
    cudaEvent_t out;
    memcpy(&out, e, sizeof out);
    return out;
}

/* Our stream waits for what the caller issued to `stream` so far, as a
 * compute op on that stream would. */
static vh_status order_after_caller(nccl_comm *n, vh_stream *stream) {
    const vh_device_ops *d = &n->device;
    if (n->ready) {
        vh_status st = d->event_record(d->device, n->ready, stream);
        if (st != VH_STATUS_OK) {
            fprintf(stderr, "vithost: NCCL backend (rank %d): the device's event_record "
                            "failed (status %d)\n", (int)n->pub.rank, (int)st);
            return st;
        }
        cudaError_t e = cudaStreamWaitEvent(n->stream, native_event(n->ready), 0);
        return e == cudaSuccess ? VH_STATUS_OK : cuda_fail(n, e, "cudaStreamWaitEvent");
    }
    /* No device events: let everything issued so far finish. */
    if (d->synchronize) return d->synchronize(d->device);
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? VH_STATUS_OK : cuda_fail(n, e, "cudaDeviceSynchronize");
}

/* What every start does before its NCCL call: our GPU current, our stream
 * after the caller's, and a request with its (not yet recorded) event. */
static vh_status begin(nccl_comm *n, vh_stream *stream, vh_comm_request **out) {
    *out = NULL;
    cudaError_t e = cudaSetDevice(n->gpu);
    if (e != cudaSuccess) return cuda_fail(n, e, "cudaSetDevice");
    vh_status st = order_after_caller(n, stream);
    if (st != VH_STATUS_OK) return st;
    vh_comm_request *r = calloc(1, sizeof *r);
    if (!r) return VH_STATUS_ERR_NOMEM;
    e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(r);
        return cuda_fail(n, e, "cudaEventCreateWithFlags");
    }
    *out = r;
    return VH_STATUS_OK;
}

static void request_free(vh_comm_request *r) {
    if (!r) return;
    cudaEventDestroy(r->done); /* (released by CUDA once passed, if still pending) */
    free(r);
}

/* After the NCCL call (rc): frees the staging copy in stream order, marks the
 * end, and hands out r, or frees it and reports. */
static vh_status finish(nccl_comm *n, ncclResult_t rc, const char *call, void *staged,
                        vh_comm_request *r, vh_comm_request **req) {
    if (staged) cudaFreeAsync(staged, n->stream);
    if (rc != ncclSuccess) {
        request_free(r);
        return nccl_fail(n, rc, call);
    }
    cudaError_t e = cudaEventRecord(r->done, n->stream);
    if (e != cudaSuccess) {
        request_free(r);
        return cuda_fail(n, e, "cudaEventRecord");
    }
    *req = r;
    return VH_STATUS_OK;
}

/* Whether [a, a+an) and [b, b+bn) share a byte. */
static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* A copy of a send buffer that overlaps the receive buffer other than in
 * NCCL's in-place layout, made and (in finish) freed on our stream. */
static vh_status stage_send(nccl_comm *n, const void **send, size_t bytes, void **staged) {
    cudaError_t e = cudaMallocAsync(staged, bytes, n->stream);
    if (e != cudaSuccess) return cuda_fail(n, e, "cudaMallocAsync");
    e = cudaMemcpyAsync(*staged, *send, bytes, cudaMemcpyDeviceToDevice, n->stream);
    if (e != cudaSuccess) {
        cudaFreeAsync(*staged, n->stream);
        *staged = NULL;
        return cuda_fail(n, e, "cudaMemcpyAsync");
    }
    *send = *staged;
    return VH_STATUS_OK;
}

/* ---- collectives ------------------------------------------------------------ */

static vh_status check_common(vh_comm *c, size_t count, vh_dtype dtype, vh_comm_request **req,
                              ncclDataType_t *type) {
    if (!state(c) || !req || vh_dtype_size(dtype) == 0 || !nccl_type(dtype, type))
        return VH_STATUS_ERR_INVALID_ARG;
    /* (so that world * count * element size, every buffer's bytes, fits) */
    if (count > SIZE_MAX / ((size_t)c->world_size * vh_dtype_size(dtype)))
        return VH_STATUS_ERR_INVALID_ARG;
    *req = NULL;
    return VH_STATUS_OK;
}

static vh_status nc_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                               vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    ncclDataType_t type;
    ncclRedOp_t nop;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (!nccl_op(op, &nop) || (count && !buf)) return VH_STATUS_ERR_INVALID_ARG;
    nccl_comm *n = state(c);
    vh_comm_request *r;
    if ((st = begin(n, stream, &r)) != VH_STATUS_OK) return st;
    /* (count 0: nothing to move on any rank, only the event) */
    ncclResult_t rc =
        count ? ncclAllReduce(buf, buf, count, type, nop, n->nccl, n->stream) : ncclSuccess;
    return finish(n, rc, "ncclAllReduce", NULL, r, req);
}

static vh_status nc_reduce_scatter(vh_comm *c, const void *send, void *recv, size_t count,
                                   vh_dtype dtype, vh_reduce_op op, vh_stream *stream,
                                   vh_comm_request **req) {
    ncclDataType_t type;
    ncclRedOp_t nop;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (!nccl_op(op, &nop) || (count && (!send || !recv))) return VH_STATUS_ERR_INVALID_ARG;
    nccl_comm *n = state(c);
    const size_t bytes = count * vh_dtype_size(dtype);
    vh_comm_request *r;
    if ((st = begin(n, stream, &r)) != VH_STATUS_OK) return st;
    if (!count) return finish(n, ncclSuccess, "ncclReduceScatter", NULL, r, req);
    char *mine = (char *)send + (size_t)c->rank * bytes; /* NCCL's in-place recv */
    void *staged = NULL;
    ncclResult_t rc;
    if (send == recv && (void *)mine != recv) {
        /* Our in-place form (the block lands at recv's start): NCCL's in-place
         * form, then the block moves down (blocks do not overlap). */
        rc = ncclReduceScatter(send, mine, count, type, nop, n->nccl, n->stream);
        if (rc == ncclSuccess) {
            cudaError_t e = cudaMemcpyAsync(recv, mine, bytes, cudaMemcpyDeviceToDevice,
                                            n->stream);
            if (e != cudaSuccess) {
                request_free(r);
                return cuda_fail(n, e, "cudaMemcpyAsync");
            }
        }
    } else {
        if ((void *)mine != recv &&
            overlaps(send, (size_t)c->world_size * bytes, recv, bytes) &&
            (st = stage_send(n, &send, (size_t)c->world_size * bytes, &staged)) != VH_STATUS_OK) {
            request_free(r);
            return st;
        }
        rc = ncclReduceScatter(send, recv, count, type, nop, n->nccl, n->stream);
    }
    return finish(n, rc, "ncclReduceScatter", staged, r, req);
}

static vh_status nc_all_gather(vh_comm *c, const void *send, void *recv, size_t count,
                               vh_dtype dtype, vh_stream *stream, vh_comm_request **req) {
    ncclDataType_t type;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (count && (!send || !recv)) return VH_STATUS_ERR_INVALID_ARG;
    nccl_comm *n = state(c);
    const size_t bytes = count * vh_dtype_size(dtype);
    vh_comm_request *r;
    if ((st = begin(n, stream, &r)) != VH_STATUS_OK) return st;
    if (!count) return finish(n, ncclSuccess, "ncclAllGather", NULL, r, req);
    /* send already at this rank's place in recv: NCCL's in-place form. */
    const char *mine = (const char *)recv + (size_t)c->rank * bytes;
    void *staged = NULL;
    if ((const void *)mine != send &&
        overlaps(send, bytes, recv, (size_t)c->world_size * bytes) &&
        (st = stage_send(n, &send, bytes, &staged)) != VH_STATUS_OK) {
        request_free(r);
        return st;
    }
    ncclResult_t rc = ncclAllGather(send, recv, count, type, n->nccl, n->stream);
    return finish(n, rc, "ncclAllGather", staged, r, req);
}

static vh_status nc_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype, int32_t root,
                              vh_stream *stream, vh_comm_request **req) {
    ncclDataType_t type;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (root < 0 || root >= c->world_size || (count && !buf)) return VH_STATUS_ERR_INVALID_ARG;
    nccl_comm *n = state(c);
    vh_comm_request *r;
    if ((st = begin(n, stream, &r)) != VH_STATUS_OK) return st;
    ncclResult_t rc =
        count ? ncclBroadcast(buf, buf, count, type, root, n->nccl, n->stream) : ncclSuccess;
    return finish(n, rc, "ncclBroadcast", NULL, r, req);
}

/* The root's part of a gather: its own elements copied into place, every
 * other rank's received (ncclRecv, inside the caller's group). */
static ncclResult_t gather_at_root(nccl_comm *n, const void *send, void *recv,
                                   const size_t *counts, size_t elem, ncclDataType_t type) {
    size_t at = 0;
    for (int32_t i = 0; i < n->pub.world_size; i++) {
        char *dst = (char *)recv + at * elem;
        at += counts[i];
        if (!counts[i]) continue;
        if (i != n->pub.rank) {
            ncclResult_t rc = ncclRecv(dst, counts[i], type, i, n->nccl, n->stream);
            if (rc != ncclSuccess) return rc;
        } else if ((const void *)dst != send &&
                   cudaMemcpyAsync(dst, send, counts[i] * elem, cudaMemcpyDeviceToDevice,
                                   n->stream) != cudaSuccess) {
            return ncclUnhandledCudaError;
        }
    }
    return ncclSuccess;
}

/* NCCL has no gatherv: point to point to the root, in one group. */
static vh_status nc_gather(vh_comm *c, const void *send, size_t count, void *recv,
                           const size_t *counts, vh_dtype dtype, int32_t root,
                           vh_stream *stream, vh_comm_request **req) {
    ncclDataType_t type;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (root < 0 || root >= c->world_size || (count && !send)) return VH_STATUS_ERR_INVALID_ARG;
    const size_t elem = vh_dtype_size(dtype);
    size_t total = 0;
    if (c->rank == root) {
        if (!counts || counts[root] != count) return VH_STATUS_ERR_INVALID_ARG;
        for (int32_t i = 0; i < c->world_size; i++) {
            if (counts[i] > SIZE_MAX / elem - total) return VH_STATUS_ERR_INVALID_ARG;
            total += counts[i];
        }
        if (total && !recv) return VH_STATUS_ERR_INVALID_ARG;
    }
    nccl_comm *n = state(c);
    vh_comm_request *r;
    if ((st = begin(n, stream, &r)) != VH_STATUS_OK) return st;
    void *staged = NULL;
    if (c->rank == root && overlaps(send, count * elem, recv, total * elem) &&
        (st = stage_send(n, &send, count * elem, &staged)) != VH_STATUS_OK) {
        request_free(r);
        return st;
    }
    ncclResult_t rc = ncclGroupStart();
    if (rc == ncclSuccess && c->rank == root)
        rc = gather_at_root(n, send, recv, counts, elem, type);
    else if (rc == ncclSuccess && count)
        rc = ncclSend(send, count, type, root, n->nccl, n->stream);
    ncclResult_t end = ncclGroupEnd();
    return finish(n, rc != ncclSuccess ? rc : end, "ncclSend/ncclRecv (gather)", staged, r, req);
}

static vh_status nc_test(vh_comm *c, vh_comm_request *req, int *done) {
    nccl_comm *n = state(c);
    if (!n || !req || !done) return VH_STATUS_ERR_INVALID_ARG;
    cudaError_t e = cudaEventQuery(req->done);
    if (e == cudaSuccess) {
        *done = 1;
        return VH_STATUS_OK;
    }
    if (e != cudaErrorNotReady) return cuda_fail(n, e, "cudaEventQuery");
    *done = 0;
    return async_check(n);
}

static vh_status nc_wait(vh_comm *c, vh_comm_request *req) {
    if (!req) return VH_STATUS_OK;
    nccl_comm *n = state(c);
    if (!n) return VH_STATUS_ERR_INVALID_ARG;
    /* Polls rather than cudaEventSynchronize: a collective whose peer died
     * never ends, and only NCCL's async error says so. */
    vh_status st = VH_STATUS_OK;
    for (int done = 0; st == VH_STATUS_OK && !done;) {
        st = nc_test(c, req, &done);
        if (st == VH_STATUS_OK && !done) sched_yield();
    }
    request_free(req);
    return st;
}

static vh_status nc_barrier(vh_comm *c) {
    nccl_comm *n = state(c);
    if (!n) return VH_STATUS_ERR_INVALID_ARG;
    cudaError_t e = cudaSetDevice(n->gpu);
    if (e == cudaSuccess) e = cudaStreamSynchronize(n->stream);
    if (e != cudaSuccess) return cuda_fail(n, e, "cudaStreamSynchronize");
    int rc = MPI_Barrier(n->mpi);
    if (rc == MPI_SUCCESS) return VH_STATUS_OK;
    fprintf(stderr, "vithost: NCCL backend (rank %d): MPI_Barrier failed (error %d)\n",
            (int)n->pub.rank, rc);
    return VH_STATUS_ERR_COMM;
}

/* Every rank of the job: NCCL's kernels first (so none spins on a peer that
 * is gone), then MPI's processes. */
static void nc_abort(vh_comm *c, int code) {
    nccl_comm *n = state(c);
    if (n && n->nccl) ncclCommAbort(n->nccl);
    if (n) n->nccl = NULL;
    MPI_Abort(MPI_COMM_WORLD, code != 0 ? code : 1);
}

static const vh_comm_ops nccl_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce_start = nc_all_reduce,
    .reduce_scatter_start = nc_reduce_scatter,
    .all_gather_start = nc_all_gather,
    .broadcast_start = nc_broadcast,
    .wait = nc_wait,
    .test = nc_test,
    .barrier = nc_barrier,
    .abort = nc_abort,
    .gather_start = nc_gather,
};

/* ---- open / close ----------------------------------------------------------- */

VH_SDK_API vh_status vh_comm_open(const vh_comm_open_args *args, vh_comm **out, char *err,
                                  size_t err_len);
VH_SDK_API void vh_comm_close(vh_comm *comm);

/* Frees what open made so far, MPI itself last if ours. */
static void release(nccl_comm *n) {
    if (n->stream) cudaSetDevice(n->gpu);
    /* After an NCCL error a collective may never end: abort, do not flush. */
    if (n->nccl && n->failed) ncclCommAbort(n->nccl);
    else if (n->nccl) {
        cudaStreamSynchronize(n->stream);
        ncclCommDestroy(n->nccl);
    }
    if (n->ready) n->device.event_destroy(n->device.device, n->ready);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (n->mpi != MPI_COMM_NULL) MPI_Comm_free(&n->mpi);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (n->we_initialised && !finalized) MPI_Finalize();
    free(n);
}

/* MPI started (or found started), our duplicate of the world, and who we are. */
static int open_mpi(nccl_comm *n, char *err, size_t err_len) {
    int initialised = 0, finalized = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalized);
    if (finalized) {
        snprintf(err, err_len, "MPI was already finalized in this process (MPI cannot start "
                               "twice)");
        return 0;
    }
    if (!initialised) {
        int provided = 0;
        /* MPI_Init_thread's errors are fatal by default: it rarely returns one. */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            snprintf(err, err_len, "MPI_Init_thread failed");
            return 0;
        }
        n->we_initialised = 1;
    }
    MPI_Comm local = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &n->mpi) != MPI_SUCCESS ||
        MPI_Comm_set_errhandler(n->mpi, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
        snprintf(err, err_len, "MPI_Comm_dup of MPI_COMM_WORLD failed");
        return 0;
    }
    int rank = 0, world = 0, local_rank = 0, local_size = 0;
    MPI_Comm_rank(n->mpi, &rank);
    MPI_Comm_size(n->mpi, &world);
    /* The ranks of this machine (they share memory): the GPU a rank takes. */
    if (MPI_Comm_split_type(n->mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local) !=
        MPI_SUCCESS) {
        snprintf(err, err_len, "MPI_Comm_split_type failed");
        return 0;
    }
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    n->pub.rank = rank;
    n->pub.world_size = world;
    n->pub.local_rank = local_rank;
    n->pub.local_size = local_size;
    return 1;
}

/* This rank's GPU, our stream and the device's ordering event; on failure a
 * message in err (this rank only: the caller tells the others). */
static int open_gpu(nccl_comm *n, char *err, size_t err_len) {
    int count = 0, ordinal = -1;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        snprintf(err, err_len, "rank %d has no usable GPU (%s)", (int)n->pub.rank,
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    /* The device the host opened ("cuda:N") holds the buffers: its GPU. */
    if (!n->device.name || sscanf(n->device.name, "cuda:%d", &ordinal) != 1 || ordinal < 0 ||
        ordinal >= count)
        ordinal = n->pub.local_rank % count;
    n->gpu = ordinal;
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        n->stream = NULL;
        snprintf(err, err_len, "rank %d, GPU %d: %s", (int)n->pub.rank, ordinal,
                 cudaGetErrorString(e));
        return 0;
    }
    const vh_device_ops *d = &n->device;
    if (d->event_create && d->event_destroy && d->event_record &&
        d->event_create(d->device, &n->ready) != VH_STATUS_OK)
        n->ready = NULL; /* (then every start synchronizes instead) */
    return 1;
}

/* The id from rank 0, and every rank's verdict on its own set-up: all ranks
 * go on to ncclCommInitRank together or none does. */
static vh_status agree_and_join(nccl_comm *n, int local_ok, char *err, size_t err_len) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int root_ok = 0;
    ncclResult_t rc = ncclSuccess;
    if (n->pub.rank == 0 && local_ok) {
        rc = ncclGetUniqueId(&id);
        root_ok = rc == ncclSuccess;
        if (!root_ok)
            snprintf(err, err_len, "ncclGetUniqueId failed: %s", ncclGetErrorString(rc));
    }
    if (vh_nccl_exchange_id(n->mpi, 0, (unsigned char *)id.internal, &root_ok) != MPI_SUCCESS) {
        snprintf(err, err_len, "MPI_Bcast of the NCCL id failed");
        return VH_STATUS_ERR_COMM;
    }
    int mine = local_ok && root_ok, all = 0;
    if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, n->mpi) != MPI_SUCCESS) {
        snprintf(err, err_len, "MPI_Allreduce of the ranks' GPU set-up failed");
        return VH_STATUS_ERR_COMM;
    }
    if (!all) {
        if (mine) snprintf(err, err_len, "another rank could not set up its GPU (see its "
                                         "message)");
        return local_ok ? VH_STATUS_ERR_COMM : VH_STATUS_ERR_DEVICE;
    }
    rc = ncclCommInitRank(&n->nccl, n->pub.world_size, id, n->pub.rank);
    if (rc != ncclSuccess) {
        n->nccl = NULL;
        snprintf(err, err_len, "ncclCommInitRank (rank %d of %d, GPU %d) failed: %s",
                 (int)n->pub.rank, (int)n->pub.world_size, n->gpu, ncclGetErrorString(rc));
        return VH_STATUS_ERR_COMM;
    }
    return VH_STATUS_OK;
}

/* The arguments: a host of our major, and a CUDA device (or none, for tests). */
static vh_status open_check(const vh_comm_open_args *args, vh_comm **out, nccl_comm *n,
                            char *err, size_t err_len) {
    if (!args || !out) {
        snprintf(err, err_len, "vh_comm_open: NULL argument");
        return VH_STATUS_ERR_INVALID_ARG;
    }
    if (args->abi_major != VH_ABI_MAJOR) {
        snprintf(err, err_len, "the NCCL backend was built for ABI %d.x, the host is %u.%u: "
                 "rebuild vithost", VH_ABI_MAJOR, (unsigned)args->abi_major,
                 (unsigned)args->abi_minor);
        return VH_STATUS_ERR_INVALID_ARG;
    }
    if (args->device && !vh_struct_upgrade(&n->device, sizeof n->device, args->device)) {
        snprintf(err, err_len, "the device table is malformed");
        return VH_STATUS_ERR_INVALID_ARG;
    }
    if (args->device && n->device.kind != VH_DEVICE_KIND_CUDA) {
        snprintf(err, err_len, "NCCL needs run.device: cuda (the device is %s)",
                 n->device.name ? n->device.name : "not a GPU");
        return VH_STATUS_ERR_CONFIG;
    }
    return VH_STATUS_OK;
}

vh_status vh_comm_open(const vh_comm_open_args *args, vh_comm **out, char *err, size_t err_len) {
    char scratch[8];
    if (!err || !err_len) err = scratch, err_len = sizeof scratch;
    err[0] = '\0';
    if (out) *out = NULL;
    nccl_comm *n = calloc(1, sizeof *n);
    if (!n) {
        snprintf(err, err_len, "out of memory");
        return VH_STATUS_ERR_NOMEM;
    }
    n->mpi = MPI_COMM_NULL;
    vh_status st = open_check(args, out, n, err, err_len);
    if (st != VH_STATUS_OK) {
        free(n);
        return st;
    }
    if (!open_mpi(n, err, err_len)) {
        release(n);
        return VH_STATUS_ERR_COMM;
    }
    int local_ok = open_gpu(n, err, err_len);
    st = agree_and_join(n, local_ok, err, err_len);
    if (st != VH_STATUS_OK) {
        release(n);
        return st;
    }
    n->pub.struct_size = sizeof n->pub;
    n->pub.backend = "nccl";
    n->pub.ops = &nccl_ops;
    /* The host works on a copy of *out, so collectives find us through impl. */
    n->pub.impl = n;
    *out = &n->pub;
    return VH_STATUS_OK;
}

void vh_comm_close(vh_comm *comm) {
    if (!comm || !comm->impl) return;
    release((nccl_comm *)comm->impl);
}
