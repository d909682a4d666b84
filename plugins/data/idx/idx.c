/* idx.c - the `idx` data plugin: MNIST-format IDX files (MNIST, Fashion-MNIST,
 * KMNIST, ...), gzipped or not.
 *
 * At create the four files (train/eval images and labels) are read whole
 * into memory as bytes and checked: magic (0x00000803 images, 0x00000801
 * labels), dimensions, payload length against the header (truncated or
 * trailing bytes), label count against image count, labels below
 * num_classes. Each problem is one line naming the file and what is wrong.
 *
 * Pixels become f32 per batch, on prefetch worker threads:
 *
 *     x = (p / 255 - mean) / std
 *
 * with mean 0.2860 and std 0.3530 by default, the statistics of the
 * Fashion-MNIST training images (MNIST: 0.1307 and 0.3081). Images are (B,
 * 1, rows, cols). Training may augment, with draws keyed by (seed, epoch,
 * sample) so that batches repeat whatever the worker timing: `pad_crop: p`
 * takes a random rows x cols window of the image zero-padded (black, before
 * normalisation) by p pixels on every side, then `hflip` mirrors it with
 * probability 1/2. Evaluation never augments.
 *
 * Order and per-rank split: vh_sampler (shuffled per epoch for training,
 * in order and every sample once for evaluation).
 *
 * Passes: start_epoch(EVAL) in the middle of a training pass (the host's
 * eval_every_steps) suspends that pass; once the eval pass has ended (next
 * said has_batch = 0), next continues the training pass where it stood.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

#include "vithost/vithost.h"
#include "vithost/vh_prefetch.h"
#include "vithost/vh_sampler.h"

#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dimension */
#define IDX_MAX_SIDE 4096
#define PATH_LEN 4096

