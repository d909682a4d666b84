/* test_freeze.c - mta's `freeze` key (plugins/optim/mta/freeze.h): frozen
 * parameters stay bit-identical over several steps of AdamW, SGD with
 * momentum and LAMB with weight decay and clipping, their state untouched,
 * while the others change exactly as they would without freeze (clipping
 * off); the patterns (units, names, dotted prefixes, globs); a pattern that
 * matches nothing is refused naming it and listing the units. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "runtime.h"
#include "vithost/vh_optim_schedule.h"

static const vh_precision_policy fp32_policy = {
    .struct_size = sizeof(vh_precision_policy), .param_dtype = VH_DTYPE_F32,
    .compute_dtype = VH_DTYPE_F32, .grad_dtype = VH_DTYPE_F32, .comm_dtype = VH_DTYPE_F32,
    .master_dtype = VH_DTYPE_F32, .state_dtype = VH_DTYPE_F32, .master_weights = 1};

/* A run of vit (depth 2) and mta with `optim`; the model gives the table. */
typedef struct fz_run {
    vh_run run;
    const vh_model_vtable *mvt;
    void *model;
    const vh_param_table *table;
} fz_run;

static void fz_open(fz_run *r, const char *optim) {
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "model: {plugin: vit, dim: 16, depth: 2, heads: 2, mlp_dim: 32, patch_size: 4}\n"
             "optim: %s\nprecision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\ndata: {plugin: test_data}\n",
             optim);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    memset(r, 0, sizeof *r);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    if (run_open_text(&r->run, "freeze.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    r->mvt = r->run.plugins[VH_ROLE_MODEL].desc->vtable;
    vh_model_setup setup = {.struct_size = sizeof setup, .channels = 1, .height = 8,
                            .width = 8, .num_classes = 10, .max_batch = 2,
                            .policy = &fp32_policy};
    if (r->mvt->create(&r->run.hosts[VH_ROLE_MODEL].pub, &setup, &r->model) != VH_STATUS_OK)
        fail_msg("vit: %s", r->run.hosts[VH_ROLE_MODEL].error);
    r->table = r->mvt->param_table(r->model);
}

static void fz_close(fz_run *r) {
    if (r->model) r->mvt->destroy(r->model);
    run_close(&r->run);
}

enum { MAXP = 64 };

/* Every parameter's values and state after `steps` updates from fixed values
 * and gradients (each tensor one slice, decay where the table says). */
typedef struct fz_result {
    int n;                      /* parameters */
    int64_t numel[MAXP];
    char names[MAXP][64];
    float *values, *state;      /* all parameters back to back; state: 2 slots */
    float *start;
} fz_result;

static void fz_steps(const char *optim, int steps, fz_result *out) {
    fz_run r;
    fz_open(&r, optim);
    vh_host *host = &r.run.hosts[VH_ROLE_OPTIM].pub;
    const vh_optim_vtable *vt = r.run.plugins[VH_ROLE_OPTIM].desc->vtable;
    vh_optim_schedule sched = {.struct_size = sizeof sched};
    assert_int_equal(vh_optim_schedule_read(host, 10, &sched), VH_STATUS_OK);
    vh_optim_setup setup = {.struct_size = sizeof setup, .total_steps = 10, .table = r.table};
    void *self = NULL;
    if (vt->create(host, &setup, &self) != VH_STATUS_OK)
        fail_msg("mta: %s", r.run.hosts[VH_ROLE_OPTIM].error);
    memset(out, 0, sizeof *out);
    int64_t total = 0;
    vh_param_slice items[MAXP];
    memset(items, 0, sizeof items);
    for (int32_t u = 0; u < r.table->num_units; u++)
        for (int32_t p = 0; p < r.table->units[u].num_params; p++, out->n++) {
            assert_true(out->n < MAXP);
            const vh_param_desc *d = &r.table->units[u].params[p];
            snprintf(out->names[out->n], sizeof out->names[0], "%s", d->name);
            out->numel[out->n] = d->numel;
            items[out->n] = (vh_param_slice){.unit = u, .param = p, .count = d->numel,
                                             .flags = d->flags};
            total += d->numel;
        }
    out->values = calloc((size_t)total, sizeof(float));
    out->start = calloc((size_t)total, sizeof(float));
    out->state = calloc((size_t)total * 2, sizeof(float));
    float *grad = calloc((size_t)total, sizeof(float));
    for (int64_t k = 0; k < total; k++) {
        out->start[k] = out->values[k] = (float)sin(0.37 * (double)k) * 0.5f;
        grad[k] = (float)cos(0.11 * (double)k) * 0.1f;
    }
    int64_t at = 0;
    for (int i = 0; i < out->n; i++) {
        items[i].master = out->values + at, items[i].grad = grad + at;
        items[i].state[0] = out->state + at, items[i].state[1] = out->state + total + at;
        at += out->numel[i];
    }
    vh_param_slices slices = {.items = items, .count = out->n, .item_size = sizeof items[0],
                              .replicated = 1};
    for (int s = 0; s < steps; s++) {
        vh_optim_step_args a = {.struct_size = sizeof a, .slices = &slices, .step = s};
        vh_optim_schedule_args(&sched, s, &a);
        if (vt->update(self, &a, NULL) != VH_STATUS_OK)
            fail_msg("update: %s", r.run.hosts[VH_ROLE_OPTIM].error);
    }
    vt->destroy(self);
    free(grad);
    fz_close(&r);
}

static void fz_free(fz_result *f) {
    free(f->values), free(f->state), free(f->start);
}

/* Whether `name` is one of the frozen ones of the cases below. */
static int want_frozen(const char *set, const char *name) {
    if (strcmp(set, "patch_embed,blocks.0") == 0)
        return strncmp(name, "patch_embed.", 12) == 0 || strncmp(name, "blocks.0.", 9) == 0;
    if (strcmp(set, "embed, head") == 0) /* units: the stem and norm + head */
        return strncmp(name, "blocks.", 7) != 0;
    if (strcmp(set, "blocks.*.norm?.*,cls_token") == 0)
        return strstr(name, ".norm1.") || strstr(name, ".norm2.") ||
               strcmp(name, "cls_token") == 0;
    return -1;
}

static void check_freeze(const char *algo, const char *set, const char *extra) {
    char frozen_yaml[512], plain_yaml[512];
    snprintf(plain_yaml, sizeof plain_yaml,
             "{plugin: mta, algo: %s, lr: 0.01, weight_decay: 0.05, schedule: constant%s}", algo,
             extra);
    snprintf(frozen_yaml, sizeof frozen_yaml,
             "{plugin: mta, algo: %s, lr: 0.01, weight_decay: 0.05, schedule: constant%s, "
             "freeze: \"%s\"}",
             algo, extra, set);
    fz_result f, p;
    fz_steps(frozen_yaml, 3, &f);
    fz_steps(plain_yaml, 3, &p);
    const int clipping = strstr(extra, "clip") != NULL;
    int64_t at = 0, total = 0;
    for (int i = 0; i < f.n; i++) total += f.numel[i];
    int frozen = 0;
    for (int i = 0; i < f.n; i++) {
        const size_t bytes = (size_t)f.numel[i] * sizeof(float);
        const int want = want_frozen(set, f.names[i]);
        assert_true(want >= 0);
        if (want) { /* bit-identical, and its state never written */
            frozen++;
            if (memcmp(f.values + at, f.start + at, bytes) != 0)
                fail_msg("%s, freeze '%s': %s changed", algo, set, f.names[i]);
            for (int64_t k = 0; k < f.numel[i]; k++)
                assert_true(f.state[at + k] == 0.0f && f.state[total + at + k] == 0.0f);
        } else {
            if (memcmp(f.values + at, f.start + at, bytes) == 0)
                fail_msg("%s, freeze '%s': %s did not change", algo, set, f.names[i]);
            /* without clipping (and LAMB's per-tensor ratio) the rest is as without freeze */
            if (!clipping && memcmp(f.values + at, p.values + at, bytes) != 0)
                fail_msg("%s, freeze '%s': %s differs from the run without freeze", algo, set,
                         f.names[i]);
        }
        at += f.numel[i];
    }
    assert_true(frozen > 0 && frozen < f.n);
    fz_free(&f);
    fz_free(&p);
}

static void test_frozen_stay(void **state) {
    (void)state;
    static const char *const algos[] = {"adamw", "sgd", "lamb"};
    static const char *const sets[] = {"patch_embed,blocks.0", "embed, head",
                                       "blocks.*.norm?.*,cls_token"};
    for (int a = 0; a < 3; a++)
        for (int s = 0; s < 3; s++) {
            check_freeze(algos[a], sets[s], "");
            check_freeze(algos[a], sets[s], ", clip_grad_norm: 0.05");
        }
}

/* A pattern that matches nothing, or an empty one, is refused at create. */
static void test_bad_pattern(void **state) {
    (void)state;
    static const struct {
        const char *freeze, *expect;
    } cases[] = {
        {"blocks.7", "'blocks.7' matches no parameter; the model's units are embed, blocks.0, "
                     "blocks.1, head"},
        {"patch_embed,blocks.0.at", "'blocks.0.at' matches no parameter"},
        {"blocks.[5-9]", "'blocks.[5-9]' matches no parameter"},
        {"head,,embed", "an empty pattern"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char optim[256];
        snprintf(optim, sizeof optim, "{plugin: mta, freeze: \"%s\"}", cases[i].freeze);
        fz_run r;
        fz_open(&r, optim);
        vh_host *host = &r.run.hosts[VH_ROLE_OPTIM].pub;
        const vh_optim_vtable *vt = r.run.plugins[VH_ROLE_OPTIM].desc->vtable;
        vh_optim_setup setup = {.struct_size = sizeof setup, .total_steps = 10,
                                .table = r.table};
        void *self = NULL;
        assert_int_equal(vt->create(host, &setup, &self), VH_STATUS_ERR_CONFIG);
        const char *err = r.run.hosts[VH_ROLE_OPTIM].error;
        printf("freeze: \"%s\" -> %s\n", cases[i].freeze, err);
        if (!strstr(err, cases[i].expect) || !strstr(err, "freeze"))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].expect);
        fz_close(&r);
    }
    /* no parameter table: refused too */
    fz_run r;
    fz_open(&r, "{plugin: mta, freeze: head}");
    vh_optim_setup setup = {.struct_size = sizeof setup, .total_steps = 10};
    void *self = NULL;
    const vh_optim_vtable *vt = r.run.plugins[VH_ROLE_OPTIM].desc->vtable;
    assert_int_equal(vt->create(&r.run.hosts[VH_ROLE_OPTIM].pub, &setup, &self),
                     VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(r.run.hosts[VH_ROLE_OPTIM].error, "parameter table"));
    fz_close(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frozen_stay),
        cmocka_unit_test(test_bad_pattern),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
