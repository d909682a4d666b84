/* loss.c - mean softmax cross-entropy with label smoothing, as
 * torch.nn.CrossEntropyLoss(label_smoothing=s): the target of a row with
 * label y is q = (1 - s) onehot(y) + s / C, and
 *   loss_b = logsumexp(z) - sum_c q_c z_c,  dloss_b/dz = softmax(z) - q.
 * Serial: B x C is small next to the matmuls, and the sum keeps one order.
 * The loss is written where the caller says (device memory: host memory on
 * the CPU). fp32 kernel: ops.c reads the arguments and converts dtypes.
 * Soft targets (ABI 2.2, mixup/cutmix): q is a given row t instead, and
 *   loss_b = sum_c t_c (logsumexp(z) - z_c),  dloss_b/dz = softmax(z) - t,
 * in the same order and precision, so a one-hot t gives the labels' bits. */
#include <math.h>

#include "cpu_ops.h"

void vh_cpu_k_softmax_cross_entropy(float *loss, float *dlogits, const float *logits,
                                    const int32_t *labels, int64_t batch, int64_t classes,
                                    float smoothing, float dloss_scale) {
    if (batch == 0) { /* nothing to average; no gradient */
        *loss = 0.0f;
        return;
    }

    const double off = (double)smoothing / (double)classes; /* q_c off the label */
    const double on = 1.0 - (double)smoothing + off;        /* q_y */
    const double gscale = (double)dloss_scale / (double)batch;
    double total = 0.0;
    for (int64_t b = 0; b < batch; b++) {
        const float *z = logits + b * classes;
        const int64_t y = labels[b];
        float mx = z[0];
        for (int64_t c = 1; c < classes; c++) mx = z[c] > mx ? z[c] : mx;
        double sum = 0.0, zsum = 0.0;
        for (int64_t c = 0; c < classes; c++) {
            sum += (double)expf(z[c] - mx);
            zsum += (double)z[c] - (double)mx;
        }
        const double lse = log(sum); /* of z - mx */
        /* sum_c q_c (lse - (z_c - mx)), with sum_c q_c = 1 */
        total += lse - (on - off) * ((double)z[y] - mx) - off * zsum;
        if (dlogits) {
            float *g = dlogits + b * classes;
            const double inv = 1.0 / sum;
            for (int64_t c = 0; c < classes; c++) {
                double p = (double)expf(z[c] - mx) * inv;
                double q = c == y ? on : off;
                g[c] += (float)(gscale * (p - q));
            }
        }
    }
    *loss = (float)(total / (double)batch);
}

void vh_cpu_k_softmax_cross_entropy_soft(float *loss, float *dlogits, const float *logits,
                                         const float *targets, int64_t batch, int64_t classes,
                                         float dloss_scale) {
    if (batch == 0) {
        *loss = 0.0f;
        return;
    }
    const double gscale = (double)dloss_scale / (double)batch;
    double total = 0.0;
    for (int64_t b = 0; b < batch; b++) {
        const float *z = logits + b * classes, *t = targets + b * classes;
        float mx = z[0];
        for (int64_t c = 1; c < classes; c++) mx = z[c] > mx ? z[c] : mx;
        double sum = 0.0;
        for (int64_t c = 0; c < classes; c++) sum += (double)expf(z[c] - mx);
        const double lse = log(sum); /* of z - mx */
        /* Rows need not sum to 1 exactly (f32 targets): no shortcut through it. */
        double row = 0.0;
        for (int64_t c = 0; c < classes; c++)
            row += (double)t[c] * (lse - ((double)z[c] - mx));
        total += row;
        if (dlogits) {
            float *g = dlogits + b * classes;
            const double inv = 1.0 / sum;
            for (int64_t c = 0; c < classes; c++) {
                double p = (double)expf(z[c] - mx) * inv;
                g[c] += (float)(gscale * (p - (double)t[c]));
            }
        }
    }
    *loss = (float)(total / (double)batch);
}
