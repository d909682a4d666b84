/* broken.c - one descriptor built by hand, broken in one way per build.
 *
 * CMakeLists.txt builds this file once per case with -DBROKEN_<CASE>; each
 * case below overrides one field of an otherwise valid precision plugin, so a
 * test that expects the case's message fails if the loader checks the wrong
 * thing.
 *
 * The cases the host must refuse from the file alone (other ABI versions)
 * and one it refuses only once loaded (a NULL required call) also carry a
 * constructor that marks the process: the first must never run it, the
 * second shows that the mark works. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

/* Each case uses some of these and not the others. */
#define MAYBE_UNUSED __attribute__((unused))

MAYBE_UNUSED static const vh_config_key good_schema[] = {
    {"scale", VH_CONFIG_TYPE_FLOAT, "1.0", "a loss scale", NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* A key listed twice. */
MAYBE_UNUSED static const vh_config_key duplicate_key_schema[] = {
    {"scale", VH_CONFIG_TYPE_FLOAT, "1.0", "a loss scale", NULL, 0, 0, 0},
    {"scale", VH_CONFIG_TYPE_FLOAT, "2.0", "the same key again", NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* An enum with nothing to choose from. */
MAYBE_UNUSED static const vh_config_key enum_without_choices_schema[] = {
    {"mode", VH_CONFIG_TYPE_ENUM, "fixed", "how the scale moves", NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* Every required call, none of which the loader may call. */
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

MAYBE_UNUSED static const vh_precision_vtable good_vtable = {
    .struct_size = sizeof good_vtable, .create = never_create, .destroy = never_destroy,
    .policy = never_policy, .loss_scale = never_loss_scale,
    .unscale_and_check = never_unscale, .update = never_update};

/* A required call left out. */
MAYBE_UNUSED static const vh_precision_vtable null_required_vtable = {
    .struct_size = sizeof null_required_vtable, .create = never_create,
    .destroy = never_destroy, .policy = never_policy, .loss_scale = never_loss_scale,
    .update = never_update};

/* What a precision vtable of an older, shorter draft looked like. */
typedef struct short_vtable {
    uint32_t struct_size;
    void *create;
} short_vtable;
MAYBE_UNUSED static const short_vtable small_vtable = {sizeof small_vtable, NULL};

/* The vtable's own struct_size was never filled in. */
MAYBE_UNUSED static const vh_precision_vtable unsized_vtable = {.struct_size = 0};

#define MAGIC VH_PLUGIN_MAGIC
#define MINOR VH_ABI_MINOR
#define STRUCT_SIZE sizeof(vh_plugin_descriptor)
#define ROLE VH_ROLE_PRECISION
#define NAME "broken"
#define VERSION "1.0.0"
#define DESCRIPTION "a deliberately broken plugin"
#define SCHEMA good_schema
#define VTABLE (&good_vtable)
#define VTABLE_SIZE sizeof good_vtable

#if defined(BROKEN_BAD_MAGIC)
#undef MAGIC
#define MAGIC 0x12345678u
#elif defined(BROKEN_ABI_MINOR)
#undef MINOR
#define MINOR 99
#define MARKS_THE_PROCESS 1
#elif defined(BROKEN_NEXT_MINOR)
#undef MINOR
#define MINOR (VH_ABI_MINOR + 1)
#define MARKS_THE_PROCESS 1
#elif defined(BROKEN_NULL_REQUIRED)
#undef VTABLE
#define VTABLE (&null_required_vtable)
#define MARKS_THE_PROCESS 1
#elif defined(BROKEN_SMALL_DESCRIPTOR)
#undef STRUCT_SIZE
#define STRUCT_SIZE offsetof(vh_plugin_descriptor, role)
#elif defined(BROKEN_BAD_ROLE)
#undef ROLE
#define ROLE 42
#elif defined(BROKEN_NULL_VTABLE)
#undef VTABLE
#define VTABLE NULL
#elif defined(BROKEN_SMALL_VTABLE)
#undef VTABLE
#undef VTABLE_SIZE
#define VTABLE (&small_vtable)
#define VTABLE_SIZE sizeof small_vtable
#elif defined(BROKEN_VTABLE_STRUCT_SIZE)
#undef VTABLE
#define VTABLE (&unsized_vtable)
#elif defined(BROKEN_NULL_NAME)
#undef NAME
#define NAME NULL
#elif defined(BROKEN_BAD_NAME)
#undef NAME
#define NAME "Bad Name"
#elif defined(BROKEN_NULL_VERSION)
#undef VERSION
#define VERSION NULL
#elif defined(BROKEN_NULL_DESCRIPTION)
#undef DESCRIPTION
#define DESCRIPTION NULL
#elif defined(BROKEN_NULL_SCHEMA)
#undef SCHEMA
#define SCHEMA NULL
#elif defined(BROKEN_BAD_SCHEMA)
#undef SCHEMA
#define SCHEMA duplicate_key_schema
#elif defined(BROKEN_BAD_SCHEMA_ENUM)
#undef SCHEMA
#define SCHEMA enum_without_choices_schema
#else
#error "define one BROKEN_<CASE>"
#endif

#ifdef MARKS_THE_PROCESS
/* Runs when the file is loaded: the test reads the variable back. */
__attribute__((constructor)) static void mark_the_process(void) {
    setenv("VH_TEST_PLUGIN_CODE_RAN", NAME, 1);
}
#endif

VH_PLUGIN_EXPORT extern const vh_plugin_descriptor vh_plugin;
VH_PLUGIN_EXPORT const vh_plugin_descriptor vh_plugin = {
    MAGIC, VH_ABI_MAJOR, MINOR, (uint32_t)(STRUCT_SIZE), (vh_role)(ROLE), NAME, VERSION,
    DESCRIPTION, SCHEMA, VTABLE, (uint32_t)(VTABLE_SIZE), NULL};
