/* weights.h - the model's parameters and the optimizer's per-element state
 * as safetensors files under the model's own (timm) names, so a checkpoint
 * opens in PyTorch and a PyTorch/timm file can start a run. */
#ifndef VITHOST_HOST_WEIGHTS_H
#define VITHOST_HOST_WEIGHTS_H

#include "trainer.h"

typedef enum vh_weights_mode {
    /* Every parameter must be in the file with its exact shape. */
    VH_WEIGHTS_MODE_STRICT = 0,
    /* Fine-tuning: a head of another class count keeps its fresh init, and
     * tensors the model does not have are reported and ignored. */
    VH_WEIGHTS_MODE_PRETRAINED = 1,
} vh_weights_mode;

vh_status weights_save_model(vh_trainer *t, const char *path, vh_diag *d);
vh_status weights_load_model(vh_trainer *t, const char *path, vh_weights_mode mode, vh_diag *d);

/* The optimizer's state slots, one tensor per parameter and slot, named
 * "<param>.optim_state.<slot>". Needs the whole of every parameter on this
 * rank (true without sharding of optimizer state). */
vh_status weights_save_optim(vh_trainer *t, const char *path, vh_diag *d);
vh_status weights_load_optim(vh_trainer *t, const char *path, vh_diag *d);

#endif
