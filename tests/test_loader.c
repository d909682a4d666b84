/* test_loader.c - opening plugins, the search path, scanning, resolving,
 * and the ABI promises.
 *
 * The plugins under VH_TEST_BROKEN_DIR (tests/broken_plugins) are each wrong
 * in one way; every one must be refused with a message naming the file and
 * what is wrong, and must not stay loaded; those of another ABI version must
 * be refused before any of their code runs. good_precision.so is the one
 * valid plugin there; shadow/ holds another plugin of the same name and dup/
 * two files declaring one name. tests/abi/old_minor_model.so is a model
 * plugin as an older minor of the ABI ships it: it loads and trains.
 */
#define _GNU_SOURCE /* setenv, realpath, RTLD_NOLOAD */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eval_command.h"
#include "loader.h"
#include "train_loop.h"
#include "vithost/vh_model.h"
#include "vithost/vh_precision.h"

#define BROKEN VH_TEST_BROKEN_DIR
#define SHADOW VH_TEST_BROKEN_DIR "/shadow"
#define DUP VH_TEST_BROKEN_DIR "/dup"
#define GOOD VH_TEST_BROKEN_DIR "/good_precision.so"
#define OLD_MODEL VH_TEST_BUILD_DIR "/tests/abi/old_minor_model.so"
/* Set by the constructor of some broken plugins when their code runs. */
#define CODE_RAN "VH_TEST_PLUGIN_CODE_RAN"

/* ---- helpers ------------------------------------------------------------ */

static void expect_contains(const char *text, const char *fragment) {
    if (!strstr(text, fragment)) fail_msg("message\n  %s\nlacks\n  %s", text, fragment);
}

/* 1 when dlopen still holds the file. */
static int still_loaded(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) return 0;
    dlclose(h);
    return 1;
}

/* The real path of an existing directory (the search path stores those). */
static char *real(const char *dir) {
    char *r = realpath(dir, NULL);
    if (!r) fail_msg("%s does not exist: build the vh_broken_plugins target", dir);
    return r;
}

/* A search path built by hand. */
static vh_plugin_path path_of(const char **dirs, int count) {
    vh_plugin_path p = {(char **)dirs, count};
    return p;
}

/* Opens file (in the broken dir) with expected_role and checks the refusal:
 * the status (any error when 0), the path in the message, every fragment,
 * and that nothing stays loaded. */
static void expect_refused_role(const char *file, int expected_role, vh_status status,
                                const char *const *fragments) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", BROKEN, file);
    vh_plugin p;
    vh_diag d = {{0}};
    vh_status st = loader_open(&p, path, expected_role, &d);
    if (st == VH_STATUS_OK) {
        loader_close(&p);
        fail_msg("%s was accepted", path);
    }
    if (status != VH_STATUS_OK && st != status)
        fail_msg("%s: status %d instead of %d (%s)", path, (int)st, (int)status, d.text);
    expect_contains(d.text, path);
    for (int i = 0; fragments && fragments[i]; i++) expect_contains(d.text, fragments[i]);
    assert_null(p.handle);
    assert_null(p.path);
    assert_null(p.desc);
    assert_false(still_loaded(path));
}

/* Every file of the broken dir that is not a plugin, and what its message
 * must say. ABI messages are checked in full by their own tests. */
typedef struct refusal {
    const char *file;
    vh_status status; /* 0: whatever config_check_schema returns */
    const char *fragments[4];
} refusal;

static const refusal refusals[] = {
    {"not_elf.so", VH_STATUS_ERR_FORMAT, {"is not a shared object: not an ELF file"}},
    {"no_symbol.so", VH_STATUS_ERR_FORMAT,
     {"is not a vithost plugin: it does not export the symbol 'vh_plugin' (define it with "
      "VH_PLUGIN_DEFINE)"}},
    {"hidden_symbol.so", VH_STATUS_ERR_FORMAT,
     {"does not export the symbol 'vh_plugin'", "VH_PLUGIN_DEFINE"}},
    {"tiny_symbol.so", VH_STATUS_ERR_FORMAT, {"is 1 bytes", "too small"}},
    {"bad_magic.so", VH_STATUS_ERR_FORMAT, {"magic", "0x12345678", "0x47505856"}},
    {"abi_major.so", VH_STATUS_ERR_FORMAT, {"major versions must match"}},
    {"abi_minor.so", VH_STATUS_ERR_FORMAT, {"newer than this host's", "update vithost"}},
    {"next_minor.so", VH_STATUS_ERR_FORMAT, {"newer than this host's", "update vithost"}},
    {"small_descriptor.so", VH_STATUS_ERR_FORMAT, {"struct_size is 12 bytes", "smaller than"}},
    {"bad_role.so", VH_STATUS_ERR_FORMAT, {"unknown role 42"}},
    {"null_vtable.so", VH_STATUS_ERR_FORMAT, {"'precision' plugin without a vtable"}},
    {"small_vtable.so", VH_STATUS_ERR_FORMAT,
     {"'precision' vtable of 16 bytes, smaller than the", "required calls",
      "vh_precision_vtable up to 'update'"}},
    {"vtable_struct_size.so", VH_STATUS_ERR_FORMAT,
     {"inconsistent 'precision' vtable", "struct_size says 0"}},
    {"null_required.so", VH_STATUS_ERR_FORMAT,
     {"precision plugin 'broken' has no 'unscale_and_check' (a required call of the "
      "precision role"}},
    {"null_name.so", VH_STATUS_ERR_FORMAT, {"declares no plugin name"}},
    {"bad_name.so", VH_STATUS_ERR_FORMAT, {"'Bad Name'", "not allowed", "a-z, 0-9"}},
    {"null_version.so", VH_STATUS_ERR_FORMAT, {"no version"}},
    {"null_description.so", VH_STATUS_ERR_FORMAT, {"no description"}},
    {"null_schema.so", VH_STATUS_ERR_FORMAT, {"no config schema"}},
    {"bad_schema.so", VH_STATUS_OK, {"scale"}},
    {"bad_schema_enum.so", VH_STATUS_OK, {"mode"}},
};
#define REFUSAL_COUNT ((int)(sizeof refusals / sizeof refusals[0]))

