/* test_fsdp.c - the sharded plugins, fsdp and zero1, in one process.
 *
 * The plugin is loaded the way vithost loads it (a recipe naming it,
 * run_open_text, the build tree's plugin folder) and driven through its
 * vtable, as test_fp32_ddp.c drives ddp. Several ranks are threads: each
 * has its own run and plugin instance, and a fake communicator meets them
 * at a barrier inside every collective's start (so every request has
 * finished when it returns). The reduction adds the ranks' values in rank
 * order in f32 and divides by the world size, as an MPI AVG would.
 *
 * The reference is ddp on one rank given the mean of the ranks' gradients:
 * the ranks' gradients are chosen so that the mean is exact in every dtype
 * (base - d, base, base + d), so fsdp and zero1 on 1 or 3 ranks must give
 * ddp's numbers bit for bit: gathered units, masters after a few
 * optimizer-like updates of the slices, store_unit. The tests that hold for
 * every sharded plugin (slices, state io, memory, misuse) run for both.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime.h"
#include "vithost/vh_runtime.h"

/* ---- the test's parameter table ------------------------------------------
 * "embed" is smaller than 16 elements a rank: on 3 ranks only rank 0 holds
 * any of it. "block" straddles ranks with mixed dtypes under AMP (the
 * norms stay f32), so ranks pack different byte counts. */

static const vh_param_desc embed_params[] = {
    {.name = "embed.weight", .ndim = 2, .shape = {4, 3}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 12},
    {.name = "embed.bias", .ndim = 1, .shape = {4}, .flags = VH_PARAM_FLAG_BIAS, .offset = 12,
     .numel = 4},
};
static const vh_param_desc block_params[] = {
    {.name = "blocks.0.fc1.weight", .ndim = 2, .shape = {12, 10}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 120},
    {.name = "blocks.0.norm.weight", .ndim = 1, .shape = {10}, .flags = VH_PARAM_FLAG_NORM,
     .offset = 120, .numel = 10},
    {.name = "blocks.0.norm.bias", .ndim = 1, .shape = {10}, .flags = VH_PARAM_FLAG_NORM,
     .offset = 130, .numel = 10},
    {.name = "blocks.0.fc2.weight", .ndim = 2, .shape = {10, 8}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 140, .numel = 80},
    {.name = "blocks.0.fc2.bias", .ndim = 1, .shape = {8}, .flags = VH_PARAM_FLAG_BIAS,
     .offset = 220, .numel = 8},
};
static const vh_param_desc head_params[] = {
    {.name = "head.norm.weight", .ndim = 1, .shape = {5}, .flags = VH_PARAM_FLAG_NORM,
     .offset = 0, .numel = 5},
    {.name = "head.weight", .ndim = 2, .shape = {7, 5}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 5, .numel = 35},
    {.name = "head.bias", .ndim = 1, .shape = {7}, .flags = VH_PARAM_FLAG_BIAS, .offset = 40,
     .numel = 7},
};
static const vh_unit_desc units[] = {
    {"embed", embed_params, 2, 16},
    {"blocks.0", block_params, 5, 228},
    {"head", head_params, 3, 47},
};
static const vh_param_table table = {units, 3, 291};
#define NUM_UNITS 3
#define MAX_UNIT 228

/* A value no two places share, exact in bf16 and f16 (multiples of 1/8
 * below 32: 8 significant bits at most). */
static float pattern(int32_t u, int64_t i) {
    return (float)((u * 37 + i * 11) % 256 - 128) / 8.0f;
}

/* Gradients: the mean over ranks is base, exactly, in every dtype; rank r
 * of `world` adds (r - (world - 1) / 2) * d (world odd). */
static float grad_base(int step, int32_t u, int64_t i) {
    return (float)((i * 7 + u * 3 + step * 5) % 32 - 16) / 16.0f;
}
static float grad_of(int step, int32_t u, int64_t i, int32_t rank, int32_t world) {
    float d = (float)(i % 3 + 1) / 16.0f;
    return grad_base(step, u, i) + (float)(rank - (world - 1) / 2) * d;
}

