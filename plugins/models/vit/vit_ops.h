/* vit_ops.h - one call per device op, in this model's terms.
 *
 * Each helper fills one argument struct of vh_device.h: activations (and
 * their gradients) in the policy's compute dtype m->act, parameters and
 * their gradients as vit_refs carrying the dtype their layout gives, layer
 * norm statistics in f32, attention probabilities in m->probs_dtype (bf16
 * under a bf16 policy, else f32). So forward and
 * backward read like the math, one line per op, whatever the precision. */
#ifndef VITHOST_PLUGIN_VIT_OPS_H
#define VITHOST_PLUGIN_VIT_OPS_H

#include "vit.h"

/* A failed device op becomes a message naming the op. */
vh_status vit_op_failed(vit *m, vh_status st, const char *op);

#define VIT_TRY(m, op, expr)                                          \
    do {                                                              \
        vh_status st_ = (expr);                                       \
        if (st_ != VH_STATUS_OK) return vit_op_failed((m), st_, (op)); \
    } while (0)

/* ---- linear layers: w (out, in) and b (out) as nn.Linear ---------------- */

/* y (rows, out) = x (rows, in) @ w^T + b */
vh_status vit_linear(vit *m, void *y, const void *x, vit_ref w, vit_ref b, int64_t rows,
                     int64_t in, int64_t out);
/* y = residual + x @ w^T + b, in one GEMM (the residual add of a branch) */
vh_status vit_linear_residual(vit *m, void *y, const void *x, vit_ref w, vit_ref b,
                              const void *residual, int64_t rows, int64_t in, int64_t out);
/* pre = x @ w^T + b and y = gelu(pre), in one GEMM (pre is what
 * gelu_backward needs; with m->gelu_grad_in_aux, pre receives gelu'(pre)
 * instead, what vit_linear_backward_mul takes) */
vh_status vit_linear_gelu(vit *m, void *y, void *pre, const void *x, vit_ref w, vit_ref b,
                          int64_t rows, int64_t in, int64_t out);
/* dw += dy^T @ x, db += column sums of dy, and dx = dy @ w (skipped when dx
 * is NULL). */
vh_status vit_linear_backward(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dy,
                              const void *x, vit_ref w, int64_t rows, int64_t in, int64_t out);
/* The same with dx = (dy @ w) * dx_mul (rows x in), the product in the dx
 * GEMM's epilogue (ABI 2.5 VH_EPILOGUE_MUL_AUX: only with m->gelu_grad_in_aux). */
vh_status vit_linear_backward_mul(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dy,
                                  const void *x, vit_ref w, int64_t rows, int64_t in,
                                  int64_t out, const void *dx_mul);
/* The same with dx = gelu_backward(pre, dy @ w), written (ABI 2.7
 * VH_EPILOGUE_GELU_BACKWARD: only with m->gelu_backward_in_gemm). */
vh_status vit_linear_backward_gelu(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dy,
                                   const void *x, vit_ref w, int64_t rows, int64_t in,
                                   int64_t out, const void *pre);

/* ---- layer norm over D ------------------------------------------------- */

vh_status vit_layernorm(vit *m, void *out, float *mean, float *rstd, const void *x, vit_ref w,
                        vit_ref b, int64_t rows);
/* dx, dw, db += ... */
vh_status vit_layernorm_backward(vit *m, void *dx, vit_ref dw, vit_ref db, const void *dout,
                                 const void *x, vit_ref w, const float *mean, const float *rstd,
                                 int64_t rows);

/* ---- element-wise, n elements ------------------------------------------ */

vh_status vit_add(vit *m, void *out, const void *a, const void *b, int64_t n);
/* out = a * b */
vh_status vit_mul(vit *m, void *out, const void *a, const void *b, int64_t n);
/* mask = keep ? 1/(1-p) : 0 drawn from seed, out = x * mask (p = m->dropout) */
vh_status vit_dropout(vit *m, void *out, void *mask, const void *x, int64_t n, uint64_t seed);
/* dx = gelu'(x) * dout (dx's old values are not used): one pass where the
 * device writes on request (m->gelu_grad_writes), else zeroed and added to */
vh_status vit_gelu_backward(vit *m, void *dx, const void *x, const void *dout, int64_t n);
/* Rows of the (B * N, D) stream times their sample's factor; out += with
 * accumulate. */
vh_status vit_scale_rows(vit *m, void *out, const void *in, const float *scale, int64_t batch,
                         int accumulate);
/* scale (B f32, device) = each sample's drop-path factor, 0 or 1/(1-rate),
 * drawn from seed by the device's drop_path_scale (on the host and copied
 * in where the device lacks it: the same factors) */
vh_status vit_drop_path_scale(vit *m, float *scale, float rate, int64_t batch, uint64_t seed);
/* count activation elements (of m->act) to zero */
vh_status vit_zero(vit *m, void *p, int64_t count);

/* ---- tokens ------------------------------------------------------------- */

/* f32 images (B, C, H, W) to patch rows (B * Np, K) */
vh_status vit_patchify(vit *m, void *patches, const float *images, int64_t batch);
/* stream x = [cls] + patch embeddings, + pos; cls.ptr NULL without a class token */
vh_status vit_embed(vit *m, void *x, const void *patch_emb, vit_ref cls, vit_ref pos,
                    int64_t batch);
/* dpatch_emb, dcls, dpos += ...; dcls.ptr NULL without a class token */
vh_status vit_embed_backward(vit *m, void *dpatch_emb, vit_ref dcls, vit_ref dpos,
                             const void *dx, int64_t batch);
/* feat (B, D) = the class token, or the mean of every token (pooled) */
vh_status vit_pool(vit *m, void *feat, const void *x, int64_t batch);
/* dx += the gradient of vit_pool */
vh_status vit_pool_backward(vit *m, void *dx, const void *dfeat, int64_t batch);

/* ---- attention and loss ------------------------------------------------- */

vh_status vit_attention(vit *m, void *out, void *probs, const void *qkv, int64_t batch);
/* dqkv = the attention's gradients (B * N * 3D elements: written where the
 * device offers ABI 2.6's overwrite, else zeroed and added to) */
vh_status vit_attention_backward(vit *m, void *dqkv, const void *dout, const void *qkv,
                                 const void *out, void *probs, int64_t batch);
/* *loss (device f32) = mean cross-entropy of the logits against the labels
 * (with label_smoothing) or, when targets (device f32, batch x classes) is
 * not NULL, against those soft targets; when dlogits is not NULL, dlogits +=
 * loss_scale * d(loss)/d(logits). */
vh_status vit_cross_entropy(vit *m, float *loss, void *dlogits, const void *logits,
                            const int32_t *labels, const float *targets, int64_t batch,
                            float loss_scale);

/* ---- random sites ------------------------------------------------------- */

/* Stochastic-depth rate of block l: linear from 0 to drop_path (timm). */
float vit_drop_path_rate(const vit *m, int64_t l);

/* Counter-based seed of one random site (dropout or drop path) of a step. */
uint64_t vit_site_seed(const vit *m, uint64_t step, uint64_t site);

#endif
