/* test_data_plugins.c - the SDK's sampler, prefetcher and data pass, and the
 * data plugins synthetic, idx and cifar.
 *
 * The sampler, the prefetcher and the data pass are tested alone, against a
 * small fake host.
 * The plugins are loaded as vithost loads them (run_open_text with the test
 * plugins in the other roles) and read files this test writes in a mkdtemp
 * folder: IDX gzipped and plain, CIFAR-10 and CIFAR-100, good and broken.
 * The real Fashion-MNIST is read too when /usr/share/datasets has it.
 *
 * ./test_data_plugins [filter]   runs the tests whose names match filter
 * (cmocka's pattern: * and ?), e.g. "test_prefetch*".
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "runtime.h"
#include "vithost/vh_data_pass.h"
#include "vithost/vh_prefetch.h"
#include "vithost/vh_sampler.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

/* ---- a fake host for the SDK utilities --------------------------------------- */

typedef struct fake_host {
    vh_host pub;
    char error[1024];
    atomic_long live; /* allocations not freed */
} fake_host;

static void fake_log(vh_host *host, vh_log_level level, const char *fmt, ...) {
    (void)host, (void)level, (void)fmt;
}
static vh_status fake_fail(vh_host *host, vh_status status, const char *fmt, ...) {
    fake_host *h = (fake_host *)host;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->error, sizeof h->error, fmt, ap);
    va_end(ap);
    return status;
}
static void *fake_alloc(vh_host *host, size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (p) atomic_fetch_add(&((fake_host *)host)->live, 1);
    return p;
}
static void fake_free(vh_host *host, void *ptr) {
    if (!ptr) return;
    atomic_fetch_sub(&((fake_host *)host)->live, 1);
    free(ptr);
}
static const vh_host_api fake_api = {
    .struct_size = sizeof(vh_host_api),
    .abi_major = VH_ABI_MAJOR,
    .abi_minor = VH_ABI_MINOR,
    .log = fake_log,
    .fail = fake_fail,
    .alloc = fake_alloc,
    .free = fake_free,
};
static void fake_init(fake_host *h) {
    memset(h, 0, sizeof *h);
    h->pub.api = &fake_api;
    atomic_init(&h->live, 0);
}

/* ---- sampler ------------------------------------------------------------------ */

static vh_sampler *sampler_new(fake_host *h, int64_t size, int rank, int world, int64_t batch,
                               vh_split split, uint64_t seed) {
    vh_sampler_setup su = {.struct_size = sizeof su, .size = size, .rank = rank,
                           .world_size = world, .batch_size = batch, .split = split,
                           .seed = seed};
    vh_sampler *s = NULL;
    vh_status st = vh_sampler_init(&h->pub, &su, &s);
    if (st != VH_STATUS_OK) return NULL;
    return s;
}

/* All indices of a started pass, in order. Returns the count. */
static int64_t sampler_all(const vh_sampler *s, int64_t *out, int64_t cap) {
    int64_t n = 0;
    for (int64_t b = 0; b < vh_sampler_batches(s); b++) {
        const int64_t *idx;
        int64_t count;
        assert_int_equal(vh_sampler_batch(s, b, &idx, &count), VH_STATUS_OK);
        for (int64_t k = 0; k < count; k++) {
            assert_true(n < cap);
            out[n++] = idx[k];
        }
    }
    return n;
}

static void test_sampler_train_split(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    enum { N = 103, W = 3, B = 8 };
    int seen[N] = {0};
    int64_t batches = -1;
    for (int r = 0; r < W; r++) {
        vh_sampler *s = sampler_new(&h, N, r, W, B, VH_SPLIT_TRAIN, 42);
        assert_non_null(s);
        assert_int_equal(vh_sampler_start(s, 5), VH_STATUS_OK);
        /* 103 / 3 = 34 per rank, 4 full batches of 8 */
        assert_int_equal(vh_sampler_batches(s), 4);
        assert_int_equal(vh_sampler_samples(s), 32);
        if (batches < 0) batches = vh_sampler_batches(s);
        assert_int_equal(vh_sampler_batches(s), batches);
        for (int64_t b = 0; b < vh_sampler_batches(s); b++) {
            const int64_t *idx;
            int64_t count;
            assert_int_equal(vh_sampler_batch(s, b, &idx, &count), VH_STATUS_OK);
            assert_int_equal(count, B);
            for (int64_t k = 0; k < count; k++) {
                assert_true(idx[k] >= 0 && idx[k] < N);
                seen[idx[k]]++;
            }
        }
        const int64_t *idx;
        int64_t count;
        assert_int_equal(vh_sampler_batch(s, 4, &idx, &count), VH_STATUS_ERR_INVALID_ARG);
        vh_sampler_free(s);
    }
    int total = 0;
    for (int i = 0; i < N; i++) {
        assert_true(seen[i] <= 1); /* disjoint over ranks */
        total += seen[i];
    }
    assert_int_equal(total, W * 32);
    assert_int_equal(atomic_load(&h.live), 0);
}

static void test_sampler_shuffle(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    enum { N = 64 };
    int64_t a[N], b[N], c[N], e[N];
    vh_sampler *s = sampler_new(&h, N, 0, 1, 8, VH_SPLIT_TRAIN, 7);
    vh_sampler *t = sampler_new(&h, N, 0, 1, 8, VH_SPLIT_TRAIN, 7);
    vh_sampler *u = sampler_new(&h, N, 0, 1, 8, VH_SPLIT_TRAIN, 8);
    assert_true(s && t && u);
    vh_sampler_start(s, 0);
    vh_sampler_start(t, 0);
    vh_sampler_start(u, 0);
    assert_int_equal(sampler_all(s, a, N), N);
    assert_int_equal(sampler_all(t, b, N), N);
    assert_int_equal(sampler_all(u, c, N), N);
    assert_memory_equal(a, b, sizeof a);     /* same seed, same order */
    assert_memory_not_equal(a, c, sizeof a); /* another seed */
    vh_sampler_start(s, 1);
    assert_int_equal(sampler_all(s, e, N), N);
    assert_memory_not_equal(a, e, sizeof a); /* another epoch */
    vh_sampler_start(s, 0);                  /* back to epoch 0: the same again */
    assert_int_equal(sampler_all(s, e, N), N);
    assert_memory_equal(a, e, sizeof a);
    int seen[N] = {0}; /* a permutation */
    for (int i = 0; i < N; i++) seen[a[i]]++;
    for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
    int moved = 0;
    for (int i = 0; i < N; i++) moved += a[i] != i;
    assert_true(moved > N / 2);
    /* the sample key: per (seed, epoch, sample), not per rank */
    vh_sampler *r1 = sampler_new(&h, N, 1, 2, 8, VH_SPLIT_TRAIN, 7);
    vh_sampler_start(r1, 1);
    vh_sampler_start(s, 1);
    assert_true(vh_sampler_sample_key(s, 3) == vh_sampler_sample_key(r1, 3));
    assert_true(vh_sampler_sample_key(s, 3) != vh_sampler_sample_key(s, 4));
    vh_sampler_start(s, 2);
    assert_true(vh_sampler_sample_key(s, 3) != vh_sampler_sample_key(r1, 3));
    vh_sampler_free(r1);
    vh_sampler_free(s);
    vh_sampler_free(t);
    vh_sampler_free(u);
    assert_int_equal(atomic_load(&h.live), 0);
}

/* Every (size, world, batch): equal batch counts, no empty batch, each sample
 * once on rank i % w, in order; or an error exactly when the rule says. */
static void test_sampler_eval_rule(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    for (int64_t n = 1; n <= 70; n++) {
        for (int w = 1; w <= 5; w++) {
            for (int64_t b = 1; b <= 9; b++) {
                int64_t largest = (n + w - 1) / w, nb = (largest + b - 1) / b;
                int possible = n >= w && n / w >= nb;
                int seen[70] = {0};
                for (int r = 0; r < w; r++) {
                    h.error[0] = '\0';
                    vh_sampler *s = sampler_new(&h, n, r, w, b, VH_SPLIT_EVAL, 1);
                    if (!possible) {
                        assert_null(s);
                        assert_true(strlen(h.error) > 20);
                        assert_null(strchr(h.error, '\n'));
                        break;
                    }
                    assert_non_null(s);
                    assert_int_equal(vh_sampler_start(s, 3), VH_STATUS_OK);
                    assert_int_equal(vh_sampler_batches(s), nb);
                    int64_t prev = -1, total = 0;
                    for (int64_t j = 0; j < nb; j++) {
                        const int64_t *idx;
                        int64_t count;
                        assert_int_equal(vh_sampler_batch(s, j, &idx, &count), VH_STATUS_OK);
                        assert_true(count >= 1 && count <= b);
                        /* only the last two batches may be short */
                        if (j < nb - 2) assert_int_equal(count, b);
                        for (int64_t k = 0; k < count; k++) {
                            assert_int_equal(idx[k] % w, r);
                            assert_true(idx[k] > prev);
                            prev = idx[k];
                            seen[idx[k]]++;
                        }
                        total += count;
                    }
                    assert_int_equal(total, vh_sampler_samples(s));
                    vh_sampler_free(s);
                }
                if (possible)
                    for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
            }
        }
    }
    /* The rule's special case: 10 samples, 3 ranks, batch 3: shares 4, 3, 3;
     * two batches each; ranks 1 and 2 give 2 + 1. */
    vh_sampler *s = sampler_new(&h, 10, 1, 3, 3, VH_SPLIT_EVAL, 0);
    assert_non_null(s);
    vh_sampler_start(s, 0);
    assert_int_equal(vh_sampler_batches(s), 2);
    const int64_t *idx;
    int64_t count;
    vh_sampler_batch(s, 0, &idx, &count);
    assert_int_equal(count, 2);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 4);
    vh_sampler_batch(s, 1, &idx, &count);
    assert_int_equal(count, 1);
    assert_int_equal(idx[0], 7);
    vh_sampler_free(s);
    assert_int_equal(atomic_load(&h.live), 0);
}

static void test_sampler_errors(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    assert_null(sampler_new(&h, 100, 0, 4, 32, VH_SPLIT_TRAIN, 0));
    assert_string_equal(h.error, "train split of 100 samples over 4 rank(s) leaves 25 per rank, "
                                 "fewer than one batch of 32");
    assert_null(sampler_new(&h, 2, 0, 3, 1, VH_SPLIT_EVAL, 0));
    assert_non_null(strstr(h.error, "eval split of 2 samples over 3 ranks"));
    assert_null(sampler_new(&h, 10, 0, 3, 1, VH_SPLIT_EVAL, 0));
    assert_non_null(strstr(h.error, "batch of at least 2"));
    assert_null(sampler_new(&h, 10, 3, 3, 1, VH_SPLIT_EVAL, 0));
    assert_non_null(strstr(h.error, "rank 3 of world 3"));
    assert_null(sampler_new(&h, 10, 0, 1, 0, VH_SPLIT_EVAL, 0));
    vh_sampler *s = sampler_new(&h, 10, 0, 1, 2, VH_SPLIT_TRAIN, 0);
    const int64_t *idx;
    int64_t count;
    assert_int_equal(vh_sampler_batch(s, 0, &idx, &count),
                     VH_STATUS_ERR_INVALID_ARG); /* no start */
    assert_int_equal(vh_sampler_start(s, -1), VH_STATUS_ERR_INVALID_ARG);
    vh_sampler_free(s);
    vh_sampler_free(NULL);
    assert_int_equal(atomic_load(&h.live), 0);
}

