/* test_step.c - the step goes straight: without --trace the model's unit
 * hooks are the sharding plugin's own calls (no host round trip per hook),
 * and one process makes no collective in a step but its gradients'; with
 * --trace the hooks pass through the host, which prints each call. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "session.h"

/* A tiny main job: vit, fp32 (with its overflow check), ddp in one bucket,
 * mta, synthetic data. */
static const char recipe[] =
    "run: {batch_size: 8, seed: 3}\n"
    "model: {plugin: vit, dim: 32, depth: 2, heads: 2, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp, bucket_mb: 64}\n"
    "optim: {plugin: mta}\n"
    "data: {plugin: synthetic, image_size: 16, channels: 1, num_classes: 10}\n";

static int setup(void **state) {
    (void)state;
    setenv("VITHOST_PLUGIN_PATH", VH_TEST_PLUGIN_DIR, 1);
    return 0;
}

static void open_session(vh_run *run, vh_session *s, int trace, FILE *out) {
    vh_diag d = {{0}};
    vh_run_options opts = {.out = out, .trace = trace};
    if (run_open_text(run, "step.yaml", recipe, &opts, &d) != VH_STATUS_OK)
        fail_msg("%s", d.text);
    if (session_open(s, run, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
}

/* Runs `steps` steps; returns the collectives the last one made. */
static int64_t run_steps(vh_session *s, int steps) {
    vh_diag d = {{0}};
    int64_t last = -1;
    assert_int_equal(s->data->start_epoch(s->self[VH_ROLE_DATA], VH_SPLIT_TRAIN, 0),
                     VH_STATUS_OK);
    for (int i = 0; i < steps; i++) {
        vh_batch host_batch, batch;
        int has = 0, skipped = -1;
        const float *loss = NULL;
        double lr = 0.0;
        if (session_next_batch(s, &host_batch, &batch, &has, &d) != VH_STATUS_OK)
            fail_msg("%s", d.text);
        assert_true(has);
        comm_stats_reset(&s->run->comm_stats);
        if (session_step(s, &batch, i, &loss, &lr, &skipped, &d) != VH_STATUS_OK)
            fail_msg("%s", d.text);
        assert_int_equal(skipped, 0);
        last = s->run->comm_stats.collectives;
    }
    return last;
}

static void test_hooks_go_straight_to_the_sharding_plugin(void **state) {
    (void)state;
    vh_run run;
    vh_session s;
    open_session(&run, &s, 0, stdout);
    assert_ptr_equal(s.hooks.ctx, s.self[VH_ROLE_SHARDING]);
    assert_true(s.hooks.gather == s.sharding->gather);
    assert_true(s.hooks.release == s.sharding->release);
    assert_true(s.hooks.grads == s.sharding->grads);
    assert_true(s.hooks.reduce == s.sharding->reduce);
    /* One bucket: the step's only collective is the gradients' all-reduce
     * (the overflow check sends nothing on one process). */
    assert_int_equal(run_steps(&s, 3), 1);
    session_close(&s);
    run_close(&run);
}

static void test_trace_passes_hooks_through_the_host(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    vh_run run;
    vh_session s;
    open_session(&run, &s, 1, out);
    assert_ptr_equal(s.hooks.ctx, &s);
    run_steps(&s, 1);
    session_close(&s);
    run_close(&run);
    fclose(out);
    /* depth 2: embed, two blocks, head; each gathered in forward and backward */
    int gathers = 0;
    for (const char *p = text; (p = strstr(p, "trace: sharding.gather unit=")); p++) gathers++;
    assert_int_equal(gathers, 8);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks_go_straight_to_the_sharding_plugin),
        cmocka_unit_test(test_trace_passes_hooks_through_the_host),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
