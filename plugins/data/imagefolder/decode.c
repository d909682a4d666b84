/* decode.c - JPEG (libjpeg API, libjpeg-turbo underneath) and PNG (libpng's
 * simplified png_image API) into RGB8. See decode.h. */
#define _POSIX_C_SOURCE 200809L
#include "decode.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

/* Files larger than this are refused before reading: no image of a data set
 * is a gigabyte, a device or a FIFO is not an image. */
#define MAX_FILE_BYTES ((size_t)1 << 30)

static void set_error(imf_decoder *dec, const char *fmt, ...) VH_PRINTF_LIKE(2, 3);
static void set_error(imf_decoder *dec, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dec->error, sizeof dec->error, fmt, ap);
    va_end(ap);
}

static vh_status fail_errno(imf_decoder *dec, const char *path, const char *what, int err) {
    char text[256];
    if (strerror_r(err, text, sizeof text) != 0) snprintf(text, sizeof text, "errno %d", err);
    set_error(dec, "%s: %s: %s", path, what, text);
    return VH_STATUS_ERR_IO;
}

void imf_decoder_init(imf_decoder *dec, vh_host *host) {
    memset(dec, 0, sizeof *dec);
    dec->host = host;
}

void imf_decoder_free(imf_decoder *dec) {
    if (!dec->host) return;
    dec->host->api->free(dec->host, dec->file);
    dec->host->api->free(dec->host, dec->pixels);
    dec->file = dec->pixels = NULL;
    dec->file_cap = dec->pixels_cap = 0;
}

/* Grows a scratch buffer to at least `need` bytes; its contents are lost. */
static int reserve(imf_decoder *dec, uint8_t **buf, size_t *cap, size_t need) {
    if (*cap >= need) return 1;
    size_t want = need + need / 4;
    if (want < need) want = need;
    uint8_t *p = dec->host->api->alloc(dec->host, want);
    if (!p) return 0;
    dec->host->api->free(dec->host, *buf);
    *buf = p;
    *cap = want;
    return 1;
}

static vh_status read_file(imf_decoder *dec, const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail_errno(dec, path, "cannot open", errno);
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        int err = errno;
        fclose(f);
        return fail_errno(dec, path, "cannot stat", err);
    }
    if (!S_ISREG(sb.st_mode)) {
        fclose(f);
        set_error(dec, "%s: not a regular file", path);
        return VH_STATUS_ERR_IO;
    }
    if (sb.st_size == 0 || (uint64_t)sb.st_size > MAX_FILE_BYTES) {
        fclose(f);
        set_error(dec, "%s: %s (%lld bytes)", path,
                  sb.st_size == 0 ? "empty file" : "file too large", (long long)sb.st_size);
        return VH_STATUS_ERR_FORMAT;
    }
    size_t n = (size_t)sb.st_size;
    if (!reserve(dec, &dec->file, &dec->file_cap, n)) {
        fclose(f);
        set_error(dec, "%s: out of memory for %zu bytes", path, n);
        return VH_STATUS_ERR_NOMEM;
    }
    size_t got = fread(dec->file, 1, n, f);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (got != n) {
        if (err) return fail_errno(dec, path, "read error", err);
        set_error(dec, "%s: read %zu of %zu bytes", path, got, n);
        return VH_STATUS_ERR_IO;
    }
    *size = n;
    return VH_STATUS_OK;
}

static vh_status check_size(imf_decoder *dec, const char *path, int64_t width, int64_t height,
                            const char *format) {
    if (width < 1 || height < 1 || width * height > IMF_MAX_PIXELS) {
        set_error(dec, "%s: %s of %lldx%lld pixels is %s (at most %lld pixels are decoded)", path,
                  format, (long long)width, (long long)height,
                  width < 1 || height < 1 ? "empty" : "too large", (long long)IMF_MAX_PIXELS);
        return VH_STATUS_ERR_FORMAT;
    }
    return VH_STATUS_OK;
}

/* ---- JPEG --------------------------------------------------------------- */

