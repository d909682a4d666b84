/* test_fixture.c - the golden-fixture reader (tests/fixture.c).
 *
 * Every committed fixture is loaded and checked for consistency with its own
 * config: the shapes of the timm parameters, input, labels, logits, loss, and
 * a gradient of the same shape for every parameter. The batch_second twins
 * must hold the batch_first numbers, and the AMP fixture its float64 twin's
 * weights and batch with results of PyTorch's bf16 autocast. Damaged copies written to /tmp (bad
 * magic, other version, every truncation of the header, trailing bytes, huge
 * dims) must be refused with the right message, and the comparison helper is
 * checked on known errors.
 * Run one test by name: test_fixture <glob>.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#ifndef VH_TEST_FIXTURE_DIR
#define VH_TEST_FIXTURE_DIR "tests/fixtures" /* when built by hand from the repo root */
#endif

static const char *const fixture_names[] = {
    "vit_token_bf", "vit_token_bs", "vit_pooled_bf", "vit_pooled_bs", "vit_odd",
    "vit_token_bf_amp_bf16",
};
enum { FIXTURE_COUNT = sizeof fixture_names / sizeof fixture_names[0] };

static const char *const config_keys[] = {
    "image_height", "image_width", "channels", "patch_size", "dim",     "depth",           "heads",
    "mlp_dim",      "num_classes", "classifier", "layout",   "batch",   "label_smoothing", "eps",
};

static void fixture_path(char *out, size_t len, const char *name) {
    snprintf(out, len, "%s/%s.vhfx", VH_TEST_FIXTURE_DIR, name);
}

static void load_or_fail(const char *name, vh_fixture *fx) {
    char path[1024], err[512];
    fixture_path(path, sizeof path, name);
    if (vh_fixture_load(path, fx, err, sizeof err) != 0) fail_msg("%s", err);
}

/* Fixtures a test holds, freed by teardown even when an assertion fails. */
typedef struct loaded {
    vh_fixture a, b;
} loaded;

static int setup_loaded(void **state) {
    loaded *l = calloc(1, sizeof *l);
    *state = l;
    return l ? 0 : -1;
}

static int teardown_loaded(void **state) {
    loaded *l = *state;
    vh_fixture_free(&l->a);
    vh_fixture_free(&l->b);
    free(l);
    return 0;
}

/* ---- helpers for damaged copies ------------------------------------------------------ */

typedef struct blob {
    unsigned char *data;
    size_t size;
} blob;

