/* loss_scaler.c - dynamic loss scaling and the overflow check (see
 * vh_loss_scaler.h). */
#include "vithost/vh_loss_scaler.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "vithost/vh_comm.h"
#include "vithost/vh_device.h"

/* ---- the scaler ------------------------------------------------------------ */

/* A bad config value: through config_fail when there is a host. */
#define CONFIG_FAIL(host, key, ...)                                                      \
    ((host) ? (host)->api->config_fail((host), (key), __VA_ARGS__) : VH_STATUS_ERR_CONFIG)

static double or_default(double v, double def) { return v == 0.0 ? def : v; }

vh_status vh_loss_scaler_init(vh_loss_scaler *s, const vh_loss_scaler_config *config,
                              vh_host *host) {
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    /* An older (smaller) config reads its missing members as zero: defaults. */
    vh_loss_scaler_config c;
    memset(&c, 0, sizeof c);
    if (config && !vh_struct_upgrade(&c, sizeof c, config))
        return host ? host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                      "loss scaler config with struct_size %u",
                                      (unsigned)config->struct_size)
                    : VH_STATUS_ERR_INVALID_ARG;
    const double init = or_default(c.init_scale, VH_LOSS_SCALER_DEFAULT_INIT_SCALE);
    const double growth = or_default(c.growth_factor, VH_LOSS_SCALER_DEFAULT_GROWTH_FACTOR);
    const double backoff = or_default(c.backoff_factor, VH_LOSS_SCALER_DEFAULT_BACKOFF_FACTOR);
    const int64_t interval =
        c.growth_interval == 0 ? VH_LOSS_SCALER_DEFAULT_GROWTH_INTERVAL : c.growth_interval;
    const double lo = or_default(c.min_scale, VH_LOSS_SCALER_DEFAULT_MIN_SCALE);
    const double hi = or_default(c.max_scale, VH_LOSS_SCALER_DEFAULT_MAX_SCALE);
    /* Written as !(good) so that NaN fails every check. */
    if (!(growth > 1.0 && growth <= FLT_MAX))
        return CONFIG_FAIL(host, "growth_factor", "%g: must be > 1 (and finite)", growth);
    if (!(backoff > 0.0 && backoff < 1.0))
        return CONFIG_FAIL(host, "backoff_factor", "%g: must be in (0, 1)", backoff);
    if (interval < 1)
        return CONFIG_FAIL(host, "growth_interval", "%lld: must be >= 1", (long long)interval);
    /* The scale and 1/scale must be normal floats: 2^-126 <= scale <= FLT_MAX. */
    if (!(lo >= FLT_MIN && lo <= FLT_MAX))
        return CONFIG_FAIL(host, "min_scale", "%g: must be in [2^-126, FLT_MAX]", lo);
    if (!(hi >= lo && hi <= FLT_MAX))
        return CONFIG_FAIL(host, "max_scale", "%g: must be in [min_scale %g, FLT_MAX]", hi, lo);
    if (c.fixed ? !(init >= FLT_MIN && init <= FLT_MAX) : !(init >= lo && init <= hi))
        return CONFIG_FAIL(host, "init_scale", "%g: must be in [%g, %g]%s", init,
                           c.fixed ? (double)FLT_MIN : lo, c.fixed ? (double)FLT_MAX : hi,
                           c.fixed ? "" : " (min_scale, max_scale)");
    memset(s, 0, sizeof *s);
    s->scale = (float)init;
    s->fixed = c.fixed != 0;
    s->growth_factor = growth;
    s->backoff_factor = backoff;
    s->min_scale = lo;
    s->max_scale = hi;
    s->growth_interval = interval;
    return VH_STATUS_OK;
}

/* PyTorch's _amp_update_scale_: back off on an overflow, grow after
 * growth_interval good steps in a row, each restarting the counter. The new
 * value is computed in double and rounded once; the bounds hold it. */
void vh_loss_scaler_update(vh_loss_scaler *s, int found_inf) {
    if (!s) return;
    s->steps++;
    if (found_inf) {
        s->skipped++;
        s->good_steps = 0;
        if (s->fixed) return;
        double next = (double)s->scale * s->backoff_factor;
        if (next < s->min_scale) next = s->min_scale;
        s->scale = (float)next;
        return;
    }
    s->good_steps++;
    if (s->fixed || s->good_steps < s->growth_interval) return;
    double next = (double)s->scale * s->growth_factor;
    if (next > s->max_scale) next = s->max_scale;
    /* GradScaler keeps the scale when growing would overflow the float. */
    if (isfinite((float)next)) s->scale = (float)next;
    s->good_steps = 0;
}

