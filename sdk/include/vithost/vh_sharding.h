/* vh_sharding.h - the sharding role: where params, grads and state live.
 *
 * The sharding plugin owns the flat buffers of the parameter table (compute
 * params, grads, fp32 master params, optimizer state) and the collectives
 * between them. The model reaches them only through vh_unit_hooks, which the
 * host builds from this vtable (with tracing off, the hooks ARE this vtable's
 * gather/release/grads/reduce with ctx = the plugin's self: keep their
 * signatures equal to vh_unit_hooks'), at unit boundaries:
 *
 *   forward, per unit:           gather -> compute -> release
 *   backward, per unit reversed: gather -> grads -> compute -> reduce -> release
 *
 * DDP keeps full replicas and all-reduces a unit's grads in `reduce` (which may
 * return before the collective is done; `wait` finishes them). FSDP keeps a
 * shard, all-gathers in `gather`, frees in `release`, reduce-scatters in
 * `reduce`. ZeRO-1 keeps replicas as DDP but shards the optimizer state and
 * all-gathers the updated parameters in `refresh`.
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

/* What the model calls at unit boundaries; ctx is opaque to the model.
 * Buffers are laid out by vh_unit_layout_init with the policy's dtypes
 * (vh_policy_param_dtype for params, vh_policy_grad_dtype for grads). */
typedef struct vh_unit_hooks {
    uint32_t struct_size; /* set by the host */
    void *ctx;
    /* Full parameters of the unit (compute copies), on the device, valid
     * until release. @owns(the sharding plugin) @lifetime(until release of
     * the unit). */
    vh_status (*gather)(void *ctx, int32_t unit, const void **params);
    vh_status (*release)(void *ctx, int32_t unit);
    /* Full-size gradient buffer of the unit (zeroed at the start of the
     * step); backward accumulates into it. @owns(the sharding plugin)
     * @lifetime(until reduce of the unit; nothing is written after it). */
    vh_status (*grads)(void *ctx, int32_t unit, void **grads);
    /* The unit's gradients are complete: start their reduction. */
    vh_status (*reduce)(void *ctx, int32_t unit);
} vh_unit_hooks;

typedef struct vh_sharding_setup {
    uint32_t struct_size;
    const vh_param_table *table;
    const vh_precision_policy *policy;
    int32_t state_slots; /* from the optimizer */
    /* ---- ABI 2.9 ---- */
    /* The optimizer's VH_OPTIM_CAP_* (vh_optim_vtable.caps; 0 without it):
     * what the slices may hold besides f32. A plugin that ignores it hands
     * f32 gradients, which every optimizer reads. */
    uint32_t optim_caps;
} vh_sharding_setup;

/* How a sharding plugin writes and reads the optimizer state it owns, in
 * whatever pieces it holds: elements [offset, offset + count) of slot
 * `slot` of parameter `param` of `unit`, `count` values of `dtype` in host
 * memory. The host behind it (checkpoint files) maps the pieces to tensors
 * "<param name>.optim_state.<slot>" of the full parameter's shape, so a
 * checkpoint does not depend on how the state was sharded when written. */
typedef struct vh_state_io {
    uint32_t struct_size;
    void *ctx;
    vh_status (*write)(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                       int64_t count, vh_dtype dtype, const void *values);
    vh_status (*read)(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                      int64_t count, vh_dtype dtype, void *values);
} vh_state_io;

/* Out-struct: the caller zeroes it and sets struct_size. */
typedef struct vh_sharding_memory {
    uint32_t struct_size;
    int64_t params, grads, masters, optim_state, comm_buffers; /* bytes on this rank */
} vh_sharding_memory;

/* Marks, for every call (checked against the host by test_abi_marks):
 * @required / @optional(default: what the host does when it is NULL or
 * past vtable_size). @thread(main) for every call, the unit hooks
 * included: the host (or the model, inside forward / backward) calls the
 * plugin from its main thread, one call at a time, and the plugin runs its
 * collectives on that thread (vh_comm.h). */
