/* vit_forward.c - the forward pass, unit by unit through the sharding
 * hooks, and the FLOP count.
 *
 *   embed:    patches -> linear -> [cls] + pos -> dropout
 *   block l:  x_mid = x + drop_path(dropout(proj(attention(qkv(ln1(x))))))
 *             x_out = x_mid + drop_path(dropout(fc2(dropout(gelu(fc1(ln2(x_mid)))))))
 *   head:     token 0 (or mean of tokens) -> norm -> linear -> cross-entropy
 */
#include <math.h>
#include <string.h>
#include "vithost/vh_random.h"

#include "vit.h"
#include "vit_ops.h"

vh_status vit_op_failed(vit *m, vh_status st, const char *op) {
    return m->host->api->fail(m->host, st, "%s failed on %s (%s)", op, m->dev->name,
                              vh_status_str(st));
}

vh_status vit_linear_forward(vit *m, float *y, const float *x, const float *w, const float *b,
                             int64_t rows, int64_t in, int64_t out) {
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = 0, .trans_b = 1,
                      .m = rows, .n = out, .k = in, .alpha = 1.0f, .beta = 0.0f,
                      .a = x, .lda = in, .b = w, .ldb = in, .c = y, .ldc = out,
                      .batch = 1, .bias = b};
    return m->dev->gemm(m->dev->device, &g);
}

vh_status vit_linear_backward(vit *m, float *dx, float *dw, float *db, const float *dy,
                              const float *x, const float *w, int64_t rows, int64_t in,
                              int64_t out) {
    const vh_device_ops *d = m->dev;
    /* dw (out, in) += dy^T (out, rows) @ x (rows, in) */
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = 1, .trans_b = 0,
                      .m = out, .n = in, .k = rows, .alpha = 1.0f, .beta = 1.0f,
                      .a = dy, .lda = out, .b = x, .ldb = in, .c = dw, .ldc = in, .batch = 1};
    vh_status st = d->gemm(d->device, &g);
    if (st == VH_STATUS_OK && db) st = d->bias_backward(d->device, db, dy, rows, out);
    if (st != VH_STATUS_OK || !dx) return st;
    /* dx (rows, in) = dy (rows, out) @ w (out, in) */
    vh_gemm_args h = {.struct_size = sizeof h, .trans_a = 0, .trans_b = 0,
                      .m = rows, .n = in, .k = out, .alpha = 1.0f, .beta = 0.0f,
                      .a = dy, .lda = out, .b = w, .ldb = in, .c = dx, .ldc = in, .batch = 1};
    return d->gemm(d->device, &h);
}

vh_attention_args vit_attention_args(const vit *m, int64_t batch, const float *qkv, float *out,
                                     float *probs) {
    vh_attention_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.batch = batch;
    a.tokens = m->tokens;
    a.heads = m->heads;
    a.head_dim = m->head_dim;
    /* qkv rows are 3D wide, out rows D wide; the layout only moves rows. */
    a.qkv_batch_stride = 3 * vit_batch_stride(m);
    a.qkv_token_stride = 3 * vit_token_stride(m, batch);
    a.out_batch_stride = vit_batch_stride(m);
    a.out_token_stride = vit_token_stride(m, batch);
    a.scale = 1.0f / sqrtf((float)m->head_dim);
    a.qkv = qkv;
    a.out = out;
    a.probs = probs;
    return a;
}

float vit_drop_path_rate(const vit *m, int64_t l) {
    if (m->depth < 2) return 0.0f;
    return m->drop_path * (float)l / (float)(m->depth - 1);
}


uint64_t vit_site_seed(const vit *m, uint64_t step, uint64_t site) {
    return vh_splitmix64(m->dropout_seed ^ vh_splitmix64(step * 1024u + site));
}

/* Draws one keep/drop factor per sample and applies it to a branch. */
static vh_status drop_path(vit *m, float *branch, float *scale, float rate, int64_t batch,
                           uint64_t seed) {
    for (int64_t b = 0; b < batch; b++) {
        double u = (double)(vh_splitmix64(seed + (uint64_t)b) >> 11) * 0x1.0p-53;
        m->dp_host[b] = u < rate ? 0.0f : 1.0f / (1.0f - rate);
    }
    const vh_device_ops *d = m->dev;
    VIT_TRY(m, "copy", d->copy(d->device, scale, m->dp_host, (size_t)batch * sizeof(float),
                               VH_COPY_KIND_HOST_TO_DEVICE));
    int64_t rows = batch * m->tokens;
    int64_t div = m->layout == VIT_LAYOUT_BATCH_FIRST ? m->tokens : 1;
    VIT_TRY(m, "scale_rows", d->scale_rows(d->device, branch, branch, scale, rows, m->dim, div,
                                           batch, 0));
    return VH_STATUS_OK;
}

