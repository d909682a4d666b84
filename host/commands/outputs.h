/* outputs.h - what a command writes never clobbers what a user has.
 *
 * Each file a command will write (plot -o, sweep --out's three files,
 * new-plugin's project) is checked before any work. It is refused when it
 * is one of the command's inputs (the same file through any path or link),
 * a folder, a link to nothing or not a regular file, or an existing file
 * this command did not write (its first bytes lack the command's mark).
 * An empty file holds nothing to lose, and a file the command wrote before
 * is replaced, so a command can be repeated. */
#ifndef VITHOST_HOST_OUTPUTS_H
#define VITHOST_HOST_OUTPUTS_H

#include <stddef.h>

/* Whether the first n bytes of an existing file (text, NUL-terminated)
 * are those of the command's own output. NULL: no existing file is. */
typedef int (*output_is_ours)(const char *head, size_t n);

/* 0 when path may be written; else -1 with one sentence in msg (no
 * "vithost:" prefix) that names path and what to do. `what` names the
 * output in the message ("an SVG"). */
int output_file_check(const char *path, const char *const *inputs, int num_inputs,
                      output_is_ours ours, const char *what, char *msg, size_t len);

/* 0 when dir is a folder or absent (to be created); else -1 and msg. */
int output_dir_check(const char *dir, char *msg, size_t len);

/* The mark every SVG of vithost carries (svg_begin writes it), and the
 * check for it. */
#define OUTPUT_SVG_MARK "<!-- made by vithost"
int output_is_vithost_svg(const char *head, size_t n);

#endif
