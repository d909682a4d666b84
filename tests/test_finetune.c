/* test_finetune.c - the fine-tuning knobs: layer-wise rate decay (mta's
 * `layer_decay`) against timm's rule, position embeddings resized against
 * PyTorch's bicubic interpolation (the vit plugin's `pretrained` loading),
 * and a run started from a checkpoint of another image size and class count.
 *
 * References (tests/reference/, committed results in tests/fixtures/):
 *   - make_layer_decay_fixture.py: timm's param_groups_layer_decay on
 *     timm's VisionTransformer, the scale of every parameter by name;
 *   - make_pos_embed_fixture.py: F.interpolate(mode='bicubic',
 *     align_corners=False) of random position embeddings.
 * The scales are read from what mta does, not from a debug accessor: one
 * AdamW step from p = 0 with g = 1 and no weight decay moves every parameter
 * by -lr_i / (1 + eps), so lr_i / lr is the parameter's scale. */
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

#include "fixture.h"
#include "harness.h"
#include "runtime.h"
#include "vithost/vh_optim_schedule.h"

#define TOL_SCALE 1e-6 /* relative: the update's float rounding of lr * scale */
#define TOL_RESIZE 1e-6 /* relative to the tensor's largest entry */

static const vh_precision_policy fp32_policy = {
    .struct_size = sizeof(vh_precision_policy), .param_dtype = VH_DTYPE_F32,
    .compute_dtype = VH_DTYPE_F32, .grad_dtype = VH_DTYPE_F32, .comm_dtype = VH_DTYPE_F32,
    .master_dtype = VH_DTYPE_F32, .state_dtype = VH_DTYPE_F32, .master_weights = 1};

/* A run of the vit model and the mta optimizer (test plugins for the rest),
 * the model created for square images of `side` pixels. */
typedef struct ft_run {
    vh_run run;
    const vh_model_vtable *mvt;
    void *model;
    const vh_param_table *table;
} ft_run;

