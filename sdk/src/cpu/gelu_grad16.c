/* gelu_grad16.c - gelu'(x) for bf16 pre-activations: AMP's GELU backward,
 * the op (dx (+)= dout gelu'(x)) and ABI 2.7's GELU_BACKWARD GEMM epilogue
 * (dx = bf16(T) gelu'(x), from the GEMM's own fp32 T).
 *
 * A bf16 x has 65536 values, so gelu'(x) = cdf + x pdf, an erfc polynomial,
 * a division and an exponential, can be a table lookup: table[bits of x],
 * filled by a clone of this file (the ISA and FMA contraction of the fp32
 * gelu_backward that the same CPU runs), so d + dout * table[x] has the bits
 * of the fp32 op on the widened values, rounded once (test_ops_dtypes: every
 * x). 256 KiB, of which a layer's activations touch a few KiB. Or it can be
 * computed with that same formula in the loop: the same bits again. Which is
 * faster depends on the CPU, so the first calls of a process race the two
 * (below; VITHOST_CPU_GELU_GRAD16=table|computed forces one):
 * - Zen 4, 2 threads, interleaved pairs of `vithost bench --ops` on
 *   bench_step.py's recipes, the op, ms a step, table / computed: T1 AMP
 *   1.97 / 2.64 (6 pairs), T3 AMP 10.32 / 13.49 (4). GCC 12 builds the
 *   lookups as single loads (no vgatherdps under its generic tuning); an
 *   AVX-512 loop on vgatherdps measured the same (2.16 / 2.80, 10.23 /
 *   13.05).
 * - Xeon with AMX (model 207), 2 threads, T1 AMP, fc2's data gradient with
 *   the epilogue, ms a step, 4 interleaved pairs: table 5.03-5.12, computed
 *   4.35-4.49; later, the race below: table 1.37-1.66, computed 1.29-1.80 ns
 *   a value, each the faster in some process (a near tie: the lookups went
 *   one lane at a time there). With the lookups as AVX-512 gathers (below):
 *   table 0.65-0.78, computed 1.13-1.30 ns a value, and fc2's data gradient
 *   2.51-2.63 ms a step against 4.46-4.68 (3 interleaved pairs).
 *
 * Two bf16 values per 32-bit word (low half first): every value of a loop
 * is 32-bit, so it vectorises at the full width of the clone (a loop mixing
 * 16- and 32-bit values gets half-width float vectors from GCC). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vithost/vh_cpu_engine.h"

#include "cpu_ops.h"
#include "../gelu_erf.h"

static float table16[1 << 16];

VH_CPU_CLONES static void table_fill(float *table) {
#pragma omp simd
    for (int64_t i = 0; i < (1 << 16); i++) {
        float pdf;
        const float v = vh_cpu_bits_f32((uint32_t)i << 16);
        const float cdf = vh_gelu_cdf(v, &pdf);
        table[i] = cdf + v * pdf;
    }
}

/* gelu'(x) of the bf16 x in the low (hi = 0) or high half of the word w. */
__attribute__((always_inline)) static inline float grad_of(uint32_t w, int hi,
                                                           const float *table) {
    if (table) return table[hi ? w >> 16 : w & 0xffffu];
    float pdf;
    const float v = vh_cpu_bits_f32(hi ? w & 0xffff0000u : w << 16);
    const float cdf = vh_gelu_cdf(v, &pdf);
    return cdf + v * pdf;
}

/* dx (+)= dout gelu'(x) on n values; overwrite: dx taken as 0 (+0.0),
 * never read. table NULL: computed. Pairs where the arrays are word-aligned
 * (all are in a step), then single values. Each clone below is this body
 * with constant arguments, so that each loop vectorises on its own and the
 * single values contract as the pairs do (the fp32 op's FMAs). */
__attribute__((always_inline)) static inline void op_span(uint16_t *dx, const uint16_t *x,
                                                          const uint16_t *dout, int64_t n,
                                                          int overwrite, const float *table) {
    int64_t i = 0;
    if (((uintptr_t)dx | (uintptr_t)x | (uintptr_t)dout) % 4 == 0) {
        uint32_t *dw = (uint32_t *)(void *)dx;
        const uint32_t *xw = (const uint32_t *)(const void *)x;
        const uint32_t *gw = (const uint32_t *)(const void *)dout;
#pragma omp simd
        for (int64_t p = 0; p < n / 2; p++) {
            const uint32_t xv = xw[p], gv = gw[p], dv = overwrite ? 0u : dw[p];
            const float lo = vh_cpu_bits_f32(dv << 16) +
                             vh_cpu_bits_f32(gv << 16) * grad_of(xv, 0, table);
            const float hi = vh_cpu_bits_f32(dv & 0xffff0000u) +
                             vh_cpu_bits_f32(gv & 0xffff0000u) * grad_of(xv, 1, table);
            dw[p] = vh_cpu_bf16_round32(lo) | (vh_cpu_bf16_round32(hi) << 16);
        }
        i = n / 2 * 2;
    }
    for (; i < n; i++) {
        const float d = overwrite ? 0.0f : vh_cpu_bf16_widen(dx[i]);
        dx[i] = vh_cpu_bf16_round(d + vh_cpu_bf16_widen(dout[i]) * grad_of(x[i], 0, table));
    }
}

