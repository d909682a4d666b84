/* gemm_choice.c - which path a GEMM with 16-bit operands takes (gemm.c asks).
 *
 * Two paths give the same result: "native" hands the bf16 operands to
 * oneDNN's bf16 kernels; "widen" converts them to f32 first and runs the f32
 * kernels. The product of two bf16 values (8-bit significands) is exact in
 * f32 (24 bits), and both paths accumulate in f32, so both deliver the
 * fp32-accumulated GEMM the AMP policy promises; they differ only in the
 * order of the f32 sums (last bits, like any two GEMM kernels). Which is
 * faster depends on the CPU: on Zen 5 bf16 kernels run at about twice the
 * f32 rate, on Intel cores without AMX (avx512_bf16 only) a bf16 dot product
 * does no more work per cycle than two f32 FMAs and the native path is
 * slower than widening (MACHINE-NOTES.md). So the engine measures.
 *
 * Shape class: (dtype, trans_a, trans_b, batched or not, floor(log2(batch *
 * m * n * k)) / 2), i.e. the layout and the work within a factor of 4. A ViT
 * step has about a dozen: the linear layers' forward (B^T), data gradient
 * (plain) and weight gradient (A^T) in one or two size buckets each, and the
 * batched attention products. The first GEMM of a class decides for all of
 * it, once per process: on that call's own operands (as views, nothing is
 * copied but the widening itself), one warm-up run of each path (creates
 * the primitives), then TIMED_RUNS timed runs of each, interleaved, best of
 * each. A win for the path not preferred on a tie (widen; below, the gemm
 * kernel) is confirmed by a second race, the best of both races counting:
 * on a shared machine a neighbour's burst can slow every timed run of one
 * path. With two runs and no second race, 2 of 8 processes of T2 under
 * AMP on a busy Xeon with AMX put a class on widen, one of them the
 * 4160x768x192 data gradient, which runs at half native's speed there.
 * Work above PROXY_MACS (or an output above PROXY_OUT elements) is measured
 * on a proxy: the same operands with batch, then the largest of m, n, k,
 * halved until it fits (never below 256). That bounds a run to about a
 * millisecond on the CPUs seen; T2 under AMP (13 classes) spends about 0.1 s
 * of its first step deciding. Widen wins only when faster by more
 * than WIDEN_MARGIN: on a near tie native reads half the bytes, and a fixed
 * preference keeps the choice from flipping between processes. Classes below
 * MIN_TIMED_MACS (a few microseconds, shorter than the timing noise) are not
 * timed and take native.
 *
 * Native has two kernels (dnnl_engine.h): oneDNN's default, brgemm, and its
 * gemm driver, which packs both operands. brgemm reads a transposed A
 * through a copy of its own; on Zen 5 the gemm kernel runs the weight
 * gradients (A^T.B, k the tokens: T3's 384x1536x1576) 10-12% faster in the
 * step. On the other layouts the gemm kernel could win the timing alone and
 * lose in the step (T1's 6400x256x64 A.B: 12% faster alone, 1.27 -> 1.66 ms
 * a step), so only an unbatched A^T.B class that goes native is timed once
 * more, default against gemm, on a larger proxy (KERNEL_PROXY_MACS: the full
 * T3 shapes; on the small proxy the two tie), and takes gemm only when it is
 * faster by more than KERNEL_MARGIN, with B flushed from the caches before
 * each timed run as in f32's race below (gemm.c's flush_from_forward: in
 * cache this race split either way from one process to the next on T3's
 * largest class, and put T2's on the default, where the step runs both
 * faster on gemm; the native / widen race of a weight gradient flushes its
 * B too). The same results up to the order of the f32 sums, as between
 * native and widen. A GEMM that gemm.c runs as two halves of k is asked
 * for as those (batched: no kernel choice).
 *
 * VITHOST_CPU_GEMM16=native|native_gemm|widen|auto (default auto), read at
 * the first GEMM (gemm.c asks for every one; and by vh_cpu_gemm16_reset);
 * native is oneDNN's default kernel. An invalid value is reported once on
 * stderr and auto is used: a tuning knob must not stop a run.
 * Native on a CPU without bf16 hardware (or f16 on oneDNN 2.x, which has no
 * f16 CPU kernels) falls back to widen, and the summary says so.
 *
 * f32 operands have one path and the same two kernels. The classes raced
 * are the weight gradients (A^T.B, unbatched or in halves of k) and fc2's
 * data gradient with its T * aux (MUL_AUX, timed with the multiply: a class
 * of its own, apart from the plain A.B of the same size, which prefers the
 * default). In the T1 fp32 step on Zen 4 (2 threads, interleaved runs of
 * `vithost bench --ops`, ms a step, default against gemm forced): the
 * weight gradients 256x64x6400 4.64-4.76 / 4.25-4.26, 64x256x6400
 * 4.36-4.39 / 3.94-3.99, 192x64x6400 3.59-3.68 / 3.26, fc2's data gradient
 * 6400x256x64 * aux 5.46-5.56 / 4.68-4.76; forced on every f32 GEMM, the
 * gemm kernel lost on fc1's (6.65 / 7.11), fc2's forward (4.67 / 4.93) and
 * fc1's data gradient (3.77 / 4.06). A raced class takes gemm when faster
 * by KERNEL_MARGIN32 (2%), confirmed by a second race, on the kernel proxy,
 * with the operand forward wrote flushed from the caches before each timed
 * run (gemm.c: a weight gradient's B, the layer's input; fc2's aux), as the
 * step reads it from memory; a T * aux that runs in bands of rows is timed
 * in them (gemm.c's time_path). Timed in cache the race understated what the step gains: T1's
 * T * aux raced 4-7% (either side of a 5% margin from one process to the
 * next) for 14% in the step; T3's 384x1536x1576 weight gradient 2-8% for
 * 8-10%, and 2 of 3 processes kept it on the default. Flushed and at 2%,
 * both go to gemm in every process tried (4 of 4 on T1, T3 and the main
 * job; T2's largest 3 of 4); interleaved `vithost bench --ops` against the
 * 5% race in cache, Zen 4, the step's medians: T3 fp32 0.978-0.991 (4
 * pairs), T1 fp32 0.983-1.000 (4), T2 fp32 and the main job even.
 * Classes under MIN_TIMED_MACS32 keep the default: the gains there are a
 * few microseconds (T1's 64x64 weight gradient raced 4-6%, on either side
 * of the margin from one process to the next), and runs of the models the
 * tests train (all under it) stay the same bits from process to process.
 * VITHOST_CPU_GEMM32=default|gemm|auto (default auto) forces it on the
 * raced classes (the others always run the default); read as GEMM16 is.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dnnl_engine.h"
#include "vithost/vh_cpu_engine.h"

#define MAX_CLASSES 64
#define PROXY_MACS (1LL << 26)
#define PROXY_OUT (1LL << 21)
#define PROXY_MIN_DIM 256
#define MIN_TIMED_MACS (1LL << 20)
#define WIDEN_MARGIN 1.10
#define TIMED_RUNS 4
#define KERNEL_PROXY_MACS (1LL << 30)
#define KERNEL_MARGIN 1.05
#define KERNEL_MARGIN32 1.02 /* f32: its race flushes (see the top of the file) */
#define KERNEL_TIMED_RUNS 4
#define MIN_TIMED_MACS32 (1LL << 25)

