/* vh_precision.h - the precision role: dtypes, loss scaling, overflow skip.
 *
 * The policy names the dtype of each kind of tensor; the sharding plugin
 * allocates buffers accordingly and the model computes in compute_dtype.
 * Loss scaling: the host multiplies the loss gradient by loss_scale(), then
 * asks unscale_and_check to divide the reduced grads back and say whether
 * any is Inf/NaN on any rank (the step is then skipped), then calls update.
 */
#ifndef VITHOST_VH_PRECISION_H
#define VITHOST_VH_PRECISION_H

#include <stddef.h>
#include <stdint.h>

#include "vh_export.h"
#include "vh_host.h"
#include "vh_params.h"
#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Out-struct: the caller zeroes it and sets struct_size; the policy fills
 * what that size covers. Held by pointer everywhere (never embedded). */
typedef struct vh_precision_policy {
    uint32_t struct_size;
    int32_t param_dtype;    /* vh_dtype: compute copy of the parameters */
    int32_t compute_dtype;  /* vh_dtype: activations */
    int32_t grad_dtype;     /* vh_dtype: parameter gradients as backward writes them */
    int32_t comm_dtype;     /* vh_dtype: gradients on the wire (the reduce dtype) */
    int32_t master_dtype;   /* vh_dtype: the copy the optimizer updates */
    int32_t state_dtype;    /* vh_dtype: optimizer state */
    /* Parameters with any of these VH_PARAM_FLAG_* keep their compute copy
     * and gradient in f32 (AMP: VH_PARAM_FLAG_NORM); 0 under fp32. */
    uint32_t fp32_param_flags;
    /* 1: the optimizer updates separate masters (master_dtype) and the
     * compute copies are refreshed from them; 0: it updates the compute
     * copy itself (full FP16 without master weights). */
    int32_t master_weights;
    /* ---- ABI 2.9 ---- */
    /* 1: loss_scale() is 1 at every step (no loss scaling, AMP-bf16's
     * default), so unscale_and_check only checks: it leaves every gradient's
     * bits as they are, in any dtype. A sharding plugin may then hand an
     * optimizer that reads 16-bit gradients (VH_OPTIM_CAP_HALF_GRADS) the
     * reduced ones without an f32 copy. 0 (an older policy): it may scale. */
    int32_t unit_loss_scale;
} vh_precision_policy;

/* The dtype of a parameter's compute copy, and of its gradient, under a
 * policy: f32 when the flags meet fp32_param_flags. The signature fits
 * vh_unit_layout_init (ctx is the policy). */
VH_SDK_API vh_dtype vh_policy_param_dtype(const void *policy, uint32_t param_flags);
VH_SDK_API vh_dtype vh_policy_grad_dtype(const void *policy, uint32_t param_flags);

/* Marks, for every call (checked against the host by test_abi_marks):
 * @required / @optional(default: what the host does when it is NULL or
 * past vtable_size). @thread(main) for every call: the host calls the
 * plugin from its main thread, one call at a time; the collectives inside
 * unscale_and_check run on that thread (vh_comm.h). */
typedef struct vh_precision_vtable {
    uint32_t struct_size;
    /* @required. *self is the plugin's; freed by destroy. */
    vh_status (*create)(vh_host *host, void **self);
    /* @required. */
    void (*destroy)(void *self);
    /* @required. out->struct_size is set by the caller (see
     * vh_precision_policy); the host calls it once and keeps its copy. */
    vh_status (*policy)(void *self, vh_precision_policy *out);
    /* @required. Factor the loss gradient is multiplied by; 1 without loss scaling. */
    float (*loss_scale)(void *self);
    /* @required. Divides the local grads (slice.grad, in slice.grad_dtype) by the loss
     * scale in place and sets *found_inf when any rank saw Inf/NaN (agreed
     * through the comm). One multi-tensor pass on the device
     * (multi_tensor_scale_check); only the flag comes back to the host. */
    vh_status (*unscale_and_check)(void *self, const vh_param_slices *grads,
                                   int *found_inf);
    /* @required. After the step (or its skip): grow or back off the loss scale. */
    vh_status (*update)(void *self, int found_inf);
    /* @optional(default: 0 bytes). State a resumed run needs (the loss
     * scale and its growth counter). */
    vh_status (*state_size)(void *self, size_t *bytes);
    /* @optional(default: saves nothing; any size but 0 is refused). */
    vh_status (*state_save)(void *self, void *buf, size_t bytes);
    /* @optional(default: accepts only 0 bytes; precision state in a
     * checkpoint was written by another plugin and is refused,
     * VH_STATUS_ERR_FORMAT). */
    vh_status (*state_load)(void *self, const void *buf, size_t bytes);
    /* @optional(default: not called; the optimizer gets has_grad_sum_sq = 0
     * and makes a pass of its own when it clips). The sum of squares of the
     * unscaled gradients over every rank, from the last unscale_and_check's
     * pass (*has = 0 when that pass did not compute it). The host calls it
     * only after a step without overflow and hands it to the optimizer in
     * vh_optim_step_args.grad_sum_sq, so clipping needs no second pass. */
    vh_status (*grad_sum_sq)(void *self, double *out, int *has);
} vh_precision_vtable;

#ifdef __cplusplus
}
#endif
#endif
