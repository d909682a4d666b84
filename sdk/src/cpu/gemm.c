/* gemm.c - the CPU device's GEMM (vh_device.h): oneDNN matmul with its
 * epilogue (bias, GELU, residual, beta) fused as post-ops where it can be.
 *
 * Why oneDNN and no BLAS. Measured on this project's machines: AMD EPYC Zen 3
 * (family 25 model 1; AVX2 + FMA, no AVX-512, no bf16 hardware; oneDNN
 * picks gemm:jit avx2), 2 threads, fp32 unless said, GFLOP/s, best of 12
 * alternating 0.1 s runs per library (the machines are shared: best-of keeps
 * other jobs' interference out). OpenBLAS 0.3.21, OpenMP build, with the
 * machines' OPENBLAS_CORETYPE=Haswell; batched shapes as the 1.0 engine ran
 * them (one sgemm per member in an OpenMP loop). oneDNN 2.6 matmul from
 * Debian. "gemm" is this file's op (the device call, cache and all) on f32
 * and on bf16 operands (converted to f32 here). Shapes m x n x k of the ViT:
 *
 *   shape                                OpenBLAS  oneDNN  gemm f32  gemm bf16
 *   2048^3                                  172      163       -         -
 *   1576x1536x384, B^T (T3 fc1)             144      167     161       163
 *   6400x256x64, B^T (T1 fc1)                95      134     148       146
 *   6400x64x256 (T1 fc2, dX)                100      137     126       121
 *   6400x64x256, A^T                         85      123     121       103
 *   256x64x6400, A^T (T1 dW)                 78      122     124        99
 *   64x256x6400, A^T (T1 dW)                 95      112       -         -
 *   384x1152x1576, A^T (T3 dW)              141      150       -         -
 *   512 x 50x50x16, B^T (attention QK^T)     45       44      51        42
 *   512 x 50x16x50 (attention PV)            66       90      76        76
 *   72 x 197x197x64, B^T (T3 QK^T)          102      128       -         -
 *
 * oneDNN is faster on every ViT shape but QK^T of T1, a tie (and single
 * runs, with 1 thread or without best-of, agreed), so it is the only engine;
 * on Zen 5 (AVX-512) MACHINE-NOTES.md has it at about 2x OpenBLAS. bf16 on
 * this CPU: oneDNN 2.6 refuses a bf16 matmul below avx512_core (at primitive
 * creation), so bf16 operands are converted to f32 (exact) and multiplied in
 * f32: the same products, accumulated in fp32, that bf16 hardware gives.
 * Where the ISA has avx512_bf16 they may go to oneDNN as they are: per shape
 * class, whichever of the two is faster on this CPU (gemm_choice.c; forced
 * by VITHOST_CPU_GEMM16). f16 is always converted (oneDNN 2.6 has no f16
 * matmul for CPUs).
 *
 * Routes, in order:
 * 0. k in halves: a small C from a long k, no epilogue (weight gradients
 *    of small layers): two products side by side, summed (run_ksplit).
 *    Then, for bf16 operands on the native kernels and a bf16 C, oneDNN
 *    writes C itself, its residual and beta read in the epilogue
 *    (run_direct16); AMP's fc1 (bf16 GELU and pre-activation, dense) on the
 *    native kernels, and fp32's fc1 (GELU with aux, GELU_GRAD) and fc2 data
 *    gradient (T * aux) where B fits in L2, run in bands of rows, a thread
 *    each, each band's pass while its T is in L2 (run_bands); otherwise C
 *    is f32 or an f32 copy:
 * 1. fused: one oneDNN matmul: output scale alpha, bias (DNNL_ARG_BIAS,
 *    only with alpha == 1: oneDNN 2.x scales after the bias), then post-ops
 *    erf GELU and sum. A residual goes in through the sum: C is first set to
 *    residual + beta C (a residual that is C itself needs nothing), and the
 *    sum adds it after the GELU; an unbatched residual with beta 0 is added
 *    by a pass right after the matmul instead (run_fused says why).
 *    f32 or native-bf16 operands; a non-f32 C goes through a dense fp32
 *    copy, rounded once at the store.
 * 2. split: when the pre-activation is asked for (GELU with aux), oneDNN
 *    refuses the fused form, alpha != 1 with a bias, or k = 0 / alpha = 0
 *    (BLAS semantics: A and B not read): T = alpha A B + bias by a plain
 *    matmul into aux or scratch, then C = gelu(T) + residual + beta C in one
 *    pass with our GELU, the one gelu_forward uses (so a model's recomputed
 *    GELU matches its forward bit for bit; oneDNN's gelu_erf in route 1
 *    differs from it by about an ulp).
 * ABI 2.5's epilogues: VH_EPILOGUE_MUL_AUX (C = T * aux) is a binary-mul
 * post-op of route 1 where C and aux are f32 and unbatched (and not in
 * bands), else route 2's pass; VH_EPILOGUE_GELU_GRAD takes route 2 (or the
 * bands) as GELU with aux does, its pass writing gelu'(T) over T.
 * ABI 2.7's VH_EPILOGUE_GELU_BACKWARD (C = gelu'(aux) * T as C stores it:
 * AMP's fc2 data gradient) takes the bands where C is bf16 and dense, each
 * band's pass from the thread's own fp32 T (gelu_grad16.c), else route 2's
 * rows; never route 1 (no oneDNN post-op computes it).
 * A plain matmul oneDNN refuses (odd strides) is retried on dense copies, and
 * only then done by a plain loop (never seen on the ViT's shapes).
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_cpu_engine.h"

#include "cpu_ops.h"
#include "dnnl_engine.h"

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

/* A matrix operand as oneDNN reads it: batch stride, row stride, column
 * stride of op(X), in elements. A's kernel (vh_dnnl_kernel) is the
 * product's: the one gemm_choice.c picked for these 16-bit operands. */
typedef struct operand {
    const void *p;
    vh_dtype dtype;
    int trans;
    int64_t sbatch, srow, scol;
    int kernel;
} operand;

static operand operand_of(const void *p, vh_dtype t, int trans, int64_t ld, int64_t stride) {
    operand o = {p, t, trans, stride, trans ? 1 : ld, trans ? ld : 1, VH_DNNL_KERNEL_DEFAULT};
    return o;
}

/* Dense fp32 copy of op(X) (batch x rows x cols of the operand as stored),
 * with the same transposition. */
static vh_status densify(operand *o, int64_t batch, int64_t rows, int64_t cols) {
    /* stored rows/cols: a transposed operand is stored cols x rows */
    const int trans = o->trans;
    const int64_t sr = trans ? cols : rows, sc = trans ? rows : cols;
    const int64_t ld = trans ? o->scol : o->srow;
    const int64_t nb = o->sbatch == 0 ? 1 : batch;
    float *d = vh_cpu_scratch_alloc((size_t)(nb * sr * sc) * sizeof(float));
    if (!d) return VH_STATUS_ERR_NOMEM;
    const size_t es = vh_dtype_size(o->dtype);
#pragma omp parallel for schedule(static) if (nb * sr * sc > VH_CPU_PAR_ELEMS)
    for (int64_t i = 0; i < nb * sr; i++) {
        const int64_t b = i / sr, r = i % sr;
        const char *src = (const char *)o->p + (size_t)(b * o->sbatch + r * ld) * es;
        vh_cpu_to_f32_serial(d + i * sc, src, o->dtype, sc);
    }
    o->p = d;
    o->dtype = VH_DTYPE_F32;
    o->kernel = VH_DNNL_KERNEL_DEFAULT;
    o->sbatch = o->sbatch == 0 ? 0 : sr * sc;
    o->srow = trans ? 1 : sc;
    o->scol = trans ? sc : 1;
    return VH_STATUS_OK;
}

/* (batch, m, n) blocks between a strided tensor and a dense fp32 buffer. */
static void block_to_f32(float *d, const void *p, vh_dtype t, int64_t batch, int64_t sbatch,
                         int64_t m, int64_t ld, int64_t n) {
    const size_t es = vh_dtype_size(t);
#pragma omp parallel for schedule(static) if (batch * m * n > VH_CPU_PAR_ELEMS)
    for (int64_t i = 0; i < batch * m; i++) {
        const int64_t b = i / m, r = i % m;
        vh_cpu_to_f32_serial(d + i * n, (const char *)p + (size_t)(b * sbatch + r * ld) * es, t, n);
    }
}

