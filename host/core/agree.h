/* agree.h - the ranks of a job check that they run the same thing, once,
 * right after the communicator opens and before any plugin is created.
 *
 * What is compared: the vithost version and plugin ABI, and the resolved
 * recipe: every key of the run section and, per role, the plugin's name,
 * version and ABI and every key of its section (numbers by value, so
 * `1e-3` and `0.001` agree). Not compared: run.comm (auto and mpi open the
 * same backend, and a rank on another backend could not take part in the
 * exchange at all), the recipe's file name and where each value came from
 * (an MPMD launch may give each rank its own copy of one recipe), and the
 * command line's --out, --resume and --stop-after.
 *
 * The exchange: one all-gather of (digest, length) per rank. Only on a
 * mismatch a second all-gather sends every rank's list (padded to the
 * longer of rank 0's and the first differing rank's) to every rank, and
 * every rank finds the same first differing key between those two. Both
 * move bytes only, which every backend does. Every rank returns VH_STATUS_ERR_CONFIG with the
 * message and sets run->failed_together: no rank is left in a collective,
 * so none aborts, and rank 0 alone prints it.
 */
#ifndef VITHOST_HOST_AGREE_H
#define VITHOST_HOST_AGREE_H

#include "runtime.h"

/* With one rank: nothing. A mismatch: VH_STATUS_ERR_CONFIG naming the key
 * and its values on two ranks; a failed collective: VH_STATUS_ERR_COMM. */
vh_status agree_check(vh_run *run, vh_diag *d);

#endif
