/* core.c - the sharding core (sharding_core.h): what every strategy does the
 * same way.
 *
 * Life cycle. create checks the device (alloc, free, copy, memset_zero) and
 * the communicator calls the strategy needs, then reads its keys. setup
 * reads and checks the setup (sharding_checks.c), lays out every unit twice
 * (compute and gradient dtypes), lets the strategy place everything
 * (plan), allocates the f32 masters and optimizer state of the pieces this
 * rank owns, lets the strategy allocate its buffers and builds the slices.
 * A refused or failed setup leaves the plugin as before it; destroy frees
 * everything, finishing the collectives in flight first.
 *
 * Call order is checked here, since a mistake silently desynchronises
 * ranks: gathers and releases balance, a unit is reduced at most once per
 * step (zero_grads starts a step), its grads are not handed out again after
 * its reduce, zero_grads waits for wait, and wait refuses a step in which
 * some units were reduced and others not (a bucket missing a unit would
 * never start, or start on one rank only); the step then stays open:
 * reducing the rest and waiting again completes it. Neither refresh nor
 * load_unit may change a unit the model holds (gathered, not released).
 *
 * set_sync (ABI 2.2, gradient accumulation): with sync 0, reduce neither
 * marks the unit nor calls the strategy, and wait returns at once, so the
 * grads stay this rank's and the next backward adds to them; the sync 1
 * backward then reduces the sum as in any step.
 *
 * load_unit and store_unit speak fp32 values, the unit's elements end to
 * end. load_unit copies them to the device once; the strategy sets the
 * compute copies it keeps and the f32 masters of the pieces this rank owns
 * from there. store_unit gathers every rank's masters (f32; a
 * 16-bit compute copy that is its own master widened) and copies the unit
 * back, on every rank.
 *
 * State io moves the optimizer state of this rank's slices (f32, at each
 * slice's offset within its parameter). Where every rank holds the same
 * state (ddp: `replicated`), rank 0 alone writes it and every rank reads it;
 * otherwise each rank writes and reads its own pieces. Either way the file
 * does not depend on the world size.
 *
 * memory() reports this rank's bytes: masters and optim_state from the
 * core, params, grads and comm_buffers from the strategy.
 */
#include "sharding_core.h"

#include <stdio.h>
#include <string.h>

#include "vithost/vh_optim.h"

const char *sh_dev_name(const sh_core *c) { return c->dev->name ? c->dev->name : "the device"; }

/* ---- life cycle --------------------------------------------------------- */

static int comm_has(const vh_comm *comm, unsigned need) {
    if (!comm || !comm->ops || !comm->ops->wait) return 0;
    const vh_comm_ops *o = comm->ops;
    return (!(need & SH_COMM_ALL_REDUCE) || o->all_reduce_start) &&
           (!(need & SH_COMM_ALL_GATHER) || o->all_gather_start) &&
           (!(need & SH_COMM_REDUCE_SCATTER) || o->reduce_scatter_start);
}

static vh_status refuse_comm(vh_host *host, unsigned need) {
    static const char *const names[] = {"all_reduce_start", "all_gather_start",
                                        "reduce_scatter_start"};
    char list[96] = "";
    for (unsigned i = 0; i < 3; i++) {
        if (!(need & (1u << i))) continue;
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", names[i]);
    }
    return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                           "the host gave no communicator with %s%swait", list,
                           list[0] ? " and " : "");
}

vh_status sh_create(vh_host *host, const sh_strategy *ops, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    const vh_device_ops *dev = host->api->device(host);
    if (!dev) return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "the host gave no device");
    if (!dev->alloc || !dev->free || !dev->copy || !dev->memset_zero)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "device %s lacks alloc, free, copy or memset_zero, which %s "
                               "needs for its buffers",
                               dev->name ? dev->name : "?", ops->name);
    vh_comm *comm = host->api->comm(host);
    if (!comm_has(comm, ops->comm)) return refuse_comm(host, ops->comm);
    sh_core *c = host->api->alloc(host, ops->size);
    if (!c) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(c, 0, ops->size);
    c->host = host;
    c->dev = dev;
    c->comm = comm;
    c->ops = ops;
    vh_status st = ops->configure ? ops->configure(c) : VH_STATUS_OK;
    if (st != VH_STATUS_OK) {
        host->api->free(host, c);
        return st;
    }
    *self = c;
    return VH_STATUS_OK;
}

