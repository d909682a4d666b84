/* vh_prefetch.h - worker threads that fill batches ahead of the consumer.
 *
 * A data plugin gives a fill callback that writes the samples of batch i
 * into a slot; the prefetcher owns `depth` slots and `workers` threads that
 * fill batches first, first + 1, ... of a pass ahead of the consumer, and
 * hands them back IN ORDER, whatever the timing of the workers:
 *
 *     vh_prefetch_setup ps = {.struct_size = sizeof ps, .workers = 2,
 *                             .depth = 4, .max_batch = b,
 *                             .image_floats = b * c * h * w,
 *                             .fill = my_fill, .ctx = me};
 *     vh_prefetch_init(host, &ps, &p);
 *     vh_prefetch_start(p, 0, vh_sampler_batches(sampler));
 *     const vh_prefetch_slot *slot; int has;
 *     while ((st = vh_prefetch_next(p, &slot, &has)) == VH_STATUS_OK && has)
 *         ... slot->images, slot->labels, slot->size ...
 *     vh_prefetch_free(p);
 *
 * Slot i % depth holds batch i; a worker may begin batch i once the
 * consumer has given back batch i - depth. The slot returned by next stays
 * the consumer's until the following call of next, stop, start or free,
 * which is exactly the lifetime vh_data.h asks of a batch, so a plugin hands
 * slot->images / slot->labels out as its vh_batch without copying.
 *
 * workers == 0 fills on the consumer's thread inside next (no threads).
 *
 * The fill callback runs on worker threads, several at once on different
 * batches: it must not call host->api (except alloc/free) nor touch state
 * shared with the consumer without its own locking. It may read a started
 * vh_sampler (vh_sampler_batch is thread-safe). For per-thread scratch use
 * the `worker` index (0 <= worker < max(workers, 1)). Random draws must come
 * from the sample (e.g. vh_sampler_sample_key), never from the worker or the
 * order of fills. On failure it writes a one-line message into err (it is
 * NUL-terminated already, err_len >= 256) and returns a non-OK status; next
 * then returns that status for that batch, having reported the message with
 * host->api->fail, and the pass stops (later calls return the same error
 * until the next start).
 *
 * Memory: slots come from host->api->alloc, 64-byte aligned; on a device
 * that is not the CPU the images come from its host_alloc (pinned memory,
 * so the host's copy to the device runs at the bus's speed), falling back to
 * host->api->alloc where that fails. free joins the
 * workers, also in the middle of a pass (it waits for fills in progress).
 * One consumer thread only: init, start, next, stop and free are not meant
 * to be called concurrently with each other.
 */
#ifndef VITHOST_VH_PREFETCH_H
#define VITHOST_VH_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "vh_export.h"
#include "vh_host.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vh_prefetch vh_prefetch; /* opaque */

typedef struct vh_prefetch_slot {
    float *images;   /* image_floats floats, to be filled (B, C, H, W) */
    int32_t *labels; /* max_batch labels */
    int64_t size;    /* samples the fill wrote (1..max_batch); set by fill */
    int64_t index;   /* the batch this slot holds; set before fill */
} vh_prefetch_slot;

/* Fills slot with batch `batch` (slot->index == batch): writes images and
 * labels and sets slot->size. Returns VH_STATUS_OK, or a failure with a
 * message in err. */
typedef vh_status (*vh_prefetch_fill_fn)(void *ctx, int64_t batch, vh_prefetch_slot *slot,
                                         int worker, char *err, size_t err_len);

typedef struct vh_prefetch_setup {
    uint32_t struct_size;  /* sizeof(vh_prefetch_setup) */
    int32_t workers;       /* threads, 0..64; 0: fill inside next */
    int32_t depth;         /* slots, 1..256; batches ready ahead = depth - 1 */
    int64_t max_batch;     /* labels per slot, >= 1 */
    int64_t image_floats;  /* floats per slot, >= 1 (max_batch * C * H * W) */
    vh_prefetch_fill_fn fill;
    void *ctx;             /* passed to fill */
} vh_prefetch_setup;

/* Allocates the slots and starts the workers (idle until a start). */
VH_SDK_API vh_status vh_prefetch_init(vh_host *host, const vh_prefetch_setup *setup,
                                      vh_prefetch **out);
/* Stops any pass, joins the workers, frees the slots. NULL is allowed. */
VH_SDK_API void vh_prefetch_free(vh_prefetch *p);

/* Begins a pass over batches [first, end) (0 <= first <= end); a pass in
 * progress is stopped first. Workers begin filling at once. */
VH_SDK_API vh_status vh_prefetch_start(vh_prefetch *p, int64_t first, int64_t end);
/* The next batch of the pass, in order: blocks until it is filled. *has = 0
 * (and *slot = NULL) once the pass is over. */
VH_SDK_API vh_status vh_prefetch_next(vh_prefetch *p, const vh_prefetch_slot **slot, int *has);
/* Ends the pass: waits for fills in progress, discards filled batches. The
 * workers stay, idle. Harmless when no pass runs. */
VH_SDK_API void vh_prefetch_stop(vh_prefetch *p);
/* Batches of the pass already returned by next (first + count so far): the
 * cursor to save for a resume. */
VH_SDK_API int64_t vh_prefetch_position(const vh_prefetch *p);

#ifdef __cplusplus
}
#endif
#endif
