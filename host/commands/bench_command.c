/* bench_command.c - `vithost bench` (see bench_command.h): warm-up steps,
 * then timed steps with the phase clock on, then one summary. */
#define _POSIX_C_SOURCE 200809L
#include "bench_command.h"

#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "flops_probe.h"
#include "metrics.h"
#include "progress.h"
#include "session.h"
#include "weights.h"
#include "vithost/vh_cpu_engine.h"

/* ---- the device's peak ---------------------------------------------------- */

/* Dense datasheet peaks, TFLOP/s: 16-bit tensor cores with f32
 * accumulation, and plain f32 (CUDA cores; TF32 would be higher, but the
 * f32 path promises f32 math). First match of the name wins, so the longer
 * names come first. */
typedef struct gpu_peak {
    const char *name;
    double bf16, f16, f32;
} gpu_peak;

static const gpu_peak gpu_peaks[] = {
    {"H200", 989.0, 989.0, 67.0},    {"H100 PCIe", 756.0, 756.0, 51.0},
    {"H100", 989.0, 989.0, 67.0},    {"A100", 312.0, 312.0, 19.5},
    {"L40S", 362.0, 362.0, 91.6},    {"A10", 125.0, 125.0, 31.2},
    {"RTX 4090", 165.2, 165.2, 82.6}, {"V100", 0.0, 125.0, 15.7},
};

double bench_gpu_peak_tflops(const char *model_name, vh_dtype dtype, const char **what) {
    *what = "unknown";
    if (!model_name) return 0.0;
    for (size_t i = 0; i < sizeof gpu_peaks / sizeof gpu_peaks[0]; i++) {
        if (!strstr(model_name, gpu_peaks[i].name)) continue;
        *what = "datasheet peak of this GPU";
        return dtype == VH_DTYPE_BF16 ? gpu_peaks[i].bf16
               : dtype == VH_DTYPE_F16 ? gpu_peaks[i].f16
                                       : gpu_peaks[i].f32;
    }
    return 0.0;
}

/* The first GPU's model name as the NVIDIA driver tells it ("Model: NVIDIA
 * H200"), without any CUDA call; "" when there is none. */
static void gpu_model_name(char *buf, size_t len) {
    buf[0] = '\0';
    glob_t g;
    if (glob("/proc/driver/nvidia/gpus/*/information", 0, NULL, &g) != 0) return;
    FILE *f = g.gl_pathc > 0 ? fopen(g.gl_pathv[0], "r") : NULL;
    globfree(&g);
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Model:", 6) != 0) continue;
        const char *p = line + 6;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strcspn(p, "\n");
        if (n >= len) n = len - 1;
        memcpy(buf, p, n);
        buf[n] = '\0';
        break;
    }
    fclose(f);
}

static double device_peak(vh_run *run, vh_dtype dtype, const char **what) {
    const vh_config_entry *e = config_find(&run->run_config, "peak_tflops");
    if (e && e->as.f > 0) {
        *what = "run.peak_tflops";
        return e->as.f;
    }
    if (run->device->kind == VH_DEVICE_KIND_CPU) {
        *what = dtype == VH_DTYPE_BF16  ? "bf16 GEMM probe"
                : dtype == VH_DTYPE_F16 ? "f16 GEMM probe"
                                        : "f32 GEMM probe";
        return flops_probe_peak_tflops_dtype(run->device, dtype);
    }
    char name[128];
    gpu_model_name(name, sizeof name);
    return bench_gpu_peak_tflops(name, dtype, what);
}

/* ---- the steps ------------------------------------------------------------- */

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The next batch; a new training pass when one ends. */
static vh_status next_batch(vh_session *s, vh_batch *batch, vh_diag *d) {
    vh_batch host_batch;
    int has = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!s->epoch_in_progress) {
            session_trace(s, "data.start_epoch split=train epoch=%lld", (long long)s->epoch);
            vh_status st =
                s->data->start_epoch(s->self[VH_ROLE_DATA], VH_SPLIT_TRAIN, s->epoch);
            if (st != VH_STATUS_OK)
                return session_plugin_error(s, VH_ROLE_DATA, st, "data.start_epoch", d);
            s->epoch_in_progress = 1;
        }
        vh_status st = session_next_batch(s, &host_batch, batch, &has, d);
        if (st != VH_STATUS_OK || has) return st;
        s->epoch++;
        s->epoch_in_progress = 0;
    }
    return diag_set(d, VH_STATUS_ERR_CONFIG,
                    "%s: a training pass gave no batch (the training split has fewer samples "
                    "than one batch of %lld per rank); lower run.batch_size",
                    s->run->recipe.file, (long long)s->batch_size);
}

