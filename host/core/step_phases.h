/* step_phases.h - where a training step's time goes, for `vithost bench`.
 *
 * session_step_timed is session_step with a clock read (clock_gettime,
 * tens of nanoseconds) at each phase boundary; session_step passes NULL and
 * reads none. The phases are disjoint and add up to the step:
 *
 *   data       data.next and the copy to the device (timed by the caller,
 *              session_next_batch is outside the step)
 *   forward    sharding.zero_grads, model.forward
 *   backward   precision.loss_scale, model.backward, sharding.wait
 *   comm_wait  time blocked in the communicator's wait (host/comm_stats.h),
 *              taken out of the phase it happened in
 *   optimizer  unscale_and_check, grad_sum_sq, optim.step, sharding.refresh,
 *              precision.update
 *
 * The CPU device is synchronous, so a clock read ends a phase's work. On a
 * device with streams the work is queued: `sync` makes each boundary wait
 * for the device first, which is right when benchmarking and would slow a
 * training run (which never sets it). */
#ifndef VITHOST_HOST_STEP_PHASES_H
#define VITHOST_HOST_STEP_PHASES_H

#include "session.h"

typedef enum vh_step_phase {
    VH_STEP_PHASE_DATA,
    VH_STEP_PHASE_FORWARD,
    VH_STEP_PHASE_BACKWARD,
    VH_STEP_PHASE_COMM_WAIT,
    VH_STEP_PHASE_OPTIMIZER,
    VH_STEP_PHASE_COUNT
} vh_step_phase;

/* "data", "forward", "backward", "comm_wait", "optimizer" */
extern const char *const vh_step_phase_names[VH_STEP_PHASE_COUNT];

typedef struct vh_step_phases {
    int sync;                                /* synchronize the device at each boundary */
    double seconds[VH_STEP_PHASE_COUNT];     /* added to, never reset here */
} vh_step_phases;

/* session_step, adding each phase's seconds to *phases (NULL: no clock). */
vh_status session_step_timed(vh_session *s, const vh_batch *batch, int64_t step,
                             const float **dev_loss, double *lr, int *skipped,
                             vh_step_phases *phases, vh_diag *d);

/* session_step_begin, _micro and _end (session.h) with the clock on, for a
 * step of run.grad_accum micro-batches; the caller times the data between. */
vh_status session_step_begin_timed(vh_session *s, vh_step_phases *phases, vh_diag *d);
vh_status session_step_micro_timed(vh_session *s, const vh_batch *batch, int64_t micro,
                                   int64_t count, const float **dev_loss,
                                   vh_step_phases *phases, vh_diag *d);
vh_status session_step_end_timed(vh_session *s, int64_t step, double *lr, int *skipped,
                                 vh_step_phases *phases, vh_diag *d);

#endif
