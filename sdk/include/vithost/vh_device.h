/* vh_device.h - the operations of one compute device (CPU or CUDA).
 *
 * A plugin never asks "am I on a GPU?": it calls the ops of the device the
 * recipe chose (vh_host_api.device) and gets the CPU or the CUDA version.
 * The CPU table lives in the SDK runtime; the CUDA table lives in its own
 * shared object (libvh_cuda.so) that the host loads only when `run.device`
 * is cuda, so a CUDA build still runs on a machine with no GPU or driver.
 *
 * ABI 2.0 rules of this table:
 * - Every compute op takes one argument struct. It starts with struct_size;
 *   zero-initialise it, set struct_size = sizeof, fill what you need: a zero
 *   member is its default (dtype 0 is f32, epilogue 0 is none, stream NULL
 *   is the thread's current stream). Devices accept structs of any older
 *   minor (vh_struct_upgrade) and later minors only append members.
 * - Each tensor pointer has a dtype member beside it: f32, bf16 or f16
 *   storage. Math is fp32 whatever the storage: GEMMs accumulate in fp32,
 *   reductions (layer-norm statistics, softmax, losses, norms) run in fp32,
 *   and a result is rounded once, to nearest even, when it is stored.
 *   A device that cannot do a dtype on an op returns
 *   VH_STATUS_ERR_UNSUPPORTED; it never falls back silently to other
 *   numbers.
 * - Conventions: pointers are device memory; shapes use the letters of
 *   docs/ARCHITECTURE.md (B batch, N tokens, D width, ...); forward ops overwrite their outputs; backward ops ACCUMULATE
 *   (+=) into every gradient they write, activations' and parameters' alike,
 *   so residual branches and shared tensors need no extra adds.
 * - Ordering: ops are issued to a stream (the calling thread's current one,
 *   see stream_set) and run in issue order on it; a pointer read or written
 *   by an op must stay valid until that op has finished (event or
 *   synchronize). The CPU device runs everything at once, in the caller's
 *   thread, so on it every op has finished when it returns.
 * - The table itself is append-only: check struct_size (VH_STRUCT_HAS)
 *   before using a member newer than your minor. A NULL op means the device
 *   does not have it: refuse that device with VH_STATUS_ERR_UNSUPPORTED.
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
typedef struct vh_stream vh_stream; /* an ordered queue of ops on a device */
typedef struct vh_event vh_event;   /* a point in a stream */

typedef enum vh_copy_kind {
    VH_COPY_KIND_HOST_TO_DEVICE = 0,
    VH_COPY_KIND_DEVICE_TO_HOST = 1,
    VH_COPY_KIND_DEVICE_TO_DEVICE = 2,
} vh_copy_kind;

/* ---- GEMM ------------------------------------------------------------------
 * Row-major, batched:
 *   T[i] = alpha * op(A[i]) @ op(B[i]) + bias          (fp32 accumulation)
 *   C[i] = epilogue(T[i]) + residual[i] + beta * C[i]
 * for i < batch, op(X) = X or X^T, op(A) m x k, op(B) k x n, C m x n.
 * With VH_EPILOGUE_GELU, aux (m x n, ldc) receives T (the pre-activation that
 * gelu_backward needs) when not NULL. a and b have the same dtype.
 * residual is m x n with leading dimension ldc and C's batch stride.
 * ABI 2.5 adds two epilogues, taken only by a device whose
 * VH_GEMM_EPILOGUE_EXTENSION names them (see below). */
typedef enum vh_epilogue {
    VH_EPILOGUE_NONE = 0,
    VH_EPILOGUE_GELU = 1, /* erf GELU, as timm's nn.GELU */
    /* C = gelu(T) as VH_EPILOGUE_GELU, but aux receives gelu'(T), the
     * derivative, computed in fp32 from T with gelu_backward's formula and
     * stored in c_dtype (ABI 2.5) */
    VH_EPILOGUE_GELU_GRAD = 2,
    /* C = T * aux: aux (m x n, ldc, C's batch stride, c_dtype) is read, the
     * product in fp32; aux may not be C (ABI 2.5) */
    VH_EPILOGUE_MUL_AUX = 3,
    /* C = gelu'(aux) * T: gelu_backward with overwrite, its x = aux (the
     * pre-activation, c_dtype) and its dout = T as C would store it (rounded
     * to c_dtype), the product in fp32, rounded once; aux may not be C. The
     * numbers of this GEMM without epilogue followed by gelu_backward, in
     * any dtype (ABI 2.7) */
    VH_EPILOGUE_GELU_BACKWARD = 4,
} vh_epilogue;

