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
 * sample) so that batches repeat whatever the worker count, the timing or a
 * resume: `pad_crop: p` takes a random rows x cols window of the image padded
 * by p pixels of byte 0 on every side (black, the background of MNIST-style
 * sets; -mean/std once normalised, not 0), then `hflip` mirrors it with
 * probability 1/2. Both are off by default (the batches are then the plain
 * conversion above), and evaluation never augments. For Fashion-MNIST,
 * `pad_crop: 2, hflip: true` is the usual choice; a mirror does not suit
 * digits (MNIST, KMNIST).
 *
 * `pad: p` (off by default) frames every image, training and evaluation, in
 * p pixels of byte 0 at load, so 28x28 images become (28 + 2p) x (28 + 2p):
 * fine-tuning a model at a larger image size (28 -> 32 with pad 2).
 *
 * Order and per-rank split, prefetching, batches and the resumable position:
 * vh_data_pass (shuffled per epoch for training, in order and every sample
 * once for evaluation); its vh_data_pass_fill_u8 converts and augments.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

#include "vithost/vithost.h"

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
     "training: random rows x cols crop of the image padded by this many pixels of byte 0 "
     "(black; -mean/std normalised) per side, offsets keyed by (seed, epoch, sample); 0: none",
     NULL, 0, 64, 0},
    {"pad", VH_CONFIG_TYPE_INT, "0",
     "pixels of byte 0 (black) added on every side of every image, training and evaluation, "
     "at load: 28x28 with pad 2 is 32x32 (fine-tuning at another image size); 0: none",
     NULL, 0, 64, 0},
    {"hflip", VH_CONFIG_TYPE_BOOL, "false",
     "training: mirror left-right with probability 1/2, keyed by (seed, epoch, sample); not for "
     "digits",
     NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

typedef struct idx_set {
    char images_path[PATH_LEN], labels_path[PATH_LEN];
    int64_t count;
} idx_set;

typedef struct idx_data {
    vh_data_pass *pass; /* first: the VH_DATA_PASS_VTABLE entries find it here */
    vh_host *host;
    int32_t classes;
    float lut[256]; /* pixel byte -> normalised value */
    idx_set sets[2]; /* by vh_split */
    vh_data_pass_u8 images; /* pixels (count, rows, cols), labels, augmentation */
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

/* Whether bytes that are not a gzip member follow the gzip members of the
 * file (zlib's gzread skips them silently); *at: where they start, *rest:
 * how many. Decompresses the file once more, into a scratch buffer. */
static int gz_trailing(const char *path, int64_t *at, int64_t *rest) {
    struct stat sb;
    if (stat(path, &sb) != 0 || sb.st_size <= 0) return 0;
    size_t size = (size_t)sb.st_size;
    unsigned char *in = malloc(size), *out = malloc(1 << 16);
    FILE *f = fopen(path, "rb");
    int ok = in && out && f && fread(in, 1, size, f) == size;
    if (f) fclose(f);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (!ok || inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
        free(in);
        free(out);
        return 0;
    }
    size_t pos = 0;
    int found = 0;
    /* One member after another; each ends in Z_STREAM_END, and what follows
     * must be the next member's magic (1f 8b) or nothing. */
    while (pos < size) {
        z.next_in = in + pos;
        z.avail_in = (uInt)(size - pos > (1u << 30) ? (1u << 30) : size - pos);
        z.next_out = out;
        z.avail_out = 1 << 16;
        int ret = inflate(&z, Z_NO_FLUSH);
        pos = (size_t)(z.next_in - in);
        if (ret == Z_STREAM_END) {
            if (pos == size) break;
            if (size - pos >= 2 && in[pos] == 0x1f && in[pos + 1] == 0x8b) {
                inflateReset(&z);
                continue;
            }
            found = 1;
            break;
        }
        if (ret != Z_OK) break; /* damaged or truncated: gzread has said so */
    }
    if (found) {
        *at = (int64_t)pos;
        *rest = (int64_t)(size - pos);
    }
    inflateEnd(&z);
    free(in);
    free(out);
    return found;
}

static const char *magic_kind(uint32_t magic) {
    if (magic == IDX_MAGIC_IMAGES) return " (an IDX image file)";
    if (magic == IDX_MAGIC_LABELS) return " (an IDX label file)";
    return " (not an IDX file of unsigned bytes)";
}

/* One IDX file being read: what it should hold, and what its header said. */
typedef struct idx_file {
    vh_host *host;
    const char *path;
    gzFile gz;
    uint32_t magic_want;
    int ndim, header; /* header: bytes before the payload */
    const char *what; /* "image" or "label" */
    int64_t *dims;
    int64_t payload, total; /* bytes of pixels or labels; header + payload */
    char desc[128]; /* "60000 images of 28x28" */
} idx_file;

/* Magic and dimensions, checked; sets dims, payload, total and desc. */
static vh_status idx_read_header(idx_file *f) {
    vh_host *host = f->host;
    const char *path = f->path, *what = f->what, *gzmsg = NULL;
    unsigned char h[16];
    int64_t got = gz_read_all(f->gz, h, f->header, &gzmsg);
    if (got < 0)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s: cannot read: %s", path, gzmsg);
    if (got >= 4 && be32(h) != f->magic_want)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: wrong magic 0x%08x%s, expected 0x%08x for an IDX %s file",
                               path, (unsigned)be32(h), magic_kind(be32(h)),
                               (unsigned)f->magic_want, what);
    if (got < f->header)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: truncated: %lld bytes, shorter than the %d-byte IDX %s header",
                               path, (long long)got, f->header, what);
    int64_t *dims = f->dims;
    for (int k = 0; k < f->ndim; k++) dims[k] = be32(h + 4 + 4 * k);
    if (dims[0] < 1 || dims[0] > INT32_MAX)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               dims[0] < 1 ? "%s: header says %lld %ss; a split needs at least one"
                                           : "%s: header says %lld %ss, more than the %d a split "
                                             "may hold (sample indices are 32-bit; a damaged "
                                             "header?)",
                               path, (long long)dims[0], what, INT32_MAX);
    f->payload = dims[0];
    if (f->ndim == 3) {
        if (dims[1] < 1 || dims[1] > IDX_MAX_SIDE || dims[2] < 1 || dims[2] > IDX_MAX_SIDE)
            return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                   "%s: header says images of %lldx%lld; sides must be 1..%d",
                                   path, (long long)dims[1], (long long)dims[2], IDX_MAX_SIDE);
        f->payload *= dims[1] * dims[2];
        snprintf(f->desc, sizeof f->desc, "%lld images of %lldx%lld", (long long)dims[0],
                 (long long)dims[1], (long long)dims[2]);
    } else {
        snprintf(f->desc, sizeof f->desc, "%lld labels", (long long)dims[0]);
    }
    f->total = f->header + f->payload;
    return VH_STATUS_OK;
}

