/* test_sharding_mpi.c - many processes for real: `mpirun -np N vithost run`
 * with ddp, zero1 and fsdp against one process, as a user runs them.
 *
 *   - the same global batch and seed give the same loss for 20 steps
 *     (1e-5 relative) and the same final parameters on 1 process (ddp), DDP
 *     on 2 and 3, ZeRO-1 on 1, 2 and 3, FSDP ZeRO-2 and ZeRO-3 on 2 and 3
 *     (3: odd, so padding is used);
 *   - a checkpoint written on 2 processes resumes on 3 and on 1 and ends
 *     where the uninterrupted run ends (fsdp and zero1: sharded state);
 *   - a save gathering the optimizer state to rank 0 writes the files the
 *     summing save of before wrote, bit for bit; a resume where one rank
 *     cannot read the checkpoint is refused naming the rank and the file;
 *   - the bytes each step sends match the analytic figures;
 *   - zero1's memory report shows half of ddp's optimizer state on 2 ranks;
 *   - one rank failing, or killed with SIGKILL, ends every rank with a
 *     non-zero status within 60 s and a message that says why.
 *
 * Without mpirun (VH_TEST_MPIRUN empty) every test prints SKIPPED and the
 * program exits 77, which ctest shows as skipped.
 */
#define _DEFAULT_SOURCE /* usleep */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#include "safetensors.h"

static char tmp_dir[256];

/* mpirun as CI runs it: more ranks than cores, as root, one thread each. */
#define MPIRUN VH_TEST_MPIRUN " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1"

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

/* Runs a shell command (a format) in tmp_dir; output in tmp_dir/out and tmp_dir/err. */
#define sh(...) harness_sh(tmp_dir, __VA_ARGS__)

static double field(const char *line, const char *key) { return harness_json_number(line, key); }

/* `vithost run eq.yaml` on np processes (0: without mpirun) into dir. */
static int run_np(int np, const char *dir, const char *extra) {
    int global = 12;
    if (np == 0)
        return sh("OMP_NUM_THREADS=1 %s run eq.yaml --out %s --set run.batch_size=%d %s",
                  VH_TEST_VITHOST, dir, global, extra);
    return sh(MPIRUN " -np %d %s run eq.yaml --out %s --set run.batch_size=%d %s", np,
              VH_TEST_VITHOST, dir, global / np, extra);
}

/* A small ViT on synthetic data; 240 training samples = 20 steps of 12. */
static const char eq_recipe[] =
    "run: {steps: 20, log_every: 1, eval_every: 1, seed: 3}\n"
    "model: {plugin: vit, dim: 16, depth: 3, heads: 2, mlp_dim: 24, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: adamw, lr: 3.0e-3, weight_decay: 0.05, warmup_steps: 3}\n"
    "data: {plugin: synthetic, channels: 3, image_size: 8, num_classes: 5,\n"
    "       train_size: 240, eval_size: 31, pool_size: 40}\n";

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "mpi") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    char path[512];
    snprintf(path, sizeof path, "%s/eq.yaml", tmp_dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(eq_recipe, f);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

/* ---- reading a run folder ------------------------------------------------- */

typedef struct run_result {
    double loss[32];   /* by step, 1-based */
    double comm_bytes; /* of the last training line */
    double top1, eval_samples;
    int steps;
} run_result;

static void read_metrics(const char *dir, run_result *r) {
    memset(r, 0, sizeof *r);
    char name[512];
    snprintf(name, sizeof name, "%s/metrics.jsonl", dir);
    char *text = tmp_text(name);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int step = (int)field(line, "step");
        if (strstr(line, "eval_top1")) {
            r->top1 = field(line, "eval_top1");
            r->eval_samples = field(line, "eval_samples");
        } else if (step >= 1 && step < 32) {
            r->loss[step] = field(line, "loss");
            r->comm_bytes = field(line, "comm_bytes_per_step");
            if (step > r->steps) r->steps = step;
        }
    }
    free(text);
}

