/* test_grad_accum.c - gradient accumulation (run.grad_accum, ABI 2.2's
 * sharding set_sync): K micro-batches of b give the update of one batch of
 * K x b (fp32: losses and parameters within 1e-5 relative) on one process,
 * across an epoch whose trailing micro-batch fills no step (dropped, as the
 * sampler drops the big batch's rest), and under 2-process DDP and FSDP
 * (mpirun, when found at configure time); a resume is bitwise, one with
 * another grad_accum is refused; a 2.0 sharding plugin is refused naming it;
 * the banner and metrics show the global batch. The sampler hands a rank
 * consecutive positions of one permutation, so K consecutive micro-batches
 * of b hold exactly the samples of one batch of K x b (vh_sampler.h). */
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
#include "safetensors.h"

static char tmp_dir[256];
static double worst; /* the largest relative difference seen, printed at the end */

#define vithost(...) harness_sh(tmp_dir, "OMP_NUM_THREADS=1 " VH_TEST_VITHOST " " __VA_ARGS__)
#define MPIRUN VH_TEST_MPIRUN " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1"

/* 44 samples: a batch of 8 takes 5 steps a pass and drops 4 samples; 11
 * micro-batches of 4 with K = 2 make the same 5 steps and drop the 11th.
 * 12 steps cross two pass boundaries. No dropout; SGD with momentum and
 * AdamW both. */
static const char recipe[] =
    "run: {steps: 12, batch_size: 8, eval_every: 0, log_every: 1, peak_tflops: 0.5}\n"
    "model: {plugin: vit, dim: 16, depth: 2, heads: 2, mlp_dim: 32, patch_size: 4,\n"
    "        dropout: 0, drop_path: 0}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: sgd, lr: 0.1, momentum: 0.9}\n"
    "data: {plugin: synthetic, channels: 1, image_size: 8, num_classes: 4, train_size: 44,\n"
    "       eval_size: 8, workers: 0}\n";

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "accum") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    return harness_write(tmp_dir, "r.yaml", recipe);
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

#define FINAL "/checkpoints/step-00000012/model.safetensors"

/* Every tensor of a run's final model.safetensors as f32, in file order. */
static float *weights_of(const char *run, int64_t *n) {
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s" FINAL, tmp_dir, run);
    float *v = harness_safetensors_f32(path, n, err, sizeof err);
    if (!v) fail_msg("%s", err);
    return v;
}

/* |a - b| relative to the larger, with a floor for elements near zero (an
 * absolute 1e-5 * 1e-2 there). */
static double rel(double a, double b) {
    double m = fmax(fmax(fabs(a), fabs(b)), 1e-2);
    return fabs(a - b) / m;
}

static void note(double r) {
    if (r > worst) worst = r;
}

/* Two runs' losses step by step and final parameters, within 1e-5. */
static void assert_same_training(const char *a, const char *b) {
    char name[300];
    snprintf(name, sizeof name, "%s/metrics.jsonl", a);
    char *ma = harness_read(tmp_dir, name);
    snprintf(name, sizeof name, "%s/metrics.jsonl", b);
    char *mb = harness_read(tmp_dir, name);
    int steps = 0;
    char *sa = NULL, *sb = NULL;
    for (char *la = strtok_r(ma, "\n", &sa), *lb = strtok_r(mb, "\n", &sb); la && lb;
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        double x = harness_json_number(la, "loss"), y = harness_json_number(lb, "loss");
        assert_true(isfinite(x) && isfinite(y));
        note(rel(x, y));
        if (rel(x, y) > 1e-5)
            fail_msg("%s vs %s, step %d: loss %.9g vs %.9g", a, b, steps + 1, x, y);
        steps++;
    }
    assert_int_equal(steps, 12);
    free(ma), free(mb);
    int64_t na, nb;
    float *wa = weights_of(a, &na), *wb = weights_of(b, &nb);
    assert_int_equal(na, nb);
    double moved = 0.0;
    for (int64_t i = 0; i < na; i++) {
        note(rel(wa[i], wb[i]));
        if (rel(wa[i], wb[i]) > 1e-5)
            fail_msg("%s vs %s, parameter element %lld: %.9g vs %.9g", a, b, (long long)i,
                     (double)wa[i], (double)wb[i]);
        moved += fabs((double)wa[i]);
    }
    assert_true(moved > 0.0);
    free(wa), free(wb);
}

