/* attention.c - multi-head self-attention on a packed qkv tensor, any layout.
 *
 * Every GEMM is one batched oneDNN matmul over all (sample, head) blocks at
 * once: 4-D descriptors (B, H, rows, cols) whose strides read q, k, v and
 * write out/dqkv in place through the token stride (batch-first and
 * batch-second are only different strides; nothing is transposed or copied).
 * The softmax and its gradient are fp32 loops over rows.
 *
 *   forward:  S = scale Q K^T -> probs, softmax rows, out = P V
 *   backward: dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
 *             dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO
 *
 * Why batched matmuls: one call per GEMM lets oneDNN spread the blocks over
 * the threads itself, keeps one primitive per shape in the cache, and needs
 * no BLAS. Measured against the 1.0 engine (one OpenBLAS sgemm per block
 * inside an OpenMP loop), Zen 3, 2 threads, batch-first, best of 30, ms per
 * call, forward / backward:
 *   B=128 N=50  H=4 Dh=16   1.0: 5.1 / 4.0   this: 4.9 / 4.3
 *   B=8   N=197 H=6 Dh=64   1.0: 7.4 / 7.5   this: 7.0 / 7.9
 * about even (the 1.0 engine ran each block's GEMMs while its data was in
 * cache; here each GEMM streams all blocks). Reading K^T from a dense
 * transposed copy instead of through strides made QK^T 15% faster alone but
 * not the op: not kept. A stride pattern oneDNN refuses in 4-D is run as
 * one 3-D matmul per sample, then per block. Small heads (head_dim <= 16)
 * take the fused blocks below instead (measured there).
 *
 * dtypes: all-bf16 calls (qkv, out and probs) run on oneDNN's bf16 kernels
 * where the engine's per-shape choice says they are faster (attention16.c).
 * Otherwise bf16/f16 qkv, out, dout, dqkv are converted to fp32 (their whole
 * extent, gaps included) and back, rounded once; probs are kept in
 * probs_dtype, and P V uses the probabilities as stored (as autocast's bmm
 * would), so forward and backward see the same P.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "cpu_ops.h"
#include "dnnl_engine.h"

static char *elem_at(const view4 *v, int64_t offset) {
    return (char *)v->p + offset * (int64_t)vh_dtype_size(v->t);
}

vh_status vh_cpu_attention_bmm(int64_t nb, int64_t nh, int64_t m, int64_t n, int64_t k,
                               float alpha, const view4 *a, const view4 *b, const view4 *c,
                               int accumulate) {
    vh_dnnl_matmul mm;
    vh_dnnl_matmul_init(&mm);
    mm.batch_dims = 2;
    mm.batch[0] = nb, mm.batch[1] = nh;
    mm.m = m, mm.n = n, mm.k = k;
    memcpy(mm.sa, a->s, sizeof mm.sa);
    memcpy(mm.sb, b->s, sizeof mm.sb);
    memcpy(mm.sc, c->s, sizeof mm.sc);
    mm.ab_dtype = a->t;
    mm.c_dtype = c->t;
    mm.alpha = alpha;
    mm.sum = accumulate ? 1.0f : 0.0f;
    vh_status st = vh_dnnl_matmul_run(&mm, a->p, b->p, NULL, c->p);
    if (st != VH_STATUS_ERR_UNSUPPORTED) return st;
    /* One sample at a time: (H, rows, cols). */
    mm.batch_dims = 1;
    mm.batch[0] = nh, mm.batch[1] = 0;
    for (int d = 0; d < 3; d++) {
        mm.sa[d] = a->s[d + 1], mm.sb[d] = b->s[d + 1], mm.sc[d] = c->s[d + 1];
    }
    mm.sa[3] = mm.sb[3] = mm.sc[3] = 0;
    for (int64_t q = 0; q < nb; q++) {
        st = vh_dnnl_matmul_run(&mm, elem_at(a, q * a->s[0]), elem_at(b, q * b->s[0]), NULL,
                                elem_at(c, q * c->s[0]));
        if (st != VH_STATUS_OK) break;
    }
    if (st != VH_STATUS_ERR_UNSUPPORTED) return st;
    /* One block at a time: plain 2-D. */
    vh_dnnl_matmul_init(&mm);
    mm.m = m, mm.n = n, mm.k = k;
    mm.sa[0] = a->s[2], mm.sa[1] = a->s[3];
    mm.sb[0] = b->s[2], mm.sb[1] = b->s[3];
    mm.sc[0] = c->s[2], mm.sc[1] = 1;
    mm.ab_dtype = a->t;
    mm.c_dtype = c->t;
    mm.alpha = alpha;
    mm.sum = accumulate ? 1.0f : 0.0f;
    for (int64_t bh = 0; bh < nb * nh; bh++) {
        const int64_t q = bh / nh, h = bh % nh;
        st = vh_dnnl_matmul_run(&mm, elem_at(a, q * a->s[0] + h * a->s[1]),
                                elem_at(b, q * b->s[0] + h * b->s[1]), NULL,
                                elem_at(c, q * c->s[0] + h * c->s[1]));
        if (st != VH_STATUS_OK) return st;
    }
    return VH_STATUS_OK;
}


