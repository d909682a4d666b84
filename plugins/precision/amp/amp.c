/* amp.c - the precision role's automatic mixed precision: fp32 master
 * weights, bf16 or fp16 compute, dynamic loss scaling for fp16.
 *
 *     precision: {plugin: amp, dtype: bf16}    # or fp16
 *
 * The policy (what each buffer holds), for dtype D (bf16 or f16):
 *
 *   param_dtype    D     the compute copies the model reads; the sharding
 *                        plugin refreshes them from the masters after every
 *                        update (one conversion, round to nearest even)
 *   compute_dtype  D     the activations
 *   grad_dtype     D     the parameter gradients as backward writes them
 *   comm_dtype     reduce_dtype (auto: f32 for fp16, bf16 for bf16)
 *   master_dtype   f32   the values the optimizer updates (master_weights 1)
 *   state_dtype    f32   the optimizer state
 *   fp32_param_flags VH_PARAM_FLAG_NORM with layernorm_fp32 (the default):
 *                  layer-norm weights and biases keep f32 compute copies
 *                  and f32 gradients (as PyTorch's autocast, which runs
 *                  layer_norm in fp32 on fp32 weights); without it they
 *                  are rounded to D like every other parameter.
 *
 * Where a value is rounded to D, and what stays fp32. Every device op
 * computes in fp32 whatever its storage dtype (vh_device.h); the policy
 * decides which results are STORED in D:
 *   - rounded to D: each activation an op writes (GEMM outputs after their
 *     fp32 accumulation and epilogue, GELU, residual adds, the attention
 *     output, layer-norm outputs, the pooled features, the logits), the
 *     gradients of those activations in backward (the loss gradient
 *     included, already multiplied by the loss scale), the compute copies
 *     of the parameters (from the f32 masters, once per update) and the
 *     parameter gradients (each GEMM's weight gradient and each bias
 *     gradient is summed in fp32 over the batch and rounded once);
 *   - fp32 throughout: the attention logits and their softmax (the
 *     probabilities backward keeps are f32), the layer-norm statistics
 *     (mean, rstd) and normalisation, with layernorm_fp32 the layer norm's
 *     weights and their gradients, the loss and its per-row
 *     softmax, the sums of squares and the overflow check, the gradient
 *     reduction when reduce_dtype is fp32 (the sharding plugin converts
 *     the D gradients to f32 before the all-reduce; with reduce_dtype D it
 *     reduces in D and converts after), the gradients the optimizer reads
 *     (the sharding plugin hands them over in f32: vh_param_slice), the
 *     f32 masters and the optimizer state, and the loss scale itself.
 *
 * Loss scaling (the SDK's vh_loss_scaler: PyTorch GradScaler's rule).
 * loss_scaling auto means dynamic for fp16 (f16's 2^-24 smallest subnormal
 * would flush small gradients to zero) and none for bf16 (bf16 has f32's
 * exponent range: scaling gains nothing). dynamic starts at init_scale,
 * halves (backoff_factor) on every step whose gradients hold an Inf or NaN
 * and doubles (growth_factor) after growth_interval steps in a row without
 * one, within [min_scale, max_scale]; static keeps init_scale; none is a
 * fixed scale of 1. With any of them a step with Inf/NaN gradients is
 * skipped on every rank and said in one line.
 *
 * unscale_and_check is one multi-tensor pass over this rank's gradients
 * (the SDK's vh_grad_check): multiply by 1/scale (the reciprocal in double,
 * rounded to float), set found-inf on Inf/NaN, sum the squares of the
 * unscaled gradients; then found-inf is agreed across ranks (all-reduce,
 * MAX) and the sum is summed over shards, so an optimizer that clips needs
 * no pass of its own (grad_sum_sq). The gradients it scans are the slices'
 * (f32 under ddp: after the conversion, so an f16 overflow shows as an f32
 * Inf).
 *
 * reduce_dtype: fp32, or the compute dtype itself; the other 16-bit format
 * is refused (bf16 gradients on an f16 wire would overflow where bf16 did
 * not; f16 gradients on a bf16 wire would lose 3 bits of mantissa, both for
 * nothing). auto picks fp32 for fp16 (the torchtitan default: a sum of
 * scaled f16 gradients over ranks may overflow where each did not) and bf16
 * for bf16, which ddp reduces in bf16 and then converts to f32.
 *
 * State: the dtype and the scaler's blob (scale, good-step counter, skipped
 * and total updates), so a resumed run continues bit for bit; a blob of
 * another precision plugin is refused by name.
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

typedef struct amp {
    vh_host *host;
    vh_dtype dtype;       /* bf16 or f16 */
    vh_dtype reduce;      /* the wire */
    int layernorm_fp32;
    scaled_grads sg;  /* the scaler, the overflow check, the last sum of squares */
} amp;

