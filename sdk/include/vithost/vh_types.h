/* vh_types.h - element types, devices, the tensor view, and the rules every
 * versioned struct of the ABI follows.
 *
 * A vh_tensor is a view: it never owns its memory. Whoever allocated the
 * bytes (the host, a sharding plugin, a model's activation arena) frees them.
 *
 * Versioned structs. Every struct that crosses the ABI and may grow starts
 * with `uint32_t struct_size`, set by whoever fills it to sizeof of *its*
 * SDK's struct. Members are only ever appended, in a new minor version. A
 * reader that is newer than the writer treats every member past struct_size
 * as zero, so each member's zero is its default (VH_DTYPE_F32 is 0 for that
 * reason); vh_struct_upgrade does exactly that. A reader that is older simply
 * never looks past its own size. No versioned struct is ever embedded by value
 * in another one: they are passed and held by pointer.
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
    /* No count here: a count would move with every minor that adds a dtype.
     * Readers meet unknown values (vh_dtype_size() == 0) and refuse them. */
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

/* Enums in ABI structs. A C enum's size is the compiler's choice, so every
 * struct member that holds an enum value is an int32_t (its comment names the
 * enum); enums appear by name only in function parameters and locals.
 *
 * A plain value, embedded by value in vh_batch and vh_model_output, and so
 * FROZEN for every ABI 2.x (as DLPack's DLTensor): it has no struct_size and
 * never grows. A richer view would be a new type with its own name. */
typedef struct vh_tensor {
    void *data;
    int32_t dtype; /* vh_dtype */
    int32_t device; /* vh_device_kind */
    int32_t ndim;
    int64_t shape[VH_TENSOR_MAX_DIMS]; /* contiguous, row-major */
} vh_tensor;

/* Number of elements of a view (1 for ndim == 0). */
VH_SDK_API int64_t vh_tensor_numel(const vh_tensor *t);

/* Scalar conversions, round to nearest even; NaN stays NaN, Inf stays Inf,
 * subnormals are kept (no flush to zero). */
VH_SDK_API uint16_t vh_f32_to_f16(float x);
VH_SDK_API float vh_f16_to_f32(uint16_t h);
VH_SDK_API uint16_t vh_f32_to_bf16(float x);
VH_SDK_API float vh_bf16_to_f32(uint16_t h);

/* The same conversions over n values in host memory, vectorised, on the
 * caller's thread, the bits of the scalar ones (ABI 2.9): dst = src widened
 * from src_dtype, or rounded to dst_dtype (f32, f16 or bf16; f32 to f32 is
 * a copy). For a plugin's own loops over 16-bit rows (mta's masters,
 * gradients and compute copies), where a call per element costs more than
 * the work. */
VH_SDK_API void vh_convert_to_f32(float *dst, const void *src, vh_dtype src_dtype, int64_t n);
VH_SDK_API void vh_convert_from_f32(void *dst, vh_dtype dst_dtype, const float *src, int64_t n);

/* 1 for f32, f16 and bf16: the dtypes the compute ops take. */
VH_SDK_API int vh_dtype_is_float(vh_dtype dtype);

/* Does a versioned struct, as its writer sized it, hold `member`? */
#define VH_STRUCT_HAS(ptr, type, member) \
    ((ptr)->struct_size >= offsetof(type, member) + sizeof(((type *)0)->member))

/* Copies a versioned struct written by an older or newer writer into the
 * reader's own struct of dst_size bytes: min(src->struct_size, dst_size)
 * bytes, the rest zero (the defaults), and dst's struct_size set to dst_size.
 * src must start with uint32_t struct_size. Returns 0 and copies nothing
 * when src is NULL or its struct_size is smaller than 4. */
VH_SDK_API int vh_struct_upgrade(void *dst, size_t dst_size, const void *src);

#ifdef __cplusplus
}
#endif
#endif
