/* data_pass.c - a data plugin's passes: samplers, prefetcher, batches and the
 * resumable position (see vh_data_pass.h). */
#include "vithost/vh_data_pass.h"

#include <stdio.h>
#include <string.h>

#include "vithost/vh_mix.h"
#include "vithost/vh_prefetch.h"
#include "vithost/vh_rand_augment.h"

#define NAME_LEN 64
#define STATE_VERSION 1u
#define STATE_HEADER 16

struct vh_data_pass {
    vh_host *host;
    char name[NAME_LEN];
    uint32_t magic, tag;
    const char *eval_missing;
    int32_t channels, height, width, classes;
    int64_t sizes[2];        /* by vh_split */
    vh_sampler *samplers[2]; /* by vh_split; NULL for an absent eval split */
    vh_prefetch *prefetch;
    vh_data_pass_fill_fn fill;
    vh_data_pass_stopped_fn stopped;
    void *ctx;

    /* Mixup/CutMix of training batches (vh_mix.h): targets for slot k at
     * targets + k * batch * classes (batch i lives in slot i % depth). */
    vh_mix_config mix;
    int mixing;
    float *targets;
    int32_t depth, rank;
    int64_t batch;
    uint64_t seed;

    /* RandAugment of training images (vh_rand_augment.h): `range` holds the
     * values of black then white per channel (known: has_range), scratch one
     * image per worker. */
    vh_rand_augment_config ra;
    float *range, *ra_scratch;
    int has_range;

    /* The pass: `split` is read by the workers, changed only while the
     * prefetcher is stopped. */
    int active;      /* start_epoch (or state_load) began a pass */
    int finished;    /* it is over (the prefetcher stopped); next says so again */
    vh_split split;
    int64_t cursor;  /* batches of it handed out */
};

static float *slot_targets(const vh_data_pass *p, int64_t batch) {
    return p->targets + (size_t)(batch % p->depth) * (size_t)p->batch * (size_t)p->classes;
}

/* Mixes a filled training batch and writes its targets. The draws come from
 * the batch's index in the epoch, never from the worker (vh_mix_key). */
static vh_status mix_slot(const vh_data_pass *p, vh_prefetch_slot *slot, char *err,
                          size_t err_len) {
    const vh_sampler *sampler = p->samplers[VH_SPLIT_TRAIN];
    const uint64_t key = vh_mix_key(p->seed, vh_sampler_epoch(sampler), slot->index, p->rank);
    vh_mix_params mp;
    vh_status st = vh_mix_draw(&p->mix, key, p->height, p->width, &mp);
    if (st == VH_STATUS_OK)
        st = vh_mix_apply(&p->mix, &mp, slot->images, slot->labels, slot->size, p->channels,
                          p->height, p->width, slot_targets(p, slot->index));
    if (st != VH_STATUS_OK)
        snprintf(err, err_len, "%s: mixing batch %lld failed (a label outside [0, %d)?)",
                 p->name, (long long)slot->index, (int)p->classes);
    return st;
}

/* RandAugment of each image of a filled training batch, keyed by its sample
 * (never the worker), on the worker's own scratch image. */
static void augment_slot(const vh_data_pass *p, const vh_data_pass_batch *b) {
    const size_t chw = (size_t)p->channels * (size_t)p->height * (size_t)p->width;
    vh_ra_image img = {.scratch = p->ra_scratch + (size_t)b->worker * chw,
                       .channels = p->channels, .height = p->height, .width = p->width,
                       .black = p->range, .white = p->range + p->channels};
    for (int64_t j = 0; j < b->count; j++) {
        /* a stream of its own: the plugin draws its crop and flip from the key */
        const uint64_t key =
            vh_sampler_sample_key(b->sampler, b->samples[j]) ^ (0x52414e44ull << 32);
        img.data = b->images + (size_t)j * chw;
        vh_rand_augment_apply(&p->ra, key, &img);
    }
}

/* The prefetcher's fill: the batch's samples from the pass's sampler, then
 * the plugin's fill, RandAugment and mixing. On worker threads. */
