/* hidden_symbol.c - a correct descriptor that was not exported: built with
 * -fvisibility=hidden and without VH_PLUGIN_EXPORT, dlsym cannot see it. */
#include "vithost/vh_plugin.h"
#include "vithost/vh_precision.h"

static const vh_config_key schema[] = {{NULL, 0, NULL, NULL, NULL, 0, 0, 0}};
static const vh_precision_vtable vtable = {.struct_size = sizeof vtable};

extern const vh_plugin_descriptor vh_plugin;
const vh_plugin_descriptor vh_plugin = {
    VH_PLUGIN_MAGIC, VH_ABI_MAJOR, VH_ABI_MINOR, sizeof(vh_plugin_descriptor),
    VH_ROLE_PRECISION, "hidden_symbol", "1.0.0", "a descriptor nobody can see",
    schema, &vtable, sizeof vtable, NULL};
