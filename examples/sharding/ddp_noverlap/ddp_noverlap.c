/* ddp_noverlap.c - full replicas whose gradients are all-reduced in ONE call.
 *
 * The variant of DDP without overlap: the gradients of every unit live in
 * one flat buffer (unit after unit, each laid out by vh_unit_layout), `reduce`
 * only notes that a unit is complete, and `wait` all-reduces (mean) the
 * whole buffer at once. Fewer, larger messages than reducing per unit, and
 * no communication during backward: the baseline that overlap (vithost's
 * ddp) is measured against.
 *
 * The policy must be f32 throughout (precision: fp32): the f32 masters the
 * optimizer updates are the compute copies the model reads.
 */
#include <string.h>

#include <vithost/vithost.h>

typedef struct unit_buffers {
    vh_unit_layout layout; /* params and grads: parameter i at layout.offsets[i] */
    void *params;          /* compute copy == f32 masters (device memory) */
    void *grads;           /* within the flat buffer, same layout as params */
    float *state[VH_OPTIM_MAX_STATE_SLOTS]; /* the optimizer's, unit numel each */
    int reduced;           /* reduce was called this step */
} unit_buffers;

typedef struct sharding {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    const vh_param_table *table; /* the model's, valid until our destroy */
    int32_t num_units, state_slots, num_slices;
    unit_buffers *units;
    vh_param_slice *slices; /* one per parameter */
    void *flat_grads;       /* every unit's gradients, end to end (device memory) */
    size_t flat_bytes;
} sharding;

static const vh_config_key schema[] = {
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* create: the last plugin created, after the optimizer. */
static vh_status shard_create(vh_host *host, void **self) {
    *self = NULL;
    sharding *s = host->api->alloc(host, sizeof *s);
    if (!s) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(s, 0, sizeof *s);
    s->host = host;
    s->dev = host->api->device(host);
    s->comm = host->api->comm(host);
    *self = s;
    return VH_STATUS_OK;
}

/* destroy: the first plugin destroyed. Free everything, never fail. */
static void shard_destroy(void *self) {
    sharding *s = self;
    if (!s) return;
    for (int32_t u = 0; s->units && u < s->num_units; u++) {
        unit_buffers *ub = &s->units[u];
        if (ub->params) s->dev->free(s->dev->device, ub->params);
        for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++)
            if (ub->state[k]) s->dev->free(s->dev->device, ub->state[k]);
        vh_unit_layout_free(&ub->layout);
    }
    if (s->flat_grads) s->dev->free(s->dev->device, s->flat_grads);
    s->host->api->free(s->host, s->units);
    s->host->api->free(s->host, s->slices);
    s->host->api->free(s->host, s);
}

/* setup: once, before anything else of ours: allocate every buffer for the
 * model's table, with the optimizer's state_slots state arrays. table and
 * policy stay valid until destroy. */
static vh_status shard_setup(void *self, const vh_sharding_setup *setup) {
    sharding *s = self;
    const vh_host_api *api = s->host->api;
    const vh_precision_policy *pol = setup->policy;
    if (pol->param_dtype != VH_DTYPE_F32 || pol->grad_dtype != VH_DTYPE_F32 ||
        pol->comm_dtype != VH_DTYPE_F32 || pol->master_dtype != VH_DTYPE_F32 ||
        pol->state_dtype != VH_DTYPE_F32)
        return api->fail(s->host, VH_STATUS_ERR_UNSUPPORTED,
                         "ddp_noverlap keeps f32 only (params %s, grads %s, comm %s, masters %s, "
                         "state %s): use precision: {plugin: fp32}",
                         vh_dtype_name(pol->param_dtype), vh_dtype_name(pol->grad_dtype),
                         vh_dtype_name(pol->comm_dtype), vh_dtype_name(pol->master_dtype),
                         vh_dtype_name(pol->state_dtype));
    const vh_param_table *t = setup->table;
    s->table = t;
    s->state_slots = setup->state_slots;
    s->units = api->alloc(s->host, (size_t)t->num_units * sizeof *s->units);
    int32_t n = 0;
    for (int32_t u = 0; u < t->num_units; u++) n += t->units[u].num_params;
    s->slices = api->alloc(s->host, (size_t)n * sizeof *s->slices);
    if (!s->units || !s->slices) return api->fail(s->host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(s->units, 0, (size_t)t->num_units * sizeof *s->units);
    memset(s->slices, 0, (size_t)n * sizeof *s->slices);
    s->num_units = t->num_units;

    vh_device *d = s->dev->device;
    /* The layouts first: the flat buffer is their sum (each a multiple of
     * VH_UNIT_ALIGN bytes, so every unit's part stays aligned). */
    for (int32_t u = 0; u < t->num_units; u++) {
        if (vh_unit_layout_init(&s->units[u].layout, &t->units[u], vh_policy_param_dtype, pol) !=
            VH_STATUS_OK)
            return api->fail(s->host, VH_STATUS_ERR_NOMEM, "out of memory");
        s->flat_bytes += s->units[u].layout.bytes;
    }
    if (s->dev->alloc(d, s->flat_bytes, &s->flat_grads) != VH_STATUS_OK ||
        s->dev->memset_zero(d, s->flat_grads, s->flat_bytes, NULL) != VH_STATUS_OK)
        return api->fail(s->host, VH_STATUS_ERR_NOMEM, "out of device memory for %zu bytes of "
                         "gradients", s->flat_bytes);
    size_t at = 0;
    n = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        unit_buffers *ub = &s->units[u];
        ub->grads = (char *)s->flat_grads + at;
        at += ub->layout.bytes;
        vh_status st = s->dev->alloc(d, ub->layout.bytes, &ub->params);
        if (st == VH_STATUS_OK) st = s->dev->memset_zero(d, ub->params, ub->layout.bytes, NULL);
        for (int32_t k = 0; st == VH_STATUS_OK && k < s->state_slots; k++) {
            const size_t bytes = (size_t)ud->numel * sizeof(float);
            st = s->dev->alloc(d, bytes, (void **)&ub->state[k]);
            if (st == VH_STATUS_OK) st = s->dev->memset_zero(d, ub->state[k], bytes, NULL);
        }
        if (st != VH_STATUS_OK)
            return api->fail(s->host, st, "out of device memory for unit %s", ud->name);
        for (int32_t i = 0; i < ud->num_params; i++, n++) {
            const vh_param_desc *pd = &ud->params[i];
            vh_param_slice *sl = &s->slices[n];
            sl->unit = u;
            sl->param = i;
            sl->offset = 0; /* the whole parameter: nothing is sharded */
            sl->count = pd->numel;
            sl->flags = pd->flags;
            sl->master = (char *)ub->params + ub->layout.offsets[i];
            sl->grad = (char *)ub->grads + ub->layout.offsets[i];
            for (int32_t k = 0; k < s->state_slots; k++) sl->state[k] = ub->state[k] + pd->offset;
            sl->master_dtype = sl->grad_dtype = sl->state_dtype = VH_DTYPE_F32;
        }
    }
    s->num_slices = n;
    return VH_STATUS_OK;
}

