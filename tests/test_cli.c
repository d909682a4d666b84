/* test_cli.c - the vithost executable as a user meets it: commands, exit
 * codes, messages, and a traced run of the test plugins. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#include "vithost/vh_plugin.h"

typedef struct result {
    int code;
    char *out, *err;
} result;

static char tmp_dir[256];

/* Runs `vithost ARGS` from the source tree, stdout and stderr apart. */
static result run(const char *fmt, ...) {
    char args[2048], cmd[4096], out_path[512], err_path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(out_path, sizeof out_path, "%s/stdout", tmp_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", tmp_dir);
    snprintf(cmd, sizeof cmd, "cd %s && %s %s >%s 2>%s </dev/null", VH_TEST_SOURCE_DIR,
             VH_TEST_VITHOST, args, out_path, err_path);
    int status = system(cmd);
    result r = {WIFEXITED(status) ? WEXITSTATUS(status) : -1, harness_slurp(out_path),
                harness_slurp(err_path)};
    return r;
}

static void result_free(result *r) {
    free(r->out);
    free(r->err);
}

static const char *write_recipe(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static const char good_recipe[] =
    "run: {epochs: 2, batch_size: 16, log_every: 4}\n"
    "model:\n"
    "  plugin: test_model\n"
    "precision: {plugin: test_precision}\n"
    "sharding: {plugin: test_sharding}\n"
    "optim:\n"
    "  plugin: test_optim\n"
    "  lr: 0.1\n"
    "data: {plugin: test_data, train_size: 128, eval_size: 32}\n";

static int setup(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/vithost-test-cli-XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_help_and_version(void **state) {
    (void)state;
    result r = run("--help");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "usage: vithost run RECIPE"));
    assert_non_null(strstr(r.out, "exit codes:"));
    result_free(&r);
    r = run("--version");
    assert_int_equal(r.code, 0);
    char abi[64];
    snprintf(abi, sizeof abi, "plugin ABI %d.%d", VH_ABI_MAJOR, VH_ABI_MINOR);
    assert_non_null(strstr(r.out, abi));
    result_free(&r);
}

static void test_usage_errors(void **state) {
    (void)state;
    result r = run("");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "usage:"));
    result_free(&r);
    r = run("train x.yaml");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "unknown command 'train'"));
    result_free(&r);
    r = run("check");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "'check' needs a RECIPE"));
    result_free(&r);
    r = run("check configs/test-plugins.yaml --frobnicate");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "unknown option '--frobnicate'"));
    result_free(&r);
    r = run("run configs/test-plugins.yaml --set");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--set needs a value"));
    result_free(&r);
}

static void test_plugins_lists_every_role(void **state) {
    (void)state;
    result r = run("plugins");
    assert_int_equal(r.code, 0);
    const char *expect[][2] = {{"model", "test_model"},       {"precision", "test_precision"},
                               {"sharding", "test_sharding"}, {"optim", "test_optim"},
                               {"data", "test_data"}};
    for (size_t i = 0; i < 5; i++) {
        const char *line = strstr(r.out, expect[i][1]);
        assert_non_null(line);
        /* the row starts with the role */
        const char *row = line;
        while (row > r.out && row[-1] != '\n') row--;
        assert_int_equal(strncmp(row, expect[i][0], strlen(expect[i][0])), 0);
    }
    assert_non_null(strstr(r.out, VH_TEST_PLUGIN_DIR));
    result_free(&r);
}

static void test_plugins_describe(void **state) {
    (void)state;
    result r = run("plugins --describe test_optim");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "test_optim (optim plugin"));
    assert_non_null(strstr(r.out, "lr"));
    assert_non_null(strstr(r.out, "default 0.1"));
    result_free(&r);
    r = run("plugins --describe test_optm");
    assert_int_equal(r.code, 4);
    assert_non_null(strstr(r.err, "no plugin named 'test_optm'"));
    assert_non_null(strstr(r.err, "did you mean 'test_optim'"));
    result_free(&r);
}

static void test_check_prints_origins(void **state) {
    (void)state;
    result r = run("check configs/test-plugins.yaml --set optim.lr=0.25");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "lr: 0.25  # --set"));
    assert_non_null(strstr(r.out, "batch_size: 32  # configs/test-plugins.yaml:11:15"));
    assert_non_null(strstr(r.out, "steps: 0  # default"));
    assert_non_null(strstr(r.out, "comm: self  # configs/test-plugins.yaml:8:9"));
    assert_non_null(strstr(r.out, "test_model 0.1.0"));
    result_free(&r);
}

