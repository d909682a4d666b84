/* algos.h - the element-wise update kernels of the mta optimizer.
 *
 * Each kernel updates one chunk: n consecutive elements of one slice. The
 * caller (step.c) runs them over every chunk of every slice in one pass; a
 * kernel knows nothing of slices, tensors, ranks or threads.
 *
 * Arithmetic is fp32, one IEEE operation at a time, in the order of the
 * non-foreach torch 1.13 code (torch.optim.AdamW / torch.optim.SGD with
 * foreach=False), with every Python-float hyper-parameter rounded to float
 * where torch rounds it. The plugin is built without contraction
 * (-std=c11 keeps -ffp-contract=off), so a * b + c is two roundings; torch's
 * vectorised CPU kernels fuse some of them (add with alpha uses fmadd), so
 * the two may differ in the last bit. See each kernel for its formula.
 *
 * `grad_scale` is the clipping factor (1 when clipping is off or not
 * needed): the gradient the update sees is grad * grad_scale, one fp32
 * multiplication, as torch.nn.utils.clip_grad_norm_'s in-place mul_.
 *
 * `fresh` marks the first update: the state is then not read but starts as
 * torch starts it (zeros for the Adam moments, a copy of the first
 * direction for the SGD momentum buffer), whatever the sharding plugin
 * allocated.
 */
#ifndef VH_MTA_ALGOS_H
#define VH_MTA_ALGOS_H

#include <stdint.h>

/* Adam moments and bias correction, shared by AdamW and LAMB. */
typedef struct mta_adam_args {
    float grad_scale;
    float beta1, one_minus_beta1; /* float(b1), float(1 - b1) */
    float beta2, one_minus_beta2;
    float eps;
    int fresh;
    /* AdamW: -(lr / (1 - b1^t)) and sqrt(1 - b2^t), rounded to float. */
    float neg_step_size, bias_correction2_sqrt;
    /* LAMB: 1 - b1^t and 1 - b2^t, rounded to float. */
    float bias_correction1, bias_correction2;
} mta_adam_args;

/* torch.optim.AdamW, per element (decay = float(1 - lr * wd), 1 without decay):
 *     p = p * decay
 *     m = m * b1 + (1 - b1) * g
 *     v = v * b2 + ((1 - b2) * g) * g
 *     p = p + (-step_size * m) / (sqrt(v) / sqrt(1 - b2^t) + eps) */
void mta_adamw_chunk(const mta_adam_args *a, float decay, float *p, const float *g, float *m,
                     float *v, int64_t n);

/* LAMB (apex FusedLAMB, adam_w_mode), first half: the moments as AdamW's,
 * then the update direction
 *     u = (m / bc1) / (sqrt(v / bc2) + eps) + wd * p
 * whose squared norm, with the parameter's, is added to *u_sq and *p_sq
 * (double sums in a fixed order, see algos.c). Parameters are not touched. */
void mta_lamb_moments_chunk(const mta_adam_args *a, float wd, const float *p, const float *g,
                            float *m, float *v, int64_t n, double *p_sq, double *u_sq);

/* LAMB, second half: recomputes u from the updated moments (bit for bit the
 * u of the first half, so it needs no buffer) and applies
 *     p = p - rate * u,    rate = float(lr * trust_ratio). */
void mta_lamb_apply_chunk(const mta_adam_args *a, float wd, float rate, float *p,
                          const float *m, const float *v, int64_t n);

/* torch.optim.SGD, dampening 0 (wd = 0 without decay; mom NULL when
 * momentum is 0):
 *     d = g + wd * p                       (L2: the decay joins the gradient)
 *     buf = fresh ? d : buf * mu + d
 *     d = nesterov ? d + mu * buf : buf
 *     p = p + (-lr) * d */
typedef struct mta_sgd_args {
    float grad_scale;
    float neg_lr;
    float momentum;
    int nesterov;
    int fresh;
} mta_sgd_args;

void mta_sgd_chunk(const mta_sgd_args *a, float wd, float *p, const float *g, float *mom,
                   int64_t n);

/* Sum of squares of n values, each square exact in double, summed in a
 * fixed order that depends on n only. */
double mta_sum_squares(const float *x, int64_t n);

#endif
