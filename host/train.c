/* train.c - the training loop: epochs of steps, evaluation, progress lines,
 * metrics, checkpoints, resume, and a clean stop on SIGINT/SIGTERM. */
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "trainer.h"
#include "weights.h"

#ifndef VITHOST_VERSION
#define VITHOST_VERSION "0.0.0"
#endif

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    stop_signal = sig;
    signal(sig, SIG_DFL); /* a second Ctrl-C ends the process at once */
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the run folder ------------------------------------------------------ */

static vh_status make_dirs(const char *dir, vh_diag *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) break;
        *p = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return diag_set(d, VH_STATUS_ERR_IO, "cannot create the run folder %s: %s", dir,
                        strerror(errno));
    return VH_STATUS_OK;
}

/* runs/<recipe file name without .yaml>-<YYYYmmdd-HHMMSS> */
static void default_out_dir(const vh_run *run, char *out, size_t len) {
    char name[512];
    snprintf(name, sizeof name, "%s", run->recipe.file);
    char *base = basename(name);
    char *dot = strrchr(base, '.');
    if (dot) *dot = '\0';
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out, len, "runs/%s-%s", base, stamp);
    struct stat sb;
    for (int i = 2; stat(out, &sb) == 0 && i < 1000; i++)
        snprintf(out, len, "runs/%s-%s-%d", base, stamp, i); /* two runs in one second */
}

/* The resolved recipe without comments: what must not change on resume. */
static char *recipe_body(FILE *f) {
    size_t cap = 4096, len = 0;
    char *out = malloc(cap), line[2048];
    if (!out) return NULL;
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        char *hash = strstr(line, "  #");
        if (line[0] == '#') continue;
        if (hash) strcpy(hash, "\n");
        /* Keys of the run section that say how long and how often, not what:
         * a resumed run may extend or re-time itself. */
        if (strstr(line, "  steps:") == line || strstr(line, "  epochs:") == line ||
            strstr(line, "  eval_every") == line || strstr(line, "  log_every:") == line ||
            strstr(line, "  checkpoint_every:") == line ||
            strstr(line, "  keep_checkpoints:") == line)
            continue;
        size_t n = strlen(line);
        if (len + n + 1 > cap) {
            char *t = realloc(out, cap = 2 * (len + n + 1));
            if (!t) {
                free(out);
                return NULL;
            }
            out = t;
        }
        memcpy(out + len, line, n + 1);
        len += n;
    }
    return out;
}

static vh_status write_run_files(const vh_run *run, const char *dir, vh_diag *d) {
    char path[4200];
    snprintf(path, sizeof path, "%s/recipe.yaml", dir);
    FILE *f = fopen(path, "w");
    if (!f) return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    run_print_resolved(run, f);
    int ok = fclose(f) == 0;
    snprintf(path, sizeof path, "%s/run.json", dir);
    f = ok ? fopen(path, "w") : NULL;
    if (!f) return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "{\"vithost\": \"%s\", \"abi\": \"%d.%d\", \"plugins\": {", VITHOST_VERSION,
            VH_ABI_MAJOR, VH_ABI_MINOR);
    for (int r = 0; r < VH_ROLE_COUNT; r++) {
        const vh_plugin *p = &run->plugins[r];
        fprintf(f, "%s\"%s\": {\"name\": \"%s\", \"version\": \"%s\", \"file\": \"%s\"}",
                r ? ", " : "", vh_role_name((vh_role)r), p->desc->name, p->desc->version,
                p->path);
    }
    fprintf(f, "}}\n");
    return fclose(f) == 0 ? VH_STATUS_OK
                          : diag_set(d, VH_STATUS_ERR_IO, "cannot write %s", path);
}

/* A new run needs a folder without a run in it; a resumed one needs the same
 * recipe as the run it continues. Checks only: the folder is made once the
 * plugins accepted the recipe, so a failed start leaves nothing behind. */
