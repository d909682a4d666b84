/* transform.h - crops, resampling and normalisation, as torchvision does them.
 *
 * Training (random_resized_crop on): RandomResizedCrop(size, scale=(scale_min,
 * 1), ratio=(3/4, 4/3)) - up to 10 draws of an area fraction and a log-uniform
 * aspect ratio, the first box that fits wins, else the center crop of the
 * largest box within the ratio range - then RandomHorizontalFlip(0.5) when
 * hflip is on. With random_resized_crop off, training uses the eval geometry
 * (plus the flip).
 *
 * Evaluation: Resize(floor(size / crop_pct)) of the shorter side (the longer
 * one int(short' * long / short), as torchvision), then CenterCrop(size)
 * (offsets round half to even, as Python's round).
 *
 * A crop is a box in the full-size source image. Resampling maps output pixel
 * centres into it (half-pixel convention, align_corners=False) and samples
 * bilinearly, clamping at the image border. There is no antialiasing filter:
 * when the box is more than twice the output, plain bilinear skips source
 * pixels (PIL's resize would average them). For JPEGs the decoder's DCT
 * scaling (1/2, 1/4, 1/8; see imf_crop_min_scale) brings every box of up to
 * 16x the output within 2x of it, where the difference is small.
 *
 * Every random draw comes from a 64-bit key per (seed, split, epoch, sample),
 * through a counter-based generator, so a sample's augmentation does not
 * depend on the worker that makes it, the batch it lands in or the rank.
 */
#ifndef IMAGEFOLDER_TRANSFORM_H
#define IMAGEFOLDER_TRANSFORM_H

#include <stdint.h>

#include "decode.h"

#define IMF_MAX_SIZE 1024 /* largest output side */

typedef struct imf_transform {
    int32_t size;       /* output side S: images are (3, S, S) */
    double crop_pct;    /* eval: resize the shorter side to floor(S / crop_pct) */
    int random_crop;    /* training: random-resized-crop (else the eval geometry) */
    int hflip;          /* training: flip half of the images left-right */
    double scale_min;   /* random-resized-crop area fraction range (scale_min, 1) */
    float norm_scale[3], norm_bias[3]; /* out = byte * scale + bias = (byte/255 - mean) / std */
} imf_transform;

/* A box in full-size source pixels: left, top, width, height. */
typedef struct imf_crop {
    double x, y, w, h;
} imf_crop;

/* Sets the normalisation from per-channel mean and std (of [0, 1] values). */
void imf_transform_set_norm(imf_transform *t, const double mean[3], const double std[3]);

/* The training box and flip of one sample of a width x height image. */
void imf_train_crop(const imf_transform *t, uint64_t key, int32_t width, int32_t height,
                    imf_crop *crop, int *flip);
/* The evaluation box (resize + center crop) of a width x height image. */
void imf_eval_crop(const imf_transform *t, int32_t width, int32_t height, imf_crop *crop);

/* The smallest decode scale that keeps at least S source pixels across the
 * box in each direction (1 when the box is smaller than the output). */
double imf_crop_min_scale(const imf_transform *t, const imf_crop *crop);

/* Resamples `crop` (full-size coordinates, mapped onto img's decoded size)
 * to S x S, mirrored when flip, normalised, into out: 3 planes of S * S. */
void imf_resample(const imf_transform *t, const imf_image *img, const imf_crop *crop, int flip,
                  float *out);

#endif
