/* loader.h - finding plugins on the search path and opening them safely.
 *
 * A plugin is a shared object exporting the data symbol VH_PLUGIN_SYMBOL.
 * loader_open reads its descriptor header from the file before loading it
 * (so a plugin of another major or a newer minor is refused before any of
 * its code, constructors included, runs), then checks the whole descriptor
 * and the role's vtable (vtables.h) before any function of the plugin is
 * called, and names the file, the versions or the missing call when it
 * refuses. The host reads the descriptor and the vtable only through
 * full-size copies (vh_plugin.desc), so it never reads past what an older
 * plugin declared.
 *
 * The search path, first match wins: each directory of $VITHOST_PLUGIN_PATH
 * (colon-separated), the build tree's plugins folder next to the executable
 * (<exe dir>/plugins), <exe dir>/../lib/vithost/plugins, and the install
 * prefix's VH_INSTALL_PLUGIN_DIR. A plugin name found in two files of one
 * directory is an error; in two directories, the earlier shadows the later and
 * `vithost plugins` says so.
 */
#ifndef VITHOST_HOST_LOADER_H
#define VITHOST_HOST_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "diag.h"
#include "vithost/vh_plugin.h"

typedef struct vh_plugin {
    char *path;                       /* the file opened */
    void *handle;                     /* dlopen handle */
    /* The host's full-size copy of the checked descriptor: members past the
     * plugin's struct_size are zero, struct_size and vtable_size are the
     * host's, and vtable points at the host's copy of the role's vtable, in
     * which optional calls the plugin lacks are the host's defaults. */
    const vh_plugin_descriptor *desc;
    /* What the plugin itself declared. */
    uint32_t plugin_struct_size, plugin_vtable_size;
    const void *plugin_vtable;
} vh_plugin;

/* Opens one file and checks its descriptor. expected_role < 0: any role.
 * Errors (each names the file): missing file, not a shared object, missing
 * entry symbol, bad magic, ABI major differs, ABI minor newer than the host,
 * descriptor or vtable too small, a required call NULL (named), unknown
 * role, wrong role, invalid name, bad schema. */
vh_status loader_open(vh_plugin *out, const char *path, int expected_role,
                      vh_diag *d);
void loader_close(vh_plugin *p);

/* 1 when the plugin itself has the vtable member at `offset` (within its
 * vtable_size and not NULL), 0 when the host's default stands in for it. */
int loader_plugin_has(const vh_plugin *p, size_t offset);

typedef struct vh_plugin_info {
    char *path;
    char *name;
    vh_role role;
    char *version;
    char *description;
    char *shadowed_by; /* path of the earlier file with the same name, or NULL */
} vh_plugin_info;

typedef struct vh_plugin_path {
    char **dirs;
    int count;
} vh_plugin_path;

/* Builds the search path described above; exe_dir may be NULL (then taken
 * from /proc/self/exe). */
vh_status plugin_path_init(vh_plugin_path *out, const char *exe_dir, vh_diag *d);
void plugin_path_free(vh_plugin_path *p);

/* Scans every directory for *.so files that are plugins. Files that are not
 * valid plugins are reported in `problems` (one message per line) rather than
 * failing the scan; two plugins with one name in one directory fail it. */
vh_status plugin_scan(const vh_plugin_path *path, vh_plugin_info **out, int *count,
                      char **problems, vh_diag *d);
void plugin_infos_free(vh_plugin_info *infos, int count);

/* Resolves a recipe's `plugin:` value: a value ending in ".so" is a path
 * (relative to the current directory); otherwise a plugin name (lowercase
 * letters, digits, '_', '-': nothing that could leave the search path)
 * searched on the path, where the first file <name>.so that is not a usable
 * plugin is an error, not skipped. Opens it and checks that its role is
 * `role` (a vh_role, or -1 for any role). */
vh_status loader_resolve(vh_plugin *out, const vh_plugin_path *path,
                         const char *name_or_path, int role, vh_diag *d);

#endif
