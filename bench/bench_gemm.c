/* bench_gemm.c - the GEMM peak of this machine as the SDK's CPU engine
 * measures it, in fp32 and in bf16 (bf16 inputs, fp32 accumulation and
 * output), through the very op the model plugins call
 * (vh_cpu_device_ops()->gemm).
 *
 * Shapes: a square 2048^3 and the ViT shapes of MACHINE-NOTES.md (a
 * ViT-S/16 MLP GEMM, a T1 weight-gradient GEMM with A transposed, and a
 * batched attention GEMM). Each is timed best-of-R after one warm-up call;
 * GFLOP/s = 2 m n k batch / time. One line per (dtype, shape), then one
 * JSON line per dtype with the peak (the best shape), which bench_step.py
 * reads:
 *
 *   PEAK {"dtype": "f32", "gflops": 352.1, "shape": "2048x2048x2048"}
 *
 * A dtype the engine refuses prints "unsupported" and no PEAK line. Not a
 * test: ctest never runs it.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vithost/vh_runtime.h"

typedef struct gemm_shape {
    const char *name;
    int64_t m, n, k, batch;
    int trans_a;
} gemm_shape;

static const gemm_shape shapes[] = {
    {"2048x2048x2048", 2048, 2048, 2048, 1, 0},
    {"vit-s16 fc1 1576x1536x384", 1576, 1536, 384, 1, 0},
    {"T1 fc1 6400x256x64", 6400, 256, 64, 1, 0},
    {"T1 dW 256x64x6400 (A^T)", 256, 64, 6400, 1, 1},
    {"attention 72 x 197x197x64", 197, 197, 64, 72, 0},
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(void *p, vh_dtype t, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        float x = (float)(seed >> 8) * 0x1p-24f - 0.5f;
        if (t == VH_DTYPE_BF16)
            ((uint16_t *)p)[i] = vh_f32_to_bf16(x);
        else
            ((float *)p)[i] = x;
    }
}

/* Best GFLOP/s of `reps` calls, or a negative value when the engine
 * refuses the dtype. */
static double time_shape(const vh_device_ops *d, const gemm_shape *s, vh_dtype ab, int reps) {
    size_t es = vh_dtype_size(ab);
    size_t na = (size_t)(s->m * s->k * s->batch), nb = (size_t)(s->k * s->n * s->batch);
    size_t nc = (size_t)(s->m * s->n * s->batch);
    void *a = NULL, *b = NULL, *c = NULL;
    if (d->alloc(d->device, na * es, &a) || d->alloc(d->device, nb * es, &b) ||
        d->alloc(d->device, nc * sizeof(float), &c)) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    fill(a, ab, na, 1);
    fill(b, ab, nb, 2);
    vh_gemm_args g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.trans_a = s->trans_a;
    g.m = s->m, g.n = s->n, g.k = s->k;
    g.alpha = 1.0f, g.beta = 0.0f;
    g.a = a, g.lda = s->trans_a ? s->m : s->k, g.stride_a = s->m * s->k;
    g.b = b, g.ldb = s->n, g.stride_b = s->k * s->n;
    g.c = c, g.ldc = s->n, g.stride_c = s->m * s->n;
    g.batch = s->batch;
    g.ab_dtype = ab;
    g.c_dtype = VH_DTYPE_F32;
    double best = -1.0;
    if (d->gemm(d->device, &g) == VH_STATUS_OK) { /* warm-up: primitive creation */
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            d->gemm(d->device, &g);
            double dt = now() - t0;
            double gf = 2.0 * (double)s->m * (double)s->n * (double)s->k * (double)s->batch /
                        dt * 1e-9;
            if (gf > best) best = gf;
        }
    }
    d->free(d->device, a);
    d->free(d->device, b);
    d->free(d->device, c);
    return best;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1) reps = 1;
    const vh_device_ops *d = vh_cpu_device_ops();
    const vh_dtype dtypes[] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
        double peak = -1.0;
        const char *peak_shape = "";
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            double gf = time_shape(d, &shapes[i], dtypes[t], reps);
            if (gf < 0) {
                printf("gemm %-5s %-28s unsupported\n", vh_dtype_name(dtypes[t]), shapes[i].name);
                continue;
            }
            printf("gemm %-5s %-28s %8.1f GFLOP/s\n", vh_dtype_name(dtypes[t]), shapes[i].name,
                   gf);
            if (gf > peak) peak = gf, peak_shape = shapes[i].name;
        }
        if (peak > 0)
            printf("PEAK {\"dtype\": \"%s\", \"gflops\": %.1f, \"shape\": \"%s\"}\n",
                   vh_dtype_name(dtypes[t]), peak, peak_shape);
        fflush(stdout);
    }
    return 0;
}
