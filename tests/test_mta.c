/* test_mta.c - the mta optimizer plugin: AdamW, SGD, LAMB, the SDK's
 * schedules (vh_optim_schedule.h), clipping, scalar state and per-tensor
 * norms over ranks.
 *
 * The plugin is loaded as vithost loads it (a recipe naming `optim: {plugin:
 * mta}` and the test plugins for the other roles) and driven through its
 * vtable on slices the test builds itself, each update with the args the
 * host gives (the rate from the SDK's schedule of the section's shared
 * keys). References:
 *   - PyTorch: tests/fixtures/mta_reference.h, written by
 *     tests/reference/make_adamw_reference.py (AdamW with a schedule, SGD with
 *     Nesterov, SGD with clipping);
 *   - numbers worked out by hand for a first step (written as expressions);
 *   - a textbook double-precision implementation for several steps;
 *   - a float re-statement of the kernels for bit-for-bit checks across chunk
 *     boundaries and threads. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixtures/mta_reference.h"
#include "runtime.h"

#define HINT "(stale reference? /usr/bin/python3 tests/reference/make_adamw_reference.py --check)"
#define TOL_TORCH 1e-6 /* relative to the tensor's largest entry */
#define TOL_HAND 1e-6
#define TOL_LR 1e-12

/* ---- a run with the mta plugin as optimizer ------------------------------ */

typedef struct opt {
    vh_run run;
    const vh_optim_vtable *vt;
    vh_host *host;
    void *self;
    vh_optim_schedule sched; /* the shared keys, as the host reads them */
} opt;

static vh_status open_run(vh_run *run, const char *optim, vh_diag *d) {
    char recipe[2048];
    snprintf(recipe, sizeof recipe,
             "optim: %s\nmodel: {plugin: test_model}\nprecision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\ndata: {plugin: test_data}\n",
             optim);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_run_options opts = {.out = stdout};
    return run_open_text(run, "mta.yaml", recipe, &opts, d);
}

static const char *opt_error(opt *o) { return o->run.hosts[VH_ROLE_OPTIM].error; }

/* Opens the run, reads the shared keys' schedule as the host does and
 * returns create's status (the message in opt_error). `setup` NULL: one
 * with total_steps and nothing else. */
static vh_status opt_try_open_with(opt *o, const char *optim, int64_t total_steps,
                                   const vh_optim_setup *setup) {
    memset(o, 0, sizeof *o);
    vh_diag d = {{0}};
    if (open_run(&o->run, optim, &d) != VH_STATUS_OK) {
        run_close(&o->run);
        fail_msg("%s", d.text);
    }
    const vh_plugin_descriptor *desc = o->run.plugins[VH_ROLE_OPTIM].desc;
    assert_string_equal(desc->name, "mta");
    o->vt = desc->vtable;
    o->host = &o->run.hosts[VH_ROLE_OPTIM].pub;
    o->sched.struct_size = sizeof o->sched;
    vh_status st = vh_optim_schedule_read(o->host, total_steps, &o->sched);
    if (st != VH_STATUS_OK) return st;
    vh_optim_setup plain = {.struct_size = sizeof plain, .total_steps = total_steps};
    return o->vt->create(o->host, setup ? setup : &plain, &o->self);
}

static vh_status opt_try_open(opt *o, const char *optim, int64_t total_steps) {
    return opt_try_open_with(o, optim, total_steps, NULL);
}

static void opt_open(opt *o, const char *optim, int64_t total_steps) {
    if (opt_try_open(o, optim, total_steps) != VH_STATUS_OK)
        fail_msg("create with %s: %s", optim, opt_error(o));
}

static void opt_close(opt *o) {
    if (o->self) o->vt->destroy(o->self);
    o->self = NULL;
    run_close(&o->run);
}

/* One update as the host makes it: the schedule's rate, weight decay and
 * clipping limit for `step` in the args. */
static vh_status opt_update(opt *o, const vh_param_slices *slices, int64_t step, double *lr) {
    vh_optim_step_args a = {.struct_size = sizeof a, .slices = slices, .step = step};
    vh_optim_schedule_args(&o->sched, step, &a);
    return o->vt->update(o->self, &a, lr);
}

static double opt_step(opt *o, const vh_param_slices *slices, int64_t step) {
    double lr = -1.0;
    vh_status st = opt_update(o, slices, step, &lr);
    if (st != VH_STATUS_OK) fail_msg("step %lld: %s", (long long)step, opt_error(o));
    return lr;
}

/* ---- tensors and slices -------------------------------------------------- */

typedef struct tensor {
    int64_t n;
    uint32_t flags;
    float *p, *g, *s[VH_OPTIM_MAX_STATE_SLOTS];
} tensor;

static void tensor_init(tensor *t, int64_t n, uint32_t flags, const float *p0) {
    t->n = n;
    t->flags = flags;
    t->p = calloc((size_t)n, sizeof(float));
    t->g = calloc((size_t)n, sizeof(float));
    assert_non_null(t->p);
    assert_non_null(t->g);
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) {
        t->s[k] = calloc((size_t)n, sizeof(float));
        assert_non_null(t->s[k]);
    }
    if (p0) memcpy(t->p, p0, (size_t)n * sizeof(float));
}

static void tensor_free(tensor *t) {
    free(t->p);
    free(t->g);
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) free(t->s[k]);
    memset(t, 0, sizeof *t);
}

/* A checkpoint's worth: values and per-element state. */
static void tensor_copy(tensor *dst, const tensor *src) {
    size_t b = (size_t)src->n * sizeof(float);
    memcpy(dst->p, src->p, b);
    memcpy(dst->g, src->g, b);
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) memcpy(dst->s[k], src->s[k], b);
}

/* A slice of a later ABI minor: extra members the plugin must step over. */
typedef struct wide_slice {
    vh_param_slice s;
    double later_members[3];
} wide_slice;

#define MAX_SLICES 16

typedef struct slice_list {
    _Alignas(16) unsigned char bytes[MAX_SLICES * sizeof(wide_slice)];
    vh_param_slices view;
} slice_list;

static void list_init(slice_list *l, int wide) {
    memset(l, 0, sizeof *l);
    l->view.items = (vh_param_slice *)(void *)l->bytes;
    l->view.count = 0;
    l->view.item_size = wide ? (uint32_t)sizeof(wide_slice) : (uint32_t)sizeof(vh_param_slice);
    memset(l->bytes, 0x7f, sizeof l->bytes); /* what the plugin must not read */
}

static void list_add(slice_list *l, tensor *t, int32_t unit, int32_t param, int64_t offset,
                     int64_t count) {
    assert_true(l->view.count < MAX_SLICES);
    vh_param_slice *s = vh_param_slices_at(&l->view, l->view.count++);
    memset(s, 0, sizeof *s);
    s->unit = unit;
    s->param = param;
    s->offset = offset;
    s->count = count;
    s->flags = t->flags;
    s->master = t->p + offset;
    s->grad = t->g + offset;
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) s->state[k] = t->s[k] + offset;
}

/* A deterministic gradient value in about [-2, 2]. */
static float grad_value(int64_t step, int64_t tensor_id, int64_t i) {
    uint64_t x = (uint64_t)step * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)tensor_id * 0xBF58476D1CE4E5B9ull ^ (uint64_t)i * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    return (float)((double)(x % 40001) / 10000.0 - 2.0);
}

static void fill_grads(tensor *ts, int count, int64_t step) {
    for (int t = 0; t < count; t++)
        for (int64_t i = 0; i < ts[t].n; i++) ts[t].g[i] = grad_value(step, t, i);
}

/* ---- comparisons ---------------------------------------------------------- */

/* max |got - want| <= tol * max(|want|); prints the worst element. */
static int close_to(const char *what, const float *got, const double *want, int64_t n,
                    double tol) {
    double scale = 0.0, worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    if (scale == 0.0) scale = 1.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e, at = i;
    }
    if (worst <= tol * scale) return 1;
    printf("%s: element %lld is %.9g, expected %.9g (error %.3g > %.3g)\n", what, (long long)at,
           (double)got[at], want[at], worst, tol * scale);
    return 0;
}

static int close_to_f(const char *what, const float *got, const float *want, int64_t n,
                      double tol) {
    double *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    assert_non_null(w);
    for (int64_t i = 0; i < n; i++) w[i] = want[i];
    int ok = close_to(what, got, w, n, tol);
    free(w);
    return ok;
}

static int same_bits(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            printf("%s: element %lld is %a, expected %a\n", what, (long long)i, (double)got[i],
                   (double)want[i]);
            return 0;
        }
    return 1;
}

static void assert_near(double got, double want, double rel) {
    if (!(fabs(got - want) <= rel * fabs(want) + 1e-30))
        fail_msg("%.9g, expected %.9g (relative tolerance %g)", got, want, rel);
}

static void assert_lr(double got, double want) {
    if (!(fabs(got - want) <= TOL_LR * fmax(fabs(want), 1e-300)))
        fail_msg("lr %.17g, expected %.17g", got, want);
}

/* ---- a textbook double-precision optimizer --------------------------------
 * Per tensor (not per slice): what the algorithms mean, written the way
 * papers write them, in double. */

typedef enum ref_algo { REF_ADAMW, REF_SGD, REF_LAMB } ref_algo;

typedef struct ref_cfg {
    ref_algo algo;
    double wd, beta1, beta2, eps, momentum, clip;
    int nesterov, always_adapt;
} ref_cfg;

typedef struct ref_tensor {
    int64_t n;
    int decay;
    double *p, *m, *v;
} ref_tensor;

static void ref_init(ref_tensor *r, const tensor *t) {
    r->n = t->n;
    r->decay = (t->flags & VH_PARAM_FLAG_DECAY) != 0;
    r->p = calloc((size_t)t->n, sizeof(double));
    r->m = calloc((size_t)t->n, sizeof(double));
    r->v = calloc((size_t)t->n, sizeof(double));
    for (int64_t i = 0; i < t->n; i++) r->p[i] = t->p[i];
}

static void ref_free(ref_tensor *r) {
    free(r->p);
    free(r->m);
    free(r->v);
}

