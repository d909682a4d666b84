/* test_ops_dtypes.c - every compute op of the CPU device on f32, bf16 and f16
 * storage, against references computed here in double.
 *
 * The reference reads the values as stored (inputs are rounded to their dtype
 * when they are written), so rounding the inputs is not an error the op is
 * charged with. What is left, per output stored in dtype t:
 *   - one rounding at the store, to nearest even: at most u(t) relative per
 *     element, so at most u(t) in the normalised error ||got - ref|| / ||ref||
 *     (u = 2^-24 f32, 2^-8 bf16, 2^-11 f16: half an ulp);
 *   - the fp32 arithmetic inside the op (fp32 accumulation, the fast exp and
 *     GELU): TOL_F32_MATH, the bound the f32 checks of test_ops.c use.
 * So the tolerance of an output in t is u(t) + TOL_F32_MATH, the same for
 * every op. Measured: 0.3-0.4 u for bf16 and f16 outputs (what one rounding
 * of uniformly spread errors gives), so an op that computed in bf16, or
 * accumulated in it, would be several u off and fail. Outputs that
 * accumulate (+=) start from nonzero stored values: the op must read them,
 * add in fp32 and round once. test_gemm_bf16_exact checks the GEMM's "exact
 * bf16 products, fp32 sums" bit for bit.
 *
 * Also: the GEMM with every epilogue, bias, residual, beta, transposes and
 * batch; multi_tensor_scale_check (sums, Inf/NaN, thread count); and the
 * engine description. ctest runs this binary twice, the second time with
 * oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2): on a CPU with bf16 hardware
 * that is the route of a CPU without it (bf16 converted to f32), which must
 * give the same results within the same tolerances.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vithost/vh_cpu_engine.h"
#include "vithost/vh_runtime.h"

#define TOL_F32_MATH 1e-5

static const vh_device_ops *ops;
static const vh_dtype kTypes[3] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};

static double unit_roundoff(vh_dtype t) {
    return t == VH_DTYPE_BF16 ? 0x1p-8 : t == VH_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}

static double tol(vh_dtype t) { return unit_roundoff(t) + TOL_F32_MATH; }

/* ---- tensors of any dtype -------------------------------------------------- */

static uint64_t rng_state;

static double rnd(void) { /* splitmix64, uniform in [0, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

typedef struct tens {
    vh_dtype t;
    int64_t n;
    void *p;
} tens;

static tens tnew(vh_dtype t, int64_t n) {
    tens x = {t, n, calloc((size_t)(n > 0 ? n : 1), vh_dtype_size(t))};
    assert_non_null(x.p);
    return x;
}

static void tset(tens *x, int64_t i, double v) {
    const float f = (float)v;
    if (x->t == VH_DTYPE_BF16)
        ((uint16_t *)x->p)[i] = vh_f32_to_bf16(f);
    else if (x->t == VH_DTYPE_F16)
        ((uint16_t *)x->p)[i] = vh_f32_to_f16(f);
    else
        ((float *)x->p)[i] = f;
}

static double tget(const tens *x, int64_t i) {
    if (x->t == VH_DTYPE_BF16) return vh_bf16_to_f32(((const uint16_t *)x->p)[i]);
    if (x->t == VH_DTYPE_F16) return vh_f16_to_f32(((const uint16_t *)x->p)[i]);
    return ((const float *)x->p)[i];
}

static tens trand(vh_dtype t, int64_t n, double lo, double hi) {
    tens x = tnew(t, n);
    for (int64_t i = 0; i < n; i++) tset(&x, i, lo + (hi - lo) * rnd());
    return x;
}

/* The stored values, in double. */
static double *tvals(const tens *x) {
    double *v = malloc((size_t)(x->n > 0 ? x->n : 1) * sizeof(double));
    assert_non_null(v);
    for (int64_t i = 0; i < x->n; i++) v[i] = tget(x, i);
    return v;
}

static void tfree(tens *x) {
    free(x->p);
    x->p = NULL;
}

static double *dzero(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    assert_non_null(p);
    return p;
}

/* ||got - ref|| / ||ref|| <= tolerance (and every value finite). */
static void check_(const char *what, const tens *got, const double *ref, double tolerance,
                   const char *file, int line) {
    double num = 0, den = 0;
    int64_t worst = 0;
    double worst_err = -1;
    for (int64_t i = 0; i < got->n; i++) {
        const double g = tget(got, i), d = g - ref[i];
        if (!isfinite(g) && isfinite(ref[i])) {
            print_error("%s:%d: %s [%s]: element %lld is %g, expected %g\n", file, line, what,
                        vh_dtype_name(got->t), (long long)i, g, ref[i]);
            fail();
        }
        num += d * d;
        den += ref[i] * ref[i];
        if (fabs(d) > worst_err) worst_err = fabs(d), worst = i;
    }
    const double err = den > 0 ? sqrt(num / den) : sqrt(num);
    if (!(err <= tolerance)) {
        print_error("%s:%d: %s [%s]: normalised error %.3g > %.3g (worst: element %lld is %.9g, "
                    "expected %.9g)\n",
                    file, line, what, vh_dtype_name(got->t), err, tolerance, (long long)worst,
                    tget(got, worst), ref[worst]);
        fail();
    }
}
#define check(what, got, ref, tolerance) check_(what, got, ref, tolerance, __FILE__, __LINE__)

static int setup(void **state) {
    (void)state;
    ops = vh_cpu_device_ops();
    return ops ? 0 : -1;
}

/* ---- GEMM ------------------------------------------------------------------- */

static double ref_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }

static double ref_gelu_grad(double x) {
    return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2.0 * 3.14159265358979323846);
}

typedef struct gemm_case {
    int ta, tb;
    int64_t m, n, k, batch;
    float alpha, beta;
    int bias;
    int gelu; /* the vh_epilogue: 1 GELU, 2 GELU_GRAD (aux = gelu'), 3 MUL_AUX (C = T aux) */
    int aux, res, res_is_c, broadcast_a;
    int dense; /* ldc = n (gemm.c's bands need it); otherwise C's rows are padded */
} gemm_case;

static void run_gemm(const gemm_case *gc, vh_dtype ab, vh_dtype ct, vh_dtype bt) {
    const int64_t m = gc->m, n = gc->n, k = gc->k, pad = 3;
    const int64_t bc = gc->batch > 1 ? gc->batch : 1;
    const int64_t lda = (gc->ta ? m : k) + pad, ldb = (gc->tb ? k : n) + 1;
    const int64_t ldc = n + (gc->dense ? 0 : 2);
    const int64_t sa = gc->broadcast_a ? 0 : (gc->ta ? k : m) * lda + 5;
    const int64_t sb = (gc->tb ? n : k) * ldb, sc = m * ldc + 7;
    tens a = trand(ab, (gc->broadcast_a ? 1 : bc) * ((gc->ta ? k : m) * lda + 5), -1, 1);
    tens b = trand(ab, bc * sb, -1, 1);
    tens c = trand(ct, bc * sc, -1, 1), aux = trand(ct, bc * sc, -1, 1);
    tens res = trand(ct, bc * sc, -1, 1), bias = trand(bt, n, -1, 1);
    double *av = tvals(&a), *bv = tvals(&b), *cv = tvals(&c), *auxv = tvals(&aux);
    double *rv = gc->res_is_c ? tvals(&c) : tvals(&res), *biasv = tvals(&bias);
    double *want = tvals(&c), *want_aux = tvals(&aux);
    for (int64_t q = 0; q < bc; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double t = 0;
                for (int64_t l = 0; l < k; l++) {
                    const double x = av[q * sa + (gc->ta ? l * lda + i : i * lda + l)];
                    const double y = bv[q * sb + (gc->tb ? j * ldb + l : l * ldb + j)];
                    t += x * y;
                }
                t = gc->alpha * t + (gc->bias ? biasv[j] : 0.0);
                const int64_t ci = q * sc + i * ldc + j;
                const int gelu = gc->gelu == VH_EPILOGUE_GELU || gc->gelu == VH_EPILOGUE_GELU_GRAD;
                double v = gelu ? ref_gelu(t) : gc->gelu == VH_EPILOGUE_MUL_AUX ? t * auxv[ci] : t;
                if (gc->res) v += rv[ci];
                if (gc->beta != 0.0f) v += gc->beta * cv[ci];
                want[ci] = v;
                if (gc->gelu == VH_EPILOGUE_GELU && gc->aux) want_aux[ci] = t;
                if (gc->gelu == VH_EPILOGUE_GELU_GRAD && gc->aux) want_aux[ci] = ref_gelu_grad(t);
            }
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = gc->ta, .trans_b = gc->tb, .m = m,
                      .n = n, .k = k, .alpha = gc->alpha, .beta = gc->beta, .a = a.p,
                      .lda = lda, .stride_a = sa, .b = b.p, .ldb = ldb, .stride_b = sb,
                      .c = c.p, .ldc = ldc, .stride_c = sc, .batch = gc->batch,
                      .bias = gc->bias ? bias.p : NULL, .ab_dtype = ab, .c_dtype = ct,
                      .bias_dtype = bt,
                      .epilogue = gc->gelu, .aux = gc->aux ? aux.p : NULL,
                      .residual = gc->res ? (gc->res_is_c ? c.p : res.p) : NULL};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    char what[160];
    snprintf(what, sizeof what,
             "gemm %s->%s ta=%d tb=%d %lldx%lldx%lld batch=%lld alpha=%g beta=%g bias=%d gelu=%d "
             "aux=%d res=%d%s%s",
             vh_dtype_name(ab), vh_dtype_name(ct), gc->ta, gc->tb, (long long)m, (long long)n,
             (long long)k, (long long)gc->batch, (double)gc->alpha, (double)gc->beta, gc->bias,
             gc->gelu, gc->aux, gc->res, gc->res_is_c ? "(C)" : "",
             gc->broadcast_a ? " A broadcast" : "");
    check(what, &c, want, tol(ct));
    check(what, &aux, want_aux, tol(ct));
    tfree(&a), tfree(&b), tfree(&c), tfree(&aux), tfree(&res), tfree(&bias);
    free(av), free(bv), free(cv), free(auxv), free(rv), free(biasv), free(want), free(want_aux);
}

