/* command.h - what the commands built on the run-time share: the command
 * line of `run`, `eval` and `check` as cli.c parsed it, opening the run
 * with its message, and the exit code of a status. */
#ifndef VITHOST_HOST_COMMAND_H
#define VITHOST_HOST_COMMAND_H

#include <stdio.h>

#include "cli.h"
#include "runtime.h"

/* `vithost COMMAND RECIPE [options]`, parsed by cli.c. */
typedef struct cli_args {
    const char *command;
    const char *recipe;
    const char **sets;
    int num_sets;
    const char *out_dir;
    const char *describe;
    const char *checkpoint;
    int trace, resume;
    long long stop_after;
} cli_args;

/* run_open, and on failure its message on err, the run closed and the exit
 * code (a plugin not loaded, out of memory, else the recipe); VH_EXIT_OK
 * when the run is open. */
int command_open_run(vh_run *run, const vh_run_options *opts, FILE *err);

/* The exit code of a finished command: 0, the recipe, stopped early, or the
 * run failed. */
int command_exit_code(vh_status st);

/* The commands cli.c parses for; each returns an exit code (cli.h). The
 * others (bench, sweep, plot, new-plugin) parse their own options. */
int run_main(const cli_args *a, FILE *out, FILE *err);
int eval_main(const cli_args *a, FILE *out, FILE *err);
int check_main(const cli_args *a, FILE *out, FILE *err);
int plugins_main(const cli_args *a, FILE *out, FILE *err);

#endif
