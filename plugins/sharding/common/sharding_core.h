/* sharding_core.h - the core every sharding plugin of this tree is built on.
 *
 * A sharding plugin is a STRATEGY (sh_strategy: where the compute copies
 * live and which collectives move them) over one core, compiled into each
 * plugin (it is not part of the SDK):
 *
 *   core.c     the vtable every plugin exports (SH_VTABLE): life cycle,
 *              setup, the unit and parameter records with their two layouts,
 *              call-order checks, load_unit / store_unit, the slices, state
 *              io and memory(); the strategy adds its part to each call
 *   shards.c   the element space and its shards: the optimizer's slices,
 *              f32 masters and optimizer state of the pieces this rank owns
 *   replica.c  full replicas of the compute copies and gradients, with the
 *              gradients all-reduced in buckets (ddp, zero1)
 *
 * The three strategies are DeepSpeed's ZeRO stages over it:
 *
 *   ddp    ZeRO-0  replicas; one shard (world 1) holds every element
 *   zero1  ZeRO-1  replicas; the optimizer's shard is 1/world of each unit,
 *                  refresh all-gathers the updated compute copies
 *   fsdp   ZeRO-3  (or 2) only the shards live; all-gather before use,
 *                  reduce-scatter the gradients
 *
 * The unit is the granularity of everything: a model's unit (patch
 * embedding, a block, the head) is laid out once with the policy's
 * parameter dtypes and once with its gradient dtypes (vh_unit_layout_init,
 * every parameter 64-byte aligned), and its N elements, the parameters end
 * to end at vh_param_desc.offset, are what shards split.
 */
#ifndef VITHOST_PLUGINS_SHARDING_CORE_H
#define VITHOST_PLUGINS_SHARDING_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_config.h"
#include "vithost/vh_device.h"
#include "vithost/vh_host.h"
#include "vithost/vh_params.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_sharding.h"

#include "sharding_checks.h"

typedef struct sh_core sh_core;

/* ---- the table, as every strategy sees it (core.c) ------------------------ */

typedef struct sh_param {
    int64_t numel;
    int64_t elem;          /* first element in the unit's element space */
    vh_dtype param_dtype;  /* of the compute copy */
    vh_dtype grad_dtype;   /* as backward writes it */
    size_t param_at;       /* byte offset in the unit's compute layout */
    size_t grad_at;        /* byte offset in the unit's gradient layout */
} sh_param;

typedef struct sh_unit {
    const char *name;      /* the table's, for messages; lives as long as the model */
    int64_t numel;         /* N */
    int32_t first_param, num_params; /* into core.params */
    size_t param_bytes, grad_bytes;  /* the two full layouts */
    int32_t gathered;      /* gathers not yet released */
    int32_t reduced;       /* reduce was called for it in the current step */
} sh_unit;

/* ---- shards of the element space (shards.c) ------------------------------- */

/* A rank's part of one parameter: (unit, param, element range). */
typedef struct sh_piece {
    int32_t rank;
    int32_t param;         /* within the unit */
    int64_t offset, count; /* elements within the parameter */
    int64_t shard_elem;    /* first element within the rank's shard [0, S) */
    size_t packed_at;      /* byte offset within the rank's packed compute copies */
    int64_t master_at;     /* own pieces: offset in core.masters; -1: the compute copy */
} sh_piece;

typedef struct sh_shard_unit {
    int64_t shard;         /* S; the shards cover Np = S * world >= N */
    int64_t shard_at;      /* element offset of this rank's shard in the state buffers */
    int32_t first_piece, num_pieces; /* every rank's, rank-major, into shards.pieces */
    int32_t own_first, own_count;    /* this rank's (absolute indices) */
    size_t packed_bytes;   /* C: the largest rank's packed compute copies */
    size_t packed_at;      /* byte offset of this rank's C bytes in a packed buffer */
} sh_shard_unit;

