/* test_recipe.c - the recipe reader: good and bad input, from strings and files.
 *
 * Each test checks the exact shape of the one message a user would see:
 * "file:line:col: what" with the echoed line and a caret, or "file: what".
 * Run one test by name: test_recipe <glob>.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "recipe.h"
#include "vtables.h"

#ifndef VH_TEST_DATA_DIR
#define VH_TEST_DATA_DIR "tests/data" /* when built by hand from the repo root */
#endif
#define RECIPES VH_TEST_DATA_DIR "/recipes"

/* ---- fixture -------------------------------------------------------------- */

typedef struct fixture {
    vh_recipe r;
    vh_diag d;
    char dir[64];      /* a fresh temporary directory per test */
    char path[256];    /* the last file written into it */
    char files[8][256];
    int nfiles;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/vh_test_recipe_XXXXXX");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    recipe_free(&f->r);
    for (int i = 0; i < f->nfiles; i++) {
        chmod(f->files[i], 0600);
        if (remove(f->files[i]) != 0) return -1;
    }
    if (rmdir(f->dir) != 0) return -1;
    free(f);
    return 0;
}

/* Writes bytes to dir/name; f->path is its path. */
static const char *write_file(fixture *f, const char *name, const void *bytes,
                              size_t len) {
    assert_true(f->nfiles < 8);
    snprintf(f->path, sizeof f->path, "%s/%s", f->dir, name);
    FILE *fp = fopen(f->path, "wb");
    assert_non_null(fp);
    if (len) assert_int_equal(fwrite(bytes, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
    snprintf(f->files[f->nfiles++], sizeof f->files[0], "%s", f->path);
    return f->path;
}

static vh_status load(fixture *f, const char *text) {
    return recipe_load_string(&f->r, "recipe.yaml", text, strlen(text), &f->d);
}

/* ---- message checks that print the message when they fail ------------------ */

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
/* The echoed line and the caret under the column: "\n    <line>\n    <pad>^". */
#define assert_caret(text, echoed, pad) \
    assert_contains((text), "\n    " echoed "\n    " pad "^")

static const vh_recipe_value *value_of(const vh_recipe *r, const char *section,
                                       const char *key) {
    const vh_recipe_value *v = recipe_find_value(recipe_find_section(r, section), key);
    assert_non_null(v);
    return v;
}

/* ---- good recipes ------------------------------------------------------------ */

static const char good_text[] =
    "run:\n"
    "  device: cpu\n"
    "  seed: 0\n"
    "model:\n"
    "  plugin: vit\n"
    "  dim: 64\n"
    "  classifier: \"token\"\n"
    "precision: { plugin: fp32 }\n";

static void test_string_good(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    assert_string_equal(f->r.file, "recipe.yaml");
    assert_int_equal(f->r.source_len, strlen(good_text));
    assert_string_equal(f->r.source, good_text);
    assert_int_equal(f->r.count, 3);
    assert_string_equal(f->r.sections[0].name, "run");
    assert_string_equal(f->r.sections[1].name, "model");
    assert_string_equal(f->r.sections[2].name, "precision");

    const vh_recipe_section *model = recipe_find_section(&f->r, "model");
    assert_non_null(model);
    assert_int_equal(model->line, 4);
    assert_int_equal(model->column, 1);
    assert_int_equal(model->count, 3);
    assert_string_equal(model->values[0].key, "plugin"); /* file order */
    assert_string_equal(model->values[2].key, "classifier");

    const vh_recipe_value *dim = value_of(&f->r, "model", "dim");
    assert_string_equal(dim->text, "64");
    assert_int_equal(dim->origin.source, VH_CONFIG_SOURCE_RECIPE);
    assert_ptr_equal(dim->origin.file, f->r.file);
    assert_int_equal(dim->origin.line, 6);
    assert_int_equal(dim->origin.column, 8);
    assert_int_equal(dim->key_line, 6);
    assert_int_equal(dim->key_column, 3);

    /* Quoted scalars keep their text, without the quotes; column of the quote. */
    const vh_recipe_value *cls = value_of(&f->r, "model", "classifier");
    assert_string_equal(cls->text, "token");
    assert_int_equal(cls->origin.column, 15);

    const vh_recipe_value *p = value_of(&f->r, "precision", "plugin");
    assert_string_equal(p->text, "fp32");
    assert_int_equal(p->origin.line, 8);
    assert_int_equal(p->origin.column, 22);
    assert_int_equal(p->key_column, 14);

    assert_null(recipe_find_section(&f->r, "data"));
    assert_null(recipe_find_value(model, "depth"));
    assert_null(recipe_find_value(NULL, "depth"));
}

static void test_file_good(void **state) {
    fixture *f = *state;
    const char *path = RECIPES "/good.yaml";
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_OK);
    assert_string_equal(f->r.file, path);
    assert_int_equal(f->r.count, 6);
    for (int i = 0; i < 6; i++)
        assert_string_equal(f->r.sections[i].name, vh_recipe_section_names[i]);
    const vh_recipe_value *dim = value_of(&f->r, "model", "dim");
    assert_string_equal(dim->text, "64");
    assert_ptr_equal(dim->origin.file, f->r.file);
    assert_int_equal(dim->origin.line, 9);
    assert_int_equal(dim->origin.column, 8);
    assert_string_equal(value_of(&f->r, "optim", "lr")->text, "1.0e-3");
    assert_string_equal(value_of(&f->r, "data", "root")->text, "/usr/share/datasets");
    assert_string_equal(value_of(&f->r, "model", "classifier")->text, "token");
}

static void test_quoted_and_special_values(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "data:\n"
                             "  a: \"null\"\n"
                             "  b: ''\n"
                             "  c: '~'\n"
                             "  d: \"x: y # not a comment\"\n"
                             "  e: a b c   # a comment\n"
                             "  f: \"caf\\u00e9\"\n"
                             "  g: |\n"
                             "    two\n"
                             "    lines\n"),
                     VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "data", "a")->text, "null");
    assert_string_equal(value_of(&f->r, "data", "b")->text, "");
    assert_string_equal(value_of(&f->r, "data", "c")->text, "~");
    assert_string_equal(value_of(&f->r, "data", "d")->text, "x: y # not a comment");
    assert_string_equal(value_of(&f->r, "data", "e")->text, "a b c");
    assert_string_equal(value_of(&f->r, "data", "f")->text, "caf\xc3\xa9");
    assert_string_equal(value_of(&f->r, "data", "g")->text, "two\nlines\n");
}