/* Compares the length with the header before anything is allocated: a plain
 * file by its size, a gzip one by the length its trailer records (mod 2^32),
 * and when that disagrees by decompressing it once without keeping it. */
static vh_status idx_check_length(idx_file *f) {
    int64_t actual = -1;
    if (gzdirect(f->gz)) {
        struct stat sb;
        if (stat(f->path, &sb) == 0) actual = (int64_t)sb.st_size;
    } else if (gz_trailer_size(f->path) != (uint32_t)f->total) {
        actual = f->header + gz_count_rest(f->gz);
        if (actual == f->total && gzrewind(f->gz) == 0) { /* several members: read it for real */
            unsigned char h[16];
            const char *gzmsg = NULL;
            gz_read_all(f->gz, h, f->header, &gzmsg); /* past the header again */
            actual = -1;
        }
    }
    if (actual >= 0 && actual != f->total)
        return f->host->api->fail(f->host, VH_STATUS_ERR_FORMAT,
                                  "%s: %s: header says %s (%lld bytes), file has %lld", f->path,
                                  actual < f->total ? "truncated" : "too long", f->desc,
                                  (long long)f->total, (long long)actual);
    return VH_STATUS_OK;
}

/* The payload into *data (allocated here), then nothing may follow it. */
static vh_status idx_read_payload(idx_file *f, uint8_t **data) {
    vh_host *host = f->host;
    const char *path = f->path, *gzmsg = NULL;
    *data = host->api->alloc(host, (size_t)f->payload);
    if (!*data)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "%s: out of memory for %s (%lld bytes)",
                               path, f->desc, (long long)f->payload);
    int64_t got = gz_read_all(f->gz, *data, f->payload, &gzmsg);
    if (got < 0)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s: cannot read: %s", path, gzmsg);
    if (got < f->payload)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: truncated: header says %s (%lld bytes), file has %lld", path,
                               f->desc, (long long)f->total, (long long)(f->header + got));
    int64_t extra = gz_count_rest(f->gz);
    if (extra > 0)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: too long: header says %s (%lld bytes), file has %lld", path,
                               f->desc, (long long)f->total, (long long)(f->total + extra));
    int64_t at = 0, rest = 0;
    if (!gzdirect(f->gz) && gz_trailing(path, &at, &rest))
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: %lld bytes after the gzip data (from byte %lld) are not "
                               "gzip: a damaged or appended-to file (re-download it)",
                               path, (long long)rest, (long long)at);
    return VH_STATUS_OK;
}

