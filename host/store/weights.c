/* weights.c - model parameters <-> safetensors, behind the model's own
 * load_weights (see weights.h). */
#define _POSIX_C_SOURCE 200809L
#include "weights.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

/* ---- checksums of a checkpoint folder ---------------------------------------- */

/* CRC-32 as zlib's crc32() computes it (reflected, polynomial 0xEDB88320),
 * so `python -c "import zlib; ..."` checks a file by hand. */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    static uint32_t table[256];
    if (!table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    }
    crc = ~crc;
    while (n--) crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

int weights_file_crc32(const char *path, uint32_t *crc, uint64_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char buf[1 << 16];
    size_t n;
    *crc = 0;
    *bytes = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        *crc = crc32_update(*crc, buf, n);
        *bytes += n;
    }
    int ok = !ferror(f);
    if (!ok && !errno) errno = EIO;
    fclose(f);
    return ok;
}

char *weights_read_state(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0) buf = malloc((size_t)n + 1);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    if (buf && (got != (size_t)n || ferror(f))) {
        free(buf);
        buf = NULL;
        errno = EIO;
    }
    fclose(f);
    if (buf) buf[got] = '\0';
    return buf;
}

/* "key": "1a2b3c4d" -> 1; no key -> 0; not 8 hex digits -> -1. */
static int state_crc(const char *text, const char *key, uint32_t *out) {
    char pattern[320];
    snprintf(pattern, sizeof pattern, "\"%s\": \"", key);
    const char *p = strstr(text, pattern);
    if (!p) return 0;
    p += strlen(pattern);
    char *end;
    unsigned long v = strtoul(p, &end, 16);
    if (end != p + 8 || *end != '"') return -1;
    *out = (uint32_t)v;
    return 1;
}

/* "key": 123 -> 123; -1 without one. */
static int64_t state_bytes(const char *text, const char *key) {
    char pattern[320];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *p = strstr(text, pattern);
    if (!p) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(p + strlen(pattern), &end, 10);
    return errno == 0 && end != p + strlen(pattern) && v >= 0 ? (int64_t)v : -1;
}

/* The file against what state.json says of it (size, then CRC-32). */
static vh_status verify_against(const char *path, const char *state_path, const char *text,
                                const char *name, vh_diag *d) {
    char key[300];
    snprintf(key, sizeof key, "%s_crc32", name);
    uint32_t want = 0, got = 0;
    uint64_t bytes = 0;
    int has = state_crc(text, key, &want);
    if (has == 0) return VH_STATUS_OK;
    if (has < 0)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: \"%s\" is not 8 hex digits, so %s cannot be checked (the file "
                        "was edited or damaged)",
                        state_path, key, path);
    snprintf(key, sizeof key, "%s_bytes", name);
    int64_t want_bytes = state_bytes(text, key);
    if (!weights_file_crc32(path, &got, &bytes))
        return diag_set(d, VH_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    if (want_bytes >= 0 && (uint64_t)want_bytes != bytes)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s is damaged: %llu bytes, but %s says %lld (truncated or "
                        "overwritten); copy it again, or use another checkpoint",
                        path, (unsigned long long)bytes, state_path, (long long)want_bytes);
    if (got != want)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s is damaged: its CRC-32 is %08x, but %s says %08x (corrupted on "
                        "disk or in a copy); copy it again, or use another checkpoint",
                        path, (unsigned)got, state_path, (unsigned)want);
    return VH_STATUS_OK;
}

vh_status weights_verify_file(const char *path, vh_diag *d) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t len = strlen(base), ext = strlen(".safetensors");
    if (len <= ext || strcmp(base + len - ext, ".safetensors") != 0) return VH_STATUS_OK;
    char name[256], state_path[4400];
    snprintf(name, sizeof name, "%.*s", (int)(len - ext), base);
    snprintf(state_path, sizeof state_path, "%.*sstate.json", (int)(base - path), path);
    char *text = weights_read_state(state_path);
    if (!text) /* no state.json: a plain file, nothing to check it against */
        return errno == ENOENT || errno == ENOTDIR
                   ? VH_STATUS_OK
                   : diag_set(d, VH_STATUS_ERR_IO, "%s: %s (it holds the checksum of %s)",
                              state_path, strerror(errno), path);
    vh_status st = verify_against(path, state_path, text, name, d);
    free(text);
    return st;
}

