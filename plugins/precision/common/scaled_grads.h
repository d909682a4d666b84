/* scaled_grads.h - what the loss-scaled policies of this tree (amp, fp16)
 * share: the scaler's recipe keys, the overflow check with the gradients'
 * sum of squares, and the step-skipped message. Compiled into each plugin
 * (not part of the SDK; the SDK parts are vh_loss_scaler.h). */
#ifndef VITHOST_PLUGINS_SCALED_GRADS_H
#define VITHOST_PLUGINS_SCALED_GRADS_H

#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_loss_scaler.h"
#include "vithost/vh_params.h"

/* The scaler's rows of a plugin's schema (what scaled_grads_init reads);
 * the plugin's own loss_scaling row says what its auto means. */
#define SCALED_GRADS_SCHEMA_KEYS                                                                 \
    {"init_scale", VH_CONFIG_TYPE_FLOAT, "65536", "dynamic, static: the first loss scale", NULL, \
     1.2e-38, 3.4e38, 0},                                                                        \
    {"growth_factor", VH_CONFIG_TYPE_FLOAT, "2", "dynamic: the scale's factor at each growth",   \
     NULL, 1, 1e6, 0},                                                                           \
    {"backoff_factor", VH_CONFIG_TYPE_FLOAT, "0.5",                                              \
     "dynamic: the scale's factor on an overflow, in (0, 1)", NULL, 0, 1, 0},                    \
    {"growth_interval", VH_CONFIG_TYPE_INT, "2000",                                              \
     "dynamic: steps in a row without overflow before the scale grows", NULL, 1, 1e15, 0},       \
    {"min_scale", VH_CONFIG_TYPE_FLOAT, "1",                                                     \
     "dynamic: the scale never backs off below this; an overflow at it is a real Inf/NaN", NULL, \
     1.2e-38, 3.4e38, 0},                                                                        \
    {"max_scale", VH_CONFIG_TYPE_FLOAT, "16777216", "dynamic: the scale never grows above this", \
     NULL, 1.2e-38, 3.4e38, 0}

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
