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
 * Passes: start_epoch(EVAL) in the middle of a training pass (the host's
 * eval_every_steps) suspends that pass; once the eval pass has ended (next
 * said has_batch = 0), next continues the training pass where it stood.
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
#include "vithost/vh_prefetch.h"
#include "vithost/vh_sampler.h"

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

typedef struct cifar_set {
    int64_t count;
    uint8_t *pixels; /* (count, 3, 32, 32) */
    uint8_t *labels; /* (count) */
} cifar_set;

typedef struct cifar_data {
    vh_host *host;
    int cifar100, coarse;
    int32_t classes, pad_crop, hflip;
    float lut[CHANNELS][256];

    cifar_set sets[2]; /* by vh_split */
    vh_sampler *samplers[2];
    vh_prefetch *prefetch;
    /* The current pass (`split`; read by the workers, changed only while
     * the prefetcher is stopped), and a training pass an eval pass
     * interrupted, which goes on at train_cursor once the eval pass ends. */
    int active;
    vh_split split;
    int train_suspended;
    int64_t train_cursor;
} cifar_data;

static const char *const cifar10_train[] = {"data_batch_1.bin", "data_batch_2.bin",
                                            "data_batch_3.bin", "data_batch_4.bin",
                                            "data_batch_5.bin", NULL};
static const char *const cifar10_eval[] = {"test_batch.bin", NULL};
static const char *const cifar100_train[] = {"train.bin", NULL};
static const char *const cifar100_eval[] = {"test.bin", NULL};

/* ---- reading --------------------------------------------------------------- */

static vh_status load_set(cifar_data *d, cifar_set *set, const char *root,
                          const char *const *names) {
    vh_host *host = d->host;
    const int label_bytes = d->cifar100 ? 2 : 1;
    const int64_t record = label_bytes + PIXELS;
    const char *variant = d->cifar100 ? "CIFAR-100" : "CIFAR-10";
    const char *layout = d->cifar100 ? "2 label bytes (coarse, fine) + 3072 pixel bytes"
                                     : "1 label byte + 3072 pixel bytes";
    char path[PATH_LEN];
    int64_t counts[8] = {0}, total = 0;
    int nfiles = 0;

    /* Sizes first: one allocation, and size errors before any reading. */
    for (; names[nfiles]; nfiles++) {
        snprintf(path, sizeof path, "%s/%s", root, names[nfiles]);
        struct stat sb;
        if (stat(path, &sb) != 0)
            return host->api->fail(host, VH_STATUS_ERR_IO,
                                   "%s: cannot open: %s (%s files under root)", path,
                                   strerror(errno), variant);
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
        counts[nfiles] = bytes / record;
        total += counts[nfiles];
    }
    set->pixels = host->api->alloc(host, (size_t)total * PIXELS);
    set->labels = host->api->alloc(host, (size_t)total);
    uint8_t *buf = host->api->alloc(host, (size_t)(record * 1024));
    vh_status st = VH_STATUS_OK;
    if (!set->pixels || !set->labels || !buf) {
        st = host->api->fail(host, VH_STATUS_ERR_NOMEM, "cifar: out of memory for %lld images",
                             (long long)total);
        goto done;
    }

    int64_t at = 0;
    for (int f = 0; f < nfiles && st == VH_STATUS_OK; f++) {
        snprintf(path, sizeof path, "%s/%s", root, names[f]);
        FILE *fp = fopen(path, "rb");
        if (!fp) {
            st = host->api->fail(host, VH_STATUS_ERR_IO, "%s: cannot open: %s", path,
                                 strerror(errno));
            break;
        }
        for (int64_t r = 0; r < counts[f] && st == VH_STATUS_OK;) {
            int64_t n = counts[f] - r < 1024 ? counts[f] - r : 1024;
            if (fread(buf, (size_t)record, (size_t)n, fp) != (size_t)n) {
                st = host->api->fail(host, VH_STATUS_ERR_IO,
                                     "%s: read failed at record %lld of %lld: %s", path,
                                     (long long)r, (long long)counts[f],
                                     ferror(fp) ? strerror(errno) : "file shrank while read");
                break;
            }
            for (int64_t k = 0; k < n; k++, r++) {
                const uint8_t *rec = buf + k * record;
                int coarse = rec[0], label = rec[label_bytes - 1];
                if (d->cifar100 && coarse >= 20) {
                    st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                         "%s: record %lld: coarse label %d is outside [0, 20)",
                                         path, (long long)r, coarse);
                    break;
                }
                if (d->coarse) label = coarse;
                if (label >= d->classes) {
                    st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                         "%s: record %lld: %slabel %d is outside [0, %d)", path,
                                         (long long)r,
                                         d->cifar100 ? (d->coarse ? "coarse " : "fine ") : "",
                                         label, (int)d->classes);
                    break;
                }
                set->labels[at] = (uint8_t)label;
                memcpy(set->pixels + at * PIXELS, rec + label_bytes, PIXELS);
                at++;
            }
        }
        fclose(fp);
    }
    set->count = total;
