/* banner.h - the lines a run starts with: its folder, the checkpoint it
 * resumes from, what it trains on which device and ranks, the memory each
 * rank holds, and the order of a step's calls. */
#ifndef VITHOST_HOST_BANNER_H
#define VITHOST_HOST_BANNER_H

#include <stdint.h>

#include "session.h"

/* The schedule as the banner tells it. */
typedef struct vh_banner {
    const char *dir;
    const char *resumed_from; /* the checkpoint; NULL: a fresh run */
    int64_t total, epochs, steps_per_epoch;
    int32_t world;
    double flops;       /* training FLOPs per image; 0 unknown */
    double peak_tflops; /* the device's; 0 unknown */
} vh_banner;

/* Prints the banner on s->out. The memory line asks the sharding plugin
 * and the model (traced); their failure is returned. */
vh_status banner_print(vh_session *s, const vh_banner *b, vh_diag *d);

#endif
