/* recipe.c - a YAML recipe read into sections of scalar key/value pairs.
 *
 * The recipe is read with libyaml's event API rather than its document API:
 * events arrive before anything is composed, so an anchor or alias is refused
 * the moment it appears and no alias expansion ever allocates memory. The
 * shape is fixed (mapping of sections, each a mapping of scalars), so a small
 * recursive walk over events is all the parser needs.
 */
#define _POSIX_C_SOURCE 200809L

#include "recipe.h"
#include "vtables.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

const char *const vh_recipe_section_names[VH_HOST_ROLE_COUNT + 2] = {
    "run", "model", "precision", "sharding", "optim", "data", NULL};

const char *recipe_role_section(vh_role role) {
    if ((int)role < 0 || role >= VH_HOST_ROLE_COUNT) return NULL;
    return vh_recipe_section_names[1 + (int)role];
}

/* ---- suggestions ---------------------------------------------------------- */

/* Levenshtein distance where swapping two neighbours also costs one (the
 * "optimal string alignment" variant): "modle" is one edit from "model". */
int vh_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    /* Three rows of the table are enough: two back for transpositions. */
    size_t *rows = malloc(3 * (lb + 1) * sizeof *rows);
    if (!rows) return INT_MAX;
    size_t *back2 = rows, *prev = rows + (lb + 1), *cur = rows + 2 * (lb + 1);
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            size_t best = sub < del ? sub : del;
            best = best < ins ? best : ins;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                back2[j - 2] + 1 < best)
                best = back2[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = back2;
        back2 = prev;
        prev = cur;
        cur = t;
    }
    size_t dist = prev[lb];
    free(rows);
    return dist > INT_MAX ? INT_MAX : (int)dist;
}

const char *vh_suggest(const char *word, const char *const *candidates) {
    if (!word || !candidates) return NULL;
    size_t len = strlen(word);
    int limit = len / 3 > 1 ? (int)(len / 3) : 1;
    const char *best = NULL;
    int best_dist = INT_MAX;
    for (const char *const *c = candidates; *c; c++) {
        int dist = vh_edit_distance(word, *c);
        if (dist <= limit && dist < best_dist) { /* strict: ties keep the first */
            best = *c;
            best_dist = dist;
        }
    }
    return best;
}

/* ---- building the recipe -------------------------------------------------- */

static int is_known_section(const char *name) {
    for (const char *const *s = vh_recipe_section_names; *s; s++)
        if (strcmp(*s, name) == 0) return 1;
    return 0;
}

static vh_recipe_section *find_section_mut(vh_recipe *r, const char *name) {
    for (int i = 0; i < r->count; i++)
        if (strcmp(r->sections[i].name, name) == 0) return &r->sections[i];
    return NULL;
}

static vh_recipe_value *find_value_mut(vh_recipe_section *s, const char *key) {
    for (int i = 0; i < s->count; i++)
        if (strcmp(s->values[i].key, key) == 0) return &s->values[i];
    return NULL;
}

static vh_recipe_section *add_section(vh_recipe *r, const char *name, int line,
                                      int column) {
    vh_recipe_section *grown =
        realloc(r->sections, (size_t)(r->count + 1) * sizeof *grown);
    if (!grown) return NULL;
    r->sections = grown;
    char *copy = strdup(name);
    if (!copy) return NULL;
    vh_recipe_section *s = &r->sections[r->count++];
    memset(s, 0, sizeof *s);
    s->name = copy;
    s->line = line;
    s->column = column;
    return s;
}

/* Takes ownership of nothing: key and text are copied. */
static vh_recipe_value *add_value(vh_recipe_section *s, const char *key,
                                  const char *text) {
    vh_recipe_value *grown =
        realloc(s->values, (size_t)(s->count + 1) * sizeof *grown);
    if (!grown) return NULL;
    s->values = grown;
    char *k = strdup(key), *t = strdup(text);
    if (!k || !t) {
        free(k);
        free(t);
        return NULL;
    }
    vh_recipe_value *v = &s->values[s->count++];
    memset(v, 0, sizeof *v);
    v->key = k;
    v->text = t;
    return v;
}

