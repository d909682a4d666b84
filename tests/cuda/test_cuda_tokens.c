/* test_cuda_tokens.c - the CUDA token ops (tokens.cu), cross-entropy
 * (loss.cu) and the multi-tensor scale/check (multi_tensor.cu) against the
 * CPU twin: mean pooling, patchify and the embedding in both layouts
 * (batch-first and batch-second, with and without a class token), the loss
 * with label smoothing, and sums of squares over lists longer than one
 * launch; f32, bf16 and f16, odd sizes.
 * Without a GPU it prints one SKIPPED line and exits 77. */
#include <math.h>
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

/* Token strides of a (B, T, D) tensor: batch-first or batch-second. */
static void strides(int layout, int64_t B, int64_t T, int64_t D, int64_t *bs, int64_t *ts) {
    *bs = layout ? D : T * D;
    *ts = layout ? B * D : D;
}

#define TOK_BOTH(op, a)                                                           \
    do {                                                                          \
        assert_int_equal(g.cpu->op(g.cpu->device, &(a)[0]), VH_STATUS_OK);        \
        assert_int_equal(g.gpu.op(g.gpu.device, &(a)[1]), VH_STATUS_OK);          \
    } while (0)

static void test_mean_pool(void **state) {
    (void)state;
    const int64_t B = 3, T = 6, D = 37, first = 1, count = 5;
    for (int k = 0; k < 3; k++)
        for (int layout = 0; layout < 2; layout++) {
            const vh_dtype dt = tt_dtypes[k];
            tt x = tt_make(&g, B * T * D, dt, 1, -2.0f, 2.0f);
            tt out = tt_make(&g, B * D, dt, 2, 0.0f, 0.0f);
            tt dout = tt_make(&g, B * D, dt, 3, -1.0f, 1.0f);
            tt dx = tt_make(&g, B * T * D, dt, 4, -1.0f, 1.0f);
            vh_tokens_args a[2];
            for (int s = 0; s < 2; s++) {
                a[s] = (vh_tokens_args){.struct_size = sizeof a[s], .batch = B, .tokens = T,
                                        .dim = D, .dtype = dt, .first = first, .count = count,
                                        .x = tt_ptr(&x, s), .out = tt_ptr(&out, s),
                                        .dout = tt_ptr(&dout, s), .dx = tt_ptr(&dx, s)};
                strides(layout, B, T, D, &a[s].batch_stride, &a[s].token_stride);
            }
            TOK_BOTH(mean_pool_forward, a);
            assert_true(tt_same(&g, "mean_pool_forward", &out, gpu_twin_tol(dt)));
            TOK_BOTH(mean_pool_backward, a);
            assert_true(tt_same(&g, "mean_pool_backward dx +=", &dx, gpu_twin_tol(dt)));
            tt_free(&g, &x), tt_free(&g, &out), tt_free(&g, &dout), tt_free(&g, &dx);
        }
}

static void test_patchify(void **state) {
    (void)state;
    const int64_t B = 2, C = 3, H = 8, W = 12, P = 4, NP = (H / P) * (W / P), K = C * P * P;
    for (int k = 0; k < 3; k++)
        for (int layout = 0; layout < 2; layout++)
            for (int img_f32 = 0; img_f32 < 2; img_f32++) {
                const vh_dtype dt = tt_dtypes[k], idt = img_f32 ? VH_DTYPE_F32 : dt;
                tt img = tt_make(&g, B * C * H * W, idt, 5, -1.0f, 1.0f);
                tt out = tt_make(&g, B * NP * K, dt, 6, 0.0f, 0.0f);
                vh_tokens_args a[2];
                for (int s = 0; s < 2; s++) {
                    a[s] = (vh_tokens_args){.struct_size = sizeof a[s], .batch = B,
                                            .tokens = NP, .dim = K, .dtype = dt,
                                            .image_dtype = idt, .images = tt_ptr(&img, s),
                                            .channels = C, .height = H, .width = W, .patch = P,
                                            .out = tt_ptr(&out, s)};
                    strides(layout, B, NP, K, &a[s].batch_stride, &a[s].token_stride);
                }
                TOK_BOTH(patchify, a);
                assert_true(tt_same(&g, "patchify", &out, 0.0)); /* a copy: exact */
                tt_free(&g, &img), tt_free(&g, &out);
            }
}

