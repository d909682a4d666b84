/* shape_cache.h - a small hash map from a fixed-size key (bytes) to a value
 * the cache owns, for what cuBLASLt needs per GEMM shape (the matmul
 * descriptor, the four layouts, the chosen algorithm): building them and
 * asking the heuristic costs far more than the GEMM launch, and a training
 * step repeats the same few dozen shapes. Plain C, tested on the CPU
 * (tests/cuda/test_cuda_cache.c).
 *
 * Keys are compared byte for byte: zero a key struct (memset) before filling
 * it, so that padding compares equal. Values are never replaced: a put of a
 * key already present destroys the new value and returns the cached one, so
 * a pointer got from the cache stays valid until the cache is cleared or
 * freed. Every call takes the cache's mutex. */
#ifndef VH_CUDA_SHAPE_CACHE_H
#define VH_CUDA_SHAPE_CACHE_H

#include <stddef.h>

typedef struct vh_cuda_shape_cache vh_cuda_shape_cache;

/* destroy(value, ctx) frees a value (may be NULL: values are not freed). */
vh_cuda_shape_cache *vh_cuda_shape_cache_create(size_t key_size,
                                                void (*destroy)(void *value, void *ctx),
                                                void *ctx);
/* Destroys every value, then the cache. NULL is fine. */
void vh_cuda_shape_cache_free(vh_cuda_shape_cache *c);

/* The value of `key`, or NULL. */
void *vh_cuda_shape_cache_get(vh_cuda_shape_cache *c, const void *key);
/* Inserts value under key and returns the value now cached for key: value,
 * or the one already there (value is destroyed then). NULL when out of
 * memory (value is destroyed then too). */
void *vh_cuda_shape_cache_put(vh_cuda_shape_cache *c, const void *key, void *value);
size_t vh_cuda_shape_cache_count(vh_cuda_shape_cache *c);
/* Destroys every value; the cache stays usable. */
void vh_cuda_shape_cache_clear(vh_cuda_shape_cache *c);

#endif
