/* test_ops.c - the CPU device's compute ops and vh_param_init.
 *
 * Every op is compared with a naive reference written here in double, on
 * small odd shapes; every backward op is also checked against central
 * differences of its own forward op (in double around float values), and
 * for accumulation (+=). Attention runs in both layouts, which must agree.
 * Cross-entropy is also checked against values from PyTorch 1.13. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vithost/vh_params.h"
#include "vithost/vh_runtime.h"

/* Named tolerances: |got - want| <= abs + rel * |want|. */
#define TOL_GEMM_ABS 1e-5
#define TOL_GEMM_REL 1e-5
#define TOL_LN_ABS 2e-5
#define TOL_LN_REL 2e-5
#define TOL_GELU_ABS 5e-7 /* measured 3.8e-7 at worst (|x| ~ 14) */
#define TOL_GELU_REL 2e-6
#define TOL_EW_ABS 1e-6   /* element-wise, softmax, pooling */
#define TOL_EW_REL 1e-6
#define TOL_ATTN_ABS 2e-6
#define TOL_ATTN_REL 1e-5
#define TOL_LAYOUT 1e-6   /* batch-first vs batch-second: summation order only */
#define TOL_CE 1e-6       /* cross-entropy vs PyTorch (float64) values */
#define TOL_FD 3e-3       /* finite differences of float forward ops, relative to 1+|g| */
#define TOL_EXP_ULP 2.0   /* softmax's exponential */

static const double kPi = 3.14159265358979323846;

static const vh_device_ops *ops;

static int setup(void **state) {
    (void)state;
    ops = vh_cpu_device_ops();
    return ops ? 0 : -1;
}

/* ---- the 1.0 signatures over the 2.0 argument structs -----------------------
 * The checks below were written against one function per op with its
 * arguments spelled out; these build the f32 argument struct and call the op,
 * so every check keeps its shape. */

static vh_status op_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                                      const float *w, const float *b, int64_t rows,
                                      int64_t dim, float eps) {
    vh_layernorm_args a = {.struct_size = sizeof a, .rows = rows, .dim = dim, .eps = eps,
                           .x = x, .weight = w, .bias = b, .mean = mean, .rstd = rstd,
                           .out = out};
    return ops->layernorm_forward(ops->device, &a);
}

static vh_status op_layernorm_backward(float *dx, float *dw, float *db, const float *dout,
                                       const float *x, const float *w, float *mean,
                                       float *rstd, int64_t rows, int64_t dim) {
    vh_layernorm_args a = {.struct_size = sizeof a, .rows = rows, .dim = dim, .x = x,
                           .weight = w, .mean = mean, .rstd = rstd, .dout = dout, .dx = dx,
                           .dweight = dw, .dbias = db};
    return ops->layernorm_backward(ops->device, &a);
}

static vh_status op_gelu_forward(float *out, const float *x, int64_t n) {
    vh_eltwise_args a = {.struct_size = sizeof a, .n = n, .x = x, .out = out};
    return ops->gelu_forward(ops->device, &a);
}

static vh_status op_gelu_backward(float *dx, const float *x, const float *dout, int64_t n) {
    vh_eltwise_args a = {.struct_size = sizeof a, .n = n, .x = x, .dout = dout, .dx = dx};
    return ops->gelu_backward(ops->device, &a);
}

static vh_status op_add(float *out, const float *x, const float *y, int64_t n) {
    vh_eltwise_args a = {.struct_size = sizeof a, .n = n, .a = x, .b = y, .out = out};
    return ops->add(ops->device, &a);
}

static vh_status op_mul(float *out, const float *x, const float *y, int64_t n, int acc) {
    vh_eltwise_args a = {.struct_size = sizeof a, .n = n, .a = x, .b = y, .out = out,
                         .accumulate = acc};
    return ops->mul(ops->device, &a);
}

static vh_status op_dropout_forward(float *out, float *mask, const float *x, int64_t n,
                                    float p, uint64_t seed) {
    vh_eltwise_args a = {.struct_size = sizeof a, .n = n, .x = x, .out = out, .mask = mask,
                         .p = p, .seed = seed};
    return ops->dropout_forward(ops->device, &a);
}

static vh_status op_scale_rows(float *out, const float *in, const float *scale, int64_t rows,
                               int64_t dim, int64_t div, int64_t mod, int acc) {
    vh_eltwise_args a = {.struct_size = sizeof a, .n = rows * dim, .x = in, .out = out,
                         .scale = scale, .dim = dim, .div = div, .mod = mod,
                         .accumulate = acc};
    return ops->scale_rows(ops->device, &a);
}

static vh_status op_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols) {
    vh_rows_args a = {.struct_size = sizeof a, .rows = rows, .cols = cols, .dout = dout,
                      .out = dbias};
    return ops->bias_backward(ops->device, &a);
}

static vh_status op_softmax(float *x, int64_t rows, int64_t cols) {
    vh_rows_args a = {.struct_size = sizeof a, .rows = rows, .cols = cols, .x = x, .out = x};
    return ops->softmax(ops->device, &a);
}

/* The loss is written in device memory: the CPU's is host memory. */
static vh_status op_softmax_cross_entropy(float *loss, float *dlogits, const float *logits,
                                          const int32_t *labels, int64_t batch,
                                          int64_t classes, float smoothing, float scale) {
    vh_xent_args a = {.struct_size = sizeof a, .batch = batch, .classes = classes,
                      .smoothing = smoothing, .dloss_scale = scale, .logits = logits,
                      .labels = labels, .loss = loss, .dlogits = dlogits};
    return ops->softmax_cross_entropy(ops->device, &a);
}

static vh_status op_mean_pool_forward(float *out, const float *x, int64_t batch, int64_t first,
                                      int64_t count, int64_t dim, int64_t bs, int64_t ts) {
    vh_tokens_args a = {.struct_size = sizeof a, .batch = batch, .dim = dim, .batch_stride = bs,
                        .token_stride = ts, .first = first, .count = count, .x = x,
                        .out = out};
    return ops->mean_pool_forward(ops->device, &a);
}

static vh_status op_mean_pool_backward(float *dx, const float *dout, int64_t batch,
                                       int64_t first, int64_t count, int64_t dim, int64_t bs,
                                       int64_t ts) {
    vh_tokens_args a = {.struct_size = sizeof a, .batch = batch, .dim = dim, .batch_stride = bs,
                        .token_stride = ts, .first = first, .count = count, .dout = dout,
                        .dx = dx};
    return ops->mean_pool_backward(ops->device, &a);
}

static vh_status op_patchify(float *out, const float *images, int64_t batch, int64_t channels,
                             int64_t height, int64_t width, int64_t patch, int64_t bs,
                             int64_t ts) {
    vh_tokens_args a = {.struct_size = sizeof a, .batch = batch, .batch_stride = bs,
                        .token_stride = ts, .out = out, .images = images,
                        .channels = channels, .height = height, .width = width,
                        .patch = patch};
    return ops->patchify(ops->device, &a);
}

static vh_status op_embed_forward(float *x, const float *patches, const float *cls,
                                  const float *pos, int64_t batch, int64_t np, int64_t dim,
                                  int64_t bs, int64_t ts, int64_t pbs, int64_t pts) {
    vh_tokens_args a = {.struct_size = sizeof a, .batch = batch, .tokens = np + (cls != NULL),
                        .dim = dim, .batch_stride = bs, .token_stride = ts, .out = x,
                        .num_patches = np, .patch_batch_stride = pbs,
                        .patch_token_stride = pts, .patches = patches, .cls = cls,
                        .pos = pos};
    return ops->embed_forward(ops->device, &a);
}

static vh_status op_embed_backward(float *dpatches, float *dcls, float *dpos, const float *dx,
                                   int64_t batch, int64_t np, int64_t dim, int64_t bs,
                                   int64_t ts, int64_t pbs, int64_t pts) {
    vh_tokens_args a = {.struct_size = sizeof a, .batch = batch, .tokens = np + (dcls != NULL),
                        .dim = dim, .batch_stride = bs, .token_stride = ts, .dout = dx,
                        .num_patches = np, .patch_batch_stride = pbs,
                        .patch_token_stride = pts, .dpatches = dpatches, .dcls = dcls,
                        .dpos = dpos};
    return ops->embed_backward(ops->device, &a);
}

/* ---- helpers ----------------------------------------------------------- */

static uint64_t rng_state;

static double rnd(void) { /* splitmix64, uniform in [0, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

static float *rand_buf(int64_t n, double lo, double hi) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * rnd());
    return p;
}

static double *dbuf(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    assert_non_null(p);
    return p;
}

static float *fcopy(const float *src, int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(p);
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

/* Reports where an expect_close failed. */
static void fail_at(const char *what, const float *got, const double *want, int64_t i,
                    const char *file, int line) {
    print_error("%s:%d: %s: element %lld is %.9g, expected %.9g\n", file, line, what,
                (long long)i, (double)got[i], want[i]);
    fail();
}

static void expect_close_(const char *what, const float *got, const double *want, int64_t n,
                          double atol, double rtol, const char *file, int line) {
    int64_t worst = -1;
    double worst_excess = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        double lim = atol + rtol * fabs(want[i]);
        if (!(err <= lim) && (worst < 0 || err - lim > worst_excess)) {
            worst = i;
            worst_excess = err - lim;
        }
    }
    if (worst >= 0) fail_at(what, got, want, worst, file, line);
}
#define expect_close(what, got, want, n, atol, rtol) \
    expect_close_(what, got, want, n, atol, rtol, __FILE__, __LINE__)

/* Reference values in float, to compare float results exactly. */
static void expect_equal_floats(const char *what, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            print_error("%s: element %lld differs: %.9g vs %.9g\n", what, (long long)i,
                        (double)a[i], (double)b[i]);
            fail();
        }
    }
}

static double dot_fd(const float *out, const float *r, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)out[i] * (double)r[i];
    return s;
}

/* Central differences of loss() around the float values x[i], for a few
 * spread indices, against the analytic gradient grad. */
typedef double (*loss_fn)(void *ctx);

