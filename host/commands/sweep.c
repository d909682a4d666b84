/* sweep.c - `vithost sweep` (see sweep.h). */
#define _POSIX_C_SOURCE 200809L
#include "sweep.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "outputs.h"
#include "plot.h"
#include "runtime.h"
#include "svg.h"

#define SWEEP_MAX_ROWS 256
#define SWEEP_MAX_SETS 64

/* A row's spread of img/s over its repeats above this is flagged. */
#define SWEEP_SPREAD_WARN 0.10

/* What one run of a row measured (NAN: not known). */
typedef struct sweep_numbers {
    double img_per_s, step_ms, tflops, mfu, peak_mem, phase_ms[5];
} sweep_numbers;
#define SWEEP_NUM_METRICS 10 /* the doubles of sweep_numbers */

typedef struct sweep_repeat {
    char *json; /* the child's object, or NULL */
    int exit_code;
    sweep_numbers m;
} sweep_repeat;

typedef struct sweep_row {
    char label[256];
    const char *sets[SWEEP_MAX_SETS]; /* "section.key=value", pointers into args */
    int num_sets;
    sweep_repeat *reps; /* --repeat of them */
    /* Over the repeats that ran: json is the one of median img/s (not owned),
     * NULL when none ran; exit_code the last failure's, 0 when none failed;
     * the numbers are each metric's median. */
    const char *json;
    int exit_code, num_ok;
    double img_per_s, step_ms, tflops, mfu, peak_mem, phase_ms[5];
    double img_min, img_max, spread; /* spread: (max - min) / median, NAN under 2 runs */
} sweep_row;

static const char *const phase_keys[5] = {"data", "forward", "backward", "comm_wait",
                                          "optimizer"};

typedef struct sweep {
    const char *recipe, *out_dir, *title, *base_label;
    const char **common; /* --set of every row */
    int num_common;
    int sequence, np, repeat;
    long long steps, warmup;
    /* --vary: key and its comma-separated values; --step: changes */
    char **vary;
    int num_vary;
    char **step;
    int num_step;
    sweep_row *rows;
    int num_rows;
    char *command; /* the sweep's own command line, quoted */
} sweep;

static const char sweep_usage[] =
    "usage: vithost sweep RECIPE --vary KEY=V1,V2 [--vary KEY=V1,V2]... [options]\n"
    "       vithost sweep RECIPE --sequence [--base LABEL] --step [LABEL:]KEY=V[,KEY=V]... "
    "[options]\n"
    "  --vary: every combination of the values (the first --vary changes slowest).\n"
    "  --sequence: a cumulative ablation; row 0 is the recipe (--base names it), row i\n"
    "  applies steps 1..i. Each row is `vithost bench --json` in a child process.\n"
    "options: --set KEY=V (every row)  --steps N (20)  --warmup K (3)\n"
    "         --np N (each row under `mpirun -np N`; $VITHOST_MPIRUN replaces mpirun)\n"
    "         --out DIR (runs/sweep-<recipe>)  --title TEXT\n"
    "         --repeat N (3): each row N times, the rows taking turns (row 0, row 1, ...,\n"
    "         row 0, ...); the table gives the median img/s with min-max and flags a\n"
    "         spread (max - min) / median over 10%; --repeat 1 runs each row once\n"
    "writes DIR/sweep.md (table), DIR/sweep.svg (throughput relative to row 0),\n"
    "DIR/sweep.json (every row's bench object).\n";

static int sweep_usage_error(FILE *err, const char *fmt, const char *arg) {
    fputs("vithost sweep: ", err);
    fprintf(err, fmt, arg);
    fputc('\n', err);
    fputs(sweep_usage, err);
    return VH_EXIT_USAGE;
}

/* "KEY=VALUE" with KEY "section.key". */
static int valid_change(const char *text) {
    const char *eq = strchr(text, '=');
    const char *dot = strchr(text, '.');
    return eq && dot && dot < eq && dot > text && eq > dot + 1;
}

/* ---- the rows ------------------------------------------------------------- */

/* Splits s at commas in place into out[] (at most max); returns the count. */
static int split_commas(char *s, char **out, int max) {
    int n = 0;
    for (char *p = s; p && n < max;) {
        char *c = strchr(p, ',');
        if (c) *c = '\0';
        out[n++] = p;
        p = c ? c + 1 : NULL;
    }
    return n;
}

/* Storage for the "key=value" strings the rows point at. */
typedef struct text_pool {
    char **items;
    int count, cap;
} text_pool;

static const char *pool_add(text_pool *p, const char *key, const char *value) {
    if (p->count == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        char **items = realloc(p->items, (size_t)cap * sizeof *items);
        if (!items) return NULL;
        p->items = items;
        p->cap = cap;
    }
    size_t len = strlen(key) + strlen(value) + 2;
    char *s = malloc(len);
    if (!s) return NULL;
    snprintf(s, len, "%s=%s", key, value);
    p->items[p->count++] = s;
    return s;
}

static void pool_free(text_pool *p) {
    for (int i = 0; i < p->count; i++) free(p->items[i]);
    free(p->items);
}

static void label_append(char *label, size_t len, const char *sep, const char *text) {
    size_t used = strlen(label);
    if (used + 1 >= len) return;
    snprintf(label + used, len - used, "%s%s", used ? sep : "", text);
}