void recipe_free(vh_recipe *r) {
    if (!r) return;
    for (int i = 0; i < r->count; i++) {
        vh_recipe_section *s = &r->sections[i];
        for (int j = 0; j < s->count; j++) {
            free(s->values[j].key);
            free(s->values[j].text);
            free(s->values[j].replaced);
        }
        free(s->values);
        free(s->name);
    }
    free(r->sections);
    free(r->file);
    free(r->source);
    memset(r, 0, sizeof *r);
}

const vh_recipe_section *recipe_find_section(const vh_recipe *r, const char *name) {
    if (!r || !name) return NULL;
    for (int i = 0; i < r->count; i++)
        if (strcmp(r->sections[i].name, name) == 0) return &r->sections[i];
    return NULL;
}

const vh_recipe_value *recipe_find_value(const vh_recipe_section *s, const char *key) {
    if (!s || !key) return NULL;
    for (int i = 0; i < s->count; i++)
        if (strcmp(s->values[i].key, key) == 0) return &s->values[i];
    return NULL;
}

/* ---- text checks ---------------------------------------------------------- */

static const char empty_message[] =
    "%s: empty recipe; expected a mapping with sections run, model, precision, "
    "sharding, optim, data";

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 if invalid. */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t min, cp;
    if ((c & 0xE0) == 0xC0) len = 2, min = 0x80, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, min = 0x800, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, min = 0x10000, cp = c & 0x07;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    /* Overlong forms, UTF-16 surrogates and code points past Unicode. */
    if (cp < min || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
    return len;
}

static int line_of_offset(const char *text, size_t offset) {
    int line = 1;
    for (size_t i = 0; i < offset; i++)
        if (text[i] == '\n') line++;
    return line;
}

/* A recipe is text: refuse NUL bytes and invalid UTF-8 before libyaml sees it. */
static vh_status check_text(const char *file, const char *text, size_t len,
                            vh_diag *d) {
    const char *nul = memchr(text, '\0', len);
    if (nul)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: not a text file (NUL byte at offset %zu)", file,
                        (size_t)(nul - text));
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence(u + i, len - i);
        if (n == 0)
            return diag_set(d, VH_STATUS_ERR_CONFIG,
                            "%s: not a text file (invalid UTF-8 at line %d)", file,
                            line_of_offset(text, i));
        i += n;
    }
    return VH_STATUS_OK;
}

static vh_status too_large(const char *file, unsigned long long bytes, vh_diag *d) {
    return diag_set(d, VH_STATUS_ERR_CONFIG,
                    "%s: %llu bytes is too large for a recipe (limit %u bytes)", file,
                    bytes, (unsigned)VH_RECIPE_MAX_BYTES);
}

/* ---- the event walk ------------------------------------------------------- */

typedef struct recipe_parser {
    yaml_parser_t yaml;
    vh_recipe *r;
    vh_diag *d;
} recipe_parser;

static vh_status error_at(recipe_parser *p, yaml_mark_t mark, const char *fmt, ...)
    VH_PRINTF_LIKE(3, 4);

/* libyaml marks are 0-based, ours 1-based. */
static vh_status error_at(recipe_parser *p, yaml_mark_t mark, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return diag_set_at(p->d, VH_STATUS_ERR_CONFIG, p->r->file, p->r->source,
                       p->r->source_len, (int)mark.line + 1, (int)mark.column + 1,
                       "%s", msg);
}

static vh_status out_of_memory(recipe_parser *p) {
    return diag_set(p->d, VH_STATUS_ERR_NOMEM, "%s: out of memory reading the recipe",
                    p->r->file);
}

/* Byte of the source at 1-based line/col (col counts characters), or 0. */
static char char_at(const vh_recipe *r, int line, int col) {
    size_t pos = 0;
    for (int l = 1; l < line; l++) {
        const char *nl = memchr(r->source + pos, '\n', r->source_len - pos);
        if (!nl) return 0;
        pos = (size_t)(nl - r->source) + 1;
    }
    for (int c = 1; c < col && pos < r->source_len; c++) {
        pos++;
        while (pos < r->source_len && ((unsigned char)r->source[pos] & 0xC0) == 0x80)
            pos++;
    }
    return pos < r->source_len ? r->source[pos] : 0;
}

