/* run_folder.c - the run folder: name, recipe.yaml and its diff on resume,
 * run.json (see run_folder.h). */
#define _POSIX_C_SOURCE 200809L
#include "run_folder.h"
#include "vtables.h"

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

/* One "section.key: value" line of a resolved recipe, and whether the value
 * came from a schema default. */
typedef struct recipe_line {
    char *text;    /* "section.key: value" */
    size_t key_len; /* of "section.key" */
    int is_default;
} recipe_line;

typedef struct recipe_lines {
    recipe_line *items;
    int count, cap;
} recipe_lines;

static void lines_free(recipe_lines *l) {
    for (int i = 0; i < l->count; i++) free(l->items[i].text);
    free(l->items);
    memset(l, 0, sizeof *l);
}

/* Keys of the run section that say how long and how often, not what: a
 * resumed run may extend or re-time itself. And the ones that say on how
 * many processes: checkpoints do not depend on the world size, so a run
 * resumes on another number of ranks (run.comm), keeping its global batch
 * with another batch per rank (run.batch_size; the data position maps to
 * the new split, vh_sampler.h). */
static int may_change(const char *key) {
    static const char *const keys[] = {"run.steps", "run.epochs", "run.eval_every",
                                       "run.eval_every_steps", "run.log_every",
                                       "run.checkpoint_every", "run.keep_checkpoints",
                                       "run.comm", "run.batch_size", NULL};
    for (int i = 0; keys[i]; i++)
        if (strcmp(key, keys[i]) == 0) return 1;
    return 0;
}

/* The values of a resolved recipe (as run_print_resolved writes it), what
 * must not change on resume. Comments and "(not set; optional)" lines carry
 * no value and are skipped. 0 on out of memory. */
static int read_lines(FILE *f, recipe_lines *out) {
    char line[2048], section[256] = "";
    memset(out, 0, sizeof *out);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0') continue;
        if (line[0] != ' ') { /* "section:" */
            snprintf(section, sizeof section, "%.200s", line);
            char *colon = strchr(section, ':');
            if (colon) *colon = '\0';
            continue;
        }
        char *key = line + strspn(line, " ");
        if (key[0] == '#') continue;
        char *hash = strstr(key, "  #");
        int is_default = hash && strncmp(hash, "  # default", 11) == 0;
        if (hash) *hash = '\0';
        char *colon = strchr(key, ':');
        if (!colon) continue;
        size_t klen = (size_t)(colon - key);
        char full[512];
        snprintf(full, sizeof full, "%s.%.*s", section, (int)klen, key);
        if (may_change(full)) continue;
        if (out->count == out->cap) {
            int cap = out->cap ? 2 * out->cap : 64;
            recipe_line *t = realloc(out->items, (size_t)cap * sizeof *t);
            if (!t) return 0;
            out->items = t, out->cap = cap;
        }
        size_t n = strlen(section) + 1 + strlen(key) + 1;
        char *text = malloc(n);
        if (!text) return 0;
        snprintf(text, n, "%s.%s", section, key);
        out->items[out->count++] =
            (recipe_line){.text = text, .key_len = strlen(section) + 1 + klen,
                          .is_default = is_default};
    }
    return 1;
}

static const recipe_line *find_key(const recipe_lines *l, const recipe_line *like) {
    for (int i = 0; i < l->count; i++)
        if (l->items[i].key_len == like->key_len &&
            strncmp(l->items[i].text, like->text, like->key_len) == 0)
            return &l->items[i];
    return NULL;
}

/* Whether the recipe now resolves to what recipe.yaml (already open) says.
 * A key that is new since the run started (a newer vithost or plugin added
 * it) counts as the same when it now has its default: a run folder written
 * by an older vithost still resumes. Any other difference is a change. */
static vh_status same_recipe(const vh_run *run, FILE *old, int *same, vh_diag *d) {
    recipe_lines was, now;
    int ok_was = read_lines(old, &was);
    char *tmp_text = NULL;
    size_t tmp_len = 0;
    FILE *now_f = open_memstream(&tmp_text, &tmp_len);
    int ok_now = 0;
    memset(&now, 0, sizeof now);
    if (now_f) {
        run_print_resolved(run, now_f);
        fclose(now_f);
        FILE *now_r = fmemopen(tmp_text, tmp_len, "r");
        if (now_r) {
            ok_now = read_lines(now_r, &now);
            fclose(now_r);
        }
    }
    free(tmp_text);
    if (!ok_was || !ok_now) {
        lines_free(&was);
        lines_free(&now);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    }
    *same = 1;
    for (int i = 0; i < was.count && *same; i++) {
        const recipe_line *n = find_key(&now, &was.items[i]);
        if (!n || strcmp(n->text, was.items[i].text) != 0) *same = 0;
    }
    for (int i = 0; i < now.count && *same; i++)
        if (!find_key(&was, &now.items[i]) && !now.items[i].is_default) *same = 0;
    lines_free(&was);
    lines_free(&now);
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
                      "only run.steps, epochs, eval_every, log_every, checkpoint settings, comm "
                      "and batch_size may change on resume",
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
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
        const vh_plugin *p = &run->plugins[r];
        fprintf(f, "%s\"%s\": {\"name\": \"%s\", \"version\": \"%s\", \"file\": \"%s\"}",
                r ? ", " : "", vh_role_name((vh_role)r), p->desc->name, p->desc->version,
                p->path);
    }
    fprintf(f, "}}\n");
    return fclose(f) == 0 ? VH_STATUS_OK
                          : diag_set(d, VH_STATUS_ERR_IO, "cannot write %s", path);
}
