/* vh_mix.h - Mixup and CutMix of training batches, with soft targets (ABI 2.2).
 *
 * vh_data_pass (vh_data_pass.h) applies it to every training batch of a data
 * plugin that uses it, when the data section turns it on with the shared
 * keys below; evaluation batches are never mixed. Per batch, as timm's
 * Mixup(mode='batch') (timm/data/mixup.py, timm 1.0: _params_per_batch,
 * _mix_batch, rand_bbox, cutmix_bbox_and_lam, mixup_target):
 *
 *   - with probability mix_prob the batch is mixed; when both alphas are on,
 *     CutMix with probability mix_switch_prob, else Mixup; lam ~
 *     Beta(alpha, alpha) of the chosen one. Otherwise lam = 1 (not mixed).
 *   - Mixup: x[b] = lam x[b] + (1 - lam) x[B-1-b] (the batch in reverse
 *     order, timm's x.flip(0)), in f32 as torch: (x * f32(lam)) + (y * f32(1 - lam)).
 *   - CutMix: cut_h = int(H sqrt(1 - lam)), cut_w likewise; a centre (cy,
 *     cx) uniform over the pixels; the box [cy - cut_h/2, cy + (cut_h+1)/2) x
 *     [cx - cut_w/2, cx + (cut_w+1)/2) clipped to the image takes the pixels
 *     of x[B-1-b]; lam = 1 - box area / (H W).
 *   - targets[b] = lam smooth(y[b]) + (1 - lam) smooth(y[B-1-b]), smooth(y)
 *     = (1 - s) onehot(y) + s / C, s = mix_label_smoothing: every training
 *     batch carries targets while mixing is on, mixed or not.
 *
 * The draws of a batch are a pure function of (seed, epoch, batch index in
 * the pass, rank) (vh_mix_key): never of the worker that fills it or of the
 * order of fills, so batches are the same for any worker count and a resumed
 * pass repeats them. An odd batch pairs its middle sample with itself.
 */
#ifndef VITHOST_VH_MIX_H
#define VITHOST_VH_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "vh_config.h"
#include "vh_export.h"
#include "vh_host.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The data section's shared keys (mixup_alpha, cutmix_alpha, mix_prob,
 * mix_switch_prob, mix_label_smoothing, and RandAugment's rand_augment_n and
 * rand_augment_m, vh_rand_augment.h): the host adds them to the schema of
 * every data plugin of ABI 2.2 or later, as it adds vh_optim_shared_keys to
 * optimizers; vh_data_pass reads them. Ended by a NULL key. */
VH_SDK_API extern const vh_config_key vh_data_shared_keys[];

typedef struct vh_mix_config {
    uint32_t struct_size;         /* sizeof(vh_mix_config) */
    double mixup_alpha;           /* 0: no Mixup */
    double cutmix_alpha;          /* 0: no CutMix */
    double prob;                  /* mix_prob: chance that a batch is mixed */
    double switch_prob;           /* mix_switch_prob: chance of CutMix when both are on */
    double label_smoothing;       /* mix_label_smoothing, inside the targets */
    int32_t num_classes;          /* C of the targets, >= 1 */
} vh_mix_config;

/* 1 when either alpha is above 0. */
VH_SDK_API int vh_mix_enabled(const vh_mix_config *c);

/* Reads the shared keys of `host`'s section into *out (num_classes as
 * given). A section without them (a plugin older than ABI 2.2) reads as
 * mixing off. */
VH_SDK_API vh_status vh_mix_config_read(vh_host *host, int32_t num_classes, vh_mix_config *out);

typedef enum vh_mix_mode {
    VH_MIX_NONE = 0,
    VH_MIX_MIXUP = 1,
    VH_MIX_CUTMIX = 2,
} vh_mix_mode;

/* One batch's draw. The raw draws are there so that a reference (timm, in
 * tests/reference/make_mix_fixture.py) can be fed the same numbers. */
typedef struct vh_mix_params {
    uint32_t struct_size;     /* sizeof(vh_mix_params) */
    int32_t mode;             /* vh_mix_mode */
    double lam;               /* the weight of a sample's own label; 1 when not mixed */
    double u_apply, u_switch; /* uniform [0, 1): mixed when u_apply < prob; CutMix when
                                 u_switch < switch_prob (both alphas on) */
    double lam_draw;          /* the Beta(alpha, alpha) draw, before CutMix's correction */
    int32_t cy, cx;           /* CutMix: the box's centre, uniform over the pixels */
    int32_t y0, y1, x0, x1;   /* CutMix: the box, rows [y0, y1), columns [x0, x1) */
} vh_mix_params;

/* The key of batch `batch` of the training pass of `epoch` on `rank`. */
VH_SDK_API uint64_t vh_mix_key(uint64_t seed, int64_t epoch, int64_t batch, int32_t rank);

/* The draw for one batch of images of height x width from `key`. */
VH_SDK_API vh_status vh_mix_draw(const vh_mix_config *c, uint64_t key, int32_t height,
                                 int32_t width, vh_mix_params *out);

/* Mixes `batch` images (B, channels, height, width) in place as *p says and
 * writes targets (B, num_classes) f32 from the labels (each in
 * [0, num_classes)). */
VH_SDK_API vh_status vh_mix_apply(const vh_mix_config *c, const vh_mix_params *p, float *images,
                                  const int32_t *labels, int64_t batch, int32_t channels,
                                  int32_t height, int32_t width, float *targets);

#ifdef __cplusplus
}
#endif
#endif
