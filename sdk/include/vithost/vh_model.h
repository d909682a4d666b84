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
    const vh_precision_policy *policy;
    int32_t rank, world_size;        /* random draws (dropout) differ per rank */
} vh_model_setup;

typedef struct vh_model_output {
    uint32_t struct_size; /* set by the caller */
    /* The mean loss over the batch: one f32 in device memory, owned by the
     * model and valid until the next forward; the host copies it back only
     * when it needs the number. */
    const float *loss;
    vh_tensor logits; /* (B, num_classes) on the device, any float dtype; owned by the model */
} vh_model_output;

/* ---- named weights ----------------------------------------------------------
 * A weights file (safetensors, under the model's own names) as the host
 * opened it. The model looks up the tensors it wants; the host reports the
 * rest as ignored. */
typedef struct vh_weights_source {
    uint32_t struct_size;
    void *ctx;
    const char *path;   /* for messages */
    /* 1 and a host-memory view when the file has `name`, 0 when not.
     * @owns(the host: read-only f32 data the model never frees)
     * @lifetime(the view, like src itself, until load_weights returns: copy
     * what the model keeps) @thread(main: inside load_weights only) */
    int (*find)(void *ctx, const char *name, vh_tensor *out);
} vh_weights_source;

typedef enum vh_weights_mode {
    /* Every parameter must be in the file with its exact shape (resume,
     * evaluation). */
    VH_WEIGHTS_MODE_STRICT = 0,
    /* Starting a run from pretrained weights: the model decides what it
     * re-initialises (e.g. a head of another class count). */
    VH_WEIGHTS_MODE_PRETRAINED = 1,
} vh_weights_mode;

/* What the model did with each of its parameters, told to the host. */
typedef enum vh_weights_action {
    VH_WEIGHTS_ACTION_LOADED = 0,
    VH_WEIGHTS_ACTION_REINITIALISED = 1,
} vh_weights_action;

typedef struct vh_weights_report {
    uint32_t struct_size;
    void *ctx;
    /* why: one phrase, e.g. "file has 1000 classes, the data 10". */
    void (*record)(void *ctx, const char *param_name, vh_weights_action action,
                   const char *why);
} vh_weights_report;

/* Marks, for every call (checked against the host by test_abi_marks):
 * @required / @optional(default: what the host does when it is NULL or
 * past vtable_size) and, where it matters, who owns what and how long it
 * lives. @thread(main) for every call: the host calls the model from its
 * main thread, one call at a time; the hooks the model is given are to be
 * called from that thread too, inside forward / backward. */
typedef struct vh_model_vtable {
    uint32_t struct_size;
    /* @required. *self is the plugin's; freed by destroy. */
    vh_status (*create)(vh_host *host, const vh_model_setup *setup, void **self);
    /* @required. */
    void (*destroy)(void *self);
    /* @required. @owns(the model) @lifetime(until destroy). */
    const vh_param_table *(*param_table)(void *self);
    /* @required. Writes a unit's initial fp32 values (table order) from a
     * seed; `values` is the host's, for the call only. */
    vh_status (*init_unit)(void *self, int32_t unit, float *values, uint64_t seed);
    /* @required. out->loss and out->logits: @owns(the model)
     * @lifetime(until the next forward or destroy). */
    vh_status (*forward)(void *self, const vh_batch *batch, vh_mode mode,
                         const vh_unit_hooks *hooks, vh_model_output *out);
    /* @required. Gradients of the last VH_MODE_TRAIN forward, times loss_scale. */
    vh_status (*backward)(void *self, float loss_scale, const vh_unit_hooks *hooks);
    /* @optional(default: 0, FLOPs unknown: the host prints no TFLOP/s or
     * MFU figure). Training FLOPs of one image: 3 x forward = 6 x every
     * matmul's MACs, attention's included (the pycls convention). */
    double (*train_flops_per_image)(void *self);
    /* @optional(default: 0 bytes). State beyond the parameters that a
     * resumed run needs to continue exactly (e.g. the counter behind
     * dropout masks); may be 0 bytes. */
    vh_status (*state_size)(void *self, size_t *bytes);
    /* @optional(default: saves nothing; any size but 0 is refused). */
    vh_status (*state_save)(void *self, void *buf, size_t bytes);
    /* @optional(default: accepts only 0 bytes; model state in a checkpoint
     * was written by another plugin and is refused, VH_STATUS_ERR_FORMAT). */
    vh_status (*state_load)(void *self, const void *buf, size_t bytes);
    /* @optional(default: *path = NULL, the init rules). The weights file the
     * recipe asks the run to start from (the model's own key, e.g. vit's
     * `pretrained`), or *path = NULL for the init rules.
     * @owns(the model) @lifetime(until destroy; a config_string result will do). */
    vh_status (*initial_weights)(void *self, const char **path);
    /* @optional(default: the host loads every parameter by its own name and
     * exact shape, in either mode; a tensor missing or of another shape is an
     * error). Fills a unit's full fp32 values (table order; they hold the init
     * rules' values on entry) from `src`, recording each parameter's action
     * in `report`. A parameter the file lacks or has in another shape is an
     * error in STRICT mode; in PRETRAINED mode the model may keep its init
     * and record REINITIALISED, saying why. src, report and their views:
     * @lifetime(this call). */
    vh_status (*load_weights)(void *self, int32_t unit, const vh_weights_source *src,
                              vh_weights_mode mode, float *values,
                              const vh_weights_report *report);
    /* @optional(default: not called; the memory report has no activations
     * figure). Bytes of device memory the model holds for activations
     * (forward's saved tensors and backward's scratch) at max_batch, for
     * the run's memory report. */
    vh_status (*activation_bytes)(void *self, int64_t *out);
} vh_model_vtable;

#ifdef __cplusplus
}
#endif
#endif
