/* synthetic.c - the `synthetic` data plugin: random images of any shape, for
 * benchmarks that must not wait on storage or decoding.
 *
 * At create, a pool of `pool_size` images is drawn once, each pixel uniform
 * in [-sqrt(3), sqrt(3)) (mean 0, variance 1: "already normalised"). Sample
 * i of a split is pool image e(i) = hash(seed, split, i) mod pool_size, and
 * its label is e(i) mod num_classes, so a model can fit the pool but the
 * images carry no other structure. A batch costs one memcpy per sample
 * (done ahead of training by `workers` threads). Everything is deterministic
 * from the run's seed.
 *
 * Sizes: channels x height x width, with height and width defaulting to
 * image_size. Order and per-rank split: vh_sampler, as every data plugin.
 *
 * Passes: start_epoch(EVAL) in the middle of a training pass (the host's
 * eval_every_steps) suspends that pass; once the eval pass has ended (next
 * said has_batch = 0), next continues the training pass where it stood.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "vithost/vithost.h"
#include "vithost/vh_prefetch.h"
#include "vithost/vh_sampler.h"

static const vh_config_key schema[] = {
    {"channels", VH_CONFIG_TYPE_INT, "3", "image channels", NULL, 1, 64, 0},
    {"image_size", VH_CONFIG_TYPE_INT, "32", "image side (height and width unless those are set)",
     NULL, 1, 8192, 0},
    {"height", VH_CONFIG_TYPE_INT, NULL, "image height; default: image_size", NULL, 1, 8192,
     VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"width", VH_CONFIG_TYPE_INT, NULL, "image width; default: image_size", NULL, 1, 8192,
     VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"num_classes", VH_CONFIG_TYPE_INT, "10", "number of classes", NULL, 1, 1000000, 0},
    {"train_size", VH_CONFIG_TYPE_INT, "50000", "training samples (all ranks)", NULL, 1, 1e12, 0},
    {"eval_size", VH_CONFIG_TYPE_INT, "10000", "evaluation samples (all ranks)", NULL, 1, 1e12, 0},
    {"pool_size", VH_CONFIG_TYPE_INT, "64", "distinct random images drawn at create", NULL, 1,
     65536, 0},
    {"workers", VH_CONFIG_TYPE_INT, "1", "threads copying batches ahead; 0: on the training thread",
     NULL, 0, 64, 0},
    {"prefetch", VH_CONFIG_TYPE_INT, "3", "batch slots: the one in use plus those filled ahead",
     NULL, 1, 64, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

typedef struct synth_data {
    vh_host *host;
    uint64_t seed;
    int64_t batch_size;
    int32_t channels, height, width, classes;
    int64_t chw, pool_size;
    int64_t sizes[2]; /* by vh_split */
    float *pool;      /* (pool_size, chw) */

    vh_sampler *samplers[2];
    vh_prefetch *prefetch;
    /* The current pass (`split`; read by the workers, changed only while
     * the prefetcher is stopped), and a training pass an eval pass
     * interrupted, which goes on at train_cursor once the eval pass ends. */
    int active;
    vh_split split;
    int train_suspended;
    int64_t train_cursor;
} synth_data;

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int64_t pool_entry(const synth_data *d, vh_split split, int64_t i) {
    uint64_t h =
        mix64(mix64(mix64(d->seed ^ 0x5359000000000000ull) ^ (uint64_t)split) ^ (uint64_t)i);
    return (int64_t)(h % (uint64_t)d->pool_size);
}

static vh_status fill_batch(void *ctx, int64_t batch, vh_prefetch_slot *slot, int worker,
                            char *err, size_t err_len) {
    (void)worker;
    const synth_data *d = ctx;
    const int64_t *indices;
    int64_t count;
    if (vh_sampler_batch(d->samplers[d->split], batch, &indices, &count) != VH_STATUS_OK) {
        snprintf(err, err_len, "synthetic: batch %lld is outside the pass", (long long)batch);
        return VH_STATUS_ERR_INTERNAL;
    }
    for (int64_t j = 0; j < count; j++) {
        int64_t e = pool_entry(d, d->split, indices[j]);
        memcpy(slot->images + j * d->chw, d->pool + e * d->chw, (size_t)d->chw * sizeof(float));
        slot->labels[j] = (int32_t)(e % d->classes);
    }
    slot->size = count;
    return VH_STATUS_OK;
}

