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
 * image_size. Order, per-rank split, prefetching, batches and the resumable
 * position: vh_data_pass, as every data plugin.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vithost/vithost.h"
#include "vithost/vh_random.h"

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
    vh_data_pass *pass; /* first: the VH_DATA_PASS_VTABLE entries find it here */
    vh_host *host;
    uint64_t seed;
    int32_t channels, height, width, classes;
    int64_t chw, pool_size;
    int64_t sizes[2]; /* by vh_split */
    float *pool;      /* (pool_size, chw) */
} synth_data;


static int64_t pool_entry(const synth_data *d, vh_split split, int64_t i) {
    uint64_t h =
        vh_splitmix64(vh_splitmix64(vh_splitmix64(d->seed ^ 0x5359000000000000ull) ^ (uint64_t)split) ^ (uint64_t)i);
    return (int64_t)(h % (uint64_t)d->pool_size);
}

static vh_status fill_batch(void *ctx, const vh_data_pass_batch *b, char *err, size_t err_len) {
    (void)err, (void)err_len;
    const synth_data *d = ctx;
    for (int64_t j = 0; j < b->count; j++) {
        int64_t e = pool_entry(d, b->split, b->samples[j]);
        memcpy(b->images + j * d->chw, d->pool + e * d->chw, (size_t)d->chw * sizeof(float));
        b->labels[j] = (int32_t)(e % d->classes);
    }
    return VH_STATUS_OK;
}

static void synth_destroy(void *self) {
    synth_data *d = self;
    if (!d) return;
    vh_host *host = d->host;
    vh_data_pass_free(d->pass); /* joins the workers before the pool goes */
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
    /* A setup of an older minor reads with its missing members zero. */
    vh_data_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing");
    setup = &setup_v;
    synth_data *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "synthetic: out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    d->seed = setup->seed;

    int64_t workers, depth;
    vh_status st = read_config(d, &workers, &depth);
    if (st == VH_STATUS_OK) {
        vh_data_pass_setup ps = {.struct_size = sizeof ps, .name = "synthetic",
                                 .state_magic = 0x4e595356u /* "VSYN" */, .data = setup,
                                 .train_size = d->sizes[VH_SPLIT_TRAIN],
                                 .eval_size = d->sizes[VH_SPLIT_EVAL], .channels = d->channels,
                                 .height = d->height, .width = d->width, .num_classes = d->classes,
                                 .workers = (int32_t)workers, .depth = (int32_t)depth,
                                 .fill = fill_batch, .ctx = d};
        st = vh_data_pass_init(host, &ps, &d->pass); /* workers idle until start_epoch */
    }
    if (st == VH_STATUS_OK) { /* RandAugment: the pixels span [-sqrt(3), sqrt(3)) */
        float black[64], white[64];
        for (int32_t c = 0; c < d->channels && c < 64; c++)
            black[c] = -(float)sqrt(3.0), white[c] = (float)sqrt(3.0);
        st = vh_data_pass_set_range(d->pass, black, white);
    }
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
            uint64_t rng = vh_splitmix64(vh_splitmix64(d->seed ^ 0x504f000000000000ull) ^ (uint64_t)e);
            float *img = d->pool + e * d->chw;
            for (int64_t k = 0; k < d->chw; k++)
                img[k] = (float)(vh_sampler_rng_next(&rng) >> 40) * scale - shift;
        }
    }
    if (st != VH_STATUS_OK) {
        synth_destroy(d);
        return st;
    }
    *self = d;
    return VH_STATUS_OK;
}

static const vh_data_vtable vtable = {VH_DATA_PASS_VTABLE, .create = synth_create,
                                      .destroy = synth_destroy};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "synthetic", "0.1.0",
                 "random images and labels of any shape, for benchmarks", schema, vtable);
