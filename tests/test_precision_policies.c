/* test_precision_policies.c - mixed and half precision: the SDK's loss
 * scaler, the amp and fp16 precision plugins with ddp and mta, mta on
 * 16-bit masters, and loss-scaled runs of `vithost run` end to end.
 *
 * The plugins are loaded as vithost loads them (a recipe naming them,
 * run_open_text, the build tree's plugin folder) and driven through their
 * vtables in the host's order of a step (step.c), with the gradients
 * written by the test in the policy's layout, so a test knows every value:
 * an Inf injected into one gradient must skip exactly that step, leave the
 * parameters and the optimizer state as they were, byte for byte, and halve
 * the scale. */
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
#include "vithost/vh_loss_scaler.h"
#include "vithost/vh_runtime.h"

/* ---- the SDK's loss scaler ---------------------------------------------------- */

static vh_loss_scaler scaler_with(double init, int64_t interval, double lo, double hi) {
    vh_loss_scaler_config c = {.struct_size = sizeof c, .init_scale = init,
                               .growth_interval = interval, .min_scale = lo, .max_scale = hi};
    vh_loss_scaler s;
    assert_int_equal(vh_loss_scaler_init(&s, &c, NULL), VH_STATUS_OK);
    return s;
}

/* A zero config is GradScaler's defaults, with min 1 and max 2^24. */
static void test_scaler_defaults(void **state) {
    (void)state;
    vh_loss_scaler s;
    assert_int_equal(vh_loss_scaler_init(&s, NULL, NULL), VH_STATUS_OK);
    assert_true(s.scale == 65536.0f);
    assert_true(s.growth_factor == 2.0 && s.backoff_factor == 0.5);
    assert_int_equal(s.growth_interval, 2000);
    assert_true(s.min_scale == 1.0 && s.max_scale == 16777216.0);
    assert_int_equal(s.fixed, 0);
    assert_int_equal(s.good_steps + s.skipped + s.steps, 0);
    /* An older, shorter config: what it lacks reads as the default. */
    vh_loss_scaler_config c = {.struct_size = offsetof(vh_loss_scaler_config, init_scale) +
                                              sizeof(double),
                               .init_scale = 1024.0, .growth_factor = 4.0};
    assert_int_equal(vh_loss_scaler_init(&s, &c, NULL), VH_STATUS_OK);
    assert_true(s.scale == 1024.0f);
    assert_true(s.growth_factor == 2.0);
}

/* An overflow halves the scale, restarts the counter and counts a skip;
 * the scale never goes below min_scale. */
static void test_scaler_backoff(void **state) {
    (void)state;
    vh_loss_scaler s = scaler_with(8.0, 3, 1.0, 1024.0);
    vh_loss_scaler_update(&s, 0);
    vh_loss_scaler_update(&s, 0);
    assert_int_equal(s.good_steps, 2);
    vh_loss_scaler_update(&s, 1);
    assert_true(s.scale == 4.0f);
    assert_int_equal(s.good_steps, 0);
    assert_int_equal(s.skipped, 1);
    assert_int_equal(s.steps, 3);
    vh_loss_scaler_update(&s, 1);
    vh_loss_scaler_update(&s, 1);
    assert_true(s.scale == 1.0f);
    vh_loss_scaler_update(&s, 1); /* at the floor: stays */
    assert_true(s.scale == 1.0f);
    assert_int_equal(s.skipped, 4);
    assert_int_equal(s.steps, 6);
    /* A floor that is not a power of two is met exactly. */
    s = scaler_with(1.0, 3, 0.3, 1024.0);
    vh_loss_scaler_update(&s, 1);
    assert_true(s.scale == 0.5f);
    vh_loss_scaler_update(&s, 1);
    assert_true(s.scale == 0.3f);
}

/* Growth exactly after growth_interval good steps in a row, counter back
 * to 0; an overflow in between starts the count again; max_scale caps. */
static void test_scaler_growth(void **state) {
    (void)state;
    vh_loss_scaler s = scaler_with(16.0, 3, 1.0, 64.0);
    vh_loss_scaler_update(&s, 0);
    vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 16.0f);
    vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 32.0f);
    assert_int_equal(s.good_steps, 0);
    vh_loss_scaler_update(&s, 0);
    vh_loss_scaler_update(&s, 0);
    vh_loss_scaler_update(&s, 1); /* two good, then an overflow */
    assert_true(s.scale == 16.0f);
    vh_loss_scaler_update(&s, 0);
    vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 16.0f); /* the two before the overflow do not count */
    vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 32.0f);
    for (int i = 0; i < 3; i++) vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 64.0f);
    for (int i = 0; i < 3; i++) vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 64.0f); /* capped, counter restarted */
    assert_int_equal(s.good_steps, 0);
    assert_int_equal(s.skipped, 1);
    assert_int_equal(s.steps, 15);
    /* Interval 1: every good step grows (GradScaler's rule too). */
    s = scaler_with(2.0, 1, 1.0, 1e6);
    vh_loss_scaler_update(&s, 0);
    vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 8.0f);
}

/* A fixed scaler keeps its scale and only counts. */
static void test_scaler_fixed(void **state) {
    (void)state;
    vh_loss_scaler_config c = {.struct_size = sizeof c, .fixed = 1, .init_scale = 0.25,
                               .growth_interval = 1};
    vh_loss_scaler s;
    assert_int_equal(vh_loss_scaler_init(&s, &c, NULL), VH_STATUS_OK); /* below min: fixed */
    vh_loss_scaler_update(&s, 0);
    vh_loss_scaler_update(&s, 1);
    vh_loss_scaler_update(&s, 0);
    assert_true(s.scale == 0.25f);
    assert_int_equal(s.skipped, 1);
    assert_int_equal(s.steps, 3);
    assert_int_equal(s.good_steps, 1);
}

/* The reciprocal is taken in double and rounded once. */
static void test_scaler_unscale_factor(void **state) {
    (void)state;
    vh_loss_scaler s = scaler_with(65536.0, 10, 1.0, 1e9);
    assert_true(vh_loss_scaler_unscale_factor(&s) == 1.0f / 65536.0f);
    s = scaler_with(3.0, 10, 1.0, 1e9);
    assert_true(vh_loss_scaler_unscale_factor(&s) == (float)(1.0 / 3.0));
    assert_true(vh_loss_scaler_scale(&s) == 3.0f);
    assert_true(vh_loss_scaler_scale(NULL) == 1.0f);
}

