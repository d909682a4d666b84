/* checkpoint.c - atomic checkpoints: temp folder + rename; a replacement
 * that leaves a checkpoint to resume from at every moment. */
#define _DEFAULT_SOURCE /* syscall(): renameat2 */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim: the save-memory hook */
#endif
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "optim_state.h"
#include "vithost/vh_cpu_engine.h"
#include "weights.h"

#define STATE_FORMAT 1

static const char hex_digits[] = "0123456789abcdef";

/* ---- file checksums (weights.h) ---------------------------------------------- */

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
            int e = n < 0 ? errno : ENOSPC;
            close(fd);
            errno = e; /* (the caller's message names it) */
            return 0;
        }
        done += (size_t)n;
    }
    int ok = fsync(fd) == 0;
    return close(fd) == 0 && ok;
}

/* The CPU engine's GEMM choices (vh_cpu_engine.h), beside state.json: a
 * resumed run takes them, so its GEMMs run the kernels this run chose and
 * it continues bit for bit. Not a checked file: a checkpoint without it
 * (an older one, another device) resumes with the new process's own. */
#define GEMM_CHOICES_FILE "cpu-gemm-choices.txt"

static vh_status write_gemm_choices(vh_session *s, const char *dir, vh_diag *d) {
    if (s->run->device->kind != VH_DEVICE_KIND_CPU) return VH_STATUS_OK;
    char text[8192], path[4700];
    vh_cpu_gemm_choices_save(text, sizeof text);
    snprintf(path, sizeof path, "%s/" GEMM_CHOICES_FILE, dir);
    if (!write_file_sync(path, text))
        return diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return VH_STATUS_OK;
}

static void load_gemm_choices(vh_session *s, const char *dir) {
    if (s->run->device->kind != VH_DEVICE_KIND_CPU) return;
    char path[4700];
    snprintf(path, sizeof path, "%s/" GEMM_CHOICES_FILE, dir);
    char *text = weights_read_state(path);
    if (!text) return;
    vh_cpu_gemm_choices_load(text);
    free(text);
}

static vh_status write_state_json(vh_session *s, const char *path, blob *blobs, int n,
                                  vh_diag *d) {
    /* The model and optimizer files' checksums, read back from what was
     * written (the page cache holds them): a damaged copy is caught on load. */
    char sums[512] = "";
    for (int i = 0; i < 3; i++) {
        /* the third: the host's own file (the EMA), when the run keeps one */
        const char *name = i < 2 ? checked_files[i] : s->ckpt_extra.name;
        char file[4400];
        uint32_t crc;
        uint64_t bytes;
        if ((i == 1 && s->state_slots == 0) || !name) continue;
        snprintf(file, sizeof file, "%.*s/%s.safetensors",
                 (int)(strrchr(path, '/') - path), path, name);
        if (!weights_file_crc32(file, &crc, &bytes))
            return diag_set(d, VH_STATUS_ERR_IO, "cannot read back %s: %s", file,
                            strerror(errno));
        size_t used = strlen(sums);
        snprintf(sums + used, sizeof sums - used,
                 ",\n  \"%s_crc32\": \"%08x\",\n  \"%s_bytes\": %llu", name,
                 (unsigned)crc, name, (unsigned long long)bytes);
        if (i == 2 && s->ckpt_extra.counter) {
            used = strlen(sums);
            snprintf(sums + used, sizeof sums - used, ",\n  \"%s_updates\": %lld", name,
                     (long long)*s->ckpt_extra.counter);
        }
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

/* ---- the test hook ----------------------------------------------------------- */

/* VITHOST_TEST_KILL_AT=checkpoint:PHASE[:STEP] makes the process kill itself
 * with SIGKILL, as `kill -9` would, when a checkpoint save (of STEP) reaches
 * PHASE; checkpoint-noswap:... also takes the path of filesystems that
 * cannot swap two folders. Tests show with it that a kill at any moment of
 * a replacement leaves a checkpoint to resume from. Read here only. */
typedef struct kill_hook {
    int set, noswap;
    char phase[32];
    long long step; /* -1: any */
} kill_hook;

static const kill_hook *test_hook(void) {
    static kill_hook h;
    static int done;
    if (done) return &h;
    done = 1;
    const char *v = getenv("VITHOST_TEST_KILL_AT"), *rest = NULL;
    if (v && strncmp(v, "checkpoint:", 11) == 0) rest = v + 11;
    if (v && strncmp(v, "checkpoint-noswap:", 18) == 0) rest = v + 18, h.noswap = 1;
    h.step = -1;
    h.set = rest && sscanf(rest, "%31[a-z]:%lld", h.phase, &h.step) >= 1;
    return &h;
}

static void kill_point(const char *phase, int64_t step) {
    const kill_hook *h = test_hook();
    if (h->set && strcmp(h->phase, phase) == 0 && (h->step < 0 || h->step == step))
        raise(SIGKILL);
}

/* ---- replacing a checkpoint ---------------------------------------------------- */

/* The names around the checkpoint of one step. */
typedef struct step_paths {
    char root[4200];  /* DIR/checkpoints */
    char name[256];   /* step-00001200 */
    char tmp[4500];   /* root/.tmp-step-00001200: the new one being written */
    char final[4500]; /* root/step-00001200 */
    char old[4500];   /* root/.old-step-00001200: an old copy on its way out */
} step_paths;

static void paths_of(step_paths *p, const char *root, const char *name) {
    snprintf(p->root, sizeof p->root, "%s", root);
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->tmp, sizeof p->tmp, "%s/.tmp-%s", root, name);
    snprintf(p->final, sizeof p->final, "%s/%s", root, name);
    snprintf(p->old, sizeof p->old, "%s/.old-%s", root, name);
}

/* Swaps two folders in one rename (Linux renameat2, RENAME_EXCHANGE); -1
 * with errno where the kernel or filesystem cannot (NFS, Lustre, ...). */
static int swap_folders(const char *a, const char *b) {
#if defined(__linux__) && defined(SYS_renameat2)
    if (!test_hook()->noswap)
        return (int)syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 1u << 1 /* EXCHANGE */);
#endif
    (void)a, (void)b;
    errno = ENOSYS;
    return -1;
}

