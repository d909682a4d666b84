/* safetensors.c - the safetensors reader (hostile-input safe) and writer. */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vithost/vh_runtime.h"

#define ST_MAX_HEADER (100u << 20) /* the library's own limit */

/* ---- a JSON reader for the header's one shape -------------------------- */

typedef struct json {
    const char *p, *end;
    const char *path;
    vh_diag *d;
} json;

static vh_status json_error(json *j, const char *what) {
    return diag_set(j->d, VH_STATUS_ERR_FORMAT,
                    "%s: not a safetensors file: bad header JSON (%s)", j->path, what);
}

static void skip_ws(json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

static int expect(json *j, char c) {
    skip_ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

/* A JSON string without escapes beyond \" \\ \/ (tensor names are plain). */
static vh_status parse_string(json *j, char **out) {
    skip_ws(j);
    if (j->p >= j->end || *j->p != '"') return json_error(j, "expected a string");
    j->p++;
    size_t cap = 32, n = 0;
    char *s = malloc(cap);
    if (!s) return diag_set(j->d, VH_STATUS_ERR_NOMEM, "out of memory");
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') {
            if (j->p >= j->end) break;
            c = *j->p++;
            if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
            else if (c != '"' && c != '\\' && c != '/') {
                free(s);
                return json_error(j, "unsupported escape in a string");
            }
        }
        if (n + 2 > cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) {
                free(s);
                return diag_set(j->d, VH_STATUS_ERR_NOMEM, "out of memory");
            }
            s = t;
        }
        s[n++] = c;
    }
    if (j->p >= j->end) {
        free(s);
        return json_error(j, "unterminated string");
    }
    j->p++;
    s[n] = '\0';
    *out = s;
    return VH_STATUS_OK;
}

static vh_status parse_uint(json *j, uint64_t *out) {
    skip_ws(j);
    uint64_t v = 0;
    const char *start = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        uint64_t digit = (uint64_t)(*j->p - '0');
        if (v > (UINT64_MAX - digit) / 10) return json_error(j, "number too large");
        v = v * 10 + digit;
        j->p++;
    }
    if (j->p == start) return json_error(j, "expected a non-negative integer");
    *out = v;
    return VH_STATUS_OK;
}

static vh_status parse_uint_array(json *j, uint64_t *vals, int max, int *count) {
    if (!expect(j, '[')) return json_error(j, "expected '['");
    *count = 0;
    if (expect(j, ']')) return VH_STATUS_OK;
    do {
        if (*count >= max) return json_error(j, "too many dimensions");
        vh_status st = parse_uint(j, &vals[(*count)++]);
        if (st != VH_STATUS_OK) return st;
    } while (expect(j, ','));
    if (!expect(j, ']')) return json_error(j, "expected ']'");
    return VH_STATUS_OK;
}

static vh_status parse_tensor(json *j, vh_st_tensor *t) {
    if (!expect(j, '{')) return json_error(j, "expected a tensor object");
    int have_dtype = 0, have_shape = 0, have_offsets = 0;
    do {
        char *key = NULL;
        vh_status st = parse_string(j, &key);
        if (st != VH_STATUS_OK) return st;
        if (!expect(j, ':')) {
            free(key);
            return json_error(j, "expected ':'");
        }
        if (strcmp(key, "dtype") == 0) {
            char *v = NULL;
            st = parse_string(j, &v);
            if (st == VH_STATUS_OK) {
                snprintf(t->dtype, sizeof t->dtype, "%s", v);
                have_dtype = 1;
            }
            free(v);
        } else if (strcmp(key, "shape") == 0) {
            uint64_t dims[VH_ST_MAX_DIMS];
            int n = 0;
            st = parse_uint_array(j, dims, VH_ST_MAX_DIMS, &n);
            t->ndim = n;
            t->numel = 1;
            /* Checked before each product: the count stays <= 2^40, so no
             * multiplication can overflow ([2^32, 2^32] is refused, not 0). */
            for (int i = 0; i < n && st == VH_STATUS_OK; i++) {
                const uint64_t limit = (uint64_t)1 << 40;
                t->shape[i] = dims[i] <= limit ? (int64_t)dims[i] : 0;
                if (dims[i] > limit) st = json_error(j, "dimension too large");
                else if (dims[i] != 0 && (uint64_t)t->numel > limit / dims[i])
                    st = json_error(j, "tensor too large (more than 2^40 values)");
                else t->numel *= (int64_t)dims[i];
            }
            have_shape = 1;
        } else if (strcmp(key, "data_offsets") == 0) {
            uint64_t v[2];
            int n = 0;
            st = parse_uint_array(j, v, 2, &n);
            if (st == VH_STATUS_OK && n != 2) st = json_error(j, "data_offsets needs 2 numbers");
            t->begin = v[0], t->end = v[1];
            have_offsets = 1;
        } else {
            st = json_error(j, "unknown tensor field");
        }
        free(key);
        if (st != VH_STATUS_OK) return st;
    } while (expect(j, ','));
    if (!expect(j, '}')) return json_error(j, "expected '}'");
    if (!have_dtype || !have_shape || !have_offsets)
        return json_error(j, "a tensor lacks dtype, shape or data_offsets");
    return VH_STATUS_OK;
}