static void block_from_f32(void *p, vh_dtype t, const float *d, int64_t batch, int64_t sbatch,
                           int64_t m, int64_t ld, int64_t n) {
    const size_t es = vh_dtype_size(t);
#pragma omp parallel for schedule(static) if (batch * m * n > VH_CPU_PAR_ELEMS)
    for (int64_t i = 0; i < batch * m; i++) {
        const int64_t b = i / m, r = i % m;
        vh_cpu_from_f32_serial((char *)p + (size_t)(b * sbatch + r * ld) * es, t, d + i * n, n);
    }
}

/* ---- the matmul itself ------------------------------------------------------ */

typedef struct out_view {
    float *p; /* fp32 */
    int64_t sbatch, ld;
} out_view;

static int pack_b_off(void) {
    const char *env = getenv("VITHOST_CPU_PACK_B"); /* each call: tests and ab_calls flip it */
    return env && strcmp(env, "0") == 0;
}

/* Rows from which one unbatched call packs B itself (matmul_run), where
 * they are at least B's k too: a weight gradient (m 192-1536 against k
 * 1576-6400 tokens) has a large B that brgemm copies few times, and a pass
 * over it first made T2's slower (768x192x4160: 12.2-12.4 -> 16.5-17.5 ms
 * a step in bf16, f32 45.3-45.8 -> 48.3-54.7). */
#define PACK_MIN_ROWS 256

static _Atomic uint64_t g_single_calls, g_single_packed;

/* B of description mm (plain, unbatched) written into the caller's scratch
 * in the layout its kernel reads; *layout: that layout's fingerprint, for
 * mm's b_layout. NULL where the kernel reads B as it is (or no memory). */
static const void *pack_described(const vh_dnnl_matmul *mm, const void *b, uint64_t *layout) {
    *layout = 0;
    const size_t bytes = vh_dnnl_matmul_packed_b_bytes(mm);
    void *packed = bytes ? vh_cpu_scratch_alloc(bytes) : NULL;
    if (!packed || vh_dnnl_matmul_pack_b(mm, b, packed, layout) != VH_STATUS_OK) {
        *layout = 0;
        return NULL;
    }
    return packed;
}

/* One matmul. With many rows and no batch, B goes first into the blocks its
 * kernel reads (vh_dnnl_matmul_pack_b, once for the call): oneDNN's brgemm
 * would copy a plain B into them for each chunk of rows it runs. On the
 * Xeon with AMX, 2 threads, `ab_calls --b-env VITHOST_CPU_PACK_B=0`
 * (operands flushed, 30 pairs, three sets), a linear layer's forward,
 * unpacked / packed: bf16 T2 qkv 4160x576x192 1.20-1.25, fc2 4160x192x768
 * 0.95-1.19, proj 1.10, T3 qkv 1576x1152x384 0.99-1.04, fc2 1576x384x1536
 * 1.03-1.19; f32 1.00-1.09; T1's (k 64) 0.99-1.11. In the step (`vithost
 * bench --ops`, per shape), AMP's plain data gradients: T2's 4160x192x768
 * 10.2 -> 7.3 ms, T3's 1576x384x1536 15.3 -> 11.8. The same kernel on the
 * same blocks: the same sums (test_gemm16), but for 16-bit operands with k
 * of 1024 or more, where brgemm given B plain sums k in other chunks (both
 * in fp32; the last bits differ). */
static vh_status matmul_run(const vh_dnnl_matmul *mm, const void *a, const void *b,
                            const float *bias, const void *aux, const void *residual, void *c) {
    /* f32 B read in rows (sb[1], the column stride, 1) is left plain: packed
     * first, T2's data gradients ran 1-7% slower in the step (3 pairs) */
    const int b_rows_f32 = mm->ab_dtype == VH_DTYPE_F32 && mm->sb[1] == 1;
    if (mm->batch_dims == 0 && mm->b_layout == 0 && mm->m >= PACK_MIN_ROWS && mm->m >= mm->k &&
        !b_rows_f32 && !pack_b_off()) {
        g_single_calls++;
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        vh_dnnl_matmul p = *mm;
        const void *packed = pack_described(mm, b, &p.b_layout);
        vh_status st = VH_STATUS_ERR_UNSUPPORTED;
        if (packed) {
            st = vh_dnnl_matmul_run_binary(&p, a, packed, bias, aux, residual, c);
            if (st != VH_STATUS_ERR_UNSUPPORTED) g_single_packed++;
        }
        vh_cpu_scratch_end(mark);
        if (st != VH_STATUS_ERR_UNSUPPORTED) return st;
    }
    return vh_dnnl_matmul_run_binary(mm, a, b, bias, aux, residual, c);
}

static void describe(vh_dnnl_matmul *mm, const vh_gemm_args *g, int64_t batch,
                     const operand *a, const operand *b, const out_view *c) {
    vh_dnnl_matmul_init(mm);
    mm->m = g->m, mm->n = g->n, mm->k = g->k;
    int d = 0;
    if (batch > 1) {
        mm->batch_dims = 1;
        mm->batch[0] = batch;
        mm->sa[0] = a->sbatch, mm->sb[0] = b->sbatch, mm->sc[0] = c->sbatch;
        d = 1;
    }
    mm->sa[d] = a->srow, mm->sa[d + 1] = a->scol;
    mm->sb[d] = b->srow, mm->sb[d + 1] = b->scol;
    mm->sc[d] = c->ld, mm->sc[d + 1] = 1;
    mm->ab_dtype = a->dtype;
    mm->c_dtype = VH_DTYPE_F32;
    mm->alpha = g->alpha;
    mm->kernel = a->kernel;
}

/* The last resort: a loop, fp32 accumulation (operands already f32). */
static void naive(const vh_gemm_args *g, int64_t batch, const operand *a, const operand *b,
                  const float *bias, const out_view *t) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batch * g->m; i++) {
        const int64_t q = i / g->m, r = i % g->m;
        const float *pa = (const float *)a->p + q * a->sbatch + r * a->srow;
        const float *pb = (const float *)b->p + q * b->sbatch;
        float *row = t->p + q * t->sbatch + r * t->ld;
        for (int64_t j = 0; j < g->n; j++) {
            float s = 0.0f;
            for (int64_t l = 0; l < g->k; l++) s += pa[l * a->scol] * pb[l * b->srow + j * b->scol];
            row[j] = g->alpha * s + (bias ? bias[j] : 0.0f);
        }
    }
}

/* T += bias, every row. */
static void add_bias(const vh_gemm_args *g, int64_t batch, const float *bias, const out_view *t) {
#pragma omp parallel for schedule(static) if (batch * g->m * g->n > VH_CPU_PAR_ELEMS)
    for (int64_t i = 0; i < batch * g->m; i++) {
        float *row = t->p + (i / g->m) * t->sbatch + (i % g->m) * t->ld;
#pragma omp simd
        for (int64_t j = 0; j < g->n; j++) row[j] += bias[j];
    }
}

/* T = alpha A B + bias into t (fp32). oneDNN 2.x applies its output scale
 * after the bias, alpha (A B + bias), so with alpha != 1 the bias is added
 * here instead. */
static vh_status plain(const vh_gemm_args *g, int64_t batch, operand a, operand b,
                       const float *bias, const out_view *t) {
    const int fused_bias = bias && g->alpha == 1.0f;
    vh_dnnl_matmul mm;
    describe(&mm, g, batch, &a, &b, t);
    mm.has_bias = fused_bias;
    vh_status st = matmul_run(&mm, a.p, b.p, bias, NULL, NULL, t->p);
    if (st == VH_STATUS_ERR_UNSUPPORTED) {
        /* Dense copies in fp32, which oneDNN always takes. */
        if ((st = densify(&a, batch, g->m, g->k)) != VH_STATUS_OK ||
            (st = densify(&b, batch, g->k, g->n)) != VH_STATUS_OK)
            return st;
        describe(&mm, g, batch, &a, &b, t);
        mm.has_bias = fused_bias;
        st = vh_dnnl_matmul_run(&mm, a.p, b.p, bias, t->p);
    }
    if (st == VH_STATUS_ERR_UNSUPPORTED) {
        naive(g, batch, &a, &b, fused_bias ? bias : NULL, t);
        st = VH_STATUS_OK;
    }
    if (st == VH_STATUS_OK && bias && !fused_bias) add_bias(g, batch, bias, t);
    return st;
}

