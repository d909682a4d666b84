/* test_fp32_ddp.c - the fp32 precision and ddp sharding plugins.
 *
 * Both are loaded the way vithost loads them (a recipe naming them, run_open,
 * the build tree's plugin folder) and driven through their vtables with the
 * hosts the run built. The parameter table is the test's own, so every
 * offset is known. A fake communicator stands in for a second rank where the
 * world-size path needs one. The last test trains with `vithost run` and
 * compares the losses with those of the test plugins. */
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
    {.name = "embed.bias", .ndim = 1, .shape = {4}, .offset = 12, .numel = 4},
};
static const vh_param_desc block_params[] = {
    {.name = "blocks.0.fc.weight", .ndim = 2, .shape = {5, 4}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 20},
    {.name = "blocks.0.norm.weight", .ndim = 1, .shape = {5}, .init = VH_INIT_KIND_ONES,
     .offset = 20, .numel = 5},
    {.name = "blocks.0.norm.bias", .ndim = 1, .shape = {5}, .offset = 25, .numel = 5},
};
static const vh_param_desc head_params[] = {
    {.name = "head.weight", .ndim = 2, .shape = {2, 5}, .flags = VH_PARAM_FLAG_DECAY,
     .offset = 0, .numel = 10},
    {.name = "head.bias", .ndim = 1, .shape = {2}, .offset = 10, .numel = 2},
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
    return (vh_precision_policy){sizeof(vh_precision_policy), VH_DTYPE_F32, VH_DTYPE_F32,
                                 VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_F32};
}

/* ---- a fake second rank --------------------------------------------------- */

/* SUM adds the peer's values (every element fake_peer_grad), MAX takes the
 * peer's flag; calls are counted. */
static struct {
    float peer_grad, peer_flag;
    int sums, maxes;
    size_t last_count;
} fake;

static vh_status fake_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op) {
    (void)c;
    if (dtype != VH_DTYPE_F32) return VH_STATUS_ERR_UNSUPPORTED;
    float *x = buf;
    fake.last_count = count;
    if (op == VH_REDUCE_OP_SUM) {
        fake.sums++;
        for (size_t i = 0; i < count; i++) x[i] += fake.peer_grad;
    } else if (op == VH_REDUCE_OP_MAX) {
        fake.maxes++;
        for (size_t i = 0; i < count; i++) x[i] = fmaxf(x[i], fake.peer_flag);
    } else {
        return VH_STATUS_ERR_UNSUPPORTED;
    }
    return VH_STATUS_OK;
}

static vh_comm_ops fake_ops;

/* ---- the run: fp32 and ddp, test plugins for the other roles -------------- */

typedef struct fx {
    vh_run run;
    const vh_sharding_vtable *sh;
    const vh_precision_vtable *pr;
    void *ddp, *fp32;
} fx;

static vh_host *host_of(fx *f, vh_role role) { return &f->run.hosts[role].pub; }
static const char *error_of(fx *f, vh_role role) { return f->run.hosts[role].error; }

/* The CPU's ops under another kind and name: the plugins must then treat the
 * buffers as device memory they reach only through copy. */
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
             "sharding: {plugin: ddp}\n"
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
        fake_ops = (vh_comm_ops){.struct_size = sizeof fake_ops, .all_reduce = fake_all_reduce};
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

static vh_status fx_setup_policy(fx *f, int32_t slots, vh_precision_policy policy) {
    vh_sharding_setup s = {.struct_size = sizeof s, .table = &table, .policy = policy,
                           .state_slots = slots};
    return f->sh->setup(f->ddp, &s);
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

static float *grads_of(fx *f, int32_t u) {
    void *g = NULL;
    if (f->sh->grads(f->ddp, u, &g) != VH_STATUS_OK)
        fail_msg("grads(%d): %s", (int)u, error_of(f, VH_ROLE_SHARDING));
    return g;
}

static const float *gather_of(fx *f, int32_t u) {
    const void *p = NULL;
    if (f->sh->gather(f->ddp, u, &p) != VH_STATUS_OK)
        fail_msg("gather(%d): %s", (int)u, error_of(f, VH_ROLE_SHARDING));
    assert_int_equal(f->sh->release(f->ddp, u), VH_STATUS_OK);
    return p;
}

static void load_pattern(fx *f) {
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float v[64];
        for (int64_t i = 0; i < units[u].numel; i++) v[i] = pattern(u, i);
        assert_int_equal(f->sh->load_unit(f->ddp, u, v), VH_STATUS_OK);
    }
}