static const gemm_case kGemmCases[] = {
    /* ta tb  m   n   k  batch alpha beta bias gelu aux res res_is_c bcast dense */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.0f, 1, 0, 0, 0, 0, 0, 0}, /* linear forward */
    {0, 0, 23, 19, 37, 1, 1.0f, 0.0f, 0, 0, 0, 0, 0, 0, 0}, /* dX */
    {1, 0, 23, 19, 37, 1, 1.0f, 1.0f, 0, 0, 0, 0, 0, 0, 0}, /* dW += */
    {1, 1, 23, 19, 37, 1, 0.5f, 0.25f, 0, 0, 0, 0, 0, 0, 0},
    {0, 1, 23, 19, 37, 1, 1.0f, 0.0f, 1, 1, 1, 0, 0, 0, 0}, /* fc1: GELU + aux */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.0f, 1, 1, 0, 0, 0, 0, 0}, /* fc1, no aux (eval) */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.0f, 1, 0, 0, 1, 0, 0, 0}, /* proj + residual */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.0f, 1, 0, 0, 1, 1, 0, 0}, /* x = x + proj(...) */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.5f, 1, 1, 1, 1, 0, 0, 0}, /* everything at once */
    {0, 1, 23, 19, 37, 1, 0.75f, 0.0f, 1, 1, 0, 1, 0, 0, 0}, /* alpha != 1 with bias */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.5f, 1, 1, 0, 1, 0, 0, 0},  /* GELU, then beta C + residual */
    {0, 1, 13, 11, 17, 3, 0.25f, 0.0f, 0, 0, 0, 0, 0, 0, 0}, /* attention-like batch */
    {0, 0, 13, 11, 17, 3, 1.0f, 1.0f, 1, 1, 1, 1, 1, 0, 0},
    {1, 0, 13, 11, 17, 3, 1.0f, 0.0f, 0, 0, 0, 1, 0, 1, 0}, /* one A for every member */
    {0, 1, 13, 11, 0, 2, 1.0f, 0.5f, 1, 1, 1, 1, 0, 0, 0},  /* k = 0 */
    {0, 1, 200, 96, 64, 1, 1.0f, 0.0f, 1, 1, 1, 1, 0, 0, 0}, /* threaded passes */
    {1, 0, 9, 12, 2048, 1, 1.0f, 1.0f, 0, 0, 0, 0, 0, 0, 0}, /* small dW +=: k in halves */
    {1, 1, 8, 6, 4096, 1, 0.5f, 0.25f, 0, 0, 0, 0, 0, 0, 0}, /* the same, B^T, alpha, beta */
    {1, 0, 9, 12, 2049, 1, 1.0f, 1.0f, 0, 0, 0, 0, 0, 0, 0}, /* odd k: one product */
    /* ABI 2.5: gelu'(T) into aux (2), and C = T * aux (3) */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.0f, 1, 2, 1, 0, 0, 0, 0}, /* fc1 keeping gelu' */
    {0, 1, 23, 19, 37, 1, 1.0f, 0.0f, 1, 2, 0, 0, 0, 0, 0}, /* no aux: a GELU */
    {0, 1, 23, 19, 37, 1, 0.75f, 0.5f, 1, 2, 1, 1, 0, 0, 0}, /* everything at once */
    {0, 0, 13, 11, 17, 3, 1.0f, 1.0f, 1, 2, 1, 1, 1, 0, 0},
    {0, 1, 200, 96, 64, 1, 1.0f, 0.0f, 1, 2, 1, 0, 0, 0, 0}, /* threaded */
    {0, 0, 23, 19, 37, 1, 1.0f, 0.0f, 0, 3, 1, 0, 0, 0, 0}, /* fc2's dX times gelu' */
    {0, 0, 23, 19, 37, 1, 0.5f, 0.5f, 1, 3, 1, 1, 0, 0, 0}, /* everything at once */
    {0, 0, 23, 19, 37, 1, 1.0f, 0.0f, 1, 3, 1, 1, 0, 0, 0}, /* the product, then the residual */
    {0, 0, 23, 19, 37, 1, 1.0f, 0.0f, 1, 3, 1, 1, 1, 0, 0}, /* the residual is C */
    {0, 0, 13, 11, 17, 3, 1.0f, 1.0f, 1, 3, 1, 1, 0, 0, 0}, /* batched */
    {0, 1, 13, 11, 0, 2, 1.0f, 0.5f, 1, 3, 1, 1, 0, 0, 0},  /* k = 0 */
    {0, 0, 200, 96, 64, 1, 1.0f, 0.0f, 0, 3, 1, 0, 0, 0, 0}, /* threaded */
    /* fp32's bands of rows (gemm.c's run_bands: dense C, B within L2; T * aux
     * in bands of at least 16 MFLOP, here 128 rows of 384 x 192): two full
     * bands and a short one (300 rows), one short band (100), under a band
     * (7). A band may sum in another order than one call (oneDNN's AVX2
     * kernels block k by m), so they are held to float64 like every case. */
    {0, 1, 300, 384, 192, 1, 1.0f, 0.0f, 1, 2, 1, 0, 0, 0, 1}, /* fc1 keeping gelu' */
    {0, 1, 100, 384, 192, 1, 1.0f, 0.0f, 1, 2, 1, 0, 0, 0, 1},
    {0, 1, 7, 384, 192, 1, 1.0f, 0.0f, 1, 2, 1, 0, 0, 0, 1},
    {0, 1, 300, 384, 192, 1, 1.0f, 0.0f, 1, 1, 1, 0, 0, 0, 1}, /* fc1 keeping T */
    {0, 0, 300, 384, 192, 1, 1.0f, 0.0f, 0, 3, 1, 0, 0, 0, 1}, /* fc2's dX times gelu' */
    {0, 0, 100, 384, 192, 1, 1.0f, 0.0f, 0, 3, 1, 0, 0, 0, 1},
    {0, 0, 7, 384, 192, 1, 1.0f, 0.0f, 0, 3, 1, 0, 0, 0, 1},
};

static void test_gemm_dtypes(void **state) {
    (void)state;
    rng_state = 101;
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof kGemmCases / sizeof *kGemmCases; i++)
            run_gemm(&kGemmCases[i], kTypes[t], kTypes[t], kTypes[t]);
    /* Low-precision operands into fp32 results and fp32 bias (gradients kept
     * in fp32), and fp32 operands into a bf16 result. */
    for (size_t i = 0; i < sizeof kGemmCases / sizeof *kGemmCases; i++) {
        run_gemm(&kGemmCases[i], VH_DTYPE_BF16, VH_DTYPE_F32, VH_DTYPE_F32);
        run_gemm(&kGemmCases[i], VH_DTYPE_F16, VH_DTYPE_F32, VH_DTYPE_F32);
        run_gemm(&kGemmCases[i], VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F32);
    }
}

/* The GEMM's products of bf16 values are exact in fp32: 8-bit significands
 * whose products fit 16 bits. With small integers, so that every partial sum
 * is exact too, the result is exact whatever the route (bf16 hardware or
 * conversion to f32), and equal to the double reference bit for bit. */
static void test_gemm_bf16_exact(void **state) {
    (void)state;
    const int64_t m = 31, n = 17, k = 45;
    tens a = tnew(VH_DTYPE_BF16, m * k), b = tnew(VH_DTYPE_BF16, k * n);
    tens c = tnew(VH_DTYPE_F32, m * n);
    for (int64_t i = 0; i < m * k; i++) tset(&a, i, (double)((int)(i * 37 % 255) - 127));
    for (int64_t i = 0; i < k * n; i++) tset(&b, i, (double)((int)(i * 11 % 127) - 63) / 64.0);
    vh_gemm_args g = {.struct_size = sizeof g, .trans_b = 0, .m = m, .n = n, .k = k,
                      .alpha = 1.0f, .a = a.p, .lda = k, .b = b.p, .ldb = n, .c = c.p,
                      .ldc = n, .ab_dtype = VH_DTYPE_BF16};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++) s += tget(&a, i * k + l) * tget(&b, l * n + j);
            assert_true(tget(&c, i * n + j) == s);
        }
    tfree(&a), tfree(&b), tfree(&c);
}

/* ---- gelu'(T) kept from forward (ABI 2.5) -----------------------------------
 * In fp32, the model's two routes to the GELU's input gradient give the same
 * numbers: gelu_backward(T, D) with overwrite against D * aux, aux from a
 * VH_EPILOGUE_GELU_GRAD GEMM (C = gelu(T) the same bits as VH_EPILOGUE_GELU);
 * and a VH_EPILOGUE_MUL_AUX GEMM against the plain GEMM, then mul. Dense (the
 * model's tensors: oneDNN's binary post-op, the threaded passes), strided and
 * batched (route 2's rows). Compared as values: the sign of a zero product may
 * differ (0 + -0 is +0). */
static void assert_f32_values_equal(const char *what, const float *x, const float *y,
                                    int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!(x[i] == y[i]) && !(x[i] != x[i] && y[i] != y[i]))
            fail_msg("%s: element %lld differs: %.9g against %.9g", what, (long long)i,
                     (double)x[i], (double)y[i]);
}

/* An epilogue that reads aux is refused without aux, or with aux = C (C's
 * stores would overwrite it under the reads); taken otherwise. */
static void assert_aux_checked(vh_epilogue epilogue) {
    tens a = trand(VH_DTYPE_F32, 16, -1, 1), c = tnew(VH_DTYPE_F32, 16);
    vh_gemm_args g = {.struct_size = sizeof g, .m = 4, .n = 4, .k = 4, .alpha = 1.0f, .a = a.p,
                      .lda = 4, .b = a.p, .ldb = 4, .c = c.p, .ldc = 4, .epilogue = epilogue};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_ERR_INVALID_ARG);
    g.aux = c.p;
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_ERR_INVALID_ARG);
    g.aux = a.p;
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    tfree(&a), tfree(&c);
}

static void gelu_grad_route_case(int64_t batch, int64_t m, int64_t n, int64_t k, int64_t pad) {
    const int64_t ldc = n + pad, sc = m * ldc, bc = batch > 1 ? batch : 1, len = bc * sc;
    tens a = trand(VH_DTYPE_F32, bc * m * k, -1, 1), b = trand(VH_DTYPE_F32, bc * k * n, -1, 1);
    tens bias = trand(VH_DTYPE_F32, n, -1, 1), d = trand(VH_DTYPE_F32, len, -1, 1);
    tens pre = tnew(VH_DTYPE_F32, len), grad = tnew(VH_DTYPE_F32, len);
    tens c1 = tnew(VH_DTYPE_F32, len), c2 = tnew(VH_DTYPE_F32, len);
    tens dx1 = tnew(VH_DTYPE_F32, len), dx2 = tnew(VH_DTYPE_F32, len);
    vh_gemm_args g = {.struct_size = sizeof g, .trans_b = 1, .m = m, .n = n, .k = k,
                      .alpha = 1.0f, .a = a.p, .lda = k, .stride_a = m * k, .b = b.p, .ldb = k,
                      .stride_b = k * n, .c = c1.p, .ldc = ldc, .stride_c = sc, .batch = batch,
                      .bias = bias.p, .epilogue = VH_EPILOGUE_GELU, .aux = pre.p};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    g.c = c2.p, g.epilogue = VH_EPILOGUE_GELU_GRAD, g.aux = grad.p;
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    char what[96];
    snprintf(what, sizeof what, "%lld x %lldx%lldx%lld ldc +%lld", (long long)batch, (long long)m,
             (long long)n, (long long)k, (long long)pad);
    for (int64_t i = 0; i < len; i++) /* the rows' padding: not written by either */
        if (i % ldc >= n) ((float *)pre.p)[i] = ((float *)grad.p)[i] = 0.0f;
    assert_f32_values_equal(what, c1.p, c2.p, len);
    vh_eltwise_args e = {.struct_size = sizeof e, .n = len, .dtype = VH_DTYPE_F32, .x = pre.p,
                         .dout = d.p, .dx = dx1.p, .overwrite = 1};
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    vh_eltwise_args e2 = {.struct_size = sizeof e2, .n = len, .dtype = VH_DTYPE_F32, .a = d.p,
                          .b = grad.p, .out = dx2.p};
    assert_int_equal(ops->mul(ops->device, &e2), VH_STATUS_OK);
    for (int64_t i = 0; i < len; i++)
        if (i % ldc >= n) ((float *)dx1.p)[i] = ((float *)dx2.p)[i] = 0.0f;
    assert_f32_values_equal(what, dx1.p, dx2.p, len);
    /* fc2's dX: T = A B (m x n from k), then T * aux, in one GEMM or two ops */
    vh_gemm_args h = {.struct_size = sizeof h, .m = m, .n = n, .k = k, .alpha = 1.0f,
                      .a = a.p, .lda = k, .stride_a = m * k, .b = b.p, .ldb = n,
                      .stride_b = k * n, .c = c1.p, .ldc = ldc, .stride_c = sc, .batch = batch};
    assert_int_equal(ops->gemm(ops->device, &h), VH_STATUS_OK);
    e2.a = c1.p, e2.out = dx1.p;
    assert_int_equal(ops->mul(ops->device, &e2), VH_STATUS_OK);
    h.c = c2.p, h.epilogue = VH_EPILOGUE_MUL_AUX, h.aux = grad.p;
    assert_int_equal(ops->gemm(ops->device, &h), VH_STATUS_OK);
    for (int64_t i = 0; i < len; i++)
        if (i % ldc >= n) ((float *)dx1.p)[i] = ((float *)c2.p)[i] = 0.0f;
    assert_f32_values_equal(what, dx1.p, c2.p, len);
    tfree(&a), tfree(&b), tfree(&bias), tfree(&d), tfree(&pre), tfree(&grad);
    tfree(&c1), tfree(&c2), tfree(&dx1), tfree(&dx2);
}

/* ---- gelu_backward in the GEMM (ABI 2.7) ------------------------------------
 * A VH_EPILOGUE_GELU_BACKWARD GEMM gives the bits of the same GEMM without
 * epilogue into C, then gelu_backward with overwrite (x = aux, dout = C), in
 * every dtype: dense bf16 (AMP's fc2 dX: bands of rows, each pass from the
 * thread's own fp32 T), and strided, batched, f32 and f16 (route 2's rows).
 * The rows' padding is left out. T's values are those a step gives, and
 * aux's reach both tails of the GELU. */
