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
 * Why copies rather than typed kernels: one kernel per op keeps the fp32
 * numbers the fixtures check. But a whole-tensor copy is a memory pass of its
 * own, and on large activations bf16 storage would then cost more traffic
 * than f32 (AMP's gelu_backward ran 2.6x slower than fp32's). So the
 * element-wise ops (rows marked OP_PIECES) convert piece by piece: each
 * thread converts a piece of every tensor into its scratch, runs the kernel
 * on it and stores it back while it is still in L1/L2, and bf16 moves half
 * of f32's bytes. Same kernel, same values, bit for bit. Where even that
 * costs (GELU, the token ops under AMP), a row names a kernel of its own for
 * all-bf16 calls, which widens and rounds in its own loops: the same bits.
 *
 * That is one wrapper for every op but the multi-tensor one (op_run); what
 * differs between ops is a row of the table at the end of this file: the
 * dtypes the op takes, its plan (the checks of its other arguments, and the
 * element count of each tensor), its kernel call, and its tensors.
 *
 * Strided token tensors are converted over their whole extent, from the first
 * element to the last: gaps between rows go through f32 and back unchanged.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "cpu_ops.h"

/* Reads *in into dst (dst_size bytes): a writer of any minor, as long as its
 * struct has every member before min_size (the stream, whose zero is the
 * current stream, is the only member a 2.0 caller may lack). */
static int read_args(void *dst, size_t dst_size, size_t min_size, const void *in) {
    uint32_t size;
    if (!in) return 0;
    memcpy(&size, in, sizeof size);
    return size >= min_size && vh_struct_upgrade(dst, dst_size, in);
}

/* Elements from the first to the last of a strided token tensor. */
static int64_t extent(int64_t batch, int64_t batch_stride, int64_t tokens, int64_t token_stride,
                      int64_t dim) {
    if (batch <= 0 || tokens <= 0 || dim <= 0) return 0;
    return (batch - 1) * batch_stride + (tokens - 1) * token_stride + dim;
}

/* ---- the one wrapper ----------------------------------------------------------- */

#define OP_MAX_TENSORS 6

/* How the wrapper treats a tensor of a row. */
enum {
    T_READ = 1,        /* the view starts with the tensor's values */
    T_WRITE = 2,       /* the view is stored back after the kernel */
    T_READ_ACC = 4,    /* read when the call accumulates (c->accumulate: element-wise
                          `accumulate`; gelu_backward unless `overwrite`) */
    T_NULL_OK = 8,     /* may be NULL: the kernel gets NULL (the plan checks when it may) */
    T_RAW = 16,        /* handed over as stored: the kernel widens it a block at a time
                          (vh_cpu_rows) and stores it itself */
    IN = T_READ,
    OUT = T_WRITE,
    ACC = T_READ | T_WRITE, /* outputs added to, and outputs with gaps to keep */
};

/* The element counts a plan sets, by what they count. */
enum {
    SZ_ALL,     /* every element: layer norm rows * dim, element-wise n, rows * cols,
                   cross-entropy batch * classes */
    SZ_ROW,     /* one row: layer norm dim, rows cols, the class token's dim */
    SZ_TOKENS,  /* a token tensor's extent */
    SZ_POOLED,  /* batch * dim */
    SZ_IMAGES,  /* batch * channels * height * width */
    SZ_PATCHES, /* embed's patch tokens' extent */
    SZ_POS,     /* tokens * dim */
    SZ_COUNT
};

typedef struct op_tensor {
    size_t ptr, dtype; /* offsets of its pointer member and its dtype member */
    int size;          /* SZ_* */
    int how;           /* T_* */
} op_tensor;

typedef union op_args {
    vh_layernorm_args ln;
    vh_eltwise_args ew;
    vh_rows_args rows;
    vh_xent_args xent;
    vh_tokens_args tok;
} op_args;

/* One call: the caller's args at this minor's size, and what the plan made
 * of them. */
typedef struct op_call {
    op_args a;
    void *ptr[OP_MAX_TENSORS]; /* the row's tensors, read from a (a plan may redirect one) */
    int64_t size[SZ_COUNT];
    int accumulate; /* loads the T_READ_ACC tensors */
    int *nomem;     /* a kernel sets *nomem when its scratch ran out */
} op_call;

typedef enum op_plan { OP_RUN, OP_EMPTY, OP_INVALID } op_plan;

/* Rows whose every tensor is SZ_ALL and whose kernel treats element i
 * alone (no index-dependent draw): they may run piece by piece. */
enum { OP_PIECES = 1 };

/* Elements per piece of a 16-bit element-wise op: three f32 views of it
 * (96 KiB) stay in L2. */
#define OP_PIECE ((int64_t)1 << 13)

