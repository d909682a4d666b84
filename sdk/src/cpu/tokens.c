/* tokens.c - token tensors in either layout: patchify, embedding assembly
 * (class token, patches, position embedding) and mean pooling.
 * Token t of sample b starts at x[b * batch_stride + t * token_stride]. */
#include <string.h>

#include "cpu_ops.h"

vh_status vh_cpu_mean_pool_forward(vh_device *dev, float *out, const float *x, int64_t batch,
                                   int64_t first, int64_t count, int64_t dim,
                                   int64_t batch_stride, int64_t token_stride) {
    (void)dev;
    if (batch < 0 || first < 0 || count <= 0 || dim < 0 || batch_stride < 0 || token_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    if (batch == 0 || dim == 0) return VH_STATUS_OK;
    if (!out || !x) return VH_STATUS_ERR_INVALID_ARG;
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
    return VH_STATUS_OK;
}

vh_status vh_cpu_mean_pool_backward(vh_device *dev, float *dx, const float *dout,
                                    int64_t batch, int64_t first, int64_t count, int64_t dim,
                                    int64_t batch_stride, int64_t token_stride) {
    (void)dev;
    if (batch < 0 || first < 0 || count <= 0 || dim < 0 || batch_stride < 0 || token_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    if (batch == 0 || dim == 0) return VH_STATUS_OK;
    if (!dx || !dout) return VH_STATUS_ERR_INVALID_ARG;
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
    return VH_STATUS_OK;
}

vh_status vh_cpu_patchify(vh_device *dev, float *out, const float *images, int64_t batch,
                          int64_t channels, int64_t height, int64_t width, int64_t patch,
                          int64_t batch_stride, int64_t token_stride) {
    (void)dev;
    if (batch < 0 || channels < 0 || height < 0 || width < 0 || patch <= 0 ||
        batch_stride < 0 || token_stride < 0 || height % patch || width % patch)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t gh = height / patch, gw = width / patch, np = gh * gw;
    if (batch == 0 || channels == 0 || np == 0) return VH_STATUS_OK;
    if (!out || !images) return VH_STATUS_ERR_INVALID_ARG;
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
    return VH_STATUS_OK;
}

vh_status vh_cpu_embed_forward(vh_device *dev, float *x, const float *patches,
                               const float *cls, const float *pos, int64_t batch,
                               int64_t num_patches, int64_t dim, int64_t batch_stride,
                               int64_t token_stride, int64_t patch_batch_stride,
                               int64_t patch_token_stride) {
    (void)dev;
    if (batch < 0 || num_patches < 0 || dim < 0 || batch_stride < 0 || token_stride < 0 ||
        patch_batch_stride < 0 || patch_token_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t off = cls ? 1 : 0, tokens = num_patches + off;
    if (batch == 0 || tokens == 0 || dim == 0) return VH_STATUS_OK;
    if (!x || !pos || (num_patches > 0 && !patches)) return VH_STATUS_ERR_INVALID_ARG;
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
    return VH_STATUS_OK;
}

/* Parallel over tokens: each token's dpos (and dcls) sums samples in order. */
vh_status vh_cpu_embed_backward(vh_device *dev, float *dpatches, float *dcls, float *dpos,
                                const float *dx, int64_t batch, int64_t num_patches,
                                int64_t dim, int64_t batch_stride, int64_t token_stride,
                                int64_t patch_batch_stride, int64_t patch_token_stride) {
    (void)dev;
    if (batch < 0 || num_patches < 0 || dim < 0 || batch_stride < 0 || token_stride < 0 ||
        patch_batch_stride < 0 || patch_token_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t off = dcls ? 1 : 0, tokens = num_patches + off;
    if (batch == 0 || tokens == 0 || dim == 0) return VH_STATUS_OK;
    if (!dx || !dpos || (num_patches > 0 && !dpatches)) return VH_STATUS_ERR_INVALID_ARG;
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
    return VH_STATUS_OK;
}