/* c = r + beta c, row by row: the fused route's residual, into C before the
 * sum post-op adds it (beta: the call's), or added to C after the matmul
 * (beta 1: c + r, the bits of oneDNN's binary-add post-op). */
static void add_residual(const vh_gemm_args *g, int64_t batch, const out_view *c,
                         const out_view *r, float beta) {
    const int64_t n = g->n;
#pragma omp parallel for schedule(static) if (batch * g->m * n > VH_CPU_PAR_ELEMS)
    for (int64_t i = 0; i < batch * g->m; i++) {
        const int64_t q = i / g->m, row = i % g->m;
        float *ci = c->p + q * c->sbatch + row * c->ld;
        const float *ri = r->p + q * r->sbatch + row * r->ld;
        if (beta != 0.0f) {
#pragma omp simd
            for (int64_t j = 0; j < n; j++) ci[j] = ri[j] + beta * ci[j];
        } else {
            memcpy(ci, ri, (size_t)n * sizeof(float));
        }
    }
}

/* The fused route's residual that is not C (beta 0, one member): a pass
 * after the matmul (add_residual), or oneDNN's binary-add post-op
 * (VITHOST_CPU_RESIDUAL=postop, read at each call, to compare). */
static int residual_postop(void) {
    const char *env = getenv("VITHOST_CPU_RESIDUAL");
    return env && strcmp(env, "postop") == 0;
}

/* One row of epilogue(T) into dst: gelu (with grad, gelu'(T) over T as
 * well), T * aux (aux widened into abuf unless f32), gelu'(aux) times T as
 * C's dtype stores it (T rounded in place, through abuf), or T. */
static void epilogue_row(const vh_gemm_args *g, float *dst, float *ti, int grad,
                         const void *auxi, float *abuf) {
    const int64_t n = g->n;
    if (g->epilogue == VH_EPILOGUE_GELU_BACKWARD) {
        const float *xi = auxi;
        if (g->c_dtype != VH_DTYPE_F32) { /* dout = T stored in c_dtype, as gelu_backward reads it */
            vh_cpu_from_f32_serial(abuf, (vh_dtype)g->c_dtype, ti, n);
            vh_cpu_to_f32_serial(ti, abuf, (vh_dtype)g->c_dtype, n);
            vh_cpu_to_f32_serial(abuf, auxi, (vh_dtype)g->c_dtype, n);
            xi = abuf;
        }
        vh_cpu_k_gelu_backward_serial(dst, xi, ti, n);
    } else if (g->epilogue == VH_EPILOGUE_MUL_AUX) {
        const float *ai = auxi;
        if (g->c_dtype != VH_DTYPE_F32) {
            vh_cpu_to_f32_serial(abuf, auxi, (vh_dtype)g->c_dtype, n);
            ai = abuf;
        }
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dst[j] = ti[j] * ai[j];
    } else if (grad) {
        vh_cpu_k_gelu_forward_grad_serial(dst, ti, ti, n);
    } else if (g->epilogue != VH_EPILOGUE_NONE) {
        vh_cpu_k_gelu_forward_serial(dst, ti, n);
    } else if (dst != ti) {
        memcpy(dst, ti, (size_t)n * sizeof(float));
    }
}

/* C = epilogue(T) + residual + beta C, row by row, each element read before
 * it is written (residual may be C itself). With grad (GELU_GRAD with aux)
 * T is overwritten by gelu'(T). The common cases, C = gelu(T) with T and C
 * dense (fc1's pre-activation in aux) and C = T * aux with all three dense
 * and f32, are one threaded pass over the whole block. Rows otherwise go to
 * the threads, and each row's GELU runs on its thread (gelu_forward_serial:
 * a per-row call of the threaded kernel would open a nested parallel region
 * per row, which cost more than the GEMM itself). */
static vh_status finish(const vh_gemm_args *g, int64_t batch, const out_view *t,
                        const out_view *c, const out_view *res, float beta, int grad) {
    const int gelu = g->epilogue == VH_EPILOGUE_GELU || g->epilogue == VH_EPILOGUE_GELU_GRAD;
    const int mul = g->epilogue == VH_EPILOGUE_MUL_AUX;
    const int64_t n = g->n, rows = batch * g->m;
    const int dense = t->ld == n && c->ld == n && (batch == 1 || (t->sbatch == g->m * n &&
                                                                  c->sbatch == g->m * n));
    if (gelu && !res->p && beta == 0.0f && dense) {
        if (grad)
            vh_cpu_k_gelu_forward_grad(c->p, t->p, t->p, rows * n);
        else
            vh_cpu_k_gelu_forward(c->p, t->p, rows * n);
        return VH_STATUS_OK;
    }
    if (mul && !res->p && beta == 0.0f && dense && batch == 1 && g->c_dtype == VH_DTYPE_F32) {
        /* C f32 is g->c itself: dense means aux, in C's layout, is dense too */
        vh_cpu_k_mul(c->p, t->p, g->aux, rows * n, 0);
        return VH_STATUS_OK;
    }
    const int reads_aux = mul || g->epilogue == VH_EPILOGUE_GELU_BACKWARD;
    const size_t row_floats = (size_t)(reads_aux ? 2 * n : n); /* and an aux row */
    float *rows_buf = vh_cpu_scratch_alloc(row_floats * sizeof(float));
    if (!rows_buf) return VH_STATUS_ERR_NOMEM;
    const size_t aux_es = vh_dtype_size((vh_dtype)g->c_dtype);
    const int par = rows * n > VH_CPU_PAR_ELEMS;
#pragma omp parallel if (par)
    {
        float *row = NULL;
        vh_cpu_scratch_mark mark = {0, 0};
        if (par) { /* each thread its own row from its own arena */
            mark = vh_cpu_scratch_begin();
            row = vh_cpu_scratch_alloc(row_floats * sizeof(float));
        } else {
            row = rows_buf;
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows; i++) {
            if (!row) continue;
            const int64_t q = i / g->m, r = i % g->m;
            float *ti = t->p + q * t->sbatch + r * t->ld;
            float *ci = c->p + q * c->sbatch + r * c->ld;
            const float *ri = res->p ? res->p + q * res->sbatch + r * res->ld : NULL;
            const void *ai =
                reads_aux ? (const char *)g->aux + (size_t)(q * g->stride_c + r * g->ldc) * aux_es
                          : NULL;
            if (!ri && beta == 0.0f) { /* straight into C */
                epilogue_row(g, ci, ti, grad, ai, row + n);
                continue;
            }
            epilogue_row(g, row, ti, grad, ai, row + n);
            if (ri && beta != 0.0f) {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) ci[j] = row[j] + ri[j] + beta * ci[j];
            } else if (ri) {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) ci[j] = row[j] + ri[j];
            } else if (beta != 0.0f) {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) ci[j] = row[j] + beta * ci[j];
            } else {
                memcpy(ci, row, (size_t)n * sizeof(float));
            }
        }
        if (par) vh_cpu_scratch_end(mark);
    }
    return VH_STATUS_OK;
}

/* One call's operands and outputs, all as oneDNN and our loops read them. */
typedef struct gemm_views {
    operand a, b;
    const float *bias; /* fp32, or NULL */
    out_view c, res;   /* fp32 C (itself or a dense copy); the residual, or p NULL */
    int c32, res_is_c; /* C is f32 (no copy back); the residual is C */
    int beta0;         /* the residual and beta C are already in C */
} gemm_views;

/* ---- 16-bit operands: native or widened (gemm_choice.c decides) ----------- */

/* A weight gradient's layout, A^T.B (k the tokens): dW = dY^T X, its B the
 * layer's input X, which forward wrote long before (flush_from_forward); A,
 * dY, the backward has just written. */
static int weight_gradient(const vh_gemm_args *g) { return g->trans_a && !g->trans_b; }

/* T * aux applied with the matmul: one member, C and aux f32 (route 1's
 * binary post-op; the bands, dense, multiply each band while it is in L2).
 * Otherwise route 2 multiplies in a pass of its own after the matmul. */
