/* replica.c - full replicas and their bucketed gradient all-reduce
 * (sharding_core.h): what ddp and zero1 share.
 *
 * Every rank keeps the whole model's compute copies and gradients in the
 * device's memory, in flat buffers:
 *
 *     compute  the compute copies: unit after unit, each unit laid out by
 *              vh_unit_layout_init with the policy's parameter dtypes (every
 *              parameter at a 64-byte aligned offset); what gather hands out
 *     grads    the same, with the policy's gradient dtypes; what grads hands
 *              out and backward accumulates into
 *     grad32   f32 gradients for the parameters whose gradient dtype is not
 *              f32: the wire's or the optimizer's (see "Gradients for the
 *              optimizer")
 *
 * Each unit's buffers start where the previous unit's end; unit layouts are
 * multiples of 64 bytes, so every parameter stays aligned. The f32 masters
 * and optimizer state are the shards' (shards.c): all of them with ddp,
 * 1/world of them with zero1.
 *
 * Start. load_unit is called by every rank with the same values, but a rank
 * may still hold different ones (its own random init, a stale file): the
 * unit's f32 values are broadcast from rank 0 (one collective a unit) before
 * the compute copies and masters are set from them, so every replica starts
 * as rank 0's. (A communicator without broadcast_start is trusted to have
 * been given the same values everywhere, as the contract says.)
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
 * Gradients for the optimizer (vh_param_slice.grad). For a parameter with
 * f32 gradients the slice points into `grads`. For one with f16/bf16
 * gradients:
 *   - reduced in their own dtype, to an optimizer that reads 16-bit
 *     gradients under a policy that leaves them alone (core.half_grads: the
 *     optimizer's VH_OPTIM_CAP_HALF_GRADS and the policy's unit_loss_scale,
 *     ABI 2.9), the slice points into `grads` too, in that dtype: no f32
 *     copy, no conversion pass, the same numbers (they widen exactly);
 *   - otherwise it points into grad32, which is filled by
 *     - reduce, before the collective, when comm_dtype is f32;
 *     - wait, after the collectives, when they ran in the 16-bit dtype;
 *     - wait, for a unit that was not reduced in the step (no collective).
 */
#include "sharding_core.h"

#include <string.h>

vh_status sh_replica_configure(sh_core *c) {
    vh_host *host = c->host;
    double bucket_mb = 25.0;
    vh_status st = host->api->config_float(host, "bucket_mb", &bucket_mb);
    if (st != VH_STATUS_OK) return st;
    if (!(bucket_mb >= 0.0)) /* the schema's range; NaN too */
        return host->api->config_fail(host, "bucket_mb", "bucket_mb must be >= 0 (got %g)",
                                      bucket_mb);
    c->rep.bucket_mb = bucket_mb;
    return VH_STATUS_OK;
}

/* ---- placement ---------------------------------------------------------- */

/* Each parameter's place in the flat buffers and on the wire. */
static void place_params(sh_core *c) {
    sh_replica *r = &c->rep;
    for (int32_t u = 0; u < c->num_units; u++) {
        const sh_unit *un = &c->units[u];
        sh_runit *ru = &r->units[u];
        ru->param_at = r->compute_bytes;
        ru->grad_at = r->grads_bytes;
        for (int32_t i = 0; i < un->num_params; i++) {
            const sh_param *p = &c->params[un->first_param + i];
            sh_rparam *rp = &r->params[un->first_param + i];
            rp->param_at = ru->param_at + p->param_at;
            rp->grad_at = ru->grad_at + p->grad_at;
            /* The wire: see "Wire dtype" above. */
            rp->in_grad32 = p->grad_dtype != VH_DTYPE_F32 && c->policy.comm_dtype == VH_DTYPE_F32;
            rp->wire = rp->in_grad32 ? VH_DTYPE_F32 : p->grad_dtype;
            /* An f32 copy for the wire, or for an optimizer that reads only
             * f32 (see "Gradients for the optimizer"). */
            rp->grad32_at = -1;
            if (p->grad_dtype != VH_DTYPE_F32 && (rp->in_grad32 || !c->half_grads)) {
                rp->grad32_at = r->grad32_numel;
                r->grad32_numel += p->numel;
            }
            /* Its bytes on the wire: packed f32 in grad32, or its span of
             * `grads` up to the next parameter (padding included). */
            size_t span_end = i + 1 < un->num_params ? p[1].grad_at : un->grad_bytes;
            ru->wire_bytes += rp->in_grad32 ? (size_t)p->numel * sizeof(float)
                                            : span_end - p->grad_at;
        }
        r->compute_bytes += un->param_bytes;
        r->grads_bytes += un->grad_bytes;
    }
}

