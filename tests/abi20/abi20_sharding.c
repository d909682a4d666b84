/* abi20_sharding.c - the sharding role's test plugin: full fp32 replicas.
 *
 * ABI 2.0, frozen: tests/plugins/test_sharding.c as it shipped with ABI 2.0,
 * built against tests/abi20/include (the 2.0 headers, their sizes) and
 * declaring minor 0. It stands for a plugin compiled once against 2.0 that
 * every 2.x host must still load, train and resume (tests/test_abi20.c).
 * Never port it to newer headers. Its vtable is followed by words that are
 * no pointers (abi20_poison.h), so a host that reads past it fails at once.
 *
 * Every rank keeps the whole model: per unit one buffer of params and one of
 * grads, laid out by vh_unit_layout_init (each parameter at a 64-byte
 * aligned offset, f32 under the only policy it takes), and per optimizer
 * state slot one buffer of the parameters end to end (the table's offsets).
 * The params are the fp32 masters and the compute copy at once (the slices
 * point into them), so gather hands out the buffer, release and refresh do
 * nothing, and reduce all-reduces a unit's grads (AVG: the mean over the
 * ranks) before it returns.
 *
 * gather/release pairs are counted per unit, so a model that releases what it
 * never gathered is told so.
 */
#include <stdint.h>
#include <string.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_config.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_sharding.h"

#include "abi20_poison.h"

/* The slice this plugin hands out is 2.0's (on LP64): pinned, so an edit of
 * the frozen headers cannot quietly change what tests/test_abi20.c proves. */
_Static_assert(VH_ABI_MAJOR == 2 && VH_ABI_MINOR == 0, "built against the ABI 2.0 headers");
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(vh_param_slice) == 96, "vh_param_slice as shipped in ABI 2.0");
#endif

typedef struct shard_unit {
    int64_t numel;
    vh_unit_layout layout; /* of params and grads (both f32) */
    float *params;         /* fp32 master and compute copy, layout.bytes */
    float *grads;          /* layout.bytes */
    float *state[VH_OPTIM_MAX_STATE_SLOTS]; /* numel each, the table's offsets */
    int32_t gathered;      /* gathers not yet released */
} shard_unit;

typedef struct abi20_sharding {
    vh_host *host;
    vh_comm *comm;
    const vh_param_table *table;
    vh_precision_policy policy; /* the setup's, upgraded to this SDK's struct */
    int32_t state_slots;
    shard_unit *units;
    int32_t num_units;
    vh_param_slice *slices;
    int32_t num_slices;
} abi20_sharding;

static const vh_config_key schema[] = {
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status sharding_create(vh_host *host, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    const vh_device_ops *dev = host->api->device(host);
    if (!dev || dev->kind != VH_DEVICE_KIND_CPU)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "abi20_sharding keeps its buffers in host memory: CPU runs only "
                               "(device is %s)",
                               dev && dev->name ? dev->name : "unknown");
    vh_comm *comm = host->api->comm(host);
    if (!comm || !comm->ops)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "the host gave no communicator");

    abi20_sharding *s = host->api->alloc(host, sizeof *s);
    if (!s) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(s, 0, sizeof *s);
    s->host = host;
    s->comm = comm;
    *self = s;
    return VH_STATUS_OK;
}

static void sharding_destroy(void *self) {
    abi20_sharding *s = self;
    if (!s) return;
    vh_host *host = s->host;
    if (s->units) {
        for (int32_t u = 0; u < s->num_units; u++) {
            host->api->free(host, s->units[u].params);
            host->api->free(host, s->units[u].grads);
            for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++)
                host->api->free(host, s->units[u].state[k]);
            vh_unit_layout_free(&s->units[u].layout);
        }
        host->api->free(host, s->units);
    }
    host->api->free(host, s->slices);
    host->api->free(host, s);
}

/* Zeroed host memory for n floats. */
static float *alloc_floats(vh_host *host, int64_t n) {
    float *p = host->api->alloc(host, (size_t)n * sizeof(float));
    if (p) memset(p, 0, (size_t)n * sizeof(float));
    return p;
}

