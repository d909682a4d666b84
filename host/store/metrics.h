/* metrics.h - the run's metrics file, DIR/metrics.jsonl: one JSON object per
 * line, training lines and evaluation lines (see README's interface
 * contract). Each line goes to the file in one write() as it is made, so a
 * crash loses none, and the file holds whole lines only: a line that could
 * not be written whole (a full disk) is cut off again. A failed write ends
 * the run (run.write_errors: stop) or, when the user said so (warn), is
 * reported once and the run goes on without the lines.
 *
 * Test hook: VITHOST_TEST_METRICS_FULL_AFTER=N[:K] makes the file full once
 * N more bytes are written (a short write, then ENOSPC), for K failed
 * writes (default: for ever), as a disk that fills and frees up again. */
#ifndef VITHOST_HOST_METRICS_H
#define VITHOST_HOST_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "diag.h"

typedef struct vh_metrics {
    int open; /* 0: no run folder (not rank 0), nothing written */
    int fd;
    char *path;
    int keep_going; /* run.write_errors: warn */
    /* the first failed write (stop: every later line is dropped too) */
    vh_status status;
    vh_diag error;
    /* warn: lines lost since the last one written, and their steps */
    int64_t lost, first_lost_step, last_lost_step;
    int64_t test_room, test_fails; /* the test hook; room < 0: none */
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
    int64_t peak_device_mem_bytes; /* the device allocator's peak; -1: not known (CPU) */
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
 * checkpoint, so the file tells one consistent history) and a last line
 * without its newline (cut by a crash), and sets kept_skipped_steps.
 * keep_going: run.write_errors is warn. */
vh_status metrics_open(vh_metrics *m, const char *dir, int64_t keep_up_to_step, int keep_going,
                       vh_diag *d);
void metrics_close(vh_metrics *m);
/* Write one line each. They return metrics_check's status; under warn a
 * failure is printed on stderr and the status stays OK. */
vh_status metrics_train(vh_metrics *m, const vh_train_metrics *v);
/* ema: top-1, top-5 and loss of the EMA weights (ema_top1, ema_top5,
 * ema_loss), or NULL when the run keeps no EMA. */
vh_status metrics_eval(vh_metrics *m, int64_t step, int64_t epoch, double top1, double top5,
                       double loss, int64_t samples, const double *ema);
/* OK, or the first failed write (VH_STATUS_ERR_IO naming the file and the
 * errno) copied into d: the run ends with it. */
vh_status metrics_check(const vh_metrics *m, vh_diag *d);

/* Peak resident memory of this process in bytes (getrusage). */
int64_t metrics_peak_rss_bytes(void);

#endif
