/* attention_small.c - attention for small heads (head_dim 8..32, a multiple
 * of 8; f32 up to 64 on AVX-512), one (sample, head) block at a time on one
 * thread.
 *
 *   forward:  S = scale Q K^T, P = softmax rows (rounded once to
 *             probs_dtype, and used as stored), O = P V
 *   backward: dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
 *             dV += P^T dO, dQ += scale dS K, dK += scale dS^T Q
 *
 * Every product of a block runs on a register-tiled kernel while the block
 * stays in L1/L2: against the batched oneDNN matmuls this skips oneDNN's
 * per-block cost on tiny matrices (T1: 512 blocks of 50 x 50 x 16 per
 * call) and the trips of the scores through memory. The rows of q, k, v,
 * out, dout and dqkv are read and written in place, f32 or bf16 (widened
 * in registers, rounded once as stored; dqkv added to as stored): no
 * whole-tensor conversion for AMP. Other rows (f16, or a head that is not
 * a whole number of vectors) are widened into scratch and scattered back.
 * In scratch: K^T or V^T and the scores, rows of n tokens padded to np (a
 * multiple of the vector width; the padding of a score row is -inf before
 * the softmax, e^-inf = 0), so every vector is whole.
 *
 * bf16 heads of 16 and 32 come here only where attention_dot16.c's blocks
 * do not apply (no AVX512-BF16, or the engine's choice is widen): those run
 * the products on bf16 dot products, where these widen into f32 FMAs.
 *
 * The kernels (attention_small_kern.h) are written once on GCC vectors and
 * built twice: AVX-512 with 16 floats (a head_dim-16 row is one zmm) and
 * AVX2 with 8, picked at run time. The baseline x86-64 build has no small
 * path: oneDNN's batched matmuls (attention.c) are faster there.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "dnnl_engine.h"

#if defined(__x86_64__)
#include <immintrin.h> /* masked stores of the last vector of a row */
#endif

/* Largest head for the small path, AVX-512 and AVX2. Measured on Zen 5
 * (AVX-512), one thread, best of 180 calls, ms per call, forward /
 * backward, these kernels against the former fused blocks (8-float
 * vectors; bf16 qkv, dout and dqkv widened whole):
 *   B=128 N=49 H=4 Dh=16 (main job)  f32   1.07 / 1.32  against  2.76 / 2.10
 *                                    bf16  1.11 / 1.35  against  2.79 / 2.24
 *   B=128 N=50 H=4 Dh=16 (T1)        f32   1.09 / 1.33  against  2.75 / 2.10
 *                                    bf16  1.16 / 1.44  against  2.97 / 2.57
 *   B=128 N=16 H=8 Dh=16 (long)      f32   0.30 / 0.33  against  1.04 / 0.50
 * and against oneDNN's batched matmuls, where heads of 24 and 32 went:
 *   B=128 N=50  H=4 Dh=24            f32   1.68 / 2.54  against  2.98 / 3.20
 *   B=128 N=50  H=4 Dh=32            f32   2.04 / 3.66  against  3.43 / 4.33
 *   B=64  N=65  H=6 Dh=32            f32   2.18 / 3.53  against  3.48 / 4.09
 *   B=128 N=197 H=6 Dh=32            f32   35.1 / 52.7  against  49.8 / 94.1
 * The backward is bound by its FMAs (four N x N x Dh products, one padded
 * to np): 16-float vectors halve their count, so it gains less than the
 * forward, whose softmax and copies shrank too. In a training step (two
 * threads) both move close to memory's rate: the call streams qkv, probs
 * and dout and adds into dqkv. AVX2 stays at 16 as the former blocks, which
 * lost to oneDNN at Dh=32 on Zen 3 (B=64 N=65 H=6: 7.7 / 11.7 against
 * 6.6 / 9.6). Not measured on an AVX2-only CPU; on Zen 5, B=16 N=49 in
 * cache, its kernels ran 0.21 / 0.24 ms against the former's 0.34 / 0.23
 * in f32, 0.22 / 0.25 against 0.35 / 0.26 in bf16. */
#define FUSED_MAX_HEAD_DIM 32
#define FUSED_MAX_HEAD_DIM_AVX2 16

