/* test_cuda_alloc.c - the CUDA device's caching allocator (sdk/cuda/cache_alloc.c)
 * on the CPU, over a fake backend that hands out host memory and can be
 * told to fail: rounding, reuse, stream tags, peak, trim, the trim-and-retry
 * on failure, bad puts, and threads. No GPU needed. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cache_alloc.h"

#define FAKE_MAX 4096

typedef struct fake {
    size_t limit;    /* malloc_fn fails past this many bytes held */
    size_t held;
    int mallocs, frees, failures;
    void *ptr[FAKE_MAX];
    size_t size[FAKE_MAX];
    pthread_mutex_t mu;
} fake;

static int fake_malloc(void *ctx, size_t bytes, void **out) {
    fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->mallocs++;
    int rc = 0;
    if (f->held + bytes > f->limit) {
        f->failures++;
        rc = 2; /* like cudaErrorMemoryAllocation */
    } else {
        int i = 0;
        while (i < FAKE_MAX && f->ptr[i]) i++;
        assert_true(i < FAKE_MAX);
        f->ptr[i] = aligned_alloc(256, (bytes + 255) / 256 * 256);
        assert_non_null(f->ptr[i]);
        f->size[i] = bytes;
        f->held += bytes;
        *out = f->ptr[i];
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void fake_free(void *ctx, void *p) {
    fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    int i = 0;
    while (i < FAKE_MAX && f->ptr[i] != p) i++;
    assert_true(i < FAKE_MAX); /* only what it handed out */
    free(p);
    f->ptr[i] = NULL;
    f->held -= f->size[i];
    f->frees++;
    pthread_mutex_unlock(&f->mu);
}

static fake *fake_new(size_t limit) {
    fake *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->limit = limit;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

static void fake_done(fake *f) {
    assert_int_equal(f->held, 0); /* vh_cuda_alloc_free returned everything */
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void open_alloc(vh_cuda_alloc *a, fake *f) {
    const vh_cuda_alloc_backend b = {f, fake_malloc, fake_free};
    assert_int_equal(vh_cuda_alloc_init(a, &b), VH_STATUS_OK);
}

static const int S1 = 1, S2 = 2; /* two stream tags */

static void test_rounding(void **state) {
    (void)state;
    assert_int_equal(vh_cuda_alloc_round(0), 512);
    assert_int_equal(vh_cuda_alloc_round(1), 512);
    assert_int_equal(vh_cuda_alloc_round(512), 512);
    assert_int_equal(vh_cuda_alloc_round(513), 1024);
    assert_int_equal(vh_cuda_alloc_round((size_t)1 << 20), (size_t)1 << 20);
    assert_int_equal(vh_cuda_alloc_round(((size_t)1 << 20) + 1), (size_t)2 << 20);
    assert_int_equal(vh_cuda_alloc_round((size_t)5 << 20), (size_t)6 << 20);
    assert_int_equal(vh_cuda_alloc_round(((size_t)6 << 20) - 7), (size_t)6 << 20);
}

static void test_reuse_and_stats(void **state) {
    (void)state;
    fake *f = fake_new((size_t)1 << 30);
    vh_cuda_alloc a;
    open_alloc(&a, f);
    void *p = NULL, *q = NULL, *r = NULL;
    assert_int_equal(vh_cuda_alloc_get(&a, 1000, &S1, &p), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_get(&a, 3 << 20, &S1, &q), VH_STATUS_OK);
    vh_cuda_alloc_stats s;
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.bytes_in_use, 1024 + (4 << 20));
    assert_int_equal(s.reserved_bytes, 1024 + (4 << 20));
    assert_int_equal(s.backend_allocs, 2);
    assert_int_equal(vh_cuda_alloc_put(&a, p), VH_STATUS_OK);
    /* The same rounded size comes back from the cache, without the backend. */
    assert_int_equal(vh_cuda_alloc_get(&a, 1024, &S1, &r), VH_STATUS_OK);
    assert_ptr_equal(r, p);
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.backend_allocs, 2);
    assert_int_equal(s.hits, 1);
    /* Another size does not take it. */
    assert_int_equal(vh_cuda_alloc_put(&a, r), VH_STATUS_OK);
    void *big = NULL;
    assert_int_equal(vh_cuda_alloc_get(&a, 2000, &S1, &big), VH_STATUS_OK);
    assert_ptr_not_equal(big, p);
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.backend_allocs, 3);
    assert_int_equal(s.bytes_in_use, 2048 + (4 << 20));
    assert_int_equal(s.peak_bytes, 2048 + (4 << 20));
    assert_int_equal(s.reserved_bytes, 1024 + 2048 + (4 << 20));
    assert_int_equal(vh_cuda_alloc_put(&a, big), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_put(&a, q), VH_STATUS_OK);
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.peak_bytes, 2048 + (4 << 20));
    vh_cuda_alloc_reset_peak(&a);
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.peak_bytes, 0);
    vh_cuda_alloc_free(&a);
    fake_done(f);
}

