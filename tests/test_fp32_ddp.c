/* test_fp32_ddp.c - the fp32 precision and ddp sharding plugins.
 *
 * Both are loaded the way vithost loads them (a recipe naming them, run_open,
 * the build tree's plugin folder) and driven through their vtables with the
 * hosts the run built. The parameter table is the test's own, so every
 * offset is known; the unit buffers follow vh_unit_layout_init, which the
 * test computes too. A fake communicator stands in for a second rank where
 * the world-size path needs one; its collectives finish only in `wait`, so
 * the tests see what a plugin leaves in flight. The last test trains with
 * `vithost run` and compares the losses with those of the test plugins. */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime.h"
#include "vithost/vh_runtime.h"

/* ---- the test's parameter table: 3 units, 7 parameters, 58 values ------- */

static const vh_param_desc embed_params[] = {
    {.name = "embed.weight", .ndim = 2, .shape = {4, 3}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 12},
    {.name = "embed.bias", .ndim = 1, .shape = {4}, .flags = VH_PARAM_FLAG_BIAS, .offset = 12,
     .numel = 4},
};
static const vh_param_desc block_params[] = {
    {.name = "blocks.0.fc.weight", .ndim = 2, .shape = {5, 4}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 20},
    {.name = "blocks.0.norm.weight", .ndim = 1, .shape = {5}, .flags = VH_PARAM_FLAG_NORM,
     .init = VH_INIT_KIND_ONES, .offset = 20, .numel = 5},
    {.name = "blocks.0.norm.bias", .ndim = 1, .shape = {5}, .flags = VH_PARAM_FLAG_NORM,
     .offset = 25, .numel = 5},
};
static const vh_param_desc head_params[] = {
    {.name = "head.weight", .ndim = 2, .shape = {2, 5}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 10},
    {.name = "head.bias", .ndim = 1, .shape = {2}, .flags = VH_PARAM_FLAG_BIAS, .offset = 10,
     .numel = 2},
};
static const vh_unit_desc units[] = {
    {"embed", embed_params, 2, 16},
    {"blocks.0", block_params, 3, 30},
    {"head", head_params, 2, 12},
};
static const vh_param_table table = {units, 3, 58};
#define NUM_UNITS 3
#define NUM_PARAMS 7
#define TOTAL 58

static int64_t unit_offset(int32_t u) {
    int64_t off = 0;
    for (int32_t i = 0; i < u; i++) off += units[i].numel;
    return off;
}

/* A value no two places share: unit u, element i. */
static float pattern(int32_t u, int64_t i) { return (float)(u + 1) * 1000.0f + (float)i * 0.25f; }

static vh_precision_policy f32_policy(void) {
    vh_precision_policy p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.param_dtype = p.compute_dtype = p.grad_dtype = VH_DTYPE_F32;
    p.comm_dtype = p.master_dtype = p.state_dtype = VH_DTYPE_F32;
    p.master_weights = 1;
    return p;
}

/* ---- layouts, as the plugin computes them ----------------------------------- */

typedef struct layouts {
    vh_unit_layout unit[NUM_UNITS];
    size_t base[NUM_UNITS]; /* byte offset of each unit in the flat buffer */
    size_t bytes;           /* the flat buffer */
} layouts;