/* f32 heads up to 64 on AVX-512 too: there the blocks beat oneDNN's f32
 * batched matmuls in the batch-second layout, and match them in the
 * batch-first one. In a training step (Zen 5, 2 threads, attention ms a
 * step, forward + backward): T2 batch-second 83-86 -> 55-61 (the step
 * 7-11% faster), T3 batch-first 76-98 -> 69-77; T2 batch-first even within
 * the runs' spread. Per call, batch-second, data out of cache, mean ms,
 * forward / backward, these kernels against attention.c:
 *   B=64 N=65  H=3  Dh=64 (T2)     1.50 / 2.68-2.92  against  2.16-2.31 / 3.72-3.79
 *   B=8  N=197 H=6  Dh=64 (T3)     2.26-2.38 / 3.91-4.15  against  2.51-2.88 / 4.01-4.68
 *   B=16 N=50  H=12 Dh=64          1.00-1.11 / 1.86-2.22  against  1.57-1.62 / 2.56-2.63
 *   B=2  N=577 H=6  Dh=64          3.75-3.82 / 6.77-6.95  against  3.81-3.84 / 8.26-8.42
 *   B=8  N=197 H=8  Dh=48          even, within the runs' spread
 * bf16 at Dh 64 stays on attention16.c's bf16 kernels: these were slower
 * there (T3: backward 3.4-3.8 ms against 2.4-2.6). */
#define FUSED_MAX_HEAD_DIM_F32 64

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES)
#define SMALL_PATHS 1
#else
#define SMALL_PATHS 0
#endif

#define ALWAYS_INLINE __attribute__((always_inline)) static inline

/* ---- one block -------------------------------------------------------------- */

/* A block's rows in the caller's tensors (bytes), and the shapes. */
typedef struct block {
    const char *q, *k, *v; /* token 0 of the head's q, k, v */
    const char *go;        /* dout (backward) */
    char *o;               /* out (forward) */
    char *dq, *dk, *dv;    /* dqkv (backward) */
    void *p;               /* its n x n probabilities, dense */
    int64_t ts, ots;       /* token strides of qkv and out/dout, bytes */
} block;

typedef struct geom {
    int64_t n, dh, np, dp; /* tokens, head_dim, both padded to the vector width */
    vh_dtype t, pt;        /* qkv/out dtype, probs dtype */
    float scale;
    /* Rows read and written in place (else widened into f32 rows and
     * scattered back): f32 of whole vectors, and bf16 on AVX-512 (on AVX2
     * the bf16 backward in place was 40% slower). */
    int direct;
    /* backward writes dq, dk, dv in place (ABI 2.6's overwrite; direct
     * only: the scattered rows zero dqkv first and add) */
    int overwrite;
    /* forward writes f32 probabilities past the caches (stream_probs) */
    int stream_probs;
} geom;

/* A matrix operand in place: element (i, j) at p[i * rs + j * cs], f32 or
 * bf16 (widened as read; rounded once as written). */
typedef struct mview {
    void *p;
    int64_t rs, cs;
    int bf16;
} mview;

typedef void (*block_fn)(const block *b, const geom *g, float *w);

/* The kernels of a call: forward, backward, and their vector width. */
typedef struct kernels {
    block_fn forward, backward;
    int w;
    /* asks the rows a block reads into L2 ahead of it */
    void (*prefetch)(const block *b, const geom *g, int backward);
    int reg_row; /* the longest score row (padded) whose softmax runs in registers */
} kernels;

/* Floats of per-thread work space a block needs (forward or backward). */
static int64_t block_scratch(const geom *g) {
    return 4 * g->n * g->dp + g->dh * g->np + 2 * g->n * g->np;
}

/* ---- kernels (x86-64, GCC) --------------------------------------------------- */

#if SMALL_PATHS
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

/* Lanes of a where mask m is set, else of b (m from a vector compare). */
#define SEL(T, IT, m, a, b) ((T)(((IT)(a) & (m)) | ((IT)(b) & ~(m))))

ALWAYS_INLINE mview mview_at(mview m, int64_t i, int64_t j) {
    m.p = (char *)m.p + (i * m.rs + j * m.cs) * (m.bf16 ? 2 : 4);
    return m;
}

ALWAYS_INLINE float mview_get(const mview *m, int64_t i, int64_t j) {
    const int64_t o = i * m->rs + j * m->cs;
    return m->bf16 ? vh_cpu_bf16_widen(((const uint16_t *)m->p)[o]) : ((const float *)m->p)[o];
}