static void check_fd(const char *what, loss_fn loss, void *ctx, float *x, const float *grad,
                     int64_t n, int probes) {
    for (int k = 0; k < probes; k++) {
        const int64_t i = (int64_t)(((uint64_t)k * 7919u + 13u) % (uint64_t)n);
        const float x0 = x[i];
        const float h = 1e-2f * (fabsf(x0) > 1.0f ? fabsf(x0) : 1.0f);
        const float xp = x0 + h, xm = x0 - h;
        x[i] = xp;
        const double lp = loss(ctx);
        x[i] = xm;
        const double lm = loss(ctx);
        x[i] = x0;
        const double fd = (lp - lm) / ((double)xp - (double)xm);
        if (!(fabs(fd - (double)grad[i]) <= TOL_FD * (1.0 + fabs(fd)))) {
            print_error("%s: d/dx[%lld]: analytic %.7g, finite differences %.7g\n", what,
                        (long long)i, (double)grad[i], fd);
            fail();
        }
    }
}

/* ---- gemm -------------------------------------------------------------- */

static double mat_at(const float *p, int trans, int64_t ld, int64_t r, int64_t c) {
    return (double)(trans ? p[c * ld + r] : p[r * ld + c]);
}

static void ref_gemm(const vh_gemm_args *g, const float *c_before, double *want) {
    const int64_t batch = g->batch > 1 ? g->batch : 1;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) {
                double s = 0.0;
                for (int64_t k = 0; k < g->k; k++)
                    s += mat_at((const float *)g->a + b * g->stride_a, g->trans_a, g->lda, i,
                                k) *
                         mat_at((const float *)g->b + b * g->stride_b, g->trans_b, g->ldb, k,
                                j);
                const int64_t ci = b * g->stride_c + i * g->ldc + j;
                double v = (double)g->alpha * s;
                if (g->beta != 0.0f) v += (double)g->beta * (double)c_before[ci];
                if (g->bias) v += (double)((const float *)g->bias)[j];
                want[ci] = v;
            }
}

/* Runs one gemm and checks every element of C (padding included: untouched). */
static void run_gemm_case(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t batch,
                          float alpha, float beta, int with_bias, int nan_c) {
    const int64_t pad = 3;
    const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    const int64_t rows_a = ta ? k : m, rows_b = tb ? n : k;
    const int64_t bcount = batch > 1 ? batch : 1;
    const int64_t sa = rows_a * lda + 5, sb = rows_b * ldb + 7, sc = m * ldc + 2;
    float *a = rand_buf(sa * bcount, -1, 1), *b = rand_buf(sb * bcount, -1, 1);
    float *c = rand_buf(sc * bcount, -1, 1), *bias = rand_buf(n, -1, 1);
    if (nan_c) /* beta == 0 must not read C */
        for (int64_t b2 = 0; b2 < bcount; b2++)
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) c[b2 * sc + i * ldc + j] = NAN;
    float *c0 = fcopy(c, sc * bcount);
    double *want = dbuf(sc * bcount);
    for (int64_t i = 0; i < sc * bcount; i++) want[i] = (double)c0[i]; /* padding */
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = ta, .trans_b = tb, .m = m, .n = n,
                      .k = k, .alpha = alpha, .beta = beta, .a = a, .lda = lda,
                      .stride_a = sa, .b = b, .ldb = ldb, .stride_b = sb, .c = c,
                      .ldc = ldc, .stride_c = sc, .batch = batch,
                      .bias = with_bias ? bias : NULL};
    ref_gemm(&g, c0, want);
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    char what[96];
    snprintf(what, sizeof what, "gemm ta=%d tb=%d %lldx%lldx%lld batch=%lld bias=%d", ta, tb,
             (long long)m, (long long)n, (long long)k, (long long)batch, with_bias);
    expect_close(what, c, want, sc * bcount, TOL_GEMM_ABS, TOL_GEMM_REL);
    free(a);
    free(b);
    free(c);
    free(c0);
    free(bias);
    free(want);
}

static void test_gemm_transposes(void **state) {
    (void)state;
    rng_state = 1;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            run_gemm_case(ta, tb, 7, 5, 9, 1, 0.7f, 0.3f, 0, 0);
            run_gemm_case(ta, tb, 7, 5, 9, 1, 1.0f, 0.0f, 1, 1);  /* bias preloaded */
            run_gemm_case(ta, tb, 7, 5, 9, 1, -1.5f, 0.5f, 1, 0); /* bias added after */
            run_gemm_case(ta, tb, 7, 5, 9, 0, 1.0f, 0.0f, 0, 1);  /* batch 0 = one */
        }
}

static void test_gemm_batched(void **state) {
    (void)state;
    rng_state = 2;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            run_gemm_case(ta, tb, 7, 5, 9, 3, 0.5f, 1.0f, 1, 0); /* small: parallel batch */
            run_gemm_case(ta, tb, 17, 13, 16, 8, 1.0f, 0.0f, 0, 1);
        }
    run_gemm_case(0, 1, 100, 100, 100, 2, 1.0f, 0.0f, 1, 0); /* big: one threaded matmul */
    run_gemm_case(1, 0, 130, 70, 110, 1, 1.0f, 0.25f, 0, 0);
}

static double ref_gelu(double x);

/* The epilogue: T = alpha A B + bias, C = gelu(T) + residual + beta C, aux = T;
 * batched, transposed, residual aliasing C, and a 1.0-sized struct. */
static void run_epilogue_case(int ta, int tb, int64_t batch, int gelu, int with_aux,
                              int with_res, int res_is_c, float beta, float alpha) {
    const int64_t m = 9, n = 13, k = 11, pad = 2;
    const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    const int64_t sa = (ta ? k : m) * lda, sb = (tb ? n : k) * ldb, sc = m * ldc + 3;
    const int64_t bc = batch > 1 ? batch : 1;
    float *a = rand_buf(sa * bc, -1, 1), *b = rand_buf(sb * bc, -1, 1);
    float *c = rand_buf(sc * bc, -1, 1), *bias = rand_buf(n, -1, 1);
    float *aux = rand_buf(sc * bc, -1, 1), *res = rand_buf(sc * bc, -1, 1);
    if (res_is_c) memcpy(res, c, (size_t)(sc * bc) * sizeof(float));
    double *want = dbuf(sc * bc), *want_aux = dbuf(sc * bc);
    for (int64_t i = 0; i < sc * bc; i++) want[i] = c[i], want_aux[i] = aux[i];
    for (int64_t q = 0; q < bc; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double t = 0;
                for (int64_t l = 0; l < k; l++)
                    t += mat_at(a + q * sa, ta, lda, i, l) * mat_at(b + q * sb, tb, ldb, l, j);
                t = (double)alpha * t + bias[j];
                const int64_t ci = q * sc + i * ldc + j;
                double v = gelu ? ref_gelu(t) : t;
                if (with_res) v += res[ci];
                v += (double)beta * c[ci];
                want[ci] = v;
                if (gelu && with_aux) want_aux[ci] = t;
            }
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = ta, .trans_b = tb, .m = m, .n = n,
                      .k = k, .alpha = alpha, .beta = beta, .a = a, .lda = lda,
                      .stride_a = sa, .b = b, .ldb = ldb, .stride_b = sb, .c = c, .ldc = ldc,
                      .stride_c = sc, .batch = batch, .bias = bias,
                      .epilogue = gelu ? VH_EPILOGUE_GELU : VH_EPILOGUE_NONE,
                      .aux = with_aux ? aux : NULL,
                      .residual = with_res ? (res_is_c ? c : res) : NULL};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    char what[192];
    snprintf(what, sizeof what,
             "gemm epilogue ta=%d tb=%d batch=%lld gelu=%d aux=%d res=%d%s alpha=%g", ta, tb,
             (long long)batch, gelu, with_aux, with_res, res_is_c ? " (aliases C)" : "",
             (double)alpha);
    expect_close(what, c, want, sc * bc, TOL_GEMM_ABS, TOL_GEMM_REL);
    expect_close(what, aux, want_aux, sc * bc, TOL_GEMM_ABS, TOL_GEMM_REL);
    free(a), free(b), free(c), free(bias), free(aux), free(res), free(want), free(want_aux);
}

static void test_gemm_epilogue(void **state) {
    (void)state;
    rng_state = 17;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            run_epilogue_case(ta, tb, 1, 1, 1, 0, 0, 0.0f, 0.75f);
            run_epilogue_case(ta, tb, 3, 1, 0, 1, 0, 0.5f, 0.75f);
        }
    run_epilogue_case(0, 1, 1, 1, 1, 1, 0, 0.0f, 0.75f);
    run_epilogue_case(0, 1, 2, 0, 0, 1, 0, 0.0f, 0.75f); /* residual alone */
    run_epilogue_case(0, 1, 1, 0, 0, 1, 1, 0.0f, 0.75f); /* x = x + proj(...): residual is C */
    run_epilogue_case(1, 0, 1, 0, 0, 1, 0, 1.0f, 0.75f); /* dW += ... with a residual */
    run_epilogue_case(0, 0, 2, 1, 1, 1, 1, 0.0f, 0.75f);
    /* alpha 1 with a bias: the fused route (one oneDNN matmul with its
     * post-ops); unbatched with beta 0, the residual is added by a pass
     * after it (no copy into C; test_gemm_residual_routes), else it is
     * copied into C first. */
    for (int gelu = 0; gelu < 2; gelu++) {
        run_epilogue_case(0, 1, 1, gelu, 0, 1, 0, 0.0f, 1.0f);
        run_epilogue_case(1, 0, 1, gelu, 0, 1, 0, 0.0f, 1.0f);
        run_epilogue_case(0, 1, 2, gelu, 0, 1, 0, 0.0f, 1.0f);
        run_epilogue_case(0, 1, 1, gelu, 0, 1, 0, 0.5f, 1.0f);
        run_epilogue_case(0, 1, 1, gelu, 0, 1, 1, 0.0f, 1.0f);
        run_epilogue_case(0, 1, 1, gelu, 0, 0, 0, 0.0f, 1.0f);
    }

    /* A caller built against 1.0 (the struct ended at bias): f32, no epilogue. */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, c[4] = {9, 9, 9, 9};
    vh_gemm_args g;
    memset(&g, 0x7f, sizeof g); /* whatever lies past the old end must not be read */
    g.struct_size = (uint32_t)offsetof(vh_gemm_args, ab_dtype);
    g.trans_a = 0, g.trans_b = 0, g.m = 2, g.n = 2, g.k = 3, g.alpha = 1, g.beta = 0;
    g.a = a, g.lda = 3, g.stride_a = 0, g.b = b, g.ldb = 2, g.stride_b = 0;
    g.c = c, g.ldc = 2, g.stride_c = 0, g.batch = 1, g.bias = NULL;
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    const double cw[4] = {4, 5, 10, 11};
    expect_close("gemm, 1.0-sized struct", c, cw, 4, 0, 0);
    g.struct_size = (uint32_t)offsetof(vh_gemm_args, bias);
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_ERR_INVALID_ARG);
}