typedef struct cpu_op {
    size_t args_size, min_size; /* sizeof the args struct; offsetof its stream */
    int flags;                  /* OP_PIECES */
    size_t dtypes[4];           /* the dtype members it takes (f32, f16, bf16); 0 ends */
    op_plan (*plan)(op_call *c);
    void (*kernel)(const op_call *c, float *const *v); /* v: the views, in row order */
    op_tensor t[OP_MAX_TENSORS]; /* in the kernel's argument order; ptr 0 ends */
    /* or NULL: the kernel on bf16 tensors as stored, when every tensor is
     * bf16 (c->ptr in row order) */
    void (*kernel_bf16)(const op_call *c);
} cpu_op;

/* Every dtype member is an int32_t (vh_types.h), read through its offset. */
_Static_assert(sizeof(((vh_eltwise_args *)0)->dtype) == sizeof(int32_t) &&
                   sizeof(((vh_layernorm_args *)0)->param_dtype) == sizeof(int32_t) &&
                   sizeof(((vh_rows_args *)0)->out_dtype) == sizeof(int32_t) &&
                   sizeof(((vh_xent_args *)0)->dtype) == sizeof(int32_t) &&
                   sizeof(((vh_tokens_args *)0)->image_dtype) == sizeof(int32_t),
               "dtype members are int32_t");

static vh_dtype dtype_at(const op_args *a, size_t offset) {
    int32_t d;
    memcpy(&d, (const char *)a + offset, sizeof d);
    return (vh_dtype)d;
}

/* fp32 views of the tensors from the scratch arena, the kernel, the stores;
 * a view that could not be allocated (NULL where its tensor is not) fails
 * the op with NOMEM. */
static vh_status op_compute(const cpu_op *op, const op_call *c, int count) {
    float *v[OP_MAX_TENSORS] = {0};
    vh_status st = VH_STATUS_OK;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    for (int i = 0; i < count && st == VH_STATUS_OK; i++) {
        const op_tensor *t = &op->t[i];
        if (t->how & T_RAW) {
            v[i] = c->ptr[i]; /* as stored: the kernel reads it through raw() */
            continue;
        }
        const int load = (t->how & T_READ) || ((t->how & T_READ_ACC) && c->accumulate);
        v[i] = vh_cpu_f32_view(c->ptr[i], dtype_at(&c->a, t->dtype), c->size[t->size], load);
        if (!v[i] && c->ptr[i]) st = VH_STATUS_ERR_NOMEM;
    }
    if (st == VH_STATUS_OK) {
        op->kernel(c, v);
        for (int i = 0; i < count; i++)
            if ((op->t[i].how & T_WRITE) && !(op->t[i].how & T_RAW))
                vh_cpu_f32_store(c->ptr[i], dtype_at(&c->a, op->t[i].dtype), v[i],
                                 c->size[op->t[i].size]);
    }
    vh_cpu_scratch_end(mark);
    return st != VH_STATUS_OK || !*c->nomem ? st : VH_STATUS_ERR_NOMEM;
}

/* An OP_PIECES op with a 16-bit tensor: op_compute on each piece, the
 * pieces spread over the threads (the kernel of a piece is serial: a piece is
 * under VH_CPU_PAR_ELEMS). */
static vh_status op_compute_pieces(const cpu_op *op, const op_call *c, int count) {
    const int64_t n = c->size[SZ_ALL], pieces = (n + OP_PIECE - 1) / OP_PIECE;
    size_t elem[OP_MAX_TENSORS];
    for (int i = 0; i < count; i++) elem[i] = vh_dtype_size(dtype_at(&c->a, op->t[i].dtype));
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed) if (n > VH_CPU_PAR_ELEMS)
    for (int64_t p = 0; p < pieces; p++) {
        const int64_t o = p * OP_PIECE;
        op_call piece = *c;
        piece.a.ew.n = piece.size[SZ_ALL] = n - o < OP_PIECE ? n - o : OP_PIECE;
        for (int i = 0; i < count; i++)
            if (c->ptr[i]) piece.ptr[i] = (char *)c->ptr[i] + (size_t)o * elem[i];
        failed |= op_compute(op, &piece, count) != VH_STATUS_OK;
    }
    return failed ? VH_STATUS_ERR_NOMEM : VH_STATUS_OK;
}

static int has_16bit(const cpu_op *op, const op_call *c, int count) {
    for (int i = 0; i < count; i++)
        if (dtype_at(&c->a, op->t[i].dtype) != VH_DTYPE_F32) return 1;
    return 0;
}

static int all_bf16(const cpu_op *op, const op_call *c, int count) {
    for (int i = 0; i < count; i++)
        if (dtype_at(&c->a, op->t[i].dtype) != VH_DTYPE_BF16) return 0;
    return 1;
}