static void expect_refused(const char *file) {
    for (int i = 0; i < REFUSAL_COUNT; i++) {
        if (strcmp(refusals[i].file, file) == 0) {
            expect_refused_role(file, -1, refusals[i].status, refusals[i].fragments);
            return;
        }
    }
    fail_msg("no refusal listed for %s", file);
}

/* ---- loader_open: files that are not plugins ------------------------- */

static void test_open_missing_file(void **state) {
    (void)state;
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_open(&p, BROKEN "/missing.so", -1, &d), VH_STATUS_ERR_IO);
    expect_contains(d.text, "plugin file " BROKEN "/missing.so does not exist");
    assert_null(p.handle);
}

static void test_open_directory(void **state) {
    (void)state;
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_open(&p, DUP, -1, &d), VH_STATUS_ERR_IO);
    expect_contains(d.text, "plugin file " DUP " is not a regular file");
}

static void test_open_not_elf(void **state) {
    (void)state;
    expect_refused("not_elf.so");
}

static void test_open_no_symbol(void **state) {
    (void)state;
    expect_refused("no_symbol.so");
    expect_refused("hidden_symbol.so");
}

static void test_open_tiny_symbol(void **state) {
    (void)state;
    expect_refused("tiny_symbol.so");
}

static void test_open_bad_magic(void **state) {
    (void)state;
    expect_refused("bad_magic.so");
}

/* abi_major.so lays out everything after the header differently: only a
 * loader that reads the header first reports the versions. */
static void test_open_abi_major(void **state) {
    (void)state;
    char want[256], host[256];
    snprintf(want, sizeof want, "was built for vithost plugin ABI %d.0;", VH_ABI_MAJOR + 1);
    snprintf(host, sizeof host, "this vithost speaks ABI %d.%d (major versions must match: "
             "rebuild the plugin against this SDK)", VH_ABI_MAJOR, VH_ABI_MINOR);
    const char *fragments[] = {want, host, NULL};
    expect_refused_role("abi_major.so", -1, VH_STATUS_ERR_FORMAT, fragments);
    expect_refused("abi_major.so");
}

static void test_open_abi_minor(void **state) {
    (void)state;
    char want[256], host[256];
    snprintf(want, sizeof want, "was built for vithost plugin ABI %d.99,", VH_ABI_MAJOR);
    snprintf(host, sizeof host, "newer than this host's %d.%d: update vithost", VH_ABI_MAJOR,
             VH_ABI_MINOR);
    const char *fragments[] = {want, host, NULL};
    expect_refused_role("abi_minor.so", -1, VH_STATUS_ERR_FORMAT, fragments);
    /* The very next minor, too. */
    snprintf(want, sizeof want, "was built for vithost plugin ABI %d.%d,", VH_ABI_MAJOR,
             VH_ABI_MINOR + 1);
    expect_refused_role("next_minor.so", VH_ROLE_PRECISION, VH_STATUS_ERR_FORMAT, fragments);
}

/* A plugin of another ABI version is refused from its file alone: none of
 * its code runs, not even its constructor (which would set CODE_RAN). The
 * NULL-required-call plugin is refused only once loaded, and shows that the
 * constructor does mark the process when it runs. */
static void test_other_versions_run_no_code(void **state) {
    (void)state;
    static const char *const files[] = {"abi_major.so", "abi_minor.so", "next_minor.so"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        unsetenv(CODE_RAN);
        expect_refused(files[i]);
        if (getenv(CODE_RAN)) fail_msg("%s ran its constructor before being refused", files[i]);
    }
    unsetenv(CODE_RAN);
    expect_refused("null_required.so");
    assert_non_null(getenv(CODE_RAN));
    assert_string_equal(getenv(CODE_RAN), "broken");
    unsetenv(CODE_RAN);
}

/* A required call left NULL: refused, naming the file, role, plugin and call. */
static void test_open_null_required_call(void **state) {
    (void)state;
    char want[512];
    snprintf(want, sizeof want,
             "%s/null_required.so: precision plugin 'broken' has no 'unscale_and_check' (a "
             "required call of the precision role; set it in the plugin's "
             "vh_precision_vtable)",
             BROKEN);
    const char *fragments[] = {want, NULL};
    expect_refused_role("null_required.so", VH_ROLE_PRECISION, VH_STATUS_ERR_FORMAT, fragments);
}