typedef struct vh_gemm_args {
    uint32_t struct_size;
    int32_t trans_a, trans_b; /* 0: as stored, 1: transposed */
    int64_t m, n, k;
    float alpha, beta;
    const void *a;
    int64_t lda, stride_a;    /* stride_*: elements between batch members */
    const void *b;
    int64_t ldb, stride_b;
    void *c;
    int64_t ldc, stride_c;
    int64_t batch;            /* 0 or 1: one GEMM */
    const void *bias;         /* n values added to every row, or NULL */
    int32_t ab_dtype;         /* vh_dtype: dtype of a and b */
    int32_t c_dtype;          /* vh_dtype: dtype of c (and of aux and residual) */
    int32_t bias_dtype; /* vh_dtype */
    int32_t epilogue; /* vh_epilogue */
    void *aux;                /* GELU: the pre-activation, or NULL; 2.5: see vh_epilogue */
    const void *residual;     /* added after the epilogue, or NULL */
    vh_stream *stream;        /* NULL: the thread's current stream */
} vh_gemm_args;

/* ---- the GELU's derivative kept from forward (ABI 2.5) -----------------------
 * (2.7's VH_EPILOGUE_GELU_BACKWARD is the 16-bit policies' form: gelu_backward
 * itself in fc2's dX GEMM, its numbers unchanged; the same extension names it.)
 * gelu_backward recomputes the normal CDF and density of the pre-activation,
 * an erf and an exponential per element: on CPUs with slow vector math the
 * MLP's largest element-wise cost. With VH_EPILOGUE_GELU_GRAD the forward GEMM,
 * which evaluates both anyway, keeps gelu'(T) in aux instead of T; the
 * backward GEMM that produces the GELU's output gradient (fc2's dX) then
 * applies it in its own epilogue, VH_EPILOGUE_MUL_AUX, and no GELU pass is
 * left in backward. In fp32 the numbers are those of gelu_backward with
 * overwrite (dout * gelu'(T), one rounding), but for the sign of a zero: the
 * product's, where 0 + product gives +0. With 16-bit storage they are not:
 * gelu'(T) is rounded where gelu_backward would round T, so a policy that must
 * match an autocast reference keeps VH_EPILOGUE_GELU. A device that returns a
 * vh_gemm_epilogue_ext for get_extension(VH_GEMM_EPILOGUE_EXTENSION) takes
 * every epilogue whose bit (1u << value) is set in `epilogues`; any other
 * device refuses them with VH_STATUS_ERR_INVALID_ARG. */
#define VH_GEMM_EPILOGUE_EXTENSION "vh.gemm_epilogue"

typedef struct vh_gemm_epilogue_ext {
    uint32_t struct_size;
    uint32_t epilogues; /* bit (1u << e) for each vh_epilogue e taken beyond NONE and GELU */
} vh_gemm_epilogue_ext;

/* ---- layer norm ------------------------------------------------------------
 * Per row of dim values: out = (x - mean) * rstd * weight + bias; mean and
 * rstd (rows values each, always f32) are kept for backward.
 * Backward: dx += ..., dweight += ..., dbias += ... (dweight/dbias may be
 * NULL to skip them). x, out, dout, dx in `dtype`; weight and bias in
 * `param_dtype`, dweight and dbias in `grad_dtype`. */
