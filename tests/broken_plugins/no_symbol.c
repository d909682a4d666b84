/* no_symbol.c - a shared object that exports something, but no descriptor. */
#include "vithost/vh_plugin.h"

VH_PLUGIN_EXPORT int vh_not_a_plugin(void);
VH_PLUGIN_EXPORT int vh_not_a_plugin(void) { return 42; }