/* An old copy goes: its state.json first, so a kill in the middle leaves
 * a folder no one takes for a checkpoint. */
static void remove_copy(const char *path, int64_t step) {
    char state[4600];
    snprintf(state, sizeof state, "%s/state.json", path);
    unlink(state);
    kill_point("removing", step);
    remove_tree(path);
}

static vh_status rename_error(const char *from, const char *to, vh_diag *d) {
    return diag_set(d, VH_STATUS_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
}

/* `latest` names p's checkpoint: a file written beside it and renamed over it. */
static vh_status write_latest(const step_paths *p, vh_diag *d) {
    char latest[4300], latest_tmp[4400], text[300];
    snprintf(latest, sizeof latest, "%s/latest", p->root);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/.latest.tmp", p->root);
    snprintf(text, sizeof text, "%s\n", p->name);
    vh_status st = VH_STATUS_OK;
    if (!write_file_sync(latest_tmp, text) || rename(latest_tmp, latest) != 0)
        st = diag_set(d, VH_STATUS_ERR_IO, "cannot write %s: %s", latest, strerror(errno));
    sync_dir(p->root);
    return st;
}

/* Puts the whole checkpoint p->tmp in place as p->final and names it in
 * `latest`, so that `latest` names a whole checkpoint at every moment:
 *  - a new step: rename it into place, then switch `latest`;
 *  - the same step again (a resumed run saves its last step anew): swap the
 *    old and new folders in one rename, switch `latest`, then remove the
 *    old copy, now under the temporary name;
 *  - the same step where folders cannot be swapped: the old copy aside
 *    (.old-step-N), the new one in, `latest`, the old copy out. A kill
 *    between the two renames leaves `latest` naming a missing folder: the
 *    next --resume puts it back (checkpoint_resume_point). */
static vh_status put_in_place(const step_paths *p, int64_t step, vh_diag *d) {
    struct stat sb;
    const char *drop = NULL; /* the old copy, removed once `latest` is switched */
    if (stat(p->final, &sb) != 0) {
        if (rename(p->tmp, p->final) != 0) return rename_error(p->tmp, p->final, d);
        kill_point("placed", step);
    } else if (swap_folders(p->tmp, p->final) == 0) {
        kill_point("swapped", step);
        drop = p->tmp;
    } else {
        remove_tree(p->old); /* a leftover of a killed job */
        if (rename(p->final, p->old) != 0) return rename_error(p->final, p->old, d);
        kill_point("aside", step);
        if (rename(p->tmp, p->final) != 0) {
            vh_status st = rename_error(p->tmp, p->final, d);
            rename(p->old, p->final); /* back as it was */
            return st;
        }
        kill_point("placed", step);
        drop = p->old;
    }
    sync_dir(p->root);
    vh_status st = write_latest(p, d);
    if (st != VH_STATUS_OK) return st;
    kill_point("latest", step);
    if (drop) remove_copy(drop, step);
    return VH_STATUS_OK;
}

/* Removes all but the newest `keep` step-* folders, never `current` (the
 * one `latest` names, older than kept ones after a rollback). Each goes
 * aside first, so no step-* folder is ever half removed. */
static void rotate(const char *ckpt_root, int64_t keep, const char *current) {
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
        if (names[i] && i < n - keep && strcmp(names[i], current) != 0) {
            step_paths p;
            paths_of(&p, ckpt_root, names[i]);
            if (rename(p.final, p.old) == 0) remove_copy(p.old, -1);
        }
        free(names[i]);
    }
}

