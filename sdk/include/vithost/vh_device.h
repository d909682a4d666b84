/* vh_device.h - the operations of one compute device (CPU or CUDA).
 *
 * A plugin never asks "am I on a GPU?": it calls the ops of the device the
 * recipe chose (vh_host_api.device) and gets the CPU or the CUDA version.
 * The CPU table lives in the SDK runtime; the CUDA table lives in its own
 * shared object (libvh_cuda.so) that the host loads only when `run.device`
 * is cuda, so a CUDA build still runs on a machine with no GPU or driver.
 *
 * Append-only: new ops are added at the end in later minor versions; check
 * struct_size before using a member newer than your minor. A NULL op means
 * the device does not have it (yet): refuse that device with
 * VH_STATUS_ERR_UNSUPPORTED rather than fall back silently.
 */
#ifndef VITHOST_VH_DEVICE_H
#define VITHOST_VH_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "vh_status.h"
#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vh_device vh_device; /* opaque per-device state */

typedef enum vh_copy_kind {
    VH_COPY_KIND_HOST_TO_DEVICE = 0,
    VH_COPY_KIND_DEVICE_TO_HOST = 1,
    VH_COPY_KIND_DEVICE_TO_DEVICE = 2,
} vh_copy_kind;

/* Arguments of a (batched) GEMM, row-major:
 *   C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] (+ bias broadcast over rows)
 * for i < batch, with op(X) = X or X^T, op(A) m x k, op(B) k x n, C m x n.
 * A struct so that later minors can append fields (dtypes, epilogues) without
 * a new function; zero-initialise it and set struct_size = sizeof. */
typedef struct vh_gemm_args {
    uint32_t struct_size;
    int32_t trans_a, trans_b; /* 0: as stored, 1: transposed */
    int64_t m, n, k;
    float alpha, beta;
    const float *a;
    int64_t lda, stride_a;    /* stride_*: elements between batch members */
    const float *b;
    int64_t ldb, stride_b;
    float *c;
    int64_t ldc, stride_c;
    int64_t batch;            /* 0 or 1: one GEMM */
    const float *bias;        /* n values added to every row of C, or NULL */
} vh_gemm_args;

/* Multi-head self-attention over a packed qkv tensor, any layout.
 *
 * Element (b, t, which, h, d) of qkv (which: 0 q, 1 k, 2 v; d < head_dim) is at
 *   qkv[b * qkv_batch_stride + t * qkv_token_stride + which * heads * head_dim
 *       + h * head_dim + d]
 * and element (b, t, h, d) of out/dout at
 *   out[b * out_batch_stride + t * out_token_stride + h * head_dim + d].
 * Batch-first (B, N, 3D): batch stride N*3D, token stride 3D. Batch-second
 * (N, B, 3D): batch stride 3D, token stride B*3D. The layout is only strides:
 * nothing is transposed.
 *
 * probs (batch, heads, tokens, tokens) keeps the softmax for backward. */
typedef struct vh_attention_args {
    uint32_t struct_size;
    int64_t batch, tokens, heads, head_dim;
    int64_t qkv_batch_stride, qkv_token_stride;
    int64_t out_batch_stride, out_token_stride;
    float scale;              /* usually 1/sqrt(head_dim) */
    const float *qkv;
    float *out;               /* forward writes */
    float *probs;
    const float *dout;        /* backward reads */
    float *dqkv;              /* backward accumulates (+=) */
} vh_attention_args;

