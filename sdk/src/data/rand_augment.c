/* rand_augment.c - RandAugment-style light augmentation of one float image
 * (vh_rand_augment.h has the ops, their levels and the timm functions). */
#include "vithost/vh_rand_augment.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "vithost/vh_sampler.h"

#define MAX_MAGNITUDE 10 /* timm's _LEVEL_DENOM and magnitude_max */

vh_status vh_rand_augment_config_read(vh_host *host, vh_rand_augment_config *out) {
    if (!host || !out) return VH_STATUS_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    const vh_host_api *api = host->api;
    if (!VH_STRUCT_HAS(api, vh_host_api, config_has) || !api->config_has ||
        !api->config_has(host, "rand_augment_n"))
        return VH_STATUS_OK; /* a host without the shared keys: off */
    int64_t n = 0, m = 0;
    vh_status st;
    if ((st = api->config_int(host, "rand_augment_n", &n)) != VH_STATUS_OK ||
        (st = api->config_int(host, "rand_augment_m", &m)) != VH_STATUS_OK)
        return st;
    out->n = (int32_t)n; /* the schema's ranges bound both */
    out->m = (int32_t)m;
    return VH_STATUS_OK;
}

static int32_t clamp_index(int32_t v, int32_t hi) { return v < 0 ? 0 : v > hi ? hi : v; }

static float clip01(float v) { return v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f; }

/* out(x, y) = in(a X + b Y + c, d X + e Y + f) at the pixel centre X = x + 0.5,
 * Y = y + 0.5, as PIL's Image.transform(AFFINE, BILINEAR): a source point
 * outside the image takes the fill 0 (the mean pixel once normalised), one
 * inside is bilinear between its neighbours, clamped at the border. */
static void warp_affine(const vh_ra_image *img, const double t[6]) {
    const int32_t h = img->height, w = img->width;
    const size_t plane = (size_t)h * (size_t)w;
    memcpy(img->scratch, img->data, (size_t)img->channels * plane * sizeof(float));
    for (int32_t y = 0; y < h; y++) {
        for (int32_t x = 0; x < w; x++) {
            const double px = x + 0.5, py = y + 0.5;
            double sx = t[0] * px + t[1] * py + t[2], sy = t[3] * px + t[4] * py + t[5];
            const size_t o = (size_t)y * (size_t)w + (size_t)x;
            if (!(sx >= 0.0 && sx < w && sy >= 0.0 && sy < h)) {
                for (int32_t c = 0; c < img->channels; c++) img->data[c * plane + o] = 0.0f;
                continue;
            }
            sx -= 0.5, sy -= 0.5;
            const double fx = floor(sx), fy = floor(sy);
            const float dx = (float)(sx - fx), dy = (float)(sy - fy);
            const size_t x0 = (size_t)clamp_index((int32_t)fx, w - 1);
            const size_t x1 = (size_t)clamp_index((int32_t)fx + 1, w - 1);
            const size_t r0 = (size_t)clamp_index((int32_t)fy, h - 1) * (size_t)w;
            const size_t r1 = (size_t)clamp_index((int32_t)fy + 1, h - 1) * (size_t)w;
            for (int32_t c = 0; c < img->channels; c++) {
                const float *s = img->scratch + c * plane;
                const float top = s[r0 + x0] + (s[r0 + x1] - s[r0 + x0]) * dx;
                const float bot = s[r1 + x0] + (s[r1 + x1] - s[r1 + x0]) * dx;
                img->data[c * plane + o] = top + (bot - top) * dy;
            }
        }
    }
}

/* PIL's Image.rotate(degrees) about the centre: its matrix, rounded to 15
 * decimals as PIL does (so that 90 degrees is an exact permutation). */
