/* good_precision.c - a valid precision plugin, for the loader's success and
 * wrong-role tests. Its functions are never called, so the vtable holds none.
 * PLUGIN_NAME and PLUGIN_VERSION let one source build the copies used for the
 * duplicate-name and shadowing tests. */
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

static const vh_precision_vtable vtable = {.struct_size = sizeof vtable};

VH_PLUGIN_DEFINE(VH_ROLE_PRECISION, PLUGIN_NAME, PLUGIN_VERSION,
                 "a valid precision plugin for the loader tests", schema, vtable);