static void test_gemm_broadcast_and_edges(void **state) {
    (void)state;
    rng_state = 3;
    /* stride_a = 0: one weight for every batch member. */
    const int64_t m = 4, n = 3, k = 5, batch = 3;
    float *a = rand_buf(m * k, -1, 1), *b = rand_buf(batch * k * n, -1, 1);
    float *c = rand_buf(batch * m * n, -1, 1);
    double *want = dbuf(batch * m * n);
    vh_gemm_args g = {.struct_size = sizeof g, .m = m, .n = n, .k = k, .alpha = 1.0f,
                      .a = a, .lda = k, .stride_a = 0, .b = b, .ldb = n, .stride_b = k * n,
                      .c = c, .ldc = n, .stride_c = m * n, .batch = batch};
    ref_gemm(&g, c, want);
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    expect_close("gemm stride_a=0", c, want, batch * m * n, TOL_GEMM_ABS, TOL_GEMM_REL);

    /* k = 0: C = beta C + bias. */
    float cc[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {10, 20, 30};
    vh_gemm_args z = {.struct_size = sizeof z, .m = 2, .n = 3, .k = 0, .alpha = 1.0f,
                      .beta = 0.5f, .lda = 1, .ldb = 3, .c = cc, .ldc = 3, .bias = bias};
    assert_int_equal(ops->gemm(ops->device, &z), VH_STATUS_OK);
    const double zwant[6] = {10.5, 21, 31.5, 12, 22.5, 33};
    expect_close("gemm k=0", cc, zwant, 6, 0, 0);
    /* m = 0: nothing to do, nothing read. */
    vh_gemm_args e = {.struct_size = sizeof e, .m = 0, .n = 3, .k = 2, .lda = 2, .ldb = 3,
                      .ldc = 3};
    assert_int_equal(ops->gemm(ops->device, &e), VH_STATUS_OK);

    /* Invalid arguments are refused, never crash. */
    vh_gemm_args bad = g;
    assert_int_equal(ops->gemm(ops->device, NULL), VH_STATUS_ERR_INVALID_ARG);
    bad.struct_size = 8;
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    bad = g;
    bad.m = -1;
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    bad = g;
    bad.lda = k - 1;
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    bad = g;
    bad.trans_b = 1; /* B stored n x k: ldb >= k = 5 > 3 */
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    bad = g;
    bad.c = NULL;
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    bad = g;
    bad.b = NULL;
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    bad = g;
    bad.stride_c = 0;
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    bad = g;
    bad.stride_b = -1;
    assert_int_equal(ops->gemm(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
    free(a);
    free(b);
    free(c);
    free(want);
}

/* ---- layernorm --------------------------------------------------------- */

typedef struct ln_case {
    int64_t rows, dim;
    float eps;
    float *x, *w, *b, *out, *mean, *rstd, *r;
} ln_case;

static double ln_loss(void *ctx) {
    ln_case *c = ctx;
    assert_int_equal(op_layernorm_forward(c->out, c->mean, c->rstd, c->x, c->w,
                                            c->b, c->rows, c->dim, c->eps),
                     VH_STATUS_OK);
    return dot_fd(c->out, c->r, c->rows * c->dim);
}

/* C of one fused call C = epilogue(A B^T + bias) + residual (beta 0, one
 * member, C f32 with gaps between rows), the residual added by gemm.c's pass
 * after the matmul (postop 0) or by oneDNN's binary-add post-op
 * (VITHOST_CPU_RESIDUAL=postop). */
static float *residual_call(int64_t m, int64_t n, int64_t k, vh_epilogue ep, int postop) {
    const int64_t ldc = n + 3;
    const uint64_t saved = rng_state;
    rng_state = 4242; /* both routes on the same values */
    float *a = rand_buf(m * k, -1, 1), *b = rand_buf(n * k, -1, 1), *bias = rand_buf(n, -1, 1);
    float *res = rand_buf(m * ldc, -1, 1), *aux = rand_buf(m * ldc, -1, 1);
    float *c = rand_buf(m * ldc, -1, 1);
    rng_state = saved;
    vh_gemm_args g = {.struct_size = sizeof g, .trans_b = 1, .m = m, .n = n, .k = k,
                      .alpha = 1.0f, .a = a, .lda = k, .b = b, .ldb = k, .c = c, .ldc = ldc,
                      .bias = bias, .epilogue = ep,
                      .aux = ep == VH_EPILOGUE_MUL_AUX ? aux : NULL, .residual = res};
    if (postop) setenv("VITHOST_CPU_RESIDUAL", "postop", 1);
    const vh_status st = ops->gemm(ops->device, &g);
    if (postop) unsetenv("VITHOST_CPU_RESIDUAL");
    assert_int_equal(st, VH_STATUS_OK);
    free(a), free(b), free(bias), free(res), free(aux);
    return c;
}

/* The residual added after the matmul is the sum the binary-add post-op
 * forms, (T + bias) + r in fp32, so the two routes give the same bits:
 * small and threaded (the pass's rows split) calls, each epilogue the
 * fused route takes. An addition in another order (r + bias first, or the
 * residual inside T) fails it. */
static void test_gemm_residual_routes(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{9, 13, 11}, {300, 96, 64}, {1576, 384, 384}};
    const vh_epilogue eps[] = {VH_EPILOGUE_NONE, VH_EPILOGUE_GELU, VH_EPILOGUE_MUL_AUX};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t e = 0; e < sizeof eps / sizeof eps[0]; e++) {
            const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            float *pass = residual_call(m, n, k, eps[e], 0);
            float *postop = residual_call(m, n, k, eps[e], 1);
            if (memcmp(pass, postop, (size_t)(m * (n + 3)) * sizeof(float)) != 0)
                fail_msg("gemm %lldx%lldx%lld epilogue %d + residual: the pass and the "
                         "post-op give other bits",
                         (long long)m, (long long)n, (long long)k, (int)eps[e]);
            free(pass), free(postop);
        }
}

static void test_layernorm(void **state) {
    (void)state;
    rng_state = 4;
    const int64_t rows = 7, dim = 48, n = rows * dim;
    ln_case c = {.rows = rows, .dim = dim, .eps = 1e-5f};
    c.x = rand_buf(n, -2, 2);
    for (int64_t j = 0; j < dim; j++) c.x[dim + j] += 1000.0f; /* a row far from 0 */
    c.w = rand_buf(dim, 0.5, 1.5);
    c.b = rand_buf(dim, -0.5, 0.5);
    c.out = rand_buf(n, 0, 1);
    c.mean = rand_buf(rows, 0, 1);
    c.rstd = rand_buf(rows, 0, 1);
    c.r = rand_buf(n, -1, 1); /* dL/dout */

    double *want = dbuf(n), *wmean = dbuf(rows), *wrstd = dbuf(rows);
    double *wdx = dbuf(n), *wdw = dbuf(dim), *wdb = dbuf(dim);
    float *dx = rand_buf(n, -1, 1), *dw = rand_buf(dim, -1, 1), *db = rand_buf(dim, -1, 1);
    for (int64_t j = 0; j < dim; j++) {
        wdw[j] = dw[j];
        wdb[j] = db[j];
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *x = c.x + r * dim;
        double m = 0, v = 0;
        for (int64_t j = 0; j < dim; j++) m += x[j];
        m /= (double)dim;
        for (int64_t j = 0; j < dim; j++) v += (x[j] - m) * (x[j] - m);
        v /= (double)dim; /* biased, as PyTorch */
        const double s = 1.0 / sqrt(v + (double)c.eps);
        wmean[r] = m;
        wrstd[r] = s;
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < dim; j++) {
            const double xh = (x[j] - m) * s, g = c.r[r * dim + j];
            want[r * dim + j] = xh * c.w[j] + c.b[j];
            sg += g * c.w[j];
            sgx += g * c.w[j] * xh;
            wdw[j] += g * xh;
            wdb[j] += g;
        }
        for (int64_t j = 0; j < dim; j++) {
            const double xh = (x[j] - m) * s, g = c.r[r * dim + j];
            wdx[r * dim + j] = dx[r * dim + j] + s * (g * c.w[j] - sg / dim - xh * sgx / dim);
        }
    }
    ln_loss(&c);
    expect_close("layernorm out", c.out, want, n, TOL_LN_ABS, TOL_LN_REL);
    expect_close("layernorm mean", c.mean, wmean, rows, TOL_LN_ABS, TOL_LN_REL);
    expect_close("layernorm rstd", c.rstd, wrstd, rows, TOL_LN_ABS, TOL_LN_REL);

    assert_int_equal(op_layernorm_backward(dx, dw, db, c.r, c.x, c.w, c.mean,
                                             c.rstd, rows, dim),
                     VH_STATUS_OK);
    expect_close("layernorm dx (+=)", dx, wdx, n, TOL_LN_ABS, TOL_LN_REL);
    expect_close("layernorm dweight (+=)", dw, wdw, dim, TOL_LN_ABS, TOL_LN_REL);
    expect_close("layernorm dbias (+=)", db, wdb, dim, TOL_LN_ABS, TOL_LN_REL);

    /* Gradients alone (zeroed), against finite differences of the forward op;
     * without the offset row, whose float mean is too coarse for them. */
    for (int64_t j = 0; j < dim; j++) c.x[dim + j] -= 1000.0f;
    float *gx = calloc((size_t)n, sizeof(float)), *gw = calloc((size_t)dim, sizeof(float));
    float *gb = calloc((size_t)dim, sizeof(float));
    ln_loss(&c);
    assert_int_equal(op_layernorm_backward(gx, gw, gb, c.r, c.x, c.w, c.mean,
                                             c.rstd, rows, dim),
                     VH_STATUS_OK);
    check_fd("layernorm dx", ln_loss, &c, c.x, gx, n, 12);
    check_fd("layernorm dweight", ln_loss, &c, c.w, gw, dim, 6);
    check_fd("layernorm dbias", ln_loss, &c, c.b, gb, dim, 6);

    assert_int_equal(op_layernorm_forward(c.out, c.mean, c.rstd, NULL, c.w, c.b,
                                            rows, dim, c.eps),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_layernorm_forward(c.out, c.mean, c.rstd, c.x, c.w, c.b,
                                            -1, dim, c.eps),
                     VH_STATUS_ERR_INVALID_ARG);
    /* dweight and dbias NULL: skipped (dx alone, as with them). */
    float *gx2 = calloc((size_t)n, sizeof(float));
    assert_int_equal(op_layernorm_backward(gx2, NULL, NULL, c.r, c.x, c.w, c.mean, c.rstd, rows,
                                           dim),
                     VH_STATUS_OK);
    expect_equal_floats("layernorm dx without dweight/dbias", gx2, gx, n);
    free(gx2);
    assert_int_equal(op_layernorm_backward(NULL, gw, gb, c.r, c.x, c.w, c.mean, c.rstd, rows,
                                           dim),
                     VH_STATUS_ERR_INVALID_ARG);
    free(c.x), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.r);
    free(want), free(wmean), free(wrstd), free(wdx), free(wdw), free(wdb);
    free(dx), free(dw), free(db), free(gx), free(gw), free(gb);
}