float vh_loss_scaler_scale(const vh_loss_scaler *s) { return s ? s->scale : 1.0f; }

float vh_loss_scaler_unscale_factor(const vh_loss_scaler *s) {
    return s ? (float)(1.0 / (double)s->scale) : 1.0f;
}

/* ---- state ----------------------------------------------------------------- */

#define STATE_MAGIC 0x43534c56u /* "VLSC" little-endian: vithost loss scaler */
#define STATE_VERSION 1u

/* Fixed layout, no padding (checked below), host byte order. */
typedef struct scaler_state {
    uint32_t magic, version;
    float scale;
    int32_t fixed;
    int64_t growth_interval, good_steps, skipped, steps;
    double growth_factor, backoff_factor, min_scale, max_scale;
} scaler_state;

_Static_assert(sizeof(scaler_state) == VH_LOSS_SCALER_STATE_BYTES,
               "the loss scaler's state has no padding");

vh_status vh_loss_scaler_state_save(const vh_loss_scaler *s, void *buf, size_t bytes,
                                    vh_host *host) {
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    if (!buf || bytes < sizeof(scaler_state))
        return host ? host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                      "loss scaler state buffer of %zu bytes, %zu needed",
                                      buf ? bytes : 0, sizeof(scaler_state))
                    : VH_STATUS_ERR_INVALID_ARG;
    scaler_state st;
    memset(&st, 0, sizeof st);
    st.magic = STATE_MAGIC;
    st.version = STATE_VERSION;
    st.scale = s->scale;
    st.fixed = s->fixed;
    st.growth_interval = s->growth_interval;
    st.good_steps = s->good_steps;
    st.skipped = s->skipped;
    st.steps = s->steps;
    st.growth_factor = s->growth_factor;
    st.backoff_factor = s->backoff_factor;
    st.min_scale = s->min_scale;
    st.max_scale = s->max_scale;
    memcpy(buf, &st, sizeof st);
    return VH_STATUS_OK;
}

#define FORMAT_FAIL(host, ...) \
    ((host) ? (host)->api->fail((host), VH_STATUS_ERR_FORMAT, __VA_ARGS__) : VH_STATUS_ERR_FORMAT)

static void log_changed(vh_host *host, const char *what, double saved, double now) {
    if (host && saved != now)
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "the checkpoint's loss scaler ran with %s %g; this run's recipe says %g, "
                       "which it continues with",
                       what, saved, now);
}

vh_status vh_loss_scaler_state_load(vh_loss_scaler *s, const void *buf, size_t bytes,
                                    vh_host *host) {
    if (!s) return VH_STATUS_ERR_INVALID_ARG;
    uint32_t magic = 0;
    if (buf && bytes >= sizeof magic) memcpy(&magic, buf, sizeof magic);
    if (!buf || bytes < sizeof magic || magic != STATE_MAGIC)
        return FORMAT_FAIL(host,
                           "not a loss scaler's state (%zu bytes, tag 0x%08x; a loss scaler "
                           "writes tag 0x%08x)",
                           buf ? bytes : 0, (unsigned)magic, (unsigned)STATE_MAGIC);
    scaler_state st;
    uint32_t version = 0;
    if (bytes >= 2 * sizeof(uint32_t)) memcpy(&version, (const char *)buf + 4, sizeof version);
    if (bytes >= 2 * sizeof(uint32_t) && version != STATE_VERSION)
        return FORMAT_FAIL(host, "loss scaler state version %u; this SDK reads version %u%s",
                           (unsigned)version, (unsigned)STATE_VERSION,
                           version > STATE_VERSION ? " (written by a newer SDK)" : "");
    if (bytes != sizeof st)
        return FORMAT_FAIL(host, "loss scaler state of %zu bytes, %zu expected: damaged", bytes,
                           sizeof st);
    memcpy(&st, buf, sizeof st);
    if (!(isfinite(st.scale) && st.scale > 0.0f) || st.good_steps < 0 || st.skipped < 0 ||
        st.steps < st.skipped || st.growth_interval < 1 || (st.fixed != 0 && st.fixed != 1))
        return FORMAT_FAIL(host,
                           "loss scaler state with scale %g, %lld good steps, %lld skipped of "
                           "%lld, growth interval %lld: damaged",
                           (double)st.scale, (long long)st.good_steps, (long long)st.skipped,
                           (long long)st.steps, (long long)st.growth_interval);
    /* Everything is checked: from here the load succeeds. */
    if (!s->fixed && !st.fixed) {
        log_changed(host, "growth_factor", st.growth_factor, s->growth_factor);
        log_changed(host, "backoff_factor", st.backoff_factor, s->backoff_factor);
        log_changed(host, "growth_interval", (double)st.growth_interval,
                    (double)s->growth_interval);
        log_changed(host, "min_scale", st.min_scale, s->min_scale);
        log_changed(host, "max_scale", st.max_scale, s->max_scale);
        double scale = st.scale;
        if (scale < s->min_scale) scale = s->min_scale;
        if (scale > s->max_scale) scale = s->max_scale;
        s->scale = (float)scale;
    } else if (host && st.fixed != s->fixed) {
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "the checkpoint's loss scale was %s (%g); this run's is %s: it starts "
                       "from %g",
                       st.fixed ? "fixed" : "dynamic", (double)st.scale,
                       s->fixed ? "fixed" : "dynamic", (double)s->scale);
    }
    s->good_steps = st.good_steps;
    s->skipped = st.skipped;
    s->steps = st.steps;
    return VH_STATUS_OK;
}

