/* test_bench.c - `vithost bench`, `vithost sweep` and `vithost plot` as
 * scripts use them: the bench's JSON keys and their sanity, a 2x2 sweep and
 * a cumulative one (files, rows, well-formed SVG with one bar per row),
 * plot's SVG (a polyline per run and panel), and the progress bar's text.
 * No timing is asserted beyond "positive and consistent". */
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
#include <sys/wait.h>

#include <cmocka.h>

#include "harness.h"

#include "plot.h"
#include "progress.h"

static char tmp_dir[256];

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

/* Runs vithost with ARGS (a format) in tmp_dir; its exit code, output in out and err. */
#define vithost(...) harness_sh(tmp_dir, VH_TEST_VITHOST " " __VA_ARGS__)

static void write_file(const char *name, const char *text) {
    assert_int_equal(harness_write(tmp_dir, name, text), 0);
}

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "bench") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    setenv("OMP_NUM_THREADS", "1", 1); /* tiny steps: threads would only wait */
    write_file("tiny.yaml", harness_tiny_vit);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

static double number(const char *json, const char *key) {
    double v = NAN;
    if (!plot_json_number(json, key, &v)) fail_msg("no number \"%s\" in: %s", key, json);
    return v;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* ---- a minimal XML check: every tag closed in order, entities known ------ */

static void assert_well_formed(const char *xml) {
    char stack[64][32];
    int depth = 0, roots = 0;
    for (const char *p = xml; *p; p++) {
        if (*p == '&') {
            static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
            int ok = 0;
            for (int i = 0; i < 5; i++) ok |= strncmp(p, ents[i], strlen(ents[i])) == 0;
            if (!ok) fail_msg("a bare '&' at: %.40s", p);
            continue;
        }
        if (*p == '>') fail_msg("a bare '>' at: %.40s", p);
        if (*p != '<') continue;
        const char *end = strchr(p, '>');
        assert_non_null(end);
        if (p[1] == '?' || p[1] == '!') { /* declaration, comment */
            p = end;
            continue;
        }
        if (p[1] == '/') {
            assert_true(depth > 0);
            depth--;
            size_t n = strlen(stack[depth]);
            if (strncmp(p + 2, stack[depth], n) != 0 || (p[2 + n] != '>' && p[2 + n] != ' '))
                fail_msg("</...> does not close <%s> at: %.40s", stack[depth], p);
        } else if (end[-1] != '/') {
            assert_true(depth < 64);
            size_t n = strcspn(p + 1, " \t\n/>");
            assert_true(n > 0 && n < 32);
            memcpy(stack[depth], p + 1, n);
            stack[depth][n] = '\0';
            if (depth == 0) roots++;
            depth++;
        }
        /* attribute values: quotes balanced inside the tag */
        int quotes = 0;
        for (const char *q = p; q < end; q++) quotes += *q == '"';
        if (quotes % 2) fail_msg("unbalanced quotes in: %.60s", p);
        p = end;
    }
    assert_int_equal(depth, 0);
    assert_int_equal(roots, 1);
    assert_non_null(strstr(xml, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
}

/* ---- bench ----------------------------------------------------------------- */

static void check_bench_object(const char *json, double peak) {
    assert_int_equal(json[0], '{');
    assert_non_null(strstr(json, "\"phase_ms\": {"));
    double median = number(json, "step_ms_median");
    assert_true(median > 0);
    assert_true(number(json, "step_ms_min") <= median);
    assert_true(number(json, "step_ms_max") >= median);
    double img = number(json, "img_per_s");
    /* img/s is the global batch over the median step */
    assert_true(fabs(img * median / 1e3 - number(json, "global_batch")) < 1e-3 * img);
    /* its spread: the batch over the slowest and the fastest step */
    double batch = number(json, "global_batch");
    assert_true(fabs(number(json, "img_per_s_min") * number(json, "step_ms_max") / 1e3 - batch) <
                1e-3 * batch);
    assert_true(fabs(number(json, "img_per_s_max") * number(json, "step_ms_min") / 1e3 - batch) <
                1e-3 * batch);
    assert_true(number(json, "img_per_s_min") <= img && img <= number(json, "img_per_s_max"));
    double spread = (number(json, "step_ms_max") - number(json, "step_ms_min")) / median;
    assert_true(fabs(number(json, "step_spread") - spread) <= 1e-3 * spread + 1e-9);
    double tflops = number(json, "tflops");
    assert_true(tflops > 0);
    double mfu = number(json, "mfu");
    if (peak > 0) assert_true(fabs(mfu - tflops / peak) <= 1e-4 * mfu);
    assert_true(mfu > 0 && mfu < 10);
    assert_true(number(json, "peak_mem_bytes") > 1e6);
    assert_true(number(json, "model_state_bytes") > 0);
    const char *phases = strstr(json, "\"phase_ms\"");
    static const char *const keys[] = {"data", "forward", "backward", "comm_wait",
                                       "optimizer"};
    for (int i = 0; i < 5; i++) assert_true(number(phases, keys[i]) >= 0);
    assert_true(number(phases, "forward") > 0 && number(phases, "backward") > 0);
    assert_int_equal((int)number(json, "world_size"), 1);
    assert_int_equal((int)number(json, "steps"), 3);
    assert_true(isfinite(number(json, "loss")));
    assert_non_null(strstr(json, "\"compute_dtype\": \"f32\""));
}

/* The text's step times, and a warning line exactly when they spread more
 * than 10% (within the printed digits). */
static void check_spread_text(const char *out) {
    double median, lo, hi, img, per_rank, img_lo, img_hi;
    const char *p = strstr(out, "step time   median ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "step time   median %lf ms, min %lf, max %lf", &median, &lo, &hi),
                     3);
    p = strstr(out, "throughput  ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "throughput  %lf img/s (the job), %lf per rank; min %lf, max %lf",
                            &img, &per_rank, &img_lo, &img_hi),
                     4);
    assert_true(img_lo <= img && img <= img_hi);
    double spread = (hi - lo) / median;
    const char *warn = strstr(out, "  warning     step times spread ");
    if (spread > 0.12) assert_non_null(warn);
    if (spread < 0.08) assert_null(warn);
}

static void test_bench_json(void **state) {
    (void)state;
    /* 3 steps of batch 8 from a split of 32: the data starts a new pass */
    int rc = vithost("bench tiny.yaml --json --steps 3 --warmup 2");
    char *out = tmp_text("out"), *err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s%s", rc, out, err);
    assert_int_equal(count(out, "\n"), 1); /* one object, nothing else on stdout */
    check_bench_object(out, 0.5);
    assert_non_null(strstr(out, "\"peak_source\": \"run.peak_tflops\""));
    /* the CPU engine's choices, as the text says them; gelu' only under bf16 */
    assert_non_null(strstr(out, "\"engine\": {\"gemm\": \"f32 GEMM: "));
    assert_non_null(strstr(out, "\"attention\": \""));
    assert_non_null(strstr(out, "\"bands\": \""));
    assert_null(strstr(out, "\"gelu_grad\""));
    free(out);
    free(err);
    rc = vithost("bench tiny.yaml --json --steps 3 --warmup 1 --set precision.plugin=amp");
    out = tmp_text("out"), err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s%s", rc, out, err);
    assert_int_equal(count(out, "\n"), 1);
    assert_non_null(strstr(out, "\"compute_dtype\": \"bf16\""));
    assert_non_null(strstr(out, "\"engine\": {\"gemm\": \"bf16 GEMM: "));
    assert_non_null(strstr(out, "\"gelu_grad\": \"bf16 gelu': "));
    free(out);
    free(err);
}

/* Without run.peak_tflops the CPU's peak is a GEMM probe in the policy's
 * compute dtype. */
static void test_bench_probe_and_text(void **state) {
    (void)state;
    int rc = vithost("bench tiny.yaml --json --steps 3 --warmup 1 --set run.peak_tflops=0");
    char *out = tmp_text("out");
    if (rc != 0) fail_msg("exit %d: %s", rc, out);
    check_bench_object(out, 0);
    assert_non_null(strstr(out, "\"peak_source\": \"f32 GEMM probe\""));
    free(out);
    rc = vithost("bench tiny.yaml --steps 3 --warmup 0");
    out = tmp_text("out");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "img/s (the job)"));
    assert_non_null(strstr(out, "phases      data"));
    assert_non_null(strstr(out, "MFU"));
    check_spread_text(out);
    /* no warm-up: the first step builds the kernels and is many times the
     * others, so the spread is far past 10% */
    assert_non_null(strstr(out, "  warning     step times spread "));
    free(out);
}

