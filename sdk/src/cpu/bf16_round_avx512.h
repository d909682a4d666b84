/* bf16_round_avx512.h - 16 floats to bf16 with vh_cpu_bf16_round32's integer
 * steps (nearest even, NaN made quiet: (bits >> 16) | 0x40), packed to 16
 * bits, and 16 bf16 back to floats (exact): for kernels written with
 * AVX-512 intrinsics (attention_dot16.c, gelu16.c, gelu_grad16.c,
 * layernorm_avx512.c). With AVX512-BF16, the same bits in one instruction
 * where no lane is subnormal (vcvtneps2bf16 reads subnormal inputs as
 * zero). Include it after the `#pragma GCC target` that builds the file's
 * AVX-512 code. */
#ifndef VH_CPU_BF16_ROUND_AVX512_H
#define VH_CPU_BF16_ROUND_AVX512_H

#include <immintrin.h>

__attribute__((always_inline)) static inline __m256i vh_avx512_round_bf16(__m512 y) {
    const __m512i u = _mm512_castps_si512(y);
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_srli_epi32(r, 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, quiet));
}

#ifdef __AVX512BF16__
/* The same bits in one vcvtneps2bf16 where no lane is subnormal (the
 * instruction reads those as zero; they take the integer steps): nearest
 * even, and a NaN made quiet as (bits >> 16) | 0x40, as the steps do. Only
 * in code built for AVX512-BF16. */
__attribute__((always_inline)) static inline __m256i vh_avx512_round_bf16_cvt(__m512 y) {
    const __m512i u = _mm512_castps_si512(y);
    const __mmask16 subnormal = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                                _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
    if (__builtin_expect(subnormal != 0, 0)) return vh_avx512_round_bf16(y);
    return (__m256i)_mm512_cvtneps_pbh(y);
}
#endif

/* 16 bf16 values (16-bit lanes of h) widened to floats: the bits shifted up. */
__attribute__((always_inline)) static inline __m512 vh_avx512_widen_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#endif
