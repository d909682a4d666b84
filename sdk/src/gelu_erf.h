/* gelu_erf.h - the erf GELU's normal CDF, the one formula of the CPU engine
 * (sdk/src/cpu/activations.c, after cpu_ops.h: vh_expf_nonpos) and the CUDA
 * kernels (sdk/cuda/gelu.cuh: CUDA's expf), so that the two devices differ
 * by their exponentials' rounding only.
 *
 * GELU(x) = x Phi(x) with the exact normal CDF Phi (timm's nn.GELU), and
 * GELU'(x) = Phi(x) + x phi(x).
 *
 * With z = |x| / sqrt(2): erfc(z) = f(t) e^(-z^2), t = 1 / (1 + 0.375 z), f a
 * degree-9 polynomial (iteratively reweighted least squares, numpy) with
 * relative error 1.2e-8 on z in [0, 9.5]
 * (below e^-90 the result is 0 anyway). Then Phi = erfc / 2 for x < 0 and
 * 1 - erfc / 2 for x >= 0. One formula, no branch, one exponential shared
 * with phi; the left tail keeps its relative accuracy where 1 + erff(z)
 * cancels to 0. Measured against GELU in double over [-14, 14]: 3.8e-7 abs
 * at worst (under 1 ulp of the result), 1.1e-6 relative where |GELU| > 1e-3;
 * 0.5 x (1 + erff(x / sqrt 2)) is 4.5e-7 abs. GELU' is within 2.3e-7. */
#ifndef VH_GELU_ERF_H
#define VH_GELU_ERF_H

#ifdef __CUDACC__
#define VH_GELU_INLINE __device__ __forceinline__
#define VH_GELU_EXPF expf
#else
#define VH_GELU_INLINE __attribute__((always_inline)) static inline
#define VH_GELU_EXPF vh_expf_nonpos /* cpu_ops.h: its argument is -z^2 <= 0 */
#endif

/* Phi(x); *pdf receives phi(x). */
VH_GELU_INLINE float vh_gelu_cdf(float x, float *pdf) {
    const float ax = fabsf(x); /* one AND, where x < 0 ? -x : x took three */
    const float z = ax * 0.70710678118654752f;
    const float t = 1.0f / (1.0f + 0.375f * z);
    float f = 0.061700788f; /* Horner, unrolled so that the loop vectorises */
    f = f * t - 0.28809479f;
    f = f * t + 0.43393201f;
    f = f * t - 0.23111783f;
    f = f * t + 0.27487096f;
    f = f * t + 0.12102835f;
    f = f * t + 0.20543289f;
    f = f * t + 0.21063319f;
    f = f * t + 0.21161443f;
    const float g = VH_GELU_EXPF(-z * z); /* = sqrt(2 pi) phi(x) */
    const float e = f * t * g;            /* erfc(z) */
    *pdf = g * 0.39894228040143267794f;
    const float half = 0.5f * e;
    return x < 0.0f ? half : 1.0f - half;
}

#endif
