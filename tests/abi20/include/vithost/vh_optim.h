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

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vh_optim_setup {
    uint32_t struct_size;
    int64_t total_steps; /* for schedules that end (cosine) */
} vh_optim_setup;

typedef struct vh_optim_vtable {
    uint32_t struct_size;
    vh_status (*create)(vh_host *host, const vh_optim_setup *setup, void **self);
    void (*destroy)(void *self);
    /* State values per parameter element, <= VH_OPTIM_MAX_STATE_SLOTS. */
    int32_t (*state_slots)(void *self);
    /* One update of every slice; step counts the steps taken so far, skipped
     * (overflow) steps included, from 0. *lr_out: the rate used. */
    vh_status (*step)(void *self, const vh_param_slices *slices, int64_t step,
                      double *lr_out);
    /* Scalar state (step counters, schedule); the per-element state lives in
     * the slices and the sharding plugin saves it. */
    vh_status (*state_size)(void *self, size_t *bytes);
    vh_status (*state_save)(void *self, void *buf, size_t bytes);
    vh_status (*state_load)(void *self, const void *buf, size_t bytes);
} vh_optim_vtable;

#ifdef __cplusplus
}
#endif
#endif
