/* eltwise.cu - element-wise and row-wise ops: GELU, add, mul, dropout,
 * scale_rows, drop_path_scale, the bias gradient and softmax.
 *
 * Semantics, checks and numbers are the CPU twin's (sdk/src/cpu/ops.c for
 * the checks, activations.c for the math): loads widen to fp32, the math is
 * fp32, a result is rounded once when stored; gradients accumulate (+=).
 * Element-wise kernels are grid-stride loops, one element per thread per
 * step (VH_CUDA_GRID_LOOP, grids from launch.h). */
#include "cuda_internal.h"
extern "C" {
#include "vithost/vh_random.h"
}
#include "gelu.cuh"
#include "reduce.cuh"

/* Rows per chunk of the bias gradient's first pass, and the block shape of
 * that pass: BIAS_TILE columns by BIAS_LANES lanes of rows. */
#define BIAS_CHUNK_ROWS 256
#define BIAS_TILE 32
#define BIAS_LANES 8
/* The most chunks one grid row (gridDim.y) holds; more loop in the kernel. */
#define GRID_Y_MAX 65535

/* ---- arguments ------------------------------------------------------------------ */

/* Reads and checks what every element-wise op shares (ops.c: read_args, the
 * dtype, plan_eltwise). 1: run the op; 0: return *st (OK when n is 0). */
static int ew_begin(const vh_eltwise_args *in, vh_eltwise_args *a, vh_status *st) {
    *st = VH_STATUS_ERR_INVALID_ARG;
    if (!VH_CUDA_READ_ARGS(vh_eltwise_args, in, *a) || !vh_cuda_is_float(a->dtype)) return 0;
    if (a->n < 0) return 0;
    *st = VH_STATUS_OK;
    return a->n > 0;
}

/* The same for the row ops (ops.c's plan_rows): 1 to run; 0 returns *st
 * (OK when rows or cols is 0). */
static int rows_begin(const vh_rows_args *in, vh_rows_args *a, vh_status *st) {
    *st = VH_STATUS_ERR_INVALID_ARG;
    if (!VH_CUDA_READ_ARGS(vh_rows_args, in, *a) || !vh_cuda_is_float(a->dtype) ||
        !vh_cuda_is_float(a->out_dtype))
        return 0;
    if (a->rows < 0 || a->cols < 0) return 0;
    *st = VH_STATUS_OK;
    return a->rows > 0 && a->cols > 0;
}

/* ---- element-wise kernels: grid-stride, thread i handles element i ------------- */

__global__ static void gelu_forward_kernel(void *out, const void *x, int32_t dt, int64_t n) {
    VH_CUDA_GRID_LOOP(i, n) vh_cuda_store(out, dt, i, vh_cuda_gelu(vh_cuda_load(x, dt, i)));
}

/* overwrite (ABI 2.4): dx is written as 0 + g (the bits of adding to zeros,
 * +0 for a -0 product) and never read. */
__global__ static void gelu_backward_kernel(void *dx, const void *x, const void *dout,
                                            int32_t dt, int64_t n, int32_t overwrite) {
    VH_CUDA_GRID_LOOP(i, n) {
        const float g = vh_cuda_load(dout, dt, i) * vh_cuda_gelu_grad(vh_cuda_load(x, dt, i));
        vh_cuda_store(dx, dt, i, (overwrite ? 0.0f : vh_cuda_load(dx, dt, i)) + g);
    }
}

__global__ static void add_kernel(void *out, const void *a, const void *b, int32_t dt,
                                  int64_t n) {
    VH_CUDA_GRID_LOOP(i, n) {
        vh_cuda_store(out, dt, i, vh_cuda_load(a, dt, i) + vh_cuda_load(b, dt, i));
    }
}

__global__ static void mul_kernel(void *out, const void *a, const void *b, int32_t dt,
                                  int64_t n, int32_t accumulate) {
    VH_CUDA_GRID_LOOP(i, n) {
        const float p = vh_cuda_load(a, dt, i) * vh_cuda_load(b, dt, i);
        vh_cuda_store(out, dt, i, accumulate ? vh_cuda_load(out, dt, i) + p : p);
    }
}