static void test_sampler_state(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    vh_sampler *s = sampler_new(&h, 50, 1, 2, 4, VH_SPLIT_TRAIN, 99);
    vh_sampler *t = sampler_new(&h, 50, 1, 2, 4, VH_SPLIT_TRAIN, 99);
    vh_sampler *other = sampler_new(&h, 50, 0, 2, 4, VH_SPLIT_TRAIN, 98); /* another seed */
    assert_true(s && t && other);
    unsigned char blob[VH_SAMPLER_STATE_BYTES];
    int64_t cursor;
    int started;
    /* never started: loads as not started */
    assert_int_equal(vh_sampler_state_save(s, 0, blob, sizeof blob), VH_STATUS_OK);
    assert_int_equal(vh_sampler_state_load(t, blob, sizeof blob, &cursor, &started), VH_STATUS_OK);
    assert_int_equal(started, 0);
    assert_int_equal(cursor, 0);

    vh_sampler_start(s, 6);
    assert_int_equal(vh_sampler_state_save(s, 3, blob, sizeof blob), VH_STATUS_OK);
    assert_int_equal(vh_sampler_state_load(t, blob, sizeof blob, &cursor, &started), VH_STATUS_OK);
    assert_int_equal(started, 1);
    assert_int_equal(cursor, 3);
    assert_int_equal(vh_sampler_epoch(t), 6);
    int64_t a[64], b[64];
    assert_int_equal(sampler_all(s, a, 64), sampler_all(t, b, 64));
    assert_memory_equal(a, b, (size_t)vh_sampler_samples(s) * sizeof a[0]);

    assert_int_equal(vh_sampler_state_save(s, 99, blob, sizeof blob), VH_STATUS_ERR_INVALID_ARG);
    vh_sampler_state_save(s, 3, blob, sizeof blob);
    assert_int_equal(vh_sampler_state_load(other, blob, sizeof blob, &cursor, &started),
                     VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(h.error, "another setup"));
    blob[0] ^= 1;
    assert_int_equal(vh_sampler_state_load(t, blob, sizeof blob, &cursor, &started),
                     VH_STATUS_ERR_FORMAT);
    assert_int_equal(vh_sampler_state_load(t, blob, 10, &cursor, &started), VH_STATUS_ERR_FORMAT);
    vh_sampler_free(s);
    vh_sampler_free(t);
    vh_sampler_free(other);
    assert_int_equal(atomic_load(&h.live), 0);
}

/* A training position saved by rank 1 of 2 (batch 4) resumes on rank 0 of
 * 2, on 1 rank of batch 8 and on 3 ranks of batch 4 at the same point of the
 * epoch's permutation: the next global batch holds the same samples. */
static void test_sampler_state_other_world(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    vh_sampler *r1 = sampler_new(&h, 60, 1, 2, 4, VH_SPLIT_TRAIN, 7);
    vh_sampler *r0 = sampler_new(&h, 60, 0, 2, 4, VH_SPLIT_TRAIN, 7);
    vh_sampler *one = sampler_new(&h, 60, 0, 1, 8, VH_SPLIT_TRAIN, 7);
    vh_sampler *odd = sampler_new(&h, 60, 0, 1, 5, VH_SPLIT_TRAIN, 7);
    vh_sampler *ev = sampler_new(&h, 60, 0, 1, 8, VH_SPLIT_EVAL, 7);
    vh_sampler *three[3];
    for (int r = 0; r < 3; r++) three[r] = sampler_new(&h, 60, r, 3, 4, VH_SPLIT_TRAIN, 7);
    assert_true(r1 && r0 && one && odd && ev && three[0] && three[1] && three[2]);
    unsigned char blob[VH_SAMPLER_STATE_BYTES];
    int64_t cursor;
    int started;
    vh_sampler_start(r1, 2);
    assert_int_equal(vh_sampler_state_save(r1, 3, blob, sizeof blob), VH_STATUS_OK);
    /* 3 batches x 2 ranks x 4 = 24 samples consumed */
    assert_int_equal(vh_sampler_state_load(r0, blob, sizeof blob, &cursor, &started), VH_STATUS_OK);
    assert_int_equal(cursor, 3);
    assert_int_equal(vh_sampler_state_load(one, blob, sizeof blob, &cursor, &started), VH_STATUS_OK);
    assert_int_equal(cursor, 3);
    assert_int_equal(started, 1);
    assert_int_equal(vh_sampler_epoch(one), 2);
    assert_int_equal(vh_sampler_state_load(odd, blob, sizeof blob, &cursor, &started), VH_STATUS_OK);
    assert_int_equal(cursor, 4); /* 24 / 5: the batch that holds sample 24 */
    for (int r = 0; r < 3; r++) {
        assert_int_equal(vh_sampler_state_load(three[r], blob, sizeof blob, &cursor, &started),
                         VH_STATUS_OK);
        assert_int_equal(cursor, 2); /* 24 / 12 */
    }
    /* The next global batch: one's batch 3 = r0's and r1's batch 3 together. */
    const int64_t *a, *b, *c;
    int64_t na, nb, nc;
    vh_sampler_batch(one, 3, &a, &na);
    vh_sampler_batch(r0, 3, &b, &nb);
    vh_sampler_batch(r1, 3, &c, &nc);
    assert_int_equal(na, 8);
    assert_int_equal(nb + nc, 8);
    for (int64_t k = 0; k < 4; k++) {
        assert_int_equal(a[2 * k], b[k]);
        assert_int_equal(a[2 * k + 1], c[k]);
    }
    /* An eval position never moves to another setup. */
    assert_int_equal(vh_sampler_state_load(ev, blob, sizeof blob, &cursor, &started),
                     VH_STATUS_ERR_FORMAT);
    vh_sampler_free(r1);
    vh_sampler_free(r0);
    vh_sampler_free(one);
    vh_sampler_free(odd);
    vh_sampler_free(ev);
    for (int r = 0; r < 3; r++) vh_sampler_free(three[r]);
    assert_int_equal(atomic_load(&h.live), 0);
}

/* ---- prefetch ------------------------------------------------------------------ */

typedef struct pf_ctx {
    int64_t max_batch, floats;
    int64_t fail_at;     /* -1: never */
    int bad_size;        /* fill sets size 0 */
    int sleepy;          /* sleep a little, varied per batch */
    atomic_int running, peak, errors;
} pf_ctx;

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static vh_status pf_fill(void *ctx, int64_t batch, vh_prefetch_slot *slot, int worker, char *err,
                         size_t err_len) {
    pf_ctx *c = ctx;
    int now = atomic_fetch_add(&c->running, 1) + 1;
    int seen = atomic_load(&c->peak);
    while (now > seen && !atomic_compare_exchange_weak(&c->peak, &seen, now)) {
    }
    if (slot->index != batch || worker < 0) atomic_fetch_add(&c->errors, 1);
    if (c->sleepy) sleep_us((long)((uint64_t)(batch * 7919 + 13) % 7) * 150);
    for (int64_t k = 0; k < c->floats; k++) slot->images[k] = (float)batch + (float)k * 1e-3f;
    slot->size = c->bad_size ? 0 : 1 + batch % c->max_batch;
    for (int64_t k = 0; k < slot->size; k++) slot->labels[k] = (int32_t)(batch * 10 + k);
    atomic_fetch_sub(&c->running, 1);
    if (batch == c->fail_at) {
        snprintf(err, err_len, "/data/x.bin: record %lld is broken", (long long)batch);
        return VH_STATUS_ERR_FORMAT;
    }
    return VH_STATUS_OK;
}

static vh_prefetch *pf_new(fake_host *h, pf_ctx *c, int workers, int depth) {
    vh_prefetch_setup ps = {.struct_size = sizeof ps, .workers = workers, .depth = depth,
                            .max_batch = c->max_batch, .image_floats = c->floats,
                            .fill = pf_fill, .ctx = c};
    vh_prefetch *p = NULL;
    assert_int_equal(vh_prefetch_init(&h->pub, &ps, &p), VH_STATUS_OK);
    return p;
}

static void pf_check_slot(const pf_ctx *c, const vh_prefetch_slot *slot, int64_t batch) {
    assert_int_equal(slot->index, batch);
    assert_int_equal(slot->size, 1 + batch % c->max_batch);
    assert_true(slot->images[0] == (float)batch);
    assert_true(slot->images[c->floats - 1] == (float)batch + (float)(c->floats - 1) * 1e-3f);
    for (int64_t k = 0; k < slot->size; k++) assert_int_equal(slot->labels[k], batch * 10 + k);
}

static void pf_ctx_init(pf_ctx *c) {
    memset(c, 0, sizeof *c);
    c->max_batch = 5;
    c->floats = 64;
    c->fail_at = -1;
    atomic_init(&c->running, 0);
    atomic_init(&c->peak, 0);
    atomic_init(&c->errors, 0);
}

static void test_prefetch_order(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    pf_ctx c;
    pf_ctx_init(&c);
    c.sleepy = 1;
    vh_prefetch *p = pf_new(&h, &c, 16, 6);
    for (int pass = 0; pass < 3; pass++) {
        int64_t first = pass == 1 ? 123 : 0, end = 400;
        assert_int_equal(vh_prefetch_start(p, first, end), VH_STATUS_OK);
        for (int64_t i = first; i < end; i++) {
            const vh_prefetch_slot *slot;
            int has;
            assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK);
            assert_int_equal(has, 1);
            pf_check_slot(&c, slot, i);
            assert_int_equal(vh_prefetch_position(p), i + 1);
            if (i % 97 == 0) { /* workers run ahead; the slot in hand stays ours */
                sleep_us(3000);
                pf_check_slot(&c, slot, i);
            }
        }
        const vh_prefetch_slot *slot;
        int has = 1;
        assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK);
        assert_int_equal(has, 0);
        assert_null(slot);
        assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK); /* stays over */
        assert_int_equal(has, 0);
    }
    assert_int_equal(atomic_load(&c.errors), 0);
    assert_true(atomic_load(&c.peak) >= 2); /* fills did overlap */
    assert_true(atomic_load(&c.peak) <= 6); /* never more than the slots */
    vh_prefetch_free(p);
    assert_int_equal(atomic_load(&h.live), 0);
}

static void test_prefetch_inline_and_empty(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    pf_ctx c;
    pf_ctx_init(&c);
    vh_prefetch *p = pf_new(&h, &c, 0, 1);
    const vh_prefetch_slot *slot;
    int has;
    assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_ERR_INVALID_ARG); /* no pass */
    assert_non_null(strstr(h.error, "without a pass"));
    assert_int_equal(vh_prefetch_start(p, 0, 50), VH_STATUS_OK);
    for (int64_t i = 0; i < 50; i++) {
        assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK);
        assert_int_equal(has, 1);
        pf_check_slot(&c, slot, i);
    }
    assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK);
    assert_int_equal(has, 0);
    assert_int_equal(vh_prefetch_start(p, 7, 7), VH_STATUS_OK); /* an empty pass */
    assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK);
    assert_int_equal(has, 0);
    assert_int_equal(vh_prefetch_start(p, 5, 4), VH_STATUS_ERR_INVALID_ARG);
    vh_prefetch_free(p);
    vh_prefetch_free(NULL);
    assert_int_equal(atomic_load(&h.live), 0);
}

static void test_prefetch_error(void **state) {
    (void)state;
    for (int workers = 0; workers <= 8; workers += 4) {
        fake_host h;
        fake_init(&h);
        pf_ctx c;
        pf_ctx_init(&c);
        c.fail_at = 37;
        c.sleepy = 1;
        vh_prefetch *p = pf_new(&h, &c, workers, 4);
        vh_prefetch_start(p, 0, 100);
        const vh_prefetch_slot *slot;
        int has;
        for (int64_t i = 0; i < 37; i++) {
            assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK);
            pf_check_slot(&c, slot, i);
        }
        assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_ERR_FORMAT);
        assert_int_equal(has, 0);
        assert_string_equal(h.error, "/data/x.bin: record 37 is broken");
        h.error[0] = '\0';
        assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_ERR_FORMAT); /* again */
        assert_string_equal(h.error, "/data/x.bin: record 37 is broken");
        /* a new pass that avoids the bad batch works; fills of the failed
         * pass may still run until stop, and they read c */
        vh_prefetch_stop(p);
        c.fail_at = -1;
        vh_prefetch_start(p, 10, 60);
        for (int64_t i = 10; i < 60; i++) {
            assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_OK);
            pf_check_slot(&c, slot, i);
        }
        /* a fill that breaks its promise (size 0) is an internal error */
        vh_prefetch_stop(p);
        c.bad_size = 1;
        vh_prefetch_start(p, 0, 10);
        assert_int_equal(vh_prefetch_next(p, &slot, &has), VH_STATUS_ERR_INTERNAL);
        assert_non_null(strstr(h.error, "set size 0"));
        vh_prefetch_free(p);
        assert_int_equal(atomic_load(&h.live), 0);
    }
}

static void test_prefetch_shutdown(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    pf_ctx c;
    pf_ctx_init(&c);
    c.sleepy = 1;
    /* free with no pass ever started */
    vh_prefetch_free(pf_new(&h, &c, 8, 3));
    /* free in the middle of a pass, workers busy */
    for (int round = 0; round < 20; round++) {
        vh_prefetch *p = pf_new(&h, &c, 8, 8);
        vh_prefetch_start(p, 0, 1000);
        const vh_prefetch_slot *slot;
        int has;
        for (int i = 0; i < round % 4; i++) vh_prefetch_next(p, &slot, &has);
        if (round % 3 == 0) vh_prefetch_stop(p);
        if (round % 5 == 0) vh_prefetch_start(p, 500, 1000); /* restart mid-pass */
        vh_prefetch_free(p);
    }
    assert_int_equal(atomic_load(&h.live), 0);
    /* bad setups */
    vh_prefetch *p = NULL;
    vh_prefetch_setup ps = {.struct_size = sizeof ps, .workers = 65, .depth = 2, .max_batch = 1,
                            .image_floats = 1, .fill = pf_fill, .ctx = &c};
    assert_int_equal(vh_prefetch_init(&h.pub, &ps, &p), VH_STATUS_ERR_INVALID_ARG);
    ps.workers = 1;
    ps.fill = NULL;
    assert_int_equal(vh_prefetch_init(&h.pub, &ps, &p), VH_STATUS_ERR_INVALID_ARG);
    assert_null(p);
}

