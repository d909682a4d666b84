/* shards.c - the element space and its shards (sharding_core.h).
 *
 * Each unit is sharded in its ELEMENT space: the unit's parameters end to
 * end at vh_param_desc.offset, N elements (the fp32 master layout). N is
 * padded to Np = world * S, the shard size S rounded up to a multiple of
 * `align` elements (fsdp and zero1: 16, so every shard stays 64-byte
 * aligned in f32; ddp shards over a world of one with align 1: S = N, and
 * its one rank owns everything); rank r owns elements [r*S, (r+1)*S). A
 * parameter may straddle ranks: each rank's part of a parameter is a
 * "piece" (unit, parameter, element range). Every rank computes the pieces
 * of every rank (a function of the table, the policy and the world size),
 * since it unpacks them all after an all-gather.
 *
 * A rank's pieces of a unit, packed: each piece's compute copy in its
 * parameter's compute dtype at a 64-byte aligned offset. Ranks pack
 * different bytes when dtypes are mixed (AMP keeps norms f32), so every
 * rank's part of a unit is padded to the largest, C bytes: an all-gather's
 * count.
 *
 * What the optimizer sees is the pieces of this rank: one slice each
 * (offset and count within the parameter), pointing at
 *   master    f32, in `masters`, for a piece whose compute copy is 16-bit
 *             under master weights; otherwise the compute copy itself (an
 *             f32 piece is its own master: fp32 keeps one copy, and without
 *             master weights the optimizer updates the 16-bit piece);
 *   grad      wherever the strategy keeps the reduced f32 gradient;
 *   state[k]  f32 [S] per unit and slot, the piece at its shard offset.
 * The slices of all ranks together hold every element once; with ddp's
 * world of one every slice is a whole parameter.
 */
#include "sharding_core.h"

#include <string.h>

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static const sh_param *param_of(const sh_core *c, int32_t unit, const sh_piece *pc) {
    return &c->params[c->units[unit].first_param + pc->param];
}

/* Rank r's pieces of unit u, in parameter order, appended at out + *n
 * (out NULL: only counted); returns the rank's packed bytes. */
static size_t rank_pieces(const sh_core *c, int32_t u, int32_t r, sh_piece *out, int32_t *n) {
    const sh_unit *un = &c->units[u];
    const int64_t lo = (int64_t)r * c->sd.units[u].shard, hi = lo + c->sd.units[u].shard;
    size_t at = 0;
    for (int32_t i = 0; i < un->num_params; i++) {
        const sh_param *p = &c->params[un->first_param + i];
        int64_t first = p->elem > lo ? p->elem : lo;
        int64_t end = p->elem + p->numel < hi ? p->elem + p->numel : hi;
        if (first >= end) continue;
        if (out) {
            sh_piece *pc = &out[*n];
            pc->rank = r;
            pc->param = i;
            pc->offset = first - p->elem;
            pc->count = end - first;
            pc->shard_elem = first - lo;
            pc->packed_at = at;
            pc->master_at = -1;
        }
        (*n)++;
        at = align_up(at + (size_t)(end - first) * vh_dtype_size(p->param_dtype), VH_UNIT_ALIGN);
    }
    return at;
}

/* Unit u's range of pieces (every rank's, rank-major, from *k on), its
 * packed size and place, its shard's place, and this rank's masters. */
static void place_unit(sh_core *c, int32_t u, int32_t *k, int64_t align) {
    sh_shards *sd = &c->sd;
    sh_shard_unit *su = &sd->units[u];
    su->first_piece = *k;
    size_t cmax = 0;
    for (int32_t r = 0; r < sd->world; r++) {
        const int32_t before = *k;
        size_t cr = rank_pieces(c, u, r, sd->pieces, k);
        if (r == sd->rank) su->own_first = before, su->own_count = *k - before;
        if (cr > cmax) cmax = cr;
    }
    su->num_pieces = *k - su->first_piece;
    su->packed_bytes = cmax;
    su->packed_at = sd->packed_bytes;
    sd->packed_bytes += cmax;
    su->shard_at = sd->numel;
    sd->numel += su->shard;
    sd->num_own += su->own_count;
    for (int32_t j = su->own_first; j < su->own_first + su->own_count; j++) {
        sh_piece *pc = &sd->pieces[j];
        if (c->policy.master_weights && param_of(c, u, pc)->param_dtype != VH_DTYPE_F32) {
            pc->master_at = c->masters_numel;
            c->masters_numel += (pc->count + align - 1) / align * align;
        }
    }
}