static float to_f32(const void *p, vh_dtype t, int64_t i) {
    if (t == VH_DTYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == VH_DTYPE_BF16 ? vh_bf16_to_f32(h) : vh_f16_to_f32(h);
}
static void from_f32(void *p, vh_dtype t, int64_t i, float x) {
    if (t == VH_DTYPE_F32) ((float *)p)[i] = x;
    else if (t == VH_DTYPE_BF16) ((uint16_t *)p)[i] = vh_f32_to_bf16(x);
    else ((uint16_t *)p)[i] = vh_f32_to_f16(x);
}

/* ---- policies ------------------------------------------------------------ */

static vh_precision_policy f32_policy(void) {
    vh_precision_policy p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.param_dtype = p.compute_dtype = p.grad_dtype = VH_DTYPE_F32;
    p.comm_dtype = p.master_dtype = p.state_dtype = VH_DTYPE_F32;
    p.master_weights = 1;
    return p;
}

/* AMP bf16: 16-bit params and grads, norms in f32, f32 masters. */
static vh_precision_policy amp_policy(vh_dtype comm) {
    vh_precision_policy p = f32_policy();
    p.param_dtype = p.compute_dtype = p.grad_dtype = VH_DTYPE_BF16;
    p.comm_dtype = comm;
    p.fp32_param_flags = VH_PARAM_FLAG_NORM;
    return p;
}

/* Full fp16 without master weights: the optimizer updates the f16 copy. */
static vh_precision_policy fp16_policy(void) {
    vh_precision_policy p = f32_policy();
    p.param_dtype = p.compute_dtype = p.grad_dtype = p.comm_dtype = VH_DTYPE_F16;
    p.master_dtype = VH_DTYPE_F16;
    p.master_weights = 0;
    return p;
}

/* ---- a world of threads ----------------------------------------------------- */

#define MAX_RANKS 4
enum { OP_GATHER = 0, OP_SCATTER = 1, OP_REDUCE = 2, OP_BCAST = 3, OP_COUNT = 4 };

typedef struct tworld {
    pthread_barrier_t barrier;
    int32_t world;
    const void *send[MAX_RANKS];
    void *recv[MAX_RANKS];
    size_t count[MAX_RANKS];
    vh_dtype dtype[MAX_RANKS];
    int op[MAX_RANKS];
    int calls[MAX_RANKS][OP_COUNT];
    int mismatch;
} tworld;

static char done_token;
#define DONE ((vh_comm_request *)&done_token)

/* One collective: post, meet, compute this rank's output into `out`, meet
 * again (nobody reads a peer's buffer after it), then write it. A
 * broadcast's root rides in `rop`. */
static vh_status collective(vh_comm *c, int op, const void *send, void *recv, size_t count,
                            vh_dtype dtype, vh_reduce_op rop, vh_comm_request **req) {
    tworld *w = c->impl;
    const int32_t r = c->rank, n = w->world;
    *req = NULL;
    w->calls[r][op]++;
    w->send[r] = send, w->recv[r] = recv, w->count[r] = count, w->dtype[r] = dtype, w->op[r] = op;
    pthread_barrier_wait(&w->barrier);
    int ok = op == OP_GATHER || op == OP_BCAST || rop == VH_REDUCE_OP_AVG;
    for (int32_t k = 0; k < n; k++)
        ok = ok && w->count[k] == count && w->dtype[k] == dtype && w->op[k] == op;
    const size_t es = vh_dtype_size(dtype);
    const size_t out_n = op == OP_GATHER ? count * (size_t)n : count;
    void *out = malloc(out_n * es + 1);
    if (ok && out) {
        if (op == OP_GATHER) {
            for (int32_t k = 0; k < n; k++)
                memcpy((char *)out + (size_t)k * count * es, w->send[k], count * es);
        } else if (op == OP_BCAST) {
            memcpy(out, w->send[(int32_t)rop], count * es);
        } else {
            const size_t first = op == OP_SCATTER ? (size_t)r * count : 0;
            for (size_t i = 0; i < count; i++) {
                float acc = 0.0f;
                for (int32_t k = 0; k < n; k++)
                    acc += to_f32(w->send[k], dtype, (int64_t)(first + i));
                from_f32(out, dtype, (int64_t)i, acc / (float)n);
            }
        }
    }
    pthread_barrier_wait(&w->barrier);
    if (!ok || !out) {
        w->mismatch = 1;
        free(out);
        return VH_STATUS_ERR_COMM;
    }
    memcpy(recv, out, out_n * es);
    free(out);
    *req = DONE;
    return VH_STATUS_OK;
}

static vh_status tw_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                               vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    return collective(c, OP_REDUCE, buf, buf, count, dtype, op, req);
}
static vh_status tw_reduce_scatter(vh_comm *c, const void *send, void *recv, size_t count,
                                   vh_dtype dtype, vh_reduce_op op, vh_stream *stream,
                                   vh_comm_request **req) {
    (void)stream;
    return collective(c, OP_SCATTER, send, recv, count, dtype, op, req);
}
static vh_status tw_all_gather(vh_comm *c, const void *send, void *recv, size_t count,
                               vh_dtype dtype, vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    return collective(c, OP_GATHER, send, recv, count, dtype, VH_REDUCE_OP_SUM, req);
}
static vh_status tw_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype, int32_t root,
                              vh_stream *stream, vh_comm_request **req) {
    (void)stream;
    if (root < 0 || root >= c->world_size) return VH_STATUS_ERR_INVALID_ARG;
    return collective(c, OP_BCAST, buf, buf, count, dtype, (vh_reduce_op)root, req);
}
static vh_status tw_wait(vh_comm *c, vh_comm_request *req) {
    (void)c;
    return req == NULL || req == DONE ? VH_STATUS_OK : VH_STATUS_ERR_INVALID_ARG;
}
static vh_status tw_test(vh_comm *c, vh_comm_request *req, int *done) {
    (void)c;
    if (req != DONE || !done) return VH_STATUS_ERR_INVALID_ARG;
    *done = 1;
    return VH_STATUS_OK;
}
static vh_status tw_barrier(vh_comm *c) {
    pthread_barrier_wait(&((tworld *)c->impl)->barrier);
    return VH_STATUS_OK;
}

static const vh_comm_ops tworld_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce_start = tw_all_reduce,
    .reduce_scatter_start = tw_reduce_scatter,
    .all_gather_start = tw_all_gather,
    .broadcast_start = tw_broadcast,
    .wait = tw_wait,
    .test = tw_test,
    .barrier = tw_barrier,
};

/* A communicator whose every collective fails and is counted: setup must
 * not communicate. */
static int refused_calls;
static vh_status no_all_reduce(vh_comm *c, void *b, size_t n, vh_dtype d, vh_reduce_op op,
                               vh_stream *s, vh_comm_request **r) {
    (void)c, (void)b, (void)n, (void)d, (void)op, (void)s, (void)r;
    refused_calls++;
    return VH_STATUS_ERR_COMM;
}
static vh_status no_reduce_scatter(vh_comm *c, const void *a, void *b, size_t n, vh_dtype d,
                                   vh_reduce_op op, vh_stream *s, vh_comm_request **r) {
    (void)c, (void)a, (void)b, (void)n, (void)d, (void)op, (void)s, (void)r;
    refused_calls++;
    return VH_STATUS_ERR_COMM;
}
static vh_status no_all_gather(vh_comm *c, const void *a, void *b, size_t n, vh_dtype d,
                               vh_stream *s, vh_comm_request **r) {
    (void)c, (void)a, (void)b, (void)n, (void)d, (void)s, (void)r;
    refused_calls++;
    return VH_STATUS_ERR_COMM;
}
static vh_status no_wait(vh_comm *c, vh_comm_request *r) {
    (void)c, (void)r;
    refused_calls++;
    return VH_STATUS_ERR_COMM;
}
static const vh_comm_ops refusing_ops = {
    .struct_size = sizeof(vh_comm_ops),
    .all_reduce_start = no_all_reduce,
    .reduce_scatter_start = no_reduce_scatter,
    .all_gather_start = no_all_gather,
    .wait = no_wait,
};

/* ---- devices -------------------------------------------------------------- */

/* The CPU's ops with alloc/free counted (buffers live now). */
static vh_device_ops counting_device;
static int live_allocs;
static vh_status counting_alloc(vh_device *dev, size_t bytes, void **out) {
    vh_status st = vh_cpu_device_ops()->alloc(dev, bytes, out);
    if (st == VH_STATUS_OK) live_allocs++;
    return st;
}
static void counting_free(vh_device *dev, void *ptr) {
    if (ptr) live_allocs--;
    vh_cpu_device_ops()->free(dev, ptr);
}

