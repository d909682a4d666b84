/* gemm.cu - vh_device_ops.gemm through cuBLASLt (vh_device.h has the
 * contract; sdk/src/cpu/gemm.c is the CPU twin the GPU tests compare with).
 *
 * Row-major by swapping: a row-major m x n C is the column-major n x m C^T,
 * and C^T = op(B)^T op(A)^T, so cuBLASLt multiplies B's buffer (as its "A")
 * by A's buffer (as its "B"), M = n, N = m, with each operand's own
 * transposition and leading dimension unchanged (llm.c and PyTorch do the
 * same).
 *
 * Numbers: every GEMM computes in CUBLAS_COMPUTE_32F. With f32 operands that
 * is exact fp32 (no TF32), so results match the CPU twin to fp32 rounding;
 * bf16 and f16 operands are multiplied with fp32 accumulation, as the table
 * promises. Alpha and beta are fp32 host values.
 *
 * Routes:
 * 1. direct: no GELU. One cuBLASLt matmul writes C: D = alpha A B + beta' C'
 *    (+ bias through CUBLASLT_EPILOGUE_BIAS when the bias has C's dtype,
 *    the only bias type cuBLASLt takes with a non-fp8 D). A residual rides
 *    as cuBLASLt's C matrix: C' = residual, beta' = 1 (beta 0), or
 *    beta' = 1 + beta when the residual is C itself.
 * 2. split: everything else (GELU, a residual beside a nonzero beta, a bias
 *    of another dtype, k = 0 or alpha = 0 where A and B are not read, or a
 *    route-1 shape cuBLASLt refuses). T = alpha A B in fp32 (into aux when
 *    aux is f32, else a temporary), then one kernel computes
 *    C = epilogue(T + bias) + residual + beta C and stores aux = T + bias.
 *    cuBLASLt's own GELU epilogues are the tanh approximation; the table's
 *    GELU is erf GELU (timm's nn.GELU), so the kernel evaluates the same
 *    erf formula as sdk/src/cpu/activations.c and never cuBLASLt's.
 *    ABI 2.5's epilogues take this route too: GELU_GRAD stores gelu'(T + bias)
 *    in aux instead of T + bias, MUL_AUX multiplies T + bias by aux (read).
 *    (cuBLASLt's DGELU epilogues differentiate the tanh GELU, so they cannot
 *    stand in for MUL_AUX either.)
 * cuBLASLt failures become VH_STATUS_ERR_UNSUPPORTED (no algorithm for the
 * shape and types) or VH_STATUS_ERR_DEVICE: never a silently wrong result.
 *
 * Plans (the matmul descriptor, the four layouts and the heuristic's
 * algorithm) are cached per shape key (shape_cache.h): the shapes of a step
 * repeat. The key holds each pointer's alignment, as the heuristic chooses
 * kernels for it (a plan for 256-aligned operands may fault on an offset
 * view, PyTorch #98975). Each stream gets its own 32 MiB workspace (a shared
 * one would race between streams), and the heuristic always sees 32 MiB so
 * the chosen algorithm does not vary with free memory.
 */
#include <pthread.h>
#include <stdlib.h>

#include <cublasLt.h>

#include "cuda_internal.h"
#include "gelu.cuh"

extern "C" {
#include "shape_cache.h"
}

#define GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
#define GEMM_MAX_STREAMS 16

struct vh_cuda_gemm_state {
    cublasLtHandle_t lt;
    vh_cuda_shape_cache *plans;
    pthread_mutex_t mu; /* plans' bias pointers and the workspaces */
    cudaStream_t ws_stream[GEMM_MAX_STREAMS];
    void *ws[GEMM_MAX_STREAMS];
};

/* One cuBLASLt call's shape; zeroed before it is filled (compared as bytes). */
typedef struct plan_key {
    int32_t ab_type, d_type; /* cudaDataType */
    int32_t trans_a, trans_b, bias_epilogue;
    int32_t align_a, align_b, align_c, align_d, align_bias;
    int64_t m, n, k, lda, ldb, ldd, batch, stride_a, stride_b, stride_d;
} plan_key;

typedef struct plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d; /* cuBLASLt's A (our B), B (our A), C = D */
    cublasLtMatmulAlgo_t algo;
    int refused; /* cuBLASLt has no algorithm for the key: remembered, not retried */
} plan;

