/* cache_alloc.c - the caching allocator's bookkeeping (cache_alloc.h).
 *
 * Blocks live in one array. A pointer index (open addressing, linear
 * probing, power-of-two capacity at most half full) finds a block on put; a
 * sorted array of bins, one per rounded size, heads a singly linked list of
 * that size's free blocks. Blocks leave the array only in a trim, which
 * compacts the array and rebuilds the index, so the index never deletes. */
#include "cache_alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    void *ptr;
    size_t size;     /* rounded */
    const void *tag; /* the stream it was got on; NULL once released */
    int32_t next;    /* next free block of its bin, or -1 */
    int32_t in_use;
} block;

typedef struct bin {
    size_t size;
    int32_t head; /* first free block, or -1 */
} bin;

typedef struct impl {
    pthread_mutex_t mu;
    block *blocks;
    int32_t nblocks, cap_blocks;
    int32_t *index; /* block number + 1; 0 empty */
    size_t index_cap;
    bin *bins;
    int32_t nbins, cap_bins;
    vh_cuda_alloc_stats stats;
} impl;

size_t vh_cuda_alloc_round(size_t bytes) {
    if (bytes == 0) bytes = 1;
    const size_t r = bytes <= VH_CUDA_ALLOC_SMALL_MAX ? VH_CUDA_ALLOC_SMALL_ROUND
                                                      : VH_CUDA_ALLOC_LARGE_ROUND;
    return (bytes + r - 1) / r * r;
}

static size_t slot_of(const void *p, size_t cap) {
    uint64_t h = (uint64_t)(uintptr_t)p >> 8; /* device blocks are 256-aligned */
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void index_insert(impl *m, int32_t b) {
    size_t s = slot_of(m->blocks[b].ptr, m->index_cap);
    while (m->index[s]) s = (s + 1) & (m->index_cap - 1);
    m->index[s] = b + 1;
}

/* Rebuilds the index at a capacity that keeps it at most half full with
 * `want` blocks; it never shrinks, so a rebuild for fewer blocks cannot fail. */
static int index_rebuild(impl *m, size_t want) {
    size_t cap = m->index_cap ? m->index_cap : 64;
    while (cap < 2 * want) cap *= 2;
    if (cap != m->index_cap) {
        int32_t *ix = calloc(cap, sizeof *ix);
        if (!ix) return -1;
        free(m->index);
        m->index = ix;
        m->index_cap = cap;
    } else {
        memset(m->index, 0, cap * sizeof *m->index);
    }
    for (int32_t b = 0; b < m->nblocks; b++) index_insert(m, b);
    return 0;
}

static int32_t index_find(const impl *m, const void *p) {
    size_t s = slot_of(p, m->index_cap);
    while (m->index[s]) {
        const int32_t b = m->index[s] - 1;
        if (m->blocks[b].ptr == p) return b;
        s = (s + 1) & (m->index_cap - 1);
    }
    return -1;
}

/* The bin of `size`, inserted (kept sorted) when `create`; -1 if absent or
 * out of memory. */
static int32_t bin_find(impl *m, size_t size, int create) {
    int32_t lo = 0, hi = m->nbins;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (m->bins[mid].size < size) lo = mid + 1;
        else hi = mid;
    }
    if (lo < m->nbins && m->bins[lo].size == size) return lo;
    if (!create) return -1;
    if (m->nbins == m->cap_bins) {
        const int32_t cap = m->cap_bins ? 2 * m->cap_bins : 32;
        bin *nb = realloc(m->bins, (size_t)cap * sizeof *nb);
        if (!nb) return -1;
        m->bins = nb;
        m->cap_bins = cap;
    }
    memmove(m->bins + lo + 1, m->bins + lo, (size_t)(m->nbins - lo) * sizeof *m->bins);
    m->bins[lo] = (bin){size, -1};
    m->nbins++;
    return lo;
}

vh_status vh_cuda_alloc_init(vh_cuda_alloc *a, const vh_cuda_alloc_backend *backend) {
    memset(a, 0, sizeof *a);
    if (!backend || !backend->malloc_fn || !backend->free_fn) return VH_STATUS_ERR_INVALID_ARG;
    impl *m = calloc(1, sizeof *m);
    if (!m) return VH_STATUS_ERR_NOMEM;
    if (pthread_mutex_init(&m->mu, NULL) != 0 || index_rebuild(m, 0) != 0) {
        free(m);
        return VH_STATUS_ERR_NOMEM;
    }
    a->backend = *backend;
    a->impl = m;
    return VH_STATUS_OK;
}

void vh_cuda_alloc_free(vh_cuda_alloc *a) {
    impl *m = a->impl;
    if (!m) return;
    for (int32_t b = 0; b < m->nblocks; b++) a->backend.free_fn(a->backend.ctx, m->blocks[b].ptr);
    pthread_mutex_destroy(&m->mu);
    free(m->blocks);
    free(m->index);
    free(m->bins);
    free(m);
    a->impl = NULL;
}

/* Every free block back to the backend; the array compacted, the index
 * rebuilt, every bin emptied. Under the mutex. */