/* A device whose memory is never touched: addresses only (setup and
 * memory() of a ViT-B sized table without allocating gigabytes). */
static vh_device_ops address_device;
static uintptr_t next_address;
static vh_status address_alloc(vh_device *dev, size_t bytes, void **out) {
    (void)dev;
    next_address = (next_address + 63) / 64 * 64;
    *out = (void *)next_address;
    next_address += bytes + 64;
    return VH_STATUS_OK;
}
static void address_free(vh_device *dev, void *ptr) { (void)dev, (void)ptr; }
static vh_status address_memset(vh_device *dev, void *ptr, size_t bytes, vh_stream *s) {
    (void)dev, (void)ptr, (void)bytes, (void)s;
    return VH_STATUS_OK;
}

/* ---- the run ------------------------------------------------------------------ */

typedef struct fx {
    vh_run run;
    const vh_sharding_vtable *sh;
    void *self;
    vh_precision_policy policy; /* setup keeps a pointer only for the call */
} fx;

static const char *error_of(fx *f) { return f->run.hosts[VH_ROLE_SHARDING].error; }

/* Opens a run with `plugin` as sharding (keys: more of its section) and
 * creates it; ops NULL keeps the one-process communicator, dev NULL the CPU. */
static void fx_open(fx *f, const char *plugin, const char *keys, const vh_comm_ops *ops,
                    void *impl, int32_t rank, int32_t world, const vh_device_ops *dev) {
    memset(f, 0, sizeof *f);
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "run: {batch_size: 4}\n"
             "model: {plugin: test_model}\n"
             "precision: {plugin: fp32}\n"
             "sharding: {plugin: %s%s%s}\n"
             "optim: {plugin: test_optim}\n"
             "data: {plugin: test_data}\n",
             plugin, keys ? ", " : "", keys ? keys : "");
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    vh_status st = run_open_text(&f->run, "fsdp.yaml", recipe, &opts, &d);
    if (st != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_string_equal(f->run.plugins[VH_ROLE_SHARDING].desc->name, plugin);
    if (ops) {
        f->run.comm.ops = ops;
        f->run.comm.impl = impl;
        f->run.comm.rank = rank;
        f->run.comm.world_size = world;
        f->run.comm.backend = "fake";
    }
    if (dev) f->run.device = dev;
    f->sh = f->run.plugins[VH_ROLE_SHARDING].desc->vtable;
    st = f->sh->create(&f->run.hosts[VH_ROLE_SHARDING].pub, &f->self);
    if (st != VH_STATUS_OK) fail_msg("%s create: %s", plugin, error_of(f));
}

static vh_status fx_setup(fx *f, const vh_param_table *t, int32_t slots, vh_precision_policy pol) {
    f->policy = pol;
    vh_sharding_setup s = {.struct_size = sizeof s, .table = t, .policy = &f->policy,
                           .state_slots = slots};
    return f->sh->setup(f->self, &s);
}

static void fx_close(fx *f) {
    if (f->self) f->sh->destroy(f->self);
    run_close(&f->run);
}

static void expect_error(fx *f, vh_status got, vh_status want, const char *part) {
    assert_int_equal(got, want);
    if (!strstr(error_of(f), part)) fail_msg("message '%s' lacks '%s'", error_of(f), part);
}

/* ---- one rank's training: the same call sequence on every rank ------------ */

#define STEPS 3

typedef struct job {
    fx *f;
    int32_t rank, world;
    vh_unit_layout pl[NUM_UNITS], gl[NUM_UNITS];
    /* out */
    unsigned char *gathered[NUM_UNITS]; /* the last forward's full units */
    float values[NUM_UNITS][MAX_UNIT];  /* store_unit after the steps */
    char error[VH_DIAG_CAPACITY + 128];
} job;

#define JOB_CHECK(j, expr, what)                                                          \
    do {                                                                                  \
        vh_status st_ = (expr);                                                           \
        if (st_ != VH_STATUS_OK) {                                                        \
            snprintf((j)->error, sizeof (j)->error, "rank %d: %s: %s", (int)(j)->rank,    \
                     (what), error_of((j)->f));                                           \
            return NULL;                                                                  \
        }                                                                                 \
    } while (0)

/* The slices' update: m = 0.5 m + g; w -= m / 8, in the master's dtype. */
static void update_slices(const vh_param_slices *sl) {
    for (int32_t s = 0; s < sl->count; s++) {
        const vh_param_slice *x = vh_param_slices_at(sl, s);
        float *m = x->state[0];
        const float *g = x->grad;
        for (int64_t i = 0; i < x->count; i++) {
            m[i] = 0.5f * m[i] + g[i];
            from_f32(x->master, x->master_dtype, i, to_f32(x->master, x->master_dtype, i) -
                                                        m[i] / 8.0f);
        }
    }
}

static void *job_run(void *arg) {
    job *j = arg;
    fx *f = j->f;
    const vh_sharding_vtable *sh = f->sh;
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float v[MAX_UNIT];
        for (int64_t i = 0; i < units[u].numel; i++) v[i] = pattern(u, i);
        JOB_CHECK(j, sh->load_unit(f->self, u, v), "load_unit");
    }
    for (int step = 0; step < STEPS; step++) {
        JOB_CHECK(j, sh->zero_grads(f->self), "zero_grads");
        for (int32_t u = 0; u < NUM_UNITS; u++) {
            const void *p = NULL;
            JOB_CHECK(j, sh->gather(f->self, u, &p), "forward gather");
            if (step == STEPS - 1) memcpy(j->gathered[u], p, j->pl[u].bytes);
            JOB_CHECK(j, sh->release(f->self, u), "forward release");
        }
        for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
            const void *p = NULL;
            void *g = NULL;
            JOB_CHECK(j, sh->gather(f->self, u, &p), "backward gather");
            JOB_CHECK(j, sh->grads(f->self, u, &g), "grads");
            for (int32_t q = 0; q < units[u].num_params; q++) {
                const vh_param_desc *pd = &units[u].params[q];
                char *at = (char *)g + j->gl[u].offsets[q];
                for (int64_t i = 0; i < pd->numel; i++)
                    from_f32(at, j->gl[u].dtypes[q], i,
                             grad_of(step, u, pd->offset + i, j->rank, j->world));
            }
            JOB_CHECK(j, sh->reduce(f->self, u), "reduce");
            JOB_CHECK(j, sh->release(f->self, u), "backward release");
        }
        JOB_CHECK(j, sh->wait(f->self), "wait");
        vh_param_slices sl;
        JOB_CHECK(j, sh->slices(f->self, &sl), "slices");
        update_slices(&sl);
        JOB_CHECK(j, sh->refresh(f->self), "refresh");
    }
    for (int32_t u = 0; u < NUM_UNITS; u++)
        JOB_CHECK(j, sh->store_unit(f->self, u, j->values[u]), "store_unit");
    return NULL;
}

