/* device_cpu.c - the CPU device: host memory, streams and events that are
 * already finished, a workspace, and the compute ops of src/cpu/ (oneDNN
 * GEMMs, OpenMP loops). The reference every other device is checked against.
 *
 * Streams on the CPU: every op runs to completion in the caller's thread, so
 * a stream is only an identity (a thread's current stream, and the owner of a
 * workspace) and an event is always complete. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cpu/dnnl_engine.h"
#include "vithost/vh_cpu_engine.h"
#include "vithost/vh_runtime.h"

struct vh_stream {
    void *workspace; /* the stream's workspace (vh_device_ops.workspace) */
    size_t workspace_bytes;
};

struct vh_event {
    int recorded;
};

static vh_status cpu_alloc(vh_device *dev, size_t bytes, void **out) {
    (void)dev;
    if (!out) return VH_STATUS_ERR_INVALID_ARG;
    void *p = vh_cpu_tensor_alloc(bytes);
    if (!p) return VH_STATUS_ERR_NOMEM;
    *out = p;
    return VH_STATUS_OK;
}

static void cpu_free(vh_device *dev, void *ptr) {
    (void)dev;
    vh_cpu_tensor_free(ptr);
}

static vh_status cpu_copy(vh_device *dev, void *dst, const void *src, size_t bytes,
                          vh_copy_kind kind, vh_stream *stream) {
    (void)dev;
    (void)kind; /* one address space on the CPU */
    (void)stream;
    if (bytes && (!dst || !src)) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes) memmove(dst, src, bytes);
    return VH_STATUS_OK;
}

/* Large zeroings (a model's gradient buffers before an accumulating op, the
 * sharding plugin's grads every step) are split over the threads: one core
 * does not reach the memory bandwidth of two (Zen 3, 12.8 MB: 0.97 -> 0.51
 * ms). */
#define ZERO_PIECE ((size_t)1 << 18)

static vh_status cpu_memset_zero(vh_device *dev, void *ptr, size_t bytes, vh_stream *stream) {
    (void)dev;
    (void)stream;
    if (bytes && !ptr) return VH_STATUS_ERR_INVALID_ARG;
    if (bytes <= 2 * ZERO_PIECE) {
        if (bytes) memset(ptr, 0, bytes);
        return VH_STATUS_OK;
    }
    const int64_t pieces = (int64_t)((bytes + ZERO_PIECE - 1) / ZERO_PIECE);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; p++) {
        const size_t lo = (size_t)p * ZERO_PIECE;
        memset((char *)ptr + lo, 0, bytes - lo < ZERO_PIECE ? bytes - lo : ZERO_PIECE);
    }
    return VH_STATUS_OK;
}

static vh_status cpu_convert(vh_device *dev, void *dst, vh_dtype dst_dtype, const void *src,
                             vh_dtype src_dtype, size_t count, vh_stream *stream) {
    (void)dev;
    (void)stream;
    if (!vh_cpu_is_float(dst_dtype) || !vh_cpu_is_float(src_dtype))
        return VH_STATUS_ERR_UNSUPPORTED;
    if (count == 0) return VH_STATUS_OK;
    if (!dst || !src) return VH_STATUS_ERR_INVALID_ARG;
    if (dst_dtype == src_dtype) {
        memmove(dst, src, count * vh_dtype_size(dst_dtype));
        return VH_STATUS_OK;
    }
    const int64_t n = (int64_t)count;
    if (src_dtype == VH_DTYPE_F32) {
        vh_cpu_from_f32(dst, dst_dtype, src, n);
    } else if (dst_dtype == VH_DTYPE_F32) {
        vh_cpu_to_f32(dst, src, src_dtype, n);
    } else {
        /* f16 <-> bf16 through fp32, as the hardware would, in pieces. */
        float buf[1024];
        for (int64_t i = 0; i < n; i += 1024) {
            const int64_t m = n - i < 1024 ? n - i : 1024;
            vh_cpu_to_f32(buf, (const uint16_t *)src + i, src_dtype, m);
            vh_cpu_from_f32((uint16_t *)dst + i, dst_dtype, buf, m);
        }
    }
    return VH_STATUS_OK;
}

