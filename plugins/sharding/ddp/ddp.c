/* ddp.c - the sharding role's data-parallel plugin: full replicas on every rank.
 *
 * Every rank keeps the whole model in the device's memory, in flat buffers:
 *
 *     params   the compute copies: unit after unit, each unit laid out by
 *              vh_unit_layout_init with the policy's parameter dtypes (every
 *              parameter at a 64-byte aligned offset); what gather hands out
 *     grads    the same, with the policy's gradient dtypes; what grads hands
 *              out and backward accumulates into
 *     masters  f32, the values the optimizer updates, for the parameters
 *              whose compute copy is not already them (see "Masters")
 *     grad32   f32 gradients for the parameters whose gradient dtype is not
 *              f32: the optimizer's input (see "Gradients in fp32")
 *     state[k] f32, one per optimizer state slot: the parameters end to end,
 *              unit after unit, at the table's offsets
 *
 * Each unit's buffers start where the previous unit's end; unit layouts are
 * multiples of 64 bytes, so every parameter stays aligned. The optimizer's
 * slices are one per parameter, pointing into masters, grads (or grad32) and
 * state.
 *
 * Masters. With master weights (the policy's master_weights, master_dtype
 * f32) a parameter whose compute copy is f32 is its own master: the slice
 * points at the compute copy and nothing is refreshed (fp32 keeps one copy,
 * as before). A parameter whose compute copy is f16/bf16 gets a separate f32
 * master in `masters`, and refresh converts masters -> compute copies
 * (device->convert, round to nearest even). Without master weights the
 * optimizer updates the compute copy itself, in its dtype. load_unit and
 * store_unit always speak fp32 values, the parameters end to end.
 *
 * Start. load_unit is called by every rank with the same values, but a rank
 * may still hold different ones (its own random init, a stale file): after
 * setting the unit it broadcasts it from rank 0, one collective per run of
 * parameters of one dtype in `params` (padding included) and one for the
 * unit's separate masters, so every replica starts as rank 0's. (A
 * communicator without broadcast_start is trusted to have been given the
 * same values everywhere, as the contract says.)
 *
 * Buckets. The gradients are all-reduced (VH_REDUCE_OP_AVG: every rank then
 * holds the mean gradient of the global batch, each rank's loss being the
 * mean over its own samples) in buckets, as PyTorch's DDP does: at setup the
 * units are taken in backward order (last to first) and a bucket is closed
 * once it holds >= bucket_mb MiB on the wire (the last one may hold less), so
 * a bucket is a range of consecutive units. bucket_mb 0 makes every unit its
 * own bucket. Every rank computes the same buckets from the same table.
 * reduce of a unit marks it done; when the last of its bucket's units is
 * reduced, reduce STARTS the bucket's collectives and keeps the requests, so
 * a small model sends few large messages and a large one overlaps many with
 * the rest of backward. wait finishes them all, in the order they started.
 * With the self backend every request has finished when it starts.
 *
 * Progress. A backend like MPI advances a collective only inside its own
 * calls, so every hook (gather, release, grads, reduce) tests each request
 * still in flight (comm->ops->test, cheap; a finished one is not asked
 * again): the all-reduces move on between the model's units, not only in
 * wait.
 *
 * Wire dtype. A bucket's gradients are reduced in runs of consecutive
 * parameters that share a dtype, each run one collective over a contiguous
 * range (units lie end to end in `grads`, so a run may cross from one unit
 * into the next; the zero padding between parameters travels with it):
 * f32 gradients in f32; f16/bf16 gradients in their own dtype when the
 * policy's comm_dtype is that dtype, or, when comm_dtype is f32, converted
 * to f32 into grad32 first (in the unit's reduce) and reduced there (grad32
 * holds them end to end, so those runs are contiguous too). Other
 * combinations are refused at setup.
 *
 * Gradients in fp32. The optimizer receives f32 gradients (vh_param_slice).
 * For a parameter with f32 gradients the slice points into `grads`. For one
 * with f16/bf16 gradients it points into grad32, which is filled by
 *   - reduce, before the collective, when comm_dtype is f32;
 *   - wait, after the collectives, when they ran in the 16-bit dtype;
 *   - wait, for a unit that was not reduced in the step (no collective).
 *
 * Call order is checked, since a mistake there silently desynchronises ranks:
 * a unit is reduced at most once per step (zero_grads starts a step), its
 * grads are not handed out again after its reduce, zero_grads waits for wait,
 * and wait refuses a step in which some units were reduced and others not
 * (a bucket missing a unit would never start, or start on one rank only).
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

typedef struct ddp_param {
    int64_t numel;
    int64_t state_at;     /* first element in every state buffer */
    vh_dtype param_dtype; /* of the compute copy */
    vh_dtype grad_dtype;  /* as backward writes it */
    size_t param_at;      /* byte offset of the compute copy in `params` */
    size_t grad_at;       /* byte offset of the gradient in `grads` */
    int aliased;          /* the master is the compute copy */
    int64_t master_at;    /* element offset in `masters` when not aliased */
    int64_t grad32_at;    /* element offset in `grad32`; -1 when grads are f32 */
    int in_grad32;        /* reduced in grad32 (f32), after a conversion in reduce */
    vh_dtype wire;        /* the dtype its gradient is reduced in */
} ddp_param;

