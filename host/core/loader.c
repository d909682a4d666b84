/* loader.c - finding plugins on the search path and opening them safely.
 *
 * loader_open is the only place a plugin file is dlopen'd. It reads the
 * descriptor's fixed header (magic, ABI major/minor) from the file before
 * loading it, then, loaded, the members the descriptor's struct_size covers
 * and the role's vtable (vtables.c: size, required calls), and refuses with
 * one message naming the file before anything of the plugin is used. The
 * host keeps full-size copies of both. Scanning and resolving by name are
 * built on it: they open every *.so of a directory, copy what they need and
 * close it.
 */
#define _GNU_SOURCE /* dladdr1, realpath, readlink, strdup */
#include "loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "elf_symbol.h"
#include "recipe.h"
#include "vtables.h"

#ifndef VH_PLUGIN_DIR_FROM_EXE /* the installed plugins, relative to bin/vithost */
#define VH_PLUGIN_DIR_FROM_EXE "../lib/vithost/plugins"
#endif
#ifndef VH_INSTALL_PLUGIN_DIR
#define VH_INSTALL_PLUGIN_DIR "/usr/local/lib/vithost/plugins"
#endif

/* The descriptor's header: the same layout for every ABI major, so any host
 * can read it and say which versions disagree. */
typedef struct desc_header {
    uint32_t magic;
    uint16_t abi_major, abi_minor;
    uint32_t struct_size;
} desc_header;

_Static_assert(offsetof(vh_plugin_descriptor, magic) == offsetof(desc_header, magic) &&
                   offsetof(vh_plugin_descriptor, abi_major) ==
                       offsetof(desc_header, abi_major) &&
                   offsetof(vh_plugin_descriptor, abi_minor) ==
                       offsetof(desc_header, abi_minor) &&
                   offsetof(vh_plugin_descriptor, struct_size) ==
                       offsetof(desc_header, struct_size),
               "the descriptor header's layout is fixed");
_Static_assert(sizeof(vh_role) == sizeof(int), "vh_role is read as an int");

/* The least an ABI 2 descriptor holds: every member before get_extension.
 * get_extension, and whatever later minors append, may be missing (an older
 * plugin) and then reads as NULL in the host's copy. */
#define VH_DESCRIPTOR_MIN_SIZE ((uint32_t)offsetof(vh_plugin_descriptor, get_extension))

/* ---- small helpers ---------------------------------------------------- */

/* A growing string; on allocation failure `failed` is set and appends stop. */
typedef struct strbuf {
    char *text;
    size_t len, cap;
    int failed;
} strbuf;

static void strbuf_append(strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *text = realloc(b->text, cap);
        if (!text) {
            b->failed = 1;
            return;
        }
        b->text = text;
        b->cap = cap;
    }
    memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = '\0';
}

static void strbuf_puts(strbuf *b, const char *s) { strbuf_append(b, s, strlen(s)); }

