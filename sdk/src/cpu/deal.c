/* deal.c - which thread runs which attention blocks and GEMM bands.
 *
 * Each thread takes one contiguous run of them, the same rows from one op
 * to the next, where it used to take the next chunk as it came free. Why:
 * the guest this engine was last tuned on (Zen 5, 2 vCPUs) runs at times in
 * a slow mode, a cache line taking 340-440 ns between the two threads
 * instead of 73-175 (bench/probe_threads), most likely its two vCPUs on two
 * L3 domains; then every row one thread writes and the other reads next
 * crosses between them, and an op that deals its work one chunk at a time
 * hands about half its rows to the other thread's caches. The row-split
 * ops (layer norm, GELU, residuals, conversions: `schedule(static)`) give
 * thread t the t-th share of the rows; here the attention blocks (a
 * sample's heads) and the fused GEMMs' bands follow the same split.
 * bench_step.py's recipes, `vithost bench` (T1 30 steps, T2 6, T3 5),
 * pairs alternated for 12 minutes with probe_threads before each pair,
 * median step, one at a time / here, ms (pairs faster here):
 *   T1 AMP   slow mode 23.24 / 20.71 (23 of 23)  fast 19.16 / 18.94 (9 of 12)
 *   T1 fp32  slow mode 30.85 / 28.55 (22 of 22)  fast 29.47 / 28.98 (14 of 14)
 *   T2 fp32  slow mode 351.2 / 341.7 (20 of 22)  fast 337.2 / 337.8 (8 of 13)
 *   T3 fp32  slow mode 521.6 / 522.7 (12 of 21)  fast 509.3 / 511.2 (8 of 14)
 * (an earlier 6-minute run of T1 AMP alone: slow 22.87 / 20.27, 78 of 80;
 * fast 18.64 / 18.58). T3's tensors go to memory either way. What it
 * gives up: a thread held up by a neighbour on its vCPU now holds up the
 * op, where the other thread used to take over its chunks; in the pairs
 * above that cost less than the rows' trips. The bands split by rows, not
 * by count: T3's 13 bands (twelve of 128 rows, one of 40) as 7 and 6 gave
 * one thread 896 rows and the other 680, where dealing one at a time ran
 * 67.0-68.1 ms a step against 75.7-77.6 (Zen 4, fc1 under AMP); at the
 * nearest boundary it is 768 and 808. VITHOST_CPU_DEAL=dynamic deals one
 * chunk at a time again (read at each call), to compare. Which thread runs
 * an item never changes its sums. */
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "cpu_ops.h"

int vh_cpu_deal_dynamic(void) {
    const char *env = getenv("VITHOST_CPU_DEAL");
    return env && strcmp(env, "dynamic") == 0;
}

/* The first item of share s of `threads`: the chunk boundary nearest to
 * s / threads of the rows. */
static int64_t share_edge(const vh_cpu_deal *d, int64_t s, int threads, int64_t unit,
                          int64_t total) {
    if (s >= threads) return d->count;
    const double rows = (double)total * (double)s / (double)threads;
    const double chunk_rows = (double)unit * (double)d->chunk;
    int64_t e = (int64_t)(rows / chunk_rows + 0.5) * d->chunk;
    return e < 0 ? 0 : e > d->count ? d->count : e;
}

void vh_cpu_deal_init(vh_cpu_deal *d, int dynamic, int64_t *next, int64_t count, int64_t chunk,
                      int64_t unit, int64_t total) {
    memset(d, 0, sizeof *d);
    d->next = next;
    d->count = count > 0 ? count : 0;
    d->chunk = chunk > 0 ? chunk : 1;
    d->dynamic = dynamic && next;
    if (d->dynamic) return;
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    unit = unit > 0 ? unit : 1;
    d->lo = share_edge(d, t, threads, unit, total);
    d->hi = share_edge(d, t + 1, threads, unit, total);
}

int vh_cpu_deal_take(vh_cpu_deal *d, int64_t *lo, int64_t *hi) {
    if (!d->dynamic) {
        if (d->taken || d->lo >= d->hi) return 0;
        d->taken = 1;
        *lo = d->lo, *hi = d->hi;
        return 1;
    }
    const int64_t c = __atomic_fetch_add(d->next, 1, __ATOMIC_RELAXED);
    if (c * d->chunk >= d->count) return 0;
    *lo = c * d->chunk;
    *hi = *lo + d->chunk < d->count ? *lo + d->chunk : d->count;
    return 1;
}
