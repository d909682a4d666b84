/* vit.h - the ViT model plugin's internal state (not part of the SDK).
 *
 * Letters as in DESIGN.md: B batch, N tokens, Np patches, D width, H heads,
 * Dh = D / H, L depth, M MLP width, C classes, P patch side, K = channels*P*P.
 *
 * Activations are "rows x D" matrices with rows = B * N. The layout only
 * decides which row holds token t of sample b:
 *   batch_first  (B, N, D): row = b * N + t
 *   batch_second (N, B, D): row = t * B + b
 * Row-wise ops (GEMMs, layernorm, GELU, adds) never care; patch embedding,
 * attention and pooling take the two strides below. Nothing is transposed.
 *
 * Dtypes: activations and their gradients in the precision policy's
 * compute dtype (m->act); layer-norm statistics, attention probabilities,
 * drop-path factors and the loss in f32; each parameter (and its gradient)
 * in the dtype of its unit's layout.
 */
#ifndef VITHOST_PLUGIN_VIT_H
#define VITHOST_PLUGIN_VIT_H

#include <stdint.h>

#include "vithost/vithost.h"

enum { VIT_LAYOUT_BATCH_FIRST = 0, VIT_LAYOUT_BATCH_SECOND = 1 };
enum { VIT_CLASSIFIER_TOKEN = 0, VIT_CLASSIFIER_POOLED = 1 };

/* A unit's parameters are reached by their index in the unit's
 * vh_param_desc list (timm state_dict order); the unit's vh_unit_layout turns
 * an index into a byte offset and a dtype. */
typedef struct vit_embed_index {
    int32_t cls, pos, proj_w, proj_b; /* cls = -1 without a class token */
} vit_embed_index;

enum vit_block_param {
    VIT_NORM1_W, VIT_NORM1_B, VIT_QKV_W, VIT_QKV_B, VIT_PROJ_W, VIT_PROJ_B,
    VIT_NORM2_W, VIT_NORM2_B, VIT_FC1_W, VIT_FC1_B, VIT_FC2_W, VIT_FC2_B,
    VIT_BLOCK_PARAMS
};

enum vit_head_param { VIT_HEAD_NORM_W, VIT_HEAD_NORM_B, VIT_HEAD_W, VIT_HEAD_B, VIT_HEAD_PARAMS };

/* The compute-copy and gradient layouts of one kind of unit (every block
 * shares one pair). */
typedef struct vit_layouts {
    vh_unit_layout params, grads;
} vit_layouts;

/* One tensor and its dtype: what the op helpers take for parameters, whose
 * dtype the precision policy decides per parameter. */
typedef struct vit_ref {
    void *ptr;
    vh_dtype dtype;
} vit_ref;

/* A gathered unit: its compute copy (and, in backward, its gradients) with
 * their layouts. */
typedef struct vit_unit {
    const void *params;
    void *grads;
    const vit_layouts *layouts;
} vit_unit;

/* Parameter i of a unit, and its gradient. */
static inline vit_ref vit_param(const vit_unit *u, int32_t i) {
    vit_ref r = {(char *)u->params + u->layouts->params.offsets[i],
                 u->layouts->params.dtypes[i]};
    return r;
}
static inline vit_ref vit_grad(const vit_unit *u, int32_t i) {
    vit_ref r = {(char *)u->grads + u->layouts->grads.offsets[i], u->layouts->grads.dtypes[i]};
    return r;
}

/* What one block keeps from forward for backward. Activations are in the
 * policy's compute dtype; layer-norm statistics and drop-path factors are
 * f32; attention probabilities in probs_dtype (vit.c's read_policy). */
typedef struct vit_block_acts {
    void *ln1;                        /* (rows, D) */
    float *ln1_mean, *ln1_rstd;       /* (rows), (rows) */
    void *qkv;                        /* (rows, 3D) */
    void *probs;                      /* (B, H, N, N) in probs_dtype */
    void *attn;                       /* (rows, D) attention output, before proj */
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *fc1;                        /* (rows, M) before GELU, or its gelu' (gelu_grad_in_aux) */
    void *gelu;                       /* (rows, M) after GELU (and dropout) */
    void *mask_fc1, *mask_proj, *mask_fc2; /* dropout masks, or NULL */
    float *dp_attn, *dp_mlp;          /* drop-path scale per sample (B), or NULL */
} vit_block_acts;

