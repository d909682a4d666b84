/* fsdp.c - the sharding role's fully sharded data-parallel plugin.
 *
 * Each unit is sharded in its ELEMENT space: the unit's parameters end to
 * end at vh_param_desc.offset, N elements (the fp32 master layout). N is
 * padded to Np = world * S, the shard size S rounded up to a multiple of 16
 * elements so every shard stays 64-byte aligned in f32; rank r owns elements
 * [r*S, (r+1)*S). A parameter may straddle ranks: each rank's part of a
 * parameter is a "piece" (unit, parameter, element range). Every rank
 * computes the pieces of every rank (a function of the table, the policy and
 * the world size), since it unpacks them all after an all-gather.
 *
 * Buffers of one rank, in the device's memory:
 *
 *     packed   the compute copies of this rank's pieces, unit after unit,
 *              each piece in its parameter's compute dtype at a 64-byte
 *              aligned offset. Ranks hold different bytes when dtypes are
 *              mixed (AMP keeps norms f32), so every rank's part of a unit is
 *              padded to the largest, C bytes: the all-gather's count.
 *     masters  f32 masters of the pieces whose compute copy is 16-bit under
 *              master weights; an f32 piece is its own master (the slice
 *              points into `packed`: fp32 runs keep one copy, as ddp), and
 *              without master weights the optimizer updates the 16-bit piece.
 *     grad32   f32 [S] per unit: the reduced gradient shard the optimizer
 *              reads (the slices point into it).
 *     state[k] f32 [S] per unit, one per optimizer state slot.
 *
 * The optimizer's slices are one per piece of this rank (offset and count
 * within the parameter), with `replicated` 0: the ranks' lists together hold
 * every element once.
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
 * started.
 *
 * load_unit keeps this rank's pieces of the full values every rank passes;
 * store_unit all-gathers an f32 [S] view (the masters, or the compute shard
 * widened) so every rank gets the full values. state_save / state_load move
 * each rank's pieces only, so a checkpoint does not depend on the world size.
 *
 * Memory (memory()): params the packed shards, grads the grad32 shards,
 * masters and optim_state the f32 shards; comm_buffers the transient ones
 * (gather staging, full gathered units, full grad buffers, reduce buffers):
 * their planned peak, or the peak seen so far when that is larger.
 *
 * Call order is checked as in ddp: gather/release balance, a unit reduced
 * at most once per step, no grads after its reduce, zero_grads only after
 * wait, and no refresh or load_unit of a unit while it is gathered.
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

#include "../common/sharding_checks.h"

#define FSDP_SHARD_ALIGN 16     /* elements: 64 bytes of f32 */
#define FSDP_MAX_REDUCTIONS 2   /* reduce-scatters in flight at once */

typedef struct fsdp_param {
    int64_t numel;
    int64_t elem;          /* first element in the unit's element space */
    vh_dtype param_dtype;  /* of the compute copy */
    vh_dtype grad_dtype;   /* as backward writes it */
    size_t param_at;       /* byte offset in the unit's full compute buffer */
    size_t grad_at;        /* byte offset in the unit's full grad buffer */
    int64_t side_at;       /* element offset in the unit's f32 side reduction, or -1 */
} fsdp_param;

typedef struct fsdp_piece {
    int32_t rank;
    int32_t param;         /* within the unit */
    int64_t offset, count; /* elements within the parameter */
    int64_t shard_elem;    /* first element within the rank's shard [0, S) */
    size_t packed_at;      /* byte offset within the rank's C bytes of the unit */
    int64_t master_at;     /* this rank's pieces: offset in `masters`; -1 when aliased */
} fsdp_piece;

typedef struct fsdp_unit {
    const char *name;      /* the table's, for messages */
    int64_t numel;         /* N */
    int64_t shard;         /* S; Np = S * world */
    int32_t first_param, num_params;   /* into fsdp.params_ */
    int32_t first_piece, num_pieces;   /* every rank's, rank-major, into fsdp.pieces */
    int32_t own_first, own_count;      /* this rank's (absolute indices into fsdp.pieces) */
    size_t packed_bytes;   /* C */
    size_t packed_at;      /* byte offset of this rank's C bytes in `packed` */
    int64_t shard_at;      /* element offset in grad32 and the state buffers */
    size_t param_bytes, grad_bytes;    /* the full layouts */
    int64_t side_numel;    /* f32 gradients reduced apart */
    int32_t gathered;      /* gathers not yet released */
    void *full;            /* the gathered compute copy, or NULL */
    int backward;          /* grads handed out in this step: its release is backward's */
    void *grad_buf;        /* full grads of this step until reduce packs them, or NULL */
    int reduced;           /* reduce was called for this unit in the current step */
} fsdp_unit;

/* One unit's reduction in flight. */
typedef struct fsdp_reduction {
    int32_t unit;
    void *send, *recv, *side; /* recv NULL: received into grad32 */
    size_t send_bytes, recv_bytes, side_bytes;
    vh_comm_request *req, *side_req;
    int failed;               /* a start failed: finishing only frees */
} fsdp_reduction;

typedef struct fsdp {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    int32_t world, rank;   /* read at setup */
    int ready;
    int reshard_after_forward, prefetch;
    const vh_param_table *table; /* the setup's; lives as long as the model */
    vh_precision_policy policy;
    int32_t state_slots;
    fsdp_unit *units;      /* host memory */
    int32_t num_units;
    fsdp_param *params_;   /* host memory, every parameter of every unit */
    int32_t num_params;
    fsdp_piece *pieces;    /* host memory, every rank's pieces of every unit */
    int32_t num_pieces;
    int32_t num_own;       /* this rank's pieces: the slices */
    /* device memory from here on */
    void *packed;
    size_t packed_bytes;
    float *masters;
    int64_t masters_numel;
    float *grad32;         /* also the state's element count per slot */
    int64_t shard_numel;
    float *state[VH_OPTIM_MAX_STATE_SLOTS];
    vh_param_slice *slices; /* host memory, one per own piece */
    /* collectives in flight */
    fsdp_reduction red[FSDP_MAX_REDUCTIONS]; /* a FIFO */
    int32_t red_first, red_count;
    int32_t pf_unit;       /* the prefetched unit, or -1 */
    void *pf_staging;
    vh_comm_request *pf_req;
    int32_t last_gathered; /* -1: the next gather is a forward */
    int32_t pending;       /* units reduced and not yet waited for */
    /* transient device bytes: live now, the largest seen, the planned peak */
    int64_t live, peak, plan;
} fsdp;

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

