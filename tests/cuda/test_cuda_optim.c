/* test_cuda_optim.c - the "vh.cuda.mta" extension (sdk/cuda/optim.cu) against
 * the CPU kernels the mta optimizer steps with (plugins/optim/mta/algos.c,
 * linked into this test): AdamW, SGD (momentum, Nesterov, none) and LAMB
 * (moments, per-tensor norms, apply) and the gradients' sums of squares, on
 * the same tensors, two updates each (the first one fresh: the state buffers
 * hold garbage it must not read). Tensors of 1, 1000, 65536 + 4465 (two
 * chunks and a tail), 0 and 257 elements; f32 masters with bf16 copies, f32
 * and bf16 gradients, and 16-bit masters as mta's full-FP16 path has them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "algos.h"
#include "twin_tensor.h"
#include "vithost/vh_cuda_mta.h"

static gpu_twin g;
static const vh_cuda_mta_ops *ops;

#define NT 5
static const int64_t sizes[NT] = {1, 1000, 70001, 0, 257};

typedef enum algo { ALGO_ADAMW, ALGO_SGD, ALGO_LAMB } algo;

/* What mta's step.c turns into the kernels' scalars. */
typedef struct hyper {
    double lr, wd, beta1, beta2, eps, momentum;
    int nesterov;
    int64_t updates;
    float grad_scale;
} hyper;

typedef struct opt_case {
    vh_dtype master, grad;
    int with_copy; /* a bf16 copy of the master */
    int slots;     /* state buffers used */
    tt p[NT], gr[NT], m[NT], v[NT], copy[NT];
    vh_cuda_mta_tensor list[NT];
} opt_case;

static void case_make(opt_case *c, vh_dtype master, vh_dtype grad, int with_copy, int slots) {
    memset(c, 0, sizeof *c);
    c->master = master, c->grad = grad, c->with_copy = with_copy, c->slots = slots;
    for (int i = 0; i < NT; i++) {
        const int64_t n = sizes[i];
        c->p[i] = tt_make(&g, n, master, 10 + i, -1.0f, 1.0f);
        c->gr[i] = tt_make(&g, n, grad, 20 + i, -0.5f, 0.5f);
        /* garbage that the first (fresh) update must not read */
        c->m[i] = tt_make(&g, n, VH_DTYPE_F32, 30 + i, 7.0f, 7.0f);
        c->v[i] = tt_make(&g, n, VH_DTYPE_F32, 40 + i, 7.0f, 7.0f);
        c->copy[i] = tt_make(&g, n, VH_DTYPE_BF16, 50 + i, 0.0f, 0.0f);
        vh_cuda_mta_tensor t = {.master = c->p[i].gpu, .grad = c->gr[i].gpu,
                                .copy = with_copy ? c->copy[i].gpu : NULL, .numel = n,
                                .master_dtype = master, .grad_dtype = grad,
                                .copy_dtype = VH_DTYPE_BF16, .decays = i % 2 == 0};
        if (slots > 0) t.state[0] = c->m[i].gpu;
        if (slots > 1) t.state[1] = c->v[i].gpu;
        c->list[i] = t;
    }
}

static void case_free(opt_case *c) {
    for (int i = 0; i < NT; i++) {
        tt_free(&g, &c->p[i]);
        tt_free(&g, &c->gr[i]);
        tt_free(&g, &c->m[i]);
        tt_free(&g, &c->v[i]);
        tt_free(&g, &c->copy[i]);
    }
}

/* Fresh gradients for the next update, on both sides. */
static void case_new_grads(opt_case *c, uint64_t seed) {
    for (int i = 0; i < NT; i++) {
        tt_free(&g, &c->gr[i]);
        c->gr[i] = tt_make(&g, sizes[i], c->grad, seed + (uint64_t)i, -0.5f, 0.5f);
        c->list[i].grad = c->gr[i].gpu;
    }
}

/* x (n f32 values) into host memory of `dtype`, rounded to nearest even. */
static void store_host(void *dst, vh_dtype dtype, const float *x, int64_t n) {
    void *h = gpu_twin_host(x, n, dtype);
    memcpy(dst, h, (size_t)n * (dtype == VH_DTYPE_F32 ? 4 : 2));
    free(h);
}

