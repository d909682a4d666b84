/* test_cuda_nccl.c - libvh_comm_nccl.so in one process: a world of one rank
 * on GPU 0, opened on the CUDA device as the host opens it. World 1 still
 * makes real NCCL calls (ncclCommInitRank, every collective on our stream),
 * so this checks the plumbing: dtypes and ops accepted, device buffers in
 * and out, in-place and out-of-place layouts, requests in flight, test and
 * wait, zero counts, refused arguments, ordering after the caller's work.
 * The results of one rank are its inputs (AVG over one rank included).
 *
 * Without a GPU (or without the CUDA library) gpu_twin_open prints the one
 * SKIPPED line and exits 77; a build without libvh_comm_nccl.so (no NCCL or
 * no MPI) does the same here. MPI starts as a singleton (no mpirun).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu_twin.h"
#include "vithost/vh_comm.h"

#define N 1031 /* elements: odd, not a multiple of any chunk NCCL uses */

static gpu_twin t;
static void *lib;
static vh_comm *comm;
static vh_comm_close_fn close_fn;

static const vh_dtype float_dtypes[] = {VH_DTYPE_F32, VH_DTYPE_BF16, VH_DTYPE_F16};
static const vh_reduce_op all_ops[] = {VH_REDUCE_OP_SUM, VH_REDUCE_OP_AVG, VH_REDUCE_OP_MAX,
                                       VH_REDUCE_OP_MIN};

static void fill(float *x, int64_t n, uint64_t seed) { gpu_twin_fill(x, n, seed, -4.0f, 4.0f); }

/* The values of x after a round trip through `dtype` (what the GPU holds). */
static void rounded(float *out, const float *x, int64_t n, vh_dtype dtype) {
    void *h = gpu_twin_host(x, n, dtype);
    gpu_twin_widen(out, h, n, dtype);
    free(h);
}

/* dev's n values of dtype equal the host values x, rounded to dtype. */
static void expect_equal(const char *what, const void *dev, const float *x, int64_t n,
                         vh_dtype dtype) {
    float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    rounded(want, x, n, dtype);
    gpu_twin_download(&t, got, dev, n, dtype);
    int same = memcmp(want, got, (size_t)n * sizeof *got) == 0;
    if (!same) gpu_twin_close_enough(what, got, want, n, 0.0);
    free(want);
    free(got);
    assert_true(same);
}

static void test_identity(void **state) {
    (void)state;
    assert_string_equal(comm->backend, "nccl");
    assert_int_equal(comm->struct_size, sizeof *comm);
    assert_int_equal(comm->world_size, 1);
    assert_int_equal(comm->rank, 0);
    assert_int_equal(comm->local_rank, 0);
    assert_int_equal(comm->local_size, 1);
    assert_non_null(comm->ops->broadcast_start);
    assert_non_null(comm->ops->test);
    assert_int_equal(comm->ops->barrier(comm), VH_STATUS_OK);
}

/* Every float dtype and op, all four requests in flight before any wait. */
static void test_all_reduce(void **state) {
    (void)state;
    float x[N];
    for (int d = 0; d < 3; d++) {
        void *buf[4];
        vh_comm_request *req[4];
        fill(x, N, 10u + (uint64_t)d);
        for (int k = 0; k < 4; k++) buf[k] = gpu_twin_upload(&t, x, N, float_dtypes[d]);
        for (int k = 0; k < 4; k++)
            assert_int_equal(comm->ops->all_reduce_start(comm, buf[k], N, float_dtypes[d],
                                                         all_ops[k], NULL, &req[k]),
                             VH_STATUS_OK);
        for (int k = 3; k >= 0; k--) assert_int_equal(comm->ops->wait(comm, req[k]), VH_STATUS_OK);
        for (int k = 0; k < 4; k++) {
            expect_equal("all_reduce", buf[k], x, N, float_dtypes[d]);
            gpu_twin_free(&t, buf[k]);
        }
    }
}

/* Integers travel too (i32 here): raw bytes in and out. */
static void test_all_reduce_i32(void **state) {
    (void)state;
    int32_t h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = (i - 500) * 3;
    void *d = NULL;
    assert_int_equal(t.gpu.alloc(t.gpu.device, sizeof h, &d), VH_STATUS_OK);
    assert_int_equal(t.gpu.copy(t.gpu.device, d, h, sizeof h, VH_COPY_KIND_HOST_TO_DEVICE, NULL),
                     VH_STATUS_OK);
    assert_int_equal(vh_comm_all_reduce(comm, d, N, VH_DTYPE_I32, VH_REDUCE_OP_SUM), VH_STATUS_OK);
    assert_int_equal(vh_comm_all_reduce(comm, d, N, VH_DTYPE_I32, VH_REDUCE_OP_AVG), VH_STATUS_OK);
    assert_int_equal(t.gpu.copy(t.gpu.device, back, d, sizeof h, VH_COPY_KIND_DEVICE_TO_HOST,
                                NULL),
                     VH_STATUS_OK);
    assert_memory_equal(back, h, sizeof h);
    gpu_twin_free(&t, d);
}

