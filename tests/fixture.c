/* fixture.c - reader for the golden fixtures of tests/reference/make_fixtures.py.
 *
 * The whole file is read into memory and parsed with a bounds-checked cursor:
 * every length and count is checked against what is left before it is used,
 * so a truncated or damaged file gives an error, never an overrun. Integers
 * and data are decoded byte by byte from little-endian, so the reader does
 * not depend on the host's byte order. See fixture.h for the format.
 */
#define _POSIX_C_SOURCE 200809L

#include "fixture.h"

#include <errno.h>
#include <float.h>
#include <math.h> /* isfinite, INFINITY, fabs: macros and builtins, no libm needed */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STRING 4096u /* longest key, value or tensor name accepted */

#if defined(__GNUC__)
#define VH_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define VH_PRINTF(f, a)
#endif

typedef struct cursor {
    const unsigned char *buf;
    size_t size, pos;
    const char *path;
    char *err;
    size_t errlen;
} cursor;

VH_PRINTF(3, 4)
static void set_error(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- reading the file -------------------------------------------------------------- */

static int read_whole_file(const char *path, unsigned char **out, size_t *size, char *err,
                           size_t errlen) {
    *out = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_error(err, errlen, "%s: cannot open fixture: %s; " VH_FIXTURE_HINT, path,
                  strerror(errno));
        return -1;
    }
    size_t cap = 1u << 16, len = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            set_error(err, errlen, "%s: out of memory reading the fixture", path);
            fclose(f);
            return -1;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap) break; /* end of file or an error, told apart below */
        unsigned char *bigger = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
        if (!bigger) free(buf);
        buf = bigger;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        set_error(err, errlen, "%s: read error", path);
        free(buf);
        return -1;
    }
    *out = buf;
    *size = len;
    return 0;
}

/* ---- the cursor -------------------------------------------------------------------- */

static int need(cursor *c, size_t n, const char *what) {
    size_t left = c->size - c->pos;
    if (n <= left) return 0;
    set_error(c->err, c->errlen,
              "%s: truncated at byte %zu reading %s (needs %zu bytes, %zu left); " VH_FIXTURE_HINT,
              c->path, c->pos, what, n, left);
    return -1;
}

static uint32_t decode_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int read_u32(cursor *c, const char *what, uint32_t *out) {
    if (need(c, 4, what)) return -1;
    *out = decode_u32(c->buf + c->pos);
    c->pos += 4;
    return 0;
}

/* A u32 length, then that many bytes, returned NUL-terminated in *out. */
static int read_string(cursor *c, const char *what, char **out) {
    *out = NULL;
    uint32_t len;
    if (read_u32(c, what, &len)) return -1;
    if (len > MAX_STRING) {
        set_error(c->err, c->errlen, "%s: %s at byte %zu is %u bytes long (at most %u); " VH_FIXTURE_HINT,
                  c->path, what, c->pos - 4, len, MAX_STRING);
        return -1;
    }
    if (need(c, len, what)) return -1;
    if (memchr(c->buf + c->pos, '\0', len)) {
        set_error(c->err, c->errlen, "%s: %s at byte %zu holds a NUL byte; " VH_FIXTURE_HINT,
                  c->path, what, c->pos);
        return -1;
    }
    char *s = malloc((size_t)len + 1);
    if (!s) {
        set_error(c->err, c->errlen, "%s: out of memory", c->path);
        return -1;
    }
    memcpy(s, c->buf + c->pos, len);
    s[len] = '\0';
    c->pos += len;
    *out = s;
    return 0;
}

/* A count of entries each at least min_bytes long must fit in what is left. */
static int read_count(cursor *c, const char *what, size_t min_bytes, size_t *out) {
    uint32_t n;
    if (read_u32(c, what, &n)) return -1;
    if ((size_t)n > (c->size - c->pos) / min_bytes) {
        set_error(c->err, c->errlen,
                  "%s: truncated: %s says %u entries but only %zu bytes follow; " VH_FIXTURE_HINT,
                  c->path, what, n, c->size - c->pos);
        return -1;
    }
    *out = n;
    return 0;
}

/* ---- parsing ----------------------------------------------------------------------- */

static int read_header(cursor *c, uint32_t *version) {
    if (need(c, 4, "the magic")) return -1;
    if (memcmp(c->buf, VH_FIXTURE_MAGIC, 4) != 0) {
        char shown[4 * 4 + 1];
        size_t k = 0;
        for (size_t i = 0; i < 4; i++) {
            unsigned char ch = c->buf[i];
            k += (size_t)snprintf(shown + k, sizeof shown - k, ch >= 32 && ch < 127 ? "%c" : "\\x%02x",
                                  ch);
        }
        set_error(c->err, c->errlen, "%s: not a vithost fixture: magic \"%s\", want \"%s\"",
                  c->path, shown, VH_FIXTURE_MAGIC);
        return -1;
    }
    c->pos = 4;
    if (read_u32(c, "the version", version)) return -1;
    if (*version != VH_FIXTURE_VERSION) {
        set_error(c->err, c->errlen,
                  "%s: fixture format version %u, this reader reads version %u: the fixture is "
                  "stale; " VH_FIXTURE_HINT,
                  c->path, *version, VH_FIXTURE_VERSION);
        return -1;
    }
    return 0;
}