static vh_status check_batch(vit *m, const vh_batch *batch) {
    const vh_tensor *im = &batch->images;
    if (batch->size < 1 || batch->size > m->max_batch || im->ndim != 4 ||
        im->dtype != VH_DTYPE_F32 || im->shape[0] != batch->size ||
        im->shape[1] != m->channels || im->shape[2] != m->image_h ||
        im->shape[3] != m->image_w || batch->labels.dtype != VH_DTYPE_I32)
        return m->host->api->fail(m->host, VH_STATUS_ERR_INVALID_ARG,
                                  "batch of %lld images does not fit the model (%lld x %lld x "
                                  "%lld f32, at most %lld per batch)",
                                  (long long)batch->size, (long long)m->channels,
                                  (long long)m->image_h, (long long)m->image_w,
                                  (long long)m->max_batch);
    return VH_STATUS_OK;
}

static vh_status forward_embed(vit *m, const float *p, const float *images, int64_t B,
                               int train, uint64_t step) {
    const vh_device_ops *d = m->dev;
    int64_t Np = m->num_patches, K = m->patch_dim, D = m->dim;
    VIT_TRY(m, "patchify", d->patchify(d->device, m->patches, images, B, m->channels,
                                       m->image_h, m->image_w, m->patch, Np * K, K));
    VIT_TRY(m, "patch embedding", vit_linear_forward(m, m->patch_emb, m->patches,
                                                     p + m->embed_off.proj_w,
                                                     p + m->embed_off.proj_b, B * Np, K, D));
    const float *cls = m->embed_off.cls >= 0 ? p + m->embed_off.cls : NULL;
    VIT_TRY(m, "embed", d->embed_forward(d->device, m->x[0], m->patch_emb, cls,
                                         p + m->embed_off.pos, B, Np, D, vit_batch_stride(m),
                                         vit_token_stride(m, B), Np * D, D));
    if (train && m->dropout > 0.0f)
        VIT_TRY(m, "dropout", d->dropout_forward(d->device, m->x[0], m->mask_embed, m->x[0],
                                                 B * m->tokens * D, m->dropout,
                                                 vit_site_seed(m, step, 0)));
    return VH_STATUS_OK;
}

static vh_status forward_block(vit *m, int64_t l, const float *p, int64_t B, int train,
                               uint64_t step) {
    const vh_device_ops *d = m->dev;
    const vit_block_offsets *o = &m->block_off;
    vit_block_acts *a = &m->blocks[l];
    int64_t D = m->dim, M = m->mlp_dim, rows = B * m->tokens;
    const float *x = m->x[l];
    float *xm = m->x_mid[l], *xo = m->x[l + 1];
    float rate = train ? vit_drop_path_rate(m, l) : 0.0f;
    int dropout = train && m->dropout > 0.0f;
    uint64_t site = 1 + 5 * (uint64_t)l;

    VIT_TRY(m, "layernorm", d->layernorm_forward(d->device, a->ln1, a->ln1_mean, a->ln1_rstd, x,
                                                 p + o->norm1_w, p + o->norm1_b, rows, D, m->eps));
    VIT_TRY(m, "qkv", vit_linear_forward(m, a->qkv, a->ln1, p + o->qkv_w, p + o->qkv_b, rows, D,
                                         3 * D));
    vh_attention_args at = vit_attention_args(m, B, a->qkv, a->attn, a->probs);
    VIT_TRY(m, "attention", d->attention_forward(d->device, &at));
    VIT_TRY(m, "attn.proj", vit_linear_forward(m, xm, a->attn, p + o->proj_w, p + o->proj_b,
                                               rows, D, D));
    if (dropout)
        VIT_TRY(m, "dropout", d->dropout_forward(d->device, xm, a->mask_proj, xm, rows * D,
                                                 m->dropout, vit_site_seed(m, step, site)));
    if (rate > 0.0f) {
        vh_status st = drop_path(m, xm, a->dp_attn, rate, B, vit_site_seed(m, step, site + 1));
        if (st != VH_STATUS_OK) return st;
    }
    VIT_TRY(m, "add", d->add(d->device, xm, xm, x, rows * D));

    VIT_TRY(m, "layernorm", d->layernorm_forward(d->device, a->ln2, a->ln2_mean, a->ln2_rstd, xm,
                                                 p + o->norm2_w, p + o->norm2_b, rows, D, m->eps));
    VIT_TRY(m, "mlp.fc1", vit_linear_forward(m, a->fc1, a->ln2, p + o->fc1_w, p + o->fc1_b,
                                             rows, D, M));
    VIT_TRY(m, "gelu", d->gelu_forward(d->device, a->gelu, a->fc1, rows * M));
    if (dropout)
        VIT_TRY(m, "dropout", d->dropout_forward(d->device, a->gelu, a->mask_fc1, a->gelu,
                                                 rows * M, m->dropout,
                                                 vit_site_seed(m, step, site + 2)));
    VIT_TRY(m, "mlp.fc2", vit_linear_forward(m, xo, a->gelu, p + o->fc2_w, p + o->fc2_b, rows,
                                             M, D));
    if (dropout)
        VIT_TRY(m, "dropout", d->dropout_forward(d->device, xo, a->mask_fc2, xo, rows * D,
                                                 m->dropout, vit_site_seed(m, step, site + 3)));
    if (rate > 0.0f) {
        vh_status st = drop_path(m, xo, a->dp_mlp, rate, B, vit_site_seed(m, step, site + 4));
        if (st != VH_STATUS_OK) return st;
    }
    VIT_TRY(m, "add", d->add(d->device, xo, xo, xm, rows * D));
    return VH_STATUS_OK;
}

