/* test_comm_mpi.c - libvh_comm_mpi.so under `mpirun -np 3`: every collective
 * on every dtype it takes, against values computed here from each rank's
 * data. The data are small integers and halves, so sums are exact in every
 * dtype at every partial sum (whatever tree MPI reduces along) and the only
 * rounding is the one AVG's division makes, which the test reproduces.
 *
 * Every rank runs every test; only rank 0 prints cmocka's report (the others'
 * failures still reach stderr and their exit status). A failing check ends
 * its test early on that rank only, so each test starts all of its
 * collectives before it checks anything, and an alarm ends a hung run.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_types.h"

#define WORLD 3
#define N 37 /* elements per rank: not a multiple of anything MPI might chunk by */

static void *lib;
static vh_comm_open_fn open_fn;
static vh_comm_close_fn close_fn;
static vh_comm *comm;

/* Rank r's value at i: small signed integers plus halves (exact in bf16/f16). */
static float value(int r, int i) { return (float)((r + 1) * (i % 9 - 4)) + 0.5f * (float)r; }

static float reduce_ref(int i, vh_reduce_op op, int world) {
    float acc = value(0, i);
    for (int r = 1; r < world; r++) {
        float v = value(r, i);
        if (op == VH_REDUCE_OP_MAX) acc = v > acc ? v : acc;
        else if (op == VH_REDUCE_OP_MIN) acc = v < acc ? v : acc;
        else acc += v;
    }
    return op == VH_REDUCE_OP_AVG ? acc / (float)world : acc;
}

static const vh_reduce_op all_ops[] = {VH_REDUCE_OP_SUM, VH_REDUCE_OP_AVG, VH_REDUCE_OP_MAX,
                                       VH_REDUCE_OP_MIN};

/* ---- basics ------------------------------------------------------------------- */

static void test_identity(void **state) {
    (void)state;
    assert_string_equal(comm->backend, "mpi");
    assert_int_equal(comm->struct_size, sizeof *comm);
    /* every call of this SDK, the 2.3 gather too */
    assert_true(VH_STRUCT_HAS(comm->ops, vh_comm_ops, gather_start) && comm->ops->gather_start);
    assert_int_equal(comm->world_size, WORLD);
    assert_true(comm->rank >= 0 && comm->rank < WORLD);
    assert_true(comm->local_size >= 1 && comm->local_size <= WORLD);
    assert_true(comm->local_rank >= 0 && comm->local_rank < comm->local_size);
    /* Each rank's local_size counts the ranks of its machine, so the sum over
     * ranks is the sum of the machines' sizes squared: at least the world. */
    int32_t sizes[WORLD];
    int32_t mine = comm->local_size;
    assert_int_equal(vh_comm_all_gather(comm, &mine, sizes, 1, VH_DTYPE_I32), VH_STATUS_OK);
    int32_t total = 0;
    for (int r = 0; r < WORLD; r++) total += sizes[r];
    assert_true(total >= WORLD);
    assert_int_equal(comm->ops->barrier(comm), VH_STATUS_OK);
}

/* ---- all_reduce --------------------------------------------------------------- */

static void test_all_reduce_f32(void **state) {
    (void)state;
    float buf[4][N];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < N; i++) buf[k][i] = value(comm->rank, i);
    vh_status st[4];
    for (int k = 0; k < 4; k++)
        st[k] = vh_comm_all_reduce(comm, buf[k], N, VH_DTYPE_F32, all_ops[k]);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(st[k], VH_STATUS_OK);
        for (int i = 0; i < N; i++) assert_true(buf[k][i] == reduce_ref(i, all_ops[k], WORLD));
    }
}

