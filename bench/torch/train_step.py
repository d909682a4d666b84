"""train_step.py - the PyTorch side of bench_step.py: full training steps of the same ViT.

A step is zero_grad + forward + cross-entropy + backward + AdamW step, the same work as one
`vithost run` step (mta adamw). The model is tests/reference/vit_reference.py (timm's
VisionTransformer, the ground truth of the vit plugin's tests). Run by bench_step.py through
/usr/bin/python3 (Debian's torch 1.13) or any interpreter with torch; by hand:

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/torch/train_step.py --threads 2 --autocast none \\
        --job name=T1,batch=128,channels=1,side=28,patch=4,dim=64,depth=4,heads=4,mlp=256,\\
classes=10,steps=20,warmup=3

Each job prints `RESULT <name> <median ms> <min ms> <parameters>`; exit 3 with a SKIP line when
torch cannot be imported. With --gemm-profile, each job then runs two more steps under
torch.profiler and prints `GEMMS <name> <linear ms> <attention ms> <profiled step ms>`, per step:
the self time of its matmul ops (mm/addmm/linear: the linear layers; bmm/baddbmm: attention's
products). The profiler slows the step itself (its own line says by how much), not much the
GEMMs inside it: bench_step.py sets them beside vithost's.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))

try:
    import torch
    import torch.nn.functional as F
except Exception as exc:  # ImportError, or a broken install
    print(f"SKIP torch is not importable by {sys.executable}: {exc}", flush=True)
    sys.exit(3)

import vit_reference as ref  # noqa: E402

INT_KEYS = ("batch", "channels", "side", "patch", "dim", "depth", "heads", "mlp", "classes",
            "steps", "warmup")


def parse_job(text):
    job = dict(item.partition("=")[::2] for item in text.split(","))
    for k in INT_KEYS:
        job[k] = int(job[k])
    return job


def run_job(job, autocast, seed):
    cfg = dict(image_height=job["side"], image_width=job["side"], channels=job["channels"],
               patch_size=job["patch"], dim=job["dim"], depth=job["depth"], heads=job["heads"],
               mlp_dim=job["mlp"], num_classes=job["classes"], classifier="token",
               layout="batch_first", eps=1e-6)
    model = ref.init_params(ref.build(cfg), seed=seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    gen = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(job["batch"], job["channels"], job["side"], job["side"], generator=gen)
    labels = torch.randint(0, job["classes"], (job["batch"],), generator=gen)

    def step():
        opt.zero_grad(set_to_none=True)
        if autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
        else:
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()

    for _ in range(job["warmup"]):
        step()
    times = []
    for _ in range(job["steps"]):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), sum(p.numel() for p in model.parameters()), step


# The matmul ops of a step, by what they compute (self time: a matmul op's own kernels, not
# the ops it calls). mkldnn_* are what some builds dispatch linear layers to.
LINEAR_OPS = ("aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::mkldnn_linear",
              "mkldnn::matmul")
ATTENTION_OPS = ("aten::bmm", "aten::baddbmm")


def gemm_profile(step, steps=2):
    """(linear ms, attention ms, step ms) per step of `steps` steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    self_ms = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    return (sum(self_ms.get(k, 0.0) for k in LINEAR_OPS),
            sum(self_ms.get(k, 0.0) for k in ATTENTION_OPS), wall)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none")
    ap.add_argument("--job", action="append", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gemm-profile", action="store_true",
                    help="then two steps under torch.profiler: a GEMMS line per job")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    print(f"INFO torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'default')}", flush=True)
    for text in args.job:
        job = parse_job(text)
        median, best, params, step = run_job(job, args.autocast, args.seed)
        print(f"RESULT {job['name']} {median:.3f} {best:.3f} {params}", flush=True)
        if args.gemm_profile:
            linear, attention, wall = gemm_profile(step)
            print(f"GEMMS {job['name']} {linear:.3f} {attention:.3f} {wall:.3f}", flush=True)


if __name__ == "__main__":
    main()
