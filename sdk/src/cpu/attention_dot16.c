/* attention_dot16.c - bf16 attention for heads of 16..96 on the CPU's bf16
 * dot-product instruction (AVX512-BF16 vdpbf16ps: in each f32 lane, the
 * two products of a pair of bf16 values added to the sum), one (sample,
 * head) block at a time on one thread, its scores kept in L2.
 *
 * The numbers are attention16.c's (autocast's): the same roundings at the
 * same places, only the order of the f32 sums differs.
 *   forward:  S = scale Q K^T (f32) -> softmax -> probs, P16 = P in bf16
 *             out = P16 V                        (f32 sums, bf16 out)
 *   backward: dP = dO V^T (f32), dS = P * (dP - rowsum(dP * P)) -> bf16,
 *             dQ += scale dS K, dK += scale dS^T Q, dV += P16^T dO
 *             (each added to dqkv in f32 and rounded once)
 *
 * Why: without AMX, oneDNN's bf16 kernels lose much of their rate on
 * 197 x 197 x 64 matrices, and attention16.c (then one batched matmul per
 * product over the whole call) sent the scores and dS of a call (7 MiB
 * each on T3) through memory between them. Here a block's scores never
 * leave L2 (T3: 160 KiB). Small heads (16, 32) take
 * these blocks too, before attention_small.c's, whose products widen every
 * bf16 operand into f32 FMAs: T1 under AMP on Zen 5 (B 128, N 50, head_dim
 * 16), interleaved runs of `vithost bench --ops`, ms a step, forward 3.7-3.9
 * -> 3.0-3.7, backward 4.8-5.3 -> 3.4-4.0, the step 25.9-28.9 -> 23.4-27.0.
 *
 * A product C (+)= alpha A B reduces over pairs: A is read one 32-bit pair
 * at a time (broadcast; a bf16 row of q, dout, P16 or dS read in place
 * holds its pairs along the row), B as rows of pairs, 16 columns to a
 * vector. B is rebuilt per block in scratch: K and V as [d/2][tokens]
 * (a transpose of 32-bit words: the pairs of one row are one word), and V,
 * K, Q, dO, dS and P16 with rows 2a and 2a+1 interleaved. Odd token counts
 * and the columns past n are zeros in every operand, so the padded pairs
 * add nothing.
 *
 * Taken through attention16.c (asked first by attention.c, before the
 * small-head blocks) where the engine's choice for the batched Q K^T
 * class is native (the bf16 kernels are the faster ones) and oneDNN runs
 * AVX512-BF16 but not AMX (see cpu_has_dot16).
 * VITHOST_CPU_ATTENTION16=onednn keeps attention16.c's oneDNN matmuls
 * (tests and A/B runs); "dot" or unset: these blocks where they apply. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "dnnl_engine.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES)
#define DOT_PATHS 1
#include <immintrin.h>
#else
#define DOT_PATHS 0
#endif

#define MIN_HEAD_DIM 16 /* smaller heads take attention_small.c */
#define MAX_HEAD_DIM 96 /* a product tile is rows x head_dim/16 vectors */

#if DOT_PATHS
#define ALWAYS_INLINE __attribute__((always_inline)) static inline

/* The kernels are built for AVX-512 with BF16; the call's own code (run()
 * below) for the baseline, so that a CPU without them never executes one of
 * their instructions. */
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16")

/* A block's tensors in place (bytes) and its shape. */
typedef struct dblock {
    const char *q, *k, *v, *go;
    char *o, *dq, *dk, *dv;
    char *p; /* its n x n probabilities (forward: written) */
    int64_t ts, ots; /* token strides of qkv and out/dout, bytes */
} dblock;

typedef struct dgeom {
    int64_t n, n2, np; /* tokens, token pairs, tokens padded to 16 */
    int64_t dh;
    vh_dtype pt;
    float scale;
    int overwrite; /* backward: dqkv written (2.6 overwrite), not added to */
    int reg_softmax; /* reg_softmax(): scores_softmax, grad_rows */
} dgeom;

/* C's modes: f32 stored; bf16 stored, added to, or written as added to
 * zeros (y + 0: a -0 product gives +0, the bits of zeroing and adding,
 * without reading C) */
enum { OUT_F32, OUT_BF16, OUT_BF16_ADD, OUT_BF16_ADD0 };

/* The 32-bit word (a bf16 pair) at p, in every lane. */
ALWAYS_INLINE __m512i bcast_pair(const char *p) {
    int32_t w;
    memcpy(&w, p, sizeof w);
    return _mm512_set1_epi32(w);
}