static void test_open_small_descriptor(void **state) {
    (void)state;
    expect_refused("small_descriptor.so");
}

static void test_open_bad_role(void **state) {
    (void)state;
    expect_refused("bad_role.so");
}

static void test_open_bad_vtable(void **state) {
    (void)state;
    expect_refused("null_vtable.so");
    expect_refused("small_vtable.so");
    expect_refused("vtable_struct_size.so");
}

static void test_open_bad_strings(void **state) {
    (void)state;
    expect_refused("null_name.so");
    expect_refused("bad_name.so");
    expect_refused("null_version.so");
    expect_refused("null_description.so");
}

static void test_open_bad_schema(void **state) {
    (void)state;
    expect_refused("null_schema.so");
    expect_refused("bad_schema.so");
    expect_refused("bad_schema_enum.so");
}

/* ---- loader_open: a good plugin -------------------------------------- */

static void test_open_good(void **state) {
    (void)state;
    const int roles[] = {-1, VH_ROLE_PRECISION}; /* any role, then the right one */
    for (int r = 0; r < 2; r++) {
        vh_plugin p;
        vh_diag d = {{0}};
        assert_int_equal(loader_open(&p, GOOD, roles[r], &d), VH_STATUS_OK);
        assert_string_equal(p.path, GOOD);
        assert_non_null(p.handle);
        assert_true(still_loaded(GOOD));
        const vh_plugin_descriptor *desc = p.desc;
        assert_non_null(desc);
        assert_int_equal(desc->magic, VH_PLUGIN_MAGIC);
        assert_int_equal(desc->abi_major, VH_ABI_MAJOR);
        assert_int_equal(desc->abi_minor, VH_ABI_MINOR);
        assert_int_equal(desc->struct_size, sizeof(vh_plugin_descriptor));
        assert_int_equal(desc->role, VH_ROLE_PRECISION);
        assert_string_equal(desc->name, "good_precision");
        assert_string_equal(desc->version, "1.0.0");
        assert_string_equal(desc->description, "a valid precision plugin for the loader tests");
        assert_string_equal(desc->schema[0].key, "scale");
        assert_string_equal(desc->schema[1].key, "mode");
        assert_null(desc->schema[2].key);
        assert_int_equal(desc->vtable_size, sizeof(vh_precision_vtable));
        assert_null(desc->get_extension);
        assert_int_equal(p.plugin_struct_size, sizeof(vh_plugin_descriptor));
        assert_int_equal(p.plugin_vtable_size, sizeof(vh_precision_vtable));
        /* The plugin has no state calls: the host's copy holds its defaults. */
        const vh_precision_vtable *vt = desc->vtable;
        assert_int_equal(vt->struct_size, sizeof(vh_precision_vtable));
        assert_true(loader_plugin_has(&p, offsetof(vh_precision_vtable, update)));
        assert_false(loader_plugin_has(&p, offsetof(vh_precision_vtable, state_size)));
        assert_non_null(vt->state_size);
        assert_non_null(vt->state_save);
        assert_non_null(vt->state_load);
        size_t bytes = 99;
        assert_int_equal(vt->state_size(NULL, &bytes), VH_STATUS_OK);
        assert_int_equal(bytes, 0);
        assert_int_equal(vt->state_save(NULL, NULL, 0), VH_STATUS_OK);
        assert_int_equal(vt->state_load(NULL, NULL, 0), VH_STATUS_OK);
        assert_int_not_equal(vt->state_load(NULL, "x", 1), VH_STATUS_OK);
        loader_close(&p);
        assert_null(p.handle);
        assert_null(p.path);
        assert_false(still_loaded(GOOD));
        loader_close(&p); /* closing twice is harmless */
    }
}

static void test_open_wrong_role(void **state) {
    (void)state;
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_open(&p, GOOD, VH_ROLE_MODEL, &d), VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, GOOD " is a 'precision' plugin (name 'good_precision'), but "
                            "section 'model' needs a 'model' plugin");
    assert_null(p.handle);
    assert_false(still_loaded(GOOD));
}

/* A bare file name is relative to the current directory, not looked up on
 * the dynamic linker's library path. */
static void test_open_relative_name(void **state) {
    (void)state;
    char cwd[PATH_MAX];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(BROKEN), 0);
    vh_plugin p;
    vh_diag d = {{0}};
    vh_status st = loader_resolve(&p, &(vh_plugin_path){NULL, 0}, "good_precision.so",
                                  VH_ROLE_PRECISION, &d);
    assert_int_equal(chdir(cwd), 0);
    if (st != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_string_equal(p.desc->name, "good_precision");
    loader_close(&p);
}

/* ---- the search path -------------------------------------------------- */

