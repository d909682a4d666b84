/* device.cu - the CUDA device: open, memory, copies, conversions, streams,
 * events, and the table of ops (cuda_internal.h lists the files behind it).
 *
 * Built into its own shared object (libvh_cuda.so) that the host dlopens only
 * when a recipe asks for `run.device: cuda`, so the CPU path never needs the
 * CUDA runtime or a driver.
 *
 * Memory comes from the caching allocator (cache_alloc.h) over cudaMalloc,
 * its blocks tagged with the stream they were got on. Streams are
 * non-blocking; each thread has its own current stream per device
 * (stream_set), the device's default stream until it sets one. Synchronizing
 * a stream (or the device) releases the allocator's blocks freed on it to
 * every stream.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "vithost/vh_cuda_ext.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_runtime.h"
}

#define VH_CUDA_MAX_DEVICES 16

static vh_device g_devices[VH_CUDA_MAX_DEVICES];
static pthread_mutex_t g_ws_mutex[VH_CUDA_MAX_DEVICES];
static pthread_mutex_t g_open_mutex = PTHREAD_MUTEX_INITIALIZER;
/* The calling thread's current stream of each device (NULL: the default). */
static thread_local vh_stream *t_current[VH_CUDA_MAX_DEVICES];

vh_status vh_cuda_status(cudaError_t err) {
    if (err == cudaSuccess) return VH_STATUS_OK;
    if (err == cudaErrorMemoryAllocation) return VH_STATUS_ERR_NOMEM;
    return VH_STATUS_ERR_DEVICE;
}

cudaStream_t vh_cuda_stream(vh_device *dev, vh_stream *stream) {
    if (stream) return stream->stream;
    vh_stream *cur = t_current[dev->ordinal];
    return cur ? cur->stream : dev->main.stream;
}

/* ---- memory ---------------------------------------------------------------- */

static int backend_malloc(void *ctx, size_t bytes, void **out) {
    cudaSetDevice(((vh_device *)ctx)->ordinal);
    const cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) cudaGetLastError(); /* not sticky: clear it for the next launch check */
    return e == cudaSuccess ? 0 : (int)e;
}

/* cudaFree waits for the device's pending work, so a cached block freed here
 * (a trim) is never still in use by a kernel. */
static void backend_free(void *ctx, void *ptr) {
    cudaSetDevice(((vh_device *)ctx)->ordinal);
    cudaFree(ptr);
}

vh_status vh_cuda_alloc_temp_on(vh_device *dev, cudaStream_t stream, size_t bytes, void **out) {
    return vh_cuda_alloc_get(&dev->allocator, bytes, (const void *)stream, out);
}

vh_status vh_cuda_alloc_temp(vh_device *dev, size_t bytes, void **out) {
    return vh_cuda_alloc_temp_on(dev, vh_cuda_stream(dev, NULL), bytes, out);
}

void vh_cuda_free_temp(vh_device *dev, void *ptr) { (void)vh_cuda_alloc_put(&dev->allocator, ptr); }

/* Blocks are at least 256-byte aligned (cudaMalloc's), over the 64 the table
 * promises. A block freed here is reused by later work on the stream it was
 * allocated on, or by any stream after a synchronize. */
static vh_status cuda_alloc(vh_device *dev, size_t bytes, void **out) {
    return vh_cuda_alloc_temp(dev, bytes, out);
}

static void cuda_free(vh_device *dev, void *ptr) {
    if (vh_cuda_alloc_put(&dev->allocator, ptr) != VH_STATUS_OK)
        fprintf(stderr, "vh_cuda: free of %p, which this device did not allocate (or freed twice)\n",
                ptr);
}

static vh_status cuda_host_alloc(vh_device *dev, size_t bytes, void **out) {
    cudaSetDevice(dev->ordinal);
    return vh_cuda_status(cudaMallocHost(out, bytes ? bytes : 1));
}

static void cuda_host_free(vh_device *dev, void *ptr) {
    cudaSetDevice(dev->ordinal);
    if (ptr) cudaFreeHost(ptr);
}

