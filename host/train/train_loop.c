/* train_loop.c - the schedule of `vithost run`: epochs and steps around
 * session_step, evaluations, metrics, checkpoints, resume and a clean stop
 * (see train_loop.h). What it prints is console/'s (banner.h, report.h). */
#define _POSIX_C_SOURCE 200809L
#include "train_loop.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "banner.h"
#include "checkpoint.h"
#include "comm_stats.h"
#include "ema.h"
#include "flops_probe.h"
#include "outcome.h"
#include "progress.h"
#include "report.h"
#include "run_folder.h"
#include "session.h"
#include "signals.h"
#include "weights.h"

typedef struct loop_state {
    vh_session *s;
    const char *dir;
    int64_t total, steps_per_epoch, epochs, log_every, eval_every, eval_every_steps;
    int64_t checkpoint_every, keep, stop_after, steps_this_run;
    double flops, peak_tflops;
    int peak_configured;      /* run.peak_tflops set: the user's number, never probed again */
    int peak_checked;         /* check_peak has acted (once a run) */
    vh_progress prog;
    /* loss scale after the last step, skipped steps so far (resumed: from
     * the metrics file's kept lines), and whether the lines show them */
    vh_progress_scale scale;
    vh_eval_result last_eval;
    int64_t last_eval_step; /* -1: none yet */
    int32_t world;          /* ranks; each step trains world x batch images */
    int data_keeps_position; /* the data plugin has state_save/state_load */
    /* communication of the steps since the last log line (comm_stats.h) */
    double window_comm_bytes, window_comm_wait;
    int64_t window_steps;
    /* skipped steps, their limits and cause, the last good checkpoint */
    vh_outcome oc;
    vh_ema *ema; /* the EMA of the weights (cfg.decay 0: none) */
} loop_state;

/* ---- evaluation and checkpoints inside the loop --------------------------- */

/* An evaluation in the middle of a training pass (run.eval_every_steps):
 * the pass's position is saved before and restored after, so any data
 * plugin that can resume can be interrupted. */
static vh_status eval_inside_pass(vh_session *s, vh_eval_result *res, vh_diag *d) {
    void *data = s->self[VH_ROLE_DATA];
    size_t size = 0;
    vh_status st = s->data->state_size(data, &size);
    if (st != VH_STATUS_OK) return session_plugin_error(s, VH_ROLE_DATA, st, "data.state_size", d);
    void *saved = malloc(size ? size : 1);
    if (!saved) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    st = s->data->state_save(data, saved, size);
    if (st != VH_STATUS_OK) st = session_plugin_error(s, VH_ROLE_DATA, st, "data.state_save", d);
    if (st == VH_STATUS_OK) st = session_evaluate(s, res, d);
    if (st == VH_STATUS_OK) {
        st = s->data->state_load(data, saved, size);
        if (st != VH_STATUS_OK) st = session_plugin_error(s, VH_ROLE_DATA, st, "data.state_load", d);
    }
    free(saved);
    return st;
}

/* The same evaluation with the EMA weights swapped in, and back. */
static vh_status eval_ema(loop_state *ls, int inside_pass, vh_diag *d) {
    vh_session *s = ls->s;
    vh_eval_result r;
    vh_status st = ema_swap(ls->ema, s, d);
    if (st != VH_STATUS_OK) return st;
    st = inside_pass ? eval_inside_pass(s, &r, d) : session_evaluate(s, &r, d);
    vh_diag back;
    vh_status st2 = ema_swap(ls->ema, s, &back);
    if (st2 != VH_STATUS_OK) return diag_set(d, st2, "%s", back.text);
    if (st != VH_STATUS_OK) return st;
    ls->last_eval.has_ema = 1;
    ls->last_eval.ema_top1 = r.top1;
    ls->last_eval.ema_top5 = r.top5;
    ls->last_eval.ema_loss = r.loss;
    return VH_STATUS_OK;
}

