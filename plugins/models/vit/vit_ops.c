/* vit_ops.c - the device ops of vit_ops.h: each fills one argument struct
 * (zero members are the defaults: no epilogue, the current stream) and calls
 * the device. */
#include "vit_ops.h"

#include <math.h>
#include <string.h>

#include "vithost/vh_random.h"

vh_status vit_op_failed(vit *m, vh_status st, const char *op) {
    return m->host->api->fail(m->host, st, "%s failed on %s (%s, activations %s)", op,
                              m->dev->name, vh_status_str(st), vh_dtype_name(m->act));
}

/* ---- linear layers ------------------------------------------------------ */

/* y = epilogue(x @ w^T + b) + residual; aux receives the pre-activation. */
static vh_status linear(vit *m, void *y, const void *x, vit_ref w, vit_ref b, int64_t rows,
                        int64_t in, int64_t out, vh_epilogue epilogue, void *aux,
                        const void *residual) {
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = 0, .trans_b = 1,
                      .m = rows, .n = out, .k = in, .alpha = 1.0f, .beta = 0.0f,
                      .a = x, .lda = in, .b = w.ptr, .ldb = in, .c = y, .ldc = out,
                      .batch = 1, .bias = b.ptr, .ab_dtype = m->act, .c_dtype = m->act,
                      .bias_dtype = b.dtype, .epilogue = epilogue, .aux = aux,
                      .residual = residual};
    return m->dev->gemm(m->dev->device, &g);
}

vh_status vit_linear(vit *m, void *y, const void *x, vit_ref w, vit_ref b, int64_t rows,
                     int64_t in, int64_t out) {
    return linear(m, y, x, w, b, rows, in, out, VH_EPILOGUE_NONE, NULL, NULL);
}

vh_status vit_linear_residual(vit *m, void *y, const void *x, vit_ref w, vit_ref b,
                              const void *residual, int64_t rows, int64_t in, int64_t out) {
    return linear(m, y, x, w, b, rows, in, out, VH_EPILOGUE_NONE, NULL, residual);
}

vh_status vit_linear_gelu(vit *m, void *y, void *pre, const void *x, vit_ref w, vit_ref b,
                          int64_t rows, int64_t in, int64_t out) {
    return linear(m, y, x, w, b, rows, in, out,
                  m->gelu_grad_in_aux ? VH_EPILOGUE_GELU_GRAD : VH_EPILOGUE_GELU, pre, NULL);
}

/* vit_linear_backward; with an epilogue, dx = epilogue(dy @ w) with aux
 * (VH_EPILOGUE_MUL_AUX: times aux; VH_EPILOGUE_GELU_BACKWARD: gelu'(aux)
 * times it). */
static vh_status linear_backward(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dy,
                                 const void *x, vit_ref w, int64_t rows, int64_t in, int64_t out,
                                 vh_epilogue epilogue, const void *aux) {
    const vh_device_ops *d = m->dev;
    /* dw (out, in) += dy^T (out, rows) @ x (rows, in) */
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = 1, .trans_b = 0,
                      .m = out, .n = in, .k = rows, .alpha = 1.0f, .beta = 1.0f,
                      .a = dy, .lda = out, .b = x, .ldb = in, .c = dw.ptr, .ldc = in,
                      .batch = 1, .ab_dtype = m->act, .c_dtype = dw.dtype};
    vh_status st = d->gemm(d->device, &g);
    if (st == VH_STATUS_OK && db.ptr) {
        vh_rows_args r = {.struct_size = sizeof r, .rows = rows, .cols = out, .dtype = m->act,
                          .out_dtype = db.dtype, .dout = dy, .out = db.ptr};
        st = d->bias_backward(d->device, &r);
    }
    if (st != VH_STATUS_OK || !dx) return st;
    /* dx (rows, in) = dy (rows, out) @ w (out, in) */
    vh_gemm_args h = {.struct_size = sizeof h, .trans_a = 0, .trans_b = 0,
                      .m = rows, .n = in, .k = out, .alpha = 1.0f, .beta = 0.0f,
                      .a = dy, .lda = out, .b = w.ptr, .ldb = in, .c = dx, .ldc = in,
                      .batch = 1, .ab_dtype = m->act, .c_dtype = m->act,
                      .epilogue = epilogue, .aux = (void *)(uintptr_t)aux};
    return d->gemm(d->device, &h);
}

