/* test_attention_small.c - the CPU engine's fused attention blocks
 * (sdk/src/cpu/attention_small.c; attention_dot16.c for bf16 heads of
 * 16..96 on the native route, and the routes it stands in for) against a
 * plain float64 reference.
 *
 * Every shape the kernels tile differently: tokens N in {1, 7, 16, 49, 50,
 * 65} (no full row tile, one, a 1-row tail, two score vectors, more than the
 * 64 columns of one score tile) and head_dim {8, 16, 24, 32} (half, one and
 * two vectors per head row; f32 also 40 and 64), forward and backward, f32
 * and 16-bit storage, probs f32 or as the tensors, both layouts, rows with
 * gaps. The reference reads the inputs as stored and, as vh_device.h says,
 * uses P as stored. Also: the gaps between rows are never written, dqkv
 * is added to, and with ABI 2.6's overwrite written (the bits of adding to
 * zeros, the old values never read).
 * The bf16 heads of a multiple of 16 also take N 197 (rows past one score
 * tile's 6-row tail, an odd count of token pairs).
 * The softmax's exponentials are vh_expf's, bit for bit, on every route.
 * f32 probabilities written past the caches give the stored bits.
 * ctest runs it again with ONEDNN_MAX_CPU_ISA=AVX2 (the AVX2 kernels), and
 * with the native bf16 route forced, through the dot-product blocks and
 * through oneDNN's matmuls. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vithost/vh_cpu_engine.h"
#include "vithost/vh_runtime.h"

#include "cpu_ops.h" /* vh_expf: the exponential every softmax of the engine computes */

#define TOL_F32_MATH 1e-5 /* normalised error of f32 sums of <= 65 terms */
#define SENTINEL 4096.0f /* in the gaps; exact in every dtype */

static const vh_device_ops *ops;

/* What attention_dot16.c asks of the CPU (and of the build). */
static int cpu_has_dot16(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES)
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16") &&
           !__builtin_cpu_supports("amx-bf16");
#else
    return 0;
#endif
}
/* vh_expf as the engine's kernels compute it: with FMAs where the CPU runs
 * the AVX2 or AVX-512 clones (their contractions are one and the same; this
 * file is built with -ffp-contract=fast, as the SDK is), else without. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES)
__attribute__((target("arch=x86-64-v3"))) static float expf_fma(float x) { return vh_expf(x); }
static float expf_as_engine(float x) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v3") ? expf_fma(x) : vh_expf(x);
}
#else
static float expf_as_engine(float x) { return vh_expf(x); }
#endif

static uint64_t rng_state = 7;

static double rnd(void) { /* splitmix64, uniform in [0, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

static double tol(vh_dtype t) {
    return (t == VH_DTYPE_BF16 ? 0x1p-8 : t == VH_DTYPE_F16 ? 0x1p-11 : 0x1p-24) + TOL_F32_MATH;
}

static void put(void *p, vh_dtype t, int64_t i, float v) {
    if (t == VH_DTYPE_BF16) ((uint16_t *)p)[i] = vh_f32_to_bf16(v);
    else if (t == VH_DTYPE_F16) ((uint16_t *)p)[i] = vh_f32_to_f16(v);
    else ((float *)p)[i] = v;
}

static double get(const void *p, vh_dtype t, int64_t i) {
    if (t == VH_DTYPE_BF16) return vh_bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == VH_DTYPE_F16) return vh_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* A tensor of n elements: random values at the listed places (mask 1),
 * SENTINEL elsewhere. */
static void *tensor(vh_dtype t, int64_t n, const char *mask, double lo, double hi) {
    void *p = malloc((size_t)n * vh_dtype_size(t));
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) put(p, t, i, mask[i] ? (float)(lo + (hi - lo) * rnd()) : SENTINEL);
    return p;
}

/* ||got - ref|| / ||ref|| over the masked elements; the others untouched. */
static void expect(const char *what, const void *got, vh_dtype t, const double *ref,
                   const char *mask, int64_t n, const char *shape) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double g = get(got, t, i);
        if (!mask[i]) {
            if (g != SENTINEL) fail_msg("%s %s: gap element %lld written", what, shape, (long long)i);
            continue;
        }
        if (!isfinite(g)) fail_msg("%s %s: element %lld is %g", what, shape, (long long)i, g);
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    const double err = den > 0 ? sqrt(num / den) : sqrt(num);
    if (!(err <= tol(t))) fail_msg("%s %s: normalised error %.3g > %.3g", what, shape, err, tol(t));
}

