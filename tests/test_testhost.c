/* test_testhost.c - libvhtesthost (vithost/vh_testhost.h), the host a
 * plugin's own unit tests link, on the in-tree mta optimizer, the synthetic
 * data plugin and the test plugin of every role. This test links the test
 * host and libvhsdk only, as a plugin's tests outside the tree do: no vhhost.
 */
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

#include <vithost/vh_testhost.h>

#define PLUGIN(name) VH_TEST_PLUGIN_DIR "/" name ".so"

static vh_testhost *open_plugin(const char *path) {
    vh_testhost *th = NULL;
    char err[512];
    if (vh_testhost_open(path, &th, err, sizeof err) != VH_STATUS_OK) fail_msg("%s", err);
    return th;
}

static void ok(vh_testhost *th, vh_status st) {
    if (st != VH_STATUS_OK) fail_msg("%s: %s", vh_status_str(st), vh_testhost_error(th));
}

static const float W0[5] = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f};
static const float G0[5] = {0.5f, 0.25f, -1.0f, 2.0f, -0.125f};

/* mta as plain SGD (no momentum, no decay), lr 0.1 at every step. */
static vh_testhost *mta_sgd(void) {
    vh_testhost *th = open_plugin(PLUGIN("mta"));
    ok(th, vh_testhost_set(th, "algo=sgd"));
    ok(th, vh_testhost_set(th, "momentum=0"));
    ok(th, vh_testhost_set(th, "lr=0.1")); /* the SDK's shared keys (ABI 2.1) */
    ok(th, vh_testhost_set(th, "schedule=constant"));
    ok(th, vh_testhost_set(th, "weight_decay=0"));
    return th;
}

static const vh_optim_step_args STEP0 = {.step = 0, .lr = 0.1};

/* w <- w - lr * g on two tensors, one slice each, as the host hands them. */
static void test_mta_sgd_step(void **state) {
    (void)state;
    vh_testhost *th = mta_sgd();
    int a = vh_testhost_optim_add(th, 5, 0, W0);
    int b = vh_testhost_optim_add(th, 3, VH_PARAM_FLAG_DECAY, W0);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    ok(th, vh_testhost_create(th, NULL));
    memcpy(vh_testhost_optim_grad(th, a), G0, sizeof G0);
    memcpy(vh_testhost_optim_grad(th, b), G0, 3 * sizeof(float));
    double lr = 0;
    ok(th, vh_testhost_optim_step(th, &STEP0, &lr));
    assert_true(fabs(lr - 0.1) < 1e-12);
    for (int i = 0; i < 5; i++)
        assert_float_equal(vh_testhost_optim_values(th, a)[i], W0[i] - 0.1f * G0[i], 1e-6);
    for (int i = 0; i < 3; i++)
        assert_float_equal(vh_testhost_optim_values(th, b)[i], W0[i] - 0.1f * G0[i], 1e-6);
    vh_testhost_close(th);
}

/* Items larger than this SDK's slice (a newer sharding plugin's): the same
 * update, bit for bit. */
static void test_mta_wide_slices(void **state) {
    (void)state;
    float got[2][5];
    for (int wide = 0; wide < 2; wide++) {
        vh_testhost *th = mta_sgd();
        if (wide) ok(th, vh_testhost_optim_item_size(th, sizeof(vh_param_slice) + 32));
        int t = vh_testhost_optim_add(th, 5, 0, W0);
        ok(th, vh_testhost_create(th, NULL));
        memcpy(vh_testhost_optim_grad(th, t), G0, sizeof G0);
        ok(th, vh_testhost_optim_step(th, &STEP0, NULL));
        memcpy(got[wide], vh_testhost_optim_values(th, t), sizeof got[wide]);
        vh_testhost_close(th);
    }
    assert_memory_equal(got[0], got[1], sizeof got[0]);
    vh_testhost *th = mta_sgd();
    assert_int_equal(vh_testhost_optim_item_size(th, 8), VH_STATUS_ERR_INVALID_ARG);
    vh_testhost_close(th);
}

