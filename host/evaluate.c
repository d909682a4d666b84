/* evaluate.c - one evaluation pass over the eval split: top-1, top-5 and
 * the mean loss, summed over the ranks (each sees its own part). */
#include "session.h"


/* Rank of the true class among the logits: 0 when it has the highest. */
static int label_rank(const float *logits, int32_t classes, int32_t label) {
    int rank = 0;
    for (int32_t c = 0; c < classes; c++)
        if (logits[c] > logits[label] || (logits[c] == logits[label] && c < label)) rank++;
    return rank;
}

vh_status session_evaluate(vh_session *s, vh_eval_result *res, vh_diag *d) {
    void *data = s->self[VH_ROLE_DATA];
    const vh_device_ops *dev = s->run->device;
    const char *model_name = s->run->plugins[VH_ROLE_MODEL].desc->name;
    int64_t n = 0, top1 = 0, top5 = 0;
    double loss_sum = 0.0;
    session_trace(s, "data.start_epoch split=eval");
    vh_status st = s->data->start_epoch(data, VH_SPLIT_EVAL, 0);
    if (st != VH_STATUS_OK) return session_plugin_error(s, VH_ROLE_DATA, st, "data.start_epoch", d);
    for (;;) {
        vh_batch host_batch, batch;
        int has = 0;
        st = session_next_batch(s, &host_batch, &batch, &has, d);
        if (st != VH_STATUS_OK) return st;
        if (!has) break;
        vh_model_output out = {.struct_size = sizeof out};
        session_trace(s, "model.forward mode=eval");
        st = s->model->forward(s->self[VH_ROLE_MODEL], &batch, VH_MODE_EVAL, &s->hooks, &out);
        if (st != VH_STATUS_OK)
            return session_plugin_error(s, VH_ROLE_MODEL, st, "model.forward mode=eval", d);
        int32_t classes = s->info.num_classes;
        if (out.logits.ndim != 2 || out.logits.shape[0] != batch.size ||
            out.logits.shape[1] != classes || out.logits.dtype != VH_DTYPE_F32)
            return diag_set(d, VH_STATUS_ERR_INTERNAL,
                            "model plugin '%s' returned logits that are not (%lld, %d) f32",
                            model_name, (long long)batch.size, (int)classes);
        size_t bytes = (size_t)batch.size * (size_t)classes * sizeof(float);
        st = dev->copy(dev->device, s->host_logits, out.logits.data, bytes,
                       VH_COPY_KIND_DEVICE_TO_HOST, NULL);
        if (st != VH_STATUS_OK) return diag_set(d, st, "copying logits from %s failed", dev->name);
        float loss;
        st = session_read_loss(s, out.loss, &loss, d);
        if (st != VH_STATUS_OK) return st;
        const int32_t *labels = host_batch.labels.data;
        for (int64_t i = 0; i < batch.size; i++) {
            int r = label_rank(s->host_logits + i * classes, classes, labels[i]);
            top1 += r < 1;
            top5 += r < 5;
        }
        loss_sum += (double)loss * (double)batch.size;
        n += batch.size;
    }
    /* Every rank saw its own part; the totals are the sums over ranks. */
    double totals[4] = {(double)n, (double)top1, (double)top5, loss_sum};
    st = vh_comm_all_reduce(&s->run->comm, totals, 4, VH_DTYPE_F64, VH_REDUCE_OP_SUM);
    if (st != VH_STATUS_OK) return diag_set(d, st, "summing evaluation results over ranks failed");
    res->samples = (int64_t)totals[0];
    res->top1 = totals[0] > 0 ? totals[1] / totals[0] : 0.0;
    res->top5 = totals[0] > 0 ? totals[2] / totals[0] : 0.0;
    res->loss = totals[0] > 0 ? totals[3] / totals[0] : 0.0;
    return VH_STATUS_OK;
}
