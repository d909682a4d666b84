/* vh_rand_augment.h - RandAugment-style light augmentation of training images.
 *
 * vh_data_pass (vh_data_pass.h) applies it to every training image after the
 * plugin's fill (so after the crop and flip, as timm's transform order) and
 * before Mixup/CutMix, when the data section turns it on with the shared keys
 * rand_augment_n and rand_augment_m (vh_data_shared_keys, vh_mix.h).
 * Evaluation images are never touched. Per image, as timm's
 * rand_augment_transform (timm/data/auto_augment.py) in spirit:
 *
 *   - n layers; each draws one op uniformly from the set below, applies it
 *     with probability 1/2 (timm's AugmentOp prob 0.5) at level
 *     v = +-m / 10 (a random sign, timm's _randomly_negate; m is clamped to
 *     10 as timm's magnitude_max).
 *   - geometric ops (an affine map, as PIL's Image.transform: output pixel
 *     centre -> source point; outside the image the fill, inside bilinear with
 *     clamped neighbours): rotate by 30 v degrees about the centre, shear x/y
 *     by 0.3 v (about the top-left corner), translate x/y by 0.45 v of the side.
 *     The fill is the normalised value 0, the data set's mean pixel (timm
 *     fills with img_mean).
 *   - colour ops, on pixel values mapped to [0, 1] through the plugin's black
 *     and white (vh_data_pass_set_range) and clipped to [0, 1] after the op as
 *     PIL does: brightness, contrast (towards the mean grey), color (towards
 *     grey; 3 channels only) and sharpness (towards PIL's 3x3 SMOOTH filter,
 *     border pixels kept), each blending with factor 1 + 0.9 v (timm's
 *     "increasing" variants, DeiT's rand-m9-inc1); posterize to 8 - int(4 |v|)
 *     bits, solarize above 256 - int(256 |v|) (of 255); autocontrast
 *     (per channel min..max to 0..1, no level); identity.
 *   - m = 0 leaves an image as it is but for autocontrast (which has no level).
 *
 * Draws come from the image's sample key (vh_sampler_sample_key: seed, split,
 * epoch, sample) through vh_sampler_rng_next, so an image's augmentation does
 * not depend on the worker, the batch or the order of fills.
 */
#ifndef VITHOST_VH_RAND_AUGMENT_H
#define VITHOST_VH_RAND_AUGMENT_H

#include <stdint.h>

#include "vh_export.h"
#include "vh_host.h"
#include "vh_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vh_ra_op {
    VH_RA_IDENTITY = 0,
    VH_RA_AUTOCONTRAST,
    VH_RA_ROTATE,
    VH_RA_SHEAR_X,
    VH_RA_SHEAR_Y,
    VH_RA_TRANSLATE_X,
    VH_RA_TRANSLATE_Y,
    VH_RA_BRIGHTNESS,
    VH_RA_CONTRAST,
    VH_RA_COLOR,
    VH_RA_SHARPNESS,
    VH_RA_POSTERIZE,
    VH_RA_SOLARIZE,
    VH_RA_OPS /* how many */
} vh_ra_op;

typedef struct vh_rand_augment_config {
    uint32_t struct_size; /* sizeof(vh_rand_augment_config) */
    int32_t n;            /* ops per image; 0 = off */
    int32_t m;            /* magnitude 0..10 (timm's scale) */
} vh_rand_augment_config;

/* One image of (channels, height, width) floats, in place. black and white
 * (per channel) are the values pixel bytes 0 and 255 have in it; scratch
 * holds channels * height * width floats. */
typedef struct vh_ra_image {
    float *data;
    float *scratch;
    int32_t channels, height, width;
    const float *black, *white;
} vh_ra_image;

/* Reads rand_augment_n and rand_augment_m of `host`'s section; a section
 * without them (a plugin older than ABI 2.2, a unit test's host) reads as off. */
VH_SDK_API vh_status vh_rand_augment_config_read(vh_host *host, vh_rand_augment_config *out);

/* Applies op at signed level `level` (1 = the op's maximum; geometric and
 * blending ops take any level, posterize and solarize use |level| <= 1). */
VH_SDK_API void vh_rand_augment_apply_op(vh_ra_op op, double level, const vh_ra_image *img);

/* Draws and applies c->n ops from `key` (see above). */
VH_SDK_API void vh_rand_augment_apply(const vh_rand_augment_config *c, uint64_t key,
                                      const vh_ra_image *img);

#ifdef __cplusplus
}
#endif
#endif
