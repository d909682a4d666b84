/* test_cuda_eltwise.c - the CUDA element-wise and row ops (eltwise.cu)
 * against the CPU twin: GELU, add, mul, dropout, scale_rows,
 * drop_path_scale, bias_backward, softmax; f32, bf16 and f16, odd sizes
 * (grid-stride tails, rows longer than a block), and the argument checks.
 * Without a GPU it prints one SKIPPED line and exits 77. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_twin.h"
#include "twin_tensor.h"

static gpu_twin g;

/* Runs op on both sides: cpu_args hold the CPU's pointers, gpu_args the GPU's. */
#define EW_BOTH(op, cpu_args, gpu_args)                                                  \
    do {                                                                                 \
        assert_int_equal(g.cpu->op(g.cpu->device, &(cpu_args)), VH_STATUS_OK);           \
        assert_int_equal(g.gpu.op(g.gpu.device, &(gpu_args)), VH_STATUS_OK);             \
    } while (0)

static void test_gelu(void **state) {
    (void)state;
    const vh_overwrite_ext *ow = g.gpu.get_extension(g.gpu.device, VH_OVERWRITE_EXTENSION);
    assert_true(ow && (ow->ops & VH_OVERWRITE_OP_GELU_BACKWARD));
    const int64_t n = 4099; /* a grid-stride tail */
    for (int k = 0; k < 3; k++) {
        const vh_dtype dt = tt_dtypes[k];
        tt x = tt_make(&g, n, dt, 1, -7.0f, 7.0f), out = tt_make(&g, n, dt, 2, 0.0f, 0.0f);
        tt dout = tt_make(&g, n, dt, 3, -1.0f, 1.0f), dx = tt_make(&g, n, dt, 4, -1.0f, 1.0f);
        vh_eltwise_args c[2];
        for (int s = 0; s < 2; s++)
            c[s] = (vh_eltwise_args){.struct_size = sizeof c[s], .n = n, .dtype = dt,
                                     .x = tt_ptr(&x, s), .out = tt_ptr(&out, s),
                                     .dout = tt_ptr(&dout, s), .dx = tt_ptr(&dx, s)};
        EW_BOTH(gelu_forward, c[0], c[1]);
        assert_true(tt_same(&g, "gelu_forward", &out, gpu_twin_tol(dt)));
        EW_BOTH(gelu_backward, c[0], c[1]);
        assert_true(tt_same(&g, "gelu_backward dx +=", &dx, gpu_twin_tol(dt)));
        /* ABI 2.4: written, not added (dx holds the values above on both sides) */
        c[0].overwrite = c[1].overwrite = 1;
        EW_BOTH(gelu_backward, c[0], c[1]);
        assert_true(tt_same(&g, "gelu_backward dx = (overwrite)", &dx, gpu_twin_tol(dt)));
        tt_free(&g, &x), tt_free(&g, &out), tt_free(&g, &dout), tt_free(&g, &dx);
    }
}

static void test_add_mul(void **state) {
    (void)state;
    const int64_t n = 1037;
    for (int k = 0; k < 3; k++) {
        const vh_dtype dt = tt_dtypes[k];
        tt a = tt_make(&g, n, dt, 5, -2.0f, 2.0f), b = tt_make(&g, n, dt, 6, -2.0f, 2.0f);
        tt out = tt_make(&g, n, dt, 7, -1.0f, 1.0f);
        vh_eltwise_args c[2];
        for (int s = 0; s < 2; s++)
            c[s] = (vh_eltwise_args){.struct_size = sizeof c[s], .n = n, .dtype = dt,
                                     .a = tt_ptr(&a, s), .b = tt_ptr(&b, s),
                                     .out = tt_ptr(&out, s)};
        EW_BOTH(add, c[0], c[1]);
        assert_true(tt_same(&g, "add", &out, gpu_twin_tol(dt)));
        EW_BOTH(mul, c[0], c[1]);
        assert_true(tt_same(&g, "mul", &out, gpu_twin_tol(dt)));
        c[0].accumulate = c[1].accumulate = 1;
        EW_BOTH(mul, c[0], c[1]);
        assert_true(tt_same(&g, "mul accumulate", &out, gpu_twin_tol(dt)));
        for (int s = 0; s < 2; s++) c[s].out = tt_ptr(&a, s); /* out aliases a */
        EW_BOTH(add, c[0], c[1]);
        assert_true(tt_same(&g, "add in place", &a, gpu_twin_tol(dt)));
        tt_free(&g, &a), tt_free(&g, &b), tt_free(&g, &out);
    }
}

