/* test_imagefolder.c - the imagefolder data plugin on small image trees.
 *
 * Each test writes a folder tree in a fresh mkdtemp folder: JPEG and PNG
 * images of known content (solid colours, gradients), written here with
 * libjpeg and libpng. The plugin is loaded as vithost loads it (a recipe
 * with the test plugins in the other roles) and driven through its vtable. */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw, setenv */
#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jpeglib.h>
#include <png.h>

#include "runtime.h"

/* ImageNet's defaults, the plugin's. */
static const double MEAN[3] = {0.485, 0.456, 0.406};
static const double STD[3] = {0.229, 0.224, 0.225};

/* ---- writing images --------------------------------------------------- */

typedef struct pixels {
    int w, h, ch; /* ch: 1 (gray), 3 (RGB), 4 (RGBA for PNG, CMYK for JPEG) */
    uint8_t *px;
} pixels;

static pixels px_new(int w, int h, int ch) {
    pixels p = {w, h, ch, calloc((size_t)w * (size_t)h * (size_t)ch, 1)};
    assert_non_null(p.px);
    return p;
}

static pixels px_solid(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
    pixels p = px_new(w, h, 3);
    for (int i = 0; i < w * h; i++) p.px[3 * i] = r, p.px[3 * i + 1] = g, p.px[3 * i + 2] = b;
    return p;
}

/* R = x * rx, G = y * gy, B = b: linear, so bilinear sampling is exact. */
static pixels px_gradient(int w, int h, double rx, double gy, uint8_t b) {
    pixels p = px_new(w, h, 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *q = p.px + 3 * (y * w + x);
            q[0] = (uint8_t)lround(x * rx), q[1] = (uint8_t)lround(y * gy), q[2] = b;
        }
    return p;
}

static void write_png(const char *path, pixels p) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)p.w;
    img.height = (png_uint_32)p.h;
    img.format = p.ch == 1 ? PNG_FORMAT_GRAY : p.ch == 4 ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    if (!png_image_write_to_file(&img, path, 0, p.px, 0, NULL))
        fail_msg("writing %s: %s", path, img.message);
    free(p.px);
}

static void write_jpeg(const char *path, pixels p, int quality) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)p.w;
    c.image_height = (JDIMENSION)p.h;
    c.input_components = p.ch;
    c.in_color_space = p.ch == 1 ? JCS_GRAYSCALE : p.ch == 4 ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    if (quality >= 95) { /* no chroma subsampling: solid colours stay exact-ish */
        for (int i = 0; i < c.num_components; i++)
            c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    }
    jpeg_start_compress(&c, TRUE);
    size_t stride = (size_t)p.w * (size_t)p.ch;
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = p.px + c.next_scanline * stride;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
    free(p.px);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* ---- the temporary tree ----------------------------------------------- */

typedef struct tree {
    char root[64];
} tree;

static void tree_new(tree *t) {
    snprintf(t->root, sizeof t->root, "/tmp/vh_imagefolder_XXXXXX");
    assert_non_null(mkdtemp(t->root));
}