/* run.grad_accum K: a timed step is an optimizer step of K micro-batches, the
 * global batch K x batch_size (img/s over it), said in the JSON and the text;
 * `vithost check` prints the global batch and refuses a split shorter than a step. */
static void test_bench_grad_accum(void **state) {
    (void)state;
    int rc = vithost("bench tiny.yaml --json --steps 3 --warmup 1 --set run.grad_accum=3");
    char *out = tmp_text("out"), *err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s%s", rc, out, err);
    check_bench_object(out, 0.5);
    assert_int_equal((int)number(out, "global_batch"), 24);
    assert_int_equal((int)number(out, "micro_batch"), 8);
    assert_int_equal((int)number(out, "grad_accum"), 3);
    const double accum_ms = number(out, "step_ms_median");
    free(out), free(err);
    rc = vithost("bench tiny.yaml --json --steps 3 --warmup 1");
    out = tmp_text("out");
    assert_int_equal(rc, 0);
    assert_int_equal((int)number(out, "grad_accum"), 1);
    assert_int_equal((int)number(out, "global_batch"), 8);
    printf("bench: median step %.2f ms with run.grad_accum 3, %.2f ms without\n", accum_ms,
           number(out, "step_ms_median"));
    free(out);
    rc = vithost("bench tiny.yaml --steps 2 --warmup 0 --set run.grad_accum=2");
    out = tmp_text("out");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "global batch 16 (8 x 2 micro-batches (run.grad_accum) x 1)"));
    free(out);
    rc = vithost("check tiny.yaml --set run.grad_accum=2");
    out = tmp_text("out");
    if (rc != 0) fail_msg("check: exit %d: %s", rc, out);
    assert_non_null(strstr(out, "global batch 16 = 8 x 2 micro-batch(es) x 1 rank(s)"));
    free(out);
    /* 32 samples: not one step of 8 x 5 */
    rc = vithost("check tiny.yaml --set run.grad_accum=5");
    err = tmp_text("err");
    assert_int_equal(rc, 3);
    assert_non_null(strstr(err, "fewer than one step of 8 x 5 (run.batch_size x run.grad_accum)"));
    free(err);
}

