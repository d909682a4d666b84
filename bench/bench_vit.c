/* bench_vit.c - training-step throughput of the vit model plugin on the CPU
 * device, against the same model in PyTorch.
 *
 * One run:
 *   1. an sgemm probe through the SDK's CPU gemm op (square 1024 and 2048,
 *      best of a few): the machine's fp32 matmul peak in GFLOP/s;
 *   2. per config, the vit plugin loaded as vithost loads it (recipe text,
 *      run_open_text, vtable->create), weights from vtable->init_unit, one
 *      synthetic batch (images N(0,1), uniform labels), and the median time
 *      of a step = zero the gradients + forward (VH_MODE_TRAIN) + backward
 *      (loss_scale 1) over --steps steps after --warmup steps;
 *   3. the same models in PyTorch (bench_vit_torch.py through /usr/bin/python3,
 *      same threads), once with libgomp's default wait policy and once with
 *      OMP_WAIT_POLICY=PASSIVE; the better of the two counts;
 *   4. one table: ms/step, images/s, GFLOP/s and % of the sgemm peak of both
 *      sides, and PyTorch time / vithost time (> 1: vithost is faster).
 * GFLOP/s of both sides use the plugin's own train_flops_per_image (pycls
 * convention: 6 x the multiply-adds of every matmul, attention's included),
 * so the ratio compares time only.
 *
 * build/bench/bench_vit --help lists the options. Not a test: nothing here
 * is registered with ctest.
 */
#define _XOPEN_SOURCE 700 /* realpath, popen, setenv */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "vithost/vh_runtime.h"

#ifndef VH_BENCH_TORCH_SCRIPT
#define VH_BENCH_TORCH_SCRIPT "bench_vit_torch.py"
#endif
#define DEFAULT_PYTHON "/usr/bin/python3"

/* ---- configurations ----------------------------------------------------- */

typedef struct bench_config {
    const char *name;
    const char *variant; /* recipe `variant`, or NULL for explicit keys */
    int dim, depth, heads, mlp, patch, channels, side, classes, batch;
    int steps, warmup;   /* defaults, sized for ~3 minutes on 2 cores */
} bench_config;

static const bench_config configs[] = {
    /* token classifier, Fashion-MNIST sized */
    {"a", NULL, 64, 4, 4, 256, 4, 1, 28, 10, 128, 20, 3},
    /* CIFAR sized, ViT-Ti width */
    {"b", NULL, 192, 12, 3, 768, 4, 3, 32, 10, 64, 10, 2},
    /* ViT-S/16 at 224 (the explicit numbers are the PyTorch side's) */
    {"c", "s16", 384, 12, 6, 1536, 16, 3, 224, 1000, 8, 5, 2},
};
#define NUM_CONFIGS ((int)(sizeof configs / sizeof configs[0]))

/* PyTorch runs twice: libgomp's default wait policy (idle threads spin a
 * while), and PASSIVE (they sleep at once). Its BLAS is Debian's pthread
 * OpenBLAS, whose threads compete with spinning OpenMP threads for the
 * cores, so PASSIVE is usually the faster; the better of the two is scored.
 * torch_steps_note: the default-policy pass runs half the steps (at least 3)
 * and one warm-up, to keep the whole run near 3 minutes on 2 cores. */
enum { POLICY_DEFAULT = 0, POLICY_PASSIVE = 1, NUM_POLICIES = 2 };
static const char *const policy_names[NUM_POLICIES] = {"default", "PASSIVE"};

/* One measured line of the table: a config in one layout. */
typedef struct bench_row {
    const bench_config *cfg;
    const char *layout;
    int steps, warmup;
    int vh_ok;
    double flops_per_image; /* the plugin's train_flops_per_image */
    int64_t vh_params;
    double vh_median_ms, vh_min_ms;
    int pt_ok[NUM_POLICIES];
    double pt_median_ms[NUM_POLICIES], pt_min_ms[NUM_POLICIES];
    int64_t pt_params;
} bench_row;

typedef struct bench_options {
    int steps, warmup; /* -1: per-config defaults */
    int threads;
    int want[NUM_CONFIGS];
    int torch;
    const char *python;
} bench_options;