/* ---- rows in their storage dtype ------------------------------------------ */

/* Copies of f32 rows as whole vectors (a variable-length memcpy is a call,
 * which cost a third of the time). n a multiple of 8; add: dst += src. */
ALWAYS_INLINE void copy8(float *dst, const float *src, int64_t n, int add) {
    for (int64_t j = 0; j < n; j += 8) {
        v8 x, old;
        memcpy(&x, src + j, sizeof x);
        if (add) {
            memcpy(&old, dst + j, sizeof old);
            x += old;
        }
        memcpy(dst + j, &x, sizeof x);
    }
}

/* Any n: the last vector overlaps the one before (same values twice). */
ALWAYS_INLINE void copy_any(float *dst, const float *src, int64_t n) {
    if (n < 8) {
        for (int64_t j = 0; j < n; j++) dst[j] = src[j];
        return;
    }
    copy8(dst, src, n & ~(int64_t)7, 0);
    if (n & 7) copy8(dst + n - 8, src + n - 8, 8, 0);
}

/* dst[0, n) = src widened to f32, dst[n, np) = 0 (np - n < w, w the
 * vector width: np a multiple of it). */
ALWAYS_INLINE void load_row(float *dst, const void *src, vh_dtype t, int64_t n, int64_t np,
                            int w) {
    const v8 zero = {0};
    for (int64_t j = np - w; j < np; j += 8) memcpy(dst + j, &zero, sizeof zero);
    if (t == VH_DTYPE_F32) {
        copy_any(dst, src, n);
    } else if (t == VH_DTYPE_BF16) {
        const uint16_t *h = src;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dst[j] = vh_cpu_bf16_widen(h[j]);
    } else {
        vh_cpu_to_f32_serial(dst, src, t, n);
    }
}

/* dst = src (accumulate: dst += src), n values (a multiple of 8), rounded
 * once to t. */
ALWAYS_INLINE void store_row(void *dst, vh_dtype t, const float *src, int64_t n, int accumulate) {
    if (t == VH_DTYPE_F32) {
        copy8(dst, src, n, accumulate);
    } else if (t == VH_DTYPE_BF16) {
        uint16_t *h = dst;
#pragma omp simd
        for (int64_t j = 0; j < n; j++)
            h[j] = vh_cpu_bf16_round(accumulate ? vh_cpu_bf16_widen(h[j]) + src[j] : src[j]);
    } else {
        float old[32];
        if (accumulate) vh_cpu_to_f32_serial(old, dst, t, n);
        for (int64_t j = 0; j < n; j++) old[j] = accumulate ? old[j] + src[j] : src[j];
        vh_cpu_from_f32_serial(dst, t, old, n);
    }
}

/* Probabilities row to probs (dtype t), and the row made what was stored. */
ALWAYS_INLINE void store_probs(void *dst, vh_dtype t, float *row, int64_t n) {
    if (t == VH_DTYPE_F32) {
        copy_any(dst, row, n);
    } else if (t == VH_DTYPE_BF16) {
        uint16_t *h = dst;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            const uint32_t b = vh_cpu_bf16_round32(row[j]);
            h[j] = (uint16_t)b;
            row[j] = vh_cpu_bits_f32(b << 16);
        }
    } else {
        vh_cpu_from_f32_serial(dst, t, row, n);
        vh_cpu_to_f32_serial(row, dst, t, n);
    }
}

/* n rows of dp (src) added to (accumulate) or stored in the tensor rows. */
ALWAYS_INLINE void scatter(char *dst, int64_t ts, const float *src, const geom *g,
                           int accumulate) {
    for (int64_t t = 0; t < g->n; t++)
        store_row(dst + t * ts, g->t, src + t * g->dp, g->dh, accumulate);
}

/* A forward block's q and v rows (n rows of row_bytes, ts bytes apart)
 * asked into L1 as the block starts, so that their misses overlap the K
 * transpose instead of stalling each score tile's first product. The
 * hardware's stride prefetcher does not get ahead on so few rows: in T1
 * (50 rows of 64 bytes, 768 apart) a quarter of the f32 forward's samples
 * sat on a tile's first FMA. Zen 4, 2 threads, `vithost bench --ops` on
 * bench_step.py's T1 fp32, two sets of 6 interleaved pairs: attention
 * forward 6.35 / 6.96 and 6.39 / 7.39 ms a step (every pair faster,
 * 5-19%). Not in attention_dot16.c: T1 AMP's bf16 blocks (32-byte rows)
 * ran even, 4.70 / 4.67. Only where both fit well within L1 (T1 and the
 * main job; T2's and T3's rows would evict each other). */