static void test_empty_sections_allowed(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "precision: {}\nrun: {}\n"), VH_STATUS_OK);
    assert_int_equal(f->r.count, 2);
    assert_int_equal(recipe_find_section(&f->r, "precision")->count, 0);
}

static void test_utf8_text_accepted(void **state) {
    fixture *f = *state;
    /* A byte-order mark, a comment and a value in UTF-8. */
    assert_int_equal(load(f, "\xef\xbb\xbf# r\xc3\xa9glage\ndata:\n  root: /d/\xe6\x97\xa5\n"),
                     VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "data", "root")->text, "/d/\xe6\x97\xa5");
}

/* ---- empty and non-mapping documents ---------------------------------------- */

#define EMPTY_TAIL \
    ": empty recipe; expected a mapping with sections run, model, precision, " \
    "sharding, optim, data"

static void test_string_empty(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, ""), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml" EMPTY_TAIL);
    assert_int_equal(load(f, "\n  \n"), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml" EMPTY_TAIL);
    assert_int_equal(load(f, "---\n"), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml" EMPTY_TAIL);
    assert_null(f->r.sections); /* a failed load leaves nothing behind */
    assert_null(f->r.file);
}

static void test_file_empty(void **state) {
    fixture *f = *state;
    const char *path = write_file(f, "empty.yaml", "", 0);
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s" EMPTY_TAIL, path);
    assert_string_equal(f->d.text, want);
}

static void test_comments_only(void **state) {
    fixture *f = *state;
    static const char text[] = "# a recipe\n# with nothing in it\n\n";
    assert_int_equal(load(f, text), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml" EMPTY_TAIL);

    const char *path = write_file(f, "comments.yaml", text, strlen(text));
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, path);
    assert_contains(f->d.text, EMPTY_TAIL);
}

static void test_sequence_document(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "# sections\n- run\n- model\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:2:1: expected a mapping of sections, found a sequence");
    assert_caret(f->d.text, "- run", "");
}

static void test_scalar_document(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "hello world\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:1:1: expected a mapping of sections, found a scalar");
}

