/* host_api.c - the services the host hands each plugin instance. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static vh_host_impl *impl_of(vh_host *host) { return (vh_host_impl *)host; }

static const char *plugin_name(const vh_host_impl *h) {
    const vh_plugin *p = &h->run->plugins[h->role];
    return p->desc ? p->desc->name : "?";
}

static void host_log(vh_host *host, vh_log_level level, const char *fmt, ...) {
    static const char *const level_names[] = {"error", "warning", "info", "debug"};
    vh_host_impl *h = impl_of(host);
    if (level > VH_LOG_LEVEL_INFO) return; /* debug is for a debugger, not the log */
    /* Of many ranks, rank 0 tells what every rank would; warnings and
     * errors come from any rank, named. */
    const vh_comm *c = &h->run->comm;
    if (c->world_size > 1 && c->rank != 0 && level == VH_LOG_LEVEL_INFO) return;
    char msg[1024], who[48] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->world_size > 1 && level < VH_LOG_LEVEL_INFO)
        snprintf(who, sizeof who, "rank %d: ", (int)c->rank);
    fprintf(stderr, "vithost: %s%s %s: %s: %s\n", who, vh_role_name(h->role), plugin_name(h),
            level_names[level], msg);
}

static vh_status host_fail(vh_host *host, vh_status status, const char *fmt, ...) {
    vh_host_impl *h = impl_of(host);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->error, sizeof h->error, fmt, ap);
    va_end(ap);
    return status;
}

static const vh_config_entry *find_entry(vh_host_impl *h, const char *key) {
    return h->config ? config_find(h->config, key) : NULL;
}

static vh_status host_config_fail(vh_host *host, const char *key, const char *fmt, ...) {
    vh_host_impl *h = impl_of(host);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    const char *section = vh_role_name(h->role);
    const vh_config_entry *e = find_entry(h, key);
    const vh_recipe_section *s = recipe_find_section(&h->run->recipe, section);
    const vh_recipe_value *v = s ? recipe_find_value(s, key) : NULL;
    if (e && v && e->origin.source != VH_CONFIG_SOURCE_DEFAULT) {
        vh_diag d;
        recipe_diag_value(&h->run->recipe, s, v, 0, &d, VH_STATUS_ERR_CONFIG, "%s.%s: %s",
                          section, key, msg);
        memcpy(h->error, d.text, sizeof h->error);
    } else if (e) {
        snprintf(h->error, sizeof h->error, "%s: %s.%s (default %s): %s", h->run->recipe.file,
                 section, key, e->text ? e->text : "unset", msg);
    } else {
        snprintf(h->error, sizeof h->error, "%s.%s: %s", section, key, msg);
    }
    return VH_STATUS_ERR_CONFIG;
}

/* A getter's key must be in the plugin's schema with the right type: a
 * mismatch is a plugin bug, reported as such. */
static vh_status typed_entry(vh_host_impl *h, const char *key, vh_config_type want,
                             const vh_config_entry **out) {
    const vh_config_entry *e = find_entry(h, key);
    if (!e)
        return host_fail(&h->pub, VH_STATUS_ERR_INTERNAL,
                         "plugin asked for config key '%s', which its schema does not declare",
                         key);
    int ok = e->key->type == (int32_t)want ||
             (want == VH_CONFIG_TYPE_STRING && (e->key->type == VH_CONFIG_TYPE_ENUM ||
                                                e->key->type == VH_CONFIG_TYPE_PATH));
    if (!ok)
        return host_fail(&h->pub, VH_STATUS_ERR_INTERNAL,
                         "plugin read config key '%s' as %s, but its schema says %s", key,
                         config_type_name(want), config_type_name(e->key->type));
    if (!e->has_value)
        return host_fail(&h->pub, VH_STATUS_ERR_INVALID_ARG,
                         "config key '%s' is optional and not set (check config_has first)",
                         key);
    *out = e;
    return VH_STATUS_OK;
}

static int host_config_has(vh_host *host, const char *key) {
    const vh_config_entry *e = find_entry(impl_of(host), key);
    return e && e->has_value;
}

static vh_status host_config_int(vh_host *host, const char *key, int64_t *out) {
    const vh_config_entry *e = NULL;
    vh_status s = typed_entry(impl_of(host), key, VH_CONFIG_TYPE_INT, &e);
    if (s == VH_STATUS_OK) *out = e->as.i;
    return s;
}

static vh_status host_config_float(vh_host *host, const char *key, double *out) {
    const vh_config_entry *e = NULL;
    vh_status s = typed_entry(impl_of(host), key, VH_CONFIG_TYPE_FLOAT, &e);
    if (s == VH_STATUS_OK) *out = e->as.f;
    return s;
}

static vh_status host_config_bool(vh_host *host, const char *key, int *out) {
    const vh_config_entry *e = NULL;
    vh_status s = typed_entry(impl_of(host), key, VH_CONFIG_TYPE_BOOL, &e);
    if (s == VH_STATUS_OK) *out = e->as.b;
    return s;
}

static vh_status host_config_string(vh_host *host, const char *key, const char **out) {
    const vh_config_entry *e = NULL;
    vh_status s = typed_entry(impl_of(host), key, VH_CONFIG_TYPE_STRING, &e);
    if (s == VH_STATUS_OK) *out = e->text;
    return s;
}

static vh_status host_config_origin(vh_host *host, const char *key, vh_config_origin *out) {
    vh_host_impl *h = impl_of(host);
    const vh_config_entry *e = find_entry(h, key);
    if (!e)
        return host_fail(host, VH_STATUS_ERR_INTERNAL,
                         "plugin asked for the origin of undeclared key '%s'", key);
    *out = e->origin;
    return VH_STATUS_OK;
}

/* The run's peak memory is the process's peak resident set (metrics.c),
 * which host allocations are part of: no bookkeeping is needed here. */
static void *host_alloc(vh_host *host, size_t bytes) {
    (void)host;
    if (bytes > SIZE_MAX - 63u) return NULL;
    /* aligned_alloc needs a size that is a multiple of the alignment. */
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void host_free(vh_host *host, void *ptr) {
    (void)host;
    free(ptr);
}

static const vh_device_ops *host_device(vh_host *host) { return impl_of(host)->run->device; }

static vh_comm *host_comm(vh_host *host) { return &impl_of(host)->run->comm; }

static uint64_t host_seed(vh_host *host) {
    return (uint64_t)run_config_int(impl_of(host)->run, "seed");
}

/* No host extensions yet: every name is unknown. */
static const void *host_get_extension(vh_host *host, const char *name) {
    (void)host, (void)name;
    return NULL;
}

const vh_host_api vh_host_api_table = {
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

void host_impl_init(vh_host_impl *h, vh_run *run, vh_role role,
                    const vh_section_config *config) {
    memset(h, 0, sizeof *h);
    h->pub.api = &vh_host_api_table;
    h->run = run;
    h->role = role;
    h->config = config;
}
