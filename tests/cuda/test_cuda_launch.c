/* test_cuda_launch.c - the launch arithmetic of the CUDA kernels
 * (sdk/cuda/launch.h) on the CPU: grid sizes, tails, caps. No GPU needed.
 * Helpers added to launch.h get their case here (append). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "launch.h"

/* Every one of n items is visited exactly once by a grid-stride loop over
 * blocks * threads threads (checked by counting, for small n). */
static void check_covers(int64_t n, unsigned blocks, int64_t threads) {
    const int64_t stride = (int64_t)blocks * threads;
    int64_t visits = 0;
    for (int64_t t = 0; t < stride; t++)
        for (int64_t i = t; i < n; i += stride) visits++;
    assert_int_equal(visits, n);
}

static void test_blocks(void **state) {
    (void)state;
    assert_int_equal(vh_cuda_blocks(0, 256, 100), 1);  /* an empty launch still has a block */
    assert_int_equal(vh_cuda_blocks(-5, 256, 100), 1);
    assert_int_equal(vh_cuda_blocks(10, 0, 100), 1);
    assert_int_equal(vh_cuda_blocks(1, 256, 100), 1);
    assert_int_equal(vh_cuda_blocks(256, 256, 100), 1);
    assert_int_equal(vh_cuda_blocks(257, 256, 100), 2);  /* the tail gets its block */
    assert_int_equal(vh_cuda_blocks(256 * 100 + 1, 256, 100), 100); /* capped: grid-stride */
    assert_int_equal(vh_cuda_blocks(1000, 7, 0), 143);   /* no cap */
    assert_int_equal(vh_cuda_blocks((int64_t)1 << 40, 256, VH_CUDA_MAX_BLOCKS), VH_CUDA_MAX_BLOCKS);
}

static void test_eltwise_blocks(void **state) {
    (void)state;
    assert_int_equal(vh_cuda_eltwise_blocks(0), 1);
    assert_int_equal(vh_cuda_eltwise_blocks(1), 1);
    assert_int_equal(vh_cuda_eltwise_blocks(VH_CUDA_THREADS), 1);
    assert_int_equal(vh_cuda_eltwise_blocks(VH_CUDA_THREADS + 1), 2);
    assert_int_equal(vh_cuda_eltwise_blocks((int64_t)VH_CUDA_THREADS * VH_CUDA_MAX_BLOCKS),
                     VH_CUDA_MAX_BLOCKS);
    assert_int_equal(vh_cuda_eltwise_blocks((int64_t)1 << 33), VH_CUDA_MAX_BLOCKS);
    /* Odd sizes, including the GEMM epilogue's batch * m * n of 3 x 17 x 33. */
    const int64_t sizes[] = {1, 17, 255, 256, 257, 3 * 17 * 33, 100003};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        check_covers(sizes[i], vh_cuda_eltwise_blocks(sizes[i]), VH_CUDA_THREADS);
    /* The convert kernel's groups of 4 and its tail. */
    for (int64_t n = 0; n < 12; n++) {
        const int64_t groups = n / 4, tail = n - 4 * groups;
        assert_true(tail >= 0 && tail < 4);
        check_covers(groups, vh_cuda_eltwise_blocks(groups), VH_CUDA_THREADS);
    }
    /* The limit of gridDim.x (2^31 - 1) is never approached. */
    assert_true(VH_CUDA_MAX_BLOCKS < 2147483647);
}

static void test_ceil_div(void **state) {
    (void)state;
    assert_int_equal(vh_cuda_ceil_div(0, 16), 0);
    assert_int_equal(vh_cuda_ceil_div(1, 16), 1);
    assert_int_equal(vh_cuda_ceil_div(16, 16), 1);
    assert_int_equal(vh_cuda_ceil_div(17, 16), 2);
    assert_int_equal(vh_cuda_ceil_div(197, 16), 13);
    assert_int_equal(vh_cuda_ceil_div(5, 0), 0);
    assert_int_equal(vh_cuda_ceil_div(5, -1), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_eltwise_blocks),
        cmocka_unit_test(test_ceil_div),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