/* Units from the last to the first, each bucket closed once it holds >=
 * bucket_mb MiB. */
static void assign_buckets(sh_core *c) {
    sh_replica *r = &c->rep;
    const double cap = r->bucket_mb * 1024.0 * 1024.0;
    int32_t nb = 0;
    for (int32_t u = c->num_units - 1; u >= 0; u--) {
        sh_bucket *b = nb > 0 ? &r->buckets[nb - 1] : NULL;
        if (!b || (double)b->bytes >= cap) { /* the previous one is full: open another */
            b = &r->buckets[nb++];
            b->num_units = 0;
        }
        b->first_unit = u;
        b->num_units++;
        b->bytes += r->units[u].wire_bytes;
        r->units[u].bucket = nb - 1;
    }
    r->num_buckets = nb;
}

/* Bucket b's runs (from index *n on), over its parameters in buffer order,
 * and their lengths: in `grads` to the next run's start, or the end of the
 * bucket's last unit (padding included); in grad32 the parameters
 * themselves (packed). */
static void plan_runs(sh_core *c, sh_bucket *b, int32_t *n) {
    sh_replica *r = &c->rep;
    const int32_t last_unit = b->first_unit + b->num_units - 1;
    const sh_unit *hi = &c->units[last_unit];
    const size_t bucket_end = r->units[last_unit].grad_at + hi->grad_bytes;
    const int32_t first = c->units[b->first_unit].first_param;
    const int32_t end = hi->first_param + hi->num_params;
    b->first_run = *n;
    for (int32_t k = first; k < end; k++) {
        const sh_rparam *p = &r->params[k];
        sh_run *last = *n > b->first_run ? &r->runs[*n - 1] : NULL;
        if (last && last->in_grad32 == p->in_grad32 && last->dtype == p->wire) {
            last->count++;
            continue;
        }
        sh_run *run = &r->runs[(*n)++];
        run->first = k;
        run->count = 1;
        run->in_grad32 = p->in_grad32;
        run->dtype = p->wire;
        run->at = p->in_grad32 ? (size_t)p->grad32_at : p->grad_at;
    }
    b->num_runs = *n - b->first_run;
    for (int32_t i = b->first_run; i < *n; i++) {
        sh_run *run = &r->runs[i];
        const int32_t run_end = run->first + run->count;
        if (run->in_grad32) {
            int64_t elems = 0;
            for (int32_t k = run->first; k < run_end; k++) elems += c->params[k].numel;
            run->elems = (size_t)elems;
        } else {
            size_t end_at = run_end < end ? r->params[run_end].grad_at : bucket_end;
            run->elems = (end_at - run->at) / vh_dtype_size(run->dtype);
        }
    }
}

/* Where everything goes, then the buckets (see "Buckets"). Host memory
 * only; the same on every rank. */
