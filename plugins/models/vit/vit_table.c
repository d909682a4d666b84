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
    int32_t num_params;
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

/* Appends one parameter to the unit being built; returns its offset. */
static int64_t add_param(table_builder *b, char *name, int32_t ndim, const int64_t *shape,
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
    return p->offset;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static void begin_unit(table_builder *b) { b->unit_numel = 0; }

static void end_unit(table_builder *b, int32_t unit, char *name, int32_t first_param) {
    vh_unit_desc *u = &b->m->units[unit];
    u->name = name;
    u->params = &b->m->params[first_param];
    u->num_params = b->num_params - first_param;
    u->numel = b->unit_numel;
    b->m->table.numel += u->numel;
}

/* Linear weights: truncated normal, std 0.02 (timm); biases zero; norms one
 * and zero; class token N(0, 1e-6); position embedding truncated normal. */
vh_status vit_build_table(vit *m) {
    int64_t D = m->dim, M = m->mlp_dim, C = m->classes, L = m->depth;
    int32_t num_units = (int32_t)(L + 2);
    int32_t max_params = 4 + 12 * (int32_t)L + 4;
    m->units = calloc((size_t)num_units, sizeof *m->units);
    m->params = calloc((size_t)max_params, sizeof *m->params);
    m->names = calloc((size_t)(max_params + num_units), sizeof *m->names);
    if (!m->units || !m->params || !m->names)
        return m->host->api->fail(m->host, VH_STATUS_ERR_NOMEM, "out of memory for the table");
    table_builder b = {.m = m};
    const uint32_t DECAY = VH_PARAM_FLAG_DECAY;

    begin_unit(&b);
    int32_t first = b.num_params;
    m->embed_off.cls = -1;
    if (m->classifier == VIT_CLASSIFIER_TOKEN)
        m->embed_off.cls = add_param(&b, own_name(m, "cls_token"), 3,
                                     SHAPE(1, 1, D), 0, VH_INIT_KIND_NORMAL, 1e-6f);
    m->embed_off.pos = add_param(&b, own_name(m, "pos_embed"), 3,
                                 SHAPE(1, m->tokens, D), 0, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
    m->embed_off.proj_w = add_param(&b, own_name(m, "patch_embed.proj.weight"), 4,
                                    SHAPE(D, m->channels, m->patch, m->patch), DECAY,
                                    VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
    m->embed_off.proj_b = add_param(&b, own_name(m, "patch_embed.proj.bias"), 1,
                                    SHAPE(D), 0, VH_INIT_KIND_ZEROS, 0);
    end_unit(&b, 0, own_name(m, "embed"), first);

    for (int64_t l = 0; l < L; l++) {
        begin_unit(&b);
        first = b.num_params;
        vit_block_offsets o;
        o.norm1_w = add_param(&b, own_name(m, "blocks.%lld.norm1.weight", (long long)l), 1, SHAPE(D), 0, VH_INIT_KIND_ONES, 0);
        o.norm1_b = add_param(&b, own_name(m, "blocks.%lld.norm1.bias", (long long)l), 1, SHAPE(D), 0, VH_INIT_KIND_ZEROS, 0);
        o.qkv_w = add_param(&b, own_name(m, "blocks.%lld.attn.qkv.weight", (long long)l), 2, SHAPE(3 * D, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        o.qkv_b = add_param(&b, own_name(m, "blocks.%lld.attn.qkv.bias", (long long)l), 1, SHAPE(3 * D), 0, VH_INIT_KIND_ZEROS, 0);
        o.proj_w = add_param(&b, own_name(m, "blocks.%lld.attn.proj.weight", (long long)l), 2, SHAPE(D, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        o.proj_b = add_param(&b, own_name(m, "blocks.%lld.attn.proj.bias", (long long)l), 1, SHAPE(D), 0, VH_INIT_KIND_ZEROS, 0);
        o.norm2_w = add_param(&b, own_name(m, "blocks.%lld.norm2.weight", (long long)l), 1, SHAPE(D), 0, VH_INIT_KIND_ONES, 0);
        o.norm2_b = add_param(&b, own_name(m, "blocks.%lld.norm2.bias", (long long)l), 1, SHAPE(D), 0, VH_INIT_KIND_ZEROS, 0);
        o.fc1_w = add_param(&b, own_name(m, "blocks.%lld.mlp.fc1.weight", (long long)l), 2, SHAPE(M, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        o.fc1_b = add_param(&b, own_name(m, "blocks.%lld.mlp.fc1.bias", (long long)l), 1, SHAPE(M), 0, VH_INIT_KIND_ZEROS, 0);
        o.fc2_w = add_param(&b, own_name(m, "blocks.%lld.mlp.fc2.weight", (long long)l), 2, SHAPE(D, M), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
        o.fc2_b = add_param(&b, own_name(m, "blocks.%lld.mlp.fc2.bias", (long long)l), 1, SHAPE(D), 0, VH_INIT_KIND_ZEROS, 0);
        m->block_off = o;
        end_unit(&b, (int32_t)(l + 1), own_name(m, "blocks.%lld", (long long)l), first);
    }

    begin_unit(&b);
    first = b.num_params;
    /* timm: the pooled classifier normalises after pooling, as fc_norm. */
    const char *norm = m->classifier == VIT_CLASSIFIER_TOKEN ? "norm" : "fc_norm";
    m->head_off.norm_w = add_param(&b, own_name(m, "%s.weight", norm), 1, SHAPE(D), 0, VH_INIT_KIND_ONES, 0);
    m->head_off.norm_b = add_param(&b, own_name(m, "%s.bias", norm), 1, SHAPE(D), 0, VH_INIT_KIND_ZEROS, 0);
    m->head_off.head_w = add_param(&b, own_name(m, "head.weight"), 2, SHAPE(C, D), DECAY, VH_INIT_KIND_TRUNC_NORMAL, 0.02f);
    m->head_off.head_b = add_param(&b, own_name(m, "head.bias"), 1, SHAPE(C), 0, VH_INIT_KIND_ZEROS, 0);
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

/* ---- activations ------------------------------------------------------- */

static vh_status dev_alloc(vit *m, float **out, int64_t count) {
    *out = NULL;
    if (count <= 0) return VH_STATUS_OK;
    vh_status st = m->dev->alloc(m->dev->device, (size_t)count * sizeof(float), (void **)out);
    if (st != VH_STATUS_OK)
        return m->host->api->fail(m->host, st,
                                  "cannot allocate %.1f MiB of activations on %s (lower "
                                  "run.batch_size)",
                                  (double)count * 4.0 / 1048576.0, m->dev->name);
    return VH_STATUS_OK;
}

static void dev_free(vit *m, float **p) {
    if (*p) m->dev->free(m->dev->device, *p);
    *p = NULL;
}

vh_status vit_alloc_activations(vit *m) {
    int64_t B = m->max_batch, rows = B * m->tokens, D = m->dim, M = m->mlp_dim, L = m->depth;
    int64_t prow = B * m->num_patches;
    int with_dropout = m->dropout > 0.0f, with_drop_path = m->drop_path > 0.0f;
    m->x = calloc((size_t)(L + 1), sizeof *m->x);
    m->x_mid = calloc((size_t)L, sizeof *m->x_mid);
    m->blocks = calloc((size_t)L, sizeof *m->blocks);
    m->dp_host = calloc((size_t)B, sizeof *m->dp_host);
    if (!m->x || !m->x_mid || !m->blocks || !m->dp_host)
        return m->host->api->fail(m->host, VH_STATUS_ERR_NOMEM, "out of memory");
    vh_status st = VH_STATUS_OK;
#define ALLOC(ptr, count) \
    if (st == VH_STATUS_OK) st = dev_alloc(m, &(ptr), (count))
    ALLOC(m->patches, prow * m->patch_dim);
    ALLOC(m->patch_emb, prow * D);
    if (with_dropout) ALLOC(m->mask_embed, rows * D);
    for (int64_t l = 0; l <= L; l++) ALLOC(m->x[l], rows * D);
    for (int64_t l = 0; l < L; l++) {
        vit_block_acts *a = &m->blocks[l];
        ALLOC(m->x_mid[l], rows * D);
        ALLOC(a->ln1, rows * D);
        ALLOC(a->ln1_mean, rows);
        ALLOC(a->ln1_rstd, rows);
        ALLOC(a->qkv, rows * 3 * D);
        ALLOC(a->probs, B * m->heads * m->tokens * m->tokens);
        ALLOC(a->attn, rows * D);
        ALLOC(a->ln2, rows * D);
        ALLOC(a->ln2_mean, rows);
        ALLOC(a->ln2_rstd, rows);
        ALLOC(a->fc1, rows * M);
        ALLOC(a->gelu, rows * M);
        if (with_dropout) {
            ALLOC(a->mask_fc1, rows * M);
            ALLOC(a->mask_proj, rows * D);
            ALLOC(a->mask_fc2, rows * D);
        }
        if (with_drop_path) {
            ALLOC(a->dp_attn, B);
            ALLOC(a->dp_mlp, B);
        }
    }
    ALLOC(m->feat, B * D);
    ALLOC(m->feat_ln, B * D);
    ALLOC(m->feat_mean, B);
    ALLOC(m->feat_rstd, B);
    ALLOC(m->logits, B * m->classes);
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
#undef ALLOC
    return st;
}

void vit_free_activations(vit *m) {
    int64_t L = m->depth;
    dev_free(m, &m->patches);
    dev_free(m, &m->patch_emb);
    dev_free(m, &m->mask_embed);
    for (int64_t l = 0; m->x && l <= L; l++) dev_free(m, &m->x[l]);
    for (int64_t l = 0; m->blocks && l < L; l++) {
        vit_block_acts *a = &m->blocks[l];
        float **bufs[] = {&m->x_mid[l], &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->probs,
                          &a->attn, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fc1, &a->gelu,
                          &a->mask_fc1, &a->mask_proj, &a->mask_fc2, &a->dp_attn, &a->dp_mlp};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(m, bufs[i]);
    }
    float **bufs[] = {&m->feat, &m->feat_ln, &m->feat_mean, &m->feat_rstd, &m->logits,
                      &m->d_x, &m->d_tmp, &m->d_branch, &m->d_qkv, &m->d_mlp, &m->d_mlp2,
                      &m->d_patch_emb, &m->d_feat, &m->d_feat_ln, &m->d_logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(m, bufs[i]);
    free(m->x);
    free(m->x_mid);
    free(m->blocks);
    free(m->dp_host);
    m->x = NULL, m->x_mid = NULL, m->blocks = NULL, m->dp_host = NULL;
}
