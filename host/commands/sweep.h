/* sweep.h - `vithost sweep`: one recipe benchmarked under several changes,
 * each row a child `vithost bench --json` (under `mpirun -np N` with
 * --np N), written as a Markdown table, an SVG bar chart of throughput
 * relative to the first row (the form of Meta's ViT-at-scale study: one
 * bar per configuration) and the raw JSON.
 *
 *   vithost sweep RECIPE --vary KEY=V1,V2 [--vary KEY=V1,V2]...
 *       every combination; the first --vary changes slowest
 *   vithost sweep RECIPE --sequence [--base LABEL] --step [LABEL:]KEY=V[,KEY=V]...
 *       a cumulative ablation: row 0 is the recipe as it is, row i applies
 *       the changes of steps 1..i (a later step may override an earlier one)
 *
 * Common options: --set KEY=V (every row), --steps N, --warmup K, --np N,
 * --out DIR (default runs/sweep-<recipe>), --title TEXT, --repeat N (3):
 * each row N times, the rows taking turns (row 0, row 1, ..., row 0, ...) so
 * a busy machine's load falls on every row alike; the numbers are the
 * medians, with img/s's min-max (whiskers on the chart) and a warning on a
 * spread (max - min) / median over 10%. --repeat 1 runs each row once. A
 * sweep started under mpirun is refused: it runs as one process and starts
 * its rows under mpirun itself (--np). $VITHOST_MPIRUN replaces the launcher
 * ("mpirun"; e.g. "mpirun --bind-to core"). */
#ifndef VITHOST_HOST_SWEEP_H
#define VITHOST_HOST_SWEEP_H

#include <stdio.h>

/* argv[1] is "sweep". Returns an exit code (cli.h): 0 when every row ran. */
int sweep_main(int argc, char **argv, FILE *out, FILE *err);

#endif