/* One collective of a bucket's reduction. */
typedef struct ddp_run {
    int32_t first, count; /* the params it covers, into ddp.params_ */
    int in_grad32;        /* reduced in grad32 (f32), after a conversion */
    vh_dtype dtype;       /* on the wire */
    size_t at;            /* byte offset in `grads`, or element offset in grad32 */
    size_t elems;         /* elements of dtype, padding included */
    vh_comm_request *req; /* in flight, or NULL */
    int done;             /* test said it finished (it is still to be waited on) */
} ddp_run;

/* Consecutive units whose gradients travel together (see "Buckets"). */
typedef struct ddp_bucket {
    int32_t first_unit, num_units;
    int32_t first_run, num_runs; /* into ddp.runs */
    size_t bytes;                /* on the wire */
    int32_t reduced;             /* of its units, reduced in the current step */
} ddp_bucket;

typedef struct ddp_unit {
    const char *name;   /* the table's, for messages; lives as long as the model */
    int64_t numel;
    int32_t first_param, num_params; /* into ddp.params_ */
    size_t param_at, param_bytes;    /* the unit's range of `params` */
    size_t grad_at, grad_bytes;      /* and of `grads` */
    size_t wire_bytes;               /* its gradients on the wire */
    int32_t bucket;                  /* into ddp.buckets */
    int32_t gathered;   /* gathers not yet released */
    int32_t reduced;    /* reduce was called for this unit in the current step */
    int32_t converted;  /* its 16-bit grads are in grad32 for this step */
} ddp_unit;

typedef struct ddp {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    int32_t world;       /* comm->world_size, read at setup */
    int ready;           /* setup succeeded */
    const vh_param_table *table; /* the setup's; lives as long as the model */
    vh_precision_policy policy; /* the setup's, read into this SDK's struct */
    int32_t state_slots;
    ddp_unit *units;     /* host memory */
    int32_t num_units;
    ddp_param *params_;  /* host memory, every parameter of every unit in order */
    int32_t num_params;
    ddp_run *runs;       /* host memory, bucket after bucket */
    int32_t num_runs;
    ddp_bucket *buckets; /* host memory, in backward order: bucket 0 holds the last unit */
    int32_t num_buckets;
    double bucket_mb;    /* the config's */
    int32_t *started;    /* indices into runs, in the order their collectives started */
    int32_t num_started;
    int32_t first_open;  /* started[< first_open] are known to have finished */
    int64_t numel;       /* sum over units */
    /* device memory from here on */
    void *params;
    size_t params_bytes;
    void *grads;
    size_t grads_bytes;
    float *masters;
    int64_t masters_numel;
    float *grad32;
    int64_t grad32_numel;
    float *state[VH_OPTIM_MAX_STATE_SLOTS];
    vh_param_slice *slices; /* host memory, one per parameter */
    int32_t pending;     /* units reduced and not yet waited for */
} ddp;

static const vh_config_key schema[] = {
    {"bucket_mb", VH_CONFIG_TYPE_FLOAT, "25",
     "MiB of gradients per all-reduce bucket: consecutive units (in backward order) share one "
     "until it holds this much; 0: one bucket per unit",
     NULL, 0, 1048576, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

static const char *unit_name(const ddp_unit *u) { return u->name ? u->name : "?"; }

static const char *dev_name(const ddp *d) { return d->dev->name ? d->dev->name : "the device"; }

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
    if (!comm || !comm->ops || !comm->ops->all_reduce_start || !comm->ops->wait)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                               "the host gave no communicator with all_reduce_start and wait");
    double bucket_mb = 25.0;
    vh_status st = host->api->config_float(host, "bucket_mb", &bucket_mb);
    if (st != VH_STATUS_OK) return st;
    if (!(bucket_mb >= 0.0)) /* the schema's range; NaN too */
        return host->api->config_fail(host, "bucket_mb", "bucket_mb must be >= 0 (got %g)",
                                      bucket_mb);
    ddp *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    d->dev = dev;
    d->comm = comm;
    d->bucket_mb = bucket_mb;
    *self = d;
    return VH_STATUS_OK;
}

