/* test_ddp_buckets.c - ddp for many processes: gradient buckets, the start
 * broadcast and progress between units.
 *
 * In one process: ddp is loaded the way vithost loads it (a recipe naming it,
 * run_open_text, the build tree's plugin folder) and driven through its
 * vtable. A fake communicator of world size 2 stands in for the other rank:
 * it records every collective started (kind, buffer, count, dtype, root, the
 * reduce call it started in) and finishes it only in wait (an AVG all-reduce
 * then takes the mean with a constant peer value; a broadcast received on
 * rank 1 writes rank 0's constant), so the tests see exactly what ddp leaves
 * in flight and when. The parameter table is the test's own: 4 units, each
 * unit's buffers laid out by vh_unit_layout_init, which the test computes
 * too. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
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

/* ---- the table: 4 units, 11 parameters, 916 values ------------------------ */

#define BLOCK_PARAMS(i)                                                                    \
    {.name = "blocks." #i ".fc.weight", .ndim = 2, .shape = {16, 16},                      \
     .flags = VH_PARAM_FLAG_DECAY, .offset = 0, .numel = 256},                            \
        {.name = "blocks." #i ".norm.weight", .ndim = 1, .shape = {16},                    \
         .flags = VH_PARAM_FLAG_NORM, .init = VH_INIT_KIND_ONES, .offset = 256, .numel = 16}, \
        {.name = "blocks." #i ".norm.bias", .ndim = 1, .shape = {16},                      \
         .flags = VH_PARAM_FLAG_NORM, .offset = 272, .numel = 16}

static const vh_param_desc embed_params[] = {
    {.name = "embed.weight", .ndim = 2, .shape = {16, 16}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 256},
    {.name = "embed.bias", .ndim = 1, .shape = {16}, .flags = VH_PARAM_FLAG_BIAS,
     .offset = 256, .numel = 16},
};
static const vh_param_desc block0_params[] = {BLOCK_PARAMS(0)};
static const vh_param_desc block1_params[] = {BLOCK_PARAMS(1)};
static const vh_param_desc head_params[] = {
    {.name = "head.weight", .ndim = 2, .shape = {4, 16}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 64},
    {.name = "head.bias", .ndim = 1, .shape = {4}, .flags = VH_PARAM_FLAG_BIAS, .offset = 64,
     .numel = 4},
};
static const vh_unit_desc units[] = {
    {"embed", embed_params, 2, 272},
    {"blocks.0", block0_params, 3, 288},
    {"blocks.1", block1_params, 3, 288},
    {"head", head_params, 2, 68},
};
#define NUM_UNITS 4
#define TOTAL 916
#define MAX_UNIT 288
static const vh_param_table table = {units, NUM_UNITS, TOTAL};

/* fp32 everywhere. */
static vh_precision_policy f32_policy(void) {
    vh_precision_policy p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.param_dtype = p.compute_dtype = p.grad_dtype = VH_DTYPE_F32;
    p.comm_dtype = p.master_dtype = p.state_dtype = VH_DTYPE_F32;
    p.master_weights = 1;
    return p;
}

/* AMP-like: bf16 params and grads, the norms in f32, f32 masters; `comm` on
 * the wire (bf16: the grads' own dtype; f32: through grad32). */
static vh_precision_policy bf16_policy(vh_dtype comm) {
    vh_precision_policy p = f32_policy();
    p.param_dtype = p.compute_dtype = p.grad_dtype = VH_DTYPE_BF16;
    p.comm_dtype = comm;
    p.fp32_param_flags = VH_PARAM_FLAG_NORM;
    return p;
}

typedef struct layouts {
    vh_unit_layout unit[NUM_UNITS];
    size_t base[NUM_UNITS]; /* byte offset of each unit in the flat buffer */
    size_t bytes;
} layouts;

