/* vit_forward.c - the forward pass, unit by unit through the sharding
 * hooks, and the FLOP count.
 *
 *   embed:    patches -> linear -> [cls] + pos -> dropout
 *   block l:  x_mid = x + drop_path(dropout(proj(attention(qkv(ln1(x))))))
 *             x_out = x_mid + drop_path(dropout(fc2(dropout(gelu(fc1(ln2(x_mid)))))))
 *   head:     token 0 (or mean of tokens) -> norm -> linear -> cross-entropy
 *
 * Fused where the numbers allow: fc1's GEMM applies the bias and GELU and
 * keeps the pre-activation for backward; proj's and fc2's GEMMs add the
 * residual stream when their branch draws no dropout or drop path. The loss
 * stays in device memory, and dropout masks and drop-path factors are drawn
 * on the device from counter-based seeds (vit_site_seed): a step issues no
 * host copy.
 */
#include <string.h>

#include "vit.h"
#include "vit_ops.h"

/* Draws one keep/drop factor per sample (on the device) and applies it to a
 * branch. */
static vh_status drop_path(vit *m, void *branch, float *scale, float rate, int64_t batch,
                           uint64_t seed) {
    VIT_TRY(m, "drop_path_scale", vit_drop_path_scale(m, scale, rate, batch, seed));
    VIT_TRY(m, "scale_rows", vit_scale_rows(m, branch, branch, scale, batch, 0));
    return VH_STATUS_OK;
}

/* y = residual + drop_path(dropout(x @ w^T + b)), the end of a residual
 * branch: one GEMM when the branch draws nothing (mask NULL, rate 0).
 * Dropout uses the site's seed, drop path the next site's. */