typedef struct sh_shards {
    int32_t world, rank;   /* of the sharding, not always the communicator's */
    sh_shard_unit *units;  /* host memory */
    sh_piece *pieces;      /* host memory, every rank's pieces of every unit */
    int32_t num_pieces, num_own;
    int64_t numel;         /* sum of S: elements of each state slot */
    size_t packed_bytes;   /* sum of C */
} sh_shards;

/* ---- replicas (replica.c) ------------------------------------------------- */

typedef struct sh_rparam {
    size_t param_at;       /* byte offset of the compute copy in `compute` */
    size_t grad_at;        /* byte offset of the gradient in `grads` */
    int64_t grad32_at;     /* element offset in grad32; -1 when grads are f32 */
    int in_grad32;         /* reduced in grad32 (f32), after a conversion in reduce */
    vh_dtype wire;         /* the dtype its gradient is reduced in */
} sh_rparam;

typedef struct sh_runit {
    size_t param_at, grad_at; /* the unit's start in `compute` and `grads` */
    size_t wire_bytes;     /* its gradients on the wire */
    int32_t bucket;        /* into replica.buckets */
    int32_t converted;     /* its 16-bit grads are in grad32 for this step */
} sh_runit;

/* One collective of a bucket's reduction. */
typedef struct sh_run {
    int32_t first, count;  /* the params it covers, into core.params */
    int in_grad32;         /* reduced in grad32 (f32), after a conversion */
    vh_dtype dtype;        /* on the wire */
    size_t at;             /* byte offset in `grads`, or element offset in grad32 */
    size_t elems;          /* elements of dtype, padding included */
    vh_comm_request *req;  /* in flight, or NULL */
    int done;              /* test said it finished (it is still to be waited on) */
} sh_run;

/* Consecutive units whose gradients travel together. */
typedef struct sh_bucket {
    int32_t first_unit, num_units;
    int32_t first_run, num_runs; /* into replica.runs */
    size_t bytes;                /* on the wire */
    int32_t reduced;             /* of its units, reduced in the current step */
} sh_bucket;

typedef struct sh_replica {
    double bucket_mb;      /* the config's */
    sh_runit *units;       /* host memory, one per unit */
    sh_rparam *params;     /* host memory, one per parameter */
    sh_run *runs;          /* host memory, bucket after bucket */
    int32_t num_runs;
    sh_bucket *buckets;    /* host memory, in backward order: bucket 0 holds the last unit */
    int32_t num_buckets;
    int32_t *started;      /* indices into runs, in the order their collectives started */
    int32_t num_started;
    int32_t first_open;    /* started[< first_open] are known to have finished */
    /* device memory */
    void *compute;         /* the compute copies, unit after unit */
    size_t compute_bytes;
    void *grads;           /* the gradients, the same way */
    size_t grads_bytes;
    float *grad32;         /* f32 copies of the 16-bit gradients, packed */
    int64_t grad32_numel;
} sh_replica;

/* ---- the strategy --------------------------------------------------------- */

/* Communicator calls a strategy needs besides wait. */
enum { SH_COMM_ALL_REDUCE = 1, SH_COMM_ALL_GATHER = 2, SH_COMM_REDUCE_SCATTER = 4 };

/* What a plugin adds to the core. The core has checked the instance, the
 * unit index, the call order and the NULL outs before it calls one; every
 * member is required unless it says otherwise. */