static vh_status fill_slot(void *ctx, int64_t batch, vh_prefetch_slot *slot, int worker,
                           char *err, size_t err_len) {
    const vh_data_pass *p = ctx;
    const vh_sampler *sampler = p->samplers[p->split];
    vh_data_pass_batch b = {.split = p->split, .sampler = sampler, .index = batch,
                            .images = slot->images, .labels = slot->labels, .worker = worker};
    if (vh_sampler_batch(sampler, batch, &b.samples, &b.count) != VH_STATUS_OK) {
        snprintf(err, err_len, "%s: batch %lld is outside the pass", p->name, (long long)batch);
        return VH_STATUS_ERR_INTERNAL;
    }
    vh_status st = p->fill(p->ctx, &b, err, err_len);
    if (st == VH_STATUS_OK) slot->size = b.count;
    if (st == VH_STATUS_OK && p->ra.n > 0 && p->split == VH_SPLIT_TRAIN) augment_slot(p, &b);
    if (st == VH_STATUS_OK && p->mixing && p->split == VH_SPLIT_TRAIN)
        st = mix_slot(p, slot, err, err_len);
    return st;
}

/* Reads the shared mixing keys (a plugin older than 2.2 has none: off) and
 * makes room for the targets of every prefetch slot. */
static vh_status mix_init(vh_data_pass *p, const vh_data_setup *ds, int32_t depth) {
    vh_host *host = p->host;
    vh_status st = vh_mix_config_read(host, p->classes, &p->mix);
    if (st != VH_STATUS_OK || !vh_mix_enabled(&p->mix)) return st;
    p->mixing = 1;
    p->depth = depth < 1 ? 1 : depth;
    p->batch = ds->batch_size;
    p->rank = ds->rank;
    p->seed = ds->seed;
    const size_t n = (size_t)p->depth * (size_t)p->batch * (size_t)p->classes;
    if ((uint64_t)p->batch > (uint64_t)INT64_MAX / 4 / (uint64_t)p->depth / (uint64_t)p->classes ||
        !(p->targets = host->api->alloc(host, n * sizeof(float))))
        return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                               "%s: no memory for the soft targets of %d batches of %lld x %d",
                               p->name, (int)p->depth, (long long)p->batch, (int)p->classes);
    return VH_STATUS_OK;
}

/* Reads the shared RandAugment keys; when on, makes room for the pixel range
 * (from the 8-bit fill's tables, or vh_data_pass_set_range) and the scratch. */
static vh_status augment_init(vh_data_pass *p, const vh_data_pass_setup *setup) {
    vh_host *host = p->host;
    vh_status st = vh_rand_augment_config_read(host, &p->ra);
    if (st != VH_STATUS_OK || p->ra.n <= 0) return st;
    const size_t chw = (size_t)p->channels * (size_t)p->height * (size_t)p->width;
    const size_t workers = setup->workers > 1 ? (size_t)setup->workers : 1;
    p->range = host->api->alloc(host, 2 * (size_t)p->channels * sizeof(float));
    p->ra_scratch = host->api->alloc(host, workers * chw * sizeof(float));
    if (!p->range || !p->ra_scratch)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                               "%s: no memory for RandAugment's %zu scratch images", p->name,
                               workers);
    if (setup->fill == vh_data_pass_fill_u8 && setup->ctx) {
        const vh_data_pass_u8 *u = setup->ctx; /* bytes 0 and 255 through each plane's table */
        for (int32_t c = 0; c < p->channels && u->lut && c < u->planes; c++) {
            p->range[c] = u->lut[(size_t)c * 256];
            p->range[p->channels + c] = u->lut[(size_t)c * 256 + 255];
        }
        p->has_range = u->lut && u->planes == p->channels;
    }
    return VH_STATUS_OK;
}

vh_status vh_data_pass_set_range(vh_data_pass *p, const float *black, const float *white) {
    if (!p || !black || !white) return VH_STATUS_ERR_INVALID_ARG;
    if (!p->range) return VH_STATUS_OK; /* RandAugment is off: nothing reads it */
    for (int32_t c = 0; c < p->channels; c++) {
        if (!(black[c] < white[c]) && !(black[c] > white[c]))
            return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                      "%s: black and white of channel %d are both %g", p->name,
                                      (int)c, (double)black[c]);
        p->range[c] = black[c];
        p->range[p->channels + c] = white[c];
    }
    p->has_range = 1;
    return VH_STATUS_OK;
}

