/* fp16.c - the precision role's full FP16: parameters, activations,
 * gradients and the wire in f16, optimizer state in f32, dynamic loss
 * scaling.
 *
 *     precision: {plugin: fp16}                        # f16 weights updated in place
 *     precision: {plugin: fp16, master_weights: true}  # with f32 masters
 *
 * The policy:
 *
 *   param_dtype    f16   every parameter, layer norms included
 *                        (fp32_param_flags 0: nothing is kept apart)
 *   compute_dtype  f16   the activations
 *   grad_dtype     f16   the parameter gradients as backward writes them
 *   comm_dtype     reduce_dtype (auto: f16; fp32 converts before the
 *                        all-reduce)
 *   master_dtype   f16 without master weights (the default): the optimizer
 *                        updates the f16 parameters themselves, loading each
 *                        to f32, doing the update's math in f32 and storing
 *                        it rounded to nearest even; f32 with
 *                        master_weights: true, and the sharding plugin
 *                        refreshes the f16 copies from them
 *   state_dtype    f32   the optimizer state
 *
 * What stays fp32 (every device op computes in fp32 whatever it stores,
 * vh_device.h): the GEMMs' accumulation, the attention logits and softmax,
 * the layer-norm statistics, the loss, the sums of squares and the overflow
 * check, the gradients the optimizer reads (the sharding plugin converts
 * the reduced f16 gradients to f32), the optimizer's arithmetic and state,
 * and the masters when kept. Everything stored between ops is f16 and
 * rounded once per op, to nearest even.
 *
 * What it costs: without masters an update smaller than half an f16 ulp of
 * its weight (2^-11 relative) is lost, so late, small learning rates stop
 * moving the weights; with masters it is AMP with f16 layer norms and an
 * f16 wire. The study's "full FP16" row measures that trade.
 *
 * Loss scaling, the overflow check, the skipped-step line and the state
 * are as in amp (the SDK's vh_loss_scaler and vh_grad_check): loss_scaling
 * auto is dynamic here, as f16 needs it.
 */
#include <stdint.h>
#include <string.h>

#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_loss_scaler.h"

#include "../common/scaled_grads.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

typedef struct fp16 {
    vh_host *host;
    vh_dtype reduce;    /* the wire: f16 or f32 */
    int master_weights;
    scaled_grads sg;  /* the scaler, the overflow check, the last sum of squares */
} fp16;

