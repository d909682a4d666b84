/* test_gemm16.c - the paths of a GEMM with bf16 operands (gemm_choice.c):
 * native bf16 kernels (oneDNN's default one, and its gemm kernel) and
 * widening to f32, forced in turn by VITHOST_CPU_GEMM16 (re-read through
 * vh_cpu_gemm16_reset), then auto.
 *
 * Each path must give the fp32-accumulated product of the stored bf16 values:
 * products exact, sums in f32. The bound per element is the classic one for
 * a k-term f32 sum, |got - ref| <= k 2^-24 sum_l |a_il b_lj| (in double, from
 * the stored values); a path that rounded products or partial sums to bf16
 * would be about 2^-9 off and fail by orders of magnitude. The two paths
 * must agree within twice that. Where the CPU has no bf16 kernels (checked at
 * run time through the engine extension; ctest also runs this binary with
 * ONEDNN_MAX_CPU_ISA=AVX2) native falls back to widen, which the summary
 * says and the test prints: not a failure.
 *
 * Also the race of the f32 GEMMs' two oneDNN kernels on real timings, its
 * operands at guard pages (test_f32_race_flushes_its_operands; the bf16
 * races' B too, test_bf16_race_flushes_b), and B
 * packed once for a GEMM's bands of rows against B given plain to each
 * band: the same bits (test_bands_pack_b); fp32 fc1's aux streamed out of
 * the bands against stored, the same (test_bands_stream_aux), and streamed
 * only while the device's tensors outgrow the L3
 * (test_stream_follows_tensor_bytes); and B packed
 * first for one call of many rows, the same (test_single_pack_b).
 */
#define _DEFAULT_SOURCE /* POSIX 2008 and MAP_ANONYMOUS */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "vithost/vh_cpu_engine.h"
#include "vithost/vh_runtime.h"

static const vh_device_ops *ops;
static int hw_bf16;

typedef struct shape {
    int trans_a, trans_b;
    int64_t batch, m, n, k;
} shape;

/* The ViT's layouts (linear forward B^T, data gradient, weight gradient A^T,
 * batched attention), odd sizes, and two large enough for auto to time. */
static const shape kShapes[] = {
    {0, 1, 1, 197, 96, 64}, {0, 0, 1, 130, 64, 192}, {1, 0, 1, 64, 48, 300},
    {0, 1, 4, 50, 50, 16},  {0, 0, 3, 50, 16, 50},   {1, 1, 1, 33, 17, 40},
    {0, 1, 1, 512, 256, 256}, {1, 0, 1, 256, 128, 1024},
    {0, 1, 1, 1040, 64, 1040}, /* B packed first (m >= k), k long enough for other sums */
};
#define NSHAPES (sizeof kShapes / sizeof kShapes[0])

static uint64_t rng_state = 12345;

static double rnd(void) { /* splitmix64, uniform in [-1, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-52 - 1.0;
}

typedef struct problem {
    shape s;
    uint16_t *a, *b; /* bf16, stored as op(X) transposed when trans */
    double *ref, *bound;
} problem;

static int64_t lda_of(const shape *s) { return s->trans_a ? s->m : s->k; }
static int64_t ldb_of(const shape *s) { return s->trans_b ? s->k : s->n; }

static double a_at(const problem *p, int64_t q, int64_t i, int64_t l) {
    const shape *s = &p->s;
    const int64_t idx = q * s->m * s->k + (s->trans_a ? l * s->m + i : i * s->k + l);
    return vh_bf16_to_f32(p->a[idx]);
}

static double b_at(const problem *p, int64_t q, int64_t l, int64_t j) {
    const shape *s = &p->s;
    const int64_t idx = q * s->k * s->n + (s->trans_b ? j * s->k + l : l * s->n + j);
    return vh_bf16_to_f32(p->b[idx]);
}

static problem make(const shape *s) {
    problem p = {.s = *s};
    const int64_t na = s->batch * s->m * s->k, nb = s->batch * s->k * s->n;
    const int64_t nc = s->batch * s->m * s->n;
    p.a = malloc((size_t)na * 2), p.b = malloc((size_t)nb * 2);
    p.ref = malloc((size_t)nc * sizeof(double)), p.bound = malloc((size_t)nc * sizeof(double));
    assert_true(p.a && p.b && p.ref && p.bound);
    for (int64_t i = 0; i < na; i++) p.a[i] = vh_f32_to_bf16((float)(4.0 * rnd()));
    for (int64_t i = 0; i < nb; i++) p.b[i] = vh_f32_to_bf16((float)rnd());
    for (int64_t q = 0; q < s->batch; q++)
        for (int64_t i = 0; i < s->m; i++)
            for (int64_t j = 0; j < s->n; j++) {
                double sum = 0, mag = 0;
                for (int64_t l = 0; l < s->k; l++) {
                    const double t = a_at(&p, q, i, l) * b_at(&p, q, l, j);
                    sum += t, mag += fabs(t);
                }
                const int64_t c = (q * s->m + i) * s->n + j;
                p.ref[c] = sum;
                p.bound[c] = (double)s->k * 0x1p-24 * mag + 1e-30;
            }
    return p;
}