vh_status vh_data_pass_init(vh_host *host, const vh_data_pass_setup *setup, vh_data_pass **out) {
    if (!host || !out) return VH_STATUS_ERR_INVALID_ARG;
    *out = NULL;
    /* Setups of an older minor read with their missing members zero. */
    vh_data_pass_setup setup_v;
    vh_data_setup data_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup) || !setup_v.fill ||
        !vh_struct_upgrade(&data_v, sizeof data_v, setup_v.data) || !setup_v.name)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "data pass setup missing, or without a fill function, data setup "
                               "or name");
    setup = &setup_v;
    const char *name = setup->name;
    if (setup->channels < 1 || setup->height < 1 || setup->width < 1 || setup->eval_size < 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "%s: samples of %dx%dx%d or an eval split of %lld are invalid",
                               name, (int)setup->channels, (int)setup->height,
                               (int)setup->width, (long long)setup->eval_size);
    vh_data_pass *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "%s: out of memory", name);
    memset(p, 0, sizeof *p);
    p->host = host;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->magic = setup->state_magic;
    p->tag = setup->state_tag;
    p->eval_missing = setup->eval_missing;
    p->channels = setup->channels;
    p->height = setup->height;
    p->width = setup->width;
    p->classes = setup->num_classes;
    p->sizes[VH_SPLIT_TRAIN] = setup->train_size;
    p->sizes[VH_SPLIT_EVAL] = setup->eval_size;
    p->fill = setup->fill;
    p->stopped = setup->stopped;
    p->ctx = setup->ctx;

    const vh_data_setup *ds = &data_v;
    vh_status st = VH_STATUS_OK;
    for (int k = 0; k < 2 && st == VH_STATUS_OK; k++) {
        if (p->sizes[k] == 0 && k == VH_SPLIT_EVAL) break;
        vh_sampler_setup su = {.struct_size = sizeof su, .size = p->sizes[k], .rank = ds->rank,
                               .world_size = ds->world_size, .batch_size = ds->batch_size,
                               .split = (vh_split)k, .seed = ds->seed};
        st = vh_sampler_init(host, &su, &p->samplers[k]);
    }
    const int64_t chw = (int64_t)p->channels * p->height * p->width;
    if (st == VH_STATUS_OK && (uint64_t)ds->batch_size > (uint64_t)INT64_MAX / 8 / (uint64_t)chw)
        st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s: batch size %lld is too large",
                             p->name, (long long)ds->batch_size);
    if (st == VH_STATUS_OK) st = mix_init(p, ds, setup->depth);
    if (st == VH_STATUS_OK) st = augment_init(p, setup);
    if (st == VH_STATUS_OK) {
        vh_prefetch_setup ps = {.struct_size = sizeof ps, .workers = setup->workers,
                                .depth = setup->depth, .max_batch = ds->batch_size,
                                .image_floats = ds->batch_size * chw, .fill = fill_slot,
                                .ctx = p};
        st = vh_prefetch_init(host, &ps, &p->prefetch);
    }
    if (st != VH_STATUS_OK) {
        vh_data_pass_free(p);
        return st;
    }
    *out = p;
    return VH_STATUS_OK;
}

void vh_data_pass_free(vh_data_pass *p) {
    if (!p) return;
    vh_host *host = p->host;
    vh_prefetch_free(p->prefetch); /* joins the workers before the samplers go */
    vh_sampler_free(p->samplers[0]);
    vh_sampler_free(p->samplers[1]);
    if (p->targets) host->api->free(host, p->targets);
    if (p->range) host->api->free(host, p->range);
    if (p->ra_scratch) host->api->free(host, p->ra_scratch);
    host->api->free(host, p);
}

vh_status vh_data_pass_info(const vh_data_pass *p, vh_data_info *out) {
    if (!p || !out) return VH_STATUS_ERR_INVALID_ARG;
#define COVERS(m) (out->struct_size >= offsetof(vh_data_info, m) + sizeof out->m)
    if (COVERS(channels)) out->channels = p->channels;
    if (COVERS(height)) out->height = p->height;
    if (COVERS(width)) out->width = p->width;
    if (COVERS(num_classes)) out->num_classes = p->classes;
    if (COVERS(train_size)) out->train_size = p->sizes[VH_SPLIT_TRAIN];
    if (COVERS(eval_size)) out->eval_size = p->sizes[VH_SPLIT_EVAL];
#undef COVERS
    return VH_STATUS_OK;
}

/* Stops the prefetcher: no fill runs after this until the next begin_pass. */
static void stop_workers(vh_data_pass *p) {
    vh_prefetch_stop(p->prefetch);
    if (p->stopped) p->stopped(p->ctx);
}

