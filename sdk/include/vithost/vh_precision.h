/* vh_precision.h - the precision role: dtypes, loss scaling, overflow skip.
 *
 * The policy names the dtype of each kind of tensor; the sharding plugin
 * allocates buffers accordingly and the model computes in compute_dtype.
 * Loss scaling: the host multiplies the loss gradient by loss_scale(), then
 * asks unscale_and_check to divide the fp32 grads back and say whether any is
 * Inf/NaN on any rank (the step is then skipped), then calls update.
 */
#ifndef VITHOST_VH_PRECISION_H
#define VITHOST_VH_PRECISION_H

#include <stddef.h>
#include <stdint.h>

#include "vh_host.h"
#include "vh_params.h"
#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vh_precision_policy {
    uint32_t struct_size;
    vh_dtype param_dtype;   /* compute copy of the parameters */
    vh_dtype compute_dtype; /* activations */
    vh_dtype grad_dtype;    /* gradients as backward writes them */
    vh_dtype comm_dtype;    /* gradients on the wire */
    vh_dtype master_dtype;  /* the optimizer's copy; f32 */
} vh_precision_policy;

typedef struct vh_precision_vtable {
    uint32_t struct_size;
    vh_status (*create)(vh_host *host, void **self);
    void (*destroy)(void *self);
    vh_status (*policy)(void *self, vh_precision_policy *out);
    /* Factor the loss gradient is multiplied by; 1 without loss scaling. */
    float (*loss_scale)(void *self);
    /* Divides the local fp32 grads by the loss scale in place and sets
     * *found_inf when any rank saw Inf/NaN (agreed through the comm). */
    vh_status (*unscale_and_check)(void *self, const vh_param_slices *grads,
                                   int *found_inf);
    /* After the step (or its skip): grow or back off the loss scale. */
    vh_status (*update)(void *self, int found_inf);
    vh_status (*state_size)(void *self, size_t *bytes);
    vh_status (*state_save)(void *self, void *buf, size_t bytes);
    vh_status (*state_load)(void *self, const void *buf, size_t bytes);
} vh_precision_vtable;

#ifdef __cplusplus
}
#endif
#endif
