/* attention.cu - multi-head self-attention on a packed qkv tensor, any layout
 * (vh_device.h; the CPU twin is sdk/src/cpu/attention.c). The entry points
 * hand the call to the cuBLASLt path (attention_gemm.cu) wherever it applies;
 * what is below is the simple path, for the rest and for the tests.
 *
 *   forward:  S = scale Q K^T, P = softmax(S) -> probs, out = P V
 *   backward: dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
 *             dQ += scale dS K, dK += scale dS^T Q
 *
 * Forward, head_dim <= VH_CUDA_ATTN_MAX_HEAD_DIM: one fused kernel
 * (fused_forward_kernel) per call; no N x N matrix but probs itself reaches
 * global memory. Larger heads, and the whole backward, take the tiled path:
 * every product is one strided batched tile kernel (bmm_kernel) reading q, k,
 * v, out and dqkv in place through their strides, transposes being strides
 * too; the softmax and its gradient are row kernels over fp32 N x N scratch.
 *
 * Numerics are the CPU's: logits and softmax in fp32, out = P V with the
 * probabilities as stored (rounded to probs_dtype), every out and dqkv
 * element rounded once. Deterministic: each output element is summed by one
 * thread in a fixed order, row reductions are trees of a fixed shape; no
 * atomics. probs is required by the contract (the CPU rejects NULL), so the
 * fused kernel writes it; a probs-free forward (inference, or a backward
 * that recomputes P) would need an ABI addition.
 */
#include "attention_rows.cuh"
#include "cuda_internal.h"
#include "reduce.cuh"

#include <math.h>

#define TILE VH_CUDA_ATTN_TILE
#define ROWS VH_CUDA_ATTN_ROWS
#define KEYS VH_CUDA_ATTN_KEYS
/* Threads on one query row of the fused forward (a half warp), and the keys
 * of a tile each of them scores. */
#define ROW_LANES (VH_CUDA_THREADS / ROWS)
#define KEYS_PER_LANE (KEYS / ROW_LANES)

static_assert(ROW_LANES == 16 && KEYS % ROW_LANES == 0, "a half warp per query row");

/* A strided (batch, heads, rows, cols) operand: element (b, h, r, c) at
 * p[off + b * bs + h * hs + r * rs + c * cs], in `dtype`. */
typedef struct attn_mat {
    void *p;
    int32_t dtype;
    int64_t off, bs, hs, rs, cs;
} attn_mat;

__device__ __forceinline__ int64_t mat_at(const attn_mat *m, int64_t b, int64_t h, int64_t r,
                                          int64_t c) {
    return m->off + b * m->bs + h * m->hs + r * m->rs + c * m->cs;
}

/* ---- tiled products -------------------------------------------------------------
 * C (+)= alpha A B for every (sample, head): A (m x k), B (k x n), C (m x n).
 * Mapping: block (b * heads + h, column tile, row tile) of TILE x TILE
 * threads; thread (x, y) owns C(row0 + y, col0 + x) and sums its k products
 * in order. A and B pass through shared memory a TILE x TILE tile at a time;
 * a tile is loaded with the threads' fast index along the operand's unit
 * stride, so transposed views (K^T, P^T, dS^T) are read coalesced too. */
__global__ static void bmm_kernel(int64_t heads, int64_t m, int64_t n, int64_t k, float alpha,
                                  attn_mat A, attn_mat B, attn_mat C, int accumulate) {
    __shared__ float as[TILE][TILE + 1], bs[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t b = blockIdx.x / heads, h = blockIdx.x % heads;
    const int64_t row0 = (int64_t)blockIdx.z * TILE, col0 = (int64_t)blockIdx.y * TILE;
    const int a_rows_fast = A.rs == 1 && A.cs != 1, b_rows_fast = B.rs == 1 && B.cs != 1;
    const int ai = a_rows_fast ? tx : ty, aj = a_rows_fast ? ty : tx;
    const int bi = b_rows_fast ? tx : ty, bj = b_rows_fast ? ty : tx;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += TILE) {
        const int64_t ar = row0 + ai, ac = k0 + aj, br = k0 + bi, bc = col0 + bj;
        as[ai][aj] = ar < m && ac < k ? vh_cuda_load(A.p, A.dtype, mat_at(&A, b, h, ar, ac)) : 0.0f;
        bs[bi][bj] = br < k && bc < n ? vh_cuda_load(B.p, B.dtype, mat_at(&B, b, h, br, bc)) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; kk++) acc += as[ty][kk] * bs[kk][tx];
        __syncthreads();
    }
    const int64_t r = row0 + ty, c = col0 + tx;
    if (r < m && c < n) {
        const int64_t i = mat_at(&C, b, h, r, c);
        float v = alpha * acc;
        if (accumulate) v += vh_cuda_load(C.p, C.dtype, i);
        vh_cuda_store(C.p, C.dtype, i, v);
    }
}