vh_status sh_replica_plan(sh_core *c) {
    vh_host *host = c->host;
    sh_replica *r = &c->rep;
    size_t unit_bytes = (size_t)c->num_units * sizeof *r->units;
    size_t param_bytes = (size_t)c->num_params * sizeof *r->params;
    size_t bucket_bytes = (size_t)c->num_units * sizeof *r->buckets;
    size_t run_bytes = (size_t)c->num_params * sizeof *r->runs; /* at most one a parameter */
    r->units = host->api->alloc(host, unit_bytes);
    r->params = host->api->alloc(host, param_bytes);
    r->buckets = host->api->alloc(host, bucket_bytes);
    r->runs = host->api->alloc(host, run_bytes);
    r->started = host->api->alloc(host, (size_t)c->num_params * sizeof *r->started);
    if (!r->units || !r->params || !r->buckets || !r->runs || !r->started)
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for %d buckets",
                               (int)c->num_units);
    memset(r->units, 0, unit_bytes);
    memset(r->params, 0, param_bytes);
    memset(r->buckets, 0, bucket_bytes);
    memset(r->runs, 0, run_bytes);
    place_params(c);
    assign_buckets(c);
    int32_t n = 0;
    for (int32_t b = 0; b < r->num_buckets; b++) plan_runs(c, &r->buckets[b], &n);
    r->num_runs = n;
    return VH_STATUS_OK;
}

vh_status sh_replica_alloc(sh_core *c) {
    sh_replica *r = &c->rep;
    vh_status st = sh_alloc_zeroed(c, r->compute_bytes, &r->compute, "the parameters");
    if (st == VH_STATUS_OK) st = sh_alloc_zeroed(c, r->grads_bytes, &r->grads, "the gradients");
    void *buf = NULL;
    if (st == VH_STATUS_OK)
        st = sh_alloc_zeroed(c, (size_t)r->grad32_numel * sizeof(float), &buf,
                             "the f32 gradients");
    r->grad32 = buf;
    return st;
}

/* Finishes every request still in flight, in the order they started;
 * returns the first failure. */
static vh_status wait_runs(sh_core *c) {
    sh_replica *r = &c->rep;
    vh_status first = VH_STATUS_OK;
    for (int32_t i = 0; i < r->num_started; i++) {
        sh_run *run = &r->runs[r->started[i]];
        if (!run->req) continue;
        vh_status st = c->comm->ops->wait(c->comm, run->req);
        run->req = NULL;
        run->done = 0;
        if (st != VH_STATUS_OK && first == VH_STATUS_OK) first = st;
    }
    r->num_started = r->first_open = 0;
    return first;
}

void sh_replica_release(sh_core *c) {
    sh_replica *r = &c->rep;
    /* The buffers belong to a collective until it has finished. */
    if (r->started) (void)wait_runs(c);
    sh_dev_free(c, r->compute);
    sh_dev_free(c, r->grads);
    sh_dev_free(c, r->grad32);
    vh_host *host = c->host;
    host->api->free(host, r->units);
    host->api->free(host, r->params);
    host->api->free(host, r->runs);
    host->api->free(host, r->buckets);
    host->api->free(host, r->started);
    const double bucket_mb = r->bucket_mb;
    memset(r, 0, sizeof *r);
    r->bucket_mb = bucket_mb;
}

void *sh_replica_piece_param(const sh_core *c, int32_t unit, const sh_piece *pc) {
    const int32_t n = c->units[unit].first_param + pc->param;
    return (char *)c->rep.compute + c->rep.params[n].param_at +
           (size_t)pc->offset * vh_dtype_size(c->params[n].param_dtype);
}

void *sh_replica_piece_grad(const sh_core *c, int32_t unit, const sh_piece *pc,
                            vh_dtype *dtype) {
    const int32_t n = c->units[unit].first_param + pc->param;
    const sh_rparam *p = &c->rep.params[n];
    if (p->grad32_at >= 0) {
        *dtype = VH_DTYPE_F32;
        return c->rep.grad32 + p->grad32_at + pc->offset;
    }
    *dtype = c->params[n].grad_dtype; /* f32, or 16-bit with half_grads */
    return (char *)c->rep.grads + p->grad_at + (size_t)pc->offset * vh_dtype_size(*dtype);
}

/* ---- per-unit calls ----------------------------------------------------- */