static vh_status check_run_dir(const vh_run *run, const char *dir, int resume, vh_diag *d) {
    char path[4200];
    snprintf(path, sizeof path, "%s/recipe.yaml", dir);
    FILE *old = fopen(path, "r");
    if (!resume && old) {
        fclose(old);
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s already holds a run (%s); resume it with --resume, or choose "
                        "another --out",
                        dir, path);
    }
    if (resume && !old)
        return diag_set(d, VH_STATUS_ERR_CONFIG, "--resume: %s holds no run (no %s)", dir, path);
    if (resume) {
        char *was = recipe_body(old);
        fclose(old);
        char *tmp_text = NULL;
        size_t tmp_len = 0;
        FILE *now_f = open_memstream(&tmp_text, &tmp_len);
        if (!was || !now_f) {
            free(was);
            return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
        }
        run_print_resolved(run, now_f);
        fclose(now_f);
        FILE *now_r = fmemopen(tmp_text, tmp_len, "r");
        char *now = now_r ? recipe_body(now_r) : NULL;
        if (now_r) fclose(now_r);
        free(tmp_text);
        int same = was && now && strcmp(was, now) == 0;
        free(was);
        free(now);
        if (!same)
            return diag_set(d, VH_STATUS_ERR_CONFIG,
                            "--resume: the recipe differs from the one %s was started with "
                            "(%s); only run.steps, epochs, eval_every, log_every and checkpoint "
                            "settings may change on resume",
                            dir, path);
    }
    return VH_STATUS_OK;
}

/* ---- measuring the device's peak ------------------------------------------ */

/* MFU needs the peak of the device: given as run.peak_tflops, or measured
 * once with a square fp32 GEMM through the device's own op. */
