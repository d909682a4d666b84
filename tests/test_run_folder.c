/* test_run_folder.c - what a run folder promises under concurrent and killed
 * jobs (issue 19, points 2, 4 and part of 10):
 *
 *   - one job per run folder: two jobs started at once on one --out, 20
 *     times, leave one winner and one metrics file of its lines; a --resume
 *     (one process or mpirun -np 2) into the folder of a live job is refused
 *     naming its pid and host, and resumes once that job is killed;
 *   - a checkpoint replacement killed (SIGKILL, by the VITHOST_TEST_KILL_AT
 *     hook) at each of its phases, with and without the one-rename swap,
 *     leaves a checkpoint the next --resume continues from;
 *   - a refused resume names the key and both values; a missing state.json
 *     or checkpoint folder names the one to use and the command; a run.json
 *     that cannot be written names the file and the system's reason.
 */
#define _DEFAULT_SOURCE /* usleep */
#include <dirent.h>
#include <fcntl.h>
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
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static char tmp_dir[256];

static char *tmp_text(const char *name) { return harness_read(tmp_dir, name); }

/* Runs vithost with ARGS (a format) in tmp_dir; its exit code (137: killed
 * by SIGKILL, as the shell reports it), output in out and err. */
#define vithost(...) harness_sh(tmp_dir, VH_TEST_VITHOST " " __VA_ARGS__)
#define sh(...) harness_sh(tmp_dir, __VA_ARGS__)

static void write_file(const char *name, const char *text) {
    assert_int_equal(harness_write(tmp_dir, name, text), 0);
}

/* 4 steps of a small ViT: about 0.2 s, most of it before the first step
 * (plugins, parameters, data), where two jobs used to overlap. */
static const char race_recipe[] =
    "run: {steps: 4, batch_size: 8, log_every: 1, eval_every: 0}\n"
    "model: {plugin: vit, dim: 64, depth: 2, heads: 2, mlp_dim: 128, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: adamw, lr: 1.0e-3}\n"
    "data: {plugin: synthetic, channels: 3, image_size: 32, num_classes: 10,\n"
    "       train_size: 64, eval_size: 8}\n";

/* 6 steps, a checkpoint every 2, two kept: saves of new steps, a rotation,
 * and a resumed finished run saving step 6 again. */
static const char ckpt_recipe[] =
    "run: {steps: 6, batch_size: 16, log_every: 1, eval_every: 0, checkpoint_every: 2,\n"
    "      keep_checkpoints: 2}\n"
    "model: {plugin: test_model}\n"
    "precision: {plugin: test_precision}\n"
    "sharding: {plugin: test_sharding}\n"
    "optim: {plugin: test_optim, lr: 0.1, momentum: 0.9}\n"
    "data: {plugin: test_data, train_size: 128}\n";

/* A job that trains until it is killed, with checkpoints on the way; the
 * real plugins, so that it also resumes under mpirun. */
static const char live_recipe[] =
    "run: {steps: 1000000, batch_size: 4, log_every: 1000, eval_every: 0,\n"
    "      checkpoint_every: 20, seed: 1}\n"
    "model: {plugin: vit, dim: 8, depth: 1, heads: 2, mlp_dim: 8, patch_size: 4}\n"
    "precision: {plugin: fp32}\n"
    "sharding: {plugin: ddp}\n"
    "optim: {plugin: mta, algo: adamw, lr: 1.0e-3}\n"
    "data: {plugin: synthetic, channels: 3, image_size: 8, num_classes: 5,\n"
    "       train_size: 64, eval_size: 8}\n";