/* ---- ddp ---------------------------------------------------------------- */

/* One flat buffer each for params and grads, unit u at the sum of the earlier
 * units' numel; load_unit lands there and store_unit reads it back. */
static void test_ddp_layout(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    load_pattern(&f);
    const float *p0 = gather_of(&f, 0);
    float *g0 = grads_of(&f, 0);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        const float *p = gather_of(&f, u);
        assert_ptr_equal(p, p0 + unit_offset(u));
        assert_ptr_equal(grads_of(&f, u), g0 + unit_offset(u));
        for (int64_t i = 0; i < units[u].numel; i++) assert_true(p[i] == pattern(u, i));
        float out[64];
        memset(out, 0, sizeof out);
        assert_int_equal(f.sh->store_unit(f.ddp, u, out), VH_STATUS_OK);
        assert_memory_equal(out, p, (size_t)units[u].numel * sizeof(float));
    }
    /* load_unit of one unit leaves its neighbours alone. */
    float ones[30];
    for (int i = 0; i < 30; i++) ones[i] = 1.0f;
    assert_int_equal(f.sh->load_unit(f.ddp, 1, ones), VH_STATUS_OK);
    assert_true(gather_of(&f, 0)[15] == pattern(0, 15));
    assert_true(gather_of(&f, 1)[29] == 1.0f);
    assert_true(gather_of(&f, 2)[0] == pattern(2, 0));
    /* Under fp32 there is nothing to refresh. */
    assert_int_equal(f.sh->refresh(f.ddp), VH_STATUS_OK);
    assert_true(gather_of(&f, 1)[0] == 1.0f);
    fx_close(&f);
}

/* Grads start at zero and zero_grads clears all of them. */
static void test_ddp_zero_grads(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    const float *g0 = grads_of(&f, 0);
    for (int64_t i = 0; i < TOTAL; i++) assert_true(g0[i] == 0.0f);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float *g = grads_of(&f, u);
        for (int64_t i = 0; i < units[u].numel; i++) g[i] = pattern(u, i);
    }
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    for (int64_t i = 0; i < TOTAL; i++) assert_true(g0[i] == 0.0f);
    fx_close(&f);
}

/* On one rank the all-reduce is the identity and nothing is averaged. */
static void test_ddp_reduce_world1(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 0);
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
        float *g = grads_of(&f, u);
        for (int64_t i = 0; i < units[u].numel; i++) g[i] = -pattern(u, i);
        assert_int_equal(f.sh->reduce(f.ddp, u), VH_STATUS_OK);
    }
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    /* grads() after reduce is refused; read them through the slices. */
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        int64_t first = units[x->unit].params[x->param].offset;
        for (int64_t i = 0; i < x->count; i++)
            assert_true(x->grad[i] == -pattern(x->unit, first + i));
    }
    /* The next step may reduce again. */
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    assert_int_equal(f.sh->reduce(f.ddp, 2), VH_STATUS_OK);
    fx_close(&f);
}

/* Two ranks (the second faked): the sum of both, divided by 2, for every
 * element of every unit, including one of several device rows (4096) and a
 * tail. */
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
    vh_sharding_setup setup = {.struct_size = sizeof setup, .table = &big_table,
                               .policy = f32_policy(), .state_slots = 0};
    assert_int_equal(f.sh->setup(f.ddp, &setup), VH_STATUS_OK);
    fake.peer_grad = 3.0f;
    assert_int_equal(f.sh->zero_grads(f.ddp), VH_STATUS_OK);
    const float *g0 = grads_of(&f, 0);
    for (int32_t u = 1; u >= 0; u--) {
        float *g = grads_of(&f, u);
        for (int64_t i = 0; i < big_units[u].numel; i++) g[i] = pattern(u, i);
        int before = fake.sums;
        assert_int_equal(f.sh->reduce(f.ddp, u), VH_STATUS_OK);
        assert_int_equal(fake.sums, before + 1);
        assert_int_equal(fake.last_count, (size_t)big_units[u].numel);
    }
    assert_int_equal(f.sh->wait(f.ddp), VH_STATUS_OK);
    for (int32_t u = 0, at = 0; u < 2; u++)
        for (int64_t i = 0; i < big_units[u].numel; i++, at++)
            assert_true(g0[at] == (pattern(u, i) + 3.0f) / 2.0f);
    fx_close(&f);
}

