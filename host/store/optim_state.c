/* optim_state.c - optimizer state <-> optim.safetensors through the
 * vh_state_io the sharding plugin writes and reads its pieces with (see
 * optim_state.h). */
#define _POSIX_C_SOURCE 200809L
#include "optim_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "vithost/vh_runtime.h"

/* save: one piece this rank wrote, an f32 copy. */
typedef struct piece {
    struct piece *next;
    int64_t offset, count;
    float values[];
} piece;

/* Every (parameter, slot) of the table as one f32 tensor of the file. No
 * rank holds the whole state at once: a save keeps this rank's pieces and
 * assembles one tensor at a time, a load reads each piece from its range of
 * the (mapped) file. */
typedef struct state_tensors {
    vh_session *s;
    const char *path;     /* the file, for messages */
    int32_t slots;
    int32_t *first_param; /* per unit: flat index of its first parameter */
    int count;            /* parameters x slots */
    const vh_param_desc **param; /* per tensor: its parameter (tensor i is slot i % slots) */
    piece **pieces;       /* save: per tensor, this rank's pieces */
    double *written;      /* save: values written per tensor (double: summed over ranks) */
    vh_st_file file;      /* load */
    const vh_st_tensor **in_file; /* load: per tensor */
    vh_diag problem;      /* a bad piece, said by the host */
} state_tensors;

static const vh_param_desc *param_of(const state_tensors *t, int32_t unit, int32_t param) {
    return &t->s->table->units[unit].params[param];
}

static int tensor_index(const state_tensors *t, int32_t unit, int32_t param, int32_t slot) {
    return (t->first_param[unit] + param) * t->slots + slot;
}

static void state_name(char *buf, size_t len, const char *param, int32_t slot) {
    snprintf(buf, len, "%s.optim_state.%d", param, (int)slot);
}

static vh_status tensors_init(state_tensors *t, vh_session *s, const char *path, vh_diag *d) {
    memset(t, 0, sizeof *t);
    t->s = s;
    t->path = path;
    t->slots = s->state_slots;
    const vh_param_table *table = s->table;
    t->first_param = calloc((size_t)table->num_units, sizeof *t->first_param);
    int params = 0;
    for (int32_t u = 0; t->first_param && u < table->num_units; u++) {
        t->first_param[u] = params;
        params += table->units[u].num_params;
    }
    t->count = params * t->slots;
    t->pieces = calloc((size_t)t->count + 1, sizeof *t->pieces);
    t->written = calloc((size_t)t->count + 1, sizeof *t->written);
    t->in_file = calloc((size_t)t->count + 1, sizeof *t->in_file);
    t->param = calloc((size_t)t->count + 1, sizeof *t->param);
    if (!t->first_param || !t->pieces || !t->written || !t->in_file || !t->param)
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for the optimizer state");
    for (int32_t u = 0; u < table->num_units; u++)
        for (int32_t p = 0; p < table->units[u].num_params; p++)
            for (int32_t k = 0; k < t->slots; k++)
                t->param[tensor_index(t, u, p, k)] = &table->units[u].params[p];
    return VH_STATUS_OK;
}

static void tensors_free(state_tensors *t) {
    for (int i = 0; t->pieces && i < t->count; i++)
        while (t->pieces[i]) {
            piece *next = t->pieces[i]->next;
            free(t->pieces[i]);
            t->pieces[i] = next;
        }
    free(t->pieces);
    free(t->written);
    free(t->in_file);
    free(t->param);
    free(t->first_param);
    st_free(&t->file);
}

/* A piece must name a parameter and slot of this run and lie inside the
 * parameter. The host keeps what was wrong: the plugin's own message would
 * not say it as precisely. */
static vh_status check_piece(state_tensors *t, int32_t unit, int32_t param, int32_t slot,
                             int64_t offset, int64_t count, vh_dtype dtype, const void *values) {
    const vh_param_table *table = t->s->table;
    const char *what = NULL;
    if (unit < 0 || unit >= table->num_units || param < 0 ||
        param >= table->units[unit].num_params)
        what = "no such parameter";
    else if (slot < 0 || slot >= t->slots)
        what = "no such state slot";
    else if (offset < 0 || count < 0 || offset > param_of(t, unit, param)->numel - count)
        what = "elements outside the parameter";
    else if (dtype != VH_DTYPE_F32 && dtype != VH_DTYPE_BF16 && dtype != VH_DTYPE_F16)
        what = "a dtype other than f32, bf16 or f16";
    else if (count > 0 && !values)
        what = "no values";
    if (!what) return VH_STATUS_OK;
    if (!t->problem.text[0])
        diag_set(&t->problem, VH_STATUS_ERR_INVALID_ARG,
                 "%s: sharding plugin '%s' passed an optimizer state piece with %s (unit %d, "
                 "param %d, slot %d, elements %lld..%lld, %s)",
                 t->path, t->s->run->plugins[VH_ROLE_SHARDING].desc->name, what, (int)unit, (int)param,
                 (int)slot, (long long)offset, (long long)(offset + count),
                 vh_dtype_name(dtype));
    return VH_STATUS_ERR_INVALID_ARG;
}