/* Update number t (from 1) with rate lr; grads from the test tensors. */
static void ref_step(const ref_cfg *c, ref_tensor *rs, const tensor *ts, int count, int64_t t,
                     double lr) {
    double scale = 1.0;
    if (c->clip > 0) {
        double sq = 0.0;
        for (int k = 0; k < count; k++)
            for (int64_t i = 0; i < ts[k].n; i++) sq += (double)ts[k].g[i] * ts[k].g[i];
        scale = fmin(1.0, c->clip / (sqrt(sq) + 1e-6));
    }
    for (int k = 0; k < count; k++) {
        ref_tensor *r = &rs[k];
        const double wd = r->decay ? c->wd : 0.0;
        const double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
        double p_sq = 0.0, u_sq = 0.0;
        for (int64_t i = 0; i < r->n; i++) {
            const double g = ts[k].g[i] * scale;
            if (c->algo == REF_SGD) {
                const double d = g + wd * r->p[i];
                if (c->momentum > 0) {
                    r->m[i] = t == 1 ? d : c->momentum * r->m[i] + d;
                    r->p[i] -= lr * (c->nesterov ? d + c->momentum * r->m[i] : r->m[i]);
                } else {
                    r->p[i] -= lr * d;
                }
                continue;
            }
            r->m[i] = c->beta1 * r->m[i] + (1 - c->beta1) * g;
            r->v[i] = c->beta2 * r->v[i] + (1 - c->beta2) * g * g;
            const double adam = (r->m[i] / bc1) / (sqrt(r->v[i] / bc2) + c->eps);
            if (c->algo == REF_ADAMW) {
                r->p[i] = r->p[i] * (1 - lr * wd) - lr * adam;
            } else {
                const double u = adam + wd * r->p[i];
                p_sq += r->p[i] * r->p[i];
                u_sq += u * u;
            }
        }
        if (c->algo != REF_LAMB) continue;
        double ratio = 1.0;
        if ((wd != 0.0 || c->always_adapt) && p_sq > 0 && u_sq > 0) ratio = sqrt(p_sq / u_sq);
        for (int64_t i = 0; i < r->n; i++) {
            const double adam = (r->m[i] / bc1) / (sqrt(r->v[i] / bc2) + c->eps);
            r->p[i] -= lr * ratio * (adam + wd * r->p[i]);
        }
    }
}

/* ---- the schema ------------------------------------------------------------ */

/* mta's schema has the algorithm's keys; the shared ones (the SDK's) are in
 * its section all the same, merged by the host, and mta declares none. */
static void test_schema_documents_every_key(void **state) {
    (void)state;
    static const char *const keys[] = {"algo",     "beta1",    "beta2",       "eps",
                                       "momentum", "nesterov", "always_adapt"};
    static const char *const shared[] = {"lr",      "weight_decay",   "schedule",
                                         "warmup_steps", "warmup_init_lr", "min_lr",
                                         "step_size",    "step_gamma",     "clip_grad_norm"};
    opt o;
    opt_open(&o, "{plugin: mta}", 100);
    const vh_config_key *schema = o.run.plugins[VH_ROLE_OPTIM].desc->schema;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const vh_config_key *k = schema;
        while (k->key && strcmp(k->key, keys[i]) != 0) k++;
        if (!k->key) fail_msg("schema lacks '%s'", keys[i]);
        assert_non_null(k->doc);
        assert_true(strlen(k->doc) > 10);
        assert_non_null(k->default_value);
    }
    for (const vh_config_key *k = schema; k->key; k++)
        if (vh_optim_shared_key(k->key)) fail_msg("mta declares shared key '%s'", k->key);
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) {
        const vh_config_entry *e = config_find(&o.run.configs[VH_ROLE_OPTIM], shared[i]);
        if (!e) fail_msg("the optim section lacks shared key '%s'", shared[i]);
        assert_true(vh_optim_shared_key(shared[i]));
        assert_true(e->key->doc && strlen(e->key->doc) > 10 && e->key->default_value);
    }
    /* defaults: adamw (2 slots), lr 1e-3 at step 0 with cosine and no warm-up */
    assert_int_equal(o.vt->state_slots(o.self), 2);
    vh_param_slices none = {.items = NULL, .count = 0, .item_size = sizeof(vh_param_slice)};
    assert_lr(opt_step(&o, &none, 0), 1e-3);
    opt_close(&o);
}

