/* attention_small_kern.h - the kernels of attention_small.c for one vector
 * width, included there once per ISA (a C template): before it, VW (floats
 * per vector: 16 or 8), VN(name) (name with the ISA's suffix), the tiles
 * SCORE_R x SCORE_V (scores: rows x vectors), PROD_R x PROD_V (the
 * products with the head's rows), ROW_V (the most vectors a score row may
 * have for its softmax to run in registers, at most 5) and SOFTMAX_ACC
 * (accumulators of such a tile: SOFTMAX_ACC / NV rows of NV vectors), and
 * a `#pragma GCC target` the code is built for; it undefines those eight
 * at its end, ready for the next. GCC vectors of VW floats are
 * one register of that ISA (a wider one is split into scalars, not
 * halves). */

typedef float VN(vf) __attribute__((vector_size(VW * 4)));
typedef int32_t VN(vi) __attribute__((vector_size(VW * 4)));
typedef uint32_t VN(vu) __attribute__((vector_size(VW * 4)));
typedef uint16_t VN(vh) __attribute__((vector_size(VW * 2)));
#define VF VN(vf)
#define VI VN(vi)
#define VU VN(vu)
#define VH VN(vh)
/* Lane numbers, for masks by position. */
#if VW == 16
#define LANES {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
#else
#define LANES {0, 1, 2, 3, 4, 5, 6, 7}
#endif
/* Loads and stores through memcpy (macros: a function passing a vector by
 * value would be built for the baseline ABI). */
#define LD(v, p) memcpy(&(v), (p), sizeof(VF))
#define ST(p, v) memcpy((p), &(v), sizeof(VF))

/* Lanes of a vector summed, and their maximum (halves folded). */
ALWAYS_INLINE float VN(hsum)(const VF *x) {
    v8 a;
    memcpy(&a, x, sizeof a);
#if VW == 16
    v8 b;
    memcpy(&b, (const char *)x + sizeof a, sizeof b);
    a += b;
#endif
    v4 c, d;
    memcpy(&c, &a, sizeof c);
    memcpy(&d, (char *)&a + sizeof c, sizeof d);
    c += d;
    return (c[0] + c[2]) + (c[1] + c[3]);
}

ALWAYS_INLINE float VN(hmax)(const VF *x) {
    v8 a;
    memcpy(&a, x, sizeof a);
#if VW == 16
    v8 b;
    memcpy(&b, (const char *)x + sizeof a, sizeof b);
    a = SEL(v8, vi8, a > b, a, b);
#endif
    const float m0 = a[0] > a[4] ? a[0] : a[4], m1 = a[1] > a[5] ? a[1] : a[5];
    const float m2 = a[2] > a[6] ? a[2] : a[6], m3 = a[3] > a[7] ? a[3] : a[7];
    const float m01 = m0 > m1 ? m0 : m1, m23 = m2 > m3 ? m2 : m3;
    return m01 > m23 ? m01 : m23;
}

/* The lanes' maximum of a and b, as a > b ? a : b (b where either is NaN):
 * one vmaxps, where the select took a compare and a blend. */
#if VW == 16
#define VMAX(a, b) ((VF)_mm512_max_ps((__m512)(a), (__m512)(b)))
#else
#define VMAX(a, b) ((VF)_mm256_max_ps((__m256)(a), (__m256)(b)))
#endif

/* e^x in place for x <= 0, -inf and NaN: vh_expf's reduction and
 * polynomial (the same values), without its overflow branch (never taken
 * here). (Vectors by pointer: by value they would take the baseline ABI.)
 * With AVX-512, p 2^n is one vscalefps, zeroing the lanes under e^-86.5
 * by its mask: exact, as the product with 2^n built in the exponent bits
 * (n >= -125, p near 1: the result is normal), so the same bits; the
 * softmax's pass of exponentials took 15-17% less time (Zen 4, rows of 50,
 * 65 and 197). */
ALWAYS_INLINE void VN(exp_nonpos)(VF *px) {
    const VF x = *px, lo = (VF){0} - 86.5f;
#if VW == 16
    const __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, (__m512)lo, _CMP_NLT_UQ);
    const VF xc = VMAX(lo, x); /* NaN stays NaN */
#else
    const VI under = x < lo;
    const VF xc = SEL(VF, VI, under, lo, x);
