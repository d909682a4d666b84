/* cuda_step.c - mta's step on a CUDA device (see cuda_step.h).
 *
 * One vh_cuda_mta_tensor per slice, in slice order, handed to the
 * extension: it cuts them into chunks itself, so nothing of the CPU work
 * list is built here. Sums come back per slice (per tensor of the call) and
 * are added on the host in slice order, then over the ranks, then turned
 * into the clipping factor or the LAMB trust ratios exactly as step.c does.
 *
 * Every extension call and every copy runs on the device's current stream,
 * in issue order; the copies of the sums back to the host wait for the
 * kernels before them (the only waits of a step). A sharded slice list adds
 * its sums over the ranks through device memory, as the host's own
 * exchanges do on a GPU (a device communicator, NCCL, reads device memory).
 */
#include <string.h>

#include "cuda_step.h"
#include "vithost/vh_comm.h"
#include "vithost/vh_cuda_mta.h"
#include "vithost/vh_optim_schedule.h"

typedef struct mta_cuda {
    const vh_device_ops *dev;
    const vh_cuda_mta_ops *ops;
    vh_cuda_mta_tensor *tensors; /* host memory, one per slice */
    size_t tensors_cap;
    double *host_sums;           /* host memory */
    size_t host_cap;
    double *dev_sums;            /* device memory */
    size_t dev_cap;
} mta_cuda;

/* The extension's table has every call this plugin makes. */
static int ops_complete(const vh_cuda_mta_ops *ops) {
    return ops && VH_STRUCT_HAS(ops, vh_cuda_mta_ops, sum_squares) && ops->adamw && ops->sgd &&
           ops->lamb_moments && ops->lamb_apply && ops->sum_squares;
}

vh_status mta_cuda_open(mta *o, const vh_device_ops *dev) {
    vh_host *host = o->host;
    const char *name = dev->name ? dev->name : "?";
    if (dev->kind != VH_DEVICE_KIND_CUDA)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "mta runs on the CPU or a CUDA device; device %s is neither (use "
                               "run.device: cpu)",
                               name);
    const vh_cuda_mta_ops *ops = NULL;
    if (VH_STRUCT_HAS(dev, vh_device_ops, get_extension) && dev->get_extension)
        ops = dev->get_extension(dev->device, VH_CUDA_MTA_EXTENSION);
    if (!ops_complete(ops))
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "device %s has no complete \"%s\" extension (the multi-tensor "
                               "optimizer kernels of libvh_cuda.so), which mta needs on a GPU; "
                               "rebuild vithost with them, or use run.device: cpu",
                               name, VH_CUDA_MTA_EXTENSION);
    mta_cuda *c = host->api->alloc(host, sizeof *c);
    if (!c) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "no memory for the optimizer");
    memset(c, 0, sizeof *c);
    c->dev = dev;
    c->ops = ops;
    o->cuda = c;
    return VH_STATUS_OK;
}

void mta_cuda_close(mta *o) {
    mta_cuda *c = o->cuda;
    if (!c) return;
    vh_host *host = o->host;
    if (c->dev_sums) c->dev->free(c->dev->device, c->dev_sums);
    host->api->free(host, c->tensors);
    host->api->free(host, c->host_sums);
    host->api->free(host, c);
    o->cuda = NULL;
}

/* Makes the host buffer *buf hold `need` items of `size` bytes. */
static vh_status reserve_host(vh_host *host, void **buf, size_t *cap, size_t need, size_t size) {
    if (need <= *cap && *buf) return VH_STATUS_OK;
    size_t n = need > 16 ? need : 16;
    void *p = host->api->alloc(host, n * size);
    if (!p) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "no memory for %zu sums", need);
    host->api->free(host, *buf);
    *buf = p;
    *cap = n;
    return VH_STATUS_OK;
}

/* Makes both sums buffers hold `need` doubles. */
static vh_status reserve_sums(mta *o, size_t need) {
    mta_cuda *c = o->cuda;
    vh_status st = reserve_host(o->host, (void **)&c->host_sums, &c->host_cap, need,
                                sizeof(double));
    if (st != VH_STATUS_OK || (need <= c->dev_cap && c->dev_sums)) return st;
    size_t n = need > 16 ? need : 16;
    void *p = NULL;
    st = c->dev->alloc(c->dev->device, n * sizeof(double), &p);
    if (st != VH_STATUS_OK)
        return o->host->api->fail(o->host, st, "no device memory for %zu sums on %s", n,
                                  c->dev->name ? c->dev->name : "?");
    if (c->dev_sums) c->dev->free(c->dev->device, c->dev_sums);
    c->dev_sums = p;
    c->dev_cap = n;
    return VH_STATUS_OK;
}