/* ---- workspace ---------------------------------------------------------------
 * One buffer per stream; the default stream's is per thread (two threads on
 * the default stream must not share one), freed when the thread exits. Grows,
 * never shrinks; the memory of the previous size is freed at once: "valid
 * until the next workspace call". */

static _Thread_local vh_stream *t_current;
static pthread_key_t g_default_key;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

static void default_stream_free(void *p) {
    vh_stream *s = p;
    if (s) free(s->workspace);
    free(s);
}

static void make_default_key(void) {
    (void)pthread_key_create(&g_default_key, default_stream_free);
}

/* This thread's default stream (its workspace), created on first use. */
static vh_stream *default_stream(void) {
    pthread_once(&g_default_once, make_default_key);
    vh_stream *s = pthread_getspecific(g_default_key);
    if (!s && (s = calloc(1, sizeof *s)) != NULL && pthread_setspecific(g_default_key, s) != 0) {
        free(s);
        s = NULL;
    }
    return s;
}

static vh_status cpu_workspace(vh_device *dev, size_t bytes, vh_stream *stream, void **out) {
    (void)dev;
    if (!out) return VH_STATUS_ERR_INVALID_ARG;
    vh_stream *s = stream ? stream : (t_current ? t_current : default_stream());
    if (!s) return VH_STATUS_ERR_NOMEM;
    if (!s->workspace || s->workspace_bytes < bytes) {
        void *p = NULL;
        size_t want = bytes > s->workspace_bytes * 2 ? bytes : s->workspace_bytes * 2;
        if (cpu_alloc(dev, want, &p) != VH_STATUS_OK) return VH_STATUS_ERR_NOMEM;
        free(s->workspace);
        s->workspace = p;
        s->workspace_bytes = want;
    }
    *out = s->workspace;
    return VH_STATUS_OK;
}

/* ---- streams and events -------------------------------------------------- */

static vh_status cpu_synchronize(vh_device *dev) {
    (void)dev;
    return VH_STATUS_OK;
}

static vh_status cpu_stream_create(vh_device *dev, vh_stream **out) {
    (void)dev;
    if (!out) return VH_STATUS_ERR_INVALID_ARG;
    vh_stream *s = calloc(1, sizeof *s);
    if (!s) return VH_STATUS_ERR_NOMEM;
    *out = s;
    return VH_STATUS_OK;
}

static void cpu_stream_destroy(vh_device *dev, vh_stream *stream) {
    (void)dev;
    if (!stream) return;
    if (t_current == stream) t_current = NULL;
    free(stream->workspace);
    free(stream);
}

static vh_status cpu_stream_set(vh_device *dev, vh_stream *stream, vh_stream **previous) {
    (void)dev;
    if (previous) *previous = t_current;
    t_current = stream;
    return VH_STATUS_OK;
}

static vh_status cpu_stream_synchronize(vh_device *dev, vh_stream *stream) {
    (void)dev;
    (void)stream;
    return VH_STATUS_OK;
}

static vh_status cpu_event_create(vh_device *dev, vh_event **out) {
    (void)dev;
    if (!out) return VH_STATUS_ERR_INVALID_ARG;
    vh_event *e = calloc(1, sizeof *e);
    if (!e) return VH_STATUS_ERR_NOMEM;
    *out = e;
    return VH_STATUS_OK;
}

static void cpu_event_destroy(vh_device *dev, vh_event *event) {
    (void)dev;
    free(event);
}

static vh_status cpu_event_record(vh_device *dev, vh_event *event, vh_stream *stream) {
    (void)dev;
    (void)stream;
    if (!event) return VH_STATUS_ERR_INVALID_ARG;
    event->recorded = 1;
    return VH_STATUS_OK;
}