static vh_status parse_metadata(json *j, vh_st_file *f) {
    if (!expect(j, '{')) return json_error(j, "__metadata__ is not an object");
    if (expect(j, '}')) return VH_STATUS_OK;
    do {
        char *k = NULL, *v = NULL;
        vh_status st = parse_string(j, &k);
        if (st == VH_STATUS_OK && !expect(j, ':')) st = json_error(j, "expected ':'");
        if (st == VH_STATUS_OK) st = parse_string(j, &v);
        if (st == VH_STATUS_OK) {
            char **ks = realloc(f->meta_keys, (size_t)(f->meta_count + 1) * sizeof *ks);
            if (ks) f->meta_keys = ks;
            char **vs = realloc(f->meta_values, (size_t)(f->meta_count + 1) * sizeof *vs);
            if (vs) f->meta_values = vs;
            if (!ks || !vs) st = diag_set(j->d, VH_STATUS_ERR_NOMEM, "out of memory");
        }
        if (st != VH_STATUS_OK) {
            free(k);
            free(v);
            return st;
        }
        f->meta_keys[f->meta_count] = k;
        f->meta_values[f->meta_count++] = v;
    } while (expect(j, ','));
    if (!expect(j, '}')) return json_error(j, "expected '}' after __metadata__");
    return VH_STATUS_OK;
}