typedef struct vh_layernorm_args {
    uint32_t struct_size;
    int64_t rows, dim;
    float eps;
    int32_t dtype, param_dtype, grad_dtype; /* vh_dtype */
    const void *x;
    const void *weight, *bias;
    float *mean, *rstd;
    void *out;                         /* forward writes */
    const void *dout;                  /* backward reads */
    void *dx, *dweight, *dbias;        /* backward accumulates */
    vh_stream *stream;
} vh_layernorm_args;

/* ---- element-wise ----------------------------------------------------------
 * One struct for the element-wise ops; each op says which members it reads.
 * Every tensor is n elements of `dtype` (scale: f32).
 *   gelu_forward:   out = gelu(x)                    (erf GELU)
 *   gelu_backward:  dx += gelu'(x) * dout  (ABI 2.4: dx = with overwrite = 1,
 *                   on a device that has the overwrite extension; see below)
 *   add:            out = a + b                      (out may alias a or b)
 *   mul:            out = a * b, or out += a * b with accumulate = 1
 *   dropout_forward: mask[i] = keep ? 1/(1-p) : 0, out = x * mask. Every
 *     device draws the same mask from (seed, i):
 *       key = mix64(seed), u_i = (mix64(key + (i + 1) * 0x9E3779B97F4A7C15) >> 40) * 2^-24,
 *       keep iff u_i >= p, with mix64 the splitmix64 finaliser.
 *   scale_rows: out[r] = x[r] * scale[(r / div) % mod] for rows of dim
 *     values (n = rows * dim): one factor per sample in either layout
 *     (batch-first: div = N, mod = B; batch-second: div = 1, mod = B). Drop
 *     path forward, and with accumulate = 1 its backward (out +=). */
typedef struct vh_eltwise_args {
    uint32_t struct_size;
    int64_t n;
    int32_t dtype; /* vh_dtype */
    const void *x, *a, *b, *dout;
    void *out, *dx, *mask;
    float p;                  /* dropout probability */
    uint64_t seed;            /* dropout */
    const float *scale;       /* scale_rows: per-sample factors */
    int64_t dim, div, mod;    /* scale_rows */
    int32_t accumulate;
    vh_stream *stream;
    /* ---- ABI 2.4 ---- */
    int32_t overwrite; /* gelu_backward: write dx instead of adding (see below) */
} vh_eltwise_args;

/* ---- writing a gradient instead of adding to it (ABI 2.4) -----------------
 * Backward ops add to their gradients, so a caller whose buffer holds stale
 * values zeroes it first: a memory pass of its own, after which the op reads
 * the zeros back (vit's MLP gradient was 4% of a small model's step in
 * these two passes). A device that returns a vh_overwrite_ext for
 * get_extension(VH_OVERWRITE_EXTENSION) honours `overwrite = 1` in the
 * calls of the ops its `ops` bits name: the op writes the gradient, with the
 * bits that adding to zeros would give, and never reads the old values (they
 * may be NaN). A device without the extension, or an op not named, ignores
 * the member and adds: zero the buffer first, as before 2.4. */
#define VH_OVERWRITE_EXTENSION "vh.overwrite"

typedef enum vh_overwrite_op {
    VH_OVERWRITE_OP_GELU_BACKWARD = 1 << 0,      /* vh_eltwise_args.overwrite */
    VH_OVERWRITE_OP_ATTENTION_BACKWARD = 1 << 1, /* vh_attention_args.overwrite (ABI 2.6) */
} vh_overwrite_op;

typedef struct vh_overwrite_ext {
    uint32_t struct_size;
    uint32_t ops; /* vh_overwrite_op bits */
} vh_overwrite_ext;

/* ---- reductions over rows --------------------------------------------------
 * bias_backward: out[j] += sum over rows of dout[r][j] (dout in `dtype`, out
 *   in `out_dtype`): a linear layer's bias gradient.
 * softmax: row-wise softmax of x into out (may alias), fp32 inside. */
typedef struct vh_rows_args {
    uint32_t struct_size;
    int64_t rows, cols;
    int32_t dtype, out_dtype; /* vh_dtype */
    const void *x, *dout;
    void *out;
    vh_stream *stream;
} vh_rows_args;