static void rotate(const vh_ra_image *img, double degrees) {
    const double a = -degrees * 3.14159265358979323846 / 180.0;
    const double cs = round(cos(a) * 1e15) / 1e15, sn = round(sin(a) * 1e15) / 1e15;
    const double cx = img->width / 2.0, cy = img->height / 2.0;
    double t[6] = {cs, sn, 0.0, -sn, cs, 0.0};
    t[2] = cs * -cx + sn * -cy + cx;
    t[5] = -sn * -cx + cs * -cy + cy;
    warp_affine(img, t);
}

/* Between normalised values and [0, 1] pixels (black -> 0, white -> 1), per channel. */
static void to_unit(const vh_ra_image *img, int forward) {
    const size_t plane = (size_t)img->height * (size_t)img->width;
    for (int32_t c = 0; c < img->channels; c++) {
        const float lo = img->black[c], span = img->white[c] - img->black[c];
        float *d = img->data + c * plane;
        if (!(span != 0.0f)) continue; /* a degenerate range: leave the plane */
        for (size_t k = 0; k < plane; k++) d[k] = forward ? (d[k] - lo) / span : lo + d[k] * span;
    }
}

/* PIL's grey of an RGB pixel (ITU-R 601-2 luma). */
static float grey(const float *d, size_t plane, size_t k) {
    return 0.299f * d[k] + 0.587f * d[plane + k] + 0.114f * d[2 * plane + k];
}

/* The degenerate image of a blending op (PIL's ImageEnhance), into scratch,
 * from [0, 1] pixels. 0 when the op leaves the image (color of non-RGB). */
static int degenerate(vh_ra_op op, const vh_ra_image *img) {
    const int32_t ch = img->channels, h = img->height, w = img->width;
    const size_t plane = (size_t)h * (size_t)w, n = (size_t)ch * plane;
    const float *d = img->data;
    float *s = img->scratch;
    if (op == VH_RA_BRIGHTNESS) {
        for (size_t k = 0; k < n; k++) s[k] = 0.0f; /* towards black */
    } else if (op == VH_RA_CONTRAST) { /* towards the image's mean grey */
        double sum = 0.0;
        for (size_t k = 0; k < plane; k++)
            if (ch == 3)
                sum += grey(d, plane, k);
            else
                for (int32_t c = 0; c < ch; c++) sum += d[c * plane + k];
        const float mean = (float)(sum / (double)(ch == 3 ? plane : n));
        for (size_t k = 0; k < n; k++) s[k] = mean;
    } else if (op == VH_RA_COLOR) { /* towards each pixel's grey */
        if (ch != 3) return 0;
        for (size_t k = 0; k < plane; k++)
            s[k] = s[plane + k] = s[2 * plane + k] = grey(d, plane, k);
    } else { /* sharpness: PIL's SMOOTH kernel [1 1 1; 1 5 1; 1 1 1] / 13, border kept */
        memcpy(s, d, n * sizeof(float));
        for (int32_t c = 0; c < ch; c++)
            for (int32_t y = 1; y < h - 1; y++)
                for (int32_t x = 1; x < w - 1; x++) {
                    const float *p = d + c * plane + (size_t)y * (size_t)w + (size_t)x;
                    float acc = 4.0f * p[0];
                    for (int32_t dy = -1; dy <= 1; dy++)
                        for (int32_t dx = -1; dx <= 1; dx++) acc += p[dy * w + dx];
                    s[c * plane + (size_t)y * (size_t)w + (size_t)x] = acc / 13.0f;
                }
    }
    return 1;
}

