/* test_gemm_choice.c - gemm_choice.c's decision, on timings the test writes.
 *
 * The choice between a 16-bit GEMM's paths is made once per process by
 * timing them, on machines shared with other jobs. A neighbour's burst that
 * slows every timed run of the faster path must not put a shape class on
 * the slower path for the whole process (it did: T2 under AMP took widen for
 * its 4160x768x192 data gradient, at half native's speed, in 2 of 8
 * processes). Here gemm_choice.c is compiled into the test with the CPU
 * declared to have bf16 kernels, and its timer is a script: each path's
 * time, the first `burst` calls of one path slowed 3x. The path that is
 * really faster must be chosen, in both directions (native faster, as with
 * AMX; widen faster, as on an Intel core with avx512_bf16 only), and for
 * native's two kernels; a clean race still gives the faster path.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dnnl_engine.h"
#include "vithost/vh_cpu_engine.h"

/* The two engine queries gemm_choice.c makes: a CPU with bf16 kernels. */
int vh_dnnl_isa_has(vh_dnnl_isa level) {
    (void)level;
    return 1;
}

const char *vh_dnnl_isa_name(void) { return "avx512_core_amx (test)"; }

/* The script: seconds per call of each path; the first `burst` calls of
 * path `slowed` take 3x. */
typedef struct script {
    double t[3]; /* by vh_gemm16_path */
    int slowed, burst;
    int calls[3];
} script;

static double scripted(void *ctx, int path, const vh_gemm16_shape *proxy) {
    (void)proxy;
    script *s = ctx;
    const int n = s->calls[path]++;
    return path == s->slowed && n < s->burst ? 3.0 * s->t[path] : s->t[path];
}

/* A shape class of its own per case (the classes are cached per process),
 * large enough to be timed: an unbatched layout, m x 1024 x 1024. */
static vh_gemm16_shape shape(int trans_a, int64_t m) {
    vh_gemm16_shape sh = {VH_DTYPE_BF16, trans_a, 0, 1, m, 1024, 1024, 0};
    return sh;
}

static int setup(void **state) {
    (void)state;
    setenv("VITHOST_CPU_GEMM16", "auto", 1);
    setenv("VITHOST_CPU_GEMM32", "auto", 1);
    vh_cpu_gemm16_reset();
    return 0;
}

/* An f32 shape: A^T.B (a weight gradient), or A.B with or without T * aux. */
static vh_gemm16_shape shape32(int trans_a, int mul_aux, int64_t m) {
    vh_gemm16_shape sh = {VH_DTYPE_F32, trans_a, 0, 1, m, 1024, 1024, mul_aux};
    return sh;
}

/* Native twice as fast; widen's runs clean. */
static void test_clean_race_takes_the_faster(void **state) {
    (void)state;
    script s = {.t = {2e-3, 1e-3, 1e-3}, .slowed = -1};
    vh_gemm16_shape sh = shape(0, 64);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &s), VH_GEMM16_NATIVE);
    script w = {.t = {1e-3, 2e-3, 2e-3}, .slowed = -1};
    sh = shape(0, 4096);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &w), VH_GEMM16_WIDEN);
    /* decided once: the class keeps its path whatever the timer says now */
    script other = {.t = {1e-3, 9e-3, 9e-3}, .slowed = -1};
    sh = shape(0, 4096);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &other), VH_GEMM16_WIDEN);
    assert_int_equal(other.calls[VH_GEMM16_WIDEN] + other.calls[VH_GEMM16_NATIVE], 0);
}

/* Path `faster` twice as fast as the others, but its first 1 .. `bursts`
 * calls slowed 3x (the warm-up included): the class must still take it. */
static void check_bursts(vh_gemm16_path faster, int bursts) {
    for (int burst = 1; burst <= bursts; burst++) {
        vh_cpu_gemm16_reset();
        script s = {.t = {2e-3, 2e-3, 2e-3}, .slowed = faster, .burst = burst};
        s.t[faster] = 1e-3;
        vh_gemm16_shape sh = shape(0, 64);
        const vh_gemm16_path got = vh_gemm16_choose(&sh, scripted, &s);
        if (got != faster)
            fail_msg("path %d 2x faster, its first %d runs slowed: path %d chosen", faster,
                     burst, got);
    }
}