static void test_all_reduce_f64(void **state) {
    (void)state;
    double buf[4][N];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < N; i++) buf[k][i] = (double)value(comm->rank, i);
    vh_status st[4];
    for (int k = 0; k < 4; k++)
        st[k] = vh_comm_all_reduce(comm, buf[k], N, VH_DTYPE_F64, all_ops[k]);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(st[k], VH_STATUS_OK);
        for (int i = 0; i < N; i++) {
            double want = (double)reduce_ref(i, all_ops[k] == VH_REDUCE_OP_AVG
                                                    ? VH_REDUCE_OP_SUM : all_ops[k], WORLD);
            if (all_ops[k] == VH_REDUCE_OP_AVG) want /= WORLD;
            assert_true(buf[k][i] == want);
        }
    }
}

static void test_all_reduce_int(void **state) {
    (void)state;
    int32_t b32[3][N];
    int64_t avg64[N];
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 3; k++) b32[k][i] = (comm->rank + 1) * (i - 10);
        avg64[i] = (int64_t)(comm->rank + 1) * (i - 10) * 1000000000LL;
    }
    vh_status st[4];
    for (int k = 0; k < 3; k++)
        st[k] = vh_comm_all_reduce(comm, b32[k], N, VH_DTYPE_I32,
                                   (vh_reduce_op[]){VH_REDUCE_OP_SUM, VH_REDUCE_OP_MAX,
                                                    VH_REDUCE_OP_MIN}[k]);
    st[3] = vh_comm_all_reduce(comm, avg64, N, VH_DTYPE_I64, VH_REDUCE_OP_AVG);
    for (int k = 0; k < 4; k++) assert_int_equal(st[k], VH_STATUS_OK);
    for (int i = 0; i < N; i++) {
        int32_t x = i - 10;
        assert_int_equal(b32[0][i], 6 * x);
        assert_int_equal(b32[1][i], x >= 0 ? 3 * x : x);
        assert_int_equal(b32[2][i], x >= 0 ? x : 3 * x);
        assert_true(avg64[i] == 2LL * x * 1000000000LL); /* 6x / 3: exact */
    }
}

/* f16 and bf16: the reference computed in f32 and rounded once, as the
 * backend's AVG does (the sums themselves are exact). */
static void check_half_all_reduce(vh_dtype dtype) {
    uint16_t (*to16)(float) = dtype == VH_DTYPE_F16 ? vh_f32_to_f16 : vh_f32_to_bf16;
    uint16_t buf[4][N];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < N; i++) buf[k][i] = to16(value(comm->rank, i));
    vh_status st[4];
    for (int k = 0; k < 4; k++) st[k] = vh_comm_all_reduce(comm, buf[k], N, dtype, all_ops[k]);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(st[k], VH_STATUS_OK);
        for (int i = 0; i < N; i++) assert_int_equal(buf[k][i], to16(reduce_ref(i, all_ops[k], WORLD)));
    }
}

static void test_all_reduce_bf16(void **state) {
    (void)state;
    check_half_all_reduce(VH_DTYPE_BF16);
}

static void test_all_reduce_f16(void **state) {
    (void)state;
    check_half_all_reduce(VH_DTYPE_F16);
}

/* Each combine rounds to nearest even: 256 + 1 + 1 in bf16 (8 significant
 * bits) is 256 whichever pair MPI adds first (256+1 ties to 256, 1+1=2 then
 * 256+2=258). The ranks agree, and the result is one of those two. */
static void test_half_rounding(void **state) {
    (void)state;
    uint16_t x = vh_f32_to_bf16(comm->rank == 0 ? 256.0f : 1.0f);
    uint16_t all[WORLD];
    vh_status st = vh_comm_all_reduce(comm, &x, 1, VH_DTYPE_BF16, VH_REDUCE_OP_SUM);
    vh_status st2 = vh_comm_all_gather(comm, &x, all, 1, VH_DTYPE_BF16);
    assert_int_equal(st, VH_STATUS_OK);
    assert_int_equal(st2, VH_STATUS_OK);
    float got = vh_bf16_to_f32(x);
    assert_true(got == 256.0f || got == 258.0f);
    for (int r = 0; r < WORLD; r++) assert_int_equal(all[r], x);
}

/* ---- reduce_scatter ------------------------------------------------------------ */