typedef struct sh_strategy {
    const char *name;      /* the plugin's, in messages */
    size_t size;           /* of the plugin's instance, which starts with an sh_core */
    unsigned comm;         /* SH_COMM_* */
    int replicated;        /* every rank holds the same slices and state */
    /* Reads the plugin's config keys into the instance (optional: NULL). */
    vh_status (*configure)(sh_core *c);
    /* Placement, in host memory, once the units and params are laid out:
     * calls sh_shards_plan (which sizes masters and state), then its own. */
    vh_status (*plan)(sh_core *c);
    /* Its device buffers, once the masters and state are allocated. */
    vh_status (*alloc)(sh_core *c);
    /* Finishes what is in flight and frees what plan and alloc made; also
     * after a failed setup, so any of it may be missing. */
    void (*release)(sh_core *c);
    /* The compute copy and the reduced gradient of one of this rank's
     * pieces: the gradient in f32, or in its 16-bit dtype (*dtype) where
     * the optimizer reads it so (sh_core.half_grads). */
    void *(*piece_param)(const sh_core *c, int32_t unit, const sh_piece *pc);
    void *(*piece_grad)(const sh_core *c, int32_t unit, const sh_piece *pc, vh_dtype *dtype);
    /* Sets what it keeps of the unit from `values`, the unit's N f32 values
     * in device memory: compute copies and (sh_shards_load) masters. */
    vh_status (*load_unit)(sh_core *c, int32_t unit, float *values);
    vh_status (*zero_grads)(sh_core *c);
    vh_status (*gather)(sh_core *c, int32_t unit, const void **params);
    vh_status (*release_unit)(sh_core *c, int32_t unit); /* after the count went down */
    vh_status (*grads)(sh_core *c, int32_t unit, void **grads);
    vh_status (*reduce)(sh_core *c, int32_t unit);     /* marked reduced already */
    vh_status (*wait)(sh_core *c);
    /* updated 0: refresh; 1: refresh_updated, after an optimizer that
     * wrote the compute copies of the slices whose compute is set
     * (core.writes_compute). */
    vh_status (*refresh)(sh_core *c, int updated);
    /* params, grads and comm_buffers; the core fills masters and state. */
    void (*memory)(const sh_core *c, vh_sharding_memory *m);
    /* Optional (NULL: nothing to do). set_sync was called: a micro-batch
     * of gradient accumulation starts, with no wait since the last one's
     * backward (a sync 0 backward has none): forget per-pass state. */
    vh_status (*micro_start)(sh_core *c);
} sh_strategy;

/* ---- the instance --------------------------------------------------------- */

struct sh_core {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    const sh_strategy *ops;
    int32_t world, rank;   /* the communicator's, read at setup */
    int ready;             /* setup succeeded */
    const vh_param_table *table; /* the setup's; lives as long as the model */
    vh_precision_policy policy;  /* the setup's, read into this SDK's struct */
    int32_t state_slots;
    /* The optimizer reads 16-bit gradients (VH_OPTIM_CAP_HALF_GRADS) and the
     * policy leaves them alone (unit_loss_scale): a replica hands the
     * reduced f16/bf16 gradients over as they are, with no f32 copy
     * (replica.c, "Gradients for the optimizer"). */
    int half_grads;
    /* The optimizer writes the compute copies (VH_OPTIM_CAP_WRITES_COMPUTE):
     * the slices of pieces with a separate compute copy carry it, and
     * refresh_updated leaves those pieces alone. */
    int writes_compute;
    sh_unit *units;        /* host memory */
    int32_t num_units;
    sh_param *params;      /* host memory, every parameter of every unit in order */
    int32_t num_params;
    sh_shards sd;          /* every strategy's */
    sh_replica rep;        /* ddp's and zero1's */
    /* device memory */
    float *masters;        /* f32 masters of own pieces with a 16-bit compute copy */
    int64_t masters_numel;
    float *state[VH_OPTIM_MAX_STATE_SLOTS]; /* sd.numel each */
    vh_param_slice *slices; /* host memory, one per own piece */
    int32_t pending;       /* units reduced and not yet waited for */
    int nosync;            /* set_sync(0): reduce only accumulates locally */
    int64_t live, peak;    /* transient device bytes: now, the most so far */
};

/* ---- core.c --------------------------------------------------------------- */

/* Checks the device and communicator, allocates the instance (zeroed) and
 * runs the strategy's configure: the body of each plugin's create. */
vh_status sh_create(vh_host *host, const sh_strategy *ops, void **self);