static void test_scaler_refuses_configs(void **state) {
    (void)state;
    static const struct {
        vh_loss_scaler_config c;
    } bad[] = {
        {{.growth_factor = 1.0}},
        {{.growth_factor = NAN}},
        {{.backoff_factor = 1.0}},
        {{.backoff_factor = -0.5}},
        {{.growth_interval = -1}},
        {{.min_scale = 1e-40}},
        {{.min_scale = 4.0, .max_scale = 2.0}},
        {{.max_scale = 1e39}},
        {{.init_scale = 1e8}},            /* above the default max 2^24 */
        {{.init_scale = 0.5}},            /* below the default min 1 */
        {{.fixed = 1, .init_scale = -1.0}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        vh_loss_scaler_config c = bad[i].c;
        c.struct_size = sizeof c;
        vh_loss_scaler s;
        if (vh_loss_scaler_init(&s, &c, NULL) != VH_STATUS_ERR_CONFIG)
            fail_msg("config %zu was accepted", i);
    }
}

/* Save -> load -> save is the same blob, bit for bit; the loaded scaler
 * goes on exactly as the saved one. */
static void test_scaler_state_round_trip(void **state) {
    (void)state;
    vh_loss_scaler a = scaler_with(1024.0, 5, 1.0, 1e6);
    int pattern[] = {0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0};
    for (size_t i = 0; i < sizeof pattern / sizeof pattern[0]; i++)
        vh_loss_scaler_update(&a, pattern[i]);
    unsigned char blob[VH_LOSS_SCALER_STATE_BYTES], again[VH_LOSS_SCALER_STATE_BYTES];
    assert_int_equal(vh_loss_scaler_state_save(&a, blob, sizeof blob, NULL), VH_STATUS_OK);
    vh_loss_scaler b = scaler_with(1024.0, 5, 1.0, 1e6);
    assert_int_equal(vh_loss_scaler_state_load(&b, blob, sizeof blob, NULL), VH_STATUS_OK);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(vh_loss_scaler_state_save(&b, again, sizeof again, NULL), VH_STATUS_OK);
    assert_memory_equal(blob, again, sizeof blob);
    for (int i = 0; i < 7; i++) {
        vh_loss_scaler_update(&a, i == 4);
        vh_loss_scaler_update(&b, i == 4);
    }
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(vh_loss_scaler_state_save(&a, blob, sizeof blob - 1, NULL),
                     VH_STATUS_ERR_INVALID_ARG);
}

/* Wrong tag, size, version or values: refused, and nothing changes. */
static void test_scaler_state_refused(void **state) {
    (void)state;
    vh_loss_scaler a = scaler_with(1024.0, 5, 1.0, 1e6);
    vh_loss_scaler_update(&a, 1);
    unsigned char blob[VH_LOSS_SCALER_STATE_BYTES], bad[VH_LOSS_SCALER_STATE_BYTES];
    assert_int_equal(vh_loss_scaler_state_save(&a, blob, sizeof blob, NULL), VH_STATUS_OK);
    vh_loss_scaler b = scaler_with(4.0, 2, 1.0, 8.0), before = b;

    memcpy(bad, blob, sizeof bad);
    bad[0] ^= 1; /* tag */
    assert_int_equal(vh_loss_scaler_state_load(&b, bad, sizeof bad, NULL), VH_STATUS_ERR_FORMAT);
    assert_int_equal(vh_loss_scaler_state_load(&b, blob, sizeof blob - 8, NULL),
                     VH_STATUS_ERR_FORMAT);
    assert_int_equal(vh_loss_scaler_state_load(&b, NULL, 0, NULL), VH_STATUS_ERR_FORMAT);
    memcpy(bad, blob, sizeof bad);
    uint32_t version = 2;
    memcpy(bad + 4, &version, sizeof version);
    assert_int_equal(vh_loss_scaler_state_load(&b, bad, sizeof bad, NULL), VH_STATUS_ERR_FORMAT);
    memcpy(bad, blob, sizeof bad);
    float nan_scale = NAN;
    memcpy(bad + 8, &nan_scale, sizeof nan_scale);
    assert_int_equal(vh_loss_scaler_state_load(&b, bad, sizeof bad, NULL), VH_STATUS_ERR_FORMAT);
    memcpy(bad, blob, sizeof bad);
    int64_t negative = -3;
    memcpy(bad + 24, &negative, sizeof negative); /* good_steps */
    assert_int_equal(vh_loss_scaler_state_load(&b, bad, sizeof bad, NULL), VH_STATUS_ERR_FORMAT);
    assert_memory_equal(&b, &before, sizeof b);

    /* A blob of another run's bounds: the scale is clamped into this run's. */
    assert_int_equal(vh_loss_scaler_state_load(&b, blob, sizeof blob, NULL), VH_STATUS_OK);
    assert_true(b.scale == 8.0f);
    assert_int_equal(b.skipped, 1);
    assert_int_equal(b.growth_interval, 2);
}

/* ---- the plugins: amp and fp16 with ddp and mta ----------------------------------- */

/* 3 units, 7 parameters, one of them a layer norm's (kept in f32 by amp). */
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
#define MAX_UNIT 30

/* Parameter values: exact in f16 and bf16 (multiples of 1/8 below 16). */
static float value_of(int32_t u, int64_t i) {
    return (float)((u * 7 + (int)i * 3) % 41 - 20) / 8.0f;
}
/* Gradient values, before scaling: exact in f16 and bf16 too. */
static float grad_of(int32_t u, int64_t i, int step) {
    return (float)(((u + 1) * 5 + (int)i * 11 + step * 3) % 23 - 11) / 64.0f;
}

typedef struct fx {
    vh_run run;
    const vh_precision_vtable *pr;
    const vh_sharding_vtable *sh;
    const vh_optim_vtable *op;
    void *prec, *ddp, *mta;
    vh_precision_policy policy;
    vh_unit_layout grad_layout[NUM_UNITS], param_layout[NUM_UNITS];
    vh_param_slices slices;
    int64_t step;
    uint32_t caps; /* the optimizer caps ddp was set up with (fx_caps) */
} fx;

static const char *error_of(fx *f, vh_role role) { return f->run.hosts[role].error; }
static vh_host *host_of(fx *f, vh_role role) { return &f->run.hosts[role].pub; }

/* The sharding plugin fx_open sets up, and the optimizer caps it hands it
 * (the host hands mta's: VH_OPTIM_CAP_HALF_GRADS; 0 is an ABI 2.8 host's). */
static const char *fx_sharding = "ddp";
static uint32_t fx_caps = 0;
/* The setup's and the policy's struct_size, 0: this SDK's (an ABI 2.8
 * host's setup, or a 2.8 precision plugin's policy, is shorter). */
static uint32_t fx_setup_size = 0, fx_policy_size = 0;

static vh_status fx_open_run(vh_run *run, const char *precision, const char *optim_keys,
                             vh_diag *d) {
    char recipe[2048];
    snprintf(recipe, sizeof recipe,
             "run: {batch_size: 4}\n"
             "model: {plugin: test_model}\n"
             "precision: %s\n"
             "sharding: {plugin: %s}\n"
             "optim: {plugin: mta, lr: 0.01, weight_decay: 0.1%s%s}\n"
             "data: {plugin: test_data}\n",
             precision, fx_sharding, optim_keys ? ", " : "", optim_keys ? optim_keys : "");
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    vh_run_options opts = {.out = stdout};
    return run_open_text(run, "precision.yaml", recipe, &opts, d);
}

/* Creates the precision plugin only; returns create's status. */
static vh_status fx_try_precision(fx *f, const char *precision) {
    memset(f, 0, sizeof *f);
    vh_diag d = {{0}};
    if (fx_open_run(&f->run, precision, NULL, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    f->pr = f->run.plugins[VH_ROLE_PRECISION].desc->vtable;
    return f->pr->create(host_of(f, VH_ROLE_PRECISION), &f->prec);
}

static void fx_policy(fx *f) {
    memset(&f->policy, 0, sizeof f->policy);
    f->policy.struct_size = sizeof f->policy;
    assert_int_equal(f->pr->policy(f->prec, &f->policy), VH_STATUS_OK);
}

/* A second rank, faked: it holds the same gradients (AVG leaves them, SUM
 * of f32 doubles them) and its overflow flag is fake.peer_flag (MAX). Every
 * collective has finished when it starts. */
static struct {
    float peer_flag;
    int avgs, sums;
} fake;

static vh_status fake_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)stream;
    *req = NULL;
    if (op == VH_REDUCE_OP_AVG) {
        fake.avgs++;
        return VH_STATUS_OK;
    }
    if (dtype != VH_DTYPE_F32) return VH_STATUS_ERR_UNSUPPORTED;
    float *x = buf;
    if (op == VH_REDUCE_OP_SUM) {
        /* [flag] (replicas) or [flag, sum of squares] (shards): the peer
         * adds its flag and, for shards, the same sum of squares again */
        fake.sums++;
        x[0] += fake.peer_flag;
        for (size_t i = 1; i < count; i++) x[i] *= 2.0f;
    } else {
        return VH_STATUS_ERR_UNSUPPORTED;
    }
    return VH_STATUS_OK;
}

static vh_status fake_wait(vh_comm *c, vh_comm_request *req) {
    (void)c, (void)req;
    return VH_STATUS_OK;
}

static vh_comm_ops fake_ops;
static int32_t fx_world = 1; /* 2: fx_open puts the fake second rank in */

/* The whole set: the precision plugin, ddp set up with its policy, mta
 * (AdamW), the values loaded. */
static void fx_open(fx *f, const char *precision, const char *optim_keys) {
    memset(f, 0, sizeof *f);
    vh_diag d = {{0}};
    if (fx_open_run(&f->run, precision, optim_keys, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    if (fx_world > 1) {
        memset(&fake, 0, sizeof fake);
        fake_ops = (vh_comm_ops){.struct_size = sizeof fake_ops,
                                 .all_reduce_start = fake_all_reduce,
                                 .wait = fake_wait};
        f->run.comm.ops = &fake_ops;
        f->run.comm.world_size = fx_world;
        f->run.comm.backend = "fake";
    }
    f->pr = f->run.plugins[VH_ROLE_PRECISION].desc->vtable;
    f->sh = f->run.plugins[VH_ROLE_SHARDING].desc->vtable;
    f->op = f->run.plugins[VH_ROLE_OPTIM].desc->vtable;
    if (f->pr->create(host_of(f, VH_ROLE_PRECISION), &f->prec) != VH_STATUS_OK)
        fail_msg("precision create: %s", error_of(f, VH_ROLE_PRECISION));
    vh_optim_setup os = {.struct_size = sizeof os, .total_steps = 100};
    if (f->op->create(host_of(f, VH_ROLE_OPTIM), &os, &f->mta) != VH_STATUS_OK)
        fail_msg("mta create: %s", error_of(f, VH_ROLE_OPTIM));
    if (f->sh->create(host_of(f, VH_ROLE_SHARDING), &f->ddp) != VH_STATUS_OK)
        fail_msg("ddp create: %s", error_of(f, VH_ROLE_SHARDING));
    fx_policy(f);
    if (fx_policy_size) f->policy.struct_size = fx_policy_size;
    vh_sharding_setup s = {.struct_size = fx_setup_size ? fx_setup_size : sizeof s,
                           .table = &table, .policy = &f->policy,
                           .state_slots = f->op->state_slots(f->mta), .optim_caps = fx_caps};
    /* what the host does: refresh_updated only where it handed the caps over */
    f->caps = s.struct_size > offsetof(vh_sharding_setup, optim_caps) ? fx_caps : 0;
    if (f->sh->setup(f->ddp, &s) != VH_STATUS_OK)
        fail_msg("ddp setup: %s", error_of(f, VH_ROLE_SHARDING));
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        assert_int_equal(vh_unit_layout_init(&f->grad_layout[u], &units[u], vh_policy_grad_dtype,
                                             &f->policy),
                         VH_STATUS_OK);
        assert_int_equal(vh_unit_layout_init(&f->param_layout[u], &units[u],
                                             vh_policy_param_dtype, &f->policy),
                         VH_STATUS_OK);
        float v[MAX_UNIT];
        for (int64_t i = 0; i < units[u].numel; i++) v[i] = value_of(u, i);
        assert_int_equal(f->sh->load_unit(f->ddp, u, v), VH_STATUS_OK);
    }
    assert_int_equal(f->sh->slices(f->ddp, &f->slices), VH_STATUS_OK);
}

static void fx_close(fx *f) {
    if (f->ddp) f->sh->destroy(f->ddp);
    if (f->mta) f->op->destroy(f->mta);
    if (f->prec) f->pr->destroy(f->prec);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        vh_unit_layout_free(&f->grad_layout[u]);
        vh_unit_layout_free(&f->param_layout[u]);
    }
    run_close(&f->run);
}

/* Element i of unit u in a buffer of layout l, as f32 (from f32, f16, bf16). */
static void *elem_ptr(void *buf, const vh_unit_layout *l, int32_t u, int64_t i) {
    for (int32_t p = 0; p < units[u].num_params; p++) {
        const vh_param_desc *pd = &units[u].params[p];
        if (i < pd->offset + pd->numel)
            return (char *)buf + l->offsets[p] +
                   (size_t)(i - pd->offset) * vh_dtype_size(l->dtypes[p]);
    }
    fail_msg("element %lld is past unit %s", (long long)i, units[u].name);
    return NULL;
}
static vh_dtype elem_dtype(const vh_unit_layout *l, int32_t u, int64_t i) {
    for (int32_t p = 0; p < units[u].num_params; p++)
        if (i < units[u].params[p].offset + units[u].params[p].numel) return l->dtypes[p];
    return VH_DTYPE_F32;
}
static void put(void *at, vh_dtype t, float x) {
    if (t == VH_DTYPE_F32) memcpy(at, &x, sizeof x);
    else {
        uint16_t h = t == VH_DTYPE_F16 ? vh_f32_to_f16(x) : vh_f32_to_bf16(x);
        memcpy(at, &h, sizeof h);
    }
}

/* What backward leaves: the gradients of `step` times the loss scale, in
 * the policy's layout and dtypes, with element (inf_unit, inf_elem) set to
 * +Inf when inf_unit >= 0; units reduced back to front, then wait. */
static void fx_backward(fx *f, int step, int32_t inf_unit, int64_t inf_elem) {
    float scale = f->pr->loss_scale(f->prec);
    assert_int_equal(f->sh->zero_grads(f->ddp), VH_STATUS_OK);
    for (int32_t u = NUM_UNITS - 1; u >= 0; u--) {
        void *g = NULL;
        assert_int_equal(f->sh->grads(f->ddp, u, &g), VH_STATUS_OK);
        for (int64_t i = 0; i < units[u].numel; i++)
            put(elem_ptr(g, &f->grad_layout[u], u, i), elem_dtype(&f->grad_layout[u], u, i),
                u == inf_unit && i == inf_elem ? INFINITY : grad_of(u, i, step) * scale);
        assert_int_equal(f->sh->reduce(f->ddp, u), VH_STATUS_OK);
    }
    assert_int_equal(f->sh->wait(f->ddp), VH_STATUS_OK);
}

/* An optimizer update as the host makes it (host/core/step.c): the rate,
 * weight decay and clipping limit of the optim section's shared keys for
 * args->step (total: the run's steps); slices and the gradient sum are the
 * caller's. */
static vh_status host_update(vh_host *host, const vh_optim_vtable *vt, void *self,
                             vh_optim_step_args *args, int64_t total) {
    vh_optim_schedule sched = {.struct_size = sizeof sched};
    vh_status st = vh_optim_schedule_read(host, total, &sched);
    if (st != VH_STATUS_OK) return st;
    args->struct_size = sizeof *args;
    vh_optim_schedule_args(&sched, args->step, args);
    return vt->update(self, args, NULL);
}

/* The host's step after backward (host/step.c): check, update or skip,
 * refresh (refresh_updated after an optimizer that wrote the compute
 * copies), precision update. Returns found_inf. */
static int fx_finish_step(fx *f) {
    int found = -1;
    if (f->pr->unscale_and_check(f->prec, &f->slices, &found) != VH_STATUS_OK)
        fail_msg("unscale_and_check: %s", error_of(f, VH_ROLE_PRECISION));
    if (!found) {
        double sq = 0.0;
        int has = 0;
        assert_int_equal(f->pr->grad_sum_sq(f->prec, &sq, &has), VH_STATUS_OK);
        vh_optim_step_args a = {.slices = &f->slices, .step = f->step,
                                .has_grad_sum_sq = has, .grad_sum_sq = sq};
        if (host_update(host_of(f, VH_ROLE_OPTIM), f->op, f->mta, &a, 100) != VH_STATUS_OK)
            fail_msg("mta update: %s", error_of(f, VH_ROLE_OPTIM));
        if (f->caps & VH_OPTIM_CAP_WRITES_COMPUTE)
            assert_int_equal(f->sh->refresh_updated(f->ddp), VH_STATUS_OK);
        else
            assert_int_equal(f->sh->refresh(f->ddp), VH_STATUS_OK);
    }
    assert_int_equal(f->pr->update(f->prec, found), VH_STATUS_OK);
    f->step++;
    return found;
}

static int fx_step(fx *f, int32_t inf_unit, int64_t inf_elem) {
    fx_backward(f, (int)f->step, inf_unit, inf_elem);
    return fx_finish_step(f);
}

/* Everything a skipped step must leave alone, as bytes: the compute
 * copies, the f32 masters (store_unit), every state slot, mta's scalars. */
typedef struct snapshot {
    unsigned char params[NUM_UNITS][512];
    float masters[NUM_UNITS][MAX_UNIT];
    float state[8][VH_OPTIM_MAX_STATE_SLOTS][MAX_UNIT];
    unsigned char optim[64];
} snapshot;

static void take(fx *f, snapshot *s) {
    memset(s, 0, sizeof *s);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        const void *p = NULL;
        assert_int_equal(f->sh->gather(f->ddp, u, &p), VH_STATUS_OK);
        assert_true(f->param_layout[u].bytes <= sizeof s->params[u]);
        memcpy(s->params[u], p, f->param_layout[u].bytes);
        assert_int_equal(f->sh->release(f->ddp, u), VH_STATUS_OK);
        assert_int_equal(f->sh->store_unit(f->ddp, u, s->masters[u]), VH_STATUS_OK);
    }
    assert_true(f->slices.count <= 8);
    for (int32_t i = 0; i < f->slices.count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&f->slices, i);
        for (int32_t k = 0; k < f->op->state_slots(f->mta); k++)
            memcpy(s->state[i][k], sl->state[k], (size_t)sl->count * sizeof(float));
    }
    size_t n = 0;
    assert_int_equal(f->op->state_size(f->mta, &n), VH_STATUS_OK);
    assert_true(n <= sizeof s->optim);
    assert_int_equal(f->op->state_save(f->mta, s->optim, n), VH_STATUS_OK);
}