/* Joins root and a relative path (printf-style) into out. */
static const char *tree_path(const tree *t, char *out, size_t cap, const char *fmt, ...) {
    char rel[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    snprintf(out, cap, "%s/%s", t->root, rel);
    return out;
}

/* mkdir -p of a folder under root. */
static void tree_mkdir(const tree *t, const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", t->root, rel);
    for (char *p = path + strlen(t->root) + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void tree_free(tree *t) { nftw(t->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* n small training images in train/a, so batches of up to n fit. */
static void train_filler(const tree *t, int n) {
    char p[1024];
    tree_mkdir(t, "train/a");
    for (int i = 0; i < n; i++)
        write_png(tree_path(t, p, sizeof p, "train/a/fill%d.png", i), px_solid(16, 16, 1, 2, 3));
}

/* ---- the plugin as vithost loads it ----------------------------------- */

typedef struct harness {
    vh_run run;
    const vh_data_vtable *vt;
    void *data;
} harness;

static const char *h_error(harness *h) { return h->run.hosts[VH_ROLE_DATA].error; }

/* Opens a run whose data section is {plugin: imagefolder, <keys>} and
 * creates the plugin; returns create's status (the run stays open). */
static vh_status h_open(harness *h, const char *keys, int64_t batch, int rank, int world,
                        uint64_t seed) {
    memset(h, 0, sizeof *h);
    char recipe[2048];
    snprintf(recipe, sizeof recipe,
             "model: {plugin: test_model}\nprecision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\noptim: {plugin: test_optim}\n"
             "data: {plugin: imagefolder, %s}\n",
             keys);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    if (run_open_text(&h->run, "imagefolder.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    h->vt = h->run.plugins[VH_ROLE_DATA].desc->vtable;
    vh_data_setup setup = {.struct_size = sizeof setup, .rank = rank, .world_size = world,
                           .batch_size = batch, .seed = seed};
    return h->vt->create(&h->run.hosts[VH_ROLE_DATA].pub, &setup, &h->data);
}

static void h_open_ok(harness *h, const char *keys, int64_t batch, uint64_t seed) {
    if (h_open(h, keys, batch, 0, 1, seed) != VH_STATUS_OK) fail_msg("create: %s", h_error(h));
}

static void h_close(harness *h) {
    if (h->data) h->vt->destroy(h->data);
    run_close(&h->run);
}

/* A whole pass, batches concatenated (malloc'd). */
typedef struct pass {
    float *images;
    int32_t *labels;
    int64_t count, batches;
} pass;

static void pass_free(pass *p) {
    free(p->images);
    free(p->labels);
    memset(p, 0, sizeof *p);
}

static vh_status h_pass(harness *h, vh_split split, int64_t epoch, int64_t chw, pass *out) {
    memset(out, 0, sizeof *out);
    vh_status st = h->vt->start_epoch(h->data, split, epoch);
    if (st != VH_STATUS_OK) return st;
    for (;;) {
        vh_batch b;
        int has = 0;
        st = h->vt->next(h->data, &b, &has);
        if (st != VH_STATUS_OK || !has) return st;
        assert_int_equal(b.images.ndim, 4);
        assert_int_equal(b.images.shape[0], b.size);
        assert_int_equal(b.images.shape[1] * b.images.shape[2] * b.images.shape[3], chw);
        assert_int_equal(b.labels.dtype, VH_DTYPE_I32);
        size_t n = (size_t)(out->count + b.size);
        out->images = realloc(out->images, n * (size_t)chw * sizeof(float));
        out->labels = realloc(out->labels, n * sizeof(int32_t));
        memcpy(out->images + out->count * chw, b.images.data,
               (size_t)(b.size * chw) * sizeof(float));
        memcpy(out->labels + out->count, b.labels.data, (size_t)b.size * sizeof(int32_t));
        out->count += b.size;
        out->batches++;
    }
}

static void h_pass_ok(harness *h, vh_split split, int64_t epoch, int64_t chw, pass *out) {
    if (h_pass(h, split, epoch, chw, out) != VH_STATUS_OK) fail_msg("pass: %s", h_error(h));
}

/* The normalised value of byte v in channel c. */
static double norm(int c, double v) { return (v / 255.0 - MEAN[c]) / STD[c]; }
/* ... and back. */
static double denorm(int c, float v) { return (v * STD[c] + MEAN[c]) * 255.0; }

static float at(const float *img, int s, int c, int y, int x) {
    return img[((size_t)c * (size_t)s + (size_t)y) * (size_t)s + (size_t)x];
}

/* Every pixel of image (3, s, s) is (r, g, b) within tol byte levels. */
static void assert_solid(const float *img, int s, const double rgb[3], double tol) {
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < s; y++)
            for (int x = 0; x < s; x++) {
                double got = denorm(c, at(img, s, c, y, x));
                if (fabs(got - rgb[c]) > tol)
                    fail_msg("channel %d (%d, %d): %.3f, expected %.3f +- %.3f", c, y, x, got,
                             rgb[c], tol);
            }
}

/* ---- tests -------------------------------------------------------------- */

/* Classes are the sorted folder names; files are .jpg/.jpeg/.png of any
 * case, sorted; hidden files, other extensions and sub-folders are skipped;
 * eval uses the training classes, even when it lacks some. */
static void test_classes_and_labels(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024];
    tree_mkdir(&t, "train/dog");
    tree_mkdir(&t, "train/cat");
    tree_mkdir(&t, "train/bird/sub");
    tree_mkdir(&t, "train/.cache");
    tree_mkdir(&t, "val/dog");
    tree_mkdir(&t, "val/bird");
    write_png(tree_path(&t, p, sizeof p, "train/bird/b1.png"), px_solid(8, 8, 10, 0, 0));
    write_jpeg(tree_path(&t, p, sizeof p, "train/bird/b0.JPG"), px_solid(8, 8, 20, 0, 0), 95);
    write_png(tree_path(&t, p, sizeof p, "train/bird/sub/deep.png"), px_solid(8, 8, 0, 0, 0));
    write_png(tree_path(&t, p, sizeof p, "train/cat/c0.Png"), px_solid(8, 8, 30, 0, 0));
    write_text(tree_path(&t, p, sizeof p, "train/cat/readme.txt"), "not an image");
    write_text(tree_path(&t, p, sizeof p, "train/cat/.hidden.png"), "not an image either");
    write_jpeg(tree_path(&t, p, sizeof p, "train/dog/d0.jpeg"), px_solid(8, 8, 40, 0, 0), 95);
    write_png(tree_path(&t, p, sizeof p, "train/dog/d1.png"), px_solid(8, 8, 50, 0, 0));
    write_png(tree_path(&t, p, sizeof p, "train/dog/d2.png"), px_solid(8, 8, 60, 0, 0));
    write_png(tree_path(&t, p, sizeof p, "train/.cache/x.png"), px_solid(8, 8, 0, 0, 0));
    write_png(tree_path(&t, p, sizeof p, "val/dog/v0.png"), px_solid(8, 8, 70, 0, 0));
    write_png(tree_path(&t, p, sizeof p, "val/bird/v1.png"), px_solid(8, 8, 80, 0, 0));

    char keys[256];
    snprintf(keys, sizeof keys, "root: %s, image_size: 8, workers: 2", t.root);
    harness h;
    h_open_ok(&h, keys, 1, 0);
    vh_data_info info = {.struct_size = sizeof info};
    assert_int_equal(h.vt->info(h.data, &info), VH_STATUS_OK);
    assert_int_equal(info.channels, 3);
    assert_int_equal(info.height, 8);
    assert_int_equal(info.width, 8);
    assert_int_equal(info.num_classes, 3); /* bird, cat, dog */
    assert_int_equal(info.train_size, 6);
    assert_int_equal(info.eval_size, 2);

    const int64_t chw = 3 * 8 * 8;
    /* eval: in order (bird/v1, dog/v0), labels of the training classes */
    pass e;
    h_pass_ok(&h, VH_SPLIT_EVAL, 0, chw, &e);
    assert_int_equal(e.count, 2);
    assert_int_equal(e.labels[0], 0);
    assert_int_equal(e.labels[1], 2);
    assert_true(fabs(denorm(0, e.images[0]) - 80) < 0.01);
    assert_true(fabs(denorm(0, e.images[chw]) - 70) < 0.01);
    pass_free(&e);

    /* train: every image once per epoch, each with its class's label; the
     * red channel identifies the file (10 * (index in sorted order + 1)). */
    static const int32_t label_of_red[7] = {-1, 0, 0, 1, 2, 2, 2};
    pass tr;
    h_pass_ok(&h, VH_SPLIT_TRAIN, 0, chw, &tr);
    assert_int_equal(tr.count, 6);
    int seen[7] = {0};
    for (int64_t i = 0; i < tr.count; i++) {
        double red = denorm(0, tr.images[i * chw + 3 * 8 + 3]);
        int k = (int)lround(red / 10.0);
        assert_true(k >= 1 && k <= 6);
        assert_true(fabs(red - 10.0 * k) < 2.5); /* JPEG tolerance */
        assert_int_equal(tr.labels[i], label_of_red[k]);
        seen[k]++;
    }
    for (int k = 1; k <= 6; k++) assert_int_equal(seen[k], 1);
    pass_free(&tr);
    h_close(&h);
    tree_free(&t);
}

/* Solid colours decode to their value: PNG exactly, JPEG within its error,
 * also a large JPEG decoded at a reduced DCT scale. */
static void test_solid_colours(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024];
    tree_mkdir(&t, "train/a");
    tree_mkdir(&t, "val/a");
    train_filler(&t, 3);
    write_png(tree_path(&t, p, sizeof p, "val/a/0.png"), px_solid(40, 30, 200, 30, 60));
    write_jpeg(tree_path(&t, p, sizeof p, "val/a/1.jpg"), px_solid(40, 30, 200, 30, 60), 100);
    write_jpeg(tree_path(&t, p, sizeof p, "val/a/2.jpg"), px_solid(500, 375, 20, 160, 240), 95);
    char keys[256];
    snprintf(keys, sizeof keys, "root: %s, image_size: 32", t.root);
    harness h;
    h_open_ok(&h, keys, 2, 0);
    pass e;
    const int64_t chw = 3 * 32 * 32;
    h_pass_ok(&h, VH_SPLIT_EVAL, 0, chw, &e);
    assert_int_equal(e.count, 3);
    assert_int_equal(e.batches, 2);
    /* PNG: exact bytes; the normalised floats match to float precision */
    const double png_rgb[3] = {200, 30, 60};
    for (int c = 0; c < 3; c++)
        for (int64_t k = 0; k < 32 * 32; k++)
            assert_true(fabs(e.images[c * 32 * 32 + k] - norm(c, png_rgb[c])) < 1e-5);
    assert_solid(e.images + chw, 32, png_rgb, 3.0);
    const double big_rgb[3] = {20, 160, 240};
    assert_solid(e.images + 2 * chw, 32, big_rgb, 3.0);
    pass_free(&e);
    h_close(&h);
    tree_free(&t);
}

/* Eval geometry: resize the shorter side to floor(S / crop_pct), center
 * crop. On a linear gradient, output pixel (y, x) samples the source at
 * ((top + y + 0.5) * H / rh - 0.5, (left + x + 0.5) * W / rw - 0.5). */
static void test_eval_geometry(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024];
    tree_mkdir(&t, "train/a");
    tree_mkdir(&t, "val/a");
    train_filler(&t, 3);
    write_png(tree_path(&t, p, sizeof p, "val/a/wide.png"), px_gradient(100, 60, 2.0, 3.0, 9));
    write_png(tree_path(&t, p, sizeof p, "val/a/zz_tall.png"), px_gradient(60, 100, 3.0, 2.0, 9));
    /* a 512-wide gradient JPEG: decoded at 1/8 .. 2/8 scale, then resampled */
    write_jpeg(tree_path(&t, p, sizeof p, "val/a/zzz_big.jpg"), px_gradient(512, 384, 0.25, 0.5, 9),
               100);
    char keys[256];
    snprintf(keys, sizeof keys, "root: %s, image_size: 32, crop_pct: 0.8", t.root);
    harness h;
    h_open_ok(&h, keys, 3, 0);
    pass e;
    const int s = 32;
    h_pass_ok(&h, VH_SPLIT_EVAL, 0, 3 * s * s, &e);
    assert_int_equal(e.count, 3);
    /* wide 100x60: short side 60 -> 40, long int(40 * 100 / 60) = 66; crop at
     * left round(34 / 2) = 17, top round(8 / 2) = 4 */
    static const int probe[][2] = {{0, 0}, {0, 31}, {31, 0}, {31, 31}, {16, 7}, {5, 20}};
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
        int y = probe[k][0], x = probe[k][1];
        double sx = (17 + x + 0.5) * 100.0 / 66.0 - 0.5, sy = (4 + y + 0.5) * 60.0 / 40.0 - 0.5;
        assert_true(fabs(denorm(0, at(e.images, s, 0, y, x)) - 2.0 * sx) < 0.6);
        assert_true(fabs(denorm(1, at(e.images, s, 1, y, x)) - 3.0 * sy) < 0.6);
        assert_true(fabs(denorm(2, at(e.images, s, 2, y, x)) - 9.0) < 1e-3);
    }
    /* tall 60x100: short side 60 -> 40, long 66; left 4, top 17 */
    const float *tall = e.images + 3 * s * s;
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
        int y = probe[k][0], x = probe[k][1];
        double sx = (4 + x + 0.5) * 60.0 / 40.0 - 0.5, sy = (17 + y + 0.5) * 100.0 / 66.0 - 0.5;
        assert_true(fabs(denorm(0, at(tall, s, 0, y, x)) - 3.0 * sx) < 0.6);
        assert_true(fabs(denorm(1, at(tall, s, 1, y, x)) - 2.0 * sy) < 0.6);
    }
    /* big 512x384: short 384 -> 40, long int(40 * 512 / 384) = 53; left
     * round(21 / 2) = 10 (half to even), top 4. JPEG + DCT scaling: a few levels. */
    const float *big = e.images + 6 * s * s;
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) {
        int y = probe[k][0], x = probe[k][1];
        double sx = (10 + x + 0.5) * 512.0 / 53.0 - 0.5, sy = (4 + y + 0.5) * 384.0 / 40.0 - 0.5;
        double r = denorm(0, at(big, s, 0, y, x)), g = denorm(1, at(big, s, 1, y, x));
        if (fabs(r - 0.25 * sx) > 3.0 || fabs(g - 0.5 * sy) > 3.0)
            fail_msg("big (%d, %d): got (%.2f, %.2f), expected (%.2f, %.2f)", y, x, r, g,
                     0.25 * sx, 0.5 * sy);
    }
    pass_free(&e);
    h_close(&h);
    tree_free(&t);
}

