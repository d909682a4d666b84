/* vh_data_pass.h - the passes of a data plugin over an index-addressable data set.
 *
 * A data plugin whose samples are numbered 0..size-1 per split gives this
 * helper its sizes, its sample shape (C, H, W) and a fill callback that
 * writes the samples of one batch; the helper owns everything else of the
 * data role (vh_data.h): the two samplers (vh_sampler.h: training shuffled
 * per epoch, evaluation in order), the prefetcher and its workers
 * (vh_prefetch.h), start_epoch, next, info and the resumable position.
 * Its own code is then its configuration, its files and the fill; a data
 * set of 8-bit images held in memory can use vh_data_pass_fill_u8 (below).
 *
 *     typedef struct my_data {
 *         vh_data_pass *pass; // first member: the VH_DATA_PASS_VTABLE entries use it
 *         ...                 // the plugin's own: configuration, data in memory
 *     } my_data;
 *
 *     vh_data_pass_setup ps = {.struct_size = sizeof ps, .name = "my", .state_magic = M,
 *                              .data = setup, .train_size = n, .eval_size = m,
 *                              .channels = c, .height = h, .width = w, .num_classes = k,
 *                              .workers = 1, .depth = 4, .fill = my_fill, .ctx = d};
 *     st = vh_data_pass_init(host, &ps, &d->pass);    // in create
 *     vh_data_pass_free(d->pass);                     // in destroy, before d's data goes
 *
 *     static const vh_data_vtable vtable = {VH_DATA_PASS_VTABLE, .create = my_create,
 *                                           .destroy = my_destroy};
 *
 * Passes. start_epoch(split, epoch) stops the pass in progress, if any, and
 * starts a pass over `split` (the training order of `epoch`); next hands out
 * its batches in order, each a prefetch slot seen as a vh_batch of shape
 * (B, C, H, W) f32 and (B) i32, host memory valid until the following next,
 * start_epoch, state_load or free. Once the pass is over next says
 * has_batch = 0, again on every later call. An evaluation pass started in the
 * middle of a training pass abandons it: the host saves the training pass's
 * position before it evaluates and restores it after (vh_data.h).
 *
 * Resumable position: the training pass's, in VH_DATA_PASS_STATE_BYTES bytes:
 * a 16-byte header (the plugin's state_magic, version 1, whether a training
 * pass was in progress, the plugin's state_tag), then the training sampler's
 * state (epoch, cursor, and the setup it was made with: a state of another
 * rank, batch size, seed or training size is refused with a message). While
 * an evaluation pass runs, or before any pass, no training pass is in
 * progress. After state_load of a state saved in a training pass, next
 * continues that pass where it stood (at its end when it had ended);
 * otherwise no pass is in progress and next fails until start_epoch. A blob
 * of another plugin (another magic), of another version or of another data
 * set (another state_tag) is refused with a message naming the plugin.
 *
 * Mixup and CutMix (ABI 2.2, vh_mix.h): when the data section turns them on
 * (the shared keys vh_data_shared_keys: mixup_alpha, cutmix_alpha, mix_prob,
 * mix_switch_prob, mix_label_smoothing, which the host adds to every data
 * plugin of 2.2 or later), each training batch is mixed after the fill, on
 * the worker that filled it, and next hands it out with `targets` (B,
 * classes) f32 soft targets; the draws of batch i are those of (seed, epoch,
 * i, rank), whatever the worker count, so a resumed pass repeats them.
 * Evaluation batches, and every batch without mixing, have targets.data NULL.
 * Before mixing, with the shared keys rand_augment_n > 0 and rand_augment_m,
 * each training image is augmented by RandAugment (vh_rand_augment.h), with
 * draws from its sample key, whatever the worker count.
 *
 * Messages name the plugin ("idx: next called before start_epoch", "not a
 * idx data state"). Errors are reported through host->api->fail; memory comes
 * from host->api->alloc. One consumer thread: no two calls on the same
 * helper at once (the fill callback runs on the prefetcher's workers).
 */
