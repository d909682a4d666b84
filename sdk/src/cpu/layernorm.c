/* layernorm.c - LayerNorm over the last dim, biased variance (as PyTorch).
 *
 * Rows run in parallel. In backward, the parameter gradients are sums over
 * rows: each fixed chunk of rows sums its own, and the chunks are added in
 * order, so the result does not depend on the number of threads.
 * x, out, dout and dx come as stored (vh_cpu_rows: a 16-bit block of rows is
 * widened in the thread's scratch and narrowed back while in cache; bf16
 * rows are widened in registers instead). With AVX-512, bf16 rows of a width
 * that is a multiple of 16, and f32 rows of 16-64, take layernorm_avx512.c's
 * rows, the same bits. The math and the statistics are fp32 whatever the
 * storage. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "cpu_ops.h"

/* Rows per chunk of the parameter-gradient sums. */
#define LN_CHUNK_ROWS 64

/* Rows per task of the forward pass. */
#define LN_ROW_BLOCK 16

/* The row loops read and write values as stored (vh_cpu_load_as and
 * vh_cpu_store_as, cpu_ops.h): bf16 rows are widened and rounded in
 * registers instead of in scratch copies (the constant `bf` is folded per
 * caller). Backward: 0.10 against
 * 0.16-0.21 ms per call, rows not in cache, at widths 64 and 384. Forward
 * (it reads each row three times), in the step on Zen 4, 2 threads, 3-4
 * interleaved pairs of `vithost bench --ops`: T3 AMP (width 384) 2.68-2.77
 * against 3.38-3.47 ms a step, T1 AMP (64) even; f16 keeps the copies. */
/* A row's sums in LN_LANES partial sums (element j in lane j % LN_LANES),
 * the lanes then added in a tree. Why not `omp simd reduction`: GCC folds
 * the vector of partial sums into one float in lane order, a chain of 16
 * dependent scalar adds, and a row of the forward waits on two such chains
 * (three in the backward): at width 64 (T1) that latency, not the loads,
 * set the time of a row. */
#define LN_LANES 16

__attribute__((always_inline)) static inline float ln_fold(float *acc) {
#pragma omp simd
    for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
#pragma omp simd
    for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

/* sum over j of (x[j] - c), and with `square` of (x[j] - c)^2; x as stored
 * (vh_cpu_load_as). */
__attribute__((always_inline)) static inline float ln_row_sum(const void *x, int64_t dim,
                                                              float c, int square, int bf) {
    float acc[LN_LANES] = {0};
    int64_t j = 0;
    for (; j + LN_LANES <= dim; j += LN_LANES)
#pragma omp simd
        for (int l = 0; l < LN_LANES; l++) {
            const float d = vh_cpu_load_as(x, j + l, bf) - c;
            acc[l] += square ? d * d : d;
        }
    for (int l = 0; j + l < dim; l++) {
        const float d = vh_cpu_load_as(x, j + l, bf) - c;
        acc[l] += square ? d * d : d;
    }
    return ln_fold(acc);
}

/* `rows` rows of the forward pass (the pointers at the block's first row;
 * x and out f32, or both bf16 when `bf`): the means of all its rows, then
 * their variances, then the outputs, so that each row's short chain of
 * sums overlaps the next row's instead of waiting on its own (one row at a
 * time, a T1 row of 64 waited on its fold, then its square root and
 * division, then its outputs). */
__attribute__((always_inline)) static inline void layernorm_rows(
    void *out, float *mean, float *rstd, const void *x, const float *weight, const float *bias,
    int64_t rows, int64_t dim, float eps, int bf) {
    const size_t esz = bf ? sizeof(uint16_t) : sizeof(float);
    /* Sum x - x[0]: exact for a row far from 0 (x = 1000 + small), where
     * a plain float sum would lose the small part. */
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = (const char *)x + (size_t)(r * dim) * esz;
        const float shift = vh_cpu_load_as(xr, 0, bf);
        mean[r] = shift + ln_row_sum(xr, dim, shift, 0, bf) / (float)dim;
    }
    /* two passes: no cancellation */
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = (const char *)x + (size_t)(r * dim) * esz;
        rstd[r] = 1.0f / sqrtf(ln_row_sum(xr, dim, mean[r], 1, bf) / (float)dim + eps);
    }
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = (const char *)x + (size_t)(r * dim) * esz;
        void *yr = (char *)out + (size_t)(r * dim) * esz;
        const float m = mean[r], s = rstd[r];
#pragma omp simd
        for (int64_t j = 0; j < dim; j++)
            vh_cpu_store_as(yr, j, (vh_cpu_load_as(xr, j, bf) - m) * s * weight[j] + bias[j], bf);
    }
}

VH_CPU_CLONES static void layernorm_rows_f32(float *out, float *mean, float *rstd,
                                             const float *x, const float *weight,
                                             const float *bias, int64_t rows, int64_t dim,
                                             float eps) {
    layernorm_rows(out, mean, rstd, x, weight, bias, rows, dim, eps, 0);
}

