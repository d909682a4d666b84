/* plot.h - `vithost plot RUN_DIR... -o FILE.svg`: the training loss, the
 * eval top-1 accuracy and the throughput (img/s) of several runs against
 * the step, overlaid, one panel each, from their metrics.jsonl, with a
 * legend of run names (the folders' names). */
#ifndef VITHOST_HOST_PLOT_H
#define VITHOST_HOST_PLOT_H

#include <stdio.h>

/* argv[1] is "plot". Returns an exit code (cli.h). */
int plot_main(int argc, char **argv, FILE *out, FILE *err);

/* The number after "key": in one line of flat JSON (as metrics.jsonl and
 * `vithost bench --json` write). 1 and *out set when it is a finite
 * number; 0 when the key is missing or null. */
int plot_json_number(const char *json, const char *key, double *out);

#endif