#endif
    const VF n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const VF r = (xc - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
    VF p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
#if VW == 16
    *px = (VF)_mm512_maskz_scalef_ps(keep, (__m512)p, (__m512)n);
#else
    const VI e = (__builtin_convertvector(n, VI) + 127) << 23; /* 2^n: n >= -125 */
    const VF y = p * (VF)e;
    *px = (VF)((VI)y & ~under); /* below e^-86.5: 0, as vh_expf */
#endif
}

/* VW elements of row i of m from column j (m->cs 1), widened from bf16. */
ALWAYS_INLINE void VN(vget)(VF *v, const mview *m, int64_t i, int64_t j) {
    if (m->bf16) {
        VH h;
        memcpy(&h, (const uint16_t *)m->p + i * m->rs + j, sizeof h);
        const VU u = __builtin_convertvector(h, VU) << 16;
        memcpy(v, &u, sizeof *v);
    } else {
        memcpy(v, (const float *)m->p + i * m->rs + j, sizeof *v);
    }
}

/* The same elements = *y (add: += *y), rounded once to bf16 (to nearest
 * even, NaN kept quiet: vh_cpu_bf16_round's integer steps). */
ALWAYS_INLINE void VN(vput)(const mview *m, int64_t i, int64_t j, const VF *y, int add) {
    VF x = *y, old;
    if (add) {
        VN(vget)(&old, m, i, j);
        x += old;
    }
    if (m->bf16) {
        VU u;
        memcpy(&u, &x, sizeof u);
        const VU nan = (VU)((u & 0x7fffffffu) > 0x7f800000u);
        const VU r = (((u >> 16) | 0x40u) & nan) | (((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & ~nan);
        const VH h = __builtin_convertvector(r, VH);
        memcpy((uint16_t *)m->p + i * m->rs + j, &h, sizeof h);
    } else {
        memcpy((float *)m->p + i * m->rs + j, &x, sizeof x);
    }
}

/* ---- products ---------------------------------------------------------------
 * acc[r][v] = sum over k of A(r, k) B(k, VW v + lane): R (<= 8) rows of A
 * against V (<= 5) vectors of B's columns, in registers (constant R and V
 * after inlining). A is read by element (broadcast one at a time: A^T in
 * place costs the same), B by rows; either f32 or bf16 in place.
 * GCC folds an f32 B vector's load into each row's FMA, so an 8 x 2 tile
 * read B eight times a k step; the empty asm keeps the V vectors in
 * registers where a step has 10 products or more. Zen 4, f32, 2 threads,
 * medians of 200 calls interleaved in one process (both load orders),
 * forward / backward: T2 (N 65, Dh 64) 0.7% / 5% faster, T3 (N 197, Dh 64)
 * 1% / 7%, B=16 N=50 H=12 Dh=64 even / 5%; T1's 2 x 4 score tile (N 50,
 * Dh 16) held its vectors 3% slower, so smaller steps keep the fold. */
ALWAYS_INLINE void VN(tile_acc)(int R, int V, int64_t K, mview A, mview B, VF acc[8][5]) {
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 5
        for (int v = 0; v < V; v++) acc[r][v] = (VF){0};
    for (int64_t k = 0; k < K; k++) {
        VF b[5];
#pragma GCC unroll 5
        for (int v = 0; v < V; v++) {
            VN(vget)(&b[v], &B, k, VW * v);
            if (V > 1 && R * V >= 10) __asm__("" : "+v"(b[v]));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const float ar = mview_get(&A, r, k);
#pragma GCC unroll 5
            for (int v = 0; v < V; v++) acc[r][v] += b[v] * ar;
        }
    }
}

/* C[R x VW*V] (+)= alpha A[R x K] B[K x VW*V], the products of
 * VN(tile_acc); C f32 or bf16 in place (rounded once as stored). add: 0
 * C =, 1 C +=, 2 C = the product + 0 (the bits of adding it to zeros, -0
 * made +0, C never read: ABI 2.6's overwrite). */
ALWAYS_INLINE void VN(tile)(int R, int V, int64_t K, float alpha, mview A, mview B, mview C,
                            int add) {
    VF acc[8][5];
    VN(tile_acc)(R, V, K, A, B, acc);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 5
        for (int v = 0; v < V; v++) {
            VF y = acc[r][v] * alpha;
            if (add == 2) y += 0.0f;
            VN(vput)(&C, r, VW * v, &y, add == 1);
        }
}

/* R rows of C, all n columns: tiles of VM vectors, then the rest. */
ALWAYS_INLINE void VN(tile_row)(int R, int VM, int64_t n, int64_t K, float alpha, mview A,
                                mview B, mview C, int add) {
    int64_t c = 0;
    for (; c + VW * VM <= n; c += VW * VM)
        VN(tile)(R, VM, K, alpha, A, mview_at(B, 0, c), mview_at(C, 0, c), add);
    const int64_t rest = (n - c) / VW;
    const mview Bc = mview_at(B, 0, c), Cc = mview_at(C, 0, c);
    if (VM > 3 && rest == 3) VN(tile)(R, 3, K, alpha, A, Bc, Cc, add);
    if (VM > 2 && rest == 2) VN(tile)(R, 2, K, alpha, A, Bc, Cc, add);
    if (VM > 1 && rest == 1) VN(tile)(R, 1, K, alpha, A, Bc, Cc, add);
}

/* C[m x n] (+)= alpha A[m x K] B[K x n], n a multiple of VW: row tiles of
 * RM, then of 4, then single rows. */
ALWAYS_INLINE void VN(mm)(int RM, int VM, int64_t m, int64_t n, int64_t K, float alpha,
                          mview A, mview B, mview C, int add) {
    int64_t i = 0;
    for (; i + RM <= m; i += RM)
        VN(tile_row)(RM, VM, n, K, alpha, mview_at(A, i, 0), B, mview_at(C, i, 0), add);
    if (RM > 4)
        for (; i + 4 <= m; i += 4)
            VN(tile_row)(4, VM, n, K, alpha, mview_at(A, i, 0), B, mview_at(C, i, 0), add);
    for (; i < m; i++)
        VN(tile_row)(1, VM, n, K, alpha, mview_at(A, i, 0), B, mview_at(C, i, 0), add);
}

/* VN(mm)'s tiles, column blocks outer: each block of B's columns (K rows
 * of VW * VM) is read by every row tile in turn while it is in L1, where
 * VN(mm) reads all of B again for each row tile (the scores' B, K^T or
 * V^T in scratch, is dh x np: 53 KiB for T3, past Zen 5's 48 KiB L1). Each
 * element is the same tile's, so the same bits. For the score products
 * (rows past the registers' softmax: N > 80 on AVX-512); Zen 5, f32, 2
 * threads, bench/ab_calls both load orders, B/A medians of 40-60 calls,
 * forward / backward: T3 (B 8 N 197 H 6 Dh 64) 0.950-0.957 / 0.969-0.973;
 * B 2 N 577 H 6 Dh 64 0.93-0.99 / 0.98-0.99; B 16 N 197 H 12 Dh 32
 * 0.95-0.96 / 0.97-0.98; B 8 N 101 H 6 Dh 64 even; on AVX2 (T1's N 50)
 * 0.99 / 0.97-0.98. In T3's fp32 step (bench/ab_libs.sh, 4 pairs of
 * `vithost bench --ops`, ms a step) the forward ran even (18.7-19.9 both)
 * and the backward 30.2-31.0 against 30.9-32.2. For P V and the gradients,
 * whose B is a head's rows in place, it was 0.5-2% slower: they keep
 * VN(mm). */
ALWAYS_INLINE void VN(mm_cols)(int RM, int VM, int64_t m, int64_t n, int64_t K, float alpha,
                               mview A, mview B, mview C, int add) {
    int64_t c = 0;
    for (; c + VW * VM <= n; c += VW * VM)
        VN(mm)(RM, VM, m, VW * VM, K, alpha, A, mview_at(B, 0, c), mview_at(C, 0, c), add);
    if (c < n) VN(mm)(RM, VM, m, n - c, K, alpha, A, mview_at(B, 0, c), mview_at(C, 0, c), add);
}

/* ---- rows of the softmax ----------------------------------------------------
 * Softmax of R score rows (ld apart) of n values in place, padded to np
 * (the padding becomes 0); NaN in, NaN out. R rows at a time: each row is a
 * chain of two horizontal reductions and a division, and interleaving rows
 * overlaps the chains (one row at a time, the softmax was 45% of the
 * forward). inv not NULL: the rows are left as their exponentials, each
 * row's 1 / sum in inv[r], for a caller whose next pass over the rows
 * multiplies (the same product, one pass fewer). */
ALWAYS_INLINE void VN(softmax_rows)(int R, float *s, int64_t ld, int64_t n, int64_t np,
                                    float *inv) {
    const VI lane = LANES;
    const VF ninf = (VF){0} - INFINITY;
    VF acc[4];
    float m[4];
    for (int r = 0; r < R; r++) acc[r] = ninf;
    for (int64_t c = 0; c < np; c += VW)
        for (int r = 0; r < R; r++) {
            VF x;
            LD(x, s + r * ld + c);
            if (c + VW > n) { /* the columns past n: -inf, so that e^ gives 0 */
                x = SEL(VF, VI, lane < (VI){0} + (int32_t)(n - c), x, ninf);
                ST(s + r * ld + c, x);
            }
            acc[r] = VMAX(x, acc[r]);
        }
    for (int r = 0; r < R; r++) m[r] = VN(hmax)(&acc[r]), acc[r] = (VF){0};
    for (int64_t c = 0; c < np; c += VW)
        for (int r = 0; r < R; r++) {
            VF x;
            LD(x, s + r * ld + c);
            x -= m[r];
            VN(exp_nonpos)(&x);
            ST(s + r * ld + c, x);
            acc[r] += x;
        }
    for (int r = 0; r < R; r++) m[r] = 1.0f / VN(hsum)(&acc[r]);
    if (inv) {
        for (int r = 0; r < R; r++) inv[r] = m[r];
        return;
    }
    for (int64_t c = 0; c < np; c += VW)
        for (int r = 0; r < R; r++) {
            VF x;
            LD(x, s + r * ld + c);
            x *= m[r];
            ST(s + r * ld + c, x);
        }
}

/* Scores and their softmax for R (<= 8) rows at once, each row whole in NV
 * registers (np = NV * VW): S = alpha A B as VN(tile) computes it, then
 * VN(softmax_rows)' steps on the registers. A score row is stored once (to
 * s, ld apart, for P V) where the two passes stored it three times and read
 * it four, and f32 probabilities go from the registers to probs (n apart,
 * the last vector masked) where store_probs copied them from s (probs NULL:
 * the caller stores them). The same values, in the same order, as
 * VN(tile), VN(softmax_rows) and store_probs. */
ALWAYS_INLINE void VN(scores_softmax)(int R, int NV, int64_t K, float alpha, mview A, mview B,
                                      float *s, int64_t ld, int64_t n, float *probs) {
    const VI lane = LANES;
    const VF ninf = (VF){0} - INFINITY;
    VF acc[8][5], red[8];
    float m[8];
    VN(tile_acc)(R, NV, K, A, B, acc);
    const int32_t last = (int32_t)(n - VW * (NV - 1)); /* columns in the last vector */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) red[r] = ninf;
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            VF x = acc[r][v] * alpha;
            if (v == NV - 1) x = SEL(VF, VI, lane < (VI){0} + last, x, ninf);
            acc[r][v] = x;
            red[r] = VMAX(x, red[r]);
        }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) m[r] = VN(hmax)(&red[r]), red[r] = (VF){0};
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            VF x = acc[r][v] - m[r];
            VN(exp_nonpos)(&x);
            acc[r][v] = x;
            red[r] += x;
        }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) m[r] = 1.0f / VN(hsum)(&red[r]);
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const VF x = acc[r][v] * m[r];
            ST(s + r * ld + VW * v, x);
            if (!probs) continue;
            float *dst = probs + r * n + VW * v;
            if (v < NV - 1) {
                ST(dst, x);
            } else {
#if VW == 16
                _mm512_mask_storeu_ps(dst, (__mmask16)((1u << last) - 1u), (__m512)x);
#else
                _mm256_maskstore_ps(dst, (__m256i)(lane < (VI){0} + last), (__m256)x);
#endif
            }
        }
}

