/* session.c - creating the five plugins in dependency order, the unit hooks
 * around the sharding plugin, batches to the device, and the one message a
 * failed plugin call becomes. The host names roles, never implementations.
 */
#define _POSIX_C_SOURCE 200809L
#include "session.h"
#include "vtables.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void session_trace(const vh_session *s, const char *fmt, ...) {
    if (!s->trace) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("trace: ", s->out);
    vfprintf(s->out, fmt, ap);
    fputc('\n', s->out);
    va_end(ap);
}

vh_status session_plugin_error(vh_session *s, vh_role role, vh_status st, const char *call,
                               vh_diag *d) {
    const vh_host_impl *h = &s->run->hosts[role];
    const vh_plugin *p = &s->run->plugins[role];
    return diag_set(d, st, "%s plugin '%s' failed in %s (%s): %s", vh_role_name(role),
                    p->desc->name, call, vh_status_str(st),
                    h->error[0] ? h->error : "it gave no message");
}

#define CALL(s, role, call, expr)                                                   \
    do {                                                                            \
        session_trace((s), "%s", (call));                                           \
        vh_status st_ = (expr);                                                     \
        if (st_ != VH_STATUS_OK) return session_plugin_error((s), (role), st_, (call), d); \
    } while (0)

/* ---- the unit hooks the model calls --------------------------------------
 * Without --trace the model calls the sharding plugin's own functions with
 * its instance as ctx: a unit hook costs one indirect call, no host round
 * trip (the signatures are the same by design). With --trace each goes
 * through one of these trampolines, which print the call first. */

static vh_status hook_gather(void *ctx, int32_t unit, const void **params) {
    vh_session *s = ctx;
    session_trace(s, "sharding.gather unit=%d", (int)unit);
    return s->sharding->gather(s->self[VH_ROLE_SHARDING], unit, params);
}

static vh_status hook_release(void *ctx, int32_t unit) {
    vh_session *s = ctx;
    session_trace(s, "sharding.release unit=%d", (int)unit);
    return s->sharding->release(s->self[VH_ROLE_SHARDING], unit);
}

static vh_status hook_grads(void *ctx, int32_t unit, void **grads) {
    vh_session *s = ctx;
    session_trace(s, "sharding.grads unit=%d", (int)unit);
    return s->sharding->grads(s->self[VH_ROLE_SHARDING], unit, grads);
}

static vh_status hook_reduce(void *ctx, int32_t unit) {
    vh_session *s = ctx;
    session_trace(s, "sharding.reduce unit=%d", (int)unit);
    return s->sharding->reduce(s->self[VH_ROLE_SHARDING], unit);
}

static void set_hooks(vh_session *s) {
    if (s->trace) {
        s->hooks = (vh_unit_hooks){.struct_size = sizeof(vh_unit_hooks), .ctx = s,
                                   .gather = hook_gather, .release = hook_release,
                                   .grads = hook_grads, .reduce = hook_reduce};
        return;
    }
    s->hooks = (vh_unit_hooks){.struct_size = sizeof(vh_unit_hooks),
                               .ctx = s->self[VH_ROLE_SHARDING],
                               .gather = s->sharding->gather, .release = s->sharding->release,
                               .grads = s->sharding->grads, .reduce = s->sharding->reduce};
}

/* ---- creating the plugins -------------------------------------------------- */

/* The run's steps (run.steps, else epochs of the data's steps per epoch) and,
 * for an optimizer that takes the shared keys, the schedule they give. */
static vh_status read_schedule(vh_session *s, int64_t *total, vh_diag *d) {
    vh_run *run = s->run;
    /* (optimizer steps: grad_accum micro-batches each) */
    int64_t steps_per_epoch =
        s->info.train_size / run->comm.world_size / s->batch_size / s->grad_accum;
    *total = run_config_int(run, "steps");
    if (*total == 0) *total = steps_per_epoch * run_config_int(run, "epochs");
    s->has_schedule = config_shared_keys(run->plugins[VH_ROLE_OPTIM].desc) != NULL;
    if (!s->has_schedule) return VH_STATUS_OK;
    vh_host *h = &run->hosts[VH_ROLE_OPTIM].pub;
    s->schedule.struct_size = sizeof s->schedule;
    vh_status st = vh_optim_schedule_read(h, *total, &s->schedule);
    if (st != VH_STATUS_OK)
        return diag_set(d, st, "%s", run->hosts[VH_ROLE_OPTIM].error);
    vh_optim_schedule_warn(h, &s->schedule);
    return VH_STATUS_OK;
}