static void gelu_backward_route_case(vh_dtype t, int64_t batch, int64_t m, int64_t n, int64_t k,
                                     int64_t pad) {
    const int64_t ldc = n + pad, sc = m * ldc, bc = batch > 1 ? batch : 1, len = bc * sc;
    tens a = trand(t, bc * m * k, -1, 1), b = trand(t, bc * k * n, -1, 1);
    tens bias = trand(VH_DTYPE_F32, n, -0.5, 0.5), pre = trand(t, len, -6, 6);
    tens c1 = tnew(t, len), c2 = tnew(t, len), dx1 = tnew(t, len);
    vh_gemm_args h = {.struct_size = sizeof h, .m = m, .n = n, .k = k, .alpha = 1.0f,
                      .a = a.p, .lda = k, .stride_a = m * k, .b = b.p, .ldb = n,
                      .stride_b = k * n, .c = c1.p, .ldc = ldc, .stride_c = sc, .batch = batch,
                      .bias = bias.p, .ab_dtype = t, .c_dtype = t, .bias_dtype = VH_DTYPE_F32};
    assert_int_equal(ops->gemm(ops->device, &h), VH_STATUS_OK);
    vh_eltwise_args e = {.struct_size = sizeof e, .n = len, .dtype = t, .x = pre.p,
                         .dout = c1.p, .dx = dx1.p, .overwrite = 1};
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    h.c = c2.p, h.epilogue = VH_EPILOGUE_GELU_BACKWARD, h.aux = pre.p;
    assert_int_equal(ops->gemm(ops->device, &h), VH_STATUS_OK);
    for (int64_t i = 0; i < len; i++) {
        if (i % ldc >= n) continue;
        const double want = tget(&dx1, i), got = tget(&c2, i);
        if (!(want == got) && !(want != want && got != got))
            fail_msg("%s %lld x %lldx%lldx%lld ldc +%lld: element %lld: %.9g against %.9g "
                     "(x %.9g, dout %.9g)",
                     t == VH_DTYPE_F32 ? "f32" : t == VH_DTYPE_BF16 ? "bf16" : "f16",
                     (long long)batch, (long long)m, (long long)n, (long long)k, (long long)pad,
                     (long long)i, got, want, tget(&pre, i), tget(&c1, i));
    }
    tfree(&a), tfree(&b), tfree(&bias), tfree(&pre), tfree(&c1), tfree(&c2), tfree(&dx1);
}

static void test_gemm_gelu_backward_routes(void **state) {
    (void)state;
    rng_state = 271;
    const vh_gemm_epilogue_ext *ext =
        ops->get_extension(ops->device, VH_GEMM_EPILOGUE_EXTENSION);
    assert_non_null(ext);
    assert_true(ext->epilogues & (1u << VH_EPILOGUE_GELU_BACKWARD));
    for (int ti = 0; ti < 3; ti++) {
        gelu_backward_route_case(kTypes[ti], 1, 640, 256, 64, 0); /* T1's fc2 dX, a tenth */
        gelu_backward_route_case(kTypes[ti], 1, 200, 41, 23, 0);  /* bands of 128 and 72 */
        gelu_backward_route_case(kTypes[ti], 1, 37, 19, 23, 3);
        gelu_backward_route_case(kTypes[ti], 3, 13, 11, 17, 0);
    }
    assert_aux_checked(VH_EPILOGUE_GELU_BACKWARD);
}

/* ---- AMP fc1's GELU pass, bit for bit -----------------------------------------
 * A bf16 GEMM with VH_EPILOGUE_GELU into a bf16 C and aux (the model's fc1
 * under AMP: one pass from the fp32 T, gelu16.c's on a CPU with AVX512-BF16)
 * gives the bits of rounding T, and the fp32 gelu_forward op's GELU of T,
 * to bf16 (the SDK's cast). T is exact: k = 2, each product of two bf16
 * values (16 significant bits) and the second at most 2^-5 of the first,
 * so their sum fits an f32. Rows of special values too (a single product):
 * NaN (GELU: any NaN), infinities, signed zeros, T past the exponential's
 * underflow (-13.2); and columns whose GELUs are subnormal (the bf16
 * instruction reads subnormals as zero; a subnormal T itself cannot be
 * asked for here: oneDNN's products flush it to zero). */
static void test_gemm_gelu_bf16_bits(void **state) {
    (void)state;
    rng_state = 2027;
    /* two bands of rows (128 and 72), the second's 2952 values, and the whole
     * call's last block of 8, not a multiple of 32 (the portable loop's tail) */
    const int64_t m = 200, n = 41, k = 2;
    tens a = tnew(VH_DTYPE_BF16, m * k), b = tnew(VH_DTYPE_BF16, k * n);
    for (int64_t j = 0; j < n; j++) {
        tset(&b, j, 1.0 + rnd());
        tset(&b, n + j, (1.0 + rnd()) * 0x1p-6);
    }
    static const double special[] = {NAN,      INFINITY, -INFINITY, 0.0,   -0.0,
                                     0x1p-120, -13.1,    -13.25,    -20.0, 50.0};
    const int nspecial = (int)(sizeof special / sizeof special[0]);
    for (int64_t i = 0; i < m; i++) {
        double a0, a1;
        if (i < nspecial) {
            a0 = special[i], a1 = 0.0;
        } else {
            const double mag = ldexp(1.0 + rnd(), (int)(rnd() * 7) - 3);
            a0 = rnd() < 0.5 ? -mag : mag;
            a1 = (rnd() < 0.5 ? -1.0 : 1.0) * mag * (0.5 + 0.5 * rnd());
        }
        tset(&a, i * k, a0);
        tset(&a, i * k + 1, a1);
    }
    for (int64_t j = 0; j < n; j += 7) /* subnormal GELUs from normal T: T near 2^-125 */
        tset(&b, j, 0x1p-123), tset(&b, n + j, 0.0);
    tens t = tnew(VH_DTYPE_F32, m * n), gelu = tnew(VH_DTYPE_F32, m * n);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const double a0 = tget(&a, i * k), a1 = tget(&a, i * k + 1);
            const double s = a0 * tget(&b, j) + (a1 != 0.0 ? a1 * tget(&b, n + j) : 0.0);
            ((float *)t.p)[i * n + j] = (float)s;
            assert_true(i < nspecial || (double)(float)s == s); /* exact in f32 */
        }
    vh_eltwise_args e = {.struct_size = sizeof e, .n = m * n, .dtype = VH_DTYPE_F32,
                         .x = t.p, .out = gelu.p};
    assert_int_equal(ops->gelu_forward(ops->device, &e), VH_STATUS_OK);
    tens c = tnew(VH_DTYPE_BF16, m * n), aux = tnew(VH_DTYPE_BF16, m * n);
    vh_gemm_args g = {.struct_size = sizeof g, .m = m, .n = n, .k = k, .alpha = 1.0f,
                      .a = a.p, .lda = k, .b = b.p, .ldb = n, .c = c.p, .ldc = n,
                      .ab_dtype = VH_DTYPE_BF16, .c_dtype = VH_DTYPE_BF16,
                      .epilogue = VH_EPILOGUE_GELU, .aux = aux.p};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    for (int64_t i = 0; i < m * n; i++) {
        const float tv = ((float *)t.p)[i], gv = ((float *)gelu.p)[i];
        const uint16_t want_aux = vh_f32_to_bf16(tv), want_c = vh_f32_to_bf16(gv);
        const uint16_t got_aux = ((uint16_t *)aux.p)[i], got_c = ((uint16_t *)c.p)[i];
        /* GELU of a NaN: a NaN, whose sign follows the order of the operands in
         * each build's code (a Debug build's fp32 loop gives -NaN for +NaN) */
        const int nan_ok = isnan(gv) && (got_c & 0x7f80) == 0x7f80 && (got_c & 0x7f) != 0;
        if (got_aux != want_aux || (got_c != want_c && !nan_ok))
            fail_msg("element %lld, T = %a: aux %#06x (want %#06x), gelu %#06x (want %#06x of %a)",
                     (long long)i, (double)tv, got_aux, want_aux, got_c, want_c, (double)gv);
    }
    tfree(&a), tfree(&b), tfree(&t), tfree(&gelu), tfree(&c), tfree(&aux);
}

static void test_gemm_gelu_grad_routes(void **state) {
    (void)state;
    rng_state = 117;
    const vh_gemm_epilogue_ext *ext =
        ops->get_extension(ops->device, VH_GEMM_EPILOGUE_EXTENSION);
    assert_non_null(ext);
    assert_true(ext->struct_size >= sizeof *ext);
    assert_true(ext->epilogues & (1u << VH_EPILOGUE_GELU_GRAD));
    assert_true(ext->epilogues & (1u << VH_EPILOGUE_MUL_AUX));
    gelu_grad_route_case(1, 640, 256, 64, 0); /* T1's fc1 / fc2 dX, a tenth of the rows */
    gelu_grad_route_case(1, 37, 19, 23, 0);
    gelu_grad_route_case(1, 200, 96, 64, 3);
    gelu_grad_route_case(3, 13, 11, 17, 0);
    assert_aux_checked(VH_EPILOGUE_MUL_AUX);
    /* Refused: an epilogue past 2.7's. */
    tens a = trand(VH_DTYPE_F32, 16, -1, 1), c = tnew(VH_DTYPE_F32, 16);
    vh_gemm_args g = {.struct_size = sizeof g, .m = 4, .n = 4, .k = 4, .alpha = 1.0f, .a = a.p,
                      .lda = 4, .b = a.p, .ldb = 4, .c = c.p, .ldc = 4, .aux = a.p,
                      .epilogue = VH_EPILOGUE_GELU_BACKWARD + 1};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_ERR_INVALID_ARG);
    tfree(&a), tfree(&c);
}

/* ---- layer norm ------------------------------------------------------------- */

static void run_layernorm(vh_dtype t, vh_dtype pt, int64_t rows, int64_t dim) {
    const int64_t n = rows * dim;
    tens x = trand(t, n, -2, 2), w = trand(pt, dim, 0.5, 1.5), b = trand(pt, dim, -0.5, 0.5);
    tens out = trand(t, n, -1, 1), dout = trand(t, n, -1, 1), dx = trand(t, n, -1, 1);
    tens dw = trand(pt, dim, -1, 1), db = trand(pt, dim, -1, 1);
    tens mean = tnew(VH_DTYPE_F32, rows), rstd = tnew(VH_DTYPE_F32, rows);
    double *xv = tvals(&x), *wv = tvals(&w), *bv = tvals(&b), *gv = tvals(&dout);
    double *want = dzero(n), *wmean = dzero(rows), *wrstd = dzero(rows);
    double *wdx = tvals(&dx), *wdw = tvals(&dw), *wdb = tvals(&db);
    for (int64_t r = 0; r < rows; r++) {
        double mu = 0, var = 0;
        for (int64_t j = 0; j < dim; j++) mu += xv[r * dim + j];
        mu /= dim;
        for (int64_t j = 0; j < dim; j++) var += (xv[r * dim + j] - mu) * (xv[r * dim + j] - mu);
        const double s = 1.0 / sqrt(var / dim + 1e-5);
        wmean[r] = mu, wrstd[r] = s;
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < dim; j++) {
            const double xh = (xv[r * dim + j] - mu) * s, g = gv[r * dim + j];
            want[r * dim + j] = xh * wv[j] + bv[j];
            sg += g * wv[j], sgx += g * wv[j] * xh;
            wdw[j] += g * xh, wdb[j] += g;
        }
        for (int64_t j = 0; j < dim; j++) {
            const double xh = (xv[r * dim + j] - mu) * s, g = gv[r * dim + j];
            wdx[r * dim + j] += s * (g * wv[j] - sg / dim - xh * sgx / dim);
        }
    }
    vh_layernorm_args a = {.struct_size = sizeof a, .rows = rows, .dim = dim, .eps = 1e-5f,
                           .dtype = t, .param_dtype = pt, .grad_dtype = pt, .x = x.p,
                           .weight = w.p, .bias = b.p, .mean = mean.p, .rstd = rstd.p,
                           .out = out.p, .dout = dout.p, .dx = dx.p, .dweight = dw.p,
                           .dbias = db.p};
    assert_int_equal(ops->layernorm_forward(ops->device, &a), VH_STATUS_OK);
    check("layernorm out", &out, want, tol(t));
    check("layernorm mean", &mean, wmean, tol(VH_DTYPE_F32));
    check("layernorm rstd", &rstd, wrstd, tol(VH_DTYPE_F32));
    assert_int_equal(ops->layernorm_backward(ops->device, &a), VH_STATUS_OK);
    check("layernorm dx (+=)", &dx, wdx, tol(t));
    check("layernorm dweight (+=)", &dw, wdw, tol(pt));
    check("layernorm dbias (+=)", &db, wdb, tol(pt));
    tfree(&x), tfree(&w), tfree(&b), tfree(&out), tfree(&dout), tfree(&dx), tfree(&dw);
    tfree(&db), tfree(&mean), tfree(&rstd);
    free(xv), free(wv), free(bv), free(gv), free(want), free(wmean), free(wrstd), free(wdx);
    free(wdw), free(wdb);
}

static void test_layernorm_dtypes(void **state) {
    (void)state;
    rng_state = 102;
    for (int t = 0; t < 3; t++) {
        run_layernorm(kTypes[t], kTypes[t], 37, 48);
        run_layernorm(kTypes[t], VH_DTYPE_F32, 37, 48); /* norm parameters kept in fp32 */
        /* Several chunks of the backward's row sums, and a width that leaves
         * a vector tail. */
        run_layernorm(kTypes[t], VH_DTYPE_F32, 131, 50);
    }
}

/* layernorm_avx512.c's rows against the portable loops
 * (VITHOST_CPU_LAYERNORM=portable, read at every call), bit for bit: out,
 * mean, rstd, dx and the parameter gradients, f32 and bf16, at widths of 1
 * to 4 vectors (partials in registers) and more (T3's 384), over chunks
 * and a short one. Where this CPU lacks AVX-512 (and for f32 past width 64)
 * both calls run the loops. */
