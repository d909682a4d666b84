/* progress.c - throughput windows and the terminal's redrawn line (see
 * progress.h). The lines that stay are report.c's. */
#define _POSIX_C_SOURCE 200809L
#include "progress.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double progress_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void progress_init(vh_progress *p, FILE *out) {
    p->out = out;
    p->tty = isatty(fileno(out));
    p->run_start = p->window_start = progress_now();
    p->last_draw = 0.0;
    p->window_images = 0;
    p->first_drawn_step = -1;
    p->first_draw = 0.0;
    p->keep_going = p->write_errno = p->warned = 0;
}

double progress_img_per_s(const vh_progress *p) {
    double dt = progress_now() - p->window_start;
    return dt > 0 ? (double)p->window_images / dt : 0.0;
}

void progress_restart_window(vh_progress *p) {
    p->window_start = progress_now();
    p->window_images = 0;
}

void progress_pause(vh_progress *p, double since) { p->window_start += progress_now() - since; }

static void format_eta(char *buf, size_t len, double seconds) {
    if (!(seconds >= 0) || seconds > 1e7) {
        snprintf(buf, len, "?");
        return;
    }
    long s = (long)seconds;
    if (s >= 3600) snprintf(buf, len, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, len, "%ldm%02lds", s / 60, s % 60);
}

int progress_due(const vh_progress *p, int64_t step, int64_t total) {
    return p->tty && (progress_now() - p->last_draw >= 0.1 || step == total);
}

void progress_scale_text(char *buf, size_t len, const vh_progress_scale *scale) {
    if (!scale || !scale->show) {
        if (len) buf[0] = '\0';
        return;
    }
    snprintf(buf, len, " scale %g skipped %lld", scale->loss_scale,
             (long long)scale->skipped_steps);
}

void progress_bar_text(char *buf, size_t len, double done) {
    if (len == 0) return;
    if (!(done >= 0.0)) done = 0.0;
    if (done > 1.0) done = 1.0;
    size_t width = len - 1, full = (size_t)(done * (double)width + 0.5);
    for (size_t i = 0; i < width; i++) buf[i] = i < full ? '#' : '.';
    buf[width] = '\0';
}

void progress_draw(vh_progress *p, int64_t step, int64_t total, float loss,
                   const vh_progress_scale *scale) {
    if (!p->tty) return;
    double now = progress_now();
    p->last_draw = now;
    if (p->first_drawn_step < 0) {
        p->first_drawn_step = step;
        p->first_draw = now;
    }
    /* seconds per step: since the first draw once there are steps since,
     * else since the start over every step (right for a fresh run) */
    double per_step = step > p->first_drawn_step
                          ? (now - p->first_draw) / (double)(step - p->first_drawn_step)
                      : step > 0 ? (now - p->run_start) / (double)step
                                 : -1.0;
    char eta[32], extra[64];
    format_eta(eta, sizeof eta, per_step >= 0 ? per_step * (double)(total - step) : -1);
    progress_scale_text(extra, sizeof extra, scale);
    char bar[PROGRESS_BAR_WIDTH + 1];
    double done = total > 0 ? (double)step / (double)total : 0.0;
    progress_bar_text(bar, sizeof bar, done);
    fprintf(p->out, "\r\033[K[%s] %3.0f%%  step %lld/%lld  loss %.4f  %.0f img/s%s%s  eta %s",
            bar, 100.0 * (done < 1.0 ? done : 1.0), (long long)step, (long long)total,
            (double)loss, progress_img_per_s(p), extra[0] ? " " : "", extra, eta);
    progress_flush(p);
}

void progress_clear(vh_progress *p) {
    if (p->tty) fputs("\r\033[K", p->out);
}

void progress_flush(vh_progress *p) {
    errno = 0;
    if (fflush(p->out) != 0 && !p->write_errno) p->write_errno = errno ? errno : EIO;
}

/* "standard output (/runs/job.log)": the stream and the file behind it. */
static void stream_name(FILE *f, char *buf, size_t len) {
    int fd = fileno(f);
    const char *name = fd == 1 ? "standard output" : fd == 2 ? "standard error" : "the output";
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = fd >= 0 ? readlink(link, target, sizeof target - 1) : -1;
    if (n > 0) {
        target[n] = '\0';
        snprintf(buf, len, "%s (%s)", name, target);
    } else {
        snprintf(buf, len, "%s", name);
    }
}

vh_status progress_check(vh_progress *p, vh_diag *d) {
    progress_flush(p);
    if (!p->write_errno && !ferror(p->out)) return VH_STATUS_OK;
    if (!p->write_errno) {
        /* a line not flushed through progress_flush failed (the banner's):
         * one newline tells why, and is nothing lost if it goes through */
        clearerr(p->out);
        fputc('\n', p->out);
        progress_flush(p);
    }
    int e = p->write_errno ? p->write_errno : EIO;
    char name[4200];
    stream_name(p->out, name, sizeof name);
    if (!p->keep_going)
        return diag_set(d, VH_STATUS_ERR_IO,
                        "cannot write the progress lines to %s: %s (errno %d); the run stops "
                        "(free space, then resume from the last checkpoint with --resume, or "
                        "start again; run.write_errors: warn would go on without them)",
                        name, strerror(e), e);
    if (!p->warned)
        fprintf(stderr, "vithost: warning: cannot write the progress lines to %s: %s (errno %d); "
                        "the run goes on without them (run.write_errors: warn)\n",
                name, strerror(e), e);
    p->warned = 1;
    p->write_errno = 0;
    clearerr(p->out);
    return VH_STATUS_OK;
}