static vh_status run_eval(loop_state *ls, int inside_pass, vh_diag *d) {
    vh_session *s = ls->s;
    double t0 = progress_now();
    vh_status st = inside_pass ? eval_inside_pass(s, &ls->last_eval, d)
                               : session_evaluate(s, &ls->last_eval, d);
    if (st == VH_STATUS_OK && ls->ema->cfg.decay > 0.0) st = eval_ema(ls, inside_pass, d);
    progress_pause(&ls->prog, t0);
    /* (NaN/Inf: after skipped steps, their cause; else the good checkpoint) */
    if (st == VH_STATUS_ERR_NUMERIC)
        return outcome_eval_failed(&ls->oc, s, ls->scale.loss_scale, d);
    if (st != VH_STATUS_OK) return st;
    ls->last_eval_step = s->step;
    outcome_evaluated(&ls->oc, s->step, ls->last_eval.loss);
    report_eval(&ls->prog, s->step, s->epoch, &ls->last_eval);
    const vh_eval_result *e = &ls->last_eval;
    const double ema[3] = {e->ema_top1, e->ema_top5, e->ema_loss};
    metrics_eval(&s->metrics, s->step, s->epoch, e->top1, e->top5, e->loss, e->samples,
                 e->has_ema ? ema : NULL);
    return metrics_check(&s->metrics, d);
}

static vh_status save_checkpoint(loop_state *ls, vh_diag *d) {
    double t0 = progress_now();
    vh_status st = checkpoint_save(ls->s, ls->dir, ls->keep, d);
    progress_pause(&ls->prog, t0);
    if (st == VH_STATUS_OK) {
        report_checkpoint(&ls->prog, ls->dir, ls->s->step, progress_now() - t0);
        char path[4400];
        snprintf(path, sizeof path, "%s/checkpoints/step-%08lld", ls->dir, (long long)ls->s->step);
        outcome_saved(&ls->oc, path, ls->s->step);
    }
    return st;
}

/* A periodic checkpoint waits while steps are skipped: it would hold the
 * weights of the last step that trained, and rotating it in could remove
 * a good one from a run that no longer trains. A stop writes one anyway. */
static vh_status save_if_due(loop_state *ls, int saves, int skipped, int stop, vh_diag *d) {
    int due = (saves || ls->oc.save_deferred) && ls->s->step < ls->total;
    if (due && skipped && !stop) {
        ls->oc.save_deferred = 1;
        return VH_STATUS_OK;
    }
    return due || stop ? save_checkpoint(ls, d) : VH_STATUS_OK;
}

/* ---- the record of a step ------------------------------------------------------ */

/* TFLOP/s per device at img_s, the job's images a second (every rank's). */
static double tflops_at(const loop_state *ls, double img_s) {
    return img_s * ls->flops / 1e12 / ls->world;
}

/* The step's line in metrics.jsonl at img_s (progress_img_per_s, read once
 * by the caller: it reads the clock); returns what it wrote. */
static vh_train_metrics metrics_line(loop_state *ls, double img_s, float loss, double lr,
                                     int skipped) {
    vh_session *s = ls->s;
    double tflops = tflops_at(ls, img_s);
    double steps = ls->window_steps > 0 ? (double)ls->window_steps : 1.0;
    vh_train_metrics m = {.step = s->step, .epoch = s->epoch, .loss = loss, .lr = lr,
                          .img_per_s = img_s, .tflops = tflops,
                          .mfu = ls->peak_tflops > 0 ? tflops / ls->peak_tflops : NAN,
                          .world_size = ls->world,
                          .global_batch = s->batch_size * s->grad_accum * ls->world,
                          .img_per_s_per_rank = img_s / ls->world,
                          .comm_bytes_per_step = ls->window_comm_bytes / steps,
                          .comm_wait_ms_per_step = 1e3 * ls->window_comm_wait / steps,
                          .peak_mem_bytes = metrics_peak_rss_bytes(),
                          .peak_device_mem_bytes = run_device_peak_bytes(s->run),
                          .loss_scale = ls->scale.loss_scale,
                          .skipped_steps = ls->scale.skipped_steps, .skipped = skipped};
    metrics_train(&s->metrics, &m);
    return m;
}

