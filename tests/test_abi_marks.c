/* test_abi_marks.c - the contract written in the SDK headers against the
 * host's own lists, so the two cannot drift.
 *
 * Each role header's vtable (and vh_comm.h's vh_comm_ops) carries, in the
 * comment before every call, exactly one of `@required` or
 * `@optional(default: ...)`. The host says the same in code: REQUIRED /
 * OPTIONAL / ONE_OF in host/core/vtables.c, COMM_REQUIRED / COMM_OPTIONAL in
 * the comm_op_marks table. Both are read here as text: a mark must match the
 * host's list, and every call the host lists must be in the header. The
 * host table (vh_host_api) and the descriptor are checked for one mark each.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADERS VH_TEST_SDK_HEADERS
#define HOST_CORE VH_TEST_HOST_CORE

#define MAX_MEMBERS 64

typedef struct mark {
    char name[64];
    int required, optional, malformed; /* counts of each mark in its comment */
} mark;

/* What the host lists: kind 'R' required, 'O' optional, '1' one of a pair. */
typedef struct listed {
    char type[64], name[64];
    char kind;
} listed;

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (text) text[n] = '\0';
    fclose(f);
    return text;
}

static int is_ident(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Copies the identifier at p (after blanks) into out; returns past it. */
static const char *read_ident(const char *p, char *out, size_t len) {
    size_t n = 0;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    while (is_ident(*p) && n + 1 < len) out[n++] = *p++;
    out[n] = '\0';
    return p;
}

/* Adds the marks of the comment [from, to) to m. */
static void count_marks(const char *from, const char *to, mark *m) {
    for (const char *p = from; p < to; p++) {
        if (*p != '@') continue;
        if (strncmp(p, "@required", 9) == 0 && !is_ident(p[9])) m->required++;
        else if (strncmp(p, "@optional(default:", 18) == 0) m->optional++;
        else if (strncmp(p, "@optional", 9) == 0) m->malformed++;
    }
}

/* The function-pointer members of `struct type {` in text, each with the
 * marks in the comments between the previous member and its own `;`; a
 * comment on the line a member ends belongs to that member. Returns the
 * count, or -1 when the struct is not there. */
static int parse_struct(const char *text, const char *type, mark *out, int max) {
    char open[128];
    snprintf(open, sizeof open, "struct %s {", type);
    const char *p = strstr(text, open);
    const char *end = p ? strstr(p, "\n}") : NULL;
    if (!p || !end) return -1;
    mark cur, sink; /* sink: what a comment after a member that is no call says */
    memset(&cur, 0, sizeof cur);
    memset(&sink, 0, sizeof sink);
    int n = 0;
    int ended = -2; /* on this line: -2 no member ended, -1 one not a call, else out[ended] */
    for (p += strlen(open); p < end; p++) {
        if (p[0] == '/' && p[1] == '*') {
            const char *q = strstr(p + 2, "*/");
            if (!q) return -1;
            count_marks(p + 2, q, ended == -2 ? &cur : ended == -1 ? &sink : &out[ended]);
            p = q + 1;
        } else if (p[0] == '(' && p[1] == '*' && !cur.name[0]) {
            p = read_ident(p + 2, cur.name, sizeof cur.name) - 1;
        } else if (*p == ';') {
            ended = -1;
            if (cur.name[0] && n < max) out[n] = cur, ended = n++;
            memset(&cur, 0, sizeof cur);
        } else if (*p == '\n') {
            ended = -2;
        }
    }
    return n;
}

/* Blanks C comments, so that the lists are read from code only. */
static void strip_comments(char *text) {
    for (char *p = text; *p; p++) {
        if (p[0] != '/' || p[1] != '*') continue;
        char *q = strstr(p + 2, "*/");
        char *stop = q ? q + 2 : p + strlen(p);
        memset(p, ' ', (size_t)(stop - p));
        p = stop - 1;
    }
}

/* Every `macro(` use in text outside #define lines, each as `kind`; with
 * typed != 0 its first argument is the type, else the type is "". */
static int parse_list(const char *text, const char *macro, int typed, char kind, listed *out,
                      int n, int max) {
    size_t len = strlen(macro);
    for (const char *p = strstr(text, macro); p; p = strstr(p + len, macro)) {
        if ((p > text && is_ident(p[-1])) || p[len] != '(') continue;
        const char *line = p;
        while (line > text && line[-1] != '\n') line--;
        while (*line == ' ') line++;
        if (strncmp(line, "#define", 7) == 0 || n >= max) continue;
        listed *l = &out[n];
        const char *q = p + len + 1;
        l->type[0] = '\0';
        if (typed) q = read_ident(q, l->type, sizeof l->type);
        if (typed && *q++ != ',') continue;
        read_ident(q, l->name, sizeof l->name);
        l->kind = kind;
        n++;
    }
    return n;
}

static const mark *find_mark(const mark *m, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(m[i].name, name) == 0) return &m[i];
    return NULL;
}

