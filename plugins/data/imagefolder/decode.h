/* decode.h - JPEG and PNG files into 8-bit RGB pixels.
 *
 * The file's first bytes decide the format, not its name (ImageNet has PNGs
 * named .JPEG). Grayscale, palette and 16-bit PNGs, grayscale and CMYK JPEGs
 * all come out as 3-channel RGB8; a PNG's alpha channel is dropped (as
 * PIL's convert("RGB") does).
 *
 * JPEGs decode at reduced size through libjpeg's DCT scaling when the caller
 * allows it: a plan callback sees the full size first and returns the
 * smallest scale it can use, and the decoder picks the smallest of 1/8, 1/4
 * and 1/2 at or above it (the scales libjpeg-turbo has SIMD code for; the
 * other n/8 are slower than a full decode). A 2000x1500 photo resized for a
 * 224 crop needs a quarter of its pixels, or fewer.
 *
 * A decoder is one thread's scratch (file bytes, pixels, error text); use one
 * per worker. Errors never print and never abort: the call returns a status
 * and dec->error holds one line that names the file. A decoder never calls
 * the host but for alloc/free (it runs on prefetch workers): libjpeg's
 * warnings are counted in dec->warnings, the first kept in dec->warning, for
 * the plugin to log from its own thread.
 */
#ifndef IMAGEFOLDER_DECODE_H
#define IMAGEFOLDER_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_host.h"

/* Decoded pixels: height rows of width * 3 bytes, R G B. */
typedef struct imf_image {
    const uint8_t *rgb;
    int32_t width, height;
    /* The full size of the file's image; larger than width/height when the
     * JPEG was decoded at a reduced scale. */
    int32_t full_width, full_height;
} imf_image;

/* Given the image's full size, the smallest scale (0, 1] the caller can use. */
typedef double (*imf_plan_fn)(void *ctx, int32_t full_width, int32_t full_height);

typedef struct imf_decoder {
    vh_host *host; /* allocations only (thread-safe) */
    uint8_t *file;
    size_t file_cap;
    uint8_t *pixels;
    size_t pixels_cap;
    char error[1024];  /* "<path>: <what went wrong>" after a failure */
    int64_t warnings;  /* libjpeg warnings since the caller last reset it */
    char warning[512]; /* "<path>: <message>" of the first of them */
} imf_decoder;

/* Images larger than this many pixels (8192 x 8192) are refused, as their
 * header says before decoding and as decoded (a corrupt header must not ask
 * for gigabytes); libjpeg's own buffers are capped at IMF_MAX_JPEG_MEMORY,
 * what a progressive JPEG of that size needs (its coefficients, 2 bytes
 * each, 3 components). */
#define IMF_MAX_PIXELS ((int64_t)1 << 26)
#define IMF_MAX_JPEG_MEMORY ((long)(IMF_MAX_PIXELS * 6 + (64L << 20)))

void imf_decoder_init(imf_decoder *dec, vh_host *host);
void imf_decoder_free(imf_decoder *dec);

/* Reads and decodes `path`. plan may be NULL (full size). On success *out
 * points into the decoder's scratch, valid until its next decode. */
vh_status imf_decode(imf_decoder *dec, const char *path, imf_plan_fn plan, void *plan_ctx,
                     imf_image *out);

#endif