/* One IDX file of unsigned bytes: images (ndim 3) or labels (ndim 1). On
 * success *data (host memory) holds the payload and dims[] the sizes. */
static vh_status read_idx(vh_host *host, const char *path, int images, int64_t dims[3],
                          uint8_t **data) {
    idx_file f = {.host = host, .path = path, .dims = dims,
                  .magic_want = images ? IDX_MAGIC_IMAGES : IDX_MAGIC_LABELS,
                  .ndim = images ? 3 : 1, .header = 4 + 4 * (images ? 3 : 1),
                  .what = images ? "image" : "label"};
    *data = NULL;
    f.gz = gzopen(path, "rb");
    if (!f.gz)
        return host->api->fail(host, VH_STATUS_ERR_IO, "%s: cannot open: %s", path,
                               strerror(errno ? errno : ENOMEM));
    gzbuffer(f.gz, 1 << 17);
    vh_status st = idx_read_header(&f);
    if (st == VH_STATUS_OK) st = idx_check_length(&f);
    if (st == VH_STATUS_OK) st = idx_read_payload(&f, data);
    gzclose(f.gz);
    if (st != VH_STATUS_OK) {
        host->api->free(host, *data);
        *data = NULL;
    }
    return st;
}

/* Images and labels of one split, cross-checked. */
static vh_status load_set(idx_data *d, vh_split split, const char *root, const char *images_key,
                          const char *labels_key) {
    vh_host *host = d->host;
    idx_set *set = &d->sets[split];
    vh_data_pass_u8 *u = &d->images;
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
    if ((st = read_idx(host, set->images_path, 1, idims, &u->pixels[split])) != VH_STATUS_OK)
        return st;
    if ((st = read_idx(host, set->labels_path, 0, ldims, &u->labels[split])) != VH_STATUS_OK)
        return st;
    if (ldims[0] != idims[0])
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: %lld labels, but %s has %lld images", set->labels_path,
                               (long long)ldims[0], set->images_path, (long long)idims[0]);
    if (u->rows == 0) {
        u->rows = (int32_t)idims[1];
        u->cols = (int32_t)idims[2];
    } else if (idims[1] != u->rows || idims[2] != u->cols) {
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: images of %lldx%lld, but the training images are %dx%d",
                               set->images_path, (long long)idims[1], (long long)idims[2],
                               (int)u->rows, (int)u->cols);
    }
    const uint8_t *labels = u->labels[split];
    for (int64_t i = 0; i < ldims[0]; i++)
        if (labels[i] >= d->classes)
            return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                   "%s: label %d of item %lld is outside [0, %d) (num_classes: %d)",
                                   set->labels_path, (int)labels[i], (long long)i,
                                   (int)d->classes, (int)d->classes);
    set->count = idims[0];
    return VH_STATUS_OK;
}

/* `pad`: every image of both splits re-laid into a frame of byte 0, pad
 * pixels wider on every side (before normalisation, so the border is the
 * background's -mean/std, as pad_crop's). */
