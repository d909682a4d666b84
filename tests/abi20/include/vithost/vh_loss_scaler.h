/* vh_loss_scaler.h - dynamic loss scaling and the overflow check, for
 * precision plugins.
 *
 * Two helpers that every precision plugin with a loss scale needs, so that
 * plugins (amp, fp16) share them without sharing code with each other:
 *
 * vh_loss_scaler: the scale and its rule, PyTorch's GradScaler
 * (torch/amp/grad_scaler.py, aten's _amp_update_scale_):
 *   - the scale starts at init_scale;
 *   - update(found_inf = 1): the step was skipped; scale *= backoff_factor
 *     (never below min_scale), the good-step counter restarts at 0;
 *   - update(found_inf = 0): the counter counts the step; at growth_interval
 *     consecutive good steps, scale *= growth_factor (never above
 *     max_scale; not at all if that is not a finite float) and the counter
 *     restarts at 0;
 *   - a fixed scaler (config.fixed) keeps init_scale and only counts.
 * The scale is a float, as PyTorch's scale tensor; each new value is
 * computed in double and rounded once. The gradients are divided by the
 * scale by multiplying with vh_loss_scaler_unscale_factor: (float)(1.0 /
 * scale), the reciprocal taken in double (GradScaler does the same).
 * PyTorch has no min_scale; DeepSpeed and Megatron-LM clamp at 1, which is
 * what the default here does (see vh_loss_scaler_config).
 *
 * Its state is a small versioned blob (vh_loss_scaler_state_save/_load):
 * a run resumed from a checkpoint continues with the same scale, counter
 * and totals, bit for bit.
 *
 *     vh_loss_scaler ls;
 *     vh_loss_scaler_config c = {.struct_size = sizeof c, .growth_interval = 1000};
 *     if ((st = vh_loss_scaler_init(&ls, &c, host)) != VH_STATUS_OK) return st;
 *     ... backward with vh_loss_scaler_scale(&ls) ...
 *     vh_grad_check_run(check, grads, vh_loss_scaler_unscale_factor(&ls), &inf, &sq);
 *     vh_loss_scaler_update(&ls, inf);
 *
 * vh_grad_check: the overflow check as one pass on the device. Every local
 * gradient is multiplied by the unscale factor in place, found-inf is set
 * when any element is Inf or NaN, and the sum of squares of the unscaled
 * gradients comes out of the same multi-tensor op
 * (vh_device_ops.multi_tensor_scale_check); found-inf is then agreed by all
 * ranks (one all-reduce, MAX, of a float in device memory), so every rank
 * skips the same steps; the sum of squares is summed over ranks when the
 * slices are shards (vh_param_slices.replicated = 0). Only those two floats
 * come back to the host.
 *
 * Memory comes from host->api->alloc (and the device's alloc for the two
 * floats); errors go through host->api->fail (config_fail for a bad config
 * value, naming the key as the members are named), so a failing call has
 * left its message. A NULL host is allowed where noted: then only the
 * status says what went wrong.
 */
#ifndef VITHOST_VH_LOSS_SCALER_H
#define VITHOST_VH_LOSS_SCALER_H

#include <stddef.h>
#include <stdint.h>

#include "vh_export.h"
#include "vh_host.h"
#include "vh_params.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every member left 0 takes its default (in brackets). */
typedef struct vh_loss_scaler_config {
    uint32_t struct_size;
    int32_t fixed;           /* 1: the scale stays init_scale [0: dynamic] */
    double init_scale;       /* [65536 = 2^16] */
    double growth_factor;    /* > 1 [2] */
    double backoff_factor;   /* in (0, 1) [0.5] */
    int64_t growth_interval; /* good steps between growths, >= 1 [2000] */
    /* The scale stays in [min_scale, max_scale]. [1]: a step that still
     * overflows at scale 1 holds a real Inf/NaN (a diverged loss, a bad
     * sample), which a smaller scale would not cure; lower it for a model
     * whose unscaled gradients exceed f16's 65504. At least 2^-126 (the
     * scale and its reciprocal stay normal floats). */
    double min_scale;
    double max_scale;        /* at most FLT_MAX [16777216 = 2^24, as apex] */
} vh_loss_scaler_config;