/* One slice per parameter, each exactly once, with the table's flags and
 * pointers into the flat buffers at unit offset + parameter offset. */
static void test_ddp_slices(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 2);
    load_pattern(&f);
    vh_param_slices sl = {NULL, -1, 0};
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    assert_int_equal(sl.count, NUM_PARAMS);
    assert_true(sl.item_size >= sizeof(vh_param_slice));
    const float *p0 = gather_of(&f, 0);
    const float *g0 = grads_of(&f, 0);
    const float *s0 = NULL, *s1 = NULL;
    int seen[NUM_UNITS][4] = {{0}};
    int64_t covered = 0;
    for (int32_t s = 0; s < sl.count; s++) {
        const vh_param_slice *x = vh_param_slices_at(&sl, s);
        assert_in_range(x->unit, 0, NUM_UNITS - 1);
        assert_in_range(x->param, 0, units[x->unit].num_params - 1);
        const vh_param_desc *pd = &units[x->unit].params[x->param];
        seen[x->unit][x->param]++;
        int64_t at = unit_offset(x->unit) + pd->offset;
        assert_int_equal(x->offset, 0);
        assert_int_equal(x->count, pd->numel);
        assert_int_equal(x->flags, pd->flags);
        assert_ptr_equal(x->master, p0 + at); /* fp32: the master is the param */
        assert_ptr_equal(x->grad, g0 + at);
        assert_true(x->master[0] == pattern(x->unit, pd->offset));
        if (!s0) {
            s0 = x->state[0] - at;
            s1 = x->state[1] - at;
        }
        assert_ptr_equal(x->state[0], s0 + at);
        assert_ptr_equal(x->state[1], s1 + at);
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
    fx_close(&f);
}

/* state_slots buffers: allocated, zeroed, distinct from each other and from
 * params and grads; none without slots. */
static void test_ddp_state_slots(void **state) {
    (void)state;
    fx f;
    fx_open(&f, VH_OPTIM_MAX_STATE_SLOTS);
    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    const vh_param_slice *first = vh_param_slices_at(&sl, 0);
    const float *bases[VH_OPTIM_MAX_STATE_SLOTS + 2] = {first->master, first->grad};
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) {
        const float *s = first->state[k];
        assert_non_null(s);
        for (int64_t i = 0; i < TOTAL; i++) assert_true(s[i] == 0.0f);
        bases[k + 2] = s;
    }
    /* No two buffers overlap. */
    for (int a = 0; a < VH_OPTIM_MAX_STATE_SLOTS + 2; a++)
        for (int b = a + 1; b < VH_OPTIM_MAX_STATE_SLOTS + 2; b++)
            assert_true(bases[a] + TOTAL <= bases[b] || bases[b] + TOTAL <= bases[a]);
    fx_close(&f);

    fx_open(&f, 0);
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++)
        for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++)
            assert_null(vh_param_slices_at(&sl, s)->state[k]);
    fx_close(&f);
}

/* bf16 parameters: separate f32 masters, gather hands out bf16 values,
 * store_unit the unrounded masters, refresh converts the masters again. */
