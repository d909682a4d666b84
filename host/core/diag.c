/* diag.c - building the one message a user sees for an error. */
#include "diag.h"

#include <stdio.h>
#include <string.h>

vh_status diag_setv(vh_diag *d, vh_status status, const char *fmt, va_list ap) {
    if (d) vsnprintf(d->text, sizeof d->text, fmt, ap);
    return status;
}

vh_status diag_set(vh_diag *d, vh_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    diag_setv(d, status, fmt, ap);
    va_end(ap);
    return status;
}

/* Finds the start and length of 1-based line `line` in source. */
static int find_line(const char *source, size_t len, int line, size_t *start,
                     size_t *line_len) {
    size_t pos = 0;
    for (int l = 1; l < line; l++) {
        const char *nl = memchr(source + pos, '\n', len - pos);
        if (!nl) return 0;
        pos = (size_t)(nl - source) + 1;
    }
    if (pos >= len) return 0;
    const char *nl = memchr(source + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - source) : len;
    if (end > pos && source[end - 1] == '\r') end--;
    *start = pos;
    *line_len = end - pos;
    return 1;
}

vh_status diag_set_at(vh_diag *d, vh_status status, const char *file,
                      const char *source, size_t source_len, int line, int col,
                      const char *fmt, ...) {
    if (!d) return status;
    int n = snprintf(d->text, sizeof d->text, "%s:%d:%d: ", file, line, col);
    if (n < 0 || (size_t)n >= sizeof d->text) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->text + n, sizeof d->text - (size_t)n, fmt, ap);
    va_end(ap);

    size_t start, line_len;
    if (!source || line < 1 || !find_line(source, source_len, line, &start, &line_len))
        return status;
    if (line_len > 200) line_len = 200; /* a recipe line this long is not worth echoing whole */
    size_t used = strlen(d->text);
    size_t room = sizeof d->text - used;
    int echo = snprintf(d->text + used, room, "\n    %.*s\n    ", (int)line_len,
                        source + start);
    if (echo < 0 || (size_t)echo >= room) return status;
    used += (size_t)echo;
    /* Tabs in the echoed line keep their width under the caret. */
    for (int c = 1; c < col && used + 2 < sizeof d->text; c++) {
        size_t i = start + (size_t)(c - 1);
        d->text[used++] = (i < source_len && source[i] == '\t') ? '\t' : ' ';
    }
    if (used + 2 <= sizeof d->text) {
        d->text[used++] = '^';
        d->text[used] = '\0';
    }
    return status;
}

void diag_prefix(vh_diag *d, const char *fmt, ...) {
    if (!d) return;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Shift the message right by the prefix, truncating its end if need be. */
    size_t plen = strlen(prefix), old_len = strlen(d->text);
    if (plen >= sizeof d->text) plen = sizeof d->text - 1;
    if (plen + old_len >= sizeof d->text) old_len = sizeof d->text - 1 - plen;
    memmove(d->text + plen, d->text, old_len);
    memcpy(d->text, prefix, plen);
    d->text[plen + old_len] = '\0';
}