static int setup(void **state) {
    (void)state;
    if (harness_mkdtemp(tmp_dir, sizeof tmp_dir, "run-folder") != 0) return -1;
    setenv("VITHOST_PLUGIN_PATH", "", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    unsetenv("VITHOST_TEST_KILL_AT");
    write_file("race.yaml", race_recipe);
    write_file("ckpt.yaml", ckpt_recipe);
    write_file("live.yaml", live_recipe);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return harness_rmdir(tmp_dir);
}

/* ---- starting jobs side by side -------------------------------------------- */

/* Forks `vithost run RECIPE --out OUT [--resume]` in tmp_dir, output in
 * tmp_dir/OUT.TAG.out and .err; it execs once the pipe `go` is closed, so
 * two jobs start at the same moment (NULL: at once). */
static pid_t start_job(const char *recipe, const char *out, const char *tag, const int *go) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (go) close(go[1]); /* (else the pipe never ends) */
    char path[512], buf[1];
    if (chdir(tmp_dir) != 0) _exit(120);
    snprintf(path, sizeof path, "%s.%s.out", out, tag);
    int fd_out = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    snprintf(path, sizeof path, "%s.%s.err", out, tag);
    int fd_err = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_out < 0 || fd_err < 0) _exit(121);
    dup2(fd_out, 1);
    dup2(fd_err, 2);
    if (go && read(go[0], buf, 1) < 0) _exit(122); /* EOF: the parent closed it */
    execl(VH_TEST_VITHOST, "vithost", "run", recipe, "--out", out, (char *)NULL);
    _exit(123);
}

static int exit_code(pid_t pid) {
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

/* The "step" of every training line of a metrics file, in order. */
static int train_steps(const char *name, int *steps, int max) {
    char *text = tmp_text(name), *save = NULL;
    int n = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        if (!strstr(line, "eval_top1") && n < max) steps[n++] = atoi(strstr(line, "\"step\":") + 7);
    free(text);
    return n;
}

static void assert_steps_once(const char *metrics, int last) {
    int steps[256];
    int n = train_steps(metrics, steps, 256);
    if (n != last) fail_msg("%s holds %d training lines, not %d", metrics, n, last);
    for (int i = 0; i < n; i++) assert_int_equal(steps[i], i + 1);
}

/* Two jobs on one --out, started together, 20 times: one runs, the other
 * is refused at once naming the winner (or, if the winner was already done,
 * finds its run); metrics.jsonl holds the winner's lines only. */
static void test_two_jobs_one_folder(void **state) {
    (void)state;
    for (int round = 0; round < 20; round++) {
        char out[32], name[64];
        snprintf(out, sizeof out, "race%d", round);
        int go[2];
        assert_int_equal(pipe(go), 0);
        pid_t a = start_job("race.yaml", out, "a", go);
        pid_t b = start_job("race.yaml", out, "b", go);
        close(go[0]);
        close(go[1]);
        int code_a = exit_code(a), code_b = exit_code(b);
        if ((code_a == 0) == (code_b == 0))
            fail_msg("round %d: exit codes %d and %d: not one winner", round, code_a, code_b);
        pid_t winner = code_a == 0 ? a : b;
        snprintf(name, sizeof name, "%s.%s.err", out, code_a == 0 ? "b" : "a");
        char *err = tmp_text(name), in_use[128];
        snprintf(in_use, sizeof in_use, "%s is in use by another job (pid %ld on host ", out,
                 (long)winner);
        if (!strstr(err, in_use) && !strstr(err, "already holds a run"))
            fail_msg("round %d: the loser's message: %s", round, err);
        if (strstr(err, in_use)) assert_int_equal(code_a == 0 ? code_b : code_a, 1);
        free(err);
        snprintf(name, sizeof name, "%s/metrics.jsonl", out);
        assert_steps_once(name, 4);
    }
}

/* Waits until the live job has written its first checkpoint. */
static void wait_for_checkpoint(const char *out) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/checkpoints/latest", tmp_dir, out);
    for (int i = 0; i < 600 && access(path, F_OK) != 0; i++) usleep(50 * 1000);
    assert_int_equal(access(path, F_OK), 0);
}

static pid_t live = -1; /* the job test_resume_into_a_live_job started */

static int kill_live_job(void **state) {
    (void)state;
    if (live > 0) {
        kill(live, SIGKILL);
        waitpid(live, NULL, 0);
    }
    live = -1;
    return 0;
}

/* A --resume into the folder of a job still training (a scheduler's
 * requeue while the old job lives) is refused naming it, in one process
 * and in two; a new run there too. Once the job is killed the OS has
 * released its lock and the resume goes on. */
static void test_resume_into_a_live_job(void **state) {
    (void)state;
    live = start_job("live.yaml", "live", "job", NULL);
    wait_for_checkpoint("live");
    char host[256] = "", holder[512];
    gethostname(host, sizeof host);
    snprintf(holder, sizeof holder, "(pid %ld on host %s since ", (long)live, host);
    /* (a timeout: a resume that is not refused would train on) */
    assert_int_equal(sh("timeout 60 " VH_TEST_VITHOST " run live.yaml --out live --resume"), 1);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "--resume: live is in use by a job that is still running "));
    assert_non_null(strstr(err, holder));
    free(err);
    assert_int_equal(sh("timeout 60 " VH_TEST_VITHOST " run live.yaml --out live"), 1);
    err = tmp_text("err");
    assert_non_null(strstr(err, "live is in use by another job "));
    free(err);
