/* optim.cu - the multi-tensor optimizer updates: the "vh.cuda.mta" extension
 * (vh_cuda_mta.h) that the mta plugin runs its steps through on a GPU.
 *
 * Multi-tensor apply, as Apex's multi_tensor_apply: the host cuts every
 * tensor into chunks of MTA_CHUNK elements and copies two tables to device
 * memory, the tensors (pointers, dtypes, per-tensor scalars) and the chunks
 * (tensor index, first element); one launch then covers every tensor.
 * Thread-block mapping of every kernel below: block b takes chunks b,
 * b + gridDim.x, ... (grid-stride over chunks), and its threads stride over
 * the chunk's elements (thread t: elements t, t + blockDim.x, ...).
 *
 * The formulas are mta's CPU kernels (plugins/optim/mta/algos.c), one fp32
 * operation at a time in the same order: __f*_rn keep nvcc from fusing a
 * multiply and an add, so f32 results match the CPU's bit for bit.
 * Reductions: each thread sums its elements in double, a shared-memory tree
 * of fixed shape sums the block's (one partial per chunk), and one thread per
 * tensor adds its chunks' partials in order: no atomics, the same bits on
 * every run.
 */
#include <stdlib.h>

#include "cuda_internal.h"

extern "C" {
#include "vithost/vh_cuda_mta.h"
}

/* Elements per chunk, mta's MTA_CHUNK_ELEMS: big enough that a block does
 * real work, small enough that a large tensor spreads over many blocks. */
#define MTA_CHUNK ((int64_t)1 << 16)

/* The device copy of one vh_cuda_mta_tensor, with its chunks. */
typedef struct mta_dev_tensor {
    void *master;
    const void *grad;
    float *m, *v;
    void *copy;
    int64_t numel;
    int64_t first_chunk, num_chunks;
    int32_t master_dtype, grad_dtype, copy_dtype, decays;
    float lamb_rate;
} mta_dev_tensor;

typedef struct mta_dev_chunk {
    int64_t tensor;
    int64_t begin; /* first element; the count is min(MTA_CHUNK, numel - begin) */
} mta_dev_chunk;

/* The scalars every kernel takes by value (from vh_cuda_mta_args). */
typedef struct mta_scalars {
    float grad_scale;
    int fresh;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float neg_step_size, bias_correction2_sqrt, bias_correction1, bias_correction2;
    float decay, weight_decay, neg_lr, momentum;
    int nesterov;
} mta_scalars;

/* One call's tables in device memory (a temporary block). */
typedef struct mta_launch {
    const mta_dev_tensor *tensors;
    const mta_dev_chunk *chunks;
    double *partials; /* `per` doubles per chunk, or NULL */
    int64_t count, num_chunks;
    int per;
    void *block;
    cudaStream_t stream;
    unsigned grid;
} mta_launch;

/* ---- kernels -------------------------------------------------------------- */

__device__ __forceinline__ int64_t chunk_count(const mta_dev_tensor *t, int64_t begin) {
    const int64_t left = t->numel - begin;
    return left < MTA_CHUNK ? left : MTA_CHUNK;
}

/* After an update: the master stored (rounded once when 16-bit), and the
 * low-precision copy when there is one. */
__device__ __forceinline__ void store_master(const mta_dev_tensor *t, int64_t j, float p) {
    vh_cuda_store(t->master, t->master_dtype, j, p);
    if (t->copy) vh_cuda_store(t->copy, t->copy_dtype, j, p);
}

/* Sum of v over the block's threads (blockDim.x == VH_CUDA_THREADS, a power
 * of two) by a fixed tree; the total is valid in thread 0. Every thread of
 * the block must call it. */
__device__ static double block_sum(double v, double *shm) {
    shm[threadIdx.x] = v;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) shm[threadIdx.x] += shm[threadIdx.x + half];
        __syncthreads();
    }
    const double total = shm[0];
    __syncthreads(); /* shm is reused by the next call */
    return total;
}

/* The Adam moments of one element (AdamW and LAMB share them): *m, *v in,
 * updated values out; g already scaled. */
__device__ __forceinline__ void adam_moments(const mta_scalars &s, float g, float *m, float *v) {
    const float m0 = s.fresh ? 0.0f : *m, v0 = s.fresh ? 0.0f : *v;
    *m = __fadd_rn(__fmul_rn(m0, s.beta1), __fmul_rn(s.one_minus_beta1, g));
    *v = __fadd_rn(__fmul_rn(v0, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
}

__global__ static void mta_adamw_kernel(const mta_dev_tensor *tensors, const mta_dev_chunk *chunks,
                                        int64_t num_chunks, mta_scalars s) {
    for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const mta_dev_tensor *t = &tensors[chunks[c].tensor];
        const int64_t b = chunks[c].begin, n = chunk_count(t, b);
        const float decay = t->decays ? s.decay : 1.0f;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const int64_t j = b + i;
            const float g = __fmul_rn(vh_cuda_load(t->grad, t->grad_dtype, j), s.grad_scale);
            const float pd = __fmul_rn(vh_cuda_load(t->master, t->master_dtype, j), decay);
            float m = t->m[j], v = t->v[j];
            adam_moments(s, g, &m, &v);
            const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
            t->m[j] = m;
            t->v[j] = v;
            store_master(t, j, __fadd_rn(pd, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom)));
        }
    }
}

