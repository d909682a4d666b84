/* step.c - one multi-tensor apply: every local slice in one parallel pass.
 *
 *   1. validate the slice list, cut it into chunks (worklist.c)
 *   2. clipping (args->clip_grad_norm > 0): sum of squares of every grad
 *      chunk, one all-reduce, scale = min(1, max_norm / (norm + 1e-6)); or
 *      the sum the precision plugin's overflow pass computed
 *      (args->has_grad_sum_sq)
 *   3. adamw, sgd: one pass over the chunks.
 *      lamb: a pass that updates the moments and sums ||p||^2 and ||u||^2
 *      per chunk, one all-reduce of the per-tensor sums, a pass that applies
 *      p -= lr * trust_ratio * u.
 *
 * The passes are OpenMP loops over chunks (schedule dynamic: any thread
 * takes the next chunk). Reductions write one partial per chunk and add the
 * partials in chunk order afterwards, so norms do not depend on the number
 * of threads and a resumed run repeats an uninterrupted one bit for bit.
 *
 * Masters and gradients may be f32, f16 or bf16 (full FP16 updates the
 * f16 parameters themselves): 16-bit chunks go through f32 views (see
 * master_view); the state is f32. The conversions are the SDK's array
 * ones (vh_convert_to_f32 / _from_f32, vectorised): a call per element cost
 * more than the update itself (T3 AMP's optimizer phase went from 28 to
 * 42-44 ms with bf16 gradients read that way), and a baseline SSE2 rounding
 * loop of mta's own as much as the refresh pass it replaces (6 ms a step).
 *
 * The all-reduces sum over ranks what the ranks' slices hold apart (FSDP
 * shards); when every rank holds every slice (vh_param_slices.replicated,
 * DDP) the local sums are the global ones and no collective runs: the
 * SDK's vh_slices_reduce_sums holds that rule. The rate, weight decay and
 * clipping limit are the update's args (the SDK's shared keys).
 *
 * On a CUDA device (o->cuda) the checks, the clipping factor and the
 * counters stay here; the passes over the elements are cuda_step.c's.
 */
#include <math.h>
#include <stddef.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "algos.h"
#include "cuda_step.h"
#include "mta.h"
#include "vithost/vh_optim_schedule.h"
#include "vithost/vh_types.h"

/* Only run a parallel region when there is more than one chunk. */
#define MTA_PARALLEL_MIN_CHUNKS 2

static int needs_state(const mta *o, int32_t k) { return k < o->state_slots; }

/* Element i of an f32 buffer of a slice (the slices carry void pointers
 * since ABI 2.0; check_slices has made sure the state holds f32). */
static inline float *f32_at(void *p, int64_t i) { return (float *)p + i; }

static int is_half(vh_dtype t) { return t == VH_DTYPE_F16 || t == VH_DTYPE_BF16; }

/* ---- 16-bit masters and gradients ------------------------------------------
 * Under full FP16 without master weights the slice's master is the f16 (or
 * bf16) parameter itself; a sharding plugin may also hand over 16-bit
 * gradients. The kernels stay fp32: a chunk of such a slice is loaded into
 * the thread's f32 scratch (exact), updated there, and the master is stored
 * back rounded to nearest even, once per update. f32 slices are used in
 * place, so their numbers are those of the fp32 path, bit for bit. */

/* This thread's two scratch chunks: [0] master, [1] gradient. */
static inline float *thread_scratch(const mta *o, int which) {
#ifdef _OPENMP
    const size_t t = (size_t)omp_get_thread_num();
#else
    const size_t t = 0;
#endif
    return o->work.scratch + (2 * t + (size_t)which) * (size_t)MTA_CHUNK_ELEMS;
}

/* Elements [b, b + n) of a slice's master as f32: in place, or loaded. */
static inline float *master_view(const mta *o, const vh_param_slice *sl, int64_t b, int64_t n) {
    if (!is_half(sl->master_dtype)) return f32_at(sl->master, b);
    float *v = thread_scratch(o, 0);
    vh_convert_to_f32(v, (const uint16_t *)sl->master + b, sl->master_dtype, n);
    return v;
}

/* After an update: the view back into a 16-bit master, rounded to nearest
 * even (nothing to do for f32, updated in place). */
