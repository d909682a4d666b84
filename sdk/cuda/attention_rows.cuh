/* attention_rows.cuh - the attention's row kernels, shared by its two paths
 * (attention.cu: tiled and fused; attention_gemm.cu: cuBLASLt products):
 * the softmax of fp32 logits and its gradient. Launch with
 * vh_cuda_attn_row_threads(n) threads (whole warps) and any grid: rows loop
 * grid-stride. */
#ifndef VH_CUDA_ATTENTION_ROWS_CUH
#define VH_CUDA_ATTENTION_ROWS_CUH

#include <math.h>

#include "cuda_internal.h"
#include "reduce.cuh"

/* v as stored in `dtype` (rounded to nearest even) and read back. */
__device__ __forceinline__ float round_to(float v, int32_t dtype) {
    if (dtype == VH_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (dtype == VH_DTYPE_F16) return __half2float(__float2half_rn(v));
    return v;
}

/* probs = softmax of the fp32 logits s, rows of n, as the CPU's
 * vh_softmax_row: e^(s - max) * (1 / sum); and, when p2 is not NULL, the
 * same probabilities as stored in probs, in p2's dtype d2 too (a GEMM
 * operand). Mapping: one block per row (rows loop over the grid), threads
 * stride along the row. Each element is read and written by the same
 * thread, so s may be probs itself (f32). */
__global__ static void softmax_rows_kernel(const float *s, void *probs, int32_t pd, void *p2,
                                           int32_t d2, int64_t rows, int64_t n) {
    __shared__ float shm[32]; /* the block reductions' (reduce.cuh) */
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float *x = s + row * n;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, x[j]);
        mx = vh_cuda_block_max(mx, shm);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(x[j] - mx);
        const float inv = 1.0f / vh_cuda_block_sum(sum, shm);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const float p = expf(x[j] - mx) * inv;
            vh_cuda_store(probs, pd, row * n + j, p);
            if (p2) vh_cuda_store(p2, d2, row * n + j, round_to(p, pd));
        }
    }
}

/* dS = P * (dP - rowsum(dP * P)) from the fp32 dP into dS in `od` (dS may be
 * dP itself when od is f32), P in pd. Mapping as softmax_rows_kernel; each
 * element is read and written by the same thread. */
__global__ static void softmax_grad_rows_kernel(const float *dp, const void *probs, int32_t pd,
                                                void *ds, int32_t od, int64_t rows, int64_t n) {
    __shared__ float shm[32]; /* the block reduction's (reduce.cuh) */
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float *d = dp + row * n;
        float rs = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            rs += d[j] * vh_cuda_load(probs, pd, row * n + j);
        rs = vh_cuda_block_sum(rs, shm);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            vh_cuda_store(ds, od, row * n + j, vh_cuda_load(probs, pd, row * n + j) * (d[j] - rs));
    }
}

#endif
