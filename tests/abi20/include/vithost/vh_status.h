/* vh_status.h - status codes returned by every SDK and plugin function.
 *
 * Plugins never exit: they return a vh_status and, for anything but
 * VH_STATUS_OK, leave a human-readable message with vh_host_api.fail (see
 * vh_host.h). The host decides what to print and which exit code to use.
 *
 * Append-only: new codes are added at the end, existing values never change.
 */
#ifndef VITHOST_VH_STATUS_H
#define VITHOST_VH_STATUS_H

#include "vh_export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_status {
    VH_STATUS_OK = 0,
    VH_STATUS_ERR_INVALID_ARG = 1, /* a caller passed a value the API forbids */
    VH_STATUS_ERR_CONFIG = 2,      /* a recipe value is unusable (names file:line) */
    VH_STATUS_ERR_IO = 3,          /* a file could not be read or written */
    VH_STATUS_ERR_FORMAT = 4,      /* a file was read but its contents are wrong */
    VH_STATUS_ERR_NOMEM = 5,       /* an allocation failed */
    VH_STATUS_ERR_UNSUPPORTED = 6, /* valid request this build/device cannot do */
    VH_STATUS_ERR_DEVICE = 7,      /* the device (driver, kernel launch) failed */
    VH_STATUS_ERR_COMM = 8,        /* a collective failed */
    VH_STATUS_ERR_NUMERIC = 9,     /* NaN/Inf where the policy does not allow it */
    VH_STATUS_ERR_INTERRUPTED = 10,/* a signal asked the run to stop */
    VH_STATUS_ERR_INTERNAL = 11,   /* a bug: an invariant did not hold */
} vh_status;

/* Short stable name of a code, e.g. "config error". Never NULL. */
VH_SDK_API const char *vh_status_str(vh_status status);

#ifdef __cplusplus
}
#endif
#endif