/* AdamW for 3 steps, once straight and once with a resume (state save,
 * new instance, load) after step 1: the same values and state, bit for bit. */
static void adamw_run(int resume, float *values, float *m) {
    vh_testhost *th = open_plugin(PLUGIN("mta"));
    ok(th, vh_testhost_set(th, "algo=adamw"));
    ok(th, vh_testhost_set(th, "lr=0.01"));
    ok(th, vh_testhost_set(th, "schedule=constant"));
    int t = vh_testhost_optim_add(th, 5, VH_PARAM_FLAG_DECAY, W0);
    ok(th, vh_testhost_create(th, NULL));
    for (int64_t step = 0; step < 3; step++) {
        for (int i = 0; i < 5; i++)
            vh_testhost_optim_grad(th, t)[i] = G0[i] * (float)(step + 1);
        vh_optim_step_args args = {.step = step, .lr = 0.01, .weight_decay = 0.05};
        ok(th, vh_testhost_optim_step(th, &args, NULL));
        if (resume && step == 1) ok(th, vh_testhost_state_roundtrip(th));
    }
    memcpy(values, vh_testhost_optim_values(th, t), 5 * sizeof(float));
    memcpy(m, vh_testhost_optim_state(th, t, 0), 5 * sizeof(float));
    vh_testhost_close(th);
}

static void test_mta_adamw_resume(void **state) {
    (void)state;
    float v[2][5], m[2][5];
    adamw_run(0, v[0], m[0]);
    adamw_run(1, v[1], m[1]);
    assert_memory_equal(v[0], v[1], sizeof v[0]);
    assert_memory_equal(m[0], m[1], sizeof m[0]);
    for (int i = 0; i < 5; i++) {
        assert_true(v[0][i] != W0[i]);
        assert_true(m[0][i] != 0.0f); /* the first moment lives in state slot 0 */
    }
}

/* Without args a step is what the host would hand over: the next step and
 * the SDK schedule's rate from the shared keys (a warm-up here). */
static void test_mta_schedule_from_config(void **state) {
    (void)state;
    vh_testhost *th = mta_sgd();
    ok(th, vh_testhost_set(th, "warmup_steps=2"));
    int t = vh_testhost_optim_add(th, 5, 0, W0);
    ok(th, vh_testhost_create(th, NULL));
    static const double want[4] = {0.0, 0.05, 0.1, 0.1};
    for (int step = 0; step < 4; step++) {
        memcpy(vh_testhost_optim_grad(th, t), G0, sizeof G0);
        double lr = -1;
        ok(th, vh_testhost_optim_step(th, NULL, &lr));
        assert_true(fabs(lr - want[step]) < 1e-12);
    }
    /* w - (0 + 0.05 + 0.1 + 0.1) g */
    for (int i = 0; i < 5; i++)
        assert_float_equal(vh_testhost_optim_values(th, t)[i], W0[i] - 0.25f * G0[i], 1e-6);
    vh_testhost_close(th);
}

/* A 2.0 optimizer gets no shared keys (its step computes its own rate). */
static void test_abi20_optim_has_own_keys(void **state) {
    (void)state;
    vh_testhost *th = open_plugin(VH_TEST_ABI20_DIR "/abi20_optim.so");
    assert_int_equal(vh_testhost_descriptor(th)->abi_minor, 0);
    assert_int_equal(vh_testhost_set(th, "warmup_steps=2"), VH_STATUS_ERR_CONFIG);
    ok(th, vh_testhost_set(th, "lr=0.5")); /* its own key */
    int t = vh_testhost_optim_add(th, 5, 0, W0);
    ok(th, vh_testhost_create(th, NULL));
    memcpy(vh_testhost_optim_grad(th, t), G0, sizeof G0);
    double lr = 0;
    ok(th, vh_testhost_optim_step(th, NULL, &lr));
    assert_true(fabs(lr - 0.5) < 1e-6);
    assert_float_equal(vh_testhost_optim_values(th, t)[0], W0[0] - 0.5f * G0[0], 1e-6);
    vh_testhost_close(th);
}

