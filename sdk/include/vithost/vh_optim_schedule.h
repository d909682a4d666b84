/* vh_optim_schedule.h - what every optimizer shares: the shared keys of the
 * optim section and the learning-rate schedule they describe, and the sums
 * over slices that a per-tensor rule (LAMB's trust ratio) needs under
 * sharding.
 *
 * ---- shared keys ----------------------------------------------------------
 * lr, weight_decay, schedule, warmup_steps, warmup_init_lr, min_lr,
 * step_size, step_gamma and clip_grad_norm belong to the SDK, not to one
 * optimizer (vh_optim_shared_keys). For an optimizer built against ABI 2.1
 * or later the host adds them to the optim section's schema (keys the plugin
 * declares itself stay the plugin's), checks them, reads the schedule, and
 * hands the plugin each step's rate in vh_optim_step_args (update). So
 * `--set optim.plugin=OTHER` keeps the recipe's rate and schedule. A 2.0
 * optimizer gets no shared keys: its step computes its own rate.
 *
 * ---- the schedule -----------------------------------------------------------
 * A pure function of the step number t (from 0; the update of step t uses
 * lr(t)), so a resumed run gets the same rates. W = warmup_steps, T =
 * total_steps (the run's steps), computed in double (the Python float of a
 * torch/timm loop). Linear warm-up over the first W steps:
 *
 *     t < W:  lr(t) = warmup_init_lr + t * ((lr - warmup_init_lr) / W)
 *
 * so step 0 uses warmup_init_lr and step W the full lr; with W = 0 step 0
 * uses lr. After warm-up, with s = t - W:
 *
 *     constant: lr
 *     step:     lr * step_gamma ^ floor(s / step_size)
 *     cosine:   min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * s / (T - W - 1)))
 *               for W <= t < T - 1, and min_lr from t = T - 1 on
 *
 * The cosine spans the T - W steps after warm-up in T - W - 1 intervals: its
 * first step (t = W) uses lr and the run's last step (t = T - 1) uses min_lr.
 * (timm's cosine with warmup_prefix, T - W intervals, ends one step early:
 * its last step is still above min_lr.) A run whose cosine has one step
 * (T = W + 1) uses min_lr on it; one that never leaves warm-up (T <= W)
 * never reaches lr.
 */
#ifndef VITHOST_VH_OPTIM_SCHEDULE_H
#define VITHOST_VH_OPTIM_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "vh_config.h"
#include "vh_export.h"
#include "vh_host.h"
#include "vh_optim.h"
#include "vh_params.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_schedule_kind {
    VH_SCHEDULE_KIND_COSINE = 0,
    VH_SCHEDULE_KIND_STEP = 1,
    VH_SCHEDULE_KIND_CONSTANT = 2,
} vh_schedule_kind;

/* The shared keys, resolved. Versioned: the caller sets struct_size (the
 * SDK fills what it covers); readers treat members past it as zero. */
typedef struct vh_optim_schedule {
    uint32_t struct_size;
    int32_t kind;           /* vh_schedule_kind */
    double lr;              /* peak rate, reached at the end of warm-up */
    double warmup_init_lr;  /* the rate of step 0 when warmup_steps > 0 */
    double min_lr;          /* cosine: the rate of the last step and after */
    double step_gamma;      /* step: factor every step_size steps, (0, 1] */
    int64_t warmup_steps;
    int64_t total_steps;    /* cosine: the run's steps (vh_optim_setup) */
    int64_t step_size;      /* step: >= 1 */
    double weight_decay;    /* of slices flagged VH_PARAM_FLAG_DECAY */
    double clip_grad_norm;  /* global gradient 2-norm limit; 0: off */
} vh_optim_schedule;

/* The shared keys' schema (names, types, defaults, ranges, docs), ended by
 * a NULL key. The host merges it into a 2.1 optimizer's section; a plugin
 * never lists it in its own schema. */
VH_SDK_API extern const vh_config_key vh_optim_shared_keys[];

/* 1 when `key` is one of the shared keys. */
VH_SDK_API int vh_optim_shared_key(const char *key);

/* "cosine", "step", "constant"; NULL for another value. */
VH_SDK_API const char *vh_schedule_kind_name(int32_t kind);

