/* cuda_internal.h - what the files of libvh_cuda.so share (never installed).
 *
 * The library is one vh_device_ops table (vh_device.h) split by job:
 *   device.cu       open, memory, copies, conversions, streams, events, the table
 *   cache_alloc.c   the caching allocator's bookkeeping (plain C, tested on the CPU)
 *   shape_cache.c   shape-keyed caches of matmul descriptors (plain C, tested on the CPU)
 *   gemm.cu         GEMMs through cuBLASLt, epilogues, per-shape plans
 *   eltwise.cu      GELU, add, mul, dropout, scale_rows, drop_path_scale, bias
 *                   gradient, softmax
 *   layernorm.cu    layer norm forward and backward
 *   tokens.cu       patchify, embedding, mean pooling
 *   loss.cu         softmax cross-entropy
 *   multi_tensor.cu the overflow check / gradient norm
 *   attention.cu    attention forward and backward: the entry points, the tiled/fused path
 *   attention_gemm.cu  the attention's products through cuBLASLt (the default path)
 *   optim.cu        the multi-tensor optimizer updates (extension "vh.cuda.mta")
 * Each op file defines its vh_cuda_<op> entry points below; device.cu puts
 * them in the table. Semantics are the CPU engine's (sdk/src/cpu/), which the
 * GPU tests (tests/cuda/) compare against. */
#ifndef VH_CUDA_INTERNAL_H
#define VH_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "vithost/vh_device.h"
#include "vithost/vh_types.h"
#include "cache_alloc.h"
#include "launch.h"
}

/* One stream object per vh_stream; the device's default stream is one too. */
struct vh_stream {
    cudaStream_t stream;
};

/* `event` stays the first member: libvh_comm_nccl.so (sdk/comm_nccl/comm_nccl.c,
 * plain C) reads it to order its collectives after the caller's stream. */
struct vh_event {
    cudaEvent_t event;
};

typedef struct vh_cuda_gemm_state vh_cuda_gemm_state; /* gemm.cu */

/* vh_device_ops.workspace: one buffer per stream (a buffer shared by two
 * streams would race), from the caching allocator. */
#define VH_CUDA_MAX_WORKSPACES 16
typedef struct vh_cuda_workspace {
    cudaStream_t stream; /* NULL: slot free */
    void *ptr;
    size_t bytes;
} vh_cuda_workspace;

struct vh_device {
    int ordinal;
    int opened;                /* set once by the first open (device.cu) */
    vh_stream main;            /* the default stream (non-blocking) */
    vh_cuda_alloc allocator;   /* caching allocator over cudaMalloc */
    vh_cuda_workspace workspaces[VH_CUDA_MAX_WORKSPACES]; /* under ws_mutex */
    void *ws_mutex;            /* a pthread_mutex_t (device.cu) */
    vh_cuda_gemm_state *gemm;  /* cuBLASLt handle, workspace and plan cache */
    int sm_count;              /* multiprocessors, for grid sizes */
};

/* The stream an op runs on: the one it names, else the calling thread's
 * current stream for this device (stream_set), else the default stream. */
cudaStream_t vh_cuda_stream(vh_device *dev, vh_stream *stream);

vh_status vh_cuda_status(cudaError_t err);
/* The status of the launch just issued (cudaGetLastError). */
static inline vh_status vh_cuda_launched(void) { return vh_cuda_status(cudaGetLastError()); }

/* Device memory from the caching allocator, freed to its cache. For an op's
 * temporary buffers: ordered on a stream (the block is reused only by work
 * issued after the free on the same stream, or after a synchronize of that
 * stream or the device). vh_cuda_alloc_temp orders on the calling thread's
 * current stream; an op that runs on a stream it was given uses
 * vh_cuda_alloc_temp_on with that stream. Free both with vh_cuda_free_temp
 * once the op's work is issued (no synchronize needed). */
vh_status vh_cuda_alloc_temp(vh_device *dev, size_t bytes, void **out);
vh_status vh_cuda_alloc_temp_on(vh_device *dev, cudaStream_t stream, size_t bytes, void **out);
void vh_cuda_free_temp(vh_device *dev, void *ptr);