void sh_dev_free(sh_core *c, void *ptr) {
    if (ptr) c->dev->free(c->dev->device, ptr);
}

vh_status sh_alloc_zeroed(sh_core *c, size_t bytes, void **out, const char *what) {
    const vh_device_ops *dev = c->dev;
    *out = NULL;
    if (bytes == 0) return VH_STATUS_OK;
    vh_status st = dev->alloc(dev->device, bytes, out);
    if (st != VH_STATUS_OK || !*out) {
        *out = NULL;
        return c->host->api->fail(c->host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                  "allocating %s (%zu bytes) on %s failed", what, bytes,
                                  sh_dev_name(c));
    }
    st = dev->memset_zero(dev->device, *out, bytes, NULL);
    if (st != VH_STATUS_OK)
        return c->host->api->fail(c->host, st, "zeroing %s on %s failed", what, sh_dev_name(c));
    return VH_STATUS_OK;
}

vh_status sh_tmp_alloc(sh_core *c, size_t bytes, int zero, void **out, const char *what) {
    const vh_device_ops *dev = c->dev;
    *out = NULL;
    vh_status st = dev->alloc(dev->device, bytes ? bytes : 1, out);
    if (st != VH_STATUS_OK || !*out) {
        *out = NULL;
        return c->host->api->fail(c->host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                  "allocating %s (%zu bytes) on %s failed", what, bytes,
                                  sh_dev_name(c));
    }
    c->live += (int64_t)bytes;
    if (c->live > c->peak) c->peak = c->live;
    if (zero && bytes && (st = dev->memset_zero(dev->device, *out, bytes, NULL)) != VH_STATUS_OK) {
        sh_tmp_free(c, out, bytes);
        return c->host->api->fail(c->host, st, "zeroing %s on %s failed", what, sh_dev_name(c));
    }
    return VH_STATUS_OK;
}

void sh_tmp_free(sh_core *c, void **ptr, size_t bytes) {
    if (!*ptr) return;
    c->dev->free(c->dev->device, *ptr);
    c->live -= (int64_t)bytes;
    *ptr = NULL;
}

vh_status sh_fail_comm(const sh_core *c, vh_status st, const char *what, int32_t unit) {
    return c->host->api->fail(c->host, st, "%s of unit %d (%s) over %d ranks failed", what,
                              (int)unit, sh_unit_name(&c->units[unit]), (int)c->world);
}

vh_status sh_fail_device(const sh_core *c, vh_status st, const char *what, int32_t unit,
                         int32_t param) {
    char p[32] = "";
    if (param >= 0) snprintf(p, sizeof p, " param %d", (int)param);
    return c->host->api->fail(c->host, st, "%s unit %d (%s)%s on %s failed", what, (int)unit,
                              sh_unit_name(&c->units[unit]), p, sh_dev_name(c));
}

vh_status sh_cast(const sh_core *c, void *dst, vh_dtype dst_dtype, const void *src,
                  vh_dtype src_dtype, size_t n) {
    const vh_device_ops *dev = c->dev;
    if (dst_dtype == src_dtype)
        return dev->copy(dev->device, dst, src, n * vh_dtype_size(dst_dtype),
                         VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
    return dev->convert(dev->device, dst, dst_dtype, src, src_dtype, n, NULL);
}

/* Frees every buffer and returns to the state before setup. */
static void core_release(sh_core *c) {
    vh_host *host = c->host;
    c->ops->release(c); /* first: its collectives may use the buffers below */
    sh_shards_release(c);
    sh_dev_free(c, c->masters);
    for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) sh_dev_free(c, c->state[k]);
    host->api->free(host, c->units);
    host->api->free(host, c->params);
    host->api->free(host, c->slices);
    c->units = NULL;
    c->params = NULL;
    c->slices = NULL;
    c->masters = NULL;
    memset(c->state, 0, sizeof c->state);
    c->num_units = c->num_params = c->pending = 0;
    c->masters_numel = c->live = c->peak = 0;
    c->ready = 0;
}

