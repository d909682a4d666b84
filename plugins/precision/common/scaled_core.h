/* scaled_core.h - the loss-scaled precision plugin (amp, fp16) as one core.
 *
 * A loss-scaled plugin is a policy plus the same machinery: the scaler and
 * the overflow check (scaled_grads.h), the policy's copy-out, and a state
 * blob that is a precision_io.h header (tag, version 1, one policy word)
 * followed by the scaler's state. The core implements every vtable call;
 * a plugin gives a scaled_spec (its name, its state tag, how it reads its
 * own keys into a policy, its lines) and defines its vtable with it:
 *
 *     static const scaled_spec spec = {.name = "amp", ...};
 *     SCALED_CORE_DEFINE_VTABLE(vtable, spec);
 *     VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, "amp", "0.1.0", "...", schema, vtable);
 *
 * Compiled into each plugin (not part of the SDK). */
#ifndef VITHOST_PLUGINS_SCALED_CORE_H
#define VITHOST_PLUGINS_SCALED_CORE_H

#include <stdint.h>

#include "scaled_grads.h"
#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_precision.h"

/* What a plugin's keys decide. */
typedef struct scaled_config {
    vh_precision_policy policy; /* this minor's; struct_size unused */
    uint32_t state_word;        /* saved in the state; compared on resume */
    const char *mode;           /* loss_scaling with auto resolved: dynamic|static|none */
} scaled_config;

typedef struct scaled_spec {
    const char *name;     /* "amp": the plugin's name in the state's messages */
    uint32_t state_magic; /* the state's tag */
    /* Where loss_scaling none with f16 gradients is warned about: the
     * warning's "(loss_scaling: dynamic is <default_note>)". */
    const char *default_note;
    /* Reads and checks the plugin's keys (nothing is allocated yet). */
    vh_status (*configure)(vh_host *host, scaled_config *out);
    /* The plugin's info line, once the scaler holds its first scale. */
    void (*describe)(vh_host *host, const scaled_config *c, double scale);
    /* After a resume: a checkpoint whose word differs from c->state_word
     * (another policy of the same plugin) is said, not refused. */
    void (*resumed)(vh_host *host, const scaled_config *c, uint32_t saved_word);
} scaled_spec;

/* The schema rows every loss-scaled plugin has, after its own keys:
 * reduce_dtype (its help and the wire dtypes it takes are the plugin's),
 * loss_scaling (what auto means is the plugin's), then the scaler's keys. */
#define SCALED_CORE_SCHEMA_KEYS(reduce_help_, reduce_values_, scaling_auto_)                   \
    {"reduce_dtype", VH_CONFIG_TYPE_ENUM, "auto", reduce_help_, reduce_values_, 0, 0, 0},      \
    {"loss_scaling", VH_CONFIG_TYPE_ENUM, "auto",                                              \
     "auto (" scaling_auto_ "), dynamic (back off on overflow, grow after growth_interval "    \
     "good steps), static (init_scale, fixed), none (scale 1)",                                \
     "auto|dynamic|static|none", 0, 0, 0},                                                     \
    SCALED_GRADS_SCHEMA_KEYS

/* Key readers that fail with the key's name. scaled_core_wire_keys reads
 * the two keys every loss-scaled plugin has: reduce_dtype and loss_scaling
 * (as spelt; auto is the plugin's to resolve). */
vh_status scaled_core_string(vh_host *host, const char *key, const char **out);
vh_status scaled_core_bool(vh_host *host, const char *key, int *out);
vh_status scaled_core_wire_keys(vh_host *host, const char **reduce_dtype,
                                const char **loss_scaling);

vh_status scaled_core_create(vh_host *host, void **self, const scaled_spec *spec);
void scaled_core_destroy(void *self);
vh_status scaled_core_policy(void *self, vh_precision_policy *out);
float scaled_core_loss_scale(void *self);
vh_status scaled_core_unscale_and_check(void *self, const vh_param_slices *grads,
                                        int *found_inf);
vh_status scaled_core_update(void *self, int found_inf);
vh_status scaled_core_state_size(void *self, size_t *bytes);
vh_status scaled_core_state_save(void *self, void *buf, size_t bytes);
vh_status scaled_core_state_load(void *self, const void *buf, size_t bytes);
vh_status scaled_core_grad_sum_sq(void *self, double *out, int *has);

/* Defines `static const vh_precision_vtable vtable_`: every call the core's,
 * create with the plugin's spec. */
#define SCALED_CORE_DEFINE_VTABLE(vtable_, spec_)                                         \
    static vh_status vtable_##_create(vh_host *host, void **self) {                       \
        return scaled_core_create(host, self, &(spec_));                                  \
    }                                                                                     \
    static const vh_precision_vtable vtable_ = {                                          \
        .struct_size = sizeof(vh_precision_vtable), .create = vtable_##_create,           \
        .destroy = scaled_core_destroy, .policy = scaled_core_policy,                     \
        .loss_scale = scaled_core_loss_scale,                                             \
        .unscale_and_check = scaled_core_unscale_and_check, .update = scaled_core_update, \
        .state_size = scaled_core_state_size, .state_save = scaled_core_state_save,       \
        .state_load = scaled_core_state_load, .grad_sum_sq = scaled_core_grad_sum_sq,     \
    }

#endif