static vh_status op_run(const cpu_op *op, const void *in) {
    op_call c;
    int nomem = 0;
    memset(&c, 0, sizeof c);
    c.nomem = &nomem;
    if (!read_args(&c.a, op->args_size, op->min_size, in)) return VH_STATUS_ERR_INVALID_ARG;
    for (int i = 0; i < 4 && op->dtypes[i]; i++)
        if (!vh_cpu_is_float(dtype_at(&c.a, op->dtypes[i]))) return VH_STATUS_ERR_INVALID_ARG;
    int count = 0;
    for (; count < OP_MAX_TENSORS && op->t[count].ptr; count++)
        memcpy(&c.ptr[count], (const char *)&c.a + op->t[count].ptr, sizeof c.ptr[count]);
    const op_plan plan = op->plan(&c);
    if (plan != OP_RUN) return plan == OP_EMPTY ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
    for (int i = 0; i < count; i++)
        if (!c.ptr[i] && !(op->t[i].how & T_NULL_OK)) return VH_STATUS_ERR_INVALID_ARG;
    if (op->kernel_bf16 && all_bf16(op, &c, count)) {
        op->kernel_bf16(&c);
        return VH_STATUS_OK;
    }
    if ((op->flags & OP_PIECES) && has_16bit(op, &c, count))
        return op_compute_pieces(op, &c, count);
    return op_compute(op, &c, count);
}

/* ---- plans: each op's own checks, and its tensors' sizes -------------------------- */

static op_plan plan_layernorm(op_call *c) {
    const vh_layernorm_args *a = &c->a.ln;
    if (a->rows < 0 || a->dim < 0) return OP_INVALID;
    if (a->rows == 0) return OP_EMPTY;
    if (a->dim == 0 || !a->mean || !a->rstd) return OP_INVALID;
    c->size[SZ_ALL] = a->rows * a->dim;
    c->size[SZ_ROW] = a->dim;
    return OP_RUN;
}

static op_plan plan_layernorm_forward(op_call *c) {
    return c->a.ln.eps >= 0.0f ? plan_layernorm(c) : OP_INVALID;
}

static op_plan plan_eltwise(op_call *c) {
    const vh_eltwise_args *a = &c->a.ew;
    if (a->n < 0) return OP_INVALID;
    if (a->n == 0) return OP_EMPTY;
    c->size[SZ_ALL] = a->n;
    c->accumulate = a->accumulate != 0;
    return OP_RUN;
}

/* gelu_backward adds to dx (its `accumulate` is not read), unless the caller
 * asks it to write dx (2.4 `overwrite`): then dx is neither loaded nor read. */
static op_plan plan_gelu_backward(op_call *c) {
    const op_plan p = plan_eltwise(c);
    c->accumulate = !c->a.ew.overwrite;
    return p;
}

static op_plan plan_dropout(op_call *c) {
    const float p = c->a.ew.p;
    return p >= 0.0f && p <= 1.0f ? plan_eltwise(c) : OP_INVALID;
}

static void *unconst(const void *p) { return (void *)(uintptr_t)p; }

/* Reads x into out; backward callers that name the tensors dout and dx are
 * read the same way (x NULL: dout; out NULL: dx). */
static op_plan plan_scale_rows(op_call *c) {
    const vh_eltwise_args *a = &c->a.ew;
    if (a->n < 0 || a->dim < 0 || a->div <= 0 || a->mod <= 0) return OP_INVALID;
    if (a->n == 0 || a->dim == 0) return OP_EMPTY;
    if (a->n % a->dim || !a->scale) return OP_INVALID;
    c->ptr[0] = a->out ? a->out : a->dx;
    c->ptr[1] = unconst(a->x ? a->x : a->dout);
    return plan_eltwise(c);
}

static op_plan plan_rows(op_call *c) {
    const vh_rows_args *a = &c->a.rows;
    if (a->rows < 0 || a->cols < 0) return OP_INVALID;
    if (a->rows == 0 || a->cols == 0) return OP_EMPTY;
    c->size[SZ_ALL] = a->rows * a->cols;
    c->size[SZ_ROW] = a->cols;
    return OP_RUN;
}

