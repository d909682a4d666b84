/* prefetch.c - worker threads filling a ring of batch slots (see vh_prefetch.h).
 *
 * One mutex guards everything below; two condition variables carry the
 * hand-offs: `work` wakes workers (a slot was given back, a pass started, the
 * prefetcher is closing), `done` wakes the consumer (a fill finished).
 *
 * Batch i always lives in slot i % depth, so order never depends on which
 * worker finishes first. Batches are claimed in increasing order (`claim`),
 * and batch i may be claimed once batch i - depth has been given back
 * (i < freed + depth). A fill runs without the lock: during it the slot
 * belongs to its worker alone, and the consumer reads it only after seeing,
 * under the lock, that its state is READY or FAILED.
 *
 * On a GPU the slots' images are pinned host memory (the device's
 * host_alloc): the batch's copy to the device then runs at the bus's speed,
 * where from pageable memory the driver stages it (ViT-B/16 on an H200: 12
 * ms a step for 77 MB). The host finishes that copy before it asks for the
 * next batch (session.c), so a slot is never refilled under it.
 */
#define _POSIX_C_SOURCE 200809L
#include "vithost/vh_prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define ERR_LEN 512

enum { SLOT_EMPTY = 0, SLOT_FILLING, SLOT_READY, SLOT_FAILED };

typedef struct slot_rec {
    vh_prefetch_slot pub;
    int pinned; /* pub.images came from the device's host_alloc */
    int state;
    vh_status status;
    char err[ERR_LEN];
} slot_rec;

typedef struct worker_arg {
    vh_prefetch *p;
    int index;
} worker_arg;

struct vh_prefetch {
    vh_host *host;
    vh_prefetch_fill_fn fill;
    void *ctx;
    int32_t workers, depth;
    int64_t max_batch;

    slot_rec *slots;
    pthread_t *threads;
    worker_arg *args;
    int threads_started;
    int sync_ready; /* mutex and condition variables initialised */

    pthread_mutex_t mu;
    pthread_cond_t work, done;

    /* the pass, under mu */
    int active;     /* a pass was started and not stopped */
    int closing;    /* free: workers leave */
    int busy;       /* fills in progress */
    int64_t end;    /* batches [first, end) */
    int64_t limit;  /* no claims at or beyond: end, or a failed batch + 1 */
    int64_t claim;  /* next batch to claim */
    int64_t next;   /* next batch the consumer gets */
    int64_t freed;  /* batches below are given back */
    int failed;     /* next returned a failure; repeats it until a start */
    vh_status fail_status;
    char fail_msg[ERR_LEN];
};

/* Marks a filled slot READY or FAILED (checking what the fill promised). */
static void finish_fill(vh_prefetch *p, slot_rec *s, vh_status st) {
    if (st == VH_STATUS_OK && (s->pub.size < 1 || s->pub.size > p->max_batch)) {
        st = VH_STATUS_ERR_INTERNAL;
        snprintf(s->err, sizeof s->err,
                 "prefetch: the fill of batch %lld set size %lld, outside 1..%lld",
                 (long long)s->pub.index, (long long)s->pub.size, (long long)p->max_batch);
    }
    if (st != VH_STATUS_OK && s->err[0] == '\0')
        snprintf(s->err, sizeof s->err, "prefetch: the fill of batch %lld failed (%s)",
                 (long long)s->pub.index, vh_status_str(st));
    s->status = st;
    s->state = st == VH_STATUS_OK ? SLOT_READY : SLOT_FAILED;
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    vh_prefetch *p = wa->p;
    pthread_mutex_lock(&p->mu);
    while (!p->closing) {
        if (!(p->active && p->claim < p->limit && p->claim < p->freed + p->depth)) {
            pthread_cond_wait(&p->work, &p->mu);
            continue;
        }
        int64_t i = p->claim++;
        slot_rec *s = &p->slots[i % p->depth];
        s->state = SLOT_FILLING;
        s->pub.index = i;
        s->pub.size = 0;
        s->err[0] = '\0';
        p->busy++;
        pthread_mutex_unlock(&p->mu);

        vh_status st = p->fill(p->ctx, i, &s->pub, wa->index, s->err, sizeof s->err);
        s->err[sizeof s->err - 1] = '\0';

        pthread_mutex_lock(&p->mu);
        p->busy--;
        finish_fill(p, s, st);
        if (s->state == SLOT_FAILED && i + 1 < p->limit) p->limit = i + 1;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static vh_status check_setup(vh_host *host, const vh_prefetch_setup *setup) {
    if (setup->workers < 0 || setup->workers > 64 || setup->depth < 1 || setup->depth > 256)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "prefetch: %d workers (0..64) and depth %d (1..256) are invalid",
                               (int)setup->workers, (int)setup->depth);
    if (setup->max_batch < 1 || setup->image_floats < 1 ||
        (uint64_t)setup->image_floats > SIZE_MAX / sizeof(float) / 2 ||
        (uint64_t)setup->max_batch > SIZE_MAX / sizeof(int32_t) / 2)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "prefetch: slot of %lld labels and %lld floats is invalid",
                               (long long)setup->max_batch, (long long)setup->image_floats);
    return VH_STATUS_OK;
}

