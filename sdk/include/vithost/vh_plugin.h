/* vh_plugin.h - the plugin descriptor: what one shared object exports.
 *
 * Each plugin .so exports one data symbol, VH_PLUGIN_SYMBOL ("vh_plugin"), a
 * const vh_plugin_descriptor. It is data, not a function, so the host reads
 * and checks it before calling any plugin code:
 *
 *   magic == VH_PLUGIN_MAGIC, abi_major == host's major, abi_minor <= host's
 *   minor, struct_size large enough, role known, vtable_size covering the
 *   role's required calls, and none of the required calls NULL (the loader
 *   names the missing one). Optional calls may be NULL or lie past a
 *   shorter (older-minor) vtable_size: the host then uses its default.
 *
 * What a minor version may add (and nothing else): members at the end of a
 * struct or table, optional calls at the end of a role's vtable, new enum
 * values, new SDK functions, new extensions. Never: a new required call, a
 * changed member, a removed one. A plugin built for minor m runs on every
 * host of the same major with minor >= m.
 *
 * The first four fields are the header and never change, whatever the major
 * version, so any host can read them and say which versions disagree.
 * Everything after the header is append-only within a major version.
 *
 * A plugin is written as
 *
 *     static const vh_config_key schema[] = { {...}, {NULL} };
 *     static const vh_model_vtable vtable = {
 *         .struct_size = sizeof(vh_model_vtable), .create = vit_create, ... };
 *     VH_PLUGIN_DEFINE(VH_ROLE_MODEL, "vit", "0.1.0", "Vision Transformer",
 *                      schema, vtable);
 */
#ifndef VITHOST_VH_PLUGIN_H
#define VITHOST_VH_PLUGIN_H

#include "vh_export.h"

#include <stdint.h>

#include "vh_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VH_ABI_MAJOR 2
#define VH_ABI_MINOR 9

#define VH_PLUGIN_MAGIC 0x47505856u /* "VXPG" little-endian: a vithost plugin */
#define VH_PLUGIN_SYMBOL "vh_plugin"

typedef enum vh_role {
    VH_ROLE_MODEL = 0,     /* vh_model_vtable */
    VH_ROLE_PRECISION = 1, /* vh_precision_vtable */
    VH_ROLE_SHARDING = 2,  /* vh_sharding_vtable */
    VH_ROLE_OPTIM = 3,     /* vh_optim_vtable */
    VH_ROLE_DATA = 4,      /* vh_data_vtable */
    /* No public count: a host knows the roles of its own minor (and refuses
     * a descriptor whose role it does not know). */
} vh_role;

typedef struct vh_plugin_descriptor {
    /* header: fixed for every ABI major */
    uint32_t magic;
    uint16_t abi_major, abi_minor; /* the SDK the plugin was built against */
    uint32_t struct_size;          /* sizeof(vh_plugin_descriptor) of that SDK */
    /* ABI 1.0 */
    int32_t role; /* vh_role */
    const char *name;        /* unique on the search path: [a-z0-9_-]+ */
    const char *version;     /* the plugin's own version, "1.2.0" */
    const char *description; /* one line */
    const vh_config_key *schema; /* ends with a {NULL} entry; never NULL */
    const void *vtable;      /* the role's vtable */
    uint32_t vtable_size;    /* sizeof that vtable */
    /* ABI 2.0 */
    /* @optional(default: the plugin has no extensions; every name gives
     * NULL) @thread(main). Optional capabilities beyond the role's vtable,
     * by name (LV2's extension_data): returns a struct whose layout the
     * name defines, or NULL when the plugin does not have it. May itself be
     * NULL, and is absent from a descriptor whose struct_size ends before
     * it. @owns(the plugin: static data, never freed by the host)
     * @lifetime(while the plugin's shared object is loaded). */
    const void *(*get_extension)(const char *name);
} vh_plugin_descriptor;

/* "model", "precision", "sharding", "optim", "data"; "?" when out of range. */
VH_SDK_API const char *vh_role_name(vh_role role);

#if defined(__GNUC__)
#define VH_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define VH_PLUGIN_EXPORT
#endif

#define VH_PLUGIN_DEFINE(role_, name_, version_, description_, schema_, vtable_) \
    VH_PLUGIN_DEFINE_EXT(role_, name_, version_, description_, schema_, vtable_, NULL)

/* The same, with a get_extension function. */
#define VH_PLUGIN_DEFINE_EXT(role_, name_, version_, description_, schema_, vtable_,   \
                             get_extension_)                                          \
    VH_PLUGIN_EXPORT const vh_plugin_descriptor vh_plugin = {                         \
        VH_PLUGIN_MAGIC, VH_ABI_MAJOR, VH_ABI_MINOR,                                   \
        (uint32_t)sizeof(vh_plugin_descriptor), (role_), (name_), (version_),          \
        (description_), (schema_), &(vtable_), (uint32_t)sizeof(vtable_),              \
        (get_extension_)}

#ifdef __cplusplus
}
#endif
#endif
