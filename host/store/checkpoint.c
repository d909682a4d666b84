/* checkpoint.c - atomic checkpoints: temp folder + rename. */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "optim_state.h"
#include "weights.h"

#define STATE_FORMAT 1

static const char hex_digits[] = "0123456789abcdef";

/* ---- file checksums ---------------------------------------------------------- */

/* CRC-32 as zlib's crc32() computes it (reflected, polynomial 0xEDB88320),
 * so `python -c "import zlib; ..."` checks a file by hand. */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    static uint32_t table[256];
    if (!table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    }
    crc = ~crc;
    while (n--) crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* The CRC-32 and size of a file; 0 when it cannot be read. */
static int file_crc32(const char *path, uint32_t *crc, uint64_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char buf[1 << 16];
    size_t n;
    *crc = 0;
    *bytes = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        *crc = crc32_update(*crc, buf, n);
        *bytes += n;
    }
    int ok = !ferror(f);
    fclose(f);
    return ok;
}

/* The files of a checkpoint that state.json carries a checksum of. */
static const char *const checked_files[] = {"model", "optim"};

/* A plugin's state blob, through its vtable members. */
typedef struct blob {
    vh_role role;
    const char *key;
    unsigned char *bytes;
    size_t size;
} blob;

typedef vh_status (*state_size_fn)(void *, size_t *);
typedef vh_status (*state_save_fn)(void *, void *, size_t);
typedef vh_status (*state_load_fn)(void *, const void *, size_t);

static void state_fns(vh_session *s, vh_role role, state_size_fn *size, state_save_fn *save,
                      state_load_fn *load) {
    switch (role) {
    case VH_ROLE_MODEL: *size = s->model->state_size, *save = s->model->state_save, *load = s->model->state_load; break;
    case VH_ROLE_PRECISION: *size = s->precision->state_size, *save = s->precision->state_save, *load = s->precision->state_load; break;
    case VH_ROLE_OPTIM: *size = s->optim->state_size, *save = s->optim->state_save, *load = s->optim->state_load; break;
    case VH_ROLE_DATA: *size = s->data->state_size, *save = s->data->state_save, *load = s->data->state_load; break;
    default: *size = NULL, *save = NULL, *load = NULL; break;
    }
}

static const vh_role blob_roles[] = {VH_ROLE_MODEL, VH_ROLE_PRECISION, VH_ROLE_OPTIM, VH_ROLE_DATA};

static vh_status take_blob(vh_session *s, vh_role role, blob *b, vh_diag *d) {
    state_size_fn size;
    state_save_fn save;
    state_load_fn load;
    state_fns(s, role, &size, &save, &load);
    b->role = role;
    b->key = vh_role_name(role);
    vh_status st = size(s->self[role], &b->size);
    if (st != VH_STATUS_OK) return session_plugin_error(s, role, st, "state_size", d);
    b->bytes = malloc(b->size ? b->size : 1);
    if (!b->bytes) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    st = save(s->self[role], b->bytes, b->size);
    if (st != VH_STATUS_OK) return session_plugin_error(s, role, st, "state_save", d);
    return VH_STATUS_OK;
}

static int write_file_sync(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return 0;
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t n = write(fd, text + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            close(fd);
            return 0;
        }
        done += (size_t)n;
    }
    int ok = fsync(fd) == 0;
    return close(fd) == 0 && ok;
}