#ifndef VITHOST_VH_DATA_PASS_H
#define VITHOST_VH_DATA_PASS_H

#include <stddef.h>
#include <stdint.h>

#include "vh_data.h"
#include "vh_export.h"
#include "vh_host.h"
#include "vh_sampler.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vh_data_pass vh_data_pass; /* opaque */

/* One batch for the fill callback to write. */
typedef struct vh_data_pass_batch {
    int32_t split;             /* vh_split: the pass's split */
    const vh_sampler *sampler; /* the split's, started: for vh_sampler_sample_key */
    int64_t index;             /* the batch's number in the pass */
    const int64_t *samples;    /* the sample indices of the batch, `count` of them */
    int64_t count;             /* 1..batch_size */
    float *images;             /* count images of C * H * W floats, to write */
    int32_t *labels;           /* count labels, to write */
    int worker;                /* 0 <= worker < max(workers, 1): for per-thread scratch */
} vh_data_pass_batch;

/* Writes the images and labels of batch b. Runs on prefetch worker threads,
 * several at once on different batches, with the rules of vh_prefetch.h: no
 * host->api calls but alloc/free, random draws from the sample
 * (vh_sampler_sample_key), never from the worker or the timing. On failure
 * it writes a one-line message into err (err_len >= 256) and returns a
 * non-OK status, which next then returns for that batch. */
typedef vh_status (*vh_data_pass_fill_fn)(void *ctx, const vh_data_pass_batch *b, char *err,
                                          size_t err_len);

/* Called on the consumer thread each time the helper has stopped the
 * prefetcher (no fill runs until the next pass starts): when a pass ends,
 * and before start_epoch or state_load begins another (not at free). For collecting what
 * the workers counted (e.g. decoder warnings, logged with host->api->log). */
typedef void (*vh_data_pass_stopped_fn)(void *ctx);

typedef struct vh_data_pass_setup {
    uint32_t struct_size;         /* sizeof(vh_data_pass_setup) */
    const char *name;             /* the plugin's, in every message; copied */
    uint32_t state_magic;         /* first word of the state: the plugin's own */
    uint32_t state_tag;           /* identifies the data set in the state; 0: none */
    const vh_data_setup *data;    /* create's setup: rank, world, batch size, seed */
    int64_t train_size;           /* samples of the training split, all ranks; >= 1 */
    int64_t eval_size;            /* of the evaluation split; 0: there is none, and
                                     start_epoch(VH_SPLIT_EVAL) fails with
                                     VH_STATUS_ERR_CONFIG, "<name>: no evaluation split" */
    const char *eval_missing;     /* optional, with eval_size 0: why, appended to that
                                     message; must stay valid until free */
    int32_t channels, height, width; /* of a sample, >= 1 */
    int32_t num_classes;          /* for info */
    int32_t workers;              /* prefetch threads, 0..64; 0: fill inside next */
    int32_t depth;                /* prefetch slots, 1..256 */
    vh_data_pass_fill_fn fill;
    vh_data_pass_stopped_fn stopped; /* optional */
    void *ctx;                    /* passed to fill and stopped */
} vh_data_pass_setup;

/* Bytes of the resumable state. */
#define VH_DATA_PASS_STATE_BYTES (16 + VH_SAMPLER_STATE_BYTES)

/* Makes the samplers (failing as vh_sampler_init does when a split cannot
 * give every rank a batch), checks that a batch of images fits in memory
 * ("<name>: batch size N is too large") and starts the prefetcher's
 * workers, idle until the first pass. */
VH_SDK_API vh_status vh_data_pass_init(vh_host *host, const vh_data_pass_setup *setup,
                                       vh_data_pass **out);
/* Joins the workers (waiting for fills in progress) and frees. NULL is allowed. */
VH_SDK_API void vh_data_pass_free(vh_data_pass *p);

/* RandAugment (vh_rand_augment.h): the values black (pixel 0) and
 * white (pixel 255) have in the images the fill writes, `channels` of each,
 * for its colour ops. The 8-bit fill's are read from its tables; a plugin
 * with a fill of its own calls this after init, or a training pass with
 * rand_augment_n > 0 is refused ("<name>: rand_augment_n is N, but this
 * plugin does not say ..."). Black and white of a channel must differ. */
