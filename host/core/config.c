/* config.c - one recipe section checked against a schema, values resolved.
 *
 * Recipe values and schema defaults go through the same parser, so a default
 * is exactly as valid as a value a user could have written. Errors point at
 * the offending key or value through recipe_diag_value.
 */
#define _POSIX_C_SOURCE 200809L

#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *config_type_name(vh_config_type type) {
    switch (type) {
    case VH_CONFIG_TYPE_INT: return "int";
    case VH_CONFIG_TYPE_FLOAT: return "float";
    case VH_CONFIG_TYPE_BOOL: return "bool";
    case VH_CONFIG_TYPE_STRING: return "string";
    case VH_CONFIG_TYPE_ENUM: return "enum";
    case VH_CONFIG_TYPE_PATH: return "path";
    }
    return "?";
}

/* ---- parsing one value ---------------------------------------------------- */

typedef union config_number {
    int64_t i;
    double f;
    int b;
} config_number;

static int range_checked(const vh_config_key *k) { return k->min < k->max; }

/* A bound as a user would write it: "64", not "64.000000000000000". */
static void format_bound(char *buf, size_t len, double v) {
    if (v > -1e15 && v < 1e15 && v == (double)(long long)v)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%g", v);
}

static void out_of_range(const vh_config_key *k, const char *shown, char *why,
                         size_t why_len) {
    char lo[64], hi[64];
    format_bound(lo, sizeof lo, k->min);
    format_bound(hi, sizeof hi, k->max);
    snprintf(why, why_len, "%s is out of range [%s, %s]", shown, lo, hi);
}

/* strtoll and strtod skip leading blanks; a value is the whole scalar. */
static int starts_blank(const char *text) {
    return text[0] == '\0' || isspace((unsigned char)text[0]);
}

static int parse_int(const vh_config_key *k, const char *text, config_number *out,
                     char *why, size_t why_len) {
    char *end = NULL;
    long long v = 0;
    errno = 0;
    if (!starts_blank(text)) v = strtoll(text, &end, 10);
    if (!end || *end != '\0') {
        snprintf(why, why_len, "expected an integer, got '%s'", text);
        return 0;
    }
    if (errno == ERANGE) {
        snprintf(why, why_len, "%s does not fit in a 64-bit integer", text);
        return 0;
    }
    if (range_checked(k) && ((double)v < k->min || (double)v > k->max)) {
        char shown[32];
        snprintf(shown, sizeof shown, "%lld", v);
        out_of_range(k, shown, why, why_len);
        return 0;
    }
    out->i = (int64_t)v;
    return 1;
}

static int parse_float(const vh_config_key *k, const char *text, config_number *out,
                       char *why, size_t why_len) {
    char *end = NULL;
    double v = 0;
    if (!starts_blank(text)) v = strtod(text, &end);
    if (!end || *end != '\0') {
        snprintf(why, why_len, "expected a number, got '%s'", text);
        return 0;
    }
    if (!isfinite(v)) {
        snprintf(why, why_len, "expected a finite number, got '%s'", text);
        return 0;
    }
    if (range_checked(k) && (v < k->min || v > k->max)) {
        out_of_range(k, text, why, why_len);
        return 0;
    }
    out->f = v;
    return 1;
}

static int parse_bool(const char *text, config_number *out, char *why,
                      size_t why_len) {
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(text, yes[i]) == 0) return out->b = 1, 1;
        if (strcasecmp(text, no[i]) == 0) return out->b = 0, 1;
    }
    snprintf(why, why_len, "expected true or false, got '%s'", text);
    return 0;
}

/* Splits "a|b|c" into a NULL-ended array pointing into *storage. */
static const char **split_choices(const char *choices, char **storage) {
    size_t n = 2;
    for (const char *c = choices; *c; c++) n += *c == '|';
    char *copy = strdup(choices);
    const char **list = malloc(n * sizeof *list);
    if (!copy || !list) {
        free(copy);
        free(list);
        return NULL;
    }
    size_t i = 0;
    for (char *p = copy;;) {
        list[i++] = p;
        char *bar = strchr(p, '|');
        if (!bar) break;
        *bar = '\0';
        p = bar + 1;
    }
    list[i] = NULL;
    *storage = copy;
    return list;
}