typedef enum { MODE_AUTO, MODE_NATIVE, MODE_NATIVE_GEMM, MODE_WIDEN } gemm16_mode;
typedef enum { MODE32_AUTO, MODE32_DEFAULT, MODE32_GEMM } gemm32_mode;

typedef struct shape_class {
    vh_dtype dtype;
    int trans_a, trans_b, batched, bucket, mul_aux;
    int native;               /* the choice */
    int timed;                /* 0: too small, or one path could not run */
    double t_native, t_widen; /* seconds, best of the races' runs, on the proxy */
    int gemm_kernel;          /* native on VH_DNNL_KERNEL_GEMM */
    int kernel_timed;         /* the kernels were compared */
    int restored;             /* taken from vh_cpu_gemm_choices_load, not timed here */
    double t_default, t_gemm; /* seconds, best of the races' runs, on kproxy */
    vh_gemm16_shape first;    /* the shape that decided */
    vh_gemm16_shape proxy, kproxy;
} shape_class;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_mode_read;
static gemm16_mode g_mode;
static char g_bad[40]; /* an invalid value of the variable, for the summary */
static gemm32_mode g_mode32;
static char g_bad32[40]; /* the same for VITHOST_CPU_GEMM32 */
static shape_class g_classes[MAX_CLASSES];
static int g_count;