static size_t dtype_bytes(const char *dtype) {
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32") || !strcmp(dtype, "U32")) return 4;
    if (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16") || !strcmp(dtype, "I16")) return 2;
    if (!strcmp(dtype, "F64") || !strcmp(dtype, "I64") || !strcmp(dtype, "U64")) return 8;
    if (!strcmp(dtype, "U8") || !strcmp(dtype, "I8") || !strcmp(dtype, "BOOL")) return 1;
    return 0;
}

static vh_status parse_header(vh_st_file *f, const char *text, size_t len, vh_diag *d) {
    json j = {text, text + len, f->path, d};
    if (!expect(&j, '{')) return json_error(&j, "expected '{'");
    if (expect(&j, '}')) return VH_STATUS_OK;
    int cap = 0;
    do {
        char *name = NULL;
        vh_status st = parse_string(&j, &name);
        if (st == VH_STATUS_OK && !expect(&j, ':')) st = json_error(&j, "expected ':'");
        if (st == VH_STATUS_OK && strcmp(name, "__metadata__") == 0) {
            free(name);
            st = parse_metadata(&j, f);
            if (st != VH_STATUS_OK) return st;
            continue;
        }
        if (st == VH_STATUS_OK && f->count == cap) {
            cap = cap ? 2 * cap : 64;
            vh_st_tensor *t = realloc(f->tensors, (size_t)cap * sizeof *t);
            if (!t) st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
            else f->tensors = t;
        }
        if (st != VH_STATUS_OK) {
            free(name);
            return st;
        }
        if (st_find(f, name)) {
            st = diag_set(d, VH_STATUS_ERR_FORMAT,
                          "%s: tensor '%s' is named twice in the header (a damaged or "
                          "hand-made file; each name must be unique)",
                          f->path, name);
            free(name);
            return st;
        }
        vh_st_tensor *t = &f->tensors[f->count++];
        memset(t, 0, sizeof *t);
        t->name = name;
        st = parse_tensor(&j, t);
        if (st != VH_STATUS_OK) return st;
    } while (expect(&j, ','));
    if (!expect(&j, '}')) return json_error(&j, "expected '}' at the end");
    skip_ws(&j);
    if (j.p != j.end) return json_error(&j, "text after the header object");
    return VH_STATUS_OK;
}

static int compare_begin(const void *a, const void *b) {
    const vh_st_tensor *x = *(const vh_st_tensor *const *)a, *y = *(const vh_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* As the safetensors library requires: the tensors, in offset order, tile
 * the data area exactly: no overlap (two names sharing bytes), no gap, no
 * bytes after the last (a file damaged or spliced by hand). */
static vh_status check_tiling(const vh_st_file *f, vh_diag *d) {
    uint64_t data_size = f->size - f->data_start;
    if (f->count == 0) {
        if (data_size == 0) return VH_STATUS_OK;
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: %llu data bytes but no tensor in the header", f->path,
                        (unsigned long long)data_size);
    }
    size_t n = (size_t)(unsigned)f->count;
    const vh_st_tensor **order = malloc(n * sizeof *order);
    if (!order) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < f->count; i++) order[i] = &f->tensors[i];
    qsort(order, n, sizeof *order, compare_begin);
    vh_status st = VH_STATUS_OK;
    uint64_t at = 0;
    const vh_st_tensor *prev = NULL;
    for (int i = 0; i < f->count && st == VH_STATUS_OK; i++) {
        const vh_st_tensor *t = order[i];
        if (t->begin < at)
            st = diag_set(d, VH_STATUS_ERR_FORMAT,
                          "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap "
                          "(data_offsets must not share bytes)",
                          f->path, prev->name, (unsigned long long)prev->begin,
                          (unsigned long long)prev->end, t->name, (unsigned long long)t->begin,
                          (unsigned long long)t->end);
        else if (t->begin > at)
            st = diag_set(d, VH_STATUS_ERR_FORMAT,
                          "%s: data bytes [%llu, %llu) belong to no tensor (tensor '%s' starts "
                          "at %llu; data_offsets must tile the data)",
                          f->path, (unsigned long long)at, (unsigned long long)t->begin,
                          t->name, (unsigned long long)t->begin);
        at = t->end;
        prev = t;
    }
    if (st == VH_STATUS_OK && at != data_size)
        st = diag_set(d, VH_STATUS_ERR_FORMAT,
                      "%s: %llu bytes after the last tensor ('%s' ends at %llu of %llu data "
                      "bytes; a damaged or spliced file?)",
                      f->path, (unsigned long long)(data_size - at), prev->name,
                      (unsigned long long)at, (unsigned long long)data_size);
    free(order);
    return st;
}

/* Every tensor's bytes are where its dtype and shape say, inside the file. */
static vh_status check_tensors(const vh_st_file *f, vh_diag *d) {
    uint64_t data_size = f->size - f->data_start;
    for (int i = 0; i < f->count; i++) {
        const vh_st_tensor *t = &f->tensors[i];
        size_t eb = dtype_bytes(t->dtype);
        if (!eb)
            return diag_set(d, VH_STATUS_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'",
                            f->path, t->name, t->dtype);
        if (t->end < t->begin || t->end - t->begin != (uint64_t)t->numel * eb)
            return diag_set(d, VH_STATUS_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] do not hold %lld %s "
                            "values",
                            f->path, t->name, (unsigned long long)t->begin,
                            (unsigned long long)t->end, (long long)t->numel, t->dtype);
        if (t->end > data_size)
            return diag_set(d, VH_STATUS_ERR_FORMAT,
                            "%s: tensor '%s' ends at byte %llu of the data, but the file has "
                            "%llu (truncated?)",
                            f->path, t->name, (unsigned long long)t->end,
                            (unsigned long long)data_size);
    }
    return check_tiling(f, d);
}

vh_status st_read(vh_st_file *out, const char *path, vh_diag *d) {
    memset(out, 0, sizeof *out);
    out->path = strdup(path);
    if (!out->path) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    int fd = open(path, O_RDONLY);
    if (fd < 0) return diag_set(d, VH_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return diag_set(d, VH_STATUS_ERR_IO, "%s: not a regular file", path);
    }
    out->size = (size_t)sb.st_size;
    if (out->size < 8) {
        close(fd);
        return diag_set(d, VH_STATUS_ERR_FORMAT, "%s: not a safetensors file (%zu bytes)", path,
                        out->size);
    }
    /* Mapped, not read: a rank that loads its piece of a sharded tensor
     * touches those pages only, and ranks on one machine share the page
     * cache. Checkpoints are replaced by rename, never rewritten in place,
     * so the mapped file does not change under the reader. */
    void *map = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED)
        return diag_set(d, VH_STATUS_ERR_IO, "%s: cannot map: %s", path, strerror(err));
    out->bytes = map;
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--) header = header << 8 | out->bytes[i];
    if (header > ST_MAX_HEADER || header > out->size - 8)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: not a safetensors file (header length %llu does not fit in %zu "
                        "bytes)",
                        path, (unsigned long long)header, out->size);
    out->data_start = 8 + (size_t)header;
    vh_status st = parse_header(out, (const char *)out->bytes + 8, (size_t)header, d);
    if (st == VH_STATUS_OK) st = check_tensors(out, d);
    return st;
}