/* Every tensor of the newest checkpoint's model.safetensors, end to end. */
static float *read_weights(const char *dir, int64_t *count) {
    char path[512], latest[64] = "";
    snprintf(path, sizeof path, "%s/%s/checkpoints/latest", tmp_dir, dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%63s", latest), 1);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s/checkpoints/%s/model.safetensors", tmp_dir, dir, latest);
    vh_st_file st;
    vh_diag d = {{0}};
    if (st_read(&st, path, &d) != VH_STATUS_OK) fail_msg("%s", d.text);
    int64_t n = 0;
    for (int i = 0; i < st.count; i++) n += st.tensors[i].numel;
    float *out = malloc((size_t)n * sizeof *out);
    int64_t at = 0;
    for (int i = 0; i < st.count; i++) {
        const vh_st_tensor *t = st_find(&st, st.tensors[i].name);
        assert_int_equal(st_read_f32(&st, t, out + at, t->numel, &d), VH_STATUS_OK);
        at += t->numel;
    }
    st_free(&st);
    *count = n;
    return out;
}

/* The runs agree: tensors are read in the file's (sorted) order. Parameters
 * after 20 AdamW steps differ by the float sums' order only; AdamW divides
 * by sqrt(v) so a last-bit difference in a tiny gradient moves a weight by
 * up to lr x (that difference / its size): 1e-4 absolute bounds it here
 * (lr 3e-3), while one wrong step moves weights by ~lr = 3e-3. */
static void assert_same_weights(const char *a, const char *b) {
    int64_t na, nb;
    float *wa = read_weights(a, &na), *wb = read_weights(b, &nb);
    assert_int_equal(na, nb);
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < na; i++) {
        double diff = fabs((double)wa[i] - (double)wb[i]);
        if (diff > worst) worst = diff, at = i;
    }
    if (worst > 1e-4)
        fail_msg("%s vs %s: parameter %lld differs by %g (%g vs %g)", a, b, (long long)at, worst,
                 (double)wa[at], (double)wb[at]);
    free(wa);
    free(wb);
}

static void assert_same_losses(const run_result *ref, const run_result *r, const char *what) {
    assert_int_equal(r->steps, 20);
    for (int s = 1; s <= 20; s++) {
        double rel = fabs(r->loss[s] - ref->loss[s]) / fabs(ref->loss[s]);
        if (!(rel <= 1e-5))
            fail_msg("%s: step %d loss %.8f, one process %.8f (relative %.2g)", what, s,
                     r->loss[s], ref->loss[s], rel);
    }
}

/* ---- the tests -------------------------------------------------------------- */

typedef struct variant {
    const char *dir;
    int np;
    const char *extra;
} variant;

static const variant variants[] = {
    {"ddp2", 2, ""},
    {"ddp3", 3, ""},
    {"zero1_1", 0, "--set sharding.plugin=zero1"},
    {"zero1_2", 2, "--set sharding.plugin=zero1"},
    {"zero1_3", 3, "--set sharding.plugin=zero1 --set sharding.bucket_mb=0"},
    {"zero3_2", 2, "--set sharding.plugin=fsdp"},
    {"zero3_3", 3, "--set sharding.plugin=fsdp"},
    {"zero2_2", 2, "--set sharding.plugin=fsdp --set sharding.reshard_after_forward=false"},
    {"zero2_3", 3, "--set sharding.plugin=fsdp --set sharding.reshard_after_forward=false"},
};

static int one_done;

static void run_one(void) {
    if (one_done) return;
    if (run_np(0, "one", "") != 0) fail_msg("one process failed: %s", tmp_text("err"));
    one_done = 1;
}

static void test_same_losses_and_weights(void **state) {
    (void)state;
    run_one();
    run_result ref;
    read_metrics("one", &ref);
    assert_int_equal(ref.steps, 20);
    assert_true(ref.eval_samples == 31);
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const variant *x = &variants[v];
        if (run_np(x->np, x->dir, x->extra) != 0)
            fail_msg("%s failed:\n%s\n%s", x->dir, tmp_text("out"), tmp_text("err"));
        run_result r;
        read_metrics(x->dir, &r);
        assert_same_losses(&ref, &r, x->dir);
        /* every eval sample counted once over the ranks, the same answers */
        assert_true(r.eval_samples == 31);
        assert_true(fabs(r.top1 - ref.top1) < 1e-9);
        assert_same_weights("one", x->dir);
    }
}

