#!/usr/bin/env python3
"""main_job.py - train the main job (or any recipes) start to finish and say how long it took
and how accurate it got: the wall-time-to-accuracy benchmark, with its logs.

    python3 bench/main_job.py [--build build] [--out runs/main-job] [--threads 2]
                              [--report docs/main-job.md] [RECIPE...] [-- --set K=V ...]

Default recipe: configs/fashion-mnist-vit.yaml. Each recipe is trained with
`vithost run RECIPE --out OUT/NAME` (one after another, never two at once: they would share
the cores), timed from the command's start to its exit, and its run folder is kept: the log
(`OUT/NAME.log`, everything the run printed) and `OUT/NAME/metrics.jsonl`. The report (stdout,
and --report FILE when given) names the CPU, its ISA, the threads and the command, then per
recipe: wall seconds, median img/s of the training lines, the last and best eval top-1, the
last eval top-1 of the EMA weights where the recipe keeps them (optim.ema_decay), steps and
skipped steps (loss scaling).

A benchmark, not a test: ctest never runs it. Timings drift +-30% between runs on shared
machines; accuracy is exact to the seed on the CPU (the same recipe gives the same numbers).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_step import cpu_facts  # noqa: E402


def read_metrics(path):
    train, evals = [], []
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            (evals if "eval_top1" in m else train).append(m)
    return train, evals


def run_one(build, recipe, out, sets, threads):
    name = os.path.splitext(os.path.basename(recipe))[0]
    run_dir = os.path.join(out, name)
    log_path = os.path.join(out, name + ".log")
    if os.path.exists(run_dir):
        sys.exit(f"main_job.py: {run_dir} exists; choose another --out or remove it")
    cmd = [os.path.join(build, "vithost"), "run", recipe, "--out", run_dir]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.monotonic() - start
    if rc != 0:
        sys.exit(f"main_job.py: {' '.join(cmd)} exited {rc}; see {log_path}")
    train, evals = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    if not evals:
        sys.exit(f"main_job.py: {recipe} evaluated nothing (run.eval_every is 0?); see {log_path}")
    rates = [m["img_per_s"] for m in train if m.get("img_per_s") and not m.get("skipped")]
    return {
        "recipe": recipe,
        "wall_s": wall,
        "img_per_s": statistics.median(rates) if rates else float("nan"),
        "last_top1": evals[-1]["eval_top1"],
        "best_top1": max(e["eval_top1"] for e in evals),
        # the EMA of the weights (optim.ema_decay), evaluated beside them: its own model
        "last_ema_top1": evals[-1].get("ema_top1"),
        "steps": train[-1]["step"] if train else 0,
        "skipped": train[-1].get("skipped_steps", 0) if train else 0,
        "log": log_path,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="runs/main-job")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report", help="also write the report (markdown) to this file")
    ap.add_argument("recipes", nargs="*", default=["configs/fashion-mnist-vit.yaml"])
    argv, sets = sys.argv[1:], []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
        sets = [rest[j + 1] for j in range(0, len(rest) - 1, 2) if rest[j] == "--set"]
    args = ap.parse_args(argv)
    if not os.access(os.path.join(args.build, "vithost"), os.X_OK):
        sys.exit(f"main_job.py: no {args.build}/vithost; build first")
    os.makedirs(args.out, exist_ok=True)
    model, isa = cpu_facts()
    this = "python3 bench/main_job.py " + " ".join(sys.argv[1:])
    lines = [f"CPU: {model}; ISA: {' '.join(isa) or '-'}; threads: {args.threads}",
             f"command: `{this}`", "",
             "| recipe | wall | img/s (median) | test top-1 (last) | best | EMA top-1 (last) | steps "
             "| skipped |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines[:2]), flush=True)
    for recipe in args.recipes:
        r = run_one(args.build, recipe, args.out, sets, args.threads)
        row = (f"| {r['recipe']} | {r['wall_s']:.0f} s ({r['wall_s'] / 60:.1f} min) | "
               f"{r['img_per_s']:.0f} | {100 * r['last_top1']:.2f}% | "
               f"{100 * r['best_top1']:.2f}% | "
               + (f"{100 * r['last_ema_top1']:.2f}%" if r["last_ema_top1"] is not None else "-")
               + f" | {r['steps']} | {r['skipped']} |")
        lines.append(row)
        print(row + f"   (log: {r['log']})", flush=True)
    if args.report:
        with open(args.report, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