static vh_status pad_images(idx_data *d, int32_t pad) {
    vh_host *host = d->host;
    vh_data_pass_u8 *u = &d->images;
    const int64_t rows = u->rows, cols = u->cols, prow = rows + 2 * pad, pcol = cols + 2 * pad;
    for (int split = 0; split < 2; split++) {
        const int64_t n = d->sets[split].count;
        uint8_t *out = host->api->alloc(host, (size_t)(n * prow * pcol) + 1);
        if (!out)
            return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                                   "idx: out of memory padding %lld images to %lldx%lld",
                                   (long long)n, (long long)prow, (long long)pcol);
        memset(out, 0, (size_t)(n * prow * pcol) + 1);
        for (int64_t i = 0; i < n; i++)
            for (int64_t y = 0; y < rows; y++)
                memcpy(out + (i * prow + y + pad) * pcol + pad,
                       u->pixels[split] + (i * rows + y) * cols, (size_t)cols);
        host->api->free(host, u->pixels[split]);
        u->pixels[split] = out;
    }
    u->rows = (int32_t)prow, u->cols = (int32_t)pcol;
    return VH_STATUS_OK;
}

/* ---- the plugin ----------------------------------------------------------- */

static void idx_destroy(void *self) {
    idx_data *d = self;
    if (!d) return;
    vh_data_pass_free(d->pass); /* joins the workers before their data goes */
    vh_data_pass_u8_free(d->host, &d->images);
    d->host->api->free(d->host, d);
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
        (st = host->api->config_bool(host, "hflip", &d->images.hflip)) != VH_STATUS_OK)
        return host->api->fail(host, st, "idx: cannot read its configuration");
    if (classes < 1 || classes > 256)
        return host->api->config_fail(host, "num_classes", "%lld is outside [1, 256]",
                                      (long long)classes);
    if (!(std > 0.0) || !(std < 1e30))
        return host->api->config_fail(host, "std", "%g must be positive and finite", std);
    if (!(mean > -1e30 && mean < 1e30))
        return host->api->config_fail(host, "mean", "%g must be finite", mean);
    if (pad < 0 || pad > 64)
        return host->api->config_fail(host, "pad_crop", "%lld is outside [0, 64]", (long long)pad);
    d->classes = (int32_t)classes;
    d->images.pad_crop = (int32_t)pad;
    for (int v = 0; v < 256; v++) d->lut[v] = (float)(((double)v / 255.0 - mean) / std);
    return VH_STATUS_OK;
}

static vh_status idx_create(vh_host *host, const vh_data_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    /* A setup of an older minor reads with its missing members zero. */
    vh_data_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing");
    setup = &setup_v;
    idx_data *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "idx: out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;

    const char *root;
    int64_t workers, depth;
    vh_status st = read_config(d, &root, &workers, &depth);
    if (st == VH_STATUS_OK)
        st = load_set(d, VH_SPLIT_TRAIN, root, "train_images", "train_labels");
    if (st == VH_STATUS_OK) st = load_set(d, VH_SPLIT_EVAL, root, "eval_images", "eval_labels");
    int64_t pad = 0;
    if (st == VH_STATUS_OK && (st = host->api->config_int(host, "pad", &pad)) == VH_STATUS_OK &&
        pad > 0)
        st = pad_images(d, (int32_t)pad);
    d->images.planes = 1;
    d->images.lut = d->lut;
    if (st == VH_STATUS_OK) {
        vh_data_pass_setup ps = {.struct_size = sizeof ps, .name = "idx",
                                 .state_magic = 0x58444956u /* "VIDX" */, .data = setup,
                                 .train_size = d->sets[VH_SPLIT_TRAIN].count,
                                 .eval_size = d->sets[VH_SPLIT_EVAL].count, .channels = 1,
                                 .height = d->images.rows, .width = d->images.cols,
                                 .num_classes = d->classes, .workers = (int32_t)workers,
                                 .depth = (int32_t)depth, .fill = vh_data_pass_fill_u8,
                                 .ctx = &d->images};
        st = vh_data_pass_init(host, &ps, &d->pass);
    }
    if (st != VH_STATUS_OK) {
        idx_destroy(d);
        return st;
    }
    host->api->log(host, VH_LOG_LEVEL_INFO, "idx: %lld train + %lld eval images of %dx%d from %s",
                   (long long)d->sets[0].count, (long long)d->sets[1].count,
                   (int)d->images.rows, (int)d->images.cols, root);
    *self = d;
    return VH_STATUS_OK;
}

static const vh_data_vtable vtable = {VH_DATA_PASS_VTABLE, .create = idx_create,
                                      .destroy = idx_destroy};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "idx", "0.1.0",
                 "MNIST-format IDX files (MNIST, Fashion-MNIST), gzipped or not", schema, vtable);
