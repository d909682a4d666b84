/* device.cu - the CUDA device: open, memory, copies, conversions, streams,
 * events, and the table of ops (cuda_internal.h lists the files behind it).
 *
 * Built into its own shared object (libvh_cuda.so) that the host dlopens only
 * when a recipe asks for `run.device: cuda`, so the CPU path never needs the
 * CUDA runtime or a driver. Compute ops (cuBLASLt GEMMs, fused kernels) join
 * this table as the SDK's device ops grow.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "vithost/vh_plugin.h"
#include "vithost/vh_runtime.h"
}

static vh_device g_devices[16];

cudaStream_t vh_cuda_stream(vh_device *dev, vh_stream *stream) {
    return stream ? stream->stream : dev->main.stream;
}

vh_status vh_cuda_alloc_temp(vh_device *dev, size_t bytes, void **out) {
    cudaSetDevice(dev->ordinal);
    return vh_cuda_status(cudaMalloc(out, bytes ? bytes : 1));
}

void vh_cuda_free_temp(vh_device *dev, void *ptr) {
    cudaSetDevice(dev->ordinal);
    cudaFree(ptr);
}

vh_status vh_cuda_status(cudaError_t err) {
    if (err == cudaSuccess) return VH_STATUS_OK;
    if (err == cudaErrorMemoryAllocation) return VH_STATUS_ERR_NOMEM;
    return VH_STATUS_ERR_DEVICE;
}

static vh_status cuda_alloc(vh_device *dev, size_t bytes, void **out) {
    cudaSetDevice(dev->ordinal);
    return vh_cuda_status(cudaMalloc(out, bytes ? bytes : 1));
}

static void cuda_free(vh_device *dev, void *ptr) {
    cudaSetDevice(dev->ordinal);
    cudaFree(ptr);
}

/* Every op runs on the device's one stream for now: `stream` is accepted and
 * not yet used (streams of their own come with the CUDA issue). */
static vh_status cuda_copy(vh_device *dev, void *dst, const void *src, size_t bytes,
                           vh_copy_kind kind, vh_stream *stream) {
    (void)stream;
    cudaMemcpyKind k = kind == VH_COPY_KIND_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                       : kind == VH_COPY_KIND_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, k, dev->main.stream);
    /* Host buffers may be reused as soon as this returns: wait for D2H/H2D. */
    if (err == cudaSuccess && k != cudaMemcpyDeviceToDevice)
        err = cudaStreamSynchronize(dev->main.stream);
    return vh_cuda_status(err);
}

static vh_status cuda_memset_zero(vh_device *dev, void *ptr, size_t bytes, vh_stream *stream) {
    (void)stream;
    return vh_cuda_status(cudaMemsetAsync(ptr, 0, bytes, dev->main.stream));
}

static vh_status cuda_synchronize(vh_device *dev) {
    return vh_cuda_status(cudaStreamSynchronize(dev->main.stream));
}

__device__ static float load_elem(const void *src, int dtype, size_t i) {
    if (dtype == VH_DTYPE_F16) return __half2float(((const __half *)src)[i]);
    if (dtype == VH_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
    return ((const float *)src)[i];
}

__device__ static void store_elem(void *dst, int dtype, size_t i, float x) {
    if (dtype == VH_DTYPE_F16) ((__half *)dst)[i] = __float2half_rn(x);
    else if (dtype == VH_DTYPE_BF16) ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(x);
    else ((float *)dst)[i] = x;
}

__global__ static void convert_kernel(void *dst, int dst_dtype, const void *src,
                                      int src_dtype, size_t count) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        store_elem(dst, dst_dtype, i, load_elem(src, src_dtype, i));
}

