/* test_cuda_attention.c - the CUDA attention against the CPU device's, from
 * the same inputs: batch-first and batch-second strides (and rows with a
 * gap), odd token counts, head dims 16, 24, 64 (the fused forward) and 130
 * (the tiled forward), f32/bf16/f16 with probs in the same dtype or another;
 * forward out and probs, then backward from the CPU's probs into dqkv
 * pre-filled with nonzero values (it accumulates). Every case runs on both
 * paths: VITHOST_CUDA_ATTENTION=tiled, then the default (cuBLASLt). Without
 * a GPU: one SKIPPED line, exit 77. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_twin.h"

static gpu_twin twin;

typedef struct attn_case {
    int64_t batch, tokens, heads, head_dim;
    int batch_second; /* (N, B, 3D) instead of (B, N, 3D) */
    int64_t gap;      /* unused elements after every token row */
    vh_dtype dtype, probs_dtype;
} attn_case;

/* The two devices' buffers of one case: g* on the GPU, h* on the host. */
typedef struct attn_bufs {
    void *gqkv, *gout, *gprobs, *gdout, *gdqkv;
    void *hqkv, *hout, *hprobs, *hdout, *hdqkv;
} attn_bufs;

static vh_attention_args case_args(const attn_case *c) {
    const int64_t dm = c->heads * c->head_dim, qrow = 3 * dm + c->gap, orow = dm + c->gap;
    vh_attention_args a = {.struct_size = sizeof a, .batch = c->batch, .tokens = c->tokens,
                           .heads = c->heads, .head_dim = c->head_dim,
                           .scale = 1.0f / sqrtf((float)c->head_dim), .dtype = c->dtype,
                           .probs_dtype = c->probs_dtype};
    if (c->batch_second) {
        a.qkv_batch_stride = qrow, a.qkv_token_stride = c->batch * qrow;
        a.out_batch_stride = orow, a.out_token_stride = c->batch * orow;
    } else {
        a.qkv_batch_stride = c->tokens * qrow, a.qkv_token_stride = qrow;
        a.out_batch_stride = c->tokens * orow, a.out_token_stride = orow;
    }
    return a;
}

static double max_tol(vh_dtype a, vh_dtype b) {
    return fmax(gpu_twin_tol(a), gpu_twin_tol(b));
}

/* Forward on both devices; compares out (whole buffer, gaps included) and
 * probs. 1 when both match. */
static int check_forward(const attn_case *c, vh_attention_args a, const attn_bufs *b,
                         int64_t no, int64_t np, const char *name) {
    a.qkv = b->gqkv, a.out = b->gout, a.probs = b->gprobs;
    assert_int_equal(twin.gpu.attention_forward(twin.gpu.device, &a), VH_STATUS_OK);
    a.qkv = b->hqkv, a.out = b->hout, a.probs = b->hprobs;
    assert_int_equal(twin.cpu->attention_forward(twin.cpu->device, &a), VH_STATUS_OK);
    float *g = malloc((size_t)(no > np ? no : np) * sizeof(float));
    float *h = malloc((size_t)(no > np ? no : np) * sizeof(float));
    assert_non_null(g);
    assert_non_null(h);
    char what[160];
    gpu_twin_download(&twin, g, b->gprobs, np, c->probs_dtype);
    gpu_twin_widen(h, b->hprobs, np, c->probs_dtype);
    snprintf(what, sizeof what, "%s probs", name);
    int ok = gpu_twin_close_enough(what, g, h, np, 2 * gpu_twin_tol(c->probs_dtype));
    gpu_twin_download(&twin, g, b->gout, no, c->dtype);
    gpu_twin_widen(h, b->hout, no, c->dtype);
    snprintf(what, sizeof what, "%s out", name);
    /* out sums over P as stored: a probability rounded the other way on one
     * side moves it by up to an ulp of probs_dtype */
    ok &= gpu_twin_close_enough(what, g, h, no, 4 * max_tol(c->dtype, c->probs_dtype));
    free(g);
    free(h);
    return ok;
}

