/* ddp.c - the sharding role's data-parallel plugin: full replicas on every rank.
 *
 * Every rank keeps the whole model in the device's memory, in flat buffers
 * that share one layout, the parameter table's:
 *
 *     params   numel elements of the policy's param_dtype (what gather hands out)
 *     masters  numel f32: the optimizer's copy; the params buffer itself when
 *              param_dtype is f32, a separate buffer otherwise
 *     grads    numel f32
 *     state[k] numel f32 per optimizer state slot
 *
 * Unit u occupies [offset_u, offset_u + numel_u) of each, offset_u being the
 * sum of the earlier units' numel, and parameter p of the unit sits at its
 * table offset inside that region. So one (unit, param) pair names the same
 * place in every buffer, and the optimizer's slices are plain pointers.
 *
 * Collectives. A unit is the DDP bucket: when the model's backward of a unit
 * ends it calls reduce, which all-reduces (SUM, comm_dtype f32) the unit's
 * grads while the model goes on with the next unit's backward, then divides
 * them by the world size so every rank holds the mean gradient of the global
 * batch (each rank's loss is the mean over its own samples). The division is
 * done here, after the sum, once per unit and only when world > 1: with f32
 * on the wire the sum cannot overflow where the mean would not, and keeping it
 * here leaves the precision plugins free of any knowledge of ranks. (A later
 * f16 wire format would divide before the sum instead, like PyTorch's
 * gradient_predivide_factor.)
 *
 * The comm interface of ABI 1.0 is synchronous, so reduce finishes its
 * collective before it returns and wait has nothing to wait for; the places
 * where an asynchronous backend's requests start and complete are marked
 * ASYNC below.
 *
 * Call order is checked, since a mistake there silently desynchronises ranks:
 * a unit is reduced at most once per step (zero_grads starts a step), its
 * grads are not handed out again after its reduce, zero_grads waits for wait,
 * and wait refuses a step in which some units were reduced and others not.
 */
#include <stdint.h>
#include <string.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_config.h"
#include "vithost/vh_device.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_sharding.h"

typedef struct ddp_unit {
    const char *name; /* the table's, for messages; lives as long as the model */
    int64_t offset;   /* first element of the unit in every flat buffer */
    int64_t numel;
    int32_t gathered; /* gathers not yet released */
    int32_t reduced;  /* reduce was called for this unit in the current step */
} ddp_unit;

typedef struct ddp {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    int32_t world;       /* comm->world_size, read at setup */
    int ready;           /* setup succeeded */
    vh_dtype param_dtype;
    size_t param_size;   /* bytes per element of params */
    int32_t state_slots;
    ddp_unit *units;     /* host memory */
    int32_t num_units;
    int64_t numel;       /* sum over units */
    void *params;        /* device memory from here on */
    float *masters;      /* == params when param_dtype is f32 */
    float *grads;
    float *state[VH_OPTIM_MAX_STATE_SLOTS];
    float *inv_world;    /* one f32, 1/world; only when world > 1 */
    vh_param_slice *slices; /* host memory, one per parameter */
    int32_t num_slices;
    int32_t pending;     /* reductions started and not yet waited for */
} ddp;

static const vh_config_key schema[] = {
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* ---- life cycle --------------------------------------------------------- */

static vh_status ddp_create(vh_host *host, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    const vh_device_ops *dev = host->api->device(host);
    if (!dev)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "the host gave no device");
    if (!dev->alloc || !dev->free || !dev->copy || !dev->memset_zero)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "device %s lacks alloc, free, copy or memset_zero, which ddp "
                               "needs for its buffers",
                               dev->name ? dev->name : "?");
    vh_comm *comm = host->api->comm(host);
    if (!comm || !comm->ops || !comm->ops->all_reduce)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                               "the host gave no communicator with all_reduce");
    ddp *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    d->dev = dev;
    d->comm = comm;
    *self = d;
    return VH_STATUS_OK;
}

static void dev_free(ddp *d, void *ptr) {
    if (ptr) d->dev->free(d->dev->device, ptr);
}