static void unmake(problem *p) { free(p->a), free(p->b), free(p->ref), free(p->bound); }

/* C = A B through the device, f32 out. */
static float *run_gemm(const problem *p) {
    const shape *s = &p->s;
    float *c = calloc((size_t)(s->batch * s->m * s->n), sizeof(float));
    assert_non_null(c);
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = s->trans_a, .trans_b = s->trans_b,
                      .m = s->m, .n = s->n, .k = s->k, .alpha = 1.0f, .a = p->a,
                      .lda = lda_of(s), .b = p->b, .ldb = ldb_of(s), .c = c, .ldc = s->n,
                      .batch = s->batch, .stride_a = s->m * s->k, .stride_b = s->k * s->n,
                      .stride_c = s->m * s->n, .ab_dtype = VH_DTYPE_BF16,
                      .c_dtype = VH_DTYPE_F32};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    return c;
}

/* Every element within `scale` times its bound of the reference. */
static void check_close(const problem *p, const float *got, const double *want, double scale,
                        const char *what) {
    const shape *s = &p->s;
    for (int64_t c = 0; c < s->batch * s->m * s->n; c++) {
        if (fabs((double)got[c] - want[c]) <= scale * p->bound[c]) continue;
        fail_msg("%s: %lldx%lldx%lldx%lld (trans %d%d) element %lld: %.9g vs %.9g, bound %.3g",
                 what, (long long)s->batch, (long long)s->m, (long long)s->n, (long long)s->k,
                 s->trans_a, s->trans_b, (long long)c, got[c], want[c], scale * p->bound[c]);
    }
}

static void set_mode(const char *v) {
    assert_int_equal(setenv("VITHOST_CPU_GEMM16", v, 1), 0);
    vh_cpu_gemm16_reset();
}

static const char *summary(void) {
    static char line[256];
    return vh_cpu_gemm16_summary(VH_DTYPE_BF16, line, sizeof line);
}

/* Each forced path against the reference, then the two against each other. */
static void test_forced_paths(void **state) {
    (void)state;
    for (size_t i = 0; i < NSHAPES; i++) {
        problem p = make(&kShapes[i]);
        set_mode("native");
        float *native = run_gemm(&p);
        const char *line = summary();
        if (hw_bf16) {
            assert_non_null(strstr(line, "native (VITHOST_CPU_GEMM16=native)"));
        } else {
            assert_non_null(strstr(line, "widen to f32"));
            assert_non_null(strstr(line, "native not possible"));
            if (i == 0) printf("test_gemm16: no bf16 kernels on this CPU: native widens (%s)\n", line);
        }
        check_close(&p, native, p.ref, 1.0, "native");
        set_mode("native_gemm"); /* oneDNN's gemm kernel on the same operands */
        float *on_gemm = run_gemm(&p);
        assert_non_null(strstr(summary(), hw_bf16 ? "native on oneDNN's gemm kernel "
                                                    "(VITHOST_CPU_GEMM16=native_gemm)"
                                                  : "native_gemm not possible"));
        check_close(&p, on_gemm, p.ref, 1.0, "native_gemm");
        set_mode("widen");
        float *widen = run_gemm(&p);
        assert_non_null(strstr(summary(), "widen to f32"));
        check_close(&p, widen, p.ref, 1.0, "widen");
        double *as_double = malloc((size_t)(p.s.batch * p.s.m * p.s.n) * sizeof(double));
        assert_non_null(as_double);
        for (int64_t c = 0; c < p.s.batch * p.s.m * p.s.n; c++) as_double[c] = native[c];
        check_close(&p, widen, as_double, 2.0, "native vs widen");
        check_close(&p, on_gemm, as_double, 2.0, "native vs native_gemm");
        free(as_double), free(native), free(widen), free(on_gemm);
        unmake(&p);
    }
}

static int count_of(const char *line, const char *what) {
    const char *at = strstr(line, what);
    return at ? atoi(at + strlen(what)) : -1;
}