/* "a" + "/" + "b", malloc'd; NULL when out of memory. */
static char *path_join(const char *dir, const char *file) {
    size_t dl = strlen(dir), fl = strlen(file);
    int slash = dl > 0 && dir[dl - 1] == '/';
    char *p = malloc(dl + fl + 2);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (!slash) p[dl++] = '/';
    memcpy(p + dl, file, fl + 1);
    return p;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int ends_with(const char *s, const char *suffix) {
    size_t sl = strlen(s), xl = strlen(suffix);
    return sl >= xl && strcmp(s + sl - xl, suffix) == 0;
}

/* The size the dynamic symbol table gives the exported descriptor, or 0 when
 * it is not known. */
static size_t exported_symbol_size(const void *sym) {
    Dl_info info;
    void *extra = NULL;
    if (!dladdr1(sym, &info, &extra, RTLD_DL_SYMENT) || !extra || info.dli_saddr != sym)
        return 0;
    const ElfW(Sym) *entry = extra;
    return (size_t)entry->st_size;
}

static int name_is_valid(const char *name) {
    static const char allowed[] = "abcdefghijklmnopqrstuvwxyz0123456789_-";
    return name[0] != '\0' && name[strspn(name, allowed)] == '\0';
}

/* ---- loader_open ------------------------------------------------------ */

#if defined(__x86_64__)
#define VH_NATIVE_MACHINE EM_X86_64
#define VH_NATIVE_NAME "x86-64"
#elif defined(__aarch64__)
#define VH_NATIVE_MACHINE EM_AARCH64
#define VH_NATIVE_NAME "aarch64"
#elif defined(__powerpc64__)
#define VH_NATIVE_MACHINE EM_PPC64
#define VH_NATIVE_NAME "ppc64"
#elif defined(__riscv)
#define VH_NATIVE_MACHINE EM_RISCV
#define VH_NATIVE_NAME "riscv"
#endif

static const char *machine_name(unsigned m) {
    switch (m) {
    case EM_386: return "x86 (32-bit)";
    case EM_X86_64: return "x86-64";
    case EM_ARM: return "arm (32-bit)";
    case EM_AARCH64: return "aarch64";
    case EM_PPC64: return "ppc64";
    case EM_RISCV: return "riscv";
    case EM_S390: return "s390";
    default: return "another machine";
    }
}

/* The ELF identity of the file, read before dlopen: glibc reports a shared
 * object of another architecture as "No such file or directory", and a
 * text file as an "invalid ELF header"; say what the file is instead. */
static vh_status check_elf(const char *path, vh_diag *d) {
    unsigned char h[20];
    FILE *f = fopen(path, "rb");
    if (!f) return VH_STATUS_OK; /* dlopen says why */
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    if (n < sizeof h || memcmp(h, ELFMAG, SELFMAG) != 0)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s is not a shared object: not an ELF file (a plugin is a .so built "
                        "from C with the vithost SDK)",
                        path);
    int native_class = sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32;
    int native_data = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
    unsigned machine = h[EI_DATA] == ELFDATA2MSB ? (unsigned)(h[18] << 8 | h[19])
                                                 : (unsigned)(h[19] << 8 | h[18]);
    unsigned type = h[EI_DATA] == ELFDATA2MSB ? (unsigned)(h[16] << 8 | h[17])
                                              : (unsigned)(h[17] << 8 | h[16]);
    int wrong = h[EI_CLASS] != native_class || h[EI_DATA] != native_data;
#ifdef VH_NATIVE_MACHINE
    wrong = wrong || machine != VH_NATIVE_MACHINE;
    const char *native = VH_NATIVE_NAME;
#else
    const char *native = "this machine";
#endif
    if (wrong)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s was built for another architecture: %s, %d-bit, %s-endian (ELF "
                        "machine %u); this vithost runs on %s (rebuild the plugin for this "
                        "machine)",
                        path, machine_name(machine), h[EI_CLASS] == ELFCLASS64 ? 64 : 32,
                        h[EI_DATA] == ELFDATA2MSB ? "big" : "little", machine, native);
    if (type != ET_DYN)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s is an ELF file but not a shared object (ELF type %u; build the "
                        "plugin with -shared)",
                        path, type);
    return VH_STATUS_OK;
}

/* A plugin file, or its folder, that others may write can be replaced by
 * anyone on the machine with code that then runs as this user: warned (not
 * refused: shared scratch folders are common on clusters). A sticky folder
 * (/tmp) lets no one else replace the file. Returns 1 and the warning. */
static int writable_by_others(const char *path, const struct stat *file, char *why,
                              size_t len) {
    if (file->st_mode & S_IWOTH) {
        snprintf(why, len,
                 "plugin file %s is world-writable: anyone on this machine can replace its "
                 "code (chmod o-w it)",
                 path);
        return 1;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    struct stat ds;
    if (stat(dir, &ds) == 0 && (ds.st_mode & S_IWOTH) && !(ds.st_mode & S_ISVTX)) {
        snprintf(why, len,
                 "plugin folder %s is world-writable: anyone on this machine can replace %s "
                 "(chmod o-w the folder)",
                 dir, base_name(path));
        return 1;
    }
    return 0;
}

/* The fixed header: magic and versions. Read from the file before it is
 * loaded, and again from the loaded symbol. sym_size: the symbol's size, or
 * 0 when unknown. */
static vh_status check_header(const char *path, const desc_header *hp, size_t sym_size,
                              vh_diag *d) {
    if (sym_size != 0 && sym_size < sizeof(desc_header))
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s is not a vithost plugin: its symbol '%s' is %zu bytes, too "
                        "small even for a descriptor header (%zu bytes); define it with "
                        "VH_PLUGIN_DEFINE",
                        path, VH_PLUGIN_SYMBOL, sym_size, sizeof(desc_header));
    desc_header h = *hp;
    if (h.magic != VH_PLUGIN_MAGIC)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s is not a vithost plugin: its symbol '%s' does not start with "
                        "the plugin magic (0x%08x, expected 0x%08x); define it with "
                        "VH_PLUGIN_DEFINE",
                        path, VH_PLUGIN_SYMBOL, (unsigned)h.magic, (unsigned)VH_PLUGIN_MAGIC);
    if (h.abi_major != VH_ABI_MAJOR)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s was built for vithost plugin ABI %u.%u; this vithost speaks ABI "
                        "%d.%d (major versions must match: rebuild the plugin against this "
                        "SDK)",
                        path, (unsigned)h.abi_major, (unsigned)h.abi_minor, VH_ABI_MAJOR,
                        VH_ABI_MINOR);
    if (h.abi_minor > VH_ABI_MINOR)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s was built for vithost plugin ABI %u.%u, newer than this host's "
                        "%d.%d: update vithost (or rebuild the plugin against this SDK)",
                        path, (unsigned)h.abi_major, (unsigned)h.abi_minor, VH_ABI_MAJOR,
                        VH_ABI_MINOR);
    return VH_STATUS_OK;
}