static void test_two_documents(void **state) {
    fixture *f = *state;
    static const char text[] = "model: {dim: 1}\n---\nmodel: {dim: 2}\n";
    assert_int_equal(load(f, text), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:1: more than one document in the recipe");
    assert_caret(f->d.text, "---", "");

    const char *path = write_file(f, "two.yaml", text, strlen(text));
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s:2:1: more than one document", path);
    assert_prefix(f->d.text, want);
}

/* ---- anchors and aliases ----------------------------------------------------- */

static void test_alias_bomb_refused(void **state) {
    fixture *f = *state;
    /* "Billion laughs": 9 levels of 9 aliases would be 9^9 strings if expanded. */
    char text[4096];
    size_t n = (size_t)snprintf(text, sizeof text, "model:\n  a0: &a0 lol\n");
    for (int level = 1; level < 10; level++) {
        n += (size_t)snprintf(text + n, sizeof text - n, "  a%d: &a%d [", level, level);
        for (int i = 0; i < 9; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s*a%d", i ? ", " : "",
                                  level - 1);
        n += (size_t)snprintf(text + n, sizeof text - n, "]\n");
    }
    assert_true(n < sizeof text);
    clock_t start = clock();
    assert_int_equal(load(f, text), VH_STATUS_ERR_CONFIG);
    assert_true((double)(clock() - start) / CLOCKS_PER_SEC < 1.0);
    assert_prefix(f->d.text, "recipe.yaml:2:7: anchors and aliases are not supported "
                             "in recipes ('&a0')");
    assert_caret(f->d.text, "  a0: &a0 lol", "      ");

    const char *path = write_file(f, "bomb.yaml", text, n);
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    assert_contains(f->d.text, ":2:7: anchors and aliases are not supported");
}

static void test_alias_refused(void **state) {
    fixture *f = *state;
    /* An alias to an anchor that was never defined is refused all the same. */
    assert_int_equal(load(f, "model:\n  dim: *width\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:8: anchors and aliases are not supported "
                             "in recipes ('*width')");
    /* An anchor on a whole section is refused too. */
    assert_int_equal(load(f, "model: &m {dim: 1}\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:1:8: anchors and aliases are not supported");
}

/* ---- duplicates, shapes, null values ------------------------------------------ */

static void test_duplicate_section(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "model:\n  dim: 1\nrun: {}\nmodel:\n  depth: 2\n"),
                     VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:4:1: duplicate section 'model' (first at line 1)");
    assert_caret(f->d.text, "model:", "");
}

static void test_duplicate_key(void **state) {
    fixture *f = *state;
    static const char text[] = "model:\n  dim: 1\n  depth: 2\n  dim: 3\n";
    assert_int_equal(load(f, text), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:4:3: duplicate key 'dim' in section 'model' "
                             "(first set at line 2)");
    assert_caret(f->d.text, "  dim: 3", "  ");

    const char *path = write_file(f, "dup.yaml", text, strlen(text));
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    assert_contains(f->d.text, ":4:3: duplicate key 'dim'");
}

static void test_section_not_mapping(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "model: vit\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:1:8: section 'model' must be a mapping of "
                             "keys, found a scalar");
    assert_caret(f->d.text, "model: vit", "       ");

    assert_int_equal(load(f, "data:\n  - a\n  - b\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:3: section 'data' must be a mapping of "
                             "keys, found a sequence");
}

static void test_section_null(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "run: {}\nprecision:\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:1: section 'precision' is empty");
    assert_contains(f->d.text, "'precision: {}'");
}

static void test_nested_value(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "model:\n  dim:\n    width: 3\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:3:5: model.dim: expected a single value, "
                             "found a mapping");
    assert_caret(f->d.text, "    width: 3", "    ");

    assert_int_equal(load(f, "optim:\n  betas: [0.9, 0.999]\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:10: optim.betas: expected a single value, "
                             "found a sequence");
}

static void test_complex_keys_refused(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "? [model]\n: 1\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:1:3: section names must be plain words");
    assert_int_equal(load(f, "model:\n  ? {a: 1}\n  : 2\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:5: section 'model': keys must be plain words");
    assert_int_equal(load(f, "model:\n  \"\": 2\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:3: section 'model': empty key");
}

static void test_null_value(void **state) {
    fixture *f = *state;
    static const char *const lines[] = {"  dim:", "  dim: ~", "  dim: null"};
    for (int i = 0; i < 3; i++) {
        char text[64], caret[64];
        snprintf(text, sizeof text, "model:\n%s\n", lines[i]);
        assert_int_equal(load(f, text), VH_STATUS_ERR_CONFIG);
        assert_prefix(f->d.text, "recipe.yaml:2:3: model.dim: key has no value");
        snprintf(caret, sizeof caret, "\n    %s\n      ^", lines[i]);
        assert_contains(f->d.text, caret);
    }
}

/* ---- unknown sections ---------------------------------------------------------- */

static void test_unknown_section_suggestion(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "run: {}\nmodle:\n  dim: 3\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:2:1: unknown section 'modle'; did you mean 'model'?");
    assert_caret(f->d.text, "modle:", "");

    assert_int_equal(load(f, "optm: {}\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:1:1: unknown section 'optm'; did you mean 'optim'?");
}

static void test_unknown_section_list(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "training: {}\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:1:1: unknown section 'training'; sections "
                             "are run, model, precision, sharding, optim, data\n");
    /* Too far from "optim" to guess: the list names it instead. */
    assert_int_equal(load(f, "optimizer: {}\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:1:1: unknown section 'optimizer'; sections are");
}

/* ---- not text, too large, not there ----------------------------------------------- */

static void test_nul_byte(void **state) {
    fixture *f = *state;
    static const char bytes[] = "model:\n  dim: 6\0004\n";
    assert_int_equal(recipe_load_string(&f->r, "recipe.yaml", bytes, sizeof bytes - 1,
                                        &f->d),
                     VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml: not a text file (NUL byte at offset 15)");

    /* A real binary: an ELF header. */
    static const unsigned char elf[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0};
    const char *path = write_file(f, "binary.yaml", elf, sizeof elf);
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s: not a text file (NUL byte at offset 7)", path);
    assert_string_equal(f->d.text, want);
}

static void test_invalid_utf8(void **state) {
    fixture *f = *state;
    /* Latin-1 'é' on line 3. */
    static const char latin1[] = "model:\n  dim: 64\n  # r\xe9glage\n";
    assert_int_equal(load(f, latin1), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml: not a text file (invalid UTF-8 at line 3)");

    /* An overlong encoding of '/' and a UTF-16 surrogate are not UTF-8 either. */
    assert_int_equal(load(f, "data:\n  root: \xc0\xaf\n"), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml: not a text file (invalid UTF-8 at line 2)");
    assert_int_equal(load(f, "data: {root: \xed\xa0\x80}\n"), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml: not a text file (invalid UTF-8 at line 1)");
    /* Cut short at the end of the text. */
    assert_int_equal(load(f, "data: {}\n#\xe6\x97"), VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text, "recipe.yaml: not a text file (invalid UTF-8 at line 2)");

    const char *path = write_file(f, "latin1.yaml", latin1, strlen(latin1));
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s: not a text file (invalid UTF-8 at line 3)", path);
    assert_string_equal(f->d.text, want);
}

static void test_control_character(void **state) {
    fixture *f = *state;
    /* Valid UTF-8 but not YAML: libyaml's reader refuses it; we give a position. */
    assert_int_equal(load(f, "model:\n  dim: 6\x01\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text,
                  "recipe.yaml:2:9: YAML syntax error: control characters are not allowed");
}

static void test_huge_sparse_file(void **state) {
    fixture *f = *state;
    const char *path = write_file(f, "huge.yaml", "", 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 100 * 1024 * 1024), 0); /* sparse: no disk used */
    close(fd);
    clock_t start = clock();
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    assert_true((double)(clock() - start) / CLOCKS_PER_SEC < 0.5);
    char want[512];
    snprintf(want, sizeof want,
             "%s: 104857600 bytes is too large for a recipe (limit 1048576 bytes)", path);
    assert_string_equal(f->d.text, want);
}

static void test_limit_boundary(void **state) {
    fixture *f = *state;
    /* Exactly the limit is read (and found to be only a comment); one more is not. */
    size_t n = VH_RECIPE_MAX_BYTES;
    char *text = malloc(n + 1);
    assert_non_null(text);
    memset(text, ' ', n + 1);
    text[0] = '#';
    const char *path = write_file(f, "limit.yaml", text, n);
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    assert_contains(f->d.text, ": empty recipe;");

    assert_int_equal(recipe_load_string(&f->r, "big.yaml", text, n + 1, &f->d),
                     VH_STATUS_ERR_CONFIG);
    assert_string_equal(f->d.text,
                        "big.yaml: 1048577 bytes is too large for a recipe "
                        "(limit 1048576 bytes)");
    free(text);
}

static void test_missing_file(void **state) {
    fixture *f = *state;
    char path[512];
    snprintf(path, sizeof path, "%s/nope.yaml", f->dir);
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_IO);
    char want[600];
    snprintf(want, sizeof want, "%s: cannot open recipe: No such file or directory", path);
    assert_string_equal(f->d.text, want);
}

static void test_directory(void **state) {
    fixture *f = *state;
    assert_int_equal(recipe_load_file(&f->r, f->dir, &f->d), VH_STATUS_ERR_IO);
    char want[512];
    snprintf(want, sizeof want, "%s: is a directory, not a recipe file", f->dir);
    assert_string_equal(f->d.text, want);
}

static void test_unreadable_file(void **state) {
    fixture *f = *state;
    const char *path = write_file(f, "secret.yaml", "run: {}\n", 8);
    assert_int_equal(chmod(path, 0), 0);
    if (geteuid() == 0) skip(); /* root reads it anyway */
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_IO);
    char want[512];
    snprintf(want, sizeof want, "%s: cannot open recipe: Permission denied", path);
    assert_string_equal(f->d.text, want);
}

static void test_path_through_file(void **state) {
    fixture *f = *state;
    /* Root opens anything, but not a file inside a file: strerror still shows. */
    const char *file = write_file(f, "plain.yaml", "run: {}\n", 8);
    char path[512];
    snprintf(path, sizeof path, "%s/inner.yaml", file);
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_IO);
    char want[600];
    snprintf(want, sizeof want, "%s: cannot open recipe: Not a directory", path);
    assert_string_equal(f->d.text, want);
}

static void test_endless_device(void **state) {
    fixture *f = *state;
    /* Not a regular file: refused before anything is read. */
    assert_int_equal(recipe_load_file(&f->r, "/dev/zero", &f->d), VH_STATUS_ERR_IO);
    assert_prefix(f->d.text, "/dev/zero: is a character device, not a recipe file");
}

/* A FIFO with no writer: opening it used to wait forever. Refused at once,
 * one message; the alarm only turns a regression into a failure, not a hang. */
static void test_fifo_refused(void **state) {
    fixture *f = *state;
    snprintf(f->path, sizeof f->path, "%s/pipe.yaml", f->dir);
    assert_int_equal(mkfifo(f->path, 0600), 0);
    snprintf(f->files[f->nfiles++], sizeof f->files[0], "%s", f->path);
    alarm(30);
    vh_status st = recipe_load_file(&f->r, f->path, &f->d);
    alarm(0);
    assert_int_equal(st, VH_STATUS_ERR_IO);
    char want[512];
    snprintf(want, sizeof want, "%s: is a FIFO (named pipe), not a recipe file", f->path);
    assert_prefix(f->d.text, want);
}

/* YAML tags ask for a type the recipe cannot honour: refused at the tag. */
static void test_tags_refused(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "model:\n  plugin: !!python/object:os.system ls\n"),
                     VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:11: YAML tags are not supported in recipes");
    assert_contains(f->d.text, "python/object:os.system");
    assert_int_equal(load(f, "run: {seed: !!int 3}\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:1:13: YAML tags are not supported");
    assert_int_equal(load(f, "model: !custom {dim: 1}\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:1:8: YAML tags are not supported");
}

/* ---- YAML syntax, tabs, line endings ----------------------------------------------- */

static void test_syntax_error(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, "model:\n  dim: 64\n depth: 4\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:3:2: YAML syntax error: did not find "
                             "expected key while parsing a block mapping that "
                             "started at 1:1");
    assert_caret(f->d.text, " depth: 4", " ");

    assert_int_equal(load(f, "model:\n  a: b: c\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:7: YAML syntax error: mapping values are "
                             "not allowed in this context");

    static const char flow[] = "run: {seed: 1\nmodel: {}\n";
    const char *path = write_file(f, "flow.yaml", flow, strlen(flow));
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, path);
    assert_contains(f->d.text, ": YAML syntax error: ");
    assert_contains(f->d.text, "while parsing a flow mapping");
}

static void test_tab_indentation(void **state) {
    fixture *f = *state;
    static const char text[] = "model:\n\tdim: 64\n";
    assert_int_equal(load(f, text), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:2:1: YAML syntax error: ");
    assert_contains(f->d.text, "(YAML does not allow tabs for indentation; use spaces)");
    assert_caret(f->d.text, "\tdim: 64", "");

    const char *path = write_file(f, "tabs.yaml", text, strlen(text));
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_ERR_CONFIG);
    assert_contains(f->d.text, "tabs for indentation");
}

static void test_tab_separator_ok(void **state) {
    fixture *f = *state;
    /* A tab after the colon or before a comment is only whitespace. */
    assert_int_equal(load(f, "model:\n  dim:\t64\t# width\n"), VH_STATUS_OK);
    const vh_recipe_value *dim = value_of(&f->r, "model", "dim");
    assert_string_equal(dim->text, "64");
    assert_int_equal(dim->origin.column, 8);
}

static void test_crlf(void **state) {
    fixture *f = *state;
    static const char text[] = "run:\r\n  seed: 7\r\nmodel: {dim: \"64\"}\r\n";
    assert_int_equal(load(f, text), VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "run", "seed")->text, "7");
    assert_int_equal(value_of(&f->r, "model", "dim")->origin.line, 3);
    recipe_free(&f->r);

    const char *path = write_file(f, "crlf.yaml", text, strlen(text));
    assert_int_equal(recipe_load_file(&f->r, path, &f->d), VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "run", "seed")->text, "7");
    assert_string_equal(value_of(&f->r, "model", "dim")->text, "64");
    recipe_free(&f->r);

    /* The echoed line of an error carries no '\r'. */
    assert_int_equal(load(f, "run:\r\n  seed: 7\r\n  seed: 8\r\n"), VH_STATUS_ERR_CONFIG);
    assert_prefix(f->d.text, "recipe.yaml:3:3: duplicate key 'seed'");
    assert_caret(f->d.text, "  seed: 8", "  ");
    assert_null(strchr(f->d.text, '\r'));
}

/* ---- --set ------------------------------------------------------------------------- */

static void test_set_replaces_file_value(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    assert_int_equal(recipe_apply_set(&f->r, "model.dim=128", &f->d), VH_STATUS_OK);
    const vh_recipe_section *model = recipe_find_section(&f->r, "model");
    assert_int_equal(model->count, 3); /* replaced, not appended */
    const vh_recipe_value *dim = value_of(&f->r, "model", "dim");
    assert_string_equal(dim->text, "128");
    assert_int_equal(dim->origin.source, VH_CONFIG_SOURCE_SET);
    assert_null(dim->origin.file);
    assert_int_equal(dim->origin.line, 0);
    assert_int_equal(dim->key_line, 0);
}

static void test_set_appends(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    /* A new key in an existing section; a value may hold '=' and '.'. */
    assert_int_equal(recipe_apply_set(&f->r, "model.depth=6", &f->d), VH_STATUS_OK);
    assert_int_equal(recipe_apply_set(&f->r, "data.root=/a=b/c.d", &f->d), VH_STATUS_OK);
    const vh_recipe_section *model = recipe_find_section(&f->r, "model");
    assert_int_equal(model->count, 4);
    assert_string_equal(model->values[3].key, "depth");
    assert_string_equal(model->values[3].text, "6");
    /* The section the file lacked is created, with no place in the file. */
    const vh_recipe_section *data = recipe_find_section(&f->r, "data");
    assert_non_null(data);
    assert_int_equal(data->line, 0);
    assert_string_equal(value_of(&f->r, "data", "root")->text, "/a=b/c.d");
    assert_int_equal(value_of(&f->r, "data", "root")->origin.source,
                     VH_CONFIG_SOURCE_SET);
    /* Setting twice keeps the last. */
    assert_int_equal(recipe_apply_set(&f->r, "model.depth=8", &f->d), VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "model", "depth")->text, "8");
    assert_int_equal(recipe_find_section(&f->r, "model")->count, 4);
}