static pthread_mutex_t g_state_mutex = PTHREAD_MUTEX_INITIALIZER;

static vh_status lt_status(cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return VH_STATUS_OK;
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)
        return VH_STATUS_ERR_UNSUPPORTED;
    if (s == CUBLAS_STATUS_ALLOC_FAILED) return VH_STATUS_ERR_NOMEM;
    return VH_STATUS_ERR_DEVICE;
}

static cudaDataType_t cuda_type(int32_t dtype) {
    return dtype == VH_DTYPE_BF16 ? CUDA_R_16BF : dtype == VH_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The largest power of two (<= 256) dividing the address. */
static int32_t alignment(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    int32_t al = 1;
    while (al < 256 && a % (uintptr_t)(2 * al) == 0) al *= 2;
    return al;
}

static void plan_destroy(void *value, void *ctx) {
    (void)ctx;
    plan *p = (plan *)value;
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    free(p);
}

void vh_cuda_gemm_state_free(vh_cuda_gemm_state *s) {
    if (!s) return;
    vh_cuda_shape_cache_free(s->plans);
    for (int i = 0; i < GEMM_MAX_STREAMS; i++)
        if (s->ws[i]) cudaFree(s->ws[i]);
    if (s->lt) cublasLtDestroy(s->lt);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The device's state, made by its first GEMM. */
static vh_status gemm_state(vh_device *dev, vh_cuda_gemm_state **out) {
    pthread_mutex_lock(&g_state_mutex);
    vh_status st = VH_STATUS_OK;
    if (!dev->gemm) {
        vh_cuda_gemm_state *s = (vh_cuda_gemm_state *)calloc(1, sizeof *s);
        if (!s || pthread_mutex_init(&s->mu, NULL) != 0) {
            free(s);
            st = VH_STATUS_ERR_NOMEM;
        } else if ((st = lt_status(cublasLtCreate(&s->lt))) == VH_STATUS_OK &&
                   !(s->plans = vh_cuda_shape_cache_create(sizeof(plan_key), plan_destroy, NULL))) {
            st = VH_STATUS_ERR_NOMEM;
        }
        if (st == VH_STATUS_OK) dev->gemm = s;
        else if (s) vh_cuda_gemm_state_free(s);
        if (st == VH_STATUS_ERR_UNSUPPORTED) st = VH_STATUS_ERR_DEVICE; /* no handle */
    }
    *out = dev->gemm;
    pthread_mutex_unlock(&g_state_mutex);
    return st;
}

/* The stream's workspace (under s->mu); NULL when out of slots or memory. */
static void *stream_workspace(vh_cuda_gemm_state *s, cudaStream_t stream) {
    for (int i = 0; i < GEMM_MAX_STREAMS; i++) {
        if (s->ws[i] && s->ws_stream[i] == stream) return s->ws[i];
        if (!s->ws[i]) {
            if (cudaMalloc(&s->ws[i], GEMM_WORKSPACE_BYTES) != cudaSuccess) {
                cudaGetLastError();
                s->ws[i] = NULL;
                return NULL;
            }
            s->ws_stream[i] = stream;
            return s->ws[i];
        }
    }
    return NULL;
}

/* A column-major layout of rows x cols, batched when batch > 1. */
static cublasStatus_t make_layout(cublasLtMatrixLayout_t *l, int32_t type, int64_t rows,
                                  int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, (cudaDataType_t)type, (uint64_t)rows,
                                                  (uint64_t)cols, ld);
    if (s != CUBLAS_STATUS_SUCCESS || batch <= 1) return s;
    const int32_t count = (int32_t)batch;
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                         sizeof count);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &stride, sizeof stride);
    return s;
}

/* The heuristic's best algorithm for the plan, for these alignments, with
 * the full workspace. */
static cublasStatus_t choose_algo(cublasLtHandle_t lt, const plan_key *k, plan *p) {
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
    const uint64_t ws = GEMM_WORKSPACE_BYTES;
    const uint32_t al[4] = {(uint32_t)k->align_b, (uint32_t)k->align_a, (uint32_t)k->align_c,
                            (uint32_t)k->align_d}; /* cuBLASLt's A is our B */
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws);
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &r, &found);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && (found < 1 || r.state != CUBLAS_STATUS_SUCCESS))
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS) p->algo = r.algo;
    return s;
}

/* A new plan for key k; bias: a pointer of the bias's alignment (the
 * heuristic reads it), set again before every matmul. */
