/* gemm.cu - placeholder: the ops below are being written (issue 21). */
#include "cuda_internal.h"

vh_status vh_cuda_gemm(vh_device *dev, const vh_gemm_args *args) {
    (void)dev; (void)args;
    return VH_STATUS_ERR_UNSUPPORTED;
}

void vh_cuda_gemm_state_free(vh_cuda_gemm_state *s) { (void)s; }