static void test_state_slots_per_algo(void **state) {
    (void)state;
    static const struct {
        const char *optim;
        int32_t slots;
    } cases[] = {
        {"{plugin: mta, algo: adamw}", 2},
        {"{plugin: mta, algo: lamb}", 2},
        {"{plugin: mta, algo: sgd}", 1},
        {"{plugin: mta, algo: sgd, momentum: 0}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        opt o;
        opt_open(&o, cases[i].optim, 10);
        assert_int_equal(o.vt->state_slots(o.self), cases[i].slots);
        opt_close(&o);
    }
}

/* ---- AdamW ------------------------------------------------------------------ */

/* Step 1 by hand: m_hat = g and v_hat = g^2, so
 * p1 = p0 * (1 - lr * wd) - lr * g / (|g| + eps). */
static void test_adamw_first_step_by_hand(void **state) {
    (void)state;
    const double lr = 0.01, wd = 0.1, eps = 1e-8;
    static const float w0[] = {1.0f, -2.0f, 3.0f, 0.5f}, wg[] = {0.1f, 0.2f, -0.3f, 0.0f};
    static const float b0[] = {0.25f, -0.75f, 1.5f}, bg[] = {-4.0f, 0.001f, 2.0f};
    static const float c0[] = {-1.0f, 2.0f}, cg[] = {0.5f, -0.5f};
    tensor t[3];
    tensor_init(&t[0], 4, VH_PARAM_FLAG_DECAY, w0);
    tensor_init(&t[1], 3, 0, b0);
    tensor_init(&t[2], 2, VH_PARAM_FLAG_DECAY, c0);
    memcpy(t[0].g, wg, sizeof wg);
    memcpy(t[1].g, bg, sizeof bg);
    memcpy(t[2].g, cg, sizeof cg);
    /* unit/param indices say nothing about decay: the flags do */
    slice_list l;
    list_init(&l, 0);
    list_add(&l, &t[0], 0, 0, 0, 3); /* w split over two slices */
    list_add(&l, &t[1], 0, 1, 0, 3);
    list_add(&l, &t[0], 0, 0, 3, 1);
    list_add(&l, &t[2], 1, 0, 0, 2);
    opt o;
    opt_open(&o,
             "{plugin: mta, algo: adamw, lr: 0.01, weight_decay: 0.1, schedule: constant}", 10);
    assert_lr(opt_step(&o, &l.view, 0), lr);
    const float *p0[] = {w0, b0, c0}, *g[] = {wg, bg, cg};
    for (int k = 0; k < 3; k++) {
        double want[4];
        const double decay = (t[k].flags & VH_PARAM_FLAG_DECAY) ? 1 - lr * wd : 1.0;
        for (int64_t i = 0; i < t[k].n; i++)
            want[i] = p0[k][i] * decay - lr * g[k][i] / (fabs(g[k][i]) + eps);
        char name[32];
        snprintf(name, sizeof name, "tensor %d", k);
        assert_true(close_to(name, t[k].p, want, t[k].n, TOL_HAND));
        /* slot 0 holds m = (1 - b1) g, slot 1 v = (1 - b2) g^2 */
        for (int64_t i = 0; i < t[k].n; i++) {
            assert_near(t[k].s[0][i], 0.1 * g[k][i], 1e-6);
            assert_near(t[k].s[1][i], 0.001 * g[k][i] * g[k][i], 1e-6);
        }
    }
    opt_close(&o);
    for (int k = 0; k < 3; k++) tensor_free(&t[k]);
}

/* Several steps against the textbook formula, with a schedule and clipping. */
static void check_against_textbook(const char *optim, const ref_cfg *c, int64_t steps,
                                   int64_t total_steps, const double *lrs) {
    static const int64_t sizes[] = {7, 5, 4};
    static const uint32_t flags[] = {VH_PARAM_FLAG_DECAY, 0, VH_PARAM_FLAG_DECAY};
    tensor t[3];
    ref_tensor r[3];
    for (int k = 0; k < 3; k++) {
        tensor_init(&t[k], sizes[k], flags[k], NULL);
        for (int64_t i = 0; i < sizes[k]; i++) t[k].p[i] = grad_value(99, k, i);
        ref_init(&r[k], &t[k]);
    }
    slice_list l;
    list_init(&l, 1);
    list_add(&l, &t[0], 0, 0, 0, 4);
    list_add(&l, &t[1], 0, 1, 0, 5);
    list_add(&l, &t[0], 0, 0, 4, 3);
    list_add(&l, &t[2], 1, 0, 0, 4);
    opt o;
    opt_open(&o, optim, total_steps);
    for (int64_t s = 0; s < steps; s++) {
        fill_grads(t, 3, s);
        double lr = opt_step(&o, &l.view, s);
        if (lrs) assert_lr(lr, lrs[s]);
        ref_step(c, r, t, 3, s + 1, lr);
        for (int k = 0; k < 3; k++) {
            char name[192];
            snprintf(name, sizeof name, "%.120s step %lld tensor %d", optim, (long long)s, k);
            if (!close_to(name, t[k].p, r[k].p, t[k].n, TOL_HAND)) fail();
        }
    }
    opt_close(&o);
    for (int k = 0; k < 3; k++) {
        tensor_free(&t[k]);
        ref_free(&r[k]);
    }
}

static void test_adamw_against_textbook(void **state) {
    (void)state;
    ref_cfg c = {.algo = REF_ADAMW, .wd = 0.05, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    check_against_textbook("{plugin: mta, lr: 0.02, warmup_steps: 2, warmup_init_lr: 0.001}", &c,
                           6, 8, NULL);
    c.clip = 1.5;
    c.beta1 = 0.8;
    c.beta2 = 0.95;
    c.eps = 1e-6;
    check_against_textbook("{plugin: mta, lr: 0.02, beta1: 0.8, beta2: 0.95, eps: 1.0e-6, "
                           "clip_grad_norm: 1.5, schedule: constant}",
                           &c, 4, 8, NULL);
}

/* PyTorch's AdamW, 5 steps, weight decay on w, warm-up + cosine. The
 * reference's schedule is timm's cosine over T - W intervals (its last step
 * is still above min_lr); the SDK's cosine spans T - W - 1, so over one step
 * more it gives the reference's rates. */
static void test_adamw_matches_torch(void **state) {
    (void)state;
    assert_int_equal(MTA_REF_VERSION, 1);
    tensor w, b;
    tensor_init(&w, MTA_REF_NW, VH_PARAM_FLAG_DECAY, mta_ref_w0);
    tensor_init(&b, MTA_REF_NB, 0, mta_ref_b0);
    slice_list l;
    list_init(&l, 1);
    list_add(&l, &w, 0, 0, 0, 4);
    list_add(&l, &b, 0, 1, 0, MTA_REF_NB);
    list_add(&l, &w, 0, 0, 4, MTA_REF_NW - 4);
    opt o;
    opt_open(&o, MTA_REF_ADAMW_OPTIM, MTA_REF_STEPS + 1);
    for (int s = 0; s < MTA_REF_STEPS; s++) {
        memcpy(w.g, mta_ref_gw[s], sizeof mta_ref_gw[s]);
        memcpy(b.g, mta_ref_gb[s], sizeof mta_ref_gb[s]);
        assert_lr(opt_step(&o, &l.view, s), mta_ref_adamw_lr[s]);
        char name[64];
        snprintf(name, sizeof name, "adamw step %d w", s);
        if (!close_to_f(name, w.p, mta_ref_adamw_w[s], MTA_REF_NW, TOL_TORCH)) fail_msg(HINT);
        snprintf(name, sizeof name, "adamw step %d b", s);
        if (!close_to_f(name, b.p, mta_ref_adamw_b[s], MTA_REF_NB, TOL_TORCH)) fail_msg(HINT);
    }
    assert_true(close_to_f("exp_avg w", w.s[0], mta_ref_adamw_w_state0, MTA_REF_NW, TOL_TORCH));
    assert_true(close_to_f("exp_avg b", b.s[0], mta_ref_adamw_b_state0, MTA_REF_NB, TOL_TORCH));
    assert_true(close_to_f("exp_avg_sq w", w.s[1], mta_ref_adamw_w_state1, MTA_REF_NW, TOL_TORCH));
    assert_true(close_to_f("exp_avg_sq b", b.s[1], mta_ref_adamw_b_state1, MTA_REF_NB, TOL_TORCH));
    opt_close(&o);
    tensor_free(&w);
    tensor_free(&b);
}

/* ---- SGD -------------------------------------------------------------------- */

/* Step 1 by hand: buf = d = g + wd p (decay only), p -= lr * (1 + mu) d with
 * Nesterov, p -= lr * d without. */
static void test_sgd_first_step_by_hand(void **state) {
    (void)state;
    const double lr = 0.1, wd = 0.01, mu = 0.9;
    static const float w0[] = {1.0f, -2.0f, 3.0f}, wg[] = {0.5f, 0.25f, -1.0f};
    static const float b0[] = {4.0f, -1.0f}, bg[] = {1.0f, -2.0f};
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        tensor w, b;
        tensor_init(&w, 3, VH_PARAM_FLAG_DECAY, w0);
        tensor_init(&b, 2, 0, b0);
        memcpy(w.g, wg, sizeof wg);
        memcpy(b.g, bg, sizeof bg);
        /* garbage in the momentum buffer: the first update must not read it */
        for (int i = 0; i < 3; i++) w.s[0][i] = 1e30f;
        slice_list l;
        list_init(&l, 0);
        list_add(&l, &w, 0, 0, 0, 2);
        list_add(&l, &w, 0, 0, 2, 1);
        list_add(&l, &b, 0, 1, 0, 2);
        opt o;
        opt_open(&o,
                 nesterov ? "{plugin: mta, algo: sgd, lr: 0.1, weight_decay: 0.01, momentum: "
                            "0.9, nesterov: true, schedule: constant}"
                          : "{plugin: mta, algo: sgd, lr: 0.1, weight_decay: 0.01, momentum: "
                            "0.9, schedule: constant}",
                 10);
        opt_step(&o, &l.view, 0);
        double want_w[3], want_b[2];
        for (int i = 0; i < 3; i++) {
            double d = wg[i] + wd * w0[i];
            want_w[i] = w0[i] - lr * (nesterov ? (1 + mu) * d : d);
            assert_near(w.s[0][i], d, 1e-6);
        }
        for (int i = 0; i < 2; i++) want_b[i] = b0[i] - lr * (nesterov ? (1 + mu) : 1.0) * bg[i];
        assert_true(close_to("sgd w", w.p, want_w, 3, TOL_HAND));
        assert_true(close_to("sgd b", b.p, want_b, 2, TOL_HAND));
        opt_close(&o);
        tensor_free(&w);
        tensor_free(&b);
    }
}

static void test_sgd_against_textbook(void **state) {
    (void)state;
    ref_cfg c = {.algo = REF_SGD, .wd = 1e-3, .momentum = 0.9};
    check_against_textbook("{plugin: mta, algo: sgd, lr: 0.1, weight_decay: 0.001, schedule: step, "
                           "step_size: 2, step_gamma: 0.5}",
                           &c, 6, 6, NULL);
    c.nesterov = 1;
    c.clip = 2.0;
    check_against_textbook("{plugin: mta, algo: sgd, lr: 0.1, weight_decay: 0.001, nesterov: true, "
                           "clip_grad_norm: 2.0, warmup_steps: 2}",
                           &c, 6, 6, NULL);
    c.momentum = 0;
    c.nesterov = 0;
    c.clip = 0;
    check_against_textbook("{plugin: mta, algo: sgd, lr: 0.1, weight_decay: 0.001, momentum: 0, "
                           "schedule: constant}",
                           &c, 3, 6, NULL);
}

static void check_sgd_torch(const char *optim, const double *lrs, const float (*want_w)[MTA_REF_NW],
                            const float (*want_b)[MTA_REF_NB], const float *buf_w,
                            const float *buf_b) {
    tensor w, b;
    tensor_init(&w, MTA_REF_NW, VH_PARAM_FLAG_DECAY, mta_ref_w0);
    tensor_init(&b, MTA_REF_NB, 0, mta_ref_b0);
    slice_list l;
    list_init(&l, 1);
    list_add(&l, &b, 3, 1, 0, MTA_REF_NB);
    list_add(&l, &w, 3, 0, 0, MTA_REF_NW);
    opt o;
    opt_open(&o, optim, MTA_REF_STEPS);
    for (int s = 0; s < MTA_REF_STEPS; s++) {
        memcpy(w.g, mta_ref_gw[s], sizeof mta_ref_gw[s]);
        memcpy(b.g, mta_ref_gb[s], sizeof mta_ref_gb[s]);
        assert_lr(opt_step(&o, &l.view, s), lrs[s]);
        char name[96];
        snprintf(name, sizeof name, "%s step %d w", optim, s);
        if (!close_to_f(name, w.p, want_w[s], MTA_REF_NW, TOL_TORCH)) fail_msg(HINT);
        snprintf(name, sizeof name, "%s step %d b", optim, s);
        if (!close_to_f(name, b.p, want_b[s], MTA_REF_NB, TOL_TORCH)) fail_msg(HINT);
    }
    assert_true(close_to_f("momentum_buffer w", w.s[0], buf_w, MTA_REF_NW, TOL_TORCH));
    assert_true(close_to_f("momentum_buffer b", b.s[0], buf_b, MTA_REF_NB, TOL_TORCH));
    opt_close(&o);
    tensor_free(&w);
    tensor_free(&b);
}

static void test_sgd_nesterov_matches_torch(void **state) {
    (void)state;
    check_sgd_torch(MTA_REF_SGD_NESTEROV_OPTIM, mta_ref_sgd_nesterov_lr, mta_ref_sgd_nesterov_w,
                    mta_ref_sgd_nesterov_b, mta_ref_sgd_nesterov_w_state0,
                    mta_ref_sgd_nesterov_b_state0);
}

/* clip_grad_norm_ at 2.0: steps 0, 2 and 4 clip, steps 1 and 3 do not. */
static void test_sgd_clip_matches_torch(void **state) {
    (void)state;
    int above = 0, below = 0;
    for (int s = 0; s < MTA_REF_STEPS; s++) {
        if (mta_ref_sgd_clip_norm[s] > 2.0)
            above++;
        else
            below++;
    }
    assert_true(above > 0 && below > 0);
    check_sgd_torch(MTA_REF_SGD_CLIP_OPTIM, mta_ref_sgd_clip_lr, mta_ref_sgd_clip_w,
                    mta_ref_sgd_clip_b, mta_ref_sgd_clip_w_state0, mta_ref_sgd_clip_b_state0);
}

/* ---- LAMB ------------------------------------------------------------------- */

/* First step by hand (m_hat = g, v_hat = g^2, so u = sign(g) + wd p):
 *   w = [3, 4] (decay, split over two slices), g = [1, -1]:
 *       u = [1.3, -0.6], ratio = ||w|| / ||u|| = 5 / sqrt(2.05)
 *   b = [1, 2] (no decay), g = [0.5, 0.5]: u = [1, 1], ratio 1 (apex, timm);
 *       with always_adapt sqrt(5) / sqrt(2)
 *   z = [0, 0] (decay), g = [2, -3]: ||z|| = 0, ratio 1
 *   q = [2, -1] (decay), g = 0: u = wd q, ratio 1 / wd, q -= lr q */
static void test_lamb_trust_ratio_by_hand(void **state) {
    (void)state;
    const double lr = 0.01;
    for (int always = 0; always < 2; always++) {
        static const float w0[] = {3, 4}, wg[] = {1, -1}, b0[] = {1, 2}, bg[] = {0.5f, 0.5f};
        static const float z0[] = {0, 0}, zg[] = {2, -3}, q0[] = {2, -1};
        tensor t[4];
        tensor_init(&t[0], 2, VH_PARAM_FLAG_DECAY, w0);
        tensor_init(&t[1], 2, 0, b0);
        tensor_init(&t[2], 2, VH_PARAM_FLAG_DECAY, z0);
        tensor_init(&t[3], 2, VH_PARAM_FLAG_DECAY, q0);
        memcpy(t[0].g, wg, sizeof wg);
        memcpy(t[1].g, bg, sizeof bg);
        memcpy(t[2].g, zg, sizeof zg);
        slice_list l;
        list_init(&l, 0);
        list_add(&l, &t[0], 0, 0, 0, 1);
        list_add(&l, &t[1], 0, 1, 0, 2);
        list_add(&l, &t[2], 1, 0, 0, 2);
        list_add(&l, &t[0], 0, 0, 1, 1);
        list_add(&l, &t[3], 2, 2, 0, 2);
        opt o;
        opt_open(&o,
                 always ? "{plugin: mta, algo: lamb, lr: 0.01, weight_decay: 0.1, schedule: "
                          "constant, always_adapt: true}"
                        : "{plugin: mta, algo: lamb, lr: 0.01, weight_decay: 0.1, schedule: "
                          "constant}",
                 10);
        opt_step(&o, &l.view, 0);
        const double rw = 5.0 / sqrt(2.05);
        const double want_w[] = {3 - lr * rw * 1.3, 4 - lr * rw * -0.6};
        const double rb = always ? sqrt(5.0) / sqrt(2.0) : 1.0;
        const double want_b[] = {1 - lr * rb, 2 - lr * rb};
        const double want_z[] = {-lr, lr};
        const double want_q[] = {2 * (1 - lr), -1 * (1 - lr)};
        assert_true(close_to("lamb w", t[0].p, want_w, 2, TOL_HAND));
        assert_true(close_to("lamb b", t[1].p, want_b, 2, TOL_HAND));
        assert_true(close_to("lamb z", t[2].p, want_z, 2, TOL_HAND));
        assert_true(close_to("lamb q", t[3].p, want_q, 2, TOL_HAND));
        opt_close(&o);
        for (int k = 0; k < 4; k++) tensor_free(&t[k]);
    }
}

static void test_lamb_against_textbook(void **state) {
    (void)state;
    ref_cfg c = {.algo = REF_LAMB, .wd = 0.02, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-6};
    check_against_textbook("{plugin: mta, algo: lamb, lr: 0.005, weight_decay: 0.02, eps: 1.0e-6, "
                           "schedule: cosine, min_lr: 0.0005}",
                           &c, 6, 6, NULL);
    c.clip = 1.0;
    c.always_adapt = 1;
    check_against_textbook("{plugin: mta, algo: lamb, lr: 0.005, weight_decay: 0.02, eps: 1.0e-6, "
                           "clip_grad_norm: 1.0, always_adapt: true, schedule: constant}",
                           &c, 5, 6, NULL);
}

/* ---- schedules ------------------------------------------------------------- */

typedef struct lr_point {
    int64_t step;
    double lr;
} lr_point;

static void check_schedule(const char *optim, int64_t total, const lr_point *pts, size_t n) {
    opt o;
    opt_open(&o, optim, total);
    vh_param_slices none = {.items = NULL, .count = 0, .item_size = sizeof(vh_param_slice)};
    for (size_t i = 0; i < n; i++) {
        double lr = opt_step(&o, &none, pts[i].step);
        if (!(fabs(lr - pts[i].lr) <= TOL_LR * fmax(pts[i].lr, 1e-300)))
            fail_msg("%s: step %lld has lr %.17g, expected %.17g", optim, (long long)pts[i].step,
                     lr, pts[i].lr);
    }
    opt_close(&o);
}

static void test_schedule_cosine(void **state) {
    (void)state;
    const double pi = 3.14159265358979323846;
    /* warm-up 10 from 0.01 to 0.1, cosine over steps 10..109 (99 intervals)
     * down to 0.001 at step 109, the run's last */
    const lr_point pts[] = {
        {0, 0.01},
        {1, 0.01 + 0.009},
        {5, 0.01 + 5 * 0.009},
        {9, 0.01 + 9 * 0.009},
        {10, 0.1},                                          /* end of warm-up: the peak */
        {43, 0.001 + 0.5 * 0.099 * (1 + cos(pi / 3))},      /* a third of the cosine */
        {60, 0.001 + 0.5 * 0.099 * (1 + cos(pi * 50 / 99))},
        {108, 0.001 + 0.5 * 0.099 * (1 + cos(pi * 98 / 99))},
        {109, 0.001},                                       /* the last step: min_lr */
        {110, 0.001},
        {500, 0.001},
    };
    check_schedule("{plugin: mta, lr: 0.1, warmup_steps: 10, warmup_init_lr: 0.01, min_lr: 0.001}",
                   110, pts, sizeof pts / sizeof pts[0]);
    /* no warm-up: step 0 uses lr, step 99 of 100 min_lr (0) */
    const lr_point cold[] = {{0, 0.1}, {33, 0.05 * (1 + cos(pi / 3))}, {99, 0.0}};
    check_schedule("{plugin: mta, lr: 0.1}", 100, cold, sizeof cold / sizeof cold[0]);
}

/* The SDK's cosine: the first step after warm-up uses lr and the run's last
 * step (total_steps - 1) min_lr, both exactly, whatever the lengths. */
static void test_schedule_cosine_ends_at_min_lr(void **state) {
    (void)state;
    static const struct {
        int64_t total, warmup;
        double lr, min_lr;
    } runs[] = {{110, 10, 0.1, 0.001}, {100, 0, 2e-3, 0}, {7, 2, 0.02, 1e-4},
                {2, 0, 0.3, 0.03},    {9375, 200, 2e-3, 5e-6}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        vh_optim_schedule s = {.struct_size = sizeof s, .kind = VH_SCHEDULE_KIND_COSINE,
                               .lr = runs[i].lr, .min_lr = runs[i].min_lr,
                               .warmup_steps = runs[i].warmup, .total_steps = runs[i].total};
        const int64_t last = runs[i].total - 1, w = runs[i].warmup;
        if (vh_optim_schedule_lr(&s, last) != runs[i].min_lr)
            fail_msg("run %zu: lr(%lld) = %.17g, not min_lr %.17g", i, (long long)last,
                     vh_optim_schedule_lr(&s, last), runs[i].min_lr);
        if (vh_optim_schedule_lr(&s, w) != runs[i].lr)
            fail_msg("run %zu: lr(%lld) = %.17g, not lr %.17g", i, (long long)w,
                     vh_optim_schedule_lr(&s, w), runs[i].lr);
        /* strictly falling in between */
        for (int64_t t = w + 1; t <= last; t++)
            assert_true(vh_optim_schedule_lr(&s, t) < vh_optim_schedule_lr(&s, t - 1));
    }
}

static void test_schedule_step_and_constant(void **state) {
    (void)state;
    const lr_point step_pts[] = {
        {0, 0.0},   {4, 0.08},   {5, 0.1},    {14, 0.1},
        {15, 0.05}, {24, 0.05},  {25, 0.025}, {105, 0.1 / 1024},
    };
    check_schedule("{plugin: mta, lr: 0.1, schedule: step, warmup_steps: 5, step_size: 10, "
                   "step_gamma: 0.5}",
                   1000, step_pts, sizeof step_pts / sizeof step_pts[0]);
    const lr_point const_pts[] = {
        {0, 0.0}, {1, 0.3 / 3}, {2, 2 * (0.3 / 3)}, {3, 0.3}, {1000000, 0.3}};
    check_schedule("{plugin: mta, lr: 0.3, schedule: constant, warmup_steps: 3}", 10, const_pts,
                   sizeof const_pts / sizeof const_pts[0]);
    const lr_point plain[] = {{0, 0.3}, {7, 0.3}};
    check_schedule("{plugin: mta, lr: 0.3, schedule: constant}", 10, plain, 2);
}

/* ---- clipping ---------------------------------------------------------------- */

/* Grads [3, 4] and [12]: global norm 13. */
static void run_clip(const char *optim, float *p_out, float *q_out) {
    tensor p, q;
    static const float p0[] = {1, 1}, q0[] = {1};
    tensor_init(&p, 2, VH_PARAM_FLAG_DECAY, p0);
    tensor_init(&q, 1, 0, q0);
    p.g[0] = 3, p.g[1] = 4, q.g[0] = 12;
    slice_list l;
    list_init(&l, 0);
    list_add(&l, &p, 0, 0, 0, 2);
    list_add(&l, &q, 0, 1, 0, 1);
    opt o;
    opt_open(&o, optim, 10);
    opt_step(&o, &l.view, 0);
    memcpy(p_out, p.p, 2 * sizeof(float));
    q_out[0] = q.p[0];
    opt_close(&o);
    tensor_free(&p);
    tensor_free(&q);
}

static void test_clipping_above_and_below(void **state) {
    (void)state;
    float p[2], q[1];
    /* above: scale 6.5 / (13 + 1e-6), about 0.5 */
    run_clip("{plugin: mta, algo: sgd, momentum: 0, lr: 1, weight_decay: 0, schedule: constant, "
             "clip_grad_norm: 6.5}",
             p, q);
    const double s = 6.5 / (13 + 1e-6);
    const double want_p[] = {1 - 3 * s, 1 - 4 * s}, want_q[] = {1 - 12 * s};
    assert_true(close_to("clipped p", p, want_p, 2, 1e-7));
    assert_true(close_to("clipped q", q, want_q, 1, 1e-7));
    /* below: untouched, so exactly p - g */
    run_clip("{plugin: mta, algo: sgd, momentum: 0, lr: 1, weight_decay: 0, schedule: constant, "
             "clip_grad_norm: 13.5}",
             p, q);
    assert_true(p[0] == -2.0f && p[1] == -3.0f && q[0] == -11.0f);
    /* off */
    run_clip("{plugin: mta, algo: sgd, momentum: 0, lr: 1, weight_decay: 0, schedule: constant}", p,
             q);
    assert_true(p[0] == -2.0f && p[1] == -3.0f && q[0] == -11.0f);
}

static void test_clipping_refuses_nonfinite_norm(void **state) {
    (void)state;
    tensor p;
    tensor_init(&p, 3, 0, NULL);
    p.g[1] = INFINITY;
    slice_list l;
    list_init(&l, 0);
    list_add(&l, &p, 0, 0, 0, 3);
    opt o;
    opt_open(&o, "{plugin: mta, clip_grad_norm: 1.0}", 10);
    double lr = -1;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_ERR_NUMERIC);
    assert_non_null(strstr(opt_error(&o), "gradient norm"));
    opt_close(&o);
    tensor_free(&p);
}