static inline void master_store(const vh_param_slice *sl, int64_t b, int64_t n,
                                const float *v) {
    if (!is_half(sl->master_dtype)) return;
    vh_convert_from_f32((uint16_t *)sl->master + b, sl->master_dtype, v, n);
}

/* After an update: the new values into the slice's compute copy, where the
 * sharding plugin handed one (VH_OPTIM_CAP_WRITES_COMPUTE), rounded as its
 * refresh would round them, while the chunk is in cache. */
static inline void compute_store(const vh_param_slices *slices, const vh_param_slice *sl,
                                 int64_t b, int64_t n, const float *v) {
    char *compute = vh_param_slice_compute(slices, sl);
    if (compute)
        vh_convert_from_f32(compute + (size_t)b * vh_dtype_size(sl->compute_dtype),
                            sl->compute_dtype, v, n);
}

static inline const float *grad_view(const mta *o, const vh_param_slice *sl, int64_t b,
                                     int64_t n) {
    if (!is_half(sl->grad_dtype)) return f32_at(sl->grad, b);
    float *v = thread_scratch(o, 1);
    vh_convert_to_f32(v, (const uint16_t *)sl->grad + b, sl->grad_dtype, n);
    return v;
}

/* The kernels of algos.c are fp32: masters and gradients in f32, f16 or
 * bf16 are read through f32 views; the state must be f32; a compute copy to
 * write (`compute`) is f32, f16 or bf16. Anything else is refused by name
 * rather than misread. */
static vh_status check_dtypes(mta *o, int32_t s, const vh_param_slice *sl, const void *compute) {
    const char *what = NULL;
    vh_dtype dtype = VH_DTYPE_F32;
    if (sl->master_dtype != VH_DTYPE_F32 && !is_half(sl->master_dtype))
        what = "master values", dtype = sl->master_dtype;
    else if (sl->grad_dtype != VH_DTYPE_F32 && !is_half(sl->grad_dtype))
        what = "gradient", dtype = sl->grad_dtype;
    else if (o->state_slots > 0 && sl->state_dtype != VH_DTYPE_F32)
        what = "optimizer state", dtype = sl->state_dtype;
    else if (compute && sl->compute_dtype != VH_DTYPE_F32 && !is_half(sl->compute_dtype))
        what = "compute copy", dtype = sl->compute_dtype;
    if (!what) return VH_STATUS_OK;
    return o->host->api->fail(o->host, VH_STATUS_ERR_UNSUPPORTED,
                              "slice %d (unit %d, param %d) holds its %s in %s; mta updates "
                              "masters, gradients and compute copies in f32, f16 or bf16 and "
                              "keeps its state in f32 (a policy with state_dtype f32)",
                              (int)s, (int)sl->unit, (int)sl->param, what, vh_dtype_name(dtype));
}

/* *any_half: some slice has a 16-bit master or gradient. */
static vh_status check_slices(mta *o, const vh_param_slices *slices, int *any_half) {
    vh_host *host = o->host;
    *any_half = 0;
    char why[160];
    if (vh_param_slices_check(slices, why, sizeof why) != VH_STATUS_OK)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "step: %s", why);
    for (int32_t s = 0; s < slices->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, s);
        if (sl->unit < 0 || sl->param < 0 || sl->offset < 0 || sl->count < 0)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d has unit %d, param %d, offset %lld, count %lld",
                                   (int)s, (int)sl->unit, (int)sl->param,
                                   (long long)sl->offset, (long long)sl->count);
        if (o->scale_first && (sl->unit >= o->scale_units ||
                            sl->param >= o->table->units[sl->unit].num_params))
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d names unit %d, param %d, which the parameter "
                                   "table (layer_decay, freeze) does not have",
                                   (int)s, (int)sl->unit, (int)sl->param);
        if (sl->count == 0) continue;
        vh_status st = check_dtypes(o, s, sl, vh_param_slice_compute(slices, sl));
        if (st != VH_STATUS_OK) return st;
        if (is_half(sl->master_dtype) || is_half(sl->grad_dtype)) *any_half = 1;
        const char *missing = !sl->master ? "master values" : !sl->grad ? "gradient" : NULL;
        for (int32_t k = 0; !missing && k < VH_OPTIM_MAX_STATE_SLOTS; k++)
            if (needs_state(o, k) && !sl->state[k]) missing = "optimizer state";
        if (missing)
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d (unit %d, param %d) has no %s", (int)s,
                                   (int)sl->unit, (int)sl->param, missing);
    }
    return VH_STATUS_OK;
}