/* grads: 0 for the compute copies (param dtypes), 1 for the gradients. */
static void layouts_of(layouts *l, const vh_unit_desc *us, int32_t n,
                       const vh_precision_policy *pol, int grads) {
    memset(l, 0, sizeof *l);
    for (int32_t u = 0; u < n; u++) {
        assert_int_equal(vh_unit_layout_init(&l->unit[u], &us[u],
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

/* Byte offset of element i of unit u (the table's numbering) in a unit buffer. */
static size_t elem_at(const vh_unit_layout *l, const vh_unit_desc *ud, int64_t i) {
    for (int32_t p = 0; p < ud->num_params; p++) {
        const vh_param_desc *pd = &ud->params[p];
        if (i < pd->offset + pd->numel)
            return l->offsets[p] + (size_t)(i - pd->offset) * vh_dtype_size(l->dtypes[p]);
    }
    fail_msg("element %lld is past unit %s", (long long)i, ud->name);
    return 0;
}

/* ---- a fake second rank --------------------------------------------------- */

/* Collectives are kept as requests and done in wait: AVG takes the mean
 * with the peer's values (every element fake.peer_grad, f32 or bf16), MAX
 * the peer's flag (f32). Calls, requests in flight and the last count and
 * dtype are recorded. */
#define FAKE_MAX_REQUESTS 16
typedef struct fake_request {
    void *buf;
    size_t count;
    vh_dtype dtype;
    vh_reduce_op op;
    int used;
} fake_request;

static struct {
    float peer_grad, peer_flag;
    int avgs, flags, waits; /* flags: SUMs of the overflow flag */
    int in_flight;
    size_t last_count;
    vh_dtype last_dtype;
    fake_request req[FAKE_MAX_REQUESTS];
} fake;

static vh_status fake_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)stream;
    if (dtype != VH_DTYPE_F32 && dtype != VH_DTYPE_BF16) return VH_STATUS_ERR_UNSUPPORTED;
    if (op == VH_REDUCE_OP_AVG) fake.avgs++;
    else if (op == VH_REDUCE_OP_SUM && dtype == VH_DTYPE_F32) fake.flags++;
    else return VH_STATUS_ERR_UNSUPPORTED;
    fake.last_count = count;
    fake.last_dtype = dtype;
    for (int i = 0; i < FAKE_MAX_REQUESTS; i++) {
        if (fake.req[i].used) continue;
        fake.req[i] = (fake_request){buf, count, dtype, op, 1};
        fake.in_flight++;
        *req = (vh_comm_request *)&fake.req[i];
        return VH_STATUS_OK;
    }
    return VH_STATUS_ERR_NOMEM;
}

static vh_status fake_wait(vh_comm *c, vh_comm_request *req) {
    (void)c;
    if (!req) return VH_STATUS_OK;
    fake_request *r = (fake_request *)req;
    assert_true(r >= fake.req && r < fake.req + FAKE_MAX_REQUESTS && r->used);
    for (size_t i = 0; i < r->count; i++) {
        float x = r->dtype == VH_DTYPE_F32 ? ((float *)r->buf)[i]
                                           : vh_bf16_to_f32(((uint16_t *)r->buf)[i]);
        x = r->op == VH_REDUCE_OP_AVG ? (x + fake.peer_grad) / 2.0f : x + fake.peer_flag;
        if (r->dtype == VH_DTYPE_F32) ((float *)r->buf)[i] = x;
        else ((uint16_t *)r->buf)[i] = vh_f32_to_bf16(x);
    }
    r->used = 0;
    fake.in_flight--;
    fake.waits++;
    return VH_STATUS_OK;
}

static vh_status fake_test(vh_comm *c, vh_comm_request *req, int *done) {
    (void)c, (void)req;
    *done = 0;
    return VH_STATUS_OK;
}

static vh_comm_ops fake_ops;

/* ---- the run: fp32 and ddp, test plugins for the other roles -------------- */

typedef struct fx {
    vh_run run;
    const vh_sharding_vtable *sh;
    const vh_precision_vtable *pr;
    void *ddp, *fp32;
    vh_precision_policy policy; /* the last setup's: setup keeps a pointer only for the call */
} fx;

static vh_host *host_of(fx *f, vh_role role) { return &f->run.hosts[role].pub; }
static const char *error_of(fx *f, vh_role role) { return f->run.hosts[role].error; }

/* The CPU's ops under another kind and name: the plugins must then treat the
 * buffers as device memory they reach only through the device's ops. */
static vh_device_ops other_device;

/* Opens the run; precision_keys go into the precision section. world > 1
 * replaces the communicator with the fake second rank; other_kind the
 * device with other_device. */
static void fx_open_on(fx *f, const char *precision_keys, int32_t world, int other_kind) {
    memset(f, 0, sizeof *f);
    char recipe[1024];
    snprintf(recipe, sizeof recipe,
             "run: {batch_size: 4}\n"
             "model: {plugin: test_model}\n"
             "precision: {plugin: fp32%s%s}\n"
             "sharding: {plugin: ddp, bucket_mb: 0}\n"
             "optim: {plugin: test_optim}\n"
             "data: {plugin: test_data}\n",
             precision_keys ? ", " : "", precision_keys ? precision_keys : "");
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    vh_status st = run_open_text(&f->run, "fp32-ddp.yaml", recipe, &opts, &d);
    if (st != VH_STATUS_OK) fail_msg("%s", d.text);
    assert_string_equal(f->run.plugins[VH_ROLE_SHARDING].desc->name, "ddp");
    assert_string_equal(f->run.plugins[VH_ROLE_PRECISION].desc->name, "fp32");
    if (world > 1) {
        memset(&fake, 0, sizeof fake);
        fake_ops = (vh_comm_ops){.struct_size = sizeof fake_ops,
                                 .all_reduce_start = fake_all_reduce,
                                 .wait = fake_wait,
                                 .test = fake_test};
        f->run.comm.ops = &fake_ops;
        f->run.comm.world_size = world;
        f->run.comm.backend = "fake";
    }
    if (other_kind) {
        other_device = *vh_cpu_device_ops();
        other_device.kind = VH_DEVICE_KIND_CUDA;
        other_device.name = "cpu-as-cuda";
        f->run.device = &other_device;
    }
    f->sh = f->run.plugins[VH_ROLE_SHARDING].desc->vtable;
    f->pr = f->run.plugins[VH_ROLE_PRECISION].desc->vtable;
    st = f->pr->create(host_of(f, VH_ROLE_PRECISION), &f->fp32);
    if (st != VH_STATUS_OK) fail_msg("fp32 create: %s", error_of(f, VH_ROLE_PRECISION));
    st = f->sh->create(host_of(f, VH_ROLE_SHARDING), &f->ddp);
    if (st != VH_STATUS_OK) fail_msg("ddp create: %s", error_of(f, VH_ROLE_SHARDING));
}

static void fx_open_with(fx *f, const char *precision_keys, int32_t world) {
    fx_open_on(f, precision_keys, world, 0);
}

static vh_status fx_setup_table(fx *f, const vh_param_table *t, int32_t slots,
                                vh_precision_policy policy) {
    f->policy = policy;
    vh_sharding_setup s = {.struct_size = sizeof s, .table = t, .policy = &f->policy,
                           .state_slots = slots};
    return f->sh->setup(f->ddp, &s);
}

static vh_status fx_setup_policy(fx *f, int32_t slots, vh_precision_policy policy) {
    return fx_setup_table(f, &table, slots, policy);
}

/* Opens a one-rank run and sets ddp up with fp32's own policy. */
static void fx_open(fx *f, int32_t slots) {
    fx_open_with(f, NULL, 1);
    vh_precision_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.struct_size = sizeof pol;
    assert_int_equal(f->pr->policy(f->fp32, &pol), VH_STATUS_OK);
    if (fx_setup_policy(f, slots, pol) != VH_STATUS_OK)
        fail_msg("ddp setup: %s", error_of(f, VH_ROLE_SHARDING));
}

static void fx_close(fx *f) {
    if (f->ddp) f->sh->destroy(f->ddp);
    if (f->fp32) f->pr->destroy(f->fp32);
    run_close(&f->run);
}

static void expect_error(fx *f, vh_role role, vh_status got, vh_status want, const char *part) {
    assert_int_equal(got, want);
    const char *msg = error_of(f, role);
    if (!strstr(msg, part)) fail_msg("message '%s' lacks '%s'", msg, part);
}

static char *grads_of(fx *f, int32_t u) {
    void *g = NULL;
    if (f->sh->grads(f->ddp, u, &g) != VH_STATUS_OK)
        fail_msg("grads(%d): %s", (int)u, error_of(f, VH_ROLE_SHARDING));
    return g;
}

static const char *gather_of(fx *f, int32_t u) {
    const void *p = NULL;
    if (f->sh->gather(f->ddp, u, &p) != VH_STATUS_OK)
        fail_msg("gather(%d): %s", (int)u, error_of(f, VH_ROLE_SHARDING));
    assert_int_equal(f->sh->release(f->ddp, u), VH_STATUS_OK);
    return p;
}

/* f32 element i of unit u (the table's numbering) in a buffer of layout l. */
static float *f32_elem(void *unit_buf, const vh_unit_layout *l, int32_t u, int64_t i) {
    return (float *)(void *)((char *)unit_buf + elem_at(l, &units[u], i));
}

static void load_pattern(fx *f) {
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float v[64];
        for (int64_t i = 0; i < units[u].numel; i++) v[i] = pattern(u, i);
        assert_int_equal(f->sh->load_unit(f->ddp, u, v), VH_STATUS_OK);
    }
}

/* ---- ddp ---------------------------------------------------------------- */

/* One flat buffer each for params and grads, unit after unit, each unit laid
 * out by vh_unit_layout_init (parameters at 64-byte aligned offsets, the
 * padding zero); load_unit lands there and store_unit reads it back as the
 * parameters end to end. */
static void test_ddp_layout(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    layouts pl;
    layouts_of(&pl, units, NUM_UNITS, &f.policy, 0);
    for (int32_t u = 0; u < NUM_UNITS; u++)
        for (int32_t p = 0; p < units[u].num_params; p++)
            assert_int_equal(pl.unit[u].offsets[p] % VH_UNIT_ALIGN, 0);
    /* embed.weight's 12 floats (48 bytes) pad to 64: the bias starts there */
    assert_int_equal(pl.unit[0].offsets[1], 64);
    load_pattern(&f);
    const char *p0 = gather_of(&f, 0);
    char *g0 = grads_of(&f, 0);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        const char *p = gather_of(&f, u);
        assert_ptr_equal(p, p0 + pl.base[u]);
        assert_ptr_equal(grads_of(&f, u), g0 + pl.base[u]); /* grads: the same layout in f32 */
        for (int64_t i = 0; i < units[u].numel; i++)
            assert_true(*f32_elem((void *)p, &pl.unit[u], u, i) == pattern(u, i));
        float out[64];
        memset(out, 0, sizeof out);
        assert_int_equal(f.sh->store_unit(f.ddp, u, out), VH_STATUS_OK);
        for (int64_t i = 0; i < units[u].numel; i++) assert_true(out[i] == pattern(u, i));
    }
    /* The padding stays zero. */
    const float *pad = (const float *)(const void *)(p0 + pl.base[0] + 48);
    for (int i = 0; i < 4; i++) assert_true(pad[i] == 0.0f);
    /* load_unit of one unit leaves its neighbours alone. */
    float ones[30];
    for (int i = 0; i < 30; i++) ones[i] = 1.0f;
    assert_int_equal(f.sh->load_unit(f.ddp, 1, ones), VH_STATUS_OK);
    assert_true(*f32_elem((void *)gather_of(&f, 0), &pl.unit[0], 0, 15) == pattern(0, 15));
    assert_true(*f32_elem((void *)gather_of(&f, 1), &pl.unit[1], 1, 29) == 1.0f);
    assert_true(*f32_elem((void *)gather_of(&f, 2), &pl.unit[2], 2, 0) == pattern(2, 0));
    /* Under fp32 there is nothing to refresh. */
    assert_int_equal(f.sh->refresh(f.ddp), VH_STATUS_OK);
    assert_true(*f32_elem((void *)gather_of(&f, 1), &pl.unit[1], 1, 0) == 1.0f);
    layouts_free(&pl);
    fx_close(&f);
}

/* Grads start at zero and zero_grads clears all of them, padding included. */
static void test_ddp_zero_grads(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    layouts gl;
    layouts_of(&gl, units, NUM_UNITS, &f.policy, 1);
    const float *g0 = (const float *)(const void *)grads_of(&f, 0);
    const size_t n = gl.bytes / sizeof(float);
    for (size_t i = 0; i < n; i++) assert_true(g0[i] == 0.0f);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float *g = (float *)(void *)grads_of(&f, u);
        for (size_t i = 0; i < gl.unit[u].bytes / sizeof(float); i++) g[i] = pattern(u, (int64_t)i);
    }
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    for (size_t i = 0; i < n; i++) assert_true(g0[i] == 0.0f);
    layouts_free(&gl);
    fx_close(&f);
}

/* On one rank the all-reduce is the identity. */
static void test_ddp_reduce_world1(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    layouts gl;
    layouts_of(&gl, units, NUM_UNITS, &f.policy, 1);
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
        char *g = grads_of(&f, u);
        for (int64_t i = 0; i < units[u].numel; i++)
            *f32_elem(g, &gl.unit[u], u, i) = -pattern(u, i);
        assert_int_equal(f.sh->reduce(f.ddp, u), VH_STATUS_OK);
    }
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    /* grads() after reduce is refused; read them through the slices. */
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        int64_t first = units[x->unit].params[x->param].offset;
        assert_int_equal(x->grad_dtype, VH_DTYPE_F32);
        for (int64_t i = 0; i < x->count; i++)
            assert_true(((const float *)x->grad)[i] == -pattern(x->unit, first + i));
    }
    /* The next step may reduce again. */
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    assert_int_equal(f.sh->reduce(f.ddp, 2), VH_STATUS_OK);
    layouts_free(&gl);
    fx_close(&f);
}

