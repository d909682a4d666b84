/* vtables.c - each role's vtable members, required or optional, and the
 * host's defaults for the optional ones (see vtables.h). */
#include "vtables.h"

#include <stdlib.h>
#include <string.h>

#include "vithost/vh_data.h"
#include "vithost/vh_model.h"
#include "vithost/vh_optim.h"
#include "vithost/vh_precision.h"
#include "vithost/vh_sharding.h"

#define REQUIRED(type, member) {#member, offsetof(type, member), 1, NULL, 0}
#define OPTIONAL(type, member) {#member, offsetof(type, member), 0, NULL, 0}
/* Optional, but one of the two must be there (the loader checks the pair). */
#define ONE_OF(type, member, other) {#member, offsetof(type, member), 0, #other, offsetof(type, other)}

static const vh_vtable_member model_members[] = {
    REQUIRED(vh_model_vtable, create),
    REQUIRED(vh_model_vtable, destroy),
    REQUIRED(vh_model_vtable, param_table),
    REQUIRED(vh_model_vtable, init_unit),
    REQUIRED(vh_model_vtable, forward),
    REQUIRED(vh_model_vtable, backward),
    OPTIONAL(vh_model_vtable, train_flops_per_image),
    OPTIONAL(vh_model_vtable, state_size),
    OPTIONAL(vh_model_vtable, state_save),
    OPTIONAL(vh_model_vtable, state_load),
    OPTIONAL(vh_model_vtable, initial_weights),
    OPTIONAL(vh_model_vtable, load_weights),
    OPTIONAL(vh_model_vtable, activation_bytes),
};

static const vh_vtable_member precision_members[] = {
    REQUIRED(vh_precision_vtable, create),
    REQUIRED(vh_precision_vtable, destroy),
    REQUIRED(vh_precision_vtable, policy),
    REQUIRED(vh_precision_vtable, loss_scale),
    REQUIRED(vh_precision_vtable, unscale_and_check),
    REQUIRED(vh_precision_vtable, update),
    OPTIONAL(vh_precision_vtable, state_size),
    OPTIONAL(vh_precision_vtable, state_save),
    OPTIONAL(vh_precision_vtable, state_load),
    OPTIONAL(vh_precision_vtable, grad_sum_sq),
};

static const vh_vtable_member sharding_members[] = {
    REQUIRED(vh_sharding_vtable, create),
    REQUIRED(vh_sharding_vtable, destroy),
    REQUIRED(vh_sharding_vtable, setup),
    REQUIRED(vh_sharding_vtable, load_unit),
    REQUIRED(vh_sharding_vtable, store_unit),
    REQUIRED(vh_sharding_vtable, zero_grads),
    REQUIRED(vh_sharding_vtable, gather),
    REQUIRED(vh_sharding_vtable, release),
    REQUIRED(vh_sharding_vtable, grads),
    REQUIRED(vh_sharding_vtable, reduce),
    REQUIRED(vh_sharding_vtable, wait),
    REQUIRED(vh_sharding_vtable, slices),
    REQUIRED(vh_sharding_vtable, refresh),
    REQUIRED(vh_sharding_vtable, state_save),
    REQUIRED(vh_sharding_vtable, state_load),
    OPTIONAL(vh_sharding_vtable, memory),
    OPTIONAL(vh_sharding_vtable, set_sync),
    OPTIONAL(vh_sharding_vtable, refresh_updated),
};

static const vh_vtable_member optim_members[] = {
    REQUIRED(vh_optim_vtable, create),
    REQUIRED(vh_optim_vtable, destroy),
    REQUIRED(vh_optim_vtable, state_slots),
    ONE_OF(vh_optim_vtable, step, update),
    OPTIONAL(vh_optim_vtable, state_size),
    OPTIONAL(vh_optim_vtable, state_save),
    OPTIONAL(vh_optim_vtable, state_load),
    ONE_OF(vh_optim_vtable, update, step),
    OPTIONAL(vh_optim_vtable, caps),
};

