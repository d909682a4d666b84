/* run_command.c - `vithost run`: the run opened, trained to the end (or a
 * stop) by train_run, and how it ended said once. */
#include "command.h"
#include "train_loop.h"

int run_main(const cli_args *a, FILE *out, FILE *err) {
    vh_run run;
    vh_run_options opts = {.recipe_path = a->recipe, .sets = a->sets, .num_sets = a->num_sets,
                           .out_dir = a->out_dir, .trace = a->trace, .out = out};
    int code = command_open_run(&run, &opts, err);
    if (code != VH_EXIT_OK) return code;
    vh_diag d = {{0}};
    vh_train_options to = {.out_dir = a->out_dir, .resume = a->resume,
                           .stop_after = a->stop_after};
    vh_status st = train_run(&run, &to, &d);
    /* Of many ranks, rank 0 says how the run ended (the others stopped at
     * the same step for the same reason, or failed together). Before
     * run_close: once the ranks have left MPI, a launcher ending the job
     * after its own SIGTERM no longer forwards what they print. */
    int say = run.comm.rank == 0 || (st != VH_STATUS_ERR_INTERRUPTED && !run.failed_together);
    if (st != VH_STATUS_OK && say) fprintf(err, "vithost: %s\n", d.text);
    fflush(err);
    run_close(&run);
    return command_exit_code(st);
}