static int mul_in_matmul(const vh_gemm_args *g, int64_t batch) {
    return g->epilogue == VH_EPILOGUE_MUL_AUX && batch == 1 && g->c_dtype == VH_DTYPE_F32;
}

/* The races (gemm_choice.c) time the call's own operands, which their
 * warm-up run leaves in cache, while in the step the operand that forward
 * wrote long before comes from memory: a weight gradient's B (the layer's
 * input X of dW = dY^T X), f32 or bf16, and f32 fc2's data gradient's aux
 * (fc1's T). Those are flushed before each timed run. T1 fp32 on Zen 4, fc2's data
 * gradient (6400x256x64 * aux), ms a call, default / gemm kernel: in cache
 * 1.16-1.19 / 1.11-1.12 (4-7%: each side of the 5% margin from one process
 * to the next), aux flushed 1.41-1.44 / 1.13-1.16, in the step 1.37 / 1.18.
 * Until 6 Dec 2026 the weight gradient's A (dY, which the step has in
 * cache) was flushed instead of B: on the Xeon with AMX T2's 192x768x4160
 * raced 1.02-1.06x for gemm, either side of the 2% margin from one process
 * to the next, while in the step gemm ran it 15% faster (bench/README.md,
 * "the weight gradients' race"). The bf16 races ran in cache until a
 * later session the same day: on Zen 5 T3's 384x1536x1576 weight gradient
 * raced default / gemm 1.02-1.16 in cache, either side of the 5% margin
 * (4 of 9 processes kept the default), and 1.09-1.20 flushed (gemm in 10
 * of 10), where gemm runs T3 AMP's two largest weight gradients 4-17%
 * faster in the step; T2's 192x768x4160 raced 0.94-0.95 in cache (default
 * in 3 of 3), 1.13-1.14 flushed (gemm in 3 of 3), its step 196-199 ms ->
 * 187-192 (bench/README.md, "the bf16 weight gradients' race"). */
static void flush_lines(const void *p, size_t bytes) {
#if defined(__x86_64__) && defined(__GNUC__)
    const char *end = (const char *)p + bytes;
    for (const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)63); c < end; c += 64)
        __builtin_ia32_clflush(c);
    __builtin_ia32_mfence();
#else
    (void)p, (void)bytes;
#endif
}

static void flush_from_forward(const vh_gemm_args *g, int timed_aux) {
    if (timed_aux) /* m x n, dense, f32 (time_path times the multiply only so) */
        flush_lines(g->aux, (size_t)(g->m * g->n) * sizeof(float));
    if (weight_gradient(g) && g->batch <= 1) /* unbatched: B stored k x n */
        flush_lines(g->b, (size_t)((g->k - 1) * g->ldb + g->n) *
                              vh_dtype_size((vh_dtype)g->ab_dtype));
}

/* The bands (below): time_path runs an f32 T * aux there as the call will. */
static int bands_mul_aux(const vh_gemm_args *g, const gemm_views *v);
static vh_status run_bands(const vh_gemm_args *g, int64_t batch, const gemm_views *v,
                           int counted);

/* vh_gemm16_timer on the call's own operands (ctx: its vh_gemm_args): the
 * plain matmul of the proxy's leading block (for an unbatched call asked
 * with a batch of 2, its two halves of k) into scratch; the epilogue
 * costs both paths the same and is left out, but for an f32 T * aux, whose
 * multiply (oneDNN's binary post-op, reading the call's aux where C and aux
 * are f32 and dense) is timed with it, and one that runs in bands is timed
 * in them, each band's multiply included, into the call's own C. Widening
 * converts both operands first, as view_inputs does. */
static double time_path(void *ctx, int path, const vh_gemm16_shape *p) {
    const vh_gemm_args *g = ctx;
    vh_gemm_args pg = *g;
    pg.m = p->m, pg.n = p->n, pg.k = p->k, pg.alpha = 1.0f;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    double t = -1.0;
    const size_t c_bytes = (size_t)(p->batch * p->m * p->n) * sizeof(float);
    out_view c = {vh_cpu_scratch_alloc(c_bytes), p->m * p->n, p->n};
    if (c.p) {
        /* Touched before the clock: in a first step the arena serves each
         * run's C from a fresh block, and its page faults (about 1.2 ms of
         * a 1.4 ms T1 fc2 data gradient) would be timed as the kernel's. */
        memset(c.p, 0, c_bytes);
        /* T * aux where the call applies it with the matmul (timed as the
         * post-op; aux dense, as this scratch C); else the multiply is a
         * pass after either kernel, left out */
        const int mul = p->mul_aux && mul_in_matmul(g, max1(g->batch)) && g->ldc == g->n;
        operand a = operand_of(g->a, g->ab_dtype, g->trans_a, g->lda, g->stride_a);
        operand b = operand_of(g->b, g->ab_dtype, g->trans_b, g->ldb, g->stride_b);
        if (path == VH_GEMM16_NATIVE_GEMM) a.kernel = VH_DNNL_KERNEL_GEMM;
        /* An f32 T * aux that runs in bands is timed in them, into the
         * call's own C (beta 0: the call writes all of it after): one call
         * with the binary post-op is another execution, and on the Xeon
         * with AMX it raced against the gemm kernel (T2's 2080x768x192:
         * default 2.12-2.27 ms, gemm 2.35-2.38) that in the step's bands
         * ran T2's and T3's 5-7% faster (bench/README.md). */
        if (mul && p->dtype == VH_DTYPE_F32 && p->batch == 1 && p->n == g->n && p->k == g->k) {
            const gemm_views bv = {.a = a, .b = b, .c32 = 1};
            if (bands_mul_aux(&pg, &bv)) {
                flush_from_forward(g, 1);
                const double t0 = vh_cpu_seconds();
                if (run_bands(&pg, 1, &bv, 0) == VH_STATUS_OK) t = vh_cpu_seconds() - t0;
                vh_cpu_scratch_end(mark);
                return t;
            }
        }
        flush_from_forward(g, mul); /* mul: f32 only (path16 asks without it) */
        const double t0 = vh_cpu_seconds();
        if (p->batch > 1 && g->batch <= 1) { /* halves of k (path16): as run_ksplit */
            a.sbatch = p->k * a.scol;
            b.sbatch = p->k * b.srow;
        }
        vh_status st = VH_STATUS_OK;
        if (path == VH_GEMM16_WIDEN && (st = densify(&a, p->batch, p->m, p->k)) == VH_STATUS_OK)
            st = densify(&b, p->batch, p->k, p->n);
        vh_dnnl_matmul mm;
        describe(&mm, &pg, p->batch, &a, &b, &c);
        mm.mul_aux = mul;
        if (st == VH_STATUS_OK)
            st = matmul_run(&mm, a.p, b.p, NULL, mm.mul_aux ? g->aux : NULL, NULL, c.p);
        if (st == VH_STATUS_OK) t = vh_cpu_seconds() - t0;
    }
    vh_cpu_scratch_end(mark);
    return t;
}

/* Weight gradients of small layers (T1: 64 x 256 from k = 6400 tokens) give
 * oneDNN too few blocks of C to keep both threads busy; as two products of
 * half of k each (one batched matmul, a member per thread) they do. Always
 * two halves, whatever the thread count, so the sums do not depend on it.
 * Measured on Zen 5, 2 threads, best of 30, GFLOP/s, one product against
 * two halves: f32 64x256x6400 396 -> 434, 256x64x6400 409 -> 456,
 * 192x64x6400 420 -> 465; bf16 733 -> 850, 841 -> 873, 828 -> 866. */
#define KSPLIT_MAX_C ((int64_t)1 << 16)
#define KSPLIT_MIN_K 2048

static int ksplit_fits(const vh_gemm_args *g, int64_t batch) {
    return batch == 1 && g->epilogue == VH_EPILOGUE_NONE && !g->bias && !g->residual &&
           g->k >= KSPLIT_MIN_K && g->k % 2 == 0 && g->m * g->n <= KSPLIT_MAX_C &&
           g->k >= 8 * (g->m > g->n ? g->m : g->n);
}

/* gemm_choice.c's choice for the matmul that will run: a call that runs in
 * halves of k is timed as those two products (batched). mul_aux: an f32
 * T * aux, a class of its own. */