/* One training image over epochs: the same seed and epoch give the same
 * crop, other epochs and seeds give others; values stay within the image. */
static void test_train_determinism(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024];
    tree_mkdir(&t, "train/a");
    write_png(tree_path(&t, p, sizeof p, "train/a/g.png"), px_gradient(120, 90, 2.0, 2.5, 50));
    char keys[256];
    snprintf(keys, sizeof keys, "root: %s, image_size: 24, eval_dir: none", t.root);
    const int64_t chw = 3 * 24 * 24;
    harness h1, h2;
    h_open_ok(&h1, keys, 1, 7);
    h_open_ok(&h2, keys, 1, 7);
    pass a[6], b;
    for (int epoch = 0; epoch < 6; epoch++) h_pass_ok(&h1, VH_SPLIT_TRAIN, epoch, chw, &a[epoch]);
    /* a second instance, epochs in another order */
    for (int epoch = 5; epoch >= 0; epoch -= 2) {
        h_pass_ok(&h2, VH_SPLIT_TRAIN, epoch, chw, &b);
        assert_memory_equal(a[epoch].images, b.images, (size_t)chw * sizeof(float));
        pass_free(&b);
    }
    int distinct = 0;
    for (int epoch = 1; epoch < 6; epoch++)
        distinct += memcmp(a[0].images, a[epoch].images, (size_t)chw * sizeof(float)) != 0;
    assert_int_equal(distinct, 5);
    for (int64_t k = 0; k < chw; k++) {
        int c = (int)(k / (24 * 24));
        double v = denorm(c, a[0].images[k]);
        assert_true(v > -0.01 && v < 255.01);
    }
    h_close(&h2);
    /* another seed, another crop */
    h_open_ok(&h2, keys, 1, 8);
    h_pass_ok(&h2, VH_SPLIT_TRAIN, 0, chw, &b);
    assert_true(memcmp(a[0].images, b.images, (size_t)chw * sizeof(float)) != 0);
    pass_free(&b);
    for (int epoch = 0; epoch < 6; epoch++) pass_free(&a[epoch]);
    /* no evaluation split: a clear error when asked for one */
    assert_int_equal(h1.vt->start_epoch(h1.data, VH_SPLIT_EVAL, 0), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(h_error(&h1), "/none does not exist"));
    h_close(&h1);
    h_close(&h2);
    tree_free(&t);
}