/* load_unit: a unit's full f32 values (host memory, end to end at each
 * parameter's offset), the same on every rank: initial values or a
 * checkpoint's. Keep what this rank owns (here: all). */
static vh_status shard_load_unit(void *self, int32_t unit, const float *values) {
    sharding *s = self;
    const vh_unit_desc *ud = &s->table->units[unit];
    unit_buffers *ub = &s->units[unit];
    for (int32_t i = 0; i < ud->num_params; i++) {
        vh_status st = s->dev->copy(s->dev->device, (char *)ub->params + ub->layout.offsets[i],
                                    values + ud->params[i].offset,
                                    (size_t)ud->params[i].numel * sizeof(float),
                                    VH_COPY_KIND_HOST_TO_DEVICE, NULL);
        if (st != VH_STATUS_OK) return s->host->api->fail(s->host, st, "load_unit %d", (int)unit);
    }
    return VH_STATUS_OK;
}

/* store_unit: collective (every rank calls it): write the unit's full f32
 * master values into `values` (host memory) on every rank. */
static vh_status shard_store_unit(void *self, int32_t unit, float *values) {
    sharding *s = self;
    const vh_unit_desc *ud = &s->table->units[unit];
    unit_buffers *ub = &s->units[unit];
    for (int32_t i = 0; i < ud->num_params; i++) {
        vh_status st = s->dev->copy(s->dev->device, values + ud->params[i].offset,
                                    (char *)ub->params + ub->layout.offsets[i],
                                    (size_t)ud->params[i].numel * sizeof(float),
                                    VH_COPY_KIND_DEVICE_TO_HOST, NULL);
        if (st != VH_STATUS_OK) return s->host->api->fail(s->host, st, "store_unit %d", (int)unit);
    }
    return s->dev->synchronize(s->dev->device);
}

/* zero_grads: the start of every step; one memset. */
static vh_status shard_zero_grads(void *self) {
    sharding *s = self;
    vh_status st = s->dev->memset_zero(s->dev->device, s->flat_grads, s->flat_bytes, NULL);
    if (st != VH_STATUS_OK) return s->host->api->fail(s->host, st, "zero_grads");
    for (int32_t u = 0; u < s->num_units; u++) s->units[u].reduced = 0;
    return VH_STATUS_OK;
}

/* gather: the model is about to use a unit: its full compute copy, valid
 * until release. (A sharded plugin would all-gather here.) */
static vh_status shard_gather(void *self, int32_t unit, const void **params) {
    sharding *s = self;
    *params = s->units[unit].params;
    return VH_STATUS_OK;
}

/* release: the model is done with the unit for now. (A sharded plugin
 * would free the gathered copy.) */
static vh_status shard_release(void *self, int32_t unit) {
    (void)self, (void)unit;
    return VH_STATUS_OK;
}

/* grads: the unit's full gradient buffer, zeroed at the step's start;
 * backward accumulates into it until reduce. */
static vh_status shard_grads(void *self, int32_t unit, void **grads) {
    sharding *s = self;
    *grads = s->units[unit].grads;
    return VH_STATUS_OK;
}

