/* eltwise.cu - placeholder: the ops below are being written (issue 21). */
#include "cuda_internal.h"

vh_status vh_cuda_gelu_forward(vh_device *dev, const vh_eltwise_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_gelu_backward(vh_device *dev, const vh_eltwise_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_add(vh_device *dev, const vh_eltwise_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_mul(vh_device *dev, const vh_eltwise_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_dropout_forward(vh_device *dev, const vh_eltwise_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_scale_rows(vh_device *dev, const vh_eltwise_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_drop_path_scale(vh_device *dev, const vh_eltwise_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_bias_backward(vh_device *dev, const vh_rows_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

vh_status vh_cuda_softmax(vh_device *dev, const vh_rows_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