#define PREFETCH_MAX_BYTES 16384

ALWAYS_INLINE void prefetch_rows(const char *q, const char *v, int64_t ts, int64_t n,
                                 int64_t row_bytes) {
    if (2 * n * row_bytes > PREFETCH_MAX_BYTES) return;
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < row_bytes; c += 64) {
            __builtin_prefetch(q + t * ts + c);
            __builtin_prefetch(v + t * ts + c);
        }
}

/* Where a block's rows are too many for that (T2, T3), the rows the next
 * block of the thread's chunk reads are asked into L2 as this block starts
 * (q, k and v; dout too in the backward), so that their misses overlap this
 * block's products. They are rows of a head, ts bytes apart (T2: 256 of
 * every 2304), a stride past the L1 stride prefetcher's reach and too sparse
 * for the L2 streamer, so without this each row waits for memory. Not the
 * probabilities (dense: the streamer fetches them) nor dqkv's rows (asked
 * for as well, with the probabilities, T2's backward took 23.4-24.0 ms a
 * step, the gain gone). Xeon (AMX), 2 threads, `vithost
 * bench --ops` on bench_step.py's fp32 T2 and T3, 3 interleaved pairs each,
 * ms a step, with / without: T2 backward 22.2-22.5 / 23.8-24.3 (forward
 * even), T3 forward 29.8-30.2 / 30.7-31.2 (backward even). The same calls
 * alone with their tensors out of cache (`bench_attention --cold`): T2
 * backward 2.60-2.74 / 2.95-3.06 ms. */
static void prefetch_block_l2(const block *b, const geom *g, int backward) {
    const int64_t row_bytes = g->dh * (int64_t)vh_dtype_size(g->t);
    if (2 * g->n * row_bytes <= PREFETCH_MAX_BYTES) return; /* prefetch_rows' */
    for (int64_t t = 0; t < g->n; t++)
        for (int64_t c = 0; c < row_bytes; c += 64) {
            __builtin_prefetch(b->q + t * b->ts + c, 0, 2);
            __builtin_prefetch(b->k + t * b->ts + c, 0, 2);
            __builtin_prefetch(b->v + t * b->ts + c, 0, 2);
            if (backward) __builtin_prefetch(b->go + t * b->ots + c, 0, 2);
        }
}

/* AVX-512: scores in tiles of 4 rows x 64 columns (16 zmm accumulators),
 * products with the head's rows in tiles of 8 rows x 32 (a head_dim-16 row
 * is one register). AVX2: tiles of 4 x 16 both (8 ymm accumulators).
 * Where a score row fits in ROW_V vectors (N <= 80 on AVX-512, 16 on
 * AVX2), the softmax (forward) and dS (backward) run on the tile's
 * registers, SOFTMAX_ACC / NV rows at a time (NV vectors a row: 8 rows of
 * one, 4 of two, 2 of three to five), and f32 probabilities are stored and
 * read in place. Xeon (AMX, 2.0 GHz), T1's call (B=128 N=50 H=4 Dh=16,
 * f32), one thread, best of 60, ms forward / backward, interleaved with the
 * separate passes: 3.00-3.16 / 3.68-3.80 against 3.40-3.49 / 4.17-4.21. At
 * N 50 (4 vectors) 4 rows at a time spilled accumulators (about half the
 * gain), 3 gained as 2. At N 16 (one vector) 2 rows were slower than the
 * passes (their reduction chains hardly overlap): 8 rows, 2 threads, B=128
 * H=8 ms forward / backward, f32 0.36-0.44 / 0.48-0.58 against 0.39-0.56 /
 * 0.54-0.69, bf16 0.69-0.77 / 0.91-1.02 against 0.74-0.82 / 0.94-1.04.
 * T1's training step: median 101.5 -> 95.4 ms. Rows of five (N 65-80: T2)
 * came later: Zen 4, B=64 N=65 H=3 Dh=64 f32, 2 threads, medians of 200
 * calls interleaved with the separate passes in one process
 * (bench/ab_calls), forward 3.5% and backward 3.4% faster, on top of the
 * registers' B (tile_acc). */
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define VW 16
#define VN(name) name##_v4
#define SCORE_R 4
#define SCORE_V 4
#define PROD_R 8
#define PROD_V 2
#define SOFTMAX_ACC 10
#define ROW_V_V4 5 /* kept past the template, for kernels.reg_row */
#define ROW_V ROW_V_V4
#include "attention_small_kern.h" /* it undefines the eight */
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define VW 8
#define VN(name) name##_v3
#define SCORE_R 4
#define SCORE_V 2
#define PROD_R 4
#define PROD_V 2
#define SOFTMAX_ACC 4
#define ROW_V_V3 2
#define ROW_V ROW_V_V3
#include "attention_small_kern.h" /* it undefines the eight */
#pragma GCC pop_options

