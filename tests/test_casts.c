/* test_casts.c - the SDK's f32 <-> bf16 and f32 <-> f16 conversions, bit for
 * bit: the scalar functions (vh_types.h) and the CPU device's array paths
 * (dev->convert: the short, single-threaded loop and the long, threaded one;
 * both are the vectorised, branch-free loops of half.c, in the clone the
 * running CPU picks).
 *
 * What every path must do (round to nearest, ties to even, as the hardware
 * conversions and PyTorch do, so that the precision policies round the same
 * way on every device):
 * - ties go to the even neighbour, in both directions (up and down), for
 *   either sign;
 * - f16 subnormals are produced, rounded to even, down to half of the
 *   smallest (2^-25, which rounds to zero); bf16 has f32's exponent range, so
 *   f32 subnormals stay subnormal in bf16 (rounded on their top bits);
 * - a value that rounds past the largest finite (65504 for f16, 0x7f7f for
 *   bf16) becomes Inf; Inf and -Inf stay; -0.0 stays -0.0;
 * - NaN stays NaN and is quiet, whatever its payload, including payloads
 *   whose rounding done naively (add half an ulp, truncate) would carry into
 *   Inf or wrap to zero. bf16 keeps the top payload bits and sets the quiet
 *   bit; f16 gives the canonical quiet NaN 0x7e00 with the sign;
 * - back to f32 is exact for every pattern (NaN payloads included).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vithost/vh_runtime.h"
#include "vithost/vithost.h"

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The device's array conversion of n values; n > 4 * 2^15 takes the threaded
 * path, anything shorter the caller's thread. */
static void convert(void *dst, vh_dtype dt, const void *src, vh_dtype st, size_t n) {
    const vh_device_ops *dev = vh_cpu_device_ops();
    assert_int_equal(dev->convert(dev->device, dst, dt, src, st, n, NULL), VH_STATUS_OK);
}

typedef struct cast_case {
    uint32_t f32;
    uint16_t want;
    const char *what;
} cast_case;

/* Each case through the scalar function, a one-element array, and inside a
 * long (threaded) array at several positions (vector bodies and tails). */
static void check_cases(const cast_case *cases, size_t count, vh_dtype t) {
    enum { LONG = (1 << 17) + 1000 + 13 };
    float *f = malloc(LONG * sizeof *f);
    uint16_t *h = malloc(LONG * sizeof *h);
    assert_non_null(f);
    assert_non_null(h);
    for (size_t c = 0; c < count; c++) {
        const float x = from_bits(cases[c].f32);
        const uint16_t scalar = t == VH_DTYPE_F16 ? vh_f32_to_f16(x) : vh_f32_to_bf16(x);
        if (scalar != cases[c].want) {
            print_error("%s %s (0x%08x): scalar 0x%04x, want 0x%04x\n", vh_dtype_name(t),
                        cases[c].what, cases[c].f32, scalar, cases[c].want);
            fail();
        }
        uint16_t one = 0;
        convert(&one, t, &f[0], VH_DTYPE_F32, 0); /* n = 0: nothing read or written */
        f[0] = x;
        convert(&one, t, f, VH_DTYPE_F32, 1);
        if (one != cases[c].want) {
            print_error("%s %s (0x%08x): short array 0x%04x, want 0x%04x\n", vh_dtype_name(t),
                        cases[c].what, cases[c].f32, one, cases[c].want);
            fail();
        }
    }
    /* All cases, repeated through a long array (each lands at many offsets
     * modulo every vector width). */
    for (size_t i = 0; i < LONG; i++) f[i] = from_bits(cases[i % count].f32);
    convert(h, t, f, VH_DTYPE_F32, LONG);
    for (size_t i = 0; i < LONG; i++) {
        const cast_case *cc = &cases[i % count];
        if (h[i] != cc->want) {
            print_error("%s %s (0x%08x) at %zu of a long array: 0x%04x, want 0x%04x\n",
                        vh_dtype_name(t), cc->what, cc->f32, i, h[i], cc->want);
            fail();
        }
    }
    free(f);
    free(h);
}