/* Native faster, every run of its first race slowed: widen wins that race,
 * the second race shows native. */
static void test_burst_on_native_keeps_native(void **state) {
    (void)state;
    check_bursts(VH_GEMM16_NATIVE, 5);
}

/* Widen faster (avx512_bf16 without AMX), its first runs slowed: the rest
 * of the race shows it. */
static void test_burst_on_widen_keeps_widen(void **state) {
    (void)state;
    check_bursts(VH_GEMM16_WIDEN, 3);
}

/* An unbatched A^T.B class on native also races the kernels: the default
 * kernel faster, its first race slowed; and the gemm kernel faster. */
static void test_kernel_race(void **state) {
    (void)state;
    for (int burst = 0; burst <= 5; burst++) {
        vh_cpu_gemm16_reset();
        /* native's race against widen (9x slower) takes native's first 5 calls
         * (a warm-up and 4 timed); the burst reaches past them into the
         * kernels' race by `burst` calls */
        script s = {.t = {9e-3, 1e-3, 1.5e-3}, .slowed = VH_GEMM16_NATIVE,
                    .burst = burst ? 5 + burst : 0};
        vh_gemm16_shape sh = shape(1, 64);
        if (vh_gemm16_choose(&sh, scripted, &s) != VH_GEMM16_NATIVE)
            fail_msg("default kernel faster, its kernel-race runs slowed (%d): gemm chosen",
                     burst);
    }
    vh_cpu_gemm16_reset();
    script g = {.t = {9e-3, 1.5e-3, 1e-3}, .slowed = -1};
    vh_gemm16_shape sh = shape(1, 64);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &g), VH_GEMM16_NATIVE_GEMM);
}

/* f32: the weight gradients and T * aux race the two kernels (widen is not
 * a path: never timed); a plain A.B runs the default untimed; the
 * confirming race as for bf16, the margin 2% (bf16's 5%); VITHOST_CPU_GEMM32
 * forces the raced classes only. */
static void test_f32_kernels(void **state) {
    (void)state;
    script g = {.t = {9e-3, 1.5e-3, 1e-3}, .slowed = -1};
    vh_gemm16_shape sh = shape32(1, 0, 64);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &g), VH_GEMM16_NATIVE_GEMM);
    assert_int_equal(g.calls[VH_GEMM16_WIDEN], 0);
    sh = shape32(0, 1, 64);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &g), VH_GEMM16_NATIVE_GEMM);
    script d = {.t = {9e-3, 1e-3, 1.5e-3}, .slowed = -1};
    sh = shape32(1, 0, 4096);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &d), VH_GEMM16_NATIVE);
    script near = {.t = {9e-3, 1e-3, 0.99e-3}, .slowed = -1}; /* 1%: under f32's 2% margin */
    sh = shape32(1, 0, 1 << 14);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &near), VH_GEMM16_NATIVE);
    /* 3%: over f32's margin, under bf16's 5% (an A^T.B class on native) */
    script three = {.t = {9e-3, 1e-3, 0.97e-3}, .slowed = -1};
    sh = shape32(1, 0, 1 << 16); /* a class of its own: 4x the work of the one above */
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &three), VH_GEMM16_NATIVE_GEMM);
    script three16 = {.t = {9e-3, 1e-3, 0.97e-3}, .slowed = -1};
    vh_gemm16_shape sh16 = shape(1, 1 << 16);
    assert_int_equal(vh_gemm16_choose(&sh16, scripted, &three16), VH_GEMM16_NATIVE);
    script plain = {.t = {9e-3, 9e-3, 1e-3}, .slowed = -1};
    sh = shape32(0, 0, 64);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &plain), VH_GEMM16_NATIVE);
    assert_int_equal(plain.calls[0] + plain.calls[1] + plain.calls[2], 0);
    /* the lines say what was timed */
    static char line[256], classes[4096];
    assert_non_null(strstr(vh_cpu_gemm16_summary(VH_DTYPE_F32, line, sizeof line),
                           "gemm kernel on 3 of 5 timed shape classes"));
    vh_cpu_gemm16_classes(classes, sizeof classes);
    assert_non_null(strstr(classes, "f32 A.B     *aux single "));
    assert_non_null(strstr(classes, "gemm kernel (kernels: default 1.500 ms, gemm 1.000 ms"));

    setenv("VITHOST_CPU_GEMM32", "default", 1);
    vh_cpu_gemm16_reset();
    sh = shape32(1, 0, 64);
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &g), VH_GEMM16_NATIVE);
    setenv("VITHOST_CPU_GEMM32", "gemm", 1);
    vh_cpu_gemm16_reset();
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &d), VH_GEMM16_NATIVE_GEMM);
    sh = shape32(0, 0, 64); /* not a raced class: the default, forced or not */
    assert_int_equal(vh_gemm16_choose(&sh, scripted, &g), VH_GEMM16_NATIVE);
    setenv("VITHOST_CPU_GEMM32", "fast", 1);
    vh_cpu_gemm16_reset();
    assert_non_null(strstr(vh_cpu_gemm16_summary(VH_DTYPE_F32, line, sizeof line),
                           "VITHOST_CPU_GEMM32=fast ignored"));
}

