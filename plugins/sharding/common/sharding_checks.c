/* sharding_checks.c - setup checks shared by ddp and fsdp (sharding_checks.h). */
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