/* step.c's adam_args. */
static mta_adam_args adam_of(const hyper *h) {
    const double t = (double)(h->updates + 1);
    const double bc1 = 1.0 - pow(h->beta1, t), bc2 = 1.0 - pow(h->beta2, t);
    mta_adam_args a = {.grad_scale = h->grad_scale, .beta1 = (float)h->beta1,
                       .one_minus_beta1 = (float)(1.0 - h->beta1), .beta2 = (float)h->beta2,
                       .one_minus_beta2 = (float)(1.0 - h->beta2), .eps = (float)h->eps,
                       .fresh = h->updates == 0, .bias_correction1 = (float)bc1,
                       .bias_correction2 = (float)bc2, .neg_step_size = (float)-(h->lr / bc1),
                       .bias_correction2_sqrt = (float)sqrt(bc2)};
    return a;
}

/* What mta's cuda_step.c hands the extension. */
static vh_cuda_mta_args gpu_args(opt_case *c, const hyper *h, const mta_adam_args *a,
                                 double *sums) {
    vh_cuda_mta_args x = {.struct_size = sizeof x, .count = NT, .tensors = c->list,
                          .grad_scale = h->grad_scale, .fresh = h->updates == 0,
                          .beta1 = a->beta1, .one_minus_beta1 = a->one_minus_beta1,
                          .beta2 = a->beta2, .one_minus_beta2 = a->one_minus_beta2,
                          .eps = a->eps, .neg_step_size = a->neg_step_size,
                          .bias_correction2_sqrt = a->bias_correction2_sqrt,
                          .bias_correction1 = a->bias_correction1,
                          .bias_correction2 = a->bias_correction2,
                          .decay = (float)(1.0 - h->lr * h->wd), .weight_decay = (float)h->wd,
                          .neg_lr = (float)-h->lr, .momentum = (float)h->momentum,
                          .nesterov = h->nesterov, .sums = sums};
    return x;
}

static void download_sums(double *out, const double *dev, size_t count) {
    assert_int_equal(g.gpu.synchronize(g.gpu.device), VH_STATUS_OK);
    assert_int_equal(g.gpu.copy(g.gpu.device, out, dev, count * sizeof(double),
                                VH_COPY_KIND_DEVICE_TO_HOST, NULL),
                     VH_STATUS_OK);
}

static double trust_ratio(double p_sq, double u_sq, int adapt) {
    if (!adapt) return 1.0;
    return p_sq > 0.0 && u_sq > 0.0 ? sqrt(p_sq) / sqrt(u_sq) : 1.0;
}

/* LAMB on both sides: the GPU's per-tensor sums against the CPU's, then
 * both apply with the CPU's rates. pf, gf: the tensors' f32 views. */
static void lamb_both(opt_case *c, const hyper *h, float **pf, float **gf) {
    const mta_adam_args a = adam_of(h);
    double *dsums = NULL, gsums[2 * NT];
    assert_int_equal(g.gpu.alloc(g.gpu.device, sizeof gsums, (void **)&dsums), VH_STATUS_OK);
    vh_cuda_mta_args x = gpu_args(c, h, &a, dsums);
    assert_int_equal(ops->lamb_moments(g.gpu.device, &x), VH_STATUS_OK);
    download_sums(gsums, dsums, 2 * NT);
    for (int i = 0; i < NT; i++) {
        const float wd = c->list[i].decays ? (float)h->wd : 0.0f;
        double ps = 0.0, us = 0.0;
        mta_lamb_moments_chunk(&a, wd, pf[i], gf[i], c->m[i].cpu, c->v[i].cpu, sizes[i], &ps,
                               &us);
        assert_true(fabs(gsums[2 * i] - ps) <= 1e-9 * ps);
        assert_true(fabs(gsums[2 * i + 1] - us) <= 1e-9 * us);
        const float rate = (float)(h->lr * trust_ratio(ps, us, wd != 0.0f));
        c->list[i].lamb_rate = rate;
        mta_lamb_apply_chunk(&a, wd, rate, pf[i], c->m[i].cpu, c->v[i].cpu, sizes[i]);
    }
    assert_int_equal(ops->lamb_apply(g.gpu.device, &x), VH_STATUS_OK);
    g.gpu.free(g.gpu.device, dsums);
}