/* auto decides each class once and says what it chose. */
static void test_auto(void **state) {
    (void)state;
    set_mode("auto");
    assert_non_null(strstr(summary(), hw_bf16 ? "at its first GEMM" : "widen to f32"));
    for (size_t i = 0; i < NSHAPES; i++) {
        problem p = make(&kShapes[i]);
        float *c = run_gemm(&p);
        check_close(&p, c, p.ref, 1.0, "auto");
        free(c);
        unmake(&p);
    }
    const char *line = summary();
    printf("test_gemm16: %s\n", line);
    if (!hw_bf16) return;
    const int native = count_of(line, "native on "), widen = count_of(line, "widen on ");
    assert_true(native >= 0 && widen >= 0);
    static char classes[4096];
    vh_cpu_gemm16_classes(classes, sizeof classes);
    printf("%s", classes);
    int lines = 0;
    for (const char *q = classes; (q = strchr(q, '\n')); q++) lines++;
    assert_int_equal(lines, native + widen);
    assert_true(lines >= 5 && lines <= (int)NSHAPES); /* layouts and sizes; some share */
    assert_non_null(strstr(classes, "ms")); /* the large shapes were timed */
    /* A timed unbatched A^T.B class on the native kernels also compared oneDNN's two
     * kernels (256x128x1024 is one, unless widen won it), and says so on its line. */
    int kernel_lines = 0;
    for (const char *q = classes; *q;) {
        const char *end = strchr(q, '\n');
        const size_t len = end ? (size_t)(end - q) : strlen(q);
        char one[512];
        snprintf(one, sizeof one, "%.*s", (int)len, q);
        if (strstr(one, "A^T.B ") && strstr(one, "single") && strstr(one, ": native") &&
            !strstr(one, "not timed")) {
            assert_non_null(strstr(one, "kernels: default"));
            kernel_lines++;
        }
        q += len + (end ? 1 : 0);
    }
    printf("test_gemm16: %d A^T.B class(es) compared the two native kernels\n", kernel_lines);
}

/* AMP's fc1: C = bf16(gelu(T)) and aux = bf16(T), T = A W^T + bias in fp32,
 * both dense. On the native kernels gemm.c runs it in bands of at most 128
 * rows, one thread each (run_bands): 300 rows are two full bands and
 * a short one, 100 rows one band. Each output within its rounding to bf16
 * (2^-8 relative) of the reference, and nothing written past the tensors. */
static void check_fc1(int64_t m, const char *mode) {
    const shape sh = {0, 1, 1, m, 96, 64};
    problem p = make(&sh);
    const int64_t n = sh.n, guard = 32;
    uint16_t *bias = malloc((size_t)n * 2), *out = malloc((size_t)(m * n + guard) * 2);
    uint16_t *pre = malloc((size_t)(m * n + guard) * 2);
    assert_true(bias && out && pre);
    for (int64_t j = 0; j < n; j++) bias[j] = vh_f32_to_bf16((float)rnd());
    for (int64_t i = 0; i < m * n + guard; i++) out[i] = pre[i] = 0xabcd;
    set_mode(mode);
    vh_gemm_args g = {.struct_size = sizeof g, .trans_b = 1, .m = m, .n = n, .k = sh.k,
                      .alpha = 1.0f, .a = p.a, .lda = sh.k, .b = p.b, .ldb = sh.k, .c = out,
                      .ldc = n, .bias = bias, .ab_dtype = VH_DTYPE_BF16,
                      .c_dtype = VH_DTYPE_BF16, .bias_dtype = VH_DTYPE_BF16,
                      .epilogue = VH_EPILOGUE_GELU, .aux = pre};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const int64_t c = i * n + j;
            const double b = vh_bf16_to_f32(bias[j]), t = p.ref[c] + b;
            const double tb = p.bound[c] + 0x1p-24 * (fabs(p.ref[c]) + fabs(b));
            const double gelu = 0.5 * t * erfc(-t / sqrt(2.0));
            const double got_t = vh_bf16_to_f32(pre[c]), got = vh_bf16_to_f32(out[c]);
            if (fabs(got_t - t) > 0x1p-8 * fabs(t) + tb ||
                fabs(got - gelu) > 0x1p-8 * fabs(gelu) + 1.2 * tb + 1e-6)
                fail_msg("fc1 %lldx%lldx%lld (%s): row %lld column %lld: T %.6g gelu %.6g, "
                         "want %.6g and %.6g", (long long)m, (long long)n, (long long)sh.k, mode,
                         (long long)i, (long long)j, got_t, got, t, gelu);
        }
    for (int64_t i = m * n; i < m * n + guard; i++)
        if (out[i] != 0xabcd || pre[i] != 0xabcd)
            fail_msg("fc1 %lld rows (%s): written past the tensors", (long long)m, mode);
    free(bias), free(out), free(pre);
    unmake(&p);
}

static void test_fc1_gelu(void **state) {
    (void)state;
    const char *modes[] = {"native", "auto", "widen"};
    for (int i = 0; i < 3; i++) {
        check_fc1(300, modes[i]);
        check_fc1(100, modes[i]);
    }
    if (!hw_bf16) printf("test_gemm16: no bf16 kernels: fc1's bands (native only) not run\n");
    set_mode("auto");
}

/* The count after `key` in vh_cpu_gemm_bands_summary's line, 0 if absent. */
static unsigned long long packing_count(const char *key) {
    char line[512];
    vh_cpu_gemm_bands_summary(line, sizeof line);
    const char *p = strstr(line, key);
    return p ? strtoull(p + strlen(key), NULL, 10) : 0;
}

/* Band calls so far whose B was packed once for all bands. */
static unsigned long long bands_packed(void) { return packing_count("packed once for "); }

