/* test_mix.c - Mixup/CutMix with soft targets (vh_mix.h, vh_data_pass, the
 * soft-target cross-entropy, vit, the host's refusal of an older model).
 *
 * The reference is timm's own Mixup(mode='batch') run on the draws vithost
 * makes (tests/reference/make_mix_fixture.py writes tests/fixtures/
 * mix_reference.txt): the same raw draws, then the same images and targets. */
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
#include "vithost/vh_runtime.h"
#include "vithost/vh_testhost.h"
#include "vithost/vithost.h"

/* ---- the fixture --------------------------------------------------------------- */

enum { FB = 6, FC = 2, FH = 7, FW = 5, FK = 7, FN = FB * FC * FH * FW };

static char *next_item(char **cursor, const char *name) {
    char *line = strtok_r(NULL, "\n", cursor);
    if (!line || strncmp(line, name, strlen(name)) != 0 || line[strlen(name)] != ' ') return NULL;
    return line + strlen(name) + 1;
}

static void read_floats(const char *s, float *out, int n) {
    char *end;
    for (int i = 0; i < n; i++, s = end) {
        out[i] = (float)strtod(s, &end);
        assert_true(end != s);
    }
}

static void check_case(char **cur, const float *images, const int32_t *labels, int *modes,
                       double *worst_img, double *worst_tgt) {
    char *c = next_item(cur, "case"), *d = next_item(cur, "draw");
    assert_non_null(c);
    assert_non_null(d);
    vh_mix_config cfg = {.struct_size = sizeof cfg, .num_classes = FK};
    long long seed, epoch, batch, rank;
    assert_int_equal(sscanf(c, "%lf %lf %lf %lf %lf %lld %lld %lld %lld", &cfg.mixup_alpha,
                            &cfg.cutmix_alpha, &cfg.prob, &cfg.switch_prob,
                            &cfg.label_smoothing, &seed, &epoch, &batch, &rank),
                     9);
    vh_mix_params want, got;
    assert_int_equal(sscanf(d, "%d %la %la %la %la %d %d %d %d %d %d", &want.mode, &want.lam,
                            &want.u_apply, &want.u_switch, &want.lam_draw, &want.cy, &want.cx,
                            &want.y0, &want.y1, &want.x0, &want.x1),
                     11);
    uint64_t key = vh_mix_key((uint64_t)seed, epoch, batch, (int32_t)rank);
    assert_int_equal(vh_mix_draw(&cfg, key, FH, FW, &got), VH_STATUS_OK);
    /* the draw the fixture fed timm is the one vithost makes */
    assert_int_equal(got.mode, want.mode);
    assert_true(got.lam == want.lam && got.u_apply == want.u_apply &&
                got.u_switch == want.u_switch && got.lam_draw == want.lam_draw);
    if (got.mode == VH_MIX_CUTMIX)
        assert_true(got.y0 == want.y0 && got.y1 == want.y1 && got.x0 == want.x0 &&
                    got.x1 == want.x1);
    double timm_lam;
    assert_int_equal(sscanf(next_item(cur, "timm_lam"), "%la", &timm_lam), 1);
    assert_true(got.lam == timm_lam); /* timm's corrected lam: the same box area */
    modes[got.mode]++;

    float x[FN], want_x[FN], t[FB * FK], want_t[FB * FK];
    memcpy(x, images, sizeof x);
    read_floats(next_item(cur, "timm_images"), want_x, FN);
    read_floats(next_item(cur, "timm_targets"), want_t, FB * FK);
    assert_int_equal(vh_mix_apply(&cfg, &got, x, labels, FB, FC, FH, FW, t), VH_STATUS_OK);
    for (int i = 0; i < FN; i++) {
        double e = fabs((double)x[i] - want_x[i]);
        *worst_img = e > *worst_img ? e : *worst_img;
    }
    for (int b = 0; b < FB; b++) {
        double sum = 0.0;
        for (int k = 0; k < FK; k++) {
            double e = fabs((double)t[b * FK + k] - want_t[b * FK + k]);
            *worst_tgt = e > *worst_tgt ? e : *worst_tgt;
            sum += t[b * FK + k];
        }
        assert_true(fabs(sum - 1.0) < 1e-6); /* targets sum to 1 per sample */
    }
}