static blob read_blob(const char *name) {
    char path[1024];
    fixture_path(path, sizeof path, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_true(size > 0);
    rewind(f);
    blob b = {malloc((size_t)size), (size_t)size};
    assert_non_null(b.data);
    assert_int_equal(fread(b.data, 1, b.size, f), b.size);
    fclose(f);
    return b;
}

typedef struct tmpfile_state {
    char path[64];
} tmpfile_state;

static void write_tmp(tmpfile_state *t, const void *data, size_t size) {
    if (!t->path[0]) {
        strcpy(t->path, "/tmp/vh_fixture_XXXXXX");
        int fd = mkstemp(t->path);
        assert_true(fd >= 0);
        close(fd);
    }
    FILE *f = fopen(t->path, "wb");
    assert_non_null(f);
    if (size) assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
}

/* Loads t's file, expects failure, returns the message in err. */
static void expect_load_error(tmpfile_state *t, char *err, size_t len) {
    vh_fixture fx;
    memset(&fx, 0xab, sizeof fx); /* load must zero it on failure */
    assert_int_equal(vh_fixture_load(t->path, &fx, err, len), -1);
    assert_null(fx.tensors);
    assert_null(fx.config);
    assert_null(fx.path);
    assert_true(strlen(err) > 0);
    assert_non_null(strstr(err, t->path));
}

static int setup_tmp(void **state) {
    tmpfile_state *t = calloc(1, sizeof *t);
    *state = t;
    return t ? 0 : -1;
}

static int teardown_tmp(void **state) {
    tmpfile_state *t = *state;
    if (t->path[0]) unlink(t->path);
    free(t);
    return 0;
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Byte offset of the first tensor header (its name length) in a fixture. */
static size_t first_tensor_offset(const blob *b) {
    size_t pos = 8;
    uint32_t n = (uint32_t)b->data[pos] | (uint32_t)b->data[pos + 1] << 8 |
                 (uint32_t)b->data[pos + 2] << 16 | (uint32_t)b->data[pos + 3] << 24;
    pos += 4;
    for (uint32_t i = 0; i < 2 * n; i++) {
        uint32_t len = (uint32_t)b->data[pos] | (uint32_t)b->data[pos + 1] << 8;
        pos += 4 + len;
    }
    return pos + 4; /* past the tensor count */
}

/* ---- consistency of every fixture ---------------------------------------------------- */

static int64_t cfg_int(const vh_fixture *fx, const char *key) {
    int64_t v = -1;
    if (vh_fixture_config_int(fx, key, &v) != 0) fail_msg("config key %s missing or not an int", key);
    return v;
}

static void expect_shape(const vh_fixture *fx, const char *name, vh_fixture_dtype dtype,
                         uint32_t ndim, const int64_t *dims) {
    const vh_fixture_array *t = vh_fixture_tensor(fx, name);
    if (!t) fail_msg("%s: no tensor %s", fx->path, name);
    assert_int_equal(t->dtype, dtype);
    if (t->ndim != ndim) fail_msg("%s: %s has %u dims, want %u", fx->path, name, t->ndim, ndim);
    size_t numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (t->dims[d] != dims[d])
            fail_msg("%s: %s dim %u is %lld, want %lld", fx->path, name, d, (long long)t->dims[d],
                     (long long)dims[d]);
        numel *= (size_t)dims[d];
    }
    assert_int_equal(t->numel, numel);
    assert_non_null(t->data);
    if (dtype == VH_FIXTURE_DTYPE_F32) {
        assert_ptr_equal(t->f32, t->data);
        assert_null(t->i32);
        for (size_t i = 0; i < numel; i++)
            if (!isfinite(t->f32[i])) fail_msg("%s: %s[%zu] is not finite", fx->path, name, i);
    } else {
        assert_ptr_equal(t->i32, t->data);
        assert_null(t->f32);
    }
}

#define SHAPE(fx, name, ...)                                                              \
    do {                                                                                  \
        const int64_t dims_[] = {__VA_ARGS__};                                            \
        expect_shape(fx, name, VH_FIXTURE_DTYPE_F32, sizeof dims_ / sizeof dims_[0], dims_); \
    } while (0)

static bool is_param(const char *name) {
    return strncmp(name, "grad.", 5) != 0 && strcmp(name, "input") != 0 &&
           strcmp(name, "labels") != 0 && strcmp(name, "logits") != 0 && strcmp(name, "loss") != 0;
}

static void check_consistent(const vh_fixture *fx) {
    assert_int_equal(fx->version, VH_FIXTURE_VERSION);
    for (size_t i = 0; i < sizeof config_keys / sizeof config_keys[0]; i++)
        if (!vh_fixture_config(fx, config_keys[i]))
            fail_msg("%s: config key %s missing", fx->path, config_keys[i]);
    int64_t H = cfg_int(fx, "image_height"), W = cfg_int(fx, "image_width");
    int64_t C = cfg_int(fx, "channels"), P = cfg_int(fx, "patch_size");
    int64_t D = cfg_int(fx, "dim"), L = cfg_int(fx, "depth"), heads = cfg_int(fx, "heads");
    int64_t M = cfg_int(fx, "mlp_dim"), K = cfg_int(fx, "num_classes");
    int64_t B = cfg_int(fx, "batch");
    const char *classifier = vh_fixture_config(fx, "classifier");
    const char *layout = vh_fixture_config(fx, "layout");
    assert_true(strcmp(classifier, "token") == 0 || strcmp(classifier, "pooled") == 0);
    assert_true(strcmp(layout, "batch_first") == 0 || strcmp(layout, "batch_second") == 0);
    double smoothing, eps;
    assert_int_equal(vh_fixture_config_double(fx, "label_smoothing", &smoothing), 0);
    assert_int_equal(vh_fixture_config_double(fx, "eps", &eps), 0);
    assert_true(smoothing >= 0.0 && smoothing < 1.0);
    assert_true(eps == 1e-6);
    assert_int_equal(H % P, 0);
    assert_int_equal(W % P, 0);
    assert_int_equal(D % heads, 0);
    bool token = strcmp(classifier, "token") == 0;
    int64_t N = (H / P) * (W / P) + (token ? 1 : 0);

    if (token) {
        SHAPE(fx, "cls_token", 1, 1, D);
        SHAPE(fx, "norm.weight", D);
        SHAPE(fx, "norm.bias", D);
        assert_null(vh_fixture_tensor(fx, "fc_norm.weight"));
    } else {
        assert_null(vh_fixture_tensor(fx, "cls_token"));
        assert_null(vh_fixture_tensor(fx, "norm.weight"));
        SHAPE(fx, "fc_norm.weight", D);
        SHAPE(fx, "fc_norm.bias", D);
    }
    SHAPE(fx, "pos_embed", 1, N, D);
    SHAPE(fx, "patch_embed.proj.weight", D, C, P, P);
    SHAPE(fx, "patch_embed.proj.bias", D);
    char name[128];
    for (int64_t i = 0; i < L; i++) {
#define BLOCK(suffix, ...)                                                        \
    do {                                                                          \
        snprintf(name, sizeof name, "blocks.%lld." suffix, (long long)i);         \
        SHAPE(fx, name, __VA_ARGS__);                                             \
    } while (0)
        BLOCK("norm1.weight", D);
        BLOCK("norm1.bias", D);
        BLOCK("attn.qkv.weight", 3 * D, D);
        BLOCK("attn.qkv.bias", 3 * D);
        BLOCK("attn.proj.weight", D, D);
        BLOCK("attn.proj.bias", D);
        BLOCK("norm2.weight", D);
        BLOCK("norm2.bias", D);
        BLOCK("mlp.fc1.weight", M, D);
        BLOCK("mlp.fc1.bias", M);
        BLOCK("mlp.fc2.weight", D, M);
        BLOCK("mlp.fc2.bias", D);
#undef BLOCK
    }
    snprintf(name, sizeof name, "blocks.%lld.norm1.weight", (long long)L);
    assert_null(vh_fixture_tensor(fx, name)); /* exactly depth blocks */
    SHAPE(fx, "head.weight", K, D);
    SHAPE(fx, "head.bias", K);

    SHAPE(fx, "input", B, C, H, W);
    SHAPE(fx, "logits", B, K);
    SHAPE(fx, "loss", 1);
    const int64_t label_dims[] = {B};
    expect_shape(fx, "labels", VH_FIXTURE_DTYPE_I32, 1, label_dims);
    const vh_fixture_array *labels = vh_fixture_tensor(fx, "labels");
    for (int64_t b = 0; b < B; b++) assert_in_range(labels->i32[b], 0, K - 1);
    float loss = vh_fixture_tensor(fx, "loss")->f32[0];
    assert_true(loss > 0.0f && loss < 20.0f); /* ~ln(classes) for logits near 0 */

    /* Parameters first, in state_dict order, each with a gradient of its shape
     * that is not all zeros. */
    size_t params = 0, grads = 0;
    for (size_t i = 0; i < fx->tensor_count; i++) {
        const vh_fixture_array *t = &fx->tensors[i];
        if (strncmp(t->name, "grad.", 5) == 0) {
            grads++;
            continue;
        }
        if (!is_param(t->name)) continue;
        assert_int_equal(i, params); /* parameters lead the file */
        params++;
        snprintf(name, sizeof name, "grad.%s", t->name);
        expect_shape(fx, name, VH_FIXTURE_DTYPE_F32, t->ndim, t->dims);
        const vh_fixture_array *g = vh_fixture_tensor(fx, name);
        double max_abs = 0.0;
        for (size_t k = 0; k < g->numel; k++)
            if (fabs((double)g->f32[k]) > max_abs) max_abs = fabs((double)g->f32[k]);
        if (!(max_abs > 0.0)) fail_msg("%s: %s is all zeros", fx->path, name);
    }
    assert_int_equal(params, grads);
    assert_int_equal(params, (size_t)(12 * L + 7 + (token ? 1 : 0)));
    assert_int_equal(fx->tensor_count, 2 * params + 4);
}

static void test_fixtures_consistent(void **state) {
    loaded *l = *state;
    for (size_t i = 0; i < FIXTURE_COUNT; i++) {
        load_or_fail(fixture_names[i], &l->a);
        check_consistent(&l->a);
        vh_fixture_free(&l->a);
        assert_null(l->a.tensors);
        vh_fixture_free(&l->a); /* twice is harmless */
    }
}

static void test_fixture_configs(void **state) {
    loaded *l = *state;
    vh_fixture *fx = &l->a;
    load_or_fail("vit_token_bf", fx);
    assert_string_equal(vh_fixture_config(fx, "dim"), "48");
    assert_string_equal(vh_fixture_config(fx, "classifier"), "token");
    assert_string_equal(vh_fixture_config(fx, "layout"), "batch_first");
    assert_string_equal(vh_fixture_config(fx, "label_smoothing"), "0.1");
    assert_null(vh_fixture_config(fx, "no_such_key"));
    assert_null(vh_fixture_tensor(fx, "no_such_tensor"));
    int64_t v;
    assert_int_equal(vh_fixture_config_int(fx, "classifier", &v), -1); /* not a number */
    assert_int_equal(vh_fixture_config_int(fx, "no_such_key", &v), -1);
    assert_int_equal(vh_fixture_config_int(fx, "image_height", &v), 0);
    assert_int_equal(v, 16);
    double x;
    assert_int_equal(vh_fixture_config_double(fx, "label_smoothing", &x), 0);
    assert_true(x == 0.1);
    assert_int_equal(cfg_int(fx, "depth"), 2);
    vh_fixture_free(fx);

    load_or_fail("vit_odd", fx);
    assert_int_equal(cfg_int(fx, "image_height"), 10);
    assert_int_equal(cfg_int(fx, "image_width"), 14);
    const vh_fixture_array *pos = vh_fixture_tensor(fx, "pos_embed");
    assert_non_null(pos);
    assert_int_equal(pos->dims[1], 36); /* 5 x 7 patches + the class token */
    vh_fixture_free(fx);
}

/* A *_bs fixture holds the *_bf parameters and input and the same results. */
static void test_layout_twins_agree(void **state) {
    loaded *l = *state;
    static const char *const pairs[][2] = {{"vit_token_bf", "vit_token_bs"},
                                           {"vit_pooled_bf", "vit_pooled_bs"}};
    for (size_t p = 0; p < 2; p++) {
        vh_fixture *a = &l->a, *b = &l->b;
        load_or_fail(pairs[p][0], a);
        load_or_fail(pairs[p][1], b);
        assert_string_equal(vh_fixture_config(a, "layout"), "batch_first");
        assert_string_equal(vh_fixture_config(b, "layout"), "batch_second");
        assert_int_equal(a->tensor_count, b->tensor_count);
        for (size_t i = 0; i < a->tensor_count; i++) {
            const vh_fixture_array *ta = &a->tensors[i], *tb = &b->tensors[i];
            assert_string_equal(ta->name, tb->name);
            assert_int_equal(ta->numel, tb->numel);
            if (is_param(ta->name) || strcmp(ta->name, "input") == 0 ||
                strcmp(ta->name, "labels") == 0) {
                assert_memory_equal(ta->data, tb->data, 4 * ta->numel);
                continue;
            }
            char report[512];
            if (!vh_fixture_compare(ta->name, tb->f32, ta->f32, ta->numel, 1e-6, report,
                                    sizeof report))
                fail_msg("%s vs %s: %s", pairs[p][0], pairs[p][1], report);
        }
        vh_fixture_free(a);
        vh_fixture_free(b);
    }
}

/* The bits of f32 v are a bf16 value's: the low 16 bits are zero. */
static bool is_bf16_value(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0xffffu) == 0;
}

