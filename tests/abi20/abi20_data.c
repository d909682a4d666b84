/* abi20_data.c - the data role's test plugin: synthetic, deterministic,
 * learnable images.
 *
 * ABI 2.0, frozen: tests/plugins/test_data.c as it shipped with ABI 2.0,
 * built against tests/abi20/include (the 2.0 headers, their sizes) and
 * declaring minor 0. It stands for a plugin compiled once against 2.0 that
 * every 2.x host must still load, train and resume (tests/test_abi20.c).
 * Never port it to newer headers. Its vtable is followed by words that are
 * no pointers (abi20_poison.h), so a host that reads past it fails at once.
 *
 * Sample i of a split has label hash(i, split) % num_classes and image
 *
 *     image = pattern[label] + noise * uniform(-1, 1)
 *
 * where pattern[c] is a fixed (seed-independent) draw in [-1, 1] per class and
 * the noise comes from a PRNG seeded by (run seed, split, i). A linear
 * classifier separates the classes, so a short training shows a falling loss
 * and an accuracy far above chance.
 *
 * Per-rank split, as PyTorch's DistributedSampler: the train order of an
 * epoch is a Fisher-Yates shuffle of [0, train_size) seeded by (seed, epoch);
 * rank r of w takes positions r, r + w, ..., the same number on every rank
 * (train_size / w), and only full batches. Eval is not shuffled: rank r takes
 * samples r, r + w, ... < eval_size and the last batch may be short.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vithost/vh_config.h"
#include "vithost/vh_data.h"
#include "vithost/vh_host.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_random.h"

#include "abi20_poison.h"

/* ---- random numbers: the SDK's splitmix64 ------------------------------ */

static uint64_t rng_next(uint64_t *state) {
    *state += VH_SPLITMIX64_GAMMA;
    return vh_splitmix64_mix(*state);
}

