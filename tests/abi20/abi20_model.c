/* abi20_model.c - the model role's test plugin: a linear softmax classifier.
 *
 * ABI 2.0, frozen: tests/plugins/test_model.c as it shipped with ABI 2.0,
 * built against tests/abi20/include (the 2.0 headers, their sizes) and
 * declaring minor 0. It stands for a plugin compiled once against 2.0 that
 * every 2.x host must still load, train and resume (tests/test_abi20.c).
 * Never port it to newer headers. Its vtable is followed by words that are
 * no pointers (abi20_poison.h), so a host that reads past it fails at once.
 *
 * Letters: B batch, K = C_in*H*W inputs (the flattened image), C classes.
 *
 *     z = x W^T + b          x (B, K), W (C, K), b (C)
 *     loss = mean_b sum_c -q_c log softmax(z)_c,   q = (1 - eps) onehot(y) + eps / C
 *
 * Two units, so the unit hooks run per unit: "embed" holds proj.weight (decay,
 * trunc-normal 0.02) and "head" holds proj.bias (no decay, zeros). Forward
 * visits embed then head (gather, compute, release); backward visits them in
 * reverse (gather, grads, accumulate, reduce, release). Plain fp32 loops: the
 * model runs on the CPU device only, under a policy that is fp32 throughout
 * (one parameter per unit, so the unit layouts put it at byte 0).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vithost/vh_config.h"
#include "vithost/vh_data.h"
#include "vithost/vh_host.h"
#include "vithost/vh_model.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_sharding.h"

#include "abi20_poison.h"

enum { UNIT_EMBED = 0, UNIT_HEAD = 1, NUM_UNITS = 2 };

typedef struct abi20_model {
    vh_host *host;
    int32_t channels, height, width, classes;
    int64_t k;         /* inputs per image: channels * height * width */
    int64_t max_batch;
    float label_smoothing;

    vh_param_desc params[NUM_UNITS]; /* one per unit */
    vh_unit_desc units[NUM_UNITS];
    vh_param_table table;

    float *logits; /* (max_batch, C): the output of the last forward */
    float loss;    /* its mean loss: "device" memory, as the CPU device's is the host's */
    /* what backward needs, from the last VH_MODE_TRAIN forward */
    int64_t train_b; /* 0: no training forward yet */
    float *x;        /* (max_batch, K) copy of the images */
    float *probs;    /* (max_batch, C) softmax */
    int32_t *labels; /* (max_batch) */
    float *dlogits;  /* (max_batch, C) scratch of backward */
} abi20_model;