static void layernorm_routes_case(vh_dtype t, int64_t rows, int64_t dim) {
    const int64_t n = rows * dim;
    tens x = trand(t, n, -3, 3), dout = trand(t, n, -1, 1), dx0 = trand(t, n, -1, 1);
    for (int64_t r = 0; r < rows; r += 5) /* rows far from 0 */
        for (int64_t j = 0; j < dim; j++) tset(&x, r * dim + j, 300.0 + tget(&x, r * dim + j));
    tens w = trand(VH_DTYPE_F32, dim, 0.5, 1.5), b = trand(VH_DTYPE_F32, dim, -0.5, 0.5);
    const size_t es = vh_dtype_size(t);
    tens out[2], dx[2], mean[2], rstd[2], dw[2], db[2];
    for (int v = 0; v < 2; v++) {
        out[v] = tnew(t, n), dx[v] = tnew(t, n);
        memcpy(dx[v].p, dx0.p, (size_t)n * es);
        mean[v] = tnew(VH_DTYPE_F32, rows), rstd[v] = tnew(VH_DTYPE_F32, rows);
        dw[v] = tnew(VH_DTYPE_F32, dim), db[v] = tnew(VH_DTYPE_F32, dim);
        if (v) setenv("VITHOST_CPU_LAYERNORM", "portable", 1);
        vh_layernorm_args a = {.struct_size = sizeof a, .rows = rows, .dim = dim, .eps = 1e-5f,
                               .dtype = t, .param_dtype = VH_DTYPE_F32,
                               .grad_dtype = VH_DTYPE_F32, .x = x.p, .weight = w.p,
                               .bias = b.p, .mean = mean[v].p, .rstd = rstd[v].p,
                               .out = out[v].p, .dout = dout.p, .dx = dx[v].p,
                               .dweight = dw[v].p, .dbias = db[v].p};
        assert_int_equal(ops->layernorm_forward(ops->device, &a), VH_STATUS_OK);
        assert_int_equal(ops->layernorm_backward(ops->device, &a), VH_STATUS_OK);
        unsetenv("VITHOST_CPU_LAYERNORM");
    }
    const struct { const char *name; tens *v; size_t bytes; } parts[] = {
        {"out", out, (size_t)n * es},           {"dx (+=)", dx, (size_t)n * es},
        {"mean", mean, (size_t)rows * 4},       {"rstd", rstd, (size_t)rows * 4},
        {"dweight (+=)", dw, (size_t)dim * 4},  {"dbias (+=)", db, (size_t)dim * 4}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (memcmp(parts[i].v[0].p, parts[i].v[1].p, parts[i].bytes))
            fail_msg("layernorm %s %lld x %lld: %s differs between the AVX-512 rows and the "
                     "portable loops", vh_dtype_name(t), (long long)rows, (long long)dim,
                     parts[i].name);
    for (int v = 0; v < 2; v++) {
        tfree(&out[v]), tfree(&dx[v]), tfree(&mean[v]), tfree(&rstd[v]);
        tfree(&dw[v]), tfree(&db[v]);
    }
    tfree(&x), tfree(&dout), tfree(&dx0), tfree(&w), tfree(&b);
}

static void test_layernorm_routes(void **state) {
    (void)state;
    rng_state = 1021;
    static const vh_dtype types[2] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    static const int64_t shapes[][2] = {{3, 16}, {203, 32}, {150, 48}, {203, 64},
                                        {67, 128}, {130, 192}, {70, 384}, {45, 40}};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            layernorm_routes_case(types[t], shapes[i][0], shapes[i][1]);
}

/* ---- element-wise ------------------------------------------------------------- */

static void test_eltwise_dtypes(void **state) {
    (void)state;
    rng_state = 103;
    const int64_t sizes[2] = {3001, 70001}; /* serial, threaded */
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 2; s++) {
            const vh_dtype dt = kTypes[t];
            const int64_t n = sizes[s];
            tens x = trand(dt, n, -4, 4), y = trand(dt, n, -1, 1), out = trand(dt, n, -1, 1);
            tens dx = trand(dt, n, -1, 1);
            double *xv = tvals(&x), *yv = tvals(&y), *want = tvals(&dx);
            vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = dt, .x = x.p,
                                 .a = x.p, .b = y.p, .dout = y.p, .out = out.p, .dx = dx.p};
            assert_int_equal(ops->gelu_forward(ops->device, &e), VH_STATUS_OK);
            double *w2 = dzero(n);
            for (int64_t i = 0; i < n; i++) w2[i] = ref_gelu(xv[i]);
            check("gelu", &out, w2, tol(dt));
            for (int64_t i = 0; i < n; i++) want[i] += yv[i] * ref_gelu_grad(xv[i]);
            assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
            check("gelu backward (+=)", &dx, want, tol(dt));

            for (int64_t i = 0; i < n; i++) w2[i] = xv[i] + yv[i];
            assert_int_equal(ops->add(ops->device, &e), VH_STATUS_OK);
            check("add", &out, w2, tol(dt));
            for (int64_t i = 0; i < n; i++) w2[i] = xv[i] * yv[i];
            assert_int_equal(ops->mul(ops->device, &e), VH_STATUS_OK);
            check("mul", &out, w2, tol(dt));
            double *ov = tvals(&out);
            for (int64_t i = 0; i < n; i++) w2[i] = ov[i] + xv[i] * yv[i];
            e.accumulate = 1;
            assert_int_equal(ops->mul(ops->device, &e), VH_STATUS_OK);
            check("mul (+=)", &out, w2, tol(dt));
            e.accumulate = 0;
            /* in place: out aliases a */
            for (int64_t i = 0; i < n; i++) w2[i] = xv[i] + yv[i];
            e.out = x.p;
            assert_int_equal(ops->add(ops->device, &e), VH_STATUS_OK);
            check("add in place", &x, w2, tol(dt));
            tfree(&x), tfree(&y), tfree(&out), tfree(&dx);
            free(xv), free(yv), free(want), free(w2), free(ov);
        }
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void test_dropout_scale_rows_dtypes(void **state) {
    (void)state;
    rng_state = 104;
    for (int t = 0; t < 3; t++) {
        const vh_dtype dt = kTypes[t];
        const int64_t n = 40000;
        const float p = 0.25f;
        tens x = trand(dt, n, -1, 1), out = tnew(dt, n), mask = tnew(dt, n);
        double *xv = tvals(&x), *wout = dzero(n), *wmask = dzero(n);
        /* vh_device.h's formula, as any device must draw it */
        const uint64_t key = mix64(77);
        for (int64_t i = 0; i < n; i++) {
            const double u =
                (double)(mix64(key + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull) >> 40) * 0x1p-24;
            wmask[i] = u >= p ? 1.0 / (1.0 - p) : 0.0;
            wout[i] = xv[i] * wmask[i];
        }
        vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = dt, .x = x.p,
                             .out = out.p, .mask = mask.p, .p = p, .seed = 77};
        assert_int_equal(ops->dropout_forward(ops->device, &e), VH_STATUS_OK);
        check("dropout out", &out, wout, tol(dt));
        check("dropout mask", &mask, wmask, tol(dt));

        /* scale_rows, batch-first (div = N) and batch-second (div = 1) */
        const int64_t B = 3, N = 5, D = 40, rows = B * N;
        const float scale[3] = {0.0f, 1.25f, 0.6f};
        for (int layout = 0; layout < 2; layout++) {
            tens in = trand(dt, rows * D, -1, 1), o = trand(dt, rows * D, -1, 1);
            double *iv = tvals(&in), *ov = tvals(&o), *w = dzero(rows * D);
            vh_eltwise_args s = {.struct_size = sizeof s, .n = rows * D, .dtype = dt,
                                 .x = in.p, .out = o.p, .scale = scale, .dim = D,
                                 .div = layout ? 1 : N, .mod = B, .accumulate = 1};
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < D; j++)
                    w[r * D + j] = ov[r * D + j] + iv[r * D + j] * scale[(r / s.div) % B];
            assert_int_equal(ops->scale_rows(ops->device, &s), VH_STATUS_OK);
            check("scale_rows (+=)", &o, w, tol(dt));
            s.accumulate = 0;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < D; j++)
                    w[r * D + j] = iv[r * D + j] * scale[(r / s.div) % B];
            assert_int_equal(ops->scale_rows(ops->device, &s), VH_STATUS_OK);
            check("scale_rows", &o, w, tol(dt));
            tfree(&in), tfree(&o), free(iv), free(ov), free(w);
        }
        tfree(&x), tfree(&out), tfree(&mask), free(xv), free(wout), free(wmask);
    }
}

/* ---- 16-bit storage: the fp32 op on the widened values, rounded once -----------------
 * The element-wise ops convert piece by piece and the row-wise ones a block of
 * rows at a time (ops.c, layernorm.c): the same fp32 kernel on the same
 * widened values, so the result must be the fp32 op's, rounded once, bit for
 * bit. Sizes span many pieces, chunks and both threads. */

static uint16_t *to16(vh_dtype t, const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    assert_non_null(h);
    for (int64_t i = 0; i < n; i++) h[i] = t == VH_DTYPE_BF16 ? vh_f32_to_bf16(x[i]) : vh_f32_to_f16(x[i]);
    return h;
}

static float *widened(vh_dtype t, const uint16_t *h, int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = t == VH_DTYPE_BF16 ? vh_bf16_to_f32(h[i]) : vh_f16_to_f32(h[i]);
    return x;
}

static float *frand(int64_t n, double lo, double hi) {
    float *x = malloc((size_t)n * sizeof(float));
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rnd());
    return x;
}

/* out16 (n values of t) must be the f32 result rounded to t. */
static void assert_rounded(const char *what, vh_dtype t, const uint16_t *out16, const float *f32,
                           int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const uint16_t want = t == VH_DTYPE_BF16 ? vh_f32_to_bf16(f32[i]) : vh_f32_to_f16(f32[i]);
        if (out16[i] != want) fail_msg("%s: element %lld is 0x%04x, want 0x%04x", what, (long long)i, out16[i], want);
    }
}

static void gelu_backward_16(vh_dtype t, int64_t n) {
    float *x = frand(n, -4, 4), *g = frand(n, -1, 1), *d = frand(n, -1, 1);
    uint16_t *x16 = to16(t, x, n), *g16 = to16(t, g, n), *d16 = to16(t, d, n);
    float *xw = widened(t, x16, n), *gw = widened(t, g16, n), *dw = widened(t, d16, n);
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = t, .x = x16, .dout = g16, .dx = d16};
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    e.dtype = VH_DTYPE_F32, e.x = xw, e.dout = gw, e.dx = dw;
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    assert_rounded("gelu_backward", t, d16, dw, n);
    vh_eltwise_args f = {.struct_size = sizeof f, .n = n, .dtype = t, .x = x16, .out = g16};
    assert_int_equal(ops->gelu_forward(ops->device, &f), VH_STATUS_OK);
    f.dtype = VH_DTYPE_F32, f.x = xw, f.out = gw;
    assert_int_equal(ops->gelu_forward(ops->device, &f), VH_STATUS_OK);
    assert_rounded("gelu_forward", t, g16, gw, n);
    free(x), free(g), free(d), free(x16), free(g16), free(d16), free(xw), free(gw), free(dw);
}

/* bf16 gelu_backward reads gelu'(x) from a table of all 65536 x or computes it, whichever
 * is faster here (gelu_grad16.c; ctest forces each): every bit pattern of x (Inf,
 * subnormals, both zeros; NaN: any NaN), twice over with other douts, against the fp32 op on
 * the widened values rounded once; adding and overwriting, from a word boundary (the
 * gathered pairs) and one element off it (the unpaired loop); overwriting, the GEMM's
 * GELU_BACKWARD epilogue too. */