static vh_status cuda_convert(vh_device *dev, void *dst, vh_dtype dst_dtype, const void *src,
                              vh_dtype src_dtype, size_t count, vh_stream *stream) {
    (void)stream;
    if (dst_dtype > VH_DTYPE_BF16 || src_dtype > VH_DTYPE_BF16) return VH_STATUS_ERR_UNSUPPORTED;
    if (count == 0) return VH_STATUS_OK;
    size_t blocks = (count + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    convert_kernel<<<(unsigned)blocks, 256, 0, dev->main.stream>>>(dst, dst_dtype, src, src_dtype,
                                                              count);
    return vh_cuda_status(cudaGetLastError());
}

extern "C" VH_SDK_API vh_status vh_cuda_device_open(const vh_cuda_open_args *args,
                                                    vh_device_ops *out, size_t out_size,
                                                    char *err, size_t err_len) {
    vh_cuda_open_args a;
    if (!args || !out || !vh_struct_upgrade(&a, sizeof a, args)) {
        snprintf(err, err_len, "vh_cuda_device_open: no arguments");
        return VH_STATUS_ERR_INVALID_ARG;
    }
    if (a.abi_major != VH_ABI_MAJOR) {
        snprintf(err, err_len, "libvh_cuda is built for ABI %d, the host is ABI %d",
                 VH_ABI_MAJOR, (int)a.abi_major);
        return VH_STATUS_ERR_INVALID_ARG;
    }
    /* The caller's table may be older (smaller) than ours: fill what it has. */
    if (out_size < offsetof(vh_device_ops, gemm)) {
        snprintf(err, err_len, "vh_cuda_device_open: the caller's device table is too small");
        return VH_STATUS_ERR_INVALID_ARG;
    }
    const int ordinal = a.ordinal;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(err, err_len, "no CUDA device is usable here (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return VH_STATUS_ERR_DEVICE;
    }
    if (ordinal < 0 || ordinal >= count || ordinal >= 16) {
        snprintf(err, err_len, "CUDA device %d does not exist (this machine has %d)", ordinal,
                 count);
        return VH_STATUS_ERR_INVALID_ARG;
    }
    vh_device *dev = &g_devices[ordinal];
    dev->ordinal = ordinal;
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess ||
        (!dev->main.stream && (e = cudaStreamCreateWithFlags(&dev->main.stream, cudaStreamNonBlocking)) !=
                             cudaSuccess)) {
        snprintf(err, err_len, "CUDA device %d: %s", ordinal, cudaGetErrorString(e));
        return VH_STATUS_ERR_DEVICE;
    }
    static char names[16][16];
    snprintf(names[ordinal], sizeof names[ordinal], "cuda:%d", ordinal);
    vh_device_ops t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.kind = VH_DEVICE_KIND_CUDA;
    t.name = names[ordinal];
    t.device = dev;
    t.alloc = cuda_alloc;
    t.free = cuda_free;
    t.copy = cuda_copy;
    t.memset_zero = cuda_memset_zero;
    t.synchronize = cuda_synchronize;
    t.convert = cuda_convert;
    t.gemm = vh_cuda_gemm;
    t.layernorm_forward = vh_cuda_layernorm_forward;
    t.layernorm_backward = vh_cuda_layernorm_backward;
    t.gelu_forward = vh_cuda_gelu_forward;
    t.gelu_backward = vh_cuda_gelu_backward;
    t.add = vh_cuda_add;
    t.mul = vh_cuda_mul;
    t.dropout_forward = vh_cuda_dropout_forward;
    t.scale_rows = vh_cuda_scale_rows;
    t.bias_backward = vh_cuda_bias_backward;
    t.softmax = vh_cuda_softmax;
    t.attention_forward = vh_cuda_attention_forward;
    t.attention_backward = vh_cuda_attention_backward;
    t.softmax_cross_entropy = vh_cuda_softmax_cross_entropy;
    t.mean_pool_forward = vh_cuda_mean_pool_forward;
    t.mean_pool_backward = vh_cuda_mean_pool_backward;
    t.patchify = vh_cuda_patchify;
    t.embed_forward = vh_cuda_embed_forward;
    t.embed_backward = vh_cuda_embed_backward;
    t.multi_tensor_scale_check = vh_cuda_multi_tensor_scale_check;
    t.drop_path_scale = vh_cuda_drop_path_scale;
    const size_t n = out_size < sizeof t ? out_size : sizeof t;
    memcpy(out, &t, n);
    out->struct_size = (uint32_t)n;
    return VH_STATUS_OK;
}
