/* vh_testhost.h - a small host for a plugin's own unit tests (libvhtesthost).
 *
 * A plugin's tests link this library (CMake: vithost::testhost; pkg-config:
 * vithost-testhost) instead of running the vithost executable. It loads the
 * plugin (dlopen, or a descriptor linked into the test), gives it a vh_host
 * of its own: config values from "key=value" strings checked against the
 * plugin's schema (defaults filled in), the SDK's CPU device and one-process
 * communicator, log lines kept in a buffer, the failure message kept for the
 * test. It creates the plugin and runs its calls on tiny tensors:
 *
 *     vh_testhost *th;
 *     char err[512];
 *     if (vh_testhost_open("build/my_sgd.so", &th, err, sizeof err)) { puts(err); ... }
 *     vh_testhost_set(th, "momentum=0.9");                  // schema-checked
 *     vh_testhost_set(th, "lr=0.1");                        // a shared key (2.1)
 *     int t = vh_testhost_optim_add(th, 4, VH_PARAM_FLAG_DECAY, (float[]){1, 2, 3, 4});
 *     vh_testhost_create(th, NULL);                         // the role's default setup
 *     vh_testhost_optim_grad(th, t)[0] = 0.5f;
 *     vh_testhost_optim_step(th, NULL, NULL);               // step 0, the schedule's rate
 *     ... vh_testhost_optim_values(th, t)[0] ...
 *     vh_testhost_state_roundtrip(th);                      // save, new instance, load
 *     vh_testhost_close(th);
 *
 * Every call returning vh_status leaves its message (the plugin's, through
 * fail/config_fail, or the test host's own) in vh_testhost_error. One
 * instance of one plugin per vh_testhost; single-threaded, as the host's
 * main thread is. Not part of the plugin ABI: plugins never link it.
 */
#ifndef VITHOST_VH_TESTHOST_H
#define VITHOST_VH_TESTHOST_H

#include <stddef.h>
#include <stdint.h>

#include "vithost.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vh_testhost vh_testhost;

/* Loads a plugin file: a path (with a '/' or ending in ".so"), or a plugin
 * name looked up as <name>.so in $VITHOST_PLUGIN_PATH. Checks the
 * descriptor's magic, ABI major and minor (<= this SDK's), and fills every
 * schema default. On failure *out is NULL and err says why. */
VH_SDK_API vh_status vh_testhost_open(const char *plugin, vh_testhost **out, char *err,
                                      size_t err_len);
/* The same for a descriptor the test links in (e.g. `extern const
 * vh_plugin_descriptor vh_plugin;` with the plugin's sources in the test). */
VH_SDK_API vh_status vh_testhost_open_descriptor(const vh_plugin_descriptor *desc,
                                                 vh_testhost **out, char *err, size_t err_len);
/* Destroys the instance (if any), frees the tensors, closes the file. */
VH_SDK_API void vh_testhost_close(vh_testhost *th);

VH_SDK_API const vh_plugin_descriptor *vh_testhost_descriptor(const vh_testhost *th);
/* The vh_host the plugin is given, and its instance (NULL before create). */
VH_SDK_API vh_host *vh_testhost_host(vh_testhost *th);
VH_SDK_API void *vh_testhost_self(const vh_testhost *th);
/* The last failure's message; "" when none. */
VH_SDK_API const char *vh_testhost_error(const vh_testhost *th);
/* Every line logged so far, "<level>: <message>\n" each ("error", "warning",
 * "info", "debug"); clear forgets them. */
VH_SDK_API const char *vh_testhost_log(const vh_testhost *th);
VH_SDK_API void vh_testhost_log_clear(vh_testhost *th);

/* One config value, "key=value" (a value as the recipe's YAML scalar would
 * be written: 0.1, true, adamw, a path), checked as the host checks a
 * recipe: an unknown key, a wrong type, a value out of range or outside the
 * enum's choices is refused (VH_STATUS_ERR_CONFIG). The plugin reads it at
 * its next create. A 2.1 optimizer's schema has the SDK's shared keys too
 * (lr, weight_decay, schedule, ...: vh_optim_schedule.h), as under vithost. */
VH_SDK_API vh_status vh_testhost_set(vh_testhost *th, const char *key_value);
/* What host->api->seed returns (default 0). */
VH_SDK_API void vh_testhost_set_seed(vh_testhost *th, uint64_t seed);