static void gelu_backward_every_bf16(int overwrite, int64_t skew) {
    const int64_t n = 2 * 65536 + 37;
    float *g = frand(n + skew, -2, 2), *d = frand(n + skew, -1, 1);
    uint16_t *x16 = malloc((size_t)(n + skew) * 2);
    assert_non_null(x16);
    for (int64_t i = 0; i < n + skew; i++)
        x16[i] = (uint16_t)(i < 65536 + skew ? i - skew : (i * 40503) & 0xffff);
    uint16_t *g16 = to16(VH_DTYPE_BF16, g, n + skew), *d16 = to16(VH_DTYPE_BF16, d, n + skew);
    float *xw = widened(VH_DTYPE_BF16, x16 + skew, n), *gw = widened(VH_DTYPE_BF16, g16 + skew, n);
    float *dw = widened(VH_DTYPE_BF16, d16 + skew, n);
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = VH_DTYPE_BF16, .x = x16 + skew,
                         .dout = g16 + skew, .dx = d16 + skew, .overwrite = overwrite};
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    e.dtype = VH_DTYPE_F32, e.x = xw, e.dout = gw, e.dx = dw;
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    for (int64_t i = 0; i < n; i++) { /* a NaN x gives a NaN, whichever */
        const uint16_t got = d16[skew + i], want = vh_f32_to_bf16(dw[i]);
        const int nan = (got & 0x7fff) > 0x7f80 && (want & 0x7fff) > 0x7f80;
        if (got != want && !nan)
            fail_msg("gelu_backward, bf16 x 0x%04x (overwrite %d, skew %lld): 0x%04x, want 0x%04x",
                     x16[skew + i], overwrite, (long long)skew, got, want);
    }
    if (overwrite) { /* ABI 2.7's epilogue: T = dout x 1 (exact), C = gelu'(x) T, x = aux */
        uint16_t *c16 = malloc((size_t)n * 2), one = vh_f32_to_bf16(1.0f);
        assert_non_null(c16);
        vh_gemm_args h = {.struct_size = sizeof h, .m = n, .n = 1, .k = 1, .alpha = 1.0f,
                          .a = g16 + skew, .lda = 1, .b = &one, .ldb = 1, .c = c16, .ldc = 1,
                          .ab_dtype = VH_DTYPE_BF16, .c_dtype = VH_DTYPE_BF16,
                          .epilogue = VH_EPILOGUE_GELU_BACKWARD, .aux = x16 + skew};
        assert_int_equal(ops->gemm(ops->device, &h), VH_STATUS_OK);
        for (int64_t i = 0; i < n; i++) {
            const uint16_t got = c16[i], want = vh_f32_to_bf16(dw[i]);
            const int nan = (got & 0x7fff) > 0x7f80 && (want & 0x7fff) > 0x7f80;
            if (got != want && !nan)
                fail_msg("GELU_BACKWARD epilogue, bf16 x 0x%04x (skew %lld): 0x%04x, want 0x%04x",
                         x16[skew + i], (long long)skew, got, want);
        }
        free(c16);
    }
    free(g), free(d), free(x16), free(g16), free(d16), free(xw), free(gw), free(dw);
}

/* bf16 gelu_backward adding to dx: each value is dx + dout gelu'(x) in fp32, as the fp32 op
 * computes it (one FMA on a CPU that has them), rounded once. Random values almost never
 * tell one FMA from a product rounded before the add: the two differ in the last bit of an
 * fp32, and that bit moves the bf16 rounding about once in 2^16. So this searches for triples
 * (x, dout, dx) where the two roundings give different bf16 results, then checks the op on
 * them against the fp32 op. A kernel that splits the FMA where the fp32 op keeps it fails
 * here (gelu_grad16.c's gathers, ctest's forced table way). */
static void test_gelu_backward_bf16_fma(void **state) {
    (void)state;
    enum { N = 67 }; /* four vectors of 16 and a tail */
    float *one = malloc(65536 * sizeof(float)), *xs = malloc(65536 * sizeof(float));
    float *grad = malloc(65536 * sizeof(float));
    assert_non_null(one), assert_non_null(xs), assert_non_null(grad);
    for (int i = 0; i < 65536; i++) one[i] = 1.0f, xs[i] = vh_bf16_to_f32((uint16_t)i);
    /* gelu'(x) as the fp32 op holds it: dx = 0 + 1 gelu'(x) */
    vh_eltwise_args e = {.struct_size = sizeof e, .n = 65536, .dtype = VH_DTYPE_F32, .x = xs,
                         .dout = one, .dx = grad, .overwrite = 1};
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    uint16_t x16[N], g16[N], d16[N];
    float xw[N], gw[N], dw[N];
    int found = 0;
    rng_state = 5081;
    for (int64_t tries = 0; found < N && tries < ((int64_t)1 << 26); tries++) {
        const uint16_t x = (uint16_t)(rnd() * 65536.0), g = vh_f32_to_bf16((float)(rnd() * 4 - 2));
        const uint16_t d = vh_f32_to_bf16((float)(rnd() * 4 - 2));
        const float gx = grad[x], gf = vh_bf16_to_f32(g), df = vh_bf16_to_f32(d);
        if (!isfinite(gx) || gx == 0.0f) continue;
        volatile float product = gf * gx; /* rounded: no contraction across the volatile */
        const float split = product + df, fused = fmaf(gf, gx, df);
        if (vh_f32_to_bf16(split) == vh_f32_to_bf16(fused)) continue;
        x16[found] = x, g16[found] = g, d16[found] = d;
        xw[found] = xs[x], gw[found] = gf, dw[found] = df;
        found++;
    }
    assert_int_equal(found, N); /* about one in 2^17 tries */
    vh_eltwise_args b = {.struct_size = sizeof b, .n = N, .dtype = VH_DTYPE_BF16, .x = x16,
                         .dout = g16, .dx = d16};
    assert_int_equal(ops->gelu_backward(ops->device, &b), VH_STATUS_OK);
    b.dtype = VH_DTYPE_F32, b.x = xw, b.dout = gw, b.dx = dw;
    assert_int_equal(ops->gelu_backward(ops->device, &b), VH_STATUS_OK);
    for (int i = 0; i < N; i++)
        if (d16[i] != vh_f32_to_bf16(dw[i]))
            fail_msg("gelu_backward adding, bf16 x 0x%04x: 0x%04x, want 0x%04x", x16[i], d16[i],
                     vh_f32_to_bf16(dw[i]));
    free(one), free(xs), free(grad);
}

/* gelu_grad16.c's race: under auto, the first calls alternate table and
 * computed until each has done 2^21 values in 3 timed spans or more, then
 * one way is named with both median rates; forced, the summary names the
 * variable. The bits are the same either way (gelu_backward_every_bf16,
 * under each way in ctest). */
static void test_gelu_grad16_choice(void **state) {
    (void)state;
    const int64_t n = (int64_t)1 << 20;
    uint16_t *x = malloc((size_t)n * 2), *g = malloc((size_t)n * 2), *d = malloc((size_t)n * 2);
    assert_non_null(x), assert_non_null(g), assert_non_null(d);
    for (int64_t i = 0; i < n; i++)
        x[i] = vh_f32_to_bf16((float)(rnd() * 8 - 4)), g[i] = vh_f32_to_bf16((float)rnd());
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = VH_DTYPE_BF16, .x = x,
                         .dout = g, .dx = d, .overwrite = 1};
    char line[256];
    for (int call = 0; call < 6; call++) /* 6 Mi values: 2 Mi each and then some */
        assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    vh_cpu_gelu_grad16_summary(line, sizeof line);
    const char *env = getenv("VITHOST_CPU_GELU_GRAD16");
    if (env && (strcmp(env, "table") == 0 || strcmp(env, "computed") == 0)) {
        assert_non_null(strstr(line, env));
        assert_non_null(strstr(line, strcmp(env, "table") == 0 ? "table lookup" : "computed"));
    } else if (!strstr(line, "auto: computed (") && !strstr(line, "auto: a table lookup (")) {
        fail_msg("after 6 Mi values the race is not decided: \"%s\"", line);
    } else {
        /* decided on the median of at least 3 timed spans a way, so that one
         * stalled span cannot decide it */
        const char *m = strstr(line, "median of ");
        int spans_table = 0, spans_computed = 0;
        double ns_table = 0, ns_computed = 0;
        assert_non_null(m);
        assert_int_equal(sscanf(m, "median of %d / %d spans: table %lf, computed %lf",
                                &spans_table, &spans_computed, &ns_table, &ns_computed), 4);
        assert_true(spans_table >= 3 && spans_table <= 256);
        assert_true(spans_computed >= 3 && spans_computed <= 256);
        assert_true(ns_table > 0 && ns_computed > 0);
    }
    free(x), free(g), free(d);
}

static void layernorm_16(vh_dtype t, int64_t rows, int64_t dim) {
    const int64_t n = rows * dim;
    float *x = frand(n, -2, 2), *g = frand(n, -1, 1), *d = frand(n, -1, 1);
    float *w = frand(dim, 0.5, 1.5), *b = frand(dim, -0.5, 0.5);
    float dw16[512] = {0}, db16[512] = {0}, dw32[512] = {0}, db32[512] = {0};
    float *m = malloc((size_t)rows * 8), *r = m + rows, *o = malloc((size_t)n * 4);
    uint16_t *x16 = to16(t, x, n), *g16 = to16(t, g, n), *d16 = to16(t, d, n), *o16 = to16(t, x, n);
    float *xw = widened(t, x16, n), *gw = widened(t, g16, n), *dxw = widened(t, d16, n);
    vh_layernorm_args a = {.struct_size = sizeof a, .rows = rows, .dim = dim, .eps = 1e-5f,
                           .dtype = t, .x = x16, .weight = w, .bias = b, .mean = m, .rstd = r,
                           .out = o16, .dout = g16, .dx = d16, .dweight = dw16, .dbias = db16};
    assert_int_equal(ops->layernorm_forward(ops->device, &a), VH_STATUS_OK);
    assert_int_equal(ops->layernorm_backward(ops->device, &a), VH_STATUS_OK);
    a.dtype = VH_DTYPE_F32, a.x = xw, a.out = o, a.dout = gw, a.dx = dxw, a.dweight = dw32, a.dbias = db32;
    assert_int_equal(ops->layernorm_forward(ops->device, &a), VH_STATUS_OK);
    assert_int_equal(ops->layernorm_backward(ops->device, &a), VH_STATUS_OK);
    assert_rounded("layernorm out", t, o16, o, n);
    assert_rounded("layernorm dx", t, d16, dxw, n);
    assert_memory_equal(dw16, dw32, sizeof dw16); /* f32 sums, same order */
    assert_memory_equal(db16, db32, sizeof db16);
    free(x), free(g), free(d), free(w), free(b), free(m), free(o), free(x16), free(g16);
    free(d16), free(o16), free(xw), free(gw), free(dxw);
}

/* The token ops (tokens.c's bf16 kernels where every tensor is bf16, ops.c's
 * copies for f16 and for patchify): the f32 ops on the widened
 * values, rounded once, dpos and dcls summed over the batch in f32 first;
 * gaps between token rows kept. Tokens 1.. are the patches (embed) and the
 * pooled ones (mean_pool). */
static void tokens_16(vh_dtype t, int64_t B, int64_t Np, int64_t D, int layout, int64_t gap) {
    const int64_t T = Np + 1, row = D + gap;
    const int64_t bs = layout ? row : T * row, ts = layout ? B * row : row, n = B * T * row;
    const int64_t counts[] = {n, n, B * D, B * Np * D, D, T * D, n, B * Np * D, D, T * D};
    enum { X, DX, DPOOL, PATCHES, CLS, POS, EMB, DPATCHES, DCLS, DPOS, COUNT };
    uint16_t *h[COUNT];
    float *w[COUNT];
    for (int i = 0; i < COUNT; i++) {
        float *f = frand(counts[i], -1, 1);
        h[i] = to16(t, f, counts[i]), w[i] = widened(t, h[i], counts[i]);
        free(f);
    }
    uint16_t *pooled16 = to16(t, w[DPOOL], B * D);
    float *pooled = malloc((size_t)(B * D) * sizeof(float));
    assert_non_null(pooled);
    for (int v = 0; v < 2; v++) {
        const int narrow = v == 0;
        const vh_dtype dt = narrow ? t : VH_DTYPE_F32;
#define TK_AT(i) (narrow ? (void *)h[i] : (void *)w[i])
        vh_tokens_args a = {.struct_size = sizeof a, .batch = B, .tokens = T, .dim = D,
                            .batch_stride = bs, .token_stride = ts, .dtype = dt,
                            .param_dtype = dt, .grad_dtype = dt, .first = 1, .count = Np,
                            .x = TK_AT(X), .out = narrow ? (void *)pooled16 : (void *)pooled,
                            .dout = TK_AT(DPOOL), .dx = TK_AT(DX), .num_patches = Np,
                            .patch_batch_stride = Np * D, .patch_token_stride = D};
        assert_int_equal(ops->mean_pool_forward(ops->device, &a), VH_STATUS_OK);
        assert_int_equal(ops->mean_pool_backward(ops->device, &a), VH_STATUS_OK);
        a.out = TK_AT(EMB), a.patches = TK_AT(PATCHES), a.cls = TK_AT(CLS), a.pos = TK_AT(POS);
        a.dout = TK_AT(X), a.dpatches = TK_AT(DPATCHES), a.dcls = TK_AT(DCLS);
        a.dpos = TK_AT(DPOS);
#undef TK_AT
        assert_int_equal(ops->embed_forward(ops->device, &a), VH_STATUS_OK);
        assert_int_equal(ops->embed_backward(ops->device, &a), VH_STATUS_OK);
    }
    /* patchify of f32 images into t: each value rounded once (C 3, patch 4,
     * 8 x 12 images: 6 patches a sample), rows of 48 into token rows of row */
    const int64_t C = 3, P = 4, H = 8, W = 12, np = 6, prow = C * P * P;
    if (prow <= row) {
        float *img = frand(B * C * H * W, -1, 1), *p32 = frand(B * np * row, -1, 1);
        uint16_t *p16 = to16(t, p32, B * np * row);
        float *want = widened(t, p16, B * np * row); /* the gaps as the 16-bit rows hold them */
        const int64_t pbs = layout ? row : np * row, pts = layout ? B * row : row;
        for (int v = 0; v < 2; v++) {
            vh_tokens_args pa = {.struct_size = sizeof pa, .batch = B, .tokens = np, .dim = prow,
                                 .batch_stride = pbs, .token_stride = pts,
                                 .dtype = v ? t : VH_DTYPE_F32, .image_dtype = VH_DTYPE_F32,
                                 .out = v ? (void *)p16 : (void *)want, .images = img,
                                 .channels = C, .height = H, .width = W, .patch = P,
                                 .num_patches = np};
            assert_int_equal(ops->patchify(ops->device, &pa), VH_STATUS_OK);
        }
        assert_rounded("patchify (gaps kept)", t, p16, want, B * np * row);
        free(img), free(p32), free(p16), free(want);
    }
    assert_rounded("mean_pool", t, pooled16, pooled, B * D);
    assert_rounded("mean_pool backward (+=, gaps kept)", t, h[DX], w[DX], n);
    assert_rounded("embed (gaps kept)", t, h[EMB], w[EMB], n);
    assert_rounded("embed backward dpatches (+=)", t, h[DPATCHES], w[DPATCHES], B * Np * D);
    assert_rounded("embed backward dcls (+=)", t, h[DCLS], w[DCLS], D);
    assert_rounded("embed backward dpos (+=)", t, h[DPOS], w[DPOS], T * D);
    for (int i = 0; i < COUNT; i++) free(h[i]), free(w[i]);
    free(pooled16), free(pooled);
}

