"""bench_vit_torch.py - the PyTorch side of bench_vit: one training step of the same ViT, timed.

bench_vit (bench_vit.c) runs this script through /usr/bin/python3 (Debian's torch 1.13, CPU) with
OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set to the thread count, once per OpenMP wait policy, and
reads its RESULT lines. It can also be run by hand:

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/bench_vit_torch.py --threads 2 \\
        --job name=a,layout=batch_first,batch=128,channels=1,height=28,width=28,patch=4,dim=64,\\
depth=4,heads=4,mlp=256,classes=10,classifier=token,steps=20,warmup=2

The model is tests/reference/vit_reference.py (timm's VisionTransformer, the ground truth of the
vit plugin's tests), so both sides run the same function with the same parameter count.
A step is what bench_vit times on the vithost side: zero_grad, forward, cross-entropy, backward
(no optimizer). Each job prints

    RESULT <name> <layout> <median ms> <min ms> <parameters>

Exit status 3 with a "SKIP ..." line when torch cannot be imported.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))

try:
    import torch
    import torch.nn.functional as F
except Exception as exc:  # ImportError, or a broken install
    print(f"SKIP torch is not importable by {sys.executable}: {exc}", flush=True)
    sys.exit(3)

import vit_reference as ref  # noqa: E402  (needs the path above)

INT_KEYS = ("batch", "channels", "height", "width", "patch", "dim", "depth", "heads", "mlp",
            "classes", "steps", "warmup")


def parse_job(text):
    job = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--job: '{item}' is not key=value")
        job[key] = int(value) if key in INT_KEYS else value
    missing = [k for k in INT_KEYS + ("name", "layout", "classifier") if k not in job]
    if missing:
        raise SystemExit(f"--job {text}: missing {', '.join(missing)}")
    return job


def run_job(job, seed):
    cfg = dict(image_height=job["height"], image_width=job["width"], channels=job["channels"],
               patch_size=job["patch"], dim=job["dim"], depth=job["depth"], heads=job["heads"],
               mlp_dim=job["mlp"], num_classes=job["classes"], classifier=job["classifier"],
               layout=job["layout"], eps=1e-6)
    model = ref.init_params(ref.build(cfg), seed=seed)
    model.train()
    gen = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(job["batch"], job["channels"], job["height"], job["width"],
                         generator=gen)
    labels = torch.randint(0, job["classes"], (job["batch"],), generator=gen)

    def step():
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()

    for _ in range(job["warmup"]):
        step()
    times = []
    for _ in range(job["steps"]):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    params = sum(p.numel() for p in model.parameters())
    return statistics.median(times), min(times), params


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads(T)")
    ap.add_argument("--job", action="append", required=True,
                    help="key=value,... (name layout classifier batch channels height width "
                         "patch dim depth heads mlp classes steps warmup)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    jobs = [parse_job(j) for j in args.job]

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    print(f"INFO torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={policy}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}",
          flush=True)
    for job in jobs:
        median, best, params = run_job(job, args.seed)
        print(f"RESULT {job['name']} {job['layout']} {median:.3f} {best:.3f} {params}",
              flush=True)


if __name__ == "__main__":
    main()