/* Makes `split` (its sampler started) the pass, from batch `first` on. */
static vh_status begin_pass(vh_data_pass *p, vh_split split, int64_t first) {
    if (split == VH_SPLIT_TRAIN && p->ra.n > 0 && !p->has_range)
        return p->host->api->fail(p->host, VH_STATUS_ERR_CONFIG,
                                  "%s: rand_augment_n is %d, but this plugin does not say "
                                  "which values are black and white in its images "
                                  "(vh_data_pass_set_range); set rand_augment_n: 0",
                                  p->name, (int)p->ra.n);
    p->split = split;
    p->cursor = first;
    p->finished = 0;
    vh_status st = vh_prefetch_start(p->prefetch, first, vh_sampler_batches(p->samplers[split]));
    if (st != VH_STATUS_OK) return st;
    p->active = 1;
    return VH_STATUS_OK;
}

vh_status vh_data_pass_start_epoch(vh_data_pass *p, vh_split split, int64_t epoch) {
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    if (split != VH_SPLIT_TRAIN && split != VH_SPLIT_EVAL)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s: unknown split %d", p->name,
                               (int)split);
    stop_workers(p); /* no worker reads the sampler while it changes */
    p->active = 0;
    if (!p->samplers[split])
        return host->api->fail(host, VH_STATUS_ERR_CONFIG, "%s: no evaluation split%s%s",
                               p->name, p->eval_missing ? ": " : "",
                               p->eval_missing ? p->eval_missing : "");
    vh_status st = vh_sampler_start(p->samplers[split], epoch);
    if (st != VH_STATUS_OK) return st;
    return begin_pass(p, split, 0);
}

vh_status vh_data_pass_next(vh_data_pass *p, vh_batch *out, int *has_batch) {
    if (!p || !out || !has_batch) return VH_STATUS_ERR_INVALID_ARG;
    *has_batch = 0;
    if (!p->active)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "%s: next called before start_epoch", p->name);
    if (p->finished) return VH_STATUS_OK;
    const vh_prefetch_slot *slot;
    int has;
    vh_status st = vh_prefetch_next(p->prefetch, &slot, &has);
    if (st != VH_STATUS_OK) return st; /* the prefetcher reported the fill's message */
    if (!has) {
        stop_workers(p); /* the pass stays, over: its position is its end */
        p->finished = 1;
        return VH_STATUS_OK;
    }
    p->cursor++;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->images = (vh_tensor){.data = slot->images, .dtype = VH_DTYPE_F32,
                              .device = VH_DEVICE_KIND_CPU, .ndim = 4,
                              .shape = {slot->size, p->channels, p->height, p->width}};
    out->labels = (vh_tensor){.data = slot->labels, .dtype = VH_DTYPE_I32,
                              .device = VH_DEVICE_KIND_CPU, .ndim = 1, .shape = {slot->size}};
    out->size = slot->size;
    if (p->mixing && p->split == VH_SPLIT_TRAIN)
        out->targets = (vh_tensor){.data = slot_targets(p, slot->index), .dtype = VH_DTYPE_F32,
                                   .device = VH_DEVICE_KIND_CPU, .ndim = 2,
                                   .shape = {slot->size, p->classes}};
    *has_batch = 1;
    return VH_STATUS_OK;
}

/* ---- resumable position ----------------------------------------------------
 * Header words: magic, version, 1 when a training pass was in progress, tag;
 * then the training sampler's state with the pass's cursor. */

vh_status vh_data_pass_state_save(const vh_data_pass *p, void *buf, size_t bytes) {
    if (!p || !buf) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes < VH_DATA_PASS_STATE_BYTES)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "%s: state buffer of %zu bytes, %d needed", p->name, bytes,
                                  VH_DATA_PASS_STATE_BYTES);
    uint32_t in_progress = p->active && p->split == VH_SPLIT_TRAIN;
    uint32_t h[4] = {p->magic, STATE_VERSION, in_progress, p->tag};
    memcpy(buf, h, sizeof h);
    return vh_sampler_state_save(p->samplers[VH_SPLIT_TRAIN], in_progress ? p->cursor : 0,
                                 (unsigned char *)buf + STATE_HEADER, VH_SAMPLER_STATE_BYTES);
}

vh_status vh_data_pass_state_load(vh_data_pass *p, const void *buf, size_t bytes) {
    if (!p || !buf) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    uint32_t h[4];
    if (bytes != VH_DATA_PASS_STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s: state of %zu bytes, expected %d",
                               p->name, bytes, VH_DATA_PASS_STATE_BYTES);
    memcpy(h, buf, sizeof h);
    if (h[0] != p->magic || h[1] != STATE_VERSION || h[2] > 1)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT, "not a %s data state", p->name);
    if (h[3] != p->tag)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: state of another data set (tag 0x%08x; this one has 0x%08x)",
                               p->name, (unsigned)h[3], (unsigned)p->tag);
    stop_workers(p);
    p->active = 0;
    int64_t cursor;
    int started;
    vh_status st = vh_sampler_state_load(p->samplers[VH_SPLIT_TRAIN],
                                         (const unsigned char *)buf + STATE_HEADER,
                                         VH_SAMPLER_STATE_BYTES, &cursor, &started);
    if (st != VH_STATUS_OK || !h[2]) return st;
    if (!started)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s: corrupt state (a pass in progress, never started)", p->name);
    return begin_pass(p, VH_SPLIT_TRAIN, cursor);
}

