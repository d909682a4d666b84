/* trainer.h - the state of a training run in progress, shared by the loop
 * (train.c), checkpoints (checkpoint.c) and weight files (weights.c). */
#ifndef VITHOST_HOST_TRAINER_H
#define VITHOST_HOST_TRAINER_H

#include <stdio.h>

#include "diag.h"
#include "metrics.h"
#include "runtime.h"

typedef struct vh_trainer {
    vh_run *run;
    FILE *out;
    int trace;
    void *self[VH_ROLE_COUNT];
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
    int64_t batch_size;
    /* Device copies of the batch when the device is not the CPU. */
    void *dev_images, *dev_labels;
    float *host_logits;

    /* where the run stands */
    int64_t step, epoch;   /* steps done; epoch of the pass in progress */
    int epoch_in_progress; /* a training pass was started (or resumed) */
    vh_metrics metrics;
} vh_trainer;

/* A failed plugin call as one message naming role, plugin, call and the
 * plugin's own words. */
vh_status trainer_plugin_error(vh_trainer *t, vh_role role, vh_status st, const char *call,
                               vh_diag *d);

/* Creates the five plugins in dependency order and initialises parameters
 * from the model's init rules (every rank the same values). */
vh_status trainer_open(vh_trainer *t, vh_run *run, vh_diag *d);
void trainer_close(vh_trainer *t);

/* One evaluation pass over the eval split. */
typedef struct vh_eval_result {
    int64_t samples;
    double loss, top1, top5;
} vh_eval_result;
vh_status trainer_evaluate(vh_trainer *t, vh_eval_result *res, vh_diag *d);

/* The next training or eval batch: data.next, checked against the data's
 * info, copied to the device. *has = 0 at the end of the pass. */
vh_status trainer_next_batch(vh_trainer *t, vh_batch *host_batch, vh_batch *batch, int *has,
                             vh_diag *d);

/* One training step on a batch (DESIGN.md's order); *skipped when the
 * precision plugin found an overflow and the optimizer step was skipped. */
vh_status trainer_step(vh_trainer *t, const vh_batch *batch, int64_t step, float *loss,
                       double *lr, int *skipped, vh_diag *d);

/* With --trace, prints "trace: <what><value>". */
void trainer_trace(const vh_trainer *t, const char *what, long long value);

/* The order of one training step, as printed at the start of a run. */
extern const char vh_step_order[];

#endif