/* ---- bit for bit: chunks, threads, slices -----------------------------------
 * The same formulas in float, one element at a time, in torch's order. */

static void flt_adamw(float *p, const float *g, float *m, float *v, int64_t n, double lr,
                      double wd, int64_t t) {
    const double bc1 = 1 - pow(0.9, (double)t), bc2 = 1 - pow(0.999, (double)t);
    const float decay = (float)(1 - lr * wd), neg_step = (float)-(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    for (int64_t i = 0; i < n; i++) {
        p[i] = p[i] * decay;
        m[i] = m[i] * 0.9f + (float)(1 - 0.9) * g[i];
        v[i] = v[i] * 0.999f + ((float)(1 - 0.999) * g[i]) * g[i];
        const float denom = sqrtf(v[i]) / bc2_sqrt + 1e-8f;
        p[i] = p[i] + (neg_step * m[i]) / denom;
    }
}

static void flt_sgd(float *p, const float *g, float *buf, int64_t n, double lr, double wd,
                    int64_t t) {
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (wd != 0) d = d + (float)wd * p[i];
        buf[i] = t == 1 ? d : buf[i] * 0.9f + d;
        d = d + 0.9f * buf[i];
        p[i] = p[i] + (float)-lr * d;
    }
}

/* Tensors of 200003 and 70001 elements (several 64K chunks each, split over
 * slices at odd places) and a tiny one: the plugin equals the float loop. */
