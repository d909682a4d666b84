/* test_cuda_gemm.c - the CUDA GEMM (sdk/cuda/gemm.cu, cuBLASLt) against the
 * CPU twin (sdk/src/cpu/gemm.c) on the same inputs: every transposition,
 * batches with strides (and a broadcast operand), padded leading
 * dimensions, bias (of C's dtype: cuBLASLt's epilogue; of another: the
 * kernel), erf GELU with and without aux, gelu' in aux and C = T * aux
 * (ABI 2.5), residuals (beside C, C itself),
 * alpha and beta, k = 0, f32/bf16/f16 operands and outputs, odd sizes
 * (17 x 33 x 65) and one ViT-sized shape; and the argument checks. Without a
 * GPU it prints one SKIPPED line and exits 77 (gpu_twin.h). */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_twin.h"

static gpu_twin twin;

enum { RES_NONE = 0, RES_OWN = 1, RES_IS_C = 2 };

typedef struct gcase {
    int ta, tb;
    int64_t batch, m, n, k;
    vh_dtype ab, c;
    int bias;          /* 0 none, else 1 + the bias dtype */
    int gelu, aux, residual;
    float alpha, beta;
    int pad;           /* added to every leading dimension */
    int broadcast_b;   /* batch stride of B 0 */
} gcase;

/* One operand or output: host fp32 values, and the buffers of both devices. */
typedef struct buf {
    int64_t n;
    vh_dtype dt;
    float *x;
    void *host, *dev;
} buf;

static buf buf_make(int64_t n, vh_dtype dt, uint64_t seed, float lo, float hi) {
    buf b = {n > 0 ? n : 1, dt, NULL, NULL, NULL};
    b.x = malloc((size_t)b.n * sizeof(float));
    assert_non_null(b.x);
    gpu_twin_fill(b.x, b.n, seed, lo, hi);
    b.host = gpu_twin_host(b.x, b.n, dt);
    b.dev = gpu_twin_upload(&twin, b.x, b.n, dt);
    return b;
}

static void buf_free(buf *b) {
    free(b->x);
    free(b->host);
    gpu_twin_free(&twin, b->dev);
}

/* Both devices' copies of an output agree (whole buffer: the padding that
 * neither may touch included). */
static int buf_agree(const char *what, const buf *b, double tol) {
    float *g = malloc((size_t)b->n * sizeof(float)), *h = malloc((size_t)b->n * sizeof(float));
    assert_non_null(g);
    assert_non_null(h);
    gpu_twin_download(&twin, g, b->dev, b->n, b->dt);
    gpu_twin_widen(h, b->host, b->n, b->dt);
    const int ok = gpu_twin_close_enough(what, g, h, b->n, tol);
    free(g);
    free(h);
    return ok;
}

static double gemm_tol(vh_dtype c) {
    /* fp32 sums in another order: ~k eps of the largest term; 16-bit outputs:
     * one rounding of the (nearly) same fp32 value. */
    return c == VH_DTYPE_F32 ? 1e-4 : gpu_twin_tol(c);
}

static int64_t ld_of(int64_t cols) { return cols > 1 ? cols : 1; }