/* ---- the file as a vh_weights_source --------------------------------------- */

typedef struct weights_file {
    vh_st_file f;
    float **values;       /* per tensor: its f32 copy, made when first looked up */
    unsigned char *found; /* per tensor: looked up by a parameter */
    vh_diag problem;      /* the first tensor that could not be read as weights */
} weights_file;

/* A host-memory f32 view of a tensor (F16 and BF16 converted). A tensor
 * that is no float (or has too many dims) is "not there" for the model, and
 * the reason is kept for the error that follows. */
static int source_find(void *ctx, const char *name, vh_tensor *out) {
    weights_file *w = ctx;
    const vh_st_tensor *t = st_find(&w->f, name);
    if (!t) return 0;
    int i = (int)(t - w->f.tensors);
    w->found[i] = 1;
    if (t->ndim > VH_TENSOR_MAX_DIMS) {
        if (!w->problem.text[0])
            diag_set(&w->problem, VH_STATUS_ERR_FORMAT, "tensor '%s' has %d dims (at most %d)",
                     name, (int)t->ndim, VH_TENSOR_MAX_DIMS);
        return 0;
    }
    if (!w->values[i]) {
        float *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
        vh_diag why;
        if (!v || st_read_f32(&w->f, t, v, t->numel, &why) != VH_STATUS_OK) {
            if (!w->problem.text[0])
                diag_set(&w->problem, VH_STATUS_ERR_FORMAT, "%s",
                         v ? why.text : "out of memory reading a tensor");
            free(v);
            return 0;
        }
        w->values[i] = v;
    }
    memset(out, 0, sizeof *out);
    out->data = w->values[i];
    out->dtype = VH_DTYPE_F32;
    out->device = VH_DEVICE_KIND_CPU;
    out->ndim = t->ndim;
    for (int32_t k = 0; k < t->ndim; k++) out->shape[k] = t->shape[k];
    return 1;
}

static vh_status weights_file_open(weights_file *w, const char *path, vh_diag *d) {
    memset(w, 0, sizeof *w);
    vh_status st = st_read(&w->f, path, d);
    if (st != VH_STATUS_OK) return st;
    w->values = calloc((size_t)w->f.count + 1, sizeof *w->values);
    w->found = calloc((size_t)w->f.count + 1, 1);
    if (!w->values || !w->found) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    return VH_STATUS_OK;
}

/* The f32 copies made for one unit: a unit looks up its own tensors, so
 * none is kept past it (one found again is read again), and no rank holds
 * the whole model in f32 while it loads. */
static void weights_file_drop_copies(weights_file *w) {
    for (int i = 0; w->values && i < w->f.count; i++) {
        free(w->values[i]);
        w->values[i] = NULL;
    }
}

static void weights_file_close(weights_file *w) {
    for (int i = 0; w->values && i < w->f.count; i++) free(w->values[i]);
    free(w->values);
    free(w->found);
    st_free(&w->f);
}

/* ---- what the model did: a vh_weights_report -------------------------------- */

#define LIST_CAP 1024
#define LIST_NAMES 8 /* names printed before "and N more" */

typedef struct weights_report {
    int loaded;
    int reinitialised;
    char reinit_text[LIST_CAP]; /* "a, b (why); c (why)" */
    char last_why[256];
    size_t last_why_at;         /* where the last " (why)" starts in reinit_text */
} weights_report;

static void append(char *buf, const char *text) {
    size_t used = strlen(buf);
    if (used < LIST_CAP - 1) snprintf(buf + used, LIST_CAP - used, "%s", text);
}