static void bias_backward_16(vh_dtype t, int64_t rows, int64_t cols) {
    float *g = frand(rows * cols, -1, 1), s16[512] = {0}, s32[512] = {0};
    uint16_t *g16 = to16(t, g, rows * cols);
    float *gw = widened(t, g16, rows * cols);
    vh_rows_args a = {.struct_size = sizeof a, .rows = rows, .cols = cols, .dtype = t,
                      .out_dtype = VH_DTYPE_F32, .dout = g16, .out = s16};
    assert_int_equal(ops->bias_backward(ops->device, &a), VH_STATUS_OK);
    a.dtype = VH_DTYPE_F32, a.dout = gw, a.out = s32;
    assert_int_equal(ops->bias_backward(ops->device, &a), VH_STATUS_OK);
    assert_memory_equal(s16, s32, sizeof s16);
    free(g), free(g16), free(gw);
}

static void test_16bit_is_rounded_f32(void **state) {
    (void)state;
    rng_state = 109;
    for (int t = 1; t < 3; t++) {
        gelu_backward_16(kTypes[t], 100003); /* 13 pieces, a tail, threaded */
        gelu_backward_16(kTypes[t], 5000);   /* one piece, serial */
        layernorm_16(kTypes[t], 37, 48);     /* under one chunk */
        layernorm_16(kTypes[t], 53, 50);     /* rows past their whole 16-lane sums */
        layernorm_16(kTypes[t], 1001, 192);  /* 16 chunks, a tail, threaded */
        /* AVX-512's rows (layernorm_avx512.c): T1's 64 (partials in
         * registers), the main job's 128 and T3's 384 (in memory), one vector */
        layernorm_16(kTypes[t], 203, 64);
        layernorm_16(kTypes[t], 67, 128);
        layernorm_16(kTypes[t], 70, 384);
        layernorm_16(kTypes[t], 3, 16);
        tokens_16(kTypes[t], 6, 16, 64, 0, 0); /* T1-like, batch-first */
        tokens_16(kTypes[t], 5, 9, 300, 1, 0); /* past tokens.c's column chunk, batch-second */
        tokens_16(kTypes[t], 4, 7, 40, 0, 24); /* gaps between token rows */
        tokens_16(kTypes[t], 3, 5, 520, 1, 8); /* both */
        bias_backward_16(kTypes[t], 300, 37);
        bias_backward_16(kTypes[t], 4160, 192); /* T2's rows, threaded */
    }
    for (int overwrite = 0; overwrite < 2; overwrite++)
        for (int64_t skew = 0; skew < 2; skew++) gelu_backward_every_bf16(overwrite, skew);
}

/* ---- writing a gradient instead of adding (ABI 2.4) ----------------------------------- */

/* gelu_backward with overwrite = 1 on dx full of NaN against the same call adding to zeros:
 * the same bits (so a model may drop its zeroing pass), and the NaN never read. A struct of
 * 2.3's size ends before `overwrite`, so the member is not seen and the op adds. */
static void gelu_overwrite_case(vh_dtype t, int64_t n, int64_t skew) {
    const size_t es = vh_dtype_size(t);
    float *x = frand(n + skew, -4, 4), *g = frand(n + skew, -1, 1);
    char *xs = malloc((size_t)(n + skew) * es), *gs = malloc((size_t)(n + skew) * es);
    char *want = calloc((size_t)(n + skew), es), *got = malloc((size_t)(n + skew) * es);
    for (int64_t i = 0; i < n + skew; i++) {
        if (t == VH_DTYPE_F32) {
            memcpy(xs + i * 4, &x[i], 4), memcpy(gs + i * 4, &g[i], 4);
            const float nan = NAN;
            memcpy(got + i * 4, &nan, 4);
        } else {
            const uint16_t xv = t == VH_DTYPE_BF16 ? vh_f32_to_bf16(x[i]) : vh_f32_to_f16(x[i]);
            const uint16_t gv = t == VH_DTYPE_BF16 ? vh_f32_to_bf16(g[i]) : vh_f32_to_f16(g[i]);
            const uint16_t nan = t == VH_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
            memcpy(xs + i * 2, &xv, 2), memcpy(gs + i * 2, &gv, 2), memcpy(got + i * 2, &nan, 2);
        }
    }
    /* skew elements off: a 16-bit tensor that starts mid-word takes the unpaired loop */
    const size_t off = (size_t)skew * es;
    vh_eltwise_args e = {.struct_size = sizeof e, .n = n, .dtype = t, .x = xs + off,
                         .dout = gs + off, .dx = want + off};
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    e.dx = got + off, e.overwrite = 1;
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    if (memcmp(want + off, got + off, (size_t)n * es) != 0)
        fail_msg("gelu_backward overwrite, %s, n %lld, skew %lld: not the bits of += on zeros",
                 vh_dtype_name(t), (long long)n, (long long)skew);
    /* 2.3's struct: the member is past struct_size, so it adds to dx */
    memcpy(got + off, want + off, (size_t)n * es);
    e.struct_size = (uint32_t)offsetof(vh_eltwise_args, overwrite);
    assert_int_equal(ops->gelu_backward(ops->device, &e), VH_STATUS_OK);
    for (int64_t i = 0; i < n; i++) {
        float a, b;
        if (t == VH_DTYPE_F32) {
            memcpy(&a, want + off + i * 4, 4), memcpy(&b, got + off + i * 4, 4);
        } else {
            uint16_t u, v;
            memcpy(&u, want + off + i * 2, 2), memcpy(&v, got + off + i * 2, 2);
            a = t == VH_DTYPE_BF16 ? vh_bf16_to_f32(u) : vh_f16_to_f32(u);
            b = t == VH_DTYPE_BF16 ? vh_bf16_to_f32(v) : vh_f16_to_f32(v);
        }
        /* twice the gradient, up to the storage's rounding of the sum */
        if (fabs((double)b - 2.0 * a) > 4.0 * fabs((double)a) * unit_roundoff(t))
            fail_msg("gelu_backward of a 2.3 struct, %s: element %lld is %g, want 2 x %g",
                     vh_dtype_name(t), (long long)i, (double)b, (double)a);
    }
    free(x), free(g), free(xs), free(gs), free(want), free(got);
}

static void test_gelu_backward_overwrite(void **state) {
    (void)state;
    rng_state = 113;
    const vh_overwrite_ext *ext = ops->get_extension(ops->device, VH_OVERWRITE_EXTENSION);
    assert_non_null(ext);
    assert_true(ext->struct_size >= sizeof *ext);
    assert_true(ext->ops & VH_OVERWRITE_OP_GELU_BACKWARD);
    for (int t = 0; t < 3; t++) {
        gelu_overwrite_case(kTypes[t], 100003, 0); /* threaded pieces and a tail */
        gelu_overwrite_case(kTypes[t], 5001, 1);   /* one piece, odd, skewed */
        gelu_overwrite_case(kTypes[t], 3, 0);
    }
}

/* ---- rows: bias gradient, softmax ---------------------------------------------------- */

static void test_rows_dtypes(void **state) {
    (void)state;
    rng_state = 105;
    for (int t = 0; t < 3; t++) {
        const vh_dtype dt = kTypes[t];
        const int64_t rows = 300, cols = 37;
        tens g = trand(dt, rows * cols, -1, 1);
        double *gv = tvals(&g);
        for (int o = 0; o < 2; o++) { /* dbias in fp32, and in the activations' dtype */
            const vh_dtype ot = o ? dt : VH_DTYPE_F32;
            tens db = trand(ot, cols, -1, 1);
            double *w = tvals(&db);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < cols; j++) w[j] += gv[r * cols + j];
            vh_rows_args a = {.struct_size = sizeof a, .rows = rows, .cols = cols, .dtype = dt,
                              .out_dtype = ot, .dout = g.p, .out = db.p};
            assert_int_equal(ops->bias_backward(ops->device, &a), VH_STATUS_OK);
            check("bias_backward (+=)", &db, w, tol(ot));
            tfree(&db), free(w);
        }
        const int64_t sr = 33, sc = 50;
        tens x = trand(dt, sr * sc, -6, 6);
        double *xv = tvals(&x), *w = dzero(sr * sc);
        for (int64_t r = 0; r < sr; r++) {
            double mx = -INFINITY, s = 0;
            for (int64_t j = 0; j < sc; j++) mx = fmax(mx, xv[r * sc + j]);
            for (int64_t j = 0; j < sc; j++) s += exp(xv[r * sc + j] - mx);
            for (int64_t j = 0; j < sc; j++) w[r * sc + j] = exp(xv[r * sc + j] - mx) / s;
        }
        vh_rows_args a = {.struct_size = sizeof a, .rows = sr, .cols = sc, .dtype = dt,
                          .out_dtype = dt, .x = x.p, .out = x.p};
        assert_int_equal(ops->softmax(ops->device, &a), VH_STATUS_OK);
        check("softmax (in place)", &x, w, tol(dt));
        tfree(&g), tfree(&x), free(gv), free(xv), free(w);
    }
}

/* ---- attention ------------------------------------------------------------------------ */