static const char *unit_name(const fsdp_unit *u) { return u->name ? u->name : "?"; }

static const char *dev_name(const fsdp *d) { return d->dev->name ? d->dev->name : "the device"; }


static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ---- life cycle --------------------------------------------------------- */

static vh_status fsdp_create(vh_host *host, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    int reshard = 1, prefetch = 1;
    vh_status st = host->api->config_bool(host, "reshard_after_forward", &reshard);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "cannot read the bool key 'reshard_after_forward'");
    st = host->api->config_bool(host, "prefetch", &prefetch);
    if (st != VH_STATUS_OK) return host->api->fail(host, st, "cannot read the bool key 'prefetch'");
    const vh_device_ops *dev = host->api->device(host);
    if (!dev) return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "the host gave no device");
    if (!dev->alloc || !dev->free || !dev->copy || !dev->memset_zero)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "device %s lacks alloc, free, copy or memset_zero, which fsdp "
                               "needs for its buffers",
                               dev->name ? dev->name : "?");
    vh_comm *comm = host->api->comm(host);
    if (!comm || !comm->ops || !comm->ops->all_gather_start || !comm->ops->reduce_scatter_start ||
        !comm->ops->wait)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                               "the host gave no communicator with all_gather_start, "
                               "reduce_scatter_start and wait");
    fsdp *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    d->dev = dev;
    d->comm = comm;
    d->reshard_after_forward = reshard != 0;
    d->prefetch = prefetch != 0;
    d->pf_unit = -1;
    d->last_gathered = -1;
    *self = d;
    return VH_STATUS_OK;
}

static void dev_free(fsdp *d, void *ptr) {
    if (ptr) d->dev->free(d->dev->device, ptr);
}

/* Transient device buffers (staging, gathered units, grads, reductions):
 * counted for memory(). A stream device's free waits for the ops issued on
 * the buffer (cudaFree does), so a buffer may be freed right after the ops
 * that read it were issued. */
static vh_status tmp_alloc(fsdp *d, size_t bytes, int zero, void **out, const char *what) {
    const vh_device_ops *dev = d->dev;
    *out = NULL;
    vh_status st = dev->alloc(dev->device, bytes ? bytes : 1, out);
    if (st != VH_STATUS_OK || !*out) {
        *out = NULL;
        return d->host->api->fail(d->host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                  "allocating %s (%zu bytes) on %s failed", what, bytes,
                                  dev_name(d));
    }
    d->live += (int64_t)bytes;
    if (d->live > d->peak) d->peak = d->live;
    if (zero && bytes) {
        st = dev->memset_zero(dev->device, *out, bytes, NULL);
        if (st != VH_STATUS_OK) {
            dev->free(dev->device, *out);
            d->live -= (int64_t)bytes;
            *out = NULL;
            return d->host->api->fail(d->host, st, "zeroing %s on %s failed", what, dev_name(d));
        }
    }
    return VH_STATUS_OK;
}

static void tmp_free(fsdp *d, void **ptr, size_t bytes) {
    if (!*ptr) return;
    d->dev->free(d->dev->device, *ptr);
    d->live -= (int64_t)bytes;
    *ptr = NULL;
}

/* Finishes and drops the prefetch in flight, if any. */
static vh_status prefetch_drop(fsdp *d) {
    if (d->pf_unit < 0) return VH_STATUS_OK;
    const fsdp_unit *u = &d->units[d->pf_unit];
    vh_status st = d->comm->ops->wait(d->comm, d->pf_req);
    d->pf_req = NULL;
    tmp_free(d, &d->pf_staging, (size_t)d->world * u->packed_bytes);
    d->pf_unit = -1;
    if (st != VH_STATUS_OK)
        return d->host->api->fail(d->host, st, "waiting for the all-gather of unit %s over %d "
                                               "ranks failed",
                                  unit_name(u), (int)d->world);
    return VH_STATUS_OK;
}

static void reduction_free(fsdp *d, fsdp_reduction *r) {
    tmp_free(d, &r->send, r->send_bytes);
    tmp_free(d, &r->recv, r->recv_bytes);
    tmp_free(d, &r->side, r->side_bytes);
}

/* Frees every buffer and returns to the state before setup. */
static void release_buffers(fsdp *d) {
    vh_host *host = d->host;
    /* The buffers belong to a collective until it has finished. */
    if (d->units) {
        (void)prefetch_drop(d);
        for (int32_t k = 0; k < d->red_count; k++) {
            fsdp_reduction *r = &d->red[(d->red_first + k) % FSDP_MAX_REDUCTIONS];
            (void)d->comm->ops->wait(d->comm, r->req);
            (void)d->comm->ops->wait(d->comm, r->side_req);
            reduction_free(d, r);
        }
        for (int32_t u = 0; u < d->num_units; u++) {
            tmp_free(d, &d->units[u].full, d->units[u].param_bytes);
            tmp_free(d, &d->units[u].grad_buf, d->units[u].grad_bytes);
        }
    }
    dev_free(d, d->packed);
    dev_free(d, d->masters);
    dev_free(d, d->grad32);
    for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) dev_free(d, d->state[k]);
    host->api->free(host, d->units);
    host->api->free(host, d->params_);
    host->api->free(host, d->pieces);
    host->api->free(host, d->slices);
    int reshard = d->reshard_after_forward, prefetch = d->prefetch;
    vh_comm *comm = d->comm;
    const vh_device_ops *dev = d->dev;
    memset(d, 0, sizeof *d);
    d->host = host;
    d->dev = dev;
    d->comm = comm;
    d->reshard_after_forward = reshard;
    d->prefetch = prefetch;
    d->pf_unit = -1;
    d->last_gathered = -1;
}

static void fsdp_destroy(void *self) {
    fsdp *d = self;
    if (!d) return;
    release_buffers(d);
    d->host->api->free(d->host, d);
}

/* ---- setup -------------------------------------------------------------- */



/* Rank r's pieces of a unit, in parameter order, appended at pieces + *n
 * (NULL: only counted); returns the rank's packed bytes. */
static size_t rank_pieces(const fsdp *d, const fsdp_unit *un, int32_t r, fsdp_piece *pieces,
                          int32_t *n) {
    const int64_t lo = (int64_t)r * un->shard, hi = lo + un->shard;
    size_t at = 0;
    for (int32_t i = 0; i < un->num_params; i++) {
        const fsdp_param *p = &d->params_[un->first_param + i];
        int64_t first = p->elem > lo ? p->elem : lo;
        int64_t end = p->elem + p->numel < hi ? p->elem + p->numel : hi;
        if (first >= end) continue;
        if (pieces) {
            fsdp_piece *pc = &pieces[*n];
            pc->rank = r;
            pc->param = i;
            pc->offset = first - p->elem;
            pc->count = end - first;
            pc->shard_elem = first - lo;
            pc->packed_at = at;
            pc->master_at = -1;
        }
        (*n)++;
        at = align_up(at + (size_t)(end - first) * vh_dtype_size(p->param_dtype), VH_UNIT_ALIGN);
    }
    return at;
}