/* Frees every buffer and returns to the state before setup. */
static void release_buffers(ddp *d) {
    vh_host *host = d->host;
    if (d->masters != d->params) dev_free(d, d->masters);
    dev_free(d, d->params);
    dev_free(d, d->grads);
    for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) dev_free(d, d->state[k]);
    dev_free(d, d->inv_world);
    host->api->free(host, d->units);
    host->api->free(host, d->slices);
    d->params = NULL;
    d->masters = d->grads = d->inv_world = NULL;
    memset(d->state, 0, sizeof d->state);
    d->units = NULL;
    d->slices = NULL;
    d->num_units = d->num_slices = 0;
    d->numel = 0;
    d->pending = 0;
    d->ready = 0;
}

static void ddp_destroy(void *self) {
    ddp *d = self;
    if (!d) return;
    /* ASYNC: an asynchronous backend would wait for (or cancel) the requests
     * still in flight here, before their buffers go. */
    release_buffers(d);
    d->host->api->free(d->host, d);
}

/* ---- setup -------------------------------------------------------------- */

static vh_status check_policy(ddp *d, const vh_precision_policy *pol) {
    vh_host *host = d->host;
    if (pol->master_dtype != VH_DTYPE_F32)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "master copies must be f32 (the policy asks for %s)",
                               vh_dtype_name(pol->master_dtype));
    if (pol->grad_dtype != VH_DTYPE_F32 || pol->comm_dtype != VH_DTYPE_F32)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "ddp keeps and all-reduces f32 gradients; the policy asks for "
                               "%s grads and %s on the wire (the amp/fp16 precision policies "
                               "with reduced-precision gradients come later)",
                               vh_dtype_name(pol->grad_dtype), vh_dtype_name(pol->comm_dtype));
    switch (pol->param_dtype) {
    case VH_DTYPE_F32: break;
    case VH_DTYPE_F16:
    case VH_DTYPE_BF16:
        if (!d->dev->convert)
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "%s parameters need the device's convert op, which %s lacks",
                                   vh_dtype_name(pol->param_dtype),
                                   d->dev->name ? d->dev->name : "the device");
        break;
    default:
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "parameters of dtype %s are not supported (f32, f16 or bf16; "
                               "the amp/fp16 precision policies come later)",
                               vh_dtype_name(pol->param_dtype));
    }
    return VH_STATUS_OK;
}

/* The table is consistent: every parameter's numel follows its shape, the
 * parameters of a unit lie end to end in declaration order, and the sums
 * match. Everything below relies on it. */
static vh_status check_table(ddp *d, const vh_param_table *t) {
    vh_host *host = d->host;
    if (!t || t->num_units < 1 || !t->units)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "empty parameter table");
    int64_t total = 0;
    int64_t params = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        if (ud->numel < 1 || ud->num_params < 1 || !ud->params)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unit %d (%s) is empty",
                                   (int)u, ud->name ? ud->name : "?");
        int64_t sum = 0;
        for (int32_t i = 0; i < ud->num_params; i++) {
            const vh_param_desc *pd = &ud->params[i];
            if (pd->numel < 1 || pd->numel != vh_param_desc_numel(pd) || pd->offset != sum)
                return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                       "unit %d (%s) param %d (%s): offset %lld / numel %lld do "
                                       "not follow the shape and declaration order",
                                       (int)u, ud->name ? ud->name : "?", (int)i,
                                       pd->name ? pd->name : "?", (long long)pd->offset,
                                       (long long)pd->numel);
            if (pd->numel > INT64_MAX / 4 - sum)
                return host->api->fail(host, VH_STATUS_ERR_NOMEM, "unit %d is too large", (int)u);
            sum += pd->numel;
        }
        if (sum != ud->numel)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "unit %d (%s): numel %lld, its params sum to %lld", (int)u,
                                   ud->name ? ud->name : "?", (long long)ud->numel,
                                   (long long)sum);
        if (sum > INT64_MAX / 4 - total)
            return host->api->fail(host, VH_STATUS_ERR_NOMEM, "the table is too large");
        total += sum;
        params += ud->num_params;
    }
    if (total != t->numel)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "table numel %lld, its units sum to %lld", (long long)t->numel,
                               (long long)total);
    if ((uint64_t)total > SIZE_MAX / sizeof(float) || params > INT32_MAX)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM,
                               "%lld parameters do not fit this machine's address space",
                               (long long)total);
    return VH_STATUS_OK;
}

