/* vit.c - the ViT model plugin: schema, variants, parameter table, init.
 *
 * The standard pre-norm Vision Transformer of timm's VisionTransformer, with
 * its parameter names, shapes and memory layouts, so weights move between
 * vithost and PyTorch without conversion. Forward and backward are in
 * vit_forward.c and vit_backward.c, the device ops they call in vit_ops.c,
 * named weights (checkpoints, `pretrained`) in vit_weights.c.
 *
 * Precision: activations in the policy's compute dtype; parameters and
 * gradients as the sharding plugin lays them out (vh_unit_layout_init with
 * the policy's per-flag dtypes), so the table's flags say what each
 * parameter is.
 */
#define _POSIX_C_SOURCE 200809L
#include "vit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vithost/vh_random.h"

static const vh_config_key schema[] = {
    {"variant", VH_CONFIG_TYPE_ENUM, NULL,
     "published size (ti16 s16 b16 l16 h14 h16); explicit keys below override it",
     "ti16|s16|b16|l16|h14|h16", 0, 0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"dim", VH_CONFIG_TYPE_INT, NULL, "width D (required without variant)", NULL, 1, 65536,
     VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"depth", VH_CONFIG_TYPE_INT, NULL, "blocks L (required without variant)", NULL, 1, 1024,
     VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"heads", VH_CONFIG_TYPE_INT, NULL, "attention heads H; must divide dim", NULL, 1, 1024,
     VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"mlp_dim", VH_CONFIG_TYPE_INT, NULL, "MLP width M (default 4 x dim)", NULL, 1, 1 << 20,
     VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"patch_size", VH_CONFIG_TYPE_INT, NULL, "patch side P; must divide the image sides", NULL,
     1, 1024, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"image_size", VH_CONFIG_TYPE_INT, NULL,
     "image side; default and check: the data plugin's", NULL, 1, 65536,
     VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"channels", VH_CONFIG_TYPE_INT, NULL, "image channels; default: the data plugin's", NULL,
     1, 64, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"num_classes", VH_CONFIG_TYPE_INT, NULL, "classes C; default: the data plugin's", NULL, 1,
     1 << 24, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"classifier", VH_CONFIG_TYPE_ENUM, "token",
     "token: class token -> norm -> head; pooled: mean of patch tokens -> fc_norm -> head",
     "token|pooled", 0, 0, 0},
    {"layout", VH_CONFIG_TYPE_ENUM, "batch_first",
     "activations (B,N,D) or (N,B,D); same numbers, different memory order",
     "batch_first|batch_second", 0, 0, 0},
    {"dropout", VH_CONFIG_TYPE_FLOAT, "0.0",
     "dropout after the embedding, attention projection, GELU and fc2", NULL, 0, 0.99, 0},
    {"drop_path", VH_CONFIG_TYPE_FLOAT, "0.0",
     "stochastic depth: rate of the last block, rising linearly from 0", NULL, 0, 0.99, 0},
    {"label_smoothing", VH_CONFIG_TYPE_FLOAT, "0.0", "of the cross-entropy loss", NULL, 0, 0.99,
     0},
    {"checkpoint_blocks", VH_CONFIG_TYPE_STRING, "none",
     "activation checkpointing: none, all, or k (blocks 0, k, 2k, ...); a checkpointed block "
     "keeps only its input and runs its forward again in backward: the same bits, less memory",
     NULL, 0, 0, 0},
    {"init", VH_CONFIG_TYPE_INT, NULL, "seed of the initial weights; default: run.seed", NULL,
     0, 2147483647.0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"pretrained", VH_CONFIG_TYPE_PATH, NULL,
     "safetensors file (timm names) to start from; a head of another class count is "
     "re-initialised",
     NULL, 0, 0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"reset_head", VH_CONFIG_TYPE_BOOL, "false",
     "with pretrained: head.* starts from its init rules even when the file's class count "
     "matches (a new head, timm's reset_classifier)",
     NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

typedef struct vit_variant {
    const char *name;
    int64_t dim, depth, heads, mlp_dim, patch;
} vit_variant;

/* Widths, depths and heads of the ViT paper (and timm). */
static const vit_variant variants[] = {
    {"ti16", 192, 12, 3, 768, 16},    {"s16", 384, 12, 6, 1536, 16},
    {"b16", 768, 12, 12, 3072, 16},   {"l16", 1024, 24, 16, 4096, 16},
    {"h14", 1280, 32, 16, 5120, 14},  {"h16", 1280, 32, 16, 5120, 16},
};

static vh_status read_optional_int(vh_host *host, const char *key, int64_t *value) {
    if (!host->api->config_has(host, key)) return VH_STATUS_OK;
    return host->api->config_int(host, key, value);
}

/* The transformer's sizes: a variant's, then explicit keys over them. */
typedef struct vit_shape {
    int64_t dim, depth, heads, mlp, patch;
} vit_shape;

static vh_status read_shape(vh_host *host, vit_shape *s) {
    const vh_host_api *api = host->api;
    if (api->config_has(host, "variant")) {
        const char *name;
        vh_status st = api->config_string(host, "variant", &name);
        if (st != VH_STATUS_OK) return st;
        for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
            if (strcmp(variants[i].name, name) != 0) continue;
            s->dim = variants[i].dim, s->depth = variants[i].depth, s->heads = variants[i].heads;
            s->mlp = variants[i].mlp_dim, s->patch = variants[i].patch;
        }
    }
    vh_status st = VH_STATUS_OK;
    if (st == VH_STATUS_OK) st = read_optional_int(host, "dim", &s->dim);
    if (st == VH_STATUS_OK) st = read_optional_int(host, "depth", &s->depth);
    if (st == VH_STATUS_OK) st = read_optional_int(host, "heads", &s->heads);
    if (st == VH_STATUS_OK) st = read_optional_int(host, "patch_size", &s->patch);
    if (st == VH_STATUS_OK) st = read_optional_int(host, "mlp_dim", &s->mlp);
    if (st != VH_STATUS_OK) return st;
    const char *missing = !s->dim     ? "dim"
                          : !s->depth ? "depth"
                          : !s->heads ? "heads"
                          : !s->patch ? "patch_size"
                                      : NULL;
    if (missing)
        return api->fail(host, VH_STATUS_ERR_CONFIG,
                         "model: no `%s`: set `variant` (ti16, s16, b16, l16, h14, h16) or "
                         "all of dim, depth, heads and patch_size",
                         missing);
    if (!s->mlp) s->mlp = 4 * s->dim;
    if (s->dim % s->heads != 0)
        return api->config_fail(host, "heads", "%lld heads do not divide dim %lld",
                                (long long)s->heads, (long long)s->dim);
    return VH_STATUS_OK;
}

/* Image size, channels and classes: the data plugin's, which keys may only
 * confirm (classes: raise); the patch must tile the image. */
static vh_status read_data_shape(vit *m, const vh_model_setup *setup, int64_t patch) {
    vh_host *host = m->host;
    const vh_host_api *api = host->api;
    int64_t image_h = setup->height, image_w = setup->width, channels = setup->channels;
    int64_t classes = setup->num_classes, v;
    if (api->config_has(host, "image_size")) {
        api->config_int(host, "image_size", &v);
        if (v != image_h || v != image_w)
            return api->config_fail(host, "image_size",
                                    "%lld, but the data plugin yields %lld x %lld images",
                                    (long long)v, (long long)image_h, (long long)image_w);
    }
    if (api->config_has(host, "channels")) {
        api->config_int(host, "channels", &v);
        if (v != channels)
            return api->config_fail(host, "channels",
                                    "%lld, but the data plugin yields %lld channels",
                                    (long long)v, (long long)channels);
    }
    if (api->config_has(host, "num_classes")) {
        api->config_int(host, "num_classes", &v);
        if (v < classes)
            return api->config_fail(host, "num_classes",
                                    "%lld, but the data plugin has %lld classes",
                                    (long long)v, (long long)classes);
        classes = v;
    }
    if (image_h % patch != 0 || image_w % patch != 0)
        return api->fail(host, VH_STATUS_ERR_CONFIG,
                         "model.patch_size %lld does not divide the %lld x %lld images",
                         (long long)patch, (long long)image_h, (long long)image_w);
    m->image_h = image_h, m->image_w = image_w, m->channels = channels, m->classes = classes;
    return VH_STATUS_OK;
}

/* Head, layout, regularisation, seeds and the pretrained weights. */
static vh_status read_training(vit *m, const vh_model_setup *setup) {
    vh_host *host = m->host;
    const vh_host_api *api = host->api;
    const char *text;
    api->config_string(host, "classifier", &text);
    m->classifier = strcmp(text, "pooled") == 0 ? VIT_CLASSIFIER_POOLED : VIT_CLASSIFIER_TOKEN;
    api->config_string(host, "layout", &text);
    m->layout = strcmp(text, "batch_second") == 0 ? VIT_LAYOUT_BATCH_SECOND : VIT_LAYOUT_BATCH_FIRST;
    double f;
    api->config_float(host, "dropout", &f);
    m->dropout = (float)f;
    api->config_float(host, "drop_path", &f);
    m->drop_path = (float)f;
    api->config_float(host, "label_smoothing", &f);
    m->label_smoothing = (float)f;
    m->init_seed = api->seed(host);
    if (api->config_has(host, "init")) {
        int64_t v;
        api->config_int(host, "init", &v);
        m->init_seed = (uint64_t)v;
    }
    /* Ranks draw different dropout and drop-path masks; rank 0 keeps the
     * masks of a one-process run. The initial weights do not depend on the
     * rank: every rank starts from the same parameters. */
    m->dropout_seed = api->seed(host) ^ 0x9e3779b97f4a7c15ull;
    if (setup->rank != 0)
        m->dropout_seed = vh_splitmix64(m->dropout_seed ^ vh_splitmix64((uint64_t)setup->rank));
    m->pretrained = NULL;
    api->config_bool(host, "reset_head", &m->reset_head);
    if (m->reset_head && !api->config_has(host, "pretrained"))
        return api->config_fail(host, "reset_head",
                                "needs model.pretrained (without it every weight is new)");
    if (api->config_has(host, "pretrained"))
        return api->config_string(host, "pretrained", &m->pretrained);
    return VH_STATUS_OK;
}

/* `checkpoint_blocks`: none, all, or every k-th block from block 0. */
static vh_status read_checkpointing(vit *m) {
    vh_host *host = m->host;
    const char *text;
    vh_status st = host->api->config_string(host, "checkpoint_blocks", &text);
    if (st != VH_STATUS_OK) return st;
    if (strcmp(text, "none") == 0 || strcmp(text, "all") == 0) {
        m->checkpoint_every = text[0] == 'a';
        return VH_STATUS_OK;
    }
    char *end;
    errno = 0;
    long long k = strtoll(text, &end, 10);
    if (end == text || *end || errno || k < 1)
        return host->api->config_fail(host, "checkpoint_blocks",
                                      "'%s' is not none, all or an interval k >= 1 (k "
                                      "checkpoints blocks 0, k, 2k, ...)",
                                      text);
    m->checkpoint_every = k;
    return VH_STATUS_OK;
}

/* Shape from variant, explicit keys and the data; every rule checked here
 * so that a bad recipe fails at create with the key's file:line. */
static vh_status read_config(vit *m, const vh_model_setup *setup) {
    vit_shape s = {0, 0, 0, 0, 0};
    vh_status st = read_shape(m->host, &s);
    if (st == VH_STATUS_OK) st = read_data_shape(m, setup, s.patch);
    if (st == VH_STATUS_OK) st = read_training(m, setup);
    if (st == VH_STATUS_OK) st = read_checkpointing(m);
    if (st != VH_STATUS_OK) return st;
    m->patch = s.patch;
    m->grid_h = m->image_h / s.patch, m->grid_w = m->image_w / s.patch;
    m->num_patches = m->grid_h * m->grid_w;
    m->tokens = m->num_patches + (m->classifier == VIT_CLASSIFIER_TOKEN ? 1 : 0);
    m->dim = s.dim, m->depth = s.depth, m->heads = s.heads, m->head_dim = s.dim / s.heads;
    m->mlp_dim = s.mlp, m->patch_dim = m->channels * s.patch * s.patch;
    m->eps = 1e-6f; /* timm's ViT LayerNorm */
    return VH_STATUS_OK;
}

/* The ops this model needs; a device without one is refused up front. */
static vh_status check_device(vit *m) {
    const vh_device_ops *d = m->dev;
    const void *ops[] = {d->gemm, d->layernorm_forward, d->layernorm_backward,
                         d->gelu_forward, d->gelu_backward, d->add, d->bias_backward,
                         d->attention_forward, d->attention_backward,
                         d->softmax_cross_entropy, d->mean_pool_forward,
                         d->mean_pool_backward, d->patchify, d->embed_forward,
                         d->embed_backward, d->scale_rows, d->dropout_forward, d->mul};
    if (!VH_STRUCT_HAS(d, vh_device_ops, embed_backward))
        return m->host->api->fail(m->host, VH_STATUS_ERR_UNSUPPORTED,
                                  "device %s predates the compute ops this model needs", d->name);
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!ops[i])
            return m->host->api->fail(m->host, VH_STATUS_ERR_UNSUPPORTED,
                                      "device %s lacks compute op #%zu that vit needs; use "
                                      "run.device: cpu",
                                      d->name, i);
    return VH_STATUS_OK;
}