/* The mutex and condition variables; on failure none is left initialised
 * and the name of the call that failed is returned. */
static const char *init_sync(vh_prefetch *p) {
    if (pthread_mutex_init(&p->mu, NULL) != 0) return "pthread_mutex_init";
    if (pthread_cond_init(&p->work, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        return "pthread_cond_init";
    }
    if (pthread_cond_init(&p->done, NULL) != 0) {
        pthread_cond_destroy(&p->work);
        pthread_mutex_destroy(&p->mu);
        return "pthread_cond_init";
    }
    p->sync_ready = 1;
    return NULL;
}

/* The device whose host_alloc gives the slots' images (pinned memory), or
 * NULL: the CPU's memory is the device's already. */
static const vh_device_ops *pinning_device(vh_host *host) {
    const vh_device_ops *dev = host->api->device ? host->api->device(host) : NULL;
    if (!dev || dev->kind == VH_DEVICE_KIND_CPU || !VH_STRUCT_HAS(dev, vh_device_ops, host_free) ||
        !dev->host_alloc || !dev->host_free)
        return NULL;
    return dev;
}

/* Room for n floats: pinned where the device pins, else (or when pinning
 * fails: it is an optimisation) the host's memory. */
static float *alloc_images(vh_host *host, size_t n, int *pinned) {
    const vh_device_ops *dev = pinning_device(host);
    void *p = NULL;
    *pinned = dev && dev->host_alloc(dev->device, n * sizeof(float), &p) == VH_STATUS_OK && p;
    return *pinned ? p : host->api->alloc(host, n * sizeof(float));
}

static void free_images(vh_host *host, float *images, int pinned) {
    const vh_device_ops *dev = pinned ? pinning_device(host) : NULL;
    if (dev) dev->host_free(dev->device, images);
    else host->api->free(host, images);
}

/* depth slots, each with room for a whole batch. */
static vh_status alloc_slots(vh_prefetch *p, const vh_prefetch_setup *setup) {
    vh_host *host = p->host;
    p->slots = host->api->alloc(host, (size_t)p->depth * sizeof *p->slots);
    if (!p->slots) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "prefetch: out of memory");
    memset(p->slots, 0, (size_t)p->depth * sizeof *p->slots);
    for (int32_t k = 0; k < p->depth; k++) {
        p->slots[k].pub.images =
            alloc_images(host, (size_t)setup->image_floats, &p->slots[k].pinned);
        p->slots[k].pub.labels = host->api->alloc(host, (size_t)setup->max_batch * sizeof(int32_t));
        if (!p->slots[k].pub.images || !p->slots[k].pub.labels)
            return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                                   "prefetch: out of memory for %d slots of %lld floats",
                                   (int)setup->depth, (long long)setup->image_floats);
    }
    return VH_STATUS_OK;
}

static vh_status start_workers(vh_prefetch *p) {
    vh_host *host = p->host;
    if (p->workers == 0) return VH_STATUS_OK;
    p->threads = host->api->alloc(host, (size_t)p->workers * sizeof *p->threads);
    p->args = host->api->alloc(host, (size_t)p->workers * sizeof *p->args);
    if (!p->threads || !p->args)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "prefetch: out of memory");
    for (int32_t k = 0; k < p->workers; k++) {
        p->args[k].p = p;
        p->args[k].index = k;
        int rc = pthread_create(&p->threads[k], NULL, worker_main, &p->args[k]);
        if (rc != 0)
            return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                                   "prefetch: cannot start worker thread %d of %d: %s", (int)k,
                                   (int)p->workers, strerror(rc));
        p->threads_started++;
    }
    return VH_STATUS_OK;
}

vh_status vh_prefetch_init(vh_host *host, const vh_prefetch_setup *setup, vh_prefetch **out) {
    if (!host || !out) return VH_STATUS_ERR_INVALID_ARG;
    *out = NULL;
    /* An older (smaller) setup reads with its missing members zero. */
    vh_prefetch_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup) || !setup_v.fill)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "prefetch setup missing or without a fill function");
    setup = &setup_v;
    vh_status st = check_setup(host, setup);
    if (st != VH_STATUS_OK) return st;

    vh_prefetch *p = host->api->alloc(host, sizeof *p);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "prefetch: out of memory");
    memset(p, 0, sizeof *p);
    p->host = host;
    p->fill = setup->fill;
    p->ctx = setup->ctx;
    p->workers = setup->workers;
    p->depth = setup->depth;
    p->max_batch = setup->max_batch;
    const char *failed = init_sync(p);
    if (failed) {
        host->api->free(host, p);
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "prefetch: %s failed", failed);
    }
    if ((st = alloc_slots(p, setup)) != VH_STATUS_OK || (st = start_workers(p)) != VH_STATUS_OK) {
        vh_prefetch_free(p); /* joins the workers that started */
        return st;
    }
    *out = p;
    return VH_STATUS_OK;
}

