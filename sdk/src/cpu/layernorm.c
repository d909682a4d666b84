/* layernorm.c - LayerNorm over the last dim, biased variance (as PyTorch).
 *
 * Rows run in parallel. In backward, the parameter gradients are sums over
 * rows: each fixed chunk of rows sums its own, and the chunks are added in
 * order, so the result does not depend on the number of threads.
 * x, out, dout and dx come as stored (vh_cpu_rows: a 16-bit block of rows is
 * widened in the thread's scratch and narrowed back while in cache; bf16
 * rows of the backward pass are widened in registers instead); the math and
 * the statistics are fp32 whatever the storage. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "cpu_ops.h"

/* Rows per chunk of the parameter-gradient sums. */
#define LN_CHUNK_ROWS 64

/* Rows per task of the forward pass. */
#define LN_ROW_BLOCK 16

/* A value of a row as stored (bf16 when `bf`, else f32), and back: the
 * backward pass widens and rounds bf16 rows in registers instead of in
 * scratch copies (measured: 0.10 against 0.16-0.21 ms per call, rows not in
 * cache, at widths 64 and 384; the constant `bf` is folded per caller). The
 * forward pass keeps the scratch copies: it reads each row three times, and
 * widening in each of those loops was slower at width 64. */
__attribute__((always_inline)) static inline float ln_load(const void *p, int64_t i, int bf) {
    return bf ? vh_cpu_bf16_widen(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

__attribute__((always_inline)) static inline void ln_store(void *p, int64_t i, float v, int bf) {
    if (bf)
        ((uint16_t *)p)[i] = vh_cpu_bf16_round(v);
    else
        ((float *)p)[i] = v;
}

/* `rows` rows of the forward pass (the pointers at the block's first row). */
VH_CPU_CLONES static void layernorm_rows(float *out, float *mean, float *rstd, const float *x,
                                         const float *weight, const float *bias, int64_t rows,
                                         int64_t dim, float eps) {
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

int vh_cpu_k_layernorm_forward(vh_cpu_rows out, float *mean, float *rstd, vh_cpu_rows x,
                               const float *weight, const float *bias, int64_t rows, int64_t dim,
                               float eps) {
    const int64_t blocks = (rows + LN_ROW_BLOCK - 1) / LN_ROW_BLOCK;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed) if (rows * dim > VH_CPU_PAR_ELEMS)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * LN_ROW_BLOCK, n = rows - r0 < LN_ROW_BLOCK ? rows - r0 : LN_ROW_BLOCK;
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        const float *xb = vh_cpu_rows_load(x, r0, n, dim, 1);
        float *ob = vh_cpu_rows_load(out, r0, n, dim, 0);
        if (xb && ob) {
            layernorm_rows(ob, mean + r0, rstd + r0, xb, weight, bias, n, dim, eps);
            vh_cpu_rows_store(out, r0, n, dim, ob);
        } else {
            failed = 1;
        }
        vh_cpu_scratch_end(mark);
    }
    return failed ? -1 : 0;
}

/* `rows` rows of the backward pass (the pointers at the first; dx, dout and
 * x f32, or all bf16 when `bf`): dx of its rows, and their dweight and dbias
 * terms added to pw and pb, row by row. */
__attribute__((always_inline)) static inline void layernorm_backward_rows(
    void *dx, float *pw, float *pb, const void *dout, const void *x, const float *weight,
    const float *mean, const float *rstd, int64_t rows, int64_t dim, int bf) {
    const size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    for (int64_t r = 0; r < rows; r++) {
        const size_t off = (size_t)(r * dim) * esz;
        const void *xr = (const char *)x + off, *gr = (const char *)dout + off;
        void *dr = (char *)dx + off;
        const float m = mean[r], s = rstd[r];
        float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t j = 0; j < dim; j++) {
            const float xhat = (ln_load(xr, j, bf) - m) * s, gj = ln_load(gr, j, bf);
            const float g = gj * weight[j];
            sum_g += g;
            sum_gx += g * xhat;
            pw[j] += gj * xhat;
            pb[j] += gj;
        }
        const float mg = sum_g / (float)dim, mgx = sum_gx / (float)dim;
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) {
            const float xhat = (ln_load(xr, j, bf) - m) * s;
            ln_store(dr, j,
                     ln_load(dr, j, bf) + s * (ln_load(gr, j, bf) * weight[j] - mg - xhat * mgx),
                     bf);
        }
    }
}