/* Zeroed host memory of `bytes` (a layout's, a multiple of 64). */
static float *alloc_bytes(vh_host *host, size_t bytes) {
    float *p = host->api->alloc(host, bytes ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

static vh_status check_table(vh_host *host, const vh_param_table *t) {
    if (!t || t->num_units < 1 || !t->units)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "empty parameter table");
    int64_t total = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        if (ud->numel < 1 || ud->num_params < 1 || !ud->params)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unit %d (%s) is empty",
                                   (int)u, ud->name ? ud->name : "?");
        if ((uint64_t)ud->numel > SIZE_MAX / sizeof(float))
            return host->api->fail(host, VH_STATUS_ERR_NOMEM, "unit %d is too large", (int)u);
        int64_t sum = 0;
        for (int32_t i = 0; i < ud->num_params; i++) {
            const vh_param_desc *pd = &ud->params[i];
            if (pd->numel != vh_param_desc_numel(pd) || pd->offset != sum)
                return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                       "unit %d param %d (%s): offset %lld / numel %lld do not "
                                       "follow the shape and declaration order",
                                       (int)u, (int)i, pd->name ? pd->name : "?",
                                       (long long)pd->offset, (long long)pd->numel);
            sum += pd->numel;
        }
        if (sum != ud->numel)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "unit %d: numel %lld, its params sum to %lld", (int)u,
                                   (long long)ud->numel, (long long)sum);
        total += sum;
    }
    if (total != t->numel)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "table numel %lld, its units sum to %lld", (long long)t->numel,
                               (long long)total);
    return VH_STATUS_OK;
}

static vh_status sharding_setup(void *self, const vh_sharding_setup *setup) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = s->host;
    if (s->units)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "setup called twice");
    /* A setup of an older minor reads as this one with its missing members
     * zero (the defaults). */
    vh_sharding_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup) || !setup_v.policy)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "sharding setup missing or without a policy");
    setup = &setup_v;
    vh_precision_policy pol_v;
    if (!vh_struct_upgrade(&pol_v, sizeof pol_v, setup->policy))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "precision policy too small");
    const vh_precision_policy *pol = &pol_v;
    if (pol->param_dtype != VH_DTYPE_F32 || pol->grad_dtype != VH_DTYPE_F32 ||
        pol->comm_dtype != VH_DTYPE_F32 || pol->master_dtype != VH_DTYPE_F32 ||
        pol->state_dtype != VH_DTYPE_F32)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "abi20_sharding keeps fp32 only (params %s, grads %s, comm %s, "
                               "master %s, state %s)",
                               vh_dtype_name(pol->param_dtype), vh_dtype_name(pol->grad_dtype),
                               vh_dtype_name(pol->comm_dtype), vh_dtype_name(pol->master_dtype),
                               vh_dtype_name(pol->state_dtype));
    if (setup->state_slots < 0 || setup->state_slots > VH_OPTIM_MAX_STATE_SLOTS)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%d optimizer state slots, max %d",
                               (int)setup->state_slots, VH_OPTIM_MAX_STATE_SLOTS);
    vh_status st = check_table(host, setup->table);
    if (st != VH_STATUS_OK) return st;

    const vh_param_table *t = setup->table;
    int32_t nslices = 0;
    for (int32_t u = 0; u < t->num_units; u++) nslices += t->units[u].num_params;

    s->table = t;
    s->policy = pol_v;
    s->state_slots = setup->state_slots;
    s->units = host->api->alloc(host, (size_t)t->num_units * sizeof *s->units);
    s->slices = host->api->alloc(host, (size_t)nslices * sizeof *s->slices);
    if (!s->units || !s->slices) goto nomem;
    memset(s->units, 0, (size_t)t->num_units * sizeof *s->units);
    memset(s->slices, 0, (size_t)nslices * sizeof *s->slices);
    s->num_units = t->num_units;

    for (int32_t u = 0; u < t->num_units; u++) {
        shard_unit *su = &s->units[u];
        su->numel = t->units[u].numel;
        /* Params and grads share one layout: both are f32 under this policy. */
        if (vh_unit_layout_init(&su->layout, &t->units[u], vh_policy_param_dtype, &s->policy) !=
            VH_STATUS_OK)
            goto nomem;
        su->params = alloc_bytes(host, su->layout.bytes);
        su->grads = alloc_bytes(host, su->layout.bytes);
        if (!su->params || !su->grads) goto nomem;
        for (int32_t k = 0; k < s->state_slots; k++)
            if (!(su->state[k] = alloc_floats(host, su->numel))) goto nomem;
    }

    /* One slice per parameter: everything is local. */
    int32_t n = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        shard_unit *su = &s->units[u];
        for (int32_t i = 0; i < ud->num_params; i++, n++) {
            const vh_param_desc *pd = &ud->params[i];
            vh_param_slice *sl = &s->slices[n];
            sl->unit = u;
            sl->param = i;
            sl->offset = 0;
            sl->count = pd->numel;
            sl->flags = pd->flags;
            sl->master = (char *)su->params + su->layout.offsets[i];
            sl->grad = (char *)su->grads + su->layout.offsets[i];
            for (int32_t k = 0; k < s->state_slots; k++) sl->state[k] = su->state[k] + pd->offset;
            sl->master_dtype = sl->grad_dtype = sl->state_dtype = VH_DTYPE_F32;
        }
    }
    s->num_slices = nslices;
    return VH_STATUS_OK;

