/* vit_backward.c - the backward pass: forward's steps in reverse, unit by
 * unit (head, blocks L-1..0, embed). Device ops accumulate into gradients,
 * so the residual stream's gradient d_x simply collects both branches. */
#include <string.h>

#include "vit.h"
#include "vit_ops.h"

static vh_status zero(vit *m, float *p, int64_t count) {
    return m->dev->memset_zero(m->dev->device, p, (size_t)count * sizeof(float));
}

/* The gradient that reaches a branch from the residual stream, through its
 * drop path and dropout; d_x itself when the branch has neither. */
static vh_status branch_grad(vit *m, const float **out, const float *dp_scale, const float *mask,
                             int64_t B) {
    const vh_device_ops *d = m->dev;
    int64_t rows = B * m->tokens, n = rows * m->dim;
    const float *src = m->d_x;
    if (dp_scale) {
        int64_t div = m->layout == VIT_LAYOUT_BATCH_FIRST ? m->tokens : 1;
        VIT_TRY(m, "scale_rows", d->scale_rows(d->device, m->d_branch, src, dp_scale, rows,
                                               m->dim, div, B, 0));
        src = m->d_branch;
    }
    if (mask) {
        VIT_TRY(m, "mul", d->mul(d->device, m->d_branch, src, mask, n, 0));
        src = m->d_branch;
    }
    *out = src;
    return VH_STATUS_OK;
}

static vh_status backward_head(vit *m, const float *p, float *g, int64_t B, float loss_scale) {
    const vh_device_ops *d = m->dev;
    int64_t D = m->dim, C = m->classes;
    int pooled = m->classifier == VIT_CLASSIFIER_POOLED;
    float loss;
    VIT_TRY(m, "zero", zero(m, m->d_logits, B * C));
    VIT_TRY(m, "cross-entropy", d->softmax_cross_entropy(d->device, &loss, m->d_logits, m->logits,
                                                         m->labels, B, C, m->label_smoothing,
                                                         loss_scale));
    VIT_TRY(m, "head", vit_linear_backward(m, m->d_feat_ln, g + m->head_off.head_w,
                                           g + m->head_off.head_b, m->d_logits, m->feat_ln,
                                           p + m->head_off.head_w, B, D, C));
    VIT_TRY(m, "zero", zero(m, m->d_feat, B * D));
    VIT_TRY(m, "layernorm", d->layernorm_backward(d->device, m->d_feat, g + m->head_off.norm_w,
                                                  g + m->head_off.norm_b, m->d_feat_ln, m->feat,
                                                  p + m->head_off.norm_w, m->feat_mean,
                                                  m->feat_rstd, B, D));
    VIT_TRY(m, "zero", zero(m, m->d_x, B * m->tokens * D));
    VIT_TRY(m, "pool", d->mean_pool_backward(d->device, m->d_x, m->d_feat, B, 0,
                                             pooled ? m->tokens : 1, D, vit_batch_stride(m),
                                             vit_token_stride(m, B)));
    return VH_STATUS_OK;
}

static vh_status backward_block(vit *m, int64_t l, const float *p, float *g, int64_t B) {
    const vh_device_ops *d = m->dev;
    const vit_block_offsets *o = &m->block_off;
    vit_block_acts *a = &m->blocks[l];
    int64_t D = m->dim, M = m->mlp_dim, rows = B * m->tokens;
    int dropout = m->dropout > 0.0f, dropped = vit_drop_path_rate(m, l) > 0.0f;
    const float *dy;
    vh_status st;

    /* MLP branch: x_out = x_mid + branch(fc2(gelu(fc1(ln2(x_mid))))) */
    st = branch_grad(m, &dy, dropped ? a->dp_mlp : NULL, dropout ? a->mask_fc2 : NULL, B);
    if (st != VH_STATUS_OK) return st;
    VIT_TRY(m, "mlp.fc2", vit_linear_backward(m, m->d_mlp, g + o->fc2_w, g + o->fc2_b, dy,
                                              a->gelu, p + o->fc2_w, rows, M, D));
    if (dropout) VIT_TRY(m, "mul", d->mul(d->device, m->d_mlp, m->d_mlp, a->mask_fc1, rows * M, 0));
    VIT_TRY(m, "zero", zero(m, m->d_mlp2, rows * M));
    VIT_TRY(m, "gelu", d->gelu_backward(d->device, m->d_mlp2, a->fc1, m->d_mlp, rows * M));
    VIT_TRY(m, "mlp.fc1", vit_linear_backward(m, m->d_tmp, g + o->fc1_w, g + o->fc1_b, m->d_mlp2,
                                              a->ln2, p + o->fc1_w, rows, D, M));
    VIT_TRY(m, "layernorm", d->layernorm_backward(d->device, m->d_x, g + o->norm2_w,
                                                  g + o->norm2_b, m->d_tmp, m->x_mid[l],
                                                  p + o->norm2_w, a->ln2_mean, a->ln2_rstd, rows,
                                                  D));

    /* attention branch: x_mid = x + branch(proj(attention(qkv(ln1(x))))) */
    st = branch_grad(m, &dy, dropped ? a->dp_attn : NULL, dropout ? a->mask_proj : NULL, B);
    if (st != VH_STATUS_OK) return st;
    VIT_TRY(m, "attn.proj", vit_linear_backward(m, m->d_tmp, g + o->proj_w, g + o->proj_b, dy,
                                                a->attn, p + o->proj_w, rows, D, D));
    VIT_TRY(m, "zero", zero(m, m->d_qkv, rows * 3 * D));
    vh_attention_args at = vit_attention_args(m, B, a->qkv, a->attn, a->probs);
    at.dout = m->d_tmp;
    at.dqkv = m->d_qkv;
    VIT_TRY(m, "attention", d->attention_backward(d->device, &at));
    VIT_TRY(m, "qkv", vit_linear_backward(m, m->d_tmp, g + o->qkv_w, g + o->qkv_b, m->d_qkv,
                                          a->ln1, p + o->qkv_w, rows, D, 3 * D));
    VIT_TRY(m, "layernorm", d->layernorm_backward(d->device, m->d_x, g + o->norm1_w,
                                                  g + o->norm1_b, m->d_tmp, m->x[l],
                                                  p + o->norm1_w, a->ln1_mean, a->ln1_rstd, rows,
                                                  D));
    return VH_STATUS_OK;
}