/* Uniform in [-1, 1): 24 random bits, exact in fp32. */
static float rng_sym(uint64_t *state) {
    return (float)(rng_next(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* Distinct streams for distinct purposes. */
enum { STREAM_LABEL = 1, STREAM_PATTERN = 2, STREAM_NOISE = 3, STREAM_SHUFFLE = 4 };

static uint64_t label_of(vh_split split, int64_t i, int32_t classes) {
    uint64_t h = vh_splitmix64(vh_splitmix64(((uint64_t)STREAM_LABEL << 56) ^ (uint64_t)split) ^ (uint64_t)i);
    return h % (uint64_t)classes;
}

/* ---- the plugin ------------------------------------------------------- */

typedef struct abi20_data {
    vh_host *host;
    int32_t rank, world;
    int64_t batch_size;
    uint64_t seed;

    int32_t channels, image_size, classes;
    int64_t train_size, eval_size;
    float noise;
    int64_t chw;

    float *patterns;     /* (classes, chw) */
    int64_t *order;      /* train permutation of the epoch `order_epoch` */
    int64_t order_epoch; /* -1: none built */
    int64_t train_local; /* samples per rank and epoch: train_size / world */
    int64_t eval_local;  /* this rank's eval samples */

    float *images;   /* (batch_size, chw) */
    int32_t *labels; /* (batch_size) */

    /* the position, which state_save/state_load carry */
    int active;
    vh_split split;
    int64_t epoch;
    int64_t cursor; /* samples of this rank's pass already handed out */
} abi20_data;

static const vh_config_key schema[] = {
    {"channels", VH_CONFIG_TYPE_INT, "1", "image channels", NULL, 1, 4, 0},
    {"image_size", VH_CONFIG_TYPE_INT, "8", "image side in pixels", NULL, 1, 64, 0},
    {"num_classes", VH_CONFIG_TYPE_INT, "4", "number of classes", NULL, 2, 100, 0},
    {"train_size", VH_CONFIG_TYPE_INT, "256", "training samples (all ranks)", NULL, 1, 1e6, 0},
    {"eval_size", VH_CONFIG_TYPE_INT, "64", "evaluation samples (all ranks)", NULL, 1, 1e6, 0},
    {"noise", VH_CONFIG_TYPE_FLOAT, "0.5", "amplitude of the uniform noise added to the class pattern",
     NULL, 0, 10, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status get_int(vh_host *host, const char *key, int64_t *out) {
    vh_status st = host->api->config_int(host, key, out);
    if (st != VH_STATUS_OK) return host->api->fail(host, st, "cannot read the int key '%s'", key);
    return VH_STATUS_OK;
}

static void data_destroy(void *self) {
    abi20_data *d = self;
    if (!d) return;
    vh_host *host = d->host;
    host->api->free(host, d->patterns);
    host->api->free(host, d->order);
    host->api->free(host, d->images);
    host->api->free(host, d->labels);
    host->api->free(host, d);
}

static vh_status read_config(abi20_data *d) {
    vh_host *host = d->host;
    int64_t channels, image_size, classes;
    double noise;
    vh_status st;
    if ((st = get_int(host, "channels", &channels)) != VH_STATUS_OK) return st;
    if ((st = get_int(host, "image_size", &image_size)) != VH_STATUS_OK) return st;
    if ((st = get_int(host, "num_classes", &classes)) != VH_STATUS_OK) return st;
    if ((st = get_int(host, "train_size", &d->train_size)) != VH_STATUS_OK) return st;
    if ((st = get_int(host, "eval_size", &d->eval_size)) != VH_STATUS_OK) return st;
    st = host->api->config_float(host, "noise", &noise);
    if (st != VH_STATUS_OK) return host->api->fail(host, st, "cannot read the float key 'noise'");

    /* The host checked the schema ranges; these guard what the code relies on. */
    if (channels < 1 || channels > 4)
        return host->api->config_fail(host, "channels", "%lld is outside [1, 4]", (long long)channels);
    if (image_size < 1 || image_size > 64)
        return host->api->config_fail(host, "image_size", "%lld is outside [1, 64]",
                                      (long long)image_size);
    if (classes < 2 || classes > 100)
        return host->api->config_fail(host, "num_classes", "%lld is outside [2, 100]",
                                      (long long)classes);
    if (d->train_size < 1 || d->train_size > 1000000)
        return host->api->config_fail(host, "train_size", "%lld is outside [1, 1000000]",
                                      (long long)d->train_size);
    if (d->eval_size < 1 || d->eval_size > 1000000)
        return host->api->config_fail(host, "eval_size", "%lld is outside [1, 1000000]",
                                      (long long)d->eval_size);
    if (!(noise >= 0.0 && noise <= 10.0))
        return host->api->config_fail(host, "noise", "%g is outside [0, 10]", noise);
    d->channels = (int32_t)channels;
    d->image_size = (int32_t)image_size;
    d->classes = (int32_t)classes;
    d->noise = (float)noise;
    d->chw = channels * image_size * image_size;
    return VH_STATUS_OK;
}

static vh_status data_create(vh_host *host, const vh_data_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    /* A setup of an older minor reads with its missing members zero. */
    vh_data_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing");
    setup = &setup_v;
    if (setup->world_size < 1 || setup->rank < 0 || setup->rank >= setup->world_size)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "rank %d of world %d is invalid",
                               (int)setup->rank, (int)setup->world_size);
    if (setup->batch_size < 1)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "batch size %lld must be >= 1",
                               (long long)setup->batch_size);

    abi20_data *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    d->rank = setup->rank;
    d->world = setup->world_size;
    d->batch_size = setup->batch_size;
    d->seed = setup->seed;
    d->order_epoch = -1;

    vh_status st = read_config(d);
    if (st != VH_STATUS_OK) {
        data_destroy(d);
        return st;
    }

    d->train_local = d->train_size / d->world;
    d->eval_local = (d->eval_size - d->rank + d->world - 1) / d->world;
    if (d->train_local < d->batch_size) {
        st = host->api->config_fail(host, "train_size",
                                    "%lld samples over %d rank(s) leave %lld per rank, fewer "
                                    "than one batch of %lld",
                                    (long long)d->train_size, (int)d->world,
                                    (long long)d->train_local, (long long)d->batch_size);
        data_destroy(d);
        return st;
    }
    if (d->eval_size < d->world) {
        st = host->api->config_fail(host, "eval_size", "%lld samples leave some of %d ranks none",
                                    (long long)d->eval_size, (int)d->world);
        data_destroy(d);
        return st;
    }
    /* chw <= 16384: the batch fits in size_t when batch_size does not overflow it. */
    if ((uint64_t)d->batch_size > SIZE_MAX / ((size_t)d->chw * sizeof(float))) {
        st = host->api->fail(host, VH_STATUS_ERR_NOMEM, "batch size %lld is too large",
                             (long long)d->batch_size);
        data_destroy(d);
        return st;
    }

    d->patterns = host->api->alloc(host, (size_t)d->classes * (size_t)d->chw * sizeof(float));
    d->order = host->api->alloc(host, (size_t)d->train_size * sizeof(int64_t));
    d->images = host->api->alloc(host, (size_t)d->batch_size * (size_t)d->chw * sizeof(float));
    d->labels = host->api->alloc(host, (size_t)d->batch_size * sizeof(int32_t));
    if (!d->patterns || !d->order || !d->images || !d->labels) {
        data_destroy(d);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %lld-sample batches",
                               (long long)setup->batch_size);
    }

    /* Class patterns: independent of the run's seed, so every run learns the same task. */
    for (int32_t c = 0; c < d->classes; c++) {
        uint64_t s = vh_splitmix64(((uint64_t)STREAM_PATTERN << 56) ^ (uint64_t)c);
        float *p = d->patterns + (int64_t)c * d->chw;
        for (int64_t k = 0; k < d->chw; k++) p[k] = rng_sym(&s);
    }
    *self = d;
    return VH_STATUS_OK;
}

static vh_status data_info(void *self, vh_data_info *out) {
    abi20_data *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
    /* An out-struct: the caller set struct_size (maybe of an older minor);
     * fill only the members it covers. */
#define COVERS(m) (out->struct_size >= offsetof(vh_data_info, m) + sizeof out->m)
    if (COVERS(channels)) out->channels = d->channels;
    if (COVERS(height)) out->height = d->image_size;
    if (COVERS(width)) out->width = d->image_size;
    if (COVERS(num_classes)) out->num_classes = d->classes;
    if (COVERS(train_size)) out->train_size = d->train_size;
    if (COVERS(eval_size)) out->eval_size = d->eval_size;
#undef COVERS
    return VH_STATUS_OK;
}

/* The train permutation of one epoch, the same on every rank. */
static void build_order(abi20_data *d, int64_t epoch) {
    if (d->order_epoch == epoch) return;
    for (int64_t i = 0; i < d->train_size; i++) d->order[i] = i;
    uint64_t s = vh_splitmix64(vh_splitmix64(((uint64_t)STREAM_SHUFFLE << 56) ^ d->seed) ^ (uint64_t)epoch);
    for (int64_t i = d->train_size - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_next(&s) % (uint64_t)(i + 1));
        int64_t t = d->order[i];
        d->order[i] = d->order[j];
        d->order[j] = t;
    }
    d->order_epoch = epoch;
}

static vh_status data_start_epoch(void *self, vh_split split, int64_t epoch) {
    abi20_data *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (split != VH_SPLIT_TRAIN && split != VH_SPLIT_EVAL)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unknown split %d", (int)split);
    if (epoch < 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "epoch %lld is negative",
                               (long long)epoch);
    if (split == VH_SPLIT_TRAIN) build_order(d, epoch);
    d->active = 1;
    d->split = split;
    d->epoch = epoch;
    d->cursor = 0;
    return VH_STATUS_OK;
}

static void make_sample(const abi20_data *d, vh_split split, int64_t i, float *image,
                        int32_t *label) {
    int32_t c = (int32_t)label_of(split, i, d->classes);
    const float *p = d->patterns + (int64_t)c * d->chw;
    uint64_t s = vh_splitmix64(vh_splitmix64(vh_splitmix64(((uint64_t)STREAM_NOISE << 56) ^ d->seed) ^ (uint64_t)split) ^
                       (uint64_t)i);
    for (int64_t k = 0; k < d->chw; k++) image[k] = p[k] + d->noise * rng_sym(&s);
    *label = c;
}

static vh_status data_next(void *self, vh_batch *out, int *has_batch) {
    abi20_data *d = self;
    if (!d || !out || !has_batch) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    *has_batch = 0;
    if (!d->active)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "next called before start_epoch");

    int64_t b;
    if (d->split == VH_SPLIT_TRAIN) {
        b = d->cursor + d->batch_size <= d->train_local ? d->batch_size : 0; /* full batches only */
    } else {
        int64_t left = d->eval_local - d->cursor;
        b = left < d->batch_size ? left : d->batch_size;
    }
    if (b <= 0) return VH_STATUS_OK;

    for (int64_t j = 0; j < b; j++) {
        int64_t pos = d->rank + (d->cursor + j) * d->world;
        int64_t i = d->split == VH_SPLIT_TRAIN ? d->order[pos] : pos;
        make_sample(d, d->split, i, d->images + j * d->chw, d->labels + j);
    }
    d->cursor += b;

    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->images.data = d->images;
    out->images.dtype = VH_DTYPE_F32;
    out->images.device = VH_DEVICE_KIND_CPU;
    out->images.ndim = 4;
    out->images.shape[0] = b;
    out->images.shape[1] = d->channels;
    out->images.shape[2] = d->image_size;
    out->images.shape[3] = d->image_size;
    out->labels.data = d->labels;
    out->labels.dtype = VH_DTYPE_I32;
    out->labels.device = VH_DEVICE_KIND_CPU;
    out->labels.ndim = 1;
    out->labels.shape[0] = b;
    out->size = b;
    *has_batch = 1;
    return VH_STATUS_OK;
}