static void dev_free(ddp *d, void *ptr) {
    if (ptr) d->dev->free(d->dev->device, ptr);
}

/* Finishes every request still in flight, in the order they started;
 * returns the first failure. */
static vh_status wait_runs(ddp *d) {
    vh_status first = VH_STATUS_OK;
    for (int32_t i = 0; i < d->num_started; i++) {
        ddp_run *run = &d->runs[d->started[i]];
        if (!run->req) continue;
        vh_status st = d->comm->ops->wait(d->comm, run->req);
        run->req = NULL;
        run->done = 0;
        if (st != VH_STATUS_OK && first == VH_STATUS_OK) first = st;
    }
    d->num_started = d->first_open = 0;
    return first;
}

/* Lets the collectives in flight advance (see "Progress"): one test per
 * request not yet known to have finished. */
static vh_status progress(ddp *d) {
    vh_status (*test)(vh_comm *, vh_comm_request *, int *) = d->comm->ops->test;
    if (!test) return VH_STATUS_OK;
    for (int32_t i = d->first_open; i < d->num_started; i++) {
        ddp_run *run = &d->runs[d->started[i]];
        if (!run->req || run->done) continue;
        int done = 0;
        vh_status st = test(d->comm, run->req, &done);
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st,
                                      "testing a gradient all-reduce (%zu %s) over %d ranks "
                                      "failed",
                                      run->elems, vh_dtype_name(run->dtype), (int)d->world);
        run->done = done != 0;
    }
    /* Skip the finished prefix next time. */
    while (d->first_open < d->num_started) {
        const ddp_run *run = &d->runs[d->started[d->first_open]];
        if (run->req && !run->done) break;
        d->first_open++;
    }
    return VH_STATUS_OK;
}

/* Frees every buffer and returns to the state before setup. */
static void release_buffers(ddp *d) {
    vh_host *host = d->host;
    /* The buffers belong to a collective until it has finished. */
    if (d->started) (void)wait_runs(d);
    dev_free(d, d->params);
    dev_free(d, d->grads);
    dev_free(d, d->masters);
    dev_free(d, d->grad32);
    for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) dev_free(d, d->state[k]);
    host->api->free(host, d->units);
    host->api->free(host, d->params_);
    host->api->free(host, d->runs);
    host->api->free(host, d->buckets);
    host->api->free(host, d->started);
    host->api->free(host, d->slices);
    d->params = d->grads = NULL;
    d->masters = d->grad32 = NULL;
    memset(d->state, 0, sizeof d->state);
    d->units = NULL;
    d->params_ = NULL;
    d->runs = NULL;
    d->buckets = NULL;
    d->started = NULL;
    d->slices = NULL;
    d->num_units = d->num_params = d->num_runs = d->num_buckets = 0;
    d->num_started = d->first_open = 0;
    d->numel = d->masters_numel = d->grad32_numel = 0;
    d->params_bytes = d->grads_bytes = 0;
    d->pending = 0;
    d->ready = 0;
}

static void ddp_destroy(void *self) {
    ddp *d = self;
    if (!d) return;
    release_buffers(d);
    d->host->api->free(d->host, d);
}

/* ---- setup -------------------------------------------------------------- */




/* The buckets (see "Buckets"): units from the last to the first, each bucket
 * closed once it holds >= bucket_mb MiB; then each bucket's runs, over its
 * parameters in buffer order. Host memory only; the same on every rank. */
