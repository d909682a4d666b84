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
 */
#ifndef VITHOST_PLUGIN_VIT_H
#define VITHOST_PLUGIN_VIT_H

#include <stdint.h>

#include "vithost/vithost.h"

enum { VIT_LAYOUT_BATCH_FIRST = 0, VIT_LAYOUT_BATCH_SECOND = 1 };
enum { VIT_CLASSIFIER_TOKEN = 0, VIT_CLASSIFIER_POOLED = 1 };

/* Offsets (elements) of each parameter inside its unit's flat buffer, in the
 * order of the unit's vh_param_desc list (timm state_dict order). */
typedef struct vit_embed_offsets {
    int64_t cls, pos, proj_w, proj_b; /* cls = -1 without a class token */
} vit_embed_offsets;

typedef struct vit_block_offsets {
    int64_t norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b;
    int64_t norm2_w, norm2_b, fc1_w, fc1_b, fc2_w, fc2_b;
} vit_block_offsets;

typedef struct vit_head_offsets {
    int64_t norm_w, norm_b, head_w, head_b;
} vit_head_offsets;

/* What one block keeps from forward for backward. */
typedef struct vit_block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (rows, D), (rows), (rows) */
    float *qkv;                       /* (rows, 3D) */
    float *probs;                     /* (B, H, N, N) */
    float *attn;                      /* (rows, D) attention output, before proj */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc1;                       /* (rows, M) before GELU */
    float *gelu;                      /* (rows, M) after GELU (and dropout) */
    float *mask_fc1, *mask_proj, *mask_fc2; /* dropout masks, or NULL */
    float *dp_attn, *dp_mlp;          /* drop-path scale per sample (B), or NULL */
} vit_block_acts;

typedef struct vit {
    vh_host *host;
    const vh_device_ops *dev;

    /* shape */
    int64_t image_h, image_w, channels, patch, grid_h, grid_w;
    int64_t num_patches, tokens, dim, depth, heads, head_dim, mlp_dim, classes, patch_dim;
    int64_t max_batch;
    int32_t layout, classifier;
    float dropout, drop_path, label_smoothing, eps;
    uint64_t init_seed, dropout_seed;

    /* parameter table: unit 0 embed, 1..L blocks, L+1 head */
    vh_param_table table;
    vh_unit_desc *units;
    vh_param_desc *params;
    char **names; /* owned strings of params and units */
    int32_t num_names;
    vit_embed_offsets embed_off;
    vit_block_offsets block_off; /* the same in every block */
    vit_head_offsets head_off;

    /* activations, device memory, sized for max_batch */
    float *patches;   /* (B * Np, K) batch-first */
    float *patch_emb; /* (B * Np, D) batch-first */
    float **x;        /* L + 1 residual streams (rows, D); x[0] from the embedding */
    float **x_mid;    /* L: after each block's attention residual */
    float *mask_embed;
    vit_block_acts *blocks;
    float *feat, *feat_ln, *feat_mean, *feat_rstd; /* (B, D), (B, D), (B), (B) */
    float *logits;                                  /* (B, C) */
    float *dp_host;                                 /* B drop-path factors, host */

    /* gradients of activations, device memory */
    float *d_x, *d_tmp, *d_qkv, *d_mlp, *d_mlp2, *d_patch_emb, *d_feat, *d_feat_ln,
        *d_logits, *d_branch;

    /* the last forward in train mode */
    int64_t batch;
    const int32_t *labels;
    int has_forward;
    uint64_t train_forwards; /* draws fresh dropout / drop-path masks per step */
} vit;

/* Row strides of token t, sample b in the residual stream. */
static inline int64_t vit_token_stride(const vit *m, int64_t batch) {
    return m->layout == VIT_LAYOUT_BATCH_FIRST ? m->dim : batch * m->dim;
}
static inline int64_t vit_batch_stride(const vit *m) {
    return m->layout == VIT_LAYOUT_BATCH_FIRST ? m->tokens * m->dim : m->dim;
}

vh_status vit_build_table(vit *m);
void vit_free_table(vit *m);
vh_status vit_alloc_activations(vit *m);
void vit_free_activations(vit *m);
vh_status vit_forward(void *self, const vh_batch *batch, vh_mode mode,
                      const vh_unit_hooks *hooks, vh_model_output *out);
vh_status vit_backward(void *self, float loss_scale, const vh_unit_hooks *hooks);
double vit_train_flops_per_image(void *self);

#endif