/* ---- small helpers --------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return NAN;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

static void set_error(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

/* xorshift64* and Box-Muller: the synthetic batch and the probe's matrices. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * UINT64_C(2685821657736338717);
}
static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }
static float rng_normal(uint64_t *s) {
    double u = rng_uniform(s), v = rng_uniform(s);
    return (float)(sqrt(-2.0 * log(u + 0x1.0p-60)) * cos(6.283185307179586 * v));
}

/* Busy share of all CPUs over `seconds`, from /proc/stat, or -1. */
static int read_cpu_times(unsigned long long *busy, unsigned long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 5) return -1;
    *total = 0;
    for (int i = 0; i < 8; i++) *total += v[i];
    *busy = *total - v[3] - v[4]; /* idle, iowait */
    return 0;
}

static double cpu_busy_fraction(double seconds) {
    unsigned long long b0, t0, b1, t1;
    if (read_cpu_times(&b0, &t0)) return -1.0;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    if (read_cpu_times(&b1, &t1) || t1 <= t0) return -1.0;
    return (double)(b1 - b0) / (double)(t1 - t0);
}

/* CPU seconds the whole machine was busy, and those of this process and
 * its finished children (the PyTorch runs): the difference is other work. */
static int cpu_seconds(double *machine, double *ours) {
    unsigned long long busy, total;
    if (read_cpu_times(&busy, &total)) return -1;
    long tick = sysconf(_SC_CLK_TCK);
    *machine = (double)busy / (double)(tick > 0 ? tick : 100);
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    *ours = 0.0;
    const struct rusage *r[2] = {&self, &children};
    for (int i = 0; i < 2; i++)
        *ours += (double)r[i]->ru_utime.tv_sec + 1e-6 * (double)r[i]->ru_utime.tv_usec +
                 (double)r[i]->ru_stime.tv_sec + 1e-6 * (double)r[i]->ru_stime.tv_usec;
    return 0;
}

/* <exe dir>/../plugins, where the build tree puts vit.so and the test plugins. */
static int find_plugin_dir(char *out, size_t len, char *err, size_t errlen) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        set_error(err, errlen, "cannot read /proc/self/exe: %s", strerror(errno));
        return -1;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    char guess[PATH_MAX + 16];
    snprintf(guess, sizeof guess, "%s/../plugins", exe);
    char resolved[PATH_MAX];
    if (!realpath(guess, resolved)) {
        set_error(err, errlen,
                  "no plugin folder at %s (%s): run bench_vit from the build tree "
                  "(build/bench/bench_vit) after building vit and the test plugins",
                  guess, strerror(errno));
        return -1;
    }
    char probe[PATH_MAX + 16];
    snprintf(probe, sizeof probe, "%s/vit.so", resolved);
    if (access(probe, R_OK) != 0) {
        set_error(err, errlen, "%s is missing: build the vit plugin (make vh_plugin_vit)",
                  probe);
        return -1;
    }
    snprintf(out, len, "%s", resolved);
    return 0;
}

/* ---- 1. sgemm peak through the SDK's CPU gemm op ------------------------- */

/* Best GFLOP/s of `reps` n x n x n GEMMs (after one warm-up call), or -1. */
static double probe_sgemm(int64_t n, int reps, char *err, size_t errlen) {
    const vh_device_ops *ops = vh_cpu_device_ops();
    size_t bytes = (size_t)(n * n) * sizeof(float);
    float *a = NULL, *b = NULL, *c = NULL;
    double best = -1.0;
    if (ops->alloc(ops->device, bytes, (void **)&a) != VH_STATUS_OK ||
        ops->alloc(ops->device, bytes, (void **)&b) != VH_STATUS_OK ||
        ops->alloc(ops->device, bytes, (void **)&c) != VH_STATUS_OK) {
        set_error(err, errlen, "sgemm probe: out of memory for %lld x %lld matrices",
                  (long long)n, (long long)n);
        goto done;
    }
    uint64_t s = 0x5eed;
    for (int64_t i = 0; i < n * n; i++) {
        a[i] = (float)(2.0 * rng_uniform(&s) - 1.0);
        b[i] = (float)(2.0 * rng_uniform(&s) - 1.0);
    }
    vh_gemm_args g = {.struct_size = sizeof g, .m = n, .n = n, .k = n, .alpha = 1.0f,
                      .beta = 0.0f, .a = a, .lda = n, .b = b, .ldb = n, .c = c, .ldc = n,
                      .batch = 1};
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        vh_status st = ops->gemm(ops->device, &g);
        if (st == VH_STATUS_OK) st = ops->synchronize(ops->device);
        double t = now_s() - t0;
        if (st != VH_STATUS_OK) {
            set_error(err, errlen, "sgemm probe: gemm failed (%s)", vh_status_str(st));
            best = -1.0;
            goto done;
        }
        double gf = 2.0 * (double)n * (double)n * (double)n / t * 1e-9;
        if (r >= 0 && gf > best) best = gf;
    }