static vh_status plan_buckets(ddp *d) {
    vh_host *host = d->host;
    size_t bucket_bytes = (size_t)d->num_units * sizeof *d->buckets;
    size_t run_bytes = (size_t)d->num_params * sizeof *d->runs; /* at most one a parameter */
    d->buckets = host->api->alloc(host, bucket_bytes);
    d->runs = host->api->alloc(host, run_bytes);
    d->started = host->api->alloc(host, (size_t)d->num_params * sizeof *d->started);
    if (!d->buckets || !d->runs || !d->started)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d buckets",
                               (int)d->num_units);
    memset(d->buckets, 0, bucket_bytes);
    memset(d->runs, 0, run_bytes);
    const double cap = d->bucket_mb * 1024.0 * 1024.0;
    int32_t nb = 0;
    for (int32_t u = d->num_units - 1; u >= 0; u--) {
        ddp_bucket *b = nb > 0 ? &d->buckets[nb - 1] : NULL;
        if (!b || (double)b->bytes >= cap) { /* the previous one is full: open another */
            b = &d->buckets[nb++];
            b->num_units = 0;
        }
        b->first_unit = u;
        b->num_units++;
        b->bytes += d->units[u].wire_bytes;
        d->units[u].bucket = nb - 1;
    }
    d->num_buckets = nb;

    int32_t r = 0;
    for (int32_t k = 0; k < nb; k++) {
        ddp_bucket *b = &d->buckets[k];
        const ddp_unit *lo = &d->units[b->first_unit];
        const ddp_unit *hi = &d->units[b->first_unit + b->num_units - 1];
        const int32_t first = lo->first_param, end = hi->first_param + hi->num_params;
        b->first_run = r;
        for (int32_t n = first; n < end; n++) {
            const ddp_param *p = &d->params_[n];
            ddp_run *last = r > b->first_run ? &d->runs[r - 1] : NULL;
            if (last && last->in_grad32 == p->in_grad32 && last->dtype == p->wire) {
                last->count++;
                continue;
            }
            ddp_run *run = &d->runs[r++];
            run->first = n;
            run->count = 1;
            run->in_grad32 = p->in_grad32;
            run->dtype = p->wire;
            run->at = p->in_grad32 ? (size_t)p->grad32_at : p->grad_at;
        }
        b->num_runs = r - b->first_run;
        /* Each run's length: in `grads` to the next run's start, or the end of
         * the bucket's last unit (padding included); in grad32 the
         * parameters themselves (packed). */
        for (int32_t i = b->first_run; i < r; i++) {
            ddp_run *run = &d->runs[i];
            const int32_t run_end = run->first + run->count;
            if (run->in_grad32) {
                int64_t elems = 0;
                for (int32_t n = run->first; n < run_end; n++) elems += d->params_[n].numel;
                run->elems = (size_t)elems;
            } else {
                size_t end_at = run_end < end ? d->params_[run_end].grad_at
                                              : hi->grad_at + hi->grad_bytes;
                run->elems = (end_at - run->at) / vh_dtype_size(run->dtype);
            }
        }
    }
    d->num_runs = r;
    return VH_STATUS_OK;
}

/* Where everything goes: the per-parameter records and the unit ranges, from
 * the two layouts of every unit, then the buckets. Host memory only. */
static vh_status plan(ddp *d, const vh_param_table *t) {
    vh_host *host = d->host;
    const vh_precision_policy *pol = &d->policy;
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

    int32_t n = 0;
    int64_t state_at = 0;
    for (int32_t u = 0; u < t->num_units; u++) {
        const vh_unit_desc *ud = &t->units[u];
        ddp_unit *un = &d->units[u];
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
        un->first_param = n;
        un->num_params = ud->num_params;
        un->param_at = d->params_bytes;
        un->param_bytes = pl.bytes;
        un->grad_at = d->grads_bytes;
        un->grad_bytes = gl.bytes;
        for (int32_t i = 0; i < ud->num_params; i++, n++) {
            ddp_param *p = &d->params_[n];
            p->numel = ud->params[i].numel;
            p->state_at = state_at + ud->params[i].offset;
            p->param_dtype = pl.dtypes[i];
            p->grad_dtype = gl.dtypes[i];
            p->param_at = un->param_at + pl.offsets[i];
            p->grad_at = un->grad_at + gl.offsets[i];
            /* Without master weights the compute copy is the master, in its
             * dtype; with them an f32 compute copy is its own master. */
            p->aliased = !pol->master_weights || p->param_dtype == VH_DTYPE_F32;
            p->master_at = -1;
            if (!p->aliased) {
                p->master_at = d->masters_numel;
                d->masters_numel += p->numel;
            }
            p->grad32_at = -1;
            if (p->grad_dtype != VH_DTYPE_F32) {
                p->grad32_at = d->grad32_numel;
                d->grad32_numel += p->numel;
            }
            /* The wire: see "Wire dtype" above. */
            p->in_grad32 = p->grad_dtype != VH_DTYPE_F32 && pol->comm_dtype == VH_DTYPE_F32;
            p->wire = p->in_grad32 ? VH_DTYPE_F32 : p->grad_dtype;
            /* Its bytes on the wire: packed f32 in grad32, or its span of
             * `grads` up to the next parameter (padding included). */
            size_t span_end = i + 1 < ud->num_params ? gl.offsets[i + 1] : gl.bytes;
            un->wire_bytes += p->in_grad32 ? (size_t)p->numel * sizeof(float)
                                           : span_end - gl.offsets[i];
        }
        d->params_bytes += pl.bytes;
        d->grads_bytes += gl.bytes;
        state_at += ud->numel;
        vh_unit_layout_free(&pl);
        vh_unit_layout_free(&gl);
    }
    return plan_buckets(d);
}