static const vh_config_key schema[] = {
    {"label_smoothing", VH_CONFIG_TYPE_FLOAT, "0.0",
     "label smoothing of the cross-entropy target, in [0, 1)", NULL, 0, 1, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* ---- PRNG for init (splitmix64) ---------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rng_next(uint64_t *state) {
    *state += 0x9e3779b97f4a7c15ull;
    uint64_t x = *state;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Uniform in [0, 1) with 53 bits. */
static double rng_uniform(uint64_t *state) {
    return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(uint64_t *state) {
    double u1 = 1.0 - rng_uniform(state); /* (0, 1]: log is finite */
    double u2 = rng_uniform(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static vh_status init_param(vh_host *host, const vh_param_desc *p, float *v, uint64_t *rng) {
    switch (p->init) {
    case VH_INIT_KIND_ZEROS:
        for (int64_t i = 0; i < p->numel; i++) v[i] = 0.0f;
        return VH_STATUS_OK;
    case VH_INIT_KIND_ONES:
        for (int64_t i = 0; i < p->numel; i++) v[i] = 1.0f;
        return VH_STATUS_OK;
    case VH_INIT_KIND_NORMAL:
        for (int64_t i = 0; i < p->numel; i++) v[i] = (float)(p->init_std * rng_normal(rng));
        return VH_STATUS_OK;
    case VH_INIT_KIND_TRUNC_NORMAL:
        for (int64_t i = 0; i < p->numel; i++) {
            double z;
            do z = rng_normal(rng);
            while (z < -2.0 || z > 2.0);
            v[i] = (float)(p->init_std * z);
        }
        return VH_STATUS_OK;
    case VH_INIT_KIND_XAVIER_UNIFORM: {
        double fan_out = (double)p->shape[0], fan_in = p->ndim > 1 ? (double)p->shape[1] : fan_out;
        for (int32_t d = 2; d < p->ndim; d++) {
            fan_out *= (double)p->shape[d];
            fan_in *= (double)p->shape[d];
        }
        double bound = sqrt(6.0 / (fan_in + fan_out));
        for (int64_t i = 0; i < p->numel; i++)
            v[i] = (float)(bound * (2.0 * rng_uniform(rng) - 1.0));
        return VH_STATUS_OK;
    }
    }
    return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "%s: unknown init kind %d", p->name,
                           (int)p->init);
}

/* ---- create / destroy / table ----------------------------------------- */

static void model_destroy(void *self) {
    abi20_model *m = self;
    if (!m) return;
    vh_host *host = m->host;
    host->api->free(host, m->logits);
    host->api->free(host, m->x);
    host->api->free(host, m->probs);
    host->api->free(host, m->labels);
    host->api->free(host, m->dlogits);
    host->api->free(host, m);
}

static void build_table(abi20_model *m) {
    vh_param_desc *w = &m->params[UNIT_EMBED];
    w->name = "proj.weight";
    w->ndim = 2;
    w->shape[0] = m->classes;
    w->shape[1] = m->k;
    w->flags = VH_PARAM_FLAG_DECAY;
    w->init = VH_INIT_KIND_TRUNC_NORMAL;
    w->init_std = 0.02f;
    w->offset = 0;
    w->numel = m->classes * m->k;

    vh_param_desc *b = &m->params[UNIT_HEAD];
    b->name = "proj.bias";
    b->ndim = 1;
    b->shape[0] = m->classes;
    b->flags = 0;
    b->init = VH_INIT_KIND_ZEROS;
    b->init_std = 0.0f;
    b->offset = 0;
    b->numel = m->classes;

    static const char *const unit_names[NUM_UNITS] = {"embed", "head"};
    m->table.numel = 0;
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        m->units[u].name = unit_names[u];
        m->units[u].params = &m->params[u];
        m->units[u].num_params = 1;
        m->units[u].numel = m->params[u].numel;
        m->table.numel += m->units[u].numel;
    }
    m->table.units = m->units;
    m->table.num_units = NUM_UNITS;
}

static vh_status model_create(vh_host *host, const vh_model_setup *setup_in, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    /* Read through our own struct: what an older (smaller) setup lacks is
     * zero, its default (no policy: fp32). */
    vh_model_setup setup_buf;
    if (!vh_struct_upgrade(&setup_buf, sizeof setup_buf, setup_in))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "model setup missing");
    const vh_model_setup *setup = &setup_buf;
    if (setup->channels < 1 || setup->height < 1 || setup->width < 1)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "image shape %dx%dx%d is empty",
                               (int)setup->channels, (int)setup->height, (int)setup->width);
    if (setup->num_classes < 2)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%d classes: need at least 2",
                               (int)setup->num_classes);
    if (setup->max_batch < 1)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "max batch %lld must be >= 1",
                               (long long)setup->max_batch);
    vh_precision_policy pol_buf;
    memset(&pol_buf, 0, sizeof pol_buf);
    pol_buf.struct_size = sizeof pol_buf;
    if (setup->policy) vh_struct_upgrade(&pol_buf, sizeof pol_buf, setup->policy);
    const vh_precision_policy *pol = &pol_buf;
    if (pol->param_dtype != VH_DTYPE_F32 || pol->compute_dtype != VH_DTYPE_F32 ||
        pol->grad_dtype != VH_DTYPE_F32)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "abi20_model computes in fp32 only (params %s, compute %s, grads %s)",
                               vh_dtype_name(pol->param_dtype), vh_dtype_name(pol->compute_dtype),
                               vh_dtype_name(pol->grad_dtype));
    const vh_device_ops *dev = host->api->device(host);
    if (!dev || dev->kind != VH_DEVICE_KIND_CPU)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "abi20_model runs on the CPU only (device is %s)",
                               dev && dev->name ? dev->name : "unknown");

    /* Sizes: every buffer below must fit in size_t. */
    const int64_t k = (int64_t)setup->channels * setup->height * setup->width;
    const int64_t lim = (int64_t)(SIZE_MAX / sizeof(float) > INT64_MAX ? INT64_MAX
                                                                        : SIZE_MAX / sizeof(float));
    if (k > lim / setup->num_classes || k > lim / setup->max_batch ||
        setup->num_classes > lim / setup->max_batch)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "%lld inputs x %d classes x batch %lld "
                               "is too large", (long long)k, (int)setup->num_classes,
                               (long long)setup->max_batch);

    double eps;
    vh_status st = host->api->config_float(host, "label_smoothing", &eps);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the float key 'label_smoothing'");
    if (!(eps >= 0.0 && eps < 1.0))
        return host->api->config_fail(host, "label_smoothing", "%g is outside [0, 1)", eps);

    abi20_model *m = host->api->alloc(host, sizeof *m);
    if (!m) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(m, 0, sizeof *m);
    m->host = host;
    m->channels = setup->channels;
    m->height = setup->height;
    m->width = setup->width;
    m->classes = setup->num_classes;
    m->k = k;
    m->max_batch = setup->max_batch;
    m->label_smoothing = (float)eps;
    build_table(m);

    const size_t bc = (size_t)m->max_batch * (size_t)m->classes;
    m->logits = host->api->alloc(host, bc * sizeof(float));
    m->x = host->api->alloc(host, (size_t)m->max_batch * (size_t)m->k * sizeof(float));
    m->probs = host->api->alloc(host, bc * sizeof(float));
    m->labels = host->api->alloc(host, (size_t)m->max_batch * sizeof(int32_t));
    m->dlogits = host->api->alloc(host, bc * sizeof(float));
    if (!m->logits || !m->x || !m->probs || !m->labels || !m->dlogits) {
        model_destroy(m);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                               "out of memory for activations of batch %lld",
                               (long long)setup->max_batch);
    }
    *self = m;
    return VH_STATUS_OK;
}

