/* fp32.c - the precision role's full-precision policy: every tensor in f32.
 *
 * Parameters, activations, gradients, the wire and the masters are all f32,
 * so there is no loss scaling: loss_scale() is 1 and unscale_and_check
 * divides nothing. It still guards the optimizer: with check_finite (the
 * default) it scans this rank's gradients for Inf/NaN and agrees with the
 * other ranks through one all-reduce (MAX) of a flag, so every rank skips the
 * same steps and the replicas stay identical. The flag lives in the device's
 * memory, as every buffer a collective sees (NCCL wants device pointers).
 *
 * The state is a small fixed blob (magic, version) holding nothing else: it
 * lets a checkpoint written by another precision plugin be refused by name
 * instead of being misread.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_config.h"
#include "vithost/vh_device.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

/* Gradients of a non-CPU device are scanned through a host buffer of this
 * many floats. */
#define STAGING_FLOATS ((size_t)1 << 16)

typedef struct fp32 {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    int check_finite;
    float *flag;     /* one f32 in device memory: the all-reduced overflow flag */
    float *staging;  /* host memory, STAGING_FLOATS; non-CPU devices only */
    int64_t updates; /* update() calls */
    int64_t skipped; /* of which with found_inf */
} fp32;

static const vh_config_key schema[] = {
    {"check_finite", VH_CONFIG_TYPE_BOOL, "true",
     "scan the grads for Inf/NaN each step and skip the step on every rank when any has one",
     NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static void fp32_destroy(void *self);

static vh_status fp32_create(vh_host *host, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    int check_finite = 1;
    vh_status st = host->api->config_bool(host, "check_finite", &check_finite);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the bool key 'check_finite'");
    const vh_device_ops *dev = host->api->device(host);
    if (!dev) return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "the host gave no device");
    vh_comm *comm = host->api->comm(host);
    if (check_finite) {
        if (!comm || !comm->ops || !comm->ops->all_reduce)
            return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                                   "the host gave no communicator with all_reduce");
        if (!dev->alloc || !dev->free || !dev->copy)
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "device %s lacks alloc, free or copy, which the overflow "
                                   "check needs",
                                   dev->name ? dev->name : "?");
    }

    fp32 *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->host = host;
    p->dev = dev;
    p->comm = comm;
    p->check_finite = check_finite != 0;
    if (p->check_finite) {
        void *flag = NULL;
        st = dev->alloc(dev->device, sizeof(float), &flag);
        p->flag = flag;
        if (st != VH_STATUS_OK || !flag) {
            fp32_destroy(p);
            return host->api->fail(host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                   "allocating the overflow flag on %s failed",
                                   dev->name ? dev->name : "the device");
        }
        if (dev->kind != VH_DEVICE_KIND_CPU) {
            p->staging = host->api->alloc(host, STAGING_FLOATS * sizeof(float));
            if (!p->staging) {
                fp32_destroy(p);
                return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                                       "out of memory for the gradient scan buffer");
            }
        }
    }
    *self = p;
    return VH_STATUS_OK;
}

static void fp32_destroy(void *self) {
    fp32 *p = self;
    if (!p) return;
    if (p->flag) p->dev->free(p->dev->device, p->flag);
    p->host->api->free(p->host, p->staging);
    p->host->api->free(p->host, p);
}

static vh_status fp32_policy(void *self, vh_precision_policy *out) {
    if (!self || !out) return VH_STATUS_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->param_dtype = VH_DTYPE_F32;
    out->compute_dtype = VH_DTYPE_F32;
    out->grad_dtype = VH_DTYPE_F32;
    out->comm_dtype = VH_DTYPE_F32;
    out->master_dtype = VH_DTYPE_F32;
    return VH_STATUS_OK;
}

static float fp32_loss_scale(void *self) {
    (void)self;
    return 1.0f; /* f32 gradients do not underflow where training cares */
}

/* 1 when all n values are finite. x * 0 is 0 for a finite x and NaN for Inf
 * or NaN, so the sums stay 0 exactly when everything is finite; eight
 * independent sums let the compiler vectorise, and blocks stop early. */
static int all_finite(const float *x, size_t n) {
    enum { BLOCK = 4096 };
    size_t i = 0;
    while (i < n) {
        size_t end = n - i > BLOCK ? i + BLOCK : n;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (; i + 8 <= end; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += x[i + (size_t)k] * 0.0f;
        for (; i < end; i++) acc[0] += x[i] * 0.0f;
        float sum = 0.0f;
        for (int k = 0; k < 8; k++) sum += acc[k];
        if (sum != 0.0f) return 0; /* NaN compares unequal to everything */
    }
    return 1;
}

/* 1 when every element of this rank's grads is finite; on a non-CPU device
 * the grads pass through the host staging buffer. *ok is set either way. */
static vh_status local_grads_finite(fp32 *p, const vh_param_slices *grads, int *ok) {
    vh_host *host = p->host;
    const vh_device_ops *dev = p->dev;
    *ok = 1;
    for (int32_t s = 0; s < grads->count && *ok; s++) {
        const vh_param_slice *sl = vh_param_slices_at(grads, s);
        if (sl->count < 0 || (sl->count > 0 && !sl->grad))
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d (unit %d, param %d) has %s", (int)s, (int)sl->unit,
                                   (int)sl->param, sl->count < 0 ? "a negative count" : "no grad");
        size_t n = (size_t)sl->count;
        if (dev->kind == VH_DEVICE_KIND_CPU) {
            *ok = all_finite(sl->grad, n);
            continue;
        }
        for (size_t at = 0; at < n && *ok; at += STAGING_FLOATS) {
            size_t m = n - at < STAGING_FLOATS ? n - at : STAGING_FLOATS;
            vh_status st = dev->copy(dev->device, p->staging, sl->grad + at, m * sizeof(float),
                                     VH_COPY_KIND_DEVICE_TO_HOST);
            if (st != VH_STATUS_OK)
                return host->api->fail(host, st, "copying grads of slice %d from %s failed",
                                       (int)s, dev->name ? dev->name : "the device");
            *ok = all_finite(p->staging, m);
        }
    }
    return VH_STATUS_OK;
}