/* The CPU kernels on f32 views of every tensor (pf, gf), and the GPU call. */
static void update_both(opt_case *c, algo which, const hyper *h, float **pf, float **gf) {
    const mta_adam_args a = adam_of(h);
    vh_cuda_mta_args x = gpu_args(c, h, &a, NULL);
    if (which == ALGO_LAMB) {
        lamb_both(c, h, pf, gf);
        return;
    }
    const mta_sgd_args s = {.grad_scale = h->grad_scale, .neg_lr = (float)-h->lr,
                            .momentum = (float)h->momentum, .nesterov = h->nesterov,
                            .fresh = h->updates == 0};
    for (int i = 0; i < NT; i++) {
        const int d = c->list[i].decays;
        if (which == ALGO_ADAMW)
            mta_adamw_chunk(&a, d ? x.decay : 1.0f, pf[i], gf[i], c->m[i].cpu, c->v[i].cpu,
                            sizes[i]);
        else
            mta_sgd_chunk(&s, d ? x.weight_decay : 0.0f, pf[i], gf[i],
                          c->slots ? (float *)c->m[i].cpu : NULL, sizes[i]);
    }
    vh_status st = which == ALGO_ADAMW ? ops->adamw(g.gpu.device, &x)
                                       : ops->sgd(g.gpu.device, &x);
    assert_int_equal(st, VH_STATUS_OK);
}

/* One update on both sides, then every buffer compared. */
static void step_and_compare(opt_case *c, algo which, const hyper *h, const char *name) {
    float *pf[NT], *gf[NT];
    for (int i = 0; i < NT; i++) {
        const size_t n = (size_t)(sizes[i] > 0 ? sizes[i] : 1);
        pf[i] = malloc(n * sizeof(float)), gf[i] = malloc(n * sizeof(float));
        assert_non_null(pf[i]);
        assert_non_null(gf[i]);
        gpu_twin_widen(pf[i], c->p[i].cpu, sizes[i], c->master);
        gpu_twin_widen(gf[i], c->gr[i].cpu, sizes[i], c->grad);
    }
    update_both(c, which, h, pf, gf);
    for (int i = 0; i < NT; i++) {
        char what[128];
        store_host(c->p[i].cpu, c->master, pf[i], sizes[i]);
        store_host(c->copy[i].cpu, VH_DTYPE_BF16, pf[i], sizes[i]);
        snprintf(what, sizeof what, "%s update %lld tensor %d master", name,
                 (long long)h->updates, i);
        assert_true(tt_same(&g, what, &c->p[i], gpu_twin_tol(c->master)));
        if (c->with_copy) {
            snprintf(what, sizeof what, "%s tensor %d bf16 copy", name, i);
            assert_true(tt_same(&g, what, &c->copy[i], gpu_twin_tol(VH_DTYPE_BF16)));
        }
        for (int k = 0; k < c->slots; k++) {
            snprintf(what, sizeof what, "%s tensor %d state %d", name, i, k);
            assert_true(tt_same(&g, what, k ? &c->v[i] : &c->m[i], gpu_twin_tol(VH_DTYPE_F32)));
        }
        free(pf[i]);
        free(gf[i]);
    }
}

/* Two updates: the fresh one, then one that reads the state, with a
 * clipping factor. */
static void run_case(algo which, vh_dtype master, vh_dtype grad, int with_copy, hyper h,
                     const char *name) {
    const int slots = which == ALGO_SGD ? (h.momentum > 0.0 ? 1 : 0) : 2;
    opt_case *c = malloc(sizeof *c);
    assert_non_null(c);
    case_make(c, master, grad, with_copy, slots);
    h.updates = 0, h.grad_scale = 1.0f;
    step_and_compare(c, which, &h, name);
    case_new_grads(c, 60);
    h.updates = 1, h.grad_scale = 0.75f;
    step_and_compare(c, which, &h, name);
    case_free(c);
    free(c);
}

static const hyper adam_h = {.lr = 1e-3, .wd = 0.05, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};

static void test_adamw(void **state) {
    (void)state;
    run_case(ALGO_ADAMW, VH_DTYPE_F32, VH_DTYPE_F32, 1, adam_h, "adamw f32/f32");
    run_case(ALGO_ADAMW, VH_DTYPE_F32, VH_DTYPE_BF16, 1, adam_h, "adamw f32/bf16 grads");
    run_case(ALGO_ADAMW, VH_DTYPE_BF16, VH_DTYPE_BF16, 0, adam_h, "adamw bf16 master");
    run_case(ALGO_ADAMW, VH_DTYPE_F16, VH_DTYPE_F16, 0, adam_h, "adamw f16 master");
}

static void test_sgd(void **state) {
    (void)state;
    hyper h = {.lr = 0.1, .wd = 1e-4, .momentum = 0.9, .nesterov = 0};
    run_case(ALGO_SGD, VH_DTYPE_F32, VH_DTYPE_F32, 1, h, "sgd momentum");
    h.nesterov = 1;
    run_case(ALGO_SGD, VH_DTYPE_F32, VH_DTYPE_BF16, 1, h, "sgd nesterov");
    h.nesterov = 0, h.momentum = 0.0;
    run_case(ALGO_SGD, VH_DTYPE_BF16, VH_DTYPE_BF16, 0, h, "sgd plain bf16 master");
}

