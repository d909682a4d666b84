/* trainer.c - creating the five plugins in dependency order, initialising
 * parameters, one training step in DESIGN.md's order, and evaluation.
 *
 *   data.next -> batch to device
 *   sharding.zero_grads
 *   model.forward        (per unit: sharding.gather ... sharding.release)
 *   precision.loss_scale
 *   model.backward       (per unit, reversed: gather, grads, reduce, release)
 *   sharding.wait
 *   precision.unscale_and_check (found-inf agreed across ranks)
 *   optim.step on the local slices (skipped on overflow), sharding.refresh
 *   precision.update
 *
 * The host names roles, never implementations.
 */
#define _POSIX_C_SOURCE 200809L
#include "trainer.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char vh_step_order[] =
    "data.next, sharding.zero_grads, model.forward (sharding.gather/release per unit), "
    "precision.loss_scale, model.backward (sharding.gather/grads/reduce/release per unit, "
    "reversed), sharding.wait, precision.unscale_and_check, optim.step (skipped on "
    "overflow), sharding.refresh, precision.update";

static void trace(const vh_trainer *t, const char *fmt, ...) VH_PRINTF_LIKE(2, 3);
static void trace(const vh_trainer *t, const char *fmt, ...) {
    if (!t->trace) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("trace: ", t->out);
    vfprintf(t->out, fmt, ap);
    fputc('\n', t->out);
    va_end(ap);
}

/* A failed plugin call becomes one message naming the role, the plugin, the
 * call and the plugin's own words. */
vh_status trainer_plugin_error(vh_trainer *t, vh_role role, vh_status st, const char *call,
                              vh_diag *d) {
    const vh_host_impl *h = &t->run->hosts[role];
    const vh_plugin *p = &t->run->plugins[role];
    return diag_set(d, st, "%s plugin '%s' failed in %s (%s): %s", vh_role_name(role),
                    p->desc->name, call, vh_status_str(st),
                    h->error[0] ? h->error : "it gave no message");
}

#define CALL(t, role, call, expr)                                                    \
    do {                                                                             \
        trace((t), "%s", (call));                                                    \
        vh_status st_ = (expr);                                                      \
        if (st_ != VH_STATUS_OK) return trainer_plugin_error((t), (role), st_, (call), d);   \
    } while (0)

/* The unit hooks the model calls: the sharding plugin's, traced. */
static vh_status hook_gather(void *ctx, int32_t unit, const void **params) {
    vh_trainer *t = ctx;
    trace(t, "sharding.gather unit=%d", (int)unit);
    return t->sharding->gather(t->self[VH_ROLE_SHARDING], unit, params);
}

static vh_status hook_release(void *ctx, int32_t unit) {
    vh_trainer *t = ctx;
    trace(t, "sharding.release unit=%d", (int)unit);
    return t->sharding->release(t->self[VH_ROLE_SHARDING], unit);
}

static vh_status hook_grads(void *ctx, int32_t unit, void **grads) {
    vh_trainer *t = ctx;
    trace(t, "sharding.grads unit=%d", (int)unit);
    return t->sharding->grads(t->self[VH_ROLE_SHARDING], unit, grads);
}

static vh_status hook_reduce(void *ctx, int32_t unit) {
    vh_trainer *t = ctx;
    trace(t, "sharding.reduce unit=%d", (int)unit);
    return t->sharding->reduce(t->self[VH_ROLE_SHARDING], unit);
}