/* Values are checked against the schema as a recipe's are; the plugin's own
 * refusals (config_fail) come back with the key and the value. */
static void test_config_checks(void **state) {
    (void)state;
    vh_testhost *th = open_plugin(PLUGIN("mta"));
    assert_int_equal(vh_testhost_set(th, "alg=sgd"), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(vh_testhost_error(th), "unknown key"));
    assert_non_null(strstr(vh_testhost_error(th), "algo"));
    assert_int_equal(vh_testhost_set(th, "algo=adam"), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(vh_testhost_error(th), "not one of"));
    assert_int_equal(vh_testhost_set(th, "momentum=fast"), VH_STATUS_ERR_CONFIG);
    assert_int_equal(vh_testhost_set(th, "nesterov=maybe"), VH_STATUS_ERR_CONFIG);
    assert_int_equal(vh_testhost_set(th, "noequals"), VH_STATUS_ERR_INVALID_ARG);
    ok(th, vh_testhost_set(th, "algo=sgd"));
    ok(th, vh_testhost_set(th, "momentum=0"));
    ok(th, vh_testhost_set(th, "nesterov=true")); /* Nesterov needs momentum > 0 */
    assert_int_equal(vh_testhost_create(th, NULL), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(vh_testhost_error(th), "optim.nesterov (set to true)"));
    assert_null(vh_testhost_self(th));
    vh_testhost_close(th);
}

/* The host table: log lines kept, the seed, the CPU device, one rank. */
static void test_host_services(void **state) {
    (void)state;
    vh_testhost *th = open_plugin(PLUGIN("mta"));
    vh_host *h = vh_testhost_host(th);
    vh_testhost_set_seed(th, 42);
    h->api->log(h, VH_LOG_LEVEL_WARN, "x=%d", 3);
    assert_string_equal(vh_testhost_log(th), "warning: x=3\n");
    vh_testhost_log_clear(th);
    assert_string_equal(vh_testhost_log(th), "");
    assert_int_equal(h->api->seed(h), 42);
    assert_int_equal(h->api->device(h)->kind, VH_DEVICE_KIND_CPU);
    assert_int_equal(h->api->comm(h)->world_size, 1);
    assert_int_equal(h->api->config_has(h, "beta1"), 1);
    double b1 = 0;
    ok(th, h->api->config_float(h, "beta1", &b1));
    assert_true(b1 == 0.9);
    int64_t wrong = 0;
    assert_int_equal(h->api->config_int(h, "beta1", &wrong), VH_STATUS_ERR_INTERNAL);
    vh_testhost_close(th);
}

static void test_open_errors(void **state) {
    (void)state;
    vh_testhost *th = NULL;
    char err[512];
    assert_int_equal(vh_testhost_open("/nonexistent/x.so", &th, err, sizeof err),
                     VH_STATUS_ERR_IO);
    assert_null(th);
    assert_int_not_equal(vh_testhost_open(VH_TEST_BROKEN_DIR "/bad_magic.so", &th, err,
                                          sizeof err),
                         VH_STATUS_OK);
    assert_null(th);
    /* By name through VITHOST_PLUGIN_PATH, as vithost finds it. */
    setenv("VITHOST_PLUGIN_PATH", "/nonexistent:" VH_TEST_PLUGIN_DIR, 1);
    th = open_plugin("synthetic");
    assert_string_equal(vh_testhost_descriptor(th)->name, "synthetic");
    vh_testhost_close(th);
}

/* ---- data ------------------------------------------------------------------ */

static vh_testhost *synthetic(int workers) {
    vh_testhost *th = open_plugin(PLUGIN("synthetic"));
    static const char *const kv[] = {"channels=1", "image_size=4", "num_classes=3",
                                     "train_size=32", "eval_size=10", "pool_size=8"};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) ok(th, vh_testhost_set(th, kv[i]));
    char w[32];
    snprintf(w, sizeof w, "workers=%d", workers);
    ok(th, vh_testhost_set(th, w));
    vh_data_setup setup = {.struct_size = sizeof setup, .world_size = 1, .batch_size = 8,
                           .seed = 7};
    ok(th, vh_testhost_create(th, &setup));
    return th;
}