/* Two ranks (the second faked): reduce only STARTS each unit's all-reduce
 * (AVG, one request per unit under fp32, over the unit's whole grad buffer)
 * and keeps the request; wait finishes them all, after which every element
 * of every unit is the mean of both ranks' values, including a unit of many
 * thousand elements. */
static const vh_param_desc big_params[] = {
    {.name = "big.weight", .ndim = 2, .shape = {100, 100}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 10000},
    {.name = "big.bias", .ndim = 1, .shape = {100}, .offset = 10000, .numel = 100},
};
static const vh_unit_desc big_units[] = {
    {"embed", embed_params, 2, 16},
    {"big", big_params, 2, 10100},
};
static const vh_param_table big_table = {big_units, 2, 10116};

static void test_ddp_reduce_averages(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 2);
    assert_int_equal(fx_setup_table(&f, &big_table, 0, f32_policy()), VH_STATUS_OK);
    layouts gl;
    layouts_of(&gl, big_units, 2, &f.policy, 1);
    fake.peer_grad = 3.0f;
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    char *g[2] = {grads_of(&f, 0), grads_of(&f, 1)};
    for (int32_t u = 1; u >= 0; u--) {
        for (int64_t i = 0; i < big_units[u].numel; i++)
            *(float *)(void *)(g[u] + elem_at(&gl.unit[u], &big_units[u], i)) = pattern(u, i);
        int before = fake.avgs;
        assert_int_equal(f.sh->reduce(f.ddp, u), VH_STATUS_OK);
        assert_int_equal(fake.avgs, before + 1);
        assert_int_equal(fake.last_count, gl.unit[u].bytes / sizeof(float));
        assert_int_equal(fake.last_dtype, VH_DTYPE_F32);
    }
    /* Both requests are in flight and nothing is averaged yet. */
    assert_int_equal(fake.in_flight, 2);
    assert_int_equal(fake.waits, 0);
    assert_true(*(float *)(void *)g[0] == pattern(0, 0));
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    assert_int_equal(fake.in_flight, 0);
    assert_int_equal(fake.waits, 2);
    for (int32_t u = 0; u < 2; u++)
        for (int64_t i = 0; i < big_units[u].numel; i++)
            assert_true(*(float *)(void *)(g[u] + elem_at(&gl.unit[u], &big_units[u], i)) ==
                        (pattern(u, i) + 3.0f) / 2.0f);
    /* A second wait has nothing left to finish. */
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    assert_int_equal(fake.waits, 2);
    layouts_free(&gl);
    fx_close(&f);
}

/* With the self backend a started reduction has finished already: reduce
 * leaves a request, wait completes it (zero_grads before wait is refused). */
static void test_ddp_reduce_leaves_request(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    for (int32_t u = NUM_UNITS - 1; u >= 0; u--)
        assert_int_equal(f.sh->reduce(f.ddp, u), VH_STATUS_OK);
    expect_error(&f, VH_ROLE_SHARDING, f.sh->zero_grads(f.ddp), VH_STATUS_ERR_INVALID_ARG,
                 "3 reduction(s) not waited for");
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    fx_close(&f);
}

/* One slice per parameter, each exactly once, with the table's flags and
 * pointers into the flat buffers: under fp32 the master is the compute copy
 * and the grad the grad buffer, at the layout's offsets; the state slots are
 * the parameters end to end, at unit offset + parameter offset. */
static void test_ddp_slices(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 2);
    layouts pl;
    layouts_of(&pl, units, NUM_UNITS, &f.policy, 0);
    load_pattern(&f);
    vh_param_slices sl = {.items = NULL, .count = -1, .item_size = 0};
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    assert_int_equal(sl.count, NUM_PARAMS);
    assert_true(sl.item_size >= sizeof(vh_param_slice));
    assert_int_equal(sl.replicated, 1); /* full replicas: sums over slices are local */
    const char *p0 = gather_of(&f, 0);
    const char *g0 = grads_of(&f, 0);
    const float *s0 = NULL, *s1 = NULL;
    int seen[NUM_UNITS][4] = {{0}};
    int64_t covered = 0;
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        assert_in_range(x->unit, 0, NUM_UNITS - 1);
        assert_in_range(x->param, 0, units[x->unit].num_params - 1);
        const vh_param_desc *pd = &units[x->unit].params[x->param];
        seen[x->unit][x->param]++;
        size_t at = pl.base[x->unit] + pl.unit[x->unit].offsets[x->param];
        int64_t st_at = unit_offset(x->unit) + pd->offset;
        assert_int_equal(x->offset, 0);
        assert_int_equal(x->count, pd->numel);
        assert_int_equal(x->flags, pd->flags);
        assert_int_equal(x->master_dtype, VH_DTYPE_F32);
        assert_int_equal(x->grad_dtype, VH_DTYPE_F32);
        assert_int_equal(x->state_dtype, VH_DTYPE_F32);
        assert_ptr_equal(x->master, p0 + at); /* fp32: the master is the param */
        assert_ptr_equal(x->grad, g0 + at);   /* and the grad layout is the same */
        assert_true(((const float *)x->master)[0] == pattern(x->unit, pd->offset));
        if (!s0) {
            s0 = (const float *)x->state[0] - st_at;
            s1 = (const float *)x->state[1] - st_at;
        }
        assert_ptr_equal(x->state[0], s0 + st_at);
        assert_ptr_equal(x->state[1], s1 + st_at);
        assert_null(x->state[2]);
        assert_null(x->state[3]);
        covered += x->count;
    }
    for (int32_t u = 0; u < NUM_UNITS; u++)
        for (int32_t p = 0; p < units[u].num_params; p++) assert_int_equal(seen[u][p], 1);
    assert_int_equal(covered, TOTAL);
    /* The list is the same on every call. */
    vh_param_slices again;
    assert_int_equal(f.sh->slices(f.ddp, &again), VH_STATUS_OK);
    assert_ptr_equal(again.items, sl.items);
    layouts_free(&pl);
    fx_close(&f);
}

/* state_slots buffers: allocated, zeroed, distinct from each other and from
 * params and grads; none without slots. */
static void test_ddp_state_slots(void **state) {
    (void)state;
    fx f;
    fx_open(&f, VH_OPTIM_MAX_STATE_SLOTS);
    layouts pl;
    layouts_of(&pl, units, NUM_UNITS, &f.policy, 0);
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    const vh_param_slice *first = vh_param_slices_at(&sl, 0);
    enum { NB = VH_OPTIM_MAX_STATE_SLOTS + 2 };
    const char *bases[NB] = {first->master, first->grad};
    size_t sizes[NB] = {pl.bytes, pl.bytes};
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) {
        const float *s = first->state[k];
        assert_non_null(s);
        for (int64_t i = 0; i < TOTAL; i++) assert_true(s[i] == 0.0f);
        bases[k + 2] = (const char *)s;
        sizes[k + 2] = TOTAL * sizeof(float);
    }
    /* No two buffers overlap. */
    for (int a = 0; a < NB; a++)
        for (int b = a + 1; b < NB; b++)
            assert_true(bases[a] + sizes[a] <= bases[b] || bases[b] + sizes[b] <= bases[a]);
    layouts_free(&pl);
    fx_close(&f);

    fx_open(&f, 0);
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++)
        for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++)
            assert_null(vh_param_slices_at(&sl, s)->state[k]);
    fx_close(&f);
}

/* bf16 parameters: separate f32 masters, gather hands out bf16 values at the
 * bf16 layout's offsets, store_unit the unrounded masters, refresh converts
 * the masters again. Parameters the policy keeps in f32 (fp32_param_flags:
 * the norms here) are their own masters. */
