/* tokens.cu - token tensors in either layout: mean pooling, patchify and
 * the embedding (class token, patches, position embedding). Token t of
 * sample b starts at x[b * batch_stride + t * token_stride]; batch-first and
 * batch-second differ only in the strides. The CPU twin is
 * sdk/src/cpu/tokens.c (math) and ops.c (checks).
 *
 * Every kernel is a grid-stride loop with one output element per thread;
 * the one sum over the batch (dpos, dcls) is one thread per (token, d)
 * adding the samples in order, so it is deterministic and matches the CPU's
 * order. */
#include "cuda_internal.h"
#include "reduce.cuh"

/* Thread (b, d) sums tokens first..first+count-1 of sample b in order. */
__global__ static void mean_pool_forward_kernel(void *out, const void *x, int32_t dt,
                                                int64_t batch, int64_t first, int64_t count,
                                                int64_t dim, int64_t bs, int64_t ts, float inv) {
    VH_CUDA_GRID_LOOP(i, batch * dim) {
        const int64_t b = i / dim, d = i % dim;
        float s = 0.0f;
        for (int64_t t = first; t < first + count; t++)
            s += vh_cuda_load(x, dt, b * bs + t * ts + d);
        vh_cuda_store(out, dt, i, s * inv);
    }
}

/* Thread (b, k, d): token first + k of sample b gets dout[b][d] / count. */
__global__ static void mean_pool_backward_kernel(void *dx, const void *dout, int32_t dt,
                                                 int64_t batch, int64_t first, int64_t count,
                                                 int64_t dim, int64_t bs, int64_t ts, float inv) {
    VH_CUDA_GRID_LOOP(i, batch * count * dim) {
        const int64_t d = i % dim, k = (i / dim) % count, b = i / (dim * count);
        const int64_t at = b * bs + (first + k) * ts + d;
        const float g = vh_cuda_load(dout, dt, b * dim + d) * inv;
        vh_cuda_store(dx, dt, at, vh_cuda_load(dx, dt, at) + g);
    }
}

/* Thread (b, p, k): value k = (c, py, px) of patch p = (gy, gx) of sample b. */
__global__ static void patchify_kernel(void *out, int32_t dt, const void *images, int32_t idt,
                                       int64_t batch, int64_t channels, int64_t height,
                                       int64_t width, int64_t patch, int64_t bs, int64_t ts) {
    const int64_t gw = width / patch, np = (height / patch) * gw;
    const int64_t kk = channels * patch * patch;
    VH_CUDA_GRID_LOOP(i, batch * np * kk) {
        const int64_t k = i % kk, p = (i / kk) % np, b = i / (kk * np);
        const int64_t c = k / (patch * patch), py = (k / patch) % patch, px = k % patch;
        const int64_t y = (p / gw) * patch + py, xx = (p % gw) * patch + px;
        const float v = vh_cuda_load(images, idt, ((b * channels + c) * height + y) * width + xx);
        vh_cuda_store(out, dt, b * bs + p * ts + k, v);
    }
}

/* Thread (b, t, d): token t of sample b = (cls or patch t - off) + pos[t]. */
__global__ static void embed_forward_kernel(void *out, const void *patches, const void *cls,
                                            const void *pos, int32_t dt, int32_t pdt,
                                            int64_t batch, int64_t tokens, int64_t off,
                                            int64_t dim, int64_t bs, int64_t ts, int64_t pbs,
                                            int64_t pts) {
    VH_CUDA_GRID_LOOP(i, batch * tokens * dim) {
        const int64_t d = i % dim, t = (i / dim) % tokens, b = i / (dim * tokens);
        const float src = t < off ? vh_cuda_load(cls, pdt, d)
                                  : vh_cuda_load(patches, dt, b * pbs + (t - off) * pts + d);
        vh_cuda_store(out, dt, b * bs + t * ts + d, src + vh_cuda_load(pos, pdt, t * dim + d));
    }
}

/* Thread (t, d) walks the samples in order: dpatches (or dcls for the class
 * token) and dpos accumulate; dpos and dcls are rounded once, at the end. */
__global__ static void embed_backward_kernel(void *dpatches, void *dcls, void *dpos,
                                             const void *dout, int32_t dt, int32_t gdt,
                                             int64_t batch, int64_t tokens, int64_t off,
                                             int64_t dim, int64_t bs, int64_t ts, int64_t pbs,
                                             int64_t pts) {
    VH_CUDA_GRID_LOOP(i, tokens * dim) {
        const int64_t d = i % dim, t = i / dim;
        float dp = vh_cuda_load(dpos, gdt, i);
        float dc = t < off ? vh_cuda_load(dcls, gdt, d) : 0.0f;
        for (int64_t b = 0; b < batch; b++) {
            const float g = vh_cuda_load(dout, dt, b * bs + t * ts + d);
            if (t < off) {
                dc += g;
            } else {
                const int64_t at = b * pbs + (t - off) * pts + d;
                vh_cuda_store(dpatches, dt, at, vh_cuda_load(dpatches, dt, at) + g);
            }
            dp += g;
        }
        if (t < off) vh_cuda_store(dcls, gdt, d, dc);
        vh_cuda_store(dpos, gdt, i, dp);
    }
}

/* ---- checks: ops.c's read_args, dtypes and plans ------------------------------- */

