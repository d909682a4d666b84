/* vit_table.c - the parameter table (timm names, shapes and order) and the
 * activation buffers. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vit.h"

typedef struct table_builder {
    vit *m;
    int32_t num_params, unit_first;
    int64_t unit_numel;
} table_builder;

static char *own_name(vit *m, const char *fmt, ...) VH_PRINTF_LIKE(2, 3);
static char *own_name(vit *m, const char *fmt, ...) {
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *s = strdup(buf);
    m->names[m->num_names++] = s; /* NULL is caught after the table is built */
    return s;
}

/* Appends one parameter to the unit being built; returns its index in the
 * unit. */
static int32_t add_param(table_builder *b, char *name, int32_t ndim, const int64_t *shape,
                         uint32_t flags, vh_init_kind init, float std) {
    vh_param_desc *p = &b->m->params[b->num_params++];
    memset(p, 0, sizeof *p);
    p->name = name;
    p->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++) p->shape[i] = shape[i];
    p->flags = flags;
    p->init = init;
    p->init_std = std;
    p->offset = b->unit_numel;
    p->numel = vh_param_desc_numel(p);
    b->unit_numel += p->numel;
    return b->num_params - 1 - b->unit_first;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static void begin_unit(table_builder *b) {
    b->unit_numel = 0;
    b->unit_first = b->num_params;
}

static void end_unit(table_builder *b, int32_t unit, char *name, int32_t first_param) {
    vh_unit_desc *u = &b->m->units[unit];
    u->name = name;
    u->params = &b->m->params[first_param];
    u->num_params = b->num_params - first_param;
    u->numel = b->unit_numel;
    b->m->table.numel += u->numel;
}

/* Linear weights: truncated normal, std 0.02 (timm); biases zero; norms one
 * and zero; class token N(0, 1e-6); position embedding truncated normal.
 * Flags say what each parameter is, for the precision policy; only matrices
 * decay. The indices of vit.h (vit_embed_index, enum vit_block_param, enum
 * vit_head_param) follow this order. */