vh_status vit_linear_backward(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dy,
                              const void *x, vit_ref w, int64_t rows, int64_t in, int64_t out) {
    return linear_backward(m, dx, dw, db, dy, x, w, rows, in, out, VH_EPILOGUE_NONE, NULL);
}

vh_status vit_linear_backward_mul(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dy,
                                  const void *x, vit_ref w, int64_t rows, int64_t in,
                                  int64_t out, const void *dx_mul) {
    return linear_backward(m, dx, dw, db, dy, x, w, rows, in, out, VH_EPILOGUE_MUL_AUX, dx_mul);
}

vh_status vit_linear_backward_gelu(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dy,
                                   const void *x, vit_ref w, int64_t rows, int64_t in,
                                   int64_t out, const void *pre) {
    return linear_backward(m, dx, dw, db, dy, x, w, rows, in, out, VH_EPILOGUE_GELU_BACKWARD,
                           pre);
}

/* ---- layer norm ----------------------------------------------------------- */

vh_status vit_layernorm(vit *m, void *out, float *mean, float *rstd, const void *x, vit_ref w,
                        vit_ref b, int64_t rows) {
    vh_layernorm_args a = {.struct_size = sizeof a, .rows = rows, .dim = m->dim, .eps = m->eps,
                           .dtype = m->act, .param_dtype = w.dtype, .x = x, .weight = w.ptr,
                           .bias = b.ptr, .mean = mean, .rstd = rstd, .out = out};
    return m->dev->layernorm_forward(m->dev->device, &a);
}

vh_status vit_layernorm_backward(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dout,
                                 const void *x, vit_ref w, const float *mean, const float *rstd,
                                 int64_t rows) {
    vh_layernorm_args a = {.struct_size = sizeof a, .rows = rows, .dim = m->dim, .eps = m->eps,
                           .dtype = m->act, .param_dtype = w.dtype, .grad_dtype = dw.dtype,
                           .x = x, .weight = w.ptr, .mean = (float *)mean,
                           .rstd = (float *)rstd, .dout = dout, .dx = dx, .dweight = dw.ptr,
                           .dbias = db.ptr};
    return m->dev->layernorm_backward(m->dev->device, &a);
}

/* ---- element-wise --------------------------------------------------------- */

vh_status vit_add(vit *m, void *out, const void *a, const void *b, int64_t n) {
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = m->act, .a = a, .b = b,
                         .out = out};
    return m->dev->add(m->dev->device, &e);
}

vh_status vit_mul(vit *m, void *out, const void *a, const void *b, int64_t n) {
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = m->act, .a = a, .b = b,
                         .out = out};
    return m->dev->mul(m->dev->device, &e);
}

vh_status vit_dropout(vit *m, void *out, void *mask, const void *x, int64_t n, uint64_t seed) {
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = m->act, .x = x, .out = out,
                         .mask = mask, .p = m->dropout, .seed = seed};
    return m->dev->dropout_forward(m->dev->device, &e);
}

vh_status vit_gelu_backward(vit *m, void *dx, const void *x, const void *dout, int64_t n) {
    if (!m->gelu_grad_writes) {
        vh_status st = vit_zero(m, dx, n);
        if (st != VH_STATUS_OK) return st;
    }
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = m->act, .x = x,
                         .dout = dout, .dx = dx, .overwrite = m->gelu_grad_writes};
    return m->dev->gelu_backward(m->dev->device, &e);
}