/* Creates the instance. `setup` is the role's setup struct (vh_model_setup,
 * vh_optim_setup, vh_data_setup; NULL for precision and sharding, whose
 * create takes none) and is copied, so state_roundtrip can create again.
 * NULL gives a default: model 1x8x8 images, 4 classes, batches of 4, fp32;
 * optim 100 total steps, fp32, the table of the tensors added so far; data
 * rank 0 of 1, batches of 4, the seed. Refused when required keys are unset
 * or an instance exists. */
VH_SDK_API vh_status vh_testhost_create(vh_testhost *th, const void *setup);
/* Destroys the instance; no-op without one. */
VH_SDK_API void vh_testhost_destroy(vh_testhost *th);

/* The instance's scalar state (state_size + state_save), in a buffer the
 * caller frees with free(); *bytes 0 and *buf NULL when the plugin keeps
 * none. Model, precision, optim and data roles (sharding saves through
 * vh_state_io: VH_STATUS_ERR_UNSUPPORTED). */
VH_SDK_API vh_status vh_testhost_state_save(vh_testhost *th, void **buf, size_t *bytes);
VH_SDK_API vh_status vh_testhost_state_load(vh_testhost *th, const void *buf, size_t bytes);
/* A resume in one call: saves the state, destroys the instance, creates a
 * new one with the same setup and config, loads the state into it and
 * saves again; the two saves must be the same bytes (VH_STATUS_ERR_INTERNAL
 * names the first difference). The new instance stays for the test. */
VH_SDK_API vh_status vh_testhost_state_roundtrip(vh_testhost *th);

/* ---- optim ------------------------------------------------------------------
 * Tensors are f32, each one parameter (unit 0, param = its index) handed to
 * the optimizer as one slice: values, grad (zeros) and
 * VH_OPTIM_MAX_STATE_SLOTS state arrays (zeros, as a sharding plugin
 * allocates them). They outlive instances, as the sharding plugin's buffers
 * outlive a resume. Add them before create (the default setup's table). */

/* A tensor of `count` values (NULL: zeros) with VH_PARAM_FLAG_* flags; its
 * index, or -1 when out of memory or count < 1. */
VH_SDK_API int vh_testhost_optim_add(vh_testhost *th, int64_t count, uint32_t flags,
                                     const float *values);
/* Its memory, count floats each; NULL for an unknown tensor or slot. */
VH_SDK_API float *vh_testhost_optim_values(vh_testhost *th, int tensor);
VH_SDK_API float *vh_testhost_optim_grad(vh_testhost *th, int tensor);
VH_SDK_API float *vh_testhost_optim_state(vh_testhost *th, int tensor, int slot);
/* Slice items of `item_size` bytes (>= VH_PARAM_SLICE_SIZE_2_0; default
 * sizeof(vh_param_slice)): a larger one is what a newer sharding plugin
 * hands over; its extra bytes are filled with a pattern the optimizer must
 * not depend on. */
VH_SDK_API vh_status vh_testhost_optim_item_size(vh_testhost *th, uint32_t item_size);
/* One optimizer step over every tensor, as the host takes it: update when
 * the plugin has it (ABI 2.1), else step(slices, step) (2.0: the plugin
 * computes its own rate). args NULL: what the host would pass, i.e. the
 * step after the last one (0 first) and, for a 2.1 optimizer, the rate,
 * weight_decay and clip_grad_norm of the SDK schedule read from the config's
 * shared keys (vh_optim_schedule.h) over the setup's total_steps. Otherwise
 * `args` as given (its struct_size and slices are the test host's to set).
 * *lr_out (may be NULL): the rate the plugin reports. */
VH_SDK_API vh_status vh_testhost_optim_step(vh_testhost *th, const vh_optim_step_args *args,
                                            double *lr_out);

/* ---- data --------------------------------------------------------------------
 * Thin calls that also hold each batch to the role's contract (vh_data.h):
 * f32 (B, C, H, W) images and i32 (B) labels in [0, num_classes), C, H, W
 * as info says, 0 < B <= the batch size, full batches in a training pass. */
VH_SDK_API vh_status vh_testhost_data_info(vh_testhost *th, vh_data_info *out);
VH_SDK_API vh_status vh_testhost_data_start(vh_testhost *th, vh_split split, int64_t epoch);
VH_SDK_API vh_status vh_testhost_data_next(vh_testhost *th, vh_batch *out, int *has_batch);
/* A whole pass: start, then next until the end; batches and samples
 * yielded (either may be NULL). */
VH_SDK_API vh_status vh_testhost_data_pass(vh_testhost *th, vh_split split, int64_t epoch,
                                           int64_t *batches, int64_t *samples);

#ifdef __cplusplus
}
#endif
#endif