static void job_init(job *j, fx *f, int32_t rank, int32_t world) {
    memset(j, 0, sizeof *j);
    j->f = f;
    j->rank = rank;
    j->world = world;
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        assert_int_equal(vh_unit_layout_init(&j->pl[u], &units[u], vh_policy_param_dtype,
                                             &f->policy),
                         VH_STATUS_OK);
        assert_int_equal(vh_unit_layout_init(&j->gl[u], &units[u], vh_policy_grad_dtype,
                                             &f->policy),
                         VH_STATUS_OK);
        j->gathered[u] = calloc(1, j->pl[u].bytes);
        assert_non_null(j->gathered[u]);
    }
}

static void job_free(job *j) {
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        vh_unit_layout_free(&j->pl[u]);
        vh_unit_layout_free(&j->gl[u]);
        free(j->gathered[u]);
    }
}

/* ddp on one rank, given the mean gradients (the ranks' offsets cancel). */
static void reference_run(job *ref, fx *f, vh_precision_policy pol) {
    fx_open(f, "ddp", NULL, NULL, NULL, 0, 1, NULL);
    if (fx_setup(f, &table, 1, pol) != VH_STATUS_OK) fail_msg("ddp setup: %s", error_of(f));
    job_init(ref, f, 1, 3); /* the middle rank of three: grad_of is the base */
    job_run(ref);
    if (ref->error[0]) fail_msg("ddp: %s", ref->error);
}

/* `plugin` (fsdp or zero1) on `world` ranks (threads) against ddp on one:
 * every rank's gathered units and stored values equal ddp's, bit for bit. */
static void plugin_vs_ddp(const char *plugin, vh_precision_policy pol, int32_t world,
                          const char *keys) {
    fx *ref_fx = calloc(1, sizeof *ref_fx);
    job *ref = calloc(1, sizeof *ref);
    assert_non_null(ref_fx);
    assert_non_null(ref);
    reference_run(ref, ref_fx, pol);

    tworld w;
    memset(&w, 0, sizeof w);
    w.world = world;
    pthread_barrier_init(&w.barrier, NULL, (unsigned)world);
    fx *f = calloc(MAX_RANKS, sizeof *f);
    job *jobs = calloc(MAX_RANKS, sizeof *jobs);
    assert_non_null(f);
    assert_non_null(jobs);
    for (int32_t r = 0; r < world; r++) {
        fx_open(&f[r], plugin, keys, &tworld_ops, &w, r, world, NULL);
        if (fx_setup(&f[r], &table, 1, pol) != VH_STATUS_OK)
            fail_msg("%s setup: %s", plugin, error_of(&f[r]));
        job_init(&jobs[r], &f[r], r, world);
    }
    if (world == 1) {
        jobs[0].rank = 1, jobs[0].world = 3; /* the base gradients, as ddp's */
        job_run(&jobs[0]);
    } else {
        pthread_t th[MAX_RANKS];
        for (int32_t r = 0; r < world; r++) pthread_create(&th[r], NULL, job_run, &jobs[r]);
        for (int32_t r = 0; r < world; r++) pthread_join(th[r], NULL);
    }
    pthread_barrier_destroy(&w.barrier);
    assert_int_equal(w.mismatch, 0);
    for (int32_t r = 0; r < world; r++) {
        if (jobs[r].error[0]) fail_msg("%s: %s", plugin, jobs[r].error);
        for (int32_t u = 0; u < NUM_UNITS; u++) {
            if (memcmp(jobs[r].gathered[u], ref->gathered[u], ref->pl[u].bytes) != 0)
                fail_msg("%s rank %d of %d: gathered unit %s differs from ddp's", plugin,
                         (int)r, (int)world, units[u].name);
            for (int64_t i = 0; i < units[u].numel; i++)
                if (memcmp(&jobs[r].values[u][i], &ref->values[u][i], sizeof(float)) != 0)
                    fail_msg("%s rank %d of %d: unit %s element %lld is %.9g, ddp %.9g",
                             plugin, (int)r, (int)world, units[u].name, (long long)i,
                             (double)jobs[r].values[u][i], (double)ref->values[u][i]);
        }
        /* The values moved away from the pattern: the updates happened. */
        assert_true(jobs[r].values[1][0] != pattern(1, 0));
        job_free(&jobs[r]);
        fx_close(&f[r]);
    }
    free(f);
    free(jobs);
    job_free(ref);
    fx_close(ref_fx);
    free(ref);
    free(ref_fx);
}

static void compare_with_ddp(vh_precision_policy pol, int32_t world, const char *keys) {
    plugin_vs_ddp("fsdp", pol, world, keys);
}

static void test_world1_fp32(void **state) {
    (void)state;
    compare_with_ddp(f32_policy(), 1, NULL);
}
static void test_world1_amp_bf16(void **state) {
    (void)state;
    compare_with_ddp(amp_policy(VH_DTYPE_BF16), 1, NULL);
    compare_with_ddp(amp_policy(VH_DTYPE_F32), 1, NULL);
}
static void test_world1_fp16_no_masters(void **state) {
    (void)state;
    compare_with_ddp(fp16_policy(), 1, NULL);
}
/* Three ranks: pieces straddle ranks, rank 1 packs f32 norms among bf16,
 * ranks 1 and 2 hold nothing of "embed". */
static void test_world3_matches_ddp(void **state) {
    (void)state;
    compare_with_ddp(f32_policy(), 3, NULL);
    compare_with_ddp(amp_policy(VH_DTYPE_BF16), 3, NULL);
    compare_with_ddp(amp_policy(VH_DTYPE_F32), 3, NULL);
    compare_with_ddp(fp16_policy(), 3, NULL);
}
static void test_world3_zero2_no_prefetch(void **state) {
    (void)state;
    compare_with_ddp(amp_policy(VH_DTYPE_BF16), 3, "reshard_after_forward: false");
    compare_with_ddp(f32_policy(), 3, "prefetch: false");
    compare_with_ddp(fp16_policy(), 3, "reshard_after_forward: false, prefetch: false");
}

