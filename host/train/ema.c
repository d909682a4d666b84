/* ema.c - the EMA of the weights: the update, the swap with the masters
 * for evaluation and saving, and its file in a checkpoint (see ema.h). */
#define _POSIX_C_SOURCE 200809L
#include "ema.h"

#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "weights.h"

double ema_decay_at(const vh_ema_config *c, int64_t step, int64_t updates) {
    if (step > c->warmup_steps) return c->decay;
    double warm = (1.0 + (double)updates) / (10.0 + (double)updates);
    return warm < c->decay ? warm : c->decay;
}

int ema_due(const vh_ema_config *c, int64_t step, int skipped) {
    return c->decay > 0.0 && !skipped && c->every > 0 && step % c->every == 0;
}

void ema_lerp(float *ema, const float *w, int64_t n, double decay) {
    /* timm ModelEmaV3's lerp_(w, 1 - decay), in fp32 */
    const float weight = (float)(1.0 - decay);
    for (int64_t i = 0; i < n; i++) ema[i] += weight * (w[i] - ema[i]);
}

static const vh_config_entry *optim_key(vh_session *s, const char *key) {
    /* NULL for a 2.0 optimizer: it gets no shared keys (config.h) */
    return config_find(&s->run->configs[VH_ROLE_OPTIM], key);
}

static vh_status read_config(vh_ema_config *c, vh_session *s, vh_diag *d) {
    const vh_config_entry *decay = optim_key(s, "ema_decay");
    const vh_config_entry *warm = optim_key(s, "ema_warmup_steps");
    const vh_config_entry *every = optim_key(s, "ema_every");
    c->decay = decay ? decay->as.f : 0.0;
    c->warmup_steps = warm ? warm->as.i : 0;
    c->every = every ? every->as.i : 1;
    if (c->decay >= 1.0)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: optim.ema_decay is %g: an average with decay 1 never leaves the "
                        "starting weights; use a value in (0, 1) such as 0.9998, or 0 for no EMA",
                        s->run->recipe.file, c->decay);
    return VH_STATUS_OK;
}

vh_status ema_init(vh_ema *e, vh_session *s, vh_diag *d) {
    memset(e, 0, sizeof *e);
    vh_status st = read_config(&e->cfg, s, d);
    if (st != VH_STATUS_OK || e->cfg.decay <= 0.0) return st;
    e->count = s->slices.count;
    e->first = calloc((size_t)e->count + 1, sizeof *e->first);
    if (!e->first) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for the EMA");
    int64_t total = 0, largest = 0;
    for (int32_t i = 0; i < e->count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&s->slices, i);
        if (sl->master_dtype != VH_DTYPE_F32)
            return diag_set(d, VH_STATUS_ERR_CONFIG,
                            "%s: optim.ema_decay needs fp32 master weights, and precision "
                            "plugin '%s' keeps its masters in %s (give it fp32 masters, e.g. "
                            "precision.master_weights: true, or set optim.ema_decay: 0)",
                            s->run->recipe.file, s->run->plugins[VH_ROLE_PRECISION].desc->name,
                            vh_dtype_name((vh_dtype)sl->master_dtype));
        e->first[i] = total;
        total += sl->count;
        if (sl->count > largest) largest = sl->count;
    }
    e->values = malloc((size_t)(total ? total : 1) * sizeof *e->values);
    if (s->run->device->kind != VH_DEVICE_KIND_CPU)
        e->staging = malloc((size_t)(largest ? largest : 1) * sizeof *e->staging);
    if (!e->values || (s->run->device->kind != VH_DEVICE_KIND_CPU && !e->staging))
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for the EMA of %lld values",
                        (long long)total);
    return VH_STATUS_OK;
}

void ema_free(vh_ema *e) {
    free(e->values);
    free(e->first);
    free(e->staging);
    memset(e, 0, sizeof *e);
}

/* A slice's masters readable on the host: the master itself on the CPU,
 * else copied into the staging buffer. */
static vh_status host_masters(vh_ema *e, vh_session *s, const vh_param_slice *sl,
                              float **out, vh_diag *d) {
    const vh_device_ops *dev = s->run->device;
    if (dev->kind == VH_DEVICE_KIND_CPU) {
        *out = sl->master;
        return VH_STATUS_OK;
    }
    *out = e->staging;
    vh_status st = dev->copy(dev->device, e->staging, sl->master,
                             (size_t)sl->count * sizeof(float), VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    return st == VH_STATUS_OK ? st : diag_set(d, st, "EMA: copying masters from %s failed", dev->name);
}

vh_status ema_reset(vh_ema *e, vh_session *s, vh_diag *d) {
    for (int32_t i = 0; e->cfg.decay > 0.0 && i < e->count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&s->slices, i);
        float *w = NULL;
        vh_status st = host_masters(e, s, sl, &w, d);
        if (st != VH_STATUS_OK) return st;
        memcpy(e->values + e->first[i], w, (size_t)sl->count * sizeof *w);
    }
    e->updates = 0;
    return VH_STATUS_OK;
}