/* Scores and softmax of all n rows (np = NV * VW), SOFTMAX_ACC / NV rows at a time. */
ALWAYS_INLINE void VN(scores_softmax_all)(int NV, const mview *q, const mview *kt, const geom *g,
                                          float *s, float *probs) {
    const int64_t n = g->n, np = g->np;
    int64_t i = 0;
#define SCORES_SOFTMAX(R)                                                                   \
    for (; i + (R) <= n; i += (R))                                                          \
        VN(scores_softmax)((R), NV, g->dh, g->scale, mview_at(*q, i, 0), *kt, s + i * np, np, \
                           n, probs ? probs + i * n : NULL);
    if (SOFTMAX_ACC / NV >= 8) SCORES_SOFTMAX(8)
    if (SOFTMAX_ACC / NV >= 4) SCORES_SOFTMAX(4)
    if (SOFTMAX_ACC / NV >= 2) SCORES_SOFTMAX(2)
    SCORES_SOFTMAX(1)
#undef SCORES_SOFTMAX
}

/* dS = P * (dP - rowsum(dP * P)) in place of a dP row (padding of P is 0).
 * (Here rows interleaved were slower: no division in the chain.) */
ALWAYS_INLINE void VN(softmax_grad_row)(float *ds, const float *p, int64_t np) {
    VF acc = {0};
    for (int64_t c = 0; c < np; c += VW) {
        VF d, q;
        LD(d, ds + c);
        LD(q, p + c);
        acc += d * q;
    }
    const float rs = VN(hsum)(&acc);
    for (int64_t c = 0; c < np; c += VW) {
        VF d, q;
        LD(d, ds + c);
        LD(q, p + c);
        d = q * (d - rs);
        ST(ds + c, d);
    }
}

