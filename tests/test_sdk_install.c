/* test_sdk_install.c - the SDK as a plugin author outside the tree meets it.
 *
 * Once (group setup): `cmake --install` of this build into a temporary
 * prefix. Then, with nothing but that prefix (CMAKE_PREFIX_PATH, the
 * installed vithost, pkg-config's PKG_CONFIG_PATH; the sources of examples/
 * are copied out first):
 *   - the installed tree has its parts and runs from a copy elsewhere
 *     (relative RPATHs and plugin path);
 *   - `pkg-config --cflags --libs vithost` compiles a plugin, and
 *     `vithost-testhost` its generated unit test, which passes;
 *   - `vithost new-plugin ROLE NAME DIR` for every role builds with CMake
 *     (warnings as errors) and trains 3 steps of the main job; the optim
 *     project, configured without a build type, compiles Release (-O2/-O3)
 *     with -std=c11, links libm, and its unit test (vithost's test host)
 *     passes under ctest;
 *   - examples/ builds, and each of its five plugins trains 3 steps of its
 *     recipe (the main job with that role swapped).
 * Every plugin is loaded by name through VITHOST_PLUGIN_PATH. Without the
 * Fashion-MNIST files the recipes' idx data section is swapped for
 * synthetic data of the same shape.
 */
#define _GNU_SOURCE /* mkdtemp, setenv */
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

enum { PATHLEN = 1024 };

static char tmp[64];     /* the test's folder */
static char prefix[96];  /* the install prefix in it */
static char log_path[96];
static int have_main_data;

/* Runs a shell command (output appended to the log); its exit status. On
 * failure the log's tail is printed, so ctest shows why. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[16384 + 256];
    snprintf(full, sizeof full, "(%s) >> %s 2>&1", cmd, log_path);
    int rc = system(full);
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    if (code != 0) {
        fprintf(stderr, "command failed (%d): %s\n--- last lines of %s ---\n", code, cmd, log_path);
        char tail[PATHLEN];
        snprintf(tail, sizeof tail, "tail -n 30 %s >&2", log_path);
        if (system(tail) != 0) fprintf(stderr, "(no log)\n");
    }
    return code;
}

static int exists(const char *dir, const char *file) {
    char p[2 * PATHLEN];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return access(p, F_OK) == 0;
}

/* Copies a recipe, swapping an idx data section for synthetic data of the
 * main job's shape when the Fashion-MNIST files are missing. */
static void copy_recipe(const char *in, const char *out) {
    FILE *f = fopen(in, "r"), *g = fopen(out, "w");
    assert_non_null(f);
    assert_non_null(g);
    char line[PATHLEN];
    int skipping = 0;
    while (fgets(line, sizeof line, f)) {
        if (skipping && (line[0] == ' ' || line[0] == '\t')) continue;
        skipping = 0;
        if (!have_main_data && strcmp(line, "data:\n") == 0) {
            char next[PATHLEN];
            long at = ftell(f);
            if (fgets(next, sizeof next, f) && strstr(next, "plugin: idx")) {
                fputs("data: {plugin: synthetic, channels: 1, image_size: 28, num_classes: 10, "
                      "train_size: 2048, eval_size: 256}\n",
                      g);
                skipping = 1;
                continue;
            }
            fseek(f, at, SEEK_SET);
        }
        fputs(line, g);
    }
    fclose(f);
    assert_int_equal(fclose(g), 0);
}

/* 3 steps of `recipe` with the installed vithost, plugins from plugin_dir. */
static void train(const char *name, const char *recipe, const char *plugin_dir,
                  const char *extra) {
    char r[PATHLEN], out[512], metrics[600];
    snprintf(r, sizeof r, "%s/%s.yaml", tmp, name);
    copy_recipe(recipe, r);
    snprintf(out, sizeof out, "%s/runs/%s", tmp, name);
    assert_int_equal(sh("cd %s && VITHOST_PLUGIN_PATH=%s OMP_NUM_THREADS=2 %s/bin/vithost run %s "
                        "--set run.steps=3 --set run.eval_every=0 --set run.log_every=1 %s "
                        "--out %s",
                        tmp, plugin_dir, prefix, r, extra ? extra : "", out),
                     0);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    FILE *f = fopen(metrics, "r");
    assert_non_null(f);
    char line[4096];
    int step3 = 0;
    while (fgets(line, sizeof line, f)) step3 |= strstr(line, "\"step\":3,") != NULL;
    fclose(f);
    if (!step3) fail_msg("%s: no metrics line for step 3 in %s", name, metrics);
}

/* The SDK of a sanitized build is instrumented, and a plain program the test
 * compiles against it (a plugin's unit test) loads libasan after libc: ASan
 * works so, but refuses to start unless told the order is intended. */
static void allow_late_asan(void) {
#ifdef VH_TEST_SANITIZED
    const char *old = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof opts, "%s%sverify_asan_link_order=0", old ? old : "",
             old && *old ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
#endif
}