void sh_destroy(void *self);
vh_status sh_setup(void *self, const vh_sharding_setup *setup);
vh_status sh_load_unit(void *self, int32_t unit, const float *values);
vh_status sh_store_unit(void *self, int32_t unit, float *values);
vh_status sh_zero_grads(void *self);
vh_status sh_gather(void *self, int32_t unit, const void **params);
vh_status sh_release(void *self, int32_t unit);
vh_status sh_grads(void *self, int32_t unit, void **grads);
vh_status sh_reduce(void *self, int32_t unit);
vh_status sh_wait(void *self);
vh_status sh_slices(void *self, vh_param_slices *out);
vh_status sh_refresh(void *self);
vh_status sh_refresh_updated(void *self);
vh_status sh_state_save(void *self, const vh_state_io *io);
vh_status sh_state_load(void *self, const vh_state_io *io);
vh_status sh_memory(void *self, vh_sharding_memory *out);
vh_status sh_set_sync(void *self, int32_t sync);

/* Defines a sharding plugin on `strategy_`: its create, its vtable (every
 * other call is the core's) and its descriptor. */
#define SH_PLUGIN_DEFINE(strategy_, name_, version_, description_, schema_)                  \
    static vh_status sh_plugin_create(vh_host *host, void **self) {                          \
        return sh_create(host, &(strategy_), self);                                          \
    }                                                                                        \
    static const vh_sharding_vtable sh_plugin_vtable = {                                     \
        .struct_size = sizeof(vh_sharding_vtable), .create = sh_plugin_create,               \
        .destroy = sh_destroy, .setup = sh_setup, .load_unit = sh_load_unit,                 \
        .store_unit = sh_store_unit, .zero_grads = sh_zero_grads, .gather = sh_gather,       \
        .release = sh_release, .grads = sh_grads, .reduce = sh_reduce, .wait = sh_wait,      \
        .slices = sh_slices, .refresh = sh_refresh, .state_save = sh_state_save,             \
        .state_load = sh_state_load, .memory = sh_memory, .set_sync = sh_set_sync,           \
        .refresh_updated = sh_refresh_updated};                                              \
    VH_PLUGIN_DEFINE(VH_ROLE_SHARDING, name_, version_, description_, schema_, sh_plugin_vtable)

static inline const char *sh_unit_name(const sh_unit *u) { return u->name ? u->name : "?"; }
const char *sh_dev_name(const sh_core *c);

/* A zeroed device buffer of `bytes` (NULL when 0) that lives until release;
 * the message names what it is for. */
vh_status sh_alloc_zeroed(sh_core *c, size_t bytes, void **out, const char *what);
void sh_dev_free(sh_core *c, void *ptr);

/* Transient device buffers (staging, gathered units, scratch), counted in
 * core.live and core.peak. A stream device's free waits for the ops issued
 * on the buffer (cudaFree does), so a buffer may be freed right after the
 * ops that read it were issued. */
vh_status sh_tmp_alloc(sh_core *c, size_t bytes, int zero, void **out, const char *what);
void sh_tmp_free(sh_core *c, void **ptr, size_t bytes);

/* Records that a collective of `unit` failed ("<what> of unit 3 (head) over
 * 4 ranks failed") and returns st. */
vh_status sh_fail_comm(const sh_core *c, vh_status st, const char *what, int32_t unit);

/* Records that a device op on `unit` (and `param`, unless -1) failed
 * ("<what> unit 3 (head) param 1 on cpu failed") and returns st. */
vh_status sh_fail_device(const sh_core *c, vh_status st, const char *what, int32_t unit,
                         int32_t param);

/* dst <- src, n elements: a device copy when the dtypes agree, else the
 * device's conversion (round to nearest even). */
vh_status sh_cast(const sh_core *c, void *dst, vh_dtype dst_dtype, const void *src,
                  vh_dtype src_dtype, size_t n);

/* ---- shards.c ------------------------------------------------------------- */

/* Splits every unit's element space over `world` ranks in shards of S
 * elements (a multiple of `align`), computes every rank's pieces and this
 * rank's masters (each padded to `align` elements); sets core.masters_numel.
 * Host memory only; no communication. */
vh_status sh_shards_plan(sh_core *c, int32_t world, int32_t rank, int64_t align);
void sh_shards_release(sh_core *c);
/* One slice per own piece (core.slices, allocated by the core). */
void sh_shards_slices(sh_core *c);