done:
    if (a) ops->free(ops->device, a);
    if (b) ops->free(ops->device, b);
    if (c) ops->free(ops->device, c);
    return best;
}

/* Best of the 1024 and 2048 probes, printed; -1 on failure. */
static double measure_peak(const char *when, char *err, size_t errlen) {
    const int64_t sizes[] = {1024, 2048};
    const int reps[] = {8, 4};
    double best[2];
    for (int i = 0; i < 2; i++) {
        best[i] = probe_sgemm(sizes[i], reps[i], err, errlen);
        if (best[i] < 0) return -1.0;
    }
    printf("sgemm probe (SDK cpu gemm, %s): 1024^3 %.1f GFLOP/s (best of %d), 2048^3 %.1f "
           "GFLOP/s (best of %d)\n",
           when, best[0], reps[0], best[1], reps[1]);
    return best[0] > best[1] ? best[0] : best[1];
}

/* ---- 2. vithost ------------------------------------------------------------ */

typedef struct harness {
    float **params, **grads; /* per unit */
} harness;

static vh_status hk_gather(void *ctx, int32_t unit, const void **params) {
    *params = ((harness *)ctx)->params[unit];
    return VH_STATUS_OK;
}
static vh_status hk_release(void *ctx, int32_t unit) {
    (void)ctx, (void)unit;
    return VH_STATUS_OK;
}
static vh_status hk_grads(void *ctx, int32_t unit, void **grads) {
    *grads = ((harness *)ctx)->grads[unit];
    return VH_STATUS_OK;
}
static vh_status hk_reduce(void *ctx, int32_t unit) {
    (void)ctx, (void)unit;
    return VH_STATUS_OK;
}

static void write_recipe(char *out, size_t len, const bench_config *c, const char *layout) {
    char model[512];
    if (c->variant)
        snprintf(model, sizeof model, "{plugin: vit, variant: %s, layout: %s}", c->variant,
                 layout);
    else
        snprintf(model, sizeof model,
                 "{plugin: vit, dim: %d, depth: %d, heads: %d, mlp_dim: %d, patch_size: %d,\n"
                 "        classifier: token, layout: %s}",
                 c->dim, c->depth, c->heads, c->mlp, c->patch, layout);
    snprintf(out, len,
             "run: {batch_size: %d}\n"
             "model: %s\n"
             "precision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\n"
             "optim: {plugin: test_optim}\n"
             "data: {plugin: test_data}\n",
             c->batch, model);
}

