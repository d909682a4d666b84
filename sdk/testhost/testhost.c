/* testhost.c - a host for a plugin's unit tests: loading, the vh_host table,
 * the log and the failure message (vh_testhost.h). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vithost/vh_runtime.h>

#include "testhost_internal.h"

static vh_testhost *th_of(vh_host *host) { return (vh_testhost *)host; }

vh_status th_fail(vh_testhost *th, vh_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(th->error, sizeof th->error, fmt, ap);
    va_end(ap);
    return st;
}

/* ---- the vh_host table ------------------------------------------------------ */

static void log_append(vh_testhost *th, const char *line) {
    size_t n = strlen(line);
    if (th->log_len + n + 1 > th->log_cap) {
        size_t cap = th->log_cap ? th->log_cap : 1024;
        while (cap < th->log_len + n + 1) cap *= 2;
        char *p = realloc(th->log, cap);
        if (!p) return; /* the line is lost, not the test */
        th->log = p;
        th->log_cap = cap;
    }
    memcpy(th->log + th->log_len, line, n + 1);
    th->log_len += n;
}

static void host_log(vh_host *host, vh_log_level level, const char *fmt, ...) {
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char msg[1024], line[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *name = (unsigned)level < 4u ? names[level] : "?";
    snprintf(line, sizeof line, "%s: %s\n", name, msg);
    log_append(th_of(host), line);
}

static vh_status host_fail(vh_host *host, vh_status status, const char *fmt, ...) {
    vh_testhost *th = th_of(host);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(th->error, sizeof th->error, fmt, ap);
    va_end(ap);
    return status;
}

static vh_status host_config_fail(vh_host *host, const char *key, const char *fmt, ...) {
    vh_testhost *th = th_of(host);
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const th_value *v = th_config_find(th, key);
    const char *role = vh_role_name((vh_role)th->desc->role);
    if (v && v->has_value)
        snprintf(th->error, sizeof th->error, "%s.%s (%s %s): %s", role, key,
                 v->source == VH_CONFIG_SOURCE_SET ? "set to" : "default", v->text, msg);
    else
        snprintf(th->error, sizeof th->error, "%s.%s: %s", role, key, msg);
    return VH_STATUS_ERR_CONFIG;
}

/* A getter's key must be declared with the right type: else a plugin bug. */
static vh_status typed(vh_testhost *th, const char *key, vh_config_type want,
                       const th_value **out) {
    const th_value *v = th_config_find(th, key);
    if (!v)
        return th_fail(th, VH_STATUS_ERR_INTERNAL,
                       "plugin asked for config key '%s', which its schema does not declare", key);
    int32_t t = v->key->type;
    int ok = t == (int32_t)want || (want == VH_CONFIG_TYPE_STRING &&
                                    (t == VH_CONFIG_TYPE_ENUM || t == VH_CONFIG_TYPE_PATH));
    if (!ok)
        return th_fail(th, VH_STATUS_ERR_INTERNAL,
                       "plugin read config key '%s' as type %d, but its schema says %d", key,
                       (int)want, (int)t);
    if (!v->has_value)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG,
                       "config key '%s' is optional and not set (check config_has first)", key);
    *out = v;
    return VH_STATUS_OK;
}

static int host_config_has(vh_host *host, const char *key) {
    const th_value *v = th_config_find(th_of(host), key);
    return v && v->has_value;
}

static vh_status host_config_int(vh_host *host, const char *key, int64_t *out) {
    const th_value *v = NULL;
    vh_status st = typed(th_of(host), key, VH_CONFIG_TYPE_INT, &v);
    if (st == VH_STATUS_OK) *out = v->i;
    return st;
}

static vh_status host_config_float(vh_host *host, const char *key, double *out) {
    const th_value *v = NULL;
    vh_status st = typed(th_of(host), key, VH_CONFIG_TYPE_FLOAT, &v);
    if (st == VH_STATUS_OK) *out = v->f;
    return st;
}

static vh_status host_config_bool(vh_host *host, const char *key, int *out) {
    const th_value *v = NULL;
    vh_status st = typed(th_of(host), key, VH_CONFIG_TYPE_BOOL, &v);
    if (st == VH_STATUS_OK) *out = v->b;
    return st;
}

static vh_status host_config_string(vh_host *host, const char *key, const char **out) {
    const th_value *v = NULL;
    vh_status st = typed(th_of(host), key, VH_CONFIG_TYPE_STRING, &v);
    if (st == VH_STATUS_OK) *out = v->text;
    return st;
}

static vh_status host_config_origin(vh_host *host, const char *key, vh_config_origin *out) {
    const th_value *v = th_config_find(th_of(host), key);
    if (!v)
        return th_fail(th_of(host), VH_STATUS_ERR_INTERNAL,
                       "plugin asked for the origin of undeclared key '%s'", key);
    memset(out, 0, sizeof *out);
    out->source = v->source;
    return VH_STATUS_OK;
}

