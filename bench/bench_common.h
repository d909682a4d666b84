/* bench_common.h - what the C benchmarks share: a monotonic clock and
 * operands filled with the same pseudo-random values in [-0.5, 0.5). */
#ifndef VH_BENCH_COMMON_H
#define VH_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "vithost/vh_runtime.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n values of t (f32 or bf16) from a linear congruential sequence. */
static inline void bench_fill(void *p, vh_dtype t, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        float x = (float)(seed >> 8) * 0x1p-24f - 0.5f;
        if (t == VH_DTYPE_BF16)
            ((uint16_t *)p)[i] = vh_f32_to_bf16(x);
        else
            ((float *)p)[i] = x;
    }
}

#endif
