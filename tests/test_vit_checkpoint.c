/* test_vit_checkpoint.c - vit's activation checkpointing (`checkpoint_blocks`).
 *
 * A checkpointed block keeps only its input and runs its forward again in
 * backward, with the same dropout masks and drop-path factors (drawn from
 * (seed, step, site)). So on the CPU the loss, the logits and every gradient
 * must be the same bits with none, all, or every k-th block checkpointed:
 * both classifiers, both layouts, with dropout and drop path, over steps
 * whose draws differ. And the memory it reports is what it allocates, and
 * less: one shared block set instead of one per checkpointed block.
 *
 * The test plays the sharding plugin as test_vit.c does (fp32 layouts, unit
 * hooks), with the model's own init plus noise as the weights (so no
 * gradient is zero by construction) and a random batch. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime.h"
#include "vithost/vh_random.h"
#include "vithost/vh_runtime.h"

enum { BATCH = 3, SIDE = 8, CHANNELS = 3, CLASSES = 5, STEPS = 2 };

static const vh_precision_policy fp32_policy = {
    .struct_size = sizeof(vh_precision_policy), .compute_dtype = VH_DTYPE_F32,
    .param_dtype = VH_DTYPE_F32, .grad_dtype = VH_DTYPE_F32, .master_weights = 0};

typedef struct harness {
    vh_run run;
    const vh_model_vtable *vt;
    void *model;
    const vh_param_table *table;
    vh_precision_policy policy;
    vh_unit_layout *playout, *glayout;
    void **params, **grads;
} harness;

/* The device the next open gives the model; the CPU's when NULL. */
static const vh_device_ops *override_device;

