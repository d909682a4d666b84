/* clock.c - the monotonic clock the engine's timed choices read (the GEMM
 * path race, attention16's, gelu_grad16's). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime in strict C11 */
#include <time.h>

#include "cpu_ops.h"

double vh_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
