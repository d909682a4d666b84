/* sampler.c - the per-epoch sample order of one rank (see vh_sampler.h). */
#include "vithost/vh_sampler.h"
#include "vithost/vh_random.h"

#include <string.h>

struct vh_sampler {
    vh_host *host;
    int64_t size, batch_size;
    int32_t rank, world;
    vh_split split;
    uint64_t seed;

    int64_t local;   /* samples of one pass on this rank */
    int64_t batches; /* batches of one pass, the same on every rank */
    int eval_short;  /* eval: batch batches-2 gives one sample to the last */

    int64_t *perm;  /* train: the epoch's permutation of [0, size) */
    int64_t *order; /* this rank's samples in pass order, `local` of them */
    int64_t epoch;  /* -1: not started */
};

/* Streams of the counter-based PRNG, so that draws of distinct purposes
 * never share keys. */
enum { STREAM_SHUFFLE = 0x53, STREAM_SAMPLE = 0x41 };


/* The key of (seed, stream, split, epoch). */
static uint64_t key_of(uint64_t seed, uint64_t stream, vh_split split, int64_t epoch) {
    uint64_t k = vh_splitmix64(seed ^ (stream << 56));
    k = vh_splitmix64(k ^ (uint64_t)split);
    return vh_splitmix64(k ^ (uint64_t)epoch);
}

/* Uniform in [0, n), n >= 1, unbiased: draw c of the stream `key`, with
 * rejection of the 2^64 mod n lowest values. */
static uint64_t draw_below(uint64_t key, uint64_t *counter, uint64_t n) {
    uint64_t reject = (0 - n) % n; /* 2^64 mod n */
    for (;;) {
        uint64_t r = vh_splitmix64(key ^ vh_splitmix64((*counter)++));
        if (r >= reject) return r % n;
    }
}

static vh_status check_setup(vh_host *host, const vh_sampler_setup *setup) {
    if (setup->world_size < 1 || setup->rank < 0 || setup->rank >= setup->world_size)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sampler: rank %d of world %d is invalid", (int)setup->rank,
                               (int)setup->world_size);
    if (setup->batch_size < 1)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sampler: batch size %lld must be >= 1",
                               (long long)setup->batch_size);
    if (setup->split != VH_SPLIT_TRAIN && setup->split != VH_SPLIT_EVAL)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "sampler: unknown split %d",
                               (int)setup->split);
    if (setup->size < 1 || (uint64_t)setup->size > SIZE_MAX / sizeof(int64_t) / 2)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sampler: split size %lld is invalid", (long long)setup->size);
    return VH_STATUS_OK;
}

/* Training: every rank the same whole batches of its share; the rest of
 * the split waits for another epoch's shuffle. */
static vh_status plan_train(vh_host *host, vh_sampler *s) {
    const int64_t n = s->size, b = s->batch_size, w = s->world;
    int64_t per_rank = n / w;
    s->batches = per_rank / b;
    if (s->batches < 1)
        return host->api->fail(host, VH_STATUS_ERR_CONFIG,
                               "train split of %lld samples over %lld rank(s) leaves %lld per "
                               "rank, fewer than one batch of %lld",
                               (long long)n, (long long)w, (long long)per_rank, (long long)b);
    s->local = s->batches * b;
    return VH_STATUS_OK;
}

/* Evaluation: every sample once, ranks taking turns; every rank makes the
 * same number of non-empty batches. */
static vh_status plan_eval(vh_host *host, vh_sampler *s) {
    const int64_t n = s->size, b = s->batch_size, w = s->world, r = s->rank;
    if (n < w)
        return host->api->fail(host, VH_STATUS_ERR_CONFIG,
                               "eval split of %lld samples over %lld ranks leaves some ranks "
                               "none; every rank needs at least one",
                               (long long)n, (long long)w);
    int64_t largest = (n + w - 1) / w;
    s->local = (n - r + w - 1) / w;
    s->batches = (largest + b - 1) / b;
    /* The smallest share is n / w; every rank needs `batches` non-empty batches. */
    if (n / w < s->batches)
        return host->api->fail(host, VH_STATUS_ERR_CONFIG,
                               "eval split of %lld samples over %lld ranks with batch %lld: "
                               "shares of %lld and %lld samples cannot make the same number "
                               "(%lld) of non-empty batches on every rank; use a batch of at "
                               "least 2 or a size that is a multiple of the world size",
                               (long long)n, (long long)w, (long long)b, (long long)largest,
                               (long long)(n / w), (long long)s->batches);
    s->eval_short = s->local == (s->batches - 1) * b; /* the last batch would be empty */
    return VH_STATUS_OK;
}

