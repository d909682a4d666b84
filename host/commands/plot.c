/* plot.c - `vithost plot` (see plot.h). */
#define _POSIX_C_SOURCE 200809L
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "outputs.h"
#include "svg.h"

int plot_json_number(const char *json, const char *key, double *out) {
    size_t n = strlen(key);
    for (const char *p = strchr(json, '"'); p; p = strchr(p + 1, '"')) {
        if (strncmp(p + 1, key, n) != 0 || p[n + 1] != '"') continue;
        const char *q = p + n + 2;
        while (*q == ' ') q++;
        if (*q != ':') continue;
        q++;
        char *end;
        double v = strtod(q, &end);
        if (end == q || !isfinite(v)) return 0;
        *out = v;
        return 1;
    }
    return 0;
}

enum { PANEL_LOSS, PANEL_TOP1, PANEL_IMG_S, PANEL_COUNT };

static const char *const panel_titles[PANEL_COUNT] = {"training loss", "eval top-1 (%)",
                                                      "throughput (img/s)"};

typedef struct series {
    double *x, *y;
    int n, cap;
} series;

typedef struct plot_run {
    char name[256];
    series s[PANEL_COUNT];
} plot_run;

/* Beyond this a value is drawn at the edge: the spans, ticks and coordinates
 * of a panel then stay finite (1e308 - -1e308 is not). */
#define PLOT_LIMIT 1e300

static double clamp(double v) {
    return v > PLOT_LIMIT ? PLOT_LIMIT : v < -PLOT_LIMIT ? -PLOT_LIMIT : v;
}

static int series_add(series *s, double x, double y) {
    x = clamp(x);
    y = clamp(y);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx) return -1;
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny) return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

/* The folder's own name: "runs/fm-ddp/" -> "fm-ddp". */
static void run_name(const char *dir, char *out, size_t len) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    const char *base = strrchr(buf, '/');
    snprintf(out, len, "%s", base && base[1] ? base + 1 : buf);
}

static int read_run(plot_run *r, const char *dir, FILE *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(err, "vithost plot: cannot read %s: %s (give run folders that `vithost run "
                     "--out DIR` wrote)\n",
                path, strerror(errno));
        return -1;
    }
    run_name(dir, r->name, sizeof r->name);
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, bad = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        double step, v;
        if (!plot_json_number(line, "step", &step)) {
            if (line[strspn(line, " \t\r\n")] && !bad++)
                fprintf(err, "vithost plot: %s:%d: a line without \"step\"; skipped\n", path,
                        lineno);
            continue;
        }
        int ok = 0;
        if (plot_json_number(line, "loss", &v)) ok |= series_add(&r->s[PANEL_LOSS], step, v);
        if (plot_json_number(line, "eval_top1", &v))
            ok |= series_add(&r->s[PANEL_TOP1], step, 100.0 * v);
        if (plot_json_number(line, "img_per_s", &v))
            ok |= series_add(&r->s[PANEL_IMG_S], step, v);
        if (ok) {
            free(line);
            fclose(f);
            fprintf(err, "vithost plot: out of memory reading %s\n", path);
            return -1;
        }
    }
    free(line);
    fclose(f);
    if (r->s[PANEL_LOSS].n + r->s[PANEL_TOP1].n + r->s[PANEL_IMG_S].n == 0) {
        fprintf(err, "vithost plot: %s has no finite loss, eval_top1 or img_per_s in its %d "
                     "line(s); nothing to plot, nothing was written (has the run logged a "
                     "step yet? did every step give NaN?)\n",
                path, lineno);
        return -1;
    }
    return 0;
}

static void axis_range(const plot_run *runs, int n, int panel, int want_x, double *lo,
                       double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int r = 0; r < n; r++) {
        const series *s = &runs[r].s[panel];
        for (int i = 0; i < s->n; i++) {
            double v = want_x ? s->x[i] : s->y[i];
            if (v < *lo) *lo = v;
            if (v > *hi) *hi = v;
        }
    }
    if (!(*lo <= *hi)) *lo = 0, *hi = 1; /* no points */
    if (!want_x && panel == PANEL_IMG_S && *lo > 0) *lo = 0; /* img/s from zero */
    if (!want_x && panel == PANEL_TOP1) {
        /* The data's range and a margin, within 0-100: runs at 85-89% drawn
         * from 0 all look flat. At least 1 point each side, so one value or a
         * flat run still gets a readable scale. */
        double margin = fmax(0.05 * (*hi - *lo), 1.0);
        *lo = fmax(*lo - margin, fmin(*lo, 0.0));
        *hi = fmin(*hi + margin, fmax(*hi, 100.0));
    }
    /* a span the doubles cannot split into ticks is drawn as a flat line */
    double mag = fmax(fabs(*lo), fabs(*hi));
    if (*hi - *lo < fmax(1e-12, 1e-9 * mag)) *hi = *lo + (mag > 0 ? mag * 0.1 : 1.0);
}

