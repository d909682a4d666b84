/* op_stats.c - the timing layer over the run's device ops (see
 * op_stats.h). */
#define _POSIX_C_SOURCE 200809L
#include "op_stats.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The layer that times now; the trampolines have no other way to find it
 * (an op's first argument is the device's own state). */
static vh_op_stats *active;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- FLOPs ------------------------------------------------------------------ */

static double gemm_flops(const vh_gemm_args *a) {
    double batch = a->batch > 1 ? (double)a->batch : 1.0;
    return 2.0 * (double)a->m * (double)a->n * (double)a->k * batch;
}

/* Forward: Q K^T and P V; backward: dV, dP, dQ and dK. 2 N^2 d per matmul
 * and head (the softmax's few flops per score are left out). */
static double attention_flops(const vh_attention_args *a, double matmuls) {
    double n = (double)a->tokens;
    return matmuls * 2.0 * (double)a->batch * (double)a->heads * n * n * (double)a->head_dim;
}

/* ---- timing ------------------------------------------------------------------- */

/* A device that queues ops is drained first, so the op's time is its own. */
static double op_begin(vh_op_stats *s) {
    if (s->inner.kind != VH_DEVICE_KIND_CPU) s->inner.synchronize(s->inner.device);
    return now_seconds();
}

static vh_status op_end(vh_op_stats *s, int op, double t0, vh_status st, double flops) {
    if (st == VH_STATUS_OK && s->inner.kind != VH_DEVICE_KIND_CPU)
        st = s->inner.synchronize(s->inner.device);
    s->stat[op].calls++;
    s->stat[op].seconds += now_seconds() - t0;
    s->stat[op].flops += flops;
    return st;
}

/* The ops that take (device, one argument struct): name, struct, FLOPs of
 * one call (an expression of `a`). GEMM first, with a trampoline of its
 * own that also keeps its shapes. */
#define VH_ARGS_OPS(X)                                                        \
    X(gemm, vh_gemm_args, gemm_flops(a))                                      \
    VH_OTHER_ARGS_OPS(X)
#define VH_OTHER_ARGS_OPS(X)                                                  \
    X(layernorm_forward, vh_layernorm_args, 0.0)                              \
    X(layernorm_backward, vh_layernorm_args, 0.0)                             \
    X(gelu_forward, vh_eltwise_args, 0.0)                                     \
    X(gelu_backward, vh_eltwise_args, 0.0)                                    \
    X(add, vh_eltwise_args, 0.0)                                              \
    X(mul, vh_eltwise_args, 0.0)                                              \
    X(dropout_forward, vh_eltwise_args, 0.0)                                  \
    X(scale_rows, vh_eltwise_args, 0.0)                                       \
    X(bias_backward, vh_rows_args, 0.0)                                       \
    X(softmax, vh_rows_args, 0.0)                                             \
    X(attention_forward, vh_attention_args, attention_flops(a, 2.0))          \
    X(attention_backward, vh_attention_args, attention_flops(a, 4.0))         \
    X(softmax_cross_entropy, vh_xent_args, 0.0)                               \
    X(mean_pool_forward, vh_tokens_args, 0.0)                                 \
    X(mean_pool_backward, vh_tokens_args, 0.0)                                \
    X(patchify, vh_tokens_args, 0.0)                                          \
    X(embed_forward, vh_tokens_args, 0.0)                                     \
    X(embed_backward, vh_tokens_args, 0.0)                                    \
    X(multi_tensor_scale_check, vh_multi_tensor_args, 0.0)                    \
    X(drop_path_scale, vh_eltwise_args, 0.0)

#define OP_ENUM(member, type, flops) OP_##member,
enum { VH_ARGS_OPS(OP_ENUM) OP_convert, OP_copy, OP_memset_zero, OP_COUNT };
_Static_assert(OP_COUNT <= VH_OP_STATS_MAX, "raise VH_OP_STATS_MAX");