/* grads: 0 for the compute copies (param dtypes), 1 for the gradients. */
static void layouts_of(layouts *l, const vh_precision_policy *pol, int grads) {
    memset(l, 0, sizeof *l);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        assert_int_equal(vh_unit_layout_init(&l->unit[u], &units[u],
                                             grads ? vh_policy_grad_dtype : vh_policy_param_dtype,
                                             pol),
                         VH_STATUS_OK);
        l->base[u] = l->bytes;
        l->bytes += l->unit[u].bytes;
    }
}

static void layouts_free(layouts *l) {
    for (int32_t u = 0; u < NUM_UNITS; u++) vh_unit_layout_free(&l->unit[u]);
}

/* ---- the fake second rank ------------------------------------------------- */

enum { REC_ALL_REDUCE, REC_BROADCAST };

#define FAKE_MAX 256
typedef struct rec {
    int kind;
    void *buf;
    size_t count;
    vh_dtype dtype;
    vh_reduce_op op;
    int32_t root;
    int started_in; /* fake.phase when it started */
    int tests;      /* test calls on it */
    int waited;
} rec;

static struct {
    rec r[FAKE_MAX];
    int n, all_reduces, broadcasts;
    int order[FAKE_MAX]; /* indices into r, in the order wait finished them */
    int waits;
    int phase;        /* set by the test: the reduce call in progress */
    int done_after;   /* test says done once a request was tested this often */
    float peer;       /* the other rank's gradient value, for AVG */
    float root_value; /* rank 0's values, written by a broadcast on rank 1 */
} fake;

static vh_comm_ops fake_ops;

static vh_status fake_record(rec r, vh_comm_request **req) {
    if (fake.n == FAKE_MAX) return VH_STATUS_ERR_NOMEM;
    r.started_in = fake.phase;
    fake.r[fake.n] = r;
    *req = (vh_comm_request *)&fake.r[fake.n];
    fake.n++;
    return VH_STATUS_OK;
}

static vh_status fake_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)stream;
    assert_true(count > 0);
    fake.all_reduces++;
    return fake_record((rec){.kind = REC_ALL_REDUCE, .buf = buf, .count = count, .dtype = dtype,
                             .op = op, .root = -1},
                       req);
}

static vh_status fake_broadcast(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                int32_t root, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)stream;
    assert_true(count > 0);
    fake.broadcasts++;
    return fake_record((rec){.kind = REC_BROADCAST, .buf = buf, .count = count, .dtype = dtype,
                             .root = root},
                       req);
}

static float load_value(const void *buf, vh_dtype t, size_t i) {
    if (t == VH_DTYPE_F32) return ((const float *)buf)[i];
    if (t == VH_DTYPE_BF16) return vh_bf16_to_f32(((const uint16_t *)buf)[i]);
    return vh_f16_to_f32(((const uint16_t *)buf)[i]);
}

static void store_value(void *buf, vh_dtype t, size_t i, float x) {
    if (t == VH_DTYPE_F32) ((float *)buf)[i] = x;
    else if (t == VH_DTYPE_BF16) ((uint16_t *)buf)[i] = vh_f32_to_bf16(x);
    else ((uint16_t *)buf)[i] = vh_f32_to_f16(x);
}

static rec *fake_rec(vh_comm_request *req) {
    rec *r = (rec *)req;
    assert_true(r >= fake.r && r < fake.r + fake.n);
    return r;
}

static vh_status fake_wait(vh_comm *c, vh_comm_request *req) {
    if (!req) return VH_STATUS_OK;
    rec *r = fake_rec(req);
    assert_int_equal(r->waited, 0);
    for (size_t i = 0; i < r->count; i++) {
        if (r->kind == REC_ALL_REDUCE) {
            assert_int_equal(r->op, VH_REDUCE_OP_AVG);
            store_value(r->buf, r->dtype, i, (load_value(r->buf, r->dtype, i) + fake.peer) / 2.0f);
        } else if (c->rank != r->root) {
            store_value(r->buf, r->dtype, i, fake.root_value);
        }
    }
    r->waited = 1;
    fake.order[fake.waits++] = (int)(r - fake.r);
    return VH_STATUS_OK;
}

