/* tokens.c - token tensors in either layout: patchify, embedding assembly
 * (class token, patches, position embedding) and mean pooling.
 * Token t of sample b starts at x[b * batch_stride + t * token_stride].
 * fp32 kernels, and the same kernels on bf16 tensors as stored, for calls
 * whose every tensor is bf16 (AMP's): each value widened as it is read,
 * summed in f32 in the same order, and rounded once as it is stored, so the
 * bits of ops.c's fp32 copies without their passes over whole tensors.
 * T1 AMP (Zen 5, 2 threads, `vithost bench --ops`, 3 interleaved pairs, a
 * slow hour): embed, pooling and their backward 0.45-0.51 -> 0.11-0.14 ms a
 * step (fp32's: 0.16). patchify (f32 images) keeps ops.c's copies: a row at
 * a time it was no faster. */
#include <string.h>

#include "cpu_ops.h"

/* Columns summed at a time in registers or L1 (a row of partial sums). */
#define TK_COLS 256

/* Element `offset` of a tensor as stored (a token's row: b * batch_stride +
 * t * token_stride). */
__attribute__((always_inline)) static inline void *tk_at(const void *p, int64_t offset, int bf) {
    return (char *)(uintptr_t)p + offset * (bf ? 2 : 4);
}

/* The row loops, built for each ISA (VH_CPU_CLONES: the baseline's SSE2
 * took as long for a bf16 row as ops.c's copies did), each for both
 * storages: y = a + b; acc += x; y += x s; y = acc. No product is fused
 * into an add (this file is not built with -ffp-contract=fast), so every
 * clone gives the same bits. */
#define TK_ROW(bf_, body_)                                                                \
    do {                                                                                  \
        if (bf_) {                                                                        \
            const int bf = 1;                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) body_;                    \
        } else {                                                                          \
            const int bf = 0;                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) body_;                    \
        }                                                                                 \
    } while (0)

VH_CPU_CLONES static void row_add(void *y, const void *a, const void *b, int64_t n, int bf16) {
    TK_ROW(bf16, vh_cpu_store_as(y, i, vh_cpu_load_as(a, i, bf) + vh_cpu_load_as(b, i, bf), bf));
}

VH_CPU_CLONES static void row_sum_into(float *acc, const void *x, int64_t n, int bf16) {
    TK_ROW(bf16, acc[i] += vh_cpu_load_as(x, i, bf));
}

VH_CPU_CLONES static void row_add_scaled(void *y, const void *x, float s, int64_t n, int bf16) {
    TK_ROW(bf16,
           vh_cpu_store_as(y, i, vh_cpu_load_as(y, i, bf) + vh_cpu_load_as(x, i, bf) * s, bf));
}

VH_CPU_CLONES static void row_add_to(void *y, const void *x, int64_t n, int bf16) {
    TK_ROW(bf16, vh_cpu_store_as(y, i, vh_cpu_load_as(y, i, bf) + vh_cpu_load_as(x, i, bf), bf));
}

VH_CPU_CLONES static void row_store(void *y, const float *acc, int64_t n, int bf16) {
    TK_ROW(bf16, vh_cpu_store_as(y, i, acc[i], bf));
}

VH_CPU_CLONES static void row_load(float *acc, const void *x, int64_t n, int bf16) {
    TK_ROW(bf16, acc[i] = vh_cpu_load_as(x, i, bf));
}

/* out (batch, dim) = the mean of tokens first .. first + count - 1: each
 * column summed from 0 in token order, then times 1/count. */
__attribute__((always_inline)) static inline void mean_pool_forward(
    void *out, const void *x, int64_t batch, int64_t first, int64_t count, int64_t dim,
    int64_t batch_stride, int64_t token_stride, int bf) {
    const float inv = 1.0f / (float)count;
#pragma omp parallel for schedule(static) if (batch * count * dim > VH_CPU_PAR_ELEMS)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t d0 = 0; d0 < dim; d0 += TK_COLS) {
            const int64_t w = dim - d0 < TK_COLS ? dim - d0 : TK_COLS;
            float acc[TK_COLS];
            memset(acc, 0, sizeof acc);
            for (int64_t t = first; t < first + count; t++)
                row_sum_into(acc, tk_at(x, b * batch_stride + t * token_stride + d0, bf), w, bf);
            for (int64_t d = 0; d < w; d++) acc[d] *= inv;
            row_store(tk_at(out, b * dim + d0, bf), acc, w, bf);
        }
}

