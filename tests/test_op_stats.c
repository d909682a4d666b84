/* test_op_stats.c - the timing layer over the device ops (op_stats.h): on a
 * fake device table it counts calls only while counting, passes the device,
 * the arguments and the status through unchanged, adds a GEMM's FLOPs,
 * leaves what it does not time and what the device lacks as they were, and
 * puts the table back; `vithost bench --ops --json` has an "ops" object
 * whose GEMMs were called and whose total fits in the step. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "op_stats.h"

/* ---- a fake device: each op records what it got and returns `answer` ---- */

static vh_device *seen_dev;
static const void *seen_args;
static vh_status answer;
static int fake_calls;

static vh_status fake_gemm(vh_device *dev, const vh_gemm_args *a) {
    seen_dev = dev, seen_args = a, fake_calls++;
    return answer;
}
static vh_status fake_ln(vh_device *dev, const vh_layernorm_args *a) {
    seen_dev = dev, seen_args = a, fake_calls++;
    return answer;
}
static vh_status fake_convert(vh_device *dev, void *dst, vh_dtype dt, const void *src,
                              vh_dtype st, size_t n, vh_stream *stream) {
    (void)dt, (void)st, (void)stream;
    seen_dev = dev, seen_args = src, fake_calls++;
    memset(dst, 0x5A, n);
    return answer;
}
static vh_status fake_alloc(vh_device *dev, size_t bytes, void **out) {
    (void)dev, (void)bytes, (void)out;
    return VH_STATUS_ERR_NOMEM;
}
static vh_status fake_sync(vh_device *dev) {
    (void)dev;
    return VH_STATUS_OK;
}

static int fake_state;
/* no drop_path_scale, no attention: those must stay NULL */
static const vh_device_ops fake_ops = {
    .struct_size = sizeof(vh_device_ops), .kind = VH_DEVICE_KIND_CPU, .name = "fake",
    .device = (vh_device *)&fake_state, .alloc = fake_alloc, .synchronize = fake_sync,
    .convert = fake_convert, .gemm = fake_gemm, .layernorm_forward = fake_ln};

static int entry_of(const char *name) {
    for (int i = 0; i < op_stats_entry_count; i++)
        if (!strcmp(op_stats_entries[i].name, name)) return i;
    fail_msg("no entry %s", name);
    return -1;
}

static void test_wrapper_passes_through_and_counts(void **state) {
    (void)state;
    const vh_device_ops *dev = &fake_ops;
    vh_op_stats stats, other;
    assert_int_equal(op_stats_install(&stats, &dev), VH_STATUS_OK);
    assert_ptr_equal(dev, &stats.ops);
    assert_int_equal(op_stats_install(&other, &dev), VH_STATUS_ERR_INVALID_ARG);
    /* untimed calls are the device's own; missing ops stay missing */
    assert_true(dev->alloc == fake_alloc);
    assert_ptr_equal(dev->device, fake_ops.device);
    assert_null(dev->drop_path_scale);
    assert_null(dev->attention_forward);
    assert_true(dev->gemm != fake_gemm);

    vh_gemm_args g = {.struct_size = sizeof g, .m = 4, .n = 5, .k = 6, .batch = 3};
    answer = VH_STATUS_OK;
    fake_calls = 0;
    assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK); /* not counting yet */
    op_stats_start(&stats);
    for (int i = 0; i < 3; i++) {
        seen_dev = NULL, seen_args = NULL;
        assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK);
        assert_ptr_equal(seen_dev, fake_ops.device);
        assert_ptr_equal(seen_args, &g);
    }
    answer = VH_STATUS_ERR_UNSUPPORTED;
    vh_layernorm_args ln = {.struct_size = sizeof ln};
    assert_int_equal(dev->layernorm_forward(dev->device, &ln), VH_STATUS_ERR_UNSUPPORTED);
    assert_ptr_equal(seen_args, &ln);
    float src = 1.0f;
    unsigned char dst[4] = {0};
    assert_int_equal(dev->convert(dev->device, dst, VH_DTYPE_BF16, &src, VH_DTYPE_F32, 4, NULL),
                     VH_STATUS_ERR_UNSUPPORTED);
    assert_ptr_equal(seen_args, &src);
    assert_int_equal(dst[3], 0x5A);
    op_stats_stop(&stats);
    answer = VH_STATUS_OK;
    assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK); /* stopped: not counted */
    assert_int_equal(fake_calls, 7);

    int gi = entry_of("gemm");
    assert_int_equal(stats.stat[gi].calls, 3);
    assert_true(stats.stat[gi].seconds >= 0.0);
    assert_true(fabs(stats.stat[gi].flops - 3 * 2.0 * 4 * 5 * 6 * 3) < 1e-9);
    assert_int_equal(stats.stat[entry_of("layernorm_forward")].calls, 1);
    assert_int_equal(stats.stat[entry_of("convert")].calls, 1);
    assert_int_equal(stats.stat[entry_of("add")].calls, 0);
    /* all three calls were one shape: one row, with the op's figures */
    assert_int_equal(stats.gemm_shapes, 1);
    assert_int_equal(stats.gemm_shape[0].stat.calls, 3);
    assert_int_equal(stats.gemm_shape[0].batch, 3);
    assert_true(fabs(stats.gemm_shape[0].stat.flops - stats.stat[gi].flops) < 1e-9);

    op_stats_uninstall(&stats, &dev);
    assert_ptr_equal(dev, &fake_ops);
    assert_int_equal(op_stats_install(&other, &dev), VH_STATUS_OK); /* free again */
    op_stats_uninstall(&other, &dev);
}

