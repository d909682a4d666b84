/* reduce.cuh - the grid-stride loop and block-wide reductions of the simple
 * kernels (eltwise.cu, layernorm.cu, tokens.cu, loss.cu, multi_tensor.cu).
 *
 * A tree: warp shuffles (xor butterfly), then warp 0 reduces the warps'
 * results from shared memory. The order of the additions depends only on
 * blockDim, never on timing, so a result is the same bits on every run.
 * Every thread of the block must call, and every thread gets the result.
 * blockDim.x is a multiple of 32, at most 1024. */
#ifndef VH_CUDA_REDUCE_CUH
#define VH_CUDA_REDUCE_CUH

/* A grid-stride loop of i over [0, n): every thread of the grid, then the
 * next grid's worth, so any n fits a grid from launch.h. */
#define VH_CUDA_GRID_LOOP(i, n)                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float vh_cuda_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double vh_cuda_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* max that keeps a NaN of either side out (as the CPU's `a > b ? a : b`
 * scan; a NaN row still ends NaN through the sums after it). */
__device__ __forceinline__ float vh_cuda_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The block's sum of v. `shm` holds 32 floats; it is free again on return. */
__device__ __forceinline__ float vh_cuda_block_sum(float v, float *shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = vh_cuda_warp_sum(v);
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < warps ? shm[lane] : 0.0f;
    v = vh_cuda_warp_sum(v);
    __syncthreads(); /* shm may be reused by the next call */
    return v;
}

__device__ __forceinline__ double vh_cuda_block_sum_d(double v, double *shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = vh_cuda_warp_sum_d(v);
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < warps ? shm[lane] : 0.0;
    v = vh_cuda_warp_sum_d(v);
    __syncthreads();
    return v;
}

__device__ __forceinline__ float vh_cuda_block_max(float v, float *shm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = vh_cuda_warp_max(v);
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < warps ? shm[lane] : -INFINITY;
    v = vh_cuda_warp_max(v);
    __syncthreads();
    return v;
}

/* A value rounded to `dtype` and widened back: what a store then a load of
 * it would give. */
__device__ __forceinline__ float vh_cuda_round(int32_t dtype, float v) {
    if (dtype == VH_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (dtype == VH_DTYPE_F16) return __half2float(__float2half_rn(v));
    return v;
}

#endif