static void test_fixture_matches_timm(void **state) {
    (void)state;
    char *text = harness_slurp(VH_TEST_FIXTURE_DIR "/mix_reference.txt");
    char *cur = NULL, *line = strtok_r(text, "\n", &cur);
    assert_non_null(line);
    int dims[5];
    assert_int_equal(sscanf(line, "shape %d %d %d %d %d", &dims[0], &dims[1], &dims[2],
                            &dims[3], &dims[4]),
                     5);
    assert_true(dims[0] == FB && dims[1] == FC && dims[2] == FH && dims[3] == FW &&
                dims[4] == FK);
    float images[FN];
    read_floats(next_item(&cur, "images"), images, FN);
    int32_t labels[FB];
    const char *l = next_item(&cur, "labels");
    for (int b = 0; b < FB; b++) {
        char *end;
        labels[b] = (int32_t)strtol(l, &end, 10);
        l = end;
    }
    int modes[3] = {0, 0, 0}, cases = 0;
    double worst_img = 0.0, worst_tgt = 0.0;
    for (; cases < 18; cases++)
        check_case(&cur, images, labels, modes, &worst_img, &worst_tgt);
    printf("timm fixture: %d cases (%d unmixed, %d mixup, %d cutmix): max |images - timm| "
           "%.3g, max |targets - timm| %.3g\n",
           cases, modes[0], modes[1], modes[2], worst_img, worst_tgt);
    assert_true(modes[0] > 0 && modes[1] > 0 && modes[2] > 0);
    assert_true(worst_img <= 1e-6);
    assert_true(worst_tgt <= 1e-7);
    free(text);
}

/* ---- the draws' distribution ------------------------------------------------------ */

static void test_draw_statistics(void **state) {
    (void)state;
    const double alphas[] = {0.2, 0.8, 1.0};
    const int n = 20000;
    for (int a = 0; a < 3; a++) {
        vh_mix_config c = {.struct_size = sizeof c, .mixup_alpha = alphas[a], .prob = 1.0,
                           .switch_prob = 0.5, .num_classes = 4};
        double s = 0.0, s2 = 0.0;
        for (int i = 0; i < n; i++) {
            vh_mix_params p;
            assert_int_equal(vh_mix_draw(&c, vh_mix_key(3, i / 100, i % 100, 0), 8, 8, &p), 0);
            assert_true(p.lam >= 0.0 && p.lam <= 1.0); /* Beta(0.2) rounds to 0 or 1 at times */
            s += p.lam, s2 += p.lam * p.lam;
        }
        double mean = s / n, var = s2 / n - mean * mean;
        double want_var = 1.0 / (4.0 * (2.0 * alphas[a] + 1.0)); /* Beta(a, a) */
        printf("Beta(%.1f, %.1f): mean %.4f (0.5), variance %.4f (%.4f)\n", alphas[a],
               alphas[a], mean, var, want_var);
        assert_true(fabs(mean - 0.5) < 0.01 && fabs(var - want_var) < 0.006);
    }
    vh_mix_config both = {.struct_size = sizeof both, .mixup_alpha = 0.8, .cutmix_alpha = 1.0,
                          .prob = 0.6, .switch_prob = 0.3, .num_classes = 4};
    int counts[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        vh_mix_params p;
        vh_mix_draw(&both, vh_mix_key(11, 0, i, 1), 8, 8, &p);
        counts[p.mode]++;
    }
    printf("mix_prob 0.6, switch 0.3: %d none, %d mixup, %d cutmix of %d\n", counts[0],
           counts[1], counts[2], n);
    assert_true(fabs(counts[0] / (double)n - 0.4) < 0.015);
    assert_true(fabs(counts[2] / (double)n - 0.6 * 0.3) < 0.015);
}

/* ---- the soft-target cross-entropy ------------------------------------------------- */

