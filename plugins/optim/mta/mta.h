/* mta.h - the mta optimizer instance, shared by its glue (mta.c) and its
 * step (step.c).
 *
 * Two counters, two jobs:
 *   - the host's `step` argument (every training step, including those the
 *     precision plugin skipped on overflow) drives the LR schedule, like
 *     timm's num_updates;
 *   - `updates` (updates actually applied, saved in the scalar state) drives
 *     Adam's bias correction (t = updates + 1), like torch's state["step"],
 *     which a skipped GradScaler step does not advance.
 * A resumed run restores `updates` with state_load and gets `step` from the
 * host, so it continues bit for bit.
 */
#ifndef VH_MTA_MTA_H
#define VH_MTA_MTA_H

#include <stdint.h>

#include "schedule.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "worklist.h"

typedef enum mta_algo {
    MTA_ALGO_ADAMW = 0,
    MTA_ALGO_SGD = 1,
    MTA_ALGO_LAMB = 2,
} mta_algo;

typedef struct mta_config {
    mta_algo algo;
    double weight_decay; /* on slices flagged VH_PARAM_FLAG_DECAY only */
    double beta1, beta2, eps; /* adamw, lamb */
    double momentum;          /* sgd */
    int nesterov;             /* sgd */
    int always_adapt;         /* lamb: trust ratio on no-decay tensors too */
    double clip_grad_norm;    /* 0: off */
} mta_config;

typedef struct mta {
    vh_host *host;
    mta_config cfg;
    mta_schedule schedule;
    int32_t state_slots;
    int64_t updates;   /* updates applied so far */
    int64_t last_step; /* the host's step of the last update; -1 before */
    double grad_norm;  /* global gradient norm of the last update (clipping on), else NAN */
    mta_worklist work;
} mta;

/* "adamw", "sgd", "lamb". */
const char *mta_algo_name(mta_algo algo);

/* One update of every slice (step.c). */
vh_status mta_step(mta *o, const vh_param_slices *slices, int64_t step, double *lr_out);

#endif
