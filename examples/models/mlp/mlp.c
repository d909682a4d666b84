/* mlp.c - a 2-layer perceptron on the flattened image, with the device ops.
 *
 * Letters: B batch, K = C_in * H * W inputs, M hidden width, C classes.
 *
 *     pre    = x W1^T + b1                 (B, M)   unit "fc1"
 *     h      = gelu(pre)                   (B, M)   (the GEMM's epilogue)
 *     logits = h W2^T + b2                 (B, C)   unit "head"
 *     loss   = mean softmax cross-entropy(logits, labels)
 *
 * Backward, units reversed (the sharding plugin may reduce "head" while
 * "fc1" is computed):
 *
 *     dlogits = d loss (times the loss scale)
 *     dW2 += dlogits^T h,  db2 += colsum(dlogits),  dh = dlogits W2
 *     dpre = gelu'(pre) * dh
 *     dW1 += dpre^T x,     db1 += colsum(dpre)
 *
 * Names as timm's Mlp (fc1, fc2 -> here head). f32 only: the images are f32,
 * and a GEMM takes one dtype for both inputs.
 */
#include <string.h>

#include <vithost/vithost.h>

enum { UNIT_FC1 = 0, UNIT_HEAD = 1, NUM_UNITS = 2 };
enum { W = 0, B_ = 1 }; /* parameter index within a unit: weight, bias */

typedef struct mlp {
    vh_host *host;
    const vh_device_ops *dev;
    int64_t k, m, c, max_batch;
    float smoothing;
    vh_param_desc params[NUM_UNITS][2];
    vh_unit_desc units[NUM_UNITS];
    vh_param_table table;
    vh_unit_layout layout[NUM_UNITS];
    /* device memory */
    void *pre, *h, *logits; /* forward */
    void *dlogits, *dh, *dpre; /* backward */
    float *loss, *loss_bw;
    /* the last TRAIN forward's batch (valid until the data plugin's next `next`) */
    const void *x;
    const int32_t *labels;
    int64_t b;
} mlp;