static void run_attention(vh_dtype dt, vh_dtype pt, int second, int64_t Dh) {
    const int64_t B = 2, N = 13, H = 2, D = H * Dh;
    vh_attention_args a = {.struct_size = sizeof a, .batch = B, .tokens = N, .heads = H,
                           .head_dim = Dh, .scale = 1.0f / sqrtf((float)Dh), .dtype = dt,
                           .probs_dtype = pt};
    a.qkv_batch_stride = second ? 3 * D : N * 3 * D;
    a.qkv_token_stride = second ? B * 3 * D : 3 * D;
    a.out_batch_stride = second ? D : N * D;
    a.out_token_stride = second ? B * D : D;
    const int64_t nq = B * N * 3 * D, no = B * N * D, np = B * H * N * N;
    tens qkv = trand(dt, nq, -1.5, 1.5), out = trand(dt, no, -1, 1), dout = trand(dt, no, -1, 1);
    tens probs = tnew(pt, np), dqkv = trand(dt, nq, -1, 1);
    a.qkv = qkv.p, a.out = out.p, a.probs = probs.p, a.dout = dout.p, a.dqkv = dqkv.p;
    double *q = tvals(&qkv), *g = tvals(&dout), *wq = tvals(&dqkv);
    double *wp = dzero(np), *wo = dzero(no), *dp = dzero(N * N);
#define QKV(b, t, w, h, d) \
    ((b) * a.qkv_batch_stride + (t) * a.qkv_token_stride + (w) * D + (h) * Dh + (d))
#define OUT(b, t, h, d) ((b) * a.out_batch_stride + (t) * a.out_token_stride + (h) * Dh + (d))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < N; i++) {
                double *P = wp + ((b * H + h) * N + i) * N, mx = -INFINITY, s = 0;
                for (int64_t j = 0; j < N; j++) {
                    double v = 0;
                    for (int64_t d = 0; d < Dh; d++)
                        v += q[QKV(b, i, 0, h, d)] * q[QKV(b, j, 1, h, d)];
                    P[j] = v * a.scale;
                    mx = fmax(mx, P[j]);
                }
                for (int64_t j = 0; j < N; j++) s += (P[j] = exp(P[j] - mx));
                for (int64_t j = 0; j < N; j++) P[j] /= s;
            }
    assert_int_equal(ops->attention_forward(ops->device, &a), VH_STATUS_OK);
    check("attention probs", &probs, wp, tol(pt));
    /* out = P V with P as stored (vh_device.h: probs in probs_dtype) */
    double *ps = tvals(&probs);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < N; i++)
                for (int64_t d = 0; d < Dh; d++) {
                    double o = 0;
                    for (int64_t j = 0; j < N; j++)
                        o += ps[((b * H + h) * N + i) * N + j] * q[QKV(b, j, 2, h, d)];
                    wo[OUT(b, i, h, d)] = o;
                }
    char what[64];
    snprintf(what, sizeof what, "attention out (%s, probs %s)",
             second ? "batch-second" : "batch-first", vh_dtype_name(pt));
    check(what, &out, wo, tol(dt));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const double *P = ps + (b * H + h) * N * N;
            for (int64_t i = 0; i < N; i++) {
                double rs = 0;
                for (int64_t j = 0; j < N; j++) {
                    double v = 0;
                    for (int64_t d = 0; d < Dh; d++)
                        v += g[OUT(b, i, h, d)] * q[QKV(b, j, 2, h, d)];
                    dp[i * N + j] = v;
                    rs += v * P[i * N + j];
                }
                for (int64_t j = 0; j < N; j++) dp[i * N + j] = P[i * N + j] * (dp[i * N + j] - rs);
            }
            for (int64_t i = 0; i < N; i++)
                for (int64_t d = 0; d < Dh; d++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int64_t j = 0; j < N; j++) {
                        dq += dp[i * N + j] * q[QKV(b, j, 1, h, d)];
                        dk += dp[j * N + i] * q[QKV(b, j, 0, h, d)];
                        dv += P[j * N + i] * g[OUT(b, j, h, d)];
                    }
                    wq[QKV(b, i, 0, h, d)] += a.scale * dq;
                    wq[QKV(b, i, 1, h, d)] += a.scale * dk;
                    wq[QKV(b, i, 2, h, d)] += dv;
                }
        }
#undef QKV
#undef OUT
    assert_int_equal(ops->attention_backward(ops->device, &a), VH_STATUS_OK);
    snprintf(what, sizeof what, "attention dqkv (+=, %s, probs %s)",
             second ? "batch-second" : "batch-first", vh_dtype_name(pt));
    check(what, &dqkv, wq, tol(dt));
    tfree(&qkv), tfree(&out), tfree(&dout), tfree(&probs), tfree(&dqkv);
    free(q), free(g), free(wq), free(wp), free(wo), free(dp), free(ps);
}

static void test_attention_dtypes(void **state) {
    (void)state;
    rng_state = 106;
    /* head_dim 8 and 24: the fused small-head blocks (on AVX2/AVX-512); 64:
     * for bf16 the native route (attention16.c, or attention_dot16.c's
     * blocks on an AVX512-BF16 CPU) or the widened batched matmuls, as the
     * _gemm16_native / _widen runs of this test force; f32 the small-head
     * blocks on AVX-512, else the batched matmuls */
    static const int64_t dims[] = {8, 24, 64};
    for (int t = 0; t < 3; t++)
        for (int second = 0; second < 2; second++)
            for (int d = 0; d < 3; d++) {
                run_attention(kTypes[t], kTypes[t], second, dims[d]);
                run_attention(kTypes[t], VH_DTYPE_F32, second, dims[d]);
            }
}

/* ---- loss ------------------------------------------------------------------------------- */

static void test_cross_entropy_dtypes(void **state) {
    (void)state;
    rng_state = 107;
    for (int t = 0; t < 3; t++) {
        const vh_dtype dt = kTypes[t];
        const int64_t B = 9, C = 13;
        const float s = 0.1f, dscale = 2.0f;
        tens z = trand(dt, B * C, -3, 3), dz = trand(dt, B * C, -0.1, 0.1);
        tens loss = tnew(VH_DTYPE_F32, 1);
        int32_t y[9];
        for (int64_t b = 0; b < B; b++) y[b] = (int32_t)((b * 7) % C);
        double *zv = tvals(&z), *wg = tvals(&dz), wl = 0;
        for (int64_t b = 0; b < B; b++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < C; j++) mx = fmax(mx, zv[b * C + j]);
            for (int64_t j = 0; j < C; j++) sum += exp(zv[b * C + j] - mx);
            for (int64_t j = 0; j < C; j++) {
                const double qj = (j == y[b] ? 1.0 - s : 0.0) + s / C;
                const double lp = zv[b * C + j] - mx - log(sum);
                wl -= qj * lp / B;
                wg[b * C + j] += dscale * (exp(lp) - qj) / B;
            }
        }
        vh_xent_args a = {.struct_size = sizeof a, .batch = B, .classes = C, .smoothing = s,
                          .dloss_scale = dscale, .dtype = dt, .logits = z.p, .labels = y,
                          .loss = loss.p, .dlogits = dz.p};
        assert_int_equal(ops->softmax_cross_entropy(ops->device, &a), VH_STATUS_OK);
        check("cross-entropy loss (device memory)", &loss, &wl, tol(VH_DTYPE_F32));
        check("cross-entropy dlogits (+=)", &dz, wg, tol(dt));
        tfree(&z), tfree(&dz), tfree(&loss), free(zv), free(wg);
    }
}

/* ---- tokens ------------------------------------------------------------------------------ */

static void test_tokens_dtypes(void **state) {
    (void)state;
    rng_state = 108;
    for (int t = 0; t < 3; t++)
        for (int layout = 0; layout < 2; layout++) {
            const vh_dtype dt = kTypes[t];
            const int64_t B = 3, Np = 16, T = Np + 1, D = 12;
            const int64_t bs = layout ? D : T * D, ts = layout ? B * D : D;
            /* mean pool over tokens 1..T-1 */
            tens x = trand(dt, B * T * D, -1, 1), pooled = tnew(dt, B * D);
            tens dpool = trand(dt, B * D, -1, 1), dx = trand(dt, B * T * D, -1, 1);
            double *xv = tvals(&x), *gp = tvals(&dpool), *wp = dzero(B * D), *wdx = tvals(&dx);
            for (int64_t b = 0; b < B; b++)
                for (int64_t tk = 1; tk < T; tk++)
                    for (int64_t d = 0; d < D; d++) {
                        wp[b * D + d] += xv[b * bs + tk * ts + d] / (T - 1);
                        wdx[b * bs + tk * ts + d] += gp[b * D + d] / (T - 1);
                    }
            vh_tokens_args a = {.struct_size = sizeof a, .batch = B, .tokens = T, .dim = D,
                                .batch_stride = bs, .token_stride = ts, .dtype = dt,
                                .param_dtype = dt, .grad_dtype = dt, .first = 1,
                                .count = T - 1, .x = x.p, .out = pooled.p, .dout = dpool.p,
                                .dx = dx.p};
            assert_int_equal(ops->mean_pool_forward(ops->device, &a), VH_STATUS_OK);
            check("mean_pool", &pooled, wp, tol(dt));
            assert_int_equal(ops->mean_pool_backward(ops->device, &a), VH_STATUS_OK);
            check("mean_pool backward (+=)", &dx, wdx, tol(dt));

            /* patchify, from f32 images and from images in dt */
            const int64_t C = 2, Hh = 8, W = 8, P = 4, np = 4, row = C * P * P;
            for (int it = 0; it < 2; it++) {
                const vh_dtype imt = it ? dt : VH_DTYPE_F32;
                tens img = trand(imt, B * C * Hh * W, -1, 1), pt = trand(dt, B * np * row, -1, 1);
                double *iv = tvals(&img), *w = dzero(B * np * row);
                const int64_t pbs = layout ? row : np * row, pts = layout ? B * row : row;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t yy = 0; yy < Hh; yy++)
                            for (int64_t xx = 0; xx < W; xx++) {
                                const int64_t p = (yy / P) * (W / P) + xx / P;
                                const int64_t e = (c * P + yy % P) * P + xx % P;
                                w[b * pbs + p * pts + e] = iv[((b * C + c) * Hh + yy) * W + xx];
                            }
                vh_tokens_args pa = {.struct_size = sizeof pa, .batch = B, .tokens = np,
                                     .dim = row, .batch_stride = pbs, .token_stride = pts,
                                     .dtype = dt, .image_dtype = imt, .out = pt.p,
                                     .images = img.p, .channels = C, .height = Hh, .width = W,
                                     .patch = P, .num_patches = np};
                assert_int_equal(ops->patchify(ops->device, &pa), VH_STATUS_OK);
                check("patchify", &pt, w, tol(dt));
                tfree(&img), tfree(&pt), free(iv), free(w);
            }

            /* embedding: cls, batch-first patch rows, pos */
            tens patches = trand(dt, B * Np * D, -1, 1), cls = trand(dt, D, -1, 1);
            tens pos = trand(dt, T * D, -1, 1), emb = trand(dt, B * T * D, -1, 1);
            tens dpatches = trand(dt, B * Np * D, -1, 1), dcls = trand(dt, D, -1, 1);
            tens dpos = trand(dt, T * D, -1, 1);
            double *pv = tvals(&patches), *cv = tvals(&cls), *posv = tvals(&pos);
            double *we = dzero(B * T * D), *wdp = tvals(&dpatches), *wdc = tvals(&dcls);
            double *wdpos = tvals(&dpos);
            for (int64_t b = 0; b < B; b++)
                for (int64_t tk = 0; tk < T; tk++)
                    for (int64_t d = 0; d < D; d++) {
                        const double src = tk == 0 ? cv[d] : pv[(b * Np + tk - 1) * D + d];
                        we[b * bs + tk * ts + d] = src + posv[tk * D + d];
                        const double gv = xv[b * bs + tk * ts + d]; /* x as the incoming gradient */
                        wdpos[tk * D + d] += gv;
                        if (tk == 0)
                            wdc[d] += gv;
                        else
                            wdp[(b * Np + tk - 1) * D + d] += gv;
                    }
            vh_tokens_args ea = {.struct_size = sizeof ea, .batch = B, .tokens = T, .dim = D,
                                 .batch_stride = bs, .token_stride = ts, .dtype = dt,
                                 .param_dtype = dt, .grad_dtype = dt, .out = emb.p,
                                 .dout = x.p, .num_patches = Np, .patch_batch_stride = Np * D,
                                 .patch_token_stride = D, .patches = patches.p, .cls = cls.p,
                                 .pos = pos.p, .dpatches = dpatches.p, .dcls = dcls.p,
                                 .dpos = dpos.p};
            assert_int_equal(ops->embed_forward(ops->device, &ea), VH_STATUS_OK);
            check("embed_forward", &emb, we, tol(dt));
            assert_int_equal(ops->embed_backward(ops->device, &ea), VH_STATUS_OK);
            check("embed_backward dpatches (+=)", &dpatches, wdp, tol(dt));
            check("embed_backward dcls (+=)", &dcls, wdc, tol(dt));
            check("embed_backward dpos (+=)", &dpos, wdpos, tol(dt));
            tfree(&x), tfree(&pooled), tfree(&dpool), tfree(&dx), tfree(&patches), tfree(&cls);
            tfree(&pos), tfree(&emb), tfree(&dpatches), tfree(&dcls), tfree(&dpos);
            free(xv), free(gp), free(wp), free(wdx), free(pv), free(cv), free(posv), free(we);
            free(wdp), free(wdc), free(wdpos);
        }
}

/* ---- multi-tensor scale and check ---------------------------------------------------------- */

static float mt_run(tens *ts, int count, float scale, float *sum_sq, float *found_inf) {
    void *ptrs[4];
    int64_t numels[4];
    vh_dtype dtypes[4];
    for (int i = 0; i < count; i++) ptrs[i] = ts[i].p, numels[i] = ts[i].n, dtypes[i] = ts[i].t;
    vh_multi_tensor_args a = {.struct_size = sizeof a, .count = count, .tensors = ptrs,
                              .numels = numels, .dtypes = dtypes, .scale = scale,
                              .sum_sq = sum_sq, .found_inf = found_inf};
    assert_int_equal(ops->multi_tensor_scale_check(ops->device, &a), VH_STATUS_OK);
    return sum_sq ? *sum_sq : 0.0f;
}

