/* mta.c - the mta optimizer plugin: schema, configuration, scalar state.
 *
 * Multi-tensor-apply AdamW, SGD (momentum, Nesterov) and LAMB over the
 * slices the sharding plugin hands in, with global-norm gradient clipping.
 * The rate, weight decay and clipping limit are the SDK's shared keys
 * (vh_optim_schedule.h): the host reads them and hands each update its
 * numbers, so this schema holds the algorithm's keys only. The update
 * itself is in step.c, its element-wise kernels in algos.c.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda_step.h"
#include "freeze.h"
#include "layer_decay.h"
#include "mta.h"
#include "vithost/vh_config.h"
#include "vithost/vh_optim.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

static const vh_config_key schema[] = {
    {"algo", VH_CONFIG_TYPE_ENUM, "adamw",
     "update rule: adamw (torch.optim.AdamW), sgd (torch.optim.SGD), lamb (apex FusedLAMB)",
     "adamw|sgd|lamb", 0, 0, 0},
    {"beta1", VH_CONFIG_TYPE_FLOAT, "0.9", "adamw, lamb: first-moment decay, in [0, 1)", NULL,
     0, 1, 0},
    {"beta2", VH_CONFIG_TYPE_FLOAT, "0.999", "adamw, lamb: second-moment decay, in [0, 1)",
     NULL, 0, 1, 0},
    {"eps", VH_CONFIG_TYPE_FLOAT, "1e-8",
     "adamw, lamb: added to sqrt of the bias-corrected second moment, > 0", NULL, 0, 1, 0},
    {"momentum", VH_CONFIG_TYPE_FLOAT, "0.9",
     "sgd: momentum in [0, 1), dampening 0; 0 keeps no state", NULL, 0, 1, 0},
    {"nesterov", VH_CONFIG_TYPE_BOOL, "false", "sgd: Nesterov momentum (needs momentum > 0)",
     NULL, 0, 0, 0},
    {"always_adapt", VH_CONFIG_TYPE_BOOL, "false",
     "lamb: trust ratio on tensors without weight decay too (NVLAMB); off as apex and timm",
     NULL, 0, 0, 0},
    {"layer_decay", VH_CONFIG_TYPE_FLOAT, "1.0",
     "layer-wise rate decay in (0, 1] (timm/BEiT): parameter of layer id i of L layers gets "
     "lr * layer_decay^(L-1-i), layers read from timm ViT names (stem, blocks.<i>, head); 1: off",
     NULL, 0, 1, 0},
    {"freeze", VH_CONFIG_TYPE_STRING, NULL,
     "parameters never updated (no step, no weight decay, out of the clipping norm), comma-"
     "separated: unit names (embed, blocks.3, head), timm parameter names or dotted prefixes "
     "(patch_embed, blocks.0.attn), or globs (blocks.[0-5]); unset: none",
     NULL, 0, 0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

const char *mta_algo_name(mta_algo algo) {
    switch (algo) {
    case MTA_ALGO_ADAMW: return "adamw";
    case MTA_ALGO_SGD: return "sgd";
    case MTA_ALGO_LAMB: return "lamb";
    }
    return "?";
}

static int parse_algo(const char *name, mta_algo *out) {
    static const mta_algo all[] = {MTA_ALGO_ADAMW, MTA_ALGO_SGD, MTA_ALGO_LAMB};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (name && strcmp(name, mta_algo_name(all[i])) == 0) return *out = all[i], 1;
    return 0;
}

/* ---- configuration ------------------------------------------------------ */

