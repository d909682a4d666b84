/* attention_gemm.cu - the attention's products on the tensor cores, through
 * cuBLASLt (gemm.cu): the default path. attention.cu keeps the tiled/fused
 * path, taken with VITHOST_CUDA_ATTENTION=tiled (the tests run both).
 *
 * Why: the tiled path's products are fp32 SIMT tiles, about 4 TFLOP/s on an
 * H200, and took 70% of a ViT-B/16 AMP step (first GPU run). cuBLASLt takes
 * one batch stride, and the packed qkv of either layout has two (sample and
 * head), so q, k, v (and dO) are first gathered into dense (B*H, N, Dh)
 * blocks by one copy kernel; every product is then one strided-batched GEMM
 * over B*H, and the results are scattered back:
 *
 *   forward:  S = scale Q K^T (fp32), P = softmax(S) -> probs,
 *             O = P V (in dtype) -> out
 *   backward: dV = P^T dO, dP = dO V^T (fp32), dS = P * (dP - rowsum(dP * P))
 *             (in dtype), dQ = scale dS K, dK = scale dS^T Q (fp32),
 *             dqkv += [dQ dK dV], each element read, summed and rounded once.
 *
 * P and dS are GEMM operands beside V, K and Q, so they take the operands'
 * dtype: where probs has another (the ViT keeps fp32 probs under AMP), P is
 * also written in the operands' dtype, rounded from the value as stored.
 *
 * Numbers are the CPU's 16-bit kernels' (sdk/src/cpu/attention16.c) and
 * autocast's (softmax in fp32, then bmm in bf16): logits and softmax in
 * fp32, P and dS rounded to the operand dtype as GEMM operands, fp32
 * accumulation, every output element rounded once. With f32 operands
 * nothing is rounded on the way (gemm.cu computes f32 without TF32).
 * Deterministic: cuBLASLt's algorithm for a shape is fixed by the plan
 * cache, and the kernels here have no atomics.
 */
#include <stdlib.h>
#include <string.h>

#include "attention_rows.cuh"
#include "cuda_internal.h"
#include "reduce.cuh"

int vh_cuda_attention_gemm_applies(void) {
    const char *v = getenv("VITHOST_CUDA_ATTENTION");
    return !(v && strcmp(v, "tiled") == 0);
}

/* Where part w (0 q, 1 k, 2 v) of head h of sample b's token t starts in a
 * packed tensor: qkv (parts 3) or out/dout (parts 1, part_stride 0). */
typedef struct heads_view {
    int64_t batch_stride, token_stride, part_stride;
} heads_view;

/* The coordinates of element i of the dense [parts][B * H][N][Dh] blocks,
 * in index type I: 32-bit wherever the blocks have under 2^31 elements, as
 * a 64-bit division costs several times a 32-bit one and these kernels do
 * four per element. */
template <typename I> struct head_coords {
    I d, t, b, h, w;
    __device__ head_coords(I i, I B, I H, I N, I Dh) {
        const I row = i / Dh, bhw = row / N, w_ = bhw / (B * H), bh = bhw - w_ * (B * H);
        d = i - row * Dh, t = row - bhw * N, w = w_, b = bh / H, h = bh - (bh / H) * H;
    }
};

/* Where element (w, b, h, t, d) of the dense blocks sits in the packed
 * tensor of view v. */
template <typename I>
__device__ __forceinline__ int64_t packed_at(const head_coords<I> &c, heads_view v, int64_t Dh) {
    return (int64_t)c.b * v.batch_stride + (int64_t)c.t * v.token_stride +
           (int64_t)c.w * v.part_stride + (int64_t)c.h * Dh + c.d;
}

/* dst[w][b * H + h][t][d] = src at part w of (b, t, h, d), bit for bit
 * (T: the element's width). Mapping: one thread per element of dst, d
 * fastest: writes are coalesced, reads along each head's Dh run. */
template <typename T, typename I>
__global__ static void gather_heads_kernel(const T *src, T *dst, heads_view v, int64_t total,
                                           I B, I H, I N, I Dh) {
    VH_CUDA_GRID_LOOP(i, total) {
        const head_coords<I> c((I)i, B, H, N, Dh);
        dst[i] = src[packed_at(c, v, Dh)];
    }
}

/* The inverse: part w of (b, t, h, d) in dst (dtype dd) = src[w][b*H+h][t][d]
 * (dtype sd), plus dst's own value when accumulating; stored rounded once.
 * Elements of dst outside the heads (row gaps) are not touched. Mapping as
 * gather_heads_kernel. */
template <typename I>
__global__ static void scatter_heads_kernel(const void *src, int32_t sd, void *dst, int32_t dd,
                                            heads_view v, int accumulate, int64_t total, I B,
                                            I H, I N, I Dh) {
    VH_CUDA_GRID_LOOP(i, total) {
        const head_coords<I> c((I)i, B, H, N, Dh);
        const int64_t o = packed_at(c, v, Dh);
        float x = vh_cuda_load(src, sd, i);
        if (accumulate) x += vh_cuda_load(dst, dd, o);
        vh_cuda_store(dst, dd, o, x);
    }
}

