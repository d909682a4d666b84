/* test_rand_augment.c - RandAugment of training images (vh_rand_augment.h)
 * and its hook in the SDK's data path (vh_data_pass, through the synthetic
 * and idx plugins): each op against a hand-computed case, m = 0 as the
 * identity, the draws a function of the sample key only (workers 0/1/3 give
 * the same bits; the seed changes them), outputs finite and in range. */
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
#include "vithost/vh_testhost.h"
#include "vithost/vithost.h"

/* ---- single ops, by hand ------------------------------------------------------- */

enum { MAXN = 3 * 8 * 8 };

static float scratch[MAXN];
static const float black01[3] = {0, 0, 0}, white01[3] = {1, 1, 1};

static vh_ra_image image(float *data, int32_t c, int32_t h, int32_t w) {
    return (vh_ra_image){.data = data, .scratch = scratch, .channels = c, .height = h,
                         .width = w, .black = black01, .white = white01};
}

static void expect(const float *got, const float *want, int n, double tol) {
    for (int i = 0; i < n; i++)
        if (fabs((double)got[i] - want[i]) > tol)
            fail_msg("value %d: %.9g, expected %.9g", i, (double)got[i], (double)want[i]);
}

static void test_geometric_ops(void **state) {
    (void)state;
    /* translate x by +1 pixel (level 1 / (0.45 W)): out(x) = in(x + 1), the
     * last column the fill 0 */
    float a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}; /* 3 rows of 4 */
    vh_ra_image img = image(a, 1, 3, 4);
    vh_rand_augment_apply_op(VH_RA_TRANSLATE_X, 1.0 / (0.45 * 4), &img);
    expect(a, (const float[12]){2, 3, 4, 0, 6, 7, 8, 0, 10, 11, 12, 0}, 12, 1e-5);
    /* translate y by -1 pixel: out(y) = in(y - 1), the first row 0 */
    float b[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    img = image(b, 1, 3, 4);
    vh_rand_augment_apply_op(VH_RA_TRANSLATE_Y, -1.0 / (0.45 * 3), &img);
    expect(b, (const float[12]){0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, 12, 1e-5);
    /* rotate by 90 degrees (level 3): PIL's rotate(90), counter-clockwise, exact */
    float r[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    img = image(r, 1, 3, 3);
    vh_rand_augment_apply_op(VH_RA_ROTATE, 3.0, &img);
    assert_memory_equal(r, ((const float[9]){3, 6, 9, 2, 5, 8, 1, 4, 7}), sizeof r);
    /* shear x by 0.5 (level 5/3): out(x, y) = in at x + 0.5 (y + 0.5), bilinear */
    float s[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* 2 rows of 4 */
    img = image(s, 1, 2, 4);
    vh_rand_augment_apply_op(VH_RA_SHEAR_X, 0.5 / 0.3, &img);
    /* row 0 shifts by 0.25: 1.25 2.25 3.25 and the last column clamped (4); row 1 by 0.75,
     * and its last pixel's source (3.5 + 0.75 = 4.25) is outside: the fill */
    expect(s, (const float[8]){1.25f, 2.25f, 3.25f, 4, 5.75f, 6.75f, 7.75f, 0}, 8, 1e-5);
    /* level 0 (m = 0) is the identity, bit for bit, for every geometric op */
    const vh_ra_op geo[] = {VH_RA_ROTATE, VH_RA_SHEAR_X, VH_RA_SHEAR_Y, VH_RA_TRANSLATE_X,
                            VH_RA_TRANSLATE_Y};
    for (size_t k = 0; k < sizeof geo / sizeof geo[0]; k++) {
        float x[MAXN], y[MAXN];
        for (int i = 0; i < MAXN; i++) x[i] = y[i] = (float)sin(i * 0.7) * 0.4f + 0.5f;
        img = image(x, 3, 8, 8);
        vh_rand_augment_apply_op(geo[k], 0.0, &img);
        assert_memory_equal(x, y, sizeof x);
        vh_rand_augment_apply_op(geo[k], 0.5, &img); /* and a level above 0 moves pixels */
        assert_memory_not_equal(x, y, sizeof x);
    }
}

static void test_colour_ops(void **state) {
    (void)state;
    /* brightness, level 0.5: factor 1.45, clipped at white; through black -1, white 1 */
    float br[4] = {-0.6f, 0.0f, 0.6f, 1.0f}; /* pixels 0.2, 0.5, 0.8, 1 */
    const float bk = -1.0f, wt = 1.0f;
    vh_ra_image img = {.data = br, .scratch = scratch, .channels = 1, .height = 2, .width = 2,
                       .black = &bk, .white = &wt};
    vh_rand_augment_apply_op(VH_RA_BRIGHTNESS, 0.5, &img);
    expect(br, (const float[4]){-0.42f, 0.45f, 1.0f, 1.0f}, 4, 1e-6); /* 0.29, 0.725, 1, 1 */
    /* contrast, level -1: factor 0.1 towards the mean (0.5) */
    float ct[4] = {0.0f, 1.0f, 0.5f, 0.5f};
    img = image(ct, 1, 2, 2);
    vh_rand_augment_apply_op(VH_RA_CONTRAST, -1.0, &img);
    expect(ct, (const float[4]){0.45f, 0.55f, 0.5f, 0.5f}, 4, 1e-6);
    /* color, level -1: factor 0.1 towards the grey 0.299 of a red pixel */
    float co[3] = {1.0f, 0.0f, 0.0f};
    img = image(co, 3, 1, 1);
    vh_rand_augment_apply_op(VH_RA_COLOR, -1.0, &img);
    expect(co, (const float[3]){0.3691f, 0.2691f, 0.2691f}, 3, 1e-6);
    /* sharpness, level 1: factor 1.9 away from SMOOTH; the centre's smooth is
     * (4 * 0.8 + 8 * 0.5 + 0.8) / 13 = 8 / 13; the border stays */
    float sh[9] = {0.5f, 0.5f, 0.5f, 0.5f, 0.8f, 0.5f, 0.5f, 0.5f, 0.5f};
    img = image(sh, 1, 3, 3);
    vh_rand_augment_apply_op(VH_RA_SHARPNESS, 1.0, &img);
    const float d = 8.0f / 13.0f, centre = d + 1.9f * (0.8f - d);
    expect(sh, (const float[9]){0.5f, 0.5f, 0.5f, 0.5f, centre, 0.5f, 0.5f, 0.5f, 0.5f}, 9,
           1e-6);
    /* posterize, level 1: 4 bits (byte 100 -> 96, 255 -> 240) */
    float po[2] = {100.0f / 255.0f, 1.0f};
    img = image(po, 1, 1, 2);
    vh_rand_augment_apply_op(VH_RA_POSTERIZE, 1.0, &img);
    expect(po, (const float[2]){96.0f / 255.0f, 240.0f / 255.0f}, 2, 1e-6);
    /* solarize, level 0.5: bytes from 128 on inverted (200 -> 55, 100 stays) */
    float so[2] = {200.0f / 255.0f, 100.0f / 255.0f};
    img = image(so, 1, 1, 2);
    vh_rand_augment_apply_op(VH_RA_SOLARIZE, -0.5, &img);
    expect(so, (const float[2]){55.0f / 255.0f, 100.0f / 255.0f}, 2, 1e-6);
    /* autocontrast: 0.2..0.6 stretched to 0..1 */
    float ac[3] = {0.2f, 0.4f, 0.6f};
    img = image(ac, 1, 1, 3);
    vh_rand_augment_apply_op(VH_RA_AUTOCONTRAST, 0.0, &img);
    expect(ac, (const float[3]){0.0f, 0.5f, 1.0f}, 3, 1e-6);
    /* level 0 leaves every op with a level, and identity leaves any */
    for (int op = 0; op < VH_RA_OPS; op++) {
        if (op == VH_RA_AUTOCONTRAST) continue;
        float x[MAXN], y[MAXN];
        for (int i = 0; i < MAXN; i++) x[i] = y[i] = (float)cos(i * 0.3) * 0.5f + 0.5f;
        img = image(x, 3, 8, 8);
        vh_rand_augment_apply_op((vh_ra_op)op, op == VH_RA_IDENTITY ? 1.0 : 0.0, &img);
        assert_memory_equal(x, y, sizeof x);
    }
}

/* Many draws at the largest magnitude: finite, within black..white (0 lies
 * inside), m = 0 without autocontrast's draws changes nothing. */
static void test_apply_range(void **state) {
    (void)state;
    const float bk[3] = {-2.0f, -1.5f, -1.8f}, wt[3] = {2.2f, 2.5f, 2.6f};
    vh_rand_augment_config c = {.struct_size = sizeof c, .n = 3, .m = 10};
    int changed = 0;
    for (uint64_t key = 1; key <= 300; key++) {
        float x[MAXN], y[MAXN];
        for (int i = 0; i < MAXN; i++)
            x[i] = y[i] = bk[i / 64] +
                          (wt[i / 64] - bk[i / 64]) * (float)((i * 37 + key) % 101) / 100.0f;
        vh_ra_image img = {.data = x, .scratch = scratch, .channels = 3, .height = 8,
                           .width = 8, .black = bk, .white = wt};
        vh_rand_augment_apply(&c, key, &img);
        changed += memcmp(x, y, sizeof x) != 0;
        for (int i = 0; i < MAXN; i++) {
            assert_true(isfinite(x[i]));
            assert_true(x[i] >= bk[i / 64] - 1e-5f && x[i] <= wt[i / 64] + 1e-5f);
        }
    }
    /* each of 3 layers applies with p 1/2 and an op other than identity: most images change */
    assert_true(changed > 200 && changed < 300);
}

/* ---- the data path ------------------------------------------------------------- */

enum { DB = 4, DCH = 3, DS = 8, DBATCHES = 6, DCHW = DCH * DS * DS };

typedef struct pass {
    float train[DBATCHES][DB * DCHW];
    int32_t labels[DBATCHES][DB];
    float eval[DB * DCHW];
} pass;

/* Epoch 1 of the plugin at `path` with the given settings (NULL-ended), rank 1 of 2. */
static void run_pass(const char *plugin, const char *const *sets, uint64_t seed, pass *out) {
    memset(out, 0, sizeof *out);
    vh_testhost *th;
    char err[512], path[1024];
    snprintf(path, sizeof path, "%s/%s.so", VH_TEST_PLUGIN_DIR, plugin);
    assert_int_equal(vh_testhost_open(path, &th, err, sizeof err), VH_STATUS_OK);
    for (; *sets; sets++)
        if (vh_testhost_set(th, *sets) != VH_STATUS_OK)
            fail_msg("%s: %s", *sets, vh_testhost_error(th));
    vh_data_setup su = {.struct_size = sizeof su, .rank = 1, .world_size = 2,
                        .batch_size = DB, .seed = seed};
    if (vh_testhost_create(th, &su) != VH_STATUS_OK) fail_msg("%s", vh_testhost_error(th));
    assert_int_equal(vh_testhost_data_start(th, VH_SPLIT_TRAIN, 1), VH_STATUS_OK);
    for (int i = 0; i < DBATCHES; i++) {
        vh_batch b;
        int has;
        assert_int_equal(vh_testhost_data_next(th, &b, &has), VH_STATUS_OK);
        assert_true(has && b.size == DB);
        const int64_t chw = b.images.shape[1] * b.images.shape[2] * b.images.shape[3];
        assert_true(chw <= DCHW);
        memcpy(out->train[i], b.images.data, (size_t)(DB * chw) * sizeof(float));
        memcpy(out->labels[i], b.labels.data, sizeof out->labels[i]);
    }
    assert_int_equal(vh_testhost_data_start(th, VH_SPLIT_EVAL, 0), VH_STATUS_OK);
    vh_batch e;
    int has;
    assert_int_equal(vh_testhost_data_next(th, &e, &has), VH_STATUS_OK);
    assert_true(has && e.size == DB);
    memcpy(out->eval, e.images.data,
           (size_t)(DB * e.images.shape[1] * e.images.shape[2] * e.images.shape[3]) *
               sizeof(float));
    vh_testhost_close(th);
}

static void synthetic_pass(const char *workers, const char *n, uint64_t seed, pass *out) {
    const char *sets[] = {"channels=3", "image_size=8", "num_classes=5", "train_size=64",
                          "eval_size=8", workers, n, "rand_augment_m=9", NULL};
    run_pass("synthetic", sets, seed, out);
}

static void test_data_pass_synthetic(void **state) {
    (void)state;
    static pass plain, aug1, aug0, aug3, other_seed;
    synthetic_pass("workers=1", "rand_augment_n=0", 5, &plain);
    synthetic_pass("workers=1", "rand_augment_n=2", 5, &aug1);
    synthetic_pass("workers=0", "rand_augment_n=2", 5, &aug0);
    synthetic_pass("workers=3", "rand_augment_n=2", 5, &aug3);
    synthetic_pass("workers=1", "rand_augment_n=2", 6, &other_seed);
    /* deterministic for a seed and a rank, whatever the worker count */
    assert_memory_equal(&aug1, &aug0, sizeof aug1);
    assert_memory_equal(&aug1, &aug3, sizeof aug1);
    /* the same samples, augmented; evaluation untouched */
    assert_memory_equal(plain.labels, aug1.labels, sizeof plain.labels);
    assert_memory_equal(plain.eval, aug1.eval, sizeof plain.eval);
    int changed = 0;
    const float lim = (float)sqrt(3.0) + 1e-5f;
    for (int i = 0; i < DBATCHES; i++)
        for (int j = 0; j < DB; j++) {
            const float *p = plain.train[i] + j * DCHW, *a = aug1.train[i] + j * DCHW;
            changed += memcmp(p, a, DCHW * sizeof(float)) != 0;
            for (int k = 0; k < DCHW; k++) assert_true(isfinite(a[k]) && fabsf(a[k]) <= lim);
        }
    printf("synthetic, rand_augment n=2 m=9: %d of %d training images changed\n", changed,
           DBATCHES * DB);
    assert_true(changed > DBATCHES * DB / 2 && changed < DBATCHES * DB);
    assert_memory_not_equal(aug1.train, other_seed.train, sizeof aug1.train);
}

/* ---- idx: the 8-bit fill's range from its tables ----------------------------------- */

static void put_be32(FILE *f, uint32_t v) {
    const unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                                (unsigned char)(v >> 8), (unsigned char)v};
    assert_int_equal(fwrite(b, 1, 4, f), 4);
}

static void write_idx(const char *dir, const char *name, uint32_t count, int images) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    put_be32(f, images ? 0x803u : 0x801u);
    put_be32(f, count);
    if (images) put_be32(f, DS), put_be32(f, DS);
    for (uint32_t i = 0; i < count * (images ? DS * DS : 1); i++)
        fputc(images ? (int)((i * 97u + 13u) % 256u) : (int)(i % 3u), f);
    assert_int_equal(fclose(f), 0);
}

static void test_data_pass_idx(void **state) {
    (void)state;
    char dir[256], root[300];
    assert_int_equal(harness_mkdtemp(dir, sizeof dir, "rand_augment_idx"), 0);
    write_idx(dir, "train-images-idx3-ubyte", 64, 1);
    write_idx(dir, "train-labels-idx1-ubyte", 64, 0);
    write_idx(dir, "t10k-images-idx3-ubyte", 8, 1);
    write_idx(dir, "t10k-labels-idx1-ubyte", 8, 0);
    snprintf(root, sizeof root, "root=%s", dir);
    /* one plane: a pass of DCH = 3 times fewer floats per image; compare within that */
    static pass plain, aug0, aug2;
    const char *p_sets[] = {root, "num_classes=3", "mean=0.5", "std=0.25", "workers=1",
                            "rand_augment_n=0", NULL};
    const char *a_sets[] = {root, "num_classes=3", "mean=0.5", "std=0.25", "workers=0",
                            "rand_augment_n=3", "rand_augment_m=10", NULL};
    const char *b_sets[] = {root, "num_classes=3", "mean=0.5", "std=0.25", "workers=2",
                            "rand_augment_n=3", "rand_augment_m=10", NULL};
    run_pass("idx", p_sets, 3, &plain);
    run_pass("idx", a_sets, 3, &aug0);
    run_pass("idx", b_sets, 3, &aug2);
    assert_memory_equal(&aug0, &aug2, sizeof aug0);
    int changed = 0;
    for (int i = 0; i < DBATCHES; i++)
        for (int j = 0; j < DB; j++) {
            const float *a = aug0.train[i] + j * DS * DS, *p = plain.train[i] + j * DS * DS;
            changed += memcmp(a, p, DS * DS * sizeof(float)) != 0;
            /* within the normalised values of bytes 0 and 255: -2 and 2 */
            for (int k = 0; k < DS * DS; k++)
                assert_true(a[k] >= -2.0f - 1e-5f && a[k] <= 2.0f + 1e-5f);
        }
    assert_true(changed > DBATCHES * DB / 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometric_ops),       cmocka_unit_test(test_colour_ops),
        cmocka_unit_test(test_apply_range),         cmocka_unit_test(test_data_pass_synthetic),
        cmocka_unit_test(test_data_pass_idx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