static void test_amp_policies(void **state) {
    (void)state;
    fx f;
    /* bf16: no loss scale, bf16 wire, layer norms apart */
    assert_int_equal(fx_try_precision(&f, "{plugin: amp}"), VH_STATUS_OK);
    fx_policy(&f);
    assert_int_equal(f.policy.param_dtype, VH_DTYPE_BF16);
    assert_int_equal(f.policy.compute_dtype, VH_DTYPE_BF16);
    assert_int_equal(f.policy.grad_dtype, VH_DTYPE_BF16);
    assert_int_equal(f.policy.comm_dtype, VH_DTYPE_BF16);
    assert_int_equal(f.policy.master_dtype, VH_DTYPE_F32);
    assert_int_equal(f.policy.state_dtype, VH_DTYPE_F32);
    assert_int_equal(f.policy.fp32_param_flags, VH_PARAM_FLAG_NORM);
    assert_int_equal(f.policy.master_weights, 1);
    assert_true(f.pr->loss_scale(f.prec) == 1.0f);
    assert_int_equal(f.policy.unit_loss_scale, 1);
    assert_int_equal(vh_policy_param_dtype(&f.policy, VH_PARAM_FLAG_NORM), VH_DTYPE_F32);
    assert_int_equal(vh_policy_grad_dtype(&f.policy, VH_PARAM_FLAG_DECAY), VH_DTYPE_BF16);
    f.pr->destroy(f.prec);
    run_close(&f.run);

    /* fp16: dynamic scale, f32 wire */
    assert_int_equal(fx_try_precision(&f, "{plugin: amp, dtype: fp16, layernorm_fp32: false}"),
                     VH_STATUS_OK);
    fx_policy(&f);
    assert_int_equal(f.policy.param_dtype, VH_DTYPE_F16);
    assert_int_equal(f.policy.grad_dtype, VH_DTYPE_F16);
    assert_int_equal(f.policy.comm_dtype, VH_DTYPE_F32);
    assert_int_equal(f.policy.fp32_param_flags, 0);
    assert_true(f.pr->loss_scale(f.prec) == 65536.0f);
    assert_int_equal(f.policy.unit_loss_scale, 0);
    f.pr->destroy(f.prec);
    run_close(&f.run);

    /* an older, shorter policy struct gets only what it covers */
    assert_int_equal(fx_try_precision(&f, "{plugin: amp, dtype: fp16, reduce_dtype: fp16}"),
                     VH_STATUS_OK);
    vh_precision_policy old;
    memset(&old, 0xee, sizeof old);
    old.struct_size = offsetof(vh_precision_policy, fp32_param_flags);
    assert_int_equal(f.pr->policy(f.prec, &old), VH_STATUS_OK);
    assert_int_equal(old.comm_dtype, VH_DTYPE_F16);
    assert_int_equal(old.state_dtype, VH_DTYPE_F32);
    assert_int_equal(old.fp32_param_flags, 0xeeeeeeeeu);
    f.pr->destroy(f.prec);
    run_close(&f.run);

    /* bf16 with loss scaling asked for; static keeps its scale */
    assert_int_equal(fx_try_precision(&f, "{plugin: amp, loss_scaling: static, init_scale: 128}"),
                     VH_STATUS_OK);
    fx_policy(&f);
    assert_int_equal(f.policy.unit_loss_scale, 0);
    assert_true(f.pr->loss_scale(f.prec) == 128.0f);
    assert_int_equal(f.pr->update(f.prec, 1), VH_STATUS_OK);
    assert_true(f.pr->loss_scale(f.prec) == 128.0f);
    f.pr->destroy(f.prec);
    run_close(&f.run);

    /* refused: a wire of the other 16-bit format, a bad scaler value */
    assert_int_equal(fx_try_precision(&f, "{plugin: amp, dtype: bf16, reduce_dtype: fp16}"),
                     VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(error_of(&f, VH_ROLE_PRECISION), "reduce_dtype"));
    run_close(&f.run);
    assert_int_equal(fx_try_precision(&f, "{plugin: amp, dtype: fp16, growth_factor: 1}"),
                     VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(error_of(&f, VH_ROLE_PRECISION), "growth_factor"));
    run_close(&f.run);
    assert_int_equal(fx_try_precision(&f, "{plugin: amp, dtype: fp16, init_scale: 0.5}"),
                     VH_STATUS_ERR_CONFIG);
    assert_non_null(strstr(error_of(&f, VH_ROLE_PRECISION), "init_scale"));
    run_close(&f.run);
}