static vh_status fake_test(vh_comm *c, vh_comm_request *req, int *done) {
    (void)c;
    rec *r = fake_rec(req);
    assert_int_equal(r->waited, 0);
    r->tests++;
    *done = r->tests >= fake.done_after;
    return VH_STATUS_OK;
}

/* ---- the run ---------------------------------------------------------------- */

typedef struct fx {
    vh_run run;
    const vh_sharding_vtable *sh;
    void *ddp;
    vh_precision_policy policy; /* setup keeps a pointer only for the call */
} fx;

static const char *error_of(fx *f) { return f->run.hosts[VH_ROLE_SHARDING].error; }

/* Opens a run with ddp's bucket_mb; world 2 puts the fake in as rank `rank`
 * (world 1 keeps the self communicator); then sets ddp up with `pol`. */
static void fx_open(fx *f, double bucket_mb, int32_t world, int32_t rank,
                    vh_precision_policy pol) {
    memset(f, 0, sizeof *f);
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "run: {batch_size: 4}\n"
             "model: {plugin: test_model}\n"
             "precision: {plugin: test_precision}\n"
             "sharding: {plugin: ddp, bucket_mb: %.17g}\n"
             "optim: {plugin: test_optim}\n"
             "data: {plugin: test_data}\n",
             bucket_mb);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    vh_status st = run_open_text(&f->run, "ddp-buckets.yaml", recipe, &opts, &d);
    if (st != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_string_equal(f->run.plugins[VH_ROLE_SHARDING].desc->name, "ddp");
    memset(&fake, 0, sizeof fake);
    fake.done_after = INT32_MAX;
    if (world > 1) {
        fake_ops = (vh_comm_ops){.struct_size = sizeof fake_ops,
                                 .all_reduce_start = fake_all_reduce,
                                 .broadcast_start = fake_broadcast,
                                 .wait = fake_wait,
                                 .test = fake_test};
        f->run.comm.ops = &fake_ops;
        f->run.comm.world_size = world;
        f->run.comm.rank = rank;
        f->run.comm.backend = "fake";
    }
    f->sh = f->run.plugins[VH_ROLE_SHARDING].desc->vtable;
    st = f->sh->create(&f->run.hosts[VH_ROLE_SHARDING].pub, &f->ddp);
    if (st != VH_STATUS_OK) fail_msg("ddp create: %s", error_of(f));
    f->policy = pol;
    vh_sharding_setup s = {.struct_size = sizeof s, .table = &table, .policy = &f->policy,
                           .state_slots = 0};
    if (f->sh->setup(f->ddp, &s) != VH_STATUS_OK) fail_msg("ddp setup: %s", error_of(f));
}

static void fx_close(fx *f) {
    if (f->ddp) f->sh->destroy(f->ddp);
    run_close(&f->run);
}

static void ok(fx *f, vh_status st, const char *what) {
    if (st != VH_STATUS_OK) fail_msg("%s: %s", what, error_of(f));
}

static char *grads_of(fx *f, int32_t u) {
    void *g = NULL;
    ok(f, f->sh->grads(f->ddp, u, &g), "grads");
    return g;
}

static const char *gather_of(fx *f, int32_t u) {
    const void *p = NULL;
    ok(f, f->sh->gather(f->ddp, u, &p), "gather");
    ok(f, f->sh->release(f->ddp, u), "release");
    return p;
}

/* ---- (a) bucket formation ---------------------------------------------------- */

/* A bucketing case: under `pol` with `bucket_mb`, starter[u] is the unit
 * whose reduce starts unit u's collectives (its bucket's first unit), and
 * after the reduce of unit u (3, 2, 1, 0 in that order) `started[u]`
 * all-reduces have started in all. */
typedef struct bucket_case {
    double bucket_mb;
    vh_precision_policy pol;
    int32_t starter[NUM_UNITS];
    int started[NUM_UNITS];
} bucket_case;

/* Which recorded all-reduce covers bytes [lo, hi) of buffer `base`; -1 when
 * none does, and a failure when two do or one covers them only in part. */
