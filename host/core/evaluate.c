/* evaluate.c - one evaluation pass over the eval split: top-1, top-5 and
 * the mean loss, summed over the ranks (each sees its own part). */
#include <math.h>

#include "session.h"


/* 16-bit logits (a model computing in bf16 or f16) to f32, in place: the
 * n values fill the first half of the f32 buffer; widened from the end. */
static void widen_logits(float *buf, vh_dtype dtype, size_t n) {
    const uint16_t *h = (const uint16_t *)(const void *)buf;
    for (size_t i = n; i-- > 0;)
        buf[i] = dtype == VH_DTYPE_F16 ? vh_f16_to_f32(h[i]) : vh_bf16_to_f32(h[i]);
}

/* Rank of the true class among the logits: 0 when it has the highest. A
 * sample with any NaN or Inf logit ranks last: NaN compares false with
 * everything, so it would otherwise count as correct, and an Inf hides
 * every other class. */
static int label_rank(const float *logits, int32_t classes, int32_t label) {
    int rank = 0;
    for (int32_t c = 0; c < classes; c++)
        if (!isfinite(logits[c])) return classes;
    for (int32_t c = 0; c < classes; c++)
        if (logits[c] > logits[label] || (logits[c] == logits[label] && c < label)) rank++;
    return rank;
}

/* The message of an evaluation that met NaN/Inf: at eval image `bad` of
 * this rank (1-based; 0: on another rank), in a batch whose pixels were
 * (bad_input) or were not finite. */
static vh_status not_finite(const vh_session *s, int64_t bad, int bad_input, vh_diag *d) {
    if (bad_input)
        return diag_set(d, VH_STATUS_ERR_NUMERIC,
                        "evaluation: the eval batch with image %lld of this rank has NaN or Inf "
                        "pixels: data plugin '%s' hands out non-finite values (a damaged file, "
                        "or a normalisation that divides by about 0); the weights are not the "
                        "cause; no accuracy is reported",
                        (long long)bad, s->run->plugins[VH_ROLE_DATA].desc->name);
    if (bad)
        return diag_set(d, VH_STATUS_ERR_NUMERIC,
                        "evaluation: the %s model's logits or loss are NaN or Inf (eval image "
                        "%lld of this rank); the weights or the computation are not finite, so "
                        "no accuracy is reported",
                        s->run->plugins[VH_ROLE_MODEL].desc->name, (long long)bad);
    return diag_set(d, VH_STATUS_ERR_NUMERIC,
                    "evaluation: another rank's logits or loss are NaN or Inf; no accuracy is "
                    "reported");
}

vh_status session_evaluate(vh_session *s, vh_eval_result *res, vh_diag *d) {
    void *data = s->self[VH_ROLE_DATA];
    const vh_device_ops *dev = s->run->device;
    const char *model_name = s->run->plugins[VH_ROLE_MODEL].desc->name;
    int64_t n = 0, top1 = 0, top5 = 0;
    int64_t bad = 0; /* 1 + the first eval image with a NaN/Inf logit or loss */
    int bad_input = 0; /* its batch held NaN/Inf pixels: the data's fault, not the weights' */
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
            out.logits.shape[1] != classes || !vh_dtype_is_float(out.logits.dtype))
            return diag_set(d, VH_STATUS_ERR_INTERNAL,
                            "model plugin '%s' returned logits that are not (%lld, %d) f32, "
                            "bf16 or f16",
                            model_name, (long long)batch.size, (int)classes);
        size_t count = (size_t)batch.size * (size_t)classes;
        st = dev->copy(dev->device, s->host_logits, out.logits.data,
                       count * vh_dtype_size(out.logits.dtype), VH_COPY_KIND_DEVICE_TO_HOST, NULL);
        if (st != VH_STATUS_OK) return diag_set(d, st, "copying logits from %s failed", dev->name);
        if (out.logits.dtype != VH_DTYPE_F32) widen_logits(s->host_logits, out.logits.dtype, count);
        float loss;
        st = session_read_loss(s, out.loss, &loss, d);
        if (st != VH_STATUS_OK) return st;
        const int32_t *labels = host_batch.labels.data;
        for (size_t i = 0; i < count && !bad; i++)
            if (!isfinite(s->host_logits[i])) bad = n + (int64_t)(i / (size_t)classes) + 1;
        if (!bad && !isfinite(loss)) bad = n + 1;
        if (bad > n && !bad_input) bad_input = session_batch_not_finite(&host_batch);
        for (int64_t i = 0; i < batch.size; i++) {
            int r = label_rank(s->host_logits + i * classes, classes, labels[i]);
            top1 += r < 1;
            top5 += r < 5;
        }
        loss_sum += (double)loss * (double)batch.size;
        n += batch.size;
    }
    /* Every rank saw its own part; the totals are the sums over ranks (and
     * whether any rank met a non-finite number). */
    double totals[5] = {(double)n, (double)top1, (double)top5, loss_sum, bad ? 1.0 : 0.0};
    st = session_reduce_scalars(s, totals, 5, VH_REDUCE_OP_SUM, d);
    if (st != VH_STATUS_OK) return st;
    /* No score of NaN logits is meaningful: an error, not an accuracy. */
    if (totals[4] != 0.0) return not_finite(s, bad, bad_input, d);
    res->has_ema = 0; /* (the loop fills the EMA's: train/ema.h) */
    res->samples = (int64_t)totals[0];
    res->top1 = totals[0] > 0 ? totals[1] / totals[0] : 0.0;
    res->top5 = totals[0] > 0 ? totals[2] / totals[0] : 0.0;
    res->loss = totals[0] > 0 ? totals[3] / totals[0] : 0.0;
    return VH_STATUS_OK;
}