/* With random_resized_crop off, training is the eval crop, mirrored in
 * about half of the epochs; with hflip off, never. */
static void test_flip(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024];
    tree_mkdir(&t, "train/a");
    tree_mkdir(&t, "val/a");
    write_png(tree_path(&t, p, sizeof p, "train/a/g.png"), px_gradient(80, 64, 3.0, 1.0, 7));
    write_png(tree_path(&t, p, sizeof p, "val/a/g.png"), px_gradient(80, 64, 3.0, 1.0, 7));
    const int s = 16;
    const int64_t chw = 3 * s * s;
    for (int hflip = 0; hflip <= 1; hflip++) {
        char keys[256];
        snprintf(keys, sizeof keys,
                 "root: %s, image_size: %d, random_resized_crop: false, hflip: %s", t.root, s,
                 hflip ? "true" : "false");
        harness h;
        h_open_ok(&h, keys, 1, 3);
        pass e;
        h_pass_ok(&h, VH_SPLIT_EVAL, 0, chw, &e);
        int plain = 0, mirrored = 0;
        for (int epoch = 0; epoch < 24; epoch++) {
            pass tr;
            h_pass_ok(&h, VH_SPLIT_TRAIN, epoch, chw, &tr);
            int same = !memcmp(tr.images, e.images, (size_t)chw * sizeof(float)), mirror = 1;
            for (int c = 0; c < 3; c++)
                for (int y = 0; y < s; y++)
                    for (int x = 0; x < s; x++)
                        mirror &= at(tr.images, s, c, y, x) == at(e.images, s, c, y, s - 1 - x);
            assert_true(same || mirror);
            plain += same;
            mirrored += mirror;
            pass_free(&tr);
        }
        if (hflip) {
            assert_true(plain > 0 && mirrored > 0);
        } else {
            assert_int_equal(plain, 24);
            assert_int_equal(mirrored, 0);
        }
        pass_free(&e);
        h_close(&h);
    }
    tree_free(&t);
}

