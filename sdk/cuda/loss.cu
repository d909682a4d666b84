/* loss.cu - placeholder: the ops below are being written (issue 21). */
#include "cuda_internal.h"

vh_status vh_cuda_softmax_cross_entropy(vh_device *dev, const vh_xent_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

