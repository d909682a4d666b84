/* config.h - one recipe section checked against a schema, values resolved.
 *
 * config_resolve walks a section's values against a vh_config_key schema:
 * an unknown key is an error with "did you mean"; each value is parsed by its
 * type (int, float, bool, string, enum in choices, path) and checked against
 * the range; keys the recipe leaves out take the schema default, and a
 * required key with no default is an error naming the section. The result
 * keeps each value's origin for `vithost check` and for plugins' config_fail.
 *
 * Keys the host owns in a role section ("plugin") are not part of the
 * plugin's schema: the caller passes them as skip_key, comma-separated (at
 * most 4).
 *
 * Keys a role's plugins share (the optimizer's lr, schedule, ...: the SDK's
 * vh_optim_shared_keys) join the plugin's schema in config_resolve_merged;
 * a key the plugin declares itself stays the plugin's.
 *
 * A key the section's plugin does not take is refused; when `plugin` came
 * from --set (another plugin than the file's) the message names every such
 * key left from the file and shows the one-line whole-section --set
 * (recipe.h) that replaces the section.
 */
#ifndef VITHOST_HOST_CONFIG_H
#define VITHOST_HOST_CONFIG_H

#include <stdint.h>

#include "diag.h"
#include "recipe.h"
#include "vithost/vh_config.h"
#include "vithost/vh_mix.h"
#include "vithost/vh_optim_schedule.h"
#include "vithost/vh_plugin.h"

typedef struct vh_config_entry {
    const vh_config_key *key; /* into the schema */
    int has_value;            /* 0: OPTIONAL and not set */
    char *text;               /* resolved text (as written, or the default) */
    vh_config_origin origin;
    union {
        int64_t i;            /* INT */
        double f;             /* FLOAT */
        int b;                /* BOOL */
    } as;
} vh_config_entry;

typedef struct vh_section_config {
    char *section;            /* "model" */
    vh_config_entry *entries; /* one per schema key, schema order */
    int count;
    vh_config_key *merged;    /* config_resolve_merged's schema, owned; else NULL */
} vh_section_config;

vh_status config_resolve(vh_section_config *out, const vh_recipe *recipe,
                         const char *section, const vh_config_key *schema,
                         const char *skip_key, vh_diag *d);
/* config_resolve against `shared` keys followed by the plugin's `schema`,
 * less the shared keys the schema declares itself (those stay the plugin's:
 * a 2.0 plugin's own lr keeps its own default and range). The merged schema
 * is owned by *out; both schemas must outlive it. shared NULL: the same as
 * config_resolve. */
vh_status config_resolve_merged(vh_section_config *out, const vh_recipe *recipe,
                                const char *section, const vh_config_key *schema,
                                const vh_config_key *shared, const char *skip_key,
                                vh_diag *d);
void config_free(vh_section_config *c);

/* The shared keys the SDK adds to a plugin's section, or NULL: an optimizer
 * of ABI 2.1 or later gets vh_optim_shared_keys; a 2.0 optimizer computes
 * its own rate (step), so shared keys it does not declare would be read by
 * no one, and it gets none. */
const vh_config_key *config_shared_keys(const vh_plugin_descriptor *desc);

const vh_config_entry *config_find(const vh_section_config *c, const char *key);

/* "int", "float", "bool", "string", "enum", "path". */
const char *config_type_name(vh_config_type type);
/* Checks a schema itself (plugins ship schemas; the host trusts none):
 * non-empty unique keys, enum has choices, defaults parse as their type. */
vh_status config_check_schema(const vh_config_key *schema, const char *owner,
                              vh_diag *d);

#endif
