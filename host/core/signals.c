/* signals.c - a stop request from SIGINT/SIGTERM, read by the loop between
 * steps (see signals.h). */
#define _POSIX_C_SOURCE 200809L
#include "signals.h"

#include <signal.h>

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    stop_signal = sig;
    signal(sig, SIG_DFL); /* a second Ctrl-C ends the process at once */
}

void signals_catch_stop(vh_signals_saved *saved) {
    stop_signal = 0;
    saved->old_int = signal(SIGINT, on_stop_signal);
    saved->old_term = signal(SIGTERM, on_stop_signal);
}

void signals_restore(const vh_signals_saved *saved) {
    signal(SIGINT, saved->old_int);
    signal(SIGTERM, saved->old_term);
}

int signals_stop_requested(void) { return stop_signal; }
