/* comm_mpi.c - the communicator of a run of CPU processes, over MPI
 * (libvh_comm_mpi.so, loaded by the host when run.comm is mpi).
 *
 * Progress. Every collective is an MPI nonblocking collective (MPI_I*). MPI
 * has no progress thread here (OpenMPI's libnbc schedules advance only inside
 * MPI calls), so a collective in flight moves only when this rank calls MPI:
 * `test` is that call. A plugin that overlaps communication with compute
 * calls test between its ops; one that does not simply finishes in `wait`.
 *
 * Threads. MPI_THREAD_FUNNELED: the host's compute (OpenMP) and prefetch
 * threads never call MPI, only the main thread does, so we do not pay for
 * MPI_THREAD_MULTIPLE's locking. If MPI is already initialised (a test, an
 * embedding program), whoever did it also finalizes it.
 *
 * Buffers are host memory: this backend ignores `stream`.
 *
 * Dtypes. f32, f64, i32, i64 and u8 use MPI's own types and ops. f16 and bf16
 * travel as 16-bit words and reduce with our own MPI_Ops: each pairwise
 * combine widens both sides to f32, combines, and rounds back to nearest
 * even. So a 16-bit sum is rounded once per combine of the reduction tree
 * MPI chooses (world_size - 1 roundings along any path), not once at the end.
 * MAX and MIN pick one of their inputs (no rounding) and propagate NaN.
 *
 * AVG. MPI has none: the collective reduces with SUM and `wait` divides the
 * result by world_size in the dtype (f32/f64 division, integer division
 * truncating toward zero for the integer dtypes; f16/bf16 widen the rounded
 * sum, divide in f32, and round once more).
 *
 * Errors. Arguments are checked before any MPI call, identically on every
 * rank, so a bad argument fails on all ranks without a collective started.
 * An MPI error (the communicator returns errors instead of aborting) becomes
 * VH_STATUS_ERR_COMM plus one line on stderr: vh_comm_ops has no message
 * channel. After any error the caller should end the run (ops->abort): ranks
 * may disagree on which collectives started.
 */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_export.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_types.h"
#include "watch.h"

enum { HALF_F16 = 0, HALF_BF16 = 1, HALF_COUNT = 2 };
enum { OP_SUM = 0, OP_MAX = 1, OP_MIN = 2, OP_COUNT = 3 };

typedef struct mpi_comm {
    vh_comm pub;           /* what vh_comm_open hands out */
    MPI_Comm comm;         /* a duplicate of MPI_COMM_WORLD: our errors, our tags */
    int we_initialised;    /* 1: MPI_Finalize in close */
    mpi_watch watch;       /* waits that name a gone rank (watch.h) */
    int ops_created;       /* how many of half_ops exist (freed in close) */
    MPI_Op half_ops[HALF_COUNT][OP_COUNT];
} mpi_comm;

/* One collective in flight, and what wait must do once MPI has finished it. */
struct vh_comm_request {
    MPI_Request mpi;
    void *avg_buf;     /* non-NULL: divide avg_count elements here by world_size */
    size_t avg_count;
    vh_dtype dtype;
    void *tmp;         /* a copy of an overlapping send buffer; freed in wait */
    int *counts;       /* gather at the root: counts then displacements (int, as MPI
                        * takes them), alive until MPI has finished; freed in wait */
};

/* ---- errors ----------------------------------------------------------------- */

static vh_status mpi_fail(int rank, int rc, const char *call) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    fprintf(stderr, "vithost: MPI (rank %d): %s in %s\n", rank, msg, call);
    return VH_STATUS_ERR_COMM;
}

/* ---- f16 / bf16 reductions -------------------------------------------------- */

static int half_is_nan(float x) { return x != x; }

/* One user op per (16-bit dtype, op): MPI hands the function no dtype of
 * ours, so each knows its own. Commutative: MPI may combine in any order. */
