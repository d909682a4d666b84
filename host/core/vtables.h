/* vtables.h - what the host knows of each role's vtable: its members, which
 * of them a plugin must have, and the host's default for the others.
 *
 * Within a major version a role's vtable only grows at the end, by optional
 * calls (vh_plugin.h). A plugin built for an older minor ships a shorter
 * vtable; a plugin of any minor may leave an optional call NULL. The host
 * never reads a plugin's vtable directly: the loader checks it against the
 * table here and hands the host a full-size copy (vtable_upgrade) in which
 * every optional call the plugin lacks is the host's default.
 */
#ifndef VITHOST_HOST_VTABLES_H
#define VITHOST_HOST_VTABLES_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_plugin.h"

/* The roles this host knows, VH_ROLE_MODEL .. VH_ROLE_DATA. Private to the
 * host: the ABI has no public count, which would move with every minor. */
#define VH_HOST_ROLE_COUNT 5

typedef struct vh_vtable_member {
    const char *name; /* "backward" */
    size_t offset;    /* within the role's vtable */
    int required;     /* 1: NULL or missing refuses the plugin */
    /* For a call that may be replaced by a newer one (optim's step by
     * update): the other's name and offset; the plugin is refused only when
     * both are NULL or missing. NULL for the others. */
    const char *alternative;
    size_t alternative_offset;
} vh_vtable_member;

typedef struct vh_role_vtable {
    const char *type_name;  /* "vh_model_vtable" */
    size_t size;            /* sizeof this host's vtable */
    size_t required_size;   /* the least vtable_size that holds every required call */
    const vh_vtable_member *members; /* in declaration order */
    int count;
} vh_role_vtable;

/* NULL for a role out of range. */
const vh_role_vtable *vtable_info(vh_role role);

/* The first required member that is NULL in a plugin's vtable of
 * `plugin_size` bytes (>= required_size), or NULL when there is none. */
const vh_vtable_member *vtable_missing_required(vh_role role, const void *plugin_vtable,
                                                size_t plugin_size);

/* A malloc'd copy of the role's full-size vtable: the plugin's first
 * min(plugin_size, size) bytes, every member past them zero, then the host's
 * default in each optional member still NULL. struct_size is the host's.
 * Members without a default stay NULL and the host does without them: the
 * model's load_weights (the host's loader by name and shape), the precision
 * plugin's grad_sum_sq (the optimizer computes its own norm), the sharding
 * plugin's memory (no byte counts in the memory line) and set_sync (ABI 2.2:
 * run.grad_accum > 1 is refused), the optimizer's caps and the sharding
 * plugin's refresh_updated (ABI 2.9: no capabilities, f32 slices; refresh
 * after every update). NULL when out of memory. */
void *vtable_upgrade(vh_role role, const void *plugin_vtable, size_t plugin_size);

#endif