vh_status sh_replica_load_unit(sh_core *c, int32_t unit, float *values) {
    const sh_unit *u = &c->units[unit];
    vh_status st;
    /* Without broadcast every rank keeps what it was given: the same values,
     * by load_unit's contract (the shipped backends all broadcast). */
    if (c->world > 1 && c->comm->ops->broadcast_start &&
        (st = vh_comm_broadcast(c->comm, values, (size_t)u->numel, VH_DTYPE_F32, 0)) !=
            VH_STATUS_OK)
        return c->host->api->fail(c->host, st,
                                  "load_unit: broadcasting unit %s's values (%lld f32) from "
                                  "rank 0 failed",
                                  sh_unit_name(u), (long long)u->numel);
    for (int32_t i = 0; i < u->num_params; i++) {
        const sh_param *p = &c->params[u->first_param + i];
        st = sh_cast(c, (char *)c->rep.compute + c->rep.params[u->first_param + i].param_at,
                     p->param_dtype, values + p->elem, VH_DTYPE_F32, (size_t)p->numel);
        if (st != VH_STATUS_OK)
            return sh_fail_device(c, st, "load_unit: setting", unit, i);
    }
    return sh_shards_load(c, unit, values, 0);
}

vh_status sh_replica_zero_grads(sh_core *c) {
    /* grad32 needs no zeroing: it is written whole before it is read. */
    sh_replica *r = &c->rep;
    vh_status st = c->dev->memset_zero(c->dev->device, r->grads, r->grads_bytes, NULL);
    if (st != VH_STATUS_OK)
        return c->host->api->fail(c->host, st, "zeroing the gradients on %s failed",
                                  sh_dev_name(c));
    for (int32_t u = 0; u < c->num_units; u++) r->units[u].converted = 0;
    for (int32_t b = 0; b < r->num_buckets; b++) r->buckets[b].reduced = 0;
    return VH_STATUS_OK;
}

/* Lets the collectives in flight advance (see "Progress"): one test per
 * request not yet known to have finished. */
static vh_status progress(sh_core *c) {
    sh_replica *r = &c->rep;
    vh_status (*test)(vh_comm *, vh_comm_request *, int *) = c->comm->ops->test;
    if (!test) return VH_STATUS_OK;
    for (int32_t i = r->first_open; i < r->num_started; i++) {
        sh_run *run = &r->runs[r->started[i]];
        if (!run->req || run->done) continue;
        int done = 0;
        vh_status st = test(c->comm, run->req, &done);
        if (st != VH_STATUS_OK)
            return c->host->api->fail(c->host, st,
                                      "testing a gradient all-reduce (%zu %s) over %d ranks "
                                      "failed",
                                      run->elems, vh_dtype_name(run->dtype), (int)c->world);
        run->done = done != 0;
    }
    /* Skip the finished prefix next time. */
    while (r->first_open < r->num_started) {
        const sh_run *run = &r->runs[r->started[r->first_open]];
        if (run->req && !run->done) break;
        r->first_open++;
    }
    return VH_STATUS_OK;
}

vh_status sh_replica_gather(sh_core *c, int32_t unit, const void **params) {
    vh_status st = progress(c);
    if (st != VH_STATUS_OK) return st;
    /* A replica is always whole: nothing to gather. */
    *params = (const char *)c->rep.compute + c->rep.units[unit].param_at;
    return VH_STATUS_OK;
}

vh_status sh_replica_release_unit(sh_core *c, int32_t unit) {
    (void)unit;
    return progress(c);
}

vh_status sh_replica_grads(sh_core *c, int32_t unit, void **grads) {
    vh_status st = progress(c);
    if (st != VH_STATUS_OK) return st;
    *grads = (char *)c->rep.grads + c->rep.units[unit].grad_at;
    return VH_STATUS_OK;
}

/* grad32 <- the 16-bit gradients of unit u's params, on the current stream:
 * those reduced in f32 (in_grad32, for reduce) or the others (for wait). */
