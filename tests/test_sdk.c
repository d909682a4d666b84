/* test_sdk.c - the SDK runtime: names, dtype conversions, the CPU device
 * and the self communicator. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vithost/vh_runtime.h"
#include "vithost/vithost.h"

static void test_names(void **state) {
    (void)state;
    assert_string_equal(vh_role_name(VH_ROLE_MODEL), "model");
    assert_string_equal(vh_role_name(VH_ROLE_DATA), "data");
    assert_string_equal(vh_role_name((vh_role)42), "?");
    assert_string_equal(vh_status_str(VH_STATUS_ERR_CONFIG), "config error");
    assert_string_equal(vh_status_str((vh_status)999), "unknown status");
    assert_int_equal(vh_dtype_size(VH_DTYPE_BF16), 2);
    assert_int_equal(vh_dtype_size(VH_DTYPE_F64), 8);
    assert_int_equal(vh_dtype_size((vh_dtype)99), 0);
    assert_string_equal(vh_dtype_name(VH_DTYPE_F16), "f16");
}

static void test_tensor_numel(void **state) {
    (void)state;
    vh_tensor t = {.ndim = 3, .shape = {2, 3, 4}};
    assert_int_equal(vh_tensor_numel(&t), 24);
    t.ndim = 0;
    assert_int_equal(vh_tensor_numel(&t), 1);
    vh_param_desc p = {.name = "w", .ndim = 2, .shape = {5, 7}};
    assert_int_equal(vh_param_desc_numel(&p), 35);
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void test_f16_exact_values(void **state) {
    (void)state;
    assert_int_equal(vh_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(vh_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(vh_f32_to_f16(65504.0f), 0x7bff);   /* largest finite */
    assert_int_equal(vh_f32_to_f16(65520.0f), 0x7c00);   /* rounds to Inf */
    assert_int_equal(vh_f32_to_f16(1e-8f), 0x0000);      /* underflows to 0 */
    assert_int_equal(vh_f32_to_f16(5.9604645e-8f), 0x0001); /* smallest subnormal */
    assert_int_equal(vh_f32_to_f16(6.1035156e-5f), 0x0400); /* smallest normal */
    assert_int_equal(vh_f32_to_f16(INFINITY), 0x7c00);
    assert_true((vh_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (vh_f32_to_f16(NAN) & 0x3ff));
    /* ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 */
    assert_int_equal(vh_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(vh_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_true(vh_f16_to_f32(0x3555) > 0.333f && vh_f16_to_f32(0x3555) < 0.334f);
    assert_true(isinf(vh_f16_to_f32(0xfc00)) && vh_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(vh_f16_to_f32(0x7e00)));
    assert_true(vh_f16_to_f32(0x0001) == 0x1p-24f);
}

/* Every f16 value survives f16 -> f32 -> f16 exactly. */
static void test_f16_round_trip_all(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        uint16_t x = (uint16_t)h;
        float f = vh_f16_to_f32(x);
        if (isnan(f)) continue;
        assert_int_equal(vh_f32_to_f16(f), x);
    }
}

static void test_bf16(void **state) {
    (void)state;
    assert_int_equal(vh_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(bits(vh_bf16_to_f32(0x3f80)), bits(1.0f));
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down). */
    assert_int_equal(vh_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(vh_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_true(isnan(vh_bf16_to_f32(vh_f32_to_bf16(NAN))));
    assert_int_equal(vh_f32_to_bf16(INFINITY), 0x7f80);
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = vh_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        assert_int_equal(vh_f32_to_bf16(f), (uint16_t)h);
    }
}

static void test_cpu_device(void **state) {
    (void)state;
    const vh_device_ops *dev = vh_cpu_device_ops();
    assert_int_equal(dev->struct_size, sizeof(vh_device_ops));
    assert_int_equal(dev->kind, VH_DEVICE_KIND_CPU);
    float *a = NULL;
    assert_int_equal(dev->alloc(dev->device, 10 * sizeof(float), (void **)&a), VH_STATUS_OK);
    assert_int_equal((uintptr_t)a % 64, 0);
    float src[10];
    for (int i = 0; i < 10; i++) src[i] = (float)i * 0.5f - 2.0f;
    assert_int_equal(dev->copy(dev->device, a, src, sizeof src, VH_COPY_KIND_HOST_TO_DEVICE, NULL),
                     VH_STATUS_OK);
    uint16_t half[10];
    float back[10];
    assert_int_equal(dev->convert(dev->device, half, VH_DTYPE_F16, a, VH_DTYPE_F32, 10, NULL),
                     VH_STATUS_OK);
    assert_int_equal(dev->convert(dev->device, back, VH_DTYPE_F32, half, VH_DTYPE_F16, 10, NULL),
                     VH_STATUS_OK);
    for (int i = 0; i < 10; i++) assert_true(back[i] == src[i]); /* exactly representable */
    assert_int_equal(dev->convert(dev->device, half, VH_DTYPE_BF16, a, VH_DTYPE_F32, 10, NULL),
                     VH_STATUS_OK);
    assert_int_equal(half[2], vh_f32_to_bf16(src[2]));
    assert_int_equal(dev->convert(dev->device, back, VH_DTYPE_I32, a, VH_DTYPE_F32, 1, NULL),
                     VH_STATUS_ERR_UNSUPPORTED);
    assert_int_equal(dev->memset_zero(dev->device, a, 10 * sizeof(float), NULL), VH_STATUS_OK);
    for (int i = 0; i < 10; i++) assert_true(a[i] == 0.0f);
    assert_int_equal(dev->synchronize(dev->device), VH_STATUS_OK);
    dev->free(dev->device, a);

    /* Pinned host memory is plain aligned memory on the CPU. */
    void *h = NULL;
    assert_int_equal(dev->host_alloc(dev->device, 100, &h), VH_STATUS_OK);
    assert_int_equal((uintptr_t)h % 64, 0);
    memset(h, 1, 100);
    dev->host_free(dev->device, h);
    assert_null(dev->get_extension(dev->device, "vh.no.such.extension"));
}

/* The device's array conversions against the scalar ones, value for value:
 * every f16 and bf16 bit pattern to f32, and f32 values around every rounding
 * boundary (ties, subnormals, overflow, Inf, NaN) back. Long enough for the
 * threaded path. */
static void test_cpu_convert_arrays(void **state) {
    (void)state;
    const vh_device_ops *dev = vh_cpu_device_ops();
    enum { N = 1 << 18 };
    uint16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    float *f = malloc(N * sizeof *f);
    assert_non_null(h);
    assert_non_null(h2);
    assert_non_null(f);
    for (uint32_t i = 0; i < N; i++) h[i] = (uint16_t)i;
    const vh_dtype types[2] = {VH_DTYPE_F16, VH_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        assert_int_equal(dev->convert(dev->device, f, VH_DTYPE_F32, h, types[t], N, NULL),
                         VH_STATUS_OK);
        for (uint32_t i = 0; i < N; i++) {
            const float want = t == 0 ? vh_f16_to_f32(h[i]) : vh_bf16_to_f32(h[i]);
            if (isnan(want))
                assert_true(isnan(f[i]));
            else
                assert_int_equal(bits(f[i]), bits(want));
        }
    }
    /* f32 inputs: every f16/bf16 value, the midpoints between neighbours, and
     * one f32 ulp either side of each midpoint. */
    uint64_t z = 7;
    for (uint32_t i = 0; i < N; i++) {
        const uint32_t base = (i >> 2) & 0xffffu;
        const int which = i & 3;
        uint32_t u = (base << 16) | (which == 0 ? 0 : which == 1 ? 0x8000u : which == 2 ? 0x7fffu
                                                                                     : 0x8001u);
        if ((i % 7) == 0) { /* plus some f16-oriented patterns: 13-bit boundaries */
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            u = (uint32_t)(z >> 32);
            u = (u & ~0x1fffu) | ((i & 8) ? 0x1000u : 0x0fffu);
        }
        memcpy(&f[i], &u, sizeof u);
    }
    for (int t = 0; t < 2; t++) {
        assert_int_equal(dev->convert(dev->device, h2, types[t], f, VH_DTYPE_F32, N, NULL),
                         VH_STATUS_OK);
        for (uint32_t i = 0; i < N; i++) {
            const uint16_t want = t == 0 ? vh_f32_to_f16(f[i]) : vh_f32_to_bf16(f[i]);
            if (isnan(f[i]))
                assert_true((h2[i] & 0x7fff) > (t == 0 ? 0x7c00 : 0x7f80));
            else if (h2[i] != want) {
                print_error("%s of %a (0x%08x): 0x%04x, scalar 0x%04x\n", t ? "bf16" : "f16",
                            (double)f[i], bits(f[i]), h2[i], want);
                fail();
            }
        }
    }
    /* f16 <-> bf16 goes through fp32. */
    for (uint32_t i = 0; i < 1000; i++) h[i] = (uint16_t)(i * 61u);
    assert_int_equal(dev->convert(dev->device, h2, VH_DTYPE_BF16, h, VH_DTYPE_F16, 1000, NULL),
                     VH_STATUS_OK);
    for (uint32_t i = 0; i < 1000; i++) {
        const float v = vh_f16_to_f32(h[i]);
        if (!isnan(v)) assert_int_equal(h2[i], vh_f32_to_bf16(v));
    }
    free(h), free(h2), free(f);
}

/* Streams and events exist on the CPU as finished work; the workspace is per
 * stream and grows. */
static void test_cpu_streams(void **state) {
    (void)state;
    const vh_device_ops *dev = vh_cpu_device_ops();
    vh_stream *s = NULL, *prev = (vh_stream *)1, *prev2 = NULL;
    assert_int_equal(dev->stream_create(dev->device, &s), VH_STATUS_OK);
    assert_non_null(s);
    assert_int_equal(dev->stream_set(dev->device, s, &prev), VH_STATUS_OK);
    assert_null(prev); /* the default stream */
    assert_int_equal(dev->stream_set(dev->device, NULL, &prev2), VH_STATUS_OK);
    assert_ptr_equal(prev2, s);
    vh_event *e = NULL;
    assert_int_equal(dev->event_create(dev->device, &e), VH_STATUS_OK);
    assert_int_equal(dev->event_record(dev->device, e, s), VH_STATUS_OK);
    assert_int_equal(dev->stream_wait_event(dev->device, NULL, e), VH_STATUS_OK);
    int done = 0;
    assert_int_equal(dev->event_query(dev->device, e, &done), VH_STATUS_OK);
    assert_int_equal(done, 1);
    assert_int_equal(dev->event_synchronize(dev->device, e), VH_STATUS_OK);
    assert_int_equal(dev->stream_synchronize(dev->device, s), VH_STATUS_OK);
    dev->event_destroy(dev->device, e);

    void *w1 = NULL, *w2 = NULL, *w3 = NULL;
    assert_int_equal(dev->workspace(dev->device, 1000, s, &w1), VH_STATUS_OK);
    assert_int_equal((uintptr_t)w1 % 64, 0);
    memset(w1, 0, 1000);
    assert_int_equal(dev->workspace(dev->device, 500, s, &w2), VH_STATUS_OK);
    assert_ptr_equal(w1, w2); /* big enough already */
    assert_int_equal(dev->workspace(dev->device, 1 << 20, s, &w3), VH_STATUS_OK);
    memset(w3, 0, 1 << 20);
    void *wd = NULL;
    assert_int_equal(dev->workspace(dev->device, 64, NULL, &wd), VH_STATUS_OK);
    assert_ptr_not_equal(wd, w3); /* the default stream has its own */
    dev->stream_destroy(dev->device, s);
}

static void test_comm_self(void **state) {
    (void)state;
    vh_comm c;
    vh_comm_self_init(&c);
    assert_int_equal(c.rank, 0);
    assert_int_equal(c.world_size, 1);
    assert_string_equal(c.backend, "self");
    assert_int_equal(c.local_rank, 0);
    assert_int_equal(c.local_size, 1);
    float buf[3] = {1, 2, 3}, out[3] = {0};
    assert_int_equal(vh_comm_all_reduce(&c, buf, 3, VH_DTYPE_F32, VH_REDUCE_OP_SUM), VH_STATUS_OK);
    assert_true(buf[0] == 1 && buf[2] == 3);
    assert_int_equal(vh_comm_all_reduce(&c, buf, 3, VH_DTYPE_F32, VH_REDUCE_OP_AVG), VH_STATUS_OK);
    assert_true(buf[1] == 2);
    assert_int_equal(vh_comm_all_gather(&c, buf, out, 3, VH_DTYPE_F32), VH_STATUS_OK);
    assert_true(out[1] == 2);
    memset(out, 0, sizeof out);
    assert_int_equal(vh_comm_reduce_scatter(&c, buf, out, 3, VH_DTYPE_F32, VH_REDUCE_OP_SUM),
                     VH_STATUS_OK);
    assert_true(out[2] == 3);
    assert_int_equal(vh_comm_broadcast(&c, buf, 3, VH_DTYPE_F32, 0), VH_STATUS_OK);
    assert_int_equal(vh_comm_broadcast(&c, buf, 3, VH_DTYPE_F32, 1), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(c.ops->barrier(&c), VH_STATUS_OK);

    /* Started, tested, then waited on: a self collective has finished at once. */
    vh_comm_request *req = NULL;
    memset(out, 0, sizeof out);
    assert_int_equal(c.ops->all_gather_start(&c, buf, out, 3, VH_DTYPE_F32, NULL, &req),
                     VH_STATUS_OK);
    int done = 0;
    assert_int_equal(c.ops->test(&c, req, &done), VH_STATUS_OK);
    assert_int_equal(done, 1);
    assert_int_equal(c.ops->wait(&c, req), VH_STATUS_OK);
    assert_true(out[0] == 1 && out[2] == 3);
    assert_int_equal(c.ops->wait(&c, NULL), VH_STATUS_OK);

    vh_comm *heap = NULL;
    vh_comm_open_args oa = {.struct_size = sizeof oa, .abi_major = VH_ABI_MAJOR};
    char err[64];
    assert_int_equal(vh_comm_self_open(&oa, &heap, err, sizeof err), VH_STATUS_OK);
    assert_string_equal(heap->backend, "self");
    vh_comm_self_close(heap);
}

/* A GPU-like device for the self communicator: its copy records what it was
 * asked and can fail, so the test sees that every copy goes through it. */
static struct {
    int calls, fail;
    vh_copy_kind kind;
    vh_stream *stream;
    size_t bytes;
} fake_copy_log;

static vh_status fake_copy(vh_device *dev, void *dst, const void *src, size_t bytes,
                           vh_copy_kind kind, vh_stream *stream) {
    (void)dev;
    fake_copy_log.calls++;
    fake_copy_log.kind = kind, fake_copy_log.stream = stream, fake_copy_log.bytes = bytes;
    if (fake_copy_log.fail) return VH_STATUS_ERR_DEVICE;
    memmove(dst, src, bytes);
    return VH_STATUS_OK;
}

static void test_comm_self_device(void **state) {
    (void)state;
    vh_device_ops gpu = {.struct_size = sizeof gpu, .kind = VH_DEVICE_KIND_CUDA, .copy = fake_copy};
    vh_comm c;
    vh_comm_self_init_device(&c, &gpu);
    assert_string_equal(c.backend, "self");
    assert_int_equal(c.world_size, 1);
    float buf[4] = {1, 2, 3, 4}, out[4] = {0};
    vh_stream *stream = (vh_stream *)(uintptr_t)0x10;
    vh_comm_request *req = NULL;
    memset(&fake_copy_log, 0, sizeof fake_copy_log);
    assert_int_equal(c.ops->all_gather_start(&c, buf, out, 4, VH_DTYPE_F32, stream, &req),
                     VH_STATUS_OK);
    assert_int_equal(c.ops->wait(&c, req), VH_STATUS_OK);
    assert_int_equal(fake_copy_log.calls, 1);
    assert_int_equal(fake_copy_log.kind, VH_COPY_KIND_DEVICE_TO_DEVICE);
    assert_ptr_equal(fake_copy_log.stream, stream);
    assert_int_equal(fake_copy_log.bytes, sizeof buf);
    assert_true(out[3] == 4);
    assert_int_equal(c.ops->reduce_scatter_start(&c, buf, out, 2, VH_DTYPE_BF16,
                                                 VH_REDUCE_OP_SUM, NULL, &req),
                     VH_STATUS_OK);
    assert_int_equal(fake_copy_log.calls, 2);
    assert_int_equal(fake_copy_log.bytes, 4);
    const size_t counts[1] = {4};
    assert_int_equal(c.ops->gather_start(&c, buf, 4, out, counts, VH_DTYPE_F32, 0, NULL, &req),
                     VH_STATUS_OK);
    assert_int_equal(fake_copy_log.calls, 3);
    /* In place (recv == send) and the all-reduce: nothing to copy. */
    assert_int_equal(c.ops->all_gather_start(&c, buf, buf, 4, VH_DTYPE_F32, NULL, &req),
                     VH_STATUS_OK);
    assert_int_equal(c.ops->all_reduce_start(&c, buf, 4, VH_DTYPE_F32, VH_REDUCE_OP_SUM, NULL,
                                             &req),
                     VH_STATUS_OK);
    assert_int_equal(fake_copy_log.calls, 3);
    /* The device's failure is the collective's. */
    fake_copy_log.fail = 1;
    assert_int_equal(c.ops->all_gather_start(&c, buf, out, 4, VH_DTYPE_F32, NULL, &req),
                     VH_STATUS_ERR_DEVICE);

    /* The CPU device (or none): host memmove, the device table untouched. */
    fake_copy_log.calls = 0, fake_copy_log.fail = 0;
    gpu.kind = VH_DEVICE_KIND_CPU;
    vh_comm_self_init_device(&c, &gpu);
    memset(out, 0, sizeof out);
    assert_int_equal(c.ops->all_gather_start(&c, buf, out, 4, VH_DTYPE_F32, NULL, &req),
                     VH_STATUS_OK);
    assert_int_equal(fake_copy_log.calls, 0);
    assert_true(out[0] == 1 && out[3] == 4);
    vh_comm_self_init_device(&c, NULL);
    assert_ptr_equal(c.impl, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_tensor_numel),
        cmocka_unit_test(test_f16_exact_values),
        cmocka_unit_test(test_f16_round_trip_all),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_cpu_device),
        cmocka_unit_test(test_cpu_convert_arrays),
        cmocka_unit_test(test_cpu_streams),
        cmocka_unit_test(test_comm_self),
        cmocka_unit_test(test_comm_self_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
