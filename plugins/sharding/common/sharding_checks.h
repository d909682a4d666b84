/* sharding_checks.h - what every sharding plugin of this tree checks at
 * setup, so ddp, zero1 and fsdp accept and refuse the same tables and
 * policies with the same words; part of the sharding core
 * (sharding_core.h), compiled into each plugin (not part of the SDK). */
#ifndef VITHOST_PLUGINS_SHARDING_CHECKS_H
#define VITHOST_PLUGINS_SHARDING_CHECKS_H

#include "vithost/vh_comm.h"
#include "vithost/vh_device.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "vithost/vh_precision.h"
#include "vithost/vh_sharding.h"

/* What every sharding plugin's setup starts with: reads `setup` and its
 * policy at any (older, smaller) size into *out and *policy, and checks
 * them: the state slots, the table (every parameter's numel follows its
 * shape, parameters end to end in declaration order, sums that match, sizes
 * that fit the address space), the policy (f32 masters and optimizer state;
 * f32/f16/bf16 parameters and gradients; 16-bit gradients on the wire in
 * their own dtype or in f32; the device's convert op when anything is
 * 16-bit) and the communicator's rank. `plugin` names the plugin in the
 * messages. */
vh_status sharding_read_setup(vh_host *host, const vh_device_ops *dev, const vh_comm *comm,
                              const char *plugin, const vh_sharding_setup *setup,
                              vh_sharding_setup *out, vh_precision_policy *policy);

/* Moves the optimizer state of `count` slices through io: state_save
 * copies each slice's state slots device -> host and writes them (f32, at
 * the slice's offset within its parameter), state_load reads and copies
 * them back, through one host buffer of the largest slice. io is read at
 * any (older) size and must have the call needed; a failure names the
 * call, the slot and the parameter (from `table`). `call` is "state_save"
 * or "state_load". count 0 only checks io. */
vh_status sharding_state_io(vh_host *host, const vh_device_ops *dev, const vh_param_table *table,
                            const vh_param_slice *slices, int32_t count, int32_t state_slots,
                            const vh_state_io *io, int save);

static inline int sharding_is_half(vh_dtype t) { return t == VH_DTYPE_F16 || t == VH_DTYPE_BF16; }

#endif
