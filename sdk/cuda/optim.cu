/* optim.cu - placeholder: the multi-tensor optimizer kernels are being written. */
#include "cuda_internal.h"

const void *vh_cuda_mta_extension(void) { return NULL; }