/* dx[token] += dout / count for each pooled token. */
__attribute__((always_inline)) static inline void mean_pool_backward(
    void *dx, const void *dout, int64_t batch, int64_t first, int64_t count, int64_t dim,
    int64_t batch_stride, int64_t token_stride, int bf) {
    const float inv = 1.0f / (float)count;
#pragma omp parallel for schedule(static) if (batch * count * dim > VH_CPU_PAR_ELEMS)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = first; t < first + count; t++)
            row_add_scaled(tk_at(dx, b * batch_stride + t * token_stride, bf),
                           tk_at(dout, b * dim, bf), inv, dim, bf);
}

void vh_cpu_k_mean_pool_forward(float *out, const float *x, int64_t batch,
                                int64_t first, int64_t count, int64_t dim,
                                int64_t batch_stride, int64_t token_stride) {
    mean_pool_forward(out, x, batch, first, count, dim, batch_stride, token_stride, 0);
}

void vh_cpu_k_mean_pool_forward_bf16(uint16_t *out, const uint16_t *x, int64_t batch,
                                     int64_t first, int64_t count, int64_t dim,
                                     int64_t batch_stride, int64_t token_stride) {
    mean_pool_forward(out, x, batch, first, count, dim, batch_stride, token_stride, 1);
}

void vh_cpu_k_mean_pool_backward(float *dx, const float *dout,
                                 int64_t batch, int64_t first, int64_t count, int64_t dim,
                                 int64_t batch_stride, int64_t token_stride) {
    mean_pool_backward(dx, dout, batch, first, count, dim, batch_stride, token_stride, 0);
}

void vh_cpu_k_mean_pool_backward_bf16(uint16_t *dx, const uint16_t *dout, int64_t batch,
                                      int64_t first, int64_t count, int64_t dim,
                                      int64_t batch_stride, int64_t token_stride) {
    mean_pool_backward(dx, dout, batch, first, count, dim, batch_stride, token_stride, 1);
}

void vh_cpu_k_patchify(float *out, const float *images, int64_t batch,
                       int64_t channels, int64_t height, int64_t width, int64_t patch,
                       int64_t batch_stride, int64_t token_stride) {
    const int64_t gh = height / patch, gw = width / patch, np = gh * gw;
    const size_t run = (size_t)patch * sizeof(float); /* one patch row of one channel */
#pragma omp parallel for schedule(static) \
    if (batch * channels * height * width > VH_CPU_PAR_ELEMS)
    for (int64_t bp = 0; bp < batch * np; bp++) {
        const int64_t b = bp / np, p = bp % np, gy = p / gw, gx = p % gw;
        float *row = out + b * batch_stride + p * token_stride;
        for (int64_t c = 0; c < channels; c++) {
            const float *img = images + ((b * channels + c) * height + gy * patch) * width +
                               gx * patch;
            for (int64_t py = 0; py < patch; py++)
                memcpy(row + (c * patch + py) * patch, img + py * width, run);
        }
    }
}

/* x[token] = (cls, or the patch) + pos[token]. */
__attribute__((always_inline)) static inline void embed_forward(
    void *x, const void *patches, const void *cls, const void *pos, int64_t batch,
    int64_t num_patches, int64_t dim, int64_t batch_stride, int64_t token_stride,
    int64_t patch_batch_stride, int64_t patch_token_stride, int bf) {
    const int64_t off = cls ? 1 : 0, tokens = num_patches + off;
#pragma omp parallel for schedule(static) if (batch * tokens * dim > VH_CPU_PAR_ELEMS)
    for (int64_t bt = 0; bt < batch * tokens; bt++) {
        const int64_t b = bt / tokens, t = bt % tokens;
        const void *src = t < off ? cls
                                  : tk_at(patches,
                                          b * patch_batch_stride + (t - off) * patch_token_stride,
                                          bf);
        row_add(tk_at(x, b * batch_stride + t * token_stride, bf), src, tk_at(pos, t * dim, bf),
                dim, bf);
    }
}

