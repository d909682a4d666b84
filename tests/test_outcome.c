/* test_outcome.c - a run's outcome is a fact: steps that do not train stop
 * the run with exit 1, the cause and the last good checkpoint, never
 * `finished`; precision.backoff_factor 0 is refused; a checkpoint taken in
 * the middle of an epoch (run.steps, final evaluation) resumes and extends
 * with the same numbers as an uninterrupted run, on one process and on two;
 * a run.peak_tflops below the run's own rate is said. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char tmp_dir[256];

#define vithost(...) harness_sh(tmp_dir, VH_TEST_VITHOST " " __VA_ARGS__)

/* A tiny vit on synthetic data: 20 steps an epoch, a constant rate (a
 * longer run must not change the rate of the steps before); peak_tflops
 * set, so no run spends time measuring the CPU. */
static const char recipe[] =
    "run: {epochs: 1, batch_size: 8, log_every: 1, eval_every: 1, peak_tflops: 1}\n"
    "model: {plugin: vit, dim: 16, depth: 1, heads: 2, mlp_dim: 32, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: adamw, lr: 1.0e-3, schedule: constant}\n"
    "data: {plugin: synthetic, channels: 3, image_size: 8, num_classes: 5, train_size: 160,\n"
    "       eval_size: 16}\n";

/* Every step overflows: a fixed loss scale near FLT_MAX. */
#define STATIC_HUGE "--set 'precision={plugin: amp, dtype: fp16, loss_scaling: static, " \
                    "init_scale: 3e38}'"

static void write_file(const char *name, const void *data, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "outcome") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    write_file("r.yaml", recipe, strlen(recipe));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

static int exists(const char *name) {
    char path[1024];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    return stat(path, &sb) == 0;
}

/* Fails unless the run's stderr holds `want`. */
static void err_has(const char *want) {
    char *err = tmp_text("err");
    if (!strstr(err, want)) fail_msg("'%s' not in:\n%s", want, err);
    free(err);
}

/* A failed run: exit 1, never `finished`, on either stream. */
static void failed_run(int code) {
    assert_int_equal(code, 1);
    char *out = tmp_text("out"), *err = tmp_text("err");
    if (strstr(out, "finished") || strstr(err, "finished"))
        fail_msg("a failed run said finished:\n%s\n%s", out, err);
    free(out);
    free(err);
}

/* ---- the reported rate ------------------------------------------------------ */

/* A run.peak_tflops below what the run computes: said once (its MFU reads
 * over 100%), and the run goes on. (A probed peak is probed again instead,
 * train_loop.c check_peak.) */
static void test_a_peak_below_the_rate_is_said_once(void **state) {
    (void)state;
    assert_int_equal(vithost("run r.yaml --out peak --set run.steps=6 --set run.peak_tflops=1e-12"),
                     0);
    char *out = tmp_text("out");
    const char *want = "above run.peak_tflops 1e-12: its MFU reads over 100%";
    const char *first = strstr(out, want);
    if (!first) fail_msg("'%s' not in:\n%s", want, out);
    if (strstr(first + 1, want)) fail_msg("said more than once:\n%s", out);
    free(out);
}

/* ---- steps that do not train --------------------------------------------- */

static void test_a_run_whose_every_step_overflows_fails(void **state) {
    (void)state;
    failed_run(vithost("run r.yaml --out all " STATIC_HUGE " --set run.steps=12"));
    err_has("training stopped at step 12: none of the 12 steps of this run trained");
    /* the cause the host can tell: a scale that does not back off */
    err_has("overflow at loss scale 3e+38, which stayed the same after every skip");
    err_has("the run wrote no checkpoint before then");
    /* a dead run leaves no checkpoint to resume as if it had trained */
    assert_false(exists("all/checkpoints/latest"));
}

static void test_skips_in_a_row_stop_the_run(void **state) {
    (void)state;
    /* the default: more than 50 in a row */
    failed_run(vithost("run r.yaml --out def " STATIC_HUGE " --set run.steps=100"));
    err_has("training stopped at step 51: 51 steps in a row were skipped for Inf/NaN gradients "
            "(from step 1; run.max_consecutive_skips is 50)");
    failed_run(vithost("run r.yaml --out three " STATIC_HUGE
                       " --set run.steps=100 --set run.max_consecutive_skips=3"));
    err_has("training stopped at step 4: 4 steps in a row");
    /* the total, with the consecutive limit off */
    failed_run(vithost("run r.yaml --out total " STATIC_HUGE " --set run.steps=100 "
                       "--set run.max_consecutive_skips=0 --set run.max_skipped_steps=2"));
    err_has("training stopped at step 3: 3 steps in all were skipped for Inf/NaN gradients "
            "(run.max_skipped_steps is 2)");
}