void st_free(vh_st_file *f) {
    for (int i = 0; i < f->count; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->meta_count; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->tensors);
    if (f->bytes) munmap((void *)f->bytes, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const vh_st_tensor *st_find(const vh_st_file *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const vh_st_file *f, const char *key) {
    for (int i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

vh_status st_read_f32_range(const vh_st_file *f, const vh_st_tensor *t, int64_t offset,
                           int64_t count, float *out, vh_diag *d) {
    if (offset < 0 || count < 0 || offset > t->numel - count)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: tensor '%s' has %lld values, not elements %lld..%lld", f->path,
                        t->name, (long long)t->numel, (long long)offset,
                        (long long)(offset + count));
    const unsigned char *base = f->bytes + f->data_start + t->begin;
    if (!strcmp(t->dtype, "F32")) {
        memcpy(out, base + 4 * offset, (size_t)count * sizeof(float));
    } else if (!strcmp(t->dtype, "F16") || !strcmp(t->dtype, "BF16")) {
        int bf = !strcmp(t->dtype, "BF16");
        const unsigned char *src = base + 2 * offset;
        for (int64_t i = 0; i < count; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            out[i] = bf ? vh_bf16_to_f32(h) : vh_f16_to_f32(h);
        }
    } else {
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: tensor '%s' is %s; parameters must be F32, F16 or BF16", f->path,
                        t->name, t->dtype);
    }
    return VH_STATUS_OK;
}

vh_status st_read_f32(const vh_st_file *f, const vh_st_tensor *t, float *out, int64_t count,
                      vh_diag *d) {
    if (t->numel != count)
        return diag_set(d, VH_STATUS_ERR_FORMAT, "%s: tensor '%s' has %lld values, expected %lld",
                        f->path, t->name, (long long)t->numel, (long long)count);
    return st_read_f32_range(f, t, 0, count, out, d);
}

/* ---- writer -------------------------------------------------------------- */

void st_writer_init(vh_st_writer *w) { memset(w, 0, sizeof *w); }

vh_status st_writer_add(vh_st_writer *w, const char *name, int32_t ndim, const int64_t *shape,
                        const float *data, vh_diag *d) {
    if (ndim < 0 || ndim > VH_ST_MAX_DIMS || strpbrk(name, "\"\\"))
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "cannot write tensor '%s'", name);
    if (w->count == w->capacity) {
        int cap = w->capacity ? 2 * w->capacity : 64;
        vh_st_entry *e = realloc(w->entries, (size_t)cap * sizeof *e);
        if (!e) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
        w->entries = e;
        w->capacity = cap;
    }
    vh_st_entry *e = &w->entries[w->count];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    e->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->data = data;
    w->count++;
    return VH_STATUS_OK;
}

vh_status st_writer_meta(vh_st_writer *w, const char *key, const char *value, vh_diag *d) {
    if (strpbrk(key, "\"\\\n") || strpbrk(value, "\"\\\n"))
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "metadata '%s' needs escaping", key);
    char **ks = realloc(w->meta_keys, (size_t)(w->meta_count + 1) * sizeof *ks);
    if (ks) w->meta_keys = ks;
    char **vs = realloc(w->meta_values, (size_t)(w->meta_count + 1) * sizeof *vs);
    if (vs) w->meta_values = vs;
    if (!ks || !vs) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    w->meta_keys[w->meta_count] = strdup(key);
    w->meta_values[w->meta_count] = strdup(value);
    w->meta_count++;
    return VH_STATUS_OK;
}

static int64_t entry_numel(const vh_st_entry *e) {
    int64_t n = 1;
    for (int32_t i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

/* Appends to a growing string; returns 0 on allocation failure. */
static int append(char **s, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int append(char **s, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*s + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0) return 0;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return 1;
        }
        char *t = realloc(*s, *cap * 2 + (size_t)n);
        if (!t) return 0;
        *s = t;
        *cap = *cap * 2 + (size_t)n;
    }
}

static int write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return 0;
        }
        p += w;
        n -= (size_t)w;
    }
    return 1;
}