static op_plan plan_xent(op_call *c) {
    const vh_xent_args *a = &c->a.xent;
    if (!a->loss || a->batch < 0 || a->classes <= 0 ||
        (!a->targets && !(a->smoothing >= 0.0f && a->smoothing <= 1.0f)))
        return OP_INVALID;
    if (a->batch > 0) {
        if (!a->logits) return OP_INVALID;
        /* Soft targets (2.2) replace the labels, which may then be NULL; the
         * targets' values are the caller's (f32 whatever `dtype`). */
        if (a->targets) {
            c->size[SZ_ALL] = a->batch * a->classes;
            return OP_RUN;
        }
        if (!a->labels) return OP_INVALID;
        /* Refused before anything is read or written. */
        for (int64_t b = 0; b < a->batch; b++)
            if (a->labels[b] < 0 || a->labels[b] >= a->classes) return OP_INVALID;
    }
    c->size[SZ_ALL] = a->batch * a->classes; /* batch 0: the loss alone */
    return OP_RUN;
}

static int tokens_ok(const vh_tokens_args *a) {
    return a->batch >= 0 && a->dim >= 0 && a->batch_stride >= 0 && a->token_stride >= 0;
}

static op_plan plan_mean_pool(op_call *c) {
    const vh_tokens_args *a = &c->a.tok;
    if (!tokens_ok(a) || a->first < 0 || a->count <= 0) return OP_INVALID;
    if (a->batch == 0 || a->dim == 0) return OP_EMPTY;
    c->size[SZ_TOKENS] =
        extent(a->batch, a->batch_stride, a->first + a->count, a->token_stride, a->dim);
    c->size[SZ_POOLED] = a->batch * a->dim;
    return OP_RUN;
}

static op_plan plan_patchify(op_call *c) {
    const vh_tokens_args *a = &c->a.tok;
    if (!tokens_ok(a) || a->channels < 0 || a->height < 0 || a->width < 0 || a->patch <= 0 ||
        a->height % a->patch || a->width % a->patch)
        return OP_INVALID;
    const int64_t np = (a->height / a->patch) * (a->width / a->patch);
    if (a->batch == 0 || a->channels == 0 || np == 0) return OP_EMPTY;
    c->size[SZ_IMAGES] = a->batch * a->channels * a->height * a->width;
    c->size[SZ_TOKENS] =
        extent(a->batch, a->batch_stride, np, a->token_stride, a->channels * a->patch * a->patch);
    return OP_RUN;
}

/* T tokens: the patches, after the class token where there is one. Patches
 * may be NULL only when there are none. */
static op_plan plan_embed(op_call *c, int has_cls, const void *patches) {
    const vh_tokens_args *a = &c->a.tok;
    if (!tokens_ok(a) || a->num_patches < 0 || a->patch_batch_stride < 0 ||
        a->patch_token_stride < 0)
        return OP_INVALID;
    const int64_t T = a->num_patches + (has_cls ? 1 : 0);
    if (a->batch == 0 || T == 0 || a->dim == 0) return OP_EMPTY;
    if (a->num_patches > 0 && !patches) return OP_INVALID;
    c->size[SZ_TOKENS] = extent(a->batch, a->batch_stride, T, a->token_stride, a->dim);
    c->size[SZ_PATCHES] =
        extent(a->batch, a->patch_batch_stride, a->num_patches, a->patch_token_stride, a->dim);
    c->size[SZ_ROW] = a->dim;
    c->size[SZ_POS] = T * a->dim;
    return OP_RUN;
}

static op_plan plan_embed_forward(op_call *c) {
    return plan_embed(c, c->a.tok.cls != NULL, c->a.tok.patches);
}

static op_plan plan_embed_backward(op_call *c) {
    return plan_embed(c, c->a.tok.dcls != NULL, c->a.tok.dpatches);
}

/* ---- kernel calls: v holds the row's tensors as fp32 views, in row order ------------ */

/* A T_RAW tensor of the row, as stored. */
static vh_cpu_rows raw(float *const *v, int32_t dtype) {
    vh_cpu_rows r = {v ? (void *)*v : NULL, (vh_dtype)dtype};
    return r;
}

static void k_layernorm_forward(const op_call *c, float *const *v) {
    const vh_layernorm_args *a = &c->a.ln;
    if (vh_cpu_k_layernorm_forward(raw(&v[0], a->dtype), a->mean, a->rstd, raw(&v[1], a->dtype),
                                   v[2], v[3], a->rows, a->dim, a->eps))
        *c->nomem = 1;
}

static void k_layernorm_backward(const op_call *c, float *const *v) {
    const vh_layernorm_args *a = &c->a.ln;
    if (vh_cpu_k_layernorm_backward(raw(&v[0], a->dtype), v[1], v[2], raw(&v[3], a->dtype),
                                    raw(&v[4], a->dtype), v[5], a->mean, a->rstd, a->rows,
                                    a->dim))
        *c->nomem = 1;
}

static void k_gelu_forward(const op_call *c, float *const *v) {
    vh_cpu_k_gelu_forward(v[0], v[1], c->a.ew.n);
}

