#!/usr/bin/env python3
"""bench_sharding.py - DDP vs FSDP on this machine's cores, one process per rank, in one run.

    python3 bench/bench_sharding.py [--build build] [--configs T2] [--ranks 2] [--steps 12]

For each configuration (bench_step.py's letters) and the same global batch, it runs
`vithost run` on synthetic data:

    1 x N threads   one process, ddp (nothing to communicate): the baseline
    N x 1 thread    mpirun -np N, ddp (gradients all-reduced per bucket, overlapping backward)
    N x 1 thread    mpirun -np N, fsdp reshard_after_forward: false (ZeRO-2)
    N x 1 thread    mpirun -np N, fsdp (ZeRO-3: parameters gathered in forward and in backward)

and prints the CPU model, then per row: median images/s after the warm-up (the job's, all
ranks), the ratio to the baseline, ms per step, MiB sent per step by each rank (host/
comm_stats.h: ring figures), ms per step spent waiting on collectives, and the bytes of
parameters + gradients + masters + optimizer state each rank holds (the run's memory line).
A benchmark, not a test: ctest never runs it. Timings drift +-30% between runs on shared
machines: compare within one run.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_step import CONFIGS, cpu_facts  # noqa: E402

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def recipe(cfg, steps, warmup, batch):
    dim, depth, heads, mlp, patch, ch, side, classes = cfg[:8]
    return f"""run:       {{ device: cpu, seed: 0, steps: {steps + warmup}, batch_size: {batch},
             eval_every: 0, log_every: 1 }}
model:     {{ plugin: vit, dim: {dim}, depth: {depth}, heads: {heads}, mlp_dim: {mlp},
             patch_size: {patch} }}
precision: {{ plugin: fp32 }}
sharding:  {{ plugin: ddp }}
optim:     {{ plugin: mta, algo: adamw, lr: 1.0e-4, weight_decay: 0.05 }}
data:      {{ plugin: synthetic, channels: {ch}, image_size: {side}, num_classes: {classes},
             train_size: {batch * 8 * (steps + warmup)}, eval_size: {batch * 8} }}
"""


def state_bytes(stdout):
    """params + grads + masters + optimizer state of rank 0, from the memory line."""
    m = re.search(r"params ([\d.]+) (\w+), grads ([\d.]+) (\w+), masters ([\d.]+) (\w+), "
                  r"optimizer state ([\d.]+) (\w+)", stdout)
    if not m:
        return None
    g = m.groups()
    return sum(float(g[i]) * UNITS[g[i + 1]] for i in range(0, 8, 2))


def run(build, cfg, ranks, threads, extra, steps, warmup, global_batch):
    work = tempfile.mkdtemp(prefix="bench-sharding-")
    try:
        path = os.path.join(work, "r.yaml")
        with open(path, "w") as f:
            f.write(recipe(cfg, steps, warmup, global_batch // ranks))
        out = os.path.join(work, "run")
        cmd = [os.path.join(build, "vithost"), "run", path, "--out", out] + extra
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "core",
                   "-x", f"OMP_NUM_THREADS={threads}", "-np", str(ranks)] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(f"  exit {r.returncode}: {' '.join(cmd)}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
            return None
        rates, comm, wait = [], [], []
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                m = json.loads(line)
                if "img_per_s" in m and m["step"] > warmup:
                    rates.append(m["img_per_s"])
                    comm.append(m.get("comm_bytes_per_step", 0.0))
                    wait.append(m.get("comm_wait_ms_per_step", 0.0))
        img_s = statistics.median(rates)
        return {"img_s": img_s, "step_ms": 1e3 * global_batch / img_s,
                "comm_mib": statistics.median(comm) / (1 << 20),
                "wait_ms": statistics.median(wait), "state": state_bytes(r.stdout)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--configs", default="T2")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    model, isa = cpu_facts()
    n = a.ranks
    print(f"CPU: {model} ({os.cpu_count()} cores; {' '.join(isa)})")
    rows = [
        (f"1 x {n} threads, ddp", 1, n, []),
        (f"{n} x 1 thread, ddp", n, 1, []),
        (f"{n} x 1 thread, fsdp ZeRO-2", n, 1,
         ["--set", "sharding.plugin=fsdp", "--set", "sharding.reshard_after_forward=false"]),
        (f"{n} x 1 thread, fsdp ZeRO-3", n, 1, ["--set", "sharding.plugin=fsdp"]),
    ]
    for name in a.configs.split(","):
        cfg = CONFIGS[name]
        global_batch = cfg[8]
        print(f"\n{name}: global batch {global_batch}, {a.steps} steps after {a.warmup} warm-up, "
              "fp32, synthetic data")
        print(f"| {'run':28} | img/s | vs 1 proc | ms/step | MiB sent/step | wait ms/step |"
              " params+grads+masters+state per rank |")
        print(f"|{'-' * 30}|-------|-----------|---------|---------------|--------------|"
              "-------------------------------------|")
        base = None
        for label, ranks, threads, extra in rows:
            r = run(a.build, cfg, ranks, threads, extra, a.steps, a.warmup, global_batch)
            if not r:
                continue
            base = base or r["img_s"]
            state = f"{r['state'] / (1 << 20):.1f} MiB" if r["state"] else "?"
            print(f"| {label:28} | {r['img_s']:5.1f} | {r['img_s'] / base:8.2f}x |"
                  f" {r['step_ms']:7.1f} | {r['comm_mib']:13.2f} | {r['wait_ms']:12.1f} |"
                  f" {state:>35} |", flush=True)


if __name__ == "__main__":
    main()