done:
    host->api->free(host, buf);
    return st;
}

/* ---- batches -------------------------------------------------------------- */

static void convert_image(const cifar_data *d, const uint8_t *src, float *dst, uint64_t key,
                          int augment) {
    int32_t p = augment ? d->pad_crop : 0, dy = 0, dx = 0, flip = 0;
    if (augment && (p > 0 || d->hflip)) {
        uint64_t rng = key;
        if (p > 0) {
            dy = (int32_t)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * p + 1)) - p;
            dx = (int32_t)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * p + 1)) - p;
        }
        if (d->hflip) flip = (int32_t)(vh_sampler_rng_next(&rng) & 1);
    }
    for (int c = 0; c < CHANNELS; c++) {
        const float *lut = d->lut[c];
        const uint8_t *s = src + c * SIDE * SIDE;
        float *o = dst + c * SIDE * SIDE;
        if (dy == 0 && dx == 0 && !flip) {
            for (int k = 0; k < SIDE * SIDE; k++) o[k] = lut[s[k]];
            continue;
        }
        for (int y = 0; y < SIDE; y++) {
            int sy = y + dy;
            for (int x = 0; x < SIDE; x++) {
                int sx = (flip ? SIDE - 1 - x : x) + dx;
                o[y * SIDE + x] = (sy < 0 || sy >= SIDE || sx < 0 || sx >= SIDE)
                                      ? lut[0]
                                      : lut[s[sy * SIDE + sx]];
            }
        }
    }
}

static vh_status fill_batch(void *ctx, int64_t batch, vh_prefetch_slot *slot, int worker,
                            char *err, size_t err_len) {
    (void)worker;
    const cifar_data *d = ctx;
    const vh_sampler *sampler = d->samplers[d->split];
    const cifar_set *set = &d->sets[d->split];
    const int augment = d->split == VH_SPLIT_TRAIN;
    const int64_t *indices;
    int64_t count;
    if (vh_sampler_batch(sampler, batch, &indices, &count) != VH_STATUS_OK) {
        snprintf(err, err_len, "cifar: batch %lld is outside the pass", (long long)batch);
        return VH_STATUS_ERR_INTERNAL;
    }
    for (int64_t j = 0; j < count; j++) {
        int64_t i = indices[j];
        convert_image(d, set->pixels + i * PIXELS, slot->images + j * PIXELS,
                      augment ? vh_sampler_sample_key(sampler, i) : 0, augment);
        slot->labels[j] = set->labels[i];
    }
    slot->size = count;
    return VH_STATUS_OK;
}

/* ---- the plugin ----------------------------------------------------------- */

static void cifar_destroy(void *self) {
    cifar_data *d = self;
    if (!d) return;
    vh_host *host = d->host;
    vh_prefetch_free(d->prefetch);
    for (int k = 0; k < 2; k++) {
        vh_sampler_free(d->samplers[k]);
        host->api->free(host, d->sets[k].pixels);
        host->api->free(host, d->sets[k].labels);
    }
    host->api->free(host, d);
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
        (st = host->api->config_bool(host, "hflip", &d->hflip)) != VH_STATUS_OK ||
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
    if (*workers < 0 || *workers > 64)
        return host->api->config_fail(host, "workers", "%lld is outside [0, 64]",
                                      (long long)*workers);
    if (*depth < 1 || *depth > 64)
        return host->api->config_fail(host, "prefetch", "%lld is outside [1, 64]",
                                      (long long)*depth);
    d->pad_crop = (int32_t)pad;

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
    if (!setup || setup->struct_size < sizeof *setup)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing or too small");
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
        st = load_set(d, &d->sets[VH_SPLIT_TRAIN], root,
                      d->cifar100 ? cifar100_train : cifar10_train);
    if (st == VH_STATUS_OK)
        st = load_set(d, &d->sets[VH_SPLIT_EVAL], root, d->cifar100 ? cifar100_eval : cifar10_eval);
    for (int k = 0; k < 2 && st == VH_STATUS_OK; k++) {
        vh_sampler_setup su = {.struct_size = sizeof su, .size = d->sets[k].count,
                               .rank = setup->rank, .world_size = setup->world_size,
                               .batch_size = setup->batch_size, .split = (vh_split)k,
                               .seed = setup->seed};
        st = vh_sampler_init(host, &su, &d->samplers[k]);
    }
    if (st == VH_STATUS_OK) {
        vh_prefetch_setup ps = {.struct_size = sizeof ps, .workers = (int32_t)workers,
                                .depth = (int32_t)depth, .max_batch = setup->batch_size,
                                .image_floats = setup->batch_size * PIXELS, .fill = fill_batch,
                                .ctx = d};
        st = vh_prefetch_init(host, &ps, &d->prefetch);
    }
    if (st != VH_STATUS_OK) {
        cifar_destroy(d);
        return st;
    }
    host->api->log(host, VH_LOG_LEVEL_INFO, "cifar: %s, %lld train + %lld eval images from %s",
                   d->cifar100 ? "CIFAR-100" : "CIFAR-10", (long long)d->sets[0].count,
                   (long long)d->sets[1].count, root);
    *self = d;
    return VH_STATUS_OK;
}