static vh_status create_plugins(vh_trainer *t, vh_diag *d) {
    vh_run *run = t->run;
    vh_host *h[VH_ROLE_COUNT];
    for (int r = 0; r < VH_ROLE_COUNT; r++) h[r] = &run->hosts[r].pub;

    vh_data_setup ds = {.struct_size = sizeof ds,
                        .rank = run->comm.rank,
                        .world_size = run->comm.world_size,
                        .batch_size = t->batch_size,
                        .seed = (uint64_t)run_config_int(run, "seed")};
    CALL(t, VH_ROLE_DATA, "data.create", t->data->create(h[VH_ROLE_DATA], &ds, &t->self[VH_ROLE_DATA]));
    t->info.struct_size = sizeof t->info;
    CALL(t, VH_ROLE_DATA, "data.info", t->data->info(t->self[VH_ROLE_DATA], &t->info));

    CALL(t, VH_ROLE_PRECISION, "precision.create",
         t->precision->create(h[VH_ROLE_PRECISION], &t->self[VH_ROLE_PRECISION]));
    t->policy.struct_size = sizeof t->policy;
    CALL(t, VH_ROLE_PRECISION, "precision.policy",
         t->precision->policy(t->self[VH_ROLE_PRECISION], &t->policy));

    vh_model_setup ms = {.struct_size = sizeof ms,
                         .channels = t->info.channels,
                         .height = t->info.height,
                         .width = t->info.width,
                         .num_classes = t->info.num_classes,
                         .max_batch = t->batch_size,
                         .policy = t->policy};
    CALL(t, VH_ROLE_MODEL, "model.create", t->model->create(h[VH_ROLE_MODEL], &ms, &t->self[VH_ROLE_MODEL]));
    t->table = t->model->param_table(t->self[VH_ROLE_MODEL]);
    if (!t->table || t->table->num_units < 1)
        return diag_set(d, VH_STATUS_ERR_INTERNAL, "model plugin '%s' declared no parameter units",
                        run->plugins[VH_ROLE_MODEL].desc->name);

    int64_t steps_per_epoch = t->info.train_size / run->comm.world_size / t->batch_size;
    int64_t total = run_config_int(run, "steps");
    if (total == 0) total = steps_per_epoch * run_config_int(run, "epochs");
    vh_optim_setup os = {.struct_size = sizeof os, .total_steps = total};
    CALL(t, VH_ROLE_OPTIM, "optim.create", t->optim->create(h[VH_ROLE_OPTIM], &os, &t->self[VH_ROLE_OPTIM]));
    int32_t slots = t->optim->state_slots(t->self[VH_ROLE_OPTIM]);
    t->state_slots = slots;
    if (slots < 0 || slots > VH_OPTIM_MAX_STATE_SLOTS)
        return diag_set(d, VH_STATUS_ERR_INTERNAL, "optim plugin '%s' asks for %d state slots (0..%d)",
                        run->plugins[VH_ROLE_OPTIM].desc->name, (int)slots, VH_OPTIM_MAX_STATE_SLOTS);

    CALL(t, VH_ROLE_SHARDING, "sharding.create",
         t->sharding->create(h[VH_ROLE_SHARDING], &t->self[VH_ROLE_SHARDING]));
    vh_sharding_setup ss = {.struct_size = sizeof ss, .table = t->table, .policy = t->policy,
                            .state_slots = slots};
    CALL(t, VH_ROLE_SHARDING, "sharding.setup", t->sharding->setup(t->self[VH_ROLE_SHARDING], &ss));
    t->slices.items = NULL;
    t->slices.count = 0;
    CALL(t, VH_ROLE_SHARDING, "sharding.slices",
         t->sharding->slices(t->self[VH_ROLE_SHARDING], &t->slices));
    if (t->slices.count < 0 || (t->slices.count > 0 && !t->slices.items) ||
        (t->slices.count > 0 && t->slices.item_size < sizeof(vh_param_slice)))
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "sharding plugin '%s' returned a malformed slice list (count %d, "
                        "item_size %u)",
                        run->plugins[VH_ROLE_SHARDING].desc->name, (int)t->slices.count,
                        (unsigned)t->slices.item_size);
    return VH_STATUS_OK;
}

/* Every rank draws the same initial values from the run's seed; the
 * sharding plugin keeps the part it owns. */