static void test_bf16_exact(void **state) {
    (void)state;
    static const cast_case cases[] = {
        {0x3f800000u, 0x3f80, "1"},
        {0x00000000u, 0x0000, "+0"},
        {0x80000000u, 0x8000, "-0"},
        /* ties to even: down (even below), up (odd below), either sign */
        {0x3f808000u, 0x3f80, "1 + 2^-8, tie, down to even"},
        {0x3f818000u, 0x3f82, "1 + 3 2^-8, tie, up to even"},
        {0xbf808000u, 0xbf80, "-(1 + 2^-8), tie, down to even"},
        {0xbf818000u, 0xbf82, "-(1 + 3 2^-8), tie, up to even"},
        {0x3f807fffu, 0x3f80, "just below a tie"},
        {0x3f808001u, 0x3f81, "just above a tie"},
        {0x3f80ffffu, 0x3f81, "just below the next value"},
        {0x3fff8000u, 0x4000, "tie that carries into the exponent"},
        /* f32 subnormals stay subnormal in bf16 (same exponent range) */
        {0x00000001u, 0x0000, "smallest f32 subnormal, below half a bf16 ulp"},
        {0x00008000u, 0x0000, "subnormal tie, down to even (zero)"},
        {0x00008001u, 0x0001, "subnormal just above a tie"},
        {0x00018000u, 0x0002, "subnormal tie, up to even"},
        {0x00010000u, 0x0001, "smallest bf16 subnormal"},
        {0x00400000u, 0x0040, "mid subnormal"},
        {0x007f8000u, 0x0080, "largest subnormal tie, up to the smallest normal"},
        {0x007fffffu, 0x0080, "largest f32 subnormal, up to the smallest normal"},
        {0x807f8000u, 0x8080, "negative subnormal tie, up to even"},
        {0x80008000u, 0x8000, "negative subnormal tie, down to -0"},
        /* the top of the range and Inf */
        {0x7f7f0000u, 0x7f7f, "largest bf16"},
        {0x7f7f7fffu, 0x7f7f, "just below the tie above the largest"},
        {0x7f7f8000u, 0x7f80, "tie above the largest: up to Inf"},
        {0x7f7fffffu, 0x7f80, "FLT_MAX: Inf"},
        {0xff7fffffu, 0xff80, "-FLT_MAX: -Inf"},
        {0x7f800000u, 0x7f80, "Inf"},
        {0xff800000u, 0xff80, "-Inf"},
        /* NaN: quiet, top payload bits and sign kept */
        {0x7fc00000u, 0x7fc0, "quiet NaN"},
        {0xffc00000u, 0xffc0, "negative quiet NaN"},
        {0x7f800001u, 0x7fc0, "signalling NaN, payload in the dropped bits"},
        {0x7f808000u, 0x7fc0, "NaN whose naive rounding gives Inf"},
        {0x7f807fffu, 0x7fc0, "NaN whose naive rounding gives Inf (below the tie)"},
        {0xff808000u, 0xffc0, "negative NaN whose naive rounding gives -Inf"},
        {0x7fffffffu, 0x7fff, "NaN whose naive rounding wraps to -0"},
        {0xffffffffu, 0xffff, "NaN whose naive rounding wraps to +0"},
        {0x7fa12345u, 0x7fe1, "signalling NaN with a payload: kept, made quiet"},
    };
    check_cases(cases, sizeof cases / sizeof cases[0], VH_DTYPE_BF16);
}