static void test_chunks_bit_for_bit(void **state) {
    (void)state;
    static const int64_t sizes[] = {200003, 70001, 5};
    static const uint32_t flags[] = {VH_PARAM_FLAG_DECAY, 0, VH_PARAM_FLAG_DECAY};
    for (int algo = 0; algo < 2; algo++) {
        tensor t[3], r[3];
        for (int k = 0; k < 3; k++) {
            tensor_init(&t[k], sizes[k], flags[k], NULL);
            for (int64_t i = 0; i < sizes[k]; i++) t[k].p[i] = grad_value(-1, k, i);
            tensor_init(&r[k], sizes[k], flags[k], t[k].p);
        }
        slice_list l;
        list_init(&l, 1);
        list_add(&l, &t[0], 0, 0, 0, 65537);
        list_add(&l, &t[2], 2, 0, 0, 5);
        list_add(&l, &t[0], 0, 0, 65537, 100000);
        list_add(&l, &t[1], 1, 3, 0, 70001);
        list_add(&l, &t[0], 0, 0, 165537, 200003 - 165537);
        opt o;
        opt_open(&o,
                 algo == 0 ? "{plugin: mta, algo: adamw, lr: 0.003, weight_decay: 0.05, "
                             "warmup_steps: 1}"
                           : "{plugin: mta, algo: sgd, lr: 0.03, weight_decay: 0.0001, "
                             "nesterov: true, schedule: step, step_size: 1, step_gamma: 0.9}",
                 4);
        for (int64_t s = 0; s < 3; s++) {
            fill_grads(t, 3, s);
            fill_grads(r, 3, s);
            double lr = opt_step(&o, &l.view, s);
            for (int k = 0; k < 3; k++) {
                double wd = flags[k] ? (algo == 0 ? 0.05 : 0.0001) : 0.0;
                if (algo == 0)
                    flt_adamw(r[k].p, r[k].g, r[k].s[0], r[k].s[1], r[k].n, lr, wd, s + 1);
                else
                    flt_sgd(r[k].p, r[k].g, r[k].s[0], r[k].n, lr, wd, s + 1);
                char name[64];
                snprintf(name, sizeof name, "%s step %lld tensor %d", algo ? "sgd" : "adamw",
                         (long long)s, k);
                if (!same_bits(name, t[k].p, r[k].p, r[k].n)) fail();
                if (!same_bits(name, t[k].s[0], r[k].s[0], r[k].n)) fail();
            }
        }
        opt_close(&o);
        for (int k = 0; k < 3; k++) {
            tensor_free(&t[k]);
            tensor_free(&r[k]);
        }
    }
}

/* The reductions add per-chunk partials in chunk order, so the thread count
 * changes nothing: this process runs itself with OMP_NUM_THREADS = 1, 2, 3
 * and compares digests of the results (LAMB and AdamW, clipping on, three
 * tensors over several chunks). */
static uint64_t digest_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int print_digest(void) {
    static const char *const optims[] = {
        "{plugin: mta, algo: lamb, lr: 0.01, weight_decay: 0.1, clip_grad_norm: 50.0}",
        "{plugin: mta, algo: adamw, lr: 0.01, clip_grad_norm: 50.0}",
    };
    static const int64_t sizes[] = {150001, 3, 70000};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t c = 0; c < sizeof optims / sizeof optims[0]; c++) {
        tensor t[3];
        for (int k = 0; k < 3; k++) {
            tensor_init(&t[k], sizes[k], k == 1 ? 0 : VH_PARAM_FLAG_DECAY, NULL);
            for (int64_t i = 0; i < sizes[k]; i++) t[k].p[i] = grad_value(3, k, i);
        }
        slice_list l;
        list_init(&l, 0);
        list_add(&l, &t[0], 0, 0, 0, 100000);
        list_add(&l, &t[1], 0, 1, 0, 3);
        list_add(&l, &t[2], 1, 0, 0, 70000);
        list_add(&l, &t[0], 0, 0, 100000, 50001);
        opt o;
        opt_open(&o, optims[c], 10);
        for (int64_t s = 0; s < 2; s++) {
            fill_grads(t, 3, s);
            opt_step(&o, &l.view, s);
        }
        opt_close(&o);
        for (int k = 0; k < 3; k++) {
            h = digest_bytes(h, t[k].p, (size_t)t[k].n * sizeof(float));
            h = digest_bytes(h, t[k].s[0], (size_t)t[k].n * sizeof(float));
            h = digest_bytes(h, t[k].s[1], (size_t)t[k].n * sizeof(float));
            tensor_free(&t[k]);
        }
    }
    printf("%016llx\n", (unsigned long long)h);
    return 0;
}

static void test_thread_count_changes_nothing(void **state) {
    (void)state;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(len > 0);
    exe[len] = '\0';
    char first[64] = "";
    for (int threads = 1; threads <= 3; threads++) {
        char cmd[4200], line[64] = "";
        snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d '%s' --digest", threads, exe);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        if (!fgets(line, sizeof line, p)) line[0] = '\0';
        int rc = pclose(p);
        if (rc != 0 || strlen(line) != 17) fail_msg("%s: exit %d, output '%s'", cmd, rc, line);
        if (threads == 1)
            memcpy(first, line, sizeof first);
        else if (strcmp(first, line) != 0)
            fail_msg("%d threads give digest %.16s, 1 thread %.16s", threads, line, first);
    }
}

/* ---- scalar state ------------------------------------------------------------ */

#define RESUME_STEPS 6

/* Runs steps [from, to) on fresh tensors or given ones. */
static void run_steps(opt *o, tensor *t, int64_t from, int64_t to) {
    slice_list l;
    list_init(&l, 0);
    list_add(&l, &t[0], 0, 0, 0, 3);
    list_add(&l, &t[1], 0, 1, 0, 4);
    list_add(&l, &t[0], 0, 0, 3, 2);
    for (int64_t s = from; s < to; s++) {
        fill_grads(t, 2, s);
        opt_step(o, &l.view, s);
    }
}

static void make_tensors(tensor *t) {
    tensor_init(&t[0], 5, VH_PARAM_FLAG_DECAY, NULL);
    tensor_init(&t[1], 4, 0, NULL);
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < t[k].n; i++) t[k].p[i] = grad_value(7, k, i);
}

static int tensors_equal(const tensor *a, const tensor *b, int slots) {
    for (int k = 0; k < 2; k++) {
        if (memcmp(a[k].p, b[k].p, (size_t)a[k].n * sizeof(float)) != 0) return 0;
        for (int s = 0; s < slots; s++)
            if (memcmp(a[k].s[s], b[k].s[s], (size_t)a[k].n * sizeof(float)) != 0) return 0;
    }
    return 1;
}

static void check_resume(const char *optim) {
    const int64_t half = RESUME_STEPS / 2;
    /* uninterrupted */
    tensor a[2];
    make_tensors(a);
    opt o;
    opt_open(&o, optim, RESUME_STEPS);
    const int slots = o.vt->state_slots(o.self);
    run_steps(&o, a, 0, RESUME_STEPS);
    opt_close(&o);

    /* half, save (scalar state + a copy of the tensors), a new instance resumes */
    tensor b[2], c[2], d[2];
    make_tensors(b);
    make_tensors(c);
    make_tensors(d);
    opt_open(&o, optim, RESUME_STEPS);
    run_steps(&o, b, 0, half);
    size_t bytes = 0;
    assert_int_equal(o.vt->state_size(o.self, &bytes), VH_STATUS_OK);
    assert_true(bytes > 0);
    unsigned char *saved = malloc(bytes);
    assert_non_null(saved);
    assert_int_equal(o.vt->state_save(o.self, saved, bytes), VH_STATUS_OK);
    opt_close(&o);
    for (int k = 0; k < 2; k++) tensor_copy(&c[k], &b[k]), tensor_copy(&d[k], &b[k]);

    opt_open(&o, optim, RESUME_STEPS);
    if (o.vt->state_load(o.self, saved, bytes) != VH_STATUS_OK) fail_msg("%s", opt_error(&o));
    run_steps(&o, c, half, RESUME_STEPS);
    opt_close(&o);
    if (!tensors_equal(a, c, slots)) fail_msg("%s: the resumed run differs", optim);

    /* control: the same without state_load is not the same run */
    opt_open(&o, optim, RESUME_STEPS);
    run_steps(&o, d, half, RESUME_STEPS);
    opt_close(&o);
    if (tensors_equal(a, d, slots))
        fail_msg("%s: resuming without the state changed nothing", optim);

    free(saved);
    for (int k = 0; k < 2; k++) {
        tensor_free(&a[k]);
        tensor_free(&b[k]);
        tensor_free(&c[k]);
        tensor_free(&d[k]);
    }
}

static void test_state_round_trip_bit_for_bit(void **state) {
    (void)state;
    check_resume("{plugin: mta, algo: adamw, lr: 0.01, warmup_steps: 2, clip_grad_norm: 1.0}");
    check_resume(
        "{plugin: mta, algo: sgd, lr: 0.05, nesterov: true, schedule: step, step_size: 2}");
    check_resume("{plugin: mta, algo: lamb, lr: 0.01, clip_grad_norm: 2.0, min_lr: 0.001}");
}

static void test_state_load_refuses_foreign_state(void **state) {
    (void)state;
    opt a, b;
    opt_open(&a, "{plugin: mta, algo: adamw}", 10);
    opt_open(&b, "{plugin: mta, algo: sgd}", 10);
    size_t bytes = 0;
    assert_int_equal(a.vt->state_size(a.self, &bytes), VH_STATUS_OK);
    unsigned char buf[256];
    assert_true(bytes <= sizeof buf);
    assert_int_equal(a.vt->state_save(a.self, buf, bytes), VH_STATUS_OK);
    /* too small a buffer to save into */
    assert_int_equal(a.vt->state_save(a.self, buf, bytes - 1), VH_STATUS_ERR_INVALID_ARG);
    /* another algorithm's state */
    assert_int_equal(b.vt->state_load(b.self, buf, bytes), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(opt_error(&b), "adamw"));
    /* wrong size, damaged magic */
    assert_int_equal(a.vt->state_load(a.self, buf, bytes - 1), VH_STATUS_ERR_FORMAT);
    buf[0] ^= 0xff;
    assert_int_equal(a.vt->state_load(a.self, buf, bytes), VH_STATUS_ERR_FORMAT);
    opt_close(&a);
    opt_close(&b);
}

/* A step the host skipped (overflow) moves the schedule, not the bias
 * correction: steps 0, 1, 3 are updates 1, 2, 3 with lr(0), lr(1), lr(3). */