static int covering(const char *base, size_t lo, size_t hi) {
    int found = -1;
    for (int i = 0; i < fake.n; i++) {
        const rec *r = &fake.r[i];
        if (r->kind != REC_ALL_REDUCE) continue;
        const char *b = r->buf;
        const char *e = b + r->count * vh_dtype_size(r->dtype);
        if (e <= base + lo || b >= base + hi) continue;
        if (b > base + lo || e < base + hi)
            fail_msg("collective %d covers [%zu, %zu) in part", i, lo, hi);
        if (found >= 0) fail_msg("collectives %d and %d both cover [%zu, %zu)", found, i, lo, hi);
        found = i;
    }
    return found;
}

static void check_buckets(const bucket_case *c) {
    fx f;
    fx_open(&f, c->bucket_mb, 2, 0, c->pol);
    layouts gl;
    layouts_of(&gl, &f.policy, 1);
    vh_param_slices sl;
    ok(&f, f.sh->slices(f.ddp, &sl), "slices");
    for (int step = 0; step < 2; step++) { /* the buckets start anew each step */
        ok(&f, f.sh->zero_grads(f.ddp), "zero_grads");
        fake.n = fake.all_reduces = fake.waits = 0;
        char *g0 = grads_of(&f, 0);
        for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
            assert_ptr_equal(grads_of(&f, u), g0 + gl.base[u]);
            fake.phase = u;
            ok(&f, f.sh->reduce(f.ddp, u), "reduce");
            if (fake.all_reduces != c->started[u])
                fail_msg("bucket_mb %g: %d all-reduces after the reduce of unit %d, want %d",
                         c->bucket_mb, fake.all_reduces, (int)u, c->started[u]);
        }
        assert_int_equal(fake.waits, 0); /* all in flight */
        /* Every parameter's gradient is in exactly one collective, in its
         * wire dtype, started by the reduce of its bucket's first unit; in
         * `grads` its whole span up to the next parameter (padding too). */
        for (int32_t s = 0; s < sl.count; s++) {
            const vh_param_slice *x = vh_param_slices_at(&sl, s);
            const vh_unit_layout *l = &gl.unit[x->unit];
            const vh_dtype gd = l->dtypes[x->param];
            int in_grad32 = gd != VH_DTYPE_F32 && f.policy.comm_dtype == VH_DTYPE_F32;
            int k;
            if (in_grad32) {
                /* reduced in the optimizer's f32 copy */
                k = covering((const char *)x->grad, 0, (size_t)x->count * sizeof(float));
            } else {
                size_t lo = gl.base[x->unit] + l->offsets[x->param];
                size_t hi = gl.base[x->unit] +
                            (x->param + 1 < l->num_params ? l->offsets[x->param + 1] : l->bytes);
                k = covering(g0, lo, hi);
            }
            if (k < 0) fail_msg("unit %d param %d is in no collective", (int)x->unit, (int)x->param);
            assert_int_equal(fake.r[k].dtype, in_grad32 ? VH_DTYPE_F32 : gd);
            assert_int_equal(fake.r[k].started_in, c->starter[x->unit]);
        }
        /* Without grad32 the collectives of a bucket tile its units' grads
         * from the first byte to the last. */
        if (f.policy.comm_dtype != VH_DTYPE_F32 || f.policy.grad_dtype == VH_DTYPE_F32) {
            size_t total = 0;
            for (int i = 0; i < fake.n; i++) total += fake.r[i].count * vh_dtype_size(fake.r[i].dtype);
            assert_int_equal(total, gl.bytes);
        }
        /* wait finishes them in the order they started */
        ok(&f, f.sh->wait(f.ddp), "wait");
        assert_int_equal(fake.waits, fake.n);
        for (int i = 0; i < fake.n; i++) assert_int_equal(fake.order[i], i);
    }
    layouts_free(&gl);
    fx_close(&f);
}

/* Unit sizes on the wire (layouts pad each parameter to 64 bytes):
 *   f32:  embed 1088, blocks.N 1152, head 320 bytes;
 *   bf16 (norms f32): embed 576, blocks.N 640, head 192 bytes.
 * Buckets close, from the head backwards, once they hold >= bucket_mb MiB. */
