/* vh_cpu_engine.h - what the CPU device computes with: the "vh.cpu.engine"
 * extension of the CPU device (vh_device_ops.get_extension).
 *
 * For benchmarks and logs ("which ISA did these numbers come from?") and for
 * tests that hold oneDNN to a lower ISA (ONEDNN_MAX_CPU_ISA) and check that
 * the device saw it. Read it through struct_size like every versioned struct.
 */
#ifndef VITHOST_VH_CPU_ENGINE_H
#define VITHOST_VH_CPU_ENGINE_H

#include <stdint.h>

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

#ifdef __cplusplus
}
#endif
#endif