static vh_status init_params(vh_trainer *t, vh_diag *d) {
    uint64_t seed = (uint64_t)run_config_int(t->run, "seed");
    for (int32_t u = 0; u < t->table->num_units; u++) {
        size_t n = (size_t)t->table->units[u].numel;
        float *values = malloc((n ? n : 1) * sizeof *values);
        if (!values) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory initialising unit %d", (int)u);
        char call[64];
        snprintf(call, sizeof call, "model.init_unit unit=%d", (int)u);
        trace(t, "%s", call);
        vh_status st = t->model->init_unit(t->self[VH_ROLE_MODEL], u, values, seed);
        if (st == VH_STATUS_OK) {
            snprintf(call, sizeof call, "sharding.load_unit unit=%d", (int)u);
            trace(t, "%s", call);
            st = t->sharding->load_unit(t->self[VH_ROLE_SHARDING], u, values);
            free(values);
            if (st != VH_STATUS_OK) return trainer_plugin_error(t, VH_ROLE_SHARDING, st, call, d);
        } else {
            free(values);
            return trainer_plugin_error(t, VH_ROLE_MODEL, st, call, d);
        }
    }
    return VH_STATUS_OK;
}

/* Batches come in host memory; a non-CPU device gets its own copy. */
static vh_status batch_to_device(vh_trainer *t, const vh_batch *in, vh_batch *out, vh_diag *d) {
    *out = *in;
    const vh_device_ops *dev = t->run->device;
    if (dev->kind == VH_DEVICE_KIND_CPU) return VH_STATUS_OK;
    size_t img_bytes = (size_t)vh_tensor_numel(&in->images) * sizeof(float);
    size_t lbl_bytes = (size_t)in->size * sizeof(int32_t);
    vh_status st = dev->copy(dev->device, t->dev_images, in->images.data, img_bytes,
                             VH_COPY_KIND_HOST_TO_DEVICE);
    if (st == VH_STATUS_OK)
        st = dev->copy(dev->device, t->dev_labels, in->labels.data, lbl_bytes,
                       VH_COPY_KIND_HOST_TO_DEVICE);
    if (st != VH_STATUS_OK) return diag_set(d, st, "copying a batch to %s failed", dev->name);
    out->images.data = t->dev_images;
    out->images.device = dev->kind;
    out->labels.data = t->dev_labels;
    out->labels.device = dev->kind;
    return VH_STATUS_OK;
}

static vh_status check_batch(vh_trainer *t, const vh_batch *b, vh_diag *d) {
    const vh_data_info *i = &t->info;
    int ok = b->size > 0 && b->size <= t->batch_size && b->images.ndim == 4 &&
             b->images.dtype == VH_DTYPE_F32 && b->images.shape[0] == b->size &&
             b->images.shape[1] == i->channels && b->images.shape[2] == i->height &&
             b->images.shape[3] == i->width && b->labels.dtype == VH_DTYPE_I32 &&
             b->labels.ndim == 1 && b->labels.shape[0] == b->size;
    if (!ok)
        return diag_set(d, VH_STATUS_ERR_INTERNAL,
                        "data plugin '%s' returned a batch of %lld images that does not match "
                        "its info (%d x %d x %d, batch size %lld)",
                        t->run->plugins[VH_ROLE_DATA].desc->name, (long long)b->size,
                        (int)i->channels, (int)i->height, (int)i->width,
                        (long long)t->batch_size);
    return VH_STATUS_OK;
}

vh_status trainer_step(vh_trainer *t, const vh_batch *batch, int64_t step, float *loss,
                            double *lr, int *skipped, vh_diag *d) {
    vh_model_output out;
    memset(&out, 0, sizeof out);
    out.struct_size = sizeof out;
    CALL(t, VH_ROLE_SHARDING, "sharding.zero_grads", t->sharding->zero_grads(t->self[VH_ROLE_SHARDING]));
    CALL(t, VH_ROLE_MODEL, "model.forward",
         t->model->forward(t->self[VH_ROLE_MODEL], batch, VH_MODE_TRAIN, &t->hooks, &out));
    if (!isfinite(out.loss))
        trace(t, "loss is %f: the step will be skipped if the grads overflow", (double)out.loss);
    trace(t, "precision.loss_scale");
    float scale = t->precision->loss_scale(t->self[VH_ROLE_PRECISION]);
    CALL(t, VH_ROLE_MODEL, "model.backward",
         t->model->backward(t->self[VH_ROLE_MODEL], scale, &t->hooks));
    CALL(t, VH_ROLE_SHARDING, "sharding.wait", t->sharding->wait(t->self[VH_ROLE_SHARDING]));
    int found_inf = 0;
    CALL(t, VH_ROLE_PRECISION, "precision.unscale_and_check",
         t->precision->unscale_and_check(t->self[VH_ROLE_PRECISION], &t->slices, &found_inf));
    *skipped = found_inf;
    if (!found_inf) {
        CALL(t, VH_ROLE_OPTIM, "optim.step",
             t->optim->step(t->self[VH_ROLE_OPTIM], &t->slices, step, lr));
        CALL(t, VH_ROLE_SHARDING, "sharding.refresh", t->sharding->refresh(t->self[VH_ROLE_SHARDING]));
    } else {
        trace(t, "optim.step skipped: gradients overflowed");
    }
    CALL(t, VH_ROLE_PRECISION, "precision.update",
         t->precision->update(t->self[VH_ROLE_PRECISION], found_inf));
    *loss = out.loss;
    return VH_STATUS_OK;
}