typedef struct vit {
    vh_host *host;
    const vh_device_ops *dev;
    /* the device writes gelu_backward's dx on request (ABI 2.4 overwrite
     * extension): d_mlp2 needs no zeroing before it */
    int gelu_grad_writes;
    /* and attention_backward's dqkv (ABI 2.6): d_qkv needs none either */
    int attention_grad_writes;
    /* fp32 activations on a device with the 2.5 GEMM epilogues: fc1's GEMM
     * keeps gelu'(T) in the block's fc1 buffer instead of T, and fc2's dX
     * GEMM multiplies by it (no GELU pass in backward; the same numbers) */
    int gelu_grad_in_aux;
    /* otherwise (16-bit activations), a device with 2.7's GELU_BACKWARD
     * epilogue: fc2's dX GEMM applies gelu_backward as it writes d_mlp2
     * (no d_mlp round trip through memory; the same numbers) */
    int gelu_backward_in_gemm;

    /* shape */
    int64_t image_h, image_w, channels, patch, grid_h, grid_w;
    int64_t num_patches, tokens, dim, depth, heads, head_dim, mlp_dim, classes, patch_dim;
    int64_t max_batch;
    int32_t layout, classifier;
    float dropout, drop_path, label_smoothing, eps;
    uint64_t init_seed, dropout_seed;
    const char *pretrained; /* `pretrained`, or NULL */
    int reset_head;         /* `reset_head`: head.* from the init rules under pretrained */
    /* `checkpoint_blocks`: 0 none, k >= 1 blocks l with l % k == 0 (1: all).
     * A checkpointed block keeps only its input x[l]; its blocks[l] and
     * x_mid[l] alias one shared set, which backward refills by running the
     * block's forward again (vit_recompute_block) just before its backward. */
    int64_t checkpoint_every;

    /* precision: our copy of the policy (the setup's pointer need not
     * outlive create) and the dtype of activations */
    vh_precision_policy policy;
    vh_dtype act;
    size_t act_size; /* bytes per activation element */
    vh_dtype probs_dtype; /* the attention probabilities kept for backward */
    size_t probs_size;

    /* parameter table: unit 0 embed, 1..L blocks, L+1 head */
    vh_param_table table;
    vh_unit_desc *units;
    vh_param_desc *params;
    char **names; /* owned strings of params and units */
    int32_t num_names;
    vit_embed_index embed_idx;
    vit_layouts embed_layouts, block_layouts, head_layouts;

    /* activations, device memory, sized for max_batch */
    void *patches;   /* (B * Np, K) batch-first */
    void *patch_emb; /* (B * Np, D) batch-first */
    void **x;        /* L + 1 residual streams (rows, D); x[0] from the embedding */
    void **x_mid;    /* L: after each block's attention residual */
    void *mask_embed;
    vit_block_acts *blocks;
    void *feat, *feat_ln;           /* (B, D), (B, D) */
    float *feat_mean, *feat_rstd;   /* (B), (B) */
    void *logits;                   /* (B, C) */
    float *loss;                    /* 2 f32: forward's loss, backward's scratch */
    float *dp_host;                 /* B drop-path factors, host: for a device
                                       without drop_path_scale */

    /* gradients of activations, device memory, in the compute dtype */
    void *d_x, *d_tmp, *d_qkv, *d_mlp, *d_mlp2, *d_patch_emb, *d_feat, *d_feat_ln, *d_logits,
        *d_branch;

    /* soft targets (ABI 2.2, vh_batch.targets): a device copy, (max_batch, C)
     * f32, made at the first batch that has them on a device that is not the
     * CPU (there the batch's own memory is read) */
    float *targets_dev;
    int told_smoothing; /* logged once that label_smoothing yields to them */

    /* the last forward in train mode */
    int64_t batch;
    const int32_t *labels;
    const float *targets; /* its soft targets, or NULL: the labels */
    int has_forward;
    uint64_t train_forwards; /* draws fresh dropout / drop-path masks per step */
    uint64_t forward_step;   /* the last training forward's step: recompute's draws */
} vit;

/* Row strides of token t, sample b in the residual stream. */
static inline int64_t vit_token_stride(const vit *m, int64_t batch) {
    return m->layout == VIT_LAYOUT_BATCH_FIRST ? m->dim : batch * m->dim;
}
static inline int64_t vit_batch_stride(const vit *m) {
    return m->layout == VIT_LAYOUT_BATCH_FIRST ? m->tokens * m->dim : m->dim;
}

/* Whether block l recomputes its forward in backward, and how many do. */
static inline int vit_block_checkpointed(const vit *m, int64_t l) {
    return m->checkpoint_every > 0 && l % m->checkpoint_every == 0;
}
static inline int64_t vit_checkpointed_blocks(const vit *m) {
    return m->checkpoint_every > 0 ? (m->depth + m->checkpoint_every - 1) / m->checkpoint_every
                                   : 0;
}

vh_status vit_build_table(vit *m);
void vit_free_table(vit *m);
vh_status vit_build_layouts(vit *m);
void vit_free_layouts(vit *m);
vh_status vit_alloc_activations(vit *m);
void vit_free_activations(vit *m);
vh_status vit_forward(void *self, const vh_batch *batch, vh_mode mode,
                      const vh_unit_hooks *hooks, vh_model_output *out);
vh_status vit_backward(void *self, float loss_scale, const vh_unit_hooks *hooks);
vh_status vit_recompute_block(vit *m, int64_t l, const vit_unit *u, int64_t batch);
double vit_train_flops_per_image(void *self);
vh_status vit_load_weights(void *self, int32_t unit, const vh_weights_source *src,
                           vh_weights_mode mode, float *values, const vh_weights_report *report);

/* Bicubic resize of a position embedding's patch grid, (h1 * w1, dim) rows
 * to (h2 * w2, dim), as PyTorch's interpolate(mode='bicubic',
 * align_corners=False) (vit_weights.c). */
void vit_resize_pos_grid(const float *src, int64_t h1, int64_t w1, float *dst, int64_t h2,
                         int64_t w2, int64_t dim);

#endif