static vh_status syntax_error(recipe_parser *p) {
    yaml_parser_t *y = &p->yaml;
    if (y->error == YAML_MEMORY_ERROR) return out_of_memory(p);
    const char *problem = y->problem ? y->problem : "unknown problem";
    if (y->error == YAML_READER_ERROR) {
        /* Reader errors carry a byte offset, not a mark. */
        size_t off = y->problem_offset < p->r->source_len ? y->problem_offset
                                                          : p->r->source_len;
        int line = line_of_offset(p->r->source, off);
        size_t start = off;
        while (start > 0 && p->r->source[start - 1] != '\n') start--;
        return diag_set_at(p->d, VH_STATUS_ERR_CONFIG, p->r->file, p->r->source,
                           p->r->source_len, line, (int)(off - start) + 1,
                           "YAML syntax error: %s", problem);
    }
    int line = (int)y->problem_mark.line + 1, col = (int)y->problem_mark.column + 1;
    const char *hint = char_at(p->r, line, col) == '\t'
                           ? " (YAML does not allow tabs for indentation; use spaces)"
                           : "";
    /* "while parsing a flow mapping" is clearer with where that mapping began. */
    char started[64] = "";
    if (y->context && y->context_mark.line + 1 != (size_t)line)
        snprintf(started, sizeof started, " that started at %d:%d",
                 (int)y->context_mark.line + 1, (int)y->context_mark.column + 1);
    return diag_set_at(p->d, VH_STATUS_ERR_CONFIG, p->r->file, p->r->source,
                       p->r->source_len, line, col, "YAML syntax error: %s%s%s%s%s",
                       problem, y->context ? " " : "", y->context ? y->context : "",
                       started, hint);
}

/* The next event; anchors and aliases are refused here, before any use. */
static vh_status next_event(recipe_parser *p, yaml_event_t *ev) {
    if (!yaml_parser_parse(&p->yaml, ev)) return syntax_error(p);
    const yaml_char_t *anchor = NULL;
    switch (ev->type) {
    case YAML_ALIAS_EVENT: anchor = ev->data.alias.anchor; break;
    case YAML_SCALAR_EVENT: anchor = ev->data.scalar.anchor; break;
    case YAML_SEQUENCE_START_EVENT: anchor = ev->data.sequence_start.anchor; break;
    case YAML_MAPPING_START_EVENT: anchor = ev->data.mapping_start.anchor; break;
    default: break;
    }
    const yaml_char_t *tag = NULL;
    switch (ev->type) {
    case YAML_SCALAR_EVENT: tag = ev->data.scalar.tag; break;
    case YAML_SEQUENCE_START_EVENT: tag = ev->data.sequence_start.tag; break;
    case YAML_MAPPING_START_EVENT: tag = ev->data.mapping_start.tag; break;
    default: break;
    }
    /* A tag asks for a type (`!!python/object:...`, `!!int`); recipes hold
     * plain values whose type the schema gives, so none is honoured. */
    if (tag) {
        vh_status st = error_at(p, ev->start_mark,
                                "YAML tags are not supported in recipes ('%s'); write the "
                                "plain value (the schema gives each key's type)",
                                (const char *)tag);
        yaml_event_delete(ev);
        return st;
    }
    if (ev->type == YAML_ALIAS_EVENT || anchor) {
        vh_status st = error_at(p, ev->start_mark,
                                "anchors and aliases are not supported in recipes "
                                "('%s%s'); write the value out",
                                ev->type == YAML_ALIAS_EVENT ? "*" : "&",
                                (const char *)anchor);
        yaml_event_delete(ev);
        return st;
    }
    return VH_STATUS_OK;
}

static const char *scalar_text(const yaml_event_t *ev) {
    return (const char *)ev->data.scalar.value;
}

/* A plain `key:`, `~` or `null` is YAML's null; quoted text never is. */
static int is_null_scalar(const yaml_event_t *ev) {
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *t = scalar_text(ev);
    return t[0] == '\0' || strcmp(t, "~") == 0 || strcmp(t, "null") == 0 ||
           strcmp(t, "Null") == 0 || strcmp(t, "NULL") == 0;
}