static const vh_config_key schema[] = {
    {"dtype", VH_CONFIG_TYPE_ENUM, "bf16",
     "compute dtype of the parameters' copies, the activations and the gradients", "bf16|fp16",
     0, 0, 0},
    {"layernorm_fp32", VH_CONFIG_TYPE_BOOL, "true",
     "keep layer-norm weights and their gradients in fp32 (autocast's layer_norm)", NULL,
     0, 0, 0},
    {"reduce_dtype", VH_CONFIG_TYPE_ENUM, "auto",
     "dtype of the gradients on the wire: auto (fp32 for fp16, bf16 for bf16), fp32, or the "
     "compute dtype",
     "auto|fp32|bf16|fp16", 0, 0, 0},
    {"loss_scaling", VH_CONFIG_TYPE_ENUM, "auto",
     "auto (dynamic for fp16, none for bf16), dynamic (back off on overflow, grow after "
     "growth_interval good steps), static (init_scale, fixed), none (scale 1)",
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

static void amp_destroy(void *self);

static vh_status get_string(vh_host *host, const char *key, const char **out) {
    vh_status st = host->api->config_string(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read the key '%s'", key);
}
/* "fp32" / "bf16" / "fp16" as the schema spells them. */
static vh_dtype dtype_of(const char *name) {
    if (strcmp(name, "bf16") == 0) return VH_DTYPE_BF16;
    if (strcmp(name, "fp16") == 0) return VH_DTYPE_F16;
    return VH_DTYPE_F32;
}
static const char *key_name(vh_dtype t) {
    return t == VH_DTYPE_BF16 ? "bf16" : t == VH_DTYPE_F16 ? "fp16" : "fp32";
}

static vh_status amp_create(vh_host *host, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    const char *dtype_name, *reduce_name, *mode;
    int layernorm_fp32 = 1;
    vh_status st;
    if ((st = get_string(host, "dtype", &dtype_name)) != VH_STATUS_OK ||
        (st = get_string(host, "reduce_dtype", &reduce_name)) != VH_STATUS_OK ||
        (st = get_string(host, "loss_scaling", &mode)) != VH_STATUS_OK)
        return st;
    if ((st = host->api->config_bool(host, "layernorm_fp32", &layernorm_fp32)) != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the bool key 'layernorm_fp32'");
    vh_dtype dtype = dtype_of(dtype_name);
    if (dtype == VH_DTYPE_F32)
        return host->api->config_fail(host, "dtype", "'%s' is not bf16 or fp16", dtype_name);
    int fp16 = dtype == VH_DTYPE_F16;

    vh_dtype reduce = strcmp(reduce_name, "auto") == 0 ? (fp16 ? VH_DTYPE_F32 : VH_DTYPE_BF16)
                                                        : dtype_of(reduce_name);
    if (reduce != VH_DTYPE_F32 && reduce != dtype)
        return host->api->config_fail(host, "reduce_dtype",
                                      "%s gradients are reduced in fp32 or in %s; a %s wire "
                                      "would %s",
                                      dtype_name, dtype_name, reduce_name,
                                      fp16 ? "drop 3 bits of each gradient's mantissa"
                                           : "overflow where bf16 did not");
    if (strcmp(mode, "auto") == 0) mode = fp16 ? "dynamic" : "none";

    amp *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->host = host;
    p->dtype = dtype;
    p->reduce = reduce;
    p->layernorm_fp32 = layernorm_fp32 != 0;
    st = scaled_grads_init(&p->sg, host, mode);
    if (st != VH_STATUS_OK) {
        amp_destroy(p);
        return st;
    }
    if (fp16 && strcmp(mode, "none") == 0)
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "fp16 without loss scaling: gradients below 2^-24 become zero "
                       "(loss_scaling: dynamic is the default for fp16)");
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "amp %s: f32 masters and optimizer state, %s on the wire, layer norms in %s, "
                   "loss scaling %s (scale %g)",
                   dtype_name, key_name(reduce), p->layernorm_fp32 ? "fp32" : dtype_name, mode,
                   (double)p->sg.scaler.scale);
    *self = p;
    return VH_STATUS_OK;
}

static void amp_destroy(void *self) {
    amp *p = self;
    if (!p) return;
    scaled_grads_free(&p->sg);
    p->host->api->free(p->host, p);
}

static vh_status amp_policy(void *self, vh_precision_policy *out) {
    amp *p = self;
    if (!p || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (out->struct_size < sizeof out->struct_size)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "policy: out->struct_size is %u; the caller sets it",
                                  (unsigned)out->struct_size);
    vh_precision_policy full;
    memset(&full, 0, sizeof full);
    full.param_dtype = p->dtype;
    full.compute_dtype = p->dtype;
    full.grad_dtype = p->dtype;
    full.comm_dtype = p->reduce;
    full.master_dtype = VH_DTYPE_F32;
    full.state_dtype = VH_DTYPE_F32;
    full.fp32_param_flags = p->layernorm_fp32 ? VH_PARAM_FLAG_NORM : 0;
    full.master_weights = 1;
    /* The caller's struct may be of an older minor: fill only what it covers,
     * and leave its struct_size as the caller set it. */
    size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
    memcpy((char *)out + sizeof out->struct_size, (const char *)&full + sizeof full.struct_size,
           n - sizeof out->struct_size);
    return VH_STATUS_OK;
}

static float amp_loss_scale(void *self) {
    const amp *p = self;
    return p ? vh_loss_scaler_scale(&p->sg.scaler) : 1.0f;
}

static vh_status amp_unscale_and_check(void *self, const vh_param_slices *grads,
                                       int *found_inf) {
    amp *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    return scaled_grads_unscale_and_check(&p->sg, grads, found_inf);
}

static vh_status amp_grad_sum_sq(void *self, double *out, int *has) {
    amp *p = self;
    if (!p || !out || !has) return VH_STATUS_ERR_INVALID_ARG;
    scaled_grads_sum_sq(&p->sg, out, has);
    return VH_STATUS_OK;
}

static vh_status amp_update(void *self, int found_inf) {
    amp *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    scaled_grads_update(&p->sg, found_inf);
    return VH_STATUS_OK;
}

/* ---- state: the dtype and the scaler ---------------------------------------- */

#define STATE_MAGIC 0x4d415056u /* "VPAM" little-endian: vithost precision amp */
#define STATE_VERSION 1u

typedef struct amp_header {
    uint32_t magic, version;
    uint32_t dtype;    /* vh_dtype of the run that wrote it */
    uint32_t reserved; /* zero */
} amp_header;

#define STATE_BYTES (sizeof(amp_header) + VH_LOSS_SCALER_STATE_BYTES)

static vh_status amp_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = STATE_BYTES;
    return VH_STATUS_OK;
}

static vh_status amp_state_save(void *self, void *buf, size_t bytes) {
    amp *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    if (!buf || bytes < STATE_BYTES)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "state buffer of %zu bytes, %zu needed", buf ? bytes : 0,
                                  (size_t)STATE_BYTES);
    amp_header h;
    memset(&h, 0, sizeof h);
    h.magic = STATE_MAGIC;
    h.version = STATE_VERSION;
    h.dtype = (uint32_t)p->dtype;
    memcpy(buf, &h, sizeof h);
    return vh_loss_scaler_state_save(&p->sg.scaler, (char *)buf + sizeof h,
                                     bytes - sizeof h, p->host);
}

