/* fuzz_image.c - the imagefolder plugin's JPEG and PNG decoding (decode.c).
 *
 * Input: one byte picking the reduced-size plan (0: full size; k: the
 * caller can use a scale of k/255, so JPEGs may decode at 1/2, 1/4 or 1/8),
 * then the image file's bytes. The decoder is compiled in (it is the
 * plugin's own file) and runs against a host that only allocates, as on a
 * prefetch worker. Accepted images must be as large as their pixels say.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "fuzz_util.h"

static void *fake_alloc(vh_host *host, size_t bytes) {
    (void)host;
    return malloc(bytes ? bytes : 1);
}
static void fake_free(vh_host *host, void *ptr) {
    (void)host;
    free(ptr);
}
static const vh_host_api fake_api = {
    .struct_size = sizeof(vh_host_api),
    .abi_major = VH_ABI_MAJOR,
    .abi_minor = VH_ABI_MINOR,
    .alloc = fake_alloc,
    .free = fake_free,
};
static vh_host fake_host = {.api = &fake_api};
static imf_decoder dec;
static char path[4200];

static double plan_scale(void *ctx, int32_t full_width, int32_t full_height) {
    (void)full_width, (void)full_height;
    return *(const double *)ctx;
}

static void decoder_free(void) { imf_decoder_free(&dec); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(path, sizeof path, "%s/image", fuzz_scratch_dir());
    imf_decoder_init(&dec, &fake_host);
    atexit(decoder_free);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    double scale = data[0] / 255.0;
    fuzz_write_file(fuzz_scratch_dir(), "image", data + 1, size - 1);
    imf_image img;
    memset(&img, 0, sizeof img);
    dec.error[0] = '\0';
    vh_status st = imf_decode(&dec, path, data[0] ? plan_scale : NULL, &scale, &img);
    if (st != VH_STATUS_OK) {
        fuzz_require(dec.error[0] != '\0', "imf_decode failed without a message", NULL);
        return 0;
    }
    fuzz_require(img.width > 0 && img.height > 0 && img.full_width >= img.width &&
                     img.full_height >= img.height,
                 "decoded image has an impossible size", NULL);
    fuzz_require((int64_t)img.width * img.height <= IMF_MAX_PIXELS, "image over the pixel limit",
                 NULL);
    /* Read every byte: ASan checks the buffer holds what the size says. */
    unsigned sum = 0;
    size_t bytes = (size_t)img.width * (size_t)img.height * 3;
    for (size_t i = 0; i < bytes; i++) sum += img.rgb[i];
    volatile unsigned sink = sum;
    (void)sink;
    return 0;
}
