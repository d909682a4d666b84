/* test_vit.c - the vit model plugin against PyTorch fixtures.
 *
 * Each fixture (tests/fixtures/, written by tests/reference/
 * make_fixtures.py) holds a config, timm-named weights, an input batch, and
 * PyTorch's logits, loss and every gradient. The plugin is loaded as vithost
 * loads it, given the same weights through the unit hooks, and compared
 * tensor by tensor with named tolerances. */
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
#include "runtime.h"

/* fp32 tolerances of the issue: relative to each tensor's largest entry. */
#define TOL_LOGITS 1e-4
#define TOL_LOSS 1e-5
#define TOL_GRAD 1e-3

typedef struct harness {
    vh_run run;
    const vh_model_vtable *vt;
    void *model;
    const vh_param_table *table;
    float **params, **grads; /* per unit */
    int gathered[256];
} harness;

static vh_status hk_gather(void *ctx, int32_t unit, const void **params) {
    harness *h = ctx;
    h->gathered[unit]++;
    *params = h->params[unit];
    return VH_STATUS_OK;
}
static vh_status hk_release(void *ctx, int32_t unit) {
    harness *h = ctx;
    h->gathered[unit]--;
    return VH_STATUS_OK;
}
static vh_status hk_grads(void *ctx, int32_t unit, void **grads) {
    *grads = ((harness *)ctx)->grads[unit];
    return VH_STATUS_OK;
}
static vh_status hk_reduce(void *ctx, int32_t unit) {
    (void)ctx, (void)unit;
    return VH_STATUS_OK;
}

static const char *cfg(const vh_fixture *fx, const char *key) {
    const char *v = vh_fixture_config(fx, key);
    assert_non_null(v);
    return v;
}

/* Opens a run whose model section reproduces the fixture's config, with
 * `layout` overriding the fixture's when not NULL, and creates the model. */
static void harness_open(harness *h, const vh_fixture *fx, const char *layout) {
    memset(h, 0, sizeof *h);
    char recipe[2048];
    snprintf(recipe, sizeof recipe,
             "run: {batch_size: %s}\n"
             "model: {plugin: vit, dim: %s, depth: %s, heads: %s, mlp_dim: %s, patch_size: %s,\n"
             "        classifier: %s, layout: %s, label_smoothing: %s}\n"
             "precision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\n"
             "optim: {plugin: test_optim}\n"
             "data: {plugin: test_data}\n",
             cfg(fx, "batch"), cfg(fx, "dim"), cfg(fx, "depth"), cfg(fx, "heads"),
             cfg(fx, "mlp_dim"), cfg(fx, "patch_size"), cfg(fx, "classifier"),
             layout ? layout : cfg(fx, "layout"), cfg(fx, "label_smoothing"));
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    vh_status st = run_open_text(&h->run, "fixture.yaml", recipe, &opts, &d);
    if (st != VH_STATUS_OK) fail_msg("%s", d.text);
    h->vt = h->run.plugins[VH_ROLE_MODEL].desc->vtable;
    int64_t batch, channels, height, width, classes;
    vh_fixture_config_int(fx, "batch", &batch);
    vh_fixture_config_int(fx, "channels", &channels);
    vh_fixture_config_int(fx, "image_height", &height);
    vh_fixture_config_int(fx, "image_width", &width);
    vh_fixture_config_int(fx, "num_classes", &classes);
    vh_model_setup setup = {.struct_size = sizeof setup, .channels = (int32_t)channels,
                            .height = (int32_t)height, .width = (int32_t)width,
                            .num_classes = (int32_t)classes, .max_batch = batch,
                            .policy = {sizeof(vh_precision_policy), VH_DTYPE_F32, VH_DTYPE_F32,
                                       VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_F32}};
    st = h->vt->create(&h->run.hosts[VH_ROLE_MODEL].pub, &setup, &h->model);
    if (st != VH_STATUS_OK) fail_msg("vit create: %s", h->run.hosts[VH_ROLE_MODEL].error);
    h->table = h->vt->param_table(h->model);
    h->params = calloc((size_t)h->table->num_units, sizeof *h->params);
    h->grads = calloc((size_t)h->table->num_units, sizeof *h->grads);
    for (int32_t u = 0; u < h->table->num_units; u++) {
        h->params[u] = calloc((size_t)h->table->units[u].numel, sizeof(float));
        h->grads[u] = calloc((size_t)h->table->units[u].numel, sizeof(float));
    }
}

