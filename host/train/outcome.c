/* outcome.c - the policy for steps that do not train, their cause, and the
 * last good checkpoint (see outcome.h). */
#define _POSIX_C_SOURCE 200809L
#include "outcome.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"

#define F16_MAX 65504.0

void outcome_init(vh_outcome *o, const vh_run *run, const char *resumed_from, int64_t step) {
    memset(o, 0, sizeof *o);
    o->max_skipped = run_config_int(run, "max_skipped_steps");
    o->max_consecutive = run_config_int(run, "max_consecutive_skips");
    o->good.step = o->good_prev.step = o->pending.step = o->latest.step = -1;
    if (!resumed_from || !resumed_from[0]) return;
    /* The checkpoint a run resumes from is seen good once a step trains;
     * the one before it was (its run went on to write another). */
    snprintf(o->pending.path, sizeof o->pending.path, "%s", resumed_from);
    o->pending.step = step;
    o->latest = o->pending;
    checkpoint_previous(resumed_from, o->good.path, sizeof o->good.path);
    const char *dash = strrchr(o->good.path, '-'); /* ".../step-00000040" */
    if (o->good.path[0]) o->good.step = dash ? strtoll(dash + 1, NULL, 10) : 0;
}

static void promote(vh_outcome *o) {
    o->good_prev = o->good;
    o->good = o->pending;
    o->pending.path[0] = '\0';
    o->pending.step = -1;
}

void outcome_step(vh_outcome *o, int64_t step, int skipped, double scale, float loss,
                  const vh_batch *host_batch) {
    if (!skipped) {
        o->trained++;
        o->streak = 0;
        if (o->pending.path[0] && o->pending.step < step) promote(o);
        return;
    }
    if (o->streak++ == 0) {
        o->streak_first = step;
        o->scale_first = scale;
        o->bad_input = o->bad_loss = o->first_bad_input = 0;
    }
    o->scale_last = scale;
    o->last_loss = loss;
    if (!isfinite(loss)) o->bad_loss++;
    if (session_batch_not_finite(host_batch) && o->bad_input++ == 0) o->first_bad_input = step;
}

void outcome_saved(vh_outcome *o, const char *path, int64_t step) {
    snprintf(o->pending.path, sizeof o->pending.path, "%s", path);
    o->pending.step = step;
    o->latest = o->pending;
    o->save_deferred = 0;
}

void outcome_evaluated(vh_outcome *o, int64_t step, double loss) {
    if (isfinite(loss) && o->pending.path[0] && o->pending.step == step) promote(o);
}

/* ---- the last good checkpoint -------------------------------------------- */

static int exists(const char *path) {
    struct stat sb;
    return path[0] && stat(path, &sb) == 0;
}

void outcome_good_text(const vh_outcome *o, int64_t step, char *buf, size_t len) {
    /* A loss at `step` came from the weights after step - 1: a good
     * checkpoint is older (with no overflow check no step is skipped, so a
     * step that "trained" may have had that loss). */
    const vh_outcome_ckpt *c = o->good.step >= 0 && o->good.step < step - 1 ? &o->good
                               : o->good_prev.step >= 0 && o->good_prev.step < step - 1
                                   ? &o->good_prev
                                   : NULL;
    if (c && !exists(c->path)) {
        snprintf(buf, len, "; the last good checkpoint, of step %lld, was rotated away "
                           "(run.keep_checkpoints)", (long long)c->step);
        return;
    }
    if (!c) {
        snprintf(buf, len, "; %s", o->latest.path[0] ? "no checkpoint of this run is known good "
                                                       "(no step trained after any of them)"
                                                     : "the run wrote no checkpoint before then");
        return;
    }
    int used = snprintf(buf, len, "; the last good checkpoint is %s", c->path);
    if (used < 0 || (size_t)used >= len || strcmp(o->latest.path, c->path) == 0) return;
    /* checkpoints/latest names a newer one (of weights that did not train). */
    const char *name = strrchr(c->path, '/');
    int dir_len = name ? (int)(name - c->path) : 0;
    snprintf(buf + used, len - (size_t)used,
             " (checkpoints/latest names %s, written after it; to resume from the good one: "
             "echo %s > %.*s/latest)",
             o->latest.path, name ? name + 1 : c->path, dir_len, c->path);
}

/* ---- the cause ------------------------------------------------------------ */

/* What every rank saw, agreed over ranks (MAX). */
typedef struct facts {
    double bad_input, first_bad_input, weights_not_finite, max_abs_weight, bad_loss;
} facts;