/* The sizes the header claims: at least every ABI 2 member, and no more
 * than the exported symbol holds. */
static vh_status check_descriptor_size(const char *path, const desc_header *h, size_t sym_size,
                                       vh_diag *d) {
    if (h->struct_size < VH_DESCRIPTOR_MIN_SIZE)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s has a broken descriptor: struct_size is %u bytes, smaller than "
                        "the %u bytes every ABI %d descriptor has (define it with "
                        "VH_PLUGIN_DEFINE and rebuild)",
                        path, (unsigned)h->struct_size, (unsigned)VH_DESCRIPTOR_MIN_SIZE,
                        VH_ABI_MAJOR);
    if (sym_size != 0 && sym_size < h->struct_size)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s has a broken descriptor: its symbol '%s' is %zu bytes but "
                        "claims %u (define it with VH_PLUGIN_DEFINE and rebuild)",
                        path, VH_PLUGIN_SYMBOL, sym_size, (unsigned)h->struct_size);
    return VH_STATUS_OK;
}

/* The role, read as an int (the plugin may hold any value), and its
 * vtable: there, large enough for the role's required calls, and of the
 * size its own first member says. */
static vh_status check_role_vtable(const char *path, const vh_plugin_descriptor *desc,
                                   int *role_out, vh_diag *d) {
    int role;
    memcpy(&role, &desc->role, sizeof role);
    *role_out = role;
    if (role < 0 || role >= VH_HOST_ROLE_COUNT)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s declares an unknown role %d (this vithost knows roles 0 to %d: "
                        "model, precision, sharding, optim, data; rebuild the plugin "
                        "against this SDK)",
                        path, role, VH_HOST_ROLE_COUNT - 1);
    const char *role_name = vh_role_name((vh_role)role);
    if (!desc->vtable)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s declares a '%s' plugin without a vtable (pass the "
                        "vh_%s_vtable to VH_PLUGIN_DEFINE)",
                        path, role_name, role_name);
    const vh_role_vtable *vt = vtable_info((vh_role)role);
    if (desc->vtable_size < vt->required_size) {
        const vh_vtable_member *last = NULL;
        for (int i = 0; i < vt->count; i++)
            if (vt->members[i].required) last = &vt->members[i];
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s has a '%s' vtable of %u bytes, smaller than the %zu bytes that "
                        "hold the role's required calls (%s up to '%s' in ABI %d; rebuild "
                        "the plugin against this SDK)",
                        path, role_name, (unsigned)desc->vtable_size, vt->required_size,
                        vt->type_name, last ? last->name : "?", VH_ABI_MAJOR);
    }
    uint32_t vt_struct_size;
    memcpy(&vt_struct_size, desc->vtable, sizeof vt_struct_size);
    if (vt_struct_size != desc->vtable_size)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s has an inconsistent '%s' vtable: its struct_size says %u bytes "
                        "but the descriptor says %u (set the vtable's first member to "
                        "sizeof the vtable)",
                        path, role_name, (unsigned)vt_struct_size,
                        (unsigned)desc->vtable_size);
    return VH_STATUS_OK;
}

/* Name, version, description and a well-formed config schema. */
static vh_status check_identity(const char *path, const vh_plugin_descriptor *desc,
                                vh_diag *d) {
    if (!desc->name)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s declares no plugin name (give one in VH_PLUGIN_DEFINE)", path);
    if (!name_is_valid(desc->name))
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s declares the plugin name '%.64s', which is not allowed: a name "
                        "is one or more of a-z, 0-9, '_' and '-' (fix it in "
                        "VH_PLUGIN_DEFINE)",
                        path, desc->name);
    if (!desc->version)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s (plugin '%s') declares no version (give one such as \"0.1.0\" "
                        "in VH_PLUGIN_DEFINE)",
                        path, desc->name);
    if (!desc->description)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s (plugin '%s') declares no description (give one line in "
                        "VH_PLUGIN_DEFINE)",
                        path, desc->name);
    if (!desc->schema)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s (plugin '%s') has no config schema (a plugin without options "
                        "passes an array holding only the {NULL} end entry)",
                        path, desc->name);
    char owner[PATH_MAX + 128];
    snprintf(owner, sizeof owner, "plugin '%s' (%s)", desc->name, path);
    vh_status st = config_check_schema(desc->schema, owner, d);
    if (st != VH_STATUS_OK && d && !strstr(d->text, path)) diag_prefix(d, "%s: ", path);
    return st;
}

/* Every required call of the role is set, and the role is the one the
 * recipe's section needs (expected_role < 0: any). */
