/* vh_cpu_engine.h - what the CPU device computes with: the "vh.cpu.engine"
 * extension of the CPU device (vh_device_ops.get_extension).
 *
 * For benchmarks and logs ("which ISA did these numbers come from?") and for
 * tests that hold oneDNN to a lower ISA (ONEDNN_MAX_CPU_ISA) and check that
 * the device saw it. Read it through struct_size like every versioned struct.
 */
#ifndef VITHOST_VH_CPU_ENGINE_H
#define VITHOST_VH_CPU_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "vh_export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VH_CPU_ENGINE_EXTENSION "vh.cpu.engine"

typedef struct vh_cpu_engine_info {
    uint32_t struct_size;
    const char *engine;  /* "oneDNN 2.6.3" */
    const char *isa;     /* as oneDNN uses it: "avx2", "avx512_core_bf16", ... */
    int32_t native_bf16; /* 1: bf16 GEMMs run on bf16 hardware; 0: converted to f32 */
    int32_t native_f16;  /* likewise for f16 (0 on every CPU oneDNN 2.x supports) */
    /* For the calling thread, since it started: oneDNN primitives created
     * and heap allocations of the engine's scratch memory. Both stop growing
     * once every shape of a step has been seen (tests check it). */
    void (*thread_counters)(uint64_t *primitives_created, uint64_t *scratch_allocations);
} vh_cpu_engine_info;

/* ---- GEMMs with 16-bit operands (ABI 2.1 additions) ----------------------
 * Each such GEMM runs either on oneDNN's native bf16 kernels or with its
 * operands widened to f32 inside the GEMM; both give the fp32-accumulated
 * result (bf16 products are exact in f32). The path is chosen per shape
 * class (layout, batched or not, work within a factor of 4) by timing both
 * on the class's first GEMM, once per process (for weight gradients on the
 * native kernels, also which of oneDNN's two bf16 kernels), unless the
 * environment variable VITHOST_CPU_GEMM16=native|native_gemm|widen|auto
 * (default auto) forces it (native_gemm: oneDNN's gemm kernel). An
 * invalid value is reported once on stderr and auto is used. native on a CPU
 * without the kernels (no avx512_bf16; f16 on oneDNN 2.x) widens. GEMMs
 * with f32 operands have the same two kernels: the weight gradients (A^T.B)
 * and T * aux (VH_EPILOGUE_MUL_AUX) take the faster, timed the same way
 * (VITHOST_CPU_GEMM32=default|gemm|auto); the others run the default. Auto
 * may choose differently in another process on a near tie: force a path to
 * compare runs bit for bit across processes (a resumed run takes its
 * checkpoint's choices, below). */

/* One line into buf (truncated to len), returned: how this process runs
 * GEMMs with dtype operands (VH_DTYPE_BF16 or VH_DTYPE_F16), e.g.
 * "bf16 GEMM: auto: native on 9 shape classes (1.92x widen), widen on 1
 * (1.15x native)" or "bf16 GEMM: widen to f32 (VITHOST_CPU_GEMM16=widen)";
 * with VH_DTYPE_F32, which kernels its f32 GEMMs run ("f32 GEMM: auto:
 * oneDNN's gemm kernel on 3 of 4 timed shape classes (1.14x the default)"). */
VH_SDK_API const char *vh_cpu_gemm16_summary(int32_t dtype, char *buf, size_t len);

/* One line per shape class auto has decided: the class, its first shape
 * (batch x m x n x k), the choice and both timings. "" when none. */
VH_SDK_API const char *vh_cpu_gemm16_classes(char *buf, size_t len);

/* The choices this process has made (16-bit paths, f32 kernels), as text to
 * keep beside a checkpoint, and back: a resumed run loads them before its
 * first step, so that its GEMMs run the kernels the run chose, not this
 * process's own timing (the kernels differ in the order of their f32
 * sums, so --resume continues bit for bit). _save returns buf; _load
 * returns the number of classes taken (lines it does not know are
 * skipped) and overrides a class this process already decided. */
VH_SDK_API const char *vh_cpu_gemm_choices_save(char *buf, size_t len);
VH_SDK_API int vh_cpu_gemm_choices_load(const char *text);

/* Forgets every choice and reads VITHOST_CPU_GEMM16 and VITHOST_CPU_GEMM32
 * again (tests, benchmarks). Call it while no GEMM runs. */
VH_SDK_API void vh_cpu_gemm16_reset(void);

/* One line into buf (truncated to len), returned: the routes this process's
 * attention calls (forward and backward) took, e.g. "24 calls: 24 on the
 * bf16 dot-product blocks", or "no calls". The routes:
 * the fused small-head blocks, the bf16 dot-product blocks (AVX512-BF16),
 * oneDNN's bf16 matmuls in per-thread tasks, oneDNN's batched f32 matmuls (16-bit
 * operands widened). VITHOST_CPU_ATTENTION16=onednn keeps the bf16 calls off
 * the dot-product blocks. Where forward calls wrote their f32 probabilities
 * with non-temporal stores (the fused blocks, while the device's tensors hold
 * more than the L3; VITHOST_CPU_STREAM=0 or 1 forces it), it adds "; f32
 * probabilities streamed past the caches in 12 forward calls" (in the text
 * alone, after ABI 2.9). */
VH_SDK_API const char *vh_cpu_attention_routes(char *buf, size_t len);

/* One line into buf (truncated to len), returned: how many of this
 * process's GEMMs ran in bands of rows (a thread's GELU pass on each band
 * while it is in cache) and for how many B was packed once into the
 * kernel's layout for all bands; then, of the GEMMs run as one call that
 * could take B packed (unbatched, 256+ rows and at least k), for how many
 * B was packed into that layout first. E.g. "288 calls in bands of rows: B
 * packed once for 288; B packed first for 840 of 840 one-call GEMMs that
 * could take it (256+ rows, at least k)" ("no calls in bands; ..." before
 * any). VITHOST_CPU_PACK_B=0 turns the packing off. After fp32 GELU calls
 * in bands, it adds in how many of them the aux kept for the backward pass
 * was written with non-temporal stores: "; fp32 GELU's aux streamed past
 * the caches in 24 of 24 calls" (streamed while the device's tensors hold
 * more than the L3; VITHOST_CPU_STREAM=0 or 1 forces it).
 * (The SDK of ABI 2.8; the streaming count came later, in the text alone) */
VH_SDK_API const char *vh_cpu_gemm_bands_summary(char *buf, size_t len);

/* One line into buf (truncated to len), returned: how AMP's GELU backward
 * (the op, and 2.7's GEMM epilogue) gets gelu'(x) of its bf16
 * pre-activations: from a 65536-entry table or computed (the same bits).
 * Under auto the process's first calls race the two, 2^21 values each, and
 * the faster by its median timed span takes the rest, e.g. "bf16 gelu':
 * auto: a table lookup (in the step, median of 65 / 64 spans: table 0.392,
 * computed 0.500 ns a value)"; before that it says "not decided yet".
 * VITHOST_CPU_GELU_GRAD16=table|computed|auto (default auto) forces it.
 * (The SDK of ABI 2.7) */
VH_SDK_API const char *vh_cpu_gelu_grad16_summary(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