#define VH_HALF_OPS(tag, to_f32, from_f32)                                                    \
    static void half_sum_##tag(void *in, void *inout, int *len, MPI_Datatype *dt) {          \
        (void)dt;                                                                             \
        const uint16_t *a = in;                                                               \
        uint16_t *b = inout;                                                                  \
        for (int i = 0; i < *len; i++) b[i] = from_f32(to_f32(a[i]) + to_f32(b[i]));          \
    }                                                                                         \
    static void half_max_##tag(void *in, void *inout, int *len, MPI_Datatype *dt) {          \
        (void)dt;                                                                             \
        const uint16_t *a = in;                                                               \
        uint16_t *b = inout;                                                                  \
        for (int i = 0; i < *len; i++) {                                                      \
            float x = to_f32(a[i]), y = to_f32(b[i]);                                         \
            if (half_is_nan(x) || (!half_is_nan(y) && x > y)) b[i] = a[i];                    \
        }                                                                                     \
    }                                                                                         \
    static void half_min_##tag(void *in, void *inout, int *len, MPI_Datatype *dt) {          \
        (void)dt;                                                                             \
        const uint16_t *a = in;                                                               \
        uint16_t *b = inout;                                                                  \
        for (int i = 0; i < *len; i++) {                                                      \
            float x = to_f32(a[i]), y = to_f32(b[i]);                                         \
            if (half_is_nan(x) || (!half_is_nan(y) && x < y)) b[i] = a[i];                    \
        }                                                                                     \
    }

VH_HALF_OPS(f16, vh_f16_to_f32, vh_f32_to_f16)
VH_HALF_OPS(bf16, vh_bf16_to_f32, vh_f32_to_bf16)

static MPI_User_function *const half_fns[HALF_COUNT][OP_COUNT] = {
    [HALF_F16] = {half_sum_f16, half_max_f16, half_min_f16},
    [HALF_BF16] = {half_sum_bf16, half_max_bf16, half_min_bf16},
};

/* ---- dtypes and ops --------------------------------------------------------- */

/* The MPI type of a dtype; 0 for an unknown one. */
static int mpi_type(vh_dtype dtype, MPI_Datatype *out) {
    switch (dtype) {
    case VH_DTYPE_F32: *out = MPI_FLOAT; return 1;
    case VH_DTYPE_F64: *out = MPI_DOUBLE; return 1;
    case VH_DTYPE_I32: *out = MPI_INT32_T; return 1;
    case VH_DTYPE_I64: *out = MPI_INT64_T; return 1;
    case VH_DTYPE_U8: *out = MPI_UINT8_T; return 1;
    case VH_DTYPE_F16:
    case VH_DTYPE_BF16: *out = MPI_UINT16_T; return 1;
    default: return 0;
    }
}

/* The MPI op that reduces `op` on `dtype` (AVG: SUM, divided in wait). */
static int mpi_op(const mpi_comm *m, vh_dtype dtype, vh_reduce_op op, MPI_Op *out) {
    int which;
    switch (op) {
    case VH_REDUCE_OP_SUM:
    case VH_REDUCE_OP_AVG: which = OP_SUM; break;
    case VH_REDUCE_OP_MAX: which = OP_MAX; break;
    case VH_REDUCE_OP_MIN: which = OP_MIN; break;
    default: return 0;
    }
    if (dtype == VH_DTYPE_F16 || dtype == VH_DTYPE_BF16) {
        *out = m->half_ops[dtype == VH_DTYPE_F16 ? HALF_F16 : HALF_BF16][which];
        return 1;
    }
    static const MPI_Op builtin[OP_COUNT] = {MPI_SUM, MPI_MAX, MPI_MIN};
    *out = builtin[which];
    return 1;
}

/* AVG's second half: the sum divided by the world, in the dtype. */
static void divide(void *buf, size_t n, vh_dtype dtype, int world) {
    switch (dtype) {
    case VH_DTYPE_F32: {
        float *x = buf;
        for (size_t i = 0; i < n; i++) x[i] /= (float)world;
        break;
    }
    case VH_DTYPE_F64: {
        double *x = buf;
        for (size_t i = 0; i < n; i++) x[i] /= (double)world;
        break;
    }
    case VH_DTYPE_I32: {
        int32_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] /= world;
        break;
    }
    case VH_DTYPE_I64: {
        int64_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] /= world;
        break;
    }
    case VH_DTYPE_U8: {
        uint8_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = (uint8_t)(x[i] / world);
        break;
    }
    case VH_DTYPE_F16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = vh_f32_to_f16(vh_f16_to_f32(x[i]) / (float)world);
        break;
    }
    case VH_DTYPE_BF16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < n; i++)
            x[i] = vh_f32_to_bf16(vh_bf16_to_f32(x[i]) / (float)world);
        break;
    }
    default: break;
    }
}

/* ---- collectives ------------------------------------------------------------ */

static mpi_comm *state(vh_comm *c) { return c ? (mpi_comm *)c->impl : NULL; }

/* The checks every collective shares; MPI counts are int. */
static vh_status check_common(vh_comm *c, size_t count, vh_dtype dtype, vh_comm_request **req,
                              MPI_Datatype *type) {
    if (!state(c) || !req || count > (size_t)INT_MAX || vh_dtype_size(dtype) == 0 ||
        !mpi_type(dtype, type))
        return VH_STATUS_ERR_INVALID_ARG;
    return VH_STATUS_OK;
}