static vh_status check_calls(const char *path, const vh_plugin_descriptor *desc, int role,
                             int expected_role, vh_diag *d) {
    const char *role_name = vh_role_name((vh_role)role);
    const char *type_name = vtable_info((vh_role)role)->type_name;
    const vh_vtable_member *missing =
        vtable_missing_required((vh_role)role, desc->vtable, desc->vtable_size);
    if (missing && missing->alternative)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: %s plugin '%s' has neither '%s' nor '%s' (the %s role needs one; "
                        "set it in the plugin's %s)",
                        path, role_name, desc->name, missing->name, missing->alternative,
                        role_name, type_name);
    if (missing)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: %s plugin '%s' has no '%s' (a required call of the %s role; "
                        "set it in the plugin's %s)",
                        path, role_name, desc->name, missing->name, role_name, type_name);
    if (expected_role >= 0 && role != expected_role) {
        const char *want = vh_role_name((vh_role)expected_role);
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s is a '%s' plugin (name '%s'), but section '%s' needs a '%s' "
                        "plugin (`vithost plugins` lists the plugins of each role)",
                        path, role_name, desc->name, want, want);
    }
    return VH_STATUS_OK;
}

/* Checks the descriptor at `sym` (exported by `path`, `sym_size` bytes or 0
 * when unknown). Reads the header before anything else, then only the
 * members the plugin's struct_size covers: once the header says ABI 2.x
 * and a descriptor holding every member up to get_extension, those are
 * there. */
static vh_status check_descriptor(const char *path, const void *sym, size_t sym_size,
                                  int expected_role, vh_diag *d) {
    desc_header h;
    memcpy(&h, sym, sizeof h);
    vh_status st = check_header(path, &h, sym_size, d);
    if (st == VH_STATUS_OK) st = check_descriptor_size(path, &h, sym_size, d);
    if (st != VH_STATUS_OK) return st;
    const vh_plugin_descriptor *desc = sym;
    int role = -1;
    st = check_role_vtable(path, desc, &role, d);
    if (st == VH_STATUS_OK) st = check_identity(path, desc, d);
    if (st == VH_STATUS_OK) st = check_calls(path, desc, role, expected_role, d);
    return st;
}

/* What can be known of the file before any of its code runs: that it is
 * a regular file and a shared object for this machine, whether others can
 * write it (`warn`: said on stderr; scans put that in their report
 * instead), and the versions its descriptor header declares. */
static vh_status check_file(const char *path, int warn, vh_diag *d) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return diag_set(d, VH_STATUS_ERR_IO,
                            "plugin file %s does not exist (check the path, or give a "
                            "plugin name to search the plugin path)",
                            path);
        return diag_set(d, VH_STATUS_ERR_IO, "cannot access plugin file %s: %s", path,
                        strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return diag_set(d, VH_STATUS_ERR_IO,
                        "plugin file %s is not a regular file (give the path of a plugin's "
                        ".so file)",
                        path);
    vh_status est = check_elf(path, d);
    if (est != VH_STATUS_OK) return est;
    if (warn) {
        char why[PATH_MAX + 256];
        if (writable_by_others(path, &st, why, sizeof why))
            fprintf(stderr, "vithost: warning: %s\n", why);
    }
    /* The versions first, from the file: a plugin the host refuses never
     * runs a line of its code, not even a constructor. A file whose symbol
     * cannot be read this way is left for dlopen and dlsym to judge. */
    desc_header early;
    memset(&early, 0, sizeof early);
    size_t early_size = 0;
    if (elf_read_symbol(path, VH_PLUGIN_SYMBOL, &early, sizeof early, &early_size) &&
        early_size > 0)
        return check_header(path, &early, early_size, d);
    return VH_STATUS_OK;
}

/* dlopen, with dlerror's reason in the message. */
static vh_status load_file(const char *path, void **handle, vh_diag *d) {
    /* dlopen searches the library path for a name without '/': make a bare
     * file name relative to the current directory, as the user meant. */
    char *dl_path = strchr(path, '/') ? strdup(path) : path_join(".", path);
    if (!dl_path) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory opening %s", path);
    dlerror();
    *handle = dlopen(dl_path, RTLD_NOW | RTLD_LOCAL);
    vh_status st = VH_STATUS_OK;
    if (!*handle) {
        const char *err = dlerror();
        if (!err) err = "unknown dlopen error";
        /* dlerror usually starts with the file name; it is in the message already. */
        size_t pl = strlen(dl_path);
        if (strncmp(err, dl_path, pl) == 0 && strncmp(err + pl, ": ", 2) == 0) err += pl + 2;
        st = diag_set(d, VH_STATUS_ERR_FORMAT,
                      "%s is not a loadable shared object: %s (it must be a vithost plugin "
                      "built for this machine, with the libraries it needs installed)",
                      path, err);
    }
    free(dl_path);
    return st;
}

/* The host's copies: the descriptor as this host's struct (members past
 * the plugin's struct_size zero), pointing at the upgraded vtable. */