static const vh_param_table *model_param_table(void *self) {
    abi20_model *m = self;
    return m ? &m->table : NULL;
}

static vh_status model_init_unit(void *self, int32_t unit, float *values, uint64_t seed) {
    abi20_model *m = self;
    if (!m) return VH_STATUS_ERR_INVALID_ARG;
    if (unit < 0 || unit >= NUM_UNITS)
        return m->host->api->fail(m->host, VH_STATUS_ERR_INVALID_ARG, "init_unit: unit %d is not "
                                  "in [0, %d)", (int)unit, NUM_UNITS);
    if (!values)
        return m->host->api->fail(m->host, VH_STATUS_ERR_INVALID_ARG, "init_unit: NULL values");
    uint64_t rng = mix64(mix64(seed ^ 0x696e69745f756e69ull) ^ (uint64_t)unit);
    const vh_unit_desc *ud = &m->units[unit];
    for (int32_t i = 0; i < ud->num_params; i++) {
        vh_status st = init_param(m->host, &ud->params[i], values + ud->params[i].offset, &rng);
        if (st != VH_STATUS_OK) return st;
    }
    return VH_STATUS_OK;
}

/* ---- forward / backward ----------------------------------------------- */

static vh_status check_hooks(vh_host *host, const vh_unit_hooks *hooks) {
    if (!hooks || !hooks->gather || !hooks->release || !hooks->grads || !hooks->reduce)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unit hooks missing");
    return VH_STATUS_OK;
}

static vh_status check_batch(const abi20_model *m, const vh_batch *batch) {
    vh_host *host = m->host;
    if (!batch) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "forward: NULL batch");
    const vh_tensor *im = &batch->images, *lb = &batch->labels;
    const int64_t b = batch->size;
    if (b < 1 || b > m->max_batch)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "batch of %lld, max %lld",
                               (long long)b, (long long)m->max_batch);
    if (!im->data || im->dtype != VH_DTYPE_F32 || im->device != VH_DEVICE_KIND_CPU ||
        im->ndim != 4 || im->shape[0] != b || im->shape[1] != m->channels ||
        im->shape[2] != m->height || im->shape[3] != m->width)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "images must be (%lld, %d, %d, %d) f32 on the CPU",
                               (long long)b, (int)m->channels, (int)m->height, (int)m->width);
    if (!lb->data || lb->dtype != VH_DTYPE_I32 || lb->device != VH_DEVICE_KIND_CPU ||
        lb->ndim != 1 || lb->shape[0] != b)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "labels must be (%lld) i32 on the CPU", (long long)b);
    const int32_t *y = lb->data;
    for (int64_t i = 0; i < b; i++)
        if (y[i] < 0 || y[i] >= m->classes)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "label %d of sample %lld is not in [0, %d)", (int)y[i],
                                   (long long)i, (int)m->classes);
    return VH_STATUS_OK;
}

