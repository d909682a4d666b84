/* activations.c - element-wise and row-wise ops: GELU, add, mul, bias
 * gradient, softmax, per-sample row scaling (drop path) and dropout.
 * fp32 kernels: ops.c reads the arguments and converts other dtypes (but
 * for drop_path_scale, whose entry is at the end of this file). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "cpu_ops.h"
#include "../gelu_erf.h"

#define PAR(n) if ((n) > VH_CPU_PAR_ELEMS)

/* Rows per chunk of bias_backward: each fixed chunk sums its rows, then the
 * chunks are added in order, so the result does not depend on thread count. */
#define BIAS_CHUNK_ROWS 64

/* GELU uses vh_gelu_cdf (gelu_erf.h): the formula the CUDA kernels share. */

/* Pieces of a threaded element-wise loop: piece p is [p * VH_CPU_PIECE,
 * + PIECE_LEN(n, p)). */
#define PIECES(n) (((n) + VH_CPU_PIECE - 1) / VH_CPU_PIECE)
#define PIECE_LEN(n, p) \
    ((n) - (p) * VH_CPU_PIECE < VH_CPU_PIECE ? (n) - (p) * VH_CPU_PIECE : VH_CPU_PIECE)

/* GELU does enough math per cache line that the hardware prefetcher falls
 * behind on tensors that come from memory: on a Xeon with AMX, 2 threads,
 * T2's 3.2M elements out of memory, bf16 backward 2.2-2.35 ms a call, in
 * the step 32 ms a step. So a GELU piece runs in blocks, each block's span
 * of every array prefetched PF_AHEAD_BYTES ahead first (1.4-1.7 ms; in the
 * step 16 ms). A prefetch never faults: past an array's end is harmless. */
#define GELU_BLOCK 512 /* elements: even, so bf16 blocks keep their pairs */
#define PF_AHEAD_BYTES 4096

static inline void prefetch_ahead(const void *p, int64_t bytes, int write) {
    const char *c = (const char *)p + PF_AHEAD_BYTES;
    for (int64_t j = 0; j < bytes; j += 64) {
        if (write)
            __builtin_prefetch(c + j, 1);
        else
            __builtin_prefetch(c + j);
    }
}

/* for (block of piece p) { prefetch each array's span; CALL on the block },
 * o the block's first element, m its length. */
#define GELU_BLOCKS(n, p, o, m, PREFETCH, CALL)                                  \
    do {                                                                        \
        const int64_t first_ = (p) * VH_CPU_PIECE, end_ = first_ + PIECE_LEN(n, p); \
        for (int64_t o = first_; o < end_; o += GELU_BLOCK) {                   \
            const int64_t m = end_ - o < GELU_BLOCK ? end_ - o : GELU_BLOCK;    \
            PREFETCH;                                                           \
            CALL;                                                               \
        }                                                                       \
    } while (0)

/* The clones are static: GCC gives the ifunc resolver of an extern clone
 * default visibility, so it would show in the library's dynamic symbols. */
VH_CPU_CLONES static void gelu_forward_span(float *out, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float pdf;
        const float v = x[i];
        out[i] = v * vh_gelu_cdf(v, &pdf);
    }
}

void vh_cpu_k_gelu_forward_serial(float *out, const float *x, int64_t n) {
    gelu_forward_span(out, x, n);
}

/* GELU and its derivative from one evaluation of the CDF and density
 * (ABI 2.5's VH_EPILOGUE_GELU_GRAD): grad[i] = cdf + v pdf, gelu_backward's
 * very expression, so dout * grad[i] is its product. grad may be x itself
 * (each element read before it is written); out may not. */
VH_CPU_CLONES static void gelu_forward_grad_span(float *out, float *grad, const float *x,
                                                 int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float pdf;
        const float v = x[i];
        const float cdf = vh_gelu_cdf(v, &pdf);
        out[i] = v * cdf;
        grad[i] = cdf + v * pdf;
    }
}

void vh_cpu_k_gelu_forward_grad_serial(float *out, float *grad, const float *x, int64_t n) {
    gelu_forward_grad_span(out, grad, x, n);
}

/* overwrite: dx = 0 + ... (the bits of adding to zeros: +0 for a -0
 * product), two loops so that the writing one never reads dx. */
VH_CPU_CLONES static void gelu_backward_span(float *dx, const float *x, const float *dout,
                                             int64_t n, int overwrite) {
    if (overwrite) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            float pdf;
            const float v = x[i];
            const float cdf = vh_gelu_cdf(v, &pdf);
            dx[i] = 0.0f + dout[i] * (cdf + v * pdf);
        }
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float pdf;
        const float v = x[i];
        const float cdf = vh_gelu_cdf(v, &pdf);
        dx[i] += dout[i] * (cdf + v * pdf);
    }
}

