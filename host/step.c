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
 *   optim.step on the local slices (skipped on overflow), sharding.refresh
 *   precision.update
 *
 * The batch comes from session_next_batch (data.next, copied to the device).
 * The loss stays in device memory: the loop copies it back only on the steps
 * it logs.
 */
#include "session.h"

const char vh_step_order[] =
    "data.next, sharding.zero_grads, model.forward (sharding.gather/release per unit), "
    "precision.loss_scale, model.backward (sharding.gather/grads/reduce/release per unit, "
    "reversed), sharding.wait, precision.unscale_and_check, precision.grad_sum_sq (if it "
    "has it), optim.step (skipped on overflow), sharding.refresh, precision.update";

#define CALL(s, role, call, expr)                                                   \
    do {                                                                            \
        session_trace((s), "%s", (call));                                           \
        vh_status st_ = (expr);                                                     \
        if (st_ != VH_STATUS_OK) return session_plugin_error((s), (role), st_, (call), d); \
    } while (0)

vh_status session_step(vh_session *s, const vh_batch *batch, int64_t step,
                       const float **dev_loss, double *lr, int *skipped, vh_diag *d) {
    vh_model_output out = {.struct_size = sizeof out};
    void *sharding = s->self[VH_ROLE_SHARDING], *precision = s->self[VH_ROLE_PRECISION];
    CALL(s, VH_ROLE_SHARDING, "sharding.zero_grads", s->sharding->zero_grads(sharding));
    CALL(s, VH_ROLE_MODEL, "model.forward",
         s->model->forward(s->self[VH_ROLE_MODEL], batch, VH_MODE_TRAIN, &s->hooks, &out));
    session_trace(s, "precision.loss_scale");
    float scale = s->precision->loss_scale(precision);
    CALL(s, VH_ROLE_MODEL, "model.backward",
         s->model->backward(s->self[VH_ROLE_MODEL], scale, &s->hooks));
    CALL(s, VH_ROLE_SHARDING, "sharding.wait", s->sharding->wait(sharding));
    int found_inf = 0;
    CALL(s, VH_ROLE_PRECISION, "precision.unscale_and_check",
         s->precision->unscale_and_check(precision, &s->slices, &found_inf));
    *skipped = found_inf;
    s->slices.has_grad_sum_sq = 0;
    s->slices.grad_sum_sq = 0.0;
    if (!found_inf && s->precision->grad_sum_sq) {
        int has = 0;
        double sum_sq = 0.0;
        CALL(s, VH_ROLE_PRECISION, "precision.grad_sum_sq",
             s->precision->grad_sum_sq(precision, &sum_sq, &has));
        s->slices.has_grad_sum_sq = has != 0;
        s->slices.grad_sum_sq = has ? sum_sq : 0.0;
    }
    if (!found_inf) {
        CALL(s, VH_ROLE_OPTIM, "optim.step",
             s->optim->step(s->self[VH_ROLE_OPTIM], &s->slices, step, lr));
        CALL(s, VH_ROLE_SHARDING, "sharding.refresh", s->sharding->refresh(sharding));
    } else {
        session_trace(s, "optim.step skipped: gradients overflowed");
    }
    CALL(s, VH_ROLE_PRECISION, "precision.update", s->precision->update(precision, found_inf));
    *dev_loss = out.loss;
    return VH_STATUS_OK;
}