vh_status sh_shards_plan(sh_core *c, int32_t world, int32_t rank, int64_t align) {
    vh_host *host = c->host;
    sh_shards *sd = &c->sd;
    sd->world = world;
    sd->rank = rank;
    size_t unit_bytes = (size_t)c->num_units * sizeof *sd->units;
    sd->units = host->api->alloc(host, unit_bytes);
    if (!sd->units) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for shards");
    memset(sd->units, 0, unit_bytes);
    int64_t npieces = 0;
    for (int32_t u = 0; u < c->num_units; u++) {
        int64_t s = (c->units[u].numel + world - 1) / world;
        sd->units[u].shard = (s + align - 1) / align * align;
        for (int32_t r = 0; r < world; r++) {
            int32_t n = 0;
            (void)rank_pieces(c, u, r, NULL, &n);
            npieces += n;
        }
        if (npieces > INT32_MAX / 2)
            return host->api->fail(host, VH_STATUS_ERR_NOMEM, "too many pieces over %d ranks",
                                   (int)world);
    }
    size_t piece_bytes = (size_t)npieces * sizeof *sd->pieces;
    sd->pieces = host->api->alloc(host, piece_bytes ? piece_bytes : 1);
    if (!sd->pieces) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for pieces");
    memset(sd->pieces, 0, piece_bytes);
    sd->num_pieces = (int32_t)npieces;
    int32_t k = 0;
    for (int32_t u = 0; u < c->num_units; u++) place_unit(c, u, &k, align);
    return VH_STATUS_OK;
}

void sh_shards_release(sh_core *c) {
    c->host->api->free(c->host, c->sd.units);
    c->host->api->free(c->host, c->sd.pieces);
    memset(&c->sd, 0, sizeof c->sd);
}

void *sh_piece_master(const sh_core *c, int32_t unit, const sh_piece *pc) {
    return pc->master_at < 0 ? c->ops->piece_param(c, unit, pc)
                             : (void *)(c->masters + pc->master_at);
}

vh_dtype sh_piece_master_dtype(const sh_core *c, int32_t unit, const sh_piece *pc) {
    return pc->master_at < 0 ? param_of(c, unit, pc)->param_dtype : VH_DTYPE_F32;
}

void sh_shards_slices(sh_core *c) {
    int32_t s = 0;
    for (int32_t u = 0; u < c->num_units; u++) {
        const sh_shard_unit *su = &c->sd.units[u];
        for (int32_t j = su->own_first; j < su->own_first + su->own_count; j++, s++) {
            const sh_piece *pc = &c->sd.pieces[j];
            vh_param_slice *sl = &c->slices[s];
            sl->unit = u;
            sl->param = pc->param;
            sl->offset = pc->offset;
            sl->count = pc->count;
            sl->flags = c->table->units[u].params[pc->param].flags;
            sl->master = sh_piece_master(c, u, pc);
            sl->master_dtype = sh_piece_master_dtype(c, u, pc);
            vh_dtype grad_dtype = VH_DTYPE_F32;
            sl->grad = c->ops->piece_grad(c, u, pc, &grad_dtype);
            sl->grad_dtype = grad_dtype;
            for (int32_t k = 0; k < c->state_slots; k++)
                sl->state[k] = c->state[k] + su->shard_at + pc->shard_elem;
            sl->state_dtype = VH_DTYPE_F32;
            /* The optimizer writes a separate compute copy itself. */
            sl->compute = NULL;
            sl->compute_dtype = VH_DTYPE_F32;
            if (c->writes_compute && pc->master_at >= 0) {
                sl->compute = c->ops->piece_param(c, u, pc);
                sl->compute_dtype = param_of(c, u, pc)->param_dtype;
            }
        }
    }
}

vh_status sh_shards_load(sh_core *c, int32_t unit, const float *values, int compute) {
    const sh_shard_unit *su = &c->sd.units[unit];
    vh_status st = VH_STATUS_OK;
    for (int32_t j = su->own_first; st == VH_STATUS_OK && j < su->own_first + su->own_count;
         j++) {
        const sh_piece *pc = &c->sd.pieces[j];
        const sh_param *p = param_of(c, unit, pc);
        const float *src = values + p->elem + pc->offset;
        if (pc->master_at >= 0)
            st = sh_cast(c, c->masters + pc->master_at, VH_DTYPE_F32, src, VH_DTYPE_F32,
                         (size_t)pc->count);
        if (st == VH_STATUS_OK && compute)
            st = sh_cast(c, c->ops->piece_param(c, unit, pc), p->param_dtype, src, VH_DTYPE_F32,
                         (size_t)pc->count);
        if (st != VH_STATUS_OK)
            st = sh_fail_device(c, st, "load_unit: setting", unit, pc->param);
    }
    return st;
}

vh_status sh_shards_gather_masters(sh_core *c, int32_t unit, float **all) {
    const sh_shard_unit *su = &c->sd.units[unit];
    const size_t shard_bytes = (size_t)su->shard * sizeof(float);
    const int32_t w = c->sd.world;
    void *gathered = NULL, *mine = NULL;
    /* This rank's f32 [S] (zeros past the unit's end), then all of them. */
    vh_status st = sh_tmp_alloc(c, (size_t)w * shard_bytes, w == 1, &gathered, "f32 scratch");
    if (st == VH_STATUS_OK && w > 1) st = sh_tmp_alloc(c, shard_bytes, 1, &mine, "f32 scratch");
    float *dst = w > 1 ? mine : gathered;
    for (int32_t j = su->own_first; st == VH_STATUS_OK && j < su->own_first + su->own_count;
         j++) {
        const sh_piece *pc = &c->sd.pieces[j];
        st = sh_cast(c, dst + pc->shard_elem, VH_DTYPE_F32, sh_piece_master(c, unit, pc),
                     sh_piece_master_dtype(c, unit, pc), (size_t)pc->count);
        if (st != VH_STATUS_OK)
            st = sh_fail_device(c, st, "store_unit: reading", unit, pc->param);
    }
    if (st == VH_STATUS_OK && w > 1 &&
        (st = vh_comm_all_gather(c->comm, mine, gathered, (size_t)su->shard, VH_DTYPE_F32)) !=
            VH_STATUS_OK)
        st = sh_fail_comm(c, st, "store_unit: the f32 all-gather", unit);
    sh_tmp_free(c, &mine, shard_bytes);
    if (st != VH_STATUS_OK) sh_tmp_free(c, &gathered, (size_t)w * shard_bytes);
    *all = gathered;
    return st;
}

