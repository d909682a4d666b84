/* test_ema.c - the EMA of the weights (host/train/ema.h): the update against
 * a hand-computed sequence (decay, warm-up, every, skipped steps); a run's
 * checkpoints against the same rule; resume bit for bit; both top-1s in
 * metrics.jsonl and on the console; the exported file; the key's checks;
 * under 2-process FSDP when mpirun is there. */
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

#include "ema.h"
#include "harness.h"
#include "safetensors.h"

static char tmp_dir[256];

#define vithost(...) harness_sh(tmp_dir, "OMP_NUM_THREADS=1 " VH_TEST_VITHOST " " __VA_ARGS__)
#define MPIRUN VH_TEST_MPIRUN " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1"

/* harness_tiny_vit with evaluations, logging and an EMA that updates every
 * 2nd step after 3 warm-up steps. */
static const char recipe[] =
    "run: {steps: 8, batch_size: 8, eval_every: 1, log_every: 4, peak_tflops: 0.5}\n"
    "model: {plugin: vit, dim: 16, depth: 1, heads: 2, mlp_dim: 32, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: adamw, lr: 1.0e-2, ema_decay: 0.9, ema_warmup_steps: 3,\n"
    "        ema_every: 2}\n"
    "data: {plugin: synthetic, channels: 1, image_size: 8, num_classes: 4, train_size: 32,\n"
    "       eval_size: 8, workers: 0}\n";

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "ema") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    return harness_write(tmp_dir, "r.yaml", recipe);
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

/* ---- the rule, by hand ------------------------------------------------------ */

static void test_decay_rule(void **state) {
    (void)state;
    vh_ema_config c = {.decay = 0.9, .warmup_steps = 3, .every = 2};
    /* warm-up: min(decay, (1 + n) / (10 + n)) up to step 3, then decay */
    assert_true(ema_decay_at(&c, 1, 0) == 0.1);
    assert_true(fabs(ema_decay_at(&c, 3, 5) - 6.0 / 15.0) < 1e-15);
    assert_true(ema_decay_at(&c, 3, 1000) == 0.9); /* 1001/1010 > 0.9 */
    assert_true(ema_decay_at(&c, 4, 0) == 0.9);
    /* every 2nd step, never a skipped one, never when off */
    assert_false(ema_due(&c, 1, 0));
    assert_true(ema_due(&c, 2, 0));
    assert_false(ema_due(&c, 2, 1));
    vh_ema_config off = {.decay = 0.0, .every = 1};
    assert_false(ema_due(&off, 2, 0));
    /* the lerp: 0 -> 1 with decay 0.5 three times, exactly */
    float e = 0.0f, w = 1.0f;
    const float want[3] = {0.5f, 0.75f, 0.875f};
    for (int i = 0; i < 3; i++) {
        ema_lerp(&e, &w, 1, 0.5);
        assert_true(e == want[i]);
    }
}

/* Weights w_t = t after step t, average from w_0 = 0; decay 0.9, warm-up 3
 * steps, every 2, step 6 skipped. By hand:
 *   step 2: d = min(0.9, 1/10) = 0.1:  e = 0.1 * 0 + 0.9 * 2       = 1.8
 *   step 4: d = 0.9 (after warm-up):   e = 0.9 * 1.8 + 0.1 * 4     = 2.02
 *   step 6: skipped: no update
 *   step 8: d = 0.9:                   e = 0.9 * 2.02 + 0.1 * 8    = 2.618 */
static void test_hand_computed_sequence(void **state) {
    (void)state;
    vh_ema_config c = {.decay = 0.9, .warmup_steps = 3, .every = 2};
    float e[2] = {0.0f, -4.0f}; /* a second element from another start */
    int64_t n = 0;
    const double want[9] = {0, 0, 1.8, 1.8, 2.02, 2.02, 2.02, 2.02, 2.618};
    for (int64_t t = 1; t <= 8; t++) {
        float w[2] = {(float)t, (float)t};
        if (ema_due(&c, t, t == 6)) ema_lerp(e, w, 2, ema_decay_at(&c, t, n++));
        assert_true(fabs(e[0] - want[t]) < 1e-6);
    }
    assert_int_equal(n, 3);
    /* the second: -4 -> 0.1*-4 + 1.8 = 1.4 -> 0.9*1.4 + 0.4 = 1.66 -> 0.9*1.66 + 0.8 */
    assert_true(fabs(e[1] - (0.9 * 1.66 + 0.8)) < 1e-6);
}