static const listed *find_listed(const listed *l, int n, const char *type, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(l[i].type, type) == 0 && strcmp(l[i].name, name) == 0) return &l[i];
    return NULL;
}

/* The marks of header:type; -1 (and a message) when it cannot be read. */
static int header_marks(const char *header, const char *type, mark *m) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", HEADERS, header);
    char *text = read_text(path);
    int n = text ? parse_struct(text, type, m, MAX_MEMBERS) : -1;
    free(text);
    if (n <= 0) print_error("%s: no struct %s with calls found\n", path, type);
    return n;
}

/* Exactly one well-formed mark per call; returns the failures. */
static int check_one_mark(const char *header, const mark *m, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (m[i].required + m[i].optional == 1 && !m[i].malformed) continue;
        print_error("%s: %s has %d @required, %d @optional(default: ...), %d malformed "
                    "@optional: it needs exactly one\n",
                    header, m[i].name, m[i].required, m[i].optional, m[i].malformed);
        bad++;
    }
    return bad;
}

/* The header's marks against the host's list for `type`; returns failures. */
static int check_against(const char *header, const char *type, const mark *m, int n,
                         const listed *host, int nhost, const char *host_file) {
    int bad = check_one_mark(header, m, n);
    for (int i = 0; i < n; i++) {
        const listed *l = find_listed(host, nhost, type, m[i].name);
        if (!l) {
            print_error("%s: %s.%s is not listed in %s\n", header, type, m[i].name, host_file);
            bad++;
        } else if (m[i].required && l->kind != 'R') {
            print_error("%s: %s.%s is marked @required, but %s lists it as %s\n", header, type,
                        m[i].name, host_file, l->kind == '1' ? "ONE_OF" : "OPTIONAL");
            bad++;
        } else if (m[i].optional && l->kind == 'R') {
            print_error("%s: %s.%s is marked @optional, but %s lists it as REQUIRED\n", header,
                        type, m[i].name, host_file);
            bad++;
        }
    }
    for (int i = 0; i < nhost; i++) {
        if (strcmp(host[i].type, type) != 0 || find_mark(m, n, host[i].name)) continue;
        print_error("%s lists %s.%s, which %s does not have\n", host_file, type, host[i].name,
                    header);
        bad++;
    }
    return bad;
}

static int vtables_list(listed *out, int max) {
    char *text = read_text(HOST_CORE "/vtables.c");
    if (!text) return -1;
    strip_comments(text);
    int n = parse_list(text, "REQUIRED", 1, 'R', out, 0, max);
    n = parse_list(text, "OPTIONAL", 1, 'O', out, n, max);
    n = parse_list(text, "ONE_OF", 1, '1', out, n, max);
    free(text);
    return n;
}

static void check_role(const char *header, const char *type) {
    listed host[5 * MAX_MEMBERS];
    mark m[MAX_MEMBERS];
    int nhost = vtables_list(host, 5 * MAX_MEMBERS);
    int n = header_marks(header, type, m);
    assert_true(nhost > 0);
    assert_true(n > 0);
    int bad = check_against(header, type, m, n, host, nhost, "host/core/vtables.c");
    if (!bad) print_message("%s: %d calls, marks agree with host/core/vtables.c\n", type, n);
    assert_int_equal(bad, 0);
}

static void test_model_marks(void **state) {
    (void)state;
    check_role("vh_model.h", "vh_model_vtable");
}

static void test_precision_marks(void **state) {
    (void)state;
    check_role("vh_precision.h", "vh_precision_vtable");
}

static void test_sharding_marks(void **state) {
    (void)state;
    check_role("vh_sharding.h", "vh_sharding_vtable");
}

