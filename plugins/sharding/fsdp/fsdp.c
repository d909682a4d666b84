/* fsdp.c - the sharding role's fully sharded data-parallel plugin (ZeRO-3,
 * or ZeRO-2).
 *
 * Each unit is sharded in its element space (../common/shards.c, shards of
 * 16-element multiples): rank r keeps only its pieces of every unit. Its
 * device buffers:
 *
 *     packed   the compute copies of this rank's pieces, unit after unit,
 *              C bytes a unit (the largest rank's packing): what the
 *              all-gathers send. An f32 piece is its own master (the slice
 *              points into `packed`: fp32 runs keep one copy, as ddp).
 *     grad32   f32 [S] per unit: the reduced gradient shard the optimizer
 *              reads (the slices point into it).
 * and the core's f32 masters and optimizer state of its pieces. The slices
 * are one per piece, `replicated` 0: the ranks' lists hold every element
 * once.
 *
 * Gather. gather(u) all-gathers the unit's C bytes from every rank
 * (VH_DTYPE_U8) into a staging buffer of world * C and unpacks every rank's
 * pieces into a full buffer laid out by vh_unit_layout_init with the
 * policy's parameter dtypes, as the model expects (and as ddp lays it out).
 * The full buffer lives until release: ZeRO-3 (reshard_after_forward, the
 * default) frees it at every release, so backward gathers again; ZeRO-2
 * keeps it after the forward's release until the unit's backward (the
 * release after its `grads`) frees it; a gather of a unit that is still held
 * reuses it without communication. refresh (after the optimizer) and
 * load_unit drop what is held, which would be stale.
 *
 * Prefetch (on by default). When a unit is gathered, the all-gather of the
 * next unit in execution order is started and left in flight (its staging
 * only; it is unpacked when that unit's gather comes): forward u+1, backward
 * u-1. The direction comes from the call sequence alone, which is the same
 * on every rank (so is every collective): gather(u) is backward when u is
 * the unit gathered last or the one before it. zero_grads and wait start
 * afresh (the next gather is a forward). One prefetch at most is in flight:
 * a mispredicted one is finished and dropped when the next starts, and wait
 * drops any (the optimizer may write the shards it reads).
 *
 * Reduce. grads(u) hands out a zeroed full gradient buffer (the grad-dtype
 * layout); reduce(u) packs it into the element space in the policy's
 * comm_dtype ([Np], zeros in the padding; device copy or convert per
 * parameter), frees it, and starts a reduce-scatter with VH_REDUCE_OP_AVG
 * (the mean over ranks, as ddp's all-reduce) into this rank's [S]: straight
 * into grad32 when comm_dtype is f32, else into a 16-bit [S] that is widened
 * when the reduction finishes. As in ddp, f32 gradients never travel in 16
 * bits: when comm_dtype is 16-bit, the unit's f32-gradient parameters (norms
 * under AMP; few elements) are all-reduced apart in f32 and each rank keeps
 * its pieces. At most FSDP_MAX_REDUCTIONS units' reductions are in flight;
 * the oldest is finished before another starts, so the send buffers do not
 * add up to the model's size; wait finishes the rest in the order they
 * started. In a step that reduced nothing, wait reduces the grads handed out.
 *
 * Accumulation (set_sync 0, ABI 2.2). reduce does nothing (the core skips
 * it): each unit keeps its full grad buffer across micro-batches, backward
 * adds to it, and the sync micro-batch's reduce packs and reduce-scatters
 * the sum once. Memory: every unit's full grads at once until then.
 *
 * Memory (memory()): params the packed shards, grads the grad32 shards,
 * masters and optim_state the f32 shards; comm_buffers the transient ones
 * (gather staging, full gathered units, full grad buffers, reduce buffers):
 * their planned peak, or the peak seen so far when that is larger.
 */
#include "../common/sharding_core.h"

#include <string.h>

#define FSDP_SHARD_ALIGN 16     /* elements: 64 bytes of f32 */
#define FSDP_MAX_REDUCTIONS 2   /* reduce-scatters in flight at once */

