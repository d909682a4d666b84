/* vh_types.h - element types, devices and the tensor view shared by all roles.
 *
 * A vh_tensor is a view: it never owns its memory. Whoever allocated the
 * bytes (the host, a sharding plugin, a model's activation arena) frees them.
 */
#ifndef VITHOST_VH_TYPES_H
#define VITHOST_VH_TYPES_H

#include "vh_export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_dtype {
    VH_DTYPE_F32 = 0,
    VH_DTYPE_F16 = 1,  /* IEEE half; a storage type on CPU, math in fp32 */
    VH_DTYPE_BF16 = 2, /* bfloat16; a storage type on CPU, math in fp32 */
    VH_DTYPE_I32 = 3,
    VH_DTYPE_I64 = 4,
    VH_DTYPE_U8 = 5,
    VH_DTYPE_F64 = 6,  /* for host-side sums (metrics) */
    VH_DTYPE_COUNT
} vh_dtype;

/* Bytes per element; 0 for an unknown dtype. */
VH_SDK_API size_t vh_dtype_size(vh_dtype dtype);
/* "f32", "f16", "bf16", ...; "?" for an unknown dtype. */
VH_SDK_API const char *vh_dtype_name(vh_dtype dtype);

typedef enum vh_device_kind {
    VH_DEVICE_KIND_CPU = 0,
    VH_DEVICE_KIND_CUDA = 1,
} vh_device_kind;

#define VH_TENSOR_MAX_DIMS 6

typedef struct vh_tensor {
    void *data;
    vh_dtype dtype;
    vh_device_kind device;
    int32_t ndim;
    int64_t shape[VH_TENSOR_MAX_DIMS]; /* contiguous, row-major */
} vh_tensor;

/* Number of elements of a view (1 for ndim == 0). */
VH_SDK_API int64_t vh_tensor_numel(const vh_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
