/* attention16.c - attention with bf16 qkv, out and probs on oneDNN's bf16
 * kernels (AMP-bf16 on a CPU whose bf16 GEMMs are faster than its f32 ones).
 *
 * The widened path (attention.c) converts qkv, dout and dqkv to f32 over
 * their whole extent and runs the products in f32: on Zen 5 that made AMP's
 * attention slower than fp32's (T2: 31 vs 22 ms a step backward), while its
 * bf16 kernels run twice the f32 rate. Here the products run on bf16
 * operands, as autocast's bmm does:
 *
 *   forward:  S = scale Q K^T (f32) -> softmax -> probs (bf16, rounded once)
 *             out = P V                  (bf16 operands, f32 sums, bf16 out)
 *   backward: dP = dO V^T (f32), dS = P * (dP - rowsum(dP * P)) -> bf16
 *             dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO
 *             (each added to dqkv in f32 and rounded once)
 *
 * Work is split into tasks of a few heads of one sample, one task per
 * thread at a time, so that a task's scores stay in that thread's L2; inside
 * a task oneDNN runs on the calling thread alone (called in a parallel
 * region). A task copies its q, k, v (and dO) into dense (heads, N, Dh)
 * blocks first: oneDNN 2.6 runs q, k, v read through qkv's strides on its
 * gemm:jit kernels, whose output scale is a scalar loop, and only dense
 * blocks on brgemm (AMX where the CPU has it). For the same reason P V is
 * written dense and copied into out, and dQ, dK, dV are dense f32 blocks
 * added into dqkv (one rounding, as a sum post-op would). Measured on a Xeon
 * with AMX (T3 under AMP, 2 threads, ms a step, forward / backward): one
 * batched matmul per product over the whole call, strided 95 / 97; the same
 * on dense copies 34 / 59; these tasks 33 / 39 (the step 372 -> 330 ms);
 * with the vector softmax below and dQ/dK/dV added in one pass, 28 / 41.
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
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <omp.h>

#include "attention.h"
#include "dnnl_engine.h"

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
        const double t0 = vh_cpu_seconds();
        const void *a = a16, *b = a16 + na;
        if (!native) {
            vh_cpu_to_f32(a32, a16, VH_DTYPE_BF16, na + nb);
            a = a32, b = a32 + na;
        }
        if (vh_dnnl_matmul_run(&mm, a, b, NULL, c) == VH_STATUS_OK) t = vh_cpu_seconds() - t0;
    }
    vh_cpu_scratch_end(mark);
    return t;
}

static int applies(const vh_attention_args *a) {
    if (a->dtype != VH_DTYPE_BF16) return 0;
    if (a->probs_dtype != VH_DTYPE_BF16 && a->probs_dtype != VH_DTYPE_F32) return 0;
    const vh_gemm16_shape s = {VH_DTYPE_BF16, 0, 1, a->batch * a->heads, a->tokens, a->tokens,
                               a->head_dim, 0};
    return vh_gemm16_native(&s, time_scores, NULL);
}

/* The blocks of one task: heads h0 .. h0+c-1 of sample b, with c chosen so
 * that the task's scores (c N x N in f32, and P or dS in bf16) fit in about
 * 1 MiB of L2. */
#define TASK_L2_BYTES ((int64_t)1 << 20)

typedef struct task_plan {
    int64_t c;     /* heads a task */
    int64_t tasks; /* B * ceil(H / c) */
    int64_t per_sample;
} task_plan;

static task_plan plan_tasks(const vh_attention_args *a) {
    const int64_t B = a->batch, H = a->heads, N = a->tokens;
    int64_t c = TASK_L2_BYTES / (N * N * (int64_t)(sizeof(float) + sizeof(uint16_t)));
    if (c < 1) c = 1;
    if (c > H) c = H;
    /* equal tasks where a divisor of H is close: one primitive shape */
    for (int64_t d = c; d >= (c + 1) / 2; d--)
        if (H % d == 0) {
            c = d;
            break;
        }
    task_plan t = {c, 0, (H + c - 1) / c};
    /* enough tasks for every thread */
    const int64_t threads = omp_get_max_threads();
    while (t.c > 1 && B * t.per_sample < 2 * threads) {
        t.c = (t.c + 1) / 2;
        t.per_sample = (H + t.c - 1) / t.c;
    }
    t.tasks = B * t.per_sample;
    return t;
}

/* Heads h0 .. h0+c-1 of sample b between a strided tensor and a dense
 * (c, N, Dh) bf16 block, the layout oneDNN's brgemm matmuls take: q, k, v
 * (which 0..2) of qkv or dout (which -1) into the block, or (which -2) the
 * block into out. */