static void test_bench_errors(void **state) {
    (void)state;
    assert_int_equal(vithost("bench tiny.yaml --steps 0"), 2);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "--steps needs a whole number >= 1, not '0'"));
    free(err);
    assert_int_equal(vithost("bench tiny.yaml --set model.dimm=3"), 3);
    err = tmp_text("err");
    assert_non_null(strstr(err, "dimm"));
    free(err);
    assert_int_equal(vithost("bench"), 2);
}

/* ---- sweep ----------------------------------------------------------------- */

static void test_sweep_grid(void **state) {
    (void)state;
    int rc = vithost("sweep tiny.yaml --vary model.classifier=token,pooled "
                     "--vary model.layout=batch_first,batch_second --steps 2 --warmup 1 "
                     "--out grid --title 'a <2x2> sweep' --repeat 1");
    char *out = tmp_text("out"), *err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s%s", rc, out, err);
    char *md = tmp_text("grid/sweep.md"), *svg = tmp_text("grid/sweep.svg");
    char *json = tmp_text("grid/sweep.json");
    /* 4 rows, the first --vary slowest */
    assert_non_null(strstr(md, "| 0 | token, batch_first |"));
    assert_non_null(strstr(md, "| 1 | token, batch_second |"));
    assert_non_null(strstr(md, "| 2 | pooled, batch_first |"));
    assert_non_null(strstr(md, "| 3 | pooled, batch_second |"));
    assert_null(strstr(md, "| 4 |"));
    assert_null(strstr(md, "failed"));
    assert_non_null(strstr(md, "| 1.00x |")); /* row 0 against itself */
    assert_int_equal(count(json, "\"label\": "), 4);
    assert_int_equal(count(json, "\"img_per_s\": "), 4);
    assert_non_null(strstr(json, "\"sets\": [\"model.classifier=pooled\", "
                                 "\"model.layout=batch_second\"]"));
    assert_well_formed(svg);
    assert_int_equal(count(svg, "<rect class=\"bar\""), 4);
    assert_non_null(strstr(svg, "a &lt;2x2&gt; sweep")); /* the title, escaped */
    /* --repeat 1: one run a row, as before repeats: no spread anywhere */
    assert_null(strstr(md, "min-max"));
    assert_null(strstr(svg, "whisker"));
    assert_null(strstr(json, "\"repeats\""));
    assert_non_null(strstr(out, "sweep: [4/4] pooled, batch_second: "));
    free(out);
    free(err);
    free(md);
    free(svg);
    free(json);
}