/* Where everything goes: parameters, every rank's pieces, the unit ranges
 * and the planned peak of the transient buffers. Host memory only. */
static vh_status plan(fsdp *d, const vh_param_table *t) {
    vh_host *host = d->host;
    const vh_precision_policy *pol = &d->policy;
    const size_t csize = vh_dtype_size(pol->comm_dtype);
    int32_t nparams = 0;
    for (int32_t u = 0; u < t->num_units; u++) nparams += t->units[u].num_params;
    size_t unit_bytes = (size_t)t->num_units * sizeof *d->units;
    size_t param_bytes = (size_t)nparams * sizeof *d->params_;
    d->units = host->api->alloc(host, unit_bytes);
    d->params_ = host->api->alloc(host, param_bytes);
    if (!d->units || !d->params_)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d units",
                               (int)t->num_units);
    memset(d->units, 0, unit_bytes);
    memset(d->params_, 0, param_bytes);
    d->num_units = t->num_units;
    d->num_params = nparams;

    /* Parameters, shard sizes and the number of pieces. */
    int32_t n = 0;
    int64_t npieces = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        fsdp_unit *un = &d->units[u];
        vh_unit_layout pl, gl;
        vh_status st = vh_unit_layout_init(&pl, ud, vh_policy_param_dtype, pol);
        if (st == VH_STATUS_OK) {
            st = vh_unit_layout_init(&gl, ud, vh_policy_grad_dtype, pol);
            if (st != VH_STATUS_OK) vh_unit_layout_free(&pl);
        }
        if (st != VH_STATUS_OK)
            return host->api->fail(host, st, "laying out unit %d (%s) failed", (int)u,
                                   ud->name ? ud->name : "?");
        un->name = ud->name;
        un->numel = ud->numel;
        int64_t s = (ud->numel + d->world - 1) / d->world;
        un->shard = (s + FSDP_SHARD_ALIGN - 1) / FSDP_SHARD_ALIGN * FSDP_SHARD_ALIGN;
        un->first_param = n;
        un->num_params = ud->num_params;
        un->param_bytes = pl.bytes;
        un->grad_bytes = gl.bytes;
        for (int32_t i = 0; i < ud->num_params; i++, n++) {
            fsdp_param *p = &d->params_[n];
            p->numel = ud->params[i].numel;
            p->elem = ud->params[i].offset;
            p->param_dtype = pl.dtypes[i];
            p->grad_dtype = gl.dtypes[i];
            p->param_at = pl.offsets[i];
            p->grad_at = gl.offsets[i];
            /* f32 grads never travel in 16 bits (see "Reduce"). */
            p->side_at = -1;
            if (p->grad_dtype == VH_DTYPE_F32 && pol->comm_dtype != VH_DTYPE_F32) {
                p->side_at = un->side_numel;
                un->side_numel += p->numel;
            }
        }
        vh_unit_layout_free(&pl);
        vh_unit_layout_free(&gl);
        for (int32_t r = 0; r < d->world; r++) {
            int32_t c = 0;
            (void)rank_pieces(d, un, r, NULL, &c);
            npieces += c;
        }
        if (npieces > INT32_MAX / 2)
            return host->api->fail(host, VH_STATUS_ERR_NOMEM, "too many pieces over %d ranks",
                                   (int)d->world);
    }
    for (int32_t u = 0; u < d->num_units; u++)
        if (d->units[u].side_numel && !d->comm->ops->all_reduce_start)
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "the communicator lacks all_reduce_start, which the f32 "
                                   "gradients under a %s wire need",
                                   vh_dtype_name(pol->comm_dtype));

    size_t piece_bytes = (size_t)npieces * sizeof *d->pieces;
    d->pieces = host->api->alloc(host, piece_bytes ? piece_bytes : 1);
    if (!d->pieces) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for pieces");
    memset(d->pieces, 0, piece_bytes);
    d->num_pieces = (int32_t)npieces;

    /* Every rank's pieces, rank-major; this rank's masters; buffer ranges. */
    int32_t k = 0;
    size_t max_c = 0, max_param = 0, sum_param = 0, max_grad = 0, max_red = 0;
    for (int32_t u = 0; u < d->num_units; u++) {
        fsdp_unit *un = &d->units[u];
        un->first_piece = k;
        size_t c = 0;
        for (int32_t r = 0; r < d->world; r++) {
            if (r == d->rank) un->own_first = k;
            int32_t before = k;
            size_t cr = rank_pieces(d, un, r, d->pieces, &k);
            if (r == d->rank) un->own_count = k - before;
            if (cr > c) c = cr;
        }
        un->num_pieces = k - un->first_piece;
        un->packed_bytes = c;
        un->packed_at = d->packed_bytes;
        d->packed_bytes += c;
        un->shard_at = d->shard_numel;
        d->shard_numel += un->shard;
        for (int32_t j = un->own_first; j < un->own_first + un->own_count; j++) {
            fsdp_piece *pc = &d->pieces[j];
            const fsdp_param *p = &d->params_[un->first_param + pc->param];
            if (pol->master_weights && p->param_dtype != VH_DTYPE_F32) {
                pc->master_at = d->masters_numel;
                d->masters_numel += (pc->count + FSDP_SHARD_ALIGN - 1) / FSDP_SHARD_ALIGN *
                                    FSDP_SHARD_ALIGN;
            }
        }
        d->num_own += un->own_count;
        size_t red = (size_t)un->shard * (size_t)d->world * csize +
                     (size_t)un->side_numel * sizeof(float) +
                     (pol->comm_dtype != VH_DTYPE_F32 ? (size_t)un->shard * csize : 0);
        if (c > max_c) max_c = c;
        if (un->param_bytes > max_param) max_param = un->param_bytes;
        if (un->grad_bytes > max_grad) max_grad = un->grad_bytes;
        if (red > max_red) max_red = red;
        sum_param += un->param_bytes;
    }
    /* The transient peak: a gather and a prefetch in flight, the gathered
     * units (one under ZeRO-3; every unit at the end of forward under
     * ZeRO-2), one full grad buffer and the reductions in flight. */
    d->plan = (int64_t)(2 * (size_t)d->world * max_c +
                        (d->reshard_after_forward ? max_param : sum_param) + max_grad +
                        FSDP_MAX_REDUCTIONS * max_red);
    return VH_STATUS_OK;
}