static void test_ddp_half_params(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_precision_policy pol = f32_policy();
    pol.param_dtype = VH_DTYPE_BF16;
    assert_int_equal(fx_setup_policy(&f, 1, pol), VH_STATUS_OK);
    float v[30];
    for (int i = 0; i < 30; i++) v[i] = 1.0f + (float)i / 3.0f;
    assert_int_equal(f.sh->load_unit(f.ddp, 1, v), VH_STATUS_OK);
    const uint16_t *p = (const uint16_t *)(const void *)gather_of(&f, 1);
    const uint16_t *p0 = (const uint16_t *)(const void *)gather_of(&f, 0);
    assert_ptr_equal(p, p0 + unit_offset(1));
    for (int i = 0; i < 30; i++) assert_int_equal(p[i], vh_f32_to_bf16(v[i]));
    float out[30];
    assert_int_equal(f.sh->store_unit(f.ddp, 1, out), VH_STATUS_OK);
    assert_memory_equal(out, v, sizeof v);

    vh_param_slices sl;
    assert_int_equal(f.sh->slices(f.ddp, &sl), VH_STATUS_OK);
    for (int32_t s = 0; s < sl.count; s++) {
        vh_param_slice *x = vh_param_slices_at(&sl, s);
        assert_ptr_not_equal((const void *)x->master, (const void *)p);
        if (x->unit == 1 && x->param == 2) x->master[0] = 42.5f; /* the optimizer's step */
    }
    assert_int_equal(p[25], vh_f32_to_bf16(v[25]));
    assert_int_equal(f.sh->refresh(f.ddp), VH_STATUS_OK);
    assert_int_equal(p[25], vh_f32_to_bf16(42.5f));
    assert_int_equal(p[24], vh_f32_to_bf16(v[24]));
    fx_close(&f);
}

/* Policies ddp cannot serve are refused as unsupported, with the reason. */
static void test_ddp_refuses_policies(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_precision_policy pol = f32_policy();
    pol.grad_dtype = VH_DTYPE_F16;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "amp/fp16");
    pol = f32_policy();
    pol.comm_dtype = VH_DTYPE_BF16;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "bf16 on the wire");
    pol = f32_policy();
    pol.master_dtype = VH_DTYPE_F16;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "master copies must be f32");
    pol = f32_policy();
    pol.param_dtype = VH_DTYPE_I32;
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 0, pol), VH_STATUS_ERR_UNSUPPORTED,
                 "i32");
    expect_error(&f, VH_ROLE_SHARDING, fx_setup_policy(&f, 5, f32_policy()),
                 VH_STATUS_ERR_INVALID_ARG, "state slots");
    /* A refused setup leaves the plugin ready for a good one. */
    assert_int_equal(fx_setup_policy(&f, 1, f32_policy()), VH_STATUS_OK);
    fx_close(&f);
}

/* Inconsistent tables are refused before anything is allocated. */
static void test_ddp_refuses_bad_tables(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 1);
    vh_param_desc bad[2] = {embed_params[0], embed_params[1]};
    bad[1].offset = 11; /* overlaps the weight */
    vh_unit_desc bad_units[3] = {units[0], units[1], units[2]};
    bad_units[0].params = bad;
    vh_param_table t = {bad_units, 3, TOTAL};
    vh_sharding_setup s = {.struct_size = sizeof s, .table = &t, .policy = f32_policy()};
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
    s.struct_size = 4;
    expect_error(&f, VH_ROLE_SHARDING, f.sh->setup(f.ddp, &s), VH_STATUS_ERR_INVALID_ARG,
                 "too small");
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
    expect_error(&f, R, f.sh->gather(f.ddp, 0, &p), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->zero_grads(f.ddp), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->slices(f.ddp, &sl), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->wait(f.ddp), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->refresh(f.ddp), VH_STATUS_ERR_INVALID_ARG, "before setup");
    expect_error(&f, R, f.sh->load_unit(f.ddp, 0, v), VH_STATUS_ERR_INVALID_ARG, "before setup");
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
    assert_int_equal(f.pr->policy(f.fp32, &pol), VH_STATUS_OK);
    assert_int_equal(pol.struct_size, sizeof pol);
    assert_int_equal(pol.param_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.compute_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.grad_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.comm_dtype, VH_DTYPE_F32);
    assert_int_equal(pol.master_dtype, VH_DTYPE_F32);
    assert_true(f.pr->loss_scale(f.fp32) == 1.0f);
    assert_int_equal(f.pr->policy(f.fp32, NULL), VH_STATUS_ERR_INVALID_ARG);
    fx_close(&f);
}

