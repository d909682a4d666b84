/* test_cuda_layernorm.c - the CUDA layer norm (layernorm.cu) against the
 * CPU twin: forward (out, mean, rstd) and backward (dx, dweight, dbias
 * accumulate), f32/bf16/f16 activations with f32 or same-dtype parameters,
 * rows past a chunk of the parameter-gradient pass, rows longer than a
 * block, and the parameter gradients' determinism (two runs, same bits).
 * Without a GPU it prints one SKIPPED line and exits 77. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_twin.h"
#include "twin_tensor.h"

static gpu_twin g;

typedef struct ln_case {
    int64_t rows, dim;
    vh_dtype dt, pdt, gdt;
} ln_case;

typedef struct ln_tensors {
    tt x, w, b, out, dout, dx, dw, db, mean, rstd;
} ln_tensors;

static ln_tensors ln_make(const ln_case *c) {
    const int64_t n = c->rows * c->dim;
    ln_tensors t;
    t.x = tt_make(&g, n, c->dt, 1, -1.0f, 3.0f); /* a mean away from 0 */
    t.w = tt_make(&g, c->dim, c->pdt, 2, 0.5f, 1.5f);
    t.b = tt_make(&g, c->dim, c->pdt, 3, -0.5f, 0.5f);
    t.out = tt_make(&g, n, c->dt, 4, 0.0f, 0.0f);
    t.dout = tt_make(&g, n, c->dt, 5, -1.0f, 1.0f);
    t.dx = tt_make(&g, n, c->dt, 6, -0.5f, 0.5f);
    t.dw = tt_make(&g, c->dim, c->gdt, 7, -0.5f, 0.5f);
    t.db = tt_make(&g, c->dim, c->gdt, 8, -0.5f, 0.5f);
    t.mean = tt_make(&g, c->rows, VH_DTYPE_F32, 9, 0.0f, 0.0f);
    t.rstd = tt_make(&g, c->rows, VH_DTYPE_F32, 10, 0.0f, 0.0f);
    return t;
}