/* A rate above the peak means the peak is wrong. A probe at the start can
 * read low when the machine is busy just then (the main job once printed
 * MFU 148% after a 209 GFLOP/s probe on a 440 GFLOP/s CPU): probed again
 * (flops_probe_recheck), once a run. A run.peak_tflops below the rate is
 * the user's number: said once. */
static void check_peak(loop_state *ls, double tflops) {
    if (ls->peak_checked || !(ls->peak_tflops > 0) || !(tflops > ls->peak_tflops)) return;
    ls->peak_checked = 1;
    vh_session *s = ls->s;
    if (ls->peak_configured) {
        fprintf(s->out, "vithost: warning: this run computes %.4g TFLOP/s per device, above "
                        "run.peak_tflops %.4g: its MFU reads over 100%%\n",
                tflops, ls->peak_tflops);
        return;
    }
    const double before = ls->peak_tflops;
    ls->peak_tflops =
        flops_probe_recheck(s->run->device, s->policy.compute_dtype, before, tflops);
    fprintf(s->out, "vithost: the device peak probed before, %.1f GFLOP/s, is below this run's "
                    "own %.1f (the machine was busy then): probed again, %.1f GFLOP/s\n",
            before * 1e3, tflops * 1e3, ls->peak_tflops * 1e3);
}

static void log_step(loop_state *ls, float loss, double lr, int skipped) {
    const double img_s = progress_img_per_s(&ls->prog);
    check_peak(ls, tflops_at(ls, img_s));
    vh_train_metrics m = metrics_line(ls, img_s, loss, lr, skipped);
    report_step(&ls->prog, &m, ls->total, ls->peak_tflops > 0, &ls->scale);
    progress_restart_window(&ls->prog);
    ls->window_comm_bytes = ls->window_comm_wait = 0.0;
    ls->window_steps = 0;
}

/* After a step: count a skip, read the scale the next step uses. The lines
 * show both from the first scale other than 1 or the first skip on. */
static void note_scale(loop_state *ls, int skipped) {
    vh_session *s = ls->s;
    if (skipped) ls->scale.skipped_steps++;
    /* (not traced: a getter, and --trace shows the step's calls only) */
    ls->scale.loss_scale = s->precision->loss_scale(s->self[VH_ROLE_PRECISION]);
    if (ls->scale.loss_scale != 1.0 || ls->scale.skipped_steps > 0) ls->scale.show = 1;
}

/* ---- the loop ------------------------------------------------------------------ */

/* A NaN or Inf loss ends the run (unless the precision plugin skipped the
 * step): the step, and the checkpoint to go back to. Loss scaling is no
 * advice here: it acts on the gradients, after the loss. */
static vh_status diverged(const loop_state *ls, float loss, vh_diag *d) {
    char good[9800];
    outcome_good_text(&ls->oc, ls->s->step, good, sizeof good);
    return diag_set(d, VH_STATUS_ERR_NUMERIC,
                    "training diverged: the loss is %f at step %lld (lower optim.lr or set "
                    "optim.clip_grad_norm; with 16-bit activations, a wider compute dtype)%s",
                    (double)loss, (long long)ls->s->step, good);
}

/* What run_step hands back. */
typedef struct step_result {
    vh_batch host_batch; /* the data plugin's, valid until the next data.next */
    const float *dev_loss;
    double scale; /* the loss scale the step ran with */
    int has, skipped;
    /* grad_accum > 1: the mean of the micro-batches' losses, read back on
     * the host (dev_loss is the last one's) */
    int has_host_loss;
    float host_loss;
} step_result;