vh_status sh_shards_refresh_local(sh_core *c, int updated) {
    if (updated && c->writes_compute) return VH_STATUS_OK; /* the optimizer wrote them all */
    for (int32_t u = 0; u < c->num_units; u++) {
        const sh_shard_unit *su = &c->sd.units[u];
        for (int32_t j = su->own_first; j < su->own_first + su->own_count; j++) {
            const sh_piece *pc = &c->sd.pieces[j];
            if (pc->master_at < 0) continue; /* the compute copy is the master */
            const sh_param *p = param_of(c, u, pc);
            vh_status st = sh_cast(c, c->ops->piece_param(c, u, pc), p->param_dtype,
                                   c->masters + pc->master_at, VH_DTYPE_F32, (size_t)pc->count);
            if (st != VH_STATUS_OK)
                return sh_fail_device(c, st, "refresh: converting the masters of", u, pc->param);
        }
    }
    return VH_STATUS_OK;
}

vh_status sh_shards_pack(sh_core *c, int32_t unit, void *packed) {
    const sh_shard_unit *su = &c->sd.units[unit];
    for (int32_t j = su->own_first; j < su->own_first + su->own_count; j++) {
        const sh_piece *pc = &c->sd.pieces[j];
        const size_t bytes = (size_t)pc->count * vh_dtype_size(param_of(c, unit, pc)->param_dtype);
        vh_status st = c->dev->copy(c->dev->device, (char *)packed + pc->packed_at,
                                    c->ops->piece_param(c, unit, pc), bytes,
                                    VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
        if (st != VH_STATUS_OK)
            return sh_fail_device(c, st, "packing", unit, pc->param);
    }
    return VH_STATUS_OK;
}

/* Every rank's packed pieces of the unit (`staging`, as the all-gather
 * leaves them) into `full`, the unit's compute layout. */
static vh_status unpack(sh_core *c, int32_t unit, const void *staging, void *full) {
    const sh_shard_unit *su = &c->sd.units[unit];
    for (int32_t j = su->first_piece; j < su->first_piece + su->num_pieces; j++) {
        const sh_piece *pc = &c->sd.pieces[j];
        const sh_param *p = param_of(c, unit, pc);
        const size_t es = vh_dtype_size(p->param_dtype);
        vh_status st = c->dev->copy(
            c->dev->device, (char *)full + p->param_at + (size_t)pc->offset * es,
            (const char *)staging + (size_t)pc->rank * su->packed_bytes + pc->packed_at,
            (size_t)pc->count * es, VH_COPY_KIND_DEVICE_TO_DEVICE, NULL);
        if (st != VH_STATUS_OK)
            return sh_fail_device(c, st, "unpacking the gathered", unit, -1);
    }
    return VH_STATUS_OK;
}

static size_t staging_bytes(const sh_core *c, int32_t unit) {
    return (size_t)c->sd.world * c->sd.units[unit].packed_bytes;
}

vh_status sh_shards_gather_start(sh_core *c, int32_t unit, const void *mine, void **staging,
                                 vh_comm_request **req) {
    const size_t bytes = c->sd.units[unit].packed_bytes;
    *req = NULL;
    vh_status st = sh_tmp_alloc(c, staging_bytes(c, unit), 0, staging,
                                "the all-gather staging buffer");
    if (st != VH_STATUS_OK) return st;
    st = c->comm->ops->all_gather_start(c->comm, mine, *staging, bytes, VH_DTYPE_U8, NULL, req);
    if (st != VH_STATUS_OK) {
        *req = NULL;
        sh_tmp_free(c, staging, staging_bytes(c, unit));
        return sh_fail_comm(c, st, "starting the parameter all-gather", unit);
    }
    return VH_STATUS_OK;
}

vh_status sh_shards_gather_finish(sh_core *c, int32_t unit, void **staging, vh_comm_request *req,
                                  void *full) {
    vh_status st = c->comm->ops->wait(c->comm, req);
    if (st != VH_STATUS_OK) st = sh_fail_comm(c, st, "waiting for the parameter all-gather", unit);
    if (st == VH_STATUS_OK && full) st = unpack(c, unit, *staging, full);
    sh_tmp_free(c, staging, staging_bytes(c, unit));
    return st;
}