static void test_ddp_half_params(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_precision_policy pol = f32_policy();
    pol.param_dtype = VH_DTYPE_BF16;
    pol.fp32_param_flags = VH_PARAM_FLAG_NORM;
    assert_int_equal(fx_setup_policy(&f, 1, pol), VH_STATUS_OK);
    layouts pl;
    layouts_of(&pl, units, NUM_UNITS, &pol, 0);
    assert_int_equal(pl.unit[1].dtypes[0], VH_DTYPE_BF16);
    assert_int_equal(pl.unit[1].dtypes[1], VH_DTYPE_F32); /* norm.weight */
    float v[30];
    for (int i = 0; i < 30; i++) v[i] = 1.0f + (float)i / 3.0f;
    assert_int_equal(f.sh->load_unit(f.ddp, 1, v), VH_STATUS_OK);
    const char *p = gather_of(&f, 1);
    assert_ptr_equal(p, gather_of(&f, 0) + pl.base[1]);
    const uint16_t *w = (const uint16_t *)(const void *)p; /* fc.weight, 20 bf16 */
    const float *nw = (const float *)(const void *)(p + pl.unit[1].offsets[1]);
    for (int i = 0; i < 20; i++) assert_int_equal(w[i], vh_f32_to_bf16(v[i]));
    for (int i = 0; i < 5; i++) assert_true(nw[i] == v[20 + i]);
    float out[30];
    assert_int_equal(f.sh->store_unit(f.ddp, 1, out), VH_STATUS_OK);
    assert_memory_equal(out, v, sizeof v);

    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        vh_param_slice *x = vh_param_slices_at(&sl, s);
        assert_int_equal(x->master_dtype, VH_DTYPE_F32);
        if (x->unit == 1 && x->param == 0) {
            assert_ptr_not_equal(x->master, (const void *)w);
            ((float *)x->master)[5] = 42.5f; /* the optimizer's step */
        }
        if (x->unit == 1 && x->param == 1) assert_ptr_equal(x->master, (const void *)nw);
    }
    assert_int_equal(w[5], vh_f32_to_bf16(v[5]));
    assert_int_equal(f.sh->refresh(f.ddp), VH_STATUS_OK);
    assert_int_equal(w[5], vh_f32_to_bf16(42.5f));
    assert_int_equal(w[4], vh_f32_to_bf16(v[4]));
    /* Memory: bf16 compute copies, f32 masters for the bf16 ones only. */
    vh_sharding_memory m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    assert_int_equal(f.sh->memory(f.ddp, &m), VH_STATUS_OK);
    assert_int_equal(m.params, (int64_t)pl.bytes);
    assert_int_equal(m.masters, (int64_t)(TOTAL - 10) * 4);
    assert_int_equal(m.optim_state, (int64_t)TOTAL * 4);
    layouts_free(&pl);
    fx_close(&f);
}

/* Without master weights (full fp16) the optimizer updates the 16-bit
 * compute copy itself: the slices say so, load/store go through f32. */
static void test_ddp_no_master_weights(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_precision_policy pol = f32_policy();
    pol.param_dtype = VH_DTYPE_F16;
    pol.master_weights = 0;
    assert_int_equal(fx_setup_policy(&f, 0, pol), VH_STATUS_OK);
    float v[12] = {1.0f, 0.5f, -2.0f, 3.25f, 1e-3f, 7.0f, 0.1f, -0.1f, 65504.0f, 0.0f, 2.0f, 9.0f};
    assert_int_equal(f.sh->load_unit(f.ddp, 2, v), VH_STATUS_OK);
    const uint16_t *p = (const uint16_t *)(const void *)gather_of(&f, 2);
    for (int i = 0; i < 10; i++) assert_int_equal(p[i], vh_f32_to_f16(v[i]));
    float out[12];
    assert_int_equal(f.sh->store_unit(f.ddp, 2, out), VH_STATUS_OK);
    for (int i = 0; i < 12; i++) assert_true(out[i] == vh_f16_to_f32(vh_f32_to_f16(v[i])));
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        assert_int_equal(x->master_dtype, VH_DTYPE_F16);
        if (x->unit == 2 && x->param == 0) assert_ptr_equal(x->master, (const void *)p);
    }
    vh_sharding_memory m = {.struct_size = sizeof m};
    assert_int_equal(f.sh->memory(f.ddp, &m), VH_STATUS_OK);
    assert_int_equal(m.masters, 0);
    fx_close(&f);
}

/* 16-bit gradients reach the optimizer in f32. With comm_dtype f32 reduce
 * converts them and all-reduces the f32 copy; with comm_dtype bf16 they are
 * all-reduced in bf16 and wait converts them. f32 grads (the norms, kept in
 * f32 by fp32_param_flags) are reduced in f32 either way. */
static void half_grads(vh_dtype comm) {
    fx f;
    fx_open_with(&f, NULL, 2);
    vh_precision_policy pol = f32_policy();
    pol.param_dtype = pol.grad_dtype = VH_DTYPE_BF16;
    pol.comm_dtype = comm;
    pol.fp32_param_flags = VH_PARAM_FLAG_NORM;
    assert_int_equal(fx_setup_policy(&f, 0, pol), VH_STATUS_OK);
    layouts gl;
    layouts_of(&gl, units, NUM_UNITS, &pol, 1);
    fake.peer_grad = 1.0f;
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
        char *g = grads_of(&f, u);
        for (int32_t p = 0; p < units[u].num_params; p++) {
            const vh_param_desc *pd = &units[u].params[p];
            char *at = g + gl.unit[u].offsets[p];
            for (int64_t i = 0; i < pd->numel; i++) {
                float x = (float)(pd->offset + i) + 0.5f;
                if (gl.unit[u].dtypes[p] == VH_DTYPE_F32) ((float *)(void *)at)[i] = x;
                else ((uint16_t *)(void *)at)[i] = vh_f32_to_bf16(x);
            }
        }
        int before = fake.avgs;
        assert_int_equal(f.sh->reduce(f.ddp, u), VH_STATUS_OK);
        /* blocks.0: fc.weight (bf16), then the two f32 norms: two runs */
        assert_int_equal(fake.avgs - before, u == 1 ? 2 : 1);
    }
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    assert_int_equal(fake.in_flight, 0);
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        const vh_param_desc *pd = &units[x->unit].params[x->param];
        const int half = gl.unit[x->unit].dtypes[x->param] == VH_DTYPE_BF16;
        assert_int_equal(x->grad_dtype, VH_DTYPE_F32);
        for (int64_t i = 0; i < x->count; i++) {
            float mine = (float)(pd->offset + i) + 0.5f;
            float want = (mine + 1.0f) / 2.0f;
            if (half && comm == VH_DTYPE_F32) /* rounded once to bf16 by backward */
                want = (vh_bf16_to_f32(vh_f32_to_bf16(mine)) + 1.0f) / 2.0f;
            else if (half) /* and once more on the bf16 wire */
                want = vh_bf16_to_f32(
                    vh_f32_to_bf16((vh_bf16_to_f32(vh_f32_to_bf16(mine)) + 1.0f) / 2.0f));
            assert_true(((const float *)x->grad)[i] == want);
        }
    }
    vh_sharding_memory m = {.struct_size = sizeof m};
    assert_int_equal(f.sh->memory(f.ddp, &m), VH_STATUS_OK);
    assert_int_equal(m.grads, (int64_t)gl.bytes + (TOTAL - 10) * 4); /* + the f32 copies */
    layouts_free(&gl);
    fx_close(&f);
}

static void test_ddp_half_grads_f32_wire(void **state) {
    (void)state;
    half_grads(VH_DTYPE_F32);
}

static void test_ddp_half_grads_bf16_wire(void **state) {
    (void)state;
    half_grads(VH_DTYPE_BF16);
}

/* Policies ddp cannot serve are refused as unsupported, with the reason. */
static void test_ddp_refuses_policies(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_precision_policy pol = f32_policy();
    pol.grad_dtype = VH_DTYPE_F16;
    pol.comm_dtype = VH_DTYPE_BF16;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "own dtype or in f32");
    pol = f32_policy();
    pol.comm_dtype = VH_DTYPE_BF16;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "bf16 on the wire");
    pol = f32_policy();
    pol.master_dtype = VH_DTYPE_F16;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "master copies must be f32");
    pol = f32_policy();
    pol.state_dtype = VH_DTYPE_BF16;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "optimizer state in f32");
    pol = f32_policy();
    pol.param_dtype = VH_DTYPE_I32;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "i32");
    pol = f32_policy();
    pol.grad_dtype = VH_DTYPE_U8;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "u8");
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 5, f32_policy()),
                 VH_STATUS_ERR_INVALID_ARG, "state slots");
    /* A refused setup leaves the plugin ready for a good one. */
    assert_int_equal(fx_setup_policy(&f, 1, f32_policy()), VH_STATUS_OK);
    fx_close(&f);
}

/* Inconsistent tables are refused before anything is allocated; so are a
 * missing setup and a setup without a policy. */