/* dst (dd) = src (sd), n elements, each rounded once. */
__global__ static void convert_kernel(const void *src, int32_t sd, void *dst, int32_t dd,
                                      int64_t n) {
    VH_CUDA_GRID_LOOP(i, n) vh_cuda_store(dst, dd, i, vh_cuda_load(src, sd, i));
}

static heads_view qkv_view(const vh_attention_args *a) {
    return heads_view{a->qkv_batch_stride, a->qkv_token_stride, a->heads * a->head_dim};
}

static heads_view out_view(const vh_attention_args *a) {
    return heads_view{a->out_batch_stride, a->out_token_stride, 0};
}

template <typename T, typename I>
static void launch_gather(const vh_attention_args *a, const void *src, heads_view v, void *dst,
                          int64_t total, cudaStream_t s) {
    gather_heads_kernel<T, I><<<vh_cuda_eltwise_blocks(total), VH_CUDA_THREADS, 0, s>>>(
        (const T *)src, (T *)dst, v, total, (I)a->batch, (I)a->heads, (I)a->tokens,
        (I)a->head_dim);
}

static int fits_32(int64_t total) { return total < ((int64_t)1 << 31); }

static vh_status gather_heads(const vh_attention_args *a, const void *src, heads_view v,
                              int parts, void *dst, cudaStream_t s) {
    const int64_t total = parts * a->batch * a->heads * a->tokens * a->head_dim;
    const int wide = a->dtype == VH_DTYPE_F32;
    if (fits_32(total)) {
        if (wide) launch_gather<float, uint32_t>(a, src, v, dst, total, s);
        else launch_gather<uint16_t, uint32_t>(a, src, v, dst, total, s);
    } else {
        if (wide) launch_gather<float, int64_t>(a, src, v, dst, total, s);
        else launch_gather<uint16_t, int64_t>(a, src, v, dst, total, s);
    }
    return vh_cuda_launched();
}

static vh_status scatter_heads(const vh_attention_args *a, const void *src, int32_t sd,
                               void *dst, heads_view v, int parts, int accumulate,
                               cudaStream_t s) {
    const int64_t total = parts * a->batch * a->heads * a->tokens * a->head_dim;
    const unsigned blocks = vh_cuda_eltwise_blocks(total);
    if (fits_32(total))
        scatter_heads_kernel<uint32_t><<<blocks, VH_CUDA_THREADS, 0, s>>>(
            src, sd, dst, a->dtype, v, accumulate, total, (uint32_t)a->batch,
            (uint32_t)a->heads, (uint32_t)a->tokens, (uint32_t)a->head_dim);
    else
        scatter_heads_kernel<int64_t><<<blocks, VH_CUDA_THREADS, 0, s>>>(
            src, sd, dst, a->dtype, v, accumulate, total, a->batch, a->heads, a->tokens,
            a->head_dim);
    return vh_cuda_launched();
}

/* C[i] = alpha op(A[i]) op(B[i]) for the B*H members i, dense and row-major:
 * A is (ta ? k x m : m x k), B is (tb ? n x k : k x n), C is m x n in cd. */
static vh_status bmm(vh_device *dev, const vh_attention_args *a, int ta, int tb, int64_t m,
                     int64_t n, int64_t k, float alpha, const void *A, const void *B, void *C,
                     int32_t cd) {
    vh_gemm_args g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = 0.0f;
    g.a = A, g.lda = ta ? m : k, g.stride_a = m * k;
    g.b = B, g.ldb = tb ? k : n, g.stride_b = k * n;
    g.c = C, g.ldc = n, g.stride_c = m * n;
    g.batch = a->batch * a->heads;
    g.ab_dtype = a->dtype, g.c_dtype = cd, g.bias_dtype = VH_DTYPE_F32;
    g.stream = a->stream;
    return vh_cuda_gemm(dev, &g);
}

/* Temporaries of one call, freed together (stream-ordered, after the work). */
typedef struct temps {
    void *p[6];
    int n;
} temps;

static vh_status temp(vh_device *dev, cudaStream_t s, temps *t, size_t bytes, void **out) {
    const vh_status st = vh_cuda_alloc_temp_on(dev, s, bytes, out);
    if (st == VH_STATUS_OK) t->p[t->n++] = *out;
    return st;
}

static vh_status temps_free(vh_device *dev, temps *t, vh_status st) {
    for (int i = 0; i < t->n; i++) vh_cuda_free_temp(dev, t->p[i]);
    return st;
}