/* The files of a checkpoint, by rank 0; the collectives inside on every
 * rank: the weights a unit at a time (store_unit), the optimizer state a
 * tensor at a time, each rank's pieces sent to rank 0 only (optim_state.c). */
static vh_status checkpoint_write(vh_session *s, const char *run_dir, int64_t keep,
                                  vh_diag *d) {
    int rank0 = s->run->comm.rank == 0;
    char root[4200], name[64], path[4600];
    snprintf(root, sizeof root, "%s/checkpoints", run_dir);
    snprintf(name, sizeof name, "step-%08lld", (long long)s->step);
    step_paths p;
    paths_of(&p, root, name);
    vh_status st = VH_STATUS_OK;
    if (rank0) {
        st = make_dir(root, d);
        if (st != VH_STATUS_OK) return st;
        remove_tree(p.tmp); /* a leftover of a crash */
        st = make_dir(p.tmp, d);
    }
    blob blobs[4];
    memset(blobs, 0, sizeof blobs);
    if (st == VH_STATUS_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", p.tmp);
        st = weights_save_model(s, path, d);
    }
    if (st == VH_STATUS_OK && s->state_slots > 0) {
        snprintf(path, sizeof path, "%s/optim.safetensors", p.tmp);
        st = optim_state_save(s, path, d);
    }
    if (st == VH_STATUS_OK && s->ckpt_extra.name) {
        snprintf(path, sizeof path, "%s/%s.safetensors", p.tmp, s->ckpt_extra.name);
        st = s->ckpt_extra.save(s->ckpt_extra.ctx, s, path, d);
    }
    if (!rank0) return st;
    /* Rank 0's blobs stand for every rank: plugins' states are the same on
     * every rank, except the data position, which the sampler maps to each
     * rank's share when it is loaded (vh_sampler.h). */
    for (int i = 0; st == VH_STATUS_OK && i < 4; i++) st = take_blob(s, blob_roles[i], &blobs[i], d);
    if (st == VH_STATUS_OK) st = write_gemm_choices(s, p.tmp, d);
    if (st == VH_STATUS_OK) {
        snprintf(path, sizeof path, "%s/state.json", p.tmp);
        st = write_state_json(s, path, blobs, 4, d);
    }
    for (int i = 0; i < 4; i++) free(blobs[i].bytes);
    if (st == VH_STATUS_OK) {
        sync_dir(p.tmp);
        kill_point("written", s->step);
        st = put_in_place(&p, s->step, d);
    }
    if (st != VH_STATUS_OK) {
        remove_tree(p.tmp);
        return st;
    }
    rotate(root, keep, name);
    return VH_STATUS_OK;
}

/* ---- measuring a save's memory ------------------------------------------------ */

/* VmRSS and VmHWM of /proc/self/status in KiB; 0 where unreadable. */
static void rss_kib(long long *rss, long long *hwm) {
    *rss = *hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *rss = atoll(line + 6);
        if (!strncmp(line, "VmHWM:", 6)) *hwm = atoll(line + 6);
    }
    fclose(f);
}

/* VITHOST_TEST_SAVE_MEM=1: every rank prints by how much its resident set
 * rose during a save (the numbers of docs/SHARDING.md, Checkpoints). The
 * heap's free pages go back to the system first (malloc_trim), else the
 * save would reuse what training freed and show no rise; then the peak is
 * reset (/proc/self/clear_refs 5), which also lowers the run's reported
 * peak_mem_bytes: a measuring hook, read here only. */
