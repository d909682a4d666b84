/* mta.h - the mta optimizer instance, shared by its glue (mta.c) and its
 * step (step.c).
 *
 * The learning rate, weight decay and clipping limit come with each update
 * (vh_optim_step_args: the SDK's shared keys and schedule); mta's own keys
 * are the algorithm's.
 *
 * Two counters, two jobs:
 *   - the host's `step` (every training step, including those the precision
 *     plugin skipped on overflow) drives the LR schedule, like timm's
 *     num_updates (the host computes the rate from it);
 *   - `updates` (updates actually applied, saved in the scalar state) drives
 *     Adam's bias correction (t = updates + 1), like torch's state["step"],
 *     which a skipped GradScaler step does not advance.
 * A resumed run restores `updates` with state_load and gets `step` from the
 * host, so it continues bit for bit.
 */
#ifndef VH_MTA_MTA_H
#define VH_MTA_MTA_H

#include <stdint.h>

#include "vithost/vh_host.h"
#include "vithost/vh_optim.h"
#include "vithost/vh_params.h"
#include "worklist.h"

typedef enum mta_algo {
    MTA_ALGO_ADAMW = 0,
    MTA_ALGO_SGD = 1,
    MTA_ALGO_LAMB = 2,
} mta_algo;

typedef struct mta_config {
    mta_algo algo;
    double beta1, beta2, eps; /* adamw, lamb */
    double momentum;          /* sgd */
    int nesterov;             /* sgd */
    int always_adapt;         /* lamb: trust ratio on no-decay tensors too */
    double layer_decay;       /* 1: off; else per-parameter rate scales (layer_decay.h) */
    const char *freeze;       /* patterns of the parameters kept fixed (freeze.h); NULL: none */
} mta_config;

typedef struct mta {
    vh_host *host;
    mta_config cfg;
    /* The parameter table (vh_optim_setup.table; NULL from a caller that has
     * none): LAMB numbers its tensors by it, the same on every rank. */
    const vh_param_table *table;
    /* Of the update in progress, from its args. */
    double weight_decay;   /* on slices flagged VH_PARAM_FLAG_DECAY only */
    double clip_grad_norm; /* 0: off */
    int32_t state_slots;
    int64_t updates;   /* updates applied so far */
    int64_t last_step; /* the host's step of the last update; -1 before */
    double grad_norm;  /* global gradient norm of the last update (clipping on), else NAN */
    mta_worklist work;
    /* layer_decay != 1: the rate of (unit u, param p) is lr *
     * lr_scale[scale_first[u] + p] (layer_decay.h); NULL when off. With
     * freeze, frozen[scale_first[u] + p] is 1 for a frozen parameter
     * (freeze.h); NULL when none is. scale_first: NULL when both are off. */
    double *lr_scale;
    unsigned char *frozen;
    int64_t *scale_first;
    int32_t scale_units;
    /* On a CUDA device: the "vh.cuda.mta" extension and its buffers
     * (cuda_step.c); NULL on the CPU. */
    struct mta_cuda *cuda;
} mta;

/* "adamw", "sgd", "lamb". */
const char *mta_algo_name(mta_algo algo);

/* The rate scale of a slice's parameter: 1 without layer decay. */
static inline double mta_lr_scale(const mta *o, const vh_param_slice *sl) {
    return o->lr_scale ? o->lr_scale[o->scale_first[sl->unit] + sl->param] : 1.0;
}

/* 1 when the slice's parameter is frozen (freeze.h): no update at all. */
static inline int mta_frozen(const mta *o, const vh_param_slice *sl) {
    return o->frozen && o->frozen[o->scale_first[sl->unit] + sl->param];
}

/* One update of every slice (step.c); args read through its struct_size. */
vh_status mta_update(mta *o, const vh_optim_step_args *args, double *lr_out);

#endif