/* Consecutive parameters with one reason share it: "head.weight, head.bias
 * (file has 1000 classes, the data 10)". */
static void report_record(void *ctx, const char *name, vh_weights_action action,
                          const char *why) {
    weights_report *r = ctx;
    if (action == VH_WEIGHTS_ACTION_LOADED) {
        r->loaded++;
        return;
    }
    r->reinitialised++;
    if (!why) why = "no reason given";
    if (r->reinitialised > LIST_NAMES) return;
    size_t len = strlen(r->reinit_text);
    if (len && strcmp(why, r->last_why) == 0) {
        r->reinit_text[r->last_why_at] = '\0'; /* the name goes before " (why)" */
        append(r->reinit_text, ", ");
    } else if (len) {
        append(r->reinit_text, "; ");
    }
    append(r->reinit_text, name);
    r->last_why_at = strlen(r->reinit_text);
    append(r->reinit_text, " (");
    append(r->reinit_text, why);
    append(r->reinit_text, ")");
    snprintf(r->last_why, sizeof r->last_why, "%s", why);
}

/* ---- loading ----------------------------------------------------------------- */

static void shape_text(char *buf, size_t len, int32_t ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int32_t i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

/* The host's loader for a model without load_weights: every parameter by
 * its name, with its exact shape, whatever the mode. */
static vh_status default_load_unit(vh_session *s, weights_file *w, int32_t u, float *values,
                                   weights_report *r, vh_diag *d) {
    const vh_unit_desc *unit = &s->table->units[u];
    for (int32_t p = 0; p < unit->num_params; p++) {
        const vh_param_desc *pd = &unit->params[p];
        vh_tensor t;
        char want[128], got[128];
        shape_text(want, sizeof want, pd->ndim, pd->shape);
        if (!source_find(w, pd->name, &t))
            return diag_set(d, VH_STATUS_ERR_FORMAT,
                            "%s has no tensor '%s' %s that the %s model needs (is it a "
                            "checkpoint of this model?)%s%s",
                            w->f.path, pd->name, want, s->run->plugins[VH_ROLE_MODEL].desc->name,
                            w->problem.text[0] ? "; " : "", w->problem.text);
        int same = t.ndim == pd->ndim;
        for (int32_t k = 0; same && k < pd->ndim; k++) same = t.shape[k] == pd->shape[k];
        if (!same) {
            shape_text(got, sizeof got, t.ndim, t.shape);
            return diag_set(d, VH_STATUS_ERR_FORMAT,
                            "%s: tensor '%s' is %s, the model has %s (image size, patch size, "
                            "width or class count differ; the %s model does not adapt weights)",
                            w->f.path, pd->name, got, want,
                            s->run->plugins[VH_ROLE_MODEL].desc->name);
        }
        memcpy(values + pd->offset, t.data, (size_t)pd->numel * sizeof(float));
        report_record(r, pd->name, VH_WEIGHTS_ACTION_LOADED, NULL);
    }
    return VH_STATUS_OK;
}

/* Loaded values are finite: a NaN or Inf (a checkpoint of a diverged run,
 * a damaged file) would train or evaluate into NaN logits. The init rules'
 * values are finite, so what is not came from the file. */
static vh_status check_finite(vh_session *s, const weights_file *w, int32_t u,
                              const float *values, vh_diag *d) {
    const vh_unit_desc *unit = &s->table->units[u];
    for (int32_t p = 0; p < unit->num_params; p++) {
        const vh_param_desc *pd = &unit->params[p];
        for (int64_t i = 0; i < pd->numel; i++) {
            float v = values[pd->offset + i];
            if (isfinite(v)) continue;
            return diag_set(d, VH_STATUS_ERR_NUMERIC,
                            "%s: tensor '%s' holds %s (value %lld of %lld): these weights "
                            "cannot train or evaluate (a checkpoint of a diverged run? use an "
                            "earlier checkpoint)",
                            w->f.path, pd->name, isnan(v) ? "NaN" : "Inf", (long long)i,
                            (long long)pd->numel);
        }
    }
    return VH_STATUS_OK;
}

/* One unit: init rules, the file (when there is one), the sharding plugin. */
static vh_status load_unit(vh_session *s, weights_file *w, vh_weights_mode mode, int32_t u,
                           float *values, weights_report *r, vh_diag *d) {
    uint64_t seed = (uint64_t)run_config_int(s->run, "seed");
    void *model = s->self[VH_ROLE_MODEL];
    char call[96];
    snprintf(call, sizeof call, "model.init_unit unit=%d", (int)u);
    session_trace(s, "%s", call);
    vh_status st = s->model->init_unit(model, u, values, seed);
    if (st != VH_STATUS_OK) return session_plugin_error(s, VH_ROLE_MODEL, st, call, d);
    if (w && s->model->load_weights) {
        vh_weights_source src = {.struct_size = sizeof src, .ctx = w, .path = w->f.path,
                                 .find = source_find};
        vh_weights_report rep = {.struct_size = sizeof rep, .ctx = r, .record = report_record};
        snprintf(call, sizeof call, "model.load_weights unit=%d", (int)u);
        session_trace(s, "%s", call);
        st = s->model->load_weights(model, u, &src, mode, values, &rep);
        if (st != VH_STATUS_OK) {
            session_plugin_error(s, VH_ROLE_MODEL, st, call, d);
            if (w->problem.text[0]) diag_prefix(d, "%s: %s; ", w->f.path, w->problem.text);
            return st;
        }
    } else if (w) {
        st = default_load_unit(s, w, u, values, r, d);
        if (st != VH_STATUS_OK) return st;
    }
    if (w) {
        st = check_finite(s, w, u, values, d);
        if (st != VH_STATUS_OK) return st;
    }
    snprintf(call, sizeof call, "sharding.load_unit unit=%d", (int)u);
    session_trace(s, "%s", call);
    st = s->sharding->load_unit(s->self[VH_ROLE_SHARDING], u, values);
    if (st != VH_STATUS_OK) return session_plugin_error(s, VH_ROLE_SHARDING, st, call, d);
    return VH_STATUS_OK;
}

/* "a, b, c and 4 more": the file's tensors no parameter looked up. */
static int ignored_text(const weights_file *w, char *buf) {
    int n = 0;
    buf[0] = '\0';
    for (int i = 0; i < w->f.count; i++) {
        if (w->found[i]) continue;
        if (n < LIST_NAMES) {
            if (n) append(buf, ", ");
            append(buf, w->f.tensors[i].name);
        }
        n++;
    }
    if (n > LIST_NAMES) {
        char more[64];
        snprintf(more, sizeof more, " and %d more", n - LIST_NAMES);
        append(buf, more);
    }
    return n;
}

/* After every unit: what STRICT forbids, then the one report line. */
static vh_status finish_report(vh_session *s, const weights_file *w, vh_weights_mode mode,
                               const weights_report *r, vh_diag *d) {
    char ignored[LIST_CAP];
    int n_ignored = ignored_text(w, ignored);
    const char *model = s->run->plugins[VH_ROLE_MODEL].desc->name;
    if (mode == VH_WEIGHTS_MODE_STRICT && r->reinitialised > 0)
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "model plugin '%s' re-initialised %s while loading %s strictly (only "
                        "pretrained weights may be adapted)",
                        model, r->reinit_text, w->f.path);
    if (mode == VH_WEIGHTS_MODE_STRICT && n_ignored > 0)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s holds %d tensor(s) the %s model does not have: %s (is it a "
                        "checkpoint of another configuration?)",
                        w->f.path, n_ignored, model, ignored);
    fprintf(s->out, "vithost: weights from %s: loaded %d tensor(s)", w->f.path, r->loaded);
    if (r->reinitialised > 0) {
        fprintf(s->out, "; re-initialised %d: %s", r->reinitialised, r->reinit_text);
        if (r->reinitialised > LIST_NAMES)
            fprintf(s->out, " and %d more", r->reinitialised - LIST_NAMES);
    }
    if (n_ignored > 0) fprintf(s->out, "; ignored %d the model does not use: %s", n_ignored, ignored);
    fputc('\n', s->out);
    fflush(s->out);
    return VH_STATUS_OK;
}