/* A grayscale PNG (and JPEG) come out as three equal channels. */
static void test_grayscale(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024];
    tree_mkdir(&t, "train/a");
    tree_mkdir(&t, "val/a");
    train_filler(&t, 3);
    pixels g = px_new(30, 20, 1);
    memset(g.px, 77, 30 * 20);
    write_png(tree_path(&t, p, sizeof p, "val/a/gray.png"), g);
    g = px_new(30, 20, 1);
    memset(g.px, 150, 30 * 20);
    write_jpeg(tree_path(&t, p, sizeof p, "val/a/gray.jpg"), g, 95);
    char keys[256];
    snprintf(keys, sizeof keys,
             "root: %s, image_size: 16, mean: \"0.5, 0.5, 0.5\", std: 0.5 0.25 1", t.root);
    harness h;
    h_open_ok(&h, keys, 2, 0);
    pass e;
    const int64_t plane = 16 * 16;
    h_pass_ok(&h, VH_SPLIT_EVAL, 0, 3 * plane, &e);
    assert_int_equal(e.count, 2);
    /* sorted: gray.jpg, gray.png; mean 0.5, std (0.5, 0.25, 1) */
    static const double stdv[3] = {0.5, 0.25, 1.0};
    for (int c = 0; c < 3; c++)
        for (int64_t k = 0; k < plane; k++) {
            double jpg = (e.images[c * plane + k] * stdv[c] + 0.5) * 255.0;
            double png = (e.images[3 * plane + c * plane + k] * stdv[c] + 0.5) * 255.0;
            assert_true(fabs(jpg - 150.0) < 2.0);
            assert_true(fabs(png - 77.0) < 1e-3);
        }
    pass_free(&e);
    h_close(&h);
    tree_free(&t);
}

/* An RGBA PNG loses its alpha (as PIL's convert("RGB")); a CMYK JPEG with
 * an Adobe marker (libjpeg writes one) holds inverted CMYK: RGB = C * K / 255. */