/* Each row keeps the changes above it; a later step overrides a key. */
static void test_sweep_sequence(void **state) {
    (void)state;
    int rc = vithost("sweep tiny.yaml --sequence --base baseline "
                     "--step pooled:model.classifier=pooled "
                     "--step model.layout=batch_second,optim.lr=0.002 --step "
                     "'token again:model.classifier=token' --steps 2 --warmup 0 --out seq "
                     "--repeat 1");
    char *out = tmp_text("out"), *err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s%s", rc, out, err);
    char *md = tmp_text("seq/sweep.md"), *svg = tmp_text("seq/sweep.svg");
    char *json = tmp_text("seq/sweep.json");
    assert_non_null(strstr(md, "| 0 | baseline | (the recipe) |"));
    assert_non_null(strstr(md, "| 1 | pooled | `model.classifier=pooled` |"));
    assert_non_null(strstr(md, "| 2 | model.layout=batch_second, optim.lr=0.002 |"));
    assert_non_null(strstr(md, "| 3 | token again | `model.classifier=token` |"));
    assert_non_null(strstr(md, "vs previous"));
    assert_non_null(strstr(json, "\"mode\": \"sequence\""));
    assert_non_null(strstr(json, "[\"model.classifier=pooled\", \"model.layout=batch_second\", "
                                 "\"optim.lr=0.002\", \"model.classifier=token\"]"));
    assert_well_formed(svg);
    assert_int_equal(count(svg, "<rect class=\"bar\""), 4);
    free(out);
    free(err);
    free(md);
    free(svg);
    free(json);
}

static void test_sweep_errors(void **state) {
    (void)state;
    assert_int_equal(vithost("sweep tiny.yaml"), 2);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "needs at least one --vary"));
    free(err);
    assert_int_equal(vithost("sweep tiny.yaml --vary depth=1,2"), 2);
    err = tmp_text("err");
    assert_non_null(strstr(err, "--vary needs SECTION.KEY=V1,V2,..., not 'depth=1,2'"));
    free(err);
    assert_int_equal(vithost("sweep tiny.yaml --step model.depth=2"), 2);
    err = tmp_text("err");
    assert_non_null(strstr(err, "--step belongs to --sequence"));
    free(err);
    /* a row that fails is a row of the table, and the sweep says so */
    assert_int_equal(vithost("sweep tiny.yaml --vary model.depth=1,0 --steps 1 --warmup 0 "
                             "--out bad"),
                     1);
    char *md = tmp_text("bad/sweep.md");
    assert_non_null(strstr(md, "failed (exit 3)"));
    free(md);
}

/* ---- sweep --repeat ---------------------------------------------------------- */

/* The runs in the order they started, as "RK RK ..." (row, repeat), from
 * the lines that show a run's command. */
static void run_order(const char *out, char *order, size_t len) {
    order[0] = '\0';
    for (const char *line = out; line && *line; line = strchr(line, '\n'), line += !!line) {
        const char *p = strstr(line, "] row "), *nl = strchr(line, '\n');
        const char *cmd = strstr(line, " bench tiny.yaml");
        int r, k;
        if (!p || !cmd || (nl && (p > nl || cmd > nl))) continue;
        if (sscanf(p, "] row %d, repeat %d of", &r, &k) != 2) continue;
        size_t used = strlen(order);
        snprintf(order + used, len - used, "%s%d%d", used ? " " : "", r, k);
    }
}

/* 2 rows x 2 repeats of real benches: the rows take turns; the median lies
 * within min-max in the table; a whisker per bar; every run in the JSON. */