/* To bf16, nearest even, NaN kept quiet: one vcvtneps2bf16 where no lane
 * is subnormal, else the integer steps (vh_avx512_round_bf16_cvt; the
 * steps alone ran T3's B 8 N 197 H 6 head 64 backward 4.6% slower, medians
 * of 100 calls, and T1's forward 9%); and back (vh_avx512_widen_bf16). */
#include "bf16_round_avx512.h"
#include "exp_avx512.h" /* vh_avx512_exp_nonpos */

ALWAYS_INLINE __m512 widen16(const void *p) {
    return vh_avx512_widen_bf16(_mm256_loadu_si256((const __m256i *)p));
}

/* ---- products --------------------------------------------------------------
 * C[R x 16V] (+)= alpha sum over K pairs of A[r][pair] . B[pair][16V]: A's
 * pair (r, k) at A + r * ars + k * aks, B's row of pairs k at B + k * ldb,
 * C's row r at C + r * ldc (bytes); C f32, or bf16 stored or added to. R
 * and V constant after inlining: R x V accumulators in registers. */
ALWAYS_INLINE void tile(int R, int V, int mode, int64_t K, const char *A, int64_t ars,
                        int64_t aks, const char *B, int64_t ldb, char *C, int64_t ldc,
                        float alpha) {
    __m512 acc[8][6];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512i b[6];
#pragma GCC unroll 6
        for (int v = 0; v < V; v++) b[v] = _mm512_loadu_si512(B + k * ldb + 64 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512i a = bcast_pair(A + r * ars + k * aks);
#pragma GCC unroll 6
            for (int v = 0; v < V; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)b[v]);
        }
    }
    const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int v = 0; v < V; v++) {
            __m512 y = _mm512_mul_ps(acc[r][v], al);
            if (mode == OUT_F32) {
                _mm512_storeu_ps(C + r * ldc + 64 * v, y);
            } else {
                char *c = C + r * ldc + 32 * v;
                if (mode == OUT_BF16_ADD) y = _mm512_add_ps(y, widen16(c));
                if (mode == OUT_BF16_ADD0) y = _mm512_add_ps(y, _mm512_setzero_ps());
                _mm256_storeu_si256((__m256i *)c, vh_avx512_round_bf16_cvt(y));
            }
        }
}

/* C (+)= alpha A B over m rows and nv vectors of columns: tiles of RM rows
 * x VM vectors (RM x VM <= 24 accumulators), then the rows left, and the
 * vectors left (fewer than 4: the scores tile by 4, the products with a
 * head's rows take all of them in one tile). */
#define MM_TILE(R, V)                                                                   \
    tile(R, V, mode, K, A + i * ars, ars, aks, B + 64 * c, ldb,                          \
         C + i * ldc + c * (mode == OUT_F32 ? 64 : 32), ldc, alpha)
#define MM_ROWS(R)                                                                      \
    do {                                                                                \
        int64_t c = 0;                                                                  \
        for (; c + VM <= nv; c += VM) MM_TILE(R, VM);                                   \
        if (VM > 3 && nv - c == 3) MM_TILE(R, 3);                                       \
        if (VM > 2 && nv - c == 2) MM_TILE(R, 2);                                       \
        if (VM > 1 && nv - c == 1) MM_TILE(R, 1);                                       \
    } while (0)

ALWAYS_INLINE void mm(int RM, int VM, int mode, int64_t m, int64_t nv, int64_t K,
                      const char *A, int64_t ars, int64_t aks, const char *B, int64_t ldb,
                      char *C, int64_t ldc, float alpha) {
    int64_t i = 0;
    for (; i + RM <= m; i += RM) MM_ROWS(RM);
    switch (m - i) { /* RM constant: the cases past it vanish */
    case 7: if (RM > 7) MM_ROWS(7); break;
    case 6: if (RM > 6) MM_ROWS(6); break;
    case 5: if (RM > 5) MM_ROWS(5); break;
    case 4: if (RM > 4) MM_ROWS(4); break;
    case 3: if (RM > 3) MM_ROWS(3); break;
    case 2: if (RM > 2) MM_ROWS(2); break;
    case 1: if (RM > 1) MM_ROWS(1); break;
    default: break;
    }
}
#undef MM_ROWS
#undef MM_TILE

/* The scores' products: C f32, tiles of 6 rows x 4 vectors. */
ALWAYS_INLINE void mm_scores(int64_t m, int64_t nv, int64_t K, const char *A, int64_t ars,
                             int64_t aks, const char *B, int64_t ldb, char *C, int64_t ldc,
                             float alpha) {
    mm(6, 4, OUT_F32, m, nv, K, A, ars, aks, B, ldb, C, ldc, alpha);
}