static void test_check_misspelt_key(void **state) {
    (void)state;
    const char *path = write_recipe("recipe.yaml",
                                    "run: {epochs: 1}\n"
                                    "model: {plugin: test_model}\n"
                                    "precision: {plugin: test_precision}\n"
                                    "sharding: {plugin: test_sharding}\n"
                                    "optim:\n"
                                    "  plugin: test_optim\n"
                                    "  lrr: 0.1\n"
                                    "data: {plugin: test_data}\n");
    result r = run("check %s", path);
    assert_int_equal(r.code, 3);
    char expect[600];
    snprintf(expect, sizeof expect, "%s:7:3: unknown key 'lrr'", path);
    assert_non_null(strstr(r.err, expect));
    assert_non_null(strstr(r.err, "did you mean 'lr'"));
    assert_non_null(strstr(r.err, "\n      ^")); /* caret under column 3 */
    result_free(&r);

    r = run("check configs/test-plugins.yaml --set optim.lrr=0.1");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "--set optim.lrr=0.1"));
    assert_non_null(strstr(r.err, "did you mean 'lr'"));
    result_free(&r);

    r = run("check configs/test-plugins.yaml --set optim.lr=fast");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "optim.lr"));
    result_free(&r);
}

/* Whether a failed check is this machine's lack (no GPU, a data set not
 * downloaded), not the recipe's: such a recipe is checked again on the
 * CPU; its data may still be missing, and then the message must say so. */
static int environment_lacks(const char *recipe, const char *err) {
    if (strstr(err, "run.device is cuda")) {
        result r = run("check configs/%s --set run.device=cpu", recipe);
        int lacks = r.code == 0 || environment_lacks(recipe, r.err);
        if (r.code != 0 && !lacks) fail_msg("configs/%s on the cpu: %s", recipe, r.err);
        result_free(&r);
        return 1;
    }
    return strstr(err, "failed in data.create") &&
           (strstr(err, "No such file or directory") || strstr(err, "cannot open"));
}

/* Every recipe shipped in configs/ passes `vithost check` as it is, where
 * its device and data are there. */
static void test_shipped_recipes_check(void **state) {
    (void)state;
    char dir_path[512];
    snprintf(dir_path, sizeof dir_path, "%s/configs", VH_TEST_SOURCE_DIR);
    DIR *dir = opendir(dir_path);
    assert_non_null(dir);
    int checked = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".yaml") != 0) continue;
        result r = run("check configs/%s", e->d_name);
        if (r.code != 0 && environment_lacks(e->d_name, r.err)) {
            printf("configs/%s: not all checked here: %s", e->d_name, r.err);
        } else {
            if (r.code != 0) fail_msg("configs/%s: exit %d: %s", e->d_name, r.code, r.err);
            assert_non_null(strstr(r.out, ": ok"));
        }
        result_free(&r);
        checked++;
    }
    closedir(dir);
    assert_true(checked >= 5); /* the main job, cifar10, imagenet b16 and h16, test plugins */
}

static void test_check_plugin_errors(void **state) {
    (void)state;
    result r = run("check configs/test-plugins.yaml --set model.plugin=test_modle");
    assert_int_equal(r.code, 4);
    assert_non_null(strstr(r.err, "no plugin named 'test_modle'"));
    assert_non_null(strstr(r.err, "did you mean 'test_model'"));
    result_free(&r);
    r = run("check configs/test-plugins.yaml --set model.plugin=test_optim");
    assert_int_equal(r.code, 4);
    assert_non_null(strstr(r.err, "'optim' plugin"));
    result_free(&r);
    const char *path = write_recipe("missing.yaml", "run: {epochs: 1}\nmodel: {plugin: test_model}\n");
    r = run("check %s", path);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "no 'precision' section"));
    result_free(&r);
    r = run("check /nonexistent/recipe.yaml");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "/nonexistent/recipe.yaml"));
    result_free(&r);
}

/* `check` creates the plugins against each other's info: what `run` would
 * refuse before its first step, `check` refuses too, and its ok says what
 * was validated. */
