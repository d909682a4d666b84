/* test_checked_io.c - what a run reads is checked and what it writes is
 * checked: eval and model.pretrained verify a checkpoint folder's checksums
 * as resume does (one weights-reading path); a full disk under
 * metrics.jsonl or the progress lines ends the run with exit 1 naming the
 * file and errno (run.write_errors: warn goes on), and metrics.jsonl holds
 * whole lines only. The full disk is a test hook (deterministic) and, when
 * the test may mount one, a 64 KiB tmpfs. */
#define _POSIX_C_SOURCE 200809L
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
/* with an environment variable (or another prefix) before the command */
#define vithost_env(env, ...) harness_sh(tmp_dir, env " " VH_TEST_VITHOST " " __VA_ARGS__)

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

static void write_file(const char *name, const char *text) {
    assert_int_equal(harness_write(tmp_dir, name, text), 0);
}

/* The test plugins: 8 steps an epoch, a line each, an evaluation an epoch. */
static const char recipe[] =
    "run: {epochs: 4, batch_size: 16, log_every: 1, eval_every: 1}\n"
    "model: {plugin: test_model}\n"
    "precision: {plugin: test_precision}\n"
    "sharding: {plugin: test_sharding}\n"
    "optim: {plugin: test_optim, lr: 0.1}\n"
    "data: {plugin: test_data, train_size: 128, noise: 2}\n";

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "checked-io") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    write_file("recipe.yaml", recipe);
    write_file("tiny.yaml", harness_tiny_vit);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

/* Overwrites n bytes at `from_end` bytes before the end of a file. */
static void patch_tail(const char *name, long from_end, const void *bytes, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -from_end, SEEK_END), 0);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* A finite value in place of a weight: it loads, and only the checksum
 * tells the file is not what the run wrote. */
static void damage(const char *name) {
    const unsigned char finite[4] = {0x00, 0x00, 0x80, 0x3f}; /* 1.0f */
    const unsigned char other[4] = {0x00, 0x00, 0x00, 0x40};  /* 2.0f */
    patch_tail(name, 8, finite, 4);
    patch_tail(name, 4, other, 4);
}

static void expect_in(const char *file, const char *text) {
    char *s = tmp_text(file);
    if (!strstr(s, text)) fail_msg("%s lacks \"%s\":\n%s", file, text, s);
    free(s);
}

static void expect_not_in(const char *file, const char *text) {
    char *s = tmp_text(file);
    if (strstr(s, text)) fail_msg("%s has \"%s\":\n%s", file, text, s);
    free(s);
}

/* ---- point 6: one weights-reading path, one set of checks ------------------- */

/* eval verifies a checkpoint's checksums whichever way it is named (run
 * folder, checkpoint folder, the file), and offers the checkpoint before. */
static void test_eval_refuses_a_damaged_checkpoint(void **state) {
    (void)state;
    assert_int_equal(vithost("run recipe.yaml --out ck --set run.epochs=1 "
                             "--set run.checkpoint_every=4"), 0);
    assert_int_equal(vithost("eval recipe.yaml --checkpoint ck"), 0); /* undamaged: evaluates */
    expect_in("out", "\"eval_top1\"");
    damage("ck/checkpoints/step-00000008/model.safetensors");
    static const char *const forms[] = {"ck", "ck/checkpoints/step-00000008",
                                        "ck/checkpoints/step-00000008/model.safetensors"};
    for (int i = 0; i < 3; i++) {
        int rc = vithost("eval recipe.yaml --checkpoint %s", forms[i]);
        if (rc != 1) fail_msg("eval --checkpoint %s: exit %d, not 1", forms[i], rc);
        expect_in("err", "ck/checkpoints/step-00000008/model.safetensors is damaged: its CRC-32 "
                         "is ");
        expect_in("err", "copy it again, or use another checkpoint; the checkpoint before it is "
                         "ck/checkpoints/step-00000004 (evaluate it with --checkpoint "
                         "ck/checkpoints/step-00000004)");
        expect_not_in("out", "eval_top1");
    }
    /* a file cut short: its size is checked too */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "truncate -s -4 %s/ck/checkpoints/step-00000004/model.safetensors",
             tmp_dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(vithost("eval recipe.yaml --checkpoint ck/checkpoints/step-00000004"), 1);
    expect_in("err", "ck/checkpoints/step-00000004/model.safetensors is damaged: ");
    expect_in("err", " bytes, but ck/checkpoints/step-00000004/state.json says ");
}