/* (table16 itself, not a pointer argument: grad_of's test of the pointer
 * must fold, or the loop computes both and blends, 3x slower.) */
VH_CPU_CLONES static void op_span_table(uint16_t *dx, const uint16_t *x, const uint16_t *dout,
                                        int64_t n, int overwrite) {
    if (overwrite)
        op_span(dx, x, dout, n, 1, table16);
    else
        op_span(dx, x, dout, n, 0, table16);
}

VH_CPU_CLONES static void op_span_computed(uint16_t *dx, const uint16_t *x,
                                           const uint16_t *dout, int64_t n, int overwrite) {
    if (overwrite)
        op_span(dx, x, dout, n, 1, NULL);
    else
        op_span(dx, x, dout, n, 0, NULL);
}

/* The epilogue: dout = bf16(t), as the GEMM would have stored it, and dx =
 * bf16(0 + dout gelu'(x)), op_span's numbers with overwrite. */
__attribute__((always_inline)) static inline void epilogue_span(uint16_t *dx, const uint16_t *x,
                                                                const float *t, int64_t n,
                                                                const float *table) {
    int64_t i = 0;
    if (((uintptr_t)dx | (uintptr_t)x) % 4 == 0) {
        uint32_t *dw = (uint32_t *)(void *)dx;
        const uint32_t *xw = (const uint32_t *)(const void *)x;
#pragma omp simd
        for (int64_t p = 0; p < n / 2; p++) {
            const uint32_t xv = xw[p];
            const uint32_t dlo = vh_cpu_bf16_round32(t[2 * p]);
            const uint32_t dhi = vh_cpu_bf16_round32(t[2 * p + 1]);
            const float lo = 0.0f + vh_cpu_bits_f32(dlo << 16) * grad_of(xv, 0, table);
            const float hi = 0.0f + vh_cpu_bits_f32(dhi << 16) * grad_of(xv, 1, table);
            dw[p] = vh_cpu_bf16_round32(lo) | (vh_cpu_bf16_round32(hi) << 16);
        }
        i = n / 2 * 2;
    }
    for (; i < n; i++) {
        const float d = vh_cpu_bf16_widen(vh_cpu_bf16_round(t[i]));
        dx[i] = vh_cpu_bf16_round(0.0f + d * grad_of(x[i], 0, table));
    }
}

VH_CPU_CLONES static void epilogue_span_table(uint16_t *dx, const uint16_t *x, const float *t,
                                              int64_t n) {
    epilogue_span(dx, x, t, n, table16);
}

/* ---- the table on AVX-512: 16 lookups in one vgatherdps ---------------------
 * GCC builds the loops above with one scalar load per lookup. On the Xeon
 * with AMX (model 207), one thread, 16384 values in L2, ns a value (three
 * rounds): the epilogue with these gathers 0.33-0.49, the loop's lookups
 * 0.87-0.98, computed 0.84-1.10 (on Zen 4 the two lookups measured the
 * same, above). The same bits as the loops: each value is fma(dout,
 * table[x], d) rounded by bf16_round_avx512.h's integer steps, as the
 * clone contracts and rounds it; hence only in optimised builds (an
 * unoptimised one does not contract). First n / 16 * 16 values; returns how
 * many it did (0 where the CPU lacks AVX-512). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(VH_CPU_NO_CLONES) && defined(__OPTIMIZE__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")

#include "bf16_round_avx512.h"

__attribute__((always_inline)) static inline __m512 widen16(const uint16_t *p) {
    return vh_avx512_widen_bf16(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

/* table16[x] for 16 bf16 x */
__attribute__((always_inline)) static inline __m512 lookup16(const uint16_t *x) {
    const __m512i idx = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)x));
    return _mm512_i32gather_ps(idx, table16, 4);
}

