/* abi20_optim.c - the optimizer role's test plugin: plain SGD.
 *
 * ABI 2.0, frozen: tests/plugins/test_optim.c as it shipped with ABI 2.0,
 * built against tests/abi20/include (the 2.0 headers, their sizes) and
 * declaring minor 0. It stands for a plugin compiled once against 2.0 that
 * every 2.x host must still load, train and resume (tests/test_abi20.c).
 * Never port it to newer headers. Its vtable is followed by words that are
 * no pointers (abi20_poison.h), so a host that reads past it fails at once.
 *
 * Per element, as torch.optim.SGD (dampening 0, no Nesterov):
 *
 *     g = grad + weight_decay * w        (only where VH_PARAM_FLAG_DECAY)
 *     m = momentum * m + g; g = m        (only when momentum > 0: one state slot)
 *     w = w - lr * g
 *
 * The learning rate is constant; the only scalar state is a step counter.
 */
#include <stdint.h>
#include <string.h>

#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_optim.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"

#include "abi20_poison.h"

typedef struct abi20_optim {
    vh_host *host;
    float lr, momentum, weight_decay;
    int64_t steps; /* updates done */
} abi20_optim;

static const vh_config_key schema[] = {
    {"lr", VH_CONFIG_TYPE_FLOAT, "0.1", "learning rate, > 0", NULL, 0, 10, 0},
    {"momentum", VH_CONFIG_TYPE_FLOAT, "0.0", "momentum in [0, 1); 0 keeps no state", NULL, 0, 1,
     0},
    {"weight_decay", VH_CONFIG_TYPE_FLOAT, "0.0", "L2 factor on parameters flagged for decay",
     NULL, 0, 1, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status get_float(vh_host *host, const char *key, double *out) {
    vh_status st = host->api->config_float(host, key, out);
    if (st != VH_STATUS_OK) return host->api->fail(host, st, "cannot read the float key '%s'", key);
    return VH_STATUS_OK;
}

static vh_status optim_create(vh_host *host, const vh_optim_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    /* An older (smaller) setup reads with its missing members zero. */
    vh_optim_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "optim setup missing");
    double lr, momentum, wd;
    vh_status st;
    if ((st = get_float(host, "lr", &lr)) != VH_STATUS_OK) return st;
    if ((st = get_float(host, "momentum", &momentum)) != VH_STATUS_OK) return st;
    if ((st = get_float(host, "weight_decay", &wd)) != VH_STATUS_OK) return st;
    /* The schema's ranges are inclusive; the open ends are checked here. */
    if (!(lr > 0.0 && lr <= 10.0))
        return host->api->config_fail(host, "lr", "%g is outside (0, 10]", lr);
    if (!(momentum >= 0.0 && momentum < 1.0))
        return host->api->config_fail(host, "momentum", "%g is outside [0, 1)", momentum);
    if (!(wd >= 0.0 && wd <= 1.0))
        return host->api->config_fail(host, "weight_decay", "%g is outside [0, 1]", wd);

    abi20_optim *o = host->api->alloc(host, sizeof *o);
    if (!o) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(o, 0, sizeof *o);
    o->host = host;
    o->lr = (float)lr;
    o->momentum = (float)momentum;
    o->weight_decay = (float)wd;
    *self = o;
    return VH_STATUS_OK;
}

static void optim_destroy(void *self) {
    abi20_optim *o = self;
    if (!o) return;
    o->host->api->free(o->host, o);
}

static int32_t optim_state_slots(void *self) {
    const abi20_optim *o = self;
    return o && o->momentum > 0.0f ? 1 : 0;
}

static vh_status optim_step(void *self, const vh_param_slices *slices, int64_t step,
                            double *lr_out) {
    abi20_optim *o = self;
    if (!o) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = o->host;
    if (!slices || (slices->count > 0 && !slices->items))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "step: NULL slices");
    if (step < 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "step %lld is negative",
                               (long long)step);
    const int use_momentum = o->momentum > 0.0f;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        if (sl->count > 0 && (!sl->master || !sl->grad || (use_momentum && !sl->state[0])))
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d (unit %d, param %d) lacks %s", (int)s, (int)sl->unit,
                                   (int)sl->param,
                                   !sl->master ? "master" : !sl->grad ? "grad" : "momentum state");
        if (sl->count > 0 &&
            (sl->master_dtype != VH_DTYPE_F32 || sl->grad_dtype != VH_DTYPE_F32 ||
             (use_momentum && sl->state_dtype != VH_DTYPE_F32)))
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "slice %d (unit %d, param %d): master %s, grad %s, state %s; "
                                   "abi20_optim updates f32 only",
                                   (int)s, (int)sl->unit, (int)sl->param,
                                   vh_dtype_name(sl->master_dtype), vh_dtype_name(sl->grad_dtype),
                                   vh_dtype_name(sl->state_dtype));
    }

    const float lr = o->lr, mu = o->momentum;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        const float wd = (sl->flags & VH_PARAM_FLAG_DECAY) ? o->weight_decay : 0.0f;
        float *w = sl->master;
        const float *g = sl->grad;
        if (use_momentum) {
            float *m = sl->state[0];
            for (int64_t i = 0; i < sl->count; i++) {
                m[i] = mu * m[i] + (g[i] + wd * w[i]);
                w[i] -= lr * m[i];
            }
        } else {
            for (int64_t i = 0; i < sl->count; i++) w[i] -= lr * (g[i] + wd * w[i]);
        }
    }
    o->steps++;
    if (lr_out) *lr_out = (double)lr;
    return VH_STATUS_OK;
}