static vh_gemm16_path choose(const vh_gemm_args *g, int64_t batch, int mul_aux) {
    const int halves = ksplit_fits(g, batch);
    const vh_gemm16_shape s = {g->ab_dtype,         g->trans_a, g->trans_b,
                               halves ? 2 : batch,  g->m,       g->n,
                               halves ? g->k / 2 : g->k, mul_aux};
    return vh_gemm16_choose(&s, time_path, (void *)(uintptr_t)g);
}

/* The path of a 16-bit GEMM. */
static vh_gemm16_path path16(const vh_gemm_args *g, int64_t batch) {
    return choose(g, batch, 0);
}

/* The kernel of an f32 GEMM. gemm_choice.c holds the rule: the classes it
 * races (the weight gradients and T * aux) are timed on both of oneDNN's
 * kernels, the rest run the default untimed. */
static vh_dnnl_kernel kernel32(const vh_gemm_args *g, int64_t batch) {
    const int mul = g->epilogue == VH_EPILOGUE_MUL_AUX;
    return choose(g, batch, mul) == VH_GEMM16_NATIVE_GEMM ? VH_DNNL_KERNEL_GEMM
                                                          : VH_DNNL_KERNEL_DEFAULT;
}

/* Operands: f32, or 16-bit where the native kernels run them (above), as
 * they are; others as fp32 copies; the bias in fp32. */
static vh_status view_inputs(const vh_gemm_args *g, int64_t batch, int multiply, gemm_views *v) {
    vh_status st;
    v->a = operand_of(g->a, g->ab_dtype, g->trans_a, g->lda, g->stride_a);
    v->b = operand_of(g->b, g->ab_dtype, g->trans_b, g->ldb, g->stride_b);
    if (multiply && g->ab_dtype != VH_DTYPE_F32) {
        const vh_gemm16_path path = path16(g, batch);
        if (path == VH_GEMM16_NATIVE_GEMM) v->a.kernel = VH_DNNL_KERNEL_GEMM;
        if (path == VH_GEMM16_WIDEN &&
            ((st = densify(&v->a, batch, g->m, g->k)) != VH_STATUS_OK ||
             (st = densify(&v->b, batch, g->k, g->n)) != VH_STATUS_OK))
            return st;
    }
    if (multiply && g->ab_dtype == VH_DTYPE_F32) v->a.kernel = kernel32(g, batch);
    v->bias = vh_cpu_f32_view(g->bias, g->bias_dtype, g->n, 1);
    if (g->bias && !v->bias) return VH_STATUS_ERR_NOMEM;
    return VH_STATUS_OK;
}

/* Outputs in fp32: C itself, or a dense copy (loaded when read); likewise
 * the residual. */
static vh_status view_outputs(const vh_gemm_args *g, int64_t batch, gemm_views *v) {
    const int64_t m = g->m, n = g->n;
    v->res_is_c = g->residual && g->residual == g->c;
    v->c32 = g->c_dtype == VH_DTYPE_F32;
    v->c = (out_view){g->c, g->stride_c, g->ldc};
    if (!v->c32) {
        v->c.p = vh_cpu_scratch_alloc((size_t)(batch * m * n) * sizeof(float));
        if (!v->c.p) return VH_STATUS_ERR_NOMEM;
        v->c.sbatch = m * n, v->c.ld = n;
        if (g->beta != 0.0f || v->res_is_c)
            block_to_f32(v->c.p, g->c, g->c_dtype, batch, g->stride_c, m, g->ldc, n);
    }
    v->res = (out_view){NULL, 0, 0};
    if (v->res_is_c) {
        v->res = v->c;
    } else if (g->residual && v->c32) {
        v->res = (out_view){(float *)(uintptr_t)g->residual, g->stride_c, g->ldc};
    } else if (g->residual) {
        v->res.p = vh_cpu_scratch_alloc((size_t)(batch * m * n) * sizeof(float));
        if (!v->res.p) return VH_STATUS_ERR_NOMEM;
        v->res.sbatch = m * n, v->res.ld = n;
        block_to_f32(v->res.p, g->residual, g->c_dtype, batch, g->stride_c, m, g->ldc, n);
    }
    return VH_STATUS_OK;
}

/* Route 1, one oneDNN matmul with its post-ops. VH_STATUS_ERR_UNSUPPORTED:
 * oneDNN refused it, and route 2 is to run (C may now hold the residual).
 * MUL_AUX comes here only with C and aux f32 and one member (run). */
static vh_status run_fused(const vh_gemm_args *g, int64_t batch, gemm_views *v) {
    const int gelu = g->epilogue == VH_EPILOGUE_GELU;
    const int mul = g->epilogue == VH_EPILOGUE_MUL_AUX;
    const void *aux = mul ? g->aux : NULL;
    vh_status st;
    /* A residual that is not C, with beta 0 and no batch (a residual
     * branch's output layer): the matmul writes C = epilogue(T) and one
     * pass adds the residual to C while C is still in L2/L3, the same sum
     * in the same order, (T + bias) + r, so the same bits (compared on
     * T1-T3's shapes). oneDNN 2.6's binary-add post-op, which reads the
     * residual inside the kernel, was the faster on Zen 3 against copying
     * it into C first (T1's 6400x64x256 1.6 -> 1.5 ms, T2's 4160x192x192
     * 2.4 -> 2.05), but it slows the kernel itself by 10-25%: on Zen 5, 2
     * threads, best of 40 out of cache, bias only / binary post-op / this
     * pass, ms a call: 6400x64x256 0.50 / 0.61 / 0.55, 4160x192x192 0.74
     * / 0.95 / 0.78, 1576x384x384 0.99 / 1.22 / 1.03, 1576x384x1536 3.96
     * / 4.15 / 4.02. In the fp32 steps (3 interleaved pairs of `vithost
     * bench --ops`, the two GEMMs with a residual, ms a step, post-op /
     * pass): T3 59.7-62.4 / 57.9-58.7, T2 42.5-43.3 / 40.0-40.8, T1
     * 3.10-3.31 / 2.71-2.88. Otherwise (beta, a batch) the residual is
     * added to C first (c = r + beta c) and the sum post-op adds it:
     * oneDNN 2.6's binary post-op misreads a batched residual whose batch
     * stride is not m * ldc. */
    vh_dnnl_matmul mm;
    if (v->res.p && !v->res_is_c && batch == 1 && g->beta == 0.0f) {
        const int postop = residual_postop();
        describe(&mm, g, batch, &v->a, &v->b, &v->c);
        mm.has_bias = v->bias != NULL;
        mm.gelu = gelu;
        mm.mul_aux = mul;
        mm.residual = postop;
        st = matmul_run(&mm, v->a.p, v->b.p, v->bias, aux, postop ? v->res.p : NULL, v->c.p);
        if (st == VH_STATUS_OK && !postop) add_residual(g, 1, &v->c, &v->res, 1.0f);
        if (st == VH_STATUS_OK && !v->c32)
            block_from_f32(g->c, g->c_dtype, v->c.p, batch, g->stride_c, g->m, g->ldc, g->n);
        if (st != VH_STATUS_ERR_UNSUPPORTED) return st;
    }
    if (v->res.p && !v->res_is_c) add_residual(g, batch, &v->c, &v->res, g->beta);
    describe(&mm, g, batch, &v->a, &v->b, &v->c);
    mm.has_bias = v->bias != NULL;
    mm.gelu = gelu;
    mm.mul_aux = mul;
    mm.sum = v->res.p ? (v->res_is_c ? 1.0f + g->beta : 1.0f) : g->beta;
    st = matmul_run(&mm, v->a.p, v->b.p, v->bias, aux, NULL, v->c.p);
    if (st == VH_STATUS_OK && !v->c32)
        block_from_f32(g->c, g->c_dtype, v->c.p, batch, g->stride_c, g->m, g->ldc, g->n);
    if (st == VH_STATUS_ERR_UNSUPPORTED && v->res.p && !v->res_is_c) {
        v->res = v->c; /* C now holds r + beta C: the residual, alone */
        v->beta0 = 1;
    }
    return st;
}

/* AMP's fc1: C = gelu(T) and aux = T, both bf16 and dense, nothing added. */
static int gelu_to_bf16(const vh_gemm_args *g, int64_t batch) {
    return g->epilogue == VH_EPILOGUE_GELU && g->aux && batch == 1 && !g->residual &&
           g->beta == 0.0f && g->c_dtype == VH_DTYPE_BF16 && g->ldc == g->n;
}