/* Getters fail only on a schema bug; the host has checked types and ranges. */
static vh_status get_float(vh_host *host, const char *key, double *out) {
    vh_status st = host->api->config_float(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read float key '%s'", key);
}
static vh_status get_bool(vh_host *host, const char *key, int *out) {
    vh_status st = host->api->config_bool(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read bool key '%s'", key);
}
static vh_status get_string(vh_host *host, const char *key, const char **out) {
    vh_status st = host->api->config_string(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read key '%s'", key);
}

static vh_status read_config(vh_host *host, mta_config *c) {
    const char *algo;
    vh_status st;
    if ((st = get_string(host, "algo", &algo)) != VH_STATUS_OK ||
        (st = get_float(host, "beta1", &c->beta1)) != VH_STATUS_OK ||
        (st = get_float(host, "beta2", &c->beta2)) != VH_STATUS_OK ||
        (st = get_float(host, "eps", &c->eps)) != VH_STATUS_OK ||
        (st = get_float(host, "momentum", &c->momentum)) != VH_STATUS_OK ||
        (st = get_bool(host, "nesterov", &c->nesterov)) != VH_STATUS_OK ||
        (st = get_bool(host, "always_adapt", &c->always_adapt)) != VH_STATUS_OK ||
        (st = get_float(host, "layer_decay", &c->layer_decay)) != VH_STATUS_OK)
        return st;
    c->freeze = NULL;
    if (host->api->config_has(host, "freeze") &&
        (st = get_string(host, "freeze", &c->freeze)) != VH_STATUS_OK)
        return st;
    if (!parse_algo(algo, &c->algo))
        return host->api->config_fail(host, "algo", "unknown algorithm '%s'", algo);
    return VH_STATUS_OK;
}

/* What the schema's inclusive ranges cannot say. */
static vh_status check_config(vh_host *host, const mta_config *c) {
    if (!(c->beta1 < 1.0))
        return host->api->config_fail(host, "beta1", "%g is outside [0, 1)", c->beta1);
    if (!(c->beta2 < 1.0))
        return host->api->config_fail(host, "beta2", "%g is outside [0, 1)", c->beta2);
    if (!(c->eps > 0.0))
        return host->api->config_fail(host, "eps", "must be > 0 (it keeps 0 / sqrt(0) away)");
    if (!(c->layer_decay > 0.0))
        return host->api->config_fail(host, "layer_decay",
                                      "must be in (0, 1]: 0 would freeze every layer but the top "
                                      "(1 turns it off)");
    if (!(c->momentum < 1.0))
        return host->api->config_fail(host, "momentum", "%g is outside [0, 1)", c->momentum);
    if (c->algo == MTA_ALGO_SGD && c->nesterov && c->momentum == 0.0)
        return host->api->config_fail(host, "nesterov",
                                      "Nesterov momentum needs momentum > 0 (momentum is 0)");
    return VH_STATUS_OK;
}

static int set_in_recipe(vh_host *host, const char *key) {
    vh_config_origin o;
    return host->api->config_origin(host, key, &o) == VH_STATUS_OK &&
           o.source != VH_CONFIG_SOURCE_DEFAULT;
}

/* Keys the chosen algo does not read are allowed (swapping one line must
 * not break a recipe) but said; the shared keys are the host's to check. */
static void warn_unused(vh_host *host, const mta_config *c) {
    static const struct {
        const char *key;
        unsigned algos; /* bit per mta_algo that reads it */
    } by_algo[] = {
        {"beta1", 1u << MTA_ALGO_ADAMW | 1u << MTA_ALGO_LAMB},
        {"beta2", 1u << MTA_ALGO_ADAMW | 1u << MTA_ALGO_LAMB},
        {"eps", 1u << MTA_ALGO_ADAMW | 1u << MTA_ALGO_LAMB},
        {"momentum", 1u << MTA_ALGO_SGD},
        {"nesterov", 1u << MTA_ALGO_SGD},
        {"always_adapt", 1u << MTA_ALGO_LAMB},
    };
    for (size_t i = 0; i < sizeof by_algo / sizeof by_algo[0]; i++)
        if (!(by_algo[i].algos & (1u << c->algo)) && set_in_recipe(host, by_algo[i].key))
            host->api->log(host, VH_LOG_LEVEL_WARN, "%s is ignored by algo %s", by_algo[i].key,
                           mta_algo_name(c->algo));
    /* weight_decay is a shared key: read here only for this hint (a host
     * that does not merge the shared keys has none, and says nothing). */
    double wd = -1.0;
    if (host->api->config_has(host, "weight_decay") &&
        host->api->config_float(host, "weight_decay", &wd) != VH_STATUS_OK)
        wd = -1.0;
    if (c->algo == MTA_ALGO_LAMB && wd == 0.0 && !c->always_adapt)
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "lamb with weight_decay 0 adapts no tensor (it is Adam); set "
                       "always_adapt for trust ratios without decay");
}

static int32_t slots_of(const mta_config *c) {
    switch (c->algo) {
    case MTA_ALGO_ADAMW:
    case MTA_ALGO_LAMB: return 2;
    case MTA_ALGO_SGD: return c->momentum > 0.0 ? 1 : 0;
    }
    return 0;
}

static int is_float(int32_t t) {
    return t == VH_DTYPE_F32 || t == VH_DTYPE_F16 || t == VH_DTYPE_BF16;
}

/* The policy's dtypes against what the kernels take (step.c checks each
 * slice again): refused here, at create, rather than at the first step. No
 * policy (a caller without one): the slices alone decide. */
static vh_status check_policy(vh_host *host, const vh_precision_policy *policy, int32_t slots) {
    vh_precision_policy p;
    memset(&p, 0, sizeof p);
    if (!vh_struct_upgrade(&p, sizeof p, policy)) return VH_STATUS_OK;
    const char *what = NULL;
    int32_t dtype = VH_DTYPE_F32;
    if (!is_float(p.master_dtype))
        what = "master values", dtype = p.master_dtype;
    else if (!is_float(p.grad_dtype))
        what = "gradients", dtype = p.grad_dtype;
    else if (slots > 0 && p.state_dtype != VH_DTYPE_F32)
        what = "optimizer state", dtype = p.state_dtype;
    if (!what) return VH_STATUS_OK;
    return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                           "the precision policy keeps the %s in %s; mta updates masters and "
                           "gradients in f32, f16 or bf16 and keeps its state in f32 (a policy "
                           "with state_dtype f32)",
                           what, vh_dtype_name((vh_dtype)dtype));
}

/* The per-parameter index scale_first of layer decay and freeze (key names
 * the feature): needs the table, and the CPU (the device kernels take one
 * rate and every tensor). */
static vh_status setup_param_index(mta *o, const char *key, const char *off) {
    vh_host *host = o->host;
    if (!o->table)
        return host->api->config_fail(host, key,
                                      "needs the model's parameter table, which this host did "
                                      "not give the optimizer; %s",
                                      off);
    if (o->cuda)
        return host->api->config_fail(host, key,
                                      "is not implemented on a CUDA device yet (the device "
                                      "kernels take one rate); %s",
                                      off);
    if (o->scale_first) return VH_STATUS_OK;
    o->scale_first = host->api->alloc(host, (size_t)(o->table->num_units + 1) *
                                                sizeof *o->scale_first);
    if (!o->scale_first)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "no memory for %s", key);
    o->scale_units = o->table->num_units;
    int64_t first = 0;
    for (int32_t u = 0; u < o->table->num_units; u++)
        o->scale_first[u] = first, first += o->table->units[u].num_params;
    return VH_STATUS_OK;
}