vh_status vit_build_table(vit *m) {
    int64_t D = m->dim, M = m->mlp_dim, C = m->classes, L = m->depth;
    int32_t num_units = (int32_t)(L + 2);
    int32_t max_params = 4 + VIT_BLOCK_PARAMS * (int32_t)L + VIT_HEAD_PARAMS;
    m->units = calloc((size_t)num_units, sizeof *m->units);
    m->params = calloc((size_t)max_params, sizeof *m->params);
    m->names = calloc((size_t)(max_params + num_units), sizeof *m->names);
    if (!m->units || !m->params || !m->names)
        return m->host->api->fail(m->host, VH_STATUS_ERR_NOMEM, "out of memory for the table");
    table_builder b = {.m = m};
    const uint32_t DECAY = VH_PARAM_FLAG_DECAY, NORM = VH_PARAM_FLAG_NORM;
    const uint32_t BIAS = VH_PARAM_FLAG_BIAS, EMBEDDING = VH_PARAM_FLAG_EMBEDDING;

    begin_unit(&b);
    int32_t first = b.num_params;
    vit_embed_index *e = &m->embed_idx;
    e->cls = -1;
    if (m->classifier == VIT_CLASSIFIER_TOKEN)
        e->cls = add_param(&b, own_name(m, "cls_token"), 3, SHAPE(1, 1, D), EMBEDDING,
                           VH_INIT_KIND_NORMAL, 1e-6f);
    e->pos = add_param(&b, own_name(m, "pos_embed"), 3, SHAPE(1, m->tokens, D), EMBEDDING,
                       VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
    e->proj_w = add_param(&b, own_name(m, "patch_embed.proj.weight"), 4,
                          SHAPE(D, m->channels, m->patch, m->patch), DECAY,
                          VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
    e->proj_b = add_param(&b, own_name(m, "patch_embed.proj.bias"), 1, SHAPE(D), BIAS,
                          VH_INIT_KIND_ZEROS, 0);
    end_unit(&b, 0, own_name(m, "embed"), first);

    for (int64_t l = 0; l < L; l++) {
        begin_unit(&b);
        first = b.num_params;
        add_param(&b, own_name(m, "blocks.%lld.norm1.weight", (long long)l), 1, SHAPE(D), NORM, VH_INIT_KIND_ONES, 0);
        add_param(&b, own_name(m, "blocks.%lld.norm1.bias", (long long)l), 1, SHAPE(D), NORM, VH_INIT_KIND_ZEROS, 0);
        add_param(&b, own_name(m, "blocks.%lld.attn.qkv.weight", (long long)l), 2, SHAPE(3 * D, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        add_param(&b, own_name(m, "blocks.%lld.attn.qkv.bias", (long long)l), 1, SHAPE(3 * D), BIAS, VH_INIT_KIND_ZEROS, 0);
        add_param(&b, own_name(m, "blocks.%lld.attn.proj.weight", (long long)l), 2, SHAPE(D, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        add_param(&b, own_name(m, "blocks.%lld.attn.proj.bias", (long long)l), 1, SHAPE(D), BIAS, VH_INIT_KIND_ZEROS, 0);
        add_param(&b, own_name(m, "blocks.%lld.norm2.weight", (long long)l), 1, SHAPE(D), NORM, VH_INIT_KIND_ONES, 0);
        add_param(&b, own_name(m, "blocks.%lld.norm2.bias", (long long)l), 1, SHAPE(D), NORM, VH_INIT_KIND_ZEROS, 0);
        add_param(&b, own_name(m, "blocks.%lld.mlp.fc1.weight", (long long)l), 2, SHAPE(M, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        add_param(&b, own_name(m, "blocks.%lld.mlp.fc1.bias", (long long)l), 1, SHAPE(M), BIAS, VH_INIT_KIND_ZEROS, 0);
        add_param(&b, own_name(m, "blocks.%lld.mlp.fc2.weight", (long long)l), 2, SHAPE(D, M), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        add_param(&b, own_name(m, "blocks.%lld.mlp.fc2.bias", (long long)l), 1, SHAPE(D), BIAS, VH_INIT_KIND_ZEROS, 0);
        end_unit(&b, (int32_t)(l + 1), own_name(m, "blocks.%lld", (long long)l), first);
    }

    begin_unit(&b);
    first = b.num_params;
    /* timm: the pooled classifier normalises after pooling, as fc_norm. */
    const char *norm = m->classifier == VIT_CLASSIFIER_TOKEN ? "norm" : "fc_norm";
    add_param(&b, own_name(m, "%s.weight", norm), 1, SHAPE(D), NORM, VH_INIT_KIND_ONES, 0);
    add_param(&b, own_name(m, "%s.bias", norm), 1, SHAPE(D), NORM, VH_INIT_KIND_ZEROS, 0);
    add_param(&b, own_name(m, "head.weight"), 2, SHAPE(C, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
    add_param(&b, own_name(m, "head.bias"), 1, SHAPE(C), BIAS, VH_INIT_KIND_ZEROS, 0);
    end_unit(&b, num_units - 1, own_name(m, "head"), first);

    for (int32_t i = 0; i < m->num_names; i++)
        if (!m->names[i])
            return m->host->api->fail(m->host, VH_STATUS_ERR_NOMEM, "out of memory for names");
    m->table.units = m->units;
    m->table.num_units = num_units;
    return VH_STATUS_OK;
}

void vit_free_table(vit *m) {
    for (int32_t i = 0; m->names && i < m->num_names; i++) free(m->names[i]);
    free(m->names);
    free(m->params);
    free(m->units);
    m->names = NULL, m->params = NULL, m->units = NULL;
}

/* ---- layouts -------------------------------------------------------------- */

/* The byte layouts in which the sharding plugin hands over a unit's compute
 * copy (gather) and gradients (grads): computed by the same SDK call from
 * the same policy, so both sides agree. Every block has the same flags, so
 * one pair serves them all. */
static vh_status unit_layouts(vit *m, vit_layouts *out, int32_t unit) {
    const vh_unit_desc *u = &m->units[unit];
    vh_status st = vh_unit_layout_init(&out->params, u, vh_policy_param_dtype, &m->policy);
    if (st == VH_STATUS_OK)
        st = vh_unit_layout_init(&out->grads, u, vh_policy_grad_dtype, &m->policy);
    if (st != VH_STATUS_OK)
        return m->host->api->fail(m->host, st,
                                  "the precision policy gives unit %s a dtype vit cannot use "
                                  "(params %s, grads %s)",
                                  u->name, vh_dtype_name(m->policy.param_dtype),
                                  vh_dtype_name(m->policy.grad_dtype));
    /* A GEMM takes its two inputs in one dtype: weight matrices must be
     * stored in the dtype of the activations they multiply. */
    for (int32_t i = 0; i < u->num_params; i++) {
        const vh_param_desc *p = &u->params[i];
        if (p->ndim >= 2 && (p->flags & VH_PARAM_FLAG_DECAY) && out->params.dtypes[i] != m->act)
            return m->host->api->fail(m->host, VH_STATUS_ERR_UNSUPPORTED,
                                      "vit multiplies %s activations by %s weights (%s): the "
                                      "precision policy must keep weight matrices in the "
                                      "compute dtype",
                                      vh_dtype_name(m->act),
                                      vh_dtype_name(out->params.dtypes[i]), p->name);
    }
    return VH_STATUS_OK;
}

vh_status vit_build_layouts(vit *m) {
    vh_status st = unit_layouts(m, &m->embed_layouts, 0);
    if (st == VH_STATUS_OK && m->depth > 0) st = unit_layouts(m, &m->block_layouts, 1);
    if (st == VH_STATUS_OK)
        st = unit_layouts(m, &m->head_layouts, m->table.num_units - 1);
    return st;
}

void vit_free_layouts(vit *m) {
    vit_layouts *all[] = {&m->embed_layouts, &m->block_layouts, &m->head_layouts};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        vh_unit_layout_free(&all[i]->params);
        vh_unit_layout_free(&all[i]->grads);
    }
}

/* ---- activations ------------------------------------------------------- */

static vh_status dev_alloc(vit *m, void **out, int64_t count, size_t elem) {
    *out = NULL;
    if (count <= 0) return VH_STATUS_OK;
    vh_status st = m->dev->alloc(m->dev->device, (size_t)count * elem, out);
    if (st != VH_STATUS_OK)
        return m->host->api->fail(m->host, st,
                                  "cannot allocate %.1f MiB of activations on %s (lower "
                                  "run.batch_size)",
                                  (double)count * (double)elem / 1048576.0, m->dev->name);
    return VH_STATUS_OK;
}

static void dev_free(vit *m, void **p) {
    if (*p) m->dev->free(m->dev->device, *p);
    *p = NULL;
}

static void dev_free_f32(vit *m, float **p) {
    if (*p) m->dev->free(m->dev->device, *p);
    *p = NULL;
}

vh_status vit_alloc_activations(vit *m) {
    int64_t B = m->max_batch, rows = B * m->tokens, D = m->dim, M = m->mlp_dim, L = m->depth;
    int64_t prow = B * m->num_patches;
    int with_dropout = m->dropout > 0.0f, with_drop_path = m->drop_path > 0.0f;
    m->x = calloc((size_t)(L + 1), sizeof *m->x);
    m->x_mid = calloc((size_t)(L ? L : 1), sizeof *m->x_mid);
    m->blocks = calloc((size_t)(L ? L : 1), sizeof *m->blocks);
    m->dp_host = calloc((size_t)B, sizeof *m->dp_host);
    if (!m->x || !m->x_mid || !m->blocks || !m->dp_host)
        return m->host->api->fail(m->host, VH_STATUS_ERR_NOMEM, "out of memory");
    vh_status st = VH_STATUS_OK;
    void *tmp;
    /* Activations (and dropout masks, which multiply them) in the compute
     * dtype; probabilities in probs_dtype; statistics, drop-path factors and
     * the loss f32. */
#define ALLOC(ptr, count)                                                             if (st == VH_STATUS_OK) st = dev_alloc(m, &tmp, (count), m->act_size), (ptr) = tmp
#define ALLOC_F32(ptr, count)                                                         if (st == VH_STATUS_OK) st = dev_alloc(m, &tmp, (count), sizeof(float)), (ptr) = tmp
    ALLOC(m->patches, prow * m->patch_dim);
    ALLOC(m->patch_emb, prow * D);
    if (with_dropout) ALLOC(m->mask_embed, rows * D);
    for (int64_t l = 0; l <= L; l++) ALLOC(m->x[l], rows * D);
    for (int64_t l = 0; l < L; l++) {
        vit_block_acts *a = &m->blocks[l];
        if (vit_block_checkpointed(m, l) && l > 0) { /* block 0's set, shared */
            *a = m->blocks[0], m->x_mid[l] = m->x_mid[0];
            continue;
        }
        ALLOC(m->x_mid[l], rows * D);
        ALLOC(a->ln1, rows * D);
        ALLOC_F32(a->ln1_mean, rows);
        ALLOC_F32(a->ln1_rstd, rows);
        ALLOC(a->qkv, rows * 3 * D);
        if (st == VH_STATUS_OK)
            st = dev_alloc(m, &a->probs, B * m->heads * m->tokens * m->tokens, m->probs_size);
        ALLOC(a->attn, rows * D);
        ALLOC(a->ln2, rows * D);
        ALLOC_F32(a->ln2_mean, rows);
        ALLOC_F32(a->ln2_rstd, rows);
        ALLOC(a->fc1, rows * M);
        ALLOC(a->gelu, rows * M);
        if (with_dropout) {
            ALLOC(a->mask_fc1, rows * M);
            ALLOC(a->mask_proj, rows * D);
            ALLOC(a->mask_fc2, rows * D);
        }
        if (with_drop_path) {
            ALLOC_F32(a->dp_attn, B);
            ALLOC_F32(a->dp_mlp, B);
        }
    }
    ALLOC(m->feat, B * D);
    ALLOC(m->feat_ln, B * D);
    ALLOC_F32(m->feat_mean, B);
    ALLOC_F32(m->feat_rstd, B);
    ALLOC(m->logits, B * m->classes);
    ALLOC_F32(m->loss, 2);
    ALLOC(m->d_x, rows * D);
    ALLOC(m->d_tmp, rows * D);
    ALLOC(m->d_branch, rows * D);
    ALLOC(m->d_qkv, rows * 3 * D);
    ALLOC(m->d_mlp, rows * M);
    ALLOC(m->d_mlp2, rows * M);
    ALLOC(m->d_patch_emb, prow * D);
    ALLOC(m->d_feat, B * D);
    ALLOC(m->d_feat_ln, B * D);
    ALLOC(m->d_logits, B * m->classes);
#undef ALLOC_AS
#undef ALLOC
#undef ALLOC_F32
    return st;
}

void vit_free_activations(vit *m) {
    int64_t L = m->depth;
    dev_free(m, &m->patches);
    dev_free(m, &m->patch_emb);
    dev_free(m, &m->mask_embed);
    for (int64_t l = 0; m->x && l <= L; l++) dev_free(m, &m->x[l]);
    /* checkpointed blocks alias block 0's set: freed once, below */
    for (int64_t l = 1; m->blocks && m->x_mid && l < L; l++)
        if (vit_block_checkpointed(m, l))
            memset(&m->blocks[l], 0, sizeof m->blocks[l]), m->x_mid[l] = NULL;
    for (int64_t l = 0; m->blocks && l < L; l++) {
        vit_block_acts *a = &m->blocks[l];
        void **bufs[] = {&m->x_mid[l], &a->ln1, &a->qkv, &a->probs, &a->attn, &a->ln2, &a->fc1,
                         &a->gelu, &a->mask_fc1, &a->mask_proj, &a->mask_fc2};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(m, bufs[i]);
        float **stats[] = {&a->ln1_mean, &a->ln1_rstd, &a->ln2_mean, &a->ln2_rstd,
                           &a->dp_attn, &a->dp_mlp};
        for (size_t i = 0; i < sizeof stats / sizeof stats[0]; i++) dev_free_f32(m, stats[i]);
    }
    void **bufs[] = {&m->feat, &m->feat_ln, &m->logits, &m->d_x, &m->d_tmp, &m->d_branch,
                     &m->d_qkv, &m->d_mlp, &m->d_mlp2, &m->d_patch_emb, &m->d_feat,
                     &m->d_feat_ln, &m->d_logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(m, bufs[i]);
    float **stats[] = {&m->feat_mean, &m->feat_rstd, &m->loss, &m->targets_dev};
    for (size_t i = 0; i < sizeof stats / sizeof stats[0]; i++) dev_free_f32(m, stats[i]);
    free(m->x);
    free(m->x_mid);
    free(m->blocks);
    free(m->dp_host);
    m->x = NULL, m->x_mid = NULL, m->blocks = NULL, m->dp_host = NULL;
}