/* The sum of squares as ops.c documents its order: chunks of 2^14
 * elements; in a chunk, element i's square added to lane i % 32 (in f32,
 * one rounding for the product and one for the sum); the 32 lanes folded
 * by halves (lane l += lane l + w for w = 16, 8, 4, 2, 1); a tensor's chunk
 * sums added in order, then the tensors. Scalar, so whatever ISA the test
 * runs on, this is the sum every one of the engine's clones must give. */
static float mt_reference(tens *ts, int count) {
    float total = 0.0f;
    for (int t = 0; t < count; t++) {
        double *v = tvals(&ts[t]);
        float st = 0.0f;
        for (int64_t lo = 0; lo < ts[t].n; lo += (int64_t)1 << 14) {
            const int64_t hi = lo + ((int64_t)1 << 14) < ts[t].n ? lo + ((int64_t)1 << 14) : ts[t].n;
            volatile float lane[32] = {0}; /* volatile: no contraction, no reordering */
            for (int64_t i = lo; i < hi; i++) {
                const float x = (float)v[i];
                const float sq = x * x;
                lane[(i - lo) % 32] = lane[(i - lo) % 32] + sq;
            }
            for (int w = 16; w >= 1; w /= 2)
                for (int l = 0; l < w; l++) lane[l] = lane[l] + lane[l + w];
            st += lane[0];
        }
        total += st;
        free(v);
    }
    return total;
}

static void test_multi_tensor(void **state) {
    (void)state;
    rng_state = 109;
    tens ts[4] = {trand(VH_DTYPE_F32, 1000, -1, 1), trand(VH_DTYPE_BF16, 100003, -1, 1),
                  trand(VH_DTYPE_F16, 77, -1, 1), trand(VH_DTYPE_F32, 50000, -2, 2)};
    double *before[4];
    for (int i = 0; i < 4; i++) before[i] = tvals(&ts[i]);
    /* scale 0.5: exact in every dtype (no value here is near underflow) */
    float sum = -1, inf = 0;
    mt_run(ts, 4, 0.5f, &sum, &inf);
    double want = 0;
    for (int i = 0; i < 4; i++) {
        double *w = dzero(ts[i].n);
        for (int64_t j = 0; j < ts[i].n; j++) w[j] = 0.5 * before[i][j], want += w[j] * w[j];
        check("multi_tensor scaled values", &ts[i], w, 0.0);
        free(w);
    }
    assert_true(fabs((double)sum - want) <= TOL_F32_MATH * want);
    assert_true(inf == 0.0f);

    /* scale 1 leaves the tensors alone; the sum does not depend on threads */
    float s1 = 0, s2 = 0;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    mt_run(ts, 4, 1.0f, &s1, NULL);
    omp_set_num_threads(threads > 1 ? threads : 2);
    mt_run(ts, 4, 1.0f, &s2, NULL);
    omp_set_num_threads(threads);
    assert_memory_equal(&s1, &s2, sizeof s1);
    assert_memory_equal(&s1, &sum, sizeof s1);
    /* and on every ISA: the documented order, bit for bit; also on small f32
     * tensors of one magnitude (|x| in [1, 2)), 1-66 groups of the 32 lanes
     * and a few more, where the lanes' fold is the last rounding (a swap of
     * two lanes' vectors changed the bits of several) */
    const float ref = mt_reference(ts, 4);
    if (memcmp(&ref, &s1, sizeof ref) != 0)
        fail_msg("multi_tensor sum of squares %.9g, the documented order gives %.9g", (double)s1,
                 (double)ref);
    for (int g = 1; g <= 66; g += 5) {
        tens small = tnew(VH_DTYPE_F32, 32 * g + g % 7);
        for (int64_t i = 0; i < small.n; i++)
            ((float *)small.p)[i] = (float)((1.0 + rnd()) * (rnd() < 0.5 ? -1.0 : 1.0));
        float ss = 0;
        mt_run(&small, 1, 1.0f, &ss, NULL);
        const float sref = mt_reference(&small, 1);
        if (memcmp(&sref, &ss, sizeof sref) != 0)
            fail_msg("multi_tensor sum of squares of %lld values in [1, 2): %a, the documented "
                     "order gives %a", (long long)small.n, (double)ss, (double)sref);
        tfree(&small);
    }

    /* a finite value whose square overflows: the sum is Inf, found_inf is not set */
    {
        tens big = trand(VH_DTYPE_F32, 40, -1, 1);
        ((float *)big.p)[17] = 3e20f;
        float bs = 0, binf = 0;
        mt_run(&big, 1, 1.0f, &bs, &binf);
        assert_true(isinf(bs) && binf == 0.0f);
        tfree(&big);
    }

    /* Inf in a bf16 tensor, NaN in an f16 one: found, and never cleared */
    ((uint16_t *)ts[1].p)[12345] = 0x7f80;
    inf = 0;
    mt_run(ts, 4, 1.0f, &sum, &inf);
    assert_true(inf == 1.0f);
    ((uint16_t *)ts[1].p)[12345] = 0;
    ((uint16_t *)ts[2].p)[5] = 0x7e00;
    inf = 0;
    mt_run(ts, 4, 2.0f, NULL, &inf);
    assert_true(inf == 1.0f);
    ((uint16_t *)ts[2].p)[5] = 0;
    mt_run(ts, 4, 1.0f, &sum, &inf);
    assert_true(inf == 1.0f); /* still set: the caller zeroes it per step */
    inf = 0;
    ((float *)ts[0].p)[3] = -INFINITY;
    mt_run(ts, 1, 1.0f, NULL, &inf);
    assert_true(inf == 1.0f);

    /* bad arguments */
    vh_multi_tensor_args bad = {.struct_size = sizeof bad, .count = -1};
    assert_int_equal(ops->multi_tensor_scale_check(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(ops->multi_tensor_scale_check(ops->device, NULL), VH_STATUS_ERR_INVALID_ARG);
    for (int i = 0; i < 4; i++) tfree(&ts[i]), free(before[i]);
}

/* ---- the engine ----------------------------------------------------------------------------- */

/* One layer's worth of ops, forward and backward, in bf16 and f32. */
static void step_like(vh_dtype dt) {
    const int64_t rows = 64, d = 32, h = 4 * d, B = 4, N = 16, H = 2;
    tens x = trand(dt, rows * d, -1, 1), w1 = trand(dt, h * d, -1, 1), b1 = trand(dt, h, -1, 1);
    tens pre = tnew(dt, rows * h), act = tnew(dt, rows * h), dw = tnew(VH_DTYPE_F32, h * d);
    vh_gemm_args fc = {.struct_size = sizeof fc, .trans_b = 1, .m = rows, .n = h, .k = d,
                       .alpha = 1.0f, .a = x.p, .lda = d, .b = w1.p, .ldb = d, .c = act.p,
                       .ldc = h, .bias = b1.p, .ab_dtype = dt, .c_dtype = dt, .bias_dtype = dt,
                       .epilogue = VH_EPILOGUE_GELU, .aux = pre.p};
    assert_int_equal(ops->gemm(ops->device, &fc), VH_STATUS_OK);
    vh_gemm_args gw = {.struct_size = sizeof gw, .trans_a = 1, .m = h, .n = d, .k = rows,
                       .alpha = 1.0f, .beta = 1.0f, .a = act.p, .lda = h, .b = x.p, .ldb = d,
                       .c = dw.p, .ldc = d, .ab_dtype = dt};
    assert_int_equal(ops->gemm(ops->device, &gw), VH_STATUS_OK);
    tens qkv = trand(dt, B * N * 3 * d, -1, 1), o = tnew(dt, B * N * d);
    tens p = tnew(dt, B * H * N * N);
    tens dq = tnew(dt, B * N * 3 * d);
    vh_attention_args at = {.struct_size = sizeof at, .batch = B, .tokens = N, .heads = H,
                            .head_dim = d / H, .qkv_batch_stride = N * 3 * d,
                            .qkv_token_stride = 3 * d, .out_batch_stride = N * d,
                            .out_token_stride = d, .scale = 0.25f, .qkv = qkv.p, .out = o.p,
                            .probs = p.p, .dout = o.p, .dqkv = dq.p, .dtype = dt,
                            .probs_dtype = dt};
    assert_int_equal(ops->attention_forward(ops->device, &at), VH_STATUS_OK);
    assert_int_equal(ops->attention_backward(ops->device, &at), VH_STATUS_OK);
    tens lw = trand(VH_DTYPE_F32, d, 0.5, 1.5), lb = tnew(VH_DTYPE_F32, d);
    tens mean = tnew(VH_DTYPE_F32, rows), rstd = tnew(VH_DTYPE_F32, rows);
    tens ln = tnew(dt, rows * d), dx = tnew(dt, rows * d), dlw = tnew(VH_DTYPE_F32, d);
    vh_layernorm_args la = {.struct_size = sizeof la, .rows = rows, .dim = d, .eps = 1e-6f,
                            .dtype = dt, .x = x.p, .weight = lw.p, .bias = lb.p, .mean = mean.p,
                            .rstd = rstd.p, .out = ln.p, .dout = ln.p, .dx = dx.p,
                            .dweight = dlw.p, .dbias = dlw.p};
    assert_int_equal(ops->layernorm_forward(ops->device, &la), VH_STATUS_OK);
    assert_int_equal(ops->layernorm_backward(ops->device, &la), VH_STATUS_OK);
    tens db = tnew(VH_DTYPE_F32, h);
    vh_rows_args ra = {.struct_size = sizeof ra, .rows = rows, .cols = h, .dtype = dt,
                       .dout = act.p, .out = db.p};
    assert_int_equal(ops->bias_backward(ops->device, &ra), VH_STATUS_OK);
    tens *all[] = {&x, &w1, &b1, &pre, &act, &dw, &qkv, &o, &p, &dq, &lw, &lb, &mean, &rstd,
                   &ln, &dx, &dlw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tfree(all[i]);
}

/* Once every shape of a step has been seen, a step creates no primitive and
 * allocates no scratch memory. */
static void test_steady_state(void **state) {
    (void)state;
    rng_state = 110;
    const vh_cpu_engine_info *info = ops->get_extension(ops->device, VH_CPU_ENGINE_EXTENSION);
    assert_non_null(info);
    assert_non_null(info->thread_counters);
    for (int warm = 0; warm < 2; warm++) step_like(VH_DTYPE_BF16), step_like(VH_DTYPE_F32);
    uint64_t prims0 = 0, allocs0 = 0, prims1 = 0, allocs1 = 0;
    info->thread_counters(&prims0, &allocs0);
    assert_true(prims0 > 0);
    for (int i = 0; i < 3; i++) step_like(VH_DTYPE_BF16), step_like(VH_DTYPE_F32);
    info->thread_counters(&prims1, &allocs1);
    assert_int_equal(prims1, prims0);
    assert_int_equal(allocs1, allocs0);
}

static void test_engine_info(void **state) {
    (void)state;
    const vh_cpu_engine_info *info = ops->get_extension(ops->device, VH_CPU_ENGINE_EXTENSION);
    assert_non_null(info);
    assert_true(info->struct_size >= sizeof *info);
    assert_non_null(info->engine);
    assert_non_null(info->isa);
    print_message("engine: %s, isa %s, native bf16 %d\n", info->engine, info->isa,
                  info->native_bf16);
    const char *max_isa = getenv("ONEDNN_MAX_CPU_ISA");
    if (max_isa && strcmp(max_isa, "AVX2") == 0) {
        /* held to AVX2: no bf16 hardware, so the conversion route */
        assert_string_equal(info->isa, "avx2");
        assert_int_equal(info->native_bf16, 0);
    }
    assert_null(ops->get_extension(ops->device, "vh.cpu.nothing"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_info),
        cmocka_unit_test(test_16bit_is_rounded_f32),
        cmocka_unit_test(test_gelu_backward_overwrite),
        cmocka_unit_test(test_gemm_dtypes),
        cmocka_unit_test(test_gemm_bf16_exact),
        cmocka_unit_test(test_gemm_gelu_grad_routes),
        cmocka_unit_test(test_gemm_gelu_backward_routes),
        cmocka_unit_test(test_gelu_backward_bf16_fma),
        cmocka_unit_test(test_gelu_grad16_choice),
        cmocka_unit_test(test_gemm_gelu_bf16_bits),
        cmocka_unit_test(test_layernorm_dtypes),
        cmocka_unit_test(test_layernorm_routes),
        cmocka_unit_test(test_eltwise_dtypes),
        cmocka_unit_test(test_dropout_scale_rows_dtypes),
        cmocka_unit_test(test_rows_dtypes),
        cmocka_unit_test(test_attention_dtypes),
        cmocka_unit_test(test_cross_entropy_dtypes),
        cmocka_unit_test(test_tokens_dtypes),
        cmocka_unit_test(test_multi_tensor),
        cmocka_unit_test(test_steady_state),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
