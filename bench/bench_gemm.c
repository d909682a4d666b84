/* bench_gemm.c - the GEMM peak of this machine as the SDK's CPU engine
 * measures it, in fp32 and in bf16 (bf16 inputs, fp32 accumulation and
 * output), through the very op the model plugins call
 * (vh_cpu_device_ops()->gemm).
 *
 * Shapes: a square 2048^3 and the ViT shapes of MACHINE-NOTES.md (a
 * ViT-S/16 MLP GEMM, a T1 weight-gradient GEMM with A transposed, and a
 * batched attention GEMM). Each is timed best-of-R after one warm-up call;
 * GFLOP/s = 2 m n k batch / time. One line per (dtype, shape), then one
 * JSON line per dtype with the peak (the best shape, operands in cache),
 * which bench_step.py reads. Each line also gives the mean rate of the
 * same calls (a step's GEMMs run at their mean, not their best: on a
 * shared machine the two differ by the neighbours' share), and with
 * --cold the best rate with the operands out of cache (twice the L3 written
 * before each of as many more calls, as a step's other tensors push them
 * out; where it is close to the hot one, memory traffic is not what a
 * step's GEMMs lose). Without --cold the calls run back to back, as they
 * always have for the peak that bench_step.py's goals are measured on.
 *
 *   build/bench/bench_gemm [reps (5)] [--cold] [--vit-s16]
 *
 * The PEAK line bench_step.py reads:
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
#include <unistd.h> /* sysconf */

#include "vithost/vh_runtime.h"

#include "bench_common.h"

static size_t cold_bytes;

typedef struct gemm_shape {
    const char *name;
    int64_t m, n, k, batch;
    int trans_a, trans_b;
} gemm_shape;

static const gemm_shape shapes[] = {
    {"2048x2048x2048", 2048, 2048, 2048, 1, 0, 0},
    {"vit-s16 fc1 1576x1536x384", 1576, 1536, 384, 1, 0, 0},
    {"T1 fc1 6400x256x64", 6400, 256, 64, 1, 0, 0},
    {"T1 dW 256x64x6400 (A^T)", 256, 64, 6400, 1, 1, 0},
    {"attention 72 x 197x197x64", 197, 197, 64, 72, 0, 0},
};

/* With --vit-s16, after the peak's shapes and not in it: the twelve linear
 * GEMMs of bench_step.py's T3 (ViT-S/16, batch 8: 1576 tokens), as the vit
 * plugin calls them (forward X W^T, data gradient dY W, weight gradient
 * dY^T X), to set a step's `--ops` rates beside the same shapes alone. */
static const gemm_shape vit_s16_shapes[] = {
    {"T3 qkv 1576x1152x384 B^T", 1576, 1152, 384, 1, 0, 1},
    {"T3 proj 1576x384x384 B^T", 1576, 384, 384, 1, 0, 1},
    {"T3 fc1 1576x1536x384 B^T", 1576, 1536, 384, 1, 0, 1},
    {"T3 fc2 1576x384x1536 B^T", 1576, 384, 1536, 1, 0, 1},
    {"T3 qkv dX 1576x384x1152", 1576, 384, 1152, 1, 0, 0},
    {"T3 proj dX 1576x384x384", 1576, 384, 384, 1, 0, 0},
    {"T3 fc1 dX 1576x384x1536", 1576, 384, 1536, 1, 0, 0},
    {"T3 fc2 dX 1576x1536x384", 1576, 1536, 384, 1, 0, 0},
    {"T3 qkv dW 1152x384x1576 A^T", 1152, 384, 1576, 1, 1, 0},
    {"T3 proj dW 384x384x1576 A^T", 384, 384, 1576, 1, 1, 0},
    {"T3 fc1 dW 1536x384x1576 A^T", 1536, 384, 1576, 1, 1, 0},
    {"T3 fc2 dW 384x1536x1576 A^T", 384, 1536, 1576, 1, 1, 0},
};

static char *cold_buf; /* cold_bytes, or NULL: no cold timings */

/* GFLOP/s of `reps` calls: the best and the mean with the operands in
 * cache (*hot, *mean), the best out of it (*cold, or 0 without cold_buf);
 * all negative when the engine refuses the dtype. */