/* Parameter gradients summed over many rows (chunks, threads). */
static void test_layernorm_many_rows(void **state) {
    (void)state;
    rng_state = 5;
    const int64_t rows = 1000, dim = 40, n = rows * dim;
    float *x = rand_buf(n, -2, 2), *w = rand_buf(dim, 0.5, 1.5), *b = rand_buf(dim, -1, 1);
    float *g = rand_buf(n, -1, 1), *out = rand_buf(n, 0, 1), *mean = rand_buf(rows, 0, 1);
    float *rstd = rand_buf(rows, 0, 1), *dx = calloc((size_t)n, sizeof(float));
    float *dw = calloc((size_t)dim, sizeof(float)), *db = calloc((size_t)dim, sizeof(float));
    assert_int_equal(op_layernorm_forward(out, mean, rstd, x, w, b, rows, dim,
                                            1e-6f),
                     VH_STATUS_OK);
    assert_int_equal(op_layernorm_backward(dx, dw, db, g, x, w, mean, rstd, rows,
                                             dim),
                     VH_STATUS_OK);
    double *wdw = dbuf(dim), *wdb = dbuf(dim);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < dim; j++) {
            wdw[j] += (double)g[r * dim + j] * ((double)x[r * dim + j] - mean[r]) * rstd[r];
            wdb[j] += g[r * dim + j];
        }
    expect_close("layernorm dweight, 1000 rows", dw, wdw, dim, 1e-4, 1e-5);
    expect_close("layernorm dbias, 1000 rows", db, wdb, dim, 1e-4, 1e-5);
    free(x), free(w), free(b), free(g), free(out), free(mean), free(rstd), free(dx), free(dw);
    free(db), free(wdw), free(wdb);
}

/* ---- GELU -------------------------------------------------------------- */

static double ref_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }

static double ref_gelu_grad(double x) {
    return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2.0 * kPi);
}

typedef struct ew_case {
    int64_t n;
    float *x, *out, *r;
} ew_case;

static double gelu_loss(void *ctx) {
    ew_case *c = ctx;
    assert_int_equal(op_gelu_forward(c->out, c->x, c->n), VH_STATUS_OK);
    return dot_fd(c->out, c->r, c->n);
}

static void test_gelu(void **state) {
    (void)state;
    rng_state = 6;
    /* A dense grid through both tails and a random set. */
    const int64_t grid = 28001, n = grid + 1001;
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < grid; i++) x[i] = -14.0f + 0.001f * (float)i;
    for (int64_t i = grid; i < n; i++) x[i] = (float)(6.0 * rnd() - 3.0);
    float *out = malloc((size_t)n * sizeof(float)), *dout = rand_buf(n, -1, 1);
    float *dx = rand_buf(n, -1, 1);
    double *want = dbuf(n), *wdx = dbuf(n);
    for (int64_t i = 0; i < n; i++) {
        want[i] = ref_gelu(x[i]);
        wdx[i] = dx[i] + dout[i] * ref_gelu_grad(x[i]);
    }
    assert_int_equal(op_gelu_forward(out, x, n), VH_STATUS_OK);
    expect_close("gelu", out, want, n, TOL_GELU_ABS, TOL_GELU_REL);
    assert_int_equal(op_gelu_backward(dx, x, dout, n), VH_STATUS_OK);
    expect_close("gelu backward (+=)", dx, wdx, n, TOL_GELU_ABS, 4 * TOL_GELU_REL);

    /* PyTorch 1.13, F.gelu in float64. */
    const float tx[7] = {-3.0f, -1.0f, -0.5f, 0.0f, 0.3f, 1.0f, 2.5f};
    const double tw[7] = {-0.00404969409489031, -0.15865525393145702, -0.15426876936299344, 0.0,
                          0.1853734266566858,   0.841344746068543,    2.4844758366855597};
    float to[7];
    assert_int_equal(op_gelu_forward(to, tx, 7), VH_STATUS_OK);
    expect_close("gelu vs PyTorch", to, tw, 7, TOL_GELU_ABS, TOL_GELU_REL);

    /* NaN propagates (overflow checks rely on it); infinities saturate. */
    const float sx[3] = {NAN, INFINITY, -INFINITY};
    float so[3];
    assert_int_equal(op_gelu_forward(so, sx, 3), VH_STATUS_OK);
    assert_true(isnan(so[0]));
    assert_true(isinf(so[1]) && so[1] > 0);

    ew_case c = {.n = 257, .x = rand_buf(257, -4, 4), .out = rand_buf(257, 0, 1),
                 .r = rand_buf(257, -1, 1)};
    float *g = calloc(257, sizeof(float));
    assert_int_equal(op_gelu_backward(g, c.x, c.r, c.n), VH_STATUS_OK);
    check_fd("gelu", gelu_loss, &c, c.x, g, c.n, 20);
    assert_int_equal(op_gelu_forward(out, NULL, n), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_gelu_backward(dx, x, dout, -2),
                     VH_STATUS_ERR_INVALID_ARG);
    free(x), free(out), free(dout), free(dx), free(want), free(wdx), free(c.x), free(c.out);
    free(c.r), free(g);
}

/* ---- element-wise ---------------------------------------------------------- */

static void test_add_mul(void **state) {
    (void)state;
    rng_state = 7;
    const int64_t n = 100003; /* large enough for the threaded path */
    float *a = rand_buf(n, -1, 1), *b = rand_buf(n, -1, 1), *out = rand_buf(n, -1, 1);
    double *want = dbuf(n);
    for (int64_t i = 0; i < n; i++) want[i] = (double)(a[i] + b[i]);
    assert_int_equal(op_add(out, a, b, n), VH_STATUS_OK);
    expect_close("add", out, want, n, 0, 0);
    float *a2 = fcopy(a, n);
    assert_int_equal(op_add(a2, a2, b, n), VH_STATUS_OK); /* out aliases a */
    expect_close("add in place", a2, want, n, 0, 0);

    for (int64_t i = 0; i < n; i++) want[i] = (double)(a[i] * b[i]);
    assert_int_equal(op_mul(out, a, b, n, 0), VH_STATUS_OK);
    expect_close("mul", out, want, n, 0, 0);
    for (int64_t i = 0; i < n; i++) want[i] = (double)(out[i] + a[i] * b[i]);
    assert_int_equal(op_mul(out, a, b, n, 1), VH_STATUS_OK);
    expect_close("mul accumulate", out, want, n, TOL_EW_ABS, TOL_EW_REL);

    assert_int_equal(op_add(out, a, b, 0), VH_STATUS_OK);
    assert_int_equal(op_add(out, NULL, b, n), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_mul(out, a, b, -1, 0), VH_STATUS_ERR_INVALID_ARG);
    free(a), free(b), free(out), free(want), free(a2);
}

typedef struct bias_case {
    int64_t rows, cols;
    float *x, *w, *bias, *c, *r;
} bias_case;

/* gemm with a bias epilogue: L = sum(C * R); dL/dbias = bias_backward(R). */
static double bias_loss(void *ctx) {
    bias_case *c = ctx;
    vh_gemm_args g = {.struct_size = sizeof g, .trans_b = 1, .m = c->rows, .n = c->cols,
                      .k = 6, .alpha = 1.0f, .a = c->x, .lda = 6, .b = c->w, .ldb = 6,
                      .c = c->c, .ldc = c->cols, .bias = c->bias};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    return dot_fd(c->c, c->r, c->rows * c->cols);
}

