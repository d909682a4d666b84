/* signals.h - SIGINT and SIGTERM during training: the first asks the loop to
 * stop at the end of the step (with a checkpoint); a second SIGINT ends the
 * process at once. */
#ifndef VITHOST_HOST_SIGNALS_H
#define VITHOST_HOST_SIGNALS_H

typedef struct vh_signals_saved {
    void (*old_int)(int);
    void (*old_term)(int);
} vh_signals_saved;

/* Installs the handlers and clears any earlier request. */
void signals_catch_stop(vh_signals_saved *saved);
/* Puts the previous handlers back. */
void signals_restore(const vh_signals_saved *saved);
/* The signal that asked to stop, or 0. */
int signals_stop_requested(void);

#endif