/* The bytes one rank sends per step (ring algorithms, see host/comm_stats.h):
 * DDP all-reduces the gradients, 2 (w-1)/w of their bytes; ZeRO-1 does too
 * and gathers the updated parameters once, 3 (w-1)/w; ZeRO-3 gathers every
 * unit's parameters in forward and again in backward and reduce-scatters
 * the gradients, 3 (w-1)/w; ZeRO-2 gathers once, 2 (w-1)/w.
 * The plugins pad (64-byte aligned parameters, shards a multiple of the
 * world size), so the figures are met within 6% on this small model. */
static void test_bytes_per_step(void **state) {
    (void)state;
    char *out = NULL;
    run_one();
    out = tmp_text("one/recipe.yaml"); /* the folder exists */
    free(out);
    /* the parameter count from the banner of a run */
    assert_int_equal(run_np(2, "bytes_ddp2", "--set run.steps=4"), 0);
    char *banner = tmp_text("out");
    const char *p = strstr(banner, "vithost: ");
    p = p ? strstr(p, " parameters") : NULL;
    assert_non_null(p);
    while (p > banner && p[-1] != ' ') p--;
    double params = strtod(p, NULL);
    free(banner);
    assert_true(params > 1000);
    struct {
        const char *dir;
        int np;
        const char *extra;
        double factor; /* x (w-1)/w x 4 bytes x params */
    } cases[] = {
        {"bytes_ddp2", 2, NULL, 2.0},
        {"bytes_ddp3", 3, "--set run.steps=4", 2.0},
        {"bytes_z1_3", 3, "--set run.steps=4 --set sharding.plugin=zero1", 3.0},
        {"bytes_z3_3", 3, "--set run.steps=4 --set sharding.plugin=fsdp", 3.0},
        {"bytes_z2_3", 3,
         "--set run.steps=4 --set sharding.plugin=fsdp --set sharding.reshard_after_forward=false",
         2.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].extra && run_np(cases[i].np, cases[i].dir, cases[i].extra) != 0)
            fail_msg("%s failed: %s", cases[i].dir, tmp_text("err"));
        run_result r;
        read_metrics(cases[i].dir, &r);
        double w = cases[i].np;
        double expect = cases[i].factor * (w - 1) / w * 4.0 * params;
        double rel = (r.comm_bytes - expect) / expect;
        print_message("%s: %.0f bytes per step, analytic %.0f (%+.1f%%)\n", cases[i].dir,
                      r.comm_bytes, expect, 100 * rel);
        if (!(rel >= 0.0 && rel < 0.06))
            fail_msg("%s: %.0f bytes per step, analytic %.0f (%+.1f%%)", cases[i].dir,
                     r.comm_bytes, expect, 100 * rel);
    }
}

/* Bytes of "optimizer state <n> <unit>" in the run's memory report (its
 * stdout, tmp_dir/out), or -1. */
static double reported_state(void) {
    char *out = tmp_text("out");
    const char *p = strstr(out, "optimizer state ");
    double bytes = -1.0;
    if (p) {
        char unit[8] = "";
        double v = 0.0;
        if (sscanf(p + strlen("optimizer state "), "%lf %7[A-Za-z]", &v, unit) == 2) {
            static const char *const units[] = {"B", "KiB", "MiB", "GiB"};
            for (int i = 0; i < 4; i++)
                if (strcmp(unit, units[i]) == 0) bytes = v * pow(1024.0, i);
        }
    }
    free(out);
    return bytes;
}

/* The run's memory report: zero1's optimizer state on each of 2 ranks is
 * half of ddp's, within the shards' padding (at most 15 elements a unit and
 * slot: 5 units, 2 AdamW slots, here about 3%). */
static void test_zero1_reports_half_the_state(void **state) {
    (void)state;
    if (run_np(2, "mem_ddp2", "--set run.steps=1") != 0)
        fail_msg("ddp on 2 failed: %s", tmp_text("err"));
    const double ddp = reported_state();
    if (run_np(2, "mem_z1_2", "--set run.steps=1 --set sharding.plugin=zero1") != 0)
        fail_msg("zero1 on 2 failed: %s", tmp_text("err"));
    const double z1 = reported_state();
    print_message("optimizer state per rank: ddp %.0f bytes, zero1 %.0f bytes (x%.4f)\n", ddp,
                  z1, z1 / ddp);
    assert_true(ddp > 0 && z1 > 0);
    assert_true(z1 / ddp >= 0.5 && z1 / ddp < 0.54);
}

