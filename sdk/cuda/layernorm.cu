/* layernorm.cu - LayerNorm over the last dim, biased variance (as PyTorch),
 * forward and backward; the CPU twin is sdk/src/cpu/layernorm.c (math) and
 * ops.c (checks).
 *
 * Row statistics and dx: one warp per row (rows loop over the grid's
 * warps), lanes striding along the row, warp shuffle trees for the sums
 * (reduce.cuh): no block barrier, eight rows in flight per block. (A block
 * per row spent more time in its two barriers per sum than in the row:
 * 110 us for ViT-B/16's 25216 x 768 rows on an H200.) The parameter
 * gradients are sums over rows, made deterministic in two passes: each chunk
 * of LN_CHUNK_ROWS rows writes its partial sums to a temporary buffer, then
 * one thread per column adds the chunks in order. */
#include "cuda_internal.h"
#include "reduce.cuh"

/* Rows per chunk of the parameter-gradient sums, and the block shape of
 * that pass: LN_TILE columns by LN_LANES lanes of rows. */
#define LN_CHUNK_ROWS 256
#define LN_TILE 32
#define LN_LANES 8
#define GRID_Y_MAX 65535

/* The rows of a warp-per-row kernel: this warp's first, and the stride. */
#define LN_WARP_ROWS(r, rows)                                                              \
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < (rows); \
         r += (int64_t)gridDim.x * (blockDim.x / 32))

/* Blocks of a warp-per-row kernel over `rows`. */
static unsigned ln_row_blocks(int64_t rows) {
    return vh_cuda_blocks(rows, VH_CUDA_THREADS / 32, VH_CUDA_MAX_BLOCKS);
}

/* Per row (one warp): mean over x - x[0] (exact for a row far from 0, as
 * the CPU), then the variance in a second pass (no cancellation), then
 * out = (x - mean) * rstd * weight + bias. */
__global__ static void layernorm_forward_kernel(void *out, float *mean, float *rstd,
                                                const void *x, const void *weight,
                                                const void *bias, int32_t dt, int32_t pdt,
                                                int64_t rows, int64_t dim, float eps) {
    const int lane = threadIdx.x % 32;
    LN_WARP_ROWS(r, rows) {
        const int64_t base = r * dim;
        const float shift = vh_cuda_load(x, dt, base);
        float sum = 0.0f;
        for (int64_t j = lane; j < dim; j += 32) sum += vh_cuda_load(x, dt, base + j) - shift;
        const float m = shift + vh_cuda_warp_sum(sum) / (float)dim;
        float var = 0.0f;
        for (int64_t j = lane; j < dim; j += 32) {
            const float d = vh_cuda_load(x, dt, base + j) - m;
            var += d * d;
        }
        const float s = 1.0f / sqrtf(vh_cuda_warp_sum(var) / (float)dim + eps);
        for (int64_t j = lane; j < dim; j += 32) {
            const float y = (vh_cuda_load(x, dt, base + j) - m) * s * vh_cuda_load(weight, pdt, j) +
                            vh_cuda_load(bias, pdt, j);
            vh_cuda_store(out, dt, base + j, y);
        }
        if (lane == 0) {
            mean[r] = m;
            rstd[r] = s;
        }
    }
}

/* dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight;
 * one warp per row. */
__global__ static void layernorm_dx_kernel(void *dx, const void *dout, const void *x,
                                           const void *weight, const float *mean,
                                           const float *rstd, int32_t dt, int32_t pdt,
                                           int64_t rows, int64_t dim) {
    const int lane = threadIdx.x % 32;
    LN_WARP_ROWS(r, rows) {
        const int64_t base = r * dim;
        const float m = mean[r], s = rstd[r];
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int64_t j = lane; j < dim; j += 32) {
            const float xhat = (vh_cuda_load(x, dt, base + j) - m) * s;
            const float g = vh_cuda_load(dout, dt, base + j) * vh_cuda_load(weight, pdt, j);
            sum_g += g;
            sum_gx += g * xhat;
        }
        const float mg = vh_cuda_warp_sum(sum_g) / (float)dim;
        const float mgx = vh_cuda_warp_sum(sum_gx) / (float)dim;
        for (int64_t j = lane; j < dim; j += 32) {
            const float xhat = (vh_cuda_load(x, dt, base + j) - m) * s;
            const float g = vh_cuda_load(dout, dt, base + j) * vh_cuda_load(weight, pdt, j);
            const float d = s * (g - mg - xhat * mgx);
            vh_cuda_store(dx, dt, base + j, vh_cuda_load(dx, dt, base + j) + d);
        }
    }
}

/* Pass 1 of dweight/dbias: block (LN_TILE, LN_LANES) takes columns
 * blockIdx.x * LN_TILE + threadIdx.x of chunk c (chunks loop over
 * gridDim.y); lane y sums rows y, y + LN_LANES, ... of the chunk in order,
 * lane 0 adds the lanes in order: part[c][j] = sum dout * xhat,
 * part[c][dim + j] = sum dout. */
