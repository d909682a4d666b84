/* test_config.c - recipe sections checked against schemas.
 *
 * A schema shaped like a real model plugin's is resolved against recipes from
 * strings and from files; every type is tried with good and bad text, and
 * broken schemas must be refused by config_check_schema.
 * Run one test by name: test_config <glob>.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#ifndef VH_TEST_DATA_DIR
#define VH_TEST_DATA_DIR "tests/data" /* when built by hand from the repo root */
#endif
#define RECIPES VH_TEST_DATA_DIR "/recipes"

enum { OPT = VH_CONFIG_KEY_FLAG_OPTIONAL };

static const vh_config_key schema[] = {
    {"dim", VH_CONFIG_TYPE_INT, NULL, "width of the model", NULL, 1, 4096, 0},
    {"depth", VH_CONFIG_TYPE_INT, "4", "transformer blocks", NULL, 1, 64, 0},
    {"heads", VH_CONFIG_TYPE_INT, "4", "attention heads", NULL, 1, 64, 0},
    {"offset", VH_CONFIG_TYPE_INT, "-2", "no range", NULL, 0, 0, 0},
    {"dropout", VH_CONFIG_TYPE_FLOAT, "0.1", "dropout rate", NULL, 0, 1, 0},
    {"lr", VH_CONFIG_TYPE_FLOAT, "1e-3", "learning rate", NULL, 0, 0, 0},
    {"bias", VH_CONFIG_TYPE_BOOL, "true", "linear layers have a bias", NULL, 0, 0, 0},
    {"name", VH_CONFIG_TYPE_STRING, "vit", "a label", NULL, 0, 0, 0},
    {"classifier", VH_CONFIG_TYPE_ENUM, "token", "head input", "token|pooled", 0, 0, 0},
    {"root", VH_CONFIG_TYPE_PATH, "/tmp", "where data lives", NULL, 0, 0, 0},
    {"num_classes", VH_CONFIG_TYPE_INT, NULL, "from the data plugin", NULL, 1, 1e6, OPT},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

typedef struct fixture {
    vh_recipe r;
    vh_section_config c;
    vh_diag d;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    return f ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    config_free(&f->c);
    recipe_free(&f->r);
    free(f);
    return 0;
}

static void check_prefix(const char *text, const char *prefix, const char *file,
                         int line) {
    if (strncmp(text, prefix, strlen(prefix)) == 0) return;
    print_error("message\n%s\ndoes not start with\n%s\n", text, prefix);
    _fail(file, line);
}

static void check_contains(const char *text, const char *needle, const char *file,
                           int line) {
    if (strstr(text, needle)) return;
    print_error("message\n%s\ndoes not contain\n%s\n", text, needle);
    _fail(file, line);
}

#define assert_prefix(text, prefix) check_prefix((text), (prefix), __FILE__, __LINE__)
#define assert_contains(text, needle) check_contains((text), (needle), __FILE__, __LINE__)

static void load(fixture *f, const char *text) {
    recipe_free(&f->r);
    vh_status st = recipe_load_string(&f->r, "recipe.yaml", text, strlen(text), &f->d);
    if (st != VH_STATUS_OK) print_error("%s\n", f->d.text);
    assert_int_equal(st, VH_STATUS_OK);
}

static vh_status resolve(fixture *f) {
    config_free(&f->c);
    return config_resolve(&f->c, &f->r, "model", schema, "plugin", &f->d);
}

/* Loads "model:\n  plugin: test\n  <key>: <text>\n" and resolves it. */
static vh_status resolve_one(fixture *f, const char *key, const char *text) {
    char recipe[512];
    snprintf(recipe, sizeof recipe, "model:\n  plugin: test\n  %s: %s\n", key, text);
    load(f, recipe);
    return resolve(f);
}

static const vh_config_entry *entry(const fixture *f, const char *key) {
    const vh_config_entry *e = config_find(&f->c, key);
    assert_non_null(e);
    return e;
}

/* ---- good sections -------------------------------------------------------- */

static void test_resolve_string(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: test\n  dim: 64\n  lr: 3e-4\n  classifier: pooled\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_string_equal(f->c.section, "model");
    assert_int_equal(f->c.count, 11); /* one per schema key, schema order */
    for (int i = 0; i < f->c.count; i++)
        assert_ptr_equal(f->c.entries[i].key, &schema[i]);
    assert_null(config_find(&f->c, "plugin")); /* skipped, not part of the schema */

    const vh_config_entry *dim = entry(f, "dim");
    assert_true(dim->has_value);
    assert_int_equal(dim->as.i, 64);
    assert_string_equal(dim->text, "64");
    assert_int_equal(dim->origin.source, VH_CONFIG_SOURCE_RECIPE);
    assert_ptr_equal(dim->origin.file, f->r.file);
    assert_int_equal(dim->origin.line, 3);
    assert_int_equal(dim->origin.column, 8);

    assert_true(entry(f, "lr")->as.f == 3e-4);
    assert_string_equal(entry(f, "classifier")->text, "pooled");
    assert_int_equal(entry(f, "classifier")->origin.line, 5);
}

static void test_defaults_and_origins(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: test\n  dim: 8\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    const vh_config_entry *depth = entry(f, "depth");
    assert_true(depth->has_value);
    assert_int_equal(depth->as.i, 4);
    assert_string_equal(depth->text, "4");
    assert_int_equal(depth->origin.source, VH_CONFIG_SOURCE_DEFAULT);
    assert_null(depth->origin.file);
    assert_int_equal(depth->origin.line, 0);
    assert_int_equal(entry(f, "offset")->as.i, -2);
    assert_true(entry(f, "dropout")->as.f == 0.1);
    assert_true(entry(f, "lr")->as.f == 1e-3);
    assert_int_equal(entry(f, "bias")->as.b, 1);
    assert_string_equal(entry(f, "name")->text, "vit");
    assert_string_equal(entry(f, "classifier")->text, "token");
    assert_string_equal(entry(f, "root")->text, "/tmp");
}

static void test_optional_key(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: test\n  dim: 8\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    const vh_config_entry *n = entry(f, "num_classes");
    assert_false(n->has_value);
    assert_null(n->text);
    assert_int_equal(n->origin.source, VH_CONFIG_SOURCE_DEFAULT);

    assert_int_equal(resolve_one(f, "num_classes", "10"), VH_STATUS_ERR_CONFIG);
    assert_contains(f->d.text, "needs key 'dim'"); /* dim is still required */
    load(f, "model:\n  plugin: test\n  dim: 8\n  num_classes: 10\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_true(entry(f, "num_classes")->has_value);
    assert_int_equal(entry(f, "num_classes")->as.i, 10);
}

static void test_resolve_file(void **state) {
    fixture *f = *state;
    const char *path = RECIPES "/config.yaml";
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_OK);
    assert_int_equal(resolve(f), VH_STATUS_OK);
    const vh_config_entry *dim = entry(f, "dim");
    assert_int_equal(dim->as.i, 128);
    assert_string_equal(dim->origin.file, path);
    assert_int_equal(dim->origin.line, 4);
    assert_true(entry(f, "dropout")->as.f == 0.25);
    assert_int_equal(entry(f, "bias")->as.b, 0);
    assert_int_equal(entry(f, "bias")->origin.source, VH_CONFIG_SOURCE_RECIPE);
    assert_string_equal(entry(f, "classifier")->text, "pooled");
    assert_string_equal(entry(f, "root")->text, "data/train");
    assert_int_equal(entry(f, "depth")->origin.source, VH_CONFIG_SOURCE_DEFAULT);
}

static void test_absent_section_takes_defaults(void **state) {
    fixture *f = *state;
    static const vh_config_key all_defaults[] = {
        {"seed", VH_CONFIG_TYPE_INT, "0", "random seed", NULL, 0, 0, 0},
        {"device", VH_CONFIG_TYPE_ENUM, "cpu", "where to run", "cpu|cuda", 0, 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
    };
    load(f, "model:\n  dim: 8\n");
    assert_int_equal(config_resolve(&f->c, &f->r, "run", all_defaults, NULL, &f->d),
                     VH_STATUS_OK);
    assert_int_equal(f->c.count, 2);
    assert_int_equal(entry(f, "seed")->as.i, 0);
    assert_string_equal(entry(f, "device")->text, "cpu");
    config_free(&f->c);
    /* No recipe at all works the same. */
    assert_int_equal(config_resolve(&f->c, NULL, "run", all_defaults, NULL, &f->d),
                     VH_STATUS_OK);
    assert_string_equal(entry(f, "device")->text, "cpu");
}

/* ---- unknown keys ----------------------------------------------------------- */

static void test_unknown_key_suggestion(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: test\n  dimm: 64\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:3:3: unknown key 'dimm' in section 'model'; "
                             "did you mean 'dim'?\n");
    assert_contains(f->d.text, "\n      dimm: 64\n      ^");
}

static void test_unknown_key_from_file(void **state) {
    fixture *f = *state;
    const char *path = RECIPES "/misspelt_key.yaml";
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_OK);
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, path);
    assert_contains(f->d.text, ":3:3: unknown key 'dimm' in section 'model'; did you "
                               "mean 'dim'?\n      dimm: 64\n      ^");
}