/* Every combination of the --vary lists. */
static int grid_rows(sweep *w, text_pool *pool, FILE *err) {
    char *keys[SWEEP_MAX_SETS], *values[SWEEP_MAX_SETS][SWEEP_MAX_ROWS];
    int counts[SWEEP_MAX_SETS];
    long total = 1;
    if (w->num_vary > SWEEP_MAX_SETS)
        return sweep_usage_error(err, "at most %s --vary options", "64");
    for (int v = 0; v < w->num_vary; v++) {
        char *eq = strchr(w->vary[v], '=');
        *eq = '\0';
        keys[v] = w->vary[v];
        counts[v] = split_commas(eq + 1, values[v], SWEEP_MAX_ROWS);
        total *= counts[v];
        if (total > SWEEP_MAX_ROWS)
            return sweep_usage_error(err, "more than %s combinations; vary fewer values", "256");
    }
    w->rows = calloc((size_t)total, sizeof *w->rows);
    if (!w->rows) return VH_EXIT_RUN_FAILED;
    w->num_rows = (int)total;
    for (long r = 0; r < total; r++) {
        sweep_row *row = &w->rows[r];
        long rest = r;
        int idx[SWEEP_MAX_SETS];
        for (int v = w->num_vary - 1; v >= 0; v--) { /* the last changes fastest */
            idx[v] = (int)(rest % counts[v]);
            rest /= counts[v];
        }
        for (int v = 0; v < w->num_vary; v++) {
            const char *set = pool_add(pool, keys[v], values[v][idx[v]]);
            if (!set) return VH_EXIT_RUN_FAILED;
            row->sets[row->num_sets++] = set;
            label_append(row->label, sizeof row->label, ", ", values[v][idx[v]]);
        }
    }
    return VH_EXIT_OK;
}

/* Row 0 the recipe, row i the changes of steps 1..i. */
static int sequence_rows(sweep *w, text_pool *pool, FILE *err) {
    w->rows = calloc((size_t)w->num_step + 1, sizeof *w->rows);
    if (!w->rows) return VH_EXIT_RUN_FAILED;
    w->num_rows = w->num_step + 1;
    snprintf(w->rows[0].label, sizeof w->rows[0].label, "%s",
             w->base_label ? w->base_label : "recipe");
    for (int i = 0; i < w->num_step; i++) {
        sweep_row *row = &w->rows[i + 1];
        *row = w->rows[i]; /* the previous row's changes, then this step's */
        row->label[0] = '\0';
        char *text = w->step[i], *label = NULL;
        char *colon = strchr(text, ':'), *eq = strchr(text, '=');
        if (colon && (!eq || colon < eq)) {
            *colon = '\0';
            label = text;
            text = colon + 1;
        }
        char *changes[SWEEP_MAX_SETS];
        int n = split_commas(text, changes, SWEEP_MAX_SETS);
        for (int c = 0; c < n; c++) {
            if (!valid_change(changes[c]))
                return sweep_usage_error(err,
                                         "--step needs [LABEL:]SECTION.KEY=VALUE[,...], not '%s'",
                                         changes[c]);
            if (row->num_sets >= SWEEP_MAX_SETS)
                return sweep_usage_error(err, "more than %s changes in one row", "64");
            char *e = strchr(changes[c], '=');
            *e = '\0';
            const char *set = pool_add(pool, changes[c], e + 1);
            *e = '=';
            if (!set) return VH_EXIT_RUN_FAILED;
            row->sets[row->num_sets++] = set;
            if (!label) label_append(row->label, sizeof row->label, ", ", changes[c]);
        }
        if (label) snprintf(row->label, sizeof row->label, "%s", label);
    }
    return VH_EXIT_OK;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- running a row -------------------------------------------------------- */

static char *self_exe(void) {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return strdup("vithost");
    buf[n] = '\0';
    return strdup(buf);
}

/* Runs argv with stdout captured (stderr passes through); returns the exit
 * status (127: could not start, 128+N: killed by signal N). */
static int run_child(char *const *argv, char **out_text) {
    *out_text = NULL;
    int fds[2];
    if (pipe(fds) != 0) return 127;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return 127;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "vithost sweep: cannot start '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && len + 1024 > cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
            } else {
                buf = bigger;
                cap *= 2;
            }
        }
        char sink[1024];
        ssize_t n = read(fds[0], buf ? buf + len : sink, buf ? cap - len - 1 : sizeof sink);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (buf) len += (size_t)n;
    }
    close(fds[0]);
    if (buf) buf[len] = '\0';
    *out_text = buf;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 127;
}

/* The last line of text that starts with '{', copied without its newline. */
static char *last_object(const char *text) {
    const char *best = NULL;
    for (const char *p = text; p && *p;) {
        if (*p == '{') best = p;
        p = strchr(p, '\n');
        if (p) p++;
    }
    if (!best) return NULL;
    size_t n = strcspn(best, "\n");
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, best, n);
    s[n] = '\0';
    return s;
}

static double number_or_nan(const char *json, const char *key) {
    double v = NAN;
    plot_json_number(json, key, &v);
    return v;
}

/* The numbers of a bench object; NAN for what it lacks. */
static void parse_numbers(const char *json, sweep_numbers *m) {
    m->img_per_s = number_or_nan(json, "img_per_s");
    m->step_ms = number_or_nan(json, "step_ms_median");
    m->tflops = number_or_nan(json, "tflops");
    m->mfu = number_or_nan(json, "mfu");
    m->peak_mem = number_or_nan(json, "peak_mem_bytes");
    const char *phases = strstr(json, "\"phase_ms\"");
    for (int p = 0; p < 5; p++)
        m->phase_ms[p] = phases ? number_or_nan(phases, phase_keys[p]) : NAN;
}

