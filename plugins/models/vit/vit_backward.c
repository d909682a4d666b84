/* vit_backward.c - the backward pass: forward's steps in reverse, unit by
 * unit (head, blocks L-1..0, embed). Device ops accumulate into gradients,
 * so the residual stream's gradient d_x simply collects both branches. */
#include <string.h>

#include "vit.h"
#include "vit_ops.h"

/* The gradient that reaches a branch from the residual stream, through its
 * drop path and dropout; d_x itself when the branch has neither. */
static vh_status branch_grad(vit *m, const void **out, const float *dp_scale, const void *mask,
                             int64_t B) {
    int64_t n = B * m->tokens * m->dim;
    const void *src = m->d_x;
    if (dp_scale) {
        VIT_TRY(m, "scale_rows", vit_scale_rows(m, m->d_branch, src, dp_scale, B, 0));
        src = m->d_branch;
    }
    if (mask) {
        VIT_TRY(m, "mul", vit_mul(m, m->d_branch, src, mask, n));
        src = m->d_branch;
    }
    *out = src;
    return VH_STATUS_OK;
}

static vh_status backward_head(vit *m, const vit_unit *u, int64_t B, float loss_scale) {
    int64_t D = m->dim, C = m->classes;
    VIT_TRY(m, "zero", vit_zero(m, m->d_logits, B * C));
    /* the loss again, into scratch: forward's stays for the host */
    VIT_TRY(m, "cross-entropy", vit_cross_entropy(m, &m->loss[1], m->d_logits, m->logits,
                                                  m->labels, m->targets, B, loss_scale));
    VIT_TRY(m, "head", vit_linear_backward(m, m->d_feat_ln, vit_grad(u, VIT_HEAD_W),
                                           vit_grad(u, VIT_HEAD_B), m->d_logits, m->feat_ln,
                                           vit_param(u, VIT_HEAD_W), B, D, C));
    VIT_TRY(m, "zero", vit_zero(m, m->d_feat, B * D));
    VIT_TRY(m, "layernorm", vit_layernorm_backward(m, m->d_feat, vit_grad(u, VIT_HEAD_NORM_W),
                                                   vit_grad(u, VIT_HEAD_NORM_B), m->d_feat_ln,
                                                   m->feat, vit_param(u, VIT_HEAD_NORM_W),
                                                   m->feat_mean, m->feat_rstd, B));
    VIT_TRY(m, "zero", vit_zero(m, m->d_x, B * m->tokens * D));
    VIT_TRY(m, "pool", vit_pool_backward(m, m->d_x, m->d_feat, B));
    return VH_STATUS_OK;
}

