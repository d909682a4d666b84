/* testhost_optim.c - an optimizer's tensors, its parameter table and slice
 * list, and one step over them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testhost_internal.h"

static void tensor_free(th_tensor *t) {
    free(t->values);
    free(t->grad);
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) free(t->state[k]);
}

void th_optim_free(vh_testhost *th) {
    for (int i = 0; i < th->num_tensors; i++) tensor_free(&th->tensors[i]);
    free(th->tensors);
    free(th->items);
    free(th->params);
    free(th->param_names);
    th->tensors = NULL;
    th->items = NULL;
    th->params = NULL;
    th->param_names = NULL;
    th->num_tensors = 0;
}

int vh_testhost_optim_add(vh_testhost *th, int64_t count, uint32_t flags, const float *values) {
    if (count < 1 || th->created) {
        th_fail(th, VH_STATUS_ERR_INVALID_ARG, "optim_add: %s",
                count < 1 ? "count < 1" : "add tensors before create");
        return -1;
    }
    th_tensor *grown = realloc(th->tensors, ((size_t)th->num_tensors + 1) * sizeof *grown);
    if (!grown) return -1;
    th->tensors = grown;
    th_tensor *t = &th->tensors[th->num_tensors];
    memset(t, 0, sizeof *t);
    t->count = count;
    t->flags = flags;
    int ok = (t->values = calloc((size_t)count, sizeof(float))) != NULL;
    ok = ok && (t->grad = calloc((size_t)count, sizeof(float))) != NULL;
    for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++)
        ok = ok && (t->state[k] = calloc((size_t)count, sizeof(float))) != NULL;
    if (!ok) {
        tensor_free(t);
        th_fail(th, VH_STATUS_ERR_NOMEM, "optim_add: out of memory");
        return -1;
    }
    if (values) memcpy(t->values, values, (size_t)count * sizeof(float));
    return th->num_tensors++;
}

static th_tensor *tensor_at(vh_testhost *th, int i) {
    return i >= 0 && i < th->num_tensors ? &th->tensors[i] : NULL;
}

float *vh_testhost_optim_values(vh_testhost *th, int tensor) {
    th_tensor *t = tensor_at(th, tensor);
    return t ? t->values : NULL;
}

float *vh_testhost_optim_grad(vh_testhost *th, int tensor) {
    th_tensor *t = tensor_at(th, tensor);
    return t ? t->grad : NULL;
}

float *vh_testhost_optim_state(vh_testhost *th, int tensor, int slot) {
    th_tensor *t = tensor_at(th, tensor);
    return t && slot >= 0 && slot < VH_OPTIM_MAX_STATE_SLOTS ? t->state[slot] : NULL;
}

vh_status vh_testhost_optim_item_size(vh_testhost *th, uint32_t item_size) {
    if (item_size < VH_PARAM_SLICE_SIZE_2_0 || item_size % _Alignof(vh_param_slice) != 0)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG,
                       "item_size %u: at least %zu and a multiple of %zu", item_size,
                       (size_t)VH_PARAM_SLICE_SIZE_2_0, (size_t)_Alignof(vh_param_slice));
    th->item_size = item_size;
    return VH_STATUS_OK;
}

/* One unit "tensors" of the tensors as 1-D parameters "t0", "t1", ... */
vh_status th_optim_table(vh_testhost *th) {
    size_t n = (size_t)th->num_tensors;
    free(th->params);
    free(th->param_names);
    th->params = calloc(n + 1, sizeof *th->params);
    th->param_names = calloc(n + 1, 24);
    if (!th->params || !th->param_names) return th_fail(th, VH_STATUS_ERR_NOMEM, "out of memory");
    int64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        vh_param_desc *p = &th->params[i];
        snprintf(th->param_names + 24 * i, 24, "t%zu", i);
        p->name = th->param_names + 24 * i;
        p->ndim = 1;
        p->shape[0] = p->numel = th->tensors[i].count;
        p->flags = th->tensors[i].flags;
        p->offset = offset;
        offset += p->numel;
    }
    th->unit = (vh_unit_desc){"tensors", th->params, (int32_t)n, offset};
    th->table = (vh_param_table){&th->unit, 1, offset};
    return VH_STATUS_OK;
}