static vh_status create_plugins(vh_session *s, vh_diag *d) {
    vh_run *run = s->run;
    vh_host *h[VH_HOST_ROLE_COUNT];
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) h[r] = &run->hosts[r].pub;

    vh_data_setup ds = {.struct_size = sizeof ds,
                        .rank = run->comm.rank,
                        .world_size = run->comm.world_size,
                        .batch_size = s->batch_size,
                        .seed = (uint64_t)run_config_int(run, "seed")};
    CALL(s, VH_ROLE_DATA, "data.create",
         s->data->create(h[VH_ROLE_DATA], &ds, &s->self[VH_ROLE_DATA]));
    s->info.struct_size = sizeof s->info;
    CALL(s, VH_ROLE_DATA, "data.info", s->data->info(s->self[VH_ROLE_DATA], &s->info));

    CALL(s, VH_ROLE_PRECISION, "precision.create",
         s->precision->create(h[VH_ROLE_PRECISION], &s->self[VH_ROLE_PRECISION]));
    s->policy.struct_size = sizeof s->policy;
    CALL(s, VH_ROLE_PRECISION, "precision.policy",
         s->precision->policy(s->self[VH_ROLE_PRECISION], &s->policy));

    vh_model_setup ms = {.struct_size = sizeof ms,
                         .channels = s->info.channels,
                         .height = s->info.height,
                         .width = s->info.width,
                         .num_classes = s->info.num_classes,
                         .max_batch = s->batch_size,
                         .policy = &s->policy,
                         .rank = run->comm.rank,
                         .world_size = run->comm.world_size};
    CALL(s, VH_ROLE_MODEL, "model.create",
         s->model->create(h[VH_ROLE_MODEL], &ms, &s->self[VH_ROLE_MODEL]));
    s->table = s->model->param_table(s->self[VH_ROLE_MODEL]);
    if (!s->table || s->table->num_units < 1)
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "model plugin '%s' declared no parameter units",
                        run->plugins[VH_ROLE_MODEL].desc->name);

    int64_t total = 0;
    vh_status st = read_schedule(s, &total, d);
    if (st != VH_STATUS_OK) return st;
    /* policy and table were set above, and live until session_close */
    vh_optim_setup os = {.struct_size = sizeof os, .total_steps = total,
                         .policy = &s->policy, .table = s->table};
    CALL(s, VH_ROLE_OPTIM, "optim.create",
         s->optim->create(h[VH_ROLE_OPTIM], &os, &s->self[VH_ROLE_OPTIM]));
    int32_t slots = s->optim->state_slots(s->self[VH_ROLE_OPTIM]);
    s->state_slots = slots;
    if (slots < 0 || slots > VH_OPTIM_MAX_STATE_SLOTS)
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "optim plugin '%s' asks for %d state slots (0..%d)",
                        run->plugins[VH_ROLE_OPTIM].desc->name, (int)slots,
                        VH_OPTIM_MAX_STATE_SLOTS);

    CALL(s, VH_ROLE_SHARDING, "sharding.create",
         s->sharding->create(h[VH_ROLE_SHARDING], &s->self[VH_ROLE_SHARDING]));
    /* What the optimizer reads besides f32 slices (ABI 2.9), for the
     * sharding plugin to use or not. */
    s->optim_caps = s->optim->caps ? s->optim->caps(s->self[VH_ROLE_OPTIM]) : 0;
    vh_sharding_setup ss = {.struct_size = sizeof ss, .table = s->table, .policy = &s->policy,
                            .state_slots = slots, .optim_caps = s->optim_caps};
    CALL(s, VH_ROLE_SHARDING, "sharding.setup",
         s->sharding->setup(s->self[VH_ROLE_SHARDING], &ss));
    s->slices.items = NULL;
    s->slices.count = 0;
    CALL(s, VH_ROLE_SHARDING, "sharding.slices",
         s->sharding->slices(s->self[VH_ROLE_SHARDING], &s->slices));
    char why[160];
    if (vh_param_slices_check(&s->slices, why, sizeof why) != VH_STATUS_OK)
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "sharding plugin '%s' returned a malformed slice list: %s",
                        run->plugins[VH_ROLE_SHARDING].desc->name, why);
    return VH_STATUS_OK;
}

static vh_status allocate_buffers(vh_session *s, vh_diag *d) {
    const vh_device_ops *dev = s->run->device;
    size_t images = (size_t)s->batch_size * (size_t)s->info.channels *
                    (size_t)s->info.height * (size_t)s->info.width * sizeof(float);
    s->host_logits =
        malloc((size_t)s->batch_size * (size_t)s->info.num_classes * sizeof(float));
    if (!s->host_logits) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for logits");
    if (dev->kind == VH_DEVICE_KIND_CPU) return VH_STATUS_OK;
    vh_status st = dev->alloc(dev->device, images, &s->dev_images);
    if (st == VH_STATUS_OK)
        st = dev->alloc(dev->device, VH_SESSION_SCALARS * sizeof(double), &s->dev_scalars);
    if (st == VH_STATUS_OK)
        st = dev->alloc(dev->device, (size_t)s->batch_size * sizeof(int32_t), &s->dev_labels);
    if (st != VH_STATUS_OK)
        return diag_set(d, st, "allocating the batch on %s failed", dev->name);
    return VH_STATUS_OK;
}