/* Times one config in one layout; fills row->vh_*. */
static int bench_vithost(bench_row *row, char *err, size_t errlen) {
    const bench_config *c = row->cfg;
    char recipe[2048];
    write_recipe(recipe, sizeof recipe, c, row->layout);

    int rc = -1;
    vh_run run;
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stdout};
    void *model = NULL;
    const vh_model_vtable *vt = NULL;
    harness h = {NULL, NULL};
    int32_t units = 0;
    float *images = NULL;
    int32_t *labels = NULL;
    double *times = NULL;

    vh_status st = run_open_text(&run, "bench_vit.yaml", recipe, &opts, &d);
    if (st != VH_STATUS_OK) {
        set_error(err, errlen, "opening the run failed: %s", d.text);
        goto done;
    }
    vt = run.plugins[VH_ROLE_MODEL].desc->vtable;
    vh_model_setup setup = {.struct_size = sizeof setup, .channels = c->channels,
                            .height = c->side, .width = c->side, .num_classes = c->classes,
                            .max_batch = c->batch,
                            .policy = {sizeof(vh_precision_policy), VH_DTYPE_F32, VH_DTYPE_F32,
                                       VH_DTYPE_F32, VH_DTYPE_F32, VH_DTYPE_F32}};
    st = vt->create(&run.hosts[VH_ROLE_MODEL].pub, &setup, &model);
    if (st != VH_STATUS_OK) {
        set_error(err, errlen, "vit create failed: %s", run.hosts[VH_ROLE_MODEL].error);
        model = NULL;
        goto done;
    }
    const vh_param_table *table = vt->param_table(model);
    units = table->num_units;
    h.params = calloc((size_t)units, sizeof *h.params);
    h.grads = calloc((size_t)units, sizeof *h.grads);
    if (!h.params || !h.grads) goto nomem;
    for (int32_t u = 0; u < units; u++) {
        h.params[u] = malloc((size_t)table->units[u].numel * sizeof(float));
        h.grads[u] = calloc((size_t)table->units[u].numel, sizeof(float));
        if (!h.params[u] || !h.grads[u]) goto nomem;
        st = vt->init_unit(model, u, h.params[u], 0);
        if (st != VH_STATUS_OK) {
            set_error(err, errlen, "init_unit %d failed: %s", (int)u,
                      run.hosts[VH_ROLE_MODEL].error);
            goto done;
        }
    }
    row->vh_params = table->numel;
    row->flops_per_image = vt->train_flops_per_image(model);

    size_t pixels = (size_t)c->batch * (size_t)c->channels * (size_t)c->side * (size_t)c->side;
    images = malloc(pixels * sizeof *images);
    labels = malloc((size_t)c->batch * sizeof *labels);
    times = malloc((size_t)row->steps * sizeof *times);
    if (!images || !labels || !times) goto nomem;
    uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)c->batch;
    for (size_t i = 0; i < pixels; i++) images[i] = rng_normal(&s);
    for (int i = 0; i < c->batch; i++) labels[i] = (int32_t)(rng_next(&s) % (uint64_t)c->classes);

    vh_batch batch;
    memset(&batch, 0, sizeof batch);
    batch.struct_size = sizeof batch;
    batch.images = (vh_tensor){.data = images, .dtype = VH_DTYPE_F32, .ndim = 4,
                               .shape = {c->batch, c->channels, c->side, c->side}};
    batch.labels = (vh_tensor){.data = labels, .dtype = VH_DTYPE_I32, .ndim = 1,
                               .shape = {c->batch}};
    batch.size = c->batch;
    vh_unit_hooks hooks = {sizeof(vh_unit_hooks), &h, hk_gather, hk_release, hk_grads, hk_reduce};
    const vh_device_ops *dev = run.hosts[VH_ROLE_MODEL].pub.api->device(
        &run.hosts[VH_ROLE_MODEL].pub);

    for (int i = -row->warmup; i < row->steps; i++) {
        double t0 = now_s();
        /* The sharding plugin hands out zeroed gradients each step. */
        for (int32_t u = 0; u < units; u++)
            memset(h.grads[u], 0, (size_t)table->units[u].numel * sizeof(float));
        vh_model_output out;
        memset(&out, 0, sizeof out);
        out.struct_size = sizeof out;
        st = vt->forward(model, &batch, VH_MODE_TRAIN, &hooks, &out);
        if (st == VH_STATUS_OK) st = vt->backward(model, 1.0f, &hooks);
        if (st == VH_STATUS_OK) st = dev->synchronize(dev->device);
        double t = now_s() - t0;
        if (st != VH_STATUS_OK) {
            set_error(err, errlen, "step %d failed: %s", i, run.hosts[VH_ROLE_MODEL].error);
            goto done;
        }
        if (!isfinite(out.loss)) {
            set_error(err, errlen, "step %d: loss is %g", i, (double)out.loss);
            goto done;
        }
        if (i >= 0) times[i] = t * 1e3;
    }
    row->vh_median_ms = median_of(times, row->steps);
    row->vh_min_ms = times[0];
    for (int i = 1; i < row->steps; i++)
        if (times[i] < row->vh_min_ms) row->vh_min_ms = times[i];
    row->vh_ok = 1;
    rc = 0;
    goto done;
nomem:
    set_error(err, errlen, "out of memory");
done:
    free(times);
    free(images);
    free(labels);
    for (int32_t u = 0; u < units; u++) {
        if (h.params) free(h.params[u]);
        if (h.grads) free(h.grads[u]);
    }
    free(h.params);
    free(h.grads);
    if (model) vt->destroy(model);
    run_close(&run);
    return rc;
}

/* ---- 3. PyTorch ---------------------------------------------------------- */

/* Appends src to dst in single quotes, for sh. */
static int append_quoted(char *dst, size_t len, const char *src) {
    size_t n = strlen(dst);
    if (n + 2 >= len) return -1;
    dst[n++] = '\'';
    for (const char *p = src; *p; p++) {
        if (*p == '\'') {
            if (n + 4 >= len) return -1;
            memcpy(dst + n, "'\\''", 4);
            n += 4;
        } else {
            if (n + 1 >= len) return -1;
            dst[n++] = *p;
        }
    }
    if (n + 2 >= len) return -1;
    dst[n++] = '\'';
    dst[n] = '\0';
    return 0;
}