/* The slice list of every tensor, items of item_size bytes whose extra
 * bytes hold a pattern (what a newer producer's members would be). */
static vh_status build_slices(vh_testhost *th) {
    size_t bytes = (size_t)th->num_tensors * th->item_size;
    free(th->items);
    th->items = malloc(bytes ? bytes : 1);
    if (!th->items) return th_fail(th, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(th->items, 0x5A, bytes);
    for (int i = 0; i < th->num_tensors; i++) {
        const th_tensor *t = &th->tensors[i];
        vh_param_slice s;
        memset(&s, 0, sizeof s);
        s.unit = 0;
        s.param = i;
        s.count = t->count;
        s.flags = t->flags;
        s.master = t->values;
        s.grad = t->grad;
        for (int k = 0; k < VH_OPTIM_MAX_STATE_SLOTS; k++) s.state[k] = t->state[k];
        s.master_dtype = s.grad_dtype = s.state_dtype = VH_DTYPE_F32;
        size_t copy = th->item_size < sizeof s ? th->item_size : sizeof s;
        memcpy(th->items + (size_t)i * th->item_size, &s, copy);
    }
    memset(&th->slices, 0, sizeof th->slices);
    th->slices.items = (vh_param_slice *)(void *)th->items;
    th->slices.count = th->num_tensors;
    th->slices.item_size = th->item_size;
    th->slices.replicated = 1; /* one rank holds everything */
    char why[256];
    if (vh_param_slices_check(&th->slices, why, sizeof why) != VH_STATUS_OK)
        return th_fail(th, VH_STATUS_ERR_INTERNAL, "slice list: %s", why);
    return VH_STATUS_OK;
}

/* What the host hands update when the test gives no args: the step after
 * the last one, and for a 2.1 optimizer the SDK schedule's rate, weight
 * decay and clipping from the config (the shared keys). */
static vh_status host_args(vh_testhost *th, vh_optim_step_args *a) {
    memset(a, 0, sizeof *a);
    a->step = th->next_step;
    if (th->desc->abi_minor < 1) return VH_STATUS_OK; /* 2.0: its own rate */
    vh_optim_schedule sched;
    memset(&sched, 0, sizeof sched);
    sched.struct_size = sizeof sched;
    vh_status st = vh_optim_schedule_read(&th->pub, th->setup.optim.total_steps, &sched);
    if (st == VH_STATUS_OK) vh_optim_schedule_args(&sched, a->step, a);
    return st;
}

vh_status vh_testhost_optim_step(vh_testhost *th, const vh_optim_step_args *args,
                                 double *lr_out) {
    if (th->desc->role != VH_ROLE_OPTIM)
        return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "%s is not an optimizer", th->desc->name);
    if (!th->created) return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "no instance: create first");
    vh_optim_vtable vt;
    memset(&vt, 0, sizeof vt);
    vh_struct_upgrade(&vt, sizeof vt, th->desc->vtable);
    vh_optim_step_args a;
    vh_status st = args ? VH_STATUS_OK : host_args(th, &a);
    if (args) a = *args;
    if (st == VH_STATUS_OK) st = build_slices(th);
    if (st != VH_STATUS_OK) return st;
    a.struct_size = sizeof a;
    a.slices = &th->slices;
    double lr = -1.0;
    th->error[0] = '\0';
    if (vt.update) st = vt.update(th->self, &a, &lr);
    else if (vt.step) st = vt.step(th->self, &th->slices, a.step, &lr);
    else return th_fail(th, VH_STATUS_ERR_INVALID_ARG, "%s has neither update nor step",
                        th->desc->name);
    if (st != VH_STATUS_OK && !th->error[0])
        th_fail(th, st, "%s: step %lld failed without a message", th->desc->name,
                (long long)a.step);
    if (st == VH_STATUS_OK) th->next_step = a.step + 1;
    if (lr_out) *lr_out = lr;
    return st;
}