static void test_bias_backward(void **state) {
    (void)state;
    rng_state = 8;
    const int64_t shapes[3][2] = {{7, 48}, {1000, 37}, {3, 1}};
    for (int s = 0; s < 3; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        float *g = rand_buf(rows * cols, -1, 1), *db = rand_buf(cols, -1, 1);
        double *want = dbuf(cols);
        for (int64_t j = 0; j < cols; j++) want[j] = db[j];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < cols; j++) want[j] += g[r * cols + j];
        assert_int_equal(op_bias_backward(db, g, rows, cols), VH_STATUS_OK);
        expect_close("bias_backward (+=)", db, want, cols, 1e-5, 1e-5);
        free(g), free(db), free(want);
    }
    bias_case c = {.rows = 5, .cols = 9};
    c.x = rand_buf(5 * 6, -1, 1);
    c.w = rand_buf(9 * 6, -1, 1);
    c.bias = rand_buf(9, -1, 1);
    c.c = rand_buf(5 * 9, -1, 1);
    c.r = rand_buf(5 * 9, -1, 1);
    float *db = calloc(9, sizeof(float));
    assert_int_equal(op_bias_backward(db, c.r, 5, 9), VH_STATUS_OK);
    check_fd("gemm bias", bias_loss, &c, c.bias, db, 9, 9);
    assert_int_equal(op_bias_backward(NULL, c.r, 5, 9),
                     VH_STATUS_ERR_INVALID_ARG);
    free(c.x), free(c.w), free(c.bias), free(c.c), free(c.r), free(db);
}

static void test_softmax(void **state) {
    (void)state;
    rng_state = 9;
    const int64_t rows = 7, cols = 17, n = rows * cols;
    float *x = rand_buf(n, -5, 5);
    for (int64_t j = 0; j < cols; j++) x[cols + j] += 1000.0f; /* stability */
    x[2 * cols + 3] = -INFINITY;                               /* masked entry */
    double *want = dbuf(n);
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < cols; j++) mx = fmax(mx, x[r * cols + j]);
        for (int64_t j = 0; j < cols; j++) s += exp(x[r * cols + j] - mx);
        for (int64_t j = 0; j < cols; j++) want[r * cols + j] = exp(x[r * cols + j] - mx) / s;
    }
    assert_int_equal(op_softmax(x, rows, cols), VH_STATUS_OK);
    expect_close("softmax", x, want, n, TOL_EW_ABS, TOL_EW_REL);
    assert_true(x[2 * cols + 3] == 0.0f);

    /* The exponential inside: within TOL_EXP_ULP of exp over a wide range,
     * seen through two-element rows [0, t]: p1 = e^t / (1 + e^t). */
    double worst = 0;
    for (float t = -80.0f; t <= 0.0f; t += 0.0137f) {
        float row[2] = {0.0f, t};
        assert_int_equal(op_softmax(row, 1, 2), VH_STATUS_OK);
        const double e = exp((double)t), p1 = e / (1.0 + e);
        const double ulp = (double)nextafterf((float)p1, INFINITY) - (double)(float)p1;
        worst = fmax(worst, fabs((double)row[1] - p1) / ulp);
    }
    if (worst > TOL_EXP_ULP + 1.0) { /* + the division's rounding */
        print_error("softmax exp error %.2f ulp\n", worst);
        fail();
    }

    float nanrow[3] = {1.0f, NAN, 2.0f};
    assert_int_equal(op_softmax(nanrow, 1, 3), VH_STATUS_OK);
    assert_true(isnan(nanrow[0]) && isnan(nanrow[2]));
    assert_int_equal(op_softmax(NULL, 2, 3), VH_STATUS_ERR_INVALID_ARG);
    free(x), free(want);
}

typedef struct scale_case {
    int64_t rows, dim, div, mod;
    float *in, *scale, *out, *r;
} scale_case;

static double scale_loss(void *ctx) {
    scale_case *c = ctx;
    assert_int_equal(op_scale_rows(c->out, c->in, c->scale, c->rows, c->dim,
                                     c->div, c->mod, 0),
                     VH_STATUS_OK);
    return dot_fd(c->out, c->r, c->rows * c->dim);
}

static void test_scale_rows(void **state) {
    (void)state;
    rng_state = 10;
    const int64_t B = 3, N = 5, D = 8, rows = B * N;
    for (int layout = 0; layout < 2; layout++) {
        /* batch-first rows are (b, t): sample r / N; batch-second (t, b): r % B */
        scale_case c = {.rows = rows, .dim = D, .div = layout ? 1 : N, .mod = B};
        c.in = rand_buf(rows * D, -1, 1);
        c.scale = rand_buf(B, 0, 2);
        c.out = rand_buf(rows * D, -1, 1);
        c.r = rand_buf(rows * D, -1, 1);
        double *want = dbuf(rows * D);
        for (int64_t r = 0; r < rows; r++) {
            const int64_t b = layout ? r % B : r / N;
            for (int64_t j = 0; j < D; j++)
                want[r * D + j] = (double)c.in[r * D + j] * c.scale[b];
        }
        scale_loss(&c);
        expect_close("scale_rows", c.out, want, rows * D, TOL_EW_ABS, TOL_EW_REL);
        float *acc = fcopy(c.out, rows * D);
        for (int64_t r = 0; r < rows; r++) {
            const int64_t b = layout ? r % B : r / N;
            for (int64_t j = 0; j < D; j++)
                want[r * D + j] = (double)acc[r * D + j] + (double)c.r[r * D + j] * c.scale[b];
        }
        /* backward: dx += dout * scale */
        assert_int_equal(op_scale_rows(acc, c.r, c.scale, rows, D, c.div, c.mod,
                                         1),
                         VH_STATUS_OK);
        expect_close("scale_rows accumulate", acc, want, rows * D, TOL_EW_ABS, TOL_EW_REL);
        float *g = calloc((size_t)(rows * D), sizeof(float));
        assert_int_equal(op_scale_rows(g, c.r, c.scale, rows, D, c.div, c.mod, 1),
                         VH_STATUS_OK);
        check_fd("scale_rows", scale_loss, &c, c.in, g, rows * D, 10);
        assert_int_equal(op_scale_rows(g, c.r, c.scale, rows, D, 0, c.mod, 1),
                         VH_STATUS_ERR_INVALID_ARG);
        free(c.in), free(c.scale), free(c.out), free(c.r), free(want), free(acc), free(g);
    }
}

static void test_dropout(void **state) {
    (void)state;
    rng_state = 11;
    const int64_t n = 200000;
    const float p = 0.1f;
    float *x = rand_buf(n, -1, 1), *out = malloc((size_t)n * sizeof(float));
    float *mask = malloc((size_t)n * sizeof(float)), *mask2 = malloc((size_t)n * sizeof(float));
    float *out2 = malloc((size_t)n * sizeof(float));
    assert_int_equal(op_dropout_forward(out, mask, x, n, p, 42), VH_STATUS_OK);
    int64_t kept = 0;
    double msum = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(mask[i] == 0.0f || mask[i] == 1.0f / (1.0f - p));
        assert_true(out[i] == x[i] * mask[i]);
        kept += mask[i] != 0.0f;
        msum += mask[i];
    }
    /* Keep fraction 1 - p within 5 standard deviations; E[mask] = 1. */
    const double frac = (double)kept / (double)n, sd = sqrt(p * (1 - p) / (double)n);
    assert_true(fabs(frac - (1.0 - p)) < 5 * sd);
    assert_true(fabs(msum / (double)n - 1.0) < 5 * sd / (1.0 - p));

    /* Same seed, same mask; another seed, another mask. */
    assert_int_equal(op_dropout_forward(out2, mask2, x, n, p, 42), VH_STATUS_OK);
    expect_equal_floats("dropout mask, same seed", mask, mask2, n);
    assert_int_equal(op_dropout_forward(out2, mask2, x, n, p, 43), VH_STATUS_OK);
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += mask[i] == mask2[i];
    assert_true(same < n - n / 20);
    /* A mask element depends on (seed, i) only: a short call (one thread)
     * reproduces the start of the long one (threaded). */
    assert_int_equal(op_dropout_forward(out2, mask2, x, 1000, p, 42),
                     VH_STATUS_OK);
    expect_equal_floats("dropout mask prefix", mask, mask2, 1000);
    /* Backward is mul(dx += dout * mask). */
    float *dx = calloc((size_t)n, sizeof(float));
    assert_int_equal(op_mul(dx, x, mask, n, 1), VH_STATUS_OK);
    for (int64_t i = 0; i < n; i++) assert_true(dx[i] == out[i]); /* 0 + -0 is +0 */

    assert_int_equal(op_dropout_forward(out, mask, x, n, 0.0f, 1), VH_STATUS_OK);
    for (int64_t i = 0; i < n; i++) assert_true(mask[i] == 1.0f && out[i] == x[i]);
    assert_int_equal(op_dropout_forward(out, mask, x, n, 1.0f, 1), VH_STATUS_OK);
    for (int64_t i = 0; i < n; i++) assert_true(mask[i] == 0.0f);
    assert_int_equal(op_dropout_forward(out, mask, x, n, 1.5f, 1),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_dropout_forward(out, mask, x, n, NAN, 1),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_dropout_forward(out, NULL, x, n, 0.5f, 1),
                     VH_STATUS_ERR_INVALID_ARG);
    free(x), free(out), free(mask), free(mask2), free(out2), free(dx);
}

/* ---- attention --------------------------------------------------------- */

typedef struct attn_case {
    vh_attention_args a;
    float *r; /* dL/dout, in out's layout */
    int64_t out_n;
} attn_case;

static vh_attention_args attn_args(int64_t B, int64_t N, int64_t H, int64_t Dh, int second) {
    const int64_t D = H * Dh;
    vh_attention_args a = {.struct_size = sizeof a, .batch = B, .tokens = N, .heads = H,
                           .head_dim = Dh, .scale = 1.0f / sqrtf((float)Dh)};
    a.qkv_batch_stride = second ? 3 * D : N * 3 * D;
    a.qkv_token_stride = second ? B * 3 * D : 3 * D;
    a.out_batch_stride = second ? D : N * D;
    a.out_token_stride = second ? B * D : D;
    return a;
}

static int64_t qkv_idx(const vh_attention_args *a, int64_t b, int64_t t, int64_t w, int64_t h,
                       int64_t d) {
    return b * a->qkv_batch_stride + t * a->qkv_token_stride + w * a->heads * a->head_dim +
           h * a->head_dim + d;
}

static int64_t out_idx(const vh_attention_args *a, int64_t b, int64_t t, int64_t h, int64_t d) {
    return b * a->out_batch_stride + t * a->out_token_stride + h * a->head_dim + d;
}

