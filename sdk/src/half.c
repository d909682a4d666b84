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