static vh_status make_plan(cublasLtHandle_t lt, const plan_key *k, const void *bias, plan **out) {
    plan *p = (plan *)calloc(1, sizeof *p);
    if (!p) return VH_STATUS_ERR_NOMEM;
    const cublasOperation_t ta = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A = B */
    const cublasOperation_t tb = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = k->bias_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (s == CUBLAS_STATUS_SUCCESS && k->bias_epilogue)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof bias);
    /* Stored shapes: B is k x n row-major (n x k column-major), or n x k
     * when transposed; likewise A. */
    if (s == CUBLAS_STATUS_SUCCESS)
        s = make_layout(&p->a, k->ab_type, k->trans_b ? k->k : k->n, k->trans_b ? k->n : k->k,
                        k->ldb, k->batch, k->stride_b);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = make_layout(&p->b, k->ab_type, k->trans_a ? k->m : k->k, k->trans_a ? k->k : k->m,
                        k->lda, k->batch, k->stride_a);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = make_layout(&p->d, k->d_type, k->n, k->m, k->ldd, k->batch, k->stride_d);
    if (s == CUBLAS_STATUS_SUCCESS) s = choose_algo(lt, k, p);
    if (s != CUBLAS_STATUS_SUCCESS) {
        plan_destroy(p, NULL);
        return lt_status(s);
    }
    *out = p;
    return VH_STATUS_OK;
}

/* One matmul: D = alpha op(A) op(B) (+ bias) + beta C (row-major terms),
 * C and D of the same layout (ldd, stride_d) and type d_dtype. */
typedef struct matmul_call {
    const vh_gemm_args *g;
    int64_t batch;
    const void *cmat; /* cuBLASLt's C (read when beta != 0) */
    void *d;
    int32_t d_dtype;
    int64_t ldd, stride_d;
    float alpha, beta;
    const void *bias; /* with bias_epilogue: of d_dtype */
} matmul_call;

static vh_status run_matmul(vh_cuda_gemm_state *st, cudaStream_t stream, const matmul_call *c) {
    const vh_gemm_args *g = c->g;
    if (c->batch > INT32_MAX) return VH_STATUS_ERR_UNSUPPORTED;
    plan_key k;
    memset(&k, 0, sizeof k);
    k.ab_type = cuda_type(g->ab_dtype), k.d_type = cuda_type(c->d_dtype);
    k.trans_a = g->trans_a != 0, k.trans_b = g->trans_b != 0, k.bias_epilogue = c->bias != NULL;
    k.align_a = alignment(g->a), k.align_b = alignment(g->b);
    k.align_c = alignment(c->cmat), k.align_d = alignment(c->d);
    k.align_bias = c->bias ? alignment(c->bias) : 0;
    k.m = g->m, k.n = g->n, k.k = g->k, k.lda = g->lda, k.ldb = g->ldb, k.ldd = c->ldd;
    k.batch = c->batch;
    if (c->batch > 1) k.stride_a = g->stride_a, k.stride_b = g->stride_b, k.stride_d = c->stride_d;
    vh_status s = VH_STATUS_OK;
    pthread_mutex_lock(&st->mu);
    plan *p = (plan *)vh_cuda_shape_cache_get(st->plans, &k);
    if (!p) {
        s = make_plan(st->lt, &k, c->bias, &p);
        if (s == VH_STATUS_ERR_UNSUPPORTED && (p = (plan *)calloc(1, sizeof *p)) != NULL)
            p->refused = 1;
        if (p && !(p = (plan *)vh_cuda_shape_cache_put(st->plans, &k, p))) s = VH_STATUS_ERR_NOMEM;
    }
    if (s == VH_STATUS_OK && p->refused) s = VH_STATUS_ERR_UNSUPPORTED;
    void *ws = s == VH_STATUS_OK ? stream_workspace(st, stream) : NULL;
    if (s == VH_STATUS_OK && !ws) s = VH_STATUS_ERR_NOMEM;
    if (s == VH_STATUS_OK && c->bias)
        s = lt_status(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &c->bias, sizeof c->bias));
    if (s == VH_STATUS_OK) {
        const cublasStatus_t r = cublasLtMatmul(st->lt, p->op, &c->alpha, g->b, p->a, g->a, p->b,
                                                &c->beta, c->cmat, p->d, c->d, p->d, &p->algo, ws,
                                                GEMM_WORKSPACE_BYTES, stream);
        /* The plan's own algorithm refused at run time is a device fault, not
         * an unsupported shape: the heuristic accepted it. */
        s = r == CUBLAS_STATUS_SUCCESS ? VH_STATUS_OK
            : r == CUBLAS_STATUS_NOT_SUPPORTED ? VH_STATUS_ERR_UNSUPPORTED
                                              : VH_STATUS_ERR_DEVICE;
    }
    pthread_mutex_unlock(&st->mu);
    return s;
}

