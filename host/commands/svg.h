/* svg.h - the few SVG elements `vithost sweep` and `vithost plot` draw,
 * written by hand (no library): a canvas in pixels that scales to the page
 * width (never past its own), text escaped, numbers with enough digits and
 * never a locale's comma. */
#ifndef VITHOST_HOST_SVG_H
#define VITHOST_HOST_SVG_H

#include <stdio.h>

#include "vithost/vh_host.h"

/* <svg ...> with a white background, after the mark of vithost's files
 * (OUTPUT_SVG_MARK, outputs.h): width="100%" with max-width the drawn
 * width, and viewBox "0 0 width height"; and </svg>. */
void svg_begin(FILE *f, double width, double height);
void svg_end(FILE *f);

/* Text at (x, y): anchor "start", "middle" or "end"; extra attributes
 * (e.g. "font-weight=\"bold\"") or NULL. The formatted text is escaped. */
void svg_text(FILE *f, double x, double y, const char *anchor, double size, const char *extra,
              const char *fmt, ...) VH_PRINTF_LIKE(7, 8);
void svg_rect(FILE *f, double x, double y, double w, double h, const char *fill,
              const char *stroke);
void svg_line(FILE *f, double x1, double y1, double x2, double y2, const char *stroke,
              double width);
/* A polyline of n points (n >= 1: one point is drawn as a dot). */
void svg_polyline(FILE *f, const double *xs, const double *ys, int n, const char *stroke,
                  double width);
/* Writes s with &, <, >, " escaped. */
void svg_escape(FILE *f, const char *s);

/* The i-th colour of a palette that tells lines apart (cycles). */
const char *svg_color(int i);

/* A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about
 * `ticks` ticks over span. */
double svg_tick_step(double span, int ticks);

#endif
