/* bench_command.h - `vithost bench RECIPE [--steps N] [--warmup K] [--json]`:
 * training steps only, as the recipe says (its data too: a synthetic data
 * section gives synthetic data), timed. No run folder, no evaluation, no
 * checkpoint.
 *
 * Printed (rank 0 of many): the median, min and max step time (a step's
 * time is the slowest rank's), images per second of the whole job (global
 * batch / median step), TFLOP/s per device (the model's training FLOPs per
 * image, pycls convention), MFU against the device's peak for the policy's
 * compute dtype (run.peak_tflops when set; else on the CPU a GEMM probe in
 * that dtype, on a GPU a table of datasheet peaks by model), peak host
 * memory (max over ranks), the sharding plugin's and the model's memory,
 * and the step split into phases (step_phases.h), each the mean over ranks.
 * A step is an optimizer step: with run.grad_accum K > 1, K micro-batches of
 * run.batch_size (each data.next in the data phase), so the global batch is
 * batch_size x K x ranks and the loss is the last micro-batch's.
 *
 * --json prints one object on stdout instead (human lines go nowhere):
 *
 *   {"img_per_s": ..., "step_ms_median": ..., "step_ms_min": ..., "step_ms_max": ...,
 *    "img_per_s_min": ..., "img_per_s_max": ..., "step_spread": ...,
 *    "tflops": ..., "mfu": ..., "peak_tflops": ..., "peak_source": "...",
 *    "peak_mem_bytes": ..., "device_mem_bytes": null, "model_state_bytes": ...,
 *    "activation_bytes": ..., "phase_ms": {"data": ..., "forward": ..., "backward": ...,
 *    "comm_wait": ..., "optimizer": ...}, "world_size": ..., "global_batch": ...,
 *    "micro_batch": ..., "grad_accum": ...,
 *    "steps": ..., "warmup": ..., "skipped_steps": ..., "loss": ...,
 *    "compute_dtype": "f32", "device": "cpu", "recipe": "..."}
 *
 * With --ops, an "ops" member follows (op_stats.h): the device ops per
 * step, and the printed lines end with their table.
 *
 * img_per_s_min/max are the global batch over the slowest and the fastest
 * step; step_spread is (max - min) / median of the step times (the text
 * warns past 10%: a busy machine). mfu is null when no peak is known;
 * device_mem_bytes is the device allocator's peak (largest rank), null where
 * the device does not report one (the CPU: peak_mem_bytes is it). */
#ifndef VITHOST_HOST_BENCH_COMMAND_H
#define VITHOST_HOST_BENCH_COMMAND_H

#include <stdint.h>
#include <stdio.h>

#include "op_stats.h"
#include "runtime.h"
#include "step_phases.h"

typedef struct vh_bench_options {
    int64_t steps;  /* timed steps, >= 1 */
    int64_t warmup; /* untimed steps first, >= 0 */
    int json;
    /* --ops: where to time each device op (caller-owned), or NULL: nothing
     * is wrapped */
    vh_op_stats *op_stats;
} vh_bench_options;

typedef struct vh_bench_result {
    int32_t world_size;
    int64_t global_batch, steps, warmup, skipped_steps; /* global: micro x accum x ranks */
    int64_t micro_batch, grad_accum; /* run.batch_size, run.grad_accum: a step's micro-batches */
    double step_ms_median, step_ms_min, step_ms_max;
    double img_per_s, tflops, mfu, peak_tflops; /* mfu NAN when peak unknown */
    const char *peak_source;                    /* what the peak is */
    int64_t peak_mem_bytes, model_state_bytes, activation_bytes;
    int64_t device_mem_bytes; /* the device allocator's peak, -1: not known (CPU) */
    double phase_ms[VH_STEP_PHASE_COUNT];
    double loss;
    vh_dtype compute_dtype;
    const vh_op_stats *ops; /* the per-op figures with --ops, else NULL */
} vh_bench_result;

/* Opens the device, the communicator and a session on an opened run,
 * trains warmup + steps steps and fills *r (every rank; the same numbers
 * on each). */
vh_status bench_run(vh_run *run, const vh_bench_options *o, vh_bench_result *r, vh_diag *d);

/* Prints a result as the human lines, or as the one JSON object. */
void bench_print(const vh_run *run, const vh_bench_result *r, FILE *out);
void bench_print_json(const vh_run *run, const vh_bench_result *r, FILE *out);

/* The device's datasheet peak (TFLOP/s, dense) for a compute dtype, from
 * the GPU model's name (e.g. "NVIDIA H200"); 0 when the name is unknown.
 * *what receives a short description of the figure. */
double bench_gpu_peak_tflops(const char *model_name, vh_dtype dtype, const char **what);

/* `vithost bench ...`: argv[1] is "bench". Returns an exit code (cli.h). */
int bench_main(int argc, char **argv, FILE *out, FILE *err);

#endif
