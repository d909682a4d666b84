/* report.h - the lines a run prints as it trains: a logged step, an
 * evaluation, a checkpoint, the end; and the message of a stopped run
 * with the command that continues it. Each line clears the progress
 * bar's redrawn line first and goes where the bar draws (p->out). */
#ifndef VITHOST_HOST_REPORT_H
#define VITHOST_HOST_REPORT_H

#include <stdint.h>

#include "metrics.h"
#include "progress.h"
#include "runtime.h"
#include "session.h"

/* "train step 40/100 epoch 1: loss ... lr ... img/s ... TFLOP/s ..." with
 * MFU when the device's peak is known (show_mfu), the ranks' share and
 * communication when there are many, and the loss scale once shown. */
void report_step(vh_progress *p, const vh_train_metrics *m, int64_t total, int show_mfu,
                 const vh_progress_scale *scale);
void report_eval(vh_progress *p, int64_t step, int64_t epoch, const vh_eval_result *r);
void report_checkpoint(vh_progress *p, const char *dir, int64_t step, double seconds);
/* The last line: steps, the final loss when finite, the evaluation of the
 * final weights (NULL: none), peak memory and the run folder. */
void report_finished(vh_progress *p, int64_t steps, float loss, const vh_eval_result *eval,
                     const char *dir);

/* Sets d to "stopped at step N (signal|--stop-after) with a checkpoint;
 * continue with: [mpirun -np N ]vithost run ..." (the launcher's command on
 * many ranks, the recipe, every --set and the folder, quoted for a shell)
 * and returns VH_STATUS_ERR_INTERRUPTED. */
vh_status report_stopped(vh_progress *p, const vh_run *run, const char *dir, int64_t step,
                         int by_signal, vh_diag *d);

#endif
