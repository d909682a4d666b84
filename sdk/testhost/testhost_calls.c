/* testhost_calls.c - create, destroy and the state of any role; the data
 * role's calls, each batch held to the role's contract. */
#include <stdlib.h>
#include <string.h>

#include "testhost_internal.h"

/* The plugin's vtable read at the test host's size: calls past the plugin's
 * struct_size (an older minor) read as NULL. */
typedef union th_vtable {
    vh_model_vtable model;
    vh_precision_vtable precision;
    vh_sharding_vtable sharding;
    vh_optim_vtable optim;
    vh_data_vtable data;
} th_vtable;

static const size_t vtable_sizes[] = {sizeof(vh_model_vtable), sizeof(vh_precision_vtable),
                                      sizeof(vh_sharding_vtable), sizeof(vh_optim_vtable),
                                      sizeof(vh_data_vtable)};

static void vtable_of(const vh_testhost *th, th_vtable *vt) {
    memset(vt, 0, sizeof *vt);
    vh_struct_upgrade(vt, vtable_sizes[th->desc->role], th->desc->vtable);
}

/* The setup create gets: the caller's (copied) or the role's default. */
static vh_status fill_setup(vh_testhost *th, const void *setup) {
    memset(&th->setup, 0, sizeof th->setup);
    switch ((vh_role)th->desc->role) {
    case VH_ROLE_MODEL: {
        vh_model_setup d = {sizeof d, 1, 8, 8, 4, 4, &th->policy, 0, 1};
        vh_struct_upgrade(&th->setup.model, sizeof th->setup.model, setup ? setup : &d);
        break;
    }
    case VH_ROLE_OPTIM: {
        vh_status st = setup ? VH_STATUS_OK : th_optim_table(th);
        if (st != VH_STATUS_OK) return st;
        vh_optim_setup d = {sizeof d, 100, &th->policy, &th->table};
        vh_struct_upgrade(&th->setup.optim, sizeof th->setup.optim, setup ? setup : &d);
        break;
    }
    case VH_ROLE_DATA: {
        vh_data_setup d = {sizeof d, 0, 1, 4, th->seed};
        vh_struct_upgrade(&th->setup.data, sizeof th->setup.data, setup ? setup : &d);
        th->batch_size = th->setup.data.batch_size;
        break;
    }
    default:
        if (setup)
            return th_fail(th, VH_STATUS_ERR_INVALID_ARG,
                           "the %s role's create takes no setup: pass NULL",
                           vh_role_name((vh_role)th->desc->role));
    }
    return VH_STATUS_OK;
}

static vh_status call_create(vh_testhost *th, const th_vtable *vt, void **self) {
    vh_host *h = &th->pub;
    switch ((vh_role)th->desc->role) {
    case VH_ROLE_MODEL: return vt->model.create(h, &th->setup.model, self);
    case VH_ROLE_PRECISION: return vt->precision.create(h, self);
    case VH_ROLE_SHARDING: return vt->sharding.create(h, self);
    case VH_ROLE_OPTIM: return vt->optim.create(h, &th->setup.optim, self);
    case VH_ROLE_DATA: return vt->data.create(h, &th->setup.data, self);
    }
    return th_fail(th, VH_STATUS_ERR_INTERNAL, "unknown role");
}

/* Creates with th->setup as it stands (state_roundtrip creates again). */
static vh_status create_again(vh_testhost *th) {
    th_vtable vt;
    vtable_of(th, &vt);
    if (!vt.model.create || !vt.model.destroy) /* the first two calls of every role */
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "%s has no create or destroy",
                       th->desc->name);
    vh_status st = th_config_check_required(th);
    if (st != VH_STATUS_OK) return st;
    th->error[0] = '\0';
    void *self = NULL;
    st = call_create(th, &vt, &self);
    if (st != VH_STATUS_OK) {
        if (!th->error[0])
            th_fail(th, st, "%s: create failed without a message (%s)", th->desc->name,
                    vh_status_str(st));
        if (self) vt.model.destroy(self); /* a plugin bug, but no leak here */
        return st;
    }
    th->self = self;
    th->created = 1;
    if (th->desc->role != VH_ROLE_DATA) return VH_STATUS_OK;
    memset(&th->info, 0, sizeof th->info);
    th->info.struct_size = sizeof th->info;
    if (!vt.data.info) return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "data plugin has no info");
    return vt.data.info(self, &th->info);
}

