/* layernorm_avx512.c - layer-norm rows, f32 or bf16 (AMP's residual
 * stream), written for AVX-512: the bits of layernorm.c's portable loops on
 * the same CPU, which sum a row in 16 lanes (element j in lane j % 16)
 * folded in a fixed tree (ln_fold); here the 16 lanes are one vector,
 * folded in that tree, with the same operations fused into FMAs as GCC
 * fuses them in those loops (-ffp-contract=fast: a product whose every use
 * is an add or a subtract). test_ops_dtypes' test_layernorm_routes holds the
 * two to the same bits (VITHOST_CPU_LAYERNORM=portable forces the loops).
 *
 * Why: GCC built the portable loops with 8-float vectors, kept the lane
 * sums in stack arrays folded through memory, and added each row's terms to
 * the parameter-gradient partials in memory. In the T1 AMP step (width 64,
 * Zen 5, 2 threads, `vithost bench --ops`) the bf16 layer norms took 0.52 ms
 * forward and 0.95 backward a step where the f32 ones, reading twice the
 * bytes, took 0.41 and 0.54. Here a row's vectors, its sums and (for widths
 * up to 64) the chunk's partials stay in registers. Same step, 3 interleaved
 * pairs: forward 0.51-0.54 -> 0.36-0.38 ms, backward 0.90-0.97 -> 0.48-0.50.
 * One bf16 call alone, operands in cache, us: 6400 x 64 forward 55 -> 38,
 * backward 77-84 -> 44-51; 1576 x 384 (T3) 63 -> 47, 85 -> 63-66.
 * f32 rows too where that pays (runs_here: widths up to 64); T1 fp32 step,
 * 3 interleaved pairs: forward 0.43-0.49 -> 0.34-0.42 ms, backward
 * 0.56-0.58 -> 0.49-0.52.
 *
 * Only widths that are a multiple of 16; the callers take the portable loops
 * otherwise, and on a CPU without AVX-512. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"

/* Only where GCC optimises and contracts (sdk/CMakeLists.txt): unoptimised
 * builds do not fuse the portable loops' products. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES) && defined(__OPTIMIZE__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")

#include "bf16_round_avx512.h"

#define LNV_INLINE __attribute__((always_inline)) static inline

/* Registers hold the partials and a row's vectors up to this many vectors. */
#define LNV_REG_VECTORS 4

/* 16 values at element i of a row as stored (bf16 when `bf`, else f32),
 * and back (bf16 rounded to nearest even, as vh_cpu_bf16_round). */
LNV_INLINE __m512 load16(const void *p, int64_t i, int bf) {
    return bf ? vh_avx512_widen_bf16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
              : _mm512_loadu_ps((const float *)p + i);
}

LNV_INLINE void store16(void *p, int64_t i, __m512 v, int bf) {
    if (bf)
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), vh_avx512_round_bf16(v));
    else
        _mm512_storeu_ps((float *)p + i, v);
}

LNV_INLINE const void *row_at(const void *p, int64_t r, int64_t dim, int bf) {
    return (const char *)p + (size_t)(r * dim) * (bf ? 2 : 4);
}

/* ln_fold: lanes l and l + 8, then l and l + 4, then (0 + 2) + (1 + 3). */
LNV_INLINE float fold16(__m512 a) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 s = _mm_add_ps(q, _mm_movehl_ps(q, q)); /* q0 + q2, q1 + q3 */
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* The forward of a block of rows (layernorm_rows' order): the means of all
 * its rows (of x - x[0], then shifted back), then their variances (two
 * passes), then the outputs, so that each row's fold overlaps the next
 * row's sums: one row at a time, each waited on its own (T1's 6400 x 64
 * bf16, 2 threads: 72 against 56 us a call with the portable loops). */
LNV_INLINE void forward_rows(void *y, float *mean, float *rstd, const void *x, const float *w,
                            const float *b, int64_t rows, int64_t dim, float eps, int bf) {
    const int64_t vectors = dim / 16;
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = row_at(x, r, dim, bf);
        const float shift = bf ? vh_cpu_bf16_widen(*(const uint16_t *)xr) : *(const float *)xr;
        const __m512 c = _mm512_set1_ps(shift);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t v = 0; v < vectors; v++)
            acc = _mm512_add_ps(acc, _mm512_sub_ps(load16(xr, 16 * v, bf), c));
        mean[r] = shift + fold16(acc) / (float)dim;
    }
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = row_at(x, r, dim, bf);
        const __m512 m = _mm512_set1_ps(mean[r]);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t v = 0; v < vectors; v++) {
            const __m512 d = _mm512_sub_ps(load16(xr, 16 * v, bf), m);
            acc = _mm512_fmadd_ps(d, d, acc);
        }
        rstd[r] = 1.0f / sqrtf(fold16(acc) / (float)dim + eps);
    }
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = row_at(x, r, dim, bf);
        void *yr = (void *)(uintptr_t)row_at(y, r, dim, bf);
        const __m512 m = _mm512_set1_ps(mean[r]), s = _mm512_set1_ps(rstd[r]);
        for (int64_t v = 0; v < vectors; v++) {
            const __m512 t = _mm512_mul_ps(_mm512_sub_ps(load16(xr, 16 * v, bf), m), s);
            store16(yr, 16 * v,
                    _mm512_fmadd_ps(t, _mm512_loadu_ps(w + 16 * v), _mm512_loadu_ps(b + 16 * v)),
                    bf);
        }
    }
}

