/* fp32.c - the precision role's full-precision policy: every tensor in f32.
 *
 * Parameters, activations, gradients, the wire, the masters and the
 * optimizer state are all f32, so there is no loss scaling: loss_scale() is
 * 1 and unscale_and_check divides nothing. It still guards the optimizer:
 * with check_finite (the default) it scans this rank's gradients for Inf/NaN
 * through the SDK's vh_grad_check (the device's multi_tensor_scale_check: one
 * pass over every slice; at
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
#include "vithost/vh_loss_scaler.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

#include "../common/precision_io.h"

typedef struct fp32 {
    vh_host *host;
    int check_finite;
    vh_grad_check *check; /* the SDK's one-pass overflow check (NULL without check_finite) */
    double sum_sq;   /* of the last check, on the host */
    int has_sum_sq;  /* 1 after a check that computed it */
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
    fp32 *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->host = host;
    p->check_finite = check_finite != 0;
    if (p->check_finite) {
        /* It refuses a device or communicator that lacks what it needs. */
        st = vh_grad_check_create(host, &p->check);
        if (st != VH_STATUS_OK) {
            fp32_destroy(p);
            return st;
        }
    }
    *self = p;
    return VH_STATUS_OK;
}

static void fp32_destroy(void *self) {
    fp32 *p = self;
    if (!p) return;
    vh_grad_check_free(p->check);
    p->host->api->free(p->host, p);
}

static vh_status fp32_policy(void *self, vh_precision_policy *out) {
    fp32 *p = self;
    if (!p || !out) return VH_STATUS_ERR_INVALID_ARG;
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
    full.unit_loss_scale = 1;  /* loss_scale() is always 1 */
    return precision_policy_out(p->host, out, &full);
}

static float fp32_loss_scale(void *self) {
    (void)self;
    return 1.0f; /* f32 gradients do not underflow where training cares */
}

static vh_status fp32_unscale_and_check(void *self, const vh_param_slices *grads,
                                        int *found_inf) {
    fp32 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    char why[160];
    if (!found_inf || vh_param_slices_check(grads, why, sizeof why) != VH_STATUS_OK)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unscale_and_check: %s",
                               found_inf ? why : "found_inf is NULL");
    *found_inf = 0;
    p->has_sum_sq = 0;
    /* The scale is 1: nothing to divide. Without the check no rank calls the
     * all-reduce below, so the collectives still match across ranks. */
    if (!p->check_finite) return VH_STATUS_OK;

    /* One pass at scale 1 (nothing is multiplied): the Inf/NaN flag agreed
     * over ranks, and the sum of squares (summed over shards, local for
     * replicas) for the optimizer's clipping. */
    double sum_sq = 0.0;
    vh_status st = vh_grad_check_run(p->check, grads, 1.0f, found_inf, &sum_sq);
    if (st != VH_STATUS_OK) return st;
    p->sum_sq = sum_sq;
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
                          "every rank; fp32 has no loss scale to lower, so the gradients hold "
                          "a real Inf/NaN (a diverging loss, a bad input or damaged weights)",
                          (long long)p->updates);
    return VH_STATUS_OK;
}

/* ---- state: a tag, so that foreign checkpoints are refused --------------
 * The header alone (precision_io.h), its word and reserved zero: room for
 * later versions. */

#define STATE_MAGIC 0x33465056u /* "VPF3" little-endian: vithost precision fp32 */
#define STATE_VERSION 1u

static vh_status fp32_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = sizeof(precision_state_header);
    return VH_STATUS_OK;
}

static vh_status fp32_state_save(void *self, void *buf, size_t bytes) {
    fp32 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    const precision_state_header h = {STATE_MAGIC, STATE_VERSION, 0, 0};
    return precision_state_save_header(p->host, buf, bytes, sizeof h, &h);
}

static vh_status fp32_state_load(void *self, const void *buf, size_t bytes) {
    fp32 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    if (!buf && bytes > 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "state_load: NULL buffer");
    precision_state_header h;
    /* Nothing to restore past the header: fp32 has no scale. */
    return precision_state_load_header(host, "fp32", STATE_MAGIC, STATE_VERSION, buf, bytes,
                                       sizeof h, &h);
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