/* A zeroed device buffer of `bytes`; the message names what it is for. */
static vh_status alloc_zeroed(fsdp *d, size_t bytes, void **out, const char *what) {
    const vh_device_ops *dev = d->dev;
    *out = NULL;
    if (bytes == 0) return VH_STATUS_OK;
    vh_status st = dev->alloc(dev->device, bytes, out);
    if (st != VH_STATUS_OK || !*out) {
        *out = NULL;
        return d->host->api->fail(d->host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                  "allocating %s (%zu bytes) on %s failed", what, bytes,
                                  dev_name(d));
    }
    st = dev->memset_zero(dev->device, *out, bytes, NULL);
    if (st != VH_STATUS_OK)
        return d->host->api->fail(d->host, st, "zeroing %s on %s failed", what, dev_name(d));
    return VH_STATUS_OK;
}

static vh_status alloc_buffers(fsdp *d) {
    size_t shard_bytes = (size_t)d->shard_numel * sizeof(float);
    vh_status st = alloc_zeroed(d, d->packed_bytes, &d->packed, "the parameter shards");
    void *buf;
    if (st == VH_STATUS_OK) {
        st = alloc_zeroed(d, (size_t)d->masters_numel * sizeof(float), &buf,
                          "the f32 master shards");
        d->masters = buf;
    }
    if (st == VH_STATUS_OK) {
        st = alloc_zeroed(d, shard_bytes, &buf, "the f32 gradient shards");
        d->grad32 = buf;
    }
    for (int32_t k = 0; k < d->state_slots && st == VH_STATUS_OK; k++) {
        st = alloc_zeroed(d, shard_bytes, &buf, "the optimizer state shards");
        d->state[k] = buf;
    }
    return st;
}

static const fsdp_param *param_of(const fsdp *d, const fsdp_unit *u, const fsdp_piece *pc) {
    return &d->params_[u->first_param + pc->param];
}

/* This rank's compute copy of a piece, in `packed`. */
static void *piece_param(const fsdp *d, const fsdp_unit *u, const fsdp_piece *pc) {
    return (char *)d->packed + u->packed_at + pc->packed_at;
}

/* The master of a piece: its compute copy when aliased. */
static void *piece_master(const fsdp *d, const fsdp_unit *u, const fsdp_piece *pc) {
    return pc->master_at < 0 ? piece_param(d, u, pc) : (void *)(d->masters + pc->master_at);
}
static vh_dtype piece_master_dtype(const fsdp *d, const fsdp_unit *u, const fsdp_piece *pc) {
    return pc->master_at < 0 ? param_of(d, u, pc)->param_dtype : VH_DTYPE_F32;
}

static float *piece_grad(const fsdp *d, const fsdp_unit *u, const fsdp_piece *pc) {
    return d->grad32 + u->shard_at + pc->shard_elem;
}

/* One slice per piece of this rank. */
static vh_status build_slices(fsdp *d, const vh_param_table *t) {
    vh_host *host = d->host;
    size_t bytes = (size_t)d->num_own * sizeof(vh_param_slice);
    d->slices = host->api->alloc(host, bytes ? bytes : sizeof(vh_param_slice));
    if (!d->slices)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d slices",
                               (int)d->num_own);
    memset(d->slices, 0, bytes);
    int32_t s = 0;
    for (int32_t u = 0; u < d->num_units; u++) {
        const fsdp_unit *un = &d->units[u];
        for (int32_t j = un->own_first; j < un->own_first + un->own_count; j++, s++) {
            const fsdp_piece *pc = &d->pieces[j];
            vh_param_slice *sl = &d->slices[s];
            sl->unit = u;
            sl->param = pc->param;
            sl->offset = pc->offset;
            sl->count = pc->count;
            sl->flags = t->units[u].params[pc->param].flags;
            sl->master = piece_master(d, un, pc);
            sl->master_dtype = piece_master_dtype(d, un, pc);
            sl->grad = piece_grad(d, un, pc);
            sl->grad_dtype = VH_DTYPE_F32;
            for (int32_t k = 0; k < d->state_slots; k++)
                sl->state[k] = d->state[k] + un->shard_at + pc->shard_elem;
            sl->state_dtype = VH_DTYPE_F32;
        }
    }
    return VH_STATUS_OK;
}

static vh_status fsdp_setup(void *self, const vh_sharding_setup *setup) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (d->ready)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "setup called twice; fsdp allocates its buffers once");
    vh_sharding_setup s;
    vh_precision_policy pol;
    vh_status st = sharding_read_setup(host, d->dev, d->comm, "fsdp", setup, &s, &pol);
    if (st != VH_STATUS_OK) return st;

    /* Nothing here communicates: every rank computes every rank's pieces. */
    const vh_param_table *t = s.table;
    d->table = t;
    d->world = d->comm->world_size;
    d->rank = d->comm->rank;
    d->policy = pol;
    d->state_slots = s.state_slots;
    st = plan(d, t);
    if (st == VH_STATUS_OK) st = alloc_buffers(d);
    if (st == VH_STATUS_OK) st = build_slices(d, t);
    if (st != VH_STATUS_OK) {
        release_buffers(d);
        return st;
    }
    d->ready = 1;
    return VH_STATUS_OK;
}

/* ---- per-unit calls ----------------------------------------------------- */