/* The value of environment variable `var` as an index into names (names[0]
 * is "auto", also for unset or empty); an unknown value is reported once
 * on stderr, kept in bad for the summary, and read as auto. */
static int read_mode_var(const char *var, const char *const *names, int count, char *bad,
                         size_t bad_len) {
    bad[0] = '\0';
    const char *v = getenv(var);
    if (!v || !*v) return 0;
    for (int i = 0; i < count; i++)
        if (strcmp(v, names[i]) == 0) return i;
    snprintf(bad, bad_len, "%s", v);
    fprintf(stderr, "vithost: %s=%s is not ", var, bad);
    for (int i = 1; i < count; i++) fprintf(stderr, "%s, ", names[i]);
    fprintf(stderr, "or auto; using auto\n");
    return 0;
}

static void read_mode_locked(void) {
    if (g_mode_read) return;
    g_mode_read = 1;
    /* in the order of the enums */
    static const char *const names16[] = {"auto", "native", "native_gemm", "widen"};
    static const char *const names32[] = {"auto", "default", "gemm"};
    g_mode = (gemm16_mode)read_mode_var("VITHOST_CPU_GEMM16", names16, 4, g_bad, sizeof g_bad);
    g_mode32 =
        (gemm32_mode)read_mode_var("VITHOST_CPU_GEMM32", names32, 3, g_bad32, sizeof g_bad32);
}

static int hardware(vh_dtype t) {
    return t == VH_DTYPE_BF16 && vh_dnnl_isa_has(VH_DNNL_ISA_AVX512_CORE_BF16);
}

static double macs(const vh_gemm16_shape *s) {
    return (double)s->batch * (double)s->m * (double)s->n * (double)s->k;
}

static int same_class(const shape_class *a, const shape_class *b) {
    return a->dtype == b->dtype && a->trans_a == b->trans_a && a->trans_b == b->trans_b &&
           a->batched == b->batched && a->bucket == b->bucket && a->mul_aux == b->mul_aux;
}

static shape_class class_of(const vh_gemm16_shape *s) {
    shape_class c = {.dtype = s->dtype, .trans_a = !!s->trans_a, .trans_b = !!s->trans_b,
                     .batched = s->batch > 1, .mul_aux = !!s->mul_aux, .first = *s};
    const double w = macs(s);
    c.bucket = w >= 1.0 ? (int)floor(log2(w)) / 2 : 0;
    return c;
}

static shape_class *find_locked(const shape_class *key) {
    for (int i = 0; i < g_count; i++)
        if (same_class(&g_classes[i], key)) return &g_classes[i];
    return NULL;
}

/* The first batch x m x n x k of the operands, within max_macs and the
 * output limit. */
static vh_gemm16_shape proxy_of(const vh_gemm16_shape *s, long long max_macs) {
    vh_gemm16_shape p = *s;
    for (;;) {
        const double out = (double)p.batch * (double)p.m * (double)p.n;
        if (macs(&p) <= (double)max_macs && out <= (double)PROXY_OUT) break;
        if (p.batch > 1) {
            p.batch = (p.batch + 1) / 2;
            continue;
        }
        int64_t *big = &p.m;
        if (p.n > *big) big = &p.n;
        if (p.k > *big && macs(&p) > (double)max_macs) big = &p.k;
        if (*big <= PROXY_MIN_DIM) break;
        *big = (*big + 1) / 2;
    }
    return p;
}

/* Paths x and y on proxy p: one warm-up run of each (creates the
 * primitives), then `runs` timed runs interleaved; *tx, *ty the best of
 * each, or negative for a path that could not run. */
static void race(vh_gemm16_timer timer, void *ctx, int x, int y, const vh_gemm16_shape *p,
                 int runs, double *tx, double *ty) {
    *tx = timer(ctx, x, p);
    *ty = timer(ctx, y, p);
    if (*tx < 0.0 || *ty < 0.0) return;
    double bx = HUGE_VAL, by = HUGE_VAL;
    for (int i = 0; i < runs; i++) {
        const double a = timer(ctx, x, p), b = timer(ctx, y, p);
        if (a >= 0.0 && a < bx) bx = a;
        if (b >= 0.0 && b < by) by = b;
    }
    *tx = bx == HUGE_VAL ? -1.0 : bx;
    *ty = by == HUGE_VAL ? -1.0 : by;
}

