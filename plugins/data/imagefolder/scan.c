/* scan.c - class folders and image lists. See scan.h. */
#define _DEFAULT_SOURCE /* d_type, DT_* */
#include "scan.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define PATH_CAP 4096

/* Grows an array of `elem`-byte items to hold at least `need`. */
static int grow(vh_host *host, void **items, int64_t *cap, int64_t need, size_t elem) {
    if (*cap >= need) return 1;
    int64_t want = *cap ? *cap * 2 : 64;
    while (want < need) want *= 2;
    void *p = host->api->alloc(host, (size_t)want * elem);
    if (!p) return 0;
    if (*items) memcpy(p, *items, (size_t)*cap * elem);
    host->api->free(host, *items);
    *items = p;
    *cap = want;
    return 1;
}

/* Appends the strings a and b (either may be empty) as one; -1 if out of memory. */
static int64_t pool_add(vh_host *host, imf_pool *pool, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), need = pool->len + la + lb + 1;
    if (need > pool->cap) {
        size_t want = pool->cap ? pool->cap * 2 : 4096;
        while (want < need) want *= 2;
        char *p = host->api->alloc(host, want);
        if (!p) return -1;
        if (pool->text) memcpy(p, pool->text, pool->len);
        host->api->free(host, pool->text);
        pool->text = p;
        pool->cap = want;
    }
    int64_t at = (int64_t)pool->len;
    memcpy(pool->text + pool->len, a, la);
    memcpy(pool->text + pool->len + la, b, lb + 1);
    pool->len = need;
    return at;
}

static void pool_free(vh_host *host, imf_pool *pool) {
    host->api->free(host, pool->text);
    memset(pool, 0, sizeof *pool);
}

static vh_status nomem(vh_host *host, const char *dir) {
    return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory listing %s", dir);
}

static int join(char *out, const char *a, const char *b) {
    int n = snprintf(out, PATH_CAP, "%s/%s", a, b);
    return n > 0 && n < PATH_CAP;
}

static int has_image_ext(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && dot != name &&
           (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") || !strcasecmp(dot, ".png"));
}

/* 'd' folder, 'f' regular file, 0 anything else (links followed). */
static int entry_kind(const char *dir, const struct dirent *e) {
    if (e->d_type == DT_DIR) return 'd';
    if (e->d_type == DT_REG) return 'f';
    char path[PATH_CAP];
    struct stat sb;
    if (!join(path, dir, e->d_name) || stat(path, &sb) != 0) return 0;
    return S_ISDIR(sb.st_mode) ? 'd' : S_ISREG(sb.st_mode) ? 'f' : 0;
}

/* The visible sub-folders (dirs) or image files (!dirs) of a folder, sorted. */
typedef struct name_list {
    imf_pool pool;
    int64_t *at;
    char **names; /* sorted, into pool */
    int64_t count, cap, skipped;
} name_list;

static void name_list_free(vh_host *host, name_list *l) {
    pool_free(host, &l->pool);
    host->api->free(host, l->at);
    host->api->free(host, l->names);
    memset(l, 0, sizeof *l);
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static vh_status list_dir(vh_host *host, const char *dir, int dirs, name_list *out,
                          int *missing) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) {
        int err = errno;
        if (missing) *missing = err == ENOENT;
        return host->api->fail(host, VH_STATUS_ERR_IO, "cannot open the folder %s: %s", dir,
                               strerror(err));
    }
    struct dirent *e;
    for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
        if (e->d_name[0] == '.') continue;
        int kind = entry_kind(dir, e);
        if (dirs ? kind != 'd' : kind != 'f') continue;
        if (!dirs && !has_image_ext(e->d_name)) {
            out->skipped++;
            continue;
        }
        int64_t at = pool_add(host, &out->pool, e->d_name, "");
        if (at < 0 || !grow(host, (void **)&out->at, &out->cap, out->count + 1, sizeof *out->at)) {
            closedir(d);
            name_list_free(host, out);
            return nomem(host, dir);
        }
        out->at[out->count++] = at;
    }
    int err = errno;
    closedir(d);
    if (err) {
        name_list_free(host, out);
        return host->api->fail(host, VH_STATUS_ERR_IO, "cannot read the folder %s: %s", dir,
                               strerror(err));
    }
    if (out->count) {
        out->names = host->api->alloc(host, (size_t)out->count * sizeof *out->names);
        if (!out->names) {
            name_list_free(host, out);
            return nomem(host, dir);
        }
        for (int64_t i = 0; i < out->count; i++) out->names[i] = out->pool.text + out->at[i];
        qsort(out->names, (size_t)out->count, sizeof *out->names, compare_names);
    }
    return VH_STATUS_OK;
}

