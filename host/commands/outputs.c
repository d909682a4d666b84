/* outputs.c - see outputs.h. */
#define _POSIX_C_SOURCE 200809L
#include "outputs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int output_is_vithost_svg(const char *head, size_t n) {
    (void)n;
    /* SVGs written before the mark: svg_begin's exact opening */
    static const char older[] = "font-family=\"Helvetica, Arial, sans-serif\">\n"
                                "<rect x=\"0.0\" y=\"0.0\" width=";
    return strncmp(head, "<?xml", 5) == 0 &&
           (strstr(head, OUTPUT_SVG_MARK) != NULL || strstr(head, older) != NULL);
}

/* The input that is the same file as st (any path, any link), or NULL. */
static const char *same_as_input(const struct stat *st, const char *const *inputs, int n) {
    for (int i = 0; i < n; i++) {
        struct stat in;
        if (inputs[i] && stat(inputs[i], &in) == 0 && in.st_dev == st->st_dev &&
            in.st_ino == st->st_ino)
            return inputs[i];
    }
    return NULL;
}

/* The file's first bytes, NUL-terminated; their count, or -1. */
static long read_head(const char *path, char *head, size_t len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(head, 1, len - 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    head[n] = '\0';
    return (long)n;
}

int output_file_check(const char *path, const char *const *inputs, int num_inputs,
                      output_is_ours ours, const char *what, char *msg, size_t len) {
    struct stat st;
    if (lstat(path, &st) != 0) return 0; /* nothing there: writing destroys nothing */
    if (stat(path, &st) != 0) {
        snprintf(msg, len, "%s is a link to a missing file; nothing was written (give another "
                           "path, or remove the link)", path);
        return -1;
    }
    const char *input = same_as_input(&st, inputs, num_inputs);
    if (input) {
        int same = strcmp(input, path) == 0;
        snprintf(msg, len, "%s is an input of this command%s%s%s: writing there would destroy "
                           "it; nothing was written (give another path)",
                 path, same ? "" : " (the same file as ", same ? "" : input, same ? "" : ")");
        return -1;
    }
    if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
        snprintf(msg, len, "%s is %s, not a file; nothing was written (give a file path)", path,
                 S_ISDIR(st.st_mode) ? "a folder" : "a FIFO, device or socket");
        return -1;
    }
    if (st.st_size == 0) return 0; /* empty: nothing to lose */
    char head[4096];
    long n = read_head(path, head, sizeof head);
    if (n < 0) {
        snprintf(msg, len, "%s exists and cannot be read to check it is %s vithost wrote (%s); "
                           "nothing was written", path, what, strerror(errno));
        return -1;
    }
    if (ours && ours(head, (size_t)n)) return 0;
    snprintf(msg, len, "%s exists and is not %s vithost wrote; nothing was written (give "
                       "another path, or remove the file first)", path, what);
    return -1;
}

int output_dir_check(const char *dir, char *msg, size_t len) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return 0;
        snprintf(msg, len, "%s exists and is not a folder; nothing was written (give a folder "
                           "path)", dir);
        return -1;
    }
    if (errno == ENOENT) return 0; /* created when needed */
    snprintf(msg, len, "%s cannot be a folder: %s; nothing was written (give another path)", dir,
             strerror(errno)); /* ENOTDIR: a part of the path is a file */
    return -1;
}