static vh_status hk_gather(void *ctx, int32_t unit, const void **params) {
    *params = ((harness *)ctx)->params[unit];
    return VH_STATUS_OK;
}
static vh_status hk_release(void *ctx, int32_t unit) {
    (void)ctx, (void)unit;
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

/* Creates the model from a model section (test plugins elsewhere); returns
 * create's status, the message in the run's model host. */
static vh_status harness_create(harness *h, const char *model_yaml) {
    memset(h, 0, sizeof *h);
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "run: {batch_size: %d, seed: 7}\nmodel: %s\n"
             "precision: {plugin: test_precision}\nsharding: {plugin: test_sharding}\n"
             "optim: {plugin: test_optim}\ndata: {plugin: test_data}\n",
             BATCH, model_yaml);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    if (run_open_text(&h->run, "ckpt.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    if (override_device) h->run.device = override_device;
    h->vt = h->run.plugins[VH_ROLE_MODEL].desc->vtable;
    h->policy = fp32_policy;
    vh_model_setup setup = {.struct_size = sizeof setup, .channels = CHANNELS, .height = SIDE,
                            .width = SIDE, .num_classes = CLASSES, .max_batch = BATCH,
                            .policy = &h->policy, .rank = 0, .world_size = 1};
    return h->vt->create(&h->run.hosts[VH_ROLE_MODEL].pub, &setup, &h->model);
}

/* Lays out every unit's parameters (init rules plus uniform noise) and
 * zeroed gradients. */
static void harness_weights(harness *h) {
    h->table = h->vt->param_table(h->model);
    int32_t n = h->table->num_units;
    h->params = calloc((size_t)n, sizeof *h->params);
    h->grads = calloc((size_t)n, sizeof *h->grads);
    h->playout = calloc((size_t)n, sizeof *h->playout);
    h->glayout = calloc((size_t)n, sizeof *h->glayout);
    assert_true(h->params && h->grads && h->playout && h->glayout);
    for (int32_t u = 0; u < n; u++) {
        const vh_unit_desc *unit = &h->table->units[u];
        assert_int_equal(vh_unit_layout_init(&h->playout[u], unit, vh_policy_param_dtype,
                                             &h->policy), VH_STATUS_OK);
        assert_int_equal(vh_unit_layout_init(&h->glayout[u], unit, vh_policy_grad_dtype,
                                             &h->policy), VH_STATUS_OK);
        h->params[u] = aligned_alloc(VH_UNIT_ALIGN, h->playout[u].bytes);
        h->grads[u] = aligned_alloc(VH_UNIT_ALIGN, h->glayout[u].bytes);
        assert_true(h->params[u] && h->grads[u]);
        memset(h->grads[u], 0, h->glayout[u].bytes);
        float *values = malloc((size_t)unit->numel * sizeof(float));
        assert_non_null(values);
        assert_int_equal(h->vt->init_unit(h->model, u, values, 0), VH_STATUS_OK);
        for (int32_t p = 0; p < unit->num_params; p++) {
            const vh_param_desc *d = &unit->params[p];
            assert_int_equal(h->playout[u].dtypes[p], VH_DTYPE_F32);
            float *dst = (float *)((char *)h->params[u] + h->playout[u].offsets[p]);
            for (int64_t i = 0; i < d->numel; i++) {
                uint64_t r = vh_splitmix64((uint64_t)u << 40 ^ (uint64_t)p << 32 ^ (uint64_t)i);
                dst[i] = values[d->offset + i] + 0.1f * ((float)(r >> 40) / 16777216.0f - 0.5f);
            }
        }
        free(values);
    }
}

static void harness_open(harness *h, const char *model_yaml) {
    if (harness_create(h, model_yaml) != VH_STATUS_OK)
        fail_msg("vit create: %s", h->run.hosts[VH_ROLE_MODEL].error);
    harness_weights(h);
}

static void harness_close(harness *h) {
    for (int32_t u = 0; h->table && u < h->table->num_units; u++) {
        free(h->params[u]);
        free(h->grads[u]);
        vh_unit_layout_free(&h->playout[u]);
        vh_unit_layout_free(&h->glayout[u]);
    }
    if (h->model) h->vt->destroy(h->model);
    free(h->params);
    free(h->grads);
    free(h->playout);
    free(h->glayout);
    run_close(&h->run);
}

/* One step's observable numbers: loss, logits, and every gradient (each
 * unit's buffer, zeroed before the step), copied out. */
typedef struct step_result {
    float loss;
    float logits[BATCH * CLASSES];
    void **grads;
    size_t *bytes;
    int32_t units;
} step_result;

static void run_step(harness *h, step_result *r) {
    static float images[BATCH * CHANNELS * SIDE * SIDE];
    static int32_t labels[BATCH];
    for (size_t i = 0; i < sizeof images / sizeof images[0]; i++)
        images[i] = (float)(vh_splitmix64(1000 + i) >> 40) / 8388608.0f - 1.0f;
    for (int i = 0; i < BATCH; i++) labels[i] = (int32_t)(vh_splitmix64(77 + i) % CLASSES);
    vh_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.images = (vh_tensor){.data = images, .dtype = VH_DTYPE_F32, .ndim = 4,
                           .shape = {BATCH, CHANNELS, SIDE, SIDE}};
    b.labels = (vh_tensor){.data = labels, .dtype = VH_DTYPE_I32, .ndim = 1, .shape = {BATCH}};
    b.size = BATCH;
    for (int32_t u = 0; u < h->table->num_units; u++) memset(h->grads[u], 0, h->glayout[u].bytes);
    vh_unit_hooks hooks = {sizeof hooks, h, hk_gather, hk_release, hk_grads, hk_reduce};
    vh_model_output out;
    memset(&out, 0, sizeof out);
    out.struct_size = sizeof out;
    if (h->vt->forward(h->model, &b, VH_MODE_TRAIN, &hooks, &out) != VH_STATUS_OK)
        fail_msg("forward: %s", h->run.hosts[VH_ROLE_MODEL].error);
    memcpy(r->logits, out.logits.data, sizeof r->logits);
    if (h->vt->backward(h->model, 1.0f, &hooks) != VH_STATUS_OK)
        fail_msg("backward: %s", h->run.hosts[VH_ROLE_MODEL].error);
    memcpy(&r->loss, out.loss, sizeof r->loss); /* CPU: device memory is host memory */
    r->units = h->table->num_units;
    r->grads = calloc((size_t)r->units, sizeof *r->grads);
    r->bytes = calloc((size_t)r->units, sizeof *r->bytes);
    assert_true(r->grads && r->bytes);
    for (int32_t u = 0; u < r->units; u++) {
        r->bytes[u] = h->glayout[u].bytes;
        r->grads[u] = malloc(r->bytes[u]);
        assert_non_null(r->grads[u]);
        memcpy(r->grads[u], h->grads[u], r->bytes[u]);
    }
}

static void free_result(step_result *r) {
    for (int32_t u = 0; u < r->units; u++) free(r->grads[u]);
    free(r->grads);
    free(r->bytes);
}

/* STEPS steps of a model section; results[s] per step. */
static void run_steps(const char *model_yaml, step_result *results) {
    harness h;
    harness_open(&h, model_yaml);
    for (int s = 0; s < STEPS; s++) run_step(&h, &results[s]);
    harness_close(&h);
}

/* Bitwise: the loss, the logits and every unit's gradients; the first
 * differing unit is named. */
static void assert_same_bits(const step_result *want, const step_result *got, const char *what,
                             int step) {
    if (memcmp(&want->loss, &got->loss, sizeof want->loss) != 0)
        fail_msg("%s, step %d: loss %.9g against %.9g", what, step, (double)got->loss,
                 (double)want->loss);
    if (memcmp(want->logits, got->logits, sizeof want->logits) != 0)
        fail_msg("%s, step %d: logits differ", what, step);
    assert_int_equal(want->units, got->units);
    for (int32_t u = 0; u < want->units; u++) {
        assert_int_equal(want->bytes[u], got->bytes[u]);
        if (memcmp(want->grads[u], got->grads[u], want->bytes[u]) != 0)
            fail_msg("%s, step %d: gradients of unit %d differ", what, step, (int)u);
    }
}

/* none against all, every 2 and every 3, for one model. */
static void check_checkpointing(const char *classifier, const char *layout, const char *extra) {
    static const char *const modes[] = {"none", "all", "2", "3"};
    step_result results[4][STEPS];
    for (int i = 0; i < 4; i++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml,
                 "{plugin: vit, dim: 32, depth: 4, heads: 2, mlp_dim: 48, patch_size: 4, "
                 "classifier: %s, layout: %s, checkpoint_blocks: %s%s%s}",
                 classifier, layout, modes[i], extra ? ", " : "", extra ? extra : "");
        run_steps(yaml, results[i]);
    }
    /* the steps draw different masks: step 2 is not step 1 again */
    assert_true(extra == NULL || memcmp(&results[0][0].loss, &results[0][1].loss,
                                        sizeof(float)) != 0);
    for (int i = 1; i < 4; i++)
        for (int s = 0; s < STEPS; s++) {
            char what[256];
            snprintf(what, sizeof what, "%s, %s, %s, checkpoint_blocks %s", classifier, layout,
                     extra ? extra : "no dropout", modes[i]);
            assert_same_bits(&results[0][s], &results[i][s], what, s + 1);
        }
    for (int i = 0; i < 4; i++)
        for (int s = 0; s < STEPS; s++) free_result(&results[i][s]);
}

static const char dropping[] = "dropout: 0.1, drop_path: 0.3";

static void test_token_batch_first(void **state) {
    (void)state;
    check_checkpointing("token", "batch_first", NULL);
    check_checkpointing("token", "batch_first", dropping);
}
static void test_token_batch_second(void **state) {
    (void)state;
    check_checkpointing("token", "batch_second", dropping);
}
static void test_pooled_batch_first(void **state) {
    (void)state;
    check_checkpointing("pooled", "batch_first", dropping);
}
static void test_pooled_batch_second(void **state) {
    (void)state;
    check_checkpointing("pooled", "batch_second", NULL);
    check_checkpointing("pooled", "batch_second", dropping);
}

/* ---- memory ----------------------------------------------------------------- */

static struct {
    vh_device_ops ops;
    const vh_device_ops *base;
    int64_t bytes;
} counting;

static vh_status counting_alloc(vh_device *dev, size_t bytes, void **out) {
    vh_status st = counting.base->alloc(dev, bytes, out);
    if (st == VH_STATUS_OK) counting.bytes += (int64_t)bytes;
    return st;
}

/* The model's activation_bytes, checked against what create allocated. */
static int64_t activation_bytes(const char *mode, const char *extra) {
    counting.base = vh_cpu_device_ops();
    counting.ops = *counting.base;
    counting.ops.alloc = counting_alloc;
    counting.bytes = 0;
    override_device = &counting.ops;
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "{plugin: vit, dim: 32, depth: 6, heads: 2, patch_size: 4, checkpoint_blocks: %s%s%s}",
             mode, extra ? ", " : "", extra ? extra : "");
    harness h;
    vh_status st = harness_create(&h, yaml);
    override_device = NULL;
    if (st != VH_STATUS_OK) fail_msg("vit create: %s", h.run.hosts[VH_ROLE_MODEL].error);
    int64_t bytes = -1;
    assert_int_equal(h.vt->activation_bytes(h.model, &bytes), VH_STATUS_OK);
    assert_int_equal(bytes, counting.bytes);
    harness_close(&h);
    return bytes;
}