/* A zeroed device buffer of `bytes`; the message names what it is for. */
static vh_status alloc_zeroed(ddp *d, size_t bytes, void **out, const char *what) {
    const vh_device_ops *dev = d->dev;
    *out = NULL;
    vh_status st = dev->alloc(dev->device, bytes, out);
    if (st != VH_STATUS_OK || !*out) {
        *out = NULL;
        return d->host->api->fail(d->host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                  "allocating %s (%zu bytes) on %s failed", what, bytes,
                                  dev->name ? dev->name : "the device");
    }
    st = dev->memset_zero(dev->device, *out, bytes);
    if (st != VH_STATUS_OK)
        return d->host->api->fail(d->host, st, "zeroing %s on %s failed", what,
                                  dev->name ? dev->name : "the device");
    return VH_STATUS_OK;
}

static vh_status alloc_buffers(ddp *d) {
    const vh_device_ops *dev = d->dev;
    size_t n = (size_t)d->numel;
    size_t f32_bytes = n * sizeof(float);
    vh_status st = alloc_zeroed(d, n * d->param_size, &d->params, "the parameters");
    if (st != VH_STATUS_OK) return st;
    if (d->param_dtype == VH_DTYPE_F32) {
        d->masters = d->params;
    } else {
        void *m;
        st = alloc_zeroed(d, f32_bytes, &m, "the f32 master parameters");
        d->masters = m;
        if (st != VH_STATUS_OK) return st;
    }
    void *g;
    st = alloc_zeroed(d, f32_bytes, &g, "the gradients");
    d->grads = g;
    if (st != VH_STATUS_OK) return st;
    for (int32_t k = 0; k < d->state_slots; k++) {
        void *s;
        st = alloc_zeroed(d, f32_bytes, &s, "the optimizer state");
        d->state[k] = s;
        if (st != VH_STATUS_OK) return st;
    }
    if (d->world > 1) {
        void *w;
        st = alloc_zeroed(d, sizeof(float), &w, "the gradient averaging factor");
        d->inv_world = w;
        if (st != VH_STATUS_OK) return st;
        float inv = 1.0f / (float)d->world;
        st = dev->copy(dev->device, d->inv_world, &inv, sizeof inv, VH_COPY_KIND_HOST_TO_DEVICE);
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st, "copying 1/world to %s failed",
                                      dev->name ? dev->name : "the device");
    }
    return VH_STATUS_OK;
}

/* One slice per parameter, each the whole parameter: nothing is sharded. */
static vh_status build_slices(ddp *d, const vh_param_table *t) {
    vh_host *host = d->host;
    int32_t count = 0;
    for (int32_t u = 0; u < t->num_units; u++) count += t->units[u].num_params;
    d->slices = host->api->alloc(host, (size_t)count * sizeof(vh_param_slice));
    if (!d->slices)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d slices",
                               (int)count);
    memset(d->slices, 0, (size_t)count * sizeof(vh_param_slice));
    vh_param_slices list = {d->slices, count, (uint32_t)sizeof(vh_param_slice)};
    int32_t n = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        int64_t base = d->units[u].offset;
        for (int32_t i = 0; i < ud->num_params; i++, n++) {
            const vh_param_desc *pd = &ud->params[i];
            int64_t at = base + pd->offset;
            vh_param_slice *sl = vh_param_slices_at(&list, n);
            sl->unit = u;
            sl->param = i;
            sl->offset = 0;
            sl->count = pd->numel;
            sl->flags = pd->flags;
            sl->master = d->masters + at;
            sl->grad = d->grads + at;
            for (int32_t k = 0; k < d->state_slots; k++) sl->state[k] = d->state[k] + at;
        }
    }
    d->num_slices = count;
    return VH_STATUS_OK;
}