static int read_config(cursor *c, vh_fixture *fx) {
    size_t n;
    if (read_count(c, "the config count", 8, &n)) return -1;
    fx->config = calloc(n ? n : 1, sizeof *fx->config);
    if (!fx->config) {
        set_error(c->err, c->errlen, "%s: out of memory", c->path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        vh_fixture_kv *kv = &fx->config[i];
        char *key = NULL, *value = NULL;
        char what[64];
        snprintf(what, sizeof what, "config key %zu", i);
        if (read_string(c, what, &key)) return -1;
        kv->key = key;
        fx->config_count = i + 1;
        snprintf(what, sizeof what, "config value %zu", i);
        if (read_string(c, what, &value)) return -1;
        kv->value = value;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(fx->config[j].key, key) == 0) {
                set_error(c->err, c->errlen, "%s: config key \"%s\" appears twice; " VH_FIXTURE_HINT,
                          c->path, key);
                return -1;
            }
        }
    }
    return 0;
}

static int read_tensor(cursor *c, vh_fixture *fx, size_t index) {
    vh_fixture_array *t = &fx->tensors[index];
    char *name = NULL;
    char what[64 + MAX_STRING];
    snprintf(what, sizeof what, "tensor %zu name", index);
    if (read_string(c, what, &name)) return -1;
    t->name = name;
    fx->tensor_count = index + 1;
    for (size_t j = 0; j < index; j++) {
        if (strcmp(fx->tensors[j].name, name) == 0) {
            set_error(c->err, c->errlen, "%s: tensor \"%s\" appears twice; " VH_FIXTURE_HINT,
                      c->path, name);
            return -1;
        }
    }

    uint32_t dtype, ndim;
    snprintf(what, sizeof what, "tensor \"%s\" dtype", name);
    if (read_u32(c, what, &dtype)) return -1;
    if (dtype != VH_FIXTURE_DTYPE_F32 && dtype != VH_FIXTURE_DTYPE_I32) {
        set_error(c->err, c->errlen, "%s: tensor \"%s\" has unknown dtype code %u (0 f32, 1 i32); "
                  VH_FIXTURE_HINT, c->path, name, dtype);
        return -1;
    }
    t->dtype = (vh_fixture_dtype)dtype;
    snprintf(what, sizeof what, "tensor \"%s\" ndim", name);
    if (read_u32(c, what, &ndim)) return -1;
    if (ndim > VH_FIXTURE_MAX_DIMS) {
        set_error(c->err, c->errlen, "%s: tensor \"%s\" has %u dims (at most %d); " VH_FIXTURE_HINT,
                  c->path, name, ndim, VH_FIXTURE_MAX_DIMS);
        return -1;
    }
    t->ndim = ndim;
    size_t numel = 1;
    snprintf(what, sizeof what, "tensor \"%s\" dims", name);
    for (uint32_t d = 0; d < ndim; d++) {
        uint32_t dim;
        if (read_u32(c, what, &dim)) return -1;
        t->dims[d] = dim;
        if (dim != 0 && numel > SIZE_MAX / 4 / dim) {
            set_error(c->err, c->errlen, "%s: tensor \"%s\" is impossibly large; " VH_FIXTURE_HINT,
                      c->path, name);
            return -1;
        }
        numel *= dim;
    }
    t->numel = numel;

    snprintf(what, sizeof what, "tensor \"%s\" data", name);
    if (need(c, numel * 4, what)) return -1;
    /* float and int32_t share size and alignment: one buffer serves both. */
    unsigned char *data = malloc(numel ? numel * 4 : 4);
    if (!data) {
        set_error(c->err, c->errlen, "%s: out of memory for tensor \"%s\"", c->path, name);
        return -1;
    }
    for (size_t i = 0; i < numel; i++) {
        uint32_t bits = decode_u32(c->buf + c->pos + 4 * i);
        memcpy(data + 4 * i, &bits, 4);
    }
    c->pos += numel * 4;
    t->data = data;
    t->f32 = t->dtype == VH_FIXTURE_DTYPE_F32 ? (const float *)(const void *)data : NULL;
    t->i32 = t->dtype == VH_FIXTURE_DTYPE_I32 ? (const int32_t *)(const void *)data : NULL;
    return 0;
}