typedef struct shape {
    int64_t B, N, H, Dh;
    vh_dtype t, pt;
    int second;
    double dqkv_init; /* dqkv's values before backward, in [-x, x]; 0: 1 */
} shape;

static vh_attention_args args_of(const shape *s) {
    const int64_t D = s->H * s->Dh, gap = s->second ? 0 : 8; /* batch-first rows with a gap */
    vh_attention_args a = {.struct_size = sizeof a, .batch = s->B, .tokens = s->N,
                           .heads = s->H, .head_dim = s->Dh,
                           .scale = 1.0f / sqrtf((float)s->Dh), .dtype = s->t,
                           .probs_dtype = s->pt};
    a.qkv_token_stride = s->second ? s->B * 3 * D : 3 * D + gap;
    a.qkv_batch_stride = s->second ? 3 * D : s->N * a.qkv_token_stride;
    a.out_token_stride = s->second ? s->B * D : D + gap;
    a.out_batch_stride = s->second ? D : s->N * a.out_token_stride;
    return a;
}

/* Places of the rows' elements (1) among the gaps (0). */
static char *row_mask(int64_t n, int64_t rows, int64_t stride, int64_t width) {
    char *m = calloc((size_t)n, 1);
    assert_non_null(m);
    for (int64_t r = 0; r < rows; r++) memset(m + r * stride, 1, (size_t)width);
    return m;
}

/* A shape's tensors: their elements, gaps included (qkv and dqkv, out and
 * dout, probs), and where their rows are (row_mask). */
typedef struct extents {
    int64_t nq, no, np;
    char *mq, *mo, *mp;
} extents;

static extents extents_of(const shape *s, const vh_attention_args *a) {
    const int64_t D = s->H * s->Dh, rows = s->B * s->N;
    const int64_t qs = s->second ? 3 * D : a->qkv_token_stride;
    const int64_t os = s->second ? D : a->out_token_stride;
    extents e = {rows * qs, rows * os, s->B * s->H * s->N * s->N, NULL, NULL, NULL};
    e.mq = row_mask(e.nq, rows, qs, 3 * D), e.mo = row_mask(e.no, rows, os, D);
    e.mp = row_mask(e.np, 1, e.np, e.np);
    return e;
}

static void extents_free(extents *e) { free(e->mq), free(e->mo), free(e->mp); }

#define QKV(w, t, d) (b * a->qkv_batch_stride + (t) * a->qkv_token_stride + (w) * D + h * Dh + (d))
#define OUT(t, d) (b * a->out_batch_stride + (t) * a->out_token_stride + h * Dh + (d))

/* Probabilities from the stored q, k, into p (dense, B H N N). */
static void ref_probs(const vh_attention_args *a, double *p) {
    const int64_t N = a->tokens, Dh = a->head_dim, D = a->heads * Dh;
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < a->heads; h++)
            for (int64_t i = 0; i < N; i++) {
                double *row = p + ((b * a->heads + h) * N + i) * N, mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < N; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < Dh; d++)
                        s += get(a->qkv, a->dtype, QKV(0, i, d)) * get(a->qkv, a->dtype, QKV(1, j, d));
                    row[j] = s * a->scale;
                    mx = fmax(mx, row[j]);
                }
                for (int64_t j = 0; j < N; j++) sum += (row[j] = exp(row[j] - mx));
                for (int64_t j = 0; j < N; j++) row[j] /= sum;
            }
}

/* out = P V, and dqkv += the gradients, with P as stored. */
static void ref_rest(const vh_attention_args *a, double *out, double *dqkv) {
    const int64_t N = a->tokens, Dh = a->head_dim, D = a->heads * Dh;
    double *ds = malloc((size_t)(N * N) * sizeof(double));
    assert_non_null(ds);
#define P(i, j) get(a->probs, a->probs_dtype, ((b * a->heads + h) * N + (i)) * N + (j))
#define X(w, t, d) get(a->qkv, a->dtype, QKV(w, t, d))
#define G(t, d) get(a->dout, a->dtype, OUT(t, d))
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < a->heads; h++) {
            for (int64_t i = 0; i < N; i++) {
                double rs = 0;
                for (int64_t d = 0; d < Dh; d++) {
                    double o = 0;
                    for (int64_t j = 0; j < N; j++) o += P(i, j) * X(2, j, d);
                    out[OUT(i, d)] = o;
                }
                for (int64_t j = 0; j < N; j++) {
                    double dp = 0;
                    for (int64_t d = 0; d < Dh; d++) dp += G(i, d) * X(2, j, d);
                    ds[i * N + j] = dp;
                    rs += dp * P(i, j);
                }
                for (int64_t j = 0; j < N; j++) ds[i * N + j] = P(i, j) * (ds[i * N + j] - rs);
            }
            for (int64_t i = 0; i < N; i++)
                for (int64_t d = 0; d < Dh; d++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int64_t j = 0; j < N; j++) {
                        dq += ds[i * N + j] * X(1, j, d);
                        dk += ds[j * N + i] * X(0, j, d);
                        dv += P(j, i) * G(j, d);
                    }
                    dqkv[QKV(0, i, d)] += a->scale * dq;
                    dqkv[QKV(1, i, d)] += a->scale * dk;
                    dqkv[QKV(2, i, d)] += dv;
                }
        }
