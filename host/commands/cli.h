/* cli.h - the vithost command line. main() is only `return cli_main(...)`. */
#ifndef VITHOST_HOST_CLI_H
#define VITHOST_HOST_CLI_H

#include <stdio.h>

/* Exit codes, documented in --help and the README. */
enum {
    VH_EXIT_OK = 0,
    VH_EXIT_RUN_FAILED = 1,  /* a plugin, the device or the data failed mid-run */
    VH_EXIT_USAGE = 2,       /* the command line is wrong */
    VH_EXIT_RECIPE = 3,      /* the recipe (or a --set) is invalid */
    VH_EXIT_PLUGIN = 4,      /* a plugin could not be found, loaded or accepted */
    VH_EXIT_STOPPED = 5,     /* stopped early (signal, --stop-after) with a checkpoint */
};

int cli_main(int argc, char **argv, FILE *out, FILE *err);

#endif
