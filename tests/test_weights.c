/* test_weights.c - safetensors and model weights: a file written by a
 * PyTorch ViT loads into vithost and gives PyTorch's logits; a vithost
 * checkpoint holds PyTorch's names, shapes and values (and, where PyTorch is
 * installed, loads back into the PyTorch model); damaged files give one clear
 * error naming the file. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture.h"
#include "optim_state.h"
#include "safetensors.h"
#include "session.h"
#include "weights.h"

static char tmp_dir[256];
static char pt_file[512], fixture_file[512];

static int setup(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/vithost-test-weights-XXXXXX");
    snprintf(pt_file, sizeof pt_file, "%s/vit_token_bf.safetensors", VH_TEST_FIXTURE_DIR);
    snprintf(fixture_file, sizeof fixture_file, "%s/vit_token_bf.vhfx", VH_TEST_FIXTURE_DIR);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A session for the vit_token_bf configuration, its parameters from the
 * init rules; the test data plugin only supplies the image shape and class
 * count. */
static void open_session(vh_run *run, vh_session *t, int classes) {
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "run: {batch_size: 4}\n"
             "model: {plugin: vit, dim: 48, depth: 2, heads: 3, mlp_dim: 96, patch_size: 4}\n"
             "precision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\n"
             "optim: {plugin: test_optim}\n"
             "data: {plugin: test_data, channels: 3, image_size: 16, num_classes: %d}\n",
             classes);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    if (run_open_text(run, "weights.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    if (session_open(t, run, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    if (weights_load_model(t, NULL, VH_WEIGHTS_MODE_STRICT, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
}

static void close_session(vh_run *run, vh_session *t) {
    session_close(t);
    run_close(run);
}

static void forward_fixture(vh_session *t, const vh_fixture *fx, vh_model_output *out) {
    const vh_fixture_array *in = vh_fixture_tensor(fx, "input");
    const vh_fixture_array *lb = vh_fixture_tensor(fx, "labels");
    vh_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.images = (vh_tensor){.data = (void *)in->f32, .dtype = VH_DTYPE_F32, .ndim = 4,
                           .shape = {in->dims[0], in->dims[1], in->dims[2], in->dims[3]}};
    b.labels = (vh_tensor){.data = (void *)lb->i32, .dtype = VH_DTYPE_I32, .ndim = 1,
                           .shape = {lb->dims[0]}};
    b.size = in->dims[0];
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    vh_status st = t->model->forward(t->self[VH_ROLE_MODEL], &b, VH_MODE_EVAL, &t->hooks, out);
    if (st != VH_STATUS_OK) fail_msg("forward: %s", t->run->hosts[VH_ROLE_MODEL].error);
}

/* PyTorch's state_dict file -> vithost -> PyTorch's logits. */
static void test_pytorch_file_gives_pytorch_logits(void **state) {
    (void)state;
    vh_fixture fx;
    char err[512];
    if (vh_fixture_load(fixture_file, &fx, err, sizeof err) != 0) fail_msg("%s", err);
    vh_run run;
    vh_session t;
    open_session(&run, &t, 10);
    vh_diag d = {{0}};
    if (weights_load_model(&t, pt_file, VH_WEIGHTS_MODE_STRICT, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    vh_model_output out;
    forward_fixture(&t, &fx, &out);
    const vh_fixture_array *want = vh_fixture_tensor(&fx, "logits");
    char report[512];
    if (!vh_fixture_compare("logits", out.logits.data, want->f32, want->numel, 1e-4, report,
                            sizeof report))
        fail_msg("%s", report);
    close_session(&run, &t);
    vh_fixture_free(&fx);
}

/* vithost's file has every PyTorch tensor, same name, shape and bits, and
 * loads back into the PyTorch model where PyTorch is installed. */
static void test_checkpoint_loads_into_pytorch(void **state) {
    (void)state;
    vh_fixture fx;
    char err[512];
    if (vh_fixture_load(fixture_file, &fx, err, sizeof err) != 0) fail_msg("%s", err);
    vh_run run;
    vh_session t;
    open_session(&run, &t, 10);
    vh_diag d = {{0}};
    if (weights_load_model(&t, pt_file, VH_WEIGHTS_MODE_STRICT, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    char saved[600];
    snprintf(saved, sizeof saved, "%s/model.safetensors", tmp_dir);
    if (weights_save_model(&t, saved, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    close_session(&run, &t);

    vh_st_file f;
    if (st_read(&f, saved, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    int params = 0;
    for (size_t i = 0; i < fx.tensor_count; i++) {
        const vh_fixture_array *a = &fx.tensors[i];
        if (!strncmp(a->name, "grad.", 5) || !strcmp(a->name, "input") ||
            !strcmp(a->name, "labels") || !strcmp(a->name, "logits") || !strcmp(a->name, "loss"))
            continue;
        const vh_st_tensor *s = st_find(&f, a->name);
        if (!s) fail_msg("the checkpoint lacks '%s'", a->name);
        assert_string_equal(s->dtype, "F32");
        assert_int_equal(s->ndim, (int)a->ndim);
        for (uint32_t k = 0; k < a->ndim; k++) assert_int_equal(s->shape[k], a->dims[k]);
        assert_memory_equal(f.bytes + f.data_start + s->begin, a->f32, a->numel * 4);
        params++;
    }
    assert_int_equal(params, f.count);
    assert_string_equal(st_meta(&f, "format"), "pt");
    st_free(&f);
    vh_fixture_free(&fx);

    if (access("/usr/bin/python3", X_OK) != 0) {
        printf("SKIPPED: PyTorch round trip: /usr/bin/python3 is not installed\n");
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/reference/check_safetensors.py %s %s",
             VH_TEST_SOURCE_DIR, saved, fixture_file);
    int status = system(cmd);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Fine-tuning: another class count gets a fresh head; strict loading says why not. */
static void test_pretrained_new_head(void **state) {
    (void)state;
    vh_run run;
    vh_session t;
    open_session(&run, &t, 7);
    vh_diag d = {{0}};
    assert_int_equal(weights_load_model(&t, pt_file, VH_WEIGHTS_MODE_STRICT, &d),
                     VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(d.text, "head.weight"));
    assert_non_null(strstr(d.text, "(10, 48)"));
    assert_non_null(strstr(d.text, "(7, 48)"));
    if (weights_load_model(&t, pt_file, VH_WEIGHTS_MODE_PRETRAINED, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    /* the body came from the file: pos_embed equals PyTorch's */
    float *embed = malloc((size_t)t.table->units[0].numel * sizeof(float));
    assert_int_equal(t.sharding->store_unit(t.self[VH_ROLE_SHARDING], 0, embed), VH_STATUS_OK);
    vh_st_file f;
    assert_int_equal(st_read(&f, pt_file, &d), VH_STATUS_OK);
    const vh_param_desc *pos = &t.table->units[0].params[1];
    assert_string_equal(pos->name, "pos_embed");
    const vh_st_tensor *s = st_find(&f, "pos_embed");
    assert_memory_equal(embed + pos->offset, f.bytes + f.data_start + s->begin,
                        (size_t)pos->numel * 4);
    st_free(&f);
    free(embed);
    close_session(&run, &t);
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(data, 1, n, f);
    fclose(f);
}

/* A header declaring `json` followed by `data_bytes` zero bytes. */
static const char *make_file(const char *name, const char *json, size_t data_bytes,
                             uint64_t declared_len) {
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    size_t n = strlen(json);
    unsigned char *buf = calloc(1, 8 + n + data_bytes);
    uint64_t len = declared_len ? declared_len : n;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, json, n);
    write_bytes(path, buf, 8 + n + data_bytes);
    free(buf);
    return path;
}

static void expect_error(const char *path, const char *needle) {
    vh_st_file f;
    vh_diag d = {{0}};
    vh_status st = st_read(&f, path, &d);
    st_free(&f);
    assert_int_not_equal(st, VH_STATUS_OK);
    if (!strstr(d.text, path)) fail_msg("'%s' does not name the file", d.text);
    if (!strstr(d.text, needle)) fail_msg("'%s' lacks '%s'", d.text, needle);
}

static void test_damaged_files(void **state) {
    (void)state;
    const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    vh_st_file f;
    vh_diag d = {{0}};
    const char *path = make_file("good.safetensors", ok, 24, 0);
    assert_int_equal(st_read(&f, path, &d), VH_STATUS_OK);
    assert_int_equal(f.count, 1);
    assert_int_equal(f.tensors[0].numel, 6);
    st_free(&f);

    expect_error(make_file("short.safetensors", ok, 10, 0), "truncated");
    expect_error(make_file("hugeheader.safetensors", ok, 24, 1ull << 40), "header length");
    expect_error(make_file("json.safetensors", "{\"w\":{\"dtype\":\"F32\",", 0, 0),
                 "bad header JSON");
    expect_error(make_file("offsets.safetensors",
                           "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}",
                           24, 0),
                 "do not hold");
    expect_error(make_file("dtype.safetensors",
                           "{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                           0),
                 "unknown dtype");
    /* 2^32 x 2^32 values: refused, not wrapped to 0 (UBSan would flag the
     * signed overflow of a product taken before the check). */
    expect_error(make_file("wrap.safetensors",
                           "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                           "\"data_offsets\":[0,0]}}",
                           0, 0),
                 "tensor too large");
    /* Two names sharing bytes, a gap, bytes after the last tensor, a name
     * given twice: each refused, naming the tensors. */
    expect_error(make_file("overlap.safetensors",
                           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                           12, 0),
                 "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
    expect_error(make_file("gap.safetensors",
                           "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                           12, 0),
                 "data bytes [4, 8) belong to no tensor");
    expect_error(make_file("trailing.safetensors", ok, 28, 0),
                 "4 bytes after the last tensor");
    expect_error(make_file("dupname.safetensors",
                           "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                           "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                           8, 0),
                 "tensor 'w' is named twice");
    char tiny[600];
    snprintf(tiny, sizeof tiny, "%s/tiny.safetensors", tmp_dir);
    write_bytes(tiny, "abc", 3);
    expect_error(tiny, "not a safetensors file");
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing.safetensors", tmp_dir);
    expect_error(missing, "No such file");
}

/* F16 and BF16 files are converted on load. */
static void test_half_precision_read(void **state) {
    (void)state;
    const char *json = "{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}";
    char path[600];
    snprintf(path, sizeof path, "%s/half.safetensors", tmp_dir);
    size_t n = strlen(json);
    unsigned char buf[512] = {0};
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, json, n);
    /* f16 1.0 = 0x3c00, -2.0 = 0xc000; bf16 1.0 = 0x3f80, 0.5 = 0x3f00 */
    const unsigned char data[8] = {0x00, 0x3c, 0x00, 0xc0, 0x80, 0x3f, 0x00, 0x3f};
    memcpy(buf + 8 + n, data, 8);
    write_bytes(path, buf, 8 + n + 8);
    vh_st_file f;
    vh_diag d = {{0}};
    assert_int_equal(st_read(&f, path, &d), VH_STATUS_OK);
    float v[2];
    assert_int_equal(st_read_f32(&f, st_find(&f, "h"), v, 2, &d), VH_STATUS_OK);
    assert_true(v[0] == 1.0f && v[1] == -2.0f);
    assert_int_equal(st_read_f32(&f, st_find(&f, "b"), v, 2, &d), VH_STATUS_OK);
    assert_true(v[0] == 1.0f && v[1] == 0.5f);
    assert_int_equal(st_read_f32(&f, st_find(&f, "b"), v, 3, &d), VH_STATUS_ERR_FORMAT);
    /* a piece of a tensor: the second bf16 value alone */
    v[0] = 0.0f;
    assert_int_equal(st_read_f32_range(&f, st_find(&f, "b"), 1, 1, v, &d), VH_STATUS_OK);
    assert_true(v[0] == 0.5f);
    st_free(&f);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* The streaming writer: tensors in declared order, the file appears only
 * when every tensor came (a short or aborted stream leaves the previous file
 * and no .tmp); a range of a tensor reads back alone, and a range outside it
 * is refused naming the tensor. */
static void test_stream_writer(void **state) {
    (void)state;
    char path[600], tmp[700];
    snprintf(path, sizeof path, "%s/stream.safetensors", tmp_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1, -2, -3}, old[3] = {9, 9, 9};
    const int64_t sa[2] = {2, 3}, sb[1] = {3};
    vh_diag d = {{0}};
    vh_st_writer w;

    st_writer_init(&w); /* a previous file at path */
    assert_int_equal(st_writer_add(&w, "old", 1, sb, old, &d), VH_STATUS_OK);
    if (st_writer_save(&w, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    st_writer_free(&w);

    st_writer_init(&w);
    assert_int_equal(st_writer_add(&w, "a", 2, sa, NULL, &d), VH_STATUS_OK);
    assert_int_equal(st_writer_add(&w, "b", 1, sb, NULL, &d), VH_STATUS_OK);
    vh_st_stream s;
    /* short: one of two tensors */
    if (st_stream_open(&s, &w, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_int_equal(st_stream_put(&s, a, &d), VH_STATUS_OK);
    assert_int_equal(st_stream_close(&s, &d), VH_STATUS_ERR_INTERNAL);
    assert_non_null(strstr(d.text, "1 of 2 tensors written"));
    assert_false(file_exists(tmp));
    /* aborted */
    if (st_stream_open(&s, &w, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_true(file_exists(tmp));
    st_stream_abort(&s);
    assert_false(file_exists(tmp));
    vh_st_file f;
    assert_int_equal(st_read(&f, path, &d), VH_STATUS_OK);
    assert_non_null(st_find(&f, "old")); /* untouched */
    st_free(&f);
    /* whole: both, then a third is refused */
    if (st_stream_open(&s, &w, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_int_equal(st_stream_put(&s, a, &d), VH_STATUS_OK);
    assert_int_equal(st_stream_put(&s, b, &d), VH_STATUS_OK);
    if (st_stream_close(&s, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    st_writer_free(&w);
    assert_false(file_exists(tmp));

    assert_int_equal(st_read(&f, path, &d), VH_STATUS_OK);
    assert_int_equal(f.count, 2);
    assert_null(st_find(&f, "old"));
    float v[6];
    assert_int_equal(st_read_f32(&f, st_find(&f, "a"), v, 6, &d), VH_STATUS_OK);
    assert_memory_equal(v, a, sizeof a);
    assert_int_equal(st_read_f32_range(&f, st_find(&f, "b"), 1, 2, v, &d), VH_STATUS_OK);
    assert_true(v[0] == -2.0f && v[1] == -3.0f);
    assert_int_equal(st_read_f32_range(&f, st_find(&f, "b"), 2, 2, v, &d), VH_STATUS_ERR_FORMAT);
    if (!strstr(d.text, "tensor 'b' has 3 values, not elements 2..4"))
        fail_msg("'%s'", d.text);
    st_free(&f);
}

/* ---- the host's own loader and the optimizer state file ------------------- */

/* The test plugins: a model without load_weights (the host loads by name and
 * shape), SGD with momentum (one state slot), printing into `out`. */
static void open_test_session(vh_run *run, vh_session *s, FILE *out) {
    static const char recipe[] =
        "run: {batch_size: 8}\n"
        "model: {plugin: test_model}\nprecision: {plugin: test_precision}\n"
        "sharding: {plugin: test_sharding}\n"
        "optim: {plugin: test_optim, momentum: 0.9}\n"
        "data: {plugin: test_data, image_size: 4, num_classes: 3}\n";
    vh_diag d = {{0}};
    vh_run_options opts = {.out = out};
    if (run_open_text(run, "host.yaml", recipe, &opts, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    if (session_open(s, run, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    if (weights_load_model(s, NULL, VH_WEIGHTS_MODE_STRICT, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
}

static char *stream_text(FILE *f) {
    fflush(f);
    long n = ftell(f);
    char *text = calloc(1, (size_t)n + 1);
    rewind(f);
    if (n > 0 && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = '\0';
    fseek(f, 0, SEEK_END);
    return text;
}

/* The model's tensors plus one it does not have. */
static void write_with_extra(vh_session *s, const char *path) {
    vh_diag d = {{0}};
    vh_st_writer w;
    st_writer_init(&w);
    float *units[2] = {NULL, NULL};
    assert_int_equal(s->table->num_units, 2);
    for (int32_t u = 0; u < 2; u++) {
        units[u] = calloc((size_t)s->table->units[u].numel, sizeof(float));
        assert_int_equal(s->sharding->store_unit(s->self[VH_ROLE_SHARDING], u, units[u]),
                         VH_STATUS_OK);
        for (int32_t p = 0; p < s->table->units[u].num_params; p++) {
            const vh_param_desc *pd = &s->table->units[u].params[p];
            assert_int_equal(st_writer_add(&w, pd->name, pd->ndim, pd->shape,
                                           units[u] + pd->offset, &d),
                             VH_STATUS_OK);
        }
    }
    static const float extra[3] = {1, 2, 3};
    const int64_t shape[1] = {3};
    assert_int_equal(st_writer_add(&w, "extra.bias", 1, shape, extra, &d), VH_STATUS_OK);
    if (st_writer_save(&w, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    st_writer_free(&w);
    free(units[0]);
    free(units[1]);
}

/* Without load_weights the host takes every parameter by name and shape,
 * reports one line, and in STRICT mode refuses tensors nobody looked up. */
static void test_host_loader_and_report(void **state) {
    (void)state;
    FILE *out = tmpfile();
    vh_run run;
    vh_session s;
    open_test_session(&run, &s, out);
    vh_diag d = {{0}};
    char path[600], extra[600];
    snprintf(path, sizeof path, "%s/test_model.safetensors", tmp_dir);
    snprintf(extra, sizeof extra, "%s/test_model_extra.safetensors", tmp_dir);
    if (weights_save_model(&s, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    write_with_extra(&s, extra);

    if (weights_load_model(&s, path, VH_WEIGHTS_MODE_STRICT, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    char *text = stream_text(out);
    char want[800];
    snprintf(want, sizeof want, "vithost: weights from %s: loaded 2 tensor(s)\n", path);
    if (!strstr(text, want)) fail_msg("'%s' not in\n%s", want, text);
    free(text);

    assert_int_equal(weights_load_model(&s, extra, VH_WEIGHTS_MODE_STRICT, &d),
                     VH_STATUS_ERR_FORMAT);
    snprintf(want, sizeof want, "%s holds 1 tensor(s) the test_model model does not have: "
             "extra.bias", extra);
    if (!strstr(d.text, want)) fail_msg("'%s' not in '%s'", want, d.text);

    if (weights_load_model(&s, extra, VH_WEIGHTS_MODE_PRETRAINED, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    text = stream_text(out);
    snprintf(want, sizeof want, "vithost: weights from %s: loaded 2 tensor(s); ignored 1 the "
             "model does not use: extra.bias\n", extra);
    if (!strstr(text, want)) fail_msg("'%s' not in\n%s", want, text);
    free(text);

    /* A file of another model: the missing parameter, by name and shape. */
    assert_int_equal(weights_load_model(&s, pt_file, VH_WEIGHTS_MODE_PRETRAINED, &d),
                     VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(d.text, "has no tensor 'proj.weight' (3, 16) that the test_model "
                                   "model needs"));
    session_close(&s);
    run_close(&run);
    fclose(out);
}

/* The slices' state, as the optimizer sees it (test_sharding: f32 host). */
static void fill_state(vh_session *s, float base) {
    for (int32_t i = 0; i < s->slices.count; i++) {
        vh_param_slice *sl = vh_param_slices_at(&s->slices, i);
        assert_int_equal(sl->state_dtype, VH_DTYPE_F32);
        float *v = sl->state[0];
        for (int64_t k = 0; k < sl->count; k++) v[k] = base + (float)(i * 1000 + k);
    }
}

static void expect_state(vh_session *s, float base) {
    for (int32_t i = 0; i < s->slices.count; i++) {
        vh_param_slice *sl = vh_param_slices_at(&s->slices, i);
        const float *v = sl->state[0];
        for (int64_t k = 0; k < sl->count; k++)
            if (v[k] != base + (float)(i * 1000 + k))
                fail_msg("slice %d element %lld: %g", (int)i, (long long)k, (double)v[k]);
    }
}

/* optim.safetensors: whole tensors under the parameters' names, assembled
 * from the sharding plugin's pieces and served back from them; a file of
 * another optimizer or model is refused naming the tensor. */
static void test_optim_state_file(void **state) {
    (void)state;
    FILE *out = tmpfile();
    vh_run run;
    vh_session s;
    open_test_session(&run, &s, out);
    assert_int_equal(s.state_slots, 1);
    vh_diag d = {{0}};
    char path[600];
    snprintf(path, sizeof path, "%s/optim.safetensors", tmp_dir);
    fill_state(&s, 0.5f);
    if (optim_state_save(&s, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);

    vh_st_file f;
    assert_int_equal(st_read(&f, path, &d), VH_STATUS_OK);
    assert_int_equal(f.count, 2);
    assert_string_equal(st_meta(&f, "format"), "vithost-optim");
    const vh_st_tensor *w = st_find(&f, "proj.weight.optim_state.0");
    assert_non_null(w);
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 3);
    assert_int_equal(w->shape[1], 16);
    assert_non_null(st_find(&f, "proj.bias.optim_state.0"));
    st_free(&f);

    fill_state(&s, -7.0f);
    if (optim_state_load(&s, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    expect_state(&s, 0.5f);

    /* A model file is no optimizer state. */
    char model[600];
    snprintf(model, sizeof model, "%s/model_as_optim.safetensors", tmp_dir);
    if (weights_save_model(&s, model, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_int_equal(optim_state_load(&s, model, &d), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(d.text, "has no optimizer state 'proj.weight.optim_state.0'"));
    expect_state(&s, 0.5f); /* nothing was read */
    session_close(&s);
    run_close(&run);
    fclose(out);
}

/* Overwrites the last n bytes of a file. */
static void patch_tail(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -(long)n, SEEK_END), 0);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* Weights holding NaN or Inf are refused by name in every mode (pretrained
 * as strictly as a checkpoint); finite weights whose logits overflow give
 * an evaluation error, never an accuracy. */
static void test_non_finite_weights(void **state) {
    (void)state;
    FILE *out = tmpfile();
    vh_run run;
    vh_session s;
    open_test_session(&run, &s, out);
    vh_diag d = {{0}};
    char path[600];
    snprintf(path, sizeof path, "%s/nan.safetensors", tmp_dir);
    if (weights_save_model(&s, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    const float nan_value = NAN, inf_value = -INFINITY;
    patch_tail(path, &nan_value, 4);
    for (int mode = 0; mode < 2; mode++) {
        vh_weights_mode m = mode ? VH_WEIGHTS_MODE_PRETRAINED : VH_WEIGHTS_MODE_STRICT;
        assert_int_equal(weights_load_model(&s, path, m, &d), VH_STATUS_ERR_NUMERIC);
        if (!strstr(d.text, path) || !strstr(d.text, "holds NaN"))
            fail_msg("'%s' lacks the file or 'holds NaN'", d.text);
    }
    patch_tail(path, &inf_value, 4);
    assert_int_equal(weights_load_model(&s, path, VH_WEIGHTS_MODE_PRETRAINED, &d),
                     VH_STATUS_ERR_NUMERIC);
    assert_non_null(strstr(d.text, "holds Inf"));

    /* huge but finite: loads, and the logits overflow */
    float huge[48]; /* of the 51 values (3 x 16 weights, 3 biases) */
    for (int i = 0; i < 48; i++) huge[i] = 3e38f;
    patch_tail(path, huge, sizeof huge);
    if (weights_load_model(&s, path, VH_WEIGHTS_MODE_STRICT, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    vh_eval_result r;
    assert_int_equal(session_evaluate(&s, &r, &d), VH_STATUS_ERR_NUMERIC);
    assert_non_null(strstr(d.text, "logits or loss are NaN or Inf"));
    session_close(&s);
    run_close(&run);
    fclose(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pytorch_file_gives_pytorch_logits),
        cmocka_unit_test(test_checkpoint_loads_into_pytorch),
        cmocka_unit_test(test_pretrained_new_head),
        cmocka_unit_test(test_damaged_files),
        cmocka_unit_test(test_half_precision_read),
        cmocka_unit_test(test_stream_writer),
        cmocka_unit_test(test_host_loader_and_report),
        cmocka_unit_test(test_optim_state_file),
        cmocka_unit_test(test_non_finite_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