static int append_text(char *dst, size_t len, const char *fmt, ...) {
    size_t n = strlen(dst);
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(dst + n, len - n, fmt, ap);
    va_end(ap);
    return w < 0 || (size_t)w >= len - n ? -1 : 0;
}

/* Runs every row in PyTorch under one wait policy. Returns 0, or 1 when
 * PyTorch is not available (a line says why), or -1 on another failure. */
static int bench_torch(bench_row *rows, int nrows, int policy, const bench_options *o) {
    char cmd[8192] = "env -u OMP_WAIT_POLICY";
    int bad = append_text(cmd, sizeof cmd,
                          " OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d MKL_NUM_THREADS=%d%s ",
                          o->threads, o->threads, o->threads,
                          policy == POLICY_PASSIVE ? " OMP_WAIT_POLICY=PASSIVE" : "");
    bad = bad || append_quoted(cmd, sizeof cmd, o->python);
    bad = bad || append_text(cmd, sizeof cmd, " ");
    bad = bad || append_quoted(cmd, sizeof cmd, VH_BENCH_TORCH_SCRIPT);
    bad = bad || append_text(cmd, sizeof cmd, " --threads %d", o->threads);
    for (int r = 0; r < nrows && !bad; r++) {
        const bench_config *c = rows[r].cfg;
        int steps = rows[r].steps, warmup = rows[r].warmup;
        if (policy == POLICY_DEFAULT) { /* see torch_steps_note */
            steps = steps < 6 ? (steps < 3 ? steps : 3) : (steps + 1) / 2;
            warmup = warmup > 1 ? 1 : warmup;
        }
        bad = append_text(cmd, sizeof cmd,
                          " --job name=%s,layout=%s,classifier=token,batch=%d,channels=%d,"
                          "height=%d,width=%d,patch=%d,dim=%d,depth=%d,heads=%d,mlp=%d,"
                          "classes=%d,steps=%d,warmup=%d",
                          c->name, rows[r].layout, c->batch, c->channels, c->side, c->side,
                          c->patch, c->dim, c->depth, c->heads, c->mlp, c->classes, steps,
                          warmup);
    }
    bad = bad || append_text(cmd, sizeof cmd, " 2>&1");
    if (bad) {
        fprintf(stderr, "bench_vit: the PyTorch command line is too long\n");
        return -1;
    }
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) {
        printf("PyTorch (%s): could not start %s: %s\n", policy_names[policy], o->python,
               strerror(errno));
        return -1;
    }
    char line[4096];
    int skipped = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        char name[32], layout[32];
        double med, best;
        long long params;
        if (sscanf(line, "RESULT %31s %31s %lf %lf %lld", name, layout, &med, &best,
                   &params) == 5) {
            for (int r = 0; r < nrows; r++) {
                if (strcmp(rows[r].cfg->name, name) || strcmp(rows[r].layout, layout)) continue;
                rows[r].pt_ok[policy] = 1;
                rows[r].pt_median_ms[policy] = med;
                rows[r].pt_min_ms[policy] = best;
                rows[r].pt_params = params;
                printf("  torch %-8s %s %-12s %9.1f ms/step median (min %.1f)\n",
                       policy_names[policy], name, layout, med, best);
            }
        } else if (strncmp(line, "SKIP ", 5) == 0) {
            printf("PyTorch: skipped: %s\n", line + 5);
            skipped = 1;
        } else if (strncmp(line, "INFO ", 5) == 0) {
            printf("  %s\n", line + 5);
        } else {
            printf("  torch: %s\n", line);
        }
        fflush(stdout);
    }
    int status = pclose(p);
    if (skipped) return 1;
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("PyTorch (%s): %s exited with status %d (see its output above)\n",
               policy_names[policy], o->python, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    return 0;
}

/* ---- 4. report ----------------------------------------------------------- */

/* The better PyTorch policy of a row, or -1. */
static int best_policy(const bench_row *r) {
    int best = -1;
    for (int p = 0; p < NUM_POLICIES; p++)
        if (r->pt_ok[p] && (best < 0 || r->pt_median_ms[p] < r->pt_median_ms[best])) best = p;
    return best;
}

static double gflops(const bench_row *r, double ms) {
    return r->flops_per_image * r->cfg->batch / (ms * 1e-3) * 1e-9;
}