static void test_lamb(void **state) {
    (void)state;
    run_case(ALGO_LAMB, VH_DTYPE_F32, VH_DTYPE_F32, 1, adam_h, "lamb f32/f32");
    run_case(ALGO_LAMB, VH_DTYPE_F32, VH_DTYPE_BF16, 1, adam_h, "lamb f32/bf16 grads");
    run_case(ALGO_LAMB, VH_DTYPE_BF16, VH_DTYPE_BF16, 0, adam_h, "lamb bf16 master");
}

/* The clipping norm's sums: per tensor, against mta_sum_squares. */
static void test_sum_squares(void **state) {
    (void)state;
    const vh_dtype dtypes[] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        opt_case *c = malloc(sizeof *c);
        assert_non_null(c);
        case_make(c, VH_DTYPE_F32, dtypes[d], 0, 0);
        double *dsums = NULL, gsums[NT];
        assert_int_equal(g.gpu.alloc(g.gpu.device, sizeof gsums, (void **)&dsums), VH_STATUS_OK);
        vh_cuda_mta_args x = {.struct_size = sizeof x, .count = NT, .tensors = c->list,
                              .sums = dsums};
        assert_int_equal(ops->sum_squares(g.gpu.device, &x), VH_STATUS_OK);
        download_sums(gsums, dsums, NT);
        for (int i = 0; i < NT; i++) {
            float *gf = malloc((size_t)(sizes[i] > 0 ? sizes[i] : 1) * sizeof(float));
            assert_non_null(gf);
            gpu_twin_widen(gf, c->gr[i].cpu, sizes[i], dtypes[d]);
            const double want = mta_sum_squares(gf, sizes[i]);
            if (!(fabs(gsums[i] - want) <= 1e-12 * want))
                fail_msg("sum of squares, %s tensor %d: gpu %.17g, cpu %.17g",
                         tt_dtype_name(dtypes[d]), i, gsums[i], want);
            free(gf);
        }
        g.gpu.free(g.gpu.device, dsums);
        case_free(c);
        free(c);
    }
}

/* Refused before any launch: a dtype the kernels do not take, a missing
 * buffer, a negative count. */
static void test_refusals(void **state) {
    (void)state;
    opt_case *c = malloc(sizeof *c);
    assert_non_null(c);
    case_make(c, VH_DTYPE_F32, VH_DTYPE_F32, 0, 2);
    const mta_adam_args a = adam_of(&adam_h);
    vh_cuda_mta_args x = gpu_args(c, &adam_h, &a, NULL);
    c->list[1].grad_dtype = VH_DTYPE_I32;
    assert_int_equal(ops->adamw(g.gpu.device, &x), VH_STATUS_ERR_UNSUPPORTED);
    c->list[1].grad_dtype = VH_DTYPE_F32;
    c->list[2].state[1] = NULL;
    assert_int_equal(ops->adamw(g.gpu.device, &x), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(ops->lamb_moments(g.gpu.device, &x), VH_STATUS_ERR_INVALID_ARG);
    x.count = -1;
    assert_int_equal(ops->sgd(g.gpu.device, &x), VH_STATUS_ERR_INVALID_ARG);
    x.count = NT;
    assert_int_equal(ops->sum_squares(g.gpu.device, &x), VH_STATUS_ERR_INVALID_ARG); /* no sums */
    assert_int_equal(ops->adamw(g.gpu.device, NULL), VH_STATUS_ERR_INVALID_ARG);
    case_free(c);
    free(c);
}

int main(void) {
    gpu_twin_open(&g, "test_cuda_optim");
    if (VH_STRUCT_HAS(&g.gpu, vh_device_ops, get_extension) && g.gpu.get_extension)
        ops = g.gpu.get_extension(g.gpu.device, VH_CUDA_MTA_EXTENSION);
    if (!ops || !VH_STRUCT_HAS(ops, vh_cuda_mta_ops, sum_squares)) {
        fprintf(stderr, "test_cuda_optim: the CUDA device has no complete \"%s\" extension\n",
                VH_CUDA_MTA_EXTENSION);
        return 1; /* a broken build, not a missing GPU */
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),       cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_lamb),        cmocka_unit_test(test_sum_squares),
        cmocka_unit_test(test_refusals),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_twin_close(&g);
    return failed;
}
