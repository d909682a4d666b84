/* progress.h - the lines a run prints while it trains: one line per logged
 * step, one per evaluation, and on a terminal one line redrawn in place
 * between them; and the clock they measure throughput with. */
#ifndef VITHOST_HOST_PROGRESS_H
#define VITHOST_HOST_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "diag.h"

typedef struct vh_progress {
    FILE *out;
    int tty;
    /* writes to out: run.write_errors is warn (set after progress_init),
     * the errno of the first failed flush, whether the warning was given */
    int keep_going, write_errno, warned;
    double window_start, last_draw, run_start;
    int64_t window_images;
    /* the first drawn step and when: the ETA's rate (a resumed run's
     * earlier steps took no time of this process) */
    int64_t first_drawn_step;
    double first_draw;
} vh_progress;

/* Seconds on a monotonic clock. */
double progress_now(void);

void progress_init(vh_progress *p, FILE *out);

/* Images per second since the window started (the last logged step). */
double progress_img_per_s(const vh_progress *p);
/* A new window starts (after a logged step). */
void progress_restart_window(vh_progress *p);
/* Time spent since `since` (evaluation, checkpoints) is not training time. */
void progress_pause(vh_progress *p, double since);

/* What a loss-scaled run adds to its progress lines: shown once the run
 * has scaled its loss (a scale other than 1) or skipped a step. */
typedef struct vh_progress_scale {
    int show;
    double loss_scale;     /* after the last step's update */
    int64_t skipped_steps; /* since the run started */
} vh_progress_scale;

/* On a terminal, one line redrawn in place (at most 10 times a second):
 * whether the next progress_draw draws (so the caller fetches the loss only
 * then), and the drawing. */
int progress_due(const vh_progress *p, int64_t step, int64_t total);
void progress_draw(vh_progress *p, int64_t step, int64_t total, float loss,
                   const vh_progress_scale *scale);
/* The bar of the redrawn line: len - 1 characters, '#' for the share done
 * (0..1) and '.' for the rest, e.g. "[#########...............]  37%  step
 * 370/1000 ... eta 1m02s" (the ETA: the run's mean time per step so far,
 * times the steps left). Lines off a terminal are unchanged. */
#define PROGRESS_BAR_WIDTH 24
void progress_bar_text(char *buf, size_t len, double done);
/* " scale 65536 skipped 2" (empty when !scale->show), for the lines. */
void progress_scale_text(char *buf, size_t len, const vh_progress_scale *scale);
/* Clears the redrawn line before a line that stays. */
void progress_clear(vh_progress *p);

/* fflush(out), keeping the errno of a failure for progress_check (a stream
 * forgets it: its next flush succeeds with nothing left to write). */
void progress_flush(vh_progress *p);
/* Whether every line reached out (a log file on a full disk does not): OK,
 * or VH_STATUS_ERR_IO naming the stream, its file and the errno; under
 * keep_going a warning on stderr, once, and OK. */
vh_status progress_check(vh_progress *p, vh_diag *d);

#endif