/* dS = P * (dP - rowsum(dP * P)) for R rows at once, dP = A B (A: dO, B:
 * V^T) whole in NV registers a row (np = NV * VW), as VN(tile) and
 * VN(softmax_grad_row) compute it (the same values), stored once to ds (ld
 * apart). P's rows are pn apart: the probabilities in place (f32, pn = n;
 * the last vector of a row read masked, as the last row ends where the
 * tensor does) or rows widened into scratch (pn = np, padded with 0). */
ALWAYS_INLINE void VN(softmax_grad)(int R, int NV, int64_t K, mview A, mview B, const float *p,
                                    int64_t pn, float *ds, int64_t ld, int64_t n) {
    VF acc[8][5], red[8];
    float rs[8];
    VN(tile_acc)(R, NV, K, A, B, acc);
    VF q[8][5];
    const int32_t last = (int32_t)(n - VW * (NV - 1));
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) red[r] = (VF){0};
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const float *src = p + r * pn + VW * v;
            if (v < NV - 1 || pn != n) {
                LD(q[r][v], src);
            } else {
#if VW == 16
                q[r][v] = (VF)_mm512_maskz_loadu_ps((__mmask16)((1u << last) - 1u), src);
#else
                const VI lane = LANES;
                q[r][v] = (VF)_mm256_maskload_ps(src, (__m256i)(lane < (VI){0} + last));
#endif
            }
            red[r] += acc[r][v] * q[r][v];
        }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) rs[r] = VN(hsum)(&red[r]);