/* Embedding forward and backward: layout x class token x dtypes. */
static void embed_check(vh_dtype dt, vh_dtype pdt, int layout, int has_cls) {
    const int64_t B = 3, NP = 5, D = 37, T = NP + has_cls;
    tt patches = tt_make(&g, B * NP * D, dt, 7, -1.0f, 1.0f);
    tt cls = tt_make(&g, D, pdt, 8, -1.0f, 1.0f), pos = tt_make(&g, T * D, pdt, 9, -1.0f, 1.0f);
    tt out = tt_make(&g, B * T * D, dt, 10, 0.0f, 0.0f);
    tt dout = tt_make(&g, B * T * D, dt, 11, -1.0f, 1.0f);
    tt dpatches = tt_make(&g, B * NP * D, dt, 12, -1.0f, 1.0f);
    tt dcls = tt_make(&g, D, pdt, 13, -1.0f, 1.0f), dpos = tt_make(&g, T * D, pdt, 14, -1.0f, 1.0f);
    vh_tokens_args a[2];
    for (int s = 0; s < 2; s++) {
        a[s] = (vh_tokens_args){.struct_size = sizeof a[s], .batch = B, .tokens = T, .dim = D,
                                .dtype = dt, .param_dtype = pdt, .grad_dtype = pdt,
                                .num_patches = NP, .patch_batch_stride = NP * D,
                                .patch_token_stride = D, .patches = tt_ptr(&patches, s),
                                .cls = has_cls ? tt_ptr(&cls, s) : NULL, .pos = tt_ptr(&pos, s),
                                .out = tt_ptr(&out, s), .dout = tt_ptr(&dout, s),
                                .dpatches = tt_ptr(&dpatches, s),
                                .dcls = has_cls ? tt_ptr(&dcls, s) : NULL,
                                .dpos = tt_ptr(&dpos, s)};
        strides(layout, B, T, D, &a[s].batch_stride, &a[s].token_stride);
    }
    TOK_BOTH(embed_forward, a);
    assert_true(tt_same(&g, "embed_forward", &out, gpu_twin_tol(dt)));
    TOK_BOTH(embed_backward, a);
    assert_true(tt_same(&g, "embed_backward dpatches +=", &dpatches, gpu_twin_tol(dt)));
    assert_true(tt_same(&g, "embed_backward dcls +=", &dcls, gpu_twin_tol(pdt)));
    assert_true(tt_same(&g, "embed_backward dpos +=", &dpos, gpu_twin_tol(pdt)));
    tt *all[] = {&patches, &cls, &pos, &out, &dout, &dpatches, &dcls, &dpos};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(&g, all[i]);
}

static void test_embed(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++)
        for (int layout = 0; layout < 2; layout++)
            for (int has_cls = 0; has_cls < 2; has_cls++) {
                embed_check(tt_dtypes[k], VH_DTYPE_F32, layout, has_cls);
                embed_check(tt_dtypes[k], tt_dtypes[k], layout, has_cls);
            }
}

/* ---- cross-entropy ---------------------------------------------------------------- */