static void vit_destroy(void *self);

/* The policy's compute dtype is the activations'; a policy the model
 * cannot compute in is refused up front. */
static vh_status read_policy(vit *m, const vh_model_setup *setup) {
    memset(&m->policy, 0, sizeof m->policy);
    m->policy.struct_size = sizeof m->policy; /* no policy: all f32 */
    if (setup->policy) vh_struct_upgrade(&m->policy, sizeof m->policy, setup->policy);
    m->act = m->policy.compute_dtype;
    if (!vh_dtype_is_float(m->act))
        return m->host->api->fail(m->host, VH_STATUS_ERR_UNSUPPORTED,
                                  "vit computes in f32, bf16 or f16, not %s (the precision "
                                  "policy's compute dtype)",
                                  vh_dtype_name(m->act));
    m->act_size = vh_dtype_size(m->act);
    /* The softmax kept for backward: bf16 under a bf16 policy, as autocast's
     * softmax returns it (and as the forward's P V already reads it), else
     * f32. Half the bytes of the op's largest tensor: T1 AMP (Zen 5, 2
     * threads, `vithost bench --ops`, 2 runs each) attention forward 2.54-2.59
     * -> 2.24-2.45 ms a step, backward 3.18-3.27 -> 2.87-2.94. f16 keeps f32:
     * its probabilities under 2^-24 would flush, and no f16 kernel was timed. */
    m->probs_dtype = m->act == VH_DTYPE_BF16 ? VH_DTYPE_BF16 : VH_DTYPE_F32;
    m->probs_size = vh_dtype_size(m->probs_dtype);
    return VH_STATUS_OK;
}