static const char *node_kind(const yaml_event_t *ev) {
    switch (ev->type) {
    case YAML_SEQUENCE_START_EVENT: return "a sequence";
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SCALAR_EVENT: return "a scalar";
    default: return "something else";
    }
}

static vh_status parse_value(recipe_parser *p, vh_recipe_section *s,
                             const yaml_event_t *key) {
    const char *name = scalar_text(key);
    yaml_event_t ev;
    vh_status st = next_event(p, &ev);
    if (st != VH_STATUS_OK) return st;
    if (ev.type != YAML_SCALAR_EVENT) {
        st = error_at(p, ev.start_mark,
                      "%s.%s: expected a single value, found %s "
                      "(recipe values are scalars)",
                      s->name, name, node_kind(&ev));
    } else if (is_null_scalar(&ev)) {
        st = error_at(p, key->start_mark,
                      "%s.%s: key has no value (write one after the colon, or "
                      "remove the key to use the default)",
                      s->name, name);
    } else {
        vh_recipe_value *v = add_value(s, name, scalar_text(&ev));
        if (!v) {
            st = out_of_memory(p);
        } else {
            v->origin.source = VH_CONFIG_SOURCE_RECIPE;
            v->origin.file = p->r->file;
            v->origin.line = (int32_t)ev.start_mark.line + 1;
            v->origin.column = (int32_t)ev.start_mark.column + 1;
            v->key_line = (int)key->start_mark.line + 1;
            v->key_column = (int)key->start_mark.column + 1;
        }
    }
    yaml_event_delete(&ev);
    return st;
}

/* One `key: value` of a section, starting at the key's event. */
static vh_status parse_key(recipe_parser *p, vh_recipe_section *s,
                           const yaml_event_t *key) {
    if (key->type != YAML_SCALAR_EVENT)
        return error_at(p, key->start_mark,
                        "section '%s': keys must be plain words, found %s", s->name,
                        node_kind(key));
    const char *name = scalar_text(key);
    if (name[0] == '\0')
        return error_at(p, key->start_mark, "section '%s': empty key", s->name);
    const vh_recipe_value *earlier = find_value_mut(s, name);
    if (earlier)
        return error_at(p, key->start_mark,
                        "duplicate key '%s' in section '%s' (first set at line %d)",
                        name, s->name, earlier->key_line);
    return parse_value(p, s, key);
}

static vh_status parse_keys(recipe_parser *p, vh_recipe_section *s) {
    for (;;) {
        yaml_event_t ev;
        vh_status st = next_event(p, &ev);
        if (st != VH_STATUS_OK) return st;
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return VH_STATUS_OK;
        }
        st = parse_key(p, s, &ev);
        yaml_event_delete(&ev);
        if (st != VH_STATUS_OK) return st;
    }
}

static vh_status unknown_section(recipe_parser *p, const yaml_event_t *key) {
    const char *name = scalar_text(key);
    const char *guess = vh_suggest(name, vh_recipe_section_names);
    if (guess)
        return error_at(p, key->start_mark, "unknown section '%s'; did you mean '%s'?",
                        name, guess);
    return error_at(p, key->start_mark,
                    "unknown section '%s'; sections are run, model, precision, "
                    "sharding, optim, data",
                    name);
}

/* One `section: {...}`, starting at the section name's event. */
static vh_status parse_section(recipe_parser *p, const yaml_event_t *key) {
    if (key->type != YAML_SCALAR_EVENT)
        return error_at(p, key->start_mark,
                        "section names must be plain words, found %s", node_kind(key));
    const char *name = scalar_text(key);
    if (!is_known_section(name)) return unknown_section(p, key);
    const vh_recipe_section *earlier = find_section_mut(p->r, name);
    if (earlier)
        return error_at(p, key->start_mark,
                        "duplicate section '%s' (first at line %d)", name,
                        earlier->line);

    yaml_event_t ev;
    vh_status st = next_event(p, &ev);
    if (st != VH_STATUS_OK) return st;
    if (ev.type == YAML_MAPPING_START_EVENT) {
        vh_recipe_section *s = add_section(p->r, name, (int)key->start_mark.line + 1,
                                           (int)key->start_mark.column + 1);
        st = s ? parse_keys(p, s) : out_of_memory(p);
    } else if (ev.type == YAML_SCALAR_EVENT && is_null_scalar(&ev)) {
        st = error_at(p, key->start_mark,
                      "section '%s' is empty; expected keys below it "
                      "(write '%s: {}' for a section with no keys)",
                      name, name);
    } else {
        st = error_at(p, ev.start_mark,
                      "section '%s' must be a mapping of keys, found %s", name,
                      node_kind(&ev));
    }
    yaml_event_delete(&ev);
    return st;
}

