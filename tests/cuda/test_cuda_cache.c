/* test_cuda_cache.c - the shape-keyed cache of the CUDA GEMM plans
 * (sdk/cuda/shape_cache.c) on the CPU: get/put, first value kept, growth,
 * destruction of every value, byte-wise keys. No GPU needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shape_cache.h"

typedef struct key {
    int32_t dtype, trans;
    int64_t m, n, k;
} key;

static int destroyed;

static void destroy_value(void *v, void *ctx) {
    assert_ptr_equal(ctx, &destroyed);
    destroyed++;
    free(v);
}

static key make_key(int64_t m, int64_t n, int64_t k) {
    key x;
    memset(&x, 0, sizeof x); /* padding compares too */
    x.dtype = 2, x.trans = 1, x.m = m, x.n = n, x.k = k;
    return x;
}

static int *value_of(int v) {
    int *p = malloc(sizeof *p);
    assert_non_null(p);
    *p = v;
    return p;
}

static void test_get_put(void **state) {
    (void)state;
    destroyed = 0;
    vh_cuda_shape_cache *c = vh_cuda_shape_cache_create(sizeof(key), destroy_value, &destroyed);
    assert_non_null(c);
    key a = make_key(197, 768, 3072), b = make_key(197, 3072, 768);
    assert_null(vh_cuda_shape_cache_get(c, &a));
    int *va = value_of(1);
    assert_ptr_equal(vh_cuda_shape_cache_put(c, &a, va), va);
    assert_ptr_equal(vh_cuda_shape_cache_get(c, &a), va);
    assert_null(vh_cuda_shape_cache_get(c, &b));
    /* A second put of the same key keeps the first value, destroys the new. */
    int *again = value_of(2);
    assert_ptr_equal(vh_cuda_shape_cache_put(c, &a, again), va);
    assert_int_equal(destroyed, 1);
    assert_int_equal(vh_cuda_shape_cache_count(c), 1);
    assert_null(vh_cuda_shape_cache_put(c, &b, NULL)); /* NULL is never stored */
    assert_int_equal(vh_cuda_shape_cache_count(c), 1);
    vh_cuda_shape_cache_free(c);
    assert_int_equal(destroyed, 2);
}

static void test_growth(void **state) {
    (void)state;
    destroyed = 0;
    vh_cuda_shape_cache *c = vh_cuda_shape_cache_create(sizeof(key), destroy_value, &destroyed);
    assert_non_null(c);
    enum { N = 1000 };
    for (int i = 0; i < N; i++) {
        key x = make_key(i, 2 * i + 1, 3);
        assert_non_null(vh_cuda_shape_cache_put(c, &x, value_of(i)));
    }
    assert_int_equal(vh_cuda_shape_cache_count(c), N);
    for (int i = 0; i < N; i++) {
        key x = make_key(i, 2 * i + 1, 3);
        const int *v = vh_cuda_shape_cache_get(c, &x);
        assert_non_null(v);
        assert_int_equal(*v, i);
        key y = make_key(i, 2 * i + 1, 4);
        assert_null(vh_cuda_shape_cache_get(c, &y));
    }
    vh_cuda_shape_cache_clear(c);
    assert_int_equal(destroyed, N);
    assert_int_equal(vh_cuda_shape_cache_count(c), 0);
    key x = make_key(5, 11, 3);
    assert_null(vh_cuda_shape_cache_get(c, &x));
    assert_non_null(vh_cuda_shape_cache_put(c, &x, value_of(7))); /* usable after clear */
    vh_cuda_shape_cache_free(c);
    assert_int_equal(destroyed, N + 1);
}

/* Keys are bytes: one differing byte anywhere is another key. */
static void test_bytes(void **state) {
    (void)state;
    vh_cuda_shape_cache *c = vh_cuda_shape_cache_create(24, NULL, NULL);
    assert_non_null(c);
    unsigned char k[24] = {0};
    static int values[24];
    assert_non_null(vh_cuda_shape_cache_put(c, k, &values[0]));
    for (int i = 1; i < 24; i++) {
        unsigned char k2[24] = {0};
        k2[i] = 1;
        assert_null(vh_cuda_shape_cache_get(c, k2));
        assert_ptr_equal(vh_cuda_shape_cache_put(c, k2, &values[i]), &values[i]);
    }
    assert_ptr_equal(vh_cuda_shape_cache_get(c, k), &values[0]);
    assert_int_equal(vh_cuda_shape_cache_count(c), 24);
    vh_cuda_shape_cache_free(c); /* no destructor: the values are not freed */
    assert_null(vh_cuda_shape_cache_create(0, NULL, NULL));
    vh_cuda_shape_cache_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_put),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