/* Parallel over tokens: each token's dpos (and dcls) sums samples in order,
 * from its stored value, in f32, and is stored once; each dpatch is added
 * to once. */
__attribute__((always_inline)) static inline void embed_backward(
    void *dpatches, void *dcls, void *dpos, const void *dx, int64_t batch, int64_t num_patches,
    int64_t dim, int64_t batch_stride, int64_t token_stride, int64_t patch_batch_stride,
    int64_t patch_token_stride, int bf) {
    const int64_t off = dcls ? 1 : 0, tokens = num_patches + off;
#pragma omp parallel for schedule(static) if (batch * tokens * dim > VH_CPU_PAR_ELEMS)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t d0 = 0; d0 < dim; d0 += TK_COLS) {
            const int64_t w = dim - d0 < TK_COLS ? dim - d0 : TK_COLS;
            void *dp = tk_at(dpos, t * dim + d0, bf);
            void *dc = t < off ? tk_at(dcls, d0, bf) : NULL;
            float acc_p[TK_COLS], acc_c[TK_COLS];
            row_load(acc_p, dp, w, bf);
            if (dc) row_load(acc_c, dc, w, bf);
            for (int64_t b = 0; b < batch; b++) {
                const void *g = tk_at(dx, b * batch_stride + t * token_stride + d0, bf);
                if (dc)
                    row_sum_into(acc_c, g, w, bf);
                else
                    row_add_to(tk_at(dpatches,
                                     b * patch_batch_stride + (t - off) * patch_token_stride + d0,
                                     bf),
                               g, w, bf);
                row_sum_into(acc_p, g, w, bf);
            }
            row_store(dp, acc_p, w, bf);
            if (dc) row_store(dc, acc_c, w, bf);
        }
}

void vh_cpu_k_embed_forward(float *x, const float *patches, const float *cls, const float *pos,
                            int64_t batch, int64_t num_patches, int64_t dim, int64_t batch_stride,
                            int64_t token_stride, int64_t patch_batch_stride,
                            int64_t patch_token_stride) {
    embed_forward(x, patches, cls, pos, batch, num_patches, dim, batch_stride, token_stride,
                  patch_batch_stride, patch_token_stride, 0);
}

void vh_cpu_k_embed_forward_bf16(uint16_t *x, const uint16_t *patches, const uint16_t *cls,
                                 const uint16_t *pos, int64_t batch, int64_t num_patches,
                                 int64_t dim, int64_t batch_stride, int64_t token_stride,
                                 int64_t patch_batch_stride, int64_t patch_token_stride) {
    embed_forward(x, patches, cls, pos, batch, num_patches, dim, batch_stride, token_stride,
                  patch_batch_stride, patch_token_stride, 1);
}

void vh_cpu_k_embed_backward(float *dpatches, float *dcls, float *dpos, const float *dx,
                             int64_t batch, int64_t num_patches, int64_t dim,
                             int64_t batch_stride, int64_t token_stride,
                             int64_t patch_batch_stride, int64_t patch_token_stride) {
    embed_backward(dpatches, dcls, dpos, dx, batch, num_patches, dim, batch_stride, token_stride,
                   patch_batch_stride, patch_token_stride, 0);
}

void vh_cpu_k_embed_backward_bf16(uint16_t *dpatches, uint16_t *dcls, uint16_t *dpos,
                                  const uint16_t *dx, int64_t batch, int64_t num_patches,
                                  int64_t dim, int64_t batch_stride, int64_t token_stride,
                                  int64_t patch_batch_stride, int64_t patch_token_stride) {
    embed_backward(dpatches, dcls, dpos, dx, batch, num_patches, dim, batch_stride, token_stride,
                   patch_batch_stride, patch_token_stride, 1);
}