static vh_status model_forward(void *self, const vh_batch *batch, vh_mode mode,
                               const vh_unit_hooks *hooks, vh_model_output *out) {
    abi20_model *m = self;
    if (!m) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = m->host;
    vh_status st;
    if (mode != VH_MODE_TRAIN && mode != VH_MODE_EVAL)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unknown mode %d", (int)mode);
    if (!out) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "forward: NULL output");
    if ((st = check_hooks(host, hooks)) != VH_STATUS_OK) return st;
    if ((st = check_batch(m, batch)) != VH_STATUS_OK) return st;

    const int64_t B = batch->size, K = m->k, C = m->classes;
    const int32_t *y = batch->labels.data;
    const float *x = batch->images.data;
    if (mode == VH_MODE_TRAIN) {
        /* Keep the inputs: the batch's memory is the data plugin's. */
        m->train_b = 0; /* invalid until this forward completes */
        memcpy(m->x, x, (size_t)B * (size_t)K * sizeof(float));
        memcpy(m->labels, y, (size_t)B * sizeof(int32_t));
        x = m->x;
    }
    float *z = m->logits;
    const void *p;

    /* embed: z = x W^T */
    if ((st = hooks->gather(hooks->ctx, UNIT_EMBED, &p)) != VH_STATUS_OK) return st;
    const float *W = p;
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * K;
        for (int64_t c = 0; c < C; c++) {
            const float *wc = W + c * K;
            float acc = 0.0f;
            for (int64_t i = 0; i < K; i++) acc += wc[i] * xb[i];
            z[b * C + c] = acc;
        }
    }
    if ((st = hooks->release(hooks->ctx, UNIT_EMBED)) != VH_STATUS_OK) return st;

    /* head: z += b, then the softmax cross-entropy */
    if ((st = hooks->gather(hooks->ctx, UNIT_HEAD, &p)) != VH_STATUS_OK) return st;
    const float *bias = p;
    const double eps = m->label_smoothing, off = eps / (double)C;
    double loss = 0.0;
    for (int64_t b = 0; b < B; b++) {
        float *zb = z + b * C;
        double zmax = -INFINITY, zsum = 0.0;
        for (int64_t c = 0; c < C; c++) {
            zb[c] += bias[c];
            if (zb[c] > zmax) zmax = zb[c];
            zsum += zb[c];
        }
        double se = 0.0;
        for (int64_t c = 0; c < C; c++) se += exp((double)zb[c] - zmax);
        const double lse = zmax + log(se);
        /* sum_c q_c (lse - z_c), with sum_c q_c = 1 */
        loss += lse - (1.0 - eps) * (double)zb[y[b]] - off * zsum;
        if (mode == VH_MODE_TRAIN)
            for (int64_t c = 0; c < C; c++) m->probs[b * C + c] = (float)exp((double)zb[c] - lse);
    }
    if ((st = hooks->release(hooks->ctx, UNIT_HEAD)) != VH_STATUS_OK) return st;

    if (mode == VH_MODE_TRAIN) m->train_b = B;
    m->loss = (float)(loss / (double)B);
    uint32_t out_size = out->struct_size; /* the caller's */
    memset(out, 0, sizeof *out);
    out->struct_size = out_size;
    out->loss = &m->loss;
    out->logits.data = z;
    out->logits.dtype = VH_DTYPE_F32;
    out->logits.device = VH_DEVICE_KIND_CPU;
    out->logits.ndim = 2;
    out->logits.shape[0] = B;
    out->logits.shape[1] = C;
    return VH_STATUS_OK;
}