#undef P
#undef X
#undef G
    free(ds);
}

static void run_shape(const shape *s) {
    vh_attention_args a = args_of(s);
    extents e = extents_of(s, &a);
    const int64_t nq = e.nq, no = e.no, np = e.np;
    const char *mq = e.mq, *mo = e.mo, *mp = e.mp;
    a.qkv = tensor(s->t, nq, mq, -1.5, 1.5);
    a.dout = tensor(s->t, no, mo, -1, 1);
    const double init = s->dqkv_init > 0 ? s->dqkv_init : 1.0;
    a.dqkv = tensor(s->t, nq, mq, -init, init); /* added to */
    a.out = tensor(s->t, no, mo, 0, 0);
    a.probs = tensor(s->pt, np, mp, 0, 0);
    double *p = malloc((size_t)np * sizeof(double)), *out = calloc((size_t)no, sizeof(double));
    double *dq = malloc((size_t)nq * sizeof(double));
    assert_true(p && out && dq);
    for (int64_t i = 0; i < nq; i++) dq[i] = get(a.dqkv, s->t, i);
    char name[96];
    snprintf(name, sizeof name, "(N %lld, head_dim %lld, %s, probs %s, %s)", (long long)s->N,
             (long long)s->Dh, vh_dtype_name(s->t), vh_dtype_name(s->pt),
             s->second ? "batch-second" : "batch-first with gaps");
    ref_probs(&a, p);
    assert_int_equal(ops->attention_forward(ops->device, &a), VH_STATUS_OK);
    expect("probs", a.probs, s->pt, p, mp, np, name);
    ref_rest(&a, out, dq);
    expect("out", a.out, s->t, out, mo, no, name);
    assert_int_equal(ops->attention_backward(ops->device, &a), VH_STATUS_OK);
    expect("dqkv (+=)", a.dqkv, s->t, dq, mq, nq, name);
    /* ABI 2.6's overwrite: dqkv's elements NaN before (never read), the gaps
     * untouched, and the bits those of adding to zeros */
    const size_t qbytes = (size_t)nq * vh_dtype_size(s->t);
    void *added = a.dqkv, *zeroed = tensor(s->t, nq, mq, 0, 0);
    void *written = tensor(s->t, nq, mq, 0, 0);
    for (int64_t i = 0; i < nq; i++)
        if (mq[i]) put(written, s->t, i, NAN);
    a.dqkv = zeroed;
    assert_int_equal(ops->attention_backward(ops->device, &a), VH_STATUS_OK);
    a.dqkv = written;
    a.overwrite = 1;
    assert_int_equal(ops->attention_backward(ops->device, &a), VH_STATUS_OK);
    if (memcmp(zeroed, written, qbytes) != 0)
        fail_msg("dqkv (overwrite) %s: not the bits of adding to zeros", name);
    a.overwrite = 0;
    free(added), free(zeroed), free(written);
    free((void *)a.qkv), free((void *)a.dout), free(a.out), free(a.probs);
    free(p), free(out), free(dq);
    extents_free(&e);
}

