/* worklist.c - chunks of the slices, and the numbering of their tensors. */
#include "worklist.h"

#include <string.h>

#include "vithost/vh_optim_schedule.h"

void mta_worklist_init(mta_worklist *w, vh_host *host) {
    memset(w, 0, sizeof *w);
    w->host = host;
}

void mta_worklist_free(mta_worklist *w) {
    vh_host *host = w->host;
    if (!host) return;
    host->api->free(host, w->chunks);
    host->api->free(host, w->partials);
    host->api->free(host, w->slice_tensor);
    host->api->free(host, w->tensor_sums);
    host->api->free(host, w->unit_first);
    host->api->free(host, w->scratch);
    mta_worklist_init(w, host);
}

/* Makes *buf hold at least `need` elements of `size` bytes; the contents are
 * not kept. Grows by doubling so that a steady list never reallocates. */
static vh_status reserve(vh_host *host, void **buf, size_t *cap, size_t need, size_t size) {
    if (need <= *cap && *buf) return VH_STATUS_OK;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    if (n > SIZE_MAX / size)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "work list of %zu entries is too large",
                               need);
    void *p = host->api->alloc(host, n * size);
    if (!p)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "no memory for a work list of %zu bytes",
                               n * size);
    host->api->free(host, *buf);
    *buf = p;
    *cap = n;
    return VH_STATUS_OK;
}

vh_status mta_worklist_build(mta_worklist *w, const vh_param_slices *slices) {
    size_t need = 0;
    for (int32_t s = 0; s < slices->count; s++) {
        int64_t n = vh_param_slices_at(slices, s)->count;
        need += (size_t)((n + MTA_CHUNK_ELEMS - 1) / MTA_CHUNK_ELEMS);
    }
    vh_status st = reserve(w->host, (void **)&w->chunks, &w->chunks_cap, need, sizeof *w->chunks);
    if (st == VH_STATUS_OK)
        st = reserve(w->host, (void **)&w->partials, &w->partials_cap, 2 * need,
                     sizeof *w->partials);
    if (st != VH_STATUS_OK) return st;
    int64_t c = 0;
    for (int32_t s = 0; s < slices->count; s++) {
        int64_t n = vh_param_slices_at(slices, s)->count;
        for (int64_t begin = 0; begin < n; begin += MTA_CHUNK_ELEMS, c++) {
            w->chunks[c].slice = s;
            w->chunks[c].begin = begin;
            w->chunks[c].count = n - begin < MTA_CHUNK_ELEMS ? n - begin : MTA_CHUNK_ELEMS;
        }
    }
    w->num_chunks = c;
    return VH_STATUS_OK;
}

vh_status mta_worklist_reserve_scratch(mta_worklist *w, int threads) {
    size_t need = (size_t)(threads > 0 ? threads : 1) * 2 * (size_t)MTA_CHUNK_ELEMS;
    return reserve(w->host, (void **)&w->scratch, &w->scratch_cap, need, sizeof *w->scratch);
}

/* Largest unit index + 1 of the local slices, and then per unit the largest
 * param index + 1, agreed over ranks with MAX: every rank ends up with the
 * same numbering even when it holds slices of only some tensors. */