static vh_status keep_copies(vh_plugin *out, const char *path, void *handle, const void *sym,
                             vh_diag *d) {
    const vh_plugin_descriptor *plugin_desc = sym;
    vh_plugin_descriptor *desc = calloc(1, sizeof *desc);
    void *vtable = NULL;
    if (desc) {
        memcpy(desc, sym, plugin_desc->struct_size < sizeof *desc ? plugin_desc->struct_size
                                                                  : sizeof *desc);
        vtable = vtable_upgrade(desc->role, plugin_desc->vtable, plugin_desc->vtable_size);
    }
    out->path = strdup(path);
    if (!desc || !vtable || !out->path) {
        free(desc);
        free(vtable);
        free(out->path);
        out->path = NULL;
        return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory opening %s", path);
    }
    out->plugin_struct_size = plugin_desc->struct_size;
    out->plugin_vtable_size = plugin_desc->vtable_size;
    out->plugin_vtable = plugin_desc->vtable;
    desc->struct_size = (uint32_t)sizeof *desc;
    desc->vtable = vtable;
    desc->vtable_size = (uint32_t)vtable_info(desc->role)->size;
    out->handle = handle;
    out->desc = desc;
    return VH_STATUS_OK;
}

/* loader_open; `warn`: see check_file. */
static vh_status open_plugin(vh_plugin *out, const char *path, int expected_role, int warn,
                             vh_diag *d) {
    if (!out) return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "loader_open: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path || !*path)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "loader_open: no plugin path given");
    if (expected_role >= VH_HOST_ROLE_COUNT)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG,
                        "loader_open: expected role %d is not a role", expected_role);
    void *handle = NULL;
    vh_status st = check_file(path, warn, d);
    if (st == VH_STATUS_OK) st = load_file(path, &handle, d);
    if (st != VH_STATUS_OK) return st;
    dlerror();
    const void *sym = dlsym(handle, VH_PLUGIN_SYMBOL);
    if (!sym)
        st = diag_set(d, VH_STATUS_ERR_FORMAT,
                      "%s is not a vithost plugin: it does not export the symbol '%s' "
                      "(define it with VH_PLUGIN_DEFINE)",
                      path, VH_PLUGIN_SYMBOL);
    if (st == VH_STATUS_OK)
        st = check_descriptor(path, sym, exported_symbol_size(sym), expected_role, d);
    if (st == VH_STATUS_OK) st = keep_copies(out, path, handle, sym, d);
    if (st != VH_STATUS_OK) dlclose(handle);
    return st;
}

vh_status loader_open(vh_plugin *out, const char *path, int expected_role, vh_diag *d) {
    return open_plugin(out, path, expected_role, 1, d);
}

void loader_close(vh_plugin *p) {
    if (!p) return;
    if (p->desc) free((void *)p->desc->vtable);
    free((void *)p->desc);
    if (p->handle) dlclose(p->handle);
    free(p->path);
    memset(p, 0, sizeof *p);
}

int loader_plugin_has(const vh_plugin *p, size_t offset) {
    if (!p || !p->plugin_vtable || offset + sizeof(void *) > p->plugin_vtable_size) return 0;
    void *member;
    memcpy(&member, (const char *)p->plugin_vtable + offset, sizeof member);
    return member != NULL;
}

/* ---- the search path --------------------------------------------------- */

/* Appends dir unless an identical directory is already there. A directory that
 * exists is kept as its real path; one that does not, as written. */
static vh_status path_add(vh_plugin_path *p, int *cap, const char *dir, vh_diag *d) {
    char *entry = realpath(dir, NULL);
    if (!entry) {
        entry = strdup(dir);
        if (!entry) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
        size_t len = strlen(entry);
        while (len > 1 && entry[len - 1] == '/') entry[--len] = '\0';
    }
    for (int i = 0; i < p->count; i++) {
        if (strcmp(p->dirs[i], entry) == 0) {
            free(entry);
            return VH_STATUS_OK;
        }
    }
    if (p->count == *cap) {
        int new_cap = *cap ? 2 * *cap : 8;
        char **dirs = realloc(p->dirs, (size_t)new_cap * sizeof *dirs);
        if (!dirs) {
            free(entry);
            return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
        }
        p->dirs = dirs;
        *cap = new_cap;
    }
    p->dirs[p->count++] = entry;
    return VH_STATUS_OK;
}

