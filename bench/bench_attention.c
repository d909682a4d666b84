/* bench_attention.c - the CPU engine's attention op alone, forward and
 * backward, on the ViT shapes of bench_step.py and the main job, through
 * the op the model plugins call (vh_cpu_device_ops()->attention_*).
 *
 *   build/bench/bench_attention [reps] [--cold] [case ...] [f32|bf16]
 *
 * Cases: T1 (B128 N50 H4 Dh16), T2 (B64 N65 H3 Dh64), T3 (B8 N197 H6
 * Dh64), main (configs/fashion-mnist-vit.yaml: B128 N16 H8 Dh16), each in
 * f32 (probs f32) and bf16 (probs bf16, as AMP's vit keeps them); batch-first.
 * Each is timed best-of-reps after one warm-up call; the line gives ms a
 * call and GFLOP/s of the products (forward 4 B H N^2 Dh, backward twice
 * that). --cold writes twice the L3 before each timed call (bench_common.h),
 * so the tensors come from memory as in a training step, whose tensors
 * exceed the caches. A benchmark for A/B runs of kernel changes: run the two builds in
 * turn (bench/ab_libs.sh; a shared machine drifts); ctest never runs it.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_runtime.h"

#include "bench_common.h"

typedef struct attn_case {
    const char *name;
    int64_t b, n, h, dh;
} attn_case;

static const attn_case cases[] = {
    {"T1", 128, 50, 4, 16},
    {"T2", 64, 65, 3, 64},
    {"T3", 8, 197, 6, 64},
    {"main", 128, 16, 8, 16},
};

static void *alloc_or_die(const vh_device_ops *d, size_t bytes) {
    void *p = NULL;
    if (d->alloc(d->device, bytes, &p) != VH_STATUS_OK) {
        fprintf(stderr, "bench_attention: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static char *cold_buf; /* written before each timed call; NULL: hot calls */
static size_t cold_bytes;

/* Best ms of `reps` calls of forward (backward 0) or backward (1). */
static double time_op(const vh_device_ops *d, const vh_attention_args *a, int backward,
                      int reps) {
    vh_status (*op)(vh_device *, const vh_attention_args *) =
        backward ? d->attention_backward : d->attention_forward;
    if (op(d->device, a) != VH_STATUS_OK) return -1.0;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        if (cold_buf) memset(cold_buf, r + 1, cold_bytes);
        double t0 = bench_now();
        op(d->device, a);
        double dt = bench_now() - t0;
        if (dt < best) best = dt;
    }
    return best * 1e3;
}

static void run_case(const vh_device_ops *d, const attn_case *c, vh_dtype t, int reps) {
    const int64_t D = c->h * c->dh, nqkv = c->b * c->n * 3 * D, nout = c->b * c->n * D;
    const size_t es = vh_dtype_size(t);
    void *qkv = alloc_or_die(d, (size_t)nqkv * es), *dqkv = alloc_or_die(d, (size_t)nqkv * es);
    void *out = alloc_or_die(d, (size_t)nout * es), *dout = alloc_or_die(d, (size_t)nout * es);
    void *probs = alloc_or_die(d, (size_t)(c->b * c->h * c->n * c->n) * sizeof(float));
    bench_fill(qkv, t, (size_t)nqkv, 1);
    bench_fill(dout, t, (size_t)nout, 2);
    bench_fill(dqkv, t, (size_t)nqkv, 3);
    vh_attention_args a;
    bench_attention_args(&a, c->b, c->n, c->h, c->dh, t, qkv, out, probs, dout, dqkv);
    const double flop = 4.0 * (double)(c->b * c->h) * (double)(c->n * c->n) * (double)c->dh;
    double f = time_op(d, &a, 0, reps), b = f < 0 ? -1.0 : time_op(d, &a, 1, reps);
    if (f < 0 || b < 0)
        printf("attention %-5s %-4s unsupported\n", c->name, vh_dtype_name(t));
    else
        printf("attention %-5s %-4s%s forward %8.3f ms %7.1f GFLOP/s   backward %8.3f ms %7.1f "
               "GFLOP/s\n",
               c->name, vh_dtype_name(t), cold_buf ? " cold" : "", f, flop / f * 1e-6, b, 2.0 * flop / b * 1e-6);
    fflush(stdout);
    d->free(d->device, qkv), d->free(d->device, dqkv), d->free(d->device, out);
    d->free(d->device, dout), d->free(d->device, probs);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 10;
    const vh_device_ops *d = vh_cpu_device_ops();
    const vh_dtype dtypes[] = {VH_DTYPE_F32, VH_DTYPE_BF16};
    int any_case = 0, any_dtype = 0; /* no case (dtype) named: all of them */
    int usage = reps < 1;            /* a bad count, or a word that is neither */
    for (int j = 2; j < argc; j++) {
        if (strcmp(argv[j], "--cold") == 0) {
            cold_buf = malloc(cold_bytes = bench_cold_size());
            if (!cold_buf) fprintf(stderr, "bench_attention: no memory for --cold\n");
            usage |= !cold_buf;
            continue;
        }
        const int is_dtype = strcmp(argv[j], "f32") == 0 || strcmp(argv[j], "bf16") == 0;
        int is_case = 0;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            is_case |= strcmp(argv[j], cases[i].name) == 0;
        usage |= !is_dtype && !is_case;
        any_dtype |= is_dtype, any_case |= is_case;
    }
    if (usage) {
        fprintf(stderr, "usage: bench_attention [reps (10)] [--cold] [T1|T2|T3|main ...] [f32|bf16]\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t t = 0; t < 2; t++) {
            int case_wanted = !any_case, dtype_wanted = !any_dtype;
            for (int j = 2; j < argc; j++) {
                case_wanted |= strcmp(argv[j], cases[i].name) == 0;
                dtype_wanted |= strcmp(argv[j], vh_dtype_name(dtypes[t])) == 0;
            }
            if (case_wanted && dtype_wanted) run_case(d, &cases[i], dtypes[t], reps);
        }
    free(cold_buf);
    return 0;
}
