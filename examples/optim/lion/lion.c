/* lion.c - the Lion optimizer (Chen et al. 2023, "Symbolic Discovery of
 * Optimization Algorithms"), as lucidrains/lion-pytorch:
 *
 *     c = beta1 * m + (1 - beta1) * g
 *     w = w - lr * (sign(c) + weight_decay * w)      (decay where VH_PARAM_FLAG_DECAY)
 *     m = beta2 * m + (1 - beta2) * g
 *
 * One state value per element (m, the sharding plugin's slot 0), half of
 * AdamW's; every update has the same size per element, so Lion wants a
 * learning rate 3-10x smaller than AdamW's and a weight decay as many times
 * larger. Plain loops: CPU device, f32 only.
 *
 * An ABI 2.1 optimizer: its schema holds Lion's own keys (the betas). The
 * rate, its warm-up and schedule, and the weight decay are the SDK's shared
 * keys (vh_optim_schedule.h): the host reads them and `update` gets this
 * step's numbers, so `--set optim.plugin=lion` on an AdamW recipe keeps
 * them. The state starts at zero (the sharding plugin allocates it zeroed),
 * which is Lion's m_0.
 */
#include <math.h>
#include <string.h>

#include <vithost/vithost.h>

typedef struct lion {
    vh_host *host;
    float beta1, beta2;
} lion;

static const vh_config_key schema[] = {
    {"beta1", VH_CONFIG_TYPE_FLOAT, "0.9", "interpolation of the update direction, [0, 1)",
     NULL, 0, 1, 0},
    {"beta2", VH_CONFIG_TYPE_FLOAT, "0.99", "decay of the momentum, [0, 1)", NULL, 0, 1, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* Refused at create, not at the first step: a policy whose masters,
 * gradients or state are not f32 (amp keeps f32 masters and state; full
 * fp16 does not). */
static vh_status check_policy(vh_host *host, const vh_precision_policy *policy) {
    vh_precision_policy p;
    memset(&p, 0, sizeof p);
    if (!vh_struct_upgrade(&p, sizeof p, policy)) return VH_STATUS_OK; /* none given */
    if (p.master_dtype == VH_DTYPE_F32 && p.grad_dtype == VH_DTYPE_F32 &&
        p.state_dtype == VH_DTYPE_F32)
        return VH_STATUS_OK;
    return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                           "lion updates f32 only; the precision policy has masters %s, "
                           "gradients %s, state %s",
                           vh_dtype_name((vh_dtype)p.master_dtype),
                           vh_dtype_name((vh_dtype)p.grad_dtype),
                           vh_dtype_name((vh_dtype)p.state_dtype));
}

static vh_status lion_create(vh_host *host, const vh_optim_setup *setup, void **self) {
    const vh_host_api *api = host->api;
    *self = NULL;
    if (api->device(host)->kind != VH_DEVICE_KIND_CPU)
        return api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                         "lion updates with CPU loops; device %s is not supported",
                         api->device(host)->name);
    vh_optim_setup su; /* members of a newer minor than the host's read as 0 */
    if (!vh_struct_upgrade(&su, sizeof su, setup))
        return api->fail(host, VH_STATUS_ERR_INVALID_ARG, "no optim setup");
    vh_status st = check_policy(host, su.policy);
    if (st != VH_STATUS_OK) return st;
    double b1, b2;
    if ((st = api->config_float(host, "beta1", &b1)) != VH_STATUS_OK ||
        (st = api->config_float(host, "beta2", &b2)) != VH_STATUS_OK)
        return st;
    if (b1 >= 1.0) return api->config_fail(host, "beta1", "must be < 1, not %g", b1);
    if (b2 >= 1.0) return api->config_fail(host, "beta2", "must be < 1, not %g", b2);
    lion *o = api->alloc(host, sizeof *o);
    if (!o) return api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(o, 0, sizeof *o);
    o->host = host;
    o->beta1 = (float)b1;
    o->beta2 = (float)b2;
    *self = o;
    return VH_STATUS_OK;
}