/* The unit, or NULL after recording why. */
static fsdp_unit *unit_at(fsdp *d, int32_t unit, const char *call, vh_status *st) {
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

/* Drops what is held of a unit: a prefetch in flight, a kept gathered copy. */
static vh_status unit_drop(fsdp *d, int32_t unit) {
    fsdp_unit *u = &d->units[unit];
    vh_status st = VH_STATUS_OK;
    if (d->pf_unit == unit) st = prefetch_drop(d);
    if (u->gathered == 0) tmp_free(d, &u->full, u->param_bytes);
    return st;
}

/* A device f32 scratch buffer of n elements (load_unit, store_unit: rare,
 * so not kept). */
static vh_status scratch_f32(fsdp *d, int64_t n, int zero, float **out) {
    void *buf = NULL;
    vh_status st = tmp_alloc(d, (size_t)n * sizeof(float), zero, &buf, "f32 scratch");
    *out = buf;
    return st;
}

static vh_status fsdp_load_unit(void *self, int32_t unit, const float *values) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    fsdp_unit *u = unit_at(d, unit, "load_unit", &st);
    if (!u) return st;
    vh_host *host = d->host;
    if (!values) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "load_unit: NULL values");
    if (u->gathered > 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "load_unit of unit %d (%s) while it is gathered: its gathered "
                               "copy would go stale",
                               (int)unit, unit_name(u));
    if ((st = unit_drop(d, unit)) != VH_STATUS_OK) return st;
    const vh_device_ops *dev = d->dev;
    /* Every rank was given the same values and keeps its pieces of them. */
    for (int32_t j = u->own_first; j < u->own_first + u->own_count; j++) {
        const fsdp_piece *pc = &d->pieces[j];
        const fsdp_param *p = param_of(d, u, pc);
        const float *src = values + p->elem + pc->offset;
        size_t n = (size_t)pc->count;
        void *master = piece_master(d, u, pc);
        const char *what = "copying";
        if (piece_master_dtype(d, u, pc) == VH_DTYPE_F32) {
            st = dev->copy(dev->device, master, src, n * sizeof(float),
                           VH_COPY_KIND_HOST_TO_DEVICE, NULL);
            if (st == VH_STATUS_OK && pc->master_at >= 0) {
                what = "converting";
                st = dev->convert(dev->device, piece_param(d, u, pc), p->param_dtype, master,
                                  VH_DTYPE_F32, n, NULL);
            }
        } else { /* the 16-bit compute copy is the master: through f32 scratch */
            float *scratch = NULL;
            st = scratch_f32(d, pc->count, 0, &scratch);
            if (st != VH_STATUS_OK) return st;
            st = dev->copy(dev->device, scratch, src, n * sizeof(float),
                           VH_COPY_KIND_HOST_TO_DEVICE, NULL);
            if (st == VH_STATUS_OK) {
                what = "converting";
                st = dev->convert(dev->device, master, p->param_dtype, scratch, VH_DTYPE_F32, n,
                                  NULL);
            }
            /* The CPU has finished; a stream device must before the free. */
            if (st == VH_STATUS_OK && dev->synchronize) st = dev->synchronize(dev->device);
            void *buf = scratch;
            tmp_free(d, &buf, n * sizeof(float));
        }
        if (st != VH_STATUS_OK)
            return host->api->fail(host, st, "load_unit: %s unit %d (%s) param %d to %s failed",
                                   what, (int)unit, unit_name(u), (int)pc->param, dev_name(d));
    }
    return VH_STATUS_OK;
}

static vh_status fsdp_store_unit(void *self, int32_t unit, float *values) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    fsdp_unit *u = unit_at(d, unit, "store_unit", &st);
    if (!u) return st;
    vh_host *host = d->host;
    if (!values)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "store_unit: NULL values");
    const vh_device_ops *dev = d->dev;
    /* This rank's f32 [S] (zeros past the unit's end), then all of them. */
    float *mine = NULL, *all = NULL;
    if ((st = scratch_f32(d, u->shard, 1, &mine)) != VH_STATUS_OK) return st;
    st = scratch_f32(d, u->shard * d->world, 0, &all);
    for (int32_t j = u->own_first; st == VH_STATUS_OK && j < u->own_first + u->own_count; j++) {
        const fsdp_piece *pc = &d->pieces[j];
        const void *master = piece_master(d, u, pc);
        vh_dtype mt = piece_master_dtype(d, u, pc);
        float *dst = mine + pc->shard_elem;
        if (mt == VH_DTYPE_F32)
            st = dev->copy(dev->device, dst, master, (size_t)pc->count * sizeof(float),
                           VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
        else
            st = dev->convert(dev->device, dst, VH_DTYPE_F32, master, mt, (size_t)pc->count,
                              NULL);
        if (st != VH_STATUS_OK)
            st = host->api->fail(host, st, "store_unit: reading unit %d (%s) param %d on %s "
                                           "failed",
                                 (int)unit, unit_name(u), (int)pc->param, dev_name(d));
    }
    if (st == VH_STATUS_OK) {
        vh_comm_request *req = NULL;
        st = d->comm->ops->all_gather_start(d->comm, mine, all, (size_t)u->shard, VH_DTYPE_F32,
                                            NULL, &req);
        if (st == VH_STATUS_OK) st = d->comm->ops->wait(d->comm, req);
        if (st != VH_STATUS_OK)
            st = host->api->fail(host, st, "store_unit: all-gather of unit %d (%s) over %d "
                                           "ranks failed",
                                 (int)unit, unit_name(u), (int)d->world);
    }
    if (st == VH_STATUS_OK) {
        st = dev->copy(dev->device, values, all, (size_t)u->numel * sizeof(float),
                       VH_COPY_KIND_DEVICE_TO_HOST, NULL);
        if (st != VH_STATUS_OK)
            st = host->api->fail(host, st, "store_unit: copying unit %d (%s) from %s failed",
                                 (int)unit, unit_name(u), dev_name(d));
    }
    void *b = mine;
    tmp_free(d, &b, (size_t)u->shard * sizeof(float));
    b = all;
    tmp_free(d, &b, (size_t)(u->shard * d->world) * sizeof(float));
    return st;
}

static vh_status fsdp_zero_grads(void *self) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (!d->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "zero_grads before setup");
    if (d->pending > 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "zero_grads with %d reduction(s) not waited for: call wait "
                               "after backward",
                               (int)d->pending);
    /* Units a reduction never reached keep zeros; full grad buffers are
     * handed out zeroed when asked for. */
    const vh_device_ops *dev = d->dev;
    vh_status st = dev->memset_zero(dev->device, d->grad32,
                                    (size_t)d->shard_numel * sizeof(float), NULL);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "zeroing the gradient shards on %s failed", dev_name(d));
    for (int32_t u = 0; u < d->num_units; u++) {
        fsdp_unit *un = &d->units[u];
        tmp_free(d, &un->grad_buf, un->grad_bytes); /* left by an abandoned step */
        un->reduced = un->backward = 0;
    }
    d->last_gathered = -1;
    return VH_STATUS_OK;
}

/* Starts the all-gather of a unit's packed shards into a new staging buffer. */
static vh_status gather_start(fsdp *d, int32_t unit, void **staging, vh_comm_request **req) {
    const fsdp_unit *u = &d->units[unit];
    *req = NULL;
    vh_status st = tmp_alloc(d, (size_t)d->world * u->packed_bytes, 0, staging,
                             "the all-gather staging buffer");
    if (st != VH_STATUS_OK) return st;
    st = d->comm->ops->all_gather_start(d->comm, (char *)d->packed + u->packed_at, *staging,
                                        u->packed_bytes, VH_DTYPE_U8, NULL, req);
    if (st != VH_STATUS_OK) {
        *req = NULL;
        tmp_free(d, staging, (size_t)d->world * u->packed_bytes);
        return d->host->api->fail(d->host, st,
                                  "starting the all-gather of unit %d (%s)'s parameters (%zu "
                                  "bytes a rank) over %d ranks failed",
                                  (int)unit, unit_name(u), u->packed_bytes, (int)d->world);
    }
    return VH_STATUS_OK;
}