/* ---- resumable position ---------------------------------------------- */

#define STATE_MAGIC 0x54534454u /* "TDST" */
#define STATE_VERSION 1u

typedef struct data_state {
    uint32_t magic, version;
    int32_t active, split;
    int64_t epoch, cursor;
    int64_t train_local, eval_local; /* must match: same sizes, ranks, world */
    uint64_t seed;                   /* must match: the shuffle depends on it */
} data_state;

static vh_status data_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = sizeof(data_state);
    return VH_STATUS_OK;
}

static vh_status data_state_save(void *self, void *buf, size_t bytes) {
    abi20_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < sizeof(data_state))
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "state buffer of %zu bytes, %zu needed", bytes,
                                  sizeof(data_state));
    data_state s;
    memset(&s, 0, sizeof s);
    s.magic = STATE_MAGIC;
    s.version = STATE_VERSION;
    s.active = d->active;
    s.split = (int32_t)d->split;
    s.epoch = d->epoch;
    s.cursor = d->cursor;
    s.train_local = d->train_local;
    s.eval_local = d->eval_local;
    s.seed = d->seed;
    memcpy(buf, &s, sizeof s);
    return VH_STATUS_OK;
}

static vh_status data_state_load(void *self, const void *buf, size_t bytes) {
    abi20_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    data_state s;
    if (bytes != sizeof s)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "state of %zu bytes, expected %zu",
                               bytes, sizeof s);
    memcpy(&s, buf, sizeof s);
    if (s.magic != STATE_MAGIC || s.version != STATE_VERSION)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "not an abi20_data state (version %u)",
                               (unsigned)s.version);
    if (s.train_local != d->train_local || s.eval_local != d->eval_local || s.seed != d->seed)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "state from another configuration (sizes, ranks or seed differ)");
    if ((s.split != VH_SPLIT_TRAIN && s.split != VH_SPLIT_EVAL) || s.epoch < 0 || s.cursor < 0 ||
        s.cursor > (s.split == VH_SPLIT_TRAIN ? d->train_local : d->eval_local))
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "corrupt abi20_data state");
    d->active = s.active != 0;
    d->split = (vh_split)s.split;
    d->epoch = s.epoch;
    d->cursor = s.cursor;
    if (d->active && d->split == VH_SPLIT_TRAIN) build_order(d, d->epoch);
    return VH_STATUS_OK;
}

static const struct {
    vh_data_vtable vtable;
    uintptr_t poison[8]; /* abi20_poison.h */
} shipped = {{
    .struct_size = sizeof(vh_data_vtable),
    .create = data_create,
    .destroy = data_destroy,
    .info = data_info,
    .start_epoch = data_start_epoch,
    .next = data_next,
    .state_size = data_state_size,
    .state_save = data_state_save,
    .state_load = data_state_load,
}, ABI20_POISON};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "abi20_data", "0.1.0",
                 "test plugin: synthetic learnable images, one pattern per class plus noise",
                 schema,
                 shipped.vtable);