static void harness_close(harness *h) {
    /* The table belongs to the model: done with it before destroy. */
    for (int32_t u = 0; h->table && u < h->table->num_units; u++) {
        free(h->params[u]);
        free(h->grads[u]);
    }
    if (h->model) h->vt->destroy(h->model);
    free(h->params);
    free(h->grads);
    run_close(&h->run);
}

/* Every parameter of the table exists in the fixture under its timm name with
 * the same shape, and the fixture has no parameter the table lacks. */
static void load_weights(harness *h, const vh_fixture *fx) {
    size_t matched = 0;
    for (int32_t u = 0; u < h->table->num_units; u++) {
        const vh_unit_desc *unit = &h->table->units[u];
        for (int32_t p = 0; p < unit->num_params; p++) {
            const vh_param_desc *d = &unit->params[p];
            const vh_fixture_array *t = vh_fixture_tensor(fx, d->name);
            if (!t) fail_msg("the fixture has no parameter '%s'", d->name);
            assert_int_equal(t->ndim, d->ndim);
            for (int32_t i = 0; i < d->ndim; i++)
                if (t->dims[i] != d->shape[i])
                    fail_msg("%s: dim %d is %lld in vithost, %lld in PyTorch", d->name, (int)i,
                             (long long)d->shape[i], (long long)t->dims[i]);
            memcpy(h->params[u] + d->offset, t->f32, (size_t)d->numel * sizeof(float));
            matched++;
        }
    }
    size_t in_fixture = 0;
    for (size_t i = 0; i < fx->tensor_count; i++) {
        const char *n = fx->tensors[i].name;
        if (strncmp(n, "grad.", 5) == 0 || !strcmp(n, "input") || !strcmp(n, "labels") ||
            !strcmp(n, "logits") || !strcmp(n, "loss"))
            continue;
        in_fixture++;
    }
    assert_int_equal(matched, in_fixture);
}

static vh_batch fixture_batch(const vh_fixture *fx) {
    const vh_fixture_array *in = vh_fixture_tensor(fx, "input");
    const vh_fixture_array *lb = vh_fixture_tensor(fx, "labels");
    assert_non_null(in);
    assert_non_null(lb);
    vh_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.images = (vh_tensor){.data = (void *)in->f32, .dtype = VH_DTYPE_F32, .ndim = 4,
                           .shape = {in->dims[0], in->dims[1], in->dims[2], in->dims[3]}};
    b.labels = (vh_tensor){.data = (void *)lb->i32, .dtype = VH_DTYPE_I32, .ndim = 1,
                           .shape = {lb->dims[0]}};
    b.size = in->dims[0];
    return b;
}

static vh_unit_hooks hooks_of(harness *h) {
    return (vh_unit_hooks){sizeof(vh_unit_hooks), h, hk_gather, hk_release, hk_grads, hk_reduce};
}

static void run_step(harness *h, const vh_fixture *fx, float loss_scale, vh_model_output *out) {
    vh_batch b = fixture_batch(fx);
    vh_unit_hooks hooks = hooks_of(h);
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    vh_status st = h->vt->forward(h->model, &b, VH_MODE_TRAIN, &hooks, out);
    if (st != VH_STATUS_OK) fail_msg("forward: %s", h->run.hosts[VH_ROLE_MODEL].error);
    st = h->vt->backward(h->model, loss_scale, &hooks);
    if (st != VH_STATUS_OK) fail_msg("backward: %s", h->run.hosts[VH_ROLE_MODEL].error);
    for (int32_t u = 0; u < h->table->num_units; u++) assert_int_equal(h->gathered[u], 0);
}

static void load_fixture(vh_fixture *fx, const char *name) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s.vhfx", VH_TEST_FIXTURE_DIR, name);
    if (vh_fixture_load(path, fx, err, sizeof err) != 0) fail_msg("%s", err);
}

