/* multi_tensor.cu - one pass over a list of tensors: scale in place (when
 * scale != 1), the sum of squares of the stored values, and the Inf/NaN
 * check (a precision policy's overflow check and the gradient norm). The
 * CPU twin is vh_cpu_multi_tensor_scale_check (sdk/src/cpu/ops.c).
 *
 * The lists (host memory) travel by value as kernel parameters, MT_LIST
 * tensors per launch: the launch copies them, so the caller may reuse its
 * arrays as soon as the op returns, and no staging buffer is needed.
 * Deterministic in two kernels: block (x, k) sums its grid-stride share of
 * tensor k into part[k][x] (a block tree), then one block adds each
 * tensor's parts in order (one thread per tensor) and thread 0 adds the
 * tensors in list order. */
#include "cuda_internal.h"
#include "reduce.cuh"

/* Tensors per launch: 128 x (8 + 8 + 4) bytes + 4 is 2.5 KiB, inside the
 * 4 KiB of kernel parameters every CUDA version allows. */
#define MT_LIST 128
/* Most blocks per tensor, and the fewest elements per thread before a
 * tensor gets another block. */
#define MT_BLOCKS_MAX 64
#define MT_PER_THREAD 16
/* Threads of the final sum (one block). */
#define MT_SUM_THREADS 256

typedef struct mt_list {
    void *ptr[MT_LIST];
    int64_t numel[MT_LIST];
    int32_t dtype[MT_LIST];
    int32_t first; /* list index of ptr[0] */
} mt_list;

/* Block (x, k): elements x * blockDim + tid, + gridDim.x * blockDim, ... of
 * tensor k of the launch; the value summed is the one stored (scaled and
 * rounded to the dtype). */
__global__ static void mt_partial_kernel(mt_list l, float scale, int32_t scaled, float *part,
                                         int32_t *bad_part) {
    __shared__ float shm[32];
    const int32_t k = (int32_t)blockIdx.y;
    void *t = l.ptr[k];
    const int32_t dt = l.dtype[k];
    const int64_t n = l.numel[k];
    float s = 0.0f;
    int bad = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = vh_cuda_load(t, dt, i);
        if (scaled) {
            v *= scale;
            vh_cuda_store(t, dt, i, v);
            v = vh_cuda_round(dt, v);
        }
        s += v * v;
        bad |= !(v - v == 0.0f); /* Inf - Inf and NaN are NaN */
    }
    s = vh_cuda_block_sum(s, shm);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        const int64_t at = (int64_t)(l.first + k) * gridDim.x + blockIdx.x;
        part[at] = s;
        bad_part[at] = bad;
    }
}

/* One block: thread t adds tensor t's `parts` partial sums in order into
 * tsum[t]; thread 0 then adds the tensors in list order. */
__global__ static void mt_finish_kernel(float *sum_sq, float *found_inf, const float *part,
                                        const int32_t *bad_part, float *tsum, int32_t count,
                                        int64_t parts) {
    int bad = 0;
    for (int32_t t = threadIdx.x; t < count; t += blockDim.x) {
        float s = 0.0f;
        for (int64_t x = 0; x < parts; x++) {
            s += part[t * parts + x];
            bad |= bad_part[t * parts + x];
        }
        tsum[t] = s;
    }
    bad = __syncthreads_or(bad); /* also makes tsum visible to thread 0 */
    if (threadIdx.x != 0) return;
    float total = 0.0f;
    for (int32_t t = 0; t < count; t++) total += tsum[t];
    if (sum_sq) *sum_sq = total;
    if (found_inf && bad) *found_inf = 1.0f;
}

/* ops.c's checks; *max_numel receives the largest tensor. */
static int mt_check(const vh_multi_tensor_args *a, int64_t *max_numel) {
    if (a->count < 0 || (a->count > 0 && (!a->tensors || !a->numels))) return 0;
    *max_numel = 0;
    for (int32_t t = 0; t < a->count; t++) {
        const int32_t dt = a->dtypes ? a->dtypes[t] : VH_DTYPE_F32;
        if (!vh_cuda_is_float(dt) || a->numels[t] < 0 || (a->numels[t] > 0 && !a->tensors[t]))
            return 0;
        if (a->numels[t] > *max_numel) *max_numel = a->numels[t];
    }
    return 1;
}

/* The partial sums of every tensor, MT_LIST tensors per launch. */
static vh_status mt_launch_partials(const vh_multi_tensor_args *a, unsigned parts, float *part,
                                    int32_t *bad_part, cudaStream_t s) {
    for (int32_t first = 0; first < a->count; first += MT_LIST) {
        mt_list l;
        memset(&l, 0, sizeof l);
        const int32_t m = a->count - first < MT_LIST ? a->count - first : MT_LIST;
        for (int32_t k = 0; k < m; k++) {
            l.ptr[k] = a->tensors[first + k];
            l.numel[k] = a->numels[first + k];
            l.dtype[k] = a->dtypes ? a->dtypes[first + k] : VH_DTYPE_F32;
        }
        l.first = first;
        mt_partial_kernel<<<dim3(parts, (unsigned)m), VH_CUDA_THREADS, 0, s>>>(
            l, a->scale, a->scale != 1.0f, part, bad_part);
        const vh_status st = vh_cuda_launched();
        if (st != VH_STATUS_OK) return st;
    }
    return VH_STATUS_OK;
}

vh_status vh_cuda_multi_tensor_scale_check(vh_device *dev, const vh_multi_tensor_args *in) {
    vh_multi_tensor_args a;
    int64_t max_numel = 0;
    if (!VH_CUDA_READ_ARGS(vh_multi_tensor_args, in, a) || !mt_check(&a, &max_numel))
        return VH_STATUS_ERR_INVALID_ARG;
    cudaStream_t s = vh_cuda_stream(dev, a.stream);
    if (a.count == 0) /* nothing to scale: the sum is 0, found_inf stays */
        return a.sum_sq ? vh_cuda_status(cudaMemsetAsync(a.sum_sq, 0, sizeof(float), s))
                        : VH_STATUS_OK;
    const unsigned parts =
        vh_cuda_blocks(max_numel, (int64_t)VH_CUDA_THREADS * MT_PER_THREAD, MT_BLOCKS_MAX);
    const size_t n_part = (size_t)a.count * parts;
    /* One buffer: part (floats), bad_part (int32), tsum (count floats). */
    void *buf = NULL;
    vh_status st = vh_cuda_alloc_temp_on(dev, s, n_part * 8 + (size_t)a.count * 4, &buf);
    if (st != VH_STATUS_OK) return st;
    float *part = (float *)buf;
    int32_t *bad_part = (int32_t *)(part + n_part);
    float *tsum = (float *)(bad_part + n_part);
    st = mt_launch_partials(&a, parts, part, bad_part, s);
    if (st == VH_STATUS_OK) {
        mt_finish_kernel<<<1, MT_SUM_THREADS, 0, s>>>(a.sum_sq, a.found_inf, part, bad_part, tsum,
                                                      a.count, parts);
        st = vh_cuda_launched();
    }
    vh_cuda_free_temp(dev, buf); /* stream-ordered: after the kernels above */
    return st;
}