static const vh_config_key schema[] = {
    {"root", VH_CONFIG_TYPE_PATH, "/usr/share/datasets/fashion-mnist",
     "folder of the four IDX files", NULL, 0, 0, 0},
    {"train_images", VH_CONFIG_TYPE_STRING, "train-images-idx3-ubyte.gz",
     "training images under root (the name without .gz is tried when absent, and the reverse)",
     NULL, 0, 0, 0},
    {"train_labels", VH_CONFIG_TYPE_STRING, "train-labels-idx1-ubyte.gz",
     "training labels under root", NULL, 0, 0, 0},
    {"eval_images", VH_CONFIG_TYPE_STRING, "t10k-images-idx3-ubyte.gz",
     "evaluation images under root", NULL, 0, 0, 0},
    {"eval_labels", VH_CONFIG_TYPE_STRING, "t10k-labels-idx1-ubyte.gz",
     "evaluation labels under root", NULL, 0, 0, 0},
    {"num_classes", VH_CONFIG_TYPE_INT, "10", "classes; every label must be below", NULL, 1, 256,
     0},
    {"mean", VH_CONFIG_TYPE_FLOAT, "0.2860",
     "x = (pixel/255 - mean) / std; 0.2860 is Fashion-MNIST's (MNIST: 0.1307)", NULL, 0, 0, 0},
    {"std", VH_CONFIG_TYPE_FLOAT, "0.3530", "see mean; 0.3530 is Fashion-MNIST's (MNIST: 0.3081)",
     NULL, 0, 0, 0},
    {"workers", VH_CONFIG_TYPE_INT, "1",
     "threads converting batches ahead of training; 0: on the training thread", NULL, 0, 64, 0},
    {"prefetch", VH_CONFIG_TYPE_INT, "4", "batch slots: the one in use plus those filled ahead",
     NULL, 1, 64, 0},
    {"pad_crop", VH_CONFIG_TYPE_INT, "0",
     "training: random crop of the image zero-padded by this many pixels per side", NULL, 0, 64, 0},
    {"hflip", VH_CONFIG_TYPE_BOOL, "false", "training: mirror left-right with probability 1/2",
     NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

typedef struct idx_set {
    char images_path[PATH_LEN], labels_path[PATH_LEN];
    int64_t count;
    uint8_t *pixels; /* (count, rows, cols) */
    uint8_t *labels; /* (count) */
} idx_set;

typedef struct idx_data {
    vh_host *host;
    int64_t batch_size;
    int32_t rows, cols, classes;
    int32_t pad_crop, hflip;
    float lut[256]; /* pixel byte -> normalised value */

    idx_set sets[2];           /* by vh_split */
    vh_sampler *samplers[2];   /* by vh_split */
    vh_prefetch *prefetch;

    /* the pass; set before vh_prefetch_start, read by the workers after */
    /* The current pass (`split`; read by the workers, changed only while
     * the prefetcher is stopped), and a training pass an eval pass
     * interrupted, which goes on at train_cursor once the eval pass ends. */
    int active;
    vh_split split;
    int train_suspended;
    int64_t train_cursor;
} idx_data;

/* ---- reading IDX files ---------------------------------------------------- */

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* root/name (name as is when absolute); when that file is absent, the same
 * name without ".gz" (or with it). */
static vh_status resolve_path(vh_host *host, const char *root, const char *key, const char *name,
                              char *out) {
    char first[PATH_LEN], alt[PATH_LEN];
    int n = name[0] == '/' ? snprintf(first, sizeof first, "%s", name)
                           : snprintf(first, sizeof first, "%s/%s", root, name);
    if (n < 0 || n >= (int)sizeof first)
        return host->api->config_fail(host, key, "path of '%s' under '%s' is too long", name, root);
    if (file_exists(first)) {
        memcpy(out, first, (size_t)n + 1);
        return VH_STATUS_OK;
    }
    if (ends_with(first, ".gz"))
        snprintf(alt, sizeof alt, "%.*s", n - 3, first);
    else if (snprintf(alt, sizeof alt, "%s.gz", first) >= (int)sizeof alt)
        alt[0] = '\0';
    if (alt[0] && file_exists(alt)) {
        snprintf(out, PATH_LEN, "%s", alt);
        return VH_STATUS_OK;
    }
    return host->api->fail(host, VH_STATUS_ERR_IO, "%s: cannot open: %s (key %s; also tried %s)",
                           first, strerror(ENOENT), key, alt);
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* Reads up to `want` bytes; returns how many, or -1 with the gzip error text. */
static int64_t gz_read_all(gzFile gz, void *buf, int64_t want, const char **error) {
    int64_t got = 0;
    unsigned char *p = buf;
    while (got < want) {
        int64_t left = want - got;
        unsigned chunk = left > (1 << 30) ? (1u << 30) : (unsigned)left;
        int r = gzread(gz, p + got, chunk);
        if (r < 0) {
            int errnum = 0;
            *error = gzerror(gz, &errnum);
            return errnum == Z_BUF_ERROR ? got : -1; /* truncated stream: what came */
        }
        if (r == 0) break;
        got += r;
    }
    return got;
}

/* The uncompressed length mod 2^32 a gzip file's trailer records; 0 when unreadable. */
static uint32_t gz_trailer_size(const char *path) {
    unsigned char b[4];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int ok = fseek(f, -4, SEEK_END) == 0 && fread(b, 1, 4, f) == 4;
    fclose(f);
    if (!ok) return 0;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Counts the bytes left in the stream (for the message about a long file). */
static int64_t gz_count_rest(gzFile gz) {
    unsigned char buf[65536];
    int64_t n = 0;
    int r;
    while ((r = gzread(gz, buf, sizeof buf)) > 0) n += r;
    return n;
}

static const char *magic_kind(uint32_t magic) {
    if (magic == IDX_MAGIC_IMAGES) return " (an IDX image file)";
    if (magic == IDX_MAGIC_LABELS) return " (an IDX label file)";
    return " (not an IDX file of unsigned bytes)";
}

/* One IDX file of unsigned bytes: images (ndim 3) or labels (ndim 1). On
 * success *data (host memory) holds the payload and dims[] the sizes. */
static vh_status read_idx(vh_host *host, const char *path, int images, int64_t dims[3],
                          uint8_t **data) {
    const uint32_t magic_want = images ? IDX_MAGIC_IMAGES : IDX_MAGIC_LABELS;
    const int ndim = images ? 3 : 1;
    const int header = 4 + 4 * ndim;
    const char *what = images ? "image" : "label";
    *data = NULL;

    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return host->api->fail(host, VH_STATUS_ERR_IO, "%s: cannot open: %s", path,
                               strerror(errno ? errno : ENOMEM));
    gzbuffer(gz, 1 << 17);
    const char *gzmsg = NULL;
    unsigned char h[16];
    int64_t got = gz_read_all(gz, h, header, &gzmsg);
    vh_status st = VH_STATUS_OK;
    if (got < 0) {
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s: cannot read: %s", path, gzmsg);
        goto done;
    }
    if (got >= 4 && be32(h) != magic_want) {
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                             "%s: wrong magic 0x%08x%s, expected 0x%08x for an IDX %s file", path,
                             (unsigned)be32(h), magic_kind(be32(h)), (unsigned)magic_want, what);
        goto done;
    }
    if (got < header) {
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                             "%s: truncated: %lld bytes, shorter than the %d-byte IDX %s header",
                             path, (long long)got, header, what);
        goto done;
    }
    for (int k = 0; k < ndim; k++) dims[k] = be32(h + 4 + 4 * k);
    if (dims[0] < 1 || dims[0] > INT32_MAX) {
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s: header says %lld %ss", path,
                             (long long)dims[0], what);
        goto done;
    }
    char desc[128]; /* "60000 images of 28x28" */
    int64_t payload = dims[0];
    if (images) {
        if (dims[1] < 1 || dims[1] > IDX_MAX_SIDE || dims[2] < 1 || dims[2] > IDX_MAX_SIDE) {
            st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                 "%s: header says images of %lldx%lld; sides must be 1..%d", path,
                                 (long long)dims[1], (long long)dims[2], IDX_MAX_SIDE);
            goto done;
        }
        payload *= dims[1] * dims[2];
        snprintf(desc, sizeof desc, "%lld images of %lldx%lld", (long long)dims[0],
                 (long long)dims[1], (long long)dims[2]);
    } else {
        snprintf(desc, sizeof desc, "%lld labels", (long long)dims[0]);
    }
    const int64_t total = header + payload;

    /* Compare the length with the header before allocating: a plain file by
     * its size, a gzip one by the length its trailer records (mod 2^32), and
     * when that disagrees by decompressing it once without keeping it. */
    int64_t actual = -1;
    if (gzdirect(gz)) {
        struct stat sb;
        if (stat(path, &sb) == 0) actual = (int64_t)sb.st_size;
    } else if (gz_trailer_size(path) != (uint32_t)total) {
        actual = header + gz_count_rest(gz);
        if (actual == total && gzrewind(gz) == 0) { /* several members: read it for real */
            got = gz_read_all(gz, h, header, &gzmsg);
            actual = -1;
        }
    }
    if (actual >= 0 && actual != total) {
        st = host->api->fail(
            host, VH_STATUS_ERR_FORMAT, "%s: %s: header says %s (%lld bytes), file has %lld", path,
            actual < total ? "truncated" : "too long", desc, (long long)total, (long long)actual);
        goto done;
    }

    *data = host->api->alloc(host, (size_t)payload);
    if (!*data) {
        st = host->api->fail(host, VH_STATUS_ERR_NOMEM, "%s: out of memory for %s (%lld bytes)",
                             path, desc, (long long)payload);
        goto done;
    }
    got = gz_read_all(gz, *data, payload, &gzmsg);
    if (got < 0) {
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s: cannot read: %s", path, gzmsg);
        goto done;
    }
    if (got < payload) {
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                             "%s: truncated: header says %s (%lld bytes), file has %lld", path,
                             desc, (long long)total, (long long)(header + got));
        goto done;
    }
    int64_t extra = gz_count_rest(gz);
    if (extra > 0) {
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                             "%s: too long: header says %s (%lld bytes), file has %lld", path, desc,
                             (long long)total, (long long)(total + extra));
        goto done;
    }