VH_CPU_CLONES static void layernorm_backward_rows_f32(float *dx, float *pw, float *pb,
                                                      const float *dout, const float *x,
                                                      const float *weight, const float *mean,
                                                      const float *rstd, int64_t rows,
                                                      int64_t dim) {
    layernorm_backward_rows(dx, pw, pb, dout, x, weight, mean, rstd, rows, dim, 0);
}

VH_CPU_CLONES static void layernorm_backward_rows_bf16(uint16_t *dx, float *pw, float *pb,
                                                       const uint16_t *dout, const uint16_t *x,
                                                       const float *weight, const float *mean,
                                                       const float *rstd, int64_t rows,
                                                       int64_t dim) {
    layernorm_backward_rows(dx, pw, pb, dout, x, weight, mean, rstd, rows, dim, 1);
}

/* Chunk c of the backward pass (its partial dweight and dbias into pw,
 * overwritten): bf16 rows in place, f16 ones widened in scratch a few at a
 * time; the rows are summed in order, so the partials are the same either
 * way. */
static int layernorm_backward_chunk(vh_cpu_rows dx, float *pw, vh_cpu_rows dout, vh_cpu_rows x,
                                    const float *weight, const float *mean, const float *rstd,
                                    int64_t c, int64_t rows, int64_t dim) {
    const int64_t r0 = c * LN_CHUNK_ROWS, n = rows - r0 < LN_CHUNK_ROWS ? rows - r0 : LN_CHUNK_ROWS;
    const int all_f32 = dx.dtype == VH_DTYPE_F32 && dout.dtype == VH_DTYPE_F32 &&
                        x.dtype == VH_DTYPE_F32;
    const int64_t step = vh_cpu_rows_block(all_f32, n, dim, 3);
    memset(pw, 0, (size_t)(2 * dim) * sizeof(float));
    if (dx.p && dx.dtype == VH_DTYPE_BF16 && dout.dtype == VH_DTYPE_BF16 &&
        x.dtype == VH_DTYPE_BF16) {
        const int64_t o = r0 * dim;
        layernorm_backward_rows_bf16((uint16_t *)dx.p + o, pw, pw + dim,
                                     (const uint16_t *)dout.p + o, (const uint16_t *)x.p + o,
                                     weight, mean + r0, rstd + r0, n, dim);
        return 0;
    }
    for (int64_t s = r0; s < r0 + n; s += step) {
        const int64_t m = r0 + n - s < step ? r0 + n - s : step;
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        float *db = vh_cpu_rows_load(dx, s, m, dim, 1);
        const float *gb = vh_cpu_rows_load(dout, s, m, dim, 1);
        const float *xb = vh_cpu_rows_load(x, s, m, dim, 1);
        const int ok = db && gb && xb;
        if (ok) {
            layernorm_backward_rows_f32(db, pw, pw + dim, gb, xb, weight, mean + s, rstd + s, m,
                                        dim);
            vh_cpu_rows_store(dx, s, m, dim, db);
        }
        vh_cpu_scratch_end(mark);
        if (!ok) return -1;
    }
    return 0;
}

int vh_cpu_k_layernorm_backward(vh_cpu_rows dx, float *dweight, float *dbias, vh_cpu_rows dout,
                                vh_cpu_rows x, const float *weight, const float *mean,
                                const float *rstd, int64_t rows, int64_t dim) {
    if (rows == 0 || dim == 0) return 0;
    const int64_t chunks = (rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    /* Per chunk of rows: partial dweight (dim values) then partial dbias. */
    float *part = vh_cpu_scratch_alloc((size_t)chunks * 2 * (size_t)dim * sizeof(float));
    if (!part) return -1;
    int failed = 0;

    /* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight. */
#pragma omp parallel for schedule(static) reduction(| : failed) if (rows * dim > VH_CPU_PAR_ELEMS)
    for (int64_t c = 0; c < chunks; c++)
        failed |= layernorm_backward_chunk(dx, part + c * 2 * dim, dout, x, weight, mean, rstd, c,
                                           rows, dim) != 0;
    if (failed) return -1;
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
    return 0;
}