/* Logits, loss and every gradient against PyTorch. */
static void check_fixture(const char *name, const char *layout) {
    vh_fixture fx;
    load_fixture(&fx, name);
    harness h;
    harness_open(&h, &fx, layout);
    load_weights(&h, &fx);
    vh_model_output out;
    run_step(&h, &fx, 1.0f, &out);

    char report[512];
    int failures = 0;
    const vh_fixture_array *logits = vh_fixture_tensor(&fx, "logits");
    if (!vh_fixture_compare("logits", out.logits.data, logits->f32, logits->numel, TOL_LOGITS,
                            report, sizeof report))
        failures++, printf("%s: %s\n", name, report);
    const vh_fixture_array *loss = vh_fixture_tensor(&fx, "loss");
    if (!vh_fixture_compare("loss", &out.loss, loss->f32, 1, TOL_LOSS, report, sizeof report))
        failures++, printf("%s: %s\n", name, report);
    int grads = 0;
    for (int32_t u = 0; u < h.table->num_units; u++) {
        const vh_unit_desc *unit = &h.table->units[u];
        for (int32_t p = 0; p < unit->num_params; p++) {
            const vh_param_desc *d = &unit->params[p];
            char gname[256];
            snprintf(gname, sizeof gname, "grad.%s", d->name);
            const vh_fixture_array *want = vh_fixture_tensor(&fx, gname);
            assert_non_null(want);
            if (!vh_fixture_compare(gname, h.grads[u] + d->offset, want->f32, want->numel,
                                    TOL_GRAD, report, sizeof report))
                failures++, printf("%s: %s\n", name, report);
            grads++;
        }
    }
    assert_true(grads > 10);
    harness_close(&h);
    vh_fixture_free(&fx);
    if (failures) fail_msg("%s: %d tensor(s) differ from PyTorch (see above)", name, failures);
}

static void test_token_batch_first(void **s) { (void)s; check_fixture("vit_token_bf", NULL); }
static void test_token_batch_second(void **s) { (void)s; check_fixture("vit_token_bs", NULL); }
static void test_pooled_batch_first(void **s) { (void)s; check_fixture("vit_pooled_bf", NULL); }
static void test_pooled_batch_second(void **s) { (void)s; check_fixture("vit_pooled_bs", NULL); }
static void test_odd_sizes(void **s) { (void)s; check_fixture("vit_odd", NULL); }
/* The layout changes memory order, not numbers: every fixture in the other one. */
static void test_odd_sizes_batch_second(void **s) { (void)s; check_fixture("vit_odd", "batch_second"); }
static void test_token_bf_fixture_in_batch_second(void **s) {
    (void)s;
    check_fixture("vit_token_bf", "batch_second");
}

/* batch_first and batch_second give the same numbers, to summation order. */
static void test_layouts_agree(void **state) {
    (void)state;
    vh_fixture fx;
    load_fixture(&fx, "vit_pooled_bf");
    harness a, b;
    harness_open(&a, &fx, "batch_first");
    harness_open(&b, &fx, "batch_second");
    load_weights(&a, &fx);
    load_weights(&b, &fx);
    vh_model_output oa, ob;
    run_step(&a, &fx, 1.0f, &oa);
    run_step(&b, &fx, 1.0f, &ob);
    char report[512];
    size_t n = (size_t)(oa.logits.shape[0] * oa.logits.shape[1]);
    assert_true(vh_fixture_compare("logits", oa.logits.data, ob.logits.data, n, 1e-6, report,
                                   sizeof report));
    for (int32_t u = 0; u < a.table->num_units; u++)
        if (!vh_fixture_compare(a.table->units[u].name, a.grads[u], b.grads[u],
                                (size_t)a.table->units[u].numel, 1e-5, report, sizeof report))
            fail_msg("%s", report);
    harness_close(&a);
    harness_close(&b);
    vh_fixture_free(&fx);
}

/* backward(loss_scale = s) gives s times the gradients. */
static void test_loss_scale(void **state) {
    (void)state;
    vh_fixture fx;
    load_fixture(&fx, "vit_token_bf");
    harness a, b;
    harness_open(&a, &fx, NULL);
    harness_open(&b, &fx, NULL);
    load_weights(&a, &fx);
    load_weights(&b, &fx);
    vh_model_output oa, ob;
    run_step(&a, &fx, 1.0f, &oa);
    run_step(&b, &fx, 1024.0f, &ob);
    for (int32_t u = 0; u < a.table->num_units; u++) {
        int64_t n = a.table->units[u].numel;
        for (int64_t i = 0; i < n; i++) b.grads[u][i] /= 1024.0f;
        char report[512];
        if (!vh_fixture_compare(a.table->units[u].name, b.grads[u], a.grads[u], (size_t)n, 1e-6,
                                report, sizeof report))
            fail_msg("%s", report);
    }
    harness_close(&a);
    harness_close(&b);
    vh_fixture_free(&fx);
}