static int parse_enum(const vh_config_key *k, const char *text, char *why,
                      size_t why_len) {
    char *storage = NULL;
    const char **list = k->choices ? split_choices(k->choices, &storage) : NULL;
    if (!list) {
        snprintf(why, why_len, "'%s' cannot be checked: the schema has no choices",
                 text);
        return 0;
    }
    int found = 0;
    for (const char **c = list; *c && !found; c++) found = strcmp(*c, text) == 0;
    if (!found) {
        const char *guess = vh_suggest(text, list);
        if (guess)
            snprintf(why, why_len, "'%s' is not one of %s; did you mean '%s'?", text,
                     k->choices, guess);
        else
            snprintf(why, why_len, "'%s' is not one of %s", text, k->choices);
    }
    free(list);
    free(storage);
    return found;
}

/* Parses text as k's type; on failure writes why ("expected ..., got ..."). */
static int parse_typed(const vh_config_key *k, const char *text, config_number *out,
                       char *why, size_t why_len) {
    switch (k->type) {
    case VH_CONFIG_TYPE_INT: return parse_int(k, text, out, why, why_len);
    case VH_CONFIG_TYPE_FLOAT: return parse_float(k, text, out, why, why_len);
    case VH_CONFIG_TYPE_BOOL: return parse_bool(text, out, why, why_len);
    case VH_CONFIG_TYPE_STRING: return 1;
    case VH_CONFIG_TYPE_ENUM: return parse_enum(k, text, why, why_len);
    case VH_CONFIG_TYPE_PATH:
        if (text[0] != '\0') return 1;
        snprintf(why, why_len, "expected a path, got an empty string");
        return 0;
    }
    snprintf(why, why_len, "the schema gives an unknown type %d", (int)k->type);
    return 0;
}

/* ---- resolving a section -------------------------------------------------- */

static int schema_count(const vh_config_key *schema) {
    int n = 0;
    while (schema && schema[n].key) n++;
    return n;
}

static int schema_index(const vh_config_key *schema, const char *key) {
    for (int i = 0; schema && schema[i].key; i++)
        if (strcmp(schema[i].key, key) == 0) return i;
    return -1;
}

/* skip_key is a comma-separated list of keys the host owns (today only
 * "plugin"): fills keys[] with up to max of them, NUL-terminated
 * copies in store. */
static int split_skip(const char *skip_key, char store[][32], int max) {
    int n = 0;
    for (const char *p = skip_key; p && *p && n < max;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len >= 32) len = 31;
        memcpy(store[n], p, len);
        store[n++][len] = '\0';
        p = comma ? comma + 1 : p + len;
    }
    return n;
}

static int is_skipped(const char *key, const char *skip_key) {
    char store[4][32];
    int n = split_skip(skip_key, store, 4);
    for (int i = 0; i < n; i++)
        if (strcmp(store[i], key) == 0) return 1;
    return 0;
}

/* "a, b, c" (skip keys first), cut short with ", ..." if it would not fit. */
static void list_keys(const vh_config_key *schema, const char *skip_key, char *buf,
                      size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    int n = schema_count(schema);
    char store[4][32];
    int skips = split_skip(skip_key, store, 4);
    for (int i = -skips; i < n; i++) {
        const char *key = i < 0 ? store[skips + i] : schema[i].key;
        const char *sep = used ? ", " : "";
        if (used + strlen(sep) + strlen(key) + 6 >= len) {
            snprintf(buf + used, len - used, "%s...", sep);
            return;
        }
        used += (size_t)snprintf(buf + used, len - used, "%s%s", sep, key);
    }
}

static vh_status unknown_key(const vh_recipe *recipe, const vh_recipe_section *s,
                             const vh_recipe_value *v, const vh_config_key *schema,
                             const char *skip_key, vh_diag *d) {
    int n = schema_count(schema);
    const char **candidates = malloc((size_t)(n + 5) * sizeof *candidates);
    if (!candidates) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    int c = 0;
    char store[4][32];
    int skips = split_skip(skip_key, store, 4);
    for (int i = 0; i < skips; i++) candidates[c++] = store[i]; /* "plugn" finds "plugin" */
    for (int i = 0; i < n; i++) candidates[c++] = schema[i].key;
    candidates[c] = NULL;
    const char *guess = vh_suggest(v->key, candidates);
    free(candidates);
    if (guess)
        return recipe_diag_value(recipe, s, v, 1, d, VH_STATUS_ERR_CONFIG,
                                 "unknown key '%s' in section '%s'; did you mean '%s'?",
                                 v->key, s->name, guess);
    if (c == 0)
        return recipe_diag_value(recipe, s, v, 1, d, VH_STATUS_ERR_CONFIG,
                                 "unknown key '%s' in section '%s'; the section "
                                 "takes no keys",
                                 v->key, s->name);
    char keys[1024];
    list_keys(schema, skip_key, keys, sizeof keys);
    return recipe_diag_value(recipe, s, v, 1, d, VH_STATUS_ERR_CONFIG,
                             "unknown key '%s' in section '%s'; valid keys: %s", v->key,
                             s->name, keys);
}