void sh_destroy(void *self) {
    sh_core *c = self;
    if (!c) return;
    core_release(c);
    c->host->api->free(c->host, c);
}

/* ---- setup -------------------------------------------------------------- */

/* Unit u's record and its parameters' (from index *n on), from the unit's
 * two layouts. */
static vh_status plan_unit(sh_core *c, int32_t u, int32_t *n) {
    const vh_unit_desc *ud = &c->table->units[u];
    vh_unit_layout pl, gl;
    vh_status st = vh_unit_layout_init(&pl, ud, vh_policy_param_dtype, &c->policy);
    if (st == VH_STATUS_OK) {
        st = vh_unit_layout_init(&gl, ud, vh_policy_grad_dtype, &c->policy);
        if (st != VH_STATUS_OK) vh_unit_layout_free(&pl);
    }
    if (st != VH_STATUS_OK)
        return c->host->api->fail(c->host, st, "laying out unit %d (%s) failed", (int)u,
                                  ud->name ? ud->name : "?");
    sh_unit *un = &c->units[u];
    un->name = ud->name;
    un->numel = ud->numel;
    un->first_param = *n;
    un->num_params = ud->num_params;
    un->param_bytes = pl.bytes;
    un->grad_bytes = gl.bytes;
    for (int32_t i = 0; i < ud->num_params; i++, (*n)++) {
        sh_param *p = &c->params[*n];
        p->numel = ud->params[i].numel;
        p->elem = ud->params[i].offset;
        p->param_dtype = pl.dtypes[i];
        p->grad_dtype = gl.dtypes[i];
        p->param_at = pl.offsets[i];
        p->grad_at = gl.offsets[i];
    }
    vh_unit_layout_free(&pl);
    vh_unit_layout_free(&gl);
    return VH_STATUS_OK;
}

/* The unit and parameter records (host memory). */
static vh_status plan_table(sh_core *c) {
    vh_host *host = c->host;
    const vh_param_table *t = c->table;
    int32_t nparams = 0;
    for (int32_t u = 0; u < t->num_units; u++) nparams += t->units[u].num_params;
    size_t unit_bytes = (size_t)t->num_units * sizeof *c->units;
    size_t param_bytes = (size_t)nparams * sizeof *c->params;
    c->units = host->api->alloc(host, unit_bytes);
    c->params = host->api->alloc(host, param_bytes);
    if (!c->units || !c->params)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d units",
                               (int)t->num_units);
    memset(c->units, 0, unit_bytes);
    memset(c->params, 0, param_bytes);
    c->num_units = t->num_units;
    c->num_params = nparams;
    int32_t n = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        vh_status st = plan_unit(c, u, &n);
        if (st != VH_STATUS_OK) return st;
    }
    return VH_STATUS_OK;
}

/* The own pieces' masters and state (device) and their slices (host). */
static vh_status alloc_core(sh_core *c) {
    size_t bytes = (size_t)c->sd.num_own * sizeof(vh_param_slice);
    c->slices = c->host->api->alloc(c->host, bytes ? bytes : sizeof(vh_param_slice));
    if (!c->slices)
        return c->host->api->fail(c->host, VH_STATUS_ERR_NOMEM, "out of memory for %d slices",
                                  (int)c->sd.num_own);
    memset(c->slices, 0, bytes);
    void *buf;
    vh_status st = sh_alloc_zeroed(c, (size_t)c->masters_numel * sizeof(float), &buf,
                                   "the f32 master parameters");
    c->masters = buf;
    for (int32_t k = 0; k < c->state_slots && st == VH_STATUS_OK; k++) {
        st = sh_alloc_zeroed(c, (size_t)c->sd.numel * sizeof(float), &buf,
                             "the optimizer state");
        c->state[k] = buf;
    }
    return st;
}

/* Says which slices take ABI 2.9's shortcuts, so a run's log shows whether
 * the optimizer reads 16-bit gradients and writes the compute copies. */