/* The communicator the tensor numbering is agreed over when there is no
 * parameter table: none when every rank holds the same full list (DDP
 * replicas: vh_param_slices.replicated). */
static vh_comm *sum_comm(mta *o, const vh_param_slices *slices) {
    return slices->replicated ? NULL : o->host->api->comm(o->host);
}

/* torch.nn.utils.clip_grad_norm_ with the 2-norm: the global norm over every
 * rank's slices, then grads * min(1, max_norm / (norm + 1e-6)). When the
 * precision plugin's overflow pass summed the squares already
 * (args->has_grad_sum_sq: over every rank, fp32 sums per tensor) that sum
 * is the norm's and no pass or collective runs here; otherwise the norm is
 * summed in double (torch: fp32 per-tensor norms, then the norm of those). */
static vh_status clip_scale(mta *o, const vh_optim_step_args *args, float *scale) {
    const vh_param_slices *slices = args->slices;
    double sq = 0.0;
    if (args->has_grad_sum_sq && !o->frozen) { /* that sum holds frozen gradients too */
        sq = args->grad_sum_sq;
    } else if (o->cuda) {
        vh_status st = mta_cuda_grad_sum_sq(o, slices, &sq);
        if (st != VH_STATUS_OK) return st;
    } else {
        mta_worklist *w = &o->work;
        const mta_chunk *chunks = w->chunks;
        double *part = w->partials;
        const int64_t nc = w->num_chunks;
#pragma omp parallel for schedule(dynamic, 1) if (nc >= MTA_PARALLEL_MIN_CHUNKS)
        for (int64_t c = 0; c < nc; c++) {
            const vh_param_slice *sl = vh_param_slices_at(slices, chunks[c].slice);
            /* a frozen parameter has no gradient in torch (requires_grad off) */
            part[c] = mta_frozen(o, sl) ? 0.0
                                        : mta_sum_squares(grad_view(o, sl, chunks[c].begin,
                                                                    chunks[c].count),
                                                          chunks[c].count);
        }
        for (int64_t c = 0; c < nc; c++) sq += part[c];
        vh_status st = vh_slices_reduce_sums(o->host, slices, &sq, 1);
        if (st != VH_STATUS_OK) return st;
    }
    const double norm = sqrt(sq);
    o->grad_norm = norm;
    vh_host *host = o->host;
    if (!isfinite(norm))
        return host->api->fail(host, VH_STATUS_ERR_NUMERIC,
                               "the global gradient norm is %g; clipping cannot fix that", norm);
    host->api->log(host, VH_LOG_LEVEL_DEBUG, "gradient norm %.6g (clip at %g)", norm,
                   o->clip_grad_norm);
    const double coef = o->clip_grad_norm / (norm + 1e-6);
    *scale = coef < 1.0 ? (float)coef : 1.0f;
    return VH_STATUS_OK;
}

static int decays(const vh_param_slice *sl) { return (sl->flags & VH_PARAM_FLAG_DECAY) != 0; }

/* Scalars of update number t = updates + 1, computed in double and rounded
 * to float where torch rounds its Python floats. */
mta_adam_args mta_adam_args_of(const mta *o, double lr, float grad_scale) {
    const mta_config *c = &o->cfg;
    const double t = (double)(o->updates + 1);
    const double bc1 = 1.0 - pow(c->beta1, t);
    const double bc2 = 1.0 - pow(c->beta2, t);
    mta_adam_args a = {
        .grad_scale = grad_scale,
        .beta1 = (float)c->beta1,
        .one_minus_beta1 = (float)(1.0 - c->beta1),
        .beta2 = (float)c->beta2,
        .one_minus_beta2 = (float)(1.0 - c->beta2),
        .eps = (float)c->eps,
        .fresh = o->updates == 0,
        .bias_correction1 = (float)bc1,
        .bias_correction2 = (float)bc2,
        .neg_step_size = (float)-(lr / bc1),
        .bias_correction2_sqrt = (float)sqrt(bc2),
    };
    return a;
}

