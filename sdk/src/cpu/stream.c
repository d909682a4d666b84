/* stream.c - copies that write around the caches (non-temporal stores).
 *
 * Why: a tensor a step writes and reads back only much later (GELU's
 * gelu'(T), kept for the backward pass) leaves the caches before it is
 * read. Written with ordinary stores, every line of it is first read from
 * memory (read for ownership) and later written back: twice its bytes of
 * memory traffic. Written with non-temporal stores the read goes away. On
 * the AMX Xeon, 2 threads, 1 GiB written: ordinary stores 20.5 GB/s,
 * non-temporal 50 GB/s. A kernel that computes into a buffer in L1 and
 * streams it out here pays one more read of that buffer from L1.
 *
 * The stores are SSE2's (16 bytes; x86-64's baseline): the CPU merges four
 * of them into a whole line as it would wider ones. Elsewhere a plain copy. */
#define _DEFAULT_SOURCE /* sysconf's _SC_LEVEL3_CACHE_SIZE */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* sysconf */

#include "cpu_ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* When: the device's live tensors hold more than the L3 (as the C library
 * reports it). A step then writes more between a tensor's forward and its
 * backward than the caches keep, and the tensor is read back from memory
 * either way. Where the whole step fits, streaming would push to memory a
 * tensor the backward could have found in L3. On the AMX Xeon (L3 300
 * MiB), fp32's fc1 forward in the step, aux streamed against stored,
 * interleaved pairs of `vithost bench --ops`, ms a step (tensors: model
 * state and activations as that command reports them):
 *   T2 (757 MiB of tensors)  65.0-66.4 against 68.3-70.4 (4 pairs)
 *   T3 (909 MiB)             88.0-89.3 against 94.7-98.7 (3)
 *   T1 (150 MiB)             5.5-6.0 against 5.1-5.7 (3)
 *   the main job (104 MiB)   3.9-4.1 against 3.7-3.8 (3)
 * No L3 reported: L3_UNKNOWN_BYTES, the L3 of the smaller CPUs in
 * MACHINE-NOTES.md. VITHOST_CPU_STREAM=1 streams always, =0 never (tests,
 * and to compare); read at every call, so both run within one process. */
#define L3_UNKNOWN_BYTES ((int64_t)32 << 20)

static int64_t l3_bytes(void) {
    static int64_t known = -1; /* racing callers store the same value */
    int64_t b = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (b < 0) {
        const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        b = l3 > 0 ? (int64_t)l3 : L3_UNKNOWN_BYTES;
        __atomic_store_n(&known, b, __ATOMIC_RELAXED);
    }
    return b;
}

int vh_cpu_stream_on(void) {
    const char *v = getenv("VITHOST_CPU_STREAM");
    if (v && strcmp(v, "0") == 0) return 0;
    if (v && strcmp(v, "1") == 0) return 1;
    return vh_cpu_tensor_bytes() > l3_bytes();
}

void vh_cpu_copy_stream(void *dst, const void *src, size_t bytes) {
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    /* ordinary stores up to dst's first 16-byte boundary, and for the tail */
    const size_t lead = (size_t)(-(uintptr_t)d & 15u), head = lead < bytes ? lead : bytes;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 16 <= bytes; i += 16)
        _mm_stream_si128((__m128i *)(d + i), _mm_loadu_si128((const __m128i *)(s + i)));
    memcpy(d + i, s + i, bytes - i);
#else
    memcpy(dst, src, bytes);
#endif
}

void vh_cpu_stream_fence(void) {
#if defined(__x86_64__)
    /* non-temporal stores are weakly ordered: make them visible before
     * another thread (after the parallel region's barrier) reads dst */
    _mm_sfence();
#endif
}
