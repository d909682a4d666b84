/* scaled_core.c - the loss-scaled precision core of amp and fp16
 * (scaled_core.h). */
#include "scaled_core.h"

#include <string.h>

#include "precision_io.h"
#include "scaled_grads.h"
#include "vithost/vh_loss_scaler.h"

typedef struct scaled_core {
    vh_host *host;
    const scaled_spec *spec;
    scaled_config config;
    scaled_grads sg; /* the scaler, the overflow check, the last sum of squares */
} scaled_core;

vh_status scaled_core_string(vh_host *host, const char *key, const char **out) {
    vh_status st = host->api->config_string(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read the key '%s'", key);
}

vh_status scaled_core_bool(vh_host *host, const char *key, int *out) {
    vh_status st = host->api->config_bool(host, key, out);
    return st == VH_STATUS_OK
               ? st
               : host->api->fail(host, st, "cannot read the bool key '%s'", key);
}

vh_status scaled_core_wire_keys(vh_host *host, const char **reduce_dtype,
                                const char **loss_scaling) {
    vh_status st = scaled_core_string(host, "reduce_dtype", reduce_dtype);
    return st == VH_STATUS_OK ? scaled_core_string(host, "loss_scaling", loss_scaling) : st;
}

vh_status scaled_core_create(vh_host *host, void **self, const scaled_spec *spec) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    scaled_config config;
    memset(&config, 0, sizeof config);
    vh_status st = spec->configure(host, &config);
    if (st != VH_STATUS_OK) return st;

    scaled_core *c = host->api->alloc(host, sizeof *c);
    if (!c) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(c, 0, sizeof *c);
    c->host = host;
    c->spec = spec;
    c->config = config;
    st = scaled_grads_init(&c->sg, host, config.mode);
    if (st != VH_STATUS_OK) {
        scaled_core_destroy(c);
        return st;
    }
    /* A fixed scale of 1 (loss_scaling none) leaves the gradients' bits
     * alone, so a sharding plugin may hand them to the optimizer as they are
     * (ABI 2.9). A fixed scale survives state_load (the config's wins). */
    c->config.policy.unit_loss_scale = c->sg.scaler.fixed && c->sg.scaler.scale == 1.0f;
    if (config.policy.grad_dtype == VH_DTYPE_F16 && strcmp(config.mode, "none") == 0)
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "fp16 without loss scaling: gradients below 2^-24 become zero "
                       "(loss_scaling: dynamic is %s)",
                       spec->default_note);
    spec->describe(host, &c->config, (double)c->sg.scaler.scale);
    *self = c;
    return VH_STATUS_OK;
}

void scaled_core_destroy(void *self) {
    scaled_core *c = self;
    if (!c) return;
    scaled_grads_free(&c->sg);
    c->host->api->free(c->host, c);
}

vh_status scaled_core_policy(void *self, vh_precision_policy *out) {
    scaled_core *c = self;
    if (!c || !out) return VH_STATUS_ERR_INVALID_ARG;
    return precision_policy_out(c->host, out, &c->config.policy);
}

float scaled_core_loss_scale(void *self) {
    const scaled_core *c = self;
    return c ? vh_loss_scaler_scale(&c->sg.scaler) : 1.0f;
}

vh_status scaled_core_unscale_and_check(void *self, const vh_param_slices *grads,
                                        int *found_inf) {
    scaled_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    return scaled_grads_unscale_and_check(&c->sg, grads, found_inf);
}

vh_status scaled_core_grad_sum_sq(void *self, double *out, int *has) {
    scaled_core *c = self;
    if (!c || !out || !has) return VH_STATUS_ERR_INVALID_ARG;
    scaled_grads_sum_sq(&c->sg, out, has);
    return VH_STATUS_OK;
}

vh_status scaled_core_update(void *self, int found_inf) {
    scaled_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    scaled_grads_update(&c->sg, found_inf);
    return VH_STATUS_OK;
}

/* ---- state: the policy word and the scaler, so a resume continues bit for bit */

#define STATE_VERSION 1u
#define STATE_BYTES (sizeof(precision_state_header) + VH_LOSS_SCALER_STATE_BYTES)

vh_status scaled_core_state_size(void *self, size_t *bytes) {
    if (!self || !bytes) return VH_STATUS_ERR_INVALID_ARG;
    *bytes = STATE_BYTES;
    return VH_STATUS_OK;
}

vh_status scaled_core_state_save(void *self, void *buf, size_t bytes) {
    scaled_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    const precision_state_header h = {c->spec->state_magic, STATE_VERSION, c->config.state_word,
                                      0};
    vh_status st = precision_state_save_header(c->host, buf, bytes, STATE_BYTES, &h);
    if (st != VH_STATUS_OK) return st;
    return vh_loss_scaler_state_save(&c->sg.scaler, (char *)buf + sizeof h, bytes - sizeof h,
                                     c->host);
}

vh_status scaled_core_state_load(void *self, const void *buf, size_t bytes) {
    scaled_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    precision_state_header h;
    vh_status st = precision_state_load_header(c->host, c->spec->name, c->spec->state_magic,
                                               STATE_VERSION, buf, bytes, STATE_BYTES, &h);
    if (st != VH_STATUS_OK) return st;
    st = vh_loss_scaler_state_load(&c->sg.scaler, (const char *)buf + sizeof h, bytes - sizeof h,
                                   c->host);
    if (st != VH_STATUS_OK) return st;
    c->spec->resumed(c->host, &c->config, h.word);
    return VH_STATUS_OK;
}