static vh_status vit_create(vh_host *host, const vh_model_setup *setup_in, void **self) {
    /* Read through our own struct: members an older host lacks are zero. */
    vh_model_setup setup;
    if (!vh_struct_upgrade(&setup, sizeof setup, setup_in))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "model setup missing");
    vit *m = calloc(1, sizeof *m);
    if (!m) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    m->host = host;
    m->dev = host->api->device(host);
    if (m->dev->get_extension) {
        const vh_overwrite_ext *ow = m->dev->get_extension(m->dev->device, VH_OVERWRITE_EXTENSION);
        m->gelu_grad_writes = ow && (ow->ops & VH_OVERWRITE_OP_GELU_BACKWARD);
        m->attention_grad_writes = ow && (ow->ops & VH_OVERWRITE_OP_ATTENTION_BACKWARD);
    }
    m->max_batch = setup.max_batch;
    vh_status st = read_policy(m, &setup);
    if (st == VH_STATUS_OK && m->dev->get_extension) {
        /* 16-bit activations keep gelu_backward's numbers: a rounded gelu'(T)
         * is not the number an autocast reference computes (vh_device.h,
         * 2.5), so they take it in fc2's dX GEMM (2.7) where the device can */
        const vh_gemm_epilogue_ext *ep =
            m->dev->get_extension(m->dev->device, VH_GEMM_EPILOGUE_EXTENSION);
        const uint32_t both = (1u << VH_EPILOGUE_GELU_GRAD) | (1u << VH_EPILOGUE_MUL_AUX);
        m->gelu_grad_in_aux = m->act == VH_DTYPE_F32 && ep && (ep->epilogues & both) == both;
        m->gelu_backward_in_gemm = !m->gelu_grad_in_aux && ep &&
                                   (ep->epilogues & (1u << VH_EPILOGUE_GELU_BACKWARD));
    }
    if (st == VH_STATUS_OK) st = read_config(m, &setup);
    if (st == VH_STATUS_OK) st = check_device(m);
    if (st == VH_STATUS_OK) st = vit_build_table(m);
    if (st == VH_STATUS_OK) st = vit_build_layouts(m);
    if (st == VH_STATUS_OK) st = vit_alloc_activations(m);
    if (st != VH_STATUS_OK) {
        vit_destroy(m);
        return st;
    }
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "D %lld, L %lld, H %lld, M %lld, P %lld, N %lld, C %lld, %s classifier, %s; "
                   "%lld parameters; activations %s",
                   (long long)m->dim, (long long)m->depth, (long long)m->heads,
                   (long long)m->mlp_dim, (long long)m->patch, (long long)m->tokens,
                   (long long)m->classes,
                   m->classifier == VIT_CLASSIFIER_TOKEN ? "token" : "pooled",
                   m->layout == VIT_LAYOUT_BATCH_FIRST ? "batch_first" : "batch_second",
                   (long long)m->table.numel, vh_dtype_name(m->act));
    if (m->checkpoint_every > 0)
        host->api->log(host, VH_LOG_LEVEL_INFO,
                       "activation checkpointing: %lld of %lld blocks keep only their input "
                       "and recompute their forward in backward",
                       (long long)vit_checkpointed_blocks(m), (long long)m->depth);
    *self = m;
    return VH_STATUS_OK;
}

