/* gelu.cuh - the erf GELU of the CUDA kernels (eltwise.cu, gemm.cu's
 * epilogue): the very formula of the CPU twin (sdk/src/cpu/activations.c,
 * gelu_cdf), so that both devices agree to a few ulp.
 *
 * GELU(x) = x Phi(x), GELU'(x) = Phi(x) + x phi(x). With z = |x| / sqrt(2):
 * erfc(z) = f(t) e^(-z^2), t = 1 / (1 + 0.375 z), f the CPU's degree-9
 * polynomial (relative error 1.2e-8); Phi = erfc / 2 for x < 0, else
 * 1 - erfc / 2. expf here is CUDA's (2 ulp), the CPU's vh_expf is within
 * 2 ulp too: the two differ by rounding only. */
#ifndef VH_CUDA_GELU_CUH
#define VH_CUDA_GELU_CUH

/* Phi(x); *pdf receives phi(x). */
__device__ __forceinline__ float vh_cuda_gelu_cdf(float x, float *pdf) {
    const float ax = fabsf(x);
    const float z = ax * 0.70710678118654752f;
    const float t = 1.0f / (1.0f + 0.375f * z);
    float f = 0.061700788f;
    f = f * t - 0.28809479f;
    f = f * t + 0.43393201f;
    f = f * t - 0.23111783f;
    f = f * t + 0.27487096f;
    f = f * t + 0.12102835f;
    f = f * t + 0.20543289f;
    f = f * t + 0.21063319f;
    f = f * t + 0.21161443f;
    const float g = expf(-z * z); /* = sqrt(2 pi) phi(x) */
    const float e = f * t * g;    /* erfc(z) */
    *pdf = g * 0.39894228040143267794f;
    const float half = 0.5f * e;
    return x < 0.0f ? half : 1.0f - half;
}

/* GELU(x) = x Phi(x). */
__device__ __forceinline__ float vh_cuda_gelu(float x) {
    float pdf;
    return x * vh_cuda_gelu_cdf(x, &pdf);
}

/* GELU'(x) = Phi(x) + x phi(x). */
__device__ __forceinline__ float vh_cuda_gelu_grad(float x) {
    float pdf;
    const float cdf = vh_cuda_gelu_cdf(x, &pdf);
    return cdf + x * pdf;
}

#endif