static void test_reduce_scatter(void **state) {
    (void)state;
    float send[WORLD * N], sum[N], avg[N];
    uint16_t hsend[WORLD * N], hsum[N], havg[N];
    for (int j = 0; j < WORLD * N; j++) {
        send[j] = value(comm->rank, j);
        hsend[j] = vh_f32_to_bf16(send[j]);
    }
    vh_status st[4];
    st[0] = vh_comm_reduce_scatter(comm, send, sum, N, VH_DTYPE_F32, VH_REDUCE_OP_SUM);
    st[1] = vh_comm_reduce_scatter(comm, send, avg, N, VH_DTYPE_F32, VH_REDUCE_OP_AVG);
    st[2] = vh_comm_reduce_scatter(comm, hsend, hsum, N, VH_DTYPE_BF16, VH_REDUCE_OP_SUM);
    st[3] = vh_comm_reduce_scatter(comm, hsend, havg, N, VH_DTYPE_BF16, VH_REDUCE_OP_AVG);
    /* In place: send == recv, this rank's block lands at the start. */
    float inplace[WORLD * N];
    memcpy(inplace, send, sizeof inplace);
    vh_status st_in = vh_comm_reduce_scatter(comm, inplace, inplace, N, VH_DTYPE_F32,
                                             VH_REDUCE_OP_SUM);
    for (int k = 0; k < 4; k++) assert_int_equal(st[k], VH_STATUS_OK);
    assert_int_equal(st_in, VH_STATUS_OK);
    for (int i = 0; i < N; i++) {
        int j = comm->rank * N + i; /* this rank's block of the world*N */
        assert_true(sum[i] == reduce_ref(j, VH_REDUCE_OP_SUM, WORLD));
        assert_true(avg[i] == reduce_ref(j, VH_REDUCE_OP_AVG, WORLD));
        assert_true(inplace[i] == sum[i]);
        assert_int_equal(hsum[i], vh_f32_to_bf16(reduce_ref(j, VH_REDUCE_OP_SUM, WORLD)));
        assert_int_equal(havg[i], vh_f32_to_bf16(reduce_ref(j, VH_REDUCE_OP_AVG, WORLD)));
    }
}

/* ---- all_gather, broadcast ------------------------------------------------------ */

static void test_all_gather(void **state) {
    (void)state;
    float send[N], recv[WORLD * N];
    uint8_t bsend[N], brecv[WORLD * N];
    for (int i = 0; i < N; i++) {
        send[i] = value(comm->rank, i);
        bsend[i] = (uint8_t)(comm->rank * 100 + i);
    }
    vh_status st = vh_comm_all_gather(comm, send, recv, N, VH_DTYPE_F32);
    vh_status st2 = vh_comm_all_gather(comm, bsend, brecv, N, VH_DTYPE_U8);
    /* In place: this rank's part already at its place in recv. */
    float inplace[WORLD * N];
    for (int i = 0; i < N; i++) inplace[comm->rank * N + i] = value(comm->rank, i);
    vh_status st3 = vh_comm_all_gather(comm, inplace + comm->rank * N, inplace, N, VH_DTYPE_F32);
    assert_int_equal(st, VH_STATUS_OK);
    assert_int_equal(st2, VH_STATUS_OK);
    assert_int_equal(st3, VH_STATUS_OK);
    for (int r = 0; r < WORLD; r++)
        for (int i = 0; i < N; i++) {
            assert_true(recv[r * N + i] == value(r, i));
            assert_true(inplace[r * N + i] == value(r, i));
            assert_int_equal(brecv[r * N + i], (uint8_t)(r * 100 + i));
        }
}

static void test_broadcast(void **state) {
    (void)state;
    float a[N];
    uint8_t b[N];
    for (int i = 0; i < N; i++) {
        a[i] = value(comm->rank, i);
        b[i] = (uint8_t)(comm->rank + i);
    }
    vh_status st = vh_comm_broadcast(comm, a, N, VH_DTYPE_F32, 1);
    vh_status st2 = vh_comm_broadcast(comm, b, N, VH_DTYPE_U8, 2);
    assert_int_equal(st, VH_STATUS_OK);
    assert_int_equal(st2, VH_STATUS_OK);
    for (int i = 0; i < N; i++) {
        assert_true(a[i] == value(1, i));
        assert_int_equal(b[i], (uint8_t)(2 + i));
    }
}