static void ln_free(ln_tensors *t) {
    tt *all[] = {&t->x, &t->w, &t->b, &t->out, &t->dout, &t->dx, &t->dw, &t->db, &t->mean,
                 &t->rstd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(&g, all[i]);
}

static vh_layernorm_args ln_args(const ln_case *c, const ln_tensors *t, int s) {
    return (vh_layernorm_args){.struct_size = sizeof(vh_layernorm_args), .rows = c->rows,
                               .dim = c->dim, .eps = 1e-6f, .dtype = c->dt,
                               .param_dtype = c->pdt, .grad_dtype = c->gdt,
                               .x = tt_ptr(&t->x, s), .weight = tt_ptr(&t->w, s),
                               .bias = tt_ptr(&t->b, s), .mean = tt_ptr(&t->mean, s),
                               .rstd = tt_ptr(&t->rstd, s), .out = tt_ptr(&t->out, s),
                               .dout = tt_ptr(&t->dout, s), .dx = tt_ptr(&t->dx, s),
                               .dweight = tt_ptr(&t->dw, s), .dbias = tt_ptr(&t->db, s)};
}

/* Sums over rows in another order than the CPU's: f32 to a few ulp. */
static double sum_tol(vh_dtype dt) { return gpu_twin_tol(dt) > 2e-5 ? gpu_twin_tol(dt) : 2e-5; }

static void ln_check(const ln_case *c) {
    ln_tensors t = ln_make(c);
    vh_layernorm_args a[2] = {ln_args(c, &t, 0), ln_args(c, &t, 1)};
    assert_int_equal(g.cpu->layernorm_forward(g.cpu->device, &a[0]), VH_STATUS_OK);
    assert_int_equal(g.gpu.layernorm_forward(g.gpu.device, &a[1]), VH_STATUS_OK);
    assert_true(tt_same(&g, "layernorm out", &t.out, gpu_twin_tol(c->dt)));
    assert_true(tt_same(&g, "layernorm mean", &t.mean, 1e-5));
    assert_true(tt_same(&g, "layernorm rstd", &t.rstd, 1e-5));
    assert_int_equal(g.cpu->layernorm_backward(g.cpu->device, &a[0]), VH_STATUS_OK);
    assert_int_equal(g.gpu.layernorm_backward(g.gpu.device, &a[1]), VH_STATUS_OK);
    assert_true(tt_same(&g, "layernorm dx +=", &t.dx, sum_tol(c->dt)));
    assert_true(tt_same(&g, "layernorm dweight +=", &t.dw, sum_tol(c->gdt)));
    assert_true(tt_same(&g, "layernorm dbias +=", &t.db, sum_tol(c->gdt)));
    /* No parameter gradients: dx alone. */
    a[0].dweight = a[0].dbias = a[1].dweight = a[1].dbias = NULL;
    assert_int_equal(g.cpu->layernorm_backward(g.cpu->device, &a[0]), VH_STATUS_OK);
    assert_int_equal(g.gpu.layernorm_backward(g.gpu.device, &a[1]), VH_STATUS_OK);
    assert_true(tt_same(&g, "layernorm dx only", &t.dx, sum_tol(c->dt)));
    ln_free(&t);
}

static void test_layernorm(void **state) {
    (void)state;
    /* 301 rows: a chunk of 256 and a tail; dim 771 > one block; dim 5 < a warp. */
    const int64_t shapes[3][2] = {{301, 771}, {7, 5}, {600, 64}};
    for (int k = 0; k < 3; k++)
        for (int sh = 0; sh < 3; sh++)
            for (int mixed = 0; mixed < 2; mixed++) {
                const vh_dtype dt = tt_dtypes[k];
                const ln_case c = {shapes[sh][0], shapes[sh][1], dt,
                                   mixed ? VH_DTYPE_F32 : dt, mixed ? VH_DTYPE_F32 : dt};
                ln_check(&c);
            }
}

/* Two runs from zeroed gradients: the same bits. */
static void test_layernorm_deterministic(void **state) {
    (void)state;
    const ln_case c = {1000, 384, VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_F32};
    ln_tensors t = ln_make(&c);
    vh_layernorm_args a = ln_args(&c, &t, TT_SIDE_GPU);
    assert_int_equal(g.gpu.layernorm_forward(g.gpu.device, &a), VH_STATUS_OK);
    float *run[2];
    for (int r = 0; r < 2; r++) {
        run[r] = malloc((size_t)c.dim * 2 * sizeof(float));
        assert_non_null(run[r]);
        assert_int_equal(g.gpu.memset_zero(g.gpu.device, t.dw.gpu, (size_t)c.dim * 4, NULL),
                         VH_STATUS_OK);
        assert_int_equal(g.gpu.memset_zero(g.gpu.device, t.db.gpu, (size_t)c.dim * 4, NULL),
                         VH_STATUS_OK);
        assert_int_equal(g.gpu.layernorm_backward(g.gpu.device, &a), VH_STATUS_OK);
        gpu_twin_download(&g, run[r], t.dw.gpu, c.dim, VH_DTYPE_F32);
        gpu_twin_download(&g, run[r] + c.dim, t.db.gpu, c.dim, VH_DTYPE_F32);
    }
    assert_memory_equal(run[0], run[1], (size_t)c.dim * 2 * sizeof(float));
    free(run[0]), free(run[1]);
    ln_free(&t);
}

/* The CPU's statuses for bad and empty arguments. */
static void test_layernorm_checks(void **state) {
    (void)state;
    const ln_case c = {4, 8, VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_F32};
    ln_tensors t = ln_make(&c);
    for (int bad = 0; bad < 7; bad++) {
        vh_status st[2][2];
        for (int s = 0; s < 2; s++) {
            vh_layernorm_args a = ln_args(&c, &t, s);
            if (bad == 0) a.rows = -1;
            if (bad == 1) a.rows = 0, a.x = NULL;
            if (bad == 2) a.dim = 0;
            if (bad == 3) a.mean = NULL;
            if (bad == 4) a.eps = -1.0f;
            if (bad == 5) a.param_dtype = VH_DTYPE_I32;
            if (bad == 6) a.weight = NULL;
            const vh_device_ops *d = tt_ops(&g, s);
            st[s][0] = d->layernorm_forward(d->device, &a);
            st[s][1] = d->layernorm_backward(d->device, &a);
        }
        assert_int_equal(st[0][0], st[1][0]);
        assert_int_equal(st[0][1], st[1][1]);
    }
    assert_int_equal(g.gpu.synchronize(g.gpu.device), VH_STATUS_OK);
    ln_free(&t);
}

int main(void) {
    gpu_twin_open(&g, "test_cuda_layernorm");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_layernorm_deterministic),
        cmocka_unit_test(test_layernorm_checks),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_twin_close(&g);
    return failed;
}