/* Backward on both devices from the same probs (the CPU's); compares dqkv. */
static int check_backward(const attn_case *c, vh_attention_args a, attn_bufs *b, int64_t nq,
                          int64_t np, const char *name) {
    float *p = malloc((size_t)np * sizeof(float)), *g = malloc((size_t)nq * sizeof(float));
    float *h = malloc((size_t)nq * sizeof(float));
    assert_non_null(p);
    assert_non_null(g);
    assert_non_null(h);
    gpu_twin_widen(p, b->hprobs, np, c->probs_dtype);
    gpu_twin_free(&twin, b->gprobs);
    b->gprobs = gpu_twin_upload(&twin, p, np, c->probs_dtype); /* exact: already rounded */
    a.qkv = b->gqkv, a.probs = b->gprobs, a.dout = b->gdout, a.dqkv = b->gdqkv;
    assert_int_equal(twin.gpu.attention_backward(twin.gpu.device, &a), VH_STATUS_OK);
    a.qkv = b->hqkv, a.probs = b->hprobs, a.dout = b->hdout, a.dqkv = b->hdqkv;
    assert_int_equal(twin.cpu->attention_backward(twin.cpu->device, &a), VH_STATUS_OK);
    gpu_twin_download(&twin, g, b->gdqkv, nq, c->dtype);
    gpu_twin_widen(h, b->hdqkv, nq, c->dtype);
    char what[160];
    snprintf(what, sizeof what, "%s dqkv", name);
    const int ok = gpu_twin_close_enough(what, g, h, nq, 4 * gpu_twin_tol(c->dtype));
    free(p);
    free(g);
    free(h);
    return ok;
}

static int run_case(const attn_case *c) {
    const vh_attention_args a = case_args(c);
    const int64_t dm = c->heads * c->head_dim, rows = c->batch * c->tokens;
    const int64_t nq = rows * (3 * dm + c->gap), no = rows * (dm + c->gap);
    const int64_t np = c->batch * c->heads * c->tokens * c->tokens;
    char name[128];
    snprintf(name, sizeof name, "B=%lld N=%lld H=%lld Dh=%lld %s gap=%lld dtype=%d probs=%d",
             (long long)c->batch, (long long)c->tokens, (long long)c->heads,
             (long long)c->head_dim, c->batch_second ? "batch-second" : "batch-first",
             (long long)c->gap, (int)c->dtype, (int)c->probs_dtype);
    float *qkv = malloc((size_t)nq * sizeof(float)), *dqkv = malloc((size_t)nq * sizeof(float));
    float *out = malloc((size_t)no * sizeof(float)), *dout = malloc((size_t)no * sizeof(float));
    float *probs = malloc((size_t)np * sizeof(float));
    assert_true(qkv && dqkv && out && dout && probs);
    gpu_twin_fill(qkv, nq, 1, -2.0f, 2.0f);
    gpu_twin_fill(dqkv, nq, 2, -0.5f, 0.5f); /* backward adds to these */
    gpu_twin_fill(out, no, 3, 5.0f, 6.0f);   /* overwritten, but for the gaps */
    gpu_twin_fill(dout, no, 4, -1.0f, 1.0f);
    gpu_twin_fill(probs, np, 5, -1.0f, 0.0f); /* overwritten */
    attn_bufs b = {
        gpu_twin_upload(&twin, qkv, nq, c->dtype), gpu_twin_upload(&twin, out, no, c->dtype),
        gpu_twin_upload(&twin, probs, np, c->probs_dtype),
        gpu_twin_upload(&twin, dout, no, c->dtype), gpu_twin_upload(&twin, dqkv, nq, c->dtype),
        gpu_twin_host(qkv, nq, c->dtype), gpu_twin_host(out, no, c->dtype),
        gpu_twin_host(probs, np, c->probs_dtype), gpu_twin_host(dout, no, c->dtype),
        gpu_twin_host(dqkv, nq, c->dtype)};
    int ok = check_forward(c, a, &b, no, np, name);
    ok &= check_backward(c, a, &b, nq, np, name);
    void *gpu[] = {b.gqkv, b.gout, b.gprobs, b.gdout, b.gdqkv};
    void *host[] = {b.hqkv, b.hout, b.hprobs, b.hdout, b.hdqkv, qkv, dqkv, out, dout, probs};
    for (size_t i = 0; i < sizeof gpu / sizeof gpu[0]; i++) gpu_twin_free(&twin, gpu[i]);
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    return ok;
}