static void print_table(const bench_row *rows, int nrows, double peak, int threads) {
    printf("\n== vit training step (forward + backward), fp32, %d thread%s, sgemm peak %.1f "
           "GFLOP/s ==\n",
           threads, threads == 1 ? "" : "s", peak);
    printf("%-3s %-12s %5s %7s | %9s %7s %7s %6s | %9s %9s %7s %6s | %6s\n", "cfg", "layout",
           "batch", "GF/img", "vithost", "img/s", "GFLOP/s", "%peak", "torch", "torch",
           "GFLOP/s", "%peak", "torch/");
    printf("%-3s %-12s %5s %7s | %9s %7s %7s %6s | %9s %9s %7s %6s | %6s\n", "", "", "", "",
           "ms/step", "", "", "", "default", "PASSIVE", "(best)", "(best)", "vithost");
    for (int i = 0; i < nrows; i++) {
        const bench_row *r = &rows[i];
        printf("%-3s %-12s %5d %7.3f | ", r->cfg->name, r->layout, r->cfg->batch,
               r->flops_per_image * 1e-9);
        if (r->vh_ok)
            printf("%9.1f %7.0f %7.1f %5.1f%% | ", r->vh_median_ms,
                   r->cfg->batch / (r->vh_median_ms * 1e-3), gflops(r, r->vh_median_ms),
                   100.0 * gflops(r, r->vh_median_ms) / peak);
        else
            printf("%9s %7s %7s %6s | ", "failed", "-", "-", "-");
        for (int p = 0; p < NUM_POLICIES; p++) {
            if (r->pt_ok[p])
                printf("%9.1f ", r->pt_median_ms[p]);
            else
                printf("%9s ", "-");
        }
        int b = best_policy(r);
        if (b >= 0)
            printf("%7.1f %5.1f%% | ", gflops(r, r->pt_median_ms[b]),
                   100.0 * gflops(r, r->pt_median_ms[b]) / peak);
        else
            printf("%7s %6s | ", "-", "-");
        if (b >= 0 && r->vh_ok)
            printf("%5.2fx\n", r->pt_median_ms[b] / r->vh_median_ms);
        else
            printf("%6s\n", "-");
    }
    printf("ms/step: median over the timed steps; GFLOP/s = train_flops_per_image x batch / "
           "step time\n(the plugin's FLOP count for both sides); torch/vithost > 1: vithost is "
           "faster.\n");
}

static void print_notes(const bench_row *rows, int nrows, double peak) {
    const bench_row *bf = NULL, *bs = NULL;
    for (int i = 0; i < nrows; i++) {
        if (!rows[i].vh_ok) continue;
        if (!strcmp(rows[i].cfg->name, "a") && !strcmp(rows[i].layout, "batch_first"))
            bf = &rows[i];
        if (!strcmp(rows[i].cfg->name, "a") && !strcmp(rows[i].layout, "batch_second"))
            bs = &rows[i];
    }
    if (bf && bs) {
        const bench_row *fast = bf->vh_median_ms <= bs->vh_median_ms ? bf : bs;
        const bench_row *slow = fast == bf ? bs : bf;
        double gain = 100.0 * (slow->vh_median_ms / fast->vh_median_ms - 1.0);
        /* Repeated runs on a quiet 2-core machine differ by ~5-10%. */
        if (gain < 5.0)
            printf("layout (a): no clear winner in vithost: %s %.1f, %s %.1f ms/step (%.1f%%, "
                   "within run-to-run noise)\n",
                   fast->layout, fast->vh_median_ms, slow->layout, slow->vh_median_ms, gain);
        else
            printf("layout (a): %s is faster in vithost, %.1f vs %.1f ms/step (%.1f%%)\n",
                   fast->layout, fast->vh_median_ms, slow->vh_median_ms, gain);
    }
    for (int i = 0; i < nrows; i++) {
        const bench_row *r = &rows[i];
        int b = best_policy(r);
        if (b >= 0 && r->pt_params && r->vh_ok && r->pt_params != r->vh_params)
            printf("WARNING %s %s: vithost has %lld parameters, PyTorch %lld: not the same "
                   "model\n",
                   r->cfg->name, r->layout, (long long)r->vh_params, (long long)r->pt_params);
        if (r->vh_ok && b >= 0 && r->pt_median_ms[b] < r->vh_median_ms)
            printf("GOAL MISSED %s %s: PyTorch (%s) is faster than vithost\n", r->cfg->name,
                   r->layout, policy_names[b]);
        if (r->vh_ok && !strcmp(r->cfg->name, "c") &&
            gflops(r, r->vh_median_ms) < 0.6 * peak)
            printf("GOAL MISSED %s %s: vithost reaches %.1f%% of the sgemm peak (goal 60%%)\n",
                   r->cfg->name, r->layout, 100.0 * gflops(r, r->vh_median_ms) / peak);
    }
}

