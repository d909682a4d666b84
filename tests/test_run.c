/* test_run.c - `vithost run` and `vithost eval` as scripts use them: the run
 * folder, metrics.jsonl, checkpoints, --resume, --stop-after, SIGINT. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char tmp_dir[256];

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

static double field(const char *line, const char *key) { return harness_json_number(line, key); }

/* Runs vithost with ARGS (a format) in tmp_dir; its exit code, output in out and err. */
#define vithost(...) harness_sh(tmp_dir, VH_TEST_VITHOST " " __VA_ARGS__)

static void write_recipe(const char *name, const char *text) {
    assert_int_equal(harness_write(tmp_dir, name, text), 0);
}

/* Momentum, weight decay and label smoothing: state that a resume must carry. */
static const char recipe[] =
    "run: {epochs: 4, batch_size: 16, log_every: 1, eval_every: 1}\n"
    "model: {plugin: test_model, label_smoothing: 0.1}\n"
    "precision: {plugin: test_precision}\n"
    "sharding: {plugin: test_sharding}\n"
    "optim: {plugin: test_optim, lr: 0.1, momentum: 0.9, weight_decay: 0.01}\n"
    "data: {plugin: test_data, train_size: 128, noise: 2}\n";

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "run") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    write_recipe("recipe.yaml", recipe);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

/* The lines of a file (modified in place). */
static int split_lines(char *text, char **lines, int max) {
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(text, "\n", &save); tok && n < max;
         tok = strtok_r(NULL, "\n", &save))
        lines[n++] = tok;
    return n;
}

