/* vh_sampler.h - the per-epoch sample order of one rank, for data plugins.
 *
 * A sampler turns (split size, rank, world, batch size, split, seed) into the
 * batches of one pass on this rank, as lists of sample indices in [0, size):
 *
 *     vh_sampler *s;
 *     vh_sampler_setup su = {.struct_size = sizeof su, .size = n, .rank = r,
 *                            .world_size = w, .batch_size = b,
 *                            .split = VH_SPLIT_TRAIN, .seed = seed};
 *     if ((st = vh_sampler_init(host, &su, &s)) != VH_STATUS_OK) return st;
 *     vh_sampler_start(s, epoch);
 *     for (int64_t i = 0; i < vh_sampler_batches(s); i++) {
 *         const int64_t *idx; int64_t count;
 *         vh_sampler_batch(s, i, &idx, &count);   // idx[0..count)
 *     }
 *     vh_sampler_free(s);
 *
 * Training (VH_SPLIT_TRAIN), as PyTorch's DistributedSampler with
 * drop_last: every epoch the indices [0, size) are shuffled by Fisher-Yates
 * with a counter-based PRNG keyed by (seed, epoch), the same permutation on
 * every rank; rank r takes positions r, r + w, r + 2w, ... of it, floor(size /
 * w) of them, and keeps floor(floor(size / w) / b) full batches. Every rank
 * thus has the same number of full batches; at most w * b - 1 + size % w
 * samples are left out of an epoch, different ones each epoch.
 *
 * Evaluation (VH_SPLIT_EVAL): no shuffle; sample i belongs to rank i % w, in
 * increasing order, so the shares of the ranks differ by at most one sample
 * and every sample is counted exactly once over all ranks. Every rank has
 * nb = ceil(ceil(size / w) / b) batches. Batch j < nb - 1 holds b samples and
 * the last holds the rest (1..b). One case needs more: a rank whose share is
 * one sample shorter than the largest share, when that largest share is
 * (nb - 1) * b + 1, would be left with an empty last batch; that rank instead
 * gives batch nb - 2 b - 1 samples and its last batch 1. No batch is ever
 * empty and no sample is repeated. When that is impossible (size < w, or
 * b == 1 with size not a multiple of w) vh_sampler_init fails saying so.
 *
 * Thread safety: after vh_sampler_start returns, vh_sampler_batch and the
 * other const functions may be called from any number of threads at once
 * (prefetch workers); vh_sampler_start, _state_load and _free must not run
 * concurrently with anything else on the same sampler.
 *
 * Memory comes from host->api->alloc; errors are reported through
 * host->api->fail, so every failing call has left a message.
 */
#ifndef VITHOST_VH_SAMPLER_H
#define VITHOST_VH_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "vh_data.h"
#include "vh_export.h"
#include "vh_host.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vh_sampler vh_sampler; /* opaque */

typedef struct vh_sampler_setup {
    uint32_t struct_size;     /* sizeof(vh_sampler_setup) */
    int64_t size;             /* samples in the split, all ranks together; >= 1 */
    int32_t rank, world_size; /* 0 <= rank < world_size */
    int64_t batch_size;       /* per rank; >= 1 */
    int32_t split;            /* vh_split: TRAIN: shuffled, full batches; EVAL: in order */
    uint64_t seed;            /* keys the training shuffles (with the epoch) */
} vh_sampler_setup;

/* Checks the setup (see the rules above) and allocates the sampler. Fails
 * with VH_STATUS_ERR_CONFIG when the split cannot give every rank the same
 * number of non-empty batches (e.g. "train split of 100 samples over 4 ranks
 * leaves 25 per rank, fewer than one batch of 32"). */
VH_SDK_API vh_status vh_sampler_init(vh_host *host, const vh_sampler_setup *setup,
                                     vh_sampler **out);
/* NULL is allowed. */
VH_SDK_API void vh_sampler_free(vh_sampler *s);

/* Builds the order of `epoch` (>= 0). Eval orders do not depend on it. */
VH_SDK_API vh_status vh_sampler_start(vh_sampler *s, int64_t epoch);

/* Batches of one pass on this rank: the same number on every rank. */
VH_SDK_API int64_t vh_sampler_batches(const vh_sampler *s);
/* Samples of one pass on this rank (sum of the batch sizes). */
VH_SDK_API int64_t vh_sampler_samples(const vh_sampler *s);
/* The epoch of the last vh_sampler_start; -1 before the first. */
VH_SDK_API int64_t vh_sampler_epoch(const vh_sampler *s);

/* The sample indices of batch i (0 <= i < batches) of the started pass:
 * *indices points into the sampler (valid until the next start, state_load
 * or free), *count is 1..batch_size. VH_STATUS_ERR_INVALID_ARG when i is out
 * of range or the sampler was never started; thread-safe (see above) and, to
 * stay so, it reports that through its return value only, never through
 * host->api->fail. */
VH_SDK_API vh_status vh_sampler_batch(const vh_sampler *s, int64_t i, const int64_t **indices,
                                      int64_t *count);

/* A 64-bit key for the random draws of one sample in the started epoch
 * (augmentation): a hash of (seed, split, epoch, sample index). It does not
 * depend on the rank, the batch or the worker thread that asks, so augmented
 * batches are reproducible whatever the prefetch timing. Use it to seed
 * vh_sampler_rng_next. */
VH_SDK_API uint64_t vh_sampler_sample_key(const vh_sampler *s, int64_t sample);

/* splitmix64: the next 64 random bits of a stream whose state is *state. */
static inline uint64_t vh_sampler_rng_next(uint64_t *state) {
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- resumable position --------------------------------------------------
 * The blob holds the epoch, whether a pass was started, the cursor (batches
 * of the pass already consumed, kept by the plugin) and the setup it was made
 * with, so loading it into a sampler of another setup (size, split, seed)
 * fails with a message. A training position of another rank, world size or
 * batch is the same point of the epoch's permutation and is mapped to this
 * sampler's share (cursor x world x batch samples consumed; a run saved on
 * 2 ranks resumes on 3 or 1); an eval position must match exactly. Fixed
 * size, VH_SAMPLER_STATE_BYTES. */
#define VH_SAMPLER_STATE_BYTES 80

VH_SDK_API vh_status vh_sampler_state_save(const vh_sampler *s, int64_t cursor, void *buf,
                                           size_t bytes);
/* Restores the epoch (rebuilding its order, as vh_sampler_start) and returns
 * the saved cursor in *cursor (0 <= cursor <= batches); *started is 1 when a
 * pass had been started when the state was saved, else 0 (then *cursor = 0). */
VH_SDK_API vh_status vh_sampler_state_load(vh_sampler *s, const void *buf, size_t bytes,
                                           int64_t *cursor, int *started);

#ifdef __cplusplus
}
#endif
#endif