/* Reference: forward out and probs, and gradients added to dqkv. */
static void ref_attention(const vh_attention_args *a, const float *dout, double *out,
                          double *probs, double *dqkv) {
    const int64_t N = a->tokens, Dh = a->head_dim;
    double *dp = dbuf(N * N);
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < a->heads; h++) {
            double *P = probs + (b * a->heads + h) * N * N;
#define Q(t, d) ((double)((const float *)a->qkv)[qkv_idx(a, b, t, 0, h, d)])
#define K(t, d) ((double)((const float *)a->qkv)[qkv_idx(a, b, t, 1, h, d)])
#define V(t, d) ((double)((const float *)a->qkv)[qkv_idx(a, b, t, 2, h, d)])
#define G(t, d) ((double)dout[out_idx(a, b, t, h, d)])
            for (int64_t i = 0; i < N; i++) {
                double mx = -INFINITY, s = 0;
                for (int64_t j = 0; j < N; j++) {
                    double v = 0;
                    for (int64_t d = 0; d < Dh; d++) v += Q(i, d) * K(j, d);
                    P[i * N + j] = v * a->scale;
                    mx = fmax(mx, P[i * N + j]);
                }
                for (int64_t j = 0; j < N; j++) s += (P[i * N + j] = exp(P[i * N + j] - mx));
                for (int64_t j = 0; j < N; j++) P[i * N + j] /= s;
                for (int64_t d = 0; d < Dh; d++) {
                    double o = 0;
                    for (int64_t j = 0; j < N; j++) o += P[i * N + j] * V(j, d);
                    out[out_idx(a, b, i, h, d)] = o;
                }
            }
            if (!dqkv) continue;
            for (int64_t i = 0; i < N; i++) {
                double rs = 0;
                for (int64_t j = 0; j < N; j++) {
                    double v = 0;
                    for (int64_t d = 0; d < Dh; d++) v += G(i, d) * V(j, d);
                    dp[i * N + j] = v;
                    rs += v * P[i * N + j];
                }
                for (int64_t j = 0; j < N; j++) dp[i * N + j] = P[i * N + j] * (dp[i * N + j] - rs);
            }
            for (int64_t i = 0; i < N; i++)
                for (int64_t d = 0; d < Dh; d++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int64_t j = 0; j < N; j++) {
                        dq += dp[i * N + j] * K(j, d);
                        dk += dp[j * N + i] * Q(j, d);
                        dv += P[j * N + i] * G(j, d);
                    }
                    dqkv[qkv_idx(a, b, i, 0, h, d)] += a->scale * dq;
                    dqkv[qkv_idx(a, b, i, 1, h, d)] += a->scale * dk;
                    dqkv[qkv_idx(a, b, i, 2, h, d)] += dv;
                }
#undef Q
#undef K
#undef V
#undef G
        }
    free(dp);
}

static double attn_loss(void *ctx) {
    attn_case *c = ctx;
    assert_int_equal(ops->attention_forward(ops->device, &c->a), VH_STATUS_OK);
    return dot_fd(c->a.out, c->r, c->out_n);
}

/* One shape: both layouts against the reference, against each other, and
 * finite differences; with `args`, the argument checks too. */
