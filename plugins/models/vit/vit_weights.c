/* vit_weights.c - named weights into a unit's fp32 values: checkpoints
 * (strict) and `pretrained` files, where a head trained for another class
 * count starts fresh and a position embedding trained at another image
 * size is resized (bicubic, as timm's resample_abs_pos_embed).
 *
 * The host opened the file and reports what no parameter looked up as
 * ignored; the model decides what it needs and what it re-initialises. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vit.h"
#include "vithost/vh_runtime.h"

static void shape_text(char *buf, size_t len, int32_t ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int32_t i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

static int same_shape(const vh_tensor *t, const vh_param_desc *p) {
    if (t->ndim != p->ndim) return 0;
    for (int32_t i = 0; i < p->ndim; i++)
        if (t->shape[i] != p->shape[i]) return 0;
    return 1;
}

/* The classifier: the only parameters allowed to change shape when
 * fine-tuning on another class count. */
static int is_head(const vit *m, int32_t unit, const vh_param_desc *p) {
    return unit == m->table.num_units - 1 && strncmp(p->name, "head.", 5) == 0;
}

/* A host-memory view (f32, f16 or bf16, any alignment) to fp32 values. */
static vh_status read_values(vit *m, const vh_weights_source *src, const vh_param_desc *p,
                             const vh_tensor *t, float *out) {
    const unsigned char *bytes = t->data;
    switch (t->dtype) {
    case VH_DTYPE_F32:
        memcpy(out, bytes, (size_t)p->numel * sizeof(float));
        return VH_STATUS_OK;
    case VH_DTYPE_F16:
    case VH_DTYPE_BF16:
        for (int64_t i = 0; i < p->numel; i++) {
            uint16_t h = (uint16_t)(bytes[2 * i] | bytes[2 * i + 1] << 8);
            out[i] = t->dtype == VH_DTYPE_BF16 ? vh_bf16_to_f32(h) : vh_f16_to_f32(h);
        }
        return VH_STATUS_OK;
    default:
        return m->host->api->fail(m->host, VH_STATUS_ERR_FORMAT,
                                  "%s: tensor '%s' is %s; parameters must be F32, F16 or BF16",
                                  src->path, p->name, vh_dtype_name(t->dtype));
    }
}

static void record(const vh_weights_report *report, const char *name, vh_weights_action action,
                   const char *why) {
    if (report && report->record) report->record(report->ctx, name, action, why);
}

/* ---- position embeddings trained at another image size --------------------
 * torch.nn.functional.interpolate(mode='bicubic', align_corners=False,
 * antialias=False), which timm's resample_abs_pos_embed calls on the patch
 * grid (the class-token row is kept): source x = (i + 0.5) * in / out - 0.5,
 * not clamped; the 4 taps around floor(x), indices clamped to the border;
 * Keys' cubic with A = -0.75. Computed in double, rounded to float once.
 * (timm >= 0.9 passes antialias=True when loading checkpoints, a PIL-style
 * filter with A = -0.5: not this one; DeiT and BEiT fine-tuning use this.) */

static double cubic_near(double x) { /* |x| <= 1 */
    const double A = -0.75;
    return ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
}
static double cubic_far(double x) { /* 1 < |x| < 2 */
    const double A = -0.75;
    return ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
}

/* Taps (clamped indices) and weights of output position i of n_out. */
static void bicubic_taps(int64_t i, int64_t n_in, int64_t n_out, int64_t idx[4], double w[4]) {
    const double x = ((double)i + 0.5) * (double)n_in / (double)n_out - 0.5;
    const double f = floor(x), t = x - f;
    w[0] = cubic_far(t + 1.0), w[1] = cubic_near(t), w[2] = cubic_near(1.0 - t);
    w[3] = cubic_far(2.0 - t);
    for (int k = 0; k < 4; k++) {
        int64_t j = (int64_t)f - 1 + k;
        idx[k] = j < 0 ? 0 : j >= n_in ? n_in - 1 : j;
    }
}

/* (h1 * w1, dim) grid rows -> (h2 * w2, dim), row-major tokens y * w + x. */
void vit_resize_pos_grid(const float *src, int64_t h1, int64_t w1, float *dst, int64_t h2,
                         int64_t w2, int64_t dim) {
    for (int64_t y = 0; y < h2; y++) {
        int64_t ry[4], rx[4];
        double wy[4], wx[4];
        bicubic_taps(y, h1, h2, ry, wy);
        for (int64_t x = 0; x < w2; x++) {
            bicubic_taps(x, w1, w2, rx, wx);
            for (int64_t c = 0; c < dim; c++) {
                double acc = 0.0;
                for (int a = 0; a < 4; a++) {
                    double row = 0.0;
                    for (int b = 0; b < 4; b++) row += wx[b] * src[(ry[a] * w1 + rx[b]) * dim + c];
                    acc += wy[a] * row;
                }
                dst[(y * w2 + x) * dim + c] = (float)acc;
            }
        }
    }
}

/* A pretrained pos_embed (1, prefix + g*g, dim) of another square grid g:
 * resized into the model's grid. 1 when done (or failed: *st says), 0 when
 * the tensor is not such a pos_embed (the caller refuses it). */