static void test_buckets_f32(void **state) {
    (void)state;
    const bucket_case cases[] = {
        /* 0: one bucket, one collective, per unit */
        {0.0, f32_policy(), {0, 1, 2, 3}, {4, 3, 2, 1}},
        /* large: the whole model in one collective, when embed is reduced */
        {1000.0, f32_policy(), {0, 0, 0, 0}, {1, 0, 0, 0}},
        /* 1048.6 bytes: head + blocks.1 (1472), blocks.0 (1152), embed */
        {0.001, f32_policy(), {0, 1, 2, 2}, {3, 2, 1, 0}},
        /* exactly 1472 bytes: head + blocks.1 hold bucket_mb, which closes
         * their bucket; blocks.0 alone does not, so embed joins it */
        {1472.0 / 1048576.0, f32_policy(), {0, 0, 2, 2}, {2, 1, 1, 0}},
        /* 2621.4 bytes: head + blocks.1 + blocks.0 (2624), embed */
        {0.0025, f32_policy(), {0, 1, 1, 1}, {2, 1, 0, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_buckets(&cases[i]);
}

/* Mixed dtypes: a collective covers one dtype run, and runs of the same
 * dtype join across unit boundaries (embed's bf16 grads and blocks.0's fc
 * weight are one run when they share a bucket). */
static void test_buckets_mixed(void **state) {
    (void)state;
    const vh_precision_policy bf16 = bf16_policy(VH_DTYPE_BF16);
    const vh_precision_policy grad32 = bf16_policy(VH_DTYPE_F32);
    const bucket_case cases[] = {
        /* per unit: head 1 run, blocks 2 each (bf16 fc, f32 norms), embed 1 */
        {0.0, bf16, {0, 1, 2, 3}, {6, 5, 3, 1}},
        /* whole model: [embed, blocks.0.fc] [norms] [blocks.1.fc] [norms] [head] */
        {1000.0, bf16, {0, 0, 0, 0}, {5, 0, 0, 0}},
        /* 1048.6 bytes: head + blocks.1 + blocks.0 (1472): 5 runs; embed: 1 */
        {0.001, bf16, {0, 1, 1, 1}, {6, 5, 0, 0}},
        /* bf16 grads on an f32 wire: through grad32, where the packed f32
         * copies of consecutive bf16 grads are one run as well */
        {1000.0, grad32, {0, 0, 0, 0}, {5, 0, 0, 0}},
        {0.0, grad32, {0, 1, 2, 3}, {6, 5, 3, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_buckets(&cases[i]);
}

/* A step that reduced some units and not others is refused, and the bucket
 * missing a unit has not started; reducing the rest completes the step. */
static void test_buckets_partial_step(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 1000.0, 2, 0, f32_policy());
    ok(&f, f.sh->zero_grads(f.ddp), "zero_grads");
    ok(&f, f.sh->reduce(f.ddp, 3), "reduce");
    ok(&f, f.sh->reduce(f.ddp, 2), "reduce");
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_ERR_INVALID_ARG);
    assert_non_null(strstr(error_of(&f), "unit 0 (embed) was not reduced"));
    assert_int_equal(fake.all_reduces, 0);
    ok(&f, f.sh->reduce(f.ddp, 1), "reduce");
    ok(&f, f.sh->reduce(f.ddp, 0), "reduce");
    assert_int_equal(fake.all_reduces, 1);
    ok(&f, f.sh->wait(f.ddp), "wait");
    assert_int_equal(fake.waits, 1);
    fx_close(&f);
}

/* bucket_mb is checked by the schema: negative is refused, naming the key. */
static void test_bucket_mb_refused(void **state) {
    (void)state;
    vh_run run;
    memset(&run, 0, sizeof run);
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    vh_status st = run_open_text(&run, "bad.yaml",
                                 "run: {batch_size: 4}\n"
                                 "model: {plugin: test_model}\n"
                                 "precision: {plugin: test_precision}\n"
                                 "sharding: {plugin: ddp, bucket_mb: -1}\n"
                                 "optim: {plugin: test_optim}\n"
                                 "data: {plugin: test_data}\n",
                                 &opts, &d);
    assert_int_not_equal(st, VH_STATUS_OK);
    if (!strstr(d.text, "bucket_mb")) fail_msg("message '%s' lacks bucket_mb", d.text);
    run_close(&run);
}

/* ---- (b) the start broadcast ------------------------------------------------ */

/* load_unit broadcasts the unit's f32 values from root 0, one collective
 * of the unit's numel, before it sets the compute copies and the separate
 * masters from them. As rank 1 it ends with rank 0's values in both. */
static void check_broadcast(vh_precision_policy pol) {
    fx f;
    fx_open(&f, 25.0, 2, 1, pol);
    layouts pl;
    layouts_of(&pl, &f.policy, 0);
    fake.root_value = -7.0f;
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float v[MAX_UNIT];
        for (int64_t i = 0; i < units[u].numel; i++) v[i] = (float)i * 0.5f + (float)u;
        fake.n = fake.broadcasts = 0;
        ok(&f, f.sh->load_unit(f.ddp, u, v), "load_unit");
        assert_int_equal(fake.all_reduces, 0);
        assert_int_equal(fake.waits, fake.n); /* load_unit returns with them finished */
        fake.waits = 0;
        assert_int_equal(fake.n, 1);
        const rec *r = &fake.r[0];
        assert_int_equal(r->kind, REC_BROADCAST);
        assert_int_equal(r->root, 0);
        assert_int_equal(r->dtype, VH_DTYPE_F32);
        assert_int_equal(r->count, units[u].numel);
        /* rank 1 now holds rank 0's values, in masters and compute copies */
        float out[MAX_UNIT];
        ok(&f, f.sh->store_unit(f.ddp, u, out), "store_unit");
        for (int64_t k = 0; k < units[u].numel; k++) assert_true(out[k] == -7.0f);
        const vh_unit_layout *l = &pl.unit[u];
        const char *pu = gather_of(&f, u);
        for (int32_t p = 0; p < l->num_params; p++)
            for (int64_t k = 0; k < units[u].params[p].numel; k++)
                assert_true(load_value(pu + l->offsets[p], l->dtypes[p], (size_t)k) == -7.0f);
    }
    layouts_free(&pl);
    fx_close(&f);
}

static void test_broadcast_f32(void **state) {
    (void)state;
    check_broadcast(f32_policy()); /* the masters are the params */
}

static void test_broadcast_masters(void **state) {
    (void)state;
    check_broadcast(bf16_policy(VH_DTYPE_BF16));
}

static void test_broadcast_no_master_weights(void **state) {
    (void)state;
    vh_precision_policy pol = bf16_policy(VH_DTYPE_BF16);
    pol.master_weights = 0; /* the bf16 compute copy is the master: no f32 masters */
    check_broadcast(pol);
}

/* Rank 0 keeps its own values; a communicator without broadcast leaves every
 * rank with the values it was given (load_unit's contract: the same). */
static void test_broadcast_root_and_none(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 25.0, 2, 0, f32_policy());
    fake.root_value = -7.0f;
    float v[MAX_UNIT], out[MAX_UNIT];
    for (int64_t i = 0; i < units[1].numel; i++) v[i] = (float)i;
    ok(&f, f.sh->load_unit(f.ddp, 1, v), "load_unit");
    assert_int_equal(fake.broadcasts, 1);
    ok(&f, f.sh->store_unit(f.ddp, 1, out), "store_unit");
    assert_memory_equal(out, v, (size_t)units[1].numel * sizeof(float));
    fake_ops.broadcast_start = NULL;
    f.run.comm.rank = 1;
    for (int64_t i = 0; i < units[1].numel; i++) v[i] = (float)i + 0.5f;
    ok(&f, f.sh->load_unit(f.ddp, 1, v), "load_unit");
    ok(&f, f.sh->store_unit(f.ddp, 1, out), "store_unit");
    assert_memory_equal(out, v, (size_t)units[1].numel * sizeof(float));
    assert_int_equal(fake.broadcasts, 1);
    fx_close(&f);
}

/* ---- (c) the same numbers whatever the buckets ------------------------------ */

/* Three steps of a toy training (grads from the params, SGD on the slices,
 * refresh) on `world` ranks; the final masters of every unit go to out. */
static void train(double bucket_mb, int32_t world, vh_precision_policy pol, float *out) {
    fx f;
    fx_open(&f, bucket_mb, world, 0, pol);
    fake.peer = 0.25f;
    layouts pl, gl;
    layouts_of(&pl, &f.policy, 0);
    layouts_of(&gl, &f.policy, 1);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float v[MAX_UNIT];
        for (int64_t i = 0; i < units[u].numel; i++)
            v[i] = (float)((i * 37 + u * 11) % 101) / 101.0f - 0.5f;
        ok(&f, f.sh->load_unit(f.ddp, u, v), "load_unit");
    }
    vh_param_slices sl;
    ok(&f, f.sh->slices(f.ddp, &sl), "slices");
    for (int step = 0; step < 3; step++) {
        ok(&f, f.sh->zero_grads(f.ddp), "zero_grads");
        for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
            const void *p = NULL;
            ok(&f, f.sh->gather(f.ddp, u, &p), "gather");
            char *g = grads_of(&f, u);
            for (int32_t q = 0; q < units[u].num_params; q++) {
                const char *pq = (const char *)p + pl.unit[u].offsets[q];
                char *gq = g + gl.unit[u].offsets[q];
                for (int64_t i = 0; i < units[u].params[q].numel; i++) {
                    float x = load_value(pq, pl.unit[u].dtypes[q], (size_t)i);
                    store_value(gq, gl.unit[u].dtypes[q], (size_t)i,
                                x * 0.5f + 0.01f * (float)(step + 1) + 1e-3f * (float)i);
                }
            }
            ok(&f, f.sh->release(f.ddp, u), "release");
            ok(&f, f.sh->reduce(f.ddp, u), "reduce");
        }
        ok(&f, f.sh->wait(f.ddp), "wait");
        for (int32_t s = 0; s < sl.count; s++) {
            const vh_param_slice *x = vh_param_slices_at(&sl, s);
            assert_int_equal(x->grad_dtype, VH_DTYPE_F32);
            for (int64_t i = 0; i < x->count; i++) {
                float m = load_value(x->master, x->master_dtype, (size_t)i);
                store_value(x->master, x->master_dtype, (size_t)i,
                            m - 0.1f * ((const float *)x->grad)[i]);
            }
        }
        ok(&f, f.sh->refresh(f.ddp), "refresh");
    }
    float *at = out;
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        ok(&f, f.sh->store_unit(f.ddp, u, at), "store_unit");
        at += units[u].numel;
    }
    layouts_free(&pl);
    layouts_free(&gl);
    fx_close(&f);
}