static vh_status ddp_setup(void *self, const vh_sharding_setup *setup) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (d->ready)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "setup called twice; ddp allocates its buffers once");
    if (!setup || setup->struct_size < sizeof *setup)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sharding setup missing or too small (%u bytes, %zu expected)",
                               setup ? (unsigned)setup->struct_size : 0u, sizeof *setup);
    if (setup->state_slots < 0 || setup->state_slots > VH_OPTIM_MAX_STATE_SLOTS)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "%d optimizer state slots, 0 to %d allowed",
                               (int)setup->state_slots, VH_OPTIM_MAX_STATE_SLOTS);
    vh_status st = check_policy(d, &setup->policy);
    if (st != VH_STATUS_OK) return st;
    st = check_table(d, setup->table);
    if (st != VH_STATUS_OK) return st;
    if (d->comm->world_size < 1 || d->comm->rank < 0 || d->comm->rank >= d->comm->world_size)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                               "communicator of rank %d in a world of %d",
                               (int)d->comm->rank, (int)d->comm->world_size);
    if (d->comm->world_size > 1 && !d->dev->scale_rows)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "averaging gradients over %d ranks needs the device's "
                               "scale_rows op, which %s lacks",
                               (int)d->comm->world_size, d->dev->name ? d->dev->name : "it");

    const vh_param_table *t = setup->table;
    d->world = d->comm->world_size;
    d->param_dtype = setup->policy.param_dtype;
    d->param_size = vh_dtype_size(d->param_dtype);
    d->state_slots = setup->state_slots;
    d->numel = t->numel;
    d->units = host->api->alloc(host, (size_t)t->num_units * sizeof *d->units);
    if (!d->units) {
        release_buffers(d);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d units",
                               (int)t->num_units);
    }
    memset(d->units, 0, (size_t)t->num_units * sizeof *d->units);
    d->num_units = t->num_units;
    int64_t offset = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        d->units[u].name = t->units[u].name;
        d->units[u].offset = offset;
        d->units[u].numel = t->units[u].numel;
        offset += t->units[u].numel;
    }

    st = alloc_buffers(d);
    if (st == VH_STATUS_OK) st = build_slices(d, t);
    if (st != VH_STATUS_OK) {
        /* Leave the plugin as before setup; the message is already recorded. */
        release_buffers(d);
        return st;
    }
    d->ready = 1;
    return VH_STATUS_OK;
}

/* ---- per-unit calls ----------------------------------------------------- */

/* The unit, or NULL after recording why. */
static ddp_unit *unit_at(ddp *d, int32_t unit, const char *call, vh_status *st) {
    vh_host *host = d->host;
    if (!d->ready) {
        *st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s before setup", call);
        return NULL;
    }
    if (unit < 0 || unit >= d->num_units) {
        *st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                              "%s: unit %d is not in [0, %d)", call, (int)unit,
                              (int)d->num_units);
        return NULL;
    }
    *st = VH_STATUS_OK;
    return &d->units[unit];
}

static const char *unit_name(const ddp_unit *u) { return u->name ? u->name : "?"; }

static const char *dev_name(const ddp *d) { return d->dev->name ? d->dev->name : "the device"; }

