/* names.c - names of status codes, roles and dtypes; sizes of dtypes. */
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_status.h"
#include "vithost/vh_types.h"

const char *vh_status_str(vh_status status) {
    switch (status) {
    case VH_STATUS_OK: return "ok";
    case VH_STATUS_ERR_INVALID_ARG: return "invalid argument";
    case VH_STATUS_ERR_CONFIG: return "config error";
    case VH_STATUS_ERR_IO: return "i/o error";
    case VH_STATUS_ERR_FORMAT: return "format error";
    case VH_STATUS_ERR_NOMEM: return "out of memory";
    case VH_STATUS_ERR_UNSUPPORTED: return "unsupported";
    case VH_STATUS_ERR_DEVICE: return "device error";
    case VH_STATUS_ERR_COMM: return "communication error";
    case VH_STATUS_ERR_NUMERIC: return "numeric error";
    case VH_STATUS_ERR_INTERRUPTED: return "interrupted";
    case VH_STATUS_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *vh_role_name(vh_role role) {
    switch ((int)role) { /* int: a descriptor may hold a role this SDK does not know */
    case VH_ROLE_MODEL: return "model";
    case VH_ROLE_PRECISION: return "precision";
    case VH_ROLE_SHARDING: return "sharding";
    case VH_ROLE_OPTIM: return "optim";
    case VH_ROLE_DATA: return "data";
    }
    return "?";
}

size_t vh_dtype_size(vh_dtype dtype) {
    switch ((int)dtype) { /* int: a caller may pass a value no enum member has */
    case VH_DTYPE_F32: return 4;
    case VH_DTYPE_F16: return 2;
    case VH_DTYPE_BF16: return 2;
    case VH_DTYPE_I32: return 4;
    case VH_DTYPE_I64: return 8;
    case VH_DTYPE_U8: return 1;
    case VH_DTYPE_F64: return 8;
    }
    return 0;
}

const char *vh_dtype_name(vh_dtype dtype) {
    switch ((int)dtype) {
    case VH_DTYPE_F32: return "f32";
    case VH_DTYPE_F16: return "f16";
    case VH_DTYPE_BF16: return "bf16";
    case VH_DTYPE_I32: return "i32";
    case VH_DTYPE_I64: return "i64";
    case VH_DTYPE_U8: return "u8";
    case VH_DTYPE_F64: return "f64";
    }
    return "?";
}

int64_t vh_tensor_numel(const vh_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int64_t vh_param_desc_numel(const vh_param_desc *param) {
    int64_t n = 1;
    for (int32_t i = 0; i < param->ndim; i++) n *= param->shape[i];
    return n;
}

int vh_dtype_is_float(vh_dtype dtype) {
    return dtype == VH_DTYPE_F32 || dtype == VH_DTYPE_F16 || dtype == VH_DTYPE_BF16;
}