static vh_status amp_state_load(void *self, const void *buf, size_t bytes) {
    amp *p = self;
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    uint32_t magic = 0;
    if (buf && bytes >= sizeof magic) memcpy(&magic, buf, sizeof magic);
    if (!buf || bytes < sizeof magic || magic != STATE_MAGIC)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the checkpoint's precision state (%zu bytes, tag 0x%08x) was not "
                               "written by amp (tag 0x%08x): it belongs to another precision "
                               "plugin; resume with that plugin",
                               buf ? bytes : 0, (unsigned)magic, (unsigned)STATE_MAGIC);
    amp_header h;
    if (bytes != STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the amp precision state is %zu bytes, %zu expected: the "
                               "checkpoint is damaged",
                               bytes, (size_t)STATE_BYTES);
    memcpy(&h, buf, sizeof h);
    if (h.version != STATE_VERSION)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "amp precision state version %u, this amp reads version %u%s",
                               (unsigned)h.version, (unsigned)STATE_VERSION,
                               h.version > STATE_VERSION ? " (written by a newer amp)" : "");
    vh_status st =
        vh_loss_scaler_state_load(&p->sg.scaler, (const char *)buf + sizeof h, bytes - sizeof h, host);
    if (st != VH_STATUS_OK) return st;
    /* The masters are f32 either way: another dtype resumes, said once. */
    if (h.dtype != (uint32_t)p->dtype)
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "the checkpoint was trained with amp %s; this run continues in %s",
                       vh_dtype_size((vh_dtype)h.dtype) ? key_name((vh_dtype)h.dtype) : "?",
                       key_name(p->dtype));
    return VH_STATUS_OK;
}

static const vh_precision_vtable vtable = {
    .struct_size = sizeof(vh_precision_vtable),
    .create = amp_create,
    .destroy = amp_destroy,
    .policy = amp_policy,
    .loss_scale = amp_loss_scale,
    .unscale_and_check = amp_unscale_and_check,
    .update = amp_update,
    .state_size = amp_state_size,
    .state_save = amp_state_save,
    .state_load = amp_state_load,
    .grad_sum_sq = amp_grad_sum_sq,
};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "amp", "0.1.0",
                 "mixed precision: bf16 or fp16 compute, fp32 masters, dynamic loss scaling",
                 schema, vtable);