/* Writes v at one element of parameter `param` of unit `unit` in the grads,
 * runs unscale_and_check on ddp's slices and returns found_inf. The grads are
 * otherwise clean, and must come out unchanged (the scale is 1). */
static int found_inf_with(fx *f, int32_t unit, int64_t at, float v) {
    assert_int_equal(f->sh->zero_grads(f->ddp), VH_STATUS_OK);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float *g = grads_of(f, u);
        for (int64_t i = 0; i < units[u].numel; i++) g[i] = pattern(u, i) - 1500.0f;
    }
    if (unit >= 0) grads_of(f, unit)[at] = v;
    vh_param_slices sl;
    assert_int_equal(f->sh->slices(f->ddp, &sl), VH_STATUS_OK);
    int found = -1;
    vh_status st = f->pr->unscale_and_check(f->fp32, &sl, &found);
    if (st != VH_STATUS_OK) fail_msg("unscale_and_check: %s", error_of(f, VH_ROLE_PRECISION));
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        const float *g = grads_of(f, u);
        for (int64_t i = 0; i < units[u].numel; i++) {
            if (u == unit && i == at) continue;
            assert_true(g[i] == pattern(u, i) - 1500.0f);
        }
    }
    assert_int_equal(f->pr->update(f->fp32, found), VH_STATUS_OK);
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
    vh_param_slices sl = {&one, 1, sizeof one};
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    big[4999] = NAN;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    /* An empty list: nothing to scan, still agreed. */
    sl.count = 0;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    fx_close(&f);
}

/* On a device that is not the CPU the grads are scanned through a host
 * buffer, in chunks: the Inf is found in the second chunk of a long slice. */
static void test_fp32_found_inf_staged(void **state) {
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
    vh_param_slices sl = {two, 2, sizeof two[0]};
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    big[N - 2] = -INFINITY;
    assert_int_equal(f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    free(big);
    fx_close(&f);
}

/* Another rank's overflow skips this rank's step too: one MAX all-reduce. */
static void test_fp32_found_inf_agreed(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, NULL, 2);
    assert_int_equal(fx_setup_policy(&f, 0, f32_policy()), VH_STATUS_OK);
    fake.peer_flag = 0.0f;
    assert_int_equal(found_inf_with(&f, -1, 0, 0.0f), 0);
    assert_int_equal(fake.maxes, 1);
    assert_int_equal(fake.last_count, 1);
    fake.peer_flag = 1.0f;
    assert_int_equal(found_inf_with(&f, -1, 0, 0.0f), 1);
    assert_int_equal(fake.maxes, 2);
    fake.peer_flag = 0.0f;
    assert_int_equal(found_inf_with(&f, 0, 3, INFINITY), 1);
    assert_int_equal(fake.maxes, 3);
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
    assert_int_equal(fake.maxes, 0);
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
    vh_param_slices sl = {&one, 1, sizeof one};
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, &sl, &found), VH_STATUS_ERR_INVALID_ARG,
                 "no grad");
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, NULL, &found),
                 VH_STATUS_ERR_INVALID_ARG, "NULL");
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, &sl, NULL), VH_STATUS_ERR_INVALID_ARG,
                 "NULL");
    sl.item_size = 8;
    expect_error(&f, R, f.pr->unscale_and_check(f.fp32, &sl, &found),
                 VH_STATUS_ERR_INVALID_ARG, "slices of 8 bytes");
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
        cmocka_unit_test(test_ddp_slices),
        cmocka_unit_test(test_ddp_state_slots),
        cmocka_unit_test(test_ddp_half_params),
        cmocka_unit_test(test_ddp_refuses_policies),
        cmocka_unit_test(test_ddp_refuses_bad_tables),
        cmocka_unit_test(test_ddp_misuse),
        cmocka_unit_test(test_fp32_policy),
        cmocka_unit_test(test_fp32_found_inf),
        cmocka_unit_test(test_fp32_found_inf_staged),
        cmocka_unit_test(test_fp32_found_inf_agreed),
        cmocka_unit_test(test_fp32_check_finite_off),
        cmocka_unit_test(test_fp32_misuse),
        cmocka_unit_test(test_fp32_state),
        cmocka_unit_test_setup_teardown(test_end_to_end_same_loss, scratch_open, scratch_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