/* ---- the split route's epilogue ------------------------------------------------ */

typedef struct finish_args {
    int64_t batch, m, n;
    const float *t;       /* alpha A B in fp32, or NULL (k = 0 or alpha = 0: zeros) */
    int64_t t_ld, t_stride;
    const void *bias;     /* n values, or NULL */
    int32_t bias_dtype, c_dtype, epilogue; /* vh_epilogue */
    void *aux; /* GELU: receives T + bias, GELU_GRAD: its gelu', MUL_AUX: read (c_dtype,
                * C's layout), or NULL */
    const void *residual; /* C's layout and dtype, or NULL; may be C */
    void *c;
    int64_t ldc, stride_c;
    float beta;
} finish_args;

/* C = epilogue(T + bias) + residual + beta C. Mapping: the batch * m output
 * rows loop over the blocks (grid-stride), the threads of a block stride
 * along the row's n columns: consecutive threads touch consecutive columns
 * (coalesced), and no element pays a 64-bit division for its coordinates
 * (three per element made this kernel instruction-bound: fc1 of ViT-B/16
 * took 0.8 ms where its GEMM alone takes 0.2). Each element's residual and
 * old C are read before its store: the residual may be C itself. */
__global__ static void finish_kernel(finish_args a) {
    const int64_t rows = a.batch * a.m;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t q = row / a.m, r = row - q * a.m, c0 = q * a.stride_c + r * a.ldc;
        const float *t = a.t ? a.t + q * a.t_stride + r * a.t_ld : NULL;
        for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
            const int64_t ci = c0 + j;
            float v = t ? t[j] : 0.0f;
            if (a.bias) v += vh_cuda_load(a.bias, a.bias_dtype, j);
            if (a.epilogue == VH_EPILOGUE_MUL_AUX) {
                v *= vh_cuda_load(a.aux, a.c_dtype, ci);
            } else if (a.epilogue != VH_EPILOGUE_NONE) { /* erf GELU, the CPU's formula */
                if (a.aux)
                    vh_cuda_store(a.aux, a.c_dtype, ci,
                                  a.epilogue == VH_EPILOGUE_GELU_GRAD ? vh_cuda_gelu_grad(v) : v);
                v = vh_cuda_gelu(v);
            }
            if (a.residual) v += vh_cuda_load(a.residual, a.c_dtype, ci);
            if (a.beta != 0.0f) v += a.beta * vh_cuda_load(a.c, a.c_dtype, ci);
            vh_cuda_store(a.c, a.c_dtype, ci, v);
        }
    }
}

/* Route 2 (see the top of the file). */
static vh_status run_split(vh_device *dev, vh_cuda_gemm_state *st, cudaStream_t stream,
                           const vh_gemm_args *g, int64_t batch) {
    const int multiply = g->k > 0 && g->alpha != 0.0f;
    const int gelu = g->epilogue == VH_EPILOGUE_GELU || g->epilogue == VH_EPILOGUE_GELU_GRAD;
    /* An f32 aux can hold T itself (no bias yet: the kernel adds it in place,
     * each element read before its gelu' overwrites it). */
    const int t_is_aux = multiply && gelu && g->aux && g->c_dtype == VH_DTYPE_F32;
    void *tmp = NULL;
    vh_status s = VH_STATUS_OK;
    finish_args f = {batch, g->m, g->n, NULL, g->n, g->m * g->n, g->bias, g->bias_dtype,
                     g->c_dtype, g->epilogue, g->aux, g->residual, g->c, g->ldc,
                     g->stride_c, g->beta};
    if (multiply) {
        matmul_call mc = {g, batch, NULL, NULL, VH_DTYPE_F32, g->n, g->m * g->n, g->alpha, 0.0f,
                          NULL};
        if (t_is_aux) {
            mc.d = g->aux, mc.ldd = g->ldc, mc.stride_d = g->stride_c;
        } else {
            s = vh_cuda_alloc_temp_on(dev, stream, (size_t)(batch * g->m * g->n) * sizeof(float),
                                      &tmp);
            if (s != VH_STATUS_OK) return s;
            mc.d = tmp;
        }
        mc.cmat = mc.d;
        s = run_matmul(st, stream, &mc);
        f.t = (const float *)mc.d, f.t_ld = mc.ldd, f.t_stride = mc.stride_d;
    }
    if (s == VH_STATUS_OK) {
        finish_kernel<<<vh_cuda_blocks(batch * g->m, 1, VH_CUDA_MAX_BLOCKS), VH_CUDA_THREADS, 0,
                        stream>>>(f);
        s = vh_cuda_launched();
    }
    vh_cuda_free_temp(dev, tmp); /* stream-ordered: reused only by later work */
    return s;
}

