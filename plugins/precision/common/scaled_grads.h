/* scaled_grads.h - what the loss-scaled policies of this tree (amp, fp16)
 * share: the scaler's recipe keys, the overflow check with the gradients'
 * sum of squares, and the step-skipped message. Compiled into each plugin
 * (not part of the SDK; the SDK parts are vh_loss_scaler.h). */
#ifndef VITHOST_PLUGINS_SCALED_GRADS_H
#define VITHOST_PLUGINS_SCALED_GRADS_H

#include "vithost/vh_host.h"
#include "vithost/vh_loss_scaler.h"
#include "vithost/vh_params.h"

typedef struct scaled_grads {
    vh_host *host;
    vh_loss_scaler scaler;
    vh_grad_check *check;
    double sum_sq;  /* of the last check */
    int has_sum_sq;
} scaled_grads;

/* Reads the scaler's keys (init_scale, growth_factor, backoff_factor,
 * growth_interval, min_scale, max_scale) for loss_scaling `mode`: "dynamic",
 * "static" (a fixed init_scale) or "none" (a fixed scale of 1). Keys the
 * mode does not read are allowed (switching one line must not break a
 * recipe) but said. Then creates the overflow check. */
vh_status scaled_grads_init(scaled_grads *g, vh_host *host, const char *mode);
/* NULL-safe, and safe after a failed init. */
void scaled_grads_free(scaled_grads *g);

/* The precision vtable's calls, for a plugin to forward to. */
vh_status scaled_grads_unscale_and_check(scaled_grads *g, const vh_param_slices *grads,
                                         int *found_inf);
void scaled_grads_sum_sq(const scaled_grads *g, double *out, int *has);
/* The scaler's rule after a step, and the skipped step's message: info while
 * a dynamic scale calibrates, a warning where a smaller scale cannot help. */
void scaled_grads_update(scaled_grads *g, int found_inf);

#endif