vh_status vit_scale_rows(vit *m, void *out, const void *in, const float *scale, int64_t batch,
                         int accumulate) {
    /* one factor per sample: batch-first rows run b * N + t, batch-second t * B + b */
    int64_t div = m->layout == VIT_LAYOUT_BATCH_FIRST ? m->tokens : 1;
    vh_eltwise_args e = {.struct_size = sizeof e, .n = batch * m->tokens * m->dim,
                         .dtype = m->act, .x = in, .out = out, .scale = scale, .dim = m->dim,
                         .div = div, .mod = batch, .accumulate = accumulate};
    return m->dev->scale_rows(m->dev->device, &e);
}

vh_status vit_drop_path_scale(vit *m, float *scale, float rate, int64_t batch, uint64_t seed) {
    const vh_device_ops *d = m->dev;
    if (VH_STRUCT_HAS(d, vh_device_ops, drop_path_scale) && d->drop_path_scale) {
        vh_eltwise_args e = {.struct_size = sizeof e, .n = batch, .dtype = VH_DTYPE_F32,
                             .out = scale, .p = rate, .seed = seed};
        return d->drop_path_scale(d->device, &e);
    }
    /* A device without the op (2.0, CUDA for now): the same draw on the
     * host, then a copy, which on a GPU waits for the host. */
    for (int64_t b = 0; b < batch; b++) {
        double u = (double)(vh_splitmix64(seed + (uint64_t)b) >> 11) * 0x1.0p-53;
        m->dp_host[b] = u < rate ? 0.0f : 1.0f / (1.0f - rate);
    }
    return d->copy(d->device, scale, m->dp_host, (size_t)batch * sizeof(float),
                   VH_COPY_KIND_HOST_TO_DEVICE, NULL);
}

vh_status vit_zero(vit *m, void *p, int64_t count) {
    return m->dev->memset_zero(m->dev->device, p, (size_t)count * m->act_size, NULL);
}

/* ---- tokens ----------------------------------------------------------------- */

vh_status vit_patchify(vit *m, void *patches, const float *images, int64_t batch) {
    int64_t Np = m->num_patches, K = m->patch_dim;
    vh_tokens_args t = {.struct_size = sizeof t, .batch = batch, .tokens = Np, .dim = K,
                        .batch_stride = Np * K, .token_stride = K, .dtype = m->act,
                        .image_dtype = VH_DTYPE_F32, .out = patches, .images = images,
                        .channels = m->channels, .height = m->image_h, .width = m->image_w,
                        .patch = m->patch, .num_patches = Np};
    return m->dev->patchify(m->dev->device, &t);
}

/* The residual stream's strides and the batch-first patch rows. */
static vh_tokens_args embed_args(vit *m, vh_dtype param_dtype, vh_dtype grad_dtype,
                                 int64_t batch) {
    int64_t Np = m->num_patches, D = m->dim;
    vh_tokens_args t = {.struct_size = sizeof t, .batch = batch, .tokens = m->tokens, .dim = D,
                        .batch_stride = vit_batch_stride(m),
                        .token_stride = vit_token_stride(m, batch), .dtype = m->act,
                        .param_dtype = param_dtype, .grad_dtype = grad_dtype,
                        .num_patches = Np, .patch_batch_stride = Np * D,
                        .patch_token_stride = D};
    return t;
}

vh_status vit_embed(vit *m, void *x, const void *patch_emb, vit_ref cls, vit_ref pos,
                    int64_t batch) {
    vh_tokens_args t = embed_args(m, pos.dtype, VH_DTYPE_F32, batch);
    t.out = x;
    t.patches = patch_emb;
    t.cls = cls.ptr;
    t.pos = pos.ptr;
    return m->dev->embed_forward(m->dev->device, &t);
}

vh_status vit_embed_backward(vit *m, void *dpatch_emb, vit_ref dcls, vit_ref dpos,
                             const void *dx, int64_t batch) {
    vh_tokens_args t = embed_args(m, VH_DTYPE_F32, dpos.dtype, batch);
    t.dout = dx;
    t.dpatches = dpatch_emb;
    t.dcls = dcls.ptr;
    t.dpos = dpos.ptr;
    return m->dev->embed_backward(m->dev->device, &t);
}