static int parse(cursor *c, vh_fixture *fx) {
    if (read_header(c, &fx->version)) return -1;
    if (read_config(c, fx)) return -1;
    size_t n;
    if (read_count(c, "the tensor count", 12, &n)) return -1;
    fx->tensors = calloc(n ? n : 1, sizeof *fx->tensors);
    if (!fx->tensors) {
        set_error(c->err, c->errlen, "%s: out of memory", c->path);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (read_tensor(c, fx, i)) return -1;
    if (c->pos != c->size) {
        set_error(c->err, c->errlen,
                  "%s: %zu trailing bytes after the last tensor (at byte %zu); " VH_FIXTURE_HINT,
                  c->path, c->size - c->pos, c->pos);
        return -1;
    }
    return 0;
}

/* ---- public ------------------------------------------------------------------------ */

int vh_fixture_load(const char *path, vh_fixture *fx, char *errbuf, size_t errlen) {
    if (errbuf && errlen) errbuf[0] = '\0';
    if (!fx) {
        set_error(errbuf, errlen, "vh_fixture_load: no fixture to fill");
        return -1;
    }
    memset(fx, 0, sizeof *fx);
    if (!path) {
        set_error(errbuf, errlen, "vh_fixture_load: no path");
        return -1;
    }
    unsigned char *buf;
    size_t size;
    if (read_whole_file(path, &buf, &size, errbuf, errlen)) return -1;
    cursor c = {.buf = buf, .size = size, .pos = 0, .path = path, .err = errbuf, .errlen = errlen};
    fx->path = malloc(strlen(path) + 1);
    int rc = -1;
    if (!fx->path)
        set_error(errbuf, errlen, "%s: out of memory", path);
    else {
        strcpy(fx->path, path);
        rc = parse(&c, fx);
    }
    free(buf);
    if (rc) vh_fixture_free(fx);
    return rc;
}

void vh_fixture_free(vh_fixture *fx) {
    if (!fx) return;
    for (size_t i = 0; i < fx->config_count; i++) {
        free((void *)fx->config[i].key);
        free((void *)fx->config[i].value);
    }
    free(fx->config);
    for (size_t i = 0; i < fx->tensor_count; i++) {
        free((void *)fx->tensors[i].name);
        free((void *)fx->tensors[i].data);
    }
    free(fx->tensors);
    free(fx->path);
    memset(fx, 0, sizeof *fx);
}

const char *vh_fixture_config(const vh_fixture *fx, const char *key) {
    if (!fx || !key) return NULL;
    for (size_t i = 0; i < fx->config_count; i++)
        if (strcmp(fx->config[i].key, key) == 0) return fx->config[i].value;
    return NULL;
}

int vh_fixture_config_int(const vh_fixture *fx, const char *key, int64_t *out) {
    const char *text = vh_fixture_config(fx, key);
    if (!text || !*text || !out) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end) return -1;
    *out = (int64_t)v;
    return 0;
}

int vh_fixture_config_double(const vh_fixture *fx, const char *key, double *out) {
    const char *text = vh_fixture_config(fx, key);
    if (!text || !*text || !out) return -1;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

const vh_fixture_array *vh_fixture_tensor(const vh_fixture *fx, const char *name) {
    if (!fx || !name) return NULL;
    for (size_t i = 0; i < fx->tensor_count; i++)
        if (strcmp(fx->tensors[i].name, name) == 0) return &fx->tensors[i];
    return NULL;
}

double vh_fixture_error(const float *got, const float *want, size_t n, size_t *where) {
    double max_diff = 0.0, max_want = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        if (!isfinite(g) || !isfinite(w)) {
            if (where) *where = i;
            return INFINITY;
        }
        double d = fabs(g - w);
        if (d > max_diff) {
            max_diff = d;
            at = i;
        }
        if (fabs(w) > max_want) max_want = fabs(w);
    }
    if (where) *where = at;
    return max_diff / (max_want > (double)FLT_MIN ? max_want : (double)FLT_MIN);
}

bool vh_fixture_compare(const char *name, const float *got, const float *want, size_t n,
                        double rel_tol, char *report, size_t len) {
    if (!name) name = "?";
    if (n > 0 && (!got || !want)) {
        set_error(report, len, "%s: FAIL no data to compare", name);
        return false;
    }
    size_t at = 0;
    double err = vh_fixture_error(got, want, n, &at);
    bool ok = err <= rel_tol;
    if (n == 0) {
        set_error(report, len, "%s: ok   (no elements)", name);
        return true;
    }
    double max_want = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i]) && fabs((double)want[i]) > max_want) max_want = fabs((double)want[i]);
    set_error(report, len, "%s: %s err %.2e %s tol %.2e (at [%zu] got %.9g want %.9g, max|want| %.3g, n %zu)",
              name, ok ? "ok  " : "FAIL", err, ok ? "<=" : ">", rel_tol, at, (double)got[at],
              (double)want[at], max_want, n);
    return ok;
}
