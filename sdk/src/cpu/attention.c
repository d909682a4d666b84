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
 * one 3-D matmul per sample, then per block. Small heads (head_dim 8..32,
 * a multiple of 8; f32 up to 64 on AVX-512) take the fused blocks of
 * attention_small.c instead.
 *
 * dtypes: all-bf16 calls (qkv, out and probs) run on oneDNN's bf16 kernels
 * where the engine's per-shape choice says they are faster (attention16.c;
 * heads of 16..96 there on attention_dot16.c's bf16 dot-product blocks,
 * asked before the small-head blocks).
 * Otherwise bf16/f16 qkv, out, dout, dqkv are converted to fp32 (their whole
 * extent, gaps included) and back, rounded once; probs are kept in
 * probs_dtype, and P V uses the probabilities as stored (as autocast's bmm
 * would), so forward and backward see the same P.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "vithost/vh_cpu_engine.h"

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


/* rowsum(dP * P) of a row of n: one loop for both softmax gradients below,
 * so that the two give the same bits. */
__attribute__((always_inline)) static inline float softmax_grad_rowsum(const float *d,
                                                                       const float *p, int64_t n) {
    float rs = 0.0f;
#pragma omp simd reduction(+ : rs)
    for (int64_t j = 0; j < n; j++) rs += d[j] * p[j];
    return rs;
}

/* dS = P * (dP - rowsum(dP * P)) in place of dP, rows of n. */
VH_CPU_CLONES static void softmax_grad_span(float *ds, const float *p, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *pi = p + r * n;
        float *di = ds + r * n;
        const float rs = softmax_grad_rowsum(di, pi, n);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) di[j] = pi[j] * (di[j] - rs);
    }
}

void vh_cpu_softmax_grad_rows(float *ds, const float *p, int64_t rows, int64_t n) {
    softmax_grad_span(ds, p, rows, n);
}

/* The same dS rounded to bf16 into ds16 (dp as it was, not written), and
 * p16 = P rounded (NULL: not wanted), in one pass a row while it is in L1:
 * attention16.c's tasks took three (P rounded, dS in place, dS rounded). */
VH_CPU_CLONES static void softmax_grad16_span(uint16_t *ds16, uint16_t *p16, const float *dp,
                                              const float *p, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *pi = p + r * n, *di = dp + r * n;
        uint16_t *oi = ds16 + r * n;
        const float rs = softmax_grad_rowsum(di, pi, n);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) oi[j] = vh_cpu_bf16_round(pi[j] * (di[j] - rs));
        if (!p16) continue;
        uint16_t *qi = p16 + r * n;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) qi[j] = vh_cpu_bf16_round(pi[j]);
    }
}

void vh_cpu_softmax_grad_rows16(uint16_t *ds16, uint16_t *p16, const float *dp, const float *p,
                                int64_t rows, int64_t n) {
    softmax_grad16_span(ds16, p16, dp, p, rows, n);
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

/* ---- routes taken ----------------------------------------------------------- */

static uint64_t g_route_calls[VH_CPU_ATTENTION_ROUTE_COUNT];

void vh_cpu_attention_count(vh_cpu_attention_route route) {
    __atomic_fetch_add(&g_route_calls[route], 1, __ATOMIC_RELAXED);
}

static uint64_t g_streamed_calls;

void vh_cpu_attention_count_streamed(void) {
    __atomic_fetch_add(&g_streamed_calls, 1, __ATOMIC_RELAXED);
}

const char *vh_cpu_attention_routes(char *buf, size_t len) {
    static const char *const names[VH_CPU_ATTENTION_ROUTE_COUNT] = {
        "the fused small-head blocks", "the bf16 dot-product blocks",
        "oneDNN's bf16 matmuls in per-thread tasks", "oneDNN's batched f32 matmuls"};
    if (!buf || len == 0) return buf;
    uint64_t n[VH_CPU_ATTENTION_ROUTE_COUNT], total = 0;
    for (int r = 0; r < VH_CPU_ATTENTION_ROUTE_COUNT; r++)
        total += n[r] = __atomic_load_n(&g_route_calls[r], __ATOMIC_RELAXED);
    if (total == 0) {
        snprintf(buf, len, "no calls");
        return buf;
    }
    int at = snprintf(buf, len, "%llu calls:", (unsigned long long)total);
    const char *sep = " ";
    for (int r = 0; r < VH_CPU_ATTENTION_ROUTE_COUNT && (size_t)at < len; r++) {
        if (!n[r]) continue;
        at += snprintf(buf + at, len - (size_t)at, "%s%llu on %s", sep, (unsigned long long)n[r],
                       names[r]);
        sep = ", ";
    }
    const uint64_t streamed = __atomic_load_n(&g_streamed_calls, __ATOMIC_RELAXED);
    if (streamed && (size_t)at < len)
        snprintf(buf + at, len - (size_t)at,
                 "; f32 probabilities streamed past the caches in %llu forward calls",
                 (unsigned long long)streamed);
    return buf;
}

void vh_cpu_attention_zero_dqkv(const vh_attention_args *a) {
    const int64_t rows = a->batch * a->tokens, width = 3 * a->heads * a->head_dim;
    const int64_t es = (int64_t)vh_dtype_size((vh_dtype)a->dtype);
    const size_t bytes = (size_t)(width * es);
#pragma omp parallel for schedule(static) if (rows * width > VH_CPU_PAR_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / a->tokens, t = r % a->tokens;
        memset((char *)a->dqkv + (b * a->qkv_batch_stride + t * a->qkv_token_stride) * es, 0,
               bytes);
    }
}

