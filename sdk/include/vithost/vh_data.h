/* vh_data.h - the data role: samples, decode, augmentation, per-rank split.
 *
 * A data plugin yields batches in host memory: images as (B, C, H, W) f32,
 * already normalised, and labels as (B) i32. The batch's memory belongs to the
 * plugin and stays valid until the next call of `next`, `start_epoch`,
 * `state_load` or `destroy` (so a model may read it again in backward).
 *
 * Every rank yields the same number of batches in a pass, since sharding
 * plugins may run collectives per batch: a training pass yields only full
 * batches; an evaluation pass covers each of its samples exactly once over
 * all ranks, and one of its last two batches on a rank may be short (never
 * empty).
 *
 * The host may evaluate in the middle of a training pass (run.eval_every_steps):
 * it saves the pass's position with state_save before the eval pass and
 * restores it with state_load after, so resumable plugins need nothing more.
 *
 * Out-structs (vh_data_info, and every other `*out` struct with a
 * struct_size): the caller zeroes them and sets struct_size; the callee fills
 * only the members that size covers.
 */
#ifndef VITHOST_VH_DATA_H
#define VITHOST_VH_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "vh_host.h"
#include "vh_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_split {
    VH_SPLIT_TRAIN = 0,
    VH_SPLIT_EVAL = 1,
} vh_split;

typedef struct vh_data_setup {
    uint32_t struct_size;
    int32_t rank, world_size; /* this process reads its own part */
    int64_t batch_size;       /* per rank */
    uint64_t seed;            /* shuffles differ per epoch, repeat per seed */
} vh_data_setup;

typedef struct vh_data_info {
    uint32_t struct_size;
    int32_t channels, height, width;
    int32_t num_classes;
    int64_t train_size, eval_size; /* samples in the whole split, all ranks */
} vh_data_info;

typedef struct vh_batch {
    uint32_t struct_size; /* set by the data plugin */
    vh_tensor images; /* (B, C, H, W) f32, host memory */
    vh_tensor labels; /* (B) i32, host memory */
    int64_t size;     /* B; the last batch of an eval pass may be short */
    /* ---- ABI 2.2 ---- */
    /* (B, classes) f32 soft targets in host memory, each row summing to 1
     * (mixup/cutmix with their label smoothing, vh_mix.h), or data NULL: the
     * labels, with the model's own label smoothing, as in 2.1. A model reads
     * it only when VH_STRUCT_HAS(batch, vh_batch, targets) and data != NULL,
     * and then trains on it instead of the labels. Only training batches
     * carry targets. Same owner and lifetime as images and labels. */
    vh_tensor targets;
} vh_batch;

/* Marks, for every call (checked against the host by test_abi_marks):
 * @required / @optional(default: what the host does when it is NULL or
 * past vtable_size). @thread(main) for every call: the host calls the
 * plugin from its main thread, one call at a time (a plugin's own worker
 * threads, vh_prefetch.h, stay inside it). */
typedef struct vh_data_vtable {
    uint32_t struct_size;
    /* @required. *self is the plugin's; freed by destroy. */
    vh_status (*create)(vh_host *host, const vh_data_setup *setup, void **self);
    /* @required. */
    void (*destroy)(void *self);
    /* @required. Called once, after create. */
    vh_status (*info)(void *self, vh_data_info *out);
    /* @required. Starts a pass over a split; epoch numbers the training
     * shuffles. */
    vh_status (*start_epoch)(void *self, vh_split split, int64_t epoch);
    /* @required. *has_batch = 0 when the pass is over. out's tensors:
     * @owns(the data plugin) @lifetime(until the next call of next,
     * start_epoch, state_load or destroy). */
    vh_status (*next)(void *self, vh_batch *out, int *has_batch);
    /* @optional(default: 0 bytes). Resumable position (epoch, order, cursor)
     * of the training pass in progress, as an opaque blob. After state_load,
     * `next` continues that pass where it stood; the host does not call
     * start_epoch for it. */
    vh_status (*state_size)(void *self, size_t *bytes);
    /* @optional(default: saves nothing; any size but 0 is refused). */
    vh_status (*state_save)(void *self, void *buf, size_t bytes);
    /* @optional(default: accepts only 0 bytes; data state in a checkpoint
     * was written by another plugin and is refused, VH_STATUS_ERR_FORMAT). */
    vh_status (*state_load)(void *self, const void *buf, size_t bytes);
} vh_data_vtable;

#ifdef __cplusplus
}
#endif
#endif
