/* cpu_ops.h - the CPU compute ops behind vh_cpu_device_ops() (internal).
 *
 * Semantics are those of vh_device.h ("compute ops"); this header only adds
 * what the CPU files share:
 * - the op entry points (args structs of any minor, every dtype), in ops.c,
 *   gemm.c and attention.c;
 * - the fp32 kernels they run (one per op; other dtypes are converted to and
 *   from fp32 around them, rounding once at the store);
 * - a per-thread scratch arena, so that steady-state calls allocate nothing;
 * - array conversions between f32, bf16 and f16 (half.c);
 * - the counter-based random numbers used by dropout and vh_param_init, and
 *   the OpenMP thresholds.
 *
 * Threads: one OpenMP pool for everything. oneDNN (Debian's build) uses the
 * same libgomp runtime, so a matmul issued outside a parallel region uses that
 * pool and our own loops use it in between.
 */
#ifndef VITHOST_CPU_OPS_H
#define VITHOST_CPU_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vithost/vh_device.h"
#include "vithost/vh_random.h"

#define VH_CPU_HIDDEN __attribute__((visibility("hidden")))

/* Element-wise loops go parallel above this many elements; below it the
 * fork/join costs more than the loop. */
#define VH_CPU_PAR_ELEMS ((int64_t)1 << 15)

/* Elements per piece of a threaded element-wise loop: each thread gets whole
 * pieces, a multiple of every vector width (so only the last piece has a
 * tail). */
#define VH_CPU_PIECE ((int64_t)1 << 13)

/* The hot loops (GELU, softmax, layer norm, bias gradient, conversions,
 * attention's small GEMMs) are compiled three times and the best one for the
 * running CPU is picked when the library loads (GCC function
 * multiversioning, an ifunc): AVX-512 (x86-64-v4: Zen 4/5, Xeon), AVX2 + FMA
 * (x86-64-v3: Zen 1-3, Haswell on), and the x86-64 baseline (SSE2) the rest
 * of the SDK is built for. Measured on Zen 3, one thread, T2's shapes,
 * the AVX2 + FMA clone against the baseline one: GELU forward (fc1's
 * epilogue) and backward about 3x (backward 15 -> 4.6 ms), layer norm and
 * the attention softmax about 1.4x.
 * Numbers: one clone runs for every call on a machine, so forward and
 * backward recompute the same values; between machines (clones) the last
 * bits of the math loops differ: wider vectors sum a row in another order,
 * and activations.c, attention.c and layernorm.c contract a * b + c into FMA
 * where the clone has it (sdk/CMakeLists.txt), as oneDNN's GEMMs differ per
 * ISA. Conversions (half.c) are integer and select code: the same bits on
 * every clone (test_casts).
 * Use it on functions that hold whole loops (a clone is a call, never
 * inlined; what they call must be always_inline to be built for the clone)
 * and open no `omp parallel` of their own (they run inside those).
 * -DVH_CPU_NO_CLONES builds the baseline loops alone (to test that path). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES)
#define VH_CPU_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
/* Does this CPU run the AVX2 (or AVX-512) clones (the test the clones'
 * resolvers make)? Kernels written with 8-float vectors are only worth
 * calling then: on SSE2 GCC splits them badly. */
static inline int vh_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v3") != 0;
}
/* The same for the AVX-512 clone (x86-64-v4): kernels written with AVX-512
 * intrinsics under `#pragma GCC target("arch=x86-64-v4")`. */
static inline int vh_cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") != 0;
}
#else
#define VH_CPU_CLONES
static inline int vh_cpu_has_avx2(void) { return 0; }
static inline int vh_cpu_has_avx512(void) { return 0; }
#endif

/* ---- host memory (pages.c) -------------------------------------------------
 * bytes of memory, at least 64-byte aligned, released by free(); from 2 MiB
 * up on 2 MiB pages where the kernel grants them (pages.c says why). NULL
 * when out of memory. */