static vh_status write_state_json(vh_session *s, const char *path, blob *blobs, int n,
                                  vh_diag *d) {
    /* The model and optimizer files' checksums, read back from what was
     * written (the page cache holds them): a damaged copy is caught on load. */
    char sums[256] = "";
    for (int i = 0; i < 2; i++) {
        char file[4400];
        snprintf(file, sizeof file, "%.*s/%s.safetensors",
                 (int)(strrchr(path, '/') - path), path, checked_files[i]);
        uint32_t crc;
        uint64_t bytes;
        if (i == 1 && s->state_slots == 0) continue;
        if (!file_crc32(file, &crc, &bytes))
            return diag_set(d, VH_STATUS_ERR_IO, "cannot read back %s: %s", file,
                            strerror(errno));
        size_t used = strlen(sums);
        snprintf(sums + used, sizeof sums - used,
                 ",\n  \"%s_crc32\": \"%08x\",\n  \"%s_bytes\": %llu", checked_files[i],
                 (unsigned)crc, checked_files[i], (unsigned long long)bytes);
    }
    size_t len = 512 + sizeof sums;
    for (int i = 0; i < n; i++) len += 2 * blobs[i].size + 64;
    char *text = malloc(len);
    if (!text) return diag_set(d, VH_STATUS_ERR_NOMEM, "out of memory");
    size_t used = (size_t)snprintf(text, len,
                                   "{\n  \"format\": %d,\n  \"step\": %lld,\n  \"epoch\": %lld,\n"
                                   "  \"epoch_in_progress\": %d",
                                   STATE_FORMAT, (long long)s->step, (long long)s->epoch,
                                   s->epoch_in_progress);
    used += (size_t)snprintf(text + used, len - used, "%s", sums);
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(text + used, len - used, ",\n  \"%s_state\": \"", blobs[i].key);
        for (size_t k = 0; k < blobs[i].size; k++) {
            text[used++] = hex_digits[blobs[i].bytes[k] >> 4];
            text[used++] = hex_digits[blobs[i].bytes[k] & 15];
        }
        used += (size_t)snprintf(text + used, len - used, "\"");
    }
    snprintf(text + used, len - used, "\n}\n");
    int ok = write_file_sync(path, text);
    free(text);
    return ok ? VH_STATUS_OK : diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
}