/* x at `at`, as f32 or rounded to bf16. */
static void store_value(char *at, int f32, float x) {
    if (f32) {
        memcpy(at, &x, 4);
    } else {
        const uint16_t h = vh_f32_to_bf16(x);
        memcpy(at, &h, 2);
    }
}

/* The call with the engine's defaults (route NULL), or with the route the
 * variable `route` names set to `value` ("0": off). */
static void gemm_with_route(const vh_gemm_args *g, const char *route, const char *value) {
    if (route) setenv(route, value, 1);
    assert_int_equal(ops->gemm(ops->device, g), VH_STATUS_OK);
    if (route) unsetenv(route);
}

/* The call with B packed (pack 1) or not (VITHOST_CPU_PACK_B=0). */
static void gemm_packed_or_not(const vh_gemm_args *g, int pack) {
    gemm_with_route(g, pack ? NULL : "VITHOST_CPU_PACK_B", "0");
}

/* The three kinds of calls gemm.c runs in bands of rows, 300 rows (two
 * bands of 128 and one of 44) of n 96, k 64. */
typedef enum band_kind {
    BAND_FC1_BF16,    /* AMP's fc1: C = bf16(gelu(T)), aux = bf16(T), B transposed */
    BAND_FC2_DX_BF16, /* AMP's fc2 data gradient: C = bf16(gelu'(aux) T), B plain */
    BAND_FC1_F32,     /* fp32's fc1: C = gelu(T), aux = gelu'(T), B transposed */
} band_kind;

/* C and aux (written, or read by BAND_FC2_DX_BF16) of one call, with the
 * engine's defaults (route NULL) or with the variable `route` set to
 * `value` (VITHOST_CPU_PACK_B=0: B plain; VITHOST_CPU_STREAM=0 or 1: aux
 * stored or streamed). */
static void run_band_call(band_kind kind, const char *route, const char *value, void *c,
                          void *aux) {
    const int64_t m = 300, n = 96, k = 64;
    const int f32 = kind == BAND_FC1_F32, fc1 = kind != BAND_FC2_DX_BF16;
    const vh_dtype t = f32 ? VH_DTYPE_F32 : VH_DTYPE_BF16;
    const size_t es = f32 ? 4 : 2;
    char *a = malloc((size_t)(m * k) * es), *b = malloc((size_t)(k * n) * es);
    char *bias = malloc((size_t)n * es);
    assert_true(a && b && bias);
    const uint64_t saved_rng = rng_state;
    rng_state = 777; /* both calls of a kind on the same values */
    for (int64_t i = 0; i < m * k + k * n + n + (fc1 ? 0 : m * n); i++) {
        const float x = (float)rnd();
        char *at = i < m * k               ? a + i * es
                   : i < m * k + k * n     ? b + (i - m * k) * es
                   : i < m * k + k * n + n ? bias + (i - m * k - k * n) * es
                                           : (char *)aux + (i - m * k - k * n - n) * es;
        store_value(at, f32, x);
    }
    vh_gemm_args g = {.struct_size = sizeof g, .trans_b = fc1, .m = m, .n = n, .k = k,
                      .alpha = 1.0f, .a = a, .lda = k, .b = b, .ldb = fc1 ? k : n, .c = c,
                      .ldc = n, .bias = fc1 ? bias : NULL, .ab_dtype = t, .c_dtype = t,
                      .bias_dtype = t, .aux = aux,
                      .epilogue = kind == BAND_FC1_BF16     ? VH_EPILOGUE_GELU
                                  : kind == BAND_FC1_F32    ? VH_EPILOGUE_GELU_GRAD
                                                            : VH_EPILOGUE_GELU_BACKWARD};
    gemm_with_route(&g, route, value);
    rng_state = saved_rng;
    free(a), free(b), free(bias);
}

/* B packed once into the kernel's layout for all bands (gemm.c's pack_b)
 * runs the same kernel on the same blocks as B given plain to every band:
 * the same bits, for each kind of band call. Where the CPU multiplies bf16
 * natively (oneDNN's brgemm wants pairs of k interleaved), the bf16 calls
 * must have packed; a CPU whose f32 kernel reads B as it is may not. */
static void test_bands_pack_b(void **state) {
    (void)state;
    set_mode("native");
    const size_t bytes = (size_t)300 * 96 * 4;
    for (int kind = BAND_FC1_BF16; kind <= BAND_FC1_F32; kind++) {
        char *c[2], *aux[2];
        for (int i = 0; i < 2; i++) {
            c[i] = calloc(1, bytes), aux[i] = calloc(1, bytes);
            assert_true(c[i] && aux[i]);
        }
        const unsigned long long before = bands_packed();
        run_band_call((band_kind)kind, "VITHOST_CPU_PACK_B", "0", c[0], aux[0]);
        assert_true(bands_packed() == before); /* VITHOST_CPU_PACK_B=0 packs nothing */
        run_band_call((band_kind)kind, NULL, NULL, c[1], aux[1]);
        const int packed = bands_packed() > before;
        if (hw_bf16 && kind != BAND_FC1_F32 && !packed)
            fail_msg("band kind %d: bf16 kernels, yet B was not packed", kind);
        if (memcmp(c[0], c[1], bytes) != 0 || memcmp(aux[0], aux[1], bytes) != 0)
            fail_msg("band kind %d: B packed (%s) and plain give other bits", kind,
                     packed ? "it was" : "it was not");
        printf("test_gemm16: band kind %d: B %s, the same bits as plain\n", kind,
               packed ? "packed" : "not packed here");
        for (int i = 0; i < 2; i++) free(c[i]), free(aux[i]);
    }
    set_mode("auto");
}