static void test_ddp_refuses_bad_tables(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_param_desc bad[2] = {embed_params[0], embed_params[1]};
    bad[1].offset = 11; /* overlaps the weight */
    vh_unit_desc bad_units[3] = {units[0], units[1], units[2]};
    bad_units[0].params = bad;
    vh_param_table t = {bad_units, 3, TOTAL};
    vh_precision_policy pol = f32_policy();
    vh_sharding_setup s = {.struct_size = sizeof s, .table = &t, .policy = &pol};
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, &s), VH_STATUS_ERR_INVALID_ARG,
                 "embed.bias");
    t = (vh_param_table){units, 3, TOTAL + 1};
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, &s), VH_STATUS_ERR_INVALID_ARG,
                 "table numel");
    t = (vh_param_table){units, 0, 0};
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, &s), VH_STATUS_ERR_INVALID_ARG,
                 "empty");
    s.table = NULL;
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, &s), VH_STATUS_ERR_INVALID_ARG,
                 "empty");
    s.table = &table;
    s.policy = NULL;
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, &s), VH_STATUS_ERR_INVALID_ARG,
                 "without a precision policy");
    /* A struct that holds nothing past struct_size has no table. */
    s.policy = &pol;
    s.struct_size = 4;
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, &s), VH_STATUS_ERR_INVALID_ARG,
                 "empty");
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, NULL), VH_STATUS_ERR_INVALID_ARG,
                 "missing");
    fx_close(&f);
}

/* Older, smaller structs read with their missing members zero: a setup that
 * ends before state_slots has none; a policy that ends before state_dtype
 * has f32 state and no master weights (the optimizer then updates the f32
 * compute copies, which are the masters anyway). */
static void test_ddp_older_structs(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_precision_policy pol = f32_policy();
    pol.struct_size = (uint32_t)offsetof(vh_precision_policy, state_dtype);
    pol.state_dtype = VH_DTYPE_BF16; /* past its size: never read */
    pol.master_weights = 7;
    vh_sharding_setup s = {.struct_size = (uint32_t)offsetof(vh_sharding_setup, state_slots),
                           .table = &table, .policy = &pol, .state_slots = 3};
    assert_int_equal(f.sh->setup(f.ddp, &s), VH_STATUS_OK);
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t i = 0; i < sl.count; i++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, i);
        assert_null(x->state[0]);
        assert_int_equal(x->master_dtype, VH_DTYPE_F32);
    }
    /* memory() into an older struct fills what it covers only. */
    vh_sharding_memory m;
    memset(&m, 0x5a, sizeof m);
    m.struct_size = (uint32_t)offsetof(vh_sharding_memory, masters);
    assert_int_equal(f.sh->memory(f.ddp, &m), VH_STATUS_OK);
    assert_int_equal(m.struct_size, offsetof(vh_sharding_memory, masters));
    assert_true(m.params > 0 && m.grads > 0);
    int64_t untouched;
    memset(&untouched, 0x5a, sizeof untouched);
    assert_int_equal(m.masters, untouched);
    assert_int_equal(m.comm_buffers, untouched);
    fx_close(&f);
}

/* memory(): what this rank holds, by kind, as the table implies for fp32:
 * params are the compute copies (their layouts, padding included), masters
 * none (they are the params), grads the same layouts, optimizer state
 * slots x numel f32, and no comm buffers (collectives run in place). */
static void test_ddp_memory(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 2);
    layouts pl;
    layouts_of(&pl, units, NUM_UNITS, &f.policy, 0);
    /* every parameter rounded up to 64 bytes */
    size_t want = 0;
    for (int32_t u = 0; u < NUM_UNITS; u++)
        for (int32_t p = 0; p < units[u].num_params; p++)
            want += ((size_t)units[u].params[p].numel * 4 + 63) / 64 * 64;
    assert_int_equal(pl.bytes, want);
    vh_sharding_memory m;
    memset(&m, 0xff, sizeof m);
    m.struct_size = sizeof m;
    assert_int_equal(f.sh->memory(f.ddp, &m), VH_STATUS_OK);
    assert_int_equal(m.struct_size, sizeof m);
    assert_int_equal(m.params, (int64_t)want);
    assert_int_equal(m.grads, (int64_t)want);
    assert_int_equal(m.masters, 0);
    assert_int_equal(m.optim_state, 2 * TOTAL * 4);
    assert_int_equal(m.comm_buffers, 0);
    assert_int_equal(m.params + m.grads + m.masters + m.optim_state,
                     (int64_t)(2 * want + 2 * TOTAL * sizeof(float)));
    assert_int_equal(f.sh->memory(f.ddp, NULL), VH_STATUS_ERR_INVALID_ARG);
    layouts_free(&pl);
    fx_close(&f);
}

/* ---- optimizer state through a vh_state_io --------------------------------- */

/* The io of a checkpoint, in memory: one tensor per (unit, param, slot) of
 * the full parameter's numel; every write and read is recorded, so a test
 * can say each element went through exactly once. */
typedef struct mem_io {
    float values[NUM_UNITS][4][VH_OPTIM_MAX_STATE_SLOTS][32];
    int touched[NUM_UNITS][4][VH_OPTIM_MAX_STATE_SLOTS][32];
    int writes, reads;
    vh_status fail_with; /* returned by every call when not OK */
} mem_io;

static vh_status mem_piece(mem_io *m, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                           int64_t count, vh_dtype dtype) {
    assert_in_range(unit, 0, NUM_UNITS - 1);
    assert_in_range(param, 0, units[unit].num_params - 1);
    assert_in_range(slot, 0, VH_OPTIM_MAX_STATE_SLOTS - 1);
    assert_int_equal(dtype, VH_DTYPE_F32);
    assert_true(offset >= 0 && count >= 0 && offset + count <= units[unit].params[param].numel);
    for (int64_t i = offset; i < offset + count; i++) m->touched[unit][param][slot][i]++;
    return m->fail_with;
}

static vh_status mem_write(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                           int64_t count, vh_dtype dtype, const void *values) {
    mem_io *m = ctx;
    m->writes++;
    vh_status st = mem_piece(m, unit, param, slot, offset, count, dtype);
    if (st == VH_STATUS_OK)
        memcpy(&m->values[unit][param][slot][offset], values, (size_t)count * sizeof(float));
    return st;
}

static vh_status mem_read(void *ctx, int32_t unit, int32_t param, int32_t slot, int64_t offset,
                          int64_t count, vh_dtype dtype, void *values) {
    mem_io *m = ctx;
    m->reads++;
    vh_status st = mem_piece(m, unit, param, slot, offset, count, dtype);
    if (st == VH_STATUS_OK)
        memcpy(values, &m->values[unit][param][slot][offset], (size_t)count * sizeof(float));
    return st;
}

/* Every element of every slot of every parameter went through once. */
static void assert_each_once(const mem_io *m, int32_t slots) {
    for (int32_t u = 0; u < NUM_UNITS; u++)
        for (int32_t p = 0; p < units[u].num_params; p++)
            for (int32_t k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++)
                for (int64_t i = 0; i < units[u].params[p].numel; i++)
                    assert_int_equal(m->touched[u][p][k][i], k < slots ? 1 : 0);
}

static float state_value(int32_t u, int32_t p, int32_t k, int64_t i) {
    return (float)(u * 1000 + p * 100 + k * 10) + (float)i * 0.125f;
}

/* state_save writes each slot of each slice whole (offset 0, count numel),
 * f32; state_load into a fresh ddp reads every piece back: the values
 * survive and every element is covered once each way. */
static void test_ddp_state_round_trip(void **state) {
    (void)state;
    enum { SLOTS = 2 };
    static mem_io m;
    memset(&m, 0, sizeof m);
    vh_state_io io = {.struct_size = sizeof io, .ctx = &m, .write = mem_write, .read = mem_read};
    fx f;
    fx_open(&f, SLOTS);
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        for (int32_t k = 0; k < SLOTS; k++)
            for (int64_t i = 0; i < x->count; i++)
                ((float *)x->state[k])[i] = state_value(x->unit, x->param, k, i);
    }
    assert_int_equal(f.sh->state_save(f.ddp, &io), VH_STATUS_OK);
    assert_int_equal(m.writes, NUM_PARAMS * SLOTS);
    assert_int_equal(m.reads, 0);
    assert_each_once(&m, SLOTS);
    fx_close(&f);

    memset(m.touched, 0, sizeof m.touched);
    fx_open(&f, SLOTS);
    assert_int_equal(f.sh->state_load(f.ddp, &io), VH_STATUS_OK);
    assert_int_equal(m.reads, NUM_PARAMS * SLOTS);
    assert_each_once(&m, SLOTS);
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        for (int32_t k = 0; k < SLOTS; k++)
            for (int64_t i = 0; i < x->count; i++)
                assert_true(((const float *)x->state[k])[i] ==
                            state_value(x->unit, x->param, k, i));
    }
    /* The io's failure comes back with the piece named. */
    m.fail_with = VH_STATUS_ERR_IO;
    expect_error(&f, VH_ROLE_SHARDING, f.sh->state_load(f.ddp, &io), VH_STATUS_ERR_IO,
                 "state slot 0 of unit 0 (embed) param 0");
    m.fail_with = VH_STATUS_OK;
    /* A missing io, or one without the call it needs, is refused. */
    expect_error(&f, VH_ROLE_SHARDING, f.sh->state_save(f.ddp, NULL), VH_STATUS_ERR_INVALID_ARG,
                 "no state io");
    vh_state_io no_read = {.struct_size = sizeof no_read, .ctx = &m, .write = mem_write};
    expect_error(&f, VH_ROLE_SHARDING, f.sh->state_load(f.ddp, &no_read),
                 VH_STATUS_ERR_INVALID_ARG, "no read");
    fx_close(&f);

    /* Without state slots there is nothing to write. */
    memset(&m, 0, sizeof m);
    fx_open(&f, 0);
    assert_int_equal(f.sh->state_save(f.ddp, &io), VH_STATUS_OK);
    assert_int_equal(m.writes, 0);
    fx_close(&f);
}