static vh_status ddp_load_unit(void *self, int32_t unit, const float *values) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    ddp_unit *u = unit_at(d, unit, "load_unit", &st);
    if (!u) return st;
    if (!values)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "load_unit: NULL values");
    const vh_device_ops *dev = d->dev;
    float *master = d->masters + u->offset;
    size_t n = (size_t)u->numel;
    /* Every rank was given the same values and keeps all of them. */
    st = dev->copy(dev->device, master, values, n * sizeof(float), VH_COPY_KIND_HOST_TO_DEVICE);
    if (st != VH_STATUS_OK)
        return d->host->api->fail(d->host, st, "load_unit: copying unit %d (%s) to %s failed",
                                  (int)unit, unit_name(u), dev_name(d));
    if (d->masters != d->params) {
        char *params = (char *)d->params + (size_t)u->offset * d->param_size;
        st = dev->convert(dev->device, params, d->param_dtype, master, VH_DTYPE_F32, n);
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st,
                                      "load_unit: converting unit %d (%s) to %s failed",
                                      (int)unit, unit_name(u), vh_dtype_name(d->param_dtype));
    }
    return VH_STATUS_OK;
}

static vh_status ddp_store_unit(void *self, int32_t unit, float *values) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    ddp_unit *u = unit_at(d, unit, "store_unit", &st);
    if (!u) return st;
    if (!values)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "store_unit: NULL values");
    /* Collective by contract; a full replica needs no communication. */
    const vh_device_ops *dev = d->dev;
    st = dev->copy(dev->device, values, d->masters + u->offset, (size_t)u->numel * sizeof(float),
                   VH_COPY_KIND_DEVICE_TO_HOST);
    if (st != VH_STATUS_OK)
        return d->host->api->fail(d->host, st, "store_unit: copying unit %d (%s) from %s failed",
                                  (int)unit, unit_name(u), dev_name(d));
    return VH_STATUS_OK;
}

static vh_status ddp_zero_grads(void *self) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (!d->ready)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "zero_grads before setup");
    if (d->pending > 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "zero_grads with %d reduction(s) not waited for: call wait "
                               "after backward",
                               (int)d->pending);
    const vh_device_ops *dev = d->dev;
    vh_status st = dev->memset_zero(dev->device, d->grads, (size_t)d->numel * sizeof(float));
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "zeroing the gradients on %s failed", dev_name(d));
    for (int32_t u = 0; u < d->num_units; u++) d->units[u].reduced = 0;
    return VH_STATUS_OK;
}

static vh_status ddp_gather(void *self, int32_t unit, const void **params) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    ddp_unit *u = unit_at(d, unit, "gather", &st);
    if (!u) return st;
    if (!params)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "gather: NULL out");
    if (u->gathered == INT32_MAX)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "gather: unit %d (%s) gathered %d times without release",
                                  (int)unit, unit_name(u), (int)u->gathered);
    /* A replica is always whole: nothing to gather. */
    u->gathered++;
    *params = (const char *)d->params + (size_t)u->offset * d->param_size;
    return VH_STATUS_OK;
}

static vh_status ddp_release(void *self, int32_t unit) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    ddp_unit *u = unit_at(d, unit, "release", &st);
    if (!u) return st;
    if (u->gathered < 1)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "release of unit %d (%s), which is not gathered", (int)unit,
                                  unit_name(u));
    u->gathered--;
    return VH_STATUS_OK;
}

static vh_status ddp_grads(void *self, int32_t unit, void **grads) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    ddp_unit *u = unit_at(d, unit, "grads", &st);
    if (!u) return st;
    if (!grads)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "grads: NULL out");
    if (u->reduced)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "grads of unit %d (%s) asked for after its reduce in this "
                                  "step; whatever is added now would miss the other ranks",
                                  (int)unit, unit_name(u));
    *grads = d->grads + u->offset;
    return VH_STATUS_OK;
}

/* grads *= 1/world on the device: scale_rows with one factor for every row.
 * Rows of ROW elements let the device spread the work; the tail is one short
 * row. In place is fine: each element is read once, then written. */
static vh_status average(ddp *d, float *g, int64_t n) {
    enum { ROW = 4096 };
    const vh_device_ops *dev = d->dev;
    int64_t rows = n / ROW, tail = n % ROW;
    vh_status st = VH_STATUS_OK;
    if (rows > 0) st = dev->scale_rows(dev->device, g, g, d->inv_world, rows, ROW, 1, 1, 0);
    if (st == VH_STATUS_OK && tail > 0)
        st = dev->scale_rows(dev->device, g + rows * ROW, g + rows * ROW, d->inv_world, 1, tail,
                             1, 1, 0);
    return st;
}