__global__ static void layernorm_param_partial_kernel(float *part, const void *dout,
                                                      const void *x, const float *mean,
                                                      const float *rstd, int32_t dt,
                                                      int64_t rows, int64_t dim,
                                                      int64_t chunks) {
    __shared__ float lane_w[LN_LANES][LN_TILE + 1], lane_b[LN_LANES][LN_TILE + 1];
    const int64_t j = (int64_t)blockIdx.x * LN_TILE + threadIdx.x;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
        const int64_t r1 = (c + 1) * LN_CHUNK_ROWS < rows ? (c + 1) * LN_CHUNK_ROWS : rows;
        float sw = 0.0f, sb = 0.0f;
        if (j < dim)
            for (int64_t r = c * LN_CHUNK_ROWS + threadIdx.y; r < r1; r += LN_LANES) {
                const float g = vh_cuda_load(dout, dt, r * dim + j);
                sw += g * ((vh_cuda_load(x, dt, r * dim + j) - mean[r]) * rstd[r]);
                sb += g;
            }
        lane_w[threadIdx.y][threadIdx.x] = sw;
        lane_b[threadIdx.y][threadIdx.x] = sb;
        __syncthreads();
        if (threadIdx.y == 0 && j < dim) {
            float tw = 0.0f, tb = 0.0f;
            for (int l = 0; l < LN_LANES; l++) {
                tw += lane_w[l][threadIdx.x];
                tb += lane_b[l][threadIdx.x];
            }
            part[c * 2 * dim + j] = tw;
            part[c * 2 * dim + dim + j] = tb;
        }
        __syncthreads();
    }
}

/* Pass 2: thread j adds column j's chunks in order into dweight/dbias. */
__global__ static void layernorm_param_finish_kernel(void *dweight, void *dbias, int32_t gdt,
                                                     const float *part, int64_t dim,
                                                     int64_t chunks) {
    VH_CUDA_GRID_LOOP(j, dim) {
        float tw = 0.0f, tb = 0.0f;
        for (int64_t c = 0; c < chunks; c++) {
            tw += part[c * 2 * dim + j];
            tb += part[c * 2 * dim + dim + j];
        }
        if (dweight) vh_cuda_store(dweight, gdt, j, vh_cuda_load(dweight, gdt, j) + tw);
        if (dbias) vh_cuda_store(dbias, gdt, j, vh_cuda_load(dbias, gdt, j) + tb);
    }
}

/* ops.c's plan_layernorm: 1 to run, else return *st (OK when rows is 0). */
static int ln_plan(const vh_layernorm_args *a, vh_status *st) {
    *st = VH_STATUS_ERR_INVALID_ARG;
    if (a->rows < 0 || a->dim < 0) return 0;
    if (a->rows == 0) {
        *st = VH_STATUS_OK;
        return 0;
    }
    return a->dim > 0 && a->mean && a->rstd;
}

vh_status vh_cuda_layernorm_forward(vh_device *dev, const vh_layernorm_args *in) {
    vh_layernorm_args a;
    vh_status st;
    if (!VH_CUDA_READ_ARGS(vh_layernorm_args, in, a) || !vh_cuda_is_float(a.dtype) ||
        !vh_cuda_is_float(a.param_dtype) || !(a.eps >= 0.0f))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!ln_plan(&a, &st)) return st;
    if (!a.out || !a.x || !a.weight || !a.bias) return VH_STATUS_ERR_INVALID_ARG;
    layernorm_forward_kernel<<<ln_row_blocks(a.rows), VH_CUDA_THREADS, 0,
                               vh_cuda_stream(dev, a.stream)>>>(
        a.out, a.mean, a.rstd, a.x, a.weight, a.bias, a.dtype, a.param_dtype, a.rows, a.dim,
        a.eps);
    return vh_cuda_launched();
}

/* The two passes of dweight/dbias (at least one of them not NULL). */
static vh_status ln_param_grads(vh_device *dev, const vh_layernorm_args *a, cudaStream_t s) {
    const int64_t chunks = vh_cuda_ceil_div(a->rows, LN_CHUNK_ROWS);
    float *part = NULL;
    vh_status st = vh_cuda_alloc_temp_on(dev, s, (size_t)(chunks * 2 * a->dim) * sizeof(float),
                                         (void **)&part);
    if (st != VH_STATUS_OK) return st;
    const dim3 grid(vh_cuda_blocks(a->dim, LN_TILE, 0), vh_cuda_blocks(chunks, 1, GRID_Y_MAX));
    layernorm_param_partial_kernel<<<grid, dim3(LN_TILE, LN_LANES), 0, s>>>(
        part, a->dout, a->x, a->mean, a->rstd, a->dtype, a->rows, a->dim, chunks);
    st = vh_cuda_launched();
    if (st == VH_STATUS_OK) {
        layernorm_param_finish_kernel<<<vh_cuda_eltwise_blocks(a->dim), VH_CUDA_THREADS, 0, s>>>(
            a->dweight, a->dbias, a->grad_dtype, part, a->dim, chunks);
        st = vh_cuda_launched();
    }
    vh_cuda_free_temp(dev, part); /* stream-ordered: after the kernels above */
    return st;
}

vh_status vh_cuda_layernorm_backward(vh_device *dev, const vh_layernorm_args *in) {
    vh_layernorm_args a;
    vh_status st;
    if (!VH_CUDA_READ_ARGS(vh_layernorm_args, in, a) || !vh_cuda_is_float(a.dtype) ||
        !vh_cuda_is_float(a.param_dtype) || !vh_cuda_is_float(a.grad_dtype))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!ln_plan(&a, &st)) return st;
    if (!a.dx || !a.dout || !a.x || !a.weight) return VH_STATUS_ERR_INVALID_ARG;
    cudaStream_t s = vh_cuda_stream(dev, a.stream);
    layernorm_dx_kernel<<<ln_row_blocks(a.rows), VH_CUDA_THREADS, 0, s>>>(
        a.dx, a.dout, a.x, a.weight, a.mean, a.rstd, a.dtype, a.param_dtype, a.rows, a.dim);
    st = vh_cuda_launched();
    if (st != VH_STATUS_OK || (!a.dweight && !a.dbias)) return st;
    return ln_param_grads(dev, &a, s);
}