static void test_metrics_file_has_every_field(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out m"), 0);
    char *text = tmp_text("m/metrics.jsonl");
    char *lines[256];
    int n = split_lines(text, lines, 256), train = 0, eval = 0;
    /* test_model: 6 x classes x pixels training FLOPs per image */
    const double flops = 6.0 * 4 * 64;
    for (int i = 0; i < n; i++) {
        assert_true(lines[i][0] == '{' && lines[i][strlen(lines[i]) - 1] == '}');
        assert_false(isnan(field(lines[i], "step")));
        assert_false(isnan(field(lines[i], "epoch")));
        if (strstr(lines[i], "eval_top1")) {
            eval++;
            double top1 = field(lines[i], "eval_top1"), top5 = field(lines[i], "eval_top5");
            assert_true(top1 >= 0 && top1 <= top5 && top5 <= 1);
            assert_false(isnan(field(lines[i], "eval_loss")));
            continue;
        }
        train++;
        static const char *const keys[] = {"loss", "lr", "img_per_s", "tflops", "mfu",
                                           "peak_mem_bytes"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (isnan(field(lines[i], keys[k]))) fail_msg("line %d lacks %s: %s", i, keys[k], lines[i]);
        /* TFLOP/s is the model's FLOP count over the measured time per image */
        double tflops = field(lines[i], "tflops"), img_s = field(lines[i], "img_per_s");
        assert_true(fabs(tflops - img_s * flops / 1e12) <= 1e-6 * tflops + 1e-15);
        assert_true(field(lines[i], "peak_mem_bytes") > 1e6);
        assert_true(fabs(field(lines[i], "lr") - 0.1) < 1e-6);
    }
    assert_int_equal(train, 32); /* 4 epochs x 8 steps, log_every 1 */
    assert_int_equal(eval, 4);
    free(text);
    /* the run folder: resolved recipe, plugin versions, a final checkpoint */
    char *resolved = tmp_text("m/recipe.yaml");
    assert_non_null(strstr(resolved, "momentum: 0.9"));
    free(resolved);
    char *run_json = tmp_text("m/run.json");
    assert_non_null(strstr(run_json, "\"optim\": {\"name\": \"test_optim\", \"version\": \"0.1.0\""));
    free(run_json);
    char *latest = tmp_text("m/checkpoints/latest");
    assert_string_equal(latest, "step-00000032\n");
    free(latest);
}

/* The real plugins end to end on synthetic data: every metrics field, and
 * TFLOP/s equal to the vit's FLOP count times images per second. */
static void test_synthetic_vit_run_metrics(void **state) {
    (void)state;
    write_recipe("synthetic.yaml",
                 "run: {epochs: 1, batch_size: 8, log_every: 2, eval_every: 1}\n"
                 "model: {plugin: vit, dim: 16, depth: 1, heads: 2, mlp_dim: 32, patch_size: 4}\n"
                 "precision: {plugin: fp32}\n"
                 "sharding: {plugin: ddp}\n"
                 "optim: {plugin: mta, algo: adamw, lr: 1.0e-3, warmup_steps: 2}\n"
                 "data: {plugin: synthetic, channels: 3, image_size: 8, num_classes: 5,\n"
                 "       train_size: 48, eval_size: 20}\n");
    assert_int_equal(vithost("run synthetic.yaml --out syn"), 0);
    /* N = 4 patches + 1 token; per image MACs: patches 4 x 48 x 16, block
     * 5x16x48 + 2x25x16 + 5x16x16 + 2x5x16x32, head 16 x 5; x6 for training */
    const double flops = 6.0 * (4 * 48 * 16 + (5 * 16 * 48 + 2 * 25 * 16 + 5 * 16 * 16 +
                                                2 * 5 * 16 * 32) + 16 * 5);
    char *text = tmp_text("syn/metrics.jsonl");
    char *lines[64];
    int n = split_lines(text, lines, 64), train = 0, eval = 0;
    for (int i = 0; i < n; i++) {
        if (strstr(lines[i], "eval_top1")) {
            eval++;
            assert_true(field(lines[i], "eval_samples") == 20);
            assert_false(isnan(field(lines[i], "eval_top5")));
            assert_false(isnan(field(lines[i], "eval_loss")));
            continue;
        }
        train++;
        static const char *const keys[] = {"step", "epoch", "loss", "lr", "img_per_s",
                                           "tflops", "mfu", "peak_mem_bytes"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (isnan(field(lines[i], keys[k])))
                fail_msg("line %d lacks %s: %s", i, keys[k], lines[i]);
        double tflops = field(lines[i], "tflops"), img_s = field(lines[i], "img_per_s");
        assert_true(img_s > 0);
        assert_true(fabs(tflops - img_s * flops / 1e12) <= 1e-6 * tflops);
        assert_true(field(lines[i], "mfu") > 0 && field(lines[i], "mfu") < 1);
    }
    assert_int_equal(train, 3); /* 6 steps, a line every 2 */
    assert_int_equal(eval, 1);
    free(text);
    char *out = tmp_text("out");
    char want[64];
    snprintf(want, sizeof want, "%.3g GFLOP per image", flops / 1e9);
    if (!strstr(out, want)) fail_msg("'%s' not in the run's banner", want);
    free(out);
}

/* Only the losses and evaluation results of each line: what must repeat. */
static char *numbers_of(const char *path) {
    char *text = tmp_text(path);
    char *lines[512];
    int n = split_lines(text, lines, 512);
    size_t cap = 65536, used = 0;
    char *out = malloc(cap);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *keys[] = {"loss", "eval_top1", "eval_loss"};
        used += (size_t)snprintf(out + used, cap - used, "%lld", (long long)field(lines[i], "step"));
        for (int k = 0; k < 3; k++) {
            const char *p = strstr(lines[i], keys[k]);
            if (p && (p[-1] == '"')) {
                const char *end = strpbrk(p, ",}");
                used += (size_t)snprintf(out + used, cap - used, " %.*s", (int)(end - p), p);
            }
        }
        used += (size_t)snprintf(out + used, cap - used, "\n");
    }
    free(text);
    return out;
}

static void test_resume_repeats_the_run_bit_for_bit(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out full"), 0);
    assert_int_equal(vithost("run recipe.yaml --out split --stop-after 13"), 5);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "stopped at step 13"));
    assert_non_null(strstr(err, "--resume"));
    free(err);
    /* the GEMM choices that the resumed process takes (vh_cpu_gemm_choices_load) */
    char *choices = tmp_text("split/checkpoints/step-00000013/cpu-gemm-choices.txt");
    assert_non_null(choices);
    free(choices);
    assert_int_equal(vithost("run recipe.yaml --out split --resume"), 0);
    char *out = tmp_text("out");
    assert_non_null(strstr(out, "resuming from split/checkpoints/step-00000013 (step 13, epoch 1)"));
    free(out);
    char *a = numbers_of("full/metrics.jsonl"), *b = numbers_of("split/metrics.jsonl");
    assert_string_equal(a, b);
    assert_true(strlen(a) > 100);
    free(a);
    free(b);
}

static void test_resume_refuses_another_recipe(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out r --stop-after 3"), 5);
    assert_int_equal(vithost("run recipe.yaml --out r --resume --set optim.lr=0.2"), 3);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "recipe differs"));
    free(err);
    /* how long, and how often: may change */
    assert_int_equal(vithost("run recipe.yaml --out r --resume --set run.epochs=5 --set run.log_every=4"), 0);
    assert_int_equal(vithost("run recipe.yaml --out nothing-here --resume"), 3);
    err = tmp_text("err");
    assert_non_null(strstr(err, "holds no run"));
    free(err);
    assert_int_equal(vithost("run recipe.yaml --resume"), 2);
}