static void test_data_passes(void **state) {
    (void)state;
    for (int workers = 0; workers < 2; workers++) {
        vh_testhost *th = synthetic(workers);
        vh_data_info info;
        ok(th, vh_testhost_data_info(th, &info));
        assert_int_equal(info.channels, 1);
        assert_int_equal(info.height, 4);
        assert_int_equal(info.num_classes, 3);
        int64_t batches = 0, samples = 0;
        ok(th, vh_testhost_data_pass(th, VH_SPLIT_TRAIN, 0, &batches, &samples));
        assert_int_equal(batches, 4);
        assert_int_equal(samples, 32);
        ok(th, vh_testhost_data_pass(th, VH_SPLIT_EVAL, 0, &batches, &samples));
        assert_int_equal(batches, 2); /* 8 + a short 2 */
        assert_int_equal(samples, 10);
        vh_testhost_close(th);
    }
}

/* Two batches of epoch 1, a resume, the rest: the batches an unbroken pass
 * yields, bit for bit. */
static void pass_labels(int resume, int32_t *labels, float *pixel0) {
    vh_testhost *th = synthetic(1);
    ok(th, vh_testhost_data_start(th, VH_SPLIT_TRAIN, 1));
    for (int i = 0; i < 4; i++) {
        if (resume && i == 2) ok(th, vh_testhost_state_roundtrip(th));
        vh_batch b;
        int has = 0;
        ok(th, vh_testhost_data_next(th, &b, &has));
        assert_true(has);
        memcpy(labels + 8 * i, b.labels.data, 8 * sizeof(int32_t));
        pixel0[i] = ((const float *)b.images.data)[0];
    }
    vh_batch b;
    int has = 1;
    ok(th, vh_testhost_data_next(th, &b, &has));
    assert_false(has);
    vh_testhost_close(th);
}

static void test_data_resume(void **state) {
    (void)state;
    int32_t labels[2][32];
    float pixels[2][4];
    pass_labels(0, labels[0], pixels[0]);
    pass_labels(1, labels[1], pixels[1]);
    assert_memory_equal(labels[0], labels[1], sizeof labels[0]);
    assert_memory_equal(pixels[0], pixels[1], sizeof pixels[0]);
}

/* ---- every role: create with the default setup, state, destroy ------------------ */

static void test_every_role(void **state) {
    (void)state;
    static const char *const names[] = {"test_model", "test_precision", "test_sharding",
                                        "test_optim", "test_data", "fp32", "mta"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.so", VH_TEST_PLUGIN_DIR, names[i]);
        vh_testhost *th = open_plugin(path);
        ok(th, vh_testhost_create(th, NULL));
        assert_non_null(vh_testhost_self(th));
        assert_int_equal(vh_testhost_create(th, NULL), VH_STATUS_ERR_INVALID_ARG);
        vh_status st = vh_testhost_state_roundtrip(th);
        if (vh_testhost_descriptor(th)->role == VH_ROLE_SHARDING)
            assert_int_equal(st, VH_STATUS_ERR_UNSUPPORTED);
        else
            ok(th, st);
        vh_testhost_destroy(th);
        assert_null(vh_testhost_self(th));
        vh_testhost_close(th);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mta_sgd_step),   cmocka_unit_test(test_mta_wide_slices),
        cmocka_unit_test(test_mta_adamw_resume), cmocka_unit_test(test_mta_schedule_from_config),
        cmocka_unit_test(test_abi20_optim_has_own_keys), cmocka_unit_test(test_config_checks),
        cmocka_unit_test(test_host_services),  cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_data_passes),    cmocka_unit_test(test_data_resume),
        cmocka_unit_test(test_every_role),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