static void log_fused(const sh_core *c) {
    int32_t half = 0, compute = 0;
    vh_dtype dtype = VH_DTYPE_F32;
    for (int32_t s = 0; s < c->sd.num_own; s++) {
        if (c->slices[s].grad_dtype != VH_DTYPE_F32) half++, dtype = c->slices[s].grad_dtype;
        if (c->slices[s].compute) compute++;
    }
    if (half == 0 && compute == 0) return;
    char reads[96] = "", writes[64] = "";
    if (half > 0)
        snprintf(reads, sizeof reads, "reads %d gradients in %s as reduced (no f32 copy)",
                 (int)half, vh_dtype_name(dtype));
    if (compute > 0) snprintf(writes, sizeof writes, "writes %d compute copies itself", (int)compute);
    c->host->api->log(c->host, VH_LOG_LEVEL_INFO, "of %d slices, the optimizer %s%s%s",
                      (int)c->sd.num_own, reads, half > 0 && compute > 0 ? " and " : "", writes);
}

vh_status sh_setup(void *self, const vh_sharding_setup *setup) {
    sh_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = c->host;
    if (c->ready)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "setup called twice; %s allocates its buffers once", c->ops->name);
    vh_sharding_setup s;
    vh_precision_policy pol;
    vh_status st = sharding_read_setup(host, c->dev, c->comm, c->ops->name, setup, &s, &pol);
    if (st != VH_STATUS_OK) return st;
    /* Nothing here communicates: every rank places every rank's part. */
    c->table = s.table;
    c->world = c->comm->world_size;
    c->rank = c->comm->rank;
    c->policy = pol;
    c->state_slots = s.state_slots;
    c->half_grads = (s.optim_caps & VH_OPTIM_CAP_HALF_GRADS) && pol.unit_loss_scale;
    c->writes_compute = (s.optim_caps & VH_OPTIM_CAP_WRITES_COMPUTE) != 0;
    st = plan_table(c);
    if (st == VH_STATUS_OK) st = c->ops->plan(c);
    if (st == VH_STATUS_OK) st = alloc_core(c);
    if (st == VH_STATUS_OK) st = c->ops->alloc(c);
    if (st != VH_STATUS_OK) {
        /* Leave the plugin as before setup; the message is already recorded. */
        core_release(c);
        return st;
    }
    sh_shards_slices(c);
    c->ready = 1;
    log_fused(c);
    return VH_STATUS_OK;
}

/* ---- per-unit calls ----------------------------------------------------- */

/* The instance and unit of a per-unit call, or NULL after recording why. */
static sh_unit *unit_call(void *self, int32_t unit, const char *call, sh_core **out,
                          vh_status *st) {
    sh_core *c = *out = self;
    *st = VH_STATUS_ERR_INVALID_ARG;
    if (!c) return NULL;
    if (!c->ready) {
        *st = c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "%s before setup", call);
        return NULL;
    }
    if (unit < 0 || unit >= c->num_units) {
        *st = c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                 "%s: unit %d is not in [0, %d)", call, (int)unit,
                                 (int)c->num_units);
        return NULL;
    }
    *st = VH_STATUS_OK;
    return &c->units[unit];
}

vh_status sh_load_unit(void *self, int32_t unit, const float *values) {
    sh_core *c;
    vh_status st;
    sh_unit *u = unit_call(self, unit, "load_unit", &c, &st);
    if (!u) return st;
    if (!values)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "load_unit: NULL values");
    if (u->gathered > 0)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                  "load_unit of unit %d (%s) while it is gathered: the model's "
                                  "copy would change under it",
                                  (int)unit, sh_unit_name(u));
    const vh_device_ops *dev = c->dev;
    const size_t bytes = (size_t)u->numel * sizeof(float);
    void *buf = NULL;
    if ((st = sh_tmp_alloc(c, bytes, 0, &buf, "f32 scratch")) != VH_STATUS_OK) return st;
    st = dev->copy(dev->device, buf, values, bytes, VH_COPY_KIND_HOST_TO_DEVICE, NULL);
    if (st != VH_STATUS_OK)
        st = c->host->api->fail(c->host, st, "load_unit: copying unit %d (%s) to %s failed",
                                (int)unit, sh_unit_name(u), sh_dev_name(c));
    if (st == VH_STATUS_OK) st = c->ops->load_unit(c, unit, buf);
    /* The caller's values are read; a stream device finishes before the free. */
    if (st == VH_STATUS_OK && dev->synchronize &&
        (st = dev->synchronize(dev->device)) != VH_STATUS_OK)
        st = sh_fail_device(c, st, "load_unit: synchronizing after", unit, -1);
    sh_tmp_free(c, &buf, bytes);
    return st;
}