static void run_attention_case(int64_t B, int64_t N, int64_t H, int64_t Dh, int args) {
    const int64_t D = H * Dh;
    const int64_t nq = B * N * 3 * D, no = B * N * D, np = B * H * N * N;
    attn_case bf = {.a = attn_args(B, N, H, Dh, 0), .out_n = no};
    attn_case bs = {.a = attn_args(B, N, H, Dh, 1), .out_n = no};
    float *qkv_f = rand_buf(nq, -1.5, 1.5), *qkv_s = malloc((size_t)nq * sizeof(float));
    float *dout_f = rand_buf(no, -1, 1), *dout_s = malloc((size_t)no * sizeof(float));
    /* The same logical tensors in batch-second layout. */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < N; t++) {
            for (int64_t e = 0; e < 3 * D; e++)
                qkv_s[qkv_idx(&bs.a, b, t, 0, 0, e)] = qkv_f[qkv_idx(&bf.a, b, t, 0, 0, e)];
            for (int64_t e = 0; e < D; e++)
                dout_s[out_idx(&bs.a, b, t, 0, e)] = dout_f[out_idx(&bf.a, b, t, 0, e)];
        }
    attn_case *cases[2] = {&bf, &bs};
    float *qkvs[2] = {qkv_f, qkv_s}, *douts[2] = {dout_f, dout_s};
    for (int l = 0; l < 2; l++) {
        vh_attention_args *a = &cases[l]->a;
        a->qkv = qkvs[l];
        a->dout = douts[l];
        a->out = rand_buf(no, -1, 1);
        a->probs = rand_buf(np, -1, 1);
        a->dqkv = rand_buf(nq, -1, 1); /* accumulate onto nonzero values */
        cases[l]->r = douts[l];
    }
    for (int l = 0; l < 2; l++) {
        vh_attention_args *a = &cases[l]->a;
        double *out = dbuf(no), *probs = dbuf(np), *dqkv = dbuf(nq);
        for (int64_t i = 0; i < nq; i++) dqkv[i] = ((const float *)a->dqkv)[i];
        ref_attention(a, a->dout, out, probs, dqkv);
        assert_int_equal(ops->attention_forward(ops->device, a), VH_STATUS_OK);
        expect_close("attention out", a->out, out, no, TOL_ATTN_ABS, TOL_ATTN_REL);
        expect_close("attention probs", a->probs, probs, np, TOL_ATTN_ABS, TOL_ATTN_REL);
        assert_int_equal(ops->attention_backward(ops->device, a), VH_STATUS_OK);
        expect_close("attention dqkv (+=)", a->dqkv, dqkv, nq, TOL_ATTN_ABS, TOL_ATTN_REL);
        free(out), free(probs), free(dqkv);
    }
    /* Both layouts give the same numbers. */
    double *want = dbuf(nq);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < N; t++) {
            for (int64_t e = 0; e < D; e++)
                want[out_idx(&bs.a, b, t, 0, e)] =
                    ((const float *)bf.a.out)[out_idx(&bf.a, b, t, 0, e)];
        }
    expect_close("attention out, batch-second vs batch-first", bs.a.out, want, no, TOL_LAYOUT,
                 TOL_LAYOUT);
    for (int64_t i = 0; i < np; i++) want[i] = ((const float *)bf.a.probs)[i];
    expect_close("attention probs, batch-second vs batch-first", bs.a.probs, want, np,
                 TOL_LAYOUT, TOL_LAYOUT);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < N; t++)
            for (int64_t e = 0; e < 3 * D; e++)
                want[qkv_idx(&bs.a, b, t, 0, 0, e)] =
                    ((const float *)bf.a.dqkv)[qkv_idx(&bf.a, b, t, 0, 0, e)];
    /* dqkv started from different random values in the two layouts; compare
     * the gradient alone. */
    for (int l = 0; l < 2; l++) memset(cases[l]->a.dqkv, 0, (size_t)nq * sizeof(float));
    for (int l = 0; l < 2; l++)
        assert_int_equal(ops->attention_backward(ops->device, &cases[l]->a), VH_STATUS_OK);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < N; t++)
            for (int64_t e = 0; e < 3 * D; e++)
                want[qkv_idx(&bs.a, b, t, 0, 0, e)] =
                    ((const float *)bf.a.dqkv)[qkv_idx(&bf.a, b, t, 0, 0, e)];
    expect_close("attention dqkv, batch-second vs batch-first", bs.a.dqkv, want, nq, TOL_LAYOUT,
                 TOL_LAYOUT);

    /* Finite differences of the forward op against dqkv (now the gradient alone). */
    check_fd("attention dqkv (batch-first)", attn_loss, &bf, qkv_f, bf.a.dqkv, nq, 24);
    check_fd("attention dqkv (batch-second)", attn_loss, &bs, qkv_s, bs.a.dqkv, nq, 24);

    if (args) {
        vh_attention_args bad = bf.a;
        bad.struct_size = 4;
        assert_int_equal(ops->attention_forward(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
        bad = bf.a;
        bad.probs = NULL;
        assert_int_equal(ops->attention_forward(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
        bad = bf.a;
        bad.dqkv = NULL;
        assert_int_equal(ops->attention_backward(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
        bad = bf.a;
        bad.qkv_token_stride = D; /* rows would overlap */
        assert_int_equal(ops->attention_forward(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
        bad = bf.a;
        bad.heads = -1;
        assert_int_equal(ops->attention_forward(ops->device, &bad), VH_STATUS_ERR_INVALID_ARG);
        assert_int_equal(ops->attention_backward(ops->device, NULL), VH_STATUS_ERR_INVALID_ARG);
    }
    for (int l = 0; l < 2; l++) {
        free(cases[l]->a.out);
        free(cases[l]->a.probs);
        free(cases[l]->a.dqkv);
    }
    free(qkv_f), free(qkv_s), free(dout_f), free(dout_s), free(want);
}

/* Shapes that take each route of the CPU engine: small heads (head_dim a
 * multiple of 8, at most 16) run fused per (sample, head) block, token
 * counts that are not multiples of 8 padding the score rows; larger or odd
 * heads run as batched oneDNN matmuls. */
static void test_attention(void **state) {
    (void)state;
    rng_state = 12;
    run_attention_case(3, 17, 3, 16, 1); /* fused, rows 17: tiles of 4 and a tail */
    run_attention_case(2, 9, 2, 8, 0);   /* fused, one column tile */
    run_attention_case(2, 13, 2, 24, 0); /* batched matmuls */
    run_attention_case(2, 6, 1, 5, 0);   /* batched matmuls, odd head_dim */
}

/* ---- cross-entropy ---------------------------------------------------------- */

static void test_cross_entropy_vs_torch(void **state) {
    (void)state;
    /* torch.nn.CrossEntropyLoss(label_smoothing=s) in float64 (PyTorch 1.13). */
    const float z[15] = {1, 2, 3, -1, 0.5f, 0, 0, 0, 0, 0, 4, -2, 1, 1, 3.5f};
    const int32_t y[3] = {2, 0, 4};
    const double loss0 = 1.0391210956465082, loss1 = 1.1691210956465083;
    const double g0[15] = {0.0281312852,  0.0764687613, -0.1254696889, 0.0038071554,
                           0.017062487,   -0.2666666667, 0.0666666667, 0.0666666667,
                           0.0666666667,  0.0666666667, 0.1950933764,  0.0004835881,
                           0.0097131273,  0.0097131273, -0.2150032191};
    const double g1[15] = {0.0214646185, 0.0698020947,  -0.0988030223, -0.0028595112,
                           0.0103958203, -0.24,         0.06,          0.06,
                           0.06,         0.06,          0.1884267097,  -0.0061830785,
                           0.0030464606, 0.0030464606,  -0.1883365524};
    float loss = -1, g[15] = {0};
    assert_int_equal(op_softmax_cross_entropy(&loss, g, z, y, 3, 5, 0.0f, 1.0f),
                     VH_STATUS_OK);
    const double lw0 = loss0, lw1 = loss1;
    expect_close("cross-entropy", &loss, &lw0, 1, TOL_CE, TOL_CE);
    expect_close("cross-entropy grad", g, g0, 15, TOL_CE, TOL_CE);
    memset(g, 0, sizeof g);
    assert_int_equal(op_softmax_cross_entropy(&loss, g, z, y, 3, 5, 0.1f, 1.0f),
                     VH_STATUS_OK);
    expect_close("cross-entropy, smoothing 0.1", &loss, &lw1, 1, TOL_CE, TOL_CE);
    expect_close("cross-entropy grad, smoothing 0.1", g, g1, 15, TOL_CE, TOL_CE);

    /* dlogits accumulates dloss_scale * grad; NULL dlogits: loss only. */
    double acc[15];
    for (int i = 0; i < 15; i++) acc[i] = g1[i] + 128.0 * g1[i];
    assert_int_equal(op_softmax_cross_entropy(&loss, g, z, y, 3, 5, 0.1f, 128.0f),
                     VH_STATUS_OK);
    expect_close("cross-entropy grad (+=, scaled)", g, acc, 15, 1e-5, 1e-6);
    assert_int_equal(
        op_softmax_cross_entropy(&loss, NULL, z, y, 3, 5, 0.1f, 1.0f),
        VH_STATUS_OK);
    expect_close("cross-entropy, no grad", &loss, &lw1, 1, TOL_CE, TOL_CE);

    /* Hand-computed: logits (1, 2, 3), label 2: log(e + e^2 + e^3) - 3. */
    const float h[3] = {1, 2, 3};
    const int32_t hy = 2;
    const double hw = log(exp(1.0) + exp(2.0) + exp(3.0)) - 3.0;
    assert_int_equal(op_softmax_cross_entropy(&loss, NULL, h, &hy, 1, 3, 0, 1),
                     VH_STATUS_OK);
    expect_close("cross-entropy by hand", &loss, &hw, 1, TOL_CE, TOL_CE);

    /* Labels out of range: refused before anything is read or written. */
    const int32_t bad[3] = {2, 5, 0}, neg[3] = {-1, 0, 0};
    float before[15];
    memcpy(before, g, sizeof g);
    loss = 123.0f;
    assert_int_equal(op_softmax_cross_entropy(&loss, g, z, bad, 3, 5, 0, 1),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_softmax_cross_entropy(&loss, g, z, neg, 3, 5, 0, 1),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_true(loss == 123.0f);
    expect_equal_floats("cross-entropy untouched on error", g, before, 15);
    assert_int_equal(op_softmax_cross_entropy(NULL, g, z, y, 3, 5, 0, 1),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_softmax_cross_entropy(&loss, g, z, y, 3, 5, -0.1f, 1),
                     VH_STATUS_ERR_INVALID_ARG);
}

typedef struct ce_case {
    int64_t batch, classes;
    float smoothing;
    float *z;
    int32_t *y;
} ce_case;

static double ce_loss(void *ctx) {
    ce_case *c = ctx;
    float loss;
    assert_int_equal(op_softmax_cross_entropy(&loss, NULL, c->z, c->y, c->batch,
                                                c->classes, c->smoothing, 1.0f),
                     VH_STATUS_OK);
    return loss;
}

static void test_cross_entropy_reference(void **state) {
    (void)state;
    rng_state = 13;
    const int64_t B = 7, C = 11;
    ce_case c = {.batch = B, .classes = C, .smoothing = 0.2f, .z = rand_buf(B * C, -30, 30)};
    c.y = malloc((size_t)B * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) c.y[b] = (int32_t)(b * 5 % C);
    for (int64_t j = 0; j < C; j++) c.z[j] += 500.0f; /* large logits stay finite */
    double want = 0, *wg = dbuf(B * C);
    for (int64_t b = 0; b < B; b++) {
        const float *z = c.z + b * C;
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++) mx = fmax(mx, z[j]);
        for (int64_t j = 0; j < C; j++) s += exp(z[j] - mx);
        const double lse = mx + log(s);
        for (int64_t j = 0; j < C; j++) {
            const double q = (j == c.y[b] ? 1.0 - c.smoothing : 0.0) + c.smoothing / C;
            want -= q * (z[j] - lse) / B;
            wg[b * C + j] = (exp(z[j] - mx) / s - q) / B;
        }
    }
    float loss, *g = calloc((size_t)(B * C), sizeof(float));
    assert_int_equal(op_softmax_cross_entropy(&loss, g, c.z, c.y, B, C,
                                                c.smoothing, 1.0f),
                     VH_STATUS_OK);
    assert_true(isfinite(loss));
    expect_close("cross-entropy reference", &loss, &want, 1, 1e-5, 1e-6);
    expect_close("cross-entropy reference grad", g, wg, B * C, 1e-7, 1e-5);
    /* Softer logits for finite differences (the large ones saturate). */
    for (int64_t i = 0; i < B * C; i++) c.z[i] = (float)(4.0 * rnd() - 2.0);
    memset(g, 0, (size_t)(B * C) * sizeof(float));
    float l2;
    assert_int_equal(op_softmax_cross_entropy(&l2, g, c.z, c.y, B, C,
                                                c.smoothing, 1.0f),
                     VH_STATUS_OK);
    check_fd("cross-entropy", ce_loss, &c, c.z, g, B * C, 15);
    free(c.z), free(c.y), free(wg), free(g);
}

/* ---- tokens -------------------------------------------------------------- */

typedef struct pool_case {
    int64_t B, first, count, D, bs, ts, n;
    float *x, *out, *r;
} pool_case;

static double pool_loss(void *ctx) {
    pool_case *c = ctx;
    assert_int_equal(op_mean_pool_forward(c->out, c->x, c->B, c->first, c->count,
                                            c->D, c->bs, c->ts),
                     VH_STATUS_OK);
    return dot_fd(c->out, c->r, c->B * c->D);
}

static void test_mean_pool(void **state) {
    (void)state;
    rng_state = 14;
    const int64_t B = 3, N = 17, D = 48;
    for (int layout = 0; layout < 2; layout++) {
        pool_case c = {.B = B, .first = 1, .count = N - 1, .D = D, .n = B * N * D};
        c.bs = layout ? D : N * D;
        c.ts = layout ? B * D : D;
        c.x = rand_buf(c.n, -1, 1);
        c.out = rand_buf(B * D, -1, 1);
        c.r = rand_buf(B * D, -1, 1);
        double *want = dbuf(B * D), *wdx = dbuf(c.n);
        float *dx = rand_buf(c.n, -1, 1);
        for (int64_t i = 0; i < c.n; i++) wdx[i] = dx[i];
        for (int64_t b = 0; b < B; b++)
            for (int64_t d = 0; d < D; d++) {
                for (int64_t t = 1; t < N; t++) {
                    want[b * D + d] += c.x[b * c.bs + t * c.ts + d] / (double)(N - 1);
                    wdx[b * c.bs + t * c.ts + d] += c.r[b * D + d] / (double)(N - 1);
                }
            }
        pool_loss(&c);
        expect_close("mean_pool", c.out, want, B * D, TOL_EW_ABS, TOL_EW_REL);
        assert_int_equal(op_mean_pool_backward(dx, c.r, B, 1, N - 1, D, c.bs,
                                                 c.ts),
                         VH_STATUS_OK);
        expect_close("mean_pool backward (+=)", dx, wdx, c.n, TOL_EW_ABS, TOL_EW_REL);
        float *g = calloc((size_t)c.n, sizeof(float));
        assert_int_equal(op_mean_pool_backward(g, c.r, B, 1, N - 1, D, c.bs,
                                                 c.ts),
                         VH_STATUS_OK);
        check_fd("mean_pool", pool_loss, &c, c.x, g, c.n, 10);
        assert_int_equal(op_mean_pool_forward(c.out, c.x, B, 1, 0, D, c.bs, c.ts),
                         VH_STATUS_ERR_INVALID_ARG);
        free(c.x), free(c.out), free(c.r), free(want), free(wdx), free(dx), free(g);
    }
}

static void test_patchify(void **state) {
    (void)state;
    rng_state = 15;
    const int64_t B = 2, C = 3, Hh = 8, W = 12, P = 4, np = (Hh / P) * (W / P), row = C * P * P;
    float *img = rand_buf(B * C * Hh * W, -1, 1);
    for (int layout = 0; layout < 2; layout++) {
        const int64_t bs = layout ? row : np * row, ts = layout ? B * row : row;
        float *out = rand_buf(B * np * row, -1, 1);
        double *want = dbuf(B * np * row);
        /* Conv2d(stride = P) view: pixel (c, y, x) of patch (y / P, x / P). */
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t y = 0; y < Hh; y++)
                    for (int64_t x = 0; x < W; x++) {
                        const int64_t p = (y / P) * (W / P) + x / P;
                        const int64_t e = (c * P + y % P) * P + x % P;
                        want[b * bs + p * ts + e] = img[((b * C + c) * Hh + y) * W + x];
                    }
        assert_int_equal(op_patchify(out, img, B, C, Hh, W, P, bs, ts),
                         VH_STATUS_OK);
        expect_close("patchify", out, want, B * np * row, 0, 0);
        free(out), free(want);
    }
    float dummy[4];
    assert_int_equal(op_patchify(dummy, img, B, C, 9, W, P, 0, 0),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_patchify(dummy, img, B, C, Hh, W, 0, 0, 0),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(op_patchify(NULL, img, B, C, Hh, W, P, 0, 0),
                     VH_STATUS_ERR_INVALID_ARG);
    free(img);
}

typedef struct embed_case {
    int64_t B, Np, D, bs, ts, pbs, pts, tokens;
    float *x, *patches, *cls, *pos, *r;
} embed_case;

static double embed_loss(void *ctx) {
    embed_case *c = ctx;
    assert_int_equal(op_embed_forward(c->x, c->patches, c->cls, c->pos, c->B,
                                        c->Np, c->D, c->bs, c->ts, c->pbs, c->pts),
                     VH_STATUS_OK);
    double s = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->tokens; t++)
            for (int64_t d = 0; d < c->D; d++) {
                const int64_t i = b * c->bs + t * c->ts + d;
                s += (double)c->x[i] * c->r[i];
            }
    return s;
}

static void test_embed(void **state) {
    (void)state;
    rng_state = 16;
    const int64_t B = 3, Np = 16, D = 8;
    for (int layout = 0; layout < 2; layout++)
        for (int with_cls = 0; with_cls < 2; with_cls++) {
            const int64_t T = Np + with_cls;
            embed_case c = {.B = B, .Np = Np, .D = D, .tokens = T};
            c.bs = layout ? D : T * D;
            c.ts = layout ? B * D : D;
            /* patches in the same layout as x, as the patch-embedding GEMM writes them */
            c.pbs = layout ? D : Np * D;
            c.pts = layout ? B * D : D;
            c.x = rand_buf(B * T * D, -1, 1);
            c.r = rand_buf(B * T * D, -1, 1);
            c.patches = rand_buf(B * Np * D, -1, 1);
            c.cls = with_cls ? rand_buf(D, -1, 1) : NULL;
            c.pos = rand_buf(T * D, -1, 1);
            double *want = dbuf(B * T * D);
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < D; d++) {
                        const double src = (with_cls && t == 0)
                                               ? c.cls[d]
                                               : c.patches[b * c.pbs + (t - with_cls) * c.pts + d];
                        want[b * c.bs + t * c.ts + d] = src + c.pos[t * D + d];
                    }
            embed_loss(&c);
            expect_close("embed_forward", c.x, want, B * T * D, TOL_EW_ABS, TOL_EW_REL);

            /* Backward accumulates; the dx here is r. */
            float *dp = rand_buf(B * Np * D, -1, 1), *dpos = rand_buf(T * D, -1, 1);
            float *dcls = with_cls ? rand_buf(D, -1, 1) : NULL;
            double *wdp = dbuf(B * Np * D), *wdpos = dbuf(T * D), *wdcls = dbuf(D);
            for (int64_t i = 0; i < B * Np * D; i++) wdp[i] = dp[i];
            for (int64_t i = 0; i < T * D; i++) wdpos[i] = dpos[i];
            for (int64_t d = 0; d < D && with_cls; d++) wdcls[d] = dcls[d];
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < D; d++) {
                        const double g = c.r[b * c.bs + t * c.ts + d];
                        wdpos[t * D + d] += g;
                        if (with_cls && t == 0)
                            wdcls[d] += g;
                        else
                            wdp[b * c.pbs + (t - with_cls) * c.pts + d] += g;
                    }
            assert_int_equal(op_embed_backward(dp, dcls, dpos, c.r, B, Np, D, c.bs,
                                                 c.ts, c.pbs, c.pts),
                             VH_STATUS_OK);
            expect_close("embed_backward dpatches", dp, wdp, B * Np * D, TOL_EW_ABS, TOL_EW_REL);
            expect_close("embed_backward dpos", dpos, wdpos, T * D, TOL_EW_ABS, TOL_EW_REL);
            if (with_cls)
                expect_close("embed_backward dcls", dcls, wdcls, D, TOL_EW_ABS, TOL_EW_REL);

            float *gp = calloc((size_t)(B * Np * D), sizeof(float));
            float *gpos = calloc((size_t)(T * D), sizeof(float)), *gcls = calloc(8, sizeof(float));
            assert_int_equal(op_embed_backward(gp, with_cls ? gcls : NULL, gpos,
                                                 c.r, B, Np, D, c.bs, c.ts, c.pbs, c.pts),
                             VH_STATUS_OK);
            check_fd("embed dpatches", embed_loss, &c, c.patches, gp, B * Np * D, 8);
            check_fd("embed dpos", embed_loss, &c, c.pos, gpos, T * D, 8);
            if (with_cls) check_fd("embed dcls", embed_loss, &c, c.cls, gcls, D, 4);
            assert_int_equal(op_embed_forward(c.x, c.patches, c.cls, NULL, B, Np, D,
                                                c.bs, c.ts, c.pbs, c.pts),
                             VH_STATUS_ERR_INVALID_ARG);
            free(c.x), free(c.r), free(c.patches), free(c.cls), free(c.pos), free(want);
            free(dp), free(dpos), free(dcls), free(wdp), free(wdpos), free(wdcls), free(gp);
            free(gpos), free(gcls);
        }
}

/* ---- vh_param_init ------------------------------------------------------- */

static void moments(const float *v, int64_t n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = sqrt(s2 / (double)n);
}

static void test_param_init(void **state) {
    (void)state;
    const int64_t n = 100000;
    float *v = malloc((size_t)n * sizeof(float)), *w = malloc((size_t)n * sizeof(float));
    double mean, sd;
    vh_param_desc p = {.name = "w", .ndim = 2, .shape = {250, 400}, .init_std = 0.02f};

    p.init = VH_INIT_KIND_NORMAL;
    vh_param_init(&p, v, 7);
    moments(v, n, &mean, &sd);
    assert_true(fabs(mean) < 5 * 0.02 / sqrt((double)n));
    assert_true(fabs(sd / 0.02 - 1.0) < 0.01);
    vh_param_init(&p, w, 7);
    expect_equal_floats("normal init, same seed", v, w, n);
    vh_param_init(&p, w, 8);
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += v[i] == w[i];
    assert_true(same < 100);
    int64_t beyond = 0; /* a plain normal does go past 2 std (4.6%) */
    for (int64_t i = 0; i < n; i++) beyond += fabsf(v[i]) > 0.04f;
    assert_true(beyond > n / 30 && beyond < n / 18);

    /* N(0, std^2) cut at +-2 std: sd = std * sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)). */
    p.init = VH_INIT_KIND_TRUNC_NORMAL;
    vh_param_init(&p, v, 7);
    for (int64_t i = 0; i < n; i++) assert_true(fabsf(v[i]) <= 2.0f * p.init_std);
    moments(v, n, &mean, &sd);
    const double phi2 = exp(-2.0) / sqrt(2 * kPi), cdf2 = 0.5 * erfc(-2.0 / sqrt(2.0));
    const double trunc_sd = 0.02 * sqrt(1.0 - 4.0 * phi2 / (2.0 * cdf2 - 1.0));
    assert_true(fabs(mean) < 5 * 0.02 / sqrt((double)n));
    assert_true(fabs(sd / trunc_sd - 1.0) < 0.01);
    vh_param_init(&p, w, 7);
    expect_equal_floats("trunc_normal init, same seed", v, w, n);
    /* Values depend on (seed, index) only: a smaller tensor is a prefix. */
    vh_param_desc small = p;
    small.shape[0] = 3;
    small.shape[1] = 7;
    vh_param_init(&small, w, 7);
    expect_equal_floats("trunc_normal init, prefix", v, w, 21);

    /* xavier_uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)). */
    p.init = VH_INIT_KIND_XAVIER_UNIFORM;
    vh_param_init(&p, v, 9);
    const double a = sqrt(6.0 / (250.0 + 400.0));
    float vmax = 0;
    for (int64_t i = 0; i < n; i++) vmax = fmaxf(vmax, fabsf(v[i]));
    assert_true(vmax <= (float)a && vmax > 0.999f * (float)a);
    moments(v, n, &mean, &sd);
    assert_true(fabs(mean) < 5 * a / sqrt(3.0 * (double)n));
    assert_true(fabs(sd / (a / sqrt(3.0)) - 1.0) < 0.01);
    /* A conv weight (out, in, kh, kw): receptive field counts in both fans. */
    vh_param_desc conv = {.name = "conv", .ndim = 4, .shape = {64, 3, 4, 4},
                          .init = VH_INIT_KIND_XAVIER_UNIFORM};
    vh_param_init(&conv, v, 9);
    const double ca = sqrt(6.0 / (3.0 * 16 + 64.0 * 16));
    vmax = 0;
    for (int64_t i = 0; i < 64 * 48; i++) vmax = fmaxf(vmax, fabsf(v[i]));
    assert_true(vmax <= (float)ca && vmax > 0.99f * (float)ca);

    p.init = VH_INIT_KIND_ZEROS;
    vh_param_init(&p, v, 1);
    for (int64_t i = 0; i < n; i++) assert_true(v[i] == 0.0f);
    p.init = VH_INIT_KIND_ONES;
    vh_param_init(&p, v, 1);
    for (int64_t i = 0; i < n; i++) assert_true(v[i] == 1.0f);
    vh_param_init(NULL, v, 1); /* no crash */
    free(v), free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_transposes),
        cmocka_unit_test(test_gemm_batched),
        cmocka_unit_test(test_gemm_broadcast_and_edges),
        cmocka_unit_test(test_gemm_epilogue),
        cmocka_unit_test(test_gemm_residual_routes),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_layernorm_many_rows),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_add_mul),
        cmocka_unit_test(test_bias_backward),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_scale_rows),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_cross_entropy_vs_torch),
        cmocka_unit_test(test_cross_entropy_reference),
        cmocka_unit_test(test_mean_pool),
        cmocka_unit_test(test_patchify),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_param_init),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