static vh_status parse_sections(recipe_parser *p) {
    for (;;) {
        yaml_event_t ev;
        vh_status st = next_event(p, &ev);
        if (st != VH_STATUS_OK) return st;
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return VH_STATUS_OK;
        }
        st = parse_section(p, &ev);
        yaml_event_delete(&ev);
        if (st != VH_STATUS_OK) return st;
    }
}

/* The document's root node: must be a mapping of sections. */
static vh_status parse_root(recipe_parser *p) {
    yaml_event_t ev;
    vh_status st = next_event(p, &ev);
    if (st != VH_STATUS_OK) return st;
    if (ev.type == YAML_MAPPING_START_EVENT)
        st = parse_sections(p);
    else if (ev.type == YAML_SCALAR_EVENT && is_null_scalar(&ev))
        st = diag_set(p->d, VH_STATUS_ERR_CONFIG, empty_message, p->r->file);
    else
        st = error_at(p, ev.start_mark, "expected a mapping of sections, found %s",
                      node_kind(&ev));
    yaml_event_delete(&ev);
    return st;
}

/* Expects an event of `type`; anything else is a bug in libyaml or here. */
static vh_status expect_event(recipe_parser *p, yaml_event_type_t type) {
    yaml_event_t ev;
    vh_status st = next_event(p, &ev);
    if (st != VH_STATUS_OK) return st;
    if (ev.type != type)
        st = error_at(p, ev.start_mark, "unexpected YAML event %d (expected %d)",
                      (int)ev.type, (int)type);
    yaml_event_delete(&ev);
    return st;
}

static vh_status parse_stream(recipe_parser *p) {
    vh_status st = expect_event(p, YAML_STREAM_START_EVENT);
    if (st != VH_STATUS_OK) return st;
    yaml_event_t ev;
    if ((st = next_event(p, &ev)) != VH_STATUS_OK) return st;
    yaml_event_type_t type = ev.type;
    yaml_event_delete(&ev);
    if (type == YAML_STREAM_END_EVENT)
        return diag_set(p->d, VH_STATUS_ERR_CONFIG, empty_message, p->r->file);
    if ((st = parse_root(p)) != VH_STATUS_OK) return st;
    if ((st = expect_event(p, YAML_DOCUMENT_END_EVENT)) != VH_STATUS_OK) return st;
    if ((st = next_event(p, &ev)) != VH_STATUS_OK) return st;
    if (ev.type == YAML_DOCUMENT_START_EVENT)
        st = error_at(p, ev.start_mark,
                      "more than one document in the recipe; a recipe is one "
                      "mapping of sections");
    else if (ev.type != YAML_STREAM_END_EVENT)
        st = error_at(p, ev.start_mark, "unexpected YAML event %d at the end",
                      (int)ev.type);
    yaml_event_delete(&ev);
    return st;
}

/* ---- loading -------------------------------------------------------------- */

/* Parses r->source (already set, owned by r) into r's sections. */
static vh_status parse_source(vh_recipe *r, vh_diag *d) {
    vh_status st = check_text(r->file, r->source, r->source_len, d);
    if (st != VH_STATUS_OK) return st;
    recipe_parser p = {.r = r, .d = d};
    if (!yaml_parser_initialize(&p.yaml)) return out_of_memory(&p);
    yaml_parser_set_input_string(&p.yaml, (const unsigned char *)r->source,
                                 r->source_len);
    st = parse_stream(&p);
    yaml_parser_delete(&p.yaml);
    return st;
}