static const vh_config_key schema[] = {
    {"master_weights", VH_CONFIG_TYPE_BOOL, "false",
     "keep f32 master weights for the optimizer; false updates the f16 parameters themselves "
     "(f32 math, rounded to nearest even)",
     NULL, 0, 0, 0},
    {"reduce_dtype", VH_CONFIG_TYPE_ENUM, "auto",
     "dtype of the gradients on the wire: auto (fp16), fp16 or fp32", "auto|fp32|fp16", 0, 0,
     0},
    {"loss_scaling", VH_CONFIG_TYPE_ENUM, "auto",
     "auto (dynamic), dynamic (back off on overflow, grow after growth_interval good steps), "
     "static (init_scale, fixed), none (scale 1)",
     "auto|dynamic|static|none", 0, 0, 0},
    {"init_scale", VH_CONFIG_TYPE_FLOAT, "65536", "dynamic, static: the first loss scale", NULL,
     1.2e-38, 3.4e38, 0},
    {"growth_factor", VH_CONFIG_TYPE_FLOAT, "2", "dynamic: the scale's factor at each growth",
     NULL, 1, 1e6, 0},
    {"backoff_factor", VH_CONFIG_TYPE_FLOAT, "0.5",
     "dynamic: the scale's factor on an overflow, in (0, 1)", NULL, 0, 1, 0},
    {"growth_interval", VH_CONFIG_TYPE_INT, "2000",
     "dynamic: steps in a row without overflow before the scale grows", NULL, 1, 1e15, 0},
    {"min_scale", VH_CONFIG_TYPE_FLOAT, "1",
     "dynamic: the scale never backs off below this; an overflow at it is a real Inf/NaN", NULL,
     1.2e-38, 3.4e38, 0},
    {"max_scale", VH_CONFIG_TYPE_FLOAT, "16777216", "dynamic: the scale never grows above this",
     NULL, 1.2e-38, 3.4e38, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static void fp16_destroy(void *self);

static vh_status get_string(vh_host *host, const char *key, const char **out) {
    vh_status st = host->api->config_string(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read the key '%s'", key);
}
/* The scaler's keys; mode "none" is a fixed scale of 1. Keys the mode does
 * not read are allowed but said. */
static vh_status fp16_create(vh_host *host, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    const char *reduce_name, *mode;
    int master_weights = 0;
    vh_status st;
    if ((st = get_string(host, "reduce_dtype", &reduce_name)) != VH_STATUS_OK ||
        (st = get_string(host, "loss_scaling", &mode)) != VH_STATUS_OK)
        return st;
    if ((st = host->api->config_bool(host, "master_weights", &master_weights)) != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the bool key 'master_weights'");
    if (strcmp(mode, "auto") == 0) mode = "dynamic";

    fp16 *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->host = host;
    p->reduce = strcmp(reduce_name, "fp32") == 0 ? VH_DTYPE_F32 : VH_DTYPE_F16;
    p->master_weights = master_weights != 0;
    st = scaled_grads_init(&p->sg, host, mode);
    if (st != VH_STATUS_OK) {
        fp16_destroy(p);
        return st;
    }
    if (strcmp(mode, "none") == 0)
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "fp16 without loss scaling: gradients below 2^-24 become zero "
                       "(loss_scaling: dynamic is the default)");
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "full fp16: %s, f32 optimizer state, %s on the wire, loss scaling %s "
                   "(scale %g)",
                   p->master_weights ? "f32 masters" : "f16 weights updated in place",
                   p->reduce == VH_DTYPE_F32 ? "fp32" : "fp16", mode, (double)p->sg.scaler.scale);
    *self = p;
    return VH_STATUS_OK;
}

static void fp16_destroy(void *self) {
    fp16 *p = self;
    if (!p) return;
    scaled_grads_free(&p->sg);
    p->host->api->free(p->host, p);
}

static vh_status fp16_policy(void *self, vh_precision_policy *out) {
    fp16 *p = self;
    if (!p || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (out->struct_size < sizeof out->struct_size)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "policy: out->struct_size is %u; the caller sets it",
                                  (unsigned)out->struct_size);
    vh_precision_policy full;
    memset(&full, 0, sizeof full);
    full.param_dtype = VH_DTYPE_F16;
    full.compute_dtype = VH_DTYPE_F16;
    full.grad_dtype = VH_DTYPE_F16;
    full.comm_dtype = p->reduce;
    full.master_dtype = p->master_weights ? VH_DTYPE_F32 : VH_DTYPE_F16;
    full.state_dtype = VH_DTYPE_F32;
    full.fp32_param_flags = 0; /* full FP16: layer norms too */
    full.master_weights = p->master_weights;
    /* The caller's struct may be of an older minor: fill only what it covers,
     * and leave its struct_size as the caller set it. */
    size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
    memcpy((char *)out + sizeof out->struct_size, (const char *)&full + sizeof full.struct_size,
           n - sizeof out->struct_size);
    return VH_STATUS_OK;
}

static float fp16_loss_scale(void *self) {
    const fp16 *p = self;
    return p ? vh_loss_scaler_scale(&p->sg.scaler) : 1.0f;
}

static vh_status fp16_unscale_and_check(void *self, const vh_param_slices *grads,
                                        int *found_inf) {
    fp16 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    return scaled_grads_unscale_and_check(&p->sg, grads, found_inf);
}

static vh_status fp16_grad_sum_sq(void *self, double *out, int *has) {
    fp16 *p = self;
    if (!p || !out || !has) return VH_STATUS_ERR_INVALID_ARG;
    scaled_grads_sum_sq(&p->sg, out, has);
    return VH_STATUS_OK;
}

static vh_status fp16_update(void *self, int found_inf) {
    fp16 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    scaled_grads_update(&p->sg, found_inf);
    return VH_STATUS_OK;
}

/* ---- state: master_weights and the scaler ------------------------------------ */

#define STATE_MAGIC 0x48465056u /* "VPFH" little-endian: vithost precision fp16 */
#define STATE_VERSION 1u

typedef struct fp16_header {
    uint32_t magic, version;
    uint32_t master_weights; /* of the run that wrote it */
    uint32_t reserved;       /* zero */
} fp16_header;

#define STATE_BYTES (sizeof(fp16_header) + VH_LOSS_SCALER_STATE_BYTES)

static vh_status fp16_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = STATE_BYTES;
    return VH_STATUS_OK;
}

static vh_status fp16_state_save(void *self, void *buf, size_t bytes) {
    fp16 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    if (!buf || bytes < STATE_BYTES)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "state buffer of %zu bytes, %zu needed", buf ? bytes : 0,
                                  (size_t)STATE_BYTES);
    fp16_header h;
    memset(&h, 0, sizeof h);
    h.magic = STATE_MAGIC;
    h.version = STATE_VERSION;
    h.master_weights = (uint32_t)p->master_weights;
    memcpy(buf, &h, sizeof h);
    return vh_loss_scaler_state_save(&p->sg.scaler, (char *)buf + sizeof h, bytes - sizeof h,
                                     p->host);
}

