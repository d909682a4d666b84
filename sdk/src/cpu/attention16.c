/* attention16.c - attention with bf16 qkv, out and probs on oneDNN's bf16
 * kernels (AMP-bf16 on a CPU whose bf16 GEMMs are faster than its f32 ones).
 *
 * The widened path (attention.c) converts qkv, dout and dqkv to f32 over
 * their whole extent and runs the products in f32: on Zen 5 that made AMP's
 * attention slower than fp32's (T2: 31 vs 22 ms a step backward), while its
 * bf16 kernels run twice the f32 rate. Here the products read the bf16
 * tensors in place through their strides, as autocast's bmm does:
 *
 *   forward:  S = scale Q K^T (f32) -> softmax -> probs (bf16, rounded once)
 *             out = P V                  (bf16 operands, f32 sums, bf16 out)
 *   backward: dP = dO V^T (f32), dS = P * (dP - rowsum(dP * P)) -> bf16
 *             dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO
 *             (each added to dqkv in f32 and rounded once)
 *
 * The roundings the widened path has not: dS to bf16 before its two
 * products, and P to bf16 before P V and P^T dO where probs are kept in f32
 * (the operands of a bf16 kernel are bf16; autocast rounds both the same
 * way: its softmax is fp32, its bmm casts to bf16). Products of bf16 values are exact in f32 and the sums are f32,
 * as in every AMP GEMM. Which path runs is the engine's choice for the
 * batched Q K^T shape class (gemm_choice.c: timed once per process, or
 * forced by VITHOST_CPU_GEMM16), so a CPU whose bf16 kernels are slower
 * keeps the widened path. On the native path, heads of 16..96 (a multiple of
 * 16) on a CPU with AVX512-BF16 and no AMX take attention_dot16.c's fused
 * blocks instead (vh_cpu_attention16_dot_*, which attention.c asks before
 * the small-head blocks; the same roundings; VITHOST_CPU_ATTENTION16=onednn
 * keeps them here, and small heads on attention_small.c).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime in strict C11 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "dnnl_engine.h"

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* vh_gemm16_timer of the batched Q K^T class: the proxy's dense operands
 * (their values do not matter to the time) on one path; widening converts
 * both first, as attention.c does. */
static double time_scores(void *ctx, int native, const vh_gemm16_shape *p) {
    (void)ctx;
    const int64_t na = p->batch * p->m * p->k, nb = p->batch * p->k * p->n;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    uint16_t *a16 = vh_cpu_scratch_alloc((size_t)(na + nb) * sizeof(uint16_t));
    float *a32 = vh_cpu_scratch_alloc((size_t)(na + nb) * sizeof(float));
    float *c = vh_cpu_scratch_alloc((size_t)(p->batch * p->m * p->n) * sizeof(float));
    double t = -1.0;
    if (a16 && a32 && c) {
        for (int64_t i = 0; i < na + nb; i++) a16[i] = (uint16_t)(0x3f80u + (uint16_t)(i & 63));
        vh_dnnl_matmul mm;
        vh_dnnl_matmul_init(&mm);
        mm.batch_dims = 1;
        mm.batch[0] = p->batch;
        mm.m = p->m, mm.n = p->n, mm.k = p->k;
        mm.sa[0] = p->m * p->k, mm.sa[1] = p->k, mm.sa[2] = 1;
        mm.sb[0] = p->k * p->n, mm.sb[1] = 1, mm.sb[2] = p->k; /* K^T: K rows read across */
        mm.sc[0] = p->m * p->n, mm.sc[1] = p->n, mm.sc[2] = 1;
        mm.ab_dtype = native ? VH_DTYPE_BF16 : VH_DTYPE_F32;
        mm.c_dtype = VH_DTYPE_F32;
        mm.alpha = 1.0f;
        const double t0 = seconds();
        const void *a = a16, *b = a16 + na;
        if (!native) {
            vh_cpu_to_f32(a32, a16, VH_DTYPE_BF16, na + nb);
            a = a32, b = a32 + na;
        }
        if (vh_dnnl_matmul_run(&mm, a, b, NULL, c) == VH_STATUS_OK) t = seconds() - t0;
    }
    vh_cpu_scratch_end(mark);
    return t;
}

static int applies(const vh_attention_args *a) {
    if (a->dtype != VH_DTYPE_BF16) return 0;
    if (a->probs_dtype != VH_DTYPE_BF16 && a->probs_dtype != VH_DTYPE_F32) return 0;
    const vh_gemm16_shape s = {VH_DTYPE_BF16, 0, 1, a->batch * a->heads, a->tokens, a->tokens,
                               a->head_dim};
    return vh_gemm16_native(&s, time_scores, NULL);
}

