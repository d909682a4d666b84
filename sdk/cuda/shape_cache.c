/* shape_cache.c - see shape_cache.h. Open addressing with linear probing
 * (FNV-1a of the key bytes), at most half full; entries are only removed
 * all at once (clear), so there are no tombstones. */
#include "shape_cache.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct vh_cuda_shape_cache {
    pthread_mutex_t mu;
    size_t key_size;
    void (*destroy)(void *value, void *ctx);
    void *ctx;
    size_t cap, count;   /* cap: a power of two */
    unsigned char *keys; /* cap keys */
    void **values;       /* NULL: empty slot (a NULL value is never stored) */
};

static uint64_t hash_key(const void *key, size_t n) {
    const unsigned char *p = key;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The slot of key, or of the empty slot where it would go. */
static size_t slot_of(const vh_cuda_shape_cache *c, const unsigned char *keys, void *const *values,
                      size_t cap, const void *key) {
    size_t s = (size_t)hash_key(key, c->key_size) & (cap - 1);
    while (values[s] && memcmp(keys + s * c->key_size, key, c->key_size) != 0)
        s = (s + 1) & (cap - 1);
    return s;
}

static int grow(vh_cuda_shape_cache *c, size_t cap) {
    unsigned char *keys = calloc(cap, c->key_size);
    void **values = calloc(cap, sizeof *values);
    if (!keys || !values) {
        free(keys);
        free(values);
        return -1;
    }
    for (size_t i = 0; i < c->cap; i++) {
        if (!c->values[i]) continue;
        const size_t s = slot_of(c, keys, values, cap, c->keys + i * c->key_size);
        memcpy(keys + s * c->key_size, c->keys + i * c->key_size, c->key_size);
        values[s] = c->values[i];
    }
    free(c->keys);
    free(c->values);
    c->keys = keys;
    c->values = values;
    c->cap = cap;
    return 0;
}

vh_cuda_shape_cache *vh_cuda_shape_cache_create(size_t key_size,
                                                void (*destroy)(void *value, void *ctx),
                                                void *ctx) {
    if (key_size == 0) return NULL;
    vh_cuda_shape_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->key_size = key_size;
    c->destroy = destroy;
    c->ctx = ctx;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return NULL;
    }
    if (grow(c, 16) != 0) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return NULL;
    }
    return c;
}

static void clear_locked(vh_cuda_shape_cache *c) {
    for (size_t i = 0; i < c->cap; i++) {
        if (c->values[i] && c->destroy) c->destroy(c->values[i], c->ctx);
        c->values[i] = NULL;
    }
    c->count = 0;
}

void vh_cuda_shape_cache_free(vh_cuda_shape_cache *c) {
    if (!c) return;
    clear_locked(c);
    pthread_mutex_destroy(&c->mu);
    free(c->keys);
    free(c->values);
    free(c);
}

void vh_cuda_shape_cache_clear(vh_cuda_shape_cache *c) {
    pthread_mutex_lock(&c->mu);
    clear_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void *vh_cuda_shape_cache_get(vh_cuda_shape_cache *c, const void *key) {
    pthread_mutex_lock(&c->mu);
    void *v = c->values[slot_of(c, c->keys, c->values, c->cap, key)];
    pthread_mutex_unlock(&c->mu);
    return v;
}

void *vh_cuda_shape_cache_put(vh_cuda_shape_cache *c, const void *key, void *value) {
    if (!value) return NULL;
    pthread_mutex_lock(&c->mu);
    void *kept = NULL;
    size_t s = slot_of(c, c->keys, c->values, c->cap, key);
    if (c->values[s]) {
        kept = c->values[s]; /* already there: keep the first */
    } else if (2 * (c->count + 1) > c->cap && grow(c, 2 * c->cap) != 0) {
        kept = NULL; /* out of memory */
    } else {
        s = slot_of(c, c->keys, c->values, c->cap, key);
        memcpy(c->keys + s * c->key_size, key, c->key_size);
        c->values[s] = value;
        c->count++;
        kept = value;
    }
    pthread_mutex_unlock(&c->mu);
    if (kept != value && c->destroy) c->destroy(value, c->ctx);
    return kept;
}

size_t vh_cuda_shape_cache_count(vh_cuda_shape_cache *c) {
    pthread_mutex_lock(&c->mu);
    const size_t n = c->count;
    pthread_mutex_unlock(&c->mu);
    return n;
}