/* ---- data pass ----------------------------------------------------------------- */

/* Sample i of a split: its C*H*W floats are 1000 * split + i + k / 100, its
 * label i % 7. */
enum { DP_C = 2, DP_H = 1, DP_W = 3, DP_CHW = DP_C * DP_H * DP_W };

typedef struct dp_ctx {
    int64_t fail_at; /* -1: never */
    int stopped;     /* calls of the stopped hook */
    atomic_int bad_worker;
} dp_ctx;

static float dp_value(vh_split split, int64_t i, int64_t k) {
    return (float)(1000 * (int)split + i) + (float)k / 100.0f;
}

static vh_status dp_fill(void *ctx, const vh_data_pass_batch *b, char *err, size_t err_len) {
    dp_ctx *c = ctx;
    if (b->worker < 0 || b->worker >= 2 || !b->sampler) atomic_fetch_add(&c->bad_worker, 1);
    if (b->index == c->fail_at) {
        snprintf(err, err_len, "demo: sample %lld is broken", (long long)b->samples[0]);
        return VH_STATUS_ERR_FORMAT;
    }
    for (int64_t j = 0; j < b->count; j++) {
        for (int64_t k = 0; k < DP_CHW; k++)
            b->images[j * DP_CHW + k] = dp_value(b->split, b->samples[j], k);
        b->labels[j] = (int32_t)(b->samples[j] % 7);
    }
    return VH_STATUS_OK;
}

static void dp_stopped(void *ctx) { ((dp_ctx *)ctx)->stopped++; }

static vh_data_pass *dp_new(fake_host *h, dp_ctx *c, const vh_data_setup *ds, int64_t eval_size,
                            uint32_t tag) {
    vh_data_pass_setup ps = {.struct_size = sizeof ps, .name = "demo", .state_magic = 0x4f4d4544u,
                             .state_tag = tag, .data = ds, .train_size = 20,
                             .eval_size = eval_size, .eval_missing = "no such folder",
                             .channels = DP_C, .height = DP_H, .width = DP_W, .num_classes = 7,
                             .workers = 2, .depth = 3, .fill = dp_fill, .stopped = dp_stopped,
                             .ctx = c};
    vh_data_pass *p = NULL;
    vh_status st = vh_data_pass_init(&h->pub, &ps, &p);
    if (st != VH_STATUS_OK) fail_msg("vh_data_pass_init: %s", h->error);
    return p;
}

/* The next batch: checks it is batch `batch` of the sampler's pass. */
static void dp_expect(vh_data_pass *p, const vh_sampler *ref, vh_split split, int64_t batch) {
    vh_batch b;
    int has = 0;
    assert_int_equal(vh_data_pass_next(p, &b, &has), VH_STATUS_OK);
    assert_int_equal(has, 1);
    const int64_t *idx;
    int64_t count;
    assert_int_equal(vh_sampler_batch(ref, batch, &idx, &count), VH_STATUS_OK);
    assert_int_equal(b.struct_size, sizeof b);
    assert_int_equal(b.size, count);
    assert_int_equal(b.images.ndim, 4);
    assert_int_equal(b.images.dtype, VH_DTYPE_F32);
    assert_int_equal(b.images.shape[0], count);
    assert_int_equal(b.images.shape[1], DP_C);
    assert_int_equal(b.images.shape[2], DP_H);
    assert_int_equal(b.images.shape[3], DP_W);
    assert_int_equal(b.labels.dtype, VH_DTYPE_I32);
    assert_int_equal(b.labels.shape[0], count);
    const float *img = b.images.data;
    const int32_t *lab = b.labels.data;
    for (int64_t j = 0; j < count; j++) {
        for (int64_t k = 0; k < DP_CHW; k++)
            assert_true(img[j * DP_CHW + k] == dp_value(split, idx[j], k));
        assert_int_equal(lab[j], idx[j] % 7);
    }
}

static void dp_expect_end(vh_data_pass *p) {
    vh_batch b;
    int has = 1;
    assert_int_equal(vh_data_pass_next(p, &b, &has), VH_STATUS_OK);
    assert_int_equal(has, 0);
}

/* Passes, info, the end of a pass, an eval pass abandoning a training pass,
 * the resumable state and its refusals, errors of the fill. */
static void test_data_pass(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    dp_ctx c = {.fail_at = -1};
    atomic_init(&c.bad_worker, 0);
    vh_data_setup ds = {.struct_size = sizeof ds, .rank = 1, .world_size = 2, .batch_size = 3,
                        .seed = 42};
    vh_data_pass *p = dp_new(&h, &c, &ds, 9, 0);
    vh_sampler *train = sampler_new(&h, 20, 1, 2, 3, VH_SPLIT_TRAIN, 42);
    vh_sampler *eval = sampler_new(&h, 9, 1, 2, 3, VH_SPLIT_EVAL, 42);

    vh_data_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = offsetof(vh_data_info, num_classes); /* an older, shorter struct */
    assert_int_equal(vh_data_pass_info(p, &info), VH_STATUS_OK);
    assert_int_equal(info.channels, DP_C);
    assert_int_equal(info.width, DP_W);
    assert_int_equal(info.num_classes, 0);
    info.struct_size = sizeof info;
    assert_int_equal(vh_data_pass_info(p, &info), VH_STATUS_OK);
    assert_int_equal(info.num_classes, 7);
    assert_int_equal(info.train_size, 20);
    assert_int_equal(info.eval_size, 9);

    vh_batch b;
    int has;
    assert_int_equal(vh_data_pass_next(p, &b, &has), VH_STATUS_ERR_INVALID_ARG);
    assert_string_equal(h.error, "demo: next called before start_epoch");
    assert_int_equal(vh_data_pass_start_epoch(p, (vh_split)5, 0), VH_STATUS_ERR_INVALID_ARG);
    assert_string_equal(h.error, "demo: unknown split 5");

    /* a whole training pass (10 per rank: 3 batches of 3), over twice */
    assert_int_equal(vh_data_pass_start_epoch(p, VH_SPLIT_TRAIN, 4), VH_STATUS_OK);
    vh_sampler_start(train, 4);
    for (int64_t i = 0; i < 3; i++) dp_expect(p, train, VH_SPLIT_TRAIN, i);
    int stops = c.stopped;
    dp_expect_end(p);
    assert_int_equal(c.stopped, stops + 1); /* the workers stopped at the end */
    dp_expect_end(p);

    /* saved after one batch of epoch 5 */
    unsigned char blob[VH_DATA_PASS_STATE_BYTES], idle[VH_DATA_PASS_STATE_BYTES];
    assert_int_equal(vh_data_pass_state_save(p, blob, 10), VH_STATUS_ERR_INVALID_ARG);
    assert_non_null(strstr(h.error, "demo: state buffer of 10 bytes"));
    assert_int_equal(vh_data_pass_start_epoch(p, VH_SPLIT_TRAIN, 5), VH_STATUS_OK);
    vh_sampler_start(train, 5);
    dp_expect(p, train, VH_SPLIT_TRAIN, 0);
    assert_int_equal(vh_data_pass_state_save(p, blob, sizeof blob), VH_STATUS_OK);

    /* an eval pass abandons the training pass: it does not come back by
     * itself, and the state then holds no training pass */
    assert_int_equal(vh_data_pass_start_epoch(p, VH_SPLIT_EVAL, 0), VH_STATUS_OK);
    vh_sampler_start(eval, 0);
    for (int64_t i = 0; i < vh_sampler_batches(eval); i++) dp_expect(p, eval, VH_SPLIT_EVAL, i);
    dp_expect_end(p);
    dp_expect_end(p);
    assert_int_equal(vh_data_pass_state_save(p, idle, sizeof idle), VH_STATUS_OK);
    assert_memory_not_equal(blob, idle, sizeof blob);
    /* the host loads the saved state back: the training pass goes on */
    assert_int_equal(vh_data_pass_state_load(p, blob, sizeof blob), VH_STATUS_OK);
    dp_expect(p, train, VH_SPLIT_TRAIN, 1);
    /* so does a fresh helper, through the vtable entries */
    struct {
        vh_data_pass *pass;
    } self = {dp_new(&h, &c, &ds, 9, 0)};
    size_t bytes = 0;
    assert_int_equal(vh_data_pass_vt_state_size(&self, &bytes), VH_STATUS_OK);
    assert_int_equal(bytes, sizeof blob);
    assert_int_equal(vh_data_pass_vt_state_load(&self, blob, bytes), VH_STATUS_OK);
    dp_expect(self.pass, train, VH_SPLIT_TRAIN, 1);
    dp_expect(self.pass, train, VH_SPLIT_TRAIN, 2);
    assert_int_equal(vh_data_pass_vt_next(&self, &b, &has), VH_STATUS_OK);
    assert_int_equal(has, 0);
    /* saved at the end of the pass: resumes at its end */
    assert_int_equal(vh_data_pass_vt_state_save(&self, blob, bytes), VH_STATUS_OK);
    assert_int_equal(vh_data_pass_state_load(p, blob, sizeof blob), VH_STATUS_OK);
    dp_expect_end(p);
    /* a state without a training pass: none in progress after loading it */
    assert_int_equal(vh_data_pass_state_load(p, idle, sizeof idle), VH_STATUS_OK);
    assert_int_equal(vh_data_pass_next(p, &b, &has), VH_STATUS_ERR_INVALID_ARG);
    assert_string_equal(h.error, "demo: next called before start_epoch");

    /* refusals: size, another plugin, another data set, another rank */
    assert_int_equal(vh_data_pass_state_load(p, blob, sizeof blob - 1), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(h.error, "demo: state of 95 bytes, expected 96"));
    unsigned char foreign[sizeof blob];
    memcpy(foreign, blob, sizeof blob);
    foreign[0] ^= 1;
    assert_int_equal(vh_data_pass_state_load(p, foreign, sizeof foreign), VH_STATUS_ERR_FORMAT);
    assert_string_equal(h.error, "not a demo data state");
    vh_data_pass *tagged = dp_new(&h, &c, &ds, 9, 0x1234);
    assert_int_equal(vh_data_pass_state_load(tagged, blob, sizeof blob), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(h.error, "demo: state of another data set"));
    /* another rank continues the same pass with its own share; another
     * seed is another order, refused */
    vh_data_setup ds0 = ds;
    ds0.rank = 0;
    vh_data_pass *rank0 = dp_new(&h, &c, &ds0, 9, 0);
    assert_int_equal(vh_data_pass_state_load(rank0, blob, sizeof blob), VH_STATUS_OK);
    vh_data_setup ds_seed = ds;
    ds_seed.seed ^= 1;
    vh_data_pass *seeded = dp_new(&h, &c, &ds_seed, 9, 0);
    assert_int_equal(vh_data_pass_state_load(seeded, blob, sizeof blob), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(h.error, "another setup"));

    /* a failing fill: its message and status, for that batch and after */
    c.fail_at = 1;
    assert_int_equal(vh_data_pass_start_epoch(rank0, VH_SPLIT_TRAIN, 0), VH_STATUS_OK);
    assert_int_equal(vh_data_pass_next(rank0, &b, &has), VH_STATUS_OK);
    assert_int_equal(vh_data_pass_next(rank0, &b, &has), VH_STATUS_ERR_FORMAT);
    assert_int_equal(has, 0);
    assert_non_null(strstr(h.error, "demo: sample "));
    assert_non_null(strstr(h.error, " is broken"));
    assert_int_equal(vh_data_pass_next(rank0, &b, &has), VH_STATUS_ERR_FORMAT);
    /* fills of the failed pass may still run until its workers are joined,
     * and they read c */
    vh_data_pass_free(rank0);
    c.fail_at = -1;

    /* no evaluation split */
    vh_data_pass *no_eval = dp_new(&h, &c, &ds, 0, 0);
    info.struct_size = sizeof info;
    assert_int_equal(vh_data_pass_info(no_eval, &info), VH_STATUS_OK);
    assert_int_equal(info.eval_size, 0);
    assert_int_equal(vh_data_pass_start_epoch(no_eval, VH_SPLIT_EVAL, 0), VH_STATUS_ERR_CONFIG);
    assert_string_equal(h.error, "demo: no evaluation split: no such folder");
    assert_int_equal(vh_data_pass_start_epoch(no_eval, VH_SPLIT_TRAIN, 0), VH_STATUS_OK);

    /* a split too small for a batch: the sampler's message */
    vh_data_setup wide = ds;
    wide.batch_size = 11;
    vh_data_pass_setup ps = {.struct_size = sizeof ps, .name = "demo", .data = &wide,
                             .train_size = 20, .channels = 1, .height = 1, .width = 1,
                             .depth = 1, .fill = dp_fill, .ctx = &c};
    vh_data_pass *none = NULL;
    assert_int_equal(vh_data_pass_init(&h.pub, &ps, &none), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(h.error, "fewer than one batch of 11"));
    assert_null(none);

    assert_int_equal(atomic_load(&c.bad_worker), 0);
    vh_data_pass_free(p);
    vh_data_pass_free(self.pass);
    vh_data_pass_free(tagged);
    vh_data_pass_free(seeded);
    vh_data_pass_free(no_eval);
    vh_data_pass_free(NULL);
    vh_sampler_free(train);
    vh_sampler_free(eval);
    assert_int_equal(atomic_load(&h.live), 0);
}

