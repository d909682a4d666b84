/* cifar.c - the `cifar` data plugin: CIFAR-10 and CIFAR-100, binary version.
 *
 * Files under `root`:
 *   cifar10:  data_batch_1.bin .. data_batch_5.bin (training), test_batch.bin
 *             (evaluation); records of 1 label byte + 3072 pixel bytes.
 *   cifar100: train.bin, test.bin; records of 2 label bytes (coarse 0..19,
 *             fine 0..99) + 3072 pixel bytes; `labels` picks fine (default)
 *             or coarse.
 * Pixels are 32x32, stored channel after channel (1024 R, 1024 G, 1024 B),
 * which is already the (C, H, W) order of a batch.
 *
 * Everything is read into memory at create and checked: each file's length
 * must be a whole number of records (the message names the file and the
 * record size it expected) and every label must be in range.
 *
 * Per channel c: x = (p / 255 - mean[c]) / std[c], with the statistics of
 * the training set by default (CIFAR-10: mean 0.4914, 0.4822, 0.4465, std
 * 0.2470, 0.2435, 0.2616; CIFAR-100: mean 0.5071, 0.4865, 0.4409, std
 * 0.2673, 0.2564, 0.2762), or `mean` / `std` given as "r,g,b" (or one number
 * for all three). Training augments by default as the usual CIFAR recipes:
 * a random 32x32 crop of the image zero-padded by `pad_crop` (4) pixels,
 * then a mirror with probability 1/2 (`hflip`), with draws keyed by (seed,
 * epoch, sample), so batches repeat whatever the worker timing.
 *
 * Order, per-rank split, prefetching, batches and the resumable position:
 * vh_data_pass; its vh_data_pass_fill_u8 converts and augments.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "vithost/vithost.h"

#define SIDE 32
#define CHANNELS 3
#define PIXELS (CHANNELS * SIDE * SIDE) /* 3072 */
#define PATH_LEN 4096