#pragma GCC unroll 5
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const VF d = q[r][v] * (acc[r][v] - rs[r]);
            ST(ds + r * ld + VW * v, d);
        }
}

/* dS of all n rows (np = NV * VW), SOFTMAX_ACC / NV rows at a time. */
ALWAYS_INLINE void VN(softmax_grad_all)(int NV, const mview *go, const mview *vt, const geom *g,
                                        const float *p, int64_t pn, float *ds) {
    const int64_t n = g->n, np = g->np;
    int64_t i = 0;
#define SOFTMAX_GRAD(R)                                                                     \
    for (; i + (R) <= n; i += (R))                                                          \
        VN(softmax_grad)((R), NV, g->dh, mview_at(*go, i, 0), *vt, p + i * pn, pn, ds + i * np, \
                         np, n);
    if (SOFTMAX_ACC / NV >= 8) SOFTMAX_GRAD(8)
    if (SOFTMAX_ACC / NV >= 4) SOFTMAX_GRAD(4)
    if (SOFTMAX_ACC / NV >= 2) SOFTMAX_GRAD(2)
    SOFTMAX_GRAD(1)
#undef SOFTMAX_GRAD
}

/* ---- one block -------------------------------------------------------------- */

/* The n rows of q, k, v or dout (src, ts bytes apart): in place when
 * direct (f32 or bf16 rows of whole vectors, bf16 as bf), else widened into
 * buf (f32 rows of dp). */
