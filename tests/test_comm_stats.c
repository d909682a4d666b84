/* test_comm_stats.c - the host's reading of a communicator backend
 * (comm_upgrade) and its counting layer (comm_stats_install): an older,
 * smaller vh_comm is read up to its own size, a required call that is
 * missing refuses the backend by name, and an optional call the backend
 * lacks stays NULL through the counting layer; a 2.2 backend's ops table,
 * which ends before gather_start, reads with no gather. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "comm_stats.h"

static int all_reduces;

static vh_status fake_all_reduce(vh_comm *c, void *buf, size_t count, vh_dtype dtype,
                                 vh_reduce_op op, vh_stream *stream, vh_comm_request **req) {
    (void)c, (void)buf, (void)count, (void)dtype, (void)op, (void)stream;
    *req = NULL;
    all_reduces++;
    return VH_STATUS_OK;
}
static vh_status fake_rs(vh_comm *c, const void *s, void *r, size_t n, vh_dtype t,
                         vh_reduce_op op, vh_stream *st, vh_comm_request **req) {
    (void)c, (void)s, (void)r, (void)n, (void)t, (void)op, (void)st;
    *req = NULL;
    return VH_STATUS_OK;
}
static vh_status fake_ag(vh_comm *c, const void *s, void *r, size_t n, vh_dtype t,
                         vh_stream *st, vh_comm_request **req) {
    (void)c, (void)s, (void)r, (void)n, (void)t, (void)st;
    *req = NULL;
    return VH_STATUS_OK;
}
static vh_status fake_wait(vh_comm *c, vh_comm_request *req) {
    (void)c, (void)req;
    return VH_STATUS_OK;
}
static vh_status fake_barrier(vh_comm *c) {
    (void)c;
    return VH_STATUS_OK;
}
static void fake_abort(vh_comm *c, int code) { (void)c, (void)code; }

/* A backend without the optional broadcast_start and test. */
static const vh_comm_ops fake_ops = {
    .struct_size = sizeof(vh_comm_ops), .all_reduce_start = fake_all_reduce,
    .reduce_scatter_start = fake_rs, .all_gather_start = fake_ag, .wait = fake_wait,
    .barrier = fake_barrier, .abort = fake_abort};

/* An older writer: its vh_comm ends at impl, and what follows it in memory
 * (here: a poison word) must never be read as a member. */
typedef struct older_comm {
    vh_comm comm;
    uint64_t poison;
} older_comm;

static void test_older_comm_read_at_its_size(void **state) {
    (void)state;
    older_comm old;
    memset(&old, 0xAB, sizeof old);
    old.comm.struct_size = (uint32_t)(offsetof(vh_comm, impl) + sizeof(void *));
    old.comm.backend = "fake";
    old.comm.rank = 1;
    old.comm.world_size = 2;
    old.comm.local_rank = 1;
    old.comm.local_size = 2;
    old.comm.ops = &fake_ops;
    old.comm.impl = NULL;
    vh_comm comm;
    vh_comm_stats stats;
    char why[256];
    assert_int_equal(comm_upgrade(&comm, &stats.inner_ops, &old.comm, why, sizeof why),
                     VH_STATUS_OK);
    assert_int_equal(comm.struct_size, sizeof(vh_comm));
    assert_int_equal(comm.rank, 1);
    assert_int_equal(comm.world_size, 2);
    assert_ptr_equal(comm.ops, &stats.inner_ops);
    comm_stats_install(&comm, &stats);
    assert_true(comm_stats_installed(&comm));
    /* the optional calls the backend lacks stay NULL through the layer */
    assert_null(comm.ops->broadcast_start);
    assert_null(comm.ops->test);
    vh_comm_request *req = NULL;
    float x = 1.0f;
    all_reduces = 0;
    assert_int_equal(comm.ops->all_reduce_start(&comm, &x, 1, VH_DTYPE_F32, VH_REDUCE_OP_SUM,
                                                NULL, &req),
                     VH_STATUS_OK);
    assert_int_equal(all_reduces, 1);
    assert_true(stats.bytes > 0.0);
}

/* A 2.2 backend: its vh_comm_ops ends at abort; a poisoned word where
 * 2.3's gather_start would be must not be read as one. */
typedef struct ops22 {
    vh_comm_ops ops;
    uint64_t poison;
} ops22;

static void test_abi22_ops_have_no_gather(void **state) {
    (void)state;
    ops22 old;
    memset(&old, 0xAB, sizeof old);
    old.ops = fake_ops;
    memset(&old.ops.gather_start, 0xAB, sizeof old.ops.gather_start);
    old.ops.struct_size = (uint32_t)offsetof(vh_comm_ops, gather_start);
    vh_comm src = {.struct_size = sizeof src, .backend = "fake22", .world_size = 2,
                   .ops = &old.ops};
    vh_comm comm;
    vh_comm_stats stats;
    char why[256];
    assert_int_equal(comm_upgrade(&comm, &stats.inner_ops, &src, why, sizeof why),
                     VH_STATUS_OK);
    assert_null(comm.ops->gather_start);
    assert_ptr_equal(comm.ops->barrier, fake_barrier);
    comm_stats_install(&comm, &stats);
    assert_null(comm.ops->gather_start); /* the host then saves by all_reduce */
}

static void test_missing_required_call_is_named(void **state) {
    (void)state;
    vh_comm_ops ops = fake_ops;
    ops.barrier = NULL;
    vh_comm src = {.struct_size = sizeof src, .backend = "fake", .world_size = 1, .ops = &ops};
    vh_comm comm;
    vh_comm_ops copy;
    char why[256];
    assert_int_equal(comm_upgrade(&comm, &copy, &src, why, sizeof why), VH_STATUS_ERR_COMM);
    assert_non_null(strstr(why, "barrier"));
    src.struct_size = 8; /* smaller than any 2.x vh_comm */
    ops.barrier = fake_barrier;
    assert_int_equal(comm_upgrade(&comm, &copy, &src, why, sizeof why), VH_STATUS_ERR_COMM);
    assert_non_null(strstr(why, "malformed"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_older_comm_read_at_its_size),
        cmocka_unit_test(test_abi22_ops_have_no_gather),
        cmocka_unit_test(test_missing_required_call_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