/* Whether y (the path not preferred on a tie) beats x by more than margin
 * on proxy p: a race, and where y wins, a second race to confirm it, the
 * best of both counting. *tx, *ty: the best times, or negative for a path
 * that could not run (then the answer is 0). */
static int challenger_wins(vh_gemm16_timer timer, void *ctx, int x, int y,
                           const vh_gemm16_shape *p, int runs, double margin, double *tx,
                           double *ty) {
    race(timer, ctx, x, y, p, runs, tx, ty);
    if (*tx < 0.0 || *ty < 0.0 || !(*ty * margin < *tx)) return 0;
    double again_x, again_y;
    race(timer, ctx, x, y, p, runs, &again_x, &again_y);
    if (again_x >= 0.0 && again_x < *tx) *tx = again_x;
    if (again_y >= 0.0 && again_y < *ty) *ty = again_y;
    return *ty * margin < *tx;
}

/* Native's two kernels on the larger proxy. */
static void measure_kernel(shape_class *c, vh_gemm16_timer timer, void *ctx) {
    c->kproxy = proxy_of(&c->first, KERNEL_PROXY_MACS);
    double td, tg;
    const double margin = c->dtype == VH_DTYPE_F32 ? KERNEL_MARGIN32 : KERNEL_MARGIN;
    const int gemm = challenger_wins(timer, ctx, VH_GEMM16_NATIVE, VH_GEMM16_NATIVE_GEMM,
                                     &c->kproxy, KERNEL_TIMED_RUNS, margin, &td, &tg);
    if (td < 0.0 || tg < 0.0) return;
    c->kernel_timed = 1;
    c->t_default = td;
    c->t_gemm = tg;
    c->gemm_kernel = gemm;
}

/* The f32 classes whose kernel is raced (the header says why these). */
static int kernel_raced32(const vh_gemm16_shape *s) {
    return s->mul_aux || (s->trans_a && !s->trans_b);
}

/* Times the paths on the class's first shape and decides; f32: the kernels
 * alone. */
static void measure(shape_class *c, vh_gemm16_timer timer, void *ctx) {
    c->proxy = proxy_of(&c->first, PROXY_MACS);
    c->native = 1;
    if (c->dtype == VH_DTYPE_F32) {
        if (macs(&c->first) >= (double)MIN_TIMED_MACS32) measure_kernel(c, timer, ctx);
        return;
    }
    if (macs(&c->first) < (double)MIN_TIMED_MACS) return;
    double tn, tw;
    const int widen = challenger_wins(timer, ctx, VH_GEMM16_NATIVE, VH_GEMM16_WIDEN, &c->proxy,
                                      TIMED_RUNS, WIDEN_MARGIN, &tn, &tw);
    if (tn < 0.0 || tw < 0.0) { /* a path oneDNN cannot run: the other */
        c->native = tn >= 0.0;
        return;
    }
    c->timed = 1;
    c->t_native = tn;
    c->t_widen = tw;
    c->native = !widen;
    if (c->native && !c->batched && c->trans_a && !c->trans_b) measure_kernel(c, timer, ctx);
}

static vh_gemm16_path path_of(const shape_class *c) {
    return !c->native ? VH_GEMM16_WIDEN : c->gemm_kernel ? VH_GEMM16_NATIVE_GEMM
                                                         : VH_GEMM16_NATIVE;
}

