/* worklist.h - the flat work list of one multi-tensor apply.
 *
 * Every slice is cut into chunks of at most MTA_CHUNK_ELEMS elements, so one
 * parallel loop over the chunks balances big and small tensors alike. For the
 * per-tensor norms of LAMB, slices are also mapped to tensors: a tensor is a
 * (unit, param) pair, numbered the same way on every rank so that one
 * all-reduce of an array of per-tensor sums serves every tensor. The
 * numbering is the parameter table's (vh_param_table_index) when the
 * optimizer has the table; without one it is agreed over the ranks.
 */
#ifndef VH_MTA_WORKLIST_H
#define VH_MTA_WORKLIST_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_host.h"
#include "vithost/vh_params.h"

#define MTA_CHUNK_ELEMS ((int64_t)1 << 16)

typedef struct mta_chunk {
    int32_t slice;  /* index into the slice list */
    int64_t begin;  /* first element within the slice */
    int64_t count;
} mta_chunk;

typedef struct mta_worklist {
    vh_host *host;
    /* chunks, in slice order and element order within a slice */
    mta_chunk *chunks;
    int64_t num_chunks;
    size_t chunks_cap;
    /* two double partial sums per chunk, for the reduction passes */
    double *partials;
    size_t partials_cap;
    /* tensor of each slice (mta_worklist_map_tensors) */
    int32_t *slice_tensor;
    size_t slice_tensor_cap;
    /* two double sums per tensor, zeroed by mta_worklist_map_tensors */
    double *tensor_sums;
    size_t tensor_sums_cap;
    int64_t num_tensors;
    /* tensor numbering: unit u's params start at unit_first[u] */
    int64_t *unit_first;
    size_t unit_first_cap;
    int64_t num_units;
    /* f32 scratch for slices whose master or gradient is 16-bit: two
     * chunks (master, gradient) per thread, MTA_CHUNK_ELEMS floats each */
    float *scratch;
    size_t scratch_cap;
    /* the slice list the numbering was agreed for, when world_size > 1 */
    const void *agreed_items;
    int32_t agreed_count;
    uint32_t agreed_item_size;
} mta_worklist;

void mta_worklist_init(mta_worklist *w, vh_host *host);
void mta_worklist_free(mta_worklist *w);

/* Cuts the slices into chunks (and sizes `partials`). */
vh_status mta_worklist_build(mta_worklist *w, const vh_param_slices *slices);

/* Makes `scratch` hold two chunks for each of `threads` threads. */
vh_status mta_worklist_reserve_scratch(mta_worklist *w, int threads);

/* Numbers the tensors and fills slice_tensor; zeroes tensor_sums. With a
 * table the numbering is the table's, on every rank, and no collective
 * runs. Without one, and with more than one rank, it is agreed once per
 * slice list (two small MAX all-reduces over comm); the sharding plugin
 * keeps its list until destroy, so later steps reuse it without a
 * collective. Collective when there is no table and comm has world_size > 1. */
vh_status mta_worklist_map_tensors(mta_worklist *w, const vh_param_slices *slices,
                                   const vh_param_table *table, vh_comm *comm);

#endif