/* A zeroed device buffer of `bytes`; the message names what it is for. */
static vh_status alloc_zeroed(ddp *d, size_t bytes, void **out, const char *what) {
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

static vh_status alloc_buffers(ddp *d) {
    size_t f32_bytes = (size_t)d->numel * sizeof(float);
    vh_status st = alloc_zeroed(d, d->params_bytes, &d->params, "the parameters");
    if (st == VH_STATUS_OK) st = alloc_zeroed(d, d->grads_bytes, &d->grads, "the gradients");
    void *buf;
    if (st == VH_STATUS_OK) {
        st = alloc_zeroed(d, (size_t)d->masters_numel * sizeof(float), &buf,
                          "the f32 master parameters");
        d->masters = buf;
    }
    if (st == VH_STATUS_OK) {
        st = alloc_zeroed(d, (size_t)d->grad32_numel * sizeof(float), &buf,
                          "the f32 gradients");
        d->grad32 = buf;
    }
    for (int32_t k = 0; k < d->state_slots && st == VH_STATUS_OK; k++) {
        st = alloc_zeroed(d, f32_bytes, &buf, "the optimizer state");
        d->state[k] = buf;
    }
    return st;
}

static void *param_ptr(const ddp *d, const ddp_param *p) { return (char *)d->params + p->param_at; }
static void *grad_ptr(const ddp *d, const ddp_param *p) { return (char *)d->grads + p->grad_at; }

/* The master of a parameter: its compute copy when aliased. */
static void *master_ptr(const ddp *d, const ddp_param *p) {
    return p->aliased ? param_ptr(d, p) : (void *)(d->masters + p->master_at);
}
static vh_dtype master_dtype(const ddp_param *p) {
    return p->aliased ? p->param_dtype : VH_DTYPE_F32;
}

/* Where the optimizer reads the f32 gradient. */
static float *grad32_ptr(const ddp *d, const ddp_param *p) {
    return p->grad32_at < 0 ? (float *)grad_ptr(d, p) : d->grad32 + p->grad32_at;
}

/* One slice per parameter, each the whole parameter: nothing is sharded. */
static vh_status build_slices(ddp *d, const vh_param_table *t) {
    vh_host *host = d->host;
    d->slices = host->api->alloc(host, (size_t)d->num_params * sizeof(vh_param_slice));
    if (!d->slices)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d slices",
                               (int)d->num_params);
    memset(d->slices, 0, (size_t)d->num_params * sizeof(vh_param_slice));
    for (int32_t u = 0; u < t->num_units; u++) {
        const ddp_unit *un = &d->units[u];
        for (int32_t i = 0; i < un->num_params; i++) {
            const ddp_param *p = &d->params_[un->first_param + i];
            vh_param_slice *sl = &d->slices[un->first_param + i];
            sl->unit = u;
            sl->param = i;
            sl->offset = 0;
            sl->count = p->numel;
            sl->flags = t->units[u].params[i].flags;
            sl->master = master_ptr(d, p);
            sl->master_dtype = master_dtype(p);
            sl->grad = grad32_ptr(d, p);
            sl->grad_dtype = VH_DTYPE_F32;
            for (int32_t k = 0; k < d->state_slots; k++) sl->state[k] = d->state[k] + p->state_at;
            sl->state_dtype = VH_DTYPE_F32;
        }
    }
    return VH_STATUS_OK;
}

static vh_status ddp_setup(void *self, const vh_sharding_setup *setup) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (d->ready)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "setup called twice; ddp allocates its buffers once");
    vh_sharding_setup s;
    vh_precision_policy pol;
    vh_status st = sharding_read_setup(host, d->dev, d->comm, "ddp", setup, &s, &pol);
    if (st != VH_STATUS_OK) return st;

    const vh_param_table *t = s.table;
    d->table = t;
    d->world = d->comm->world_size;
    d->policy = pol;
    d->state_slots = s.state_slots;
    d->numel = t->numel;
    st = plan(d, t);
    if (st == VH_STATUS_OK) st = alloc_buffers(d);
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

/* A device f32 scratch buffer of n elements for load_unit / store_unit of
 * parameters whose only copy is 16-bit (no master weights); freed by the
 * caller. Rare (init, checkpoints), so it is not kept. */
static vh_status scratch_f32(ddp *d, int64_t n, float **out) {
    void *buf = NULL;
    vh_status st = d->dev->alloc(d->dev->device, (size_t)n * sizeof(float), &buf);
    *out = buf;
    if (st != VH_STATUS_OK || !buf)
        return d->host->api->fail(d->host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                                  "allocating %lld f32 of scratch on %s failed", (long long)n,
                                  dev_name(d));
    return VH_STATUS_OK;
}

/* Rank 0's values of unit u on every rank (see "Start"): its compute copies
 * in runs of one dtype over `params`, then its separate masters, which lie
 * end to end in `masters`. */