static void vit_destroy(void *self) {
    vit *m = self;
    if (!m) return;
    vit_free_activations(m);
    vit_free_layouts(m);
    vit_free_table(m);
    free(m);
}

static const vh_param_table *vit_param_table(void *self) { return &((vit *)self)->table; }


static vh_status vit_init_unit(void *self, int32_t unit, float *values, uint64_t seed) {
    vit *m = self;
    if (unit < 0 || unit >= m->table.num_units)
        return m->host->api->fail(m->host, VH_STATUS_ERR_INVALID_ARG, "no unit %d", (int)unit);
    (void)seed; /* the run seed; `model.init` may replace it, so use ours */
    const vh_unit_desc *u = &m->units[unit];
    for (int32_t p = 0; p < u->num_params; p++) {
        const vh_param_desc *d = &u->params[p];
        vh_param_init(d, values + d->offset, vh_splitmix64(m->init_seed ^ vh_splitmix64((uint64_t)unit << 16 | (uint64_t)p)));
    }
    return VH_STATUS_OK;
}

/* `pretrained`: the file a run starts from instead of the init rules. */
static vh_status vit_initial_weights(void *self, const char **path) {
    *path = ((vit *)self)->pretrained;
    return VH_STATUS_OK;
}

/* The state is the count of training forwards, which seeds the dropout and
 * drop-path masks of the next step: a resumed run draws the same masks. */
