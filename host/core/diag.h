/* diag.h - one user-facing error message, built up by the host's modules.
 *
 * Every error the user sees is one message: "where: what (what to do)", and
 * for recipe errors the offending line with a caret under the column. Modules
 * fill a vh_diag and return a status; only main() prints and exits.
 */
#ifndef VITHOST_HOST_DIAG_H
#define VITHOST_HOST_DIAG_H

#include <stdarg.h>
#include <stddef.h>

#include "vithost/vh_host.h"

#define VH_DIAG_CAPACITY 4096

typedef struct vh_diag {
    char text[VH_DIAG_CAPACITY];
} vh_diag;

/* Replaces the message. Returns status, so callers write
 * `return diag_set(d, VH_STATUS_ERR_CONFIG, "...")`. d may be NULL. */
vh_status diag_set(vh_diag *d, vh_status status, const char *fmt, ...)
    VH_PRINTF_LIKE(3, 4);
vh_status diag_setv(vh_diag *d, vh_status status, const char *fmt, va_list ap);

/* Replaces the message with "file:line:col: message" followed by the source
 * line (taken from `source`, the whole file's text) and a caret under col.
 * line and col are 1-based; a line past the end of source prints no echo. */
vh_status diag_set_at(vh_diag *d, vh_status status, const char *file,
                      const char *source, size_t source_len, int line, int col,
                      const char *fmt, ...) VH_PRINTF_LIKE(8, 9);

/* Puts "prefix" in front of the current message. */
void diag_prefix(vh_diag *d, const char *fmt, ...) VH_PRINTF_LIKE(2, 3);

#endif
