/* vh_params.h - the parameter table: a model's parameters as data.
 *
 * A model declares its parameters as units (patch embedding, each transformer
 * block, the head), each a list of named tensors with flags and an init rule.
 * Params, grads, fp32 master copies and optimizer state of a unit live in flat
 * buffers with the same offsets; the sharding plugin owns those buffers and
 * hands the optimizer the local part as a list of vh_param_slice.
 *
 * Names, shapes and memory layouts follow timm's state_dict, so a unit's flat
 * buffer is its tensors laid end to end in declaration order.
 */
#ifndef VITHOST_VH_PARAMS_H
#define VITHOST_VH_PARAMS_H

#include "vh_export.h"

#include <stdint.h>

#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    /* Weight decay applies (matrices); biases, norms, position embedding and
     * class token leave it clear. */
    VH_PARAM_FLAG_DECAY = 1u << 0,
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
    vh_init_kind init;
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

/* The part of one parameter this rank updates (all of it without sharding). */
typedef struct vh_param_slice {
    int32_t unit, param; /* indices into the vh_param_table */
    int64_t offset;      /* first element of the slice within the parameter */
    int64_t count;
    uint32_t flags;      /* the parameter's VH_PARAM_FLAG_* */
    float *master;       /* fp32 values the optimizer updates */
    float *grad;         /* fp32 gradient, unscaled by the precision plugin */
    float *state[VH_OPTIM_MAX_STATE_SLOTS]; /* optimizer state, count each */
} vh_param_slice;

/* items is an array of item_size-byte entries (item_size >= the
 * vh_param_slice of ABI 1.0), so later minors can add members to a slice:
 * index it with vh_param_slices_at. */
typedef struct vh_param_slices {
    vh_param_slice *items;
    int32_t count;
    uint32_t item_size; /* sizeof(vh_param_slice) of the producer */
} vh_param_slices;

static inline vh_param_slice *vh_param_slices_at(const vh_param_slices *s, int32_t i) {
    return (vh_param_slice *)((char *)s->items + (size_t)i * s->item_size);
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

#ifdef __cplusplus
}
#endif
#endif