static int setup_install(void **state) {
    (void)state;
    allow_late_asan();
    snprintf(tmp, sizeof tmp, "/tmp/vh-sdk-install-XXXXXX");
    if (!mkdtemp(tmp)) return -1;
    snprintf(prefix, sizeof prefix, "%s/prefix", tmp);
    snprintf(log_path, sizeof log_path, "%s/log.txt", tmp);
    have_main_data = access(VH_TEST_MAIN_DATA "/train-images-idx3-ubyte.gz", R_OK) == 0 &&
                     access(VH_TEST_MAIN_DATA "/t10k-labels-idx1-ubyte.gz", R_OK) == 0;
    if (!have_main_data)
        fprintf(stderr, "note: %s is missing: the recipes train on synthetic data\n",
                VH_TEST_MAIN_DATA);
    return sh("%s --install %s --prefix %s", VH_TEST_CMAKE, VH_TEST_BUILD_DIR, prefix) == 0 ? 0
                                                                                          : -1;
}

static int teardown_install(void **state) {
    (void)state;
    if (getenv("VH_KEEP_TMP")) return 0; /* for a look after a failure */
    return sh("rm -rf %s", tmp) == 0 ? 0 : -1;
}

/* The parts, and a copy of the tree elsewhere still finds its library and
 * its plugins (nothing points back at the build or the first prefix). */
static void test_installed_tree_is_relocatable(void **state) {
    (void)state;
    static const char *const parts[] = {
        "bin/vithost", "include/vithost/vithost.h", "lib/libvhsdk.so",
        "lib/cmake/vithost/vithostConfig.cmake", "lib/cmake/vithost/vithostConfigVersion.cmake",
        "lib/pkgconfig/vithost.pc", "lib/vithost/plugins/vit.so", "lib/vithost/plugins/mta.so",
        "include/vithost/vh_testhost.h", "lib/libvhtesthost.so",
        "lib/pkgconfig/vithost-testhost.pc"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!exists(prefix, parts[i])) fail_msg("the install lacks %s/%s", prefix, parts[i]);
    assert_int_equal(sh("cp -a %s %s/moved", prefix, tmp), 0);
    assert_int_equal(sh("cd / && VITHOST_PLUGIN_PATH= %s/moved/bin/vithost plugins > %s/moved.txt",
                        tmp, tmp),
                     0);
    assert_int_equal(sh("grep -q '%s/moved/lib/vithost/plugins/vit.so' %s/moved.txt", tmp, tmp),
                     0);
    /* The MPI backend, when built, beside libvhsdk: found from bin/ too. */
    if (exists(prefix, "lib/libvh_comm_mpi.so"))
        assert_int_equal(sh("readelf -d %s/moved/lib/libvh_comm_mpi.so | grep -q 'ORIGIN'", tmp),
                         0);
}

static void test_pkg_config(void **state) {
    (void)state;
    if (sh("command -v pkg-config") != 0) skip();
    assert_int_equal(sh("cd %s && %s/bin/vithost new-plugin optim pc_optim pc", tmp, prefix), 0);
    assert_int_equal(sh("cd %s/pc && PKG_CONFIG_PATH=%s/lib/pkgconfig %s -std=c11 -O2 -Wall "
                        "-Wextra -Werror -shared -fPIC -fvisibility=hidden pc_optim.c -o "
                        "pc_optim.so $(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags "
                        "--libs vithost)",
                        tmp, prefix, VH_TEST_CC, prefix),
                     0);
    /* The generated unit test, through the test host's own .pc. */
    assert_int_equal(sh("cd %s/pc && %s -std=c11 -O2 -Wall -Wextra -Werror test_pc_optim.c -o "
                        "test_pc_optim -Wl,-rpath,%s/lib $(PKG_CONFIG_PATH=%s/lib/pkgconfig "
                        "pkg-config --cflags --libs vithost-testhost) && ./test_pc_optim "
                        "./pc_optim.so",
                        tmp, VH_TEST_CC, prefix, prefix),
                     0);
    char dir[PATHLEN];
    snprintf(dir, sizeof dir, "%s/pc", tmp);
    assert_int_equal(sh("VITHOST_PLUGIN_PATH=%s %s/bin/vithost plugins --describe pc_optim", dir,
                        prefix),
                     0);
}

/* cmake -S dir -B dir/build against the prefix only, warnings as errors;
 * build_type NULL: none given (the package's default). The build's command
 * lines go to dir/build-lines.txt. */
static void cmake_build(const char *dir, const char *build_type) {
    char type[64] = "";
    if (build_type) snprintf(type, sizeof type, "-DCMAKE_BUILD_TYPE=%s", build_type);
    assert_int_equal(sh("%s -S %s -B %s/build -DCMAKE_PREFIX_PATH=%s -DCMAKE_C_COMPILER=%s "
                        "%s -DCMAKE_COMPILE_WARNING_AS_ERROR=ON",
                        VH_TEST_CMAKE, dir, dir, prefix, VH_TEST_CC, type),
                     0);
    assert_int_equal(sh("%s --build %s/build -j2 --verbose > %s/build-lines.txt 2>&1 || "
                        "(cat %s/build-lines.txt; exit 1)",
                        VH_TEST_CMAKE, dir, dir, dir),
                     0);
}