done:
    gzclose(gz);
    if (st != VH_STATUS_OK) {
        host->api->free(host, *data);
        *data = NULL;
    }
    return st;
}

/* Images and labels of one split, cross-checked. */
static vh_status load_set(idx_data *d, idx_set *set, const char *root, const char *images_key,
                          const char *labels_key) {
    vh_host *host = d->host;
    const char *images_name, *labels_name;
    vh_status st;
    if ((st = host->api->config_string(host, images_key, &images_name)) != VH_STATUS_OK ||
        (st = host->api->config_string(host, labels_key, &labels_name)) != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the keys '%s' and '%s'", images_key,
                               labels_key);
    if ((st = resolve_path(host, root, images_key, images_name, set->images_path)) != VH_STATUS_OK)
        return st;
    if ((st = resolve_path(host, root, labels_key, labels_name, set->labels_path)) != VH_STATUS_OK)
        return st;

    int64_t idims[3] = {0, 0, 0}, ldims[3] = {0, 0, 0};
    if ((st = read_idx(host, set->images_path, 1, idims, &set->pixels)) != VH_STATUS_OK) return st;
    if ((st = read_idx(host, set->labels_path, 0, ldims, &set->labels)) != VH_STATUS_OK) return st;
    if (ldims[0] != idims[0])
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: %lld labels, but %s has %lld images", set->labels_path,
                               (long long)ldims[0], set->images_path, (long long)idims[0]);
    if (d->rows == 0) {
        d->rows = (int32_t)idims[1];
        d->cols = (int32_t)idims[2];
    } else if (idims[1] != d->rows || idims[2] != d->cols) {
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: images of %lldx%lld, but the training images are %dx%d",
                               set->images_path, (long long)idims[1], (long long)idims[2],
                               (int)d->rows, (int)d->cols);
    }
    for (int64_t i = 0; i < ldims[0]; i++)
        if (set->labels[i] >= d->classes)
            return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                   "%s: label %d of item %lld is outside [0, %d) (num_classes: %d)",
                                   set->labels_path, (int)set->labels[i], (long long)i,
                                   (int)d->classes, (int)d->classes);
    set->count = idims[0];
    return VH_STATUS_OK;
}