/* ---- entry points --------------------------------------------------------- */

vh_status vh_cpu_attention_forward(vh_device *dev, const vh_attention_args *args) {
    (void)dev;
    vh_attention_args a;
    vh_status st = check(&a, args, 0);
    if (st != VH_STATUS_OK || empty(&a)) return st;
    /* bf16 on the native route: the dot-product blocks, small heads too */
    if ((st = vh_cpu_attention16_dot_forward(&a)) != VH_STATUS_ERR_UNSUPPORTED) return st;
    if ((st = vh_cpu_attention_small_forward(&a)) != VH_STATUS_ERR_UNSUPPORTED) {
        vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_SMALL);
        return st;
    }
    if ((st = vh_cpu_attention16_forward(&a)) != VH_STATUS_ERR_UNSUPPORTED) return st;
    vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_BATCHED);
    const int64_t B = a.batch, H = a.heads, N = a.tokens, Dh = a.head_dim;
    const int64_t np = B * H * N * N, nq = qkv_extent(&a), no = out_extent(&a);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    float *qkv = vh_cpu_f32_view(a.qkv, a.dtype, nq, 1);
    float *out = vh_cpu_f32_view(a.out, a.dtype, no, a.dtype != VH_DTYPE_F32);
    float *p = vh_cpu_f32_view(a.probs, a.probs_dtype, np, 0);
    st = VH_STATUS_ERR_NOMEM;
    if (qkv && out && p) {
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
    /* bf16 on the native route: the dot-product blocks, small heads too */
    if ((st = vh_cpu_attention16_dot_backward(&a)) != VH_STATUS_ERR_UNSUPPORTED) return st;
    if ((st = vh_cpu_attention_small_backward(&a)) != VH_STATUS_ERR_UNSUPPORTED) {
        vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_SMALL);
        return st;
    }
    if ((st = vh_cpu_attention16_backward(&a)) != VH_STATUS_ERR_UNSUPPORTED) return st;
    vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_BATCHED);
    if (a.overwrite) vh_cpu_attention_zero_dqkv(&a); /* this route adds */
    const int64_t B = a.batch, H = a.heads, N = a.tokens, Dh = a.head_dim;
    const int64_t np = B * H * N * N, nq = qkv_extent(&a), no = out_extent(&a);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    float *qkv = vh_cpu_f32_view(a.qkv, a.dtype, nq, 1);
    float *dout = vh_cpu_f32_view(a.dout, a.dtype, no, 1);
    float *dqkv = vh_cpu_f32_view(a.dqkv, a.dtype, nq, 1);
    float *p = vh_cpu_f32_view(a.probs, a.probs_dtype, np, 1);
    float *ds = vh_cpu_scratch_alloc((size_t)np * sizeof(float));
    st = VH_STATUS_ERR_NOMEM;
    if (qkv && dout && dqkv && p && ds) {
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
