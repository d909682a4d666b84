/* step.c - one training step, in DESIGN.md's order:
 *
 *   sharding.zero_grads
 *   model.forward        (per unit: sharding.gather ... sharding.release)
 *   precision.loss_scale
 *   model.backward       (per unit, reversed: gather, grads, reduce, release)
 *   sharding.wait
 *   precision.unscale_and_check (found-inf agreed across ranks)
 *   precision.grad_sum_sq (when the plugin has it: the global gradient norm
 *                          its pass computed, handed to the optimizer)
 *   optim.update (ABI 2.1; optim.step for a 2.0 optimizer) on the local
 *                        slices (skipped on overflow), sharding.refresh
 *                        (refresh_updated, ABI 2.9, after an optimizer
 *                        that wrote the compute copies itself)
 *   precision.update
 *
 * With run.grad_accum K > 1 (the loop's run_step, through session_step_begin
 * / _micro / _end): zero_grads once, then per micro-batch sharding.set_sync
 * (0, and 1 on the last), forward, backward with the loss scale / K; wait
 * after the last only; the rest sees the accumulated gradient.
 *
 * The batch comes from session_next_batch (data.next, copied to the device).
 * The loss stays in device memory: the loop copies it back only on the steps
 * it logs. session_step_timed (step_phases.h) is the same step with a clock
 * read at each phase boundary, for `vithost bench`.
 */
#define _POSIX_C_SOURCE 200809L
#include "session.h"

#include <time.h>

#include "step_phases.h"

const char *const vh_step_phase_names[VH_STEP_PHASE_COUNT] = {
    "data", "forward", "backward", "comm_wait", "optimizer"};

const char vh_step_order[] =
    "data.next, sharding.zero_grads, model.forward (sharding.gather/release per unit), "
    "precision.loss_scale, model.backward (sharding.gather/grads/reduce/release per unit, "
    "reversed), sharding.wait, precision.unscale_and_check, precision.grad_sum_sq (if it "
    "has it), optim.update or optim.step (skipped on overflow), sharding.refresh (or "
    "sharding.refresh_updated after an optimizer that wrote the compute copies), "
    "precision.update; with run.grad_accum K > 1, data.next to sharding.wait run K times per "
    "step after one zero_grads (sharding.set_sync 0, then 1 for the last; the loss scale / K; "
    "wait after the last only)";

#define CALL(s, role, call, expr)                                                   \
    do {                                                                            \
        session_trace((s), "%s", (call));                                           \
        vh_status st_ = (expr);                                                     \
        if (st_ != VH_STATUS_OK) return session_plugin_error((s), (role), st_, (call), d); \
    } while (0)

/* The clock at the phase boundaries of session_step_timed: the last
 * boundary's time and the communicator's wait total then. */
typedef struct phase_clock {
    vh_step_phases *phases; /* NULL: no timing */
    double at, waited;
} phase_clock;

static double clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void phase_start(vh_session *s, phase_clock *c, vh_step_phases *phases) {
    c->phases = phases;
    if (!phases) return;
    c->at = clock_seconds();
    c->waited = s->run->comm_stats.wait_seconds;
}

/* Ends `phase` here: its time less what was spent waiting on the
 * communicator, which goes to comm_wait. */
static vh_status phase_end(vh_session *s, phase_clock *c, vh_step_phase phase, vh_diag *d) {
    if (!c->phases) return VH_STATUS_OK;
    if (c->phases->sync) {
        const vh_device_ops *dev = s->run->device;
        vh_status st = dev->synchronize(dev->device);
        if (st != VH_STATUS_OK) return diag_set(d, st, "synchronizing %s failed", dev->name);
    }
    double now = clock_seconds(), waited = s->run->comm_stats.wait_seconds;
    double dw = waited - c->waited;
    c->phases->seconds[phase] += now - c->at - dw;
    c->phases->seconds[VH_STEP_PHASE_COMM_WAIT] += dw;
    c->at = now;
    c->waited = waited;
    return VH_STATUS_OK;
}

#define PHASE_END(s, c, phase)                                   \
    do {                                                         \
        vh_status pst_ = phase_end((s), (c), (phase), d);        \
        if (pst_ != VH_STATUS_OK) return pst_;                   \
    } while (0)

/* ---- the step in three parts (session.h) ------------------------------- */

static vh_status step_begin(vh_session *s, phase_clock *clock, vh_diag *d) {
    (void)clock;
    CALL(s, VH_ROLE_SHARDING, "sharding.zero_grads",
         s->sharding->zero_grads(s->self[VH_ROLE_SHARDING]));
    return VH_STATUS_OK;
}

/* One micro-batch: forward and backward, the loss scaled by 1/count so the
 * accumulated gradient is the mean over the step's count micro-batches
 * (each model loss is its batch's mean). The sharding plugin communicates
 * on the last one only (set_sync, called only when count > 1). */
static vh_status step_micro(vh_session *s, const vh_batch *batch, int64_t micro, int64_t count,
                            const float **dev_loss, phase_clock *clock, vh_diag *d) {
    vh_model_output out = {.struct_size = sizeof out};
    void *sharding = s->self[VH_ROLE_SHARDING];
    const int last = micro + 1 == count;
    if (count > 1) {
        session_trace(s, "sharding.set_sync %d (micro-batch %lld of %lld)", last,
                      (long long)micro + 1, (long long)count);
        vh_status st = s->sharding->set_sync(sharding, last);
        if (st != VH_STATUS_OK)
            return session_plugin_error(s, VH_ROLE_SHARDING, st, "sharding.set_sync", d);
    }
    CALL(s, VH_ROLE_MODEL, "model.forward",
         s->model->forward(s->self[VH_ROLE_MODEL], batch, VH_MODE_TRAIN, &s->hooks, &out));
    PHASE_END(s, clock, VH_STEP_PHASE_FORWARD);
    session_trace(s, "precision.loss_scale");
    float scale = s->precision->loss_scale(s->self[VH_ROLE_PRECISION]) / (float)count;
    CALL(s, VH_ROLE_MODEL, "model.backward",
         s->model->backward(s->self[VH_ROLE_MODEL], scale, &s->hooks));
    /* (a sync 0 backward started nothing: no wait) */
    if (last) CALL(s, VH_ROLE_SHARDING, "sharding.wait", s->sharding->wait(sharding));
    PHASE_END(s, clock, VH_STEP_PHASE_BACKWARD);
    *dev_loss = out.loss;
    return VH_STATUS_OK;
}