/* One trampoline per op of that signature: all but the call is shared. */
#define OP_TRAMPOLINE(member, type, flops)                                    \
    static vh_status timed_##member(vh_device *dev, const type *a) {          \
        vh_op_stats *s = active;                                              \
        if (!s->counting) return s->inner.member(dev, a);                     \
        double t0 = op_begin(s);                                              \
        vh_status st = s->inner.member(dev, a);                               \
        return op_end(s, OP_##member, t0, st, st == VH_STATUS_OK ? (flops) : 0.0); \
    }
VH_OTHER_ARGS_OPS(OP_TRAMPOLINE)

/* The shape's row in s->gemm_shape, made on first sight; NULL once full. */
static vh_op_stat *gemm_shape_stat(vh_op_stats *s, const vh_gemm_args *a) {
    vh_op_gemm_shape key = {a->batch > 1 ? a->batch : 1, a->m, a->n, a->k,
                            a->trans_a, a->trans_b, a->ab_dtype, a->c_dtype, a->epilogue,
                            a->bias != NULL, a->residual != NULL, a->beta != 0.0f, {0, 0, 0}};
    for (int i = 0; i < s->gemm_shapes; i++) /* everything but the figures */
        if (!memcmp(&s->gemm_shape[i], &key, offsetof(vh_op_gemm_shape, stat)))
            return &s->gemm_shape[i].stat;
    if (s->gemm_shapes == VH_OP_STATS_GEMM_SHAPES) return NULL;
    memset(&key.stat, 0, sizeof key.stat);
    s->gemm_shape[s->gemm_shapes] = key;
    return &s->gemm_shape[s->gemm_shapes++].stat;
}

_Static_assert(offsetof(vh_op_gemm_shape, stat) == 4 * sizeof(int64_t) + 8 * sizeof(int32_t),
               "the shape key has no padding: memcmp compares it");

static vh_status timed_gemm(vh_device *dev, const vh_gemm_args *a) {
    vh_op_stats *s = active;
    if (!s->counting) return s->inner.gemm(dev, a);
    double t0 = op_begin(s);
    vh_status st = s->inner.gemm(dev, a);
    double flops = st == VH_STATUS_OK ? gemm_flops(a) : 0.0;
    st = op_end(s, OP_gemm, t0, st, flops);
    vh_op_stat *g = gemm_shape_stat(s, a);
    if (g) {
        g->calls++;
        g->seconds += now_seconds() - t0;
        g->flops += flops;
    }
    return st;
}

/* The three of their own signature. */
static vh_status timed_convert(vh_device *dev, void *dst, vh_dtype dst_dtype, const void *src,
                               vh_dtype src_dtype, size_t count, vh_stream *stream) {
    vh_op_stats *s = active;
    if (!s->counting) return s->inner.convert(dev, dst, dst_dtype, src, src_dtype, count, stream);
    double t0 = op_begin(s);
    vh_status st = s->inner.convert(dev, dst, dst_dtype, src, src_dtype, count, stream);
    return op_end(s, OP_convert, t0, st, 0.0);
}

static vh_status timed_copy(vh_device *dev, void *dst, const void *src, size_t bytes,
                            vh_copy_kind kind, vh_stream *stream) {
    vh_op_stats *s = active;
    if (!s->counting) return s->inner.copy(dev, dst, src, bytes, kind, stream);
    double t0 = op_begin(s);
    vh_status st = s->inner.copy(dev, dst, src, bytes, kind, stream);
    return op_end(s, OP_copy, t0, st, 0.0);
}

static vh_status timed_memset_zero(vh_device *dev, void *ptr, size_t bytes, vh_stream *stream) {
    vh_op_stats *s = active;
    if (!s->counting) return s->inner.memset_zero(dev, ptr, bytes, stream);
    double t0 = op_begin(s);
    vh_status st = s->inner.memset_zero(dev, ptr, bytes, stream);
    return op_end(s, OP_memset_zero, t0, st, 0.0);
}