vh_gemm16_path vh_gemm16_choose(const vh_gemm16_shape *s, vh_gemm16_timer timer, void *ctx) {
    pthread_mutex_lock(&g_lock);
    read_mode_locked();
    const gemm16_mode mode = g_mode;
    const gemm32_mode mode32 = g_mode32;
    pthread_mutex_unlock(&g_lock);
    if (s->dtype == VH_DTYPE_F32) { /* the kernels alone */
        if (!kernel_raced32(s) || mode32 == MODE32_DEFAULT) return VH_GEMM16_NATIVE;
        if (mode32 == MODE32_GEMM) return VH_GEMM16_NATIVE_GEMM;
    } else {
        if (!hardware(s->dtype) || mode == MODE_WIDEN) return VH_GEMM16_WIDEN;
        if (mode == MODE_NATIVE) return VH_GEMM16_NATIVE;
        if (mode == MODE_NATIVE_GEMM) return VH_GEMM16_NATIVE_GEMM;
    }
    shape_class key = class_of(s);
    pthread_mutex_lock(&g_lock);
    const shape_class *found = find_locked(&key);
    const int known = found != NULL;
    const vh_gemm16_path choice = found ? path_of(found) : VH_GEMM16_WIDEN;
    pthread_mutex_unlock(&g_lock);
    if (known) return choice;
    /* Measured outside the lock (it runs oneDNN and OpenMP); a thread that
     * measured the same class at the same time keeps the first answer. */
    measure(&key, timer, ctx);
    pthread_mutex_lock(&g_lock);
    found = find_locked(&key);
    if (!found && g_count < MAX_CLASSES) found = memcpy(&g_classes[g_count++], &key, sizeof key);
    const vh_gemm16_path path = path_of(found ? found : &key);
    pthread_mutex_unlock(&g_lock);
    return path;
}

int vh_gemm16_native(const vh_gemm16_shape *s, vh_gemm16_timer timer, void *ctx) {
    return vh_gemm16_choose(s, timer, ctx) != VH_GEMM16_WIDEN;
}

void vh_cpu_gemm16_reset(void) {
    pthread_mutex_lock(&g_lock);
    g_mode_read = 0;
    g_count = 0;
    read_mode_locked();
    pthread_mutex_unlock(&g_lock);
}

/* ---- what the host prints ---------------------------------------------------- */

static size_t append(char *buf, size_t len, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static size_t append(char *buf, size_t len, size_t at, const char *fmt, ...) {
    if (at >= len) return at;
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf + at, len - at, fmt, ap);
    va_end(ap);
    return w < 0 ? at : at + (size_t)w;
}

/* "native on 9 shape classes (1.92x widen's speed), widen on 1 (1.15x)" */
static size_t auto_counts_locked(char *buf, size_t len, size_t at, vh_dtype t) {
    int n[2] = {0, 0}, untimed = 0, on_gemm = 0;
    double logsum[2] = {0.0, 0.0};
    int timed[2] = {0, 0};
    for (int i = 0; i < g_count; i++) {
        const shape_class *c = &g_classes[i];
        if (c->dtype != t || c->restored) continue;
        n[c->native]++;
        on_gemm += c->native && c->gemm_kernel;
        if (!c->timed) {
            untimed += c->native;
            continue;
        }
        logsum[c->native] += c->native ? log(c->t_widen / c->t_native)
                                        : log(c->t_native / c->t_widen);
        timed[c->native]++;
    }
    if (n[0] + n[1] == 0)
        return append(buf, len, at, "auto, native or widen chosen per shape class at its "
                                    "first GEMM (%s has bf16 kernels)", vh_dnnl_isa_name());
    at = append(buf, len, at, "auto: native on %d shape class%s", n[1], n[1] == 1 ? "" : "es");
    if (timed[1]) at = append(buf, len, at, " (%.2fx widen", exp(logsum[1] / timed[1]));
    if (untimed) at = append(buf, len, at, "%s%d too small to time", timed[1] ? "; " : " (",
                             untimed);
    if (timed[1] || untimed) at = append(buf, len, at, ")");
    if (on_gemm) at = append(buf, len, at, ", %d of them on oneDNN's gemm kernel", on_gemm);
    at = append(buf, len, at, ", widen on %d", n[0]);
    if (timed[0]) at = append(buf, len, at, " (%.2fx native)", exp(logsum[0] / timed[0]));
    return at;
}

/* "; 3 shape classes as the checkpoint chose them" where a resumed run took
 * some (vh_cpu_gemm_choices_load); the summaries' counts leave them out. */
static size_t restored_locked(char *buf, size_t len, size_t at, vh_dtype t) {
    int n = 0;
    for (int i = 0; i < g_count; i++) n += g_classes[i].dtype == t && g_classes[i].restored;
    if (n == 0) return at;
    return append(buf, len, at, "; %d shape class%s as the checkpoint chose them", n,
                  n == 1 ? "" : "es");
}

