/* freeze.c - the parameters `freeze` names (see freeze.h). */
#define _POSIX_C_SOURCE 200809L
#include "freeze.h"

#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

#define PATTERN_LEN 256

static int is_glob(const char *p) { return strpbrk(p, "*?[") != NULL; }

/* The pattern names the parameter: its unit, itself or a dotted prefix of it. */
static int matches(const char *pat, const char *unit, const char *name) {
    if (is_glob(pat))
        return (unit && fnmatch(pat, unit, 0) == 0) || (name && fnmatch(pat, name, 0) == 0);
    const size_t n = strlen(pat);
    return (unit && strcmp(unit, pat) == 0) ||
           (name && strncmp(name, pat, n) == 0 && (name[n] == '\0' || name[n] == '.'));
}

/* Marks what one pattern matches; how many parameters it matched. */
static int64_t mark(const vh_param_table *table, const char *pat, unsigned char *frozen) {
    int64_t i = 0, hits = 0;
    for (int32_t u = 0; u < table->num_units; u++) {
        const vh_unit_desc *ud = &table->units[u];
        for (int32_t p = 0; p < ud->num_params; p++, i++)
            if (matches(pat, ud->name, ud->params[p].name)) frozen[i] = 1, hits++;
    }
    return hits;
}

/* "'pat' matches no parameter; the units are a, b, ...". */
static void no_match(const vh_param_table *table, const char *pat, char *why, size_t len) {
    int w = snprintf(why, len, "'%s' matches no parameter; the model's units are", pat);
    for (int32_t u = 0; u < table->num_units && w > 0 && (size_t)w < len; u++)
        w += snprintf(why + w, len - (size_t)w, "%s %s", u ? "," : "",
                      table->units[u].name ? table->units[u].name : "(unnamed)");
    if (w > 0 && (size_t)w < len)
        snprintf(why + w, len - (size_t)w,
                 " (a pattern is a unit, a parameter name or a dotted prefix of one, "
                 "e.g. patch_embed or blocks.0.attn, or a glob such as blocks.[0-3])");
}

int64_t mta_freeze_mask(const vh_param_table *table, const char *list, unsigned char *frozen,
                        char *why, size_t why_len) {
    int64_t n = 0;
    for (int32_t u = 0; table && u < table->num_units; u++) n += table->units[u].num_params;
    memset(frozen, 0, (size_t)n);
    for (const char *s = list; s && *s;) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        while (len && (*s == ' ' || *s == '\t')) s++, len--;
        while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
        char pat[PATTERN_LEN];
        if (len == 0 || len >= sizeof pat)
            return snprintf(why, why_len, "%s pattern in '%s'", len ? "an over-long" : "an empty",
                            list),
                   -1;
        memcpy(pat, s, len);
        pat[len] = '\0';
        if (mark(table, pat, frozen) == 0) return no_match(table, pat, why, why_len), -1;
        if (!end) break;
        s = end + 1;
    }
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += frozen[i];
    return count;
}