typedef struct fsdp_unit {
    void *full;            /* the gathered compute copy, or NULL */
    int backward;          /* grads handed out in this step: its release is backward's */
    void *grad_buf;        /* full grads of this step until reduce packs them, or NULL */
    int64_t side_numel;    /* f32 gradients reduced apart */
} fsdp_unit;

/* One unit's reduction in flight. Its buffers are carved from one: */
typedef struct fsdp_reduction {
    int32_t unit;
    void *buf;                /* transient, zeroed: send, recv and side end to end */
    size_t bytes;
    void *send;               /* the element space [Np] in the wire dtype */
    void *recv;               /* [S] in a 16-bit wire dtype; NULL: received into grad32 */
    float *side;              /* the f32 grads under a 16-bit wire; NULL: none */
    vh_comm_request *req, *side_req;
    int failed;               /* a start failed: finishing only frees */
} fsdp_reduction;

typedef struct fsdp {
    sh_core core;          /* first: the instance is the core's */
    int reshard_after_forward, prefetch; /* the config's */
    fsdp_unit *units;      /* host memory, one per unit */
    int64_t *side_at;      /* host memory, per parameter: offset in its unit's f32 side
                            * reduction, or -1 */
    /* device memory */
    void *packed;
    float *grad32;
    /* collectives in flight */
    fsdp_reduction red[FSDP_MAX_REDUCTIONS]; /* a FIFO */
    int32_t red_first, red_count;
    int32_t pf_unit;       /* the prefetched unit, or -1 */
    void *pf_staging;
    vh_comm_request *pf_req;
    int32_t last_gathered; /* -1: the next gather is a forward */
    int64_t plan;          /* the planned peak of the transient buffers */
} fsdp;

static fsdp *fsdp_of(sh_core *c) { return (fsdp *)(void *)c; }
static const fsdp *fsdp_of_const(const sh_core *c) { return (const fsdp *)(const void *)c; }