/* Backward rows of V vectors (V <= LNV_REG_VECTORS, a constant after
 * inlining; the partials pw, pb in registers over the rows, each row's xhat
 * and dout kept between its two passes), or of any multiple of 16 with V 0
 * (the partials added to in memory, in L1, row by row; xhat and dout read
 * again: the same bits). The terms as ln_backward_terms makes them: xhat =
 * (x - m) s, g = dout w, the sums of g and g xhat, pw += dout xhat, pb +=
 * dout; then dx += s (dout w - mg - xhat mgx) with mg, mgx the folded sums
 * over the width. */
LNV_INLINE void backward_rows_v(int V, void *dx, float *pw, float *pb, const void *dout,
                               const void *x, const float *w, const float *mean,
                               const float *rstd, int64_t rows, int64_t dim, int bf) {
    __m512 vw[LNV_REG_VECTORS], vpw[LNV_REG_VECTORS], vpb[LNV_REG_VECTORS];
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
        vw[v] = _mm512_loadu_ps(w + 16 * v);
        vpw[v] = _mm512_loadu_ps(pw + 16 * v);
        vpb[v] = _mm512_loadu_ps(pb + 16 * v);
    }
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = row_at(x, r, dim, bf), *gr = row_at(dout, r, dim, bf);
        void *dr = (void *)(uintptr_t)row_at(dx, r, dim, bf);
        const __m512 m = _mm512_set1_ps(mean[r]), s = _mm512_set1_ps(rstd[r]);
        __m512 xhat[LNV_REG_VECTORS], gj[LNV_REG_VECTORS];
        __m512 acc_g = _mm512_setzero_ps(), acc_gx = _mm512_setzero_ps();
        if (V) {
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) {
                xhat[v] = _mm512_mul_ps(_mm512_sub_ps(load16(xr, 16 * v, bf), m), s);
                gj[v] = load16(gr, 16 * v, bf);
                const __m512 g = _mm512_mul_ps(gj[v], vw[v]);
                acc_g = _mm512_add_ps(acc_g, g);
                acc_gx = _mm512_fmadd_ps(g, xhat[v], acc_gx);
                vpw[v] = _mm512_fmadd_ps(gj[v], xhat[v], vpw[v]);
                vpb[v] = _mm512_add_ps(vpb[v], gj[v]);
            }
        } else {
            for (int64_t j = 0; j < dim; j += 16) {
                const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(load16(xr, j, bf), m), s);
                const __m512 gv = load16(gr, j, bf);
                const __m512 g = _mm512_mul_ps(gv, _mm512_loadu_ps(w + j));
                acc_g = _mm512_add_ps(acc_g, g);
                acc_gx = _mm512_fmadd_ps(g, xh, acc_gx);
                _mm512_storeu_ps(pw + j, _mm512_fmadd_ps(gv, xh, _mm512_loadu_ps(pw + j)));
                _mm512_storeu_ps(pb + j, _mm512_add_ps(_mm512_loadu_ps(pb + j), gv));
            }
        }
        const __m512 mg = _mm512_set1_ps(fold16(acc_g) / (float)dim);
        const __m512 mgx = _mm512_set1_ps(fold16(acc_gx) / (float)dim);
        if (V) {
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) {
                const __m512 inner =
                    _mm512_fnmadd_ps(xhat[v], mgx, _mm512_fmsub_ps(gj[v], vw[v], mg));
                store16(dr, 16 * v, _mm512_fmadd_ps(s, inner, load16(dr, 16 * v, bf)), bf);
            }
        } else {
            for (int64_t j = 0; j < dim; j += 16) {
                const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(load16(xr, j, bf), m), s);
                const __m512 inner = _mm512_fnmadd_ps(
                    xh, mgx, _mm512_fmsub_ps(load16(gr, j, bf), _mm512_loadu_ps(w + j), mg));
                store16(dr, j, _mm512_fmadd_ps(s, inner, load16(dr, j, bf)), bf);
            }
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
        _mm512_storeu_ps(pw + 16 * v, vpw[v]);
        _mm512_storeu_ps(pb + 16 * v, vpb[v]);
    }
}