typedef struct vit_state {
    uint32_t magic, version;
    uint64_t train_forwards;
} vit_state;

enum { VIT_STATE_MAGIC = 0x54495656u /* "VVIT" */, VIT_STATE_VERSION = 1 };

static vh_status vit_state_size(void *self, size_t *bytes) {
    (void)self;
    *bytes = sizeof(vit_state);
    return VH_STATUS_OK;
}

static vh_status vit_state_save(void *self, void *buf, size_t bytes) {
    vit *m = self;
    if (bytes != sizeof(vit_state))
        return m->host->api->fail(m->host, VH_STATUS_ERR_INVALID_ARG, "state buffer of %zu bytes",
                                  bytes);
    vit_state s = {VIT_STATE_MAGIC, VIT_STATE_VERSION, m->train_forwards};
    memcpy(buf, &s, sizeof s);
    return VH_STATUS_OK;
}

static vh_status vit_state_load(void *self, const void *buf, size_t bytes) {
    vit *m = self;
    vit_state s;
    if (bytes != sizeof s)
        return m->host->api->fail(m->host, VH_STATUS_ERR_FORMAT,
                                  "model state of %zu bytes is not a vit state", bytes);
    memcpy(&s, buf, sizeof s);
    if (s.magic != VIT_STATE_MAGIC || s.version != VIT_STATE_VERSION)
        return m->host->api->fail(m->host, VH_STATUS_ERR_FORMAT,
                                  "model state is not a vit state of version %d",
                                  VIT_STATE_VERSION);
    m->train_forwards = s.train_forwards;
    return VH_STATUS_OK;
}