VH_CPU_CLONES static void add_span(float *out, const float *a, const float *b, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

VH_CPU_CLONES static void mul_span(float *out, const float *a, const float *b, int64_t n,
                                   int32_t accumulate) {
    if (accumulate) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] += a[i] * b[i];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
    }
}

/* bf16 tensors in the loop itself: no conversion pass, not even through
 * L1 (GELU's backward is AMP's largest element-wise op). The same fp32 math
 * on the same widened values as the f32 span, rounded once. Measured on Zen
 * 5, 2 threads, 3.2M elements (T2's fc1): backward f32 0.73 ms; bf16 through
 * converted pieces 1.35 ms, in a loop of 16-bit loads 1.57 ms (GCC gives a
 * loop that mixes 16- and 32-bit values half-width float vectors), in 32-bit
 * pairs 0.78 ms. */
__attribute__((always_inline)) static inline float gelu_forward_one(float v) {
    float pdf;
    return v * vh_gelu_cdf(v, &pdf);
}

VH_CPU_CLONES static void gelu_forward_pairs_bf16(uint32_t *out, const uint32_t *x,
                                                  int64_t pairs) {
#pragma omp simd
    for (int64_t i = 0; i < pairs; i++) {
        const uint32_t xv = x[i];
        const float lo = gelu_forward_one(vh_cpu_bits_f32(xv << 16));
        const float hi = gelu_forward_one(vh_cpu_bits_f32(xv & 0xffff0000u));
        out[i] = vh_cpu_bf16_round32(lo) | (vh_cpu_bf16_round32(hi) << 16);
    }
}

VH_CPU_CLONES static void gelu_forward_span_bf16(uint16_t *out, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    if (((uintptr_t)out | (uintptr_t)x) % 4 == 0) { /* see gelu_backward_pairs_bf16 */
        gelu_forward_pairs_bf16((uint32_t *)(void *)out, (const uint32_t *)(const void *)x,
                                n / 2);
        i = n / 2 * 2;
    }
    for (; i < n; i++) {
        float pdf;
        const float v = vh_cpu_bf16_widen(x[i]);
        out[i] = vh_cpu_bf16_round(v * vh_gelu_cdf(v, &pdf));
    }
}

/* gelu'(x) of bf16 x, for AMP's GELU backward: gelu_grad16.c. */

void vh_cpu_k_gelu_backward_serial(float *dx, const float *x, const float *dout, int64_t n) {
    gelu_backward_span(dx, x, dout, n, 1);
}

/* Pairs (see gelu_grad16.c): two fp32 values in, each
 * output word holds two bf16 results. Measured on Zen 5, 2 threads, T3's
 * fc1 (1576 x 1536) in AMP: 0.63 ms against 1.02 for the GELU pass into fp32
 * scratch and the two conversions after it. */
VH_CPU_CLONES static void gelu_forward_pairs_f32_to_bf16(uint32_t *out, uint32_t *pre,
                                                         const float *t, int64_t pairs) {
#pragma omp simd
    for (int64_t i = 0; i < pairs; i++) {
        const float lo = t[2 * i], hi = t[2 * i + 1];
        pre[i] = vh_cpu_bf16_round32(lo) | (vh_cpu_bf16_round32(hi) << 16);
        out[i] = vh_cpu_bf16_round32(gelu_forward_one(lo)) |
                 (vh_cpu_bf16_round32(gelu_forward_one(hi)) << 16);
    }
}

VH_CPU_CLONES static void gelu_forward_span_f32_to_bf16(uint16_t *out, uint16_t *pre,
                                                        const float *t, int64_t n) {
    int64_t i = 0;
    if (((uintptr_t)out | (uintptr_t)pre) % 4 == 0) {
        gelu_forward_pairs_f32_to_bf16((uint32_t *)(void *)out, (uint32_t *)(void *)pre, t,
                                       n / 2);
        i = n / 2 * 2;
    }
    for (; i < n; i++) {
        pre[i] = vh_cpu_bf16_round(t[i]);
        out[i] = vh_cpu_bf16_round(gelu_forward_one(t[i]));
    }
}

/* gelu16.c's AVX512-BF16 loop where the CPU has it, this file's for the
 * rest (the same bits). */
static void gelu_forward_f32_to_bf16_any(uint16_t *out, uint16_t *pre, const float *t,
                                         int64_t n) {
    const int64_t done = vh_cpu_k_gelu16_forward_f32_to_bf16(out, pre, t, n);
    if (done < n) gelu_forward_span_f32_to_bf16(out + done, pre + done, t + done, n - done);
}