static void test_one_process(void **state) {
    (void)state;
    assert_int_equal(vithost("run r.yaml --out k1"), 0);
    assert_int_equal(vithost("run r.yaml --out k2 --set run.batch_size=4 --set run.grad_accum=2"),
                     0);
    /* the banner: the global batch and the micro-batches */
    char *out = harness_read(tmp_dir, "out");
    assert_non_null(strstr(out, "epochs of 5 steps, batch 8)"));
    assert_non_null(strstr(out, "2 micro-batches of 4 per step (run.grad_accum)"));
    free(out);
    assert_int_equal(vithost("run r.yaml --out k4 --set run.batch_size=2 --set run.grad_accum=4"),
                     0);
    assert_same_training("k1", "k2");
    assert_same_training("k1", "k4");
    /* metrics: the global batch is micro x K x world */
    char *m = harness_read(tmp_dir, "k4/metrics.jsonl");
    assert_true(harness_json_number(m, "global_batch") == 8.0);
    free(m);
    /* AdamW too (its update divides by the gradient's size: a test of the mean) */
    /* (eps 1e-4: an element whose gradient is rounding noise, ~1e-9, would
     * otherwise move by lr x sign(noise) in either run) */
    const char *adamw = "--set optim.algo=adamw --set optim.lr=0.01 --set optim.eps=1e-4";
    assert_int_equal(vithost("run r.yaml --out a1 %s", adamw), 0);
    assert_int_equal(vithost("run r.yaml --out a2 %s --set run.batch_size=4 "
                             "--set run.grad_accum=2", adamw), 0);
    assert_same_training("a1", "a2");
    /* and accumulation is not a no-op: a batch of 4 alone trains otherwise */
    assert_int_equal(vithost("run r.yaml --out b4 --set run.batch_size=4"), 0);
    int64_t na, nb;
    float *wa = weights_of("k1", &na), *wb = weights_of("b4", &nb);
    double diff = 0.0;
    for (int64_t i = 0; i < na; i++) diff = fmax(diff, rel(wa[i], wb[i]));
    assert_true(diff > 1e-3);
    free(wa), free(wb);
}

/* Checkpoints fall between optimizer steps: a stop and resume is the same
 * run bit for bit; another grad_accum on resume is refused, naming it. */
static void test_resume(void **state) {
    (void)state;
    const char *k2 = "--set run.batch_size=4 --set run.grad_accum=2";
    assert_int_equal(vithost("run r.yaml --out full %s", k2), 0);
    assert_int_equal(vithost("run r.yaml --out split %s --stop-after 7", k2), 5);
    assert_int_equal(vithost("run r.yaml --out split %s --resume", k2), 0);
    assert_int_equal(harness_sh(tmp_dir, "cmp -s full" FINAL " split" FINAL), 0);
    assert_int_equal(vithost("run r.yaml --out split2 %s --stop-after 3", k2), 5);
    assert_int_not_equal(vithost("run r.yaml --out split2 --set run.batch_size=4 --resume"), 0);
    char *err = harness_read(tmp_dir, "err");
    assert_non_null(strstr(err, "run.grad_accum is 1 now, but split2 was started with 2"));
    free(err);
}

/* A 2.0 sharding plugin has no set_sync: K > 1 is refused, naming it;
 * K = 1 still trains with it (test_abi20 covers the rest). Bad values. */
static void test_refusals(void **state) {
    (void)state;
    assert_int_equal(vithost("run r.yaml --out old --set run.grad_accum=2 --set run.batch_size=4 "
                             "--set sharding.plugin=" VH_TEST_ABI20_DIR "/abi20_sharding.so"),
                     3);
    char *err = harness_read(tmp_dir, "err");
    assert_non_null(strstr(err, "run.grad_accum is 2, but sharding plugin 'abi20_sharding' "
                                "(ABI 2.0) has no set_sync"));
    free(err);
    assert_int_not_equal(vithost("check r.yaml --set run.grad_accum=0"), 0);
    err = harness_read(tmp_dir, "err");
    assert_non_null(strstr(err, "grad_accum"));
    free(err);
    /* fewer samples than one step */
    assert_int_not_equal(vithost("run r.yaml --out few --set run.grad_accum=8"), 0);
    err = harness_read(tmp_dir, "err");
    assert_non_null(strstr(err, "lower run.batch_size or run.grad_accum"));
    free(err);
}

/* 2 processes of 2 micro-batches of 2: the global batch of 8 of one
 * process's run (rank r takes the permutation's positions r, r + 2, ...,
 * so a step's 8 samples are the same), under DDP and FSDP; and the
 * communication is once per step: DDP's bytes per step equal K = 1's. */
static void test_two_processes(void **state) {
    (void)state;
    if (strlen(VH_TEST_MPIRUN) == 0) {
        printf("test_grad_accum: SKIPPED the 2-process cases: mpirun not found at configure "
               "time\n");
        return;
    }
    assert_int_equal(vithost("run r.yaml --out one"), 0);
    const char *k2 = "--set run.batch_size=2 --set run.grad_accum=2";
    const char *plugins[2] = {"ddp", "fsdp"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(harness_sh(tmp_dir, MPIRUN " -np 2 %s run r.yaml --out %s %s "
                                    "--set sharding.plugin=%s",
                                    VH_TEST_VITHOST, plugins[i], k2, plugins[i]),
                         0);
        assert_same_training("one", plugins[i]);
    }
    assert_int_equal(harness_sh(tmp_dir, MPIRUN " -np 2 %s run r.yaml --out d1 "
                                "--set run.batch_size=4", VH_TEST_VITHOST), 0);
    char *a = harness_read(tmp_dir, "d1/metrics.jsonl");
    char *b = harness_read(tmp_dir, "ddp/metrics.jsonl");
    double ba = harness_json_number(a, "comm_bytes_per_step");
    double bb = harness_json_number(b, "comm_bytes_per_step");
    assert_true(ba > 0.0);
    assert_true(ba == bb);
    assert_true(harness_json_number(b, "global_batch") == 8.0);
    free(a), free(b);
}

static int report(void **state) {
    (void)state;
    printf("test_grad_accum: largest relative difference (losses and parameters): %.3g\n",
           worst);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_processes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, report);
}