/* Out of place, and in place (send == recv: this rank's block at recv). */
static void test_reduce_scatter(void **state) {
    (void)state;
    float x[N];
    for (int d = 0; d < 3; d++) {
        fill(x, N, 20u + (uint64_t)d);
        void *send = gpu_twin_upload(&t, x, N, float_dtypes[d]);
        void *recv = gpu_twin_upload(&t, x, N, float_dtypes[d]);
        assert_int_equal(t.gpu.memset_zero(t.gpu.device, recv, N * vh_dtype_size(float_dtypes[d]),
                                           NULL),
                         VH_STATUS_OK);
        assert_int_equal(vh_comm_reduce_scatter(comm, send, recv, N, float_dtypes[d],
                                                VH_REDUCE_OP_AVG),
                         VH_STATUS_OK);
        expect_equal("reduce_scatter", recv, x, N, float_dtypes[d]);
        assert_int_equal(vh_comm_reduce_scatter(comm, send, send, N, float_dtypes[d],
                                                VH_REDUCE_OP_SUM),
                         VH_STATUS_OK);
        expect_equal("reduce_scatter in place", send, x, N, float_dtypes[d]);
        gpu_twin_free(&t, send);
        gpu_twin_free(&t, recv);
    }
}

/* Out of place, in place, and a send that overlaps recv elsewhere (staged). */
static void test_all_gather(void **state) {
    (void)state;
    float x[N];
    for (int d = 0; d < 3; d++) {
        const vh_dtype dt = float_dtypes[d];
        const size_t es = vh_dtype_size(dt);
        fill(x, N, 30u + (uint64_t)d);
        void *send = gpu_twin_upload(&t, x, N, dt);
        void *recv = gpu_twin_upload(&t, x, N, dt);
        assert_int_equal(t.gpu.memset_zero(t.gpu.device, recv, N * es, NULL), VH_STATUS_OK);
        assert_int_equal(vh_comm_all_gather(comm, send, recv, N, dt), VH_STATUS_OK);
        expect_equal("all_gather", recv, x, N, dt);
        assert_int_equal(vh_comm_all_gather(comm, recv, recv, N, dt), VH_STATUS_OK);
        expect_equal("all_gather in place", recv, x, N, dt);
        /* send = recv + 1 element: overlapping, not NCCL's in-place layout. */
        void *big = gpu_twin_upload(&t, x, N, dt);
        assert_int_equal(vh_comm_all_gather(comm, (char *)big + es, big, N - 1, dt),
                         VH_STATUS_OK);
        expect_equal("all_gather overlapping", big, x + 1, N - 1, dt);
        gpu_twin_free(&t, send);
        gpu_twin_free(&t, recv);
        gpu_twin_free(&t, big);
    }
}

static void test_broadcast_and_test(void **state) {
    (void)state;
    float x[N];
    fill(x, N, 40u);
    void *buf = gpu_twin_upload(&t, x, N, VH_DTYPE_BF16);
    vh_comm_request *req = NULL;
    assert_int_equal(comm->ops->broadcast_start(comm, buf, N, VH_DTYPE_BF16, 0, NULL, &req),
                     VH_STATUS_OK);
    int done = 0;
    for (int i = 0; i < 1000000 && !done; i++)
        assert_int_equal(comm->ops->test(comm, req, &done), VH_STATUS_OK);
    assert_true(done);
    assert_int_equal(comm->ops->wait(comm, req), VH_STATUS_OK);
    expect_equal("broadcast", buf, x, N, VH_DTYPE_BF16);
    gpu_twin_free(&t, buf);
}

/* A collective reads what the caller's stream wrote before it started. */
static void test_ordered_after_caller(void **state) {
    (void)state;
    enum { BIG = 1 << 22 };
    float *x = calloc(BIG, sizeof *x), *zeros = calloc(BIG, sizeof *zeros);
    assert_non_null(x);
    assert_non_null(zeros);
    for (int i = 0; i < BIG; i++) x[i] = 1.0f + (float)(i % 7);
    void *send = gpu_twin_upload(&t, x, BIG, VH_DTYPE_F32);
    void *recv = gpu_twin_upload(&t, x, BIG, VH_DTYPE_F32);
    /* Issued (asynchronously) to the current stream just before the gather. */
    assert_int_equal(t.gpu.memset_zero(t.gpu.device, send, BIG * sizeof(float), NULL),
                     VH_STATUS_OK);
    assert_int_equal(vh_comm_all_gather(comm, send, recv, BIG, VH_DTYPE_F32), VH_STATUS_OK);
    expect_equal("ordered after memset", recv, zeros, BIG, VH_DTYPE_F32);
    gpu_twin_free(&t, send);
    gpu_twin_free(&t, recv);
    free(x);
    free(zeros);
}