static void k_gelu_backward(const op_call *c, float *const *v) {
    vh_cpu_k_gelu_backward(v[0], v[1], v[2], c->a.ew.n, !c->accumulate);
}

static void k_gelu_forward_bf16(const op_call *c) {
    vh_cpu_k_gelu_forward_bf16(c->ptr[0], c->ptr[1], c->a.ew.n);
}

static void k_gelu_backward_bf16(const op_call *c) {
    vh_cpu_k_gelu_backward_bf16(c->ptr[0], c->ptr[1], c->ptr[2], c->a.ew.n, !c->accumulate);
}

static void k_add(const op_call *c, float *const *v) { vh_cpu_k_add(v[0], v[1], v[2], c->a.ew.n); }

static void k_mul(const op_call *c, float *const *v) {
    vh_cpu_k_mul(v[0], v[1], v[2], c->a.ew.n, c->a.ew.accumulate);
}

static void k_dropout_forward(const op_call *c, float *const *v) {
    vh_cpu_k_dropout_forward(v[0], v[1], v[2], c->a.ew.n, c->a.ew.p, c->a.ew.seed);
}

static void k_scale_rows(const op_call *c, float *const *v) {
    const vh_eltwise_args *a = &c->a.ew;
    vh_cpu_k_scale_rows(v[0], v[1], a->scale, a->n / a->dim, a->dim, a->div, a->mod,
                        a->accumulate);
}

static void k_bias_backward(const op_call *c, float *const *v) {
    const vh_rows_args *a = &c->a.rows;
    if (vh_cpu_k_bias_backward(v[0], raw(&v[1], a->dtype), a->rows, a->cols)) *c->nomem = 1;
}

static void k_softmax(const op_call *c, float *const *v) {
    vh_cpu_k_softmax(v[0], v[1], c->a.rows.rows, c->a.rows.cols);
}

static void k_softmax_cross_entropy(const op_call *c, float *const *v) {
    const vh_xent_args *a = &c->a.xent;
    if (a->targets && a->batch > 0)
        vh_cpu_k_softmax_cross_entropy_soft(a->loss, v[0], v[1], a->targets, a->batch,
                                            a->classes, a->dloss_scale);
    else
        vh_cpu_k_softmax_cross_entropy(a->loss, v[0], v[1], a->labels, a->batch, a->classes,
                                       a->smoothing, a->dloss_scale);
}

static void k_mean_pool_forward(const op_call *c, float *const *v) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_mean_pool_forward(v[0], v[1], a->batch, a->first, a->count, a->dim,
                               a->batch_stride, a->token_stride);
}

static void k_mean_pool_backward(const op_call *c, float *const *v) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_mean_pool_backward(v[0], v[1], a->batch, a->first, a->count, a->dim,
                                a->batch_stride, a->token_stride);
}

static void k_patchify(const op_call *c, float *const *v) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_patchify(v[0], v[1], a->batch, a->channels, a->height, a->width, a->patch,
                      a->batch_stride, a->token_stride);
}

static void k_embed_forward(const op_call *c, float *const *v) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_embed_forward(v[0], v[1], v[2], v[3], a->batch, a->num_patches, a->dim,
                           a->batch_stride, a->token_stride, a->patch_batch_stride,
                           a->patch_token_stride);
}

static void k_embed_backward(const op_call *c, float *const *v) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_embed_backward(v[0], v[1], v[2], v[3], a->batch, a->num_patches, a->dim,
                            a->batch_stride, a->token_stride, a->patch_batch_stride,
                            a->patch_token_stride);
}

/* All-bf16 token calls: the tensors as stored (c->ptr in row order). */
static void k_mean_pool_forward_bf16(const op_call *c) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_mean_pool_forward_bf16(c->ptr[0], c->ptr[1], a->batch, a->first, a->count, a->dim,
                                    a->batch_stride, a->token_stride);
}

static void k_mean_pool_backward_bf16(const op_call *c) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_mean_pool_backward_bf16(c->ptr[0], c->ptr[1], a->batch, a->first, a->count, a->dim,
                                     a->batch_stride, a->token_stride);
}

static void k_embed_forward_bf16(const op_call *c) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_embed_forward_bf16(c->ptr[0], c->ptr[1], c->ptr[2], c->ptr[3], a->batch,
                                a->num_patches, a->dim, a->batch_stride, a->token_stride,
                                a->patch_batch_stride, a->patch_token_stride);
}

static void k_embed_backward_bf16(const op_call *c) {
    const vh_tokens_args *a = &c->a.tok;
    vh_cpu_k_embed_backward_bf16(c->ptr[0], c->ptr[1], c->ptr[2], c->ptr[3], a->batch,
                                 a->num_patches, a->dim, a->batch_stride, a->token_stride,
                                 a->patch_batch_stride, a->patch_token_stride);
}