/* The stream's slot, taken when absent; NULL when every slot is taken. */
static vh_cuda_workspace *workspace_slot(vh_device *dev, cudaStream_t s) {
    vh_cuda_workspace *free_slot = NULL;
    for (int i = 0; i < VH_CUDA_MAX_WORKSPACES; i++) {
        if (dev->workspaces[i].stream == s) return &dev->workspaces[i];
        if (!dev->workspaces[i].stream && !free_slot) free_slot = &dev->workspaces[i];
    }
    if (free_slot) *free_slot = (vh_cuda_workspace){s, NULL, 0};
    return free_slot;
}

/* Grown on demand: the old buffer goes back to the allocator tagged with the
 * stream, so only work issued after this call on that stream (or any after a
 * synchronize) can reuse it while the stream's earlier ops may still read it. */
static vh_status cuda_workspace(vh_device *dev, size_t bytes, vh_stream *stream, void **out) {
    const cudaStream_t s = vh_cuda_stream(dev, stream);
    vh_status st = VH_STATUS_OK;
    pthread_mutex_lock((pthread_mutex_t *)dev->ws_mutex);
    vh_cuda_workspace *w = workspace_slot(dev, s);
    if (!w) {
        st = VH_STATUS_ERR_UNSUPPORTED; /* more streams than slots */
    } else if (w->bytes < bytes || !w->ptr) {
        void *p = NULL;
        vh_cuda_free_temp(dev, w->ptr);
        w->ptr = NULL, w->bytes = 0;
        st = vh_cuda_alloc_temp_on(dev, s, bytes, &p);
        if (st == VH_STATUS_OK) w->ptr = p, w->bytes = vh_cuda_alloc_round(bytes);
    }
    *out = st == VH_STATUS_OK ? w->ptr : NULL;
    pthread_mutex_unlock((pthread_mutex_t *)dev->ws_mutex);
    return st;
}

/* The stream's workspace back to the allocator (stream_destroy). */
static void workspace_drop(vh_device *dev, cudaStream_t s) {
    pthread_mutex_lock((pthread_mutex_t *)dev->ws_mutex);
    for (int i = 0; i < VH_CUDA_MAX_WORKSPACES; i++) {
        vh_cuda_workspace *w = &dev->workspaces[i];
        if (w->stream != s) continue;
        vh_cuda_free_temp(dev, w->ptr);
        *w = (vh_cuda_workspace){NULL, NULL, 0};
    }
    pthread_mutex_unlock((pthread_mutex_t *)dev->ws_mutex);
}

/* ---- copies and conversions ------------------------------------------------- */

/* Page-locked (cudaMallocHost or registered) host memory? */
static int host_is_pinned(const void *p) {
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError(); /* older drivers fail on unregistered memory: not sticky */
        return 0;
    }
    return at.type == cudaMemoryTypeHost;
}

/* Ordered on the stream. A copy from or to pageable host memory waits for
 * the stream (the caller may reuse the buffer when this returns); one with
 * pinned host memory stays asynchronous, as the table says. */
static vh_status cuda_copy(vh_device *dev, void *dst, const void *src, size_t bytes,
                           vh_copy_kind kind, vh_stream *stream) {
    if (bytes == 0) return VH_STATUS_OK;
    if (!dst || !src) return VH_STATUS_ERR_INVALID_ARG;
    const cudaStream_t s = vh_cuda_stream(dev, stream);
    cudaMemcpyKind k = kind == VH_COPY_KIND_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                       : kind == VH_COPY_KIND_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
    const void *host = k == cudaMemcpyHostToDevice ? src : k == cudaMemcpyDeviceToHost ? dst : NULL;
    cudaSetDevice(dev->ordinal);
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, k, s);
    if (err == cudaSuccess && host && !host_is_pinned(host)) err = cudaStreamSynchronize(s);
    return vh_cuda_status(err);
}