__global__ static void mta_sgd_kernel(const mta_dev_tensor *tensors, const mta_dev_chunk *chunks,
                                      int64_t num_chunks, mta_scalars s) {
    for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const mta_dev_tensor *t = &tensors[chunks[c].tensor];
        const int64_t b = chunks[c].begin, n = chunk_count(t, b);
        const float wd = t->decays ? s.weight_decay : 0.0f;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const int64_t j = b + i;
            const float p = vh_cuda_load(t->master, t->master_dtype, j);
            float d = __fmul_rn(vh_cuda_load(t->grad, t->grad_dtype, j), s.grad_scale);
            if (wd != 0.0f) d = __fadd_rn(d, __fmul_rn(wd, p)); /* torch skips it at 0 */
            if (t->m) {
                const float buf = s.fresh ? d : __fadd_rn(__fmul_rn(t->m[j], s.momentum), d);
                t->m[j] = buf;
                d = s.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, buf)) : buf;
            }
            store_master(t, j, __fadd_rn(p, __fmul_rn(s.neg_lr, d)));
        }
    }
}

/* LAMB's update direction of one element (both halves call it, so they
 * agree bit for bit). */
__device__ __forceinline__ float lamb_direction(const mta_scalars &s, float m, float v, float p,
                                                float wd) {
    const float m_hat = __fdiv_rn(m, s.bias_correction1);
    const float v_hat = __fdiv_rn(v, s.bias_correction2);
    return __fadd_rn(__fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), s.eps)), __fmul_rn(wd, p));
}

/* partials[2c], [2c + 1]: ||p||^2 and ||u||^2 of chunk c. */
__global__ static void mta_lamb_moments_kernel(const mta_dev_tensor *tensors,
                                               const mta_dev_chunk *chunks, int64_t num_chunks,
                                               mta_scalars s, double *partials) {
    __shared__ double shm[VH_CUDA_THREADS];
    for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const mta_dev_tensor *t = &tensors[chunks[c].tensor];
        const int64_t b = chunks[c].begin, n = chunk_count(t, b);
        const float wd = t->decays ? s.weight_decay : 0.0f;
        double ps = 0.0, us = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const int64_t j = b + i;
            const float g = __fmul_rn(vh_cuda_load(t->grad, t->grad_dtype, j), s.grad_scale);
            const float p = vh_cuda_load(t->master, t->master_dtype, j);
            float m = t->m[j], v = t->v[j];
            adam_moments(s, g, &m, &v);
            t->m[j] = m;
            t->v[j] = v;
            const float u = lamb_direction(s, m, v, p, wd);
            ps += (double)p * (double)p;
            us += (double)u * (double)u;
        }
        ps = block_sum(ps, shm);
        us = block_sum(us, shm);
        if (threadIdx.x == 0) partials[2 * c] = ps, partials[2 * c + 1] = us;
    }
}

__global__ static void mta_lamb_apply_kernel(const mta_dev_tensor *tensors,
                                             const mta_dev_chunk *chunks, int64_t num_chunks,
                                             mta_scalars s) {
    for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const mta_dev_tensor *t = &tensors[chunks[c].tensor];
        const int64_t b = chunks[c].begin, n = chunk_count(t, b);
        const float wd = t->decays ? s.weight_decay : 0.0f, rate = t->lamb_rate;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const int64_t j = b + i;
            const float p = vh_cuda_load(t->master, t->master_dtype, j);
            const float u = lamb_direction(s, t->m[j], t->v[j], p, wd);
            store_master(t, j, __fsub_rn(p, __fmul_rn(rate, u)));
        }
    }
}

/* partials[c]: the sum of squares of chunk c's gradient. */
__global__ static void mta_sum_squares_kernel(const mta_dev_tensor *tensors,
                                              const mta_dev_chunk *chunks, int64_t num_chunks,
                                              double *partials) {
    __shared__ double shm[VH_CUDA_THREADS];
    for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const mta_dev_tensor *t = &tensors[chunks[c].tensor];
        const int64_t b = chunks[c].begin, n = chunk_count(t, b);
        double sq = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const double g = (double)vh_cuda_load(t->grad, t->grad_dtype, b + i);
            sq += g * g;
        }
        sq = block_sum(sq, shm);
        if (threadIdx.x == 0) partials[c] = sq;
    }
}

