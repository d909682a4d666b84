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
 */
#ifndef VITHOST_HOST_CONFIG_H
#define VITHOST_HOST_CONFIG_H

#include <stdint.h>

#include "diag.h"
#include "recipe.h"
#include "vithost/vh_config.h"

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
} vh_section_config;

vh_status config_resolve(vh_section_config *out, const vh_recipe *recipe,
                         const char *section, const vh_config_key *schema,
                         const char *skip_key, vh_diag *d);
void config_free(vh_section_config *c);

const vh_config_entry *config_find(const vh_section_config *c, const char *key);

/* "int", "float", "bool", "string", "enum", "path". */
const char *config_type_name(vh_config_type type);
/* Checks a schema itself (plugins ship schemas; the host trusts none):
 * non-empty unique keys, enum has choices, defaults parse as their type. */
vh_status config_check_schema(const vh_config_key *schema, const char *owner,
                              vh_diag *d);

#endif