/* Each storage's code built apart (bf a constant in each). */
#define LNV_ROWS(bf_)                                                                         \
    static void backward_rows_##bf_(void *dx, float *pw, float *pb, const void *dout,         \
                                    const void *x, const float *w, const float *mean,         \
                                    const float *rstd, int64_t rows, int64_t dim) {           \
        switch (dim / 16) {                                                                   \
        case 1: backward_rows_v(1, dx, pw, pb, dout, x, w, mean, rstd, rows, dim, bf_); break; \
        case 2: backward_rows_v(2, dx, pw, pb, dout, x, w, mean, rstd, rows, dim, bf_); break; \
        case 3: backward_rows_v(3, dx, pw, pb, dout, x, w, mean, rstd, rows, dim, bf_); break; \
        case 4: backward_rows_v(4, dx, pw, pb, dout, x, w, mean, rstd, rows, dim, bf_); break; \
        default: backward_rows_v(0, dx, pw, pb, dout, x, w, mean, rstd, rows, dim, bf_); break; \
        }                                                                                     \
    }                                                                                         \
    static void forward_rows_##bf_(void *y, float *mean, float *rstd, const void *x,          \
                                   const float *w, const float *b, int64_t rows, int64_t dim, \
                                   float eps) {                                               \
        forward_rows(y, mean, rstd, x, w, b, rows, dim, eps, bf_);                            \
    }
LNV_ROWS(0)
LNV_ROWS(1)
#undef LNV_ROWS

#pragma GCC pop_options

/* VITHOST_CPU_LAYERNORM=portable keeps the portable loops (tests and A/B
 * runs); unset or "avx512": these rows where they apply. Another value is
 * reported once and read as unset. Read at every call: a test switches it. */
static int wanted(void) {
    static int told;
    const char *v = getenv("VITHOST_CPU_LAYERNORM");
    if (!v || !*v || strcmp(v, "avx512") == 0) return 1;
    if (strcmp(v, "portable") == 0) return 0;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "vithost: VITHOST_CPU_LAYERNORM=%s is not avx512 or portable; taking "
                        "avx512\n", v);
    return 1;
}

/* bf16 rows at any multiple of 16; f32 rows only where the partials stay in
 * registers (widths up to 64): there these rows beat the portable loops,
 * which GCC builds well enough for f32 at larger widths. One f32 call alone,
 * 2 threads, operands in cache, us, loops / these rows: 6400 x 64 forward
 * 49-52 / 38-39, backward 58 / 35; 2048 x 128 (the main job) 26-27 / 30,
 * 35 / 36; 1576 x 384 (T3) 49 / 45-48, 72-73 / 69-76. */
static int runs_here(int64_t dim, int bf16) {
    static int has = -1; /* the same in every thread */
    int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("x86-64-v4") != 0;
        __atomic_store_n(&has, h, __ATOMIC_RELAXED);
    }
    return h && dim > 0 && dim % 16 == 0 && (bf16 || dim / 16 <= LNV_REG_VECTORS) && wanted();
}

int vh_cpu_k_layernorm_avx512_forward_rows(void *out, float *mean, float *rstd, const void *x,
                                           const float *weight, const float *bias, int64_t rows,
                                           int64_t dim, float eps, int bf16) {
    if (!runs_here(dim, bf16)) return 0;
    if (bf16)
        forward_rows_1(out, mean, rstd, x, weight, bias, rows, dim, eps);
    else
        forward_rows_0(out, mean, rstd, x, weight, bias, rows, dim, eps);
    return 1;
}

int vh_cpu_k_layernorm_avx512_backward_rows(void *dx, float *pw, float *pb, const void *dout,
                                            const void *x, const float *weight,
                                            const float *mean, const float *rstd, int64_t rows,
                                            int64_t dim, int bf16) {
    if (!runs_here(dim, bf16)) return 0;
    if (bf16)
        backward_rows_1(dx, pw, pb, dout, x, weight, mean, rstd, rows, dim);
    else
        backward_rows_0(dx, pw, pb, dout, x, weight, mean, rstd, rows, dim);
    return 1;
}
#else
int vh_cpu_k_layernorm_avx512_forward_rows(void *out, float *mean, float *rstd, const void *x,
                                           const float *weight, const float *bias, int64_t rows,
                                           int64_t dim, float eps, int bf16) {
    (void)out, (void)mean, (void)rstd, (void)x, (void)weight, (void)bias, (void)rows, (void)dim;
    (void)eps, (void)bf16;
    return 0;
}

int vh_cpu_k_layernorm_avx512_backward_rows(void *dx, float *pw, float *pb, const void *dout,
                                            const void *x, const float *weight,
                                            const float *mean, const float *rstd, int64_t rows,
                                            int64_t dim, int bf16) {
    (void)dx, (void)pw, (void)pb, (void)dout, (void)x, (void)weight, (void)mean, (void)rstd;
    (void)rows, (void)dim, (void)bf16;
    return 0;
}
#endif