static void store_number(vh_config_entry *e, const config_number *num) {
    switch (e->key->type) {
    case VH_CONFIG_TYPE_INT: e->as.i = num->i; break;
    case VH_CONFIG_TYPE_FLOAT: e->as.f = num->f; break;
    case VH_CONFIG_TYPE_BOOL: e->as.b = num->b; break;
    default: break;
    }
}

/* Fills e from a recipe (or --set) value. */
static vh_status resolve_value(vh_config_entry *e, const vh_recipe *recipe,
                               const vh_recipe_section *s, const vh_recipe_value *v,
                               vh_diag *d) {
    char why[1024];
    config_number num = {0};
    if (!parse_typed(e->key, v->text, &num, why, sizeof why))
        return recipe_diag_value(recipe, s, v, 0, d, VH_STATUS_ERR_CONFIG, "%s.%s: %s",
                                 s->name, v->key, why);
    if (!(e->text = strdup(v->text)))
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    store_number(e, &num);
    e->has_value = 1;
    e->origin = v->origin;
    return VH_STATUS_OK;
}

/* Fills e, which the recipe left out, from the schema default. */
static vh_status resolve_default(vh_config_entry *e, const vh_recipe *recipe,
                                 const vh_recipe_section *s, const char *section,
                                 vh_diag *d) {
    const vh_config_key *k = e->key;
    e->origin = (vh_config_origin){VH_CONFIG_SOURCE_DEFAULT, NULL, 0, 0};
    if (k->default_value) {
        char why[1024];
        config_number num = {0};
        if (!parse_typed(k, k->default_value, &num, why, sizeof why))
            return diag_set(d, VH_STATUS_ERR_INTERNAL,
                            "schema of section '%s': default of key '%s' is invalid: "
                            "%s (a bug in the plugin)",
                            section, k->key, why);
        if (!(e->text = strdup(k->default_value)))
            return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
        store_number(e, &num);
        e->has_value = 1;
        return VH_STATUS_OK;
    }
    if (k->flags & VH_CONFIG_KEY_FLAG_OPTIONAL) return VH_STATUS_OK;
    /* At the section when it is in the file, else at the file. */
    if (!recipe)
        return diag_set(d, VH_STATUS_ERR_CONFIG, "section '%s' needs key '%s' (%s)",
                        section, k->key, k->doc ? k->doc : config_type_name(k->type));
    return recipe_diag_value(recipe, s, NULL, 0, d, VH_STATUS_ERR_CONFIG,
                             "section '%s' needs key '%s' (%s)", section, k->key,
                             k->doc ? k->doc : config_type_name(k->type));
}

/* The file's plugin when --set named another for this section (the file's
 * keys were written for it); NULL otherwise. */
static const char *swapped_from(const vh_recipe_section *s) {
    const vh_recipe_value *p = recipe_find_value(s, "plugin");
    if (!p || p->origin.source != VH_CONFIG_SOURCE_SET || !p->replaced) return NULL;
    return strcmp(p->replaced, p->text) != 0 ? p->replaced : NULL;
}

/* Appends to buf (a shell word in single quotes) one flow-mapping value:
 * plain when YAML reads it back as written, else double-quoted. */
static void append_flow_value(char *buf, size_t len, const char *text) {
    size_t used = strlen(buf);
    int plain = text[0] && !strpbrk(text, ",:{}[]#&*!|>'\"%@` \t\\") && text[0] != '-' &&
                text[0] != '?';
    if (!plain && used + 1 < len) buf[used++] = '"';
    for (const char *c = text; *c && used + 6 < len; c++) {
        if (*c == '\'') { /* out of the shell's quotes and back */
            memcpy(buf + used, "'\\''", 4);
            used += 4;
            continue;
        }
        if (*c == '"' || *c == '\\') buf[used++] = '\\';
        buf[used++] = *c;
    }
    if (!plain && used + 1 < len) buf[used++] = '"';
    buf[used] = '\0';
}

/* --set 'section={plugin: NAME, key: value, ...}' with the section's values
 * the plugin's schema takes, in their order. */
static void replace_line(const vh_recipe_section *s, const vh_config_key *schema, char *buf,
                         size_t len) {
    const vh_recipe_value *p = recipe_find_value(s, "plugin");
    snprintf(buf, len, "--set '%s={plugin: ", s->name);
    append_flow_value(buf, len, p ? p->text : "NAME");
    for (int i = 0; i < s->count; i++) {
        const vh_recipe_value *v = &s->values[i];
        if (v == p || schema_index(schema, v->key) < 0) continue;
        size_t used = strlen(buf);
        if (used + strlen(v->key) + 8 >= len) break;
        snprintf(buf + used, len - used, ", %s: ", v->key);
        append_flow_value(buf, len, v->text);
    }
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "}'");
}

