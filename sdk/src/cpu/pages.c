/* pages.c - host memory for the CPU device's large buffers, on 2 MiB pages
 * where Linux will give them.
 *
 * Why: with transparent huge pages in "madvise" mode (the kernel's setting
 * on the machines this was measured on), every tensor lives on 4 KiB pages
 * unless the program asks. A training step walks tens to hundreds of MiB of
 * activations, often by strided rows (attention reads a head's rows of
 * qkv 3D floats apart), so it keeps missing the TLB. Asked for, the kernel
 * backs the buffers with 2 MiB pages. Measured on a Xeon (AMX, 2 threads),
 * fp32 training steps, `vithost bench` with and without the advice in
 * alternation, the median of the pairs' ratios: T2 0.964 (faster in 6 of 7
 * pairs), T3 0.966 (4 of 4), T1 0.995 (6 of 12: its 150 MiB of
 * activations gain nothing). PyTorch's CPU allocator does not ask by
 * default (THP_MEM_ALLOC_ENABLE=1 makes it). In "always" mode the advice
 * changes nothing; in "never" the kernel ignores it.
 *
 * Only allocations of 2 MiB and up are advised, each 2 MiB aligned and
 * rounded up to whole 2 MiB (so at most one partly used huge page each):
 * small buffers stay on small pages and cost no more memory.
 * VITHOST_CPU_HUGEPAGES=0 turns the advice off (to compare). */
#define _DEFAULT_SOURCE /* madvise */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__GLIBC__)
#include <malloc.h> /* malloc_usable_size */
#endif

#include "cpu_ops.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define SMALL_ALIGN ((size_t)64)

/* 1 when large buffers are advised (VITHOST_CPU_HUGEPAGES is not "0"). */
static int advise_on(void) {
    static int known = -1; /* read once; callers may race to it, with one answer */
    int on = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (on < 0) {
        const char *v = getenv("VITHOST_CPU_HUGEPAGES");
        on = !(v && strcmp(v, "0") == 0);
        __atomic_store_n(&known, on, __ATOMIC_RELAXED);
    }
    return on;
}

void *vh_cpu_pages_alloc(size_t bytes) {
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_PAGE && advise_on() && bytes <= SIZE_MAX - HUGE_PAGE) {
        const size_t rounded = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        void *p = aligned_alloc(HUGE_PAGE, rounded);
        /* advice only: memory without it is still memory */
        if (p) (void)madvise(p, rounded, MADV_HUGEPAGE);
        return p;
    }
#endif
    /* aligned_alloc needs a size that is a multiple of the alignment */
    if (bytes > SIZE_MAX - SMALL_ALIGN) return NULL;
    const size_t rounded = (bytes + SMALL_ALIGN - 1) & ~(SMALL_ALIGN - 1);
    return aligned_alloc(SMALL_ALIGN, rounded ? rounded : SMALL_ALIGN);
}

/* The bytes of the device's live tensors (cpu_alloc's), as the allocator
 * holds them: stream.c asks whether a step's tensors outgrow the caches.
 * Without glibc's malloc_usable_size the count stays 0. */
static _Atomic int64_t g_tensor_bytes;

static int64_t held_bytes(void *p) {
#if defined(__GLIBC__)
    return p ? (int64_t)malloc_usable_size(p) : 0;
#else
    (void)p;
    return 0;
#endif
}

void *vh_cpu_tensor_alloc(size_t bytes) {
    void *p = vh_cpu_pages_alloc(bytes);
    atomic_fetch_add_explicit(&g_tensor_bytes, held_bytes(p), memory_order_relaxed);
    return p;
}

void vh_cpu_tensor_free(void *p) {
    atomic_fetch_sub_explicit(&g_tensor_bytes, held_bytes(p), memory_order_relaxed);
    free(p);
}

int64_t vh_cpu_tensor_bytes(void) {
    return atomic_load_explicit(&g_tensor_bytes, memory_order_relaxed);
}