static void test_stream_tags(void **state) {
    (void)state;
    fake *f = fake_new((size_t)1 << 30);
    vh_cuda_alloc a;
    open_alloc(&a, f);
    void *p = NULL, *q = NULL;
    assert_int_equal(vh_cuda_alloc_get(&a, 4096, &S1, &p), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_put(&a, p), VH_STATUS_OK);
    /* Freed on stream 1: stream 2 may not have it yet (stream 1 may still use it). */
    assert_int_equal(vh_cuda_alloc_get(&a, 4096, &S2, &q), VH_STATUS_OK);
    assert_ptr_not_equal(q, p);
    assert_int_equal(vh_cuda_alloc_put(&a, q), VH_STATUS_OK);
    /* Stream 1 synchronized: its block is anyone's. */
    vh_cuda_alloc_release(&a, &S1);
    void *r = NULL, *t = NULL;
    assert_int_equal(vh_cuda_alloc_get(&a, 4096, &S2, &r), VH_STATUS_OK);
    assert_true(r == p || r == q);
    assert_int_equal(vh_cuda_alloc_get(&a, 4096, &S2, &t), VH_STATUS_OK);
    assert_true((t == p || t == q) && t != r);
    vh_cuda_alloc_stats s;
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.backend_allocs, 2);
    assert_int_equal(vh_cuda_alloc_put(&a, r), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_put(&a, t), VH_STATUS_OK);
    /* Released for every stream (a device synchronize). */
    vh_cuda_alloc_release(&a, NULL);
    assert_int_equal(vh_cuda_alloc_get(&a, 4096, &S1, &r), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_get(&a, 4096, &S1, &t), VH_STATUS_OK);
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.backend_allocs, 2);
    vh_cuda_alloc_free(&a); /* blocks still in use go back too */
    fake_done(f);
}

static void test_trim(void **state) {
    (void)state;
    fake *f = fake_new((size_t)1 << 30);
    vh_cuda_alloc a;
    open_alloc(&a, f);
    void *p[40];
    for (int i = 0; i < 40; i++)
        assert_int_equal(vh_cuda_alloc_get(&a, (size_t)(i + 1) * 700, &S1, &p[i]), VH_STATUS_OK);
    for (int i = 0; i < 40; i += 2) assert_int_equal(vh_cuda_alloc_put(&a, p[i]), VH_STATUS_OK);
    vh_cuda_alloc_stats s0, s1;
    vh_cuda_alloc_get_stats(&a, &s0);
    const size_t freed = vh_cuda_alloc_trim(&a);
    vh_cuda_alloc_get_stats(&a, &s1);
    assert_true(freed > 0);
    assert_int_equal(s1.reserved_bytes, s0.reserved_bytes - freed);
    assert_int_equal(s1.reserved_bytes, s1.bytes_in_use);
    assert_int_equal(f->frees, 20);
    assert_int_equal(f->held, s1.reserved_bytes);
    /* The blocks in use are still known after the trim's rebuild. */
    for (int i = 1; i < 40; i += 2) assert_int_equal(vh_cuda_alloc_put(&a, p[i]), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_trim(&a), s1.reserved_bytes);
    assert_int_equal(f->held, 0);
    assert_int_equal(vh_cuda_alloc_trim(&a), 0);
    vh_cuda_alloc_free(&a);
    fake_done(f);
}

static void test_failure_retry(void **state) {
    (void)state;
    fake *f = fake_new((size_t)8 << 20); /* 8 MiB of "device memory" */
    vh_cuda_alloc a;
    open_alloc(&a, f);
    void *p = NULL, *q = NULL, *r = NULL;
    assert_int_equal(vh_cuda_alloc_get(&a, 6 << 20, &S1, &p), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_put(&a, p), VH_STATUS_OK); /* cached, 6 MiB held */
    /* 4 MiB does not fit beside the cached 6: trim, then the retry fits. */
    assert_int_equal(vh_cuda_alloc_get(&a, 4 << 20, &S1, &q), VH_STATUS_OK);
    assert_int_equal(f->failures, 1);
    assert_int_equal(f->frees, 1);
    vh_cuda_alloc_stats s;
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.reserved_bytes, 4 << 20);
    assert_int_equal(s.backend_allocs, 3);
    /* Too big even with nothing cached: NOMEM, nothing changes. */
    assert_int_equal(vh_cuda_alloc_get(&a, 6 << 20, &S1, &r), VH_STATUS_ERR_NOMEM);
    assert_null(r);
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.bytes_in_use, 4 << 20);
    assert_int_equal(s.reserved_bytes, 4 << 20);
    assert_int_equal(vh_cuda_alloc_put(&a, q), VH_STATUS_OK);
    vh_cuda_alloc_free(&a);
    fake_done(f);
}