/* Every rank's step times, the max over ranks in place (a step lasts as
 * long as its slowest rank), VH_SESSION_SCALARS at a time. */
static vh_status slowest_rank(vh_session *s, double *ms, int64_t n, vh_diag *d) {
    for (int64_t i = 0; i < n; i += VH_SESSION_SCALARS) {
        int k = (int)(n - i < VH_SESSION_SCALARS ? n - i : VH_SESSION_SCALARS);
        vh_status st = session_reduce_scalars(s, ms + i, k, VH_REDUCE_OP_MAX, d);
        if (st != VH_STATUS_OK) return st;
    }
    return VH_STATUS_OK;
}

static vh_status memory_of(vh_session *s, vh_bench_result *r, vh_diag *d) {
    if (s->sharding->memory) {
        vh_sharding_memory m = {.struct_size = sizeof m};
        vh_status st = s->sharding->memory(s->self[VH_ROLE_SHARDING], &m);
        if (st != VH_STATUS_OK)
            return session_plugin_error(s, VH_ROLE_SHARDING, st, "sharding.memory", d);
        r->model_state_bytes = m.params + m.grads + m.masters + m.optim_state + m.comm_buffers;
    }
    if (s->model->activation_bytes) {
        vh_status st = s->model->activation_bytes(s->self[VH_ROLE_MODEL], &r->activation_bytes);
        if (st != VH_STATUS_OK)
            return session_plugin_error(s, VH_ROLE_MODEL, st, "model.activation_bytes", d);
    }
    return VH_STATUS_OK;
}

/* One optimizer step (after the step's first data.next, timed by the caller):
 * with run.grad_accum K > 1, K micro-batches as the training loop runs them
 * (train_loop.c), each later data.next timed as the data phase. */
static vh_status bench_step(vh_session *s, const vh_batch *first, const float **dev_loss,
                            int *skipped, vh_step_phases *ph, vh_diag *d) {
    const int64_t k = s->grad_accum > 1 ? s->grad_accum : 1;
    double lr = 0.0;
    if (k == 1) return session_step_timed(s, first, s->step, dev_loss, &lr, skipped, ph, d);
    vh_status st = session_step_begin_timed(s, ph, d);
    for (int64_t m = 0; st == VH_STATUS_OK && m < k; m++) {
        vh_batch batch = *first;
        if (m > 0) {
            double t0 = progress_now();
            st = next_batch(s, &batch, d);
            ph->seconds[VH_STEP_PHASE_DATA] += progress_now() - t0;
        }
        if (st == VH_STATUS_OK) st = session_step_micro_timed(s, &batch, m, k, dev_loss, ph, d);
    }
    if (st == VH_STATUS_OK) st = session_step_end_timed(s, s->step, &lr, skipped, ph, d);
    return st;
}

static vh_status timed_steps(vh_session *s, const vh_bench_options *o, double *ms,
                             vh_step_phases *phases, vh_bench_result *r, vh_diag *d) {
    const vh_device_ops *dev = s->run->device;
    const float *dev_loss = NULL;
    for (int64_t i = 0; i < o->warmup + o->steps; i++) {
        int timed = i >= o->warmup;
        if (o->op_stats && i == o->warmup) op_stats_start(o->op_stats);
        vh_step_phases scratch = {.sync = 1};
        vh_step_phases *ph = timed ? phases : &scratch;
        double t0 = progress_now();
        vh_batch batch;
        vh_status st = next_batch(s, &batch, d);
        if (st != VH_STATUS_OK) return st;
        ph->seconds[VH_STEP_PHASE_DATA] += progress_now() - t0;
        int skipped = 0;
        comm_stats_reset(&s->run->comm_stats);
        st = bench_step(s, &batch, &dev_loss, &skipped, ph, d);
        if (st == VH_STATUS_OK) st = dev->synchronize(dev->device);
        if (st != VH_STATUS_OK) return st;
        if (timed) ms[i - o->warmup] = 1e3 * (progress_now() - t0);
        if (timed && o->op_stats) {
            o->op_stats->step_seconds += ms[i - o->warmup] / 1e3;
            o->op_stats->steps++;
        }
        if (timed && skipped) r->skipped_steps++;
        s->step++;
    }
    /* the peak probe after the steps is no part of them */
    if (o->op_stats) op_stats_stop(o->op_stats);
    float loss = NAN;
    vh_status st = session_read_loss(s, dev_loss, &loss, d);
    r->loss = loss;
    return st;
}

