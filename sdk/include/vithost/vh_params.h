/* vh_params.h - the parameter table: a model's parameters as data.
 *
 * A model declares its parameters as units (patch embedding, each transformer
 * block, the head), each a list of named tensors with flags and an init rule.
 * The sharding plugin owns every buffer of a unit: the fp32 masters and the
 * optimizer state are the unit's tensors laid end to end in declaration
 * order (vh_param_desc.offset elements; names, shapes and memory layouts
 * follow timm's state_dict); the compute copy and the gradients, whose
 * parameters may differ in dtype, follow vh_unit_layout. It hands the
 * optimizer its local part as a list of vh_param_slice.
 *
 * vh_param_desc, vh_unit_desc, vh_param_table and vh_unit_layout sit in
 * arrays or are filled by the SDK into the caller's memory: they are FROZEN
 * for every ABI 2.x (no struct_size; a change is a new type).
 */
#ifndef VITHOST_VH_PARAMS_H
#define VITHOST_VH_PARAMS_H

#include "vh_export.h"

#include <stddef.h>
#include <stdint.h>

#include "vh_status.h"
#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    /* Weight decay applies (matrices); biases, norms, position embedding and
     * class token leave it clear. */
    VH_PARAM_FLAG_DECAY = 1u << 0,
    /* What a parameter is, for precision policies that treat kinds apart
     * (e.g. AMP keeps layer-norm weights in fp32: vh_precision_policy's
     * fp32_param_flags). */
    VH_PARAM_FLAG_NORM = 1u << 1,      /* a normalisation layer's weight or bias */
    VH_PARAM_FLAG_BIAS = 1u << 2,      /* a linear layer's bias */
    VH_PARAM_FLAG_EMBEDDING = 1u << 3, /* position embedding, class token */
};

typedef enum vh_init_kind {
    VH_INIT_KIND_ZEROS = 0,
    VH_INIT_KIND_ONES = 1,
    VH_INIT_KIND_TRUNC_NORMAL = 2, /* N(0, std^2) cut at +-2 std */
    VH_INIT_KIND_NORMAL = 3,       /* N(0, std^2) */
    VH_INIT_KIND_XAVIER_UNIFORM = 4,
} vh_init_kind;

typedef struct vh_param_desc {
    const char *name; /* timm name, e.g. "blocks.0.attn.qkv.weight" */
    int32_t ndim;
    int64_t shape[VH_TENSOR_MAX_DIMS];
    uint32_t flags;   /* VH_PARAM_FLAG_* */
    int32_t init; /* vh_init_kind */
    float init_std;   /* TRUNC_NORMAL and NORMAL */
    int64_t offset;   /* first element within the unit's flat buffer */
    int64_t numel;
} vh_param_desc;

typedef struct vh_unit_desc {
    const char *name; /* "embed", "blocks.3", "head" */
    const vh_param_desc *params;
    int32_t num_params;
    int64_t numel;    /* sum of the params' numel */
} vh_unit_desc;

typedef struct vh_param_table {
    const vh_unit_desc *units;
    int32_t num_units;
    int64_t numel;    /* sum over units */
} vh_param_table;

#define VH_OPTIM_MAX_STATE_SLOTS 4

/* The part of one parameter this rank updates (all of it without sharding).
 *
 * Who converts what: the sharding plugin hands the optimizer gradients that
 * are reduced, unscaled (by the precision plugin) and in grad_dtype: f32,
 * or (ABI 2.9) f16/bf16 when the optimizer said it reads them
 * (VH_OPTIM_CAP_HALF_GRADS) and the policy leaves them alone
 * (unit_loss_scale); an optimizer that cannot update a dtype refuses it
 * with VH_STATUS_ERR_UNSUPPORTED. The optimizer updates
 * `master` (f32, or the parameter itself in f16 under full FP16 without
 * master weights) and its state (state_dtype, f32 by default); afterwards
 * the sharding plugin refreshes the compute copies from the masters. */
typedef struct vh_param_slice {
    int32_t unit, param; /* indices into the vh_param_table */
    int64_t offset;      /* first element of the slice within the parameter */
    int64_t count;
    uint32_t flags;      /* the parameter's VH_PARAM_FLAG_* */
    void *master;        /* the values the optimizer updates */
    void *grad;          /* the gradient, reduced and unscaled */
    void *state[VH_OPTIM_MAX_STATE_SLOTS]; /* optimizer state, count each */
    int32_t master_dtype, grad_dtype, state_dtype; /* vh_dtype */
    /* ---- ABI 2.9 (read through vh_param_slice_compute) ---- */
    /* The slice's elements in the compute copy, for an optimizer that
     * writes them (VH_OPTIM_CAP_WRITES_COMPUTE) after each update, in
     * compute_dtype; NULL where the sharding plugin refreshes them itself
     * (the compute copy is the master, or the optimizer cannot). */
    void *compute;
    int32_t compute_dtype; /* vh_dtype */
} vh_param_slice;

/* The size of a vh_param_slice as ABI 2.0 shipped it: the least item_size
 * any 2.x reader accepts. An offsetof expression, never a sizeof, so it stays
 * put when a later minor appends members. A reader that uses a member added
 * after 2.0 first checks that item_size covers it. */