static int tok_read(const vh_tokens_args *in, vh_tokens_args *a) {
    return VH_CUDA_READ_ARGS(vh_tokens_args, in, *a) && vh_cuda_is_float(a->dtype) &&
           vh_cuda_is_float(a->param_dtype) && vh_cuda_is_float(a->grad_dtype) &&
           vh_cuda_is_float(a->image_dtype) && a->batch >= 0 && a->dim >= 0 &&
           a->batch_stride >= 0 && a->token_stride >= 0;
}

/* 1: run; 0: return *st (OK when there is nothing to pool). */
static int mean_pool_begin(const vh_tokens_args *in, vh_tokens_args *a, vh_status *st) {
    *st = VH_STATUS_ERR_INVALID_ARG;
    if (!tok_read(in, a) || a->first < 0 || a->count <= 0) return 0;
    *st = VH_STATUS_OK;
    return a->batch > 0 && a->dim > 0;
}

/* T tokens (the patches after the class token where there is one). */
static int embed_begin(const vh_tokens_args *in, vh_tokens_args *a, vh_status *st,
                       int backward) {
    *st = VH_STATUS_ERR_INVALID_ARG;
    if (!tok_read(in, a) || a->num_patches < 0 || a->patch_batch_stride < 0 ||
        a->patch_token_stride < 0)
        return 0;
    const int has_cls = backward ? a->dcls != NULL : a->cls != NULL;
    const void *patches = backward ? a->dpatches : a->patches;
    if (a->batch == 0 || a->num_patches + has_cls == 0 || a->dim == 0) {
        *st = VH_STATUS_OK;
        return 0;
    }
    return !(a->num_patches > 0 && !patches);
}

/* ---- the ops ------------------------------------------------------------------- */

vh_status vh_cuda_mean_pool_forward(vh_device *dev, const vh_tokens_args *in) {
    vh_tokens_args a;
    vh_status st;
    if (!mean_pool_begin(in, &a, &st)) return st;
    if (!a.out || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    mean_pool_forward_kernel<<<vh_cuda_eltwise_blocks(a.batch * a.dim), VH_CUDA_THREADS, 0,
                               vh_cuda_stream(dev, a.stream)>>>(
        a.out, a.x, a.dtype, a.batch, a.first, a.count, a.dim, a.batch_stride, a.token_stride,
        1.0f / (float)a.count);
    return vh_cuda_launched();
}

vh_status vh_cuda_mean_pool_backward(vh_device *dev, const vh_tokens_args *in) {
    vh_tokens_args a;
    vh_status st;
    if (!mean_pool_begin(in, &a, &st)) return st;
    if (!a.dx || !a.dout) return VH_STATUS_ERR_INVALID_ARG;
    mean_pool_backward_kernel<<<vh_cuda_eltwise_blocks(a.batch * a.count * a.dim),
                                VH_CUDA_THREADS, 0, vh_cuda_stream(dev, a.stream)>>>(
        a.dx, a.dout, a.dtype, a.batch, a.first, a.count, a.dim, a.batch_stride, a.token_stride,
        1.0f / (float)a.count);
    return vh_cuda_launched();
}

vh_status vh_cuda_patchify(vh_device *dev, const vh_tokens_args *in) {
    vh_tokens_args a;
    if (!tok_read(in, &a) || a.channels < 0 || a.height < 0 || a.width < 0 || a.patch <= 0 ||
        a.height % a.patch || a.width % a.patch)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t np = (a.height / a.patch) * (a.width / a.patch);
    if (a.batch == 0 || a.channels == 0 || np == 0) return VH_STATUS_OK;
    if (!a.out || !a.images) return VH_STATUS_ERR_INVALID_ARG;
    patchify_kernel<<<vh_cuda_eltwise_blocks(a.batch * np * a.channels * a.patch * a.patch),
                      VH_CUDA_THREADS, 0, vh_cuda_stream(dev, a.stream)>>>(
        a.out, a.dtype, a.images, a.image_dtype, a.batch, a.channels, a.height, a.width, a.patch,
        a.batch_stride, a.token_stride);
    return vh_cuda_launched();
}

vh_status vh_cuda_embed_forward(vh_device *dev, const vh_tokens_args *in) {
    vh_tokens_args a;
    vh_status st;
    if (!embed_begin(in, &a, &st, 0)) return st;
    if (!a.out || !a.pos) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t off = a.cls ? 1 : 0, tokens = a.num_patches + off;
    embed_forward_kernel<<<vh_cuda_eltwise_blocks(a.batch * tokens * a.dim), VH_CUDA_THREADS, 0,
                           vh_cuda_stream(dev, a.stream)>>>(
        a.out, a.patches, a.cls, a.pos, a.dtype, a.param_dtype, a.batch, tokens, off, a.dim,
        a.batch_stride, a.token_stride, a.patch_batch_stride, a.patch_token_stride);
    return vh_cuda_launched();
}

vh_status vh_cuda_embed_backward(vh_device *dev, const vh_tokens_args *in) {
    vh_tokens_args a;
    vh_status st;
    if (!embed_begin(in, &a, &st, 1)) return st;
    if (!a.dpos || !a.dout) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t off = a.dcls ? 1 : 0, tokens = a.num_patches + off;
    embed_backward_kernel<<<vh_cuda_eltwise_blocks(tokens * a.dim), VH_CUDA_THREADS, 0,
                            vh_cuda_stream(dev, a.stream)>>>(
        a.dpatches, a.dcls, a.dpos, a.dout, a.dtype, a.grad_dtype, a.batch, tokens, off, a.dim,
        a.batch_stride, a.token_stride, a.patch_batch_stride, a.patch_token_stride);
    return vh_cuda_launched();
}