/* Finishes a unit's all-gather and unpacks every rank's pieces into a new
 * full buffer (u->full); frees the staging whatever happens. */
static vh_status gather_finish(fsdp *d, int32_t unit, void *staging, vh_comm_request *req) {
    fsdp_unit *u = &d->units[unit];
    vh_host *host = d->host;
    const vh_device_ops *dev = d->dev;
    const size_t stage_bytes = (size_t)d->world * u->packed_bytes;
    vh_status st = d->comm->ops->wait(d->comm, req);
    if (st != VH_STATUS_OK) {
        tmp_free(d, &staging, stage_bytes);
        return host->api->fail(host, st, "waiting for the all-gather of unit %d (%s) over %d "
                                         "ranks failed",
                               (int)unit, unit_name(u), (int)d->world);
    }
    void *full = NULL;
    st = tmp_alloc(d, u->param_bytes, 0, &full, "a gathered unit");
    /* The padding after each parameter is zero, as in ddp's buffers. */
    for (int32_t i = 0; st == VH_STATUS_OK && i < u->num_params; i++) {
        const fsdp_param *p = &d->params_[u->first_param + i];
        size_t end = p->param_at + (size_t)p->numel * vh_dtype_size(p->param_dtype);
        size_t next = i + 1 < u->num_params ? p[1].param_at : u->param_bytes;
        if (next > end) st = dev->memset_zero(dev->device, (char *)full + end, next - end, NULL);
    }
    for (int32_t j = u->first_piece; st == VH_STATUS_OK && j < u->first_piece + u->num_pieces;
         j++) {
        const fsdp_piece *pc = &d->pieces[j];
        const fsdp_param *p = param_of(d, u, pc);
        size_t es = vh_dtype_size(p->param_dtype);
        st = dev->copy(dev->device, (char *)full + p->param_at + (size_t)pc->offset * es,
                       (const char *)staging + (size_t)pc->rank * u->packed_bytes + pc->packed_at,
                       (size_t)pc->count * es, VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
    }
    tmp_free(d, &staging, stage_bytes);
    if (st != VH_STATUS_OK) {
        if (full) {
            host->api->fail(host, st, "unpacking the gathered unit %d (%s) on %s failed",
                            (int)unit, unit_name(u), dev_name(d));
            tmp_free(d, &full, u->param_bytes);
        }
        return st;
    }
    u->full = full;
    return VH_STATUS_OK;
}

/* Starts the all-gather of `next` unless it is out of range, held, or
 * prefetched already; a prefetch of another unit is dropped first. */
static vh_status prefetch_start(fsdp *d, int32_t next) {
    if (next < 0 || next >= d->num_units || d->units[next].full || d->pf_unit == next)
        return VH_STATUS_OK;
    vh_status st = prefetch_drop(d);
    if (st != VH_STATUS_OK) return st;
    st = gather_start(d, next, &d->pf_staging, &d->pf_req);
    if (st == VH_STATUS_OK) d->pf_unit = next;
    return st;
}

static vh_status fsdp_gather(void *self, int32_t unit, const void **params) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    fsdp_unit *u = unit_at(d, unit, "gather", &st);
    if (!u) return st;
    vh_host *host = d->host;
    if (!params) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "gather: NULL out");
    if (u->gathered == INT32_MAX)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "gather: unit %d (%s) gathered %d times without release",
                               (int)unit, unit_name(u), (int)u->gathered);
    /* Direction from the call sequence alone (the same on every rank). */
    const int backward = d->last_gathered >= 0 &&
                         (unit == d->last_gathered || unit == d->last_gathered - 1);
    const int32_t next = backward ? unit - 1 : unit + 1;
    d->last_gathered = unit;
    if (!u->full) {
        void *staging = NULL;
        vh_comm_request *req = NULL;
        if (d->pf_unit == unit) { /* prefetched: take it over */
            staging = d->pf_staging;
            req = d->pf_req;
            d->pf_staging = NULL;
            d->pf_req = NULL;
            d->pf_unit = -1;
        } else if ((st = gather_start(d, unit, &staging, &req)) != VH_STATUS_OK) {
            return st;
        }
        /* The next one goes out before this one is waited for. */
        vh_status pst = d->prefetch ? prefetch_start(d, next) : VH_STATUS_OK;
        st = gather_finish(d, unit, staging, req);
        if (st == VH_STATUS_OK) st = pst;
        if (st != VH_STATUS_OK) return st;
    } else if (d->prefetch && (st = prefetch_start(d, next)) != VH_STATUS_OK) {
        return st;
    }
    u->gathered++;
    *params = u->full;
    return VH_STATUS_OK;
}

static vh_status fsdp_release(void *self, int32_t unit) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    fsdp_unit *u = unit_at(d, unit, "release", &st);
    if (!u) return st;
    if (u->gathered < 1)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "release of unit %d (%s), which is not gathered", (int)unit,
                                  unit_name(u));
    u->gathered--;
    /* ZeRO-3 frees at every release; ZeRO-2 at the unit's backward only. */
    if (u->gathered == 0 && (d->reshard_after_forward || u->backward))
        tmp_free(d, &u->full, u->param_bytes);
    return VH_STATUS_OK;
}

static vh_status fsdp_grads(void *self, int32_t unit, void **grads) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    fsdp_unit *u = unit_at(d, unit, "grads", &st);
    if (!u) return st;
    if (!grads) return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "grads: NULL out");
    if (u->reduced)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "grads of unit %d (%s) asked for after its reduce in this "
                                  "step; whatever is added now would miss the other ranks",
                                  (int)unit, unit_name(u));
    if (!u->grad_buf &&
        (st = tmp_alloc(d, u->grad_bytes, 1, &u->grad_buf, "a unit's gradients")) != VH_STATUS_OK)
        return st;
    u->backward = 1;
    *grads = u->grad_buf;
    return VH_STATUS_OK;
}

/* Finishes the oldest reduction in flight: the 16-bit shard widened into
 * grad32, this rank's pieces of the f32 side reduction copied there. */
