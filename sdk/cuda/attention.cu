/* attention.cu - placeholder: the ops below are being written (issue 21). */
#include "cuda_internal.h"

vh_status vh_cuda_attention_forward(vh_device *dev, const vh_attention_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_attention_backward(vh_device *dev, const vh_attention_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