/* The mask is a pure function of (seed, i): the same bits on both. */
static void test_dropout(void **state) {
    (void)state;
    const int64_t n = 5001;
    const float ps[3] = {0.3f, 0.0f, 1.0f};
    for (int k = 0; k < 3; k++)
        for (int q = 0; q < 3; q++) {
            const vh_dtype dt = tt_dtypes[k];
            tt x = tt_make(&g, n, dt, 8, -3.0f, 3.0f), out = tt_make(&g, n, dt, 9, 0.0f, 0.0f);
            tt mask = tt_make(&g, n, dt, 10, 0.0f, 0.0f);
            vh_eltwise_args c[2];
            for (int s = 0; s < 2; s++)
                c[s] = (vh_eltwise_args){.struct_size = sizeof c[s], .n = n, .dtype = dt,
                                         .x = tt_ptr(&x, s), .out = tt_ptr(&out, s),
                                         .mask = tt_ptr(&mask, s), .p = ps[q],
                                         .seed = 0x1234567890ull + (uint64_t)q};
            EW_BOTH(dropout_forward, c[0], c[1]);
            assert_true(tt_same(&g, "dropout mask", &mask, 0.0));
            assert_true(tt_same(&g, "dropout out", &out, 0.0));
            tt_free(&g, &x), tt_free(&g, &out), tt_free(&g, &mask);
        }
}

/* Both layouts' factor index, forward and accumulating backward (named
 * dout/dx). */
