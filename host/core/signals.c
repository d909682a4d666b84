/* signals.c - a stop request from SIGINT/SIGTERM/SIGUSR1/SIGUSR2, read by the
 * loop between steps (see signals.h). */
#define _POSIX_C_SOURCE 200809L
#include "signals.h"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define VH_STOP_SIGNALS 4
static const int stop_signals[VH_STOP_SIGNALS] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
static struct sigaction saved_actions[VH_STOP_SIGNALS];

/* the stop agreement's cadence (signals.h) */
static double pace_t0;
static int64_t pace_step0 = -1, agree_every = 1;

static volatile sig_atomic_t stop_signal;
static volatile sig_atomic_t stop_from_parent;

static void on_stop_signal(int sig, siginfo_t *info, void *context) {
    (void)context;
    if (stop_signal) return;
    stop_signal = sig;
    /* (getppid is async-signal-safe) */
    stop_from_parent = info && info->si_code == SI_USER && info->si_pid == getppid();
}

void signals_catch_stop(vh_signals_saved *saved) {
    stop_signal = 0;
    stop_from_parent = 0;
    pace_step0 = -1;
    agree_every = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_stop_signal;
    /* SA_RESETHAND: a second signal ends the process at once; SA_RESTART:
     * a write the signal interrupts goes on (it is no write error) */
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < VH_STOP_SIGNALS; i++) sigaction(stop_signals[i], &sa, &saved_actions[i]);
    saved->installed = 1;
}

void signals_restore(const vh_signals_saved *saved) {
    if (!saved->installed) return;
    for (int i = 0; i < VH_STOP_SIGNALS; i++) sigaction(stop_signals[i], &saved_actions[i], NULL);
}

int signals_stop_requested(void) { return stop_signal; }

int signals_stop_by_launcher_abort(void) {
    return stop_from_parent && (stop_signal == SIGINT || stop_signal == SIGTERM);
}

int signals_agree_due(int64_t step) { return step % agree_every == 0; }

double signals_pace(int64_t step) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    /* before a first measure: as if a step took the whole interval */
    double pace = pace_step0 >= 0 && step > pace_step0
                      ? (now - pace_t0) / (double)(step - pace_step0)
                      : VH_STOP_AGREE_SECONDS;
    pace_t0 = now;
    pace_step0 = step;
    return pace;
}

void signals_set_pace(double seconds_per_step) {
    double every = seconds_per_step > 0.0 ? VH_STOP_AGREE_SECONDS / seconds_per_step : 1.0;
    agree_every = every < 1.0 ? 1 : every > 1e6 ? 1000000 : (int64_t)every;
}