/* The child's command line for a row into argv (launcher: the copy of
 * $VITHOST_MPIRUN its words point into, freed by the caller); its length. */
static int row_argv(const sweep *w, const sweep_row *row, const char *exe, const char **argv,
                    char **launcher, char *np, char *steps, char *warmup) {
    int n = 0;
    *launcher = NULL;
    if (w->np > 0) {
        const char *env = getenv("VITHOST_MPIRUN");
        *launcher = strdup(env && env[0] ? env : "mpirun");
        for (char *tok = *launcher ? strtok(*launcher, " \t") : NULL; tok && n < 32;
             tok = strtok(NULL, " \t"))
            argv[n++] = tok;
        snprintf(np, 16, "%d", w->np);
        argv[n++] = "-np";
        argv[n++] = np;
        argv[n++] = "--oversubscribe"; /* ranks may outnumber cores on small machines */
        if (geteuid() == 0) argv[n++] = "--allow-run-as-root";
        if (getenv("OMP_NUM_THREADS")) {
            argv[n++] = "-x";
            argv[n++] = "OMP_NUM_THREADS";
        }
    }
    snprintf(steps, 32, "%lld", w->steps);
    snprintf(warmup, 32, "%lld", w->warmup);
    argv[n++] = exe;
    argv[n++] = "bench";
    argv[n++] = w->recipe;
    argv[n++] = "--json";
    argv[n++] = "--steps";
    argv[n++] = steps;
    argv[n++] = "--warmup";
    argv[n++] = warmup;
    for (int i = 0; i < w->num_common; i++) argv[n++] = "--set", argv[n++] = w->common[i];
    for (int i = 0; i < row->num_sets; i++) argv[n++] = "--set", argv[n++] = row->sets[i];
    argv[n] = NULL;
    return n;
}

/* Repeat k of row r: the run's number among all of them is k * rows + r,
 * so the rows take turns and a neighbour's load lands on each alike. */
static void run_repeat(sweep *w, int r, int k, const char *exe, FILE *out) {
    sweep_row *row = &w->rows[r];
    sweep_repeat *rep = &row->reps[k];
    const char *argv[64 + 4 * SWEEP_MAX_SETS + 8];
    char np[16], steps[32], warmup[32], *launcher;
    int n = row_argv(w, row, exe, argv, &launcher, np, steps, warmup);
    int at = k * w->num_rows + r + 1, total = w->num_rows * w->repeat;
    char name[340];
    if (w->repeat > 1)
        snprintf(name, sizeof name, "row %d, repeat %d of %d, %s", r, k + 1, w->repeat,
                 row->label);
    else snprintf(name, sizeof name, "%s", row->label);
    fprintf(out, "sweep: [%d/%d] %s:", at, total, name);
    for (int i = 0; i < n; i++) fprintf(out, " %s", argv[i]);
    fputc('\n', out);
    fflush(out);
    char *text = NULL;
    rep->exit_code = run_child((char *const *)argv, &text);
    free(launcher);
    rep->json = text && rep->exit_code == 0 ? last_object(text) : NULL;
    free(text);
    if (!rep->json) {
        if (rep->exit_code == 0) rep->exit_code = 1; /* ran, but printed no object */
        rep->m.img_per_s = NAN;
        fprintf(out, "sweep: [%d/%d] %s failed (exit %d); its messages are above\n", at, total,
                name, rep->exit_code);
        return;
    }
    parse_numbers(rep->json, &rep->m);
    fprintf(out, "sweep: [%d/%d] %s: %.1f img/s, %.2f ms/step\n", at, total, name,
            rep->m.img_per_s, rep->m.step_ms);
    fflush(out);
}

/* The median of the finite values among v[0..n) (reordered); NAN if none. */
static double median_of(double *v, int n) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) v[m++] = v[i];
    if (m == 0) return NAN;
    qsort(v, (size_t)m, sizeof *v, compare_double);
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

/* A row's numbers from the repeats that ran: each metric's median, the
 * min and max of img/s, its spread, and the object of the run nearest the
 * median (sweep.json's "result"). */