static vh_status xent(const vh_device_ops *d, const float *z, const int32_t *y, const float *t,
                      float s, float *loss, float *dz, int64_t B, int64_t C) {
    vh_xent_args a = {.struct_size = sizeof a, .batch = B, .classes = C, .smoothing = s,
                      .dloss_scale = 2.0f, .logits = z, .labels = y, .loss = loss,
                      .dlogits = dz, .targets = t};
    return d->softmax_cross_entropy(d->device, &a);
}

static void test_xent_soft(void **state) {
    (void)state;
    const vh_device_ops *d = vh_cpu_device_ops();
    enum { B = 3, C = 4 };
    const float z[B * C] = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f, 0.0f, -2.0f, 1.5f,
                            -0.5f, 0.75f, 0.1f, -3.0f};
    const float t[B * C] = {0.7f, 0.1f, 0.1f, 0.1f, 0.0f, 0.25f, 0.25f, 0.5f,
                            0.025f, 0.025f, 0.475f, 0.475f};
    float loss, dz[B * C];
    for (int i = 0; i < B * C; i++) dz[i] = 0.125f * (float)i; /* accumulates */
    assert_int_equal(xent(d, z, NULL, t, 0.0f, &loss, dz, B, C), VH_STATUS_OK);
    double want = 0.0, worst = 0.0;
    for (int b = 0; b < B; b++) {
        double mx = -INFINITY, sum = 0.0;
        for (int c = 0; c < C; c++) mx = fmax(mx, z[b * C + c]);
        for (int c = 0; c < C; c++) sum += exp(z[b * C + c] - mx);
        for (int c = 0; c < C; c++) {
            double logp = z[b * C + c] - mx - log(sum);
            want -= t[b * C + c] * logp;
            double g = 0.125 * (b * C + c) + 2.0 * (exp(logp) - t[b * C + c]) / B;
            worst = fmax(worst, fabs(g - dz[b * C + c]));
        }
    }
    want /= B;
    printf("soft xent: loss %.9g, by hand %.9g; max |dlogits - hand| %.3g\n", (double)loss,
           want, worst);
    assert_true(fabs(loss - want) < 1e-6 * fabs(want));
    assert_true(worst < 1e-6);
}

static void test_xent_one_hot_is_labels(void **state) {
    (void)state;
    const vh_device_ops *d = vh_cpu_device_ops();
    enum { B = 5, C = 7 };
    float z[B * C], t[B * C], ts[B * C], l1, l2, g1[B * C], g2[B * C];
    const int32_t y[B] = {0, 6, 3, 3, 2};
    for (int i = 0; i < B * C; i++) z[i] = sinf(0.7f * (float)i) * 3.0f;
    for (int i = 0; i < B * C; i++) {
        t[i] = i % C == y[i / C] ? 1.0f : 0.0f;
        ts[i] = i % C == y[i / C] ? (float)(1.0 - 0.1 + 0.1 / C) : (float)(0.1 / C);
        g1[i] = g2[i] = 0.5f;
    }
    assert_int_equal(xent(d, z, y, NULL, 0.0f, &l1, g1, B, C), VH_STATUS_OK);
    assert_int_equal(xent(d, z, NULL, t, 0.0f, &l2, g2, B, C), VH_STATUS_OK);
    assert_true(l1 == l2);                        /* bit for bit */
    assert_memory_equal(g1, g2, sizeof g1);
    /* smoothed one-hots against the labels' own smoothing: the targets' f32 rounding */
    for (int i = 0; i < B * C; i++) g1[i] = g2[i] = 0.0f;
    assert_int_equal(xent(d, z, y, NULL, 0.1f, &l1, g1, B, C), VH_STATUS_OK);
    assert_int_equal(xent(d, z, y, ts, 0.7f, &l2, g2, B, C), VH_STATUS_OK); /* s not read */
    double worst = 0.0;
    for (int i = 0; i < B * C; i++) worst = fmax(worst, fabs((double)g1[i] - g2[i]));
    printf("one-hot targets = labels bit for bit; smoothed: |loss diff| %.3g, grads %.3g\n",
           fabs((double)l1 - l2), worst);
    assert_true(fabs((double)l1 - l2) < 1e-6 && worst < 1e-7);
    /* no labels and no targets: refused */
    assert_int_not_equal(xent(d, z, NULL, NULL, 0.0f, &l1, g1, B, C), VH_STATUS_OK);
}

