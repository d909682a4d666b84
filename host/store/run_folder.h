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

/* One job per run folder: rank 0 takes an flock on DIR/.lock before it
 * checks or writes anything there (a new run makes the folder first) and
 * holds it for the run's life; the OS releases it however the job ends.
 * The file names its holder ("pid P on host H since T"); a second job, or a
 * --resume into the folder of a job still running, is refused naming it.
 * *lock: what run_folder_unlock takes (-1: none, as when --resume names a
 * folder without a run, which run_folder_check then refuses). */
vh_status run_folder_lock(const char *dir, int resume, int *lock, vh_diag *d);
void run_folder_unlock(int lock);

/* A new run needs a folder without a run in it; a resumed one needs the
 * recipe it was started with (how long and how often may change); a
 * refusal names the first key that differs, with both values. Checks
 * only: nothing is written. */
vh_status run_folder_check(const vh_run *run, const char *dir, int resume, vh_diag *d);

/* Makes the folder (and its parents) and writes recipe.yaml and run.json,
 * every write checked (a failure names the file and the system's reason). */
vh_status run_folder_create(const vh_run *run, const char *dir, vh_diag *d);

#endif