static void run_case(const gcase *t, const char *name) {
    const int64_t B = t->batch > 1 ? t->batch : 1;
    /* leading dimensions at least 1, as BLAS asks (k = 0 gives A no columns) */
    const int64_t lda = ld_of((t->ta ? t->m : t->k) + t->pad);
    const int64_t ldb = ld_of((t->tb ? t->k : t->n) + t->pad), ldc = ld_of(t->n + t->pad);
    const int64_t sa = (t->ta ? t->k : t->m) * lda, sb = t->broadcast_b ? 0 : (t->tb ? t->n : t->k) * ldb;
    const int64_t sc = t->m * ldc + t->pad;
    buf a = buf_make(B * sa, t->ab, 1, -1.0f, 1.0f);
    buf b = buf_make(t->broadcast_b ? (t->tb ? t->n : t->k) * ldb : B * sb, t->ab, 2, -1.0f, 1.0f);
    buf c = buf_make(B * sc, t->c, 3, -1.0f, 1.0f);
    buf aux = buf_make(B * sc, t->c, 4, -1.0f, 1.0f);
    buf res = buf_make(B * sc, t->c, 5, -1.0f, 1.0f);
    buf bias = buf_make(t->n, t->bias ? (vh_dtype)(t->bias - 1) : VH_DTYPE_F32, 6, -1.0f, 1.0f);
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = t->ta, .trans_b = t->tb, .m = t->m,
                      .n = t->n, .k = t->k, .alpha = t->alpha, .beta = t->beta, .lda = lda,
                      .stride_a = B > 1 ? sa : 0, .ldb = ldb, .stride_b = B > 1 ? sb : 0,
                      .ldc = ldc, .stride_c = B > 1 ? sc : 0, .batch = t->batch,
                      .ab_dtype = t->ab, .c_dtype = t->c,
                      .bias_dtype = t->bias ? t->bias - 1 : 0,
                      .epilogue = t->gelu}; /* a vh_epilogue: 1 GELU, 2 GELU_GRAD, 3 MUL_AUX */
    vh_gemm_args hg = g, dg = g;
    hg.a = a.host, hg.b = b.host, hg.c = c.host;
    dg.a = a.dev, dg.b = b.dev, dg.c = c.dev;
    if (t->bias) hg.bias = bias.host, dg.bias = bias.dev;
    if (t->aux) hg.aux = aux.host, dg.aux = aux.dev;
    if (t->residual == RES_OWN) hg.residual = res.host, dg.residual = res.dev;
    if (t->residual == RES_IS_C) hg.residual = c.host, dg.residual = c.dev;
    assert_int_equal(twin.cpu->gemm(twin.cpu->device, &hg), VH_STATUS_OK);
    const vh_status st = twin.gpu.gemm(twin.gpu.device, &dg);
    if (st != VH_STATUS_OK) printf("%s: the GPU GEMM returned %d\n", name, (int)st);
    assert_int_equal(st, VH_STATUS_OK);
    char what[160];
    snprintf(what, sizeof what, "%s: C", name);
    int ok = buf_agree(what, &c, gemm_tol(t->c));
    snprintf(what, sizeof what, "%s: aux", name);
    if (t->aux) ok &= buf_agree(what, &aux, gemm_tol(t->c));
    buf_free(&a), buf_free(&b), buf_free(&c), buf_free(&aux), buf_free(&res), buf_free(&bias);
    if (!ok) fail_msg("%s", name);
}

static const char *dn(vh_dtype d) { return d == VH_DTYPE_BF16 ? "bf16" : d == VH_DTYPE_F16 ? "f16" : "f32"; }

static void test_trans_and_dtypes(void **state) {
    (void)state;
    const vh_dtype dt[3] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};
    for (int x = 0; x < 3; x++)
        for (int y = 0; y < 3; y++)
            for (int tr = 0; tr < 4; tr++) {
                gcase t = {.ta = tr & 1, .tb = tr >> 1, .batch = 1, .m = 17, .n = 33, .k = 65,
                           .ab = dt[x], .c = dt[y], .alpha = 1.0f};
                char name[96];
                snprintf(name, sizeof name, "17x33x65 ta%d tb%d %s->%s", t.ta, t.tb, dn(dt[x]), dn(dt[y]));
                run_case(&t, name);
            }
}

static void test_batched(void **state) {
    (void)state;
    for (int tr = 0; tr < 4; tr++)
        for (int pad = 0; pad < 2; pad++) {
            gcase t = {.ta = tr & 1, .tb = tr >> 1, .batch = 3, .m = 19, .n = 9, .k = 31,
                       .ab = VH_DTYPE_BF16, .c = VH_DTYPE_F32, .alpha = 1.0f, .pad = pad * 3};
            char name[96];
            snprintf(name, sizeof name, "batch 3 ta%d tb%d pad %d", t.ta, t.tb, t.pad);
            run_case(&t, name);
        }
    gcase t = {.batch = 4, .m = 17, .n = 33, .k = 65, .ab = VH_DTYPE_F32, .c = VH_DTYPE_F32,
               .alpha = 1.0f, .broadcast_b = 1, .bias = 1 + VH_DTYPE_F32};
    run_case(&t, "batch 4, B broadcast (stride 0), bias");
    t.ab = VH_DTYPE_F16, t.c = VH_DTYPE_F16, t.bias = 1 + VH_DTYPE_F16;
    run_case(&t, "batch 4 f16, B broadcast, bias");
}