static void test_fp16_policies(void **state) {
    (void)state;
    fx f;
    assert_int_equal(fx_try_precision(&f, "{plugin: fp16}"), VH_STATUS_OK);
    fx_policy(&f);
    assert_int_equal(f.policy.param_dtype, VH_DTYPE_F16);
    assert_int_equal(f.policy.compute_dtype, VH_DTYPE_F16);
    assert_int_equal(f.policy.grad_dtype, VH_DTYPE_F16);
    assert_int_equal(f.policy.comm_dtype, VH_DTYPE_F16);
    assert_int_equal(f.policy.master_dtype, VH_DTYPE_F16);
    assert_int_equal(f.policy.state_dtype, VH_DTYPE_F32);
    assert_int_equal(f.policy.fp32_param_flags, 0);
    assert_int_equal(f.policy.master_weights, 0);
    assert_true(f.pr->loss_scale(f.prec) == 65536.0f);
    f.pr->destroy(f.prec);
    run_close(&f.run);
    assert_int_equal(fx_try_precision(&f, "{plugin: fp16, master_weights: true, reduce_dtype: "
                                          "fp32, loss_scaling: none}"),
                     VH_STATUS_OK);
    fx_policy(&f);
    assert_int_equal(f.policy.master_dtype, VH_DTYPE_F32);
    assert_int_equal(f.policy.master_weights, 1);
    assert_int_equal(f.policy.comm_dtype, VH_DTYPE_F32);
    assert_true(f.pr->loss_scale(f.prec) == 1.0f);
    f.pr->destroy(f.prec);
    run_close(&f.run);
}

/* A good step: the grads reach the optimizer unscaled (exactly, the scale
 * being a power of two) with their sum of squares; then an Inf in one
 * gradient skips exactly that step: parameters, masters and optimizer state
 * are untouched byte for byte, the scale halves, the next step runs. */