/* The products with a head's rows: C bf16 (mode OUT_BF16*), all
 * head_dim/16 vectors in one tile of as many rows as 24 accumulators allow. */
ALWAYS_INLINE void mm_prod(int mode, const dgeom *g, const char *A, int64_t ars, int64_t aks,
                           const char *B, char *C, int64_t ldc, float alpha) {
    const int64_t m = g->n, K = g->n2, ldb = g->dh * 4;
    switch (g->dh / 16) {
    case 1: mm(8, 1, mode, m, 1, K, A, ars, aks, B, ldb, C, ldc, alpha); break;
    case 2: mm(8, 2, mode, m, 2, K, A, ars, aks, B, ldb, C, ldc, alpha); break;
    case 3: mm(8, 3, mode, m, 3, K, A, ars, aks, B, ldb, C, ldc, alpha); break;
    case 4: mm(6, 4, mode, m, 4, K, A, ars, aks, B, ldb, C, ldc, alpha); break;
    case 5: mm(4, 5, mode, m, 5, K, A, ars, aks, B, ldb, C, ldc, alpha); break;
    default: mm(4, 6, mode, m, 6, K, A, ars, aks, B, ldb, C, ldc, alpha); break;
    }
}

/* ---- operands in pairs ------------------------------------------------------ */

/* r[0..16) (16 x 16 32-bit words) transposed in registers: pairs of rows
 * interleaved by 32 then 64 bits within each 128-bit lane, then the lanes
 * gathered across four rows at a time. */
ALWAYS_INLINE void transpose16(__m512i r[16]) {
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* r[4i + c], lane L: rows 4i..4i+3 of column 4L + c */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i a = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);  /* lanes 0, 2 */
        const __m512i b = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);  /* lanes 1, 3 */
        const __m512i e = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
        const __m512i f = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(a, e, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(a, e, 0xdd);
        t[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(b, f, 0xdd);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* dst[d/2][np] (32-bit words) = the pairs of n bf16 rows of dh (ts bytes
 * apart), transposed; columns n..np zero. 16 x 16 words at a time (one
 * word at a time, this was a sixth of the forward). */
ALWAYS_INLINE void pairs_transposed(uint32_t *dst, const char *src, int64_t ts, const dgeom *g) {
    const int64_t words = g->dh / 2;
    for (int64_t j0 = 0; j0 < g->np; j0 += 16)
        for (int64_t p0 = 0; p0 < words; p0 += 16) {
            const int64_t w = words - p0 < 16 ? words - p0 : 16;
            const __mmask16 m = (__mmask16)((1u << w) - 1);
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = j0 + i < g->n ? _mm512_maskz_loadu_epi32(m, src + (j0 + i) * ts + 4 * p0)
                                     : _mm512_setzero_si512();
            transpose16(r);
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++)
                if (c < w) _mm512_storeu_si512(dst + (p0 + c) * g->np + j0, r[c]);
        }
}

/* dst[a][len] (32-bit words) = rows 2a and 2a+1 of n bf16 rows of len
 * (a multiple of 16; ts bytes apart) interleaved, row n (odd n) zero. */
ALWAYS_INLINE void pairs_of_rows(uint32_t *dst, const char *src, int64_t ts, int64_t n,
                                 int64_t len) {
    for (int64_t a = 0; a < (n + 1) / 2; a++) {
        const char *r0 = src + 2 * a * ts, *r1 = r0 + ts;
        for (int64_t c = 0; c < len; c += 16) {
            const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + 2 * c)));
            const __m512i hi = 2 * a + 1 < n
                ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + 2 * c)))
                : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + a * len + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* ---- one block ---------------------------------------------------------------- */

/* Bytes of per-thread work space a block needs (the backward's, the larger). */
static int64_t block_scratch(const dgeom *g) {
    const int64_t words = g->dh / 2 * g->np + 2 * g->n2 * g->np + 3 * g->n2 * g->dh;
    return 4 * words + 4 * g->n * g->np + 2 * 2 * g->n * g->np + 64 * 10;
}

/* Bytes from *at, 64-byte aligned pieces. */
static void *carve(char **at, int64_t bytes) {
    void *p = *at;
    *at += (bytes + 63) & ~(int64_t)63;
    return p;
}

/* A row of exponentials times its inv (1 / their sum: the softmax's last
 * step, taken here rather than in a pass of its own): the f32 probs row
 * (its n values) stored in probs, and rounded into p16 (np values: the
 * padding's zeros too); bf16 probs: p16 itself is the row. */