/* The class token is token 0; the pooled head averages every token (there
 * is no class token then). */
static vh_tokens_args pool_args(vit *m, int64_t batch) {
    int pooled = m->classifier == VIT_CLASSIFIER_POOLED;
    vh_tokens_args t = {.struct_size = sizeof t, .batch = batch, .tokens = m->tokens,
                        .dim = m->dim, .batch_stride = vit_batch_stride(m),
                        .token_stride = vit_token_stride(m, batch), .dtype = m->act,
                        .first = 0, .count = pooled ? m->tokens : 1};
    return t;
}

vh_status vit_pool(vit *m, void *feat, const void *x, int64_t batch) {
    vh_tokens_args t = pool_args(m, batch);
    t.x = x;
    t.out = feat;
    return m->dev->mean_pool_forward(m->dev->device, &t);
}

vh_status vit_pool_backward(vit *m, void *dx, const void *dfeat, int64_t batch) {
    vh_tokens_args t = pool_args(m, batch);
    t.dout = dfeat;
    t.dx = dx;
    return m->dev->mean_pool_backward(m->dev->device, &t);
}

/* ---- attention and loss --------------------------------------------------- */

static vh_attention_args attention_args(const vit *m, int64_t batch, const void *qkv,
                                        void *out, void *probs) {
    /* qkv rows are 3D wide, out rows D wide; the layout only moves rows. */
    vh_attention_args a = {.struct_size = sizeof a, .batch = batch, .tokens = m->tokens,
                           .heads = m->heads, .head_dim = m->head_dim,
                           .qkv_batch_stride = 3 * vit_batch_stride(m),
                           .qkv_token_stride = 3 * vit_token_stride(m, batch),
                           .out_batch_stride = vit_batch_stride(m),
                           .out_token_stride = vit_token_stride(m, batch),
                           .scale = 1.0f / sqrtf((float)m->head_dim), .qkv = qkv, .out = out,
                           .probs = probs, .dtype = m->act, .probs_dtype = m->probs_dtype};
    return a;
}

vh_status vit_attention(vit *m, void *out, void *probs, const void *qkv, int64_t batch) {
    vh_attention_args a = attention_args(m, batch, qkv, out, probs);
    return m->dev->attention_forward(m->dev->device, &a);
}

vh_status vit_attention_backward(vit *m, void *dqkv, const void *dout, const void *qkv,
                                 const void *out, void *probs, int64_t batch) {
    if (!m->attention_grad_writes) {
        vh_status st = vit_zero(m, dqkv, batch * m->tokens * 3 * m->dim);
        if (st != VH_STATUS_OK) return st;
    }
    vh_attention_args a = attention_args(m, batch, qkv, (void *)out, probs);
    a.dout = dout;
    a.dqkv = dqkv;
    a.overwrite = m->attention_grad_writes;
    return m->dev->attention_backward(m->dev->device, &a);
}

vh_status vit_cross_entropy(vit *m, float *loss, void *dlogits, const void *logits,
                            const int32_t *labels, const float *targets, int64_t batch,
                            float loss_scale) {
    vh_xent_args x = {.struct_size = sizeof x, .batch = batch, .classes = m->classes,
                      .smoothing = m->label_smoothing, .dloss_scale = loss_scale,
                      .dtype = m->act, .logits = logits, .labels = labels, .loss = loss,
                      .dlogits = dlogits, .targets = targets};
    return m->dev->softmax_cross_entropy(m->dev->device, &x);
}

/* ---- random sites ----------------------------------------------------------- */

float vit_drop_path_rate(const vit *m, int64_t l) {
    if (m->depth < 2) return 0.0f;
    return m->drop_path * (float)l / (float)(m->depth - 1);
}

uint64_t vit_site_seed(const vit *m, uint64_t step, uint64_t site) {
    return vh_splitmix64(m->dropout_seed ^ vh_splitmix64(step * 1024u + site));
}