vh_status vh_testhost_create(vh_testhost *th, const void *setup) {
    if (th->created)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "an instance exists: destroy it first");
    vh_status st = fill_setup(th, setup);
    return st == VH_STATUS_OK ? create_again(th) : st;
}

void vh_testhost_destroy(vh_testhost *th) {
    if (!th->created) return;
    th_vtable vt;
    vtable_of(th, &vt);
    vt.model.destroy(th->self);
    th->self = NULL;
    th->created = 0;
}

/* ---- state --------------------------------------------------------------------- */

typedef struct th_state_calls {
    vh_status (*size)(void *self, size_t *bytes);
    vh_status (*save)(void *self, void *buf, size_t bytes);
    vh_status (*load)(void *self, const void *buf, size_t bytes);
} th_state_calls;

static vh_status state_calls(vh_testhost *th, th_state_calls *c) {
    th_vtable vt;
    vtable_of(th, &vt);
    memset(c, 0, sizeof *c);
    if (!th->created) return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "no instance: create first");
    switch ((vh_role)th->desc->role) {
    case VH_ROLE_MODEL: *c = (th_state_calls){vt.model.state_size, vt.model.state_save,
                                              vt.model.state_load};
        break;
    case VH_ROLE_PRECISION: *c = (th_state_calls){vt.precision.state_size,
                                                  vt.precision.state_save,
                                                  vt.precision.state_load};
        break;
    case VH_ROLE_OPTIM: *c = (th_state_calls){vt.optim.state_size, vt.optim.state_save,
                                              vt.optim.state_load};
        break;
    case VH_ROLE_DATA: *c = (th_state_calls){vt.data.state_size, vt.data.state_save,
                                             vt.data.state_load};
        break;
    case VH_ROLE_SHARDING:
        return th_fail(th, VH_STATUS_ERR_UNSUPPORTED,
                       "a sharding plugin saves through vh_state_io, not a blob");
    }
    if (!c->size != !c->save || !c->size != !c->load)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG,
                       "%s has some of state_size/save/load: all three or none",
                       th->desc->name);
    return VH_STATUS_OK;
}

vh_status vh_testhost_state_save(vh_testhost *th, void **buf, size_t *bytes) {
    *buf = NULL;
    *bytes = 0;
    th_state_calls c;
    vh_status st = state_calls(th, &c);
    size_t n = 0;
    if (st != VH_STATUS_OK || !c.size) return st;
    if ((st = c.size(th->self, &n)) != VH_STATUS_OK || n == 0) return st;
    void *b = malloc(n);
    if (!b) return th_fail(th, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(b, 0xA5, n); /* bytes the plugin leaves unwritten show as a difference */
    if ((st = c.save(th->self, b, n)) != VH_STATUS_OK) {
        free(b);
        return st;
    }
    *buf = b;
    *bytes = n;
    return VH_STATUS_OK;
}

vh_status vh_testhost_state_load(vh_testhost *th, const void *buf, size_t bytes) {
    th_state_calls c;
    vh_status st = state_calls(th, &c);
    if (st != VH_STATUS_OK) return st;
    if (!c.load)
        return bytes == 0 ? VH_STATUS_OK
                          : th_fail(th, VH_STATUS_ERR_INVALID_ARG,
                                    "%zu bytes of state for a plugin that keeps none", bytes);
    return c.load(th->self, buf, bytes);
}

static vh_status compare_states(vh_testhost *th, const unsigned char *a, size_t na,
                                const unsigned char *b, size_t nb) {
    if (na != nb)
        return th_fail(th, VH_STATUS_ERR_INTERNAL,
                       "state round trip: %zu bytes saved, %zu after loading them", na, nb);
    for (size_t i = 0; i < na; i++)
        if (a[i] != b[i])
            return th_fail(th, VH_STATUS_ERR_INTERNAL,
                           "state round trip: byte %zu of %zu differs (0x%02x saved, 0x%02x "
                           "after loading)",
                           i, na, a[i], b[i]);
    return VH_STATUS_OK;
}

vh_status vh_testhost_state_roundtrip(vh_testhost *th) {
    void *first = NULL, *second = NULL;
    size_t n1 = 0, n2 = 0;
    vh_status st = vh_testhost_state_save(th, &first, &n1);
    if (st == VH_STATUS_OK) {
        vh_testhost_destroy(th);
        st = create_again(th);
    }
    if (st == VH_STATUS_OK) st = vh_testhost_state_load(th, first, n1);
    if (st == VH_STATUS_OK) st = vh_testhost_state_save(th, &second, &n2);
    if (st == VH_STATUS_OK) st = compare_states(th, first, n1, second, n2);
    free(first);
    free(second);
    return st;
}

/* ---- data ---------------------------------------------------------------------- */

static vh_status data_calls(vh_testhost *th, vh_data_vtable *vt) {
    th_vtable all;
    vtable_of(th, &all);
    *vt = all.data;
    if (th->desc->role != VH_ROLE_DATA)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "%s is not a data plugin", th->desc->name);
    if (!th->created) return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "no instance: create first");
    if (!vt->info || !vt->start_epoch || !vt->next)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "%s lacks info, start_epoch or next",
                       th->desc->name);
    return VH_STATUS_OK;
}

