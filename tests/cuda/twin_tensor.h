/* twin_tensor.h - one tensor on both devices, for the GPU op tests
 * (test_cuda_eltwise.c, test_cuda_layernorm.c, test_cuda_tokens.c).
 *
 * A twin tensor holds the same values of one dtype twice: in device memory
 * for the CUDA op and in host memory for the CPU op (the CPU device's
 * memory). A test runs an op on each side (TT_SIDE_CPU, TT_SIDE_GPU) with
 * tt_ptr picking that side's pointer, then tt_same compares the results. */
#ifndef VH_TESTS_TWIN_TENSOR_H
#define VH_TESTS_TWIN_TENSOR_H

#include <stdio.h>
#include <stdlib.h>

#include "gpu_twin.h"

enum { TT_SIDE_CPU = 0, TT_SIDE_GPU = 1 };

typedef struct tt {
    int64_t n;
    vh_dtype dtype;
    void *cpu, *gpu;
} tt;

static const vh_dtype tt_dtypes[3] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};

static inline const char *tt_dtype_name(vh_dtype d) {
    return d == VH_DTYPE_BF16 ? "bf16" : d == VH_DTYPE_F16 ? "f16" : "f32";
}

/* n values uniform in [lo, hi) from `seed` (lo == hi: all lo). */
static inline tt tt_make(gpu_twin *g, int64_t n, vh_dtype dtype, uint64_t seed, float lo,
                         float hi) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!v) abort();
    gpu_twin_fill(v, n, seed, lo, hi);
    tt t = {n, dtype, gpu_twin_host(v, n, dtype), gpu_twin_upload(g, v, n, dtype)};
    free(v);
    return t;
}

static inline void tt_free(gpu_twin *g, tt *t) {
    free(t->cpu);
    gpu_twin_free(g, t->gpu);
    t->cpu = t->gpu = NULL;
}

static inline void *tt_ptr(const tt *t, int side) { return side == TT_SIDE_GPU ? t->gpu : t->cpu; }

static inline const vh_device_ops *tt_ops(const gpu_twin *g, int side) {
    return side == TT_SIDE_GPU ? &g->gpu : g->cpu;
}

/* The GPU's values against the CPU's, normalised error <= tol; `what` and
 * the dtype name the comparison in a failure. */
static inline int tt_same(gpu_twin *g, const char *what, const tt *t, double tol) {
    float *a = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof(float));
    float *b = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof(float));
    if (!a || !b) abort();
    gpu_twin_download(g, a, t->gpu, t->n, t->dtype);
    gpu_twin_widen(b, t->cpu, t->n, t->dtype);
    char name[160];
    snprintf(name, sizeof name, "%s (%s)", what, tt_dtype_name(t->dtype));
    const int ok = gpu_twin_close_enough(name, a, b, t->n, tol);
    free(a);
    free(b);
    return ok;
}

/* n f32 values of device memory read back, and the CPU's, compared. */
static inline int tt_same_f32(gpu_twin *g, const char *what, const float *gpu, const float *cpu,
                              int64_t n, double tol) {
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!a) abort();
    gpu_twin_download(g, a, gpu, n, VH_DTYPE_F32);
    const int ok = gpu_twin_close_enough(what, a, cpu, n, tol);
    free(a);
    return ok;
}

#endif
