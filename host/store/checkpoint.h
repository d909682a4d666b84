/* checkpoint.h - checkpoints of a run folder.
 *
 *   DIR/checkpoints/step-00001200/model.safetensors   weights, timm names
 *                                 optim.safetensors   optimizer state slots, saved
 *                                                     by the sharding plugin
 *                                                     (optim_state.h)
 *                                 state.json          step, epoch, and the
 *                                                     plugins' state blobs (hex)
 *   DIR/checkpoints/latest                            "step-00001200"
 *
 * A checkpoint is written into a temporary folder (.tmp-step-N) and renamed
 * into place, then `latest` is replaced the same way (a file renamed over
 * it); the same step saved again swaps the two folders in one rename and
 * only then removes the old copy. A kill at any moment leaves `latest`
 * naming a whole checkpoint, except between the two renames of a
 * filesystem that cannot swap folders, which the next --resume repairs.
 */
#ifndef VITHOST_HOST_CHECKPOINT_H
#define VITHOST_HOST_CHECKPOINT_H

#include "session.h"

/* Writes a checkpoint of the session's current state; keeps the newest
 * `keep` checkpoints (0: all). */
vh_status checkpoint_save(vh_session *s, const char *run_dir, int64_t keep, vh_diag *d);

/* The folder `latest` names, or an error that says there is none or that
 * it is missing, with the command that recovers (a copy to put back, or
 * the newest whole checkpoint to name in `latest`). Reads only. */
vh_status checkpoint_latest(const char *run_dir, char *out, size_t len, vh_diag *d);

/* A new run of several ranks, after rank 0 made the run folder: every rank
 * must see it (its run.json), since on a resume every rank reads the
 * checkpoints itself. Refused up front, the same message on every rank,
 * naming the first rank that cannot and the path. One rank: nothing. */
vh_status checkpoint_folder_shared(vh_session *s, const char *run_dir, vh_diag *d);

/* checkpoint_latest for --resume on every rank: rank 0 (holding the run
 * folder's lock) first puts back a folder a killed replacement left
 * missing and removes the leftovers of killed saves; the ranks then agree
 * (a barrier) before they read. */
vh_status checkpoint_resume_point(vh_session *s, const char *run_dir, char *out, size_t len,
                                  vh_diag *d);

/* The checkpoint folder before ckpt_dir in its run folder ("" when none is
 * kept): what a refusal of ckpt_dir offers instead. */
void checkpoint_previous(const char *ckpt_dir, char *out, size_t len);

/* Restores parameters, optimizer, precision, model and data state, step and
 * epoch from a checkpoint folder. */
vh_status checkpoint_load(vh_session *s, const char *ckpt_dir, vh_diag *d);

#endif
