#!/usr/bin/env python3
"""bench_step.py - vithost's full training step beside PyTorch's, in one run, on the same threads.

    /usr/bin/python3 bench/bench_step.py [--build build] [--configs T1,T2,T3] [--threads 2]
                                         [--precision fp32,amp] [--torch PY1,PY2 ...]
                                         [--torch-bf16 auto|yes|no] [--repeat 3] [--quick]

What one run prints (a benchmark, not a test: ctest never runs it):
1. the CPU model and the ISA features that decide the engine's kernels (avx2, avx512f,
   avx512_bf16, amx), and the thread count both sides get;
2. the GEMM peak of this machine as the SDK's CPU engine measures it, fp32 and bf16
   (build/bench/bench_gemm; measured again in every round, the best counts), and per
   PyTorch peer (--torch, a comma list or repeated: the first is the peer of record) its
   torch version and its own 2048^3 fp32 and bf16 matmul rate on the same threads, so a
   peer on fallback kernels shows at once;
3. per configuration and per vithost precision policy (--precision, a comma list: fp32, amp
   (bf16), fp16), the images/s of full training steps (data, forward, backward, AdamW):
   vithost through `vithost bench --json` (synthetic data, ddp, mta adamw; the median step after
   the warm-up; each run's line also gives bench/probe_threads' round trip between two threads
   just before it) and PyTorch through bench/torch/train_step.py (fp32, and bf16 autocast), each
   PyTorch case run with libgomp's default wait policy and with OMP_WAIT_POLICY=PASSIVE, the
   faster counted;
4. one table with the ratios (paired by round, see below), a column per peer, each with
   issue 20's goal (MISSED where it fails): vithost fp32 / torch fp32 (2.0x, 1.4x, 1.15x);
   vithost AMP-bf16 / torch bf16 autocast (1.3x); vithost AMP-bf16 / vithost fp32 (1.5x where
   the engine's bf16 GEMM peak is at least 1.8x its f32 one, else 0.95x: the line above the
   table names the machine's kind); the f32 GEMM peak share of vithost (85% on T3), twice:
   the median step over the best peak of all rounds, and the median of each round's step over
   that round's own peak (the goal's: on a shared machine the probe and the step of one round
   see the same load, while the best peak of three rounds against their median step counts
   every slow minute against the step);
5. where each vithost step went (the same runs, `--ops`): GEMMs (share, GFLOP/s), attention
   and the rest, and per configuration the ceiling of AMP-bf16 / fp32 on this CPU: the fp32
   step over (the AMP step's other ops + the fp32 GEMMs sped up by the bf16/f32 GEMM peak
   ratio), which says when a goal of 1.5x cannot hold for want of faster bf16 units; and
   bounds that hold were every op but the matmuls free: the GEMMs taking what they took and
   the attention's two products (six N x N x head_dim matmuls a head in a training step) at
   the engine's own GEMM peak of their dtype. Over that time: vithost fp32's share of the f32
   peak (the step's FLOPs; of the best peak, and of the profiled round's own peak, which the
   goal is judged on, with the step's GEMM rate as a share of that), vithost fp32 / each
   peer's fp32 and vithost AMP-bf16 / each peer's bf16 autocast (the peer's step). Where a
   bound is under its goal, the goal needs faster GEMMs, not faster other ops;
6. the peer of record's own GEMMs inside its step (torch.profiler over two more steps in the last
   round: mm/addmm for the linear layers, with their GFLOP/s, and bmm for attention) beside
   vithost's, and per goal over that peer what it leaves vithost's ops other than its GEMMs:
   where both sides run their GEMMs at one rate, a lead has to come from the rest alone.

Configurations (DESIGN.md's letters):
  T1  D64  L4  H4 P4,  28x28x1,  B128, 10 classes
  T2  D192 L12 H3 P4,  32x32x3,  B64,  10 classes
  T3  ViT-S/16 (D384 L12 H6 P16), 224x224x3, B8, 1000 classes
Timings drift +-30% between runs on shared machines, and a neighbour's load comes and goes over
minutes: compare ratios within one run. Each case runs --repeat rounds (default 3); in a round
each configuration in turn, each vithost case followed at once by the peers' same case (vithost
fp32, torch fp32, vithost AMP, torch bf16), so that a ratio's two sides share their minute. A
ratio, and its goal, is the median over rounds of each round's own ratio (paired, as
bench/ab_libs.sh pairs two builds); the ratio of the two sides' medians stands beside it in
brackets. The cases whose rounds spread over 10% are named under the table.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIGS = {
    #      dim depth heads mlp patch channels side classes batch steps warmup goal(fp32 vs torch)
    "T1": (64, 4, 4, 256, 4, 1, 28, 10, 128, 30, 5, 2.0),
    "T2": (192, 12, 3, 768, 4, 3, 32, 10, 64, 12, 3, 1.4),
    "T3": (384, 12, 6, 1536, 16, 3, 224, 1000, 8, 8, 2, 1.15),
}

# Issue 20's other goals: AMP-bf16 against torch's bf16 autocast; T3's share of the engine's own
# f32 GEMM peak; and AMP-bf16 against vithost fp32, which depends on the CPU's kind (amp_goal).
GOAL_AMP_VS_TORCH = 1.3
GOAL_PEAK_SHARE = {"T3": 0.85}


def amp_goal(peaks):
    """(goal of AMP-bf16 / vithost fp32, the machine's kind in words) from the engine's peaks."""
    f32, bf16 = peaks.get("f32"), peaks.get("bf16")
    if not f32 or not bf16:
        return None, "bf16 GEMM peak not measured"
    r = bf16 / f32
    if r >= 1.8:
        return 1.5, f"bf16 GEMM {r:.2f}x the f32 GEMM (>= 1.8x): AMP-bf16 goal 1.5x vithost fp32"
    return 0.95, f"bf16 GEMM {r:.2f}x the f32 GEMM (< 1.8x): AMP-bf16 goal 0.95x vithost fp32"


def goal_mark(value, goal):
    """' (goal 1.3x)' or ' (goal 1.3x MISSED)'."""
    return f" (goal {goal:g}x{'' if value >= goal else ' MISSED'})"


def under_bound(bound, goal, goal_text):
    """', under the <goal_text> goal: ...' where a goal is above what its bound allows."""
    return f", under the {goal_text} goal: it needs faster GEMMs" if goal and bound < goal else ""


def cpu_facts():
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")
           if x in flags]
    return model, isa


def gemm_peaks(build, quiet=False):
    exe = os.path.join(build, "bench", "bench_gemm")
    out = subprocess.run([exe, "10"], capture_output=True, text=True, check=True).stdout
    peaks = {}
    for line in out.splitlines():
        if line.startswith("PEAK "):
            p = json.loads(line[5:])
            peaks[p["dtype"]] = p["gflops"]
        elif not quiet:
            print("  " + line)
    return peaks


def roundtrip_ns(build):
    """bench/probe_threads: a cache line's round trip between two threads, ns (a few ms), or
    None. 3-4x its usual value marks minutes when a guest's two vCPUs sit on two L3 domains,
    which slowed T1 AMP by a sixth on the Zen 5 of bench/README.md."""
    exe = os.path.join(build, "bench", "probe_threads")
    r = subprocess.run([exe], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("ROUNDTRIP "):
            return json.loads(line[10:])["ns"]
    return None


def best_peaks(round_peaks):
    """The best of each dtype's peak over the rounds: a probe that fell in a slow minute of a
    shared machine must not decide the machine's kind (the 1.8x line)."""
    best = {}
    for peaks in round_peaks:
        for k, v in peaks.items():
            best[k] = max(best.get(k, 0.0), v)
    return best


def recipe(cfg, precision):
    dim, depth, heads, mlp, patch, ch, side, classes, batch, steps, warmup, _ = cfg
    return f"""run:       {{ device: cpu, seed: 0, epochs: 1, steps: {steps + warmup}, batch_size: {batch},
             eval_every: 0 }}
model:     {{ plugin: vit, dim: {dim}, depth: {depth}, heads: {heads}, mlp_dim: {mlp},
             patch_size: {patch} }}
precision: {{ plugin: {precision} }}
sharding:  {{ plugin: ddp }}
optim:     {{ plugin: mta, algo: adamw, lr: 1.0e-4, weight_decay: 0.05 }}
data:      {{ plugin: synthetic, channels: {ch}, image_size: {side}, num_classes: {classes},
             train_size: {batch * (steps + warmup) * 2}, eval_size: {batch} }}
"""


def run_vithost(build, name, cfg, precision, env, quick):
    """`vithost bench --ops --json`'s object (img_per_s: the median step's; ops: where the step
    went, op by op; the timing layer costs two clock reads per op), or None."""
    steps, warmup = cfg[9], cfg[10]
    if quick:
        steps, warmup = max(3, steps // 3), 1
    work = tempfile.mkdtemp(prefix=f"bench-{name}-")
    try:
        path = os.path.join(work, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(recipe(cfg, precision))
        cmd = [os.path.join(build, "vithost"), "bench", path, "--json", "--ops", "--steps",
               str(steps), "--warmup", str(warmup)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(f"  vithost {name} {precision}: exit {r.returncode}\n{r.stderr[-2000:]}")
            return None
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


# A peer's own matmul rate: a torch on reference or generic BLAS kernels is a slow peer, not a
# slow model. Median of up to 5 runs after a warm-up; stops early when one run is slow.
MATMUL_PROBE = r"""
import statistics, sys, time
try:
    import torch
except Exception as exc:
    print("SKIP", exc); sys.exit(3)
torch.set_num_threads(int(sys.argv[1]))
print("VERSION", torch.__version__)
n = 2048
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
    torch.mm(a, b)
    times, spent = [], 0.0
    while len(times) < 5 and spent < 10.0:
        t0 = time.perf_counter(); torch.mm(a, b); dt_s = time.perf_counter() - t0
        times.append(dt_s); spent += dt_s
    print("MATMUL", name, 2.0 * n ** 3 / statistics.median(times) / 1e9)
"""


def torch_peer(python, threads):
    """(version, {"fp32": GFLOP/s, "bf16": GFLOP/s}) of one interpreter's torch."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OMP_WAIT_POLICY="PASSIVE")
    r = subprocess.run([python, "-c", MATMUL_PROBE, str(threads)], capture_output=True,
                       text=True, env=env)
    version, rates = None, {}
    for line in r.stdout.splitlines():
        if line.startswith("VERSION"):
            version = line.split()[1]
        elif line.startswith("MATMUL"):
            rates[line.split()[1]] = float(line.split()[2])
    return version, rates


def run_torch(python, names, threads, autocast, quick, profile=False):
    """({config: img/s}, {config: (linear GEMM ms, attention GEMM ms, profiled step ms)}): the
    faster of the two wait policies per config, and with `profile` its GEMMS line."""
    jobs = []
    for n in names:
        dim, depth, heads, mlp, patch, ch, side, classes, batch, steps, warmup, _ = CONFIGS[n]
        if quick:
            steps, warmup = max(3, steps // 3), 1
        jobs += ["--job", f"name={n},batch={batch},channels={ch},side={side},patch={patch},"
                          f"dim={dim},depth={depth},heads={heads},mlp={mlp},classes={classes},"
                          f"steps={steps},warmup={warmup}"]
    best, gemms = {}, {}
    for policy in ("PASSIVE", None):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
        env.pop("OMP_WAIT_POLICY", None)
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        r = subprocess.run([python, os.path.join(HERE, "torch", "train_step.py"), "--threads",
                            str(threads), "--autocast", autocast] + jobs +
                           (["--gemm-profile"] if profile else []),
                           capture_output=True, text=True, env=env)
        faster = set()
        for line in r.stdout.splitlines():
            if line.startswith("INFO") and policy:
                print("  " + line)
            if line.startswith("SKIP"):
                print("  " + line)
                return {}, {}
            if line.startswith("RESULT"):
                _, n, median, _, _ = line.split()
                ms = float(median)
                if n not in best or ms < best[n]:
                    best[n] = ms
                    faster.add(n)
            if line.startswith("GEMMS") and line.split()[1] in faster:
                _, n, linear, attention, wall = line.split()
                gemms[n] = (float(linear), float(attention), float(wall))
        if r.returncode not in (0,):
            print(f"  torch ({autocast}): exit {r.returncode}: {r.stderr[-1500:]}")
    return {n: CONFIGS[n][8] / (ms / 1e3) for n, ms in best.items()}, gemms


def flops_per_image(cfg):
    """pycls convention: 6 x MACs of every matmul, attention's included."""
    dim, depth, heads, mlp, patch, ch, side, classes = cfg[:8]
    np_ = (side // patch) ** 2
    n = np_ + 1
    macs = np_ * ch * patch * patch * dim
    macs += depth * (n * dim * 3 * dim + 2 * n * n * dim + n * dim * dim + 2 * n * dim * mlp)
    macs += dim * classes
    return 6.0 * macs


def linear_flops_per_image(cfg):
    """6 x MACs of the linear layers alone (qkv, proj, fc1, fc2, head): what a peer's mm/addmm
    compute; its patch embedding is a convolution there."""
    dim, depth, heads, mlp, patch, ch, side, classes = cfg[:8]
    n = (side // patch) ** 2 + 1
    return 6.0 * (depth * (n * dim * 3 * dim + n * dim * dim + 2 * n * dim * mlp) + dim * classes)


def attention_flops_per_image(cfg):
    """6 x MACs of the attention's two products (Q K^T and P V) alone: forward and backward."""
    dim, depth = cfg[0], cfg[1]
    n = (cfg[6] // cfg[4]) ** 2 + 1
    return 6.0 * depth * 2 * n * n * dim


PRECISIONS = {"fp32": "fp32", "amp": "AMP-bf16", "fp16": "FP16"}
# The peers' case beside each vithost precision (FP16 has none).
PEER_KIND = {"fp32": "fp32", "amp": "bf16"}


def median_of(values):
    return statistics.median(values) if values else None


def spread_of(values):
    """(max - min) / median of a case's rounds, or None with fewer than two."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def round_shares(runs, round_peaks, cfg):
    """The median over rounds of (that round's fp32 GFLOP/s / that round's f32 GEMM peak), or
    None without both."""
    shares = []
    for run in runs:
        pk = round_peaks[run["round"]].get("f32")
        if pk and run.get("img_per_s"):
            shares.append(run["img_per_s"] * flops_per_image(cfg) / 1e9 / pk)
    return median_of(shares)


def split_step(run):
    """(step ms, GEMM ms, GEMM GFLOP/s, attention ms) of one `vithost bench --ops` object."""
    ops = run.get("ops") or {}
    by = ops.get("by_op", {})
    gemm = by.get("gemm", {})
    attn = sum(by.get(k, {}).get("ms_per_step", 0.0)
               for k in ("attention_forward", "attention_backward"))
    return ops.get("step_ms"), gemm.get("ms_per_step", 0.0), gemm.get("gflop_per_s"), attn


def print_profile(names, precisions, runs, peaks, peers, round_peaks=None):
    """Where each step went (the same runs as the table), and what that allows AMP against fp32:
    were every GEMM of the fp32 step as much faster in bf16 as the engine's bf16 GEMM peak is
    over its f32 one, and the rest of the step took what it took in the AMP run, AMP-bf16 /
    fp32 could reach at most fp32 step / (AMP rest + fp32 GEMMs / peak ratio)."""
    print()
    print("where the step goes (`vithost bench --ops`, the runs above), ms per step")
    print("| cfg | precision | step | GEMMs (share, GFLOP/s) | attention | rest |")
    print("|---|---|---|---|---|---|")
    for n in names:
        for p in precisions:
            run = runs[p].get(n)
            if not run or not run.get("ops"):
                continue
            step, gemm, rate, attn = split_step(run)
            if not step:
                continue
            gf = f", {rate:.0f}" if rate else ""
            print(f"| {n} | {PRECISIONS[p]} | {step:.2f} | {gemm:.2f} ({100 * gemm / step:.0f}%{gf})"
                  f" | {attn:.2f} | {step - gemm - attn:.2f} |")
    f32, bf16 = peaks.get("f32"), peaks.get("bf16")
    # Bounds with every op but the matmuls free, the attention's products at the engine's own
    # GEMM peak: a goal above its bound needs faster GEMMs.
    for n in names:
        a, b = runs.get("fp32", {}).get(n), runs.get("amp", {}).get(n)
        batch = CONFIGS[n][8]
        attn_gflop = attention_flops_per_image(CONFIGS[n]) * batch / 1e9
        out = []
        if a and a.get("ops") and f32:
            _, g32, g32_rate, _ = split_step(a)
            g32_rate = g32_rate or 0.0
            if g32:
                least_ms = g32 + attn_gflop / f32 * 1e3  # the step's time, all else free
                gflops = flops_per_image(CONFIGS[n]) * batch / (least_ms / 1e3) / 1e9
                share, share_goal = gflops / f32, GOAL_PEAK_SHARE.get(n)
                # The goal is a round's step over that round's own peak: the bound too, on the
                # profiled run's round (its GEMMs and its probe saw the same minutes' load).
                rp = (round_peaks[a["round"]].get("f32")
                      if round_peaks and a.get("round") is not None else None)
                own = (f", {100 * gflops / rp:.0f}% of its round's ({rp:.1f} GFLOP/s)"
                       if rp else "")
                judged = gflops / rp if rp else share
                g_own = f", {100 * g32_rate / rp:.0f}% of that" if rp else ""
                out.append(f"fp32 at most {100 * share:.0f}% of the best f32 peak{own} (its "
                           f"GEMMs {g32:.2f} ms at {g32_rate:.0f} GFLOP/s{g_own} + the "
                           f"attention's products {attn_gflop:.2f} GFLOP at the best peak "
                           f"{attn_gflop / f32 * 1e3:.2f} ms"
                           f"{under_bound(judged, share_goal, f'{100 * (share_goal or 0):.0f}%')})")
                for t in peers:
                    tf = t["fp32"].get(n)
                    if tf:
                        bound, goal = batch / tf * 1e3 / least_ms, CONFIGS[n][11]
                        out.append(f"fp32 / {t['label']} fp32 at most {bound:.2f}x"
                                   f"{under_bound(bound, goal, f'{goal:g}x')}")
        if b and b.get("ops") and bf16:
            _, g16, _, _ = split_step(b)
            least_ms = g16 + attn_gflop / bf16 * 1e3
            for t in peers:
                tbf = t["bf16"].get(n)
                if g16 and tbf:
                    step_t = batch / tbf * 1e3
                    bound = step_t / least_ms
                    under = under_bound(bound, GOAL_AMP_VS_TORCH, f"{GOAL_AMP_VS_TORCH:g}x")
                    out.append(f"AMP-bf16 / {t['label']} bf16 at most {bound:.2f}x "
                               f"({t['label']} step {step_t:.2f} ms; vithost's bf16 GEMMs "
                               f"{g16:.2f} ms + the attention's products at the bf16 peak "
                               f"{attn_gflop / bf16 * 1e3:.2f} ms{under})")
        if out:
            print(f"{n}, were every op but the matmuls free: " + "; ".join(out))
    print_peer_gemms(names, runs, peers)
    if "fp32" not in precisions or "amp" not in precisions or not f32 or not bf16:
        return
    ratio = bf16 / f32
    for n in names:
        a, b = runs["fp32"].get(n), runs["amp"].get(n)
        if not a or not b or not a.get("ops") or not b.get("ops"):
            continue
        s32, g32, _, _ = split_step(a)
        s16, g16, _, _ = split_step(b)
        if not s32 or not s16:
            continue
        ceiling = s32 / ((s16 - g16) + g32 / ratio)
        print(f"{n}: AMP-bf16 / fp32 ceiling {ceiling:.2f}x (fp32 step {s32:.2f} ms, its GEMMs "
              f"{g32:.2f} ms / {ratio:.2f}; the AMP step's other ops {s16 - g16:.2f} ms)")


def print_peer_gemms(names, runs, peers):
    """The peer of record's GEMMs in its own step (torch.profiler, the last round) beside
    vithost's, and what a goal over the peer leaves vithost for everything but its GEMMs: where
    both run their GEMMs at one rate, a lead comes only from the other ops."""
    if not peers or not peers[0].get("gemms"):
        return
    t = peers[0]
    lines = []
    for n in names:
        for key, p in (("fp32", "fp32"), ("bf16", "amp")):
            g = t["gemms"].get(key, {}).get(n)
            rate = t[key].get(n) if key in t else None
            run = runs.get(p, {}).get(n)
            if not g or not rate or not run or not run.get("ops"):
                continue
            linear, attn, wall = g
            step_v, gemm_v, gf_v, _ = split_step(run)
            if not linear or not step_v or not gf_v:
                continue
            step_t = CONFIGS[n][8] / rate * 1e3
            lf = linear_flops_per_image(CONFIGS[n]) * CONFIGS[n][8] / 1e9
            goal = GOAL_AMP_VS_TORCH if key == "bf16" else CONFIGS[n][11]
            lines.append(f"| {n} | {key} | {step_t:.1f} | {linear:.1f} ({lf / (linear / 1e3):.0f})"
                         f" | {attn:.1f} | {wall:.1f} | {step_v:.1f} | {gemm_v:.1f} ({gf_v:.0f})"
                         f" | {goal:.2f}x: {step_t / goal - gemm_v:.1f} (now "
                         f"{step_v - gemm_v:.1f}) |")
    if not lines:
        return
    print()
    print(f"GEMMs inside each step, ms per step ({t['label']}: torch.profiler's self time of "
          "mm/addmm (GFLOP/s on the linear layers' FLOPs) and bmm, in a profiled step; vithost: "
          "its gemm op (GFLOP/s)); the last column: what the goal leaves vithost's ops other "
          "than its GEMMs")
    print(f"| cfg | dtype | {t['label']} step | its linear GEMMs | its attention bmm | its "
          "profiled step | vithost step | vithost GEMMs | goal: vithost's rest at most |")
    print("|---|---|---|---|---|---|---|---|---|")
    for line in lines:
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--configs", default="T1,T2,T3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32,amp",
                    help="vithost precision plugins, a comma list of fp32, amp (bf16), fp16")
    ap.add_argument("--torch", action="append",
                    help="interpreters that have torch, a comma list or repeated; the first is "
                         "the peer of record (default /usr/bin/python3)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds of every case, vithost's and the peers' in turn; the median "
                         "counts (--quick: 1)")
    ap.add_argument("--quick", action="store_true", help="fewer steps on both sides (a smoke "
                    "test of the command, not a measurement)")
    ap.add_argument("--torch-bf16", choices=("auto", "yes", "no"), default="auto",
                    help="time PyTorch's bf16 autocast (auto: only where the CPU has "
                         "avx512_bf16; without it PyTorch 1.13 runs it 12-27x slower than fp32)")
    args = ap.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    pythons = [t.strip() for a in (args.torch or ["/usr/bin/python3"]) for t in a.split(",")
               if t.strip()]
    for n in names:
        if n not in CONFIGS:
            sys.exit(f"bench_step: unknown config '{n}' (have {', '.join(CONFIGS)})")
    for p in precisions:
        if p not in PRECISIONS:
            sys.exit(f"bench_step: unknown precision '{p}' (have {', '.join(PRECISIONS)})")
    if args.repeat < 1:
        sys.exit(f"bench_step: --repeat {args.repeat}: give 1 or more rounds")

    model, isa = cpu_facts()
    print(f"CPU: {model}; ISA: {' '.join(isa) or '?'}; threads: {args.threads}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    print("GEMM peak through the SDK's CPU engine (best of 10):")
    round_peaks = [gemm_peaks(args.build)]

    want_bf16 = args.torch_bf16 == "yes" or (args.torch_bf16 == "auto" and "avx512_bf16" in isa)
    bf16_note = ""
    if not want_bf16:
        bf16_note = ("PyTorch bf16 autocast: not timed (--torch-bf16 no)"
                     if args.torch_bf16 == "no" else
                     "PyTorch bf16 autocast: not timed, this CPU has no avx512_bf16 "
                     "(--torch-bf16 yes times it anyway)")
        print("  " + bf16_note)
    peers = []
    for py in pythons:
        version, rates = torch_peer(py, args.threads)
        # "+cu132" and the like name the wheel's GPU build, not the CPU kernels: left out
        label = f"torch {version.split('+')[0]}" if version else f"torch ({py})"
        mm = " ".join(f"{k} {v:.0f}" for k, v in rates.items()) or "-"
        print(f"{label} ({py}): 2048^3 matmul GFLOP/s, {args.threads} threads: {mm}")
        peers.append({"python": py, "version": version, "label": label, "matmul_gflops": rates,
                      "rounds": {"fp32": {n: [] for n in names}, "bf16": {n: [] for n in names}}})

    # Rounds (the median of the rounds counts), the cases of each ordered as below.
    rounds = 1 if args.quick else args.repeat
    vruns = {p: {n: [] for n in names} for p in precisions}
    # Each configuration in turn, and each of its cases followed at once by the peers' same
    # case (vithost fp32, torch fp32, vithost AMP, torch bf16, ...): a ratio's two sides run
    # within the same minute, as a shared machine's load comes and goes over minutes. A
    # peer's kind that no vithost precision asked for still runs, after the config's cases.
    autocast_of = {"fp32": "none", **({"bf16": "bf16"} if want_bf16 else {})}
    for r in range(rounds):
        if rounds > 1:
            print(f"round {r + 1} of {rounds}", flush=True)
        if r > 0:
            more = gemm_peaks(args.build, quiet=True)
            round_peaks.append(more)
            print("  GEMM peak again: " + ", ".join(f"{k} {v:.1f}" for k, v in more.items())
                  + " GFLOP/s", flush=True)
        for n in names:
            order = [(p, PEER_KIND.get(p) if PEER_KIND.get(p) in autocast_of else None)
                     for p in precisions]
            order += [(None, k) for k in autocast_of if k not in {key for _, key in order}]
            for p, key in order:
                if p:
                    rt = roundtrip_ns(args.build)
                    run = run_vithost(args.build, n, CONFIGS[n], p, env, args.quick)
                    if run:
                        run["round"] = r
                        run["roundtrip_ns"] = rt
                        vruns[p][n].append(run)
                        # the threads' round trip just before, and the process's own gelu'
                        # race (gelu_grad16.c)
                        gelu = run.get("engine", {}).get("gelu_grad")
                        print(f"  vithost {n} {PRECISIONS[p]}: {run['img_per_s']:.1f} img/s; "
                              f"threads' round trip {rt if rt is None else f'{rt:.0f} ns'}"
                              + (f"; {gelu}" if gelu else ""), flush=True)
                for t in peers if key else []:
                    # the peer of record's GEMM time in its step, in the last round only
                    profile = t is peers[0] and r == rounds - 1
                    rates, gemms = run_torch(t["python"], [n], args.threads, autocast_of[key],
                                             args.quick, profile)
                    for m, v in rates.items():
                        t["rounds"][key][m].append((r, v))
                    t.setdefault("gemms", {}).setdefault(key, {}).update(gemms)
    ours, runs, spreads = {p: {} for p in precisions}, {p: {} for p in precisions}, {}
    for p in precisions:
        for n in names:
            ordered = sorted(vruns[p][n], key=lambda x: x["img_per_s"])
            runs[p][n] = ordered[(len(ordered) - 1) // 2] if ordered else None
            ours[p][n] = median_of([x["img_per_s"] for x in ordered])
            spreads[f"vithost {PRECISIONS[p]} {n}"] = spread_of([x["img_per_s"] for x in ordered])
    for t in peers:
        for key in ("fp32", "bf16"):
            t[key] = {n: median_of([v for _, v in rv]) for n, rv in t["rounds"][key].items()
                      if rv}
            for n, rv in t["rounds"][key].items():
                spreads[f"{t['label']} {key} {n}"] = spread_of([v for _, v in rv])

    def by_round(p, n):
        return {x["round"]: x["img_per_s"] for x in vruns.get(p, {}).get(n, [])}

    def paired_ratio(a, b):
        """The median over rounds of a / b, both of the same round (dicts round -> img/s)."""
        return median_of([a[r] / b[r] for r in a if r in b and b[r]])

    def fmt(x, spec=".1f"):
        return format(x, spec) if x is not None else "-"

    def ratio(a, b, pair, goal=None):
        """The paired ratio (the median of the rounds' own) with its goal, and beside it the
        ratio of the two medians."""
        if not a or not b or not pair:
            return "-"
        return (f"{pair:.2f}x" + (goal_mark(pair, goal) if goal else "") +
                f" [medians {a / b:.2f}x]")

    peaks = best_peaks(round_peaks)
    vs_fp32_goal, kind = amp_goal(peaks)

    print()
    print("engine GEMM peak, the best of every round's: " +
          ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()) + " GFLOP/s")
    print(f"full training step (data, forward, backward, AdamW), img/s, {args.threads} threads"
          f"{' (--quick: few steps, not a measurement)' if args.quick else ''}")
    print(f"this machine: {kind}")
    head, rule = "| cfg | vithost fp32 |", "|---|---|"
    for t in peers:
        head += f" {t['label']} fp32 | vithost/{t['label']} fp32 |"
        rule += "---|---|"
    for p in precisions:
        if p == "fp32":
            continue
        head += f" vithost {PRECISIONS[p]} | vs vithost fp32 |"
        rule += "---|---|"
        if p == "amp":
            for t in peers:
                head += f" {t['label']} bf16 autocast | vithost AMP-bf16/{t['label']} bf16 |"
                rule += "---|---|"
    head += " vithost fp32 GFLOP/s (% of best f32 GEMM peak) | % of its round's peak, median |"
    rule += "---|---|"
    print(head)
    print(rule)
    pairs = {}
    for n in names:
        v32, goal = ours.get("fp32", {}).get(n), CONFIGS[n][11]
        line = f"| {n} | {fmt(v32)} |"
        for t in peers:
            t32 = t["fp32"].get(n)
            pr = paired_ratio(by_round("fp32", n), dict(t["rounds"]["fp32"][n]))
            line += f" {fmt(t32)} | {ratio(v32, t32, pr, goal)} |"
            pairs[f"vithost fp32 / {t['label']} fp32 {n}"] = pr
        for p in precisions:
            if p == "fp32":
                continue
            v = ours[p].get(n)
            pr = paired_ratio(by_round(p, n), by_round("fp32", n))
            line += f" {fmt(v)} | {ratio(v, v32, pr, vs_fp32_goal if p == 'amp' else None)} |"
            pairs[f"vithost {PRECISIONS[p]} / vithost fp32 {n}"] = pr
            if p == "amp":
                for t in peers:
                    tbf = t["bf16"].get(n)
                    pr = paired_ratio(by_round(p, n), dict(t["rounds"]["bf16"][n]))
                    line += f" {fmt(tbf)} | {ratio(v, tbf, pr, GOAL_AMP_VS_TORCH)} |"
                    pairs[f"vithost AMP-bf16 / {t['label']} bf16 {n}"] = pr
        gf = v32 * flops_per_image(CONFIGS[n]) / 1e9 if v32 else None
        pk, share_goal = peaks.get("f32"), GOAL_PEAK_SHARE.get(n)
        share = f"{gf:.0f} ({100 * gf / pk:.0f}%)" if gf and pk else ""
        paired = round_shares(vruns.get("fp32", {}).get(n, []), round_peaks, CONFIGS[n])
        pair = ""
        if paired:
            pair = f"{100 * paired:.0f}%"
            if share_goal:
                pair += f" (goal {100 * share_goal:.0f}%{'' if paired >= share_goal else ' MISSED'})"
        line += f" {share or '-'} | {pair or '-'} |"
        print(line)
    if bf16_note:
        print(f"({bf16_note})")
    wide = {k: v for k, v in spreads.items() if v is not None and v > 0.10}
    print("a ratio: the median over rounds of the ratio of that round's two runs (its goal), and "
          "in brackets the ratio of the two columns' medians")
    if rounds > 1:
        print(f"medians of {rounds} rounds; spread (max - min) / median over 10%: " +
              (", ".join(f"{k} {100 * v:.0f}%" for k, v in wide.items()) or "none"))
    print_profile(names, precisions, runs, peaks, peers, round_peaks)
    print("JSON " + json.dumps({"cpu": model, "isa": isa, "threads": args.threads,
                                "gemm_peak_gflops": peaks, "gemm_peak_gflops_rounds": round_peaks,
                                "machine_kind": kind,
                                "vithost_img_s": ours,
                                "vithost_step_ms": {p: {n: dict(zip(
                                    ("step", "gemm", "gemm_gflops", "attention"),
                                    split_step(r))) for n, r in runs[p].items() if r}
                                    for p in precisions},
                                "torch": [{k: t.get(k) for k in ("python", "version",
                                                                 "matmul_gflops", "fp32", "bf16",
                                                                 "gemms")}
                                          for t in peers],
                                "rounds": rounds, "paired_ratios": pairs,
                                # each case's img/s round by round ([round, img/s]), both sides
                                "rounds_img_s": {
                                    "vithost": {p: {n: [[x["round"], x["img_per_s"]]
                                                        for x in vruns[p][n]] for n in names}
                                                for p in precisions},
                                    # the threads' round trip before each vithost run, ns
                                    "vithost_roundtrip_ns": {
                                        p: {n: [[x["round"], x.get("roundtrip_ns")]
                                                for x in vruns[p][n]] for n in names}
                                        for p in precisions},
                                    **{t["label"]: t["rounds"] for t in peers}},
                                "spread": {k: v for k, v in spreads.items() if v is not None},
                                "quick": args.quick}))


if __name__ == "__main__":
    main()