/* 10 steps on 2 processes of `plugin`, stopped with a checkpoint; the rest
 * on 3 and on 1 (the same global batch): both end where the uninterrupted
 * run ends. */
static void resume_on_another_world_size(const char *plugin) {
    char half[64], on3[64], on1[64], set[64];
    snprintf(half, sizeof half, "%s_half2", plugin);
    snprintf(on3, sizeof on3, "%s_on3", plugin);
    snprintf(on1, sizeof on1, "%s_on1", plugin);
    snprintf(set, sizeof set, "--set sharding.plugin=%s", plugin);
    char extra[128];
    snprintf(extra, sizeof extra, "--stop-after 10 %s", set);
    int code = run_np(2, half, extra);
    assert_int_equal(code, 5); /* stopped, with a checkpoint (VH_EXIT_STOPPED) */
    assert_int_equal(sh("cp -r %s %s && cp -r %s %s", half, on3, half, on1), 0);
    if (sh(MPIRUN " -np 3 %s run eq.yaml --out %s --resume --set run.batch_size=4 %s",
           VH_TEST_VITHOST, on3, set) != 0)
        fail_msg("%s: resume on 3 failed: %s", plugin, tmp_text("err"));
    if (sh("OMP_NUM_THREADS=1 %s run eq.yaml --out %s --resume --set run.batch_size=12 %s",
           VH_TEST_VITHOST, on1, set) != 0)
        fail_msg("%s: resume on 1 failed: %s", plugin, tmp_text("err"));
    run_result ref, r3, r1;
    read_metrics("one", &ref);
    read_metrics(on3, &r3);
    read_metrics(on1, &r1);
    assert_same_losses(&ref, &r3, on3);
    assert_same_losses(&ref, &r1, on1);
    assert_same_weights("one", on3);
    assert_same_weights("one", on1);
}

static void test_resume_on_another_world_size(void **state) {
    (void)state;
    run_one();
    resume_on_another_world_size("fsdp");
    resume_on_another_world_size("zero1");
}

/* Whether two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    return sh("cmp -s %s %s", a, b) == 0;
}

/* A checkpoint save sends each rank's optimizer state to rank 0 (the
 * communicator's gather, ABI 2.3); it writes the very files the save of
 * before wrote (each tensor summed over the ranks, still taken for a
 * backend without the gather, VITHOST_TEST_COMM_NO_GATHER=1): fsdp on 3
 * (pieces of uneven, padded shards) and zero1 on 2. Resuming from it is
 * test_resume_on_another_world_size's. */
static void test_gathered_save_is_the_summed_save(void **state) {
    (void)state;
    static const struct { int np; const char *plugin; } runs[] = {{3, "fsdp"}, {2, "zero1"}};
    for (int k = 0; k < 2; k++) {
        const char *how[2] = {"", "-x VITHOST_TEST_COMM_NO_GATHER=1"};
        const char *said[2] = {"optim state: gathered to rank 0", "optim state: summed"};
        for (int g = 0; g < 2; g++) {
            int code = sh(MPIRUN " %s -np %d %s run eq.yaml --out save%d_%d --stop-after 4 "
                          "--trace --set run.batch_size=%d --set sharding.plugin=%s",
                          how[g], runs[k].np, VH_TEST_VITHOST, k, g, 12 / runs[k].np,
                          runs[k].plugin);
            if (code != 5) fail_msg("%s on %d: exit %d: %s", runs[k].plugin, runs[k].np, code,
                                    tmp_text("err"));
            char *out = tmp_text("out");
            if (!strstr(out, said[g]))
                fail_msg("%s: no '%s' in the trace", runs[k].plugin, said[g]);
            free(out);
        }
        for (int f = 0; f < 2; f++) {
            char a[128], b[128];
            const char *file = f ? "optim" : "model";
            snprintf(a, sizeof a, "save%d_0/checkpoints/step-00000004/%s.safetensors", k, file);
            snprintf(b, sizeof b, "save%d_1/checkpoints/step-00000004/%s.safetensors", k, file);
            if (!same_file(a, b)) fail_msg("%s on %d: %s differs", runs[k].plugin, runs[k].np, a);
        }
    }
}