/* ---- the table ------------------------------------------------------------------
 * CPU_OP(name, args struct, dtypes it takes, plan, kernel call, tensors...)
 * defines the row and the entry point vh_cpu_<name> (cpu_ops.h). A tensor is
 * (pointer member, dtype member, size, how); element-wise and cross-entropy
 * tensors are all `dtype` and SZ_ALL. */

#define CPU_OP_ENTRY(name_, type_)                                                         \
    vh_status vh_cpu_##name_(vh_device *dev, const type_ *in) {                            \
        (void)dev;                                                                         \
        return op_run(&op_##name_, in);                                                    \
    }
/* (Two bodies, not one macro forwarding to another: a forwarded dtype list
 * would be split at its commas.) */
#define CPU_OP(name_, type_, dtypes_, plan_, kernel_, ...)                                 \
    static const cpu_op op_##name_ = {sizeof(type_), offsetof(type_, stream), 0, dtypes_,  \
                                      plan_, kernel_, {__VA_ARGS__}, NULL};                \
    CPU_OP_ENTRY(name_, type_)
#define CPU_OP_PIECES(name_, type_, dtypes_, plan_, kernel_, ...)                          \
    static const cpu_op op_##name_ = {sizeof(type_), offsetof(type_, stream), OP_PIECES,   \
                                      dtypes_, plan_, kernel_, {__VA_ARGS__}, NULL};       \
    CPU_OP_ENTRY(name_, type_)
/* An OP_PIECES row with a kernel of its own for all-bf16 calls. */
#define CPU_OP_BF16(name_, kernel_bf16_, type_, dtypes_, plan_, kernel_, ...)               \
    static const cpu_op op_##name_ = {sizeof(type_), offsetof(type_, stream), OP_PIECES,   \
                                      dtypes_, plan_, kernel_, {__VA_ARGS__}, kernel_bf16_}; \
    CPU_OP_ENTRY(name_, type_)

/* A row (not in pieces) with a kernel of its own for all-bf16 calls. */
#define CPU_OP_WITH_BF16(name_, kernel_bf16_, type_, dtypes_, plan_, kernel_, ...)          \
    static const cpu_op op_##name_ = {sizeof(type_), offsetof(type_, stream), 0, dtypes_,   \
                                      plan_, kernel_, {__VA_ARGS__}, kernel_bf16_};         \
    CPU_OP_ENTRY(name_, type_)

#define TENSOR(type_, ptr_, dtype_, size_, how_) \
    {offsetof(type_, ptr_), offsetof(type_, dtype_), (size_), (how_)}
#define LN(ptr_, dtype_, size_, how_) TENSOR(vh_layernorm_args, ptr_, dtype_, size_, how_)
#define EW(ptr_, how_) TENSOR(vh_eltwise_args, ptr_, dtype, SZ_ALL, how_)
#define RW(ptr_, dtype_, size_, how_) TENSOR(vh_rows_args, ptr_, dtype_, size_, how_)
#define XE(ptr_, how_) TENSOR(vh_xent_args, ptr_, dtype, SZ_ALL, how_)
#define TK(ptr_, dtype_, size_, how_) TENSOR(vh_tokens_args, ptr_, dtype_, size_, how_)

#define LN_D(m) offsetof(vh_layernorm_args, m)
#define LN_FWD_DTYPES {LN_D(dtype), LN_D(param_dtype)}
#define LN_BWD_DTYPES {LN_D(dtype), LN_D(param_dtype), LN_D(grad_dtype)}
#define EW_DTYPES {offsetof(vh_eltwise_args, dtype)}
#define RW_DTYPES {offsetof(vh_rows_args, dtype), offsetof(vh_rows_args, out_dtype)}
#define XE_DTYPES {offsetof(vh_xent_args, dtype)}
#define TK_D(m) offsetof(vh_tokens_args, m)
#define TK_DTYPES {TK_D(dtype), TK_D(param_dtype), TK_D(grad_dtype), TK_D(image_dtype)}

CPU_OP(layernorm_forward, vh_layernorm_args, LN_FWD_DTYPES, plan_layernorm_forward,
       k_layernorm_forward, LN(out, dtype, SZ_ALL, OUT | T_RAW), LN(x, dtype, SZ_ALL, IN | T_RAW),
       LN(weight, param_dtype, SZ_ROW, IN), LN(bias, param_dtype, SZ_ROW, IN))