/* Ends the pass with mu held: waits for fills in progress, empties the slots. */
static void stop_locked(vh_prefetch *p) {
    p->active = 0;
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    for (int32_t k = 0; k < p->depth; k++) p->slots[k].state = SLOT_EMPTY;
    p->claim = p->next = p->freed = p->limit = p->end = 0;
    p->failed = 0;
}

void vh_prefetch_free(vh_prefetch *p) {
    if (!p) return;
    vh_host *host = p->host;
    if (p->sync_ready) {
        pthread_mutex_lock(&p->mu);
        stop_locked(p);
        p->closing = 1;
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
        for (int k = 0; k < p->threads_started; k++) pthread_join(p->threads[k], NULL);
        pthread_cond_destroy(&p->done);
        pthread_cond_destroy(&p->work);
        pthread_mutex_destroy(&p->mu);
    }
    if (p->slots) {
        for (int32_t k = 0; k < p->depth; k++) {
            free_images(host, p->slots[k].pub.images, p->slots[k].pinned);
            host->api->free(host, p->slots[k].pub.labels);
        }
        host->api->free(host, p->slots);
    }
    host->api->free(host, p->threads);
    host->api->free(host, p->args);
    host->api->free(host, p);
}

vh_status vh_prefetch_start(vh_prefetch *p, int64_t first, int64_t end) {
    if (!p) return VH_STATUS_ERR_INVALID_ARG;
    if (first < 0 || end < first)
        return p->host->api->fail(p->host, VH_STATUS_ERR_INVALID_ARG,
                                  "prefetch: pass [%lld, %lld) is invalid", (long long)first,
                                  (long long)end);
    pthread_mutex_lock(&p->mu);
    stop_locked(p);
    p->claim = p->next = p->freed = first;
    p->end = p->limit = end;
    p->active = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    return VH_STATUS_OK;
}

void vh_prefetch_stop(vh_prefetch *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    stop_locked(p);
    pthread_mutex_unlock(&p->mu);
}

int64_t vh_prefetch_position(const vh_prefetch *p) {
    if (!p) return 0;
    vh_prefetch *q = (vh_prefetch *)p; /* the lock, not the value, is mutable */
    pthread_mutex_lock(&q->mu);
    int64_t pos = q->next;
    pthread_mutex_unlock(&q->mu);
    return pos;
}

vh_status vh_prefetch_next(vh_prefetch *p, const vh_prefetch_slot **slot, int *has) {
    if (!p || !slot || !has) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = p->host;
    *slot = NULL;
    *has = 0;
    pthread_mutex_lock(&p->mu);
    if (!p->active) {
        pthread_mutex_unlock(&p->mu);
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "prefetch: next without a pass");
    }
    if (p->failed) {
        vh_status st = p->fail_status;
        pthread_mutex_unlock(&p->mu);
        return host->api->fail(host, st, "%s", p->fail_msg);
    }
    /* Give back the batch returned last time. */
    if (p->freed < p->next) {
        p->freed = p->next;
        pthread_cond_broadcast(&p->work);
    }
    if (p->next >= p->end) {
        pthread_mutex_unlock(&p->mu);
        return VH_STATUS_OK;
    }
    int64_t i = p->next;
    slot_rec *s = &p->slots[i % p->depth];
    if (p->workers == 0) {
        /* No threads: fill here. Nothing else touches the slot. */
        pthread_mutex_unlock(&p->mu);
        s->pub.index = i;
        s->pub.size = 0;
        s->err[0] = '\0';
        vh_status st = p->fill(p->ctx, i, &s->pub, 0, s->err, sizeof s->err);
        s->err[sizeof s->err - 1] = '\0';
        pthread_mutex_lock(&p->mu);
        finish_fill(p, s, st);
    } else {
        while (!((s->state == SLOT_READY || s->state == SLOT_FAILED) && s->pub.index == i))
            pthread_cond_wait(&p->done, &p->mu);
    }
    if (s->state == SLOT_FAILED) {
        p->failed = 1;
        p->fail_status = s->status;
        memcpy(p->fail_msg, s->err, sizeof p->fail_msg);
        vh_status st = s->status;
        pthread_mutex_unlock(&p->mu);
        return host->api->fail(host, st, "%s", p->fail_msg);
    }
    p->next = i + 1;
    pthread_mutex_unlock(&p->mu);
    *slot = &s->pub;
    *has = 1;
    return VH_STATUS_OK;
}
