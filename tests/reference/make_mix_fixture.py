"""make_mix_fixture.py - timm's Mixup/CutMix on the draws vithost makes, for tests/test_mix.c.

    ~/torch-venv/bin/python tests/reference/make_mix_fixture.py --lib build/lib/libvhsdk.so
    ~/torch-venv/bin/python tests/reference/make_mix_fixture.py --lib ... --check  # exit 1 if stale

Needs torch and timm (pip install timm in that venv) and a built libvhsdk (for vh_mix_key and
vh_mix_draw, through ctypes). For each case it asks vithost for the batch's draw (the uniform
that decides whether to mix, the one that picks CutMix, the Beta draw, the box centre), then
runs timm's own Mixup(mode='batch') (timm/data/mixup.py: Mixup.__call__, _params_per_batch,
_mix_batch, cutmix_bbox_and_lam, rand_bbox, mixup_target) with numpy's np.random.rand, .beta
and .randint replaced by those numbers in the order timm asks for them. So timm decides the
mode, computes the box from (lam, centre), corrects lam and mixes images and targets; the C test
checks that vithost draws the same numbers and mixes to the same images and targets.

Writes tests/fixtures/mix_reference.txt, one item a line, floats as float.hex:

    shape B C H W classes
    images <B*C*H*W>            the input batch (torch.randn, seed 0)
    labels <B>
    case mixup_alpha cutmix_alpha prob switch_prob smoothing seed epoch batch rank
    draw mode lam u_apply u_switch lam_draw cy cx y0 y1 x0 x1     vithost's draw
    timm_lam <lam>                                                 what timm's _mix_batch returned
    timm_images <B*C*H*W>
    timm_targets <B*classes>
"""
import argparse
import ctypes
import os
import sys

import numpy as np
import torch
import timm.data.mixup as tm

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "mix_reference.txt")

B, C, H, W, CLASSES = 6, 2, 7, 5, 7
LABELS = [3, 0, 6, 3, 1, 5]

# (mixup_alpha, cutmix_alpha, prob, switch_prob, smoothing, seed, epoch, batch, rank)
CASES = [(0.8, 0.0, 1.0, 0.5, 0.1, 1, 0, 0, 0),
         (0.8, 0.0, 1.0, 0.5, 0.0, 7, 3, 11, 1),
         (0.2, 0.0, 1.0, 0.5, 0.1, 5, 1, 2, 0),
         (0.0, 1.0, 1.0, 0.5, 0.1, 1, 2, 5, 1),
         (0.0, 1.0, 1.0, 0.5, 0.1, 9, 0, 3, 0),
         (0.0, 0.3, 1.0, 0.5, 0.0, 4, 0, 0, 0)]
CASES += [(0.8, 1.0, 1.0, 0.5, 0.1, 42, 0, b, 0) for b in range(6)]   # both: the switch
CASES += [(0.8, 1.0, 0.5, 0.5, 0.1, 42, 1, b, 2) for b in range(6)]   # mix_prob 0.5


class MixConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("mixup_alpha", ctypes.c_double),
                ("cutmix_alpha", ctypes.c_double), ("prob", ctypes.c_double),
                ("switch_prob", ctypes.c_double), ("label_smoothing", ctypes.c_double),
                ("num_classes", ctypes.c_int32)]


class MixParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("mode", ctypes.c_int32),
                ("lam", ctypes.c_double), ("u_apply", ctypes.c_double),
                ("u_switch", ctypes.c_double), ("lam_draw", ctypes.c_double)] + \
               [(n, ctypes.c_int32) for n in ("cy", "cx", "y0", "y1", "x0", "x1")]


def vithost_draw(lib, case):
    ma, ca, prob, sw, sm, seed, epoch, batch, rank = case
    cfg = MixConfig(ctypes.sizeof(MixConfig), ma, ca, prob, sw, sm, CLASSES)
    key = lib.vh_mix_key(seed, epoch, batch, rank)
    p = MixParams()
    p.struct_size = ctypes.sizeof(MixParams)
    assert lib.vh_mix_draw(ctypes.byref(cfg), ctypes.c_uint64(key), H, W, ctypes.byref(p)) == 0
    return p


class Fed:
    """np.random.rand / beta / randint answering vithost's numbers, checking what timm asks."""

    def __init__(self, case, p):
        ma, ca = case[0], case[1]
        self.rand = [p.u_apply] + ([p.u_switch] if ma > 0 and ca > 0 else [])
        self.beta = [(p.lam_draw, ca if p.mode == 2 or ma == 0 else ma)]
        self.randint = [(p.cy, H), (p.cx, W)]

    def np_rand(self, *size):
        assert not size
        return self.rand.pop(0)

    def np_beta(self, a, b, size=None):
        lam, alpha = self.beta.pop(0)
        assert a == b == alpha and size is None, (a, b, alpha)
        return lam

    def np_randint(self, low, high, size=None):
        v, hi = self.randint.pop(0)
        assert low == 0 and high == hi and size is None, (low, high, hi)
        return np.int64(v)


def timm_mix(case, p, images, labels):
    ma, ca, prob, sw, sm = case[:5]
    mix = tm.Mixup(mixup_alpha=ma, cutmix_alpha=ca, prob=prob, switch_prob=sw, mode="batch",
                   correct_lam=True, label_smoothing=sm, num_classes=CLASSES)
    fed, lams = Fed(case, p), []
    inner = mix._mix_batch
    mix._mix_batch = lambda x: lams.append(inner(x)) or lams[-1]
    saved = (np.random.rand, np.random.beta, np.random.randint)
    np.random.rand, np.random.beta, np.random.randint = fed.np_rand, fed.np_beta, fed.np_randint
    try:
        x, t = mix(images.clone(), labels.clone())
    finally:
        np.random.rand, np.random.beta, np.random.randint = saved
    return float(lams[0]), x, t


def hexes(t):
    return " ".join(float(v).hex() for v in t.reshape(-1).tolist())


def make_text(lib):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(B, C, H, W, generator=g, dtype=torch.float32)
    labels = torch.tensor(LABELS, dtype=torch.int64)
    lines = [f"shape {B} {C} {H} {W} {CLASSES}", "images " + hexes(images),
             "labels " + " ".join(map(str, LABELS))]
    modes = set()
    for case in CASES:
        p = vithost_draw(lib, case)
        lam, x, t = timm_mix(case, p, images, labels)
        modes.add(p.mode)
        lines.append("case " + " ".join(repr(v) for v in case))
        lines.append(f"draw {p.mode} {p.lam.hex()} {p.u_apply.hex()} {p.u_switch.hex()} "
                     f"{p.lam_draw.hex()} {p.cy} {p.cx} {p.y0} {p.y1} {p.x0} {p.x1}")
        lines.append("timm_lam " + float(lam).hex())
        lines.append("timm_images " + hexes(x))
        lines.append("timm_targets " + hexes(t))
    assert modes == {0, 1, 2}, f"the cases should cover no mix, mixup and cutmix: {modes}"
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="a built libvhsdk.so")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib)
    lib.vh_mix_key.restype = ctypes.c_uint64
    lib.vh_mix_key.argtypes = [ctypes.c_uint64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]
    lib.vh_mix_draw.restype = ctypes.c_int
    text = make_text(lib)
    if args.check:
        with open(OUT) as f:
            stale = f.read() != text
        print(f"{OUT}: {'stale' if stale else 'up to date'}")
        sys.exit(1 if stale else 0)
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