static void bmm(int64_t batch, int64_t heads, int64_t m, int64_t n, int64_t k, float alpha,
                const attn_mat *A, const attn_mat *B, const attn_mat *C, int accumulate,
                cudaStream_t s) {
    const dim3 grid((unsigned)(batch * heads), (unsigned)vh_cuda_attn_tiles(n),
                    (unsigned)vh_cuda_attn_tiles(m));
    bmm_kernel<<<grid, dim3(TILE, TILE), 0, s>>>(heads, m, n, k, alpha, *A, *B, *C, accumulate);
}

/* (the row kernels, softmax and its gradient, are in attention_rows.cuh) */

/* ---- fused forward ------------------------------------------------------------------
 * Mapping: block (b * heads + h, query row block) of VH_CUDA_THREADS threads
 * = ROWS rows x ROW_LANES lanes; thread t works on query row r = t / 16 of
 * the block (a half warp per row) at lane l = t % 16: it scores keys l,
 * l + 16 of each KEYS tile, and owns output columns l, l + 16, ... of its
 * row. The half warp reduces its row's max and sum with shuffles.
 * Two sweeps over the key tiles: the first finds each row's max and sum of
 * e^(s - max) (online: the sum is rescaled when the max grows); the second
 * recomputes the scores, writes the normalised probabilities rounded to
 * probs_dtype and accumulates out += P V from those, as the CPU does. The
 * scores are computed by the same code in both sweeps, so they agree. */

/* Rows [t0, t0 + nrows) of part `which` (0 q, 1 k, 2 v) of block (b, h) into
 * dst (rows of ld floats, MAXD used), zero past the tokens and head_dim.
 * Consecutive threads take consecutive d: coalesced along the head. */
template <int MAXD>
__device__ static void load_part(float *dst, int ld, int nrows, const vh_attention_args *a,
                                 int64_t b, int64_t h, int which, int64_t t0) {
    const int64_t base = b * a->qkv_batch_stride + (which * a->heads + h) * a->head_dim;
    for (int e = threadIdx.x; e < nrows * MAXD; e += blockDim.x) {
        const int r = e / MAXD, d = e % MAXD;
        const int64_t t = t0 + r;
        dst[r * ld + d] = t < a->tokens && d < a->head_dim
                              ? vh_cuda_load(a->qkv, a->dtype, base + t * a->qkv_token_stride + d)
                              : 0.0f;
    }
}

