/* fp32.c - the precision role's full-precision policy: every tensor in f32.
 *
 * Parameters, activations, gradients, the wire, the masters and the
 * optimizer state are all f32, so there is no loss scaling: loss_scale() is
 * 1 and unscale_and_check divides nothing. It still guards the optimizer:
 * with check_finite (the default) it scans this rank's gradients for Inf/NaN
 * with the device's multi_tensor_scale_check (one pass over every slice; at
 * scale 1 the op only checks) and agrees with the other ranks through one
 * all-reduce (MAX) of the flag, so every rank skips the same steps and the
 * replicas stay identical. The same pass sums the squares of the gradients
 * (grad_sum_sq: summed over ranks when the slices are shards, local when
 * they are replicas), so an optimizer that clips needs no pass of its own.
 * Flag and sum live in the device's memory, as every buffer a collective
 * sees (NCCL wants device pointers); only those two floats come back to the
 * host.
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

typedef struct fp32 {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    int check_finite;
    /* Two f32 in device memory: [0] found_inf (then all-reduced, MAX), [1]
     * the sum of squares of the grads (then summed over shards). */
    float *flag;
    double sum_sq;   /* of the last check, on the host */
    int has_sum_sq;  /* 1 after a check that computed it */
    /* The multi-tensor list of the last check, host memory, `cap` entries;
     * grown when a longer slice list comes (the sharding plugin keeps one). */
    void **tensors;
    int64_t *numels;
    vh_dtype *dtypes;
    int32_t cap;
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

static const char *dev_name(const vh_device_ops *dev) {
    return dev && dev->name ? dev->name : "the device";
}

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
        if (!comm || !comm->ops || !comm->ops->all_reduce_start || !comm->ops->wait)
            return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                                   "the host gave no communicator with all_reduce_start and wait");
        /* An older device table may end before the multi-tensor op. */
        if (!dev->alloc || !dev->free || !dev->copy || !dev->memset_zero ||
            !VH_STRUCT_HAS(dev, vh_device_ops, multi_tensor_scale_check) ||
            !dev->multi_tensor_scale_check)
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "device %s lacks alloc, free, copy, memset_zero or "
                                   "multi_tensor_scale_check, which the overflow check needs "
                                   "(or set precision.check_finite: false)",
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
        st = dev->alloc(dev->device, 2 * sizeof(float), &flag);
        p->flag = flag;
        if (st != VH_STATUS_OK || !flag) {
            fp32_destroy(p);
            return host->api->fail(host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                   "allocating the overflow flag on %s failed", dev_name(dev));
        }
    }
    *self = p;
    return VH_STATUS_OK;
}

static void fp32_destroy(void *self) {
    fp32 *p = self;
    if (!p) return;
    if (p->flag) p->dev->free(p->dev->device, p->flag);
    p->host->api->free(p->host, p->tensors);
    p->host->api->free(p->host, p->numels);
    p->host->api->free(p->host, p->dtypes);
    p->host->api->free(p->host, p);
}

static vh_status fp32_policy(void *self, vh_precision_policy *out) {
    fp32 *p = self;
    if (!p || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (out->struct_size < sizeof out->struct_size)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "policy: out->struct_size is %u; the caller sets it",
                                  (unsigned)out->struct_size);
    vh_precision_policy full;
    memset(&full, 0, sizeof full);
    full.param_dtype = VH_DTYPE_F32;
    full.compute_dtype = VH_DTYPE_F32;
    full.grad_dtype = VH_DTYPE_F32;
    full.comm_dtype = VH_DTYPE_F32;
    full.master_dtype = VH_DTYPE_F32;
    full.state_dtype = VH_DTYPE_F32;
    full.fp32_param_flags = 0; /* nothing to keep apart: everything is f32 */
    full.master_weights = 1;   /* the sharding plugin may alias them to the params */
    /* The caller's struct may be of an older minor: fill only what it covers,
     * and leave its struct_size as the caller set it. */
    size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
    memcpy((char *)out + sizeof out->struct_size, (const char *)&full + sizeof full.struct_size,
           n - sizeof out->struct_size);
    return VH_STATUS_OK;
}

static float fp32_loss_scale(void *self) {
    (void)self;
    return 1.0f; /* f32 gradients do not underflow where training cares */
}

/* Makes the multi-tensor list hold at least n entries. */
static vh_status reserve_list(fp32 *p, int32_t n) {
    if (n <= p->cap) return VH_STATUS_OK;
    vh_host *host = p->host;
    void **t = host->api->alloc(host, (size_t)n * sizeof *t);
    int64_t *c = host->api->alloc(host, (size_t)n * sizeof *c);
    vh_dtype *d = host->api->alloc(host, (size_t)n * sizeof *d);
    if (!t || !c || !d) {
        host->api->free(host, t);
        host->api->free(host, c);
        host->api->free(host, d);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for a list of %d grads",
                               (int)n);
    }
    host->api->free(host, p->tensors);
    host->api->free(host, p->numels);
    host->api->free(host, p->dtypes);
    p->tensors = t;
    p->numels = c;
    p->dtypes = d;
    p->cap = n;
    return VH_STATUS_OK;
}