vh_status st_stream_open(vh_st_stream *s, const vh_st_writer *w, const char *path,
                         vh_diag *d) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    size_t cap = 4096, len = 0;
    char *h = malloc(cap);
    if (!h) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    int ok = append(&h, &len, &cap, "{\"__metadata__\":{");
    for (int i = 0; i < w->meta_count && ok; i++)
        ok = append(&h, &len, &cap, "%s\"%s\":\"%s\"", i ? "," : "", w->meta_keys[i],
                    w->meta_values[i]);
    ok = ok && append(&h, &len, &cap, "}");
    uint64_t offset = 0;
    for (int i = 0; i < w->count && ok; i++) {
        const vh_st_entry *e = &w->entries[i];
        ok = append(&h, &len, &cap, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", e->name);
        for (int32_t k = 0; k < e->ndim && ok; k++)
            ok = append(&h, &len, &cap, "%s%lld", k ? "," : "", (long long)e->shape[k]);
        uint64_t bytes = (uint64_t)entry_numel(e) * 4u;
        ok = ok && append(&h, &len, &cap, "],\"data_offsets\":[%llu,%llu]}",
                          (unsigned long long)offset, (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    ok = ok && append(&h, &len, &cap, "}");
    /* The library pads the header with spaces to a multiple of 8. */
    while (ok && len % 8) ok = append(&h, &len, &cap, " ");
    if (ok) {
        s->path = strdup(path);
        s->tmp = malloc(strlen(path) + 5);
        ok = s->path && s->tmp;
    }
    if (!ok) {
        free(h);
        free(s->tmp), s->tmp = NULL; /* no file made yet: nothing to unlink */
        st_stream_abort(s);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory writing %s", path);
    }
    sprintf(s->tmp, "%s.tmp", path);
    s->fd = open(s->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (s->fd < 0) {
        int err = errno;
        free(h);
        diag_set(d, VH_STATUS_ERR_IO, "%s: %s", s->tmp, strerror(err));
        free(s->tmp), s->tmp = NULL; /* nothing to unlink */
        st_stream_abort(s);
        return VH_STATUS_ERR_IO;
    }
    s->w = w;
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)len >> (8 * i));
    ok = write_all(s->fd, lenbuf, 8) && write_all(s->fd, h, len);
    free(h);
    if (!ok) {
        int err = errno;
        diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(err));
        st_stream_abort(s);
        return VH_STATUS_ERR_IO;
    }
    return VH_STATUS_OK;
}

vh_status st_stream_put(vh_st_stream *s, const float *data, vh_diag *d) {
    if (!s->w || s->next >= s->w->count)
        return diag_set(d, VH_STATUS_ERR_INTERNAL, "%s: more tensors written than declared",
                        s->path ? s->path : "safetensors stream");
    const vh_st_entry *e = &s->w->entries[s->next];
    if (!write_all(s->fd, data, (size_t)entry_numel(e) * 4u)) {
        int err = errno;
        diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", s->path, strerror(err));
        st_stream_abort(s);
        return VH_STATUS_ERR_IO;
    }
    s->next++;
    return VH_STATUS_OK;
}

vh_status st_stream_close(vh_st_stream *s, vh_diag *d) {
    if (!s->w) return diag_set(d, VH_STATUS_ERR_INTERNAL, "safetensors stream not open");
    if (s->next != s->w->count) {
        diag_set(d, VH_STATUS_ERR_INTERNAL, "%s: %d of %d tensors written", s->path, s->next,
                 s->w->count);
        st_stream_abort(s);
        return VH_STATUS_ERR_INTERNAL;
    }
    int ok = fsync(s->fd) == 0;
    int err = errno;
    if (close(s->fd) != 0 && ok) ok = 0, err = errno;
    s->fd = -1;
    if (ok && rename(s->tmp, s->path) != 0) ok = 0, err = errno;
    if (!ok) {
        diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", s->path, strerror(err));
        st_stream_abort(s);
        return VH_STATUS_ERR_IO;
    }
    free(s->tmp);
    free(s->path);
    memset(s, 0, sizeof *s);
    s->fd = -1;
    return VH_STATUS_OK;
}

void st_stream_abort(vh_st_stream *s) {
    if (s->fd >= 0) close(s->fd);
    if (s->tmp) unlink(s->tmp);
    free(s->tmp);
    free(s->path);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

vh_status st_writer_save(const vh_st_writer *w, const char *path, vh_diag *d) {
    vh_st_stream s;
    vh_status st = st_stream_open(&s, w, path, d);
    for (int i = 0; st == VH_STATUS_OK && i < w->count; i++) st = st_stream_put(&s, w->entries[i].data, d);
    if (st == VH_STATUS_OK) st = st_stream_close(&s, d);
    return st;
}

void st_writer_free(vh_st_writer *w) {
    for (int i = 0; i < w->count; i++) free(w->entries[i].name);
    for (int i = 0; i < w->meta_count; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->entries);
    free(w->meta_keys);
    free(w->meta_values);
    memset(w, 0, sizeof *w);
}