/* vh_data_pass_fill_u8: evaluation copies through the tables; training with
 * neither crop nor flip does too; with a flip, each image is itself or its
 * mirror, drawn from its sample's key alone. */
static void test_data_pass_fill_u8(void **state) {
    (void)state;
    fake_host h;
    fake_init(&h);
    enum { N = 12, PL = 2, R = 3, CO = 4, PIX = PL * R * CO };
    uint8_t pixels[N * PIX], labels[N];
    for (int i = 0; i < N * PIX; i++) pixels[i] = (uint8_t)(i * 7 + 3);
    for (int i = 0; i < N; i++) labels[i] = (uint8_t)(i % 5);
    float lut[PL][256];
    for (int c = 0; c < PL; c++)
        for (int v = 0; v < 256; v++) lut[c][v] = (float)v + 1000.0f * (float)c;
    vh_data_pass_u8 u8 = {.pixels = {pixels, pixels}, .labels = {labels, labels}, .planes = PL,
                          .rows = R, .cols = CO, .lut = &lut[0][0]};
    vh_sampler *s = sampler_new(&h, N, 0, 1, N, VH_SPLIT_TRAIN, 1);
    vh_sampler_start(s, 0);
    const int64_t *idx;
    int64_t count;
    vh_sampler_batch(s, 0, &idx, &count);
    float images[N * PIX];
    int32_t out_labels[N];
    for (int round = 0; round < 3; round++) {
        vh_data_pass_batch b = {.split = round == 0 ? VH_SPLIT_EVAL : VH_SPLIT_TRAIN,
                                .sampler = s, .samples = idx, .count = count,
                                .images = images, .labels = out_labels};
        u8.hflip = round == 2;
        char err[256] = "";
        assert_int_equal(vh_data_pass_fill_u8(&u8, &b, err, sizeof err), VH_STATUS_OK);
        int flipped = 0;
        for (int64_t j = 0; j < count; j++) {
            int64_t i = idx[j];
            assert_int_equal(out_labels[j], labels[i]);
            uint64_t rng = vh_sampler_sample_key(s, i);
            int flip = round == 2 && (vh_sampler_rng_next(&rng) & 1);
            flipped += flip;
            for (int c = 0; c < PL; c++)
                for (int y = 0; y < R; y++)
                    for (int x = 0; x < CO; x++) {
                        int sx = flip ? CO - 1 - x : x;
                        float want = lut[c][pixels[i * PIX + (c * R + y) * CO + sx]];
                        assert_true(images[j * PIX + (c * R + y) * CO + x] == want);
                    }
        }
        if (round == 2) assert_true(flipped > 0 && flipped < count);
    }
    vh_sampler_free(s);
    assert_int_equal(atomic_load(&h.live), 0);
}

/* ---- writing data files ------------------------------------------------------- */

static char tmp_root[128];

static void put_be32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

static void write_file(const char *path, const void *data, size_t len, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(fwrite(data, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
    }
}

/* The pixel byte k of IDX image i; pixels 0 and 1 carry i. */
static uint8_t idx_pixel(int64_t i, int64_t k) {
    if (k == 0) return (uint8_t)(i & 255);
    if (k == 1) return (uint8_t)(i >> 8);
    return (uint8_t)((i * 37 + k * 11) % 256);
}

static uint8_t idx_label(int64_t i) { return (uint8_t)((i * 3 + 1) % 10); }

/* An IDX image file of n images rows x cols (magic and dims as given), cut
 * to `keep` bytes when keep >= 0. */
static void write_idx_images(const char *dir, const char *name, uint32_t magic, int64_t n,
                             int rows, int cols, int64_t keep, int gz) {
    size_t len = 16 + (size_t)(n * rows * cols);
    unsigned char *b = calloc(1, len + (keep > 0 ? (size_t)keep : 0)); /* zeros past the end */
    put_be32(b, magic);
    put_be32(b + 4, (uint32_t)n);
    put_be32(b + 8, (uint32_t)rows);
    put_be32(b + 12, (uint32_t)cols);
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < rows * cols; k++) b[16 + i * rows * cols + k] = idx_pixel(i, k);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_file(path, b, keep >= 0 ? (size_t)keep : len, gz);
    free(b);
}

static void write_idx_labels(const char *dir, const char *name, uint32_t magic, int64_t n,
                             int bad_at, int gz) {
    size_t len = 8 + (size_t)n;
    unsigned char *b = malloc(len);
    put_be32(b, magic);
    put_be32(b + 4, (uint32_t)n);
    for (int64_t i = 0; i < n; i++) b[8 + i] = i == bad_at ? 10 : idx_label(i);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_file(path, b, len, gz);
    free(b);
}

/* A fresh folder under tmp_root. */
static void make_dir(char *out, size_t len, const char *name) {
    snprintf(out, len, "%s/%s", tmp_root, name);
    assert_int_equal(mkdir(out, 0700), 0);
}

enum { IDX_TRAIN = 40, IDX_EVAL = 11, IDX_ROWS = 5, IDX_COLS = 4 };

/* A good IDX set: train gzipped, eval plain. */
static void write_idx_set(const char *dir) {
    write_idx_images(dir, "train-images-idx3-ubyte.gz", 0x803, IDX_TRAIN, IDX_ROWS, IDX_COLS, -1,
                     1);
    write_idx_labels(dir, "train-labels-idx1-ubyte.gz", 0x801, IDX_TRAIN, -1, 1);
    write_idx_images(dir, "t10k-images-idx3-ubyte", 0x803, IDX_EVAL, IDX_ROWS, IDX_COLS, -1, 0);
    write_idx_labels(dir, "t10k-labels-idx1-ubyte", 0x801, IDX_EVAL, -1, 0);
}

enum { CIFAR_PER_FILE = 3, CIFAR_EVAL = 7 };

static uint8_t cifar_pixel(int64_t i, int64_t k) { return (uint8_t)((i * 31 + k * 7) % 256); }

/* `records` CIFAR records for samples first.. (bad_label_at: a label 200). */
static void write_cifar(const char *dir, const char *name, int cifar100, int64_t first,
                        int64_t records, int64_t extra_bytes, int64_t bad_label_at) {
    int lb = cifar100 ? 2 : 1;
    size_t rec = (size_t)(lb + 3072), len = rec * (size_t)records + (size_t)extra_bytes;
    unsigned char *b = calloc(1, len + 1);
    for (int64_t r = 0; r < records; r++) {
        int64_t i = first + r;
        unsigned char *p = b + rec * (size_t)r;
        if (cifar100) {
            p[0] = (unsigned char)(i % 20);
            p[1] = (unsigned char)(i % 100);
        } else {
            p[0] = (unsigned char)(i % 10);
        }
        if (r == bad_label_at) p[lb - 1] = 200;
        for (int64_t k = 0; k < 3072; k++) p[lb + k] = cifar_pixel(i, k);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_file(path, b, len, 0);
    free(b);
}

static void write_cifar10_set(const char *dir) {
    char name[64];
    for (int f = 1; f <= 5; f++) {
        snprintf(name, sizeof name, "data_batch_%d.bin", f);
        write_cifar(dir, name, 0, (f - 1) * CIFAR_PER_FILE, CIFAR_PER_FILE, 0, -1);
    }
    write_cifar(dir, "test_batch.bin", 0, 1000, CIFAR_EVAL, 0, -1);
}

/* ---- loading a data plugin as the host does ----------------------------------- */

typedef struct inst {
    vh_run run;
    const vh_data_vtable *vt;
    void *self;
    char error[VH_DIAG_CAPACITY];
} inst;

/* Opens a run whose data section is `data` and creates the data plugin;
 * returns the status of create (its message in x->error). */
static vh_status inst_open(inst *x, const char *data, int rank, int world, int64_t batch,
                           uint64_t seed) {
    memset(x, 0, sizeof *x);
    char recipe[2048];
    snprintf(recipe, sizeof recipe,
             "run: {seed: %llu}\n"
             "model: {plugin: test_model}\n"
             "precision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\n"
             "optim: {plugin: test_optim}\n"
             "data: %s\n",
             (unsigned long long)seed, data);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    vh_status st = run_open_text(&x->run, "data.yaml", recipe, &opts, &d);
    if (st != VH_STATUS_OK) fail_msg("run_open: %s", d.text);
    x->vt = x->run.plugins[VH_ROLE_DATA].desc->vtable;
    vh_data_setup setup = {.struct_size = sizeof setup, .rank = rank, .world_size = world,
                           .batch_size = batch, .seed = seed};
    st = x->vt->create(&x->run.hosts[VH_ROLE_DATA].pub, &setup, &x->self);
    if (st != VH_STATUS_OK) {
        snprintf(x->error, sizeof x->error, "%s", x->run.hosts[VH_ROLE_DATA].error);
        x->self = NULL;
    }
    return st;
}

static void inst_close(inst *x) {
    if (x->self) x->vt->destroy(x->self);
    x->self = NULL;
    run_close(&x->run);
}

static inst *inst_new(void) {
    inst *x = calloc(1, sizeof *x);
    assert_non_null(x);
    return x;
}

static void inst_free(inst *x) {
    inst_close(x);
    free(x);
}

static vh_data_info inst_info(inst *x) {
    vh_data_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(x->vt->info(x->self, &info), VH_STATUS_OK);
    return info;
}

/* Everything of one pass, copied out. */
typedef struct pass {
    int64_t batches, samples, chw;
    int64_t sizes[4096];
    float *images;
    int32_t *labels;
} pass;

static void pass_free(pass *p) {
    free(p->images);
    free(p->labels);
    free(p);
}

/* Runs `max_batches` (all when < 0) batches of the pass begun by start_epoch
 * (when epoch >= 0) or of the current one (epoch < 0). */
static pass *run_pass(inst *x, vh_split split, int64_t epoch, int64_t max_batches) {
    pass *p = calloc(1, sizeof *p);
    assert_non_null(p);
    vh_data_info info = inst_info(x);
    p->chw = (int64_t)info.channels * info.height * info.width;
    if (epoch >= 0) {
        vh_status st = x->vt->start_epoch(x->self, split, epoch);
        if (st != VH_STATUS_OK) fail_msg("start_epoch: %s", x->run.hosts[VH_ROLE_DATA].error);
    }
    int64_t cap = 0;
    for (;;) {
        if (max_batches >= 0 && p->batches == max_batches) break;
        vh_batch b;
        int has = 0;
        vh_status st = x->vt->next(x->self, &b, &has);
        if (st != VH_STATUS_OK) fail_msg("next: %s", x->run.hosts[VH_ROLE_DATA].error);
        if (!has) break;
        assert_int_equal(b.struct_size, sizeof b);
        assert_true(b.size >= 1);
        assert_int_equal(b.images.ndim, 4);
        assert_int_equal(b.images.dtype, VH_DTYPE_F32);
        assert_int_equal(b.images.shape[0], b.size);
        assert_int_equal(b.images.shape[1], info.channels);
        assert_int_equal(b.images.shape[2], info.height);
        assert_int_equal(b.images.shape[3], info.width);
        assert_int_equal(b.labels.dtype, VH_DTYPE_I32);
        assert_int_equal(b.labels.shape[0], b.size);
        assert_true(p->batches < 4096);
        if (p->samples + b.size > cap) {
            cap = (p->samples + b.size) * 2;
            p->images = realloc(p->images, (size_t)(cap * p->chw) * sizeof(float));
            p->labels = realloc(p->labels, (size_t)cap * sizeof(int32_t));
        }
        memcpy(p->images + p->samples * p->chw, b.images.data,
               (size_t)(b.size * p->chw) * sizeof(float));
        memcpy(p->labels + p->samples, b.labels.data, (size_t)b.size * sizeof(int32_t));
        p->sizes[p->batches++] = b.size;
        p->samples += b.size;
    }
    return p;
}

static void assert_passes_equal(const pass *a, const pass *b) {
    assert_int_equal(a->batches, b->batches);
    assert_int_equal(a->samples, b->samples);
    assert_memory_equal(a->sizes, b->sizes, (size_t)a->batches * sizeof a->sizes[0]);
    assert_memory_equal(a->labels, b->labels, (size_t)a->samples * sizeof(int32_t));
    assert_memory_equal(a->images, b->images, (size_t)(a->samples * a->chw) * sizeof(float));
}

/* One line, naming the file and saying what: the plugin's message. */
static void assert_one_line_error(const char *msg, const char *file, const char *what) {
    if (!strstr(msg, file) || !strstr(msg, what) || strchr(msg, '\n'))
        fail_msg("expected one line naming '%s' and saying '%s', got: %s", file, what, msg);
}

/* ---- idx ---------------------------------------------------------------------- */

#define IDX_MEAN 0.5
#define IDX_STD 0.25

static float idx_value(uint8_t p) { return (float)(((double)p / 255.0 - IDX_MEAN) / IDX_STD); }

/* The sample an unaugmented IDX image is, from its pixels 0 and 1. */
static int64_t idx_sample_of(const float *img) {
    int lo = (int)lround((img[0] * IDX_STD + IDX_MEAN) * 255.0);
    int hi = (int)lround((img[1] * IDX_STD + IDX_MEAN) * 255.0);
    return lo + 256 * hi;
}

static void check_idx_image(const float *img, int64_t i) {
    for (int64_t k = 0; k < IDX_ROWS * IDX_COLS; k++)
        assert_float_equal(img[k], idx_value(idx_pixel(i, k)), 1e-6);
}

static void idx_section(char *out, size_t len, const char *dir, const char *extra) {
    snprintf(out, len, "{plugin: idx, root: %s, mean: %g, std: %g%s%s}", dir, IDX_MEAN, IDX_STD,
             extra[0] ? ", " : "", extra);
}

static void test_idx_reads(void **state) {
    (void)state;
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "idx_good");
    write_idx_set(dir);
    /* the recipe names the eval files with .gz, which are absent: the plain
     * files are taken; the train files are named without .gz, the reverse */
    idx_section(sec, sizeof sec, dir,
                "train_images: train-images-idx3-ubyte, train_labels: train-labels-idx1-ubyte");
    inst *x = inst_new();
    if (inst_open(x, sec, 0, 1, 4, 11) != VH_STATUS_OK) fail_msg("%s", x->error);
    vh_data_info info = inst_info(x);
    assert_int_equal(info.channels, 1);
    assert_int_equal(info.height, IDX_ROWS);
    assert_int_equal(info.width, IDX_COLS);
    assert_int_equal(info.num_classes, 10);
    assert_int_equal(info.train_size, IDX_TRAIN);
    assert_int_equal(info.eval_size, IDX_EVAL);

    /* eval: in order, every sample once, last batch short */
    pass *e = run_pass(x, VH_SPLIT_EVAL, 0, -1);
    assert_int_equal(e->batches, 3);
    assert_int_equal(e->samples, IDX_EVAL);
    assert_int_equal(e->sizes[2], 3);
    for (int64_t i = 0; i < IDX_EVAL; i++) {
        check_idx_image(e->images + i * e->chw, i);
        assert_int_equal(e->labels[i], idx_label(i));
    }
    /* train: full batches of a permutation, each image with its label */
    pass *t = run_pass(x, VH_SPLIT_TRAIN, 0, -1);
    assert_int_equal(t->batches, IDX_TRAIN / 4);
    int seen[IDX_TRAIN] = {0};
    int in_order = 1;
    for (int64_t j = 0; j < t->samples; j++) {
        int64_t i = idx_sample_of(t->images + j * t->chw);
        assert_true(i >= 0 && i < IDX_TRAIN);
        check_idx_image(t->images + j * t->chw, i);
        assert_int_equal(t->labels[j], idx_label(i));
        seen[i]++;
        in_order &= i == j;
    }
    for (int i = 0; i < IDX_TRAIN; i++) assert_int_equal(seen[i], 1);
    assert_false(in_order);
    pass_free(e);
    pass_free(t);
    inst_free(x);
}

