/* old_minor_model.c - the test model as a plugin built against an older
 * minor of ABI 2 would ship it: a descriptor that ends before get_extension
 * and a model vtable that ends at `backward`, the last required call.
 *
 * The host must load it, train and checkpoint with it, and take its own
 * defaults for every call the plugin does not have (FLOPs, state, initial
 * weights, named weights). Right after the descriptor and after the vtable
 * lie words that are not pointers: a host that reads past either size
 * calls one of them and crashes the test.
 *
 * The model itself is test_model.c, included whole; its own descriptor is
 * left out (VH_PLUGIN_DEFINE expands to nothing here).
 */
#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_plugin.h"

#undef VH_PLUGIN_DEFINE
#define VH_PLUGIN_DEFINE(...) /* test_model.c's descriptor: replaced below */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-const-variable" /* its full vtable */
#pragma GCC diagnostic ignored "-Wpedantic"
#include "test_model.c"
#pragma GCC diagnostic pop

/* vh_model_vtable up to its last required call. */
typedef struct required_model_vtable {
    uint32_t struct_size;
    vh_status (*create)(vh_host *host, const vh_model_setup *setup, void **self);
    void (*destroy)(void *self);
    const vh_param_table *(*param_table)(void *self);
    vh_status (*init_unit)(void *self, int32_t unit, float *values, uint64_t seed);
    vh_status (*forward)(void *self, const vh_batch *batch, vh_mode mode,
                         const vh_unit_hooks *hooks, vh_model_output *out);
    vh_status (*backward)(void *self, float loss_scale, const vh_unit_hooks *hooks);
} required_model_vtable;
_Static_assert(offsetof(required_model_vtable, backward) ==
                   offsetof(vh_model_vtable, backward),
               "the same layout as the SDK's vtable, up to backward");
_Static_assert(sizeof(required_model_vtable) ==
                   offsetof(vh_model_vtable, train_flops_per_image),
               "ends where the first optional call begins");

/* Odd values that are no function: calling one faults. */
#define POISON {(uintptr_t)0x51, (uintptr_t)0x53, (uintptr_t)0x55, (uintptr_t)0x57, \
                (uintptr_t)0x59, (uintptr_t)0x5b, (uintptr_t)0x5d, (uintptr_t)0x5f}

static const struct {
    required_model_vtable vtable;
    uintptr_t poison[8];
} old_vtable = {
    {.struct_size = sizeof(required_model_vtable), .create = model_create,
     .destroy = model_destroy, .param_table = model_param_table,
     .init_unit = model_init_unit, .forward = model_forward, .backward = model_backward},
    POISON,
};

/* vh_plugin_descriptor up to vtable_size: no get_extension. */
typedef struct old_descriptor {
    uint32_t magic;
    uint16_t abi_major, abi_minor;
    uint32_t struct_size;
    vh_role role;
    const char *name, *version, *description;
    const vh_config_key *schema;
    const void *vtable;
    uint32_t vtable_size;
} old_descriptor;
_Static_assert(offsetof(old_descriptor, vtable_size) ==
                   offsetof(vh_plugin_descriptor, vtable_size),
               "the same layout as the SDK's descriptor, up to vtable_size");

typedef struct poisoned_descriptor {
    old_descriptor desc;
    uintptr_t poison[8]; /* where get_extension would be */
} poisoned_descriptor;

VH_PLUGIN_EXPORT extern const poisoned_descriptor vh_plugin;
VH_PLUGIN_EXPORT const poisoned_descriptor vh_plugin = {
    {VH_PLUGIN_MAGIC, VH_ABI_MAJOR, 0, (uint32_t)offsetof(vh_plugin_descriptor, get_extension),
     VH_ROLE_MODEL, "old_minor_model", "0.1.0",
     "test_model as a plugin of an older ABI 2 minor would ship it", schema,
     &old_vtable.vtable, (uint32_t)sizeof(required_model_vtable)},
    POISON,
};