/* The bands dealt as each thread's contiguous share of the rows (the
 * default, deal.c) and one at a time to whichever thread is free
 * (VITHOST_CPU_DEAL=dynamic) give the same bits, for each kind of band call
 * (300 rows: bands of 128, 128 and 44, split 128 / 172 over two threads). */
static void test_bands_dealing(void **state) {
    (void)state;
    for (int kind = BAND_FC1_BF16; kind <= BAND_FC1_F32; kind++) {
        const size_t bytes = (size_t)(300 * 96) * (kind == BAND_FC1_F32 ? 4 : 2);
        void *c[2], *aux[2];
        for (int i = 0; i < 2; i++) {
            c[i] = calloc(1, bytes), aux[i] = calloc(1, bytes);
            assert_true(c[i] && aux[i]);
        }
        run_band_call((band_kind)kind, "VITHOST_CPU_DEAL", "dynamic", c[0], aux[0]);
        run_band_call((band_kind)kind, NULL, NULL, c[1], aux[1]);
        if (memcmp(c[0], c[1], bytes) != 0 || memcmp(aux[0], aux[1], bytes) != 0)
            fail_msg("band kind %d: bands dealt one at a time and as shares of the rows give "
                     "other bits", kind);
        for (int i = 0; i < 2; i++) free(c[i]), free(aux[i]);
    }
}

/* fp32 GELU band calls so far whose aux was streamed. */
static unsigned long long streamed_count(void) {
    return packing_count("aux streamed past the caches in ");
}

/* fp32's fc1 aux, gelu'(T), streamed out of each band's chunks (gemm.c's
 * stream_gelu_band) holds the bits that storing it holds, and so does C,
 * for every band and chunk: 300 rows make bands of 128, 128 and 44, each
 * of 2048-element chunks and a shorter last. */
static void test_bands_stream_aux(void **state) {
    (void)state;
    const size_t bytes = (size_t)300 * 96 * 4;
    char *c[2], *aux[2];
    for (int i = 0; i < 2; i++) {
        c[i] = calloc(1, bytes), aux[i] = calloc(1, bytes);
        assert_true(c[i] && aux[i]);
    }
    const unsigned long long before = streamed_count();
    run_band_call(BAND_FC1_F32, "VITHOST_CPU_STREAM", "0", c[0], aux[0]);
    assert_true(streamed_count() == before);
    run_band_call(BAND_FC1_F32, "VITHOST_CPU_STREAM", "1", c[1], aux[1]);
    assert_true(streamed_count() == before + 1);
    if (memcmp(aux[0], aux[1], bytes) != 0)
        fail_msg("fp32 fc1: aux streamed holds other bits than aux stored");
    if (memcmp(c[0], c[1], bytes) != 0) fail_msg("fp32 fc1: C differs with aux streamed");
    for (int i = 0; i < 2; i++) free(c[i]), free(aux[i]);
}

/* Left to itself, the engine streams fc1's aux only while the device's
 * tensors hold more than the L3 (stream.c): not with this test's few
 * tensors, yes with one more of the L3's size and a MiB, not again once it
 * is freed. Nothing of that tensor is touched: no page of it is used. */
static void test_stream_follows_tensor_bytes(void **state) {
    (void)state;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const size_t big = (l3 > 0 ? (size_t)l3 : (size_t)32 << 20) + ((size_t)1 << 20);
    const size_t bytes = (size_t)300 * 96 * 4;
    char *c = calloc(1, bytes), *aux = calloc(1, bytes);
    assert_true(c && aux);
    unsetenv("VITHOST_CPU_STREAM"); /* the engine's own rule */
    const unsigned long long before = streamed_count();
    run_band_call(BAND_FC1_F32, NULL, NULL, c, aux);
    assert_true(streamed_count() == before);
    void *held = NULL;
    assert_int_equal(ops->alloc(ops->device, big, &held), VH_STATUS_OK);
    run_band_call(BAND_FC1_F32, NULL, NULL, c, aux);
    assert_true(streamed_count() == before + 1);
    ops->free(ops->device, held);
    run_band_call(BAND_FC1_F32, NULL, NULL, c, aux);
    assert_true(streamed_count() == before + 1);
    printf("test_gemm16: fc1's aux streamed with %zu MiB of tensors, not without\n",
           big >> 20);
    free(c), free(aux);
}

