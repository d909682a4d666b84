/* flops_probe.h - the device's peak for MFU when the recipe gives none
 * (run.peak_tflops): measured once, with a square f32 GEMM through the
 * device's own gemm op, the op the model's matmuls go through. */
#ifndef VITHOST_HOST_FLOPS_PROBE_H
#define VITHOST_HOST_FLOPS_PROBE_H

#include "vithost/vh_device.h"

/* TFLOP/s, best of a few repetitions; 0 when it cannot be measured. */
double flops_probe_peak_tflops(const vh_device_ops *dev);

#endif