static void test_set_on_empty_recipe(void **state) {
    fixture *f = *state;
    /* --set works on a recipe that was never loaded (all from the command line). */
    assert_int_equal(recipe_apply_set(&f->r, "run.seed=3", &f->d), VH_STATUS_OK);
    assert_int_equal(f->r.count, 1);
    assert_string_equal(value_of(&f->r, "run", "seed")->text, "3");
}

static void test_set_errors(void **state) {
    fixture *f = *state;
    static const struct {
        const char *assignment, *message;
    } cases[] = {
        {"model.dim", "--set model.dim: expected section.key=value (no '=')"},
        {"=3", "--set =3: expected section.key=value (no section.key before '=')"},
        {"dim=3", "--set dim=3: expected section.key=value (no section.key before '=')"},
        {".dim=3", "--set .dim=3: the section name is empty"},
        {"model.=3", "--set model.=3: the key name is empty"},
        {"model.dim=", "--set model.dim=: the value is empty (leave the key out to use "
                       "its default)"},
        {"foo.bar=1", "--set foo.bar=1: unknown section 'foo'; sections are run, model, "
                      "precision, sharding, optim, data"},
        {"modle.dim=1", "--set modle.dim=1: unknown section 'modle'; did you mean "
                        "'model'?"},
    };
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(recipe_apply_set(&f->r, cases[i].assignment, &f->d),
                         VH_STATUS_ERR_CONFIG);
        assert_string_equal(f->d.text, cases[i].message);
    }
    assert_int_equal(f->r.count, 3); /* nothing was added by the failures */
    assert_int_equal(recipe_find_section(&f->r, "model")->count, 3);
}