static vh_status ft_open(ft_run *r, const char *model_yaml, const char *optim_yaml,
                         int32_t side) {
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "model: %s\noptim: %s\nprecision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\ndata: {plugin: test_data}\n",
             model_yaml, optim_yaml);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    memset(r, 0, sizeof *r);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    if (run_open_text(&r->run, "finetune.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    r->mvt = r->run.plugins[VH_ROLE_MODEL].desc->vtable;
    vh_model_setup setup = {.struct_size = sizeof setup, .channels = 1, .height = side,
                            .width = side, .num_classes = 10, .max_batch = 2,
                            .policy = &fp32_policy};
    vh_status st = r->mvt->create(&r->run.hosts[VH_ROLE_MODEL].pub, &setup, &r->model);
    if (st != VH_STATUS_OK) fail_msg("vit: %s", r->run.hosts[VH_ROLE_MODEL].error);
    r->table = r->mvt->param_table(r->model);
    return st;
}

static void ft_close(ft_run *r) {
    if (r->model) r->mvt->destroy(r->model);
    run_close(&r->run);
}

/* ---- layer decay -------------------------------------------------------------- */

typedef struct scale_fixture {
    char classifier[16];
    int depth;
    double decay;
    int count;
    char names[256][64];
    double scales[256];
} scale_fixture;

static void read_scale_fixture(const char *name, scale_fixture *f) {
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/layer_decay_%s.txt", VH_TEST_FIXTURE_DIR, name);
    FILE *in = fopen(path, "r");
    if (!in) fail_msg("%s: cannot open (make_layer_decay_fixture.py writes it)", path);
    memset(f, 0, sizeof *f);
    while (fgets(line, sizeof line, in)) {
        if (sscanf(line, "@classifier %15s", f->classifier) == 1) continue;
        if (sscanf(line, "@depth %d", &f->depth) == 1) continue;
        if (sscanf(line, "@layer_decay %lf", &f->decay) == 1) continue;
        assert_true(f->count < 256);
        if (sscanf(line, "%63s %lf", f->names[f->count], &f->scales[f->count]) == 2) f->count++;
    }
    fclose(in);
    assert_true(f->count > 0 && f->depth > 0 && f->decay > 0);
}

/* mta's rate of every parameter of `table` over the base rate, from one
 * AdamW step (see the top of the file); n: the parameters. */
static vh_status mta_scales(ft_run *r, double lr, double *out, int n) {
    vh_host *host = &r->run.hosts[VH_ROLE_OPTIM].pub;
    const vh_optim_vtable *vt = r->run.plugins[VH_ROLE_OPTIM].desc->vtable;
    vh_optim_schedule sched = {.struct_size = sizeof sched};
    assert_int_equal(vh_optim_schedule_read(host, 10, &sched), VH_STATUS_OK);
    vh_optim_setup setup = {.struct_size = sizeof setup, .total_steps = 10, .table = r->table};
    void *self = NULL;
    vh_status st = vt->create(host, &setup, &self);
    if (st != VH_STATUS_OK) return st;
    float *buf = calloc((size_t)n * 4, sizeof(float)); /* p, g, m, v */
    vh_param_slice *items = calloc((size_t)n, sizeof *items);
    int i = 0;
    for (int32_t u = 0; u < r->table->num_units; u++)
        for (int32_t p = 0; p < r->table->units[u].num_params; p++, i++) {
            vh_param_slice *s = &items[i];
            s->unit = u, s->param = p, s->count = 1, s->flags = 0;
            s->master = &buf[i], s->grad = &buf[n + i];
            s->state[0] = &buf[2 * n + i], s->state[1] = &buf[3 * n + i];
            buf[n + i] = 1.0f;
        }
    assert_int_equal(i, n);
    vh_param_slices slices = {.items = items, .count = n, .item_size = sizeof *items,
                              .replicated = 1};
    vh_optim_step_args a = {.struct_size = sizeof a, .slices = &slices, .step = 0};
    vh_optim_schedule_args(&sched, 0, &a);
    assert_true(fabs(a.lr - lr) < 1e-15);
    st = vt->update(self, &a, NULL);
    if (st != VH_STATUS_OK) fail_msg("update: %s", r->run.hosts[VH_ROLE_OPTIM].error);
    for (i = 0; i < n; i++) out[i] = -(double)buf[i] * (1.0 + 1e-8) / lr;
    vt->destroy(self);
    free(items);
    free(buf);
    return VH_STATUS_OK;
}

static void check_layer_decay(const char *fixture) {
    scale_fixture f;
    read_scale_fixture(fixture, &f);
    char model[256], optim[256];
    snprintf(model, sizeof model,
             "{plugin: vit, dim: 16, depth: %d, heads: 2, mlp_dim: 32, patch_size: 4, "
             "classifier: %s}",
             f.depth, f.classifier);
    snprintf(optim, sizeof optim,
             "{plugin: mta, lr: 0.01, weight_decay: 0, schedule: constant, layer_decay: %.17g}",
             f.decay);
    ft_run r;
    ft_open(&r, model, optim, 28);
    double got[256];
    int n = 0, checked = 0;
    for (int32_t u = 0; u < r.table->num_units; u++) n += r.table->units[u].num_params;
    assert_int_equal(n, f.count); /* every timm parameter is a vit parameter, and back */
    if (mta_scales(&r, 0.01, got, n) != VH_STATUS_OK)
        fail_msg("mta create: %s", r.run.hosts[VH_ROLE_OPTIM].error);
    int i = 0;
    for (int32_t u = 0; u < r.table->num_units; u++)
        for (int32_t p = 0; p < r.table->units[u].num_params; p++, i++) {
            const char *name = r.table->units[u].params[p].name;
            for (int k = 0; k < f.count; k++) {
                if (strcmp(f.names[k], name) != 0) continue;
                if (fabs(got[i] - f.scales[k]) > TOL_SCALE * f.scales[k])
                    fail_msg("%s %s: mta's scale %.9g, timm's %.9g", fixture, name, got[i],
                             f.scales[k]);
                checked++;
            }
        }
    assert_int_equal(checked, n);
    ft_close(&r);
}

static void test_layer_decay_pooled(void **s) { (void)s; check_layer_decay("pooled_d4"); }
static void test_layer_decay_token(void **s) { (void)s; check_layer_decay("token_d4"); }
static void test_layer_decay_deep(void **s) { (void)s; check_layer_decay("token_d12"); }

/* layer_decay 1 (the default) leaves every rate alone. */
static void test_layer_decay_off(void **state) {
    (void)state;
    ft_run r;
    ft_open(&r, "{plugin: vit, dim: 16, depth: 2, heads: 2, patch_size: 4}",
            "{plugin: mta, lr: 0.01, weight_decay: 0, schedule: constant}", 28);
    double got[64];
    int n = 0;
    for (int32_t u = 0; u < r.table->num_units; u++) n += r.table->units[u].num_params;
    assert_int_equal(mta_scales(&r, 0.01, got, n), VH_STATUS_OK);
    for (int i = 0; i < n; i++) assert_true(fabs(got[i] - 1.0) < TOL_SCALE);
    ft_close(&r);
}

/* Names that are not timm's ViT names, no table, or 0 are refused at create
 * with the key and the reason. */
static void test_layer_decay_refusals(void **state) {
    (void)state;
    static const vh_param_desc odd_params[] = {{.name = "layer0.weight", .ndim = 1, .shape = {2},
                                                .numel = 2}};
    static const vh_param_desc bad_params[] = {{.name = "blocks.x.weight", .ndim = 1,
                                                .shape = {2}, .numel = 2}};
    static const vh_unit_desc odd_unit = {"layer0", odd_params, 1, 2};
    static const vh_unit_desc bad_unit = {"blocks.x", bad_params, 1, 2};
    static const vh_param_table odd = {&odd_unit, 1, 2}, bad = {&bad_unit, 1, 2};
    static const struct {
        const vh_param_table *table;
        const char *optim, *expect;
    } cases[] = {
        {&odd, "{plugin: mta, layer_decay: 0.75}", "no parameter is named blocks.<i>"},
        {&bad, "{plugin: mta, layer_decay: 0.75}", "'blocks.x.weight'"},
        {NULL, "{plugin: mta, layer_decay: 0.75}", "parameter table"},
        {&odd, "{plugin: mta, layer_decay: 0}", "(0, 1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ft_run r;
        ft_open(&r, "{plugin: vit, dim: 16, depth: 1, heads: 2, patch_size: 4}", cases[i].optim,
                8);
        vh_host *host = &r.run.hosts[VH_ROLE_OPTIM].pub;
        const vh_optim_vtable *vt = r.run.plugins[VH_ROLE_OPTIM].desc->vtable;
        vh_optim_setup setup = {.struct_size = sizeof setup, .total_steps = 10,
                                .table = cases[i].table};
        void *self = NULL;
        assert_int_equal(vt->create(host, &setup, &self), VH_STATUS_ERR_CONFIG);
        const char *err = r.run.hosts[VH_ROLE_OPTIM].error;
        if (!strstr(err, cases[i].expect) || !strstr(err, "layer_decay"))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].expect);
        ft_close(&r);
    }
}

