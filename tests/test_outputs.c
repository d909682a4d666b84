/* test_outputs.c - what vithost writes never clobbers what a user has, and
 * the charts of sweep and plot say what happened (issue 19, points 9 and 10):
 *   - plot -o refuses a run's metrics.jsonl (by name or through a link), a
 *     folder and a file it did not write; it replaces its own SVG;
 *   - sweep --out refuses a file, a folder holding the user's sweep.md or
 *     the recipe itself, before any row runs; it replaces its own files;
 *   - new-plugin refuses a DIR that is a file, and a link among its files;
 *   - plot of an empty or all-NaN metrics.jsonl fails; huge values draw
 *     inside the canvas (no inf, nan, or a tick loop that never ends);
 *   - a sweep whose row 0 failed is relative to the row that ran, under
 *     that row's label; one whose rows all failed says so (no nan);
 *   - `plugins --describe run` prints the run section's keys.
 * Sweep rows are 2 steps of a ViT of one block on 8x8 images. */
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

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

/* Runs vithost with ARGS (a format) in tmp_dir, at most 60 s (an endless
 * loop fails, not hangs); its exit code, output in out and err. */
#define vithost(...) harness_sh(tmp_dir, "timeout 60 " VH_TEST_VITHOST " " __VA_ARGS__)

static void write_file(const char *name, const char *text) {
    assert_int_equal(harness_write(tmp_dir, name, text), 0);
}

static void make_dir(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    assert_int_equal(mkdir(path, 0777), 0);
}

static int exists(const char *name) {
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    return lstat(path, &st) == 0;
}

/* The file still holds exactly `text`. */
static void assert_unchanged(const char *name, const char *text) {
    char *now = tmp_text(name);
    if (strcmp(now, text) != 0) fail_msg("%s was overwritten; it now starts: %.80s", name, now);
    free(now);
}

/* The message on stderr contains `what`. */
static void assert_err(const char *what) {
    char *err = tmp_text("err");
    if (!strstr(err, what)) fail_msg("no '%s' in the message:\n%s", what, err);
    free(err);
}

static const char metrics[] = "{\"step\":10,\"epoch\":0,\"loss\":2.1,\"img_per_s\":900}\n"
                              "{\"step\":20,\"epoch\":0,\"eval_top1\":0.61,\"eval_loss\":1.2}\n";

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "outputs") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    setenv("OMP_NUM_THREADS", "1", 1); /* tiny steps: threads would only wait */
    write_file("tiny.yaml", harness_tiny_vit);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

/* ---- plot -o ------------------------------------------------------------------ */

static void test_plot_never_clobbers(void **state) {
    (void)state;
    make_dir("run");
    write_file("run/metrics.jsonl", metrics);
    /* the run's own metrics, by name and through a link */
    assert_int_equal(vithost("plot run -o run/metrics.jsonl"), 2);
    assert_err("run/metrics.jsonl is an input of this command");
    assert_unchanged("run/metrics.jsonl", metrics);
    assert_int_equal(harness_sh(tmp_dir, "ln -s run/metrics.jsonl link.svg"), 0);
    assert_int_equal(vithost("plot run -o link.svg"), 2);
    assert_err("(the same file as run/metrics.jsonl)");
    assert_unchanged("run/metrics.jsonl", metrics);
    /* a file vithost did not write, a folder, a link to nothing */
    write_file("notes.txt", "my notes\n");
    assert_int_equal(vithost("plot run -o notes.txt"), 2);
    assert_err("notes.txt exists and is not an SVG vithost wrote; nothing was written");
    assert_unchanged("notes.txt", "my notes\n");
    write_file("theirs.svg",
               "<?xml version=\"1.0\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n");
    assert_int_equal(vithost("plot run -o theirs.svg"), 2);
    assert_int_equal(vithost("plot run -o run"), 2);
    assert_err("run is a folder, not a file");
    assert_int_equal(harness_sh(tmp_dir, "ln -s nowhere.svg dangling.svg"), 0);
    assert_int_equal(vithost("plot run -o dangling.svg"), 2);
    assert_err("dangling.svg is a link to a missing file");
    assert_false(exists("nowhere.svg"));
    /* its own SVG is replaced (a plot can be redrawn); an empty file too */
    assert_int_equal(vithost("plot run -o curves.svg"), 0);
    assert_int_equal(vithost("plot run -o curves.svg --title again"), 0);
    char *svg = tmp_text("curves.svg");
    assert_non_null(strstr(svg, ">again<"));
    free(svg);
    write_file("empty.svg", "");
    assert_int_equal(vithost("plot run -o empty.svg"), 0);
}