nomem:
    /* Leave the plugin as before setup; destroy frees the rest. */
    if (s->units) {
        for (int32_t u = 0; u < t->num_units; u++) {
            host->api->free(host, s->units[u].params);
            host->api->free(host, s->units[u].grads);
            for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++)
                host->api->free(host, s->units[u].state[k]);
            vh_unit_layout_free(&s->units[u].layout);
        }
    }
    host->api->free(host, s->units);
    host->api->free(host, s->slices);
    s->units = NULL;
    s->slices = NULL;
    s->num_units = 0;
    s->table = NULL;
    return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %lld parameters",
                           (long long)t->numel);
}

/* The unit, or NULL after recording the error. */
static shard_unit *unit_at(abi20_sharding *s, int32_t unit, const char *what, vh_status *st) {
    vh_host *host = s->host;
    if (!s->units) {
        *st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s before setup", what);
        return NULL;
    }
    if (unit < 0 || unit >= s->num_units) {
        *st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s: unit %d is not in [0, %d)", what,
                              (int)unit, (int)s->num_units);
        return NULL;
    }
    *st = VH_STATUS_OK;
    return &s->units[unit];
}

static vh_status sharding_load_unit(void *self, int32_t unit, const float *values) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    shard_unit *su = unit_at(s, unit, "load_unit", &st);
    if (!su) return st;
    if (!values) return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG, "load_unit: NULL values");
    /* values: the params end to end; the buffer: at the layout's offsets. */
    const vh_unit_desc *ud = &s->table->units[unit];
    for (int32_t i = 0; i < ud->num_params; i++)
        memcpy((char *)su->params + su->layout.offsets[i], values + ud->params[i].offset,
               (size_t)ud->params[i].numel * sizeof(float));
    return VH_STATUS_OK;
}

static vh_status sharding_store_unit(void *self, int32_t unit, float *values) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    shard_unit *su = unit_at(s, unit, "store_unit", &st);
    if (!su) return st;
    if (!values) return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG, "store_unit: NULL values");
    const vh_unit_desc *ud = &s->table->units[unit];
    for (int32_t i = 0; i < ud->num_params; i++)
        memcpy(values + ud->params[i].offset, (const char *)su->params + su->layout.offsets[i],
               (size_t)ud->params[i].numel * sizeof(float));
    return VH_STATUS_OK;
}

static vh_status sharding_zero_grads(void *self) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    if (!s->units)
        return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG, "zero_grads before setup");
    for (int32_t u = 0; u < s->num_units; u++)
        memset(s->units[u].grads, 0, s->units[u].layout.bytes);
    return VH_STATUS_OK;
}

static vh_status sharding_gather(void *self, int32_t unit, const void **params) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    shard_unit *su = unit_at(s, unit, "gather", &st);
    if (!su) return st;
    if (!params) return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG, "gather: NULL out");
    su->gathered++;
    *params = su->params;
    return VH_STATUS_OK;
}

static vh_status sharding_release(void *self, int32_t unit) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    shard_unit *su = unit_at(s, unit, "release", &st);
    if (!su) return st;
    if (su->gathered < 1)
        return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG,
                                  "release of unit %d, which is not gathered", (int)unit);
    su->gathered--;
    return VH_STATUS_OK;
}

static vh_status sharding_grads(void *self, int32_t unit, void **grads) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    shard_unit *su = unit_at(s, unit, "grads", &st);
    if (!su) return st;
    if (!grads) return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG, "grads: NULL out");
    *grads = su->grads;
    return VH_STATUS_OK;
}

static vh_status sharding_reduce(void *self, int32_t unit) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    shard_unit *su = unit_at(s, unit, "reduce", &st);
    if (!su) return st;
    /* The whole buffer, padding (zero on every rank) included: one call. */
    st = vh_comm_all_reduce(s->comm, su->grads, su->layout.bytes / sizeof(float), VH_DTYPE_F32,
                            VH_REDUCE_OP_AVG);
    if (st != VH_STATUS_OK)
        return s->host->api->fail(s->host, st, "all-reduce of unit %d's grads failed", (int)unit);
    return VH_STATUS_OK;
}