#define VH_PARAM_SLICE_SIZE_2_0 \
    (offsetof(vh_param_slice, state_dtype) + sizeof(((vh_param_slice *)0)->state_dtype))

/* The optimizer's list, filled by the sharding plugin's `slices` call into
 * the host's memory. FROZEN for every ABI 2.x: it has no struct_size and
 * never grows; its items grow instead (item_size). One writer: the sharding
 * plugin; the host and the optimizer only read it.
 *
 * items is an array of item_size-byte entries (item_size >= the
 * VH_PARAM_SLICE_SIZE_2_0 of ABI 2.0, so later minors can add members to a
 * slice): index it with vh_param_slices_at, and check a list you did not
 * fill with vh_param_slices_check. */
typedef struct vh_param_slices {
    vh_param_slice *items;
    int32_t count;
    uint32_t item_size; /* sizeof(vh_param_slice) of the producer */
    /* 0: the lists of all ranks together hold every parameter element
     * exactly once (sharded state), so a sum over elements (a gradient norm)
     * is summed over ranks too; 1: every rank holds the same full list
     * (replicas), so such sums are local. Set by the sharding plugin. */
    int32_t replicated;
    /* ABI 2.0 only. A 2.0 host wrote the step's gradient sum of squares
     * here; a 2.1 host never writes this struct, sharding plugins set both
     * to 0, and the sum reaches the optimizer in vh_optim_step_args. Kept
     * so the layout stays 2.0's. */
    int32_t has_grad_sum_sq;
    double grad_sum_sq;
} vh_param_slices;

/* VH_STATUS_OK when `s` is a list a 2.x reader may index: count >= 0, items
 * non-NULL when count > 0, and item_size >= VH_PARAM_SLICE_SIZE_2_0 (a
 * larger item, from a newer producer, is accepted: the reader sees its own
 * members only). Otherwise VH_STATUS_ERR_INVALID_ARG with the reason in `why`
 * (which may be NULL). */
VH_SDK_API vh_status vh_param_slices_check(const vh_param_slices *s, char *why, size_t why_len);

static inline vh_param_slice *vh_param_slices_at(const vh_param_slices *s, int32_t i) {
    return (vh_param_slice *)((char *)s->items + (size_t)i * s->item_size);
}

/* A slice's compute member (ABI 2.9): NULL when the list's items predate it
 * (a 2.0-2.8 producer) or the producer left it NULL. */
static inline void *vh_param_slice_compute(const vh_param_slices *s, const vh_param_slice *sl) {
    const size_t end = offsetof(vh_param_slice, compute_dtype) + sizeof sl->compute_dtype;
    return s->item_size >= end ? sl->compute : NULL;
}

/* Fills a parameter's fp32 values by its init rule, from a seed that the
 * caller derives per parameter (e.g. hash of run seed and parameter index).
 * TRUNC_NORMAL: N(0, std^2) redrawn outside +-2 std (TensorFlow's truncated
 * normal, timm's trunc_normal_tf_; timm's trunc_normal_(std=.02) cuts at +-2
 * absolute, i.e. barely at all);
 * XAVIER_UNIFORM: U(-a, a), a = sqrt(6 / (fan_in + fan_out)) with
 * fan_in = shape[1] * receptive field, fan_out = shape[0] * receptive field.
 * Same seed, same values, on every machine. */
VH_SDK_API void vh_param_init(const vh_param_desc *param, float *values, uint64_t seed);

/* Elements of a parameter: the product of its shape. */
VH_SDK_API int64_t vh_param_desc_numel(const vh_param_desc *param);

/* Where each parameter of a unit lives in a buffer whose parameters may have
 * different dtypes (a unit's compute copy or gradients under a mixed
 * policy): parameter i starts at byte offsets[i], aligned to
 * VH_UNIT_ALIGN, and holds numel elements of dtypes[i]. The model and the
 * sharding plugin both compute it with vh_unit_layout_init, so they agree
 * without knowing each other. The fp32 master buffer is not laid out this
 * way: it is the parameters end to end, at vh_param_desc.offset elements. */
#define VH_UNIT_ALIGN 64

typedef struct vh_unit_layout {
    int32_t num_params;
    size_t bytes;       /* the whole buffer, a multiple of VH_UNIT_ALIGN */
    size_t *offsets;    /* num_params byte offsets */
    vh_dtype *dtypes;   /* num_params dtypes */
} vh_unit_layout;

/* dtype_of gives each parameter's dtype from its flags (see
 * vh_policy_param_dtype); a NULL dtype_of means f32 for every
 * parameter. Allocates offsets and dtypes: free with vh_unit_layout_free. */
VH_SDK_API vh_status vh_unit_layout_init(vh_unit_layout *out, const vh_unit_desc *unit,
                                         vh_dtype (*dtype_of)(const void *ctx, uint32_t flags),
                                         const void *ctx);
VH_SDK_API void vh_unit_layout_free(vh_unit_layout *layout);

#ifdef __cplusplus
}
#endif
#endif