/* ---- position embeddings of another image size ------------------------------ */

/* A weights source: pos_embed from the fixture, zeros of the model's shapes
 * for the other parameters of the embedding unit. */
typedef struct pos_source {
    const vh_fixture_array *pos;
    const vh_param_table *table;
    const float *zeros;
} pos_source;

static int ps_find(void *ctx, const char *name, vh_tensor *out) {
    const pos_source *ps = ctx;
    memset(out, 0, sizeof *out);
    out->dtype = VH_DTYPE_F32;
    out->device = VH_DEVICE_KIND_CPU;
    if (!strcmp(name, "pos_embed")) {
        out->data = (void *)ps->pos->f32;
        out->ndim = (int32_t)ps->pos->ndim;
        for (uint32_t i = 0; i < ps->pos->ndim; i++) out->shape[i] = ps->pos->dims[i];
        return 1;
    }
    const vh_unit_desc *u = &ps->table->units[0];
    for (int32_t p = 0; p < u->num_params; p++) {
        if (strcmp(u->params[p].name, name) != 0) continue;
        out->data = (void *)ps->zeros;
        out->ndim = u->params[p].ndim;
        for (int32_t i = 0; i < out->ndim; i++) out->shape[i] = u->params[p].shape[i];
        return 1;
    }
    return 0;
}