static void test_unknown_key_lists_valid(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: test\n  colour: red\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:3:3: unknown key 'colour' in section 'model'; "
                             "valid keys: plugin, dim, depth, heads, offset, dropout, lr, "
                             "bias, name, classifier, root, num_classes\n");
}

static void test_unknown_key_plugin_suggested(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugn: test\n  dim: 8\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:3: unknown key 'plugn' in section 'model'; "
                             "did you mean 'plugin'?");
    /* Without a skip key, "plugin" is an unknown key like any other. */
    load(f, "model:\n  plugin: test\n  dim: 8\n");
    assert_int_equal(config_resolve(&f->c, &f->r, "model", schema, NULL, &f->d),
                     VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:3: unknown key 'plugin' in section 'model'");
}

static void test_unknown_key_empty_schema(void **state) {
    fixture *f = *state;
    static const vh_config_key none[] = {{NULL, 0, NULL, NULL, NULL, 0, 0, 0}};
    load(f, "precision:\n  plugin: fp32\n  dtype: bf16\n");
    assert_int_equal(config_resolve(&f->c, &f->r, "precision", none, "plugin", &f->d),
                     VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:3:3: unknown key 'dtype' in section "
                             "'precision'; valid keys: plugin\n");
    load(f, "precision:\n  plugin: fp32\n");
    assert_int_equal(config_resolve(&f->c, &f->r, "precision", none, "plugin", &f->d),
                     VH_STATUS_OK);
    assert_int_equal(f->c.count, 0);
    config_free(&f->c);
    load(f, "run:\n  x: 1\n");
    assert_int_equal(config_resolve(&f->c, &f->r, "run", none, NULL, &f->d),
                     VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:3: unknown key 'x' in section 'run'; the "
                             "section takes no keys");
}

