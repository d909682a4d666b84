/* abi.c - the ABI's versioning helpers: reading a versioned struct of any
 * minor, and the byte layout of a unit whose parameters differ in dtype. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_params.h"
#include "vithost/vh_precision.h"
#include "vithost/vh_types.h"

int vh_struct_upgrade(void *dst, size_t dst_size, const void *src) {
    uint32_t src_size;
    if (!src) return 0;
    memcpy(&src_size, src, sizeof src_size);
    if (src_size < sizeof(uint32_t)) return 0;
    size_t n = src_size < dst_size ? src_size : dst_size;
    memcpy(dst, src, n);
    if (n < dst_size) memset((char *)dst + n, 0, dst_size - n);
    uint32_t own = (uint32_t)dst_size;
    memcpy(dst, &own, sizeof own);
    return 1;
}

/* A policy read through its own struct_size: members it lacks are zero. */
static vh_precision_policy policy_of(const void *policy) {
    vh_precision_policy p;
    memset(&p, 0, sizeof p);
    if (!vh_struct_upgrade(&p, sizeof p, policy)) p.struct_size = sizeof p;
    return p;
}

vh_dtype vh_policy_param_dtype(const void *policy, uint32_t param_flags) {
    vh_precision_policy p = policy_of(policy);
    return (param_flags & p.fp32_param_flags) ? VH_DTYPE_F32 : p.param_dtype;
}

vh_dtype vh_policy_grad_dtype(const void *policy, uint32_t param_flags) {
    vh_precision_policy p = policy_of(policy);
    return (param_flags & p.fp32_param_flags) ? VH_DTYPE_F32 : p.grad_dtype;
}

vh_status vh_unit_layout_init(vh_unit_layout *out, const vh_unit_desc *unit,
                              vh_dtype (*dtype_of)(const void *ctx, uint32_t flags),
                              const void *ctx) {
    memset(out, 0, sizeof *out);
    if (!unit || unit->num_params < 0) return VH_STATUS_ERR_INVALID_ARG;
    size_t n = unit->num_params > 0 ? (size_t)unit->num_params : 1;
    out->offsets = calloc(n, sizeof *out->offsets);
    out->dtypes = calloc(n, sizeof *out->dtypes);
    if (!out->offsets || !out->dtypes) {
        vh_unit_layout_free(out);
        return VH_STATUS_ERR_NOMEM;
    }
    out->num_params = unit->num_params;
    size_t at = 0;
    for (int32_t i = 0; i < unit->num_params; i++) {
        const vh_param_desc *p = &unit->params[i];
        vh_dtype t = dtype_of ? dtype_of(ctx, p->flags) : VH_DTYPE_F32;
        if (!vh_dtype_is_float(t) || p->numel < 0) {
            vh_unit_layout_free(out);
            return VH_STATUS_ERR_INVALID_ARG;
        }
        out->dtypes[i] = t;
        out->offsets[i] = at;
        size_t bytes = (size_t)p->numel * vh_dtype_size(t);
        at += (bytes + VH_UNIT_ALIGN - 1) / VH_UNIT_ALIGN * VH_UNIT_ALIGN;
    }
    out->bytes = at;
    return VH_STATUS_OK;
}

void vh_unit_layout_free(vh_unit_layout *layout) {
    if (!layout) return;
    free(layout->offsets);
    free(layout->dtypes);
    memset(layout, 0, sizeof *layout);
}

vh_status vh_param_slices_check(const vh_param_slices *s, char *why, size_t why_len) {
    const char *reason = NULL;
    char buf[160];
    if (!s)
        reason = "the slice list is NULL";
    else if (s->count < 0)
        reason = "the slice list has a negative count";
    else if (s->count > 0 && !s->items)
        reason = "the slice list has items == NULL";
    else if (s->count > 0 && s->item_size < VH_PARAM_SLICE_SIZE_2_0) {
        snprintf(buf, sizeof buf,
                 "the slice list's item_size %u is smaller than ABI 2.0's vh_param_slice (%zu bytes)",
                 (unsigned)s->item_size, (size_t)VH_PARAM_SLICE_SIZE_2_0);
        reason = buf;
    }
    if (!reason) return VH_STATUS_OK;
    if (why && why_len) snprintf(why, why_len, "%s", reason);
    return VH_STATUS_ERR_INVALID_ARG;
}