static void test_idx_defaults_documented(void **state) {
    (void)state;
    /* mean 0.2860 and std 0.3530 unless the recipe says otherwise */
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "idx_defaults");
    write_idx_set(dir);
    snprintf(sec, sizeof sec, "{plugin: idx, root: %s, workers: 0}", dir);
    inst *x = inst_new();
    if (inst_open(x, sec, 0, 1, 16, 0) != VH_STATUS_OK) fail_msg("%s", x->error);
    pass *e = run_pass(x, VH_SPLIT_EVAL, 0, -1);
    for (int64_t k = 0; k < IDX_ROWS * IDX_COLS; k++)
        assert_float_equal(e->images[3 * e->chw + k],
                           (idx_pixel(3, k) / 255.0 - 0.2860) / 0.3530, 1e-5);
    pass_free(e);
    inst_free(x);
}

static void test_idx_errors(void **state) {
    (void)state;
    char dir[256], sec[1024], file[512];
    inst *x = inst_new();

    /* truncated images, gzipped: the message of the issue */
    make_dir(dir, sizeof dir, "idx_trunc_gz");
    write_idx_set(dir);
    write_idx_images(dir, "train-images-idx3-ubyte.gz", 0x803, IDX_TRAIN, IDX_ROWS, IDX_COLS,
                     16 + 7 * IDX_ROWS * IDX_COLS, 1);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/train-images-idx3-ubyte.gz", dir);
    char want[1024];
    snprintf(want, sizeof want,
             "%s: truncated: header says 40 images of 5x4 (816 bytes), file has 156", file);
    assert_string_equal(x->error, want);
    inst_close(x);

    /* truncated, plain, and a gzip stream cut short */
    make_dir(dir, sizeof dir, "idx_trunc_plain");
    write_idx_set(dir);
    write_idx_images(dir, "t10k-images-idx3-ubyte", 0x803, IDX_EVAL, IDX_ROWS, IDX_COLS, 100, 0);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/t10k-images-idx3-ubyte", dir);
    assert_one_line_error(x->error, file,
                          "truncated: header says 11 images of 5x4 (236 bytes), file has 100");
    inst_close(x);

    make_dir(dir, sizeof dir, "idx_cut_gz");
    write_idx_set(dir);
    { /* cut the compressed file itself in half */
        snprintf(file, sizeof file, "%s/train-labels-idx1-ubyte.gz", dir);
        struct stat sb;
        assert_int_equal(stat(file, &sb), 0);
        assert_int_equal(truncate(file, sb.st_size / 2), 0);
    }
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file, "truncated");
    inst_close(x);

    /* too long */
    make_dir(dir, sizeof dir, "idx_long");
    write_idx_set(dir);
    write_idx_images(dir, "t10k-images-idx3-ubyte", 0x803, IDX_EVAL, IDX_ROWS, IDX_COLS,
                     16 + IDX_EVAL * IDX_ROWS * IDX_COLS + 5, 0);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/t10k-images-idx3-ubyte", dir);
    assert_one_line_error(x->error, file,
                          "too long: header says 11 images of 5x4 (236 bytes), file has 241");
    inst_close(x);

    /* wrong magic: a label file where images belong */
    make_dir(dir, sizeof dir, "idx_magic");
    write_idx_set(dir);
    write_idx_labels(dir, "train-images-idx3-ubyte.gz", 0x801, IDX_TRAIN, -1, 1);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/train-images-idx3-ubyte.gz", dir);
    assert_one_line_error(x->error, file,
                          "wrong magic 0x00000801 (an IDX label file), expected 0x00000803");
    inst_close(x);

    /* wrong magic: garbage */
    make_dir(dir, sizeof dir, "idx_garbage");
    write_idx_set(dir);
    write_file(strcat(strcpy(file, dir), "/t10k-labels-idx1-ubyte"), "hello, world", 12, 0);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file, "wrong magic 0x68656c6c");
    inst_close(x);

    /* a header cut short, an empty file */
    make_dir(dir, sizeof dir, "idx_short_header");
    write_idx_set(dir);
    write_idx_images(dir, "t10k-images-idx3-ubyte", 0x803, IDX_EVAL, IDX_ROWS, IDX_COLS, 10, 0);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/t10k-images-idx3-ubyte", dir);
    assert_one_line_error(x->error, file,
                          "truncated: 10 bytes, shorter than the 16-byte IDX image header");
    inst_close(x);
    write_file(file, "", 0, 0);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file, "truncated: 0 bytes");
    inst_close(x);

    /* bad dims */
    make_dir(dir, sizeof dir, "idx_dims");
    write_idx_set(dir);
    write_idx_images(dir, "t10k-images-idx3-ubyte", 0x803, IDX_EVAL, 0, IDX_COLS, -1, 0);
    idx_section(sec, sizeof sec, dir, "");
    snprintf(file, sizeof file, "%s/t10k-images-idx3-ubyte", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file, "header says images of 0x4");
    inst_close(x);

    /* train and eval of different sizes */
    write_idx_images(dir, "t10k-images-idx3-ubyte", 0x803, IDX_EVAL, IDX_COLS, IDX_ROWS, -1, 0);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file, "images of 4x5, but the training images are 5x4");
    inst_close(x);

    /* label count differs from image count */
    make_dir(dir, sizeof dir, "idx_count");
    write_idx_set(dir);
    write_idx_labels(dir, "train-labels-idx1-ubyte.gz", 0x801, IDX_TRAIN - 1, -1, 1);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/train-labels-idx1-ubyte.gz", dir);
    assert_one_line_error(x->error, file, "39 labels, but");
    assert_one_line_error(x->error, "train-images-idx3-ubyte.gz has 40 images", "");
    inst_close(x);

    /* a label out of range, and num_classes */
    make_dir(dir, sizeof dir, "idx_range");
    write_idx_set(dir);
    write_idx_labels(dir, "t10k-labels-idx1-ubyte", 0x801, IDX_EVAL, 6, 0);
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/t10k-labels-idx1-ubyte", dir);
    assert_one_line_error(x->error, file, "label 10 of item 6 is outside [0, 10)");
    inst_close(x);
    idx_section(sec, sizeof sec, dir, "num_classes: 11");
    if (inst_open(x, sec, 0, 1, 4, 0) != VH_STATUS_OK) fail_msg("%s", x->error);
    assert_int_equal(inst_info(x).num_classes, 11);
    inst_close(x);

    /* missing file */
    make_dir(dir, sizeof dir, "idx_missing");
    write_idx_set(dir);
    idx_section(sec, sizeof sec, dir, "eval_labels: nothing-here.gz");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_IO);
    snprintf(file, sizeof file, "%s/nothing-here.gz", dir);
    assert_one_line_error(x->error, file, "cannot open: No such file or directory");
    inst_close(x);

    /* a bad std is a config error with the recipe's place */
    snprintf(sec, sizeof sec, "{plugin: idx, root: %s, std: 0}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_CONFIG);
    if (!strstr(x->error, "data.yaml:6:") || !strstr(x->error, "data.std: 0 must be positive"))
        fail_msg("expected the recipe's place and the reason, got: %s", x->error);
    inst_free(x);
}

/* Each augmented image is a shifted / mirrored copy of its sample, with the
 * padding's value outside; some are not the plain image. */