/* Device bytes of the buffers vit_alloc_activations (vit_table.c) holds at
 * max_batch, counted again from the same shapes: keep the two in step.
 * Activations, their gradients and dropout masks are in the compute dtype,
 * so they halve under a bf16 or f16 policy; attention probabilities are in
 * probs_dtype (bf16 under a bf16 policy); layer-norm statistics, drop-path
 * factors and the loss stay f32.
 * Checkpointed blocks keep only their input (x[l]) and share one block's
 * set, so L blocks hold L - checkpointed + 1 sets when any is. */
static vh_status vit_activation_bytes(void *self, int64_t *out) {
    const vit *m = self;
    int64_t B = m->max_batch, rows = B * m->tokens, prow = B * m->num_patches;
    int64_t D = m->dim, M = m->mlp_dim, C = m->classes, L = m->depth;
    int64_t ckpt = vit_checkpointed_blocks(m), sets = L - ckpt + (ckpt > 0);
    int dropout = m->dropout > 0.0f, drop_path = m->drop_path > 0.0f;
    /* compute-dtype elements: forward's, then backward's gradients */
    int64_t block = rows * D * 4 /* x_mid, ln1, attn, ln2 */ + rows * 3 * D /* qkv */ +
                    rows * M * 2 /* fc1, gelu */ +
                    (dropout ? rows * M + rows * D * 2 : 0) /* mask_fc1, _proj, _fc2 */;
    int64_t act = prow * m->patch_dim + prow * D /* patches, patch_emb */ +
                  (dropout ? rows * D : 0) /* mask_embed */ + (L + 1) * rows * D /* x */ +
                  sets * block + B * D * 2 /* feat, feat_ln */ + B * C /* logits */;
    act += rows * D * 3 /* d_x, d_tmp, d_branch */ + rows * 3 * D /* d_qkv */ +
           rows * M * 2 /* d_mlp, d_mlp2 */ + prow * D /* d_patch_emb */ +
           B * D * 2 /* d_feat, d_feat_ln */ + B * C /* d_logits */;
    /* f32 elements */
    int64_t f32 = sets * (rows * 4 /* ln1/ln2 mean and rstd */ +
                          (drop_path ? B * 2 : 0) /* dp_attn, dp_mlp */) +
                  B * 2 /* feat_mean, feat_rstd */ + 2 /* loss */;
    int64_t probs = sets * B * m->heads * m->tokens * m->tokens;
    *out = act * (int64_t)m->act_size + f32 * (int64_t)sizeof(float) +
           probs * (int64_t)m->probs_size;
    return VH_STATUS_OK;
}

static const vh_model_vtable vtable = {
    .struct_size = sizeof(vh_model_vtable),
    .create = vit_create,
    .destroy = vit_destroy,
    .param_table = vit_param_table,
    .init_unit = vit_init_unit,
    .forward = vit_forward,
    .backward = vit_backward,
    .train_flops_per_image = vit_train_flops_per_image,
    .state_size = vit_state_size,
    .state_save = vit_state_save,
    .state_load = vit_state_load,
    .initial_weights = vit_initial_weights,
    .load_weights = vit_load_weights,
    .activation_bytes = vit_activation_bytes,
};

VH_PLUGIN_DEFINE(VH_ROLE_MODEL, "vit", "0.1.0",
                 "Vision Transformer (timm-compatible names and layouts), token or pooled "
                 "classifier, batch-first or batch-second",
                 schema, vtable);
