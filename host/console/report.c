/* report.c - the lines a run prints as it trains (see report.h). */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "signals.h"

void report_step(vh_progress *p, const vh_train_metrics *m, int64_t total, int show_mfu,
                 const vh_progress_scale *scale) {
    progress_clear(p);
    fprintf(p->out, "train step %lld/%lld epoch %lld: loss %.4f lr %.3g img/s %.1f TFLOP/s %.4f",
            (long long)m->step, (long long)total, (long long)m->epoch, m->loss, m->lr,
            m->img_per_s, m->tflops);
    if (show_mfu) fprintf(p->out, " MFU %.1f%%", 100.0 * m->mfu);
    if (m->world_size > 1)
        fprintf(p->out, " | %d ranks, %.1f img/s each, comm %.2f MiB/step, waited %.1f ms/step",
                (int)m->world_size, m->img_per_s_per_rank, m->comm_bytes_per_step / 1048576.0,
                m->comm_wait_ms_per_step);
    char text[64];
    progress_scale_text(text, sizeof text, scale);
    fprintf(p->out, "%s%s\n", text, m->skipped ? " (step skipped: overflow)" : "");
    progress_flush(p);
}

void report_eval(vh_progress *p, int64_t step, int64_t epoch, const vh_eval_result *r) {
    progress_clear(p);
    fprintf(p->out,
            "eval  step %lld epoch %lld: top1 %.2f%% top5 %.2f%% loss %.4f",
            (long long)step, (long long)epoch, 100.0 * r->top1, 100.0 * r->top5, r->loss);
    if (r->has_ema)
        fprintf(p->out, "; ema top1 %.2f%% top5 %.2f%% loss %.4f", 100.0 * r->ema_top1,
                100.0 * r->ema_top5, r->ema_loss);
    fprintf(p->out, " (%lld images)\n", (long long)r->samples);
    progress_flush(p);
}

void report_checkpoint(vh_progress *p, const char *dir, int64_t step, double seconds) {
    progress_clear(p);
    fprintf(p->out, "vithost: checkpoint %s/checkpoints/step-%08lld (%.2f s)\n", dir,
            (long long)step, seconds);
}

void report_finished(vh_progress *p, int64_t steps, float loss, const vh_eval_result *eval,
                     const char *dir) {
    progress_clear(p);
    fprintf(p->out, "vithost: finished %lld steps", (long long)steps);
    if (isfinite(loss)) fprintf(p->out, "; final loss %.4f", (double)loss);
    if (eval) fprintf(p->out, "; eval top1 %.2f%%", 100.0 * eval->top1);
    if (eval && eval->has_ema) fprintf(p->out, " (ema %.2f%%)", 100.0 * eval->ema_top1);
    fprintf(p->out, "; peak memory %.1f MiB; run folder %s\n",
            (double)metrics_peak_rss_bytes() / 1048576.0, dir);
    progress_flush(p);
}

/* Appends word to buf, in single quotes when a shell would change it. */
static void append_quoted(char *buf, size_t len, const char *word) {
    size_t used = strlen(buf);
    int plain = word[0] != '\0' &&
                word[strspn(word, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                  "0123456789_-+=.,/:@%")] == '\0';
    if (plain) {
        snprintf(buf + used, len - used, " %s", word);
        return;
    }
    used += (size_t)snprintf(buf + used, len - used, " '");
    for (const char *c = word; *c && used + 5 < len; c++) {
        if (*c == '\'') used += (size_t)snprintf(buf + used, len - used, "'\\''");
        else buf[used++] = *c, buf[used] = '\0';
    }
    if (used < len) snprintf(buf + used, len - used, "'");
}

static void append(char *buf, size_t len, const char *text) {
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s", text);
}

/* The command that continues this run as it was started: on as many ranks
 * (the launcher's command for N), its recipe, every --set (a resumed run
 * without them would be another run) and its folder. */
static void resume_command(const vh_run *run, const char *dir, char *buf, size_t len) {
    buf[0] = '\0';
    if (run->comm.world_size > 1)
        snprintf(buf, len, "%s %d ", run_launcher_command(), (int)run->comm.world_size);
    append(buf, len, "vithost run");
    append_quoted(buf, len, run->recipe.file);
    for (int i = 0; i < run->opts.num_sets; i++) {
        append(buf, len, " --set");
        append_quoted(buf, len, run->opts.sets[i]);
    }
    append(buf, len, " --out");
    append_quoted(buf, len, dir);
    append(buf, len, " --resume");
}

vh_status report_stopped(vh_progress *p, const vh_run *run, const char *dir, int64_t step,
                         int by_signal, vh_diag *d) {
    progress_clear(p);
    char again[3000];
    resume_command(run, dir, again, sizeof again);
    /* OpenMPI's mpirun exits 1 after its own Ctrl-C or SIGTERM, whatever
     * the ranks return (signals.h): say so, or the 1 reads as a failure */
    int ompi_abort = by_signal && run->comm.world_size > 1 &&
                     signals_stop_by_launcher_abort() && getenv("OMPI_COMM_WORLD_SIZE");
    return diag_set(d, VH_STATUS_ERR_INTERRUPTED,
                    "stopped at step %lld (%s) with a checkpoint%s; continue with: %s",
                    (long long)step, by_signal ? "signal" : "--stop-after",
                    ompi_abort ? " (mpirun itself exits 1 after a Ctrl-C or SIGTERM; "
                                 "`kill -USR1` to mpirun stops the job with exit 5)"
                               : "",
                    again);
}