static void test_idx_augment(void **state) {
    (void)state;
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "idx_augment");
    write_idx_set(dir);
    const int P = 2;
    idx_section(sec, sizeof sec, dir, "pad_crop: 2, hflip: true, workers: 3");
    inst *x = inst_new(), *y = inst_new(), *z = inst_new();
    if (inst_open(x, sec, 0, 1, 4, 5) != VH_STATUS_OK) fail_msg("%s", x->error);
    pass *t = run_pass(x, VH_SPLIT_TRAIN, 1, -1);
    const float pad = idx_value(0);
    int transformed = 0, flipped = 0;
    for (int64_t j = 0; j < t->samples; j++) {
        const float *img = t->images + j * t->chw;
        int found = 0;
        for (int64_t i = 0; i < IDX_TRAIN && !found; i++) {
            if (idx_label(i) != t->labels[j]) continue;
            for (int dy = -P; dy <= P && !found; dy++)
                for (int dx = -P; dx <= P && !found; dx++)
                    for (int flip = 0; flip < 2 && !found; flip++) {
                        int ok = 1;
                        for (int yy = 0; yy < IDX_ROWS && ok; yy++)
                            for (int xx = 0; xx < IDX_COLS && ok; xx++) {
                                int sy = yy + dy, sx = (flip ? IDX_COLS - 1 - xx : xx) + dx;
                                float want = (sy < 0 || sy >= IDX_ROWS || sx < 0 || sx >= IDX_COLS)
                                                 ? pad
                                                 : idx_value(idx_pixel(i, sy * IDX_COLS + sx));
                                ok = fabsf(img[yy * IDX_COLS + xx] - want) < 1e-6f;
                            }
                        if (ok) {
                            found = 1;
                            transformed += dy != 0 || dx != 0 || flip;
                            flipped += flip;
                        }
                    }
        }
        if (!found) fail_msg("train image %lld is no crop/flip of any sample", (long long)j);
    }
    assert_true(transformed > t->samples / 2);
    assert_true(flipped > 0);
    /* the same with 0 workers, and again: augmentation does not depend on threads */
    idx_section(sec, sizeof sec, dir, "pad_crop: 2, hflip: true, workers: 0");
    if (inst_open(y, sec, 0, 1, 4, 5) != VH_STATUS_OK) fail_msg("%s", y->error);
    pass *u = run_pass(y, VH_SPLIT_TRAIN, 1, -1);
    assert_passes_equal(t, u);
    /* eval is never augmented */
    pass *e = run_pass(x, VH_SPLIT_EVAL, 1, -1);
    for (int64_t i = 0; i < IDX_EVAL; i++) check_idx_image(e->images + i * e->chw, i);
    /* another epoch draws other crops */
    idx_section(sec, sizeof sec, dir, "pad_crop: 2, hflip: true, workers: 2");
    if (inst_open(z, sec, 0, 1, 4, 5) != VH_STATUS_OK) fail_msg("%s", z->error);
    pass *v = run_pass(z, VH_SPLIT_TRAIN, 2, -1);
    assert_memory_not_equal(t->images, v->images, (size_t)(t->samples * t->chw) * sizeof(float));
    pass_free(t);
    pass_free(u);
    pass_free(v);
    pass_free(e);
    inst_free(x);
    inst_free(y);
    inst_free(z);
}

/* What the idx plugin's training image of sample i must be under the
 * documented draws (vh_data_pass.h: from vh_sampler_sample_key, dy then dx
 * uniform in [-pad, pad], then the mirror bit): built the long way, the image
 * padded with byte 0, the rows x cols window at (pad + dy, pad + dx), then
 * mirrored. Returns the window's offset and the mirror in *shift and *flip. */
enum { IDX_MAX_PAD = 4 };

static void idx_reference(int64_t i, uint64_t key, int pad, int hflip, float *out, int *shift,
                          int *flip) {
    enum { PR = IDX_ROWS + 2 * IDX_MAX_PAD, PC = IDX_COLS + 2 * IDX_MAX_PAD };
    assert_true(pad <= IDX_MAX_PAD);
    uint8_t padded[PR][PC];
    memset(padded, 0, sizeof padded);
    for (int y = 0; y < IDX_ROWS; y++)
        for (int x = 0; x < IDX_COLS; x++)
            padded[pad + y][pad + x] = idx_pixel(i, y * IDX_COLS + x);
    uint64_t rng = key;
    int dy = 0, dx = 0;
    if (pad > 0) {
        dy = (int)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * pad + 1)) - pad;
        dx = (int)(vh_sampler_rng_next(&rng) % (uint64_t)(2 * pad + 1)) - pad;
    }
    *flip = hflip ? (int)(vh_sampler_rng_next(&rng) & 1) : 0;
    *shift = dy != 0 || dx != 0;
    for (int y = 0; y < IDX_ROWS; y++)
        for (int x = 0; x < IDX_COLS; x++) {
            uint8_t v = padded[pad + dy + y][pad + dx + x];
            out[y * IDX_COLS + (*flip ? IDX_COLS - 1 - x : x)] = idx_value(v);
        }
}

/* Training augmentation against idx_reference, exactly: off (the default,
 * and said explicitly) is the plain conversion; hflip alone gives each image
 * as it is or mirrored, both in a pass; pad_crop gives shifted windows of the
 * padded image. The same bytes with 0 and 2 workers, and after a state saved
 * mid-pass by one and loaded by the other. Eval stays the plain conversion. */
static void test_idx_augment_reference(void **state) {
    (void)state;
    char dir[256], sec[1024], extra[256];
    make_dir(dir, sizeof dir, "idx_augment_ref");
    write_idx_set(dir);
    enum { B = 4, EPOCH = 2, SEED = 9, HEAD = 3, PIX = IDX_ROWS * IDX_COLS };
    static const struct {
        const char *keys;
        int pad, hflip;
    } cases[] = {{"", 0, 0},
                 {"pad_crop: 0, hflip: false, ", 0, 0},
                 {"hflip: true, ", 0, 1},
                 {"pad_crop: 3, ", 3, 0},
                 {"pad_crop: 2, hflip: true, ", 2, 1},
                 {"pad_crop: 4, hflip: true, ", 4, 1}};
    fake_host h;
    fake_init(&h);
    vh_sampler *s = sampler_new(&h, IDX_TRAIN, 0, 1, B, VH_SPLIT_TRAIN, SEED);
    assert_non_null(s);
    assert_int_equal(vh_sampler_start(s, EPOCH), VH_STATUS_OK);
    const int64_t n = vh_sampler_batches(s) * B; /* drop_last: 10 batches of 4 */
    float *want = malloc((size_t)(n * PIX) * sizeof(float));
    int32_t *want_labels = malloc((size_t)n * sizeof(int32_t));
    assert_non_null(want);
    assert_non_null(want_labels);
    size_t bytes = 0;
    void *blob = NULL;

    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int shifted = 0, mirrored = 0, plain = 0;
        for (int64_t b = 0; b < vh_sampler_batches(s); b++) {
            const int64_t *idx;
            int64_t count;
            assert_int_equal(vh_sampler_batch(s, b, &idx, &count), VH_STATUS_OK);
            for (int64_t j = 0; j < count; j++) {
                int64_t i = idx[j], k = b * B + j;
                int shift, flip;
                idx_reference(i, vh_sampler_sample_key(s, i), cases[c].pad, cases[c].hflip,
                              want + k * PIX, &shift, &flip);
                want_labels[k] = idx_label(i);
                shifted += shift;
                mirrored += flip;
                plain += !shift && !flip;
            }
        }
        if (!cases[c].pad && !cases[c].hflip) assert_int_equal(plain, n);
        if (cases[c].hflip) assert_true(mirrored > 0 && mirrored < n);
        if (cases[c].pad) assert_true(shifted > n / 2);
        if (!cases[c].pad) assert_int_equal(shifted, 0);

        pass *runs[2];
        inst *x[2];
        for (int w = 0; w < 2; w++) {
            snprintf(extra, sizeof extra, "%sworkers: %d", cases[c].keys, 2 * w);
            idx_section(sec, sizeof sec, dir, extra);
            x[w] = inst_new();
            if (inst_open(x[w], sec, 0, 1, B, SEED) != VH_STATUS_OK) fail_msg("%s", x[w]->error);
            runs[w] = run_pass(x[w], VH_SPLIT_TRAIN, EPOCH, -1);
            assert_int_equal(runs[w]->samples, n);
            assert_memory_equal(runs[w]->labels, want_labels, (size_t)n * sizeof(int32_t));
            if (memcmp(runs[w]->images, want, (size_t)(n * PIX) * sizeof(float)) != 0)
                fail_msg("case '%s' workers %d: training images differ from the reference",
                         cases[c].keys, 2 * w);
            /* eval: the plain conversion, every sample in order */
            pass *e = run_pass(x[w], VH_SPLIT_EVAL, EPOCH, -1);
            assert_int_equal(e->samples, IDX_EVAL);
            for (int64_t i = 0; i < IDX_EVAL; i++)
                for (int64_t k = 0; k < PIX; k++)
                    assert_true(e->images[i * PIX + k] == idx_value(idx_pixel(i, k)));
            pass_free(e);
        }
        assert_passes_equal(runs[0], runs[1]);

        /* saved after HEAD batches with 2 workers, resumed with 0, and the reverse */
        if (!blob) {
            assert_int_equal(x[0]->vt->state_size(x[0]->self, &bytes), VH_STATUS_OK);
            blob = malloc(bytes);
            assert_non_null(blob);
        }
        for (int w = 0; w < 2; w++) {
            inst *from = x[1 - w], *to = x[w];
            pass *head = run_pass(from, VH_SPLIT_TRAIN, EPOCH, HEAD);
            assert_int_equal(from->vt->state_save(from->self, blob, bytes), VH_STATUS_OK);
            pass *other = run_pass(to, VH_SPLIT_TRAIN, EPOCH + 1, 1); /* busy elsewhere */
            assert_int_equal(to->vt->state_load(to->self, blob, bytes), VH_STATUS_OK);
            pass *rest = run_pass(to, VH_SPLIT_TRAIN, -1, -1);
            assert_int_equal(head->samples + rest->samples, n);
            assert_memory_equal(head->images, want, (size_t)(head->samples * PIX) * sizeof(float));
            assert_memory_equal(rest->images, want + head->samples * PIX,
                                (size_t)(rest->samples * PIX) * sizeof(float));
            assert_memory_equal(rest->labels, want_labels + head->samples,
                                (size_t)rest->samples * sizeof(int32_t));
            pass_free(head);
            pass_free(other);
            pass_free(rest);
        }
        for (int w = 0; w < 2; w++) {
            pass_free(runs[w]);
            inst_free(x[w]);
        }
    }
    free(blob);
    free(want);
    free(want_labels);
    vh_sampler_free(s);
    assert_int_equal(atomic_load(&h.live), 0);
}

/* Same seed same order; another epoch or seed another; workers do not matter. */
static void test_order_deterministic(void **state) {
    (void)state;
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "idx_order");
    write_idx_set(dir);
    inst *a = inst_new(), *b = inst_new(), *c = inst_new();
    idx_section(sec, sizeof sec, dir, "workers: 4, prefetch: 2");
    if (inst_open(a, sec, 0, 1, 3, 77) != VH_STATUS_OK) fail_msg("%s", a->error);
    idx_section(sec, sizeof sec, dir, "workers: 0");
    if (inst_open(b, sec, 0, 1, 3, 77) != VH_STATUS_OK) fail_msg("%s", b->error);
    if (inst_open(c, sec, 0, 1, 3, 78) != VH_STATUS_OK) fail_msg("%s", c->error);
    pass *a0 = run_pass(a, VH_SPLIT_TRAIN, 0, -1), *b0 = run_pass(b, VH_SPLIT_TRAIN, 0, -1);
    pass *a1 = run_pass(a, VH_SPLIT_TRAIN, 1, -1), *c0 = run_pass(c, VH_SPLIT_TRAIN, 0, -1);
    assert_int_equal(a0->batches, IDX_TRAIN / 3);
    assert_passes_equal(a0, b0);
    size_t n = (size_t)(a0->samples * a0->chw) * sizeof(float);
    assert_memory_not_equal(a0->images, a1->images, n);
    assert_memory_not_equal(a0->images, c0->images, n);
    /* a pass abandoned midway and restarted gives the same batches */
    pass *part = run_pass(a, VH_SPLIT_TRAIN, 0, 5);
    pass_free(part);
    pass *again = run_pass(a, VH_SPLIT_TRAIN, 0, -1);
    assert_passes_equal(a0, again);
    pass_free(again);
    pass_free(a0);
    pass_free(b0);
    pass_free(a1);
    pass_free(c0);
    inst_free(a);
    inst_free(b);
    inst_free(c);
}