static void copy_heads(uint16_t *dense, const vh_attention_args *a, int which, int64_t b,
                       int64_t h0, int64_t c) {
    const int64_t N = a->tokens, Dh = a->head_dim, H = a->heads;
    const int on_out = which < 0;
    const int64_t bs = on_out ? a->out_batch_stride : a->qkv_batch_stride;
    const int64_t ts = on_out ? a->out_token_stride : a->qkv_token_stride;
    const uint16_t *src = which == -1 ? a->dout : which == -2 ? a->out : a->qkv;
    uint16_t *base = (uint16_t *)(uintptr_t)src + b * bs + h0 * Dh;
    if (!on_out) base += which * H * Dh;
    const size_t bytes = (size_t)Dh * sizeof(uint16_t);
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < c; h++) {
            uint16_t *blk = dense + (h * N + n) * Dh, *str = base + n * ts + h * Dh;
            if (which == -2)
                memcpy(str, blk, bytes);
            else
                memcpy(blk, str, bytes);
        }
}

/* A dense (c, N, Dh) tensor as a (1, c, N, Dh) view, or its transpose. */
static view4 dense_heads(const vh_attention_args *a, int64_t c, void *p, vh_dtype t,
                         int transposed) {
    const int64_t N = a->tokens, Dh = a->head_dim;
    view4 v = {p, t, {c * N * Dh, N * Dh, transposed ? 1 : Dh, transposed ? Dh : 1}};
    return v;
}

/* c (N, N) blocks from p, dense, or transposed. */
static view4 dense_square(const vh_attention_args *a, int64_t c, void *p, vh_dtype t,
                          int transposed) {
    const int64_t n = a->tokens;
    view4 v = {p, t, {c * n * n, n * n, transposed ? 1 : n, transposed ? n : 1}};
    return v;
}

/* Softmax of `rows` dense rows of n scores in place, each also rounded
 * into p16, a few rows at a time through `pad` (SOFTMAX_ROWS rows of n
 * rounded up to 16): attention_small.c's vector softmax, four rows
 * interleaved, wants rows padded to whole vectors, which oneDNN's brgemm
 * does not write (a padded C sends it back to gemm:jit). The softmax leaves
 * the exponentials and each row's 1 / sum; one pass then stores their
 * product to s and to p16, where the softmax's last pass, a copy back and a
 * rounding pass took three (the same bits; on a Xeon with AMX the forward
 * even on T3's shape, 4% faster on T2's: bench/README.md, run 16's section). */
#define SOFTMAX_ROWS 16

VH_CPU_CLONES static void scale_round_rows(float *s, uint16_t *p16, const float *pad,
                                           const float *inv, int64_t rows, int64_t ld,
                                           int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float m = inv[r], *x = pad + r * ld;
        float *sr = s + r * n;
        uint16_t *pr = p16 + r * n;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            const float y = x[j] * m; /* softmax_rows' last step, the same product */
            sr[j] = y;
            pr[j] = vh_cpu_bf16_round(y);
        }
    }
}

static void softmax_to_p16(float *s, uint16_t *p16, float *pad, int64_t rows, int64_t n) {
    const int64_t ld = (n + 15) / 16 * 16;
    float inv[SOFTMAX_ROWS];
    for (int64_t r0 = 0; r0 < rows; r0 += SOFTMAX_ROWS) {
        const int64_t m = rows - r0 < SOFTMAX_ROWS ? rows - r0 : SOFTMAX_ROWS;
        for (int64_t r = 0; r < m; r++)
            memcpy(pad + r * ld, s + (r0 + r) * n, (size_t)n * sizeof(float));
        vh_cpu_attention_softmax_padded(pad, m, ld, n, inv);
        scale_round_rows(s + r0 * n, p16 + r0 * n, pad, inv, m, ld, n);
    }
}

/* dqkv += the dense f32 (3, c, N, Dh) gradients of q, k and v of heads h0 ..
 * h0+c-1 of sample b, each element rounded once (what a sum post-op on the
 * bf16 tensor does); with overwrite, dqkv = them, with the bits adding to
 * zeros gives (+ 0.0f turns -0 into +0, as 0 + -0 does), never reading
 * dqkv: the call's tasks cover every span of it, so the zeroing pass and
 * the reads go. Touches only those heads' spans: tasks run at once.
 * Cloned per ISA, its loop vectorised: built for the baseline and inlined,
 * backward_task itself was 13% of the op's samples on T3's shape (a Xeon
 * with AMX, perf), 7% as this clone. */