/* Sum (or max) over the 16 lanes of a half warp; all 32 lanes take part. */
__device__ __forceinline__ float half_warp_reduce(float v, int is_max) {
    for (int o = ROW_LANES / 2; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    return v;
}

/* The scores of this lane's keys of the tile at j0: scale * q . k, -inf
 * past the tokens (e^-inf = 0). */
template <int MAXD>
__device__ __forceinline__ void tile_scores(float s[KEYS_PER_LANE], const float *q,
                                            const float (*ks)[MAXD + 1], int lane, int64_t j0,
                                            const vh_attention_args *a) {
#pragma unroll
    for (int c = 0; c < KEYS_PER_LANE; c++) {
        const int kj = lane + c * ROW_LANES;
        float dot = 0.0f;
        for (int d = 0; d < a->head_dim; d++) dot += q[d] * ks[kj][d];
        s[c] = j0 + kj < a->tokens ? a->scale * dot : -INFINITY;
    }
}

template <int MAXD>
__global__ static void __launch_bounds__(VH_CUDA_THREADS)
    fused_forward_kernel(vh_attention_args a) {
    __shared__ float qs[ROWS][MAXD], ks[KEYS][MAXD + 1], vs[KEYS][MAXD], ps[ROWS][KEYS + 1];
    const int64_t b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, n = a.tokens;
    const int r = threadIdx.x / ROW_LANES, lane = threadIdx.x % ROW_LANES;
    const int64_t i0 = (int64_t)blockIdx.y * ROWS, i = i0 + r;
    const int64_t prow = ((int64_t)blockIdx.x * n + i) * n; /* probs (b, h, i, 0) */
    load_part<MAXD>(&qs[0][0], MAXD, ROWS, &a, b, h, 0, i0);
    float s[KEYS_PER_LANE], mx = -INFINITY, sum = 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += KEYS) { /* sweep 1: max and sum */
        __syncthreads(); /* qs written; the last tile's readers done */
        load_part<MAXD>(&ks[0][0], MAXD + 1, KEYS, &a, b, h, 1, j0);
        __syncthreads();
        tile_scores<MAXD>(s, qs[r], ks, lane, j0, &a);
        float tmax = s[0];
        for (int c = 1; c < KEYS_PER_LANE; c++) tmax = fmaxf(tmax, s[c]);
        const float m_new = fmaxf(mx, half_warp_reduce(tmax, 1)); /* key j0 is finite */
        float ts = 0.0f;
        for (int c = 0; c < KEYS_PER_LANE; c++) ts += expf(s[c] - m_new);
        sum = sum * expf(mx - m_new) + half_warp_reduce(ts, 0);
        mx = m_new;
    }
    const float inv = 1.0f / sum;
    float acc[MAXD / ROW_LANES];
#pragma unroll
    for (int k = 0; k < MAXD / ROW_LANES; k++) acc[k] = 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += KEYS) { /* sweep 2: probs and out */
        __syncthreads(); /* the last tile's readers done */
        load_part<MAXD>(&ks[0][0], MAXD + 1, KEYS, &a, b, h, 1, j0);
        load_part<MAXD>(&vs[0][0], MAXD, KEYS, &a, b, h, 2, j0);
        __syncthreads();
        tile_scores<MAXD>(s, qs[r], ks, lane, j0, &a);
#pragma unroll
        for (int c = 0; c < KEYS_PER_LANE; c++) {
            const int kj = lane + c * ROW_LANES;
            const float p = round_to(expf(s[c] - mx) * inv, a.probs_dtype); /* 0 past n */
            if (i < n && j0 + kj < n) vh_cuda_store(a.probs, a.probs_dtype, prow + j0 + kj, p);
            ps[r][kj] = p;
        }
        __syncthreads();
        const int64_t kn = n - j0 < KEYS ? n - j0 : KEYS;
        for (int jj = 0; jj < kn; jj++) {
            const float p = ps[r][jj];
#pragma unroll
            for (int k = 0; k < MAXD / ROW_LANES; k++) acc[k] += p * vs[jj][lane + k * ROW_LANES];
        }
    }
    if (i >= n) return;
    const int64_t ob = b * a.out_batch_stride + i * a.out_token_stride + h * a.head_dim;
#pragma unroll
    for (int k = 0; k < MAXD / ROW_LANES; k++) {
        const int d = lane + k * ROW_LANES;
        if (d < a.head_dim) vh_cuda_store(a.out, a.dtype, ob + d, acc[k]);
    }
}

/* ---- views ---------------------------------------------------------------------------- */

/* q, k or v (which 0, 1, 2) of qkv (or dqkv) as (B, H, tokens, head_dim), or
 * transposed (B, H, head_dim, tokens). */
static attn_mat qkv_part(const vh_attention_args *a, const void *p, int which, int transposed) {
    attn_mat m = {(void *)p, a->dtype, which * a->heads * a->head_dim, a->qkv_batch_stride,
                  a->head_dim, a->qkv_token_stride, 1};
    if (transposed) m.rs = 1, m.cs = a->qkv_token_stride;
    return m;
}