/* ---- attention -------------------------------------------------------------
 * Multi-head self-attention over a packed qkv tensor, any layout.
 * Element (b, t, which, h, d) of qkv (which: 0 q, 1 k, 2 v; d < head_dim) is at
 *   qkv[b * qkv_batch_stride + t * qkv_token_stride + which * heads * head_dim
 *       + h * head_dim + d]
 * and element (b, t, h, d) of out/dout at
 *   out[b * out_batch_stride + t * out_token_stride + h * head_dim + d].
 * Batch-first (B, N, 3D): batch stride N*3D, token stride 3D. Batch-second
 * (N, B, 3D): batch stride 3D, token stride B*3D. The layout is only strides:
 * nothing is transposed. qkv, out, dout, dqkv in `dtype`.
 * probs (batch, heads, tokens, tokens), in `probs_dtype`, keeps the softmax
 * for backward; the logits and the softmax are computed in fp32.
 * backward adds to dqkv; ABI 2.6: it writes dqkv instead with overwrite = 1
 * on a device whose overwrite extension names VH_OVERWRITE_OP_ATTENTION_BACKWARD
 * (below). Only the q, k and v elements of dqkv are written; gaps between
 * rows never are. */
typedef struct vh_attention_args {
    uint32_t struct_size;
    int64_t batch, tokens, heads, head_dim;
    int64_t qkv_batch_stride, qkv_token_stride;
    int64_t out_batch_stride, out_token_stride;
    float scale;              /* usually 1/sqrt(head_dim) */
    const void *qkv;
    void *out;                /* forward writes */
    void *probs;
    const void *dout;         /* backward reads */
    void *dqkv;               /* backward accumulates (+=) */
    int32_t dtype, probs_dtype; /* vh_dtype */
    vh_stream *stream;
    /* ---- ABI 2.6 ---- */
    int32_t overwrite; /* backward: write dqkv instead of adding (see above) */
} vh_attention_args;

/* ---- loss ------------------------------------------------------------------
 * Mean softmax cross-entropy of (B, C) logits with label smoothing s (target
 * 1 - s on the label, s / C everywhere), in fp32. *loss (one f32 in DEVICE
 * memory: read it back only when the host needs the number) is written;
 * when dlogits is not NULL it accumulates dloss_scale * d(mean loss)/dlogits.
 * logits and dlogits in `dtype`; labels int32 in device memory.
 * ABI 2.2, soft targets: when `targets` is not NULL (B x C f32 in device
 * memory, whatever `dtype`), loss = mean over b of
 * sum_c -targets[b][c] * log_softmax(logits[b])[c] and
 * dlogits += dloss_scale * (softmax - targets) / batch; labels and smoothing
 * are not read (labels may be NULL). Deterministic, as the labels' path. */
typedef struct vh_xent_args {
    uint32_t struct_size;
    int64_t batch, classes;
    float smoothing, dloss_scale;
    int32_t dtype; /* vh_dtype */
    const void *logits;
    const int32_t *labels;
    float *loss;
    void *dlogits;
    vh_stream *stream;
    /* ---- ABI 2.2 ---- */
    const float *targets; /* (batch, classes) f32 soft targets, or NULL: the labels */
} vh_xent_args;

/* ---- tokens ----------------------------------------------------------------
 * Token tensors in either layout: token t of sample b at
 * x[b * batch_stride + t * token_stride], dim values each.
 *   mean_pool_forward:  out[b] = mean of tokens first..first+count-1 of b
 *   mean_pool_backward: dx[those tokens] += dout[b] / count
 *   patchify: (B, C, H, W) images (`image_dtype`) to patch rows of C*P*P
 *     values ordered (c, py, px), patches in row-major grid order: patch p of
 *     sample b goes to out[b * batch_stride + p * token_stride]. As
 *     Conv2d(stride = P).
 *   embed_forward: token 0 of every sample is cls (when cls is not NULL),
 *     then the patch rows (patches: (B, Np, dim), strides patch_*), then pos
 *     (tokens x dim) is added to every sample.
 *   embed_backward: dpatches, dcls and dpos accumulate; dcls NULL means "no
 *     class token" (as cls NULL in forward).
 * Token tensors (x, out, dout, dx, patches, dpatches) in `dtype`; cls and
 * pos in `param_dtype`; dcls and dpos in `grad_dtype`. */