static void test_sweep_repeat_real(void **state) {
    (void)state;
    int rc = vithost("sweep tiny.yaml --vary model.depth=1,2 --steps 2 --warmup 0 --repeat 2 "
                     "--out rep");
    char *out = tmp_text("out"), *err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s%s", rc, out, err);
    char order[64];
    run_order(out, order, sizeof order);
    assert_string_equal(order, "01 11 02 12");
    char *md = tmp_text("rep/sweep.md"), *svg = tmp_text("rep/sweep.svg");
    char *json = tmp_text("rep/sweep.json");
    assert_non_null(strstr(md, "| img/s | min-max | spread | relative |"));
    for (int r = 0; r < 2; r++) {
        char head[64];
        snprintf(head, sizeof head, "| %d | %d | `model.depth=%d` |", r, r + 1, r + 1);
        const char *p = strstr(md, head);
        assert_non_null(p);
        double med, lo, hi;
        assert_int_equal(sscanf(p + strlen(head), " %lf | %lf-%lf |", &med, &lo, &hi), 3);
        assert_true(lo <= med && med <= hi && lo > 0);
    }
    assert_well_formed(svg);
    assert_int_equal(count(svg, "<path class=\"whisker\""), 2);
    assert_non_null(strstr(svg, "whiskers: min-max of the runs"));
    assert_non_null(strstr(json, "\"repeat\": 2"));
    assert_int_equal(count(json, "\"repeats\": ["), 2);
    assert_int_equal(count(json, "{\"exit\": 0, \"result\": {\"img_per_s\": "), 4);
    free(out);
    free(err);
    free(md);
    free(svg);
    free(json);
}

/* A stand-in for mpirun ($VITHOST_MPIRUN, --np 1): it logs the row's
 * --set, and prints a bench object whose img/s is the next of a list, so
 * the medians, spreads and a failed run are known. Runs in order:
 * r0k1 r1k1 r0k2 r1k2 r0k3 r1k3. */
static const char fake_launcher[] =
    "n=$(cat calls 2>/dev/null || echo 0); n=$((n + 1)); echo $n > calls\n"
    "for a; do case $a in model.*) echo \"$a\" >> trace;; esac; done\n"
    "set -- 100 200 104 150 102 260\n"
    "shift $((n - 1)); v=$1\n"
    "if [ -n \"$FAIL_AT\" ] && [ $n -eq \"$FAIL_AT\" ]; then echo 'no object' >&2; exit 3; fi\n"
    "echo \"{\\\"img_per_s\\\": $v, \\\"step_ms_median\\\": 10, \\\"tflops\\\": 0.1, "
    "\\\"mfu\\\": 0.2, \\\"peak_mem_bytes\\\": 1048576, \\\"phase_ms\\\": {\\\"data\\\": 1, "
    "\\\"forward\\\": 2, \\\"backward\\\": 3, \\\"comm_wait\\\": 0, \\\"optimizer\\\": 1}}\"\n";

static void test_sweep_repeat_spread(void **state) {
    (void)state;
    write_file("fake.sh", fake_launcher);
    harness_sh(tmp_dir, "rm -f calls trace");
    int rc = harness_sh(tmp_dir, "VITHOST_MPIRUN='sh fake.sh' " VH_TEST_VITHOST
                             " sweep tiny.yaml --vary model.depth=1,2 --np 1 --out fake");
    char *out = tmp_text("out");
    if (rc != 0) fail_msg("exit %d: %s", rc, out);
    char *trace = tmp_text("trace"), *md = tmp_text("fake/sweep.md");
    /* the default, 3 runs a row, the rows taking turns */
    assert_string_equal(trace, "model.depth=1\nmodel.depth=2\nmodel.depth=1\nmodel.depth=2\n"
                               "model.depth=1\nmodel.depth=2\n");
    /* row 0: 100 104 102, spread 4%; row 1: 200 150 260, spread 55%, flagged */
    assert_non_null(strstr(md, "| 0 | 1 | `model.depth=1` | 102.0 | 100.0-104.0 | 4% | 1.00x |"));
    assert_non_null(strstr(md, "| 1 | 2 | `model.depth=2` | 200.0 | 150.0-260.0 | **55%, over "
                               "10%** | 1.96x |"));
    assert_non_null(strstr(md, "\n- **Warning:** row 1 (2) varied by 55%"));
    assert_null(strstr(md, "row 0 (1) varied"));
    assert_non_null(strstr(out, "sweep: warning: row 1 (2) varied by 55%"));
    char *svg = tmp_text("fake/sweep.svg");
    assert_well_formed(svg);
    assert_int_equal(count(svg, "<path class=\"whisker\""), 2);
    free(svg);
    free(trace);
    free(md);
    free(out);
    /* run 4 (row 1, repeat 2) fails: its row has the median of the other two,
     * the run is reported, the sweep exits 1 */
    harness_sh(tmp_dir, "rm -f calls trace");
    rc = harness_sh(tmp_dir, "FAIL_AT=4 VITHOST_MPIRUN='sh fake.sh' " VH_TEST_VITHOST
                             " sweep tiny.yaml --vary model.depth=1,2 --np 1 --out fake");
    assert_int_equal(rc, 1);
    md = tmp_text("fake/sweep.md");
    char *json = tmp_text("fake/sweep.json"), *err = tmp_text("err");
    assert_non_null(strstr(md, "| 230.0 | 200.0-260.0 | **26%, over 10%**; 1 of 3 runs failed "
                               "(exit 3) |"));
    assert_non_null(strstr(json, "{\"exit\": 3, \"result\": null}"));
    assert_non_null(strstr(err, "1 of 6 runs failed"));
    free(md);
    free(json);
    free(err);
}