static void test_path_env_first_in_order(void **state) {
    (void)state;
    char *broken = real(BROKEN), *shadow = real(SHADOW);
    /* Empty entries are skipped; the same directory written three ways is kept once. */
    assert_int_equal(setenv("VITHOST_PLUGIN_PATH",
                            "::" SHADOW ":/nonexistent/vh-a:" BROKEN "::" BROKEN "/:" SHADOW
                            "/..:",
                            1),
                     0);
    vh_plugin_path p;
    vh_diag d = {{0}};
    assert_int_equal(plugin_path_init(&p, "/nonexistent/vh-bin", &d), VH_STATUS_OK);
    assert_int_equal(p.count, 6);
    assert_string_equal(p.dirs[0], shadow);
    assert_string_equal(p.dirs[1], "/nonexistent/vh-a");
    assert_string_equal(p.dirs[2], broken);
    assert_string_equal(p.dirs[3], "/nonexistent/vh-bin/plugins");
    assert_string_equal(p.dirs[4], "/nonexistent/vh-bin/../lib/vithost/plugins");
    assert_non_null(strstr(p.dirs[5], "vithost/plugins")); /* the install prefix's */
    plugin_path_free(&p);
    assert_int_equal(p.count, 0);
    assert_null(p.dirs);
    unsetenv("VITHOST_PLUGIN_PATH");
    free(broken);
    free(shadow);
}

static void test_path_without_env(void **state) {
    (void)state;
    unsetenv("VITHOST_PLUGIN_PATH");
    vh_plugin_path p;
    vh_diag d = {{0}};
    assert_int_equal(plugin_path_init(&p, "/nonexistent/vh-bin", &d), VH_STATUS_OK);
    assert_int_equal(p.count, 3);
    assert_string_equal(p.dirs[0], "/nonexistent/vh-bin/plugins");
    plugin_path_free(&p);

    assert_int_equal(setenv("VITHOST_PLUGIN_PATH", "", 1), 0);
    assert_int_equal(plugin_path_init(&p, "/nonexistent/vh-bin", &d), VH_STATUS_OK);
    assert_int_equal(p.count, 3);
    assert_string_equal(p.dirs[0], "/nonexistent/vh-bin/plugins");
    plugin_path_free(&p);
    unsetenv("VITHOST_PLUGIN_PATH");
}

/* Without an exe_dir, the directory of the running executable is used. */
static void test_path_from_executable(void **state) {
    (void)state;
    unsetenv("VITHOST_PLUGIN_PATH");
    char *exe = realpath("/proc/self/exe", NULL);
    assert_non_null(exe);
    *strrchr(exe, '/') = '\0';
    char want[PATH_MAX];
    snprintf(want, sizeof want, "%s/plugins", exe);
    char *want_real = realpath(want, NULL);

    vh_plugin_path p;
    vh_diag d = {{0}};
    assert_int_equal(plugin_path_init(&p, NULL, &d), VH_STATUS_OK);
    assert_true(p.count >= 2);
    assert_string_equal(p.dirs[0], want_real ? want_real : want);
    plugin_path_free(&p);
    free(want_real);
    free(exe);
}

/* ---- scanning --------------------------------------------------------- */

static int count_lines(const char *text) {
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

static void test_scan_reports_every_broken_file(void **state) {
    (void)state;
    const char *dirs[] = {"/nonexistent/vh-skipped", BROKEN};
    vh_plugin_path path = path_of(dirs, 2);
    vh_plugin_info *infos;
    int count;
    char *problems;
    vh_diag d = {{0}};
    assert_int_equal(plugin_scan(&path, &infos, &count, &problems, &d), VH_STATUS_OK);

    assert_int_equal(count, 1);
    assert_string_equal(infos[0].path, GOOD);
    assert_string_equal(infos[0].name, "good_precision");
    assert_int_equal(infos[0].role, VH_ROLE_PRECISION);
    assert_string_equal(infos[0].version, "1.0.0");
    assert_string_equal(infos[0].description, "a valid precision plugin for the loader tests");
    assert_null(infos[0].shadowed_by);
    assert_false(still_loaded(GOOD));

    assert_non_null(problems);
    assert_int_equal(count_lines(problems), REFUSAL_COUNT);
    char path_text[PATH_MAX];
    for (int i = 0; i < REFUSAL_COUNT; i++) {
        snprintf(path_text, sizeof path_text, "%s/%s", BROKEN, refusals[i].file);
        expect_contains(problems, path_text);
        assert_false(still_loaded(path_text));
    }
    /* Sorted by file name: abi_major.so comes before tiny_symbol.so. */
    assert_true(strstr(problems, BROKEN "/abi_major.so") <
                strstr(problems, BROKEN "/tiny_symbol.so"));
    free(problems);
    plugin_infos_free(infos, count);
}

static void test_scan_without_problems(void **state) {
    (void)state;
    const char *dirs[] = {SHADOW};
    vh_plugin_path path = path_of(dirs, 1);
    vh_plugin_info *infos;
    int count;
    char *problems = (char *)"not reset";
    vh_diag d = {{0}};
    assert_int_equal(plugin_scan(&path, &infos, &count, &problems, &d), VH_STATUS_OK);
    assert_int_equal(count, 1);
    assert_null(problems);
    assert_string_equal(infos[0].version, "2.0.0");
    plugin_infos_free(infos, count);

    /* problems may be left out. */
    assert_int_equal(plugin_scan(&path, &infos, &count, NULL, &d), VH_STATUS_OK);
    assert_int_equal(count, 1);
    plugin_infos_free(infos, count);
}

static void test_scan_duplicate_in_one_dir(void **state) {
    (void)state;
    const char *dirs[] = {BROKEN, DUP};
    vh_plugin_path path = path_of(dirs, 2);
    vh_plugin_info *infos = (vh_plugin_info *)1;
    int count = -1;
    char *problems = NULL;
    vh_diag d = {{0}};
    assert_int_equal(plugin_scan(&path, &infos, &count, &problems, &d), VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "two plugins named 'dup' in " DUP ": dup_a.so and dup_b.so; "
                            "remove one");
    assert_null(infos);
    assert_int_equal(count, 0);
    assert_null(problems);
    assert_false(still_loaded(DUP "/dup_a.so"));
}

static void test_scan_shadowing(void **state) {
    (void)state;
    for (int order = 0; order < 2; order++) {
        const char *first = order ? SHADOW : BROKEN, *second = order ? BROKEN : SHADOW;
        const char *dirs[] = {first, second, first}; /* a dir listed twice counts once */
        vh_plugin_path path = path_of(dirs, 3);
        vh_plugin_info *infos;
        int count;
        vh_diag d = {{0}};
        assert_int_equal(plugin_scan(&path, &infos, &count, NULL, &d), VH_STATUS_OK);
        assert_int_equal(count, 2);
        const char *early = order ? SHADOW "/shadow_precision.so" : GOOD;
        const char *late = order ? GOOD : SHADOW "/shadow_precision.so";
        assert_string_equal(infos[0].path, early);
        assert_null(infos[0].shadowed_by);
        assert_string_equal(infos[1].path, late);
        assert_string_equal(infos[1].name, "good_precision");
        assert_non_null(infos[1].shadowed_by);
        assert_string_equal(infos[1].shadowed_by, early);
        plugin_infos_free(infos, count);
    }
}

/* ---- resolving by name -------------------------------------------------- */

static void test_resolve_by_name(void **state) {
    (void)state;
    const char *dirs[] = {"/nonexistent/vh-skipped", SHADOW, BROKEN};
    vh_plugin_path path = path_of(dirs, 3);
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_resolve(&p, &path, "good_precision", VH_ROLE_PRECISION, &d),
                     VH_STATUS_OK);
    /* The first directory wins. */
    assert_string_equal(p.path, SHADOW "/shadow_precision.so");
    assert_string_equal(p.desc->version, "2.0.0");
    loader_close(&p);

    path = path_of(dirs + 2, 1);
    assert_int_equal(loader_resolve(&p, &path, "good_precision", VH_ROLE_PRECISION, &d),
                     VH_STATUS_OK);
    assert_string_equal(p.path, GOOD);
    assert_string_equal(p.desc->version, "1.0.0");
    loader_close(&p);
}