/* ---- the overflow check ------------------------------------------------------ */

struct vh_grad_check {
    vh_host *host;
    const vh_device_ops *dev;
    vh_comm *comm;
    /* Two f32 in device memory: [0] found_inf (all-reduced, MAX), [1] the
     * sum of squares (summed over shards). Collectives see device memory
     * only (NCCL wants device pointers). */
    float *flag;
    /* The multi-tensor list, host memory, `cap` entries; grown when a
     * longer slice list comes (a sharding plugin keeps one for the run). */
    void **tensors;
    int64_t *numels;
    vh_dtype *dtypes;
    int32_t cap;
};

static const char *dev_name(const vh_device_ops *dev) {
    return dev && dev->name ? dev->name : "the device";
}

vh_status vh_grad_check_create(vh_host *host, vh_grad_check **out) {
    if (!host || !out) return VH_STATUS_ERR_INVALID_ARG;
    *out = NULL;
    const vh_device_ops *dev = host->api->device(host);
    if (!dev) return host->api->fail(host, VH_STATUS_ERR_INTERNAL, "the host gave no device");
    vh_comm *comm = host->api->comm(host);
    if (!comm || !comm->ops || !comm->ops->all_reduce_start || !comm->ops->wait)
        return host->api->fail(host, VH_STATUS_ERR_INTERNAL,
                               "the host gave no communicator with all_reduce_start and wait");
    /* An older device table may end before the multi-tensor op. */
    if (!dev->alloc || !dev->free || !dev->copy || !dev->memset_zero ||
        !VH_STRUCT_HAS(dev, vh_device_ops, multi_tensor_scale_check) ||
        !dev->multi_tensor_scale_check)
        return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                               "device %s lacks alloc, free, copy, memset_zero or "
                               "multi_tensor_scale_check, which the overflow check needs",
                               dev_name(dev));
    vh_grad_check *c = host->api->alloc(host, sizeof *c);
    if (!c) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(c, 0, sizeof *c);
    c->host = host;
    c->dev = dev;
    c->comm = comm;
    void *flag = NULL;
    vh_status st = dev->alloc(dev->device, 2 * sizeof(float), &flag);
    if (st != VH_STATUS_OK || !flag) {
        host->api->free(host, c);
        return host->api->fail(host, st != VH_STATUS_OK ? st : VH_STATUS_ERR_NOMEM,
                               "allocating the overflow flag on %s failed", dev_name(dev));
    }
    c->flag = flag;
    *out = c;
    return VH_STATUS_OK;
}

void vh_grad_check_free(vh_grad_check *c) {
    if (!c) return;
    vh_host *host = c->host;
    if (c->flag) c->dev->free(c->dev->device, c->flag);
    host->api->free(host, c->tensors);
    host->api->free(host, c->numels);
    host->api->free(host, c->dtypes);
    host->api->free(host, c);
}

/* Makes the multi-tensor list hold at least n entries. */
static vh_status reserve_list(vh_grad_check *c, int32_t n) {
    if (n <= c->cap) return VH_STATUS_OK;
    vh_host *host = c->host;
    void **t = host->api->alloc(host, (size_t)n * sizeof *t);
    int64_t *k = host->api->alloc(host, (size_t)n * sizeof *k);
    vh_dtype *d = host->api->alloc(host, (size_t)n * sizeof *d);
    if (!t || !k || !d) {
        host->api->free(host, t);
        host->api->free(host, k);
        host->api->free(host, d);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory for a list of %d grads",
                               (int)n);
    }
    host->api->free(host, c->tensors);
    host->api->free(host, c->numels);
    host->api->free(host, c->dtypes);
    c->tensors = t;
    c->numels = k;
    c->dtypes = d;
    c->cap = n;
    return VH_STATUS_OK;
}