/* "f32 GEMM: ..." (vh_cpu_gemm16_summary with VH_DTYPE_F32). */
static const char *summary32(char *buf, size_t len) {
    pthread_mutex_lock(&g_lock);
    read_mode_locked();
    size_t at = append(buf, len, 0, "f32 GEMM: ");
    int raced = 0, on_gemm = 0;
    double logsum = 0.0;
    for (int i = 0; i < g_count; i++) {
        const shape_class *c = &g_classes[i];
        if (c->dtype != VH_DTYPE_F32 || !c->kernel_timed) continue;
        raced++;
        on_gemm += c->gemm_kernel;
        if (c->gemm_kernel) logsum += log(c->t_default / c->t_gemm);
    }
    if (g_mode32 == MODE32_DEFAULT)
        at = append(buf, len, at, "oneDNN's default kernel (VITHOST_CPU_GEMM32=default)");
    else if (g_mode32 == MODE32_GEMM)
        at = append(buf, len, at, "oneDNN's gemm kernel on the weight gradients and T * aux "
                                  "(VITHOST_CPU_GEMM32=gemm)");
    else if (raced == 0)
        at = append(buf, len, at, "oneDNN's default kernel; for the weight gradients and T * "
                                  "aux, the faster of it and the gemm kernel, timed per shape "
                                  "class at its first GEMM");
    else if (on_gemm == 0)
        at = append(buf, len, at, "auto: the default kernel on all %d timed shape class%s",
                    raced, raced == 1 ? "" : "es");
    else
        at = append(buf, len, at, "auto: oneDNN's gemm kernel on %d of %d timed shape class%s "
                                  "(%.2fx the default)", on_gemm, raced,
                    raced == 1 ? "" : "es", exp(logsum / on_gemm));
    if (g_mode32 == MODE32_AUTO) at = restored_locked(buf, len, at, VH_DTYPE_F32);
    if (g_bad32[0]) append(buf, len, at, "; VITHOST_CPU_GEMM32=%s ignored", g_bad32);
    pthread_mutex_unlock(&g_lock);
    return buf;
}

const char *vh_cpu_gemm16_summary(int32_t dtype, char *buf, size_t len) {
    if (!buf || len == 0) return buf;
    if (dtype == VH_DTYPE_F32) return summary32(buf, len);
    const vh_dtype t = dtype == VH_DTYPE_F16 ? VH_DTYPE_F16 : VH_DTYPE_BF16;
    const int hw = hardware(t);
    pthread_mutex_lock(&g_lock);
    read_mode_locked();
    size_t at = append(buf, len, 0, "%s GEMM: ", t == VH_DTYPE_F16 ? "f16" : "bf16");
    if (!hw)
        at = append(buf, len, at, "widen to f32 (no %s kernels for %s)%s",
                    t == VH_DTYPE_F16 ? "f16" : "bf16", vh_dnnl_isa_name(),
                    g_mode == MODE_NATIVE        ? "; VITHOST_CPU_GEMM16=native not possible"
                    : g_mode == MODE_NATIVE_GEMM ? "; VITHOST_CPU_GEMM16=native_gemm not possible"
                                                 : "");
    else if (g_mode == MODE_NATIVE)
        at = append(buf, len, at, "native (VITHOST_CPU_GEMM16=native)");
    else if (g_mode == MODE_NATIVE_GEMM)
        at = append(buf, len, at,
                    "native on oneDNN's gemm kernel (VITHOST_CPU_GEMM16=native_gemm)");
    else if (g_mode == MODE_WIDEN)
        at = append(buf, len, at, "widen to f32 (VITHOST_CPU_GEMM16=widen)");
    else
        at = restored_locked(buf, len, auto_counts_locked(buf, len, at, t), t);
    if (g_bad[0]) append(buf, len, at, "; VITHOST_CPU_GEMM16=%s ignored", g_bad);
    pthread_mutex_unlock(&g_lock);
    return buf;
}

static const char *layout(const shape_class *c) {
    static const char *const names[4] = {"A.B", "A.B^T", "A^T.B", "A^T.B^T"};
    return names[c->trans_a * 2 + c->trans_b];
}