static const vh_config_key schema[] = {
    {"variant", VH_CONFIG_TYPE_ENUM, "cifar10", "which data set", "cifar10|cifar100", 0, 0, 0},
    {"root", VH_CONFIG_TYPE_PATH, NULL,
     "folder of the .bin files; default /usr/share/datasets/cifar-10-batches-bin (cifar10) or "
     "/usr/share/datasets/cifar-100-binary (cifar100)",
     NULL, 0, 0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"labels", VH_CONFIG_TYPE_ENUM, "fine", "cifar100: fine (100 classes) or coarse (20)",
     "fine|coarse", 0, 0, 0},
    {"mean", VH_CONFIG_TYPE_STRING, NULL,
     "per-channel mean \"r,g,b\" (or one number); default: the variant's training-set mean", NULL,
     0, 0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"std", VH_CONFIG_TYPE_STRING, NULL,
     "per-channel std \"r,g,b\" (or one number); default: the variant's training-set std", NULL,
     0, 0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"pad_crop", VH_CONFIG_TYPE_INT, "4",
     "training: random 32x32 crop of the image zero-padded by this many pixels; 0: off", NULL, 0,
     32, 0},
    {"hflip", VH_CONFIG_TYPE_BOOL, "true", "training: mirror left-right with probability 1/2",
     NULL, 0, 0, 0},
    {"workers", VH_CONFIG_TYPE_INT, "1",
     "threads converting batches ahead of training; 0: on the training thread", NULL, 0, 64, 0},
    {"prefetch", VH_CONFIG_TYPE_INT, "4", "batch slots: the one in use plus those filled ahead",
     NULL, 1, 64, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

typedef struct cifar_data {
    vh_data_pass *pass; /* first: the VH_DATA_PASS_VTABLE entries find it here */
    vh_host *host;
    int cifar100, coarse;
    int32_t classes;
    float lut[CHANNELS][256];
    int64_t counts[2];      /* by vh_split */
    vh_data_pass_u8 images; /* pixels (count, 3, 32, 32), labels, augmentation */
} cifar_data;

static const char *const cifar10_train[] = {"data_batch_1.bin", "data_batch_2.bin",
                                            "data_batch_3.bin", "data_batch_4.bin",
                                            "data_batch_5.bin", NULL};
static const char *const cifar10_eval[] = {"test_batch.bin", NULL};
static const char *const cifar100_train[] = {"train.bin", NULL};
static const char *const cifar100_eval[] = {"test.bin", NULL};

/* ---- reading --------------------------------------------------------------- */

static int64_t record_bytes(const cifar_data *d) { return (d->cifar100 ? 2 : 1) + PIXELS; }

static const char *variant_name(const cifar_data *d) {
    return d->cifar100 ? "CIFAR-100" : "CIFAR-10";
}

/* The records in one file, from its size: size errors come before any reading. */
static vh_status count_records(cifar_data *d, const char *path, int64_t *count) {
    vh_host *host = d->host;
    const int64_t record = record_bytes(d);
    const char *variant = variant_name(d);
    const char *layout = d->cifar100 ? "2 label bytes (coarse, fine) + 3072 pixel bytes"
                                     : "1 label byte + 3072 pixel bytes";
    struct stat sb;
    if (stat(path, &sb) != 0)
        return host->api->fail(host, VH_STATUS_ERR_IO, "%s: cannot open: %s (%s files under root)",
                               path, strerror(errno), variant);
    if (!S_ISREG(sb.st_mode))
        return host->api->fail(host, VH_STATUS_ERR_IO,
                               "%s: is %s, not a %s batch file (data.root must be the folder "
                               "holding the extracted .bin files)",
                               path, S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file",
                               variant);
    int64_t bytes = (int64_t)sb.st_size;
    if (bytes == 0 || bytes % record != 0) {
        int64_t other = d->cifar100 ? PIXELS + 1 : PIXELS + 2;
        int fits_other = bytes > 0 && bytes % other == 0;
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: %lld bytes is not a whole number of %lld-byte %s records "
                               "(%s)%s",
                               path, (long long)bytes, (long long)record, variant, layout,
                               fits_other ? (d->cifar100 ? "; it fits CIFAR-10 records: "
                                                           "variant: cifar10?"
                                                         : "; it fits CIFAR-100 records: "
                                                           "variant: cifar100?")
                                          : "");
    }
    *count = bytes / record;
    return VH_STATUS_OK;
}

/* The label record r of path trains on (fine or coarse), checked. */
static vh_status record_label(cifar_data *d, const char *path, int64_t r, const uint8_t *rec,
                              uint8_t *out) {
    vh_host *host = d->host;
    int coarse = rec[0], label = rec[d->cifar100 ? 1 : 0];
    if (d->cifar100 && coarse >= 20)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: record %lld: coarse label %d is outside [0, 20)", path,
                               (long long)r, coarse);
    if (d->coarse) label = coarse;
    if (label >= d->classes)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: record %lld: %slabel %d is outside [0, %d)", path,
                               (long long)r, d->cifar100 ? (d->coarse ? "coarse " : "fine ") : "",
                               label, (int)d->classes);
    *out = (uint8_t)label;
    return VH_STATUS_OK;
}

/* The count records of one file, appended at *at to the split's labels and
 * pixels; buf holds 1024 records. */
static vh_status read_file(cifar_data *d, vh_split split, const char *path, int64_t count,
                           uint8_t *buf, int64_t *at) {
    vh_host *host = d->host;
    const int64_t record = record_bytes(d), label_bytes = record - PIXELS;
    uint8_t *pixels = d->images.pixels[split], *labels = d->images.labels[split];
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return host->api->fail(host, VH_STATUS_ERR_IO, "%s: cannot open: %s", path,
                               strerror(errno));
    vh_status st = VH_STATUS_OK;
    for (int64_t r = 0; r < count && st == VH_STATUS_OK;) {
        int64_t n = count - r < 1024 ? count - r : 1024;
        if (fread(buf, (size_t)record, (size_t)n, fp) != (size_t)n) {
            st = host->api->fail(host, VH_STATUS_ERR_IO,
                                 "%s: read failed at record %lld of %lld: %s", path, (long long)r,
                                 (long long)count,
                                 ferror(fp) ? strerror(errno) : "file shrank while read");
            break;
        }
        for (int64_t k = 0; k < n && st == VH_STATUS_OK; k++, r++) {
            const uint8_t *rec = buf + k * record;
            st = record_label(d, path, r, rec, &labels[*at]);
            if (st != VH_STATUS_OK) break;
            memcpy(pixels + *at * PIXELS, rec + label_bytes, PIXELS);
            (*at)++;
        }
    }
    fclose(fp);
    return st;
}