/* The frozen parameters of `freeze` (freeze.h), said in the log; a pattern
 * that matches nothing is refused with the model's units. */
static vh_status setup_freeze(mta *o) {
    vh_host *host = o->host;
    if (!o->cfg.freeze) return VH_STATUS_OK;
    vh_status st = setup_param_index(o, "freeze", "remove freeze");
    if (st != VH_STATUS_OK) return st;
    const int64_t n = mta_table_params(o->table);
    if (!(o->frozen = host->api->alloc(host, (size_t)(n ? n : 1))))
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "no memory for freeze");
    char why[1024];
    const int64_t count = mta_freeze_mask(o->table, o->cfg.freeze, o->frozen, why, sizeof why);
    if (count < 0) return host->api->config_fail(host, "freeze", "%s", why);
    int64_t values = 0, all = 0, i = 0;
    for (int32_t u = 0; u < o->table->num_units; u++)
        for (int32_t p = 0; p < o->table->units[u].num_params; p++, i++) {
            all += o->table->units[u].params[p].numel;
            if (o->frozen[i]) values += o->table->units[u].params[p].numel;
        }
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "freeze '%s': %lld of %lld parameter tensors frozen (%lld of %lld values)",
                   o->cfg.freeze, (long long)count, (long long)n, (long long)values,
                   (long long)all);
    return VH_STATUS_OK;
}