/* A project configured without a build type builds Release: the plugin's
 * compile line has -O2 or -O3 and -std=c11 (the docs' dialect), its link
 * line libm. */
static void assert_optimised(const char *dir, const char *name) {
    assert_int_equal(sh("grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' %s/build/CMakeCache.txt",
                        dir),
                     0);
    assert_int_equal(sh("grep -E -- ' -c [^ ]*/%s\\.c' %s/build-lines.txt "
                        "| grep -E -- ' -O[23]( |$)' | grep -q -- ' -std=c11 '",
                        name, dir),
                     0);
    assert_int_equal(sh("grep -E -- '-o [^ ]*%s\\.so ' %s/build-lines.txt | grep -q -- ' -lm'",
                        name, dir),
                     0);
}

static void new_plugin_trains(const char *role) {
    char name[64], dir[512], recipe[600];
    snprintf(name, sizeof name, "gen_%s", role);
    snprintf(dir, sizeof dir, "%s/new/%s", tmp, name);
    assert_int_equal(sh("%s/bin/vithost new-plugin %s %s %s", prefix, role, name, dir), 0);
    static const char *const files[] = {"CMakeLists.txt", "README.md"};
    for (int i = 0; i < 2; i++) assert_true(exists(dir, files[i]));
    const int is_optim = strcmp(role, "optim") == 0;
    cmake_build(dir, is_optim ? NULL : "RelWithDebInfo");
    if (is_optim) {
        /* Release by default, and the generated unit test passes. */
        assert_optimised(dir, name);
        char test[96];
        snprintf(test, sizeof test, "test_%s.c", name);
        if (!exists(dir, test)) fail_msg("new-plugin optim wrote no %s/%s", dir, test);
        assert_int_equal(sh("%s --test-dir %s/build --output-on-failure", VH_TEST_CTEST, dir), 0);
    }
    char so[PATHLEN];
    snprintf(so, sizeof so, "build/%s.so", name);
    assert_true(exists(dir, so));
    snprintf(recipe, sizeof recipe, "%s/%s.yaml", dir, name);
    char plugins[PATHLEN];
    snprintf(plugins, sizeof plugins, "%s/build", dir);
    train(name, recipe, plugins, NULL);
}

static void test_new_plugin_model(void **state) { (void)state; new_plugin_trains("model"); }
static void test_new_plugin_precision(void **state) { (void)state; new_plugin_trains("precision"); }
static void test_new_plugin_sharding(void **state) { (void)state; new_plugin_trains("sharding"); }
static void test_new_plugin_optim(void **state) { (void)state; new_plugin_trains("optim"); }
static void test_new_plugin_data(void **state) { (void)state; new_plugin_trains("data"); }

/* A CSV of 256 rows, label then 784 pixels, for the csv example. */
static void write_csv(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("label,pixels...\n", f);
    for (int i = 0; i < 256; i++) {
        int label = i % 10;
        fprintf(f, "%d", label);
        for (int k = 0; k < 784; k++) fprintf(f, ",%d", (label * 25 + k * (i % 7 + 1)) % 256);
        fputc('\n', f);
    }
    assert_int_equal(fclose(f), 0);
}

static void test_examples_build_and_train(void **state) {
    (void)state;
    char src[PATHLEN], plugins[2 * PATHLEN], recipe[2 * PATHLEN], csv[PATHLEN], extra[3 * PATHLEN];
    snprintf(src, sizeof src, "%s/examples", tmp);
    assert_int_equal(sh("cp -r %s %s", VH_TEST_EXAMPLES_DIR, src), 0);
    cmake_build(src, NULL);
    assert_optimised(src, "lion");
    snprintf(plugins, sizeof plugins, "%s/build", src);
    static const char *const recipes[][2] = {
        {"lion", "optim/lion/lion.yaml"},
        {"bf16sr", "precision/bf16sr/bf16sr.yaml"},
        {"mlp", "models/mlp/mlp.yaml"},
        {"ddp_noverlap", "sharding/ddp_noverlap/ddp_noverlap.yaml"},
        {"csv", "data/csv/csv.yaml"},
    };
    snprintf(csv, sizeof csv, "%s/pixels.csv", tmp);
    write_csv(csv);
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++) {
        snprintf(recipe, sizeof recipe, "%s/%s", src, recipes[i][1]);
        const int is_csv = strcmp(recipes[i][0], "csv") == 0;
        snprintf(extra, sizeof extra, "--set data.train=%s --set data.eval=%s", csv, csv);
        char name[64];
        snprintf(name, sizeof name, "example_%s", recipes[i][0]);
        train(name, recipe, plugins, is_csv ? extra : NULL);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_installed_tree_is_relocatable),
        cmocka_unit_test(test_pkg_config),
        cmocka_unit_test(test_new_plugin_model),
        cmocka_unit_test(test_new_plugin_precision),
        cmocka_unit_test(test_new_plugin_sharding),
        cmocka_unit_test(test_new_plugin_optim),
        cmocka_unit_test(test_new_plugin_data),
        cmocka_unit_test(test_examples_build_and_train),
    };
    return cmocka_run_group_tests(tests, setup_install, teardown_install);
}