vh_status weights_load_model(vh_session *s, const char *path, vh_weights_mode mode,
                             vh_diag *d) {
    weights_file file, *w = NULL;
    vh_status st = VH_STATUS_OK;
    if (path) {
        w = &file;
        memset(w, 0, sizeof *w);
        st = weights_verify_file(path, d);
        if (st == VH_STATUS_OK) st = weights_file_open(w, path, d);
    }
    weights_report report;
    memset(&report, 0, sizeof report);
    float *values = NULL;
    for (int32_t u = 0; st == VH_STATUS_OK && u < s->table->num_units; u++) {
        size_t n = (size_t)s->table->units[u].numel;
        values = malloc((n ? n : 1) * sizeof *values);
        if (!values) st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for unit %d", (int)u);
        if (st == VH_STATUS_OK) st = load_unit(s, w, mode, u, values, &report, d);
        if (w) weights_file_drop_copies(w);
        free(values);
        values = NULL;
    }
    if (st == VH_STATUS_OK && w) st = finish_report(s, w, mode, &report, d);
    if (w) weights_file_close(w);
    return st;
}

/* ---- saving ----------------------------------------------------------------- */

/* Full fp32 values of one unit, from the sharding plugin. */
static vh_status fetch_unit(vh_session *s, int32_t u, float **out, vh_diag *d) {
    size_t n = (size_t)s->table->units[u].numel;
    *out = malloc((n ? n : 1) * sizeof(float));
    if (!*out) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for unit %d", (int)u);
    vh_status st = s->sharding->store_unit(s->self[VH_ROLE_SHARDING], u, *out);
    if (st != VH_STATUS_OK) {
        free(*out);
        *out = NULL;
        return session_plugin_error(s, VH_ROLE_SHARDING, st, "sharding.store_unit", d);
    }
    return VH_STATUS_OK;
}