/* libjpeg reports errors through error_exit, which must not return: it
 * longjmps back to decode_jpeg. Warnings never print: a truncated file
 * (libjpeg would pad it with gray and carry on) is an error, the others
 * (e.g. "extraneous bytes before marker", common and harmless) a debug log. */
typedef struct jpeg_guard {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    imf_decoder *dec;
    const char *path;
} jpeg_guard;

static void jpeg_cb_error_exit(j_common_ptr cinfo) {
    jpeg_guard *g = (jpeg_guard *)cinfo->err;
    char msg[JMSG_LENGTH_MAX];
    g->pub.format_message(cinfo, msg);
    set_error(g->dec, "%s: corrupt JPEG: %s", g->path, msg);
    longjmp(g->jump, 1);
}

static void jpeg_cb_emit_message(j_common_ptr cinfo, int level) {
    jpeg_guard *g = (jpeg_guard *)cinfo->err;
    if (level >= 0) return; /* trace messages */
    char msg[JMSG_LENGTH_MAX];
    g->pub.format_message(cinfo, msg);
    if (g->pub.msg_code == JWRN_JPEG_EOF) {
        set_error(g->dec, "%s: truncated JPEG: %s", g->path, msg);
        longjmp(g->jump, 1);
    }
    /* Worker threads may not call the host: keep the first, the plugin logs it. */
    if (g->dec->warnings++ == 0)
        snprintf(g->dec->warning, sizeof g->dec->warning, "%s: %s", g->path, msg);
}

static void jpeg_cb_output_message(j_common_ptr cinfo) { (void)cinfo; }

