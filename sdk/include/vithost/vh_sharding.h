/* vh_sharding.h - the sharding role: where params, grads and state live.
 *
 * The sharding plugin owns the flat buffers of the parameter table (compute
 * params, grads, fp32 master params, optimizer state) and the collectives
 * between them. The model reaches them only through vh_unit_hooks, which the
 * host builds from this vtable, at unit boundaries:
 *
 *   forward, per unit:           gather -> compute -> release
 *   backward, per unit reversed: gather -> grads -> compute -> reduce -> release
 *
 * DDP keeps full replicas and all-reduces a unit's grads in `reduce` (which may
 * return before the collective is done; `wait` finishes them). FSDP keeps a
 * shard, all-gathers in `gather`, frees in `release`, reduce-scatters in
 * `reduce`.
 */
#ifndef VITHOST_VH_SHARDING_H
#define VITHOST_VH_SHARDING_H

#include <stddef.h>
#include <stdint.h>

#include "vh_host.h"
#include "vh_params.h"
#include "vh_precision.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the model calls at unit boundaries; ctx is opaque to the model. */
typedef struct vh_unit_hooks {
    uint32_t struct_size; /* set by the host */
    void *ctx;
    /* Full parameters of the unit in the policy's param_dtype, on the device,
     * valid until release. */
    vh_status (*gather)(void *ctx, int32_t unit, const void **params);
    vh_status (*release)(void *ctx, int32_t unit);
    /* Full-size gradient buffer of the unit (grad_dtype, zeroed at the start
     * of the step); backward accumulates into it. */
    vh_status (*grads)(void *ctx, int32_t unit, void **grads);
    /* The unit's gradients are complete: start their reduction. */
    vh_status (*reduce)(void *ctx, int32_t unit);
} vh_unit_hooks;

typedef struct vh_sharding_setup {
    uint32_t struct_size;
    const vh_param_table *table;
    vh_precision_policy policy;
    int32_t state_slots; /* from the optimizer */
} vh_sharding_setup;

typedef struct vh_sharding_vtable {
    uint32_t struct_size;
    vh_status (*create)(vh_host *host, void **self);
    void (*destroy)(void *self);
    /* Allocates the buffers for the table; called once, before anything else. */
    vh_status (*setup)(void *self, const vh_sharding_setup *setup);
    /* Sets a unit's values from full fp32 values (model init, checkpoint):
     * every rank passes the same values and keeps what it owns. */
    vh_status (*load_unit)(void *self, int32_t unit, const float *values);
    /* Writes a unit's full fp32 master values (for a checkpoint); collective. */
    vh_status (*store_unit)(void *self, int32_t unit, float *values);
    /* Start of a step: zero the grads. */
    vh_status (*zero_grads)(void *self);
    /* The unit hooks; ctx is this plugin's self. */
    vh_status (*gather)(void *self, int32_t unit, const void **params);
    vh_status (*release)(void *self, int32_t unit);
    vh_status (*grads)(void *self, int32_t unit, void **grads);
    vh_status (*reduce)(void *self, int32_t unit);
    /* Waits for every reduction started by `reduce`. */
    vh_status (*wait)(void *self);
    /* The local part the optimizer updates: fp32 master, grads, state. The
     * list stays valid until destroy. */
    vh_status (*slices)(void *self, vh_param_slices *out);
    /* After the optimizer: refresh compute copies from the fp32 masters. */
    vh_status (*refresh)(void *self);
} vh_sharding_vtable;

#ifdef __cplusplus
}
#endif
#endif