static void test_check_creates_the_plugins(void **state) {
    (void)state;
    const char *path = write_recipe(
        "vit.yaml",
        "run: {epochs: 1, batch_size: 4}\n"
        "model: {plugin: vit, dim: 48, depth: 1, heads: 3, patch_size: 4}\n"
        "precision: {plugin: fp32}\n"
        "sharding: {plugin: test_sharding}\n"
        "optim: {plugin: test_optim}\n"
        "data: {plugin: test_data, channels: 3, image_size: 16, train_size: 64}\n");
    result r = run("check %s", path);
    if (r.code != 0) fail_msg("%s", r.err);
    assert_non_null(strstr(r.out, ": ok (recipe and schemas; plugins created against each "
                                  "other on cpu: data 64 train / 64 eval images 3 x 16 x 16, "
                                  "4 classes; model "));
    assert_non_null(strstr(r.out, "no weights loaded, nothing trained)"));
    result_free(&r);
    r = run("check %s --set model.heads=5", path);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "5 heads do not divide dim 48"));
    result_free(&r);
    r = run("check %s --set model.patch_size=5", path);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "model.patch_size 5 does not divide the 16 x 16 images"));
    result_free(&r);
    r = run("check %s --set run.batch_size=100", path);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "fewer than one batch"));
    result_free(&r);
    /* a plugin value that would leave the search path */
    r = run("check %s --set model.plugin=../../x", path);
    assert_int_not_equal(r.code, 0);
    assert_non_null(strstr(r.err, "'../../x' is not a plugin name"));
    result_free(&r);
}

/* Index of the first line equal to `line` at or after `from`, or -1. */
static int find_line(char **lines, int n, int from, const char *line) {
    for (int i = from; i < n; i++)
        if (strcmp(lines[i], line) == 0) return i;
    return -1;
}

static void test_run_follows_the_step_order(void **state) {
    (void)state;
    const char *path = write_recipe("good.yaml", good_recipe);
    result r = run("run %s --trace --out %s/runs/trace", path, tmp_dir);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "each step calls, in order: data.next, sharding.zero_grads"));

    char *lines[20000];
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(r.out, "\n", &save); tok && n < 20000;
         tok = strtok_r(NULL, "\n", &save))
        lines[n++] = tok;
    /* One whole step, as DESIGN.md draws it; the test model has 2 units. */
    static const char *const step[] = {
        "trace: data.next",
        "trace: sharding.zero_grads",
        "trace: model.forward",
        "trace: sharding.gather unit=0",
        "trace: sharding.release unit=0",
        "trace: sharding.gather unit=1",
        "trace: sharding.release unit=1",
        "trace: precision.loss_scale",
        "trace: model.backward",
        "trace: sharding.gather unit=1",
        "trace: sharding.grads unit=1",
        "trace: sharding.reduce unit=1",
        "trace: sharding.release unit=1",
        "trace: sharding.gather unit=0",
        "trace: sharding.grads unit=0",
        "trace: sharding.reduce unit=0",
        "trace: sharding.release unit=0",
        "trace: sharding.wait",
        "trace: precision.unscale_and_check",
        "trace: optim.step",
        "trace: sharding.refresh",
        "trace: precision.update",
        "trace: data.next",
    };
    int first = find_line(lines, n, 0, "trace: data.start_epoch split=train epoch=0");
    assert_true(first >= 0);
    int at = first + 1;
    for (size_t i = 0; i < sizeof step / sizeof step[0]; i++, at++) {
        /* an optional call of the precision role, made when the plugin has it */
        if (at < n && strcmp(lines[at], "trace: precision.grad_sum_sq") == 0 &&
            strcmp(step[i], "trace: optim.step") == 0)
            at++;
        assert_true(at < n);
        assert_string_equal(lines[at], step[i]);
    }
    /* Plugins were created before the first step, data first. */
    int create_data = find_line(lines, n, 0, "trace: data.create");
    int create_sharding = find_line(lines, n, 0, "trace: sharding.setup");
    assert_true(create_data >= 0 && create_sharding > create_data && first > create_sharding);
    result_free(&r);
}