/* `--set section={...}` replaces a section whole: the flow mapping's values,
 * in its order, as --set values; the file's values are gone. */
static void test_set_whole_section(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    assert_int_equal(recipe_apply_set(&f->r, "model={plugin: mlp, hidden: 6e-3, name: 'a, b'}",
                                      &f->d),
                     VH_STATUS_OK);
    const vh_recipe_section *model = recipe_find_section(&f->r, "model");
    assert_int_equal(model->count, 3);
    assert_string_equal(model->values[0].key, "plugin");
    assert_string_equal(model->values[0].text, "mlp");
    assert_string_equal(model->values[1].text, "6e-3");
    assert_string_equal(model->values[2].text, "a, b");
    for (int i = 0; i < model->count; i++) {
        assert_int_equal(model->values[i].origin.source, VH_CONFIG_SOURCE_SET);
        assert_null(model->values[i].origin.file);
        assert_int_equal(model->values[i].key_line, 0);
    }
    assert_int_equal(model->line, 0); /* no longer the file's section */
    assert_null(recipe_find_value(model, "dim"));
    /* a section the file lacks is created; an empty mapping empties one */
    assert_int_equal(recipe_apply_set(&f->r, "optim={plugin: lion}", &f->d), VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "optim", "plugin")->text, "lion");
    assert_int_equal(recipe_apply_set(&f->r, "run= {}", &f->d), VH_STATUS_OK);
    assert_int_equal(recipe_find_section(&f->r, "run")->count, 0);
    /* later --set values go on from the replaced section */
    assert_int_equal(recipe_apply_set(&f->r, "model.dim=8", &f->d), VH_STATUS_OK);
    assert_int_equal(recipe_find_section(&f->r, "model")->count, 4);
}