static void test_bad_puts(void **state) {
    (void)state;
    fake *f = fake_new((size_t)1 << 30);
    vh_cuda_alloc a;
    open_alloc(&a, f);
    void *p = NULL;
    int local = 0;
    assert_int_equal(vh_cuda_alloc_get(&a, 100, &S1, &p), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_put(&a, NULL), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_put(&a, &local), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(vh_cuda_alloc_put(&a, (char *)p + 256), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(vh_cuda_alloc_put(&a, p), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_put(&a, p), VH_STATUS_ERR_INVALID_ARG); /* twice */
    vh_cuda_alloc_stats s;
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.bytes_in_use, 0); /* the double put changed nothing */
    void *q = NULL, *r = NULL;
    assert_int_equal(vh_cuda_alloc_get(&a, 100, &S1, &q), VH_STATUS_OK);
    assert_int_equal(vh_cuda_alloc_get(&a, 100, &S1, &r), VH_STATUS_OK);
    assert_ptr_not_equal(q, r); /* the block was listed free once, not twice */
    vh_cuda_alloc_free(&a);
    fake_done(f);
}

/* Many blocks: the pointer index grows and still finds every one. */
static void test_many_blocks(void **state) {
    (void)state;
    fake *f = fake_new((size_t)1 << 34);
    vh_cuda_alloc a;
    open_alloc(&a, f);
    enum { N = 1500 };
    void **p = calloc(N, sizeof *p);
    assert_non_null(p);
    for (int i = 0; i < N; i++)
        assert_int_equal(vh_cuda_alloc_get(&a, (size_t)(i % 37 + 1) * 512, &S1, &p[i]), VH_STATUS_OK);
    for (int i = N - 1; i >= 0; i--) assert_int_equal(vh_cuda_alloc_put(&a, p[i]), VH_STATUS_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(vh_cuda_alloc_get(&a, (size_t)(i % 37 + 1) * 512, &S1, &p[i]), VH_STATUS_OK);
    vh_cuda_alloc_stats s;
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.backend_allocs, N);
    assert_int_equal(s.hits, N);
    free(p);
    vh_cuda_alloc_free(&a);
    fake_done(f);
}

typedef struct worker {
    vh_cuda_alloc *a;
    int id;
} worker;

static void *worker_run(void *arg) {
    worker *w = arg;
    void *p[8];
    for (int round = 0; round < 500; round++) {
        for (int i = 0; i < 8; i++)
            if (vh_cuda_alloc_get(w->a, (size_t)(i + 1) * 1000, w, &p[i]) != VH_STATUS_OK) return w;
        for (int i = 0; i < 8; i++) memset(p[i], w->id, 64); /* ours alone */
        for (int i = 0; i < 8; i++) {
            const unsigned char *c = p[i];
            if (c[0] != (unsigned char)w->id || c[63] != (unsigned char)w->id) return w;
        }
        for (int i = 0; i < 8; i++)
            if (vh_cuda_alloc_put(w->a, p[i]) != VH_STATUS_OK) return w;
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    fake *f = fake_new((size_t)1 << 32);
    vh_cuda_alloc a;
    open_alloc(&a, f);
    pthread_t th[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){&a, i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *ret = &a;
        pthread_join(th[i], &ret);
        assert_null(ret);
    }
    vh_cuda_alloc_stats s;
    vh_cuda_alloc_get_stats(&a, &s);
    assert_int_equal(s.bytes_in_use, 0);
    assert_true(s.backend_allocs <= 4 * 8); /* each thread's tag reuses its own blocks */
    vh_cuda_alloc_free(&a);
    fake_done(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding),      cmocka_unit_test(test_reuse_and_stats),
        cmocka_unit_test(test_stream_tags),   cmocka_unit_test(test_trim),
        cmocka_unit_test(test_failure_retry), cmocka_unit_test(test_bad_puts),
        cmocka_unit_test(test_many_blocks),   cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
