/* schedule.h - learning-rate schedules of the mta optimizer.
 *
 * A schedule is a pure function of the step number: it keeps no state, so a
 * resumed run gets the same rates from the step the host passes in.
 *
 * Step numbering: step t counts from 0 and the update of step t uses lr(t).
 * Linear warm-up over the first W = warmup_steps steps (timm's warmup_t with
 * warmup_prefix, pycls's warm-up factor):
 *
 *     t <  W:  lr(t) = warmup_init_lr + t * ((lr - warmup_init_lr) / W)
 *
 * so step 0 uses warmup_init_lr and step W the full lr; with W = 0 step 0
 * uses lr. After warm-up, with s = t - W:
 *
 *     constant: lr
 *     step:     lr * step_gamma ^ floor(s / step_size)
 *     cosine:   min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * s / (T - W)))
 *               for t < T = total_steps, min_lr from t >= T on
 *
 * Rates are computed in double, as the Python float of a torch/timm loop.
 */
#ifndef VH_MTA_SCHEDULE_H
#define VH_MTA_SCHEDULE_H

#include <stdint.h>

typedef enum mta_schedule_kind {
    MTA_SCHEDULE_KIND_COSINE = 0,
    MTA_SCHEDULE_KIND_STEP = 1,
    MTA_SCHEDULE_KIND_CONSTANT = 2,
} mta_schedule_kind;

typedef struct mta_schedule {
    mta_schedule_kind kind;
    double lr;             /* peak rate, reached at the end of warm-up */
    double warmup_init_lr; /* rate of step 0 when warmup_steps > 0 */
    double min_lr;         /* cosine: the rate at and after total_steps */
    double step_gamma;     /* step: factor every step_size steps */
    int64_t warmup_steps;
    int64_t total_steps;   /* cosine: where it reaches min_lr */
    int64_t step_size;     /* step: > 0 */
} mta_schedule;

/* "cosine", "step", "constant"; -1 when the name is none of them. */
int mta_schedule_kind_parse(const char *name);

/* The rate of step t (t >= 0). */
double mta_schedule_lr(const mta_schedule *s, int64_t t);

#endif
