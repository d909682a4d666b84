/* metrics.h - the run's metrics file, DIR/metrics.jsonl: one JSON object per
 * line, training lines and evaluation lines (see README's interface
 * contract). Lines are flushed as written, so a crash loses none. */
#ifndef VITHOST_HOST_METRICS_H
#define VITHOST_HOST_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "diag.h"

typedef struct vh_metrics {
    FILE *file; /* NULL: no run folder, nothing written */
    char *path;
    /* After a rewind (keep_up_to_step >= 0): the largest skipped_steps of
     * the training lines kept, 0 without any. Every skipped step writes a
     * line, so this is the count at the checkpoint the run resumes from. */
    int64_t kept_skipped_steps;
} vh_metrics;

/* One training line. loss_scale: the precision plugin's scale after the
 * step's update (the one the next step multiplies the loss gradient by; 1
 * without loss scaling); skipped_steps: steps whose optimizer step was
 * skipped (Inf/NaN gradients) since the run started, this one included. */
typedef struct vh_train_metrics {
    int64_t step, epoch;
    double loss, lr, img_per_s, tflops, mfu;
    int64_t peak_mem_bytes;
    double loss_scale;
    int64_t skipped_steps;
    int skipped; /* this step's optimizer step was skipped (overflow) */
    /* Many ranks: img_per_s is the job's (all ranks), tflops and mfu are
     * per device; comm_* are means over the steps since the last line. */
    int32_t world_size;
    int64_t global_batch;
    double img_per_s_per_rank, comm_bytes_per_step, comm_wait_ms_per_step;
} vh_train_metrics;

/* Opens DIR/metrics.jsonl for appending. With keep_up_to_step >= 0, first
 * drops every line whose step is larger (a resumed run rewinds to its
 * checkpoint, so the file tells one consistent history) and sets
 * kept_skipped_steps. */
vh_status metrics_open(vh_metrics *m, const char *dir, int64_t keep_up_to_step, vh_diag *d);
void metrics_close(vh_metrics *m);
void metrics_train(vh_metrics *m, const vh_train_metrics *v);
void metrics_eval(vh_metrics *m, int64_t step, int64_t epoch, double top1, double top5,
                  double loss, int64_t samples);

/* Peak resident memory of this process in bytes (getrusage). */
int64_t metrics_peak_rss_bytes(void);

#endif