__attribute__((target("arch=x86-64-v4"))) void vh_cpu_attention_softmax_v4(float *s, int64_t rows,
                                                                         int64_t ld, int64_t n,
                                                                         float *inv) {
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4) softmax_rows_v4(4, s + i * ld, ld, n, ld, inv ? inv + i : NULL);
    for (; i < rows; i++) softmax_rows_v4(1, s + i * ld, ld, n, ld, inv ? inv + i : NULL);
}

/* The kernels for this call and CPU (forward NULL: none). */
static kernels pick(const vh_attention_args *a) {
    const kernels none = {NULL, NULL, 0, NULL, 0},
                  avx512 = {forward_v4, backward_v4, 16, prefetch_block_l2, 16 * ROW_V_V4},
                  avx2 = {forward_v3, backward_v3, 8, prefetch_block_l2, 8 * ROW_V_V3};
    if (a->head_dim % 8 != 0) return none;
    __builtin_cpu_init();
    const int64_t max512 = a->dtype == VH_DTYPE_F32 ? FUSED_MAX_HEAD_DIM_F32 : FUSED_MAX_HEAD_DIM;
    /* the ISA oneDNN is held to (ONEDNN_MAX_CPU_ISA) holds these kernels too */
    if (__builtin_cpu_supports("x86-64-v4") && vh_dnnl_isa_has(VH_DNNL_ISA_AVX512_CORE) &&
        a->head_dim <= max512)
        return avx512;
    if (__builtin_cpu_supports("x86-64-v3") && vh_dnnl_isa_has(VH_DNNL_ISA_AVX2) &&
        a->head_dim <= FUSED_MAX_HEAD_DIM_AVX2)
        return avx2;
    return none;
}
#else
static kernels pick(const vh_attention_args *a) {
    (void)a;
    const kernels none = {NULL, NULL, 0, NULL, 0};
    return none;
}
#endif

void vh_cpu_attention_softmax_padded(float *s, int64_t rows, int64_t ld, int64_t n, float *inv) {
#if SMALL_PATHS
    static int known = -1; /* callers ask from several threads at once */
    int avx512 = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (avx512 < 0) {
        __builtin_cpu_init();
        avx512 = __builtin_cpu_supports("x86-64-v4") && vh_dnnl_isa_has(VH_DNNL_ISA_AVX512_CORE);
        __atomic_store_n(&known, avx512, __ATOMIC_RELAXED);
    }
    if (avx512) {
        vh_cpu_attention_softmax_v4(s, rows, ld, n, inv);
        return;
    }
#endif
    for (int64_t r = 0; r < rows; r++) {
        vh_cpu_softmax_rows(s + r * ld, 1, n);
        memset(s + r * ld + n, 0, (size_t)(ld - n) * sizeof(float));
        if (inv) inv[r] = 1.0f; /* the rows are whole: x * 1 = x */
    }
}