static vh_status cuda_memset_zero(vh_device *dev, void *ptr, size_t bytes, vh_stream *stream) {
    if (bytes == 0) return VH_STATUS_OK;
    if (!ptr) return VH_STATUS_ERR_INVALID_ARG;
    return vh_cuda_status(cudaMemsetAsync(ptr, 0, bytes, vh_cuda_stream(dev, stream)));
}

/* Four values of T in one 8- or 16-byte load or store. */
template <typename T> struct alignas(4 * sizeof(T)) vec4 {
    T v[4];
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_f32(float *d, float x) { *d = x; }
__device__ __forceinline__ void from_f32(__nv_bfloat16 *d, float x) { *d = __float2bfloat16_rn(x); }
__device__ __forceinline__ void from_f32(__half *d, float x) { *d = __float2half_rn(x); }

/* Grid-stride over groups of 4 elements: thread i converts groups i,
 * i + grid, ...; the caller has checked that both pointers are aligned to a
 * group and handles the count % 4 tail with convert_tail_kernel. */
template <typename S, typename D>
__global__ void convert_vec4_kernel(D *dst, const S *src, int64_t groups) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        const vec4<S> in = ((const vec4<S> *)src)[g];
        vec4<D> out;
#pragma unroll
        for (int j = 0; j < 4; j++) from_f32(&out.v[j], to_f32(in.v[j]));
        ((vec4<D> *)dst)[g] = out;
    }
}

/* Element-wise grid-stride fallback (unaligned pointers, the tail). */
__global__ static void convert_tail_kernel(void *dst, int32_t dst_dtype, const void *src,
                                           int32_t src_dtype, int64_t first, int64_t count) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = first + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        vh_cuda_store(dst, dst_dtype, i, vh_cuda_load(src, src_dtype, i));
}

template <typename S, typename D>
static void launch_vec4(void *dst, const void *src, int64_t groups, cudaStream_t s) {
    convert_vec4_kernel<S, D><<<vh_cuda_eltwise_blocks(groups), VH_CUDA_THREADS, 0, s>>>(
        (D *)dst, (const S *)src, groups);
}

template <typename S> static void launch_vec4_from(void *dst, int32_t dt, const void *src,
                                                   int64_t groups, cudaStream_t s) {
    if (dt == VH_DTYPE_F32) launch_vec4<S, float>(dst, src, groups, s);
    else if (dt == VH_DTYPE_BF16) launch_vec4<S, __nv_bfloat16>(dst, src, groups, s);
    else launch_vec4<S, __half>(dst, src, groups, s);
}

static vh_status cuda_convert(vh_device *dev, void *dst, vh_dtype dst_dtype, const void *src,
                              vh_dtype src_dtype, size_t count, vh_stream *stream) {
    if (!vh_cuda_is_float(dst_dtype) || !vh_cuda_is_float(src_dtype))
        return VH_STATUS_ERR_UNSUPPORTED;
    if (count == 0) return VH_STATUS_OK;
    if (!dst || !src) return VH_STATUS_ERR_INVALID_ARG;
    const cudaStream_t s = vh_cuda_stream(dev, stream);
    const size_t ds = vh_dtype_size(dst_dtype), ss = vh_dtype_size(src_dtype);
    if (dst_dtype == src_dtype)
        return dst == src ? VH_STATUS_OK
                          : vh_cuda_status(cudaMemcpyAsync(dst, src, count * ds,
                                                           cudaMemcpyDeviceToDevice, s));
    const int aligned = (uintptr_t)dst % (4 * ds) == 0 && (uintptr_t)src % (4 * ss) == 0;
    const int64_t n = (int64_t)count, groups = aligned ? n / 4 : 0;
    if (groups > 0) {
        if (src_dtype == VH_DTYPE_F32) launch_vec4_from<float>(dst, dst_dtype, src, groups, s);
        else if (src_dtype == VH_DTYPE_BF16)
            launch_vec4_from<__nv_bfloat16>(dst, dst_dtype, src, groups, s);
        else launch_vec4_from<__half>(dst, dst_dtype, src, groups, s);
        vh_status st = vh_cuda_launched();
        if (st != VH_STATUS_OK) return st;
    }
    if (4 * groups < n) {
        convert_tail_kernel<<<vh_cuda_eltwise_blocks(n - 4 * groups), VH_CUDA_THREADS, 0, s>>>(
            dst, dst_dtype, src, src_dtype, 4 * groups, n);
        return vh_cuda_launched();
    }
    return VH_STATUS_OK;
}

