/* vh_config.h - a plugin's configuration schema, and where each value came from.
 *
 * Every plugin describes the keys of its recipe section as a static array of
 * vh_config_key, ended by an entry whose key is NULL. The host checks the
 * recipe against it before the plugin is created: unknown keys, wrong types,
 * values out of range or outside `choices` are refused with file:line:col, and
 * missing keys are filled from `default_value`. A plugin therefore reads only
 * values that already passed its schema.
 *
 * vh_config_key (an array in the plugin) and vh_config_origin (filled into
 * the plugin's memory) are FROZEN for every ABI 2.x: no struct_size, never
 * grow; a change would be a new type.
 */
#ifndef VITHOST_VH_CONFIG_H
#define VITHOST_VH_CONFIG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_config_type {
    VH_CONFIG_TYPE_INT = 0,    /* 64-bit signed integer */
    VH_CONFIG_TYPE_FLOAT = 1,  /* double; integers are accepted */
    VH_CONFIG_TYPE_BOOL = 2,   /* true/false (also yes/no, on/off) */
    VH_CONFIG_TYPE_STRING = 3, /* any scalar text */
    VH_CONFIG_TYPE_ENUM = 4,   /* one of `choices` */
    VH_CONFIG_TYPE_PATH = 5,   /* a file-system path, text; not checked for existence */
} vh_config_type;

enum {
    /* The key may be absent and has no default: vh_host_api.config_has says
     * whether the recipe set it (e.g. "num_classes: from the data plugin"). */
    VH_CONFIG_KEY_FLAG_OPTIONAL = 1u << 0,
};

typedef struct vh_config_key {
    const char *key;           /* lower_snake_case; NULL ends the schema */
    int32_t type; /* vh_config_type */
    const char *default_value; /* as YAML text; NULL: required unless OPTIONAL */
    const char *doc;           /* one line for `vithost plugins --describe` */
    const char *choices;       /* VH_CONFIG_TYPE_ENUM: "token|pooled"; else NULL */
    double min, max;           /* INT/FLOAT range, inclusive; checked when min < max */
    uint32_t flags;            /* VH_CONFIG_KEY_FLAG_* */
} vh_config_key;

typedef enum vh_config_source {
    VH_CONFIG_SOURCE_RECIPE = 0,  /* written in the recipe file */
    VH_CONFIG_SOURCE_SET = 1,     /* given on the command line with --set */
    VH_CONFIG_SOURCE_DEFAULT = 2, /* filled from the schema's default_value */
} vh_config_source;

/* Where a resolved value came from; file is NULL unless source is RECIPE. */
typedef struct vh_config_origin {
    int32_t source; /* vh_config_source */
    const char *file;
    int32_t line, column; /* 1-based; 0 when not from a file */
} vh_config_origin;

#ifdef __cplusplus
}
#endif
#endif