/* One slice's values in chunks through host memory: how many are not
 * finite, and the largest magnitude of those that are. */
static vh_status scan_slice(vh_session *s, const vh_param_slice *sl, float *chunk, size_t cap,
                            facts *f, vh_diag *d) {
    const vh_device_ops *dev = s->run->device;
    size_t esize = vh_dtype_size((vh_dtype)sl->master_dtype);
    if (!sl->master || sl->count <= 0 || !esize || esize > sizeof(float)) return VH_STATUS_OK;
    for (int64_t at = 0; at < sl->count; at += (int64_t)cap) {
        size_t n = (size_t)(sl->count - at) < cap ? (size_t)(sl->count - at) : cap;
        vh_status st = dev->copy(dev->device, chunk, (const char *)sl->master + (size_t)at * esize,
                                 n * esize, VH_COPY_KIND_DEVICE_TO_HOST, NULL);
        if (st != VH_STATUS_OK) return diag_set(d, st, "copying weights from %s failed", dev->name);
        const uint16_t *h = (const uint16_t *)(const void *)chunk;
        for (size_t i = 0; i < n; i++) {
            float v = esize == 4                            ? chunk[i]
                      : sl->master_dtype == VH_DTYPE_F16 ? vh_f16_to_f32(h[i])
                                                          : vh_bf16_to_f32(h[i]);
            if (!isfinite(v)) f->weights_not_finite++;
            else if (fabsf(v) > f->max_abs_weight) f->max_abs_weight = fabsf(v);
        }
    }
    return VH_STATUS_OK;
}

/* This rank's facts, then every rank's (one collective, once per run). */
static vh_status gather_facts(const vh_outcome *o, vh_session *s, facts *f, vh_diag *d) {
    memset(f, 0, sizeof *f);
    const size_t cap = 1 << 16;
    float *chunk = malloc(cap * sizeof *chunk);
    if (!chunk) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    vh_status st = VH_STATUS_OK;
    for (int32_t i = 0; i < s->slices.count && st == VH_STATUS_OK; i++)
        st = scan_slice(s, vh_param_slices_at(&s->slices, i), chunk, cap, f, d);
    free(chunk);
    if (st != VH_STATUS_OK) return st;
    double v[5] = {(double)o->bad_input, o->bad_input ? -(double)o->first_bad_input : -1e300,
                   f->weights_not_finite, f->max_abs_weight, (double)o->bad_loss};
    st = session_reduce_scalars(s, v, 5, VH_REDUCE_OP_MAX, d);
    if (st != VH_STATUS_OK) return st;
    *f = (facts){.bad_input = v[0], .first_bad_input = -v[1], .weights_not_finite = v[2],
                 .max_abs_weight = v[3], .bad_loss = v[4]};
    return VH_STATUS_OK;
}

#define LOWER_LR "lower optim.lr or set optim.clip_grad_norm"

/* Why the gradients overflow with inputs, weights and loss all finite: what
 * the loss scale did over the streak. */
static void scale_cause(const vh_outcome *o, double scale_now, char *buf, size_t len) {
    if (scale_now != o->scale_last) {
        snprintf(buf, len,
                 "the loss scale is still backing off (from %g to %g over these steps) and the "
                 "gradients still overflow: start from a lower loss scale or back off faster, "
                 "or raise run.max_consecutive_skips",
                 o->scale_first, scale_now);
    } else if (o->scale_first != o->scale_last) {
        snprintf(buf, len,
                 "the gradients overflow at every loss scale from %g down to its floor %g, with "
                 "a finite loss (%g): they hold a real Inf/NaN; " LOWER_LR,
                 o->scale_first, scale_now, (double)o->last_loss);
    } else if (scale_now == 1.0) {
        snprintf(buf, len,
                 "the gradients overflow at loss scale 1 with a finite loss (%g): the backward "
                 "pass overflows; " LOWER_LR ", or compute in a wider dtype",
                 (double)o->last_loss);
    } else {
        snprintf(buf, len,
                 "the gradients overflow at loss scale %g, which stayed the same after every "
                 "skip, with a finite loss (%g): a fixed (static) loss scale too large for "
                 "these gradients, or a dynamic one at its floor; use a lower fixed scale or "
                 "dynamic loss scaling (or a lower floor)",
                 scale_now, (double)o->last_loss);
    }
}

