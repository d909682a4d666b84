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
    int64_t *written;     /* save: values this rank wrote per tensor */
    int64_t num_pieces;   /* save: this rank's pieces, all tensors */
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
    t->written[i] += count;
    t->num_pieces++;
    return VH_STATUS_OK;
}

/* A failed state_save/state_load: the host's words about a bad piece, else
 * the plugin's. */
static vh_status io_failed(state_tensors *t, vh_status st, const char *call, vh_diag *d) {
    if (t->problem.text[0]) return diag_set(d, st, "%s", t->problem.text);
    return session_plugin_error(t->s, VH_ROLE_SHARDING, st, call, d);
}

static void free_pieces(state_tensors *t, int i) {
    while (t->pieces[i]) {
        piece *next = t->pieces[i]->next;
        free(t->pieces[i]);
        t->pieces[i] = next;
    }
}

/* How a save reaches rank 0 (ABI 2.3). With the communicator's gather
 * (gather_start), each rank sends rank 0 its pieces of one tensor at a
 * time: rank 0 holds its shard plus one tensor (two where the pieces must
 * be reordered), the others their shard only, and each element crosses the
 * network once. A backend without it (one built before 2.3) gets the
 * all-reduce of before: every rank zero-pads each tensor whole and the ranks
 * sum it, so every rank holds a tensor and receives every one.
 * VITHOST_TEST_COMM_NO_GATHER=1 takes that path on any backend (the tests
 * compare the two files); read here only. */
typedef struct save_plan {
    int32_t world, rank;
    size_t row;          /* t.count + 1 */
    int64_t *counts;     /* world x row: rank r's values per tensor, then its piece count */
    int64_t *where;      /* rank 0: every rank's pieces (tensor, offset, count), rank-major */
    size_t *next, *end;  /* rank 0: per rank, its first triple not yet placed, and its end */
    float *pack;         /* this rank's several pieces of one tensor, end to end */
    float *recv, *whole; /* rank 0: the parts received; the tensor when they are reordered */
} save_plan;

static int gather_wanted(const vh_comm *c) {
    const char *v = getenv("VITHOST_TEST_COMM_NO_GATHER");
    return c->ops->gather_start && !(v && strcmp(v, "1") == 0);
}

static void plan_free(save_plan *p) {
    free(p->counts);
    free(p->where);
    free(p->next);
    free(p->end);
    free(p->pack);
    free(p->recv);
    free(p->whole);
}

typedef enum coll_kind { COLL_ALL_REDUCE, COLL_ALL_GATHER, COLL_GATHER } coll_kind;

/* One collective over host buffers, staged through device memory when the
 * device is not the CPU (NCCL reads device memory only), as
 * session_reduce_scalars does. ALL_REDUCE: SUM in place on recv's n
 * elements; ALL_GATHER: count elements of send into recv (n = world x
 * count); GATHER: to rank 0, which alone passes recv (n elements) and
 * counts. */