static vh_status reduction_finish(fsdp *d) {
    fsdp_reduction *r = &d->red[d->red_first];
    d->red_first = (d->red_first + 1) % FSDP_MAX_REDUCTIONS;
    d->red_count--;
    const fsdp_unit *u = &d->units[r->unit];
    const vh_device_ops *dev = d->dev;
    vh_host *host = d->host;
    vh_status st = d->comm->ops->wait(d->comm, r->req);
    vh_status st2 = d->comm->ops->wait(d->comm, r->side_req);
    r->req = r->side_req = NULL;
    if (st == VH_STATUS_OK) st = st2;
    if (r->failed) { /* said when it failed; the step is abandoned */
        reduction_free(d, r);
        return VH_STATUS_ERR_INTERNAL;
    }
    if (st != VH_STATUS_OK) {
        reduction_free(d, r);
        return host->api->fail(host, st, "waiting for the gradient reduce-scatter of unit %d "
                                         "(%s) over %d ranks failed",
                               (int)r->unit, unit_name(u), (int)d->world);
    }
    float *shard = d->grad32 + u->shard_at;
    if (r->recv)
        st = dev->convert(dev->device, shard, VH_DTYPE_F32, r->recv, d->policy.comm_dtype,
                          (size_t)u->shard, NULL);
    for (int32_t j = u->own_first; r->side && st == VH_STATUS_OK &&
                                   j < u->own_first + u->own_count;
         j++) {
        const fsdp_piece *pc = &d->pieces[j];
        const fsdp_param *p = param_of(d, u, pc);
        if (p->side_at < 0) continue;
        st = dev->copy(dev->device, shard + pc->shard_elem,
                       (float *)r->side + p->side_at + pc->offset,
                       (size_t)pc->count * sizeof(float), VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
    }
    reduction_free(d, r);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "widening unit %d (%s)'s reduced gradients on %s "
                                         "failed",
                               (int)r->unit, unit_name(u), dev_name(d));
    return VH_STATUS_OK;
}

/* Packs a unit's full grads into the element space and starts their
 * reduce-scatter (and the f32 side all-reduce). */
static vh_status reduction_start(fsdp *d, int32_t unit) {
    vh_status st;
    if (d->red_count == FSDP_MAX_REDUCTIONS && (st = reduction_finish(d)) != VH_STATUS_OK)
        return st;
    fsdp_unit *u = &d->units[unit];
    vh_host *host = d->host;
    const vh_device_ops *dev = d->dev;
    const vh_dtype wire = d->policy.comm_dtype;
    const size_t cs = vh_dtype_size(wire);
    fsdp_reduction *r = &d->red[(d->red_first + d->red_count) % FSDP_MAX_REDUCTIONS];
    memset(r, 0, sizeof *r);
    r->unit = unit;
    r->send_bytes = (size_t)u->shard * (size_t)d->world * cs;
    r->recv_bytes = wire == VH_DTYPE_F32 ? 0 : (size_t)u->shard * cs;
    r->side_bytes = (size_t)u->side_numel * sizeof(float);
    st = tmp_alloc(d, r->send_bytes, 1, &r->send, "the reduce-scatter send buffer");
    if (st == VH_STATUS_OK && r->recv_bytes)
        st = tmp_alloc(d, r->recv_bytes, 0, &r->recv, "the reduce-scatter receive buffer");
    if (st == VH_STATUS_OK && r->side_bytes)
        st = tmp_alloc(d, r->side_bytes, 1, &r->side, "the f32 gradient all-reduce buffer");
    /* Without grads handed out the unit sends zeros (the other ranks' sum). */
    for (int32_t i = 0; st == VH_STATUS_OK && u->grad_buf && i < u->num_params; i++) {
        const fsdp_param *p = &d->params_[u->first_param + i];
        const char *src = (const char *)u->grad_buf + p->grad_at;
        if (p->side_at >= 0)
            st = dev->copy(dev->device, (float *)r->side + p->side_at, src,
                           (size_t)p->numel * sizeof(float), VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
        else if (p->grad_dtype == wire)
            st = dev->copy(dev->device, (char *)r->send + (size_t)p->elem * cs, src,
                           (size_t)p->numel * cs, VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
        else
            st = dev->convert(dev->device, (char *)r->send + (size_t)p->elem * cs, wire, src,
                              p->grad_dtype, (size_t)p->numel, NULL);
        if (st != VH_STATUS_OK)
            st = host->api->fail(host, st, "packing unit %d (%s) param %d's %s gradients as %s "
                                           "on %s failed",
                                 (int)unit, unit_name(u), (int)i, vh_dtype_name(p->grad_dtype),
                                 vh_dtype_name(wire), dev_name(d));
    }
    /* Packed: the full grads are no longer needed (grads is refused now). */
    tmp_free(d, &u->grad_buf, u->grad_bytes);
    if (st == VH_STATUS_OK) {
        void *recv = r->recv ? r->recv : (void *)(d->grad32 + u->shard_at);
        st = d->comm->ops->reduce_scatter_start(d->comm, r->send, recv, (size_t)u->shard, wire,
                                                VH_REDUCE_OP_AVG, NULL, &r->req);
        if (st != VH_STATUS_OK) {
            r->req = NULL;
            st = host->api->fail(host, st,
                                 "starting the reduce-scatter of unit %d (%s)'s grads (%lld %s "
                                 "a rank) over %d ranks failed",
                                 (int)unit, unit_name(u), (long long)u->shard,
                                 vh_dtype_name(wire), (int)d->world);
        }
    }
    if (st == VH_STATUS_OK && r->side) {
        st = d->comm->ops->all_reduce_start(d->comm, r->side, (size_t)u->side_numel,
                                            VH_DTYPE_F32, VH_REDUCE_OP_AVG, NULL, &r->side_req);
        if (st != VH_STATUS_OK) {
            r->side_req = NULL;
            st = host->api->fail(host, st,
                                 "starting the all-reduce of unit %d (%s)'s f32 grads over %d "
                                 "ranks failed",
                                 (int)unit, unit_name(u), (int)d->world);
        }
    }
    /* Queued even after a failure, so what did start is finished (and the
     * buffers freed) by wait. */
    r->failed = st != VH_STATUS_OK;
    d->red_count++;
    return st;
}

static vh_status fsdp_reduce(void *self, int32_t unit) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    fsdp_unit *u = unit_at(d, unit, "reduce", &st);
    if (!u) return st;
    if (u->reduced)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "reduce of unit %d (%s) twice in one step: its grads are "
                                  "already reduce-scattered (zero_grads starts the next step)",
                                  (int)unit, unit_name(u));
    u->reduced = 1;
    d->pending++;
    return reduction_start(d, unit);
}