static vh_status backward_embed(vit *m, const float *p, float *g, int64_t B) {
    const vh_device_ops *d = m->dev;
    int64_t Np = m->num_patches, D = m->dim;
    if (m->dropout > 0.0f)
        VIT_TRY(m, "mul", d->mul(d->device, m->d_x, m->d_x, m->mask_embed, B * m->tokens * D, 0));
    VIT_TRY(m, "zero", zero(m, m->d_patch_emb, B * Np * D));
    float *dcls = m->embed_off.cls >= 0 ? g + m->embed_off.cls : NULL;
    VIT_TRY(m, "embed", d->embed_backward(d->device, m->d_patch_emb, dcls, g + m->embed_off.pos,
                                          m->d_x, B, Np, D, vit_batch_stride(m),
                                          vit_token_stride(m, B), Np * D, D));
    /* The images need no gradient. */
    VIT_TRY(m, "patch embedding", vit_linear_backward(m, NULL, g + m->embed_off.proj_w,
                                                      g + m->embed_off.proj_b, m->d_patch_emb,
                                                      m->patches, p + m->embed_off.proj_w,
                                                      B * Np, m->patch_dim, D));
    return VH_STATUS_OK;
}

/* One unit's backward between gather/grads and reduce/release. */
typedef enum unit_kind { UNIT_HEAD, UNIT_BLOCK, UNIT_EMBED } unit_kind;

static vh_status backward_unit(vit *m, const vh_unit_hooks *hooks, int32_t unit, unit_kind kind,
                               float loss_scale) {
    const void *p;
    void *g;
    vh_status st = hooks->gather(hooks->ctx, unit, &p);
    if (st == VH_STATUS_OK) st = hooks->grads(hooks->ctx, unit, &g);
    if (st != VH_STATUS_OK) return st;
    switch (kind) {
    case UNIT_HEAD: st = backward_head(m, p, g, m->batch, loss_scale); break;
    case UNIT_BLOCK: st = backward_block(m, unit - 1, p, g, m->batch); break;
    case UNIT_EMBED: st = backward_embed(m, p, g, m->batch); break;
    }
    if (st == VH_STATUS_OK) st = hooks->reduce(hooks->ctx, unit);
    if (st == VH_STATUS_OK) st = hooks->release(hooks->ctx, unit);
    return st;
}

vh_status vit_backward(void *self, float loss_scale, const vh_unit_hooks *hooks) {
    vit *m = self;
    if (!m->has_forward)
        return m->host->api->fail(m->host, VH_STATUS_ERR_INVALID_ARG,
                                  "backward without a training forward before it");
    int32_t L = (int32_t)m->depth;
    vh_status st = backward_unit(m, hooks, L + 1, UNIT_HEAD, loss_scale);
    for (int32_t l = L - 1; l >= 0 && st == VH_STATUS_OK; l--)
        st = backward_unit(m, hooks, l + 1, UNIT_BLOCK, loss_scale);
    if (st == VH_STATUS_OK) st = backward_unit(m, hooks, 0, UNIT_EMBED, loss_scale);
    m->has_forward = 0;
    return st;
}