/* Layer decay's per-parameter scales from the table's names (layer_decay.h);
 * nothing when it is off. Names that do not follow timm's ViT convention,
 * a caller without a table, or a CUDA device are refused here, at create. */
static vh_status setup_layer_decay(mta *o) {
    vh_host *host = o->host;
    if (o->cfg.layer_decay == 1.0) return VH_STATUS_OK;
    vh_status st = setup_param_index(o, "layer_decay", "set layer_decay: 1");
    if (st != VH_STATUS_OK) return st;
    const int64_t n = mta_table_params(o->table);
    o->lr_scale = host->api->alloc(host, (size_t)(n ? n : 1) * sizeof *o->lr_scale);
    if (!o->lr_scale)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "no memory for layer decay");
    char why[320];
    if (mta_layer_scales(o->table, o->cfg.layer_decay, o->lr_scale, why, sizeof why) != 0)
        return host->api->config_fail(host, "layer_decay", "%s", why);
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "layer decay %g: rate scales from %.4g (%s) to %.4g (%s)",
                   o->cfg.layer_decay, o->lr_scale[0], o->table->units[0].params[0].name,
                   o->lr_scale[n - 1],
                   o->table->units[o->table->num_units - 1]
                       .params[o->table->units[o->table->num_units - 1].num_params - 1]
                       .name);
    return VH_STATUS_OK;
}

/* ---- vtable --------------------------------------------------------------- */

static void mta_destroy(void *self);

static vh_status mta_create(vh_host *host, const vh_optim_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    /* A setup of an older minor lacks the newer members: they read as zero,
     * their default. */
    vh_optim_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "optim setup missing");
    setup = &setup_v;
    if (setup->total_steps < 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "total_steps %lld is negative",
                               (long long)setup->total_steps);
    mta_config cfg;
    memset(&cfg, 0, sizeof cfg);
    vh_status st = read_config(host, &cfg);
    if (st == VH_STATUS_OK) st = check_config(host, &cfg);
    if (st == VH_STATUS_OK) st = check_policy(host, setup->policy, slots_of(&cfg));
    if (st != VH_STATUS_OK) return st;
    warn_unused(host, &cfg);

    mta *o = host->api->alloc(host, sizeof *o);
    if (!o) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "no memory for the optimizer");
    memset(o, 0, sizeof *o);
    o->host = host;
    o->cfg = cfg;
    o->table = setup->table;
    o->state_slots = slots_of(&cfg);
    o->last_step = -1;
    o->grad_norm = NAN;
    mta_worklist_init(&o->work, host);
    /* Off the CPU the update runs through the device's "vh.cuda.mta"
     * extension; a device without it is refused here, before any step. */
    const vh_device_ops *dev = host->api->device(host);
    if (dev && dev->kind != VH_DEVICE_KIND_CPU && (st = mta_cuda_open(o, dev)) != VH_STATUS_OK) {
        mta_destroy(o);
        return st;
    }
    if ((st = setup_layer_decay(o)) != VH_STATUS_OK || (st = setup_freeze(o)) != VH_STATUS_OK) {
        mta_destroy(o);
        return st;
    }
    *self = o;
    return VH_STATUS_OK;
}

static void mta_destroy(void *self) {
    mta *o = self;
    if (!o) return;
    mta_cuda_close(o);
    mta_worklist_free(&o->work);
    o->host->api->free(o->host, o->lr_scale);
    o->host->api->free(o->host, o->frozen);
    o->host->api->free(o->host, o->scale_first);
    o->host->api->free(o->host, o);
}

static int32_t mta_state_slots(void *self) {
    const mta *o = self;
    return o ? o->state_slots : 0;
}

