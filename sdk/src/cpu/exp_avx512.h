/* exp_avx512.h - e^x for x <= 0 (and -inf, NaN), 16 lanes: vh_expf_nonpos's
 * reduction and polynomial (cpu_ops.h), each step the FMA GCC makes of that
 * loop with -ffp-contract=fast, so the same bits as it and as the softmax of
 * attention_small_kern.h (VN(exp_nonpos)); p 2^n is one vscalefps, its
 * mask zeroing the lanes under e^-86.5 (p near 1, n >= -125: the result is
 * normal, the product exact). For kernels written with AVX-512 intrinsics
 * (gelu16.c, attention_dot16.c), only in optimised builds: unoptimised GCC
 * does not contract that loop, so its bits are not these there. Include it
 * after the `#pragma GCC target` that builds the file's AVX-512 code. */
#ifndef VH_CPU_EXP_AVX512_H
#define VH_CPU_EXP_AVX512_H

#include <immintrin.h>

__attribute__((always_inline)) static inline __m512 vh_avx512_exp_nonpos(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-86.5f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* not x < lo: NaN too */
    const __m512 xc = _mm512_max_ps(lo, x);                        /* x < lo ? lo : x */
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    const __m512 n =
        _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 5040.0f), r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

#endif