static void *host_alloc(vh_host *host, size_t bytes) {
    (void)host;
    if (bytes > SIZE_MAX - 63u) return NULL;
    size_t rounded = (bytes + 63u) & ~(size_t)63u; /* aligned_alloc's rule */
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void host_free(vh_host *host, void *ptr) {
    (void)host;
    free(ptr);
}

static const vh_device_ops *host_device(vh_host *host) {
    (void)host;
    return vh_cpu_device_ops();
}

static vh_comm *host_comm(vh_host *host) { return &th_of(host)->comm; }

static uint64_t host_seed(vh_host *host) { return th_of(host)->seed; }

static const void *host_get_extension(vh_host *host, const char *name) {
    (void)host, (void)name;
    return NULL;
}

const vh_host_api th_host_api = {
    .struct_size = sizeof(vh_host_api),
    .abi_major = VH_ABI_MAJOR,
    .abi_minor = VH_ABI_MINOR,
    .log = host_log,
    .fail = host_fail,
    .config_fail = host_config_fail,
    .config_has = host_config_has,
    .config_int = host_config_int,
    .config_float = host_config_float,
    .config_bool = host_config_bool,
    .config_string = host_config_string,
    .config_origin = host_config_origin,
    .alloc = host_alloc,
    .free = host_free,
    .device = host_device,
    .comm = host_comm,
    .seed = host_seed,
    .get_extension = host_get_extension,
};

/* ---- opening and closing ----------------------------------------------------- */

/* The descriptor's header and members, as the loader checks them. */
static int descriptor_ok(const vh_plugin_descriptor *d, char *err, size_t err_len) {
    const char *why = NULL;
    if (!d) why = "no descriptor";
    else if (d->magic != VH_PLUGIN_MAGIC) why = "bad magic: not a vithost plugin";
    else if (d->abi_major != VH_ABI_MAJOR) why = "built for another ABI major";
    else if (d->abi_minor > VH_ABI_MINOR) why = "built for a newer ABI minor than this SDK";
    else if (d->struct_size < offsetof(vh_plugin_descriptor, get_extension))
        why = "descriptor too small";
    else if (d->role < VH_ROLE_MODEL || d->role > VH_ROLE_DATA) why = "unknown role";
    else if (!d->name || !d->schema || !d->vtable || d->vtable_size < sizeof(uint32_t))
        why = "a NULL name, schema or vtable";
    if (why) snprintf(err, err_len, "vh_testhost: %s", why);
    return why == NULL;
}

vh_status vh_testhost_open_descriptor(const vh_plugin_descriptor *desc, vh_testhost **out,
                                      char *err, size_t err_len) {
    *out = NULL;
    if (!descriptor_ok(desc, err, err_len)) return VH_STATUS_ERR_INVALID_ARG;
    vh_testhost *th = calloc(1, sizeof *th);
    if (!th) {
        snprintf(err, err_len, "vh_testhost: out of memory");
        return VH_STATUS_ERR_NOMEM;
    }
    th->pub.api = &th_host_api;
    th->desc = desc;
    th->item_size = (uint32_t)sizeof(vh_param_slice);
    th->policy.struct_size = sizeof th->policy;
    th->policy.master_weights = 1; /* fp32: every dtype is f32 (0) */
    vh_comm_self_init(&th->comm);
    vh_status st = th_config_init(th);
    if (st != VH_STATUS_OK) {
        snprintf(err, err_len, "%s: %s", desc->name, th->error);
        vh_testhost_close(th);
        return st;
    }
    *out = th;
    return VH_STATUS_OK;
}

/* `plugin` as a file, or <plugin>.so in a folder of $VITHOST_PLUGIN_PATH. */
static void resolve(const char *plugin, char *path, size_t len) {
    size_t n = strlen(plugin);
    const char *env = getenv("VITHOST_PLUGIN_PATH");
    snprintf(path, len, "%s", plugin);
    if (strchr(plugin, '/') || (n > 3 && strcmp(plugin + n - 3, ".so") == 0) || !env) return;
    for (const char *p = env; *p;) {
        size_t d = strcspn(p, ":");
        snprintf(path, len, "%.*s/%s.so", (int)d, p, plugin);
        if (d > 0 && access(path, R_OK) == 0) return;
        p += d + (p[d] == ':');
    }
    snprintf(path, len, "%s", plugin);
}

vh_status vh_testhost_open(const char *plugin, vh_testhost **out, char *err, size_t err_len) {
    *out = NULL;
    char path[4096];
    resolve(plugin, path, sizeof path);
    /* dlopen searches the library path for a bare name: "./" keeps it a file. */
    char dl_path[4096 + 2];
    snprintf(dl_path, sizeof dl_path, "%s%s", strchr(path, '/') ? "" : "./", path);
    void *dl = dlopen(dl_path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        snprintf(err, err_len, "vh_testhost: cannot load %s: %s", path, why ? why : "?");
        return VH_STATUS_ERR_IO;
    }
    const vh_plugin_descriptor *desc = dlsym(dl, VH_PLUGIN_SYMBOL);
    if (!desc) {
        snprintf(err, err_len, "vh_testhost: %s exports no '%s'", path, VH_PLUGIN_SYMBOL);
        dlclose(dl);
        return VH_STATUS_ERR_FORMAT;
    }
    vh_status st = vh_testhost_open_descriptor(desc, out, err, err_len);
    if (st != VH_STATUS_OK) {
        dlclose(dl);
        return st;
    }
    (*out)->dl = dl;
    return VH_STATUS_OK;
}

void vh_testhost_close(vh_testhost *th) {
    if (!th) return;
    vh_testhost_destroy(th);
    th_optim_free(th);
    th_config_free(th);
    free(th->log);
    if (th->dl) dlclose(th->dl);
    free(th);
}

const vh_plugin_descriptor *vh_testhost_descriptor(const vh_testhost *th) { return th->desc; }
vh_host *vh_testhost_host(vh_testhost *th) { return &th->pub; }
void *vh_testhost_self(const vh_testhost *th) { return th->self; }
const char *vh_testhost_error(const vh_testhost *th) { return th->error; }
const char *vh_testhost_log(const vh_testhost *th) { return th->log ? th->log : ""; }
void vh_testhost_set_seed(vh_testhost *th, uint64_t seed) { th->seed = seed; }

void vh_testhost_log_clear(vh_testhost *th) {
    th->log_len = 0;
    if (th->log) th->log[0] = '\0';
}