static void summarize_row(sweep *w, sweep_row *row) {
    double v[SWEEP_NUM_METRICS][64], *dst[SWEEP_NUM_METRICS] = {
        &row->img_per_s, &row->step_ms, &row->tflops, &row->mfu, &row->peak_mem,
        &row->phase_ms[0], &row->phase_ms[1], &row->phase_ms[2], &row->phase_ms[3],
        &row->phase_ms[4]};
    int n = 0;
    row->json = NULL;
    row->exit_code = 0;
    row->img_min = INFINITY;
    row->img_max = -INFINITY;
    for (int k = 0; k < w->repeat; k++) {
        const sweep_repeat *rep = &row->reps[k];
        if (!rep->json) {
            row->exit_code = rep->exit_code;
            continue;
        }
        const double *src[SWEEP_NUM_METRICS] = {
            &rep->m.img_per_s, &rep->m.step_ms, &rep->m.tflops, &rep->m.mfu,
            &rep->m.peak_mem, &rep->m.phase_ms[0], &rep->m.phase_ms[1], &rep->m.phase_ms[2],
            &rep->m.phase_ms[3], &rep->m.phase_ms[4]};
        for (int i = 0; i < SWEEP_NUM_METRICS; i++) v[i][n] = *src[i];
        if (rep->m.img_per_s < row->img_min) row->img_min = rep->m.img_per_s;
        if (rep->m.img_per_s > row->img_max) row->img_max = rep->m.img_per_s;
        n++;
    }
    row->num_ok = n;
    for (int i = 0; i < SWEEP_NUM_METRICS; i++) *dst[i] = median_of(v[i], n);
    if (!(row->img_min <= row->img_max)) row->img_min = row->img_max = NAN;
    row->spread = n >= 2 && row->img_per_s > 0
                      ? (row->img_max - row->img_min) / row->img_per_s
                      : NAN;
    double best = INFINITY;
    for (int k = 0; k < w->repeat; k++) {
        const sweep_repeat *rep = &row->reps[k];
        double off = fabs(rep->m.img_per_s - row->img_per_s);
        if (rep->json && (!row->json || off < best)) row->json = rep->json, best = off;
    }
}

/* ---- the files ------------------------------------------------------------ */

/* The row the others are compared against: row 0, or the first that ran
 * (its label and throughput go together on the chart); -1 when none ran. */
static int reference_row(const sweep *w) {
    for (int r = 0; r < w->num_rows; r++)
        if (isfinite(w->rows[r].img_per_s) && w->rows[r].img_per_s > 0) return r;
    return -1;
}

static double reference_img_s(const sweep *w) {
    int r = reference_row(w);
    return r < 0 ? NAN : w->rows[r].img_per_s;
}

static void md_cell(FILE *f, double v, const char *fmt) {
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs(" - |", f);
}

/* The spread cell of row r: "4%", in bold past SWEEP_SPREAD_WARN, and the
 * repeats that failed. */
static void md_spread(FILE *f, const sweep *w, const sweep_row *row) {
    if (!isfinite(row->spread)) fputs(" -", f);
    else if (row->spread > SWEEP_SPREAD_WARN)
        fprintf(f, " **%.0f%%, over %.0f%%**", 100.0 * row->spread, 100.0 * SWEEP_SPREAD_WARN);
    else fprintf(f, " %.0f%%", 100.0 * row->spread);
    if (row->num_ok < w->repeat)
        fprintf(f, "; %d of %d runs failed (exit %d)", w->repeat - row->num_ok, w->repeat,
                row->exit_code);
    fputs(" |", f);
}

static void md_row(FILE *f, const sweep *w, int r, double ref) {
    const sweep_row *row = &w->rows[r];
    fprintf(f, "| %d | %s | ", r, row->label);
    int first = 1;
    for (int i = w->sequence ? w->rows[r > 0 ? r - 1 : 0].num_sets : 0; i < row->num_sets;
         i++, first = 0)
        fprintf(f, "%s`%s`", first ? "" : " ", row->sets[i]);
    if (first) fputs(w->sequence ? "(the recipe)" : "", f);
    fputs(" |", f);
    if (!row->json) { /* the cells after img/s stay empty */
        int cells = 10 + (w->sequence != 0) + (w->repeat > 1 ? 2 : 0);
        fprintf(f, " failed (exit %d) |", row->exit_code);
        for (int c = 0; c < cells; c++) fputs(" |", f);
        fputc('\n', f);
        return;
    }
    md_cell(f, row->img_per_s, " %.1f |");
    if (w->repeat > 1) {
        if (isfinite(row->img_min) && isfinite(row->img_max))
            fprintf(f, " %.1f-%.1f |", row->img_min, row->img_max);
        else fputs(" - |", f);
        md_spread(f, w, row);
    }
    md_cell(f, row->img_per_s / ref, " %.2fx |");
    if (w->sequence) {
        double prev = r > 0 ? w->rows[r - 1].img_per_s : NAN;
        md_cell(f, r > 0 ? row->img_per_s / prev : NAN, " %.2fx |");
    }
    md_cell(f, row->step_ms, " %.1f |");
    md_cell(f, row->tflops, " %.3g |");
    md_cell(f, 100.0 * row->mfu, " %.1f%% |");
    md_cell(f, row->peak_mem / 1048576.0, " %.0f |");
    for (int p = 0; p < 5; p++) md_cell(f, row->phase_ms[p], " %.1f |");
    fputc('\n', f);
}

/* Under the table: the rows whose repeats disagree by more than
 * SWEEP_SPREAD_WARN, so no one reads a ratio off a busy machine. */
static void md_warnings(FILE *f, const sweep *w) {
    int noisy = 0;
    for (int r = 0; r < w->num_rows; r++) {
        const sweep_row *row = &w->rows[r];
        if (!(row->spread > SWEEP_SPREAD_WARN)) continue;
        if (!noisy++) fputc('\n', f);
        fprintf(f, "- **Warning:** row %d (%s) varied by %.0f%% over its %d runs (%.1f-%.1f "
                   "img/s, more than %.0f%%): the machine was not quiet; compare its medians "
                   "with care, or sweep again with more --repeat.\n",
                r, row->label, 100.0 * row->spread, row->num_ok, row->img_min, row->img_max,
                100.0 * SWEEP_SPREAD_WARN);
    }
}

