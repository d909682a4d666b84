/* ops.c - the entry points of the CPU's non-GEMM compute ops (vh_device.h).
 *
 * Each one reads its argument struct through vh_struct_upgrade (a caller
 * built against an older minor passes a smaller struct; what it lacks reads
 * as zero, the default), checks it, and runs the op's one fp32 kernel:
 * - f32 tensors are handed to the kernel as they are;
 * - bf16/f16 tensors get an fp32 copy in the thread's scratch arena
 *   (vh_cpu_f32_view), the kernel runs on the copies, and outputs are
 *   converted back, rounded to nearest even once. Accumulating outputs
 *   (gradients, +=) are loaded first, so the existing low-precision value is
 *   added to in fp32 and rounded once.
 * Why copies rather than typed kernels: these ops are memory-bound and small
 * next to the GEMMs (under 20% of a step), a conversion pass costs less than
 * the op, and one kernel per op keeps the fp32 numbers the fixtures check.
 *
 * Strided token tensors are converted over their whole extent, from the first
 * element to the last: gaps between rows go through f32 and back unchanged.
 */
#include <math.h>
#include <stddef.h>

#include "cpu_ops.h"

/* Reads *in into the local struct `local`: a writer of any minor, as long as
 * its struct has every member before `first_optional` (the stream, whose
 * zero is the current stream, is the only member a 2.0 caller may lack). */
#define READ_ARGS(local, in, type, first_optional)                                  \
    do {                                                                            \
        if (!(in) || (in)->struct_size < offsetof(type, first_optional) ||           \
            !vh_struct_upgrade(&(local), sizeof(local), (in)))                       \
            return VH_STATUS_ERR_INVALID_ARG;                                       \
    } while (0)

#define CHECK_DTYPE(t)                                            \
    do {                                                          \
        if (!vh_cpu_is_float(t)) return VH_STATUS_ERR_INVALID_ARG; \
    } while (0)

/* fp32 views of an op's tensors, from the scratch arena (between the op's
 * mark and release); a view that could not be allocated (NULL where its
 * tensor is not) fails the op with NOMEM. */
#define VIEW_IN(name, ptr, t, n) const float *name = vh_cpu_f32_view((ptr), (t), (n), 1)
#define VIEW_OUT(name, ptr, t, n, load) float *name = vh_cpu_f32_view((ptr), (t), (n), (load))
#define MISSING(view, ptr) (!(view) && (ptr))

/* Elements from the first to the last of a strided token tensor. */
static int64_t extent(int64_t batch, int64_t batch_stride, int64_t tokens, int64_t token_stride,
                      int64_t dim) {
    if (batch <= 0 || tokens <= 0 || dim <= 0) return 0;
    return (batch - 1) * batch_stride + (tokens - 1) * token_stride + dim;
}

/* ---- layer norm ----------------------------------------------------------- */

