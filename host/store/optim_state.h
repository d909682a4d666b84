/* optim_state.h - the optimizer's per-element state in a checkpoint,
 * optim.safetensors: one F32 tensor per parameter and state slot, named
 * "<param>.optim_state.<slot>", with the parameter's full shape.
 *
 * The sharding plugin owns the state and saves and loads it itself
 * (state_save / state_load, collective), in whatever pieces it holds; the
 * host behind the vh_state_io it is given assembles the pieces into whole
 * tensors and serves pieces back from them, so the file does not depend on
 * how the state was sharded when it was written. Neither way holds the whole
 * state on a rank: a save sends every rank's pieces of one tensor at a time
 * to rank 0 (the communicator's gather, ABI 2.3; the sum of zero-padded
 * tensors over the ranks with a backend that has none), which appends it to
 * the file; a load reads each piece from its range of the mapped file, on
 * every rank (the file must be readable by all: docs/SHARDING.md).
 */
#ifndef VITHOST_HOST_OPTIM_STATE_H
#define VITHOST_HOST_OPTIM_STATE_H

#include "session.h"

/* Collective; rank 0 writes the file. */
vh_status optim_state_save(vh_session *s, const char *path, vh_diag *d);
/* Checks that the file holds exactly this optimizer's tensors, then lets the
 * sharding plugin read its pieces. */
vh_status optim_state_load(vh_session *s, const char *path, vh_diag *d);

#endif
