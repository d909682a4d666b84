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

/* ---- attention (attention.cu) ----
 * Tiled products: VH_CUDA_ATTN_TILE^2 threads per block, one output element
 * each; grid (batch * heads, column tiles, row tiles). The fused forward:
 * VH_CUDA_ATTN_ROWS query rows per block of VH_CUDA_THREADS threads, keys in
 * tiles of VH_CUDA_ATTN_KEYS; grid (batch * heads, row blocks). */
#define VH_CUDA_ATTN_TILE 16
#define VH_CUDA_ATTN_ROWS 16
#define VH_CUDA_ATTN_KEYS 32
/* The fused forward's largest head: its kernel is compiled for 32, 64, 128. */
#define VH_CUDA_ATTN_MAX_HEAD_DIM 128
/* The limit of gridDim.y and gridDim.z. */
#define VH_CUDA_ATTN_GRID_YZ_MAX 65535

/* Tiles of the products over an extent of n (tokens or head_dim). */
static inline int64_t vh_cuda_attn_tiles(int64_t n) {
    return vh_cuda_ceil_div(n, VH_CUDA_ATTN_TILE);
}

/* Query-row blocks of the fused forward over n tokens. */
static inline int64_t vh_cuda_attn_row_blocks(int64_t n) {
    return vh_cuda_ceil_div(n, VH_CUDA_ATTN_ROWS);
}

/* The compiled head size of the fused forward that holds head_dim (32, 64
 * or 128), or 0 when head_dim is over VH_CUDA_ATTN_MAX_HEAD_DIM (the tiled
 * path runs then). */
static inline int vh_cuda_attn_fused_dim(int64_t head_dim) {
    if (head_dim <= 0 || head_dim > VH_CUDA_ATTN_MAX_HEAD_DIM) return 0;
    return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : 128;
}

/* Threads of the attention's row kernels (softmax and its gradient) over
 * rows of n: whole warps, at least one, at most VH_CUDA_THREADS. */
static inline unsigned vh_cuda_attn_row_threads(int64_t n) {
    int64_t t = vh_cuda_ceil_div(n, 32) * 32;
    if (t < 32) t = 32;
    return (unsigned)(t > VH_CUDA_THREADS ? VH_CUDA_THREADS : t);
}

/* 1 when every attention grid fits the hardware's limits: batch * heads
 * blocks in gridDim.x (2^31 - 1), the tiles and row blocks of tokens and the
 * tiles of head_dim in gridDim.y and .z (the row kernels loop, grid-stride). */
static inline int vh_cuda_attn_grid_fits(int64_t batch, int64_t heads, int64_t tokens,
                                         int64_t head_dim) {
    const int64_t x_max = 2147483647;
    if (batch <= 0 || heads <= 0 || tokens <= 0 || head_dim <= 0) return 1;
    if (batch > x_max / heads) return 0;
    return vh_cuda_attn_tiles(tokens) <= VH_CUDA_ATTN_GRID_YZ_MAX &&
           vh_cuda_attn_tiles(head_dim) <= VH_CUDA_ATTN_GRID_YZ_MAX &&
           vh_cuda_attn_row_blocks(tokens) <= VH_CUDA_ATTN_GRID_YZ_MAX;
}

#endif
