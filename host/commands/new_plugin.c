/* new_plugin.c - `vithost new-plugin ROLE NAME [DIR]`.
 *
 * Writes DIR (default ./NAME) with a plugin project that builds and trains
 * as written: CMakeLists.txt (find_package(vithost)), NAME.c (a complete
 * plugin of the role, each call's contract in a comment), NAME.yaml (the
 * main job with the role's section swapped for NAME), README.md and, where
 * the role has a test template (optim), test_NAME.c: unit tests in vithost's
 * test host, run by ctest. The texts are templates embedded in the
 * executable (cmake/templates/); @NAME@, @ROLE@ and @VERSION@ are replaced.
 * Nothing is overwritten: when any of the files exists, nothing is written.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "new_plugin.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "outputs.h"

#ifndef VITHOST_VERSION
#define VITHOST_VERSION "0.0.0"
#endif

static const char *const roles[] = {"model", "precision", "sharding", "optim", "data"};
enum { NUM_ROLES = 5, MAX_NAME = 64 };

static const char *template_text(const char *name) {
    for (const new_plugin_file *f = new_plugin_files; f->name; f++)
        if (strcmp(f->name, name) == 0) return f->text;
    return NULL;
}

/* A name the loader accepts ([a-z0-9_-]) that is also a CMake target name
 * and a file name: a letter first, at most MAX_NAME characters. */
static int name_is_valid(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > MAX_NAME || name[0] < 'a' || name[0] > 'z') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return 0;
    }
    return 1;
}

/* A growing string; on allocation failure ok becomes 0. */
typedef struct text {
    char *s;
    size_t len, cap;
    int ok;
} text;

static void text_add(text *t, const char *s, size_t n) {
    if (!t->ok) return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + n + 1) cap *= 2;
        char *p = realloc(t->s, cap);
        if (!p) {
            t->ok = 0;
            return;
        }
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

static void text_str(text *t, const char *s) { text_add(t, s, strlen(s)); }

/* The template with its placeholders replaced; NULL when out of memory. */
static char *substitute(const char *tpl, const char *name, const char *role) {
    static const char *const keys[] = {"@NAME@", "@ROLE@", "@VERSION@"};
    const char *values[] = {name, role, VITHOST_VERSION};
    text t = {NULL, 0, 0, 1};
    text_add(&t, "", 0);
    for (const char *p = tpl; *p;) {
        size_t k = 0;
        while (k < 3 && strncmp(p, keys[k], strlen(keys[k])) != 0) k++;
        if (k < 3) {
            text_str(&t, values[k]);
            p += strlen(keys[k]);
        } else {
            text_add(&t, p++, 1);
        }
    }
    if (!t.ok) free(t.s);
    return t.ok ? t.s : NULL;
}

/* The main job's recipe with its leading comment replaced and the role's
 * section reduced to `plugin: NAME` (the plugin's defaults for the rest). */
static char *make_recipe(const char *main_job, const char *role, const char *name) {
    text t = {NULL, 0, 0, 1};
    text_str(&t, "# ");
    text_str(&t, name);
    text_str(&t, ".yaml: vithost's main job (configs/fashion-mnist-vit.yaml, a ViT on\n"
                 "# Fashion-MNIST) with the ");
    text_str(&t, role);
    text_str(&t, " section swapped for the plugin '");
    text_str(&t, name);
    text_str(&t, "'.\n#\n#   VITHOST_PLUGIN_PATH=build vithost run ");
    text_str(&t, name);
    text_str(&t, ".yaml --set run.steps=20\n");
    const char *p = main_job;
    /* Skip the main job's own header comment. */
    while (*p == '#' || *p == '\n') {
        const char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : p + strlen(p);
    }
    size_t rlen = strlen(role);
    int skipping = 0, found = 0;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
        if (skipping && (*p == ' ' || *p == '\t')) {
            p += n;
            continue;
        }
        skipping = 0;
        if (strncmp(p, role, rlen) == 0 && p[rlen] == ':') {
            text_str(&t, role);
            text_str(&t, ":\n  plugin: ");
            text_str(&t, name);
            text_str(&t, "\n");
            skipping = found = 1;
        } else {
            text_add(&t, p, n);
        }
        p += n;
    }
    if (!t.ok || !found) {
        free(t.s);
        return NULL;
    }
    return t.s;
}