/* ---- state: the step counter ------------------------------------------ */

#define STATE_MAGIC 0x54534f54u /* "TOST" */
#define STATE_VERSION 1u

typedef struct optim_state {
    uint32_t magic, version;
    int64_t steps;
} optim_state;

static vh_status optim_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = sizeof(optim_state);
    return VH_STATUS_OK;
}

static vh_status optim_state_save(void *self, void *buf, size_t bytes) {
    abi20_optim *o = self;
    if (!o || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < sizeof(optim_state))
        return o->host->api->fail(o->host, VH_STATUS_ERR_INVALID_ARG,
                                  "state buffer of %zu bytes, %zu needed", bytes,
                                  sizeof(optim_state));
    optim_state s;
    memset(&s, 0, sizeof s);
    s.magic = STATE_MAGIC;
    s.version = STATE_VERSION;
    s.steps = o->steps;
    memcpy(buf, &s, sizeof s);
    return VH_STATUS_OK;
}

static vh_status optim_state_load(void *self, const void *buf, size_t bytes) {
    abi20_optim *o = self;
    if (!o || !buf) return VH_STATUS_ERR_INVALID_ARG;
    optim_state s;
    if (bytes != sizeof s)
        return o->host->api->fail(o->host, VH_STATUS_ERR_FORMAT, "state of %zu bytes, expected %zu",
                                  bytes, sizeof s);
    memcpy(&s, buf, sizeof s);
    if (s.magic != STATE_MAGIC || s.version != STATE_VERSION || s.steps < 0)
        return o->host->api->fail(o->host, VH_STATUS_ERR_FORMAT, "not an abi20_optim state");
    o->steps = s.steps;
    return VH_STATUS_OK;
}

static const struct {
    vh_optim_vtable vtable;
    uintptr_t poison[8]; /* abi20_poison.h */
} shipped = {{
    .struct_size = sizeof(vh_optim_vtable),
    .create = optim_create,
    .destroy = optim_destroy,
    .state_slots = optim_state_slots,
    .step = optim_step,
    .state_size = optim_state_size,
    .state_save = optim_state_save,
    .state_load = optim_state_load,
}, ABI20_POISON};

VH_PLUGIN_DEFINE(VH_ROLE_OPTIM, "abi20_optim", "0.1.0",
                 "test plugin: plain SGD with optional momentum and weight decay", schema,
                 shipped.vtable);