/* GELU or GELU_GRAD with aux: the call writes aux, which oneDNN's fused
 * GELU cannot (route 2). */
static int writes_aux(const vh_gemm_args *g) {
    return (g->epilogue == VH_EPILOGUE_GELU || g->epilogue == VH_EPILOGUE_GELU_GRAD) && g->aux;
}

/* Route 2, split: T into aux (f32) or a dense scratch, then the epilogue. */
static vh_status run_split(const vh_gemm_args *g, int64_t batch, int multiply, gemm_views *v) {
    const int64_t m = g->m, n = g->n;
    const int want_aux = writes_aux(g);
    vh_status st;
    out_view t = {NULL, m * n, n};
    if (want_aux && v->c32) {
        t = (out_view){g->aux, g->stride_c, g->ldc};
    } else {
        t.p = vh_cpu_scratch_alloc((size_t)(batch * m * n) * sizeof(float));
        if (!t.p) return VH_STATUS_ERR_NOMEM;
    }
    if (multiply) {
        if ((st = plain(g, batch, v->a, v->b, v->bias, &t)) != VH_STATUS_OK) return st;
    } else {
        for (int64_t i = 0; i < batch * m; i++) {
            float *row = t.p + (i / m) * t.sbatch + (i % m) * t.ld;
            if (v->bias)
                memcpy(row, v->bias, (size_t)n * sizeof(float));
            else
                memset(row, 0, (size_t)n * sizeof(float));
        }
    }
    if (gelu_to_bf16(g, batch)) { /* C and aux rounded in the GELU's own pass */
        vh_cpu_k_gelu_forward_f32_to_bf16(g->c, g->aux, t.p, m * n);
        return VH_STATUS_OK;
    }
    const int grad = want_aux && g->epilogue == VH_EPILOGUE_GELU_GRAD; /* into t, then aux */
    if ((st = finish(g, batch, &t, &v->c, &v->res, v->beta0 ? 0.0f : g->beta, grad)) !=
        VH_STATUS_OK)
        return st;
    if (want_aux && !v->c32)
        block_from_f32(g->aux, g->c_dtype, t.p, batch, g->stride_c, m, g->ldc, n);
    if (!v->c32) block_from_f32(g->c, g->c_dtype, v->c.p, batch, g->stride_c, m, g->ldc, n);
    return VH_STATUS_OK;
}

/* Route 0, bf16 operands on the native kernels and a bf16 C: oneDNN
 * writes C itself, rounding in its epilogue, and reads a bf16 residual or
 * C (beta) there too, where the other routes go through an fp32 copy of C
 * and a conversion pass. The same values: T + residual + beta C in fp32,
 * rounded once to nearest even. Measured on Zen 5, 2 threads, best of 20,
 * ms per call: T1's 6400x256x64 0.276 -> 0.22, T2's 4160x768x192 1.42 ->
 * 1.28 (the fp32 C's own times; the smaller k, the more C's trips cost).
 * VH_STATUS_ERR_UNSUPPORTED: not this call, or oneDNN refused it. */
static vh_status run_direct16(const vh_gemm_args *g, int64_t batch, const gemm_views *v) {
    const int res_is_c = g->residual && g->residual == g->c;
    const int res_other = g->residual && !res_is_c;
    if (g->c_dtype != VH_DTYPE_BF16 || v->a.dtype != VH_DTYPE_BF16 ||
        g->epilogue == VH_EPILOGUE_MUL_AUX || (res_other && (batch != 1 || g->beta != 0.0f)))
        return VH_STATUS_ERR_UNSUPPORTED;
    const out_view c = {g->c, g->stride_c, g->ldc}; /* bf16: only its strides are read */
    vh_dnnl_matmul mm;
    describe(&mm, g, batch, &v->a, &v->b, &c);
    mm.c_dtype = VH_DTYPE_BF16;
    mm.has_bias = v->bias != NULL;
    mm.gelu = g->epilogue == VH_EPILOGUE_GELU;
    mm.residual = res_other;
    mm.sum = res_is_c ? 1.0f + g->beta : g->beta;
    if (res_other)
        return matmul_run(&mm, v->a.p, v->b.p, v->bias, NULL, g->residual, g->c);
    return matmul_run(&mm, v->a.p, v->b.p, v->bias, NULL, NULL, g->c);
}

/* ---- bands of rows, one thread each ----------------------------------------- */

/* Rows a band: its fp32 T within BAND_T_BYTES (the thread's L2 holds it
 * while the pass reads it back), a multiple of 16 (AMX tiles), at most 128
 * (enough bands for every thread on the ViTs' token counts). */
#define BAND_T_BYTES ((int64_t)1 << 20)

static int64_t band_rows(int64_t n) {
    const int64_t r = BAND_T_BYTES / (n * (int64_t)sizeof(float)) / 16 * 16;
    return r < 16 ? 16 : r > 128 ? 128 : r;
}

/* fp32's bands only where B is at most a few MiB, read again by every
 * band. T3's 1536 x 384 B (2.3 MiB, over Zen 4's 1 MiB L2) was kept out
 * while the bands were split statically (its fc1 in bands 170-183 ms a
 * step against 167-172); dealt one at a time (run_bands), in the T3 fp32
 * step on Zen 4, 2 threads, 4 interleaved pairs: fc1 even (125.7-133.3 ms
 * against 124.4-142.1), fc2's data gradient (T * aux) 115.3-118.0 against
 * 119.5-124.5. T * aux only where a band's matmul is also long enough to
 * pay for its own call. */
#define BAND_F32_MAX_B_BYTES ((int64_t)4 << 20)
#define BAND_MUL_MIN_FLOP ((int64_t)16 << 20)

typedef enum band_pass {
    BAND_PASS_NONE,
    BAND_PASS_GELU_TO_BF16, /* C = bf16(gelu(T)), aux = bf16(T), from the thread's own T */
    BAND_PASS_GELU_F32,     /* T in aux's band; C = gelu(T), GELU_GRAD's gelu'(T) over T */
    BAND_PASS_MUL_AUX,      /* C = T * aux in place: T is C's band */
    BAND_PASS_GELU_BACKWARD_TO_BF16, /* C = bf16(gelu'(aux) bf16(T)), from the thread's own T */
} band_pass;

/* The calls whose pass would otherwise read T back from memory, all dense
 * with nothing added. On a Xeon with AMX, 2 threads, ms a call, one call
 * against bands:
 * - AMP's fc1 (gelu_to_bf16's call) on native bf16 operands: T2's
 *   4160x768x192 6.2-6.8 -> 4.9-5.4, T1's 6400x256x64 2.5 -> 2.1, T3's
 *   1576x1536x384 7.1-7.8 -> 6.7-6.9.
 * - fp32's fc1 (GELU_GRAD; GELU with aux takes the same bands, so the two
 *   give the same T): in the step, against the same run's A.B of fc1's
 *   data gradient, interleaved pairs of `vithost bench --ops`: T1's
 *   6400x256x64 16% faster (4 pairs), T2's 4160x768x192 5% (3), the main
 *   job's 2048x256x128 6.5% (4).
 * - fp32's fc2 data gradient (T * aux; unbanded, oneDNN's binary-mul
 *   post-op): T2's in the step 8-10% faster, against the same run's
 *   4160x192x768 A.B; T1's and the main job's (k 64, bands of 4 MFLOP)
 *   even or slower alone, so they keep the one call.
 * - AMP's fc2 data gradient with GELU_BACKWARD, against oneDNN writing the
 *   bf16 C and gelu_backward reading it back, both ops together, ms a step,
 *   interleaved pairs: T2 31.9-37.7 against 35.6-46.0, T3 34.9-44.1 against
 *   43.3-53.0, T1 5.2-5.5 against 5.1-6.6 (k 64: even, kept for one rule). */