/* Reads the shared keys from `host`'s config (the optim section) into *out
 * (out->struct_size set by the caller) and checks what the schema's ranges
 * cannot say (step_gamma > 0; under cosine min_lr <= lr); total_steps goes
 * into out->total_steps. Fails with config_fail / fail on the host (the
 * message in the host's error). @thread(main). */
VH_SDK_API vh_status vh_optim_schedule_read(vh_host *host, int64_t total_steps,
                                            vh_optim_schedule *out);

/* Warns (host->api->log) about shared keys the recipe sets but the schedule
 * does not read (min_lr without cosine, step_size without step,
 * warmup_init_lr without warm-up) and a cosine that never starts. The host
 * calls it once per run; a plugin has no need to. */
VH_SDK_API void vh_optim_schedule_warn(vh_host *host, const vh_optim_schedule *s);

/* The rate of step t (t < 0 reads as 0), by the formulas above. */
VH_SDK_API double vh_optim_schedule_lr(const vh_optim_schedule *s, int64_t t);

/* Fills args' shared members for step `step`: args->lr (vh_optim_schedule_lr),
 * weight_decay and clip_grad_norm; leaves the rest (struct_size, slices,
 * step, the gradient sum) alone. What the host does before each update;
 * for a plugin's own unit tests. */
VH_SDK_API void vh_optim_schedule_args(const vh_optim_schedule *s, int64_t step,
                                       vh_optim_step_args *args);

/* ---- sums over slices under sharding ------------------------------------
 * A per-tensor rule needs a whole parameter's sum (LAMB: ||p|| and ||u|| of
 * each tensor; clipping: the norm of every gradient). Under FSDP or ZeRO a
 * rank holds slices of some parameters only (vh_param_slices.replicated ==
 * 0): the local sums are partial, and the ranks must add theirs, in one
 * collective with the same layout on every rank. Under DDP every rank holds
 * every slice (replicated == 1): the local sums are already whole and no
 * collective runs. Every function below is collective when the slices are
 * sharded and world_size > 1: every rank calls it, in the same order. Sums
 * are in double; the buffers are host memory (a comm backend that takes
 * device buffers, NCCL, needs a device-side sum instead).
 *
 * Parameters are numbered by the table (vh_optim_setup.table), the same on
 * every rank: the params of unit 0 in order, then those of unit 1, ... */

/* Parameter tensors in the table (the sum of every unit's num_params). */
VH_SDK_API int64_t vh_param_table_tensors(const vh_param_table *table);

/* The number of (unit, param) in table order; -1 when out of range. */
VH_SDK_API int64_t vh_param_table_index(const vh_param_table *table, int32_t unit,
                                        int32_t param);

/* Sums `count` doubles over the ranks in place (all-reduce, sum) when the
 * slices are sharded; nothing when they are replicated or there is one
 * rank. `sums` holds what this rank's slices contribute, in a layout every
 * rank shares (per-parameter sums: vh_param_table_index). */
VH_SDK_API vh_status vh_slices_reduce_sums(vh_host *host, const vh_param_slices *slices,
                                           double *sums, size_t count);

/* Which buffer of a slice a sum of squares reads. */
typedef enum vh_slice_buffer {
    VH_SLICE_BUFFER_GRAD = 0,
    VH_SLICE_BUFFER_MASTER = 1,
} vh_slice_buffer;

/* The sum of squares of every element of every slice's gradient (or
 * master), over every rank: the squared global norm (clipping). f32, f16
 * and bf16 buffers; another dtype fails (VH_STATUS_ERR_UNSUPPORTED). */
VH_SDK_API vh_status vh_slices_sum_sq(vh_host *host, const vh_param_slices *slices,
                                      int32_t buffer, double *out);

/* The same per parameter: per_param[vh_param_table_index(table, unit,
 * param)] for each of the table's vh_param_table_tensors(table) parameters
 * (zero for a parameter no rank holds a slice of). */
VH_SDK_API vh_status vh_slices_sum_sq_per_param(vh_host *host, const vh_param_slices *slices,
                                                const vh_param_table *table, int32_t buffer,
                                                double *per_param);

#ifdef __cplusplus
}
#endif
#endif
