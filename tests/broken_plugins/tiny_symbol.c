/* tiny_symbol.c - exports 'vh_plugin', but as one byte: reading a descriptor
 * header from it would read past the symbol. */
#include <stdint.h>

#include "vithost/vh_plugin.h"

VH_PLUGIN_EXPORT extern const uint8_t vh_plugin;
VH_PLUGIN_EXPORT const uint8_t vh_plugin = 1;