typedef struct vh_device_ops {
    uint32_t struct_size;  /* sizeof(vh_device_ops) of the provider */
    vh_device_kind kind;
    const char *name;      /* "cpu", "cuda:0" */
    vh_device *device;     /* first argument of every op below */

    /* Device memory, aligned to at least 64 bytes. */
    vh_status (*alloc)(vh_device *dev, size_t bytes, void **out);
    void (*free)(vh_device *dev, void *ptr);
    vh_status (*copy)(vh_device *dev, void *dst, const void *src, size_t bytes,
                      vh_copy_kind kind);
    vh_status (*memset_zero)(vh_device *dev, void *ptr, size_t bytes);
    /* Wait until every op issued so far has finished. */
    vh_status (*synchronize)(vh_device *dev);
    /* Element conversion between storage types (f32 <-> f16 <-> bf16);
     * rounds to nearest even. */
    vh_status (*convert)(vh_device *dev, void *dst, vh_dtype dst_dtype,
                         const void *src, vh_dtype src_dtype, size_t count);

    /* ---- compute ops, fp32 (ABI 1.0); NULL where a device lacks one -----
     * Conventions: pointers are device memory; shapes use DESIGN.md's
     * letters; forward ops overwrite their outputs; backward ops ACCUMULATE
     * (+=) into every gradient they write, activations' and parameters'
     * alike, so residual branches and shared tensors need no extra adds. */

    vh_status (*gemm)(vh_device *dev, const vh_gemm_args *args);

    /* Per row of dim values: out = (x - mean) * rstd * weight + bias;
     * mean and rstd (rows values each) are kept for backward. */
    vh_status (*layernorm_forward)(vh_device *dev, float *out, float *mean, float *rstd,
                                   const float *x, const float *weight, const float *bias,
                                   int64_t rows, int64_t dim, float eps);
    vh_status (*layernorm_backward)(vh_device *dev, float *dx, float *dweight,
                                    float *dbias, const float *dout, const float *x,
                                    const float *weight, const float *mean,
                                    const float *rstd, int64_t rows, int64_t dim);

    /* GELU with erf (not the tanh approximation), as timm's nn.GELU. */
    vh_status (*gelu_forward)(vh_device *dev, float *out, const float *x, int64_t n);
    vh_status (*gelu_backward)(vh_device *dev, float *dx, const float *x,
                               const float *dout, int64_t n);

    /* out = a + b, element-wise (out may alias a or b). */
    vh_status (*add)(vh_device *dev, float *out, const float *a, const float *b, int64_t n);
    /* dbias[j] += sum over rows of dout[r][j]. */
    vh_status (*bias_backward)(vh_device *dev, float *dbias, const float *dout,
                               int64_t rows, int64_t cols);

    /* Row-wise softmax in place over cols values. */
    vh_status (*softmax)(vh_device *dev, float *x, int64_t rows, int64_t cols);

    vh_status (*attention_forward)(vh_device *dev, const vh_attention_args *args);
    vh_status (*attention_backward)(vh_device *dev, const vh_attention_args *args);

    /* Mean softmax cross-entropy of (B, C) logits with label smoothing s
     * (target: 1 - s on the label, s / C everywhere); *loss is written in
     * host memory. When dlogits is not NULL it accumulates
     * dloss_scale * d(mean loss)/d(logits). */
    vh_status (*softmax_cross_entropy)(vh_device *dev, float *loss, float *dlogits,
                                       const float *logits, const int32_t *labels,
                                       int64_t batch, int64_t classes, float smoothing,
                                       float dloss_scale);

    /* Token tensors in either layout: token t of sample b at
     * x[b * batch_stride + t * token_stride], dim values each.
     * out[b] = mean of tokens first..first+count-1 of sample b. */
    vh_status (*mean_pool_forward)(vh_device *dev, float *out, const float *x,
                                   int64_t batch, int64_t first, int64_t count,
                                   int64_t dim, int64_t batch_stride, int64_t token_stride);
    vh_status (*mean_pool_backward)(vh_device *dev, float *dx, const float *dout,
                                    int64_t batch, int64_t first, int64_t count,
                                    int64_t dim, int64_t batch_stride, int64_t token_stride);

    /* (B, C, H, W) images to patch rows of C*P*P values ordered (c, py, px),
     * patches in row-major grid order: patch p of sample b goes to
     * out[b * batch_stride + p * token_stride]. As Conv2d(stride = P). */
    vh_status (*patchify)(vh_device *dev, float *out, const float *images, int64_t batch,
                          int64_t channels, int64_t height, int64_t width, int64_t patch,
                          int64_t batch_stride, int64_t token_stride);

    /* Token assembly of a ViT, either layout (strides as above, for x):
     * token 0 of every sample is cls (when cls is not NULL), then the patch
     * rows (patches: (B, Np, dim) in the same layout, strides given),
     * then pos (tokens x dim) is added to every sample. */
    vh_status (*embed_forward)(vh_device *dev, float *x, const float *patches,
                               const float *cls, const float *pos, int64_t batch,
                               int64_t num_patches, int64_t dim, int64_t batch_stride,
                               int64_t token_stride, int64_t patch_batch_stride,
                               int64_t patch_token_stride);
    /* dpatches, dcls and dpos accumulate; dcls NULL means "no class token"
     * (as cls NULL in forward). */
    vh_status (*embed_backward)(vh_device *dev, float *dpatches, float *dcls, float *dpos,
                                const float *dx, int64_t batch, int64_t num_patches,
                                int64_t dim, int64_t batch_stride, int64_t token_stride,
                                int64_t patch_batch_stride, int64_t patch_token_stride);

    /* out[r] = in[r] * scale[(r / div) % mod] for rows of dim values: one
     * factor per sample, in either layout (batch-first: div = N, mod = B;
     * batch-second: div = 1, mod = B). Drop path forward (out =) and, with
     * accumulate = 1, its backward (out +=). */
    vh_status (*scale_rows)(vh_device *dev, float *out, const float *in,
                            const float *scale, int64_t rows, int64_t dim, int64_t div,
                            int64_t mod, int32_t accumulate);
    /* Inverted dropout, p in [0, 1]: mask[i] = keep ? 1/(1-p) : 0 and
     * out = x * mask. Every device draws the same mask from (seed, i):
     *   key = mix64(seed), u_i = (mix64(key + (i + 1) * 0x9E3779B97F4A7C15) >> 40) * 2^-24,
     *   keep iff u_i >= p, with mix64 the splitmix64 finaliser. */
    vh_status (*dropout_forward)(vh_device *dev, float *out, float *mask, const float *x,
                                 int64_t n, float p, uint64_t seed);
    /* out (+)= a * b element-wise; dropout's backward with b = mask. */
    vh_status (*mul)(vh_device *dev, float *out, const float *a, const float *b, int64_t n,
                     int32_t accumulate);
} vh_device_ops;

#ifdef __cplusplus
}
#endif
#endif