static band_pass band_pass_of(const vh_gemm_args *g, int64_t batch, const gemm_views *v) {
    if (g->alpha != 1.0f) return BAND_PASS_NONE;
    if (gelu_to_bf16(g, batch) && v->a.dtype == VH_DTYPE_BF16) return BAND_PASS_GELU_TO_BF16;
    if (g->epilogue == VH_EPILOGUE_GELU_BACKWARD && batch == 1 && g->beta == 0.0f &&
        !g->residual && g->c_dtype == VH_DTYPE_BF16 && g->ldc == g->n &&
        (v->a.dtype == VH_DTYPE_BF16 ||
         g->k * g->n * (int64_t)sizeof(float) <= BAND_F32_MAX_B_BYTES))
        return BAND_PASS_GELU_BACKWARD_TO_BF16;
    if (batch != 1 || g->beta != 0.0f || g->residual || g->c_dtype != VH_DTYPE_F32 ||
        g->ldc != g->n || v->a.dtype != VH_DTYPE_F32 ||
        g->k * g->n * (int64_t)sizeof(float) > BAND_F32_MAX_B_BYTES)
        return BAND_PASS_NONE;
    if (writes_aux(g)) return BAND_PASS_GELU_F32;
    if (g->epilogue == VH_EPILOGUE_MUL_AUX &&
        2 * band_rows(g->n) * g->n * g->k >= BAND_MUL_MIN_FLOP)
        return BAND_PASS_MUL_AUX;
    return BAND_PASS_NONE;
}

/* An f32 T * aux that runs in bands (time_path times it there). */
static int bands_mul_aux(const vh_gemm_args *g, const gemm_views *v) {
    return g->epilogue == VH_EPILOGUE_MUL_AUX && band_pass_of(g, 1, v) == BAND_PASS_MUL_AUX;
}

/* B once in the layout the bands' kernel reads, for all bands (NULL where
 * it reads B as it is, or VITHOST_CPU_PACK_B=0). oneDNN would otherwise
 * copy B into that layout at every band's call: 13 times for T3's
 * 1576-row calls. On the Xeon with AMX, T3's 1576 x 1536 x 384 in bands of
 * 128 rows, 2 threads, ms a call, the matmuls alone: bf16 4.3-4.6 against
 * 8.6-12.2 (B plain or transposed alike), f32 with B transposed 9.9-10.0
 * against 16.3-17.6. With each band's pass, `ab_calls`: bf16 7-15% faster
 * a call on T2 and T3, even on T1 (k 64); f32 even to 6% (its B, plain or
 * transposed, goes into blocks of 16 x 64 too). The same kernel on the
 * same blocks, so the same sums (test_gemm16). */
static _Atomic uint64_t g_band_calls, g_band_packed, g_band_unpacked_bands;
/* fp32 GELU calls in bands (aux kept), and those whose aux was streamed */
static _Atomic uint64_t g_band_gelu32, g_band_streamed;

/* The matmul of a band of r rows (dense T of n columns, B plain: b_layout
 * 0). Only the shape and strides count: the pointers go to the run. */
static void describe_band(vh_dnnl_matmul *mm, const vh_gemm_args *g, const gemm_views *v,
                          int64_t r) {
    vh_gemm_args band = *g;
    band.m = r;
    const out_view tv = {NULL, r * g->n, g->n};
    describe(mm, &band, 1, &v->a, &v->b, &tv);
    mm->has_bias = v->bias != NULL;
}

static const void *pack_b(const vh_gemm_args *g, const gemm_views *v, int64_t rows,
                          uint64_t *layout) {
    *layout = 0;
    if (pack_b_off()) return NULL;
    vh_dnnl_matmul mm;
    describe_band(&mm, g, v, rows);
    return pack_described(&mm, v->b.p, layout);
}

/* fp32's aux, the band's T or gelu'(T) kept for the backward pass, is
 * written with non-temporal stores (stream.c) where the step's tensors
 * outgrow the L3 (vh_cpu_stream_on; stream.c has the numbers): nothing
 * reads it before the backward pass, which then reads it from memory
 * either way, and ordinary stores would first read each of its lines from
 * memory. The pass runs over the thread's own T in chunks that stay in L1,
 * each streamed out after. Not for AMP's bf16 T: half the bytes, and its
 * pass cut into chunks with a copy ran T2's fc1 at 21-24 ms a step against
 * 21-23. C, which the next layer reads at once, stays in the caches:
 * streaming fc2's data gradient out instead slowed it and the three GEMMs
 * that read it (T2 fp32 steps of 586-592 ms against 556-569). */
#define STREAM_CHUNK 2048 /* floats: 8 KiB of T, in L1 */

static void stream_gelu_band(const vh_gemm_args *g, float *c, float *aux, float *t,
                             int64_t count) {
    for (int64_t o = 0; o < count; o += STREAM_CHUNK) {
        const int64_t len = count - o < STREAM_CHUNK ? count - o : STREAM_CHUNK;
        if (g->epilogue == VH_EPILOGUE_GELU_GRAD) /* gelu'(T) over T, then out */
            vh_cpu_k_gelu_forward_grad_serial(c + o, t + o, t + o, len);
        else
            vh_cpu_k_gelu_forward_serial(c + o, t + o, len);
        vh_cpu_copy_stream(aux + o, t + o, (size_t)len * sizeof(float));
    }
}

/* Each thread runs its bands' matmuls alone (oneDNN inside a parallel
 * region runs on the calling thread) and the pass on each band right
 * after, while the band is in its L2. Bands are fixed by the shape, so the
 * sums do not depend on the thread count or on which thread runs a band.
 * Each thread takes a contiguous run of them, its share of the rows
 * (deal.c: the same rows as the ops before and after; split by rows, not
 * by count, which gave T3's fc1 896 rows to one thread and 680 to the
 * other).
 * VH_STATUS_ERR_UNSUPPORTED: not such a call, or oneDNN refused a band
 * (the one-call route then writes all). */
static vh_status run_bands(const vh_gemm_args *g, int64_t batch, const gemm_views *v,
                           int counted) {
    const band_pass pass = band_pass_of(g, batch, v);
    if (pass == BAND_PASS_NONE) return VH_STATUS_ERR_UNSUPPORTED;
    const int64_t m = g->m, n = g->n, rows = band_rows(n), bands = (m + rows - 1) / rows;
    const size_t es = vh_dtype_size(v->a.dtype);
    /* aux streamed from the thread's own T (stream_gelu_band) */
    const int streamed = pass == BAND_PASS_GELU_F32 && vh_cpu_stream_on();
    vh_status st = VH_STATUS_OK;
    vh_cpu_scratch_mark outer = vh_cpu_scratch_begin();
    uint64_t layout = 0;
    const void *packed = bands > 1 ? pack_b(g, v, rows, &layout) : NULL;
    if (counted) { /* not the kernel race's runs (time_path) */
        g_band_calls++;
        if (packed) g_band_packed++;
        if (pass == BAND_PASS_GELU_F32) g_band_gelu32++;
        if (streamed) g_band_streamed++;
    }
    const int dynamic = vh_cpu_deal_dynamic();
    int64_t next_band = 0;
#pragma omp parallel if (bands > 1)
    {
        vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
        /* the thread's own T: for the bf16 passes, and where aux is streamed */
        const int own_t = streamed || pass == BAND_PASS_GELU_TO_BF16 ||
                          pass == BAND_PASS_GELU_BACKWARD_TO_BF16;
        float *own = own_t ? vh_cpu_scratch_alloc((size_t)(rows * n) * sizeof(float)) : NULL;
        vh_status mine = !own_t || own ? VH_STATUS_OK : VH_STATUS_ERR_NOMEM;
        /* the thread's own rows (deal.c) */
        vh_cpu_deal deal;
        vh_cpu_deal_init(&deal, dynamic, &next_band, bands, 1, rows, m);
        int64_t lo, hi;
        while (mine == VH_STATUS_OK && vh_cpu_deal_take(&deal, &lo, &hi))
            for (int64_t i = lo; i < hi && mine == VH_STATUS_OK; i++) {
                const int64_t r0 = i * rows, r = m - r0 < rows ? m - r0 : rows;
                const void *a = (const char *)v->a.p + (size_t)(r0 * v->a.srow) * es;
                float *t = own_t                        ? own
                           : pass == BAND_PASS_GELU_F32 ? (float *)g->aux + r0 * n
                                                        : (float *)g->c + r0 * n;
                vh_dnnl_matmul mm;
                describe_band(&mm, g, v, r);
                mm.b_layout = layout;
                mine = vh_dnnl_matmul_run(&mm, a, packed ? packed : v->b.p, v->bias, t);
                if (mine == VH_STATUS_ERR_UNSUPPORTED && packed) {
                    /* this band's kernel reads another layout (a short band's may) */
                    g_band_unpacked_bands++;
                    mm.b_layout = 0;
                    mine = vh_dnnl_matmul_run(&mm, a, v->b.p, v->bias, t);
                }
                if (mine != VH_STATUS_OK) continue;
                if (streamed) {
                    stream_gelu_band(g, (float *)g->c + r0 * n, (float *)g->aux + r0 * n, t, r * n);
                } else if (pass == BAND_PASS_GELU_TO_BF16) {
                    vh_cpu_k_gelu_forward_f32_to_bf16_serial((uint16_t *)g->c + r0 * n,
                                                             (uint16_t *)g->aux + r0 * n, t, r * n);
                } else if (pass == BAND_PASS_GELU_BACKWARD_TO_BF16) {
                    vh_cpu_k_gelu_backward_f32_to_bf16_serial((uint16_t *)g->c + r0 * n,
                                                              (const uint16_t *)g->aux + r0 * n, t,
                                                              r * n);
                } else if (pass == BAND_PASS_GELU_F32) {
                    if (g->epilogue == VH_EPILOGUE_GELU_GRAD)
                        vh_cpu_k_gelu_forward_grad_serial((float *)g->c + r0 * n, t, t, r * n);
                    else
                        vh_cpu_k_gelu_forward_serial((float *)g->c + r0 * n, t, r * n);
                } else {
                    const float *x = (const float *)g->aux + r0 * n;
#pragma omp simd
                    for (int64_t j = 0; j < r * n; j++) t[j] *= x[j];
                }
            }
        if (streamed) vh_cpu_stream_fence();
#pragma omp critical(vh_gemm_bands)
        if (mine != VH_STATUS_OK && st == VH_STATUS_OK) st = mine;
        vh_cpu_scratch_end(mark);
    }
    vh_cpu_scratch_end(outer);
    return st;
}