/* dS = P * (dP - rowsum(dP * P)) in place of dP, rows of n. */
VH_CPU_CLONES static void softmax_grad_span(float *ds, const float *p, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *pi = p + r * n;
        float *di = ds + r * n;
        float rs = 0.0f;
#pragma omp simd reduction(+ : rs)
        for (int64_t j = 0; j < n; j++) rs += di[j] * pi[j];
#pragma omp simd
        for (int64_t j = 0; j < n; j++) di[j] = pi[j] * (di[j] - rs);
    }
}

void vh_cpu_softmax_grad_rows(float *ds, const float *p, int64_t rows, int64_t n) {
    softmax_grad_span(ds, p, rows, n);
}

/* ---- fused blocks -------------------------------------------------------------
 * For small heads: one (sample, head) block at a time on one thread, every
 * product of the block done by the small register-tiled kernel below while
 * its N x N scores stay in the thread's L1/L2. Against the batched oneDNN
 * matmuls this skips oneDNN's per-block cost on tiny matrices (T1: 512
 * blocks of 50 x 50 x 16 per call) and the trips of the scores through
 * memory between the GEMMs and the softmax; score rows are padded to a
 * multiple of 8 with -inf (exp gives 0), so the softmax has no scalar tail.
 * Measured on Zen 3, one thread, ms per call, forward / backward, fused
 * against batched oneDNN:
 *   B=128 N=50  H=4  Dh=16 (T1)   4.0 / 4.1   against  4.6 / 5.2
 *   B=64  N=65  H=6  Dh=32        7.7 / 11.7  against  6.6 / 9.6
 *   B=64  N=65  H=3  Dh=64 (T2)   5.4 / 8.5   against  4.5 / 7.1
 *   B=8   N=197 H=6  Dh=64 (T3)   9.6 / 16.2  against  8.5 / 15.6
 * oneDNN's kernels win once a block is big enough, so the fused blocks run
 * for head_dim <= FUSED_MAX_HEAD_DIM (and a multiple of 8) only, and only
 * where the AVX2 or AVX-512 clone runs (the baseline x86-64 clone of the
 * 8-float kernel was 30x slower than oneDNN). */
#define FUSED_MAX_HEAD_DIM 16

typedef float vh_v8 __attribute__((vector_size(32)));

#define ALWAYS_INLINE __attribute__((always_inline)) static inline

/* Unaligned loads and stores (macros: a function passing an AVX vector by
 * value would be built for the baseline ABI). */
#define V8_LOAD(v, p) memcpy(&(v), (p), sizeof(vh_v8))
#define V8_STORE(p, v) memcpy((p), &(v), sizeof(vh_v8))

/* C[R x 8V] (+)= alpha A[R x K] B[K x 8V]: R rows of A against V vectors of
 * B's columns, the R x V accumulators in registers (constant R and V after
 * inlining, loops unrolled). Element (r, k) of A is A[r * ars + k * aks], so
 * A^T is read in place (A's elements are broadcast one at a time: any
 * stride costs the same). */
ALWAYS_INLINE void mm_tile(int R, int V, int64_t K, float alpha, const float *A, int64_t ars,
                           int64_t aks, const float *B, int64_t ldb, float *C, int64_t ldc,
                           int accumulate) {
    vh_v8 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) acc[r][v] = (vh_v8){0};
    for (int64_t k = 0; k < K; k++) {
        vh_v8 b[2];
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) V8_LOAD(b[v], B + k * ldb + 8 * v);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float ar = A[r * ars + k * aks];
            const vh_v8 x = {ar, ar, ar, ar, ar, ar, ar, ar};
