/* session.h - the five plugin instances of a run and where the run stands,
 * shared by the training step (step.c), evaluation (evaluate.c), the loop
 * (train_loop.c), checkpoints (checkpoint.c) and weight files (weights.c).
 *
 * session_open opens the device and the communicator (once per run), creates the plugins in
 * dependency order and allocates the batch buffers; it leaves the parameters
 * unset: weights_load_model sets them (from the init rules, a file, or a
 * checkpoint), once.
 */
#ifndef VITHOST_HOST_SESSION_H
#define VITHOST_HOST_SESSION_H

#include <stdio.h>

#include "diag.h"
#include "vtables.h"
#include "metrics.h"
#include "runtime.h"

struct vh_session;

/* Host state a checkpoint carries beside the plugins' (the EMA of the
 * weights, train/ema.h), set by the loop: save and load write and read
 * CKPT/<name>.safetensors (collective); state.json holds its checksum and
 * *counter as "<name>_updates". name NULL: none. */
typedef struct vh_checkpoint_extra {
    const char *name;
    void *ctx;
    int64_t *counter;
    vh_status (*save)(void *ctx, struct vh_session *s, const char *path, vh_diag *d);
    vh_status (*load)(void *ctx, struct vh_session *s, const char *path, vh_diag *d);
} vh_checkpoint_extra;

typedef struct vh_session {
    vh_run *run;
    FILE *out;
    int trace;
    void *self[VH_HOST_ROLE_COUNT];
    /* The host's full-size copies (loader.h): optional calls a plugin lacks
     * are the host's defaults, except the ones documented in vtables.h. */
    const vh_model_vtable *model;
    const vh_precision_vtable *precision;
    const vh_sharding_vtable *sharding;
    const vh_optim_vtable *optim;
    const vh_data_vtable *data;
    vh_data_info info;
    vh_precision_policy policy;
    const vh_param_table *table;
    vh_unit_hooks hooks;
    vh_param_slices slices;
    int32_t state_slots;
    uint32_t optim_caps;   /* VH_OPTIM_CAP_*, handed to the sharding plugin (ABI 2.9) */
    /* The optim section's shared keys (vh_optim_schedule.h), read when the
     * optimizer takes them (ABI 2.1: has_schedule); update's lr comes from it. */
    vh_optim_schedule schedule;
    int has_schedule;
    int64_t batch_size;    /* of a micro-batch, on this rank */
    int64_t grad_accum;    /* micro-batches per optimizer step (run.grad_accum) */
    /* Device copies of the batch when the device is not the CPU. */
    void *dev_images, *dev_labels;
    float *host_logits;
    void *dev_scalars;     /* VH_SESSION_SCALARS doubles on a non-CPU device */

    /* where the run stands */
    int64_t step, epoch;   /* steps done; epoch of the pass in progress */
    int epoch_in_progress; /* a training pass was started (or resumed) */
    vh_metrics metrics;
    vh_checkpoint_extra ckpt_extra;
} vh_session;

vh_status session_open(vh_session *s, vh_run *run, vh_diag *d);
void session_close(vh_session *s);

/* Fills the shared-key members of an optimizer's update args (lr from the
 * SDK's schedule for args->step, weight_decay, clip_grad_norm). */
void session_optim_args(const vh_session *s, vh_optim_step_args *args);

/* A failed plugin call as one message naming role, plugin, call and the
 * plugin's own words. */
vh_status session_plugin_error(vh_session *s, vh_role role, vh_status st, const char *call,
                               vh_diag *d);

/* With --trace, prints "trace: " and the line. */
void session_trace(const vh_session *s, const char *fmt, ...) VH_PRINTF_LIKE(2, 3);

/* The next training or eval batch: data.next, checked against the data's
 * info, copied to the device. *has = 0 at the end of the pass. */
vh_status session_next_batch(vh_session *s, vh_batch *host_batch, vh_batch *batch, int *has,
                             vh_diag *d);

/* Whether a host batch's f32 images hold an Inf or NaN (exponent bits all
 * set: cheaper than isfinite; run on skipped steps and failed evaluations
 * only). 0 for other dtypes. */
int session_batch_not_finite(const vh_batch *b);

/* The loss a forward left in device memory, copied back: only when the
 * host needs the number (a log line, a NaN check, evaluation). */
vh_status session_read_loss(vh_session *s, const float *dev_loss, float *out, vh_diag *d);

/* The host's own numbers summed (or maxed, averaged) over ranks, in place:
 * the logged loss, evaluation totals, the agreement to stop. Goes through
 * device memory where the device is not the CPU (a GPU backend's
 * collectives take device buffers); at most VH_SESSION_SCALARS values. */
#define VH_SESSION_SCALARS 8
vh_status session_reduce_scalars(vh_session *s, double *values, int n, vh_reduce_op op,
                                 vh_diag *d);

/* ---- step.c -------------------------------------------------------------- */

/* One training step on a batch (DESIGN.md's order). *dev_loss: the step's
 * mean loss, in device memory until the next forward; *skipped when the
 * precision plugin found an overflow and the optimizer step was skipped. */
vh_status session_step(vh_session *s, const vh_batch *batch, int64_t step,
                       const float **dev_loss, double *lr, int *skipped, vh_diag *d);

/* The same step in parts, for gradient accumulation (run.grad_accum):
 * begin (zero_grads), then `count` micro-batches (micro 0..count-1: with
 * count > 1 sharding.set_sync 0, and 1 on the last; forward; backward with
 * the loss scale / count; wait after the last), then end (overflow check,
 * optimizer, refresh, precision.update) on the accumulated gradient.
 * count > 1 needs a sharding plugin with set_sync (session_open checks). */
vh_status session_step_begin(vh_session *s, vh_diag *d);
vh_status session_step_micro(vh_session *s, const vh_batch *batch, int64_t micro,
                             int64_t count, const float **dev_loss, vh_diag *d);
vh_status session_step_end(vh_session *s, int64_t step, double *lr, int *skipped, vh_diag *d);

/* The order of one training step, as printed at the start of a run. */
extern const char vh_step_order[];

/* ---- evaluate.c ---------------------------------------------------------- */

typedef struct vh_eval_result {
    int64_t samples;
    double loss, top1, top5;
    /* the same with the EMA weights swapped in (train/ema.h), when has_ema */
    int has_ema;
    double ema_loss, ema_top1, ema_top5;
} vh_eval_result;

/* One evaluation pass over the eval split, summed over ranks. */
vh_status session_evaluate(vh_session *s, vh_eval_result *res, vh_diag *d);

#endif