static int write_markdown(const sweep *w, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    double ref = reference_img_s(w);
    int ref_row = reference_row(w);
    char relative[64], runs[160] = "";
    if (ref_row < 0) snprintf(relative, sizeof relative, "none (every row failed)");
    else if (ref_row == 0) snprintf(relative, sizeof relative, "to row 0");
    else snprintf(relative, sizeof relative, "to row %d (row 0 failed)", ref_row);
    if (w->repeat > 1)
        snprintf(runs, sizeof runs, "; each row ran %d times, the rows taking turns: img/s and "
                                    "the other numbers are the medians, spread is (max - min) "
                                    "/ median of img/s",
                 w->repeat);
    fprintf(f, "# %s\n\n", w->title);
    fprintf(f, "Made by `%s`; each row is `vithost bench --json` (%lld timed steps after %lld "
               "warm-up%s)%s. img/s is the whole job's; relative: %s%s.\n\n",
            w->command ? w->command : "vithost sweep", w->steps, w->warmup,
            w->np > 0 ? ", under mpirun" : "", runs, relative,
            w->sequence ? "; vs previous: to the row above (what the step bought)" : "");
    fprintf(f, "| # | configuration | changes | img/s |%s relative |%s ms/step | TFLOP/s/device "
               "| MFU | peak mem MiB | data ms | fwd ms | bwd ms | comm wait ms | optim ms |\n",
            w->repeat > 1 ? " min-max | spread |" : "", w->sequence ? " vs previous |" : "");
    fprintf(f, "|---|---|---|---|---|%s%s---|---|---|---|---|---|---|---|---|\n",
            w->repeat > 1 ? "---|---|" : "", w->sequence ? "---|" : "");
    for (int r = 0; r < w->num_rows; r++) md_row(f, w, r, ref);
    md_warnings(f, w);
    int bad = ferror(f); /* a full disk: fprintf failed, fclose may not say so */
    return fclose(f) != 0 || bad ? -1 : 0;
}

static void json_escaped(FILE *f, const char *s) {
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        fputc(*p, f);
    }
}

static void json_num(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, "\"%s\": %.6g", key, v);
    else fprintf(f, "\"%s\": null", key);
}

/* Of --repeat N > 1: img/s's median, min, max and spread, and every run's
 * exit and object, in the order they ran. */
static void json_repeats(FILE *f, const sweep *w, const sweep_row *row) {
    fputs(", \"img_per_s\": {", f);
    json_num(f, "median", row->img_per_s);
    fputs(", ", f);
    json_num(f, "min", row->img_min);
    fputs(", ", f);
    json_num(f, "max", row->img_max);
    fputs(", ", f);
    json_num(f, "spread", row->spread);
    fprintf(f, ", \"runs\": %d, \"failed\": %d}, \"repeats\": [", row->num_ok,
            w->repeat - row->num_ok);
    for (int k = 0; k < w->repeat; k++)
        fprintf(f, "%s\n    {\"exit\": %d, \"result\": %s}", k ? "," : "", row->reps[k].exit_code,
                row->reps[k].json ? row->reps[k].json : "null");
    fputs("]", f);
}

static int write_json(const sweep *w, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs("{\"command\": \"", f);
    json_escaped(f, w->command ? w->command : "");
    fprintf(f, "\", \"mode\": \"%s\", ", w->sequence ? "sequence" : "grid");
    if (w->repeat > 1) fprintf(f, "\"repeat\": %d, ", w->repeat);
    fputs("\"rows\": [\n", f);
    for (int r = 0; r < w->num_rows; r++) {
        const sweep_row *row = &w->rows[r];
        fputs("  {\"label\": \"", f);
        json_escaped(f, row->label);
        fputs("\", \"sets\": [", f);
        for (int i = 0; i < row->num_sets; i++) {
            fprintf(f, "%s\"", i ? ", " : "");
            json_escaped(f, row->sets[i]);
            fputc('"', f);
        }
        /* result: of several runs, the one nearest the median img/s */
        fprintf(f, "], \"exit\": %d, \"result\": %s", row->exit_code,
                row->json ? row->json : "null");
        if (w->repeat > 1) json_repeats(f, w, row);
        fprintf(f, "}%s\n", r + 1 < w->num_rows ? "," : "");
    }
    fputs("]}\n", f);
    int bad = ferror(f);
    return fclose(f) != 0 || bad ? -1 : 0;
}

/* Row r's bar at cx (the reference row grey), its value on top; a row
 * without a throughput gets an empty bar and says why. */
static void draw_bar(FILE *f, const sweep *w, int r, double cx, double base, double plot_h,
                     double top) {
    const double bar_w = 50;
    double rel = w->rows[r].img_per_s / reference_img_s(w);
    if (isfinite(rel)) {
        double h = plot_h * rel / top;
        fprintf(f, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"%s\"/>\n",
                cx - bar_w / 2, base - h, bar_w, h,
                r == reference_row(w) ? "#7f7f7f" : svg_color(0));
        double label_y = base - h;
        if (w->rows[r].num_ok >= 2) { /* min-max of the repeats, with caps */
            double ref = reference_img_s(w);
            double y_lo = base - plot_h * (w->rows[r].img_min / ref) / top;
            double y_hi = base - plot_h * (w->rows[r].img_max / ref) / top;
            fprintf(f, "<path class=\"whisker\" d=\"M%.1f %.1fV%.1fM%.1f %.1fH%.1fM%.1f "
                       "%.1fH%.1f\" stroke=\"#222222\" stroke-width=\"1.5\" fill=\"none\"/>\n",
                    cx, y_lo, y_hi, cx - 8, y_lo, cx + 8, cx - 8, y_hi, cx + 8);
            if (y_hi < label_y) label_y = y_hi;
        }
        svg_text(f, cx, label_y - 6, "middle", 12, "font-weight=\"bold\"", "%.2fx", rel);
    } else {
        fprintf(f, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"0\" "
                   "fill=\"none\"/>\n",
                cx - bar_w / 2, base, bar_w);
        svg_text(f, cx, base - 6, "middle", 11, "fill=\"#d62728\"", "%s",
                 w->rows[r].json ? "no img/s" : "failed");
    }
}