static void check_same_numbers(int32_t world, vh_precision_policy pol) {
    float per_unit[TOTAL], bucketed[TOTAL], some[TOTAL];
    train(0.0, world, pol, per_unit);
    train(25.0, world, pol, bucketed);
    train(0.001, world, pol, some);
    assert_memory_equal(per_unit, bucketed, sizeof per_unit);
    assert_memory_equal(per_unit, some, sizeof per_unit);
    /* and the training did something */
    float first[TOTAL];
    memcpy(first, per_unit, sizeof first);
    int moved = 0;
    for (int i = 0; i < TOTAL; i++) moved += isfinite(first[i]) && first[i] != 0.0f;
    assert_true(moved > TOTAL / 2);
}

static void test_same_numbers_self(void **state) {
    (void)state;
    check_same_numbers(1, f32_policy());
    check_same_numbers(1, bf16_policy(VH_DTYPE_F32));
    check_same_numbers(1, bf16_policy(VH_DTYPE_BF16));
}

/* With a second rank (the fake's mean with a constant) too. */
static void test_same_numbers_two_ranks(void **state) {
    (void)state;
    check_same_numbers(2, f32_policy());
    check_same_numbers(2, bf16_policy(VH_DTYPE_F32));
    check_same_numbers(2, bf16_policy(VH_DTYPE_BF16));
}