static vh_status agree_numbering(mta_worklist *w, const vh_param_slices *slices, vh_comm *comm) {
    vh_host *host = w->host;
    const int collective = comm && comm->world_size > 1;
    int64_t units = 0;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        if (sl->unit + (int64_t)1 > units) units = sl->unit + (int64_t)1;
    }
    vh_status st;
    if (collective) {
        st = vh_comm_all_reduce(comm, &units, 1, VH_DTYPE_I64, VH_REDUCE_OP_MAX);
        if (st != VH_STATUS_OK)
            return host->api->fail(host, st, "all-reduce of the unit count over %d ranks failed",
                                   (int)comm->world_size);
    }
    /* unit_first holds the param counts first, then their prefix sums */
    st = reserve(host, (void **)&w->unit_first, &w->unit_first_cap, (size_t)units + 1,
                 sizeof *w->unit_first);
    if (st != VH_STATUS_OK) return st;
    memset(w->unit_first, 0, ((size_t)units + 1) * sizeof *w->unit_first);
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        if (sl->param + (int64_t)1 > w->unit_first[sl->unit])
            w->unit_first[sl->unit] = sl->param + (int64_t)1;
    }
    if (collective && units > 0) {
        st = vh_comm_all_reduce(comm, w->unit_first, (size_t)units, VH_DTYPE_I64,
                                   VH_REDUCE_OP_MAX);
        if (st != VH_STATUS_OK)
            return host->api->fail(host, st,
                                   "all-reduce of the param counts of %lld units over %d ranks "
                                   "failed",
                                   (long long)units, (int)comm->world_size);
    }
    int64_t total = 0;
    for (int64_t u = 0; u < units; u++) {
        int64_t params = w->unit_first[u];
        w->unit_first[u] = total;
        total += params;
    }
    if (total > INT32_MAX)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "%lld parameter tensors: at most %d are supported",
                               (long long)total, (int)INT32_MAX);
    w->unit_first[units] = total;
    w->num_units = units;
    w->num_tensors = total;
    w->agreed_items = collective ? slices->items : NULL;
    w->agreed_count = slices->count;
    w->agreed_item_size = slices->item_size;
    return VH_STATUS_OK;
}

/* The table's numbering: no collective, the same on every rank. */
static vh_status table_numbering(mta_worklist *w, const vh_param_table *table) {
    int64_t total = vh_param_table_tensors(table);
    if (total > INT32_MAX)
        return w->host->api->fail(w->host, VH_STATUS_ERR_UNSUPPORTED,
                                  "%lld parameter tensors: at most %d are supported",
                                  (long long)total, (int)INT32_MAX);
    w->num_tensors = total;
    return VH_STATUS_OK;
}

/* The tensor of slice s: the table's index, or the agreed unit_first's. */
static int64_t tensor_of(const mta_worklist *w, const vh_param_table *table,
                         const vh_param_slice *sl) {
    if (table) return vh_param_table_index(table, sl->unit, sl->param);
    int64_t first = sl->unit < w->num_units ? w->unit_first[sl->unit] : -1;
    int64_t end = sl->unit < w->num_units ? w->unit_first[sl->unit + 1] : -1;
    return first < 0 || first + sl->param >= end ? -1 : first + sl->param;
}

vh_status mta_worklist_map_tensors(mta_worklist *w, const vh_param_slices *slices,
                                   const vh_param_table *table, vh_comm *comm) {
    vh_host *host = w->host;
    const int collective = comm && comm->world_size > 1;
    const int agreed = collective && w->agreed_items == slices->items &&
                       w->agreed_count == slices->count &&
                       w->agreed_item_size == slices->item_size;
    vh_status st = VH_STATUS_OK;
    if (table) st = table_numbering(w, table);
    else if (!agreed) st = agree_numbering(w, slices, comm);
    if (st != VH_STATUS_OK) return st;

    st = reserve(host, (void **)&w->slice_tensor, &w->slice_tensor_cap, (size_t)slices->count,
                 sizeof *w->slice_tensor);
    if (st == VH_STATUS_OK)
        st = reserve(host, (void **)&w->tensor_sums, &w->tensor_sums_cap,
                     2 * (size_t)w->num_tensors, sizeof *w->tensor_sums);
    if (st != VH_STATUS_OK) return st;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        int64_t t = tensor_of(w, table, sl);
        if (t < 0)
            return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                                   "slice %d (unit %d, param %d) lies outside the %s; the "
                                   "sharding plugin must keep one slice list for the run",
                                   (int)s, (int)sl->unit, (int)sl->param,
                                   table ? "parameter table"
                                         : "tensor numbering agreed for this slice list");
        w->slice_tensor[s] = (int32_t)t;
    }
    memset(w->tensor_sums, 0, 2 * (size_t)w->num_tensors * sizeof *w->tensor_sums);
    return VH_STATUS_OK;
}