/* model.pretrained naming a checkpoint's file is checked as resume checks
 * it: a damaged file never starts a run (nor a bench). */
static void test_pretrained_refuses_a_damaged_checkpoint(void **state) {
    (void)state;
    assert_int_equal(vithost("run tiny.yaml --out pt"), 0);
    const char *set = "--set model.pretrained=pt/checkpoints/step-00000008/model.safetensors";
    assert_int_equal(vithost("run tiny.yaml --out ft %s", set), 0); /* undamaged: starts */
    damage("pt/checkpoints/step-00000008/model.safetensors");
    assert_int_equal(vithost("run tiny.yaml --out ft2 %s", set), 1);
    expect_in("err", "pt/checkpoints/step-00000008/model.safetensors is damaged: its CRC-32 is ");
    expect_not_in("out", "finished");
    assert_int_equal(vithost("bench tiny.yaml --steps 2 --warmup 0 %s", set), 1);
    expect_in("err", "pt/checkpoints/step-00000008/model.safetensors is damaged: its CRC-32 is ");
}

/* ---- point 7: every write checked ------------------------------------------- */

/* Every line of the file is a whole JSON object with its newline; returns
 * the count of training lines (eval lines have "eval_top1"). */
static int whole_lines(const char *file, int *evals) {
    char *text = tmp_text(file);
    size_t len = strlen(text);
    if (len && text[len - 1] != '\n') fail_msg("%s ends inside a line:\n%s", file, text);
    int train = 0;
    *evals = 0;
    char *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(l);
        /* a spliced line holds two objects, or one cut short */
        if (l[0] != '{' || l[n - 1] != '}' || strstr(l + 1, "{\"step\""))
            fail_msg("%s holds a line that is not one whole object: %s", file, l);
        if (strstr(l, "\"eval_top1\"")) (*evals)++;
        else train++;
    }
    free(text);
    return train;
}

#define FULL_AFTER "VITHOST_TEST_METRICS_FULL_AFTER="

/* A disk that fills during the third line (about 340 bytes each): the run
 * stops with exit 1 naming the file and errno; the file keeps two whole
 * lines; once there is space a resume from step 2 completes one history. */
static void test_full_metrics_disk_stops_the_run(void **state) {
    (void)state;
    assert_int_equal(vithost_env(FULL_AFTER "700", "run recipe.yaml --out full "
                                                   "--set run.checkpoint_every=2"), 1);
    expect_in("err", "cannot write full/metrics.jsonl: No space left on device (errno 28) at "
                     "step 3; the run stops");
    expect_not_in("out", "finished");
    int evals;
    assert_int_equal(whole_lines("full/metrics.jsonl", &evals), 2);
    assert_int_equal(vithost("run recipe.yaml --out full --set run.checkpoint_every=2 --resume"),
                     0);
    assert_int_equal(whole_lines("full/metrics.jsonl", &evals), 32);
    assert_int_equal(evals, 4);
}

/* run.write_errors: warn: the run goes on; the lines that could not be
 * written are missing (said when it happens, and when writing works again),
 * the others whole. */