static void test_eval_command_prints_json(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out e"), 0);
    assert_int_equal(vithost("eval recipe.yaml --checkpoint e"), 0);
    char *out = tmp_text("out");
    assert_true(out[0] == '{');
    double top1 = field(out, "eval_top1");
    assert_false(isnan(top1));
    assert_false(isnan(field(out, "eval_top5")));
    assert_false(isnan(field(out, "eval_loss")));
    assert_true(field(out, "samples") == 64);
    free(out);
    /* the same weights as the run's last evaluation */
    char *metrics = tmp_text("e/metrics.jsonl");
    const char *last = strrchr(metrics, '{');
    assert_true(fabs(field(last, "eval_top1") - top1) < 1e-6);
    free(metrics);
    assert_int_equal(vithost("eval recipe.yaml --checkpoint e/checkpoints/step-00000032"), 0);
    assert_int_equal(vithost("eval recipe.yaml --checkpoint nowhere.safetensors"), 1);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "nowhere.safetensors"));
    free(err);
    assert_int_equal(vithost("eval recipe.yaml"), 2);
}

static void test_sigint_writes_a_checkpoint(void **state) {
    (void)state;
    write_recipe("long.yaml",
                 "run: {epochs: 1000, batch_size: 16, log_every: 100, eval_every: 0}\n"
                 "model: {plugin: test_model}\nprecision: {plugin: test_precision}\n"
                 "sharding: {plugin: test_sharding}\noptim: {plugin: test_optim}\n"
                 "data: {plugin: test_data, train_size: 4096}\n");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (chdir(tmp_dir) != 0) _exit(99);
        if (!freopen("sig.out", "w", stdout) || !freopen("sig.err", "w", stderr)) _exit(97);
        execl(VH_TEST_VITHOST, VH_TEST_VITHOST, "run", "long.yaml", "--out", "sig", (char *)NULL);
        _exit(98);
    }
    /* Wait until training runs (the banner is printed after the handlers are
     * installed), however loaded the machine is. */
    struct timespec tick = {0, 20 * 1000 * 1000};
    for (int i = 0; i < 1500; i++) {
        char *out = tmp_text("sig.out");
        int started = strstr(out, "each step calls") != NULL;
        free(out);
        if (started) break;
        nanosleep(&tick, NULL);
    }
    nanosleep(&tick, NULL);
    kill(pid, SIGINT);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 5);
    char *err = tmp_text("sig.err");
    assert_non_null(strstr(err, "(signal) with a checkpoint"));
    free(err);
    char *latest = tmp_text("sig/checkpoints/latest");
    assert_true(strncmp(latest, "step-", 5) == 0);
    free(latest);
    /* and it resumes */
    assert_int_equal(vithost("run long.yaml --out sig --resume --stop-after 2"), 5);
}

/* Only the training losses of a metrics file, one per line. */
static char *train_losses_of(const char *path) {
    char *text = tmp_text(path);
    char *lines[512];
    int n = split_lines(text, lines, 512);
    size_t cap = 65536, used = 0;
    char *out = malloc(cap);
    out[0] = '\0';
    for (int i = 0; i < n; i++)
        if (!strstr(lines[i], "eval_top1"))
            used += (size_t)snprintf(out + used, cap - used, "%.9g\n", field(lines[i], "loss"));
    free(text);
    return out;
}

/* Evaluating in the middle of an epoch does not disturb the training pass. */
static void test_eval_inside_an_epoch(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out plain --set run.eval_every=0"), 0);
    assert_int_equal(vithost("run recipe.yaml --out mid --set run.eval_every=0 "
                             "--set run.eval_every_steps=3"), 0);
    char *a = train_losses_of("plain/metrics.jsonl"), *b = train_losses_of("mid/metrics.jsonl");
    assert_string_equal(a, b);
    free(a);
    free(b);
    char *metrics = tmp_text("mid/metrics.jsonl");
    int evals = 0;
    for (const char *p = metrics; (p = strstr(p, "eval_top1")); p++) evals++;
    assert_int_equal(evals, 32 / 3);
    free(metrics);
}

static void test_checkpoint_rotation(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out rot --set run.checkpoint_every=5 "
                             "--set run.keep_checkpoints=2"), 0);
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, "%s/rot/checkpoints/step-00000032", tmp_dir);
    assert_int_equal(stat(path, &sb), 0);
    snprintf(path, sizeof path, "%s/rot/checkpoints/step-00000030", tmp_dir);
    assert_int_equal(stat(path, &sb), 0);
    snprintf(path, sizeof path, "%s/rot/checkpoints/step-00000025", tmp_dir);
    assert_int_not_equal(stat(path, &sb), 0);
}