/* Decay flags: matrices decay; biases, norms, pos_embed and cls_token don't. */
static void test_decay_flags_and_units(void **state) {
    (void)state;
    vh_fixture fx;
    load_fixture(&fx, "vit_token_bf");
    harness h;
    harness_open(&h, &fx, NULL);
    int64_t depth;
    vh_fixture_config_int(&fx, "depth", &depth);
    assert_int_equal(h.table->num_units, depth + 2);
    assert_string_equal(h.table->units[0].name, "embed");
    assert_string_equal(h.table->units[1].name, "blocks.0");
    assert_string_equal(h.table->units[h.table->num_units - 1].name, "head");
    for (int32_t u = 0; u < h.table->num_units; u++) {
        for (int32_t p = 0; p < h.table->units[u].num_params; p++) {
            const vh_param_desc *d = &h.table->units[u].params[p];
            int is_matrix = strstr(d->name, ".weight") && d->ndim >= 2;
            assert_int_equal(!!(d->flags & VH_PARAM_FLAG_DECAY), is_matrix);
        }
    }
    harness_close(&h);
    vh_fixture_free(&fx);
}

/* Opens a run whose model section is `model` (test plugins for the other
 * roles) and creates the model for square images; returns create's status,
 * the model in *model, the vtable in *vt. */
static vh_status create_model(vh_run *run, const char *model_yaml, int32_t side,
                              int32_t classes, int64_t batch, const vh_model_vtable **vt,
                              void **model) {
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "model: %s\nprecision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\noptim: {plugin: test_optim}\n"
             "data: {plugin: test_data}\n",
             model_yaml);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    if (run_open_text(run, "model.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    *vt = run->plugins[VH_ROLE_MODEL].desc->vtable;
    vh_model_setup setup = {.struct_size = sizeof setup, .channels = 3, .height = side,
                            .width = side, .num_classes = classes, .max_batch = batch,
                            .policy = {sizeof(vh_precision_policy), VH_DTYPE_F32,
                                       VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_F32,
                                       VH_DTYPE_F32}};
    *model = NULL;
    return (*vt)->create(&run->hosts[VH_ROLE_MODEL].pub, &setup, model);
}

/* Published sizes: parameter counts of timm's vit_*_224 models (1000 classes). */
static void test_variant_parameter_counts(void **state) {
    (void)state;
    static const struct {
        const char *variant;
        int64_t params;
    } known[] = {{"s16", 22050664}, {"b16", 86567656}, {"l16", 304326632}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        char model_yaml[128];
        snprintf(model_yaml, sizeof model_yaml, "{plugin: vit, variant: %s}", known[i].variant);
        vh_run run;
        const vh_model_vtable *vt;
        void *model;
        if (create_model(&run, model_yaml, 224, 1000, 1, &vt, &model) != VH_STATUS_OK)
            fail_msg("%s", run.hosts[VH_ROLE_MODEL].error);
        assert_int_equal(vt->param_table(model)->numel, known[i].params);
        /* pycls convention, ViT-B/16: about 17.6 GFLOPs forward, x3 for training */
        if (!strcmp(known[i].variant, "b16")) {
            double f = vt->train_flops_per_image(model);
            assert_true(f > 3 * 2 * 17.4e9 && f < 3 * 2 * 17.7e9);
        }
        vt->destroy(model);
        run_close(&run);
    }
}

/* Bad configs fail at create with a message naming the key. */
static void test_bad_configs(void **state) {
    (void)state;
    static const struct {
        const char *model;
        const char *expect;
    } cases[] = {
        {"{plugin: vit, dim: 48, depth: 2, heads: 5, patch_size: 4}", "do not divide dim"},
        {"{plugin: vit, dim: 48, depth: 2, heads: 3, patch_size: 5}", "does not divide"},
        {"{plugin: vit, dim: 48, heads: 3, patch_size: 4}", "depth"},
        {"{plugin: vit, variant: s16, image_size: 32}", "data plugin yields"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vh_run run;
        const vh_model_vtable *vt;
        void *model;
        assert_int_equal(create_model(&run, cases[i].model, 16, 10, 2, &vt, &model),
                         VH_STATUS_ERR_CONFIG);
        if (!strstr(run.hosts[VH_ROLE_MODEL].error, cases[i].expect))
            fail_msg("case %zu: '%s' lacks '%s'", i, run.hosts[VH_ROLE_MODEL].error,
                     cases[i].expect);
        run_close(&run);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_batch_first),
        cmocka_unit_test(test_token_batch_second),
        cmocka_unit_test(test_pooled_batch_first),
        cmocka_unit_test(test_pooled_batch_second),
        cmocka_unit_test(test_odd_sizes),
        cmocka_unit_test(test_odd_sizes_batch_second),
        cmocka_unit_test(test_token_bf_fixture_in_batch_second),
        cmocka_unit_test(test_layouts_agree),
        cmocka_unit_test(test_loss_scale),
        cmocka_unit_test(test_decay_flags_and_units),
        cmocka_unit_test(test_variant_parameter_counts),
        cmocka_unit_test(test_bad_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
