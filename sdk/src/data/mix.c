/* mix.c - Mixup and CutMix of a training batch with soft targets, as timm's
 * Mixup(mode='batch') (vh_mix.h has the rules and the timm functions). */
#include "vithost/vh_mix.h"

#include <math.h>
#include <string.h>

#include "vithost/vh_random.h"
#include "vithost/vh_sampler.h"

const vh_config_key vh_data_shared_keys[] = {
    {"mixup_alpha", VH_CONFIG_TYPE_FLOAT, "0",
     "Mixup of training batches: lam ~ Beta(alpha, alpha), x = lam x + (1 - lam) x reversed "
     "(timm's Mixup, per batch); 0 = off (DeiT: 0.8)",
     NULL, 0, 100, 0},
    {"cutmix_alpha", VH_CONFIG_TYPE_FLOAT, "0",
     "CutMix of training batches: a box of area (1 - lam) from the reversed batch, lam ~ "
     "Beta(alpha, alpha); 0 = off (DeiT: 1.0)",
     NULL, 0, 100, 0},
    {"mix_prob", VH_CONFIG_TYPE_FLOAT, "1",
     "Mixup/CutMix: chance that a training batch is mixed", NULL, 0, 1, 0},
    {"mix_switch_prob", VH_CONFIG_TYPE_FLOAT, "0.5",
     "with mixup_alpha and cutmix_alpha both on: chance of CutMix for a batch", NULL, 0, 1, 0},
    {"mix_label_smoothing", VH_CONFIG_TYPE_FLOAT, "0.1",
     "with mixing on: label smoothing inside the soft targets (the model's own "
     "label_smoothing does not apply to them)",
     NULL, 0, 0.99, 0},
    /* RandAugment (rand_augment.c, vh_rand_augment.h), applied by vh_data_pass too */
    {"rand_augment_n", VH_CONFIG_TYPE_INT, "0",
     "RandAugment of training images: ops per image, each from rotate, shear, translate, "
     "brightness, contrast, color, sharpness, autocontrast, posterize, solarize, identity, "
     "applied with p 0.5 (timm's rand-mM-nN); 0 = off (timm: 2)",
     NULL, 0, 8, 0},
    {"rand_augment_m", VH_CONFIG_TYPE_INT, "9",
     "RandAugment magnitude on timm's scale: each op at m/10 of its maximum (rotate 30 deg, "
     "shear 0.3, translate 0.45 of the side, enhance 1 +- 0.9), random sign (DeiT: 9)",
     NULL, 0, 10, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

int vh_mix_enabled(const vh_mix_config *c) {
    return c && (c->mixup_alpha > 0.0 || c->cutmix_alpha > 0.0);
}

vh_status vh_mix_config_read(vh_host *host, int32_t num_classes, vh_mix_config *out) {
    if (!host || !out) return VH_STATUS_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->num_classes = num_classes;
    out->prob = 1.0;
    out->switch_prob = 0.5;
    /* The host offers the keys to data plugins of ABI 2.2 on (vh_data_shared_keys). */
    const vh_host_api *api = host->api;
    if (!VH_STRUCT_HAS(api, vh_host_api, config_has) || !api->config_has ||
        !api->config_has(host, "mixup_alpha"))
        return VH_STATUS_OK; /* a host without configuration (a unit test's) mixes nothing */
    vh_status st;
    if ((st = api->config_float(host, "mixup_alpha", &out->mixup_alpha)) != VH_STATUS_OK ||
        (st = api->config_float(host, "cutmix_alpha", &out->cutmix_alpha)) != VH_STATUS_OK ||
        (st = api->config_float(host, "mix_prob", &out->prob)) != VH_STATUS_OK ||
        (st = api->config_float(host, "mix_switch_prob", &out->switch_prob)) != VH_STATUS_OK ||
        (st = api->config_float(host, "mix_label_smoothing", &out->label_smoothing)) !=
            VH_STATUS_OK)
        return st;
    if (vh_mix_enabled(out) && num_classes < 1)
        return api->config_fail(host, "mixup_alpha",
                                "mixing needs the class count, and this data set has %d",
                                (int)num_classes);
    return VH_STATUS_OK;
}

#define MIX_STREAM UINT64_C(0x4d49585550434d31) /* "MIXUPCM1": this file's draws */

uint64_t vh_mix_key(uint64_t seed, int64_t epoch, int64_t batch, int32_t rank) {
    uint64_t k = vh_splitmix64(seed ^ MIX_STREAM);
    k = vh_splitmix64(k ^ (uint64_t)epoch);
    k = vh_splitmix64(k ^ (uint64_t)batch);
    return vh_splitmix64(k ^ (uint64_t)(uint32_t)rank);
}

/* [0, 1) and (0, 1) from 53 random bits. */
static double uniform(uint64_t *rng) { return (double)(vh_sampler_rng_next(rng) >> 11) * 0x1p-53; }
static double uniform_open(uint64_t *rng) {
    return ((double)(vh_sampler_rng_next(rng) >> 11) + 0.5) * 0x1p-53;
}

static double normal(uint64_t *rng) { /* Box-Muller, one of the pair */
    const double u1 = uniform_open(rng), u2 = uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* log of a Gamma(a, 1) draw: Marsaglia and Tsang (2000) for a >= 1, and
 * Gamma(a) = Gamma(a + 1) U^(1/a) below 1 (in logs, so that small alphas do
 * not underflow to 0/0 in the Beta). */
static double log_gamma_draw(double a, uint64_t *rng) {
    if (a < 1.0) {
        const double boost = log(uniform_open(rng)) / a;
        return log_gamma_draw(a + 1.0, rng) + boost;
    }
    const double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (int tries = 0; tries < 1000; tries++) { /* accepts > 95% of the time */
        const double x = normal(rng);
        double v = 1.0 + c * x;
        if (v <= 0.0) continue;
        v = v * v * v;
        const double u = uniform_open(rng);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return log(d * v);
    }
    return log(a); /* never in practice: the mean */
}

static double beta_draw(double a, uint64_t *rng) {
    const double g1 = log_gamma_draw(a, rng), g2 = log_gamma_draw(a, rng);
    return 1.0 / (1.0 + exp(g2 - g1)); /* G1 / (G1 + G2) */
}

static int32_t clip(int32_t v, int32_t hi) { return v < 0 ? 0 : v > hi ? hi : v; }

/* timm's rand_bbox and cutmix_bbox_and_lam (correct_lam=True). */
static void cutmix_box(vh_mix_params *p, int32_t height, int32_t width) {
    const double ratio = sqrt(1.0 - p->lam_draw);
    const int32_t cut_h = (int32_t)(height * ratio), cut_w = (int32_t)(width * ratio);
    p->y0 = clip(p->cy - cut_h / 2, height);
    p->y1 = clip(p->cy + (cut_h + 1) / 2, height);
    p->x0 = clip(p->cx - cut_w / 2, width);
    p->x1 = clip(p->cx + (cut_w + 1) / 2, width);
    const double area = (double)(p->y1 - p->y0) * (double)(p->x1 - p->x0);
    p->lam = 1.0 - area / ((double)height * (double)width);
}

vh_status vh_mix_draw(const vh_mix_config *c, uint64_t key, int32_t height, int32_t width,
                      vh_mix_params *out) {
    if (!c || !out || height < 1 || width < 1) return VH_STATUS_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->mode = VH_MIX_NONE;
    out->lam = out->lam_draw = 1.0;
    uint64_t rng = key;
    /* Always the same draws in the same order, whichever are used. */
    out->u_apply = uniform(&rng);
    out->u_switch = uniform(&rng);
    out->cy = clip((int32_t)(uniform(&rng) * height), height - 1);
    out->cx = clip((int32_t)(uniform(&rng) * width), width - 1);
    if (!vh_mix_enabled(c) || !(out->u_apply < c->prob)) return VH_STATUS_OK;
    int cut = c->cutmix_alpha > 0.0;
    if (c->mixup_alpha > 0.0 && cut) cut = out->u_switch < c->switch_prob;
    out->lam_draw = beta_draw(cut ? c->cutmix_alpha : c->mixup_alpha, &rng);
    out->lam = out->lam_draw;
    if (out->lam == 1.0) return VH_STATUS_OK; /* timm: nothing to mix */
    out->mode = cut ? VH_MIX_CUTMIX : VH_MIX_MIXUP;
    if (cut) cutmix_box(out, height, width);
    return VH_STATUS_OK;
}

/* Samples i and j = B-1-i trade: Mixup blends them, CutMix swaps the box. */
static void mix_pair(const vh_mix_params *p, float *a, float *b, int32_t channels,
                     int32_t height, int32_t width) {
    const int64_t n = (int64_t)channels * height * width;
    if (p->mode == VH_MIX_MIXUP) {
        /* As torch: x * f32(lam) + x.flip(0) * f32(1 - lam), each rounded. */
        const float l = (float)p->lam, m = (float)(1.0 - p->lam);
        if (a == b) { /* an odd batch's middle sample, with itself */
            for (int64_t k = 0; k < n; k++) a[k] = a[k] * l + a[k] * m;
            return;
        }
        for (int64_t k = 0; k < n; k++) {
            const float ta = a[k] * l, tb = b[k] * l, fa = b[k] * m, fb = a[k] * m;
            a[k] = ta + fa;
            b[k] = tb + fb;
        }
        return;
    }
    if (a == b) return; /* CutMix of a sample with itself */
    for (int32_t ch = 0; ch < channels; ch++)
        for (int32_t y = p->y0; y < p->y1; y++) {
            const int64_t row = ((int64_t)ch * height + y) * width;
            for (int32_t x = p->x0; x < p->x1; x++) {
                const float t = a[row + x];
                a[row + x] = b[row + x];
                b[row + x] = t;
            }
        }
}

vh_status vh_mix_apply(const vh_mix_config *c, const vh_mix_params *p, float *images,
                       const int32_t *labels, int64_t batch, int32_t channels, int32_t height,
                       int32_t width, float *targets) {
    if (!c || !p || !labels || !targets || batch < 0 || c->num_classes < 1 ||
        (batch > 0 && !images))
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t C = c->num_classes;
    for (int64_t b = 0; b < batch; b++)
        if (labels[b] < 0 || labels[b] >= C) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t chw = (int64_t)channels * height * width;
    if (p->mode != VH_MIX_NONE)
        for (int64_t i = 0, j = batch - 1; i <= j; i++, j--)
            mix_pair(p, images + i * chw, images + j * chw, channels, height, width);
    /* timm's mixup_target: y1 * lam + y1.flip(0) * (1 - lam), smoothed one-hots in f32. */
    const double off_d = c->label_smoothing / (double)C;
    const float off = (float)off_d, on = (float)(1.0 - c->label_smoothing + off_d);
    const float l = (float)p->lam, m = (float)(1.0 - p->lam);
    for (int64_t b = 0; b < batch; b++) {
        const int32_t y1 = labels[b], y2 = labels[batch - 1 - b];
        float *t = targets + b * C;
        for (int64_t k = 0; k < C; k++) {
            const float v1 = k == y1 ? on : off, v2 = k == y2 ? on : off;
            const float a = v1 * l, bb = v2 * m;
            t[k] = a + bb;
        }
    }
    return VH_STATUS_OK;
}