static void test_alpha_and_cmyk(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024];
    train_filler(&t, 2);
    tree_mkdir(&t, "val/a");
    pixels q = px_new(24, 20, 4);
    for (int i = 0; i < 24 * 20; i++)
        q.px[4 * i] = 10, q.px[4 * i + 1] = 120, q.px[4 * i + 2] = 240,
                 q.px[4 * i + 3] = (uint8_t)i;
    write_png(tree_path(&t, p, sizeof p, "val/a/0_rgba.png"), q);
    q = px_new(24, 20, 4);
    for (int i = 0; i < 24 * 20; i++)
        q.px[4 * i] = 200, q.px[4 * i + 1] = 100, q.px[4 * i + 2] = 50, q.px[4 * i + 3] = 128;
    write_jpeg(tree_path(&t, p, sizeof p, "val/a/1_cmyk.jpg"), q, 100);
    char keys[256];
    snprintf(keys, sizeof keys, "root: %s, image_size: 16", t.root);
    harness h;
    h_open_ok(&h, keys, 2, 0);
    pass e;
    h_pass_ok(&h, VH_SPLIT_EVAL, 0, 3 * 16 * 16, &e);
    assert_int_equal(e.count, 2);
    const double rgba[3] = {10, 120, 240}, cmyk[3] = {200 * 128 / 255.0, 100 * 128 / 255.0,
                                                      50 * 128 / 255.0};
    assert_solid(e.images, 16, rgba, 1e-3);
    assert_solid(e.images + 3 * 16 * 16, 16, cmyk, 2.0);
    pass_free(&e);
    h_close(&h);
    tree_free(&t);
}

/* Bad images fail `next` with one message naming the file; bad folders fail
 * create naming the folder. */
static void test_errors(void **state) {
    (void)state;
    tree t;
    tree_new(&t);
    char p[1024], keys[512];
    tree_mkdir(&t, "train/a");
    tree_mkdir(&t, "val/a");
    write_png(tree_path(&t, p, sizeof p, "train/a/ok.png"), px_solid(16, 16, 1, 2, 3));
    /* a truncated JPEG: its first half */
    write_jpeg(tree_path(&t, p, sizeof p, "val/a/cut.jpg"), px_gradient(64, 64, 3.0, 3.0, 0), 90);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size / 2), 0);
    snprintf(keys, sizeof keys, "root: %s, image_size: 16", t.root);
    harness h;
    h_open_ok(&h, keys, 1, 0);
    pass e;
    assert_int_equal(h_pass(&h, VH_SPLIT_EVAL, 0, 3 * 16 * 16, &e), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(h_error(&h), "val/a/cut.jpg: truncated JPEG"));
    pass_free(&e);
    h_close(&h);
    remove(p);

    /* a .png that is not a PNG */
    write_text(tree_path(&t, p, sizeof p, "val/a/fake.png"), "<html>not a picture</html>");
    for (int workers = 0; workers <= 2; workers += 2) {
        snprintf(keys, sizeof keys, "root: %s, image_size: 16, workers: %d", t.root, workers);
        h_open_ok(&h, keys, 1, 0);
        assert_int_equal(h_pass(&h, VH_SPLIT_EVAL, 0, 3 * 16 * 16, &e), VH_STATUS_ERR_FORMAT);
        assert_non_null(strstr(h_error(&h), "val/a/fake.png: not a JPEG or PNG image"));
        /* the pass stays failed until the next start */
        vh_batch b;
        int has = 1;
        assert_int_equal(h.vt->next(h.data, &b, &has), VH_STATUS_ERR_FORMAT);
        assert_int_equal(has, 0);
        pass_free(&e);
        h_close(&h);
    }
    remove(p);
    /* a PNG cut short */
    write_png(tree_path(&t, p, sizeof p, "val/a/cut.png"), px_gradient(64, 64, 3.0, 3.0, 0));
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size - 20), 0);
    snprintf(keys, sizeof keys, "root: %s, image_size: 16", t.root);
    h_open_ok(&h, keys, 1, 0);
    assert_int_equal(h_pass(&h, VH_SPLIT_EVAL, 0, 3 * 16 * 16, &e), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(h_error(&h), "val/a/cut.png: corrupt PNG"));
    pass_free(&e);
    h_close(&h);
    remove(p);
    write_png(p, px_solid(4, 4, 0, 0, 0));

    /* an empty class folder */
    tree_mkdir(&t, "train/empty");
    write_text(tree_path(&t, p, sizeof p, "train/empty/notes.txt"), "no images here");
    assert_int_equal(h_open(&h, keys, 1, 0, 1, 0), VH_STATUS_ERR_FORMAT);
    char want[1024];
    snprintf(want, sizeof want, "class folder %s/train/empty has no images", t.root);
    if (!strstr(h_error(&h), want)) fail_msg("'%s' lacks '%s'", h_error(&h), want);
    h_close(&h);
    remove(p);
    rmdir(tree_path(&t, p, sizeof p, "train/empty"));

    /* an eval class that training lacks */
    tree_mkdir(&t, "val/zebra");
    write_png(tree_path(&t, p, sizeof p, "val/zebra/z.png"), px_solid(4, 4, 0, 0, 0));
    assert_int_equal(h_open(&h, keys, 1, 0, 1, 0), VH_STATUS_ERR_FORMAT);
    snprintf(want, sizeof want, "%s/val/zebra is not one of the 1 classes", t.root);
    if (!strstr(h_error(&h), want)) fail_msg("'%s' lacks '%s'", h_error(&h), want);
    h_close(&h);

    /* a missing root, a root without the training folder */
    snprintf(keys, sizeof keys, "root: %s/nowhere", t.root);
    assert_int_equal(h_open(&h, keys, 1, 0, 1, 0), VH_STATUS_ERR_CONFIG);
    snprintf(want, sizeof want, "cannot open the folder %s/nowhere", t.root);
    if (!strstr(h_error(&h), want)) fail_msg("'%s' lacks '%s'", h_error(&h), want);
    assert_non_null(strstr(h_error(&h), "imagefolder.yaml:5:"));
    h_close(&h);
    snprintf(keys, sizeof keys, "root: %s, train_dir: training", t.root);
    assert_int_equal(h_open(&h, keys, 1, 0, 1, 0), VH_STATUS_ERR_CONFIG);
    snprintf(want, sizeof want, "the training split %s/training does not exist", t.root);
    if (!strstr(h_error(&h), want)) fail_msg("'%s' lacks '%s'", h_error(&h), want);
    h_close(&h);

    /* a bad mean */
    snprintf(keys, sizeof keys, "root: %s, mean: \"0.5,0.5\"", t.root);
    assert_int_equal(h_open(&h, keys, 1, 0, 1, 0), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(h_error(&h), "data.mean: '0.5,0.5' is not three numbers"));
    h_close(&h);
    snprintf(keys, sizeof keys, "root: %s, std: \"0.2,0,0.2\"", t.root);
    assert_int_equal(h_open(&h, keys, 1, 0, 1, 0), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(h_error(&h), "every value must be > 0"));
    h_close(&h);
    tree_free(&t);
}