/* Takes ownership of file and source (NUL-terminated, len bytes before it). */
static vh_status load_owned(vh_recipe *out, char *file, char *source, size_t len,
                            vh_diag *d) {
    vh_recipe r = {.file = file, .source = source, .source_len = len};
    vh_status st = parse_source(&r, d);
    if (st != VH_STATUS_OK) {
        recipe_free(&r);
        return st;
    }
    *out = r;
    return VH_STATUS_OK;
}

vh_status recipe_load_string(vh_recipe *out, const char *name, const char *text,
                             size_t len, vh_diag *d) {
    if (!out) return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "recipe: no output");
    memset(out, 0, sizeof *out);
    const char *shown = name ? name : "<string>";
    if (!text && len > 0)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "%s: no text", shown);
    if (len > VH_RECIPE_MAX_BYTES) return too_large(shown, len, d);
    char *file = strdup(shown);
    char *source = malloc(len + 1);
    if (!file || !source) {
        free(file);
        free(source);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "%s: out of memory", shown);
    }
    if (len) memcpy(source, text, len);
    source[len] = '\0';
    return load_owned(out, file, source, len, d);
}

/* Reads at most VH_RECIPE_MAX_BYTES + 1 bytes, so a pipe or a file that grew
 * after fstat still cannot make us read more than one byte too many. The
 * buffer starts at size_hint (the file's size) and grows only if it must. */
static vh_status read_all(int fd, const char *path, size_t size_hint, char **text,
                          size_t *len, vh_diag *d) {
    const size_t limit = (size_t)VH_RECIPE_MAX_BYTES + 1;
    size_t cap = size_hint + 1 < 4096 ? 4096 : size_hint + 1, used = 0;
    if (cap > limit) cap = limit;
    char *buf = malloc(cap + 1);
    if (!buf) return diag_set(d, VH_STATUS_ERR_NOMEM, "%s: out of memory", path);
    for (;;) {
        if (used == cap) {
            if (cap == limit) break;
            size_t grown_cap = cap * 2 < limit ? cap * 2 : limit;
            char *grown = realloc(buf, grown_cap + 1);
            if (!grown) {
                free(buf);
                return diag_set(d, VH_STATUS_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = grown;
            cap = grown_cap;
        }
        ssize_t n = read(fd, buf + used, cap - used);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int err = errno;
            free(buf);
            return diag_set(d, VH_STATUS_ERR_IO, "%s: cannot read recipe: %s", path,
                            strerror(err));
        }
        if (n == 0) break;
        used += (size_t)n;
    }
    if (used > VH_RECIPE_MAX_BYTES) {
        free(buf);
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: more than %u bytes is too large for a recipe", path,
                        (unsigned)VH_RECIPE_MAX_BYTES);
    }
    buf[used] = '\0';
    *text = buf;
    *len = used;
    return VH_STATUS_OK;
}

/* Opens path for reading and refuses what cannot be a recipe before reading. */
static vh_status open_recipe(const char *path, int *fd_out, size_t *size_out,
                             vh_diag *d) {
    /* O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever;
     * anything but a regular file is refused below, before any read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return diag_set(d, VH_STATUS_ERR_IO, "%s: cannot open recipe: %s", path,
                        strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return diag_set(d, VH_STATUS_ERR_IO, "%s: cannot stat recipe: %s", path,
                        strerror(err));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return diag_set(d, VH_STATUS_ERR_IO, "%s: is a directory, not a recipe file",
                        path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        const char *kind = S_ISFIFO(st.st_mode)  ? "a FIFO (named pipe)"
                           : S_ISCHR(st.st_mode) ? "a character device"
                           : S_ISBLK(st.st_mode) ? "a block device"
                           : S_ISSOCK(st.st_mode) ? "a socket"
                                                  : "not a regular file";
        return diag_set(d, VH_STATUS_ERR_IO,
                        "%s: is %s, not a recipe file (write the recipe to a file; a run "
                        "folder keeps a copy of it)",
                        path, kind);
    }
    if ((unsigned long long)st.st_size > VH_RECIPE_MAX_BYTES) {
        close(fd);
        return too_large(path, (unsigned long long)st.st_size, d);
    }
    *fd_out = fd;
    /* Regular files never block; reads stay blocking in spirit. */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *size_out = (size_t)st.st_size;
    return VH_STATUS_OK;
}