#define VH_LOSS_SCALER_DEFAULT_INIT_SCALE 65536.0
#define VH_LOSS_SCALER_DEFAULT_GROWTH_FACTOR 2.0
#define VH_LOSS_SCALER_DEFAULT_BACKOFF_FACTOR 0.5
#define VH_LOSS_SCALER_DEFAULT_GROWTH_INTERVAL 2000
#define VH_LOSS_SCALER_DEFAULT_MIN_SCALE 1.0
#define VH_LOSS_SCALER_DEFAULT_MAX_SCALE 16777216.0

/* The scaler, held by value in a plugin (FROZEN for every ABI 2.x: a change
 * is a new type). Read the members freely; change them only through the
 * functions below. */
typedef struct vh_loss_scaler {
    float scale;             /* what the loss gradient is multiplied by now */
    int32_t fixed;
    double growth_factor, backoff_factor, min_scale, max_scale;
    int64_t growth_interval;
    int64_t good_steps;      /* consecutive updates without Inf/NaN (GradScaler's
                              * growth tracker): restarts at 0 on an overflow
                              * and when the scale grows */
    int64_t skipped;         /* updates with found_inf, in total */
    int64_t steps;           /* updates, in total */
} vh_loss_scaler;

/* Checks the config (see vh_loss_scaler_config; a bad value fails with
 * VH_STATUS_ERR_CONFIG through host->api->config_fail, naming the member)
 * and sets the scaler to its start. host may be NULL. */
VH_SDK_API vh_status vh_loss_scaler_init(vh_loss_scaler *s, const vh_loss_scaler_config *config,
                                         vh_host *host);

/* After a step (found_inf = 1: it was skipped): the rule above. */
VH_SDK_API void vh_loss_scaler_update(vh_loss_scaler *s, int found_inf);

/* The scale, and (float)(1.0 / scale) computed in double. */
VH_SDK_API float vh_loss_scaler_scale(const vh_loss_scaler *s);
VH_SDK_API float vh_loss_scaler_unscale_factor(const vh_loss_scaler *s);

/* The state blob: magic "VLSC", version, then the scale, the counters and
 * the config they ran with, host byte order, VH_LOSS_SCALER_STATE_BYTES. */
#define VH_LOSS_SCALER_STATE_BYTES 80
VH_SDK_API vh_status vh_loss_scaler_state_save(const vh_loss_scaler *s, void *buf,
                                               size_t bytes, vh_host *host);
/* Restores the scale and the counters. The config stays this run's (the
 * recipe's): a saved growth_interval, factor or bound that differs is
 * logged (warning), a saved scale outside this run's bounds is clamped
 * into them, and a fixed scaler keeps its init_scale (the counters are
 * still restored), as does a dynamic scaler loading a fixed one's state.
 * A blob that is not a scaler's, of another size or version, or with
 * impossible values fails with VH_STATUS_ERR_FORMAT and changes nothing.
 * host may be NULL (then nothing is logged). */
VH_SDK_API vh_status vh_loss_scaler_state_load(vh_loss_scaler *s, const void *buf, size_t bytes,
                                               vh_host *host);

/* ---- the overflow check ---------------------------------------------------- */

typedef struct vh_grad_check vh_grad_check; /* opaque */

/* Takes the host's device and communicator; fails with
 * VH_STATUS_ERR_UNSUPPORTED when the device lacks alloc, free, copy,
 * memset_zero or multi_tensor_scale_check. host must not be NULL. */
VH_SDK_API vh_status vh_grad_check_create(vh_host *host, vh_grad_check **out);
/* NULL is allowed. */
VH_SDK_API void vh_grad_check_free(vh_grad_check *c);

/* One pass over the slices' grads (grad_dtype f32, f16 or bf16; device
 * memory): grad *= scale in place (nothing is written when scale is 1),
 * *found_inf = 1 when any rank saw an Inf or NaN, *sum_sq = the sum of
 * squares of the scaled grads (fp32 sums, per tensor, then in list order)
 * over every rank. Collective: every rank calls it each step, whatever
 * its slices hold. sum_sq may be NULL. */
VH_SDK_API vh_status vh_grad_check_run(vh_grad_check *c, const vh_param_slices *grads,
                                       float scale, int *found_inf, double *sum_sq);

#ifdef __cplusplus
}
#endif
#endif