typedef struct vh_sharding_vtable {
    uint32_t struct_size;
    /* @required. *self is the plugin's; freed by destroy. */
    vh_status (*create)(vh_host *host, void **self);
    /* @required. */
    void (*destroy)(void *self);
    /* @required. Allocates the buffers for the table; called once, before
     * anything else. */
    vh_status (*setup)(void *self, const vh_sharding_setup *setup);
    /* @required. Sets a unit's values from full fp32 values (model init,
     * checkpoint): every rank passes the same values and keeps what it owns. */
    vh_status (*load_unit)(void *self, int32_t unit, const float *values);
    /* @required. Writes a unit's full fp32 master values into `values` on
     * EVERY rank (for a checkpoint or an evaluation); collective. */
    vh_status (*store_unit)(void *self, int32_t unit, float *values);
    /* @required. Start of a step: zero the grads. */
    vh_status (*zero_grads)(void *self);
    /* @required. The unit hooks, gather to reduce; ctx is this plugin's
     * self (see vh_unit_hooks for what each returns and how long it lives). */
    vh_status (*gather)(void *self, int32_t unit, const void **params);
    /* @required. */
    vh_status (*release)(void *self, int32_t unit);
    /* @required. */
    vh_status (*grads)(void *self, int32_t unit, void **grads);
    /* @required. */
    vh_status (*reduce)(void *self, int32_t unit);
    /* @required. Waits for every reduction started by `reduce`. Afterwards
     * the slices' gradients are the MEAN over ranks (the gradient of the
     * global batch), still multiplied by the loss scale, in slice.grad_dtype. */
    vh_status (*wait)(void *self);
    /* @required. The local part the optimizer updates: fp32 master, grads,
     * state. The list stays valid until destroy. Zero the items before
     * filling them, so members of a later minor read as their defaults
     * (2.9's compute: NULL). @owns(the sharding plugin, its only writer)
     * @lifetime(until destroy). */
    vh_status (*slices)(void *self, vh_param_slices *out);
    /* @required. After the optimizer: refresh compute copies from the
     * masters (a conversion to each parameter's compute dtype; a no-op
     * where the policy has no separate masters). */
    vh_status (*refresh)(void *self);
    /* @required. Saves / loads the optimizer state this rank owns through
     * `io`; collective (every rank calls it). Masters go through store_unit
     * and load_unit. io: @lifetime(this call). */
    vh_status (*state_save)(void *self, const vh_state_io *io);
    /* @required. As state_save. */
    vh_status (*state_load)(void *self, const vh_state_io *io);
    /* @optional(default: not called; the memory report shows the parameter
     * count only). Bytes this rank holds, by kind, for the run's memory
     * report. */
    vh_status (*memory)(void *self, vh_sharding_memory *out);
    /* ABI 2.2. @optional(default: none; the host refuses run.grad_accum > 1
     * with a sharding plugin that lacks it, naming the plugin). Whether the
     * next backward's reduce hooks communicate. sync 1 (the state after
     * create): they reduce across ranks as in 2.1. sync 0: reduce starts no
     * collective and the gradients stay this rank's, accumulating over
     * backward calls (zero_grads, once per optimizer step, clears them; wait
     * has nothing to finish) until a backward with sync 1 reduces the sum
     * once: PyTorch's no_sync. The host calls it before each micro-batch's
     * forward, never with reductions in flight. */
    vh_status (*set_sync)(void *self, int32_t sync);
    /* ---- ABI 2.9 ---- */
    /* @optional(default: refresh). Called instead of refresh right after an
     * optimizer update, when the optimizer writes compute copies
     * (VH_OPTIM_CAP_WRITES_COMPUTE in setup's optim_caps): the slices whose
     * compute member the plugin set hold the new values already; do the
     * rest of refresh (convert the others, gather, drop stale copies). Every
     * other change of the masters (the host's EMA swap) is followed by
     * refresh, as before. */
    vh_status (*refresh_updated)(void *self);
} vh_sharding_vtable;

#ifdef __cplusplus
}
#endif
#endif