/* Misuse: calls before setup, bad units, NULL outs, double setup, release
 * without gather, double reduce, grads after reduce, missing wait, a step
 * that reduced some units only. */
static void test_ddp_misuse(void **state) {
    (void)state;
    const vh_role R = VH_ROLE_SHARDING;
    fx f;
    fx_open_with(&f, NULL, 1);
    const void *p = NULL;
    void *g = NULL;
    float v[64] = {0};
    vh_param_slices sl;
    mem_io m;
    memset(&m, 0, sizeof m);
    vh_state_io io = {.struct_size = sizeof io, .ctx = &m, .write = mem_write, .read = mem_read};
    vh_sharding_memory mem = {.struct_size = sizeof mem};
    expect_error(&f, R, f.sh->gather(f.ddp, 0, &p), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->zero_grads(f.ddp), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->slices(f.ddp, &sl), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->wait(f.ddp), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->refresh(f.ddp), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->load_unit(f.ddp, 0, v), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->state_save(f.ddp, &io), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->state_load(f.ddp, &io), VH_STATUS_ERR_INVALID_ARG, "before setup");
    /* memory before setup: nothing held yet */
    assert_int_equal(f.sh->memory(f.ddp, &mem), VH_STATUS_OK);
    assert_int_equal(mem.params + mem.grads + mem.masters + mem.optim_state, 0);
    assert_int_equal(fx_setup_policy(&f, 0, f32_policy()), VH_STATUS_OK);
    expect_error(&f, R, fx_setup_policy(&f, 0, f32_policy()), VH_STATUS_ERR_INVALID_ARG,
                 "setup called twice");
    /* Unit indices. */
    int32_t bad_units[] = {-1, NUM_UNITS, INT32_MAX};
    for (size_t i = 0; i < sizeof bad_units / sizeof *bad_units; i++) {
        int32_t u = bad_units[i];
        expect_error(&f, R, f.sh->gather(f.ddp, u, &p), VH_STATUS_ERR_INVALID_ARG, "not in [0, 3)");
        expect_error(&f, R, f.sh->release(f.ddp, u), VH_STATUS_ERR_INVALID_ARG, "not in [0, 3)");
        expect_error(&f, R, f.sh->grads(f.ddp, u, &g), VH_STATUS_ERR_INVALID_ARG, "not in [0, 3)");
        expect_error(&f, R, f.sh->reduce(f.ddp, u), VH_STATUS_ERR_INVALID_ARG, "not in [0, 3)");
        expect_error(&f, R, f.sh->load_unit(f.ddp, u, v), VH_STATUS_ERR_INVALID_ARG,
                     "not in [0, 3)");
        expect_error(&f, R, f.sh->store_unit(f.ddp, u, v), VH_STATUS_ERR_INVALID_ARG,
                     "not in [0, 3)");
    }
    /* NULL arguments. */
    expect_error(&f, R, f.sh->gather(f.ddp, 0, NULL), VH_STATUS_ERR_INVALID_ARG, "NULL");
    expect_error(&f, R, f.sh->grads(f.ddp, 0, NULL), VH_STATUS_ERR_INVALID_ARG, "NULL");
    expect_error(&f, R, f.sh->load_unit(f.ddp, 0, NULL), VH_STATUS_ERR_INVALID_ARG, "NULL");
    expect_error(&f, R, f.sh->store_unit(f.ddp, 0, NULL), VH_STATUS_ERR_INVALID_ARG, "NULL");
    assert_int_equal(f.sh->slices(f.ddp, NULL), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(f.sh->zero_grads(NULL), VH_STATUS_ERR_INVALID_ARG);

    /* gather/release pairs; grads before gather is fine. */
    expect_error(&f, R, f.sh->release(f.ddp, 1), VH_STATUS_ERR_INVALID_ARG, "not gathered");
    assert_int_equal(f.sh->grads(f.ddp, 1, &g), VH_STATUS_OK);
    assert_int_equal(f.sh->gather(f.ddp, 1, &p), VH_STATUS_OK);
    assert_int_equal(f.sh->gather(f.ddp, 1, &p), VH_STATUS_OK);
    assert_int_equal(f.sh->release(f.ddp, 1), VH_STATUS_OK);
    assert_int_equal(f.sh->release(f.ddp, 1), VH_STATUS_OK);
    expect_error(&f, R, f.sh->release(f.ddp, 1), VH_STATUS_ERR_INVALID_ARG, "not gathered");

    /* A step: reduce once per unit. */
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    assert_int_equal(f.sh->reduce(f.ddp, 2), VH_STATUS_OK);
    expect_error(&f, R, f.sh->reduce(f.ddp, 2), VH_STATUS_ERR_INVALID_ARG, "twice in one step");
    expect_error(&f, R, f.sh->grads(f.ddp, 2, &g), VH_STATUS_ERR_INVALID_ARG, "after its reduce");
    assert_int_equal(f.sh->reduce(f.ddp, 1), VH_STATUS_OK);
    expect_error(&f, R, f.sh->zero_grads(f.ddp), VH_STATUS_ERR_INVALID_ARG, "call wait");
    expect_error(&f, R, f.sh->wait(f.ddp), VH_STATUS_ERR_INVALID_ARG, "unit 0 (embed)");
    assert_int_equal(f.sh->reduce(f.ddp, 0), VH_STATUS_OK);
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK); /* nothing left: harmless */
    /* The next step starts clean. */
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    assert_int_equal(f.sh->grads(f.ddp, 2, &g), VH_STATUS_OK);
    assert_int_equal(f.sh->reduce(f.ddp, 2), VH_STATUS_OK);
    fx_close(&f);
}


/* ---- fp32 ----------------------------------------------------------------- */

static void test_fp32_policy(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_precision_policy pol;
    memset(&pol, 0xff, sizeof pol);
    pol.struct_size = sizeof pol;
    assert_int_equal(f.pr->policy(f.fp32, &pol), VH_STATUS_OK);
    assert_int_equal(pol.struct_size, sizeof pol);
    assert_int_equal(pol.param_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.compute_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.grad_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.comm_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.master_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.state_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.fp32_param_flags, 0);
    assert_int_equal(pol.master_weights, 1);
    assert_true(f.pr->loss_scale(f.fp32) == 1.0f);
    assert_int_equal(f.pr->policy(f.fp32, NULL), VH_STATUS_ERR_INVALID_ARG);

    /* An older caller's struct (ending before state_dtype): what it covers
     * is filled, nothing past it is written, its struct_size stays. */
    memset(&pol, 0xff, sizeof pol);
    pol.struct_size = (uint32_t)offsetof(vh_precision_policy, state_dtype);
    assert_int_equal(f.pr->policy(f.fp32, &pol), VH_STATUS_OK);
    assert_int_equal(pol.struct_size, offsetof(vh_precision_policy, state_dtype));
    assert_int_equal(pol.master_dtype, VH_DTYPE_F32);
    unsigned char past[sizeof pol - offsetof(vh_precision_policy, state_dtype)];
    memset(past, 0xff, sizeof past);
    assert_memory_equal((const unsigned char *)&pol + offsetof(vh_precision_policy, state_dtype),
                        past, sizeof past);
    /* A caller that set no size is refused. */
    pol.struct_size = 0;
    expect_error(&f, VH_ROLE_PRECISION, f.pr->policy(f.fp32, &pol), VH_STATUS_ERR_INVALID_ARG,
                 "struct_size");
    fx_close(&f);
}

/* Writes v at element `at` (the table's numbering) of unit `unit` in the
 * grads, runs unscale_and_check on ddp's slices and returns found_inf. The
 * grads are otherwise clean, and must come out unchanged (the scale is 1). */