/* ---- batches -------------------------------------------------------------- */

/* One image to floats: optional random crop of the zero-padded image, then
 * an optional mirror. Only called on a worker thread with its own output. */
static void convert_image(const idx_data *d, const uint8_t *src, float *dst, uint64_t key,
                          int augment) {
    const int32_t rows = d->rows, cols = d->cols;
    int32_t p = augment ? d->pad_crop : 0, dy = 0, dx = 0, flip = 0;
    if (augment && (p > 0 || d->hflip)) {
        uint64_t rng = key;
        if (p > 0) {
            dy = (int32_t)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * p + 1)) - p;
            dx = (int32_t)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * p + 1)) - p;
        }
        if (d->hflip) flip = (int32_t)(vh_sampler_rng_next(&rng) & 1);
    }
    if (dy == 0 && dx == 0 && !flip) {
        for (int64_t k = 0; k < (int64_t)rows * cols; k++) dst[k] = d->lut[src[k]];
        return;
    }
    const float pad = d->lut[0];
    for (int32_t y = 0; y < rows; y++) {
        int32_t sy = y + dy;
        float *out = dst + (int64_t)y * cols;
        for (int32_t x = 0; x < cols; x++) {
            int32_t sx = (flip ? cols - 1 - x : x) + dx;
            out[x] = (sy < 0 || sy >= rows || sx < 0 || sx >= cols)
                         ? pad
                         : d->lut[src[(int64_t)sy * cols + sx]];
        }
    }
}