/* World 3: disjoint train shares, equal batch counts, eval covers each once. */
static void test_rank_split(void **state) {
    (void)state;
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "idx_ranks");
    write_idx_set(dir);
    idx_section(sec, sizeof sec, dir, "workers: 2");
    enum { W = 3 };
    int train_seen[IDX_TRAIN] = {0}, eval_seen[IDX_EVAL] = {0};
    int64_t train_batches = -1, eval_batches = -1;
    for (int r = 0; r < W; r++) {
        inst *x = inst_new();
        if (inst_open(x, sec, r, W, 2, 3) != VH_STATUS_OK) fail_msg("%s", x->error);
        pass *t = run_pass(x, VH_SPLIT_TRAIN, 4, -1), *e = run_pass(x, VH_SPLIT_EVAL, 4, -1);
        /* 40 / 3 = 13 per rank: 6 full batches of 2 */
        assert_int_equal(t->batches, 6);
        if (train_batches < 0) train_batches = t->batches, eval_batches = e->batches;
        assert_int_equal(t->batches, train_batches);
        assert_int_equal(e->batches, eval_batches);
        for (int64_t k = 0; k < t->batches; k++) assert_int_equal(t->sizes[k], 2);
        for (int64_t j = 0; j < t->samples; j++)
            train_seen[idx_sample_of(t->images + j * t->chw)]++;
        for (int64_t j = 0; j < e->samples; j++) {
            int64_t i = idx_sample_of(e->images + j * e->chw);
            assert_int_equal(i % W, r);
            eval_seen[i]++;
        }
        pass_free(t);
        pass_free(e);
        inst_free(x);
    }
    int total = 0;
    for (int i = 0; i < IDX_TRAIN; i++) {
        assert_true(train_seen[i] <= 1);
        total += train_seen[i];
    }
    assert_int_equal(total, W * 12);
    for (int i = 0; i < IDX_EVAL; i++) assert_int_equal(eval_seen[i], 1);
    assert_int_equal(eval_batches, 2); /* shares 4, 4, 3 in batches of 2 */
}

/* A state saved after k batches resumes at batch k, in a fresh instance; an
 * eval pass in the middle of a training pass, between state_save and
 * state_load as the host runs it (vh_data.h), leaves the training pass to go
 * on where it stood. */
static void test_state_resume(void **state) {
    (void)state;
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "idx_state");
    write_idx_set(dir);
    idx_section(sec, sizeof sec, dir, "workers: 2, pad_crop: 1, hflip: true");
    inst *a = inst_new(), *b = inst_new(), *ref = inst_new();
    if (inst_open(a, sec, 1, 2, 3, 21) != VH_STATUS_OK) fail_msg("%s", a->error);
    if (inst_open(b, sec, 1, 2, 3, 21) != VH_STATUS_OK) fail_msg("%s", b->error);
    if (inst_open(ref, sec, 1, 2, 3, 21) != VH_STATUS_OK) fail_msg("%s", ref->error);
    pass *whole = run_pass(ref, VH_SPLIT_TRAIN, 3, -1); /* 20 per rank: 6 batches of 3 */
    assert_int_equal(whole->batches, 6);
    size_t bytes = 0;
    assert_int_equal(a->vt->state_size(a->self, &bytes), VH_STATUS_OK);
    void *blob = malloc(bytes), *blob2 = malloc(bytes);

    pass *head = run_pass(a, VH_SPLIT_TRAIN, 3, 4);
    assert_int_equal(a->vt->state_save(a->self, blob, bytes), VH_STATUS_OK);
    /* a whole eval pass in between; it ends the training pass's turn */
    pass *ev = run_pass(a, VH_SPLIT_EVAL, 0, -1);
    assert_int_equal(ev->samples, 5); /* rank 1 of 2 over 11 */
    pass *after = run_pass(a, VH_SPLIT_TRAIN, -1, -1);
    assert_int_equal(after->batches, 0);
    pass_free(after);
    /* the host loads the state back, and next goes on with the training pass */
    assert_int_equal(a->vt->state_load(a->self, blob, bytes), VH_STATUS_OK);
    pass *rest = run_pass(a, VH_SPLIT_TRAIN, -1, -1);
    assert_int_equal(head->batches + rest->batches, 6);
    assert_memory_equal(rest->labels, whole->labels + head->samples,
                        (size_t)rest->samples * sizeof(int32_t));
    assert_memory_equal(rest->images, whole->images + head->samples * whole->chw,
                        (size_t)(rest->samples * whole->chw) * sizeof(float));

    /* a fresh instance, busy elsewhere, resumes at batch 4 */
    pass *other = run_pass(b, VH_SPLIT_EVAL, 0, 1);
    pass_free(other);
    assert_int_equal(b->vt->state_load(b->self, blob, bytes), VH_STATUS_OK);
    pass *resumed = run_pass(b, VH_SPLIT_TRAIN, -1, -1);
    assert_passes_equal(rest, resumed);

    /* saved at the end of the pass: resumes at its end */
    assert_int_equal(b->vt->state_save(b->self, blob2, bytes), VH_STATUS_OK);
    assert_int_equal(a->vt->state_load(a->self, blob2, bytes), VH_STATUS_OK);
    pass *none = run_pass(a, VH_SPLIT_TRAIN, -1, -1);
    assert_int_equal(none->batches, 0);
    pass_free(none);

    /* a state of another seed is refused with a message; so is garbage
     * (another rank's is that rank's point of the pass: test_sampler_state_other_world) */
    inst *c = inst_new();
    if (inst_open(c, sec, 1, 2, 3, 22) != VH_STATUS_OK) fail_msg("%s", c->error);
    assert_int_equal(c->vt->state_load(c->self, blob, bytes), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(c->run.hosts[VH_ROLE_DATA].error, "another setup"));
    ((unsigned char *)blob)[0] ^= 0xff;
    assert_int_equal(b->vt->state_load(b->self, blob, bytes), VH_STATUS_ERR_FORMAT);
    assert_int_equal(b->vt->state_load(b->self, blob, bytes - 1), VH_STATUS_ERR_FORMAT);

    free(blob);
    free(blob2);
    pass_free(whole);
    pass_free(head);
    pass_free(ev);
    pass_free(rest);
    pass_free(resumed);
    inst_free(a);
    inst_free(b);
    inst_free(c);
    inst_free(ref);
}

/* The same in synthetic and cifar: an eval pass inside a training pass, as
 * the host runs it (state_save, the eval pass, state_load). */
static void check_eval_inside_train(const char *sec, int64_t batch) {
    inst *a = inst_new(), *ref = inst_new();
    if (inst_open(a, sec, 0, 1, batch, 4) != VH_STATUS_OK) fail_msg("%s", a->error);
    if (inst_open(ref, sec, 0, 1, batch, 4) != VH_STATUS_OK) fail_msg("%s", ref->error);
    pass *whole = run_pass(ref, VH_SPLIT_TRAIN, 1, -1);
    pass *head = run_pass(a, VH_SPLIT_TRAIN, 1, 2);
    size_t bytes = 0;
    assert_int_equal(a->vt->state_size(a->self, &bytes), VH_STATUS_OK);
    void *blob = malloc(bytes);
    assert_int_equal(a->vt->state_save(a->self, blob, bytes), VH_STATUS_OK);
    pass *ev = run_pass(a, VH_SPLIT_EVAL, 0, -1);
    assert_int_equal(a->vt->state_load(a->self, blob, bytes), VH_STATUS_OK);
    pass *rest = run_pass(a, VH_SPLIT_TRAIN, -1, -1);
    assert_int_equal(head->batches + rest->batches, whole->batches);
    assert_memory_equal(rest->images, whole->images + head->samples * whole->chw,
                        (size_t)(rest->samples * whole->chw) * sizeof(float));
    free(blob);
    pass_free(whole);
    pass_free(head);
    pass_free(ev);
    pass_free(rest);
    inst_free(a);
    inst_free(ref);
}

/* ---- cifar -------------------------------------------------------------------- */

static const double c10_mean[3] = {0.4914, 0.4822, 0.4465}, c10_std[3] = {0.2470, 0.2435, 0.2616};
static const double c100_mean[3] = {0.5071, 0.4865, 0.4409},
                    c100_std[3] = {0.2673, 0.2564, 0.2762};

static void check_cifar_image(const float *img, int64_t i, const double *mean, const double *std) {
    for (int64_t k = 0; k < 3072; k++) {
        int c = (int)(k / 1024);
        assert_float_equal(img[k], (cifar_pixel(i, k) / 255.0 - mean[c]) / std[c], 2e-5);
    }
}

static void test_cifar10(void **state) {
    (void)state;
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "cifar10");
    write_cifar10_set(dir);
    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s}", dir);
    inst *x = inst_new();
    if (inst_open(x, sec, 0, 1, 4, 1) != VH_STATUS_OK) fail_msg("%s", x->error);
    vh_data_info info = inst_info(x);
    assert_int_equal(info.channels, 3);
    assert_int_equal(info.height, 32);
    assert_int_equal(info.width, 32);
    assert_int_equal(info.num_classes, 10);
    assert_int_equal(info.train_size, 5 * CIFAR_PER_FILE);
    assert_int_equal(info.eval_size, CIFAR_EVAL);
    pass *e = run_pass(x, VH_SPLIT_EVAL, 0, -1);
    assert_int_equal(e->batches, 2);
    for (int64_t i = 0; i < CIFAR_EVAL; i++) {
        check_cifar_image(e->images + i * 3072, 1000 + i, c10_mean, c10_std);
        assert_int_equal(e->labels[i], (1000 + i) % 10);
    }
    /* training augments by default (pad 4 + flip): labels still match and the
     * pass covers 12 of the 15 samples in full batches */
    pass *t = run_pass(x, VH_SPLIT_TRAIN, 0, -1);
    assert_int_equal(t->batches, 3);
    for (int64_t j = 0; j < t->samples; j++) assert_true(t->labels[j] >= 0 && t->labels[j] < 10);
    pass_free(t);
    pass_free(e);
    inst_close(x);
    /* no augmentation, own statistics: exact values, samples from all five files */
    snprintf(sec, sizeof sec,
             "{plugin: cifar, root: %s, pad_crop: 0, hflip: false, mean: \"0.5, 0.4,0.3\", "
             "std: 0.25}",
             dir);
    if (inst_open(x, sec, 0, 1, 5, 1) != VH_STATUS_OK) fail_msg("%s", x->error);
    t = run_pass(x, VH_SPLIT_TRAIN, 0, -1);
    const double mean[3] = {0.5, 0.4, 0.3}, std[3] = {0.25, 0.25, 0.25};
    int seen[15] = {0};
    for (int64_t j = 0; j < t->samples; j++) {
        /* which sample: pixel 0 is (i * 31) % 256, unique for i < 15 */
        int p0 = (int)lround((t->images[j * 3072] * 0.25 + 0.5) * 255.0);
        int64_t i = -1;
        for (int64_t q = 0; q < 15; q++)
            if (cifar_pixel(q, 0) == p0) i = q;
        assert_true(i >= 0);
        check_cifar_image(t->images + j * 3072, i, mean, std);
        assert_int_equal(t->labels[j], i % 10);
        seen[i]++;
    }
    for (int i = 0; i < 15; i++) assert_int_equal(seen[i], 1);
    pass_free(t);
    inst_free(x);
    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s, workers: 2}", dir);
    check_eval_inside_train(sec, 2);
}

static void test_cifar100(void **state) {
    (void)state;
    char dir[256], sec[1024];
    make_dir(dir, sizeof dir, "cifar100");
    write_cifar(dir, "train.bin", 1, 0, 30, 0, -1);
    write_cifar(dir, "test.bin", 1, 500, 9, 0, -1);
    snprintf(sec, sizeof sec, "{plugin: cifar, variant: cifar100, root: %s, workers: 3}", dir);
    inst *x = inst_new();
    if (inst_open(x, sec, 0, 1, 4, 1) != VH_STATUS_OK) fail_msg("%s", x->error);
    vh_data_info info = inst_info(x);
    assert_int_equal(info.num_classes, 100);
    assert_int_equal(info.train_size, 30);
    assert_int_equal(info.eval_size, 9);
    pass *e = run_pass(x, VH_SPLIT_EVAL, 0, -1);
    for (int64_t i = 0; i < 9; i++) {
        check_cifar_image(e->images + i * 3072, 500 + i, c100_mean, c100_std);
        assert_int_equal(e->labels[i], (500 + i) % 100); /* the fine label */
    }
    pass_free(e);
    inst_close(x);
    snprintf(sec, sizeof sec, "{plugin: cifar, variant: cifar100, root: %s, labels: coarse}", dir);
    if (inst_open(x, sec, 0, 1, 4, 1) != VH_STATUS_OK) fail_msg("%s", x->error);
    assert_int_equal(inst_info(x).num_classes, 20);
    e = run_pass(x, VH_SPLIT_EVAL, 0, -1);
    for (int64_t i = 0; i < 9; i++) assert_int_equal(e->labels[i], (500 + i) % 20);
    pass_free(e);
    inst_free(x);
}

