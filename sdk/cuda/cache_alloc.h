/* cache_alloc.h - the CUDA device's caching allocator, as plain C over an
 * allocation backend (cudaMalloc/cudaFree in the library, a fake in
 * tests/cuda/test_cuda_alloc.c, which checks the bookkeeping on the CPU).
 *
 * Why: cudaMalloc and cudaFree are slow and cudaFree synchronizes the device,
 * so a training step that allocates its activations and temporaries afresh
 * would stall on every one. Blocks go back to a free list on put and are
 * handed out again to a get of the same rounded size.
 *
 * Rules, kept simple on purpose:
 * - Sizes are rounded up: to 512 bytes up to 1 MiB, to 2 MiB above. A free
 *   block serves only a get of exactly its rounded size (no splitting, no
 *   best fit), so a block is never shared and the bookkeeping stays a list
 *   per size. A step's shapes repeat, so after the first step every get is
 *   a hit.
 * - Stream order: every block carries the tag (the cudaStream_t) it was got
 *   on. A freed block is handed out again only to a get with the same tag
 *   (work on one stream runs in issue order, so the new owner's work starts
 *   after the old owner's) or, after vh_cuda_alloc_release(tag or NULL), to
 *   anyone: the caller releases a tag once that stream has been synchronized.
 * - When the backend fails, the cache is trimmed (every free block returned
 *   to the backend) and the allocation retried once.
 * - Every call takes the allocator's mutex: ranks-as-threads share devices.
 */
#ifndef VH_CUDA_CACHE_ALLOC_H
#define VH_CUDA_CACHE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_status.h"

/* Rounding of request sizes (see above). */
#define VH_CUDA_ALLOC_SMALL_ROUND ((size_t)512)
#define VH_CUDA_ALLOC_SMALL_MAX ((size_t)1 << 20)
#define VH_CUDA_ALLOC_LARGE_ROUND ((size_t)2 << 20)

typedef struct vh_cuda_alloc_backend {
    void *ctx;
    int (*malloc_fn)(void *ctx, size_t bytes, void **out); /* 0 on success */
    void (*free_fn)(void *ctx, void *ptr);
} vh_cuda_alloc_backend;

typedef struct vh_cuda_alloc_stats {
    size_t bytes_in_use;    /* rounded sizes of the blocks handed out now */
    size_t peak_bytes;      /* the most bytes_in_use has been (since reset_peak) */
    size_t reserved_bytes;  /* held from the backend: in use + cached */
    uint64_t backend_allocs; /* malloc_fn calls, failed ones included */
    uint64_t backend_frees;  /* free_fn calls */
    uint64_t hits;           /* gets served from the cache */
} vh_cuda_alloc_stats;

typedef struct vh_cuda_alloc {
    vh_cuda_alloc_backend backend;
    void *impl;
} vh_cuda_alloc;

/* The rounded size of a request of `bytes` (0 counts as 1). */
size_t vh_cuda_alloc_round(size_t bytes);

/* VH_STATUS_ERR_NOMEM when the bookkeeping cannot be allocated. */
vh_status vh_cuda_alloc_init(vh_cuda_alloc *a, const vh_cuda_alloc_backend *backend);
/* Returns every block, cached or still in use, to the backend. */
void vh_cuda_alloc_free(vh_cuda_alloc *a);

/* A block of at least `bytes` on stream `tag`. VH_STATUS_ERR_NOMEM when the
 * backend fails even after a trim. */
vh_status vh_cuda_alloc_get(vh_cuda_alloc *a, size_t bytes, const void *tag, void **out);
/* Back to the cache. VH_STATUS_ERR_INVALID_ARG for a pointer this allocator
 * did not hand out, or one already put back (nothing changes then). NULL is
 * fine. */
vh_status vh_cuda_alloc_put(vh_cuda_alloc *a, void *ptr);
/* The cached blocks of stream `tag` (NULL: of every stream) become free for
 * any stream: call it when that stream (or the device) has been
 * synchronized. */
void vh_cuda_alloc_release(vh_cuda_alloc *a, const void *tag);
/* Returns the cached (free) blocks to the backend; the bytes returned. */
size_t vh_cuda_alloc_trim(vh_cuda_alloc *a);

void vh_cuda_alloc_get_stats(vh_cuda_alloc *a, vh_cuda_alloc_stats *out);
/* peak_bytes = bytes_in_use from now on. */
void vh_cuda_alloc_reset_peak(vh_cuda_alloc *a);

#endif
