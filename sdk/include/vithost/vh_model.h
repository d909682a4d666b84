/* vh_model.h - the model role: parameter table, forward, backward, FLOPs.
 *
 * The model reads its parameters and writes its gradients only through the
 * vh_unit_hooks it is given, unit by unit, so it never knows how they are
 * sharded. Forward computes the loss (softmax cross-entropy) and the logits;
 * backward starts from d(loss)/d(loss) = loss_scale.
 */
#ifndef VITHOST_VH_MODEL_H
#define VITHOST_VH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "vh_data.h"
#include "vh_host.h"
#include "vh_params.h"
#include "vh_precision.h"
#include "vh_sharding.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_mode {
    VH_MODE_TRAIN = 0, /* dropout on, activations kept for backward */
    VH_MODE_EVAL = 1,
} vh_mode;

/* What the host knows before the model is created. */
typedef struct vh_model_setup {
    uint32_t struct_size;
    int32_t channels, height, width; /* from the data plugin */
    int32_t num_classes;             /* from the data plugin */
    int64_t max_batch;               /* per rank */
    vh_precision_policy policy;
} vh_model_setup;

typedef struct vh_model_output {
    uint32_t struct_size; /* set by the caller */
    float loss;       /* mean over the batch */
    vh_tensor logits; /* (B, num_classes) f32 on the device; owned by the model */
} vh_model_output;

typedef struct vh_model_vtable {
    uint32_t struct_size;
    vh_status (*create)(vh_host *host, const vh_model_setup *setup, void **self);
    void (*destroy)(void *self);
    /* Valid until destroy. */
    const vh_param_table *(*param_table)(void *self);
    /* Writes a unit's initial fp32 values (table order) from a seed. */
    vh_status (*init_unit)(void *self, int32_t unit, float *values, uint64_t seed);
    vh_status (*forward)(void *self, const vh_batch *batch, vh_mode mode,
                         const vh_unit_hooks *hooks, vh_model_output *out);
    /* Gradients of the last VH_MODE_TRAIN forward, times loss_scale. */
    vh_status (*backward)(void *self, float loss_scale, const vh_unit_hooks *hooks);
    /* Training FLOPs of one image: 3 x forward = 6 x every matmul's MACs,
     * attention's included (the pycls convention). */
    double (*train_flops_per_image)(void *self);
    /* State beyond the parameters that a resumed run needs to continue
     * exactly (e.g. the counter behind dropout masks); may be 0 bytes. */
    vh_status (*state_size)(void *self, size_t *bytes);
    vh_status (*state_save)(void *self, void *buf, size_t bytes);
    vh_status (*state_load)(void *self, const void *buf, size_t bytes);
} vh_model_vtable;

#ifdef __cplusplus
}
#endif
#endif