vh_status vh_cuda_attention_forward_gemm(vh_device *dev, const vh_attention_args *a,
                                         cudaStream_t s) {
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim;
    const int64_t rows = B * H * N, head = B * H * N * Dh;
    const size_t es = vh_dtype_size((vh_dtype)a->dtype);
    temps t = {};
    void *qkvp = NULL, *op = NULL, *pop = a->probs; /* pop: P as an operand */
    float *logits = (float *)a->probs; /* in place when probs is f32 */
    vh_status st = temp(dev, s, &t, 3 * (size_t)head * es, &qkvp);
    if (st == VH_STATUS_OK) st = temp(dev, s, &t, (size_t)head * es, &op);
    if (st == VH_STATUS_OK && a->probs_dtype != VH_DTYPE_F32)
        st = temp(dev, s, &t, (size_t)(rows * N) * sizeof(float), (void **)&logits);
    if (st == VH_STATUS_OK && a->probs_dtype != a->dtype)
        st = temp(dev, s, &t, (size_t)(rows * N) * es, &pop);
    if (st != VH_STATUS_OK) return temps_free(dev, &t, st);
    const char *q = (const char *)qkvp, *k = q + head * es, *v = k + head * es;
    st = gather_heads(a, a->qkv, qkv_view(a), 3, qkvp, s);
    if (st == VH_STATUS_OK)
        st = bmm(dev, a, 0, 1, N, N, Dh, a->scale, q, k, logits, VH_DTYPE_F32); /* S */
    if (st == VH_STATUS_OK) {
        softmax_rows_kernel<<<vh_cuda_blocks(rows, 1, VH_CUDA_MAX_BLOCKS),
                              vh_cuda_attn_row_threads(N), 0, s>>>(
            logits, a->probs, a->probs_dtype, pop == a->probs ? NULL : pop, a->dtype, rows, N);
        st = vh_cuda_launched();
    }
    if (st == VH_STATUS_OK) st = bmm(dev, a, 0, 0, N, Dh, N, 1.0f, pop, v, op, a->dtype);
    if (st == VH_STATUS_OK) st = scatter_heads(a, op, a->dtype, a->out, out_view(a), 1, 0, s);
    return temps_free(dev, &t, st);
}

vh_status vh_cuda_attention_backward_gemm(vh_device *dev, const vh_attention_args *a,
                                          cudaStream_t s) {
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim;
    const int64_t rows = B * H * N, head = B * H * N * Dh;
    const size_t es = vh_dtype_size((vh_dtype)a->dtype);
    temps t = {};
    void *qkvp = NULL, *dop = NULL, *ds = NULL, *pop = a->probs; /* pop: P as an operand */
    float *grads = NULL, *dp = NULL; /* grads: [dQ dK dV] in fp32, as dqkv's parts */
    vh_status st = temp(dev, s, &t, 3 * (size_t)head * es, &qkvp);
    if (st == VH_STATUS_OK) st = temp(dev, s, &t, (size_t)head * es, &dop);
    if (st == VH_STATUS_OK)
        st = temp(dev, s, &t, 3 * (size_t)head * sizeof(float), (void **)&grads);
    if (st == VH_STATUS_OK) st = temp(dev, s, &t, (size_t)(rows * N) * sizeof(float), (void **)&dp);
    /* dS in the operand dtype: in place of dP when that is f32 (each element
     * is read and written by one thread), else beside it. */
    ds = dp;
    if (st == VH_STATUS_OK && a->dtype != VH_DTYPE_F32)
        st = temp(dev, s, &t, (size_t)(rows * N) * es, &ds);
    if (st == VH_STATUS_OK && a->probs_dtype != a->dtype)
        st = temp(dev, s, &t, (size_t)(rows * N) * es, &pop);
    if (st != VH_STATUS_OK) return temps_free(dev, &t, st);
    if (pop != a->probs) {
        convert_kernel<<<vh_cuda_eltwise_blocks(rows * N), VH_CUDA_THREADS, 0, s>>>(
            a->probs, a->probs_dtype, pop, a->dtype, rows * N);
        st = vh_cuda_launched();
    }
    const char *q = (const char *)qkvp, *k = q + head * es, *v = k + head * es;
    float *dq = grads, *dk = grads + head, *dv = grads + 2 * head;
    if (st == VH_STATUS_OK) st = gather_heads(a, a->qkv, qkv_view(a), 3, qkvp, s);
    if (st == VH_STATUS_OK) st = gather_heads(a, a->dout, out_view(a), 1, dop, s);
    if (st == VH_STATUS_OK) st = bmm(dev, a, 1, 0, N, Dh, N, 1.0f, pop, dop, dv, VH_DTYPE_F32);
    if (st == VH_STATUS_OK) st = bmm(dev, a, 0, 1, N, N, Dh, 1.0f, dop, v, dp, VH_DTYPE_F32);
    if (st == VH_STATUS_OK) {
        softmax_grad_rows_kernel<<<vh_cuda_blocks(rows, 1, VH_CUDA_MAX_BLOCKS),
                                   vh_cuda_attn_row_threads(N), 0, s>>>(
            dp, a->probs, a->probs_dtype, ds, a->dtype, rows, N);
        st = vh_cuda_launched();
    }
    if (st == VH_STATUS_OK) st = bmm(dev, a, 0, 0, N, Dh, N, a->scale, ds, k, dq, VH_DTYPE_F32);
    if (st == VH_STATUS_OK) st = bmm(dev, a, 1, 0, N, Dh, N, a->scale, ds, q, dk, VH_DTYPE_F32);
    if (st == VH_STATUS_OK)
        st = scatter_heads(a, grads, VH_DTYPE_F32, a->dqkv, qkv_view(a), 3, 1, s);
    return temps_free(dev, &t, st);
}