typedef struct vh_tokens_args {
    uint32_t struct_size;
    int64_t batch, tokens, dim;
    int64_t batch_stride, token_stride;
    int32_t dtype, param_dtype, grad_dtype, image_dtype; /* vh_dtype */
    /* pooling */
    int64_t first, count;
    const void *x, *dout;
    void *out, *dx;
    /* patches and embedding */
    const void *images;
    int64_t channels, height, width, patch;
    int64_t num_patches, patch_batch_stride, patch_token_stride;
    const void *patches, *cls, *pos;
    void *dpatches, *dcls, *dpos;
    vh_stream *stream;
} vh_tokens_args;

/* ---- multi-tensor ----------------------------------------------------------
 * One pass over a list of tensors (a precision policy's overflow check and
 * the optimizer's gradient norm are this one op): every tensor is multiplied
 * in place by `scale` (skipped when scale == 1), then *sum_sq (f32, device
 * memory) receives the sum of squares of the scaled values and *found_inf
 * (f32, device memory) is set to 1 when any value is Inf or NaN (it is never
 * cleared: zero it at the start of a step). Sums in fp32, summed per tensor
 * and then in list order, so the result does not depend on threads. */
typedef struct vh_multi_tensor_args {
    uint32_t struct_size;
    int32_t count;
    /* The three lists are host memory, count entries each; the tensors
     * they point at are device memory. *sum_sq is overwritten. */
    void *const *tensors;
    const int64_t *numels;
    const vh_dtype *dtypes;
    float scale;
    float *sum_sq;            /* or NULL */
    float *found_inf;         /* or NULL */
    vh_stream *stream;
} vh_multi_tensor_args;