static vh_comm_request *request_new(void) {
    vh_comm_request *r = calloc(1, sizeof *r);
    if (r) r->mpi = MPI_REQUEST_NULL;
    return r;
}

/* Whether [a, a+an) and [b, b+bn) share a byte. */
static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* A private copy of a send buffer that overlaps the receive buffer in a way
 * MPI_IN_PLACE cannot express (MPI forbids aliased buffers). */
static vh_status copy_send(vh_comm_request *r, const void **send, size_t bytes) {
    r->tmp = malloc(bytes);
    if (!r->tmp) return VH_STATUS_ERR_NOMEM;
    memcpy(r->tmp, *send, bytes);
    *send = r->tmp;
    return VH_STATUS_OK;
}

/* Hands out r once MPI accepted it, or frees it and reports MPI's error. */
static vh_status started(vh_comm *c, int rc, const char *call, vh_comm_request *r,
                         vh_comm_request **req) {
    if (rc != MPI_SUCCESS) {
        free(r->tmp);
        free(r->counts);
        free(r);
        *req = NULL;
        return mpi_fail(c->rank, rc, call);
    }
    *req = r;
    return VH_STATUS_OK;
}

static vh_status mpi_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    MPI_Datatype type;
    MPI_Op mop;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (!mpi_op(state(c), dtype, op, &mop) || (count && !buf)) return VH_STATUS_ERR_INVALID_ARG;
    vh_comm_request *r = request_new();
    if (!r) return VH_STATUS_ERR_NOMEM;
    if (op == VH_REDUCE_OP_AVG) r->avg_buf = buf, r->avg_count = count, r->dtype = dtype;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, type, mop, state(c)->comm, &r->mpi);
    return started(c, rc, "MPI_Iallreduce", r, req);
}

static vh_status mpi_reduce_scatter(vh_comm *c, const void *send, void *recv, size_t count,
                                    vh_dtype dtype, vh_reduce_op op, vh_stream *stream,
                                    vh_comm_request **req) {
    (void)stream;
    MPI_Datatype type;
    MPI_Op mop;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (!mpi_op(state(c), dtype, op, &mop) || (count && (!send || !recv)))
        return VH_STATUS_ERR_INVALID_ARG;
    size_t elem = vh_dtype_size(dtype);
    size_t send_bytes = (size_t)c->world_size * count * elem;
    vh_comm_request *r = request_new();
    if (!r) return VH_STATUS_ERR_NOMEM;
    /* send == recv: MPI's in-place form takes the world*count input from
     * recv and leaves this rank's block at its start, as our contract says. */
    const void *src = send == recv ? MPI_IN_PLACE : send;
    if (src != MPI_IN_PLACE && overlaps(send, send_bytes, recv, count * elem) &&
        copy_send(r, &src, send_bytes) != VH_STATUS_OK) {
        free(r);
        return VH_STATUS_ERR_NOMEM;
    }
    if (op == VH_REDUCE_OP_AVG) r->avg_buf = recv, r->avg_count = count, r->dtype = dtype;
    int rc = MPI_Ireduce_scatter_block(src, recv, (int)count, type, mop, state(c)->comm, &r->mpi);
    return started(c, rc, "MPI_Ireduce_scatter_block", r, req);
}

static vh_status mpi_all_gather(vh_comm *c, const void *send, void *recv, size_t count,
                                vh_dtype dtype, vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    MPI_Datatype type;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (count && (!send || !recv)) return VH_STATUS_ERR_INVALID_ARG;
    size_t bytes = count * vh_dtype_size(dtype);
    vh_comm_request *r = request_new();
    if (!r) return VH_STATUS_ERR_NOMEM;
    /* send already at this rank's place in recv: MPI's in-place form. */
    const void *src = send;
    if (count && send == (const char *)recv + (size_t)c->rank * bytes)
        src = MPI_IN_PLACE;
    else if (overlaps(send, bytes, recv, (size_t)c->world_size * bytes) &&
             copy_send(r, &src, bytes) != VH_STATUS_OK) {
        free(r);
        return VH_STATUS_ERR_NOMEM;
    }
    int rc = MPI_Iallgather(src, (int)count, type, recv, (int)count, type, state(c)->comm,
                            &r->mpi);
    return started(c, rc, "MPI_Iallgather", r, req);
}