/* The device sums (count doubles) into host_sums; waits for the kernels. */
static vh_status download_sums(mta *o, size_t count) {
    mta_cuda *c = o->cuda;
    vh_status st = c->dev->copy(c->dev->device, c->host_sums, c->dev_sums,
                                count * sizeof(double), VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (st != VH_STATUS_OK)
        return o->host->api->fail(o->host, st, "copying %zu sums from %s failed", count,
                                  c->dev->name ? c->dev->name : "?");
    return VH_STATUS_OK;
}

/* vh_slices_reduce_sums' rule (replicas sum nothing) with the collective on
 * device memory. */
static vh_status reduce_sums(mta *o, const vh_param_slices *slices, double *sums, size_t count) {
    if (slices->replicated || count == 0) return VH_STATUS_OK;
    vh_comm *comm = o->host->api->comm(o->host);
    if (!comm || comm->world_size <= 1) return VH_STATUS_OK;
    mta_cuda *c = o->cuda;
    vh_status st = reserve_sums(o, count);
    if (st != VH_STATUS_OK) return st;
    const size_t bytes = count * sizeof(double);
    st = c->dev->copy(c->dev->device, c->dev_sums, sums, bytes, VH_COPY_KIND_HOST_TO_DEVICE,
                      NULL);
    if (st == VH_STATUS_OK)
        st = vh_comm_all_reduce(comm, c->dev_sums, count, VH_DTYPE_F64, VH_REDUCE_OP_SUM);
    if (st == VH_STATUS_OK)
        st = c->dev->copy(c->dev->device, sums, c->dev_sums, bytes, VH_COPY_KIND_DEVICE_TO_HOST,
                          NULL);
    if (st != VH_STATUS_OK)
        return o->host->api->fail(o->host, st, "all-reduce of %zu sums over %d ranks failed",
                                  count, (int)comm->world_size);
    return VH_STATUS_OK;
}

/* The call's tensor list: one entry per slice, in slice order. */
static vh_status fill_tensors(mta *o, const vh_param_slices *slices) {
    mta_cuda *c = o->cuda;
    vh_status st = reserve_host(o->host, (void **)&c->tensors, &c->tensors_cap,
                                (size_t)slices->count, sizeof *c->tensors);
    if (st != VH_STATUS_OK) return st;
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        vh_cuda_mta_tensor t;
        memset(&t, 0, sizeof t);
        t.master = sl->master;
        t.grad = sl->grad;
        for (int k = 0; k < 2 && k < o->state_slots; k++) t.state[k] = sl->state[k];
        t.numel = sl->count;
        t.master_dtype = sl->master_dtype;
        t.grad_dtype = sl->grad_dtype;
        /* the compute copy the sharding plugin handed over (ABI 2.9), if any */
        t.copy = vh_param_slice_compute(slices, sl);
        t.copy_dtype = t.copy ? sl->compute_dtype : VH_DTYPE_F32;
        t.decays = (sl->flags & VH_PARAM_FLAG_DECAY) != 0;
        c->tensors[s] = t;
    }
    return VH_STATUS_OK;
}

static vh_cuda_mta_args call_args(const mta *o, const vh_param_slices *slices) {
    vh_cuda_mta_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.count = slices->count;
    a.tensors = o->cuda->tensors;
    a.grad_scale = 1.0f;
    a.fresh = o->updates == 0;
    a.sums = o->cuda->dev_sums;
    return a;
}

/* A failed extension call, said with the device's name. */
static vh_status call_failed(mta *o, vh_status st, const char *what) {
    return o->host->api->fail(o->host, st, "mta: the %s kernels failed on %s (%s)", what,
                              o->cuda->dev->name ? o->cuda->dev->name : "?", vh_status_str(st));
}

