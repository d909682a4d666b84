/* scaled_grads.c - shared by amp and fp16 (scaled_grads.h). */
#include "scaled_grads.h"

#include <string.h>

static vh_status get_float(vh_host *host, const char *key, double *out) {
    vh_status st = host->api->config_float(host, key, out);
    return st == VH_STATUS_OK ? st
                              : host->api->fail(host, st, "cannot read the float key '%s'", key);
}

static int set_in_recipe(vh_host *host, const char *key) {
    vh_config_origin o;
    return host->api->config_origin(host, key, &o) == VH_STATUS_OK &&
           o.source != VH_CONFIG_SOURCE_DEFAULT;
}

static vh_status read_scaler(vh_host *host, const char *mode, vh_loss_scaler *out) {
    vh_loss_scaler_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    vh_status st;
    if ((st = get_float(host, "init_scale", &c.init_scale)) != VH_STATUS_OK ||
        (st = get_float(host, "growth_factor", &c.growth_factor)) != VH_STATUS_OK ||
        (st = get_float(host, "backoff_factor", &c.backoff_factor)) != VH_STATUS_OK ||
        (st = get_float(host, "min_scale", &c.min_scale)) != VH_STATUS_OK ||
        (st = get_float(host, "max_scale", &c.max_scale)) != VH_STATUS_OK)
        return st;
    /* The SDK reads a 0 as "the default" (an older config's missing
     * member); from a recipe it is the user's value, and wrong. */
    if (!(c.backoff_factor > 0.0 && c.backoff_factor < 1.0))
        return host->api->config_fail(host, "backoff_factor",
                                      "%g: must be in (0, 1), e.g. 0.5 halves the loss scale on "
                                      "each overflow",
                                      c.backoff_factor);
    st = host->api->config_int(host, "growth_interval", &c.growth_interval);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the int key 'growth_interval'");
    int dynamic = strcmp(mode, "dynamic") == 0, none = strcmp(mode, "none") == 0;
    static const char *const dynamic_keys[] = {"growth_factor", "backoff_factor",
                                               "growth_interval", "min_scale", "max_scale"};
    for (size_t i = 0; !dynamic && i < sizeof dynamic_keys / sizeof dynamic_keys[0]; i++)
        if (set_in_recipe(host, dynamic_keys[i]))
            host->api->log(host, VH_LOG_LEVEL_WARN, "%s is read by loss_scaling dynamic only",
                           dynamic_keys[i]);
    if (none && set_in_recipe(host, "init_scale"))
        host->api->log(host, VH_LOG_LEVEL_WARN, "init_scale is ignored with loss_scaling none");
    if (!dynamic) c.fixed = 1;
    if (none) c.init_scale = 1.0;
    return vh_loss_scaler_init(out, &c, host);
}

vh_status scaled_grads_init(scaled_grads *g, vh_host *host, const char *mode) {
    memset(g, 0, sizeof *g);
    g->host = host;
    vh_status st = read_scaler(host, mode, &g->scaler);
    return st == VH_STATUS_OK ? vh_grad_check_create(host, &g->check) : st;
}

void scaled_grads_free(scaled_grads *g) {
    if (!g) return;
    vh_grad_check_free(g->check);
    g->check = NULL;
}

vh_status scaled_grads_unscale_and_check(scaled_grads *g, const vh_param_slices *grads,
                                         int *found_inf) {
    g->has_sum_sq = 0;
    vh_status st = vh_grad_check_run(g->check, grads, vh_loss_scaler_unscale_factor(&g->scaler),
                                     found_inf, &g->sum_sq);
    if (st == VH_STATUS_OK) g->has_sum_sq = 1;
    return st;
}

void scaled_grads_sum_sq(const scaled_grads *g, double *out, int *has) {
    *has = g->has_sum_sq;
    *out = g->has_sum_sq ? g->sum_sq : 0.0;
}

/* What a skip at a scale that cannot back off says: at scale 1 (or the
 * floor) the gradients hold a real Inf/NaN, which a smaller scale would not
 * cure; a fixed larger scale may itself be the overflow. */
static const char *stuck_advice(const vh_loss_scaler *ls, float before) {
    if (ls->fixed && before == 1.0f)
        return "; the scale is fixed at 1: the gradients hold a real Inf/NaN (a "
               "diverging loss, a bad input or damaged weights)";
    if (ls->fixed)
        return "; the scale is fixed (loss_scaling static): if every step overflows, lower "
               "init_scale or use loss_scaling: dynamic";
    return "; the scale is at min_scale, so the gradients hold a real Inf/NaN (a diverging "
           "loss, a bad input or damaged weights), or min_scale is too high";
}

void scaled_grads_update(scaled_grads *g, int found_inf) {
    vh_loss_scaler *ls = &g->scaler;
    const float before = ls->scale;
    vh_loss_scaler_update(ls, found_inf);
    if (!found_inf) return;
    /* Early skips are normal while a dynamic scale calibrates; at the floor
     * (or with a fixed scale) a smaller scale cannot help. */
    int stuck = ls->fixed || (double)before <= ls->min_scale;
    g->host->api->log(g->host, stuck ? VH_LOG_LEVEL_WARN : VH_LOG_LEVEL_INFO,
                      "step %lld skipped: gradients overflowed at loss scale %g; scale now %g "
                      "(%lld skipped so far)%s",
                      (long long)ls->steps, (double)before, (double)ls->scale,
                      (long long)ls->skipped, stuck ? stuck_advice(ls, before) : "");
}