static vh_status mpi_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype, int32_t root,
                               vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    MPI_Datatype type;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (root < 0 || root >= c->world_size || (count && !buf)) return VH_STATUS_ERR_INVALID_ARG;
    vh_comm_request *r = request_new();
    if (!r) return VH_STATUS_ERR_NOMEM;
    int rc = MPI_Ibcast(buf, (int)count, type, root, state(c)->comm, &r->mpi);
    return started(c, rc, "MPI_Ibcast", r, req);
}

/* The root's receive counts and displacements as MPI's ints, in r->counts
 * (world counts, then world displacements), and the total in *total; 0
 * when one does not fit an int (MPI's limit, as for every collective here)
 * or counts[root] != count. */
static int gather_counts(vh_comm *c, vh_comm_request *r, const size_t *counts, size_t count,
                         int32_t root, size_t *total) {
    const int w = c->world_size;
    if (!counts || counts[root] != count) return 0;
    r->counts = malloc(2 * (size_t)w * sizeof *r->counts);
    if (!r->counts) return 0;
    size_t at = 0;
    for (int i = 0; i < w; i++) {
        if (counts[i] > (size_t)INT_MAX || at > (size_t)INT_MAX) return 0;
        r->counts[i] = (int)counts[i];
        r->counts[w + i] = (int)at;
        at += counts[i];
    }
    *total = at;
    return 1;
}

/* MPI_Igatherv. At the root, a send buffer already at the root's place in
 * recv is MPI's in-place form; other overlaps get a private copy. */
static vh_status mpi_gather(vh_comm *c, const void *send, size_t count, void *recv,
                            const size_t *counts, vh_dtype dtype, int32_t root,
                            vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    MPI_Datatype type;
    vh_status st = check_common(c, count, dtype, req, &type);
    if (st != VH_STATUS_OK) return st;
    if (root < 0 || root >= c->world_size || (count && !send)) return VH_STATUS_ERR_INVALID_ARG;
    vh_comm_request *r = request_new();
    if (!r) return VH_STATUS_ERR_NOMEM;
    const void *src = send;
    if (c->rank == root) {
        size_t total = 0, elem = vh_dtype_size(dtype);
        if (!gather_counts(c, r, counts, count, root, &total) || (total && !recv)) {
            free(r->counts);
            free(r);
            return VH_STATUS_ERR_INVALID_ARG;
        }
        const char *mine =
            recv ? (const char *)recv + (size_t)r->counts[c->world_size + root] * elem : NULL;
        if (count && send == mine)
            src = MPI_IN_PLACE;
        else if (overlaps(send, count * elem, recv, total * elem) &&
                 copy_send(r, &src, count * elem) != VH_STATUS_OK) {
            free(r->counts);
            free(r);
            return VH_STATUS_ERR_NOMEM;
        }
    }
    int rc = c->rank == root
                 ? MPI_Igatherv(src, (int)count, type, recv, r->counts, r->counts + c->world_size,
                                type, root, state(c)->comm, &r->mpi)
                 : MPI_Igatherv(src, (int)count, type, NULL, NULL, NULL, type, root,
                                state(c)->comm, &r->mpi);
    return started(c, rc, "MPI_Igatherv", r, req);
}

static vh_status mpi_wait(vh_comm *c, vh_comm_request *req) {
    if (!req) return VH_STATUS_OK;
    if (!state(c)) return VH_STATUS_ERR_INVALID_ARG;
    /* MPI_Wait on a request test already completed (MPI_REQUEST_NULL) returns at once. */
    int rc = watch_wait(&state(c)->watch, c->rank, &req->mpi);
    vh_status st = VH_STATUS_OK;
    if (rc != MPI_SUCCESS)
        st = mpi_fail(c->rank, rc, "MPI_Wait");
    else if (req->avg_buf)
        divide(req->avg_buf, req->avg_count, req->dtype, c->world_size);
    free(req->tmp);
    free(req->counts);
    free(req);
    return st;
}

static vh_status mpi_test(vh_comm *c, vh_comm_request *req, int *done) {
    if (!state(c) || !req || !done) return VH_STATUS_ERR_INVALID_ARG;
    int flag = 0;
    int rc = MPI_Test(&req->mpi, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(c->rank, rc, "MPI_Test");
    *done = flag != 0;
    return VH_STATUS_OK;
}

static vh_status mpi_barrier(vh_comm *c) {
    if (!state(c)) return VH_STATUS_ERR_INVALID_ARG;
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Ibarrier(state(c)->comm, &r);
    if (rc == MPI_SUCCESS) rc = watch_wait(&state(c)->watch, c->rank, &r);
    return rc == MPI_SUCCESS ? VH_STATUS_OK : mpi_fail(c->rank, rc, "MPI_Barrier");
}

/* Every rank of the job, not just our communicator: the run is over. */
static void mpi_abort(vh_comm *c, int code) {
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code != 0 ? code : 1);
}