static attn_mat out_part(const vh_attention_args *a, const void *p) {
    attn_mat m = {(void *)p, a->dtype, 0, a->out_batch_stride, a->head_dim, a->out_token_stride,
                  1};
    return m;
}

/* A dense (B, H, N, N) tensor (probs, scores), or transposed. */
static attn_mat square(const vh_attention_args *a, const void *p, int32_t dtype,
                       int transposed) {
    const int64_t n = a->tokens;
    attn_mat m = {(void *)p, dtype, 0, a->heads * n * n, n * n, transposed ? 1 : n,
                  transposed ? n : 1};
    return m;
}

/* ---- arguments (the CPU's check(), plus the grid limits) ------------------------------- */

static vh_status check(vh_attention_args *a, const vh_attention_args *in, int backward) {
    /* As the CPU: a 1.0 caller's struct ends before the dtypes (f32 then). */
    if (!vh_cuda_read_args(a, sizeof *a, offsetof(vh_attention_args, dtype), in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cuda_is_float(a->dtype) || !vh_cuda_is_float(a->probs_dtype))
        return VH_STATUS_ERR_INVALID_ARG;
    if (a->batch < 0 || a->tokens < 0 || a->heads < 0 || a->head_dim < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    if (a->batch == 0 || a->tokens == 0 || a->heads == 0 || a->head_dim == 0)
        return VH_STATUS_OK;
    const int64_t dm = a->heads * a->head_dim;
    if (a->qkv_token_stride < 3 * dm || a->out_token_stride < dm || a->qkv_batch_stride < 0 ||
        a->out_batch_stride < 0)
        return VH_STATUS_ERR_INVALID_ARG;
    if (!a->qkv || !a->probs) return VH_STATUS_ERR_INVALID_ARG;
    if (backward ? (!a->dout || !a->dqkv) : !a->out) return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cuda_attn_grid_fits(a->batch, a->heads, a->tokens, a->head_dim))
        return VH_STATUS_ERR_UNSUPPORTED;
    return VH_STATUS_OK;
}

static int empty(const vh_attention_args *a) {
    return a->batch == 0 || a->tokens == 0 || a->heads == 0 || a->head_dim == 0;
}

/* ---- entry points ---------------------------------------------------------------------- */

/* The fused forward for head_dim <= VH_CUDA_ATTN_MAX_HEAD_DIM. */
static void forward_fused(const vh_attention_args *a, cudaStream_t s) {
    const dim3 grid((unsigned)(a->batch * a->heads), (unsigned)vh_cuda_attn_row_blocks(a->tokens));
    switch (vh_cuda_attn_fused_dim(a->head_dim)) {
    case 32: fused_forward_kernel<32><<<grid, VH_CUDA_THREADS, 0, s>>>(*a); break;
    case 64: fused_forward_kernel<64><<<grid, VH_CUDA_THREADS, 0, s>>>(*a); break;
    default: fused_forward_kernel<128><<<grid, VH_CUDA_THREADS, 0, s>>>(*a); break;
    }
}

/* The tiled forward: logits into fp32 (probs itself when probs is f32,
 * else scratch), softmax rows into probs, out = P V. */
static vh_status forward_tiled(vh_device *dev, const vh_attention_args *a, cudaStream_t s) {
    const int64_t B = a->batch, H = a->heads, N = a->tokens, Dh = a->head_dim, rows = B * H * N;
    float *logits = (float *)a->probs;
    if (a->probs_dtype != VH_DTYPE_F32) {
        const vh_status st = vh_cuda_alloc_temp(dev, (size_t)(rows * N) * sizeof(float),
                                                (void **)&logits);
        if (st != VH_STATUS_OK) return st;
    }
    const attn_mat q = qkv_part(a, a->qkv, 0, 0), kt = qkv_part(a, a->qkv, 1, 1);
    const attn_mat v = qkv_part(a, a->qkv, 2, 0), o = out_part(a, a->out);
    const attn_mat sm = square(a, logits, VH_DTYPE_F32, 0), pm = square(a, a->probs,
                                                                        a->probs_dtype, 0);
    bmm(B, H, N, N, Dh, a->scale, &q, &kt, &sm, 0, s);
    softmax_rows_kernel<<<vh_cuda_blocks(rows, 1, VH_CUDA_MAX_BLOCKS),
                          vh_cuda_attn_row_threads(N), 0, s>>>(logits, a->probs, a->probs_dtype,
                                                               NULL, 0, rows, N);
    bmm(B, H, N, Dh, N, 1.0f, &pm, &v, &o, 0, s);
    const vh_status st = vh_cuda_launched();
    if (logits != a->probs) vh_cuda_free_temp(dev, logits); /* stream-ordered */
    return st;
}

vh_status vh_cuda_attention_forward(vh_device *dev, const vh_attention_args *args) {
    vh_attention_args a;
    const vh_status st = check(&a, args, 0);
    if (st != VH_STATUS_OK || empty(&a)) return st;
    const cudaStream_t s = vh_cuda_stream(dev, a.stream);
    if (vh_cuda_attention_gemm_applies()) return vh_cuda_attention_forward_gemm(dev, &a, s);
    if (vh_cuda_attn_fused_dim(a.head_dim) == 0) return forward_tiled(dev, &a, s);
    forward_fused(&a, s);
    return vh_cuda_launched();
}

/* dS lives in fp32 scratch (B, H, N, N); each dqkv element is written by one
 * thread of one product (dq, dk, dv are disjoint), read, summed and rounded
 * once. */
vh_status vh_cuda_attention_backward(vh_device *dev, const vh_attention_args *args) {
    vh_attention_args a;
    vh_status st = check(&a, args, 1);
    if (st != VH_STATUS_OK || empty(&a)) return st;
    const cudaStream_t s = vh_cuda_stream(dev, a.stream);
    if (vh_cuda_attention_gemm_applies()) return vh_cuda_attention_backward_gemm(dev, &a, s);
    const int64_t B = a.batch, H = a.heads, N = a.tokens, Dh = a.head_dim, rows = B * H * N;
    float *ds = NULL;
    st = vh_cuda_alloc_temp(dev, (size_t)(rows * N) * sizeof(float), (void **)&ds);
    if (st != VH_STATUS_OK) return st;
    const attn_mat go = out_part(&a, a.dout), vt = qkv_part(&a, a.qkv, 2, 1);
    const attn_mat k = qkv_part(&a, a.qkv, 1, 0), q = qkv_part(&a, a.qkv, 0, 0);
    const attn_mat dq = qkv_part(&a, a.dqkv, 0, 0), dk = qkv_part(&a, a.dqkv, 1, 0);
    const attn_mat dv = qkv_part(&a, a.dqkv, 2, 0), pt = square(&a, a.probs, a.probs_dtype, 1);
    const attn_mat dsm = square(&a, ds, VH_DTYPE_F32, 0), dst = square(&a, ds, VH_DTYPE_F32, 1);
    bmm(B, H, N, Dh, N, 1.0f, &pt, &go, &dv, 1, s); /* dV += P^T dO */
    bmm(B, H, N, N, Dh, 1.0f, &go, &vt, &dsm, 0, s); /* dP = dO V^T */
    softmax_grad_rows_kernel<<<vh_cuda_blocks(rows, 1, VH_CUDA_MAX_BLOCKS),
                               vh_cuda_attn_row_threads(N), 0, s>>>(ds, a.probs, a.probs_dtype,
                                                                    ds, VH_DTYPE_F32, rows, N);
    bmm(B, H, N, Dh, N, a.scale, &dsm, &k, &dq, 1, s); /* dQ += scale dS K */
    bmm(B, H, N, Dh, N, a.scale, &dst, &q, &dk, 1, s); /* dK += scale dS^T Q */
    st = vh_cuda_launched();
    vh_cuda_free_temp(dev, ds); /* stream-ordered: after the kernels above */
    return st;
}