static void test_bias_alpha_beta(void **state) {
    (void)state;
    const vh_dtype dt[3] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};
    for (int y = 0; y < 3; y++)
        for (int bd = 0; bd < 3; bd++) {
            gcase t = {.tb = 1, .batch = 1, .m = 17, .n = 33, .k = 65, .ab = VH_DTYPE_BF16,
                       .c = dt[y], .bias = 1 + (int)dt[bd], .alpha = 1.0f};
            char name[96];
            snprintf(name, sizeof name, "bias %s, C %s", dn(dt[bd]), dn(dt[y]));
            run_case(&t, name);
            t.alpha = 0.5f, t.beta = 0.75f;
            snprintf(name, sizeof name, "bias %s, C %s, alpha 0.5 beta 0.75", dn(dt[bd]), dn(dt[y]));
            run_case(&t, name);
        }
}

static void test_gelu_aux(void **state) {
    (void)state;
    const vh_dtype dt[3] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};
    for (int y = 0; y < 3; y++)
        for (int aux = 0; aux < 2; aux++) {
            gcase t = {.tb = 1, .batch = 1, .m = 17, .n = 33, .k = 65, .ab = dt[y], .c = dt[y],
                       .bias = 1 + (int)dt[y], .gelu = 1, .aux = aux, .alpha = 1.0f};
            char name[96];
            snprintf(name, sizeof name, "GELU %s aux %d", dn(dt[y]), aux);
            run_case(&t, name);
            t.residual = RES_OWN, t.beta = 0.5f, t.batch = 2;
            snprintf(name, sizeof name, "GELU %s aux %d + residual + beta, batch 2", dn(dt[y]), aux);
            run_case(&t, name);
        }
}

/* ABI 2.5: gelu'(T) kept in aux, and C = T * aux, against the CPU twin. */
static void test_gelu_grad_mul_aux(void **state) {
    (void)state;
    const vh_dtype dt[2] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    for (int y = 0; y < 2; y++)
        for (int e = VH_EPILOGUE_GELU_GRAD; e <= VH_EPILOGUE_MUL_AUX; e++) {
            gcase t = {.tb = e == VH_EPILOGUE_GELU_GRAD, .batch = 1, .m = 17, .n = 33, .k = 65,
                       .ab = dt[y], .c = dt[y], .bias = 1 + (int)dt[y], .gelu = e, .aux = 1,
                       .alpha = 1.0f};
            char name[96];
            snprintf(name, sizeof name, "%s %s", e == VH_EPILOGUE_GELU_GRAD ? "GELU_GRAD" : "MUL_AUX",
                     dn(dt[y]));
            run_case(&t, name);
            t.residual = RES_OWN, t.beta = 0.5f, t.batch = 2;
            snprintf(name, sizeof name, "%s %s + residual + beta, batch 2",
                     e == VH_EPILOGUE_GELU_GRAD ? "GELU_GRAD" : "MUL_AUX", dn(dt[y]));
            run_case(&t, name);
        }
}

static void test_residual(void **state) {
    (void)state;
    const vh_dtype dt[2] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    for (int y = 0; y < 2; y++)
        for (int r = RES_OWN; r <= RES_IS_C; r++)
            for (int beta = 0; beta < 2; beta++) {
                gcase t = {.tb = 1, .batch = 1, .m = 33, .n = 17, .k = 65, .ab = dt[y], .c = dt[y],
                           .bias = 1 + (int)dt[y], .residual = r, .alpha = 1.0f,
                           .beta = beta ? -0.5f : 0.0f};
                char name[96];
                snprintf(name, sizeof name, "residual %s %s, beta %g", r == RES_IS_C ? "is C" : "own",
                         dn(dt[y]), (double)t.beta);
                run_case(&t, name);
            }
}

