/* train.h - the training loop: DESIGN.md's step, driven through the five
 * roles' vtables, with evaluation and progress lines. */
#ifndef VITHOST_HOST_TRAIN_H
#define VITHOST_HOST_TRAIN_H

#include "diag.h"
#include "runtime.h"

/* Trains the opened run to its end. With run->opts.trace every plugin call is
 * printed as "trace: role.function ..." in the order it happens. */
vh_status train_run(vh_run *run, vh_diag *d);

/* The order of one training step, as printed at the start of a run. */
extern const char vh_step_order[];

#endif
