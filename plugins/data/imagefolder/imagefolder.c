/* imagefolder.c - the `imagefolder` data plugin: ImageNet-style class folders
 * of JPEG and PNG images.
 *
 *     data: {plugin: imagefolder, root: /data/imagenet}
 *
 * reads root/train/<class>/<image> and root/val/<class>/<image>.
 *
 * This file is the glue: schema and config, the scan (scan.c), and the fill
 * that decodes (decode.c) and transforms (transform.c) each sample of a batch
 * straight into its prefetch slot. The passes (per-rank order, worker
 * threads, batches handed out without a copy, the resumable position) are
 * vh_data_pass's.
 *
 * Each worker fills whole batches, so up to `workers` batches are decoded at
 * once; the random draws of a sample come from vh_sampler_sample_key (seed,
 * split, epoch, sample index), so batches do not depend on the worker count.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "decode.h"
#include "scan.h"
#include "transform.h"
#include "vithost/vh_config.h"
#include "vithost/vh_data.h"
#include "vithost/vh_data_pass.h"
#include "vithost/vh_host.h"
#include "vithost/vh_plugin.h"
#include "vithost/vh_sampler.h"

#define PATH_CAP 4096

static const vh_config_key schema[] = {
    {"root", VH_CONFIG_TYPE_PATH, NULL,
     "folder holding <train_dir>/<class>/* and <eval_dir>/<class>/*", NULL, 0, 0, 0},
    {"train_dir", VH_CONFIG_TYPE_STRING, "train", "training split: a folder of root", NULL, 0, 0,
     0},
    {"eval_dir", VH_CONFIG_TYPE_STRING, "val",
     "evaluation split: a folder of root (may be absent: no evaluation)", NULL, 0, 0, 0},
    {"image_size", VH_CONFIG_TYPE_INT, "224", "side of the square images handed out", NULL, 8,
     IMF_MAX_SIZE, 0},
    {"crop_pct", VH_CONFIG_TYPE_FLOAT, "0.875",
     "eval: resize the shorter side to image_size / crop_pct, then center-crop", NULL, 0.05, 1, 0},
    {"random_resized_crop", VH_CONFIG_TYPE_BOOL, "true",
     "train: random-resized-crop (scale (crop_scale_min, 1), ratio (3/4, 4/3)); else the eval "
     "resize + center crop",
     NULL, 0, 0, 0},
    {"crop_scale_min", VH_CONFIG_TYPE_FLOAT, "0.08",
     "train: smallest area fraction of a random-resized-crop", NULL, 0.01, 1, 0},
    {"hflip", VH_CONFIG_TYPE_BOOL, "true", "train: flip half of the images left-right", NULL, 0, 0,
     0},
    {"mean", VH_CONFIG_TYPE_STRING, "0.485,0.456,0.406",
     "per-channel mean of [0, 1] pixels, subtracted: \"R,G,B\" (quoted in a {flow} mapping) "
     "or R G B",
     NULL, 0, 0, 0},
    {"std", VH_CONFIG_TYPE_STRING, "0.229,0.224,0.225",
     "per-channel standard deviation, divided by: \"R,G,B\" or R G B, each > 0", NULL, 0, 0, 0},
    {"workers", VH_CONFIG_TYPE_INT, "2",
     "decoding threads, each filling whole batches; 0: decode inside next", NULL, 0, 64, 0},
    {"prefetch", VH_CONFIG_TYPE_INT, "0",
     "batch slots (filled ahead + the one handed out); 0: workers + 2", NULL, 0, 256, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* One worker's scratch. */
typedef struct imf_worker {
    imf_decoder dec;
    char path[PATH_CAP];
} imf_worker;

typedef struct imagefolder {
    vh_data_pass *pass; /* first: the VH_DATA_PASS_VTABLE entries find it here */
    vh_host *host;

    imf_transform tf;
    int32_t workers, depth;
    imf_classes classes;
    imf_split train, eval;
    int has_eval;
    char eval_path[PATH_CAP];
    char no_eval[PATH_CAP + 32]; /* why there is no evaluation split */

    imf_worker *scratch; /* max(workers, 1) */
    int32_t num_scratch;
} imagefolder;

/* ---- config ------------------------------------------------------------ */

