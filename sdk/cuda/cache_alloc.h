/* cache_alloc.h - the CUDA device's caching allocator, as plain C over an
 * allocation backend (cudaMalloc/cudaFree in the library, a fake in
 * tests/cuda/test_cuda_alloc.c). Placeholder: the bookkeeping is being written. */
#ifndef VH_CUDA_CACHE_ALLOC_H
#define VH_CUDA_CACHE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

typedef struct vh_cuda_alloc_backend {
    void *ctx;
    int (*malloc_fn)(void *ctx, size_t bytes, void **out); /* 0 on success */
    void (*free_fn)(void *ctx, void *ptr);
} vh_cuda_alloc_backend;

typedef struct vh_cuda_alloc {
    vh_cuda_alloc_backend backend;
    void *impl;
} vh_cuda_alloc;

#endif
