/* cli.h - the vithost command line. main() is only `return cli_main(...)`. */
#ifndef VITHOST_HOST_CLI_H
#define VITHOST_HOST_CLI_H

#include <stdio.h>

#include "exit_codes.h"

int cli_main(int argc, char **argv, FILE *out, FILE *err);

#endif