/* A plugin swapped by --set meets keys the file wrote for the old one: name
 * every such key, point at the first, show the one-line whole replace. */
static vh_status left_keys(const vh_recipe *recipe, const vh_recipe_section *s,
                           const vh_config_key *schema, const char *skip_key, vh_diag *d) {
    const vh_recipe_value *first = NULL;
    char others[512] = "";
    for (int i = 0; i < s->count; i++) {
        const vh_recipe_value *v = &s->values[i];
        if (is_skipped(v->key, skip_key) || schema_index(schema, v->key) >= 0 ||
            v->origin.source == VH_CONFIG_SOURCE_SET)
            continue;
        if (!first) {
            first = v;
            continue;
        }
        size_t used = strlen(others);
        snprintf(others + used, sizeof others - used, "%s'%s'", used ? ", " : " (nor ", v->key);
    }
    if (others[0]) strncat(others, ")", sizeof others - strlen(others) - 1);
    const vh_recipe_value *p = recipe_find_value(s, "plugin");
    vh_status st = recipe_diag_value(recipe, s, first, 1, d, VH_STATUS_ERR_CONFIG,
                                     "key '%s' of section '%s' was written for plugin '%s'; "
                                     "plugin '%s' (--set %s.plugin=%s) does not take it%s",
                                     first->key, s->name, p->replaced, p->text, s->name, p->text,
                                     others);
    if (!d) return st;
    char line[1024];
    replace_line(s, schema, line, sizeof line);
    size_t used = strlen(d->text);
    snprintf(d->text + used, sizeof d->text - used,
             "\nreplace the section whole instead, in one line (the keys %s takes kept):\n"
             "    %s",
             p->text, line);
    return st;
}

static vh_status resolve_all(vh_section_config *c, const vh_recipe *recipe,
                             const vh_recipe_section *s, const vh_config_key *schema,
                             const char *skip_key, vh_diag *d) {
    for (int i = 0; s && i < s->count; i++) {
        const vh_recipe_value *v = &s->values[i];
        if (is_skipped(v->key, skip_key)) continue;
        int k = schema_index(schema, v->key);
        if (k < 0 && v->origin.source != VH_CONFIG_SOURCE_SET && swapped_from(s))
            return left_keys(recipe, s, schema, skip_key, d);
        if (k < 0) return unknown_key(recipe, s, v, schema, skip_key, d);
        vh_status st = resolve_value(&c->entries[k], recipe, s, v, d);
        if (st != VH_STATUS_OK) return st;
    }
    for (int k = 0; k < c->count; k++) {
        if (c->entries[k].has_value) continue;
        vh_status st = resolve_default(&c->entries[k], recipe, s, c->section, d);
        if (st != VH_STATUS_OK) return st;
    }
    return VH_STATUS_OK;
}

vh_status config_resolve(vh_section_config *out, const vh_recipe *recipe,
                         const char *section, const vh_config_key *schema,
                         const char *skip_key, vh_diag *d) {
    if (!out || !section)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "config_resolve: no section");
    memset(out, 0, sizeof *out);
    int n = schema_count(schema);
    vh_section_config c = {0};
    c.section = strdup(section);
    c.entries = calloc((size_t)n + 1, sizeof *c.entries); /* +1: never calloc(0) */
    if (!c.section || !c.entries) {
        config_free(&c);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    }
    c.count = n;
    for (int i = 0; i < n; i++) c.entries[i].key = &schema[i];

    vh_status st = resolve_all(&c, recipe, recipe_find_section(recipe, section),
                               schema, skip_key, d);
    if (st != VH_STATUS_OK) {
        config_free(&c);
        return st;
    }
    *out = c;
    return VH_STATUS_OK;
}

/* shared keys the schema lacks, then the schema; NULL-ended, malloc'd. */
static vh_config_key *merge_schemas(const vh_config_key *schema, const vh_config_key *shared) {
    int n = schema_count(schema), m = schema_count(shared), at = 0;
    vh_config_key *out = calloc((size_t)(n + m + 1), sizeof *out);
    if (!out) return NULL;
    for (int i = 0; i < m; i++)
        if (schema_index(schema, shared[i].key) < 0) out[at++] = shared[i];
    for (int i = 0; i < n; i++) out[at++] = schema[i];
    return out; /* calloc: out[at] is the NULL key */
}