static void test_set_whole_section_errors(void **state) {
    fixture *f = *state;
    static const struct {
        const char *assignment, *message;
    } cases[] = {
        {"model=mlp", "--set model=mlp: expected section.key=value, or model={key: value, ...} "
                      "(a YAML flow mapping) to replace the section whole"},
        {"modle={plugin: mlp}", "--set modle={plugin: mlp}: unknown section 'modle'; did you "
                                "mean 'model'?"},
        {"model={plugin: [a]}", "--set model={plugin: [a]}:1:17: model.plugin: expected a "
                                "single value, found a sequence"},
        {"model={dim: 1, dim: 2}", "--set model={dim: 1, dim: 2}:1:17: duplicate key 'dim' in "
                                   "section 'model'"},
        {"model={dim: 1", "--set model={dim: 1:"},
        {"model={dim: *x}", "--set model={dim: *x}:1:14: anchors and aliases"},
    };
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(recipe_apply_set(&f->r, cases[i].assignment, &f->d),
                         VH_STATUS_ERR_CONFIG);
        assert_prefix(f->d.text, cases[i].message);
    }
    /* nothing was replaced by the failures */
    assert_int_equal(recipe_find_section(&f->r, "model")->count, 3);
    assert_int_equal(recipe_find_section(&f->r, "model")->line, 4);
}