/* splitmix64's finaliser (vh_random.h), on the device. */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* mask[i] = u_i >= p ? 1/(1-p) : 0 with u_i the 24-bit uniform of (key, i)
 * (vh_device.h; key = mix64(seed), made on the host). */
__global__ static void dropout_kernel(void *out, void *mask, const void *x, int32_t dt,
                                      int64_t n, float p, float keep_scale, uint64_t key) {
    VH_CUDA_GRID_LOOP(i, n) {
        const uint64_t bits = mix64(key + ((uint64_t)i + 1) * VH_SPLITMIX64_GAMMA);
        const float u = (float)(bits >> 40) * (1.0f / 16777216.0f);
        const float m = u >= p ? keep_scale : 0.0f;
        vh_cuda_store(mask, dt, i, m);
        vh_cuda_store(out, dt, i, vh_cuda_load(x, dt, i) * m);
    }
}

/* Element i is in row i / dim, whose sample's factor is scale[(row / div) % mod]. */
__global__ static void scale_rows_kernel(void *out, const void *in, const float *scale,
                                         int32_t dt, int64_t n, int64_t dim, int64_t div,
                                         int64_t mod, int32_t accumulate) {
    VH_CUDA_GRID_LOOP(i, n) {
        const float s = scale[(i / dim / div) % mod];
        const float v = vh_cuda_load(in, dt, i) * s;
        vh_cuda_store(out, dt, i, accumulate ? vh_cuda_load(out, dt, i) + v : v);
    }
}

/* Thread b draws sample b's factor: u_b = (splitmix64(seed + b) >> 11) 2^-53. */
__global__ static void drop_path_scale_kernel(float *out, int64_t n, float p, float keep_scale,
                                              uint64_t seed) {
    VH_CUDA_GRID_LOOP(b, n) {
        const uint64_t bits = mix64(seed + (uint64_t)b + VH_SPLITMIX64_GAMMA);
        const double u = (double)(bits >> 11) * (1.0 / 9007199254740992.0);
        out[b] = u < (double)p ? 0.0f : keep_scale;
    }
}

/* ---- element-wise ops ---------------------------------------------------------- */

