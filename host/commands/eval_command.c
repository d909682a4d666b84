/* eval_command.c - `vithost eval` (see eval_command.h). The weights load
 * strictly: every parameter from the file, no tensor left over. */
#define _POSIX_C_SOURCE 200809L
#include "eval_command.h"

#include <stdio.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "command.h"
#include "session.h"
#include "weights.h"

/* A run folder (its latest checkpoint), a checkpoint folder, or a file. */
static void weights_file_of(const char *weights, char *path, size_t len) {
    snprintf(path, len, "%s", weights);
    struct stat sb;
    if (stat(weights, &sb) != 0 || !S_ISDIR(sb.st_mode)) return;
    char ckpt[4300];
    vh_diag ignore;
    if (checkpoint_latest(weights, ckpt, sizeof ckpt, &ignore) == VH_STATUS_OK)
        snprintf(path, len, "%s/model.safetensors", ckpt);
    else
        snprintf(path, len, "%s/model.safetensors", weights);
}

vh_status eval_command(vh_run *run, const char *weights, FILE *out, vh_diag *d) {
    vh_session s;
    char path[4400];
    weights_file_of(weights, path, sizeof path);
    vh_status st = session_open(&s, run, d);
    if (st == VH_STATUS_OK) st = weights_load_model(&s, path, VH_WEIGHTS_MODE_STRICT, d);
    vh_eval_result r;
    if (st == VH_STATUS_OK) st = session_evaluate(&s, &r, d);
    if (st == VH_STATUS_OK && run->comm.rank == 0) /* of many ranks, one answer */
        fprintf(out, "{\"eval_top1\": %.6f, \"eval_top5\": %.6f, \"eval_loss\": %.6f, "
                     "\"samples\": %lld, \"weights\": \"%s\"}\n",
                r.top1, r.top5, r.loss, (long long)r.samples, path);
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
    run_close(&run);
    if (st != VH_STATUS_OK) fprintf(err, "vithost: %s\n", d.text);
    return command_exit_code(st);
}