static vh_status fill_batch(void *ctx, int64_t batch, vh_prefetch_slot *slot, int worker,
                            char *err, size_t err_len) {
    (void)worker;
    const idx_data *d = ctx;
    const vh_sampler *sampler = d->samplers[d->split];
    const idx_set *set = &d->sets[d->split];
    const int64_t hw = (int64_t)d->rows * d->cols;
    const int augment = d->split == VH_SPLIT_TRAIN;
    const int64_t *indices;
    int64_t count;
    if (vh_sampler_batch(sampler, batch, &indices, &count) != VH_STATUS_OK) {
        snprintf(err, err_len, "idx: batch %lld is outside the pass", (long long)batch);
        return VH_STATUS_ERR_INTERNAL;
    }
    for (int64_t j = 0; j < count; j++) {
        int64_t i = indices[j];
        convert_image(d, set->pixels + i * hw, slot->images + j * hw,
                      augment ? vh_sampler_sample_key(sampler, i) : 0, augment);
        slot->labels[j] = set->labels[i];
    }
    slot->size = count;
    return VH_STATUS_OK;
}

/* ---- the plugin ----------------------------------------------------------- */

static void idx_destroy(void *self) {
    idx_data *d = self;
    if (!d) return;
    vh_host *host = d->host;
    vh_prefetch_free(d->prefetch); /* joins the workers before their data goes */
    for (int k = 0; k < 2; k++) {
        vh_sampler_free(d->samplers[k]);
        host->api->free(host, d->sets[k].pixels);
        host->api->free(host, d->sets[k].labels);
    }
    host->api->free(host, d);
}

static vh_status read_config(idx_data *d, const char **root, int64_t *workers, int64_t *depth) {
    vh_host *host = d->host;
    int64_t classes, pad;
    double mean, std;
    vh_status st;
    if ((st = host->api->config_string(host, "root", root)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "num_classes", &classes)) != VH_STATUS_OK ||
        (st = host->api->config_float(host, "mean", &mean)) != VH_STATUS_OK ||
        (st = host->api->config_float(host, "std", &std)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "workers", workers)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "prefetch", depth)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "pad_crop", &pad)) != VH_STATUS_OK ||
        (st = host->api->config_bool(host, "hflip", &d->hflip)) != VH_STATUS_OK)
        return host->api->fail(host, st, "idx: cannot read its configuration");
    if (classes < 1 || classes > 256)
        return host->api->config_fail(host, "num_classes", "%lld is outside [1, 256]",
                                      (long long)classes);
    if (!(std > 0.0) || !(std < 1e30))
        return host->api->config_fail(host, "std", "%g must be positive and finite", std);
    if (!(mean > -1e30 && mean < 1e30))
        return host->api->config_fail(host, "mean", "%g must be finite", mean);
    if (*workers < 0 || *workers > 64)
        return host->api->config_fail(host, "workers", "%lld is outside [0, 64]",
                                      (long long)*workers);
    if (*depth < 1 || *depth > 64)
        return host->api->config_fail(host, "prefetch", "%lld is outside [1, 64]",
                                      (long long)*depth);
    if (pad < 0 || pad > 64)
        return host->api->config_fail(host, "pad_crop", "%lld is outside [0, 64]", (long long)pad);
    d->classes = (int32_t)classes;
    d->pad_crop = (int32_t)pad;
    for (int v = 0; v < 256; v++) d->lut[v] = (float)(((double)v / 255.0 - mean) / std);
    return VH_STATUS_OK;
}

