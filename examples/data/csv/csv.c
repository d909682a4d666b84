/* csv.c - images from CSV files: one sample per row, `label,p0,p1,...`.
 *
 *     data: {plugin: csv, train: train.csv, eval: test.csv,
 *            channels: 1, height: 28, width: 28, num_classes: 10}
 *
 * Each row is a label in [0, num_classes) and channels * height * width
 * pixels, integers in 0..255, plane after plane, row after row (the layout
 * of the Kaggle "fashion-mnist_train.csv"). A first line whose first field
 * is not a number is a header and is skipped; empty lines are skipped. The
 * files are read once, at create, into 8-bit memory; a pixel p becomes
 * (p / 255 - mean) / std. Any fault names the file, line and field.
 *
 * Passes, shuffling, the per-rank split, batches and prefetching are the
 * SDK's (vh_data_pass, with its ready fill for 8-bit images).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vithost/vithost.h>

typedef struct csv_data {
    vh_data_pass *pass; /* first: the VH_DATA_PASS_VTABLE entries find it here */
    vh_host *host;
    vh_data_pass_u8 u8; /* the samples, for vh_data_pass_fill_u8 */
    float *lut;         /* (channels, 256) */
    int64_t sizes[2];
} csv_data;

static const vh_config_key schema[] = {
    {"train", VH_CONFIG_TYPE_PATH, NULL, "CSV of the training split", NULL, 0, 0, 0},
    {"eval", VH_CONFIG_TYPE_PATH, NULL, "CSV of the evaluation split (none: no evaluation)",
     NULL, 0, 0, VH_CONFIG_KEY_FLAG_OPTIONAL},
    {"channels", VH_CONFIG_TYPE_INT, "1", "image channels", NULL, 1, 4, 0},
    {"height", VH_CONFIG_TYPE_INT, "28", "image height", NULL, 1, 4096, 0},
    {"width", VH_CONFIG_TYPE_INT, "28", "image width", NULL, 1, 4096, 0},
    {"num_classes", VH_CONFIG_TYPE_INT, "10", "labels are 0..num_classes-1", NULL, 2, 256, 0},
    {"mean", VH_CONFIG_TYPE_FLOAT, "0.2860", "mean of p / 255 (Fashion-MNIST's)", NULL, 0, 1, 0},
    {"std", VH_CONFIG_TYPE_FLOAT, "0.3530", "std of p / 255, > 0", NULL, 0, 10, 0},
    {"workers", VH_CONFIG_TYPE_INT, "1", "threads filling batches ahead; 0: inside next", NULL,
     0, 16, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

/* The whole file, NUL-terminated, from host->api->alloc; NULL after fail. */
static char *read_file(vh_host *host, const char *path, vh_status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = host->api->fail(host, VH_STATUS_ERR_IO, "cannot open %s: %s", path,
                              strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = host->api->alloc(host, (size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        *st = host->api->fail(host, buf ? VH_STATUS_ERR_IO : VH_STATUS_ERR_NOMEM,
                              "cannot read %s%s", path, buf ? "" : ": out of memory");
        host->api->free(host, buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *st = VH_STATUS_OK;
    return buf;
}

/* Parses one split: counts the rows, then fills pixels and labels. */
static vh_status load_split(csv_data *d, const char *path, vh_split split, int64_t chw,
                            int64_t classes) {
    vh_host *host = d->host;
    vh_status st;
    char *text = read_file(host, path, &st);
    if (!text) return st;
    int64_t rows = 0;
    for (const char *p = text; *p; p++)
        if (*p == '\n' || (p[1] == '\0')) rows++;
    d->u8.pixels[split] = host->api->alloc(host, (size_t)(rows * chw) + 1);
    d->u8.labels[split] = host->api->alloc(host, (size_t)rows + 1);
    if (!d->u8.pixels[split] || !d->u8.labels[split]) {
        host->api->free(host, text);
        return host->api->fail(host, VH_STATUS_ERR_NOMEM, "%s: out of memory for %lld rows", path,
                               (long long)rows);
    }
    int64_t n = 0, line = 0;
    char *p = text;
    st = VH_STATUS_OK;
    while (*p && st == VH_STATUS_OK) {
        line++;
        char *end_of_line = strchr(p, '\n');
        char *next = end_of_line ? end_of_line + 1 : p + strlen(p);
        if (end_of_line) *end_of_line = '\0';
        while (*p == ' ' || *p == '\r') p++;
        if (*p == '\0') {
            p = next;
            continue;
        }
        if (n == 0 && line == 1 && !(*p >= '0' && *p <= '9')) { /* a header */
            p = next;
            continue;
        }
        uint8_t *px = d->u8.pixels[split] + n * chw;
        for (int64_t f = 0; f <= chw && st == VH_STATUS_OK; f++) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            while (*end == ' ' || *end == '\r') end++;
            const char want = f < chw ? ',' : '\0';
            if (end == p || errno || *end != want) {
                st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                     "%s:%lld: field %lld: expected %s followed by %s, found '%.20s'",
                                     path, (long long)line, (long long)f + 1,
                                     f == 0 ? "an integer label" : "an integer pixel",
                                     f < chw ? "','" : "the end of the line (a row has the label "
                                                       "and channels*height*width pixels)",
                                     p);
            } else if (f == 0 && (v < 0 || v >= classes)) {
                st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                     "%s:%lld: label %ld is not in [0, %lld) (num_classes)", path,
                                     (long long)line, v, (long long)classes);
            } else if (f > 0 && (v < 0 || v > 255)) {
                st = host->api->fail(host, VH_STATUS_ERR_FORMAT,
                                     "%s:%lld: pixel %lld is %ld, not in 0..255", path,
                                     (long long)line, (long long)f, v);
            } else if (f == 0) {
                d->u8.labels[split][n] = (uint8_t)v;
            } else {
                px[f - 1] = (uint8_t)v;
            }
            p = end + (*end == ',');
        }
        n++;
        p = next;
    }
    host->api->free(host, text);
    if (st == VH_STATUS_OK && n == 0)
        st = host->api->fail(host, VH_STATUS_ERR_FORMAT, "%s has no rows", path);
    d->sizes[split] = n;
    return st;
}

static void csv_destroy(void *self) {
    csv_data *d = self;
    if (!d) return;
    vh_data_pass_free(d->pass); /* joins the workers before their data goes */
    vh_data_pass_u8_free(d->host, &d->u8);
    d->host->api->free(d->host, d->lut);
    d->host->api->free(d->host, d);
}

static vh_status csv_create(vh_host *host, const vh_data_setup *setup, void **self) {
    const vh_host_api *api = host->api;
    *self = NULL;
    const char *train, *eval = NULL;
    int64_t channels, height, width, classes, workers;
    double mean, std;
    vh_status st;
    if ((st = api->config_string(host, "train", &train)) != VH_STATUS_OK ||
        (api->config_has(host, "eval") &&
         (st = api->config_string(host, "eval", &eval)) != VH_STATUS_OK) ||
        (st = api->config_int(host, "channels", &channels)) != VH_STATUS_OK ||
        (st = api->config_int(host, "height", &height)) != VH_STATUS_OK ||
        (st = api->config_int(host, "width", &width)) != VH_STATUS_OK ||
        (st = api->config_int(host, "num_classes", &classes)) != VH_STATUS_OK ||
        (st = api->config_float(host, "mean", &mean)) != VH_STATUS_OK ||
        (st = api->config_float(host, "std", &std)) != VH_STATUS_OK ||
        (st = api->config_int(host, "workers", &workers)) != VH_STATUS_OK)
        return st;
    if (std <= 0.0) return api->config_fail(host, "std", "must be > 0, not %g", std);

    csv_data *d = api->alloc(host, sizeof *d);
    if (!d) return api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    memset(d, 0, sizeof *d);
    d->host = host;
    const int64_t chw = channels * height * width;
    d->lut = api->alloc(host, (size_t)channels * 256 * sizeof(float));
    if (!d->lut) st = api->fail(host, VH_STATUS_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; st == VH_STATUS_OK && i < channels * 256; i++)
        d->lut[i] = (float)(((double)(i % 256) / 255.0 - mean) / std);
    if (st == VH_STATUS_OK) st = load_split(d, train, VH_SPLIT_TRAIN, chw, classes);
    if (st == VH_STATUS_OK && eval) st = load_split(d, eval, VH_SPLIT_EVAL, chw, classes);
    if (st == VH_STATUS_OK) {
        d->u8.planes = (int32_t)channels;
        d->u8.rows = (int32_t)height;
        d->u8.cols = (int32_t)width;
        d->u8.lut = d->lut;
        vh_data_pass_setup ps;
        memset(&ps, 0, sizeof ps);
        ps.struct_size = sizeof ps;
        ps.name = "csv";
        ps.state_magic = 0x56534356u; /* "VCSV" */
        ps.data = setup;
        ps.train_size = d->sizes[VH_SPLIT_TRAIN];
        ps.eval_size = d->sizes[VH_SPLIT_EVAL];
        ps.eval_missing = "(set data.eval to a CSV file)";
        ps.channels = (int32_t)channels;
        ps.height = (int32_t)height;
        ps.width = (int32_t)width;
        ps.num_classes = (int32_t)classes;
        ps.workers = (int32_t)workers;
        ps.depth = 4;
        ps.fill = vh_data_pass_fill_u8;
        ps.ctx = &d->u8;
        st = vh_data_pass_init(host, &ps, &d->pass);
    }
    if (st != VH_STATUS_OK) {
        csv_destroy(d);
        return st;
    }
    *self = d;
    return VH_STATUS_OK;
}

static const vh_data_vtable vtable = {VH_DATA_PASS_VTABLE, .create = csv_create,
                                      .destroy = csv_destroy};

VH_PLUGIN_DEFINE(VH_ROLE_DATA, "csv", "0.1.0", "images from CSV rows: label, then 0..255 pixels",
                 schema, vtable);