ALWAYS_INLINE void store_probs_row(char *dst, vh_dtype pt, const float *s, float inv,
                                   uint16_t *p16, int64_t n, int64_t np) {
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t c = 0; c < np; c += 16) {
        const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + c), iv);
        const __m256i h = vh_avx512_round_bf16_cvt(x);
        _mm256_storeu_si256((__m256i *)(p16 + c), h);
        if (c >= n) continue;
        const __mmask16 m = n - c >= 16 ? 0xffff : (__mmask16)((1u << (n - c)) - 1);
        if (pt == VH_DTYPE_F32)
            _mm512_mask_storeu_ps((float *)dst + c, m, x);
        else
            _mm256_mask_storeu_epi16((uint16_t *)dst + c, m, h);
    }
}

/* ---- the forward's scores and softmax in registers -------------------------
 * Where a score row is at most 5 vectors (n <= 80) and the head is 16
 * (T1; reg_softmax below says why only there), R rows
 * of S = scale Q K^T stay in registers through their softmax, and each
 * row's probabilities go from there to probs and P16: mm_scores stored S,
 * the softmax read it twice and wrote it once, and store_probs_row read it
 * again. The same operations in the same order as mm_scores (tile),
 * vh_cpu_attention_softmax_v4 (attention_small_kern.h's softmax_rows:
 * max, exponentials and their sum, 1 / sum) and store_probs_row: the same
 * bits. */

/* attention_small_kern.h's hmax and hsum: the halves folded, then the
 * four lanes in its order. */
ALWAYS_INLINE float hmax16(__m512 x) {
    float a[8];
    _mm256_storeu_ps(a, _mm256_max_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1)));
    const float m0 = a[0] > a[4] ? a[0] : a[4], m1 = a[1] > a[5] ? a[1] : a[5];
    const float m2 = a[2] > a[6] ? a[2] : a[6], m3 = a[3] > a[7] ? a[3] : a[7];
    const float m01 = m0 > m1 ? m0 : m1, m23 = m2 > m3 ? m2 : m3;
    return m01 > m23 ? m01 : m23;
}

ALWAYS_INLINE float hsum16(__m512 x) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    float c[4];
    _mm_storeu_ps(c, _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* Rows i..i+R of the probabilities, NV vectors a row (np = 16 NV). Its
 * products (and grad_rows') are tile's loop written out again: through one
 * helper with tile's 8 x 6 accumulators the backward ran 4.5% slower
 * (ab_calls, T1's shape, both load orders). */
ALWAYS_INLINE void scores_softmax(int R, int NV, const dblock *b, const dgeom *g,
                                  const uint32_t *kp, int64_t i, uint16_t *p16) {
    const int64_t n = g->n, np = g->np, pes = vh_dtype_size(g->pt);
    __m512 acc[8][5];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 5
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    const char *q = b->q + i * b->ts;
    for (int64_t k = 0; k < g->dh / 2; k++) {
        __m512i kv[5];
#pragma GCC unroll 5
        for (int v = 0; v < NV; v++) kv[v] = _mm512_loadu_si512(kp + k * np + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512i a = bcast_pair(q + r * b->ts + 4 * k);
#pragma GCC unroll 5
            for (int v = 0; v < NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)kv[v]);
        }
    }
    /* the columns past n: -inf, so that e^ gives 0; the rows' steps
     * interleaved, each a chain of dependent steps */
    const int64_t last = n - 16 * (NV - 1);
    const __mmask16 in = last >= 16 ? 0xffff : (__mmask16)((1u << last) - 1);
    const __m512 al = _mm512_set1_ps(g->scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 red[8];
    float m[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) red[r] = ninf;
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 x = _mm512_mul_ps(acc[r][v], al);
            if (v == NV - 1) x = _mm512_mask_blend_ps(in, ninf, x);
            acc[r][v] = x;
            red[r] = _mm512_max_ps(x, red[r]);
        }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) m[r] = hmax16(red[r]), red[r] = _mm512_setzero_ps();
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            acc[r][v] = vh_avx512_exp_nonpos(_mm512_sub_ps(acc[r][v], _mm512_set1_ps(m[r])));
            red[r] = _mm512_add_ps(red[r], acc[r][v]);
        }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) m[r] = 1.0f / hsum16(red[r]);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (i + r + 4 < n) { /* as store_probs_row: the row 4 on, for writing */
            char *ahead = b->p + (i + r + 4) * n * pes;
            for (int64_t c = 0; c < n * pes; c += 64) __builtin_prefetch(ahead + c, 1, 3);
        }
        char *prow = b->p + (i + r) * n * pes;
        uint16_t *hrow = p16 + (i + r) * np;
        const __m512 inv = _mm512_set1_ps(m[r]);
