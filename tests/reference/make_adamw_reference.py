#!/usr/bin/python3
"""PyTorch reference numbers for the mta optimizer plugin (tests/test_mta.c).

Runs torch.optim.AdamW and torch.optim.SGD (foreach=False: the single-tensor
code whose order of operations plugins/optim/mta/algos.c follows) for a few
steps on two small tensors -- one with weight decay, one without -- and
writes tests/fixtures/mta_reference.h: the initial values, the gradient of
every step, the learning rate of every step, the parameters after every step
and the optimizer state after the last one, as exact C hex-float literals.

Cases (the optim section of each is written into the header too):
  adamw          AdamW, weight decay on w only, warm-up + cosine schedule
  sgd_nesterov   SGD, momentum, Nesterov, weight decay on w only, constant lr
  sgd_clip       SGD, momentum, clip_grad_norm_ on both tensors every step
                 (the norm is above max_norm on some steps, below on others)

The schedule (warm-up then cosine, step t uses lr(t)) is computed in Python
floats with the formula of plugins/optim/mta/schedule.h and set as the
group's lr before each step, as timm's scheduler does.

    /usr/bin/python3 tests/reference/make_adamw_reference.py          # rewrite the header
    /usr/bin/python3 tests/reference/make_adamw_reference.py --check  # exit 1 if it is stale

Needs torch (Debian's 1.13 at /usr/bin/python3). Bump VERSION when the
meaning of an array changes.
"""
import math
import os
import sys

import torch

VERSION = 1
STEPS = 5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                   "mta_reference.h")

# One lr schedule for the adamw case (mirrors the optim section below).
LR, WARMUP, WARMUP_INIT, MIN_LR = 1e-2, 2, 1e-3, 1e-4


def cosine_lr(t, lr=LR, warmup=WARMUP, init=WARMUP_INIT, min_lr=MIN_LR, total=STEPS):
    if t < warmup:
        return init + t * ((lr - init) / warmup)
    s, span = t - warmup, total - warmup
    if span <= 0 or s >= span:
        return min_lr
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * s / span))


def inputs():
    g = torch.Generator().manual_seed(20240607)
    w0 = torch.randn(3, 2, generator=g)
    b0 = torch.randn(4, generator=g)
    # per-step factors so that the gradient norm crosses the clipping threshold
    factors = [1.0, 0.2, 1.5, 0.3, 1.0]
    gw = [torch.randn(3, 2, generator=g) * f for f in factors]
    gb = [torch.randn(4, generator=g) * f for f in factors]
    return w0, b0, gw, gb


def run(case, w0, b0, gw, gb):
    w = w0.clone().requires_grad_(True)
    b = b0.clone().requires_grad_(True)
    if case["algo"] == "adamw":
        opt = torch.optim.AdamW(
            [{"params": [w], "weight_decay": case["weight_decay"]},
             {"params": [b], "weight_decay": 0.0}],
            lr=case["lr"], betas=(0.9, 0.999), eps=1e-8, foreach=False)
    else:
        opt = torch.optim.SGD(
            [{"params": [w], "weight_decay": case["weight_decay"]},
             {"params": [b], "weight_decay": 0.0}],
            lr=case["lr"], momentum=0.9, nesterov=case["nesterov"], foreach=False)
    lrs, ws, bs, norms = [], [], [], []
    for t in range(STEPS):
        lr = case["lr_at"](t)
        for group in opt.param_groups:
            group["lr"] = lr
        w.grad = gw[t].clone()
        b.grad = gb[t].clone()
        if case.get("clip"):
            norms.append(float(torch.nn.utils.clip_grad_norm_([w, b], case["clip"])))
        opt.step()
        lrs.append(lr)
        ws.append(w.detach().clone())
        bs.append(b.detach().clone())
    if case["algo"] == "adamw":
        state = [(opt.state[w]["exp_avg"], opt.state[w]["exp_avg_sq"]),
                 (opt.state[b]["exp_avg"], opt.state[b]["exp_avg_sq"])]
    else:
        state = [(opt.state[w]["momentum_buffer"],), (opt.state[b]["momentum_buffer"],)]
    return lrs, ws, bs, state, norms


