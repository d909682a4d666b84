/* layernorm.c - LayerNorm over the last dim, biased variance (as PyTorch).
 *
 * Rows run in parallel. In backward, the parameter gradients are sums over
 * rows: each fixed chunk of rows sums its own, and the chunks are added in
 * order, so the result does not depend on the number of threads.
 * fp32 kernels: ops.c reads the arguments and converts other dtypes; the
 * statistics are fp32 whatever the storage. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "cpu_ops.h"

/* Rows per chunk of the parameter-gradient sums. */
#define LN_CHUNK_ROWS 64

void vh_cpu_k_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                                const float *weight, const float *bias, int64_t rows,
                                int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim > VH_CPU_PAR_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = out + r * dim;
        /* Sum x - x[0]: exact for a row far from 0 (x = 1000 + small), where
         * a plain float sum would lose the small part. */
        const float shift = xr[0];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < dim; j++) sum += xr[j] - shift;
        const float m = shift + sum / (float)dim;
        float var = 0.0f; /* two passes: no cancellation */
#pragma omp simd reduction(+ : var)
        for (int64_t j = 0; j < dim; j++) {
            float d = xr[j] - m;
            var += d * d;
        }
        const float s = 1.0f / sqrtf(var / (float)dim + eps);
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] - m) * s * weight[j] + bias[j];
        mean[r] = m;
        rstd[r] = s;
    }
}

void vh_cpu_k_layernorm_backward(float *dx, float *dweight, float *dbias, const float *dout,
                                 const float *x, const float *weight, const float *mean,
                                 const float *rstd, int64_t rows, int64_t dim) {
    if (rows == 0 || dim == 0) return;
    const int64_t chunks = (rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    /* Per chunk of rows: partial dweight (dim values) then partial dbias. */
    float *part = vh_cpu_scratch_alloc((size_t)chunks * 2 * (size_t)dim * sizeof(float));

    /* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight. */
#pragma omp parallel for schedule(static) if (rows * dim > VH_CPU_PAR_ELEMS)
    for (int64_t c = 0; c < chunks; c++) {
        float *pw = part + c * 2 * dim, *pb = pw + dim;
        memset(pw, 0, 2 * (size_t)dim * sizeof(float));
        const int64_t r1 = (c + 1) * LN_CHUNK_ROWS < rows ? (c + 1) * LN_CHUNK_ROWS : rows;
        for (int64_t r = c * LN_CHUNK_ROWS; r < r1; r++) {
            const float *xr = x + r * dim, *gr = dout + r * dim;
            const float m = mean[r], s = rstd[r];
            float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
            for (int64_t j = 0; j < dim; j++) {
                const float xhat = (xr[j] - m) * s;
                const float g = gr[j] * weight[j];
                sum_g += g;
                sum_gx += g * xhat;
                pw[j] += gr[j] * xhat;
                pb[j] += gr[j];
            }
            const float mg = sum_g / (float)dim, mgx = sum_gx / (float)dim;
            float *dr = dx + r * dim;
#pragma omp simd
            for (int64_t j = 0; j < dim; j++) {
                const float xhat = (xr[j] - m) * s;
                dr[j] += s * (gr[j] * weight[j] - mg - xhat * mgx);
            }
        }
    }
    /* Chunks in order: the same sums whatever the number of threads. */
    for (int64_t c = 1; c < chunks; c++) {
        const float *pc = part + c * 2 * dim;
#pragma omp simd
        for (int64_t j = 0; j < 2 * dim; j++) part[j] += pc[j];
    }
    if (dweight)
        for (int64_t j = 0; j < dim; j++) dweight[j] += part[j];
    if (dbias)
        for (int64_t j = 0; j < dim; j++) dbias[j] += part[dim + j];
}
