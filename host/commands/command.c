/* command.c - what the commands share (see command.h). */
#include "command.h"

int command_open_run(vh_run *run, const vh_run_options *opts, FILE *err) {
    vh_diag d = {{0}};
    vh_status st = run_open(run, opts, &d);
    if (st == VH_STATUS_OK) return VH_EXIT_OK;
    fprintf(err, "%s\n", d.text);
    int code = run->load_failed              ? VH_EXIT_PLUGIN
               : st == VH_STATUS_ERR_NOMEM ? VH_EXIT_RUN_FAILED
                                           : VH_EXIT_RECIPE;
    run_close(run);
    return code;
}

int command_exit_code(vh_status st) {
    switch (st) {
    case VH_STATUS_OK: return VH_EXIT_OK;
    case VH_STATUS_ERR_CONFIG: return VH_EXIT_RECIPE;
    case VH_STATUS_ERR_INTERRUPTED: return VH_EXIT_STOPPED;
    default: return VH_EXIT_RUN_FAILED;
    }
}