/* vit_token_bf_amp_bf16 is vit_token_bf's step under torch.autocast(bf16):
 * the same config (plus autocast: bf16), parameters, input and labels bit
 * for bit; bf16 logits; bf16-valued gradients for the parameters a bf16 op
 * consumed (linear and conv weights and biases), fp32 sums for the layer
 * norms, cls_token and pos_embed (they meet the fp32 residual stream); and
 * results a bf16 step's distance from the exact ones: further than fp32
 * rounding, within 16 bf16 roundings (2^-4; measured up to 7). */
static void test_amp_fixture_twin(void **state) {
    loaded *l = *state;
    vh_fixture *x = &l->a, *amp = &l->b;
    load_or_fail("vit_token_bf", x);
    load_or_fail("vit_token_bf_amp_bf16", amp);
    assert_null(vh_fixture_config(x, "autocast"));
    assert_string_equal(vh_fixture_config(amp, "autocast"), "bf16");
    assert_int_equal(amp->config_count, x->config_count + 1);
    for (size_t i = 0; i < x->config_count; i++)
        assert_string_equal(vh_fixture_config(amp, x->config[i].key), x->config[i].value);
    assert_int_equal(amp->tensor_count, x->tensor_count);
    int fp32_sums = 0;
    for (size_t i = 0; i < x->tensor_count; i++) {
        const vh_fixture_array *tx = &x->tensors[i], *ta = &amp->tensors[i];
        assert_string_equal(ta->name, tx->name);
        assert_int_equal(ta->numel, tx->numel);
        if (is_param(tx->name) || !strcmp(tx->name, "input") || !strcmp(tx->name, "labels")) {
            assert_memory_equal(ta->data, tx->data, 4 * tx->numel);
            continue;
        }
        const char *param = strncmp(tx->name, "grad.", 5) == 0 ? tx->name + 5 : NULL;
        bool fp32_grad = param && (strstr(param, "norm") || !strcmp(param, "cls_token") ||
                                   !strcmp(param, "pos_embed"));
        bool all_bf16 = true;
        for (size_t k = 0; k < ta->numel; k++) all_bf16 = all_bf16 && is_bf16_value(ta->f32[k]);
        if (!strcmp(tx->name, "logits") || (param && !fp32_grad)) {
            if (!all_bf16) fail_msg("%s: %s holds values bf16 cannot", amp->path, tx->name);
        } else if (fp32_grad && !all_bf16) {
            fp32_sums++;
        }
        double err = vh_fixture_error(ta->f32, tx->f32, tx->numel, NULL);
        if (!(err > 1e-5 && err <= 1.0 / 16.0))
            fail_msg("%s: %s is %.2e from the exact one: not a bf16 step", amp->path, tx->name,
                     err);
    }
    assert_int_equal(fp32_sums, 2 * 2 * 2 + 2 + 2); /* norm1, norm2 x 2 blocks, norm, cls, pos */
}

