/* svg.c - see svg.h. */
#define _POSIX_C_SOURCE 200809L
#include "svg.h"

#include <math.h>
#include <stdarg.h>

#include "outputs.h"

void svg_begin(FILE *f, double width, double height) {
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            OUTPUT_SVG_MARK " -->\n" /* an existing file may be replaced only with it */
            /* as wide as the page, never wider than drawn; the height
             * follows the viewBox's proportions */
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100%%\" "
            "style=\"max-width: %.0fpx; height: auto\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\">\n",
            width, width, height);
    svg_rect(f, 0, 0, width, height, "#ffffff", NULL);
}

void svg_end(FILE *f) { fputs("</svg>\n", f); }

void svg_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            /* control characters are not allowed in XML 1.0 */
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
        }
    }
}

void svg_text(FILE *f, double x, double y, const char *anchor, double size, const char *extra,
              const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%.1f\"%s%s>", x, y,
            anchor, size, extra ? " " : "", extra ? extra : "");
    svg_escape(f, buf);
    fputs("</text>\n", f);
}

void svg_rect(FILE *f, double x, double y, double w, double h, const char *fill,
              const char *stroke) {
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"", x, y,
            w > 0 ? w : 0, h > 0 ? h : 0, fill);
    if (stroke) fprintf(f, " stroke=\"%s\"", stroke);
    fputs("/>\n", f);
}

void svg_line(FILE *f, double x1, double y1, double x2, double y2, const char *stroke,
              double width) {
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"%.2g\"/>\n",
            x1, y1, x2, y2, stroke, width);
}

void svg_polyline(FILE *f, const double *xs, const double *ys, int n, const char *stroke,
                  double width) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.2g\" "
               "stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"",
            stroke, width);
    for (int i = 0; i < n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", xs[i], ys[i]);
    /* a single point: a zero-length segment, drawn as a dot by the round cap */
    if (n == 1) fprintf(f, " %.1f,%.1f", xs[0], ys[0]);
    fputs("\"/>\n", f);
}

const char *svg_color(int i) {
    static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                         "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                         "#bcbd22", "#17becf"};
    int n = (int)(sizeof colors / sizeof colors[0]);
    return colors[((i % n) + n) % n];
}

double svg_tick_step(double span, int ticks) {
    if (!(span > 0) || ticks < 1) return 1.0;
    double raw = span / ticks;
    double p = pow(10.0, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1.0 : m < 3.5 ? 2.0 : m < 7.5 ? 5.0 : 10.0) * p;
}