static vh_status fp16_state_load(void *self, const void *buf, size_t bytes) {
    fp16 *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    uint32_t magic = 0;
    if (buf && bytes >= sizeof magic) memcpy(&magic, buf, sizeof magic);
    if (!buf || bytes < sizeof magic || magic != STATE_MAGIC)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the checkpoint's precision state (%zu bytes, tag 0x%08x) was not "
                               "written by fp16 (tag 0x%08x): it belongs to another precision "
                               "plugin; resume with that plugin",
                               buf ? bytes : 0, (unsigned)magic, (unsigned)STATE_MAGIC);
    fp16_header h;
    if (bytes != STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the fp16 precision state is %zu bytes, %zu expected: the "
                               "checkpoint is damaged",
                               bytes, (size_t)STATE_BYTES);
    memcpy(&h, buf, sizeof h);
    if (h.version != STATE_VERSION)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "fp16 precision state version %u, this fp16 reads version %u%s",
                               (unsigned)h.version, (unsigned)STATE_VERSION,
                               h.version > STATE_VERSION ? " (written by a newer fp16)" : "");
    vh_status st =
        vh_loss_scaler_state_load(&p->sg.scaler, (const char *)buf + sizeof h, bytes - sizeof h, host);
    if (st != VH_STATUS_OK) return st;
    /* The checkpoint holds f32 values either way (store_unit). */
    if ((h.master_weights != 0) != (p->master_weights != 0))
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "the checkpoint was trained %s f32 master weights; this run continues %s "
                       "them",
                       h.master_weights ? "with" : "without",
                       p->master_weights ? "with" : "without");
    return VH_STATUS_OK;
}

static const vh_precision_vtable vtable = {
    .struct_size = sizeof(vh_precision_vtable),
    .create = fp16_create,
    .destroy = fp16_destroy,
    .policy = fp16_policy,
    .loss_scale = fp16_loss_scale,
    .unscale_and_check = fp16_unscale_and_check,
    .update = fp16_update,
    .state_size = fp16_state_size,
    .state_save = fp16_state_save,
    .state_load = fp16_state_load,
    .grad_sum_sq = fp16_grad_sum_sq,
};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "fp16", "0.1.0",
                 "full FP16: f16 weights, activations, gradients and wire, f32 optimizer state, "
                 "dynamic loss scaling",
                 schema, vtable);