vh_status bench_run(vh_run *run, const vh_bench_options *o, vh_bench_result *r, vh_diag *d) {
    memset(r, 0, sizeof *r);
    r->steps = o->steps;
    r->warmup = o->warmup;
    r->mfu = NAN;
    r->loss = NAN;
    r->device_mem_bytes = -1;
    vh_session s;
    memset(&s, 0, sizeof s);
    double *ms = calloc((size_t)o->steps, sizeof *ms);
    if (!ms) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    /* before the session: the plugins keep the table they are given */
    vh_status st = o->op_stats ? op_stats_install(o->op_stats, &run->device) : VH_STATUS_OK;
    if (st != VH_STATUS_OK) st = diag_set(d, st, "the device ops are timed already");
    r->ops = st == VH_STATUS_OK ? o->op_stats : NULL;
    if (st == VH_STATUS_OK) st = session_open(&s, run, d);
    const char *initial = NULL;
    if (st == VH_STATUS_OK) {
        st = s.model->initial_weights(s.self[VH_ROLE_MODEL], &initial);
        if (st != VH_STATUS_OK)
            st = session_plugin_error(&s, VH_ROLE_MODEL, st, "model.initial_weights", d);
    }
    if (st == VH_STATUS_OK) st = weights_load_model(&s, initial, VH_WEIGHTS_MODE_PRETRAINED, d);
    if (st == VH_STATUS_OK) st = memory_of(&s, r, d);
    vh_step_phases phases = {.sync = 1};
    if (st == VH_STATUS_OK) st = timed_steps(&s, o, ms, &phases, r, d);
    if (st == VH_STATUS_OK) st = slowest_rank(&s, ms, o->steps, d);
    /* phases and loss: means over ranks; memory and skips: the largest */
    double mean[VH_STEP_PHASE_COUNT + 1], most[4];
    for (int p = 0; p < VH_STEP_PHASE_COUNT; p++)
        mean[p] = 1e3 * phases.seconds[p] / (double)o->steps;
    mean[VH_STEP_PHASE_COUNT] = r->loss;
    most[0] = (double)metrics_peak_rss_bytes();
    most[1] = (double)r->skipped_steps;
    most[2] = (double)r->model_state_bytes;
    most[3] = (double)run_device_peak_bytes(run);
    if (st == VH_STATUS_OK)
        st = session_reduce_scalars(&s, mean, VH_STEP_PHASE_COUNT + 1, VH_REDUCE_OP_AVG, d);
    if (st == VH_STATUS_OK) st = session_reduce_scalars(&s, most, 4, VH_REDUCE_OP_MAX, d);
    if (st == VH_STATUS_OK) {
        r->world_size = run->comm.world_size > 0 ? run->comm.world_size : 1;
        /* a step is grad_accum micro-batches on every rank */
        r->grad_accum = s.grad_accum > 1 ? s.grad_accum : 1;
        r->micro_batch = s.batch_size;
        r->global_batch = s.batch_size * r->grad_accum * r->world_size;
        r->compute_dtype = s.policy.compute_dtype;
        for (int p = 0; p < VH_STEP_PHASE_COUNT; p++) r->phase_ms[p] = mean[p];
        r->loss = mean[VH_STEP_PHASE_COUNT];
        r->peak_mem_bytes = (int64_t)most[0];
        r->device_mem_bytes = (int64_t)most[3];
        r->skipped_steps = (int64_t)most[1];
        r->model_state_bytes = (int64_t)most[2];
        qsort(ms, (size_t)o->steps, sizeof *ms, compare_double);
        r->step_ms_min = ms[0];
        r->step_ms_max = ms[o->steps - 1];
        r->step_ms_median = o->steps % 2 ? ms[o->steps / 2]
                                         : 0.5 * (ms[o->steps / 2 - 1] + ms[o->steps / 2]);
        r->img_per_s = (double)r->global_batch / (r->step_ms_median / 1e3);
        double flops = s.model->train_flops_per_image(s.self[VH_ROLE_MODEL]);
        r->tflops = r->img_per_s * flops / 1e12 / r->world_size;
        /* The probe runs after the steps, so its memory and caches do not
         * touch them; every rank measures its own device. */
        r->peak_source = "unknown";
        r->peak_tflops = device_peak(run, r->compute_dtype, &r->peak_source);
        if (strstr(r->peak_source, "GEMM probe")) /* not run.peak_tflops or the GPU table */
            r->peak_tflops = flops_probe_recheck(run->device, r->compute_dtype, r->peak_tflops,
                                                 r->tflops);
        if (r->peak_tflops > 0 && flops > 0) r->mfu = r->tflops / r->peak_tflops;
    }
    session_close(&s);
    if (r->ops) op_stats_uninstall(o->op_stats, &run->device);
    free(ms);
    return st;
}