/* ---- a run ------------------------------------------------------------------- */

/* Every tensor of a safetensors file under tmp_dir as f32, in file order. */
static float *tensors_of(const char *rel, int64_t *n) {
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", tmp_dir, rel);
    float *v = harness_safetensors_f32(path, n, err, sizeof err);
    if (!v) fail_msg("%s", err);
    return v;
}

/* Two files of tmp_dir, byte for byte. */
static int same_file(const char *a, const char *b) {
    return harness_sh(tmp_dir, "cmp -s %s %s", a, b) == 0;
}

#define CK(step, file) "checkpoints/step-0000000" #step "/" file

/* Checkpoints of steps 6, 7 and 8 (every 1, decay 0.5, no warm-up): the
 * averages of steps 7 and 8 are the rule applied to the step's weights, in
 * fp32, bit for bit. */
static void test_run_follows_the_rule(void **state) {
    (void)state;
    assert_int_equal(vithost("run r.yaml --out k --set run.checkpoint_every=1 "
                             "--set run.keep_checkpoints=0 --set optim.ema_decay=0.5 "
                             "--set optim.ema_warmup_steps=0 --set optim.ema_every=1"),
                     0);
    int64_t n6, n7, nw7, nw8, n8;
    float *e6 = tensors_of("k/" CK(6, "ema.safetensors"), &n6);
    float *e7 = tensors_of("k/" CK(7, "ema.safetensors"), &n7);
    float *w7 = tensors_of("k/" CK(7, "model.safetensors"), &nw7);
    float *w8 = tensors_of("k/" CK(8, "model.safetensors"), &nw8);
    float *e8 = tensors_of("k/" CK(8, "ema.safetensors"), &n8);
    assert_int_equal(n6, nw7);
    assert_int_equal(n8, nw8);
    double moved = 0.0;
    for (int64_t i = 0; i < n8; i++) {
        float want7 = e6[i] + 0.5f * (w7[i] - e6[i]);
        float want8 = e7[i] + 0.5f * (w8[i] - e7[i]);
        assert_true(e7[i] == want7);
        assert_true(e8[i] == want8);
        moved += fabs((double)e8[i] - (double)w8[i]);
    }
    assert_true(moved > 0.0); /* the average is not the weights */
    free(e6), free(e7), free(w7), free(w8), free(e8);
}

static void test_resume_is_bitwise(void **state) {
    (void)state;
    assert_int_equal(vithost("run r.yaml --out full"), 0);
    assert_int_equal(vithost("run r.yaml --out split --stop-after 3"), 5);
    assert_int_equal(vithost("run r.yaml --out split --resume"), 0);
    assert_true(same_file("full/" CK(8, "ema.safetensors"), "split/" CK(8, "ema.safetensors")));
    assert_true(same_file("full/" CK(8, "model.safetensors"), "split/" CK(8, "model.safetensors")));
    char *a = harness_read(tmp_dir, "full/" CK(8, "state.json"));
    assert_non_null(strstr(a, "\"ema_updates\": 4")); /* after steps 2, 4, 6 and 8 */
    free(a);
}

