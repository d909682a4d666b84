/* lion.c - the Lion optimizer (Chen et al. 2023, "Symbolic Discovery of
 * Optimization Algorithms"), as lucidrains/lion-pytorch:
 *
 *     c = beta1 * m + (1 - beta1) * g
 *     w = w - lr * (sign(c) + weight_decay * w)      (decay where VH_PARAM_FLAG_DECAY)
 *     m = beta2 * m + (1 - beta2) * g
 *
 * One state value per element (m, the sharding plugin's slot 0), half of
 * AdamW's; every update has the same size per element, so Lion wants a
 * learning rate 3-10x smaller than AdamW's and a weight decay as many times
 * larger. The rate warms up linearly over warmup_steps, then stays. Plain
 * loops: CPU device only.
 */
#include <string.h>

#include <vithost/vithost.h>

typedef struct lion {
    vh_host *host;
    float lr, beta1, beta2, weight_decay;
    int64_t warmup;
} lion;

static const vh_config_key schema[] = {
    {"lr", VH_CONFIG_TYPE_FLOAT, "1.0e-4", "peak learning rate, > 0", NULL, 0, 1, 0},
    {"beta1", VH_CONFIG_TYPE_FLOAT, "0.9", "interpolation of the update direction, [0, 1)",
     NULL, 0, 1, 0},
    {"beta2", VH_CONFIG_TYPE_FLOAT, "0.99", "decay of the momentum, [0, 1)", NULL, 0, 1, 0},
    {"weight_decay", VH_CONFIG_TYPE_FLOAT, "0.0", "decoupled weight decay (times lr)", NULL, 0,
     10, 0},
    {"warmup_steps", VH_CONFIG_TYPE_INT, "0", "linear warm-up of the rate", NULL, 0, 1e9, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status lion_create(vh_host *host, const vh_optim_setup *setup, void **self) {
    (void)setup;
    const vh_host_api *api = host->api;
    *self = NULL;
    if (api->device(host)->kind != VH_DEVICE_KIND_CPU)
        return api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                         "lion updates with CPU loops; device %s is not supported",
                         api->device(host)->name);
    double lr, b1, b2, wd;
    int64_t warmup;
    vh_status st;
    if ((st = api->config_float(host, "lr", &lr)) != VH_STATUS_OK ||
        (st = api->config_float(host, "beta1", &b1)) != VH_STATUS_OK ||
        (st = api->config_float(host, "beta2", &b2)) != VH_STATUS_OK ||
        (st = api->config_float(host, "weight_decay", &wd)) != VH_STATUS_OK ||
        (st = api->config_int(host, "warmup_steps", &warmup)) != VH_STATUS_OK)
        return st;
    if (lr <= 0.0) return api->config_fail(host, "lr", "must be > 0, not %g", lr);
    if (b1 >= 1.0) return api->config_fail(host, "beta1", "must be < 1, not %g", b1);
    if (b2 >= 1.0) return api->config_fail(host, "beta2", "must be < 1, not %g", b2);
    lion *o = api->alloc(host, sizeof *o);
    if (!o) return api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(o, 0, sizeof *o);
    o->host = host;
    o->lr = (float)lr;
    o->beta1 = (float)b1;
    o->beta2 = (float)b2;
    o->weight_decay = (float)wd;
    o->warmup = warmup;
    *self = o;
    return VH_STATUS_OK;
}

static void lion_destroy(void *self) {
    lion *o = self;
    if (o) o->host->api->free(o->host, o);
}

static int32_t lion_state_slots(void *self) {
    (void)self;
    return 1; /* m */
}

static vh_status lion_step(void *self, const vh_param_slices *slices, int64_t step,
                           double *lr_out) {
    lion *o = self;
    /* `step` counts skipped steps too: the schedule follows the host's clock. */
    float lr = o->lr;
    if (o->warmup > 0 && step < o->warmup) lr = o->lr * (float)(step + 1) / (float)o->warmup;
    const float b1 = o->beta1, b2 = o->beta2;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        if (sl->master_dtype != VH_DTYPE_F32 || sl->grad_dtype != VH_DTYPE_F32 ||
            sl->state_dtype != VH_DTYPE_F32)
            return o->host->api->fail(o->host, VH_STATUS_ERR_UNSUPPORTED,
                                      "lion updates f32 only; unit %d param %d has master %s, "
                                      "grad %s, state %s",
                                      (int)sl->unit, (int)sl->param,
                                      vh_dtype_name(sl->master_dtype),
                                      vh_dtype_name(sl->grad_dtype),
                                      vh_dtype_name(sl->state_dtype));
        float *w = sl->master, *m = sl->state[0];
        const float *g = sl->grad;
        const float decay = (sl->flags & VH_PARAM_FLAG_DECAY) ? lr * o->weight_decay : 0.0f;
        for (int64_t i = 0; i < sl->count; i++) {
            const float c = b1 * m[i] + (1.0f - b1) * g[i];
            const float sign = (c > 0.0f) - (c < 0.0f); /* sign(0) = 0, as torch.sign */
            w[i] -= lr * sign + decay * w[i];
            m[i] = b2 * m[i] + (1.0f - b2) * g[i];
        }
    }
    if (lr_out) *lr_out = lr;
    return VH_STATUS_OK;
}

static const vh_optim_vtable vtable = {
    .struct_size = sizeof(vh_optim_vtable),
    .create = lion_create,
    .destroy = lion_destroy,
    .state_slots = lion_state_slots,
    .step = lion_step,
    /* No scalar state: m is in the slices (saved by the sharding plugin) and
     * the schedule follows the host's step. */
};

VH_PLUGIN_DEFINE(VH_ROLE_OPTIM, "lion", "0.1.0", "Lion: sign of an interpolated momentum (CPU)",
                 schema, vtable);