static vh_status fsdp_wait(void *self) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (!d->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "wait before setup");
    vh_status st = VH_STATUS_OK;
    if (d->pending > 0) {
        for (int32_t u = 0; st == VH_STATUS_OK && u < d->num_units; u++)
            if (!d->units[u].reduced)
                st = host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                     "wait: unit %d (%s) was not reduced in this step while "
                                     "others were; its grads would differ across ranks",
                                     (int)u, unit_name(&d->units[u]));
    } else {
        /* A step that reduced nothing: the grads handed out are reduced now,
         * in unit order, so the shards hold them (every rank, same order). */
        for (int32_t u = 0; st == VH_STATUS_OK && u < d->num_units; u++) {
            if (!d->units[u].grad_buf) continue;
            d->units[u].reduced = 1;
            d->pending++;
            st = reduction_start(d, u);
        }
    }
    /* Every reduction still in flight, in the order they started. */
    while (d->red_count > 0) {
        vh_status s2 = reduction_finish(d);
        if (st == VH_STATUS_OK) st = s2;
    }
    /* The optimizer may now write the shards a prefetch would read. */
    vh_status s3 = prefetch_drop(d);
    if (st == VH_STATUS_OK) st = s3;
    d->pending = 0;
    d->last_gathered = -1;
    /* The backward is over: a later forward's release (evaluation) keeps
     * the gathered units under ZeRO-2 again. */
    for (int32_t u = 0; u < d->num_units; u++) d->units[u].backward = 0;
    return st;
}

static vh_status fsdp_slices(void *self, vh_param_slices *out) {
    fsdp *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (!d->ready)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "slices before setup");
    memset(out, 0, sizeof *out);
    out->items = d->slices;
    out->count = d->num_own;
    out->item_size = (uint32_t)sizeof(vh_param_slice);
    out->replicated = 0; /* every element on one rank: sums over slices span ranks */
    return VH_STATUS_OK;
}

static vh_status fsdp_refresh(void *self) {
    fsdp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (!d->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "refresh before setup");
    for (int32_t u = 0; u < d->num_units; u++)
        if (d->units[u].gathered > 0)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "refresh while unit %d (%s) is gathered: its gathered copy "
                                   "would go stale (release it first)",
                                   (int)u, unit_name(&d->units[u]));
    vh_status st = prefetch_drop(d);
    if (st != VH_STATUS_OK) return st;
    /* Gathered copies held over (ZeRO-2, evaluation) are out of date now. */
    for (int32_t u = 0; u < d->num_units; u++)
        tmp_free(d, &d->units[u].full, d->units[u].param_bytes);
    const vh_device_ops *dev = d->dev;
    for (int32_t u = 0; u < d->num_units; u++) {
        const fsdp_unit *un = &d->units[u];
        for (int32_t j = un->own_first; j < un->own_first + un->own_count; j++) {
            const fsdp_piece *pc = &d->pieces[j];
            if (pc->master_at < 0) continue; /* aliased: the compute copy is the master */
            const fsdp_param *p = param_of(d, un, pc);
            st = dev->convert(dev->device, piece_param(d, un, pc), p->param_dtype,
                              d->masters + pc->master_at, VH_DTYPE_F32, (size_t)pc->count, NULL);
            if (st != VH_STATUS_OK)
                return host->api->fail(host, st,
                                       "refresh: converting the masters of unit %d param %d to "
                                       "%s failed",
                                       (int)u, (int)pc->param, vh_dtype_name(p->param_dtype));
        }
    }
    return VH_STATUS_OK;
}

/* ---- optimizer state and memory ------------------------------------------ */

/* This rank's pieces of every state slot through io, f32, through a host
 * buffer. Every rank writes (and reads) its own pieces: the host sums the
 * pieces over ranks, so the file does not depend on the world size. */
static vh_status state_io(fsdp *d, const vh_state_io *io, int save) {
    if (!d->ready)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "%s before setup",
                                  save ? "state_save" : "state_load");
    return sharding_state_io(d->host, d->dev, d->table, d->slices, d->num_own,
                             d->state_slots, io, save);
}

static vh_status fsdp_state_save(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return state_io(self, io, 1);
}

static vh_status fsdp_state_load(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return state_io(self, io, 0);
}

/* Bytes on this rank: params the packed compute shards (an aliased master
 * is counted once, there); grads the f32 shards; masters the separate f32
 * master shards; optim_state the slots' shards; comm_buffers the transient
 * buffers at their planned peak, or the peak seen when larger. */
static vh_status fsdp_memory(void *self, vh_sharding_memory *out) {
    fsdp *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (out->struct_size < sizeof out->struct_size)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "memory: out->struct_size is %u; the caller sets it",
                                  (unsigned)out->struct_size);
    vh_sharding_memory m;
    memset(&m, 0, sizeof m);
    m.params = (int64_t)d->packed_bytes;
    m.grads = d->shard_numel * (int64_t)sizeof(float);
    m.masters = d->masters_numel * (int64_t)sizeof(float);
    m.optim_state = (int64_t)d->state_slots * d->shard_numel * (int64_t)sizeof(float);
    m.comm_buffers = d->peak > d->plan ? d->peak : d->plan;
    size_t n = out->struct_size < sizeof m ? out->struct_size : sizeof m;
    memcpy((char *)out + sizeof m.struct_size, (const char *)&m + sizeof m.struct_size,
           n - sizeof m.struct_size);
    return VH_STATUS_OK;
}

static const vh_sharding_vtable vtable = {
    .struct_size = sizeof(vh_sharding_vtable),
    .create = fsdp_create,
    .destroy = fsdp_destroy,
    .setup = fsdp_setup,
    .load_unit = fsdp_load_unit,
    .store_unit = fsdp_store_unit,
    .zero_grads = fsdp_zero_grads,
    .gather = fsdp_gather,
    .release = fsdp_release,
    .grads = fsdp_grads,
    .reduce = fsdp_reduce,
    .wait = fsdp_wait,
    .slices = fsdp_slices,
    .refresh = fsdp_refresh,
    .state_save = fsdp_state_save,
    .state_load = fsdp_state_load,
    .memory = fsdp_memory,
};

VH_PLUGIN_DEFINE(VH_ROLE_SHARDING, "fsdp", "0.1.0",
                 "fully sharded data parallel: shards per unit, all-gather before use, grads "
                 "reduce-scattered (ZeRO-3, or ZeRO-2)",
                 schema, vtable);