/* The step's micro-batches (run.grad_accum, session.h): data.next, forward,
 * backward each. *has 0: the pass ended before a whole step; the
 * micro-batches read of it are dropped (their gradients are cleared by the
 * next step's zero_grads), as a batch of grad_accum x batch_size would be
 * by the sampler (drop_last). A short micro-batch (a data plugin that ends
 * its pass with one) is dropped the same way: the mean over micro-batches
 * needs equal ones. */
static vh_status run_micro_batches(loop_state *ls, step_result *r, int64_t *images,
                                   vh_diag *d) {
    vh_session *s = ls->s;
    const int64_t k = s->grad_accum;
    double loss_sum = 0.0;
    *images = 0;
    vh_status st = VH_STATUS_OK;
    for (int64_t m = 0; st == VH_STATUS_OK && m < k; m++) {
        vh_batch batch;
        st = session_next_batch(s, &r->host_batch, &batch, &r->has, d);
        if (st != VH_STATUS_OK || !r->has) break;
        if (k > 1 && batch.size != s->batch_size) {
            r->has = 0;
            break;
        }
        /* (after the first data.next: a pass that ended starts no step) */
        if (m == 0 && (st = session_step_begin(s, d)) != VH_STATUS_OK) break;
        st = session_step_micro(s, &batch, m, k, &r->dev_loss, d);
        if (st == VH_STATUS_OK && k > 1) {
            /* the next forward overwrites the loss: read it now */
            float one = NAN;
            st = session_read_loss(s, r->dev_loss, &one, d);
            loss_sum += (double)one;
        }
        *images += batch.size;
    }
    if (st != VH_STATUS_OK || !r->has) {
        if (st == VH_STATUS_OK && *images > 0)
            session_trace(s, "the pass ended inside a step: %lld image(s) dropped",
                          (long long)*images);
        return st;
    }
    r->has_host_loss = k > 1;
    r->host_loss = (float)(loss_sum / (double)k);
    return VH_STATUS_OK;
}

/* One step: its micro-batches (r->has 0: the pass is done), the optimizer,
 * and the step's share of the throughput and communication window. */
static vh_status run_step(loop_state *ls, double *lr, step_result *r, vh_diag *d) {
    vh_session *s = ls->s;
    memset(r, 0, sizeof *r);
    r->scale = ls->scale.loss_scale;
    vh_comm_stats *cs = &s->run->comm_stats;
    comm_stats_reset(cs);
    int64_t images = 0;
    vh_status st = run_micro_batches(ls, r, &images, d);
    if (st != VH_STATUS_OK || !r->has) return st;
    st = session_step_end(s, s->step, lr, &r->skipped, d);
    if (st != VH_STATUS_OK) return st;
    s->step++;
    ls->steps_this_run++;
    st = ema_step(ls->ema, s, s->step, r->skipped, d);
    if (st != VH_STATUS_OK) return st;
    /* Every rank trained full batches of its own (the sampler's rule). */
    ls->prog.window_images += images * ls->world;
    ls->window_comm_bytes += cs->bytes;
    ls->window_comm_wait += cs->wait_seconds;
    ls->window_steps++;
    note_scale(ls, r->skipped);
    return VH_STATUS_OK;
}

/* What the step just taken needs besides its gradients. */
typedef struct step_needs {
    int log, draw, skipped, evals, saves, stop_after;
} step_needs;

static step_needs needs_of(const loop_state *ls, int skipped) {
    int64_t step = ls->s->step;
    step_needs n = {.skipped = skipped};
    n.log = step % ls->log_every == 0 || step == ls->total;
    n.draw = !n.log && progress_due(&ls->prog, step, ls->total);
    n.evals = ls->eval_every_steps > 0 && step % ls->eval_every_steps == 0;
    n.saves = ls->checkpoint_every > 0 && step % ls->checkpoint_every == 0;
    n.stop_after = ls->stop_after > 0 && ls->steps_this_run >= ls->stop_after;
    return n;
}

