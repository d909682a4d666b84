/* vh_runtime.h - the SDK runtime's entry points for hosts and tests.
 *
 * Plugins do not need this header: they reach the device and the
 * communicator through vh_host_api. The host uses it to build those.
 */
#ifndef VITHOST_VH_RUNTIME_H
#define VITHOST_VH_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "vh_comm.h"
#include "vh_export.h"
#include "vh_device.h"

#ifdef __cplusplus
extern "C" {
#endif



/* The CPU device: a static table, always available. */
VH_SDK_API const vh_device_ops *vh_cpu_device_ops(void);

/* The one-process communicator: every collective is a copy or a no-op. */
VH_SDK_API void vh_comm_self_init(vh_comm *out);

/* Scalar conversions, round to nearest even; NaN stays NaN. */
VH_SDK_API uint16_t vh_f32_to_f16(float x);
VH_SDK_API float vh_f16_to_f32(uint16_t h);
VH_SDK_API uint16_t vh_f32_to_bf16(float x);
VH_SDK_API float vh_bf16_to_f32(uint16_t h);

/* Entry point of the CUDA device library (libvh_cuda.so), looked up with
 * dlsym so that the host has no link-time dependency on CUDA. Fills `out`
 * for device `ordinal`; on failure writes a message into err. */
#define VH_CUDA_OPEN_SYMBOL "vh_cuda_device_open"
typedef vh_status (*vh_cuda_device_open_fn)(int ordinal, vh_device_ops *out,
                                            char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
