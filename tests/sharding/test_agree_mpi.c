/* test_agree_mpi.c - a job of many processes under mpirun agrees on what it
 * runs, stops cleanly on the launcher's signals, and exits as one process
 * would:
 *
 *   - an MPMD launch whose two recipes differ in optim.lr is refused before
 *     the first step, with one message naming the key and both values; the
 *     same value written two ways (and run.comm auto against mpi) trains;
 *   - another sharding plugin on one rank is refused the same way (before,
 *     OpenMPI's MPI_ERR_OTHER);
 *   - SIGTERM to mpirun stops every rank with a checkpoint and prints the
 *     `continue with: mpirun -np 2 vithost run ...` line, which resumes;
 *     SIGUSR1 to mpirun does the same and mpirun exits 5 (after its own
 *     SIGTERM OpenMPI's mpirun always exits 1, which the line says);
 *   - a recipe error found once the ranks are running exits 3 under mpirun,
 *     as in one process (it was 2).
 *
 * Without mpirun (VH_TEST_MPIRUN empty) the program exits 77 (skipped).
 */
#define _DEFAULT_SOURCE /* usleep */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char tmp_dir[256];

#define MPIRUN VH_TEST_MPIRUN " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1"
/* a launch that may hang (ranks in collectives that do not match) ends */
#define MPIRUN_60 "timeout 60 " MPIRUN

#define sh(...) harness_sh(tmp_dir, __VA_ARGS__)

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

/* fail_msg with a malloc'd text (from tmp_text) printed under the message:
 * the text is freed before the test fails (cmocka's longjmp would leak it). */
#define fail_free(text, ...)                \
    do {                                    \
        char *text_ = (text);               \
        print_error(__VA_ARGS__);           \
        print_error("\n%s\n", text_);        \
        free(text_);                        \
        fail();                             \
    } while (0)

/* A small ViT on synthetic data; line 5 is optim. */
static const char recipe[] =
    "run: {steps: 4, log_every: 1, eval_every: 0, seed: 3, batch_size: 4}\n"
    "model: {plugin: vit, dim: 16, depth: 2, heads: 2, mlp_dim: 24, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: adamw, lr: 3.0e-3, weight_decay: 0.05}\n"
    "data: {plugin: synthetic, channels: 3, image_size: 8, num_classes: 5,\n"
    "       train_size: 240, eval_size: 31, pool_size: 40}\n";

static void write_file(const char *name, const char *text) {
    assert_int_equal(harness_write(tmp_dir, name, text), 0);
}

/* The recipe with its first `from` replaced by `to`. */
static void write_variant(const char *name, const char *from, const char *to) {
    char text[2048];
    const char *at = strstr(recipe, from);
    assert_non_null(at);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - recipe), recipe, to, at + strlen(from));
    write_file(name, text);
}

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "agree") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    write_file("a.yaml", recipe);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

static int exists(const char *name) {
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    return stat(path, &sb) == 0;
}

/* A refused launch: exit 3, the message once, no MPI error, nothing written. */
static void assert_refused(int code, const char *dir, const char *expect) {
    char *err = tmp_text("err");
    if (code != 3 || !strstr(err, expect) || count(err, "do not run the same thing") != 1 ||
        strstr(err, "MPI_ERR") || exists(dir))
        fail_free(err, "exit %d (want 3), want once: %s", code, expect);
    free(err);
}

/* ---- ranks agree before the first step --------------------------------------- */

static void test_mpmd_with_another_lr_is_refused(void **state) {
    (void)state;
    write_variant("b.yaml", "lr: 3.0e-3", "lr: 0.1");
    int code = sh(MPIRUN_60 " -np 1 %s run a.yaml --out lr : -np 1 %s run b.yaml --out lr",
                  VH_TEST_VITHOST, VH_TEST_VITHOST);
    assert_refused(code, "lr",
                   "optim.lr is '3.0e-3' (a.yaml:5) on rank 0 but '0.1' (b.yaml:5) on rank 1");
    /* the same value written another way, and run.comm auto against mpi:
     * the same run, which trains */
    write_variant("c.yaml", "lr: 3.0e-3", "lr: 0.003");
    code = sh(MPIRUN_60 " -np 1 %s run a.yaml --out same : -np 1 %s run c.yaml --out same "
                     "--set run.comm=mpi",
              VH_TEST_VITHOST, VH_TEST_VITHOST);
    if (code != 0) fail_free(tmp_text("err"), "equal recipes refused (exit %d):", code);
}

static void test_another_sharding_on_one_rank_is_refused(void **state) {
    (void)state;
    int code = sh(MPIRUN_60 " -np 2 %s run a.yaml --out sh : -np 1 %s run a.yaml --out sh "
                         "--set sharding.plugin=fsdp",
                  VH_TEST_VITHOST, VH_TEST_VITHOST);
    assert_refused(code, "sh", "sharding.plugin is 'ddp ");
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "(a.yaml:4) on rank 0 but 'fsdp "));
    assert_non_null(strstr(err, "(--set) on rank 2"));
    free(err);
}

/* ---- signals under mpirun ------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mpirun -np 2 on a long run into `dir`, output in dir.out/dir.err; its pid
 * once rank 0 trains. A line each 250 steps: few enough a second (at most
 * about 40 here), as after its own SIGTERM mpirun stops reading the ranks'
 * output for 2 s (SIGCONT, 1 s, SIGTERM, 1 s, SIGKILL), and a rank blocked
 * writing a full pipe would not stop in time; yet soon enough under load.
 * Two ranks oversubscribed beside another MPI test take 13 ms a step here
 * (0.24 alone), and the first line at step 5000 once missed 120 s in CI. */