vh_status ema_step(vh_ema *e, vh_session *s, int64_t step, int skipped, vh_diag *d) {
    if (!ema_due(&e->cfg, step, skipped)) return VH_STATUS_OK;
    double decay = ema_decay_at(&e->cfg, step, e->updates);
    /* the optimizer's writes must have landed before the host reads them */
    const vh_device_ops *dev = s->run->device;
    if (dev->kind != VH_DEVICE_KIND_CPU) {
        vh_status st = dev->synchronize(dev->device);
        if (st != VH_STATUS_OK) return diag_set(d, st, "EMA: synchronizing %s failed", dev->name);
    }
    for (int32_t i = 0; i < e->count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&s->slices, i);
        float *w = NULL;
        vh_status st = host_masters(e, s, sl, &w, d);
        if (st != VH_STATUS_OK) return st;
        ema_lerp(e->values + e->first[i], w, sl->count, decay);
    }
    e->updates++;
    return VH_STATUS_OK;
}

static void swap_floats(float *a, float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

static vh_status swap_slice(vh_ema *e, vh_session *s, int32_t i, vh_diag *d) {
    const vh_param_slice *sl = vh_param_slices_at(&s->slices, i);
    float *avg = e->values + e->first[i];
    const vh_device_ops *dev = s->run->device;
    if (dev->kind == VH_DEVICE_KIND_CPU) {
        swap_floats(sl->master, avg, sl->count);
        return VH_STATUS_OK;
    }
    size_t bytes = (size_t)sl->count * sizeof(float);
    vh_status st = dev->copy(dev->device, e->staging, sl->master, bytes,
                             VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (st == VH_STATUS_OK)
        st = dev->copy(dev->device, sl->master, avg, bytes, VH_COPY_KIND_HOST_TO_DEVICE, NULL);
    if (st == VH_STATUS_OK) st = dev->synchronize(dev->device);
    if (st != VH_STATUS_OK) return diag_set(d, st, "EMA: swapping masters on %s failed", dev->name);
    memcpy(avg, e->staging, bytes);
    return VH_STATUS_OK;
}

vh_status ema_swap(vh_ema *e, vh_session *s, vh_diag *d) {
    for (int32_t i = 0; i < e->count; i++) {
        vh_status st = swap_slice(e, s, i, d);
        if (st != VH_STATUS_OK) return st;
    }
    /* compute copies (and gathered ones FSDP holds) from the new masters */
    session_trace(s, "sharding.refresh (EMA swap)");
    vh_status st = s->sharding->refresh(s->self[VH_ROLE_SHARDING]);
    if (st != VH_STATUS_OK) return session_plugin_error(s, VH_ROLE_SHARDING, st, "sharding.refresh", d);
    return VH_STATUS_OK;
}

/* ---- in a checkpoint ------------------------------------------------------- */

/* The average as a weights file: swapped in, written as model.safetensors
 * is (store_unit, collective: one unit at a time, never the whole model on
 * a rank, and no whole-tensor all-reduce), swapped back. */
static vh_status ckpt_save(void *ctx, vh_session *s, const char *path, vh_diag *d) {
    vh_ema *e = ctx;
    vh_status st = ema_swap(e, s, d);
    if (st != VH_STATUS_OK) return st;
    st = weights_save_model(s, path, d);
    vh_diag back;
    vh_status st2 = ema_swap(e, s, &back);
    if (st == VH_STATUS_OK && st2 != VH_STATUS_OK) *d = back, st = st2;
    return st;
}

/* Each slice's elements from its parameter's tensor (every rank reads its
 * own range of the mapped file). */
static vh_status ckpt_load(void *ctx, vh_session *s, const char *path, vh_diag *d) {
    vh_ema *e = ctx;
    vh_st_file f;
    memset(&f, 0, sizeof f);
    vh_status st = st_read(&f, path, d);
    for (int32_t i = 0; st == VH_STATUS_OK && i < e->count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&s->slices, i);
        const vh_param_desc *pd = &s->table->units[sl->unit].params[sl->param];
        const vh_st_tensor *t = st_find(&f, pd->name);
        int same = t && t->ndim == pd->ndim;
        for (int32_t k = 0; same && k < pd->ndim; k++) same = t->shape[k] == pd->shape[k];
        if (!same)
            st = diag_set(d, VH_STATUS_ERR_FORMAT,
                          "%s: %s '%s' of this model's shape (is it the EMA of this model?)",
                          path, t ? "the tensor is not" : "no tensor", pd->name);
        else
            st = st_read_f32_range(&f, t, sl->offset, sl->count, e->values + e->first[i], d);
    }
    st_free(&f);
    return st;
}

void ema_attach(vh_ema *e, vh_session *s) {
    if (e->cfg.decay <= 0.0) return;
    s->ckpt_extra = (vh_checkpoint_extra){.name = "ema", .ctx = e, .counter = &e->updates,
                                          .save = ckpt_save, .load = ckpt_load};
}