/* The files of one split, read whole into one allocation. */
static vh_status load_set(cifar_data *d, vh_split split, const char *root,
                          const char *const *names) {
    vh_host *host = d->host;
    char path[PATH_LEN];
    int64_t counts[8] = {0}, total = 0;
    int nfiles = 0;
    vh_status st;
    for (; names[nfiles]; nfiles++) {
        snprintf(path, sizeof path, "%s/%s", root, names[nfiles]);
        if ((st = count_records(d, path, &counts[nfiles])) != VH_STATUS_OK) return st;
        total += counts[nfiles];
    }
    d->images.pixels[split] = host->api->alloc(host, (size_t)total * PIXELS);
    d->images.labels[split] = host->api->alloc(host, (size_t)total);
    uint8_t *buf = host->api->alloc(host, (size_t)(record_bytes(d) * 1024));
    if (!d->images.pixels[split] || !d->images.labels[split] || !buf) {
        host->api->free(host, buf);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "cifar: out of memory for %lld images",
                               (long long)total);
    }
    int64_t at = 0;
    st = VH_STATUS_OK;
    for (int f = 0; f < nfiles && st == VH_STATUS_OK; f++) {
        snprintf(path, sizeof path, "%s/%s", root, names[f]);
        st = read_file(d, split, path, counts[f], buf, &at);
    }
    d->counts[split] = total;
    host->api->free(host, buf);
    return st;
}

/* ---- the plugin ----------------------------------------------------------- */

static void cifar_destroy(void *self) {
    cifar_data *d = self;
    if (!d) return;
    vh_data_pass_free(d->pass); /* joins the workers before their data goes */
    vh_data_pass_u8_free(d->host, &d->images);
    d->host->api->free(d->host, d);
}

/* "0.1,0.2,0.3" or "0.5" into out[3]. */
static vh_status parse_triple(vh_host *host, const char *key, int positive, float out[3]) {
    if (!host->api->config_has(host, key)) return VH_STATUS_OK;
    const char *text;
    vh_status st = host->api->config_string(host, key, &text);
    if (st != VH_STATUS_OK) return host->api->fail(host, st, "cifar: cannot read '%s'", key);
    double v[3];
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno != 0 || n == 3 || !(x > -1e30 && x < 1e30) || (positive && !(x > 0)))
            return host->api->config_fail(host, key,
                                          "'%s' is not one or three %snumbers separated by commas",
                                          text, positive ? "positive " : "");
        v[n++] = x;
        while (*end == ' ') end++;
        if (*end == '\0') break;
        if (*end != ',')
            return host->api->config_fail(host, key,
                                          "'%s' is not one or three numbers separated by commas",
                                          text);
        p = end + 1;
    }
    if (n == 2)
        return host->api->config_fail(host, key, "'%s' has 2 numbers; give 1 or 3 (r,g,b)", text);
    for (int c = 0; c < 3; c++) out[c] = (float)v[n == 1 ? 0 : c];
    return VH_STATUS_OK;
}

