/* sharding_checks.h - what every sharding plugin of this tree checks at
 * setup, so ddp and fsdp accept and refuse the same tables and policies with
 * the same words. Compiled into each plugin (not part of the SDK). */
#ifndef VITHOST_PLUGINS_SHARDING_CHECKS_H
#define VITHOST_PLUGINS_SHARDING_CHECKS_H

#include "vithost/vh_device.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "vithost/vh_precision.h"

/* The policies a plugin holding f32 masters and f32 optimizer state can
 * serve: f32/f16/bf16 parameters and gradients, 16-bit gradients on the wire
 * in their own dtype or in f32, and the device's convert op when anything
 * is 16-bit. `plugin` names the plugin in the messages. */
vh_status sharding_check_policy(vh_host *host, const vh_device_ops *dev, const char *plugin,
                                const vh_precision_policy *pol);

/* The table is consistent: every parameter's numel follows its shape, the
 * parameters of a unit lie end to end in declaration order, the sums match,
 * and the sizes (with 64-byte padding per parameter) fit the address space. */
vh_status sharding_check_table(vh_host *host, const vh_param_table *t);

static inline int sharding_is_half(vh_dtype t) { return t == VH_DTYPE_F16 || t == VH_DTYPE_BF16; }

#endif