/* zero1: replicas whose optimizer part is sharded as fsdp's; the same
 * numbers as ddp on 1 and 3 ranks, in every policy. */
static void test_zero1_matches_ddp(void **state) {
    (void)state;
    const vh_precision_policy pols[] = {f32_policy(), amp_policy(VH_DTYPE_BF16),
                                        amp_policy(VH_DTYPE_F32), fp16_policy()};
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        plugin_vs_ddp("zero1", pols[k], 1, NULL);
        plugin_vs_ddp("zero1", pols[k], 3, NULL);
        plugin_vs_ddp("zero1", pols[k], 3, "bucket_mb: 0");
    }
}

/* The sharded plugins, for the tests that hold for both. */
static const char *const sharded[] = {"fsdp", "zero1"};
#define NUM_SHARDED 2

/* ---- slices: every element exactly once over the ranks -------------------- */

static void check_slices_cover_once(const char *plugin) {
    const int32_t world = 3;
    int seen[NUM_UNITS][MAX_UNIT];
    memset(seen, 0, sizeof seen);
    for (int32_t r = 0; r < world; r++) {
        fx f;
        refused_calls = 0;
        fx_open(&f, plugin, NULL, &refusing_ops, NULL, r, world, NULL);
        if (fx_setup(&f, &table, 2, amp_policy(VH_DTYPE_BF16)) != VH_STATUS_OK)
            fail_msg("setup: %s", error_of(&f));
        assert_int_equal(refused_calls, 0);
        vh_param_slices sl;
        assert_int_equal(f.sh->slices(f.self, &sl), VH_STATUS_OK);
        assert_int_equal(sl.replicated, 0);
        assert_true(sl.item_size >= sizeof(vh_param_slice));
        for (int32_t s = 0; s < sl.count; s++) {
            const vh_param_slice *x = vh_param_slices_at(&sl, s);
            const vh_param_desc *pd = &units[x->unit].params[x->param];
            assert_true(x->offset >= 0 && x->count > 0 && x->offset + x->count <= pd->numel);
            assert_int_equal(x->flags, pd->flags);
            assert_int_equal(x->grad_dtype, VH_DTYPE_F32);
            assert_int_equal(x->master_dtype, VH_DTYPE_F32); /* amp: f32 masters */
            assert_int_equal((uintptr_t)x->grad % 4, 0);
            for (int64_t i = 0; i < x->count; i++) seen[x->unit][pd->offset + x->offset + i]++;
        }
        /* Shards of 16-element multiples: S = 16, 80, 16 elements (zero1's
         * gradients are replicas). */
        vh_sharding_memory m = {.struct_size = sizeof m};
        assert_int_equal(f.sh->memory(f.self, &m), VH_STATUS_OK);
        if (strcmp(plugin, "fsdp") == 0) assert_int_equal(m.grads, (16 + 80 + 16) * 4);
        assert_int_equal(m.optim_state, 2 * (16 + 80 + 16) * 4);
        /* rank 0: embed (2), fc1 [0, 80), head.norm and head.weight [0, 11);
         * rank 2: fc2 [20, 80), fc2.bias, head.weight [27, 35), head.bias. */
        if (r == 0) assert_int_equal(sl.count, 2 + 1 + 2);
        if (r == 1) assert_int_equal(sl.count, 0 + 4 + 1);
        if (r == 2) assert_int_equal(sl.count, 0 + 2 + 2);
        fx_close(&f);
    }
    for (int32_t u = 0; u < NUM_UNITS; u++)
        for (int64_t i = 0; i < units[u].numel; i++)
            if (seen[u][i] != 1)
                fail_msg("%s: unit %s element %lld is held %d times", plugin, units[u].name,
                         (long long)i, seen[u][i]);
}

static void test_slices_cover_once(void **state) {
    (void)state;
    for (int k = 0; k < NUM_SHARDED; k++) check_slices_cover_once(sharded[k]);
}

/* ---- memory: a ViT-B/16 sized table ---------------------------------------- */

#define VITB_UNITS 12
static vh_param_desc vitb_params[VITB_UNITS][12];
static vh_unit_desc vitb_units[VITB_UNITS];
static vh_param_table vitb_table;

static void vitb_build(void) {
    static const struct {
        const char *name;
        int64_t rows, cols;
        uint32_t flags;
    } block[] = {
        {"norm1.weight", 768, 0, VH_PARAM_FLAG_NORM}, {"norm1.bias", 768, 0, VH_PARAM_FLAG_NORM},
        {"attn.qkv.weight", 2304, 768, VH_PARAM_FLAG_DECAY},
        {"attn.qkv.bias", 2304, 0, VH_PARAM_FLAG_BIAS},
        {"attn.proj.weight", 768, 768, VH_PARAM_FLAG_DECAY},
        {"attn.proj.bias", 768, 0, VH_PARAM_FLAG_BIAS},
        {"norm2.weight", 768, 0, VH_PARAM_FLAG_NORM}, {"norm2.bias", 768, 0, VH_PARAM_FLAG_NORM},
        {"mlp.fc1.weight", 3072, 768, VH_PARAM_FLAG_DECAY},
        {"mlp.fc1.bias", 3072, 0, VH_PARAM_FLAG_BIAS},
        {"mlp.fc2.weight", 768, 3072, VH_PARAM_FLAG_DECAY},
        {"mlp.fc2.bias", 768, 0, VH_PARAM_FLAG_BIAS},
    };
    int64_t total = 0;
    for (int32_t u = 0; u < VITB_UNITS; u++) {
        int64_t off = 0;
        for (int32_t q = 0; q < 12; q++) {
            vh_param_desc *pd = &vitb_params[u][q];
            memset(pd, 0, sizeof *pd);
            pd->name = block[q].name;
            pd->ndim = block[q].cols ? 2 : 1;
            pd->shape[0] = block[q].rows;
            pd->shape[1] = block[q].cols;
            pd->flags = block[q].flags;
            pd->numel = block[q].rows * (block[q].cols ? block[q].cols : 1);
            pd->offset = off;
            off += pd->numel;
        }
        vitb_units[u] = (vh_unit_desc){"blocks", vitb_params[u], 12, off};
        total += off;
    }
    vitb_table = (vh_param_table){vitb_units, VITB_UNITS, total};
}