vh_status sh_store_unit(void *self, int32_t unit, float *values) {
    sh_core *c;
    vh_status st;
    sh_unit *u = unit_call(self, unit, "store_unit", &c, &st);
    if (!u) return st;
    if (!values)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "store_unit: NULL values");
    float *all = NULL;
    if ((st = sh_shards_gather_masters(c, unit, &all)) != VH_STATUS_OK) return st;
    st = c->dev->copy(c->dev->device, values, all, (size_t)u->numel * sizeof(float),
                      VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (st != VH_STATUS_OK)
        st = c->host->api->fail(c->host, st, "store_unit: copying unit %d (%s) from %s failed",
                                (int)unit, sh_unit_name(u), sh_dev_name(c));
    void *b = all;
    sh_tmp_free(c, &b, (size_t)(c->sd.units[unit].shard * c->sd.world) * sizeof(float));
    return st;
}

vh_status sh_zero_grads(void *self) {
    sh_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = c->host;
    if (!c->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "zero_grads before setup");
    if (c->pending > 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "zero_grads with %d reduction(s) not waited for: call wait "
                               "after backward",
                               (int)c->pending);
    vh_status st = c->ops->zero_grads(c);
    if (st != VH_STATUS_OK) return st;
    for (int32_t u = 0; u < c->num_units; u++) c->units[u].reduced = 0;
    return VH_STATUS_OK;
}

vh_status sh_gather(void *self, int32_t unit, const void **params) {
    sh_core *c;
    vh_status st;
    sh_unit *u = unit_call(self, unit, "gather", &c, &st);
    if (!u) return st;
    if (!params) return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "gather: NULL out");
    if (u->gathered == INT32_MAX)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                  "gather: unit %d (%s) gathered %d times without release",
                                  (int)unit, sh_unit_name(u), (int)u->gathered);
    if ((st = c->ops->gather(c, unit, params)) != VH_STATUS_OK) return st;
    u->gathered++;
    return VH_STATUS_OK;
}

vh_status sh_release(void *self, int32_t unit) {
    sh_core *c;
    vh_status st;
    sh_unit *u = unit_call(self, unit, "release", &c, &st);
    if (!u) return st;
    if (u->gathered < 1)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                  "release of unit %d (%s), which is not gathered", (int)unit,
                                  sh_unit_name(u));
    u->gathered--;
    return c->ops->release_unit(c, unit);
}

vh_status sh_grads(void *self, int32_t unit, void **grads) {
    sh_core *c;
    vh_status st;
    sh_unit *u = unit_call(self, unit, "grads", &c, &st);
    if (!u) return st;
    if (!grads) return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "grads: NULL out");
    if (u->reduced)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                  "grads of unit %d (%s) asked for after its reduce in this "
                                  "step; whatever is added now would miss the other ranks",
                                  (int)unit, sh_unit_name(u));
    return c->ops->grads(c, unit, grads);
}

vh_status sh_reduce(void *self, int32_t unit) {
    sh_core *c;
    vh_status st;
    sh_unit *u = unit_call(self, unit, "reduce", &c, &st);
    if (!u) return st;
    if (u->reduced)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                  "reduce of unit %d (%s) twice in one step: its grads are "
                                  "already reduced (zero_grads starts the next step)",
                                  (int)unit, sh_unit_name(u));
    /* set_sync(0): the grads stay this rank's and the next backward adds
     * to them; the unit is not reduced (its grads may be asked again). */
    if (c->nosync) return VH_STATUS_OK;
    /* From here the unit counts as reduced, even if a start fails: wait
     * then finishes what did start, and the step is abandoned anyway. */
    u->reduced = 1;
    c->pending++;
    return c->ops->reduce(c, unit);
}