static int save_mem_start(long long *before) {
    const char *v = getenv("VITHOST_TEST_SAVE_MEM");
    if (!v || strcmp(v, "1") != 0) return 0;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
    long long hwm;
    rss_kib(before, &hwm);
    return 1;
}

static void save_mem_end(const vh_session *s, long long before) {
    long long rss, hwm;
    rss_kib(&rss, &hwm);
    fprintf(stderr, "vithost: rank %d: checkpoint save of step %lld: RSS %.1f MiB before, peak "
            "%.1f MiB during (+%.1f MiB)\n", (int)s->run->comm.rank, (long long)s->step,
            before / 1024.0, hwm / 1024.0, (hwm - before) / 1024.0);
}

vh_status checkpoint_save(vh_session *s, const char *run_dir, int64_t keep, vh_diag *d) {
    long long mem_before = 0;
    const int measure = save_mem_start(&mem_before);
    vh_status st = checkpoint_write(s, run_dir, keep, d);
    if (measure) save_mem_end(s, mem_before);
    /* Every rank returns once the checkpoint is complete on disk (a failed
     * rank 0 never gets here: it ends the run, see train_loop.c). */
    vh_comm *c = &s->run->comm;
    if (st == VH_STATUS_OK && c->world_size > 1) {
        st = c->ops->barrier(c);
        if (st != VH_STATUS_OK) st = diag_set(d, st, "the ranks' barrier after a checkpoint failed");
    }
    return st;
}

/* ---- finding the checkpoint to resume from ----------------------------------- */

/* Whether a folder holds a whole checkpoint: a state.json written to its
 * end (it is written last). */
static int is_whole(const char *folder) {
    char path[4600], tail[3] = "";
    snprintf(path, sizeof path, "%s/state.json", folder);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int ok = fseek(f, -3, SEEK_END) == 0 && fread(tail, 1, 3, f) == 3;
    fclose(f);
    return ok && memcmp(tail, "\n}\n", 3) == 0;
}

/* The step-* name in root/latest; 0 when there is no such file, -1 when it
 * does not name a checkpoint. */
static int read_latest(const char *root, char *name, size_t len) {
    char latest[4300];
    snprintf(latest, sizeof latest, "%s/latest", root);
    FILE *f = fopen(latest, "r");
    if (!f) return 0;
    char text[64] = "";
    int ok = fscanf(f, "%63s", text) == 1 && strncmp(text, "step-", 5) == 0 &&
             !strchr(text, '/') && strlen(text) < len;
    fclose(f);
    if (ok) snprintf(name, len, "%s", text);
    return ok ? 1 : -1;
}

/* The newest whole step-* folder of root ("" none). */
static void newest_whole(const char *root, char *out, size_t len) {
    out[0] = '\0';
    DIR *dir = opendir(root);
    if (!dir) return;
    struct dirent *e;
    char path[4500];
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, "step-", 5) != 0 || strcmp(e->d_name, out) <= 0 ||
            strlen(e->d_name) >= len)
            continue;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (is_whole(path)) snprintf(out, len, "%s", e->d_name);
    }
    closedir(dir);
}

/* Rank 0 before a resume, the run folder locked (run_folder_lock): a
 * `latest` naming a missing folder gets it back from the copy a killed
 * replacement left (the old one first: `latest` named it), and what killed
 * jobs left behind (.tmp-step-*, .old-step-*, .latest.tmp) goes. */