/* The loss as a number, on the steps that need one (see train_epoch). */
static vh_status read_loss(loop_state *ls, const step_needs *n, const step_result *r,
                           float *loss, vh_diag *d) {
    vh_session *s = ls->s;
    if (!(n->log || n->draw || n->skipped || n->evals || n->saves || n->stop_after))
        return VH_STATUS_OK;
    vh_status st = s->run->device->synchronize(s->run->device->device);
    if (st == VH_STATUS_OK && r->has_host_loss) *loss = r->host_loss;
    else if (st == VH_STATUS_OK) st = session_read_loss(s, r->dev_loss, loss, d);
    if (st != VH_STATUS_OK) return st;
    if (!isfinite(*loss) && !n->skipped) return diverged(ls, *loss, d);
    /* A logged loss is the global batch's: the mean of the ranks' (equal
     * batches). Log steps are the same on every rank; the progress bar's
     * draws are not, so they show this rank's. */
    if (n->log && ls->world > 1) {
        double mean = (double)*loss;
        st = session_reduce_scalars(s, &mean, 1, VH_REDUCE_OP_AVG, d);
        if (st != VH_STATUS_OK) return st;
        *loss = (float)mean;
        if (!isfinite(*loss) && !n->skipped) return diverged(ls, *loss, d);
    }
    return VH_STATUS_OK;
}

/* Whether the run stops after this step: --stop-after, or a signal. A
 * signal may reach one rank only: with many, every rank stops at the same
 * step, agreed on log steps and about every 0.2 s between them (mpirun kills
 * its ranks 1 s after passing on a Ctrl-C: signals.h), or the others would
 * wait for it in a collective. */
static vh_status stop_here(loop_state *ls, const step_needs *n, int *stop, vh_diag *d) {
    *stop = n->stop_after || (ls->world == 1 && signals_stop_requested());
    if (ls->world == 1 || !(n->log || signals_agree_due(ls->s->step))) return VH_STATUS_OK;
    /* the flag, and this rank's pace that sets the next agreement's step */
    double v[2] = {*stop || signals_stop_requested(), signals_pace(ls->s->step)};
    vh_status st = session_reduce_scalars(ls->s, v, 2, VH_REDUCE_OP_MAX, d);
    *stop = v[0] != 0.0;
    signals_set_pace(v[1]);
    return st;
}

/* Trains one epoch's pass (or the rest of it, after a resume). The step
 * runs without a host round trip: the loss stays on the device and the
 * device is synchronised only on steps that need a number — log lines,
 * progress draws, skipped steps (the precision plugin's overflow check has
 * already read its flag back, so a non-finite loss, which makes non-finite
 * gradients, shows there at once), evaluations and checkpoints. Only log
 * steps average the loss over the ranks (a collective); a rank whose own
 * loss is not finite fails, and train_run ends every rank. With many ranks
 * the stop flag (a signal on one rank) is agreed on log steps and about
 * every 0.2 s (stop_here), so most steps pay no collective but their
 * gradients'; --stop-after counts the same on every rank and needs no
 * agreement. */