#pragma GCC unroll 5
        for (int v = 0; v < NV; v++) {
            const __m512 x = _mm512_mul_ps(acc[r][v], inv);
            const __m256i h = vh_avx512_round_bf16_cvt(x);
            _mm256_storeu_si256((__m256i *)(hrow + 16 * v), h);
            const __mmask16 mk = v == NV - 1 ? in : 0xffff;
            if (g->pt == VH_DTYPE_F32)
                _mm512_mask_storeu_ps((float *)prow + 16 * v, mk, x);
            else
                _mm256_mask_storeu_epi16((uint16_t *)prow + 16 * v, mk, h);
        }
    }
}

/* All n rows, as many at a time as 16 accumulators hold (5 for 3 vectors),
 * then the rows left. */
#define SOFTMAX_ROWS(NV, RM)                                                               \
    do {                                                                                   \
        int64_t i = 0;                                                                     \
        for (; i + (RM) <= n; i += (RM)) scores_softmax((RM), (NV), b, g, kp, i, p16);    \
        for (; i < n; i++) scores_softmax(1, (NV), b, g, kp, i, p16);                     \
    } while (0)

static void scores_softmax_all(const dblock *b, const dgeom *g, const uint32_t *kp,
                               uint16_t *p16) {
    const int64_t n = g->n;
    switch (g->np / 16) {
    case 1: SOFTMAX_ROWS(1, 8); break;
    case 2: SOFTMAX_ROWS(2, 8); break;
    case 3: SOFTMAX_ROWS(3, 5); break;
    case 4: SOFTMAX_ROWS(4, 4); break;
    default: SOFTMAX_ROWS(5, 3); break;
    }
}
#undef SOFTMAX_ROWS

/* Where the rows' softmax (forward) and dS (backward) run in registers:
 * score rows of at most 5 vectors (n <= 80), and heads of 16, whose
 * products are short (8 pairs) next to the softmax's steps. With longer
 * heads the tiles of 5 rows or fewer read K or V^T more often than
 * mm_scores' 6 x 4 and lost more than the passes cost. Zen 5, 2 threads,
 * bench/ab_calls, medians of 200 calls, registers / passes: T1's B 128 N 50
 * H 4 head 16 forward 0.94-0.96, backward 0.91-0.92 (3 runs); head 32 at
 * N 50 forward 1.06-1.08, backward 0.96-0.99, and T2's N 65 head 64
 * forward 1.13-1.24, backward 1.02-1.06 (2-3 runs, before the passes took
 * the one-instruction rounding too). VITHOST_CPU_ATTENTION16_REGS=0 takes
 * the passes, =1 the registers wherever a row fits (tests compare the two;
 * read at each call). */
#define REG_SOFTMAX_MAX_NP 80
#define REG_SOFTMAX_HEAD_DIM 16

static int reg_softmax(int64_t np, int64_t dh) {
#ifndef __OPTIMIZE__
    /* vh_avx512_exp_nonpos's FMAs are the bits of the softmax passes only
     * where GCC contracts them (gelu16.c says the same): not unoptimised */
    (void)np, (void)dh;
    return 0;
#else
    if (np > REG_SOFTMAX_MAX_NP) return 0;
    const char *e = getenv("VITHOST_CPU_ATTENTION16_REGS");
    if (e && strcmp(e, "0") == 0) return 0;
    if (e && strcmp(e, "1") == 0) return 1;
    return dh == REG_SOFTMAX_HEAD_DIM;
#endif
}

__attribute__((noinline)) static void block_forward(const dblock *b, const dgeom *g, char *w) {
    const int64_t n = g->n, np = g->np, dh = g->dh;
    uint32_t *kp = carve(&w, dh / 2 * np * 4), *vr = carve(&w, g->n2 * dh * 4);
    float *s = carve(&w, n * np * 4), *inv = carve(&w, n * 4);
    uint16_t *p16 = carve(&w, n * np * 2);
    const int64_t pes = vh_dtype_size(g->pt);
    pairs_transposed(kp, b->k, b->ts, g);
    if (g->reg_softmax) {
        scores_softmax_all(b, g, kp, p16);
    } else {
        mm_scores(n, np / 16, dh / 2, b->q, b->ts, 4, (const char *)kp, np * 4, (char *)s,
                  np * 4, g->scale);
        vh_cpu_attention_softmax_v4(s, n, np, n, inv);
        for (int64_t i = 0; i < n; i++) {
            if (i + 4 < n) {
                char *ahead = b->p + (i + 4) * n * pes;
                for (int64_t c = 0; c < n * pes; c += 64) __builtin_prefetch(ahead + c, 1, 3);
            }
            store_probs_row(b->p + i * n * pes, g->pt, s + i * np, inv[i], p16 + i * np, n, np);
        }
    }
    pairs_of_rows(vr, b->v, b->ts, n, dh);
    mm_prod(OUT_BF16, g, (const char *)p16, np * 2, 4, (const char *)vr, b->o, b->ots, 1.0f);
}