VH_CPU_HIDDEN void *vh_cpu_pages_alloc(size_t bytes);
/* The same for the device's tensors, counted: vh_cpu_tensor_bytes is the
 * bytes of those alive (0 where the C library cannot say). Released by
 * vh_cpu_tensor_free. */
VH_CPU_HIDDEN void *vh_cpu_tensor_alloc(size_t bytes);
VH_CPU_HIDDEN void vh_cpu_tensor_free(void *p);
VH_CPU_HIDDEN int64_t vh_cpu_tensor_bytes(void);

/* ---- non-temporal copies (stream.c) ----------------------------------------
 * dst = src, `bytes` of it, written around the caches where the CPU can
 * (for tensors read back only much later); vh_cpu_stream_fence after a
 * thread's last such copy, before another thread may read dst.
 * vh_cpu_stream_on: whether a tensor kept for the backward pass should be
 * streamed (stream.c says when; VITHOST_CPU_STREAM=0 or 1 forces it). */
VH_CPU_HIDDEN int vh_cpu_stream_on(void);
VH_CPU_HIDDEN void vh_cpu_copy_stream(void *dst, const void *src, size_t bytes);
VH_CPU_HIDDEN void vh_cpu_stream_fence(void);

/* ---- dealing blocks and bands to the threads (deal.c) ----------------------
 * Inside a parallel region, the items (0..count-1: attention blocks, GEMM
 * bands) this thread runs. By default each thread takes one contiguous run
 * of whole chunks (`chunk` items), its edges where the threads' shares of
 * the rows are most even (item i holds rows [i * unit, min((i + 1) * unit,
 * total)); the last may be short), so that a thread works on the same rows
 * from one op to the next, as the row-split element-wise ops and layer
 * norms do (deal.c says why). With VITHOST_CPU_DEAL=dynamic (read by
 * vh_cpu_deal_dynamic at each call) chunks go one at a time to whichever
 * thread is free, through *next, which the caller zeroes before the
 * region. Every thread calls vh_cpu_deal_init, then vh_cpu_deal_take until
 * it returns 0: items [*lo, *hi) each time. */
typedef struct vh_cpu_deal {
    int64_t *next; /* dynamic: the first chunk not yet taken, shared */
    int64_t count, chunk, lo, hi;
    int dynamic, taken;
} vh_cpu_deal;

VH_CPU_HIDDEN int vh_cpu_deal_dynamic(void);
VH_CPU_HIDDEN void vh_cpu_deal_init(vh_cpu_deal *d, int dynamic, int64_t *next, int64_t count,
                                    int64_t chunk, int64_t unit, int64_t total);
VH_CPU_HIDDEN int vh_cpu_deal_take(vh_cpu_deal *d, int64_t *lo, int64_t *hi);

/* ---- scratch arena ---------------------------------------------------------
 * One per thread, for the temporaries of one op call (fp32 copies of bf16
 * tensors, per-chunk partial sums, oneDNN's scratchpad). vh_cpu_scratch_alloc
 * returns 64-byte aligned memory valid until the mark it was taken after is
 * released; memory only grows, so after the first calls of a training step
 * nothing is allocated. A mark/release pair brackets every op entry point. */
typedef struct vh_cpu_scratch_mark {
    size_t used;
    int level;
} vh_cpu_scratch_mark;

VH_CPU_HIDDEN vh_cpu_scratch_mark vh_cpu_scratch_begin(void);
VH_CPU_HIDDEN void *vh_cpu_scratch_alloc(size_t bytes);
VH_CPU_HIDDEN void vh_cpu_scratch_end(vh_cpu_scratch_mark mark);
/* Heap allocations this thread's arena has made (growth and overflow). */
VH_CPU_HIDDEN uint64_t vh_cpu_scratch_allocations(void);

/* ---- dtypes ------------------------------------------------------------- */

/* bf16 <-> f32 inside a kernel's own loop (vectorises under `omp simd`):
 * widening is exact; rounding is to nearest even, NaN kept quiet. The
 * array conversions of half.c are these two. */