vh_status vh_testhost_data_info(vh_testhost *th, vh_data_info *out) {
    vh_data_vtable vt;
    vh_status st = data_calls(th, &vt);
    if (st != VH_STATUS_OK) return st;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    return vt.info(th->self, out);
}

vh_status vh_testhost_data_start(vh_testhost *th, vh_split split, int64_t epoch) {
    vh_data_vtable vt;
    vh_status st = data_calls(th, &vt);
    if (st != VH_STATUS_OK) return st;
    th->split = (int32_t)split;
    return vt.start_epoch(th->self, split, epoch);
}

/* The batch as vh_data.h promises it; else VH_STATUS_ERR_INTERNAL, named. */
static vh_status batch_check(vh_testhost *th, const vh_batch *b) {
    const vh_tensor *im = &b->images, *lb = &b->labels;
    const char *why = NULL;
    if (b->struct_size < offsetof(vh_batch, size) + sizeof b->size) why = "struct_size too small";
    else if (b->size < 1 || b->size > th->batch_size) why = "size outside [1, batch_size]";
    else if (th->split == VH_SPLIT_TRAIN && b->size != th->batch_size)
        why = "a short batch in a training pass";
    else if (im->dtype != VH_DTYPE_F32 || im->ndim != 4 || !im->data) why = "images not f32 4-D";
    else if (im->shape[0] != b->size || im->shape[1] != th->info.channels ||
             im->shape[2] != th->info.height || im->shape[3] != th->info.width)
        why = "images' shape is not (size, channels, height, width) of info";
    else if (lb->dtype != VH_DTYPE_I32 || lb->ndim != 1 || lb->shape[0] != b->size || !lb->data)
        why = "labels not i32 (size)";
    for (int64_t i = 0; !why && i < b->size; i++) {
        int32_t l = ((const int32_t *)lb->data)[i];
        if (l < 0 || l >= th->info.num_classes) why = "a label outside [0, num_classes)";
    }
    if (!why) return VH_STATUS_OK;
    return th_fail(th, VH_STATUS_ERR_INTERNAL, "%s: batch of %lld: %s", th->desc->name,
                   (long long)b->size, why);
}

vh_status vh_testhost_data_next(vh_testhost *th, vh_batch *out, int *has_batch) {
    vh_data_vtable vt;
    vh_status st = data_calls(th, &vt);
    if (st != VH_STATUS_OK) return st;
    memset(out, 0, sizeof *out);
    *has_batch = 0;
    if ((st = vt.next(th->self, out, has_batch)) != VH_STATUS_OK) return st;
    return *has_batch ? batch_check(th, out) : VH_STATUS_OK;
}

vh_status vh_testhost_data_pass(vh_testhost *th, vh_split split, int64_t epoch,
                                int64_t *batches, int64_t *samples) {
    int64_t nb = 0, ns = 0;
    vh_status st = vh_testhost_data_start(th, split, epoch);
    for (int has = 1; st == VH_STATUS_OK && has;) {
        vh_batch b;
        st = vh_testhost_data_next(th, &b, &has);
        if (st == VH_STATUS_OK && has) nb++, ns += b.size;
    }
    if (batches) *batches = nb;
    if (samples) *samples = ns;
    return st;
}