static int found_inf_with(fx *f, int32_t unit, int64_t at, float v) {
    layouts gl;
    layouts_of(&gl, units, NUM_UNITS, &f->policy, 1);
    assert_int_equal(f->sh->zero_grads(f->ddp), VH_STATUS_OK);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        char *g = grads_of(f, u);
        for (int64_t i = 0; i < units[u].numel; i++)
            *f32_elem(g, &gl.unit[u], u, i) = pattern(u, i) - 1500.0f;
    }
    if (unit >= 0) *f32_elem(grads_of(f, unit), &gl.unit[unit], unit, at) = v;
    vh_param_slices sl;
    assert_int_equal(f->sh->slices(f->ddp, &sl), VH_STATUS_OK);
    int found = -1;
    vh_status st = f->pr->unscale_and_check(f->fp32, &sl, &found);
    if (st != VH_STATUS_OK) fail_msg("unscale_and_check: %s", error_of(f, VH_ROLE_PRECISION));
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        char *g = grads_of(f, u);
        for (int64_t i = 0; i < units[u].numel; i++) {
            if (u == unit && i == at) continue;
            assert_true(*f32_elem(g, &gl.unit[u], u, i) == pattern(u, i) - 1500.0f);
        }
    }
    assert_int_equal(f->pr->update(f->fp32, found), VH_STATUS_OK);
    layouts_free(&gl);
    return found;
}

static void test_fp32_found_inf(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    assert_int_equal(found_inf_with(&f, -1, 0, 0.0f), 0);
    assert_int_equal(found_inf_with(&f, 0, 0, INFINITY), 1);
    assert_int_equal(found_inf_with(&f, 1, 29, -INFINITY), 1);
    assert_int_equal(found_inf_with(&f, 2, 11, NAN), 1);
    assert_int_equal(found_inf_with(&f, 1, 17, -NAN), 1);
    assert_int_equal(found_inf_with(&f, 2, 3, FLT_MAX), 0); /* large but finite */
    assert_int_equal(found_inf_with(&f, -1, 0, 0.0f), 0);

    /* A long slice: the scan goes past its first blocks. */
    float big[5000];
    for (int i = 0; i < 5000; i++) big[i] = (float)i;
    vh_param_slice one;
    memset(&one, 0, sizeof one);
    one.count = 5000;
    one.grad = big;
    vh_param_slices sl = {.items = &one, .count = 1, .item_size = sizeof one};
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    /* The same pass summed the squares (fp32 sums: a relative tolerance). */
    double sum_sq = -1.0, want = 0.0;
    int has = -1;
    for (int i = 0; i < 5000; i++) want += (double)i * (double)i;
    assert_int_equal(f.pr->grad_sum_sq(f.fp32, &sum_sq, &has), VH_STATUS_OK);
    assert_int_equal(has, 1);
    assert_true(fabs(sum_sq - want) <= 1e-5 * want);
    big[4999] = NAN;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    /* The scale is 1: the values are left as they were. */
    for (int i = 0; i < 4999; i++) assert_true(big[i] == (float)i);
    /* An empty list: nothing to scan, still agreed. */
    sl.count = 0;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    fx_close(&f);
}

/* Grads of any storage dtype the device reads (bf16 here) are checked in
 * the same pass; an integer dtype is refused by name. */
static void test_fp32_found_inf_bf16(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    uint16_t h[300];
    float x[7] = {1.0f, -2.0f, 3.5f, 0.0f, 1e30f, -1e-30f, 65504.0f};
    for (int i = 0; i < 300; i++) h[i] = vh_f32_to_bf16(x[i % 7]);
    vh_param_slice two[2];
    memset(two, 0, sizeof two);
    two[0].count = 300;
    two[0].grad = h;
    two[0].grad_dtype = VH_DTYPE_BF16;
    float ok[3] = {1.0f, 2.0f, 3.0f};
    two[1].count = 3;
    two[1].grad = ok;
    vh_param_slices sl = {.items = two, .count = 2, .item_size = sizeof two[0]};
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    h[123] = vh_f32_to_bf16(INFINITY);
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    h[123] = 0x7fc1; /* a bf16 NaN */
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    h[123] = vh_f32_to_bf16(1.0f);
    two[0].grad_dtype = VH_DTYPE_I32;
    expect_error(&f, VH_ROLE_PRECISION, f.pr->unscale_and_check(f.fp32, &sl, &found),
                 VH_STATUS_ERR_UNSUPPORTED, "i32 grads");
    fx_close(&f);
}

/* On a device that is not the CPU the same multi-tensor op of that device
 * runs over the grads (nothing is staged through the host; only the flag
 * comes back): the Inf is found in the second slice of a long list. */
static void test_fp32_found_inf_other_device(void **state) {
    (void)state;
    fx f;
    fx_open_on(&f, NULL, 1, 1);
    assert_int_equal(fx_setup_policy(&f, 0, f32_policy()), VH_STATUS_OK);
    assert_int_equal(found_inf_with(&f, -1, 0, 0.0f), 0);
    assert_int_equal(found_inf_with(&f, 1, 7, INFINITY), 1);

    enum { N = 70000 };
    float *big = calloc(N, sizeof *big);
    assert_non_null(big);
    vh_param_slice two[2];
    memset(two, 0, sizeof two);
    two[0].count = 3;
    two[0].grad = big;
    two[1].count = N - 3;
    two[1].grad = big + 3;
    vh_param_slices sl = {.items = two, .count = 2, .item_size = sizeof two[0]};
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    big[N - 2] = -INFINITY;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    free(big);
    fx_close(&f);
}

/* Another rank's overflow skips this rank's step too: one SUM all-reduce
 * of the flag (replicas: the sum of squares does not travel). */
static void test_fp32_found_inf_agreed(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 2);
    assert_int_equal(fx_setup_policy(&f, 0, f32_policy()), VH_STATUS_OK);
    fake.peer_flag = 0.0f;
    assert_int_equal(found_inf_with(&f, -1, 0, 0.0f), 0);
    assert_int_equal(fake.flags, 1);
    assert_int_equal(fake.last_count, 1);
    assert_int_equal(fake.in_flight, 0); /* waited for before the flag is read */
    fake.peer_flag = 1.0f;
    assert_int_equal(found_inf_with(&f, -1, 0, 0.0f), 1);
    assert_int_equal(fake.flags, 2);
    fake.peer_flag = 0.0f;
    assert_int_equal(found_inf_with(&f, 0, 3, INFINITY), 1);
    assert_int_equal(fake.flags, 3);
    fx_close(&f);
}

/* check_finite: false scans nothing and calls no collective. */
static void test_fp32_check_finite_off(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, "check_finite: false", 2);
    assert_int_equal(fx_setup_policy(&f, 0, f32_policy()), VH_STATUS_OK);
    fake.peer_flag = 1.0f;
    assert_int_equal(found_inf_with(&f, 1, 2, NAN), 0);
    assert_int_equal(fake.flags, 0);
    double sum_sq = -1.0;
    int has = -1;
    assert_int_equal(f.pr->grad_sum_sq(f.fp32, &sum_sq, &has), VH_STATUS_OK);
    assert_int_equal(has, 0); /* no pass, no sum */
    fx_close(&f);
}

static void test_fp32_misuse(void **state) {
    (void)state;
    const vh_role R = VH_ROLE_PRECISION;
    fx f;
    fx_open_with(&f, NULL, 1);
    int found = 0;
    vh_param_slice one;
    memset(&one, 0, sizeof one);
    one.count = 4; /* and no grad */
    vh_param_slices sl = {.items = &one, .count = 1, .item_size = sizeof one};
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_ERR_INVALID_ARG,
                 "no grad");
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, NULL, &found),
                 VH_STATUS_ERR_INVALID_ARG, "NULL");
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, &sl, NULL), VH_STATUS_ERR_INVALID_ARG,
                 "NULL");
    sl.item_size = 8;
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, &sl, &found),
                 VH_STATUS_ERR_INVALID_ARG, "item_size 8 is smaller");
    assert_int_equal(f.pr->unscale_and_check(NULL, &sl, &found), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(f.pr->update(NULL, 0), VH_STATUS_ERR_INVALID_ARG);
    fx_close(&f);
}

/* The state blob: a fixed tag that round-trips, and refuses what another
 * precision plugin wrote (test_precision's own state, of the same size),
 * a truncated blob and a newer version. */
