/* precision_io.c - shared by amp, fp16 and fp32 (precision_io.h). */
#include "precision_io.h"

#include <string.h>

vh_status precision_policy_out(vh_host *host, vh_precision_policy *out,
                               const vh_precision_policy *full) {
    if (out->struct_size < sizeof out->struct_size)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "policy: out->struct_size is %u; the caller sets it",
                               (unsigned)out->struct_size);
    /* The caller's struct may be of an older minor: fill only what it covers,
     * and leave its struct_size as the caller set it. */
    size_t n = out->struct_size < sizeof *full ? out->struct_size : sizeof *full;
    memcpy((char *)out + sizeof out->struct_size, (const char *)full + sizeof full->struct_size,
           n - sizeof out->struct_size);
    return VH_STATUS_OK;
}

vh_status precision_state_save_header(vh_host *host, void *buf, size_t bytes, size_t need,
                                      const precision_state_header *h) {
    if (!buf || bytes < need)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "state buffer of %zu bytes, %zu needed", buf ? bytes : 0, need);
    memcpy(buf, h, sizeof *h);
    return VH_STATUS_OK;
}

vh_status precision_state_load_header(vh_host *host, const char *name, uint32_t magic,
                                      uint32_t version, const void *buf, size_t bytes,
                                      size_t need, precision_state_header *h) {
    uint32_t tag = 0;
    if (buf && bytes >= sizeof tag) memcpy(&tag, buf, sizeof tag);
    if (!buf || bytes < sizeof tag || tag != magic)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the checkpoint's precision state (%zu bytes, tag 0x%08x) was not "
                               "written by %s (tag 0x%08x): it belongs to another precision "
                               "plugin; resume with that plugin",
                               buf ? bytes : 0, (unsigned)tag, name, (unsigned)magic);
    if (bytes != need)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "the %s precision state is %zu bytes, %zu expected: the "
                               "checkpoint is damaged",
                               name, bytes, need);
    memcpy(h, buf, sizeof *h);
    if (h->version != version)
        return host->api->fail(host, VH_STATUS_ERR_FORMAT,
                               "%s precision state version %u, this %s reads version %u%s%s%s", name,
                               (unsigned)h->version, name, (unsigned)version,
                               h->version > version ? " (written by a newer " : "",
                               h->version > version ? name : "",
                               h->version > version ? ")" : "");
    return VH_STATUS_OK;
}