/* ---- plot: what there is to draw ----------------------------------------------- */

static void test_plot_nothing_to_draw(void **state) {
    (void)state;
    make_dir("empty");
    write_file("empty/metrics.jsonl", "");
    assert_int_equal(vithost("plot empty -o e.svg"), 1);
    assert_err("empty/metrics.jsonl has no finite loss, eval_top1 or img_per_s in its 0 line(s)");
    assert_false(exists("e.svg"));
    make_dir("nans");
    write_file("nans/metrics.jsonl", "{\"step\":1,\"loss\":NaN,\"img_per_s\":null}\n"
                                     "{\"step\":2,\"loss\":null,\"eval_top1\":NaN}\n");
    assert_int_equal(vithost("plot nans -o n.svg"), 1);
    assert_err("nans/metrics.jsonl has no finite loss, eval_top1 or img_per_s in its 2 line(s)");
    assert_false(exists("n.svg"));
}

/* Every number in the SVG's coordinates is finite and inside the canvas. */
static void assert_on_canvas(const char *svg) {
    if (strstr(svg, "inf") || strstr(svg, "nan")) fail_msg("inf or nan in:\n%.2000s", svg);
    int points = 0;
    for (const char *p = strstr(svg, "points=\""); p; p = strstr(p + 1, "points=\"")) {
        const char *q = p + 8;
        while (*q && *q != '"') {
            char *end;
            double v = strtod(q, &end);
            assert_true(end > q);
            if (!(v >= 0 && v <= 2000)) fail_msg("a coordinate off the canvas: %g", v);
            points++;
            q = end + (*end == ',' || *end == ' ');
        }
    }
    assert_true(points > 0);
}

static void test_plot_huge_values(void **state) {
    (void)state;
    make_dir("huge");
    write_file("huge/metrics.jsonl", "{\"step\":1,\"loss\":1e308,\"img_per_s\":1.7e308}\n"
                                     "{\"step\":2,\"loss\":-1.7e308,\"img_per_s\":1e300}\n"
                                     "{\"step\":3,\"loss\":5,\"eval_top1\":1e200}\n");
    int rc = vithost("plot huge -o h.svg");
    if (rc != 0) fail_msg("exit %d", rc);
    char *svg = tmp_text("h.svg");
    assert_on_canvas(svg);
    free(svg);
    /* values the doubles cannot split into ticks (1e17 + 16): a flat line */
    make_dir("flat");
    write_file("flat/metrics.jsonl", "{\"step\":1,\"loss\":100000000000000000}\n"
                                     "{\"step\":1e18,\"loss\":100000000000000016}\n");
    rc = vithost("plot flat -o f.svg");
    if (rc != 0) fail_msg("exit %d (124: it never ended)", rc);
    svg = tmp_text("f.svg");
    assert_on_canvas(svg);
    free(svg);
}

/* ---- sweep --out --------------------------------------------------------------- */

static void test_sweep_out_refused_before_rows(void **state) {
    (void)state;
    write_file("afile", "keep me\n");
    assert_int_equal(vithost("sweep tiny.yaml --vary model.depth=1,2 --steps 2 --warmup 0 "
                             "--out afile"),
                     2);
    assert_err("--out afile exists and is not a folder");
    assert_unchanged("afile", "keep me\n");
    char *out = tmp_text("out");
    if (strstr(out, "sweep: [1/")) fail_msg("a row ran before --out was refused:\n%s", out);
    free(out);
    /* the user's own sweep.md in the folder */
    make_dir("mine");
    write_file("mine/sweep.md", "# my notes on the sweep\n");
    assert_int_equal(vithost("sweep tiny.yaml --vary model.depth=1,2 --steps 2 --warmup 0 "
                             "--out mine"),
                     2);
    assert_err("mine/sweep.md exists and is not a table vithost wrote");
    assert_unchanged("mine/sweep.md", "# my notes on the sweep\n");
    /* the recipe itself as an output */
    make_dir("rec");
    write_file("rec/sweep.json", harness_tiny_vit);
    assert_int_equal(vithost("sweep rec/sweep.json --vary model.depth=1,2 --steps 2 --warmup 0 "
                             "--out rec"),
                     2);
    assert_err("rec/sweep.json is an input of this command");
    assert_unchanged("rec/sweep.json", harness_tiny_vit);
}

