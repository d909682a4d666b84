"""make_fixtures.py - golden fixtures for vithost's vit plugin, from vit_reference.py.

    /usr/bin/python3 tests/reference/make_fixtures.py           # write tests/fixtures/*.vhfx
    /usr/bin/python3 tests/reference/make_fixtures.py --check   # exit 1 if a committed one is stale

Numerics: parameters and the input images are generated as float32 values (those exact values
are stored); the forward and backward passes then run in float64 on those values and the logits,
loss and gradients are rounded to float32 once, when stored. The stored results are therefore
exact to float32 rounding, and any difference a C test sees is the C implementation's own float32
error, not the reference's. (The script also prints how far a float32 PyTorch run lands from the
stored values: a guide for the C test's tolerances.)

Binary format, version 1 (all integers u32 little-endian; tests/fixture.h says the same):

    magic      4 bytes  "VHFX"
    version    u32      1
    n_config   u32
    n_config x { u32 key_len, key bytes, u32 value_len, value bytes }
               keys/values are the YAML text of the vit plugin's schema ("dim" -> "48",
               "classifier" -> "token", "layout" -> "batch_first", "label_smoothing" -> "0.1");
               no terminating NUL in the file
    n_tensors  u32
    n_tensors x { u32 name_len, name bytes, u32 dtype (0 f32, 1 i32), u32 ndim,
                  ndim x u32 dims, prod(dims) x 4 bytes of data, row-major }
    nothing after the last tensor

Tensors, in this order: every parameter under its timm name (state_dict order), "input"
(B, C, H, W) f32 in NCHW whatever the layout, "labels" (B,) i32, "logits" (B, classes) f32,
"loss" (1,) f32 (the mean of nn.CrossEntropyLoss(label_smoothing)), then "grad." + name for every
parameter, same order, same shape: d(loss)/d(param) with loss the batch mean.

"layout" only says which layout the C test runs the plugin in: a *_bs fixture holds the same
weights and inputs as its *_bf twin and (up to float64 rounding) the same results, computed through
the reference's batch_second path.

Bump VERSION whenever the format or the meaning of a tensor changes, and regenerate.
"""

import argparse
import hashlib
import io
import os
import struct
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vit_reference as ref  # noqa: E402

MAGIC = b"VHFX"
VERSION = 1
DTYPE_F32, DTYPE_I32 = 0, 1
HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.normpath(os.path.join(HERE, "..", "fixtures"))

# Config keys in the order they are written. batch is run.batch_size in a recipe; image_height,
# image_width, channels and num_classes come from the data plugin (vh_model_setup); the rest are
# the vit plugin's own keys.
KEYS = ("image_height", "image_width", "channels", "patch_size", "dim", "depth", "heads", "mlp_dim",
        "num_classes", "classifier", "layout", "batch", "label_smoothing", "eps")

TOKEN = dict(image_height=16, image_width=16, channels=3, patch_size=4, dim=48, depth=2, heads=3,
             mlp_dim=96, num_classes=10, classifier="token", batch=4, label_smoothing=0.1,
             eps=1e-6, seed=1000)
POOLED = dict(image_height=12, image_width=12, channels=1, patch_size=3, dim=32, depth=2, heads=4,
              mlp_dim=64, num_classes=7, classifier="pooled", batch=5, label_smoothing=0.0,
              eps=1e-6, seed=2000)
ODD = dict(image_height=10, image_width=14, channels=2, patch_size=2, dim=24, depth=1, heads=2,
           mlp_dim=40, num_classes=3, classifier="token", batch=3, label_smoothing=0.05,
           eps=1e-6, seed=3000)

FIXTURES = {
    "vit_token_bf": dict(TOKEN, layout="batch_first"),    # N = 17, not a multiple of 8
    "vit_token_bs": dict(TOKEN, layout="batch_second"),
    "vit_pooled_bf": dict(POOLED, layout="batch_first"),  # N = 16, no class token
    "vit_pooled_bs": dict(POOLED, layout="batch_second"),
    "vit_odd": dict(ODD, layout="batch_first"),           # 10x14 image, N = 35 + 1
}


def yaml_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # shortest text that reads back to the same double: "0.1", "1e-06"
    return str(v)


def rel_err(got, want):
    """The metric of vh_fixture_compare: max|got - want| / max(max|want|, FLT_MIN)."""
    scale = max(want.abs().max().item(), 1.1754943508222875e-38)
    return (got - want).abs().max().item() / scale