static void test_skipped_step_keeps_bias_correction(void **state) {
    (void)state;
    static const int64_t host_steps[] = {0, 1, 3};
    tensor t[1];
    tensor_init(&t[0], 3, VH_PARAM_FLAG_DECAY, NULL);
    for (int i = 0; i < 3; i++) t[0].p[i] = 1.0f + (float)i;
    ref_tensor r[1];
    ref_init(&r[0], &t[0]);
    ref_cfg c = {.algo = REF_ADAMW, .wd = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    slice_list l;
    list_init(&l, 0);
    list_add(&l, &t[0], 0, 0, 0, 3);
    opt o;
    opt_open(&o, "{plugin: mta, lr: 0.1, weight_decay: 0.1, warmup_steps: 4}", 10);
    for (int u = 0; u < 3; u++) {
        fill_grads(t, 1, u);
        double lr = opt_step(&o, &l.view, host_steps[u]);
        assert_lr(lr, 0.1 * (double)host_steps[u] / 4);
        ref_step(&c, r, t, 1, u + 1, lr);
        assert_true(close_to("after a skipped step", t[0].p, r[0].p, 3, TOL_HAND));
    }
    opt_close(&o);
    tensor_free(&t[0]);
    ref_free(&r[0]);
}

/* ---- two ranks: per-tensor norms and the global norm over the communicator ---
 * Two threads stand for two ranks; a fake communicator adds their buffers. */

typedef struct fake_world {
    pthread_barrier_t barrier;
    void *buf[2];
    size_t count[2];
    vh_dtype dtype[2];
    vh_reduce_op op[2];
    int calls[2];
    int mismatch;
} fake_world;

/* Blocking inside start (both ranks meet at the barrier), so the request it
 * returns has always finished; wait and test accept only that token. */
static char fake_done_token;
#define FAKE_DONE ((vh_comm_request *)&fake_done_token)

static vh_status fake_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    *req = NULL;
    fake_world *w = c->impl;
    const int r = c->rank;
    w->calls[r]++;
    w->buf[r] = buf, w->count[r] = count, w->dtype[r] = dtype, w->op[r] = op;
    pthread_barrier_wait(&w->barrier);
    const int ok = w->count[0] == w->count[1] && w->dtype[0] == w->dtype[1] &&
                   w->op[0] == w->op[1] && (dtype == VH_DTYPE_F64 || dtype == VH_DTYPE_I64);
    void *out = malloc(count * 8 + 8);
    if (ok && out) {
        for (size_t i = 0; i < count; i++) {
            if (dtype == VH_DTYPE_F64) {
                const double a = ((double *)w->buf[0])[i], b = ((double *)w->buf[1])[i];
                ((double *)out)[i] = op == VH_REDUCE_OP_SUM   ? a + b
                                     : op == VH_REDUCE_OP_MAX ? fmax(a, b)
                                                              : fmin(a, b);
            } else {
                const int64_t a = ((int64_t *)w->buf[0])[i], b = ((int64_t *)w->buf[1])[i];
                ((int64_t *)out)[i] = op == VH_REDUCE_OP_SUM   ? a + b
                                      : op == VH_REDUCE_OP_MAX ? (a > b ? a : b)
                                                               : (a < b ? a : b);
            }
        }
    }
    pthread_barrier_wait(&w->barrier);
    if (!ok || !out) {
        w->mismatch = 1;
        free(out);
        return VH_STATUS_ERR_COMM;
    }
    memcpy(buf, out, count * 8);
    free(out);
    *req = FAKE_DONE;
    return VH_STATUS_OK;
}

static vh_status fake_wait(vh_comm *c, vh_comm_request *req) {
    (void)c;
    return req == NULL || req == FAKE_DONE ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}
static vh_status fake_test(vh_comm *c, vh_comm_request *req, int *done) {
    (void)c;
    if (req != FAKE_DONE || !done) return VH_STATUS_ERR_INVALID_ARG;
    *done = 1;
    return VH_STATUS_OK;
}

static vh_status fake_unsupported(void) { return VH_STATUS_ERR_UNSUPPORTED; }
static vh_status fake_reduce_scatter(vh_comm *c, const void *s, void *r, size_t n, vh_dtype d,
                                     vh_reduce_op op, vh_stream *st, vh_comm_request **req) {
    (void)c, (void)s, (void)r, (void)n, (void)d, (void)op, (void)st, (void)req;
    return fake_unsupported();
}
static vh_status fake_all_gather(vh_comm *c, const void *s, void *r, size_t n, vh_dtype d,
                                 vh_stream *st, vh_comm_request **req) {
    (void)c, (void)s, (void)r, (void)n, (void)d, (void)st, (void)req;
    return fake_unsupported();
}
static vh_status fake_broadcast(vh_comm *c, void *b, size_t n, vh_dtype d, int32_t root,
                                vh_stream *st, vh_comm_request **req) {
    (void)c, (void)b, (void)n, (void)d, (void)root, (void)st, (void)req;
    return fake_unsupported();
}
static vh_status fake_barrier(vh_comm *c) {
    pthread_barrier_wait(&((fake_world *)c->impl)->barrier);
    return VH_STATUS_OK;
}

static const vh_comm_ops fake_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce_start = fake_all_reduce,
    .reduce_scatter_start = fake_reduce_scatter,
    .all_gather_start = fake_all_gather,
    .broadcast_start = fake_broadcast,
    .wait = fake_wait,
    .test = fake_test,
    .barrier = fake_barrier,
};

#define RANK_STEPS 3

typedef struct rank_job {
    opt *o;
    const vh_param_slices *slices;
    const tensor *t; /* the shared tensors, to know a slice's tensor */
    int ntensors;
    int calls_after[RANK_STEPS];
    int *calls;
    vh_status status;
} rank_job;

/* A rank writes the gradient of its own slices only, with the values
 * fill_grads gives the whole tensor. */
static void fill_own_grads(const rank_job *j, int64_t step) {
    for (int32_t s = 0; s < j->slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(j->slices, s);
        for (int k = 0; k < j->ntensors; k++)
            if ((float *)sl->master == j->t[k].p + sl->offset)
                for (int64_t i = 0; i < sl->count; i++)
                    ((float *)sl->grad)[i] = grad_value(step, k, sl->offset + i);
    }
}

static void *rank_main(void *arg) {
    rank_job *j = arg;
    for (int64_t s = 0; s < RANK_STEPS && j->status == VH_STATUS_OK; s++) {
        fill_own_grads(j, s);
        double lr;
        j->status = opt_update(j->o, j->slices, s, &lr);
        j->calls_after[s] = *j->calls;
    }
    return NULL;
}

/* The two-rank tensors' table: unit 0 holds X and Y, unit 1 Z, unit 2 a
 * parameter no slice has and W. Only the counts matter for the numbering. */
static const vh_param_desc two_params[2];
static const vh_unit_desc two_units[3] = {
    {"u0", two_params, 2, 0}, {"u1", two_params, 1, 0}, {"u2", two_params, 2, 0}};
static const vh_param_table two_table = {two_units, 3, 0};

static const int64_t two_sizes[] = {12, 5, 4, 3};
static const uint32_t two_flags[] = {VH_PARAM_FLAG_DECAY, 0, VH_PARAM_FLAG_DECAY,
                                     VH_PARAM_FLAG_DECAY};

static void two_tensors_init(tensor *t) {
    for (int k = 0; k < 4; k++) {
        tensor_init(&t[k], two_sizes[k], two_flags[k], NULL);
        for (int64_t i = 0; i < two_sizes[k]; i++) t[k].p[i] = grad_value(5, k, i);
    }
}

/* Two ranks (threads over a fake world) update `two`, each its own slices,
 * mta created with `table` (NULL: none); calls[r][s]: the collectives rank r
 * made by the end of step s. */
/* Rank 0: X[0, 7) and Y; rank 1: X[7, 12), Z and W (a list of wide items). */
static void two_rank_lists(slice_list mine[2], tensor *two) {
    list_init(&mine[0], 0);
    list_init(&mine[1], 1);
    list_add(&mine[0], &two[0], 0, 0, 0, 7);
    list_add(&mine[0], &two[1], 0, 1, 0, 5);
    list_add(&mine[1], &two[0], 0, 0, 7, 5);
    list_add(&mine[1], &two[2], 1, 0, 0, 4);
    list_add(&mine[1], &two[3], 2, 1, 0, 3);
}

/* A world of two fake ranks over the runs of `o` (calls counted in w). */
static void join_world(opt *o, fake_world *w, int rank) {
    o->run.comm.ops = &fake_ops;
    o->run.comm.impl = w;
    o->run.comm.rank = rank;
    o->run.comm.world_size = 2;
    o->run.comm.backend = "fake";
}

static void run_two_ranks(const char *optim, const vh_param_table *table, tensor *two,
                          int calls[2][RANK_STEPS]) {
    slice_list mine[2];
    two_rank_lists(mine, two);
    fake_world world;
    memset(&world, 0, sizeof world);
    pthread_barrier_init(&world.barrier, NULL, 2);
    opt ranks[2];
    rank_job jobs[2];
    pthread_t threads[2];
    const vh_optim_setup setup = {.struct_size = sizeof setup, .total_steps = 10, .table = table};
    for (int r = 0; r < 2; r++) {
        if (opt_try_open_with(&ranks[r], optim, 10, &setup) != VH_STATUS_OK)
            fail_msg("create: %s", opt_error(&ranks[r]));
        join_world(&ranks[r], &world, r);
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r] = (rank_job){.o = &ranks[r], .slices = &mine[r].view, .t = two, .ntensors = 4,
                             .calls = &world.calls[r]};
    }
    for (int r = 0; r < 2; r++) pthread_create(&threads[r], NULL, rank_main, &jobs[r]);
    for (int r = 0; r < 2; r++) pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&world.barrier);
    for (int r = 0; r < 2; r++) {
        if (jobs[r].status != VH_STATUS_OK) fail_msg("rank %d: %s", r, opt_error(&ranks[r]));
        opt_close(&ranks[r]);
        memcpy(calls[r], jobs[r].calls_after, sizeof jobs[r].calls_after);
    }
    assert_false(world.mismatch);
}

/* Tensors X (12, decay) split 7 | 5 over ranks 0 | 1, Y (5, no decay) on rank 0
 * only, Z (4, decay) and W (3, decay, unit 2 param 1) on rank 1 only. LAMB and
 * clipping on two ranks give what one rank holding every slice gives, the
 * tensors numbered by agreement (no table) or by the parameter table. */
static void test_two_ranks_agree_with_one(void **state) {
    (void)state;
    const char *optim = "{plugin: mta, algo: lamb, lr: 0.01, weight_decay: 0.1, "
                        "clip_grad_norm: 0.5, schedule: constant}";
    /* one rank: every slice */
    tensor one[4];
    two_tensors_init(one);
    slice_list all;
    list_init(&all, 0);
    list_add(&all, &one[0], 0, 0, 0, 7);
    list_add(&all, &one[1], 0, 1, 0, 5);
    list_add(&all, &one[0], 0, 0, 7, 5);
    list_add(&all, &one[2], 1, 0, 0, 4);
    list_add(&all, &one[3], 2, 1, 0, 3);
    opt o;
    opt_open(&o, optim, 10);
    for (int64_t s = 0; s < RANK_STEPS; s++) {
        fill_grads(one, 4, s);
        opt_step(&o, &all.view, s);
    }
    opt_close(&o);
    for (int with_table = 0; with_table < 2; with_table++) {
        tensor two[4];
        two_tensors_init(two);
        int calls[2][RANK_STEPS];
        run_two_ranks(optim, with_table ? &two_table : NULL, two, calls);
        /* step 0: the tensor numbering (2 MAX, without a table only), clip
         * norm, tensor norms; then 2 a step */
        for (int r = 0; r < 2; r++)
            for (int s = 0; s < RANK_STEPS; s++)
                assert_int_equal(calls[r][s], (with_table ? 2 : 4) + 2 * s);
        for (int k = 0; k < 4; k++) {
            char name[48];
            snprintf(name, sizeof name, "tensor %d (table: %d)", k, with_table);
            assert_true(close_to_f(name, two[k].p, one[k].p, two_sizes[k], 1e-6));
            tensor_free(&two[k]);
        }
    }
    for (int k = 0; k < 4; k++) tensor_free(&one[k]);
}