static void adamw_pass(mta *o, const vh_param_slices *slices, double lr, float grad_scale) {
    const mta_adam_args a = mta_adam_args_of(o, lr, grad_scale);
    const float decay = (float)(1.0 - lr * o->weight_decay);
    const mta_chunk *chunks = o->work.chunks;
    const int64_t nc = o->work.num_chunks;
#pragma omp parallel for schedule(dynamic, 1) if (nc >= MTA_PARALLEL_MIN_CHUNKS)
    for (int64_t c = 0; c < nc; c++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, chunks[c].slice);
        if (mta_frozen(o, sl)) continue; /* freeze: no step, no decay, state untouched */
        const int64_t b = chunks[c].begin, n = chunks[c].count;
        /* layer decay: this parameter group's rate, as timm's lr_scale
         * scales the group's lr (the decoupled decay uses it too) */
        const double s = mta_lr_scale(o, sl);
        const mta_adam_args as = s == 1.0 ? a : mta_adam_args_of(o, lr * s, grad_scale);
        const float ds = s == 1.0 ? decay : (float)(1.0 - lr * s * o->weight_decay);
        float *p = master_view(o, sl, b, n);
        mta_adamw_chunk(&as, decays(sl) ? ds : 1.0f, p, grad_view(o, sl, b, n),
                        f32_at(sl->state[0], b), f32_at(sl->state[1], b), n);
        master_store(sl, b, n, p);
        compute_store(slices, sl, b, n, p);
    }
}

static void sgd_pass(mta *o, const vh_param_slices *slices, double lr, float grad_scale) {
    const mta_sgd_args a = {
        .grad_scale = grad_scale,
        .neg_lr = (float)-lr,
        .momentum = (float)o->cfg.momentum,
        .nesterov = o->cfg.nesterov,
        .fresh = o->updates == 0,
    };
    const float wd = (float)o->weight_decay;
    const int with_momentum = o->state_slots > 0;
    const mta_chunk *chunks = o->work.chunks;
    const int64_t nc = o->work.num_chunks;
#pragma omp parallel for schedule(dynamic, 1) if (nc >= MTA_PARALLEL_MIN_CHUNKS)
    for (int64_t c = 0; c < nc; c++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, chunks[c].slice);
        if (mta_frozen(o, sl)) continue; /* freeze: no step, no decay, momentum untouched */
        const int64_t b = chunks[c].begin, n = chunks[c].count;
        mta_sgd_args as = a;
        if (o->lr_scale) as.neg_lr = (float)-(lr * mta_lr_scale(o, sl));
        float *p = master_view(o, sl, b, n);
        mta_sgd_chunk(&as, decays(sl) ? wd : 0.0f, p, grad_view(o, sl, b, n),
                      with_momentum ? f32_at(sl->state[0], b) : NULL, n);
        master_store(sl, b, n, p);
        compute_store(slices, sl, b, n, p);
    }
}

/* The LAMB trust ratio ||p|| / ||u|| of a tensor, 1 when either is 0. Like
 * apex FusedLAMB (use_nvlamb=False) and timm's Lamb (always_adapt=False),
 * tensors without weight decay keep ratio 1 unless always_adapt is set. */
double mta_trust_ratio(const double *sums, int adapt) {
    if (!adapt) return 1.0;
    const double p_norm = sqrt(sums[0]), u_norm = sqrt(sums[1]);
    return p_norm > 0.0 && u_norm > 0.0 ? p_norm / u_norm : 1.0;
}

static vh_status lamb_passes(mta *o, const vh_param_slices *slices, double lr,
                             float grad_scale) {
    mta_worklist *w = &o->work;
    vh_status st = mta_worklist_map_tensors(w, slices, o->table, sum_comm(o, slices));
    if (st != VH_STATUS_OK) return st;
    const mta_adam_args a = mta_adam_args_of(o, lr, grad_scale);
    const float wd = (float)o->weight_decay;
    const mta_chunk *chunks = w->chunks;
    double *part = w->partials;
    const int64_t nc = w->num_chunks;

#pragma omp parallel for schedule(dynamic, 1) if (nc >= MTA_PARALLEL_MIN_CHUNKS)
    for (int64_t c = 0; c < nc; c++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, chunks[c].slice);
        const int64_t b = chunks[c].begin, n = chunks[c].count;
        part[2 * c] = part[2 * c + 1] = 0.0;
        if (mta_frozen(o, sl)) continue; /* freeze: moments untouched, norms 0 */
        mta_lamb_moments_chunk(&a, decays(sl) ? wd : 0.0f, master_view(o, sl, b, n),
                               grad_view(o, sl, b, n), f32_at(sl->state[0], b),
                               f32_at(sl->state[1], b), n, &part[2 * c], &part[2 * c + 1]);
    }
    /* per tensor: slices in list order, chunks in element order */
    for (int64_t c = 0; c < nc; c++) {
        double *sums = &w->tensor_sums[2 * w->slice_tensor[chunks[c].slice]];
        sums[0] += part[2 * c];
        sums[1] += part[2 * c + 1];
    }
    /* whole tensors over the ranks (FSDP); nothing to add under DDP */
    st = vh_slices_reduce_sums(o->host, slices, w->tensor_sums, 2 * (size_t)w->num_tensors);
    if (st != VH_STATUS_OK) return st;

    const int always = o->cfg.always_adapt;
