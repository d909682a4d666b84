/* test_nccl_id_mpi.c - the NCCL backend's id exchange (sdk/comm_nccl/
 * comm_nccl_id.c) under `mpirun -np 2`, with no GPU: every rank ends with
 * the root's 128 bytes and the root's verdict, whichever rank is root and
 * whatever the others held before.
 *
 * Every rank runs every test; only rank 0 prints cmocka's report (the
 * others' failures still reach stderr and their exit status). Each test
 * makes its collective call before it checks anything, so a failing check
 * on one rank cannot leave the other waiting, and an alarm ends a hung run.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm_nccl_id.h"

#define WORLD 2

static int rank, world;

/* The id root r would make in round k: distinct per byte, root and round. */
static unsigned char id_byte(int root, int round, int i) {
    return (unsigned char)(i * 7 + root * 31 + round * 101 + 1);
}

/* One exchange from `root`: root fills its id and verdict, the others hold
 * garbage of their own; everyone must end with root's. */
static void exchange_from(int root, int round, int root_ok) {
    unsigned char id[VH_NCCL_ID_BYTES];
    int ok = rank == root ? root_ok : 7;
    for (int i = 0; i < VH_NCCL_ID_BYTES; i++)
        id[i] = rank == root ? id_byte(root, round, i) : (unsigned char)(0xA5 ^ rank);
    int rc = vh_nccl_exchange_id(MPI_COMM_WORLD, root, id, &ok);
    assert_int_equal(rc, MPI_SUCCESS);
    assert_int_equal(ok, root_ok ? 1 : 0);
    for (int i = 0; i < VH_NCCL_ID_BYTES; i++) assert_int_equal(id[i], id_byte(root, round, i));
}

static void test_root0(void **state) {
    (void)state;
    exchange_from(0, 0, 1);
}

/* Not only rank 0 can be root. */
static void test_root_last(void **state) {
    (void)state;
    exchange_from(world - 1, 1, 1);
}

/* A root that could not make an id says so to all: none may join NCCL. */
static void test_root_failed(void **state) {
    (void)state;
    exchange_from(0, 2, 0);
}

/* Repeated exchanges keep their order (no message of one meets another). */
static void test_many_rounds(void **state) {
    (void)state;
    for (int k = 0; k < 20; k++) exchange_from(k % world, 3 + k, k % 3 != 0);
}

int main(int argc, char **argv) {
    /* A rank whose test failed mid-way may leave the other in MPI_Bcast:
     * end the job instead of waiting for ctest's timeout. */
    alarm(60);
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != WORLD) {
        fprintf(stderr, "test_nccl_id_mpi: run me under mpirun -np %d (world is %d)\n", WORLD,
                world);
        MPI_Finalize();
        return 1;
    }
    /* cmocka's report from rank 0; failures still reach stderr from all. */
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_root0),
        cmocka_unit_test(test_root_last),
        cmocka_unit_test(test_root_failed),
        cmocka_unit_test(test_many_rounds),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* Every rank's verdict decides the exit status of every rank. */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
