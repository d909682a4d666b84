/* zero1.c - the sharding role's ZeRO stage 1 plugin (DeepSpeed's stage 1):
 * parameters and gradients replicated, optimizer state sharded.
 *
 * As in ddp, every rank keeps the whole model's compute copies and
 * gradients (../common/replica.c): gather hands out the replica, backward
 * writes the full gradients, and reduce all-reduces them (the mean over
 * ranks) in the same buckets, with the same wire dtypes and the same
 * progress between units, so every rank ends backward with the same mean
 * gradient, bit for bit ddp's.
 *
 * Unlike ddp, the optimizer's part is sharded as fsdp shards
 * (../common/shards.c, 16-element aligned shards): rank r's slices cover
 * only its 1/world contiguous part of each unit's elements, and only that
 * part has f32 masters (for 16-bit compute copies under master weights) and
 * optimizer state. The optimizer updates those pieces: in the replica
 * itself where a piece is its own master, in the f32 masters otherwise.
 *
 * Refresh (after the optimizer) makes the replicas equal again: each rank
 * converts its pieces' masters to their compute copies, packs its pieces'
 * compute copies (C bytes a unit, as fsdp packs its shards) and all-gathers
 * them, unit by unit; every rank unpacks every rank's pieces into its
 * replica. The wire carries the compute dtype, so an AMP step sends half of
 * what f32 masters would; one step sends 2 (w-1)/w of the gradients'
 * bytes in the all-reduce and (w-1)/w of the parameters' in the all-gather.
 *
 * load_unit broadcasts each unit's values from rank 0 and sets the replica
 * and this rank's masters from them; store_unit all-gathers the masters
 * (f32), so a checkpoint holds the masters as ddp's does. The slices say
 * `replicated` 0 (each element on one rank: a sum over them, a gradient
 * norm, spans the ranks, as under fsdp), and state_save / state_load move
 * each rank's pieces, so a checkpoint does not depend on the world size.
 *
 * memory(): params and grads as ddp's; masters and optim_state 1/world of
 * ddp's (plus the shards' padding, at most 15 elements a unit and rank);
 * comm_buffers the transient buffers of refresh and store_unit (the largest
 * unit's packed shard and staging), or the peak seen when larger.
 */
#include "../common/sharding_core.h"

#define ZERO1_SHARD_ALIGN 16 /* elements: 64 bytes of f32 */

static const vh_config_key schema[] = {
    SH_BUCKET_MB_KEY,
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* Replicas, and shards of the communicator's world. */
static vh_status zero1_plan(sh_core *c) {
    vh_status st = sh_shards_plan(c, c->world, c->rank, ZERO1_SHARD_ALIGN);
    return st == VH_STATUS_OK ? sh_replica_plan(c) : st;
}

/* Every rank's pieces of one unit into this rank's replica. */
static vh_status gather_unit(sh_core *c, int32_t unit) {
    const size_t bytes = c->sd.units[unit].packed_bytes;
    void *mine = NULL, *staging = NULL;
    vh_comm_request *req = NULL;
    vh_status st = sh_tmp_alloc(c, bytes, 1, &mine, "the packed shard");
    if (st == VH_STATUS_OK) st = sh_shards_pack(c, unit, mine);
    if (st == VH_STATUS_OK) st = sh_shards_gather_start(c, unit, mine, &staging, &req);
    if (st == VH_STATUS_OK)
        st = sh_shards_gather_finish(c, unit, &staging, req,
                                     (char *)c->rep.compute + c->rep.units[unit].param_at);
    sh_tmp_free(c, &mine, bytes);
    return st;
}

static vh_status zero1_refresh(sh_core *c, int updated) {
    vh_status st = sh_shards_refresh_local(c, updated);
    for (int32_t u = 0; u < c->num_units && st == VH_STATUS_OK && c->sd.world > 1; u++)
        st = gather_unit(c, u);
    return st;
}

static void zero1_memory(const sh_core *c, vh_sharding_memory *m) {
    sh_replica_memory(c, m);
    int64_t plan = 0;
    for (int32_t u = 0; u < c->num_units; u++) {
        const sh_shard_unit *su = &c->sd.units[u];
        int64_t f32 = su->shard * (int64_t)sizeof(float);
        int64_t unit = (int64_t)(c->sd.world + 1) *
                       ((int64_t)su->packed_bytes > f32 ? (int64_t)su->packed_bytes : f32);
        if (unit > plan) plan = unit;
    }
    m->comm_buffers = c->peak > plan ? c->peak : plan;
}

static const sh_strategy zero1 = {
    .name = "zero1", .size = sizeof(sh_core), .replicated = 0,
    .comm = SH_COMM_ALL_REDUCE | SH_COMM_ALL_GATHER,
    .plan = zero1_plan, SH_REPLICA_CALLS, .refresh = zero1_refresh, .memory = zero1_memory,
};

SH_PLUGIN_DEFINE(zero1, "zero1", "0.1.0",
                 "ZeRO-1: replicas with grads all-reduced in buckets, optimizer state and f32 "
                 "masters sharded, parameters all-gathered after the step",
                 schema);
