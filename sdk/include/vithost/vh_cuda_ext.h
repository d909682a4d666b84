/* vh_cuda_ext.h - extensions of the CUDA device (vh_device_ops.get_extension
 * of libvh_cuda.so), read through struct_size like every versioned struct.
 *
 * "vh.cuda.memory": the caching allocator's counters, so that the host can
 * report a run's peak device memory in its metrics. Every block the device
 * hands out (alloc, workspaces, ops' temporaries) is counted; the cuBLASLt
 * workspaces and the CUDA context are not. A device other than CUDA answers
 * NULL for this name. */
#ifndef VITHOST_VH_CUDA_EXT_H
#define VITHOST_VH_CUDA_EXT_H

#include <stddef.h>
#include <stdint.h>

#include "vh_device.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VH_CUDA_MEMORY_EXTENSION "vh.cuda.memory"

typedef struct vh_cuda_memory_info {
    uint32_t struct_size;    /* set by the caller: sizeof what it has */
    uint64_t bytes_in_use;   /* handed out now (sizes rounded as the allocator does) */
    uint64_t peak_bytes;     /* the most bytes_in_use has been, since open or reset_peak */
    uint64_t reserved_bytes; /* held from cudaMalloc: in use + cached */
} vh_cuda_memory_info;

typedef struct vh_cuda_memory {
    uint32_t struct_size;
    /* Fills *out up to out->struct_size. Any thread, any time. */
    vh_status (*read)(vh_device *dev, vh_cuda_memory_info *out);
    /* peak_bytes = bytes_in_use from now on (e.g. after the first step). */
    void (*reset_peak)(vh_device *dev);
    /* Returns the cached blocks to cudaFree (synchronizes the device). */
    void (*trim)(vh_device *dev);
} vh_cuda_memory;

#ifdef __cplusplus
}
#endif
#endif
