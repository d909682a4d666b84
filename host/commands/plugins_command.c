/* plugins_command.c - `vithost plugins [--describe NAME]`: the plugins on
 * the search path by role, or one plugin's config schema; `--describe run`
 * the host's own section. */
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "config.h"
#include "loader.h"
#include "runtime.h"
#include "vtables.h"

static void print_key(const vh_config_key *k, FILE *out) {
    fprintf(out, "  %-18s %-6s ", k->key, config_type_name(k->type));
    if (k->default_value)
        fprintf(out, "default %s", k->default_value);
    else if (k->flags & VH_CONFIG_KEY_FLAG_OPTIONAL)
        fputs("optional", out);
    else
        fputs("required", out);
    if (k->type == VH_CONFIG_TYPE_ENUM && k->choices) fprintf(out, ", one of %s", k->choices);
    if ((k->type == VH_CONFIG_TYPE_INT || k->type == VH_CONFIG_TYPE_FLOAT) && k->min < k->max)
        fprintf(out, ", range [%g, %g]", k->min, k->max);
    fprintf(out, "\n      %s\n", k->doc ? k->doc : "");
}

/* 1 when the plugin's own schema declares `key` (it then keeps it). */
static int declares(const vh_plugin_descriptor *desc, const char *key) {
    for (const vh_config_key *k = desc->schema; k->key; k++)
        if (strcmp(k->key, key) == 0) return 1;
    return 0;
}

static void print_schema(const vh_plugin_descriptor *desc, FILE *out) {
    fprintf(out, "%s (%s plugin, version %s, ABI %u.%u)\n  %s\n\nkeys of section '%s':\n",
            desc->name, vh_role_name(desc->role), desc->version, desc->abi_major,
            desc->abi_minor, desc->description, vh_role_name(desc->role));
    int any = 0;
    for (const vh_config_key *k = desc->schema; k->key; k++, any = 1) print_key(k, out);
    if (!any) fputs("  (none besides `plugin`)\n", out);
    const vh_config_key *shared = config_shared_keys(desc);
    if (!shared) return;
    fprintf(out, "\nshared keys of section '%s' (the SDK's, kept when the plugin changes):\n",
            vh_role_name(desc->role));
    for (const vh_config_key *k = shared; k->key; k++)
        if (!declares(desc, k->key)) print_key(k, out);
}

/* The `run` section belongs to the host, not to a plugin: its keys are
 * vh_run_schema's (runtime.c), printed like a plugin's. */
static void print_run_schema(FILE *out) {
    fputs("run (the host's own section: device, communicator, seed, how long to train, when "
          "to evaluate, log and save)\n\nkeys of section 'run':\n",
          out);
    for (const vh_config_key *k = vh_run_schema; k->key; k++) print_key(k, out);
}

static int describe(const vh_plugin_path *path, const char *name, FILE *out, FILE *err) {
    if (strcmp(name, "run") == 0) {
        print_run_schema(out);
        return VH_EXIT_OK;
    }
    vh_plugin p;
    vh_diag d = {{0}};
    memset(&p, 0, sizeof p);
    if (loader_resolve(&p, path, name, -1, &d) != VH_STATUS_OK) {
        fprintf(err, "vithost: %s\n", d.text);
        return VH_EXIT_PLUGIN;
    }
    print_schema(p.desc, out);
    fprintf(out, "\nfile: %s\n", p.path);
    loader_close(&p);
    return VH_EXIT_OK;
}

static void print_list(const vh_plugin_path *path, const vh_plugin_info *infos, int count,
                       FILE *out) {
    fprintf(out, "search path:\n");
    for (int i = 0; i < path->count; i++) fprintf(out, "  %s\n", path->dirs[i]);
    fprintf(out, "\n%-10s %-16s %-8s %s\n", "ROLE", "NAME", "VERSION", "FILE");
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
        for (int i = 0; i < count; i++) {
            if (infos[i].role != (vh_role)r) continue;
            fprintf(out, "%-10s %-16s %-8s %s%s%s%s\n", vh_role_name(infos[i].role),
                    infos[i].name, infos[i].version, infos[i].path,
                    infos[i].shadowed_by ? "  (shadowed by " : "",
                    infos[i].shadowed_by ? infos[i].shadowed_by : "",
                    infos[i].shadowed_by ? ")" : "");
            fprintf(out, "%-10s %-16s %s\n", "", "", infos[i].description);
        }
    }
    if (count == 0) fprintf(out, "(no plugins found)\n");
    fprintf(out, "\n`vithost plugins --describe NAME` prints a plugin's config keys; "
                 "`--describe run` the run section's.\n");
}

static int list(const vh_plugin_path *path, FILE *out, FILE *err) {
    vh_plugin_info *infos = NULL;
    int count = 0;
    char *problems = NULL;
    vh_diag d = {{0}};
    int code = VH_EXIT_OK;
    if (plugin_scan(path, &infos, &count, &problems, &d) != VH_STATUS_OK) {
        fprintf(err, "vithost: %s\n", d.text);
        code = VH_EXIT_PLUGIN;
    } else {
        print_list(path, infos, count, out);
        if (problems && problems[0])
            fprintf(err, "vithost: files on the search path that are not usable plugins:\n%s",
                    problems);
    }
    free(problems);
    plugin_infos_free(infos, count);
    return code;
}

int plugins_main(const cli_args *a, FILE *out, FILE *err) {
    vh_plugin_path path;
    vh_diag d = {{0}};
    if (plugin_path_init(&path, NULL, &d) != VH_STATUS_OK) {
        fprintf(err, "vithost: %s\n", d.text);
        return VH_EXIT_PLUGIN;
    }
    int code = a->describe ? describe(&path, a->describe, out, err) : list(&path, out, err);
    plugin_path_free(&path);
    return code;
}