/* Row 0 fails (depth 0 is refused): the chart is relative to row 1, under
 * row 1's label. Then every row fails, into the same folder (its own files
 * are replaced): no nan anywhere. */
static void test_sweep_failed_rows(void **state) {
    (void)state;
    int rc = vithost("sweep tiny.yaml --vary model.depth=0,1 --steps 2 --warmup 0 --out part");
    assert_int_equal(rc, 1);
    char *svg = tmp_text("part/sweep.svg"), *md = tmp_text("part/sweep.md");
    if (!strstr(svg, "throughput relative to &quot;1&quot; (") || !strstr(svg, "row 0 failed"))
        fail_msg("the chart's reference is not row 1:\n%.1500s", svg);
    assert_non_null(strstr(md, "relative: to row 1 (row 0 failed)"));
    assert_non_null(strstr(md, "| 1 | 1 | `model.depth=1` |"));
    assert_non_null(strstr(md, " 1.00x |"));
    free(svg);
    free(md);
    rc = vithost("sweep tiny.yaml --vary model.depth=0,2000 --steps 2 --warmup 0 --out part");
    assert_int_equal(rc, 1);
    svg = tmp_text("part/sweep.svg");
    md = tmp_text("part/sweep.md");
    assert_non_null(strstr(svg, "every row failed: no throughput to compare"));
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    assert_int_equal((int)(strstr(svg, ">failed<") != NULL), 1);
    assert_non_null(strstr(md, "relative: none (every row failed)"));
    assert_null(strstr(md, "nan"));
    free(svg);
    free(md);
}

/* ---- new-plugin ---------------------------------------------------------------- */

static void test_new_plugin_never_clobbers(void **state) {
    (void)state;
    write_file("notadir", "keep me\n");
    assert_int_equal(vithost("new-plugin optim my_opt notadir"), 2);
    assert_err("notadir exists and is not a folder; nothing was written");
    assert_unchanged("notadir", "keep me\n");
    /* a link to nothing where NAME.c goes: refused before CMakeLists.txt is written */
    make_dir("proj");
    assert_int_equal(harness_sh(tmp_dir, "ln -s elsewhere.c proj/my_opt.c"), 0);
    assert_int_equal(vithost("new-plugin optim my_opt proj"), 2);
    assert_err("proj/my_opt.c exists; nothing was written");
    assert_false(exists("proj/CMakeLists.txt"));
    assert_false(exists("proj/elsewhere.c"));
}

/* ---- plugins --describe run ------------------------------------------------------ */

static void test_describe_run(void **state) {
    (void)state;
    int rc = vithost("plugins --describe run");
    char *out = tmp_text("out");
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_non_null(strstr(out, "keys of section 'run':"));
    static const char *const keys[] = {"  steps ", "  batch_size ", "  eval_every ",
                                       "  checkpoint_every ", "  seed "};
    for (int i = 0; i < 5; i++)
        if (!strstr(out, keys[i])) fail_msg("no key '%s' in:\n%s", keys[i], out);
    assert_non_null(strstr(out, "default 128")); /* batch_size's, as a plugin's keys show */
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plot_never_clobbers),
        cmocka_unit_test(test_plot_nothing_to_draw),
        cmocka_unit_test(test_plot_huge_values),
        cmocka_unit_test(test_sweep_out_refused_before_rows),
        cmocka_unit_test(test_sweep_failed_rows),
        cmocka_unit_test(test_new_plugin_never_clobbers),
        cmocka_unit_test(test_describe_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