static vh_status train_epoch(loop_state *ls, float *loss, double *lr, vh_diag *d) {
    vh_session *s = ls->s;
    if (!s->epoch_in_progress) {
        session_trace(s, "data.start_epoch split=train epoch=%lld", (long long)s->epoch);
        vh_status st = s->data->start_epoch(s->self[VH_ROLE_DATA], VH_SPLIT_TRAIN, s->epoch);
        if (st != VH_STATUS_OK)
            return session_plugin_error(s, VH_ROLE_DATA, st, "data.start_epoch", d);
        s->epoch_in_progress = 1;
    }
    while (s->step < ls->total) {
        int stop = 0;
        step_result r;
        vh_status st = run_step(ls, lr, &r, d);
        if (st != VH_STATUS_OK || !r.has) return st;
        step_needs n = needs_of(ls, r.skipped);
        st = read_loss(ls, &n, &r, loss, d);
        if (st != VH_STATUS_OK) return st;
        if (n.log) {
            log_step(ls, *loss, *lr, r.skipped);
        } else {
            /* Every skipped step gets a metrics line (the precision plugin
             * has said it on the log), so the file counts every skip up to
             * any checkpoint and a resumed run continues the count. */
            if (r.skipped)
                metrics_line(ls, progress_img_per_s(&ls->prog), *loss, *lr, r.skipped);
            if (n.draw) progress_draw(&ls->prog, s->step, ls->total, *loss, &ls->scale);
        }
        /* a line that could not be written (a full disk) ends the run here */
        if ((st = metrics_check(&s->metrics, d)) != VH_STATUS_OK ||
            (st = progress_check(&ls->prog, d)) != VH_STATUS_OK)
            return st;
        /* (*loss is this step's on skipped steps: read_loss reads those) */
        outcome_step(&ls->oc, s->step, r.skipped, r.scale, *loss, &r.host_batch);
        st = outcome_check(&ls->oc, s, ls->scale.skipped_steps, ls->scale.loss_scale, d);
        if (st != VH_STATUS_OK) return st;
        if (n.evals && (st = run_eval(ls, 1, d)) != VH_STATUS_OK) return st;
        if ((st = stop_here(ls, &n, &stop, d)) != VH_STATUS_OK) return st;
        if ((st = save_if_due(ls, n.saves, r.skipped, stop, d)) != VH_STATUS_OK) return st;
        if (stop) return VH_STATUS_ERR_INTERRUPTED;
    }
    return VH_STATUS_OK;
}

static vh_status train_loop(loop_state *ls, vh_diag *d) {
    vh_session *s = ls->s;
    float loss = NAN;
    double lr = 0.0;
    while (s->epoch < ls->epochs && s->step < ls->total) {
        vh_status st = train_epoch(ls, &loss, &lr, d);
        if (st != VH_STATUS_OK) return st;
        int finished_pass = s->step < ls->total || s->step % ls->steps_per_epoch == 0;
        int last = s->step >= ls->total;
        /* (not again when eval_every_steps just evaluated these weights) */
        if (ls->eval_every > 0 && ((s->epoch + 1) % ls->eval_every == 0 || last) &&
            ls->last_eval_step != s->step) {
            /* run.steps may end a pass in its middle: the evaluation keeps
             * the pass's position, so the checkpoint after it resumes there
             * (a larger run.steps extends the run with the same order). */
            st = run_eval(ls, !finished_pass && ls->data_keeps_position, d);
            if (st != VH_STATUS_OK) return st;
        }
        if (finished_pass) {
            s->epoch++;
            s->epoch_in_progress = 0;
        }
    }
    /* A run none of whose steps trained is no result, whatever its loss. */
    vh_status st = outcome_check_end(&ls->oc, s, ls->steps_this_run, ls->scale.loss_scale, d);
    if (st != VH_STATUS_OK) return st;
    /* Skipped steps may carry a NaN loss (the policy's choice), but a run
     * whose last step still had one did not recover: no final checkpoint,
     * no exit 0. */
    if (ls->steps_this_run > 0 && !isfinite(loss)) return diverged(ls, loss, d);
    st = save_checkpoint(ls, d);
    if (st != VH_STATUS_OK) return st;
    report_finished(&ls->prog, s->step, loss, ls->last_eval_step == s->step ? &ls->last_eval : NULL,
                    ls->dir);
    return progress_check(&ls->prog, d);
}