vh_status config_resolve_merged(vh_section_config *out, const vh_recipe *recipe,
                                const char *section, const vh_config_key *schema,
                                const vh_config_key *shared, const char *skip_key,
                                vh_diag *d) {
    if (!shared) return config_resolve(out, recipe, section, schema, skip_key, d);
    if (out) memset(out, 0, sizeof *out);
    vh_config_key *merged = merge_schemas(schema, shared);
    if (!merged) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    vh_status st = config_resolve(out, recipe, section, merged, skip_key, d);
    if (st != VH_STATUS_OK || !out) {
        free(merged);
        return st;
    }
    out->merged = merged;
    return VH_STATUS_OK;
}

void config_free(vh_section_config *c) {
    if (!c) return;
    for (int i = 0; c->entries && i < c->count; i++) free(c->entries[i].text);
    free(c->entries);
    free(c->section);
    free(c->merged);
    memset(c, 0, sizeof *c);
}

const vh_config_key *config_shared_keys(const vh_plugin_descriptor *desc) {
    if (desc && desc->role == VH_ROLE_OPTIM && desc->abi_minor >= 1) return vh_optim_shared_keys;
    /* Mixup/CutMix (vh_mix.h), applied by vh_data_pass; a data plugin older
     * than 2.2 could not hand out the targets. */
    if (desc && desc->role == VH_ROLE_DATA && desc->abi_minor >= 2) return vh_data_shared_keys;
    return NULL;
}

const vh_config_entry *config_find(const vh_section_config *c, const char *key) {
    if (!c || !key) return NULL;
    for (int i = 0; i < c->count; i++)
        if (strcmp(c->entries[i].key->key, key) == 0) return &c->entries[i];
    return NULL;
}

/* ---- checking a schema ---------------------------------------------------- */

static vh_status schema_error(vh_diag *d, const char *owner, const char *fmt, ...)
    VH_PRINTF_LIKE(3, 4);

static vh_status schema_error(vh_diag *d, const char *owner, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return diag_set(d, VH_STATUS_ERR_INTERNAL, "schema of %s: %s", owner, msg);
}

static int is_key_name(const char *key) {
    if (!key[0]) return 0;
    for (const char *c = key; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_'))
            return 0;
    return 1;
}

static vh_status check_choices(const vh_config_key *k, const char *owner,
                               vh_diag *d) {
    if (!k->choices || !k->choices[0])
        return schema_error(d, owner, "enum key '%s' has no choices", k->key);
    const char *c = k->choices;
    if (c[0] == '|' || c[strlen(c) - 1] == '|' || strstr(c, "||"))
        return schema_error(d, owner, "enum key '%s' has an empty choice in '%s'",
                            k->key, c);
    return VH_STATUS_OK;
}

static vh_status check_key(const vh_config_key *schema, int i, const char *owner,
                           vh_diag *d) {
    const vh_config_key *k = &schema[i];
    if (!is_key_name(k->key))
        return schema_error(d, owner,
                            "key %d '%s' is not lower_snake_case ([a-z0-9_]+)", i,
                            k->key);
    if (strcmp(k->key, "plugin") == 0)
        return schema_error(d, owner, "key 'plugin' is reserved: it names the "
                                      "plugin in the recipe");
    int first = schema_index(schema, k->key);
    if (first != i)
        return schema_error(d, owner, "key '%s' appears twice (entries %d and %d)",
                            k->key, first, i);
    if (strcmp(config_type_name(k->type), "?") == 0)
        return schema_error(d, owner, "key '%s' has unknown type %d", k->key,
                            (int)k->type);
    if (k->type == VH_CONFIG_TYPE_ENUM) {
        vh_status st = check_choices(k, owner, d);
        if (st != VH_STATUS_OK) return st;
    }
    if (k->min > k->max)
        return schema_error(d, owner, "key '%s' has min %g > max %g", k->key, k->min,
                            k->max);
    if (k->default_value) {
        char why[1024];
        config_number num = {0};
        if (!parse_typed(k, k->default_value, &num, why, sizeof why))
            return schema_error(d, owner, "default of key '%s' is invalid: %s", k->key,
                                why);
    }
    return VH_STATUS_OK;
}

vh_status config_check_schema(const vh_config_key *schema, const char *owner,
                              vh_diag *d) {
    if (!owner) owner = "?";
    if (!schema) return schema_error(d, owner, "the schema is NULL");
    for (int i = 0; schema[i].key; i++) {
        vh_status st = check_key(schema, i, owner, d);
        if (st != VH_STATUS_OK) return st;
    }
    return VH_STATUS_OK;
}