static int64_t total_of(const vh_sharding_memory *m) {
    return m->params + m->grads + m->masters + m->optim_state;
}

/* memory() of `plugin` for the ViT-B table on rank `rank` of `world`,
 * through the address-only device and a communicator that refuses. */
static vh_sharding_memory vitb_memory(const char *plugin, const char *keys, int32_t rank,
                                      int32_t world, vh_precision_policy pol) {
    address_device = *vh_cpu_device_ops();
    address_device.alloc = address_alloc;
    address_device.free = address_free;
    address_device.memset_zero = address_memset;
    address_device.name = "addresses";
    next_address = 1u << 20;
    refused_calls = 0;
    fx f;
    fx_open(&f, plugin, keys, &refusing_ops, NULL, rank, world, &address_device);
    if (fx_setup(&f, &vitb_table, 2, pol) != VH_STATUS_OK)
        fail_msg("%s setup on %d ranks: %s", plugin, (int)world, error_of(&f));
    assert_int_equal(refused_calls, 0); /* setup does not communicate */
    vh_sharding_memory m = {.struct_size = sizeof m};
    assert_int_equal(f.sh->memory(f.self, &m), VH_STATUS_OK);
    fx_close(&f);
    return m;
}

static void test_memory_vitb(void **state) {
    (void)state;
    vitb_build();
    assert_true(vitb_units[0].numel > 7000000 && vitb_units[0].numel < 7200000);
    const vh_precision_policy pols[2] = {f32_policy(), amp_policy(VH_DTYPE_BF16)};
    for (int k = 0; k < 2; k++) {
        vh_sharding_memory ddp = vitb_memory("ddp", NULL, 0, 1, pols[k]);
        vh_sharding_memory one = vitb_memory("fsdp", NULL, 0, 1, pols[k]);
        const double t1 = (double)total_of(&one);
        /* One rank: what ddp holds, within the alignment padding; but the
         * 16-bit gradients of a unit live only from grads to reduce (counted
         * with the transient buffers), so under AMP fsdp holds f32 grads
         * only where ddp holds both. */
        assert_true((double)one.params >= 0.999 * (double)ddp.params &&
                    (double)one.params <= 1.001 * (double)ddp.params);
        assert_int_equal(one.masters, ddp.masters);
        assert_int_equal(one.optim_state, ddp.optim_state);
        if (k == 0) assert_true((double)one.grads >= 0.999 * (double)ddp.grads &&
                                (double)one.grads <= 1.001 * (double)ddp.grads);
        else assert_int_equal(one.grads, vitb_table.numel * 4);
        const int32_t worlds[2] = {4, 3};
        for (int w = 0; w < 2; w++) {
            const int32_t W = worlds[w];
            for (int32_t rank = 0; rank < W; rank += W - 1) {
                vh_sharding_memory m = vitb_memory("fsdp", NULL, rank, W, pols[k]);
                const double ratio = (double)total_of(&m) * W / t1;
                printf("  %s, rank %d of %d: params %lld grads %lld masters %lld state %lld "
                       "comm %lld: x%d = %.5f of one rank's\n",
                       k ? "amp bf16" : "fp32", (int)rank, (int)W, (long long)m.params,
                       (long long)m.grads, (long long)m.masters, (long long)m.optim_state,
                       (long long)m.comm_buffers, (int)W, ratio);
                assert_true(ratio > 0.995 && ratio < 1.005);
                /* The transient buffers stay a few units' worth. */
                assert_true(m.comm_buffers > 0 && m.comm_buffers < one.params);
                /* ZeRO-2 holds every gathered unit at the end of forward. */
                vh_sharding_memory z2 =
                    vitb_memory("fsdp", "reshard_after_forward: false", rank, W, pols[k]);
                assert_int_equal(total_of(&z2), total_of(&m));
                assert_true(z2.comm_buffers > m.comm_buffers);
            }
        }
    }
}

/* zero1 keeps ddp's parameters and gradients and 1/world of its optimizer
 * state and f32 masters: each unit's shard rounds up to 16 elements, so a
 * rank's state is at most 15 elements a unit and slot over ddp's / world. */
static void test_memory_zero1_vitb(void **state) {
    (void)state;
    vitb_build();
    const vh_precision_policy pols[2] = {f32_policy(), amp_policy(VH_DTYPE_BF16)};
    const int64_t slots = 2, pad = slots * VITB_UNITS * 15 * 4;
    for (int k = 0; k < 2; k++) {
        vh_sharding_memory ddp = vitb_memory("ddp", NULL, 0, 1, pols[k]);
        for (int32_t W = 2; W <= 3; W++) {
            for (int32_t rank = 0; rank < W; rank++) {
                vh_sharding_memory m = vitb_memory("zero1", NULL, rank, W, pols[k]);
                printf("  %s, rank %d of %d: params %lld grads %lld masters %lld state %lld "
                       "comm %lld; ddp's state %lld\n",
                       k ? "amp bf16" : "fp32", (int)rank, (int)W, (long long)m.params,
                       (long long)m.grads, (long long)m.masters, (long long)m.optim_state,
                       (long long)m.comm_buffers, (long long)ddp.optim_state);
                assert_int_equal(m.params, ddp.params);
                assert_int_equal(m.grads, ddp.grads);
                assert_true(m.optim_state * W >= ddp.optim_state - W * pad &&
                            m.optim_state * W <= ddp.optim_state + W * pad);
                if (W == 2) /* half of ddp's, within the padding */
                    assert_true(m.optim_state >= ddp.optim_state / 2 - pad &&
                                m.optim_state <= ddp.optim_state / 2 + pad);
                assert_true((double)m.masters * W >= 0.999 * (double)ddp.masters &&
                            (double)m.masters * W <= 1.001 * (double)ddp.masters);
                assert_true(m.comm_buffers > 0 && m.comm_buffers < ddp.params);
            }
        }
    }
}

/* ---- gathers: evaluation, ZeRO-2 and ZeRO-3 bookkeeping ------------------- */

/* A one-rank world of the thread communicator (it counts the collectives)
 * and the counting device. */