/* A --set that replaces a file's value keeps the file's text (the plugin a
 * section's other keys were written for); a second --set keeps the first. */
static void test_set_keeps_replaced_text(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    assert_null(value_of(&f->r, "model", "plugin")->replaced);
    assert_int_equal(recipe_apply_set(&f->r, "model.plugin=mlp", &f->d), VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "model", "plugin")->replaced, "vit");
    assert_int_equal(recipe_apply_set(&f->r, "model.plugin=other", &f->d), VH_STATUS_OK);
    assert_string_equal(value_of(&f->r, "model", "plugin")->replaced, "vit");
    assert_string_equal(value_of(&f->r, "model", "plugin")->text, "other");
    /* a value --set added replaced nothing */
    assert_int_equal(recipe_apply_set(&f->r, "model.depth=2", &f->d), VH_STATUS_OK);
    assert_int_equal(recipe_apply_set(&f->r, "model.depth=3", &f->d), VH_STATUS_OK);
    assert_null(value_of(&f->r, "model", "depth")->replaced);
}

/* ---- recipe_diag_value ------------------------------------------------------------ */

static void test_diag_value(void **state) {
    fixture *f = *state;
    assert_int_equal(load(f, good_text), VH_STATUS_OK);
    const vh_recipe_section *model = recipe_find_section(&f->r, "model");
    const vh_recipe_value *dim = value_of(&f->r, "model", "dim");

    vh_diag d;
    assert_int_equal(recipe_diag_value(&f->r, model, dim, 0, &d, VH_STATUS_ERR_CONFIG,
                                       "too %s", "wide"),
                     VH_STATUS_ERR_CONFIG);
    assert_string_equal(d.text, "recipe.yaml:6:8: too wide\n      dim: 64\n           ^");
    recipe_diag_value(&f->r, model, dim, 1, &d, VH_STATUS_ERR_CONFIG, "bad key");
    assert_string_equal(d.text, "recipe.yaml:6:3: bad key\n      dim: 64\n      ^");
    /* No value: the section's line, or the file when there is no section. */
    recipe_diag_value(&f->r, model, NULL, 0, &d, VH_STATUS_ERR_CONFIG, "needs depth");
    assert_string_equal(d.text, "recipe.yaml:4:1: needs depth\n    model:\n    ^");
    recipe_diag_value(&f->r, NULL, NULL, 0, &d, VH_STATUS_ERR_CONFIG, "no data");
    assert_string_equal(d.text, "recipe.yaml: no data");

    assert_int_equal(recipe_apply_set(&f->r, "model.dim=65", &f->d), VH_STATUS_OK);
    recipe_diag_value(&f->r, model, value_of(&f->r, "model", "dim"), 0, &d,
                      VH_STATUS_ERR_CONFIG, "odd");
    assert_string_equal(d.text, "--set model.dim=65: odd");
}