static vh_status setup_loop(loop_state *ls, vh_session *s, vh_ema *ema, const char *dir,
                            const vh_train_options *o, vh_diag *d) {
    vh_run *run = s->run;
    memset(ls, 0, sizeof *ls);
    ls->s = s;
    ls->ema = ema;
    ls->dir = dir;
    ls->last_eval_step = -1;
    ls->world = run->comm.world_size > 0 ? run->comm.world_size : 1;
    ls->log_every = run_config_int(run, "log_every");
    ls->eval_every = run_config_int(run, "eval_every");
    ls->eval_every_steps = run_config_int(run, "eval_every_steps");
    ls->checkpoint_every = run_config_int(run, "checkpoint_every");
    ls->keep = run_config_int(run, "keep_checkpoints");
    ls->stop_after = o->stop_after;
    /* optimizer steps: a pass's trailing micro-batches that fill no whole
     * step are dropped (run_micro_batches) */
    ls->steps_per_epoch =
        s->info.train_size / run->comm.world_size / s->batch_size / s->grad_accum;
    if (ls->steps_per_epoch < 1)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: the training split has %lld samples, fewer than one step of %lld "
                        "micro-batch(es) of %lld per rank on %d rank(s); lower run.batch_size "
                        "or run.grad_accum",
                        run->recipe.file, (long long)s->info.train_size,
                        (long long)s->grad_accum, (long long)s->batch_size,
                        (int)run->comm.world_size);
    ls->data_keeps_position =
        loader_plugin_has(&run->plugins[VH_ROLE_DATA], offsetof(vh_data_vtable, state_load));
    if (ls->eval_every_steps > 0 && !ls->data_keeps_position)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: run.eval_every_steps evaluates in the middle of a training pass, "
                        "which needs a data plugin that can save its position; '%s' has no "
                        "state_save/state_load (set run.eval_every_steps: 0)",
                        run->recipe.file, run->plugins[VH_ROLE_DATA].desc->name);
    int64_t max_steps = run_config_int(run, "steps");
    ls->epochs = run_config_int(run, "epochs");
    /* With run.steps set, epochs go on until the steps are done. */
    if (max_steps > 0) ls->epochs = (max_steps + ls->steps_per_epoch - 1) / ls->steps_per_epoch;
    ls->total = max_steps > 0 ? max_steps : ls->steps_per_epoch * ls->epochs;
    ls->flops = s->model->train_flops_per_image(s->self[VH_ROLE_MODEL]);
    double peak = 0.0;
    const vh_config_entry *e = config_find(&run->run_config, "peak_tflops");
    if (e) peak = e->as.f;
    /* the peak of the dtype the GEMMs run in, as `vithost bench` has it: against the
     * f32 peak an AMP run's MFU read twice too high where bf16 GEMMs run at 2x */
    ls->peak_configured = peak > 0;
    ls->peak_tflops =
        peak > 0 ? peak : flops_probe_peak_tflops_dtype(run->device, s->policy.compute_dtype);
    progress_init(&ls->prog, s->out);
    ls->prog.keep_going = strcmp(run_config_string(run, "write_errors"), "warn") == 0;
    /* mpirun gives its processes a terminal of its own and forwards what
     * they print line by line: no redrawn bar there. */
    if (ls->world > 1) ls->prog.tty = 0;
    /* A resumed run's skips so far are in the metrics lines it kept. */
    ls->scale.skipped_steps = s->metrics.kept_skipped_steps;
    ls->scale.loss_scale = s->precision->loss_scale(s->self[VH_ROLE_PRECISION]);
    ls->scale.show = ls->scale.loss_scale != 1.0 || ls->scale.skipped_steps > 0;
    return VH_STATUS_OK;
}

/* The parameters a run starts from: its checkpoint when resumed, else the
 * weights the model's recipe names (model.initial_weights), else the init
 * rules. */
