/* harness.c - see harness.h. */
#define _GNU_SOURCE /* mkdtemp */
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "safetensors.h"

const char harness_tiny_vit[] =
    "run: {steps: 8, batch_size: 8, eval_every: 0, peak_tflops: 0.5}\n"
    "model: {plugin: vit, dim: 16, depth: 1, heads: 2, mlp_dim: 32, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: adamw, lr: 1.0e-3}\n"
    "data: {plugin: synthetic, channels: 1, image_size: 8, num_classes: 4, train_size: 32,\n"
    "       eval_size: 8, workers: 0}\n";

char *harness_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)(n > 0 ? n : 0) + 1);
    size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
    if (buf) buf[got] = '\0';
    fclose(f);
    return buf;
}

char *harness_read(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return harness_slurp(path);
}

int harness_sh(const char *dir, const char *fmt, ...) {
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd %s && %s >%s/out 2>%s/err </dev/null", dir, args, dir, dir);
    int status = system(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double harness_json_number(const char *line, const char *key) {
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *p = strstr(line, pattern);
    return p ? strtod(p + strlen(pattern), NULL) : NAN;
}

int harness_mkdtemp(char *dir, size_t dir_len, const char *name) {
    int n = snprintf(dir, dir_len, "/tmp/vithost-test-%s-XXXXXX", name);
    if (n < 0 || (size_t)n >= dir_len) return -1;
    return mkdtemp(dir) ? 0 : -1;
}

int harness_rmdir(const char *dir) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int harness_write(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

float *harness_safetensors_f32(const char *path, int64_t *n, char *err, size_t err_len) {
    vh_st_file f;
    vh_diag d;
    memset(&f, 0, sizeof f);
    *n = 0;
    if (st_read(&f, path, &d) != VH_STATUS_OK) {
        snprintf(err, err_len, "%s", d.text);
        return NULL;
    }
    int64_t total = 0;
    for (int i = 0; i < f.count; i++) total += f.tensors[i].numel;
    float *v = malloc((size_t)(total > 0 ? total : 1) * sizeof *v);
    if (!v) snprintf(err, err_len, "%s: out of memory", path);
    int64_t at = 0;
    for (int i = 0; v && i < f.count; i++) {
        if (st_read_f32(&f, &f.tensors[i], v + at, f.tensors[i].numel, &d) != VH_STATUS_OK) {
            snprintf(err, err_len, "%s", d.text);
            free(v);
            v = NULL;
        } else {
            at += f.tensors[i].numel;
        }
    }
    st_free(&f);
    *n = v ? total : 0;
    return v;
}