/* Route 1; VH_STATUS_ERR_UNSUPPORTED when it does not apply or cuBLASLt has
 * no algorithm for it (then route 2 runs). */
static vh_status run_direct(vh_cuda_gemm_state *st, cudaStream_t stream, const vh_gemm_args *g,
                            int64_t batch) {
    if (g->epilogue != VH_EPILOGUE_NONE || g->k == 0 || g->alpha == 0.0f)
        return VH_STATUS_ERR_UNSUPPORTED;
    if (g->bias && g->bias_dtype != g->c_dtype) return VH_STATUS_ERR_UNSUPPORTED;
    const int res_is_c = g->residual && g->residual == g->c;
    if (g->residual && !res_is_c && g->beta != 0.0f) return VH_STATUS_ERR_UNSUPPORTED;
    matmul_call mc = {g, batch, g->c, g->c, g->c_dtype, g->ldc, g->stride_c, g->alpha, g->beta,
                      g->bias};
    if (res_is_c) mc.beta = 1.0f + g->beta;
    else if (g->residual) mc.cmat = g->residual, mc.beta = 1.0f;
    return run_matmul(st, stream, &mc);
}

vh_status vh_cuda_gemm(vh_device *dev, const vh_gemm_args *in) {
    vh_gemm_args g;
    /* As the CPU twin: 1.0 callers end at bias (everything after reads as
     * zero), and the same argument checks in the same order. */
    if (!in || in->struct_size < offsetof(vh_gemm_args, ab_dtype) ||
        !vh_struct_upgrade(&g, sizeof g, in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cuda_is_float(g.ab_dtype) || !vh_cuda_is_float(g.c_dtype) ||
        !vh_cuda_is_float(g.bias_dtype) || (unsigned)g.epilogue > VH_EPILOGUE_MUL_AUX)
        return VH_STATUS_ERR_INVALID_ARG;
    if (g.epilogue == VH_EPILOGUE_MUL_AUX && (!g.aux || g.aux == g.c))
        return VH_STATUS_ERR_INVALID_ARG;
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) return VH_STATUS_ERR_INVALID_ARG;
    if (g.stride_a < 0 || g.stride_b < 0 || g.stride_c < 0) return VH_STATUS_ERR_INVALID_ARG;
    const int64_t batch = g.batch > 1 ? g.batch : 1;
    if (g.m == 0 || g.n == 0) return VH_STATUS_OK;
    const int64_t a_cols = g.trans_a ? g.m : g.k, b_cols = g.trans_b ? g.k : g.n;
    if (g.lda < (a_cols > 1 ? a_cols : 1) || g.ldb < (b_cols > 1 ? b_cols : 1) ||
        g.ldc < (g.n > 1 ? g.n : 1))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!g.c || (g.k > 0 && (!g.a || !g.b))) return VH_STATUS_ERR_INVALID_ARG;
    if (batch > 1 && g.stride_c == 0) return VH_STATUS_ERR_INVALID_ARG; /* C[i] would alias */
    if (g.epilogue == VH_EPILOGUE_NONE) g.aux = NULL;
    vh_cuda_gemm_state *st = NULL;
    cudaSetDevice(dev->ordinal);
    vh_status s = gemm_state(dev, &st);
    if (s != VH_STATUS_OK) return s;
    const cudaStream_t stream = vh_cuda_stream(dev, g.stream);
    s = run_direct(st, stream, &g, batch);
    if (s != VH_STATUS_ERR_UNSUPPORTED) return s;
    return run_split(dev, st, stream, &g, batch);
}