/* ---- gather (ABI 2.3) ----------------------------------------------------------- */

/* Rank r's part: unequal, and empty on rank 1. */
static int part(int r) { return r == 1 ? 0 : 7 * r + 3; }

/* Unequal parts to one rank: the root receives exactly every rank's part,
 * rank after rank, and nothing past them; the other ranks' receive buffers
 * (given here, though they may be NULL) and every send buffer stay as they
 * were. Roots 0 and 2, f32 and u8, and the root's part already in place. */
static void test_gather(void **state) {
    (void)state;
    enum { CAP = 3 + 0 + 17 + 5 }; /* the parts, and 5 past them that stay */
    const int me = comm->rank, mine = part(me);
    size_t counts[WORLD];
    for (int r = 0; r < WORLD; r++) counts[r] = (size_t)part(r);
    float send[32], recv[CAP], inplace[CAP];
    uint8_t bsend[32], brecv[CAP];
    for (int i = 0; i < 32; i++) send[i] = value(me, i), bsend[i] = (uint8_t)(me * 50 + i);
    for (int i = 0; i < CAP; i++) recv[i] = inplace[i] = -99.0f, brecv[i] = 0xEE;
    const int mine_at = me == 0 ? 0 : 3; /* where this rank's part lands at the root */
    for (int i = 0; i < mine; i++) inplace[mine_at + i] = value(me, i);
    vh_status st[3];
    st[0] = vh_comm_gather(comm, send, (size_t)mine, recv, me == 0 ? counts : NULL,
                           VH_DTYPE_F32, 0);
    st[1] = vh_comm_gather(comm, bsend, (size_t)mine, brecv, me == 2 ? counts : NULL,
                           VH_DTYPE_U8, 2);
    st[2] = vh_comm_gather(comm, inplace + mine_at, (size_t)mine, inplace,
                           me == 0 ? counts : NULL, VH_DTYPE_F32, 0);
    for (int k = 0; k < 3; k++) assert_int_equal(st[k], VH_STATUS_OK);
    for (int i = 0; i < 32; i++) {
        assert_true(send[i] == value(me, i));
        assert_int_equal(bsend[i], (uint8_t)(me * 50 + i));
    }
    int at = 0;
    for (int r = 0; r < WORLD; r++)
        for (int i = 0; i < part(r); i++, at++) {
            assert_true(me == 0 ? recv[at] == value(r, i) : recv[at] == -99.0f);
            assert_true(me == 0 ? inplace[at] == value(r, i) : 1);
            assert_int_equal(brecv[at], me == 2 ? (uint8_t)(r * 50 + i) : 0xEE);
        }
    for (; at < CAP; at++) {
        assert_true(recv[at] == -99.0f && inplace[at] == -99.0f);
        assert_int_equal(brecv[at], 0xEE);
    }
}

/* ---- requests ------------------------------------------------------------------ */

/* Two collectives in flight, finished in the reverse order of their start. */
static void test_two_in_flight(void **state) {
    (void)state;
    float a[N], g[WORLD * N], s[N];
    for (int i = 0; i < N; i++) a[i] = s[i] = value(comm->rank, i);
    vh_comm_request *r1 = NULL, *r2 = NULL;
    vh_status st1 = comm->ops->all_reduce_start(comm, a, N, VH_DTYPE_F32, VH_REDUCE_OP_AVG,
                                                NULL, &r1);
    vh_status st2 = comm->ops->all_gather_start(comm, s, g, N, VH_DTYPE_F32, NULL, &r2);
    vh_status w2 = comm->ops->wait(comm, r2);
    vh_status w1 = comm->ops->wait(comm, r1);
    assert_int_equal(st1, VH_STATUS_OK);
    assert_int_equal(st2, VH_STATUS_OK);
    assert_int_equal(w1, VH_STATUS_OK);
    assert_int_equal(w2, VH_STATUS_OK);
    for (int i = 0; i < N; i++) {
        assert_true(a[i] == reduce_ref(i, VH_REDUCE_OP_AVG, WORLD));
        for (int r = 0; r < WORLD; r++) assert_true(g[r * N + i] == value(r, i));
    }
}