/* The colour ops, on [0, 1] pixels; `level` != 0. */
static void colour(vh_ra_op op, double level, const vh_ra_image *img) {
    const size_t plane = (size_t)img->height * (size_t)img->width;
    const size_t n = (size_t)img->channels * plane;
    float *d = img->data;
    to_unit(img, 1);
    if (op == VH_RA_AUTOCONTRAST) {
        for (int32_t c = 0; c < img->channels; c++) {
            float *p = d + c * plane, lo = p[0], hi = p[0];
            for (size_t k = 1; k < plane; k++)
                lo = p[k] < lo ? p[k] : lo, hi = p[k] > hi ? p[k] : hi;
            lo = clip01(lo), hi = clip01(hi);
            if (hi > lo)
                for (size_t k = 0; k < plane; k++) p[k] = clip01((p[k] - lo) / (hi - lo));
        }
    } else if (op == VH_RA_POSTERIZE) { /* keep the top 8 - int(4 |level|) bits of each byte */
        const int bits = 8 - (int)(4.0 * fmin(fabs(level), 1.0));
        const long mask = ~((1L << (8 - bits)) - 1) & 0xff;
        for (size_t k = 0; k < n; k++)
            d[k] = (float)(lrintf(clip01(d[k]) * 255.0f) & mask) / 255.0f;
    } else if (op == VH_RA_SOLARIZE) { /* bytes at or above the threshold inverted */
        const float thresh = (float)(256 - (int)(256.0 * fmin(fabs(level), 1.0)));
        for (size_t k = 0; k < n; k++) {
            const float v = clip01(d[k]);
            d[k] = v * 255.0f >= thresh ? 1.0f - v : v;
        }
    } else if (degenerate(op, img)) { /* blend: d + f (x - d), f = 1 + 0.9 level, clipped */
        const float f = (float)(1.0 + 0.9 * level);
        const float *s = img->scratch;
        for (size_t k = 0; k < n; k++) d[k] = clip01(s[k] + f * (d[k] - s[k]));
    }
    to_unit(img, 0);
}

void vh_rand_augment_apply_op(vh_ra_op op, double level, const vh_ra_image *img) {
    if (!img || !img->data || !img->scratch || img->channels < 1 || img->height < 1 ||
        img->width < 1)
        return;
    if (op == VH_RA_IDENTITY || op < 0 || op >= VH_RA_OPS) return;
    /* m = 0 is the identity for every op with a level; posterize keeps all 8
     * bits below |level| 1/4, solarize's threshold stays 256 below 1/256 */
    if (op != VH_RA_AUTOCONTRAST &&
        (level == 0.0 || (op == VH_RA_POSTERIZE && fabs(level) < 0.25) ||
         (op == VH_RA_SOLARIZE && fabs(level) < 1.0 / 256.0)))
        return;
    const double h = img->height, w = img->width;
    switch (op) {
    case VH_RA_ROTATE: rotate(img, 30.0 * level); break;
    case VH_RA_SHEAR_X: warp_affine(img, (const double[6]){1, 0.3 * level, 0, 0, 1, 0}); break;
    case VH_RA_SHEAR_Y: warp_affine(img, (const double[6]){1, 0, 0, 0.3 * level, 1, 0}); break;
    case VH_RA_TRANSLATE_X:
        warp_affine(img, (const double[6]){1, 0, 0.45 * level * w, 0, 1, 0});
        break;
    case VH_RA_TRANSLATE_Y:
        warp_affine(img, (const double[6]){1, 0, 0, 0, 1, 0.45 * level * h});
        break;
    default: colour(op, level, img); break;
    }
}

void vh_rand_augment_apply(const vh_rand_augment_config *c, uint64_t key, const vh_ra_image *img) {
    if (!c || c->n <= 0 || !img) return;
    const int32_t m = c->m < 0 ? 0 : c->m > MAX_MAGNITUDE ? MAX_MAGNITUDE : c->m;
    uint64_t rng = key;
    for (int32_t k = 0; k < c->n; k++) {
        /* three draws per layer whatever happens, so layer k's draws are fixed */
        const uint64_t pick = vh_sampler_rng_next(&rng), apply = vh_sampler_rng_next(&rng),
                       sign = vh_sampler_rng_next(&rng);
        if (apply >> 63) continue; /* timm's AugmentOp prob 0.5 */
        const double level = (double)m / MAX_MAGNITUDE * ((sign >> 63) ? -1.0 : 1.0);
        vh_rand_augment_apply_op((vh_ra_op)(pick % VH_RA_OPS), level, img);
    }
}