static vh_status cifar_info(void *self, vh_data_info *out) {
    cifar_data *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
#define COVERS(m) (out->struct_size >= offsetof(vh_data_info, m) + sizeof out->m)
    if (COVERS(channels)) out->channels = CHANNELS;
    if (COVERS(height)) out->height = SIDE;
    if (COVERS(width)) out->width = SIDE;
    if (COVERS(num_classes)) out->num_classes = d->classes;
    if (COVERS(train_size)) out->train_size = d->sets[VH_SPLIT_TRAIN].count;
    if (COVERS(eval_size)) out->eval_size = d->sets[VH_SPLIT_EVAL].count;
#undef COVERS
    return VH_STATUS_OK;
}

/* Makes `split` the current pass from batch `first` on. */
static vh_status begin_pass(cifar_data *d, vh_split split, int64_t first) {
    vh_prefetch_stop(d->prefetch);
    d->active = 0;
    d->split = split;
    vh_status st = vh_prefetch_start(d->prefetch, first, vh_sampler_batches(d->samplers[split]));
    if (st != VH_STATUS_OK) return st;
    d->active = 1;
    return VH_STATUS_OK;
}

static vh_status cifar_start_epoch(void *self, vh_split split, int64_t epoch) {
    cifar_data *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (split != VH_SPLIT_TRAIN && split != VH_SPLIT_EVAL)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "cifar: unknown split %d",
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

static vh_status cifar_next(void *self, vh_batch *out, int *has_batch) {
    cifar_data *d = self;
    if (!d || !out || !has_batch) return VH_STATUS_ERR_INVALID_ARG;
    *has_batch = 0;
    if (!d->active)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "cifar: next called before start_epoch");
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
                              .shape = {slot->size, CHANNELS, SIDE, SIDE}};
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

#define STATE_MAGIC 0x52464356u /* "VCFR" */
#define STATE_VERSION 1u
#define STATE_HEADER 16
#define STATE_BYTES (STATE_HEADER + VH_SAMPLER_STATE_BYTES)

static vh_status cifar_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = STATE_BYTES;
    return VH_STATUS_OK;
}

static vh_status cifar_state_save(void *self, void *buf, size_t bytes) {
    cifar_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < STATE_BYTES)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "cifar: state buffer of %zu bytes, %d needed", bytes,
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

static vh_status cifar_state_load(void *self, const void *buf, size_t bytes) {
    cifar_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    uint32_t h[4];
    if (bytes != STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "cifar: state of %zu bytes, expected %d", bytes, STATE_BYTES);
    memcpy(h, buf, sizeof h);
    if (h[0] != STATE_MAGIC || h[1] != STATE_VERSION || h[2] > 1)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "not a cifar data state");
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
                               "cifar: corrupt state (a pass in progress, never started)");
    return begin_pass(d, VH_SPLIT_TRAIN, cursor);
}

static const vh_data_vtable vtable = {
    .struct_size = sizeof(vh_data_vtable),
    .create = cifar_create,
    .destroy = cifar_destroy,
    .info = cifar_info,
    .start_epoch = cifar_start_epoch,
    .next = cifar_next,
    .state_size = cifar_state_size,
    .state_save = cifar_state_save,
    .state_load = cifar_state_load,
};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "cifar", "0.1.0", "CIFAR-10 and CIFAR-100, binary version",
                 schema, vtable);