/* ---- streams and events ------------------------------------------------------ */

/* Every stream of the device: its frees are safe for any stream now. */
static vh_status cuda_synchronize(vh_device *dev) {
    cudaSetDevice(dev->ordinal);
    const vh_status st = vh_cuda_status(cudaDeviceSynchronize());
    if (st == VH_STATUS_OK) vh_cuda_alloc_release(&dev->allocator, NULL);
    return st;
}

static vh_status cuda_stream_create(vh_device *dev, vh_stream **out) {
    if (!out) return VH_STATUS_ERR_INVALID_ARG;
    *out = NULL;
    vh_stream *s = (vh_stream *)calloc(1, sizeof *s);
    if (!s) return VH_STATUS_ERR_NOMEM;
    cudaSetDevice(dev->ordinal);
    const cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(s);
        return vh_cuda_status(e);
    }
    *out = s;
    return VH_STATUS_OK;
}

/* Waits for the stream first: its workspace and the blocks freed on it go
 * back to every stream, and a later stream that gets the same handle cannot
 * be mistaken for it. */
static void cuda_stream_destroy(vh_device *dev, vh_stream *stream) {
    if (!stream || stream == &dev->main) return;
    cudaSetDevice(dev->ordinal);
    cudaStreamSynchronize(stream->stream);
    workspace_drop(dev, stream->stream);
    vh_cuda_alloc_release(&dev->allocator, (const void *)stream->stream);
    if (t_current[dev->ordinal] == stream) t_current[dev->ordinal] = NULL;
    cudaStreamDestroy(stream->stream);
    free(stream);
}

static vh_status cuda_stream_set(vh_device *dev, vh_stream *stream, vh_stream **previous) {
    if (previous) *previous = t_current[dev->ordinal];
    t_current[dev->ordinal] = stream == &dev->main ? NULL : stream;
    return VH_STATUS_OK;
}

static vh_status cuda_stream_synchronize(vh_device *dev, vh_stream *stream) {
    const cudaStream_t s = vh_cuda_stream(dev, stream);
    const vh_status st = vh_cuda_status(cudaStreamSynchronize(s));
    if (st == VH_STATUS_OK) vh_cuda_alloc_release(&dev->allocator, (const void *)s);
    return st;
}

static vh_status cuda_event_create(vh_device *dev, vh_event **out) {
    if (!out) return VH_STATUS_ERR_INVALID_ARG;
    *out = NULL;
    vh_event *ev = (vh_event *)calloc(1, sizeof *ev);
    if (!ev) return VH_STATUS_ERR_NOMEM;
    cudaSetDevice(dev->ordinal);
    const cudaError_t e = cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(ev);
        return vh_cuda_status(e);
    }
    *out = ev;
    return VH_STATUS_OK;
}

static void cuda_event_destroy(vh_device *dev, vh_event *event) {
    (void)dev;
    if (!event) return;
    cudaEventDestroy(event->event); /* safe while pending: released when it completes */
    free(event);
}

static vh_status cuda_event_record(vh_device *dev, vh_event *event, vh_stream *stream) {
    if (!event) return VH_STATUS_ERR_INVALID_ARG;
    return vh_cuda_status(cudaEventRecord(event->event, vh_cuda_stream(dev, stream)));
}

static vh_status cuda_stream_wait_event(vh_device *dev, vh_stream *stream, vh_event *event) {
    if (!event) return VH_STATUS_ERR_INVALID_ARG;
    return vh_cuda_status(cudaStreamWaitEvent(vh_cuda_stream(dev, stream), event->event, 0));
}