static vh_status fp32_unscale_and_check(void *self, const vh_param_slices *grads,
                                        int *found_inf) {
    fp32 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    if (!grads || !found_inf || grads->count < 0 || (grads->count > 0 && !grads->items))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "unscale_and_check: NULL argument or malformed slice list");
    if (grads->count > 0 && grads->item_size < sizeof(vh_param_slice))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "unscale_and_check: slices of %u bytes, at least %zu expected",
                               (unsigned)grads->item_size, sizeof(vh_param_slice));
    *found_inf = 0;
    /* The scale is 1: nothing to divide. Without the check no rank calls the
     * all-reduce below, so the collectives still match across ranks. */
    if (!p->check_finite) return VH_STATUS_OK;

    int ok = 1;
    vh_status st = local_grads_finite(p, grads, &ok);
    if (st != VH_STATUS_OK) return st;

    /* Every rank takes part, whatever it found: one MAX over the flags. */
    const vh_device_ops *dev = p->dev;
    float flag = ok ? 0.0f : 1.0f;
    st = dev->copy(dev->device, p->flag, &flag, sizeof flag, VH_COPY_KIND_HOST_TO_DEVICE);
    if (st == VH_STATUS_OK)
        st = p->comm->ops->all_reduce(p->comm, p->flag, 1, VH_DTYPE_F32, VH_REDUCE_OP_MAX);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "all-reduce of the overflow flag over %d ranks failed",
                               (int)p->comm->world_size);
    st = dev->copy(dev->device, &flag, p->flag, sizeof flag, VH_COPY_KIND_DEVICE_TO_HOST);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "copying the overflow flag from %s failed",
                               dev->name ? dev->name : "the device");
    *found_inf = !(flag == 0.0f);
    return VH_STATUS_OK;
}

static vh_status fp32_update(void *self, int found_inf) {
    fp32 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    p->updates++;
    if (!found_inf) return VH_STATUS_OK;
    /* No scale to back off: say once why steps are being skipped. */
    if (p->skipped++ == 0)
        p->host->api->log(p->host, VH_LOG_LEVEL_WARN,
                          "Inf/NaN in the gradients at update %lld: the step is skipped on "
                          "every rank; fp32 has no loss scale to lower, so if this repeats "
                          "lower the learning rate or clip the gradients",
                          (long long)p->updates);
    return VH_STATUS_OK;
}

/* ---- state: a tag, so that foreign checkpoints are refused -------------- */

#define STATE_MAGIC 0x33465056u /* "VPF3" little-endian: vithost precision fp32 */
#define STATE_VERSION 1u

typedef struct fp32_state {
    uint32_t magic, version;
    uint32_t reserved[2]; /* zero; room for later versions */
} fp32_state;

static vh_status fp32_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = sizeof(fp32_state);
    return VH_STATUS_OK;
}

static vh_status fp32_state_save(void *self, void *buf, size_t bytes) {
    fp32 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    if (!buf || bytes < sizeof(fp32_state))
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "state buffer of %zu bytes, %zu needed", buf ? bytes : 0,
                                  sizeof(fp32_state));
    fp32_state s;
    memset(&s, 0, sizeof s);
    s.magic = STATE_MAGIC;
    s.version = STATE_VERSION;
    memcpy(buf, &s, sizeof s);
    return VH_STATUS_OK;
}

static vh_status fp32_state_load(void *self, const void *buf, size_t bytes) {
    fp32 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    if (!buf && bytes > 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "state_load: NULL buffer");
    uint32_t magic = 0;
    if (bytes >= sizeof magic) memcpy(&magic, buf, sizeof magic);
    if (bytes < sizeof magic || magic != STATE_MAGIC)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the checkpoint's precision state (%zu bytes, tag 0x%08x) was not "
                               "written by fp32 (tag 0x%08x): it belongs to another precision "
                               "plugin; resume with that plugin",
                               bytes, (unsigned)magic, (unsigned)STATE_MAGIC);
    fp32_state s;
    if (bytes != sizeof s)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the fp32 precision state is %zu bytes, %zu expected: the "
                               "checkpoint is damaged",
                               bytes, sizeof s);
    memcpy(&s, buf, sizeof s);
    if (s.version != STATE_VERSION)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "fp32 precision state version %u, this fp32 reads version %u%s",
                               (unsigned)s.version, (unsigned)STATE_VERSION,
                               s.version > STATE_VERSION ? " (written by a newer fp32)" : "");
    return VH_STATUS_OK; /* nothing to restore: fp32 has no scale */
}

static const vh_precision_vtable vtable = {
    .struct_size = sizeof(vh_precision_vtable),
    .create = fp32_create,
    .destroy = fp32_destroy,
    .policy = fp32_policy,
    .loss_scale = fp32_loss_scale,
    .unscale_and_check = fp32_unscale_and_check,
    .update = fp32_update,
    .state_size = fp32_state_size,
    .state_save = fp32_state_save,
    .state_load = fp32_state_load,
};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "fp32", "0.1.0",
                 "fp32 everywhere: no loss scaling, steps with Inf/NaN grads skipped", schema,
                 vtable);
