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

/* The same on a device whose memory the host cannot touch (CUDA): the copies
 * of reduce-scatter, all-gather and gather go through dev->copy, ordered on
 * the collective's stream. With the CPU device (or NULL): vh_comm_self_init. */
VH_SDK_API void vh_comm_self_init_device(vh_comm *out, const vh_device_ops *dev);

/* The scalar f32 <-> f16/bf16 conversions are in vh_types.h. */

/* The one-process communicator as a heap object for hosts that treat every
 * backend alike: vh_comm_open_fn's signature. Close with vh_comm_self_close. */
VH_SDK_API vh_status vh_comm_self_open(const vh_comm_open_args *args, vh_comm **out, char *err,
                                       size_t err_len);
VH_SDK_API void vh_comm_self_close(vh_comm *comm);

/* Entry point of the CUDA device library (libvh_cuda.so), looked up with
 * dlsym so that the host has no link-time dependency on CUDA. Fills `out`
 * (out_size bytes: the caller's sizeof(vh_device_ops); the library fills
 * what that covers) for device `ordinal`; on failure writes a message into
 * err. args->abi_major must be the library's. */
#define VH_CUDA_OPEN_SYMBOL "vh_cuda_device_open"
typedef struct vh_cuda_open_args {
    uint32_t struct_size;
    uint16_t abi_major, abi_minor; /* of the host */
    int32_t ordinal;               /* the GPU: usually the local rank */
} vh_cuda_open_args;
typedef vh_status (*vh_cuda_device_open_fn)(const vh_cuda_open_args *args, vh_device_ops *out,
                                            size_t out_size, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
