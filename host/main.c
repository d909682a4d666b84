/* main.c - the vithost executable. */
#include <stdio.h>

#include "cli.h"

int main(int argc, char **argv) { return cli_main(argc, argv, stdout, stderr); }