const char *imf_class_name(const imf_classes *c, int32_t i) {
    return c->names.text + c->name_at[i];
}

void imf_classes_free(vh_host *host, imf_classes *c) {
    pool_free(host, &c->names);
    host->api->free(host, c->name_at);
    memset(c, 0, sizeof *c);
}

void imf_split_free(vh_host *host, imf_split *s) {
    host->api->free(host, s->dir);
    pool_free(host, &s->paths);
    host->api->free(host, s->path_at);
    host->api->free(host, s->label);
    memset(s, 0, sizeof *s);
}

vh_status imf_scan_classes(vh_host *host, const char *dir, imf_classes *out, int *missing) {
    memset(out, 0, sizeof *out);
    *missing = 0;
    name_list l;
    vh_status st = list_dir(host, dir, 1, &l, missing);
    if (st != VH_STATUS_OK) return st;
    if (l.count == 0) {
        name_list_free(host, &l);
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s has no class folders (expected %s/<class>/<image>.jpg)", dir,
                               dir);
    }
    if (l.count > INT32_MAX) {
        name_list_free(host, &l);
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s has too many class folders", dir);
    }
    out->name_at = host->api->alloc(host, (size_t)l.count * sizeof *out->name_at);
    if (!out->name_at) {
        name_list_free(host, &l);
        return nomem(host, dir);
    }
    for (int64_t i = 0; i < l.count; i++) {
        int64_t at = pool_add(host, &out->names, l.names[i], "");
        if (at < 0) {
            name_list_free(host, &l);
            imf_classes_free(host, out);
            return nomem(host, dir);
        }
        out->name_at[i] = at;
    }
    out->count = (int32_t)l.count;
    name_list_free(host, &l);
    return VH_STATUS_OK;
}

static int32_t find_class(const imf_classes *c, const char *name) {
    int32_t lo = 0, hi = c->count - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(imf_class_name(c, mid), name);
        if (cmp == 0) return mid;
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* Appends the images of one class folder. */
static vh_status scan_class(vh_host *host, const char *dir, const char *name, int32_t label,
                            imf_split *out) {
    char path[PATH_CAP], prefix[PATH_CAP];
    if (!join(path, dir, name) || snprintf(prefix, sizeof prefix, "%s/", name) >= PATH_CAP)
        return host->api->fail(host, VH_STATUS_ERR_IO, "path too long: %s/%s", dir, name);
    name_list files;
    vh_status st = list_dir(host, path, 0, &files, NULL);
    if (st != VH_STATUS_OK) return st;
    out->skipped += files.skipped;
    if (files.count == 0) {
        name_list_free(host, &files);
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "class folder %s has no images (.jpg, .jpeg or .png files)", path);
    }
    int64_t need = out->count + files.count, cap = out->cap;
    if (!grow(host, (void **)&out->path_at, &cap, need, sizeof *out->path_at) ||
        !grow(host, (void **)&out->label, &out->cap, need, sizeof *out->label)) {
        name_list_free(host, &files);
        return nomem(host, path);
    }
    for (int64_t i = 0; i < files.count; i++) {
        int64_t at = pool_add(host, &out->paths, prefix, files.names[i]);
        if (at < 0) {
            name_list_free(host, &files);
            return nomem(host, path);
        }
        out->path_at[out->count] = at;
        out->label[out->count] = label;
        out->count++;
    }
    name_list_free(host, &files);
    return VH_STATUS_OK;
}

vh_status imf_scan_split(vh_host *host, const char *dir, const imf_classes *classes,
                         imf_split *out) {
    memset(out, 0, sizeof *out);
    size_t n = strlen(dir) + 1;
    out->dir = host->api->alloc(host, n);
    if (!out->dir) return nomem(host, dir);
    memcpy(out->dir, dir, n);

    name_list l;
    vh_status st = list_dir(host, dir, 1, &l, NULL);
    if (st != VH_STATUS_OK) {
        imf_split_free(host, out);
        return st;
    }
    if (l.count == 0)
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                             "%s has no class folders (expected %s/<class>/<image>.jpg)", dir,
                             dir);
    for (int64_t i = 0; st == VH_STATUS_OK && i < l.count; i++) {
        int32_t label = find_class(classes, l.names[i]);
        if (label < 0)
            st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                 "class folder %s/%s is not one of the %d classes of the "
                                 "training split",
                                 dir, l.names[i], (int)classes->count);
        else
            st = scan_class(host, dir, l.names[i], label, out);
    }
    name_list_free(host, &l);
    if (st != VH_STATUS_OK) imf_split_free(host, out);
    return st;
}
