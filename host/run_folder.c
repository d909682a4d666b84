/* run_folder.c - the run folder: name, recipe.yaml and its diff on resume,
 * run.json (see run_folder.h). */
#define _POSIX_C_SOURCE 200809L
#include "run_folder.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#ifndef VITHOST_VERSION
#define VITHOST_VERSION "0.0.0"
#endif

static vh_status make_dirs(const char *dir, vh_diag *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) break;
        *p = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return diag_set(d, VH_STATUS_ERR_IO, "cannot create the run folder %s: %s", dir,
                        strerror(errno));
    return VH_STATUS_OK;
}

void run_folder_default(const vh_run *run, char *out, size_t len) {
    char name[512];
    snprintf(name, sizeof name, "%s", run->recipe.file);
    char *base = basename(name);
    char *dot = strrchr(base, '.');
    if (dot) *dot = '\0';
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out, len, "runs/%s-%s", base, stamp);
    struct stat sb;
    for (int i = 2; stat(out, &sb) == 0 && i < 1000; i++)
        snprintf(out, len, "runs/%s-%s-%d", base, stamp, i); /* two runs in one second */
}

/* The resolved recipe without comments: what must not change on resume. */
static char *recipe_body(FILE *f) {
    size_t cap = 4096, len = 0;
    char *out = malloc(cap), line[2048];
    if (!out) return NULL;
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        char *hash = strstr(line, "  #");
        if (line[0] == '#') continue;
        if (hash) strcpy(hash, "\n");
        /* Keys of the run section that say how long and how often, not what:
         * a resumed run may extend or re-time itself. */
        if (strstr(line, "  steps:") == line || strstr(line, "  epochs:") == line ||
            strstr(line, "  eval_every") == line || strstr(line, "  log_every:") == line ||
            strstr(line, "  checkpoint_every:") == line ||
            strstr(line, "  keep_checkpoints:") == line)
            continue;
        size_t n = strlen(line);
        if (len + n + 1 > cap) {
            char *t = realloc(out, cap = 2 * (len + n + 1));
            if (!t) {
                free(out);
                return NULL;
            }
            out = t;
        }
        memcpy(out + len, line, n + 1);
        len += n;
    }
    return out;
}

/* Whether the recipe now resolves to what recipe.yaml (already open) says. */
static vh_status same_recipe(const vh_run *run, FILE *old, int *same, vh_diag *d) {
    char *was = recipe_body(old);
    char *tmp_text = NULL;
    size_t tmp_len = 0;
    FILE *now_f = open_memstream(&tmp_text, &tmp_len);
    if (!was || !now_f) {
        free(was);
        if (now_f) fclose(now_f);
        free(tmp_text);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    }
    run_print_resolved(run, now_f);
    fclose(now_f);
    FILE *now_r = fmemopen(tmp_text, tmp_len, "r");
    char *now = now_r ? recipe_body(now_r) : NULL;
    if (now_r) fclose(now_r);
    free(tmp_text);
    *same = was && now && strcmp(was, now) == 0;
    free(was);
    free(now);
    return VH_STATUS_OK;
}

vh_status run_folder_check(const vh_run *run, const char *dir, int resume, vh_diag *d) {
    char path[4200];
    snprintf(path, sizeof path, "%s/recipe.yaml", dir);
    FILE *old = fopen(path, "r");
    if (!resume && old) {
        fclose(old);
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s already holds a run (%s); resume it with --resume, or choose "
                        "another --out",
                        dir, path);
    }
    if (resume && !old)
        return diag_set(d, VH_STATUS_ERR_CONFIG, "--resume: %s holds no run (no %s)", dir, path);
    if (!resume) return VH_STATUS_OK;
    int same = 0;
    vh_status st = same_recipe(run, old, &same, d);
    fclose(old);
    if (st == VH_STATUS_OK && !same)
        st = diag_set(d, VH_STATUS_ERR_CONFIG,
                      "--resume: the recipe differs from the one %s was started with (%s); "
                      "only run.steps, epochs, eval_every, log_every and checkpoint settings "
                      "may change on resume",
                      dir, path);
    return st;
}

vh_status run_folder_create(const vh_run *run, const char *dir, vh_diag *d) {
    vh_status st = make_dirs(dir, d);
    if (st != VH_STATUS_OK) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/recipe.yaml", dir);
    FILE *f = fopen(path, "w");
    if (!f) return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    run_print_resolved(run, f);
    int ok = fclose(f) == 0;
    snprintf(path, sizeof path, "%s/run.json", dir);
    f = ok ? fopen(path, "w") : NULL;
    if (!f) return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "{\"vithost\": \"%s\", \"abi\": \"%d.%d\", \"plugins\": {", VITHOST_VERSION,
            VH_ABI_MAJOR, VH_ABI_MINOR);
    for (int r = 0; r < VH_ROLE_COUNT; r++) {
        const vh_plugin *p = &run->plugins[r];
        fprintf(f, "%s\"%s\": {\"name\": \"%s\", \"version\": \"%s\", \"file\": \"%s\"}",
                r ? ", " : "", vh_role_name((vh_role)r), p->desc->name, p->desc->version,
                p->path);
    }
    fprintf(f, "}}\n");
    return fclose(f) == 0 ? VH_STATUS_OK
                          : diag_set(d, VH_STATUS_ERR_IO, "cannot write %s", path);
}