/* ---- hardening: stops that name what to do, damaged checkpoints ------------ */

/* Overwrites `n` bytes at `offset` from the end of a file of the tmp dir. */
static void patch_tail(const char *name, long offset, const void *bytes, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -offset, SEEK_END), 0);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* Replaces the first "key" line of a run's state.json with `line` ("" drops it). */
static void edit_state(const char *name, const char *key, const char *line) {
    char *text = tmp_text(name);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    char *save = NULL;
    int first = 1;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (strstr(l, key)) {
            if (line[0]) fprintf(f, "%s\n", line);
            continue;
        }
        /* a dropped last member leaves a trailing comma: JSON-ish is enough */
        fprintf(f, "%s\n", l);
        first = 0;
    }
    (void)first;
    fclose(f);
    free(text);
}

/* The resume command printed at a stop repeats the run's --set flags,
 * quoted for a shell, and following it verbatim finishes the same run. */
static void test_resume_command_keeps_sets(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out rs --set run.epochs=2 "
                             "--set 'optim.lr=0.05' --stop-after 3"), 5);
    char *err = tmp_text("err");
    const char *cmd = strstr(err, "continue with: ");
    assert_non_null(cmd);
    cmd += strlen("continue with: ");
    assert_non_null(strstr(cmd, "vithost run recipe.yaml --set run.epochs=2 --set optim.lr=0.05 "
                                "--out rs --resume"));
    char again[1024];
    snprintf(again, sizeof again, "%s", cmd + strlen("vithost "));
    again[strcspn(again, "\n")] = '\0';
    free(err);
    assert_int_equal(vithost("%s", again), 0);
    char *out = tmp_text("out");
    assert_non_null(strstr(out, "finished 16 steps")); /* 2 epochs, not the recipe's 4 */
    free(out);
    /* A value a shell would split is quoted. */
    write_recipe("my recipe.yaml", recipe);
    assert_int_equal(vithost("run 'my recipe.yaml' --out rq --set 'run.seed=7' --stop-after 1"),
                     5);
    err = tmp_text("err");
    assert_non_null(strstr(err, "vithost run 'my recipe.yaml' --set run.seed=7 --out rq"));
    free(err);
}

/* A loss that becomes NaN/Inf stops the run at that step, naming the last
 * good checkpoint, with a non-zero exit. The weights of a checkpoint are
 * made huge (finite: they load) so that the next step's logits overflow. */
static void test_divergence_names_the_last_checkpoint(void **state) {
    (void)state;
#define FP32_NO_SKIP "--set precision.plugin=fp32 --set precision.check_finite=false"
    assert_int_equal(vithost("run recipe.yaml --out dv " FP32_NO_SKIP " --set run.checkpoint_every=2 "
                             "--set run.log_every=100 --stop-after 4"), 5);
    edit_state("dv/checkpoints/step-00000004/state.json", "model_crc32", "");
    edit_state("dv/checkpoints/step-00000004/state.json", "model_bytes", "");
    unsigned char huge[1024];
    const float big = 3e38f;
    for (size_t i = 0; i < sizeof huge; i += 4) memcpy(huge + i, &big, 4);
    patch_tail("dv/checkpoints/step-00000004/model.safetensors", (long)sizeof huge, huge,
               sizeof huge);
    /* not a log step (log_every 100): the loss is read every step */
    assert_int_equal(vithost("run recipe.yaml --out dv " FP32_NO_SKIP " --resume"), 1);
    char *err = tmp_text("err");
    if (!strstr(err, "training diverged: the loss is ")) fail_msg("%s", err);
    assert_non_null(strstr(err, " at step 5 "));
    /* step 4's weights gave the loss: the good checkpoint is the one before */
    assert_non_null(strstr(err, "the last good checkpoint is dv/checkpoints/step-00000002"));
    free(err);
    /* A policy that skips such steps may go on, but a run none of whose
     * steps trained does not end with exit 0 (eval off: nothing else would
     * notice); test_outcome.c has the rest of that policy. */
    assert_int_equal(vithost("run recipe.yaml --out dv2 --set precision.plugin=fp32 "
                             "--set run.eval_every=0 --stop-after 4"), 5);
    edit_state("dv2/checkpoints/step-00000004/state.json", "model_crc32", "");
    edit_state("dv2/checkpoints/step-00000004/state.json", "model_bytes", "");
    patch_tail("dv2/checkpoints/step-00000004/model.safetensors", (long)sizeof huge, huge,
               sizeof huge);
    assert_int_equal(vithost("run recipe.yaml --out dv2 --set precision.plugin=fp32 "
                             "--set run.eval_every=0 --resume"), 1);
    err = tmp_text("err");
    if (!strstr(err, "training stopped at step 32: none of the 28 steps of this run trained"))
        fail_msg("%s", err);
    free(err);
}