void vh_cpu_k_gelu_forward_f32_to_bf16_serial(uint16_t *out, uint16_t *pre, const float *t,
                                               int64_t n) {
    gelu_forward_f32_to_bf16_any(out, pre, t, n);
}

void vh_cpu_k_gelu_forward_f32_to_bf16(uint16_t *out, uint16_t *pre, const float *t, int64_t n) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++)
        GELU_BLOCKS(n, p, o, m,
                    (prefetch_ahead(t + o, m * 4, 0), prefetch_ahead(out + o, m * 2, 1),
                     prefetch_ahead(pre + o, m * 2, 1)),
                    gelu_forward_f32_to_bf16_any(out + o, pre + o, t + o, m));
}

void vh_cpu_k_gelu_forward_bf16(uint16_t *out, const uint16_t *x, int64_t n) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++)
        GELU_BLOCKS(n, p, o, m, (prefetch_ahead(x + o, m * 2, 0), prefetch_ahead(out + o, m * 2, 1)),
                    gelu_forward_span_bf16(out + o, x + o, m));
}

void vh_cpu_k_gelu_backward_bf16(uint16_t *dx, const uint16_t *x, const uint16_t *dout,
                                 int64_t n, int overwrite) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++)
        GELU_BLOCKS(n, p, o, m,
                    (prefetch_ahead(x + o, m * 2, 0), prefetch_ahead(dout + o, m * 2, 0),
                     prefetch_ahead(dx + o, m * 2, 1)),
                    vh_cpu_k_gelu_backward_bf16_serial(dx + o, x + o, dout + o, m, overwrite));
}

void vh_cpu_k_gelu_forward(float *out, const float *x, int64_t n) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++)
        GELU_BLOCKS(n, p, o, m, (prefetch_ahead(x + o, m * 4, 0), prefetch_ahead(out + o, m * 4, 1)),
                    gelu_forward_span(out + o, x + o, m));
}

void vh_cpu_k_gelu_forward_grad(float *out, float *grad, const float *x, int64_t n) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++)
        GELU_BLOCKS(n, p, o, m,
                    (prefetch_ahead(x + o, m * 4, 0), prefetch_ahead(out + o, m * 4, 1),
                     prefetch_ahead(grad + o, m * 4, 1)),
                    gelu_forward_grad_span(out + o, grad + o, x + o, m));
}

void vh_cpu_k_gelu_backward(float *dx, const float *x, const float *dout, int64_t n,
                            int overwrite) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++)
        GELU_BLOCKS(n, p, o, m,
                    (prefetch_ahead(x + o, m * 4, 0), prefetch_ahead(dout + o, m * 4, 0),
                     prefetch_ahead(dx + o, m * 4, 1)),
                    gelu_backward_span(dx + o, x + o, dout + o, m, overwrite));
}

void vh_cpu_k_add(float *out, const float *a, const float *b, int64_t n) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++) {
        const int64_t o = p * VH_CPU_PIECE;
        add_span(out + o, a + o, b + o, PIECE_LEN(n, p));
    }
}

void vh_cpu_k_mul(float *out, const float *a, const float *b, int64_t n, int32_t accumulate) {
    const int64_t pieces = PIECES(n);
#pragma omp parallel for schedule(static) PAR(n)
    for (int64_t p = 0; p < pieces; p++) {
        const int64_t o = p * VH_CPU_PIECE;
        mul_span(out + o, a + o, b + o, PIECE_LEN(n, p), accumulate);
    }
}

/* Column sums of `rows` rows added to part (cols values), row by row. */
VH_CPU_CLONES static void column_sums(float *part, const float *dout, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = dout + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) part[j] += g[j];
    }
}

/* The same on bf16 rows, widened in registers: the same sums in the same
 * order as column_sums on widened copies, without writing and reading the
 * copies (Zen 5, 2 threads, in-step, interleaved: T1 AMP's bias gradients
 * 0.65-0.68 -> 0.39-0.43 ms a step, T3's 2.9-3.9 -> 1.5-1.9). */
VH_CPU_CLONES static void column_sums_bf16(float *part, const uint16_t *dout, int64_t rows,
                                           int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *g = dout + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) part[j] += vh_cpu_bf16_widen(g[j]);
    }
}