/* Three numbers separated by commas and/or spaces: "0.485,0.456,0.406". */
static vh_status parse_rgb(vh_host *host, const char *key, int positive, double out[3]) {
    const char *text;
    vh_status st = host->api->config_string(host, key, &text);
    if (st != VH_STATUS_OK) return st;
    const char *p = text;
    int n = 0, comma = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\0') break;
        if (*p == ',') {
            if (comma || n == 0) break; /* an empty item: error below */
            comma = 1;
            p++;
            continue;
        }
        char *end;
        double v = strtod(p, &end);
        if (end == p || n == 3 || !isfinite(v)) {
            n = -1;
            break;
        }
        if (positive && !(v > 0))
            return host->api->config_fail(host, key, "'%s': every value must be > 0", text);
        out[n++] = v;
        comma = 0;
        p = end;
    }
    if (n != 3 || comma || *p != '\0')
        return host->api->config_fail(host, key,
                                      "'%s' is not three numbers R,G,B such as \"%s\"", text,
                                      positive ? "0.229,0.224,0.225" : "0.485,0.456,0.406");
    return VH_STATUS_OK;
}

static vh_status read_config(imagefolder *d, const char **root, const char **train_dir,
                             const char **eval_dir) {
    vh_host *host = d->host;
    int64_t size, workers, depth;
    double crop_pct, scale_min, mean[3], std[3];
    int rrc, hflip;
    vh_status st;
    if ((st = host->api->config_string(host, "root", root)) != VH_STATUS_OK ||
        (st = host->api->config_string(host, "train_dir", train_dir)) != VH_STATUS_OK ||
        (st = host->api->config_string(host, "eval_dir", eval_dir)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "image_size", &size)) != VH_STATUS_OK ||
        (st = host->api->config_float(host, "crop_pct", &crop_pct)) != VH_STATUS_OK ||
        (st = host->api->config_bool(host, "random_resized_crop", &rrc)) != VH_STATUS_OK ||
        (st = host->api->config_float(host, "crop_scale_min", &scale_min)) != VH_STATUS_OK ||
        (st = host->api->config_bool(host, "hflip", &hflip)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "workers", &workers)) != VH_STATUS_OK ||
        (st = host->api->config_int(host, "prefetch", &depth)) != VH_STATUS_OK)
        return st;
    if ((st = parse_rgb(host, "mean", 0, mean)) != VH_STATUS_OK) return st;
    if ((st = parse_rgb(host, "std", 1, std)) != VH_STATUS_OK) return st;

    /* The host checked the schema ranges; these guard what the code relies on. */
    if (size < 8 || size > IMF_MAX_SIZE)
        return host->api->config_fail(host, "image_size", "%lld is outside [8, %d]",
                                      (long long)size, IMF_MAX_SIZE);
    if (!(crop_pct > 0 && crop_pct <= 1))
        return host->api->config_fail(host, "crop_pct", "%g is outside (0, 1]", crop_pct);
    if (!(scale_min > 0 && scale_min <= 1))
        return host->api->config_fail(host, "crop_scale_min", "%g is outside (0, 1]", scale_min);
    if (workers < 0 || workers > 64)
        return host->api->config_fail(host, "workers", "%lld is outside [0, 64]",
                                      (long long)workers);
    if (depth < 0 || depth > 256)
        return host->api->config_fail(host, "prefetch", "%lld is outside [0, 256]",
                                      (long long)depth);
    if (**train_dir == '\0')
        return host->api->config_fail(host, "train_dir", "must name a folder of root");

    d->tf.size = (int32_t)size;
    d->tf.crop_pct = crop_pct;
    d->tf.random_crop = rrc;
    d->tf.hflip = hflip;
    d->tf.scale_min = scale_min;
    imf_transform_set_norm(&d->tf, mean, std);
    d->workers = (int32_t)workers;
    d->depth = depth ? (int32_t)depth : (int32_t)workers + 2;
    return VH_STATUS_OK;
}

/* ---- scanning ---------------------------------------------------------- */