/* A tree of 13 varied images, 3 classes, for the batching tests. */
static void make_varied(tree *t) {
    char p[1024];
    tree_new(t);
    tree_mkdir(t, "train/a");
    tree_mkdir(t, "train/b");
    tree_mkdir(t, "train/c");
    tree_mkdir(t, "val/a");
    tree_mkdir(t, "val/c");
    for (int i = 0; i < 13; i++) {
        char cls = (char)('a' + i % 3);
        pixels px = px_gradient(40 + 7 * i, 90 - 3 * i, 0.5 + 0.1 * i, 1.0, (uint8_t)(10 * i));
        if (i % 2)
            write_png(tree_path(t, p, sizeof p, "train/%c/%02d.png", cls, i), px);
        else
            write_jpeg(tree_path(t, p, sizeof p, "train/%c/%02d.jpg", cls, i), px, 90);
    }
    for (int i = 0; i < 5; i++)
        write_jpeg(tree_path(t, p, sizeof p, "val/%c/%02d.jpg", i % 2 ? 'a' : 'c', i),
                   px_gradient(50 + 5 * i, 60, 1.0, 2.0, 3), 90);
}

/* 1, 3 workers and none give the same batches, bit for bit. */
static void test_workers_identical(void **state) {
    (void)state;
    tree t;
    make_varied(&t);
    const int64_t chw = 3 * 20 * 20;
    pass ref_tr[2] = {{0}}, ref_ev = {0};
    static const int workers[] = {1, 3, 0};
    for (size_t k = 0; k < 3; k++) {
        char keys[256];
        snprintf(keys, sizeof keys, "root: %s, image_size: 20, workers: %d", t.root, workers[k]);
        harness h;
        h_open_ok(&h, keys, 4, 11);
        for (int epoch = 0; epoch < 2; epoch++) {
            pass tr;
            h_pass_ok(&h, VH_SPLIT_TRAIN, epoch, chw, &tr);
            assert_int_equal(tr.batches, 3); /* 13 images: 3 full batches of 4 */
            if (k == 0) {
                ref_tr[epoch] = tr;
                continue;
            }
            assert_memory_equal(tr.labels, ref_tr[epoch].labels, 12 * sizeof(int32_t));
            assert_memory_equal(tr.images, ref_tr[epoch].images,
                                (size_t)(12 * chw) * sizeof(float));
            pass_free(&tr);
        }
        pass ev;
        h_pass_ok(&h, VH_SPLIT_EVAL, 0, chw, &ev);
        assert_int_equal(ev.count, 5);
        assert_int_equal(ev.batches, 2); /* 4 + 1 */
        if (k == 0) {
            ref_ev = ev;
        } else {
            assert_memory_equal(ev.images, ref_ev.images, (size_t)(5 * chw) * sizeof(float));
            pass_free(&ev);
        }
        h_close(&h);
    }
    assert_true(memcmp(ref_tr[0].labels, ref_tr[1].labels, 12 * sizeof(int32_t)) != 0 ||
                memcmp(ref_tr[0].images, ref_tr[1].images, (size_t)(12 * chw) * sizeof(float)));
    pass_free(&ref_tr[0]);
    pass_free(&ref_tr[1]);
    pass_free(&ref_ev);
    tree_free(&t);
}