/* ---- printing --------------------------------------------------------------- */

/* Step times that spread more than this, (max - min) / median, are flagged:
 * a neighbour's load, not the code, may be what was measured. */
#define BENCH_SPREAD_WARN 0.10

/* img/s at the slowest and the fastest step, and the steps' spread. */
static void bench_spread(const vh_bench_result *r, double *img_min, double *img_max,
                         double *spread) {
    double batch = (double)r->global_batch;
    *img_min = r->step_ms_max > 0 ? batch / (r->step_ms_max / 1e3) : NAN;
    *img_max = r->step_ms_min > 0 ? batch / (r->step_ms_min / 1e3) : NAN;
    *spread = r->step_ms_median > 0 ? (r->step_ms_max - r->step_ms_min) / r->step_ms_median : NAN;
}

static void json_number(FILE *out, const char *key, double v, const char *sep) {
    if (isfinite(v)) fprintf(out, "\"%s\": %.6g%s", key, v, sep);
    else fprintf(out, "\"%s\": null%s", key, sep);
}

static void json_string(FILE *out, const char *key, const char *v, const char *sep) {
    fprintf(out, "\"%s\": \"", key);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if ((unsigned char)*p < 0x20) fprintf(out, "\\u%04x", (unsigned)*p);
        else fputc(*p, out);
    }
    fprintf(out, "\"%s", sep);
}