static vh_status mta_update_entry(void *self, const vh_optim_step_args *args, double *lr_out) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return mta_update(self, args, lr_out);
}

/* ---- scalar state --------------------------------------------------------
 * Fixed layout, host byte order. The moments live in the slices. */

#define MTA_STATE_MAGIC 0x3141544du /* "MTA1" */
#define MTA_STATE_VERSION 1u

typedef struct mta_saved {
    uint32_t magic;
    uint16_t version;
    uint16_t algo;
    int32_t state_slots;
    uint32_t reserved;
    int64_t updates;   /* bias correction resumes from here */
    int64_t last_step;
    double grad_norm;
} mta_saved;

_Static_assert(sizeof(mta_saved) == 40, "mta_saved has no padding");

static vh_status mta_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = sizeof(mta_saved);
    return VH_STATUS_OK;
}

static vh_status mta_state_save(void *self, void *buf, size_t bytes) {
    mta *o = self;
    if (!o || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < sizeof(mta_saved))
        return o->host->api->fail(o->host, VH_STATUS_ERR_INVALID_ARG,
                                  "state buffer of %zu bytes, %zu needed", bytes,
                                  sizeof(mta_saved));
    mta_saved s;
    memset(&s, 0, sizeof s);
    s.magic = MTA_STATE_MAGIC;
    s.version = MTA_STATE_VERSION;
    s.algo = (uint16_t)o->cfg.algo;
    s.state_slots = o->state_slots;
    s.updates = o->updates;
    s.last_step = o->last_step;
    s.grad_norm = o->grad_norm;
    memcpy(buf, &s, sizeof s);
    return VH_STATUS_OK;
}

static vh_status mta_state_load(void *self, const void *buf, size_t bytes) {
    mta *o = self;
    if (!o || !buf) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = o->host;
    mta_saved s;
    if (bytes != sizeof s)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "mta state of %zu bytes, expected %zu", bytes, sizeof s);
    memcpy(&s, buf, sizeof s);
    if (s.magic != MTA_STATE_MAGIC)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "not an mta optimizer state");
    if (s.version != MTA_STATE_VERSION)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "mta state version %u, this plugin reads %u", (unsigned)s.version,
                               MTA_STATE_VERSION);
    if (s.algo != (uint16_t)o->cfg.algo || s.state_slots != o->state_slots)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the state was saved by algo %s with %d state slots; this run "
                               "uses %s with %d",
                               s.algo <= MTA_ALGO_LAMB ? mta_algo_name((mta_algo)s.algo) : "?",
                               (int)s.state_slots, mta_algo_name(o->cfg.algo),
                               (int)o->state_slots);
    if (s.updates < 0 || s.last_step < -1)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "mta state has %lld updates, last step %lld", (long long)s.updates,
                               (long long)s.last_step);
    o->updates = s.updates;
    o->last_step = s.last_step;
    o->grad_norm = s.grad_norm;
    return VH_STATUS_OK;
}

/* step.c reads f16 and bf16 gradients through f32 views and writes the
 * compute copies it is handed, on the CPU and in cuda_step.c's kernels
 * alike (their `copy`). */
static uint32_t mta_caps(void *self) {
    (void)self;
    return VH_OPTIM_CAP_HALF_GRADS | VH_OPTIM_CAP_WRITES_COMPUTE;
}

static const vh_optim_vtable vtable = {
    .struct_size = sizeof(vh_optim_vtable),
    .create = mta_create,
    .destroy = mta_destroy,
    .state_slots = mta_state_slots,
    .update = mta_update_entry,
    .state_size = mta_state_size,
    .state_save = mta_state_save,
    .state_load = mta_state_load,
    .caps = mta_caps,
};

VH_PLUGIN_DEFINE(VH_ROLE_OPTIM, "mta", "0.2.0",
                 "multi-tensor-apply AdamW / SGD (momentum, Nesterov) / LAMB with global-norm "
                 "clipping (rate and schedule: the SDK's shared keys)",
                 schema, vtable);
