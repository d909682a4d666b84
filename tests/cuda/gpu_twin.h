/* gpu_twin.h - the GPU tests' harness: the CUDA device beside its CPU twin.
 *
 * A GPU test opens libvh_cuda.so with gpu_twin_open; where the build has no
 * CUDA library or the machine no usable GPU, that prints ONE line
 * "SKIPPED: <test>: <why>" and exits 77, which ctest reports as skipped
 * (SKIP_RETURN_CODE). Then each test runs an op on both devices from the
 * same inputs and compares with gpu_twin_close_enough. */
#ifndef VH_TESTS_GPU_TWIN_H
#define VH_TESTS_GPU_TWIN_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_runtime.h"
#include "vithost/vithost.h"

#define GPU_TWIN_SKIP 77

typedef struct gpu_twin {
    vh_device_ops gpu;        /* the CUDA table */
    const vh_device_ops *cpu; /* the SDK's CPU table */
    void *lib;
} gpu_twin;

/* The CUDA device 0, or exit(77) with the SKIPPED line. */
void gpu_twin_open(gpu_twin *t, const char *test_name);
void gpu_twin_close(gpu_twin *t);

/* n fp32 values, uniform in [lo, hi), from a fixed seed. */
void gpu_twin_fill(float *x, int64_t n, uint64_t seed, float lo, float hi);

/* n values of `dtype` on the GPU holding the host fp32 values x (rounded to
 * dtype); and the host-side twin: the same values in `dtype` on the CPU
 * (plain malloc'ed host memory, the CPU device's memory). Free with free /
 * gpu_twin_free. */
void *gpu_twin_upload(gpu_twin *t, const float *x, int64_t n, vh_dtype dtype);
void *gpu_twin_host(const float *x, int64_t n, vh_dtype dtype);
void gpu_twin_free(gpu_twin *t, void *device_ptr);

/* The device's n values of `dtype` as fp32 in out (after a synchronize);
 * and the same of host memory. */
void gpu_twin_download(gpu_twin *t, float *out, const void *device_ptr, int64_t n,
                       vh_dtype dtype);
void gpu_twin_widen(float *out, const void *host_ptr, int64_t n, vh_dtype dtype);

/* Normalised error max|a - b| / max(max|b|, 1e-30) <= tol; prints the worst
 * element and both values when not, naming `what`. Tolerances per dtype:
 * gpu_twin_tol (f32 1e-5, bf16 1e-2, f16 2e-3), looser for GEMM-fed sums. */
int gpu_twin_close_enough(const char *what, const float *a, const float *b, int64_t n,
                          double tol);
double gpu_twin_tol(vh_dtype dtype);

#endif
