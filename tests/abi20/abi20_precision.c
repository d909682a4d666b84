/* abi20_precision.c - the precision role's test plugin: fp32 everywhere and a
 * fixed loss scale.
 *
 * ABI 2.0, frozen: tests/plugins/test_precision.c as it shipped with ABI 2.0,
 * built against tests/abi20/include (the 2.0 headers, their sizes) and
 * declaring minor 0. It stands for a plugin compiled once against 2.0 that
 * every 2.x host must still load, train and resume (tests/test_abi20.c).
 * Never port it to newer headers. Its vtable is followed by words that are
 * no pointers (abi20_poison.h), so a host that reads past it fails at once.
 *
 * The host multiplies the loss gradient by loss_scale(); unscale_and_check
 * divides every local grad back and agrees on overflow across ranks with an
 * all-reduce (MAX) of a float flag. The scale never changes: update() only
 * counts, so a test sees every call.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

#include "abi20_poison.h"

typedef struct abi20_precision {
    vh_host *host;
    float scale;
    int64_t updates;   /* calls of update() */
    int64_t overflows; /* of which found_inf */
} abi20_precision;

static const vh_config_key schema[] = {
    {"loss_scale", VH_CONFIG_TYPE_FLOAT, "1.0", "fixed factor of the loss gradient", NULL, 1e-8,
     1e8, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status precision_create(vh_host *host, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    double scale;
    vh_status st = host->api->config_float(host, "loss_scale", &scale);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the float key 'loss_scale'");
    if (!(scale >= 1e-8 && scale <= 1e8))
        return host->api->config_fail(host, "loss_scale", "%g is outside [1e-8, 1e8]", scale);

    abi20_precision *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->host = host;
    p->scale = (float)scale;
    *self = p;
    return VH_STATUS_OK;
}

static void precision_destroy(void *self) {
    abi20_precision *p = self;
    if (!p) return;
    p->host->api->free(p->host, p);
}

static vh_status precision_policy(void *self, vh_precision_policy *out) {
    abi20_precision *p = self;
    if (!p || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (out->struct_size < sizeof out->struct_size)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "policy: out->struct_size is %u; the caller sets it",
                                  (unsigned)out->struct_size);
    /* The caller's struct may be of an older minor: fill what it covers. */
    vh_precision_policy full;
    memset(&full, 0, sizeof full);
    full.param_dtype = VH_DTYPE_F32;
    full.compute_dtype = VH_DTYPE_F32;
    full.grad_dtype = VH_DTYPE_F32;
    full.comm_dtype = VH_DTYPE_F32;
    full.master_dtype = VH_DTYPE_F32;
    full.state_dtype = VH_DTYPE_F32;
    full.fp32_param_flags = 0;
    full.master_weights = 1;
    size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
    memcpy((char *)out + sizeof out->struct_size, (const char *)&full + sizeof full.struct_size,
           n - sizeof out->struct_size);
    return VH_STATUS_OK;
}

static float precision_loss_scale(void *self) {
    const abi20_precision *p = self;
    return p ? p->scale : 1.0f;
}

static vh_status precision_unscale_and_check(void *self, const vh_param_slices *grads,
                                             int *found_inf) {
    abi20_precision *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    if (!grads || !found_inf || (grads->count > 0 && !grads->items))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unscale_and_check: NULL argument");

    int bad = 0;
    for (int32_t s = 0; s < grads->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(grads, s);
        if (sl->count > 0 && !sl->grad)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "slice %d has no grad",
                                   (int)s);
        if (sl->count > 0 && sl->grad_dtype != VH_DTYPE_F32)
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "slice %d (unit %d, param %d) has %s grads; abi20_precision "
                                   "unscales f32 only",
                                   (int)s, (int)sl->unit, (int)sl->param,
                                   vh_dtype_name(sl->grad_dtype));
        float *grad = sl->grad;
        for (int64_t i = 0; i < sl->count; i++) {
            float g = grad[i] / p->scale;
            grad[i] = g;
            if (!isfinite(g)) bad = 1;
        }
    }

    vh_comm *comm = host->api->comm(host);
    if (!comm || !comm->ops || !comm->ops->all_reduce_start || !comm->ops->wait)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "the host gave no communicator");
    float flag = bad ? 1.0f : 0.0f;
    vh_status st = vh_comm_all_reduce(comm, &flag, 1, VH_DTYPE_F32, VH_REDUCE_OP_MAX);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "all-reduce of the overflow flag failed");
    *found_inf = flag > 0.0f;
    return VH_STATUS_OK;
}

static vh_status precision_update(void *self, int found_inf) {
    abi20_precision *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    p->updates++;
    if (found_inf) p->overflows++;
    return VH_STATUS_OK;
}

/* ---- state: the scale -------------------------------------------------- */

#define STATE_MAGIC 0x54505354u /* "TSPT" */
#define STATE_VERSION 1u

typedef struct precision_state {
    uint32_t magic, version;
    float scale;
    uint32_t reserved;
} precision_state;

static vh_status precision_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = sizeof(precision_state);
    return VH_STATUS_OK;
}

static vh_status precision_state_save(void *self, void *buf, size_t bytes) {
    abi20_precision *p = self;
    if (!p || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < sizeof(precision_state))
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "state buffer of %zu bytes, %zu needed", bytes,
                                  sizeof(precision_state));
    precision_state s;
    memset(&s, 0, sizeof s);
    s.magic = STATE_MAGIC;
    s.version = STATE_VERSION;
    s.scale = p->scale;
    memcpy(buf, &s, sizeof s);
    return VH_STATUS_OK;
}

static vh_status precision_state_load(void *self, const void *buf, size_t bytes) {
    abi20_precision *p = self;
    if (!p || !buf) return VH_STATUS_ERR_INVALID_ARG;
    precision_state s;
    if (bytes != sizeof s)
        return p->host->api->fail(p->host, VH_STATUS_ERR_FORMAT, "state of %zu bytes, expected %zu",
                                  bytes, sizeof s);
    memcpy(&s, buf, sizeof s);
    if (s.magic != STATE_MAGIC || s.version != STATE_VERSION)
        return p->host->api->fail(p->host, VH_STATUS_ERR_FORMAT,
                                  "not an abi20_precision state (version %u)", (unsigned)s.version);
    if (!(isfinite(s.scale) && s.scale > 0.0f))
        return p->host->api->fail(p->host, VH_STATUS_ERR_FORMAT, "saved loss scale %g is invalid",
                                  (double)s.scale);
    p->scale = s.scale;
    return VH_STATUS_OK;
}

static const struct {
    vh_precision_vtable vtable;
    uintptr_t poison[8]; /* abi20_poison.h */
} shipped = {{
    .struct_size = sizeof(vh_precision_vtable),
    .create = precision_create,
    .destroy = precision_destroy,
    .policy = precision_policy,
    .loss_scale = precision_loss_scale,
    .unscale_and_check = precision_unscale_and_check,
    .update = precision_update,
    .state_size = precision_state_size,
    .state_save = precision_state_save,
    .state_load = precision_state_load,
}, ABI20_POISON};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "abi20_precision", "0.1.0",
                 "test plugin: fp32 everywhere with a fixed loss scale", schema,
                 shipped.vtable);