#ifdef VH_TEST_MPIRUN
    if (VH_TEST_MPIRUN[0]) { /* rank 0 is refused; every rank ends, none hangs */
        int code = sh("timeout 120 " VH_TEST_MPIRUN " --oversubscribe --allow-run-as-root "
                      "-x OMP_NUM_THREADS=1 -np 2 " VH_TEST_VITHOST " run live.yaml --out live "
                      "--resume --set run.comm=mpi --set run.batch_size=2");
        assert_true(code != 0 && code != 124);
        err = tmp_text("err");
        assert_non_null(strstr(err, "is in use by a job that is still running "));
        assert_non_null(strstr(err, holder));
        free(err);
    }
#endif
    assert_int_equal(kill(live, SIGKILL), 0);
    assert_int_equal(exit_code(live), -SIGKILL);
    live = -1;
    assert_int_equal(vithost("run live.yaml --out live --resume --stop-after 1"), 5);
    char *out = tmp_text("out");
    assert_non_null(strstr(out, "resuming from live/checkpoints/step-"));
    free(out);
}

/* ---- a checkpoint replacement killed at each phase ------------------------- */

/* No .tmp-step-* or .old-step-* left in DIR/checkpoints. */
static void assert_no_leftovers(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/checkpoints", tmp_dir, dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, ".tmp-", 5) || !strncmp(e->d_name, ".old-", 5))
            fail_msg("%s/%s was left behind", path, e->d_name);
    closedir(d);
}

static void assert_latest(const char *dir, const char *name) {
    char path[256], want[64];
    snprintf(path, sizeof path, "%s/checkpoints/latest", dir);
    snprintf(want, sizeof want, "%s\n", name);
    char *latest = tmp_text(path);
    assert_string_equal(latest, want);
    free(latest);
}

/* A resumed finished run saves step 6 again, replacing the checkpoint it
 * resumed from; killed at each phase of that (the one-rename swap, and the
 * path of filesystems without it), the next --resume continues from step 6
 * and leaves nothing behind. */
static void test_resave_killed_at_each_phase(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"checkpoint", "written"},        {"checkpoint", "swapped"},
        {"checkpoint", "latest"},         {"checkpoint", "removing"},
        {"checkpoint-noswap", "written"}, {"checkpoint-noswap", "aside"},
        {"checkpoint-noswap", "placed"},  {"checkpoint-noswap", "latest"},
        {"checkpoint-noswap", "removing"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[32], want[128];
        snprintf(dir, sizeof dir, "re%zu", i);
        assert_int_equal(vithost("run ckpt.yaml --out %s", dir), 0);
        int code = sh("VITHOST_TEST_KILL_AT=%s:%s " VH_TEST_VITHOST
                      " run ckpt.yaml --out %s --resume", cases[i][0], cases[i][1], dir);
        if (code != 137) fail_msg("%s:%s: exit %d, not killed", cases[i][0], cases[i][1], code);
        assert_int_equal(vithost("run ckpt.yaml --out %s --resume", dir), 0);
        char *out = tmp_text("out");
        snprintf(want, sizeof want, "resuming from %s/checkpoints/step-00000006 (step 6,", dir);
        if (!strstr(out, want)) fail_msg("%s:%s: %s", cases[i][0], cases[i][1], out);
        free(out);
        if (strcmp(cases[i][1], "aside") == 0) { /* `latest` named a missing folder */
            char *err = tmp_text("err");
            assert_non_null(strstr(err, "latest named step-00000006, which was missing (a job "
                                        "was killed while replacing it): put back "));
            free(err);
        }
        assert_latest(dir, "step-00000006");
        assert_no_leftovers(dir);
    }
}

/* Saves of new steps killed at each phase (of step 4's; removing: the
 * rotation at step 6 that drops step 2): the resume continues from the
 * checkpoint `latest` named, and the metrics hold steps 1 to 6 once. */
