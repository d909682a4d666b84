/* metrics.c - DIR/metrics.jsonl. */
#define _POSIX_C_SOURCE 200809L
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

int64_t metrics_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

/* The "step" of one JSON line, or -1. */
static int64_t line_step(const char *line) {
    const char *p = strstr(line, "\"step\":");
    return p ? strtoll(p + 7, NULL, 10) : -1;
}

/* The "skipped_steps" of one JSON line, or 0. */
static int64_t line_skipped_steps(const char *line) {
    const char *p = strstr(line, "\"skipped_steps\":");
    return p ? strtoll(p + 16, NULL, 10) : 0;
}

/* Rewrites the file keeping lines up to a step, through a temp file; the
 * largest skipped_steps kept goes to *skipped_steps. */
static vh_status rewind_file(const char *path, int64_t keep_up_to_step, int64_t *skipped_steps,
                             vh_diag *d) {
    FILE *in = fopen(path, "r");
    if (!in) return errno == ENOENT ? VH_STATUS_OK : diag_set(d, VH_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fclose(in);
        return diag_set(d, VH_STATUS_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, in)) > 0) {
        /* a line without its newline was cut (a crash mid-write): the next
         * line would be spliced onto it */
        if (line[n - 1] != '\n' || line_step(line) > keep_up_to_step) continue;
        fputs(line, out);
        int64_t skipped = line_skipped_steps(line);
        if (skipped > *skipped_steps) *skipped_steps = skipped;
    }
    free(line);
    int ok = !ferror(in);
    fclose(in);
    ok = fflush(out) == 0 && !ferror(out) && ok;
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(tmp, path) != 0)
        return diag_set(d, VH_STATUS_ERR_IO, "cannot rewrite %s: %s", path, strerror(errno));
    return VH_STATUS_OK;
}

/* VITHOST_TEST_METRICS_FULL_AFTER=N[:K] (metrics.h). */
static void test_hook(vh_metrics *m) {
    m->test_room = -1;
    m->test_fails = -1;
    const char *v = getenv("VITHOST_TEST_METRICS_FULL_AFTER");
    if (!v || !*v) return;
    char *end;
    m->test_room = strtoll(v, &end, 10);
    if (*end == ':') m->test_fails = strtoll(end + 1, NULL, 10);
    if (m->test_room < 0) m->test_room = 0;
}

vh_status metrics_open(vh_metrics *m, const char *dir, int64_t keep_up_to_step, int keep_going,
                       vh_diag *d) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    m->keep_going = keep_going;
    test_hook(m);
    size_t len = strlen(dir) + sizeof "/metrics.jsonl";
    m->path = malloc(len);
    if (!m->path) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    snprintf(m->path, len, "%s/metrics.jsonl", dir);
    if (keep_up_to_step >= 0) {
        vh_status st = rewind_file(m->path, keep_up_to_step, &m->kept_skipped_steps, d);
        if (st != VH_STATUS_OK) return st;
    }
    m->fd = open(m->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (m->fd < 0) return diag_set(d, VH_STATUS_ERR_IO, "%s: %s", m->path, strerror(errno));
    m->open = 1;
    return VH_STATUS_OK;
}

