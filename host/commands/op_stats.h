/* op_stats.h - where a step's device time goes: calls, wall time and
 * FLOPs per device op (`vithost bench --ops`).
 *
 * The timing layer is a copy of the device's vh_device_ops whose compute
 * and memory-traffic ops (op_stats_entries: GEMM, layer norm, attention,
 * element-wise, losses, casts, copies, the multi-tensor pass, ...) go
 * through a trampoline that counts the call and adds its wall time; GEMMs
 * and attention also add their FLOPs. On a device that is not the CPU the
 * layer synchronises the device before and after each timed op, so an op's
 * time is its own (and the step is slower: the figures are a profile, not a
 * throughput). On the CPU every op is synchronous already.
 *
 * Streams, events, allocation and get_extension pass through untouched:
 * they are the inner table's own functions. Arguments and statuses pass
 * through unchanged, and an op the device lacks stays NULL.
 *
 * One layer times at a time per process (the trampolines find it through
 * one pointer; bench times one device). Not thread-safe: the run issues
 * its ops from one thread. Nothing is wrapped unless op_stats_install is
 * called: without --ops a run pays nothing. */
#ifndef VITHOST_HOST_OP_STATS_H
#define VITHOST_HOST_OP_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vithost/vh_device.h"

/* A timed op: its name and where it sits in vh_device_ops. */
typedef struct op_stats_entry {
    const char *name;
    size_t offset;
    void (*trampoline)(void); /* the layer's function, of the member's type */
} op_stats_entry;
extern const op_stats_entry op_stats_entries[];
extern const int op_stats_entry_count;

#define VH_OP_STATS_MAX 32

typedef struct vh_op_stat {
    int64_t calls;
    double seconds;
    double flops; /* GEMM and attention; 0 for the others */
} vh_op_stat;

/* GEMMs by shape: the "gemm" row split, so a slow shape shows. Shapes past
 * VH_OP_STATS_GEMM_SHAPES are counted in the row but not split out. */
#define VH_OP_STATS_GEMM_SHAPES 48

typedef struct vh_op_gemm_shape {
    int64_t batch, m, n, k;
    int32_t trans_a, trans_b, ab_dtype, c_dtype, epilogue;
    int32_t bias, residual, beta; /* 0/1: a bias, a residual, beta != 0 */
    vh_op_stat stat;
} vh_op_gemm_shape;

typedef struct vh_op_stats {
    vh_device_ops inner;           /* the device's table, as installed over */
    vh_device_ops ops;             /* the layer's: what the run sees */
    const vh_device_ops *original; /* restored by op_stats_uninstall */
    int counting;                  /* 0: trampolines only pass through */
    vh_op_stat stat[VH_OP_STATS_MAX]; /* by op_stats_entries index */
    vh_op_gemm_shape gemm_shape[VH_OP_STATS_GEMM_SHAPES];
    int gemm_shapes;               /* used entries of gemm_shape */
    double step_seconds;           /* the timed steps' wall time, summed by the caller */
    int64_t steps;
} vh_op_stats;

/* Puts the layer over *device (*device then points at stats->ops); stats
 * must outlive every user of that pointer. Counting starts off (see
 * op_stats_start). VH_STATUS_ERR_INVALID_ARG when a layer is already
 * installed in this process. */
vh_status op_stats_install(vh_op_stats *stats, const vh_device_ops **device);
/* Puts the original table back into *device; the figures stay readable. */
void op_stats_uninstall(vh_op_stats *stats, const vh_device_ops **device);
/* Zeroes the figures and starts counting (after warm-up); stop ends it. */
void op_stats_start(vh_op_stats *stats);
void op_stats_stop(vh_op_stats *stats);

/* The figures per step, sorted by time (longest first), against the mean
 * step; the human table follows with the GEMMs' ten slowest shapes
 * ("gemm_shapes" in JSON, all of them). A human table, or a JSON object
 *   {"step_ms": mean step, "total_ms": the timed ops, "other_ms": the rest,
 *    "by_op": {"gemm": {"calls_per_step": .., "ms_per_step": ..,
 *    "percent_of_step": .., "gflop_per_s": .. or null}, ...},
 *    "gemm_shapes": [{"shape": "64x6400x192x64 bf16 A.B^T +bias", "calls_per_step",
 *    "ms_per_step", "gflop_per_s"}, ...]}
 * (ops never called are left out). */
void op_stats_print(const vh_op_stats *stats, FILE *out);
void op_stats_print_json(const vh_op_stats *stats, FILE *out);

#endif
