/* flops_probe.h - the device's peak for MFU when the recipe gives none
 * (run.peak_tflops): measured once, with a square GEMM through the
 * device's own gemm op, the op the model's matmuls go through. */
#ifndef VITHOST_HOST_FLOPS_PROBE_H
#define VITHOST_HOST_FLOPS_PROBE_H

#include "vithost/vh_device.h"

/* TFLOP/s of a GEMM with a and b in `dtype` (f32, bf16, f16; f32
 * accumulation and output), best of a few repetitions: the peak for a
 * policy's compute dtype. 0 when it cannot be measured or the device
 * refuses the dtype. */
double flops_probe_peak_tflops_dtype(const vh_device_ops *dev, vh_dtype dtype);

/* A probed peak below a rate the device has just run read a busy moment
 * (its MFU would print over 100%): probes again, twice at most while the
 * peak stays below `rate`, and returns the best of all. */
double flops_probe_recheck(const vh_device_ops *dev, vh_dtype dtype, double peak, double rate);

#endif