CPU_OP(layernorm_backward, vh_layernorm_args, LN_BWD_DTYPES, plan_layernorm,
       k_layernorm_backward, LN(dx, dtype, SZ_ALL, ACC | T_RAW),
       LN(dweight, grad_dtype, SZ_ROW, ACC | T_NULL_OK),
       LN(dbias, grad_dtype, SZ_ROW, ACC | T_NULL_OK), LN(dout, dtype, SZ_ALL, IN | T_RAW),
       LN(x, dtype, SZ_ALL, IN | T_RAW), LN(weight, param_dtype, SZ_ROW, IN))

CPU_OP_BF16(gelu_forward, k_gelu_forward_bf16, vh_eltwise_args, EW_DTYPES, plan_eltwise,
            k_gelu_forward, EW(out, OUT), EW(x, IN))
CPU_OP_BF16(gelu_backward, k_gelu_backward_bf16, vh_eltwise_args, EW_DTYPES,
            plan_gelu_backward, k_gelu_backward, EW(dx, OUT | T_READ_ACC), EW(x, IN),
            EW(dout, IN))
CPU_OP_PIECES(add, vh_eltwise_args, EW_DTYPES, plan_eltwise, k_add, EW(out, OUT), EW(a, IN),
              EW(b, IN))
CPU_OP_PIECES(mul, vh_eltwise_args, EW_DTYPES, plan_eltwise, k_mul, EW(out, OUT | T_READ_ACC),
              EW(a, IN), EW(b, IN))
CPU_OP(dropout_forward, vh_eltwise_args, EW_DTYPES, plan_dropout, k_dropout_forward,
       EW(out, OUT), EW(mask, OUT), EW(x, IN))
/* The plan redirects out to dx and x to dout where the caller names those. */
CPU_OP(scale_rows, vh_eltwise_args, EW_DTYPES, plan_scale_rows, k_scale_rows,
       EW(out, OUT | T_READ_ACC), EW(x, IN))

CPU_OP(bias_backward, vh_rows_args, RW_DTYPES, plan_rows, k_bias_backward,
       RW(out, out_dtype, SZ_ROW, ACC), RW(dout, dtype, SZ_ALL, IN | T_RAW))
CPU_OP(softmax, vh_rows_args, RW_DTYPES, plan_rows, k_softmax, RW(out, out_dtype, SZ_ALL, OUT),
       RW(x, dtype, SZ_ALL, IN))

/* batch 0 passes no logits: both may be NULL (the plan checks them otherwise). */
CPU_OP(softmax_cross_entropy, vh_xent_args, XE_DTYPES, plan_xent, k_softmax_cross_entropy,
       XE(dlogits, ACC | T_NULL_OK), XE(logits, IN | T_NULL_OK))

CPU_OP_WITH_BF16(mean_pool_forward, k_mean_pool_forward_bf16, vh_tokens_args, TK_DTYPES,
                 plan_mean_pool, k_mean_pool_forward, TK(out, dtype, SZ_POOLED, OUT),
                 TK(x, dtype, SZ_TOKENS, IN))
CPU_OP_WITH_BF16(mean_pool_backward, k_mean_pool_backward_bf16, vh_tokens_args, TK_DTYPES,
                 plan_mean_pool, k_mean_pool_backward, TK(dx, dtype, SZ_TOKENS, ACC),
                 TK(dout, dtype, SZ_POOLED, IN))
/* Token outputs are loaded (ACC) so the gaps between their rows are kept. */
CPU_OP(patchify, vh_tokens_args, TK_DTYPES, plan_patchify, k_patchify,
       TK(out, dtype, SZ_TOKENS, ACC), TK(images, image_dtype, SZ_IMAGES, IN))
CPU_OP_WITH_BF16(embed_forward, k_embed_forward_bf16, vh_tokens_args, TK_DTYPES,
                 plan_embed_forward, k_embed_forward, TK(out, dtype, SZ_TOKENS, ACC),
                 TK(patches, dtype, SZ_PATCHES, IN | T_NULL_OK),
                 TK(cls, param_dtype, SZ_ROW, IN | T_NULL_OK), TK(pos, param_dtype, SZ_POS, IN))
CPU_OP_WITH_BF16(embed_backward, k_embed_backward_bf16, vh_tokens_args, TK_DTYPES,
                 plan_embed_backward, k_embed_backward,
                 TK(dpatches, dtype, SZ_PATCHES, ACC | T_NULL_OK),
                 TK(dcls, grad_dtype, SZ_ROW, ACC | T_NULL_OK), TK(dpos, grad_dtype, SZ_POS, ACC),
                 TK(dout, dtype, SZ_TOKENS, IN))

