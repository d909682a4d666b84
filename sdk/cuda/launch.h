/* launch.h - launch-configuration arithmetic of the CUDA kernels, in plain C
 * so that tests/cuda/test_cuda_launch.c checks it on the CPU: grid sizes,
 * tails, row blocks. Every kernel launch takes its grid from here. */
#ifndef VH_CUDA_LAUNCH_H
#define VH_CUDA_LAUNCH_H

#include <stdint.h>

/* Threads per block of the element-wise and row kernels. */
#define VH_CUDA_THREADS 256
/* Most blocks of a grid-stride loop: enough to fill any GPU of this project
 * (132 SMs x 16 blocks), few enough that a block does real work. */
#define VH_CUDA_MAX_BLOCKS 2112

/* Blocks for n items at `per_block` items each, at least 1 and at most
 * max_blocks (the kernel loops over the rest, grid-stride). */
static inline unsigned vh_cuda_blocks(int64_t n, int64_t per_block, int64_t max_blocks) {
    if (n <= 0 || per_block <= 0) return 1;
    int64_t b = (n + per_block - 1) / per_block;
    if (max_blocks > 0 && b > max_blocks) b = max_blocks;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Blocks of a grid-stride element-wise kernel over n elements. */
static inline unsigned vh_cuda_eltwise_blocks(int64_t n) {
    return vh_cuda_blocks(n, VH_CUDA_THREADS, VH_CUDA_MAX_BLOCKS);
}

/* Ceil division, for tiles. */
static inline int64_t vh_cuda_ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

#endif