static void test_scale_rows(void **state) {
    (void)state;
    const int64_t B = 3, N = 5, D = 37, n = B * N * D;
    const float fac[3] = {0.0f, 1.25f, 2.5f};
    float *dscale = NULL;
    assert_int_equal(g.gpu.alloc(g.gpu.device, sizeof fac, (void **)&dscale), VH_STATUS_OK);
    assert_int_equal(g.gpu.copy(g.gpu.device, dscale, fac, sizeof fac,
                                VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
    for (int k = 0; k < 3; k++)
        for (int layout = 0; layout < 2; layout++) {
            const vh_dtype dt = tt_dtypes[k];
            tt x = tt_make(&g, n, dt, 11, -2.0f, 2.0f), out = tt_make(&g, n, dt, 12, -1.0f, 1.0f);
            vh_eltwise_args c[2];
            for (int s = 0; s < 2; s++)
                c[s] = (vh_eltwise_args){.struct_size = sizeof c[s], .n = n, .dtype = dt,
                                         .x = tt_ptr(&x, s), .out = tt_ptr(&out, s),
                                         .scale = s ? dscale : fac, .dim = D,
                                         .div = layout ? 1 : N, .mod = B};
            EW_BOTH(scale_rows, c[0], c[1]);
            assert_true(tt_same(&g, "scale_rows", &out, gpu_twin_tol(dt)));
            for (int s = 0; s < 2; s++) {
                c[s].dout = c[s].x, c[s].dx = c[s].out;
                c[s].x = NULL, c[s].out = NULL, c[s].accumulate = 1;
            }
            EW_BOTH(scale_rows, c[0], c[1]);
            assert_true(tt_same(&g, "scale_rows backward +=", &out, gpu_twin_tol(dt)));
            tt_free(&g, &x), tt_free(&g, &out);
        }
    g.gpu.free(g.gpu.device, dscale);
}

static void test_drop_path_scale(void **state) {
    (void)state;
    if (!g.gpu.drop_path_scale || !g.cpu->drop_path_scale) skip();
    const int64_t n = 1001;
    for (int q = 0; q < 3; q++) {
        const float p = q == 0 ? 0.25f : q == 1 ? 0.0f : 1.0f;
        tt out = tt_make(&g, n, VH_DTYPE_F32, 13, 5.0f, 5.0f);
        vh_eltwise_args c[2];
        for (int s = 0; s < 2; s++)
            c[s] = (vh_eltwise_args){.struct_size = sizeof c[s], .n = n, .p = p,
                                     .seed = 77u + (uint64_t)q, .out = tt_ptr(&out, s)};
        EW_BOTH(drop_path_scale, c[0], c[1]);
        assert_true(tt_same(&g, "drop_path_scale", &out, 0.0));
        tt_free(&g, &out);
    }
}

/* rows past two chunks of the first pass plus a tail; dout and out dtypes
 * crossed. */
static void test_bias_backward(void **state) {
    (void)state;
    const int64_t rows = 601, cols = 77;
    for (int k = 0; k < 3; k++)
        for (int o = 0; o < 3; o++) {
            const vh_dtype dt = tt_dtypes[k], odt = tt_dtypes[o];
            tt dout = tt_make(&g, rows * cols, dt, 14, -1.0f, 1.0f);
            tt out = tt_make(&g, cols, odt, 15, -4.0f, 4.0f);
            vh_rows_args c[2];
            for (int s = 0; s < 2; s++)
                c[s] = (vh_rows_args){.struct_size = sizeof c[s], .rows = rows, .cols = cols,
                                      .dtype = dt, .out_dtype = odt,
                                      .dout = tt_ptr(&dout, s), .out = tt_ptr(&out, s)};
            assert_int_equal(g.cpu->bias_backward(g.cpu->device, &c[0]), VH_STATUS_OK);
            assert_int_equal(g.gpu.bias_backward(g.gpu.device, &c[1]), VH_STATUS_OK);
            /* Sums of 601 terms in another order: a few ulp of f32 apart. */
            const double tol = gpu_twin_tol(odt) > 1e-4 ? gpu_twin_tol(odt) : 1e-5;
            assert_true(tt_same(&g, "bias_backward +=", &out, tol));
            tt_free(&g, &dout), tt_free(&g, &out);
        }
}

/* Rows longer than a block (1000), shorter than a warp (7); in place too. */
static void test_softmax(void **state) {
    (void)state;
    const int64_t shapes[2][2] = {{33, 1000}, {65, 7}};
    for (int k = 0; k < 3; k++)
        for (int sh = 0; sh < 2; sh++) {
            const vh_dtype dt = tt_dtypes[k];
            const int64_t rows = shapes[sh][0], cols = shapes[sh][1];
            tt x = tt_make(&g, rows * cols, dt, 16, -8.0f, 8.0f);
            tt out = tt_make(&g, rows * cols, VH_DTYPE_F32, 17, 0.0f, 0.0f);
            vh_rows_args c[2];
            for (int s = 0; s < 2; s++)
                c[s] = (vh_rows_args){.struct_size = sizeof c[s], .rows = rows, .cols = cols,
                                      .dtype = dt, .out_dtype = VH_DTYPE_F32,
                                      .x = tt_ptr(&x, s), .out = tt_ptr(&out, s)};
            assert_int_equal(g.cpu->softmax(g.cpu->device, &c[0]), VH_STATUS_OK);
            assert_int_equal(g.gpu.softmax(g.gpu.device, &c[1]), VH_STATUS_OK);
            assert_true(tt_same(&g, "softmax", &out, 1e-5 /* f32 out */));
            for (int s = 0; s < 2; s++) c[s].out = tt_ptr(&x, s), c[s].out_dtype = dt;
            assert_int_equal(g.cpu->softmax(g.cpu->device, &c[0]), VH_STATUS_OK);
            assert_int_equal(g.gpu.softmax(g.gpu.device, &c[1]), VH_STATUS_OK);
            assert_true(tt_same(&g, "softmax in place", &x, gpu_twin_tol(dt)));
            tt_free(&g, &x), tt_free(&g, &out);
        }
}

/* The same status as the CPU for bad and empty arguments. */
static void test_checks(void **state) {
    (void)state;
    tt x = tt_make(&g, 8, VH_DTYPE_F32, 18, 0.0f, 1.0f);
    struct {
        int64_t n;
        int32_t dtype;
        int null_out;
        float p;
    } cases[] = {{-1, 0, 0, 0.5f}, {8, 3, 0, 0.5f}, {8, 0, 1, 0.5f}, {0, 0, 1, 0.5f},
                 {8, 0, 0, 1.5f},  {8, 0, 0, -0.1f}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int op = 0; op < 3; op++) {
            vh_status st[2];
            for (int s = 0; s < 2; s++) {
                vh_eltwise_args a = {.struct_size = sizeof a, .n = cases[i].n,
                                     .dtype = cases[i].dtype, .x = tt_ptr(&x, s),
                                     .a = tt_ptr(&x, s), .b = tt_ptr(&x, s),
                                     .mask = tt_ptr(&x, s), .p = cases[i].p,
                                     .out = cases[i].null_out ? NULL : tt_ptr(&x, s)};
                const vh_device_ops *d = tt_ops(&g, s);
                st[s] = op == 0 ? d->gelu_forward(d->device, &a)
                        : op == 1 ? d->add(d->device, &a)
                                  : d->dropout_forward(d->device, &a);
            }
            if (st[0] != st[1]) printf("case %zu op %d: cpu %d, gpu %d\n", i, op, st[0], st[1]);
            assert_int_equal(st[0], st[1]);
        }
    assert_int_equal(g.gpu.gelu_forward(g.gpu.device, NULL), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(g.gpu.synchronize(g.gpu.device), VH_STATUS_OK);
    tt_free(&g, &x);
}

int main(void) {
    gpu_twin_open(&g, "test_cuda_eltwise");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu),         cmocka_unit_test(test_add_mul),
        cmocka_unit_test(test_dropout),      cmocka_unit_test(test_scale_rows),
        cmocka_unit_test(test_drop_path_scale), cmocka_unit_test(test_bias_backward),
        cmocka_unit_test(test_softmax),      cmocka_unit_test(test_checks),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_twin_close(&g);
    return failed;
}
