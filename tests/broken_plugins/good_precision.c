/* good_precision.c - a valid precision plugin, for the loader's success and
 * wrong-role tests. It has every required call (none of which is ever
 * called) and none of the optional ones, whose host defaults the tests
 * check. PLUGIN_NAME and PLUGIN_VERSION let one source build the copies used
 * for the duplicate-name and shadowing tests. */
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "good_precision"
#endif
#ifndef PLUGIN_VERSION
#define PLUGIN_VERSION "1.0.0"
#endif

static const vh_config_key schema[] = {
    {"scale", VH_CONFIG_TYPE_FLOAT, "1.0", "a loss scale", NULL, 0, 0, 0},
    {"mode", VH_CONFIG_TYPE_ENUM, "fixed", "how the scale moves", "fixed|dynamic", 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status never_create(vh_host *host, void **self) {
    (void)host, (void)self;
    return VH_STATUS_ERR_INTERNAL;
}
static void never_destroy(void *self) { (void)self; }
static vh_status never_policy(void *self, vh_precision_policy *out) {
    (void)self, (void)out;
    return VH_STATUS_ERR_INTERNAL;
}
static float never_loss_scale(void *self) {
    (void)self;
    return 0.0f;
}
static vh_status never_unscale(void *self, const vh_param_slices *grads, int *found_inf) {
    (void)self, (void)grads, (void)found_inf;
    return VH_STATUS_ERR_INTERNAL;
}
static vh_status never_update(void *self, int found_inf) {
    (void)self, (void)found_inf;
    return VH_STATUS_ERR_INTERNAL;
}

static const vh_precision_vtable vtable = {
    .struct_size = sizeof vtable, .create = never_create, .destroy = never_destroy,
    .policy = never_policy, .loss_scale = never_loss_scale,
    .unscale_and_check = never_unscale, .update = never_update};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, PLUGIN_NAME, PLUGIN_VERSION,
                 "a valid precision plugin for the loader tests", schema, vtable);