/* ---- (d) progress between units ---------------------------------------------- */

/* Every hook tests each request in flight once; a request that said it has
 * finished is not asked again (it is still waited for, in start order). */
static void test_progress(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0.0, 2, 0, f32_policy()); /* one collective per unit */
    fake.done_after = 5;
    ok(&f, f.sh->zero_grads(f.ddp), "zero_grads");
    (void)grads_of(&f, 3);
    ok(&f, f.sh->reduce(f.ddp, 3), "reduce");
    assert_int_equal(fake.n, 1);
    assert_int_equal(fake.r[0].tests, 0); /* nothing was in flight before it */
    const void *p = NULL;
    ok(&f, f.sh->gather(f.ddp, 2, &p), "gather");
    assert_int_equal(fake.r[0].tests, 1);
    (void)grads_of(&f, 2);
    assert_int_equal(fake.r[0].tests, 2);
    ok(&f, f.sh->release(f.ddp, 2), "release");
    assert_int_equal(fake.r[0].tests, 3);
    ok(&f, f.sh->reduce(f.ddp, 2), "reduce");
    assert_int_equal(fake.r[0].tests, 4); /* before the next one starts */
    assert_int_equal(fake.n, 2);
    assert_int_equal(fake.r[1].tests, 0);
    ok(&f, f.sh->gather(f.ddp, 1, &p), "gather");
    assert_int_equal(fake.r[0].tests, 5); /* done now */
    assert_int_equal(fake.r[1].tests, 1);
    ok(&f, f.sh->release(f.ddp, 1), "release");
    assert_int_equal(fake.r[0].tests, 5); /* not asked again */
    assert_int_equal(fake.r[1].tests, 2);
    ok(&f, f.sh->reduce(f.ddp, 1), "reduce");
    ok(&f, f.sh->reduce(f.ddp, 0), "reduce");
    assert_int_equal(fake.r[0].tests, 5);
    assert_int_equal(fake.r[1].tests, 4);
    assert_int_equal(fake.r[2].tests, 1);
    assert_int_equal(fake.r[3].tests, 0);
    assert_int_equal(fake.waits, 0);
    ok(&f, f.sh->wait(f.ddp), "wait");
    assert_int_equal(fake.waits, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(fake.order[i], i);
    /* Nothing in flight: the next step's hooks test nothing. */
    ok(&f, f.sh->zero_grads(f.ddp), "zero_grads");
    ok(&f, f.sh->gather(f.ddp, 3, &p), "gather");
    ok(&f, f.sh->release(f.ddp, 3), "release");
    for (int i = 0; i < 4; i++) assert_true(fake.r[i].tests <= 5);
    fx_close(&f);
}

/* A backend without test (every collective finishing on its own) is fine. */
static void test_progress_without_test(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0.0, 2, 0, f32_policy());
    fake_ops.test = NULL;
    ok(&f, f.sh->zero_grads(f.ddp), "zero_grads");
    for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
        (void)gather_of(&f, u);
        ok(&f, f.sh->reduce(f.ddp, u), "reduce");
    }
    ok(&f, f.sh->wait(f.ddp), "wait");
    assert_int_equal(fake.waits, 4);
    fx_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_f32),
        cmocka_unit_test(test_buckets_mixed),
        cmocka_unit_test(test_buckets_partial_step),
        cmocka_unit_test(test_bucket_mb_refused),
        cmocka_unit_test(test_broadcast_f32),
        cmocka_unit_test(test_broadcast_masters),
        cmocka_unit_test(test_broadcast_no_master_weights),
        cmocka_unit_test(test_broadcast_root_and_none),
        cmocka_unit_test(test_same_numbers_self),
        cmocka_unit_test(test_same_numbers_two_ranks),
        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_progress_without_test),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