/* Rank of the true class among the logits: 0 when it has the highest. */
static int label_rank(const float *logits, int32_t classes, int32_t label) {
    int rank = 0;
    for (int32_t c = 0; c < classes; c++)
        if (logits[c] > logits[label] || (logits[c] == logits[label] && c < label)) rank++;
    return rank;
}

vh_status trainer_evaluate(vh_trainer *t, vh_eval_result *res, vh_diag *d) {
    void *data = t->self[VH_ROLE_DATA];
    const vh_device_ops *dev = t->run->device;
    int64_t n = 0, top1 = 0, top5 = 0;
    double loss_sum = 0.0;
    CALL(t, VH_ROLE_DATA, "data.start_epoch split=eval", t->data->start_epoch(data, VH_SPLIT_EVAL, 0));
    for (;;) {
        vh_batch host_batch, batch;
        int has = 0;
        vh_status st = trainer_next_batch(t, &host_batch, &batch, &has, d);
        if (st != VH_STATUS_OK) return st;
        if (!has) break;
        vh_model_output out;
        memset(&out, 0, sizeof out);
        out.struct_size = sizeof out;
        CALL(t, VH_ROLE_MODEL, "model.forward mode=eval",
             t->model->forward(t->self[VH_ROLE_MODEL], &batch, VH_MODE_EVAL, &t->hooks, &out));
        int32_t classes = t->info.num_classes;
        if (out.logits.ndim != 2 || out.logits.shape[0] != batch.size ||
            out.logits.shape[1] != classes || out.logits.dtype != VH_DTYPE_F32)
            return diag_set(d, VH_STATUS_ERR_INTERNAL,
                            "model plugin '%s' returned logits that are not (%lld, %d) f32",
                            t->run->plugins[VH_ROLE_MODEL].desc->name, (long long)batch.size,
                            (int)classes);
        size_t bytes = (size_t)batch.size * (size_t)classes * sizeof(float);
        st = dev->copy(dev->device, t->host_logits, out.logits.data, bytes,
                       VH_COPY_KIND_DEVICE_TO_HOST);
        if (st != VH_STATUS_OK) return diag_set(d, st, "copying logits from %s failed", dev->name);
        const int32_t *labels = host_batch.labels.data;
        for (int64_t i = 0; i < batch.size; i++) {
            int r = label_rank(t->host_logits + i * classes, classes, labels[i]);
            top1 += r < 1;
            top5 += r < 5;
        }
        loss_sum += (double)out.loss * (double)batch.size;
        n += batch.size;
    }
    /* Every rank saw its own part; the totals are the sums over ranks. */
    double totals[4] = {(double)n, (double)top1, (double)top5, loss_sum};
    vh_comm *c = &t->run->comm;
    vh_status st = c->ops->all_reduce(c, totals, 4, VH_DTYPE_F64, VH_REDUCE_OP_SUM);
    if (st != VH_STATUS_OK) return diag_set(d, st, "summing evaluation results over ranks failed");
    res->samples = (int64_t)totals[0];
    res->top1 = totals[0] > 0 ? totals[1] / totals[0] : 0.0;
    res->top5 = totals[0] > 0 ? totals[2] / totals[0] : 0.0;
    res->loss = totals[0] > 0 ? totals[3] / totals[0] : 0.0;
    return VH_STATUS_OK;
}