vh_status vh_cpu_layernorm_forward(vh_device *dev, const vh_layernorm_args *in) {
    (void)dev;
    vh_layernorm_args a;
    READ_ARGS(a, in, vh_layernorm_args, stream);
    CHECK_DTYPE(a.dtype);
    CHECK_DTYPE(a.param_dtype);
    if (a.rows < 0 || a.dim < 0 || !(a.eps >= 0.0f)) return VH_STATUS_ERR_INVALID_ARG;
    if (a.rows == 0) return VH_STATUS_OK;
    if (a.dim == 0 || !a.out || !a.x || !a.mean || !a.rstd || !a.weight || !a.bias)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t n = a.rows * a.dim;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.x, a.dtype, n);
    VIEW_IN(w, a.weight, a.param_dtype, a.dim);
    VIEW_IN(b, a.bias, a.param_dtype, a.dim);
    VIEW_OUT(out, a.out, a.dtype, n, 0);
    vh_status st = VH_STATUS_ERR_NOMEM;
    if (x && w && b && out) {
        vh_cpu_k_layernorm_forward(out, a.mean, a.rstd, x, w, b, a.rows, a.dim, a.eps);
        vh_cpu_f32_store(a.out, a.dtype, out, n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_layernorm_backward(vh_device *dev, const vh_layernorm_args *in) {
    (void)dev;
    vh_layernorm_args a;
    READ_ARGS(a, in, vh_layernorm_args, stream);
    CHECK_DTYPE(a.dtype);
    CHECK_DTYPE(a.param_dtype);
    CHECK_DTYPE(a.grad_dtype);
    if (a.rows < 0 || a.dim < 0) return VH_STATUS_ERR_INVALID_ARG;
    if (a.rows == 0) return VH_STATUS_OK;
    if (a.dim == 0 || !a.dx || !a.dout || !a.x || !a.weight || !a.mean || !a.rstd)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t n = a.rows * a.dim;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.x, a.dtype, n);
    VIEW_IN(g, a.dout, a.dtype, n);
    VIEW_IN(w, a.weight, a.param_dtype, a.dim);
    VIEW_OUT(dx, a.dx, a.dtype, n, 1);
    VIEW_OUT(dw, a.dweight, a.grad_dtype, a.dim, 1);
    VIEW_OUT(db, a.dbias, a.grad_dtype, a.dim, 1);
    vh_status st = VH_STATUS_ERR_NOMEM;
    if (x && g && w && dx && !MISSING(dw, a.dweight) && !MISSING(db, a.dbias)) {
        vh_cpu_k_layernorm_backward(dx, dw, db, g, x, w, a.mean, a.rstd, a.rows, a.dim);
        vh_cpu_f32_store(a.dx, a.dtype, dx, n);
        vh_cpu_f32_store(a.dweight, a.grad_dtype, dw, a.dim);
        vh_cpu_f32_store(a.dbias, a.grad_dtype, db, a.dim);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

/* ---- element-wise ----------------------------------------------------------- */

static vh_status read_eltwise(vh_eltwise_args *a, const vh_eltwise_args *in) {
    if (!in || in->struct_size < offsetof(vh_eltwise_args, stream) ||
        !vh_struct_upgrade(a, sizeof *a, in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cpu_is_float(a->dtype) || a->n < 0) return VH_STATUS_ERR_INVALID_ARG;
    return VH_STATUS_OK;
}

vh_status vh_cpu_gelu_forward(vh_device *dev, const vh_eltwise_args *in) {
    (void)dev;
    vh_eltwise_args a;
    vh_status st = read_eltwise(&a, in);
    if (st != VH_STATUS_OK || a.n == 0) return st;
    if (!a.out || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.x, a.dtype, a.n);
    VIEW_OUT(out, a.out, a.dtype, a.n, 0);
    st = VH_STATUS_ERR_NOMEM;
    if (x && out) {
        vh_cpu_k_gelu_forward(out, x, a.n);
        vh_cpu_f32_store(a.out, a.dtype, out, a.n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_gelu_backward(vh_device *dev, const vh_eltwise_args *in) {
    (void)dev;
    vh_eltwise_args a;
    vh_status st = read_eltwise(&a, in);
    if (st != VH_STATUS_OK || a.n == 0) return st;
    if (!a.dx || !a.x || !a.dout) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.x, a.dtype, a.n);
    VIEW_IN(g, a.dout, a.dtype, a.n);
    VIEW_OUT(dx, a.dx, a.dtype, a.n, 1);
    st = VH_STATUS_ERR_NOMEM;
    if (x && g && dx) {
        vh_cpu_k_gelu_backward(dx, x, g, a.n);
        vh_cpu_f32_store(a.dx, a.dtype, dx, a.n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_add(vh_device *dev, const vh_eltwise_args *in) {
    (void)dev;
    vh_eltwise_args a;
    vh_status st = read_eltwise(&a, in);
    if (st != VH_STATUS_OK || a.n == 0) return st;
    if (!a.out || !a.a || !a.b) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.a, a.dtype, a.n);
    VIEW_IN(y, a.b, a.dtype, a.n);
    VIEW_OUT(out, a.out, a.dtype, a.n, 0);
    st = VH_STATUS_ERR_NOMEM;
    if (x && y && out) {
        vh_cpu_k_add(out, x, y, a.n);
        vh_cpu_f32_store(a.out, a.dtype, out, a.n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_mul(vh_device *dev, const vh_eltwise_args *in) {
    (void)dev;
    vh_eltwise_args a;
    vh_status st = read_eltwise(&a, in);
    if (st != VH_STATUS_OK || a.n == 0) return st;
    if (!a.out || !a.a || !a.b) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.a, a.dtype, a.n);
    VIEW_IN(y, a.b, a.dtype, a.n);
    VIEW_OUT(out, a.out, a.dtype, a.n, a.accumulate);
    st = VH_STATUS_ERR_NOMEM;
    if (x && y && out) {
        vh_cpu_k_mul(out, x, y, a.n, a.accumulate);
        vh_cpu_f32_store(a.out, a.dtype, out, a.n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_dropout_forward(vh_device *dev, const vh_eltwise_args *in) {
    (void)dev;
    vh_eltwise_args a;
    vh_status st = read_eltwise(&a, in);
    if (st != VH_STATUS_OK) return st;
    if (!(a.p >= 0.0f && a.p <= 1.0f)) return VH_STATUS_ERR_INVALID_ARG;
    if (a.n == 0) return VH_STATUS_OK;
    if (!a.out || !a.mask || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.x, a.dtype, a.n);
    VIEW_OUT(out, a.out, a.dtype, a.n, 0);
    VIEW_OUT(mask, a.mask, a.dtype, a.n, 0);
    st = VH_STATUS_ERR_NOMEM;
    if (x && out && mask) {
        vh_cpu_k_dropout_forward(out, mask, x, a.n, a.p, a.seed);
        vh_cpu_f32_store(a.out, a.dtype, out, a.n);
        vh_cpu_f32_store(a.mask, a.dtype, mask, a.n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

/* Reads x into out; backward callers that name the tensors dout and dx are
 * read the same way (x NULL: dout; out NULL: dx). */
vh_status vh_cpu_scale_rows(vh_device *dev, const vh_eltwise_args *in) {
    (void)dev;
    vh_eltwise_args a;
    vh_status st = read_eltwise(&a, in);
    if (st != VH_STATUS_OK) return st;
    const void *src = a.x ? a.x : a.dout;
    void *dst = a.out ? a.out : a.dx;
    if (a.dim < 0 || a.div <= 0 || a.mod <= 0) return VH_STATUS_ERR_INVALID_ARG;
    if (a.n == 0 || a.dim == 0) return VH_STATUS_OK;
    if (a.n % a.dim) return VH_STATUS_ERR_INVALID_ARG;
    if (!src || !dst || !a.scale) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, src, a.dtype, a.n);
    VIEW_OUT(out, dst, a.dtype, a.n, a.accumulate);
    st = VH_STATUS_ERR_NOMEM;
    if (x && out) {
        vh_cpu_k_scale_rows(out, x, a.scale, a.n / a.dim, a.dim, a.div, a.mod, a.accumulate);
        vh_cpu_f32_store(dst, a.dtype, out, a.n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

/* ---- rows -------------------------------------------------------------------- */

static vh_status read_rows(vh_rows_args *a, const vh_rows_args *in) {
    if (!in || in->struct_size < offsetof(vh_rows_args, stream) ||
        !vh_struct_upgrade(a, sizeof *a, in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cpu_is_float(a->dtype) || !vh_cpu_is_float(a->out_dtype) || a->rows < 0 ||
        a->cols < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    return VH_STATUS_OK;
}

vh_status vh_cpu_bias_backward(vh_device *dev, const vh_rows_args *in) {
    (void)dev;
    vh_rows_args a;
    vh_status st = read_rows(&a, in);
    if (st != VH_STATUS_OK || a.rows == 0 || a.cols == 0) return st;
    if (!a.out || !a.dout) return VH_STATUS_ERR_INVALID_ARG;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(g, a.dout, a.dtype, a.rows * a.cols);
    VIEW_OUT(db, a.out, a.out_dtype, a.cols, 1);
    st = VH_STATUS_ERR_NOMEM;
    if (g && db) {
        vh_cpu_k_bias_backward(db, g, a.rows, a.cols);
        vh_cpu_f32_store(a.out, a.out_dtype, db, a.cols);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_softmax(vh_device *dev, const vh_rows_args *in) {
    (void)dev;
    vh_rows_args a;
    vh_status st = read_rows(&a, in);
    if (st != VH_STATUS_OK || a.rows == 0 || a.cols == 0) return st;
    if (!a.out || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t n = a.rows * a.cols;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.x, a.dtype, n);
    VIEW_OUT(out, a.out, a.out_dtype, n, 0);
    st = VH_STATUS_ERR_NOMEM;
    if (x && out) {
        vh_cpu_k_softmax(out, x, a.rows, a.cols);
        vh_cpu_f32_store(a.out, a.out_dtype, out, n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

/* ---- loss ----------------------------------------------------------------------- */

vh_status vh_cpu_softmax_cross_entropy(vh_device *dev, const vh_xent_args *in) {
    (void)dev;
    vh_xent_args a;
    READ_ARGS(a, in, vh_xent_args, stream);
    CHECK_DTYPE(a.dtype);
    if (!a.loss || a.batch < 0 || a.classes <= 0 ||
        !(a.smoothing >= 0.0f && a.smoothing <= 1.0f))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a.batch > 0) {
        if (!a.logits || !a.labels) return VH_STATUS_ERR_INVALID_ARG;
        /* Refused before anything is read or written. */
        for (int64_t b = 0; b < a.batch; b++)
            if (a.labels[b] < 0 || a.labels[b] >= a.classes) return VH_STATUS_ERR_INVALID_ARG;
    }
    const int64_t n = a.batch * a.classes;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(z, a.logits, a.dtype, n);
    VIEW_OUT(g, a.dlogits, a.dtype, n, 1);
    vh_status st = VH_STATUS_ERR_NOMEM;
    if (!MISSING(z, a.logits) && !MISSING(g, a.dlogits)) {
        vh_cpu_k_softmax_cross_entropy(a.loss, g, z, a.labels, a.batch, a.classes, a.smoothing,
                                       a.dloss_scale);
        vh_cpu_f32_store(a.dlogits, a.dtype, g, n);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

/* ---- tokens ----------------------------------------------------------------------- */

static vh_status read_tokens(vh_tokens_args *a, const vh_tokens_args *in) {
    if (!in || in->struct_size < offsetof(vh_tokens_args, stream) ||
        !vh_struct_upgrade(a, sizeof *a, in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cpu_is_float(a->dtype) || !vh_cpu_is_float(a->param_dtype) ||
        !vh_cpu_is_float(a->grad_dtype) || !vh_cpu_is_float(a->image_dtype))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a->batch < 0 || a->dim < 0 || a->batch_stride < 0 || a->token_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    return VH_STATUS_OK;
}

vh_status vh_cpu_mean_pool_forward(vh_device *dev, const vh_tokens_args *in) {
    (void)dev;
    vh_tokens_args a;
    vh_status st = read_tokens(&a, in);
    if (st != VH_STATUS_OK) return st;
    if (a.first < 0 || a.count <= 0) return VH_STATUS_ERR_INVALID_ARG;
    if (a.batch == 0 || a.dim == 0) return VH_STATUS_OK;
    if (!a.out || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t nx = extent(a.batch, a.batch_stride, a.first + a.count, a.token_stride, a.dim);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(x, a.x, a.dtype, nx);
    VIEW_OUT(out, a.out, a.dtype, a.batch * a.dim, 0);
    st = VH_STATUS_ERR_NOMEM;
    if (x && out) {
        vh_cpu_k_mean_pool_forward(out, x, a.batch, a.first, a.count, a.dim, a.batch_stride,
                                   a.token_stride);
        vh_cpu_f32_store(a.out, a.dtype, out, a.batch * a.dim);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_mean_pool_backward(vh_device *dev, const vh_tokens_args *in) {
    (void)dev;
    vh_tokens_args a;
    vh_status st = read_tokens(&a, in);
    if (st != VH_STATUS_OK) return st;
    if (a.first < 0 || a.count <= 0) return VH_STATUS_ERR_INVALID_ARG;
    if (a.batch == 0 || a.dim == 0) return VH_STATUS_OK;
    if (!a.dx || !a.dout) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t nx = extent(a.batch, a.batch_stride, a.first + a.count, a.token_stride, a.dim);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(g, a.dout, a.dtype, a.batch * a.dim);
    VIEW_OUT(dx, a.dx, a.dtype, nx, 1);
    st = VH_STATUS_ERR_NOMEM;
    if (g && dx) {
        vh_cpu_k_mean_pool_backward(dx, g, a.batch, a.first, a.count, a.dim, a.batch_stride,
                                    a.token_stride);
        vh_cpu_f32_store(a.dx, a.dtype, dx, nx);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_patchify(vh_device *dev, const vh_tokens_args *in) {
    (void)dev;
    vh_tokens_args a;
    vh_status st = read_tokens(&a, in);
    if (st != VH_STATUS_OK) return st;
    if (a.channels < 0 || a.height < 0 || a.width < 0 || a.patch <= 0 ||
        a.height % a.patch || a.width % a.patch)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t np = (a.height / a.patch) * (a.width / a.patch);
    if (a.batch == 0 || a.channels == 0 || np == 0) return VH_STATUS_OK;
    if (!a.out || !a.images) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t ni = a.batch * a.channels * a.height * a.width;
    const int64_t no =
        extent(a.batch, a.batch_stride, np, a.token_stride, a.channels * a.patch * a.patch);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(img, a.images, a.image_dtype, ni);
    VIEW_OUT(out, a.out, a.dtype, no, a.dtype != VH_DTYPE_F32); /* keep any gaps */
    st = VH_STATUS_ERR_NOMEM;
    if (img && out) {
        vh_cpu_k_patchify(out, img, a.batch, a.channels, a.height, a.width, a.patch,
                          a.batch_stride, a.token_stride);
        vh_cpu_f32_store(a.out, a.dtype, out, no);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

static vh_status check_embed(const vh_tokens_args *a, int has_cls, int64_t *tokens) {
    if (a->num_patches < 0 || a->patch_batch_stride < 0 || a->patch_token_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    *tokens = a->num_patches + (has_cls ? 1 : 0);
    return VH_STATUS_OK;
}

vh_status vh_cpu_embed_forward(vh_device *dev, const vh_tokens_args *in) {
    (void)dev;
    vh_tokens_args a;
    vh_status st = read_tokens(&a, in);
    int64_t T = 0;
    if (st == VH_STATUS_OK) st = check_embed(&a, a.cls != NULL, &T);
    if (st != VH_STATUS_OK) return st;
    if (a.batch == 0 || T == 0 || a.dim == 0) return VH_STATUS_OK;
    if (!a.out || !a.pos || (a.num_patches > 0 && !a.patches)) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t nx = extent(a.batch, a.batch_stride, T, a.token_stride, a.dim);
    const int64_t np =
        extent(a.batch, a.patch_batch_stride, a.num_patches, a.patch_token_stride, a.dim);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(patches, a.patches, a.dtype, np);
    VIEW_IN(cls, a.cls, a.param_dtype, a.dim);
    VIEW_IN(pos, a.pos, a.param_dtype, T * a.dim);
    VIEW_OUT(x, a.out, a.dtype, nx, a.dtype != VH_DTYPE_F32);
    st = VH_STATUS_ERR_NOMEM;
    if (!MISSING(patches, a.patches) && !MISSING(cls, a.cls) && pos && x) {
        vh_cpu_k_embed_forward(x, patches, cls, pos, a.batch, a.num_patches, a.dim,
                               a.batch_stride, a.token_stride, a.patch_batch_stride,
                               a.patch_token_stride);
        vh_cpu_f32_store(a.out, a.dtype, x, nx);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

vh_status vh_cpu_embed_backward(vh_device *dev, const vh_tokens_args *in) {
    (void)dev;
    vh_tokens_args a;
    vh_status st = read_tokens(&a, in);
    int64_t T = 0;
    if (st == VH_STATUS_OK) st = check_embed(&a, a.dcls != NULL, &T);
    if (st != VH_STATUS_OK) return st;
    if (a.batch == 0 || T == 0 || a.dim == 0) return VH_STATUS_OK;
    if (!a.dout || !a.dpos || (a.num_patches > 0 && !a.dpatches))
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t nx = extent(a.batch, a.batch_stride, T, a.token_stride, a.dim);
    const int64_t np =
        extent(a.batch, a.patch_batch_stride, a.num_patches, a.patch_token_stride, a.dim);
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    VIEW_IN(g, a.dout, a.dtype, nx);
    VIEW_OUT(dp, a.dpatches, a.dtype, np, 1);
    VIEW_OUT(dcls, a.dcls, a.grad_dtype, a.dim, 1);
    VIEW_OUT(dpos, a.dpos, a.grad_dtype, T * a.dim, 1);
    st = VH_STATUS_ERR_NOMEM;
    if (g && !MISSING(dp, a.dpatches) && !MISSING(dcls, a.dcls) && dpos) {
        vh_cpu_k_embed_backward(dp, dcls, dpos, g, a.batch, a.num_patches, a.dim,
                                a.batch_stride, a.token_stride, a.patch_batch_stride,
                                a.patch_token_stride);
        vh_cpu_f32_store(a.dpatches, a.dtype, dp, np);
        vh_cpu_f32_store(a.dcls, a.grad_dtype, dcls, a.dim);
        vh_cpu_f32_store(a.dpos, a.grad_dtype, dpos, T * a.dim);
        st = VH_STATUS_OK;
    }
    vh_cpu_scratch_end(mark);
    return st;
}

/* ---- multi-tensor scale and check --------------------------------------------------
 * Each tensor is cut into fixed chunks; each chunk's sum of squares is an
 * fp32 simd reduction, the chunks of a tensor are added in order, and the
 * tensors in list order: the same bits whatever the number of threads. The
 * value summed is the one stored (after scaling and rounding to the dtype). */

#define MT_CHUNK ((int64_t)1 << 14)

static void mt_chunk(void *t, vh_dtype dt, int64_t lo, int64_t hi, float scale, float *sum,
                     int *bad) {
    float buf[256];
    float s = 0.0f;
    int nonfinite = 0;
    for (int64_t i0 = lo; i0 < hi; i0 += 256) {
        const int64_t m = hi - i0 < 256 ? hi - i0 : 256;
        float *v = dt == VH_DTYPE_F32 ? (float *)t + i0 : buf;
        if (dt != VH_DTYPE_F32) vh_cpu_to_f32_serial(buf, (char *)t + i0 * 2, dt, m);
        if (scale != 1.0f) {
#pragma omp simd
            for (int64_t i = 0; i < m; i++) v[i] *= scale;
            if (dt != VH_DTYPE_F32) {
                vh_cpu_from_f32_serial((char *)t + i0 * 2, dt, buf, m);
                vh_cpu_to_f32_serial(buf, (char *)t + i0 * 2, dt, m); /* the stored values */
            }
        }
#pragma omp simd reduction(+ : s) reduction(| : nonfinite)
        for (int64_t i = 0; i < m; i++) {
            s += v[i] * v[i];
            nonfinite |= !(v[i] - v[i] == 0.0f); /* Inf - Inf and NaN are NaN */
        }
    }
    *sum = s;
    *bad = nonfinite;
}

vh_status vh_cpu_multi_tensor_scale_check(vh_device *dev, const vh_multi_tensor_args *in) {
    (void)dev;
    vh_multi_tensor_args a;
    READ_ARGS(a, in, vh_multi_tensor_args, stream);
    if (a.count < 0 || (a.count > 0 && (!a.tensors || !a.numels))) return VH_STATUS_ERR_INVALID_ARG;
    for (int32_t t = 0; t < a.count; t++) {
        const vh_dtype dt = a.dtypes ? a.dtypes[t] : VH_DTYPE_F32;
        if (!vh_cpu_is_float(dt) || a.numels[t] < 0 || (a.numels[t] > 0 && !a.tensors[t]))
            return VH_STATUS_ERR_INVALID_ARG;
    }
    int64_t chunks = 0;
    for (int32_t t = 0; t < a.count; t++) chunks += (a.numels[t] + MT_CHUNK - 1) / MT_CHUNK;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    float *sums = vh_cpu_scratch_alloc((size_t)(chunks > 0 ? chunks : 1) * sizeof(float));
    int64_t *owner = vh_cpu_scratch_alloc((size_t)(chunks > 0 ? chunks : 1) * 2 * sizeof(int64_t));
    if (!sums || !owner) {
        vh_cpu_scratch_end(mark);
        return VH_STATUS_ERR_NOMEM;
    }
    /* (tensor, first element) of every chunk, so one flat loop spreads them. */
    int64_t c = 0;
    for (int32_t t = 0; t < a.count; t++)
        for (int64_t i = 0; i < a.numels[t]; i += MT_CHUNK, c++) {
            owner[2 * c] = t;
            owner[2 * c + 1] = i;
        }
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 4) reduction(| : bad) if (chunks > 4)
    for (int64_t k = 0; k < chunks; k++) {
        const int32_t t = (int32_t)owner[2 * k];
        const int64_t lo = owner[2 * k + 1];
        const int64_t hi = lo + MT_CHUNK < a.numels[t] ? lo + MT_CHUNK : a.numels[t];
        int b = 0;
        mt_chunk(a.tensors[t], a.dtypes ? a.dtypes[t] : VH_DTYPE_F32, lo, hi, a.scale,
                 &sums[k], &b);
        bad |= b;
    }
    float total = 0.0f;
    c = 0;
    for (int32_t t = 0; t < a.count; t++) {
        float st = 0.0f;
        for (int64_t i = 0; i < a.numels[t]; i += MT_CHUNK) st += sums[c++];
        total += st;
    }
    if (a.sum_sq) *a.sum_sq = total;
    if (a.found_inf && bad) *a.found_inf = 1.0f;
    vh_cpu_scratch_end(mark);
    return VH_STATUS_OK;
}