static void lion_destroy(void *self) {
    lion *o = self;
    if (o) o->host->api->free(o->host, o);
}

static int32_t lion_state_slots(void *self) {
    (void)self;
    return 1; /* m */
}

/* clip_grad_norm (a shared key): the gradients' factor, as
 * torch.nn.utils.clip_grad_norm_. The global norm is the precision plugin's
 * when it summed the squares already, else the SDK's vh_slices_sum_sq (over
 * every rank when the slices are sharded). */
static vh_status clip_factor(lion *o, const vh_optim_step_args *args, float *factor) {
    *factor = 1.0f;
    if (args->clip_grad_norm <= 0.0) return VH_STATUS_OK;
    double sq = args->grad_sum_sq;
    if (!args->has_grad_sum_sq) {
        vh_status st = vh_slices_sum_sq(o->host, args->slices, VH_SLICE_BUFFER_GRAD, &sq);
        if (st != VH_STATUS_OK) return st;
    }
    const double coef = args->clip_grad_norm / (sqrt(sq) + 1e-6);
    if (coef < 1.0) *factor = (float)coef;
    return VH_STATUS_OK;
}

static vh_status lion_update(void *self, const vh_optim_step_args *args_in, double *lr_out) {
    lion *o = self;
    vh_optim_step_args args; /* read through its struct_size */
    if (!vh_struct_upgrade(&args, sizeof args, args_in) || !args.slices)
        return o->host->api->fail(o->host, VH_STATUS_ERR_INVALID_ARG, "update without slices");
    const vh_param_slices *slices = args.slices;
    float k = 1.0f;
    vh_status st = clip_factor(o, &args, &k);
    if (st != VH_STATUS_OK) return st;
    /* this step's rate from the shared keys' schedule (warm-up included) */
    const float lr = (float)args.lr, wd = (float)args.weight_decay;
    const float b1 = o->beta1, b2 = o->beta2;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        if (sl->master_dtype != VH_DTYPE_F32 || sl->grad_dtype != VH_DTYPE_F32 ||
            sl->state_dtype != VH_DTYPE_F32)
            return o->host->api->fail(o->host, VH_STATUS_ERR_UNSUPPORTED,
                                      "lion updates f32 only; unit %d param %d has master %s, "
                                      "grad %s, state %s",
                                      (int)sl->unit, (int)sl->param,
                                      vh_dtype_name(sl->master_dtype),
                                      vh_dtype_name(sl->grad_dtype),
                                      vh_dtype_name(sl->state_dtype));
        float *w = sl->master, *m = sl->state[0];
        const float *g = sl->grad;
        const float decay = (sl->flags & VH_PARAM_FLAG_DECAY) ? lr * wd : 0.0f;
        for (int64_t i = 0; i < sl->count; i++) {
            const float gi = g[i] * k;
            const float c = b1 * m[i] + (1.0f - b1) * gi;
            const float sign = (c > 0.0f) - (c < 0.0f); /* sign(0) = 0, as torch.sign */
            w[i] -= lr * sign + decay * w[i];
            m[i] = b2 * m[i] + (1.0f - b2) * gi;
        }
    }
    if (lr_out) *lr_out = args.lr;
    return VH_STATUS_OK;
}

static const vh_optim_vtable vtable = {
    .struct_size = sizeof(vh_optim_vtable),
    .create = lion_create,
    .destroy = lion_destroy,
    .state_slots = lion_state_slots,
    .update = lion_update,
    /* No scalar state: m is in the slices (saved by the sharding plugin) and
     * the rate is the host's, from its step. */
};

VH_PLUGIN_DEFINE(VH_ROLE_OPTIM, "lion", "0.2.0", "Lion: sign of an interpolated momentum (CPU)",
                 schema, vtable);