/* reduce: the unit's gradients are complete. Nothing is sent yet: wait
 * reduces everything at once. */
static vh_status shard_reduce(void *self, int32_t unit) {
    sharding *s = self;
    if (s->units[unit].reduced)
        return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG,
                                  "reduce of unit %d twice in one step", (int)unit);
    s->units[unit].reduced = 1;
    return VH_STATUS_OK;
}

/* wait: one all-reduce (mean over ranks) of every gradient. Every rank
 * calls it once per step with the same count. */
static vh_status shard_wait(void *self) {
    sharding *s = self;
    for (int32_t u = 0; u < s->num_units; u++)
        if (!s->units[u].reduced)
            return s->host->api->fail(s->host, VH_STATUS_ERR_INVALID_ARG,
                                      "wait: the model never reduced unit %d", (int)u);
    vh_status st = vh_comm_all_reduce(s->comm, s->flat_grads, s->flat_bytes / sizeof(float),
                                      VH_DTYPE_F32, VH_REDUCE_OP_AVG);
    if (st != VH_STATUS_OK)
        return s->host->api->fail(s->host, st, "all-reduce of %zu bytes of gradients failed",
                                  s->flat_bytes);
    return VH_STATUS_OK;
}

/* slices: once, after setup: the part the optimizer updates on this rank.
 * The list stays valid until destroy. */
static vh_status shard_slices(void *self, vh_param_slices *out) {
    sharding *s = self;
    memset(out, 0, sizeof *out);
    out->items = s->slices;
    out->count = s->num_slices;
    out->item_size = sizeof(vh_param_slice);
    out->replicated = 1; /* every rank holds the same full list */
    return VH_STATUS_OK;
}

/* refresh: after each optimizer step: compute copies from the masters.
 * Here they are the same memory. */
static vh_status shard_refresh(void *self) {
    (void)self;
    return VH_STATUS_OK;
}

/* state_save / state_load: collective: the optimizer state this rank owns,
 * through io (host memory, offsets within the full parameter), for
 * checkpoints. Every rank holds the same state: rank 0 writes, all read. */
static vh_status shard_state_io(sharding *s, const vh_state_io *io, int save) {
    if (save && s->comm->rank != 0) return VH_STATUS_OK;
    for (int32_t n = 0; n < s->num_slices; n++) {
        const vh_param_slice *sl = &s->slices[n];
        const size_t bytes = (size_t)sl->count * sizeof(float);
        float *host_buf = s->state_slots > 0 ? s->host->api->alloc(s->host, bytes) : NULL;
        if (s->state_slots > 0 && !host_buf)
            return s->host->api->fail(s->host, VH_STATUS_ERR_NOMEM, "out of memory");
        vh_status st = VH_STATUS_OK;
        for (int32_t k = 0; st == VH_STATUS_OK && k < s->state_slots; k++) {
            if (save) {
                st = s->dev->copy(s->dev->device, host_buf, sl->state[k], bytes,
                                  VH_COPY_KIND_DEVICE_TO_HOST, NULL);
                if (st == VH_STATUS_OK) st = s->dev->synchronize(s->dev->device);
                if (st == VH_STATUS_OK)
                    st = io->write(io->ctx, sl->unit, sl->param, k, 0, sl->count, VH_DTYPE_F32,
                                   host_buf);
            } else {
                st = io->read(io->ctx, sl->unit, sl->param, k, 0, sl->count, VH_DTYPE_F32,
                              host_buf);
                if (st == VH_STATUS_OK)
                    st = s->dev->copy(s->dev->device, sl->state[k], host_buf, bytes,
                                      VH_COPY_KIND_HOST_TO_DEVICE, NULL);
            }
        }
        s->host->api->free(s->host, host_buf);
        if (st != VH_STATUS_OK)
            return s->host->api->fail(s->host, st, "optimizer state of unit %d param %d",
                                      (int)sl->unit, (int)sl->param);
    }
    return VH_STATUS_OK;
}

static vh_status shard_state_save(void *self, const vh_state_io *io) {
    return shard_state_io(self, io, 1);
}

static vh_status shard_state_load(void *self, const vh_state_io *io) {
    return shard_state_io(self, io, 0);
}

static const vh_sharding_vtable vtable = {
    .struct_size = sizeof(vh_sharding_vtable),
    .create = shard_create,
    .destroy = shard_destroy,
    .setup = shard_setup,
    .load_unit = shard_load_unit,
    .store_unit = shard_store_unit,
    .zero_grads = shard_zero_grads,
    .gather = shard_gather,
    .release = shard_release,
    .grads = shard_grads,
    .reduce = shard_reduce,
    .wait = shard_wait,
    .slices = shard_slices,
    .refresh = shard_refresh,
    .state_save = shard_state_save,
    .state_load = shard_state_load,
    /* memory (optional): bytes by kind for the run's memory report. */
};

VH_PLUGIN_DEFINE(VH_ROLE_SHARDING, "ddp_noverlap", "0.1.0",
                 "full f32 replicas, every gradient all-reduced at once after backward",
                 schema, vtable);