/* One-call GEMMs of 256 rows or more whose B was packed first. */
static unsigned long long single_packed(void) { return packing_count("B packed first for "); }

/* C of one call of 400 rows, no bands: a linear layer's forward (C = A B^T
 * + bias, B transposed) or a data gradient (C = A B, B plain), f32 or bf16
 * in and out, B packed first (pack 1) or not (VITHOST_CPU_PACK_B=0). */
static void run_single_call(int forward, vh_dtype t, int pack, void *c) {
    const int64_t m = 400, n = 96, k = 80;
    const size_t es = vh_dtype_size(t);
    char *a = malloc((size_t)(m * k) * es), *b = malloc((size_t)(k * n) * es);
    char *bias = malloc((size_t)n * es);
    assert_true(a && b && bias);
    const uint64_t saved_rng = rng_state;
    rng_state = 4242; /* both calls of a kind on the same values */
    for (int64_t i = 0; i < m * k + k * n + n; i++) {
        const float x = (float)rnd();
        char *at = i < m * k ? a + i * es : i < m * k + k * n ? b + (i - m * k) * es
                                                              : bias + (i - m * k - k * n) * es;
        store_value(at, t == VH_DTYPE_F32, x);
    }
    vh_gemm_args g = {.struct_size = sizeof g, .trans_b = forward, .m = m, .n = n, .k = k,
                      .alpha = 1.0f, .a = a, .lda = k, .b = b, .ldb = forward ? k : n, .c = c,
                      .ldc = n, .bias = forward ? bias : NULL, .ab_dtype = t, .c_dtype = t,
                      .bias_dtype = t};
    gemm_packed_or_not(&g, pack);
    rng_state = saved_rng;
    free(a), free(b), free(bias);
}

/* A one-call GEMM of many rows packs B first (gemm.c's matmul_run), where
 * oneDNN's brgemm would copy it into the same blocks itself: the same bits
 * as B given plain, forward and data gradient, f32 and bf16. Where the CPU
 * multiplies bf16 natively the bf16 calls must have packed. */
static void test_single_pack_b(void **state) {
    (void)state;
    set_mode("native");
    const size_t bytes = (size_t)400 * 96 * 4;
    for (int kind = 0; kind < 4; kind++) {
        const int forward = kind % 2;
        const vh_dtype t = kind < 2 ? VH_DTYPE_F32 : VH_DTYPE_BF16;
        char *c[2] = {calloc(1, bytes), calloc(1, bytes)};
        assert_true(c[0] && c[1]);
        const unsigned long long before = single_packed();
        run_single_call(forward, t, 0, c[0]);
        assert_true(single_packed() == before); /* VITHOST_CPU_PACK_B=0 packs nothing */
        run_single_call(forward, t, 1, c[1]);
        const int packed = single_packed() > before;
        if (hw_bf16 && t == VH_DTYPE_BF16 && !packed)
            fail_msg("%s bf16: bf16 kernels, yet B was not packed", forward ? "forward" : "dX");
        if (memcmp(c[0], c[1], bytes) != 0)
            fail_msg("%s %s: B packed (%s) and plain give other bits",
                     forward ? "forward" : "dX", t == VH_DTYPE_F32 ? "f32" : "bf16",
                     packed ? "it was" : "it was not");
        printf("test_gemm16: one call, %s %s: B %s, the same bits as plain\n",
               forward ? "forward" : "dX", t == VH_DTYPE_F32 ? "f32" : "bf16",
               packed ? "packed" : "not packed here");
        free(c[0]), free(c[1]);
    }
    set_mode("auto");
}

/* A buffer of `bytes` that ends where an unreadable page begins: touching
 * past its end faults. *base and *len: the mapping, for munmap. */
static void *guarded(size_t bytes, void **base, size_t *len) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t pages = (bytes + page - 1) / page;
    *len = (pages + 1) * page;
    char *m = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(mprotect(m + pages * page, page, PROT_NONE), 0);
    *base = m;
    return m + pages * page - bytes;
}

/* sum over l < k of x[l xs] y[l ys], in double; *mag: the sum of |terms| */
static double dot_ref(const float *x, int64_t xs, const float *y, int64_t ys, int64_t k,
                      double *mag) {
    double sum = 0;
    *mag = 0;
    for (int64_t l = 0; l < k; l++) {
        const double t = (double)x[l * xs] * y[l * ys];
        sum += t, *mag += fabs(t);
    }
    return sum;
}

/* count random values stored in t at dst (f32 or bf16), and as stored in
 * f32 at v (the reference's operands) */
static void fill_stored(void *dst, float *v, int64_t count, vh_dtype t) {
    for (int64_t i = 0; i < count; i++) {
        v[i] = (float)rnd();
        if (t == VH_DTYPE_BF16) {
            ((uint16_t *)dst)[i] = vh_f32_to_bf16(v[i]);
            v[i] = vh_bf16_to_f32(((uint16_t *)dst)[i]);
        } else {
            ((float *)dst)[i] = v[i];
        }
    }
}