/* Bars of throughput relative to the reference row (row 0, or the first
 * that ran), one per row, the value on top and the label below (turned,
 * so long labels fit). */
static int write_svg(const sweep *w, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    double ref = reference_img_s(w), top = 1.0;
    for (int r = 0; r < w->num_rows; r++) {
        double rel = fmax(w->rows[r].img_per_s, w->rows[r].img_max) / ref;
        if (isfinite(rel) && rel > top) top = rel;
    }
    double tick = svg_tick_step(top * 1.1, 5);
    top = ceil(top * 1.1 / tick) * tick;
    int ref_row = reference_row(w);
    char sub[1024];
    if (ref_row < 0)
        snprintf(sub, sizeof sub, "every row failed: no throughput to compare (see the "
                                  "sweep's messages)");
    else
        snprintf(sub, sizeof sub, "%s relative to \"%s\" (%.1f img/s)%s%s",
                 w->repeat > 1 ? "median throughput" : "throughput", w->rows[ref_row].label, ref,
                 ref_row > 0 ? "; row 0 failed" : "",
                 w->repeat > 1 ? "; whiskers: min-max of the runs" : "");
    /* room for the turned labels below (sin 35 deg of their length) and the title */
    size_t longest = 0;
    for (int r = 0; r < w->num_rows; r++)
        if (strlen(w->rows[r].label) > longest) longest = strlen(w->rows[r].label);
    const double left = 70, right = 30, top_margin = 60, plot_h = 300;
    const double label_h = 40 + 0.58 * 6.5 * (double)(longest + 2);
    const double slot = 80;
    double width = left + right + slot * w->num_rows;
    width = fmax(width, 420);
    width = fmax(width, 9.0 * (double)strlen(w->title) + 40);
    width = fmax(width, 6.5 * (double)strlen(sub) + 40);
    double height = top_margin + plot_h + label_h, base = top_margin + plot_h;
    svg_begin(f, width, height);
    svg_text(f, width / 2, 26, "middle", 16, "font-weight=\"bold\"", "%s", w->title);
    svg_text(f, width / 2, 46, "middle", 12,
             ref_row < 0 ? "fill=\"#d62728\"" : "fill=\"#555555\"", "%s", sub);
    for (double y = 0; y <= top + 1e-9; y += tick) {
        double py = base - plot_h * y / top;
        svg_line(f, left, py, width - right, py, "#e5e5e5", 1);
        svg_text(f, left - 8, py + 4, "end", 11, NULL, "%.2gx", y);
    }
    double one = base - plot_h / top; /* the baseline, dashed */
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888888\" "
               "stroke-dasharray=\"4 3\"/>\n",
            left, one, width - right, one);
    svg_line(f, left, top_margin, left, base, "#333333", 1);
    svg_line(f, left, base, width - right, base, "#333333", 1);
    for (int r = 0; r < w->num_rows; r++) {
        double cx = left + slot * (r + 0.5);
        draw_bar(f, w, r, cx, base, plot_h, top);
        char turn[96];
        snprintf(turn, sizeof turn, "transform=\"rotate(-35 %.1f %.1f)\"", cx + 4, base + 16);
        svg_text(f, cx + 4, base + 16, "end", 11, turn, "%s%s", w->sequence && r > 0 ? "+ " : "",
                 w->rows[r].label);
    }
    svg_end(f);
    int bad = ferror(f);
    return fclose(f) != 0 || bad ? -1 : 0;
}

/* ---- the command line ------------------------------------------------------- */

/* The sweep's own command, each argument quoted for a shell when needed. */
static char *command_text(int argc, char **argv) {
    size_t len = 16;
    for (int i = 1; i < argc; i++) len += 4 * strlen(argv[i]) + 3;
    char *s = malloc(len), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "vithost");
    for (int i = 1; i < argc; i++) {
        int plain = strspn(argv[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                    "0123456789-_.,=/:+@%") == strlen(argv[i]) && argv[i][0];
        *p++ = ' ';
        if (plain) {
            p += sprintf(p, "%s", argv[i]);
            continue;
        }
        *p++ = '\'';
        for (const char *c = argv[i]; *c; c++) {
            if (*c == '\'') p += sprintf(p, "'\\''");
            else *p++ = *c;
        }
        *p++ = '\'';
    }
    *p = '\0';
    return s;
}