static vh_status make_dir(const char *path, vh_diag *d) {
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return diag_set(d, VH_STATUS_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    return VH_STATUS_OK;
}

static void remove_tree(const char *path) {
    DIR *dir = opendir(path);
    if (!dir) return;
    struct dirent *e;
    char child[4400];
    while ((e = readdir(dir))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        unlink(child);
    }
    closedir(dir);
    rmdir(path);
}

static void sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Removes all but the newest `keep` step-* folders. */
static void rotate(const char *ckpt_root, int64_t keep) {
    if (keep <= 0) return;
    DIR *dir = opendir(ckpt_root);
    if (!dir) return;
    char *names[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < 4096)
        if (strncmp(e->d_name, "step-", 5) == 0) names[n++] = strdup(e->d_name);
    closedir(dir);
    qsort(names, (size_t)n, sizeof *names, compare_names); /* zero-padded: sorted by step */
    for (int i = 0; i < n; i++) {
        if (names[i] && i < n - keep) {
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", ckpt_root, names[i]);
            remove_tree(path);
        }
        free(names[i]);
    }
}

/* The files of a checkpoint, by rank 0; the collectives inside (weights
 * and optimizer state gathered from every rank) on every rank. */
static vh_status checkpoint_write(vh_session *s, const char *run_dir, int64_t keep,
                                  vh_diag *d) {
    int rank0 = s->run->comm.rank == 0;
    char root[4200], tmp[4300], final[4300], path[4400];
    snprintf(root, sizeof root, "%s/checkpoints", run_dir);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08lld", root, (long long)s->step);
    snprintf(final, sizeof final, "%s/step-%08lld", root, (long long)s->step);
    vh_status st = VH_STATUS_OK;
    if (rank0) {
        st = make_dir(root, d);
        if (st != VH_STATUS_OK) return st;
        remove_tree(tmp); /* a leftover of a crash */
        st = make_dir(tmp, d);
    }
    blob blobs[4];
    memset(blobs, 0, sizeof blobs);
    if (st == VH_STATUS_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        st = weights_save_model(s, path, d);
    }
    if (st == VH_STATUS_OK && s->state_slots > 0) {
        snprintf(path, sizeof path, "%s/optim.safetensors", tmp);
        st = optim_state_save(s, path, d);
    }
    if (!rank0) return st;
    /* Rank 0's blobs stand for every rank: plugins' states are the same on
     * every rank, except the data position, which the sampler maps to each
     * rank's share when it is loaded (vh_sampler.h). */
    for (int i = 0; st == VH_STATUS_OK && i < 4; i++) st = take_blob(s, blob_roles[i], &blobs[i], d);
    if (st == VH_STATUS_OK) {
        snprintf(path, sizeof path, "%s/state.json", tmp);
        st = write_state_json(s, path, blobs, 4, d);
    }
    for (int i = 0; i < 4; i++) free(blobs[i].bytes);
    if (st == VH_STATUS_OK) {
        sync_dir(tmp);
        remove_tree(final); /* the same step written again (a resumed run) */
        if (rename(tmp, final) != 0)
            st = diag_set(d, VH_STATUS_ERR_IO, "cannot rename %s to %s: %s", tmp, final,
                          strerror(errno));
    }
    if (st == VH_STATUS_OK) {
        char latest[4300], latest_tmp[4400], text[64];
        snprintf(latest, sizeof latest, "%s/latest", root);
        snprintf(latest_tmp, sizeof latest_tmp, "%s/.latest.tmp", root);
        snprintf(text, sizeof text, "step-%08lld\n", (long long)s->step);
        if (!write_file_sync(latest_tmp, text) || rename(latest_tmp, latest) != 0)
            st = diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", latest, strerror(errno));
        sync_dir(root);
    }
    if (st != VH_STATUS_OK) {
        remove_tree(tmp);
        return st;
    }
    rotate(root, keep);
    return VH_STATUS_OK;
}

vh_status checkpoint_save(vh_session *s, const char *run_dir, int64_t keep, vh_diag *d) {
    vh_status st = checkpoint_write(s, run_dir, keep, d);
    /* Every rank returns once the checkpoint is complete on disk (a failed
     * rank 0 never gets here: it ends the run, see train_loop.c). */
    vh_comm *c = &s->run->comm;
    if (st == VH_STATUS_OK && c->world_size > 1) {
        st = c->ops->barrier(c);
        if (st != VH_STATUS_OK) st = diag_set(d, st, "the ranks' barrier after a checkpoint failed");
    }
    return st;
}

vh_status checkpoint_latest(const char *run_dir, char *out, size_t len, vh_diag *d) {
    char latest[4200];
    snprintf(latest, sizeof latest, "%s/checkpoints/latest", run_dir);
    FILE *f = fopen(latest, "r");
    if (!f)
        return diag_set(d, VH_STATUS_ERR_IO,
                        "%s has no checkpoint to resume from (%s: %s)", run_dir, latest,
                        strerror(errno));
    char name[64] = "";
    int ok = fscanf(f, "%63s", name) == 1 && strncmp(name, "step-", 5) == 0 && !strchr(name, '/');
    fclose(f);
    if (!ok) return diag_set(d, VH_STATUS_ERR_FORMAT, "%s does not name a checkpoint", latest);
    snprintf(out, len, "%s/checkpoints/%s", run_dir, name);
    return VH_STATUS_OK;
}

/* Reads state.json (the host's own format) into text. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (buf) buf[got] = '\0';
    return buf;
}

static int json_int(const char *text, const char *key, int64_t *out) {
    char pattern[160];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *p = strstr(text, pattern);
    if (!p) return 0;
    char *end;
    errno = 0;
    *out = strtoll(p + strlen(pattern), &end, 10);
    return errno == 0 && end != p + strlen(pattern) &&
           (*end == ',' || *end == '\n' || *end == '}' || *end == ' ');
}

/* The hex text of "<key>": "1a2b3c4d". */
static int json_crc(const char *text, const char *key, uint32_t *out) {
    char pattern[160];
    snprintf(pattern, sizeof pattern, "\"%s\": \"", key);
    const char *p = strstr(text, pattern);
    if (!p) return 0;
    char *end;
    unsigned long v = strtoul(p + strlen(pattern), &end, 16);
    if (end != p + strlen(pattern) + 8 || *end != '"') return -1;
    *out = (uint32_t)v;
    return 1;
}

void checkpoint_previous(const char *ckpt_dir, char *out, size_t len) {
    out[0] = '\0';
    const char *slash = strrchr(ckpt_dir, '/');
    if (!slash) return;
    char root[4400];
    snprintf(root, sizeof root, "%.*s", (int)(slash - ckpt_dir), ckpt_dir);
    DIR *dir = opendir(root);
    if (!dir) return;
    char best[256] = "";
    struct dirent *e;
    while ((e = readdir(dir)))
        if (strncmp(e->d_name, "step-", 5) == 0 && strcmp(e->d_name, slash + 1) < 0 &&
            strcmp(e->d_name, best) > 0 && strlen(e->d_name) < sizeof best)
            snprintf(best, sizeof best, "%s", e->d_name);
    closedir(dir);
    if (best[0]) snprintf(out, len, "%s/%s", root, best);
}

/* What a refusal of ckpt_dir offers instead: the checkpoint before it. */
static void previous_offer(const char *ckpt_dir, char *out, size_t len) {
    char prev[4400];
    checkpoint_previous(ckpt_dir, prev, sizeof prev);
    const char *slash = strrchr(ckpt_dir, '/');
    int root_len = slash ? (int)(slash - ckpt_dir) : 0;
    if (prev[0])
        snprintf(out, len, "; the previous checkpoint is %s (to resume from it: echo %s > %.*s/latest)",
                 prev, strrchr(prev, '/') + 1, root_len, ckpt_dir);
    else
        snprintf(out, len, "; there is no earlier checkpoint in %.*s", root_len, ckpt_dir);
}

/* The model and optimizer files against the checksums state.json holds; a
 * checkpoint written before checksums has none and is not checked. */
static vh_status verify_files(const char *ckpt_dir, const char *state_path, const char *text,
                              vh_diag *d) {
    for (int i = 0; i < 2; i++) {
        char key[64], file[4400];
        snprintf(key, sizeof key, "%s_crc32", checked_files[i]);
        uint32_t want = 0, got = 0;
        uint64_t bytes = 0;
        int64_t want_bytes = -1;
        int has = json_crc(text, key, &want);
        if (has == 0) continue;
        if (has < 0)
            return diag_set(d, VH_STATUS_ERR_FORMAT, "%s: \"%s\" is not 8 hex digits",
                            state_path, key);
        snprintf(key, sizeof key, "%s_bytes", checked_files[i]);
        json_int(text, key, &want_bytes);
        snprintf(file, sizeof file, "%s/%s.safetensors", ckpt_dir, checked_files[i]);
        if (!file_crc32(file, &got, &bytes))
            return diag_set(d, VH_STATUS_ERR_IO, "%s: %s", file, strerror(errno));
        if (want_bytes >= 0 && (uint64_t)want_bytes != bytes)
            return diag_set(d, VH_STATUS_ERR_FORMAT,
                            "%s is damaged: %llu bytes, but %s says %lld (truncated or "
                            "overwritten)",
                            file, (unsigned long long)bytes, state_path, (long long)want_bytes);
        if (got != want)
            return diag_set(d, VH_STATUS_ERR_FORMAT,
                            "%s is damaged: its CRC-32 is %08x, but %s says %08x (corrupted "
                            "on disk or in a copy)",
                            file, (unsigned)got, state_path, (unsigned)want);
    }
    return VH_STATUS_OK;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The hex string of "<key>": decoded into a new buffer. */
static int json_blob(const char *text, const char *key, unsigned char **out, size_t *size) {
    char pattern[160];
    snprintf(pattern, sizeof pattern, "\"%s\": \"", key);
    const char *p = strstr(text, pattern);
    if (!p) return 0;
    p += strlen(pattern);
    const char *end = strchr(p, '"');
    if (!end || (end - p) % 2) return 0;
    *size = (size_t)(end - p) / 2;
    *out = malloc(*size ? *size : 1);
    if (!*out) return 0;
    for (size_t i = 0; i < *size; i++) {
        int hi = hex_value(p[2 * i]), lo = hex_value(p[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(*out);
            return 0;
        }
        (*out)[i] = (unsigned char)(hi << 4 | lo);
    }
    return 1;
}

/* The files (checksums) and then the weights and optimizer state; a
 * damaged file is refused offering the checkpoint before it. */
static vh_status load_files(vh_session *s, const char *ckpt_dir, const char *state_path,
                            const char *text, vh_diag *d) {
    char path[4400];
    vh_status st = verify_files(ckpt_dir, state_path, text, d);
    if (st == VH_STATUS_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", ckpt_dir);
        st = weights_load_model(s, path, VH_WEIGHTS_MODE_STRICT, d);
    }
    if (st == VH_STATUS_OK && s->state_slots > 0) {
        snprintf(path, sizeof path, "%s/optim.safetensors", ckpt_dir);
        st = optim_state_load(s, path, d);
    }
    if (st == VH_STATUS_ERR_FORMAT || st == VH_STATUS_ERR_IO || st == VH_STATUS_ERR_NUMERIC) {
        char offer[9000];
        previous_offer(ckpt_dir, offer, sizeof offer);
        size_t used = strlen(d->text);
        snprintf(d->text + used, sizeof d->text - used, "%s", offer);
    }
    return st;
}

vh_status checkpoint_load(vh_session *s, const char *ckpt_dir, vh_diag *d) {
    char path[4400];
    snprintf(path, sizeof path, "%s/state.json", ckpt_dir);
    char *text = read_text(path);
    if (!text) return diag_set(d, VH_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    int64_t format = 0, step = 0, epoch = 0, in_progress = 0;
    if (!json_int(text, "format", &format) || format != STATE_FORMAT ||
        !json_int(text, "step", &step) || !json_int(text, "epoch", &epoch) ||
        !json_int(text, "epoch_in_progress", &in_progress)) {
        free(text);
        return diag_set(d, VH_STATUS_ERR_FORMAT, "%s is not a vithost state file of format %d",
                        path, STATE_FORMAT);
    }
    /* Values no run writes: a hand-edited or damaged file. */
    const char *bad = step < 0 ? "step" : epoch < 0 ? "epoch" :
                      (in_progress != 0 && in_progress != 1) ? "epoch_in_progress" : NULL;
    if (bad) {
        free(text);
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: impossible values (step %lld, epoch %lld, epoch_in_progress %lld: "
                        "\"%s\" is wrong); the file was edited or damaged",
                        path, (long long)step, (long long)epoch, (long long)in_progress, bad);
    }
    vh_status st = load_files(s, ckpt_dir, path, text, d);
    for (int i = 0; i < 4 && st == VH_STATUS_OK; i++) {
        vh_role role = blob_roles[i];
        char key[64];
        snprintf(key, sizeof key, "%s_state", vh_role_name(role));
        unsigned char *bytes = NULL;
        size_t size = 0;
        if (!json_blob(text, key, &bytes, &size)) {
            st = diag_set(d, VH_STATUS_ERR_FORMAT, "%s: no valid \"%s\"", path, key);
            break;
        }
        state_size_fn sz;
        state_save_fn save;
        state_load_fn load;
        state_fns(s, role, &sz, &save, &load);
        st = load(s->self[role], bytes, size);
        free(bytes);
        if (st != VH_STATUS_OK) {
            vh_diag why;
            session_plugin_error(s, role, st, "state_load", &why);
            st = diag_set(d, st, "%s: %s", path, why.text);
        }
    }
    free(text);
    if (st != VH_STATUS_OK) return st;
    s->step = step;
    s->epoch = epoch;
    s->epoch_in_progress = (int)in_progress;
    /* A data plugin that keeps no position cannot continue a pass: the pass
     * of `epoch` starts over (the steps already done stay counted). */
    if (!loader_plugin_has(&s->run->plugins[VH_ROLE_DATA], offsetof(vh_data_vtable, state_load)))
        s->epoch_in_progress = 0;
    return VH_STATUS_OK;
}