static void to_f32(float *dst, const void *src, int64_t n, vh_dtype dtype) {
    if (dtype == VH_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = dtype == VH_DTYPE_BF16 ? vh_bf16_to_f32(h[i]) : vh_f16_to_f32(h[i]);
}

static void from_f32(void *dst, const float *src, int64_t n, vh_dtype dtype) {
    if (dtype == VH_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof *src);
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = dtype == VH_DTYPE_BF16 ? vh_f32_to_bf16(src[i]) : vh_f32_to_f16(src[i]);
}

/* ---- saving -------------------------------------------------------------- */

static vh_status io_write(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                          int64_t count, vh_dtype dtype, const void *values) {
    state_tensors *t = ctx;
    vh_status st = check_piece(t, unit, param, slot, offset, count, dtype, values);
    if (st != VH_STATUS_OK) return st;
    int i = tensor_index(t, unit, param, slot);
    piece *pc = malloc(sizeof *pc + (size_t)count * sizeof(float));
    if (!pc) return VH_STATUS_ERR_NOMEM;
    pc->offset = offset;
    pc->count = count;
    to_f32(pc->values, values, count, dtype);
    pc->next = t->pieces[i];
    t->pieces[i] = pc;
    t->written[i] += (double)count;
    return VH_STATUS_OK;
}

/* A failed state_save/state_load: the host's words about a bad piece, else
 * the plugin's. */
static vh_status io_failed(state_tensors *t, vh_status st, const char *call, vh_diag *d) {
    if (t->problem.text[0]) return diag_set(d, st, "%s", t->problem.text);
    return session_plugin_error(t->s, VH_ROLE_SHARDING, st, call, d);
}

/* Every rank wrote its pieces; each element must have come exactly once
 * over all ranks (the counts, summed, say so). */
static vh_status check_counts(state_tensors *t, vh_diag *d) {
    for (int i = 0; i < t->count; i++) {
        const vh_param_desc *pd = t->param[i];
        if (t->written[i] == (double)pd->numel) continue;
        char name[512];
        state_name(name, sizeof name, pd->name, i % t->slots);
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "sharding plugin '%s' saved %.0f values of optimizer state '%s', which "
                        "has %lld (every element once, over all ranks)",
                        t->s->run->plugins[VH_ROLE_SHARDING].desc->name, t->written[i], name,
                        (long long)pd->numel);
    }
    return VH_STATUS_OK;
}

vh_status optim_state_save(vh_session *s, const char *path, vh_diag *d) {
    state_tensors t;
    vh_status st = tensors_init(&t, s, path, d);
    if (st == VH_STATUS_OK) {
        vh_state_io io = {.struct_size = sizeof io, .ctx = &t, .write = io_write};
        session_trace(s, "sharding.state_save");
        st = s->sharding->state_save(s->self[VH_ROLE_SHARDING], &io);
        if (st != VH_STATUS_OK) st = io_failed(&t, st, "sharding.state_save", d);
    }
    vh_comm *c = &s->run->comm;
    const int many = c->world_size > 1;
    if (st == VH_STATUS_OK && many &&
        (st = vh_comm_all_reduce(c, t.written, (size_t)t.count, VH_DTYPE_F64,
                                 VH_REDUCE_OP_SUM)) != VH_STATUS_OK)
        st = diag_set(d, st, "counting the optimizer state over ranks failed");
    if (st == VH_STATUS_OK) st = check_counts(&t, d);
    /* One tensor at a time: this rank's pieces into zeros, summed over the
     * ranks (each element is nonzero on one rank only, so the sum is exact),
     * and rank 0 appends it to the file. */
    vh_st_writer w;
    st_writer_init(&w);
    vh_st_stream out = {.fd = -1};
    int64_t largest = 0;
    if (st == VH_STATUS_OK) st = st_writer_meta(&w, "format", "vithost-optim", d);
    for (int i = 0; st == VH_STATUS_OK && i < t.count; i++) {
        const vh_param_desc *pd = t.param[i];
        char name[512];
        state_name(name, sizeof name, pd->name, i % t.slots);
        st = st_writer_add(&w, name, pd->ndim, pd->shape, NULL, d);
        if (pd->numel > largest) largest = pd->numel;
    }
    float *buf = NULL;
    if (st == VH_STATUS_OK && !(buf = malloc((size_t)(largest ? largest : 1) * sizeof *buf)))
        st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for optimizer state of %lld values",
                      (long long)largest);
    if (st == VH_STATUS_OK && c->rank == 0) st = st_stream_open(&out, &w, path, d);
    for (int i = 0; st == VH_STATUS_OK && i < t.count; i++) {
        const size_t n = (size_t)t.param[i]->numel;
        if (many) memset(buf, 0, n * sizeof *buf);
        for (const piece *pc = t.pieces[i]; pc; pc = pc->next)
            memcpy(buf + pc->offset, pc->values, (size_t)pc->count * sizeof *buf);
        if (many && (st = vh_comm_all_reduce(c, buf, n, VH_DTYPE_F32, VH_REDUCE_OP_SUM)) !=
                        VH_STATUS_OK)
            st = diag_set(d, st, "gathering the optimizer state over ranks failed");
        if (st == VH_STATUS_OK && c->rank == 0) st = st_stream_put(&out, buf, d);
    }
    if (st == VH_STATUS_OK && c->rank == 0) st = st_stream_close(&out, d);
    else st_stream_abort(&out);
    free(buf);
    st_writer_free(&w);
    tensors_free(&t);
    return st;
}

