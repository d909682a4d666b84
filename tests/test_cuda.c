/* test_cuda.c - the CUDA device library, on a machine that has a GPU.
 *
 * Where the build has no CUDA library, or the machine no GPU or driver, it
 * prints one SKIPPED line and exits with VH_TEST_SKIP (77), which ctest
 * reports as skipped (SKIP_RETURN_CODE): CI machines have no GPU. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "vithost/vh_runtime.h"
#include "vithost/vithost.h"

static void *lib;
static vh_device_ops ops;

static void test_copy_and_convert(void **state) {
    (void)state;
    float src[1000], back[1000];
    for (int i = 0; i < 1000; i++) src[i] = (float)(i - 500) * 0.25f;
    void *d32 = NULL, *d16 = NULL;
    assert_int_equal(ops.alloc(ops.device, sizeof src, &d32), VH_STATUS_OK);
    assert_int_equal(ops.alloc(ops.device, 1000 * 2, &d16), VH_STATUS_OK);
    assert_int_equal(ops.copy(ops.device, d32, src, sizeof src, VH_COPY_KIND_HOST_TO_DEVICE, NULL), VH_STATUS_OK);
    assert_int_equal(ops.convert(ops.device, d16, VH_DTYPE_BF16, d32, VH_DTYPE_F32, 1000, NULL), VH_STATUS_OK);
    assert_int_equal(ops.memset_zero(ops.device, d32, sizeof src, NULL), VH_STATUS_OK);
    assert_int_equal(ops.convert(ops.device, d32, VH_DTYPE_F32, d16, VH_DTYPE_BF16, 1000, NULL), VH_STATUS_OK);
    assert_int_equal(ops.copy(ops.device, back, d32, sizeof back, VH_COPY_KIND_DEVICE_TO_HOST, NULL), VH_STATUS_OK);
    /* Same rounding as the CPU reference, element for element. */
    for (int i = 0; i < 1000; i++) assert_true(back[i] == vh_bf16_to_f32(vh_f32_to_bf16(src[i])));
    ops.free(ops.device, d32);
    ops.free(ops.device, d16);
}

/* ctest's SKIP_RETURN_CODE for this test (tests/CMakeLists.txt). */
#define VH_TEST_SKIP 77

int main(void) {
    char path[4200];
    snprintf(path, sizeof path, "%s/lib/libvh_cuda.so", VH_TEST_BUILD_DIR);
    if (access(path, F_OK) != 0) {
        printf("SKIPPED: test_cuda: this build has no CUDA device library (toolkit not found)\n");
        return VH_TEST_SKIP;
    }
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("SKIPPED: test_cuda: cannot load %s: %s\n", path, dlerror());
        return VH_TEST_SKIP;
    }
    vh_cuda_device_open_fn open_fn;
    *(void **)&open_fn = dlsym(lib, VH_CUDA_OPEN_SYMBOL);
    if (!open_fn) {
        fprintf(stderr, "%s does not export %s\n", path, VH_CUDA_OPEN_SYMBOL);
        return 1; /* a broken build, not a missing GPU */
    }
    char err[512];
    vh_cuda_open_args oa = {.struct_size = sizeof oa, .abi_major = VH_ABI_MAJOR,
                            .abi_minor = VH_ABI_MINOR, .ordinal = 0};
    if (open_fn(&oa, &ops, sizeof ops, err, sizeof err) != VH_STATUS_OK) {
        printf("SKIPPED: test_cuda: no usable GPU here (%s)\n", err);
        dlclose(lib);
        return VH_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_and_convert),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    dlclose(lib);
    return failed;
}