static void open_counted(fx *f, tworld *w, const char *keys, int32_t slots) {
    memset(w, 0, sizeof *w);
    w->world = 1;
    pthread_barrier_init(&w->barrier, NULL, 1);
    counting_device = *vh_cpu_device_ops();
    counting_device.alloc = counting_alloc;
    counting_device.free = counting_free;
    live_allocs = 0;
    fx_open(f, "fsdp", keys, &tworld_ops, w, 0, 1, &counting_device);
    if (fx_setup(f, &table, slots, f32_policy()) != VH_STATUS_OK)
        fail_msg("setup: %s", error_of(f));
    float v[MAX_UNIT];
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        for (int64_t i = 0; i < units[u].numel; i++) v[i] = pattern(u, i);
        assert_int_equal(f->sh->load_unit(f->self, u, v), VH_STATUS_OK);
    }
}

static void close_counted(fx *f, tworld *w) {
    fx_close(f);
    assert_int_equal(live_allocs, 0);
    pthread_barrier_destroy(&w->barrier);
}

/* One forward over every unit; checks the gathered values. */
static void forward(fx *f) {
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        const void *p = NULL;
        if (f->sh->gather(f->self, u, &p) != VH_STATUS_OK)
            fail_msg("gather(%d): %s", (int)u, error_of(f));
        vh_unit_layout l;
        assert_int_equal(vh_unit_layout_init(&l, &units[u], NULL, NULL), VH_STATUS_OK);
        for (int32_t q = 0; q < units[u].num_params; q++)
            for (int64_t i = 0; i < units[u].params[q].numel; i++)
                assert_true(((const float *)(const void *)((const char *)p + l.offsets[q]))[i] ==
                            pattern(u, units[u].params[q].offset + i));
        vh_unit_layout_free(&l);
        assert_int_equal(f->sh->release(f->self, u), VH_STATUS_OK);
    }
}

/* One backward with zero gradients (the values stay the pattern). */
static void backward(fx *f) {
    for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
        const void *p = NULL;
        void *g = NULL;
        assert_int_equal(f->sh->gather(f->self, u, &p), VH_STATUS_OK);
        assert_int_equal(f->sh->grads(f->self, u, &g), VH_STATUS_OK);
        assert_int_equal(f->sh->reduce(f->self, u), VH_STATUS_OK);
        assert_int_equal(f->sh->release(f->self, u), VH_STATUS_OK);
    }
    assert_int_equal(f->sh->wait(f->self), VH_STATUS_OK);
}

/* ZeRO-3: every forward gathers every unit (the next one prefetched), and
 * holds nothing afterwards; evaluation may repeat it. */
static void test_zero3_eval_and_step(void **state) {
    (void)state;
    fx f;
    tworld w;
    open_counted(&f, &w, NULL, 1);
    const int persistent = live_allocs;
    for (int pass = 1; pass <= 3; pass++) {
        forward(&f);
        assert_int_equal(w.calls[0][OP_GATHER], 3 * pass);
        assert_int_equal(live_allocs, persistent);
    }
    /* A step: forward and backward gather (the backward's first unit was
     * freed after its forward), one reduce-scatter a unit. */
    assert_int_equal(f.sh->zero_grads(f.self), VH_STATUS_OK);
    forward(&f);
    backward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 15);
    assert_int_equal(w.calls[0][OP_SCATTER], 3);
    assert_int_equal(w.calls[0][OP_REDUCE], 0); /* fp32: no side all-reduce */
    assert_int_equal(live_allocs, persistent);
    assert_int_equal(f.sh->refresh(f.self), VH_STATUS_OK);
    forward(&f);
    assert_int_equal(live_allocs, persistent);
    vh_sharding_memory m = {.struct_size = sizeof m};
    assert_int_equal(f.sh->memory(f.self, &m), VH_STATUS_OK);
    assert_true(m.comm_buffers > 0);
    close_counted(&f, &w);
}

/* ZeRO-2: the forward's release keeps the gathered units; later forwards
 * (evaluation) and the backward use them without communicating, and the
 * backward's release frees them. */
static void test_zero2_keeps_until_backward(void **state) {
    (void)state;
    fx f;
    tworld w;
    open_counted(&f, &w, "reshard_after_forward: false", 1);
    const int persistent = live_allocs;
    forward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 3);
    assert_int_equal(live_allocs, persistent + NUM_UNITS); /* three units held */
    forward(&f);
    forward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 3);
    assert_int_equal(f.sh->zero_grads(f.self), VH_STATUS_OK);
    forward(&f);
    backward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 3);
    assert_int_equal(w.calls[0][OP_SCATTER], 3);
    assert_int_equal(live_allocs, persistent);
    /* Held copies are stale after the optimizer: refresh drops them. */
    forward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 6);
    assert_int_equal(live_allocs, persistent + NUM_UNITS);
    assert_int_equal(f.sh->refresh(f.self), VH_STATUS_OK);
    assert_int_equal(live_allocs, persistent);
    forward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 9);
    /* load_unit drops the held copy of its unit. */
    float v[MAX_UNIT];
    for (int64_t i = 0; i < units[1].numel; i++) v[i] = pattern(1, i);
    assert_int_equal(f.sh->load_unit(f.self, 1, v), VH_STATUS_OK);
    forward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 10);
    close_counted(&f, &w);
}

/* Without prefetch one all-gather a gather, none ahead; a nested gather
 * reuses the buffer. */
static void test_no_prefetch(void **state) {
    (void)state;
    fx f;
    tworld w;
    open_counted(&f, &w, "prefetch: false", 0);
    const void *p = NULL, *q = NULL;
    assert_int_equal(f.sh->gather(f.self, 0, &p), VH_STATUS_OK);
    assert_int_equal(w.calls[0][OP_GATHER], 1);
    assert_int_equal(f.sh->gather(f.self, 0, &q), VH_STATUS_OK);
    assert_ptr_equal(p, q);
    assert_int_equal(w.calls[0][OP_GATHER], 1);
    assert_int_equal(f.sh->release(f.self, 0), VH_STATUS_OK);
    assert_int_equal(f.sh->release(f.self, 0), VH_STATUS_OK);
    forward(&f);
    assert_int_equal(w.calls[0][OP_GATHER], 4);
    close_counted(&f, &w);
}

/* ---- misuse ------------------------------------------------------------------ */

