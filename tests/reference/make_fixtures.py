"""make_fixtures.py - golden fixtures for vithost's vit plugin, from vit_reference.py.

    /usr/bin/python3 tests/reference/make_fixtures.py           # write tests/fixtures/*.vhfx
    /usr/bin/python3 tests/reference/make_fixtures.py --check   # exit 1 if a committed one is stale
    /usr/bin/python3 tests/reference/make_fixtures.py --only vit_token_bf_amp_bf16  # just one

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

AMP fixtures (AUTOCAST below, e.g. vit_token_bf_amp_bf16): the same format, tensors and config as
their float64 twin plus one more config key, "autocast" -> "bf16". Same parameters, input and labels
(bit for bit); the forward ran under torch.autocast("cpu", dtype=torch.bfloat16) with the float32
parameters, the loss too, and the backward after it, as a PyTorch AMP training step does. So the
results are PyTorch's AMP numbers, not exact ones: logits are bf16 values (the head is a bf16
linear), the loss is float32 (cross_entropy is on autocast's fp32 list), and gradients are float32
tensors, bf16 values for every parameter that a bf16 op consumed (linear and conv weights and
biases), float32 sums for the rest (layer norms, cls_token, pos_embed, which meet the float32
residual stream). What torch 1.13's CPU autocast does to this model, found by running it:
conv2d/linear/matmul run in bf16 with float32 accumulation, rounded once (bias included); the
residual stream is float32 (bf16 branch + float32 pos_embed / residual promotes to float32), so
layer_norm runs in float32 (it follows its input); q * scale, q @ k^T, softmax, probs @ v and GELU
run in bf16 (they follow their bf16 input, each rounding its output); cross_entropy casts its bf16
logits to float32. bf16 matmul kernels differ between CPUs (oneDNN's avx512_bf16 ones where the
ISA has them, a float32-accumulating fallback otherwise), so these results may differ by a few bf16
ulps between machines; --check reports that without calling the file stale (CHECK_TOL).

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

# AMP fixtures: name -> (the float64 fixture whose config, weights and batch it reuses, the
# autocast dtype). See the module docstring.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16}
AUTOCAST = {
    "vit_token_bf_amp_bf16": ("vit_token_bf", "bf16"),
    # head_dim 12: the batched attention products (bf16 kernels under AMP), not the fused
    # small-head blocks that head_dim 16 takes
    "vit_odd_amp_bf16": ("vit_odd", "bf16"),
}

# --check: a fixture whose bytes differ from a fresh one is still current when its config,
# parameters, input and labels are identical and every result is within this normalised error
# (rel_err) of the fresh one; the difference is then the machine's, not the script's. float64:
# mathematically-zero gradients (the k part of qkv.bias: softmax ignores a per-query constant)
# hold summation noise of ~1e-17 that varies with the BLAS kernels. bf16 autocast: the bf16
# matmul kernels of another ISA round a few results differently (2^-6: two to four bf16 ulps of
# the tensor's largest entry; a change of what autocast runs in bf16 moves results by more).
CHECK_TOL = {"float64": 1e-12, "bf16": 2.0 ** -6}


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


def make_inputs(cfg):
    """The float32 model, its (name, parameter) copies, input images and labels of a config."""
    model = ref.init_params(ref.build(cfg), cfg["seed"])  # float32 values
    params = [(n, p.detach().clone()) for n, p in model.state_dict().items()]
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    images = torch.randn(cfg["batch"], cfg["channels"], cfg["image_height"], cfg["image_width"],
                         generator=g, dtype=torch.float32)
    labels = torch.randint(0, cfg["num_classes"], (cfg["batch"],), generator=g)
    if len(set(labels.tolist())) < 2:
        raise AssertionError("labels should not all be the same class")
    return model, params, images, labels


def compute(cfg):
    """Returns (config items, [(name, tensor)], float32-vs-float64 errors)."""
    model, params, images, labels = make_inputs(cfg)

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


def compute_autocast(cfg, dtype_name, truth):
    """An AMP step of the float32 model under torch.autocast("cpu", dtype): returns (config items,
    [(name, tensor)], errors against the float64 results `truth` = (logits, loss, grads))."""
    dtype = AUTOCAST_DTYPES[dtype_name]
    model, params, images, labels = make_inputs(cfg)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype):
        logits = model(images)
        loss = ref.loss_fn(logits, labels, cfg["label_smoothing"])
    loss.backward()  # outside the context, as torch's AMP recipe does; ops keep forward's dtypes
    if logits.dtype != dtype or loss.dtype != torch.float32:
        raise AssertionError(f"autocast gave {logits.dtype} logits and a {loss.dtype} loss: "
                             f"this torch's autocast is not the one the fixture documents")
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for n, gr in grads.items():
        if gr.dtype != torch.float32 or not gr.abs().max().item() > 1e-7:
            raise AssertionError(f"gradient of {n}: {gr.dtype}, max {gr.abs().max().item()}")
    t_logits, t_loss, t_grads = truth
    err = {"logits": rel_err(logits.double(), t_logits), "loss": rel_err(loss.double(), t_loss)}
    err.update({"grad." + n: rel_err(grads[n].double(), t_grads[n]) for n in grads})

    tensors = list(params)
    tensors.append(("input", images))
    tensors.append(("labels", labels.to(torch.int32)))
    tensors.append(("logits", logits.detach().float()))
    tensors.append(("loss", loss.detach().reshape(1).float()))
    tensors += [("grad." + n, grads[n]) for n, _ in params]
    config = [(k, yaml_text(cfg[k])) for k in KEYS] + [("autocast", dtype_name)]
    return config, tensors, err


def decode(blob):
    """(config items, {name: tensor}) of an encoded fixture; raises ValueError when damaged."""
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(blob):
            raise ValueError("truncated")
        pos += n
        return blob[pos - n:pos]

    u32 = lambda: struct.unpack("<I", take(4))[0]  # noqa: E731
    text = lambda: take(u32()).decode("utf-8")  # noqa: E731
    if take(4) != MAGIC or u32() != VERSION:
        raise ValueError("not a version %d fixture" % VERSION)
    config = [(text(), text()) for _ in range(u32())]
    tensors = {}
    for _ in range(u32()):
        name, dtype, ndim = text(), u32(), u32()
        dims = [u32() for _ in range(ndim)]
        numel = 1
        for d in dims:
            numel *= d
        torch_dtype = {DTYPE_F32: torch.float32, DTYPE_I32: torch.int32}[dtype]
        data = bytearray(take(4 * numel))
        tensors[name] = torch.frombuffer(data, dtype=torch_dtype).reshape(dims) if numel else \
            torch.zeros(dims, dtype=torch_dtype)
    if pos != len(blob):
        raise ValueError("trailing bytes")
    return config, tensors


def check_blob(path, blob, tol):
    """'same', 'close: ...' (current: only the machine's rounding differs) or 'STALE: why'."""
    try:
        with open(path, "rb") as f:
            old = f.read()
    except OSError as e:
        return f"STALE: {e.strerror}"
    if old == blob:
        return "same"
    try:
        old_config, old_tensors = decode(old)
    except (ValueError, KeyError, UnicodeDecodeError) as e:
        return f"STALE: {e}"
    config, tensors = decode(blob)
    if old_config != config or list(old_tensors) != list(tensors):
        return "STALE: other config or tensors"
    worst, where = 0.0, ""
    results = ("logits", "loss")
    for name, t in tensors.items():
        o = old_tensors[name]
        if o.shape != t.shape or o.dtype != t.dtype:
            return f"STALE: {name} has another shape or dtype"
        if name in results or name.startswith("grad."):
            e = rel_err(o.double(), t.double())
            if e > worst:
                worst, where = e, name
        elif not torch.equal(o, t):
            return f"STALE: {name} differs"
    if worst > tol:
        return f"STALE: {where} differs by {worst:.1e} (> {tol:.0e})"
    return f"close: results within {worst:.1e} of a fresh run ({where}), inputs identical"


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
                    help="write nothing; exit 1 if a fixture in --out differs from a fresh one "
                         "by more than the machine's rounding (CHECK_TOL)")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="write or check only this fixture (repeatable; default: all)")
    ap.add_argument("--skip-self-test", action="store_true",
                    help="skip vit_reference's gradcheck and layout checks")
    args = ap.parse_args()
    torch.set_num_threads(1)  # bitwise-reproducible reductions
    known = list(FIXTURES) + list(AUTOCAST)
    for name in args.only or []:
        if name not in known:
            ap.error(f"no fixture {name!r}; known: {', '.join(known)}")
    selected = set(args.only or known)

    if not args.skip_self_test:
        for line in ref.self_test():
            print("self-test:", line)

    stale = []

    def emit(name, config, tensors, tol):
        blob = encode(config, tensors)
        path = os.path.join(args.out, name + ".vhfx")
        digest = hashlib.sha256(blob).hexdigest()[:12]
        if args.check:
            verdict = check_blob(path, blob, tol)
            is_stale = verdict.startswith("STALE: ")
            if is_stale:
                stale.append(path)
                verdict = verdict[len("STALE: "):]
            print(f"{'STALE' if is_stale else 'ok   '} {path}"
                  + ("" if verdict == "same" else f" ({verdict})"))
        else:
            os.makedirs(args.out, exist_ok=True)
            with open(path, "wb") as f:
                f.write(blob)
            print(f"wrote {path}: {len(blob)} bytes, {len(tensors)} tensors, sha256 {digest}")

    def note_worst(worst, errs, name):
        for k, v in errs.items():
            kind = "logits" if k == "logits" else "loss" if k == "loss" else "grads"
            if v > worst.get(kind, (0.0, ""))[0]:
                worst[kind] = (v, f"{name}:{k}")

    # Every float64 fixture is computed (the twins are compared, and the AMP fixtures are
    # measured against them); only the selected ones are written or checked.
    results = {}
    worst = {}
    for name, cfg in FIXTURES.items():
        config, tensors, f32_err, full = compute(cfg)
        results[name] = full
        if name in selected:
            emit(name, config, tensors, CHECK_TOL["float64"])
        note_worst(worst, f32_err, name)

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

    for name, (base, dtype_name) in AUTOCAST.items():
        if name not in selected:
            continue
        config, tensors, err = compute_autocast(FIXTURES[base], dtype_name, results[base])
        emit(name, config, tensors, CHECK_TOL[dtype_name])
        # PyTorch's own AMP error: how far the stored results are from the exact ones (a
        # guide for the C test, whose AMP run has errors of the same size, rounded elsewhere).
        amp_worst = {}
        note_worst(amp_worst, err, name)
        for kind, (v, where) in sorted(amp_worst.items()):
            print(f"torch autocast {dtype_name} vs {base} (float64), worst {kind}: "
                  f"{v:.2e} ({where})")

    if stale:
        print("HINT: regenerate with /usr/bin/python3 tests/reference/make_fixtures.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