static vh_status cuda_event_synchronize(vh_device *dev, vh_event *event) {
    (void)dev;
    if (!event) return VH_STATUS_ERR_INVALID_ARG;
    return vh_cuda_status(cudaEventSynchronize(event->event));
}

static vh_status cuda_event_query(vh_device *dev, vh_event *event, int *done) {
    (void)dev;
    if (!event || !done) return VH_STATUS_ERR_INVALID_ARG;
    const cudaError_t e = cudaEventQuery(event->event);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady) {
        /* "not yet" is no error: keep it out of the next launch check */
        if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
        return VH_STATUS_OK;
    }
    return vh_cuda_status(e);
}

/* ---- extensions ------------------------------------------------------------- */

static vh_status memory_read(vh_device *dev, vh_cuda_memory_info *out) {
    if (!dev || !out || out->struct_size < sizeof(uint32_t)) return VH_STATUS_ERR_INVALID_ARG;
    vh_cuda_alloc_stats s;
    vh_cuda_alloc_get_stats(&dev->allocator, &s);
    vh_cuda_memory_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    info.bytes_in_use = s.bytes_in_use;
    info.peak_bytes = s.peak_bytes;
    info.reserved_bytes = s.reserved_bytes;
    const size_t n = out->struct_size < sizeof info ? out->struct_size : sizeof info;
    memcpy(out, &info, n);
    out->struct_size = (uint32_t)n;
    return VH_STATUS_OK;
}

static void memory_reset_peak(vh_device *dev) { vh_cuda_alloc_reset_peak(&dev->allocator); }

static void memory_trim(vh_device *dev) {
    cudaSetDevice(dev->ordinal);
    cudaDeviceSynchronize();
    vh_cuda_alloc_release(&dev->allocator, NULL);
    vh_cuda_alloc_trim(&dev->allocator);
}

static const vh_cuda_memory g_memory_ext = {sizeof(vh_cuda_memory), memory_read,
                                            memory_reset_peak, memory_trim};

/* The ops that write a gradient on request (ABI 2.4): eltwise.cu. */
static const vh_overwrite_ext g_overwrite_ext = {sizeof(vh_overwrite_ext),
                                                 VH_OVERWRITE_OP_GELU_BACKWARD};

/* The GEMM's 2.5 epilogues (gemm.cu's route 2). */
static const vh_gemm_epilogue_ext g_epilogue_ext = {
    sizeof(vh_gemm_epilogue_ext),
    (1u << VH_EPILOGUE_GELU_GRAD) | (1u << VH_EPILOGUE_MUL_AUX)};

static const void *cuda_get_extension(vh_device *dev, const char *name) {
    (void)dev;
    if (!name) return NULL;
    if (!strcmp(name, VH_CUDA_MEMORY_EXTENSION)) return &g_memory_ext;
    if (!strcmp(name, "vh.cuda.mta")) return vh_cuda_mta_extension();
    if (!strcmp(name, VH_OVERWRITE_EXTENSION)) return &g_overwrite_ext;
    if (!strcmp(name, VH_GEMM_EPILOGUE_EXTENSION)) return &g_epilogue_ext;
    return NULL;
}

/* ---- open ------------------------------------------------------------------- */

/* The device's state, once per process (later opens of the same ordinal,
 * e.g. by each rank thread, share it). Under g_open_mutex. */
static vh_status device_init(vh_device *dev, int ordinal, char *err, size_t err_len) {
    if (dev->opened) return VH_STATUS_OK;
    dev->ordinal = ordinal;
    cudaError_t e;
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess ||
        (!dev->main.stream &&
         (e = cudaStreamCreateWithFlags(&dev->main.stream, cudaStreamNonBlocking)) != cudaSuccess) ||
        (e = cudaDeviceGetAttribute(&dev->sm_count, cudaDevAttrMultiProcessorCount, ordinal)) !=
            cudaSuccess) {
        snprintf(err, err_len, "CUDA device %d: %s", ordinal, cudaGetErrorString(e));
        return VH_STATUS_ERR_DEVICE;
    }
    const vh_cuda_alloc_backend backend = {dev, backend_malloc, backend_free};
    if (vh_cuda_alloc_init(&dev->allocator, &backend) != VH_STATUS_OK ||
        pthread_mutex_init(&g_ws_mutex[ordinal], NULL) != 0) {
        snprintf(err, err_len, "CUDA device %d: out of host memory", ordinal);
        return VH_STATUS_ERR_NOMEM;
    }
    dev->ws_mutex = &g_ws_mutex[ordinal];
    dev->opened = 1;
    return VH_STATUS_OK;
}

