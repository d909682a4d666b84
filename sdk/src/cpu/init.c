/* init.c - vh_param_init: a parameter's initial values from its init rule.
 *
 * Element i draws from its own counter-based stream (key = mix64(seed),
 * element key = bits(key, i), then draws bits(element key, 0), (.., 1), ...),
 * so values depend on (seed, i) only: not on thread count, not on the
 * parameter's size (a longer tensor starts with the same values).
 * Normals come from Box-Muller in double; TRUNC_NORMAL redraws outside
 * +-2 std, as vh_params.h documents. */
#include <math.h>
#include <stddef.h>

#include "cpu_ops.h"
#include "vithost/vh_params.h"

static const double kTwoPi = 6.283185307179586476925;

/* Uniform in (0, 1] (53 bits), never 0, for the logarithm. */
static double uniform_open0(uint64_t bits) { return (double)((bits >> 11) + 1) * 0x1p-53; }

/* Uniform in [0, 1) (53 bits). */
static double uniform_01(uint64_t bits) { return (double)(bits >> 11) * 0x1p-53; }

static double normal_at(uint64_t ekey, uint64_t *draw) {
    const double u1 = uniform_open0(vh_rng_bits(ekey, (*draw)++));
    const double u2 = uniform_01(vh_rng_bits(ekey, (*draw)++));
    return sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2);
}

void vh_param_init(const vh_param_desc *param, float *values, uint64_t seed) {
    if (!param || !values || param->ndim < 0 || param->ndim > VH_TENSOR_MAX_DIMS) return;
    const int64_t n = vh_param_desc_numel(param);
    if (n <= 0) return;
    const uint64_t key = vh_splitmix64_mix(seed);
    const double std = (double)param->init_std;
    const vh_init_kind kind = param->init;

    double bound = 0.0; /* XAVIER_UNIFORM: U(-bound, bound) */
    if (kind == VH_INIT_KIND_XAVIER_UNIFORM) {
        double rf = 1.0, fan_in, fan_out;
        for (int32_t d = 2; d < param->ndim; d++) rf *= (double)param->shape[d];
        if (param->ndim >= 2) {
            fan_in = (double)param->shape[1] * rf;
            fan_out = (double)param->shape[0] * rf;
        } else { /* a vector: fan_in = fan_out = its length */
            fan_in = fan_out = (double)n;
        }
        bound = sqrt(6.0 / (fan_in + fan_out));
    }

#pragma omp parallel for schedule(static) if (n > VH_CPU_PAR_ELEMS / 8)
    for (int64_t i = 0; i < n; i++) {
        const uint64_t ekey = vh_rng_bits(key, (uint64_t)i);
        uint64_t draw = 0;
        double v;
        switch (kind) {
        case VH_INIT_KIND_ZEROS: v = 0.0; break;
        case VH_INIT_KIND_ONES: v = 1.0; break;
        case VH_INIT_KIND_NORMAL: v = std * normal_at(ekey, &draw); break;
        case VH_INIT_KIND_TRUNC_NORMAL: {
            double z;
            do z = normal_at(ekey, &draw); /* accepted with probability 0.954 */
            while (fabs(z) > 2.0);
            v = std * z;
            break;
        }
        case VH_INIT_KIND_XAVIER_UNIFORM:
            v = bound * (2.0 * uniform_01(vh_rng_bits(ekey, draw)) - 1.0);
            break;
        default: v = NAN; break; /* an init rule this SDK does not know: loud */
        }
        values[i] = (float)v;
    }
}