/* mkdir -p; 0 on success, errno kept on failure. */
static int make_dirs(const char *dir) {
    char path[PATH_MAX];
    if (strlen(dir) >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(path, dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* The prefix this vithost was installed to (<exe dir>/..), when it holds
 * the CMake package; else NULL. Malloc'd. */
static char *installed_prefix(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = '\0';
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/../lib/cmake/vithost/vithostConfig.cmake", exe);
    if (access(probe, R_OK) != 0) return NULL;
    snprintf(probe, sizeof probe, "%s/..", exe);
    return realpath(probe, NULL);
}

/* ROLE NAME [DIR] checked; 0, or an exit code with the message written. */
static int parse_args(int argc, char **argv, FILE *err, const char **role, const char **name,
                      const char **dir) {
    if (argc < 2 || argc > 3) {
        fputs("vithost: usage: vithost new-plugin ROLE NAME [DIR]  (ROLE: model, precision, "
              "sharding, optim or data; DIR defaults to ./NAME)\n",
              err);
        return VH_EXIT_USAGE;
    }
    *role = argv[0], *name = argv[1], *dir = argc == 3 ? argv[2] : argv[1];
    int r = 0;
    while (r < NUM_ROLES && strcmp(roles[r], *role) != 0) r++;
    if (r == NUM_ROLES) {
        fprintf(err, "vithost: new-plugin: unknown role '%s'; the roles are model, precision, "
                     "sharding, optim and data\n",
                *role);
        return VH_EXIT_USAGE;
    }
    if (!name_is_valid(*name)) {
        fprintf(err, "vithost: new-plugin: '%s' is not a plugin name: use a lower-case letter "
                     "then lower-case letters, digits, '_' or '-' (at most %d), e.g. my_%s\n",
                *name, MAX_NAME, *role);
        return VH_EXIT_USAGE;
    }
    return VH_EXIT_OK;
}

/* The project's files: CMakeLists.txt, NAME.c, NAME.yaml, README.md, and
 * test_NAME.c where the role has a test template (test_ROLE.c). */
enum { MAX_FILES = 5 };
typedef struct project {
    char names[MAX_FILES][MAX_NAME + 16];
    char *texts[MAX_FILES];
    int count;
} project;

/* Fills p; an exit code on failure (p's texts freed by the caller). */
static int make_project(project *p, const char *role, const char *name, FILE *err) {
    char c_tpl[32], test_tpl[40];
    snprintf(c_tpl, sizeof c_tpl, "%s.c", role);
    snprintf(test_tpl, sizeof test_tpl, "test_%s.c", role);
    const char *tpls[MAX_FILES] = {template_text("CMakeLists.txt"), template_text(c_tpl), NULL,
                                   template_text("README.md"), template_text(test_tpl)};
    const char *main_job = template_text("recipe.yaml");
    if (!tpls[0] || !tpls[1] || !tpls[3] || !main_job) {
        fputs("vithost: new-plugin: this vithost was built without its templates\n", err);
        return VH_EXIT_RUN_FAILED;
    }
    p->count = tpls[4] ? 5 : 4;
    snprintf(p->names[0], sizeof p->names[0], "CMakeLists.txt");
    snprintf(p->names[1], sizeof p->names[1], "%s.c", name);
    snprintf(p->names[2], sizeof p->names[2], "%s.yaml", name);
    snprintf(p->names[3], sizeof p->names[3], "README.md");
    snprintf(p->names[4], sizeof p->names[4], "test_%s.c", name);
    for (int i = 0; i < p->count; i++) {
        p->texts[i] = i == 2 ? make_recipe(main_job, role, name) : substitute(tpls[i], name, role);
        if (!p->texts[i]) {
            fputs("vithost: new-plugin: out of memory\n", err);
            return VH_EXIT_RUN_FAILED;
        }
    }
    return VH_EXIT_OK;
}

/* Writes p into dir, none of whose files may exist yet: checked before the
 * first is written, with lstat (a link, even to nothing, is something). */
static int write_project(const project *p, const char *dir, FILE *out, FILE *err) {
    char path[PATH_MAX], msg[PATH_MAX + 200];
    struct stat st;
    if (output_dir_check(dir, msg, sizeof msg) != 0) {
        fprintf(err, "vithost: new-plugin: %s\n", msg);
        return VH_EXIT_USAGE;
    }
    for (int i = 0; i < p->count; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, p->names[i]);
        if (lstat(path, &st) == 0) {
            fprintf(err, "vithost: new-plugin: %s exists; nothing was written (choose another "
                         "DIR, or remove it)\n",
                    path);
            return VH_EXIT_USAGE;
        }
    }
    if (make_dirs(dir) != 0) {
        fprintf(err, "vithost: new-plugin: cannot create %s: %s\n", dir, strerror(errno));
        return VH_EXIT_RUN_FAILED;
    }
    for (int i = 0; i < p->count; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, p->names[i]);
        FILE *f = fopen(path, "wx"); /* C11: fails rather than overwrite */
        int ok = f && fputs(p->texts[i], f) >= 0;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok) {
            fprintf(err, "vithost: new-plugin: cannot write %s: %s\n", path, strerror(errno));
            return VH_EXIT_RUN_FAILED;
        }
        fprintf(out, "wrote %s\n", path);
    }
    return VH_EXIT_OK;
}

int new_plugin_command(int argc, char **argv, FILE *out, FILE *err) {
    const char *role, *name, *dir;
    int code = parse_args(argc, argv, err, &role, &name, &dir);
    if (code != VH_EXIT_OK) return code;
    project p = {.count = 0};
    code = make_project(&p, role, name, err);
    if (code == VH_EXIT_OK) code = write_project(&p, dir, out, err);
    if (code == VH_EXIT_OK) {
        char *prefix = installed_prefix();
        fprintf(out,
                "\nbuild it and train the main job with it:\n"
                "  cmake -S %s -B %s/build -DCMAKE_PREFIX_PATH=%s\n"
                "  cmake --build %s/build\n"
                "  cd %s && VITHOST_PLUGIN_PATH=$PWD/build vithost run %s --set run.steps=20\n",
                dir, dir, prefix ? prefix : "<vithost install prefix>", dir, dir, p.names[2]);
        if (p.count > 4)
            fprintf(out, "and run its unit tests (%s, on the SDK's test host):\n"
                         "  ctest --test-dir %s/build\n", p.names[4], dir);
        free(prefix);
    }
    for (int i = 0; i < MAX_FILES; i++) free(p.texts[i]);
    return code;
}
