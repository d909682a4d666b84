/* flops_probe.c - one f32 GEMM of 1024^3, timed through the device's gemm
 * op (see flops_probe.h). */
#define _POSIX_C_SOURCE 200809L
#include "flops_probe.h"

#include <stdlib.h>

#include "progress.h"

double flops_probe_peak_tflops(const vh_device_ops *dev) {
    if (!dev->gemm || !dev->synchronize) return 0.0;
    const int64_t n = 1024;
    size_t bytes = (size_t)(n * n) * sizeof(float);
    float *host = malloc(bytes);
    void *a = NULL, *b = NULL, *c = NULL;
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
                      .a = a, .lda = n, .b = b, .ldb = n, .c = c, .ldc = n, .batch = 1};
    for (int rep = 0; rep < 12; rep++) { /* best of many: the machine may be busy */
        double t0 = progress_now();
        if (dev->gemm(dev->device, &g) != VH_STATUS_OK ||
            dev->synchronize(dev->device) != VH_STATUS_OK)
            break;
        double dt = progress_now() - t0;
        double tflops = 2.0 * (double)n * (double)n * (double)n / dt / 1e12;
        if (rep > 0 && tflops > best) best = tflops; /* the first warms up */
    }
done:
    if (a) dev->free(dev->device, a);
    if (b) dev->free(dev->device, b);
    if (c) dev->free(dev->device, c);
    free(host);
    return best;
}