static vh_status scan(imagefolder *d, const char *root, const char *train_dir,
                      const char *eval_dir) {
    vh_host *host = d->host;
    struct stat sb;
    if (stat(root, &sb) != 0)
        return host->api->config_fail(host, "root", "cannot open the folder %s: %s", root,
                                      strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return host->api->config_fail(host, "root", "%s is not a folder", root);

    char path[PATH_CAP];
    if (snprintf(path, sizeof path, "%s/%s", root, train_dir) >= (int)sizeof path)
        return host->api->config_fail(host, "root", "path too long");
    int missing = 0;
    vh_status st = imf_scan_classes(host, path, &d->classes, &missing);
    if (st != VH_STATUS_OK && missing)
        return host->api->config_fail(host, "train_dir",
                                      "the training split %s does not exist (expected "
                                      "%s/<class>/<image>.jpg)",
                                      path, path);
    if (st != VH_STATUS_OK) return st;
    if ((st = imf_scan_split(host, path, &d->classes, &d->train)) != VH_STATUS_OK) return st;

    d->has_eval = 0;
    snprintf(d->no_eval, sizeof d->no_eval, "(eval_dir is empty)");
    if (*eval_dir) {
        if (snprintf(d->eval_path, sizeof d->eval_path, "%s/%s", root, eval_dir) >=
            (int)sizeof d->eval_path)
            return host->api->config_fail(host, "root", "path too long");
        if (stat(d->eval_path, &sb) == 0) {
            st = imf_scan_split(host, d->eval_path, &d->classes, &d->eval);
            if (st != VH_STATUS_OK) return st;
            d->has_eval = 1;
        } else {
            snprintf(d->no_eval, sizeof d->no_eval, "%s does not exist", d->eval_path);
            host->api->log(host, VH_LOG_LEVEL_WARN,
                           "no evaluation split: %s does not exist (evaluation will fail)",
                           d->eval_path);
        }
    }
    host->api->log(host, VH_LOG_LEVEL_INFO,
                   "%d classes; %lld training images in %s, %lld evaluation images%s%s",
                   (int)d->classes.count, (long long)d->train.count, d->train.dir,
                   (long long)d->eval.count, d->has_eval ? " in " : "",
                   d->has_eval ? d->eval.dir : "");
    int64_t skipped = d->train.skipped + d->eval.skipped;
    if (skipped)
        host->api->log(host, VH_LOG_LEVEL_INFO,
                       "skipped %lld files that are not .jpg, .jpeg or .png", (long long)skipped);
    return VH_STATUS_OK;
}

/* ---- filling a batch (worker threads) ------------------------------------ */

typedef struct plan_ctx {
    const imf_transform *tf;
    int train;
    uint64_t key;
    imf_crop crop;
    int flip;
} plan_ctx;

/* Called by the decoder with the image's full size: draws the crop, returns
 * the decode scale it allows. */
static double plan_crop(void *ctx, int32_t width, int32_t height) {
    plan_ctx *pc = ctx;
    pc->flip = 0;
    if (pc->train)
        imf_train_crop(pc->tf, pc->key, width, height, &pc->crop, &pc->flip);
    else
        imf_eval_crop(pc->tf, width, height, &pc->crop);
    return imf_crop_min_scale(pc->tf, &pc->crop);
}

static vh_status fill_batch(void *ctx, const vh_data_pass_batch *b, char *err, size_t err_len) {
    imagefolder *d = ctx;
    imf_worker *w = &d->scratch[b->worker];
    const int train = b->split == VH_SPLIT_TRAIN;
    const imf_split *split = train ? &d->train : &d->eval;
    const size_t chw = (size_t)3 * (size_t)d->tf.size * (size_t)d->tf.size;
    for (int64_t j = 0; j < b->count; j++) {
        int64_t i = b->samples[j];
        const char *rel = split->paths.text + split->path_at[i];
        if (snprintf(w->path, sizeof w->path, "%s/%s", split->dir, rel) >= (int)sizeof w->path) {
            snprintf(err, err_len, "%s/%s: path too long", split->dir, rel);
            return VH_STATUS_ERR_IO;
        }
        plan_ctx pc = {&d->tf, train, vh_sampler_sample_key(b->sampler, i), {0, 0, 0, 0}, 0};
        imf_image img;
        vh_status st = imf_decode(&w->dec, w->path, plan_crop, &pc, &img);
        if (st != VH_STATUS_OK) {
            snprintf(err, err_len, "%s", w->dec.error);
            return st;
        }
        imf_resample(&d->tf, &img, &pc.crop, pc.flip, b->images + (size_t)j * chw);
        b->labels[j] = split->label[i];
    }
    return VH_STATUS_OK;
}

/* ---- the vtable ---------------------------------------------------------- */

/* The workers are stopped: log the JPEG warnings they counted. */
static void log_warnings(void *ctx) {
    imagefolder *d = ctx;
    for (int32_t k = 0; k < d->num_scratch; k++) {
        imf_decoder *dec = &d->scratch[k].dec;
        if (dec->warnings)
            d->host->api->log(d->host, VH_LOG_LEVEL_DEBUG,
                              "%lld JPEG warning(s) in worker %d, the first: %s",
                              (long long)dec->warnings, (int)k, dec->warning);
        dec->warnings = 0;
    }
}

/* What a resumable position must match beyond the sampler's setup. */
static uint32_t data_set_tag(const imagefolder *d) {
    const int64_t v[3] = {d->classes.count, d->train.count, d->eval.count};
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the three counts */
    for (int k = 0; k < 3; k++) h = (h ^ (uint64_t)v[k]) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32)) | 1u;
}