int vh_cpu_k_bias_backward(float *dbias, vh_cpu_rows dout, int64_t rows, int64_t cols) {
    if (rows == 0 || cols == 0) return 0;
    const int64_t chunks = (rows + BIAS_CHUNK_ROWS - 1) / BIAS_CHUNK_ROWS;
    float *part = vh_cpu_scratch_alloc((size_t)chunks * (size_t)cols * sizeof(float));
    if (!part) return -1;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed) PAR(rows * cols)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t r0 = c * BIAS_CHUNK_ROWS;
        const int64_t n = rows - r0 < BIAS_CHUNK_ROWS ? rows - r0 : BIAS_CHUNK_ROWS;
        /* bf16 rows in place; f16 rows widened a few at a time, while they
         * fit L1 (a whole chunk of fc1's 768 columns was 192 KiB); the same
         * sums, in the same order */
        const int64_t step = vh_cpu_rows_block(dout.dtype == VH_DTYPE_F32, n, cols, 1);
        memset(part + c * cols, 0, (size_t)cols * sizeof(float));
        if (dout.dtype == VH_DTYPE_BF16) {
            column_sums_bf16(part + c * cols, (const uint16_t *)dout.p + r0 * cols, n, cols);
            continue;
        }
        for (int64_t s = r0; s < r0 + n; s += step) {
            const int64_t m = r0 + n - s < step ? r0 + n - s : step;
            vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
            const float *g = vh_cpu_rows_load(dout, s, m, cols, 1);
            if (g) column_sums(part + c * cols, g, m, cols);
            failed |= !g;
            vh_cpu_scratch_end(mark);
        }
    }
    if (failed) return -1;
    for (int64_t c = 1; c < chunks; c++) { /* in order */
        const float *pc = part + c * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) part[j] += pc[j];
    }
    for (int64_t j = 0; j < cols; j++) dbias[j] += part[j];
    return 0;
}

VH_CPU_CLONES static void softmax_span(float *p, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) vh_softmax_row(p + r * cols, cols);
}

void vh_cpu_softmax_rows(float *p, int64_t rows, int64_t cols) { softmax_span(p, rows, cols); }

void vh_cpu_k_softmax(float *out, const float *x, int64_t rows, int64_t cols) {
    if (rows == 0 || cols == 0) return;
#pragma omp parallel for schedule(static) PAR(rows * cols)
    for (int64_t r = 0; r < rows; r++) {
        float *row = out + r * cols;
        if (row != x + r * cols) memcpy(row, x + r * cols, (size_t)cols * sizeof(float));
        softmax_span(row, 1, cols);
    }
}

void vh_cpu_k_scale_rows(float *out, const float *in, const float *scale, int64_t rows,
                         int64_t dim, int64_t div, int64_t mod, int32_t accumulate) {
#pragma omp parallel for schedule(static) PAR(rows * dim)
    for (int64_t r = 0; r < rows; r++) {
        const float s = scale[(r / div) % mod];
        const float *src = in + r * dim;
        float *dst = out + r * dim;
        if (accumulate) {
#pragma omp simd
            for (int64_t j = 0; j < dim; j++) dst[j] += src[j] * s;
        } else {
#pragma omp simd
            for (int64_t j = 0; j < dim; j++) dst[j] = src[j] * s;
        }
    }
}

/* keep[i] = u(seed, i) >= p with u the 24-bit uniform of cpu_ops.h's stream
 * mix64(seed); p = 1 drops everything. */
void vh_cpu_k_dropout_forward(float *out, float *mask, const float *x, int64_t n, float p,
                              uint64_t seed) {
    const uint64_t key = vh_splitmix64_mix(seed);
    const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for simd schedule(static) PAR(n)
    for (int64_t i = 0; i < n; i++) {
        const float u = vh_rng_uniform_f32(vh_rng_bits(key, (uint64_t)i));
        const float m = u >= p ? keep_scale : 0.0f;
        const float v = x[i];
        mask[i] = m;
        out[i] = v * m;
    }
}

/* Drop path's per-sample factors (vh_device.h): u_b from the full splitmix64
 * of seed + b, 53 bits in double, the draw vit made on the host before 2.1,
 * so its runs keep their masks bit for bit. */
void vh_cpu_k_drop_path_scale(float *out, int64_t n, float p, uint64_t seed) {
    const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (int64_t b = 0; b < n; b++) {
        const double u = (double)(vh_splitmix64(seed + (uint64_t)b) >> 11) * 0x1.0p-53;
        out[b] = u < p ? 0.0f : keep_scale;
    }
}

/* The op's entry here, not in ops.c: it has no tensor of `dtype` to view or
 * convert (out is always f32), only the arguments to check. */
vh_status vh_cpu_drop_path_scale(vh_device *dev, const vh_eltwise_args *in) {
    (void)dev;
    vh_eltwise_args a;
    if (!in || in->struct_size < offsetof(vh_eltwise_args, stream) ||
        !vh_struct_upgrade(&a, sizeof a, in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a.dtype != VH_DTYPE_F32 || a.n < 0 || !(a.p >= 0.0f && a.p <= 1.0f))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a.n == 0) return VH_STATUS_OK;
    if (!a.out) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_k_drop_path_scale(a.out, a.n, a.p, a.seed);
    return VH_STATUS_OK;
}