static void xent_check(vh_dtype dt, int64_t B, int64_t C, float smoothing) {
    int32_t *labels = malloc((size_t)(B > 0 ? B : 1) * sizeof(int32_t));
    assert_non_null(labels);
    for (int64_t b = 0; b < B; b++) labels[b] = (int32_t)((b * 7919 + 3) % C);
    int32_t *dlabels = NULL;
    float *dloss = NULL, cpu_loss = -1.0f;
    assert_int_equal(g.gpu.alloc(g.gpu.device, (size_t)(B > 0 ? B : 1) * 4, (void **)&dlabels),
                     VH_STATUS_OK);
    assert_int_equal(g.gpu.alloc(g.gpu.device, 4, (void **)&dloss), VH_STATUS_OK);
    if (B > 0)
        assert_int_equal(g.gpu.copy(g.gpu.device, dlabels, labels, (size_t)B * 4,
                                    VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
    tt logits = tt_make(&g, B * C, dt, 15, -6.0f, 6.0f);
    tt dlogits = tt_make(&g, B * C, dt, 16, -0.1f, 0.1f);
    vh_xent_args a[2];
    for (int s = 0; s < 2; s++)
        a[s] = (vh_xent_args){.struct_size = sizeof a[s], .batch = B, .classes = C,
                              .smoothing = smoothing, .dloss_scale = 2.0f, .dtype = dt,
                              .logits = B ? tt_ptr(&logits, s) : NULL,
                              .labels = s ? dlabels : labels, .loss = s ? dloss : &cpu_loss,
                              .dlogits = B ? tt_ptr(&dlogits, s) : NULL};
    TOK_BOTH(softmax_cross_entropy, a);
    char what[96];
    snprintf(what, sizeof what, "xent loss (%s, B %lld, C %lld)", tt_dtype_name(dt),
             (long long)B, (long long)C);
    assert_true(tt_same_f32(&g, what, dloss, &cpu_loss, 1, 1e-5));
    if (B > 0) assert_true(tt_same(&g, "xent dlogits +=", &dlogits, gpu_twin_tol(dt)));
    tt_free(&g, &logits), tt_free(&g, &dlogits);
    g.gpu.free(g.gpu.device, dlabels);
    g.gpu.free(g.gpu.device, dloss);
    free(labels);
}

/* ABI 2.2 soft targets (rows of positive values summing to 1), no labels. */
static void xent_soft_check(vh_dtype dt, int64_t B, int64_t C) {
    float *targets = malloc((size_t)(B * C) * sizeof(float)), *dtargets = NULL;
    float *dloss = NULL, cpu_loss = -1.0f;
    assert_non_null(targets);
    for (int64_t b = 0; b < B; b++) {
        double sum = 0.0;
        for (int64_t c = 0; c < C; c++)
            sum += targets[b * C + c] = (float)((b * 31 + c * 17) % 11 + 1);
        for (int64_t c = 0; c < C; c++) targets[b * C + c] = (float)(targets[b * C + c] / sum);
    }
    assert_int_equal(g.gpu.alloc(g.gpu.device, (size_t)(B * C) * 4, (void **)&dtargets),
                     VH_STATUS_OK);
    assert_int_equal(g.gpu.alloc(g.gpu.device, 4, (void **)&dloss), VH_STATUS_OK);
    assert_int_equal(g.gpu.copy(g.gpu.device, dtargets, targets, (size_t)(B * C) * 4,
                                VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
    tt logits = tt_make(&g, B * C, dt, 17, -6.0f, 6.0f);
    tt dlogits = tt_make(&g, B * C, dt, 18, -0.1f, 0.1f);
    vh_xent_args a[2];
    for (int s = 0; s < 2; s++)
        a[s] = (vh_xent_args){.struct_size = sizeof a[s], .batch = B, .classes = C,
                              .dloss_scale = 2.0f, .dtype = dt, .logits = tt_ptr(&logits, s),
                              .loss = s ? dloss : &cpu_loss, .dlogits = tt_ptr(&dlogits, s),
                              .targets = s ? dtargets : targets};
    TOK_BOTH(softmax_cross_entropy, a);
    assert_true(tt_same_f32(&g, "soft xent loss", dloss, &cpu_loss, 1, 1e-5));
    assert_true(tt_same(&g, "soft xent dlogits +=", &dlogits, gpu_twin_tol(dt)));
    tt_free(&g, &logits), tt_free(&g, &dlogits);
    g.gpu.free(g.gpu.device, dtargets);
    g.gpu.free(g.gpu.device, dloss);
    free(targets);
}

static void test_xent(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++) {
        xent_soft_check(tt_dtypes[k], 6, 37);
        xent_soft_check(tt_dtypes[k], 3, 1000);
    }
    for (int k = 0; k < 3; k++) {
        xent_check(tt_dtypes[k], 5, 37, 0.1f);
        xent_check(tt_dtypes[k], 3, 1000, 0.0f); /* rows longer than a block */
        xent_check(tt_dtypes[k], 9, 2, 1.0f);
    }
    xent_check(VH_DTYPE_F32, 0, 10, 0.1f); /* batch 0: loss 0 */
}

/* ---- multi-tensor scale and check --------------------------------------------------- */

typedef struct mt_set {
    int32_t count;
    tt *t;
    void **cpu, **gpu;
    int64_t *numel;
    vh_dtype *dtype;
} mt_set;

static mt_set mt_make(int32_t count, const int64_t *numel, const vh_dtype *dtype) {
    mt_set m = {count, calloc((size_t)count, sizeof(tt)), calloc((size_t)count, sizeof(void *)),
                calloc((size_t)count, sizeof(void *)), calloc((size_t)count, sizeof(int64_t)),
                calloc((size_t)count, sizeof(vh_dtype))};
    assert_true(m.t && m.cpu && m.gpu && m.numel && m.dtype);
    for (int32_t i = 0; i < count; i++) {
        m.t[i] = tt_make(&g, numel[i], dtype[i], 100u + (uint64_t)i, -2.0f, 2.0f);
        m.cpu[i] = m.t[i].cpu, m.gpu[i] = m.t[i].gpu;
        m.numel[i] = numel[i], m.dtype[i] = dtype[i];
    }
    return m;
}

static void mt_free(mt_set *m) {
    for (int32_t i = 0; i < m->count; i++) tt_free(&g, &m->t[i]);
    free(m->t), free(m->cpu), free(m->gpu), free(m->numel), free(m->dtype);
}

/* Runs the op on both with `scale`; compares found_inf, and with `check`
 * the tensors and sum_sq (an Inf would make them Inf - Inf apart). The sum
 * of 70001 squares in another order: 1e-4. */
static void mt_run(mt_set *m, float scale, int check) {
    float cpu_out[2] = {0.0f, 0.0f}, *gpu_out = NULL;
    assert_int_equal(g.gpu.alloc(g.gpu.device, 8, (void **)&gpu_out), VH_STATUS_OK);
    assert_int_equal(g.gpu.memset_zero(g.gpu.device, gpu_out, 8, NULL), VH_STATUS_OK);
    vh_multi_tensor_args a[2];
    for (int s = 0; s < 2; s++)
        a[s] = (vh_multi_tensor_args){.struct_size = sizeof a[s], .count = m->count,
                                      .tensors = s ? m->gpu : m->cpu, .numels = m->numel,
                                      .dtypes = m->dtype, .scale = scale,
                                      .sum_sq = s ? gpu_out : &cpu_out[0],
                                      .found_inf = s ? gpu_out + 1 : &cpu_out[1]};
    TOK_BOTH(multi_tensor_scale_check, a);
    for (int32_t i = 0; check && i < m->count; i++)
        assert_true(tt_same(&g, "multi_tensor scaled", &m->t[i], gpu_twin_tol(m->dtype[i])));
    float got[2];
    gpu_twin_download(&g, got, gpu_out, 2, VH_DTYPE_F32);
    assert_true(got[1] == cpu_out[1]); /* found_inf */
    if (!check) assert_true(got[1] == 1.0f);
    if (check) assert_true(gpu_twin_close_enough("multi_tensor sum_sq", got, cpu_out, 1, 1e-4));
    g.gpu.free(g.gpu.device, gpu_out);
}

static void test_multi_tensor(void **state) {
    (void)state;
    const int64_t numel[4] = {1, 1000, 70001, 0};
    const vh_dtype dtype[4] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16, VH_DTYPE_F32};
    mt_set m = mt_make(4, numel, dtype);
    mt_run(&m, 0.5f, 1);
    mt_run(&m, 1.0f, 1);
    /* An Inf in the f16 tensor (on both sides): found_inf 1. */
    const uint16_t inf16 = 0x7c00;
    memcpy((uint16_t *)m.t[2].cpu + 4321, &inf16, 2);
    assert_int_equal(g.gpu.copy(g.gpu.device, (uint16_t *)m.t[2].gpu + 4321, &inf16, 2,
                                VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
    mt_run(&m, 1.0f, 0);
    assert_int_equal(g.gpu.synchronize(g.gpu.device), VH_STATUS_OK);
    mt_free(&m);

    /* More tensors than one launch takes (128), sizes 1..300. */
    int64_t many_n[300];
    vh_dtype many_t[300];
    for (int i = 0; i < 300; i++) many_n[i] = i + 1, many_t[i] = tt_dtypes[i % 3];
    m = mt_make(300, many_n, many_t);
    mt_run(&m, 0.25f, 1);
    mt_free(&m);

    mt_set none = {0, NULL, NULL, NULL, NULL, NULL}; /* count 0: sum 0 */
    mt_run(&none, 2.0f, 1);
}

int main(void) {
    gpu_twin_open(&g, "test_cuda_tokens");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mean_pool), cmocka_unit_test(test_patchify),
        cmocka_unit_test(test_embed),     cmocka_unit_test(test_xent),
        cmocka_unit_test(test_multi_tensor),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_twin_close(&g);
    return failed;
}