void bench_print_json(const vh_run *run, const vh_bench_result *r, FILE *out) {
    fputc('{', out);
    json_number(out, "img_per_s", r->img_per_s, ", ");
    json_number(out, "step_ms_median", r->step_ms_median, ", ");
    json_number(out, "step_ms_min", r->step_ms_min, ", ");
    json_number(out, "step_ms_max", r->step_ms_max, ", ");
    double img_min, img_max, spread;
    bench_spread(r, &img_min, &img_max, &spread);
    json_number(out, "img_per_s_min", img_min, ", ");
    json_number(out, "img_per_s_max", img_max, ", ");
    json_number(out, "step_spread", spread, ", ");
    json_number(out, "tflops", r->tflops, ", ");
    json_number(out, "mfu", r->mfu, ", ");
    json_number(out, "peak_tflops", r->peak_tflops > 0 ? r->peak_tflops : NAN, ", ");
    json_string(out, "peak_source", r->peak_source ? r->peak_source : "unknown", ", ");
    fprintf(out, "\"peak_mem_bytes\": %lld, ", (long long)r->peak_mem_bytes);
    if (r->device_mem_bytes >= 0)
        fprintf(out, "\"device_mem_bytes\": %lld, ", (long long)r->device_mem_bytes);
    else
        fputs("\"device_mem_bytes\": null, ", out);
    fprintf(out, "\"model_state_bytes\": %lld, \"activation_bytes\": %lld, ",
            (long long)r->model_state_bytes, (long long)r->activation_bytes);
    fputs("\"phase_ms\": {", out);
    for (int p = 0; p < VH_STEP_PHASE_COUNT; p++)
        json_number(out, vh_step_phase_names[p], r->phase_ms[p],
                    p + 1 < VH_STEP_PHASE_COUNT ? ", " : "}, ");
    fprintf(out,
            "\"world_size\": %d, \"global_batch\": %lld, \"micro_batch\": %lld, "
            "\"grad_accum\": %lld, \"steps\": %lld, \"warmup\": %lld, "
            "\"skipped_steps\": %lld, ",
            (int)r->world_size, (long long)r->global_batch, (long long)r->micro_batch,
            (long long)r->grad_accum, (long long)r->steps,
            (long long)r->warmup, (long long)r->skipped_steps);
    json_number(out, "loss", r->loss, ", ");
    json_string(out, "compute_dtype", vh_dtype_name(r->compute_dtype), ", ");
    json_string(out, "device", run->device ? run->device->name : "?", ", ");
    json_string(out, "recipe", run->recipe.file ? run->recipe.file : "", "");
    if (run->device && run->device->kind == VH_DEVICE_KIND_CPU) {
        /* the engine's choices, as bench_print's lines say them (bench_step.py
         * shows the gelu' one beside each AMP run) */
        char line[512];
        fputs(", \"engine\": {", out);
        json_string(out, "gemm", vh_cpu_gemm16_summary(r->compute_dtype, line, sizeof line), ", ");
        json_string(out, "attention", vh_cpu_attention_routes(line, sizeof line), ", ");
        json_string(out, "bands", vh_cpu_gemm_bands_summary(line, sizeof line),
                    r->compute_dtype == VH_DTYPE_BF16 ? ", " : "");
        if (r->compute_dtype == VH_DTYPE_BF16)
            json_string(out, "gelu_grad", vh_cpu_gelu_grad16_summary(line, sizeof line), "");
        fputc('}', out);
    }
    if (r->ops) {
        fputs(", \"ops\": ", out);
        op_stats_print_json(r->ops, out);
    }
    fputs("}\n", out);
    fflush(out);
}

static void mib_text(char *buf, size_t len, int64_t bytes) {
    snprintf(buf, len, "%.1f MiB", (double)bytes / 1048576.0);
}