/* ---- errors --------------------------------------------------------------------------- */

static void test_missing_file(void **state) {
    (void)state;
    vh_fixture fx;
    char err[512];
    const char *path = VH_TEST_FIXTURE_DIR "/no_such_fixture.vhfx";
    assert_int_equal(vh_fixture_load(path, &fx, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "cannot open"));
    assert_non_null(strstr(err, "No such file"));
    assert_null(fx.tensors);
    /* Errors need no buffer, and a short one is cut, never overrun. */
    assert_int_equal(vh_fixture_load(path, &fx, NULL, 0), -1);
    char tiny[8];
    assert_int_equal(vh_fixture_load(path, &fx, tiny, sizeof tiny), -1);
    assert_int_equal(strlen(tiny), sizeof tiny - 1);
    assert_int_equal(vh_fixture_load(NULL, &fx, err, sizeof err), -1);
    assert_int_equal(vh_fixture_load(path, NULL, err, sizeof err), -1);
}

static void test_bad_magic(void **state) {
    tmpfile_state *t = *state;
    blob b = read_blob("vit_odd");
    memcpy(b.data, "GGUF", 4);
    write_tmp(t, b.data, b.size);
    char err[512];
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "not a vithost fixture"));
    assert_non_null(strstr(err, "\"GGUF\""));
    free(b.data);
}

