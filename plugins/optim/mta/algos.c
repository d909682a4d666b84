/* algos.c - the element-wise update kernels (formulas in algos.h). */
#include "algos.h"

#include <math.h>
#include <string.h>

/* Sums of squares run in MTA_LANES independent double accumulators (element
 * i goes to lane i % MTA_LANES, the tail to lane 0), added in a fixed tree at
 * the end: the loop vectorises, and the result depends on the values and the
 * chunk boundaries only, never on the number of threads. */
#define MTA_LANES 8

static double lanes_total(const double *acc) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The Adam moments start at zero, as torch's zeros_like state. */
static void zero_moments(int fresh, float *m, float *v, int64_t n) {
    if (!fresh) return;
    memset(m, 0, (size_t)n * sizeof *m);
    memset(v, 0, (size_t)n * sizeof *v);
}

/* The AdamW loop, built for AVX-512 and AVX2 too and picked at load time:
 * the baseline build's 4-wide SSE loop made the sqrt and the two divisions
 * of every element the optimizer's cost (T3 under AMP, Xeon with AMX, 2
 * threads: the optimizer phase 27.6 -> 25.1-25.5 ms a step; it is near the
 * memory's rate now). Element-wise, without
 * contraction (-ffp-contract=off): every clone gives the same bits. The
 * clone is static, so its ifunc resolver stays out of the plugin's symbols. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MTA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MTA_CLONES
#endif

MTA_CLONES static void adamw_span(const mta_adam_args *a, float decay, float *restrict p,
                                  const float *restrict g, float *restrict m,
                                  float *restrict v, int64_t n) {
    const float scale = a->grad_scale, b1 = a->beta1, c1 = a->one_minus_beta1;
    const float b2 = a->beta2, c2 = a->one_minus_beta2, eps = a->eps;
    const float neg_step = a->neg_step_size, bc2_sqrt = a->bias_correction2_sqrt;
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i] * scale;
        const float pd = p[i] * decay;
        const float mi = m[i] * b1 + c1 * gi;
        const float vi = v[i] * b2 + (c2 * gi) * gi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pd + (neg_step * mi) / denom;
    }
}

void mta_adamw_chunk(const mta_adam_args *a, float decay, float *restrict p,
                     const float *restrict g, float *restrict m, float *restrict v, int64_t n) {
    zero_moments(a->fresh, m, v, n);
    adamw_span(a, decay, p, g, m, v, n);
}

/* u of one element, from its updated moments (shared by both halves so
 * that they agree bit for bit). */
static inline float lamb_direction(float m, float v, float p, float bc1, float bc2, float eps,
                                   float wd) {
    const float m_hat = m / bc1;
    const float v_hat = v / bc2;
    return m_hat / (sqrtf(v_hat) + eps) + wd * p;
}

void mta_lamb_moments_chunk(const mta_adam_args *a, float wd, const float *restrict p,
                            const float *restrict g, float *restrict m, float *restrict v,
                            int64_t n, double *p_sq, double *u_sq) {
    const float scale = a->grad_scale, b1 = a->beta1, c1 = a->one_minus_beta1;
    const float b2 = a->beta2, c2 = a->one_minus_beta2, eps = a->eps;
    const float bc1 = a->bias_correction1, bc2 = a->bias_correction2;
    zero_moments(a->fresh, m, v, n);
    double ps[MTA_LANES] = {0}, us[MTA_LANES] = {0};
    int64_t i = 0;
    for (; i + MTA_LANES <= n; i += MTA_LANES) {
        for (int j = 0; j < MTA_LANES; j++) {
            const float gi = g[i + j] * scale;
            const float mi = m[i + j] * b1 + c1 * gi;
            const float vi = v[i + j] * b2 + (c2 * gi) * gi;
            m[i + j] = mi;
            v[i + j] = vi;
            const float u = lamb_direction(mi, vi, p[i + j], bc1, bc2, eps, wd);
            ps[j] += (double)p[i + j] * (double)p[i + j];
            us[j] += (double)u * (double)u;
        }
    }
    for (; i < n; i++) {
        const float gi = g[i] * scale;
        const float mi = m[i] * b1 + c1 * gi;
        const float vi = v[i] * b2 + (c2 * gi) * gi;
        m[i] = mi;
        v[i] = vi;
        const float u = lamb_direction(mi, vi, p[i], bc1, bc2, eps, wd);
        ps[0] += (double)p[i] * (double)p[i];
        us[0] += (double)u * (double)u;
    }
    *p_sq += lanes_total(ps);
    *u_sq += lanes_total(us);
}

void mta_lamb_apply_chunk(const mta_adam_args *a, float wd, float rate, float *restrict p,
                          const float *restrict m, const float *restrict v, int64_t n) {
    const float bc1 = a->bias_correction1, bc2 = a->bias_correction2, eps = a->eps;
    for (int64_t i = 0; i < n; i++) {
        const float u = lamb_direction(m[i], v[i], p[i], bc1, bc2, eps, wd);
        p[i] = p[i] - rate * u;
    }
}

void mta_sgd_chunk(const mta_sgd_args *a, float wd, float *restrict p, const float *restrict g,
                   float *restrict mom, int64_t n) {
    const float scale = a->grad_scale, neg_lr = a->neg_lr, mu = a->momentum;
    const int nesterov = a->nesterov, fresh = a->fresh;
    for (int64_t i = 0; i < n; i++) {
        float d = g[i] * scale;
        if (wd != 0.0f) d = d + wd * p[i]; /* torch skips the add when wd == 0 */
        if (mom) {
            const float buf = fresh ? d : mom[i] * mu + d;
            mom[i] = buf;
            d = nesterov ? d + mu * buf : buf;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

double mta_sum_squares(const float *restrict x, int64_t n) {
    double acc[MTA_LANES] = {0};
    int64_t i = 0;
    for (; i + MTA_LANES <= n; i += MTA_LANES)
        for (int j = 0; j < MTA_LANES; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < n; i++) acc[0] += (double)x[i] * (double)x[i];
    return lanes_total(acc);
}