VH_SDK_API vh_status vh_data_pass_set_range(vh_data_pass *p, const float *black,
                                            const float *white);

/* The vh_data_vtable functions, on the helper itself. */
VH_SDK_API vh_status vh_data_pass_info(const vh_data_pass *p, vh_data_info *out);
VH_SDK_API vh_status vh_data_pass_start_epoch(vh_data_pass *p, vh_split split, int64_t epoch);
VH_SDK_API vh_status vh_data_pass_next(vh_data_pass *p, vh_batch *out, int *has_batch);
VH_SDK_API vh_status vh_data_pass_state_save(const vh_data_pass *p, void *buf, size_t bytes);
VH_SDK_API vh_status vh_data_pass_state_load(vh_data_pass *p, const void *buf, size_t bytes);

/* The same as vh_data_vtable entries, for a plugin whose instance (`self`)
 * is a struct whose first member is its vh_data_pass pointer. */
VH_SDK_API vh_status vh_data_pass_vt_info(void *self, vh_data_info *out);
VH_SDK_API vh_status vh_data_pass_vt_start_epoch(void *self, vh_split split, int64_t epoch);
VH_SDK_API vh_status vh_data_pass_vt_next(void *self, vh_batch *out, int *has_batch);
VH_SDK_API vh_status vh_data_pass_vt_state_size(void *self, size_t *bytes);
VH_SDK_API vh_status vh_data_pass_vt_state_save(void *self, void *buf, size_t bytes);
VH_SDK_API vh_status vh_data_pass_vt_state_load(void *self, const void *buf, size_t bytes);

/* Designated initialisers of a vh_data_vtable but for create and destroy. */
#define VH_DATA_PASS_VTABLE                                                                    \
    .struct_size = sizeof(vh_data_vtable), .info = vh_data_pass_vt_info,                       \
    .start_epoch = vh_data_pass_vt_start_epoch,                                                \
    .next = vh_data_pass_vt_next, .state_size = vh_data_pass_vt_state_size,                    \
    .state_save = vh_data_pass_vt_state_save, .state_load = vh_data_pass_vt_state_load

/* ---- a ready fill for data sets of 8-bit images held in memory -------------
 * With .fill = vh_data_pass_fill_u8 and .ctx pointing at a vh_data_pass_u8,
 * a plugin needs no fill of its own. Sample i of a split is the image at
 * pixels[split] + i * planes * rows * cols (plane after plane, the (C, H, W)
 * of a batch), each byte through its plane's lookup table, and the label
 * labels[split][i]. Training batches augment: a random rows x cols window of
 * the image padded by pad_crop pixels of byte 0 on every side (dy, then dx,
 * each uniform in [-pad_crop, pad_crop], drawn from vh_sampler_sample_key),
 * then, with hflip, a left-right mirror with probability 1/2 (the next
 * draw). Evaluation batches never do. */
typedef struct vh_data_pass_u8 {
    uint8_t *pixels[2];         /* by vh_split: (samples, planes, rows, cols) bytes */
    uint8_t *labels[2];         /* by vh_split: (samples) */
    int32_t planes, rows, cols; /* the helper's channels, height, width */
    const float *lut;           /* (planes, 256): byte -> normalised value */
    int32_t pad_crop;           /* training: padding of the random crop; 0: none */
    int hflip;                  /* training: random mirror */
} vh_data_pass_u8;

VH_SDK_API vh_status vh_data_pass_fill_u8(void *ctx, const vh_data_pass_batch *b, char *err,
                                          size_t err_len);
/* Frees pixels and labels of both splits with host->api->free (where they
 * came from host->api->alloc) and sets them to NULL. NULL is allowed. */
VH_SDK_API void vh_data_pass_u8_free(vh_host *host, vh_data_pass_u8 *u8);

#ifdef __cplusplus
}
#endif
#endif