static void test_version_mismatch(void **state) {
    tmpfile_state *t = *state;
    blob b = read_blob("vit_odd");
    put_u32(b.data + 4, VH_FIXTURE_VERSION + 1);
    write_tmp(t, b.data, b.size);
    char err[512];
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "version 2"));
    assert_non_null(strstr(err, "stale"));
    assert_non_null(strstr(err, VH_FIXTURE_HINT));
    free(b.data);
}

static void test_truncated(void **state) {
    tmpfile_state *t = *state;
    blob b = read_blob("vit_odd");
    char err[512];
    /* Every cut through the config and the first tensors' headers, then a few
     * through the data: all refused as truncated, none read past the end. */
    size_t header_end = first_tensor_offset(&b) + 256;
    assert_true(header_end < b.size);
    size_t cuts[] = {b.size / 3, b.size / 2, b.size - 4, b.size - 1};
    for (size_t cut = 0; cut < header_end + sizeof cuts / sizeof cuts[0]; cut++) {
        size_t size = cut < header_end ? cut : cuts[cut - header_end];
        write_tmp(t, b.data, size);
        expect_load_error(t, err, sizeof err);
        if (!strstr(err, "truncated")) fail_msg("cut at %zu: %s", size, err);
        assert_non_null(strstr(err, VH_FIXTURE_HINT));
    }
    free(b.data);
}