static pid_t start_long_run(const char *dir) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec " MPIRUN " -np 2 %s run a.yaml --out %s --set run.steps=1000000 "
             "--set run.log_every=250 >%s.out 2>%s.err",
             VH_TEST_VITHOST, dir, dir, dir);
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(tmp_dir) != 0) _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char out[300];
    snprintf(out, sizeof out, "%s.out", dir);
    for (double t0 = now_s();; usleep(100 * 1000)) {
        char *text = tmp_text(out);
        int training = strstr(text, "train step") != NULL;
        free(text);
        if (training) return pid;
        /* generous: a sanitizer build on a busy 2-core machine takes tens of
         * seconds to start two ranks; a normal start returns in about one */
        if (now_s() - t0 > 120) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            char err[300];
            snprintf(err, sizeof err, "%s.err", dir);
            char *out_text = tmp_text(out);
            print_error("%s: no train step line within 120 s; it printed:\n%s\n", dir, out_text);
            free(out_text);
            fail_free(tmp_text(err), "%s:", err);
        }
    }
}

/* Waits up to 30 s for mpirun; its exit code. */
static int wait_mpirun(pid_t pid) {
    int status = 0;
    for (double t0 = now_s(); waitpid(pid, &status, WNOHANG) != pid; usleep(50 * 1000))
        if (now_s() - t0 > 30) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("mpirun still ran 30 s after the signal");
        }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The stop line in `err_name`: its step, its continue command (in a static
 * buffer, so that a failed check after it leaks nothing) with `vithost` as
 * the test's and mpirun's test flags. */
static const char *stopped_line(const char *err_name, long *step) {
    char *err = tmp_text(err_name);
    const char *line = strstr(err, "vithost: stopped at step ");
    if (!line) fail_free(err, "no stop line:");
    *step = strtol(line + strlen("vithost: stopped at step "), NULL, 10);
    const char *again = strstr(line, "continue with: mpirun -np 2 vithost run a.yaml ");
    if (!again) fail_free(err, "the continue line does not keep mpirun -np 2:");
    again += strlen("continue with: mpirun -np 2 vithost");
    const char *end = strchr(again, '\n');
    static char cmd[4096];
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s%.*s", VH_TEST_VITHOST,
             (int)(end ? end - again : (long)strlen(again)), again);
    free(err);
    return cmd;
}

static void assert_checkpoint(const char *dir, long step) {
    char name[256];
    snprintf(name, sizeof name, "%s/checkpoints/step-%08ld/model.safetensors", dir, step);
    if (!exists(name)) fail_msg("no checkpoint %s", name);
}

static void test_sigterm_to_mpirun_stops_with_a_checkpoint(void **state) {
    (void)state;
    pid_t mpirun = start_long_run("term");
    assert_int_equal(kill(mpirun, SIGTERM), 0);
    int code = wait_mpirun(mpirun);
    long step = 0;
    const char *again = stopped_line("term.err", &step);
    char *err = tmp_text("term.err");
    /* OpenMPI's mpirun exits 1 after its own SIGTERM; the line says so */
    if (code != 1 || !strstr(err, "(signal) with a checkpoint (mpirun itself exits 1"))
        fail_free(err, "exit %d:", code);
    free(err);
    assert_checkpoint("term", step);
    /* the printed command continues the run */
    code = sh("timeout 60 %s --stop-after 3", again);
    err = tmp_text("err");
    char expect[64];
    snprintf(expect, sizeof expect, "stopped at step %ld (--stop-after)", step + 3);
    if (code != 5 || !strstr(err, expect))
        fail_free(err, "resume: exit %d, want 5 and '%s':", code, expect);
    free(err);
    assert_checkpoint("term", step + 3);
}

static void test_sigusr1_to_mpirun_stops_with_exit_5(void **state) {
    (void)state;
    pid_t mpirun = start_long_run("usr1");
    assert_int_equal(kill(mpirun, SIGUSR1), 0);
    int code = wait_mpirun(mpirun);
    long step = 0;
    stopped_line("usr1.err", &step);
    char *err = tmp_text("usr1.err");
    if (code != 5 || strstr(err, "mpirun itself exits 1")) fail_free(err, "exit %d:", code);
    free(err);
    assert_checkpoint("usr1", step);
}

/* ---- exit codes ----------------------------------------------------------------- */

/* model.heads is checked by the model plugin's create, once the ranks run. */
static void test_config_error_exits_3_in_one_process_and_many(void **state) {
    (void)state;
    int one = sh("%s run a.yaml --out h1 --set model.heads=3", VH_TEST_VITHOST);
    int many = sh(MPIRUN_60 " -np 2 %s run a.yaml --out h2 --set model.heads=3", VH_TEST_VITHOST);
    char *err = tmp_text("err");
    if (one != 3 || many != 3 || !strstr(err, "3 heads do not divide dim 16"))
        fail_free(err, "one process %d, mpirun %d (want 3 and 3):", one, many);
    free(err);
}

int main(void) {
    if (strlen(VH_TEST_MPIRUN) == 0) {
        printf("test_agree_mpi: SKIPPED: OpenMPI (mpirun) not found at configure time\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpmd_with_another_lr_is_refused),
        cmocka_unit_test(test_another_sharding_on_one_rank_is_refused),
        cmocka_unit_test(test_sigterm_to_mpirun_stops_with_a_checkpoint),
        cmocka_unit_test(test_sigusr1_to_mpirun_stops_with_exit_5),
        cmocka_unit_test(test_config_error_exits_3_in_one_process_and_many),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
