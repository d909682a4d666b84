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
 * A checkpoint is written into a temporary folder and renamed into place,
 * then `latest` is replaced the same way: a crash at any moment leaves the
 * previous checkpoint whole and `latest` pointing at a complete one.
 */
#ifndef VITHOST_HOST_CHECKPOINT_H
#define VITHOST_HOST_CHECKPOINT_H

#include "session.h"

/* Writes a checkpoint of the session's current state; keeps the newest
 * `keep` checkpoints (0: all). */
vh_status checkpoint_save(vh_session *s, const char *run_dir, int64_t keep, vh_diag *d);

/* The folder of the newest complete checkpoint of a run folder, or an
 * error that says there is none. */
vh_status checkpoint_latest(const char *run_dir, char *out, size_t len, vh_diag *d);

/* The checkpoint folder before ckpt_dir in its run folder ("" when none is
 * kept): what a refusal of ckpt_dir offers instead. */
void checkpoint_previous(const char *ckpt_dir, char *out, size_t len);

/* Restores parameters, optimizer, precision, model and data state, step and
 * epoch from a checkpoint folder. */
vh_status checkpoint_load(vh_session *s, const char *ckpt_dir, vh_diag *d);

#endif
