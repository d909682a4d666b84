/* dnnl_engine.h - the one door to oneDNN (internal to the CPU device).
 *
 * Every oneDNN call of vithost is in dnnl_engine.c, behind this header, so
 * that oneDNN 3.x (a different C API: no *_desc_init) is one more file chosen
 * at configure time, not a port of the ops.
 *
 * One operation: a (batched) matmul with fused post-ops,
 *   T = alpha * A @ B + bias            (bias only with alpha == 1: oneDNN 2.x
 *                                         scales after it)
 *   C = gelu?(T) + residual? + sum * C  (residual: a tensor of C's dtype,
 *                                         shape and strides)
 * or, in place of the GELU, T * aux (aux: as the residual).
 * where A is (batch..., m, k), B (batch..., k, n), C (batch..., m, n), each
 * given by element strides, so transposes, leading
 * dimensions, broadcast batch members (stride 0) and the per-(sample, head)
 * blocks of attention read in place through a token stride are all just
 * strides. Primitives are created once per description and kept in a
 * per-thread table (see dnnl_engine.c).
 */
#ifndef VITHOST_CPU_DNNL_ENGINE_H
#define VITHOST_CPU_DNNL_ENGINE_H

#include <stdint.h>

#include "cpu_ops.h"

#define VH_DNNL_MAX_BATCH_DIMS 2

/* Zero it (vh_dnnl_matmul_init), then fill: it is also the cache key, compared
 * byte for byte. */
typedef struct vh_dnnl_matmul {
    int64_t batch[VH_DNNL_MAX_BATCH_DIMS];  /* sizes of C's batch dims */
    int64_t m, n, k;
    /* Strides in elements, batch dims first: A (.., m, k), B (.., k, n),
     * C (.., m, n). A batch stride of 0 in A or B broadcasts that operand
     * over the dim. */
    int64_t sa[VH_DNNL_MAX_BATCH_DIMS + 2];
    int64_t sb[VH_DNNL_MAX_BATCH_DIMS + 2];
    int64_t sc[VH_DNNL_MAX_BATCH_DIMS + 2];
    /* 0: B is read through sb. Otherwise B is packed (vh_dnnl_matmul_pack_b)
     * in the layout with this fingerprint; a kernel that reads another
     * layout is unsupported, and the caller runs plain B instead. */
    uint64_t b_layout;
    /* 4-byte members last: no padding, so byte comparison is exact */
    int32_t batch_dims;  /* 0, 1 or 2 */
    vh_dtype ab_dtype;   /* f32 or bf16 (bf16 only where vh_gemm16_native) */
    vh_dtype c_dtype;
    float alpha;
    int32_t has_bias;    /* f32, n values, every row */
    int32_t gelu;        /* erf GELU on T */
    float sum;           /* != 0: C_old * sum is added (beta, +1 for a residual in C) */
    int32_t residual;    /* a residual tensor is added (binary post-op), after gelu */
    int32_t kernel;      /* vh_dnnl_kernel: which of oneDNN's implementations runs it */
    int32_t mul_aux;     /* T * aux (binary post-op) where gelu would be; not with gelu */
} vh_dnnl_matmul;

_Static_assert(sizeof(vh_dnnl_matmul) == 18 * 8 + 10 * 4, "vh_dnnl_matmul has no padding");

/* oneDNN 2.x has two matmul implementations for these CPUs: brgemm (its
 * first choice on AVX-512: B copied into blocks, A read in place where it
 * can) and gemm (the BLAS-style driver: both operands packed into panels).
 * Which is faster depends on the shape (gemm_choice.c measures it for
 * 16-bit operands, and for f32 weight gradients and T * aux). A description whose kernel oneDNN does not have runs on
 * the default. */
typedef enum vh_dnnl_kernel {
    VH_DNNL_KERNEL_DEFAULT = 0,
    VH_DNNL_KERNEL_GEMM = 1,
} vh_dnnl_kernel;

VH_CPU_HIDDEN void vh_dnnl_matmul_init(vh_dnnl_matmul *mm);

/* Runs one matmul. VH_STATUS_ERR_UNSUPPORTED when oneDNN has no
 * implementation for it (or only its slow reference one): the caller then
 * takes a simpler route (plain f32, post-ops done by hand). */
VH_CPU_HIDDEN vh_status vh_dnnl_matmul_run(const vh_dnnl_matmul *mm, const void *a,
                                           const void *b, const float *bias, void *c);
/* The same with the tensors of the binary post-ops: the residual of
 * mm->residual and the aux of mm->mul_aux (C's dtype and strides), NULL where
 * the description has none. */
VH_CPU_HIDDEN vh_status vh_dnnl_matmul_run_binary(const vh_dnnl_matmul *mm, const void *a,
                                                  const void *b, const float *bias,
                                                  const void *aux, const void *residual,
                                                  void *c);