static vh_status convert_grads(sh_core *c, int32_t unit, int in_grad32) {
    const sh_unit *u = &c->units[unit];
    for (int32_t i = 0; i < u->num_params; i++) {
        const sh_param *p = &c->params[u->first_param + i];
        const sh_rparam *rp = &c->rep.params[u->first_param + i];
        if (rp->grad32_at < 0 || rp->in_grad32 != in_grad32) continue;
        vh_status st = c->dev->convert(c->dev->device, c->rep.grad32 + rp->grad32_at,
                                       VH_DTYPE_F32, (char *)c->rep.grads + rp->grad_at,
                                       p->grad_dtype, (size_t)p->numel, NULL);
        if (st != VH_STATUS_OK)
            return sh_fail_device(c, st, "converting to f32 the gradients of", unit, i);
    }
    return VH_STATUS_OK;
}

/* Starts the collectives of bucket b, whose units are all reduced. */
static vh_status start_bucket(sh_core *c, const sh_bucket *b) {
    sh_replica *r = &c->rep;
    for (int32_t k = b->first_run; k < b->first_run + b->num_runs; k++) {
        sh_run *run = &r->runs[k];
        /* f32 on the wire for 16-bit grads: reduce converted them already
         * (the collective is ordered after the conversion on the stream). */
        void *buf = run->in_grad32 ? (void *)(r->grad32 + run->at) : (char *)r->grads + run->at;
        run->done = 0;
        vh_status st = c->comm->ops->all_reduce_start(c->comm, buf, run->elems, run->dtype,
                                                      VH_REDUCE_OP_AVG, NULL, &run->req);
        if (st != VH_STATUS_OK) {
            run->req = NULL;
            const sh_unit *lo = &c->units[b->first_unit];
            const sh_unit *hi = &c->units[b->first_unit + b->num_units - 1];
            return c->host->api->fail(c->host, st,
                                      "starting the all-reduce of units %s..%s's grads (%zu %s) "
                                      "over %d ranks failed",
                                      sh_unit_name(lo), sh_unit_name(hi), run->elems,
                                      vh_dtype_name(run->dtype), (int)c->world);
        }
        r->started[r->num_started++] = k;
    }
    return VH_STATUS_OK;
}

vh_status sh_replica_reduce(sh_core *c, int32_t unit) {
    vh_status st = progress(c);
    if (st != VH_STATUS_OK) return st;
    /* Its grads are final: their f32 copies can be made now, while the
     * bucket waits for its other units. */
    if (c->rep.grad32_numel > 0 && (st = convert_grads(c, unit, 1)) != VH_STATUS_OK) return st;
    sh_bucket *b = &c->rep.buckets[c->rep.units[unit].bucket];
    if (++b->reduced < b->num_units) return VH_STATUS_OK;
    return start_bucket(c, b);
}

vh_status sh_replica_wait(sh_core *c) {
    /* Every request started by reduce, in the order they started. */
    vh_status st = wait_runs(c);
    if (st != VH_STATUS_OK)
        return c->host->api->fail(c->host, st,
                                  "waiting for the gradient all-reduces over %d ranks failed",
                                  (int)c->world);
    /* The optimizer reads f32: convert what was reduced in 16 bits (and the
     * 16-bit grads of a step that reduced nothing). */
    if (c->rep.grad32_numel == 0) return VH_STATUS_OK;
    for (int32_t u = 0; u < c->num_units; u++) {
        sh_runit *ru = &c->rep.units[u];
        if (ru->converted) continue;
        if ((st = convert_grads(c, u, 0)) != VH_STATUS_OK) return st;
        /* in_grad32 ones were converted by reduce */
        if (!c->units[u].reduced && (st = convert_grads(c, u, 1)) != VH_STATUS_OK) return st;
        ru->converted = 1;
    }
    return VH_STATUS_OK;
}

void sh_replica_memory(const sh_core *c, vh_sharding_memory *m) {
    m->params = (int64_t)c->rep.compute_bytes;
    m->grads = (int64_t)c->rep.grads_bytes + c->rep.grad32_numel * (int64_t)sizeof(float);
}
