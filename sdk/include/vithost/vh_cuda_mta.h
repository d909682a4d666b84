/* vh_cuda_mta.h - the multi-tensor optimizer updates of the CUDA device: the
 * "vh.cuda.mta" extension (vh_device_ops.get_extension).
 *
 * The mta optimizer plugin (plugins/optim/mta) keeps its fp32 kernels for the
 * CPU; on a CUDA device it asks for this table and runs the same updates on
 * device memory: one launch over a list of tensors (multi-tensor apply), the
 * formulas of plugins/optim/mta/algos.h, one IEEE fp32 operation at a time
 * in the same order (no fused multiply-add), so f32 results are those of the
 * CPU kernels. Only the norms' double sums are added in another order.
 *
 * Conventions:
 * - Every call takes one vh_cuda_mta_args (struct_size first, zero-
 *   initialise, append-only). Its `tensors` list is host memory, read during
 *   the call only; the buffers it points at are device memory.
 * - Calls are issued to `stream` (NULL: the thread's current stream) and do
 *   not wait for the GPU; read `sums` back after a synchronize (or a copy on
 *   the same stream).
 * - Masters and gradients are f32, f16 or bf16, loaded into fp32; a 16-bit
 *   master is stored back rounded to nearest even. The moment buffers are
 *   f32. Another dtype: VH_STATUS_ERR_UNSUPPORTED, before any launch.
 * - `fresh` (the first update) zeroes the Adam moments, and starts the SGD
 *   momentum as a copy of the direction, whatever the buffers held.
 * - Reductions (sum_squares, lamb_moments) are deterministic: fp32 values
 *   squared in double, a tree per 64K-element chunk of a tensor in a fixed
 *   shape, then each tensor's chunks in order. No atomics.
 */
#ifndef VITHOST_VH_CUDA_MTA_H
#define VITHOST_VH_CUDA_MTA_H

#include <stddef.h>
#include <stdint.h>

#include "vh_device.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VH_CUDA_MTA_EXTENSION "vh.cuda.mta"

/* One tensor (or one slice of one) of an update. FROZEN for this extension:
 * a new member is a new type with calls of its own. */
typedef struct vh_cuda_mta_tensor {
    void *master;        /* numel values of master_dtype, updated in place */
    const void *grad;    /* numel values of grad_dtype (read only) */
    float *state[2];     /* f32 moments: adamw, lamb [0] m, [1] v; sgd [0] the
                          * momentum buffer (NULL: momentum 0); else NULL */
    void *copy;          /* NULL, or numel values of copy_dtype that receive the
                          * updated master (a low-precision compute copy) */
    int64_t numel;
    int32_t master_dtype, grad_dtype, copy_dtype; /* vh_dtype */
    int32_t decays;      /* 1: weight decay applies (VH_PARAM_FLAG_DECAY) */
    float lamb_rate;     /* lamb_apply: float(lr * trust ratio) of this tensor */
} vh_cuda_mta_tensor;

/* Scalars are the ones mta's step.c computes (algos.h): hyper-parameters
 * rounded to float where torch rounds its Python floats. */
typedef struct vh_cuda_mta_args {
    uint32_t struct_size;
    int32_t count;                     /* tensors */
    const vh_cuda_mta_tensor *tensors; /* host memory, count entries */
    float grad_scale;   /* the clipping factor (1: none): g * grad_scale */
    int32_t fresh;      /* the first update: the state is not read */
    /* Adam moments (adamw, lamb) */
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float neg_step_size, bias_correction2_sqrt; /* adamw */
    float bias_correction1, bias_correction2;   /* lamb */
    float decay;        /* adamw: float(1 - lr * wd), for tensors that decay */
    float weight_decay; /* sgd (L2), lamb: wd, for tensors that decay */
    /* sgd */
    float neg_lr, momentum;
    int32_t nesterov;
    /* sum_squares: count doubles; lamb_moments: 2 * count (||p||^2, ||u||^2
     * of tensor i at [2i], [2i + 1]). Device memory, overwritten. */
    double *sums;
    vh_stream *stream;
} vh_cuda_mta_args;

/* The extension's table. Append-only: check struct_size (VH_STRUCT_HAS)
 * before a member newer than your version. Each call: dev is the
 * vh_device_ops.device the table came from; VH_STATUS_ERR_INVALID_ARG on a
 * NULL pointer a tensor needs or a negative count or numel. */
typedef struct vh_cuda_mta_ops {
    uint32_t struct_size;
    /* @required. torch.optim.AdamW: p = p * decay, m, v updated, then
     * p += (neg_step_size * m) / (sqrt(v) / bias_correction2_sqrt + eps). */
    vh_status (*adamw)(vh_device *dev, const vh_cuda_mta_args *args);
    /* @required. torch.optim.SGD, dampening 0: d = g + wd * p (wd only on
     * decaying tensors, skipped at 0), momentum (state[0]), Nesterov,
     * p += neg_lr * d. */
    vh_status (*sgd)(vh_device *dev, const vh_cuda_mta_args *args);
    /* @required. LAMB, first half: updates m and v, and writes per tensor
     * ||p||^2 and ||u||^2 into sums, u = (m / bc1) / (sqrt(v / bc2) + eps)
     * + wd * p. Parameters are not touched. The caller adds the sums over
     * ranks and computes each lamb_rate. */
    vh_status (*lamb_moments)(vh_device *dev, const vh_cuda_mta_args *args);
    /* @required. LAMB, second half: p = p - lamb_rate * u, u recomputed from
     * the moments bit for bit as in lamb_moments. */
    vh_status (*lamb_apply)(vh_device *dev, const vh_cuda_mta_args *args);
    /* @required. Per tensor, the sum of squares of its gradient (unscaled)
     * into sums: the global norm of gradient clipping. */
    vh_status (*sum_squares)(vh_device *dev, const vh_cuda_mta_args *args);
} vh_cuda_mta_ops;

#ifdef __cplusplus
}
#endif
#endif
