/* gpu_twin.c - see gpu_twin.h. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_twin.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gpu_twin_open(gpu_twin *t, const char *test_name) {
    memset(t, 0, sizeof *t);
    t->cpu = vh_cpu_device_ops();
    char path[4200];
    snprintf(path, sizeof path, "%s/lib/libvh_cuda.so", VH_TEST_BUILD_DIR);
    if (access(path, F_OK) != 0) {
        printf("SKIPPED: %s: this build has no CUDA device library (toolkit not found)\n",
               test_name);
        exit(GPU_TWIN_SKIP);
    }
    t->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!t->lib) {
        printf("SKIPPED: %s: cannot load %s: %s\n", test_name, path, dlerror());
        exit(GPU_TWIN_SKIP);
    }
    vh_cuda_device_open_fn open_fn;
    *(void **)&open_fn = dlsym(t->lib, VH_CUDA_OPEN_SYMBOL);
    if (!open_fn) {
        fprintf(stderr, "%s: %s does not export %s\n", test_name, path, VH_CUDA_OPEN_SYMBOL);
        exit(1); /* a broken build, not a missing GPU */
    }
    char err[512];
    vh_cuda_open_args oa = {.struct_size = sizeof oa, .abi_major = VH_ABI_MAJOR,
                            .abi_minor = VH_ABI_MINOR, .ordinal = 0};
    if (open_fn(&oa, &t->gpu, sizeof t->gpu, err, sizeof err) != VH_STATUS_OK) {
        printf("SKIPPED: %s: no usable GPU here (%s)\n", test_name, err);
        exit(GPU_TWIN_SKIP);
    }
}

void gpu_twin_close(gpu_twin *t) {
    if (t->lib) dlclose(t->lib);
    t->lib = NULL;
}

void gpu_twin_fill(float *x, int64_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = lo + (hi - lo) * (float)((s >> 40) * 0x1.0p-24);
    }
}

static size_t dtype_size(vh_dtype d) { return d == VH_DTYPE_F32 ? 4 : 2; }

void *gpu_twin_host(const float *x, int64_t n, vh_dtype dtype) {
    void *h = malloc((size_t)(n > 0 ? n : 1) * dtype_size(dtype));
    if (!h) abort();
    for (int64_t i = 0; i < n; i++) {
        if (dtype == VH_DTYPE_BF16) ((uint16_t *)h)[i] = vh_f32_to_bf16(x[i]);
        else if (dtype == VH_DTYPE_F16) ((uint16_t *)h)[i] = vh_f32_to_f16(x[i]);
        else ((float *)h)[i] = x[i];
    }
    return h;
}

void gpu_twin_widen(float *out, const void *host_ptr, int64_t n, vh_dtype dtype) {
    for (int64_t i = 0; i < n; i++) {
        if (dtype == VH_DTYPE_BF16) out[i] = vh_bf16_to_f32(((const uint16_t *)host_ptr)[i]);
        else if (dtype == VH_DTYPE_F16) out[i] = vh_f16_to_f32(((const uint16_t *)host_ptr)[i]);
        else out[i] = ((const float *)host_ptr)[i];
    }
}

void *gpu_twin_upload(gpu_twin *t, const float *x, int64_t n, vh_dtype dtype) {
    void *h = gpu_twin_host(x, n, dtype), *d = NULL;
    const size_t bytes = (size_t)(n > 0 ? n : 1) * dtype_size(dtype);
    if (t->gpu.alloc(t->gpu.device, bytes, &d) != VH_STATUS_OK ||
        t->gpu.copy(t->gpu.device, d, h, bytes, VH_COPY_KIND_HOST_TO_DEVICE, NULL) !=
            VH_STATUS_OK) {
        fprintf(stderr, "gpu_twin_upload: %lld values failed\n", (long long)n);
        abort();
    }
    free(h);
    return d;
}

void gpu_twin_free(gpu_twin *t, void *device_ptr) {
    if (device_ptr) t->gpu.free(t->gpu.device, device_ptr);
}

void gpu_twin_download(gpu_twin *t, float *out, const void *device_ptr, int64_t n,
                       vh_dtype dtype) {
    const size_t bytes = (size_t)(n > 0 ? n : 1) * dtype_size(dtype);
    void *h = malloc(bytes);
    if (!h || t->gpu.synchronize(t->gpu.device) != VH_STATUS_OK ||
        t->gpu.copy(t->gpu.device, h, device_ptr, bytes, VH_COPY_KIND_DEVICE_TO_HOST, NULL) !=
            VH_STATUS_OK) {
        fprintf(stderr, "gpu_twin_download: %lld values failed\n", (long long)n);
        abort();
    }
    gpu_twin_widen(out, h, n, dtype);
    free(h);
}

double gpu_twin_tol(vh_dtype dtype) {
    return dtype == VH_DTYPE_BF16 ? 1e-2 : dtype == VH_DTYPE_F16 ? 2e-3 : 1e-5;
}

int gpu_twin_close_enough(const char *what, const float *a, const float *b, int64_t n,
                          double tol) {
    double scale = 1e-30, worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) { /* NaN counts as the worst */
            worst = isnan(d) ? INFINITY : d;
            at = i;
        }
    }
    if (worst / scale <= tol) return 1;
    printf("%s: normalised error %.3g > %.3g at [%lld]: gpu %.9g, cpu %.9g (max |cpu| %.6g)\n",
           what, worst / scale, tol, (long long)at, (double)a[at], (double)b[at], scale);
    return 0;
}