/* ---- types ------------------------------------------------------------------------ */

static void test_int(void **state) {
    fixture *f = *state;
    assert_int_equal(resolve_one(f, "dim", "4096"), VH_STATUS_OK);
    assert_int_equal(entry(f, "dim")->as.i, 4096);
    assert_int_equal(resolve_one(f, "dim", "\"+7\""), VH_STATUS_OK);
    assert_int_equal(entry(f, "dim")->as.i, 7);
    load(f, "model:\n  plugin: t\n  dim: 1\n  offset: -9223372036854775808\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_true(entry(f, "offset")->as.i == INT64_MIN);
}

static void test_int_bad(void **state) {
    fixture *f = *state;
    static const struct {
        const char *yaml, *message;
    } cases[] = {
        {"four", "model.dim: expected an integer, got 'four'"},
        {"1e3", "model.dim: expected an integer, got '1e3'"},
        {"64.0", "model.dim: expected an integer, got '64.0'"},
        {"0x40", "model.dim: expected an integer, got '0x40'"},
        {"\"\"", "model.dim: expected an integer, got ''"},
        {"\" 64\"", "model.dim: expected an integer, got ' 64'"},
        {"99999999999999999999", "model.dim: 99999999999999999999 does not fit in a "
                                 "64-bit integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(resolve_one(f, "dim", cases[i].yaml), VH_STATUS_ERR_CONFIG);
        char want[256];
        snprintf(want, sizeof want, "recipe.yaml:3:8: %s\n", cases[i].message);
        assert_prefix(f->d.text, want);
        assert_contains(f->d.text, "\n           ^"); /* caret under the value */
    }
}

static void test_int_range(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: t\n  dim: 8\n  heads: 0\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:4:10: model.heads: 0 is out of range [1, 64]");
    load(f, "model:\n  plugin: t\n  dim: 8\n  heads: 65\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:4:10: model.heads: 65 is out of range [1, 64]");
    load(f, "model:\n  plugin: t\n  dim: 8\n  heads: 1\n  depth: 64\n");
    assert_int_equal(resolve(f), VH_STATUS_OK); /* bounds are inclusive */
    /* No range when min == max. */
    load(f, "model:\n  plugin: t\n  dim: 8\n  offset: -1000000\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
}

static void test_float(void **state) {
    fixture *f = *state;
    static const struct {
        const char *yaml;
        double value;
    } cases[] = {{"1.0e-3", 1e-3}, {"2", 2.0}, {"-0.5", -0.5}, {".5", 0.5}, {"1E2", 100}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[64];
        snprintf(line, sizeof line, "model:\n  plugin: t\n  dim: 8\n  lr: %s\n",
                 cases[i].yaml);
        load(f, line);
        assert_int_equal(resolve(f), VH_STATUS_OK);
        assert_true(entry(f, "lr")->as.f == cases[i].value);
        assert_string_equal(entry(f, "lr")->text, cases[i].yaml);
    }
}

static void test_float_bad(void **state) {
    fixture *f = *state;
    static const struct {
        const char *yaml, *message;
    } cases[] = {
        {"fast", "model.lr: expected a number, got 'fast'"},
        {"1.0x", "model.lr: expected a number, got '1.0x'"},
        {".inf", "model.lr: expected a number, got '.inf'"},
        {"nan", "model.lr: expected a finite number, got 'nan'"},
        {"inf", "model.lr: expected a finite number, got 'inf'"},
        {"1e999", "model.lr: expected a finite number, got '1e999'"},
        {"\"\"", "model.lr: expected a number, got ''"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[64];
        snprintf(line, sizeof line, "model:\n  plugin: t\n  dim: 8\n  lr: %s\n",
                 cases[i].yaml);
        load(f, line);
        assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
        char want[256];
        snprintf(want, sizeof want, "recipe.yaml:4:7: %s\n", cases[i].message);
        assert_prefix(f->d.text, want);
    }
}

static void test_float_range(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: t\n  dim: 8\n  dropout: 1.5\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:4:12: model.dropout: 1.5 is out of range [0, 1]");
    load(f, "model:\n  plugin: t\n  dim: 8\n  dropout: 1\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_true(entry(f, "dropout")->as.f == 1.0);
}

static void test_bool(void **state) {
    fixture *f = *state;
    static const struct {
        const char *yaml;
        int value;
    } cases[] = {{"true", 1}, {"True", 1}, {"YES", 1}, {"on", 1},
                 {"false", 0}, {"FALSE", 0}, {"no", 0}, {"Off", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[64];
        snprintf(line, sizeof line, "model:\n  plugin: t\n  dim: 8\n  bias: %s\n",
                 cases[i].yaml);
        load(f, line);
        assert_int_equal(resolve(f), VH_STATUS_OK);
        assert_int_equal(entry(f, "bias")->as.b, cases[i].value);
    }
    static const char *const bad[] = {"maybe", "1", "0", "tru"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[64], want[128];
        snprintf(line, sizeof line, "model:\n  plugin: t\n  dim: 8\n  bias: %s\n",
                 bad[i]);
        load(f, line);
        assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
        snprintf(want, sizeof want,
                 "recipe.yaml:4:9: model.bias: expected true or false, got '%s'", bad[i]);
        assert_prefix(f->d.text, want);
    }
}

static void test_string(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: t\n  dim: 8\n  name: \"my vit: 1\"\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_string_equal(entry(f, "name")->text, "my vit: 1");
    load(f, "model:\n  plugin: t\n  dim: 8\n  name: ''\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_string_equal(entry(f, "name")->text, "");
}

static void test_enum(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: t\n  dim: 8\n  classifier: pooled\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_string_equal(entry(f, "classifier")->text, "pooled");

    static const struct {
        const char *yaml, *message;
    } cases[] = {
        {"tokn", "model.classifier: 'tokn' is not one of token|pooled; did you mean "
                 "'token'?"},
        {"Token", "model.classifier: 'Token' is not one of token|pooled; did you mean "
                  "'token'?"},
        {"mean", "model.classifier: 'mean' is not one of token|pooled\n"},
        /* A prefix is not enough. */
        {"tok", "model.classifier: 'tok' is not one of token|pooled\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[128], want[256];
        snprintf(line, sizeof line, "model:\n  plugin: t\n  dim: 8\n  classifier: %s\n",
                 cases[i].yaml);
        load(f, line);
        assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
        snprintf(want, sizeof want, "recipe.yaml:4:15: %s", cases[i].message);
        assert_prefix(f->d.text, want);
    }
}

static void test_path(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: t\n  dim: 8\n  root: ../data dir/x\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_string_equal(entry(f, "root")->text, "../data dir/x");
    load(f, "model:\n  plugin: t\n  dim: 8\n  root: \"\"\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:4:9: model.root: expected a path, got an empty string");
}

/* ---- required keys --------------------------------------------------------------- */

static void test_required_missing_in_section(void **state) {
    fixture *f = *state;
    load(f, "run: {}\nmodel:\n  plugin: test\n  depth: 2\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml:2:1: section 'model' needs key 'dim' "
                                   "(width of the model)\n    model:\n    ^");
}

static void test_required_missing_no_section(void **state) {
    fixture *f = *state;
    load(f, "run: {}\n");
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text,
                        "recipe.yaml: section 'model' needs key 'dim' (width of the model)");
    /* A section made only by --set has no line either. */
    assert_int_equal(recipe_apply_set(&f->r, "model.depth=2", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text,
                        "recipe.yaml: section 'model' needs key 'dim' (width of the model)");
    assert_int_equal(config_resolve(&f->c, NULL, "model", schema, "plugin", &f->d),
                     VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "section 'model' needs key 'dim' (width of the model)");
}

/* ---- --set values ----------------------------------------------------------------- */

static void test_set_values(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: test\n  dim: 64\n");
    assert_int_equal(recipe_apply_set(&f->r, "model.dim=32", &f->d), VH_STATUS_OK);
    assert_int_equal(recipe_apply_set(&f->r, "model.bias=no", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_int_equal(entry(f, "dim")->as.i, 32);
    assert_int_equal(entry(f, "dim")->origin.source, VH_CONFIG_SOURCE_SET);
    assert_null(entry(f, "dim")->origin.file);
    assert_int_equal(entry(f, "bias")->as.b, 0);
    assert_int_equal(entry(f, "bias")->origin.source, VH_CONFIG_SOURCE_SET);
}

static void test_set_errors(void **state) {
    fixture *f = *state;
    load(f, "model:\n  plugin: test\n  dim: 64\n");
    assert_int_equal(recipe_apply_set(&f->r, "model.depth=four", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text,
                        "--set model.depth=four: model.depth: expected an integer, got 'four'");

    load(f, "model:\n  plugin: test\n  dim: 64\n");
    assert_int_equal(recipe_apply_set(&f->r, "model.dpth=3", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve(f), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "--set model.dpth=3: unknown key 'dpth' in section "
                                   "'model'; did you mean 'depth'?");
}

/* ---- shared keys and swapping a plugin -------------------------------------------- */

/* An optimizer of its own keys only, as lion (the shared ones are merged). */
static const vh_config_key lionish[] = {
    {"beta1", VH_CONFIG_TYPE_FLOAT, "0.9", "interpolation", NULL, 0, 1, 0},
    {"note", VH_CONFIG_TYPE_STRING, "", "a label", NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status resolve_optim(fixture *f, const vh_config_key *own) {
    config_free(&f->c);
    return config_resolve_merged(&f->c, &f->r, "optim", own, vh_optim_shared_keys, "plugin",
                                 &f->d);
}

static const char mta_recipe[] = "optim:\n"
                                 "  plugin: mta\n"
                                 "  lr: 2.0e-3\n"
                                 "  algo: adamw\n"
                                 "  note: \"a, b\"\n"
                                 "  beta2: 0.95\n"
                                 "  warmup_steps: 200\n";

/* --set optim.plugin=lion keeps the shared keys; the file's keys the new
 * plugin does not take are refused by name, with the one-line replace. */
static void test_swap_refuses_left_keys(void **state) {
    fixture *f = *state;
    load(f, mta_recipe);
    assert_int_equal(recipe_apply_set(&f->r, "optim.plugin=lion", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve_optim(f, lionish), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:4:3: key 'algo' of section 'optim' was written for "
                             "plugin 'mta'; plugin 'lion' (--set optim.plugin=lion) does not "
                             "take it (nor 'beta2')\n      algo: adamw\n      ^\n");
    assert_contains(f->d.text, "\nreplace the section whole instead, in one line (the keys "
                               "lion takes kept):\n    --set 'optim={plugin: lion, lr: 2.0e-3, "
                               "note: \"a, b\", warmup_steps: 200}'");
    /* the line it shows does what it says */
    assert_int_equal(recipe_apply_set(&f->r,
                                      "optim={plugin: lion, lr: 2.0e-3, note: \"a, b\", "
                                      "warmup_steps: 200}",
                                      &f->d),
                     VH_STATUS_OK);
    assert_int_equal(resolve_optim(f, lionish), VH_STATUS_OK);
    assert_true(entry(f, "lr")->as.f == 2.0e-3);
    assert_int_equal(entry(f, "lr")->origin.source, VH_CONFIG_SOURCE_SET);
    assert_int_equal(entry(f, "warmup_steps")->as.i, 200);
    assert_string_equal(entry(f, "note")->text, "a, b");
    assert_int_equal(entry(f, "beta1")->origin.source, VH_CONFIG_SOURCE_DEFAULT);
    /* a key --set itself adds is an ordinary unknown key */
    load(f, "optim:\n  plugin: mta\n  lr: 0.1\n");
    assert_int_equal(recipe_apply_set(&f->r, "optim.plugin=lion", &f->d), VH_STATUS_OK);
    assert_int_equal(recipe_apply_set(&f->r, "optim.algo=sgd", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve_optim(f, lionish), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "--set optim.algo=sgd: unknown key 'algo' in section 'optim'");
}

static void test_swap_keeps_shared_keys(void **state) {
    fixture *f = *state;
    load(f, "optim:\n  plugin: mta\n  lr: 2.0e-3\n  schedule: step\n  warmup_steps: 200\n"
            "  clip_grad_norm: 1.0\n");
    assert_int_equal(recipe_apply_set(&f->r, "optim.plugin=lion", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve_optim(f, lionish), VH_STATUS_OK);
    assert_true(entry(f, "lr")->as.f == 2.0e-3);
    assert_int_equal(entry(f, "lr")->origin.source, VH_CONFIG_SOURCE_RECIPE);
    assert_int_equal(entry(f, "lr")->origin.line, 3);
    assert_string_equal(entry(f, "schedule")->text, "step");
    assert_int_equal(entry(f, "warmup_steps")->as.i, 200);
    assert_true(entry(f, "clip_grad_norm")->as.f == 1.0);
    assert_true(entry(f, "min_lr")->as.f == 0.0); /* the SDK's default */
    assert_int_equal(entry(f, "min_lr")->origin.source, VH_CONFIG_SOURCE_DEFAULT);
    /* the shared keys are checked as the plugin's are */
    assert_int_equal(recipe_apply_set(&f->r, "optim.schedule=linear", &f->d), VH_STATUS_OK);
    assert_int_equal(resolve_optim(f, lionish), VH_STATUS_ERR_CONFIG);
    assert_contains(f->d.text, "'linear' is not one of cosine|step|constant");
}

/* A shared key the plugin declares itself stays the plugin's (a 2.0
 * optimizer's lr keeps its default and range); the rest are merged once. */
static void test_merge_keeps_plugin_keys(void **state) {
    fixture *f = *state;
    static const vh_config_key own[] = {
        {"lr", VH_CONFIG_TYPE_FLOAT, "0.1", "learning rate, > 0", NULL, 0, 10, 0},
        {"momentum", VH_CONFIG_TYPE_FLOAT, "0", "momentum", NULL, 0, 1, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
    };
    load(f, "optim:\n  plugin: sgd\n  lr: 5\n");
    assert_int_equal(resolve_optim(f, own), VH_STATUS_OK);
    assert_non_null(f->c.merged);
    assert_ptr_equal(entry(f, "lr")->key->doc, own[0].doc);
    assert_string_equal(entry(f, "lr")->key->default_value, "0.1");
    assert_true(entry(f, "lr")->as.f == 5.0); /* in the plugin's [0, 10], not the SDK's */
    int shared = 0, lr = 0;
    for (const vh_config_key *k = vh_optim_shared_keys; k->key; k++) shared++;
    for (int i = 0; i < f->c.count; i++) lr += strcmp(f->c.entries[i].key->key, "lr") == 0;
    assert_int_equal(lr, 1);
    assert_int_equal(f->c.count, shared + 2 - 1);
    assert_non_null(entry(f, "warmup_steps"));
    /* shared NULL: the plugin's schema alone */
    config_free(&f->c);
    assert_int_equal(config_resolve_merged(&f->c, &f->r, "optim", own, NULL, "plugin", &f->d),
                     VH_STATUS_OK);
    assert_int_equal(f->c.count, 2);
    assert_null(f->c.merged);
    /* who gets shared keys: optimizers of ABI 2.1 and later */
    vh_plugin_descriptor desc = {.role = VH_ROLE_OPTIM, .abi_major = 2, .abi_minor = 1};
    assert_ptr_equal(config_shared_keys(&desc), vh_optim_shared_keys);
    desc.abi_minor = 0;
    assert_null(config_shared_keys(&desc));
    desc.abi_minor = 1;
    desc.role = VH_ROLE_MODEL;
    assert_null(config_shared_keys(&desc));
}

/* ---- broken schemas ---------------------------------------------------------------- */

static void test_check_schema_good(void **state) {
    fixture *f = *state;
    assert_int_equal(config_check_schema(schema, "plugin 'test'", &f->d), VH_STATUS_OK);
    static const vh_config_key none[] = {{NULL, 0, NULL, NULL, NULL, 0, 0, 0}};
    assert_int_equal(config_check_schema(none, "plugin 'none'", &f->d), VH_STATUS_OK);
}

static void test_check_schema_bad(void **state) {
    fixture *f = *state;
#define END {NULL, 0, NULL, NULL, NULL, 0, 0, 0}
    static const vh_config_key empty_key[] = {
        {"", VH_CONFIG_TYPE_INT, "1", "d", NULL, 0, 0, 0}, END};
    static const vh_config_key upper[] = {
        {"Dim", VH_CONFIG_TYPE_INT, "1", "d", NULL, 0, 0, 0}, END};
    static const vh_config_key dash[] = {
        {"batch-size", VH_CONFIG_TYPE_INT, "1", "d", NULL, 0, 0, 0}, END};
    static const vh_config_key twice[] = {
        {"dim", VH_CONFIG_TYPE_INT, "1", "d", NULL, 0, 0, 0},
        {"depth", VH_CONFIG_TYPE_INT, "1", "d", NULL, 0, 0, 0},
        {"dim", VH_CONFIG_TYPE_INT, "2", "d", NULL, 0, 0, 0}, END};
    static const vh_config_key no_choices[] = {
        {"mode", VH_CONFIG_TYPE_ENUM, NULL, "d", NULL, 0, 0, 0}, END};
    static const vh_config_key empty_choice[] = {
        {"mode", VH_CONFIG_TYPE_ENUM, "a", "d", "a||b", 0, 0, 0}, END};
    static const vh_config_key bad_default[] = {
        {"depth", VH_CONFIG_TYPE_INT, "four", "d", NULL, 0, 0, 0}, END};
    static const vh_config_key default_out_of_range[] = {
        {"heads", VH_CONFIG_TYPE_INT, "0", "d", NULL, 1, 64, 0}, END};
    static const vh_config_key default_not_a_choice[] = {
        {"mode", VH_CONFIG_TYPE_ENUM, "mean", "d", "token|pooled", 0, 0, 0}, END};
    static const vh_config_key bad_type[] = {
        {"x", (vh_config_type)99, "1", "d", NULL, 0, 0, 0}, END};
    static const vh_config_key inverted[] = {
        {"x", VH_CONFIG_TYPE_FLOAT, "1", "d", NULL, 2, 1, 0}, END};
    static const vh_config_key reserved[] = {
        {"plugin", VH_CONFIG_TYPE_STRING, "x", "d", NULL, 0, 0, 0}, END};
#undef END
    static const struct {
        const vh_config_key *schema;
        const char *message;
    } cases[] = {
        {empty_key, "key 0 '' is not lower_snake_case ([a-z0-9_]+)"},
        {upper, "key 0 'Dim' is not lower_snake_case ([a-z0-9_]+)"},
        {dash, "key 0 'batch-size' is not lower_snake_case ([a-z0-9_]+)"},
        {twice, "key 'dim' appears twice (entries 0 and 2)"},
        {no_choices, "enum key 'mode' has no choices"},
        {empty_choice, "enum key 'mode' has an empty choice in 'a||b'"},
        {bad_default, "default of key 'depth' is invalid: expected an integer, got 'four'"},
        {default_out_of_range, "default of key 'heads' is invalid: 0 is out of range [1, 64]"},
        {default_not_a_choice, "default of key 'mode' is invalid: 'mean' is not one of "
                               "token|pooled"},
        {bad_type, "key 'x' has unknown type 99"},
        {inverted, "key 'x' has min 2 > max 1"},
        {reserved, "key 'plugin' is reserved: it names the plugin in the recipe"},
        {NULL, "the schema is NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(config_check_schema(cases[i].schema, "plugin 'broken'", &f->d),
                         VH_STATUS_ERR_INTERNAL);
        char want[256];
        snprintf(want, sizeof want, "schema of plugin 'broken': %s", cases[i].message);
        if (strcmp(f->d.text, want) != 0) print_error("case %zu\n", i);
        assert_string_equal(f->d.text, want);
    }
}

static void test_resolve_bad_default(void **state) {
    fixture *f = *state;
    /* A schema that skipped config_check_schema: the bug is named, not blamed on
     * the recipe. */
    static const vh_config_key broken[] = {
        {"depth", VH_CONFIG_TYPE_INT, "four", "d", NULL, 0, 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0, 0}};
    load(f, "model:\n  plugin: test\n");
    assert_int_equal(config_resolve(&f->c, &f->r, "model", broken, "plugin", &f->d),
                     VH_STATUS_ERR_INTERNAL);
    assert_string_equal(f->d.text, "schema of section 'model': default of key 'depth' is "
                                   "invalid: expected an integer, got 'four' (a bug in "
                                   "the plugin)");
    assert_null(f->c.entries); /* nothing left behind */
}

/* ---- small things --------------------------------------------------------- */

static void test_type_names(void **state) {
    (void)state;
    assert_string_equal(config_type_name(VH_CONFIG_TYPE_INT), "int");
    assert_string_equal(config_type_name(VH_CONFIG_TYPE_FLOAT), "float");
    assert_string_equal(config_type_name(VH_CONFIG_TYPE_BOOL), "bool");
    assert_string_equal(config_type_name(VH_CONFIG_TYPE_STRING), "string");
    assert_string_equal(config_type_name(VH_CONFIG_TYPE_ENUM), "enum");
    assert_string_equal(config_type_name(VH_CONFIG_TYPE_PATH), "path");
    assert_string_equal(config_type_name((vh_config_type)42), "?");
}

static void test_free_and_find(void **state) {
    fixture *f = *state;
    vh_section_config empty = {0};
    config_free(&empty); /* a zeroed config frees cleanly, twice */
    config_free(&empty);
    config_free(NULL);
    assert_null(config_find(&empty, "dim"));
    assert_null(config_find(NULL, "dim"));
    load(f, "model:\n  plugin: test\n  dim: 8\n");
    assert_int_equal(resolve(f), VH_STATUS_OK);
    assert_null(config_find(&f->c, "nope"));
    config_free(&f->c);
    assert_null(f->c.entries);
    assert_int_equal(f->c.count, 0);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        T(test_resolve_string),
        T(test_defaults_and_origins),
        T(test_optional_key),
        T(test_resolve_file),
        T(test_absent_section_takes_defaults),
        T(test_unknown_key_suggestion),
        T(test_unknown_key_from_file),
        T(test_unknown_key_lists_valid),
        T(test_unknown_key_plugin_suggested),
        T(test_unknown_key_empty_schema),
        T(test_int),
        T(test_int_bad),
        T(test_int_range),
        T(test_float),
        T(test_float_bad),
        T(test_float_range),
        T(test_bool),
        T(test_string),
        T(test_enum),
        T(test_path),
        T(test_required_missing_in_section),
        T(test_required_missing_no_section),
        T(test_set_values),
        T(test_set_errors),
        T(test_swap_refuses_left_keys),
        T(test_swap_keeps_shared_keys),
        T(test_merge_keeps_plugin_keys),
        T(test_check_schema_good),
        T(test_check_schema_bad),
        T(test_resolve_bad_default),
        T(test_type_names),
        T(test_free_and_find),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