vh_status sh_wait(void *self) {
    sh_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = c->host;
    if (!c->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "wait before setup");
    if (c->pending > 0) {
        for (int32_t u = 0; u < c->num_units; u++)
            if (!c->units[u].reduced)
                return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                       "wait: unit %d (%s) was not reduced in this step while "
                                       "others were; its grads would differ across ranks",
                                       (int)u, sh_unit_name(&c->units[u]));
    }
    /* after a sync 0 backward nothing is in flight, and the local grads
     * must not be reduced yet (fsdp's wait reduces unreduced grads) */
    if (c->nosync) return VH_STATUS_OK;
    vh_status st = c->ops->wait(c);
    c->pending = 0;
    return st;
}

vh_status sh_set_sync(void *self, int32_t sync) {
    sh_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = c->host;
    if (!c->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "set_sync before setup");
    if (sync != 0 && sync != 1)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "set_sync(%d): sync is 0 or 1",
                               (int)sync);
    /* a switch with reductions in flight would leave a step half reduced */
    if (c->pending > 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "set_sync with %d reduction(s) not waited for: call wait "
                               "after a sync backward",
                               (int)c->pending);
    c->nosync = sync == 0;
    return c->ops->micro_start ? c->ops->micro_start(c) : VH_STATUS_OK;
}

/* ---- the optimizer's view ------------------------------------------------ */

vh_status sh_slices(void *self, vh_param_slices *out) {
    sh_core *c = self;
    if (!c || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (!c->ready)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "slices before setup");
    /* has_grad_sum_sq and grad_sum_sq stay 0: ABI 2.1 hands the sum of
     * squares to the optimizer itself, and nobody writes them. */
    memset(out, 0, sizeof *out);
    out->items = c->slices;
    out->count = c->sd.num_own;
    out->item_size = (uint32_t)sizeof(vh_param_slice);
    /* 1: every rank holds every slice, so sums over them are local; 0:
     * every element on one rank, so they span ranks. */
    out->replicated = c->ops->replicated;
    return VH_STATUS_OK;
}

static vh_status refresh_call(void *self, int updated) {
    sh_core *c = self;
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    const char *call = updated ? "refresh_updated" : "refresh";
    if (!c->ready)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "%s before setup", call);
    for (int32_t u = 0; u < c->num_units; u++)
        if (c->units[u].gathered > 0)
            return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                      "%s while unit %d (%s) is gathered: the model's copy "
                                      "would change under it (release it first)",
                                      call, (int)u, sh_unit_name(&c->units[u]));
    return c->ops->refresh(c, updated);
}

vh_status sh_refresh(void *self) { return refresh_call(self, 0); }

/* After an update: the optimizer wrote the compute copies of the slices that
 * carry them (only with writes_compute; otherwise this is refresh). */
vh_status sh_refresh_updated(void *self) { return refresh_call(self, 1); }

/* ---- optimizer state and memory ------------------------------------------ */

static vh_status state_io(sh_core *c, const vh_state_io *io, int save) {
    if (!c->ready)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG, "%s before setup",
                                  save ? "state_save" : "state_load");
    int32_t count = save && c->ops->replicated && c->rank != 0 ? 0 : c->sd.num_own;
    return sharding_state_io(c->host, c->dev, c->table, c->slices, count, c->state_slots, io,
                             save);
}

vh_status sh_state_save(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return state_io(self, io, 1);
}

vh_status sh_state_load(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return state_io(self, io, 0);
}

/* masters: the separate f32 masters (a compute copy that is its own master
 * is counted once, under params); optim_state: the slots' shards. */
vh_status sh_memory(void *self, vh_sharding_memory *out) {
    sh_core *c = self;
    if (!c || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (out->struct_size < sizeof out->struct_size)
        return c->host->api->fail(c->host, VH_STATUS_ERR_INVALID_ARG,
                                  "memory: out->struct_size is %u; the caller sets it",
                                  (unsigned)out->struct_size);
    vh_sharding_memory m;
    memset(&m, 0, sizeof m);
    c->ops->memory(c, &m);
    m.masters = c->masters_numel * (int64_t)sizeof(float);
    m.optim_state = (int64_t)c->state_slots * c->sd.numel * (int64_t)sizeof(float);
    /* Fill what the caller's (possibly older) struct covers. */
    size_t n = out->struct_size < sizeof m ? out->struct_size : sizeof m;
    memcpy((char *)out + sizeof m.struct_size, (const char *)&m + sizeof m.struct_size,
           n - sizeof m.struct_size);
    return VH_STATUS_OK;
}
