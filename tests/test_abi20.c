/* test_abi20.c - plugins built against ABI 2.0 on this host: the growth
 * promise of ABI 2 held end to end.
 *
 * tests/abi20/ builds one plugin per role (model, precision, sharding with
 * 2.0-sized slices, optim with the 2.0 `step` call, data) and a
 * communicator backend with a 2.0-sized vh_comm, all against the frozen 2.0
 * headers. `vithost plugins --describe` must show each as ABI 2.0, and a run
 * of all six must train, stop with a checkpoint, resume, and repeat an
 * uninterrupted run bit for bit.
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

#include "harness.h"

#define ABI20_DIR VH_TEST_BUILD_DIR "/tests/abi20"

static char tmp_dir[256];

/* Runs the copy of vithost (see install_backend) with ARGS in tmp_dir. */
#define vithost(...) harness_sh(tmp_dir, "./bin/vithost " __VA_ARGS__)

/* Both the recipe's file and the host's comm choice: see install_backend. */
#define ABI20_COMM "mpi"

static const char recipe[] =
    "run: {comm: " ABI20_COMM ", epochs: 2, batch_size: 16, log_every: 1, eval_every: 1}\n"
    "model: {plugin: " ABI20_DIR "/abi20_model.so, label_smoothing: 0.1}\n"
    "precision: {plugin: " ABI20_DIR "/abi20_precision.so}\n"
    "sharding: {plugin: " ABI20_DIR "/abi20_sharding.so}\n"
    "optim: {plugin: " ABI20_DIR "/abi20_optim.so, lr: 0.1, momentum: 0.9, weight_decay: 0.01}\n"
    "data: {plugin: " ABI20_DIR "/abi20_data.so, train_size: 128, noise: 2}\n";

/* Puts the 2.0 backend where this host looks for run.comm's library.
 *
 * HOST HOOK: today the host takes run.comm from a fixed list (auto, self,
 * mpi, nccl) and loads libvh_comm_<name>.so from <exe dir>/lib first. So the
 * test runs a copy of vithost in tmp_dir/bin with the 2.0 backend as its
 * lib/libvh_comm_mpi.so: the host's real open path (dlopen, vh_comm_open,
 * reading the vh_comm), under the name "mpi" and for one process. Should
 * run.comm ever take a backend's file (a value ending in .so, as a plugin
 * key does), set ABI20_COMM to ABI20_DIR "/libvh_abi20_comm.so" and drop the
 * copies. */
static int install_backend(void) {
    return harness_sh(tmp_dir,
                      "mkdir -p bin/lib && cp %s bin/vithost && "
                      "cp %s/libvh_abi20_comm.so bin/lib/libvh_comm_" ABI20_COMM ".so",
                      VH_TEST_VITHOST, ABI20_DIR);
}

static int setup(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/vithost-test-abi20-XXXXXX");
    if (!mkdtemp(tmp_dir)) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    char path[512];
    snprintf(path, sizeof path, "%s/abi20.yaml", tmp_dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(recipe, f);
    fclose(f);
    return install_backend() == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

/* vithost's exit code must be `want`; else the test fails showing its stderr. */
#define expect_exit(want, ...) check_exit((want), vithost(__VA_ARGS__), #__VA_ARGS__)
static void check_exit(int want, int got, const char *args) {
    if (got == want) return;
    char *err = tmp_text("err");
    fail_msg("vithost %s: exit %d, expected %d; stderr:\n%s", args, got, want, err);
}

static void test_describe_shows_abi_2_0(void **state) {
    (void)state;
    static const char *const roles[] = {"model", "precision", "sharding", "optim", "data"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        expect_exit(0, "plugins --describe %s/abi20_%s.so", ABI20_DIR, roles[i]);
        char *out = tmp_text("out");
        char want[128];
        snprintf(want, sizeof want, "abi20_%s (%s plugin, version 0.1.0, ABI 2.0)", roles[i],
                 roles[i]);
        if (!strstr(out, want)) fail_msg("'%s' not in: %s", want, out);
        free(out);
    }
}

/* The lines of a file (modified in place). */
static int split_lines(char *text, char **lines, int max) {
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(text, "\n", &save); tok && n < max;
         tok = strtok_r(NULL, "\n", &save))
        lines[n++] = tok;
    return n;
}

/* Step, loss and evaluation results of each metrics line, as printed: what
 * a resume must repeat. Every training loss must be finite; *first and
 * *last get the first and last of them. */
static char *numbers_of(const char *path, double *first, double *last) {
    char *text = tmp_text(path);
    char *lines[256];
    int n = split_lines(text, lines, 256), train = 0;
    size_t cap = 32768, used = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(out + used, cap - used, "%.0f",
                                 harness_json_number(lines[i], "step"));
        static const char *const keys[] = {"\"loss\":", "\"eval_top1\":", "\"eval_loss\":"};
        for (int k = 0; k < 3; k++) {
            const char *p = strstr(lines[i], keys[k]);
            if (!p) continue;
            const char *end = strpbrk(p, ",}");
            used += (size_t)snprintf(out + used, cap - used, " %.*s", (int)(end - p), p);
        }
        used += (size_t)snprintf(out + used, cap - used, "\n");
        if (strstr(lines[i], "eval_top1")) continue;
        double loss = harness_json_number(lines[i], "loss");
        if (!isfinite(loss)) fail_msg("%s line %d: loss %g: %s", path, i + 1, loss, lines[i]);
        if (train++ == 0) *first = loss;
        *last = loss;
    }
    assert_true(train > 0);
    free(text);
    return out;
}

/* The backend's own count, printed when the host closed it: it carried the run. */
static void assert_backend_carried_the_run(void) {
    char *err = tmp_text("err");
    const char *p = strstr(err, "abi20_comm: closed after ");
    if (!p) fail_msg("the 2.0 backend was not closed by the run: %s", err);
    assert_true(atoll(p + strlen("abi20_comm: closed after ")) > 0);
    free(err);
}

static void test_trains_and_resumes(void **state) {
    (void)state;
    /* uninterrupted: 2 epochs of 8 steps */
    expect_exit(0, "run abi20.yaml --out full");
    assert_backend_carried_the_run();
    char *run_json = tmp_text("full/run.json");
    static const char *const roles[] = {"model", "precision", "sharding", "optim", "data"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        char want[96];
        snprintf(want, sizeof want, "\"%s\": {\"name\": \"abi20_%s\"", roles[i], roles[i]);
        if (!strstr(run_json, want)) fail_msg("'%s' not in run.json: %s", want, run_json);
    }
    free(run_json);

    /* stopped in the first epoch with a checkpoint, then resumed */
    expect_exit(5, "run abi20.yaml --out split --stop-after 6");
    char *err = tmp_text("err");
    if (!strstr(err, "stopped at step 6")) fail_msg("%s", err);
    free(err);
    assert_backend_carried_the_run();
    expect_exit(0, "run abi20.yaml --out split --resume");
    char *out = tmp_text("out");
    if (!strstr(out, "resuming from split/checkpoints/step-00000006 (step 6, epoch 0)"))
        fail_msg("no resume from step 6: %s", out);
    free(out);
    assert_backend_carried_the_run();

    /* finite, falling, and the same numbers as the uninterrupted run */
    double first, last, first2, last2;
    char *a = numbers_of("full/metrics.jsonl", &first, &last);
    char *b = numbers_of("split/metrics.jsonl", &first2, &last2);
    assert_true(last < first);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "\n16 \"loss\":")); /* the last step is there */
    free(a);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_describe_shows_abi_2_0),
        cmocka_unit_test(test_trains_and_resumes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