static vh_status host_coll(vh_session *s, coll_kind kind, const void *send, size_t count,
                           void *recv, size_t n, const size_t *counts, vh_dtype dtype) {
    vh_comm *c = &s->run->comm;
    const vh_device_ops *dev = s->run->device;
    /* (one rank: the self communicator copies host memory as it is) */
    const int staged = dev->kind != VH_DEVICE_KIND_CPU && c->world_size > 1;
    const size_t es = vh_dtype_size(dtype);
    void *d_send = (void *)send, *d_recv = recv;
    vh_status st = VH_STATUS_OK;
    if (staged) {
        d_send = d_recv = NULL;
        if (count) st = dev->alloc(dev->device, count * es, &d_send);
        if (st == VH_STATUS_OK && n) st = dev->alloc(dev->device, n * es, &d_recv);
        if (st == VH_STATUS_OK && count)
            st = dev->copy(dev->device, d_send, send, count * es, VH_COPY_KIND_HOST_TO_DEVICE,
                           NULL);
        if (st == VH_STATUS_OK && kind == COLL_ALL_REDUCE && n)
            st = dev->copy(dev->device, d_recv, recv, n * es, VH_COPY_KIND_HOST_TO_DEVICE,
                           NULL);
    }
    if (st == VH_STATUS_OK && kind == COLL_ALL_REDUCE)
        st = vh_comm_all_reduce(c, d_recv, n, dtype, VH_REDUCE_OP_SUM);
    else if (st == VH_STATUS_OK && kind == COLL_ALL_GATHER)
        st = vh_comm_all_gather(c, d_send, d_recv, count, dtype);
    else if (st == VH_STATUS_OK)
        st = vh_comm_gather(c, d_send, count, d_recv, counts, dtype, 0);
    if (staged && st == VH_STATUS_OK && n)
        st = dev->copy(dev->device, recv, d_recv, n * es, VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (staged && d_send) dev->free(dev->device, d_send);
    if (staged && d_recv) dev->free(dev->device, d_recv);
    return st;
}

/* Every rank's counts on every rank (one small all-gather), and each
 * tensor's elements exactly once over all ranks: every rank checks the same
 * sums, so all refuse together. */
static vh_status exchange_counts(state_tensors *t, save_plan *p, vh_diag *d) {
    p->row = (size_t)t->count + 1;
    int64_t *mine = calloc(p->row, sizeof *mine);
    p->counts = calloc((size_t)p->world * p->row, sizeof *p->counts);
    vh_status st = mine && p->counts ? VH_STATUS_OK : VH_STATUS_ERR_NOMEM;
    if (st == VH_STATUS_OK) {
        memcpy(mine, t->written, (size_t)t->count * sizeof *mine);
        mine[t->count] = t->num_pieces;
        st = p->world == 1 ? (memcpy(p->counts, mine, p->row * sizeof *mine), VH_STATUS_OK)
                           : host_coll(t->s, COLL_ALL_GATHER, mine, p->row, p->counts,
                                       (size_t)p->world * p->row, NULL, VH_DTYPE_I64);
        if (st != VH_STATUS_OK) diag_set(d, st, "counting the optimizer state over ranks failed");
    } else {
        diag_set(d, st, "out of memory for the optimizer state's counts");
    }
    free(mine);
    for (int i = 0; st == VH_STATUS_OK && i < t->count; i++) {
        const vh_param_desc *pd = t->param[i];
        int64_t total = 0;
        for (int32_t r = 0; r < p->world; r++) total += p->counts[(size_t)r * p->row + (size_t)i];
        if (total == pd->numel) continue;
        char name[512];
        state_name(name, sizeof name, pd->name, i % t->slots);
        st = diag_set(d, VH_STATUS_ERR_INTERNAL,
                      "sharding plugin '%s' saved %lld values of optimizer state '%s', which "
                      "has %lld (every element once, over all ranks)",
                      t->s->run->plugins[VH_ROLE_SHARDING].desc->name, (long long)total, name,
                      (long long)pd->numel);
    }
    return st;
}

static int64_t count_of(const save_plan *p, int32_t rank, int i) {
    return p->counts[(size_t)rank * p->row + (size_t)i];
}

/* Rank 0 learns where every rank's pieces lie (one gather of (tensor,
 * offset, count) triples, in tensor order, each tensor's pieces in the
 * order the rank sends their values); the buffers of the save. */
static vh_status gather_layout(state_tensors *t, save_plan *p, int64_t largest, vh_diag *d) {
    const size_t mine_n = 3 * (size_t)t->num_pieces;
    int64_t *mine = malloc((mine_n ? mine_n : 1) * sizeof *mine);
    size_t *counts = NULL, total = 0;
    int64_t own_most = 1;
    for (int i = 0, k = 0; mine && i < t->count; i++) {
        /* (a tensor of one piece is sent from the piece itself) */
        if (t->pieces[i] && t->pieces[i]->next && t->written[i] > own_most)
            own_most = t->written[i];
        for (const piece *pc = t->pieces[i]; pc; pc = pc->next, k += 3)
            mine[k] = i, mine[k + 1] = pc->offset, mine[k + 2] = pc->count;
    }
    p->pack = malloc((size_t)own_most * sizeof *p->pack);
    if (p->rank == 0) {
        counts = calloc((size_t)p->world, sizeof *counts);
        p->next = calloc((size_t)p->world, sizeof *p->next);
        p->end = calloc((size_t)p->world, sizeof *p->end);
        for (int32_t r = 0; counts && p->next && p->end && r < p->world; r++) {
            p->next[r] = total / 3;
            p->end[r] = p->next[r] + (size_t)count_of(p, r, t->count);
            counts[r] = 3 * (size_t)count_of(p, r, t->count);
            total += counts[r];
        }
        p->where = malloc((total ? total : 1) * sizeof *p->where);
        p->recv = malloc((size_t)(largest ? largest : 1) * sizeof *p->recv);
    }
    vh_status st = VH_STATUS_OK;
    if (!mine || !p->pack ||
        (p->rank == 0 && (!counts || !p->next || !p->end || !p->where || !p->recv)))
        st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for the optimizer state's layout");
    if (st == VH_STATUS_OK &&
        (st = host_coll(t->s, COLL_GATHER, mine, mine_n, p->where, total, counts,
                        VH_DTYPE_I64)) != VH_STATUS_OK)
        diag_set(d, st, "sending the optimizer state's layout to rank 0 failed");
    free(mine);
    free(counts);
    return st;
}

static int by_offset(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* Whether the triples of rank 0's plan at k name tensor i. */
static int names(const save_plan *p, int32_t r, size_t k, int i) {
    return k < p->end[r] && p->where[3 * k] == i;
}

/* Rank 0: the pieces of tensor i, in the order received, not in the
 * order of the tensor: copied to their offsets in p->whole, which they must
 * cover once. */
static vh_status reorder(state_tensors *t, save_plan *p, int i, int64_t pieces, vh_diag *d) {
    const int64_t numel = t->param[i]->numel;
    int64_t *spans = malloc((size_t)(pieces ? pieces : 1) * 2 * sizeof *spans);
    if (!p->whole) p->whole = malloc((size_t)(numel ? numel : 1) * sizeof(float));
    if (!spans || !p->whole) {
        free(spans);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory placing optimizer state");
    }
    int64_t at = 0, n = 0;
    for (int32_t r = 0; r < p->world; r++)
        for (size_t k = p->next[r]; names(p, r, k, i); k++, n++) {
            const int64_t *w = p->where + 3 * k;
            memcpy(p->whole + w[1], p->recv + at, (size_t)w[2] * sizeof(float));
            spans[2 * n] = w[1], spans[2 * n + 1] = w[2];
            at += w[2];
        }
    qsort(spans, (size_t)n, 2 * sizeof *spans, by_offset);
    int64_t end = 0;
    for (int64_t k = 0; k < n && end >= 0; k++)
        end = spans[2 * k] == end ? end + spans[2 * k + 1] : -1;
    free(spans);
    if (end == numel) return VH_STATUS_OK;
    char name[512];
    state_name(name, sizeof name, t->param[i]->name, i % t->slots);
    return diag_set(d, VH_STATUS_ERR_INTERNAL,
                    "sharding plugin '%s' saved pieces of optimizer state '%s' that overlap "
                    "(each element must come from one rank, once)",
                    t->s->run->plugins[VH_ROLE_SHARDING].desc->name, name);
}

/* Rank 0: tensor i from its parts in p->recv (rank after rank, each rank's
 * pieces in its triples' order). Where they lie end to end in the tensor
 * (fsdp's and zero1's shards do, and ddp's one whole piece) recv is the
 * tensor; else reorder. */
static vh_status place(state_tensors *t, save_plan *p, int i, const float **out, vh_diag *d) {
    int64_t at = 0, pieces = 0;
    int in_order = 1;
    for (int32_t r = 0; r < p->world; r++)
        for (size_t k = p->next[r]; names(p, r, k, i); k++, pieces++) {
            in_order &= p->where[3 * k + 1] == at;
            at += p->where[3 * k + 2];
        }
    vh_status st = in_order ? VH_STATUS_OK : reorder(t, p, i, pieces, d);
    *out = in_order ? p->recv : p->whole;
    for (int32_t r = 0; r < p->world; r++)
        while (names(p, r, p->next[r], i)) p->next[r]++;
    return st;
}

/* One tensor: this rank's pieces of it to rank 0 (as they are when there
 * is one, else packed end to end), freed once sent; rank 0 appends it. */
static vh_status save_one(state_tensors *t, save_plan *p, int i, vh_st_stream *out,
                          vh_diag *d) {
    const piece *first = t->pieces[i];
    const float *send = p->pack;
    if (first && !first->next) {
        send = first->values;
    } else {
        int64_t at = 0;
        for (const piece *pc = first; pc; at += pc->count, pc = pc->next)
            memcpy(p->pack + at, pc->values, (size_t)pc->count * sizeof *p->pack);
    }
    size_t *counts = NULL;
    if (p->rank == 0 && !(counts = malloc((size_t)p->world * sizeof *counts)))
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    for (int32_t r = 0; counts && r < p->world; r++) counts[r] = (size_t)count_of(p, r, i);
    vh_status st = host_coll(t->s, COLL_GATHER, send, (size_t)t->written[i], p->recv,
                             p->rank == 0 ? (size_t)t->param[i]->numel : 0, counts,
                             VH_DTYPE_F32);
    free(counts);
    free_pieces(t, i);
    if (st != VH_STATUS_OK)
        return diag_set(d, st, "sending the optimizer state to rank 0 failed");
    if (p->rank != 0) return VH_STATUS_OK;
    const float *tensor = NULL;
    st = place(t, p, i, &tensor, d);
    return st == VH_STATUS_OK ? st_stream_put(out, tensor, d) : st;
}

/* Before 2.3 (a backend without gather_start): this rank's pieces of each
 * tensor into zeros, summed over the ranks (each element is nonzero on one
 * rank only, so the sum is exact), and rank 0 appends it. */
static vh_status save_summed(state_tensors *t, save_plan *p, int64_t largest, vh_st_stream *out,
                             vh_diag *d) {
    float *buf = malloc((size_t)(largest ? largest : 1) * sizeof *buf);
    if (!buf)
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for optimizer state of %lld values",
                        (long long)largest);
    vh_status st = VH_STATUS_OK;
    for (int i = 0; st == VH_STATUS_OK && i < t->count; i++) {
        const size_t n = (size_t)t->param[i]->numel;
        memset(buf, 0, n * sizeof *buf);
        for (const piece *pc = t->pieces[i]; pc; pc = pc->next)
            memcpy(buf + pc->offset, pc->values, (size_t)pc->count * sizeof *buf);
        free_pieces(t, i);
        if (p->world > 1 &&
            (st = host_coll(t->s, COLL_ALL_REDUCE, NULL, 0, buf, n, NULL, VH_DTYPE_F32)) !=
                VH_STATUS_OK)
            st = diag_set(d, st, "gathering the optimizer state over ranks failed");
        if (st == VH_STATUS_OK && p->rank == 0) st = st_stream_put(out, buf, d);
    }
    free(buf);
    return st;
}

/* The file's header: every tensor's name and shape, in table order. */
static vh_status describe_file(state_tensors *t, vh_st_writer *w, int64_t *largest,
                               vh_diag *d) {
    vh_status st = st_writer_meta(w, "format", "vithost-optim", d);
    *largest = 0;
    for (int i = 0; st == VH_STATUS_OK && i < t->count; i++) {
        const vh_param_desc *pd = t->param[i];
        char name[512];
        state_name(name, sizeof name, pd->name, i % t->slots);
        st = st_writer_add(w, name, pd->ndim, pd->shape, NULL, d);
        if (pd->numel > *largest) *largest = pd->numel;
    }
    return st;
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
    save_plan p = {.world = c->world_size, .rank = c->rank};
    if (st == VH_STATUS_OK) st = exchange_counts(&t, &p, d);
    vh_st_writer w;
    st_writer_init(&w);
    vh_st_stream out = {.fd = -1};
    int64_t largest = 0;
    if (st == VH_STATUS_OK) st = describe_file(&t, &w, &largest, d);
    const int gathered = gather_wanted(c);
    if (st == VH_STATUS_OK && gathered) st = gather_layout(&t, &p, largest, d);
    if (st == VH_STATUS_OK && c->rank == 0) st = st_stream_open(&out, &w, path, d);
    if (st == VH_STATUS_OK && gathered) {
        session_trace(s, "optim state: gathered to rank 0, one tensor at a time");
        for (int i = 0; st == VH_STATUS_OK && i < t.count; i++) st = save_one(&t, &p, i, &out, d);
    } else if (st == VH_STATUS_OK) {
        session_trace(s, "optim state: summed over the ranks (the backend has no gather)");
        st = save_summed(&t, &p, largest, &out, d);
    }
    if (st == VH_STATUS_OK && c->rank == 0) st = st_stream_close(&out, d);
    else st_stream_abort(&out);
    st_writer_free(&w);
    plan_free(&p);
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