ALWAYS_INLINE mview VN(rows)(float *buf, const char *src, int64_t ts, const geom *g, int direct,
                             int bf) {
    if (direct) {
        const mview m = {(void *)(uintptr_t)src, ts / (bf ? 2 : 4), 1, bf};
        return m;
    }
    for (int64_t t = 0; t < g->n; t++)
        load_row(buf + t * g->dp, src + t * ts, g->t, g->dh, g->dp, VW);
    const mview m = {buf, g->dp, 1, 0};
    return m;
}

/* One round of a VW x VW transpose in registers: swaps bit s of the row
 * index with bit s of the lane, between rows r and r + s. */
#define TR_LO(s, L) ((L) & (s) ? VW + (L) - (s) : (L))
#define TR_HI(s, L) ((L) & (s) ? VW + (L) : (L) + (s))
#if VW == 16
#define TR_MASK(F, s)                                                                       \
    {F(s, 0), F(s, 1), F(s, 2), F(s, 3), F(s, 4), F(s, 5), F(s, 6), F(s, 7), F(s, 8),      \
     F(s, 9), F(s, 10), F(s, 11), F(s, 12), F(s, 13), F(s, 14), F(s, 15)}
#else
#define TR_MASK(F, s) {F(s, 0), F(s, 1), F(s, 2), F(s, 3), F(s, 4), F(s, 5), F(s, 6), F(s, 7)}
#endif
#define TR_ROUND(x, s)                                                                      \
    _Pragma("GCC unroll 16") for (int r = 0; r < VW; r++) if (!(r & (s))) {                 \
        const VI lo = TR_MASK(TR_LO, s), hi = TR_MASK(TR_HI, s);                            \
        const VF a = __builtin_shuffle(x[r], x[r + (s)], lo);                               \
        x[r + (s)] = __builtin_shuffle(x[r], x[r + (s)], hi);                               \
        x[r] = a;                                                                           \
    }

/* dst (dh rows of np) = src^T (n rows), columns n..np zero: VW x VW
 * blocks transposed in registers (the scalar copy was a tenth of the
 * block's time). */
ALWAYS_INLINE void VN(transpose)(float *dst, const mview *src, const geom *g) {
    const int64_t n = g->n, np = g->np;
    for (int64_t t0 = 0; t0 < np; t0 += VW)
        for (int64_t c0 = 0; c0 < g->dh; c0 += VW) {
            VF x[VW];
#pragma GCC unroll 16
            for (int r = 0; r < VW; r++) {
                x[r] = (VF){0};
                if (t0 + r < n) VN(vget)(&x[r], src, t0 + r, c0);
            }
            TR_ROUND(x, 1)
            TR_ROUND(x, 2)
            TR_ROUND(x, 4)
#if VW == 16
            TR_ROUND(x, 8)
#endif
#pragma GCC unroll 16
            for (int c = 0; c < VW; c++)
                if (c0 + c < g->dh) ST(dst + (c0 + c) * np + t0, x[c]);
        }
}
#undef TR_LO
#undef TR_HI
#undef TR_MASK
#undef TR_ROUND

/* The n x n f32 probabilities of a block from s (rows np apart) to dst
 * (dense), with non-temporal stores from dst's first whole vector to its
 * last (a vector there may hold the end of one row and the start of the
 * next); ordinary stores before and after. n >= VW (a vector spans at most
 * two rows). The caller fences (vh_cpu_stream_fence) before another thread
 * may read dst. */
ALWAYS_INLINE void VN(stream_probs)(float *dst, const float *s, int64_t n, int64_t np) {
    const int64_t total = n * n;
    const int64_t lead = (int64_t)((-(uintptr_t)dst & (VW * 4 - 1)) / 4); /* dst: 4-aligned */
    int64_t d = 0;
    for (; d < lead && d < total; d++) dst[d] = s[d / n * np + d % n];
    const VI lane = LANES;
    int64_t i = d / n, j = d % n;
    for (; d + VW <= total; d += VW) {
        VF x;
        LD(x, s + i * np + j);
        if (j + VW > n) { /* lanes n - j on: row i + 1 from its column 0 */
            VF y;
            LD(y, s + (i + 1) * np - (n - j));
            x = SEL(VF, VI, lane < (VI){0} + (int32_t)(n - j), x, y);
            i++, j += VW - n;
        } else if ((j += VW) == n) {
            i++, j = 0;
        }
#if VW == 16
        _mm512_stream_ps(dst + d, (__m512)x);
#else
        _mm256_stream_ps(dst + d, (__m256)x);
#endif
    }
    for (; d < total; d++) dst[d] = s[d / n * np + d % n];
}

