/* train_loop.h - the training schedule behind `vithost run`: epochs of
 * training steps with evaluations, metrics, checkpoints, resume, and a
 * clean stop on a signal or --stop-after. Its lines are console/'s. */
#ifndef VITHOST_HOST_TRAIN_LOOP_H
#define VITHOST_HOST_TRAIN_LOOP_H

#include <stdint.h>

#include "diag.h"
#include "runtime.h"

typedef struct vh_train_options {
    const char *out_dir; /* run folder; NULL: runs/<recipe name>-<time> */
    int resume;          /* continue the run in out_dir from its latest checkpoint */
    int64_t stop_after;  /* stop (with a checkpoint) after this many steps; 0: never */
} vh_train_options;

/* Trains to the end. VH_STATUS_ERR_INTERRUPTED: stopped early by a signal or
 * stop_after, with a checkpoint written (the run can be resumed). */
vh_status train_run(vh_run *run, const vh_train_options *o, vh_diag *d);

#endif