vh_status plugin_path_init(vh_plugin_path *out, const char *exe_dir, vh_diag *d) {
    if (!out) return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "plugin_path_init: out is NULL");
    out->dirs = NULL;
    out->count = 0;
    int cap = 0;
    vh_status st = VH_STATUS_OK;

    const char *env = getenv("VITHOST_PLUGIN_PATH");
    if (env) {
        char *copy = strdup(env);
        if (!copy) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
        char *rest = copy;
        for (char *dir = rest; st == VH_STATUS_OK && dir; dir = rest) {
            rest = strchr(dir, ':');
            if (rest) *rest++ = '\0';
            if (*dir) st = path_add(out, &cap, dir, d);
        }
        free(copy);
    }

    char self[PATH_MAX];
    if (st == VH_STATUS_OK && !exe_dir) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            char *slash = strrchr(self, '/');
            if (slash == self) slash[1] = '\0';
            else if (slash) *slash = '\0';
            exe_dir = slash ? self : NULL;
        }
    }
    /* Without an executable's directory (no /proc), only the environment and
     * the install prefix are searched. */
    if (exe_dir) {
        static const char *const next_to_exe[] = {"plugins", VH_PLUGIN_DIR_FROM_EXE};
        for (size_t i = 0; st == VH_STATUS_OK && i < 2; i++) {
            char *dir = path_join(exe_dir, next_to_exe[i]);
            if (!dir) {
                st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
                break;
            }
            st = path_add(out, &cap, dir, d);
            free(dir);
        }
    }
    if (st == VH_STATUS_OK) st = path_add(out, &cap, VH_INSTALL_PLUGIN_DIR, d);
    if (st != VH_STATUS_OK) plugin_path_free(out);
    return st;
}

void plugin_path_free(vh_plugin_path *p) {
    if (!p) return;
    for (int i = 0; i < p->count; i++) free(p->dirs[i]);
    free(p->dirs);
    p->dirs = NULL;
    p->count = 0;
}

/* ---- scanning directories ---------------------------------------------- */

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files named *.so in dir, sorted. A missing directory has none;
 * one that cannot be read sets *open_errno (and has none). */
static vh_status list_so_files(const char *dir, char ***files, int *count, int *open_errno,
                               vh_diag *d) {
    *files = NULL;
    *count = 0;
    *open_errno = 0;
    DIR *dp = opendir(dir);
    if (!dp) {
        if (errno != ENOENT && errno != ENOTDIR) *open_errno = errno;
        return VH_STATUS_OK;
    }
    int cap = 0;
    vh_status st = VH_STATUS_OK;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (!ends_with(e->d_name, ".so") || e->d_name[0] == '.') continue;
        char *full = path_join(dir, e->d_name);
        if (!full) {
            st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory scanning %s", dir);
            break;
        }
        struct stat sb;
        int regular = stat(full, &sb) == 0 && S_ISREG(sb.st_mode);
        free(full);
        if (!regular) continue;
        if (*count == cap) {
            int new_cap = cap ? 2 * cap : 16;
            char **grown = realloc(*files, (size_t)new_cap * sizeof *grown);
            if (!grown) {
                st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory scanning %s", dir);
                break;
            }
            *files = grown;
            cap = new_cap;
        }
        (*files)[*count] = strdup(e->d_name);
        if (!(*files)[*count]) {
            st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory scanning %s", dir);
            break;
        }
        (*count)++;
    }
    closedir(dp);
    if (st != VH_STATUS_OK) {
        for (int i = 0; i < *count; i++) free((*files)[i]);
        free(*files);
        *files = NULL;
        *count = 0;
        return st;
    }
    if (*count > 1) qsort(*files, (size_t)*count, sizeof **files, compare_names);
    return VH_STATUS_OK;
}

static void info_free_fields(vh_plugin_info *info) {
    free(info->path);
    free(info->name);
    free(info->version);
    free(info->description);
    free(info->shadowed_by);
    memset(info, 0, sizeof *info);
}

void plugin_infos_free(vh_plugin_info *infos, int count) {
    if (!infos) return;
    for (int i = 0; i < count; i++) info_free_fields(&infos[i]);
    free(infos);
}

/* The infos found so far, across directories. */
typedef struct info_list {
    vh_plugin_info *items;
    int count, cap;
} info_list;

/* What a directory scan reports besides the plugins it finds. */
typedef struct scan_report {
    strbuf *problems; /* one line per file that is not a valid plugin; may be NULL */
    const char *want; /* loader_resolve: the name looked for, else NULL */
    int want_failed;  /* a file <want>.so failed; its message is in want_diag */
    vh_status want_status;
    vh_diag want_diag;
} scan_report;

static void report_problem(scan_report *r, const char *text) {
    if (!r->problems) return;
    size_t start = r->problems->len;
    strbuf_puts(r->problems, text);
    strbuf_puts(r->problems, "\n");
    if (r->problems->failed) return;
    /* One line per file, whatever the message holds. */
    for (size_t i = start; i + 1 < r->problems->len; i++)
        if (r->problems->text[i] == '\n') r->problems->text[i] = ' ';
}

/* Opens every *.so of dir, appends an info for each valid plugin to list (in
 * file order) and reports the others. */