static const vh_config_key schema[] = {
    {"hidden", VH_CONFIG_TYPE_INT, "256", "hidden width M", NULL, 1, 1 << 20, 0},
    {"label_smoothing", VH_CONFIG_TYPE_FLOAT, "0", "label smoothing of the loss, [0, 1)", NULL,
     0, 1, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static void mlp_destroy(void *self) {
    mlp *n = self;
    if (!n) return;
    void *bufs[] = {n->pre, n->h, n->logits, n->dlogits, n->dh, n->dpre, n->loss, n->loss_bw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) n->dev->free(n->dev->device, bufs[i]);
    for (int u = 0; u < NUM_UNITS; u++) vh_unit_layout_free(&n->layout[u]);
    n->host->api->free(n->host, n);
}

static void linear_params(vh_param_desc *p, const char *wname, const char *bname, int64_t out,
                          int64_t in) {
    p[W].name = wname;
    p[W].ndim = 2;
    p[W].shape[0] = out;
    p[W].shape[1] = in;
    p[W].flags = VH_PARAM_FLAG_DECAY;
    p[W].init = VH_INIT_KIND_XAVIER_UNIFORM;
    p[W].numel = out * in;
    p[B_].name = bname;
    p[B_].ndim = 1;
    p[B_].shape[0] = out;
    p[B_].flags = VH_PARAM_FLAG_BIAS;
    p[B_].init = VH_INIT_KIND_ZEROS;
    p[B_].offset = out * in;
    p[B_].numel = out;
}

static vh_status mlp_create(vh_host *host, const vh_model_setup *setup, void **self) {
    const vh_host_api *api = host->api;
    *self = NULL;
    const vh_precision_policy *pol = setup->policy;
    if (pol->param_dtype != VH_DTYPE_F32 || pol->compute_dtype != VH_DTYPE_F32 ||
        pol->grad_dtype != VH_DTYPE_F32)
        return api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                         "mlp computes in f32 only; the policy has params %s, compute %s, "
                         "grads %s (use precision: {plugin: fp32})",
                         vh_dtype_name(pol->param_dtype), vh_dtype_name(pol->compute_dtype),
                         vh_dtype_name(pol->grad_dtype));
    int64_t hidden;
    double smoothing;
    vh_status st;
    if ((st = api->config_int(host, "hidden", &hidden)) != VH_STATUS_OK ||
        (st = api->config_float(host, "label_smoothing", &smoothing)) != VH_STATUS_OK)
        return st;
    if (smoothing >= 1.0)
        return api->config_fail(host, "label_smoothing", "must be < 1, not %g", smoothing);

    mlp *n = api->alloc(host, sizeof *n);
    if (!n) return api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(n, 0, sizeof *n);
    n->host = host;
    n->dev = api->device(host);
    n->k = (int64_t)setup->channels * setup->height * setup->width;
    n->m = hidden;
    n->c = setup->num_classes;
    n->max_batch = setup->max_batch;
    n->smoothing = (float)smoothing;
    linear_params(n->params[UNIT_FC1], "fc1.weight", "fc1.bias", n->m, n->k);
    linear_params(n->params[UNIT_HEAD], "head.weight", "head.bias", n->c, n->m);
    static const char *const names[NUM_UNITS] = {"fc1", "head"};
    for (int u = 0; u < NUM_UNITS; u++) {
        n->units[u].name = names[u];
        n->units[u].params = n->params[u];
        n->units[u].num_params = 2;
        n->units[u].numel = n->params[u][W].numel + n->params[u][B_].numel;
        n->table.numel += n->units[u].numel;
        if (st == VH_STATUS_OK)
            st = vh_unit_layout_init(&n->layout[u], &n->units[u], vh_policy_param_dtype, pol);
    }
    n->table.units = n->units;
    n->table.num_units = NUM_UNITS;
    const size_t f = sizeof(float), bm = (size_t)(n->max_batch * n->m) * f,
                 bc = (size_t)(n->max_batch * n->c) * f;
    void **bufs[] = {&n->pre, &n->h, &n->logits, &n->dlogits, &n->dh, &n->dpre,
                     (void **)&n->loss, (void **)&n->loss_bw};
    const size_t sizes[] = {bm, bm, bc, bc, bm, bm, f, f};
    for (size_t i = 0; st == VH_STATUS_OK && i < sizeof sizes / sizeof sizes[0]; i++)
        if (n->dev->alloc(n->dev->device, sizes[i], bufs[i]) != VH_STATUS_OK)
            st = api->fail(host, VH_STATUS_ERR_NOMEM,
                           "out of device memory for activations of batch %lld x hidden %lld",
                           (long long)n->max_batch, (long long)n->m);
    if (st != VH_STATUS_OK) {
        mlp_destroy(n);
        return st;
    }
    *self = n;
    return VH_STATUS_OK;
}

static const vh_param_table *mlp_param_table(void *self) {
    return &((mlp *)self)->table;
}

static vh_status mlp_init_unit(void *self, int32_t unit, float *values, uint64_t seed) {
    mlp *n = self;
    for (int i = 0; i < 2; i++) {
        const vh_param_desc *p = &n->params[unit][i];
        vh_param_init(p, values + p->offset,
                      vh_splitmix64(seed ^ ((uint64_t)unit << 8 | (uint64_t)(i + 1))));
    }
    return VH_STATUS_OK;
}

/* C = epilogue(A op(B) + bias) with A (rows, k) and B stored (n, k): a linear layer. */
static vh_status linear(const mlp *n, const void *a, const char *params, const vh_unit_layout *lay,
                        int64_t rows, int64_t out, int64_t in, void *c, vh_epilogue epi,
                        void *aux) {
    vh_gemm_args g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.m = rows, g.n = out, g.k = in;
    g.alpha = 1.0f;
    g.a = a, g.lda = in;
    g.b = params + lay->offsets[W], g.ldb = in, g.trans_b = 1;
    g.bias = params + lay->offsets[B_];
    g.c = c, g.ldc = out;
    g.epilogue = epi;
    g.aux = aux;
    return n->dev->gemm(n->dev->device, &g);
}

/* The weight and bias gradients of a linear layer: dW += dout^T in, db += colsum(dout). */
static vh_status linear_grads(const mlp *n, const void *dout, const void *in, char *grads,
                              const vh_unit_layout *lay, int64_t rows, int64_t out,
                              int64_t k) {
    vh_gemm_args g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.trans_a = 1;
    g.m = out, g.n = k, g.k = rows;
    g.alpha = 1.0f, g.beta = 1.0f; /* parameter gradients accumulate */
    g.a = dout, g.lda = out;
    g.b = in, g.ldb = k;
    g.c = grads + lay->offsets[W], g.ldc = k;
    vh_status st = n->dev->gemm(n->dev->device, &g);
    if (st != VH_STATUS_OK) return st;
    vh_rows_args r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.rows = rows, r.cols = out;
    r.dout = dout;
    r.out = grads + lay->offsets[B_];
    return n->dev->bias_backward(n->dev->device, &r);
}

static vh_status xent(const mlp *n, const int32_t *labels, int64_t b, float *loss, void *dlogits,
                      float scale) {
    vh_xent_args x;
    memset(&x, 0, sizeof x);
    x.struct_size = sizeof x;
    x.batch = b, x.classes = n->c;
    x.smoothing = n->smoothing;
    x.dloss_scale = scale;
    x.logits = n->logits;
    x.labels = labels;
    x.loss = loss;
    x.dlogits = dlogits;
    return n->dev->softmax_cross_entropy(n->dev->device, &x);
}

static vh_status mlp_forward(void *self, const vh_batch *batch, vh_mode mode,
                             const vh_unit_hooks *hooks, vh_model_output *out) {
    mlp *n = self;
    const int64_t b = batch->size;
    const void *p;
    vh_status st = hooks->gather(hooks->ctx, UNIT_FC1, &p);
    if (st != VH_STATUS_OK) return st;
    st = linear(n, batch->images.data, p, &n->layout[UNIT_FC1], b, n->m, n->k, n->h,
                VH_EPILOGUE_GELU, n->pre);
    vh_status st2 = hooks->release(hooks->ctx, UNIT_FC1);
    if (st == VH_STATUS_OK) st = st2;
    if (st != VH_STATUS_OK) return n->host->api->fail(n->host, st, "fc1 forward failed");

    if ((st = hooks->gather(hooks->ctx, UNIT_HEAD, &p)) != VH_STATUS_OK) return st;
    st = linear(n, n->h, p, &n->layout[UNIT_HEAD], b, n->c, n->m, n->logits, VH_EPILOGUE_NONE,
                NULL);
    st2 = hooks->release(hooks->ctx, UNIT_HEAD);
    if (st == VH_STATUS_OK) st = st2;
    if (st == VH_STATUS_OK) st = xent(n, batch->labels.data, b, n->loss, NULL, 0.0f);
    if (st != VH_STATUS_OK) return n->host->api->fail(n->host, st, "head forward failed");

    n->b = mode == VH_MODE_TRAIN ? b : 0;
    n->x = batch->images.data;
    n->labels = batch->labels.data;
    out->loss = n->loss;
    memset(&out->logits, 0, sizeof out->logits);
    out->logits.data = n->logits;
    out->logits.dtype = VH_DTYPE_F32;
    out->logits.device = n->dev->kind;
    out->logits.ndim = 2;
    out->logits.shape[0] = b;
    out->logits.shape[1] = n->c;
    return VH_STATUS_OK;
}

static vh_status zero(const mlp *n, void *p, int64_t floats) {
    return n->dev->memset_zero(n->dev->device, p, (size_t)floats * sizeof(float), NULL);
}

static vh_status mlp_backward(void *self, float loss_scale, const vh_unit_hooks *hooks) {
    mlp *n = self;
    const int64_t b = n->b;
    if (b == 0)
        return n->host->api->fail(n->host, VH_STATUS_ERR_INVALID_ARG,
                                  "backward without a training forward");
    const void *p;
    void *g;
    /* Activation gradients are zeroed before their first writer (backward
     * ops accumulate). */
    vh_status st = zero(n, n->dlogits, b * n->c);
    if (st == VH_STATUS_OK) st = xent(n, n->labels, b, n->loss_bw, n->dlogits, loss_scale);
    if (st == VH_STATUS_OK) st = hooks->gather(hooks->ctx, UNIT_HEAD, &p);
    if (st != VH_STATUS_OK) return st;
    st = hooks->grads(hooks->ctx, UNIT_HEAD, &g);
    if (st == VH_STATUS_OK)
        st = linear_grads(n, n->dlogits, n->h, g, &n->layout[UNIT_HEAD], b, n->c, n->m);
    if (st == VH_STATUS_OK) {
        /* dh = dlogits W2: (B, C) @ (C, M), written (beta 0) */
        vh_gemm_args gm;
        memset(&gm, 0, sizeof gm);
        gm.struct_size = sizeof gm;
        gm.m = b, gm.n = n->m, gm.k = n->c;
        gm.alpha = 1.0f;
        gm.a = n->dlogits, gm.lda = n->c;
        gm.b = (const char *)p + n->layout[UNIT_HEAD].offsets[W], gm.ldb = n->m;
        gm.c = n->dh, gm.ldc = n->m;
        st = n->dev->gemm(n->dev->device, &gm);
    }
    if (st == VH_STATUS_OK) st = hooks->reduce(hooks->ctx, UNIT_HEAD);
    vh_status st2 = hooks->release(hooks->ctx, UNIT_HEAD);
    if (st == VH_STATUS_OK) st = st2;
    if (st != VH_STATUS_OK) return st;

    /* dpre = gelu'(pre) * dh */
    st = zero(n, n->dpre, b * n->m);
    if (st == VH_STATUS_OK) {
        vh_eltwise_args e;
        memset(&e, 0, sizeof e);
        e.struct_size = sizeof e;
        e.n = b * n->m;
        e.x = n->pre;
        e.dout = n->dh;
        e.dx = n->dpre;
        st = n->dev->gelu_backward(n->dev->device, &e);
    }
    if (st == VH_STATUS_OK) st = hooks->gather(hooks->ctx, UNIT_FC1, &p);
    if (st != VH_STATUS_OK) return st;
    st = hooks->grads(hooks->ctx, UNIT_FC1, &g);
    if (st == VH_STATUS_OK)
        st = linear_grads(n, n->dpre, n->x, g, &n->layout[UNIT_FC1], b, n->m, n->k);
    if (st == VH_STATUS_OK) st = hooks->reduce(hooks->ctx, UNIT_FC1);
    st2 = hooks->release(hooks->ctx, UNIT_FC1);
    return st != VH_STATUS_OK ? st : st2;
}

static double mlp_train_flops_per_image(void *self) {
    const mlp *n = self;
    return 6.0 * (double)(n->k * n->m + n->m * n->c);
}

static const vh_model_vtable vtable = {
    .struct_size = sizeof(vh_model_vtable),
    .create = mlp_create,
    .destroy = mlp_destroy,
    .param_table = mlp_param_table,
    .init_unit = mlp_init_unit,
    .forward = mlp_forward,
    .backward = mlp_backward,
    .train_flops_per_image = mlp_train_flops_per_image,
};

VH_PLUGIN_DEFINE(VH_ROLE_MODEL, "mlp", "0.1.0", "2-layer GELU MLP on the flattened image",
                 schema, vtable);