static void test_run_trains(void **state) {
    (void)state;
    const char *path = write_recipe("good.yaml", good_recipe);
    result r = run("run %s --set run.epochs=4 --out %s/runs/trains", path, tmp_dir);
    assert_int_equal(r.code, 0);
    const char *fin = strstr(r.out, "vithost: finished 32 steps");
    assert_non_null(fin);
    const char *top1 = strstr(fin, "eval top1 ");
    assert_non_null(top1);
    double acc = strtod(top1 + strlen("eval top1 "), NULL);
    assert_true(acc > 80.0); /* a linear model learns the test data; chance is 25% */
    result_free(&r);
}

static void test_run_out_dir(void **state) {
    (void)state;
    const char *path = write_recipe("good.yaml", good_recipe);
    char out_dir[512], resolved[600];
    snprintf(out_dir, sizeof out_dir, "%s/runs/a", tmp_dir);
    snprintf(resolved, sizeof resolved, "%s/recipe.yaml", out_dir);
    result r = run("run %s --out %s", path, out_dir);
    assert_int_equal(r.code, 0);
    result_free(&r);
    char *text = harness_slurp(resolved);
    assert_non_null(strstr(text, "plugin: test_optim"));
    assert_non_null(strstr(text, "lr: 0.1"));
    free(text);
    /* The resolved recipe is itself a valid recipe. */
    r = run("check %s", resolved);
    assert_int_equal(r.code, 0);
    result_free(&r);
    /* A folder that holds a run is never overwritten. */
    r = run("run %s --out %s", path, out_dir);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "already holds a run"));
    result_free(&r);
}

static void test_run_errors(void **state) {
    (void)state;
    const char *path = write_recipe("good.yaml", good_recipe);
    result r = run("run %s --set run.batch_size=1000 --out %s/runs/e1", path, tmp_dir);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "fewer than one batch"));
    result_free(&r);
    r = run("run %s --set run.device=cuda --out %s/runs/e2", path, tmp_dir);
    assert_int_equal(r.code, 1);
    /* No GPU: the device cannot open. A GPU: the CPU-only test model refuses it. */
    assert_non_null(strstr(r.err, "cuda"));
    result_free(&r);
}

/* A communicator backend this build lacks: one line saying so and what to
 * use, the exit code of a device that cannot open, and no run folder. */
static void test_run_missing_comm_backend(void **state) {
    (void)state;
    const char *path = write_recipe("good.yaml", good_recipe);
    static const char *const names[][3] = {{"mpi", "MPI", "libvh_comm_mpi.so"},
                                           {"nccl", "NCCL", "libvh_comm_nccl.so"}};
    for (int i = 0; i < 2; i++) {
        char lib[512], want[256], out_dir[512];
        snprintf(lib, sizeof lib, "%s/lib/%s", VH_TEST_BUILD_DIR, names[i][2]);
        if (access(lib, F_OK) == 0) {
            printf("SKIPPED: run.comm=%s: this build has %s\n", names[i][0], lib);
            continue;
        }
        snprintf(out_dir, sizeof out_dir, "%s/runs/comm-%s", tmp_dir, names[i][0]);
        result r = run("run %s --set run.comm=%s --out %s", path, names[i][0], out_dir);
        assert_int_equal(r.code, 1);
        snprintf(want, sizeof want,
                 "run.comm is %s, but this vithost has no %s backend (%s not found); use "
                 "run.comm: self",
                 names[i][0], names[i][1], names[i][2]);
        if (!strstr(r.err, want)) fail_msg("stderr\n%s\nlacks\n%s", r.err, want);
        assert_null(strstr(r.err, "\n\n")); /* one message */
        struct stat sb;
        assert_int_not_equal(stat(out_dir, &sb), 0);
        result_free(&r);
    }
    /* Not a backend at all: the recipe is refused, naming the choices. */
    result r = run("run %s --set run.comm=gloo --out %s/runs/comm-gloo", path, tmp_dir);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "self|mpi|nccl"));
    result_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_and_version),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_plugins_lists_every_role),
        cmocka_unit_test(test_plugins_describe),
        cmocka_unit_test(test_check_prints_origins),
        cmocka_unit_test(test_check_misspelt_key),
        cmocka_unit_test(test_shipped_recipes_check),
        cmocka_unit_test(test_check_plugin_errors),
        cmocka_unit_test(test_check_creates_the_plugins),
        cmocka_unit_test(test_run_follows_the_step_order),
        cmocka_unit_test(test_run_trains),
        cmocka_unit_test(test_run_out_dir),
        cmocka_unit_test(test_run_errors),
        cmocka_unit_test(test_run_missing_comm_backend),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