/* ---- loading ------------------------------------------------------------- */

static vh_status io_read(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                         int64_t count, vh_dtype dtype, void *values) {
    state_tensors *t = ctx;
    vh_status st = check_piece(t, unit, param, slot, offset, count, dtype, values);
    if (st != VH_STATUS_OK) return st;
    const vh_st_tensor *ft = t->in_file[tensor_index(t, unit, param, slot)];
    if (dtype == VH_DTYPE_F32) return st_read_f32_range(&t->file, ft, offset, count, values, &t->problem);
    float *v = malloc((size_t)(count ? count : 1) * sizeof *v);
    if (!v) return VH_STATUS_ERR_NOMEM;
    st = st_read_f32_range(&t->file, ft, offset, count, v, &t->problem);
    if (st == VH_STATUS_OK) from_f32(values, v, count, dtype);
    free(v);
    return st;
}

static void shape_text(char *buf, size_t len, int32_t ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int32_t i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

/* The file holds exactly one tensor per parameter and slot, each of its
 * parameter's shape. */
static vh_status match_file(state_tensors *t, const char *path, vh_diag *d) {
    const vh_param_table *table = t->s->table;
    for (int32_t u = 0; u < table->num_units; u++) {
        for (int32_t p = 0; p < table->units[u].num_params; p++) {
            const vh_param_desc *pd = param_of(t, u, p);
            for (int32_t k = 0; k < t->slots; k++) {
                char name[512], want[128], got[128];
                state_name(name, sizeof name, pd->name, k);
                const vh_st_tensor *ft = st_find(&t->file, name);
                if (!ft)
                    return diag_set(d, VH_STATUS_ERR_FORMAT,
                                    "%s has no optimizer state '%s' (was the optimizer "
                                    "changed?)",
                                    path, name);
                int same = ft->ndim == pd->ndim;
                for (int32_t i = 0; same && i < pd->ndim; i++) same = ft->shape[i] == pd->shape[i];
                if (!same) {
                    shape_text(want, sizeof want, pd->ndim, pd->shape);
                    shape_text(got, sizeof got, ft->ndim, ft->shape);
                    return diag_set(d, VH_STATUS_ERR_FORMAT,
                                    "%s: optimizer state '%s' is %s, its parameter %s (is it "
                                    "a checkpoint of this model?)",
                                    path, name, got, want);
                }
                t->in_file[tensor_index(t, u, p, k)] = ft;
            }
        }
    }
    if (t->file.count != t->count)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s holds %d optimizer tensors, this optimizer keeps %d (was the "
                        "optimizer changed?)",
                        path, t->file.count, t->count);
    return VH_STATUS_OK;
}

vh_status optim_state_load(vh_session *s, const char *path, vh_diag *d) {
    state_tensors t;
    vh_status st = tensors_init(&t, s, path, d);
    if (st == VH_STATUS_OK) st = st_read(&t.file, path, d);
    if (st == VH_STATUS_OK) st = match_file(&t, path, d);
    if (st == VH_STATUS_OK) {
        vh_state_io io = {.struct_size = sizeof io, .ctx = &t, .read = io_read};
        session_trace(s, "sharding.state_load");
        st = s->sharding->state_load(s->self[VH_ROLE_SHARDING], &io);
        if (st != VH_STATUS_OK) st = io_failed(&t, st, "sharding.state_load", d);
    }
    tensors_free(&t);
    return st;
}