static void check_skip(const char *precision) {
    fx f;
    fx_open(&f, precision, NULL);
    const float scale0 = f.pr->loss_scale(f.prec);
    fx_backward(&f, 0, -1, 0);
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.prec, &f.slices, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    double want_sq = 0.0;
    for (int32_t i = 0; i < f.slices.count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&f.slices, i);
        assert_int_equal(sl->grad_dtype, VH_DTYPE_F32);
        int64_t first = units[sl->unit].params[sl->param].offset;
        for (int64_t k = 0; k < sl->count; k++) {
            float g = grad_of(sl->unit, first + k, 0);
            if (((const float *)sl->grad)[k] != g)
                fail_msg("%s: grad %lld of unit %d param %d is %g, want %g", precision,
                         (long long)k, (int)sl->unit, (int)sl->param,
                         (double)((const float *)sl->grad)[k], (double)g);
            want_sq += (double)g * g;
        }
    }
    double sq = 0.0;
    int has = 0;
    assert_int_equal(f.pr->grad_sum_sq(f.prec, &sq, &has), VH_STATUS_OK);
    assert_int_equal(has, 1);
    assert_true(fabs(sq - want_sq) <= 1e-6 * want_sq);
    /* the rest of the host's step (the check already ran) */
    vh_optim_step_args a = {.slices = &f.slices, .step = 0, .has_grad_sum_sq = 1,
                            .grad_sum_sq = sq};
    assert_int_equal(host_update(host_of(&f, VH_ROLE_OPTIM), f.op, f.mta, &a, 100),
                     VH_STATUS_OK);
    assert_int_equal(f.sh->refresh(f.ddp), VH_STATUS_OK);
    assert_int_equal(f.pr->update(f.prec, 0), VH_STATUS_OK);
    f.step = 1;

    snapshot before, after;
    take(&f, &before);
    assert_int_equal(fx_step(&f, 1, 22), 1); /* an Inf in a layer-norm weight */
    take(&f, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_true(f.pr->loss_scale(f.prec) == scale0 / 2.0f);
    /* and one in a 16-bit gradient */
    assert_int_equal(fx_step(&f, 2, 5), 1);
    take(&f, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_true(f.pr->loss_scale(f.prec) == scale0 / 4.0f);
    /* The next good step moves the weights and the state again. */
    assert_int_equal(fx_step(&f, -1, 0), 0);
    take(&f, &after);
    assert_true(memcmp(before.masters, after.masters, sizeof before.masters) != 0);
    assert_true(memcmp(before.state, after.state, sizeof before.state) != 0);
    assert_true(memcmp(before.optim, after.optim, sizeof before.optim) != 0);
    fx_close(&f);
}

static void test_amp_fp16_inf_skips_the_step(void **state) {
    (void)state;
    check_skip("{plugin: amp, dtype: fp16}");
}

static void test_amp_bf16_scaled_inf_skips_the_step(void **state) {
    (void)state;
    check_skip("{plugin: amp, dtype: bf16, loss_scaling: dynamic, init_scale: 1024}");
}

static void test_fp16_inf_skips_the_step(void **state) {
    (void)state;
    check_skip("{plugin: fp16}");
    check_skip("{plugin: fp16, master_weights: true, reduce_dtype: fp32}");
}

/* Another rank's overflow skips this rank's step too (one SUM all-reduce
 * per check: the flag, and for sharded slices their sum of squares with it;
 * replicas' sum of squares does not travel). */
static void test_found_inf_agreed_across_ranks(void **state) {
    (void)state;
    fx f;
    fx_world = 2;
    fx_open(&f, "{plugin: amp, dtype: fp16}", NULL);
    fx_world = 1;
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_int_equal(fake.sums, 1); /* one collective: the flag (ddp's slices are replicas) */
    assert_true(fake.avgs > 0);
    snapshot before, after;
    take(&f, &before);
    fake.peer_flag = 1.0f; /* the peer overflowed; this rank did not */
    assert_int_equal(fx_step(&f, -1, 0), 1);
    take(&f, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_true(f.pr->loss_scale(f.prec) == 32768.0f);
    assert_int_equal(fake.sums, 2);
    fake.peer_flag = 0.0f;
    assert_int_equal(fx_step(&f, -1, 0), 0);

    /* shards: the sum of squares is summed over ranks */
    float g[3] = {1.0f, 2.0f, 2.0f};
    vh_param_slice one = {.count = 3, .grad = g};
    vh_param_slices sl = {.items = &one, .count = 1, .item_size = sizeof one, .replicated = 0};
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.prec, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    double sq = 0.0;
    int has = 0;
    assert_int_equal(f.pr->grad_sum_sq(f.prec, &sq, &has), VH_STATUS_OK);
    const double u = 1.0 / 32768.0; /* the grads were unscaled in place */
    assert_true(has == 1 && sq == 2.0 * 9.0 * u * u);
    assert_int_equal(fake.sums, 4); /* flag and sum of squares in one collective */
    assert_true(g[1] == (float)(2.0 * u));
    fx_close(&f);
}

/* Gradients a sharding plugin hands over in 16 bits are unscaled in place
 * in their dtype by the same pass (the product rounded to nearest even),
 * and an f16 Inf or a bf16 NaN among them is found. */
static void test_unscale_half_grads(void **state) {
    (void)state;
    fx f;
    assert_int_equal(fx_try_precision(&f, "{plugin: amp, dtype: fp16, init_scale: 1024}"),
                     VH_STATUS_OK);
    uint16_t h[300], b[5];
    for (int i = 0; i < 300; i++) h[i] = vh_f32_to_f16((float)(i % 50 - 25) * 3.0f);
    for (int i = 0; i < 5; i++) b[i] = vh_f32_to_bf16((float)i * 1000.0f);
    vh_param_slice two[2];
    memset(two, 0, sizeof two);
    two[0] = (vh_param_slice){.count = 300, .grad = h, .grad_dtype = VH_DTYPE_F16};
    two[1] = (vh_param_slice){.unit = 1, .count = 5, .grad = b, .grad_dtype = VH_DTYPE_BF16};
    vh_param_slices sl = {.items = two, .count = 2, .item_size = sizeof two[0], .replicated = 1};
    int found = -1;
    assert_int_equal(f.pr->unscale_and_check(f.prec, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 0);
    for (int i = 0; i < 300; i++)
        assert_int_equal(h[i], vh_f32_to_f16((float)(i % 50 - 25) * 3.0f / 1024.0f));
    for (int i = 0; i < 5; i++)
        assert_int_equal(b[i], vh_f32_to_bf16((float)i * 1000.0f / 1024.0f));
    h[77] = 0x7c00; /* f16 +Inf */
    assert_int_equal(f.pr->unscale_and_check(f.prec, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    h[77] = 0;
    b[3] = 0x7fc1; /* a bf16 NaN */
    assert_int_equal(f.pr->unscale_and_check(f.prec, &sl, &found), VH_STATUS_OK);
    assert_int_equal(found, 1);
    two[1].grad_dtype = VH_DTYPE_I32;
    assert_int_equal(f.pr->unscale_and_check(f.prec, &sl, &found), VH_STATUS_ERR_UNSUPPORTED);
    assert_non_null(strstr(error_of(&f, VH_ROLE_PRECISION), "i32 grads"));
    f.pr->destroy(f.prec);
    run_close(&f.run);
}

/* ---- 16-bit gradients straight to the optimizer (ABI 2.9) ------------------- */

typedef struct half_run {
    snapshot snap;
    int half_slices;        /* slices handed over in bf16 (f16) */
    int compute_slices;     /* slices with a compute copy for the optimizer to write */
    vh_sharding_memory mem;
} half_run;

/* Masters changed outside the optimizer, as the host's EMA swap changes
 * them, then refresh: every compute copy must follow, whoever wrote it
 * after the last update. */
static void check_refresh_follows_masters(fx *f) {
    for (int32_t i = 0; i < f->slices.count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&f->slices, i);
        assert_int_equal(sl->master_dtype, VH_DTYPE_F32);
        for (int64_t k = 0; k < sl->count; k++) ((float *)sl->master)[k] += 0.25f;
    }
    assert_int_equal(f->sh->refresh(f->ddp), VH_STATUS_OK);
    for (int32_t u = 0; u < NUM_UNITS; u++) {
        float m[MAX_UNIT];
        const void *p = NULL;
        assert_int_equal(f->sh->store_unit(f->ddp, u, m), VH_STATUS_OK);
        assert_int_equal(f->sh->gather(f->ddp, u, &p), VH_STATUS_OK);
        for (int64_t k = 0; k < units[u].numel; k++) {
            unsigned char want[4];
            const vh_dtype t = elem_dtype(&f->param_layout[u], u, k);
            put(want, t, m[k]);
            assert_memory_equal(elem_ptr((void *)(uintptr_t)p, &f->param_layout[u], u, k), want,
                                vh_dtype_size(t));
        }
        assert_int_equal(f->sh->release(f->ddp, u), VH_STATUS_OK);
    }
}

/* Five steps of `precision` on `sharding` (world fx_world) with fx_caps =
 * caps: what they leave, and how the slices held the gradients and compute
 * copies; then check_refresh_follows_masters. */
static void run_half(const char *sharding, const char *precision, const char *optim_keys,
                     uint32_t caps, half_run *out) {
    fx f;
    fx_sharding = sharding;
    fx_caps = caps;
    fx_open(&f, precision, optim_keys);
    fx_sharding = "ddp";
    fx_caps = 0;
    memset(out, 0, sizeof *out);
    for (int32_t i = 0; i < f.slices.count; i++) {
        const vh_param_slice *sl = vh_param_slices_at(&f.slices, i);
        assert_true(sl->grad_dtype == VH_DTYPE_F32 || sl->grad_dtype == f.policy.grad_dtype);
        out->half_slices += sl->grad_dtype != VH_DTYPE_F32;
        if (vh_param_slice_compute(&f.slices, sl)) {
            assert_int_equal(sl->compute_dtype, f.policy.param_dtype);
            out->compute_slices++;
        }
    }
    for (int k = 0; k < 5; k++) assert_int_equal(fx_step(&f, -1, 0), 0);
    take(&f, &out->snap);
    out->mem.struct_size = sizeof out->mem;
    assert_int_equal(f.sh->memory(f.ddp, &out->mem), VH_STATUS_OK);
    check_refresh_follows_masters(&f);
    fx_close(&f);
}

/* The optimizer caps of ABI 2.9 change where the work happens, never the
 * numbers. An optimizer that reads bf16 gradients (VH_OPTIM_CAP_HALF_GRADS)
 * gets the replicas' reduced bf16 gradients as they are, under AMP-bf16
 * without loss scaling; one that writes the compute copies
 * (VH_OPTIM_CAP_WRITES_COMPUTE) does so after each update and the host calls
 * refresh_updated. Either, both or neither: the same compute copies,
 * masters and optimizer state, bit for bit, with clipping by the global norm
 * and with LAMB's per-tensor norms, and refresh still follows masters
 * changed outside the optimizer; the same for f16 weights with f32 masters.
 * Where the policy may scale (loss_scaling dynamic), or for FSDP (its shards
 * are widened on arrival), the gradients stay f32. */
static void test_half_grads_same_numbers(void **state) {
    (void)state;
    static const char *const shardings[] = {"ddp", "zero1", "fsdp"};
    static const char *const optims[] = {"clip_grad_norm: 0.5", "algo: lamb"};
    static const uint32_t caps[] = {VH_OPTIM_CAP_HALF_GRADS, VH_OPTIM_CAP_WRITES_COMPUTE,
                                    VH_OPTIM_CAP_HALF_GRADS | VH_OPTIM_CAP_WRITES_COMPUTE};
    for (int w = 1; w <= 2; w++)
        for (size_t sh = 0; sh < 3; sh++)
            for (size_t o = 0; o < 2; o++) {
                if (w == 2 && sh > 0) continue; /* the fake rank has all-reduce only */
                fx_world = w;
                half_run f32;
                run_half(shardings[sh], "{plugin: amp}", optims[o], 0, &f32);
                assert_int_equal(f32.half_slices, 0);
                assert_int_equal(f32.compute_slices, 0);
                for (size_t k = 0; k < 3; k++) {
                    half_run half;
                    run_half(shardings[sh], "{plugin: amp}", optims[o], caps[k], &half);
                    /* embed.weight, embed.bias, fc.weight, head.weight, head.bias */
                    const int grads16 = (caps[k] & VH_OPTIM_CAP_HALF_GRADS) && sh < 2;
                    assert_int_equal(half.half_slices, grads16 ? 5 : 0);
                    if (grads16) assert_true(half.mem.grads < f32.mem.grads);
                    assert_int_equal(half.compute_slices,
                                     caps[k] & VH_OPTIM_CAP_WRITES_COMPUTE ? 5 : 0);
                    assert_memory_equal(&f32.snap, &half.snap, sizeof f32.snap);
                }
                fx_world = 1;
            }
    /* f16 weights with f32 masters and no loss scaling: the same with f16 */
    static const char fp16[] = "{plugin: fp16, master_weights: true, loss_scaling: none}";
    half_run ref, both;
    run_half("ddp", fp16, "clip_grad_norm: 0.5", 0, &ref);
    run_half("ddp", fp16, "clip_grad_norm: 0.5",
             VH_OPTIM_CAP_HALF_GRADS | VH_OPTIM_CAP_WRITES_COMPUTE, &both);
    assert_int_equal(both.half_slices, 7);
    assert_int_equal(both.compute_slices, 7);
    assert_memory_equal(&ref.snap, &both.snap, sizeof ref.snap);
    /* An ABI 2.8 host's shorter setup: the caps past its struct_size are not
     * read, and the slices are 2.8's (their numbers are checked above). */
    fx_setup_size = (uint32_t)offsetof(vh_sharding_setup, optim_caps);
    half_run old;
    run_half("ddp", "{plugin: amp}", NULL, VH_OPTIM_CAP_HALF_GRADS | VH_OPTIM_CAP_WRITES_COMPUTE,
             &old);
    fx_setup_size = 0;
    assert_int_equal(old.half_slices, 0);
    assert_int_equal(old.compute_slices, 0);
    /* A 2.8 policy (no unit_loss_scale): no 16-bit hand-over, compute copies still */
    fx_policy_size = (uint32_t)offsetof(vh_precision_policy, unit_loss_scale);
    run_half("ddp", "{plugin: amp}", NULL, VH_OPTIM_CAP_HALF_GRADS | VH_OPTIM_CAP_WRITES_COMPUTE,
             &old);
    fx_policy_size = 0;
    assert_int_equal(old.half_slices, 0);
    assert_int_equal(old.compute_slices, 5);
    half_run scaled;
    run_half("ddp", "{plugin: amp, loss_scaling: dynamic}", NULL,
             VH_OPTIM_CAP_HALF_GRADS | VH_OPTIM_CAP_WRITES_COMPUTE, &scaled);
    assert_int_equal(scaled.half_slices, 0);
    assert_int_equal(scaled.compute_slices, 5);
}

/* growth_interval good steps in a row double the scale; an overflow
 * between them starts the count again. */
static void test_growth_after_interval(void **state) {
    (void)state;
    fx f;
    fx_open(&f, "{plugin: amp, dtype: fp16, init_scale: 1024, growth_interval: 3}", NULL);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_true(f.pr->loss_scale(f.prec) == 1024.0f);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_true(f.pr->loss_scale(f.prec) == 2048.0f);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_int_equal(fx_step(&f, 2, 1), 1);
    assert_true(f.pr->loss_scale(f.prec) == 1024.0f);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_true(f.pr->loss_scale(f.prec) == 1024.0f);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_true(f.pr->loss_scale(f.prec) == 2048.0f);
    fx_close(&f);
}

/* Full FP16 without masters: mta loads the f16 parameters, updates them in
 * f32 and stores them rounded to nearest even; the state is f32. The same
 * update on f32 copies of the values, rounded afterwards, must give the
 * same bits, and the same state. */
static void test_fp16_updates_f16_weights(void **state) {
    (void)state;
    fx f;
    fx_open(&f, "{plugin: fp16}", NULL);
    /* the reference: a second mta on f32 copies */
    void *ref = NULL;
    vh_optim_setup os = {.struct_size = sizeof os, .total_steps = 100};
    assert_int_equal(f.op->create(host_of(&f, VH_ROLE_OPTIM), &os, &ref), VH_STATUS_OK);
    enum { N = 7 };
    assert_int_equal(f.slices.count, N);
    float p32[N][MAX_UNIT], g32[N][MAX_UNIT], m[N][MAX_UNIT], v[N][MAX_UNIT];
    vh_param_slice rs[N];
    memset(rs, 0, sizeof rs);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int step = 0; step < 3; step++) {
        fx_backward(&f, step, -1, 0);
        for (int32_t i = 0; i < N; i++) {
            const vh_param_slice *sl = vh_param_slices_at(&f.slices, i);
            assert_int_equal(sl->master_dtype, VH_DTYPE_F16);
            for (int64_t k = 0; k < sl->count; k++)
                p32[i][k] = vh_f16_to_f32(((const uint16_t *)sl->master)[k]);
            rs[i] = *sl;
            rs[i].master = p32[i];
            rs[i].master_dtype = VH_DTYPE_F32;
            rs[i].grad = g32[i];
            rs[i].state[0] = m[i];
            rs[i].state[1] = v[i];
        }
        assert_int_equal(fx_finish_step(&f), 0);
        /* the grads were unscaled in place: the reference reads them too */
        for (int32_t i = 0; i < N; i++) {
            const vh_param_slice *sl = vh_param_slices_at(&f.slices, i);
            memcpy(g32[i], sl->grad, (size_t)sl->count * sizeof(float));
        }
        vh_param_slices rl = {.items = rs, .count = N, .item_size = sizeof rs[0],
                              .replicated = 1};
        vh_optim_step_args a = {.slices = &rl, .step = step};
        assert_int_equal(host_update(host_of(&f, VH_ROLE_OPTIM), f.op, ref, &a, 100),
                         VH_STATUS_OK);
        for (int32_t i = 0; i < N; i++) {
            const vh_param_slice *sl = vh_param_slices_at(&f.slices, i);
            for (int64_t k = 0; k < sl->count; k++) {
                uint16_t got = ((const uint16_t *)sl->master)[k];
                if (got != vh_f32_to_f16(p32[i][k]))
                    fail_msg("step %d slice %d elem %lld: f16 0x%04x, want 0x%04x (%g)", step,
                             (int)i, (long long)k, got, vh_f32_to_f16(p32[i][k]),
                             (double)p32[i][k]);
            }
            assert_memory_equal(sl->state[0], m[i], (size_t)sl->count * sizeof(float));
            assert_memory_equal(sl->state[1], v[i], (size_t)sl->count * sizeof(float));
        }
    }
    f.op->destroy(ref);
    fx_close(&f);
}

/* ---- mta on hand-made 16-bit slices -------------------------------------------- */

typedef struct mta_run {
    vh_run run;
    const vh_optim_vtable *vt;
    void *self;
} mta_run;

/* mta's update on the run's 50 steps, with these args' slices and sum. */
static vh_status mta_update(mta_run *o, vh_optim_step_args a) {
    return host_update(&o->run.hosts[VH_ROLE_OPTIM].pub, o->vt, o->self, &a, 50);
}

static void mta_open(mta_run *o, const char *keys) {
    memset(o, 0, sizeof *o);
    vh_diag d = {{0}};
    if (fx_open_run(&o->run, "{plugin: fp32}", keys, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    o->vt = o->run.plugins[VH_ROLE_OPTIM].desc->vtable;
    vh_optim_setup os = {.struct_size = sizeof os, .total_steps = 50};
    if (o->vt->create(&o->run.hosts[VH_ROLE_OPTIM].pub, &os, &o->self) != VH_STATUS_OK)
        fail_msg("mta create: %s", o->run.hosts[VH_ROLE_OPTIM].error);
}

static void mta_close(mta_run *o) {
    if (o->self) o->vt->destroy(o->self);
    run_close(&o->run);
}

/* Masters and gradients in bf16 or f16 (and one slice longer than a chunk)
 * update as their f32 widenings would, rounded once at the end; with
 * sgd, lamb and clipping too. */
static void check_half_slices(const char *keys, vh_dtype master, vh_dtype grad) {
    enum { A = 70000, B = 37 };
    const int64_t n[2] = {A, B};
    mta_run half, ref;
    mta_open(&half, keys);
    mta_open(&ref, keys);
    uint16_t *hp[2], *hg[2];
    float *rp[2], *rg[2], *hs[2][2], *rsl[2][2];
    vh_param_slice hs_l[2], rs_l[2];
    memset(hs_l, 0, sizeof hs_l);
    memset(rs_l, 0, sizeof rs_l);
    for (int t = 0; t < 2; t++) {
        hp[t] = calloc((size_t)n[t], 2);
        hg[t] = calloc((size_t)n[t], 2);
        rp[t] = calloc((size_t)n[t], 4);
        rg[t] = calloc((size_t)n[t], 4);
        for (int k = 0; k < 2; k++) {
            hs[t][k] = calloc((size_t)n[t], 4);
            rsl[t][k] = calloc((size_t)n[t], 4);
        }
        for (int64_t i = 0; i < n[t]; i++) {
            float x = (float)((i * 37 + t) % 201 - 100) / 64.0f;
            put(&hp[t][i], master, x);
            rp[t][i] = master == VH_DTYPE_F16 ? vh_f16_to_f32(hp[t][i]) : vh_bf16_to_f32(hp[t][i]);
        }
        hs_l[t] = (vh_param_slice){.unit = 0, .param = t, .count = n[t],
                                   .flags = t ? 0 : VH_PARAM_FLAG_DECAY, .master = hp[t],
                                   .grad = hg[t], .state = {hs[t][0], hs[t][1]},
                                   .master_dtype = master, .grad_dtype = grad};
        rs_l[t] = hs_l[t];
        rs_l[t].master = rp[t];
        rs_l[t].master_dtype = VH_DTYPE_F32;
        rs_l[t].grad = rg[t];
        rs_l[t].grad_dtype = VH_DTYPE_F32;
        rs_l[t].state[0] = rsl[t][0];
        rs_l[t].state[1] = rsl[t][1];
    }
    vh_param_slices hl = {.items = hs_l, .count = 2, .item_size = sizeof hs_l[0], .replicated = 1};
    vh_param_slices rl = {.items = rs_l, .count = 2, .item_size = sizeof rs_l[0], .replicated = 1};
    for (int step = 0; step < 3; step++) {
        for (int t = 0; t < 2; t++)
            for (int64_t i = 0; i < n[t]; i++) {
                float g = (float)((i * 13 + step * 7 + t) % 53 - 26) / 32.0f;
                put(&hg[t][i], grad, g);
                rg[t][i] = grad == VH_DTYPE_F16 ? vh_f16_to_f32(hg[t][i])
                                                : vh_bf16_to_f32(hg[t][i]);
            }
        vh_optim_step_args ha = {.slices = &hl, .step = step};
        if (mta_update(&half, ha) != VH_STATUS_OK)
            fail_msg("%s: %s", keys, half.run.hosts[VH_ROLE_OPTIM].error);
        assert_int_equal(mta_update(&ref, (vh_optim_step_args){.slices = &rl, .step = step}),
                         VH_STATUS_OK);
        for (int t = 0; t < 2; t++) {
            for (int64_t i = 0; i < n[t]; i++) {
                uint16_t want = master == VH_DTYPE_F16 ? vh_f32_to_f16(rp[t][i])
                                                       : vh_f32_to_bf16(rp[t][i]);
                if (hp[t][i] != want)
                    fail_msg("%s: step %d tensor %d elem %lld: 0x%04x, want 0x%04x", keys, step,
                             t, (long long)i, hp[t][i], want);
                /* the reference goes on from the rounded values, as the half run */
                rp[t][i] = master == VH_DTYPE_F16 ? vh_f16_to_f32(want) : vh_bf16_to_f32(want);
            }
            int slots = half.vt->state_slots(half.self);
            for (int k = 0; k < slots; k++)
                assert_memory_equal(hs[t][k], rsl[t][k], (size_t)n[t] * sizeof(float));
        }
    }
    for (int t = 0; t < 2; t++) {
        free(hp[t]);
        free(hg[t]);
        free(rp[t]);
        free(rg[t]);
        for (int k = 0; k < 2; k++) {
            free(hs[t][k]);
            free(rsl[t][k]);
        }
    }
    mta_close(&half);
    mta_close(&ref);
}

static void test_mta_half_slices(void **state) {
    (void)state;
    check_half_slices("clip_grad_norm: 1.0", VH_DTYPE_F16, VH_DTYPE_F16);
    check_half_slices("clip_grad_norm: 1.0", VH_DTYPE_BF16, VH_DTYPE_BF16);
    check_half_slices("algo: sgd, momentum: 0.9, nesterov: true", VH_DTYPE_F16, VH_DTYPE_BF16);
    check_half_slices("algo: lamb", VH_DTYPE_BF16, VH_DTYPE_F16);
}

/* State in 16 bits, or an integer master, is refused by name. */
static void test_mta_refuses_dtypes(void **state) {
    (void)state;
    mta_run o;
    mta_open(&o, NULL);
    float p[4] = {0}, g[4] = {0}, s0[4] = {0}, s1[4] = {0};
    vh_param_slice sl = {.count = 4, .master = p, .grad = g, .state = {s0, s1},
                         .state_dtype = VH_DTYPE_F16};
    vh_param_slices l = {.items = &sl, .count = 1, .item_size = sizeof sl, .replicated = 1};
    assert_int_equal(mta_update(&o, (vh_optim_step_args){.slices = &l}),
                     VH_STATUS_ERR_UNSUPPORTED);
    assert_non_null(strstr(o.run.hosts[VH_ROLE_OPTIM].error, "optimizer state in f16"));
    sl.state_dtype = VH_DTYPE_F32;
    sl.master_dtype = VH_DTYPE_I32;
    assert_int_equal(mta_update(&o, (vh_optim_step_args){.slices = &l}),
                     VH_STATUS_ERR_UNSUPPORTED);
    assert_non_null(strstr(o.run.hosts[VH_ROLE_OPTIM].error, "master values in i32"));
    mta_close(&o);
}

/* Clipping takes the precision plugin's sum of squares when the host hands
 * it over (one pass for the overflow check and the norm): the same sum
 * gives the same update as mta's own pass, another sum another one. */
static void test_mta_clip_uses_grad_sum_sq(void **state) {
    (void)state;
    float p[3][4], g[4] = {1.0f, -2.0f, 2.0f, 4.0f}; /* norm 5 */
    float s[3][2][4];
    memset(s, 0, sizeof s);
    vh_param_slice sl[3];
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 4; i++) p[r][i] = 0.5f * (float)i;
        sl[r] = (vh_param_slice){.count = 4, .master = p[r], .grad = g,
                                 .state = {s[r][0], s[r][1]}};
    }
    for (int r = 0; r < 3; r++) {
        mta_run o;
        mta_open(&o, "clip_grad_norm: 1.0, algo: sgd, momentum: 0");
        vh_param_slices l = {.items = &sl[r], .count = 1, .item_size = sizeof sl[r],
                             .replicated = 1};
        vh_optim_step_args a = {.slices = &l, .has_grad_sum_sq = r > 0,
                                .grad_sum_sq = r == 1 ? 25.0 : 100.0};
        assert_int_equal(mta_update(&o, a), VH_STATUS_OK);
        mta_close(&o);
    }
    assert_memory_equal(p[0], p[1], sizeof p[0]);
    assert_true(memcmp(p[0], p[2], sizeof p[0]) != 0);
    /* SGD, lr 0.01, clip 1/(10 + 1e-6): p -= 0.01 * g * coef */
    float coef = (float)(1.0 / (10.0 + 1e-6));
    assert_true(p[2][3] == 1.5f + (float)-0.01 * (4.0f * coef));
}

/* ---- state through the plugins ------------------------------------------------- */

static void test_plugin_state(void **state) {
    (void)state;
    fx f, g;
    fx_open(&f, "{plugin: amp, dtype: fp16, init_scale: 256, growth_interval: 2}", NULL);
    assert_int_equal(fx_step(&f, 1, 3), 1);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_true(f.pr->loss_scale(f.prec) == 256.0f);
    size_t n = 0;
    assert_int_equal(f.pr->state_size(f.prec, &n), VH_STATUS_OK);
    unsigned char blob[256], again[256], other[256];
    assert_true(n <= sizeof blob);
    assert_int_equal(f.pr->state_save(f.prec, blob, n), VH_STATUS_OK);

    fx_open(&g, "{plugin: amp, dtype: fp16, init_scale: 256, growth_interval: 2}", NULL);
    assert_int_equal(g.pr->state_load(g.prec, blob, n), VH_STATUS_OK);
    assert_int_equal(g.pr->state_save(g.prec, again, n), VH_STATUS_OK);
    assert_memory_equal(blob, again, n);
    /* both continue alike: one more good step grows both */
    assert_int_equal(fx_step(&f, -1, 0), 0);
    assert_int_equal(fx_step(&g, -1, 0), 0);
    assert_true(f.pr->loss_scale(f.prec) == 512.0f);
    assert_true(g.pr->loss_scale(g.prec) == 512.0f);

    /* fp16's state is refused by amp, amp's by fp16, both by name */
    fx h;
    assert_int_equal(fx_try_precision(&h, "{plugin: fp16}"), VH_STATUS_OK);
    size_t hn = 0;
    assert_int_equal(h.pr->state_size(h.prec, &hn), VH_STATUS_OK);
    assert_int_equal(h.pr->state_save(h.prec, other, hn), VH_STATUS_OK);
    assert_int_equal(g.pr->state_load(g.prec, other, hn), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(error_of(&g, VH_ROLE_PRECISION), "another precision plugin"));
    assert_int_equal(h.pr->state_load(h.prec, blob, n), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(error_of(&h, VH_ROLE_PRECISION), "another precision plugin"));
    h.pr->destroy(h.prec);
    run_close(&h.run);
    /* a damaged or newer amp blob too */
    assert_int_equal(g.pr->state_load(g.prec, blob, n - 1), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(error_of(&g, VH_ROLE_PRECISION), "damaged"));
    memcpy(other, blob, n);
    uint32_t version = 9;
    memcpy(other + 4, &version, sizeof version);
    assert_int_equal(g.pr->state_load(g.prec, other, n), VH_STATUS_ERR_FORMAT);
    assert_non_null(strstr(error_of(&g, VH_ROLE_PRECISION), "newer amp"));
    fx_close(&f);
    fx_close(&g);
}

/* ---- end to end: `vithost run` -------------------------------------------------- */

static char tmp_dir[256];

static int e2e_setup(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/vithost-test-precision-XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int e2e_teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static char *slurp(const char *fmt, ...) {
    char path[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path, sizeof path, fmt, ap);
    va_end(ap);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

/* vithost with ARGS in the scratch folder; its exit code; output in out.txt. */
static int vithost(const char *fmt, ...) {
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd '%s' && VITHOST_PLUGIN_PATH= '%s' %s >out.txt 2>&1 </dev/null",
             tmp_dir, VH_TEST_VITHOST, args);
    int status = system(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void write_recipe(const char *name, const char *precision) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    /* No evaluation: only training, checkpoints and the metrics are compared. */
    fprintf(f,
            "run: {epochs: 1, batch_size: 8, log_every: 5, eval_every: 0}\n"
            "model: {plugin: vit, dim: 16, depth: 1, heads: 2, mlp_dim: 32, patch_size: 4}\n"
            "precision: %s\n"
            "sharding: {plugin: ddp}\n"
            "optim: {plugin: mta, algo: adamw, lr: 1.0e-3, warmup_steps: 2}\n"
            "data: {plugin: synthetic, channels: 3, image_size: 8, num_classes: 5,\n"
            "       train_size: 256, eval_size: 16}\n",
            precision);
    fclose(f);
}

static double field(const char *line, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *p = strstr(line, pattern);
    return p ? strtod(p + strlen(pattern), NULL) : NAN;
}

/* Every training line has loss_scale and skipped_steps; skipped_steps
 * counts the lines marked skipped (each skip writes one), never goes down,
 * and the scale halves from a skipped line's step to the previous line's.
 * Returns the last line's skipped_steps. */
static int64_t check_metrics(const char *run, int64_t *lines_out) {
    char *text = slurp("%s/%s/metrics.jsonl", tmp_dir, run);
    assert_non_null(text);
    int64_t lines = 0, marked = 0, last = 0, prev_step = -1;
    double prev_scale = NAN;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        lines++;
        double scale = field(l, "loss_scale"), skipped = field(l, "skipped_steps");
        int64_t step = (int64_t)field(l, "step");
        if (isnan(scale) || isnan(skipped)) fail_msg("%s: a line without the keys: %s", run, l);
        int is_skip = strstr(l, "\"skipped\":true") != NULL;
        marked += is_skip;
        if ((int64_t)skipped != marked || (int64_t)skipped < last)
            fail_msg("%s: skipped_steps %g after %lld marked lines: %s", run, skipped,
                     (long long)marked, l);
        /* a skip right after a logged step: the scale there halved (or sat at 1) */
        if (is_skip && prev_step == step - 1 && !(scale == prev_scale / 2.0 || scale == 1.0))
            fail_msg("%s: scale %g after %g at a skip: %s", run, scale, prev_scale, l);
        last = (int64_t)skipped;
        prev_scale = scale;
        prev_step = step;
    }
    free(text);
    if (lines_out) *lines_out = lines;
    return last;
}

/* The bytes of a file in the scratch folder, and their count. */
static unsigned char *read_bytes(const char *name, long *size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)*size + 1);
    assert_int_equal(fread(buf, 1, (size_t)*size, f), (size_t)*size);
    fclose(f);
    return buf;
}

static void expect_same_file(const char *a, const char *b) {
    long na = 0, nb = 0;
    unsigned char *x = read_bytes(a, &na), *y = read_bytes(b, &nb);
    if (na != nb || memcmp(x, y, (size_t)na) != 0) fail_msg("%s and %s differ", a, b);
    free(x);
    free(y);
}

/* AMP-fp16 with a scale far too large to start with (2^30: the f16
 * gradients overflow) and a short growth interval: the run skips steps,
 * backs off, grows and overflows again, and says so in every metrics line.
 * Stopped in the middle and resumed from its checkpoint it ends with the
 * same weights, optimizer state, scaler state and skip count as without
 * the stop, bit for bit. */
static void test_amp_fp16_run_resumes_bit_for_bit(void **state) {
    (void)state;
    write_recipe("amp16.yaml", "{plugin: amp, dtype: fp16, init_scale: 1073741824, "
                               "max_scale: 1073741824, growth_interval: 3}");
    assert_int_equal(vithost("run amp16.yaml --out full"), 0);
    char *out = slurp("%s/out.txt", tmp_dir);
    assert_non_null(strstr(out, "skipped: gradients overflowed at loss scale 1.07374e+09; "
                                "scale now 5.36871e+08"));
    assert_non_null(strstr(out, " scale "));
    free(out);
    int64_t lines = 0;
    int64_t skipped = check_metrics("full", &lines);
    assert_true(skipped >= 3);
    assert_true(lines > 32 / 5);

    assert_int_equal(vithost("run amp16.yaml --out split --stop-after 17"), 5);
    assert_int_equal(vithost("run amp16.yaml --out split --resume"), 0);
    assert_int_equal(check_metrics("split", NULL), skipped);
    char *a = slurp("%s/full/metrics.jsonl", tmp_dir);
    char *b = slurp("%s/split/metrics.jsonl", tmp_dir);
    /* the same lines but for the timing fields: compare losses and scales */
    int64_t na = 0, nb = 0;
    for (char *sa = NULL, *sb = NULL, *la = strtok_r(a, "\n", &sa), *lb = strtok_r(b, "\n", &sb);
         la && lb; la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb), na++, nb++) {
        assert_true(field(la, "step") == field(lb, "step"));
        assert_memory_equal(strstr(la, "\"loss\":"), strstr(lb, "\"loss\":"), 20);
        assert_true(field(la, "loss_scale") == field(lb, "loss_scale"));
        assert_true(field(la, "skipped_steps") == field(lb, "skipped_steps"));
    }
    assert_int_equal(na, lines);
    free(a);
    free(b);
    expect_same_file("full/checkpoints/step-00000032/model.safetensors",
                     "split/checkpoints/step-00000032/model.safetensors");
    expect_same_file("full/checkpoints/step-00000032/state.json",
                     "split/checkpoints/step-00000032/state.json");
}

/* The policies are one recipe line apart, and each trains the vit. */
static void test_every_policy_trains(void **state) {
    (void)state;
    static const char *const policies[] = {
        "{plugin: fp32}",
        "{plugin: amp}",
        "{plugin: amp, dtype: fp16}",
        "{plugin: amp, dtype: bf16, layernorm_fp32: false, reduce_dtype: fp32}",
        "{plugin: fp16}",
        "{plugin: fp16, master_weights: true}",
    };
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        write_recipe("policy.yaml", policies[i]);
        char run[32];
        snprintf(run, sizeof run, "p%zu", i);
        if (vithost("run policy.yaml --out %s", run) != 0) {
            char *out = slurp("%s/out.txt", tmp_dir);
            fail_msg("%s:\n%s", policies[i], out ? out : "");
        }
        char *out = slurp("%s/out.txt", tmp_dir);
        const char *fin = strstr(out, "final loss ");
        assert_non_null(fin);
        double loss = strtod(fin + 11, NULL);
        if (!(loss > 0.0 && loss < 3.0)) fail_msg("%s: final loss %g", policies[i], loss);
        free(out);
        check_metrics(run, NULL);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scaler_defaults),
        cmocka_unit_test(test_scaler_backoff),
        cmocka_unit_test(test_scaler_growth),
        cmocka_unit_test(test_scaler_fixed),
        cmocka_unit_test(test_scaler_unscale_factor),
        cmocka_unit_test(test_scaler_refuses_configs),
        cmocka_unit_test(test_scaler_state_round_trip),
        cmocka_unit_test(test_scaler_state_refused),
        cmocka_unit_test(test_amp_policies),
        cmocka_unit_test(test_fp16_policies),
        cmocka_unit_test(test_amp_fp16_inf_skips_the_step),
        cmocka_unit_test(test_amp_bf16_scaled_inf_skips_the_step),
        cmocka_unit_test(test_fp16_inf_skips_the_step),
        cmocka_unit_test(test_found_inf_agreed_across_ranks),
        cmocka_unit_test(test_unscale_half_grads),
        cmocka_unit_test(test_half_grads_same_numbers),
        cmocka_unit_test(test_growth_after_interval),
        cmocka_unit_test(test_fp16_updates_f16_weights),
        cmocka_unit_test(test_mta_half_slices),
        cmocka_unit_test(test_mta_refuses_dtypes),
        cmocka_unit_test(test_mta_clip_uses_grad_sum_sq),
        cmocka_unit_test(test_plugin_state),
        cmocka_unit_test_setup_teardown(test_amp_fp16_run_resumes_bit_for_bit, e2e_setup,
                                        e2e_teardown),
        cmocka_unit_test_setup_teardown(test_every_policy_trains, e2e_setup, e2e_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