static void synth_destroy(void *self) {
    synth_data *d = self;
    if (!d) return;
    vh_host *host = d->host;
    vh_prefetch_free(d->prefetch);
    vh_sampler_free(d->samplers[0]);
    vh_sampler_free(d->samplers[1]);
    host->api->free(host, d->pool);
    host->api->free(host, d);
}

static vh_status read_config(synth_data *d, int64_t *workers, int64_t *depth) {
    vh_host *host = d->host;
    int64_t channels, side, height, width, classes;
    vh_status st;
    if ((st = host->api->config_int(host, "channels", &channels)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "image_size", &side)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "num_classes", &classes)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "train_size", &d->sizes[VH_SPLIT_TRAIN])) !=
            VH_STATUS_OK ||
        (st = host->api->config_int(host, "eval_size", &d->sizes[VH_SPLIT_EVAL])) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "pool_size", &d->pool_size)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "workers", workers)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "prefetch", depth)) != VH_STATUS_OK)
        return host->api->fail(host, st, "synthetic: cannot read its configuration");
    height = width = side;
    if (host->api->config_has(host, "height") &&
        (st = host->api->config_int(host, "height", &height)) != VH_STATUS_OK)
        return host->api->fail(host, st, "synthetic: cannot read 'height'");
    if (host->api->config_has(host, "width") &&
        (st = host->api->config_int(host, "width", &width)) != VH_STATUS_OK)
        return host->api->fail(host, st, "synthetic: cannot read 'width'");
    /* The schema bounded each value; these guard what the code relies on. */
    if (channels < 1 || channels > 64)
        return host->api->config_fail(host, "channels", "%lld is outside [1, 64]",
                                      (long long)channels);
    if (height < 1 || height > 8192 || width < 1 || width > 8192)
        return host->api->config_fail(host, "image_size", "image of %lldx%lld is outside 1..8192",
                                      (long long)height, (long long)width);
    if (classes < 1 || classes > 1000000)
        return host->api->config_fail(host, "num_classes", "%lld is outside [1, 1000000]",
                                      (long long)classes);
    if (d->pool_size < 1 || d->pool_size > 65536)
        return host->api->config_fail(host, "pool_size", "%lld is outside [1, 65536]",
                                      (long long)d->pool_size);
    if (d->sizes[0] < 1 || d->sizes[1] < 1)
        return host->api->config_fail(host, d->sizes[0] < 1 ? "train_size" : "eval_size",
                                      "must be at least 1");
    d->channels = (int32_t)channels;
    d->height = (int32_t)height;
    d->width = (int32_t)width;
    d->classes = (int32_t)classes;
    d->chw = channels * height * width;
    return VH_STATUS_OK;
}

static vh_status synth_create(vh_host *host, const vh_data_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    if (!setup || setup->struct_size < sizeof *setup)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing or too small");
    synth_data *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "synthetic: out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    d->seed = setup->seed;
    d->batch_size = setup->batch_size;

    int64_t workers, depth;
    vh_status st = read_config(d, &workers, &depth);
    for (int k = 0; k < 2 && st == VH_STATUS_OK; k++) {
        vh_sampler_setup su = {.struct_size = sizeof su, .size = d->sizes[k], .rank = setup->rank,
                               .world_size = setup->world_size, .batch_size = setup->batch_size,
                               .split = (vh_split)k, .seed = setup->seed};
        st = vh_sampler_init(host, &su, &d->samplers[k]);
    }
    if (st == VH_STATUS_OK && (uint64_t)d->batch_size > (uint64_t)INT64_MAX / 8 / (uint64_t)d->chw)
        st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                             "synthetic: batch size %lld is too large", (long long)d->batch_size);
    if (st == VH_STATUS_OK) {
        d->pool = host->api->alloc(host, (size_t)d->pool_size * (size_t)d->chw * sizeof(float));
        if (!d->pool)
            st =
                host->api->fail(host, VH_STATUS_ERR_NOMEM,
                                "synthetic: out of memory for a pool of %lld images of %lld floats",
                                (long long)d->pool_size, (long long)d->chw);
    }
    if (st == VH_STATUS_OK) {
        const float scale = (float)(2.0 * sqrt(3.0) / 16777216.0), shift = (float)sqrt(3.0);
        for (int64_t e = 0; e < d->pool_size; e++) {
            uint64_t rng = mix64(mix64(d->seed ^ 0x504f000000000000ull) ^ (uint64_t)e);
            float *img = d->pool + e * d->chw;
            for (int64_t k = 0; k < d->chw; k++)
                img[k] = (float)(vh_sampler_rng_next(&rng) >> 40) * scale - shift;
        }
        vh_prefetch_setup ps = {.struct_size = sizeof ps,
                                .workers = (int32_t)workers,
                                .depth = (int32_t)depth,
                                .max_batch = d->batch_size,
                                .image_floats = d->batch_size * d->chw,
                                .fill = fill_batch,
                                .ctx = d};
        st = vh_prefetch_init(host, &ps, &d->prefetch);
    }
    if (st != VH_STATUS_OK) {
        synth_destroy(d);
        return st;
    }
    *self = d;
    return VH_STATUS_OK;
}