/* Block bh of the call (es, ps: element sizes of qkv and probs). */
static block block_at(const vh_attention_args *a, int64_t bh, int64_t es, int64_t ps,
                      int backward) {
    const int64_t H = a->heads, N = a->tokens, Dh = a->head_dim, D = H * Dh;
    const int64_t bi = bh / H, h = bh % H;
    const int64_t qo = (bi * a->qkv_batch_stride + h * Dh) * es;
    const int64_t oo = (bi * a->out_batch_stride + h * Dh) * es;
    const char *qkv = (const char *)a->qkv + qo;
    block b = {qkv, qkv + D * es, qkv + 2 * D * es, NULL, NULL, NULL, NULL, NULL,
               (char *)a->probs + bh * N * N * ps, a->qkv_token_stride * es,
               a->out_token_stride * es};
    if (backward) {
        char *dqkv = (char *)a->dqkv + qo;
        b.go = (const char *)a->dout + oo;
        b.dq = dqkv, b.dk = dqkv + D * es, b.dv = dqkv + 2 * D * es;
    } else {
        b.o = (char *)a->out + oo;
    }
    return b;
}

/* Every block of the batch, spread over the threads, each with its own
 * work space from its own arena. */
static vh_status run_blocks(const vh_attention_args *a, const kernels *k, int backward) {
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim, vw = k->w;
    geom g = {N, Dh, (N + vw - 1) / vw * vw, (Dh + vw - 1) / vw * vw, (vh_dtype)a->dtype,
              (vh_dtype)a->probs_dtype, a->scale,
              (a->dtype == VH_DTYPE_F32 || (a->dtype == VH_DTYPE_BF16 && vw == 16)) &&
                  Dh % vw == 0, 0, 0};
    /* The probabilities are read again only by the backward pass: past the
     * caches where the step's tensors exceed them (stream.c's rule), from
     * the scores' rows in scratch. Not where a score row's softmax runs in
     * registers, which store f32 probabilities from there: T2's (N 65)
     * through scratch and streamed, the forward ran 14.2-15.4 ms a step
     * against 14.1-14.2 (3 pairs). T3's (N 197), streamed against stored:
     * 23.5-23.6 against 28.1-28.9 (3 pairs, the AMX Xeon, 2 threads). */
    g.stream_probs = !backward && g.pt == VH_DTYPE_F32 && N >= vw && g.np > k->reg_row &&
                     vh_cpu_stream_on();
    if (g.stream_probs) vh_cpu_attention_count_streamed();
    if (backward && a->overwrite) {
        if (g.direct)
            g.overwrite = 1;
        else
            vh_cpu_attention_zero_dqkv(a);
    }
    const block_fn fn = backward ? k->backward : k->forward;
    const int64_t es = vh_dtype_size(g.t), ps = vh_dtype_size(g.pt), nblocks = B * H;
    const int head_chunk = vh_cpu_attention_head_chunk(H);
    const int dynamic = vh_cpu_deal_dynamic();
    int64_t next_chunk = 0;
    int failed = 0;
#pragma omp parallel if (nblocks > 1 && nblocks * N * N * Dh > VH_CPU_PAR_ELEMS) \
    reduction(| : failed)
    {
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        float *w = vh_cpu_scratch_alloc((size_t)block_scratch(&g) * sizeof(float));
        if (!w) failed = 1;
        /* whole samples, a sample's H blocks (vh_cpu_attention_head_chunk
         * says why), the thread's own rows (deal.c) */
        vh_cpu_deal deal;
        vh_cpu_deal_init(&deal, dynamic, &next_chunk, nblocks, head_chunk, 1, nblocks);
        int64_t lo, hi;
        while (w && vh_cpu_deal_take(&deal, &lo, &hi))
            for (int64_t bh = lo; bh < hi; bh++) {
                const block blk = block_at(a, bh, es, ps, backward);
                if (k->prefetch && (bh + 1) % head_chunk != 0 && bh + 1 < hi) {
                    /* the next block of this sample (the next sample may be another thread's) */
                    const block next = block_at(a, bh + 1, es, ps, backward);
                    k->prefetch(&next, &g, backward);
                }
                fn(&blk, &g, w);
            }
        if (g.stream_probs) vh_cpu_stream_fence();
        vh_cpu_scratch_end(mark);
    }
    return failed ? VH_STATUS_ERR_NOMEM : VH_STATUS_OK;
}

vh_status vh_cpu_attention_small_forward(const vh_attention_args *a) {
    const kernels k = pick(a);
    return k.forward ? run_blocks(a, &k, 0) : VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cpu_attention_small_backward(const vh_attention_args *a) {
    const kernels k = pick(a);
    return k.forward ? run_blocks(a, &k, 1) : VH_STATUS_ERR_UNSUPPORTED;
}