static void test_small_heads(void **state) {
    (void)state;
    /* every route below writes dqkv on request (ABI 2.6) */
    const vh_overwrite_ext *ow = ops->get_extension(ops->device, VH_OVERWRITE_EXTENSION);
    assert_non_null(ow);
    assert_true(ow->ops & VH_OVERWRITE_OP_ATTENTION_BACKWARD);
    static const int64_t tokens[] = {1, 7, 16, 49, 50, 65}, dims[] = {8, 16, 24, 32};
    static const vh_dtype types[][2] = {{VH_DTYPE_F32, VH_DTYPE_F32},
                                        {VH_DTYPE_BF16, VH_DTYPE_F32},
                                        {VH_DTYPE_BF16, VH_DTYPE_BF16},
                                        {VH_DTYPE_F16, VH_DTYPE_F16}};
    int k = 0;
    for (int ni = 0; ni < 6; ni++)
        for (int di = 0; di < 4; di++)
            for (int ti = 0; ti < 4; ti++, k++) {
                const shape s = {2, tokens[ni], 2, dims[di], types[ti][0], types[ti][1], k % 3 == 0, 0};
                run_shape(&s);
            }
    /* f32 heads up to 64 take the blocks too on AVX-512 (a head row of
     * several vectors, or widened rows when not whole vectors) */
    static const int64_t f32_dims[] = {40, 64};
    for (int ni = 0; ni < 6; ni++)
        for (int di = 0; di < 2; di++, k++) {
            const shape s = {2, tokens[ni], 2, f32_dims[di], VH_DTYPE_F32, VH_DTYPE_F32,
                             k % 2 == 0, 0};
            run_shape(&s);
        }
}

/* bf16 heads of a multiple of 16 up to 96: attention16.c's routes (the
 * dot-product blocks of attention_dot16.c on an AVX512-BF16 CPU; else the
 * small-head blocks up to 32, oneDNN's bf16 matmuls or the widened f32 path
 * past it; ctest runs each that the CPU has: see CMakeLists.txt).
 * P and dS are rounded to bf16 before their products there, which the
 * bf16 tolerance covers. dqkv starts small, so that the error of the
 * gradients, not of its old values, is what the tolerance measures. */
static void test_bf16_wide_heads(void **state) {
    (void)state;
    static const int64_t tokens[] = {1, 7, 16, 49, 50, 65, 197};
    static const int64_t dims[] = {16, 32, 48, 64, 80, 96};
    int k = 0;
    for (int ni = 0; ni < 7; ni++)
        for (int di = 0; di < 6; di++)
            for (int pi = 0; pi < 2; pi++, k++) {
                const shape s = {2, tokens[ni], 2, dims[di], VH_DTYPE_BF16,
                                 pi ? VH_DTYPE_BF16 : VH_DTYPE_F32, k % 3 == 1, 0x1p-6};
                run_shape(&s);
            }
    /* The route the native choice took, as vithost bench prints it: on a
     * CPU with AVX512-BF16 (and no AMX) the dot-product blocks, unless
     * VITHOST_CPU_ATTENTION16=onednn. */
    char line[256];
    vh_cpu_attention_routes(line, sizeof line);
    print_message("%s\n", line);
    const char *g16 = getenv("VITHOST_CPU_GEMM16"), *a16 = getenv("VITHOST_CPU_ATTENTION16");
    const char *isa = getenv("ONEDNN_MAX_CPU_ISA");
    if (g16 && strcmp(g16, "native") == 0) {
        if (a16 && strcmp(a16, "onednn") == 0)
            assert_null(strstr(line, "dot-product"));
        else if (cpu_has_dot16() && (!isa || !*isa))
            assert_non_null(strstr(line, "dot-product"));
    }
}

/* A large score: the softmax's max is subtracted (no overflow), and a row
 * whose other scores are far below gives probabilities of exactly 0. */
static void test_large_scores(void **state) {
    (void)state;
    const shape s = {1, 49, 1, 16, VH_DTYPE_F32, VH_DTYPE_F32, 0, 0};
    vh_attention_args a = args_of(&s);
    const int64_t nq = 49 * a.qkv_token_stride, no = 49 * a.out_token_stride;
    float *qkv = calloc((size_t)nq, sizeof(float)), *out = calloc((size_t)no, sizeof(float));
    float *p = calloc(49 * 49, sizeof(float));
    assert_true(qkv && out && p);
    for (int64_t t = 0; t < 49; t++) qkv[t * a.qkv_token_stride + 2 * 16] = (float)t; /* v */
    qkv[0] = 100.0f, qkv[a.qkv_token_stride + 16] = 100.0f; /* q_0 . k_1 = 1e4 */
    a.qkv = qkv, a.out = out, a.probs = p;
    assert_int_equal(ops->attention_forward(ops->device, &a), VH_STATUS_OK);
    assert_true(p[1] == 1.0f && p[0] == 0.0f && p[48] == 0.0f);
    assert_true(out[0] == 1.0f); /* row 0 takes v_1 */
    assert_true(fabsf(p[49] - 1.0f / 49) < 1e-7f && fabsf(out[a.out_token_stride] - 24.0f) < 1e-4f);
    free(qkv), free(out), free(p);
}

