/* loss.cu - mean softmax cross-entropy with label smoothing, as
 * torch.nn.CrossEntropyLoss(label_smoothing=s); the CPU twin is
 * sdk/src/cpu/loss.c (math, in double as there) and ops.c (checks).
 * With target q = (1 - s) onehot(y) + s / C:
 *   loss_b = logsumexp(z) - sum_c q_c z_c,  dloss_b/dz = softmax(z) - q.
 *
 * Two kernels, deterministic: one block per row writes the row's loss to a
 * temporary buffer (and accumulates its gradient), then one block adds the
 * rows' losses in a fixed tree and writes the mean to *loss.
 *
 * Labels live in device memory, so the host cannot refuse an out-of-range
 * label before the launch as the CPU does: such a row's loss is NaN (so the
 * mean is NaN) and its gradient is left untouched.
 *
 * Soft targets (ABI 2.2, `targets` not NULL, B x C f32): xent_soft_kernel,
 * the same block per row and the same mean, with
 *   loss_b = sum_c t_c (logsumexp(z) - z_c),  dloss_b/dz = softmax(z) - t. */
#include "cuda_internal.h"
#include "reduce.cuh"

/* Threads of the final sum (one block). */
#define XENT_SUM_THREADS 256

/* Row b (rows loop over the grid): the max, then sum e^(z - max) and
 * sum (z - max) in double (block trees), then the loss and the gradient. */
__global__ static void xent_rows_kernel(double *row_loss, void *dlogits, const void *logits,
                                        const int32_t *labels, int32_t dt, int64_t batch,
                                        int64_t classes, double on, double off, double gscale) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
        const int64_t base = b * classes;
        const int64_t y = labels[b];
        float mx = -INFINITY;
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
            mx = fmaxf(mx, vh_cuda_load(logits, dt, base + c));
        mx = vh_cuda_block_max(mx, shf);
        double sum = 0.0, zsum = 0.0;
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
            const float z = vh_cuda_load(logits, dt, base + c);
            sum += (double)expf(z - mx);
            zsum += (double)z - (double)mx;
        }
        sum = vh_cuda_block_sum_d(sum, shd);
        zsum = vh_cuda_block_sum_d(zsum, shd);
        if (y < 0 || y >= classes) { /* the same branch for the whole block */
            if (threadIdx.x == 0) row_loss[b] = (double)NAN;
            continue;
        }
        if (threadIdx.x == 0) {
            const double zy = (double)vh_cuda_load(logits, dt, base + y) - (double)mx;
            row_loss[b] = log(sum) - (on - off) * zy - off * zsum;
        }
        if (!dlogits) continue;
        const double inv = 1.0 / sum;
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
            const double p = (double)expf(vh_cuda_load(logits, dt, base + c) - mx) * inv;
            const double q = c == y ? on : off;
            const float g = vh_cuda_load(dlogits, dt, base + c) + (float)(gscale * (p - q));
            vh_cuda_store(dlogits, dt, base + c, g);
        }
    }
}

/* Row b with soft targets t: the max, then sum e^(z - max), then
 * sum t_c (lse - (z_c - max)) (block trees in double), then the gradient. */
__global__ static void xent_soft_kernel(double *row_loss, void *dlogits, const void *logits,
                                        const float *targets, int32_t dt, int64_t batch,
                                        int64_t classes, double gscale) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
        const int64_t base = b * classes;
        float mx = -INFINITY;
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
            mx = fmaxf(mx, vh_cuda_load(logits, dt, base + c));
        mx = vh_cuda_block_max(mx, shf);
        double sum = 0.0;
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
            sum += (double)expf(vh_cuda_load(logits, dt, base + c) - mx);
        sum = vh_cuda_block_sum_d(sum, shd);
        const double lse = log(sum);
        double row = 0.0;
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
            const double z = (double)vh_cuda_load(logits, dt, base + c) - (double)mx;
            row += (double)targets[base + c] * (lse - z);
        }
        row = vh_cuda_block_sum_d(row, shd);
        if (threadIdx.x == 0) row_loss[b] = row;
        if (!dlogits) continue;
        const double inv = 1.0 / sum;
        for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
            const double p = (double)expf(vh_cuda_load(logits, dt, base + c) - mx) * inv;
            const float g = vh_cuda_load(dlogits, dt, base + c) +
                            (float)(gscale * (p - (double)targets[base + c]));
            vh_cuda_store(dlogits, dt, base + c, g);
        }
    }
}

/* One block: thread i adds rows i, i + blockDim, ... in order, then a block
 * tree; *loss = the mean. */
__global__ static void xent_mean_kernel(float *loss, const double *row_loss, int64_t batch) {
    __shared__ double shd[32];
    double s = 0.0;
    for (int64_t b = threadIdx.x; b < batch; b += blockDim.x) s += row_loss[b];
    s = vh_cuda_block_sum_d(s, shd);
    if (threadIdx.x == 0) *loss = (float)(s / (double)batch);
}

vh_status vh_cuda_softmax_cross_entropy(vh_device *dev, const vh_xent_args *in) {
    vh_xent_args a;
    if (!VH_CUDA_READ_ARGS(vh_xent_args, in, a) || !vh_cuda_is_float(a.dtype))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!a.loss || a.batch < 0 || a.classes <= 0 ||
        (!a.targets && !(a.smoothing >= 0.0f && a.smoothing <= 1.0f)))
        return VH_STATUS_ERR_INVALID_ARG;
    cudaStream_t s = vh_cuda_stream(dev, a.stream);
    if (a.batch == 0) /* nothing to average; no gradient */
        return vh_cuda_status(cudaMemsetAsync(a.loss, 0, sizeof(float), s));
    if (!a.logits || (!a.labels && !a.targets)) return VH_STATUS_ERR_INVALID_ARG;
    double *row_loss = NULL;
    vh_status st =
        vh_cuda_alloc_temp_on(dev, s, (size_t)a.batch * sizeof(double), (void **)&row_loss);
    if (st != VH_STATUS_OK) return st;
    const double off = (double)a.smoothing / (double)a.classes; /* q_c off the label */
    const double on = 1.0 - (double)a.smoothing + off;          /* q_y */
    const double gscale = (double)a.dloss_scale / (double)a.batch;
    const unsigned blocks = vh_cuda_blocks(a.batch, 1, VH_CUDA_MAX_BLOCKS);
    if (a.targets) /* soft targets (2.2): labels and smoothing are not read */
        xent_soft_kernel<<<blocks, VH_CUDA_THREADS, 0, s>>>(row_loss, a.dlogits, a.logits,
                                                            a.targets, a.dtype, a.batch,
                                                            a.classes, gscale);
    else
        xent_rows_kernel<<<blocks, VH_CUDA_THREADS, 0, s>>>(row_loss, a.dlogits, a.logits,
                                                            a.labels, a.dtype, a.batch,
                                                            a.classes, on, off, gscale);
    st = vh_cuda_launched();
    if (st == VH_STATUS_OK) {
        xent_mean_kernel<<<1, XENT_SUM_THREADS, 0, s>>>(a.loss, row_loss, a.batch);
        st = vh_cuda_launched();
    }
    vh_cuda_free_temp(dev, row_loss); /* stream-ordered: after the kernels above */
    return st;
}