static void test_new_step_killed_at_each_phase(void **state) {
    (void)state;
    static const char *const cases[][2] = {{"written:4", "step-00000002"},
                                           {"placed:4", "step-00000002"},
                                           {"latest:4", "step-00000004"},
                                           {"removing", "step-00000006"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[32], want[128], metrics[64];
        snprintf(dir, sizeof dir, "new%zu", i);
        int code = sh("VITHOST_TEST_KILL_AT=checkpoint:%s " VH_TEST_VITHOST
                      " run ckpt.yaml --out %s", cases[i][0], dir);
        if (code != 137) fail_msg("%s: exit %d, not killed", cases[i][0], code);
        assert_int_equal(vithost("run ckpt.yaml --out %s --resume", dir), 0);
        char *out = tmp_text("out");
        snprintf(want, sizeof want, "resuming from %s/checkpoints/%s ", dir, cases[i][1]);
        if (!strstr(out, want)) fail_msg("%s: %s", cases[i][0], out);
        free(out);
        assert_latest(dir, "step-00000006");
        assert_no_leftovers(dir);
        snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
        assert_steps_once(metrics, 6);
    }
}

/* `latest` naming a folder that is gone, with no copy to put back: the
 * message names the newest whole checkpoint and the command. */
static void test_missing_checkpoint_folder_names_the_fix(void **state) {
    (void)state;
    assert_int_equal(vithost("run ckpt.yaml --out gone"), 0);
    assert_int_equal(sh("rm -r gone/checkpoints/step-00000006"), 0);
    assert_int_equal(vithost("run ckpt.yaml --out gone --resume"), 1);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "gone/checkpoints/latest names step-00000006, which does not "
                                "exist"));
    assert_non_null(strstr(err, "the newest whole checkpoint is gone/checkpoints/step-00000004 "
                                "(to resume from it: echo step-00000004 > "
                                "gone/checkpoints/latest)"));
    free(err);
    write_file("gone/checkpoints/latest", "step-00000004\n"); /* the command, as it says */
    assert_int_equal(vithost("run ckpt.yaml --out gone --resume"), 0);
    assert_latest("gone", "step-00000006");
}

/* ---- messages ------------------------------------------------------------------ */

static void test_refused_resume_names_the_key(void **state) {
    (void)state;
    assert_int_equal(vithost("run ckpt.yaml --out key --stop-after 2"), 5);
    assert_int_equal(vithost("run ckpt.yaml --out key --resume --set optim.lr=0.2"), 3);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "optim.lr is 0.2 now, but key was started with 0.1"));
    free(err);
    /* a key the recipe left at its default */
    assert_int_equal(vithost("run ckpt.yaml --out key --resume --set data.noise=2"), 3);
    err = tmp_text("err");
    assert_non_null(strstr(err, "data.noise is 2 now, but key was started with 0.5"));
    free(err);
}

static void test_missing_state_json_offers_the_previous(void **state) {
    (void)state;
    assert_int_equal(vithost("run ckpt.yaml --out st"), 0);
    assert_int_equal(sh("rm st/checkpoints/step-00000006/state.json"), 0);
    assert_int_equal(vithost("run ckpt.yaml --out st --resume"), 1);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "st/checkpoints/step-00000006/state.json: No such file or "
                                "directory; the previous checkpoint is "
                                "st/checkpoints/step-00000004 (to resume from it: echo "
                                "step-00000004 > st/checkpoints/latest)"));
    free(err);
}

/* run.json on a full disk (/dev/full): the file and the reason, exit 1. */
static void test_run_json_write_is_checked(void **state) {
    (void)state;
    assert_int_equal(sh("mkdir full && ln -s /dev/full full/run.json"), 0);
    assert_int_equal(vithost("run ckpt.yaml --out full"), 1);
    char *err = tmp_text("err");
    assert_non_null(strstr(err, "cannot write full/run.json: No space left on device"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_jobs_one_folder),
        cmocka_unit_test_teardown(test_resume_into_a_live_job, kill_live_job),
        cmocka_unit_test(test_resave_killed_at_each_phase),
        cmocka_unit_test(test_new_step_killed_at_each_phase),
        cmocka_unit_test(test_missing_checkpoint_folder_names_the_fix),
        cmocka_unit_test(test_refused_resume_names_the_key),
        cmocka_unit_test(test_missing_state_json_offers_the_previous),
        cmocka_unit_test(test_run_json_write_is_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