static vh_status sharding_wait(void *self) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    return VH_STATUS_OK; /* reduce is synchronous */
}

static vh_status sharding_slices(void *self, vh_param_slices *out) {
    abi20_sharding *s = self;
    if (!s || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (!s->units)
        return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG, "slices before setup");
    memset(out, 0, sizeof *out);
    out->items = s->slices;
    out->count = s->num_slices;
    out->item_size = sizeof(vh_param_slice); /* 2.0's: a newer host reads no further */
    out->replicated = 1; /* full replicas */
    return VH_STATUS_OK;
}

static vh_status sharding_refresh(void *self) {
    abi20_sharding *s = self;
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    return VH_STATUS_OK; /* the master is the compute copy */
}

/* Optimizer state through io: every slice whole, in f32. Every rank holds
 * the same state, so rank 0 alone writes; every rank reads. */
static vh_status sharding_state_io(abi20_sharding *s, const vh_state_io *io, int save) {
    vh_host *host = s->host;
    const char *call = save ? "state_save" : "state_load";
    if (!s->units)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s before setup", call);
    vh_state_io io_v;
    if (!vh_struct_upgrade(&io_v, sizeof io_v, io) || (save ? !io_v.write : !io_v.read))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "%s: no %s function", call,
                               save ? "write" : "read");
    if (save && s->comm->rank != 0) return VH_STATUS_OK;
    for (int32_t n = 0; n < s->num_slices; n++) {
        const vh_param_slice *sl = &s->slices[n];
        for (int32_t k = 0; k < s->state_slots; k++) {
            vh_status st = save ? io_v.write(io_v.ctx, sl->unit, sl->param, k, 0, sl->count,
                                             VH_DTYPE_F32, sl->state[k])
                                : io_v.read(io_v.ctx, sl->unit, sl->param, k, 0, sl->count,
                                            VH_DTYPE_F32, sl->state[k]);
            if (st != VH_STATUS_OK)
                return host->api->fail(host, st, "%s: slot %d of unit %d param %d failed", call,
                                       (int)k, (int)sl->unit, (int)sl->param);
        }
    }
    return VH_STATUS_OK;
}

static vh_status sharding_state_save(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return sharding_state_io(self, io, 1);
}

static vh_status sharding_state_load(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return sharding_state_io(self, io, 0);
}

static vh_status sharding_memory(void *self, vh_sharding_memory *out) {
    abi20_sharding *s = self;
    if (!s || !out || out->struct_size < sizeof out->struct_size)
        return VH_STATUS_ERR_INVALID_ARG;
    vh_sharding_memory m;
    memset(&m, 0, sizeof m);
    for (int32_t u = 0; u < s->num_units; u++) {
        m.params += (int64_t)s->units[u].layout.bytes; /* the masters too */
        m.grads += (int64_t)s->units[u].layout.bytes;
        m.optim_state += s->state_slots * s->units[u].numel * (int64_t)sizeof(float);
    }
    /* Fill what the caller's (possibly older) struct has room for. */
    size_t n = out->struct_size < sizeof m ? out->struct_size : sizeof m;
    memcpy((char *)out + sizeof m.struct_size, (const char *)&m + sizeof m.struct_size,
           n - sizeof m.struct_size);
    return VH_STATUS_OK;
}

static const struct {
    vh_sharding_vtable vtable;
    uintptr_t poison[8]; /* abi20_poison.h */
} shipped = {{
    .struct_size = sizeof(vh_sharding_vtable),
    .create = sharding_create,
    .destroy = sharding_destroy,
    .setup = sharding_setup,
    .load_unit = sharding_load_unit,
    .store_unit = sharding_store_unit,
    .zero_grads = sharding_zero_grads,
    .gather = sharding_gather,
    .release = sharding_release,
    .grads = sharding_grads,
    .reduce = sharding_reduce,
    .wait = sharding_wait,
    .slices = sharding_slices,
    .refresh = sharding_refresh,
    .state_save = sharding_state_save,
    .state_load = sharding_state_load,
    .memory = sharding_memory,
}, ABI20_POISON};

VH_PLUGIN_DEFINE(VH_ROLE_SHARDING, "abi20_sharding", "0.1.0",
                 "test plugin: full fp32 replicas, grads all-reduced per unit", schema,
                 shipped.vtable);
