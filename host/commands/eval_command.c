/* eval_command.c - `vithost eval` (see eval_command.h). The weights load
 * strictly: every parameter from the file, no tensor left over. */
#define _POSIX_C_SOURCE 200809L
#include "eval_command.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "command.h"
#include "session.h"
#include "weights.h"

/* A run folder (its latest checkpoint), a checkpoint folder, or a file. */
/* The weights file `weights` names: itself, a checkpoint folder's
 * model.safetensors, or a run folder's latest checkpoint's. A run folder
 * whose `latest` cannot be followed is an error that names the fix (eval
 * only reports: it holds no lock, so it repairs nothing). */
static vh_status weights_file_of(const char *weights, char *path, size_t len, vh_diag *d) {
    snprintf(path, len, "%s", weights);
    struct stat sb;
    if (stat(weights, &sb) != 0 || !S_ISDIR(sb.st_mode)) return VH_STATUS_OK;
    char ckpt[4300], checkpoints[4300];
    snprintf(checkpoints, sizeof checkpoints, "%s/checkpoints", weights);
    if (stat(checkpoints, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(path, len, "%s/model.safetensors", weights); /* a checkpoint folder */
        return VH_STATUS_OK;
    }
    vh_status st = checkpoint_latest(weights, ckpt, sizeof ckpt, d);
    if (st == VH_STATUS_OK) snprintf(path, len, "%s/model.safetensors", ckpt);
    return st;
}

/* Weights of a checkpoint folder that were refused (damaged, NaN): the
 * checkpoint before it, when the run folder kept one. */
static void offer_previous(const char *path, vh_diag *d) {
    char dir[4400], prev[4400];
    const char *slash = strrchr(path, '/');
    if (!slash) return;
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    const char *name = strrchr(dir, '/');
    if (strncmp(name ? name + 1 : dir, "step-", 5) != 0) return;
    checkpoint_previous(dir, prev, sizeof prev);
    if (!prev[0]) return;
    size_t used = strlen(d->text);
    snprintf(d->text + used, sizeof d->text - used,
             "; the checkpoint before it is %s (evaluate it with --checkpoint %s)", prev, prev);
}

/* The one JSON line; a result that did not reach stdout (a full disk under
 * `> file`) is a failure, not an exit 0 with nothing written. */
static vh_status print_result(FILE *out, const vh_eval_result *r, const char *path,
                              vh_diag *d) {
    fprintf(out, "{\"eval_top1\": %.6f, \"eval_top5\": %.6f, \"eval_loss\": %.6f, "
                 "\"samples\": %lld, \"weights\": \"%s\"}\n",
            r->top1, r->top5, r->loss, (long long)r->samples, path);
    errno = 0;
    if (fflush(out) == 0 && !ferror(out)) return VH_STATUS_OK;
    int e = errno ? errno : EIO;
    return diag_set(d, VH_STATUS_ERR_IO,
                    "cannot write the result to standard output: %s (errno %d)", strerror(e), e);
}

vh_status eval_command(vh_run *run, const char *weights, FILE *out, vh_diag *d) {
    vh_session s;
    memset(&s, 0, sizeof s); /* session_close is safe on a session never opened */
    char path[4400];
    vh_status st = weights_file_of(weights, path, sizeof path, d);
    if (st == VH_STATUS_OK) st = session_open(&s, run, d);
    if (st == VH_STATUS_OK) {
        st = weights_load_model(&s, path, VH_WEIGHTS_MODE_STRICT, d);
        if (st == VH_STATUS_ERR_FORMAT || st == VH_STATUS_ERR_IO || st == VH_STATUS_ERR_NUMERIC)
            offer_previous(path, d);
    }
    vh_eval_result r;
    if (st == VH_STATUS_OK) st = session_evaluate(&s, &r, d);
    if (st == VH_STATUS_OK && run->comm.rank == 0) /* of many ranks, one answer */
        st = print_result(out, &r, path, d);
    run_fail_all_ranks(run, st, d->text);
    session_close(&s);
    return st;
}

int eval_main(const cli_args *a, FILE *out, FILE *err) {
    vh_run run;
    vh_run_options opts = {.recipe_path = a->recipe, .sets = a->sets, .num_sets = a->num_sets,
                           .out = err}; /* stdout carries only the JSON */
    int code = command_open_run(&run, &opts, err);
    if (code != VH_EXIT_OK) return code;
    vh_diag d = {{0}};
    vh_status st = eval_command(&run, a->checkpoint, out, &d);
    int say = run.comm.rank == 0 || !run.failed_together; /* (agree.h) */
    run_close(&run);
    if (st != VH_STATUS_OK && say) fprintf(err, "vithost: %s\n", d.text);
    return command_exit_code(st);
}