static vh_status scan_dir(const char *dir, info_list *list, scan_report *r, vh_diag *d) {
    char **files;
    int count, open_errno;
    vh_status st = list_so_files(dir, &files, &count, &open_errno, d);
    if (st != VH_STATUS_OK) return st;
    if (open_errno) {
        char line[PATH_MAX + 128];
        snprintf(line, sizeof line, "cannot read plugin directory %s: %s", dir,
                 strerror(open_errno));
        report_problem(r, line);
    }
    for (int i = 0; i < count && st == VH_STATUS_OK; i++) {
        char *full = path_join(dir, files[i]);
        if (!full) {
            st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory scanning %s", dir);
            break;
        }
        vh_plugin p;
        vh_diag local;
        local.text[0] = '\0';
        vh_status open_st = open_plugin(&p, full, -1, 0, &local);
        struct stat fs;
        char why[PATH_MAX + 256];
        if (open_st == VH_STATUS_OK && !r->want && stat(full, &fs) == 0 &&
            writable_by_others(full, &fs, why, sizeof why))
            report_problem(r, why);
        if (open_st == VH_STATUS_ERR_NOMEM) {
            st = diag_set(d, open_st, "%s", local.text);
        } else if (open_st != VH_STATUS_OK) {
            report_problem(r, local.text);
            if (r->want && !r->want_failed) {
                size_t wl = strlen(r->want);
                if (strncmp(files[i], r->want, wl) == 0 && strcmp(files[i] + wl, ".so") == 0) {
                    r->want_failed = 1;
                    r->want_status = open_st;
                    r->want_diag = local;
                }
            }
        } else {
            if (list->count == list->cap) {
                int new_cap = list->cap ? 2 * list->cap : 16;
                vh_plugin_info *items = realloc(list->items, (size_t)new_cap * sizeof *items);
                if (!items) {
                    loader_close(&p);
                    free(full);
                    st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory scanning %s", dir);
                    break;
                }
                list->items = items;
                list->cap = new_cap;
            }
            vh_plugin_info *info = &list->items[list->count++];
            memset(info, 0, sizeof *info);
            info->path = full;
            full = NULL;
            info->name = strdup(p.desc->name);
            info->role = p.desc->role;
            info->version = strdup(p.desc->version);
            info->description = strdup(p.desc->description);
            if (!info->name || !info->version || !info->description)
                st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory scanning %s", dir);
            loader_close(&p);
        }
        free(full);
    }
    for (int i = 0; i < count; i++) free(files[i]);
    free(files);
    return st;
}

/* Two plugins of one directory (items first..last-1) with one name, or with
 * the name `only` when it is not NULL: an error naming both files. */
static vh_status check_duplicates(const info_list *list, int first, const char *dir,
                                  const char *only, vh_diag *d) {
    for (int i = first; i < list->count; i++) {
        const vh_plugin_info *a = &list->items[i];
        if (only && strcmp(a->name, only) != 0) continue;
        for (int j = i + 1; j < list->count; j++) {
            const vh_plugin_info *b = &list->items[j];
            if (strcmp(a->name, b->name) == 0)
                return diag_set(d, VH_STATUS_ERR_CONFIG,
                                "two plugins named '%s' in %s: %s and %s; remove one",
                                a->name, dir, base_name(a->path), base_name(b->path));
        }
    }
    return VH_STATUS_OK;
}

/* Whether dirs[i] names the same directory as an earlier entry (a path built
 * by hand may list one twice). */
static int seen_before(const vh_plugin_path *path, int i) {
    char *real_i = realpath(path->dirs[i], NULL);
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) {
        if (strcmp(path->dirs[j], path->dirs[i]) == 0) {
            seen = 1;
        } else if (real_i) {
            char *real_j = realpath(path->dirs[j], NULL);
            seen = real_j && strcmp(real_i, real_j) == 0;
            free(real_j);
        }
    }
    free(real_i);
    return seen;
}

vh_status plugin_scan(const vh_plugin_path *path, vh_plugin_info **out, int *count,
                      char **problems, vh_diag *d) {
    if (out) *out = NULL;
    if (count) *count = 0;
    if (problems) *problems = NULL;
    if (!path || !out || !count)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "plugin_scan: missing argument");

    info_list list = {0};
    strbuf buf = {0};
    scan_report report = {.problems = &buf};
    vh_status st = VH_STATUS_OK;
    for (int i = 0; i < path->count && st == VH_STATUS_OK; i++) {
        if (seen_before(path, i)) continue;
        int first = list.count;
        st = scan_dir(path->dirs[i], &list, &report, d);
        if (st == VH_STATUS_OK) st = check_duplicates(&list, first, path->dirs[i], NULL, d);
        /* A name found in an earlier directory shadows this one. */
        for (int k = first; k < list.count && st == VH_STATUS_OK; k++) {
            for (int j = 0; j < first; j++) {
                if (list.items[j].shadowed_by || strcmp(list.items[j].name, list.items[k].name))
                    continue;
                list.items[k].shadowed_by = strdup(list.items[j].path);
                if (!list.items[k].shadowed_by)
                    st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
                break;
            }
        }
    }
    if (st == VH_STATUS_OK && buf.failed)
        st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory listing plugin problems");
    if (st != VH_STATUS_OK) {
        plugin_infos_free(list.items, list.count);
        free(buf.text);
        return st;
    }
    *out = list.items;
    *count = list.count;
    if (problems) *problems = buf.text;
    else free(buf.text);
    return VH_STATUS_OK;
}