static vh_status idx_create(vh_host *host, const vh_data_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    if (!setup || setup->struct_size < sizeof *setup)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing or too small");
    idx_data *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "idx: out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    d->batch_size = setup->batch_size;

    const char *root;
    int64_t workers, depth;
    vh_status st = read_config(d, &root, &workers, &depth);
    if (st == VH_STATUS_OK)
        st = load_set(d, &d->sets[VH_SPLIT_TRAIN], root, "train_images", "train_labels");
    if (st == VH_STATUS_OK)
        st = load_set(d, &d->sets[VH_SPLIT_EVAL], root, "eval_images", "eval_labels");
    for (int k = 0; k < 2 && st == VH_STATUS_OK; k++) {
        vh_sampler_setup su = {.struct_size = sizeof su, .size = d->sets[k].count,
                               .rank = setup->rank, .world_size = setup->world_size,
                               .batch_size = setup->batch_size, .split = (vh_split)k,
                               .seed = setup->seed};
        st = vh_sampler_init(host, &su, &d->samplers[k]);
    }
    if (st == VH_STATUS_OK) {
        int64_t hw = (int64_t)d->rows * d->cols;
        if ((uint64_t)d->batch_size > (uint64_t)INT64_MAX / 8 / (uint64_t)hw) {
            st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                 "idx: batch size %lld is too large", (long long)d->batch_size);
        } else {
            vh_prefetch_setup ps = {.struct_size = sizeof ps, .workers = (int32_t)workers,
                                    .depth = (int32_t)depth, .max_batch = d->batch_size,
                                    .image_floats = d->batch_size * hw, .fill = fill_batch,
                                    .ctx = d};
            st = vh_prefetch_init(host, &ps, &d->prefetch);
        }
    }
    if (st != VH_STATUS_OK) {
        idx_destroy(d);
        return st;
    }
    host->api->log(host, VH_LOG_LEVEL_INFO, "idx: %lld train + %lld eval images of %dx%d from %s",
                   (long long)d->sets[0].count, (long long)d->sets[1].count, (int)d->rows,
                   (int)d->cols, root);
    *self = d;
    return VH_STATUS_OK;
}

static vh_status idx_info(void *self, vh_data_info *out) {
    idx_data *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
#define COVERS(m) (out->struct_size >= offsetof(vh_data_info, m) + sizeof out->m)
    if (COVERS(channels)) out->channels = 1;
    if (COVERS(height)) out->height = d->rows;
    if (COVERS(width)) out->width = d->cols;
    if (COVERS(num_classes)) out->num_classes = d->classes;
    if (COVERS(train_size)) out->train_size = d->sets[VH_SPLIT_TRAIN].count;
    if (COVERS(eval_size)) out->eval_size = d->sets[VH_SPLIT_EVAL].count;
#undef COVERS
    return VH_STATUS_OK;
}

/* Makes `split` the current pass from batch `first` on. */
static vh_status begin_pass(idx_data *d, vh_split split, int64_t first) {
    vh_prefetch_stop(d->prefetch);
    d->active = 0;
    d->split = split;
    vh_status st = vh_prefetch_start(d->prefetch, first, vh_sampler_batches(d->samplers[split]));
    if (st != VH_STATUS_OK) return st;
    d->active = 1;
    return VH_STATUS_OK;
}

static vh_status idx_start_epoch(void *self, vh_split split, int64_t epoch) {
    idx_data *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (split != VH_SPLIT_TRAIN && split != VH_SPLIT_EVAL)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "idx: unknown split %d",
                               (int)split);
    if (split == VH_SPLIT_TRAIN) {
        d->train_suspended = 0;
    } else if (d->active && d->split == VH_SPLIT_TRAIN) {
        /* An eval pass inside a training pass: the training pass waits. */
        int64_t at = vh_prefetch_position(d->prefetch);
        if (at < vh_sampler_batches(d->samplers[VH_SPLIT_TRAIN])) {
            d->train_suspended = 1;
            d->train_cursor = at;
        }
    }
    vh_prefetch_stop(d->prefetch); /* no worker reads the sampler while it changes */
    d->active = 0;
    vh_status st = vh_sampler_start(d->samplers[split], epoch);
    if (st != VH_STATUS_OK) return st;
    return begin_pass(d, split, 0);
}