static int resize_pos_embed(vit *m, const vh_weights_source *src, const vh_param_desc *p,
                            const vh_tensor *t, float *out, const vh_weights_report *rep,
                            vh_status *st) {
    const int64_t prefix = m->classifier == VIT_CLASSIFIER_TOKEN ? 1 : 0;
    if (strcmp(p->name, "pos_embed") != 0 || t->ndim != 3 || t->shape[0] != 1 ||
        t->shape[2] != m->dim || t->shape[1] <= prefix)
        return 0;
    const int64_t old = (int64_t)llround(sqrt((double)(t->shape[1] - prefix)));
    if (old * old != t->shape[1] - prefix) {
        *st = m->host->api->fail(m->host, VH_STATUS_ERR_FORMAT,
                                 "%s: pos_embed has %lld tokens: not %lld prefix token(s) and a "
                                 "square patch grid, so it cannot be resized to %lldx%lld (a "
                                 "file of the other classifier, token or pooled?)",
                                 src->path, (long long)t->shape[1], (long long)prefix,
                                 (long long)m->grid_h, (long long)m->grid_w);
        return 1;
    }
    vh_param_desc whole = *p; /* read the file's tensor with its own size */
    whole.numel = t->shape[1] * m->dim;
    float *file = malloc((size_t)whole.numel * sizeof *file);
    if (!file) {
        *st = m->host->api->fail(m->host, VH_STATUS_ERR_NOMEM, "no memory to resize pos_embed");
        return 1;
    }
    *st = read_values(m, src, &whole, t, file);
    if (*st == VH_STATUS_OK) {
        memcpy(out, file, (size_t)(prefix * m->dim) * sizeof *out); /* class token row kept */
        vit_resize_pos_grid(file + prefix * m->dim, old, old, out + prefix * m->dim, m->grid_h,
                            m->grid_w, m->dim);
        char why[160];
        snprintf(why, sizeof why, "resized from a %lldx%lld to a %lldx%lld patch grid (bicubic)",
                 (long long)old, (long long)old, (long long)m->grid_h, (long long)m->grid_w);
        m->host->api->log(m->host, VH_LOG_LEVEL_INFO, "%s: pos_embed %s", src->path, why);
        record(rep, p->name, VH_WEIGHTS_ACTION_LOADED, why);
    }
    free(file);
    return 1;
}

vh_status vit_load_weights(void *self, int32_t unit, const vh_weights_source *src_in,
                           vh_weights_mode mode, float *values,
                           const vh_weights_report *report_in) {
    vit *m = self;
    const vh_host_api *api = m->host->api;
    if (unit < 0 || unit >= m->table.num_units)
        return api->fail(m->host, VH_STATUS_ERR_INVALID_ARG, "no unit %d", (int)unit);
    vh_weights_source src;
    vh_weights_report report;
    if (!vh_struct_upgrade(&src, sizeof src, src_in) || !src.find)
        return api->fail(m->host, VH_STATUS_ERR_INVALID_ARG, "load_weights without a source");
    if (!src.path) src.path = "the weights file";
    const vh_weights_report *rep = NULL;
    if (vh_struct_upgrade(&report, sizeof report, report_in)) rep = &report;

    const vh_unit_desc *u = &m->units[unit];
    for (int32_t i = 0; i < u->num_params; i++) {
        const vh_param_desc *p = &u->params[i];
        char want[128], got[128];
        shape_text(want, sizeof want, p->ndim, p->shape);
        vh_tensor t;
        memset(&t, 0, sizeof t);
        if (mode == VH_WEIGHTS_MODE_PRETRAINED && m->reset_head && is_head(m, unit, p)) {
            src.find(src.ctx, p->name, &t); /* looked up: the file's head is not "ignored" */
            record(rep, p->name, VH_WEIGHTS_ACTION_REINITIALISED, "model.reset_head");
            continue; /* values hold the init rules' values */
        }
        if (!src.find(src.ctx, p->name, &t))
            return api->fail(m->host, VH_STATUS_ERR_FORMAT,
                             "%s has no tensor '%s' %s that the vit model needs (is it a "
                             "checkpoint of this model?)",
                             src.path, p->name, want);
        if (!same_shape(&t, p)) {
            shape_text(got, sizeof got, t.ndim, t.shape);
            if (mode == VH_WEIGHTS_MODE_PRETRAINED && is_head(m, unit, p)) {
                /* values hold the init rules' values: the head starts fresh */
                char why[320];
                if (t.ndim >= 1 && t.shape[0] != p->shape[0])
                    snprintf(why, sizeof why, "the file has %lld classes, the model %lld",
                             (long long)t.shape[0], (long long)p->shape[0]);
                else
                    snprintf(why, sizeof why, "the file's is %s, the model's %s", got, want);
                record(rep, p->name, VH_WEIGHTS_ACTION_REINITIALISED, why);
                continue;
            }
            vh_status st = VH_STATUS_OK;
            if (mode == VH_WEIGHTS_MODE_PRETRAINED &&
                resize_pos_embed(m, &src, p, &t, values + p->offset, rep, &st)) {
                if (st != VH_STATUS_OK) return st;
                continue;
            }
            return api->fail(m->host, VH_STATUS_ERR_FORMAT,
                             "%s: tensor '%s' is %s, the model has %s (patch size or width "
                             "differ%s)",
                             src.path, p->name, got, want,
                             mode == VH_WEIGHTS_MODE_PRETRAINED
                                 ? ""
                                 : "; a checkpoint loads strictly: start from its weights "
                                   "with model.pretrained to resize pos_embed or change the "
                                   "head");
        }
        if (!t.data && p->numel > 0)
            return api->fail(m->host, VH_STATUS_ERR_FORMAT, "%s: tensor '%s' has no data",
                             src.path, p->name);
        vh_status st = read_values(m, &src, p, &t, values + p->offset);
        if (st != VH_STATUS_OK) return st;
        record(rep, p->name, VH_WEIGHTS_ACTION_LOADED, "from the file");
    }
    return VH_STATUS_OK;
}
