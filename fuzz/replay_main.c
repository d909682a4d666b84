/* replay_main.c - runs a fuzz target's inputs without libFuzzer.
 *
 *   fuzz_<target>_replay PATH...   each PATH a file, or a folder of files
 *
 * Every file goes through LLVMFuzzerTestOneInput as libFuzzer would give it;
 * a finding aborts (sanitizers, fuzz_require), so ctest sees a failure. This
 * is how fuzz/regressions and the seed corpora are tested on every build,
 * with any compiler.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t size = 0, cap = 0, n;
    do {
        if (cap - size < 65536) {
            cap = cap ? cap * 2 : 65536;
            uint8_t *grown = realloc(buf, cap);
            if (!grown) abort();
            buf = grown;
        }
        n = fread(buf + size, 1, cap - size, f);
        size += n;
    } while (n > 0);
    fclose(f);
    /* libFuzzer hands over a buffer of exactly size bytes: copy so ASan sees overreads. */
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact) abort();
    if (size) memcpy(exact, buf, size);
    free(buf);
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_dir(const char *path, int *count) {
    DIR *dir = opendir(path);
    if (!dir) {
        perror(path);
        return -1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.') continue; /* ., .., and hidden notes */
        char **grown = realloc(names, (n + 1) * sizeof *names);
        if (!grown) abort();
        names = grown;
        names[n] = malloc(strlen(path) + strlen(e->d_name) + 2);
        if (!names[n]) abort();
        sprintf(names[n], "%s/%s", path, e->d_name);
        n++;
    }
    closedir(dir);
    if (n > 1) qsort(names, n, sizeof *names, by_name); /* (NULL when empty: UB for qsort) */
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat sb;
        if (stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (replay_file(names[i]) != 0) rc = -1;
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    int count = 0, rc = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            rc = 1;
        } else if (S_ISDIR(sb.st_mode)) {
            if (replay_dir(argv[i], &count) != 0) rc = 1;
        } else {
            if (replay_file(argv[i]) != 0) rc = 1;
            count++;
        }
    }
    printf("%s: replayed %d inputs%s\n", argv[0], count, rc ? " (some unreadable)" : "");
    return rc;
}