VH_CPU_CLONES static void scatter_add_heads(const vh_attention_args *a, const float *g,
                                             int64_t b, int64_t h0, int64_t c) {
    const int64_t N = a->tokens, Dh = a->head_dim, H = a->heads, nd = c * N * Dh;
    uint16_t *base = (uint16_t *)a->dqkv + b * a->qkv_batch_stride + h0 * Dh;
    const int overwrite = a->overwrite != 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t w = 0; w < 3; w++)
            for (int64_t h = 0; h < c; h++) {
                uint16_t *span = base + n * a->qkv_token_stride + (w * H + h) * Dh;
                const float *gi = g + w * nd + (h * N + n) * Dh;
                if (overwrite) {
#pragma omp simd
                    for (int64_t d = 0; d < Dh; d++) span[d] = vh_cpu_bf16_round(gi[d] + 0.0f);
                } else {
#pragma omp simd
                    for (int64_t d = 0; d < Dh; d++)
                        span[d] = vh_cpu_bf16_round(vh_cpu_bf16_widen(span[d]) + gi[d]);
                }
            }
}

/* One task's forward: S = scale Q K^T, softmax -> probs (and P16), out = P16 V.
 * oneDNN runs on this thread alone (called inside a parallel region). */
static vh_status forward_task(const vh_attention_args *a, int64_t b, int64_t h0, int64_t c) {
    const int64_t N = a->tokens, Dh = a->head_dim, H = a->heads, nd = c * N * Dh;
    const int64_t np = c * N * N, first = (b * H + h0) * N * N;
    const int f32_probs = a->probs_dtype == VH_DTYPE_F32;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    uint16_t *d = vh_cpu_scratch_alloc((size_t)(3 * nd) * sizeof(uint16_t));
    float *s = f32_probs ? (float *)a->probs + first
                         : vh_cpu_scratch_alloc((size_t)np * sizeof(float));
    uint16_t *p16 = f32_probs ? vh_cpu_scratch_alloc((size_t)np * sizeof(uint16_t))
                              : (uint16_t *)a->probs + first;
    float *pad = vh_cpu_scratch_alloc((size_t)(SOFTMAX_ROWS * ((N + 15) / 16 * 16)) *
                                      sizeof(float));
    vh_status st = VH_STATUS_ERR_NOMEM;
    if (d && s && p16 && pad) {
        for (int w = 0; w < 3; w++) copy_heads(d + w * nd, a, w, b, h0, c);
        const view4 q = dense_heads(a, c, d, VH_DTYPE_BF16, 0);
        const view4 kt = dense_heads(a, c, d + nd, VH_DTYPE_BF16, 1);
        const view4 sv = dense_square(a, c, s, VH_DTYPE_F32, 0);
        st = vh_cpu_attention_bmm(1, c, N, N, Dh, a->scale, &q, &kt, &sv, 0);
    }
    if (st == VH_STATUS_OK) {
        softmax_to_p16(s, p16, pad, c * N, N);
        const view4 p = dense_square(a, c, p16, VH_DTYPE_BF16, 0);
        const view4 v = dense_heads(a, c, d + 2 * nd, VH_DTYPE_BF16, 0);
        const view4 o = dense_heads(a, c, d, VH_DTYPE_BF16, 0); /* over q */
        st = vh_cpu_attention_bmm(1, c, N, Dh, N, 1.0f, &p, &v, &o, 0);
    }
    if (st == VH_STATUS_OK) copy_heads(d, a, -2, b, h0, c); /* brgemm writes dense blocks only */
    vh_cpu_scratch_end(mark);
    return st;
}

/* One task's backward: dP = dO V^T, dS = P (dP - rowsum(dP P)) -> bf16,
 * dQ = scale dS K, dK = scale dS^T Q, dV = P16^T dO, added to dqkv. */