static vh_status model_backward(void *self, float loss_scale, const vh_unit_hooks *hooks) {
    abi20_model *m = self;
    if (!m) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = m->host;
    vh_status st;
    if ((st = check_hooks(host, hooks)) != VH_STATUS_OK) return st;
    if (m->train_b < 1)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "backward without a completed training forward");

    const int64_t B = m->train_b, K = m->k, C = m->classes;
    const float eps = m->label_smoothing, off = eps / (float)C;
    const float g = loss_scale / (float)B; /* d(mean loss)/d(loss_b), times the scale */
    float *dz = m->dlogits;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            float q = off + (c == m->labels[b] ? 1.0f - eps : 0.0f);
            dz[b * C + c] = (m->probs[b * C + c] - q) * g;
        }

    const void *p;
    void *gp;

    /* head: db = sum_b dz */
    if ((st = hooks->gather(hooks->ctx, UNIT_HEAD, &p)) != VH_STATUS_OK) return st;
    if ((st = hooks->grads(hooks->ctx, UNIT_HEAD, &gp)) != VH_STATUS_OK) return st;
    float *db = gp;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) db[c] += dz[b * C + c];
    if ((st = hooks->reduce(hooks->ctx, UNIT_HEAD)) != VH_STATUS_OK) return st;
    if ((st = hooks->release(hooks->ctx, UNIT_HEAD)) != VH_STATUS_OK) return st;

    /* embed: dW = dz^T x (no input gradient: x is the data) */
    if ((st = hooks->gather(hooks->ctx, UNIT_EMBED, &p)) != VH_STATUS_OK) return st;
    if ((st = hooks->grads(hooks->ctx, UNIT_EMBED, &gp)) != VH_STATUS_OK) return st;
    float *dW = gp;
    for (int64_t c = 0; c < C; c++) {
        float *dwc = dW + c * K;
        for (int64_t b = 0; b < B; b++) {
            const float d = dz[b * C + c];
            const float *xb = m->x + b * K;
            for (int64_t i = 0; i < K; i++) dwc[i] += d * xb[i];
        }
    }
    if ((st = hooks->reduce(hooks->ctx, UNIT_EMBED)) != VH_STATUS_OK) return st;
    if ((st = hooks->release(hooks->ctx, UNIT_EMBED)) != VH_STATUS_OK) return st;
    return VH_STATUS_OK;
}

static double model_train_flops_per_image(void *self) {
    const abi20_model *m = self;
    if (!m) return 0.0;
    /* one matmul of C x K multiply-accumulates: 2 FLOPs each, 3 x forward */
    return 6.0 * (double)m->classes * (double)m->k;
}

/* A linear model draws no random numbers: nothing to save beyond params. */
static vh_status model_state_size(void *self, size_t *bytes) {
    (void)self;
    *bytes = 0;
    return VH_STATUS_OK;
}

static vh_status model_state_save(void *self, void *buf, size_t bytes) {
    (void)self, (void)buf;
    return bytes == 0 ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}

static vh_status model_state_load(void *self, const void *buf, size_t bytes) {
    (void)self, (void)buf;
    return bytes == 0 ? VH_STATUS_OK : VH_STATUS_ERR_FORMAT;
}

static const struct {
    vh_model_vtable vtable;
    uintptr_t poison[8]; /* abi20_poison.h */
} shipped = {{
    .struct_size = sizeof(vh_model_vtable),
    .create = model_create,
    .destroy = model_destroy,
    .param_table = model_param_table,
    .init_unit = model_init_unit,
    .forward = model_forward,
    .backward = model_backward,
    .train_flops_per_image = model_train_flops_per_image,
    .state_size = model_state_size,
    .state_save = model_state_save,
    .state_load = model_state_load,
    /* No `pretrained` key, and the host's strict loader by name serves
     * checkpoints: initial_weights and load_weights stay NULL (optional). */
    .initial_weights = NULL,
    .load_weights = NULL,
}, ABI20_POISON};

VH_PLUGIN_DEFINE(VH_ROLE_MODEL, "abi20_model", "0.1.0",
                 "test plugin: linear softmax classifier on the flattened image", schema,
                 shipped.vtable);