/* The master of an own piece: its compute copy when it has no f32 one. */
void *sh_piece_master(const sh_core *c, int32_t unit, const sh_piece *pc);
vh_dtype sh_piece_master_dtype(const sh_core *c, int32_t unit, const sh_piece *pc);

/* Own pieces <- `values`, the unit's f32 elements on the device: their
 * separate f32 masters, and their compute copies when `compute`. */
vh_status sh_shards_load(sh_core *c, int32_t unit, const float *values, int compute);
/* Every rank's masters of the unit as f32 in a new transient buffer of
 * world * S elements (*all; free with sh_tmp_free): own pieces packed into
 * the shard, then all-gathered (not with one rank). */
vh_status sh_shards_gather_masters(sh_core *c, int32_t unit, float **all);
/* Own compute copies <- their separate f32 masters (after the optimizer);
 * updated 1: only those the optimizer did not write (core.writes_compute:
 * none then). */
vh_status sh_shards_refresh_local(sh_core *c, int updated);
/* Own pieces' compute copies into `packed` (the rank's C bytes of the unit). */
vh_status sh_shards_pack(sh_core *c, int32_t unit, void *packed);
/* Starts the all-gather of the unit's packed pieces (`mine`, C bytes, live
 * until it finishes) into a new transient staging buffer of world * C. */
vh_status sh_shards_gather_start(sh_core *c, int32_t unit, const void *mine, void **staging,
                                 vh_comm_request **req);
/* Finishes it, unpacks every rank's pieces into `full` (the unit's compute
 * layout; NULL: only finish) and frees the staging, whatever happens. */
vh_status sh_shards_gather_finish(sh_core *c, int32_t unit, void **staging, vh_comm_request *req,
                                  void *full);

/* ---- replica.c ------------------------------------------------------------ */

/* The bucket_mb key of the strategies built on replicas. */
#define SH_BUCKET_MB_KEY                                                                    \
    {"bucket_mb", VH_CONFIG_TYPE_FLOAT, "25",                                               \
     "MiB of gradients per all-reduce bucket: consecutive units (in backward order) share " \
     "one until it holds this much; 0: one bucket per unit",                               \
     NULL, 0, 1048576, 0}

vh_status sh_replica_configure(sh_core *c);
vh_status sh_replica_plan(sh_core *c);
vh_status sh_replica_alloc(sh_core *c);
void sh_replica_release(sh_core *c);
void *sh_replica_piece_param(const sh_core *c, int32_t unit, const sh_piece *pc);
void *sh_replica_piece_grad(const sh_core *c, int32_t unit, const sh_piece *pc,
                            vh_dtype *dtype);
/* Every compute copy of the unit and this rank's masters <- `values` (the
 * unit's f32 elements, on the device), broadcast from rank 0 first. */
vh_status sh_replica_load_unit(sh_core *c, int32_t unit, float *values);
vh_status sh_replica_zero_grads(sh_core *c);
vh_status sh_replica_gather(sh_core *c, int32_t unit, const void **params);
vh_status sh_replica_release_unit(sh_core *c, int32_t unit);
vh_status sh_replica_grads(sh_core *c, int32_t unit, void **grads);
vh_status sh_replica_reduce(sh_core *c, int32_t unit);
vh_status sh_replica_wait(sh_core *c);
/* params: the compute copies; grads: the gradients and their f32 copies. */
void sh_replica_memory(const sh_core *c, vh_sharding_memory *m);

/* The strategy members every replica strategy shares. */
#define SH_REPLICA_CALLS                                                                    \
    .configure = sh_replica_configure, .alloc = sh_replica_alloc,                          \
    .release = sh_replica_release,                                                          \
    .piece_param = sh_replica_piece_param, .piece_grad = sh_replica_piece_grad,            \
    .load_unit = sh_replica_load_unit, .zero_grads = sh_replica_zero_grads,                \
    .gather = sh_replica_gather, .release_unit = sh_replica_release_unit,                  \
    .grads = sh_replica_grads, .reduce = sh_replica_reduce, .wait = sh_replica_wait

#endif