const char *vh_cpu_gemm16_classes(char *buf, size_t len) {
    if (!buf || len == 0) return buf;
    buf[0] = '\0';
    size_t at = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_count; i++) {
        const shape_class *c = &g_classes[i];
        const vh_gemm16_shape *f = &c->first, *p = &c->proxy;
        const int f32 = c->dtype == VH_DTYPE_F32;
        at = append(buf, len, at, "%s %-7s%s %s 2^%d-2^%d MACs",
                    f32 ? "f32" : c->dtype == VH_DTYPE_F16 ? "f16" : "bf16", layout(c),
                    c->mul_aux ? " *aux" : "", c->batched ? "batched" : "single ",
                    2 * c->bucket, 2 * c->bucket + 2);
        if (!c->restored)
            at = append(buf, len, at, ", e.g. %lldx%lldx%lldx%lld", (long long)f->batch,
                        (long long)f->m, (long long)f->n, (long long)f->k);
        at = append(buf, len, at, ": %s",
                    f32 ? (c->gemm_kernel ? "gemm kernel" : "default kernel")
                    : !c->native     ? "widen"
                    : c->gemm_kernel ? "native, gemm kernel"
                                     : "native");
        if (c->restored) {
            at = append(buf, len, at, " (as the run chose it before its checkpoint)\n");
            continue;
        }
        if (f32 && c->kernel_timed)
            at = append(buf, len, at, " (");
        else if (c->timed)
            at = append(buf, len, at, " (native %.3f ms, widen %.3f ms on %lldx%lldx%lldx%lld",
                        1e3 * c->t_native, 1e3 * c->t_widen, (long long)p->batch,
                        (long long)p->m, (long long)p->n, (long long)p->k);
        else
            at = append(buf, len, at, " (not timed");
        if (c->kernel_timed) {
            const vh_gemm16_shape *q = &c->kproxy;
            at = append(buf, len, at,
                        "%skernels: default %.3f ms, gemm %.3f ms on %lldx%lldx%lldx%lld",
                        f32 ? "" : "; ",
                        1e3 * c->t_default, 1e3 * c->t_gemm, (long long)q->batch,
                        (long long)q->m, (long long)q->n, (long long)q->k);
        }
        at = append(buf, len, at, ")");
        at = append(buf, len, at, "\n");
    }
    pthread_mutex_unlock(&g_lock);
    return buf;
}

/* ---- the choices kept with a checkpoint ----------------------------------------
 * One line per decided class: "gemm-choice <dtype> <trans_a> <trans_b> <batched>
 * <bucket> <mul_aux> <native> <gemm_kernel>". */

#define CHOICE_TAG "gemm-choice"

const char *vh_cpu_gemm_choices_save(char *buf, size_t len) {
    if (!buf || len == 0) return buf;
    buf[0] = '\0';
    size_t at = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_count; i++) {
        const shape_class *c = &g_classes[i];
        at = append(buf, len, at, CHOICE_TAG " %d %d %d %d %d %d %d %d\n", (int)c->dtype,
                    c->trans_a, c->trans_b, c->batched, c->bucket, c->mul_aux, c->native,
                    c->gemm_kernel);
    }
    pthread_mutex_unlock(&g_lock);
    return buf;
}

int vh_cpu_gemm_choices_load(const char *text) {
    int taken = 0;
    if (!text) return 0;
    pthread_mutex_lock(&g_lock);
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        shape_class c = {0};
        int dtype;
        if (sscanf(line, CHOICE_TAG " %d %d %d %d %d %d %d %d", &dtype, &c.trans_a, &c.trans_b,
                   &c.batched, &c.bucket, &c.mul_aux, &c.native, &c.gemm_kernel) == 8 &&
            (dtype == VH_DTYPE_F32 || dtype == VH_DTYPE_BF16 || dtype == VH_DTYPE_F16)) {
            c.dtype = (vh_dtype)dtype;
            c.native = c.native != 0;
            c.gemm_kernel = c.gemm_kernel != 0;
            c.restored = 1;
            shape_class *found = find_locked(&c);
            if (!found && g_count < MAX_CLASSES) found = &g_classes[g_count++];
            if (found) {
                *found = c; /* what the run decided wins over this process's own */
                taken++;
            }
        }
        if (!end) break;
        line = end + 1;
    }
    pthread_mutex_unlock(&g_lock);
    return taken;
}