typedef struct last_record {
    char why[256];
    int resized;
} last_record;

static void lr_record(void *ctx, const char *param, vh_weights_action action, const char *why) {
    last_record *r = ctx;
    if (strcmp(param, "pos_embed") == 0 && action == VH_WEIGHTS_ACTION_LOADED && why &&
        strstr(why, "resized")) {
        r->resized = 1;
        snprintf(r->why, sizeof r->why, "%s", why);
    }
}

/* Loads case `name` of pos_embed_resize.vhfx into a vit of the new grid. */
static void check_resize(const vh_fixture *fx, const char *name) {
    int old, new, prefix;
    assert_int_equal(sscanf(name, "g%d_%d_p%d", &old, &new, &prefix), 3);
    char key[64], model[256];
    snprintf(key, sizeof key, "%s.in", name);
    const vh_fixture_array *in = vh_fixture_tensor(fx, key);
    snprintf(key, sizeof key, "%s.out", name);
    const vh_fixture_array *want = vh_fixture_tensor(fx, key);
    assert_non_null(in);
    assert_non_null(want);
    snprintf(model, sizeof model,
             "{plugin: vit, dim: %lld, depth: 1, heads: 2, patch_size: 4, classifier: %s}",
             (long long)in->dims[2], prefix ? "token" : "pooled");
    ft_run r;
    ft_open(&r, model, "{plugin: mta}", new * 4);
    const vh_unit_desc *u = &r.table->units[0];
    float *values = calloc((size_t)u->numel, sizeof(float));
    float *zeros = calloc((size_t)u->numel, sizeof(float));
    pos_source ps = {in, r.table, zeros};
    vh_weights_source src = {sizeof src, &ps, "pos.safetensors", ps_find};
    last_record rec;
    memset(&rec, 0, sizeof rec);
    vh_weights_report report = {sizeof report, &rec, lr_record};
    const char *err = r.run.hosts[VH_ROLE_MODEL].error;
    /* a checkpoint loads strictly: no resizing */
    assert_int_equal(r.mvt->load_weights(r.model, 0, &src, VH_WEIGHTS_MODE_STRICT, values,
                                         &report),
                     VH_STATUS_ERR_FORMAT);
    if (!strstr(err, "pos_embed") || !strstr(err, "model.pretrained")) fail_msg("strict: %s", err);
    if (r.mvt->load_weights(r.model, 0, &src, VH_WEIGHTS_MODE_PRETRAINED, values, &report) !=
        VH_STATUS_OK)
        fail_msg("%s: %s", name, err);
    assert_true(rec.resized);
    const vh_param_desc *pos = NULL;
    for (int32_t p = 0; p < u->num_params; p++)
        if (!strcmp(u->params[p].name, "pos_embed")) pos = &u->params[p];
    assert_non_null(pos);
    assert_int_equal(pos->numel, (int64_t)want->numel);
    double worst = 0.0, top = 0.0;
    for (size_t i = 0; i < want->numel; i++) {
        worst = fmax(worst, fabs((double)values[pos->offset + (int64_t)i] - want->f32[i]));
        top = fmax(top, fabs(want->f32[i]));
    }
    printf("%s: %s, max error %.2e of %.3g\n", name, rec.why, worst, top);
    if (worst > TOL_RESIZE * top) fail_msg("%s: off by %.3g (largest %.3g)", name, worst, top);
    /* the class token row is copied as it is */
    if (prefix)
        assert_memory_equal(values + pos->offset, in->f32, (size_t)in->dims[2] * sizeof(float));
    free(values);
    free(zeros);
    ft_close(&r);
}