/* `vithost run eq.yaml ARGS` on two ranks, rank 1 in a mount namespace
 * where an empty tmpfs covers MOUNT (another machine that cannot see it):
 * mpirun's exit status. */
static int run_rank1_over_tmpfs(const char *mount, const char *args) {
    return sh(VH_TEST_MPIRUN " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 "
              "-np 1 %s run eq.yaml %s : -np 1 unshare -m sh -c 'mount -t tmpfs none %s && "
              "exec %s run eq.yaml %s'",
              VH_TEST_VITHOST, args, mount, VH_TEST_VITHOST, args);
}

/* Every rank reads the checkpoint it resumes from: a rank that cannot (here
 * rank 1 sees an empty folder, as on another machine without the shared
 * file system) ends every rank before anything is loaded, with one message
 * naming the rank and the file. Needs a mount namespace (root). */
static void test_resume_refused_where_a_rank_cannot_read(void **state) {
    (void)state;
    if (sh("unshare -m true") != 0) {
        print_message("SKIPPED: no mount namespace here (unshare -m needs root)\n");
        return;
    }
    int code = run_np(2, "unread", "--stop-after 2 --set sharding.plugin=fsdp");
    assert_int_equal(code, 5);
    code = run_rank1_over_tmpfs("unread/checkpoints/step-00000002",
                                "--out unread --resume --set run.batch_size=6 "
                                "--set sharding.plugin=fsdp");
    assert_true(code != 0);
    char *err = tmp_text("err");
    if (!strstr(err, "unread/checkpoints/step-00000002/state.json cannot be read on rank 1 of "
                     "2 (No such file or directory)") ||
        !strstr(err, "all ranks share"))
        fail_msg("no message naming rank 1 and the file:\n%s", err);
    free(err);
}

/* A new run whose folder rank 1 cannot see (its `shared` is an empty tmpfs:
 * another machine without the shared file system) is refused up front on
 * every rank, before a step: a resume would have rank 1 read checkpoints
 * it cannot see. Needs a mount namespace (root). */
static void test_run_refused_where_a_rank_cannot_see_the_folder(void **state) {
    (void)state;
    if (sh("unshare -m true") != 0) {
        print_message("SKIPPED: no mount namespace here (unshare -m needs root)\n");
        return;
    }
    assert_int_equal(sh("mkdir -p shared"), 0);
    int code = run_rank1_over_tmpfs("shared", "--out shared/run --set run.batch_size=6");
    assert_true(code != 0);
    char *err = tmp_text("err");
    if (!strstr(err, "the run folder shared/run, which rank 0 writes, cannot be seen on rank 1 "
                     "of 2 (shared/run/run.json: No such file or directory)"))
        fail_msg("no message naming rank 1 and the folder:\n%s", err);
    free(err);
    assert_true(sh("test -e shared/run/checkpoints/step-00000001") != 0); /* no step ran */
}

/* Whether process `pid` runs in tmp_dir: ours, not another run's (several
 * test runs may share the machine). */
static int in_tmp_dir(const char *pid) {
    char path[300], cwd[512];
    snprintf(path, sizeof path, "/proc/%s/cwd", pid);
    ssize_t n = readlink(path, cwd, sizeof cwd - 1);
    if (n < 0) return 0;
    cwd[n] = '\0';
    return strcmp(cwd, tmp_dir) == 0;
}

/* The pid of the vithost process of a rank of this test, from its
 * environment. Only processes whose working folder is this test's own
 * mkdtemp folder count: another job's ranks on the machine never do. */
static pid_t rank_pid(int rank) {
    DIR *proc = opendir("/proc");
    if (!proc) return -1;
    struct dirent *e;
    pid_t found = -1;
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    while (found < 0 && (e = readdir(proc))) {
        char path[300], buf[65536];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 2, f);
        fclose(f);
        buf[n] = buf[n + 1] = '\0'; /* a one-word cmdline: an empty second word */
        if (!strstr(buf, "vithost") || !strstr(buf + strlen(buf) + 1, "run")) continue;
        /* (the first word is the executable; mpirun's own is not vithost) */
        if (strstr(buf, "mpirun") || strstr(buf, "orterun") || !in_tmp_dir(e->d_name)) continue;
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        f = fopen(path, "rb");
        if (!f) continue;
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
            if (strcmp(buf + i, want) == 0) found = (pid_t)atoi(e->d_name);
    }
    closedir(proc);
    return found;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Starts `cmd` in tmp_dir in the background; its pid. */
