/* transform.c - crops, bilinear resampling and normalisation. See transform.h. */
#include "transform.h"

#include <math.h>

#include "vithost/vh_sampler.h"

void imf_transform_set_norm(imf_transform *t, const double mean[3], const double std[3]) {
    for (int c = 0; c < 3; c++) {
        t->norm_scale[c] = (float)(1.0 / (255.0 * std[c]));
        t->norm_bias[c] = (float)(-mean[c] / std[c]);
    }
}

/* Uniform in [lo, hi) from 53 random bits. */
static double uniform(uint64_t *state, double lo, double hi) {
    double u = (double)(vh_sampler_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

/* Uniform integer in [0, n), n >= 1 (modulo bias below 2^-40 for images). */
static int32_t below(uint64_t *state, int32_t n) {
    return (int32_t)(vh_sampler_rng_next(state) % (uint64_t)n);
}

/* Streams of one sample's key: the box and the flip draw independently. */
enum { STREAM_CROP = 0x43524f50u, STREAM_FLIP = 0x464c4950u };

void imf_train_crop(const imf_transform *t, uint64_t key, int32_t width, int32_t height,
                    imf_crop *crop, int *flip) {
    uint64_t flip_state = key ^ ((uint64_t)STREAM_FLIP << 32);
    *flip = t->hflip ? (int)(vh_sampler_rng_next(&flip_state) >> 63) : 0;
    if (!t->random_crop) {
        imf_eval_crop(t, width, height, crop);
        return;
    }
    uint64_t state = key ^ ((uint64_t)STREAM_CROP << 32);
    const double area = (double)width * (double)height;
    const double log_lo = log(3.0 / 4.0), log_hi = log(4.0 / 3.0);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * uniform(&state, t->scale_min, 1.0);
        double aspect = exp(uniform(&state, log_lo, log_hi));
        double w = rint(sqrt(target * aspect)); /* Python's round: half to even */
        double h = rint(sqrt(target / aspect));
        if (w > 0 && w <= width && h > 0 && h <= height) {
            int32_t wi = (int32_t)w, hi = (int32_t)h;
            crop->y = below(&state, height - hi + 1);
            crop->x = below(&state, width - wi + 1);
            crop->w = wi;
            crop->h = hi;
            return;
        }
    }
    /* Fallback: the center crop of the largest box within the ratio range. */
    double in_ratio = (double)width / (double)height, w = width, h = height;
    if (in_ratio < 3.0 / 4.0)
        h = rint(w / (3.0 / 4.0));
    else if (in_ratio > 4.0 / 3.0)
        w = rint(h * (4.0 / 3.0));
    crop->w = w;
    crop->h = h;
    crop->x = floor((width - w) / 2.0);
    crop->y = floor((height - h) / 2.0);
}

void imf_eval_crop(const imf_transform *t, int32_t width, int32_t height, imf_crop *crop) {
    const int32_t s = t->size;
    double r = floor((double)s / t->crop_pct + 1e-9); /* resized shorter side */
    double rw, rh;
    if (width <= height) {
        rw = r;
        rh = floor(r * (double)height / (double)width);
    } else {
        rh = r;
        rw = floor(r * (double)width / (double)height);
    }
    double top = rint((rh - s) / 2.0), left = rint((rw - s) / 2.0);
    double fx = (double)width / rw, fy = (double)height / rh;
    crop->x = left * fx;
    crop->y = top * fy;
    crop->w = s * fx;
    crop->h = s * fy;
}

double imf_crop_min_scale(const imf_transform *t, const imf_crop *crop) {
    double sx = (double)t->size / crop->w, sy = (double)t->size / crop->h;
    double s = sx > sy ? sx : sy;
    return s < 1.0 ? s : 1.0;
}

/* Source sample positions of one axis: the two neighbours (as element
 * offsets, times `step`) and the weight of the second. */
static void axis_taps(double start, double scale, int32_t n_out, int32_t n_in, int32_t step,
                      int flip, int32_t *i0, int32_t *i1, float *wt) {
    for (int32_t o = 0; o < n_out; o++) {
        double src = start + (o + 0.5) * scale - 0.5;
        int32_t a, b;
        double w;
        if (src <= 0) {
            a = b = 0, w = 0;
        } else if (src >= n_in - 1) {
            a = b = n_in - 1, w = 0;
        } else {
            a = (int32_t)src, b = a + 1, w = src - a;
        }
        int32_t k = flip ? n_out - 1 - o : o;
        i0[k] = a * step;
        i1[k] = b * step;
        wt[k] = (float)w;
    }
}

void imf_resample(const imf_transform *t, const imf_image *img, const imf_crop *crop, int flip,
                  float *out) {
    const int32_t s = t->size, w = img->width, h = img->height;
    const double fx = (double)w / img->full_width, fy = (double)h / img->full_height;
    int32_t x0[IMF_MAX_SIZE], x1[IMF_MAX_SIZE], y0[IMF_MAX_SIZE], y1[IMF_MAX_SIZE];
    float wx[IMF_MAX_SIZE], wy[IMF_MAX_SIZE];
    axis_taps(crop->x * fx, crop->w * fx / s, s, w, 3, flip, x0, x1, wx);
    axis_taps(crop->y * fy, crop->h * fy / s, s, h, 1, 0, y0, y1, wy);

    const size_t plane = (size_t)s * (size_t)s, stride = (size_t)w * 3;
    float *r_out = out, *g_out = out + plane, *b_out = out + 2 * plane;
    const float sr = t->norm_scale[0], sg = t->norm_scale[1], sb = t->norm_scale[2];
    const float br = t->norm_bias[0], bg = t->norm_bias[1], bb = t->norm_bias[2];
    for (int32_t oy = 0; oy < s; oy++) {
        const uint8_t *top = img->rgb + (size_t)y0[oy] * stride;
        const uint8_t *bot = img->rgb + (size_t)y1[oy] * stride;
        const float v = wy[oy];
        const size_t row = (size_t)oy * (size_t)s;
        for (int32_t ox = 0; ox < s; ox++) {
            const uint8_t *a = top + x0[ox], *b = top + x1[ox];
            const uint8_t *c = bot + x0[ox], *d = bot + x1[ox];
            const float u = wx[ox];
            float px[3];
            for (int k = 0; k < 3; k++) {
                float t0 = a[k] + (b[k] - a[k]) * u;
                float t1 = c[k] + (d[k] - c[k]) * u;
                px[k] = t0 + (t1 - t0) * v;
            }
            r_out[row + ox] = px[0] * sr + br;
            g_out[row + ox] = px[1] * sg + bg;
            b_out[row + ox] = px[2] * sb + bb;
        }
    }
}
