/* multi_tensor.cu - placeholder: the ops below are being written (issue 21). */
#include "cuda_internal.h"

vh_status vh_cuda_multi_tensor_scale_check(vh_device *dev, const vh_multi_tensor_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

