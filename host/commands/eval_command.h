/* eval_command.h - `vithost eval`: weights (a run folder, a checkpoint
 * folder or a .safetensors file) evaluated on the eval split, one JSON
 * object printed. */
#ifndef VITHOST_HOST_EVAL_COMMAND_H
#define VITHOST_HOST_EVAL_COMMAND_H

#include <stdio.h>

#include "diag.h"
#include "runtime.h"

vh_status eval_command(vh_run *run, const char *weights, FILE *out, vh_diag *d);

#endif