static const vh_vtable_member data_members[] = {
    REQUIRED(vh_data_vtable, create),
    REQUIRED(vh_data_vtable, destroy),
    REQUIRED(vh_data_vtable, info),
    REQUIRED(vh_data_vtable, start_epoch),
    REQUIRED(vh_data_vtable, next),
    OPTIONAL(vh_data_vtable, state_size),
    OPTIONAL(vh_data_vtable, state_save),
    OPTIONAL(vh_data_vtable, state_load),
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A vtable is struct_size (padded to a pointer) and then calls only: each
 * list above must name every one, or a call a minor appends would be read
 * without the host knowing it. */
#define LISTS_EVERY_CALL(type, members)                                               \
    _Static_assert(sizeof(members) / sizeof((members)[0]) ==                          \
                       (sizeof(type) - sizeof(void *)) / sizeof(void *),             \
                   "a call was added to " #type ": list it in " #members)
LISTS_EVERY_CALL(vh_model_vtable, model_members);
LISTS_EVERY_CALL(vh_precision_vtable, precision_members);
LISTS_EVERY_CALL(vh_sharding_vtable, sharding_members);
LISTS_EVERY_CALL(vh_optim_vtable, optim_members);
LISTS_EVERY_CALL(vh_data_vtable, data_members);
/* Every required member lies before every optional one (a minor only
 * appends optional calls), so the required part ends with the last one. */
#define ROLE(type, members, last_required)                                                   \
    {#type, sizeof(type), offsetof(type, last_required) + sizeof(void (*)(void)), members,  \
     COUNT(members)}

static const vh_role_vtable roles[VH_HOST_ROLE_COUNT] = {
    [VH_ROLE_MODEL] = ROLE(vh_model_vtable, model_members, backward),
    [VH_ROLE_PRECISION] = ROLE(vh_precision_vtable, precision_members, update),
    [VH_ROLE_SHARDING] = ROLE(vh_sharding_vtable, sharding_members, state_load),
    [VH_ROLE_OPTIM] = ROLE(vh_optim_vtable, optim_members, state_slots),
    [VH_ROLE_DATA] = ROLE(vh_data_vtable, data_members, next),
};

const vh_role_vtable *vtable_info(vh_role role) {
    return (int)role >= 0 && role < VH_HOST_ROLE_COUNT ? &roles[role] : NULL;
}

/* A member read as a plain pointer: all members past struct_size are calls. */
static void *member_at(const void *vtable, size_t offset) {
    void *p;
    memcpy(&p, (const char *)vtable + offset, sizeof p);
    return p;
}

const vh_vtable_member *vtable_missing_required(vh_role role, const void *plugin_vtable,
                                                size_t plugin_size) {
    const vh_role_vtable *info = vtable_info(role);
    for (int i = 0; info && i < info->count; i++) {
        const vh_vtable_member *m = &info->members[i];
        if (!m->required && !m->alternative) continue;
        int has = m->offset + sizeof(void *) <= plugin_size && member_at(plugin_vtable, m->offset);
        int has_other = m->alternative && m->alternative_offset + sizeof(void *) <= plugin_size &&
                        member_at(plugin_vtable, m->alternative_offset);
        if (!has && !has_other) return m;
    }
    return NULL;
}

/* ---- the host's defaults --------------------------------------------------
 * A plugin without state saves none and accepts only none back: a checkpoint
 * holding state for it was written by another plugin. */

static vh_status no_state_size(void *self, size_t *bytes) {
    (void)self;
    *bytes = 0;
    return VH_STATUS_OK;
}

static vh_status no_state_save(void *self, void *buf, size_t bytes) {
    (void)self, (void)buf;
    return bytes == 0 ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}

static vh_status no_state_load(void *self, const void *buf, size_t bytes) {
    (void)self, (void)buf;
    return bytes == 0 ? VH_STATUS_OK : VH_STATUS_ERR_FORMAT;
}

/* 0: FLOPs unknown; the host then prints no TFLOP/s or MFU figure. */
static double no_flops(void *self) {
    (void)self;
    return 0.0;
}

/* No `pretrained`-like key: the run starts from the init rules. */
static vh_status no_initial_weights(void *self, const char **path) {
    (void)self;
    *path = NULL;
    return VH_STATUS_OK;
}

#define DEFAULT(ptr, fn) \
    do {                 \
        if (!(ptr)) (ptr) = (fn); \
    } while (0)

void *vtable_upgrade(vh_role role, const void *plugin_vtable, size_t plugin_size) {
    const vh_role_vtable *info = vtable_info(role);
    if (!info) return NULL;
    void *copy = calloc(1, info->size);
    if (!copy) return NULL;
    memcpy(copy, plugin_vtable, plugin_size < info->size ? plugin_size : info->size);
    uint32_t size = (uint32_t)info->size;
    memcpy(copy, &size, sizeof size); /* every vtable starts with its struct_size */
    switch (role) {
    case VH_ROLE_MODEL: {
        vh_model_vtable *v = copy;
        DEFAULT(v->train_flops_per_image, no_flops);
        DEFAULT(v->state_size, no_state_size);
        DEFAULT(v->state_save, no_state_save);
        DEFAULT(v->state_load, no_state_load);
        DEFAULT(v->initial_weights, no_initial_weights);
        break;
    }
    case VH_ROLE_PRECISION: {
        vh_precision_vtable *v = copy;
        DEFAULT(v->state_size, no_state_size);
        DEFAULT(v->state_save, no_state_save);
        DEFAULT(v->state_load, no_state_load);
        break;
    }
    case VH_ROLE_OPTIM: {
        vh_optim_vtable *v = copy;
        DEFAULT(v->state_size, no_state_size);
        DEFAULT(v->state_save, no_state_save);
        DEFAULT(v->state_load, no_state_load);
        break;
    }
    case VH_ROLE_DATA: {
        vh_data_vtable *v = copy;
        DEFAULT(v->state_size, no_state_size);
        DEFAULT(v->state_save, no_state_save);
        DEFAULT(v->state_load, no_state_load);
        break;
    }
    case VH_ROLE_SHARDING: break;
    }
    return copy;
}