/* Replicas (DDP: every rank holds every slice, vh_param_slices.replicated):
 * the local sums are the global ones, so LAMB and clipping call no
 * collective on a world of 2 and give what one rank gives. The fake world
 * here has one thread: a collective would find no peer and fail. */
static void test_replicated_slices_need_no_collective(void **state) {
    (void)state;
    const char *optim = "{plugin: mta, algo: lamb, lr: 0.01, weight_decay: 0.1, "
                        "clip_grad_norm: 0.5, schedule: constant}";
    static const int64_t sizes[] = {12, 5};
    static const uint32_t flags[] = {VH_PARAM_FLAG_DECAY, 0};
    tensor one[2], rep[2];
    slice_list l1, l2;
    list_init(&l1, 0);
    list_init(&l2, 0);
    for (int k = 0; k < 2; k++) {
        tensor_init(&one[k], sizes[k], flags[k], NULL);
        tensor_init(&rep[k], sizes[k], flags[k], NULL);
        for (int64_t i = 0; i < sizes[k]; i++) one[k].p[i] = rep[k].p[i] = grad_value(5, k, i);
        list_add(&l1, &one[k], 0, k, 0, sizes[k]);
        list_add(&l2, &rep[k], 0, k, 0, sizes[k]);
    }
    l2.view.replicated = 1;
    opt o, r;
    opt_open(&o, optim, 10);
    opt_open(&r, optim, 10);
    fake_world world;
    memset(&world, 0, sizeof world);
    pthread_barrier_init(&world.barrier, NULL, 1);
    r.run.comm.ops = &fake_ops;
    r.run.comm.impl = &world;
    r.run.comm.rank = 0;
    r.run.comm.world_size = 2;
    r.run.comm.backend = "fake";
    for (int64_t s = 0; s < RANK_STEPS; s++) {
        fill_grads(one, 2, s);
        fill_grads(rep, 2, s);
        opt_step(&o, &l1.view, s);
        opt_step(&r, &l2.view, s);
    }
    pthread_barrier_destroy(&world.barrier);
    assert_int_equal(world.calls[0], 0);
    assert_false(world.mismatch);
    for (int k = 0; k < 2; k++) {
        assert_memory_equal(rep[k].p, one[k].p, (size_t)sizes[k] * sizeof(float));
        tensor_free(&one[k]);
        tensor_free(&rep[k]);
    }
    opt_close(&o);
    opt_close(&r);
}

/* ---- the SDK's sums over slices (vh_optim_schedule.h) ------------------------------ */

typedef struct sums_job {
    opt *o;
    const vh_param_slices *slices;
    double per_param[5], total;
    vh_status status;
} sums_job;

static void *sums_main(void *arg) {
    sums_job *j = arg;
    j->status = vh_slices_sum_sq_per_param(j->o->host, j->slices, &two_table,
                                           VH_SLICE_BUFFER_GRAD, j->per_param);
    if (j->status == VH_STATUS_OK)
        j->status = vh_slices_sum_sq(j->o->host, j->slices, VH_SLICE_BUFFER_MASTER, &j->total);
    return NULL;
}

/* Per-parameter sums of squares over two ranks that hold different slices
 * (FSDP) are the whole tensors' sums on both ranks, in one collective per
 * call; the table numbers the parameters the same on every rank. */
static void test_sdk_slice_sums(void **state) {
    (void)state;
    assert_int_equal(vh_param_table_tensors(&two_table), 5);
    assert_int_equal(vh_param_table_index(&two_table, 0, 1), 1);
    assert_int_equal(vh_param_table_index(&two_table, 2, 1), 4);
    assert_int_equal(vh_param_table_index(&two_table, 1, 1), -1);
    assert_int_equal(vh_param_table_index(&two_table, 3, 0), -1);
    tensor t[4];
    two_tensors_init(t);
    fill_grads(t, 4, 7);
    static const int param_of[4] = {0, 1, 2, 4};
    double want[5] = {0}, want_total = 0.0;
    for (int k = 0; k < 4; k++)
        for (int64_t i = 0; i < t[k].n; i++) {
            want[param_of[k]] += (double)t[k].g[i] * t[k].g[i];
            want_total += (double)t[k].p[i] * t[k].p[i];
        }
    slice_list mine[2];
    two_rank_lists(mine, t);
    fake_world world;
    memset(&world, 0, sizeof world);
    pthread_barrier_init(&world.barrier, NULL, 2);
    opt ranks[2];
    sums_job jobs[2];
    pthread_t threads[2];
    for (int r = 0; r < 2; r++) {
        opt_open(&ranks[r], "{plugin: mta}", 10);
        join_world(&ranks[r], &world, r);
        jobs[r] = (sums_job){.o = &ranks[r], .slices = &mine[r].view};
    }
    for (int r = 0; r < 2; r++) pthread_create(&threads[r], NULL, sums_main, &jobs[r]);
    for (int r = 0; r < 2; r++) pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&world.barrier);
    for (int r = 0; r < 2; r++) {
        if (jobs[r].status != VH_STATUS_OK) fail_msg("rank %d: %s", r, opt_error(&ranks[r]));
        assert_int_equal(world.calls[r], 2);
        for (int k = 0; k < 5; k++)
            assert_true(fabs(jobs[r].per_param[k] - want[k]) <= 1e-12 * want[k]);
        assert_true(fabs(jobs[r].total - want_total) <= 1e-12 * want_total);
        opt_close(&ranks[r]);
    }
    assert_false(world.mismatch);
    for (int k = 0; k < 4; k++) tensor_free(&t[k]);
}

/* Replicated slices (DDP) sum locally, with no collective; 16-bit buffers
 * are read as their values; other dtypes and slices outside the table are
 * refused by name. */
static void test_sdk_slice_sums_local(void **state) {
    (void)state;
    opt o;
    opt_open(&o, "{plugin: mta}", 10);
    fake_world world;
    memset(&world, 0, sizeof world);
    pthread_barrier_init(&world.barrier, NULL, 1); /* no peer: a collective would fail */
    join_world(&o, &world, 0);
    uint16_t h[3] = {vh_f32_to_f16(1.0f), vh_f32_to_f16(-2.0f), vh_f32_to_f16(0.5f)};
    float m[3] = {3, 0, 4};
    vh_param_slice sl = {.unit = 1, .count = 3, .master = m, .grad = h,
                         .grad_dtype = VH_DTYPE_F16};
    vh_param_slices l = {.items = &sl, .count = 1, .item_size = sizeof sl, .replicated = 1};
    double sum = 0.0, per[5];
    assert_int_equal(vh_slices_sum_sq(o.host, &l, VH_SLICE_BUFFER_GRAD, &sum), VH_STATUS_OK);
    assert_true(sum == 5.25);
    assert_int_equal(vh_slices_sum_sq_per_param(o.host, &l, &two_table, VH_SLICE_BUFFER_MASTER,
                                                 per),
                     VH_STATUS_OK);
    assert_true(per[2] == 25.0 && per[0] == 0.0 && per[4] == 0.0);
    double two[2] = {1.0, 2.0};
    assert_int_equal(vh_slices_reduce_sums(o.host, &l, two, 2), VH_STATUS_OK);
    assert_true(two[0] == 1.0 && two[1] == 2.0);
    assert_int_equal(world.calls[0], 0);
    sl.grad_dtype = VH_DTYPE_I32;
    assert_int_equal(vh_slices_sum_sq(o.host, &l, VH_SLICE_BUFFER_GRAD, &sum),
                     VH_STATUS_ERR_UNSUPPORTED);
    assert_non_null(strstr(opt_error(&o), "i32"));
    sl.param = 1; /* unit 1 has one parameter */
    assert_int_equal(vh_slices_sum_sq_per_param(o.host, &l, &two_table, VH_SLICE_BUFFER_MASTER,
                                                 per),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_non_null(strstr(opt_error(&o), "not in the parameter table"));
    pthread_barrier_destroy(&world.barrier);
    opt_close(&o);
}

/* ---- bad input ------------------------------------------------------------------ */

static void test_bad_configs(void **state) {
    (void)state;
    /* what create checks (the plugin; min_lr and step_gamma: the SDK's
     * schedule, read as the host reads it): config_fail naming the key */
    static const struct {
        const char *optim, *expect;
    } at_create[] = {
        {"{plugin: mta, algo: sgd, momentum: 0, nesterov: true}", "optim.nesterov"},
        {"{plugin: mta, beta1: 1.0}", "optim.beta1"},
        {"{plugin: mta, algo: lamb, beta2: 1}", "optim.beta2"},
        {"{plugin: mta, eps: 0}", "optim.eps"},
        {"{plugin: mta, algo: sgd, momentum: 1.0}", "optim.momentum"},
        {"{plugin: mta, lr: 0.001, min_lr: 0.01}", "optim.min_lr"},
        {"{plugin: mta, schedule: step, step_gamma: 0}", "optim.step_gamma"},
    };
    for (size_t i = 0; i < sizeof at_create / sizeof at_create[0]; i++) {
        opt o;
        vh_status st = opt_try_open(&o, at_create[i].optim, 10);
        if (st != VH_STATUS_ERR_CONFIG)
            fail_msg("%s: status %d, expected a config error", at_create[i].optim, (int)st);
        if (!strstr(opt_error(&o), at_create[i].expect) || !strstr(opt_error(&o), "mta.yaml"))
            fail_msg("%s: '%s' lacks '%s'", at_create[i].optim, opt_error(&o),
                     at_create[i].expect);
        assert_null(o.self);
        opt_close(&o);
    }
    /* what the schema refuses before create */
    static const struct {
        const char *optim, *expect;
    } at_open[] = {
        {"{plugin: mta, algo: adam}", "adamw"},
        {"{plugin: mta, lr: -0.1}", "lr"},
        {"{plugin: mta, betas: 0.9}", "betas"},
        {"{plugin: mta, warmup_steps: 1.5}", "warmup_steps"},
        {"{plugin: mta, nesterov: maybe}", "nesterov"},
        {"{plugin: mta, schedule: linear}", "schedule"},
    };
    for (size_t i = 0; i < sizeof at_open / sizeof at_open[0]; i++) {
        vh_run run;
        vh_diag d = {{0}};
        vh_status st = open_run(&run, at_open[i].optim, &d);
        run_close(&run); /* frees what a failed open leaves */
        if (st == VH_STATUS_OK) fail_msg("%s was accepted", at_open[i].optim);
        if (!strstr(d.text, at_open[i].expect))
            fail_msg("%s: '%s' lacks '%s'", at_open[i].optim, d.text, at_open[i].expect);
    }
}

static void test_bad_slices_and_steps(void **state) {
    (void)state;
    tensor t;
    tensor_init(&t, 4, 0, NULL);
    opt o;
    opt_open(&o, "{plugin: mta}", 10);
    double lr;
    slice_list l;
    list_init(&l, 0);
    list_add(&l, &t, 0, 0, 0, 4);
    assert_int_equal(opt_update(&o, &l.view, -1, &lr), VH_STATUS_ERR_INVALID_ARG);
    vh_param_slice *s = vh_param_slices_at(&l.view, 0);
    s->grad = NULL;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_ERR_INVALID_ARG);
    assert_non_null(strstr(opt_error(&o), "gradient"));
    s->grad = t.g;
    s->state[1] = NULL;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_ERR_INVALID_ARG);
    assert_non_null(strstr(opt_error(&o), "state"));
    s->state[1] = t.s[1];
    /* Growth rule: a producer built against ABI 2.0 (items of 2.0's size,
     * smaller than this SDK's sizeof) is accepted; only a list smaller than
     * 2.0's slice is refused. */
    l.view.item_size = (uint32_t)VH_PARAM_SLICE_SIZE_2_0;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_OK);
    l.view.item_size = (uint32_t)VH_PARAM_SLICE_SIZE_2_0 - 4;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_ERR_INVALID_ARG);
    assert_non_null(strstr(opt_error(&o), "smaller than ABI 2.0"));
    l.view.item_size = sizeof(vh_param_slice);
    assert_int_equal(opt_update(&o, NULL, 0, &lr), VH_STATUS_ERR_INVALID_ARG);
    /* dtypes the kernels cannot update (f16/bf16 masters and gradients go
     * through f32 views: tests/test_precision_policies.c) are refused,
     * naming dtype and parameter, before anything is touched */
    s->unit = 3;
    s->param = 1;
    s->master_dtype = VH_DTYPE_I32;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_ERR_UNSUPPORTED);
    assert_non_null(strstr(opt_error(&o), "master values in i32"));
    assert_non_null(strstr(opt_error(&o), "unit 3, param 1"));
    s->master_dtype = VH_DTYPE_F32;
    s->grad_dtype = VH_DTYPE_U8;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_ERR_UNSUPPORTED);
    assert_non_null(strstr(opt_error(&o), "gradient in u8"));
    s->grad_dtype = VH_DTYPE_F32;
    s->state_dtype = VH_DTYPE_BF16;
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_ERR_UNSUPPORTED);
    assert_non_null(strstr(opt_error(&o), "optimizer state in bf16"));
    s->state_dtype = VH_DTYPE_F32;
    /* nothing was updated by the refused calls */
    for (int i = 0; i < 4; i++) assert_true(t.p[i] == 0.0f);
    assert_int_equal(opt_update(&o, &l.view, 0, &lr), VH_STATUS_OK);
    opt_close(&o);
    tensor_free(&t);
}