/* One thread per tensor (grid-stride): sums[per * t + k] = its chunks'
 * partials in chunk order; 0 for an empty tensor. */
__global__ static void mta_tensor_sums_kernel(const mta_dev_tensor *tensors, int64_t count,
                                              const double *partials, int per, double *sums) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < count; t += stride)
        for (int k = 0; k < per; k++) {
            double total = 0.0;
            for (int64_t c = 0; c < tensors[t].num_chunks; c++)
                total += partials[per * (tensors[t].first_chunk + c) + k];
            sums[per * t + k] = total;
        }
}

/* ---- host side ------------------------------------------------------------ */

/* What a call needs of each tensor: the state slots it reads and whether it
 * reads the gradient. */
typedef struct mta_needs {
    int states; /* adamw, lamb: 2; sgd: 0 (a NULL state[0] means no momentum) */
    int grad;
    int per;    /* doubles per tensor into args->sums (0: none) */
} mta_needs;

static vh_status check_tensor(const vh_cuda_mta_tensor *t, const mta_needs *need) {
    if (t->numel < 0) return VH_STATUS_ERR_INVALID_ARG;
    if (t->numel == 0) return VH_STATUS_OK;
    if (!t->master || (need->grad && !t->grad)) return VH_STATUS_ERR_INVALID_ARG;
    for (int k = 0; k < need->states; k++)
        if (!t->state[k]) return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cuda_is_float(t->master_dtype) || (need->grad && !vh_cuda_is_float(t->grad_dtype)) ||
        (t->copy && !vh_cuda_is_float(t->copy_dtype)))
        return VH_STATUS_ERR_UNSUPPORTED;
    return VH_STATUS_OK;
}

static size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* Fills the host images of the two tables: tensors, then chunks. */
static void fill_tables(const vh_cuda_mta_args *a, mta_dev_tensor *dt, mta_dev_chunk *dc) {
    int64_t c = 0;
    for (int32_t i = 0; i < a->count; i++) {
        const vh_cuda_mta_tensor *t = &a->tensors[i];
        mta_dev_tensor d = {t->master, t->grad, t->state[0], t->state[1], t->copy, t->numel,
                            c, 0, t->master_dtype, t->grad_dtype, t->copy_dtype, t->decays,
                            t->lamb_rate};
        for (int64_t b = 0; b < t->numel; b += MTA_CHUNK, c++) {
            dc[c].tensor = i;
            dc[c].begin = b;
        }
        d.num_chunks = c - d.first_chunk;
        dt[i] = d;
    }
}

/* Checks the args and uploads the tables into one temporary block. */
static vh_status mta_prepare(vh_device *dev, const vh_cuda_mta_args *a, const mta_needs *need,
                             mta_launch *out) {
    memset(out, 0, sizeof *out);
    if (!dev || a->count < 0 || (a->count > 0 && !a->tensors) ||
        (need->per && a->count > 0 && !a->sums))
        return VH_STATUS_ERR_INVALID_ARG;
    int64_t nc = 0;
    for (int32_t i = 0; i < a->count; i++) {
        vh_status st = check_tensor(&a->tensors[i], need);
        if (st != VH_STATUS_OK) return st;
        nc += vh_cuda_ceil_div(a->tensors[i].numel, MTA_CHUNK);
    }
    const size_t tbytes = align_up((size_t)a->count * sizeof(mta_dev_tensor));
    const size_t cbytes = align_up((size_t)nc * sizeof(mta_dev_chunk));
    const size_t pbytes = (size_t)nc * (size_t)need->per * sizeof(double);
    out->count = a->count, out->num_chunks = nc, out->per = need->per;
    out->stream = vh_cuda_stream(dev, a->stream);
    out->grid = vh_cuda_blocks(nc, 1, VH_CUDA_MAX_BLOCKS);
    if (a->count == 0) return VH_STATUS_OK;
    char *host = (char *)malloc(tbytes + cbytes);
    if (!host) return VH_STATUS_ERR_NOMEM;
    fill_tables(a, (mta_dev_tensor *)host, (mta_dev_chunk *)(host + tbytes));
    vh_status st =
        vh_cuda_alloc_temp_on(dev, out->stream, tbytes + cbytes + pbytes, &out->block);
    /* from pageable memory: the bytes are staged before the call returns */
    if (st == VH_STATUS_OK)
        st = vh_cuda_status(cudaMemcpyAsync(out->block, host, tbytes + cbytes,
                                            cudaMemcpyHostToDevice, out->stream));
    free(host);
    if (st != VH_STATUS_OK) {
        if (out->block) vh_cuda_free_temp(dev, out->block);
        out->block = NULL;
        return st;
    }
    char *base = (char *)out->block;
    out->tensors = (const mta_dev_tensor *)base;
    out->chunks = (const mta_dev_chunk *)(base + tbytes);
    out->partials = pbytes ? (double *)(base + tbytes + cbytes) : NULL;
    return VH_STATUS_OK;
}