vh_status vh_sampler_init(vh_host *host, const vh_sampler_setup *setup, vh_sampler **out) {
    if (!host || !out) return VH_STATUS_ERR_INVALID_ARG;
    *out = NULL;
    /* An older (smaller) setup reads with its missing members zero. */
    vh_sampler_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "sampler setup missing");
    setup = &setup_v;
    vh_status st = check_setup(host, setup);
    if (st != VH_STATUS_OK) return st;
    vh_sampler plan = {.host = host, .size = setup->size, .batch_size = setup->batch_size,
                       .rank = setup->rank, .world = setup->world_size, .split = setup->split,
                       .seed = setup->seed, .epoch = -1};
    st = plan.split == VH_SPLIT_TRAIN ? plan_train(host, &plan) : plan_eval(host, &plan);
    if (st != VH_STATUS_OK) return st;

    vh_sampler *s = host->api->alloc(host, sizeof *s);
    if (!s) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "sampler: out of memory");
    *s = plan;
    s->order = host->api->alloc(host, (size_t)s->local * sizeof(int64_t));
    if (s->split == VH_SPLIT_TRAIN)
        s->perm = host->api->alloc(host, (size_t)s->size * sizeof(int64_t));
    if (!s->order || (s->split == VH_SPLIT_TRAIN && !s->perm)) {
        vh_sampler_free(s);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                               "sampler: out of memory for the %s order of %lld samples",
                               setup->split == VH_SPLIT_TRAIN ? "train" : "eval",
                               (long long)setup->size);
    }
    if (s->split == VH_SPLIT_EVAL)
        for (int64_t k = 0; k < s->local; k++) s->order[k] = s->rank + k * s->world;
    *out = s;
    return VH_STATUS_OK;
}

void vh_sampler_free(vh_sampler *s) {
    if (!s) return;
    vh_host *host = s->host;
    host->api->free(host, s->perm);
    host->api->free(host, s->order);
    host->api->free(host, s);
}

vh_status vh_sampler_start(vh_sampler *s, int64_t epoch) {
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    if (epoch < 0)
        return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG,
                                  "sampler: epoch %lld is negative", (long long)epoch);
    if (s->split == VH_SPLIT_TRAIN && s->epoch != epoch) {
        /* Fisher-Yates, draw k of the (seed, epoch) stream for position k. */
        int64_t *p = s->perm;
        for (int64_t i = 0; i < s->size; i++) p[i] = i;
        uint64_t key = key_of(s->seed, STREAM_SHUFFLE, s->split, epoch), counter = 0;
        for (int64_t i = s->size - 1; i > 0; i--) {
            int64_t j = (int64_t)draw_below(key, &counter, (uint64_t)i + 1);
            int64_t t = p[i];
            p[i] = p[j];
            p[j] = t;
        }
        for (int64_t k = 0; k < s->local; k++) s->order[k] = p[s->rank + k * (int64_t)s->world];
    }
    s->epoch = epoch;
    return VH_STATUS_OK;
}

int64_t vh_sampler_batches(const vh_sampler *s) { return s ? s->batches : 0; }
int64_t vh_sampler_samples(const vh_sampler *s) { return s ? s->local : 0; }
int64_t vh_sampler_epoch(const vh_sampler *s) { return s ? s->epoch : -1; }

vh_status vh_sampler_batch(const vh_sampler *s, int64_t i, const int64_t **indices,
                           int64_t *count) {
    if (!s || !indices || !count || s->epoch < 0 || i < 0 || i >= s->batches)
        return VH_STATUS_ERR_INVALID_ARG;
    int64_t b = s->batch_size, last = s->batches - 1;
    int64_t begin = i * b, n = b;
    if (s->eval_short && i == last - 1) {
        n = b - 1;
    } else if (i == last) {
        if (s->eval_short) begin -= 1;
        n = s->local - begin;
    }
    *indices = s->order + begin;
    *count = n;
    return VH_STATUS_OK;
}

uint64_t vh_sampler_sample_key(const vh_sampler *s, int64_t sample) {
    if (!s) return 0;
    int64_t epoch = s->epoch < 0 ? 0 : s->epoch;
    return vh_splitmix64(key_of(s->seed, STREAM_SAMPLE, s->split, epoch) ^ vh_splitmix64((uint64_t)sample));
}

/* ---- state ---------------------------------------------------------------- */

#define STATE_MAGIC 0x4d415356u /* "VSAM" */
#define STATE_VERSION 1u

/* Field offsets of the blob: fixed, whatever the struct layout of a compiler. */
enum {
    OFF_MAGIC = 0, OFF_VERSION = 4, OFF_SIZE = 8, OFF_BATCH = 16, OFF_RANK = 24,
    OFF_WORLD = 28, OFF_SPLIT = 32, OFF_STARTED = 36, OFF_SEED = 40, OFF_EPOCH = 48,
    OFF_CURSOR = 56, OFF_END = 64 /* reserved, zero, up to VH_SAMPLER_STATE_BYTES */
};
_Static_assert(OFF_END <= VH_SAMPLER_STATE_BYTES, "sampler state does not fit");

static void put32(unsigned char *b, int off, uint32_t v) { memcpy(b + off, &v, 4); }
static void put64(unsigned char *b, int off, uint64_t v) { memcpy(b + off, &v, 8); }
static uint32_t get32(const unsigned char *b, int off) {
    uint32_t v;
    memcpy(&v, b + off, 4);
    return v;
}
static uint64_t get64(const unsigned char *b, int off) {
    uint64_t v;
    memcpy(&v, b + off, 8);
    return v;
}