/* ---- the shared data path (vh_data_pass through synthetic) ---------------------------- */

enum { DB = 6, DCH = 2, DS = 8, DK = 5, DBATCHES = 8 };

typedef struct pass {
    float images[DBATCHES][DB * DCH * DS * DS];
    int32_t labels[DBATCHES][DB];
    float targets[DBATCHES][DB * DK];
    int has_targets[DBATCHES];
} pass;

/* One training pass (epoch 1) of synthetic with the given keys, rank and seed. */
static void run_pass(const char *workers, const char *alpha, const char *cut, int32_t rank,
                     uint64_t seed, pass *out) {
    vh_testhost *th;
    char err[512], path[1024];
    snprintf(path, sizeof path, "%s/synthetic.so", VH_TEST_PLUGIN_DIR);
    assert_int_equal(vh_testhost_open(path, &th, err, sizeof err), VH_STATUS_OK);
    const char *sets[] = {"channels=2", "image_size=8", "num_classes=5", "train_size=96",
                          "eval_size=12", workers, alpha, cut, "mix_switch_prob=0.5",
                          "mix_label_smoothing=0.1"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        assert_int_equal(vh_testhost_set(th, sets[i]), VH_STATUS_OK);
    vh_data_setup su = {.struct_size = sizeof su, .rank = rank, .world_size = 2,
                        .batch_size = DB, .seed = seed};
    assert_int_equal(vh_testhost_create(th, &su), VH_STATUS_OK);
    assert_int_equal(vh_testhost_data_start(th, VH_SPLIT_TRAIN, 1), VH_STATUS_OK);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < DBATCHES; i++) {
        vh_batch b;
        int has;
        assert_int_equal(vh_testhost_data_next(th, &b, &has), VH_STATUS_OK);
        assert_true(has && b.size == DB);
        memcpy(out->images[i], b.images.data, sizeof out->images[i]);
        memcpy(out->labels[i], b.labels.data, sizeof out->labels[i]);
        out->has_targets[i] = VH_STRUCT_HAS(&b, vh_batch, targets) && b.targets.data;
        if (out->has_targets[i]) {
            assert_true(b.targets.ndim == 2 && b.targets.shape[0] == DB &&
                        b.targets.shape[1] == DK);
            memcpy(out->targets[i], b.targets.data, sizeof out->targets[i]);
        }
    }
    /* evaluation batches carry no targets */
    assert_int_equal(vh_testhost_data_start(th, VH_SPLIT_EVAL, 0), VH_STATUS_OK);
    vh_batch e;
    int has;
    assert_int_equal(vh_testhost_data_next(th, &e, &has), VH_STATUS_OK);
    assert_true(has && !(VH_STRUCT_HAS(&e, vh_batch, targets) && e.targets.data));
    vh_testhost_close(th);
}