/* The softmax's e^(s - max) has vh_expf's bits on every route and ISA,
 * down to the lanes that underflow to 0 (below e^-86.5), -inf and the
 * padding of the last vector. Scores are exact (q = e_0, k_j = (v_j, 0..),
 * scale 1; bf16 values for bf16 tensors); the row's maximum, 0, sits in
 * its last column and the others lie 21 or more below it, so the row sums
 * to exactly 1 and each probability is the exponential itself. */
static void test_softmax_exponentials(void **state) {
    (void)state;
    static const float below[] = {-21.0f, -21.5f, -22.75f, -25.0f, -30.5f, -33.25f, -40.0f,
                                  -47.5f, -55.0f, -63.0f, -70.5f, -80.0f, -84.5f, -86.0f,
                                  -86.5f, -87.0f, -88.0f, -90.0f, -100.0f, -128.0f, -255.0f,
                                  -1e30f, -INFINITY};
    const int nbelow = (int)(sizeof below / sizeof below[0]);
    const vh_dtype dtypes[] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    const int64_t tokens[] = {16, 50, 65};
    for (int di = 0; di < 2; di++)
        for (int ni = 0; ni < 3; ni++) {
            const int64_t N = tokens[ni];
            const shape s = {1, N, 1, 16, dtypes[di], VH_DTYPE_F32, 0, 0};
            vh_attention_args a = args_of(&s);
            a.scale = 1.0f;
            const int64_t ts = a.qkv_token_stride;
            void *qkv = calloc((size_t)(N * ts), vh_dtype_size(s.t));
            void *out = calloc((size_t)(N * a.out_token_stride), vh_dtype_size(s.t));
            float *p = calloc((size_t)(N * N), sizeof(float));
            float *v = calloc((size_t)N, sizeof(float));
            assert_true(qkv && out && p && v);
            for (int64_t j = 0; j < N; j++) {
                /* the listed values, then random ones in [-87, -21] */
                const float x = j == N - 1 ? 0.0f
                                : j < nbelow ? below[j]
                                             : -21.0f - 66.0f * (float)rnd();
                v[j] = s.t == VH_DTYPE_BF16 ? vh_bf16_to_f32(vh_f32_to_bf16(x)) : x;
                put(qkv, s.t, j * ts, 1.0f);        /* q_j = e_0 */
                put(qkv, s.t, j * ts + 16, v[j]); /* k_j = (v_j, 0, ...) */
            }
            a.qkv = qkv, a.out = out, a.probs = p;
            assert_int_equal(ops->attention_forward(ops->device, &a), VH_STATUS_OK);
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < N; j++) {
                    const float want = expf_as_engine(v[j]), got = p[i * N + j];
                    if (memcmp(&want, &got, sizeof got) != 0)
                        fail_msg("%s N %lld: probs[%lld][%lld] = %a, e^%g is %a",
                                 vh_dtype_name(s.t), (long long)N, (long long)i, (long long)j,
                                 (double)got, (double)v[j], (double)want);
                }
            free(qkv), free(out), free(p), free(v);
        }
}

/* A caller built before ABI 2.6 hands a struct that ends before `overwrite`:
 * whatever lies past its struct_size, backward adds to dqkv. */
static void test_overwrite_past_struct_size(void **state) {
    (void)state;
    const shape s = {2, 50, 2, 16, VH_DTYPE_F32, VH_DTYPE_F32, 0, 0};
    vh_attention_args a = args_of(&s);
    const int64_t D = s.H * s.Dh, rows = s.B * s.N;
    const int64_t nq = rows * a.qkv_token_stride, no = rows * a.out_token_stride;
    const int64_t np = s.B * s.H * s.N * s.N;
    char *mq = row_mask(nq, rows, a.qkv_token_stride, 3 * D);
    char *mo = row_mask(no, rows, a.out_token_stride, D), *mp = row_mask(np, 1, np, np);
    a.qkv = tensor(s.t, nq, mq, -1.5, 1.5);
    a.dout = tensor(s.t, no, mo, -1, 1);
    a.out = tensor(s.t, no, mo, 0, 0);
    a.probs = tensor(s.pt, np, mp, 0, 0);
    assert_int_equal(ops->attention_forward(ops->device, &a), VH_STATUS_OK);
    float *added = tensor(s.t, nq, mq, -1, 1), *old = malloc((size_t)nq * sizeof(float));
    assert_non_null(old);
    memcpy(old, added, (size_t)nq * sizeof(float));
    a.dqkv = added;
    assert_int_equal(ops->attention_backward(ops->device, &a), VH_STATUS_OK);
    a.dqkv = old;
    a.overwrite = 1;
    a.struct_size = (uint32_t)offsetof(vh_attention_args, overwrite);
    assert_int_equal(ops->attention_backward(ops->device, &a), VH_STATUS_OK);
    assert_memory_equal(added, old, (size_t)nq * sizeof(float));
    free((void *)a.qkv), free((void *)a.dout), free(a.out), free(a.probs);
    free(added), free(old), free(mq), free(mo), free(mp);
}