void metrics_close(vh_metrics *m) {
    if (m->open && m->lost > 0)
        fprintf(stderr,
                "vithost: warning: %s lacks %lld line(s), of steps %lld to %lld: they could "
                "not be written\n",
                m->path, (long long)m->lost, (long long)m->first_lost_step,
                (long long)m->last_lost_step);
    if (m->open) close(m->fd);
    free(m->path);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

vh_status metrics_check(const vh_metrics *m, vh_diag *d) {
    if (m->status == VH_STATUS_OK) return VH_STATUS_OK;
    return diag_set(d, m->status, "%s", m->error.text);
}

/* ---- one line, one write ------------------------------------------------------ */

typedef struct line {
    char text[1024]; /* a line is about 400 characters */
    size_t len;
} line;

static void put(line *l, const char *fmt, ...) VH_PRINTF_LIKE(2, 3);
static void put(line *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
    va_end(ap);
    if (n > 0) l->len += (size_t)n;
    if (l->len >= sizeof l->text) l->len = sizeof l->text - 1; /* cut, and then not JSON */
}

/* JSON has no NaN or Infinity: write null. */
static void put_number(line *l, const char *key, double v) {
    if (isfinite(v)) put(l, ",\"%s\":%.9g", key, v);
    else put(l, ",\"%s\":null", key);
}

/* write(), through the test hook: a short write once the room is used up,
 * then ENOSPC (for test_fails calls, then room again). */
static ssize_t file_write(vh_metrics *m, const char *p, size_t n) {
    if (m->test_room >= 0 && (int64_t)n > m->test_room) {
        if (m->test_room == 0) {
            if (m->test_fails > 0 && --m->test_fails == 0) m->test_room = -1;
            errno = ENOSPC;
            return -1;
        }
        n = (size_t)m->test_room;
    }
    ssize_t w = write(m->fd, p, n);
    if (w > 0 && m->test_room >= 0) m->test_room -= w;
    return w;
}

/* The whole line or nothing: a part written before a failure is cut off
 * again, or the next line would be spliced onto it. 0 with errno set. */
static int write_whole(vh_metrics *m, const char *text, size_t len) {
    off_t start = lseek(m->fd, 0, SEEK_END); /* where O_APPEND puts it: one writer */
    size_t done = 0;
    while (done < len) {
        ssize_t n = file_write(m, text + done, len - done);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        int e = n < 0 ? errno : EIO;
        if (done > 0 && start >= 0 && ftruncate(m->fd, start) != 0) e = errno;
        errno = e;
        return 0;
    }
    return 1;
}

/* stop: the run ends with the file and errno named; warn: said once, and
 * again when lines are written again. */
static vh_status write_line(vh_metrics *m, int64_t step, line *l) {
    if (!m->open || m->status != VH_STATUS_OK) return m->status;
    if (l->len > sizeof l->text - 2) l->len = sizeof l->text - 2;
    l->text[l->len++] = '\n';
    if (write_whole(m, l->text, l->len)) {
        if (m->lost > 0)
            fprintf(stderr, "vithost: warning: %s: written again from step %lld; %lld line(s) "
                            "of steps %lld to %lld are missing\n",
                    m->path, (long long)step, (long long)m->lost, (long long)m->first_lost_step,
                    (long long)m->last_lost_step);
        m->lost = 0;
        return VH_STATUS_OK;
    }
    int e = errno;
    if (!m->keep_going)
        return m->status = diag_set(
                   &m->error, VH_STATUS_ERR_IO,
                   "cannot write %s: %s (errno %d) at step %lld; the run stops (free space, "
                   "then resume from the last checkpoint with --resume, or start again; "
                   "run.write_errors: warn would go on without the lines)",
                   m->path, strerror(e), e, (long long)step);
    if (m->lost++ == 0) {
        m->first_lost_step = step;
        fprintf(stderr, "vithost: warning: cannot write %s: %s (errno %d) at step %lld; the run "
                        "goes on without these lines (run.write_errors: warn)\n",
                m->path, strerror(e), e, (long long)step);
    }
    m->last_lost_step = step;
    return VH_STATUS_OK;
}

vh_status metrics_train(vh_metrics *m, const vh_train_metrics *v) {
    if (!m->open) return VH_STATUS_OK;
    line l = {.len = 0};
    put(&l, "{\"step\":%lld,\"epoch\":%lld", (long long)v->step, (long long)v->epoch);
    put_number(&l, "loss", v->loss);
    put_number(&l, "lr", v->lr);
    put_number(&l, "img_per_s", v->img_per_s);
    put_number(&l, "tflops", v->tflops);
    put_number(&l, "mfu", v->mfu);
    put(&l, ",\"peak_mem_bytes\":%lld", (long long)v->peak_mem_bytes);
    if (v->peak_device_mem_bytes >= 0)
        put(&l, ",\"peak_device_mem_bytes\":%lld", (long long)v->peak_device_mem_bytes);
    put_number(&l, "loss_scale", v->loss_scale);
    put(&l, ",\"skipped_steps\":%lld", (long long)v->skipped_steps);
    if (v->skipped) put(&l, ",\"skipped\":true");
    put(&l, ",\"world_size\":%d,\"global_batch\":%lld", (int)v->world_size,
        (long long)v->global_batch);
    put_number(&l, "img_per_s_per_rank", v->img_per_s_per_rank);
    put_number(&l, "comm_bytes_per_step", v->comm_bytes_per_step);
    put_number(&l, "comm_wait_ms_per_step", v->comm_wait_ms_per_step);
    put(&l, "}");
    return write_line(m, v->step, &l);
}

vh_status metrics_eval(vh_metrics *m, int64_t step, int64_t epoch, double top1, double top5,
                       double loss, int64_t samples, const double *ema) {
    if (!m->open) return VH_STATUS_OK;
    line l = {.len = 0};
    put(&l, "{\"step\":%lld,\"epoch\":%lld", (long long)step, (long long)epoch);
    put_number(&l, "eval_top1", top1);
    put_number(&l, "eval_top5", top5);
    put_number(&l, "eval_loss", loss);
    put(&l, ",\"eval_samples\":%lld", (long long)samples);
    if (ema) {
        put_number(&l, "ema_top1", ema[0]);
        put_number(&l, "ema_top5", ema[1]);
        put_number(&l, "ema_loss", ema[2]);
    }
    put(&l, "}");
    return write_line(m, step, &l);
}