/* ---- resolving a recipe's plugin value ------------------------------- */

/* The not-found message: the search path, a near name of the right role and
 * how to list what there is. */
static vh_status not_found(const vh_plugin_path *path, const info_list *list,
                           const char *name, int role, vh_diag *d) {
    strbuf dirs = {0};
    for (int i = 0; i < path->count; i++) {
        if (i) strbuf_puts(&dirs, ":");
        strbuf_puts(&dirs, path->dirs[i]);
    }
    /* A near name of the role asked for first; else one of another role,
     * saying which (a typo may also be in the section). */
    const char **names = calloc((size_t)list->count + 1, sizeof *names);
    char hint[256] = "";
    for (int any_role = 0; names && any_role < 2 && !hint[0]; any_role++) {
        int n = 0;
        for (int i = 0; i < list->count; i++)
            if (any_role || (int)list->items[i].role == role) names[n++] = list->items[i].name;
        names[n] = NULL;
        const char *suggestion = vh_suggest(name, names);
        if (!suggestion) continue;
        if (!any_role) {
            snprintf(hint, sizeof hint, "; did you mean '%s'?", suggestion);
        } else {
            for (int i = 0; i < list->count; i++) {
                if (list->items[i].name != suggestion) continue;
                snprintf(hint, sizeof hint, "; did you mean '%s' (a '%s' plugin)?", suggestion,
                         vh_role_name(list->items[i].role));
                break;
            }
        }
    }
    diag_set(d, VH_STATUS_ERR_CONFIG,
             "no plugin named '%s' on the search path (%s)%s (`vithost plugins` lists the "
             "plugins it finds; VITHOST_PLUGIN_PATH adds directories, and a value ending in "
             ".so is taken as a file)",
             name, dirs.text && !dirs.failed ? dirs.text : "no directories", hint);
    free(names);
    free(dirs.text);
    return VH_STATUS_ERR_CONFIG;
}

vh_status loader_resolve(vh_plugin *out, const vh_plugin_path *path,
                         const char *name_or_path, int role, vh_diag *d) {
    if (out) memset(out, 0, sizeof *out);
    if (!out || !path || !name_or_path)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "loader_resolve: missing argument");
    if (role < -1 || role >= VH_HOST_ROLE_COUNT)
        return diag_set(d, VH_STATUS_ERR_INVALID_ARG, "loader_resolve: role %d is not a role",
                        role);
    if (!*name_or_path)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "empty plugin name%s%s (give a plugin name or the path of a .so file)",
                        role >= 0 ? " for section " : "",
                        role >= 0 ? vh_role_name((vh_role)role) : "");
    if (ends_with(name_or_path, ".so")) return loader_open(out, name_or_path, role, d);
    /* Not a file (those end in .so): a name, searched only on the path, so
     * `../../x` cannot reach a file outside it. */
    if (!name_is_valid(name_or_path))
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "'%s' is not a plugin name (names are lowercase letters, digits, '_' "
                        "and '-', found on the plugin path); a plugin file is given by a path "
                        "ending in .so, e.g. ./%s.so",
                        name_or_path, base_name(name_or_path));

    info_list list = {0};
    scan_report report = {.want = name_or_path};
    char *found = NULL;
    vh_status st = VH_STATUS_OK;
    /* A file <name>.so that cannot be used ends the search: taking a file of
     * that name further down the path would hide the broken one silently. */
    for (int i = 0; i < path->count && st == VH_STATUS_OK && !found && !report.want_failed;
         i++) {
        if (seen_before(path, i)) continue;
        int first = list.count;
        st = scan_dir(path->dirs[i], &list, &report, d);
        if (st == VH_STATUS_OK)
            st = check_duplicates(&list, first, path->dirs[i], name_or_path, d);
        for (int k = first; k < list.count && st == VH_STATUS_OK; k++) {
            if (strcmp(list.items[k].name, name_or_path) == 0) {
                found = list.items[k].path;
                list.items[k].path = NULL;
                break;
            }
        }
    }
    if (st == VH_STATUS_OK) {
        if (found) st = loader_open(out, found, role, d);
        else if (report.want_failed)
            st = diag_set(d, report.want_status,
                          "plugin '%s': %s (the first file of that name on the search path "
                          "is unusable; fix or remove it rather than have a later one taken)",
                          name_or_path, report.want_diag.text);
        else st = not_found(path, &list, name_or_path, role, d);
    }
    free(found);
    plugin_infos_free(list.items, list.count);
    return st;
}
