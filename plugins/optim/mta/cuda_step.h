/* cuda_step.h - mta on a CUDA device: the step through the device's
 * "vh.cuda.mta" extension (vithost/vh_cuda_mta.h).
 *
 * The slices are device memory there; the update is the extension's
 * multi-tensor kernels (the formulas of algos.h), and only the numbers the
 * host must see cross to it: the per-slice sums of squares of clipping and
 * LAMB (one copy each, then the all-reduce and the trust ratios on the host,
 * as on the CPU). step.c calls these when mta.cuda is set; the CPU path
 * never touches them.
 */
#ifndef VH_MTA_CUDA_STEP_H
#define VH_MTA_CUDA_STEP_H

#include "algos.h"
#include "mta.h"

/* At create: the extension of `dev` (a CUDA device) into o->cuda, or a
 * failure that says why the device cannot run mta. */
vh_status mta_cuda_open(mta *o, const vh_device_ops *dev);
void mta_cuda_close(mta *o);

/* The squared global gradient norm: every slice's gradient on the device,
 * added over the ranks when the slices are sharded. */
vh_status mta_cuda_grad_sum_sq(mta *o, const vh_param_slices *slices, double *sq);

/* One AdamW, SGD or LAMB update of every slice. */
vh_status mta_cuda_update(mta *o, const vh_param_slices *slices, double lr, float grad_scale);

/* step.c's scalars, shared with the CPU passes. */
mta_adam_args mta_adam_args_of(const mta *o, double lr, float grad_scale);
double mta_trust_ratio(const double *sums, int adapt);

#endif