static vh_status broadcast_unit(ddp *d, const ddp_unit *u) {
    vh_comm *c = d->comm;
    /* Without one every rank keeps what it was given: the same values, by
     * load_unit's contract (the shipped backends all broadcast). */
    if (!c->ops->broadcast_start) return VH_STATUS_OK;
    const ddp_param *ps = &d->params_[u->first_param];
    const size_t unit_end = u->param_at + u->param_bytes;
    for (int32_t i = 0, j; i < u->num_params; i = j) {
        for (j = i + 1; j < u->num_params && ps[j].param_dtype == ps[i].param_dtype; j++) {}
        size_t end_at = j < u->num_params ? ps[j].param_at : unit_end;
        size_t elems = (end_at - ps[i].param_at) / vh_dtype_size(ps[i].param_dtype);
        vh_status st = vh_comm_broadcast(c, param_ptr(d, &ps[i]), elems, ps[i].param_dtype, 0);
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st,
                                      "load_unit: broadcasting unit %s's parameters (%zu %s) "
                                      "from rank 0 failed",
                                      unit_name(u), elems, vh_dtype_name(ps[i].param_dtype));
    }
    /* A unit's separate masters are numbered in parameter order. */
    int64_t masters_first = -1, masters_count = 0;
    for (int32_t i = 0; i < u->num_params; i++) {
        if (ps[i].aliased) continue;
        if (masters_first < 0) masters_first = ps[i].master_at;
        masters_count += ps[i].numel;
    }
    if (masters_count > 0) {
        vh_status st = vh_comm_broadcast(c, d->masters + masters_first, (size_t)masters_count,
                                         VH_DTYPE_F32, 0);
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st,
                                      "load_unit: broadcasting unit %s's f32 masters (%lld) "
                                      "from rank 0 failed",
                                      unit_name(u), (long long)masters_count);
    }
    return VH_STATUS_OK;
}

static vh_status ddp_load_unit(void *self, int32_t unit, const float *values) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_status st;
    ddp_unit *u = unit_at(d, unit, "load_unit", &st);
    if (!u) return st;
    if (!values)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "load_unit: NULL values");
    const vh_device_ops *dev = d->dev;
    /* Every rank was given the same values and keeps all of them. */
    const float *at = values;
    for (int32_t i = 0; i < u->num_params; i++) {
        const ddp_param *p = &d->params_[u->first_param + i];
        size_t n = (size_t)p->numel;
        void *master = master_ptr(d, p);
        float *scratch = NULL;
        const char *what = "copying";
        if (master_dtype(p) == VH_DTYPE_F32) {
            st = dev->copy(dev->device, master, at, n * sizeof(float),
                           VH_COPY_KIND_HOST_TO_DEVICE, NULL);
            if (st == VH_STATUS_OK && !p->aliased) {
                what = "converting";
                st = dev->convert(dev->device, param_ptr(d, p), p->param_dtype, master,
                                  VH_DTYPE_F32, n, NULL);
            }
        } else { /* the 16-bit compute copy is the master: through f32 scratch */
            st = scratch_f32(d, p->numel, &scratch);
            if (st != VH_STATUS_OK) return st;
            st = dev->copy(dev->device, scratch, at, n * sizeof(float),
                           VH_COPY_KIND_HOST_TO_DEVICE, NULL);
            if (st == VH_STATUS_OK) {
                what = "converting";
                st = dev->convert(dev->device, master, p->param_dtype, scratch, VH_DTYPE_F32, n,
                                  NULL);
            }
            /* The CPU has finished; a stream device must before the free. */
            if (st == VH_STATUS_OK && dev->synchronize) st = dev->synchronize(dev->device);
            dev_free(d, scratch);
        }
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st, "load_unit: %s unit %d (%s) param %d to %s "
                                                   "failed",
                                      what, (int)unit, unit_name(u), (int)i, dev_name(d));
        at += n;
    }
    return broadcast_unit(d, u);
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
    float *at = values;
    for (int32_t i = 0; i < u->num_params; i++) {
        const ddp_param *p = &d->params_[u->first_param + i];
        size_t n = (size_t)p->numel;
        const void *master = master_ptr(d, p);
        if (master_dtype(p) == VH_DTYPE_F32) {
            st = dev->copy(dev->device, at, master, n * sizeof(float),
                           VH_COPY_KIND_DEVICE_TO_HOST, NULL);
        } else {
            float *scratch = NULL;
            st = scratch_f32(d, p->numel, &scratch);
            if (st != VH_STATUS_OK) return st;
            st = dev->convert(dev->device, scratch, VH_DTYPE_F32, master, p->param_dtype, n,
                              NULL);
            if (st == VH_STATUS_OK)
                st = dev->copy(dev->device, at, scratch, n * sizeof(float),
                               VH_COPY_KIND_DEVICE_TO_HOST, NULL);
            dev_free(d, scratch);
        }
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st,
                                      "store_unit: copying unit %d (%s) param %d from %s failed",
                                      (int)unit, unit_name(u), (int)i, dev_name(d));
        at += n;
    }
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
    /* grad32 needs no zeroing: it is written whole before it is read. */
    const vh_device_ops *dev = d->dev;
    vh_status st = dev->memset_zero(dev->device, d->grads, d->grads_bytes, NULL);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "zeroing the gradients on %s failed", dev_name(d));
    for (int32_t u = 0; u < d->num_units; u++) d->units[u].reduced = d->units[u].converted = 0;
    for (int32_t b = 0; b < d->num_buckets; b++) d->buckets[b].reduced = 0;
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
    if ((st = progress(d)) != VH_STATUS_OK) return st;
    /* A replica is always whole: nothing to gather. */
    u->gathered++;
    *params = (const char *)d->params + u->param_at;
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
    return progress(d);
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
    if ((st = progress(d)) != VH_STATUS_OK) return st;
    *grads = (char *)d->grads + u->grad_at;
    return VH_STATUS_OK;
}

