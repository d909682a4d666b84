/* weights.c - parameters and optimizer state <-> safetensors. */
#define _POSIX_C_SOURCE 200809L
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

/* Full fp32 values of one unit, from the sharding plugin. */
static vh_status fetch_unit(vh_trainer *t, int32_t u, float **out, vh_diag *d) {
    size_t n = (size_t)t->table->units[u].numel;
    *out = malloc((n ? n : 1) * sizeof(float));
    if (!*out) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for unit %d", (int)u);
    vh_status st = t->sharding->store_unit(t->self[VH_ROLE_SHARDING], u, *out);
    if (st != VH_STATUS_OK) {
        free(*out);
        *out = NULL;
        return trainer_plugin_error(t, VH_ROLE_SHARDING, st, "sharding.store_unit", d);
    }
    return VH_STATUS_OK;
}

vh_status weights_save_model(vh_trainer *t, const char *path, vh_diag *d) {
    vh_st_writer w;
    st_writer_init(&w);
    float **units = calloc((size_t)t->table->num_units, sizeof *units);
    vh_status st = units ? VH_STATUS_OK : diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    const vh_plugin_descriptor *model = t->run->plugins[VH_ROLE_MODEL].desc;
    char who[256];
    snprintf(who, sizeof who, "%s %s", model->name, model->version);
    if (st == VH_STATUS_OK) st = st_writer_meta(&w, "format", "pt", d);
    if (st == VH_STATUS_OK) st = st_writer_meta(&w, "vithost_model", who, d);
    for (int32_t u = 0; st == VH_STATUS_OK && u < t->table->num_units; u++) {
        st = fetch_unit(t, u, &units[u], d);
        const vh_unit_desc *unit = &t->table->units[u];
        for (int32_t p = 0; st == VH_STATUS_OK && p < unit->num_params; p++) {
            const vh_param_desc *pd = &unit->params[p];
            st = st_writer_add(&w, pd->name, pd->ndim, pd->shape, units[u] + pd->offset, d);
        }
    }
    if (st == VH_STATUS_OK) st = st_writer_save(&w, path, d);
    for (int32_t u = 0; units && u < t->table->num_units; u++) free(units[u]);
    free(units);
    st_writer_free(&w);
    return st;
}

static int same_shape(const vh_st_tensor *t, const vh_param_desc *p) {
    if (t->ndim != p->ndim) return 0;
    for (int32_t i = 0; i < p->ndim; i++)
        if (t->shape[i] != p->shape[i]) return 0;
    return 1;
}