vh_status recipe_load_file(vh_recipe *out, const char *path, vh_diag *d) {
    if (!out) return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "recipe: no output");
    memset(out, 0, sizeof *out);
    if (!path || !path[0])
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "recipe: no file name given");
    int fd = -1;
    size_t size = 0;
    vh_status st = open_recipe(path, &fd, &size, d);
    if (st != VH_STATUS_OK) return st;
    char *text = NULL;
    size_t len = 0;
    st = read_all(fd, path, size, &text, &len, d);
    close(fd);
    if (st != VH_STATUS_OK) return st;
    char *file = strdup(path);
    if (!file) {
        free(text);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "%s: out of memory", path);
    }
    return load_owned(out, file, text, len, d);
}

/* ---- --set ---------------------------------------------------------------- */

static vh_status set_error(vh_diag *d, const char *assignment, const char *fmt, ...)
    VH_PRINTF_LIKE(3, 4);

static vh_status set_error(vh_diag *d, const char *assignment, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return diag_set(d, VH_STATUS_ERR_CONFIG, "--set %s: %s", assignment, msg);
}

static vh_status set_section_error(vh_diag *d, const char *assignment,
                                   const char *section) {
    const char *guess = vh_suggest(section, vh_recipe_section_names);
    if (guess)
        return set_error(d, assignment, "unknown section '%s'; did you mean '%s'?",
                         section, guess);
    return set_error(d, assignment,
                     "unknown section '%s'; sections are run, model, precision, "
                     "sharding, optim, data",
                     section);
}

/* Stores value under section.key: replaces or appends, origin SET. The
 * file's text it replaces is kept (vh_recipe_value.replaced). */
static vh_status set_value(vh_recipe *r, const char *section, const char *key,
                           const char *value, vh_diag *d) {
    vh_recipe_section *s = find_section_mut(r, section);
    if (!s && !(s = add_section(r, section, 0, 0)))
        return diag_set(d, VH_STATUS_ERR_NOMEM, "--set: out of memory");
    vh_recipe_value *v = find_value_mut(s, key);
    if (v) {
        char *copy = strdup(value);
        if (!copy) return diag_set(d, VH_STATUS_ERR_NOMEM, "--set: out of memory");
        if (v->origin.source == VH_CONFIG_SOURCE_RECIPE && !v->replaced)
            v->replaced = v->text;
        else
            free(v->text);
        v->text = copy;
    } else if (!(v = add_value(s, key, value))) {
        return diag_set(d, VH_STATUS_ERR_NOMEM, "--set: out of memory");
    }
    v->origin = (vh_config_origin){VH_CONFIG_SOURCE_SET, NULL, 0, 0};
    v->key_line = v->key_column = 0;
    return VH_STATUS_OK;
}

/* Moves src's values into dst (whose own are freed), as --set values. */
static void take_values(vh_recipe_section *dst, vh_recipe_section *src) {
    for (int j = 0; j < dst->count; j++) {
        free(dst->values[j].key);
        free(dst->values[j].text);
        free(dst->values[j].replaced);
    }
    free(dst->values);
    dst->values = src->values;
    dst->count = src->count;
    src->values = NULL;
    src->count = 0;
    for (int j = 0; j < dst->count; j++) {
        dst->values[j].origin = (vh_config_origin){VH_CONFIG_SOURCE_SET, NULL, 0, 0};
        dst->values[j].key_line = dst->values[j].key_column = 0;
    }
    dst->line = dst->column = 0; /* no longer the file's section */
}

/* `section={key: value, ...}`: the value read as the section of a recipe
 * of its own (the same checks as a file's), then put in place of the
 * recipe's section. */