/* The local pass: flag[0] = 1 on any Inf/NaN, flag[1] = sum of squares. */
static vh_status local_pass(vh_grad_check *c, const vh_param_slices *grads, float scale) {
    vh_host *host = c->host;
    const vh_device_ops *dev = c->dev;
    vh_status st = reserve_list(c, grads->count);
    if (st != VH_STATUS_OK) return st;
    int32_t n = 0;
    for (int32_t s = 0; s < grads->count; s++) {
        const vh_param_slice *sl = vh_param_slices_at(grads, s);
        if (sl->count < 0 || (sl->count > 0 && !sl->grad))
            return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                                   "slice %d (unit %d, param %d) has %s", (int)s, (int)sl->unit,
                                   (int)sl->param, sl->count < 0 ? "a negative count" : "no grad");
        if (sl->count == 0) continue;
        if (!vh_dtype_is_float(sl->grad_dtype))
            return host->api->fail(host, VH_STATUS_ERR_UNSUPPORTED,
                                   "slice %d (unit %d, param %d) has %s grads; the overflow "
                                   "check reads f32, bf16 or f16",
                                   (int)s, (int)sl->unit, (int)sl->param,
                                   vh_dtype_name(sl->grad_dtype));
        c->tensors[n] = sl->grad;
        c->numels[n] = sl->count;
        c->dtypes[n] = sl->grad_dtype;
        n++;
    }
    st = dev->memset_zero(dev->device, c->flag, 2 * sizeof(float), NULL);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "zeroing the overflow flag on %s failed", dev_name(dev));
    if (n == 0) return VH_STATUS_OK;
    vh_multi_tensor_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.count = n;
    a.tensors = c->tensors;
    a.numels = c->numels;
    a.dtypes = c->dtypes;
    a.scale = scale;
    a.found_inf = c->flag;
    a.sum_sq = c->flag + 1;
    st = dev->multi_tensor_scale_check(dev->device, &a);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st,
                               "unscaling and checking %d grad tensors for Inf/NaN on %s failed",
                               (int)n, dev_name(dev));
    return VH_STATUS_OK;
}

vh_status vh_grad_check_run(vh_grad_check *c, const vh_param_slices *grads, float scale,
                            int *found_inf, double *sum_sq) {
    if (!c) return VH_STATUS_ERR_INVALID_ARG;
    vh_host *host = c->host;
    char why[160];
    if (!found_inf || vh_param_slices_check(grads, why, sizeof why) != VH_STATUS_OK)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "unscale_and_check: %s",
                               found_inf ? why : "found_inf is NULL");
    if (!(isfinite(scale) && scale > 0.0f))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG,
                               "unscale_and_check: unscale factor %g", (double)scale);
    *found_inf = 0;
    if (sum_sq) *sum_sq = 0.0;
    vh_status st = local_pass(c, grads, scale);
    if (st != VH_STATUS_OK) return st;

    /* Every rank takes part, whatever it found: ONE collective, a SUM over
     * [flag, sum of squares] (any rank's 1 makes the sum non-zero). Shards
     * hold every element once over all ranks, so their sums of squares add
     * up; replicas hold the same sum already, so only the flag travels. The
     * sharding plugin sets `replicated` alike on every rank, so the counts
     * match. One process sends nothing: its step's only collectives are its
     * gradients'. */
    vh_comm *comm = c->comm;
    if (comm->world_size > 1) {
        size_t n = grads->replicated ? 1 : 2;
        st = vh_comm_all_reduce(comm, c->flag, n, VH_DTYPE_F32, VH_REDUCE_OP_SUM);
        if (st != VH_STATUS_OK)
            return host->api->fail(host, st,
                                   "all-reduce of the overflow flag%s over %d ranks failed",
                                   n == 2 ? " and the gradients' sum of squares" : "",
                                   (int)comm->world_size);
    }
    const vh_device_ops *dev = c->dev;
    float back[2] = {0.0f, 0.0f};
    st = dev->copy(dev->device, back, c->flag, sizeof back, VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (st != VH_STATUS_OK)
        return host->api->fail(host, st, "copying the overflow flag from %s failed",
                               dev_name(dev));
    *found_inf = !(back[0] == 0.0f);
    if (sum_sq) *sum_sq = (double)back[1];
    return VH_STATUS_OK;
}