/* test() drives the collective until it reports done; wait then only
 * post-processes (AVG's division) and frees. */
static void test_test_until_done(void **state) {
    (void)state;
    enum { BIG = 1 << 16 };
    float *buf = malloc(BIG * sizeof *buf);
    assert_non_null(buf);
    for (int i = 0; i < BIG; i++) buf[i] = value(comm->rank, i);
    vh_comm_request *r = NULL;
    vh_status st = comm->ops->all_reduce_start(comm, buf, BIG, VH_DTYPE_F32, VH_REDUCE_OP_AVG,
                                               NULL, &r);
    int done = 0;
    long polls = 0;
    vh_status tst = VH_STATUS_OK;
    while (st == VH_STATUS_OK && tst == VH_STATUS_OK && !done && polls < 100000000L) {
        tst = comm->ops->test(comm, r, &done);
        polls++;
    }
    int done_again = 0;
    vh_status tst2 = st == VH_STATUS_OK ? comm->ops->test(comm, r, &done_again) : st;
    vh_status w = comm->ops->wait(comm, r);
    assert_int_equal(st, VH_STATUS_OK);
    assert_int_equal(tst, VH_STATUS_OK);
    assert_int_equal(tst2, VH_STATUS_OK);
    assert_int_equal(done, 1);
    assert_int_equal(done_again, 1);
    assert_int_equal(w, VH_STATUS_OK);
    for (int i = 0; i < BIG; i++)
        if (buf[i] != reduce_ref(i, VH_REDUCE_OP_AVG, WORLD)) fail_msg("element %d", i);
    free(buf);
}

/* A zero count is a collective that moves nothing. */
static void test_count_zero(void **state) {
    (void)state;
    float x = 7.0f, y[WORLD] = {1, 2, 3};
    vh_status st[5];
    st[0] = vh_comm_all_reduce(comm, &x, 0, VH_DTYPE_F32, VH_REDUCE_OP_AVG);
    st[1] = vh_comm_reduce_scatter(comm, y, &x, 0, VH_DTYPE_BF16, VH_REDUCE_OP_SUM);
    st[2] = vh_comm_all_gather(comm, &x, y, 0, VH_DTYPE_U8);
    st[3] = vh_comm_broadcast(comm, &x, 0, VH_DTYPE_F64, 2);
    st[4] = vh_comm_all_reduce(comm, NULL, 0, VH_DTYPE_F16, VH_REDUCE_OP_MAX);
    const size_t none[WORLD] = {0, 0, 0};
    vh_status gst = vh_comm_gather(comm, &x, 0, NULL, comm->rank == 1 ? none : NULL,
                                   VH_DTYPE_F32, 1);
    for (int k = 0; k < 5; k++) assert_int_equal(st[k], VH_STATUS_OK);
    assert_int_equal(gst, VH_STATUS_OK);
    assert_true(x == 7.0f);
    assert_true(y[0] == 1 && y[1] == 2 && y[2] == 3);
}