static pid_t start(const char *cmd) {
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(tmp_dir) != 0) _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits up to `limit` seconds; the exit code, or -1 (still running: killed). */
static int wait_for(pid_t pid, double limit, double *took) {
    double t0 = now_s();
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (now_s() - t0 > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            *took = now_s() - t0;
            return -1;
        }
        usleep(50 * 1000);
    }
    *took = now_s() - t0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static const char long_run[] =
    " -np 3 " VH_TEST_VITHOST " run eq.yaml --out %s --set run.steps=1000000 "
    "--set run.eval_every=0 --set run.batch_size=4 --set run.log_every=5 %s >%s.out 2>%s.err";

static void test_killed_rank_ends_the_run(void **state) {
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, MPIRUN "%s", long_run);
    char full[2400];
    snprintf(full, sizeof full, cmd, "killed", "", "killed", "killed");
    pid_t mpirun = start(full);
    /* wait for training to be under way on rank 0 */
    double t0 = now_s();
    for (;;) {
        char *out = tmp_text("killed.out");
        int training = strstr(out, "train step") != NULL;
        free(out);
        if (training) break;
        if (now_s() - t0 > 60) {
            kill(mpirun, SIGKILL);
            fail_msg("training did not start: %s", tmp_text("killed.err"));
        }
        usleep(100 * 1000);
    }
    pid_t victim = rank_pid(1);
    assert_true(victim > 0);
    assert_int_equal(kill(victim, SIGKILL), 0);
    double took;
    int code = wait_for(mpirun, 60, &took);
    if (code == -1) fail_msg("the other ranks still ran 60 s after rank 1 was killed");
    assert_true(code != 0);
    char *err = tmp_text("killed.err");
    /* the launcher's words: which rank, which signal */
    if (!strstr(err, "signal 9") && !strstr(err, "Killed"))
        fail_msg("no message names the killed rank:\n%s", err);
    print_message("rank 1 killed: every rank ended in %.1f s, status %d\n", took, code);
    free(err);
    /* no process of the run is left */
    assert_true(rank_pid(0) < 0 && rank_pid(2) < 0);
}

/* Only rank 0 checks the run folder: when it refuses (a folder that already
 * holds a run), ranks 1 and 2 are already waiting in a collective; they must
 * not wait forever. */
static void test_one_rank_failing_ends_the_run(void **state) {
    (void)state;
    run_one();
    char cmd[2048], full[2400];
    snprintf(cmd, sizeof cmd, MPIRUN "%s", long_run);
    snprintf(full, sizeof full, cmd, "one", "", "failing", "failing");
    double took;
    int code = wait_for(start(full), 60, &took);
    if (code == -1) fail_msg("ranks still ran 60 s after rank 0 failed");
    assert_true(code != 0);
    char *err = tmp_text("failing.err");
    if (!strstr(err, "rank 0 of 3") || !strstr(err, "already holds a run"))
        fail_msg("the failing rank's message is missing:\n%s", err);
    print_message("rank 0 failed: every rank ended in %.1f s, status %d\n", took, code);
    free(err);
}

int main(void) {
    if (strlen(VH_TEST_MPIRUN) == 0) {
        printf("test_sharding_mpi: SKIPPED: OpenMPI (mpirun) not found at configure time\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_losses_and_weights),
        cmocka_unit_test(test_bytes_per_step),
        cmocka_unit_test(test_resume_on_another_world_size),
        cmocka_unit_test(test_gathered_save_is_the_summed_save),
        cmocka_unit_test(test_resume_refused_where_a_rank_cannot_read),
        cmocka_unit_test(test_run_refused_where_a_rank_cannot_see_the_folder),
        cmocka_unit_test(test_zero1_reports_half_the_state),
        cmocka_unit_test(test_one_rank_failing_ends_the_run),
        cmocka_unit_test(test_killed_rank_ends_the_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