static vh_status backward_block(vit *m, int64_t l, const vit_unit *u, int64_t B) {
    vit_block_acts *a = &m->blocks[l];
    int64_t D = m->dim, M = m->mlp_dim, rows = B * m->tokens;
    int dropout = m->dropout > 0.0f, dropped = vit_drop_path_rate(m, l) > 0.0f;
    const void *dy;
    vh_status st;

    /* MLP branch: x_out = x_mid + branch(fc2(gelu(fc1(ln2(x_mid))))) */
    st = branch_grad(m, &dy, dropped ? a->dp_mlp : NULL, dropout ? a->mask_fc2 : NULL, B);
    if (st != VH_STATUS_OK) return st;
    if (m->gelu_grad_in_aux && !dropout) {
        /* fc1 holds gelu'(T): d_mlp2 = (dy @ W2) * gelu'(T) in fc2's dX GEMM */
        VIT_TRY(m, "mlp.fc2", vit_linear_backward_mul(m, m->d_mlp2, vit_grad(u, VIT_FC2_W),
                                                      vit_grad(u, VIT_FC2_B), dy, a->gelu,
                                                      vit_param(u, VIT_FC2_W), rows, M, D,
                                                      a->fc1));
    } else if (m->gelu_backward_in_gemm && !dropout) {
        /* fc1 holds T: d_mlp2 = gelu_backward(T, dy @ W2) in fc2's dX GEMM */
        VIT_TRY(m, "mlp.fc2", vit_linear_backward_gelu(m, m->d_mlp2, vit_grad(u, VIT_FC2_W),
                                                       vit_grad(u, VIT_FC2_B), dy, a->gelu,
                                                       vit_param(u, VIT_FC2_W), rows, M, D,
                                                       a->fc1));
    } else {
        VIT_TRY(m, "mlp.fc2", vit_linear_backward(m, m->d_mlp, vit_grad(u, VIT_FC2_W),
                                                  vit_grad(u, VIT_FC2_B), dy, a->gelu,
                                                  vit_param(u, VIT_FC2_W), rows, M, D));
        if (dropout) VIT_TRY(m, "mul", vit_mul(m, m->d_mlp, m->d_mlp, a->mask_fc1, rows * M));
        if (m->gelu_grad_in_aux) /* the mask first, as gelu_backward's dout */
            VIT_TRY(m, "mul", vit_mul(m, m->d_mlp2, m->d_mlp, a->fc1, rows * M));
        else
            VIT_TRY(m, "gelu", vit_gelu_backward(m, m->d_mlp2, a->fc1, m->d_mlp, rows * M));
    }
    VIT_TRY(m, "mlp.fc1", vit_linear_backward(m, m->d_tmp, vit_grad(u, VIT_FC1_W),
                                              vit_grad(u, VIT_FC1_B), m->d_mlp2, a->ln2,
                                              vit_param(u, VIT_FC1_W), rows, D, M));
    VIT_TRY(m, "layernorm", vit_layernorm_backward(m, m->d_x, vit_grad(u, VIT_NORM2_W),
                                                   vit_grad(u, VIT_NORM2_B), m->d_tmp,
                                                   m->x_mid[l], vit_param(u, VIT_NORM2_W),
                                                   a->ln2_mean, a->ln2_rstd, rows));

    /* attention branch: x_mid = x + branch(proj(attention(qkv(ln1(x))))) */
    st = branch_grad(m, &dy, dropped ? a->dp_attn : NULL, dropout ? a->mask_proj : NULL, B);
    if (st != VH_STATUS_OK) return st;
    VIT_TRY(m, "attn.proj", vit_linear_backward(m, m->d_tmp, vit_grad(u, VIT_PROJ_W),
                                                vit_grad(u, VIT_PROJ_B), dy, a->attn,
                                                vit_param(u, VIT_PROJ_W), rows, D, D));
    VIT_TRY(m, "attention", vit_attention_backward(m, m->d_qkv, m->d_tmp, a->qkv, a->attn,
                                                   a->probs, B));
    VIT_TRY(m, "qkv", vit_linear_backward(m, m->d_tmp, vit_grad(u, VIT_QKV_W),
                                          vit_grad(u, VIT_QKV_B), m->d_qkv, a->ln1,
                                          vit_param(u, VIT_QKV_W), rows, D, 3 * D));
    VIT_TRY(m, "layernorm", vit_layernorm_backward(m, m->d_x, vit_grad(u, VIT_NORM1_W),
                                                   vit_grad(u, VIT_NORM1_B), m->d_tmp, m->x[l],
                                                   vit_param(u, VIT_NORM1_W), a->ln1_mean,
                                                   a->ln1_rstd, rows));
    return VH_STATUS_OK;
}

static vh_status backward_embed(vit *m, const vit_unit *u, int64_t B) {
    const vit_embed_index *e = &m->embed_idx;
    int64_t Np = m->num_patches, D = m->dim;
    vit_ref none = {NULL, VH_DTYPE_F32};
    if (m->dropout > 0.0f)
        VIT_TRY(m, "mul", vit_mul(m, m->d_x, m->d_x, m->mask_embed, B * m->tokens * D));
    VIT_TRY(m, "zero", vit_zero(m, m->d_patch_emb, B * Np * D));
    VIT_TRY(m, "embed", vit_embed_backward(m, m->d_patch_emb,
                                           e->cls >= 0 ? vit_grad(u, e->cls) : none,
                                           vit_grad(u, e->pos), m->d_x, B));
    /* The images need no gradient. */
    VIT_TRY(m, "patch embedding", vit_linear_backward(m, NULL, vit_grad(u, e->proj_w),
                                                      vit_grad(u, e->proj_b), m->d_patch_emb,
                                                      m->patches, vit_param(u, e->proj_w),
                                                      B * Np, m->patch_dim, D));
    return VH_STATUS_OK;
}

/* One unit's backward between gather/grads and reduce/release. */
typedef enum unit_kind { UNIT_HEAD, UNIT_BLOCK, UNIT_EMBED } unit_kind;

static vh_status backward_unit(vit *m, const vh_unit_hooks *hooks, int32_t unit, unit_kind kind,
                               float loss_scale) {
    vit_unit u = {.layouts = kind == UNIT_HEAD    ? &m->head_layouts
                             : kind == UNIT_BLOCK ? &m->block_layouts
                                                  : &m->embed_layouts};
    vh_status st = hooks->gather(hooks->ctx, unit, &u.params);
    if (st == VH_STATUS_OK) st = hooks->grads(hooks->ctx, unit, &u.grads);
    if (st != VH_STATUS_OK) return st;
    switch (kind) {
    case UNIT_HEAD: st = backward_head(m, &u, m->batch, loss_scale); break;
    case UNIT_BLOCK:
        /* a checkpointed block first refills the shared set it aliases */
        if (vit_block_checkpointed(m, unit - 1))
            st = vit_recompute_block(m, unit - 1, &u, m->batch);
        if (st == VH_STATUS_OK) st = backward_block(m, unit - 1, &u, m->batch);
        break;
    case UNIT_EMBED: st = backward_embed(m, &u, m->batch); break;
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