/* Rows of dS = P * (dP - rowsum(dP * P)) rounded into ds16, and P16 (P as
 * stored, rounded when f32), both np wide with zero padding. */
ALWAYS_INLINE void grad_row(const float *dp, const char *prow, vh_dtype pt, uint16_t *ds16,
                            uint16_t *p16, int64_t n, int64_t np) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < np; c += 16) {
        const __mmask16 m = c >= n ? 0 : n - c >= 16 ? 0xffff : (__mmask16)((1u << (n - c)) - 1);
        const __m512 p = pt == VH_DTYPE_F32
            ? _mm512_maskz_loadu_ps(m, (const float *)prow + c)
            : vh_avx512_widen_bf16(_mm256_maskz_loadu_epi16(m, (const uint16_t *)prow + c));
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(dp + c), p, acc);
    }
    const __m512 rs = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
    for (int64_t c = 0; c < np; c += 16) {
        const __mmask16 m = c >= n ? 0 : n - c >= 16 ? 0xffff : (__mmask16)((1u << (n - c)) - 1);
        __m512 p;
        if (pt == VH_DTYPE_F32) {
            p = _mm512_maskz_loadu_ps(m, (const float *)prow + c);
            _mm256_storeu_si256((__m256i *)(p16 + c), vh_avx512_round_bf16_cvt(p));
        } else {
            const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)prow + c);
            _mm256_storeu_si256((__m256i *)(p16 + c), h);
            p = vh_avx512_widen_bf16(h);
        }
        const __m512 ds = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + c), rs));
        _mm256_storeu_si256((__m256i *)(ds16 + c), vh_avx512_round_bf16_cvt(ds));
    }
}

/* The backward's dP = dO V^T and dS in registers, R rows at a time where a
 * row is at most 5 vectors (as scores_softmax): grad_row's steps on the
 * tile mm_scores would have stored, the same bits (its alpha, 1, leaves
 * every sum as it is: vdpbf16ps gives no signalling NaN to quiet). */
ALWAYS_INLINE void grad_rows(int R, int NV, const dblock *b, const dgeom *g, const uint32_t *vt,
                             int64_t i, uint16_t *ds16, uint16_t *p16) {
    const int64_t n = g->n, np = g->np, pes = vh_dtype_size(g->pt);
    __m512 acc[8][5];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 5
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    const char *go = b->go + i * b->ots;
    for (int64_t k = 0; k < g->dh / 2; k++) {
        __m512i vv[5];
#pragma GCC unroll 5
        for (int v = 0; v < NV; v++) vv[v] = _mm512_loadu_si512(vt + k * np + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512i a = bcast_pair(go + r * b->ots + 4 * k);
#pragma GCC unroll 5
            for (int v = 0; v < NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)vv[v]);
        }
    }
    const int64_t last = n - 16 * (NV - 1);
    const __mmask16 in = last >= 16 ? 0xffff : (__mmask16)((1u << last) - 1);
    __m512 red[8];
    float rs[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) red[r] = _mm512_setzero_ps();
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const char *prow = b->p + (i + r) * n * pes;
            const __mmask16 mk = v == NV - 1 ? in : 0xffff;
            const __m512 p = g->pt == VH_DTYPE_F32
                ? _mm512_maskz_loadu_ps(mk, (const float *)prow + 16 * v)
                : vh_avx512_widen_bf16(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)prow + 16 * v));
            red[r] = _mm512_fmadd_ps(acc[r][v], p, red[r]);
        }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) rs[r] = _mm512_reduce_add_ps(red[r]);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (i + r + 4 < n) { /* as block_backward did: the row 4 on */
            const char *ahead = b->p + (i + r + 4) * n * pes;
            for (int64_t c = 0; c < n * pes; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
        }
        const char *prow = b->p + (i + r) * n * pes;
        const __m512 sr = _mm512_set1_ps(rs[r]);
#pragma GCC unroll 5
        for (int v = 0; v < NV; v++) {
            const __mmask16 mk = v == NV - 1 ? in : 0xffff;
            __m512 p;
            if (g->pt == VH_DTYPE_F32) {
                p = _mm512_maskz_loadu_ps(mk, (const float *)prow + 16 * v);
                _mm256_storeu_si256((__m256i *)(p16 + (i + r) * np + 16 * v),
                                    vh_avx512_round_bf16_cvt(p));
            } else {
                const __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)prow + 16 * v);
                _mm256_storeu_si256((__m256i *)(p16 + (i + r) * np + 16 * v), h);
                p = vh_avx512_widen_bf16(h);
            }
            const __m512 ds = _mm512_mul_ps(p, _mm512_sub_ps(acc[r][v], sr));
            _mm256_storeu_si256((__m256i *)(ds16 + (i + r) * np + 16 * v),
                                vh_avx512_round_bf16_cvt(ds));
        }
    }
}