#define OP_ENTRY(member, type, flops) \
    {#member, offsetof(vh_device_ops, member), (void (*)(void))timed_##member},
const op_stats_entry op_stats_entries[] = {
    VH_ARGS_OPS(OP_ENTRY)
    {"convert", offsetof(vh_device_ops, convert), (void (*)(void))timed_convert},
    {"copy", offsetof(vh_device_ops, copy), (void (*)(void))timed_copy},
    {"memset_zero", offsetof(vh_device_ops, memset_zero), (void (*)(void))timed_memset_zero},
};
const int op_stats_entry_count = (int)(sizeof op_stats_entries / sizeof op_stats_entries[0]);
_Static_assert(sizeof op_stats_entries / sizeof op_stats_entries[0] == OP_COUNT,
               "one entry per op, in enum order");

/* What is not timed: memory, streams and events, extensions. A call added
 * to vh_device_ops must join one list or the other. (A macro list, not an
 * array: only its length and that each member exists are needed.) */
#define UNTIMED_OPS(X)                                                                  \
    X(alloc) X(free) X(host_alloc) X(host_free) X(workspace) X(synchronize)             \
    X(stream_create) X(stream_destroy) X(stream_set) X(stream_synchronize)              \
    X(event_create) X(event_destroy) X(event_record) X(stream_wait_event)               \
    X(event_synchronize) X(event_query) X(get_extension)
#define UNTIMED_ONE(member) +1 + 0 * (int)offsetof(vh_device_ops, member)
enum { UNTIMED_COUNT = 0 UNTIMED_OPS(UNTIMED_ONE) };
_Static_assert(OP_COUNT + UNTIMED_COUNT ==
                   (sizeof(vh_device_ops) - offsetof(vh_device_ops, alloc)) /
                       sizeof(void (*)(void)),
               "a call was added to vh_device_ops: list it in VH_ARGS_OPS or UNTIMED_OPS");

/* ---- install ------------------------------------------------------------------- */

static int has_op(const vh_device_ops *ops, size_t offset) {
    void (*fn)(void);
    memcpy(&fn, (const char *)ops + offset, sizeof fn);
    return fn != NULL;
}

vh_status op_stats_install(vh_op_stats *stats, const vh_device_ops **device) {
    if (active || !device || !*device) return VH_STATUS_ERR_INVALID_ARG;
    memset(stats, 0, sizeof *stats);
    stats->original = *device;
    stats->inner = **device;
    stats->ops = stats->inner;
    /* an op the device lacks stays NULL, so a caller that checks sees it */
    for (int i = 0; i < op_stats_entry_count; i++)
        if (has_op(&stats->inner, op_stats_entries[i].offset))
            memcpy((char *)&stats->ops + op_stats_entries[i].offset,
                   &op_stats_entries[i].trampoline, sizeof op_stats_entries[i].trampoline);
    active = stats;
    *device = &stats->ops;
    return VH_STATUS_OK;
}

void op_stats_uninstall(vh_op_stats *stats, const vh_device_ops **device) {
    if (active != stats) return;
    stats->counting = 0;
    *device = stats->original;
    active = NULL;
}

void op_stats_start(vh_op_stats *stats) {
    memset(stats->stat, 0, sizeof stats->stat);
    memset(stats->gemm_shape, 0, sizeof stats->gemm_shape);
    stats->gemm_shapes = 0;
    stats->step_seconds = 0.0;
    stats->steps = 0;
    stats->counting = 1;
}

void op_stats_stop(vh_op_stats *stats) { stats->counting = 0; }

/* ---- printing ------------------------------------------------------------------- */

/* The figures qsort compares: entry i at (char *)sort_first + i * sort_stride. */
static const vh_op_stat *sort_first;
static size_t sort_stride;

static double sort_seconds(int i) {
    return ((const vh_op_stat *)(const void *)((const char *)sort_first +
                                                (size_t)i * sort_stride))->seconds;
}

static int by_time(const void *a, const void *b) {
    double x = sort_seconds(*(const int *)a), y = sort_seconds(*(const int *)b);
    return (x < y) - (x > y);
}

/* order's n indices of entries (first, stride bytes apart), longest first. */
static void sort_by_time(int *order, int n, const vh_op_stat *first, size_t stride) {
    sort_first = first;
    sort_stride = stride;
    qsort(order, (size_t)n, sizeof *order, by_time);
}

/* GFLOP/s of an entry; 0 when it did no FLOPs or took no time. */
static double gflops(const vh_op_stat *o) {
    return o->flops > 0 && o->seconds > 0 ? o->flops / o->seconds / 1e9 : 0.0;
}

/* The called ops, longest first, into order; how many. */
static int sorted_ops(const vh_op_stats *s, int *order) {
    int n = 0;
    for (int i = 0; i < op_stats_entry_count; i++)
        if (s->stat[i].calls > 0) order[n++] = i;
    sort_by_time(order, n, s->stat, sizeof s->stat[0]);
    return n;
}

static double total_seconds(const vh_op_stats *s) {
    double t = 0.0;
    for (int i = 0; i < op_stats_entry_count; i++) t += s->stat[i].seconds;
    return t;
}

static double per_step(const vh_op_stats *s, double v) {
    return s->steps > 0 ? v / (double)s->steps : 0.0;
}

static double percent(const vh_op_stats *s, double seconds) {
    return s->step_seconds > 0 ? 100.0 * seconds / s->step_seconds : 0.0;
}

/* The GEMM shapes, longest first, into order; how many. */
static int sorted_shapes(const vh_op_stats *s, int *order) {
    for (int i = 0; i < s->gemm_shapes; i++) order[i] = i;
    sort_by_time(order, s->gemm_shapes, &s->gemm_shape[0].stat, sizeof s->gemm_shape[0]);
    return s->gemm_shapes;
}

/* The epilogue in a shape's name: " +gelu", " +gelu'" (gelu'(T) kept in aux,
 * ABI 2.5), " *aux" (T * aux, 2.5), or "". */
static const char *epilogue_name(int32_t epilogue) {
    switch (epilogue) {
    case VH_EPILOGUE_GELU: return " +gelu";
    case VH_EPILOGUE_GELU_GRAD: return " +gelu'";
    case VH_EPILOGUE_MUL_AUX: return " *aux";
    default: return "";
    }
}

/* "[batch x] m x n x k dtype A^T.B +bias +gelu +res +beta", as the call
 * asked for it (op(A) is m x k, op(B) k x n; "bf16->f32": C's dtype
 * after the arrow when it is not A's and B's). */
static void shape_name(const vh_op_gemm_shape *g, char *buf, size_t size) {
    char dtypes[32];
    if (g->c_dtype != g->ab_dtype)
        snprintf(dtypes, sizeof dtypes, "%s->%s", vh_dtype_name((vh_dtype)g->ab_dtype),
                 vh_dtype_name((vh_dtype)g->c_dtype));
    else
        snprintf(dtypes, sizeof dtypes, "%s", vh_dtype_name((vh_dtype)g->ab_dtype));
    int n = g->batch > 1 ? snprintf(buf, size, "%lldx ", (long long)g->batch) : 0;
    snprintf(buf + n, size - (size_t)n, "%lldx%lldx%lld %s %s.%s%s%s%s%s", (long long)g->m,
             (long long)g->n, (long long)g->k, dtypes, g->trans_a ? "A^T" : "A",
             g->trans_b ? "B^T" : "B", g->bias ? " +bias" : "",
             epilogue_name(g->epilogue), g->residual ? " +res" : "",
             g->beta ? " +beta" : "");
}

#define SHAPES_PRINTED 10

static void print_shapes(const vh_op_stats *s, FILE *out) {
    int order[VH_OP_STATS_GEMM_SHAPES];
    int n = sorted_shapes(s, order);
    if (n == 0) return;
    fprintf(out, "    gemm by shape (m x n x k, op(A).op(B)), the %d slowest of %d%s\n",
            n < SHAPES_PRINTED ? n : SHAPES_PRINTED, n,
            n == VH_OP_STATS_GEMM_SHAPES ? "+" : "");
    for (int k = 0; k < n && k < SHAPES_PRINTED; k++) {
        const vh_op_gemm_shape *g = &s->gemm_shape[order[k]];
        char name[160];
        shape_name(g, name, sizeof name);
        fprintf(out, "      %-45s %5.1f %10.3f %7.1f%% %9.1f\n", name,
                per_step(s, (double)g->stat.calls), 1e3 * per_step(s, g->stat.seconds),
                percent(s, g->stat.seconds),
                gflops(&g->stat));
    }
}

void op_stats_print(const vh_op_stats *s, FILE *out) {
    int order[VH_OP_STATS_MAX];
    int n = sorted_ops(s, order);
    double total = total_seconds(s);
    fprintf(out, "  ops         device ops per step (mean of %lld steps, this rank)%s\n",
            (long long)s->steps,
            s->inner.kind != VH_DEVICE_KIND_CPU ? "; synchronised around each op" : "");
    fprintf(out, "    %-31s %9s %10s %8s %9s\n", "op", "calls", "ms", "% step", "GFLOP/s");
    for (int k = 0; k < n; k++) {
        const vh_op_stat *o = &s->stat[order[k]];
        fprintf(out, "    %-31s %9.1f %10.3f %7.1f%%", op_stats_entries[order[k]].name,
                per_step(s, (double)o->calls), 1e3 * per_step(s, o->seconds),
                percent(s, o->seconds));
        if (gflops(o) > 0) fprintf(out, " %9.1f\n", gflops(o));
        else fputs("         -\n", out);
    }
    fprintf(out, "    %-31s %9s %10.3f %7.1f%%\n", "all ops", "", 1e3 * per_step(s, total),
            percent(s, total));
    fprintf(out, "    %-31s %9s %10.3f %7.1f%%\n", "not in an op (host, data, comm)", "",
            1e3 * per_step(s, s->step_seconds - total), percent(s, s->step_seconds - total));
    fprintf(out, "    %-31s %9s %10.3f %7.1f%%\n", "step (mean)", "",
            1e3 * per_step(s, s->step_seconds), s->step_seconds > 0 ? 100.0 : 0.0);
    print_shapes(s, out);
    fflush(out);
}

void op_stats_print_json(const vh_op_stats *s, FILE *out) {
    int order[VH_OP_STATS_MAX];
    int n = sorted_ops(s, order);
    double total = total_seconds(s);
    fprintf(out, "{\"step_ms\": %.6g, \"total_ms\": %.6g, \"other_ms\": %.6g, \"by_op\": {",
            1e3 * per_step(s, s->step_seconds), 1e3 * per_step(s, total),
            1e3 * per_step(s, s->step_seconds - total));
    for (int k = 0; k < n; k++) {
        const vh_op_stat *o = &s->stat[order[k]];
        fprintf(out,
                "%s\"%s\": {\"calls_per_step\": %.6g, \"ms_per_step\": %.6g, "
                "\"percent_of_step\": %.4g, \"gflop_per_s\": ",
                k ? ", " : "", op_stats_entries[order[k]].name, per_step(s, (double)o->calls),
                1e3 * per_step(s, o->seconds), percent(s, o->seconds));
        if (gflops(o) > 0) fprintf(out, "%.6g}", gflops(o));
        else fputs("null}", out);
    }
    fputs("}, \"gemm_shapes\": [", out);
    int shapes[VH_OP_STATS_GEMM_SHAPES];
    n = sorted_shapes(s, shapes);
    for (int k = 0; k < n; k++) {
        const vh_op_gemm_shape *g = &s->gemm_shape[shapes[k]];
        char name[160];
        shape_name(g, name, sizeof name);
        fprintf(out,
                "%s{\"shape\": \"%s\", \"calls_per_step\": %.6g, \"ms_per_step\": %.6g, "
                "\"gflop_per_s\": %.6g}",
                k ? ", " : "", name, per_step(s, (double)g->stat.calls),
                1e3 * per_step(s, g->stat.seconds),
                gflops(&g->stat));
    }
    fputs("]}", out);
}