static void fill_table(vh_device_ops *t, vh_device *dev, const char *name) {
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    t->kind = VH_DEVICE_KIND_CUDA;
    t->name = name;
    t->device = dev;
    t->alloc = cuda_alloc;
    t->free = cuda_free;
    t->copy = cuda_copy;
    t->memset_zero = cuda_memset_zero;
    t->convert = cuda_convert;
    t->host_alloc = cuda_host_alloc;
    t->host_free = cuda_host_free;
    t->workspace = cuda_workspace;
    t->synchronize = cuda_synchronize;
    t->stream_create = cuda_stream_create;
    t->stream_destroy = cuda_stream_destroy;
    t->stream_set = cuda_stream_set;
    t->stream_synchronize = cuda_stream_synchronize;
    t->event_create = cuda_event_create;
    t->event_destroy = cuda_event_destroy;
    t->event_record = cuda_event_record;
    t->stream_wait_event = cuda_stream_wait_event;
    t->event_synchronize = cuda_event_synchronize;
    t->event_query = cuda_event_query;
    t->gemm = vh_cuda_gemm;
    t->layernorm_forward = vh_cuda_layernorm_forward;
    t->layernorm_backward = vh_cuda_layernorm_backward;
    t->gelu_forward = vh_cuda_gelu_forward;
    t->gelu_backward = vh_cuda_gelu_backward;
    t->add = vh_cuda_add;
    t->mul = vh_cuda_mul;
    t->dropout_forward = vh_cuda_dropout_forward;
    t->scale_rows = vh_cuda_scale_rows;
    t->bias_backward = vh_cuda_bias_backward;
    t->softmax = vh_cuda_softmax;
    t->attention_forward = vh_cuda_attention_forward;
    t->attention_backward = vh_cuda_attention_backward;
    t->softmax_cross_entropy = vh_cuda_softmax_cross_entropy;
    t->mean_pool_forward = vh_cuda_mean_pool_forward;
    t->mean_pool_backward = vh_cuda_mean_pool_backward;
    t->patchify = vh_cuda_patchify;
    t->embed_forward = vh_cuda_embed_forward;
    t->embed_backward = vh_cuda_embed_backward;
    t->multi_tensor_scale_check = vh_cuda_multi_tensor_scale_check;
    t->get_extension = cuda_get_extension;
    t->drop_path_scale = vh_cuda_drop_path_scale;
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
    if (ordinal < 0 || ordinal >= count || ordinal >= VH_CUDA_MAX_DEVICES) {
        snprintf(err, err_len, "CUDA device %d does not exist (this machine has %d)", ordinal,
                 count);
        return VH_STATUS_ERR_INVALID_ARG;
    }
    vh_device *dev = &g_devices[ordinal];
    pthread_mutex_lock(&g_open_mutex);
    vh_status st = device_init(dev, ordinal, err, err_len);
    pthread_mutex_unlock(&g_open_mutex);
    if (st != VH_STATUS_OK) return st;
    cudaSetDevice(ordinal); /* the opening thread's launches go to this device */
    static char names[VH_CUDA_MAX_DEVICES][16];
    snprintf(names[ordinal], sizeof names[ordinal], "cuda:%d", ordinal);
    vh_device_ops t;
    fill_table(&t, dev, names[ordinal]);
    const size_t n = out_size < sizeof t ? out_size : sizeof t;
    memcpy(out, &t, n);
    out->struct_size = (uint32_t)n;
    return VH_STATUS_OK;
}
