/* weights.h - the model's parameters as safetensors files under the model's
 * own (timm) names, so a checkpoint opens in PyTorch and a PyTorch/timm file
 * can start a run.
 *
 * The host reads the file and never interprets a name: per unit, the model
 * writes its init values (init_unit), then takes from the file what it wants
 * (load_weights, through a vh_weights_source) and says what it did with each
 * parameter (a vh_weights_report); a model without load_weights gets the
 * host's loader, which takes every parameter by name and exact shape. The
 * sharding plugin then keeps the unit's values (load_unit).
 */
#ifndef VITHOST_HOST_WEIGHTS_H
#define VITHOST_HOST_WEIGHTS_H

#include <stdint.h>

#include "session.h"

/* Sets every unit's parameters, once per run: the model's init rules from
 * run.seed, then, when path is not NULL, the file's tensors in `mode`.
 * Prints one line (loaded, re-initialised and why, ignored). In STRICT mode
 * a tensor of the file that no parameter looked up is an error. The one
 * path resume, eval, bench and `pretrained` read weights through: the file
 * is checked first with weights_verify_file. */
vh_status weights_load_model(vh_session *s, const char *path, vh_weights_mode mode,
                             vh_diag *d);

/* Writes every parameter (sharding.store_unit, collective) as F32; rank 0
 * writes the file. */
vh_status weights_save_model(vh_session *s, const char *path, vh_diag *d);

/* ---- checksums of a checkpoint folder ------------------------------------
 * A checkpoint's state.json holds the CRC-32 (as zlib's crc32() computes
 * it) and size of each of its NAME.safetensors files, as "NAME_crc32" and
 * "NAME_bytes". */

/* The CRC-32 and size of a file; 0 (errno set) when it cannot be read. */
int weights_file_crc32(const char *path, uint32_t *crc, uint64_t *bytes);

/* Checks DIR/NAME.safetensors against the checksum DIR/state.json holds for
 * it. A file without one (no state.json beside it, a foreign file, a
 * checkpoint written before checksums) passes; a damaged one is refused
 * naming the file and what to do. */
vh_status weights_verify_file(const char *path, vh_diag *d);

/* A checkpoint's state.json whole (free it); NULL with errno set when it
 * cannot be read in full. */
char *weights_read_state(const char *path);

#endif