static size_t trim_locked(vh_cuda_alloc *a, impl *m) {
    size_t bytes = 0;
    int32_t kept = 0;
    for (int32_t b = 0; b < m->nblocks; b++) {
        if (m->blocks[b].in_use) {
            m->blocks[kept++] = m->blocks[b];
            continue;
        }
        a->backend.free_fn(a->backend.ctx, m->blocks[b].ptr);
        m->stats.backend_frees++;
        m->stats.reserved_bytes -= m->blocks[b].size;
        bytes += m->blocks[b].size;
    }
    m->nblocks = kept;
    for (int32_t i = 0; i < m->nbins; i++) m->bins[i].head = -1;
    (void)index_rebuild(m, (size_t)kept); /* fewer blocks: cannot fail */
    return bytes;
}

/* A free block of `size` that `tag` may take, unlinked from its bin; -1 if
 * none. */
static int32_t take_cached(impl *m, size_t size, const void *tag) {
    const int32_t i = bin_find(m, size, 0);
    if (i < 0) return -1;
    int32_t *link = &m->bins[i].head;
    while (*link >= 0) {
        block *k = &m->blocks[*link];
        if (!k->tag || k->tag == tag) {
            const int32_t b = *link;
            *link = k->next;
            return b;
        }
        link = &k->next;
    }
    return -1;
}

/* A new block from the backend (trim and retry once on failure). */
static vh_status fresh_block(vh_cuda_alloc *a, impl *m, size_t size, int32_t *out) {
    if (m->nblocks == m->cap_blocks) {
        const int32_t cap = m->cap_blocks ? 2 * m->cap_blocks : 64;
        block *nb = realloc(m->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return VH_STATUS_ERR_NOMEM;
        m->blocks = nb;
        m->cap_blocks = cap;
    }
    if ((size_t)(m->nblocks + 1) * 2 > m->index_cap &&
        index_rebuild(m, (size_t)m->nblocks + 1) != 0)
        return VH_STATUS_ERR_NOMEM;
    void *p = NULL;
    m->stats.backend_allocs++;
    if (a->backend.malloc_fn(a->backend.ctx, size, &p) != 0 || !p) {
        if (trim_locked(a, m) == 0) return VH_STATUS_ERR_NOMEM;
        p = NULL;
        m->stats.backend_allocs++;
        if (a->backend.malloc_fn(a->backend.ctx, size, &p) != 0 || !p)
            return VH_STATUS_ERR_NOMEM;
    }
    const int32_t b = m->nblocks++;
    m->blocks[b] = (block){p, size, NULL, -1, 0};
    index_insert(m, b);
    m->stats.reserved_bytes += size;
    *out = b;
    return VH_STATUS_OK;
}

vh_status vh_cuda_alloc_get(vh_cuda_alloc *a, size_t bytes, const void *tag, void **out) {
    impl *m = a->impl;
    if (!m || !out) return VH_STATUS_ERR_INVALID_ARG;
    *out = NULL;
    const size_t size = vh_cuda_alloc_round(bytes);
    if (size < bytes) return VH_STATUS_ERR_NOMEM; /* rounding overflowed */
    vh_status st = VH_STATUS_OK;
    pthread_mutex_lock(&m->mu);
    int32_t b = take_cached(m, size, tag);
    if (b >= 0) m->stats.hits++;
    else st = fresh_block(a, m, size, &b);
    if (st == VH_STATUS_OK) {
        block *k = &m->blocks[b];
        k->in_use = 1;
        k->tag = tag;
        k->next = -1;
        m->stats.bytes_in_use += size;
        if (m->stats.bytes_in_use > m->stats.peak_bytes) m->stats.peak_bytes = m->stats.bytes_in_use;
        *out = k->ptr;
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

vh_status vh_cuda_alloc_put(vh_cuda_alloc *a, void *ptr) {
    impl *m = a->impl;
    if (!ptr) return VH_STATUS_OK;
    if (!m) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st = VH_STATUS_OK;
    pthread_mutex_lock(&m->mu);
    const int32_t b = index_find(m, ptr);
    const int32_t i = b >= 0 && m->blocks[b].in_use ? bin_find(m, m->blocks[b].size, 1) : -1;
    if (b < 0 || !m->blocks[b].in_use) {
        st = VH_STATUS_ERR_INVALID_ARG; /* not ours, or put twice */
    } else if (i < 0) {
        st = VH_STATUS_ERR_NOMEM; /* no room for a new bin: the block stays in use */
    } else {
        block *k = &m->blocks[b];
        k->in_use = 0;
        k->next = m->bins[i].head;
        m->bins[i].head = b;
        m->stats.bytes_in_use -= k->size;
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

void vh_cuda_alloc_release(vh_cuda_alloc *a, const void *tag) {
    impl *m = a->impl;
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    for (int32_t b = 0; b < m->nblocks; b++)
        if (!m->blocks[b].in_use && (!tag || m->blocks[b].tag == tag)) m->blocks[b].tag = NULL;
    pthread_mutex_unlock(&m->mu);
}

size_t vh_cuda_alloc_trim(vh_cuda_alloc *a) {
    impl *m = a->impl;
    if (!m) return 0;
    pthread_mutex_lock(&m->mu);
    const size_t bytes = trim_locked(a, m);
    pthread_mutex_unlock(&m->mu);
    return bytes;
}

void vh_cuda_alloc_get_stats(vh_cuda_alloc *a, vh_cuda_alloc_stats *out) {
    impl *m = a->impl;
    memset(out, 0, sizeof *out);
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    *out = m->stats;
    pthread_mutex_unlock(&m->mu);
}

void vh_cuda_alloc_reset_peak(vh_cuda_alloc *a) {
    impl *m = a->impl;
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stats.peak_bytes = m->stats.bytes_in_use;
    pthread_mutex_unlock(&m->mu);
}