/* ---- as vtable entries: self begins with the helper's pointer ---------------- */

static vh_data_pass *of(void *self) { return self ? *(vh_data_pass **)self : NULL; }

vh_status vh_data_pass_vt_info(void *self, vh_data_info *out) {
    return vh_data_pass_info(of(self), out);
}
vh_status vh_data_pass_vt_start_epoch(void *self, vh_split split, int64_t epoch) {
    return vh_data_pass_start_epoch(of(self), split, epoch);
}
vh_status vh_data_pass_vt_next(void *self, vh_batch *out, int *has_batch) {
    return vh_data_pass_next(of(self), out, has_batch);
}
vh_status vh_data_pass_vt_state_size(void *self, size_t *bytes) {
    if (!of(self) || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = VH_DATA_PASS_STATE_BYTES;
    return VH_STATUS_OK;
}
vh_status vh_data_pass_vt_state_save(void *self, void *buf, size_t bytes) {
    return vh_data_pass_state_save(of(self), buf, bytes);
}
vh_status vh_data_pass_vt_state_load(void *self, const void *buf, size_t bytes) {
    return vh_data_pass_state_load(of(self), buf, bytes);
}

/* ---- a fill for 8-bit images in memory ----------------------------------------- */

/* One image: the augmentation's draws, then each plane through its table. */
static void convert_u8(const vh_data_pass_u8 *u, const uint8_t *src, float *dst, int augment,
                       uint64_t key) {
    const int32_t rows = u->rows, cols = u->cols;
    int32_t p = augment ? u->pad_crop : 0, dy = 0, dx = 0, flip = 0;
    if (augment && (p > 0 || u->hflip)) {
        uint64_t rng = key;
        if (p > 0) {
            dy = (int32_t)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * p + 1)) - p;
            dx = (int32_t)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * p + 1)) - p;
        }
        if (u->hflip) flip = (int32_t)(vh_sampler_rng_next(&rng) & 1);
    }
    const int64_t plane = (int64_t)rows * cols;
    for (int32_t c = 0; c < u->planes; c++) {
        const float *lut = u->lut + (size_t)c * 256;
        const uint8_t *s = src + c * plane;
        float *o = dst + c * plane;
        if (dy == 0 && dx == 0 && !flip) {
            for (int64_t k = 0; k < plane; k++) o[k] = lut[s[k]];
            continue;
        }
        for (int32_t y = 0; y < rows; y++) {
            int32_t sy = y + dy;
            float *out = o + (int64_t)y * cols;
            for (int32_t x = 0; x < cols; x++) {
                int32_t sx = (flip ? cols - 1 - x : x) + dx;
                out[x] = (sy < 0 || sy >= rows || sx < 0 || sx >= cols)
                             ? lut[0]
                             : lut[s[(int64_t)sy * cols + sx]];
            }
        }
    }
}

vh_status vh_data_pass_fill_u8(void *ctx, const vh_data_pass_batch *b, char *err,
                               size_t err_len) {
    (void)err, (void)err_len;
    const vh_data_pass_u8 *u = ctx;
    const uint8_t *pixels = u->pixels[b->split], *labels = u->labels[b->split];
    const int64_t chw = (int64_t)u->planes * u->rows * u->cols;
    const int augment = b->split == VH_SPLIT_TRAIN;
    for (int64_t j = 0; j < b->count; j++) {
        int64_t i = b->samples[j];
        convert_u8(u, pixels + i * chw, b->images + j * chw, augment,
                   augment ? vh_sampler_sample_key(b->sampler, i) : 0);
        b->labels[j] = labels[i];
    }
    return VH_STATUS_OK;
}

void vh_data_pass_u8_free(vh_host *host, vh_data_pass_u8 *u8) {
    if (!host || !u8) return;
    for (int k = 0; k < 2; k++) {
        host->api->free(host, u8->pixels[k]);
        host->api->free(host, u8->labels[k]);
        u8->pixels[k] = u8->labels[k] = NULL;
    }
}
