/* bf16sr.c - bf16 mixed precision whose compute copies are rounded
 * STOCHASTICALLY from the fp32 masters.
 *
 * The policy is amp's with dtype bf16 (plugins/precision/amp): bf16 compute
 * copies, activations and parameter gradients, f32 gradients on the wire,
 * f32 masters and optimizer state, layer-norm parameters kept in f32, no
 * loss scaling (bf16 has f32's exponent range). Steps with Inf/NaN
 * gradients are skipped on every rank (the SDK's vh_grad_check).
 *
 * The difference: after every update the sharding plugin refreshes the
 * bf16 copies from the masters with round-to-nearest-even; this plugin
 * makes that rounding stochastic, so the copy is the master in expectation
 * (E[bf16(w)] = w) and updates smaller than half a bf16 step still move the
 * weights the model sees, on average. It uses the identity
 *
 *     SR(w) = RNE(w + n),   n ~ U(-u/2, u/2),   u = the bf16 spacing at w
 *
 * (exact inside a binade): unscale_and_check, which runs just before the
 * optimizer, adds n to each bf16 parameter's master; the optimizer and the
 * refresh see w + n; update, which runs after the refresh, subtracts n again
 * (up to fp32 rounding, 2^-24 relative, far below bf16's 2^-8). n is drawn
 * from (run seed, update count, unit, parameter, element), so every rank
 * draws the same and replicas stay identical, and a resumed run continues
 * bit for bit (the count is the plugin's state). A skipped step adds
 * nothing.
 *
 * The masters are touched with plain loops: CPU device only.
 */
#include <string.h>

#include <vithost/vithost.h>

typedef struct bf16sr {
    vh_host *host;
    vh_grad_check *check;
    uint64_t seed;
    int64_t rounds;  /* dithers so far: the noise's counter */
    double sum_sq;   /* of the last check */
    int has_sum_sq;
    /* the dither in flight: the slices it went into and the noise itself */
    const vh_param_slices *slices;
    float *noise;
    int64_t noise_cap;
    int dithered;
} bf16sr;

static const vh_config_key schema[] = {
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static void sr_destroy(void *self) {
    bf16sr *p = self;
    if (!p) return;
    vh_grad_check_free(p->check);
    p->host->api->free(p->host, p->noise);
    p->host->api->free(p->host, p);
}

static vh_status sr_create(vh_host *host, void **self) {
    *self = NULL;
    const vh_device_ops *dev = host->api->device(host);
    if (dev->kind != VH_DEVICE_KIND_CPU)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "bf16sr dithers the masters with CPU loops; device %s is not "
                               "supported (use precision: {plugin: amp, dtype: bf16})",
                               dev->name);
    bf16sr *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->host = host;
    p->seed = host->api->seed(host);
    vh_status st = vh_grad_check_create(host, &p->check);
    if (st != VH_STATUS_OK) {
        sr_destroy(p);
        return st;
    }
    *self = p;
    return VH_STATUS_OK;
}

static vh_status sr_policy(void *self, vh_precision_policy *out) {
    (void)self;
    vh_precision_policy full;
    memset(&full, 0, sizeof full);
    full.param_dtype = VH_DTYPE_BF16;
    full.compute_dtype = VH_DTYPE_BF16;
    full.grad_dtype = VH_DTYPE_BF16;
    full.comm_dtype = VH_DTYPE_F32;
    full.master_dtype = VH_DTYPE_F32;
    full.state_dtype = VH_DTYPE_F32;
    full.fp32_param_flags = VH_PARAM_FLAG_NORM; /* as amp's layernorm_fp32 */
    full.master_weights = 1;
    size_t n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
    if (n > sizeof full.struct_size)
        memcpy((char *)out + sizeof full.struct_size, (const char *)&full + sizeof full.struct_size,
               n - sizeof full.struct_size);
    return VH_STATUS_OK;
}

static float sr_loss_scale(void *self) {
    (void)self;
    return 1.0f;
}

/* Half the bf16 spacing at |x| (bf16 keeps 8 bits of significand). */
static float half_ulp_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t exp = (bits >> 23) & 0xffu;
    if (exp == 0xffu) return 0.0f;   /* Inf/NaN: leave alone */
    if (exp < 8) exp = 8;            /* subnormal range: the smallest spacing */
    uint32_t h = (exp - 8) << 23;    /* 2^(e - 127 - 8) = half of 2^(e - 127 - 7) */
    float r;
    memcpy(&r, &h, sizeof r);
    return r;
}

/* Adds the noise to the master of every parameter whose compute copy is
 * bf16, remembering it for update. */