/* One unit at a time (store_unit is collective): no rank holds more than
 * one unit's full values, and rank 0 appends them to the file. */
vh_status weights_save_model(vh_session *s, const char *path, vh_diag *d) {
    vh_st_writer w;
    st_writer_init(&w);
    const vh_plugin_descriptor *model = s->run->plugins[VH_ROLE_MODEL].desc;
    char who[256];
    snprintf(who, sizeof who, "%s %s", model->name, model->version);
    vh_status st = st_writer_meta(&w, "format", "pt", d);
    if (st == VH_STATUS_OK) st = st_writer_meta(&w, "vithost_model", who, d);
    for (int32_t u = 0; st == VH_STATUS_OK && u < s->table->num_units; u++) {
        const vh_unit_desc *unit = &s->table->units[u];
        for (int32_t p = 0; st == VH_STATUS_OK && p < unit->num_params; p++) {
            const vh_param_desc *pd = &unit->params[p];
            st = st_writer_add(&w, pd->name, pd->ndim, pd->shape, NULL, d);
        }
    }
    vh_st_stream out = {.fd = -1};
    const int writer = s->run->comm.rank == 0;
    if (st == VH_STATUS_OK && writer) st = st_stream_open(&out, &w, path, d);
    for (int32_t u = 0; st == VH_STATUS_OK && u < s->table->num_units; u++) {
        float *values = NULL;
        st = fetch_unit(s, u, &values, d);
        const vh_unit_desc *unit = &s->table->units[u];
        for (int32_t p = 0; st == VH_STATUS_OK && writer && p < unit->num_params; p++)
            st = st_stream_put(&out, values + unit->params[p].offset, d);
        free(values);
    }
    if (st == VH_STATUS_OK && writer) st = st_stream_close(&out, d);
    else st_stream_abort(&out);
    st_writer_free(&w);
    return st;
}