static void test_resolve_through_env(void **state) {
    (void)state;
    assert_int_equal(setenv("VITHOST_PLUGIN_PATH", BROKEN ":" SHADOW, 1), 0);
    vh_plugin_path path;
    vh_diag d = {{0}};
    assert_int_equal(plugin_path_init(&path, "/nonexistent/vh-bin", &d), VH_STATUS_OK);
    unsetenv("VITHOST_PLUGIN_PATH");
    vh_plugin p;
    assert_int_equal(loader_resolve(&p, &path, "good_precision", VH_ROLE_PRECISION, &d),
                     VH_STATUS_OK);
    assert_string_equal(p.desc->version, "1.0.0");
    loader_close(&p);
    plugin_path_free(&path);
}

static void test_resolve_by_path(void **state) {
    (void)state;
    vh_plugin_path empty = {NULL, 0};
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_resolve(&p, &empty, GOOD, VH_ROLE_PRECISION, &d), VH_STATUS_OK);
    assert_string_equal(p.path, GOOD);
    loader_close(&p);

    assert_int_equal(loader_resolve(&p, &empty, GOOD, VH_ROLE_MODEL, &d), VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, GOOD " is a 'precision' plugin (name 'good_precision'), but "
                            "section 'model' needs a 'model' plugin");

    assert_int_equal(loader_resolve(&p, &empty, BROKEN "/abi_major.so", VH_ROLE_MODEL, &d),
                     VH_STATUS_ERR_FORMAT);
    expect_contains(d.text, BROKEN "/abi_major.so was built for vithost plugin ABI");

    /* Ends in .so: a file, even without '/'. */
    assert_int_equal(loader_resolve(&p, &empty, "surely_missing.so", VH_ROLE_MODEL, &d),
                     VH_STATUS_ERR_IO);
    expect_contains(d.text, "plugin file surely_missing.so does not exist");
}

static void test_resolve_not_found(void **state) {
    (void)state;
    const char *dirs[] = {"/nonexistent/vh-skipped", BROKEN};
    vh_plugin_path path = path_of(dirs, 2);
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_resolve(&p, &path, "good_precison", VH_ROLE_PRECISION, &d),
                     VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "no plugin named 'good_precison' on the search path "
                            "(/nonexistent/vh-skipped:" BROKEN ")");
    expect_contains(d.text, "did you mean 'good_precision'?");
    expect_contains(d.text, "`vithost plugins`");
    assert_null(p.handle);

    /* Nothing close: no suggestion. */
    assert_int_equal(loader_resolve(&p, &path, "zzz", VH_ROLE_PRECISION, &d),
                     VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "no plugin named 'zzz'");
    assert_null(strstr(d.text, "did you mean"));

    /* A near name of another role is suggested with its role. */
    assert_int_equal(loader_resolve(&p, &path, "good_precison", VH_ROLE_MODEL, &d),
                     VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "did you mean 'good_precision' (a 'precision' plugin)?");

    vh_plugin_path empty = {NULL, 0};
    assert_int_equal(loader_resolve(&p, &empty, "vit", VH_ROLE_MODEL, &d),
                     VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "no plugin named 'vit'");
}