/* Row blocks of the scores s (f32, rows of n): softmax, each block rounded
 * into p16 (bf16) in the same pass, and kept in s when probs are f32. */
static void softmax_to_probs(float *s, uint16_t *p16, int64_t rows, int64_t n) {
    const int64_t blocks = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for schedule(static) if (rows * n > VH_CPU_PAR_ELEMS)
    for (int64_t rb = 0; rb < blocks; rb++) {
        const int64_t r0 = rb * ROW_BLOCK, m = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
        vh_cpu_softmax_rows(s + r0 * n, m, n);
        vh_cpu_from_f32_serial(p16 + r0 * n, VH_DTYPE_BF16, s + r0 * n, m * n);
    }
}

/* P in bf16, the operand of P V and P^T dO: probs themselves, or a rounded
 * copy of f32 probs (in the caller's scratch mark). */
static uint16_t *probs16(const vh_attention_args *a, int64_t np) {
    if (a->probs_dtype == VH_DTYPE_BF16) return a->probs;
    uint16_t *p = vh_cpu_scratch_alloc((size_t)np * sizeof(uint16_t));
    if (p) vh_cpu_from_f32(p, VH_DTYPE_BF16, a->probs, np);
    return p;
}

vh_status vh_cpu_attention16_dot_forward(const vh_attention_args *a) {
    /* the blocks' own test first: the engine's choice may time a shape class */
    if (!vh_cpu_attention_dot16_applies(a) || !applies(a)) return VH_STATUS_ERR_UNSUPPORTED;
    const vh_status st = vh_cpu_attention_dot16_forward(a);
    if (st != VH_STATUS_ERR_UNSUPPORTED) vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_DOT16);
    return st;
}

vh_status vh_cpu_attention16_forward(const vh_attention_args *a) {
    if (!applies(a)) return VH_STATUS_ERR_UNSUPPORTED;
    vh_status st;
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim;
    const int64_t rows = B * H * N;
    void *qkv = (void *)(uintptr_t)a->qkv;
    const int f32_probs = a->probs_dtype == VH_DTYPE_F32;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    /* the scores in probs themselves when they are f32 */
    float *s = f32_probs ? a->probs : vh_cpu_scratch_alloc((size_t)(rows * N) * sizeof(float));
    uint16_t *p16 = f32_probs ? vh_cpu_scratch_alloc((size_t)(rows * N) * sizeof(uint16_t))
                              : a->probs;
    st = VH_STATUS_ERR_NOMEM;
    if (s && p16) {
        const view4 q = vh_cpu_attention_qkv(a, qkv, VH_DTYPE_BF16, 0, 0);
        const view4 kt = vh_cpu_attention_qkv(a, qkv, VH_DTYPE_BF16, 1, 1);
        const view4 sv = vh_cpu_attention_square(a, s, VH_DTYPE_F32, 0);
        st = vh_cpu_attention_bmm(B, H, N, N, Dh, a->scale, &q, &kt, &sv, 0);
    }
    if (st == VH_STATUS_OK) {
        softmax_to_probs(s, p16, rows, N);
        const view4 p = vh_cpu_attention_square(a, p16, VH_DTYPE_BF16, 0);
        const view4 v = vh_cpu_attention_qkv(a, qkv, VH_DTYPE_BF16, 2, 0);
        const view4 o = vh_cpu_attention_out(a, a->out, VH_DTYPE_BF16);
        st = vh_cpu_attention_bmm(B, H, N, Dh, N, 1.0f, &p, &v, &o, 0);
    }
    vh_cpu_scratch_end(mark);
    if (st != VH_STATUS_ERR_UNSUPPORTED) vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_ONEDNN16);
    return st;
}

/* dS from dP (f32, in place) and the stored probs (of dtype pt), rounded
 * into ds16. */