/* ---- plot ------------------------------------------------------------------ */

static void test_plot_two_runs(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/run-a", tmp_dir);
    mkdir(path, 0777);
    snprintf(path, sizeof path, "%s/run-b", tmp_dir);
    mkdir(path, 0777);
    write_file("run-a/metrics.jsonl",
               "{\"step\":10,\"epoch\":0,\"loss\":2.1,\"img_per_s\":900}\n"
               "{\"step\":20,\"epoch\":0,\"loss\":1.5,\"img_per_s\":950}\n"
               "{\"step\":20,\"epoch\":0,\"eval_top1\":0.61,\"eval_loss\":1.2}\n"
               "{\"step\":30,\"epoch\":1,\"loss\":null,\"img_per_s\":940,\"skipped\":true}\n"
               "{\"step\":40,\"epoch\":1,\"eval_top1\":0.72,\"eval_loss\":0.9}\n");
    write_file("run-b/metrics.jsonl",
               "{\"step\":10,\"epoch\":0,\"loss\":2.3,\"img_per_s\":500}\n"
               "{\"step\":20,\"epoch\":0,\"loss\":1.9,\"img_per_s\":520}\n"
               "{\"step\":20,\"epoch\":0,\"eval_top1\":0.40,\"eval_loss\":1.6}\n");
    int rc = vithost("plot run-a run-b/ -o curves.svg");
    char *err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s", rc, err);
    char *svg = tmp_text("curves.svg");
    assert_well_formed(svg);
    /* three panels, a line per run in each */
    assert_int_equal(count(svg, "<polyline"), 6);
    assert_int_equal(count(svg, "stroke=\"#1f77b4\" stroke-width=\"1.6\""), 3);
    assert_non_null(strstr(svg, ">training loss<"));
    assert_non_null(strstr(svg, ">eval top-1 (%)<"));
    assert_non_null(strstr(svg, ">throughput (img/s)<"));
    assert_non_null(strstr(svg, ">run-a<"));
    assert_non_null(strstr(svg, ">run-b<")); /* the trailing slash is not the name */
    free(svg);
    free(err);
    assert_int_equal(vithost("plot run-a nowhere -o x.svg"), 1);
    err = tmp_text("err");
    assert_non_null(strstr(err, "nowhere/metrics.jsonl"));
    free(err);
    assert_int_equal(vithost("plot run-a"), 2);
}

/* The top-1 panel's y ticks (the labels right-aligned at its left edge,
 * x 444) as numbers; their count. */
static int top1_ticks(const char *svg, double *v, int max) {
    static const char tag[] = "<text x=\"444.0\" y=\"";
    int n = 0;
    for (const char *p = strstr(svg, tag); p && n < max; p = strstr(p + 1, tag)) {
        const char *close = strchr(p, '>');
        if (!close || !strstr(p, "text-anchor=\"end\"") ||
            strstr(p, "text-anchor=\"end\"") > close)
            continue;
        v[n++] = strtod(close + 1, NULL);
    }
    return n;
}