/* Reads a caller's argument struct of any minor into *dst (zeroes what an
 * older caller lacks); 0 when in is NULL or too small to hold min_size. */
static inline int vh_cuda_read_args(void *dst, size_t dst_size, size_t min_size, const void *in) {
    uint32_t size;
    if (!in) return 0;
    memcpy(&size, in, sizeof size);
    return size >= min_size && vh_struct_upgrade(dst, dst_size, in);
}
#define VH_CUDA_READ_ARGS(type, in, out) \
    vh_cuda_read_args(&(out), sizeof(type), offsetof(type, stream), (in))

static inline int vh_cuda_is_float(int32_t dtype) {
    return dtype == VH_DTYPE_F32 || dtype == VH_DTYPE_F16 || dtype == VH_DTYPE_BF16;
}

/* Element i of a tensor of `dtype` as fp32, and a value stored rounded to
 * nearest even: every op's loads and stores go through these two. */
__device__ __forceinline__ float vh_cuda_load(const void *p, int32_t dtype, int64_t i) {
    if (dtype == VH_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dtype == VH_DTYPE_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void vh_cuda_store(void *p, int32_t dtype, int64_t i, float v) {
    if (dtype == VH_DTYPE_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dtype == VH_DTYPE_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}

/* ---- the ops, one file each group (see the top of this file) ---- */
vh_status vh_cuda_gemm(vh_device *dev, const vh_gemm_args *args);
void vh_cuda_gemm_state_free(vh_cuda_gemm_state *s);
vh_status vh_cuda_layernorm_forward(vh_device *dev, const vh_layernorm_args *args);
vh_status vh_cuda_layernorm_backward(vh_device *dev, const vh_layernorm_args *args);
vh_status vh_cuda_gelu_forward(vh_device *dev, const vh_eltwise_args *args);
vh_status vh_cuda_gelu_backward(vh_device *dev, const vh_eltwise_args *args);
vh_status vh_cuda_add(vh_device *dev, const vh_eltwise_args *args);
vh_status vh_cuda_mul(vh_device *dev, const vh_eltwise_args *args);
vh_status vh_cuda_dropout_forward(vh_device *dev, const vh_eltwise_args *args);
vh_status vh_cuda_scale_rows(vh_device *dev, const vh_eltwise_args *args);
vh_status vh_cuda_drop_path_scale(vh_device *dev, const vh_eltwise_args *args);
vh_status vh_cuda_bias_backward(vh_device *dev, const vh_rows_args *args);
vh_status vh_cuda_softmax(vh_device *dev, const vh_rows_args *args);
vh_status vh_cuda_attention_forward(vh_device *dev, const vh_attention_args *args);
vh_status vh_cuda_attention_backward(vh_device *dev, const vh_attention_args *args);
/* attention_gemm.cu, for attention.cu's entry points (arguments checked). */
/* 0 where VITHOST_CUDA_ATTENTION=tiled asks for the simple path. */
int vh_cuda_attention_gemm_applies(void);
vh_status vh_cuda_attention_forward_gemm(vh_device *dev, const vh_attention_args *a,
                                         cudaStream_t s);
vh_status vh_cuda_attention_backward_gemm(vh_device *dev, const vh_attention_args *a,
                                          cudaStream_t s);
vh_status vh_cuda_softmax_cross_entropy(vh_device *dev, const vh_xent_args *args);
vh_status vh_cuda_mean_pool_forward(vh_device *dev, const vh_tokens_args *args);
vh_status vh_cuda_mean_pool_backward(vh_device *dev, const vh_tokens_args *args);
vh_status vh_cuda_patchify(vh_device *dev, const vh_tokens_args *args);
vh_status vh_cuda_embed_forward(vh_device *dev, const vh_tokens_args *args);
vh_status vh_cuda_embed_backward(vh_device *dev, const vh_tokens_args *args);
vh_status vh_cuda_multi_tensor_scale_check(vh_device *dev, const vh_multi_tensor_args *args);
/* optim.cu: the "vh.cuda.mta" extension (vh_cuda_mta.h), or NULL. */
const void *vh_cuda_mta_extension(void);

#endif
