/* tokens.cu - placeholder: the ops below are being written (issue 21). */
#include "cuda_internal.h"

vh_status vh_cuda_mean_pool_forward(vh_device *dev, const vh_tokens_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_mean_pool_backward(vh_device *dev, const vh_tokens_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_patchify(vh_device *dev, const vh_tokens_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_embed_forward(vh_device *dev, const vh_tokens_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_embed_backward(vh_device *dev, const vh_tokens_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