/* Zero counts are fine (even with NULL buffers); bad arguments are refused
 * before anything starts. */
static void test_edges(void **state) {
    (void)state;
    vh_comm_request *req = NULL;
    assert_int_equal(vh_comm_all_reduce(comm, NULL, 0, VH_DTYPE_F32, VH_REDUCE_OP_SUM),
                     VH_STATUS_OK);
    assert_int_equal(vh_comm_reduce_scatter(comm, NULL, NULL, 0, VH_DTYPE_F16, VH_REDUCE_OP_MAX),
                     VH_STATUS_OK);
    assert_int_equal(vh_comm_all_gather(comm, NULL, NULL, 0, VH_DTYPE_U8), VH_STATUS_OK);
    assert_int_equal(comm->ops->all_reduce_start(comm, NULL, 4, VH_DTYPE_F32, VH_REDUCE_OP_SUM,
                                                 NULL, &req),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(comm->ops->all_reduce_start(comm, NULL, 0, (vh_dtype)99, VH_REDUCE_OP_SUM,
                                                 NULL, &req),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(comm->ops->all_reduce_start(comm, NULL, 0, VH_DTYPE_F32, (vh_reduce_op)9,
                                                 NULL, &req),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(comm->ops->broadcast_start(comm, NULL, 0, VH_DTYPE_F32, 1, NULL, &req),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(comm->ops->all_gather_start(comm, NULL, NULL, 0, VH_DTYPE_F32, NULL, NULL),
                     VH_STATUS_ERR_INVALID_ARG);
    assert_int_equal(comm->ops->wait(comm, NULL), VH_STATUS_OK);
}

/* The library, opened as the host opens it, or the SKIPPED line. */
static vh_comm *open_nccl(void) {
    char path[4200], err[512];
    snprintf(path, sizeof path, "%s/lib/libvh_comm_nccl.so", VH_TEST_BUILD_DIR);
    if (access(path, F_OK) != 0) {
        printf("SKIPPED: test_cuda_nccl: this build has no libvh_comm_nccl.so (NCCL or MPI "
               "not found)\n");
        exit(GPU_TWIN_SKIP);
    }
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "test_cuda_nccl: cannot load %s: %s\n", path, dlerror());
        exit(1);
    }
    vh_comm_open_fn open_fn;
    *(void **)&open_fn = dlsym(lib, VH_COMM_OPEN_SYMBOL);
    *(void **)&close_fn = dlsym(lib, VH_COMM_CLOSE_SYMBOL);
    if (!open_fn || !close_fn) {
        fprintf(stderr, "test_cuda_nccl: %s lacks %s or %s\n", path, VH_COMM_OPEN_SYMBOL,
                VH_COMM_CLOSE_SYMBOL);
        exit(1);
    }
    vh_comm_open_args bad = {.struct_size = sizeof bad, .abi_major = VH_ABI_MAJOR + 1};
    vh_comm *c = NULL;
    if (open_fn(&bad, &c, err, sizeof err) != VH_STATUS_ERR_INVALID_ARG || c ||
        !strstr(err, "ABI")) {
        fprintf(stderr, "test_cuda_nccl: open accepted ABI %d (%s)\n", VH_ABI_MAJOR + 1, err);
        exit(1);
    }
    vh_comm_open_args args = {.struct_size = sizeof args, .abi_major = VH_ABI_MAJOR,
                              .abi_minor = VH_ABI_MINOR, .device = &t.gpu};
    if (open_fn(&args, &c, err, sizeof err) != VH_STATUS_OK || !c) {
        fprintf(stderr, "test_cuda_nccl: open: %s\n", err);
        exit(1);
    }
    return c;
}

int main(void) {
    alarm(300); /* a hung collective ends the test, not ctest's timeout */
    gpu_twin_open(&t, "test_cuda_nccl");
    comm = open_nccl();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_all_reduce_i32),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_broadcast_and_test),
        cmocka_unit_test(test_ordered_after_caller),
        cmocka_unit_test(test_edges),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    close_fn(comm);
    /* (the library is never unloaded: -z nodelete, as MPI cannot restart) */
    gpu_twin_close(&t);
    return failed ? 1 : 0;
}
