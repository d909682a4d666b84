/* bench_common.h - what the C benchmarks share: a monotonic clock,
 * operands filled with the same pseudo-random values in [-0.5, 0.5), and
 * the attention op's arguments on batch-first qkv (probs bf16 for bf16, as
 * AMP's vit keeps them, else f32). All are header-only and
 * call nothing in libvhsdk, so ab_calls, which loads two copies of the
 * library and is linked to none, can use them too. */
#ifndef VH_BENCH_COMMON_H
#define VH_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h> /* sysconf */

#include "vithost/vh_runtime.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes to write between "cold" calls, so that their operands come from
 * memory: twice this CPU's L3 as the C library reports it, and at least
 * BENCH_COLD_MIN_BYTES (twice the largest L3 of the CPUs in MACHINE-NOTES.md
 * before the AMX Xeon's 300 MiB). Less than the L3 leaves the operands in
 * it: on the AMX Xeon, a 4160x576x192 GEMM after 64 MiB written ran at
 * 316-323 GFLOP/s (its hot rate), after 600 MiB at 252-258, written by
 * memset or line by line alike. */
#define BENCH_COLD_MIN_BYTES ((size_t)64 << 20)
static inline size_t bench_cold_size(void) {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const size_t twice = l3 > 0 ? 2 * (size_t)l3 : 0;
    return twice > BENCH_COLD_MIN_BYTES ? twice : BENCH_COLD_MIN_BYTES;
}

/* n values of t (f32 or bf16) from a linear congruential sequence; bf16
 * rounded to nearest even (the values are finite: vh_f32_to_bf16's bits). */
static inline void bench_fill(void *p, vh_dtype t, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        const float x = (float)(seed >> 8) * 0x1p-24f - 0.5f;
        if (t == VH_DTYPE_BF16) {
            uint32_t u;
            memcpy(&u, &x, sizeof u);
            ((uint16_t *)p)[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        } else {
            ((float *)p)[i] = x;
        }
    }
}

/* The attention op's arguments for B x N tokens of H heads of Dh, qkv
 * batch-first (token rows of 3 H Dh), out and dout (rows of H Dh), probs
 * bf16 where t is (vit under AMP-bf16) and f32 otherwise, scale 1/8; t the
 * dtype of the rest. probs must hold f32's bytes either way. */
static inline void bench_attention_args(vh_attention_args *a, int64_t B, int64_t N, int64_t H,
                                        int64_t Dh, vh_dtype t, void *qkv, void *out,
                                        void *probs, void *dout, void *dqkv) {
    const int64_t D = H * Dh;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->batch = B, a->tokens = N, a->heads = H, a->head_dim = Dh;
    a->qkv_batch_stride = N * 3 * D, a->qkv_token_stride = 3 * D;
    a->out_batch_stride = N * D, a->out_token_stride = D;
    a->scale = 0.125f;
    a->qkv = qkv, a->out = out, a->probs = probs, a->dout = dout, a->dqkv = dqkv;
    a->dtype = t, a->probs_dtype = t == VH_DTYPE_BF16 ? VH_DTYPE_BF16 : VH_DTYPE_F32;
}

#endif
