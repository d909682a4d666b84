/* gemm.c - (batched) GEMM through OpenBLAS, row-major, with a bias epilogue.
 *
 * One big GEMM: a single cblas_sgemm that uses the whole OpenMP pool.
 * Many small ones (batch > 1, each under VH_GEMM_SMALL multiply-adds): an
 * OpenMP loop over the batch, each cblas_sgemm then single-threaded. */
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include <cblas.h>

#include "cpu_ops.h"

/* Below this many multiply-adds per GEMM, spread the batch over threads. */
#define VH_GEMM_SMALL ((int64_t)96 * 96 * 96)

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

/* One C[i] = alpha op(A) op(B) + beta C (+ bias). */
static void gemm_one(const vh_gemm_args *g, const float *a, const float *b, float *c) {
    const int m = (int)g->m, n = (int)g->n, k = (int)g->k;
    const int64_t ldc = g->ldc;
    float beta = g->beta;
    int bias_done = 0;
    if (g->bias && beta == 0.0f) {
        /* Preload C with the bias and accumulate into it: no second pass. */
        for (int i = 0; i < m; i++) memcpy(c + i * ldc, g->bias, (size_t)n * sizeof(float));
        beta = 1.0f;
        bias_done = 1;
    }
    if (k == 0 || g->alpha == 0.0f) {
        /* C = beta C: BLAS semantics, beta == 0 never reads C. */
        if (beta != 1.0f) {
            for (int i = 0; i < m; i++) {
                float *row = c + i * ldc;
                if (beta == 0.0f)
                    memset(row, 0, (size_t)n * sizeof(float));
                else
                    for (int j = 0; j < n; j++) row[j] *= beta;
            }
        }
    } else {
        cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                    g->trans_b ? CblasTrans : CblasNoTrans, m, n, k, g->alpha, a,
                    (int)g->lda, b, (int)g->ldb, beta, c, (int)ldc);
    }
    if (g->bias && !bias_done) {
        for (int i = 0; i < m; i++) {
            float *row = c + i * ldc;
            for (int j = 0; j < n; j++) row[j] += g->bias[j];
        }
    }
}

vh_status vh_cpu_gemm(vh_device *dev, const vh_gemm_args *g) {
    (void)dev;
    if (!g || g->struct_size < sizeof(vh_gemm_args)) return VH_STATUS_ERR_INVALID_ARG;
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0) return VH_STATUS_ERR_INVALID_ARG;
    if (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    const int64_t batch = g->batch > 1 ? g->batch : 1;
    if (g->m == 0 || g->n == 0) return VH_STATUS_OK;
    /* Row-major leading dimensions: op(A) is m x k, stored k x m when transposed. */
    const int64_t a_cols = g->trans_a ? g->m : g->k;
    const int64_t b_cols = g->trans_b ? g->k : g->n;
    if (g->lda < max1(a_cols) || g->ldb < max1(b_cols) || g->ldc < max1(g->n))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!g->c || (g->k > 0 && (!g->a || !g->b))) return VH_STATUS_ERR_INVALID_ARG;
    if (batch > 1 && g->stride_c == 0) return VH_STATUS_ERR_INVALID_ARG; /* C[i] would alias */
    if (!fits_int(g->m) || !fits_int(g->n) || !fits_int(g->k) || !fits_int(g->lda) ||
        !fits_int(g->ldb) || !fits_int(g->ldc))
        return VH_STATUS_ERR_UNSUPPORTED; /* 32-bit BLAS integers */

    if (batch == 1) {
        gemm_one(g, g->a, g->b, g->c);
        return VH_STATUS_OK;
    }
    const int small = (double)g->m * (double)g->n * (double)g->k <= (double)VH_GEMM_SMALL;
    /* Each cblas call inside the parallel region runs on its own thread. */
#pragma omp parallel for schedule(static) if (small)
    for (int64_t i = 0; i < batch; i++) {
        gemm_one(g, g->a ? g->a + i * g->stride_a : NULL, g->b ? g->b + i * g->stride_b : NULL,
                 g->c + i * g->stride_c);
    }
    return VH_STATUS_OK;
}