static vh_status cpu_stream_wait_event(vh_device *dev, vh_stream *stream, vh_event *event) {
    (void)dev;
    (void)stream;
    return event ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}

static vh_status cpu_event_synchronize(vh_device *dev, vh_event *event) {
    (void)dev;
    return event ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}

static vh_status cpu_event_query(vh_device *dev, vh_event *event, int *done) {
    (void)dev;
    if (!event || !done) return VH_STATUS_ERR_INVALID_ARG;
    *done = 1;
    return VH_STATUS_OK;
}

/* "vh.cpu.engine": filled once, on first use (oneDNN reads
 * ONEDNN_MAX_CPU_ISA then). */
static vh_cpu_engine_info g_engine_info;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;

static void thread_counters(uint64_t *primitives_created, uint64_t *scratch_allocations) {
    if (primitives_created) *primitives_created = vh_dnnl_primitives_created();
    if (scratch_allocations) *scratch_allocations = vh_cpu_scratch_allocations();
}

static void fill_engine_info(void) {
    g_engine_info.struct_size = sizeof g_engine_info;
    g_engine_info.engine = vh_dnnl_version_name();
    g_engine_info.isa = vh_dnnl_isa_name();
    g_engine_info.native_bf16 = vh_dnnl_isa_has(VH_DNNL_ISA_AVX512_CORE_BF16);
    g_engine_info.native_f16 = 0;
    g_engine_info.thread_counters = thread_counters;
}

/* The ops that write a gradient on request (ABI 2.4): cpu/ops.c; 2.6's
 * attention_backward: cpu/attention*.c. */
static const vh_overwrite_ext g_overwrite_ext = {
    sizeof(vh_overwrite_ext),
    VH_OVERWRITE_OP_GELU_BACKWARD | VH_OVERWRITE_OP_ATTENTION_BACKWARD};

/* The GEMM's 2.5 epilogues (cpu/gemm.c). */
static const vh_gemm_epilogue_ext g_epilogue_ext = {
    sizeof(vh_gemm_epilogue_ext),
    (1u << VH_EPILOGUE_GELU_GRAD) | (1u << VH_EPILOGUE_MUL_AUX) |
        (1u << VH_EPILOGUE_GELU_BACKWARD)};

static const void *cpu_get_extension(vh_device *dev, const char *name) {
    (void)dev;
    if (name && strcmp(name, VH_CPU_ENGINE_EXTENSION) == 0) {
        pthread_once(&g_engine_once, fill_engine_info);
        return &g_engine_info;
    }
    if (name && strcmp(name, VH_OVERWRITE_EXTENSION) == 0) return &g_overwrite_ext;
    if (name && strcmp(name, VH_GEMM_EPILOGUE_EXTENSION) == 0) return &g_epilogue_ext;
    return NULL;
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
    .convert = cpu_convert,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .workspace = cpu_workspace,
    .synchronize = cpu_synchronize,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_set = cpu_stream_set,
    .stream_synchronize = cpu_stream_synchronize,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .event_query = cpu_event_query,
    .gemm = vh_cpu_gemm,
    .layernorm_forward = vh_cpu_layernorm_forward,
    .layernorm_backward = vh_cpu_layernorm_backward,
    .gelu_forward = vh_cpu_gelu_forward,
    .gelu_backward = vh_cpu_gelu_backward,
    .add = vh_cpu_add,
    .mul = vh_cpu_mul,
    .dropout_forward = vh_cpu_dropout_forward,
    .scale_rows = vh_cpu_scale_rows,
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
    .multi_tensor_scale_check = vh_cpu_multi_tensor_scale_check,
    .get_extension = cpu_get_extension,
    .drop_path_scale = vh_cpu_drop_path_scale,
};

const vh_device_ops *vh_cpu_device_ops(void) { return &cpu_ops; }
