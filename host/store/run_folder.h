/* run_folder.h - the folder a run writes: its default name, recipe.yaml
 * (the resolved recipe, and the check that a resumed run has the same one)
 * and run.json (vithost and plugin versions). Checkpoints (checkpoint.h)
 * and metrics.jsonl (metrics.h) live there too. */
#ifndef VITHOST_HOST_RUN_FOLDER_H
#define VITHOST_HOST_RUN_FOLDER_H

#include <stddef.h>

#include "diag.h"
#include "runtime.h"

/* runs/<recipe file name without .yaml>-<YYYYmmdd-HHMMSS>[-N] */
void run_folder_default(const vh_run *run, char *out, size_t len);

/* A new run needs a folder without a run in it; a resumed one needs the
 * recipe it was started with (how long and how often may change). Checks
 * only: nothing is written. */
vh_status run_folder_check(const vh_run *run, const char *dir, int resume, vh_diag *d);

/* Makes the folder (and its parents) and writes recipe.yaml and run.json. */
vh_status run_folder_create(const vh_run *run, const char *dir, vh_diag *d);

#endif