static vh_status allocate_buffers(vh_trainer *t, vh_diag *d) {
    const vh_device_ops *dev = t->run->device;
    size_t images = (size_t)t->batch_size * (size_t)t->info.channels * (size_t)t->info.height *
                    (size_t)t->info.width * sizeof(float);
    t->host_logits = malloc((size_t)t->batch_size * (size_t)t->info.num_classes * sizeof(float));
    if (!t->host_logits) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory for logits");
    if (dev->kind == VH_DEVICE_KIND_CPU) return VH_STATUS_OK;
    vh_status st = dev->alloc(dev->device, images, &t->dev_images);
    if (st == VH_STATUS_OK)
        st = dev->alloc(dev->device, (size_t)t->batch_size * sizeof(int32_t), &t->dev_labels);
    if (st != VH_STATUS_OK)
        return diag_set(d, st, "allocating the batch on %s failed", dev->name);
    return VH_STATUS_OK;
}

void trainer_close(vh_trainer *t) {
    /* Reverse order of creation: sharding holds buffers sized by the model. */
    if (t->self[VH_ROLE_SHARDING]) t->sharding->destroy(t->self[VH_ROLE_SHARDING]);
    if (t->self[VH_ROLE_OPTIM]) t->optim->destroy(t->self[VH_ROLE_OPTIM]);
    if (t->self[VH_ROLE_MODEL]) t->model->destroy(t->self[VH_ROLE_MODEL]);
    if (t->self[VH_ROLE_PRECISION]) t->precision->destroy(t->self[VH_ROLE_PRECISION]);
    if (t->self[VH_ROLE_DATA]) t->data->destroy(t->self[VH_ROLE_DATA]);
    const vh_device_ops *dev = t->run->device;
    if (t->dev_images) dev->free(dev->device, t->dev_images);
    if (t->dev_labels) dev->free(dev->device, t->dev_labels);
    free(t->host_logits);
    metrics_close(&t->metrics);
    memset(t, 0, sizeof *t);
}

vh_status trainer_next_batch(vh_trainer *t, vh_batch *host_batch, vh_batch *batch, int *has,
                             vh_diag *d) {
    vh_status st;
    trace(t, "data.next");
    st = t->data->next(t->self[VH_ROLE_DATA], host_batch, has);
    if (st != VH_STATUS_OK) return trainer_plugin_error(t, VH_ROLE_DATA, st, "data.next", d);
    if (!*has) return VH_STATUS_OK;
    st = check_batch(t, host_batch, d);
    if (st == VH_STATUS_OK) st = batch_to_device(t, host_batch, batch, d);
    return st;
}

void trainer_trace(const vh_trainer *t, const char *what, long long value) {
    trace(t, "%s%lld", what, value);
}

vh_status trainer_open(vh_trainer *t, vh_run *run, vh_diag *d) {
    memset(t, 0, sizeof *t);
    t->run = run;
    t->out = run->opts.out;
    t->trace = run->opts.trace;
    t->model = run->plugins[VH_ROLE_MODEL].desc->vtable;
    t->precision = run->plugins[VH_ROLE_PRECISION].desc->vtable;
    t->sharding = run->plugins[VH_ROLE_SHARDING].desc->vtable;
    t->optim = run->plugins[VH_ROLE_OPTIM].desc->vtable;
    t->data = run->plugins[VH_ROLE_DATA].desc->vtable;
    t->batch_size = run_config_int(run, "batch_size");
    t->hooks = (vh_unit_hooks){.struct_size = sizeof(vh_unit_hooks),
                               .ctx = t,
                               .gather = hook_gather,
                               .release = hook_release,
                               .grads = hook_grads,
                               .reduce = hook_reduce};
    vh_status st = run_open_device(run, d);
    if (st == VH_STATUS_OK) st = create_plugins(t, d);
    if (st == VH_STATUS_OK) st = allocate_buffers(t, d);
    if (st == VH_STATUS_OK) st = init_params(t, d);
    return st;
}