/* The number of ticks from lo to hi by step (counted, not accumulated:
 * adding a step to a large value may not change it). */
static int tick_count(double lo, double hi, double step) {
    double n = floor((hi - lo) / step + 1e-6);
    return n < 0 ? -1 : n > 50 ? 50 : (int)n; /* -1: none */
}

/* v as a tick's label; step, the ticks' spacing, sets the decimals so
 * that 86.5 and 87 stay apart. */
static void tick_label(char *buf, size_t len, double v, double step) {
    double a = fabs(v);
    int decimals = step > 0 && step < 1 ? (int)ceil(-log10(step) - 1e-9) : 0;
    if (a >= 1e7) snprintf(buf, len, "%.3g", v);
    else if (a >= 1e4) snprintf(buf, len, "%.0fk", v / 1e3);
    else if (a >= 10 || a == 0) snprintf(buf, len, "%.*f", decimals > 6 ? 6 : decimals, v);
    else snprintf(buf, len, "%.3g", v);
}

static void draw_panel(FILE *f, const plot_run *runs, int n, int panel, double x0, double y0,
                       double w, double h) {
    double xlo, xhi, ylo, yhi;
    axis_range(runs, n, panel, 1, &xlo, &xhi);
    axis_range(runs, n, panel, 0, &ylo, &yhi);
    double ystep = svg_tick_step(yhi - ylo, 5), xstep = svg_tick_step(xhi - xlo, 5);
    ylo = floor(ylo / ystep) * ystep;
    yhi = ceil(yhi / ystep) * ystep;
    svg_text(f, x0 + w / 2, y0 - 10, "middle", 13, "font-weight=\"bold\"", "%s",
             panel_titles[panel]);
    char buf[32];
    for (int k = 0, nk = tick_count(ylo, yhi, ystep); k <= nk; k++) {
        double y = ylo + k * ystep;
        double py = y0 + h - h * (y - ylo) / (yhi - ylo);
        svg_line(f, x0, py, x0 + w, py, "#eeeeee", 1);
        tick_label(buf, sizeof buf, y, ystep);
        svg_text(f, x0 - 6, py + 4, "end", 10, NULL, "%s", buf);
    }
    double x1 = ceil(xlo / xstep) * xstep;
    for (int k = 0, nk = tick_count(x1, xhi, xstep); k <= nk; k++) {
        double x = x1 + k * xstep;
        double px = x0 + w * (x - xlo) / (xhi - xlo);
        svg_line(f, px, y0 + h, px, y0 + h + 4, "#333333", 1);
        tick_label(buf, sizeof buf, x, xstep);
        svg_text(f, px, y0 + h + 16, "middle", 10, NULL, "%s", buf);
    }
    svg_text(f, x0 + w / 2, y0 + h + 32, "middle", 11, "fill=\"#555555\"", "step");
    svg_rect(f, x0, y0, w, h, "none", "#333333");
    for (int r = 0; r < n; r++) {
        const series *s = &runs[r].s[panel];
        if (s->n == 0) continue;
        double *px = malloc((size_t)s->n * sizeof *px), *py = malloc((size_t)s->n * sizeof *py);
        if (!px || !py) {
            free(px);
            free(py);
            continue;
        }
        for (int i = 0; i < s->n; i++) {
            px[i] = x0 + w * (s->x[i] - xlo) / (xhi - xlo);
            py[i] = y0 + h - h * (s->y[i] - ylo) / (yhi - ylo);
        }
        svg_polyline(f, px, py, s->n, svg_color(r), s->n == 1 ? 5 : 1.6);
        free(px);
        free(py);
    }
}

static int write_plot(const char *path, const char *title, const plot_run *runs, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const double pw = 320, ph = 230, left = 60, gap = 70, top = 70;
    double width = left + PANEL_COUNT * pw + (PANEL_COUNT - 1) * gap + 30;
    double legend_y = top + ph + 60;
    double height = legend_y + 22 * ((n + 2) / 3) + 10;
    svg_begin(f, width, height);
    svg_text(f, width / 2, 28, "middle", 16, "font-weight=\"bold\"", "%s", title);
    for (int p = 0; p < PANEL_COUNT; p++)
        draw_panel(f, runs, n, p, left + p * (pw + gap), top, pw, ph);
    for (int r = 0; r < n; r++) { /* legend: three names a row */
        double lx = left + (r % 3) * (pw + gap), ly = legend_y + 22 * (r / 3);
        svg_line(f, lx, ly - 4, lx + 28, ly - 4, svg_color(r), 3);
        svg_text(f, lx + 36, ly, "start", 12, NULL, "%s", runs[r].name);
    }
    svg_end(f);
    int bad = ferror(f); /* a full disk: fprintf failed, fclose may not say so */
    return fclose(f) != 0 || bad ? -1 : 0;
}

