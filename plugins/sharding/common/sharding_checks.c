/* sharding_checks.c - setup checks and state io shared by every sharding
 * plugin (sharding_checks.h). */
#include "sharding_checks.h"

#include <stdint.h>

static vh_status check_policy(vh_host *host, const vh_device_ops *dev, const char *plugin,
                                const vh_precision_policy *pol) {
    if (pol->master_weights && pol->master_dtype != VH_DTYPE_F32)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "master copies must be f32 (the policy asks for %s)",
                               vh_dtype_name(pol->master_dtype));
    if (pol->state_dtype != VH_DTYPE_F32)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "%s keeps the optimizer state in f32 (the policy asks for %s)",
                               plugin, vh_dtype_name(pol->state_dtype));
    if (!vh_dtype_is_float(pol->param_dtype))
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "parameters of dtype %s are not supported (f32, f16 or bf16)",
                               vh_dtype_name(pol->param_dtype));
    if (!vh_dtype_is_float(pol->grad_dtype))
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "gradients of dtype %s are not supported (f32, f16 or bf16)",
                               vh_dtype_name(pol->grad_dtype));
    /* f32 gradients travel in f32; 16-bit ones in their dtype or in f32. */
    if (pol->comm_dtype != VH_DTYPE_F32 && pol->comm_dtype != pol->grad_dtype)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "%s reduces gradients in their own dtype or in f32; the policy "
                               "asks for %s grads with %s on the wire",
                               plugin, vh_dtype_name(pol->grad_dtype),
                               vh_dtype_name(pol->comm_dtype));
    if ((sharding_is_half(pol->param_dtype) || sharding_is_half(pol->grad_dtype)) && !dev->convert)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "%s parameters or %s gradients need the device's convert op, "
                               "which %s lacks",
                               vh_dtype_name(pol->param_dtype), vh_dtype_name(pol->grad_dtype),
                               dev->name ? dev->name : "the device");
    return VH_STATUS_OK;
}

static vh_status check_table(vh_host *host, const vh_param_table *t) {
    if (!t || t->num_units < 1 || !t->units)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "empty parameter table");
    int64_t total = 0;
    int64_t params = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        if (ud->numel < 1 || ud->num_params < 1 || !ud->params)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unit %d (%s) is empty",
                                   (int)u, ud->name ? ud->name : "?");
        int64_t sum = 0;
        for (int32_t i = 0; i < ud->num_params; i++) {
            const vh_param_desc *pd = &ud->params[i];
            if (pd->numel < 1 || pd->numel != vh_param_desc_numel(pd) || pd->offset != sum)
                return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                       "unit %d (%s) param %d (%s): offset %lld / numel %lld do "
                                       "not follow the shape and declaration order",
                                       (int)u, ud->name ? ud->name : "?", (int)i,
                                       pd->name ? pd->name : "?", (long long)pd->offset,
                                       (long long)pd->numel);
            if (pd->numel > INT64_MAX / 16 - sum)
                return host->api->fail(host, VH_STATUS_ERR_NOMEM, "unit %d is too large", (int)u);
            sum += pd->numel;
        }
        if (sum != ud->numel)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "unit %d (%s): numel %lld, its params sum to %lld", (int)u,
                                   ud->name ? ud->name : "?", (long long)ud->numel,
                                   (long long)sum);
        if (sum > INT64_MAX / 16 - total)
            return host->api->fail(host, VH_STATUS_ERR_NOMEM, "the table is too large");
        total += sum;
        params += ud->num_params;
    }
    if (total != t->numel)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "table numel %lld, its units sum to %lld", (long long)t->numel,
                               (long long)total);
    /* Padding adds at most 64 bytes a parameter to the 4 of an element. */
    if ((uint64_t)total > SIZE_MAX / 8 / sizeof(float) || params > INT32_MAX / 2)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                               "%lld parameters do not fit this machine's address space",
                               (long long)total);
    return VH_STATUS_OK;
}

vh_status sharding_read_setup(vh_host *host, const vh_device_ops *dev, const vh_comm *comm,
                              const char *plugin, const vh_sharding_setup *setup,
                              vh_sharding_setup *out, vh_precision_policy *policy) {
    /* Older (smaller) setups and policies read with their missing members
     * zero, the defaults. */
    if (!vh_struct_upgrade(out, sizeof *out, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "sharding setup missing");
    if (out->state_slots < 0 || out->state_slots > VH_OPTIM_MAX_STATE_SLOTS)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "%d optimizer state slots, 0 to %d allowed",
                               (int)out->state_slots, VH_OPTIM_MAX_STATE_SLOTS);
    vh_status st = check_table(host, out->table);
    if (st != VH_STATUS_OK) return st;
    if (!vh_struct_upgrade(policy, sizeof *policy, out->policy))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sharding setup without a precision policy");
    st = check_policy(host, dev, plugin, policy);
    if (st != VH_STATUS_OK) return st;
    if (comm->world_size < 1 || comm->rank < 0 || comm->rank >= comm->world_size)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                               "communicator of rank %d in a world of %d", (int)comm->rank,
                               (int)comm->world_size);
    return VH_STATUS_OK;
}

vh_status sharding_state_io(vh_host *host, const vh_device_ops *dev, const vh_param_table *table,
                            const vh_param_slice *slices, int32_t count, int32_t state_slots,
                            const vh_state_io *io, int save) {
    const char *call = save ? "state_save" : "state_load";
    vh_state_io v;
    if (!vh_struct_upgrade(&v, sizeof v, io) || (save ? !v.write : !v.read))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s: no state io or no %s", call,
                               save ? "write" : "read");
    int64_t largest = 0;
    for (int32_t n = 0; n < count; n++)
        if (slices[n].count > largest) largest = slices[n].count;
    if (state_slots == 0 || largest == 0) return VH_STATUS_OK;
    float *buf = host->api->alloc(host, (size_t)largest * sizeof(float));
    if (!buf)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "%s: out of memory for %lld values",
                               call, (long long)largest);
    vh_status st = VH_STATUS_OK;
    for (int32_t n = 0; n < count && st == VH_STATUS_OK; n++) {
        const vh_param_slice *sl = &slices[n];
        size_t bytes = (size_t)sl->count * sizeof(float);
        for (int32_t k = 0; k < state_slots && st == VH_STATUS_OK; k++) {
            const char *what = "copying";
            if (save) {
                st = dev->copy(dev->device, buf, sl->state[k], bytes,
                               VH_COPY_KIND_DEVICE_TO_HOST, NULL);
                if (st == VH_STATUS_OK) {
                    what = "writing";
                    st = v.write(v.ctx, sl->unit, sl->param, k, sl->offset, sl->count,
                                 VH_DTYPE_F32, buf);
                }
            } else {
                what = "reading";
                st = v.read(v.ctx, sl->unit, sl->param, k, sl->offset, sl->count, VH_DTYPE_F32,
                            buf);
                if (st == VH_STATUS_OK) {
                    what = "copying";
                    st = dev->copy(dev->device, sl->state[k], buf, bytes,
                                   VH_COPY_KIND_HOST_TO_DEVICE, NULL);
                }
            }
            if (st != VH_STATUS_OK) {
                const char *unit = table->units[sl->unit].name;
                st = host->api->fail(host, st,
                                     "%s: %s state slot %d of unit %d (%s) param %d elements "
                                     "%lld..%lld failed",
                                     call, what, (int)k, (int)sl->unit, unit ? unit : "?",
                                     (int)sl->param, (long long)sl->offset,
                                     (long long)(sl->offset + sl->count));
            }
        }
    }
    host->api->free(host, buf);
    return st;
}
