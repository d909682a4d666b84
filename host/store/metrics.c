/* metrics.c - DIR/metrics.jsonl. */
#define _POSIX_C_SOURCE 200809L
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

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
    while (getline(&line, &cap, in) > 0) {
        if (line_step(line) > keep_up_to_step) continue;
        fputs(line, out);
        int64_t skipped = line_skipped_steps(line);
        if (skipped > *skipped_steps) *skipped_steps = skipped;
    }
    free(line);
    fclose(in);
    int ok = fflush(out) == 0;
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(tmp, path) != 0)
        return diag_set(d, VH_STATUS_ERR_IO, "cannot rewrite %s: %s", path, strerror(errno));
    return VH_STATUS_OK;
}

vh_status metrics_open(vh_metrics *m, const char *dir, int64_t keep_up_to_step, vh_diag *d) {
    memset(m, 0, sizeof *m);
    size_t len = strlen(dir) + sizeof "/metrics.jsonl";
    m->path = malloc(len);
    if (!m->path) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    snprintf(m->path, len, "%s/metrics.jsonl", dir);
    if (keep_up_to_step >= 0) {
        vh_status st = rewind_file(m->path, keep_up_to_step, &m->kept_skipped_steps, d);
        if (st != VH_STATUS_OK) return st;
    }
    m->file = fopen(m->path, "a");
    if (!m->file) return diag_set(d, VH_STATUS_ERR_IO, "%s: %s", m->path, strerror(errno));
    return VH_STATUS_OK;
}

void metrics_close(vh_metrics *m) {
    if (m->file) fclose(m->file);
    free(m->path);
    memset(m, 0, sizeof *m);
}

/* JSON has no NaN or Infinity: write null. */
static void put_number(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

void metrics_train(vh_metrics *m, const vh_train_metrics *v) {
    if (!m->file) return;
    fprintf(m->file, "{\"step\":%lld,\"epoch\":%lld", (long long)v->step, (long long)v->epoch);
    put_number(m->file, "loss", v->loss);
    put_number(m->file, "lr", v->lr);
    put_number(m->file, "img_per_s", v->img_per_s);
    put_number(m->file, "tflops", v->tflops);
    put_number(m->file, "mfu", v->mfu);
    fprintf(m->file, ",\"peak_mem_bytes\":%lld", (long long)v->peak_mem_bytes);
    put_number(m->file, "loss_scale", v->loss_scale);
    fprintf(m->file, ",\"skipped_steps\":%lld", (long long)v->skipped_steps);
    if (v->skipped) fputs(",\"skipped\":true", m->file);
    fprintf(m->file, ",\"world_size\":%d,\"global_batch\":%lld", (int)v->world_size,
            (long long)v->global_batch);
    put_number(m->file, "img_per_s_per_rank", v->img_per_s_per_rank);
    put_number(m->file, "comm_bytes_per_step", v->comm_bytes_per_step);
    put_number(m->file, "comm_wait_ms_per_step", v->comm_wait_ms_per_step);
    fputs("}\n", m->file);
    fflush(m->file);
}

void metrics_eval(vh_metrics *m, int64_t step, int64_t epoch, double top1, double top5,
                  double loss, int64_t samples) {
    if (!m->file) return;
    fprintf(m->file, "{\"step\":%lld,\"epoch\":%lld", (long long)step, (long long)epoch);
    put_number(m->file, "eval_top1", top1);
    put_number(m->file, "eval_top5", top5);
    put_number(m->file, "eval_loss", loss);
    fprintf(m->file, ",\"eval_samples\":%lld}\n", (long long)samples);
    fflush(m->file);
}