static void test_trailing_bytes(void **state) {
    tmpfile_state *t = *state;
    blob b = read_blob("vit_odd");
    unsigned char *longer = malloc(b.size + 3);
    assert_non_null(longer);
    memcpy(longer, b.data, b.size);
    memset(longer + b.size, 0, 3);
    write_tmp(t, longer, b.size + 3);
    char err[512];
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "3 trailing bytes"));
    free(longer);
    free(b.data);
}

static void test_malformed_tensor(void **state) {
    tmpfile_state *t = *state;
    blob b = read_blob("vit_odd");
    size_t first = first_tensor_offset(&b); /* cls_token: name len, name, dtype, ndim, dims */
    uint32_t name_len = (uint32_t)b.data[first] | (uint32_t)b.data[first + 1] << 8;
    size_t dtype_at = first + 4 + name_len, ndim_at = dtype_at + 4, dim0_at = ndim_at + 4;
    char err[512];

    unsigned char saved[4];
    memcpy(saved, b.data + dtype_at, 4);
    put_u32(b.data + dtype_at, 7);
    write_tmp(t, b.data, b.size);
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "unknown dtype code 7"));
    memcpy(b.data + dtype_at, saved, 4);

    memcpy(saved, b.data + ndim_at, 4);
    put_u32(b.data + ndim_at, 99);
    write_tmp(t, b.data, b.size);
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "99 dims"));
    memcpy(b.data + ndim_at, saved, 4);

    put_u32(b.data + dim0_at, 0xffffffffu); /* data far beyond the end of the file */
    write_tmp(t, b.data, b.size);
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "truncated"));
    assert_non_null(strstr(err, "cls_token"));

    put_u32(b.data + first, 0xfffffff0u); /* absurd name length */
    write_tmp(t, b.data, b.size);
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "bytes long"));

    put_u32(b.data + first - 4, 0xffffffu); /* tensor count beyond the file */
    write_tmp(t, b.data, b.size);
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "tensor count"));
    free(b.data);

    write_tmp(t, NULL, 0); /* empty file */
    expect_load_error(t, err, sizeof err);
    assert_non_null(strstr(err, "truncated"));
}

