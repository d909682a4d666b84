/* half.c - fp16 and bf16 as storage types: scalar conversions, round to
 * nearest even, NaN preserved (quiet), overflow to Inf as IEEE requires. */
#include <stdint.h>
#include <string.h>

#include "vithost/vh_runtime.h"

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t vh_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even on the dropped half */
    return (uint16_t)(u >> 16);
}

float vh_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t vh_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* rounds past 65504: Inf */
    if (abs < 0x38800000u) {                                        /* f16 subnormal or zero */
        if (abs < 0x33000000u) return (uint16_t)sign;               /* below half the smallest */
        uint32_t mant = (abs & 0x007fffffu) | 0x00800000u;
        uint32_t shift = 126u - (abs >> 23); /* to units of 2^-24 */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = abs - 0x38000000u;                                 /* rebias 127 -> 15 */
    r += 0x0fffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float vh_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* Inf/NaN */
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* subnormal: value = mant * 2^-24 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* ---- arrays ------------------------------------------------------------------
 * The same conversions, branch-free so that `omp simd` vectorises them (the
 * scalar versions above branch per element): every case is computed and the
 * right one selected. f32 -> f16 subnormals: for |x| < 2^-14, 0.5 + |x| has
 * an ulp of 2^-24, so the FPU's own round-to-nearest-even of that sum gives
 * the f16 subnormal's mantissa (0x400, the smallest normal, when it rounds up)
 * in its low bits. test_sdk compares every path with the scalar functions. */

#include "cpu/cpu_ops.h"

__attribute__((always_inline)) static inline uint16_t bf16_of(float x) {
    return vh_cpu_bf16_round(x);
}

__attribute__((always_inline)) static inline uint16_t f16_of(float x) {
    const uint32_t u = f32_bits(x);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    uint32_t r = abs - 0x38000000u; /* normal: rebias 127 -> 15, round on bit 13 */
    r = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
    const uint32_t sub = f32_bits(0.5f + bits_f32(abs)) - 0x3f000000u;
    uint32_t h = abs < 0x38800000u ? sub : r;
    h = abs >= 0x477ff000u ? 0x7c00u : h;
    h = abs > 0x7f800000u ? 0x7e00u : h;
    return (uint16_t)(sign | h);
}

__attribute__((always_inline)) static inline float f32_of_f16(uint16_t hv) {
    const uint32_t h = hv;
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    const uint32_t exp = em >> 10;
    const float sub = (float)(em & 0x3ffu) * 0x1p-24f;                  /* exp == 0 */
    const uint32_t normal = (em << 13) + (exp == 0x1fu ? 0x70000000u : 0x38000000u);
    const uint32_t mag = exp == 0 ? f32_bits(sub) : normal;
    return bits_f32(sign | mag);
}

/* Cloned per ISA (VH_CPU_CLONES; integer and select code, no contraction: the
 * same bits on every clone, test_casts checks them against the scalars). */
VH_CPU_CLONES static void to_f32_span(float *dst, const void *src, vh_dtype src_dtype,
                                      int64_t n) {
    if (src_dtype == VH_DTYPE_BF16) {
        const uint16_t *s = src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = bits_f32((uint32_t)s[i] << 16);
    } else if (src_dtype == VH_DTYPE_F16) {
        const uint16_t *s = src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = f32_of_f16(s[i]);
    } else if ((const void *)dst != src) {
        memmove(dst, src, (size_t)n * sizeof(float));
    }
}

VH_CPU_CLONES static void from_f32_span(void *dst, vh_dtype dst_dtype, const float *src,
                                        int64_t n) {
    if (dst_dtype == VH_DTYPE_BF16) {
        uint16_t *d = dst;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) d[i] = bf16_of(src[i]);
    } else if (dst_dtype == VH_DTYPE_F16) {
        uint16_t *d = dst;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) d[i] = f16_of(src[i]);
    } else if ((void *)dst != (const void *)src) {
        memmove(dst, src, (size_t)n * sizeof(float));
    }
}