#define GRAD_ROWS(NV, RM)                                                                  \
    do {                                                                                   \
        int64_t i = 0;                                                                     \
        for (; i + (RM) <= n; i += (RM)) grad_rows((RM), (NV), b, g, vt, i, ds16, p16);   \
        for (; i < n; i++) grad_rows(1, (NV), b, g, vt, i, ds16, p16);                    \
    } while (0)

static void grad_rows_all(const dblock *b, const dgeom *g, const uint32_t *vt, uint16_t *ds16,
                          uint16_t *p16) {
    const int64_t n = g->n;
    switch (g->np / 16) {
    case 1: GRAD_ROWS(1, 8); break;
    case 2: GRAD_ROWS(2, 8); break;
    case 3: GRAD_ROWS(3, 5); break;
    case 4: GRAD_ROWS(4, 4); break;
    default: GRAD_ROWS(5, 3); break;
    }
}
#undef GRAD_ROWS

__attribute__((noinline)) static void block_backward(const dblock *b, const dgeom *g, char *w) {
    const int64_t n = g->n, np = g->np, dh = g->dh, n2 = g->n2;
    uint32_t *vt = carve(&w, dh / 2 * np * 4);
    uint32_t *dsw = carve(&w, n2 * np * 4), *pw = carve(&w, n2 * np * 4);
    uint32_t *kr = carve(&w, n2 * dh * 4), *qr = carve(&w, n2 * dh * 4);
    uint32_t *gr = carve(&w, n2 * dh * 4);
    float *dp = carve(&w, n * np * 4);
    uint16_t *ds16 = carve(&w, n * np * 2), *p16 = carve(&w, n * np * 2);
    const int64_t pes = vh_dtype_size(g->pt);
    pairs_transposed(vt, b->v, b->ts, g);
    if (g->reg_softmax) {
        grad_rows_all(b, g, vt, ds16, p16);
    } else {
        mm_scores(n, np / 16, dh / 2, b->go, b->ots, 4, (const char *)vt, np * 4, (char *)dp,
                  np * 4, 1.0f); /* dP = dO V^T */
        for (int64_t i = 0; i < n; i++) {
            if (i + 4 < n) {
                const char *ahead = b->p + (i + 4) * n * pes;
                for (int64_t c = 0; c < n * pes; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
            }
            grad_row(dp + i * np, b->p + i * n * pes, g->pt, ds16 + i * np, p16 + i * np, n,
                     np);
        }
    }
    pairs_of_rows(dsw, (const char *)ds16, np * 2, n, np);
    pairs_of_rows(pw, (const char *)p16, np * 2, n, np);
    pairs_of_rows(kr, b->k, b->ts, n, dh);
    pairs_of_rows(qr, b->q, b->ts, n, dh);
    pairs_of_rows(gr, b->go, b->ots, n, dh);
    /* dQ += scale dS K: A = dS's rows; dK += scale dS^T Q and dV += P16^T dO:
     * A's row j is column j of dS or P16, its pairs in dsw/pw */
    const int mode = g->overwrite ? OUT_BF16_ADD0 : OUT_BF16_ADD;
    mm_prod(mode, g, (const char *)ds16, np * 2, 4, (const char *)kr, b->dq, b->ts, g->scale);
    mm_prod(mode, g, (const char *)dsw, 4, np * 4, (const char *)qr, b->dk, b->ts, g->scale);
    mm_prod(mode, g, (const char *)pw, 4, np * 4, (const char *)gr, b->dv, b->ts, 1.0f);
}

#pragma GCC pop_options

/* ---- the call ---------------------------------------------------------------- */

/* AVX-512 with BF16 where oneDNN may use it (its effective ISA, capped by
 * ONEDNN_MAX_CPU_ISA), but not AMX: on a Xeon with AMX these blocks (forced)
 * took 41 / 70 ms a step of T3's attention under AMP, forward / backward,
 * attention16.c's tasks on oneDNN's AMX kernels 28 / 41. */
static int cpu_has_dot16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16") &&
           vh_dnnl_isa_has(VH_DNNL_ISA_AVX512_CORE_BF16) &&
           !vh_dnnl_isa_has(VH_DNNL_ISA_AVX512_CORE_AMX);
}