static void test_resolve_wrong_role(void **state) {
    (void)state;
    const char *dirs[] = {BROKEN};
    vh_plugin_path path = path_of(dirs, 1);
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_resolve(&p, &path, "good_precision", VH_ROLE_MODEL, &d),
                     VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, GOOD " is a 'precision' plugin (name 'good_precision'), but "
                            "section 'model' needs a 'model' plugin");
    assert_null(p.handle);
    assert_false(still_loaded(GOOD));
}

/* A file named after the plugin that cannot be loaded: its own error, not
 * "no plugin named". */
static void test_resolve_broken_file(void **state) {
    (void)state;
    const char *dirs[] = {BROKEN};
    vh_plugin_path path = path_of(dirs, 1);
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_resolve(&p, &path, "abi_minor", VH_ROLE_PRECISION, &d),
                     VH_STATUS_ERR_FORMAT);
    expect_contains(d.text, BROKEN "/abi_minor.so was built for vithost plugin ABI");
    assert_null(strstr(d.text, "no plugin named"));
}

static void test_resolve_duplicate(void **state) {
    (void)state;
    const char *dirs[] = {DUP};
    vh_plugin_path path = path_of(dirs, 1);
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_resolve(&p, &path, "dup", VH_ROLE_PRECISION, &d),
                     VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "two plugins named 'dup' in " DUP ": dup_a.so and dup_b.so; "
                            "remove one");
    assert_null(p.handle);

    /* An earlier directory with one 'dup' wins before the ambiguous one is read;
     * a duplicate of another name does not block resolving this one. */
    const char *dirs2[] = {BROKEN, DUP};
    path = path_of(dirs2, 2);
    assert_int_equal(loader_resolve(&p, &path, "good_precision", VH_ROLE_PRECISION, &d),
                     VH_STATUS_OK);
    loader_close(&p);
}

/* ---- the build tree's plugins ------------------------------------------- */

/* Every plugin the build puts on the path passes the loader and resolves by
 * its name to its own file. */
static void test_build_plugins_load(void **state) {
    (void)state;
    const char *dirs[] = {VH_TEST_PLUGIN_DIR};
    vh_plugin_path path = path_of(dirs, 1);
    vh_plugin_info *infos;
    int count;
    char *problems;
    vh_diag d = {{0}};
    assert_int_equal(plugin_scan(&path, &infos, &count, &problems, &d), VH_STATUS_OK);
    if (problems) fail_msg("plugins of the build refused:\n%s", problems);
    assert_true(count > 0);
    for (int i = 0; i < count; i++) {
        vh_plugin p;
        if (loader_resolve(&p, &path, infos[i].name, infos[i].role, &d) != VH_STATUS_OK)
            fail_msg("%s", d.text);
        assert_string_equal(p.path, infos[i].path);
        loader_close(&p);
    }
    plugin_infos_free(infos, count);
}

/* ---- a plugin of an older minor ------------------------------------------ */

/* Its descriptor ends before get_extension and its vtable at backward (with
 * non-pointers right after each): the host reads neither past its size and
 * stands in for every optional call. */
