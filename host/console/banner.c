/* banner.c - the lines a run starts with (see banner.h). */
#include "banner.h"

#include <stdio.h>

#include "vithost/vh_cpu_engine.h"

/* "12.3 MiB" */
static void bytes_text(char *buf, size_t len, int64_t bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* What this rank holds: the sharding plugin's count of each kind of buffer
 * (has_sharded 0 when it does not count) and the model's activations
 * (has_act). Asked before the line is printed, so a traced call's line
 * does not split it. */
typedef struct memory_report {
    int has_sharded, has_act;
    vh_sharding_memory sharded;
    int64_t act;
} memory_report;

static vh_status ask_memory(vh_session *s, memory_report *r, vh_diag *d) {
    r->sharded = (vh_sharding_memory){.struct_size = sizeof r->sharded};
    r->has_sharded = s->sharding->memory != NULL;
    r->has_act = s->model->activation_bytes != NULL;
    r->act = 0;
    if (r->has_sharded) {
        session_trace(s, "sharding.memory");
        vh_status st = s->sharding->memory(s->self[VH_ROLE_SHARDING], &r->sharded);
        if (st != VH_STATUS_OK)
            return session_plugin_error(s, VH_ROLE_SHARDING, st, "sharding.memory", d);
    }
    if (r->has_act) {
        session_trace(s, "model.activation_bytes");
        vh_status st = s->model->activation_bytes(s->self[VH_ROLE_MODEL], &r->act);
        if (st != VH_STATUS_OK)
            return session_plugin_error(s, VH_ROLE_MODEL, st, "model.activation_bytes", d);
    }
    return VH_STATUS_OK;
}

/* One line: the parameter count and what this rank holds. */
static vh_status print_memory(vh_session *s, vh_diag *d) {
    memory_report r;
    vh_status st = ask_memory(s, &r, d);
    if (st != VH_STATUS_OK) return st;
    fprintf(s->out, "vithost: %lld parameters", (long long)s->table->numel);
    char text[5][32];
    if (r.has_sharded) {
        const vh_sharding_memory *m = &r.sharded;
        bytes_text(text[0], sizeof text[0], m->params);
        bytes_text(text[1], sizeof text[1], m->grads);
        bytes_text(text[2], sizeof text[2], m->masters);
        bytes_text(text[3], sizeof text[3], m->optim_state);
        fprintf(s->out, "; on this rank: params %s, grads %s, masters %s, optimizer state %s",
                text[0], text[1], text[2], text[3]);
        bytes_text(text[4], sizeof text[4], m->comm_buffers);
        if (m->comm_buffers) fprintf(s->out, ", comm buffers %s", text[4]);
    }
    if (r.has_act) {
        bytes_text(text[0], sizeof text[0], r.act);
        fprintf(s->out, ", activations %s", text[0]);
    }
    fputc('\n', s->out);
    return VH_STATUS_OK;
}

vh_status banner_print(vh_session *s, const vh_banner *b, vh_diag *d) {
    fprintf(s->out, "vithost: run folder %s\n", b->dir);
    if (b->resumed_from)
        fprintf(s->out, "vithost: resuming from %s (step %lld, epoch %lld)\n", b->resumed_from,
                (long long)s->step, (long long)s->epoch);
    /* the global batch: micro-batch x grad_accum x ranks */
    fprintf(s->out,
            "vithost: training %lld steps (%lld epochs of %lld steps, batch %lld) on %s; ",
            (long long)b->total, (long long)b->epochs, (long long)b->steps_per_epoch,
            (long long)(s->batch_size * s->grad_accum * b->world), s->run->device->name);
    if (s->grad_accum > 1)
        fprintf(s->out, "%lld micro-batches of %lld per step (run.grad_accum); ",
                (long long)s->grad_accum, (long long)s->batch_size);
    if (b->world > 1)
        fprintf(s->out, "%d ranks (%s) of batch %lld each; ", (int)b->world,
                s->run->comm.backend ? s->run->comm.backend : "?",
                (long long)(s->batch_size * s->grad_accum));
    if (b->flops > 0) fprintf(s->out, "%.3g GFLOP per image", b->flops / 1e9);
    else fprintf(s->out, "FLOPs per image unknown (the model does not count them)");
    if (b->peak_tflops > 0) fprintf(s->out, "; device peak %.1f GFLOP/s", b->peak_tflops * 1e3);
    fputc('\n', s->out);
    if (s->run->device->kind == VH_DEVICE_KIND_CPU) {
        /* the 16-bit GEMMs' path, or the f32 ones' kernel, decided per shape
         * class at first use */
        char line[256];
        fprintf(s->out, "vithost: %s\n",
                vh_cpu_gemm16_summary(s->policy.compute_dtype, line, sizeof line));
    }
    vh_status st = print_memory(s, d);
    if (st != VH_STATUS_OK) return st;
    fprintf(s->out, "vithost: each step calls, in order: %s\n", vh_step_order);
    fflush(s->out);
    return VH_STATUS_OK;
}