static const vh_comm_ops mpi_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce_start = mpi_all_reduce,
    .reduce_scatter_start = mpi_reduce_scatter,
    .all_gather_start = mpi_all_gather,
    .broadcast_start = mpi_broadcast,
    .wait = mpi_wait,
    .test = mpi_test,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .gather_start = mpi_gather,
};

/* ---- open / close ----------------------------------------------------------- */

VH_SDK_API vh_status vh_comm_open(const vh_comm_open_args *args, vh_comm **out, char *err,
                                  size_t err_len);
VH_SDK_API void vh_comm_close(vh_comm *comm);

/* Frees what open made so far: ops, communicator, and MPI itself if ours. */
static void release(mpi_comm *m) {
    watch_close(&m->watch);
    for (int i = 0; i < m->ops_created; i++)
        MPI_Op_free(&m->half_ops[i / OP_COUNT][i % OP_COUNT]);
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (m->we_initialised && !finalized) MPI_Finalize();
    free(m);
}

/* MPI's message for rc into err. */
static vh_status open_fail(mpi_comm *m, int rc, const char *call, char *err, size_t err_len) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    snprintf(err, err_len, "%s failed: %s", call, msg);
    release(m);
    return VH_STATUS_ERR_COMM;
}

vh_status vh_comm_open(const vh_comm_open_args *args, vh_comm **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    char scratch[8];
    if (!err || !err_len) err = scratch, err_len = sizeof scratch;
    if (!args || !out) {
        snprintf(err, err_len, "vh_comm_open: NULL argument");
        return VH_STATUS_ERR_INVALID_ARG;
    }
    *out = NULL;
    if (args->abi_major != VH_ABI_MAJOR) {
        snprintf(err, err_len, "the MPI backend was built for ABI %d.x, the host is %u.%u: "
                 "rebuild vithost", VH_ABI_MAJOR, (unsigned)args->abi_major,
                 (unsigned)args->abi_minor);
        return VH_STATUS_ERR_INVALID_ARG;
    }
    int initialised = 0, finalized = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalized);
    if (finalized) {
        snprintf(err, err_len, "MPI was already finalized in this process (MPI cannot start "
                               "twice)");
        return VH_STATUS_ERR_COMM;
    }
    mpi_comm *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, err_len, "out of memory");
        return VH_STATUS_ERR_NOMEM;
    }
    m->comm = MPI_COMM_NULL;
    if (!initialised) {
        int provided = 0;
        /* MPI_Init_thread's errors are fatal by default: it rarely returns one. */
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            snprintf(err, err_len, "MPI_Init_thread failed (error %d)", rc);
            free(m);
            return VH_STATUS_ERR_COMM;
        }
        m->we_initialised = 1;
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (rc != MPI_SUCCESS) return open_fail(m, rc, "MPI_Comm_dup", err, err_len);
    rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) return open_fail(m, rc, "MPI_Comm_set_errhandler", err, err_len);
    watch_open(&m->watch, m->comm);
    int rank = 0, world = 0;
    MPI_Comm_rank(m->comm, &rank);
    MPI_Comm_size(m->comm, &world);
    /* The ranks of this machine (they share memory): the GPU a rank takes. */
    MPI_Comm local = MPI_COMM_NULL;
    rc = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS) return open_fail(m, rc, "MPI_Comm_split_type", err, err_len);
    int local_rank = 0, local_size = 0;
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    for (; m->ops_created < HALF_COUNT * OP_COUNT; m->ops_created++) {
        int i = m->ops_created;
        rc = MPI_Op_create(half_fns[i / OP_COUNT][i % OP_COUNT], 1,
                           &m->half_ops[i / OP_COUNT][i % OP_COUNT]);
        if (rc != MPI_SUCCESS) return open_fail(m, rc, "MPI_Op_create", err, err_len);
    }
    m->pub.struct_size = sizeof m->pub;
    m->pub.backend = "mpi";
    m->pub.rank = rank;
    m->pub.world_size = world;
    m->pub.local_rank = local_rank;
    m->pub.local_size = local_size;
    m->pub.ops = &mpi_ops;
    /* The host works on a copy of *out, so collectives find us through impl. */
    m->pub.impl = m;
    *out = &m->pub;
    return VH_STATUS_OK;
}

void vh_comm_close(vh_comm *comm) {
    if (!comm || !comm->impl) return;
    release((mpi_comm *)comm->impl);
}