/* Refused before any MPI call, the same on every rank: nothing starts. */
static void test_invalid_args(void **state) {
    (void)state;
    const vh_comm_ops *o = comm->ops;
    float buf[WORLD] = {0};
    vh_comm_request *r = (vh_comm_request *)buf; /* must stay untouched... */
    vh_comm_request *keep = r;
    assert_int_equal(o->all_reduce_start(comm, buf, 1, (vh_dtype)99, VH_REDUCE_OP_SUM, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->all_reduce_start(comm, buf, 1, VH_DTYPE_F32, (vh_reduce_op)7, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->all_reduce_start(comm, buf, 1, VH_DTYPE_F32, VH_REDUCE_OP_SUM, NULL, NULL),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->all_reduce_start(comm, buf, (size_t)INT_MAX + 1, VH_DTYPE_F32,
                                         VH_REDUCE_OP_SUM, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->reduce_scatter_start(comm, buf, buf, 1, VH_DTYPE_F32, (vh_reduce_op)-1,
                                             NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->reduce_scatter_start(comm, buf, buf, 1, (vh_dtype)99, VH_REDUCE_OP_SUM,
                                             NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->all_gather_start(comm, buf, buf, 1, (vh_dtype)-1, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->broadcast_start(comm, buf, 1, VH_DTYPE_F32, 3, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->broadcast_start(comm, buf, 1, VH_DTYPE_F32, -1, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    const size_t ones[WORLD] = {1, 1, 1};
    assert_int_equal(o->gather_start(comm, buf, 1, buf, ones, VH_DTYPE_F32, WORLD, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->gather_start(comm, buf, 1, buf, ones, (vh_dtype)99, 0, NULL, &r),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_ptr_equal(r, keep); /* ...by every refusal */
    int done;
    assert_int_equal(o->test(comm, NULL, &done), VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(o->wait(comm, NULL), VH_STATUS_OK);
    /* Still in step afterwards. */
    assert_int_equal(o->barrier(comm), VH_STATUS_OK);
}

/* ---- main ---------------------------------------------------------------------- */

int main(void) {
    /* A rank whose test failed mid-way leaves the others in a collective:
     * end the job instead of waiting for ctest's timeout. */
    alarm(120);
    char path[4200];
    snprintf(path, sizeof path, "%s/lib/libvh_comm_mpi.so", VH_TEST_BUILD_DIR);
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "test_comm_mpi: cannot load %s: %s\n", path, dlerror());
        return 1;
    }
    *(void **)&open_fn = dlsym(lib, VH_COMM_OPEN_SYMBOL);
    *(void **)&close_fn = dlsym(lib, VH_COMM_CLOSE_SYMBOL);
    if (!open_fn || !close_fn) {
        fprintf(stderr, "test_comm_mpi: %s lacks %s or %s\n", path, VH_COMM_OPEN_SYMBOL,
                VH_COMM_CLOSE_SYMBOL);
        return 1;
    }
    char err[512];
    /* A host of another ABI is refused with a message, before MPI starts. */
    vh_comm_open_args bad = {.struct_size = sizeof bad, .abi_major = VH_ABI_MAJOR + 1};
    if (open_fn(&bad, &comm, err, sizeof err) != VH_STATUS_ERR_INVALID_ARG || comm ||
        !strstr(err, "ABI")) {
        fprintf(stderr, "test_comm_mpi: open accepted ABI %d (err: %s)\n", VH_ABI_MAJOR + 1, err);
        return 1;
    }
    vh_comm_open_args args = {.struct_size = sizeof args, .abi_major = VH_ABI_MAJOR,
                              .abi_minor = VH_ABI_MINOR, .device = NULL};
    if (open_fn(&args, &comm, err, sizeof err) != VH_STATUS_OK) {
        fprintf(stderr, "test_comm_mpi: open: %s\n", err);
        return 1;
    }
    if (comm->world_size != WORLD) {
        fprintf(stderr, "test_comm_mpi: run me under mpirun -np %d (world is %d)\n", WORLD,
                comm->world_size);
        close_fn(comm);
        return 1;
    }
    /* cmocka's report from rank 0; failures still reach stderr from all. */
    if (comm->rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_all_reduce_f32),
        cmocka_unit_test(test_all_reduce_f64),
        cmocka_unit_test(test_all_reduce_int),
        cmocka_unit_test(test_all_reduce_bf16),
        cmocka_unit_test(test_all_reduce_f16),
        cmocka_unit_test(test_half_rounding),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_two_in_flight),
        cmocka_unit_test(test_test_until_done),
        cmocka_unit_test(test_count_zero),
        cmocka_unit_test(test_invalid_args),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    close_fn(comm);
    dlclose(lib);
    return failed ? 1 : 0;
}