static void repair(const char *run_dir) {
    char root[4200], name[64];
    snprintf(root, sizeof root, "%s/checkpoints", run_dir);
    if (read_latest(root, name, sizeof name) != 1) return; /* checkpoint_latest says why */
    step_paths p;
    paths_of(&p, root, name);
    struct stat sb;
    for (int i = 0; i < 2 && stat(p.final, &sb) != 0; i++) {
        const char *copy = i == 0 ? p.old : p.tmp;
        if (is_whole(copy) && rename(copy, p.final) == 0) {
            sync_dir(root);
            fprintf(stderr,
                    "vithost: %s/latest named %s, which was missing (a job was killed while "
                    "replacing it): put back %s\n",
                    root, name, copy);
        }
    }
    if (stat(p.final, &sb) != 0) return; /* the leftovers may be all there is: kept */
    DIR *dir = opendir(root);
    if (!dir) return;
    struct dirent *e;
    char path[4500];
    while ((e = readdir(dir))) {
        int copy = !strncmp(e->d_name, ".tmp-step-", 10) || !strncmp(e->d_name, ".old-step-", 10);
        if (!copy && strcmp(e->d_name, ".latest.tmp") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (copy) remove_tree(path);
        else unlink(path);
    }
    closedir(dir);
}

/* Why `latest` names no folder, and the command that recovers. */
static vh_status missing_error(const char *root, const char *name, vh_diag *d) {
    step_paths p;
    paths_of(&p, root, name);
    const char *copy = is_whole(p.old) ? p.old : is_whole(p.tmp) ? p.tmp : NULL;
    char newest[64], fix[14000];
    newest_whole(root, newest, sizeof newest);
    if (copy)
        snprintf(fix, sizeof fix, "it is whole in %s: put it back with: mv %s %s (vithost run "
                 "--resume does this itself)", copy, copy, p.final);
    else if (newest[0])
        snprintf(fix, sizeof fix, "the newest whole checkpoint is %s/%s (to resume from it: "
                 "echo %s > %s/latest)", root, newest, newest, root);
    else
        snprintf(fix, sizeof fix, "no whole checkpoint is left in %s", root);
    return diag_set(d, VH_STATUS_ERR_IO,
                    "%s/latest names %s, which does not exist (a job was killed while "
                    "replacing it, or the folder was removed); %s",
                    root, name, fix);
}

vh_status checkpoint_latest(const char *run_dir, char *out, size_t len, vh_diag *d) {
    char root[4200], name[64];
    snprintf(root, sizeof root, "%s/checkpoints", run_dir);
    int got = read_latest(root, name, sizeof name);
    if (got < 0) return diag_set(d, VH_STATUS_ERR_FORMAT, "%s/latest does not name a checkpoint", root);
    if (got == 0) {
        int e = errno;
        char newest[64], offer[9000] = "";
        newest_whole(root, newest, sizeof newest);
        if (newest[0]) /* killed as it saved its first one, before `latest` */
            snprintf(offer, sizeof offer, "; %s/%s is whole but was never named in latest (to "
                     "resume from it: echo %s > %s/latest)", root, newest, newest, root);
        return diag_set(d, VH_STATUS_ERR_IO, "%s has no checkpoint to resume from (%s/latest: "
                        "%s)%s", run_dir, root, strerror(e), offer);
    }
    snprintf(out, len, "%s/%s", root, name);
    struct stat sb;
    if (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode)) return missing_error(root, name, d);
    return VH_STATUS_OK;
}

/* The files of a checkpoint a resume reads, in the order they are tried
 * (0 is `latest`, read by checkpoint_latest); NULL where the run has none. */
static const char *resume_file(const vh_session *s, int i, char *name, size_t len) {
    if (i == 1) return "state.json";
    if (i == 2) return "model.safetensors";
    if (i == 3) return s->state_slots > 0 ? "optim.safetensors" : NULL;
    if (i != 4 || !s->ckpt_extra.name) return NULL;
    snprintf(name, len, "%s.safetensors", s->ckpt_extra.name);
    return name;
}

/* The first file of ckpt_dir this rank cannot open for reading: its index
 * (resume_file), errno in *err; 0 when all open. */
static int unreadable(const vh_session *s, const char *ckpt_dir, int *err) {
    for (int i = 1; i <= 4; i++) {
        char extra[300], path[4800];
        const char *name = resume_file(s, i, extra, sizeof extra);
        if (!name) continue;
        snprintf(path, sizeof path, "%s/%s", ckpt_dir, name);
        int fd = open(path, O_RDONLY);
        struct stat sb;
        *err = fd < 0 ? errno : fstat(fd, &sb) != 0 ? errno : S_ISREG(sb.st_mode) ? 0 : EISDIR;
        if (fd >= 0) close(fd);
        if (*err) return i;
    }
    return 0;
}

/* Which rank is the first to have failed a check every rank made, and what
 * that rank says of it: *who is the lowest failing rank (world_size when
 * none), and `info` (n values, each >= -1) ends as that rank's on every
 * rank. Two reductions of scalars, so every rank can refuse with the same
 * message instead of one failing alone while the others wait. */