static vh_status softmax_grad_to_bf16(float *dp, const void *probs, vh_dtype pt, uint16_t *ds16,
                                      int64_t rows, int64_t n) {
    const int64_t blocks = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed) if (rows * n > VH_CPU_PAR_ELEMS)
    for (int64_t rb = 0; rb < blocks; rb++) {
        const int64_t r0 = rb * ROW_BLOCK, m = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        const float *p = pt == VH_DTYPE_F32 ? (const float *)probs + r0 * n
                                            : vh_cpu_scratch_alloc((size_t)(m * n) * sizeof(float));
        if (p) {
            if (pt != VH_DTYPE_F32)
                vh_cpu_to_f32_serial((float *)(uintptr_t)p, (const uint16_t *)probs + r0 * n, pt,
                                     m * n);
            vh_cpu_softmax_grad_rows(dp + r0 * n, p, m, n);
            vh_cpu_from_f32_serial(ds16 + r0 * n, VH_DTYPE_BF16, dp + r0 * n, m * n);
        }
        failed |= !p;
        vh_cpu_scratch_end(mark);
    }
    return failed ? VH_STATUS_ERR_NOMEM : VH_STATUS_OK;
}

vh_status vh_cpu_attention16_dot_backward(const vh_attention_args *a) {
    /* the blocks' own test first: the engine's choice may time a shape class */
    if (!vh_cpu_attention_dot16_applies(a) || !applies(a)) return VH_STATUS_ERR_UNSUPPORTED;
    const vh_status st = vh_cpu_attention_dot16_backward(a);
    if (st != VH_STATUS_ERR_UNSUPPORTED) vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_DOT16);
    return st;
}

vh_status vh_cpu_attention16_backward(const vh_attention_args *a) {
    if (!applies(a)) return VH_STATUS_ERR_UNSUPPORTED;
    vh_status st;
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim;
    const int64_t rows = B * H * N;
    void *qkv = (void *)(uintptr_t)a->qkv, *dout = (void *)(uintptr_t)a->dout;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    float *dp = vh_cpu_scratch_alloc((size_t)(rows * N) * sizeof(float));
    uint16_t *ds16 = vh_cpu_scratch_alloc((size_t)(rows * N) * sizeof(uint16_t));
    st = dp && ds16 ? VH_STATUS_OK : VH_STATUS_ERR_NOMEM;
    const view4 go = vh_cpu_attention_out(a, dout, VH_DTYPE_BF16);
    if (st == VH_STATUS_OK) { /* dP = dO V^T */
        const view4 vt = vh_cpu_attention_qkv(a, qkv, VH_DTYPE_BF16, 2, 1);
        const view4 dpv = vh_cpu_attention_square(a, dp, VH_DTYPE_F32, 0);
        st = vh_cpu_attention_bmm(B, H, N, N, Dh, 1.0f, &go, &vt, &dpv, 0);
    }
    if (st == VH_STATUS_OK)
        st = softmax_grad_to_bf16(dp, a->probs, (vh_dtype)a->probs_dtype, ds16, rows, N);
    uint16_t *p16 = st == VH_STATUS_OK ? probs16(a, rows * N) : NULL;
    if (st == VH_STATUS_OK && !p16) st = VH_STATUS_ERR_NOMEM;
    if (st == VH_STATUS_OK) { /* dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO */
        const view4 ds = vh_cpu_attention_square(a, ds16, VH_DTYPE_BF16, 0);
        const view4 dst = vh_cpu_attention_square(a, ds16, VH_DTYPE_BF16, 1);
        const view4 pt = vh_cpu_attention_square(a, p16, VH_DTYPE_BF16, 1);
        const view4 k = vh_cpu_attention_qkv(a, qkv, VH_DTYPE_BF16, 1, 0);
        const view4 q = vh_cpu_attention_qkv(a, qkv, VH_DTYPE_BF16, 0, 0);
        const view4 dq = vh_cpu_attention_qkv(a, a->dqkv, VH_DTYPE_BF16, 0, 0);
        const view4 dk = vh_cpu_attention_qkv(a, a->dqkv, VH_DTYPE_BF16, 1, 0);
        const view4 dv = vh_cpu_attention_qkv(a, a->dqkv, VH_DTYPE_BF16, 2, 0);
        st = vh_cpu_attention_bmm(B, H, N, Dh, N, a->scale, &ds, &k, &dq, 1);
        if (st == VH_STATUS_OK) st = vh_cpu_attention_bmm(B, H, N, Dh, N, a->scale, &dst, &q, &dk, 1);
        if (st == VH_STATUS_OK) st = vh_cpu_attention_bmm(B, H, N, Dh, N, 1.0f, &pt, &go, &dv, 1);
        /* dq is added to already: the widened path must not run after it */
        if (st == VH_STATUS_ERR_UNSUPPORTED) st = VH_STATUS_ERR_INTERNAL;
    }
    vh_cpu_scratch_end(mark);
    if (st != VH_STATUS_ERR_UNSUPPORTED) vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_ONEDNN16);
    return st;
}