/* grad32 <- the 16-bit gradients of unit u's params, on the current stream:
 * those reduced in f32 (in_grad32, for reduce) or the others (for wait). */
static vh_status convert_grads(ddp *d, const ddp_unit *u, int in_grad32) {
    const vh_device_ops *dev = d->dev;
    for (int32_t i = 0; i < u->num_params; i++) {
        const ddp_param *p = &d->params_[u->first_param + i];
        if (p->grad32_at < 0 || p->in_grad32 != in_grad32) continue;
        vh_status st = dev->convert(dev->device, d->grad32 + p->grad32_at, VH_DTYPE_F32,
                                    grad_ptr(d, p), p->grad_dtype, (size_t)p->numel, NULL);
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st,
                                      "converting unit %s param %d's %s gradients to f32 on %s "
                                      "failed",
                                      unit_name(u), (int)i, vh_dtype_name(p->grad_dtype),
                                      dev_name(d));
    }
    return VH_STATUS_OK;
}

/* Starts the collectives of bucket b, whose units are all reduced. */
static vh_status start_bucket(ddp *d, const ddp_bucket *b) {
    vh_host *host = d->host;
    for (int32_t k = b->first_run; k < b->first_run + b->num_runs; k++) {
        ddp_run *run = &d->runs[k];
        /* f32 on the wire for 16-bit grads: reduce converted them already
         * (the collective is ordered after the conversion on the stream). */
        void *buf = run->in_grad32 ? (void *)(d->grad32 + run->at) : (char *)d->grads + run->at;
        run->done = 0;
        vh_status st = d->comm->ops->all_reduce_start(d->comm, buf, run->elems, run->dtype,
                                                      VH_REDUCE_OP_AVG, NULL, &run->req);
        if (st != VH_STATUS_OK) {
            run->req = NULL;
            const ddp_unit *lo = &d->units[b->first_unit];
            const ddp_unit *hi = &d->units[b->first_unit + b->num_units - 1];
            return host->api->fail(host, st,
                                   "starting the all-reduce of units %s..%s's grads (%zu %s) "
                                   "over %d ranks failed",
                                   unit_name(lo), unit_name(hi), run->elems,
                                   vh_dtype_name(run->dtype), (int)d->world);
        }
        d->started[d->num_started++] = k;
    }
    return VH_STATUS_OK;
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
    /* From here the unit counts as reduced, even if a start below fails:
     * wait then finishes what did start, and the step is abandoned anyway. */
    u->reduced = 1;
    d->pending++;
    if ((st = progress(d)) != VH_STATUS_OK) return st;
    /* Its grads are final: their f32 copies can be made now, while the
     * bucket waits for its other units. */
    if (d->grad32_numel > 0 && (st = convert_grads(d, u, 1)) != VH_STATUS_OK) return st;
    ddp_bucket *b = &d->buckets[u->bucket];
    if (++b->reduced < b->num_units) return VH_STATUS_OK;
    return start_bucket(d, b);
}