/* ---- multi-tensor scale and check --------------------------------------------------
 * Each tensor is cut into fixed chunks; each chunk's sum of squares is kept
 * in MT_LANES partial sums (element i of the chunk in lane i % MT_LANES,
 * each lane's squares added in element order, no FMA), the lanes folded in a
 * fixed tree, the chunks of a tensor added in order, and the tensors in list
 * order: the same bits whatever the number of threads, and whatever the ISA
 * (mt_lanes). The value summed is the one stored (after scaling and
 * rounding to the dtype). Inf and NaN are found from the values (x * 0 is
 * NaN for them, +-0 otherwise), not from the sum, which finite values may
 * overflow.
 *
 * Why lanes: with one simd accumulator, compiled for the baseline ISA, the
 * pass was bound by the add's latency, 4 floats at a time: fp32's check of
 * T3's 22M gradients took 4.9-6.6 ms a step on the AMX Xeon (13-18 GB/s), where 2
 * threads read 88 MB in 1.3-1.4 ms (bench/README.md). */

#define MT_CHUNK ((int64_t)1 << 14)
#define MT_PIECE 256 /* elements converted (16-bit) or scaled at a time; a multiple of MT_LANES */
#define MT_LANES 32

/* The lanes as four GCC vectors of 8 (lane l in vector l / 8): element-wise
 * IEEE operations, so the same sums on every ISA, in registers (one vector
 * of all 32 lanes was kept in memory by GCC, a store and a load a step). */
typedef float mt_vec __attribute__((vector_size(8 * sizeof(float))));
typedef struct mt_lanes {
    mt_vec v[MT_LANES / 8];
} mt_lanes;

/* acc += v[i]^2, chk += v[i] * 0 over v[0, m), lane i % MT_LANES; the
 * lanes past a last short group add +0. Inlined into each clone. */
__attribute__((always_inline)) static inline void mt_add(const float *v, int64_t m,
                                                         mt_lanes *acc, mt_lanes *chk) {
    mt_vec a0 = acc->v[0], a1 = acc->v[1], a2 = acc->v[2], a3 = acc->v[3];
    mt_vec c0 = chk->v[0], c1 = chk->v[1], c2 = chk->v[2], c3 = chk->v[3];
    int64_t j = 0;
    for (; j < m; j += MT_LANES) {
        float x[MT_LANES];
        const float *p = v + j;
        if (m - j < MT_LANES) { /* the last few elements */
            memset(x, 0, sizeof x);
            memcpy(x, v + j, (size_t)(m - j) * sizeof(float));
            p = x;
        }
        mt_vec x0, x1, x2, x3;
        memcpy(&x0, p, sizeof x0);
        memcpy(&x1, p + 8, sizeof x1);
        memcpy(&x2, p + 16, sizeof x2);
        memcpy(&x3, p + 24, sizeof x3);
        a0 += x0 * x0, a1 += x1 * x1, a2 += x2 * x2, a3 += x3 * x3;
        c0 += x0 * 0.0f, c1 += x1 * 0.0f, c2 += x2 * 0.0f, c3 += x3 * 0.0f;
    }
    acc->v[0] = a0, acc->v[1] = a1, acc->v[2] = a2, acc->v[3] = a3;
    chk->v[0] = c0, chk->v[1] = c1, chk->v[2] = c2, chk->v[3] = c3;
}

VH_CPU_CLONES static void mt_chunk(void *t, vh_dtype dt, int64_t lo, int64_t hi, float scale,
                                   float *sum, int *bad) {
    mt_lanes acc = {0}, chk = {0};
    if (dt == VH_DTYPE_F32 && scale == 1.0f) {
        /* fp32's check, a loop without calls: the lanes stay in registers */
        for (int64_t i0 = lo; i0 < hi; i0 += MT_PIECE)
            mt_add((const float *)t + i0, hi - i0 < MT_PIECE ? hi - i0 : MT_PIECE, &acc, &chk);
    } else {
        float buf[MT_PIECE];
        for (int64_t i0 = lo; i0 < hi; i0 += MT_PIECE) {
            const int64_t m = hi - i0 < MT_PIECE ? hi - i0 : MT_PIECE;
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
            mt_add(v, m, &acc, &chk); /* a piece starts at lane 0: MT_PIECE % MT_LANES == 0 */
        }
    }
    float a[MT_LANES], c[MT_LANES];
    memcpy(a, &acc, sizeof a);
    memcpy(c, &chk, sizeof c);
    for (int w = MT_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) a[l] += a[l + w], c[l] += c[l + w];
    *sum = a[0];
    *bad = !(c[0] == 0.0f);
}

vh_status vh_cpu_multi_tensor_scale_check(vh_device *dev, const vh_multi_tensor_args *in) {
    (void)dev;
    vh_multi_tensor_args a;
    if (!read_args(&a, sizeof a, offsetof(vh_multi_tensor_args, stream), in))
        return VH_STATUS_ERR_INVALID_ARG;
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