static vh_status agree_first_failure(vh_session *s, int failed, double *info, int n,
                                     int32_t *who, vh_diag *d) {
    vh_comm *c = &s->run->comm;
    double first[1] = {failed ? (double)c->rank : (double)c->world_size};
    vh_diag why;
    vh_status st = session_reduce_scalars(s, first, 1, VH_REDUCE_OP_MIN, &why);
    *who = (int32_t)first[0];
    if (*who != c->rank)
        for (int i = 0; i < n; i++) info[i] = -2.0; /* below any rank's value */
    if (st == VH_STATUS_OK) st = session_reduce_scalars(s, info, n, VH_REDUCE_OP_MAX, &why);
    return st == VH_STATUS_OK ? st : diag_set(d, st, "%s", why.text);
}

/* Every rank reads the checkpoint itself (each maps the files and takes its
 * own pieces), so it must lie where every rank can read it: on one file
 * system the ranks share, or copied to the same path on every machine.
 * Checked before anything is loaded: each rank tries the files, and the
 * ranks agree (two reductions of scalars) on the first rank that cannot
 * read one, its file and why, so every rank ends with the same message
 * naming them (rank 0 prints it) instead of one rank failing alone while
 * the others wait in a collective. `st` and d: this rank's checkpoint_latest. */
static vh_status readable_everywhere(vh_session *s, const char *run_dir, const char *ckpt,
                                     vh_status st, vh_diag *d) {
    vh_comm *c = &s->run->comm;
    int err = 0, file = st != VH_STATUS_OK ? -1 : unreadable(s, ckpt, &err);
    double what[2] = {(double)file, (double)err};
    int32_t who = 0;
    vh_status cst = agree_first_failure(s, file != 0, what, 2, &who, d);
    if (cst != VH_STATUS_OK) return cst;
    if (who >= c->world_size) return VH_STATUS_OK;
    s->run->failed_together = 1; /* every rank has the message: rank 0 says it */
    if (who == c->rank && file < 0) return st; /* its own words, as one process says them */
    char extra[300], path[4800];
    const char *name = what[0] > 0 ? resume_file(s, (int)what[0], extra, sizeof extra) : NULL;
    if (name && st == VH_STATUS_OK) snprintf(path, sizeof path, "%s/%s", ckpt, name);
    else if (name) snprintf(path, sizeof path, "%s/checkpoints/<latest>/%s", run_dir, name);
    else snprintf(path, sizeof path, "%s/checkpoints/latest", run_dir);
    return diag_set(d, VH_STATUS_ERR_IO,
                    "%s cannot be read on rank %d of %d (%s): every rank reads the checkpoint "
                    "itself, so the run folder must be on a file system all ranks share (or "
                    "copied to the same path on every machine) to resume",
                    path, (int)who, (int)c->world_size,
                    what[0] > 0 ? strerror((int)what[1]) : "its checkpoint could not be found");
}

vh_status checkpoint_folder_shared(vh_session *s, const char *run_dir, vh_diag *d) {
    vh_comm *c = &s->run->comm;
    if (c->world_size <= 1) return VH_STATUS_OK;
    /* rank 0 has written run.json before this barrier */
    vh_status st = c->ops->barrier(c);
    if (st != VH_STATUS_OK) return diag_set(d, st, "the ranks' barrier after the run folder failed");
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", run_dir);
    int fd = open(path, O_RDONLY), err = fd < 0 ? errno : 0;
    if (fd >= 0) close(fd);
    double what[1] = {(double)err};
    int32_t who = 0;
    if ((st = agree_first_failure(s, err != 0, what, 1, &who, d)) != VH_STATUS_OK) return st;
    if (who >= c->world_size) return VH_STATUS_OK;
    s->run->failed_together = 1; /* every rank has the message: rank 0 says it */
    return diag_set(d, VH_STATUS_ERR_IO,
                    "the run folder %s, which rank 0 writes, cannot be seen on rank %d of %d "
                    "(%s: %s): a resume has every rank read the checkpoints in it, so put --out "
                    "on a file system all ranks share (on one machine: a local path)",
                    run_dir, (int)who, (int)c->world_size, path, strerror((int)what[0]));
}