/* k = 0 and alpha = 0: A and B are not read; T is the bias alone. */
static void test_no_product(void **state) {
    (void)state;
    gcase t = {.batch = 2, .m = 5, .n = 7, .k = 0, .ab = VH_DTYPE_F32, .c = VH_DTYPE_F32,
               .bias = 1 + VH_DTYPE_F32, .alpha = 1.0f, .beta = 0.5f};
    run_case(&t, "k = 0, bias, beta");
    t.k = 9, t.alpha = 0.0f, t.gelu = 1, t.aux = 1;
    run_case(&t, "alpha = 0, GELU, aux");
}

/* fc1 of ViT-B/16 at batch 8, bf16 AMP: 1576 x 3072 x 768 with GELU and aux,
 * then fc2 with the residual. Twice: the second runs on cached plans. */
static void test_vit_shapes(void **state) {
    (void)state;
    for (int rep = 0; rep < 2; rep++) {
        gcase fc1 = {.tb = 1, .batch = 1, .m = 1576, .n = 3072, .k = 768, .ab = VH_DTYPE_BF16,
                     .c = VH_DTYPE_BF16, .bias = 1 + VH_DTYPE_BF16, .gelu = 1, .aux = 1,
                     .alpha = 1.0f};
        run_case(&fc1, "ViT-B fc1 bf16 GELU aux");
        gcase fc2 = {.tb = 1, .batch = 1, .m = 1576, .n = 768, .k = 3072, .ab = VH_DTYPE_BF16,
                     .c = VH_DTYPE_BF16, .bias = 1 + VH_DTYPE_BF16, .residual = RES_OWN,
                     .alpha = 1.0f};
        run_case(&fc2, "ViT-B fc2 bf16 residual");
        gcase dw = {.ta = 1, .batch = 1, .m = 768, .n = 3072, .k = 1576, .ab = VH_DTYPE_BF16,
                    .c = VH_DTYPE_F32, .alpha = 1.0f, .beta = 1.0f};
        run_case(&dw, "ViT-B fc1 dW (A^T, accumulate into f32)");
    }
}

/* Bad arguments get the CPU twin's statuses. */
static void test_argument_checks(void **state) {
    (void)state;
    float dummy[64];
    void *d = NULL;
    assert_int_equal(twin.gpu.alloc(twin.gpu.device, 4096, &d), VH_STATUS_OK);
    const vh_gemm_args good = {.struct_size = sizeof good, .m = 4, .n = 4, .k = 4, .alpha = 1.0f,
                               .lda = 4, .ldb = 4, .ldc = 4};
    vh_gemm_args bad[8];
    for (int i = 0; i < 8; i++) bad[i] = good;
    bad[0].lda = 3;
    bad[1].ldc = 3;
    bad[2].ab_dtype = 9;
    bad[3].m = -1;
    bad[4].batch = 2; /* stride_c 0: C[i] would alias */
    bad[5].epilogue = 5;
    bad[6].stride_a = -1;
    bad[7].struct_size = 8;
    for (int i = 0; i < 8; i++) {
        vh_gemm_args h = bad[i], g = bad[i];
        h.a = h.b = h.c = dummy;
        g.a = g.b = g.c = d;
        const vh_status want = twin.cpu->gemm(twin.cpu->device, &h);
        assert_int_not_equal(want, VH_STATUS_OK);
        assert_int_equal(twin.gpu.gemm(twin.gpu.device, &g), want);
    }
    assert_int_equal(twin.gpu.gemm(twin.gpu.device, NULL), VH_STATUS_ERR_INVALID_ARG);
    vh_gemm_args empty = good;
    empty.m = 0;
    empty.a = empty.b = empty.c = d;
    assert_int_equal(twin.gpu.gemm(twin.gpu.device, &empty), VH_STATUS_OK);
    twin.gpu.free(twin.gpu.device, d);
}

int main(void) {
    gpu_twin_open(&twin, "test_cuda_gemm");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trans_and_dtypes), cmocka_unit_test(test_batched),
        cmocka_unit_test(test_bias_alpha_beta),  cmocka_unit_test(test_gelu_aux),
        cmocka_unit_test(test_gelu_grad_mul_aux),
        cmocka_unit_test(test_residual),         cmocka_unit_test(test_no_product),
        cmocka_unit_test(test_vit_shapes),       cmocka_unit_test(test_argument_checks),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_twin_close(&twin);
    return failed;
}
