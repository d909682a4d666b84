/* test_sdk.c - the SDK runtime: names, dtype conversions, the CPU device
 * and the self communicator. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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
    dev->copy(dev->device, a, src, sizeof src, VH_COPY_KIND_HOST_TO_DEVICE);
    uint16_t half[10];
    float back[10];
    assert_int_equal(dev->convert(dev->device, half, VH_DTYPE_F16, a, VH_DTYPE_F32, 10), VH_STATUS_OK);
    assert_int_equal(dev->convert(dev->device, back, VH_DTYPE_F32, half, VH_DTYPE_F16, 10), VH_STATUS_OK);
    for (int i = 0; i < 10; i++) assert_true(back[i] == src[i]); /* exactly representable */
    assert_int_equal(dev->convert(dev->device, half, VH_DTYPE_BF16, a, VH_DTYPE_F32, 10), VH_STATUS_OK);
    assert_int_equal(half[2], vh_f32_to_bf16(src[2]));
    assert_int_equal(dev->convert(dev->device, back, VH_DTYPE_I32, a, VH_DTYPE_F32, 1),
                     VH_STATUS_ERR_UNSUPPORTED);
    dev->memset_zero(dev->device, a, 10 * sizeof(float));
    for (int i = 0; i < 10; i++) assert_true(a[i] == 0.0f);
    assert_int_equal(dev->synchronize(dev->device), VH_STATUS_OK);
    dev->free(dev->device, a);
}

static void test_comm_self(void **state) {
    (void)state;
    vh_comm c;
    vh_comm_self_init(&c);
    assert_int_equal(c.rank, 0);
    assert_int_equal(c.world_size, 1);
    assert_string_equal(c.backend, "self");
    float buf[3] = {1, 2, 3}, out[3] = {0};
    assert_int_equal(c.ops->all_reduce(&c, buf, 3, VH_DTYPE_F32, VH_REDUCE_OP_SUM), VH_STATUS_OK);
    assert_true(buf[0] == 1 && buf[2] == 3);
    assert_int_equal(c.ops->all_gather(&c, buf, out, 3, VH_DTYPE_F32), VH_STATUS_OK);
    assert_true(out[1] == 2);
    memset(out, 0, sizeof out);
    assert_int_equal(c.ops->reduce_scatter(&c, buf, out, 3, VH_DTYPE_F32, VH_REDUCE_OP_SUM), VH_STATUS_OK);
    assert_true(out[2] == 3);
    assert_int_equal(c.ops->broadcast(&c, buf, 3, VH_DTYPE_F32, 0), VH_STATUS_OK);
    assert_int_equal(c.ops->broadcast(&c, buf, 3, VH_DTYPE_F32, 1), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(c.ops->barrier(&c), VH_STATUS_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_tensor_numel),
        cmocka_unit_test(test_f16_exact_values),
        cmocka_unit_test(test_f16_round_trip_all),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_cpu_device),
        cmocka_unit_test(test_comm_self),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