static void test_optim_marks(void **state) {
    (void)state;
    check_role("vh_optim.h", "vh_optim_vtable");
}

static void test_data_marks(void **state) {
    (void)state;
    check_role("vh_data.h", "vh_data_vtable");
}

/* The host's comm_op_marks, from whichever host/core file holds it. */
static int comm_list(listed *out, int max, const char **file) {
    static const char *const files[] = {"comm_stats.c", "backends.c"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", HOST_CORE, files[i]);
        char *text = read_text(path);
        if (!text) continue;
        strip_comments(text);
        int n = parse_list(text, "COMM_REQUIRED", 0, 'R', out, 0, max);
        n = parse_list(text, "COMM_OPTIONAL", 0, 'O', out, n, max);
        free(text);
        *file = files[i];
        for (int k = 0; k < n; k++) snprintf(out[k].type, sizeof out[k].type, "vh_comm_ops");
        if (n > 0) return n;
    }
    return 0;
}

static void test_comm_marks(void **state) {
    (void)state;
    listed host[MAX_MEMBERS];
    mark m[MAX_MEMBERS];
    const char *file = NULL;
    int nhost = comm_list(host, MAX_MEMBERS, &file);
    int n = header_marks("vh_comm.h", "vh_comm_ops", m);
    assert_true(n > 0);
    int bad;
    if (nhost > 0) {
        char where[64];
        snprintf(where, sizeof where, "host/core/%s", file);
        bad = check_against("vh_comm.h", "vh_comm_ops", m, n, host, nhost, where);
        if (!bad) print_message("vh_comm_ops: %d calls, marks agree with %s\n", n, where);
    } else {
        print_message("vh_comm_ops: no comm_op_marks table in host/core: marks checked for "
                      "presence only\n");
        bad = check_one_mark("vh_comm.h", m, n);
    }
    assert_int_equal(bad, 0);
}

/* Tables the host fills (or a plugin may leave NULL): one mark per call. */
static void test_host_tables_marked(void **state) {
    (void)state;
    mark m[MAX_MEMBERS];
    int n = header_marks("vh_host.h", "vh_host_api", m);
    assert_true(n > 0);
    int bad = check_one_mark("vh_host.h", m, n);
    int nd = header_marks("vh_plugin.h", "vh_plugin_descriptor", m);
    assert_true(nd > 0);
    bad += check_one_mark("vh_plugin.h", m, nd);
    if (!bad) print_message("vh_host_api: %d calls, vh_plugin_descriptor: %d, each marked\n", n, nd);
    assert_int_equal(bad, 0);
}

/* The parser itself: a mark counts only inside its own member's comments. */
static void test_parser(void **state) {
    (void)state;
    static const char text[] =
        "typedef struct t {\n    uint32_t struct_size; /* @required is not a call */\n"
        "    /* @required. */\n    void (*a)(void *self, void (*cb)(void));\n"
        "    /* @optional(default: x) */\n    int (*b)(void);\n    /* @optional */\n"
        "    int (*c)(void);\n    int (*d)(void);\n} t;\n";
    mark m[8];
    assert_int_equal(parse_struct(text, "t", m, 8), 4);
    assert_string_equal(m[0].name, "a");
    assert_int_equal(m[0].required, 1);
    assert_int_equal(m[1].optional, 1);
    assert_int_equal(m[2].malformed, 1);
    assert_int_equal(m[3].required + m[3].optional + m[3].malformed, 0); /* d: unmarked */
    static const char list[] = "#define REQUIRED(type, member) {#member}\n"
                               "    REQUIRED(t, a),\n    ONE_OF(t, b, c),\n";
    listed l[4];
    assert_int_equal(parse_list(list, "REQUIRED", 1, 'R', l, 0, 4), 1);
    assert_string_equal(l[0].name, "a");
    assert_int_equal(parse_list(list, "ONE_OF", 1, '1', l, 1, 4), 2);
    assert_string_equal(l[1].name, "b");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parser),
        cmocka_unit_test(test_model_marks),
        cmocka_unit_test(test_precision_marks),
        cmocka_unit_test(test_sharding_marks),
        cmocka_unit_test(test_optim_marks),
        cmocka_unit_test(test_data_marks),
        cmocka_unit_test(test_comm_marks),
        cmocka_unit_test(test_host_tables_marked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