/* The choices saved with a checkpoint come back in another process (here:
 * after a reset) without a timing, overriding what that process decided;
 * lines it does not know are skipped. */
static void test_choices_saved_and_loaded(void **state) {
    (void)state;
    script g = {.t = {9e-3, 1.5e-3, 1e-3}, .slowed = -1};
    script w = {.t = {1e-3, 2e-3, 2e-3}, .slowed = -1};
    vh_gemm16_shape f32_dw = shape32(1, 0, 64), bf16_big = shape(0, 4096);
    assert_int_equal(vh_gemm16_choose(&f32_dw, scripted, &g), VH_GEMM16_NATIVE_GEMM);
    assert_int_equal(vh_gemm16_choose(&bf16_big, scripted, &w), VH_GEMM16_WIDEN);
    static char saved[4096];
    vh_cpu_gemm_choices_save(saved, sizeof saved);

    vh_cpu_gemm16_reset();
    script other = {.t = {1e-3, 1e-3, 9e-3}, .slowed = -1}; /* would choose the opposite */
    assert_int_equal(vh_gemm16_choose(&f32_dw, scripted, &other), VH_GEMM16_NATIVE);
    static char text[4200];
    snprintf(text, sizeof text, "gemm-choice nonsense\n%sgemm-choice 99 0 0 0 1 0 1 0", saved);
    assert_int_equal(vh_cpu_gemm_choices_load(text), 2);
    memset(other.calls, 0, sizeof other.calls);
    assert_int_equal(vh_gemm16_choose(&f32_dw, scripted, &other), VH_GEMM16_NATIVE_GEMM);
    assert_int_equal(vh_gemm16_choose(&bf16_big, scripted, &other), VH_GEMM16_WIDEN);
    assert_int_equal(other.calls[0] + other.calls[1] + other.calls[2], 0);
    static char classes[4096];
    vh_cpu_gemm16_classes(classes, sizeof classes);
    assert_non_null(strstr(classes, "as the run chose it before its checkpoint"));
    static char line[256];
    assert_non_null(strstr(vh_cpu_gemm16_summary(VH_DTYPE_F32, line, sizeof line),
                           "1 shape class as the checkpoint chose them"));
    assert_non_null(strstr(vh_cpu_gemm16_summary(VH_DTYPE_BF16, line, sizeof line),
                           "1 shape class as the checkpoint chose them"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_clean_race_takes_the_faster, setup),
        cmocka_unit_test_setup(test_burst_on_native_keeps_native, setup),
        cmocka_unit_test_setup(test_burst_on_widen_keeps_widen, setup),
        cmocka_unit_test_setup(test_kernel_race, setup),
        cmocka_unit_test_setup(test_f32_kernels, setup),
        cmocka_unit_test_setup(test_choices_saved_and_loaded, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
