/* vit_weights.c - named weights into a unit's fp32 values: checkpoints
 * (strict) and `pretrained` files, where a head trained for another class
 * count starts fresh.
 *
 * The host opened the file and reports what no parameter looked up as
 * ignored; the model decides what it needs and what it re-initialises. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
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
            return api->fail(m->host, VH_STATUS_ERR_FORMAT,
                             "%s: tensor '%s' is %s, the model has %s (image size, patch size "
                             "or width differ; resizing is not supported)",
                             src.path, p->name, got, want);
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