static vh_status step_end(vh_session *s, int64_t step, double *lr, int *skipped,
                          phase_clock *clock, vh_diag *d) {
    void *sharding = s->self[VH_ROLE_SHARDING], *precision = s->self[VH_ROLE_PRECISION];
    int found_inf = 0;
    CALL(s, VH_ROLE_PRECISION, "precision.unscale_and_check",
         s->precision->unscale_and_check(precision, &s->slices, &found_inf));
    *skipped = found_inf;
    /* The sum of squares goes to the optimizer in its args (ABI 2.1), never
     * into the sharding plugin's slice list (which has one writer). */
    vh_optim_step_args args = {.struct_size = sizeof args, .slices = &s->slices, .step = step};
    if (!found_inf && s->precision->grad_sum_sq) {
        int has = 0;
        double sum_sq = 0.0;
        CALL(s, VH_ROLE_PRECISION, "precision.grad_sum_sq",
             s->precision->grad_sum_sq(precision, &sum_sq, &has));
        args.has_grad_sum_sq = has != 0;
        args.grad_sum_sq = has ? sum_sq : 0.0;
    }
    if (!found_inf) {
        if (s->optim->update) {
            session_optim_args(s, &args);
            CALL(s, VH_ROLE_OPTIM, "optim.update",
                 s->optim->update(s->self[VH_ROLE_OPTIM], &args, lr));
        } else {
            CALL(s, VH_ROLE_OPTIM, "optim.step",
                 s->optim->step(s->self[VH_ROLE_OPTIM], &s->slices, step, lr));
        }
        /* An optimizer that wrote the compute copies leaves the sharding
         * plugin the rest of refresh (ABI 2.9). */
        if ((s->optim_caps & VH_OPTIM_CAP_WRITES_COMPUTE) && s->sharding->refresh_updated)
            CALL(s, VH_ROLE_SHARDING, "sharding.refresh_updated",
                 s->sharding->refresh_updated(sharding));
        else
            CALL(s, VH_ROLE_SHARDING, "sharding.refresh", s->sharding->refresh(sharding));
    } else {
        session_trace(s, "optim.step skipped: gradients overflowed");
    }
    CALL(s, VH_ROLE_PRECISION, "precision.update", s->precision->update(precision, found_inf));
    PHASE_END(s, clock, VH_STEP_PHASE_OPTIMIZER);
    return VH_STATUS_OK;
}

vh_status session_step_begin(vh_session *s, vh_diag *d) {
    return session_step_begin_timed(s, NULL, d);
}

vh_status session_step_micro(vh_session *s, const vh_batch *batch, int64_t micro,
                             int64_t count, const float **dev_loss, vh_diag *d) {
    return session_step_micro_timed(s, batch, micro, count, dev_loss, NULL, d);
}

vh_status session_step_end(vh_session *s, int64_t step, double *lr, int *skipped, vh_diag *d) {
    return session_step_end_timed(s, step, lr, skipped, NULL, d);
}

/* The three parts, with the clock on when phases is not NULL (`vithost
 * bench` with run.grad_accum > 1): each call starts the clock; zero_grads
 * counts as forward. */
vh_status session_step_begin_timed(vh_session *s, vh_step_phases *phases, vh_diag *d) {
    phase_clock clock = {0};
    phase_start(s, &clock, phases);
    vh_status st = step_begin(s, &clock, d);
    if (st == VH_STATUS_OK) st = phase_end(s, &clock, VH_STEP_PHASE_FORWARD, d);
    return st;
}

vh_status session_step_micro_timed(vh_session *s, const vh_batch *batch, int64_t micro,
                                   int64_t count, const float **dev_loss,
                                   vh_step_phases *phases, vh_diag *d) {
    phase_clock clock = {0};
    phase_start(s, &clock, phases);
    return step_micro(s, batch, micro, count, dev_loss, &clock, d);
}

vh_status session_step_end_timed(vh_session *s, int64_t step, double *lr, int *skipped,
                                 vh_step_phases *phases, vh_diag *d) {
    phase_clock clock = {0};
    phase_start(s, &clock, phases);
    return step_end(s, step, lr, skipped, &clock, d);
}

vh_status session_step(vh_session *s, const vh_batch *batch, int64_t step,
                       const float **dev_loss, double *lr, int *skipped, vh_diag *d) {
    return session_step_timed(s, batch, step, dev_loss, lr, skipped, NULL, d);
}

vh_status session_step_timed(vh_session *s, const vh_batch *batch, int64_t step,
                             const float **dev_loss, double *lr, int *skipped,
                             vh_step_phases *phases, vh_diag *d) {
    phase_clock clock;
    phase_start(s, &clock, phases);
    vh_status st = step_begin(s, &clock, d);
    if (st == VH_STATUS_OK) st = step_micro(s, batch, 0, 1, dev_loss, &clock, d);
    if (st == VH_STATUS_OK) st = step_end(s, step, lr, skipped, &clock, d);
    return st;
}
