/* cache_alloc.c - placeholder: the caching allocator is being written (issue 21). */
#include "cache_alloc.h"

typedef int vh_cuda_cache_alloc_placeholder;