static vh_status set_section(vh_recipe *r, const char *assignment, const char *section,
                             const char *value, vh_diag *d) {
    if (value[strspn(value, " ")] != '{')
        return set_error(d, assignment,
                         "expected section.key=value, or %s={key: value, ...} (a YAML flow "
                         "mapping) to replace the section whole",
                         section);
    size_t len = strlen(section) + strlen(value) + 4;
    char *text = malloc(len), *name = malloc(strlen(assignment) + 7);
    if (!text || !name) {
        free(text);
        free(name);
        return diag_set(d, VH_STATUS_ERR_NOMEM, "--set: out of memory");
    }
    snprintf(text, len, "%s: %s\n", section, value);
    sprintf(name, "--set %s", assignment);
    vh_recipe one;
    vh_status st = recipe_load_string(&one, name, text, strlen(text), d);
    free(text);
    free(name);
    if (st != VH_STATUS_OK) return st;
    vh_recipe_section *s = find_section_mut(r, section);
    if (!s && !(s = add_section(r, section, 0, 0)))
        st = diag_set(d, VH_STATUS_ERR_NOMEM, "--set: out of memory");
    else
        take_values(s, &one.sections[0]);
    recipe_free(&one);
    return st;
}

vh_status recipe_apply_set(vh_recipe *r, const char *assignment, vh_diag *d) {
    if (!r || !assignment)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "--set: no assignment");
    const char *eq = strchr(assignment, '=');
    if (!eq)
        return set_error(d, assignment, "expected section.key=value (no '=')");
    size_t lhs_len = (size_t)(eq - assignment);
    const char *dot = memchr(assignment, '.', lhs_len);
    /* A bare word before '=' is a whole section only when it names one (or
     * the value is a mapping: then a misspelt section is worth naming). */
    int whole = !dot && lhs_len > 0 && eq[1 + strspn(eq + 1, " ")] == '{';
    for (const char *const *n = vh_recipe_section_names; !dot && !whole && *n; n++)
        whole = strlen(*n) == lhs_len && strncmp(*n, assignment, lhs_len) == 0;
    if (lhs_len == 0 || (!dot && !whole))
        return set_error(d, assignment,
                         "expected section.key=value (no section.key before '=')");
    size_t section_len = dot ? (size_t)(dot - assignment) : lhs_len;
    size_t key_len = dot ? lhs_len - section_len - 1 : 0;
    if (section_len == 0) return set_error(d, assignment, "the section name is empty");
    if (dot && key_len == 0) return set_error(d, assignment, "the key name is empty");
    if (eq[1] == '\0')
        return set_error(d, assignment,
                         "the value is empty (leave the key out to use its default)");

    char *section = strndup(assignment, section_len);
    char *key = dot ? strndup(dot + 1, key_len) : NULL;
    vh_status st;
    if (!section || (dot && !key))
        st = diag_set(d, VH_STATUS_ERR_NOMEM, "--set: out of memory");
    else if (!is_known_section(section))
        st = set_section_error(d, assignment, section);
    else if (!dot)
        st = set_section(r, assignment, section, eq + 1, d);
    else
        st = set_value(r, section, key, eq + 1, d);
    free(section);
    free(key);
    return st;
}

/* ---- pointing at a value -------------------------------------------------- */

vh_status recipe_diag_value(const vh_recipe *r, const vh_recipe_section *s,
                            const vh_recipe_value *v, int at_key, vh_diag *d,
                            vh_status status, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *file = r && r->file ? r->file : "<recipe>";
    const char *source = r ? r->source : NULL;
    size_t source_len = r ? r->source_len : 0;

    if (v && v->origin.source == VH_CONFIG_SOURCE_SET)
        return diag_set(d, status, "--set %s.%s=%s: %s", s ? s->name : "?", v->key,
                        v->text, msg);
    if (v && v->origin.source == VH_CONFIG_SOURCE_RECIPE) {
        int line = at_key ? v->key_line : v->origin.line;
        int col = at_key ? v->key_column : v->origin.column;
        return diag_set_at(d, status, file, source, source_len, line, col, "%s", msg);
    }
    /* No value (or one not from a file): point at the section when it has a
     * place in the file, else at the file. */
    if (s && s->line > 0)
        return diag_set_at(d, status, file, source, source_len, s->line, s->column,
                           "%s", msg);
    return diag_set(d, status, "%s: %s", file, msg);
}