#pragma omp parallel for schedule(dynamic, 1) if (nc >= MTA_PARALLEL_MIN_CHUNKS)
    for (int64_t c = 0; c < nc; c++) {
        const vh_param_slice *sl = vh_param_slices_at(slices, chunks[c].slice);
        if (mta_frozen(o, sl)) continue;
        const int64_t b = chunks[c].begin, n = chunks[c].count;
        const float wd_sl = decays(sl) ? wd : 0.0f;
        const double *sums = &w->tensor_sums[2 * w->slice_tensor[chunks[c].slice]];
        const double ratio = mta_trust_ratio(sums, always || wd_sl != 0.0f);
        float *p = master_view(o, sl, b, n);
        mta_lamb_apply_chunk(&a, wd_sl, (float)(lr * mta_lr_scale(o, sl) * ratio), p, f32_at(sl->state[0], b),
                             f32_at(sl->state[1], b), n);
        master_store(sl, b, n, p);
        compute_store(slices, sl, b, n, p);
    }
    return VH_STATUS_OK;
}

/* Checks the slices and builds the chunks (and 16-bit scratch); on a CUDA
 * device the extension cuts its own chunks. */
static vh_status prepare(mta *o, const vh_param_slices *slices) {
    int any_half = 0;
    vh_status st = check_slices(o, slices, &any_half);
    if (st != VH_STATUS_OK || o->cuda) return st;
    st = mta_worklist_build(&o->work, slices);
#ifdef _OPENMP
    /* every thread a parallel loop below may run on */
    if (st == VH_STATUS_OK && any_half)
        st = mta_worklist_reserve_scratch(&o->work, omp_get_max_threads());
#else
    if (st == VH_STATUS_OK && any_half) st = mta_worklist_reserve_scratch(&o->work, 1);
#endif
    return st;
}

/* The update passes of the CPU kernels. */
static vh_status cpu_passes(mta *o, const vh_param_slices *slices, double lr, float grad_scale) {
    switch (o->cfg.algo) {
    case MTA_ALGO_ADAMW: adamw_pass(o, slices, lr, grad_scale); break;
    case MTA_ALGO_SGD: sgd_pass(o, slices, lr, grad_scale); break;
    case MTA_ALGO_LAMB: return lamb_passes(o, slices, lr, grad_scale);
    }
    return VH_STATUS_OK;
}

vh_status mta_update(mta *o, const vh_optim_step_args *args_in, double *lr_out) {
    vh_host *host = o->host;
    vh_optim_step_args args; /* members a newer host appends are not read */
    if (!vh_struct_upgrade(&args, sizeof args, args_in))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "update: no args");
    if (args.step < 0)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "step %lld is negative",
                               (long long)args.step);
    if (!(args.lr >= 0.0) || !isfinite(args.lr))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "learning rate %g", args.lr);
    vh_status st = prepare(o, args.slices);
    if (st != VH_STATUS_OK) return st;
    const vh_param_slices *slices = args.slices;
    const double lr = args.lr;
    o->weight_decay = args.weight_decay;
    o->clip_grad_norm = args.clip_grad_norm;
    float grad_scale = 1.0f;
    if (o->clip_grad_norm > 0.0 && (st = clip_scale(o, &args, &grad_scale)) != VH_STATUS_OK)
        return st;

    st = o->cuda ? mta_cuda_update(o, slices, lr, grad_scale)
                 : cpu_passes(o, slices, lr, grad_scale);
    if (st != VH_STATUS_OK) return st;
    o->updates++;
    o->last_step = args.step;
    if (lr_out) *lr_out = lr;
    return VH_STATUS_OK;
}
