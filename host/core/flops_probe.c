/* flops_probe.c - one GEMM of 1024^3 with a- and b- in the dtype asked,
 * timed through the device's gemm op (see flops_probe.h). */
#define _POSIX_C_SOURCE 200809L
#include "flops_probe.h"

#include <stdlib.h>

#include "progress.h"

double flops_probe_peak_tflops_dtype(const vh_device_ops *dev, vh_dtype dtype) {
    if (!dev->gemm || !dev->synchronize) return 0.0;
    if (dtype != VH_DTYPE_F32 && !dev->convert) return 0.0;
    const int64_t n = 1024;
    size_t bytes = (size_t)(n * n) * sizeof(float);
    float *host = malloc(bytes);
    void *a = NULL, *b = NULL, *c = NULL, *a16 = NULL, *b16 = NULL;
    double best = 0.0;
    if (!host || dev->alloc(dev->device, bytes, &a) != VH_STATUS_OK ||
        dev->alloc(dev->device, bytes, &b) != VH_STATUS_OK ||
        dev->alloc(dev->device, bytes, &c) != VH_STATUS_OK)
        goto done;
    for (int64_t i = 0; i < n * n; i++) host[i] = (float)(i % 7) * 0.01f;
    if (dev->copy(dev->device, a, host, bytes, VH_COPY_KIND_HOST_TO_DEVICE, NULL) != VH_STATUS_OK ||
        dev->copy(dev->device, b, host, bytes, VH_COPY_KIND_HOST_TO_DEVICE, NULL) != VH_STATUS_OK)
        goto done;
    vh_gemm_args g = {.struct_size = sizeof g, .m = n, .n = n, .k = n, .alpha = 1.0f,
                      .a = a, .lda = n, .b = b, .ldb = n, .c = c, .ldc = n, .batch = 1,
                      .ab_dtype = dtype, .c_dtype = VH_DTYPE_F32};
    if (dtype != VH_DTYPE_F32) { /* 16-bit inputs, converted on the device */
        size_t half = (size_t)(n * n) * 2;
        if (dev->alloc(dev->device, half, &a16) != VH_STATUS_OK ||
            dev->alloc(dev->device, half, &b16) != VH_STATUS_OK ||
            dev->convert(dev->device, a16, dtype, a, VH_DTYPE_F32, (size_t)(n * n), NULL) !=
                VH_STATUS_OK ||
            dev->convert(dev->device, b16, dtype, b, VH_DTYPE_F32, (size_t)(n * n), NULL) !=
                VH_STATUS_OK)
            goto done;
        g.a = a16;
        g.b = b16;
    }
    for (int rep = 0; rep < 12; rep++) { /* best of many: the machine may be busy */
        double t0 = progress_now();
        if (dev->gemm(dev->device, &g) != VH_STATUS_OK ||
            dev->synchronize(dev->device) != VH_STATUS_OK)
            break; /* a dtype the device refuses: 0 */
        double dt = progress_now() - t0;
        double tflops = 2.0 * (double)n * (double)n * (double)n / dt / 1e12;
        if (rep > 0 && tflops > best) best = tflops; /* the first warms up */
    }
done:
    if (a) dev->free(dev->device, a);
    if (b) dev->free(dev->device, b);
    if (c) dev->free(dev->device, c);
    if (a16) dev->free(dev->device, a16);
    if (b16) dev->free(dev->device, b16);
    free(host);
    return best;
}

double flops_probe_recheck(const vh_device_ops *dev, vh_dtype dtype, double peak, double rate) {
    for (int again = 0; again < 2 && peak > 0 && rate > peak; again++) {
        const double p = flops_probe_peak_tflops_dtype(dev, dtype);
        if (p > peak) peak = p;
    }
    return peak;
}
