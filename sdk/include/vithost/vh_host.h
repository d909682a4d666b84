/* vh_host.h - the table of host services handed to every plugin instance.
 *
 * As in SQLite's extension API, a plugin links against nothing of the host:
 * everything it needs from the host comes through this table. A vh_host is one
 * plugin instance's handle; its first member is the table, so a plugin writes
 *
 *     host->api->log(host, VH_LOG_LEVEL_INFO, "heads=%d", heads);
 *     return host->api->fail(host, VH_STATUS_ERR_CONFIG, "dim %d is odd", dim);
 *
 * Config getters read the plugin's own recipe section (keys without the
 * section prefix); the host has already checked every value against the
 * plugin's schema, so a getter fails only on a key the schema does not have
 * or a type mismatch, both plugin bugs.
 *
 * Append-only: members are only ever added at the end, in a new minor ABI
 * version; a plugin built for minor m may use the members that minor m has,
 * and checks VH_STRUCT_HAS(host->api, vh_host_api, member) before using a
 * newer one.
 */
#ifndef VITHOST_VH_HOST_H
#define VITHOST_VH_HOST_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "vh_comm.h"
#include "vh_config.h"
#include "vh_device.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define VH_PRINTF_LIKE(fmt_index, first_arg) \
    __attribute__((format(printf, fmt_index, first_arg)))
#else
#define VH_PRINTF_LIKE(fmt_index, first_arg)
#endif

typedef enum vh_log_level {
    VH_LOG_LEVEL_ERROR = 0,
    VH_LOG_LEVEL_WARN = 1,
    VH_LOG_LEVEL_INFO = 2,
    VH_LOG_LEVEL_DEBUG = 3,
} vh_log_level;

typedef struct vh_host vh_host;

/* Marks (test_abi_marks checks each member has one): @required here means
 * every host of a minor that has the member fills it (never NULL); @thread
 * says from which threads a plugin may call it: `main` is the thread that
 * calls the plugin's vtable (never two calls at once), `any` also the
 * plugin's own worker threads, concurrently. */
typedef struct vh_host_api {
    uint32_t struct_size; /* sizeof(vh_host_api) of the host */
    uint16_t abi_major, abi_minor;

    /* @required @thread(any: a line is written whole, nothing shared is
     * changed). Logging: one line per call, prefixed by the plugin's role
     * and name. */
    void (*log)(vh_host *host, vh_log_level level, const char *fmt, ...)
        VH_PRINTF_LIKE(3, 4);

    /* @required @thread(main: the message goes into the instance's one
     * buffer, read when the plugin's call returns; a worker hands its error
     * to the main thread, as vh_prefetch does). Records the message of a
     * failure and returns `status` unchanged, so a plugin writes
     * `return host->api->fail(host, code, "...", ...)`. */
    vh_status (*fail)(vh_host *host, vh_status status, const char *fmt, ...)
        VH_PRINTF_LIKE(3, 4);

    /* @required @thread(main). Like fail, for a bad config value: the
     * message is prefixed with the value's origin ("recipe.yaml:7:12:
     * model.heads: ..." or "--set ..."). */
    vh_status (*config_fail)(vh_host *host, const char *key, const char *fmt, ...)
        VH_PRINTF_LIKE(3, 4);

    /* @required @thread(main: the getters record a failure as fail does).
     * 1 if the key has a value (set or defaulted), 0 otherwise. */
    int (*config_has)(vh_host *host, const char *key);
    /* @required @thread(main). */
    vh_status (*config_int)(vh_host *host, const char *key, int64_t *out);
    /* @required @thread(main). */
    vh_status (*config_float)(vh_host *host, const char *key, double *out);
    /* @required @thread(main). */
    vh_status (*config_bool)(vh_host *host, const char *key, int *out);
    /* @required @thread(main). STRING, ENUM and PATH values; the string
     * lives as long as the run. @owns(the host; never freed by the plugin)
     * @lifetime(the run: at least until the plugin's destroy returns). */
    vh_status (*config_string)(vh_host *host, const char *key, const char **out);
    /* @required @thread(main). out->file (when not NULL): @owns(the host)
     * @lifetime(the run). */
    vh_status (*config_origin)(vh_host *host, const char *key,
                               vh_config_origin *out);

    /* @required @thread(any). Host memory, 64-byte aligned, freed with free
     * below (part of the run's peak memory, the process's peak resident
     * set). Device memory goes through device()->alloc. @owns(the plugin:
     * it gives back with free what it took; the host frees nothing left). */
    void *(*alloc)(vh_host *host, size_t bytes);
    /* @required @thread(any). NULL is a no-op. */
    void (*free)(vh_host *host, void *ptr);

    /* The device of the run (`run.device`) and the communicator of the run. */
    /* @required @thread(any) @owns(the host) @lifetime(the run). Which
     * threads may call its ops: vh_device.h. */
    const vh_device_ops *(*device)(vh_host *host);
    /* @required @thread(any) @owns(the host) @lifetime(the run). Its ops
     * are called from the main thread only: vh_comm.h. */
    vh_comm *(*comm)(vh_host *host);

    /* @required @thread(any). The run's seed (`run.seed`), for plugins that
     * draw random numbers. */
    uint64_t (*seed)(vh_host *host);

    /* ---- ABI 2.0 ---- */
    /* @required @thread(main). Optional host capabilities by name
     * (LV2-style); NULL when the host does not have `name`. @owns(the host:
     * the plugin never frees or writes it) @lifetime(until the plugin's
     * destroy returns). */
    const void *(*get_extension)(vh_host *host, const char *name);
} vh_host_api;

struct vh_host {
    const vh_host_api *api;
    /* The host's private state follows; plugins see only `api`. */
};

#ifdef __cplusplus
}
#endif
#endif
