/* device_cpu.c - the CPU device: host memory, and the compute ops of
 * src/cpu/ (OpenBLAS GEMMs, OpenMP loops). The reference every other device
 * is checked against. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "vithost/vh_runtime.h"

static vh_status cpu_alloc(vh_device *dev, size_t bytes, void **out) {
    (void)dev;
    /* aligned_alloc needs a size that is a multiple of the alignment. */
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) return VH_STATUS_ERR_NOMEM;
    *out = p;
    return VH_STATUS_OK;
}

static void cpu_free(vh_device *dev, void *ptr) {
    (void)dev;
    free(ptr);
}

static vh_status cpu_copy(vh_device *dev, void *dst, const void *src, size_t bytes,
                          vh_copy_kind kind) {
    (void)dev;
    (void)kind; /* one address space on the CPU */
    if (bytes) memmove(dst, src, bytes);
    return VH_STATUS_OK;
}

static vh_status cpu_memset_zero(vh_device *dev, void *ptr, size_t bytes) {
    (void)dev;
    if (bytes) memset(ptr, 0, bytes);
    return VH_STATUS_OK;
}

static vh_status cpu_synchronize(vh_device *dev) {
    (void)dev;
    return VH_STATUS_OK;
}

static int is_float_dtype(vh_dtype t) {
    return t == VH_DTYPE_F32 || t == VH_DTYPE_F16 || t == VH_DTYPE_BF16;
}

static float load_elem(const void *src, vh_dtype t, size_t i) {
    switch (t) {
    case VH_DTYPE_F16: return vh_f16_to_f32(((const uint16_t *)src)[i]);
    case VH_DTYPE_BF16: return vh_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

static void store_elem(void *dst, vh_dtype t, size_t i, float x) {
    switch (t) {
    case VH_DTYPE_F16: ((uint16_t *)dst)[i] = vh_f32_to_f16(x); break;
    case VH_DTYPE_BF16: ((uint16_t *)dst)[i] = vh_f32_to_bf16(x); break;
    default: ((float *)dst)[i] = x; break;
    }
}

static vh_status cpu_convert(vh_device *dev, void *dst, vh_dtype dst_dtype,
                             const void *src, vh_dtype src_dtype, size_t count) {
    (void)dev;
    if (!is_float_dtype(dst_dtype) || !is_float_dtype(src_dtype))
        return VH_STATUS_ERR_UNSUPPORTED;
    if (dst_dtype == src_dtype) {
        memmove(dst, src, count * vh_dtype_size(dst_dtype));
        return VH_STATUS_OK;
    }
    /* Every path goes through fp32, as the hardware would. */
    for (size_t i = 0; i < count; i++)
        store_elem(dst, dst_dtype, i, load_elem(src, src_dtype, i));
    return VH_STATUS_OK;
}

static const vh_device_ops cpu_ops = {
    .struct_size = sizeof(vh_device_ops),
    .kind = VH_DEVICE_KIND_CPU,
    .name = "cpu",
    .device = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .synchronize = cpu_synchronize,
    .convert = cpu_convert,
    .gemm = vh_cpu_gemm,
    .layernorm_forward = vh_cpu_layernorm_forward,
    .layernorm_backward = vh_cpu_layernorm_backward,
    .gelu_forward = vh_cpu_gelu_forward,
    .gelu_backward = vh_cpu_gelu_backward,
    .add = vh_cpu_add,
    .bias_backward = vh_cpu_bias_backward,
    .softmax = vh_cpu_softmax,
    .attention_forward = vh_cpu_attention_forward,
    .attention_backward = vh_cpu_attention_backward,
    .softmax_cross_entropy = vh_cpu_softmax_cross_entropy,
    .mean_pool_forward = vh_cpu_mean_pool_forward,
    .mean_pool_backward = vh_cpu_mean_pool_backward,
    .patchify = vh_cpu_patchify,
    .embed_forward = vh_cpu_embed_forward,
    .embed_backward = vh_cpu_embed_backward,
    .scale_rows = vh_cpu_scale_rows,
    .dropout_forward = vh_cpu_dropout_forward,
    .mul = vh_cpu_mul,
};

const vh_device_ops *vh_cpu_device_ops(void) { return &cpu_ops; }