static void test_f16_exact(void **state) {
    (void)state;
    static const cast_case cases[] = {
        {0x3f800000u, 0x3c00, "1"},
        {0xc0000000u, 0xc000, "-2"},
        {0x00000000u, 0x0000, "+0"},
        {0x80000000u, 0x8000, "-0"},
        /* ties to even, both directions and signs */
        {0x3f801000u, 0x3c00, "1 + 2^-11, tie, down to even"},
        {0x3f803000u, 0x3c02, "1 + 3 2^-11, tie, up to even"},
        {0xbf801000u, 0xbc00, "-(1 + 2^-11), tie, down to even"},
        {0xbf803000u, 0xbc02, "-(1 + 3 2^-11), tie, up to even"},
        {0x3f800fffu, 0x3c00, "just below a tie"},
        {0x3f801001u, 0x3c01, "just above a tie"},
        {0x3ffff000u, 0x4000, "tie that carries into the exponent"},
        /* subnormal results */
        {0x38800000u, 0x0400, "2^-14, smallest normal"},
        {0x387fffffu, 0x0400, "just below 2^-14: up to the smallest normal"},
        {0x387fc000u, 0x03ff, "largest subnormal"},
        {0x387fe000u, 0x0400, "tie above the largest subnormal: up to even (normal)"},
        {0x387fa000u, 0x03fe, "tie below the largest subnormal: down to even"},
        {0x33800000u, 0x0001, "2^-24, smallest subnormal"},
        {0x33000000u, 0x0000, "2^-25, tie with zero: down to even (zero)"},
        {0x33000001u, 0x0001, "just above 2^-25"},
        {0x32ffffffu, 0x0000, "just below 2^-25"},
        {0x33c00000u, 0x0002, "3 2^-25, tie: up to even"},
        {0x34200000u, 0x0002, "5 2^-25, tie: down to even"},
        {0x34100000u, 0x0002, "2.25 2^-24: down to 2"},
        {0x80000001u, 0x8000, "negative f32 subnormal: -0"},
        {0x00000001u, 0x0000, "f32 subnormal: +0"},
        {0xb3800000u, 0x8001, "-2^-24"},
        {0xb3000000u, 0x8000, "-2^-25: tie, to -0"},
        {0xb3c00000u, 0x8002, "-3 2^-25: tie, up to even"},
        /* the top of the range and Inf */
        {0x477fe000u, 0x7bff, "65504, largest f16"},
        {0x477fefffu, 0x7bff, "just below the tie above 65504"},
        {0x477ff000u, 0x7c00, "65520, tie above 65504: up to Inf"},
        {0x47800000u, 0x7c00, "65536: Inf"},
        {0x7f7fffffu, 0x7c00, "FLT_MAX: Inf"},
        {0xc77ff000u, 0xfc00, "-65520: -Inf"},
        {0xc77fefffu, 0xfbff, "just above -65520"},
        {0x7f800000u, 0x7c00, "Inf"},
        {0xff800000u, 0xfc00, "-Inf"},
        /* NaN: the canonical quiet NaN, sign kept */
        {0x7fc00000u, 0x7e00, "quiet NaN"},
        {0xffc00000u, 0xfe00, "negative quiet NaN"},
        {0x7f800001u, 0x7e00, "signalling NaN, payload in the dropped bits"},
        {0x7f802000u, 0x7e00, "signalling NaN, payload in f16's bits"},
        {0x7f801000u, 0x7e00, "NaN with a tie in the dropped bits"},
        {0x7fffffffu, 0x7e00, "NaN whose naive rounding carries out"},
        {0xffffffffu, 0xfe00, "negative NaN, all ones"},
    };
    check_cases(cases, sizeof cases / sizeof cases[0], VH_DTYPE_F16);
}