static void cause_text(const vh_outcome *o, const vh_session *s, const facts *f,
                       double scale_now, char *buf, size_t len) {
    if (f->bad_input > 0) {
        snprintf(buf, len,
                 "the input batches hold NaN or Inf pixels (%.0f of these steps, from step "
                 "%.0f): data plugin '%s' hands out non-finite values (a damaged file, or a "
                 "normalisation that divides by about 0); the weights are not the cause: fix "
                 "the data",
                 f->bad_input, f->first_bad_input, s->run->plugins[VH_ROLE_DATA].desc->name);
    } else if (f->weights_not_finite > 0) {
        snprintf(buf, len,
                 "the weights hold %.0f NaN or Inf values: an update before step %lld made "
                 "them so, or the run started from them; " LOWER_LR,
                 f->weights_not_finite, (long long)o->streak_first);
    } else if (s->policy.param_dtype == VH_DTYPE_F16 && f->max_abs_weight > F16_MAX) {
        snprintf(buf, len,
                 "the largest weight is %g, past fp16's %g: its fp16 copy is Inf, so every "
                 "forward pass overflows; " LOWER_LR ", or compute in bf16",
                 f->max_abs_weight, F16_MAX);
    } else if (f->bad_loss > 0) {
        snprintf(buf, len,
                 "the loss is NaN or Inf on finite inputs and weights (the largest weight is "
                 "%g): the forward pass overflows (starting weights too large, or 16-bit "
                 "activations out of range); check the starting weights, " LOWER_LR
                 ", or compute in a wider dtype",
                 f->max_abs_weight);
    } else {
        scale_cause(o, scale_now, buf, len);
    }
}

static vh_status stop_run(vh_outcome *o, vh_session *s, const char *what, double scale_now,
                          vh_diag *d) {
    facts f;
    vh_status st = gather_facts(o, s, &f, d);
    if (st != VH_STATUS_OK) return st;
    char cause[1024], good[9800];
    cause_text(o, s, &f, scale_now, cause, sizeof cause);
    outcome_good_text(o, INT64_MAX, good, sizeof good);
    return diag_set(d, VH_STATUS_ERR_NUMERIC, "training stopped at step %lld: %s: %s%s",
                    (long long)s->step, what, cause, good);
}

vh_status outcome_check(vh_outcome *o, vh_session *s, int64_t skipped_total, double scale_now,
                        vh_diag *d) {
    if (o->streak == 0) return VH_STATUS_OK; /* only a skipped step passes a limit */
    char what[256];
    if (o->max_consecutive > 0 && o->streak > o->max_consecutive)
        snprintf(what, sizeof what,
                 "%lld steps in a row were skipped for Inf/NaN gradients (from step %lld; "
                 "run.max_consecutive_skips is %lld)",
                 (long long)o->streak, (long long)o->streak_first, (long long)o->max_consecutive);
    else if (o->max_skipped > 0 && skipped_total > o->max_skipped)
        snprintf(what, sizeof what,
                 "%lld steps in all were skipped for Inf/NaN gradients (run.max_skipped_steps is "
                 "%lld)",
                 (long long)skipped_total, (long long)o->max_skipped);
    else
        return VH_STATUS_OK;
    return stop_run(o, s, what, scale_now, d);
}

vh_status outcome_eval_failed(vh_outcome *o, vh_session *s, double scale_now, vh_diag *d) {
    if (o->streak > 0) {
        char what[256];
        snprintf(what, sizeof what,
                 "its evaluation's logits or loss are NaN or Inf, and the %lld steps before it "
                 "were all skipped for Inf/NaN gradients (from step %lld)",
                 (long long)o->streak, (long long)o->streak_first);
        return stop_run(o, s, what, scale_now, d);
    }
    /* These weights, after step s->step, are the bad ones. */
    char good[9800];
    outcome_good_text(o, s->step + 1, good, sizeof good);
    size_t used = strlen(d->text);
    snprintf(d->text + used, sizeof d->text - used, "%s", good);
    return VH_STATUS_ERR_NUMERIC;
}

vh_status outcome_check_end(vh_outcome *o, vh_session *s, int64_t steps, double scale_now,
                            vh_diag *d) {
    if (steps <= 0 || o->trained > 0) return VH_STATUS_OK;
    char what[160];
    snprintf(what, sizeof what,
             "none of the %lld steps of this run trained: every one was skipped for Inf/NaN "
             "gradients",
             (long long)steps);
    return stop_run(o, s, what, scale_now, d);
}
