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
 *     probabilities backward keeps are rounded to D where the model keeps
 *     them so, as vit does for bf16: autocast's softmax output), the
 *     layer-norm statistics
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
 *
 * This file is the policy (its keys, dtypes and lines); the scaler, the
 * check, the state and the vtable calls are the loss-scaled core that fp16
 * shares (../common/scaled_core.h).
 */
#include <stdint.h>
#include <string.h>

#include "../common/scaled_core.h"
#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

#define STATE_MAGIC 0x4d415056u /* "VPAM" little-endian: vithost precision amp */

static const vh_config_key schema[] = {
    {"dtype", VH_CONFIG_TYPE_ENUM, "bf16",
     "compute dtype of the parameters' copies, the activations and the gradients", "bf16|fp16",
     0, 0, 0},
    {"layernorm_fp32", VH_CONFIG_TYPE_BOOL, "true",
     "keep layer-norm weights and their gradients in fp32 (autocast's layer_norm)", NULL,
     0, 0, 0},
    SCALED_CORE_SCHEMA_KEYS("dtype of the gradients on the wire: auto (fp32 for fp16, bf16 for "
                            "bf16), fp32, or the compute dtype",
                            "auto|fp32|bf16|fp16", "dynamic for fp16, none for bf16"),
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* "fp32" / "bf16" / "fp16" as the schema spells them. */
static vh_dtype dtype_of(const char *name) {
    if (strcmp(name, "bf16") == 0) return VH_DTYPE_BF16;
    if (strcmp(name, "fp16") == 0) return VH_DTYPE_F16;
    return VH_DTYPE_F32;
}
static const char *key_name(vh_dtype t) {
    return t == VH_DTYPE_BF16 ? "bf16" : t == VH_DTYPE_F16 ? "fp16" : "fp32";
}

/* D everywhere but the f32 masters, the optimizer state and (with
 * layernorm_fp32) the layer norms; the wire as reduce_dtype says. */
static void set_policy(vh_precision_policy *p, vh_dtype dtype, vh_dtype reduce,
                       int layernorm_fp32) {
    p->param_dtype = dtype;
    p->compute_dtype = dtype;
    p->grad_dtype = dtype;
    p->comm_dtype = reduce;
    p->master_dtype = VH_DTYPE_F32;
    p->state_dtype = VH_DTYPE_F32;
    p->fp32_param_flags = layernorm_fp32 ? VH_PARAM_FLAG_NORM : 0;
    p->master_weights = 1;
}

static vh_status amp_configure(vh_host *host, scaled_config *out) {
    const char *dtype_name, *reduce_name, *mode;
    int layernorm_fp32 = 1;
    vh_status st;
    if ((st = scaled_core_string(host, "dtype", &dtype_name)) != VH_STATUS_OK ||
        (st = scaled_core_wire_keys(host, &reduce_name, &mode)) != VH_STATUS_OK ||
        (st = scaled_core_bool(host, "layernorm_fp32", &layernorm_fp32)) != VH_STATUS_OK)
        return st;
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
    set_policy(&out->policy, dtype, reduce, layernorm_fp32 != 0);
    out->state_word = (uint32_t)dtype;
    out->mode = mode;
    return VH_STATUS_OK;
}

static void amp_describe(vh_host *host, const scaled_config *c, double scale) {
    const char *dtype_name = key_name((vh_dtype)c->policy.param_dtype);
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "amp %s: f32 masters and optimizer state, %s on the wire, layer norms in %s, "
                   "loss scaling %s (scale %g)",
                   dtype_name, key_name((vh_dtype)c->policy.comm_dtype),
                   c->policy.fp32_param_flags ? "fp32" : dtype_name, c->mode, scale);
}

/* The masters are f32 either way: another dtype resumes, said once. */
static void amp_resumed(vh_host *host, const scaled_config *c, uint32_t saved_dtype) {
    if (saved_dtype == c->state_word) return;
    host->api->log(host, VH_LOG_LEVEL_WARN,
                   "the checkpoint was trained with amp %s; this run continues in %s",
                   vh_dtype_size((vh_dtype)saved_dtype) ? key_name((vh_dtype)saved_dtype) : "?",
                   key_name((vh_dtype)c->policy.param_dtype));
}

static const scaled_spec spec = {
    .name = "amp", .state_magic = STATE_MAGIC, .default_note = "the default for fp16",
    .configure = amp_configure, .describe = amp_describe, .resumed = amp_resumed,
};
SCALED_CORE_DEFINE_VTABLE(vtable, spec);

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "amp", "0.1.0",
                 "mixed precision: bf16 or fp16 compute, fp32 masters, dynamic loss scaling",
                 schema, vtable);