/* Checkpoints carry CRC-32s of their files; a damaged file is refused, the
 * previous checkpoint offered; a checkpoint without checksums (older) still
 * loads; state.json with impossible values and weights holding NaN are
 * refused naming the file. */
static void test_damaged_checkpoints(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out ck --set run.checkpoint_every=2 "
                             "--stop-after 4"), 5);
    char *st = tmp_text("ck/checkpoints/step-00000004/state.json");
    assert_non_null(strstr(st, "\"model_crc32\": \""));
    assert_non_null(strstr(st, "\"model_bytes\": "));
    free(st);
    /* one flipped value in the weights */
    const unsigned char junk[4] = {0x12, 0x34, 0x56, 0x78};
    patch_tail("ck/checkpoints/step-00000004/model.safetensors", 8, junk, 4);
    assert_int_equal(vithost("run recipe.yaml --out ck --resume"), 1);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "ck/checkpoints/step-00000004/model.safetensors is damaged: its "
                                "CRC-32 is"));
    assert_non_null(strstr(err, "the previous checkpoint is ck/checkpoints/step-00000002 (to "
                                "resume from it: echo step-00000002 > ck/checkpoints/latest)"));
    free(err);
    /* older checkpoints have no checksum: the damage is then in the weights
     * as read, here a NaN, refused by name */
    edit_state("ck/checkpoints/step-00000004/state.json", "model_crc32", "");
    edit_state("ck/checkpoints/step-00000004/state.json", "model_bytes", "");
    const unsigned char nan_bits[4] = {0x00, 0x00, 0xc0, 0x7f};
    patch_tail("ck/checkpoints/step-00000004/model.safetensors", 4, nan_bits, 4);
    assert_int_equal(vithost("run recipe.yaml --out ck --resume"), 1);
    err = tmp_text("err");
    assert_non_null(strstr(err, "ck/checkpoints/step-00000004/model.safetensors: tensor "));
    assert_non_null(strstr(err, "holds NaN"));
    free(err);
    /* vithost eval on those weights: an error, never a top-1 */
    assert_int_equal(vithost("eval recipe.yaml --checkpoint ck/checkpoints/step-00000004"), 1);
    err = tmp_text("err");
    assert_non_null(strstr(err, "holds NaN"));
    free(err);
    char *out = tmp_text("out");
    assert_null(strstr(out, "eval_top1"));
    free(out);
    /* state.json with a negative step */
    edit_state("ck/checkpoints/step-00000002/state.json", "\"step\"", "  \"step\": -3,");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "echo step-00000002 > %s/ck/checkpoints/latest", tmp_dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(vithost("run recipe.yaml --out ck --resume"), 1);
    err = tmp_text("err");
    assert_non_null(strstr(err, "ck/checkpoints/step-00000002/state.json: impossible values "
                                "(step -3"));
    free(err);
    /* an undamaged older checkpoint (no checksums) resumes */
    assert_int_equal(vithost("run recipe.yaml --out old --stop-after 2"), 5);
    edit_state("old/checkpoints/step-00000002/state.json", "model_crc32", "");
    edit_state("old/checkpoints/step-00000002/state.json", "model_bytes", "");
    edit_state("old/checkpoints/step-00000002/state.json", "optim_crc32", "");
    edit_state("old/checkpoints/step-00000002/state.json", "optim_bytes", "");
    assert_int_equal(vithost("run recipe.yaml --out old --resume"), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_file_has_every_field),
        cmocka_unit_test(test_synthetic_vit_run_metrics),
        cmocka_unit_test(test_resume_repeats_the_run_bit_for_bit),
        cmocka_unit_test(test_resume_refuses_another_recipe),
        cmocka_unit_test(test_eval_command_prints_json),
        cmocka_unit_test(test_sigint_writes_a_checkpoint),
        cmocka_unit_test(test_eval_inside_an_epoch),
        cmocka_unit_test(test_checkpoint_rotation),
        cmocka_unit_test(test_resume_command_keeps_sets),
        cmocka_unit_test(test_divergence_names_the_last_checkpoint),
        cmocka_unit_test(test_damaged_checkpoints),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