void vh_cpu_to_f32_serial(float *dst, const void *src, vh_dtype src_dtype, int64_t n) {
    to_f32_span(dst, src, src_dtype, n);
}

void vh_cpu_from_f32_serial(void *dst, vh_dtype dst_dtype, const float *src, int64_t n) {
    from_f32_span(dst, dst_dtype, src, n);
}

/* The public names of the two spans (vh_types.h). */
void vh_convert_to_f32(float *dst, const void *src, vh_dtype src_dtype, int64_t n) {
    to_f32_span(dst, src, src_dtype, n);
}

void vh_convert_from_f32(void *dst, vh_dtype dst_dtype, const float *src, int64_t n) {
    from_f32_span(dst, dst_dtype, src, n);
}

/* Threaded in fixed pieces above CONVERT_PAR (a parallel region costs about
 * a microsecond, so a short array stays on the caller's thread). */
#define CONVERT_PIECE ((int64_t)1 << 14)

void vh_cpu_to_f32(float *dst, const void *src, vh_dtype src_dtype, int64_t n) {
    if (n <= 4 * VH_CPU_PAR_ELEMS || src_dtype == VH_DTYPE_F32) {
        vh_cpu_to_f32_serial(dst, src, src_dtype, n);
        return;
    }
    const int64_t pieces = (n + CONVERT_PIECE - 1) / CONVERT_PIECE;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; p++) {
        const int64_t lo = p * CONVERT_PIECE, m = n - lo < CONVERT_PIECE ? n - lo : CONVERT_PIECE;
        vh_cpu_to_f32_serial(dst + lo, (const uint16_t *)src + lo, src_dtype, m);
    }
}

void vh_cpu_from_f32(void *dst, vh_dtype dst_dtype, const float *src, int64_t n) {
    if (n <= 4 * VH_CPU_PAR_ELEMS || dst_dtype == VH_DTYPE_F32) {
        vh_cpu_from_f32_serial(dst, dst_dtype, src, n);
        return;
    }
    const int64_t pieces = (n + CONVERT_PIECE - 1) / CONVERT_PIECE;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; p++) {
        const int64_t lo = p * CONVERT_PIECE, m = n - lo < CONVERT_PIECE ? n - lo : CONVERT_PIECE;
        vh_cpu_from_f32_serial((uint16_t *)dst + lo, dst_dtype, src + lo, m);
    }
}

float *vh_cpu_f32_view(const void *p, vh_dtype t, int64_t n, int load) {
    if (t == VH_DTYPE_F32 || !p) return (float *)(uintptr_t)p;
    float *v = vh_cpu_scratch_alloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (v && load) vh_cpu_to_f32(v, p, t, n);
    return v;
}

float *vh_cpu_rows_load(vh_cpu_rows t, int64_t r0, int64_t nrows, int64_t dim, int load) {
    if (!t.p) return NULL;
    if (t.dtype == VH_DTYPE_F32) return (float *)t.p + r0 * dim;
    float *v = vh_cpu_scratch_alloc((size_t)(nrows * dim > 0 ? nrows * dim : 1) * sizeof(float));
    if (v && load) to_f32_span(v, (const uint16_t *)t.p + r0 * dim, t.dtype, nrows * dim);
    return v;
}

void vh_cpu_rows_store(vh_cpu_rows t, int64_t r0, int64_t nrows, int64_t dim, const float *rows) {
    if (t.p && rows && t.dtype != VH_DTYPE_F32)
        from_f32_span((uint16_t *)t.p + r0 * dim, t.dtype, rows, nrows * dim);
}

void vh_cpu_f32_store(void *p, vh_dtype t, const float *view, int64_t n) {
    if (t == VH_DTYPE_F32 || !p || !view) return;
    vh_cpu_from_f32(p, t, view, n);
}
