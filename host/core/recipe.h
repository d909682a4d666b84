/* recipe.h - a YAML recipe read into sections of scalar key/value pairs.
 *
 * The recipe is a mapping of sections (run, model, precision, sharding,
 * optim, data); each section is a mapping of keys to scalars. Every key and
 * value keeps its file:line:col so later checks can point at it. This module
 * checks the shape of the document only; which keys exist and what types
 * they have is the schema's business (config.h).
 *
 * Refused with one clear message: an empty file, a non-mapping document, more
 * than one document, anchors and aliases (no alias expansion can blow up
 * memory), duplicate keys, nested values where a scalar is expected, unknown
 * sections (with a suggestion), files that are not text (NUL bytes, invalid
 * UTF-8) and files over VH_RECIPE_MAX_BYTES.
 */
#ifndef VITHOST_HOST_RECIPE_H
#define VITHOST_HOST_RECIPE_H

#include <stddef.h>

#include "diag.h"
#include "vtables.h"
#include "vithost/vh_config.h"
#include "vithost/vh_plugin.h"

#define VH_RECIPE_MAX_BYTES (1u << 20) /* a recipe is a page of text, not data */

typedef struct vh_recipe_value {
    char *key;
    char *text;              /* the scalar as written (unquoted) */
    vh_config_origin origin; /* RECIPE with line/column of the value, or SET */
    int key_line, key_column;
    /* The file's text a --set replaced (NULL when none did): for `plugin`,
     * the plugin the file's other keys were written for. */
    char *replaced;
} vh_recipe_value;

typedef struct vh_recipe_section {
    char *name;              /* "run", "model", ... */
    int line, column;        /* of the section's key */
    vh_recipe_value *values; /* in file order, --set values appended */
    int count;
} vh_recipe_section;

typedef struct vh_recipe {
    char *file;              /* path as given, or the name given for a string */
    char *source;            /* the whole text, NUL-terminated, for echoing lines */
    size_t source_len;
    vh_recipe_section *sections;
    int count;
} vh_recipe;

/* Known section names: "run" and one per role, in role order, then NULL. */
extern const char *const vh_recipe_section_names[VH_HOST_ROLE_COUNT + 2];
/* The section name of a role ("model" for VH_ROLE_MODEL). */
const char *recipe_role_section(vh_role role); /* NULL when out of range */

vh_status recipe_load_file(vh_recipe *out, const char *path, vh_diag *d);
/* `name` stands for the file name in messages. */
vh_status recipe_load_string(vh_recipe *out, const char *name, const char *text,
                             size_t len, vh_diag *d);
void recipe_free(vh_recipe *r);

/* Applies one --set; the section must be a known one (created if the file
 * lacked it):
 *   section.key=value             replaces one value or appends it;
 *   section={key: value, ...}     replaces the whole section: a YAML flow
 *                                 mapping of scalars, as a section in the
 *                                 file (`--set 'optim={plugin: lion, lr: 6e-3}'`).
 * Values keep origin SET. */
vh_status recipe_apply_set(vh_recipe *r, const char *assignment, vh_diag *d);

const vh_recipe_section *recipe_find_section(const vh_recipe *r, const char *name);
const vh_recipe_value *recipe_find_value(const vh_recipe_section *s, const char *key);

/* Sets diag to "file:line:col: message" + echoed line + caret for a value
 * from the file, or "--set section.key=text: message" for one from --set.
 * With v NULL it points at section s's key when s is in the file, else it
 * says "file: message" (s may be NULL too). */
vh_status recipe_diag_value(const vh_recipe *r, const vh_recipe_section *s,
                            const vh_recipe_value *v, int at_key, vh_diag *d,
                            vh_status status, const char *fmt, ...)
    VH_PRINTF_LIKE(7, 8);

/* Edit distance, for "did you mean" suggestions. */
int vh_edit_distance(const char *a, const char *b);
/* The candidate closest to word, or NULL if none is close enough
 * (distance <= max(1, strlen(word) / 3)). candidates ends with NULL. */
const char *vh_suggest(const char *word, const char *const *candidates);

#endif