/* ---- main ------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_vit [--config a|b|c|all|a,b,...] [--steps N] [--warmup N]\n"
            "                 [--threads T] [--no-torch] [--python PATH]\n"
            "\n"
            "Times a vit training step (forward + backward) on the CPU device and the same\n"
            "model in PyTorch, and measures the sgemm peak it is compared with.\n"
            "  (a) D64 L4 H4 P4, 28x28x1, 10 classes, batch 128 (batch_first and\n"
            "      batch_second)     default 20 steps, 3 warm-up\n"
            "  (b) D192 L12 H3 P4, 32x32x3, 10 classes, batch 64    default 10 steps, 2\n"
            "  (c) ViT-S/16, 224x224x3, 1000 classes, batch 8       default 5 steps, 2\n"
            "--steps/--warmup override every config. --threads defaults to the online CPUs;\n"
            "both sides get OMP_NUM_THREADS=T. PyTorch runs through %s\n"
            "(--python) with libgomp's default wait policy and with OMP_WAIT_POLICY=PASSIVE;\n"
            "the table shows both and scores the better one.\n",
            DEFAULT_PYTHON);
}

/* "--name value" or "--name=value"; *i advances past what it used. */
static const char *option_value(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) return "";
    return argv[++*i];
}

static int parse_int(const char *text, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > 1000000) return -1;
    *out = (int)v;
    return 0;
}

static int parse_configs(const char *text, int *want) {
    memset(want, 0, NUM_CONFIGS * sizeof *want);
    if (!strcmp(text, "all")) {
        for (int c = 0; c < NUM_CONFIGS; c++) want[c] = 1;
        return 0;
    }
    char buf[64];
    snprintf(buf, sizeof buf, "%s", text);
    int any = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int c = 0; c < NUM_CONFIGS; c++)
            if (!strcmp(tok, configs[c].name)) want[c] = found = any = 1;
        if (!found) return -1;
    }
    return any ? 0 : -1;
}

