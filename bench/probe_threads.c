/* probe_threads.c - how far apart this process's two threads sit: the
 * round-trip time of one cache line handed back and forth between them
 * (an atomic counter each thread waits on in turn). On the Zen 5 guest of
 * bench/README.md ("What the slow mode is") the round trip was 80-175 ns in
 * most minutes and 370-440 ns in others, and T1 AMP's step was 19.6 ms on
 * average in the first, 22.8 in the second: the two vCPUs on two L3
 * domains at times, by all appearances. bench_step.py runs it before each
 * of vithost's runs and prints it beside the run, so a run in such minutes
 * is marked. Prints one line:
 *
 *   ROUNDTRIP {"ns": 118.2}
 *
 * the median of 9 batches of 20000 round trips (a few ms in all). Not a
 * test: ctest never runs it. */
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BATCHES 9
#define TRIPS 20000

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    static _Alignas(64) atomic_long turn;
    double ns[BATCHES];
    int threads = 0;
    for (int b = 0; b < BATCHES; b++) {
        double t0 = 0.0, t1 = 0.0;
        atomic_store(&turn, 0);
#pragma omp parallel num_threads(2)
        {
            const long me = omp_get_thread_num();
#pragma omp single
            threads = omp_get_num_threads();
            if (threads == 2) { /* implicit barrier of single: both start together */
                if (me == 0) t0 = now();
                for (long i = 0; i < TRIPS; i++) {
                    const long mine = 2 * i + me; /* thread 0 moves on even turns */
                    while (atomic_load_explicit(&turn, memory_order_acquire) != mine) {
                    }
                    atomic_store_explicit(&turn, mine + 1, memory_order_release);
                }
                if (me == 0) t1 = now();
            }
        }
        if (threads != 2) {
            fprintf(stderr, "probe_threads: OpenMP gave %d thread(s), not 2\n", threads);
            return 1;
        }
        ns[b] = (t1 - t0) / TRIPS * 1e9;
    }
    qsort(ns, BATCHES, sizeof ns[0], by_value);
    printf("ROUNDTRIP {\"ns\": %.1f}\n", ns[BATCHES / 2]);
    return 0;
}