static void check_misuse(const char *plugin) {
    fx f;
    fx_open(&f, plugin, NULL, NULL, NULL, 0, 1, NULL);
    expect_error(&f, f.sh->zero_grads(f.self), VH_STATUS_ERR_INVALID_ARG, "before setup");
    assert_int_equal(fx_setup(&f, &table, 1, f32_policy()), VH_STATUS_OK);
    expect_error(&f, fx_setup(&f, &table, 1, f32_policy()), VH_STATUS_ERR_INVALID_ARG,
                 "setup called twice");
    const void *p = NULL;
    void *g = NULL;
    expect_error(&f, f.sh->gather(f.self, 3, &p), VH_STATUS_ERR_INVALID_ARG, "not in [0, 3)");
    expect_error(&f, f.sh->release(f.self, 1), VH_STATUS_ERR_INVALID_ARG, "not gathered");
    assert_int_equal(f.sh->zero_grads(f.self), VH_STATUS_OK);
    assert_int_equal(f.sh->gather(f.self, 2, &p), VH_STATUS_OK);
    expect_error(&f, f.sh->refresh(f.self), VH_STATUS_ERR_INVALID_ARG, "is gathered");
    float v[MAX_UNIT] = {0};
    expect_error(&f, f.sh->load_unit(f.self, 2, v), VH_STATUS_ERR_INVALID_ARG, "is gathered");
    assert_int_equal(f.sh->grads(f.self, 2, &g), VH_STATUS_OK);
    assert_int_equal(f.sh->reduce(f.self, 2), VH_STATUS_OK);
    expect_error(&f, f.sh->reduce(f.self, 2), VH_STATUS_ERR_INVALID_ARG, "twice in one step");
    expect_error(&f, f.sh->grads(f.self, 2, &g), VH_STATUS_ERR_INVALID_ARG,
                 "after its reduce");
    assert_int_equal(f.sh->release(f.self, 2), VH_STATUS_OK);
    expect_error(&f, f.sh->zero_grads(f.self), VH_STATUS_ERR_INVALID_ARG,
                 "1 reduction(s) not waited for");
    /* Units 0 and 1 were not reduced while 2 was; the step stays open:
     * reducing them completes it. */
    expect_error(&f, f.sh->wait(f.self), VH_STATUS_ERR_INVALID_ARG, "was not reduced");
    assert_int_equal(f.sh->reduce(f.self, 1), VH_STATUS_OK);
    assert_int_equal(f.sh->reduce(f.self, 0), VH_STATUS_OK);
    assert_int_equal(f.sh->wait(f.self), VH_STATUS_OK);
    assert_int_equal(f.sh->zero_grads(f.self), VH_STATUS_OK);
    /* A step that reduces nothing: wait reduces the grads handed out. */
    assert_int_equal(f.sh->grads(f.self, 1, &g), VH_STATUS_OK);
    ((float *)g)[0] = 2.5f;
    assert_int_equal(f.sh->wait(f.self), VH_STATUS_OK);
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.self, &sl), VH_STATUS_OK);
    int found = 0;
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        if (x->unit == 1 && x->param == 0) found = ((const float *)x->grad)[0] == 2.5f;
    }
    assert_true(found);
    /* Policies ddp refuses are refused here too. */
    fx_close(&f);
    fx_open(&f, plugin, NULL, NULL, NULL, 0, 1, NULL);
    vh_precision_policy bad = amp_policy(VH_DTYPE_F16);
    expect_error(&f, fx_setup(&f, &table, 1, bad), VH_STATUS_ERR_UNSUPPORTED,
                 "own dtype or in f32");
    bad = f32_policy();
    bad.state_dtype = VH_DTYPE_BF16;
    expect_error(&f, fx_setup(&f, &table, 1, bad), VH_STATUS_ERR_UNSUPPORTED, "state in f32");
    fx_close(&f);
}

static void test_misuse(void **state) {
    (void)state;
    for (int k = 0; k < NUM_SHARDED; k++) check_misuse(sharded[k]);
}

/* The state goes out in this rank's pieces and comes back. */
static int32_t io_pieces;
static float io_values[NUM_UNITS][8][2][MAX_UNIT];
static vh_status io_write(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                          int64_t count, vh_dtype dtype, const void *values) {
    (void)ctx;
    if (dtype != VH_DTYPE_F32) return VH_STATUS_ERR_INVALID_ARG;
    memcpy(&io_values[unit][param][slot][offset], values, (size_t)count * sizeof(float));
    io_pieces++;
    return VH_STATUS_OK;
}
static vh_status io_read(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                         int64_t count, vh_dtype dtype, void *values) {
    (void)ctx;
    if (dtype != VH_DTYPE_F32) return VH_STATUS_ERR_INVALID_ARG;
    for (int64_t i = 0; i < count; i++)
        ((float *)values)[i] = io_values[unit][param][slot][offset + i] + 1.0f;
    return VH_STATUS_OK;
}

static void check_state_io_pieces(const char *plugin) {
    fx f;
    fx_open(&f, plugin, NULL, &refusing_ops, NULL, 1, 3, NULL);
    assert_int_equal(fx_setup(&f, &table, 2, f32_policy()), VH_STATUS_OK);
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.self, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < x->count; i++)
                ((float *)x->state[k])[i] = (float)(k * 1000 + x->offset + i);
    }
    memset(io_values, 0, sizeof io_values);
    io_pieces = 0;
    vh_state_io io = {.struct_size = sizeof io, .write = io_write, .read = io_read};
    assert_int_equal(f.sh->state_save(f.self, &io), VH_STATUS_OK);
    assert_int_equal(io_pieces, 2 * sl.count);
    assert_int_equal(f.sh->state_load(f.self, &io), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < x->count; i++)
                assert_true(((float *)x->state[k])[i] == (float)(k * 1000 + x->offset + i) + 1.0f);
    }
    fx_close(&f);
}

static void test_state_io_pieces(void **state) {
    (void)state;
    for (int k = 0; k < NUM_SHARDED; k++) check_state_io_pieces(sharded[k]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world1_fp32),
        cmocka_unit_test(test_world1_amp_bf16),
        cmocka_unit_test(test_world1_fp16_no_masters),
        cmocka_unit_test(test_world3_matches_ddp),
        cmocka_unit_test(test_world3_zero2_no_prefetch),
        cmocka_unit_test(test_zero1_matches_ddp),
        cmocka_unit_test(test_slices_cover_once),
        cmocka_unit_test(test_memory_vitb),
        cmocka_unit_test(test_memory_zero1_vitb),
        cmocka_unit_test(test_zero3_eval_and_step),
        cmocka_unit_test(test_zero2_keeps_until_backward),
        cmocka_unit_test(test_no_prefetch),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_state_io_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