static int parse_args(int argc, char **argv, bench_options *o) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (bench_options){.steps = -1, .warmup = -1, .threads = cpus > 0 ? (int)cpus : 1,
                         .torch = 1, .python = DEFAULT_PYTHON};
    for (int c = 0; c < NUM_CONFIGS; c++) o->want[c] = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(argv[i], "--no-torch")) {
            o->torch = 0;
        } else if ((v = option_value(argc, argv, &i, "--steps"))) {
            if (parse_int(v, 1, &o->steps)) goto bad_value;
        } else if ((v = option_value(argc, argv, &i, "--warmup"))) {
            if (parse_int(v, 0, &o->warmup)) goto bad_value;
        } else if ((v = option_value(argc, argv, &i, "--threads"))) {
            if (parse_int(v, 1, &o->threads)) goto bad_value;
        } else if ((v = option_value(argc, argv, &i, "--config"))) {
            if (parse_configs(v, o->want)) {
                fprintf(stderr, "bench_vit: --config '%s': expected a, b, c, all, or a list "
                                "like a,c\n", v);
                return -1;
            }
        } else if ((v = option_value(argc, argv, &i, "--python"))) {
            if (!*v) goto bad_value;
            o->python = v;
        } else {
            fprintf(stderr, "bench_vit: unknown option '%s' (--help lists them)\n", argv[i]);
            return -1;
        }
        continue;
    bad_value:
        fprintf(stderr, "bench_vit: bad value for %s\n", argv[i]);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines in order with the host log (stderr) */
    bench_options o;
    int parsed = parse_args(argc, argv, &o);
    if (parsed) return parsed > 0 ? 0 : 2;

    /* One OpenMP pool of T threads for the SDK's loops and OpenBLAS (its
     * OpenMP build sizes each call from omp_get_max_threads()); the env
     * variable is for the PyTorch child. */
    char num[16];
    snprintf(num, sizeof num, "%d", o.threads);
    setenv("OMP_NUM_THREADS", num, 1);
    omp_set_num_threads(o.threads);

    char plugin_dir[PATH_MAX], err[4096];
    if (find_plugin_dir(plugin_dir, sizeof plugin_dir, err, sizeof err)) {
        fprintf(stderr, "bench_vit: %s\n", err);
        exit(1);
    }
    setenv("VITHOST_PLUGIN_PATH", plugin_dir, 1);
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("bench_vit: %d thread%s (omp_get_max_threads %d), OMP_WAIT_POLICY=%s for vithost, "
           "plugins from %s\n",
           o.threads, o.threads == 1 ? "" : "s", omp_get_max_threads(), wait ? wait : "(unset)",
           plugin_dir);

    /* Other work on the machine skews every number below: say so, before
     * and (from the CPU time nobody here used) after. */
    double machine0 = 0, ours0 = 0, wall0 = now_s();
    int have_cpu = cpu_seconds(&machine0, &ours0) == 0;
    double busy = cpu_busy_fraction(0.5);
    if (busy >= 0)
        printf("CPU busy before the start: %.0f%% of %ld CPUs over 0.5 s%s\n", 100.0 * busy,
               sysconf(_SC_NPROCESSORS_ONLN),
               busy > 0.1 ? " - other work is running; expect noisy numbers" : "");

    /* 1. sgemm peak: probed now and again after the vithost runs, the best
     * counts (one probe can land on a moment when the machine is slower). */
    double peak = measure_peak("start", err, sizeof err);
    if (peak < 0) {
        fprintf(stderr, "bench_vit: %s\n", err);
        exit(1);
    }

    /* 2. vithost */
    bench_row rows[NUM_CONFIGS + 1];
    int nrows = 0;
    for (int c = 0; c < NUM_CONFIGS; c++) {
        if (!o.want[c]) continue;
        const char *layouts[] = {"batch_first", "batch_second"};
        int nl = !strcmp(configs[c].name, "a") ? 2 : 1;
        for (int l = 0; l < nl; l++) {
            bench_row *r = &rows[nrows++];
            memset(r, 0, sizeof *r);
            r->cfg = &configs[c];
            r->layout = layouts[l];
            r->steps = o.steps > 0 ? o.steps : configs[c].steps;
            r->warmup = o.warmup >= 0 ? o.warmup : configs[c].warmup;
        }
    }
    int failures = 0;
    for (int i = 0; i < nrows; i++) {
        bench_row *r = &rows[i];
        fflush(stdout);
        if (bench_vithost(r, err, sizeof err)) {
            printf("vithost %s %s: FAILED: %s\n", r->cfg->name, r->layout, err);
            failures++;
            continue;
        }
        printf("vithost %s %-12s batch %3d: %9.1f ms/step median (min %.1f) over %d steps "
               "after %d warm-up; %.1f GFLOP/s; %lld parameters\n",
               r->cfg->name, r->layout, r->cfg->batch, r->vh_median_ms, r->vh_min_ms, r->steps,
               r->warmup, gflops(r, r->vh_median_ms), (long long)r->vh_params);
    }
    if (nrows > 0) {
        double again = measure_peak("after the vithost runs", err, sizeof err);
        if (again > peak) peak = again;
        printf("sgemm peak: %.1f GFLOP/s (the best probe)\n", peak);
    }

    /* 3. PyTorch */
    if (!o.torch) {
        printf("PyTorch: skipped (--no-torch)\n");
    } else if (access(o.python, X_OK) != 0) {
        printf("PyTorch: skipped: %s is not there (%s); Debian's torch is "
               "`apt-get install python3-torch`\n",
               o.python, strerror(errno));
    } else if (nrows > 0) {
        const int order[NUM_POLICIES] = {POLICY_PASSIVE, POLICY_DEFAULT};
        for (int k = 0; k < NUM_POLICIES; k++) {
            int p = order[k];
            printf("PyTorch, OMP_WAIT_POLICY %s%s:\n", policy_names[p],
                   p == POLICY_DEFAULT ? " (half the steps, 1 warm-up)" : "");
            int st = bench_torch(rows, nrows, p, &o);
            if (st == 1) break; /* not available: said so */
        }
    }

    /* 4. table */
    print_table(rows, nrows, peak, o.threads);
    print_notes(rows, nrows, peak);
    double machine1, ours1;
    if (have_cpu && cpu_seconds(&machine1, &ours1) == 0) {
        double other = (machine1 - machine0) - (ours1 - ours0), wall = now_s() - wall0;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        double share = other / (wall * (double)(cpus > 0 ? cpus : 1));
        if (share > 0.05)
            printf("WARNING: other processes used %.0f CPU-seconds (%.0f%% of the machine) "
                   "during this %.0f s run: every number above is suspect; rerun on an idle "
                   "machine\n",
                   other, 100.0 * share, wall);
        else
            printf("other work on the machine during the run: %.1f CPU-seconds (%.1f%%)\n",
                   other > 0 ? other : 0.0, share > 0 ? 100.0 * share : 0.0);
    }
    return failures ? 1 : 0;
}