/* The step of "D/checkpoints/step-00000012" after `after` in text; -1 none. */
static long long checkpoint_step(const char *text, const char *after, char *path, size_t len) {
    const char *p = strstr(text, after);
    if (!p) return -1;
    p += strlen(after);
    size_t n = strcspn(p, " ;()\n");
    snprintf(path, len, "%.*s", (int)n, p);
    const char *dash = strrchr(path, '-');
    return dash ? atoll(dash + 1) : -1;
}

/* A run that trains, then overflows in fp16 from a rate far too large:
 * it stops, naming a checkpoint whose weights went on to train. */
static void test_a_dead_run_names_its_last_good_checkpoint(void **state) {
    (void)state;
    failed_run(vithost("run r.yaml --out dead --set 'precision={plugin: amp, dtype: fp16}' "
                       "--set 'optim={plugin: mta, algo: adamw, lr: 100, warmup_steps: 40, "
                       "schedule: constant}' --set run.steps=100 --set run.checkpoint_every=2"));
    char *err = tmp_text("err"), good[512];
    long long g = checkpoint_step(err, "the last good checkpoint is ", good, sizeof good);
    if (g < 0) fail_msg("no good checkpoint named:\n%s", err);
    free(err);
    assert_true(exists(good));
    /* a step after it trained (no "skipped" in its metrics line) */
    char *text = tmp_text("dead/metrics.jsonl");
    int trained_after = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save))
        if (!strstr(line, "eval_") && !strstr(line, "\"skipped\":true") &&
            harness_json_number(line, "step") > (double)g)
            trained_after = 1;
    free(text);
    assert_true(trained_after);
}

/* An IDX set of 8x8 images, every one with a non-zero pixel: a recipe whose
 * std makes every such pixel Inf hands out non-finite batches. */
static void write_idx(const char *name, uint32_t magic, int n, int pixels) {
    size_t len = (pixels ? 16 : 8) + (size_t)n * (pixels ? (size_t)pixels : 1);
    unsigned char *b = calloc(1, len);
    uint32_t head[4] = {magic, (uint32_t)n, 8, 8};
    for (int i = 0; i < (pixels ? 4 : 2); i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(head[i] >> (24 - 8 * k));
    for (int i = 0; i < n; i++) {
        if (pixels) b[16 + (size_t)i * (size_t)pixels + (size_t)(i % pixels)] = 200;
        else b[8 + i] = (unsigned char)(i % 4);
    }
    write_file(name, b, len);
    free(b);
}

static void test_a_non_finite_input_is_named(void **state) {
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/idx", tmp_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    write_idx("idx/train-images-idx3-ubyte", 0x803, 32, 64);
    write_idx("idx/train-labels-idx1-ubyte", 0x801, 32, 0);
    write_idx("idx/t10k-images-idx3-ubyte", 0x803, 8, 64);
    write_idx("idx/t10k-labels-idx1-ubyte", 0x801, 8, 0);
    const char *data = "--set 'model={plugin: vit, dim: 16, depth: 1, heads: 2, mlp_dim: 32, "
                       "patch_size: 4}' --set 'data={plugin: idx, root: idx, num_classes: 4, "
                       "mean: 0, std: 1e-300}'";
    failed_run(vithost("run r.yaml --out nan %s --set run.steps=6 --set run.eval_every=0", data));
    err_has("none of the 6 steps of this run trained");
    err_has("the input batches hold NaN or Inf pixels (6 of these steps, from step 1): data "
            "plugin 'idx' hands out non-finite values");
    /* an evaluation of such data blames the data too, not the weights */
    failed_run(vithost("run r.yaml --out nan_eval %s --set run.steps=1", data));
    err_has("training stopped at step 1: its evaluation's logits or loss are NaN or Inf, and "
            "the 1 steps before it were all skipped");
    err_has("the input batches hold NaN or Inf pixels");
}

static void test_backoff_factor_zero_is_refused(void **state) {
    (void)state;
    /* 0 was read as "the default" (0.5) by the SDK's scaler */
    assert_int_equal(vithost("run r.yaml --out b0 --set run.steps=2 "
                             "--set 'precision={plugin: amp, dtype: fp16, backoff_factor: 0}'"),
                     3);
    err_has("precision.backoff_factor: 0: must be in (0, 1)");
    assert_false(exists("b0/checkpoints"));
}

/* ---- resume anywhere ------------------------------------------------------ */

/* "t<step> <loss>" and "e<step> <eval numbers>" of each metrics line, one a
 * line: what an uninterrupted run and a resumed one must share. */
static char *numbers_of(const char *path) {
    char *text = tmp_text(path);
    size_t cap = strlen(text) + 1, used = 0;
    char *out = calloc(1, cap);
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        int eval = strstr(line, "\"eval_loss\"") != NULL;
        const char *p = strstr(line, eval ? "\"eval_top1\"" : "\"loss\"");
        assert_non_null(p);
        size_t n = strcspn(p, eval ? "}" : ",");
        if (eval) n = (size_t)(strstr(p, "\"eval_samples\"") - p); /* top1, top5, loss */
        used += (size_t)snprintf(out + used, cap - used, "%c%lld %.*s\n", eval ? 'e' : 't',
                                 (long long)harness_json_number(line, "step"), (int)n, p);
    }
    free(text);
    return out;
}