vh_status checkpoint_resume_point(vh_session *s, const char *run_dir, char *out, size_t len,
                                  vh_diag *d) {
    vh_comm *c = &s->run->comm;
    if (c->rank == 0) repair(run_dir);
    /* The other ranks read `latest` once rank 0 has repaired it. */
    if (c->world_size > 1) {
        vh_status st = c->ops->barrier(c);
        if (st != VH_STATUS_OK) return diag_set(d, st, "the ranks' barrier before a resume failed");
    }
    vh_status st = checkpoint_latest(run_dir, out, len, d);
    return c->world_size > 1 ? readable_everywhere(s, run_dir, out, st, d) : st;
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

/* The optimizer file against its checksum in state.json (weights_verify_file:
 * one set of checks); the model file is checked as it is loaded. */
static vh_status verify_optim(const char *ckpt_dir, vh_diag *d) {
    char file[4400];
    snprintf(file, sizeof file, "%s/%s.safetensors", ckpt_dir, checked_files[1]);
    return weights_verify_file(file, d);
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

/* The host's own file (the EMA: session.h's ckpt_extra), checked against
 * its checksum, and its counter from state.json. */
static vh_status load_extra(vh_session *s, const char *ckpt_dir, vh_status st, vh_diag *d) {
    const vh_checkpoint_extra *x = &s->ckpt_extra;
    if (st != VH_STATUS_OK || !x->name) return st;
    char path[4400], key[64];
    snprintf(path, sizeof path, "%s/state.json", ckpt_dir);
    snprintf(key, sizeof key, "%s_updates", x->name);
    char *text = weights_read_state(path);
    int64_t counter = 0;
    int has = text && json_int(text, key, &counter) && counter >= 0;
    free(text);
    snprintf(path, sizeof path, "%s/%s.safetensors", ckpt_dir, x->name);
    struct stat sb;
    if (!has || stat(path, &sb) != 0)
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s has no %s.safetensors or no \"%s\" in its state.json: it was "
                        "written without the recipe's %s (resume with the recipe the run "
                        "started with)",
                        ckpt_dir, x->name, key, x->name);
    st = weights_verify_file(path, d);
    if (st == VH_STATUS_OK) st = x->load(x->ctx, s, path, d);
    if (st == VH_STATUS_OK && x->counter) *x->counter = counter;
    return st;
}

/* The files (checksums) and then the weights and optimizer state; a
 * damaged file is refused offering the checkpoint before it. */
static vh_status load_files(vh_session *s, const char *ckpt_dir, vh_diag *d) {
    char path[4400];
    vh_status st = verify_optim(ckpt_dir, d);
    if (st == VH_STATUS_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", ckpt_dir);
        st = weights_load_model(s, path, VH_WEIGHTS_MODE_STRICT, d);
    }
    if (st == VH_STATUS_OK && s->state_slots > 0) {
        snprintf(path, sizeof path, "%s/optim.safetensors", ckpt_dir);
        st = optim_state_load(s, path, d);
    }
    st = load_extra(s, ckpt_dir, st, d);
    if (st == VH_STATUS_OK) load_gemm_choices(s, ckpt_dir);
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
    char *text = weights_read_state(path);
    char offer[9000];
    if (!text) {
        int e = errno;
        previous_offer(ckpt_dir, offer, sizeof offer);
        return diag_set(d, VH_STATUS_ERR_IO, "%s: %s%s", path, strerror(e), offer);
    }
    int64_t format = 0, step = 0, epoch = 0, in_progress = 0;
    if (!json_int(text, "format", &format) || format != STATE_FORMAT ||
        !json_int(text, "step", &step) || !json_int(text, "epoch", &epoch) ||
        !json_int(text, "epoch_in_progress", &in_progress)) {
        free(text);
        previous_offer(ckpt_dir, offer, sizeof offer);
        return diag_set(d, VH_STATUS_ERR_FORMAT, "%s is not a vithost state file of format %d%s",
                        path, STATE_FORMAT, offer);
    }
    /* Values no run writes: a hand-edited or damaged file. */
    const char *bad = step < 0 ? "step" : epoch < 0 ? "epoch" :
                      (in_progress != 0 && in_progress != 1) ? "epoch_in_progress" : NULL;
    if (bad) {
        free(text);
        previous_offer(ckpt_dir, offer, sizeof offer);
        return diag_set(d, VH_STATUS_ERR_FORMAT,
                        "%s: impossible values (step %lld, epoch %lld, epoch_in_progress %lld: "
                        "\"%s\" is wrong); the file was edited or damaged%s",
                        path, (long long)step, (long long)epoch, (long long)in_progress, bad,
                        offer);
    }
    vh_status st = load_files(s, ckpt_dir, d);
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