static vh_status synth_info(void *self, vh_data_info *out) {
    synth_data *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
#define COVERS(m) (out->struct_size >= offsetof(vh_data_info, m) + sizeof out->m)
    if (COVERS(channels)) out->channels = d->channels;
    if (COVERS(height)) out->height = d->height;
    if (COVERS(width)) out->width = d->width;
    if (COVERS(num_classes)) out->num_classes = d->classes;
    if (COVERS(train_size)) out->train_size = d->sizes[VH_SPLIT_TRAIN];
    if (COVERS(eval_size)) out->eval_size = d->sizes[VH_SPLIT_EVAL];
#undef COVERS
    return VH_STATUS_OK;
}

/* Makes `split` the current pass from batch `first` on. */
static vh_status begin_pass(synth_data *d, vh_split split, int64_t first) {
    vh_prefetch_stop(d->prefetch);
    d->active = 0;
    d->split = split;
    vh_status st = vh_prefetch_start(d->prefetch, first, vh_sampler_batches(d->samplers[split]));
    if (st != VH_STATUS_OK) return st;
    d->active = 1;
    return VH_STATUS_OK;
}

static vh_status synth_start_epoch(void *self, vh_split split, int64_t epoch) {
    synth_data *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (split != VH_SPLIT_TRAIN && split != VH_SPLIT_EVAL)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "synthetic: unknown split %d",
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

static vh_status synth_next(void *self, vh_batch *out, int *has_batch) {
    synth_data *d = self;
    if (!d || !out || !has_batch) return VH_STATUS_ERR_INVALID_ARG;
    *has_batch = 0;
    if (!d->active)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "synthetic: next called before start_epoch");
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
                              .shape = {slot->size, d->channels, d->height, d->width}};
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

#define STATE_MAGIC 0x4e595356u /* "VSYN" */
#define STATE_VERSION 1u
#define STATE_HEADER 16
#define STATE_BYTES (STATE_HEADER + VH_SAMPLER_STATE_BYTES)

static vh_status synth_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = STATE_BYTES;
    return VH_STATUS_OK;
}

static vh_status synth_state_save(void *self, void *buf, size_t bytes) {
    synth_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < STATE_BYTES)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "synthetic: state buffer of %zu bytes, %d needed", bytes,
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

static vh_status synth_state_load(void *self, const void *buf, size_t bytes) {
    synth_data *d = self;
    if (!d || !buf) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    uint32_t h[4];
    if (bytes != STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "synthetic: state of %zu bytes, expected %d", bytes, STATE_BYTES);
    memcpy(h, buf, sizeof h);
    if (h[0] != STATE_MAGIC || h[1] != STATE_VERSION || h[2] > 1)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "not a synthetic data state");
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
                               "synthetic: corrupt state (a pass in progress, never started)");
    return begin_pass(d, VH_SPLIT_TRAIN, cursor);
}

static const vh_data_vtable vtable = {
    .struct_size = sizeof(vh_data_vtable),
    .create = synth_create,
    .destroy = synth_destroy,
    .info = synth_info,
    .start_epoch = synth_start_epoch,
    .next = synth_next,
    .state_size = synth_state_size,
    .state_save = synth_state_save,
    .state_load = synth_state_load,
};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "synthetic", "0.1.0",
                 "random images and labels of any shape, for benchmarks", schema, vtable);