static void test_fp32_state(void **state) {
    (void)state;
    const vh_role R = VH_ROLE_PRECISION;
    fx f;
    fx_open_with(&f, NULL, 1);
    size_t n = 0;
    assert_int_equal(f.pr->state_size(f.fp32, &n), VH_STATUS_OK);
    assert_true(n > 0 && n <= 64);
    unsigned char blob[64];
    memset(blob, 0xab, sizeof blob);
    assert_int_equal(f.pr->state_save(f.fp32, blob, n), VH_STATUS_OK);
    assert_int_equal(f.pr->state_load(f.fp32, blob, n), VH_STATUS_OK);
    unsigned char again[64];
    assert_int_equal(f.pr->state_save(f.fp32, again, n), VH_STATUS_OK);
    assert_memory_equal(blob, again, n);
    expect_error(&f, R, f.pr->state_save(f.fp32, again, n - 1), VH_STATUS_ERR_INVALID_ARG,
                 "needed");

    /* test_precision's state, saved by the real plugin. */
    vh_run other;
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    const char *recipe = "model: {plugin: test_model}\n"
                         "precision: {plugin: test_precision, loss_scale: 1.0}\n"
                         "sharding: {plugin: test_sharding}\n"
                         "optim: {plugin: test_optim}\n"
                         "data: {plugin: test_data}\n";
    if (run_open_text(&other, "other.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    const vh_precision_vtable *tp = other.plugins[VH_ROLE_PRECISION].desc->vtable;
    void *t = NULL;
    assert_int_equal(tp->create(&other.hosts[VH_ROLE_PRECISION].pub, &t), VH_STATUS_OK);
    size_t tn = 0;
    assert_int_equal(tp->state_size(t, &tn), VH_STATUS_OK);
    assert_true(tn <= sizeof blob);
    unsigned char foreign[64];
    assert_int_equal(tp->state_save(t, foreign, tn), VH_STATUS_OK);
    tp->destroy(t);
    run_close(&other);
    expect_error(&f, R, f.pr->state_load(f.fp32, foreign, tn), VH_STATUS_ERR_FORMAT,
                 "another precision plugin");
    expect_error(&f, R, f.pr->state_load(f.fp32, blob, n - 1), VH_STATUS_ERR_FORMAT, "damaged");
    expect_error(&f, R, f.pr->state_load(f.fp32, blob, 2), VH_STATUS_ERR_FORMAT,
                 "another precision plugin");
    expect_error(&f, R, f.pr->state_load(f.fp32, NULL, 0), VH_STATUS_ERR_FORMAT,
                 "another precision plugin");
    unsigned char newer[64];
    memcpy(newer, blob, n);
    uint32_t version = 2;
    memcpy(newer + 4, &version, sizeof version);
    expect_error(&f, R, f.pr->state_load(f.fp32, newer, n), VH_STATUS_ERR_FORMAT, "newer fp32");
    fx_close(&f);
}

/* ---- end to end ----------------------------------------------------------- */

/* Every loss `vithost run` reported: one per "train step" line, then the
 * final one. */
typedef struct losses {
    char text[64][32];
    int count;
    char final[32];
} losses;

/* Runs `vithost run RECIPE ARGS` in the source tree and collects its losses.
 * It must exit with `code`: 0 after a final loss, 5 when --stop-after ended
 * it with a checkpoint. */
static void run_vithost(const char *recipe, const char *args, int code, losses *out) {
    memset(out, 0, sizeof *out);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' run '%s' %s 2>&1", VH_TEST_SOURCE_DIR,
             VH_TEST_VITHOST, recipe, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[2048], all[16384] = "";
    while (fgets(line, sizeof line, p)) {
        if (strlen(all) + strlen(line) < sizeof all) strcat(all, line);
        const char *at;
        if (strncmp(line, "train step ", 11) == 0 && (at = strstr(line, ": loss ")) &&
            out->count < 64)
            sscanf(at + 7, "%31s", out->text[out->count++]);
        if ((at = strstr(line, "final loss "))) sscanf(at + 11, "%31[^;\n]", out->final);
    }
    int status = pclose(p);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != code)
        fail_msg("`%s` did not exit with %d:\n%s", cmd, code, all);
    if (code == 0 && !out->final[0]) fail_msg("no final loss in the output of `%s`:\n%s", cmd, all);
}

/* A scratch folder for run folders, and in it configs/test-plugins.yaml
 * without its precision.loss_scale line: that key is test_precision's and
 * fp32's schema (rightly) refuses it, so `--set precision.plugin=fp32` alone
 * cannot switch the shipped recipe. */
typedef struct scratch {
    char dir[64];
    char recipe[256];
} scratch;

static int scratch_open(void **state) {
    static scratch scratch_space;
    scratch *s = &scratch_space;
    *state = s;
    snprintf(s->dir, sizeof s->dir, "/tmp/vh_fp32_ddp_XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->recipe, sizeof s->recipe, "%.63s/test-plugins-fp32.yaml", s->dir);
    char src[1024];
    snprintf(src, sizeof src, "%s/configs/test-plugins.yaml", VH_TEST_SOURCE_DIR);
    FILE *in = fopen(src, "r");
    FILE *out = fopen(s->recipe, "w");
    assert_non_null(in);
    assert_non_null(out);
    char line[1024];
    while (fgets(line, sizeof line, in)) {
        const char *t = line + strspn(line, " \t");
        if (strncmp(t, "loss_scale:", 11) != 0) fputs(line, out);
    }
    fclose(in);
    assert_int_equal(fclose(out), 0);
    return 0;
}

/* A teardown, so that a failed run leaves nothing behind either. */
static int scratch_close(void **state) {
    const scratch *s = *state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%.63s'", s->dir);
    return system(cmd) == 0 ? 0 : -1;
}

#define FP32_DDP "--set precision.plugin=fp32 --set sharding.plugin=ddp"

/* configs/test-plugins.yaml with precision fp32 and sharding ddp trains to
 * the same losses, step by step, as with the test plugins: both are fp32
 * full replicas on one rank. Stopped half-way and resumed from its
 * checkpoint (store_unit, load_unit and fp32's state through the host), it
 * ends at the same loss again. */
static void test_end_to_end_same_loss(void **state) {
    const scratch *s = *state;
    char args[512];
    losses base, ours, resumed;
    snprintf(args, sizeof args, "--out '%s/base'", s->dir);
    run_vithost("configs/test-plugins.yaml", args, 0, &base);
    snprintf(args, sizeof args, FP32_DDP " --out '%s/ours'", s->dir);
    run_vithost(s->recipe, args, 0, &ours);
    assert_true(base.count > 1);
    assert_int_equal(ours.count, base.count);
    for (int i = 0; i < base.count; i++) assert_string_equal(ours.text[i], base.text[i]);
    assert_string_equal(ours.final, base.final);

    snprintf(args, sizeof args, FP32_DDP " --out '%s/resumed' --stop-after 10", s->dir);
    run_vithost(s->recipe, args, 5, &resumed);
    snprintf(args, sizeof args, FP32_DDP " --out '%s/resumed' --resume", s->dir);
    run_vithost(s->recipe, args, 0, &resumed);
    assert_string_equal(resumed.final, base.final);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddp_layout),
        cmocka_unit_test(test_ddp_zero_grads),
        cmocka_unit_test(test_ddp_reduce_world1),
        cmocka_unit_test(test_ddp_reduce_averages),
        cmocka_unit_test(test_ddp_reduce_leaves_request),
        cmocka_unit_test(test_ddp_slices),
        cmocka_unit_test(test_ddp_state_slots),
        cmocka_unit_test(test_ddp_half_params),
        cmocka_unit_test(test_ddp_no_master_weights),
        cmocka_unit_test(test_ddp_half_grads_f32_wire),
        cmocka_unit_test(test_ddp_half_grads_bf16_wire),
        cmocka_unit_test(test_ddp_refuses_policies),
        cmocka_unit_test(test_ddp_refuses_bad_tables),
        cmocka_unit_test(test_ddp_older_structs),
        cmocka_unit_test(test_ddp_memory),
        cmocka_unit_test(test_ddp_state_round_trip),
        cmocka_unit_test(test_ddp_misuse),
        cmocka_unit_test(test_fp32_policy),
        cmocka_unit_test(test_fp32_found_inf),
        cmocka_unit_test(test_fp32_found_inf_bf16),
        cmocka_unit_test(test_fp32_found_inf_other_device),
        cmocka_unit_test(test_fp32_found_inf_agreed),
        cmocka_unit_test(test_fp32_check_finite_off),
        cmocka_unit_test(test_fp32_misuse),
        cmocka_unit_test(test_fp32_state),
        cmocka_unit_test_setup_teardown(test_end_to_end_same_loss, scratch_open, scratch_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