static void test_cifar_errors(void **state) {
    (void)state;
    char dir[256], sec[1024], file[512];
    inst *x = inst_new();

    make_dir(dir, sizeof dir, "cifar_size");
    write_cifar10_set(dir);
    write_cifar(dir, "data_batch_3.bin", 0, 6, CIFAR_PER_FILE, 1, -1);
    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/data_batch_3.bin", dir);
    assert_one_line_error(x->error, file,
                          "9220 bytes is not a whole number of 3073-byte CIFAR-10 records "
                          "(1 label byte + 3072 pixel bytes)");
    inst_close(x);

    /* CIFAR-10 files read as CIFAR-100: the record size it expected, and a hint */
    make_dir(dir, sizeof dir, "cifar_variant");
    write_cifar(dir, "train.bin", 0, 0, 4, 0, -1);
    write_cifar(dir, "test.bin", 0, 0, 2, 0, -1);
    snprintf(sec, sizeof sec, "{plugin: cifar, variant: cifar100, root: %s}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 2, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/train.bin", dir);
    assert_one_line_error(x->error, file, "3074-byte CIFAR-100 records");
    assert_one_line_error(x->error, "variant: cifar10?", "");
    inst_close(x);

    make_dir(dir, sizeof dir, "cifar_label");
    write_cifar10_set(dir);
    write_cifar(dir, "test_batch.bin", 0, 0, CIFAR_EVAL, 0, 2);
    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    snprintf(file, sizeof file, "%s/test_batch.bin", dir);
    assert_one_line_error(x->error, file, "record 2: label 200 is outside [0, 10)");
    inst_close(x);

    make_dir(dir, sizeof dir, "cifar_empty");
    write_cifar10_set(dir);
    snprintf(file, sizeof file, "%s/data_batch_5.bin", dir);
    write_file(file, "", 0, 0);
    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file, "0 bytes is not a whole number");
    inst_close(x);
    assert_int_equal(unlink(file), 0);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_IO);
    assert_one_line_error(x->error, file, "cannot open: No such file or directory");
    inst_close(x);

    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s, mean: \"0.5,0.5\"}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(x->error, "data.mean: '0.5,0.5' has 2 numbers; give 1 or 3"));
    inst_close(x);
    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s, std: \"0.5,0,0.5\"}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(x->error, "data.std: '0.5,0,0.5' is not one or three positive numbers"));
    inst_free(x);
}

/* ---- synthetic ---------------------------------------------------------------- */

static void test_synthetic(void **state) {
    (void)state;
    const char *sec = "{plugin: synthetic, channels: 2, height: 5, width: 7, num_classes: 6, "
                      "train_size: 50, eval_size: 13, pool_size: 8, workers: 2}";
    inst *a = inst_new(), *b = inst_new();
    if (inst_open(a, sec, 0, 1, 4, 9) != VH_STATUS_OK) fail_msg("%s", a->error);
    if (inst_open(b, sec, 0, 1, 4, 9) != VH_STATUS_OK) fail_msg("%s", b->error);
    vh_data_info info = inst_info(a);
    assert_int_equal(info.channels, 2);
    assert_int_equal(info.height, 5);
    assert_int_equal(info.width, 7);
    assert_int_equal(info.num_classes, 6);
    assert_int_equal(info.train_size, 50);
    assert_int_equal(info.eval_size, 13);
    pass *t = run_pass(a, VH_SPLIT_TRAIN, 0, -1), *u = run_pass(b, VH_SPLIT_TRAIN, 0, -1);
    assert_int_equal(t->batches, 12);
    assert_passes_equal(t, u);
    double sum = 0, sq = 0;
    for (int64_t k = 0; k < t->samples * t->chw; k++) {
        assert_true(fabsf(t->images[k]) <= 1.7321f);
        sum += t->images[k];
        sq += (double)t->images[k] * t->images[k];
    }
    double n = (double)(t->samples * t->chw);
    assert_true(fabs(sum / n) < 0.2 && fabs(sq / n - 1.0) < 0.25); /* about N(0,1)-scaled */
    for (int64_t j = 0; j < t->samples; j++) assert_true(t->labels[j] >= 0 && t->labels[j] < 6);
    pass *v = run_pass(a, VH_SPLIT_TRAIN, 1, -1);
    assert_memory_not_equal(t->labels, v->labels, (size_t)t->samples * sizeof(int32_t));
    pass *e = run_pass(a, VH_SPLIT_EVAL, 0, -1);
    assert_int_equal(e->samples, 13);
    assert_int_equal(e->batches, 4);
    pass_free(t);
    pass_free(u);
    pass_free(v);
    pass_free(e);
    inst_close(a);
    /* image_size alone; too few samples for a batch: a clear error */
    assert_int_equal(inst_open(a, "{plugin: synthetic, image_size: 3, train_size: 5}", 0, 2, 4, 0),
                     VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(a->error, "fewer than one batch of 4"));
    inst_close(a);
    if (inst_open(a, "{plugin: synthetic, image_size: 3, workers: 0}", 0, 1, 4, 0) != VH_STATUS_OK)
        fail_msg("%s", a->error);
    info = inst_info(a);
    assert_int_equal(info.height * info.width * info.channels, 27);
    pass *w = run_pass(a, VH_SPLIT_TRAIN, 0, 3);
    assert_int_equal(w->batches, 3);
    pass_free(w);
    inst_free(a);
    inst_free(b);
    check_eval_inside_train("{plugin: synthetic, image_size: 4, train_size: 30, eval_size: 7}", 4);
}

/* ---- the real Fashion-MNIST --------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_fashion_mnist(void **state) {
    (void)state;
    struct stat sb;
    if (stat(FASHION_DIR, &sb) != 0) {
        printf("[   SKIP   ] %s is absent: not reading the real Fashion-MNIST\n", FASHION_DIR);
        skip();
    }
    inst *x = inst_new();
    for (int workers = 0; workers <= 2; workers++) {
        char sec[128];
        snprintf(sec, sizeof sec, "{plugin: idx, workers: %d}", workers);
        double t0 = now_s();
        if (inst_open(x, sec, 0, 1, 128, 0) != VH_STATUS_OK) fail_msg("%s", x->error);
        double t1 = now_s();
        vh_data_info info = inst_info(x);
        assert_int_equal(info.train_size, 60000);
        assert_int_equal(info.eval_size, 10000);
        assert_int_equal(info.channels, 1);
        assert_int_equal(info.height, 28);
        assert_int_equal(info.width, 28);
        assert_int_equal(info.num_classes, 10);
        /* an epoch of batches of 128, timed */
        assert_int_equal(x->vt->start_epoch(x->self, VH_SPLIT_TRAIN, 0), VH_STATUS_OK);
        double t2 = now_s(), sum = 0;
        int64_t batches = 0, counts[10] = {0};
        for (;;) {
            vh_batch b;
            int has;
            assert_int_equal(x->vt->next(x->self, &b, &has), VH_STATUS_OK);
            if (!has) break;
            const float *img = b.images.data;
            const int32_t *lab = b.labels.data;
            sum += img[0] + img[b.size * 784 - 1];
            for (int64_t j = 0; j < b.size; j++) counts[lab[j]]++;
            batches++;
        }
        double t3 = now_s();
        assert_int_equal(batches, 60000 / 128);
        for (int c = 0; c < 10; c++) assert_true(counts[c] > 5500 && counts[c] < 6500);
        assert_true(isfinite(sum));
        /* eval: every image once; the mean pixel is about the documented 0.2860 */
        pass *e = run_pass(x, VH_SPLIT_EVAL, 0, -1);
        assert_int_equal(e->samples, 10000);
        double m = 0;
        for (int64_t k = 0; k < e->samples * 784; k++) m += e->images[k] * 0.3530 + 0.2860;
        m /= (double)(e->samples * 784);
        assert_true(fabs(m - 0.2860) < 0.01);
        pass_free(e);
        printf("[   INFO   ] Fashion-MNIST: load %.2f s; train epoch, batch 128, workers %d: "
               "%.0f batches/s (%.0f images/s)\n",
               t1 - t0, workers, (double)batches / (t3 - t2),
               (double)batches * 128 / (t3 - t2));
        inst_close(x);
    }
    free(x);
}

/* ---- main ----------------------------------------------------------------------- */

/* Messages that used to mislead: an IDX count past 2^31-1 says why it is
 * refused; gzip data followed by other bytes is refused (gzread skips
 * them); a folder where a CIFAR batch file should be is called a folder. */
static void test_data_messages(void **state) {
    (void)state;
    char dir[256], sec[1024], file[512];
    inst *x = inst_new();

    make_dir(dir, sizeof dir, "idx_huge_count");
    write_idx_set(dir);
    { /* a label file whose header claims 2^31 labels */
        unsigned char b[8];
        put_be32(b, 0x801);
        put_be32(b + 4, 0x80000000u);
        snprintf(file, sizeof file, "%s/t10k-labels-idx1-ubyte", dir);
        write_file(file, b, sizeof b, 0);
    }
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file,
                          "header says 2147483648 labels, more than the 2147483647 a split may "
                          "hold (sample indices are 32-bit");
    inst_close(x);

    make_dir(dir, sizeof dir, "idx_gz_trailing");
    write_idx_set(dir);
    snprintf(file, sizeof file, "%s/train-labels-idx1-ubyte.gz", dir);
    {
        FILE *f = fopen(file, "ab");
        assert_non_null(f);
        fputs("garbage after the stream", f);
        fclose(f);
    }
    idx_section(sec, sizeof sec, dir, "");
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_FORMAT);
    assert_one_line_error(x->error, file, "24 bytes after the gzip data");
    inst_close(x);
    { /* two gzip members one after the other are one valid file */
        make_dir(dir, sizeof dir, "idx_gz_members");
        write_idx_set(dir);
        snprintf(file, sizeof file, "%s/train-labels-idx1-ubyte.gz", dir);
        unsigned char b[8 + IDX_TRAIN];
        put_be32(b, 0x801);
        put_be32(b + 4, IDX_TRAIN);
        for (int i = 0; i < IDX_TRAIN; i++) b[8 + i] = idx_label(i);
        gzFile g = gzopen(file, "wb");
        assert_non_null(g);
        gzwrite(g, b, 20);
        gzclose(g);
        g = gzopen(file, "ab");
        assert_non_null(g);
        gzwrite(g, b + 20, sizeof b - 20);
        gzclose(g);
        idx_section(sec, sizeof sec, dir, "");
        if (inst_open(x, sec, 0, 1, 4, 0) != VH_STATUS_OK) fail_msg("%s", x->error);
        inst_close(x);
    }

    make_dir(dir, sizeof dir, "cifar_dir");
    write_cifar10_set(dir);
    snprintf(file, sizeof file, "%s/data_batch_2.bin", dir);
    assert_int_equal(remove(file), 0);
    assert_int_equal(mkdir(file, 0700), 0);
    snprintf(sec, sizeof sec, "{plugin: cifar, root: %s}", dir);
    assert_int_equal(inst_open(x, sec, 0, 1, 4, 0), VH_STATUS_ERR_IO);
    assert_one_line_error(x->error, file, "is a directory, not a CIFAR-10 batch file");
    assert_null(strstr(x->error, "bytes is not a whole number"));
    inst_close(x);
    inst_free(x);
}

static int group_setup(void **state) {
    (void)state;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/vh_data_test_XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_train_split),
        cmocka_unit_test(test_sampler_shuffle),
        cmocka_unit_test(test_sampler_eval_rule),
        cmocka_unit_test(test_sampler_errors),
        cmocka_unit_test(test_sampler_state),
        cmocka_unit_test(test_sampler_state_other_world),
        cmocka_unit_test(test_prefetch_order),
        cmocka_unit_test(test_prefetch_inline_and_empty),
        cmocka_unit_test(test_prefetch_error),
        cmocka_unit_test(test_prefetch_shutdown),
        cmocka_unit_test(test_data_pass),
        cmocka_unit_test(test_data_pass_fill_u8),
        cmocka_unit_test(test_idx_reads),
        cmocka_unit_test(test_idx_defaults_documented),
        cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_idx_augment),
        cmocka_unit_test(test_idx_augment_reference),
        cmocka_unit_test(test_order_deterministic),
        cmocka_unit_test(test_rank_split),
        cmocka_unit_test(test_state_resume),
        cmocka_unit_test(test_cifar10),
        cmocka_unit_test(test_cifar100),
        cmocka_unit_test(test_cifar_errors),
        cmocka_unit_test(test_data_messages),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_fashion_mnist),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