/* ---- names and suggestions -------------------------------------------------------- */

static void test_section_names(void **state) {
    (void)state;
    assert_string_equal(vh_recipe_section_names[0], "run");
    assert_null(vh_recipe_section_names[VH_HOST_ROLE_COUNT + 1]);
    assert_string_equal(recipe_role_section(VH_ROLE_MODEL), "model");
    assert_string_equal(recipe_role_section(VH_ROLE_PRECISION), "precision");
    assert_string_equal(recipe_role_section(VH_ROLE_SHARDING), "sharding");
    assert_string_equal(recipe_role_section(VH_ROLE_OPTIM), "optim");
    assert_string_equal(recipe_role_section(VH_ROLE_DATA), "data");
    assert_null(recipe_role_section(VH_HOST_ROLE_COUNT));
}

static void test_edit_distance(void **state) {
    (void)state;
    assert_int_equal(vh_edit_distance("", ""), 0);
    assert_int_equal(vh_edit_distance("", "abc"), 3);
    assert_int_equal(vh_edit_distance("abc", ""), 3);
    assert_int_equal(vh_edit_distance("model", "model"), 0);
    assert_int_equal(vh_edit_distance("kitten", "sitting"), 3);
    assert_int_equal(vh_edit_distance("dimm", "dim"), 1);
    assert_int_equal(vh_edit_distance("modle", "model"), 1); /* a swap is one edit */
    assert_int_equal(vh_edit_distance("ab", "ba"), 1);
}

static void test_suggest(void **state) {
    (void)state;
    static const char *const words[] = {"dim", "depth", "heads", "dropout", NULL};
    assert_string_equal(vh_suggest("dimm", words), "dim");
    assert_string_equal(vh_suggest("deph", words), "depth");
    assert_null(vh_suggest("colour", words));
    /* Short words allow one edit: "x" is one from "a" but two from "abc". */
    static const char *const short_words[] = {"abc", "a", "b", NULL};
    assert_string_equal(vh_suggest("x", short_words), "a"); /* tie: the first */
    assert_null(vh_suggest("xyz", short_words));
    /* Eight letters allow two edits. */
    static const char *const long_words[] = {"batch_size", NULL};
    assert_string_equal(vh_suggest("bach_sze", long_words), "batch_size");
    assert_null(vh_suggest("bach_sz", long_words));
    assert_null(vh_suggest("bsz", long_words));
    assert_null(vh_suggest("dim", NULL));
}

/* ---- main ------------------------------------------------------------------------- */

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        T(test_string_good),
        T(test_file_good),
        T(test_quoted_and_special_values),
        T(test_empty_sections_allowed),
        T(test_utf8_text_accepted),
        T(test_string_empty),
        T(test_file_empty),
        T(test_comments_only),
        T(test_sequence_document),
        T(test_scalar_document),
        T(test_two_documents),
        T(test_alias_bomb_refused),
        T(test_alias_refused),
        T(test_duplicate_section),
        T(test_duplicate_key),
        T(test_section_not_mapping),
        T(test_section_null),
        T(test_nested_value),
        T(test_complex_keys_refused),
        T(test_null_value),
        T(test_unknown_section_suggestion),
        T(test_unknown_section_list),
        T(test_nul_byte),
        T(test_invalid_utf8),
        T(test_control_character),
        T(test_huge_sparse_file),
        T(test_limit_boundary),
        T(test_missing_file),
        T(test_directory),
        T(test_unreadable_file),
        T(test_path_through_file),
        T(test_endless_device),
        T(test_fifo_refused),
        T(test_tags_refused),
        T(test_syntax_error),
        T(test_tab_indentation),
        T(test_tab_separator_ok),
        T(test_crlf),
        T(test_set_replaces_file_value),
        T(test_set_appends),
        T(test_set_on_empty_recipe),
        T(test_set_errors),
        T(test_set_whole_section),
        T(test_set_whole_section_errors),
        T(test_set_keeps_replaced_text),
        T(test_diag_value),
        T(test_section_names),
        T(test_edit_distance),
        T(test_suggest),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