static int64_t op_gather_v4(uint16_t *dx, const uint16_t *x, const uint16_t *dout, int64_t n,
                            int overwrite) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 d = overwrite ? _mm512_setzero_ps() : widen16(dx + i);
        const __m512 y = _mm512_fmadd_ps(widen16(dout + i), lookup16(x + i), d);
        _mm256_storeu_si256((__m256i *)(void *)(dx + i), vh_avx512_round_bf16(y));
    }
    return i;
}

static int64_t epilogue_gather_v4(uint16_t *dx, const uint16_t *x, const float *t, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 d = vh_avx512_widen_bf16(vh_avx512_round_bf16(_mm512_loadu_ps(t + i)));
        const __m512 y = _mm512_fmadd_ps(d, lookup16(x + i), _mm512_setzero_ps());
        _mm256_storeu_si256((__m256i *)(void *)(dx + i), vh_avx512_round_bf16(y));
    }
    return i;
}

#pragma GCC pop_options

static int64_t op_gather(uint16_t *dx, const uint16_t *x, const uint16_t *dout, int64_t n,
                         int overwrite) {
    return vh_cpu_has_avx512() ? op_gather_v4(dx, x, dout, n, overwrite) : 0;
}

static int64_t epilogue_gather(uint16_t *dx, const uint16_t *x, const float *t, int64_t n) {
    return vh_cpu_has_avx512() ? epilogue_gather_v4(dx, x, t, n) : 0;
}
#else
static int64_t op_gather(uint16_t *dx, const uint16_t *x, const uint16_t *dout, int64_t n,
                         int overwrite) {
    (void)dx, (void)x, (void)dout, (void)n, (void)overwrite;
    return 0;
}

static int64_t epilogue_gather(uint16_t *dx, const uint16_t *x, const float *t, int64_t n) {
    (void)dx, (void)x, (void)t, (void)n;
    return 0;
}
#endif

/* The table way: the gathers, then the loop for what they left. */
static void op_table(uint16_t *dx, const uint16_t *x, const uint16_t *dout, int64_t n,
                     int overwrite) {
    const int64_t done = op_gather(dx, x, dout, n, overwrite);
    if (done < n) op_span_table(dx + done, x + done, dout + done, n - done, overwrite);
}

static void epilogue_table(uint16_t *dx, const uint16_t *x, const float *t, int64_t n) {
    const int64_t done = epilogue_gather(dx, x, t, n);
    if (done < n) epilogue_span_table(dx + done, x + done, t + done, n - done);
}

VH_CPU_CLONES static void epilogue_span_computed(uint16_t *dx, const uint16_t *x,
                                                 const float *t, int64_t n) {
    epilogue_span(dx, x, t, n, NULL);
}

/* ---- the choice -------------------------------------------------------------
 * Decided on the step's own calls, as they run: until each way has done
 * RACE_ELEMS values, calls alternate between the two (the same bits), each
 * timed on its thread, then the way whose median span is faster per value
 * takes every later call. A microbenchmark alone misled: with its data in
 * cache the table won by 15% on the Xeon above, where in the step, after
 * each band's matmul and beside the other thread, it lost by 13%.
 * The median, not the sum: the race is about 1 ms of work per way, so one
 * span that stalls for a few ms (the thread descheduled, say) decided a
 * sum. On Zen 5 one process of six took the formula so (table 5.24 ns a
 * value, computed 0.60), where the table was the faster in the step: T1
 * AMP, forced, 3 interleaved pairs, fc2's data gradient 2.16-2.23 ms a step
 * with the table, 2.53-2.84 computed. */
#define RACE_ELEMS ((int64_t)1 << 21) /* T1 AMP: its first step's first two layers */
#define RACE_SPANS 256 /* timed spans kept per way: T1's bands give about 130 */
#define RACE_MIN_SPANS 3 /* so that one stalled span is never the median */
/* Computed only when faster by this much: on a tie the table, which reads a
 * few KiB of it where the math runs per element. */
#define COMPUTED_MARGIN 0.03

enum { WAY_TABLE = 0, WAY_COMPUTED = 1, WAY_RACING = -1 };

static struct {
    pthread_once_t once;
    pthread_mutex_t lock; /* the race's sums */
    int way;              /* WAY_*: read relaxed, written once under lock */
    int forced;           /* by VITHOST_CPU_GELU_GRAD16 */
    unsigned calls;       /* while racing: alternates the ways */
    int64_t elems[2];     /* per way, timed */
    int spans[2];         /* per way, the timed spans kept in span_ns */
    float span_ns[2][RACE_SPANS]; /* ns a value of each */
    double median_ns[2];  /* once decided */
} choice = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, WAY_RACING, 0, 0, {0, 0}, {0, 0},
            {{0}}, {0.0, 0.0}};