/* A weight gradient in t (f32 or bf16 operands, f32 C), m x n from k, A
 * and B each right before a guard page. */
static void check_weight_gradient_guarded(vh_dtype t) {
    /* dW = A^T B: A stored k x m with lda m + 3, B stored k x n with ldb
     * n + 5, each one's last row ending at its guard (no padding after it).
     * The race flushes B, the layer's input X of dW = dY^T X. */
    const int64_t m = 256, n = 256, k = 512, lda = m + 3, na = (k - 1) * lda + m;
    const int64_t ldb = n + 5, nb = (k - 1) * ldb + n;
    const size_t es = vh_dtype_size(t);
    void *base, *base_b;
    size_t len, len_b;
    void *a = guarded((size_t)na * es, &base, &len);
    void *b = guarded((size_t)nb * es, &base_b, &len_b);
    /* the stored values in f32, for the reference */
    float *av = malloc((size_t)na * sizeof(float)), *bv = malloc((size_t)nb * sizeof(float));
    float *c = malloc((size_t)(m * n) * sizeof(float));
    assert_true(av && bv && c);
    fill_stored(a, av, na, t);
    fill_stored(b, bv, nb, t);
    vh_gemm_args g = {.struct_size = sizeof g, .trans_a = 1, .m = m, .n = n, .k = k,
                      .alpha = 1.0f, .a = a, .lda = lda, .b = b, .ldb = ldb, .c = c, .ldc = n,
                      .ab_dtype = t, .c_dtype = VH_DTYPE_F32};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    for (int64_t i = 0; i < m; i += 17)
        for (int64_t j = 0; j < n; j += 13) {
            double mag; /* bf16 products are exact in f32: the same bound */
            const double want = dot_ref(av + i, lda, bv + j, ldb, k, &mag);
            if (fabs(c[i * n + j] - want) > (double)k * 0x1p-24 * mag)
                fail_msg("%s A^T.B: C[%lld][%lld] %g, want %g", vh_dtype_name(t), (long long)i,
                         (long long)j, (double)c[i * n + j], want);
        }
    free(av), free(bv), free(c);
    munmap(base, len);
    munmap(base_b, len_b);
}

/* fc2's data gradient, C = (A B) * aux, f32 operands, m x n x k, C and aux
 * in c_dtype, aux right at a guard page. */
static void check_mul_aux_guarded(int64_t m, int64_t n, int64_t k, vh_dtype c_dtype) {
    const size_t es = vh_dtype_size(c_dtype);
    void *base;
    size_t len;
    void *aux = guarded((size_t)(m * n) * es, &base, &len);
    float *a = malloc((size_t)(m * k) * sizeof(float)), *b = malloc((size_t)(k * n) * sizeof(float));
    void *c = malloc((size_t)(m * n) * es);
    assert_true(a && b && c);
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)rnd();
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)rnd();
    for (int64_t i = 0; i < m * n; i++) {
        const float v = (float)rnd();
        if (c_dtype == VH_DTYPE_F32)
            ((float *)aux)[i] = v;
        else
            ((uint16_t *)aux)[i] = vh_f32_to_bf16(v);
    }
    vh_gemm_args g = {.struct_size = sizeof g, .m = m, .n = n, .k = k, .alpha = 1.0f, .a = a,
                      .lda = k, .b = b, .ldb = n, .c = c, .ldc = n, .ab_dtype = VH_DTYPE_F32,
                      .c_dtype = c_dtype, .epilogue = VH_EPILOGUE_MUL_AUX, .aux = aux};
    assert_int_equal(ops->gemm(ops->device, &g), VH_STATUS_OK);
    const int f32 = c_dtype == VH_DTYPE_F32;
    for (int64_t i = 0; i < m; i += 31)
        for (int64_t j = 0; j < n; j += 7) {
            double mag;
            const double t = dot_ref(a + i * k, 1, b + j, n, k, &mag);
            const int64_t e = i * n + j;
            const double x = f32 ? ((float *)aux)[e] : vh_bf16_to_f32(((uint16_t *)aux)[e]);
            const double got = f32 ? ((float *)c)[e] : vh_bf16_to_f32(((uint16_t *)c)[e]);
            const double want = t * x; /* the f32 sum's bound, then C's rounding */
            const double tol = ((double)k * 0x1p-24 * mag + 0x1p-24 * fabs(t)) * fabs(x) +
                               (f32 ? 0.0 : 0x1p-8 * fabs(want));
            if (fabs(got - want) > tol)
                fail_msg("f32 A.B * aux into %s: C[%lld][%lld] %g, want %g",
                         vh_dtype_name(c_dtype), (long long)i, (long long)j, got, want);
        }
    free(a), free(b), free(c);
    munmap(base, len);
}