vh_status vh_sampler_state_save(const vh_sampler *s, int64_t cursor, void *buf, size_t bytes) {
    if (!s || !buf) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = s->host;
    if (bytes < VH_SAMPLER_STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sampler state needs %d bytes, the buffer has %zu",
                               VH_SAMPLER_STATE_BYTES, bytes);
    int started = s->epoch >= 0;
    if (cursor < 0 || cursor > s->batches || (!started && cursor != 0))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sampler: cursor %lld is outside the pass of %lld batches",
                               (long long)cursor, (long long)s->batches);
    unsigned char *b = buf;
    memset(b, 0, VH_SAMPLER_STATE_BYTES);
    put32(b, OFF_MAGIC, STATE_MAGIC);
    put32(b, OFF_VERSION, STATE_VERSION);
    put64(b, OFF_SIZE, (uint64_t)s->size);
    put64(b, OFF_BATCH, (uint64_t)s->batch_size);
    put32(b, OFF_RANK, (uint32_t)s->rank);
    put32(b, OFF_WORLD, (uint32_t)s->world);
    put32(b, OFF_SPLIT, (uint32_t)s->split);
    put32(b, OFF_STARTED, (uint32_t)started);
    put64(b, OFF_SEED, s->seed);
    put64(b, OFF_EPOCH, (uint64_t)(started ? s->epoch : 0));
    put64(b, OFF_CURSOR, (uint64_t)cursor);
    return VH_STATUS_OK;
}

vh_status vh_sampler_state_load(vh_sampler *s, const void *buf, size_t bytes, int64_t *cursor,
                                int *started) {
    if (!s || !buf || !cursor || !started) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = s->host;
    const unsigned char *b = buf;
    if (bytes != VH_SAMPLER_STATE_BYTES)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "sampler state of %zu bytes, expected %d", bytes,
                               VH_SAMPLER_STATE_BYTES);
    if (get32(b, OFF_MAGIC) != STATE_MAGIC || get32(b, OFF_VERSION) != STATE_VERSION)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "not a sampler state (magic 0x%08x, version %u)",
                               (unsigned)get32(b, OFF_MAGIC), (unsigned)get32(b, OFF_VERSION));
    int64_t size = (int64_t)get64(b, OFF_SIZE), batch = (int64_t)get64(b, OFF_BATCH);
    int32_t rank = (int32_t)get32(b, OFF_RANK), world = (int32_t)get32(b, OFF_WORLD);
    int32_t split = (int32_t)get32(b, OFF_SPLIT);
    uint64_t seed = get64(b, OFF_SEED);
    /* A training position saved by another rank, or at another world size
     * or batch, is the same point of the same epoch's permutation: batches
     * so far x world x batch samples of it. Every rank continues from there
     * with its own share, so a run resumes on any number of ranks. */
    int rebase = split == (int32_t)VH_SPLIT_TRAIN && s->split == VH_SPLIT_TRAIN &&
                 size == s->size && seed == s->seed && batch > 0 && world > 0 &&
                 (rank != s->rank || world != s->world || batch != s->batch_size);
    if (!rebase &&
        (size != s->size || batch != s->batch_size || rank != s->rank || world != s->world ||
         split != (int32_t)s->split || seed != s->seed))
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "sampler state of another setup: saved size %lld, batch %lld, "
                               "rank %d of %d, split %d, seed %llu; now size %lld, batch %lld, "
                               "rank %d of %d, split %d, seed %llu",
                               (long long)size, (long long)batch, (int)rank, (int)world, (int)split,
                               (unsigned long long)seed, (long long)s->size,
                               (long long)s->batch_size, (int)s->rank, (int)s->world,
                               (int)s->split, (unsigned long long)s->seed);
    int on = get32(b, OFF_STARTED) != 0;
    int64_t epoch = (int64_t)get64(b, OFF_EPOCH), pos = (int64_t)get64(b, OFF_CURSOR);
    if (rebase && pos >= 0 && pos <= size) {
        /* (when the global batch changed and does not divide the samples
         * consumed, the pass continues from the batch that holds the next
         * sample: at most one global batch is seen twice) */
        int64_t consumed = pos * (int64_t)world * batch;
        pos = consumed / ((int64_t)s->world * s->batch_size);
        if (pos > s->batches) pos = s->batches;
    }
    if (epoch < 0 || pos < 0 || pos > s->batches || (!on && pos != 0))
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "corrupt sampler state: epoch %lld, cursor %lld of %lld batches",
                               (long long)epoch, (long long)pos, (long long)s->batches);
    if (on) {
        vh_status st = vh_sampler_start(s, epoch);
        if (st != VH_STATUS_OK) return st;
    } else {
        s->epoch = -1;
    }
    *cursor = pos;
    *started = on;
    return VH_STATUS_OK;
}