static void test_metrics_and_console_show_both(void **state) {
    (void)state;
    assert_int_equal(vithost("run r.yaml --out m"), 0);
    char *out = harness_read(tmp_dir, "out");
    assert_non_null(strstr(out, "eval  step 8 epoch 1: top1 "));
    assert_non_null(strstr(out, "; ema top1 "));
    assert_non_null(strstr(out, "(ema "));
    char *text = harness_read(tmp_dir, "m/metrics.jsonl");
    int evals = 0;
    double ema_loss = NAN;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (!strstr(l, "eval_top1")) continue;
        evals++;
        assert_true(isfinite(harness_json_number(l, "ema_top1")));
        assert_true(isfinite(harness_json_number(l, "ema_top5")));
        ema_loss = harness_json_number(l, "ema_loss");
        assert_true(isfinite(ema_loss));
        assert_true(ema_loss != harness_json_number(l, "eval_loss"));
    }
    assert_int_equal(evals, 2);
    /* the checkpoint's ema.safetensors is a weights file: eval gives the same loss */
    assert_int_equal(vithost("eval r.yaml --checkpoint m/" CK(8, "ema.safetensors")), 0);
    char *json = harness_read(tmp_dir, "out");
    assert_true(fabs(harness_json_number(json, "eval_loss") - ema_loss) < 1e-5);
    free(json);
    /* and the EMA leaves the raw weights alone */
    assert_int_equal(vithost("run r.yaml --out raw --set optim.ema_decay=0"), 0);
    assert_true(same_file("raw/" CK(8, "model.safetensors"), "m/" CK(8, "model.safetensors")));
    char *raw = harness_read(tmp_dir, "raw/metrics.jsonl");
    assert_null(strstr(raw, "ema_top1"));
    free(raw);
    free(text);
    free(out);
}

static void test_bad_keys(void **state) {
    (void)state;
    assert_int_not_equal(vithost("run r.yaml --out b --set optim.ema_decay=1"), 0);
    char *err = harness_read(tmp_dir, "err");
    assert_non_null(strstr(err, "optim.ema_decay is 1"));
    free(err);
    assert_int_not_equal(vithost("check r.yaml --set optim.ema_every=0"), 0);
    err = harness_read(tmp_dir, "err");
    assert_non_null(strstr(err, "ema_every"));
    free(err);
    /* a resume must keep the EMA the run started with */
    assert_int_equal(vithost("run r.yaml --out c --stop-after 2"), 5);
    assert_int_not_equal(vithost("run r.yaml --out c --resume --set optim.ema_decay=0.5"), 0);
}

/* 2-process FSDP: each rank keeps its shard; resume is bitwise and the
 * average is the one-process run's (fp32 sums in another order). */
static void test_fsdp_two_processes(void **state) {
    (void)state;
    if (strlen(VH_TEST_MPIRUN) == 0) {
        printf("test_ema: SKIPPED the FSDP case: mpirun not found at configure time\n");
        return;
    }
    const char *fsdp = "--set sharding.plugin=fsdp --set run.batch_size=4";
    assert_int_equal(vithost("run r.yaml --out one"), 0);
    assert_int_equal(harness_sh(tmp_dir, MPIRUN " -np 2 %s run r.yaml --out f %s",
                                VH_TEST_VITHOST, fsdp), 0);
    assert_int_equal(harness_sh(tmp_dir, MPIRUN " -np 2 %s run r.yaml --out fs %s --stop-after 3",
                                VH_TEST_VITHOST, fsdp), 5);
    assert_int_equal(harness_sh(tmp_dir, MPIRUN " -np 2 %s run r.yaml --out fs %s --resume",
                                VH_TEST_VITHOST, fsdp), 0);
    assert_true(same_file("f/" CK(8, "ema.safetensors"), "fs/" CK(8, "ema.safetensors")));
    int64_t na, nb;
    float *a = tensors_of("one/" CK(8, "ema.safetensors"), &na);
    float *b = tensors_of("f/" CK(8, "ema.safetensors"), &nb);
    assert_int_equal(na, nb);
    /* 1e-4 absolute: the key bias's gradient is zero in exact arithmetic
     * (softmax ignores a constant added to a row's scores), so its values
     * (~1e-6) are rounding noise that Adam turns into steps, and any change
     * of summation order moves them by ~1e-5; every other value agrees to
     * 1e-5 relative. */
    for (int64_t i = 0; i < na; i++)
        if (fabsf(a[i] - b[i]) > 1e-4f + 1e-5f * fabsf(a[i]))
            fail_msg("element %lld: %g (1 process) vs %g (FSDP)", (long long)i, a[i], b[i]);
    free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decay_rule),
        cmocka_unit_test(test_hand_computed_sequence),
        cmocka_unit_test_setup_teardown(test_run_follows_the_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_is_bitwise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_and_console_show_both, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fsdp_two_processes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