static vh_status branch_linear(vit *m, const char *op, void *y, const void *x, vit_ref w,
                               vit_ref b, const void *residual, int64_t in, void *mask,
                               float *dp_scale, float rate, int64_t B, uint64_t step,
                               uint64_t site) {
    int64_t rows = B * m->tokens, D = m->dim;
    if (!mask && rate <= 0.0f) {
        VIT_TRY(m, op, vit_linear_residual(m, y, x, w, b, residual, rows, in, D));
        return VH_STATUS_OK;
    }
    VIT_TRY(m, op, vit_linear(m, y, x, w, b, rows, in, D));
    if (mask)
        VIT_TRY(m, "dropout",
                vit_dropout(m, y, mask, y, rows * D, vit_site_seed(m, step, site)));
    if (rate > 0.0f) {
        vh_status st = drop_path(m, y, dp_scale, rate, B, vit_site_seed(m, step, site + 1));
        if (st != VH_STATUS_OK) return st;
    }
    VIT_TRY(m, "add", vit_add(m, y, y, residual, rows * D));
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

static vh_status forward_embed(vit *m, const vit_unit *u, const float *images, int64_t B,
                               int train, uint64_t step) {
    const vit_embed_index *e = &m->embed_idx;
    int64_t Np = m->num_patches, K = m->patch_dim, D = m->dim;
    vit_ref none = {NULL, VH_DTYPE_F32};
    VIT_TRY(m, "patchify", vit_patchify(m, m->patches, images, B));
    VIT_TRY(m, "patch embedding", vit_linear(m, m->patch_emb, m->patches, vit_param(u, e->proj_w),
                                             vit_param(u, e->proj_b), B * Np, K, D));
    VIT_TRY(m, "embed", vit_embed(m, m->x[0], m->patch_emb,
                                  e->cls >= 0 ? vit_param(u, e->cls) : none,
                                  vit_param(u, e->pos), B));
    if (train && m->dropout > 0.0f)
        VIT_TRY(m, "dropout", vit_dropout(m, m->x[0], m->mask_embed, m->x[0], B * m->tokens * D,
                                          vit_site_seed(m, step, 0)));
    return VH_STATUS_OK;
}

/* Recompute's end of the MLP branch: backward needs fc2's dropout mask and
 * drop-path factors, not its output (x[l + 1] is kept), so they are drawn
 * again from the seeds branch_linear used and the GEMM is skipped. The
 * masked copy lands in d_branch, which backward writes before reading. */
static vh_status redraw_branch(vit *m, void *mask, const void *x, float *dp_scale, float rate,
                               int64_t B, uint64_t step, uint64_t site) {
    if (mask)
        VIT_TRY(m, "dropout", vit_dropout(m, m->d_branch, mask, x, B * m->tokens * m->dim,
                                          vit_site_seed(m, step, site)));
    if (rate > 0.0f)
        VIT_TRY(m, "drop_path_scale",
                vit_drop_path_scale(m, dp_scale, rate, B, vit_site_seed(m, step, site + 1)));
    return VH_STATUS_OK;
}

/* One block; with `recompute`, backward's second run of it for a
 * checkpointed block: the same ops on the same inputs and seeds, so the
 * same bits, without the last GEMM (see redraw_branch). */
static vh_status forward_block(vit *m, int64_t l, const vit_unit *u, int64_t B, int train,
                               uint64_t step, int recompute) {
    vit_block_acts *a = &m->blocks[l];
    int64_t D = m->dim, M = m->mlp_dim, rows = B * m->tokens;
    const void *x = m->x[l];
    void *xm = m->x_mid[l], *xo = m->x[l + 1];
    float rate = train ? vit_drop_path_rate(m, l) : 0.0f;
    int dropout = train && m->dropout > 0.0f;
    uint64_t site = 1 + 5 * (uint64_t)l;
    vh_status st;

    VIT_TRY(m, "layernorm", vit_layernorm(m, a->ln1, a->ln1_mean, a->ln1_rstd, x,
                                          vit_param(u, VIT_NORM1_W), vit_param(u, VIT_NORM1_B),
                                          rows));
    VIT_TRY(m, "qkv", vit_linear(m, a->qkv, a->ln1, vit_param(u, VIT_QKV_W),
                                 vit_param(u, VIT_QKV_B), rows, D, 3 * D));
    VIT_TRY(m, "attention", vit_attention(m, a->attn, a->probs, a->qkv, B));
    st = branch_linear(m, "attn.proj", xm, a->attn, vit_param(u, VIT_PROJ_W),
                       vit_param(u, VIT_PROJ_B), x, D, dropout ? a->mask_proj : NULL,
                       a->dp_attn, rate, B, step, site);
    if (st != VH_STATUS_OK) return st;

    VIT_TRY(m, "layernorm", vit_layernorm(m, a->ln2, a->ln2_mean, a->ln2_rstd, xm,
                                          vit_param(u, VIT_NORM2_W), vit_param(u, VIT_NORM2_B),
                                          rows));
    VIT_TRY(m, "mlp.fc1", vit_linear_gelu(m, a->gelu, a->fc1, a->ln2, vit_param(u, VIT_FC1_W),
                                          vit_param(u, VIT_FC1_B), rows, D, M));
    if (dropout)
        VIT_TRY(m, "dropout", vit_dropout(m, a->gelu, a->mask_fc1, a->gelu, rows * M,
                                          vit_site_seed(m, step, site + 2)));
    if (recompute)
        return redraw_branch(m, dropout ? a->mask_fc2 : NULL, xo, a->dp_mlp, rate, B, step,
                             site + 3);
    return branch_linear(m, "mlp.fc2", xo, a->gelu, vit_param(u, VIT_FC2_W),
                         vit_param(u, VIT_FC2_B), xm, M, dropout ? a->mask_fc2 : NULL,
                         a->dp_mlp, rate, B, step, site + 3);
}

/* The batch's soft targets in device memory (ABI 2.2: mixup/cutmix), or
 * NULL: the labels. The label smoothing is inside them, so ours yields. */
static vh_status batch_targets(vit *m, const vh_batch *batch, const float **out) {
    *out = NULL;
    if (!VH_STRUCT_HAS(batch, vh_batch, targets) || !batch->targets.data) return VH_STATUS_OK;
    const vh_tensor *t = &batch->targets;
    const vh_host_api *api = m->host->api;
    if (t->dtype != VH_DTYPE_F32 || t->ndim != 2 || t->shape[0] != batch->size ||
        t->shape[1] != m->classes)
        return api->fail(m->host, VH_STATUS_ERR_INVALID_ARG,
                         "the batch's soft targets are not (%lld, %lld) f32 (the data "
                         "plugin's classes differ from num_classes?)",
                         (long long)batch->size, (long long)m->classes);
    if (m->label_smoothing > 0.0f && !m->told_smoothing) {
        m->told_smoothing = 1;
        api->log(m->host, VH_LOG_LEVEL_INFO,
                 "label_smoothing %g does not apply to the data's soft targets (mixup/cutmix: "
                 "data.mix_label_smoothing does)",
                 (double)m->label_smoothing);
    }
    if (m->dev->kind == VH_DEVICE_KIND_CPU) { /* device memory is host memory */
        *out = t->data;
        return VH_STATUS_OK;
    }
    const size_t bytes = (size_t)batch->size * (size_t)m->classes * sizeof(float);
    vh_status st = VH_STATUS_OK;
    if (!m->targets_dev)
        st = m->dev->alloc(m->dev->device,
                           (size_t)m->max_batch * (size_t)m->classes * sizeof(float),
                           (void **)&m->targets_dev);
    if (st == VH_STATUS_OK)
        st = m->dev->copy(m->dev->device, m->targets_dev, t->data, bytes,
                          VH_COPY_KIND_HOST_TO_DEVICE, NULL);
    if (st != VH_STATUS_OK)
        return api->fail(m->host, st, "cannot copy the batch's soft targets to %s",
                         m->dev->name);
    *out = m->targets_dev;
    return VH_STATUS_OK;
}

static vh_status forward_head(vit *m, const vit_unit *u, const int32_t *labels,
                              const float *targets, int64_t B) {
    int64_t D = m->dim;
    VIT_TRY(m, "pool", vit_pool(m, m->feat, m->x[m->depth], B));
    VIT_TRY(m, "layernorm", vit_layernorm(m, m->feat_ln, m->feat_mean, m->feat_rstd, m->feat,
                                          vit_param(u, VIT_HEAD_NORM_W),
                                          vit_param(u, VIT_HEAD_NORM_B), B));
    VIT_TRY(m, "head", vit_linear(m, m->logits, m->feat_ln, vit_param(u, VIT_HEAD_W),
                                  vit_param(u, VIT_HEAD_B), B, D, m->classes));
    VIT_TRY(m, "cross-entropy", vit_cross_entropy(m, &m->loss[0], NULL, m->logits, labels,
                                                  targets, B, 1.0f));
    return VH_STATUS_OK;
}

vh_status vit_forward(void *self, const vh_batch *batch, vh_mode mode,
                      const vh_unit_hooks *hooks, vh_model_output *out) {
    vit *m = self;
    vh_status st = check_batch(m, batch);
    const float *targets = NULL;
    if (st == VH_STATUS_OK) st = batch_targets(m, batch, &targets);
    if (st != VH_STATUS_OK) return st;
    int train = mode == VH_MODE_TRAIN;
    int64_t B = batch->size, L = m->depth;
    uint64_t step = m->train_forwards;
    m->has_forward = 0; /* the activations are about to change */

    vit_unit u = {.layouts = &m->embed_layouts};
    st = hooks->gather(hooks->ctx, 0, &u.params);
    if (st == VH_STATUS_OK) st = forward_embed(m, &u, batch->images.data, B, train, step);
    if (st == VH_STATUS_OK) st = hooks->release(hooks->ctx, 0);
    u.layouts = &m->block_layouts;
    for (int64_t l = 0; l < L && st == VH_STATUS_OK; l++) {
        st = hooks->gather(hooks->ctx, (int32_t)(l + 1), &u.params);
        if (st == VH_STATUS_OK) st = forward_block(m, l, &u, B, train, step, 0);
        if (st == VH_STATUS_OK) st = hooks->release(hooks->ctx, (int32_t)(l + 1));
    }
    u.layouts = &m->head_layouts;
    if (st == VH_STATUS_OK) st = hooks->gather(hooks->ctx, (int32_t)(L + 1), &u.params);
    if (st == VH_STATUS_OK) st = forward_head(m, &u, batch->labels.data, targets, B);
    if (st == VH_STATUS_OK) st = hooks->release(hooks->ctx, (int32_t)(L + 1));
    if (st != VH_STATUS_OK) return st;

    out->loss = &m->loss[0];
    memset(&out->logits, 0, sizeof out->logits);
    out->logits.data = m->logits;
    out->logits.dtype = m->act;
    out->logits.device = m->dev->kind;
    out->logits.ndim = 2;
    out->logits.shape[0] = B;
    out->logits.shape[1] = m->classes;
    if (train) {
        m->batch = B;
        m->labels = batch->labels.data;
        m->targets = targets;
        m->has_forward = 1;
        m->forward_step = step;
        m->train_forwards++;
    }
    return VH_STATUS_OK;
}

/* Backward's forward of checkpointed block l: the training forward's step,
 * so the dropout masks and drop-path factors are the ones it drew. */
vh_status vit_recompute_block(vit *m, int64_t l, const vit_unit *u, int64_t batch) {
    return forward_block(m, l, u, batch, 1, m->forward_step, 1);
}

/* pycls convention: training FLOPs = 3 x forward = 6 x multiply-accumulates
 * of every matmul, attention's two included. Checkpointing's recompute is
 * not counted: MFU counts the model's FLOPs, not the work it adds. */
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