static const vh_config_key schema[] = {
    {"reshard_after_forward", VH_CONFIG_TYPE_BOOL, "true",
     "free a unit's gathered parameters after its forward and gather again in backward "
     "(ZeRO-3); false keeps them until the unit's backward (ZeRO-2)",
     NULL, 0, 0, 0},
    {"prefetch", VH_CONFIG_TYPE_BOOL, "true",
     "when a unit is gathered, start the all-gather of the next unit in execution order",
     NULL, 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static vh_status fsdp_configure(sh_core *c) {
    fsdp *d = fsdp_of(c);
    vh_host *host = c->host;
    int reshard = 1, prefetch = 1;
    vh_status st = host->api->config_bool(host, "reshard_after_forward", &reshard);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the bool key 'reshard_after_forward'");
    st = host->api->config_bool(host, "prefetch", &prefetch);
    if (st != VH_STATUS_OK) return host->api->fail(host, st, "cannot read the bool key 'prefetch'");
    d->reshard_after_forward = reshard != 0;
    d->prefetch = prefetch != 0;
    d->pf_unit = -1;
    d->last_gathered = -1;
    return VH_STATUS_OK;
}

/* Finishes and drops the prefetch in flight, if any. */
static vh_status prefetch_drop(fsdp *d) {
    if (d->pf_unit < 0) return VH_STATUS_OK;
    const int32_t unit = d->pf_unit;
    d->pf_unit = -1;
    vh_status st = sh_shards_gather_finish(&d->core, unit, &d->pf_staging, d->pf_req, NULL);
    d->pf_req = NULL;
    return st;
}

/* Bytes of a unit's reduction buffers: send, recv and side. */
static size_t reduction_bytes(const fsdp *d, int32_t unit, size_t part[3]) {
    const sh_core *c = &d->core;
    const int64_t s = c->sd.units[unit].shard;
    const vh_dtype wire = c->policy.comm_dtype;
    part[0] = (size_t)s * (size_t)c->world * vh_dtype_size(wire);
    part[1] = wire == VH_DTYPE_F32 ? 0 : (size_t)s * vh_dtype_size(wire);
    part[2] = (size_t)d->units[unit].side_numel * sizeof(float);
    return part[0] + part[1] + part[2];
}

static vh_status reduction_finish(fsdp *d);

static void fsdp_release(sh_core *c) {
    fsdp *d = fsdp_of(c);
    /* The buffers belong to a collective until it has finished. */
    if (d->units) {
        (void)prefetch_drop(d);
        while (d->red_count > 0) (void)reduction_finish(d);
        for (int32_t u = 0; u < c->num_units; u++) {
            sh_tmp_free(c, &d->units[u].full, c->units[u].param_bytes);
            sh_tmp_free(c, &d->units[u].grad_buf, c->units[u].grad_bytes);
        }
    }
    sh_dev_free(c, d->packed);
    sh_dev_free(c, d->grad32);
    c->host->api->free(c->host, d->units);
    c->host->api->free(c->host, d->side_at);
    /* Back to the state after create: only the config stays. */
    const int reshard = d->reshard_after_forward, prefetch = d->prefetch;
    memset((char *)d + sizeof d->core, 0, sizeof *d - sizeof d->core);
    d->reshard_after_forward = reshard;
    d->prefetch = prefetch;
    d->pf_unit = d->last_gathered = -1;
}

/* ---- setup -------------------------------------------------------------- */

/* The f32 gradients reduced apart under a 16-bit wire (see "Reduce"). */
static void plan_sides(fsdp *d) {
    sh_core *c = &d->core;
    const vh_dtype wire = c->policy.comm_dtype;
    for (int32_t u = 0; u < c->num_units; u++) {
        const sh_unit *un = &c->units[u];
        for (int32_t n = un->first_param; n < un->first_param + un->num_params; n++) {
            d->side_at[n] = -1;
            if (c->params[n].grad_dtype != VH_DTYPE_F32 || wire == VH_DTYPE_F32) continue;
            d->side_at[n] = d->units[u].side_numel;
            d->units[u].side_numel += c->params[n].numel;
        }
    }
}

/* The transient peak: a gather and a prefetch in flight, the gathered units
 * (one under ZeRO-3; every unit at the end of forward under ZeRO-2), one
 * full grad buffer and the reductions in flight. */
static void plan_peak(fsdp *d) {
    const sh_core *c = &d->core;
    size_t max_c = 0, max_param = 0, sum_param = 0, max_grad = 0, max_red = 0;
    for (int32_t u = 0; u < c->num_units; u++) {
        const sh_unit *un = &c->units[u];
        size_t part[3], red = reduction_bytes(d, u, part);
        if (c->sd.units[u].packed_bytes > max_c) max_c = c->sd.units[u].packed_bytes;
        if (un->param_bytes > max_param) max_param = un->param_bytes;
        if (un->grad_bytes > max_grad) max_grad = un->grad_bytes;
        if (red > max_red) max_red = red;
        sum_param += un->param_bytes;
    }
    d->plan = (int64_t)(2 * (size_t)c->world * max_c +
                        (d->reshard_after_forward ? max_param : sum_param) + max_grad +
                        FSDP_MAX_REDUCTIONS * max_red);
}

static vh_status fsdp_plan(sh_core *c) {
    fsdp *d = fsdp_of(c);
    vh_host *host = c->host;
    vh_status st = sh_shards_plan(c, c->world, c->rank, FSDP_SHARD_ALIGN);
    if (st != VH_STATUS_OK) return st;
    size_t unit_bytes = (size_t)c->num_units * sizeof *d->units;
    d->units = host->api->alloc(host, unit_bytes);
    d->side_at = host->api->alloc(host, (size_t)c->num_params * sizeof *d->side_at);
    if (!d->units || !d->side_at)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d units",
                               (int)c->num_units);
    memset(d->units, 0, unit_bytes);
    plan_sides(d);
    plan_peak(d);
    return VH_STATUS_OK;
}

static vh_status fsdp_alloc(sh_core *c) {
    fsdp *d = fsdp_of(c);
    vh_status st = sh_alloc_zeroed(c, c->sd.packed_bytes, &d->packed, "the parameter shards");
    void *buf = NULL;
    if (st == VH_STATUS_OK)
        st = sh_alloc_zeroed(c, (size_t)c->sd.numel * sizeof(float), &buf,
                             "the f32 gradient shards");
    d->grad32 = buf;
    return st;
}

/* This rank's compute copy of a piece, in `packed`. */
static void *fsdp_piece_param(const sh_core *c, int32_t unit, const sh_piece *pc) {
    return (char *)fsdp_of_const(c)->packed + c->sd.units[unit].packed_at + pc->packed_at;
}

/* Always f32: a 16-bit reduce-scatter lands in a per-collective buffer
 * that the next unit reuses, so the shard is kept widened in grad32. */
static void *fsdp_piece_grad(const sh_core *c, int32_t unit, const sh_piece *pc,
                             vh_dtype *dtype) {
    *dtype = VH_DTYPE_F32;
    return fsdp_of_const(c)->grad32 + c->sd.units[unit].shard_at + pc->shard_elem;
}

/* ---- per-unit calls ----------------------------------------------------- */

/* Drops what is held of a unit: a prefetch in flight, a kept gathered copy. */
static vh_status unit_drop(fsdp *d, int32_t unit) {
    vh_status st = VH_STATUS_OK;
    if (d->pf_unit == unit) st = prefetch_drop(d);
    if (d->core.units[unit].gathered == 0)
        sh_tmp_free(&d->core, &d->units[unit].full, d->core.units[unit].param_bytes);
    return st;
}

static vh_status fsdp_load_unit(sh_core *c, int32_t unit, float *values) {
    vh_status st = unit_drop(fsdp_of(c), unit);
    /* Every rank was given the same values and keeps its pieces of them. */
    return st == VH_STATUS_OK ? sh_shards_load(c, unit, values, 1) : st;
}

static vh_status fsdp_zero_grads(sh_core *c) {
    fsdp *d = fsdp_of(c);
    /* Units a reduction never reached keep zeros; full grad buffers are
     * handed out zeroed when asked for. */
    vh_status st = c->dev->memset_zero(c->dev->device, d->grad32,
                                       (size_t)c->sd.numel * sizeof(float), NULL);
    if (st != VH_STATUS_OK)
        return c->host->api->fail(c->host, st, "zeroing the gradient shards on %s failed",
                                  sh_dev_name(c));
    for (int32_t u = 0; u < c->num_units; u++) {
        /* left by an abandoned step */
        sh_tmp_free(c, &d->units[u].grad_buf, c->units[u].grad_bytes);
        d->units[u].backward = 0;
    }
    d->last_gathered = -1;
    return VH_STATUS_OK;
}

/* Finishes a unit's all-gather into a new full buffer (the unit's `full`). */
static vh_status gather_finish(fsdp *d, int32_t unit, void *staging, vh_comm_request *req) {
    sh_core *c = &d->core;
    const size_t bytes = c->units[unit].param_bytes;
    /* Zeroed: the padding after each parameter is zero, as in ddp's buffers. */
    void *full = NULL;
    vh_status st = sh_tmp_alloc(c, bytes, 1, &full, "a gathered unit");
    vh_status st2 = sh_shards_gather_finish(c, unit, &staging, req, full);
    if (st == VH_STATUS_OK) st = st2;
    if (st != VH_STATUS_OK) sh_tmp_free(c, &full, bytes);
    d->units[unit].full = full;
    return st;
}

/* Starts the all-gather of `unit` in the prefetch slot, unless it is out of
 * range, held, or there already; another unit's prefetch is dropped first. */
static vh_status prefetch_start(fsdp *d, int32_t unit) {
    sh_core *c = &d->core;
    if (unit < 0 || unit >= c->num_units || d->units[unit].full || d->pf_unit == unit)
        return VH_STATUS_OK;
    vh_status st = prefetch_drop(d);
    if (st != VH_STATUS_OK) return st;
    const void *mine = (const char *)d->packed + c->sd.units[unit].packed_at;
    st = sh_shards_gather_start(c, unit, mine, &d->pf_staging, &d->pf_req);
    if (st == VH_STATUS_OK) d->pf_unit = unit;
    return st;
}

static vh_status fsdp_gather(sh_core *c, int32_t unit, const void **params) {
    fsdp *d = fsdp_of(c);
    fsdp_unit *fu = &d->units[unit];
    /* Direction from the call sequence alone (the same on every rank). */
    const int backward = d->last_gathered >= 0 &&
                         (unit == d->last_gathered || unit == d->last_gathered - 1);
    const int32_t next = backward ? unit - 1 : unit + 1;
    d->last_gathered = unit;
    vh_status st;
    if (!fu->full) {
        /* Not prefetched: it is now (a mispredicted prefetch is dropped). */
        if ((st = prefetch_start(d, unit)) != VH_STATUS_OK) return st;
        void *staging = d->pf_staging;
        vh_comm_request *req = d->pf_req;
        d->pf_staging = NULL;
        d->pf_req = NULL;
        d->pf_unit = -1;
        /* The next one goes out before this one is waited for. */
        vh_status pst = d->prefetch ? prefetch_start(d, next) : VH_STATUS_OK;
        st = gather_finish(d, unit, staging, req);
        if (st == VH_STATUS_OK) st = pst;
        if (st != VH_STATUS_OK) return st;
    } else if (d->prefetch && (st = prefetch_start(d, next)) != VH_STATUS_OK) {
        return st;
    }
    *params = fu->full;
    return VH_STATUS_OK;
}

static vh_status fsdp_release_unit(sh_core *c, int32_t unit) {
    fsdp *d = fsdp_of(c);
    /* ZeRO-3 frees at every release; ZeRO-2 at the unit's backward only. */
    if (c->units[unit].gathered == 0 && (d->reshard_after_forward || d->units[unit].backward))
        sh_tmp_free(c, &d->units[unit].full, c->units[unit].param_bytes);
    return VH_STATUS_OK;
}

static vh_status fsdp_grads(sh_core *c, int32_t unit, void **grads) {
    fsdp_unit *fu = &fsdp_of(c)->units[unit];
    vh_status st;
    if (!fu->grad_buf && (st = sh_tmp_alloc(c, c->units[unit].grad_bytes, 1, &fu->grad_buf,
                                            "a unit's gradients")) != VH_STATUS_OK)
        return st;
    fu->backward = 1;
    *grads = fu->grad_buf;
    return VH_STATUS_OK;
}

/* Finishes the oldest reduction in flight: the 16-bit shard widened into
 * grad32, this rank's pieces of the f32 side reduction copied there. */
static vh_status reduction_finish(fsdp *d) {
    sh_core *c = &d->core;
    fsdp_reduction *r = &d->red[d->red_first];
    d->red_first = (d->red_first + 1) % FSDP_MAX_REDUCTIONS;
    d->red_count--;
    const sh_unit *u = &c->units[r->unit];
    const sh_shard_unit *su = &c->sd.units[r->unit];
    vh_status st = c->comm->ops->wait(c->comm, r->req);
    vh_status st2 = c->comm->ops->wait(c->comm, r->side_req);
    r->req = r->side_req = NULL;
    if (st == VH_STATUS_OK) st = st2;
    if (r->failed || st != VH_STATUS_OK) {
        sh_tmp_free(c, &r->buf, r->bytes);
        if (r->failed) return VH_STATUS_ERR_INTERNAL; /* said when it failed; step abandoned */
        return sh_fail_comm(c, st, "waiting for the gradient reduce-scatter", r->unit);
    }
    float *shard = d->grad32 + su->shard_at;
    if (r->recv)
        st = sh_cast(c, shard, VH_DTYPE_F32, r->recv, c->policy.comm_dtype, (size_t)su->shard);
    for (int32_t j = su->own_first; r->side && st == VH_STATUS_OK &&
                                    j < su->own_first + su->own_count;
         j++) {
        const sh_piece *pc = &c->sd.pieces[j];
        const int64_t side_at = d->side_at[u->first_param + pc->param];
        if (side_at < 0) continue;
        st = sh_cast(c, shard + pc->shard_elem, VH_DTYPE_F32,
                     r->side + side_at + pc->offset, VH_DTYPE_F32, (size_t)pc->count);
    }
    sh_tmp_free(c, &r->buf, r->bytes);
    if (st != VH_STATUS_OK)
        return sh_fail_device(c, st, "widening the reduced gradients of", r->unit, -1);
    return VH_STATUS_OK;
}

/* A unit's full grads into r's buffers: the element space in the wire
 * dtype, f32 grads apart under a 16-bit wire. Without grads handed out the
 * unit sends zeros (the other ranks' sum). */
static vh_status reduction_pack(fsdp *d, int32_t unit, fsdp_reduction *r) {
    sh_core *c = &d->core;
    const sh_unit *u = &c->units[unit];
    const vh_dtype wire = c->policy.comm_dtype;
    const size_t cs = vh_dtype_size(wire);
    const char *grads = d->units[unit].grad_buf;
    for (int32_t i = 0; grads && i < u->num_params; i++) {
        const sh_param *p = &c->params[u->first_param + i];
        const int64_t side_at = d->side_at[u->first_param + i];
        vh_status st =
            side_at >= 0
                ? sh_cast(c, r->side + side_at, VH_DTYPE_F32, grads + p->grad_at,
                          VH_DTYPE_F32, (size_t)p->numel)
                : sh_cast(c, (char *)r->send + (size_t)p->elem * cs, wire, grads + p->grad_at,
                          p->grad_dtype, (size_t)p->numel);
        if (st != VH_STATUS_OK)
            return sh_fail_device(c, st, "packing the gradients of", unit, i);
    }
    return VH_STATUS_OK;
}

/* Starts r's reduce-scatter (and its f32 side all-reduce). */
static vh_status reduction_collectives(fsdp *d, fsdp_reduction *r) {
    sh_core *c = &d->core;
    const int32_t unit = r->unit;
    const sh_shard_unit *su = &c->sd.units[unit];
    const vh_dtype wire = c->policy.comm_dtype;
    void *recv = r->recv ? r->recv : (void *)(d->grad32 + su->shard_at);
    vh_status st = c->comm->ops->reduce_scatter_start(c->comm, r->send, recv, (size_t)su->shard,
                                                      wire, VH_REDUCE_OP_AVG, NULL, &r->req);
    if (st != VH_STATUS_OK) {
        r->req = NULL;
        return sh_fail_comm(c, st, "starting the gradient reduce-scatter", unit);
    }
    if (!r->side) return VH_STATUS_OK;
    st = c->comm->ops->all_reduce_start(c->comm, r->side, (size_t)d->units[unit].side_numel,
                                        VH_DTYPE_F32, VH_REDUCE_OP_AVG, NULL, &r->side_req);
    if (st != VH_STATUS_OK) {
        r->side_req = NULL;
        return sh_fail_comm(c, st, "starting the f32 gradient all-reduce", unit);
    }
    return VH_STATUS_OK;
}

/* Packs a unit's full grads and starts their reduction. */
static vh_status fsdp_reduce(sh_core *c, int32_t unit) {
    fsdp *d = fsdp_of(c);
    vh_status st;
    if (d->red_count == FSDP_MAX_REDUCTIONS && (st = reduction_finish(d)) != VH_STATUS_OK)
        return st;
    fsdp_reduction *r = &d->red[(d->red_first + d->red_count) % FSDP_MAX_REDUCTIONS];
    memset(r, 0, sizeof *r);
    r->unit = unit;
    size_t part[3];
    r->bytes = reduction_bytes(d, unit, part);
    st = sh_tmp_alloc(c, r->bytes, 1, &r->buf, "the gradient reduction buffers");
    if (st == VH_STATUS_OK) {
        r->send = r->buf;
        r->recv = part[1] ? (char *)r->buf + part[0] : NULL;
        r->side = part[2] ? (float *)(void *)((char *)r->buf + part[0] + part[1]) : NULL;
    }
    if (st == VH_STATUS_OK) st = reduction_pack(d, unit, r);
    /* Packed: the full grads are no longer needed (grads is refused now). */
    sh_tmp_free(c, &d->units[unit].grad_buf, c->units[unit].grad_bytes);
    if (st == VH_STATUS_OK) st = reduction_collectives(d, r);
    /* Queued even after a failure, so what did start is finished (and the
     * buffers freed) by wait. */
    r->failed = st != VH_STATUS_OK;
    d->red_count++;
    return st;
}

static vh_status fsdp_wait(sh_core *c) {
    fsdp *d = fsdp_of(c);
    vh_status st = VH_STATUS_OK;
    /* A step that reduced nothing: the grads handed out are reduced now, in
     * unit order, so the shards hold them (every rank, same order). */
    const int none_reduced = c->pending == 0;
    for (int32_t u = 0; none_reduced && st == VH_STATUS_OK && u < c->num_units; u++) {
        if (!d->units[u].grad_buf) continue;
        c->units[u].reduced = 1;
        st = fsdp_reduce(c, u);
    }
    /* Every reduction still in flight, in the order they started. */
    while (d->red_count > 0) {
        vh_status s2 = reduction_finish(d);
        if (st == VH_STATUS_OK) st = s2;
    }
    /* The optimizer may now write the shards a prefetch would read. */
    vh_status s3 = prefetch_drop(d);
    if (st == VH_STATUS_OK) st = s3;
    d->last_gathered = -1;
    /* The backward is over: a later forward's release (evaluation) keeps
     * the gathered units under ZeRO-2 again. */
    for (int32_t u = 0; u < c->num_units; u++) d->units[u].backward = 0;
    return st;
}

/* A micro-batch of gradient accumulation starts (set_sync): the last
 * one's backward had no wait (a sync 0 backward keeps each unit's full
 * grad_buf, which the next backward adds to and the sync backward's reduce
 * packs once), so the next gather is a forward and no release is a
 * backward's. */
static vh_status fsdp_micro_start(sh_core *c) {
    fsdp *d = fsdp_of(c);
    vh_status st = prefetch_drop(d);
    d->last_gathered = -1;
    for (int32_t u = 0; u < c->num_units; u++) d->units[u].backward = 0;
    return st;
}

static vh_status fsdp_refresh(sh_core *c, int updated) {
    fsdp *d = fsdp_of(c);
    vh_status st = prefetch_drop(d);
    if (st != VH_STATUS_OK) return st;
    /* Gathered copies held over (ZeRO-2, evaluation) are out of date now. */
    for (int32_t u = 0; u < c->num_units; u++)
        sh_tmp_free(c, &d->units[u].full, c->units[u].param_bytes);
    return sh_shards_refresh_local(c, updated);
}

/* See "Memory"; an aliased master is counted once, under params. */
static void fsdp_memory(const sh_core *c, vh_sharding_memory *m) {
    const int64_t plan = fsdp_of_const(c)->plan;
    m->params = (int64_t)c->sd.packed_bytes;
    m->grads = c->sd.numel * (int64_t)sizeof(float);
    m->comm_buffers = c->peak > plan ? c->peak : plan;
}

static const sh_strategy fsdp_strategy = {
    .name = "fsdp", .size = sizeof(fsdp), .replicated = 0,
    .comm = SH_COMM_ALL_REDUCE | SH_COMM_ALL_GATHER | SH_COMM_REDUCE_SCATTER,
    .configure = fsdp_configure, .plan = fsdp_plan, .alloc = fsdp_alloc, .release = fsdp_release,
    .piece_param = fsdp_piece_param, .piece_grad = fsdp_piece_grad,
    .load_unit = fsdp_load_unit, .zero_grads = fsdp_zero_grads,
    .gather = fsdp_gather, .release_unit = fsdp_release_unit, .grads = fsdp_grads,
    .reduce = fsdp_reduce, .wait = fsdp_wait, .refresh = fsdp_refresh, .memory = fsdp_memory,
    .micro_start = fsdp_micro_start,
};

SH_PLUGIN_DEFINE(fsdp_strategy, "fsdp", "0.1.0",
                 "fully sharded data parallel: shards per unit, all-gather before use, grads "
                 "reduce-scattered (ZeRO-3, or ZeRO-2)",
                 schema);