const char *vh_cpu_gemm_bands_summary(char *buf, size_t len) {
    if (!buf || !len) return buf;
    const unsigned long long calls = g_band_calls, packed = g_band_packed,
                             unpacked = g_band_unpacked_bands, single = g_single_calls,
                             single_packed = g_single_packed;
    int at = 0;
    if (!calls)
        at = snprintf(buf, len, "no calls in bands");
    else
        at = snprintf(buf, len, "%llu calls in bands of rows: B packed once for %llu%s", calls,
                      packed, unpacked ? ", some bands' kernels read B plain" : "");
    if (at >= 0 && (size_t)at < len)
        at += snprintf(buf + at, len - (size_t)at,
                       "; B packed first for %llu of %llu one-call GEMMs that could take it "
                       "(%d+ rows, at least k)%s",
                       single_packed, single, PACK_MIN_ROWS,
                       pack_b_off() ? " (VITHOST_CPU_PACK_B=0)" : "");
    const unsigned long long gelu32 = g_band_gelu32, streamed = g_band_streamed;
    if (gelu32 && at >= 0 && (size_t)at < len)
        snprintf(buf + at, len - (size_t)at,
                 "; fp32 GELU's aux streamed past the caches in %llu of %llu calls", streamed,
                 gelu32);
    return buf;
}

/* ---- a long k and a small C: two halves of k side by side ------------------ */
/* (ksplit_fits, above path16, says which calls; its comment says why.) */

/* C = (alpha A_0 B_0 + alpha A_1 B_1) + beta C, in C's fp32 view. */
static vh_status run_ksplit(const vh_gemm_args *g, gemm_views *v) {
    const int64_t m = g->m, n = g->n, kh = g->k / 2;
    float *halves = vh_cpu_scratch_alloc((size_t)(2 * m * n) * sizeof(float));
    if (!halves) return VH_STATUS_ERR_NOMEM;
    vh_gemm_args h = *g;
    h.k = kh;
    operand a = v->a, b = v->b;
    a.sbatch = kh * a.scol; /* the second half starts kh columns of op(A) on */
    b.sbatch = kh * b.srow; /* and kh rows of op(B) */
    const out_view t = {halves, m * n, n};
    vh_status st = plain(&h, 2, a, b, NULL, &t);
    if (st != VH_STATUS_OK) return st;
    const float beta = g->beta;
    const float *h1 = halves + m * n;
#pragma omp parallel for schedule(static) if (m * n > VH_CPU_PAR_ELEMS)
    for (int64_t i = 0; i < m; i++) {
        float *ci = v->c.p + i * v->c.ld;
        const float *p0 = halves + i * n, *p1 = h1 + i * n;
        if (beta != 0.0f) {
#pragma omp simd
            for (int64_t j = 0; j < n; j++) ci[j] = (p0[j] + p1[j]) + beta * ci[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < n; j++) ci[j] = p0[j] + p1[j];
        }
    }
    if (!v->c32) block_from_f32(g->c, g->c_dtype, v->c.p, 1, g->stride_c, m, g->ldc, n);
    return VH_STATUS_OK;
}

static vh_status run(const vh_gemm_args *g, int64_t batch) {
    const int multiply = g->k > 0 && g->alpha != 0.0f;
    gemm_views v = {.beta0 = 0};
    vh_status st = view_inputs(g, batch, multiply, &v);
    if (st != VH_STATUS_OK) return st;
    /* one oneDNN matmul with its post-ops can do it (a bias only with alpha
     * 1; T * aux on f32 C and aux, one member: oneDNN 2.6's binary post-op
     * misreads some batched operands, see run_fused) */
    const int mul_fusable = g->epilogue != VH_EPILOGUE_MUL_AUX || mul_in_matmul(g, batch);
    const int fusable = multiply && !writes_aux(g) && mul_fusable &&
                        g->epilogue != VH_EPILOGUE_GELU_BACKWARD && !(v.bias && g->alpha != 1.0f);
    if (multiply && ksplit_fits(g, batch)) {
        if ((st = view_outputs(g, batch, &v)) != VH_STATUS_OK) return st;
        return run_ksplit(g, &v);
    }
    if (fusable && (st = run_direct16(g, batch, &v)) != VH_STATUS_ERR_UNSUPPORTED) return st;
    if (multiply && (st = run_bands(g, batch, &v, 1)) != VH_STATUS_ERR_UNSUPPORTED) return st;
    if ((st = view_outputs(g, batch, &v)) != VH_STATUS_OK) return st;
    if (fusable) {
        st = run_fused(g, batch, &v);
        if (st != VH_STATUS_ERR_UNSUPPORTED) return st;
    }
    return run_split(g, batch, multiply, &v);
}

vh_status vh_cpu_gemm(vh_device *dev, const vh_gemm_args *in) {
    (void)dev;
    vh_gemm_args ga, *g = &ga;
    /* 1.0 callers end at bias: everything after reads as zero (f32, no epilogue). */
    if (!in || in->struct_size < offsetof(vh_gemm_args, ab_dtype) ||
        !vh_struct_upgrade(g, sizeof *g, in))
        return VH_STATUS_ERR_INVALID_ARG;
    if (!vh_cpu_is_float(g->ab_dtype) || !vh_cpu_is_float(g->c_dtype) ||
        !vh_cpu_is_float(g->bias_dtype) || (unsigned)g->epilogue > VH_EPILOGUE_GELU_BACKWARD)
        return VH_STATUS_ERR_INVALID_ARG;
    /* T * aux and gelu'(aux) T read aux, which C's stores would overwrite under it */
    if ((g->epilogue == VH_EPILOGUE_MUL_AUX || g->epilogue == VH_EPILOGUE_GELU_BACKWARD) &&
        (!g->aux || g->aux == g->c))
        return VH_STATUS_ERR_INVALID_ARG;
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
    if (g->epilogue == VH_EPILOGUE_NONE) g->aux = NULL;
    /* gelu'(T) with nowhere to go: a GELU (route 1 may fuse it) */
    if (g->epilogue == VH_EPILOGUE_GELU_GRAD && !g->aux) g->epilogue = VH_EPILOGUE_GELU;
    vh_cpu_scratch_mark mark = vh_cpu_scratch_begin();
    vh_status st = run(g, batch);
    vh_cpu_scratch_end(mark);
    return st;
}
