/* fuzz_util.c - see fuzz_util.h. */
#define _POSIX_C_SOURCE 200809L
#include "fuzz_util.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char scratch[4096];

static void scratch_remove(void) {
    DIR *dir = opendir(scratch);
    if (!dir) return;
    struct dirent *e;
    char path[8192];
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", scratch, e->d_name);
        unlink(path);
    }
    closedir(dir);
    rmdir(scratch);
}

const char *fuzz_scratch_dir(void) {
    if (scratch[0]) return scratch;
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/vh-fuzz-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(scratch)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(scratch_remove);
    return scratch;
}

void fuzz_write_file(const char *dir, const char *name, const void *bytes, size_t size) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(bytes, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

void fuzz_require(int cond, const char *what, const char *detail) {
    if (cond) return;
    fprintf(stderr, "fuzz: FINDING: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* The host's log, formatted but not printed: a line per input would slow
 * fuzzing and bury findings. */
static void quiet_log(vh_host *host, vh_log_level level, const char *fmt, ...) {
    (void)host, (void)level;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
}

void fuzz_data_open(fuzz_data_run *r, const char *data_section) {
    memset(r, 0, sizeof *r);
    char recipe[4096];
    snprintf(recipe, sizeof recipe,
             "run: {seed: 1}\n"
             "model: {plugin: test_model}\n"
             "precision: {plugin: test_precision}\n"
             "sharding: {plugin: test_sharding}\n"
             "optim: {plugin: test_optim}\n"
             "data: %s\n",
             data_section);
    setenv("VITHOST_PLUGIN_PATH", VH_FUZZ_PLUGIN_DIR, 1);
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stderr};
    if (run_open_text(&r->run, "fuzz.yaml", recipe, &opts, &d) != VH_STATUS_OK) {
        fprintf(stderr, "fuzz: cannot open the run: %s\n", d.text);
        abort();
    }
    r->vt = r->run.plugins[VH_ROLE_DATA].desc->vtable;
    static vh_host_api quiet_api;
    quiet_api = vh_host_api_table;
    quiet_api.log = quiet_log;
    r->run.hosts[VH_ROLE_DATA].pub.api = &quiet_api;
    r->host = &r->run.hosts[VH_ROLE_DATA].pub;
}

/* The first batch of a split, when there is one: converts real pixels. */
static void first_batch(fuzz_data_run *r, void *self, vh_split split) {
    vh_data_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    fuzz_require(r->vt->info(self, &info) == VH_STATUS_OK, "info failed after create", NULL);
    fuzz_require(info.channels > 0 && info.height > 0 && info.width > 0 && info.num_classes > 0,
                 "info after create has an empty shape", NULL);
    if (r->vt->start_epoch(self, split, 0) != VH_STATUS_OK) return;
    vh_batch batch;
    memset(&batch, 0, sizeof batch);
    int has = 0;
    (void)r->vt->next(self, &batch, &has);
}

vh_status fuzz_data_cycle(fuzz_data_run *r) {
    vh_host_impl *h = &r->run.hosts[VH_ROLE_DATA];
    h->error[0] = '\0';
    vh_data_setup setup = {.struct_size = sizeof setup, .rank = 0, .world_size = 1,
                           .batch_size = 2, .seed = 1};
    void *self = NULL;
    vh_status st = r->vt->create(r->host, &setup, &self);
    if (st != VH_STATUS_OK) {
        fuzz_require(self == NULL, "create failed but returned an instance", h->error);
        fuzz_require(h->error[0] != '\0', "create failed without a message", NULL);
        return st;
    }
    first_batch(r, self, VH_SPLIT_TRAIN);
    first_batch(r, self, VH_SPLIT_EVAL);
    r->vt->destroy(self);
    return st;
}

#ifdef VH_FUZZ_LIBFUZZER
/* libFuzzer keeps a pointer to every instrumented module's counters and
 * clears them before each input; a plugin the loader dlclose()s (a search
 * path probe, a run closed) would leave it writing to unmapped memory. The
 * libFuzzer binaries therefore never unload a module: this definition in
 * the executable takes the place of libc's for the host's calls. */
int dlclose(void *handle);
int dlclose(void *handle) {
    (void)handle;
    return 0;
}
#endif