vh_status session_open(vh_session *s, vh_run *run, vh_diag *d) {
    memset(s, 0, sizeof *s);
    s->run = run;
    s->out = run->opts.out;
    s->trace = run->opts.trace;
    s->model = run->plugins[VH_ROLE_MODEL].desc->vtable;
    s->precision = run->plugins[VH_ROLE_PRECISION].desc->vtable;
    s->sharding = run->plugins[VH_ROLE_SHARDING].desc->vtable;
    s->optim = run->plugins[VH_ROLE_OPTIM].desc->vtable;
    s->data = run->plugins[VH_ROLE_DATA].desc->vtable;
    s->batch_size = run_config_int(run, "batch_size");
    s->grad_accum = run_config_int(run, "grad_accum");
    if (s->grad_accum < 1) s->grad_accum = 1;
    /* Without set_sync (ABI 2.0/2.1) every micro-batch's backward would
     * reduce across ranks, and fsdp would drop all but the last one's. */
    if (s->grad_accum > 1 && !s->sharding->set_sync)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: run.grad_accum is %lld, but sharding plugin '%s' (ABI %u.%u) has no "
                        "set_sync (ABI 2.2), which gradient accumulation needs; set "
                        "run.grad_accum: 1 or use a sharding plugin of ABI 2.2 (ddp, fsdp, zero1)",
                        run->recipe.file, (long long)s->grad_accum,
                        run->plugins[VH_ROLE_SHARDING].desc->name,
                        (unsigned)run->plugins[VH_ROLE_SHARDING].desc->abi_major,
                        (unsigned)run->plugins[VH_ROLE_SHARDING].desc->abi_minor);
    vh_status st = run_open_backends(run, d);
    if (st == VH_STATUS_OK) st = create_plugins(s, d);
    if (st == VH_STATUS_OK) set_hooks(s);
    if (st == VH_STATUS_OK) st = allocate_buffers(s, d);
    return st;
}

void session_close(vh_session *s) {
    if (!s->run) return;
    /* Reverse order of creation: sharding holds buffers sized by the model. */
    if (s->self[VH_ROLE_SHARDING]) s->sharding->destroy(s->self[VH_ROLE_SHARDING]);
    if (s->self[VH_ROLE_OPTIM]) s->optim->destroy(s->self[VH_ROLE_OPTIM]);
    if (s->self[VH_ROLE_MODEL]) s->model->destroy(s->self[VH_ROLE_MODEL]);
    if (s->self[VH_ROLE_PRECISION]) s->precision->destroy(s->self[VH_ROLE_PRECISION]);
    if (s->self[VH_ROLE_DATA]) s->data->destroy(s->self[VH_ROLE_DATA]);
    const vh_device_ops *dev = s->run->device;
    if (s->dev_images) dev->free(dev->device, s->dev_images);
    if (s->dev_labels) dev->free(dev->device, s->dev_labels);
    if (s->dev_scalars) dev->free(dev->device, s->dev_scalars);
    free(s->host_logits);
    metrics_close(&s->metrics);
    memset(s, 0, sizeof *s);
}

/* ---- batches --------------------------------------------------------------- */

/* Batches come in host memory; a non-CPU device gets its own copy. */
static vh_status batch_to_device(vh_session *s, const vh_batch *in, vh_batch *out,
                                 vh_diag *d) {
    *out = *in;
    const vh_device_ops *dev = s->run->device;
    if (dev->kind == VH_DEVICE_KIND_CPU) return VH_STATUS_OK;
    size_t img_bytes = (size_t)vh_tensor_numel(&in->images) * sizeof(float);
    size_t lbl_bytes = (size_t)in->size * sizeof(int32_t);
    vh_status st = dev->copy(dev->device, s->dev_images, in->images.data, img_bytes,
                             VH_COPY_KIND_HOST_TO_DEVICE, NULL);
    if (st == VH_STATUS_OK)
        st = dev->copy(dev->device, s->dev_labels, in->labels.data, lbl_bytes,
                       VH_COPY_KIND_HOST_TO_DEVICE, NULL);
    /* From pinned memory (the prefetcher's slots on a GPU) a copy is
     * asynchronous; the data plugin may refill the buffer once it is asked
     * for the next batch, so the copy ends here, as one from pageable memory
     * does by itself. */
    if (st == VH_STATUS_OK && dev->stream_synchronize)
        st = dev->stream_synchronize(dev->device, NULL);
    if (st != VH_STATUS_OK) return diag_set(d, st, "copying a batch to %s failed", dev->name);
    out->images.data = s->dev_images;
    out->images.device = dev->kind;
    out->labels.data = s->dev_labels;
    out->labels.device = dev->kind;
    return VH_STATUS_OK;
}