/* Runs at 85-89% are drawn on a scale of the data (ticks from ~84 to ~90,
 * labels apart), not 0-100; the chart scales to the page width. */
static void test_plot_top1_axis(void **state) {
    (void)state;
    harness_sh(tmp_dir, "mkdir -p acc-a acc-b");
    write_file("acc-a/metrics.jsonl",
               "{\"step\":10,\"loss\":0.5,\"img_per_s\":900}\n"
               "{\"step\":10,\"eval_top1\":0.85}\n{\"step\":20,\"eval_top1\":0.872}\n"
               "{\"step\":30,\"eval_top1\":0.889}\n");
    write_file("acc-b/metrics.jsonl",
               "{\"step\":10,\"loss\":0.6,\"img_per_s\":800}\n"
               "{\"step\":10,\"eval_top1\":0.861}\n{\"step\":30,\"eval_top1\":0.878}\n");
    int rc = vithost("plot acc-a acc-b -o acc.svg");
    char *err = tmp_text("err");
    if (rc != 0) fail_msg("exit %d: %s", rc, err);
    free(err);
    char *svg = tmp_text("acc.svg");
    assert_well_formed(svg);
    double t[64];
    int n = top1_ticks(svg, t, 64);
    if (n < 4 || n > 12) fail_msg("%d ticks on the top-1 axis:\n%.3000s", n, svg);
    for (int i = 1; i < n; i++) assert_true(t[i] > t[i - 1]); /* distinct labels, rising */
    if (!(t[0] >= 80 && t[0] <= 85 && t[n - 1] >= 89 && t[n - 1] <= 95))
        fail_msg("top-1 axis from %g to %g, not the data's 85-89", t[0], t[n - 1]);
    /* as wide as the page: a percentage width and the drawing's viewBox */
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100%\""));
    assert_non_null(strstr(svg, "viewBox=\"0 0 "));
    free(svg);
    /* one value: still a scale around it, never past 100 */
    write_file("acc-a/metrics.jsonl", "{\"step\":10,\"eval_top1\":0.995}\n");
    assert_int_equal(vithost("plot acc-a -o one.svg"), 0);
    svg = tmp_text("one.svg");
    n = top1_ticks(svg, t, 64);
    assert_true(n >= 2);
    assert_true(t[0] >= 95 && t[0] < 99.5 && t[n - 1] <= 100 && t[n - 1] > 99.5);
    free(svg);
}

/* ---- pieces ------------------------------------------------------------------ */

static void test_json_number(void **state) {
    (void)state;
    double v = 0;
    const char *line = "{\"step\":3,\"eval_loss\":0.5,\"loss\": 1.25,\"mfu\":null}";
    assert_int_equal(plot_json_number(line, "loss", &v), 1);
    assert_true(v == 1.25); /* not eval_loss's */
    assert_int_equal(plot_json_number(line, "mfu", &v), 0);
    assert_int_equal(plot_json_number(line, "lr", &v), 0);
    assert_int_equal(plot_json_number(line, "step", &v), 1);
    assert_true(v == 3);
}

static void test_progress_bar(void **state) {
    (void)state;
    char bar[11];
    progress_bar_text(bar, sizeof bar, 0.5);
    assert_string_equal(bar, "#####.....");
    progress_bar_text(bar, sizeof bar, 0.0);
    assert_string_equal(bar, "..........");
    progress_bar_text(bar, sizeof bar, 1.7);
    assert_string_equal(bar, "##########");
    progress_bar_text(bar, sizeof bar, NAN);
    assert_string_equal(bar, "..........");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_number),
        cmocka_unit_test(test_progress_bar),
        cmocka_unit_test(test_bench_json),
        cmocka_unit_test(test_bench_probe_and_text),
        cmocka_unit_test(test_bench_grad_accum), cmocka_unit_test(test_bench_errors),
        cmocka_unit_test(test_sweep_grid),
        cmocka_unit_test(test_sweep_sequence),
        cmocka_unit_test(test_sweep_errors),
        cmocka_unit_test(test_sweep_repeat_real),
        cmocka_unit_test(test_sweep_repeat_spread),
        cmocka_unit_test(test_plot_two_runs),
        cmocka_unit_test(test_plot_top1_axis),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