static double measure_peak_tflops(const vh_device_ops *dev) {
    if (!dev->gemm || dev->kind != VH_DEVICE_KIND_CPU) return 0.0;
    const int64_t n = 1024;
    float *a = NULL, *b = NULL, *c = NULL;
    size_t bytes = (size_t)(n * n) * sizeof(float);
    if (dev->alloc(dev->device, bytes, (void **)&a) != VH_STATUS_OK) return 0.0;
    if (dev->alloc(dev->device, bytes, (void **)&b) != VH_STATUS_OK ||
        dev->alloc(dev->device, bytes, (void **)&c) != VH_STATUS_OK) {
        dev->free(dev->device, a);
        if (b) dev->free(dev->device, b);
        return 0.0;
    }
    for (int64_t i = 0; i < n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.01f;
    vh_gemm_args g = {.struct_size = sizeof g, .m = n, .n = n, .k = n, .alpha = 1.0f,
                      .a = a, .lda = n, .b = b, .ldb = n, .c = c, .ldc = n, .batch = 1};
    double best = 0.0;
    for (int rep = 0; rep < 12; rep++) { /* best of many: the machine may be busy */
        double t0 = now_seconds();
        if (dev->gemm(dev->device, &g) != VH_STATUS_OK) break;
        double dt = now_seconds() - t0;
        double tflops = 2.0 * (double)n * (double)n * (double)n / dt / 1e12;
        if (rep > 0 && tflops > best) best = tflops; /* the first warms up */
    }
    dev->free(dev->device, a);
    dev->free(dev->device, b);
    dev->free(dev->device, c);
    return best;
}

/* ---- progress -------------------------------------------------------------- */

typedef struct progress {
    FILE *out;
    int tty;
    double window_start, last_draw, run_start;
    int64_t window_images, window_steps;
} progress;

static void format_eta(char *buf, size_t len, double seconds) {
    if (!(seconds >= 0) || seconds > 1e7) {
        snprintf(buf, len, "?");
        return;
    }
    long s = (long)seconds;
    if (s >= 3600) snprintf(buf, len, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, len, "%ldm%02lds", s / 60, s % 60);
}

/* On a terminal, one line redrawn in place (at most 10 times a second). */
static void progress_draw(progress *p, int64_t step, int64_t total, float loss, double img_s) {
    if (!p->tty) return;
    double now = now_seconds();
    if (now - p->last_draw < 0.1 && step != total) return;
    p->last_draw = now;
    double elapsed = now - p->run_start;
    char eta[32];
    format_eta(eta, sizeof eta, step > 0 ? elapsed / (double)step * (double)(total - step) : -1);
    fprintf(p->out, "\r\033[Kstep %lld/%lld  loss %.4f  %.0f img/s  eta %s", (long long)step,
            (long long)total, (double)loss, img_s, eta);
    fflush(p->out);
}

static void progress_clear(progress *p) {
    if (p->tty) fputs("\r\033[K", p->out);
}

/* ---- the loop -------------------------------------------------------------- */

typedef struct loop_state {
    vh_trainer *t;
    const char *dir;
    int64_t total, steps_per_epoch, epochs, log_every, eval_every, eval_every_steps;
    int64_t checkpoint_every, keep, stop_after, steps_this_run;
    double flops, peak_tflops;
    progress prog;
    vh_eval_result last_eval;
    int64_t last_eval_step; /* -1: none yet */
} loop_state;

/* Time spent on evaluation and checkpoints is not training time: the
 * throughput window skips it. */
static void pause_window(loop_state *ls, double since) {
    ls->prog.window_start += now_seconds() - since;
}

/* An evaluation in the middle of a training pass (run.eval_every_steps):
 * the pass's position is saved before and restored after, so any data
 * plugin that can resume can be interrupted. */
static vh_status eval_inside_pass(vh_trainer *t, vh_eval_result *res, vh_diag *d) {
    size_t size = 0;
    vh_status st = t->data->state_size(t->self[VH_ROLE_DATA], &size);
    if (st != VH_STATUS_OK) return trainer_plugin_error(t, VH_ROLE_DATA, st, "data.state_size", d);
    void *saved = malloc(size ? size : 1);
    if (!saved) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    st = t->data->state_save(t->self[VH_ROLE_DATA], saved, size);
    if (st != VH_STATUS_OK) st = trainer_plugin_error(t, VH_ROLE_DATA, st, "data.state_save", d);
    if (st == VH_STATUS_OK) st = trainer_evaluate(t, res, d);
    if (st == VH_STATUS_OK) {
        st = t->data->state_load(t->self[VH_ROLE_DATA], saved, size);
        if (st != VH_STATUS_OK) st = trainer_plugin_error(t, VH_ROLE_DATA, st, "data.state_load", d);
    }
    free(saved);
    return st;
}

static vh_status run_eval(loop_state *ls, int inside_pass, vh_diag *d) {
    vh_trainer *t = ls->t;
    double t0 = now_seconds();
    vh_status st = inside_pass ? eval_inside_pass(t, &ls->last_eval, d)
                               : trainer_evaluate(t, &ls->last_eval, d);
    pause_window(ls, t0);
    if (st != VH_STATUS_OK) return st;
    ls->last_eval_step = t->step;
    progress_clear(&ls->prog);
    fprintf(t->out,
            "eval  step %lld epoch %lld: top1 %.2f%% top5 %.2f%% loss %.4f (%lld images)\n",
            (long long)t->step, (long long)t->epoch, 100.0 * ls->last_eval.top1,
            100.0 * ls->last_eval.top5, ls->last_eval.loss, (long long)ls->last_eval.samples);
    fflush(t->out);
    metrics_eval(&t->metrics, t->step, t->epoch, ls->last_eval.top1, ls->last_eval.top5,
                 ls->last_eval.loss, ls->last_eval.samples);
    return VH_STATUS_OK;
}

static vh_status save_checkpoint(loop_state *ls, vh_diag *d) {
    double t0 = now_seconds();
    vh_status st = checkpoint_save(ls->t, ls->dir, ls->keep, d);
    pause_window(ls, t0);
    if (st == VH_STATUS_OK) {
        progress_clear(&ls->prog);
        fprintf(ls->t->out, "vithost: checkpoint %s/checkpoints/step-%08lld (%.2f s)\n", ls->dir,
                (long long)ls->t->step, now_seconds() - t0);
    }
    return st;
}

static void log_step(loop_state *ls, float loss, double lr, int skipped) {
    vh_trainer *t = ls->t;
    progress *p = &ls->prog;
    double dt = now_seconds() - p->window_start;
    double img_s = dt > 0 ? (double)p->window_images / dt : 0.0;
    double tflops = img_s * ls->flops / 1e12;
    vh_train_metrics m = {.step = t->step, .epoch = t->epoch, .loss = loss, .lr = lr,
                          .img_per_s = img_s, .tflops = tflops,
                          .mfu = ls->peak_tflops > 0 ? tflops / ls->peak_tflops : NAN,
                          .peak_mem_bytes = metrics_peak_rss_bytes(), .skipped = skipped};
    metrics_train(&t->metrics, &m);
    progress_clear(p);
    fprintf(t->out,
            "train step %lld/%lld epoch %lld: loss %.4f lr %.3g img/s %.1f TFLOP/s %.4f",
            (long long)t->step, (long long)ls->total, (long long)t->epoch, (double)loss, lr,
            img_s, tflops);
    if (ls->peak_tflops > 0) fprintf(t->out, " MFU %.1f%%", 100.0 * m.mfu);
    fprintf(t->out, "%s\n", skipped ? " (step skipped: overflow)" : "");
    fflush(t->out);
    p->window_start = now_seconds();
    p->window_images = 0;
}

/* Trains one epoch's pass (or the rest of it, after a resume). */
static vh_status train_epoch(loop_state *ls, float *loss, double *lr, vh_diag *d) {
    vh_trainer *t = ls->t;
    if (!t->epoch_in_progress) {
        trainer_trace(t, "data.start_epoch split=train epoch=", (long long)t->epoch);
        vh_status st = t->data->start_epoch(t->self[VH_ROLE_DATA], VH_SPLIT_TRAIN, t->epoch);
        if (st != VH_STATUS_OK)
            return trainer_plugin_error(t, VH_ROLE_DATA, st, "data.start_epoch", d);
        t->epoch_in_progress = 1;
    }
    while (t->step < ls->total) {
        vh_batch host_batch, batch;
        int has = 0, skipped = 0;
        vh_status st = trainer_next_batch(t, &host_batch, &batch, &has, d);
        if (st != VH_STATUS_OK) return st;
        if (!has) break;
        st = trainer_step(t, &batch, t->step, loss, lr, &skipped, d);
        if (st == VH_STATUS_OK) st = t->run->device->synchronize(t->run->device->device);
        if (st != VH_STATUS_OK) return st;
        t->step++;
        ls->steps_this_run++;
        ls->prog.window_images += batch.size;
        if (!isfinite(*loss) && !skipped)
            return diag_set(d, VH_STATUS_ERR_NUMERIC,
                            "training diverged: the loss is %f at step %lld (lower the learning "
                            "rate, clip gradients, or use a precision policy with loss "
                            "scaling)",
                            (double)*loss, (long long)t->step);
        if (t->step % ls->log_every == 0 || t->step == ls->total) log_step(ls, *loss, *lr, skipped);
        else progress_draw(&ls->prog, t->step, ls->total, *loss,
                           ls->prog.window_images / fmax(1e-9, now_seconds() - ls->prog.window_start));
        if (ls->eval_every_steps > 0 && t->step % ls->eval_every_steps == 0) {
            st = run_eval(ls, 1, d);
            if (st != VH_STATUS_OK) return st;
        }
        int stop = stop_signal || (ls->stop_after > 0 && ls->steps_this_run >= ls->stop_after);
        if ((ls->checkpoint_every > 0 && t->step % ls->checkpoint_every == 0 &&
             t->step < ls->total) ||
            stop) {
            st = save_checkpoint(ls, d);
            if (st != VH_STATUS_OK) return st;
        }
        if (stop) return VH_STATUS_ERR_INTERRUPTED;
    }
    return VH_STATUS_OK;
}

static vh_status train_loop(loop_state *ls, vh_diag *d) {
    vh_trainer *t = ls->t;
    float loss = NAN;
    double lr = 0.0;
    while (t->epoch < ls->epochs && t->step < ls->total) {
        vh_status st = train_epoch(ls, &loss, &lr, d);
        if (st != VH_STATUS_OK) return st;
        int finished_pass = t->step < ls->total || t->step % ls->steps_per_epoch == 0;
        int last = t->step >= ls->total;
        /* (not again when eval_every_steps just evaluated these weights) */
        if (ls->eval_every > 0 && ((t->epoch + 1) % ls->eval_every == 0 || last) &&
            ls->last_eval_step != t->step) {
            st = run_eval(ls, 0, d);
            if (st != VH_STATUS_OK) return st;
        }
        if (finished_pass) {
            t->epoch++;
            t->epoch_in_progress = 0;
        }
    }
    vh_status st = save_checkpoint(ls, d);
    if (st != VH_STATUS_OK) return st;
    progress_clear(&ls->prog);
    fprintf(t->out, "vithost: finished %lld steps", (long long)t->step);
    if (isfinite(loss)) fprintf(t->out, "; final loss %.4f", (double)loss);
    if (ls->last_eval_step == t->step) fprintf(t->out, "; eval top1 %.2f%%", 100.0 * ls->last_eval.top1);
    fprintf(t->out, "; peak memory %.1f MiB; run folder %s\n",
            (double)metrics_peak_rss_bytes() / 1048576.0, ls->dir);
    fflush(t->out);
    return VH_STATUS_OK;
}

static vh_status setup_loop(loop_state *ls, vh_trainer *t, const char *dir,
                            const vh_train_options *o, vh_diag *d) {
    vh_run *run = t->run;
    memset(ls, 0, sizeof *ls);
    ls->t = t;
    ls->dir = dir;
    ls->last_eval_step = -1;
    ls->log_every = run_config_int(run, "log_every");
    ls->eval_every = run_config_int(run, "eval_every");
    ls->eval_every_steps = run_config_int(run, "eval_every_steps");
    ls->checkpoint_every = run_config_int(run, "checkpoint_every");
    ls->keep = run_config_int(run, "keep_checkpoints");
    ls->stop_after = o->stop_after;
    ls->steps_per_epoch = t->info.train_size / run->comm.world_size / t->batch_size;
    if (ls->steps_per_epoch < 1)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: the training split has %lld samples, fewer than one batch of %lld "
                        "per rank on %d rank(s); lower run.batch_size",
                        run->recipe.file, (long long)t->info.train_size,
                        (long long)t->batch_size, (int)run->comm.world_size);
    int64_t max_steps = run_config_int(run, "steps");
    ls->epochs = run_config_int(run, "epochs");
    /* With run.steps set, epochs go on until the steps are done. */
    if (max_steps > 0) ls->epochs = (max_steps + ls->steps_per_epoch - 1) / ls->steps_per_epoch;
    ls->total = max_steps > 0 ? max_steps : ls->steps_per_epoch * ls->epochs;
    ls->flops = t->model->train_flops_per_image(t->self[VH_ROLE_MODEL]);
    double peak = 0.0;
    const vh_config_entry *e = config_find(&run->run_config, "peak_tflops");
    if (e) peak = e->as.f;
    ls->peak_tflops = peak > 0 ? peak : measure_peak_tflops(run->device);
    ls->prog.out = t->out;
    ls->prog.tty = isatty(fileno(t->out));
    ls->prog.run_start = ls->prog.window_start = now_seconds();
    return VH_STATUS_OK;
}