static vh_status ddp_wait(void *self) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = d->host;
    if (!d->ready) return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "wait before setup");
    if (d->pending > 0) {
        for (int32_t u = 0; u < d->num_units; u++)
            if (!d->units[u].reduced)
                return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                       "wait: unit %d (%s) was not reduced in this step while "
                                       "others were; its grads would differ across ranks",
                                       (int)u, unit_name(&d->units[u]));
    }
    /* Every request started by reduce, in the order they started. */
    vh_status st = wait_runs(d);
    d->pending = 0;
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "waiting for the gradient all-reduces over %d ranks "
                                         "failed",
                               (int)d->world);
    /* The optimizer reads f32: convert what was reduced in 16 bits (and the
     * 16-bit grads of a step that reduced nothing). */
    if (d->grad32_numel == 0) return VH_STATUS_OK;
    for (int32_t u = 0; u < d->num_units; u++) {
        ddp_unit *un = &d->units[u];
        if (un->converted) continue;
        if ((st = convert_grads(d, un, 0)) != VH_STATUS_OK) return st;
        /* in_grad32 ones were converted by reduce */
        if (!un->reduced && (st = convert_grads(d, un, 1)) != VH_STATUS_OK) return st;
        un->converted = 1;
    }
    return VH_STATUS_OK;
}

static vh_status ddp_slices(void *self, vh_param_slices *out) {
    ddp *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (!d->ready)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "slices before setup");
    memset(out, 0, sizeof *out);
    out->items = d->slices;
    out->count = d->num_params;
    out->item_size = (uint32_t)sizeof(vh_param_slice);
    out->replicated = 1; /* every rank holds every slice: sums over them are local */
    return VH_STATUS_OK;
}

static vh_status ddp_refresh(void *self) {
    ddp *d = self;
    if (!d) return VH_STATUS_ERR_INVALID_ARG;
    if (!d->ready)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "refresh before setup");
    /* Aliased masters are the compute copies already (all of them under fp32). */
    const vh_device_ops *dev = d->dev;
    for (int32_t n = 0; n < d->num_params; n++) {
        const ddp_param *p = &d->params_[n];
        if (p->aliased) continue;
        vh_status st = dev->convert(dev->device, param_ptr(d, p), p->param_dtype,
                                    d->masters + p->master_at, VH_DTYPE_F32, (size_t)p->numel,
                                    NULL);
        if (st != VH_STATUS_OK)
            return d->host->api->fail(d->host, st,
                                      "refresh: converting the masters of unit %d param %d to "
                                      "%s failed",
                                      (int)d->slices[n].unit, (int)d->slices[n].param,
                                      vh_dtype_name(p->param_dtype));
    }
    return VH_STATUS_OK;
}

/* ---- optimizer state and memory ------------------------------------------ */

/* Every slice's state slots through io (sharding_state_io), each slice a
 * whole parameter. Every rank holds the same state, so on save rank 0 alone
 * writes; on load every rank reads. */
static vh_status state_io(ddp *d, const vh_state_io *io, int save) {
    if (!d->ready)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG, "%s before setup",
                                  save ? "state_save" : "state_load");
    int32_t count = save && d->comm->rank != 0 ? 0 : d->num_params;
    return sharding_state_io(d->host, d->dev, d->table, d->slices, count, d->state_slots, io,
                             save);
}

static vh_status ddp_state_save(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return state_io(self, io, 1);
}

static vh_status ddp_state_load(void *self, const vh_state_io *io) {
    if (!self) return VH_STATUS_ERR_INVALID_ARG;
    return state_io(self, io, 0);
}

/* Bytes on this rank: params are the compute copies (layouts with their
 * padding); grads the grad buffer plus the f32 copies of 16-bit grads;
 * masters only the separate f32 masters (an aliased master is counted once,
 * under params); comm_buffers 0, since every collective runs in place. */
static vh_status ddp_memory(void *self, vh_sharding_memory *out) {
    ddp *d = self;
    if (!d || !out) return VH_STATUS_ERR_INVALID_ARG;
    if (out->struct_size < sizeof out->struct_size)
        return d->host->api->fail(d->host, VH_STATUS_ERR_INVALID_ARG,
                                  "memory: out->struct_size is %u; the caller sets it",
                                  (unsigned)out->struct_size);
    vh_sharding_memory m;
    memset(&m, 0, sizeof m);
    m.params = (int64_t)d->params_bytes;
    m.grads = (int64_t)d->grads_bytes + d->grad32_numel * (int64_t)sizeof(float);
    m.masters = d->masters_numel * (int64_t)sizeof(float);
    m.optim_state = (int64_t)d->state_slots * d->numel * (int64_t)sizeof(float);
    m.comm_buffers = 0;
    /* Fill what the caller's (possibly older) struct covers. */
    size_t n = out->struct_size < sizeof m ? out->struct_size : sizeof m;
    memcpy((char *)out + sizeof m.struct_size, (const char *)&m + sizeof m.struct_size,
           n - sizeof m.struct_size);
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
    .state_save = ddp_state_save,
    .state_load = ddp_state_load,
    .memory = ddp_memory,
};

VH_PLUGIN_DEFINE(VH_ROLE_SHARDING, "ddp", "0.1.0",
                 "data parallel: full replicas, grads all-reduced in buckets of units", schema, vtable);