#pragma GCC unroll 2
            for (int v = 0; v < V; v++) acc[r][v] += x * b[v];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) {
            float *c = C + r * ldc + 8 * v;
            vh_v8 y = acc[r][v] * alpha;
            if (accumulate) {
                vh_v8 old;
                V8_LOAD(old, c);
                y += old;
            }
            V8_STORE(c, y);
        }
}

/* C[M x n] (+)= alpha op(A)[M x K] B[K x n], row-major with leading
 * dimensions, op(A) = A or A^T (trans_a: A stored K x M); n a multiple of 8. */
ALWAYS_INLINE void mm(int64_t M, int64_t n, int64_t K, float alpha, const float *A, int64_t lda,
                      int trans_a, const float *B, int64_t ldb, float *C, int64_t ldc,
                      int accumulate) {
    const int64_t ars = trans_a ? 1 : lda, aks = trans_a ? lda : 1;
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) {
        const float *a = A + i * ars;
        int64_t c = 0;
        for (; c + 16 <= n; c += 16)
            mm_tile(4, 2, K, alpha, a, ars, aks, B + c, ldb, C + i * ldc + c, ldc, accumulate);
        if (c < n)
            mm_tile(4, 1, K, alpha, a, ars, aks, B + c, ldb, C + i * ldc + c, ldc, accumulate);
    }
    for (; i < M; i++) {
        const float *a = A + i * ars;
        int64_t c = 0;
        for (; c + 16 <= n; c += 16)
            mm_tile(1, 2, K, alpha, a, ars, aks, B + c, ldb, C + i * ldc + c, ldc, accumulate);
        if (c < n)
            mm_tile(1, 1, K, alpha, a, ars, aks, B + c, ldb, C + i * ldc + c, ldc, accumulate);
    }
}

/* dst[c][j] = src[j][c] for j < n, c < dh (K or V of a block, rows strided
 * by lds, into dh rows of ldd), columns n..ldd zeroed. */
ALWAYS_INLINE void transpose(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                             int64_t dh) {
    for (int64_t c = 0; c < dh; c++) {
        float *d = dst + c * ldd;
        for (int64_t j = 0; j < n; j++) d[j] = src[j * lds + c];
        for (int64_t j = n; j < ldd; j++) d[j] = 0.0f;
    }
}

/* One block's geometry: where its q, k, v rows and out rows start (f32). */
typedef struct block {
    const float *q, *k, *v;
    float *o;      /* out (forward) or dout (backward) */
    float *dq, *dk, *dv;
    float *p;      /* its N x N probabilities, dense */
    int64_t ts;    /* token stride of qkv */
    int64_t ots;   /* token stride of out/dout */
} block;

static int64_t padded(int64_t n) { return (n + 7) & ~(int64_t)7; }

/* Rows [0, n) of dh floats, strided by lds, into a dense n x dh copy: the
 * GEMMs stream their B operand from L1 instead of from rows that are a
 * page apart (qkv rows are 3D wide). */
ALWAYS_INLINE void pack(float *dst, const float *src, int64_t lds, int64_t n, int64_t dh) {
    for (int64_t j = 0; j < n; j++) memcpy(dst + j * dh, src + j * lds, (size_t)dh * sizeof(float));
}

/* Floats of per-thread work space a block needs. */
static int64_t block_scratch(int64_t n, int64_t dh) {
    return dh * padded(n) + n * padded(n) + 2 * n * dh;
}

/* Forward of one block: P = softmax(scale Q K^T) into b->p, out = P V.
 * probs_dtype other than f32: P is rounded to it before P V. */
VH_CPU_CLONES static void forward_block(const block *b, int64_t n, int64_t dh, float scale,
                                        vh_dtype probs_dtype, float *work) {
    const int64_t np = padded(n);
    float *kt = work, *s = kt + dh * np, *v = s + n * np;
    transpose(kt, np, b->k, b->ts, n, dh);
    pack(v, b->v, b->ts, n, dh);
    mm(n, np, dh, scale, b->q, b->ts, 0, kt, np, s, np, 0);
    for (int64_t i = 0; i < n; i++) {
        float *row = s + i * np;
        for (int64_t j = n; j < np; j++) row[j] = -INFINITY;
        vh_softmax_row(row, np);
        if (probs_dtype != VH_DTYPE_F32) { /* as stored: rounded once */
            uint16_t h[8];
            for (int64_t j = 0; j < n; j += 8) {
                const int64_t m = n - j < 8 ? n - j : 8;
                vh_cpu_from_f32_serial(h, probs_dtype, row + j, m);
                vh_cpu_to_f32_serial(row + j, h, probs_dtype, m);
            }
        }
        memcpy(b->p + i * n, row, (size_t)n * sizeof(float));
    }
    mm(n, dh, n, 1.0f, s, np, 0, v, dh, b->o, b->ots, 0);
}

