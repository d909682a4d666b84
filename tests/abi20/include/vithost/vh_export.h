/* vh_export.h - symbol visibility. Everything is built with hidden
 * visibility; only the SDK's API and each plugin's descriptor are exported. */
#ifndef VITHOST_VH_EXPORT_H
#define VITHOST_VH_EXPORT_H

#if defined(__GNUC__)
#define VH_SDK_API __attribute__((visibility("default")))
#else
#define VH_SDK_API
#endif

#endif