__attribute__((always_inline)) static inline float vh_cpu_bf16_widen(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

__attribute__((always_inline)) static inline float vh_cpu_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* (The bf16 bits in a 32-bit value: loops whose every value is 32-bit
 * vectorise at full width.) */
__attribute__((always_inline)) static inline uint32_t vh_cpu_bf16_round32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return nan ? ((u >> 16) | 0x40u) : rounded;
}

__attribute__((always_inline)) static inline uint16_t vh_cpu_bf16_round(float x) {
    return (uint16_t)vh_cpu_bf16_round32(x);
}

/* Element i of a tensor as stored, bf16 when `bf` (a constant where the
 * caller inlines it: one loop built per storage), else f32; and back,
 * rounded once (layernorm.c, tokens.c). */
__attribute__((always_inline)) static inline float vh_cpu_load_as(const void *p, int64_t i,
                                                                 int bf) {
    return bf ? vh_cpu_bf16_widen(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

__attribute__((always_inline)) static inline void vh_cpu_store_as(void *p, int64_t i, float v,
                                                                 int bf) {
    if (bf)
        ((uint16_t *)p)[i] = vh_cpu_bf16_round(v);
    else
        ((float *)p)[i] = v;
}

static inline int vh_cpu_is_float(vh_dtype t) {
    return t == VH_DTYPE_F32 || t == VH_DTYPE_F16 || t == VH_DTYPE_BF16;
}

/* Array conversions (half.c), round to nearest even, NaN kept; vectorised,
 * and threaded for long arrays. The _serial forms never open a parallel
 * region: for rows inside a parallel loop. */
VH_CPU_HIDDEN void vh_cpu_to_f32(float *dst, const void *src, vh_dtype src_dtype, int64_t n);
VH_CPU_HIDDEN void vh_cpu_from_f32(void *dst, vh_dtype dst_dtype, const float *src, int64_t n);
VH_CPU_HIDDEN void vh_cpu_to_f32_serial(float *dst, const void *src, vh_dtype src_dtype,
                                        int64_t n);
VH_CPU_HIDDEN void vh_cpu_from_f32_serial(void *dst, vh_dtype dst_dtype, const float *src,
                                          int64_t n);

/* An fp32 view of a tensor of n elements: the tensor itself when it is f32,
 * else a scratch copy (converted when `load`). vh_cpu_f32_store writes a
 * view back to its tensor (nothing to do for f32). */
VH_CPU_HIDDEN float *vh_cpu_f32_view(const void *p, vh_dtype t, int64_t n, int load);
VH_CPU_HIDDEN void vh_cpu_f32_store(void *p, vh_dtype t, const float *view, int64_t n);

/* ---- random numbers: a pure function of (key, counter) -------------------
 * vh_random.h's splitmix64: the u-th value of stream `key` is
 * vh_splitmix64_mix(key + (u + 1) * GAMMA); a stream's key is that of the seed.
 * Nothing depends on thread count or call order, and the CUDA device can
 * compute the very same numbers. */

static inline uint64_t vh_rng_bits(uint64_t key, uint64_t counter) {
    return vh_splitmix64_mix(key + (counter + 1) * VH_SPLITMIX64_GAMMA);
}

/* Uniform in [0, 1) with 24 random bits: exact in float. */
static inline float vh_rng_uniform_f32(uint64_t bits) {
    return (float)(bits >> 40) * 0x1p-24f;
}

/* ---- vectorisable math -----------------------------------------------------
 * glibc's expf and erff are scalar calls (5-12 ns each here); softmax and GELU
 * would cost as much as the GEMMs around them. These are branch-free, so an
 * `omp simd` loop vectorises them. */

/* e^x = p 2^n for x in [-86.5, 88.7]: Cody-Waite reduction x = n ln2 + r,
 * |r| <= ln2/2, and a degree-7 Taylor polynomial p(r); returns p, n in *n. */
__attribute__((always_inline)) static inline float vh_expf_reduced(float x, float *n) {
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to integer */
    *n = (x * 1.44269504088896341f + shifter) - shifter;
    const float r = (x - *n * 0.693145751953125f) - *n * 1.428606765330187045e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p;
}

/* e^x within 2 ulp (test_ops checks it): p 2^n as above, 2^n built in the
 * exponent bits. NaN stays NaN, +inf and overflow give +inf, results below
 * e^-86.5 (2.6e-38, near FLT_MIN) flush to 0. */
__attribute__((always_inline)) static inline float vh_expf(float x) {
    const float lo = -86.5f, hi = 88.7f;
    const float xc = x < lo ? lo : (x > hi ? hi : x);
    float n;
    const float p = vh_expf_reduced(xc, &n);
    /* 2^(n-1) * 2: n <= 128 at the top of the range, n - 1 >= -126 at the bottom. */
    const uint32_t bits = (uint32_t)((int32_t)n - 1 + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale * 2.0f;
    y = x < lo ? 0.0f : y;
    y = x > hi ? INFINITY : y;
    return x != x ? x : y;
}

/* e^x for x <= 0 (GELU's e^(-z^2)): vh_expf without what only positive
 * arguments need (the upper clamp and +inf, the NaN select, the split
 * 2^(n-1) * 2 for n = 128). The same bits as vh_expf but under 2^-125, where
 * vh_expf's 2^(n-1) p is subnormal for a moment; below e^-86.5 it gives 0,
 * and NaN stays NaN (the clamp keeps it and the polynomial carries it).
 * GELU's forward and backward ran 20-25% faster on Zen 5 (1.6M elements, 2
 * threads: 0.366 -> 0.270 ms f32 forward). attention_small_kern.h has the
 * same on its vectors. */
__attribute__((always_inline)) static inline float vh_expf_nonpos(float x) {
    const float lo = -86.5f;
    const float xc = x < lo ? lo : x;
    float n;
    const float p = vh_expf_reduced(xc, &n);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* n in [-125, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float y = p * scale;
    return x < lo ? 0.0f : y;
}

/* Softmax of one row in place; NaN in, NaN out. Always inlined, so that it
 * is compiled for the clone that calls it (VH_CPU_CLONES). */
__attribute__((always_inline)) static inline void vh_softmax_row(float *row, int64_t n) {
    float mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) {
        row[j] = vh_expf(row[j] - mx);
        sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) row[j] *= inv;
}

/* ---- op entry points (vh_device.h) ---------------------------------------- */

VH_CPU_HIDDEN vh_status vh_cpu_gemm(vh_device *dev, const vh_gemm_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_layernorm_forward(vh_device *dev, const vh_layernorm_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_layernorm_backward(vh_device *dev,
                                                  const vh_layernorm_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_gelu_forward(vh_device *dev, const vh_eltwise_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_gelu_backward(vh_device *dev, const vh_eltwise_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_add(vh_device *dev, const vh_eltwise_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_mul(vh_device *dev, const vh_eltwise_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_dropout_forward(vh_device *dev, const vh_eltwise_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_scale_rows(vh_device *dev, const vh_eltwise_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_bias_backward(vh_device *dev, const vh_rows_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_softmax(vh_device *dev, const vh_rows_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_attention_forward(vh_device *dev, const vh_attention_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_attention_backward(vh_device *dev,
                                                  const vh_attention_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_softmax_cross_entropy(vh_device *dev, const vh_xent_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_mean_pool_forward(vh_device *dev, const vh_tokens_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_mean_pool_backward(vh_device *dev, const vh_tokens_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_patchify(vh_device *dev, const vh_tokens_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_embed_forward(vh_device *dev, const vh_tokens_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_embed_backward(vh_device *dev, const vh_tokens_args *args);
VH_CPU_HIDDEN vh_status vh_cpu_multi_tensor_scale_check(vh_device *dev,
                                                        const vh_multi_tensor_args *args);

/* ---- row tensors in their storage dtype -------------------------------------
 * The row-wise kernels (layer norm, bias gradient) take their large tensors
 * as stored and widen one block of rows at a time into the thread's scratch,
 * narrowing outputs back while the block is still in cache: bf16 storage then
 * moves half of f32's bytes instead of adding whole-tensor conversion passes.
 * Call inside a scratch mark; NULL when the scratch could not be had (or p
 * is NULL). f32 rows are used in place. */
typedef struct vh_cpu_rows {
    void *p;
    vh_dtype dtype;
} vh_cpu_rows;
VH_CPU_HIDDEN float *vh_cpu_rows_load(vh_cpu_rows t, int64_t r0, int64_t nrows, int64_t dim,
                                      int load);
VH_CPU_HIDDEN void vh_cpu_rows_store(vh_cpu_rows t, int64_t r0, int64_t nrows, int64_t dim,
                                     const float *rows);
/* Rows to widen at a time so that `arrays` blocks of them stay in L1 (a
 * 64-row chunk of width 192 in three arrays was 147 KiB, in L2: bf16 layer
 * norms ran 25% slower than fp32 ones); every row at once when all are
 * f32 (nothing is widened). At least 1. */
#define VH_CPU_ROWS_L1_FLOATS 6144
static inline int64_t vh_cpu_rows_block(int all_f32, int64_t rows, int64_t dim, int arrays) {
    const int64_t fit = VH_CPU_ROWS_L1_FLOATS / arrays / (dim > 0 ? dim : 1);
    return all_f32 ? rows : fit > 1 ? fit : 1;
}

/* ---- kernels (arguments already checked) ------------------------------------
 * fp32 but for the vh_cpu_rows tensors; those returning int give 0, or -1
 * when scratch memory ran out (nothing is then stored). */

VH_CPU_HIDDEN int vh_cpu_k_layernorm_forward(vh_cpu_rows out, float *mean, float *rstd,
                                             vh_cpu_rows x, const float *weight,
                                             const float *bias, int64_t rows, int64_t dim,
                                             float eps);
/* dweight/dbias may be NULL (skipped). */
VH_CPU_HIDDEN int vh_cpu_k_layernorm_backward(vh_cpu_rows dx, float *dweight, float *dbias,
                                              vh_cpu_rows dout, vh_cpu_rows x,
                                              const float *weight, const float *mean,
                                              const float *rstd, int64_t rows, int64_t dim);
/* layernorm_avx512.c: rows of both passes with AVX-512 (layernorm.c's
 * bits), f32 or (bf16 1) bf16, for the caller's thread: the forward's rows,
 * and the backward's with the chunk's parameter-gradient partials pw, pb
 * added to. 1 where they ran; 0 where the width is not a multiple of 16
 * (f32: or past 64), on another CPU, with VITHOST_CPU_LAYERNORM=portable,
 * and in an unoptimised build (the caller then takes its own loops). */
VH_CPU_HIDDEN int vh_cpu_k_layernorm_avx512_forward_rows(void *out, float *mean, float *rstd,
                                                         const void *x, const float *weight,
                                                         const float *bias, int64_t rows,
                                                         int64_t dim, float eps, int bf16);
VH_CPU_HIDDEN int vh_cpu_k_layernorm_avx512_backward_rows(void *dx, float *pw, float *pb,
                                                          const void *dout, const void *x,
                                                          const float *weight, const float *mean,
                                                          const float *rstd, int64_t rows,
                                                          int64_t dim, int bf16);
VH_CPU_HIDDEN void vh_cpu_k_gelu_forward(float *out, const float *x, int64_t n);
/* The same on the caller's thread (for rows inside a parallel loop). */
VH_CPU_HIDDEN void vh_cpu_k_gelu_forward_serial(float *out, const float *x, int64_t n);
/* out = gelu(x) and grad = gelu'(x) (grad may be x), from one evaluation. */
VH_CPU_HIDDEN void vh_cpu_k_gelu_forward_grad(float *out, float *grad, const float *x, int64_t n);
VH_CPU_HIDDEN void vh_cpu_k_gelu_forward_grad_serial(float *out, float *grad, const float *x,
                                                     int64_t n);
/* Softmax of `rows` rows of `cols` in place, on the caller's thread. */
VH_CPU_HIDDEN void vh_cpu_softmax_rows(float *p, int64_t rows, int64_t cols);
/* dx += gelu'(x) * dout; overwrite: dx = 0 + gelu'(x) * dout, dx not read. */
VH_CPU_HIDDEN void vh_cpu_k_gelu_backward(float *dx, const float *x, const float *dout,
                                          int64_t n, int overwrite);
/* Seconds on the monotonic clock (clock.c): the timed choices' stopwatch. */
VH_CPU_HIDDEN double vh_cpu_seconds(void);
/* dx = 0 + gelu'(x) * dout (overwrite) on the caller's thread. */
VH_CPU_HIDDEN void vh_cpu_k_gelu_backward_serial(float *dx, const float *x, const float *dout,
                                                 int64_t n);
/* gelu_grad16.c, on the caller's thread: gelu_backward_bf16's span; and
 * from a GEMM's fp32 t, dx = bf16(0 + bf16(t) * gelu'(x)), the numbers of
 * storing t in bf16 and gelu_backward_bf16 with overwrite (ABI 2.7's
 * VH_EPILOGUE_GELU_BACKWARD). gelu'(x) from a table or computed, whichever
 * the first call measured faster (the same bits). */
VH_CPU_HIDDEN void vh_cpu_k_gelu_backward_bf16_serial(uint16_t *dx, const uint16_t *x,
                                                      const uint16_t *dout, int64_t n,
                                                      int overwrite);
VH_CPU_HIDDEN void vh_cpu_k_gelu_backward_f32_to_bf16_serial(uint16_t *dx, const uint16_t *x,
                                                             const float *t, int64_t n);
/* The same on bf16 tensors, converted inside the loop. */
VH_CPU_HIDDEN void vh_cpu_k_gelu_forward_bf16(uint16_t *out, const uint16_t *x, int64_t n);
VH_CPU_HIDDEN void vh_cpu_k_gelu_backward_bf16(uint16_t *dx, const uint16_t *x,
                                               const uint16_t *dout, int64_t n, int overwrite);
/* From an fp32 pre-activation t: pre = bf16(t), out = bf16(gelu(t)), in
 * one pass (a GEMM's GELU epilogue with bf16 outputs). */
VH_CPU_HIDDEN void vh_cpu_k_gelu_forward_f32_to_bf16(uint16_t *out, uint16_t *pre,
                                                     const float *t, int64_t n);
VH_CPU_HIDDEN void vh_cpu_k_gelu_forward_f32_to_bf16_serial(uint16_t *out, uint16_t *pre,
                                                            const float *t, int64_t n);
/* gelu16.c: the same, with AVX-512 and BF16, on the first n / 32 * 32
 * values (the same bits); returns how many it did: 0 on another CPU, and
 * in an unoptimised build. */
VH_CPU_HIDDEN int64_t vh_cpu_k_gelu16_forward_f32_to_bf16(uint16_t *out, uint16_t *pre,
                                                          const float *t, int64_t n);
VH_CPU_HIDDEN void vh_cpu_k_add(float *out, const float *a, const float *b, int64_t n);
VH_CPU_HIDDEN void vh_cpu_k_mul(float *out, const float *a, const float *b, int64_t n,
                                int32_t accumulate);
VH_CPU_HIDDEN int vh_cpu_k_bias_backward(float *dbias, vh_cpu_rows dout, int64_t rows,
                                         int64_t cols);
VH_CPU_HIDDEN void vh_cpu_k_softmax(float *out, const float *x, int64_t rows, int64_t cols);
VH_CPU_HIDDEN void vh_cpu_k_scale_rows(float *out, const float *in, const float *scale,
                                       int64_t rows, int64_t dim, int64_t div, int64_t mod,
                                       int32_t accumulate);
VH_CPU_HIDDEN void vh_cpu_k_dropout_forward(float *out, float *mask, const float *x, int64_t n,
                                            float p, uint64_t seed);
/* Loss of the batch into *loss (host or device memory: the same on the CPU). */
VH_CPU_HIDDEN void vh_cpu_k_softmax_cross_entropy(float *loss, float *dlogits,
                                                  const float *logits, const int32_t *labels,
                                                  int64_t batch, int64_t classes,
                                                  float smoothing, float dloss_scale);
/* ABI 2.2: with (batch, classes) f32 soft targets instead of labels. */
VH_CPU_HIDDEN void vh_cpu_k_softmax_cross_entropy_soft(float *loss, float *dlogits,
                                                       const float *logits, const float *targets,
                                                       int64_t batch, int64_t classes,
                                                       float dloss_scale);
VH_CPU_HIDDEN void vh_cpu_k_mean_pool_forward(float *out, const float *x, int64_t batch,
                                              int64_t first, int64_t count, int64_t dim,
                                              int64_t batch_stride, int64_t token_stride);
VH_CPU_HIDDEN void vh_cpu_k_mean_pool_backward(float *dx, const float *dout, int64_t batch,
                                               int64_t first, int64_t count, int64_t dim,
                                               int64_t batch_stride, int64_t token_stride);
VH_CPU_HIDDEN void vh_cpu_k_patchify(float *out, const float *images, int64_t batch,
                                     int64_t channels, int64_t height, int64_t width,
                                     int64_t patch, int64_t batch_stride, int64_t token_stride);
VH_CPU_HIDDEN void vh_cpu_k_embed_forward(float *x, const float *patches, const float *cls,
                                          const float *pos, int64_t batch, int64_t num_patches,
                                          int64_t dim, int64_t batch_stride,
                                          int64_t token_stride, int64_t patch_batch_stride,
                                          int64_t patch_token_stride);
VH_CPU_HIDDEN void vh_cpu_k_embed_backward(float *dpatches, float *dcls, float *dpos,
                                           const float *dx, int64_t batch, int64_t num_patches,
                                           int64_t dim, int64_t batch_stride,
                                           int64_t token_stride, int64_t patch_batch_stride,
                                           int64_t patch_token_stride);
/* The same on bf16 tensors as stored (every tensor of the call bf16): the
 * bits of the f32 kernels on widened copies, rounded once. */
VH_CPU_HIDDEN void vh_cpu_k_mean_pool_forward_bf16(uint16_t *out, const uint16_t *x,
                                                   int64_t batch, int64_t first, int64_t count,
                                                   int64_t dim, int64_t batch_stride,
                                                   int64_t token_stride);
VH_CPU_HIDDEN void vh_cpu_k_mean_pool_backward_bf16(uint16_t *dx, const uint16_t *dout,
                                                    int64_t batch, int64_t first, int64_t count,
                                                    int64_t dim, int64_t batch_stride,
                                                    int64_t token_stride);
VH_CPU_HIDDEN void vh_cpu_k_embed_forward_bf16(uint16_t *x, const uint16_t *patches,
                                               const uint16_t *cls, const uint16_t *pos,
                                               int64_t batch, int64_t num_patches, int64_t dim,
                                               int64_t batch_stride, int64_t token_stride,
                                               int64_t patch_batch_stride,
                                               int64_t patch_token_stride);
VH_CPU_HIDDEN void vh_cpu_k_embed_backward_bf16(uint16_t *dpatches, uint16_t *dcls,
                                                uint16_t *dpos, const uint16_t *dx, int64_t batch,
                                                int64_t num_patches, int64_t dim,
                                                int64_t batch_stride, int64_t token_stride,
                                                int64_t patch_batch_stride,
                                                int64_t patch_token_stride);

/* ---- ABI 2.1 ops (activations.c) --------------------------------------------- */

VH_CPU_HIDDEN vh_status vh_cpu_drop_path_scale(vh_device *dev, const vh_eltwise_args *args);
/* out[b] = drop or keep factor of sample b (vh_device.h's drop_path_scale). */
VH_CPU_HIDDEN void vh_cpu_k_drop_path_scale(float *out, int64_t n, float p, uint64_t seed);

#endif
