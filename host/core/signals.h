/* signals.h - stop requests during training: SIGINT, SIGTERM, SIGUSR1 and
 * SIGUSR2. The first asks the loop to stop at the end of the step (with a
 * checkpoint); a second of the same signal ends the process at once.
 *
 * SIGUSR1/SIGUSR2 are here for many processes: OpenMPI's mpirun forwards
 * them to every rank as they are, while after its own SIGINT or SIGTERM it
 * sends the ranks SIGCONT, SIGTERM and SIGKILL odls_base_sigkill_timeout
 * seconds apart (1 by default; it reads none of their output meanwhile)
 * and exits 1 whatever they returned (OpenMPI 4.1). */
#ifndef VITHOST_HOST_SIGNALS_H
#define VITHOST_HOST_SIGNALS_H

#include <stdint.h>

/* The handlers in place before: kept by signals.c (there is one training
 * loop per process at a time), so this header needs no POSIX types. */
typedef struct vh_signals_saved {
    int installed;
} vh_signals_saved;

/* Installs the handlers and clears any earlier request. */
void signals_catch_stop(vh_signals_saved *saved);
/* Puts the previous handlers back. */
void signals_restore(const vh_signals_saved *saved);
/* The signal that asked to stop, or 0. */
int signals_stop_requested(void);
/* Whether that signal was a SIGINT or SIGTERM from this process's parent:
 * under mpirun, the launcher passing on its own Ctrl-C or SIGTERM. */
int signals_stop_by_launcher_abort(void);
/* With many ranks a stop is agreed by a collective, on log steps and on the
 * steps signals_agree_due names: about every VH_STOP_AGREE_SECONDS, so a
 * stop under mpirun lands well inside its 1 s, at the cost of a small
 * collective 5 times a second. The cadence is the same on every rank: after
 * each agreement, signals_set_pace gets the slowest rank's signals_pace
 * (seconds per step since the last agreement; agreed with the flag). */
#define VH_STOP_AGREE_SECONDS 0.2
int signals_agree_due(int64_t step);
double signals_pace(int64_t step);
void signals_set_pace(double seconds_per_step);

#endif
