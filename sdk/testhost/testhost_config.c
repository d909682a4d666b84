/* testhost_config.c - the plugin's config values, from its schema's defaults
 * and "key=value" strings, checked as the host checks a recipe. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "testhost_internal.h"

static int range_checked(const vh_config_key *k) { return k->min < k->max; }

/* strtoll and strtod skip leading blanks; a value is the whole scalar. */
static int blank_start(const char *text) {
    return text[0] == '\0' || isspace((unsigned char)text[0]);
}

static int out_of_range(const vh_config_key *k, const char *text, char *why, size_t len) {
    snprintf(why, len, "%s is out of range [%g, %g]", text, k->min, k->max);
    return 0;
}

static int parse_number(const vh_config_key *k, const char *text, th_value *v, char *why,
                        size_t len) {
    char *end = NULL;
    errno = 0;
    if (k->type == VH_CONFIG_TYPE_INT) {
        long long i = blank_start(text) ? 0 : strtoll(text, &end, 10);
        if (!end || *end != '\0' || errno == ERANGE) {
            snprintf(why, len, "expected a 64-bit integer, got '%s'", text);
            return 0;
        }
        if (range_checked(k) && ((double)i < k->min || (double)i > k->max))
            return out_of_range(k, text, why, len);
        v->i = (int64_t)i;
        return 1;
    }
    double f = blank_start(text) ? 0.0 : strtod(text, &end);
    if (!end || *end != '\0' || !isfinite(f)) {
        snprintf(why, len, "expected a finite number, got '%s'", text);
        return 0;
    }
    if (range_checked(k) && (f < k->min || f > k->max)) return out_of_range(k, text, why, len);
    v->f = f;
    return 1;
}

static int parse_bool(const char *text, th_value *v, char *why, size_t len) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(text, yes[i]) == 0) return v->b = 1, 1;
        if (strcasecmp(text, no[i]) == 0) return v->b = 0, 1;
    }
    snprintf(why, len, "expected true or false, got '%s'", text);
    return 0;
}

/* Is text one of "a|b|c"? */
static int parse_enum(const vh_config_key *k, const char *text, char *why, size_t len) {
    size_t n = strlen(text);
    for (const char *c = k->choices; c && *c;) {
        size_t m = strcspn(c, "|");
        if (m == n && strncmp(c, text, n) == 0) return 1;
        c += m + (c[m] == '|');
    }
    snprintf(why, len, "'%s' is not one of %s", text, k->choices ? k->choices : "(no choices)");
    return 0;
}

/* Parses text as k's type into v (text kept); on failure writes why. */
static int parse_value(const vh_config_key *k, const char *text, th_value *v, char *why,
                       size_t len) {
    th_value next = *v;
    int ok = 0;
    switch (k->type) {
    case VH_CONFIG_TYPE_INT:
    case VH_CONFIG_TYPE_FLOAT: ok = parse_number(k, text, &next, why, len); break;
    case VH_CONFIG_TYPE_BOOL: ok = parse_bool(text, &next, why, len); break;
    case VH_CONFIG_TYPE_ENUM: ok = parse_enum(k, text, why, len); break;
    case VH_CONFIG_TYPE_STRING: ok = 1; break;
    case VH_CONFIG_TYPE_PATH:
        ok = text[0] != '\0';
        if (!ok) snprintf(why, len, "expected a path, got an empty string");
        break;
    default: snprintf(why, len, "the schema gives an unknown type %d", (int)k->type);
    }
    if (!ok) return 0;
    char *copy = strdup(text);
    if (!copy) {
        snprintf(why, len, "out of memory");
        return 0;
    }
    free(v->text);
    *v = next;
    v->text = copy;
    v->has_value = 1;
    return 1;
}

/* The shared optimizer keys (vh_optim_schedule.h) join a 2.1 optimizer's
 * schema, as the host adds them; keys the plugin declares stay its own. */
