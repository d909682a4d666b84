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

/* Rows per task of the forward pass. */
#define LN_ROW_BLOCK 16

/* Rows [r0, r1) of the forward pass. */
VH_CPU_CLONES static void layernorm_rows(float *out, float *mean, float *rstd, const float *x,
                                         const float *weight, const float *bias, int64_t r0,
                                         int64_t r1, int64_t dim, float eps) {
    for (int64_t r = r0; r < r1; r++) {
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

void vh_cpu_k_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                                const float *weight, const float *bias, int64_t rows,
                                int64_t dim, float eps) {
    const int64_t blocks = (rows + LN_ROW_BLOCK - 1) / LN_ROW_BLOCK;
#pragma omp parallel for schedule(static) if (rows * dim > VH_CPU_PAR_ELEMS)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * LN_ROW_BLOCK;
        layernorm_rows(out, mean, rstd, x, weight, bias, r0,
                       r0 + LN_ROW_BLOCK < rows ? r0 + LN_ROW_BLOCK : rows, dim, eps);
    }
}

/* One chunk of rows [r0, r1) of the backward pass: dx of its rows, and its
 * partial dweight (pw) and dbias (pb), overwritten. */
VH_CPU_CLONES static void layernorm_backward_rows(float *dx, float *pw, float *pb,
                                                  const float *dout, const float *x,
                                                  const float *weight, const float *mean,
                                                  const float *rstd, int64_t r0, int64_t r1,
                                                  int64_t dim) {
    memset(pw, 0, (size_t)dim * sizeof(float));
    memset(pb, 0, (size_t)dim * sizeof(float));
    for (int64_t r = r0; r < r1; r++) {
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
        float *pw = part + c * 2 * dim;
        const int64_t r1 = (c + 1) * LN_CHUNK_ROWS < rows ? (c + 1) * LN_CHUNK_ROWS : rows;
        layernorm_backward_rows(dx, pw, pw + dim, dout, x, weight, mean, rstd,
                                c * LN_CHUNK_ROWS, r1, dim);
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