static int mkdir_p(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(path, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static int parse_args(sweep *w, int argc, char **argv, FILE *out, FILE *err) {
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        char *value = NULL;
        char name[32];
        snprintf(name, sizeof name, "%s", arg);
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof name) {
            name[eq - arg] = '\0';
            value = (char *)eq + 1;
        }
        static const char *const valued[] = {"--vary", "--step",  "--set",  "--steps",
                                             "--warmup", "--np", "--out", "--title",
                                             "--base", "--repeat"};
        int takes = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            takes |= strcmp(name, valued[k]) == 0;
        if (takes && !value) {
            if (i + 1 >= argc) return sweep_usage_error(err, "%s needs a value", name);
            value = argv[++i];
        }
        char *end = NULL;
        if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
            fputs(sweep_usage, out);
            return -1;
        } else if (!strcmp(name, "--vary")) {
            if (!valid_change(value))
                return sweep_usage_error(err, "--vary needs SECTION.KEY=V1,V2,..., not '%s'",
                                         value);
            w->vary[w->num_vary++] = value;
        } else if (!strcmp(name, "--step")) {
            w->step[w->num_step++] = value;
        } else if (!strcmp(name, "--set")) {
            w->common[w->num_common++] = value;
        } else if (!strcmp(name, "--steps") || !strcmp(name, "--warmup") ||
                   !strcmp(name, "--np") || !strcmp(name, "--repeat")) {
            long long v = strtoll(value, &end, 10);
            long long min = strcmp(name, "--warmup") == 0 ? 0 : 1;
            long long max = strcmp(name, "--repeat") == 0 ? 64 : 1000000;
            if (end == value || *end || v < min || v > max)
                return sweep_usage_error(err, "a whole number is needed, not '%s'", value);
            if (!strcmp(name, "--steps")) w->steps = v;
            else if (!strcmp(name, "--warmup")) w->warmup = v;
            else if (!strcmp(name, "--repeat")) w->repeat = (int)v;
            else w->np = (int)v;
        } else if (!strcmp(name, "--out")) {
            w->out_dir = value;
        } else if (!strcmp(name, "--title")) {
            w->title = value;
        } else if (!strcmp(name, "--base")) {
            w->base_label = value;
        } else if (!strcmp(arg, "--sequence")) {
            w->sequence = 1;
        } else if (arg[0] == '-') {
            return sweep_usage_error(err, "unknown option '%s'", arg);
        } else if (!w->recipe) {
            w->recipe = arg;
        } else {
            return sweep_usage_error(err, "unexpected argument '%s'", arg);
        }
    }
    if (!w->recipe) return sweep_usage_error(err, "%s", "needs a RECIPE file");
    if (w->sequence && w->num_vary)
        return sweep_usage_error(err, "%s", "--sequence takes --step options, not --vary");
    if (!w->sequence && w->num_step)
        return sweep_usage_error(err, "%s", "--step belongs to --sequence (a cumulative ablation)");
    if (w->sequence ? !w->num_step : !w->num_vary)
        return sweep_usage_error(err, "%s",
                                 w->sequence ? "--sequence needs at least one --step"
                                             : "needs at least one --vary (or --sequence)");
    if (w->num_step + 1 > SWEEP_MAX_ROWS)
        return sweep_usage_error(err, "at most %s steps", "255");
    return VH_EXIT_OK;
}

/* ---- the output folder ---------------------------------------------------- */

static const char *const out_names[3] = {"sweep.md", "sweep.svg", "sweep.json"};

/* What an earlier sweep wrote into each file (outputs.h): a file without
 * it is the user's, and is not replaced. */
static int is_sweep_md(const char *head, size_t n) {
    (void)n;
    return head[0] == '#' && strstr(head, "\nMade by `vithost ") != NULL;
}

static int is_sweep_json(const char *head, size_t n) {
    (void)n;
    return strncmp(head, "{\"command\": \"vithost", 20) == 0;
}

/* --out checked and created before the first row runs: a folder (not a
 * file), its three files absent, empty or an earlier sweep's (never the
 * recipe), and writable. An exit code. */
static int prepare_out(const sweep *w, FILE *err) {
    static const output_is_ours ours[3] = {is_sweep_md, output_is_vithost_svg, is_sweep_json};
    static const char *const what[3] = {"a table", "an SVG", "a JSON file"};
    char msg[9000], path[4200];
    if (output_dir_check(w->out_dir, msg, sizeof msg) != 0) {
        fprintf(err, "vithost sweep: --out %s\n", msg);
        return VH_EXIT_USAGE;
    }
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", w->out_dir, out_names[k]);
        if (output_file_check(path, &w->recipe, 1, ours[k], what[k], msg, sizeof msg) != 0) {
            fprintf(err, "vithost sweep: --out: %s\n", msg);
            return VH_EXIT_USAGE;
        }
    }
    if (mkdir_p(w->out_dir) != 0 || access(w->out_dir, W_OK | X_OK) != 0) {
        fprintf(err, "vithost sweep: cannot create or write in the folder %s: %s (give another "
                     "--out)\n",
                w->out_dir, strerror(errno));
        return VH_EXIT_RUN_FAILED;
    }
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", w->out_dir, out_names[k]);
        if (access(path, F_OK) == 0 && access(path, W_OK) != 0) {
            fprintf(err, "vithost sweep: cannot write %s: %s (give another --out)\n", path,
                    strerror(errno));
            return VH_EXIT_RUN_FAILED;
        }
    }
    return VH_EXIT_OK;
}

/* Of several runs a row: its median, min-max and spread, a warning past
 * SWEEP_SPREAD_WARN. */
