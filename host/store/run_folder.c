/* run_folder.c - the run folder: name, recipe.yaml and its diff on resume,
 * run.json (see run_folder.h). */
#define _POSIX_C_SOURCE 200809L
#include "run_folder.h"
#include "vtables.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* ---- one job per run folder -------------------------------------------- */

#define LOCK_FILE ".lock"

/* What the holder wrote in the lock file: "pid P on host H since T". It
 * writes its line just after taking the lock, so a job that comes in
 * between waits a moment for it. */
static void lock_holder(int fd, char *out, size_t len) {
    for (int tries = 0; tries < 100; tries++) {
        ssize_t n = pread(fd, out, len - 1, 0);
        if (n > 0 && out[n - 1] == '\n') {
            out[n - 1] = '\0';
            return;
        }
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    snprintf(out, len, "a process that has not said which");
}

/* The lock file names its holder, for the job it keeps out. */
static vh_status lock_write_holder(int fd, const char *path, vh_diag *d) {
    char host[256] = "?", since[32] = "?", line[512];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm)) strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S", &tm);
    int n = snprintf(line, sizeof line, "pid %ld on host %s since %s\n", (long)getpid(), host,
                     since);
    /* One write of the whole line: a reader sees all of it or none. */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
        return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return VH_STATUS_OK;
}

static vh_status lock_refused(int fd, const char *dir, const char *path, int resume,
                              vh_diag *d) {
    char holder[300];
    lock_holder(fd, holder, sizeof holder);
    if (resume)
        return diag_set(d, VH_STATUS_ERR_IO,
                        "--resume: %s is in use by a job that is still running (%s; the lock "
                        "is %s): one job per run folder; end that job first, or wait for it",
                        dir, holder, path);
    return diag_set(d, VH_STATUS_ERR_IO,
                    "%s is in use by another job (%s; the lock is %s): one job per run folder; "
                    "choose another --out",
                    dir, holder, path);
}

vh_status run_folder_lock(const char *dir, int resume, int *lock, vh_diag *d) {
    *lock = -1;
    char path[4200], recipe[4200];
    snprintf(path, sizeof path, "%s/%s", dir, LOCK_FILE);
    snprintf(recipe, sizeof recipe, "%s/recipe.yaml", dir);
    int flags = O_RDWR | O_CLOEXEC;
    if (!resume) {
        vh_status st = make_dirs(dir, d);
        if (st != VH_STATUS_OK) return st;
        flags |= O_CREAT;
    } else if (access(recipe, F_OK) == 0) {
        flags |= O_CREAT; /* (a run folder of a vithost from before the lock) */
    }
    int fd = open(path, flags, 0644);
    if (fd < 0 && resume && errno == ENOENT) return VH_STATUS_OK; /* no run: the check says so */
    if (fd < 0) return diag_set(d, VH_STATUS_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        vh_status st = VH_STATUS_OK;
        if (e == EWOULDBLOCK)
            st = lock_refused(fd, dir, path, resume, d);
        else /* a filesystem without locks: the run goes on, unguarded */
            fprintf(stderr,
                    "vithost: warning: cannot lock %s (%s): this filesystem does not keep a "
                    "second job out of %s\n",
                    path, strerror(e), dir);
        close(fd);
        return st;
    }
    vh_status st = lock_write_holder(fd, path, d);
    if (st != VH_STATUS_OK) {
        close(fd);
        return st;
    }
    *lock = fd;
    return VH_STATUS_OK;
}

void run_folder_unlock(int lock) {
    if (lock >= 0) close(lock); /* the file stays: removing it would race a new holder */
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
                                       "run.comm", "run.batch_size", "run.write_errors",
                                       /* (how a dead run is stopped, not what it computes) */
                                       "run.max_consecutive_skips", "run.max_skipped_steps",
                                       NULL};
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

/* The value of a "section.key: value" line. */
static const char *value_of(const recipe_line *l) {
    const char *v = l->text + l->key_len + 1;
    return v + strspn(v, " ");
}