/* Backward of one block (dq, dk, dv +=). */
VH_CPU_CLONES static void backward_block(const block *b, int64_t n, int64_t dh, float scale,
                                         float *work) {
    const int64_t np = padded(n);
    float *vt = work, *ds = vt + dh * np, *x = ds + n * np, *y = x + n * dh;
    const float *p = b->p;
    /* dV += P^T dO */
    pack(x, b->o, b->ots, n, dh);
    mm(n, dh, n, 1.0f, p, n, 1, x, dh, b->dv, b->ts, 1);
    /* dP = dO V^T, then dS = P * (dP - rowsum(dP * P)) in place */
    transpose(vt, np, b->v, b->ts, n, dh);
    mm(n, np, dh, 1.0f, x, dh, 0, vt, np, ds, np, 0);
    for (int64_t i = 0; i < n; i++) {
        float *di = ds + i * np;
        const float *pi = p + i * n;
        float rs = 0.0f;
#pragma omp simd reduction(+ : rs)
        for (int64_t j = 0; j < n; j++) rs += di[j] * pi[j];
#pragma omp simd
        for (int64_t j = 0; j < n; j++) di[j] = pi[j] * (di[j] - rs);
    }
    /* dQ += scale dS K, dK += scale dS^T Q */
    pack(x, b->k, b->ts, n, dh);
    pack(y, b->q, b->ts, n, dh);
    mm(n, dh, n, scale, ds, np, 0, x, dh, b->dq, b->ts, 1);
    mm(n, dh, n, scale, ds, np, 1, y, dh, b->dk, b->ts, 1);
}

/* Every block of the batch, spread over the threads, each with its own
 * work space from its own arena. */
static vh_status run_blocks(const vh_attention_args *a, float *qkv, float *o, float *dqkv,
                            float *p, int backward) {
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim, D = H * Dh;
    const int64_t nblocks = B * H, work = block_scratch(N, Dh);
    int failed = 0;
#pragma omp parallel if (nblocks > 1 && nblocks * N * N * Dh > VH_CPU_PAR_ELEMS) \
    reduction(| : failed)
    {
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        float *w = vh_cpu_scratch_alloc((size_t)work * sizeof(float));
        if (!w) failed = 1;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < nblocks; bh++) {
            if (!w) continue;
            const int64_t bi = bh / H, h = bh % H;
            const float *base = qkv + bi * a->qkv_batch_stride + h * Dh;
            block blk = {base, base + D, base + 2 * D,
                         o + bi * a->out_batch_stride + h * Dh,
                         NULL, NULL, NULL,
                         p + bh * N * N, a->qkv_token_stride, a->out_token_stride};
            if (backward) {
                float *dbase = dqkv + bi * a->qkv_batch_stride + h * Dh;
                blk.dq = dbase, blk.dk = dbase + D, blk.dv = dbase + 2 * D;
                backward_block(&blk, N, Dh, a->scale, w);
            } else {
                forward_block(&blk, N, Dh, a->scale, a->probs_dtype, w);
            }
        }
        vh_cpu_scratch_end(mark);
    }
    return failed ? VH_STATUS_ERR_NOMEM : VH_STATUS_OK;
}

static int fused(const vh_attention_args *a) {
    return a->head_dim % 8 == 0 && a->head_dim <= FUSED_MAX_HEAD_DIM && vh_cpu_has_avx2();
}

/* ---- arguments -------------------------------------------------------------- */