/* Calls that differ in anything but their pointers are separate shapes;
 * past the table's size a shape is counted in the op only. */
static void test_gemm_shapes(void **state) {
    (void)state;
    const vh_device_ops *dev = &fake_ops;
    vh_op_stats stats;
    assert_int_equal(op_stats_install(&stats, &dev), VH_STATUS_OK);
    op_stats_start(&stats);
    answer = VH_STATUS_OK;
    float x[2];
    vh_gemm_args g = {.struct_size = sizeof g, .m = 8, .n = 4, .k = 2, .ab_dtype = VH_DTYPE_BF16,
                      .c_dtype = VH_DTYPE_F32};
    assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK);
    g.a = x; /* same shape, other operands */
    assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK);
    g.trans_a = 1; /* another */
    assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK);
    g.trans_a = 0, g.bias = x; /* and another */
    assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK);
    assert_int_equal(stats.gemm_shapes, 3);
    assert_int_equal(stats.gemm_shape[0].stat.calls, 2);
    assert_int_equal(stats.gemm_shape[1].trans_a, 1);
    assert_int_equal(stats.gemm_shape[2].bias, 1);
    for (int i = 0; i < VH_OP_STATS_GEMM_SHAPES + 5; i++) {
        g.m = 100 + i;
        assert_int_equal(dev->gemm(dev->device, &g), VH_STATUS_OK);
    }
    assert_int_equal(stats.gemm_shapes, VH_OP_STATS_GEMM_SHAPES);
    assert_int_equal(stats.stat[entry_of("gemm")].calls, 4 + VH_OP_STATS_GEMM_SHAPES + 5);
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    stats.steps = 1, stats.step_seconds = 1.0;
    op_stats_print(&stats, f); /* the slowest ten: which ones is the clock's to say */
    fclose(f);
    if (!strstr(text, "the 10 slowest of 48+")) fail_msg("no shapes heading in:\n%s", text);
    free(text);
    f = open_memstream(&text, &size);
    op_stats_print_json(&stats, f); /* all of them */
    fclose(f);
    if (!strstr(text, "\"8x4x2 bf16->f32 A.B\"") || !strstr(text, "\"8x4x2 bf16->f32 A^T.B\"") ||
        !strstr(text, "\"8x4x2 bf16->f32 A.B +bias\""))
        fail_msg("shapes missing from:\n%s", text);
    free(text);
    op_stats_uninstall(&stats, &dev);
}

static void test_entries_are_distinct(void **state) {
    (void)state;
    for (int i = 0; i < op_stats_entry_count; i++) {
        assert_non_null(op_stats_entries[i].trampoline);
        for (int j = 0; j < i; j++) {
            assert_true(op_stats_entries[i].offset != op_stats_entries[j].offset);
            assert_string_not_equal(op_stats_entries[i].name, op_stats_entries[j].name);
        }
    }
}

/* ---- the command ------------------------------------------------------------ */

static void test_bench_ops(void **state) {
    (void)state;
    char dir[256];
    assert_int_equal(harness_mkdtemp(dir, sizeof dir, "opstats"), 0);
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    assert_int_equal(harness_write(dir, "tiny.yaml", harness_tiny_vit), 0);
    int rc = harness_sh(dir, VH_TEST_VITHOST " bench tiny.yaml --ops --steps 2 --json");
    char *out = harness_read(dir, "out"), *err = harness_read(dir, "err");
    if (rc != 0) fail_msg("exit %d: %s%s", rc, out, err);
    const char *ops = strstr(out, "\"ops\": {");
    if (!ops) fail_msg("no ops object: %s", out);
    const char *gemm = strstr(ops, "\"gemm\": {");
    if (!gemm) fail_msg("no gemm in: %s", ops);
    assert_true(harness_json_number(gemm, "calls_per_step") > 0);
    assert_true(harness_json_number(gemm, "gflop_per_s") > 0);
    const char *shapes = strstr(ops, "\"gemm_shapes\": [{\"shape\": \"");
    if (!shapes) fail_msg("no gemm_shapes in: %s", ops);
    assert_true(harness_json_number(shapes, "ms_per_step") > 0);
    double total = harness_json_number(ops, "total_ms"), step = harness_json_number(ops, "step_ms");
    if (!(total > 0 && total <= step)) fail_msg("ops %g ms, step %g ms", total, step);
    free(out);
    free(err);
    /* the lines end with the table; without --ops there is none */
    assert_int_equal(harness_sh(dir, VH_TEST_VITHOST " bench tiny.yaml --ops --steps 2"), 0);
    out = harness_read(dir, "out");
    assert_non_null(strstr(out, "not in an op (host, data, comm)"));
    free(out);
    assert_int_equal(harness_sh(dir, VH_TEST_VITHOST " bench tiny.yaml --steps 2 --json"), 0);
    out = harness_read(dir, "out");
    assert_null(strstr(out, "\"ops\""));
    free(out);
    harness_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrapper_passes_through_and_counts),
        cmocka_unit_test(test_gemm_shapes),
        cmocka_unit_test(test_entries_are_distinct),
        cmocka_unit_test(test_bench_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