static vh_status starting_weights(vh_session *s, vh_ema *ema, const char *dir, int resume,
                                  char *ckpt, size_t ckpt_len, vh_diag *d) {
    /* The EMA first: a checkpoint carries it (ema_attach) */
    vh_status st = ema_init(ema, s, d);
    if (st != VH_STATUS_OK) return st;
    ema_attach(ema, s);
    if (resume) {
        st = checkpoint_resume_point(s, dir, ckpt, ckpt_len, d);
        return st == VH_STATUS_OK ? checkpoint_load(s, ckpt, d) : st;
    }
    const char *initial = NULL;
    session_trace(s, "model.initial_weights");
    st = s->model->initial_weights(s->self[VH_ROLE_MODEL], &initial);
    if (st != VH_STATUS_OK)
        return session_plugin_error(s, VH_ROLE_MODEL, st, "model.initial_weights", d);
    st = weights_load_model(s, initial, VH_WEIGHTS_MODE_PRETRAINED, d);
    /* the average starts at the starting weights (timm copies the model) */
    return st == VH_STATUS_OK ? ema_reset(ema, s, d) : st;
}

static vh_status print_banner(const loop_state *ls, const char *ckpt, vh_diag *d) {
    vh_banner b = {.dir = ls->dir, .resumed_from = ckpt[0] ? ckpt : NULL, .total = ls->total,
                   .epochs = ls->epochs, .steps_per_epoch = ls->steps_per_epoch,
                   .world = ls->world, .flops = ls->flops, .peak_tflops = ls->peak_tflops};
    return banner_print(ls->s, &b, d);
}

vh_status train_run(vh_run *run, const vh_train_options *o, vh_diag *d) {
    char dir[4096];
    if (o->out_dir) snprintf(dir, sizeof dir, "%s", o->out_dir);
    else run_folder_default(run, dir, sizeof dir);
    /* The communicator first: only rank 0 checks and writes the run folder,
     * and only it prints; the others train quietly and speak on failure. */
    vh_status st = run_open_backends(run, d);
    if (st != VH_STATUS_OK) return st;
    int rank0 = run->comm.rank == 0;
    FILE *quiet = NULL;
    if (!rank0) {
        quiet = fopen("/dev/null", "w");
        if (!quiet) return diag_set(d, VH_STATUS_ERR_IO, "cannot open /dev/null");
        run->opts.out = quiet;
    }
    int lock = -1; /* one job per run folder: taken before anything is written there */
    if (rank0) st = run_folder_lock(dir, o->resume, &lock, d);
    if (st == VH_STATUS_OK && rank0) st = run_folder_check(run, dir, o->resume, d);

    vh_session s;
    memset(&s, 0, sizeof s);
    if (st == VH_STATUS_OK) st = session_open(&s, run, d);
    if (st == VH_STATUS_OK && rank0) st = run_folder_create(run, dir, d);
    if (st == VH_STATUS_OK && !o->resume) st = checkpoint_folder_shared(&s, dir, d);
    char ckpt[4300] = "";
    vh_ema ema;
    memset(&ema, 0, sizeof ema);
    if (st == VH_STATUS_OK) st = starting_weights(&s, &ema, dir, o->resume, ckpt, sizeof ckpt, d);
    if (st == VH_STATUS_OK && rank0)
        st = metrics_open(&s.metrics, dir, o->resume ? s.step : -1,
                          strcmp(run_config_string(run, "write_errors"), "warn") == 0, d);
    loop_state ls;
    if (st == VH_STATUS_OK) st = setup_loop(&ls, &s, &ema, dir, o, d);
    if (st == VH_STATUS_OK) outcome_init(&ls.oc, run, ckpt, s.step);
    if (st == VH_STATUS_OK) {
        /* Handlers first: once the banner is out, a signal stops cleanly. */
        vh_signals_saved saved;
        signals_catch_stop(&saved);
        st = print_banner(&ls, ckpt, d);
        if (st == VH_STATUS_OK) st = train_loop(&ls, d);
        signals_restore(&saved);
        if (st == VH_STATUS_ERR_INTERRUPTED)
            report_stopped(&ls.prog, run, dir, s.step, signals_stop_requested(), d);
    }
    run_fail_all_ranks(run, st, d->text);
    session_close(&s);
    ema_free(&ema);
    run_folder_unlock(lock);
    if (quiet) {
        run->opts.out = stdout;
        fclose(quiet);
    }
    return st;
}
