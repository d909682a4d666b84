/* tokens.c - token tensors in either layout: patchify, embedding assembly
 * (class token, patches, position embedding) and mean pooling.
 * Token t of sample b starts at x[b * batch_stride + t * token_stride].
 * fp32 kernels: ops.c reads the arguments and converts other dtypes. */
#include <string.h>

#include "cpu_ops.h"

void vh_cpu_k_mean_pool_forward(float *out, const float *x, int64_t batch,
                                int64_t first, int64_t count, int64_t dim,
                                int64_t batch_stride, int64_t token_stride) {
    const float inv = 1.0f / (float)count;
#pragma omp parallel for schedule(static) if (batch * count * dim > VH_CPU_PAR_ELEMS)
    for (int64_t b = 0; b < batch; b++) {
        float *o = out + b * dim;
        memset(o, 0, (size_t)dim * sizeof(float));
        for (int64_t t = first; t < first + count; t++) {
            const float *xt = x + b * batch_stride + t * token_stride;
#pragma omp simd
            for (int64_t d = 0; d < dim; d++) o[d] += xt[d];
        }
        for (int64_t d = 0; d < dim; d++) o[d] *= inv;
    }
}

void vh_cpu_k_mean_pool_backward(float *dx, const float *dout,
                                 int64_t batch, int64_t first, int64_t count, int64_t dim,
                                 int64_t batch_stride, int64_t token_stride) {
    const float inv = 1.0f / (float)count;
#pragma omp parallel for schedule(static) if (batch * count * dim > VH_CPU_PAR_ELEMS)
    for (int64_t b = 0; b < batch; b++) {
        const float *g = dout + b * dim;
        for (int64_t t = first; t < first + count; t++) {
            float *dt = dx + b * batch_stride + t * token_stride;
#pragma omp simd
            for (int64_t d = 0; d < dim; d++) dt[d] += g[d] * inv;
        }
    }
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

void vh_cpu_k_embed_forward(float *x, const float *patches,
                            const float *cls, const float *pos, int64_t batch,
                            int64_t num_patches, int64_t dim, int64_t batch_stride,
                            int64_t token_stride, int64_t patch_batch_stride,
                            int64_t patch_token_stride) {
    const int64_t off = cls ? 1 : 0, tokens = num_patches + off;
#pragma omp parallel for schedule(static) if (batch * tokens * dim > VH_CPU_PAR_ELEMS)
    for (int64_t bt = 0; bt < batch * tokens; bt++) {
        const int64_t b = bt / tokens, t = bt % tokens;
        const float *src =
            t < off ? cls : patches + b * patch_batch_stride + (t - off) * patch_token_stride;
        const float *pt = pos + t * dim;
        float *dst = x + b * batch_stride + t * token_stride;
#pragma omp simd
        for (int64_t d = 0; d < dim; d++) dst[d] = src[d] + pt[d];
    }
}

/* Parallel over tokens: each token's dpos (and dcls) sums samples in order. */
void vh_cpu_k_embed_backward(float *dpatches, float *dcls, float *dpos,
                             const float *dx, int64_t batch, int64_t num_patches,
                             int64_t dim, int64_t batch_stride, int64_t token_stride,
                             int64_t patch_batch_stride, int64_t patch_token_stride) {
    const int64_t off = dcls ? 1 : 0, tokens = num_patches + off;
#pragma omp parallel for schedule(static) if (batch * tokens * dim > VH_CPU_PAR_ELEMS)
    for (int64_t t = 0; t < tokens; t++) {
        float *dp = dpos + t * dim;
        float *dc = t < off ? dcls : NULL;
        for (int64_t b = 0; b < batch; b++) {
            const float *g = dx + b * batch_stride + t * token_stride;
            float *dpt = t < off ? NULL
                                 : dpatches + b * patch_batch_stride +
                                       (t - off) * patch_token_stride;
            if (dc) {
#pragma omp simd
                for (int64_t d = 0; d < dim; d++) dc[d] += g[d];
            } else {
#pragma omp simd
                for (int64_t d = 0; d < dim; d++) dpt[d] += g[d];
            }
#pragma omp simd
            for (int64_t d = 0; d < dim; d++) dp[d] += g[d];
        }
    }
}