static vh_status dither(bf16sr *p, const vh_param_slices *slices) {
    int64_t total = 0;
    for (int32_t s = 0; s < slices->count; s++) total += vh_param_slices_at(slices, s)->count;
    if (total > p->noise_cap) {
        p->host->api->free(p->host, p->noise);
        p->noise = p->host->api->alloc(p->host, (size_t)total * sizeof(float));
        p->noise_cap = p->noise ? total : 0;
        if (!p->noise)
            return p->host->api->fail(p->host, VH_STATUS_ERR_NOMEM,
                                      "out of memory for the noise of %lld values",
                                      (long long)total);
    }
    const uint64_t round_key = vh_splitmix64(p->seed ^ 0x6266313673720000ull) + (uint64_t)p->rounds;
    float *noise = p->noise;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        if (sl->master_dtype != VH_DTYPE_F32)
            return p->host->api->fail(p->host, VH_STATUS_ERR_UNSUPPORTED,
                                      "bf16sr needs f32 masters; unit %d param %d has %s",
                                      (int)sl->unit, (int)sl->param,
                                      vh_dtype_name(sl->master_dtype));
        float *w = sl->master;
        const int bf16 = (sl->flags & VH_PARAM_FLAG_NORM) == 0; /* NORM stays f32 */
        const uint64_t key = vh_splitmix64(vh_splitmix64(round_key) ^
                                           ((uint64_t)sl->unit << 32 | (uint32_t)sl->param));
        for (int64_t i = 0; i < sl->count; i++) {
            float n = 0.0f;
            if (bf16) {
                /* u in [-1, 1) from the element's index within the whole
                 * parameter: the same on every rank, however it is sharded. */
                uint64_t h = vh_splitmix64_mix(key + (uint64_t)(sl->offset + i + 1) *
                                                         VH_SPLITMIX64_GAMMA);
                float u = (float)(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
                n = u * half_ulp_bf16(w[i]);
            }
            noise[i] = n;
            w[i] += n;
        }
        noise += sl->count;
    }
    p->slices = slices;
    p->dithered = 1;
    p->rounds++;
    return VH_STATUS_OK;
}

static vh_status sr_unscale_and_check(void *self, const vh_param_slices *grads, int *found_inf) {
    bf16sr *p = self;
    double sum_sq = 0.0;
    p->has_sum_sq = 0;
    vh_status st = vh_grad_check_run(p->check, grads, 1.0f, found_inf, &sum_sq);
    if (st != VH_STATUS_OK) return st;
    p->sum_sq = sum_sq;
    p->has_sum_sq = 1;
    /* No step follows a found_inf: nothing to round. */
    return *found_inf ? VH_STATUS_OK : dither(p, grads);
}

static vh_status sr_update(void *self, int found_inf) {
    (void)found_inf;
    bf16sr *p = self;
    if (!p->dithered) return VH_STATUS_OK;
    /* The refresh has rounded w + n: take n back out of the masters. */
    const float *noise = p->noise;
    for (int32_t s = 0; s < p->slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(p->slices, s);
        float *w = sl->master;
        for (int64_t i = 0; i < sl->count; i++) w[i] -= noise[i];
        noise += sl->count;
    }
    p->dithered = 0;
    return VH_STATUS_OK;
}

static vh_status sr_grad_sum_sq(void *self, double *out, int *has) {
    bf16sr *p = self;
    *has = p->has_sum_sq;
    *out = p->sum_sq;
    return VH_STATUS_OK;
}

/* ---- state: the noise counter, so a resumed run draws what it would have --- */

#define STATE_MAGIC 0x52533642u /* "B6SR" */

typedef struct sr_state {
    uint32_t magic, version;
    int64_t rounds;
} sr_state;

static vh_status sr_state_size(void *self, size_t *bytes) {
    (void)self;
    *bytes = sizeof(sr_state);
    return VH_STATUS_OK;
}

static vh_status sr_state_save(void *self, void *buf, size_t bytes) {
    bf16sr *p = self;
    if (bytes < sizeof(sr_state))
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG, "state buffer too small");
    sr_state s = {STATE_MAGIC, 1, p->rounds};
    memcpy(buf, &s, sizeof s);
    return VH_STATUS_OK;
}

static vh_status sr_state_load(void *self, const void *buf, size_t bytes) {
    bf16sr *p = self;
    sr_state s;
    if (bytes != sizeof s)
        return p->host->api->fail(p->host, VH_STATUS_ERR_FORMAT,
                                  "precision state of %zu bytes is not bf16sr's (%zu)", bytes,
                                  sizeof s);
    memcpy(&s, buf, sizeof s);
    if (s.magic != STATE_MAGIC || s.version != 1 || s.rounds < 0)
        return p->host->api->fail(p->host, VH_STATUS_ERR_FORMAT,
                                  "the checkpoint's precision state was not written by bf16sr "
                                  "(tag 0x%08x): resume with the plugin that wrote it",
                                  (unsigned)s.magic);
    p->rounds = s.rounds;
    return VH_STATUS_OK;
}

static const vh_precision_vtable vtable = {
    .struct_size = sizeof(vh_precision_vtable),
    .create = sr_create,
    .destroy = sr_destroy,
    .policy = sr_policy,
    .loss_scale = sr_loss_scale,
    .unscale_and_check = sr_unscale_and_check,
    .update = sr_update,
    .state_size = sr_state_size,
    .state_save = sr_state_save,
    .state_load = sr_state_load,
    .grad_sum_sq = sr_grad_sum_sq,
};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "bf16sr", "0.1.0",
                 "bf16 compute, fp32 masters, compute copies stochastically rounded (CPU)",
                 schema, vtable);