static void test_full_metrics_disk_with_warn_goes_on(void **state) {
    (void)state;
    assert_int_equal(vithost_env(FULL_AFTER "700:5", "run recipe.yaml --out warn "
                                                      "--set run.write_errors=warn"), 0);
    expect_in("err", "warning: cannot write warn/metrics.jsonl: No space left on device (errno "
                     "28) at step 3; the run goes on without these lines");
    expect_in("err", "warn/metrics.jsonl: written again from step 8; 5 line(s) of steps 3 to 7 "
                     "are missing");
    int evals;
    assert_int_equal(whole_lines("warn/metrics.jsonl", &evals), 32 - 5);
    assert_int_equal(evals, 4);
    /* write_errors is a policy, not the run: it may change on resume */
    assert_int_equal(vithost("run recipe.yaml --out warn --set run.epochs=5 --resume"), 0);
}

/* A real full disk: a 64 KiB tmpfs (needs root and mount; SKIPPED else). */
static void test_full_tmpfs(void **state) {
    (void)state;
    char disk[512], cmd[2048];
    snprintf(disk, sizeof disk, "%s/disk", tmp_dir);
    assert_int_equal(mkdir(disk, 0755), 0);
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=64k tmpfs %s 2>/dev/null", disk);
    if (geteuid() != 0 || system(cmd) != 0) {
        printf("test_full_tmpfs: SKIPPED: cannot mount a tmpfs (not root, or no mount here)\n");
        skip();
    }
    /* 40 epochs: about 140 KB of lines. Nothing is asserted while the
     * tmpfs is mounted (a failed assertion would leave it behind). */
    int rc = vithost("run recipe.yaml --out disk/r --set run.epochs=40");
    snprintf(cmd, sizeof cmd, "cp %s/r/metrics.jsonl %s/tmpfs-metrics.jsonl; umount %s", disk,
             tmp_dir, disk);
    assert_int_equal(system(cmd), 0);
    char *err = tmp_text("err");
    if (rc != 1 || !strstr(err, "cannot write disk/r/metrics.jsonl: No space left on device "
                                "(errno 28)"))
        fail_msg("exit %d:\n%s", rc, err);
    free(err);
    int evals = 0, lines = whole_lines("tmpfs-metrics.jsonl", &evals);
    assert_true(lines > 10 && lines < 320);
}

/* The progress lines to a full disk (stdout to /dev/full): exit 1 naming
 * the stream and errno, or with warn a warning and exit 0. eval's result
 * line the same. */
static void test_full_progress_stream(void **state) {
    (void)state;
    assert_int_equal(harness_sh(tmp_dir, "sh -c '%s run recipe.yaml --out pf --set run.epochs=1 "
                                         ">/dev/full'", VH_TEST_VITHOST), 1);
    expect_in("err", "cannot write the progress lines to standard output (/dev/full): No space "
                     "left on device (errno 28); the run stops");
    assert_int_equal(harness_sh(tmp_dir, "sh -c '%s run recipe.yaml --out pw --set run.epochs=1 "
                                         "--set run.write_errors=warn >/dev/full'",
                                VH_TEST_VITHOST), 0);
    char *err = tmp_text("err");
    const char *warn = strstr(err, "warning: cannot write the progress lines to standard output "
                                   "(/dev/full): No space left on device (errno 28); the run "
                                   "goes on");
    if (!warn) fail_msg("%s", err);
    assert_null(strstr(warn + 1, "warning: cannot write the progress lines")); /* once */
    free(err);
    int evals;
    assert_int_equal(whole_lines("pw/metrics.jsonl", &evals), 8);
    assert_int_equal(harness_sh(tmp_dir, "sh -c '%s eval recipe.yaml --checkpoint pw "
                                         ">/dev/full'", VH_TEST_VITHOST), 1);
    expect_in("err", "cannot write the result to standard output: No space left on device "
                     "(errno 28)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_refuses_a_damaged_checkpoint),
        cmocka_unit_test(test_pretrained_refuses_a_damaged_checkpoint),
        cmocka_unit_test(test_full_metrics_disk_stops_the_run),
        cmocka_unit_test(test_full_metrics_disk_with_warn_goes_on),
        cmocka_unit_test(test_full_tmpfs),
        cmocka_unit_test(test_full_progress_stream),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