static void shape_text(char *buf, size_t len, int32_t ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int32_t i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

/* The classifier: the last unit's parameters, the only ones allowed to
 * change shape when fine-tuning on another class count. */
static int is_head_param(const vh_trainer *t, int32_t unit, const vh_param_desc *p) {
    return unit == t->table->num_units - 1 && strncmp(p->name, "head.", 5) == 0;
}

vh_status weights_load_model(vh_trainer *t, const char *path, vh_weights_mode mode, vh_diag *d) {
    vh_st_file f;
    vh_status st = st_read(&f, path, d);
    int used = 0, new_head = 0;
    for (int32_t u = 0; st == VH_STATUS_OK && u < t->table->num_units; u++) {
        float *values = NULL;
        st = fetch_unit(t, u, &values, d); /* fresh init stays where the file has nothing */
        const vh_unit_desc *unit = &t->table->units[u];
        for (int32_t p = 0; st == VH_STATUS_OK && p < unit->num_params; p++) {
            const vh_param_desc *pd = &unit->params[p];
            const vh_st_tensor *ft = st_find(&f, pd->name);
            char want[128], got[128];
            shape_text(want, sizeof want, pd->ndim, pd->shape);
            if (!ft) {
                st = diag_set(d, VH_STATUS_ERR_FORMAT,
                              "%s has no tensor '%s' %s that the %s model needs (is it a "
                              "checkpoint of this model?)",
                              path, pd->name, want, t->run->plugins[VH_ROLE_MODEL].desc->name);
                break;
            }
            used++;
            if (!same_shape(ft, pd)) {
                shape_text(got, sizeof got, ft->ndim, ft->shape);
                if (mode == VH_WEIGHTS_MODE_PRETRAINED && is_head_param(t, u, pd)) {
                    new_head = 1;
                    continue;
                }
                st = diag_set(d, VH_STATUS_ERR_FORMAT,
                              "%s: tensor '%s' is %s, the model has %s (image size, patch "
                              "size or width differ; resizing is not supported)",
                              path, pd->name, got, want);
                break;
            }
            st = st_read_f32(&f, ft, values + pd->offset, pd->numel, d);
        }
        if (st == VH_STATUS_OK) {
            st = t->sharding->load_unit(t->self[VH_ROLE_SHARDING], u, values);
            if (st != VH_STATUS_OK)
                st = trainer_plugin_error(t, VH_ROLE_SHARDING, st, "sharding.load_unit", d);
        }
        free(values);
    }
    if (st == VH_STATUS_OK && used < f.count) {
        if (mode == VH_WEIGHTS_MODE_STRICT) {
            st = diag_set(d, VH_STATUS_ERR_FORMAT,
                          "%s holds %d tensors the model does not have (is it a checkpoint "
                          "of another configuration?)",
                          path, f.count - used);
        } else {
            fprintf(t->out, "vithost: %s: ignoring %d tensor(s) the model does not have\n",
                    path, f.count - used);
        }
    }
    if (st == VH_STATUS_OK && new_head)
        fprintf(t->out, "vithost: %s: the head was trained for another class count; it starts "
                        "fresh (%d classes)\n",
                path, (int)t->info.num_classes);
    st_free(&f);
    return st;
}

/* Visits each slice of each slot: copies between the slices' state and a
 * per-parameter buffer. to_slices: buffer -> state. */
static void copy_state(vh_trainer *t, int32_t unit, int32_t param, int32_t slot, float *buf,
                       int to_slices) {
    for (int32_t i = 0; i < t->slices.count; i++) {
        vh_param_slice *s = vh_param_slices_at(&t->slices, i);
        if (s->unit != unit || s->param != param) continue;
        float *state = s->state[slot];
        if (to_slices) memcpy(state, buf + s->offset, (size_t)s->count * sizeof(float));
        else memcpy(buf + s->offset, state, (size_t)s->count * sizeof(float));
    }
}

static void state_name(char *buf, size_t len, const char *param, int32_t slot) {
    snprintf(buf, len, "%s.optim_state.%d", param, (int)slot);
}

vh_status weights_save_optim(vh_trainer *t, const char *path, vh_diag *d) {
    vh_st_writer w;
    st_writer_init(&w);
    int64_t total = t->table->numel * t->state_slots;
    float *all = malloc((size_t)(total ? total : 1) * sizeof(float));
    vh_status st = all ? VH_STATUS_OK : diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    if (st == VH_STATUS_OK) st = st_writer_meta(&w, "format", "vithost-optim", d);
    float *next = all;
    for (int32_t u = 0; st == VH_STATUS_OK && u < t->table->num_units; u++) {
        const vh_unit_desc *unit = &t->table->units[u];
        for (int32_t p = 0; st == VH_STATUS_OK && p < unit->num_params; p++) {
            const vh_param_desc *pd = &unit->params[p];
            for (int32_t k = 0; st == VH_STATUS_OK && k < t->state_slots; k++) {
                copy_state(t, u, p, k, next, 0);
                char name[512];
                state_name(name, sizeof name, pd->name, k);
                st = st_writer_add(&w, name, pd->ndim, pd->shape, next, d);
                next += pd->numel;
            }
        }
    }
    if (st == VH_STATUS_OK) st = st_writer_save(&w, path, d);
    free(all);
    st_writer_free(&w);
    return st;
}

vh_status weights_load_optim(vh_trainer *t, const char *path, vh_diag *d) {
    vh_st_file f;
    vh_status st = st_read(&f, path, d);
    int expected = 0;
    for (int32_t u = 0; st == VH_STATUS_OK && u < t->table->num_units; u++) {
        const vh_unit_desc *unit = &t->table->units[u];
        for (int32_t p = 0; st == VH_STATUS_OK && p < unit->num_params; p++) {
            const vh_param_desc *pd = &unit->params[p];
            float *buf = malloc((size_t)pd->numel * sizeof(float));
            if (!buf) st = diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
            for (int32_t k = 0; st == VH_STATUS_OK && k < t->state_slots; k++) {
                char name[512];
                state_name(name, sizeof name, pd->name, k);
                const vh_st_tensor *ft = st_find(&f, name);
                expected++;
                if (!ft)
                    st = diag_set(d, VH_STATUS_ERR_FORMAT,
                                  "%s has no optimizer state '%s' (was the optimizer changed?)",
                                  path, name);
                else st = st_read_f32(&f, ft, buf, pd->numel, d);
                if (st == VH_STATUS_OK) copy_state(t, u, p, k, buf, 1);
            }
            free(buf);
        }
    }
    if (st == VH_STATUS_OK && expected != f.count)
        st = diag_set(d, VH_STATUS_ERR_FORMAT,
                      "%s holds %d optimizer tensors, this optimizer keeps %d (was the "
                      "optimizer changed?)",
                      path, f.count, expected);
    st_free(&f);
    return st;
}