/* f32 GEMM calls run in bands of rows so far (the kernel race's own runs
 * in bands are not counted). */
static unsigned long long band_calls(void) {
    char line[512];
    vh_cpu_gemm_bands_summary(line, sizeof line); /* "N calls in bands ..." or "no calls ..." */
    return strtoull(line, NULL, 10);
}

/* The f32 classes that race oneDNN's two kernels for real (2^25 MACs and
 * up): the race flushes the operand forward wrote (a weight gradient's B,
 * fc2's aux) before each timed run, over its extent. Here each of those
 * ends at an unreadable page, A and B with padded leading dimensions (their
 * last rows without the padding), and aux: in f32 with the multiply timed in
 * the matmul (aux flushed); in f32 where the call runs in bands (the race
 * times the bands, into the call's own C, which the call then writes); and
 * in a bf16 C with f32 operands (the multiply a pass of its own after the
 * matmul, not timed: the race once read that aux as f32, past its end). So
 * a flush or a read over the wrong extent faults, and the results are the
 * products (within the k-term f32 bound; T * aux into bf16 within its
 * rounding) whatever the race left in C. */
static void test_f32_race_flushes_its_operands(void **state) {
    (void)state;
    vh_cpu_gemm16_reset();
    check_weight_gradient_guarded(VH_DTYPE_F32);
    check_mul_aux_guarded(1024, 256, 128, VH_DTYPE_BF16); /* the multiply a pass: not timed */
    check_mul_aux_guarded(4096, 256, 128, VH_DTYPE_F32);  /* a class of its own (4x the work) */
    /* bands of 128 rows of 67 MFLOP (gemm.c: BAND_MUL_MIN_FLOP), a class
     * of its own (8x the work of the last); one call in bands is counted,
     * not the race's */
    const unsigned long long before = band_calls();
    check_mul_aux_guarded(2048, 1024, 256, VH_DTYPE_F32);
    assert_true(band_calls() == before + 1);
    /* all four were raced (timed), not left to the default untimed */
    static char classes[8192];
    vh_cpu_gemm16_classes(classes, sizeof classes);
    printf("%s", classes);
    int timed = 0;
    for (const char *q = classes; (q = strstr(q, "kernels: default")); q++) timed++;
    assert_int_equal(timed, 4);
}

/* The bf16 races flush a weight gradient's B too (two bytes an element):
 * native against widen, and oneDNN's two native kernels where the CPU has
 * bf16 ones. B ends at an unreadable page, so a flush over an f32 extent
 * faults; the result is the product whichever path won. The class (2^25
 * MACs) is raced, not left untimed (the kernels only where native won: on
 * Intel cores without AMX widen may). */
static void test_bf16_race_flushes_b(void **state) {
    (void)state;
    vh_cpu_gemm16_reset();
    check_weight_gradient_guarded(VH_DTYPE_BF16);
    static char classes[8192];
    vh_cpu_gemm16_classes(classes, sizeof classes);
    printf("%s", classes);
    if (!hw_bf16) return; /* native falls back to widen: nothing raced */
    const char *line = strstr(classes, "bf16 A^T.B");
    assert_non_null(line);
    assert_non_null(strstr(line, "(native ")); /* native against widen, timed */
    if (strstr(line, ": native")) /* then its two kernels too */
        assert_non_null(strstr(line, "kernels: default"));
}

/* An invalid value: reported (stderr and the summary), auto used. */
static void test_invalid_value(void **state) {
    (void)state;
    set_mode("fastest");
    const char *line = summary();
    assert_non_null(strstr(line, "VITHOST_CPU_GEMM16=fastest ignored"));
    if (hw_bf16) assert_non_null(strstr(line, "auto"));
    problem p = make(&kShapes[0]);
    float *c = run_gemm(&p);
    check_close(&p, c, p.ref, 1.0, "invalid value");
    free(c);
    unmake(&p);
    set_mode("auto");
    assert_null(strstr(summary(), "ignored"));
}

static int setup(void **state) {
    (void)state;
    ops = vh_cpu_device_ops();
    if (!ops) return -1;
    const vh_cpu_engine_info *info = ops->get_extension(ops->device, VH_CPU_ENGINE_EXTENSION);
    if (!info) return -1;
    hw_bf16 = info->native_bf16;
    printf("test_gemm16: %s, ISA %s, bf16 kernels: %s\n", info->engine, info->isa,
           hw_bf16 ? "yes" : "no (native falls back to widen)");
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forced_paths),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_fc1_gelu),
        cmocka_unit_test(test_bands_pack_b),
        cmocka_unit_test(test_bands_dealing),
        cmocka_unit_test(test_bands_stream_aux),
        cmocka_unit_test(test_stream_follows_tensor_bytes),
        cmocka_unit_test(test_single_pack_b),
        cmocka_unit_test(test_invalid_value),
        cmocka_unit_test(test_f32_race_flushes_its_operands),
        cmocka_unit_test(test_bf16_race_flushes_b),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