static vh_status check_batch(vh_session *s, const vh_batch *b, vh_diag *d) {
    const vh_data_info *i = &s->info;
    int ok = b->size > 0 && b->size <= s->batch_size && b->images.ndim == 4 &&
             b->images.dtype == VH_DTYPE_F32 && b->images.shape[0] == b->size &&
             b->images.shape[1] == i->channels && b->images.shape[2] == i->height &&
             b->images.shape[3] == i->width && b->labels.dtype == VH_DTYPE_I32 &&
             b->labels.ndim == 1 && b->labels.shape[0] == b->size;
    if (!ok)
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "data plugin '%s' returned a batch of %lld images that does not match "
                        "its info (%d x %d x %d, batch size %lld)",
                        s->run->plugins[VH_ROLE_DATA].desc->name, (long long)b->size,
                        (int)i->channels, (int)i->height, (int)i->width,
                        (long long)s->batch_size);
    return VH_STATUS_OK;
}

vh_status session_next_batch(vh_session *s, vh_batch *host_batch, vh_batch *batch, int *has,
                             vh_diag *d) {
    session_trace(s, "data.next");
    vh_status st = s->data->next(s->self[VH_ROLE_DATA], host_batch, has);
    if (st != VH_STATUS_OK) return session_plugin_error(s, VH_ROLE_DATA, st, "data.next", d);
    if (!*has) return VH_STATUS_OK;
    st = check_batch(s, host_batch, d);
    if (st == VH_STATUS_OK) st = batch_to_device(s, host_batch, batch, d);
    return st;
}

vh_status session_read_loss(vh_session *s, const float *dev_loss, float *out, vh_diag *d) {
    *out = NAN;
    if (!dev_loss)
        return diag_set(d, VH_STATUS_ERR_INTERNAL, "model plugin '%s' returned no loss",
                        s->run->plugins[VH_ROLE_MODEL].desc->name);
    const vh_device_ops *dev = s->run->device;
    vh_status st = dev->copy(dev->device, out, dev_loss, sizeof *out,
                             VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (st != VH_STATUS_OK) return diag_set(d, st, "copying the loss from %s failed", dev->name);
    return VH_STATUS_OK;
}

vh_status session_reduce_scalars(vh_session *s, double *values, int n, vh_reduce_op op,
                                 vh_diag *d) {
    vh_comm *c = &s->run->comm;
    if (c->world_size <= 1) return VH_STATUS_OK;
    if (n < 1 || n > VH_SESSION_SCALARS)
        return diag_set(d, VH_STATUS_ERR_INTERNAL, "session_reduce_scalars: %d values", n);
    const vh_device_ops *dev = s->run->device;
    void *buf = dev->kind == VH_DEVICE_KIND_CPU ? (void *)values : s->dev_scalars;
    size_t bytes = (size_t)n * sizeof(double);
    vh_status st = VH_STATUS_OK;
    if (buf != values)
        st = dev->copy(dev->device, buf, values, bytes, VH_COPY_KIND_HOST_TO_DEVICE, NULL);
    if (st == VH_STATUS_OK) st = vh_comm_all_reduce(c, buf, (size_t)n, VH_DTYPE_F64, op);
    if (st == VH_STATUS_OK && buf != values)
        st = dev->copy(dev->device, values, buf, bytes, VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (st != VH_STATUS_OK)
        return diag_set(d, st, "a collective of the host over %d ranks (%s) failed",
                        (int)c->world_size, c->backend ? c->backend : "?");
    return VH_STATUS_OK;
}

void session_optim_args(const vh_session *s, vh_optim_step_args *args) {
    /* Without shared keys (an optimizer of ABI 2.0 has none and only step)
     * the members stay zero. */
    if (s->has_schedule) vh_optim_schedule_args(&s->schedule, args->step, args);
}

int session_batch_not_finite(const vh_batch *b) {
    if (!b || !b->images.data || b->images.dtype != VH_DTYPE_F32) return 0;
    const uint32_t *bits = b->images.data;
    int64_t n = vh_tensor_numel(&b->images);
    for (int64_t i = 0; i < n; i++)
        if ((bits[i] & 0x7f800000u) == 0x7f800000u) return 1;
    return 0;
}