void bench_print(const vh_run *run, const vh_bench_result *r, FILE *out) {
    char accum[96] = "";
    if (r->grad_accum > 1)
        snprintf(accum, sizeof accum, " (%lld x %lld micro-batches (run.grad_accum) x %d)",
                 (long long)r->micro_batch, (long long)r->grad_accum, (int)r->world_size);
    fprintf(out, "vithost bench: %s on %s, %d rank(s), global batch %lld%s; %lld optimizer "
                 "steps after %lld warm-up; compute %s\n",
            run->recipe.file, run->device->name, (int)r->world_size,
            (long long)r->global_batch, accum, (long long)r->steps, (long long)r->warmup,
            vh_dtype_name(r->compute_dtype));
    if (run->device->kind == VH_DEVICE_KIND_CPU) {
        /* which path the 16-bit GEMMs took, or which kernel the f32 ones,
         * per shape class (gemm_choice.c) */
        char line[256], classes[4096];
        fprintf(out, "  gemm        %s\n",
                vh_cpu_gemm16_summary(r->compute_dtype, line, sizeof line));
        vh_cpu_gemm16_classes(classes, sizeof classes);
        for (char *p = classes, *e; *p; p = e + 1) {
            if (!(e = strchr(p, '\n'))) break;
            fprintf(out, "              %.*s\n", (int)(e - p), p);
        }
    }
    if (run->device->kind == VH_DEVICE_KIND_CPU) {
        char line[512]; /* which kernels attention ran on (sdk/src/cpu/attention*.c) */
        fprintf(out, "  attention   %s\n", vh_cpu_attention_routes(line, sizeof line));
        fprintf(out, "  bands       %s\n", vh_cpu_gemm_bands_summary(line, sizeof line));
        if (r->compute_dtype == VH_DTYPE_BF16) /* gelu_grad16.c's choice */
            fprintf(out, "  gelu'       %s\n", vh_cpu_gelu_grad16_summary(line, sizeof line));
    }
    fprintf(out, "  step time   median %.2f ms, min %.2f, max %.2f (the slowest rank's)\n",
            r->step_ms_median, r->step_ms_min, r->step_ms_max);
    double img_min, img_max, spread;
    bench_spread(r, &img_min, &img_max, &spread);
    fprintf(out, "  throughput  %.1f img/s (the job), %.1f per rank; min %.1f, max %.1f (the "
                 "slowest and fastest step)\n",
            r->img_per_s, r->img_per_s / r->world_size, img_min, img_max);
    if (spread > BENCH_SPREAD_WARN)
        fprintf(out, "  warning     step times spread %.0f%% ((max - min) / median, over %.0f%%): "
                     "the machine may be busy; compare runs with care or raise --steps\n",
                100.0 * spread, 100.0 * BENCH_SPREAD_WARN);
    fprintf(out, "  compute     %.4f TFLOP/s per device", r->tflops);
    if (isfinite(r->mfu))
        fprintf(out, ", MFU %.1f%% of %.4g TFLOP/s (%s)\n", 100.0 * r->mfu, r->peak_tflops,
                r->peak_source);
    else
        fprintf(out, ", MFU unknown (no peak for this device: set run.peak_tflops)\n");
    char host[32], state[32], act[32];
    mib_text(host, sizeof host, r->peak_mem_bytes);
    mib_text(state, sizeof state, r->model_state_bytes);
    mib_text(act, sizeof act, r->activation_bytes);
    char dev[48] = "";
    if (r->device_mem_bytes >= 0) {
        char mib[32];
        mib_text(mib, sizeof mib, r->device_mem_bytes);
        snprintf(dev, sizeof dev, ", device %s", mib);
    }
    fprintf(out, "  memory      peak host %s%s (largest rank); per rank: model state %s, "
                 "activations %s\n",
            host, dev, state, act);
    double total = 0.0;
    for (int p = 0; p < VH_STEP_PHASE_COUNT; p++) total += r->phase_ms[p];
    fputs("  phases      ", out);
    for (int p = 0; p < VH_STEP_PHASE_COUNT; p++)
        fprintf(out, "%s%s %.2f ms (%.0f%%)", p ? ", " : "", vh_step_phase_names[p],
                r->phase_ms[p], total > 0 ? 100.0 * r->phase_ms[p] / total : 0.0);
    fputs(" (means per step)\n", out);
    if (r->skipped_steps > 0)
        fprintf(out, "  note        %lld timed step(s) skipped the optimizer (overflow)\n",
                (long long)r->skipped_steps);
    if (r->ops) op_stats_print(r->ops, out);
    fflush(out);
}

/* ---- the command line --------------------------------------------------------- */

static const char bench_usage[] =
    "usage: vithost bench RECIPE [--steps N] [--warmup K] [--json] [--ops]\n"
    "                     [--set SECTION.KEY=VALUE]...\n"
    "  trains N timed steps (default 20) after K warm-up steps (default 3) as the recipe\n"
    "  says, with no run folder, and prints step times, img/s, TFLOP/s, MFU, memory and\n"
    "  the time per phase; --json prints one JSON object instead. Under mpirun, rank 0\n"
    "  prints and img/s is the whole job's. --ops adds the time per device op (calls,\n"
    "  ms and % of a step, GFLOP/s of the GEMMs), rank 0's; a GPU then synchronises\n"
    "  around each op.\n";

static int bench_usage_error(FILE *err, const char *fmt, const char *arg) {
    fputs("vithost bench: ", err);
    fprintf(err, fmt, arg);
    fputc('\n', err);
    fputs(bench_usage, err);
    return VH_EXIT_USAGE;
}

static int parse_count(const char *text, int64_t min, int64_t *out) {
    char *end;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || v < min || v > 100000000) return -1;
    *out = v;
    return 0;
}

/* The command line of `vithost bench`. */
typedef struct bench_args {
    vh_bench_options o;
    const char *recipe;
    const char **sets;
    int num_sets;
    int help; /* --help: the usage was printed, nothing to run */
    int ops;  /* --ops */
} bench_args;