/* f16 value of a pattern, computed in double from its fields. */
static double f16_value(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double v = exp == 0 ? ldexp(mant, -24) : ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

/* Back to f32: exact for every pattern, by the scalar functions and the
 * arrays (short and threaded). NaN payloads are kept. */
static void test_back_exact(void **state) {
    (void)state;
    enum { N = 1 << 16, LONG = 3 * N };
    uint16_t *h = malloc(LONG * sizeof *h);
    float *f = malloc(LONG * sizeof *f), *g = malloc(N * sizeof *g);
    assert_non_null(h);
    assert_non_null(f);
    assert_non_null(g);
    for (uint32_t i = 0; i < LONG; i++) h[i] = (uint16_t)(i % N);
    for (int t = 0; t < 2; t++) {
        const vh_dtype dt = t ? VH_DTYPE_BF16 : VH_DTYPE_F16;
        convert(f, VH_DTYPE_F32, h, dt, LONG); /* threaded */
        for (uint32_t i = 0; i < N; i += 4096) convert(g + i, VH_DTYPE_F32, h + i, dt, 4096);
        for (uint32_t i = 0; i < LONG; i++) {
            const uint16_t x = h[i];
            uint32_t want;
            if (dt == VH_DTYPE_BF16) {
                want = (uint32_t)x << 16;
            } else if (((x >> 10) & 0x1f) == 0x1f) { /* Inf, NaN: payload kept */
                want = ((uint32_t)(x & 0x8000u) << 16) | 0x7f800000u |
                       ((uint32_t)(x & 0x3ffu) << 13);
            } else {
                want = bits((float)f16_value(x)); /* exact in float, -0 included */
            }
            const float scalar = dt == VH_DTYPE_BF16 ? vh_bf16_to_f32(x) : vh_f16_to_f32(x);
            if (bits(scalar) != want || bits(f[i]) != want || (i < N && bits(g[i]) != want)) {
                print_error("%s 0x%04x: scalar 0x%08x, long 0x%08x, short 0x%08x, want 0x%08x\n",
                            vh_dtype_name(dt), x, bits(scalar), bits(f[i]),
                            i < N ? bits(g[i]) : 0u, want);
                fail();
            }
        }
    }
    free(h), free(f), free(g);
}

/* Every f16 and bf16 pattern to f32 and back: the same pattern, but NaN,
 * which comes back as a quiet NaN of the same sign. */
static void test_round_trip_all(void **state) {
    (void)state;
    enum { N = 1 << 16 };
    uint16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    float *f = malloc(N * sizeof *f);
    assert_non_null(h);
    assert_non_null(h2);
    assert_non_null(f);
    for (uint32_t i = 0; i < N; i++) h[i] = (uint16_t)i;
    for (int t = 0; t < 2; t++) {
        const vh_dtype dt = t ? VH_DTYPE_BF16 : VH_DTYPE_F16;
        const uint16_t exp_mask = t ? 0x7f80 : 0x7c00, quiet = t ? 0x0040 : 0x0200;
        convert(f, VH_DTYPE_F32, h, dt, N);
        convert(h2, dt, f, VH_DTYPE_F32, N);
        for (uint32_t i = 0; i < N; i++) {
            const uint16_t x = h[i];
            const uint16_t scalar = t ? vh_f32_to_bf16(vh_bf16_to_f32(x))
                                      : vh_f32_to_f16(vh_f16_to_f32(x));
            const int nan = (x & exp_mask) == exp_mask && (x & (uint16_t)~(0x8000u | exp_mask));
            if (nan) {
                assert_int_equal(scalar, h2[i]);
                assert_int_equal(scalar & 0x8000, x & 0x8000);
                assert_int_equal(scalar & exp_mask, exp_mask);
                assert_true(scalar & quiet);
            } else if (scalar != x || h2[i] != x) {
                print_error("%s 0x%04x round trip: scalar 0x%04x, array 0x%04x\n",
                            vh_dtype_name(dt), x, scalar, h2[i]);
                fail();
            }
        }
    }
    free(h), free(h2), free(f);
}

/* The scalar functions and the arrays agree bit for bit (NaN included) on a
 * sweep of f32 patterns: one in every 65521 (a prime: every exponent, varied
 * low bits), every bf16 value with the low halves that decide its rounding
 * (0, tie, tie +- 1, max), and every f16 value's f32 with the 13-bit low
 * parts around its rounding point. Run short (one thread) and long
 * (threaded), and through the public array functions (vh_convert_from_f32,
 * vh_convert_to_f32: ABI 2.9, what a plugin's loops call). */
static void test_scalar_array_sweep(void **state) {
    (void)state;
    size_t cap = (1u << 17) + (1u << 16) * 6 + (1u << 16) * 6, n = 0;
    float *f = malloc(cap * sizeof *f);
    uint16_t *h = malloc(cap * sizeof *h), *hs = malloc(cap * sizeof *hs);
    uint16_t *hp = malloc(cap * sizeof *hp);
    assert_non_null(f);
    assert_non_null(h);
    assert_non_null(hs);
    assert_non_null(hp);
    for (uint64_t u = 0; u <= 0xffffffffu; u += 65521u) f[n++] = from_bits((uint32_t)u);
    static const uint32_t bf_low[6] = {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x0001u};
    for (uint32_t b = 0; b < 0x10000u; b++)
        for (int k = 0; k < 6; k++) f[n++] = from_bits((b << 16) | bf_low[k]);
    static const uint32_t f16_low[6] = {0x0000u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu, 0x0001u};
    for (uint32_t x = 0; x < 0x10000u; x++) {
        const uint32_t base = bits(vh_f16_to_f32((uint16_t)x)) & ~0x1fffu;
        for (int k = 0; k < 6; k++) f[n++] = from_bits(base | f16_low[k]);
    }
    assert_true(n <= cap);
    for (int t = 0; t < 2; t++) {
        const vh_dtype dt = t ? VH_DTYPE_BF16 : VH_DTYPE_F16;
        convert(h, dt, f, VH_DTYPE_F32, n); /* threaded */
        for (size_t i = 0; i < n; i += 1000) /* short pieces, odd lengths */
            convert(hs + i, dt, f + i, VH_DTYPE_F32, n - i < 1000 ? n - i : 1000);
        vh_convert_from_f32(hp, dt, f, (int64_t)n);
        for (size_t i = 0; i < n; i++) {
            const uint16_t want = t ? vh_f32_to_bf16(f[i]) : vh_f32_to_f16(f[i]);
            if (h[i] != want || hs[i] != want || hp[i] != want) {
                print_error("%s of 0x%08x: scalar 0x%04x, long array 0x%04x, short 0x%04x, "
                            "vh_convert_from_f32 0x%04x\n",
                            vh_dtype_name(dt), bits(f[i]), want, h[i], hs[i], hp[i]);
                fail();
            }
        }
    }
    /* back to f32 through vh_convert_to_f32: every 16-bit pattern, exact */
    for (uint32_t x = 0; x < 0x10000u; x++) h[x] = (uint16_t)x;
    for (int t = 0; t < 2; t++) {
        const vh_dtype dt = t ? VH_DTYPE_BF16 : VH_DTYPE_F16;
        vh_convert_to_f32(f, h, dt, 0x10000);
        for (uint32_t x = 0; x < 0x10000u; x++) {
            const float want = t ? vh_bf16_to_f32((uint16_t)x) : vh_f16_to_f32((uint16_t)x);
            if (bits(f[x]) != bits(want)) {
                print_error("vh_convert_to_f32 of %s 0x%04x: 0x%08x, want 0x%08x\n",
                            vh_dtype_name(dt), x, bits(f[x]), bits(want));
                fail();
            }
        }
    }
    /* f16 <-> bf16 (through f32, one rounding): every pattern. */
    for (uint32_t x = 0; x < 0x10000u; x++) h[x] = (uint16_t)x;
    for (int t = 0; t < 2; t++) {
        const vh_dtype from = t ? VH_DTYPE_BF16 : VH_DTYPE_F16;
        const vh_dtype to = t ? VH_DTYPE_F16 : VH_DTYPE_BF16;
        convert(hs, to, h, from, 0x10000u);
        for (uint32_t x = 0; x < 0x10000u; x++) {
            const float v = t ? vh_bf16_to_f32((uint16_t)x) : vh_f16_to_f32((uint16_t)x);
            const uint16_t want = t ? vh_f32_to_f16(v) : vh_f32_to_bf16(v);
            if (hs[x] != want) {
                print_error("%s 0x%04x to %s: 0x%04x, want 0x%04x\n", vh_dtype_name(from), x,
                            vh_dtype_name(to), hs[x], want);
                fail();
            }
        }
    }
    free(f), free(h), free(hs), free(hp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_exact),
        cmocka_unit_test(test_f16_exact),
        cmocka_unit_test(test_back_exact),
        cmocka_unit_test(test_round_trip_all),
        cmocka_unit_test(test_scalar_array_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