/* VITHOST_CPU_ATTENTION16: unset, "auto" or "dot" (these blocks where they
 * apply), or "onednn" (never); another value is reported once and read as
 * unset. */
static int wanted(void) {
    static int told;
    const char *v = getenv("VITHOST_CPU_ATTENTION16");
    if (!v || !*v || strcmp(v, "auto") == 0 || strcmp(v, "dot") == 0) return 1;
    if (strcmp(v, "onednn") == 0) return 0;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "vithost: VITHOST_CPU_ATTENTION16=%s is not auto, dot or onednn; "
                        "taking auto\n", v);
    return 1;
}

static int applies(const vh_attention_args *a) {
    static int cpu = -1; /* cpu_has_dot16(), once (its value is the same in every thread) */
    if (a->dtype != VH_DTYPE_BF16) return 0;
    if (a->probs_dtype != VH_DTYPE_BF16 && a->probs_dtype != VH_DTYPE_F32) return 0;
    if (a->head_dim % 16 != 0 || a->head_dim < MIN_HEAD_DIM || a->head_dim > MAX_HEAD_DIM)
        return 0;
    int has = __atomic_load_n(&cpu, __ATOMIC_RELAXED);
    if (has < 0) __atomic_store_n(&cpu, has = cpu_has_dot16(), __ATOMIC_RELAXED);
    return has && wanted();
}

static vh_status run(const vh_attention_args *a, int backward) {
    if (!applies(a)) return VH_STATUS_ERR_UNSUPPORTED;
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim, D = H * Dh;
    /* each block writes its head's rows of dq, dk and dv once: with
     * overwrite it stores them, and nothing zeroes dqkv first */
    const dgeom g = {N,        (N + 1) / 2, (N + 15) / 16 * 16, Dh, (vh_dtype)a->probs_dtype,
                     a->scale, backward && a->overwrite,
                     reg_softmax((N + 15) / 16 * 16, Dh)};
    const int64_t ps = vh_dtype_size(g.pt), nblocks = B * H;
    const int head_chunk = vh_cpu_attention_head_chunk(H);
    const int dynamic = vh_cpu_deal_dynamic();
    int64_t next_chunk = 0;
    int failed = 0;
#pragma omp parallel if (nblocks > 1 && nblocks * N * N * Dh > VH_CPU_PAR_ELEMS) \
    reduction(| : failed)
    {
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        char *w = vh_cpu_scratch_alloc((size_t)block_scratch(&g));
        if (!w) failed = 1;
        /* whole samples, a sample's H blocks (vh_cpu_attention_head_chunk
         * says why), the thread's own rows (deal.c) */
        vh_cpu_deal deal;
        vh_cpu_deal_init(&deal, dynamic, &next_chunk, nblocks, head_chunk, 1, nblocks);
        int64_t lo, hi;
        while (w && vh_cpu_deal_take(&deal, &lo, &hi))
            for (int64_t bh = lo; bh < hi; bh++) {
                const int64_t bi = bh / H, h = bh % H;
                const int64_t qo = (bi * a->qkv_batch_stride + h * Dh) * 2;
                const int64_t oo = (bi * a->out_batch_stride + h * Dh) * 2;
                const char *qkv = (const char *)a->qkv + qo;
                dblock blk = {qkv, qkv + D * 2, qkv + 2 * D * 2, NULL, NULL, NULL, NULL, NULL,
                              (char *)a->probs + bh * N * N * ps, a->qkv_token_stride * 2,
                              a->out_token_stride * 2};
                if (backward) {
                    char *dqkv = (char *)a->dqkv + qo;
                    blk.go = (const char *)a->dout + oo;
                    blk.dq = dqkv, blk.dk = dqkv + D * 2, blk.dv = dqkv + 2 * D * 2;
                    block_backward(&blk, &g, w);
                } else {
                    blk.o = (char *)a->out + oo;
                    block_forward(&blk, &g, w);
                }
            }
        vh_cpu_scratch_end(mark);
    }
    return failed ? VH_STATUS_ERR_NOMEM : VH_STATUS_OK;
}
#else
static vh_status run(const vh_attention_args *a, int backward) {
    (void)a, (void)backward;
    return VH_STATUS_ERR_UNSUPPORTED;
}
#endif

int vh_cpu_attention_dot16_applies(const vh_attention_args *a) {
#if DOT_PATHS
    return applies(a);
#else
    (void)a;
    return 0;
#endif
}

vh_status vh_cpu_attention_dot16_forward(const vh_attention_args *a) { return run(a, 0); }

vh_status vh_cpu_attention_dot16_backward(const vh_attention_args *a) { return run(a, 1); }