vh_status train_run(vh_run *run, const vh_train_options *o, vh_diag *d) {
    char dir[4096];
    if (o->out_dir) snprintf(dir, sizeof dir, "%s", o->out_dir);
    else default_out_dir(run, dir, sizeof dir);
    vh_status st = check_run_dir(run, dir, o->resume, d);
    if (st != VH_STATUS_OK) return st;

    vh_trainer t;
    st = trainer_open(&t, run, d);
    if (st == VH_STATUS_OK) st = make_dirs(dir, d);
    if (st == VH_STATUS_OK) st = write_run_files(run, dir, d);
    char ckpt[4300] = "";
    if (st == VH_STATUS_OK && o->resume) {
        st = checkpoint_latest(dir, ckpt, sizeof ckpt, d);
        if (st == VH_STATUS_OK) st = checkpoint_load(&t, ckpt, d);
    } else if (st == VH_STATUS_OK) {
        const vh_recipe_value *pre =
            recipe_find_value(recipe_find_section(&run->recipe, "model"), "pretrained");
        if (pre) {
            st = weights_load_model(&t, pre->text, VH_WEIGHTS_MODE_PRETRAINED, d);
            if (st == VH_STATUS_OK)
                fprintf(t.out, "vithost: model weights from %s\n", pre->text);
        }
    }
    if (st == VH_STATUS_OK) st = metrics_open(&t.metrics, dir, o->resume ? t.step : -1, d);
    loop_state ls;
    if (st == VH_STATUS_OK) st = setup_loop(&ls, &t, dir, o, d);
    if (st == VH_STATUS_OK) {
        /* Handlers first: once the banner is out, a signal stops cleanly. */
        stop_signal = 0;
        void (*old_int)(int) = signal(SIGINT, on_stop_signal);
        void (*old_term)(int) = signal(SIGTERM, on_stop_signal);
        fprintf(t.out, "vithost: run folder %s\n", dir);
        if (o->resume)
            fprintf(t.out, "vithost: resuming from %s (step %lld, epoch %lld)\n", ckpt,
                    (long long)t.step, (long long)t.epoch);
        fprintf(t.out,
                "vithost: training %lld steps (%lld epochs of %lld steps, batch %lld) on %s; "
                "%.3g GFLOP per image",
                (long long)ls.total, (long long)ls.epochs, (long long)ls.steps_per_epoch,
                (long long)t.batch_size, run->device->name, ls.flops / 1e9);
        if (ls.peak_tflops > 0) fprintf(t.out, "; device peak %.1f GFLOP/s", ls.peak_tflops * 1e3);
        fprintf(t.out, "\nvithost: each step calls, in order: %s\n", vh_step_order);
        fflush(t.out);
        st = train_loop(&ls, d);
        signal(SIGINT, old_int);
        signal(SIGTERM, old_term);
        if (st == VH_STATUS_ERR_INTERRUPTED) {
            progress_clear(&ls.prog);
            diag_set(d, st,
                     "stopped at step %lld (%s) with a checkpoint; continue with: vithost run "
                     "%s --out %s --resume",
                     (long long)t.step, stop_signal ? "signal" : "--stop-after",
                     run->recipe.file, dir);
        }
    }
    trainer_close(&t);
    return st;
}

vh_status train_eval(vh_run *run, const char *weights, FILE *out, vh_diag *d) {
    vh_trainer t;
    vh_status st = trainer_open(&t, run, d);
    char path[4400];
    struct stat sb;
    if (st == VH_STATUS_OK) {
        /* A run folder, a checkpoint folder, or a .safetensors file. */
        snprintf(path, sizeof path, "%s", weights);
        char ckpt[4300];
        vh_diag ignore;
        if (stat(weights, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            if (checkpoint_latest(weights, ckpt, sizeof ckpt, &ignore) == VH_STATUS_OK)
                snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
            else snprintf(path, sizeof path, "%s/model.safetensors", weights);
        }
        st = weights_load_model(&t, path, VH_WEIGHTS_MODE_STRICT, d);
    }
    vh_eval_result r;
    if (st == VH_STATUS_OK) st = trainer_evaluate(&t, &r, d);
    if (st == VH_STATUS_OK)
        fprintf(out, "{\"eval_top1\": %.6f, \"eval_top5\": %.6f, \"eval_loss\": %.6f, "
                     "\"samples\": %lld, \"weights\": \"%s\"}\n",
                r.top1, r.top5, r.loss, (long long)r.samples, path);
    trainer_close(&t);
    return st;
}