/* The block's probabilities from s (rows np apart) to probs: streamed
 * (g->stream_probs: f32, n >= VW, rows past the registers' softmax), else
 * row by row as store_probs rounds them (s made what was stored). */
ALWAYS_INLINE void VN(put_probs)(const block *b, const geom *g, float *s) {
    const int64_t n = g->n, np = g->np, pes = vh_dtype_size(g->pt);
    if (g->stream_probs) {
        VN(stream_probs)(b->p, s, n, np);
        return;
    }
    for (int64_t i = 0; i < n; i++) store_probs((char *)b->p + i * n * pes, g->pt, s + i * np, n);
}

/* Forward of one block: P = softmax(scale Q K^T) into probs, out = P V.
 * bf: qkv and out bf16, read and written in place (constant: a copy of the
 * kernels each; widening rows once into f32 first was no faster at N 49
 * and 10% slower at N 16). */
ALWAYS_INLINE void VN(forward_t)(const block *b, const geom *g, float *w, int bf) {
    const int64_t n = g->n, np = g->np, dp = g->dp;
    const int direct = bf || g->direct;
    float *qb = w, *vb = qb + n * dp, *o = vb + n * dp, *kt = o + n * dp, *s = kt + g->dh * np;
    prefetch_rows(b->q, b->v, b->ts, n, g->dh * vh_dtype_size(g->t));
    const mview q = VN(rows)(qb, b->q, b->ts, g, direct, bf);
    const mview k = VN(rows)(o, b->k, b->ts, g, direct, bf); /* o: not used yet */
    VN(transpose)(kt, &k, g);
    const mview v = VN(rows)(vb, b->v, b->ts, g, direct, bf);
    const mview ktv = {kt, np, 1, 0}, sv = {s, np, 1, 0}, ov = {o, dp, 1, 0};
    int64_t i = 0;
    if (np <= VW * ROW_V) { /* a score row fits in registers */
        float *pf = g->pt == VH_DTYPE_F32 ? b->p : NULL;
        switch (np / VW) {
        case 1: VN(scores_softmax_all)(1, &q, &ktv, g, s, pf); break;
        case 2: VN(scores_softmax_all)(2, &q, &ktv, g, s, pf); break;
#if ROW_V > 2
        case 3: VN(scores_softmax_all)(3, &q, &ktv, g, s, pf); break;
        case 4: VN(scores_softmax_all)(4, &q, &ktv, g, s, pf); break;
        case 5: VN(scores_softmax_all)(5, &q, &ktv, g, s, pf); break;
#endif
        }
        if (!pf) VN(put_probs)(b, g, s);
    } else {
        VN(mm_cols)(SCORE_R, SCORE_V, n, np, g->dh, g->scale, q, ktv, sv, 0);
        for (; i + 4 <= n; i += 4) VN(softmax_rows)(4, s + i * np, np, n, np, NULL);
        for (; i < n; i++) VN(softmax_rows)(1, s + i * np, np, n, np, NULL);
        VN(put_probs)(b, g, s);
    }
    if (direct) { /* straight into out */
        const mview out = {b->o, b->ots / (bf ? 2 : 4), 1, bf};
        VN(mm)(PROD_R, PROD_V, n, dp, n, 1.0f, sv, v, out, 0);
    } else {
        VN(mm)(PROD_R, PROD_V, n, dp, n, 1.0f, sv, v, ov, 0);
        scatter(b->o, b->ots, o, g, 0);
    }
}

/* dst += alpha A B, dst rows of dqkv (ts bytes apart): added in place
 * (direct), else through x. */