static vh_status ddp_reduce(void *self, int32_t unit) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    ddp_unit *u = unit_at(d, unit, "reduce", &st);
    if (!u) return st;
    vh_host *host = d->host;
    if (u->reduced)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "reduce of unit %d (%s) twice in one step: its grads are "
                               "already all-reduced (zero_grads starts the next step)",
                               (int)unit, unit_name(u));
    float *g = d->grads + u->offset;
    /* ASYNC: with NCCL or MPI_Iallreduce this starts the collective (on the
     * comm stream, after an event recorded on the compute stream) and keeps
     * the request in the unit; the averaging below is then queued behind it
     * and `wait` completes both. The self/MPI backends of ABI 1.0 return when
     * the sum is done. */
    st = d->comm->ops->all_reduce(d->comm, g, (size_t)u->numel, VH_DTYPE_F32, VH_REDUCE_OP_SUM);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "all-reduce of unit %d (%s)'s grads over %d ranks "
                                         "failed",
                               (int)unit, unit_name(u), (int)d->world);
    if (d->world > 1) {
        st = average(d, g, u->numel);
        if (st != VH_STATUS_OK)
            return host->api->fail(host, st,
                                   "averaging unit %d (%s)'s grads over %d ranks on %s failed",
                                   (int)unit, unit_name(u), (int)d->world, dev_name(d));
    }
    u->reduced = 1;
    d->pending++;
    return VH_STATUS_OK;
}

static vh_status ddp_wait(void *self) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (!d->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "wait before setup");
    /* ASYNC: wait here for every request started by reduce (ncclGroupEnd +
     * stream wait on the compute stream, or MPI_Waitall). Nothing is in
     * flight with the synchronous backends. */
    if (d->pending > 0) {
        for (int32_t u = 0; u < d->num_units; u++)
            if (!d->units[u].reduced)
                return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                       "wait: unit %d (%s) was not reduced in this step while "
                                       "others were; its grads would differ across ranks",
                                       (int)u, unit_name(&d->units[u]));
    }
    d->pending = 0;
    return VH_STATUS_OK;
}

static vh_status ddp_slices(void *self, vh_param_slices *out) {
    ddp *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (!d->ready)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "slices before setup");
    out->items = d->slices;
    out->count = d->num_slices;
    out->item_size = (uint32_t)sizeof(vh_param_slice);
    return VH_STATUS_OK;
}

static vh_status ddp_refresh(void *self) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    if (!d->ready)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "refresh before setup");
    if (d->masters == d->params) return VH_STATUS_OK; /* f32: the master is the compute copy */
    /* The buffers share offsets, so one conversion refreshes every unit. */
    const vh_device_ops *dev = d->dev;
    vh_status st = dev->convert(dev->device, d->params, d->param_dtype, d->masters, VH_DTYPE_F32,
                                (size_t)d->numel);
    if (st != VH_STATUS_OK)
        return d->host->api->fail(d->host, st, "refresh: converting the masters to %s failed",
                                  vh_dtype_name(d->param_dtype));
    return VH_STATUS_OK;
}

static const vh_sharding_vtable vtable = {
    .struct_size = sizeof(vh_sharding_vtable),
    .create = ddp_create,
    .destroy = ddp_destroy,
    .setup = ddp_setup,
    .load_unit = ddp_load_unit,
    .store_unit = ddp_store_unit,
    .zero_grads = ddp_zero_grads,
    .gather = ddp_gather,
    .release = ddp_release,
    .grads = ddp_grads,
    .reduce = ddp_reduce,
    .wait = ddp_wait,
    .slices = ddp_slices,
    .refresh = ddp_refresh,
};

VH_PLUGIN_DEFINE(VH_ROLE_SHARDING, "ddp", "0.1.0",
                 "data parallel: full replicas, grads all-reduced per unit", schema, vtable);