def compute(cfg):
    """Returns (config items, [(name, tensor)], float32-vs-float64 errors)."""
    model = ref.init_params(ref.build(cfg), cfg["seed"])  # float32 values
    params = [(n, p.detach().clone()) for n, p in model.state_dict().items()]
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    images = torch.randn(cfg["batch"], cfg["channels"], cfg["image_height"], cfg["image_width"],
                         generator=g, dtype=torch.float32)
    labels = torch.randint(0, cfg["num_classes"], (cfg["batch"],), generator=g)
    if len(set(labels.tolist())) < 2:
        raise AssertionError("labels should not all be the same class")

    m64 = model.double()
    logits, loss, grads = ref.run(m64, images.double(), labels, cfg["label_smoothing"])

    # How far an honest float32 run lands from the float64 truth (a guide for C tolerances).
    m32 = ref.init_params(ref.build(cfg), cfg["seed"])
    l32, loss32, g32 = ref.run(m32, images, labels, cfg["label_smoothing"])
    f32_err = {"logits": rel_err(l32.double(), logits), "loss": rel_err(loss32.double(), loss)}
    f32_err.update({"grad." + n: rel_err(g32[n].double(), grads[n]) for n in grads})

    for n, gr in grads.items():
        if not gr.abs().max().item() > 1e-7:
            raise AssertionError(f"gradient of {n} is (near) zero: the fixture would test nothing")

    tensors = list(params)
    tensors.append(("input", images))
    tensors.append(("labels", labels.to(torch.int32)))
    tensors.append(("logits", logits.float()))
    tensors.append(("loss", loss.reshape(1).float()))
    tensors += [("grad." + n, grads[n].float()) for n, _ in params]
    config = [(k, yaml_text(cfg[k])) for k in KEYS]
    return config, tensors, f32_err, (logits, loss, grads)


def encode(config, tensors):
    out = io.BytesIO()
    u32 = lambda v: out.write(struct.pack("<I", v))  # noqa: E731
    out.write(MAGIC)
    u32(VERSION)
    u32(len(config))
    for k, v in config:
        for s in (k, v):
            b = s.encode("utf-8")
            u32(len(b))
            out.write(b)
    u32(len(tensors))
    for name, t in tensors:
        b = name.encode("utf-8")
        u32(len(b))
        out.write(b)
        if t.dtype == torch.float32:
            u32(DTYPE_F32)
            fmt = "<f4"
        elif t.dtype == torch.int32:
            u32(DTYPE_I32)
            fmt = "<i4"
        else:
            raise TypeError(f"{name}: unsupported dtype {t.dtype}")
        u32(t.dim())
        for d in t.shape:
            u32(d)
        out.write(t.contiguous().numpy().astype(fmt).tobytes())
    return out.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=OUT_DIR, help="output folder (default: tests/fixtures)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a fixture in --out differs from a fresh one")
    ap.add_argument("--skip-self-test", action="store_true",
                    help="skip vit_reference's gradcheck and layout checks")
    args = ap.parse_args()
    torch.set_num_threads(1)  # bitwise-reproducible reductions

    if not args.skip_self_test:
        for line in ref.self_test():
            print("self-test:", line)

    results = {}
    stale = []
    worst = {}
    for name, cfg in FIXTURES.items():
        config, tensors, f32_err, full = compute(cfg)
        results[name] = full
        blob = encode(config, tensors)
        path = os.path.join(args.out, name + ".vhfx")
        digest = hashlib.sha256(blob).hexdigest()[:12]
        if args.check:
            try:
                with open(path, "rb") as f:
                    same = f.read() == blob
            except OSError:
                same = False
            if not same:
                stale.append(path)
            print(f"{'ok   ' if same else 'STALE'} {path}")
        else:
            os.makedirs(args.out, exist_ok=True)
            with open(path, "wb") as f:
                f.write(blob)
            print(f"wrote {path}: {len(blob)} bytes, {len(tensors)} tensors, sha256 {digest}")
        for k, v in f32_err.items():
            kind = "logits" if k == "logits" else "loss" if k == "loss" else "grads"
            if v > worst.get(kind, (0.0, ""))[0]:
                worst[kind] = (v, f"{name}:{k}")

    # The batch_second twins must hold the same numbers as the batch_first ones.
    for base in ("vit_token", "vit_pooled"):
        (la, sa, ga), (lb, sb, gb) = results[base + "_bf"], results[base + "_bs"]
        diff = max([(la - lb).abs().max().item(), (sa - sb).abs().item()]
                   + [(ga[n] - gb[n]).abs().max().item() for n in ga])
        if diff > 1e-12:
            raise AssertionError(f"{base}: batch_first and batch_second differ by {diff}")
        print(f"{base}_bf vs {base}_bs (float64): max abs diff {diff:.1e}")

    for kind, (v, where) in sorted(worst.items()):
        print(f"torch float32 vs stored, worst {kind}: {v:.2e} ({where})")

    if stale:
        print("HINT: regenerate with /usr/bin/python3 tests/reference/make_fixtures.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
