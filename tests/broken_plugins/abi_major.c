/* abi_major.c - a plugin of the next ABI major. Only the header keeps its
 * layout across majors; the rest here is laid out differently (as a future
 * major may), so the host must refuse it from the header alone, before any
 * of its code runs (the constructor below marks the process if it does). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>

#include "vithost/vh_plugin.h"

typedef struct next_major_descriptor {
    uint32_t magic;
    uint16_t abi_major, abi_minor;
    uint32_t struct_size;
    uint32_t flags;            /* where ABI 1 has the role: 0xffffffff is none */
    const char *(*name)(void); /* where ABI 1 has a string: a function */
} next_major_descriptor;

static const char *plugin_name(void) { return "abi_major"; }

__attribute__((constructor)) static void mark_the_process(void) {
    setenv("VH_TEST_PLUGIN_CODE_RAN", "abi_major", 1);
}

VH_PLUGIN_EXPORT extern const next_major_descriptor vh_plugin;
VH_PLUGIN_EXPORT const next_major_descriptor vh_plugin = {
    VH_PLUGIN_MAGIC, VH_ABI_MAJOR + 1, 0, sizeof(next_major_descriptor),
    0xffffffffu, plugin_name};
