/* slice_sums.c - sums over the optimizer's slices, whole over the ranks
 * (vh_optim_schedule.h): the one rule is that sharded slices need a
 * collective and replicated ones do not. */
#include <string.h>

#include "vithost/vh_optim_schedule.h"
#include "vithost/vh_types.h"

int64_t vh_param_table_tensors(const vh_param_table *table) {
    int64_t n = 0;
    for (int32_t u = 0; table && u < table->num_units; u++) n += table->units[u].num_params;
    return n;
}

int64_t vh_param_table_index(const vh_param_table *table, int32_t unit, int32_t param) {
    if (!table || unit < 0 || unit >= table->num_units || param < 0 ||
        param >= table->units[unit].num_params)
        return -1;
    int64_t first = 0;
    for (int32_t u = 0; u < unit; u++) first += table->units[u].num_params;
    return first + param;
}

vh_status vh_slices_reduce_sums(vh_host *host, const vh_param_slices *slices, double *sums,
                                size_t count) {
    if (!host || !slices || (!sums && count > 0)) return VH_STATUS_ERR_INVALID_ARG;
    if (slices->replicated || count == 0) return VH_STATUS_OK;
    vh_comm *comm = host->api->comm(host);
    if (!comm || comm->world_size <= 1) return VH_STATUS_OK;
    vh_status st = vh_comm_all_reduce(comm, sums, count, VH_DTYPE_F64, VH_REDUCE_OP_SUM);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "all-reduce of %zu sums over %d ranks failed", count,
                               (int)comm->world_size);
    return VH_STATUS_OK;
}

/* Sum of squares of one slice's buffer in double, element order. */
static vh_status slice_sum_sq(vh_host *host, const vh_param_slice *sl, int32_t buffer,
                              double *out) {
    const void *p = buffer == VH_SLICE_BUFFER_MASTER ? sl->master : sl->grad;
    vh_dtype t = buffer == VH_SLICE_BUFFER_MASTER ? sl->master_dtype : sl->grad_dtype;
    double sum = 0.0;
    if (sl->count > 0 && !p)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unit %d param %d has no %s",
                               (int)sl->unit, (int)sl->param,
                               buffer == VH_SLICE_BUFFER_MASTER ? "master" : "gradient");
    if (t == VH_DTYPE_F32) {
        const float *x = p;
        for (int64_t i = 0; i < sl->count; i++) sum += (double)x[i] * (double)x[i];
    } else if (t == VH_DTYPE_F16 || t == VH_DTYPE_BF16) {
        const uint16_t *h = p;
        for (int64_t i = 0; i < sl->count; i++) {
            double x = t == VH_DTYPE_F16 ? vh_f16_to_f32(h[i]) : vh_bf16_to_f32(h[i]);
            sum += x * x;
        }
    } else {
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "unit %d param %d: a sum of squares of %s values", (int)sl->unit,
                               (int)sl->param, vh_dtype_name(t));
    }
    *out = sum;
    return VH_STATUS_OK;
}

static vh_status check_list(vh_host *host, const vh_param_slices *slices) {
    char why[160];
    if (vh_param_slices_check(slices, why, sizeof why) != VH_STATUS_OK)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "slice list: %s", why);
    return VH_STATUS_OK;
}

vh_status vh_slices_sum_sq(vh_host *host, const vh_param_slices *slices, int32_t buffer,
                           double *out) {
    if (!host || !out) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st = check_list(host, slices);
    double total = 0.0;
    for (int32_t s = 0; st == VH_STATUS_OK && s < slices->count; s++) {
        double part = 0.0;
        st = slice_sum_sq(host, vh_param_slices_at(slices, s), buffer, &part);
        total += part;
    }
    if (st == VH_STATUS_OK) st = vh_slices_reduce_sums(host, slices, &total, 1);
    if (st == VH_STATUS_OK) *out = total;
    return st;
}

vh_status vh_slices_sum_sq_per_param(vh_host *host, const vh_param_slices *slices,
                                     const vh_param_table *table, int32_t buffer,
                                     double *per_param) {
    if (!host || !table || !per_param) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st = check_list(host, slices);
    if (st != VH_STATUS_OK) return st;
    const int64_t n = vh_param_table_tensors(table);
    memset(per_param, 0, (size_t)n * sizeof *per_param);
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        int64_t k = vh_param_table_index(table, sl->unit, sl->param);
        if (k < 0)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d (unit %d, param %d) is not in the parameter table",
                                   (int)s, (int)sl->unit, (int)sl->param);
        double part = 0.0;
        if ((st = slice_sum_sq(host, sl, buffer, &part)) != VH_STATUS_OK) return st;
        per_param[k] += part;
    }
    return vh_slices_reduce_sums(host, slices, per_param, (size_t)n);
}