/* f32 probabilities written past the caches (VITHOST_CPU_STREAM=1; by
 * default only where the step's tensors exceed the L3): the same bits of
 * probs and out as stored ones, for token counts on both sides of a whole
 * number of vectors (a vector then spans two rows), blocks starting at every
 * alignment; and against the reference, backward included (it reads the
 * streamed P). Streamed are score rows past the registers' softmax (N > 80
 * on AVX-512, > 16 on AVX2, which ctest runs too); shorter ones keep their
 * stores from the registers, and must give the same bits all the same. */
static void test_streamed_probs(void **state) {
    (void)state;
    static const int64_t tokens[] = {7, 16, 17, 49, 65, 80, 81, 100, 113, 197};
    static const int64_t dims[] = {16, 64};
    for (int ni = 0; ni < 10; ni++)
        for (int di = 0; di < 2; di++) {
            const shape s = {3, tokens[ni], 3, dims[di], VH_DTYPE_F32, VH_DTYPE_F32, ni % 2, 0};
            vh_attention_args a = args_of(&s);
            extents e = extents_of(&s, &a);
            const int64_t no = e.no, np = e.np;
            a.qkv = tensor(s.t, e.nq, e.mq, -1.5, 1.5);
            void *out[2], *probs[2];
            for (int k = 0; k < 2; k++) {
                assert_int_equal(setenv("VITHOST_CPU_STREAM", k ? "1" : "0", 1), 0);
                a.out = out[k] = tensor(s.t, no, e.mo, 0, 0);
                a.probs = probs[k] = tensor(s.pt, np, e.mp, 0, 0);
                assert_int_equal(ops->attention_forward(ops->device, &a), VH_STATUS_OK);
            }
            if (memcmp(probs[0], probs[1], (size_t)np * sizeof(float)) != 0)
                fail_msg("probs streamed (N %lld, head_dim %lld): not the stored bits",
                         (long long)s.N, (long long)s.Dh);
            if (memcmp(out[0], out[1], (size_t)no * sizeof(float)) != 0)
                fail_msg("out with probs streamed (N %lld, head_dim %lld): not the same bits",
                         (long long)s.N, (long long)s.Dh);
            for (int k = 0; k < 2; k++) free(out[k]), free(probs[k]);
            free((void *)a.qkv);
            extents_free(&e);
            run_shape(&s); /* streamed, against the reference */
        }
    unsetenv("VITHOST_CPU_STREAM"); /* the engine's own rule */
    char line[256]; /* as vithost bench prints it */
    vh_cpu_attention_routes(line, sizeof line);
    if (strstr(line, "fused small-head blocks"))
        assert_non_null(strstr(line, "f32 probabilities streamed past the caches"));
}

/* out, probs and dqkv of one forward and backward (dqkv added to), with
 * the engine's switch `name` set to `value` for both calls (name NULL: its
 * defaults); each freshly allocated, the same values every time. */
static void switched_run(const shape *s, const char *name, const char *value, void **out,
                         void **probs, void **dqkv) {
    vh_attention_args a = args_of(s);
    extents e = extents_of(s, &a);
    const uint64_t saved = rng_state;
    rng_state = 99;
    a.qkv = tensor(s->t, e.nq, e.mq, -1.5, 1.5);
    a.dout = tensor(s->t, e.no, e.mo, -1, 1);
    a.dqkv = *dqkv = tensor(s->t, e.nq, e.mq, -1, 1);
    rng_state = saved;
    a.out = *out = tensor(s->t, e.no, e.mo, 0, 0);
    a.probs = *probs = tensor(s->pt, e.np, e.mp, 0, 0);
    if (name) assert_int_equal(setenv(name, value, 1), 0);
    const vh_status fwd = ops->attention_forward(ops->device, &a);
    const vh_status bwd = ops->attention_backward(ops->device, &a);
    if (name) unsetenv(name);
    assert_int_equal(fwd, VH_STATUS_OK);
    assert_int_equal(bwd, VH_STATUS_OK);
    free((void *)a.qkv), free((void *)a.dout);
    extents_free(&e);
}