/* One option (name, and its value when it takes one); an exit code. */
static int bench_option(bench_args *a, const char *arg, const char *name, const char *value,
                        FILE *err) {
    if (!strcmp(name, "--steps")) {
        if (parse_count(value, 1, &a->o.steps))
            return bench_usage_error(err, "--steps needs a whole number >= 1, not '%s'", value);
    } else if (!strcmp(name, "--warmup")) {
        if (parse_count(value, 0, &a->o.warmup))
            return bench_usage_error(err, "--warmup needs a whole number >= 0, not '%s'",
                                     value);
    } else if (!strcmp(name, "--set")) {
        a->sets[a->num_sets++] = value;
    } else if (!strcmp(arg, "--json")) {
        a->o.json = 1;
    } else if (!strcmp(arg, "--ops")) {
        a->ops = 1;
    } else if (arg[0] == '-') {
        return bench_usage_error(err, "unknown option '%s'", arg);
    } else if (!a->recipe) {
        a->recipe = arg;
    } else {
        return bench_usage_error(err, "unexpected argument '%s'", arg);
    }
    return VH_EXIT_OK;
}

/* Options may come before or after the recipe; a value is the next
 * argument, or follows '='. */
static int parse_bench_args(int argc, char **argv, bench_args *a, FILE *out, FILE *err) {
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *value = NULL;
        char name[32];
        snprintf(name, sizeof name, "%s", arg);
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof name) {
            name[eq - arg] = '\0';
            value = eq + 1;
        }
        int takes = !strcmp(name, "--steps") || !strcmp(name, "--warmup") || !strcmp(name, "--set");
        if (takes && !value) {
            if (i + 1 >= argc) return bench_usage_error(err, "%s needs a value", name);
            value = argv[++i];
        }
        if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
            fputs(bench_usage, out);
            a->help = 1;
            return VH_EXIT_OK;
        }
        int code = bench_option(a, arg, name, value, err);
        if (code != VH_EXIT_OK) return code;
    }
    if (!a->recipe) return bench_usage_error(err, "%s", "needs a RECIPE file");
    return VH_EXIT_OK;
}

/* Benches an opened run and prints the result: of many ranks rank 0 prints, the others speak on
 * failure. */
static vh_status bench_and_print(vh_run *run, const vh_bench_options *o, FILE *out, FILE *err) {
    vh_diag d = {{0}};
    FILE *quiet = NULL;
    vh_status st = run_open_backends(run, &d);
    if (st == VH_STATUS_OK && run->comm.rank != 0) {
        quiet = fopen("/dev/null", "w");
        if (quiet) run->opts.out = quiet;
    }
    vh_bench_result r;
    if (st == VH_STATUS_OK) st = bench_run(run, o, &r, &d);
    if (st == VH_STATUS_OK && run->comm.rank == 0) {
        if (o->json) bench_print_json(run, &r, out);
        else bench_print(run, &r, out);
    }
    if (st != VH_STATUS_OK) {
        run_fail_all_ranks(run, st, d.text); /* of many ranks: does not return */
        if (run->comm.rank == 0 || !run->failed_together) fprintf(err, "vithost: %s\n", d.text);
    }
    run->opts.out = stdout;
    if (quiet) fclose(quiet);
    return st;
}

int bench_main(int argc, char **argv, FILE *out, FILE *err) {
    bench_args a = {.o = {.steps = 20, .warmup = 3}};
    a.sets = calloc((size_t)argc, sizeof *a.sets);
    if (!a.sets) return VH_EXIT_RUN_FAILED;
    int code = parse_bench_args(argc, argv, &a, out, err);
    if (code == VH_EXIT_OK && !a.help) {
        vh_run run;
        /* With --json, stdout carries the object alone. */
        vh_run_options opts = {.recipe_path = a.recipe, .sets = a.sets, .num_sets = a.num_sets,
                               .out = a.o.json ? err : out};
        vh_op_stats op_stats;
        if (a.ops) a.o.op_stats = &op_stats;
        code = command_open_run(&run, &opts, err);
        if (code == VH_EXIT_OK) {
            vh_status st = bench_and_print(&run, &a.o, out, err);
            run_close(&run);
            code = st == VH_STATUS_OK           ? VH_EXIT_OK
                   : st == VH_STATUS_ERR_CONFIG ? VH_EXIT_RECIPE
                                                : VH_EXIT_RUN_FAILED;
        }
    }
    free(a.sets);
    return code;
}