/* Every layout and shape for one dtype (probs in the same dtype). */
static void run_dtype(vh_dtype dtype) {
    static const int64_t shapes[][2] = {{17, 16}, {65, 24}, {197, 64}, {33, 130}, {1, 16},
                                        {197, 80}};
    int ok = 1;
    for (int layout = 0; layout < 2; layout++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const attn_case c = {2, shapes[s][0], 3, shapes[s][1], layout, 0, dtype, dtype};
            ok &= run_case(&c);
        }
    assert_true(ok);
}

static void test_attention_f32(void **state) {
    (void)state;
    run_dtype(VH_DTYPE_F32);
}

static void test_attention_bf16(void **state) {
    (void)state;
    run_dtype(VH_DTYPE_BF16);
}

static void test_attention_f16(void **state) {
    (void)state;
    run_dtype(VH_DTYPE_F16);
}

/* probs in another dtype than qkv, rows with gaps, a head of 96 (the fused
 * kernel's widest size with a tail), one sample, one head. */
static void test_attention_mixed(void **state) {
    (void)state;
    static const attn_case cases[] = {
        {2, 65, 3, 16, 0, 0, VH_DTYPE_BF16, VH_DTYPE_F32},
        {2, 17, 2, 64, 1, 0, VH_DTYPE_F32, VH_DTYPE_BF16},
        {3, 50, 2, 24, 1, 5, VH_DTYPE_F16, VH_DTYPE_F16},
        {2, 33, 2, 130, 0, 3, VH_DTYPE_F32, VH_DTYPE_F16},
        {2, 40, 2, 96, 0, 2, VH_DTYPE_F32, VH_DTYPE_F32},
        {1, 197, 1, 64, 1, 0, VH_DTYPE_BF16, VH_DTYPE_BF16},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ok &= run_case(&cases[i]);
    assert_true(ok);
}

/* The argument checks answer as the CPU's. */
static void test_attention_args(void **state) {
    (void)state;
    const attn_case c = {1, 4, 1, 8, 0, 0, VH_DTYPE_F32, VH_DTYPE_F32};
    const float x[4 * 24] = {0};
    void *g = gpu_twin_upload(&twin, x, 4 * 24, VH_DTYPE_F32);
    vh_attention_args a = case_args(&c);
    a.qkv = g, a.out = g, a.dout = g, a.dqkv = g; /* probs NULL */
    assert_int_equal(twin.gpu.attention_forward(twin.gpu.device, &a), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(twin.gpu.attention_backward(twin.gpu.device, &a),
                     VH_STATUS_ERR_INVALID_ARG);
    a.probs = g;
    a.dtype = VH_DTYPE_I32;
    assert_int_equal(twin.gpu.attention_forward(twin.gpu.device, &a), VH_STATUS_ERR_INVALID_ARG);
    a.dtype = VH_DTYPE_F32;
    a.qkv_token_stride = 3 * 8 - 1;
    assert_int_equal(twin.gpu.attention_forward(twin.gpu.device, &a), VH_STATUS_ERR_INVALID_ARG);
    a.tokens = 0, a.probs = NULL; /* empty: nothing to do, nothing checked */
    assert_int_equal(twin.gpu.attention_forward(twin.gpu.device, &a), VH_STATUS_OK);
    assert_int_equal(twin.gpu.attention_backward(twin.gpu.device, &a), VH_STATUS_OK);
    assert_int_equal(twin.gpu.attention_forward(twin.gpu.device, NULL),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(twin.gpu.synchronize(twin.gpu.device), VH_STATUS_OK);
    gpu_twin_free(&twin, g);
}

int main(void) {
    gpu_twin_open(&twin, "test_cuda_attention");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_args),
        cmocka_unit_test(test_attention_f32),
        cmocka_unit_test(test_attention_bf16),
        cmocka_unit_test(test_attention_f16),
        cmocka_unit_test(test_attention_mixed),
    };
    /* Both paths: the tiled/fused kernels, then the default (cuBLASLt where
     * probs has the operands' dtype, attention_gemm.cu). */
    setenv("VITHOST_CUDA_ATTENTION", "tiled", 1);
    int failed = cmocka_run_group_tests_name("tiled path", tests, NULL, NULL);
    unsetenv("VITHOST_CUDA_ATTENTION");
    failed += cmocka_run_group_tests_name("default path", tests, NULL, NULL);
    gpu_twin_close(&twin);
    return failed;
}