static const vh_config_key *shared_keys(const vh_plugin_descriptor *d) {
    if (d->role == VH_ROLE_DATA && d->abi_minor >= 2) return vh_data_shared_keys; /* vh_mix.h */
    return d->role == VH_ROLE_OPTIM && d->abi_minor >= 1 ? vh_optim_shared_keys : NULL;
}

static int declared(const vh_config_key *schema, const char *key) {
    for (const vh_config_key *k = schema; k->key; k++)
        if (strcmp(k->key, key) == 0) return 1;
    return 0;
}

static vh_status add_key(vh_testhost *th, const vh_config_key *k) {
    th_value *v = &th->values[th->num_values++];
    v->key = k;
    v->source = VH_CONFIG_SOURCE_DEFAULT;
    char why[512];
    if (k->default_value && !parse_value(k, k->default_value, v, why, sizeof why))
        return th_fail(th, VH_STATUS_ERR_CONFIG, "schema: the default of '%s' ('%s'): %s",
                       k->key, k->default_value, why);
    return VH_STATUS_OK;
}

vh_status th_config_init(vh_testhost *th) {
    const vh_config_key *schema = th->desc->schema, *shared = shared_keys(th->desc);
    size_t n = 0;
    for (const vh_config_key *k = schema; k->key; k++) n++;
    for (const vh_config_key *k = shared; k && k->key; k++) n++;
    th->values = calloc(n + 1, sizeof *th->values);
    if (!th->values) return th_fail(th, VH_STATUS_ERR_NOMEM, "out of memory");
    vh_status st = VH_STATUS_OK;
    for (const vh_config_key *k = schema; st == VH_STATUS_OK && k->key; k++)
        st = add_key(th, k);
    for (const vh_config_key *k = shared; st == VH_STATUS_OK && k && k->key; k++)
        if (!declared(schema, k->key)) st = add_key(th, k);
    return st;
}

void th_config_free(vh_testhost *th) {
    for (int i = 0; i < th->num_values; i++) free(th->values[i].text);
    free(th->values);
    th->values = NULL;
    th->num_values = 0;
}

th_value *th_config_find(const vh_testhost *th, const char *key) {
    for (int i = 0; i < th->num_values; i++)
        if (strcmp(th->values[i].key->key, key) == 0) return &th->values[i];
    return NULL;
}

vh_status th_config_check_required(vh_testhost *th) {
    for (int i = 0; i < th->num_values; i++) {
        const th_value *v = &th->values[i];
        if (!v->has_value && !(v->key->flags & VH_CONFIG_KEY_FLAG_OPTIONAL))
            return th_fail(th, VH_STATUS_ERR_CONFIG,
                           "%s.%s is required (the schema has no default): "
                           "vh_testhost_set(th, \"%s=...\")",
                           vh_role_name((vh_role)th->desc->role), v->key->key, v->key->key);
    }
    return VH_STATUS_OK;
}

/* "a, b, c": the schema's keys, for an unknown key's message. */
static void key_list(const vh_testhost *th, char *out, size_t len) {
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; i < th->num_values && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%s", i ? ", " : "", th->values[i].key->key);
}

vh_status vh_testhost_set(vh_testhost *th, const char *key_value) {
    const char *eq = strchr(key_value, '=');
    if (!eq || eq == key_value)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "'%s' is not key=value", key_value);
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(eq - key_value), key_value);
    const char *role = vh_role_name((vh_role)th->desc->role);
    th_value *v = th_config_find(th, key);
    if (!v) {
        char keys[512];
        key_list(th, keys, sizeof keys);
        return th_fail(th, VH_STATUS_ERR_CONFIG, "%s.%s: unknown key; %s has: %s", role, key,
                       th->desc->name, keys[0] ? keys : "no keys");
    }
    char why[512];
    if (!parse_value(v->key, eq + 1, v, why, sizeof why))
        return th_fail(th, VH_STATUS_ERR_CONFIG, "%s.%s: %s", role, key, why);
    v->source = VH_CONFIG_SOURCE_SET;
    return VH_STATUS_OK;
}
