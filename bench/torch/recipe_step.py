#!/usr/bin/env python3
"""recipe_step.py - PyTorch's training step for a vithost recipe: the same model, batch, precision
and optimizer, timed the way `vithost bench` times its steps, printing the same JSON keys.

    /usr/bin/python3 bench/torch/recipe_step.py RECIPE [--set SECTION.KEY=VALUE]... [--steps 20]
        [--warmup 3] [--threads N] [--device cpu|cuda] [--impl reference|timm] [--compile]
        [--vithost build/vithost] [--json]

The recipe is resolved by `vithost check` (the defaults of every plugin filled in), so the two sides
read the same values:
  model      vit: dim, depth, heads, mlp_dim, patch_size (or variant), classifier (token|pooled),
             layout (batch_first|batch_second; only --impl reference has batch_second)
  data       the image shape and class count: synthetic (channels, image_size/height/width,
             num_classes), idx (1x28x28, 10), cifar (3x32x32, 10), imagefolder (3 x image_size^2,
             1000 unless model.num_classes says); the images are random tensors of that shape: a
             step's cost does not depend on the pixels
  run        batch_size
  precision  fp32 -> fp32; amp -> torch.autocast(dtype bf16|fp16) (+ GradScaler for fp16);
             fp16 -> the model and optimizer state in half (PyTorch's closest to full FP16)
  optim      mta adamw -> torch.optim.AdamW(lr, betas, eps, weight_decay); sgd -> SGD(momentum);
             lamb -> AdamW (PyTorch has no LAMB; the cost is close)

--impl timm uses timm's VisionTransformer (a GPU machine has timm); the default is
tests/reference/vit_reference.py, timm's model re-written without timm (the vit plugin's ground
truth). --compile wraps the model in torch.compile (torch 2). One process, one device: the
recipe's sharding section is ignored (DDP and FSDP are vithost's rows of the comparison).
Prints one line (or, with --json, one JSON object): img_per_s, step_ms_median/min/max, tflops
(the same pycls FLOP count as vithost), peak_mem_bytes (host, or the GPU's max allocated), ...
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))

VARIANTS = {  # plugins/models/vit/vit.c
    "ti16": (192, 12, 3, 768, 16), "s16": (384, 12, 6, 1536, 16), "b16": (768, 12, 12, 3072, 16),
    "l16": (1024, 24, 16, 4096, 16), "h14": (1280, 32, 16, 5120, 14),
    "h16": (1280, 32, 16, 5120, 16),
}


def resolve(vithost, recipe, sets):
    """The resolved recipe as `vithost check` prints it (YAML with comments)."""
    import yaml
    # (on the CPU: `check` opens run.device, and the values do not depend on it)
    cmd = [vithost, "check", recipe, "--set", "run.device=cpu"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"recipe_step: `{' '.join(cmd)}` failed (exit {r.returncode}):\n{r.stderr}")
    return yaml.safe_load(r.stdout)


def shape_of(rec):
    data, model = rec["data"], rec["model"]
    kind = data["plugin"]
    if kind == "synthetic":
        side = data.get("image_size", 32)
        ch, h, w, classes = (data.get("channels", 3), data.get("height") or side,
                             data.get("width") or side, data.get("num_classes", 10))
    elif kind == "idx":
        ch, h, w, classes = 1, 28, 28, 10
    elif kind == "cifar":
        ch, h, w, classes = 3, 32, 32, 10
    elif kind == "imagefolder":
        side = data.get("image_size", 224)
        ch, h, w, classes = 3, side, side, 1000
    else:
        sys.exit(f"recipe_step: data plugin '{kind}' has no known image shape; use synthetic data "
                 "of the same shape (--set data.plugin=synthetic ...)")
    classes = model.get("num_classes") or classes
    return ch, h, w, classes


def model_config(rec):
    m = rec["model"]
    if m.get("variant"):
        dim, depth, heads, mlp, patch = VARIANTS[m["variant"]]
    else:
        dim, depth, heads, patch = m["dim"], m["depth"], m.get("heads"), m["patch_size"]
        mlp = m.get("mlp_dim") or 4 * dim
    dim = m.get("dim") or dim
    heads = m.get("heads") or heads
    return dict(dim=dim, depth=m.get("depth") or depth, heads=heads, mlp=m.get("mlp_dim") or mlp,
                patch=m.get("patch_size") or patch, classifier=m.get("classifier", "token"),
                layout=m.get("layout", "batch_first"))


def flops_per_image(cfg, ch, h, w, classes):
    """pycls: 6 x the multiply-adds of every matmul, attention's two included (as the plugin)."""
    d, L, mlp, p = cfg["dim"], cfg["depth"], cfg["mlp"], cfg["patch"]
    npatch = (h // p) * (w // p)
    n = npatch + (1 if cfg["classifier"] == "token" else 0)
    macs = npatch * ch * p * p * d
    macs += L * (n * d * 3 * d + 2 * n * n * d + n * d * d + 2 * n * d * mlp)
    macs += d * classes
    return 6.0 * macs


def build_model(torch, cfg, ch, h, w, classes, impl):
    if impl == "timm":
        from timm.models.vision_transformer import VisionTransformer
        if cfg["layout"] != "batch_first":
            print("recipe_step: timm has no batch_second layout; timing batch_first",
                  file=sys.stderr)
        return VisionTransformer(img_size=(h, w), patch_size=cfg["patch"], in_chans=ch,
                                 num_classes=classes, embed_dim=cfg["dim"], depth=cfg["depth"],
                                 num_heads=cfg["heads"], mlp_ratio=cfg["mlp"] / cfg["dim"],
                                 class_token=cfg["classifier"] == "token",
                                 global_pool="token" if cfg["classifier"] == "token" else "avg")
    import vit_reference as ref
    return ref.build(dict(image_height=h, image_width=w, channels=ch, patch_size=cfg["patch"],
                          dim=cfg["dim"], depth=cfg["depth"], heads=cfg["heads"],
                          mlp_dim=cfg["mlp"], num_classes=classes, classifier=cfg["classifier"],
                          layout=cfg["layout"], eps=1e-6))


def optimizer(torch, rec, params):
    o = rec["optim"]
    algo = o.get("algo", "adamw")
    lr, wd = float(o.get("lr", 1e-3)), float(o.get("weight_decay", 0.05))
    if algo == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(o.get("momentum", 0.9)),
                               weight_decay=wd, nesterov=bool(o.get("nesterov", False)))
    return torch.optim.AdamW(params, lr=lr, betas=(float(o.get("beta1", 0.9)),
                                                   float(o.get("beta2", 0.999))),
                             eps=float(o.get("eps", 1e-8)), weight_decay=wd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--impl", choices=("reference", "timm"), default="reference")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2)")
    ap.add_argument("--vithost", default=os.path.join(ROOT, "build", "vithost"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as exc:
        print(f"SKIP torch is not importable by {sys.executable}: {exc}", flush=True)
        sys.exit(3)
    if a.threads:
        torch.set_num_threads(a.threads)
    rec = resolve(a.vithost, a.recipe, a.sets)
    ch, h, w, classes = shape_of(rec)
    cfg = model_config(rec)
    batch = int(rec["run"]["batch_size"])
    dev = torch.device(a.device)
    torch.manual_seed(int(rec["run"].get("seed", 0)))
    model = build_model(torch, cfg, ch, h, w, classes, a.impl).to(dev)
    prec = rec["precision"]["plugin"]
    amp_dtype = None
    if prec == "amp":
        amp_dtype = torch.float16 if rec["precision"].get("dtype") == "fp16" else torch.bfloat16
    elif prec == "fp16":
        model = model.half()
    model.train()
    opt = optimizer(torch, rec, model.parameters())
    scaler = torch.cuda.amp.GradScaler() if (amp_dtype == torch.float16 and
                                             dev.type == "cuda") else None
    run_model = torch.compile(model) if a.compile else model
    images = torch.randn(batch, ch, h, w, device=dev)
    if prec == "fp16":
        images = images.half()
    labels = torch.randint(0, classes, (batch,), device=dev)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        if amp_dtype is not None:
            with torch.autocast(dev.type, dtype=amp_dtype):
                loss = F.cross_entropy(run_model(images), labels)
        else:
            loss = F.cross_entropy(run_model(images).float(), labels)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    sync()
    times = []
    loss = None
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    median = statistics.median(times)
    img_s = batch / (median / 1e3)
    peak = (torch.cuda.max_memory_allocated() if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    res = {"img_per_s": img_s, "step_ms_median": median, "step_ms_min": min(times),
           "step_ms_max": max(times),
           "tflops": img_s * flops_per_image(cfg, ch, h, w, classes) / 1e12,
           "peak_mem_bytes": peak, "global_batch": batch, "steps": a.steps, "warmup": a.warmup,
           "loss": float(loss), "precision": prec + (f" {amp_dtype}" if amp_dtype else ""),
           "impl": a.impl + (" compiled" if a.compile else ""), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "device": str(dev), "recipe": a.recipe}
    if a.json:
        print(json.dumps(res), flush=True)
    else:
        print(f"torch {torch.__version__} ({res['impl']}, {res['precision']}, {dev}): "
              f"{img_s:.1f} img/s, step median {median:.2f} ms (min {min(times):.2f}, "
              f"max {max(times):.2f}), {res['tflops']:.4f} TFLOP/s, "
              f"peak memory {peak / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
