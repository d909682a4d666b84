/* exit_codes.h - the process's exit codes, the same in one process and
 * under mpirun (where a failing rank aborts every rank with its code).
 * Documented in --help, the README and docs/errors.md. */
#ifndef VITHOST_HOST_EXIT_CODES_H
#define VITHOST_HOST_EXIT_CODES_H

enum {
    VH_EXIT_OK = 0,
    VH_EXIT_RUN_FAILED = 1,  /* a plugin, the device or the data failed mid-run */
    VH_EXIT_USAGE = 2,       /* the command line is wrong */
    VH_EXIT_RECIPE = 3,      /* the recipe (or a --set) is invalid */
    VH_EXIT_PLUGIN = 4,      /* a plugin could not be found, loaded or accepted */
    VH_EXIT_STOPPED = 5,     /* stopped early (signal, --stop-after) with a checkpoint */
};

#endif