ALWAYS_INLINE void VN(grad)(char *dst, int64_t ts, const geom *g, int direct, int bf,
                            float alpha, mview A, mview B, float *x) {
    const int64_t n = g->n, dp = g->dp;
    if (direct) {
        const mview d = {dst, ts / (bf ? 2 : 4), 1, bf};
        VN(mm)(PROD_R, PROD_V, n, dp, n, alpha, A, B, d, g->overwrite ? 2 : 1);
    } else {
        const mview xv = {x, dp, 1, 0};
        VN(mm)(PROD_R, PROD_V, n, dp, n, alpha, A, B, xv, 0);
        scatter(dst, ts, x, g, 1);
    }
}

/* Backward of one block (dq, dk, dv +=); bf as in forward_t. */
ALWAYS_INLINE void VN(backward_t)(const block *b, const geom *g, float *w, int bf) {
    const int64_t n = g->n, np = g->np, dp = g->dp, pes = vh_dtype_size(g->pt);
    const int direct = bf || g->direct;
    float *qb = w, *kb = qb + n * dp, *gb = kb + n * dp, *x = gb + n * dp, *vt = x + n * dp;
    float *pw = vt + g->dh * np, *ds = pw + n * np;
    const mview q = VN(rows)(qb, b->q, b->ts, g, direct, bf);
    const mview k = VN(rows)(kb, b->k, b->ts, g, direct, bf);
    const mview v = VN(rows)(x, b->v, b->ts, g, direct, bf); /* x: not used yet */
    VN(transpose)(vt, &v, g);
    const mview go = VN(rows)(gb, b->go, b->ots, g, direct, bf);
    const mview vtv = {vt, np, 1, 0}, dsv = {ds, np, 1, 0}, dst = {ds, 1, np, 0};
    /* f32 probabilities are read in place, others widened into pw */
    const int pf = g->pt == VH_DTYPE_F32 && np <= VW * ROW_V;
    const int64_t pn = pf ? n : np;
    const float *p = pf ? (const float *)b->p : pw;
    if (!pf)
        for (int64_t t = 0; t < n; t++)
            load_row(pw + t * np, (const char *)b->p + t * n * pes, g->pt, n, np, VW);
    const mview pt = {(void *)(uintptr_t)p, 1, pn, 0};
    if (np <= VW * ROW_V) { /* dP = dO V^T, a row in registers, and dS */
        switch (np / VW) {
        case 1: VN(softmax_grad_all)(1, &go, &vtv, g, p, pn, ds); break;
        case 2: VN(softmax_grad_all)(2, &go, &vtv, g, p, pn, ds); break;
#if ROW_V > 2
        case 3: VN(softmax_grad_all)(3, &go, &vtv, g, p, pn, ds); break;
        case 4: VN(softmax_grad_all)(4, &go, &vtv, g, p, pn, ds); break;
        case 5: VN(softmax_grad_all)(5, &go, &vtv, g, p, pn, ds); break;
#endif
        }
    } else {
        VN(mm_cols)(SCORE_R, SCORE_V, n, np, g->dh, 1.0f, go, vtv, dsv, 0); /* dP = dO V^T */
        for (int64_t i = 0; i < n; i++) VN(softmax_grad_row)(ds + i * np, pw + i * np, np);
    }
    VN(grad)(b->dv, b->ts, g, direct, bf, 1.0f, pt, go, x);      /* dV += P^T dO */
    VN(grad)(b->dq, b->ts, g, direct, bf, g->scale, dsv, k, x);  /* dQ += scale dS K */
    VN(grad)(b->dk, b->ts, g, direct, bf, g->scale, dst, q, x);  /* dK += scale dS^T Q */
}

static void VN(forward)(const block *b, const geom *g, float *w) {
    if (g->direct && g->t == VH_DTYPE_BF16)
        VN(forward_t)(b, g, w, 1);
    else
        VN(forward_t)(b, g, w, 0);
}

static void VN(backward)(const block *b, const geom *g, float *w) {
    if (g->direct && g->t == VH_DTYPE_BF16)
        VN(backward_t)(b, g, w, 1);
    else
        VN(backward_t)(b, g, w, 0);
}

#undef LD
#undef ST
#undef LANES
#undef VMAX
#undef VF
#undef VI
#undef VU
#undef VH
#undef VW
#undef VN
#undef SCORE_R
#undef SCORE_V
#undef PROD_R
#undef PROD_V
#undef SOFTMAX_ACC
#undef ROW_V
