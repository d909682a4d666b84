/* outcome.h - what a run's steps came to, checked as it trains: the policy
 * for steps that do not train (the precision plugin skipped them: Inf/NaN
 * gradients), the cause of a run of them the host can tell, and the newest
 * checkpoint known good.
 *
 * The limits (the run section): more than run.max_consecutive_skips steps
 * skipped in a row, or more than run.max_skipped_steps in all, stop the run
 * with VH_STATUS_ERR_NUMERIC (exit 1); so does a run none of whose steps
 * trained. The message names the cause (a non-finite input batch, weights
 * that are not finite or too large for their compute dtype, a loss scale
 * that no longer backs off, one still backing off) and the last good
 * checkpoint.
 *
 * A checkpoint is good once the weights it holds are seen to train: a later
 * step trained (its gradients were finite), or an evaluation of it had a
 * finite loss. Periodic checkpoints wait while steps are skipped (they would
 * hold the same weights) so that a run that no longer trains does not rotate
 * the good ones away. Skips are agreed over ranks by the precision plugin,
 * so every rank counts the same and stops at the same step; the cause is
 * agreed there with one collective. */
#ifndef VITHOST_HOST_OUTCOME_H
#define VITHOST_HOST_OUTCOME_H

#include <stdint.h>

#include "diag.h"
#include "session.h"

typedef struct vh_outcome_ckpt {
    char path[4400]; /* "" none */
    int64_t step;
} vh_outcome_ckpt;

typedef struct vh_outcome {
    int64_t max_skipped, max_consecutive; /* 0: no limit */
    int64_t trained;      /* steps of this run that updated the weights */
    int64_t streak;       /* steps skipped in a row, up to the last one */
    int64_t streak_first; /* the step (1-based) the streak began at */
    double scale_first;   /* the loss scale its first step ran with */
    double scale_last;    /* the loss scale its last step ran with */
    int64_t bad_input;    /* steps of the streak whose batch (this rank's) held NaN/Inf */
    int64_t first_bad_input;
    int64_t bad_loss;     /* steps of the streak whose loss (this rank's) was NaN/Inf */
    float last_loss;      /* this rank's loss at the streak's last step */
    int save_deferred;    /* a periodic checkpoint waits for a step that trains */
    /* The newest two good checkpoints, the newest not yet seen good, and the
     * newest this run wrote or resumed from (latest). */
    vh_outcome_ckpt good, good_prev, pending, latest;
} vh_outcome;

/* The limits from the run section; resumed_from: the checkpoint the run
 * starts from ("" none), at step. */
void outcome_init(vh_outcome *o, const vh_run *run, const char *resumed_from, int64_t step);

/* After a step numbered `step` (1-based): skipped or trained, the loss scale
 * it ran with, and on a skipped step its loss (read back) and its batch. */
void outcome_step(vh_outcome *o, int64_t step, int skipped, double scale, float loss,
                  const vh_batch *host_batch);

/* A checkpoint written at `step`; an evaluation at `step` with this loss. */
void outcome_saved(vh_outcome *o, const char *path, int64_t step);
void outcome_evaluated(vh_outcome *o, int64_t step, double loss);

/* After outcome_step: VH_STATUS_ERR_NUMERIC with the message when a limit
 * is passed (on every rank alike: it may call a collective). skipped_total
 * counts the run's skips with those before a resume; scale_now is the
 * scale the next step would run with. */
vh_status outcome_check(vh_outcome *o, vh_session *s, int64_t skipped_total, double scale_now,
                        vh_diag *d);

/* At the end of the schedule: a run none of whose `steps` trained fails. */
vh_status outcome_check_end(vh_outcome *o, vh_session *s, int64_t steps, double scale_now,
                            vh_diag *d);

/* An evaluation during training found NaN/Inf (d holds its message): in a
 * run of skipped steps, the run's cause (as outcome_check); else the
 * message with the last good checkpoint. VH_STATUS_ERR_NUMERIC. */
vh_status outcome_eval_failed(vh_outcome *o, vh_session *s, double scale_now, vh_diag *d);

/* "; the last good checkpoint is D" (with how to resume from it when
 * checkpoints/latest names another), or why there is none; for weights
 * that gave a bad loss at `step`, a good one is older than step - 1. */
void outcome_good_text(const vh_outcome *o, int64_t step, char *buf, size_t len);

#endif