/* ---- comparison ----------------------------------------------------------------------- */

static void test_compare(void **state) {
    (void)state;
    const float want[] = {0.5f, -2.0f, 0.0f, 1e-8f};
    float got[4];
    memcpy(got, want, sizeof got);
    char report[256];
    size_t where = 99;

    assert_true(vh_fixture_error(got, want, 4, &where) == 0.0);
    assert_true(vh_fixture_compare("same", got, want, 4, 0.0, report, sizeof report));
    assert_non_null(strstr(report, "same: ok"));

    /* The error is relative to max|want| = 2, wherever the difference is. */
    got[3] += 2e-4f;
    double err = vh_fixture_error(got, want, 4, &where);
    assert_int_equal(where, 3);
    assert_true(fabs(err - 1e-4) < 1e-9);
    assert_true(vh_fixture_compare("grad.x", got, want, 4, 2e-4, report, sizeof report));
    assert_false(vh_fixture_compare("grad.x", got, want, 4, 5e-5, report, sizeof report));
    assert_non_null(strstr(report, "grad.x: FAIL"));
    assert_non_null(strstr(report, "at [3]"));

    got[1] = NAN;
    assert_true(isinf(vh_fixture_error(got, want, 4, &where)));
    assert_int_equal(where, 1);
    assert_false(vh_fixture_compare("nan", got, want, 4, 1e30, report, sizeof report));
    got[1] = INFINITY;
    assert_false(vh_fixture_compare("inf", got, want, 4, 1e30, NULL, 0));

    /* All-zero reference: any difference fails, none passes. */
    const float zeros[2] = {0.0f, 0.0f};
    float small[2] = {0.0f, 1e-30f};
    assert_true(vh_fixture_compare("zeros", zeros, zeros, 2, 0.0, report, sizeof report));
    assert_false(vh_fixture_compare("zeros", small, zeros, 2, 1e-3, report, sizeof report));

    assert_true(vh_fixture_compare("empty", NULL, NULL, 0, 0.0, report, sizeof report));
    assert_false(vh_fixture_compare("null", NULL, want, 4, 1.0, report, sizeof report));
    char tiny[6];
    assert_true(vh_fixture_compare("a_long_name", want, want, 4, 0.0, tiny, sizeof tiny));
    assert_int_equal(strlen(tiny), sizeof tiny - 1);
}

#define T(fn) cmocka_unit_test(fn)
#define FX(fn) cmocka_unit_test_setup_teardown(fn, setup_loaded, teardown_loaded)
#define TMP(fn) cmocka_unit_test_setup_teardown(fn, setup_tmp, teardown_tmp)

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        FX(test_fixtures_consistent),
        FX(test_fixture_configs),
        FX(test_layout_twins_agree),
        FX(test_amp_fixture_twin),
        T(test_missing_file),
        TMP(test_bad_magic),
        TMP(test_version_mismatch),
        TMP(test_truncated),
        TMP(test_trailing_bytes),
        TMP(test_malformed_tensor),
        T(test_compare),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