vh_status vh_cuda_gelu_forward(vh_device *dev, const vh_eltwise_args *in) {
    vh_eltwise_args a;
    vh_status st;
    if (!ew_begin(in, &a, &st)) return st;
    if (!a.out || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    gelu_forward_kernel<<<vh_cuda_eltwise_blocks(a.n), VH_CUDA_THREADS, 0,
                          vh_cuda_stream(dev, a.stream)>>>(a.out, a.x, a.dtype, a.n);
    return vh_cuda_launched();
}

vh_status vh_cuda_gelu_backward(vh_device *dev, const vh_eltwise_args *in) {
    vh_eltwise_args a;
    vh_status st;
    if (!ew_begin(in, &a, &st)) return st;
    if (!a.dx || !a.x || !a.dout) return VH_STATUS_ERR_INVALID_ARG;
    gelu_backward_kernel<<<vh_cuda_eltwise_blocks(a.n), VH_CUDA_THREADS, 0,
                           vh_cuda_stream(dev, a.stream)>>>(a.dx, a.x, a.dout, a.dtype, a.n,
                                                            a.overwrite != 0);
    return vh_cuda_launched();
}

vh_status vh_cuda_add(vh_device *dev, const vh_eltwise_args *in) {
    vh_eltwise_args a;
    vh_status st;
    if (!ew_begin(in, &a, &st)) return st;
    if (!a.out || !a.a || !a.b) return VH_STATUS_ERR_INVALID_ARG;
    add_kernel<<<vh_cuda_eltwise_blocks(a.n), VH_CUDA_THREADS, 0,
                 vh_cuda_stream(dev, a.stream)>>>(a.out, a.a, a.b, a.dtype, a.n);
    return vh_cuda_launched();
}

vh_status vh_cuda_mul(vh_device *dev, const vh_eltwise_args *in) {
    vh_eltwise_args a;
    vh_status st;
    if (!ew_begin(in, &a, &st)) return st;
    if (!a.out || !a.a || !a.b) return VH_STATUS_ERR_INVALID_ARG;
    mul_kernel<<<vh_cuda_eltwise_blocks(a.n), VH_CUDA_THREADS, 0, vh_cuda_stream(dev, a.stream)>>>(
        a.out, a.a, a.b, a.dtype, a.n, a.accumulate != 0);
    return vh_cuda_launched();
}

vh_status vh_cuda_dropout_forward(vh_device *dev, const vh_eltwise_args *in) {
    vh_eltwise_args a;
    vh_status st;
    /* p is checked before n, as the CPU's plan_dropout does. */
    if (!VH_CUDA_READ_ARGS(vh_eltwise_args, in, a) || !vh_cuda_is_float(a.dtype) ||
        !(a.p >= 0.0f && a.p <= 1.0f))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!ew_begin(in, &a, &st)) return st;
    if (!a.out || !a.mask || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    const float keep_scale = a.p < 1.0f ? 1.0f / (1.0f - a.p) : 0.0f;
    dropout_kernel<<<vh_cuda_eltwise_blocks(a.n), VH_CUDA_THREADS, 0,
                     vh_cuda_stream(dev, a.stream)>>>(a.out, a.mask, a.x, a.dtype, a.n, a.p,
                                                      keep_scale, vh_splitmix64_mix(a.seed));
    return vh_cuda_launched();
}

/* Reads x into out; a backward caller may name them dout and dx (ops.c's
 * plan_scale_rows). */
vh_status vh_cuda_scale_rows(vh_device *dev, const vh_eltwise_args *in) {
    vh_eltwise_args a;
    if (!VH_CUDA_READ_ARGS(vh_eltwise_args, in, a) || !vh_cuda_is_float(a.dtype))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a.n < 0 || a.dim < 0 || a.div <= 0 || a.mod <= 0) return VH_STATUS_ERR_INVALID_ARG;
    if (a.n == 0 || a.dim == 0) return VH_STATUS_OK;
    if (a.n % a.dim || !a.scale) return VH_STATUS_ERR_INVALID_ARG;
    void *out = a.out ? a.out : a.dx;
    const void *x = a.x ? a.x : a.dout;
    if (!out || !x) return VH_STATUS_ERR_INVALID_ARG;
    scale_rows_kernel<<<vh_cuda_eltwise_blocks(a.n), VH_CUDA_THREADS, 0,
                        vh_cuda_stream(dev, a.stream)>>>(out, x, a.scale, a.dtype, a.n, a.dim,
                                                         a.div, a.mod, a.accumulate != 0);
    return vh_cuda_launched();
}

/* Its checks are the CPU's vh_cpu_drop_path_scale (activations.c). */
vh_status vh_cuda_drop_path_scale(vh_device *dev, const vh_eltwise_args *in) {
    vh_eltwise_args a;
    if (!VH_CUDA_READ_ARGS(vh_eltwise_args, in, a)) return VH_STATUS_ERR_INVALID_ARG;
    if (a.dtype != VH_DTYPE_F32 || a.n < 0 || !(a.p >= 0.0f && a.p <= 1.0f))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a.n == 0) return VH_STATUS_OK;
    if (!a.out) return VH_STATUS_ERR_INVALID_ARG;
    const float keep_scale = a.p < 1.0f ? 1.0f / (1.0f - a.p) : 0.0f;
    drop_path_scale_kernel<<<vh_cuda_eltwise_blocks(a.n), VH_CUDA_THREADS, 0,
                             vh_cuda_stream(dev, a.stream)>>>((float *)a.out, a.n, a.p,
                                                              keep_scale, a.seed);
    return vh_cuda_launched();
}

/* ---- bias gradient: out[j] += sum over rows of dout[r][j] ---------------------
 * Deterministic in two passes. Pass 1: block (BIAS_TILE, BIAS_LANES) takes
 * columns blockIdx.x * BIAS_TILE + threadIdx.x of chunk c (BIAS_CHUNK_ROWS
 * rows; chunks loop over gridDim.y); lane y sums rows y, y + LANES, ... in
 * order, then lane 0 adds the lanes in order into part[c][j]. Pass 2: thread
 * j adds the chunks of column j in order and adds the total to out[j]. */