typedef struct vh_device_ops {
    uint32_t struct_size;  /* sizeof(vh_device_ops) of the provider */
    int32_t kind; /* vh_device_kind */
    const char *name;      /* "cpu", "cuda:0" */
    vh_device *device;     /* first argument of every op below */

    /* ---- memory ----
     * Device memory, aligned to at least 64 bytes. */
    vh_status (*alloc)(vh_device *dev, size_t bytes, void **out);
    void (*free)(vh_device *dev, void *ptr);
    /* Ordered on `stream` (NULL: current); host memory that is not pinned
     * makes a device copy synchronous. */
    vh_status (*copy)(vh_device *dev, void *dst, const void *src, size_t bytes,
                      vh_copy_kind kind, vh_stream *stream);
    vh_status (*memset_zero)(vh_device *dev, void *ptr, size_t bytes, vh_stream *stream);
    /* Element conversion between f32, f16 and bf16, round to nearest even. */
    vh_status (*convert)(vh_device *dev, void *dst, vh_dtype dst_dtype, const void *src,
                         vh_dtype src_dtype, size_t count, vh_stream *stream);
    /* Page-locked host memory, for asynchronous copies (plain aligned host
     * memory on the CPU). */
    vh_status (*host_alloc)(vh_device *dev, size_t bytes, void **out);
    void (*host_free)(vh_device *dev, void *ptr);
    /* Scratch device memory of at least `bytes`, owned by the device, valid
     * for ops issued to `stream` until the next workspace call on it. */
    vh_status (*workspace)(vh_device *dev, size_t bytes, vh_stream *stream, void **out);

    /* ---- streams and events ----
     * Wait until every op issued so far, on every stream, has finished. */
    vh_status (*synchronize)(vh_device *dev);
    vh_status (*stream_create)(vh_device *dev, vh_stream **out);
    void (*stream_destroy)(vh_device *dev, vh_stream *stream);
    /* Makes `stream` the calling thread's current stream (NULL: the device's
     * default stream); *previous (may be NULL) receives the one it replaces. */
    vh_status (*stream_set)(vh_device *dev, vh_stream *stream, vh_stream **previous);
    vh_status (*stream_synchronize)(vh_device *dev, vh_stream *stream);
    vh_status (*event_create)(vh_device *dev, vh_event **out);
    void (*event_destroy)(vh_device *dev, vh_event *event);
    vh_status (*event_record)(vh_device *dev, vh_event *event, vh_stream *stream);
    /* Ops issued to `stream` after this wait for `event`. */
    vh_status (*stream_wait_event)(vh_device *dev, vh_stream *stream, vh_event *event);
    vh_status (*event_synchronize)(vh_device *dev, vh_event *event);
    /* *done = 1 when everything before the event has finished. */
    vh_status (*event_query)(vh_device *dev, vh_event *event, int *done);

    /* ---- compute ---- */
    vh_status (*gemm)(vh_device *dev, const vh_gemm_args *args);
    vh_status (*layernorm_forward)(vh_device *dev, const vh_layernorm_args *args);
    vh_status (*layernorm_backward)(vh_device *dev, const vh_layernorm_args *args);
    vh_status (*gelu_forward)(vh_device *dev, const vh_eltwise_args *args);
    vh_status (*gelu_backward)(vh_device *dev, const vh_eltwise_args *args);
    vh_status (*add)(vh_device *dev, const vh_eltwise_args *args);
    vh_status (*mul)(vh_device *dev, const vh_eltwise_args *args);
    vh_status (*dropout_forward)(vh_device *dev, const vh_eltwise_args *args);
    vh_status (*scale_rows)(vh_device *dev, const vh_eltwise_args *args);
    vh_status (*bias_backward)(vh_device *dev, const vh_rows_args *args);
    vh_status (*softmax)(vh_device *dev, const vh_rows_args *args);
    vh_status (*attention_forward)(vh_device *dev, const vh_attention_args *args);
    vh_status (*attention_backward)(vh_device *dev, const vh_attention_args *args);
    vh_status (*softmax_cross_entropy)(vh_device *dev, const vh_xent_args *args);
    vh_status (*mean_pool_forward)(vh_device *dev, const vh_tokens_args *args);
    vh_status (*mean_pool_backward)(vh_device *dev, const vh_tokens_args *args);
    vh_status (*patchify)(vh_device *dev, const vh_tokens_args *args);
    vh_status (*embed_forward)(vh_device *dev, const vh_tokens_args *args);
    vh_status (*embed_backward)(vh_device *dev, const vh_tokens_args *args);
    vh_status (*multi_tensor_scale_check)(vh_device *dev, const vh_multi_tensor_args *args);

    /* Optional capabilities beyond this table, by name (LV2-style), e.g.
     * "vh.cpu.engine" for the CPU engine's description (vh_cpu_engine.h),
     * VH_OVERWRITE_EXTENSION (2.4) for the ops that write gradients on
     * request, VH_GEMM_EPILOGUE_EXTENSION (2.5) for the GEMM's newer
     * epilogues; NULL if unknown. */
    const void *(*get_extension)(vh_device *dev, const char *name);

    /* ---- ABI 2.1 ---- */
    /* @optional(default: the caller draws the same factors on the host with
     * the formula below and copies them in, as vit does; NULL on 2.0 devices
     * and, for now, on CUDA).
     * drop_path_scale: one stochastic-depth factor per sample, drawn on the
     * device so that no host copy sits between a step's ops. For b < n:
     *   u_b = (vh_splitmix64(seed + b) >> 11) * 2^-53   (53-bit, in double)
     *   out[b] = u_b < p ? 0 : 1/(1-p)                  (f32; 1/(1-p) in f32)
     * out is n f32 values (dtype must be f32); reads n, dtype, p, seed, out.
     * A pure function of (seed, b): key the seed by (run seed, step, block)
     * and a resumed run draws the same factors; scale_rows applies them. */
    vh_status (*drop_path_scale)(vh_device *dev, const vh_eltwise_args *args);
} vh_device_ops;

#ifdef __cplusplus
}
#endif
#endif