/* Reported = allocated; each checkpointed block past the first saves one
 * block's set, so none - all = 5 sets at depth 6, every 2 (blocks 0, 2, 4)
 * saves 2 and every 4 (0, 4) saves 1. */
static void test_activation_bytes(void **state) {
    (void)state;
    const char *extras[] = {NULL, dropping};
    for (int e = 0; e < 2; e++) {
        int64_t none = activation_bytes("none", extras[e]);
        int64_t all = activation_bytes("all", extras[e]);
        int64_t two = activation_bytes("2", extras[e]);
        int64_t four = activation_bytes("4", extras[e]);
        int64_t set = (none - all) / 5;
        printf("activations%s: none %lld, all %lld, every 2 %lld, every 4 %lld bytes\n",
               e ? " with dropout" : "", (long long)none, (long long)all, (long long)two,
               (long long)four);
        assert_true(set > 0);
        assert_int_equal(none - all, 5 * set);
        assert_int_equal(none - two, 2 * set);
        assert_int_equal(none - four, set);
        assert_int_equal(activation_bytes("1", extras[e]), all);
        assert_int_equal(activation_bytes("6", extras[e]), none); /* block 0 alone */
    }
}

/* A bad value names the key and what it takes. */
static void test_bad_values(void **state) {
    (void)state;
    static const char *const bad[] = {"0", "-2", "some", "2x", "1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char yaml[256];
        snprintf(yaml, sizeof yaml,
                 "{plugin: vit, dim: 32, depth: 2, heads: 2, patch_size: 4, "
                 "checkpoint_blocks: '%s'}",
                 bad[i]);
        harness h;
        assert_int_equal(harness_create(&h, yaml), VH_STATUS_ERR_CONFIG);
        const char *msg = h.run.hosts[VH_ROLE_MODEL].error;
        if (!strstr(msg, "checkpoint_blocks") || !strstr(msg, "none, all or"))
            fail_msg("'%s': message '%s'", bad[i], msg);
        harness_close(&h);
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_batch_first),  cmocka_unit_test(test_token_batch_second),
        cmocka_unit_test(test_pooled_batch_first), cmocka_unit_test(test_pooled_batch_second),
        cmocka_unit_test(test_activation_bytes),   cmocka_unit_test(test_bad_values),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