static vh_status read_config(cifar_data *d, const char **root, int64_t *workers, int64_t *depth) {
    vh_host *host = d->host;
    const char *variant, *labels;
    int64_t pad;
    vh_status st;
    if ((st = host->api->config_string(host, "variant", &variant)) != VH_STATUS_OK ||
        (st = host->api->config_string(host, "labels", &labels)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "pad_crop", &pad)) != VH_STATUS_OK ||
        (st = host->api->config_bool(host, "hflip", &d->images.hflip)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "workers", workers)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "prefetch", depth)) != VH_STATUS_OK)
        return host->api->fail(host, st, "cifar: cannot read its configuration");
    if (strcmp(variant, "cifar10") == 0) {
        d->cifar100 = 0;
    } else if (strcmp(variant, "cifar100") == 0) {
        d->cifar100 = 1;
    } else {
        return host->api->config_fail(host, "variant", "'%s' is not cifar10 or cifar100", variant);
    }
    d->coarse = d->cifar100 && strcmp(labels, "coarse") == 0;
    d->classes = d->cifar100 ? (d->coarse ? 20 : 100) : 10;
    *root = d->cifar100 ? "/usr/share/datasets/cifar-100-binary"
                        : "/usr/share/datasets/cifar-10-batches-bin";
    if (host->api->config_has(host, "root") &&
        (st = host->api->config_string(host, "root", root)) != VH_STATUS_OK)
        return host->api->fail(host, st, "cifar: cannot read 'root'");
    if (pad < 0 || pad > 32)
        return host->api->config_fail(host, "pad_crop", "%lld is outside [0, 32]", (long long)pad);
    d->images.pad_crop = (int32_t)pad;

    float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
    if (d->cifar100) {
        const float m100[3] = {0.5071f, 0.4865f, 0.4409f}, s100[3] = {0.2673f, 0.2564f, 0.2762f};
        memcpy(mean, m100, sizeof mean);
        memcpy(std, s100, sizeof std);
    }
    if ((st = parse_triple(host, "mean", 0, mean)) != VH_STATUS_OK) return st;
    if ((st = parse_triple(host, "std", 1, std)) != VH_STATUS_OK) return st;
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++)
            d->lut[c][v] = (float)(((double)v / 255.0 - (double)mean[c]) / (double)std[c]);
    return VH_STATUS_OK;
}

static vh_status cifar_create(vh_host *host, const vh_data_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    /* A setup of an older minor reads with its missing members zero. */
    vh_data_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing");
    setup = &setup_v;
    if (setup->batch_size < 1 || (uint64_t)setup->batch_size > (uint64_t)INT64_MAX / 8 / PIXELS)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "cifar: batch size %lld is invalid",
                               (long long)setup->batch_size);
    cifar_data *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "cifar: out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;

    const char *root;
    int64_t workers, depth;
    vh_status st = read_config(d, &root, &workers, &depth);
    if (st == VH_STATUS_OK)
        st = load_set(d, VH_SPLIT_TRAIN, root, d->cifar100 ? cifar100_train : cifar10_train);
    if (st == VH_STATUS_OK)
        st = load_set(d, VH_SPLIT_EVAL, root, d->cifar100 ? cifar100_eval : cifar10_eval);
    d->images.planes = CHANNELS;
    d->images.rows = d->images.cols = SIDE;
    d->images.lut = &d->lut[0][0];
    if (st == VH_STATUS_OK) {
        vh_data_pass_setup ps = {.struct_size = sizeof ps, .name = "cifar",
                                 .state_magic = 0x52464356u /* "VCFR" */, .data = setup,
                                 .train_size = d->counts[VH_SPLIT_TRAIN],
                                 .eval_size = d->counts[VH_SPLIT_EVAL], .channels = CHANNELS,
                                 .height = SIDE, .width = SIDE, .num_classes = d->classes,
                                 .workers = (int32_t)workers, .depth = (int32_t)depth,
                                 .fill = vh_data_pass_fill_u8, .ctx = &d->images};
        st = vh_data_pass_init(host, &ps, &d->pass);
    }
    if (st != VH_STATUS_OK) {
        cifar_destroy(d);
        return st;
    }
    host->api->log(host, VH_LOG_LEVEL_INFO, "cifar: %s, %lld train + %lld eval images from %s",
                   d->cifar100 ? "CIFAR-100" : "CIFAR-10", (long long)d->counts[0],
                   (long long)d->counts[1], root);
    *self = d;
    return VH_STATUS_OK;
}

static const vh_data_vtable vtable = {VH_DATA_PASS_VTABLE, .create = cifar_create,
                                      .destroy = cifar_destroy};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "cifar", "0.1.0", "CIFAR-10 and CIFAR-100, binary version",
                 schema, vtable);