/* The per-tensor sums (when the call has them), then the block back to the
 * allocator, ordered after the launches. */
static vh_status mta_finish(vh_device *dev, const mta_launch *l, double *sums) {
    vh_status st = vh_cuda_launched();
    if (st == VH_STATUS_OK && l->per && l->count > 0) {
        mta_tensor_sums_kernel<<<vh_cuda_eltwise_blocks(l->count), VH_CUDA_THREADS, 0,
                                 l->stream>>>(l->tensors, l->count, l->partials, l->per, sums);
        st = vh_cuda_launched();
    }
    if (l->block) vh_cuda_free_temp(dev, l->block);
    return st;
}

static mta_scalars scalars_of(const vh_cuda_mta_args *a) {
    mta_scalars s = {a->grad_scale, a->fresh != 0, a->beta1, a->one_minus_beta1, a->beta2,
                     a->one_minus_beta2, a->eps, a->neg_step_size, a->bias_correction2_sqrt,
                     a->bias_correction1, a->bias_correction2, a->decay, a->weight_decay,
                     a->neg_lr, a->momentum, a->nesterov != 0};
    return s;
}

typedef enum mta_op {
    MTA_OP_ADAMW,
    MTA_OP_SGD,
    MTA_OP_LAMB_MOMENTS,
    MTA_OP_LAMB_APPLY,
    MTA_OP_SUM_SQUARES,
} mta_op;

/* Every entry point: read the args, check and upload, one launch, sums. */
static vh_status mta_run(vh_device *dev, const vh_cuda_mta_args *in, mta_op op) {
    vh_cuda_mta_args a;
    if (!VH_CUDA_READ_ARGS(vh_cuda_mta_args, in, a)) return VH_STATUS_ERR_INVALID_ARG;
    static const mta_needs needs[] = {
        {2, 1, 0}, /* adamw */
        {0, 1, 0}, /* sgd */
        {2, 1, 2}, /* lamb_moments */
        {2, 0, 0}, /* lamb_apply */
        {0, 1, 1}, /* sum_squares */
    };
    mta_launch l;
    vh_status st = mta_prepare(dev, &a, &needs[op], &l);
    if (st != VH_STATUS_OK || a.count == 0) return st;
    const mta_scalars s = scalars_of(&a);
    if (l.num_chunks > 0) {
        const unsigned g = l.grid, b = VH_CUDA_THREADS;
        const int64_t nc = l.num_chunks;
        switch (op) {
        case MTA_OP_ADAMW:
            mta_adamw_kernel<<<g, b, 0, l.stream>>>(l.tensors, l.chunks, nc, s);
            break;
        case MTA_OP_SGD:
            mta_sgd_kernel<<<g, b, 0, l.stream>>>(l.tensors, l.chunks, nc, s);
            break;
        case MTA_OP_LAMB_MOMENTS:
            mta_lamb_moments_kernel<<<g, b, 0, l.stream>>>(l.tensors, l.chunks, nc, s, l.partials);
            break;
        case MTA_OP_LAMB_APPLY:
            mta_lamb_apply_kernel<<<g, b, 0, l.stream>>>(l.tensors, l.chunks, nc, s);
            break;
        case MTA_OP_SUM_SQUARES:
            mta_sum_squares_kernel<<<g, b, 0, l.stream>>>(l.tensors, l.chunks, nc, l.partials);
            break;
        }
    }
    return mta_finish(dev, &l, a.sums);
}

static vh_status mta_adamw(vh_device *dev, const vh_cuda_mta_args *a) {
    return mta_run(dev, a, MTA_OP_ADAMW);
}
static vh_status mta_sgd(vh_device *dev, const vh_cuda_mta_args *a) {
    return mta_run(dev, a, MTA_OP_SGD);
}
static vh_status mta_lamb_moments(vh_device *dev, const vh_cuda_mta_args *a) {
    return mta_run(dev, a, MTA_OP_LAMB_MOMENTS);
}
static vh_status mta_lamb_apply(vh_device *dev, const vh_cuda_mta_args *a) {
    return mta_run(dev, a, MTA_OP_LAMB_APPLY);
}
static vh_status mta_sum_squares(vh_device *dev, const vh_cuda_mta_args *a) {
    return mta_run(dev, a, MTA_OP_SUM_SQUARES);
}

const void *vh_cuda_mta_extension(void) {
    static const vh_cuda_mta_ops ops = {
        sizeof(vh_cuda_mta_ops), mta_adamw, mta_sgd, mta_lamb_moments, mta_lamb_apply,
        mta_sum_squares,
    };
    return &ops;
}
