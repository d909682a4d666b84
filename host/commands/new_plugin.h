/* new_plugin.h - `vithost new-plugin ROLE NAME [DIR]`: writes a small plugin
 * project (CMakeLists.txt, NAME.c, NAME.yaml, README.md) that builds against
 * the installed SDK and trains the main job as written. */
#ifndef VITHOST_HOST_NEW_PLUGIN_H
#define VITHOST_HOST_NEW_PLUGIN_H

#include <stdio.h>

/* The templates, embedded at build time (cmake/templates/, and the main
 * job's recipe as "recipe.yaml"); ends with {NULL, NULL}. */
typedef struct new_plugin_file {
    const char *name;
    const char *text;
} new_plugin_file;
extern const new_plugin_file new_plugin_files[];

/* argv: ROLE NAME [DIR] (what follows `new-plugin`). Returns an exit code
 * of cli.h: 0, VH_EXIT_USAGE for a bad role, name or file that exists,
 * VH_EXIT_RUN_FAILED when a file cannot be written. */
int new_plugin_command(int argc, char **argv, FILE *out, FILE *err);

#endif