/* Two runs' out, probs and dqkv (switched_run): the same bits, or a failure
 * that names the shape and what differed. */
static void expect_same_runs(const shape *s, void *out[2], void *probs[2], void *dqkv[2],
                             const char *what) {
    const vh_attention_args a = args_of(s);
    extents e = extents_of(s, &a);
    const size_t es = vh_dtype_size(s->t), ps = vh_dtype_size(s->pt);
    if (memcmp(out[0], out[1], (size_t)e.no * es) || memcmp(probs[0], probs[1], (size_t)e.np * ps) ||
        memcmp(dqkv[0], dqkv[1], (size_t)e.nq * es))
        fail_msg("B %lld N %lld head_dim %lld %s probs %s %s: %s give other bits",
                 (long long)s->B, (long long)s->N, (long long)s->Dh, vh_dtype_name(s->t),
                 vh_dtype_name(s->pt),
                 s->second ? "batch-second" : "batch-first", what);
    for (int k = 0; k < 2; k++) free(out[k]), free(probs[k]), free(dqkv[k]);
    extents_free(&e);
}

/* Which thread runs a block never changes its numbers: the blocks dealt as
 * contiguous runs of samples (the default) and one sample at a time give
 * the same bits, for batches that split evenly over two threads and not
 * (B 1, 3, 5), both layouts, f32 (the small-head blocks) and bf16 (the
 * dot-product blocks where the CPU has them). With each block run exactly
 * once, the default's results are also the reference's (run_shape). */
static void test_dealing(void **state) {
    (void)state;
    static const int64_t batches[] = {1, 3, 5, 8};
    static const vh_dtype types[] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    for (int bi = 0; bi < 4; bi++)
        for (int ti = 0; ti < 2; ti++)
            for (int second = 0; second < 2; second++) {
                const shape s = {batches[bi], 50, 3, 16, types[ti], types[ti], second, 0};
                void *out[2], *probs[2], *dqkv[2];
                /* each thread a contiguous run of samples (deal.c), then one sample
                 * at a time to whichever thread is free */
                switched_run(&s, NULL, NULL, &out[0], &probs[0], &dqkv[0]);
                switched_run(&s, "VITHOST_CPU_DEAL", "dynamic", &out[1], &probs[1], &dqkv[1]);
                expect_same_runs(&s, out, probs, dqkv,
                                 "blocks dealt by sample runs and one at a time");
                run_shape(&s);
            }
}

/* The dot-product blocks' softmax (forward) and dS (backward) in registers
 * (by default for heads of 16; VITHOST_CPU_ATTENTION16_REGS=1 wherever a
 * score row is at most 5 vectors) and in passes over scratch (=0): the
 * same bits, for rows of 1 to 5 vectors, whole and not, heads of 16 to 64,
 * f32 and bf16 probabilities, both layouts; and the registers forced
 * against the reference. Where the CPU lacks AVX512-BF16 (or AMX takes
 * bf16) both runs take another route, and say so; an unoptimised build
 * takes the passes both times (attention_dot16.c's reg_softmax says why). */
static void test_register_softmax(void **state) {
    (void)state;
    static const int64_t tokens[] = {16, 17, 33, 50, 65, 80};
    static const int64_t dims[] = {16, 32, 64};
    if (!cpu_has_dot16()) print_message("no dot-product blocks on this CPU: one route twice\n");
    const char *g16 = getenv("VITHOST_CPU_GEMM16");
    char *saved = g16 ? strdup(g16) : NULL;
    assert_int_equal(setenv("VITHOST_CPU_GEMM16", "native", 1), 0); /* the blocks' route */
    int k = 0;
    for (int ni = 0; ni < 6; ni++)
        for (int di = 0; di < 3; di++)
            for (int pi = 0; pi < 2; pi++, k++) {
                const shape s = {3, tokens[ni], 2, dims[di], VH_DTYPE_BF16,
                                 pi ? VH_DTYPE_BF16 : VH_DTYPE_F32, k % 2, 0};
                void *out[2], *probs[2], *dqkv[2];
                switched_run(&s, "VITHOST_CPU_ATTENTION16_REGS", "1", &out[0], &probs[0], &dqkv[0]);
                switched_run(&s, "VITHOST_CPU_ATTENTION16_REGS", "0", &out[1], &probs[1], &dqkv[1]);
                expect_same_runs(&s, out, probs, dqkv, "the registers' softmax and the passes");
                if (ni % 2 == 0) {
                    assert_int_equal(setenv("VITHOST_CPU_ATTENTION16_REGS", "1", 1), 0);
                    run_shape(&s);
                    unsetenv("VITHOST_CPU_ATTENTION16_REGS");
                }
            }
    if (saved) setenv("VITHOST_CPU_GEMM16", saved, 1);
    else unsetenv("VITHOST_CPU_GEMM16");
    free(saved);
}