/* B packed once for many calls, the row bands of one GEMM (gemm.c's
 * run_bands), or first for one call of many rows (gemm.c's matmul_run).
 * oneDNN's brgemm copies a B it is given plain into its own blocks at
 * every call (bf16: pairs of k interleaved for the dot products; f32:
 * blocks of 16 x 64), and again for each chunk of rows it runs: a band of
 * 128 rows pays for the whole copy each time. For a plain, unbatched
 * description mm (b_layout 0):
 * the bytes of B in the layout its kernel reads (oneDNN's weights format
 * "any"), 0 where that is B's plain layout already, or the kernel is not
 * brgemm (only brgemm runs the same sums on packed and plain B, but for
 * 16-bit operands with k of 1024 or more: see gemm.c's matmul_run). */
VH_CPU_HIDDEN size_t vh_dnnl_matmul_packed_b_bytes(const vh_dnnl_matmul *mm);
/* Writes B (read through mm's strides) into `packed`, 64-byte aligned and
 * vh_dnnl_matmul_packed_b_bytes(mm) long, in that layout (all threads, outside
 * a parallel region), and the layout's fingerprint to *layout: run
 * descriptions with b_layout = *layout on it. */
VH_CPU_HIDDEN vh_status vh_dnnl_matmul_pack_b(const vh_dnnl_matmul *mm, const void *b,
                                              void *packed, uint64_t *layout);

/* ISA levels of oneDNN's effective ISA (the CPU's, capped by
 * ONEDNN_MAX_CPU_ISA), which our own kernels are held to as well: a test
 * that caps oneDNN takes a smaller CPU's route everywhere. The CPU
 * multiplies bf16 natively where AVX512_CORE_BF16 is in (avx512_bf16 or
 * AMX). */
typedef enum vh_dnnl_isa {
    VH_DNNL_ISA_AVX2,
    VH_DNNL_ISA_AVX512_CORE,
    VH_DNNL_ISA_AVX512_CORE_BF16,
    VH_DNNL_ISA_AVX512_CORE_AMX,
} vh_dnnl_isa;

/* Does oneDNN's effective ISA include `level`? */
VH_CPU_HIDDEN int vh_dnnl_isa_has(vh_dnnl_isa level);

/* The CPU's ISA as oneDNN sees it ("avx2", "avx512_core_bf16", ...). */
VH_CPU_HIDDEN const char *vh_dnnl_isa_name(void);

/* Primitives this thread has created (the cache's misses). */
VH_CPU_HIDDEN uint64_t vh_dnnl_primitives_created(void);

/* "oneDNN 2.6.3": the library this process runs on. */
VH_CPU_HIDDEN const char *vh_dnnl_version_name(void);

/* ---- 16-bit operands: native kernels or widened to f32 (gemm_choice.c) ----
 * and, for f32 weight gradients and T * aux, which of oneDNN's two kernels. */

typedef struct vh_gemm16_shape {
    vh_dtype dtype; /* of A and B: bf16 or f16; f32 for the kernel choice alone */
    int trans_a, trans_b;
    int64_t batch, m, n, k;
    int mul_aux; /* f32: the call's VH_EPILOGUE_MUL_AUX, timed with it (a class of its own) */
} vh_gemm16_shape;

/* The paths of a GEMM with 16-bit operands. */
typedef enum vh_gemm16_path {
    VH_GEMM16_WIDEN = 0,       /* converted to f32 first, f32 kernels */
    VH_GEMM16_NATIVE = 1,      /* the 16-bit operands to oneDNN's default kernel */
    VH_GEMM16_NATIVE_GEMM = 2, /* the same on oneDNN's gemm kernel (VH_DNNL_KERNEL_GEMM) */
} vh_gemm16_path;

/* Seconds one run of the call's matmul takes on a path (vh_gemm16_path),
 * restricted to the first proxy->batch x m x n x k of its operands, the
 * widening counted; negative when the path cannot run it. A timer is asked
 * for VH_GEMM16_NATIVE_GEMM on an unbatched 16-bit shape, and on f32 ones
 * (NATIVE: the default kernel), batched as a call in halves of k. */
typedef double (*vh_gemm16_timer)(void *ctx, int path, const vh_gemm16_shape *proxy);

/* The path of this GEMM. Forced by VITHOST_CPU_GEMM16, else decided once
 * per shape class by timing the paths with `timer` (gemm_choice.c). For
 * f32 operands NATIVE or NATIVE_GEMM: forced by VITHOST_CPU_GEMM32, else
 * timed for the classes that gemm_choice.c names. */
VH_CPU_HIDDEN vh_gemm16_path vh_gemm16_choose(const vh_gemm16_shape *s, vh_gemm16_timer timer,
                                              void *ctx);

/* vh_gemm16_choose(...) != VH_GEMM16_WIDEN. */
VH_CPU_HIDDEN int vh_gemm16_native(const vh_gemm16_shape *s, vh_gemm16_timer timer, void *ctx);

#endif