__global__ static void bias_partial_kernel(float *part, const void *dout, int32_t dt,
                                           int64_t rows, int64_t cols, int64_t chunks) {
    __shared__ float lane_sum[BIAS_LANES][BIAS_TILE + 1];
    const int64_t j = (int64_t)blockIdx.x * BIAS_TILE + threadIdx.x;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
        const int64_t r1 = (c + 1) * BIAS_CHUNK_ROWS < rows ? (c + 1) * BIAS_CHUNK_ROWS : rows;
        float s = 0.0f;
        if (j < cols)
            for (int64_t r = c * BIAS_CHUNK_ROWS + threadIdx.y; r < r1; r += BIAS_LANES)
                s += vh_cuda_load(dout, dt, r * cols + j);
        lane_sum[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && j < cols) {
            float t = 0.0f;
            for (int l = 0; l < BIAS_LANES; l++) t += lane_sum[l][threadIdx.x];
            part[c * cols + j] = t;
        }
        __syncthreads();
    }
}

__global__ static void bias_finish_kernel(void *out, int32_t out_dt, const float *part,
                                          int64_t cols, int64_t chunks) {
    VH_CUDA_GRID_LOOP(j, cols) {
        float t = 0.0f;
        for (int64_t c = 0; c < chunks; c++) t += part[c * cols + j];
        vh_cuda_store(out, out_dt, j, vh_cuda_load(out, out_dt, j) + t);
    }
}

vh_status vh_cuda_bias_backward(vh_device *dev, const vh_rows_args *in) {
    vh_rows_args a;
    vh_status st;
    if (!rows_begin(in, &a, &st)) return st;
    if (!a.out || !a.dout) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t chunks = vh_cuda_ceil_div(a.rows, BIAS_CHUNK_ROWS);
    cudaStream_t s = vh_cuda_stream(dev, a.stream);
    float *part = NULL;
    st = vh_cuda_alloc_temp_on(dev, s, (size_t)(chunks * a.cols) * sizeof(float), (void **)&part);
    if (st != VH_STATUS_OK) return st;
    const dim3 grid(vh_cuda_blocks(a.cols, BIAS_TILE, 0), vh_cuda_blocks(chunks, 1, GRID_Y_MAX));
    bias_partial_kernel<<<grid, dim3(BIAS_TILE, BIAS_LANES), 0, s>>>(part, a.dout, a.dtype,
                                                                     a.rows, a.cols, chunks);
    st = vh_cuda_launched();
    if (st == VH_STATUS_OK) {
        bias_finish_kernel<<<vh_cuda_eltwise_blocks(a.cols), VH_CUDA_THREADS, 0, s>>>(
            a.out, a.out_dtype, part, a.cols, chunks);
        st = vh_cuda_launched();
    }
    vh_cuda_free_temp(dev, part); /* stream-ordered: after the kernels above */
    return st;
}

/* ---- softmax: one block per row (rows loop over the grid) ---------------------
 * Three passes over the row: its max, the sum of e^(x - max), then
 * out = e^(x - max) * (1 / sum) as the CPU's vh_softmax_row. Every read of a
 * row precedes the block's first write to it (the reductions end in a
 * barrier), so out may alias x (same dtype). */
__global__ static void softmax_kernel(void *out, int32_t out_dt, const void *x, int32_t dt,
                                      int64_t rows, int64_t cols) {
    __shared__ float shm[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t base = r * cols;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
            mx = fmaxf(mx, vh_cuda_load(x, dt, base + j));
        mx = vh_cuda_block_max(mx, shm);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
            sum += expf(vh_cuda_load(x, dt, base + j) - mx);
        const float inv = 1.0f / vh_cuda_block_sum(sum, shm);
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
            vh_cuda_store(out, out_dt, base + j, expf(vh_cuda_load(x, dt, base + j) - mx) * inv);
    }
}

vh_status vh_cuda_softmax(vh_device *dev, const vh_rows_args *in) {
    vh_rows_args a;
    vh_status st;
    if (!rows_begin(in, &a, &st)) return st;
    if (!a.out || !a.x) return VH_STATUS_ERR_INVALID_ARG;
    softmax_kernel<<<vh_cuda_blocks(a.rows, 1, VH_CUDA_MAX_BLOCKS), VH_CUDA_THREADS, 0,
                     vh_cuda_stream(dev, a.stream)>>>(a.out, a.out_dtype, a.x, a.dtype, a.rows,
                                                      a.cols);
    return vh_cuda_launched();
}