/* Two ranks: the same number of full training batches, disjoint samples;
 * eval covers every image once. A saved position resumes the same batches. */
static void test_ranks_and_resume(void **state) {
    (void)state;
    tree t;
    make_varied(&t);
    const int64_t chw = 3 * 16 * 16;
    char keys[256];
    snprintf(keys, sizeof keys, "root: %s, image_size: 16", t.root);
    harness h[2];
    pass tr[2], ev[2];
    for (int r = 0; r < 2; r++) {
        if (h_open(&h[r], keys, 3, r, 2, 5) != VH_STATUS_OK) fail_msg("%s", h_error(&h[r]));
        h_pass_ok(&h[r], VH_SPLIT_TRAIN, 4, chw, &tr[r]);
        h_pass_ok(&h[r], VH_SPLIT_EVAL, 0, chw, &ev[r]);
    }
    assert_int_equal(tr[0].batches, 2); /* 13 / 2 = 6 per rank: 2 batches of 3 */
    assert_int_equal(tr[1].batches, 2);
    for (int64_t i = 0; i < 6; i++)
        for (int64_t j = 0; j < 6; j++)
            assert_true(memcmp(tr[0].images + i * chw, tr[1].images + j * chw, 64) != 0);
    assert_int_equal(ev[0].batches, ev[1].batches);
    assert_int_equal(ev[0].count + ev[1].count, 5);

    /* resume rank 0 after its first batch, in a new instance */
    assert_int_equal(h[0].vt->start_epoch(h[0].data, VH_SPLIT_TRAIN, 4), VH_STATUS_OK);
    vh_batch b;
    int has;
    assert_int_equal(h[0].vt->next(h[0].data, &b, &has), VH_STATUS_OK);
    size_t bytes;
    assert_int_equal(h[0].vt->state_size(h[0].data, &bytes), VH_STATUS_OK);
    void *blob = malloc(bytes);
    assert_int_equal(h[0].vt->state_save(h[0].data, blob, bytes), VH_STATUS_OK);
    harness again;
    if (h_open(&again, keys, 3, 0, 2, 5) != VH_STATUS_OK) fail_msg("%s", h_error(&again));
    assert_int_equal(again.vt->state_load(again.data, blob, bytes), VH_STATUS_OK);
    assert_int_equal(again.vt->next(again.data, &b, &has), VH_STATUS_OK);
    assert_int_equal(has, 1);
    assert_memory_equal(b.images.data, tr[0].images + 3 * chw, (size_t)(3 * chw) * sizeof(float));
    assert_memory_equal(b.labels.data, tr[0].labels + 3, 3 * sizeof(int32_t));
    assert_int_equal(again.vt->next(again.data, &b, &has), VH_STATUS_OK);
    assert_int_equal(has, 0);
    assert_int_equal(again.vt->next(again.data, &b, &has), VH_STATUS_OK); /* still over */
    assert_int_equal(has, 0);
    h_close(&again);
    /* rank 1 given rank 0's state goes on with its own share at the same
     * point (a resume writes rank 0's state for all); another seed is
     * another order, refused */
    if (h_open(&again, keys, 3, 1, 2, 5) != VH_STATUS_OK) fail_msg("%s", h_error(&again));
    assert_int_equal(again.vt->state_load(again.data, blob, bytes), VH_STATUS_OK);
    assert_int_equal(again.vt->next(again.data, &b, &has), VH_STATUS_OK);
    assert_int_equal(has, 1);
    assert_memory_equal(b.images.data, tr[1].images + 3 * chw, (size_t)(3 * chw) * sizeof(float));
    h_close(&again);
    if (h_open(&again, keys, 3, 1, 2, 6) != VH_STATUS_OK) fail_msg("%s", h_error(&again));
    assert_int_not_equal(again.vt->state_load(again.data, blob, bytes), VH_STATUS_OK);
    h_close(&again);
    free(blob);
    for (int r = 0; r < 2; r++) {
        pass_free(&tr[r]);
        pass_free(&ev[r]);
        h_close(&h[r]);
    }
    tree_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classes_and_labels), cmocka_unit_test(test_solid_colours),
        cmocka_unit_test(test_eval_geometry),      cmocka_unit_test(test_train_determinism),
        cmocka_unit_test(test_flip),               cmocka_unit_test(test_grayscale),
        cmocka_unit_test(test_alpha_and_cmyk),     cmocka_unit_test(test_errors),
        cmocka_unit_test(test_workers_identical),  cmocka_unit_test(test_ranks_and_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