/* Every line of `full` is in `split` (which may hold more: the evaluation
 * at the end of the first part). */
static void same_numbers(const char *full_dir, const char *split_dir) {
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/metrics.jsonl", full_dir);
    snprintf(b, sizeof b, "%s/metrics.jsonl", split_dir);
    char *full = numbers_of(a), *split = numbers_of(b);
    int lines = 0;
    for (char *save = NULL, *line = strtok_r(full, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), lines++) {
        char want[512];
        snprintf(want, sizeof want, "%s\n", line);
        if (!strstr(split, want)) fail_msg("'%s' of %s is not in %s:\n%s", line, a, b, split);
    }
    assert_true(lines >= 10);
    free(full);
    free(split);
}

/* Train `first` (run.* --set flags) to a mid-epoch end with its final
 * evaluation, resume with `then`, against one run of `then`. */
static void resume_extends(const char *launch, const char *name, const char *first,
                           const char *then) {
    char full[64], split[64];
    snprintf(full, sizeof full, "%s_full", name);
    snprintf(split, sizeof split, "%s_split", name);
    assert_int_equal(harness_sh(tmp_dir, "%s %s run r.yaml --out %s %s", launch, VH_TEST_VITHOST,
                                full, then),
                     0);
    assert_int_equal(harness_sh(tmp_dir, "%s %s run r.yaml --out %s %s", launch, VH_TEST_VITHOST,
                                split, first),
                     0);
    int code = harness_sh(tmp_dir, "%s %s run r.yaml --out %s --resume %s", launch,
                          VH_TEST_VITHOST, split, then);
    if (code != 0) {
        char *err = tmp_text("err");
        fail_msg("resume of %s exited %d:\n%s", split, code, err);
    }
    same_numbers(full, split);
}

static void test_resume_extends_a_run_stopped_mid_epoch(void **state) {
    (void)state;
    /* 7 of 20 steps, evaluated at the end: on through the epoch and past it */
    resume_extends("", "steps", "--set run.steps=7", "--set run.steps=27");
    /* the same run extended by epochs instead */
    resume_extends("", "epochs", "--set run.steps=7", "--set run.epochs=2");
    /* the test plugins (a data plugin with its own position) */
    resume_extends("", "plugins",
                   "--set 'model={plugin: test_model}' --set 'data={plugin: test_data, "
                   "train_size: 64}' --set 'optim={plugin: test_optim, lr: 0.1, momentum: 0.9}' "
                   "--set 'precision={plugin: test_precision}' --set 'sharding={plugin: "
                   "test_sharding}' --set run.steps=3",
                   "--set 'model={plugin: test_model}' --set 'data={plugin: test_data, "
                   "train_size: 64}' --set 'optim={plugin: test_optim, lr: 0.1, momentum: 0.9}' "
                   "--set 'precision={plugin: test_precision}' --set 'sharding={plugin: "
                   "test_sharding}' --set run.steps=21");
}

/* Two processes (each half the batch): the same, when mpirun is here. */
static void test_resume_extends_on_two_processes(void **state) {
    (void)state;
    if (strlen(VH_TEST_MPIRUN) == 0) {
        printf("test_resume_extends_on_two_processes: SKIPPED: no mpirun\n");
        skip();
    }
    resume_extends(VH_TEST_MPIRUN " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 "
                                  "-x VITHOST_PLUGIN_PATH -np 2",
                   "mpi", "--set run.batch_size=4 --set run.steps=7",
                   "--set run.batch_size=4 --set run.steps=27");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_peak_below_the_rate_is_said_once),
        cmocka_unit_test(test_a_run_whose_every_step_overflows_fails),
        cmocka_unit_test(test_skips_in_a_row_stop_the_run),
        cmocka_unit_test(test_a_dead_run_names_its_last_good_checkpoint),
        cmocka_unit_test(test_a_non_finite_input_is_named),
        cmocka_unit_test(test_backoff_factor_zero_is_refused),
        cmocka_unit_test(test_resume_extends_a_run_stopped_mid_epoch),
        cmocka_unit_test(test_resume_extends_on_two_processes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
