/* vit_ops.h - the few compound steps forward and backward share. */
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

/* y (rows, out) = x (rows, in) @ w^T + b, with w (out, in) as nn.Linear. */
vh_status vit_linear_forward(vit *m, float *y, const float *x, const float *w, const float *b,
                             int64_t rows, int64_t in, int64_t out);

/* dw += dy^T @ x, db += column sums of dy, and dx = dy @ w (skipped when dx
 * is NULL). */
vh_status vit_linear_backward(vit *m, float *dx, float *dw, float *db, const float *dy,
                              const float *x, const float *w, int64_t rows, int64_t in,
                              int64_t out);

/* Attention arguments for this model's layout and a batch of B. */
vh_attention_args vit_attention_args(const vit *m, int64_t batch, const float *qkv, float *out,
                                     float *probs);

/* Stochastic-depth rate of block l: linear from 0 to drop_path (timm). */
float vit_drop_path_rate(const vit *m, int64_t l);

/* Counter-based seed of one random site (dropout or drop path) of a step. */
uint64_t vit_site_seed(const vit *m, uint64_t step, uint64_t site);

#endif
