/* gelu16.c - AMP fc1's GELU pass (C = bf16(gelu(T)), aux = bf16(T), from
 * the GEMM's fp32 T) written for AVX-512 with BF16, the same bits as the
 * portable loop in activations.c (gelu_forward_span_f32_to_bf16) on the
 * same CPU (but for a NaN's sign, which follows the order of the operands
 * in each build's code): the same operations of vh_gelu_cdf (gelu_erf.h) and
 * vh_expf_nonpos (cpu_ops.h), each FMA where GCC contracts that loop, and
 * two shortcuts that change no bit:
 * - p 2^n as one vscalefps, its mask zeroing the lanes under e^-86.5 (p
 *   near 1, n >= -125: the result is normal, the product exact), where
 *   the loop builds 2^n in the exponent bits and multiplies;
 * - the rounding to bf16 as vcvtne2ps2bf16 (nearest even, NaN made quiet
 *   as vh_cpu_bf16_round32 does: (bits >> 16) | 0x40), 32 values in one
 *   instruction where the loop takes eight integer steps a vector. The
 *   instruction reads subnormal inputs as zero, so a group of 32 with one
 *   goes through those integer steps instead (rare: |x| < 2^-126).
 * Why: this pass was about as long as fc1's own matmul on T1 (k = 64) and a
 * fifth of it on T2 and T3 under AMP (Zen 4, `vithost bench --ops`); the
 * loop spent its time in ~150 instructions for 32 values. */
#include <stdint.h>
#include <string.h>

#include "cpu_ops.h"

/* Only where GCC optimises: unoptimised (Debug) builds do not contract the
 * loop's a * b + c into FMAs, so its bits are not these there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES) && defined(__OPTIMIZE__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16")

#define GELU16_INLINE __attribute__((always_inline)) static inline

#include "exp_avx512.h" /* vh_avx512_exp_nonpos: vh_expf_nonpos lane by lane */

/* x Phi(x) with vh_gelu_cdf's steps. */
GELU16_INLINE __m512 gelu16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
    const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.375f), z, one));
    __m512 f = _mm512_fmadd_ps(_mm512_set1_ps(0.061700788f), t, _mm512_set1_ps(-0.28809479f));
    f = _mm512_fmadd_ps(f, t, _mm512_set1_ps(0.43393201f));
    f = _mm512_fmadd_ps(f, t, _mm512_set1_ps(-0.23111783f));
    f = _mm512_fmadd_ps(f, t, _mm512_set1_ps(0.27487096f));
    f = _mm512_fmadd_ps(f, t, _mm512_set1_ps(0.12102835f));
    f = _mm512_fmadd_ps(f, t, _mm512_set1_ps(0.20543289f));
    f = _mm512_fmadd_ps(f, t, _mm512_set1_ps(0.21063319f));
    f = _mm512_fmadd_ps(f, t, _mm512_set1_ps(0.21161443f));
    const __m512 g = vh_avx512_exp_nonpos(_mm512_mul_ps(_mm512_xor_ps(z, _mm512_set1_ps(-0.0f)), z));
    const __m512 half = _mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_mul_ps(_mm512_mul_ps(f, t), g));
    const __mmask16 nonneg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NLT_UQ);
    const __m512 cdf = _mm512_mask_sub_ps(half, nonneg, one, half); /* x < 0 ? half : 1 - half */
    return _mm512_mul_ps(x, cdf); /* x first: a NaN x gives its own NaN */
}

#include "bf16_round_avx512.h" /* vh_avx512_round_bf16: the integer steps */

/* Lanes whose value is subnormal (exponent bits 0, fraction not). */
GELU16_INLINE __mmask16 subnormal16(__m512 y) {
    const __m512i u = _mm512_castps_si512(y);
    return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
           _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
}

/* 32 values to bf16 at dst, low half first. */
GELU16_INLINE void store32(uint16_t *dst, __m512 lo, __m512 hi, int exact_steps) {
    if (exact_steps) {
        _mm256_storeu_si256((__m256i *)dst, vh_avx512_round_bf16(lo));
        _mm256_storeu_si256((__m256i *)(dst + 16), vh_avx512_round_bf16(hi));
    } else {
        _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

static int64_t gelu_f32_to_bf16_v4bf16(uint16_t *out, uint16_t *pre, const float *t, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 tl = _mm512_loadu_ps(t + i), th = _mm512_loadu_ps(t + i + 16);
        const __m512 gl = gelu16(tl), gh = gelu16(th);
        const int sub =
            (subnormal16(tl) | subnormal16(th) | subnormal16(gl) | subnormal16(gh)) != 0;
        store32(pre + i, tl, th, sub);
        store32(out + i, gl, gh, sub);
    }
    return i;
}

#pragma GCC pop_options

int64_t vh_cpu_k_gelu16_forward_f32_to_bf16(uint16_t *out, uint16_t *pre, const float *t,
                                             int64_t n) {
    static int has = -1; /* the same in every thread */
    int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16");
        __atomic_store_n(&has, h, __ATOMIC_RELAXED);
    }
    return h ? gelu_f32_to_bf16_v4bf16(out, pre, t, n) : 0;
}
#else
int64_t vh_cpu_k_gelu16_forward_f32_to_bf16(uint16_t *out, uint16_t *pre, const float *t,
                                             int64_t n) {
    (void)out, (void)pre, (void)t, (void)n;
    return 0;
}
#endif