static vh_status idx_next(void *self, vh_batch *out, int *has_batch) {
    idx_data *d = self;
    if (!d || !out || !has_batch) return VH_STATUS_ERR_INVALID_ARG;
    *has_batch = 0;
    if (!d->active)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "idx: next called before start_epoch");
    const vh_prefetch_slot *slot;
    int has;
    vh_status st = vh_prefetch_next(d->prefetch, &slot, &has);
    if (st != VH_STATUS_OK) return st;
    if (!has) {
        if (d->split == VH_SPLIT_EVAL && d->train_suspended) {
            /* The eval pass is over: the training pass it interrupted goes on. */
            d->train_suspended = 0;
            return begin_pass(d, VH_SPLIT_TRAIN, d->train_cursor);
        }
        return VH_STATUS_OK;
    }
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->images = (vh_tensor){.data = slot->images, .dtype = VH_DTYPE_F32,
                              .device = VH_DEVICE_KIND_CPU, .ndim = 4,
                              .shape = {slot->size, 1, d->rows, d->cols}};
    out->labels = (vh_tensor){.data = slot->labels, .dtype = VH_DTYPE_I32,
                              .device = VH_DEVICE_KIND_CPU, .ndim = 1, .shape = {slot->size}};
    out->size = slot->size;
    *has_batch = 1;
    return VH_STATUS_OK;
}

/* ---- resumable position ----------------------------------------------------
 * The training pass's, as vh_data.h asks: whether one is in progress, its
 * epoch and cursor (a 16-byte header, then the training sampler's state). An
 * eval pass in between is not recorded; after state_load, next continues the
 * training pass where it stood. */

#define STATE_MAGIC 0x58444956u /* "VIDX" */
#define STATE_VERSION 1u
#define STATE_HEADER 16
#define STATE_BYTES (STATE_HEADER + VH_SAMPLER_STATE_BYTES)

static vh_status idx_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = STATE_BYTES;
    return VH_STATUS_OK;
}

static vh_status idx_state_save(void *self, void *buf, size_t bytes) {
    idx_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < STATE_BYTES)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "idx: state buffer of %zu bytes, %d needed", bytes,
                                  STATE_BYTES);
    uint32_t in_progress = 0;
    int64_t cursor = 0;
    if (d->active && d->split == VH_SPLIT_TRAIN) {
        in_progress = 1;
        cursor = vh_prefetch_position(d->prefetch);
    } else if (d->train_suspended) {
        in_progress = 1;
        cursor = d->train_cursor;
    }
    uint32_t h[4] = {STATE_MAGIC, STATE_VERSION, in_progress, 0};
    memcpy(buf, h, sizeof h);
    return vh_sampler_state_save(d->samplers[VH_SPLIT_TRAIN], cursor,
                                 (unsigned char *)buf + STATE_HEADER, VH_SAMPLER_STATE_BYTES);
}

static vh_status idx_state_load(void *self, const void *buf, size_t bytes) {
    idx_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    uint32_t h[4];
    if (bytes != STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "idx: state of %zu bytes, expected %d", bytes, STATE_BYTES);
    memcpy(h, buf, sizeof h);
    if (h[0] != STATE_MAGIC || h[1] != STATE_VERSION || h[2] > 1)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "not a idx data state");
    vh_prefetch_stop(d->prefetch);
    d->active = 0;
    d->train_suspended = 0;
    int64_t cursor;
    int started;
    vh_status st = vh_sampler_state_load(d->samplers[VH_SPLIT_TRAIN],
                                         (const unsigned char *)buf + STATE_HEADER,
                                         VH_SAMPLER_STATE_BYTES, &cursor, &started);
    if (st != VH_STATUS_OK || !h[2]) return st;
    if (!started)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "idx: corrupt state (a pass in progress, never started)");
    return begin_pass(d, VH_SPLIT_TRAIN, cursor);
}

static const vh_data_vtable vtable = {
    .struct_size = sizeof(vh_data_vtable),
    .create = idx_create,
    .destroy = idx_destroy,
    .info = idx_info,
    .start_epoch = idx_start_epoch,
    .next = idx_next,
    .state_size = idx_state_size,
    .state_save = idx_state_save,
    .state_load = idx_state_load,
};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "idx", "0.1.0",
                 "MNIST-format IDX files (MNIST, Fashion-MNIST), gzipped or not", schema, vtable);