/* The first difference between the recipe a run was started with and the
 * one now, as "KEY is NOW now, but DIR was started with WAS"; "" when the
 * same. A key that is new since the run started (a newer vithost or plugin
 * added it) counts as the same when it now has its default: a run folder
 * written by an older vithost still resumes. */
static void first_difference(const recipe_lines *was, const recipe_lines *now, const char *dir,
                             char *out, size_t len) {
    out[0] = '\0';
    for (int i = 0; i < was->count; i++) {
        const recipe_line *w = &was->items[i], *n = find_key(now, w);
        if (n && strcmp(n->text, w->text) == 0) continue;
        if (n)
            snprintf(out, len, "%.*s is %s now, but %s was started with %s", (int)w->key_len,
                     w->text, value_of(n), dir, value_of(w));
        else
            snprintf(out, len, "%.*s is not in the recipe now, but %s was started with %s",
                     (int)w->key_len, w->text, dir, value_of(w));
        return;
    }
    for (int i = 0; i < now->count; i++) {
        const recipe_line *n = &now->items[i];
        if (find_key(was, n) || n->is_default) continue;
        snprintf(out, len, "%.*s is %s now, but %s was started without it", (int)n->key_len,
                 n->text, value_of(n), dir);
        return;
    }
}

/* Compares the recipe now with recipe.yaml (already open): *diff says the
 * first difference ("" none). */
static vh_status same_recipe(const vh_run *run, FILE *old, const char *dir, char *diff,
                             size_t diff_len, vh_diag *d) {
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
    if (ok_was && ok_now) first_difference(&was, &now, dir, diff, diff_len);
    lines_free(&was);
    lines_free(&now);
    if (!ok_was || !ok_now) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
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
    char diff[3000];
    vh_status st = same_recipe(run, old, dir, diff, sizeof diff, d);
    fclose(old);
    if (st == VH_STATUS_OK && diff[0])
        st = diag_set(d, VH_STATUS_ERR_CONFIG,
                      "--resume: the recipe differs from the one %s was started with (%s): %s; "
                      "only run.steps, epochs, eval_every, log_every, checkpoint settings, skip "
                      "limits, comm and batch_size may change on resume",
                      dir, path, diff);
    return st;
}

/* Writes text to path whole, every call checked: a failure (a full disk, a
 * quota) names the file and the system's reason. */
static vh_status write_whole(const char *path, const char *text, size_t len, vh_diag *d) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, text + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : ENOSPC; /* (0 bytes written: no room) */
            close(fd);
            return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(e));
        }
        done += (size_t)n;
    }
    if (close(fd) != 0) /* (NFS reports a full disk here) */
        return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return VH_STATUS_OK;
}

/* run.json: vithost's and each plugin's version and file. */
static void print_run_json(const vh_run *run, FILE *f) {
    fprintf(f, "{\"vithost\": \"%s\", \"abi\": \"%d.%d\", \"plugins\": {", VITHOST_VERSION,
            VH_ABI_MAJOR, VH_ABI_MINOR);
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
        const vh_plugin *p = &run->plugins[r];
        fprintf(f, "%s\"%s\": {\"name\": \"%s\", \"version\": \"%s\", \"file\": \"%s\"}",
                r ? ", " : "", vh_role_name((vh_role)r), p->desc->name, p->desc->version,
                p->path);
    }
    fprintf(f, "}}\n");
}

/* One file of the folder, its text made in memory and written whole. */
static vh_status write_made(const vh_run *run, const char *dir, const char *name,
                            void (*print)(const vh_run *, FILE *), vh_diag *d) {
    char path[4200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = open_memstream(&text, &len);
    if (!f) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    print(run, f);
    int ok = fclose(f) == 0;
    vh_status st = ok ? write_whole(path, text, len, d)
                      : diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    free(text);
    return st;
}

vh_status run_folder_create(const vh_run *run, const char *dir, vh_diag *d) {
    vh_status st = make_dirs(dir, d);
    if (st == VH_STATUS_OK) st = write_made(run, dir, "recipe.yaml", run_print_resolved, d);
    if (st == VH_STATUS_OK) st = write_made(run, dir, "run.json", print_run_json, d);
    return st;
}
