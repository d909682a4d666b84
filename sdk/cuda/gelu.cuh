/* gelu.cuh - the erf GELU of the CUDA kernels (eltwise.cu, gemm.cu's
 * epilogue): the CPU twin's formula itself (sdk/src/gelu_erf.h, with CUDA's
 * expf), so that both devices agree to a few ulp. */
#ifndef VH_CUDA_GELU_CUH
#define VH_CUDA_GELU_CUH

#include "../src/gelu_erf.h"

/* GELU(x) = x Phi(x). */
__device__ __forceinline__ float vh_cuda_gelu(float x) {
    float pdf;
    return x * vh_gelu_cdf(x, &pdf);
}

/* GELU'(x) = Phi(x) + x phi(x). */
__device__ __forceinline__ float vh_cuda_gelu_grad(float x) {
    float pdf;
    const float cdf = vh_gelu_cdf(x, &pdf);
    return cdf + x * pdf;
}

#endif