static vh_status backward_task(const vh_attention_args *a, int64_t b, int64_t h0, int64_t c) {
    const int64_t N = a->tokens, Dh = a->head_dim, H = a->heads, nd = c * N * Dh;
    const int64_t np = c * N * N, first = (b * H + h0) * N * N;
    const vh_dtype pt = (vh_dtype)a->probs_dtype;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    uint16_t *d = vh_cpu_scratch_alloc((size_t)(4 * nd) * sizeof(uint16_t)); /* q k v dO */
    float *g = vh_cpu_scratch_alloc((size_t)(3 * nd) * sizeof(float));      /* dq dk dv */
    float *dp = vh_cpu_scratch_alloc((size_t)np * sizeof(float));
    float *p = pt == VH_DTYPE_F32 ? (float *)a->probs + first
                                  : vh_cpu_scratch_alloc((size_t)np * sizeof(float));
    uint16_t *ds16 = vh_cpu_scratch_alloc((size_t)np * sizeof(uint16_t));
    uint16_t *p16 = pt == VH_DTYPE_BF16 ? (uint16_t *)a->probs + first
                                        : vh_cpu_scratch_alloc((size_t)np * sizeof(uint16_t));
    vh_status st = d && g && dp && p && ds16 && p16 ? VH_STATUS_OK : VH_STATUS_ERR_NOMEM;
    if (st == VH_STATUS_OK) {
        for (int w = 0; w < 3; w++) copy_heads(d + w * nd, a, w, b, h0, c);
        copy_heads(d + 3 * nd, a, -1, b, h0, c);
        const view4 go = dense_heads(a, c, d + 3 * nd, VH_DTYPE_BF16, 0);
        const view4 vt = dense_heads(a, c, d + 2 * nd, VH_DTYPE_BF16, 1);
        const view4 dpv = dense_square(a, c, dp, VH_DTYPE_F32, 0);
        st = vh_cpu_attention_bmm(1, c, N, N, Dh, 1.0f, &go, &vt, &dpv, 0);
        if (st == VH_STATUS_OK) {
            if (pt != VH_DTYPE_F32) vh_cpu_to_f32_serial(p, p16, VH_DTYPE_BF16, np);
            vh_cpu_softmax_grad_rows16(ds16, pt == VH_DTYPE_F32 ? p16 : NULL, dp, p, c * N, N);
            const view4 ds = dense_square(a, c, ds16, VH_DTYPE_BF16, 0);
            const view4 dst = dense_square(a, c, ds16, VH_DTYPE_BF16, 1);
            const view4 ptv = dense_square(a, c, p16, VH_DTYPE_BF16, 1);
            const view4 q = dense_heads(a, c, d, VH_DTYPE_BF16, 0);
            const view4 k = dense_heads(a, c, d + nd, VH_DTYPE_BF16, 0);
            const view4 dq = dense_heads(a, c, g, VH_DTYPE_F32, 0);
            const view4 dk = dense_heads(a, c, g + nd, VH_DTYPE_F32, 0);
            const view4 dv = dense_heads(a, c, g + 2 * nd, VH_DTYPE_F32, 0);
            st = vh_cpu_attention_bmm(1, c, N, Dh, N, a->scale, &ds, &k, &dq, 0);
            if (st == VH_STATUS_OK) st = vh_cpu_attention_bmm(1, c, N, Dh, N, a->scale, &dst, &q, &dk, 0);
            if (st == VH_STATUS_OK) st = vh_cpu_attention_bmm(1, c, N, Dh, N, 1.0f, &ptv, &go, &dv, 0);
        }
        if (st == VH_STATUS_OK) scatter_add_heads(a, g, b, h0, c);
    }
    vh_cpu_scratch_end(mark);
    return st;
}

/* Every task of the call, spread over the threads; the first failure wins
 * (a task that fails has written nothing to dqkv: its scatter is last). */
static vh_status run_tasks(const vh_attention_args *a, int backward) {
    const task_plan t = plan_tasks(a);
    const int64_t H = a->heads;
    int failed = 0;
    vh_status first = VH_STATUS_OK;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int64_t i = 0; i < t.tasks; i++) {
        const int64_t b = i / t.per_sample, h0 = (i % t.per_sample) * t.c;
        const int64_t c = H - h0 < t.c ? H - h0 : t.c;
        const vh_status st = backward ? backward_task(a, b, h0, c) : forward_task(a, b, h0, c);
        if (st != VH_STATUS_OK) {
#pragma omp critical(vh_attention16_status)
            if (first == VH_STATUS_OK) first = st;
            failed = 1;
        }
    }
    return failed ? first : VH_STATUS_OK;
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
    vh_status st = run_tasks(a, 0);
    /* a task may have written out: the widened path must not run after it */
    if (st == VH_STATUS_ERR_UNSUPPORTED) st = VH_STATUS_ERR_INTERNAL;
    vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_ONEDNN16);
    return st;
}

vh_status vh_cpu_attention16_dot_backward(const vh_attention_args *a) {
    /* the blocks' own test first: the engine's choice may time a shape class */
    if (!vh_cpu_attention_dot16_applies(a) || !applies(a)) return VH_STATUS_ERR_UNSUPPORTED;
    /* with overwrite the blocks write dqkv's rows (no zeroing first) */
    const vh_status st = vh_cpu_attention_dot16_backward(a);
    if (st != VH_STATUS_ERR_UNSUPPORTED) vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_DOT16);
    return st;
}

vh_status vh_cpu_attention16_backward(const vh_attention_args *a) {
    if (!applies(a)) return VH_STATUS_ERR_UNSUPPORTED;
    /* with overwrite the tasks write dqkv (scatter_add_heads), else add */
    vh_status st = run_tasks(a, 1);
    /* dqkv may be added to already: the widened path must not run after it */
    if (st == VH_STATUS_ERR_UNSUPPORTED) st = VH_STATUS_ERR_INTERNAL;
    vh_cpu_attention_count(VH_CPU_ATTENTION_ROUTE_ONEDNN16);
    return st;
}