static void print_summary(const sweep *w, FILE *out) {
    for (int r = 0; r < w->num_rows && w->repeat > 1; r++) {
        const sweep_row *row = &w->rows[r];
        if (!row->json) continue;
        fprintf(out, "sweep: row %d, %s: median %.1f img/s of %d run(s), min %.1f, max %.1f",
                r, row->label, row->img_per_s, row->num_ok, row->img_min, row->img_max);
        if (isfinite(row->spread)) fprintf(out, ", spread %.0f%%", 100.0 * row->spread);
        fputc('\n', out);
        if (row->spread > SWEEP_SPREAD_WARN)
            fprintf(out, "sweep: warning: row %d (%s) varied by %.0f%% over its runs (more "
                         "than %.0f%%): the machine was not quiet\n",
                    r, row->label, 100.0 * row->spread, 100.0 * SWEEP_SPREAD_WARN);
    }
}

/* Runs every row --repeat times, the rows taking turns, writes the three
 * files; an exit code. */
static int run_rows(sweep *w, FILE *out, FILE *err) {
    char *exe = self_exe();
    int failed = 0, failed_runs = 0, code = VH_EXIT_OK;
    for (int r = 0; r < w->num_rows; r++) {
        w->rows[r].reps = calloc((size_t)w->repeat, sizeof *w->rows[r].reps);
        if (!w->rows[r].reps) {
            free(exe);
            return VH_EXIT_RUN_FAILED;
        }
    }
    for (int k = 0; k < w->repeat; k++)
        for (int r = 0; r < w->num_rows; r++) run_repeat(w, r, k, exe, out);
    free(exe);
    for (int r = 0; r < w->num_rows; r++) {
        summarize_row(w, &w->rows[r]);
        failed += w->rows[r].json == NULL;
        failed_runs += w->repeat - w->rows[r].num_ok;
    }
    print_summary(w, out);
    char path[4200];
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", w->out_dir, out_names[k]);
        int rc = k == 0 ? write_markdown(w, path) : k == 1 ? write_svg(w, path)
                                                            : write_json(w, path);
        if (rc != 0) {
            fprintf(err, "vithost sweep: cannot write %s: %s\n", path, strerror(errno));
            code = VH_EXIT_RUN_FAILED;
        }
    }
    char times[32] = "";
    if (w->repeat > 1) snprintf(times, sizeof times, " x %d runs", w->repeat);
    fprintf(out, "sweep: %d row(s)%s%s; wrote %s/sweep.md, sweep.svg, sweep.json\n", w->num_rows,
            times, failed || failed_runs ? " (some failed)" : "", w->out_dir);
    if (failed) {
        fprintf(err, "vithost sweep: %d of %d rows failed (see their messages above)\n", failed,
                w->num_rows);
        code = VH_EXIT_RUN_FAILED;
    } else if (failed_runs) { /* every row has numbers, but fewer than asked */
        fprintf(err, "vithost sweep: %d of %d runs failed (see their messages above); their "
                     "rows' medians are of the runs that finished\n",
                failed_runs, w->num_rows * w->repeat);
        code = VH_EXIT_RUN_FAILED;
    }
    return code;
}

int sweep_main(int argc, char **argv, FILE *out, FILE *err) {
    sweep w;
    memset(&w, 0, sizeof w);
    w.steps = 20;
    w.warmup = 3;
    w.repeat = 3;
    w.vary = calloc((size_t)argc, sizeof *w.vary);
    w.step = calloc((size_t)argc, sizeof *w.step);
    w.common = calloc((size_t)argc, sizeof *w.common);
    text_pool pool = {0};
    w.command = command_text(argc, argv); /* before parsing cuts the arguments up */
    int code = w.vary && w.step && w.common ? parse_args(&w, argc, argv, out, err)
                                            : VH_EXIT_RUN_FAILED;
    if (code == -1) code = VH_EXIT_OK, w.num_rows = -1; /* --help */
    char default_out[4096];
    if (code == VH_EXIT_OK && w.num_rows == 0) {
        if (run_launcher_world_size() > 1) {
            fprintf(err, "vithost sweep: started under a launcher of %d processes; run the "
                         "sweep as one process and give --np N: it starts each row under "
                         "mpirun -np N itself\n",
                    (int)run_launcher_world_size());
            code = VH_EXIT_USAGE;
        }
    }
    if (code == VH_EXIT_OK && w.num_rows == 0) {
        const char *base = strrchr(w.recipe, '/');
        base = base ? base + 1 : w.recipe;
        size_t stem = strcspn(base, ".");
        if (!w.out_dir) {
            snprintf(default_out, sizeof default_out, "runs/sweep-%.*s", (int)stem, base);
            w.out_dir = default_out;
        }
        if (!w.title) w.title = w.sequence ? "Cumulative ablation" : "Sweep";
        code = w.sequence ? sequence_rows(&w, &pool, err) : grid_rows(&w, &pool, err);
    }
    if (code == VH_EXIT_OK && w.num_rows > 0) code = prepare_out(&w, err);
    if (code == VH_EXIT_OK && w.num_rows > 0) code = run_rows(&w, out, err);
    for (int r = 0; r < w.num_rows; r++) {
        for (int k = 0; w.rows[r].reps && k < w.repeat; k++) free(w.rows[r].reps[k].json);
        free(w.rows[r].reps);
    }
    free(w.rows);
    free(w.command);
    pool_free(&pool);
    free(w.vary);
    free(w.step);
    free(w.common);
    return code;
}