static void test_old_minor_model_loads(void **state) {
    (void)state;
    vh_plugin p;
    vh_diag d = {{0}};
    if (loader_open(&p, OLD_MODEL, VH_ROLE_MODEL, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_int_equal(p.plugin_struct_size, offsetof(vh_plugin_descriptor, get_extension));
    assert_int_equal(p.plugin_vtable_size, offsetof(vh_model_vtable, train_flops_per_image));
    assert_int_equal(p.desc->abi_minor, 0);
    assert_null(p.desc->get_extension);
    assert_string_equal(p.desc->name, "old_minor_model");
    const vh_model_vtable *vt = p.desc->vtable;
    assert_int_equal(vt->struct_size, sizeof(vh_model_vtable));
    assert_non_null(vt->backward);
    assert_true(loader_plugin_has(&p, offsetof(vh_model_vtable, backward)));
    assert_false(loader_plugin_has(&p, offsetof(vh_model_vtable, train_flops_per_image)));
    assert_false(loader_plugin_has(&p, offsetof(vh_model_vtable, load_weights)));
    /* the host's defaults */
    assert_true(vt->train_flops_per_image(NULL) == 0.0);
    size_t bytes = 99;
    assert_int_equal(vt->state_size(NULL, &bytes), VH_STATUS_OK);
    assert_int_equal(bytes, 0);
    const char *path = "not reset";
    assert_int_equal(vt->initial_weights(NULL, &path), VH_STATUS_OK);
    assert_null(path);
    assert_null(vt->load_weights); /* the host loads by name and shape itself */
    loader_close(&p);
}

static char *read_stream(FILE *f) {
    long n = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)n + 1);
    if (n > 0 && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = '\0';
    fclose(f);
    return text;
}

/* Trains with the test plugins through train_run: stopped mid-pass with a
 * checkpoint, resumed, then evaluated from the run folder; returns what the
 * run printed. */
static char *train_old_minor(const char *dir, int64_t stop_after, int resume, vh_status want) {
    static const char recipe[] =
        "run: {epochs: 2, batch_size: 16, log_every: 2, eval_every: 1, peak_tflops: 1}\n"
        "model: {plugin: " OLD_MODEL "}\n"
        "precision: {plugin: test_precision}\n"
        "sharding: {plugin: test_sharding}\n"
        "optim: {plugin: test_optim, lr: 0.1, momentum: 0.9}\n"
        "data: {plugin: test_data, train_size: 64}\n";
    FILE *out = tmpfile();
    assert_non_null(out);
    vh_run run;
    vh_diag d = {{0}};
    vh_run_options opts = {.out = out};
    if (run_open_text(&run, "old_minor.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    vh_train_options to = {.out_dir = dir, .resume = resume, .stop_after = stop_after};
    vh_status st = train_run(&run, &to, &d);
    if (st != want) fail_msg("train_run: status %d instead of %d: %s", (int)st, (int)want, d.text);
    run_close(&run);
    return read_stream(out);
}

static void test_old_minor_model_trains(void **state) {
    (void)state;
    char dir[] = "/tmp/vithost-test-loader-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char run_dir[512];
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    assert_int_equal(setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1), 0);

    char *text = train_old_minor(run_dir, 3, 0, VH_STATUS_ERR_INTERRUPTED);
    if (!strstr(text, "FLOPs per image unknown")) fail_msg("no FLOP default in\n%s", text);
    free(text);
    text = train_old_minor(run_dir, 0, 1, VH_STATUS_OK);
    /* The checkpoint's weights, loaded by the host's own loader. */
    if (!strstr(text, "model.safetensors: loaded 2 tensor(s)")) fail_msg("no load line in\n%s", text);
    if (!strstr(text, "vithost: finished 8 steps")) fail_msg("did not finish:\n%s", text);
    free(text);

    /* `vithost eval` of the run: strict loading through the host's loader. */
    vh_run run;
    vh_diag d = {{0}};
    FILE *log = tmpfile(), *json = tmpfile();
    vh_run_options opts = {.out = log};
    static const char recipe[] =
        "run: {batch_size: 16}\n"
        "model: {plugin: " OLD_MODEL "}\nprecision: {plugin: test_precision}\n"
        "sharding: {plugin: test_sharding}\noptim: {plugin: test_optim}\n"
        "data: {plugin: test_data, train_size: 64}\n";
    if (run_open_text(&run, "old_minor.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    if (eval_command(&run, run_dir, json, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    run_close(&run);
    free(read_stream(log));
    text = read_stream(json);
    assert_non_null(strstr(text, "\"eval_top1\": "));
    free(text);
    unsetenv("VITHOST_PLUGIN_PATH");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- hardening: unusable files by name, other architectures, names -------- */

/* A fresh folder under /tmp (mode 0755) for hand-made plugin files. */
static void make_dir(char *dir, size_t len) {
    snprintf(dir, len, "/tmp/vh-test-loader-XXXXXX");
    if (!mkdtemp(dir)) fail_msg("mkdtemp failed");
    chmod(dir, 0755);
}

static void copy_file(const char *from, const char *to, int machine) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    unsigned char buf[65536];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (machine >= 0 && total == 0) { /* e_machine, little-endian */
            buf[18] = (unsigned char)(machine & 0xff);
            buf[19] = (unsigned char)(machine >> 8);
        }
        fwrite(buf, 1, n, out);
        total += n;
    }
    fclose(in);
    fclose(out);
}

static void remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A shared object of another architecture: said so, by loader_open and in
 * the scan (glibc's dlopen reports "No such file or directory"). */
static void test_wrong_architecture(void **state) {
    (void)state;
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/good_precision.so", dir);
#if defined(__aarch64__)
    copy_file(GOOD, path, 62); /* x86-64 on an aarch64 machine */
#else
    copy_file(GOOD, path, 183); /* aarch64 elsewhere */
#endif
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_equal(loader_open(&p, path, -1, &d), VH_STATUS_ERR_FORMAT);
    expect_contains(d.text, path);
    expect_contains(d.text, "was built for another architecture");
    assert_null(strstr(d.text, "No such file"));
    /* The scan reports it the same way. */
    const char *dirs[] = {dir};
    vh_plugin_path pp = path_of(dirs, 1);
    vh_plugin_info *infos = NULL;
    int count = 0;
    char *problems = NULL;
    assert_int_equal(plugin_scan(&pp, &infos, &count, &problems, &d), VH_STATUS_OK);
    assert_non_null(problems);
    expect_contains(problems, "was built for another architecture");
    free(problems);
    plugin_infos_free(infos, count);
    remove_dir(dir);
}

/* A file <name>.so early on the path that cannot be used is not skipped in
 * favour of a good one further down: refused, naming the file and why. */
static void test_resolve_stops_at_unusable_file(void **state) {
    (void)state;
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/good_precision.so", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("not a plugin\n", f);
    fclose(f);
    const char *dirs[] = {dir, BROKEN};
    vh_plugin_path pp = path_of(dirs, 2);
    vh_plugin p;
    vh_diag d = {{0}};
    assert_int_not_equal(loader_resolve(&p, &pp, "good_precision", VH_ROLE_PRECISION, &d),
                         VH_STATUS_OK);
    expect_contains(d.text, "plugin 'good_precision': ");
    expect_contains(d.text, path);
    expect_contains(d.text, "not an ELF file");
    remove_dir(dir);
}

/* A name cannot leave the search path: a value that is neither a name nor
 * a path ending in .so is refused, saying how to write a path. */
static void test_names_stay_on_the_path(void **state) {
    (void)state;
    const char *dirs[] = {BROKEN};
    vh_plugin_path pp = path_of(dirs, 1);
    vh_plugin p;
    vh_diag d = {{0}};
    char rel[PATH_MAX];
    /* ../../x from the broken folder would reach a real file */
    snprintf(rel, sizeof rel, "%s/good_precision", BROKEN);
    assert_int_equal(loader_resolve(&p, &pp, rel, VH_ROLE_PRECISION, &d), VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "is not a plugin name");
    expect_contains(d.text, "ending in .so");
    assert_int_equal(loader_resolve(&p, &pp, "../../x", -1, &d), VH_STATUS_ERR_CONFIG);
    expect_contains(d.text, "'../../x' is not a plugin name");
    /* written as a path, it is one */
    snprintf(rel, sizeof rel, "%s/good_precision.so", BROKEN);
    assert_int_equal(loader_resolve(&p, &pp, rel, VH_ROLE_PRECISION, &d), VH_STATUS_OK);
    loader_close(&p);
}

/* Plugin files or folders others can write: a warning in the scan. */
static void test_world_writable_warned(void **state) {
    (void)state;
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/good_precision.so", dir);
    copy_file(GOOD, path, -1);
    const char *dirs[] = {dir};
    vh_plugin_path pp = path_of(dirs, 1);
    vh_plugin_info *infos = NULL;
    int count = 0;
    char *problems = NULL;
    vh_diag d = {{0}};
    assert_int_equal(plugin_scan(&pp, &infos, &count, &problems, &d), VH_STATUS_OK);
    assert_int_equal(count, 1);
    assert_true(!problems || !strstr(problems, "world-writable"));
    free(problems);
    plugin_infos_free(infos, count);
    assert_int_equal(chmod(dir, 0777), 0);
    assert_int_equal(plugin_scan(&pp, &infos, &count, &problems, &d), VH_STATUS_OK);
    assert_int_equal(count, 1); /* still listed: a warning, not a refusal */
    assert_non_null(problems);
    expect_contains(problems, "plugin folder");
    expect_contains(problems, "is world-writable");
    free(problems);
    plugin_infos_free(infos, count);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(chmod(path, 0666), 0);
    assert_int_equal(plugin_scan(&pp, &infos, &count, &problems, &d), VH_STATUS_OK);
    assert_non_null(problems);
    expect_contains(problems, "plugin file");
    expect_contains(problems, "is world-writable");
    free(problems);
    plugin_infos_free(infos, count);
    remove_dir(dir);
}

int main(void) {
    /* A plugin path from the caller's shell must not leak into the tests. */
    unsetenv("VITHOST_PLUGIN_PATH");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_missing_file),
        cmocka_unit_test(test_open_directory),
        cmocka_unit_test(test_open_not_elf),
        cmocka_unit_test(test_open_no_symbol),
        cmocka_unit_test(test_open_tiny_symbol),
        cmocka_unit_test(test_open_bad_magic),
        cmocka_unit_test(test_open_abi_major),
        cmocka_unit_test(test_open_abi_minor),
        cmocka_unit_test(test_other_versions_run_no_code),
        cmocka_unit_test(test_open_null_required_call),
        cmocka_unit_test(test_open_small_descriptor),
        cmocka_unit_test(test_open_bad_role),
        cmocka_unit_test(test_open_bad_vtable),
        cmocka_unit_test(test_open_bad_strings),
        cmocka_unit_test(test_open_bad_schema),
        cmocka_unit_test(test_open_good),
        cmocka_unit_test(test_open_wrong_role),
        cmocka_unit_test(test_open_relative_name),
        cmocka_unit_test(test_path_env_first_in_order),
        cmocka_unit_test(test_path_without_env),
        cmocka_unit_test(test_path_from_executable),
        cmocka_unit_test(test_scan_reports_every_broken_file),
        cmocka_unit_test(test_scan_without_problems),
        cmocka_unit_test(test_scan_duplicate_in_one_dir),
        cmocka_unit_test(test_scan_shadowing),
        cmocka_unit_test(test_resolve_by_name),
        cmocka_unit_test(test_resolve_through_env),
        cmocka_unit_test(test_resolve_by_path),
        cmocka_unit_test(test_resolve_not_found),
        cmocka_unit_test(test_resolve_wrong_role),
        cmocka_unit_test(test_resolve_broken_file),
        cmocka_unit_test(test_resolve_duplicate),
        cmocka_unit_test(test_build_plugins_load),
        cmocka_unit_test(test_old_minor_model_loads),
        cmocka_unit_test(test_old_minor_model_trains),
        cmocka_unit_test(test_wrong_architecture),
        cmocka_unit_test(test_resolve_stops_at_unusable_file),
        cmocka_unit_test(test_names_stay_on_the_path),
        cmocka_unit_test(test_world_writable_warned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
