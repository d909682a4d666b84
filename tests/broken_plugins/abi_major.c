/* abi_major.c - a plugin of the next ABI major. Only the header keeps its
 * layout across majors; the rest here is laid out differently (as a future
 * major may), so the host must refuse it from the header alone. */
#include <stdint.h>

#include "vithost/vh_plugin.h"

typedef struct next_major_descriptor {
    uint32_t magic;
    uint16_t abi_major, abi_minor;
    uint32_t struct_size;
    uint32_t flags;            /* where ABI 1 has the role: 0xffffffff is none */
    const char *(*name)(void); /* where ABI 1 has a string: a function */
} next_major_descriptor;

static const char *plugin_name(void) { return "abi_major"; }

VH_PLUGIN_EXPORT extern const next_major_descriptor vh_plugin;
VH_PLUGIN_EXPORT const next_major_descriptor vh_plugin = {
    VH_PLUGIN_MAGIC, VH_ABI_MAJOR + 1, 0, sizeof(next_major_descriptor),
    0xffffffffu, plugin_name};
