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
 * are amp's: the loss-scaled core both share (../common/scaled_core.h, on
 * the SDK's vh_loss_scaler and vh_grad_check); this file is the policy.
 * loss_scaling auto is dynamic here, as f16 needs it. The state's policy
 * word is master_weights.
 */
#include <stdint.h>
#include <string.h>

#include "../common/scaled_core.h"
#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

#define STATE_MAGIC 0x48465056u /* "VPFH" little-endian: vithost precision fp16 */

static const vh_config_key schema[] = {
    {"master_weights", VH_CONFIG_TYPE_BOOL, "false",
     "keep f32 master weights for the optimizer; false updates the f16 parameters themselves "
     "(f32 math, rounded to nearest even)",
     NULL, 0, 0, 0},
    SCALED_CORE_SCHEMA_KEYS("dtype of the gradients on the wire: auto (fp16), fp16 or fp32",
                            "auto|fp32|fp16", "dynamic"),
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status fp16_configure(vh_host *host, scaled_config *out) {
    const char *reduce_name, *mode;
    int master_weights = 0;
    vh_status st = scaled_core_wire_keys(host, &reduce_name, &mode);
    if (st == VH_STATUS_OK) st = scaled_core_bool(host, "master_weights", &master_weights);
    if (st != VH_STATUS_OK) return st;
    master_weights = master_weights != 0;
    vh_precision_policy *p = &out->policy;
    p->param_dtype = VH_DTYPE_F16;
    p->compute_dtype = VH_DTYPE_F16;
    p->grad_dtype = VH_DTYPE_F16;
    p->comm_dtype = strcmp(reduce_name, "fp32") == 0 ? VH_DTYPE_F32 : VH_DTYPE_F16;
    p->master_dtype = master_weights ? VH_DTYPE_F32 : VH_DTYPE_F16;
    p->state_dtype = VH_DTYPE_F32;
    p->fp32_param_flags = 0; /* full FP16: layer norms too */
    p->master_weights = master_weights;
    out->state_word = (uint32_t)master_weights;
    out->mode = strcmp(mode, "auto") == 0 ? "dynamic" : mode;
    return VH_STATUS_OK;
}

static void fp16_describe(vh_host *host, const scaled_config *c, double scale) {
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "full fp16: %s, f32 optimizer state, %s on the wire, loss scaling %s "
                   "(scale %g)",
                   c->policy.master_weights ? "f32 masters" : "f16 weights updated in place",
                   c->policy.comm_dtype == VH_DTYPE_F32 ? "fp32" : "fp16", c->mode, scale);
}

/* The checkpoint holds f32 values either way (store_unit). */
static void fp16_resumed(vh_host *host, const scaled_config *c, uint32_t saved_masters) {
    if ((saved_masters != 0) == (c->state_word != 0)) return;
    host->api->log(host, VH_LOG_LEVEL_WARN,
                   "the checkpoint was trained %s f32 master weights; this run continues %s "
                   "them",
                   saved_masters ? "with" : "without", c->state_word ? "with" : "without");
}

static const scaled_spec spec = {
    .name = "fp16", .state_magic = STATE_MAGIC, .default_note = "the default",
    .configure = fp16_configure, .describe = fp16_describe, .resumed = fp16_resumed,
};
SCALED_CORE_DEFINE_VTABLE(vtable, spec);

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "fp16", "0.1.0",
                 "full FP16: f16 weights, activations, gradients and wire, f32 optimizer state, "
                 "dynamic loss scaling",
                 schema, vtable);