static vh_status forward_head(vit *m, const float *p, const int32_t *labels, int64_t B,
                              float *loss) {
    const vh_device_ops *d = m->dev;
    int64_t D = m->dim;
    int pooled = m->classifier == VIT_CLASSIFIER_POOLED;
    /* The class token is token 0; the pooled head averages every token
     * (there is no class token then). */
    VIT_TRY(m, "pool", d->mean_pool_forward(d->device, m->feat, m->x[m->depth], B, 0,
                                            pooled ? m->tokens : 1, D, vit_batch_stride(m),
                                            vit_token_stride(m, B)));
    VIT_TRY(m, "layernorm", d->layernorm_forward(d->device, m->feat_ln, m->feat_mean,
                                                 m->feat_rstd, m->feat, p + m->head_off.norm_w,
                                                 p + m->head_off.norm_b, B, D, m->eps));
    VIT_TRY(m, "head", vit_linear_forward(m, m->logits, m->feat_ln, p + m->head_off.head_w,
                                          p + m->head_off.head_b, B, D, m->classes));
    VIT_TRY(m, "cross-entropy", d->softmax_cross_entropy(d->device, loss, NULL, m->logits, labels,
                                                         B, m->classes, m->label_smoothing,
                                                         1.0f));
    return VH_STATUS_OK;
}

vh_status vit_forward(void *self, const vh_batch *batch, vh_mode mode,
                      const vh_unit_hooks *hooks, vh_model_output *out) {
    vit *m = self;
    vh_status st = check_batch(m, batch);
    if (st != VH_STATUS_OK) return st;
    int train = mode == VH_MODE_TRAIN;
    int64_t B = batch->size, L = m->depth;
    uint64_t step = m->train_forwards;
    m->has_forward = 0; /* the activations are about to change */

    const void *p;
    st = hooks->gather(hooks->ctx, 0, &p);
    if (st == VH_STATUS_OK) st = forward_embed(m, p, batch->images.data, B, train, step);
    if (st == VH_STATUS_OK) st = hooks->release(hooks->ctx, 0);
    for (int64_t l = 0; l < L && st == VH_STATUS_OK; l++) {
        st = hooks->gather(hooks->ctx, (int32_t)(l + 1), &p);
        if (st == VH_STATUS_OK) st = forward_block(m, l, p, B, train, step);
        if (st == VH_STATUS_OK) st = hooks->release(hooks->ctx, (int32_t)(l + 1));
    }
    float loss = 0.0f;
    if (st == VH_STATUS_OK) st = hooks->gather(hooks->ctx, (int32_t)(L + 1), &p);
    if (st == VH_STATUS_OK) st = forward_head(m, p, batch->labels.data, B, &loss);
    if (st == VH_STATUS_OK) st = hooks->release(hooks->ctx, (int32_t)(L + 1));
    if (st != VH_STATUS_OK) return st;

    out->loss = loss;
    memset(&out->logits, 0, sizeof out->logits);
    out->logits.data = m->logits;
    out->logits.dtype = VH_DTYPE_F32;
    out->logits.device = m->dev->kind;
    out->logits.ndim = 2;
    out->logits.shape[0] = B;
    out->logits.shape[1] = m->classes;
    if (train) {
        m->batch = B;
        m->labels = batch->labels.data;
        m->has_forward = 1;
        m->train_forwards++;
    }
    return VH_STATUS_OK;
}

/* pycls convention: training FLOPs = 3 x forward = 6 x multiply-accumulates
 * of every matmul, attention's two included. */
double vit_train_flops_per_image(void *self) {
    const vit *m = self;
    double N = (double)m->tokens, D = (double)m->dim, M = (double)m->mlp_dim;
    double macs = (double)m->num_patches * (double)m->patch_dim * D; /* patch embedding */
    double block = N * D * 3.0 * D   /* qkv */
                   + 2.0 * N * N * D /* q k^T and probs v, over all heads */
                   + N * D * D       /* proj */
                   + 2.0 * N * D * M /* fc1, fc2 */;
    macs += (double)m->depth * block;
    macs += D * (double)m->classes; /* head */
    return 6.0 * macs;
}