/* Sets the device flag to 1 when any element of this rank's grads is Inf or
 * NaN and the sum after it to their sum of squares: one multi-tensor pass
 * at scale 1 (nothing is multiplied). */
static vh_status scan_local_grads(fp32 *p, const vh_param_slices *grads) {
    vh_host *host = p->host;
    const vh_device_ops *dev = p->dev;
    vh_status st = reserve_list(p, grads->count);
    if (st != VH_STATUS_OK) return st;
    int32_t n = 0;
    for (int32_t s = 0; s < grads->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(grads, s);
        if (sl->count < 0 || (sl->count > 0 && !sl->grad))
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d (unit %d, param %d) has %s", (int)s, (int)sl->unit,
                                   (int)sl->param, sl->count < 0 ? "a negative count" : "no grad");
        if (sl->count == 0) continue;
        if (!vh_dtype_is_float(sl->grad_dtype))
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "slice %d (unit %d, param %d) has %s grads; the overflow check "
                                   "reads f32, bf16 or f16",
                                   (int)s, (int)sl->unit, (int)sl->param,
                                   vh_dtype_name(sl->grad_dtype));
        p->tensors[n] = sl->grad;
        p->numels[n] = sl->count;
        p->dtypes[n] = sl->grad_dtype;
        n++;
    }
    st = dev->memset_zero(dev->device, p->flag, 2 * sizeof(float), NULL);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "zeroing the overflow flag on %s failed", dev_name(dev));
    if (n == 0) return VH_STATUS_OK;
    vh_multi_tensor_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.count = n;
    a.tensors = p->tensors;
    a.numels = p->numels;
    a.dtypes = p->dtypes;
    a.scale = 1.0f; /* fp32's loss scale: the op only checks */
    a.found_inf = p->flag;
    a.sum_sq = p->flag + 1;
    st = dev->multi_tensor_scale_check(dev->device, &a);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "checking %d grad tensors for Inf/NaN on %s failed",
                               (int)n, dev_name(dev));
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
    p->has_sum_sq = 0;
    /* The scale is 1: nothing to divide. Without the check no rank calls the
     * all-reduce below, so the collectives still match across ranks. */
    if (!p->check_finite) return VH_STATUS_OK;

    vh_status st = scan_local_grads(p, grads);
    if (st != VH_STATUS_OK) return st;

    /* Every rank takes part, whatever it found: one MAX over the flags, on
     * the device; then the one float comes back. */
    const vh_device_ops *dev = p->dev;
    st = vh_comm_all_reduce(p->comm, p->flag, 1, VH_DTYPE_F32, VH_REDUCE_OP_MAX);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "all-reduce of the overflow flag over %d ranks failed",
                               (int)p->comm->world_size);
    /* Shards hold every element once over all ranks: their sums add up.
     * Replicas (DDP) hold the same sum on every rank already. The choice is
     * the sharding plugin's, the same on every rank, so the collectives
     * still match. */
    if (!grads->replicated && p->comm->world_size > 1) {
        st = vh_comm_all_reduce(p->comm, p->flag + 1, 1, VH_DTYPE_F32, VH_REDUCE_OP_SUM);
        if (st != VH_STATUS_OK)
            return host->api->fail(host, st,
                                   "all-reduce of the gradients' sum of squares over %d ranks "
                                   "failed",
                                   (int)p->comm->world_size);
    }
    float back[2] = {0.0f, 0.0f};
    st = dev->copy(dev->device, back, p->flag, sizeof back, VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "copying the overflow flag from %s failed",
                               dev_name(dev));
    *found_inf = !(back[0] == 0.0f);
    p->sum_sq = (double)back[1];
    p->has_sum_sq = 1;
    return VH_STATUS_OK;
}

/* The sum of squares of the last check's pass (f32, summed in fp32 by the
 * device op); none when check_finite is off. */
static vh_status fp32_grad_sum_sq(void *self, double *out, int *has) {
    fp32 *p = self;
    if (!p || !out || !has) return VH_STATUS_ERR_INVALID_ARG;
    *has = p->has_sum_sq;
    *out = p->has_sum_sq ? p->sum_sq : 0.0;
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
    .grad_sum_sq = fp32_grad_sum_sq,
};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "fp32", "0.1.0",
                 "fp32 everywhere: no loss scaling, steps with Inf/NaN grads skipped", schema,
                 vtable);
