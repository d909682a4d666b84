/* vh_optim.h - the optimizer role: multi-tensor updates over param slices.
 *
 * The optimizer owns no parameter memory: it reports how many state values
 * it keeps per parameter element (AdamW: 2; in the policy's state_dtype), the
 * sharding plugin allocates them beside the masters (and saves them in
 * checkpoints, state_save), and `step` updates every local slice in one
 * pass. Weight decay groups come from each slice's flags.
 */
#ifndef VITHOST_VH_OPTIM_H
#define VITHOST_VH_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "vh_host.h"
#include "vh_params.h"

struct vh_precision_policy;

#ifdef __cplusplus
extern "C" {
#endif

/* What create gets. Read members past struct_size as zero. */
typedef struct vh_optim_setup {
    uint32_t struct_size;
    int64_t total_steps; /* for schedules that end (cosine) */
    /* ---- ABI 2.1 ---- */
    /* The run's precision policy (vh_precision.h), so an optimizer refuses a
     * master or state dtype it cannot update at create, not at the first
     * step; and the model's parameter table, for per-parameter rules (layer
     * decay, per-tensor trust ratios). Both live until destroy. */
    const struct vh_precision_policy *policy;
    const vh_param_table *table;
} vh_optim_setup;

/* What update gets, once per optimizer step. Versioned: read members past
 * struct_size as zero. Owned by the host; valid for the call only. */
typedef struct vh_optim_step_args {
    uint32_t struct_size;
    /* The local slices (vh_param_slices_check holds). */
    const vh_param_slices *slices;
    /* Steps taken so far, skipped (overflow) steps included, from 0. */
    int64_t step;
    /* The learning rate of this step from the SDK's schedule of the optim
     * section's shared keys (lr, warmup_steps, schedule, min_lr:
     * vh_optim_schedule.h); a plugin multiplies in its own per-parameter
     * factors (layer decay) on top. */
    double lr;
    /* The shared keys weight_decay and clip_grad_norm (0: no clipping). */
    double weight_decay;
    double clip_grad_norm;
    /* The sum of squares of every unscaled gradient over every rank, when
     * the precision plugin computed it in its overflow pass
     * (has_grad_sum_sq = 1): an optimizer that clips by the global norm
     * uses it instead of a pass of its own (vh_slices_sum_sq). */
    int32_t has_grad_sum_sq;
    double grad_sum_sq;
} vh_optim_step_args;

/* Marks, for every call (checked against the host by test_abi_marks):
 * @required / @optional(default: ...) and, where it matters, the thread
 * and who owns what. Every call runs on the host's main thread. */
typedef struct vh_optim_vtable {
    uint32_t struct_size;
    /* @required. *self is the plugin's; freed by destroy. */
    vh_status (*create)(vh_host *host, const vh_optim_setup *setup, void **self);
    /* @required. */
    void (*destroy)(void *self);
    /* @required. State values per parameter element, <= VH_OPTIM_MAX_STATE_SLOTS.
     * The sharding plugin allocates them zeroed: every state slot starts at 0. */
    int32_t (*state_slots)(void *self);
    /* @optional(default: update is used). ABI 2.0's update: one pass over every
     * slice; the plugin computes its own learning rate. step counts the steps
     * taken so far, skipped (overflow) steps included, from 0. *lr_out: the
     * rate used. An optimizer has step or update (2.1); the loader refuses
     * one with neither, and the host calls update when both are there. */
    vh_status (*step)(void *self, const vh_param_slices *slices, int64_t step,
                      double *lr_out);
    /* @optional(default: no scalar state). Scalar state (step counters, a
     * schedule of its own); the per-element state lives in the slices and the
     * sharding plugin saves it. */
    vh_status (*state_size)(void *self, size_t *bytes);
    /* @optional(default: nothing to save). */
    vh_status (*state_save)(void *self, void *buf, size_t bytes);
    /* @optional(default: nothing to load). */
    vh_status (*state_load)(void *self, const void *buf, size_t bytes);
    /* ---- ABI 2.1 ---- */
    /* @optional(default: step is used). One update of every slice, with the
     * learning rate the SDK's schedule gives (args->lr); *lr_out: the base
     * rate used (args->lr unless the plugin overrides it). */
    vh_status (*update)(void *self, const vh_optim_step_args *args, double *lr_out);
    /* ---- ABI 2.9 ---- */
    /* @optional(default: 0, nothing beyond ABI 2.8's contract). What the
     * optimizer can take beyond f32 slices: VH_OPTIM_CAP_* bits. Called once,
     * after create; the host hands the answer to the sharding plugin
     * (vh_sharding_setup.optim_caps), which may then fill the slices
     * accordingly. Never imposed: an optimizer without it gets what ABI 2.8
     * gave it. */
    uint32_t (*caps)(void *self);
} vh_optim_vtable;

/* vh_optim_vtable.caps bits (ABI 2.9). */
enum {
    /* update / step reads gradients in f16 and bf16 (slice.grad_dtype) as
     * well as f32. A sharding plugin may then hand over the reduced 16-bit
     * gradients as they are, where the precision policy leaves them alone
     * (vh_precision_policy.unit_loss_scale), instead of an f32 copy: a
     * conversion pass and the f32 copy's memory saved, the same numbers
     * (bf16 and f16 widen to f32 exactly). */
    VH_OPTIM_CAP_HALF_GRADS = 1u << 0,
    /* After updating a slice's master, update / step writes the new values
     * into slice.compute (vh_param_slice_compute, where not NULL) in
     * slice.compute_dtype, rounded to nearest even as vh_f32_to_bf16 and
     * vh_f32_to_f16 round: the bits sharding.refresh would write, while
     * they are in cache. A frozen slice it does not update keeps its compute
     * copy, which already holds those bits. The host then calls the sharding
     * plugin's refresh_updated instead of refresh. */
    VH_OPTIM_CAP_WRITES_COMPUTE = 1u << 1,
};

#ifdef __cplusplus
}
#endif
#endif
