/* test_cuda_attention_launch.c - the attention's launch arithmetic
 * (sdk/cuda/launch.h) on the CPU: tile and row-block counts for odd token
 * counts and head dims, the fused kernel's compiled head size, row-kernel
 * threads, the grid limits. Runs everywhere (no GPU). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "launch.h"

static void test_tiles_cover_odd_extents(void **state) {
    (void)state;
    const int64_t n[] = {1, 15, 16, 17, 24, 50, 64, 65, 130, 197, 257};
    for (size_t c = 0; c < sizeof n / sizeof n[0]; c++) {
        const int64_t t = vh_cuda_attn_tiles(n[c]), rb = vh_cuda_attn_row_blocks(n[c]);
        /* enough tiles to cover n, and not one more */
        assert_true(t * VH_CUDA_ATTN_TILE >= n[c]);
        assert_true((t - 1) * VH_CUDA_ATTN_TILE < n[c]);
        assert_true(rb * VH_CUDA_ATTN_ROWS >= n[c]);
        assert_true((rb - 1) * VH_CUDA_ATTN_ROWS < n[c]);
    }
    assert_int_equal(vh_cuda_attn_tiles(17), 2);
    assert_int_equal(vh_cuda_attn_tiles(197), 13);
    assert_int_equal(vh_cuda_attn_tiles(24), 2);
    assert_int_equal(vh_cuda_attn_row_blocks(65), 5);
    assert_int_equal(vh_cuda_attn_tiles(0), 0);
}

static void test_fused_head_sizes(void **state) {
    (void)state;
    assert_int_equal(vh_cuda_attn_fused_dim(1), 32);
    assert_int_equal(vh_cuda_attn_fused_dim(16), 32);
    assert_int_equal(vh_cuda_attn_fused_dim(24), 32);
    assert_int_equal(vh_cuda_attn_fused_dim(32), 32);
    assert_int_equal(vh_cuda_attn_fused_dim(33), 64);
    assert_int_equal(vh_cuda_attn_fused_dim(64), 64);
    assert_int_equal(vh_cuda_attn_fused_dim(96), 128);
    assert_int_equal(vh_cuda_attn_fused_dim(128), 128);
    assert_int_equal(vh_cuda_attn_fused_dim(129), 0); /* the tiled path */
    assert_int_equal(vh_cuda_attn_fused_dim(0), 0);
    /* The fused kernel's mapping: a half warp per query row, whole key tiles
     * per lane, the head split evenly over the lanes. */
    assert_int_equal(VH_CUDA_THREADS / VH_CUDA_ATTN_ROWS, 16);
    assert_int_equal(VH_CUDA_ATTN_KEYS % 16, 0);
}

static void test_row_threads(void **state) {
    (void)state;
    assert_int_equal(vh_cuda_attn_row_threads(1), 32);
    assert_int_equal(vh_cuda_attn_row_threads(17), 32);
    assert_int_equal(vh_cuda_attn_row_threads(33), 64);
    assert_int_equal(vh_cuda_attn_row_threads(197), 224);
    assert_int_equal(vh_cuda_attn_row_threads(100000), VH_CUDA_THREADS);
    for (int64_t n = 1; n < 1000; n += 7) assert_int_equal(vh_cuda_attn_row_threads(n) % 32, 0);
}

static void test_grid_limits(void **state) {
    (void)state;
    assert_true(vh_cuda_attn_grid_fits(256, 12, 197, 64));
    assert_true(vh_cuda_attn_grid_fits(0, 12, 197, 64)); /* empty: nothing launches */
    assert_true(vh_cuda_attn_grid_fits(1, 1, 16 * 65535, 16));
    assert_false(vh_cuda_attn_grid_fits(1, 1, 16 * 65535 + 1, 16));
    assert_false(vh_cuda_attn_grid_fits(1, 1, 17, 16 * 65535 + 1));
    assert_true(vh_cuda_attn_grid_fits(65536, 32767, 17, 16));
    assert_false(vh_cuda_attn_grid_fits(65536, 32768, 17, 16)); /* 2^31 blocks */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiles_cover_odd_extents),
        cmocka_unit_test(test_fused_head_sizes),
        cmocka_unit_test(test_row_threads),
        cmocka_unit_test(test_grid_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