static void test_pos_embed_resize(void **state) {
    (void)state;
    vh_fixture fx;
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/pos_embed_resize.vhfx", VH_TEST_FIXTURE_DIR);
    if (vh_fixture_load(path, &fx, err, sizeof err) != 0) fail_msg("%s", err);
    const char *cases = vh_fixture_config(&fx, "cases");
    assert_non_null(cases);
    char list[256];
    snprintf(list, sizeof list, "%s", cases);
    int n = 0;
    for (char *save = NULL, *c = strtok_r(list, ",", &save); c; c = strtok_r(NULL, ",", &save))
        check_resize(&fx, c), n++;
    assert_true(n >= 4);
    vh_fixture_free(&fx);
}

/* A pos_embed whose token count is no square grid (a file of the other
 * classifier) is refused naming the file and the counts. */
static void test_pos_embed_not_square(void **state) {
    (void)state;
    static float data[(1 + 9) * 8];
    vh_fixture_array a = {.name = "pos_embed", .ndim = 3, .dims = {1, 10, 8}, .numel = 80,
                          .data = data, .f32 = data};
    ft_run r;
    ft_open(&r, "{plugin: vit, dim: 8, depth: 1, heads: 2, patch_size: 4, classifier: pooled}",
            "{plugin: mta}", 16);
    const vh_unit_desc *u = &r.table->units[0];
    float *values = calloc((size_t)u->numel, sizeof(float));
    pos_source ps = {&a, r.table, data};
    vh_weights_source src = {sizeof src, &ps, "cls.safetensors", ps_find};
    assert_int_equal(r.mvt->load_weights(r.model, 0, &src, VH_WEIGHTS_MODE_PRETRAINED, values,
                                         NULL),
                     VH_STATUS_ERR_FORMAT);
    const char *err = r.run.hosts[VH_ROLE_MODEL].error;
    if (!strstr(err, "cls.safetensors") || !strstr(err, "10 tokens")) fail_msg("%s", err);
    free(values);
    ft_close(&r);
}

/* ---- the whole path: pretrained at another size and class count --------------- */

static char tmp_dir[512];
#define vithost(...) harness_sh(tmp_dir, VH_TEST_VITHOST " " __VA_ARGS__)

static void expect_in(const char *file, const char *needle) {
    char *text = harness_read(tmp_dir, file);
    if (!strstr(text, needle)) fail_msg("%s lacks '%s':\n%s", file, needle, text);
    free(text);
}

/* 8x8 images (2x2 patches), 4 classes; then fine-tuned at 12x12 (3x3) on 6
 * classes with layer decay: pos_embed resized, the head re-initialised, the
 * rest loaded, and the run trains. */
static void test_pretrained_other_size_and_head(void **state) {
    (void)state;
    assert_int_equal(harness_mkdtemp(tmp_dir, sizeof tmp_dir, "finetune"), 0);
    assert_int_equal(harness_write(tmp_dir, "tiny.yaml", harness_tiny_vit), 0);
    assert_int_equal(vithost("run tiny.yaml --out pt"), 0);
    assert_int_equal(vithost("run tiny.yaml --out ft "
                             "--set model.pretrained=pt/checkpoints/step-00000008/model.safetensors "
                             "--set data.image_size=12 --set data.num_classes=6 "
                             "--set optim.layer_decay=0.75"),
                     0);
    expect_in("out", "re-initialised 2: head.weight, head.bias (the file has 4 classes, the "
                     "model 6)");
    expect_in("err", "pos_embed resized from a 2x2 to a 3x3 patch grid (bicubic)");
    expect_in("err", "layer decay 0.75");
    harness_rmdir(tmp_dir);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_decay_pooled),
        cmocka_unit_test(test_layer_decay_token),
        cmocka_unit_test(test_layer_decay_deep),
        cmocka_unit_test(test_layer_decay_off),
        cmocka_unit_test(test_layer_decay_refusals),
        cmocka_unit_test(test_pos_embed_resize),
        cmocka_unit_test(test_pos_embed_not_square),
        cmocka_unit_test(test_pretrained_other_size_and_head),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