static void test_data_pass_mixes(void **state) {
    (void)state;
    static pass plain, mixed, mixed3, again, other_rank;
    run_pass("workers=1", "mixup_alpha=0", "cutmix_alpha=0", 1, 5, &plain);
    run_pass("workers=1", "mixup_alpha=0.8", "cutmix_alpha=1.0", 1, 5, &mixed);
    run_pass("workers=3", "mixup_alpha=0.8", "cutmix_alpha=1.0", 1, 5, &mixed3);
    run_pass("workers=0", "mixup_alpha=0.8", "cutmix_alpha=1.0", 1, 5, &again);
    run_pass("workers=1", "mixup_alpha=0.8", "cutmix_alpha=1.0", 0, 5, &other_rank);
    /* independent of the worker count, and deterministic for a seed and rank */
    assert_memory_equal(&mixed, &mixed3, sizeof mixed);
    assert_memory_equal(&mixed, &again, sizeof mixed);
    assert_memory_not_equal(mixed.targets, other_rank.targets, sizeof mixed.targets);
    vh_mix_config c = {.struct_size = sizeof c, .mixup_alpha = 0.8, .cutmix_alpha = 1.0,
                       .prob = 1.0, .switch_prob = 0.5, .label_smoothing = 0.1,
                       .num_classes = DK};
    int modes[3] = {0, 0, 0};
    for (int i = 0; i < DBATCHES; i++) {
        assert_false(plain.has_targets[i]);
        assert_true(mixed.has_targets[i]);
        /* batch i of epoch 1 on rank 1 is the unmixed batch mixed with the draw of (5, 1, i, 1) */
        vh_mix_params p;
        vh_mix_draw(&c, vh_mix_key(5, 1, i, 1), DS, DS, &p);
        modes[p.mode]++;
        float t[DB * DK];
        assert_int_equal(vh_mix_apply(&c, &p, plain.images[i], plain.labels[i], DB, DCH, DS, DS,
                                      t),
                         VH_STATUS_OK);
        assert_memory_equal(plain.images[i], mixed.images[i], sizeof plain.images[i]);
        assert_memory_equal(t, mixed.targets[i], sizeof t);
        for (int b = 0; b < DB; b++) {
            double s = 0.0;
            for (int k = 0; k < DK; k++) s += mixed.targets[i][b * DK + k];
            assert_true(fabs(s - 1.0) < 1e-6);
        }
    }
    printf("data pass: %d batches (%d mixup, %d cutmix), workers 0/1/3 identical\n", DBATCHES,
           modes[1], modes[2]);
}

/* ---- vithost: a tiny ViT with mixup and cutmix; the refusal of an older model ---- */

static char tmp_dir[256];
#define vithost(...) harness_sh(tmp_dir, "OMP_NUM_THREADS=1 " VH_TEST_VITHOST " " __VA_ARGS__)

static void test_vithost_run(void **state) {
    (void)state;
    assert_int_equal(harness_mkdtemp(tmp_dir, sizeof tmp_dir, "mix"), 0);
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    assert_int_equal(harness_write(tmp_dir, "r.yaml", harness_tiny_vit), 0);
    assert_int_equal(vithost("run r.yaml --out plain --set run.log_every=1"), 0);
    char *plain = harness_read(tmp_dir, "out");
    assert_int_equal(vithost("run r.yaml --out mix --set run.log_every=1 "
                             "--set data.mixup_alpha=0.8 --set data.cutmix_alpha=1.0 "
                             "--set model.label_smoothing=0.1"),
                     0);
    char *mix = harness_read(tmp_dir, "out"), *mix_err = harness_read(tmp_dir, "err");
    printf("---- vithost run with mixup/cutmix ----\n%s%s", mix, mix_err);
    assert_non_null(strstr(mix_err, "mix_label_smoothing")); /* vit's one note */
    assert_non_null(strstr(mix, "train step 8/8"));
    assert_true(strcmp(plain, mix) != 0); /* other losses: the batches are mixed */
    free(plain);
    free(mix);
    free(mix_err);
    /* a model plugin of ABI 2.0 would ignore the targets: refused, by name */
    int rc = vithost("run r.yaml --out old --set 'model={plugin: %s/tests/abi/old_minor_model.so}' "
                     "--set data.mixup_alpha=0.8",
                     VH_TEST_BUILD_DIR);
    char *old = harness_read(tmp_dir, "err");
    printf("---- older model (exit %d) ----\n%s", rc, old);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(old, "old_minor_model"));
    assert_non_null(strstr(old, "data.mixup_alpha"));
    free(old);
    harness_rmdir(tmp_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_matches_timm),
        cmocka_unit_test(test_draw_statistics),
        cmocka_unit_test(test_xent_soft),
        cmocka_unit_test(test_xent_one_hot_is_labels),
        cmocka_unit_test(test_data_pass_mixes),
        cmocka_unit_test(test_vithost_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