/* Probabilities below FLT_MIN, stored as bf16 subnormals on both of the
 * dot-product blocks' softmax routes (vcvtneps2bf16, which they take for
 * the rest, would read them as 0), and as f32 probabilities exactly. One
 * head of 16, N 50: every score 0 but column X's, -86 (q_i = e_0, k_j =
 * (0 or -86, 0, ...), scale 1), so the row sums to 49 and p_X = e^-86 / 49,
 * about 9e-40. (Not out = P16 V: vdpbf16ps itself reads subnormal bf16
 * inputs as zero, as oneDNN's bf16 matmuls do.) */
static void test_subnormal_probabilities(void **state) {
    (void)state;
    enum { N = 50, X = 37 };
    const float pf = expf_as_engine(-86.0f) * (1.0f / 49.0f);
    const uint16_t p16 = vh_f32_to_bf16(pf);
    assert_true(pf > 0 && pf < 0x1p-126f && p16 != 0);
    const char *g16 = getenv("VITHOST_CPU_GEMM16");
    char *saved = g16 ? strdup(g16) : NULL;
    assert_int_equal(setenv("VITHOST_CPU_GEMM16", "native", 1), 0);
    for (int regs = 0; regs < 2; regs++)
        for (int pi = 0; pi < 2; pi++) {
            const shape s = {1, N, 1, 16, VH_DTYPE_BF16, pi ? VH_DTYPE_BF16 : VH_DTYPE_F32, 0, 0};
            vh_attention_args a = args_of(&s);
            a.scale = 1.0f;
            const int64_t ts = a.qkv_token_stride;
            uint16_t *qkv = calloc((size_t)(N * ts), 2);
            uint16_t *out = calloc((size_t)(N * a.out_token_stride), 2);
            void *probs = calloc(N * N, vh_dtype_size(s.pt));
            assert_true(qkv && out && probs);
            for (int64_t j = 0; j < N; j++) {
                put(qkv, s.t, j * ts, 1.0f);                        /* q_j = e_0 */
                put(qkv, s.t, j * ts + 16, j == X ? -86.0f : 0.0f); /* k_j */
            }
            a.qkv = qkv, a.out = out, a.probs = probs;
            assert_int_equal(setenv("VITHOST_CPU_ATTENTION16_REGS", regs ? "1" : "0", 1), 0);
            assert_int_equal(ops->attention_forward(ops->device, &a), VH_STATUS_OK);
            unsetenv("VITHOST_CPU_ATTENTION16_REGS");
            for (int64_t i = 0; i < N; i++) {
                const float got = (float)get(probs, s.pt, i * N + X);
                const float want = pi ? vh_bf16_to_f32(p16) : pf;
                if (memcmp(&got, &want, sizeof got) != 0)
                    fail_msg("%s probs[%lld][%d] = %a, want %a (registers %d)",
                             vh_dtype_name(s.pt), (long long)i, X, (double)got, (double)want, regs);
            }
            free(qkv), free(out), free(probs);
        }
    if (saved) setenv("VITHOST_CPU_GEMM16", saved, 1);
    else unsetenv("VITHOST_CPU_GEMM16");
    free(saved);
}

static int setup(void **state) {
    (void)state;
    ops = vh_cpu_device_ops();
    return ops ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_heads),
        cmocka_unit_test(test_bf16_wide_heads),
        cmocka_unit_test(test_large_scores),
        cmocka_unit_test(test_softmax_exponentials),
        cmocka_unit_test(test_overwrite_past_struct_size),
        cmocka_unit_test(test_streamed_probs),
        cmocka_unit_test(test_dealing),
        cmocka_unit_test(test_register_softmax),
        cmocka_unit_test(test_subnormal_probabilities),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