static const char plot_usage[] =
    "usage: vithost plot RUN_DIR... -o FILE.svg [--title TEXT]\n"
    "  draws the training loss, eval top-1 and img/s of each run folder's metrics.jsonl\n"
    "  against the step, overlaid in three panels, with the folders' names as legend.\n";

/* The command line: the folders into dirs (n of them), -o and --title;
 * -1 for --help, else an exit code. */
static int parse_args(int argc, char **argv, const char **dirs, int *n, const char **path,
                      const char **title, FILE *out, FILE *err) {
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(plot_usage, out);
            return -1;
        }
        if (!strcmp(a, "-o") || !strcmp(a, "--out") || !strcmp(a, "--title")) {
            if (i + 1 >= argc) {
                fprintf(err, "vithost plot: %s needs a value\n%s", a, plot_usage);
                return VH_EXIT_USAGE;
            }
            if (!strcmp(a, "--title")) *title = argv[++i];
            else *path = argv[++i];
        } else if (!strncmp(a, "--out=", 6)) {
            *path = a + 6;
        } else if (a[0] == '-') {
            fprintf(err, "vithost plot: unknown option '%s'\n%s", a, plot_usage);
            return VH_EXIT_USAGE;
        } else {
            dirs[(*n)++] = a;
        }
    }
    if (!*path || *n == 0) {
        fprintf(err, "vithost plot: needs %s\n%s", *n ? "-o FILE.svg" : "at least one RUN_DIR",
                plot_usage);
        return VH_EXIT_USAGE;
    }
    return VH_EXIT_OK;
}

/* -o may not name a run's metrics.jsonl (the input) nor a file that is not
 * an SVG of vithost's: refused before anything is read. */
static int check_target(const char *path, const char **dirs, int n, FILE *err) {
    char (*inputs)[4200] = calloc((size_t)n, sizeof *inputs);
    const char **names = calloc((size_t)n, sizeof *names);
    int code = inputs && names ? VH_EXIT_OK : VH_EXIT_RUN_FAILED;
    for (int i = 0; i < n && code == VH_EXIT_OK; i++) {
        snprintf(inputs[i], sizeof inputs[i], "%s/metrics.jsonl", dirs[i]);
        names[i] = inputs[i];
    }
    char msg[9000];
    if (code == VH_EXIT_OK &&
        output_file_check(path, names, n, output_is_vithost_svg, "an SVG", msg, sizeof msg)) {
        fprintf(err, "vithost plot: -o %s\n", msg);
        code = VH_EXIT_USAGE;
    }
    free(inputs);
    free(names);
    return code;
}

int plot_main(int argc, char **argv, FILE *out, FILE *err) {
    const char *path = NULL, *title = "vithost runs";
    const char **dirs = calloc((size_t)argc, sizeof *dirs);
    if (!dirs) return VH_EXIT_RUN_FAILED;
    int n = 0;
    int code = parse_args(argc, argv, dirs, &n, &path, &title, out, err);
    if (code == -1) code = VH_EXIT_OK, n = 0; /* --help */
    else if (code == VH_EXIT_OK) code = check_target(path, dirs, n, err);
    if (code != VH_EXIT_OK || n == 0) {
        free(dirs);
        return code;
    }
    plot_run *runs = calloc((size_t)n, sizeof *runs);
    code = runs ? VH_EXIT_OK : VH_EXIT_RUN_FAILED;
    for (int i = 0; i < n && code == VH_EXIT_OK; i++)
        if (read_run(&runs[i], dirs[i], err) != 0) code = VH_EXIT_RUN_FAILED;
    if (code == VH_EXIT_OK) {
        if (write_plot(path, title, runs, n) != 0) {
            fprintf(err, "vithost plot: cannot write %s: %s\n", path, strerror(errno));
            code = VH_EXIT_RUN_FAILED;
        } else {
            fprintf(out, "plot: %d run(s) -> %s\n", n, path);
        }
    }
    for (int i = 0; runs && i < n; i++)
        for (int p = 0; p < PANEL_COUNT; p++) {
            free(runs[i].s[p].x);
            free(runs[i].s[p].y);
        }
    free(runs);
    free(dirs);
    return code;
}