static void time_shape(const vh_device_ops *d, const gemm_shape *s, vh_dtype ab, int reps,
                       double *hot, double *mean, double *cold) {
    size_t es = vh_dtype_size(ab);
    size_t na = (size_t)(s->m * s->k * s->batch), nb = (size_t)(s->k * s->n * s->batch);
    size_t nc = (size_t)(s->m * s->n * s->batch);
    void *a = NULL, *b = NULL, *c = NULL;
    if (d->alloc(d->device, na * es, &a) || d->alloc(d->device, nb * es, &b) ||
        d->alloc(d->device, nc * sizeof(float), &c)) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    bench_fill(a, ab, na, 1);
    bench_fill(b, ab, nb, 2);
    vh_gemm_args g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.trans_a = s->trans_a;
    g.m = s->m, g.n = s->n, g.k = s->k;
    g.alpha = 1.0f, g.beta = 0.0f;
    g.a = a, g.lda = s->trans_a ? s->m : s->k, g.stride_a = s->m * s->k;
    g.trans_b = s->trans_b;
    g.b = b, g.ldb = s->trans_b ? s->k : s->n, g.stride_b = s->k * s->n;
    g.c = c, g.ldc = s->n, g.stride_c = s->m * s->n;
    g.batch = s->batch;
    g.ab_dtype = ab;
    g.c_dtype = VH_DTYPE_F32;
    const double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k * (double)s->batch;
    *hot = *mean = *cold = -1.0;
    if (d->gemm(d->device, &g) == VH_STATUS_OK) { /* warm-up: primitive creation */
        double best_hot = 0.0, best_cold = 0.0, total = 0.0;
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now();
            d->gemm(d->device, &g);
            double dt = bench_now() - t0;
            total += dt;
            if (flop / dt > best_hot) best_hot = flop / dt;
            if (!cold_buf) continue;
            memset(cold_buf, r + 1, cold_bytes);
            t0 = bench_now();
            d->gemm(d->device, &g);
            dt = bench_now() - t0;
            if (flop / dt > best_cold) best_cold = flop / dt;
        }
        *hot = best_hot * 1e-9, *mean = flop * reps / total * 1e-9, *cold = best_cold * 1e-9;
    }
    d->free(d->device, a);
    d->free(d->device, b);
    d->free(d->device, c);
}

/* One line for a shape; its best rate, or a negative value. */
static double report(const vh_device_ops *d, const gemm_shape *s, vh_dtype t, int reps) {
    double gf, mean, cold;
    time_shape(d, s, t, reps, &gf, &mean, &cold);
    if (gf < 0) {
        printf("gemm %-5s %-28s unsupported\n", vh_dtype_name(t), s->name);
        return gf;
    }
    printf("gemm %-5s %-28s %8.1f GFLOP/s, mean %6.1f (%.0f%%)", vh_dtype_name(t), s->name, gf,
           mean, 100.0 * mean / gf);
    if (cold > 0) printf(", out of cache %6.1f (%.0f%%)", cold, 100.0 * cold / gf);
    printf("\n");
    return gf;
}

int main(int argc, char **argv) {
    int reps = 5, vit_s16 = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cold") == 0)
            cold_buf = malloc(cold_bytes = bench_cold_size()); /* NULL: the hot rates alone */
        else if (strcmp(argv[i], "--vit-s16") == 0)
            vit_s16 = 1;
        else if ((reps = atoi(argv[i])) < 1) {
            fprintf(stderr, "bench_gemm: '%s' is not a flag or a count of calls; usage: "
                            "bench_gemm [reps (5)] [--cold] [--vit-s16]\n", argv[i]);
            return 2;
        }
    }
    const vh_device_ops *d = vh_cpu_device_ops();
    const vh_dtype dtypes[] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
        double peak = -1.0;
        const char *peak_shape = "";
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const double gf = report(d, &shapes[i], dtypes[t], reps);
            if (gf > peak) peak = gf, peak_shape = shapes[i].name;
        }
        if (peak > 0)
            printf("PEAK {\"dtype\": \"%s\", \"gflops\": %.1f, \"shape\": \"%s\"}\n",
                   vh_dtype_name(dtypes[t]), peak, peak_shape);
        for (size_t i = 0; vit_s16 && i < sizeof vit_s16_shapes / sizeof vit_s16_shapes[0]; i++)
            report(d, &vit_s16_shapes[i], dtypes[t], reps);
        fflush(stdout);
    }
    free(cold_buf);
    return 0;
}