/* The policy comes with the setup (ABI 2.1): state or masters mta cannot
 * update are refused at create, naming the dtype, not at the first step;
 * 16-bit masters and gradients (full FP16) are taken. */
static void test_policy_refused_at_create(void **state) {
    (void)state;
    static const struct {
        int32_t master, grad, state;
        const char *optim, *expect; /* NULL: accepted */
    } cases[] = {
        {VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_F32, "{plugin: mta}", NULL},
        {VH_DTYPE_F16, VH_DTYPE_F16, VH_DTYPE_F32, "{plugin: mta, algo: lamb}", NULL},
        {VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_BF16, "{plugin: mta}", "optimizer state in bf16"},
        /* sgd without momentum keeps no state: its dtype does not matter */
        {VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_BF16, "{plugin: mta, algo: sgd, momentum: 0}",
         NULL},
        {VH_DTYPE_I32, VH_DTYPE_F32, VH_DTYPE_F32, "{plugin: mta}", "master values in i32"},
        {VH_DTYPE_F32, VH_DTYPE_U8, VH_DTYPE_F32, "{plugin: mta}", "gradients in u8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vh_precision_policy p = {.struct_size = sizeof p, .master_dtype = cases[i].master,
                                 .grad_dtype = cases[i].grad, .state_dtype = cases[i].state,
                                 .param_dtype = cases[i].master, .master_weights = 1};
        vh_optim_setup setup = {.struct_size = sizeof setup, .total_steps = 10, .policy = &p};
        opt o;
        vh_status st = opt_try_open_with(&o, cases[i].optim, 10, &setup);
        if (!cases[i].expect && st != VH_STATUS_OK)
            fail_msg("case %zu refused: %s", i, opt_error(&o));
        if (cases[i].expect) {
            assert_int_equal(st, VH_STATUS_ERR_UNSUPPORTED);
            assert_null(o.self);
            if (!strstr(opt_error(&o), cases[i].expect))
                fail_msg("case %zu: '%s' lacks '%s'", i, opt_error(&o), cases[i].expect);
        }
        opt_close(&o);
    }
}

/* A setup of an older minor (here: only struct_size) reads as total_steps 0:
 * a constant schedule still runs; a missing setup is refused. */
static void test_older_setup_reads_defaults(void **state) {
    (void)state;
    opt o;
    assert_int_equal(opt_try_open(&o, "{plugin: mta, schedule: constant}", 10), VH_STATUS_OK);
    o.vt->destroy(o.self);
    o.self = NULL;
    vh_optim_setup small = {.struct_size = (uint32_t)offsetof(vh_optim_setup, total_steps),
                            .total_steps = -5 /* past its size: never read */};
    assert_int_equal(o.vt->create(o.host, &small, &o.self), VH_STATUS_OK);
    tensor t;
    tensor_init(&t, 4, 0, NULL);
    slice_list l;
    list_init(&l, 0);
    list_add(&l, &t, 0, 0, 0, 4);
    for (int i = 0; i < 4; i++) t.g[i] = 1.0f;
    (void)opt_step(&o, &l.view, 0); /* fails the test on an error */
    o.vt->destroy(o.self);
    o.self = NULL;
    assert_int_equal(o.vt->create(o.host, NULL, &o.self), VH_STATUS_ERR_INVALID_ARG);
    opt_close(&o);
    tensor_free(&t);
}

/* ---- swapping the optimizer: one line ------------------------------------------ */

static vh_status open_with_sets(vh_run *run, const char *optim, const char *const *sets,
                                int num_sets, vh_diag *d) {
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "optim: %s\nmodel: {plugin: test_model}\nprecision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\ndata: {plugin: test_data}\n",
             optim);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_run_options opts = {.out = stdout, .sets = sets, .num_sets = num_sets};
    return run_open_text(run, "mta.yaml", recipe, &opts, d);
}

/* `--set optim.plugin=test_optim` on an mta recipe keeps the shared keys
 * (test_optim is a 2.1 optimizer that declares lr itself: its own lr wins),
 * and refuses an mta key left in the file with the one-line replace. */
static void test_swap_to_another_optimizer(void **state) {
    (void)state;
    const char *const swap[] = {"optim.plugin=test_optim"};
    vh_run run;
    vh_diag d = {{0}};
    assert_int_equal(open_with_sets(&run, "{plugin: mta, lr: 0.05, warmup_steps: 3, beta2: 0.95}",
                                    swap, 1, &d),
                     VH_STATUS_ERR_CONFIG);
    run_close(&run);
    if (!strstr(d.text, "key 'beta2' of section 'optim' was written for plugin 'mta'; plugin "
                        "'test_optim' (--set optim.plugin=test_optim) does not take it") ||
        !strstr(d.text, "--set 'optim={plugin: test_optim, lr: 0.05, warmup_steps: 3}'"))
        fail_msg("%s", d.text);
    const char *const whole[] = {"optim={plugin: test_optim, lr: 0.05, warmup_steps: 3}"};
    for (int k = 0; k < 2; k++) {
        vh_status st = k ? open_with_sets(&run, "{plugin: mta, beta2: 0.95}", whole, 1, &d)
                         : open_with_sets(&run, "{plugin: mta, lr: 0.05, warmup_steps: 3}",
                                          swap, 1, &d);
        if (st != VH_STATUS_OK) fail_msg("%s", d.text);
        const vh_section_config *c = &run.configs[VH_ROLE_OPTIM];
        assert_string_equal(run.plugins[VH_ROLE_OPTIM].desc->name, "test_optim");
        assert_int_equal(config_find(c, "warmup_steps")->as.i, 3);
        assert_true(config_find(c, "lr")->as.f == 0.05);
        assert_string_equal(config_find(c, "lr")->key->default_value, "0.1"); /* its own */
        assert_string_equal(config_find(c, "schedule")->text, "cosine"); /* the SDK's */
        run_close(&run);
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--digest") == 0) return print_digest();
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* tools/tsan.sh: one group only */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_documents_every_key),
        cmocka_unit_test(test_state_slots_per_algo),
        cmocka_unit_test(test_adamw_first_step_by_hand),
        cmocka_unit_test(test_adamw_against_textbook),
        cmocka_unit_test(test_adamw_matches_torch),
        cmocka_unit_test(test_sgd_first_step_by_hand),
        cmocka_unit_test(test_sgd_against_textbook),
        cmocka_unit_test(test_sgd_nesterov_matches_torch),
        cmocka_unit_test(test_sgd_clip_matches_torch),
        cmocka_unit_test(test_lamb_trust_ratio_by_hand),
        cmocka_unit_test(test_lamb_against_textbook),
        cmocka_unit_test(test_schedule_cosine),
        cmocka_unit_test(test_schedule_cosine_ends_at_min_lr),
        cmocka_unit_test(test_schedule_step_and_constant),
        cmocka_unit_test(test_clipping_above_and_below),
        cmocka_unit_test(test_clipping_refuses_nonfinite_norm),
        cmocka_unit_test(test_chunks_bit_for_bit),
        cmocka_unit_test(test_thread_count_changes_nothing),
        cmocka_unit_test(test_state_round_trip_bit_for_bit),
        cmocka_unit_test(test_state_load_refuses_foreign_state),
        cmocka_unit_test(test_skipped_step_keeps_bias_correction),
        cmocka_unit_test(test_two_ranks_agree_with_one),
        cmocka_unit_test(test_replicated_slices_need_no_collective),
        cmocka_unit_test(test_sdk_slice_sums),
        cmocka_unit_test(test_sdk_slice_sums_local),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_bad_slices_and_steps),
        cmocka_unit_test(test_older_setup_reads_defaults),
        cmocka_unit_test(test_policy_refused_at_create),
        cmocka_unit_test(test_swap_to_another_optimizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