static void data_destroy(void *self) {
    imagefolder *d = self;
    if (!d) return;
    vh_host *host = d->host;
    vh_data_pass_free(d->pass); /* joins the workers first */
    for (int32_t k = 0; k < d->num_scratch; k++) imf_decoder_free(&d->scratch[k].dec);
    host->api->free(host, d->scratch);
    imf_split_free(host, &d->train);
    imf_split_free(host, &d->eval);
    imf_classes_free(host, &d->classes);
    host->api->free(host, d);
}

static vh_status create_parts(imagefolder *d, const vh_data_setup *setup) {
    vh_host *host = d->host;
    const char *root, *train_dir, *eval_dir;
    vh_status st = read_config(d, &root, &train_dir, &eval_dir);
    if (st != VH_STATUS_OK) return st;
    if ((st = scan(d, root, train_dir, eval_dir)) != VH_STATUS_OK) return st;

    int32_t n = d->workers > 0 ? d->workers : 1;
    d->scratch = host->api->alloc(host, (size_t)n * sizeof *d->scratch);
    if (!d->scratch) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    for (int32_t k = 0; k < n; k++) imf_decoder_init(&d->scratch[k].dec, host);
    d->num_scratch = n;

    vh_data_pass_setup ps = {.struct_size = sizeof ps, .name = "imagefolder",
                             .state_magic = 0x53464d49u /* "IMFS" */,
                             .state_tag = data_set_tag(d), .data = setup,
                             .train_size = d->train.count,
                             .eval_size = d->has_eval ? d->eval.count : 0,
                             .eval_missing = d->no_eval, .channels = 3, .height = d->tf.size,
                             .width = d->tf.size, .num_classes = d->classes.count,
                             .workers = d->workers, .depth = d->depth, .fill = fill_batch,
                             .stopped = log_warnings, .ctx = d};
    st = vh_data_pass_init(host, &ps, &d->pass);
    /* RandAugment's colour ops need the normalised values of bytes 0 and 255 */
    float black[3], white[3];
    for (int c = 0; c < 3; c++) {
        black[c] = d->tf.norm_bias[c];
        white[c] = 255.0f * d->tf.norm_scale[c] + d->tf.norm_bias[c];
    }
    return st == VH_STATUS_OK ? vh_data_pass_set_range(d->pass, black, white) : st;
}

static vh_status data_create(vh_host *host, const vh_data_setup *setup, void **self) {
    if (!host || !self) return VH_STATUS_ERR_INVALID_ARG;
    *self = NULL;
    /* A setup of an older minor reads with its missing members zero. */
    vh_data_setup setup_v;
    if (!vh_struct_upgrade(&setup_v, sizeof setup_v, setup))
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "data setup missing");
    setup = &setup_v;
    if (setup->world_size < 1 || setup->rank < 0 || setup->rank >= setup->world_size)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "rank %d of world %d is invalid",
                               (int)setup->rank, (int)setup->world_size);
    if (setup->batch_size < 1)
        return host->api->fail(host, VH_STATUS_ERR_INVALID_ARG, "batch size %lld must be >= 1",
                               (long long)setup->batch_size);
    imagefolder *d = host->api->alloc(host, sizeof *d);
    if (!d) return host->api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    vh_status st = create_parts(d, setup);
    if (st != VH_STATUS_OK) {
        data_destroy(d);
        return st;
    }
    *self = d;
    return VH_STATUS_OK;
}

static const vh_data_vtable vtable = {VH_DATA_PASS_VTABLE, .create = data_create,
                                      .destroy = data_destroy};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "imagefolder", "0.1.0",
                 "ImageNet-style class folders of JPEG/PNG images, decoded and augmented",
                 schema, vtable);
