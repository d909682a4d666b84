/* scratch.c - the per-thread scratch arena of the CPU ops (cpu_ops.h).
 *
 * Why: an op on bf16 tensors needs fp32 copies of them, bias_backward and
 * layer norm need per-chunk partial sums, oneDNN needs its scratchpad. A
 * malloc per call for those is a page-fault storm on large tensors (glibc
 * hands big blocks back to the kernel on free). So each thread keeps one
 * block that only grows: an op takes a mark, bumps a pointer, and releases to
 * the mark when it returns. A request that does not fit is served by its own
 * malloc and the block is grown to the high-water mark when the outermost
 * mark is released, so from the second training step on nothing is allocated.
 *
 * Per thread (pthread key, freed at thread exit): two threads that run ops at
 * the same time (ranks on threads in the tests) never share a block.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_ops.h"

#define ALIGN 64u

typedef struct overflow {
    struct overflow *next;
} overflow; /* header of a block that did not fit; the memory follows, aligned */

typedef struct arena {
    char *base;
    size_t cap, used;
    size_t extra;     /* bytes in overflow blocks now */
    size_t high;      /* most bytes in use at once since the last growth */
    int level;        /* open marks */
    uint64_t allocations;
    overflow *blocks; /* overflow blocks, freed at the outermost release */
} arena;

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void arena_free(void *p) {
    arena *a = p;
    if (!a) return;
    while (a->blocks) {
        overflow *next = a->blocks->next;
        free(a->blocks);
        a->blocks = next;
    }
    free(a->base);
    free(a);
}

static void make_key(void) { (void)pthread_key_create(&g_key, arena_free); }

static arena *this_arena(void) {
    static _Thread_local arena *cached;
    if (cached) return cached;
    pthread_once(&g_once, make_key);
    arena *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    if (pthread_setspecific(g_key, a) != 0) {
        free(a);
        return NULL;
    }
    cached = a;
    return a;
}

vh_cpu_scratch_mark vh_cpu_scratch_begin(void) {
    arena *a = this_arena();
    vh_cpu_scratch_mark m = {0, 0};
    if (!a) return m;
    m.used = a->used;
    m.level = a->level++;
    return m;
}

void *vh_cpu_scratch_alloc(size_t bytes) {
    arena *a = this_arena();
    if (!a) return NULL;
    bytes = (bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    if (bytes == 0) bytes = ALIGN;
    void *p;
    if (a->used + bytes <= a->cap) {
        p = a->base + a->used;
        a->used += bytes;
    } else {
        /* The header takes one alignment unit so the payload stays aligned. */
        overflow *o = aligned_alloc(ALIGN, bytes + ALIGN);
        if (!o) return NULL;
        a->allocations++;
        o->next = a->blocks;
        a->blocks = o;
        a->extra += bytes + ALIGN;
        p = (char *)o + ALIGN;
    }
    const size_t now = a->used + a->extra;
    if (now > a->high) a->high = now;
    return p;
}

void vh_cpu_scratch_end(vh_cpu_scratch_mark mark) {
    arena *a = this_arena();
    if (!a || a->level == 0) return;
    a->level--;
    a->used = mark.used;
    if (a->level > 0) return;
    /* Outermost release: nothing of the arena is in use any more. */
    while (a->blocks) {
        overflow *next = a->blocks->next;
        free(a->blocks);
        a->blocks = next;
    }
    a->extra = 0;
    a->used = 0;
    if (a->high > a->cap) {
        /* Grow by at least half again, so a slowly rising peak does not
         * reallocate on every call. */
        size_t want = a->high + a->high / 2;
        want = (want + 4095) & ~(size_t)4095;
        char *p = vh_cpu_pages_alloc(want);
        if (p) {
            a->allocations++;
            free(a->base);
            a->base = p;
            a->cap = want;
        }
    }
    a->high = 0;
}

uint64_t vh_cpu_scratch_allocations(void) {
    arena *a = this_arena();
    return a ? a->allocations : 0;
}