/* Adobe CMYK JPEGs store inverted values; RGB = (1 - C)(1 - K) as PIL does. */
static void cmyk_to_rgb(uint8_t *pixels, size_t count, int inverted) {
    const uint8_t *in = pixels;
    uint8_t *out = pixels; /* writes trail reads: safe in place */
    for (size_t i = 0; i < count; i++, in += 4, out += 3) {
        unsigned c = in[0], m = in[1], y = in[2], k = in[3];
        if (!inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        out[0] = (uint8_t)((c * k + 127) / 255);
        out[1] = (uint8_t)((m * k + 127) / 255);
        out[2] = (uint8_t)((y * k + 127) / 255);
    }
}

static vh_status decode_jpeg(imf_decoder *dec, const char *path, size_t size, imf_plan_fn plan,
                             void *plan_ctx, imf_image *out) {
    struct jpeg_decompress_struct cinfo;
    jpeg_guard guard;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&guard.pub);
    guard.pub.error_exit = jpeg_cb_error_exit;
    guard.pub.emit_message = jpeg_cb_emit_message;
    guard.pub.output_message = jpeg_cb_output_message;
    guard.dec = dec;
    guard.path = path;
    if (setjmp(guard.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return VH_STATUS_ERR_FORMAT;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.mem->max_memory_to_use = IMF_MAX_JPEG_MEMORY;
    jpeg_mem_src(&cinfo, dec->file, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);

    int32_t full_w = (int32_t)cinfo.image_width, full_h = (int32_t)cinfo.image_height;
    /* libjpeg sizes its buffers by the full image, whatever the scale */
    if (check_size(dec, path, full_w, full_h, "JPEG") != VH_STATUS_OK) {
        jpeg_destroy_decompress(&cinfo);
        return VH_STATUS_ERR_FORMAT;
    }
    double min_scale = plan ? plan(plan_ctx, full_w, full_h) : 1.0;
    /* The smallest of 1/8, 1/4, 1/2 at or above min_scale, else full size:
     * libjpeg-turbo has SIMD IDCTs for these; 3/8, 5/8, 6/8 and 7/8 run
     * plain C and decode slower than the full size does. */
    unsigned num = 8;
    while (num > 1 && (double)(num / 2) / 8.0 >= min_scale) num /= 2;
    cinfo.scale_num = num;
    cinfo.scale_denom = 8;
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_calc_output_dimensions(&cinfo);

    int64_t w = cinfo.output_width, h = cinfo.output_height;
    vh_status st = check_size(dec, path, w, h, "JPEG");
    if (st == VH_STATUS_OK &&
        !reserve(dec, &dec->pixels, &dec->pixels_cap, (size_t)(w * h) * (cmyk ? 4u : 3u))) {
        set_error(dec, "%s: out of memory for %lldx%lld pixels", path, (long long)w, (long long)h);
        st = VH_STATUS_ERR_NOMEM;
    }
    if (st != VH_STATUS_OK) {
        jpeg_destroy_decompress(&cinfo);
        return st;
    }

    jpeg_start_decompress(&cinfo);
    size_t stride = (size_t)w * (size_t)cinfo.output_components;
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW rows[4];
        int n = 0;
        for (; n < 4 && cinfo.output_scanline + (JDIMENSION)n < cinfo.output_height; n++)
            rows[n] = dec->pixels + (size_t)(cinfo.output_scanline + (JDIMENSION)n) * stride;
        jpeg_read_scanlines(&cinfo, rows, (JDIMENSION)n);
    }
    int inverted = cinfo.saw_Adobe_marker;
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (cmyk) cmyk_to_rgb(dec->pixels, (size_t)(w * h), inverted);

    out->rgb = dec->pixels;
    out->width = (int32_t)w;
    out->height = (int32_t)h;
    out->full_width = full_w;
    out->full_height = full_h;
    return VH_STATUS_OK;
}

/* ---- PNG ---------------------------------------------------------------- */

static vh_status decode_png(imf_decoder *dec, const char *path, size_t size, imf_plan_fn plan,
                            void *plan_ctx, imf_image *out) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, dec->file, size)) {
        set_error(dec, "%s: corrupt PNG: %s", path, img.message);
        png_image_free(&img);
        return VH_STATUS_ERR_FORMAT;
    }
    int64_t w = img.width, h = img.height;
    vh_status st = check_size(dec, path, w, h, "PNG");
    if (st != VH_STATUS_OK) {
        png_image_free(&img);
        return st;
    }
    if (plan) (void)plan(plan_ctx, (int32_t)w, (int32_t)h); /* PNG has no reduced decode */
    int alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
    img.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    if (!reserve(dec, &dec->pixels, &dec->pixels_cap, (size_t)(w * h) * (alpha ? 4u : 3u))) {
        png_image_free(&img);
        set_error(dec, "%s: out of memory for %lldx%lld pixels", path, (long long)w, (long long)h);
        return VH_STATUS_ERR_NOMEM;
    }
    if (!png_image_finish_read(&img, NULL, dec->pixels, 0, NULL)) {
        set_error(dec, "%s: corrupt PNG: %s", path, img.message);
        png_image_free(&img);
        return VH_STATUS_ERR_FORMAT;
    }
    if (alpha) { /* RGBA -> RGB in place: the alpha channel is dropped */
        const uint8_t *in = dec->pixels;
        uint8_t *o = dec->pixels;
        for (int64_t i = 0; i < w * h; i++, in += 4, o += 3)
            o[0] = in[0], o[1] = in[1], o[2] = in[2];
    }
    out->rgb = dec->pixels;
    out->width = out->full_width = (int32_t)w;
    out->height = out->full_height = (int32_t)h;
    return VH_STATUS_OK;
}

/* ---- dispatch ----------------------------------------------------------- */

vh_status imf_decode(imf_decoder *dec, const char *path, imf_plan_fn plan, void *plan_ctx,
                     imf_image *out) {
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memset(out, 0, sizeof *out);
    dec->error[0] = '\0';
    size_t size = 0;
    vh_status st = read_file(dec, path, &size);
    if (st != VH_STATUS_OK) return st;
    const uint8_t *b = dec->file;
    if (size >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff)
        return decode_jpeg(dec, path, size, plan, plan_ctx, out);
    if (size >= 8 && memcmp(b, png_magic, 8) == 0)
        return decode_png(dec, path, size, plan, plan_ctx, out);
    set_error(dec, "%s: not a JPEG or PNG image (starts with %02x %02x %02x %02x)", path, b[0],
              size > 1 ? b[1] : 0, size > 2 ? b[2] : 0, size > 3 ? b[3] : 0);
    return VH_STATUS_ERR_FORMAT;
}