VH_CPU_CLONES static void layernorm_rows_bf16(uint16_t *out, float *mean, float *rstd,
                                              const uint16_t *x, const float *weight,
                                              const float *bias, int64_t rows, int64_t dim,
                                              float eps) {
    layernorm_rows(out, mean, rstd, x, weight, bias, rows, dim, eps, 1);
}

int vh_cpu_k_layernorm_forward(vh_cpu_rows out, float *mean, float *rstd, vh_cpu_rows x,
                               const float *weight, const float *bias, int64_t rows, int64_t dim,
                               float eps) {
    const int64_t blocks = (rows + LN_ROW_BLOCK - 1) / LN_ROW_BLOCK;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed) if (rows * dim > VH_CPU_PAR_ELEMS)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * LN_ROW_BLOCK, n = rows - r0 < LN_ROW_BLOCK ? rows - r0 : LN_ROW_BLOCK;
        if (x.dtype == VH_DTYPE_BF16 && out.dtype == VH_DTYPE_BF16 && x.p && out.p) {
            uint16_t *o = (uint16_t *)out.p + r0 * dim;
            const uint16_t *xb = (const uint16_t *)x.p + r0 * dim;
            if (!vh_cpu_k_layernorm_avx512_forward_rows(o, mean + r0, rstd + r0, xb, weight,
                                                        bias, n, dim, eps, 1))
                layernorm_rows_bf16(o, mean + r0, rstd + r0, xb, weight, bias, n, dim, eps);
            continue;
        }
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        const float *xb = vh_cpu_rows_load(x, r0, n, dim, 1);
        float *ob = vh_cpu_rows_load(out, r0, n, dim, 0);
        if (xb && ob) {
            if (!vh_cpu_k_layernorm_avx512_forward_rows(ob, mean + r0, rstd + r0, xb, weight,
                                                        bias, n, dim, eps, 0))
                layernorm_rows_f32(ob, mean + r0, rstd + r0, xb, weight, bias, n, dim, eps);
            vh_cpu_rows_store(out, r0, n, dim, ob);
        } else {
            failed = 1;
        }
        vh_cpu_scratch_end(mark);
    }
    return failed ? -1 : 0;
}

/* Element j of a backward row, into lane l of its two sums (g and g xhat,
 * g = dout weight) and into the row's dweight and dbias terms. */
__attribute__((always_inline)) static inline void ln_backward_terms(
    float *acc_g, float *acc_gx, int l, int64_t j, float *pw, float *pb, const void *xr,
    const void *gr, const float *weight, float m, float s, int bf) {
    const float xhat = (vh_cpu_load_as(xr, j, bf) - m) * s, gj = vh_cpu_load_as(gr, j, bf);
    const float g = gj * weight[j];
    acc_g[l] += g;
    acc_gx[l] += g * xhat;
    pw[j] += gj * xhat;
    pb[j] += gj;
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
        float acc_g[LN_LANES] = {0}, acc_gx[LN_LANES] = {0}; /* lanes: see ln_fold */
        int64_t j0 = 0;
        for (; j0 + LN_LANES <= dim; j0 += LN_LANES)
#pragma omp simd
            for (int l = 0; l < LN_LANES; l++)
                ln_backward_terms(acc_g, acc_gx, l, j0 + l, pw, pb, xr, gr, weight, m, s, bf);
        for (int l = 0; j0 + l < dim; l++)
            ln_backward_terms(acc_g, acc_gx, l, j0 + l, pw, pb, xr, gr, weight, m, s, bf);
        const float mg = ln_fold(acc_g) / (float)dim, mgx = ln_fold(acc_gx) / (float)dim;
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) {
            const float xhat = (vh_cpu_load_as(xr, j, bf) - m) * s;
            vh_cpu_store_as(dr, j,
                     vh_cpu_load_as(dr, j, bf) + s * (vh_cpu_load_as(gr, j, bf) * weight[j] - mg - xhat * mgx),
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
        uint16_t *d = (uint16_t *)dx.p + o;
        const uint16_t *g = (const uint16_t *)dout.p + o, *xr = (const uint16_t *)x.p + o;
        if (!vh_cpu_k_layernorm_avx512_backward_rows(d, pw, pw + dim, g, xr, weight, mean + r0,
                                                     rstd + r0, n, dim, 1))
            layernorm_backward_rows_bf16(d, pw, pw + dim, g, xr, weight, mean + r0, rstd + r0,
                                         n, dim);
        return 0;
    }
    for (int64_t s = r0; s < r0 + n; s += step) {
        const int64_t m = r0 + n - s < step ? r0 + n - s : step;
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        float *db = vh_cpu_rows_load(dx, s, m, dim, 1);
        const float *gb = vh_cpu_rows_load(dout, s, m, dim, 1);
        const float *xb = vh_cpu_rows_load(x, s, m, dim, 1);
        const int ok = db && gb && xb;
        if (ok && !vh_cpu_k_layernorm_avx512_backward_rows(db, pw, pw + dim, gb, xb, weight,
                                                           mean + s, rstd + s, m, dim, 0))
            layernorm_backward_rows_f32(db, pw, pw + dim, gb, xb, weight, mean + s, rstd + s, m,
                                        dim);
        if (ok) vh_cpu_rows_store(dx, s, m, dim, db);
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