static void choose(void) {
    table_fill(table16);
    const char *env = getenv("VITHOST_CPU_GELU_GRAD16");
    if (!env || !*env || strcmp(env, "auto") == 0) return; /* racing */
    if (strcmp(env, "table") == 0 || strcmp(env, "computed") == 0) {
        choice.forced = 1;
        __atomic_store_n(&choice.way, strcmp(env, "computed") == 0 ? WAY_COMPUTED : WAY_TABLE,
                         __ATOMIC_RELAXED);
        return;
    }
    fprintf(stderr, "vithost: VITHOST_CPU_GELU_GRAD16=%s is not table, computed or auto; using "
                    "auto\n", env);
}

/* The way this call takes; *racing set when it is to be timed. */
static int way_for_call(int *racing) {
    pthread_once(&choice.once, choose);
    int way = __atomic_load_n(&choice.way, __ATOMIC_RELAXED);
    *racing = way == WAY_RACING;
    if (*racing) way = (int)(__atomic_fetch_add(&choice.calls, 1u, __ATOMIC_RELAXED) & 1u);
    return way;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), n > 0; sorts v. */
static double median_of(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5 * ((double)v[n / 2 - 1] + (double)v[n / 2]);
}

static void race_add(int way, int64_t n, double dt) {
    if (n <= 0) return;
    pthread_mutex_lock(&choice.lock);
    if (choice.way == WAY_RACING) {
        choice.elems[way] += n;
        if (choice.spans[way] < RACE_SPANS)
            choice.span_ns[way][choice.spans[way]++] = (float)(1e9 * dt / (double)n);
        if (choice.elems[0] >= RACE_ELEMS && choice.elems[1] >= RACE_ELEMS &&
            choice.spans[0] >= RACE_MIN_SPANS && choice.spans[1] >= RACE_MIN_SPANS) {
            const double t = median_of(choice.span_ns[0], choice.spans[0]);
            const double c = median_of(choice.span_ns[1], choice.spans[1]);
            choice.median_ns[0] = t, choice.median_ns[1] = c;
            __atomic_store_n(&choice.way,
                             c < (1.0 - COMPUTED_MARGIN) * t ? WAY_COMPUTED : WAY_TABLE,
                             __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&choice.lock);
}

const char *vh_cpu_gelu_grad16_summary(char *buf, size_t len) {
    if (!buf || !len) return buf;
    pthread_once(&choice.once, choose); /* after the variable is read */
    pthread_mutex_lock(&choice.lock);
    const int way = choice.way, forced = choice.forced;
    const double ns[2] = {choice.median_ns[0], choice.median_ns[1]};
    const int spans[2] = {choice.spans[0], choice.spans[1]};
    pthread_mutex_unlock(&choice.lock);
    const char *how = way == WAY_COMPUTED ? "computed" : "a table lookup";
    if (forced)
        snprintf(buf, len, "bf16 gelu': %s (VITHOST_CPU_GELU_GRAD16=%s)", how,
                 way == WAY_COMPUTED ? "computed" : "table");
    else if (way == WAY_RACING)
        snprintf(buf, len, "bf16 gelu': not decided yet (table and computed race on the first "
                           "%lld values each)", (long long)RACE_ELEMS);
    else
        snprintf(buf, len, "bf16 gelu': auto: %s (in the step, median of %d / %d spans: table "
                           "%.3f, computed %.3f ns a value)", how, spans[0], spans[1], ns[0], ns[1]);
    return buf;
}

/* ---- the entries ------------------------------------------------------------ */

void vh_cpu_k_gelu_backward_bf16_serial(uint16_t *dx, const uint16_t *x, const uint16_t *dout,
                                        int64_t n, int overwrite) {
    int racing;
    const int way = way_for_call(&racing);
    const double t0 = racing ? vh_cpu_seconds() : 0.0;
    if (way == WAY_COMPUTED)
        op_span_computed(dx, x, dout, n, overwrite);
    else
        op_table(dx, x, dout, n, overwrite);
    if (racing) race_add(way, n, vh_cpu_seconds() - t0);
}

void vh_cpu_k_gelu_backward_f32_to_bf16_serial(uint16_t *dx, const uint16_t *x, const float *t,
                                               int64_t n) {
    int racing;
    const int way = way_for_call(&racing);
    const double t0 = racing ? vh_cpu_seconds() : 0.0;
    if (way == WAY_COMPUTED)
        epilogue_span_computed(dx, x, t, n);
    else
        epilogue_table(dx, x, t, n);
    if (racing) race_add(way, n, vh_cpu_seconds() - t0);
}