/* Reads the caller's struct (any minor: 1.0 had no dtypes) into *a. */
static vh_status check(vh_attention_args *a, const vh_attention_args *in, int backward) {
    if (!in || in->struct_size < offsetof(vh_attention_args, dtype) ||
        !vh_struct_upgrade(a, sizeof *a, in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cpu_is_float(a->dtype) || !vh_cpu_is_float(a->probs_dtype))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a->batch < 0 || a->tokens < 0 || a->heads < 0 || a->head_dim < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    if (a->batch == 0 || a->tokens == 0 || a->heads == 0 || a->head_dim == 0)
        return VH_STATUS_OK;
    const int64_t dm = a->heads * a->head_dim;
    if (a->qkv_token_stride < 3 * dm || a->out_token_stride < dm ||
        a->qkv_batch_stride < 0 || a->out_batch_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    if (!a->qkv || !a->probs) return VH_STATUS_ERR_INVALID_ARG;
    if (backward ? (!a->dout || !a->dqkv) : !a->out) return VH_STATUS_ERR_INVALID_ARG;
    return VH_STATUS_OK;
}

static int empty(const vh_attention_args *a) {
    return a->batch == 0 || a->tokens == 0 || a->heads == 0 || a->head_dim == 0;
}

/* Elements from the first to the last of qkv and of out/dout. */
static int64_t qkv_extent(const vh_attention_args *a) {
    return (a->batch - 1) * a->qkv_batch_stride + (a->tokens - 1) * a->qkv_token_stride +
           3 * a->heads * a->head_dim;
}

static int64_t out_extent(const vh_attention_args *a) {
    return (a->batch - 1) * a->out_batch_stride + (a->tokens - 1) * a->out_token_stride +
           a->heads * a->head_dim;
}

view4 vh_cpu_attention_qkv(const vh_attention_args *a, void *qkv, vh_dtype t, int which,
                           int transposed) {
    view4 v = {qkv, t, {a->qkv_batch_stride, a->head_dim, a->qkv_token_stride, 1}};
    v.p = elem_at(&v, which * a->heads * a->head_dim);
    if (transposed) v.s[2] = 1, v.s[3] = a->qkv_token_stride;
    return v;
}

view4 vh_cpu_attention_out(const vh_attention_args *a, void *out, vh_dtype t) {
    view4 v = {out, t, {a->out_batch_stride, a->head_dim, a->out_token_stride, 1}};
    return v;
}

view4 vh_cpu_attention_square(const vh_attention_args *a, void *p, vh_dtype t, int transposed) {
    const int64_t n = a->tokens;
    view4 v = {p, t, {a->heads * n * n, n * n, transposed ? 1 : n, transposed ? n : 1}};
    return v;
}

/* ---- entry points --------------------------------------------------------- */

vh_status vh_cpu_attention_forward(vh_device *dev, const vh_attention_args *args) {
    (void)dev;
    vh_attention_args a;
    vh_status st = check(&a, args, 0);
    if (st != VH_STATUS_OK || empty(&a)) return st;
    if (!fused(&a) && (st = vh_cpu_attention16_forward(&a)) != VH_STATUS_ERR_UNSUPPORTED)
        return st;
    const int64_t B = a.batch, H = a.heads, N = a.tokens, Dh = a.head_dim;
    const int64_t np = B * H * N * N, nq = qkv_extent(&a), no = out_extent(&a);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    float *qkv = vh_cpu_f32_view(a.qkv, a.dtype, nq, 1);
    float *out = vh_cpu_f32_view(a.out, a.dtype, no, a.dtype != VH_DTYPE_F32);
    float *p = vh_cpu_f32_view(a.probs, a.probs_dtype, np, 0);
    st = VH_STATUS_ERR_NOMEM;
    if (qkv && out && p && fused(&a)) {
        st = run_blocks(&a, qkv, out, NULL, p, 0);
        if (st == VH_STATUS_OK) {
            vh_cpu_f32_store(a.probs, a.probs_dtype, p, np); /* exact: already rounded */
            vh_cpu_f32_store(a.out, a.dtype, out, no);
        }
    } else if (qkv && out && p) {
        const view4 q = vh_cpu_attention_qkv(&a, qkv, VH_DTYPE_F32, 0, 0), kt = vh_cpu_attention_qkv(&a, qkv, VH_DTYPE_F32, 1, 1);
        const view4 v = vh_cpu_attention_qkv(&a, qkv, VH_DTYPE_F32, 2, 0), s = vh_cpu_attention_square(&a, p, VH_DTYPE_F32, 0), o = vh_cpu_attention_out(&a, out, VH_DTYPE_F32);
        st = vh_cpu_attention_bmm(B, H, N, N, Dh, a.scale, &q, &kt, &s, 0);
        if (st == VH_STATUS_OK) {
            const int64_t rows = B * H * N, blocks = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for schedule(static) if (np > VH_CPU_PAR_ELEMS)
            for (int64_t rb = 0; rb < blocks; rb++) {
                const int64_t r0 = rb * ROW_BLOCK;
                vh_cpu_softmax_rows(p + r0 * N, rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK, N);
            }
            if (a.probs_dtype != VH_DTYPE_F32) {
                /* P V with the probabilities as stored */
                vh_cpu_from_f32(a.probs, a.probs_dtype, p, np);
                vh_cpu_to_f32(p, a.probs, a.probs_dtype, np);
            }
            st = vh_cpu_attention_bmm(B, H, N, Dh, N, 1.0f, &s, &v, &o, 0);
        }
        if (st == VH_STATUS_OK) vh_cpu_f32_store(a.out, a.dtype, out, no);
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_attention_backward(vh_device *dev, const vh_attention_args *args) {
    (void)dev;
    vh_attention_args a;
    vh_status st = check(&a, args, 1);
    if (st != VH_STATUS_OK || empty(&a)) return st;
    if (!fused(&a) && (st = vh_cpu_attention16_backward(&a)) != VH_STATUS_ERR_UNSUPPORTED)
        return st;
    const int64_t B = a.batch, H = a.heads, N = a.tokens, Dh = a.head_dim;
    const int64_t np = B * H * N * N, nq = qkv_extent(&a), no = out_extent(&a);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    float *qkv = vh_cpu_f32_view(a.qkv, a.dtype, nq, 1);
    float *dout = vh_cpu_f32_view(a.dout, a.dtype, no, 1);
    float *dqkv = vh_cpu_f32_view(a.dqkv, a.dtype, nq, 1);
    float *p = vh_cpu_f32_view(a.probs, a.probs_dtype, np, 1);
    float *ds = fused(&a) ? NULL : vh_cpu_scratch_alloc((size_t)np * sizeof(float));
    st = VH_STATUS_ERR_NOMEM;
    if (qkv && dout && dqkv && p && fused(&a)) {
        st = run_blocks(&a, qkv, dout, dqkv, p, 1);
        if (st == VH_STATUS_OK) vh_cpu_f32_store(a.dqkv, a.dtype, dqkv, nq);
    } else if (qkv && dout && dqkv && p && ds) {
        const view4 go = vh_cpu_attention_out(&a, dout, VH_DTYPE_F32), vt = vh_cpu_attention_qkv(&a, qkv, VH_DTYPE_F32, 2, 1);
        const view4 dsv = vh_cpu_attention_square(&a, ds, VH_DTYPE_F32, 0), dst = vh_cpu_attention_square(&a, ds, VH_DTYPE_F32, 1), pt = vh_cpu_attention_square(&a, p, VH_DTYPE_F32, 1);
        const view4 k = vh_cpu_attention_qkv(&a, qkv, VH_DTYPE_F32, 1, 0), q = vh_cpu_attention_qkv(&a, qkv, VH_DTYPE_F32, 0, 0);
        const view4 dq = vh_cpu_attention_qkv(&a, dqkv, VH_DTYPE_F32, 0, 0), dk = vh_cpu_attention_qkv(&a, dqkv, VH_DTYPE_F32, 1, 0);
        const view4 dv = vh_cpu_attention_qkv(&a, dqkv, VH_DTYPE_F32, 2, 0);
        st = vh_cpu_attention_bmm(B, H, N, N, Dh, 1.0f, &go, &vt, &dsv, 0); /* dP */
        if (st == VH_STATUS_OK) {
            const int64_t rows = B * H * N, blocks = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for schedule(static) if (np > VH_CPU_PAR_ELEMS)
            for (int64_t rb = 0; rb < blocks; rb++) {
                const int64_t r0 = rb * ROW_BLOCK;
                vh_cpu_softmax_grad_rows(ds + r0 * N, p + r0 * N,
                                  rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK, N);
            }
            st = vh_cpu_attention_bmm(B, H, N, Dh, N, a.scale, &dsv, &k, &dq, 1);
        }
        if (st == VH_STATUS_OK) st = vh_cpu_attention_bmm(B, H, N, Dh, N, a.scale, &dst, &q, &dk, 1);
        if (st == VH_STATUS_OK) st = vh_cpu_attention_bmm(B, H, N, Dh, N, 1.0f, &pt, &go, &dv, 1);
        if (st == VH_STATUS_OK) vh_cpu_f32_store(a.dqkv, a.dtype, dqkv, nq);
    }
    vh_cpu_scratch_end(mark);
    return st;
}