vh_status mta_cuda_grad_sum_sq(mta *o, const vh_param_slices *slices, double *sq) {
    mta_cuda *c = o->cuda;
    vh_status st = fill_tensors(o, slices);
    if (st == VH_STATUS_OK) st = reserve_sums(o, (size_t)slices->count);
    if (st != VH_STATUS_OK) return st;
    vh_cuda_mta_args a = call_args(o, slices);
    if ((st = c->ops->sum_squares(c->dev->device, &a)) != VH_STATUS_OK)
        return call_failed(o, st, "sum-of-squares");
    if ((st = download_sums(o, (size_t)slices->count)) != VH_STATUS_OK) return st;
    double total = 0.0;
    for (int32_t s = 0; s < slices->count; s++) total += c->host_sums[s];
    if ((st = reduce_sums(o, slices, &total, 1)) != VH_STATUS_OK) return st;
    *sq = total;
    return VH_STATUS_OK;
}

/* The Adam scalars of step.c into the call's args. */
static void set_adam(vh_cuda_mta_args *a, const mta_adam_args *s) {
    a->grad_scale = s->grad_scale;
    a->beta1 = s->beta1, a->one_minus_beta1 = s->one_minus_beta1;
    a->beta2 = s->beta2, a->one_minus_beta2 = s->one_minus_beta2;
    a->eps = s->eps;
    a->neg_step_size = s->neg_step_size;
    a->bias_correction2_sqrt = s->bias_correction2_sqrt;
    a->bias_correction1 = s->bias_correction1;
    a->bias_correction2 = s->bias_correction2;
}

/* LAMB: moments and per-slice norms on the device, the norms per tensor and
 * over the ranks on the host (step.c's order), then the apply pass. */
static vh_status lamb_update(mta *o, const vh_param_slices *slices, vh_cuda_mta_args *a,
                             double lr) {
    mta_cuda *c = o->cuda;
    mta_worklist *w = &o->work;
    vh_comm *comm = slices->replicated ? NULL : o->host->api->comm(o->host);
    vh_status st = mta_worklist_map_tensors(w, slices, o->table, comm);
    if (st != VH_STATUS_OK) return st;
    if ((st = c->ops->lamb_moments(c->dev->device, a)) != VH_STATUS_OK)
        return call_failed(o, st, "LAMB moment");
    if ((st = download_sums(o, 2 * (size_t)slices->count)) != VH_STATUS_OK) return st;
    for (int32_t s = 0; s < slices->count; s++) {
        double *sums = &w->tensor_sums[2 * w->slice_tensor[s]];
        sums[0] += c->host_sums[2 * s];
        sums[1] += c->host_sums[2 * s + 1];
    }
    st = reduce_sums(o, slices, w->tensor_sums, 2 * (size_t)w->num_tensors);
    if (st != VH_STATUS_OK) return st;
    for (int32_t s = 0; s < slices->count; s++) {
        vh_cuda_mta_tensor *t = &c->tensors[s];
        const int adapt = o->cfg.always_adapt || (t->decays && a->weight_decay != 0.0f);
        t->lamb_rate = (float)(lr * mta_trust_ratio(&w->tensor_sums[2 * w->slice_tensor[s]],
                                                    adapt));
    }
    if ((st = c->ops->lamb_apply(c->dev->device, a)) != VH_STATUS_OK)
        return call_failed(o, st, "LAMB apply");
    return VH_STATUS_OK;
}

vh_status mta_cuda_update(mta *o, const vh_param_slices *slices, double lr, float grad_scale) {
    mta_cuda *c = o->cuda;
    vh_status st = fill_tensors(o, slices);
    if (st == VH_STATUS_OK && o->cfg.algo == MTA_ALGO_LAMB)
        st = reserve_sums(o, 2 * (size_t)slices->count);
    if (st != VH_STATUS_OK) return st;
    vh_cuda_mta_args a = call_args(o, slices);
    const mta_adam_args adam = mta_adam_args_of(o, lr, grad_scale);
    set_adam(&a, &adam);
    switch (o->cfg.algo) {
    case MTA_ALGO_ADAMW:
        a.decay = (float)(1.0 - lr * o->weight_decay);
        st = c->ops->adamw(c->dev->device, &a);
        return st == VH_STATUS_OK ? st : call_failed(o, st, "AdamW");
    case MTA_ALGO_SGD:
        a.weight_decay = (float)o->weight_decay;
        a.neg_lr = (float)-lr;
        a.momentum = (float)o->cfg.momentum;
        a.nesterov = o->cfg.nesterov;
        st = c->ops->sgd(c->dev->device, &a);
        return st == VH_STATUS_OK ? st : call_failed(o, st, "SGD");
    case MTA_ALGO_LAMB:
        a.weight_decay = (float)o->weight_decay;
        return lamb_update(o, slices, &a, lr);
    }
    return VH_STATUS_ERR_INTERNAL;
}