CASES = [
    {"name": "adamw", "algo": "adamw", "lr": LR, "weight_decay": 0.1, "nesterov": False,
     "lr_at": cosine_lr,
     "optim": "{plugin: mta, algo: adamw, lr: %r, weight_decay: 0.1, beta1: 0.9, "
              "beta2: 0.999, eps: 1.0e-8, schedule: cosine, warmup_steps: %d, "
              "warmup_init_lr: %r, min_lr: %r}" % (LR, WARMUP, WARMUP_INIT, MIN_LR)},
    {"name": "sgd_nesterov", "algo": "sgd", "lr": 0.1, "weight_decay": 0.01,
     "nesterov": True, "lr_at": lambda t: 0.1,
     "optim": "{plugin: mta, algo: sgd, lr: 0.1, weight_decay: 0.01, momentum: 0.9, "
              "nesterov: true, schedule: constant}"},
    {"name": "sgd_clip", "algo": "sgd", "lr": 0.05, "weight_decay": 0.0, "nesterov": False,
     "clip": 2.0, "lr_at": lambda t: 0.05,
     "optim": "{plugin: mta, algo: sgd, lr: 0.05, weight_decay: 0, momentum: 0.9, "
              "clip_grad_norm: 2.0, schedule: constant}"},
]


def c_floats(t):
    vals = [float(x).hex() + "f" for x in t.reshape(-1).tolist()]
    lines, line = [], "   "
    for v in vals:
        if len(line) + len(v) + 2 > 96:
            lines.append(line)
            line = "   "
        line += " " + v + ","
    lines.append(line)
    return "{\n" + "\n".join(lines) + "\n}"


def c_array(name, rows):
    """rows: list of tensors, or one tensor."""
    if isinstance(rows, torch.Tensor):
        return "static const float %s[%d] = %s;\n" % (name, rows.numel(), c_floats(rows))
    n = rows[0].numel()
    body = ",\n".join(c_floats(r) for r in rows)
    return "static const float %s[%d][%d] = {\n%s\n};\n" % (name, len(rows), n, body)


def header():
    torch.set_num_threads(1)
    w0, b0, gw, gb = inputs()
    out = ["/* mta_reference.h - generated by tests/reference/make_adamw_reference.py",
           " * with torch %s; do not edit. Regenerate:" % torch.__version__,
           " *     /usr/bin/python3 tests/reference/make_adamw_reference.py",
           " * Tensors: w (3 x 2, weight decay), b (4, no decay); %d steps;" % STEPS,
           " * state after the last step: slot 0 exp_avg / momentum_buffer, slot 1 exp_avg_sq. */",
           "#ifndef VH_TEST_MTA_REFERENCE_H", "#define VH_TEST_MTA_REFERENCE_H", "",
           "#define MTA_REF_VERSION %d" % VERSION, "#define MTA_REF_STEPS %d" % STEPS,
           "#define MTA_REF_NW %d" % w0.numel(), "#define MTA_REF_NB %d" % b0.numel(), ""]
    out.append(c_array("mta_ref_w0", w0))
    out.append(c_array("mta_ref_b0", b0))
    out.append(c_array("mta_ref_gw", gw))
    out.append(c_array("mta_ref_gb", gb))
    for case in CASES:
        lrs, ws, bs, state, norms = run(case, w0, b0, gw, gb)
        n = case["name"]
        out.append("")
        out.append("#define MTA_REF_%s_OPTIM \"%s\"" % (n.upper(), case["optim"]))
        out.append("static const double mta_ref_%s_lr[%d] = {%s};" %
                   (n, STEPS, ", ".join(float(x).hex() for x in lrs)))
        if norms:
            out.append("/* global gradient norms before clipping at %g: %s */" %
                       (case["clip"], ", ".join("%.6g" % x for x in norms)))
            out.append("static const double mta_ref_%s_norm[%d] = {%s};" %
                       (n, STEPS, ", ".join(float(x).hex() for x in norms)))
        out.append(c_array("mta_ref_%s_w" % n, ws))
        out.append(c_array("mta_ref_%s_b" % n, bs))
        for k in range(len(state[0])):
            out.append(c_array("mta_ref_%s_w_state%d" % (n, k), state[0][k]))
            out.append(c_array("mta_ref_%s_b_state%d" % (n, k), state[1][k]))
    out.append("#endif")
    return "\n".join(out) + "\n"


def main():
    text = header()
    if "--check" in sys.argv[1:]:
        try:
            with open(OUT) as f:
                same = f.read() == text
        except OSError:
            same = False
        print("%s is %s" % (OUT, "up to date" if same else "STALE"))
        return 0 if same else 1
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote", os.path.normpath(OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
