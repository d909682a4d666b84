/* ddp.c - the sharding role's data-parallel plugin: full replicas on every rank.
 *
 * Every rank keeps the whole model: the compute copies and gradients as
 * replicas (../common/replica.c: flat buffers, gradients all-reduced in
 * buckets of units with progress between the model's units), and the f32
 * masters and optimizer state of every parameter, laid out as shards of a
 * world of one (../common/shards.c with align 1: S = N, nothing padded), so
 * the optimizer's slices are one per parameter, each the whole parameter,
 * and the state of each slot holds the parameters end to end, unit after
 * unit, at the table's offsets.
 *
 * Masters. With master weights (the policy's master_weights, master_dtype
 * f32) a parameter whose compute copy is f32 is its own master: the slice
 * points at the compute copy and nothing is refreshed (fp32 keeps one copy).
 * A parameter whose compute copy is f16/bf16 gets a separate f32 master, and
 * refresh converts masters -> compute copies (device->convert, round to
 * nearest even). Without master weights the optimizer updates the compute
 * copy itself, in its dtype.
 *
 * Every rank holds the same state, so the slices say `replicated` (a sum
 * over them is already global) and a checkpoint's state is written by rank 0
 * alone. memory(): params the compute copies (layouts with their padding),
 * grads the gradients plus the f32 copies of 16-bit ones, masters only the
 * separate f32 masters, optim_state slots x numel f32, comm_buffers 0: every
 * collective runs in place.
 */
#include "../common/sharding_core.h"

static const vh_config_key schema[] = {
    SH_BUCKET_MB_KEY,
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* Replicas, and one shard that holds every element. */
static vh_status ddp_plan(sh_core *c) {
    vh_status st = sh_shards_plan(c, 1, 0, 1);
    return st == VH_STATUS_OK ? sh_replica_plan(c) : st;
}

/* refresh: masters -> compute copies, where they are not the same (under
 * fp32 none is). */
static const sh_strategy ddp = {
    .name = "ddp", .size = sizeof(sh_core), .comm = SH_COMM_ALL_REDUCE, .replicated = 1,
    .plan = ddp_plan, SH_REPLICA_CALLS,
    .refresh = sh_shards_refresh_local, .memory = sh_replica_memory,
};

SH_PLUGIN_DEFINE(ddp, "ddp", "0.1.0",
                 "data parallel: full replicas, grads all-reduced in buckets of units", schema);
