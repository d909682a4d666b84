"""make_pos_embed_fixture.py - PyTorch's bicubic resize of position embeddings, for the vit plugin.

    ~/torch-venv/bin/python tests/reference/make_pos_embed_fixture.py          # write
    ~/torch-venv/bin/python tests/reference/make_pos_embed_fixture.py --check  # exit 1 if stale

Writes tests/fixtures/pos_embed_resize.vhfx (the VHFX format of tests/fixture.h). For each case
"g<old>_<new>_p<prefix>" it stores "<case>.in", a random float32 pos_embed (1, prefix + old^2, D),
and "<case>.out", (1, prefix + new^2, D): the prefix rows (class token) kept, the old x old grid
resized to new x new as timm's resample_abs_pos_embed does it with antialias=False:
torch.nn.functional.interpolate(mode='bicubic', align_corners=False) of the (1, D, old, old) grid.
The resize runs in float64 on the stored float32 input and is rounded to float32 once; the script
also checks that timm's own function (float32) lands within 1e-5 of it (float32 rounding: 1.3e-6 measured). Config key "cases" lists
the cases, comma-separated. tests/test_finetune.c loads each "in" through the vit plugin's
load_weights (mode pretrained) into a model of the new grid and compares with "out".
"""
import argparse
import io
import os
import struct
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "..", "fixtures", "pos_embed_resize.vhfx")
DIM = 8
# (old grid, new grid, prefix tokens): the fine-tune recipe's 7 -> 8 (28 -> 32 px, patch 4,
# pooled: no class token), the same with a class token, timm's 224 -> 384 (14 -> 24), and a
# shrink.
CASES = [(7, 8, 0), (7, 8, 1), (14, 24, 1), (8, 7, 0)]


def resize(pos, old, new, prefix):
    body = pos[:, prefix:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
    body = F.interpolate(body, size=(new, new), mode="bicubic", align_corners=False)
    body = body.permute(0, 2, 3, 1).reshape(1, new * new, -1)
    return torch.cat([pos[:, :prefix], body], dim=1)


def encode(config, tensors):
    out = io.BytesIO()
    u32 = lambda v: out.write(struct.pack("<I", v))  # noqa: E731
    out.write(b"VHFX")
    u32(1)
    u32(len(config))
    for k, v in config:
        for s in (k, v):
            u32(len(s.encode()))
            out.write(s.encode())
    u32(len(tensors))
    for name, t in tensors:
        u32(len(name.encode()))
        out.write(name.encode())
        u32(0)  # f32
        u32(t.dim())
        for d in t.shape:
            u32(d)
        out.write(struct.pack(f"<{t.numel()}f", *t.reshape(-1).tolist()))
    return out.getvalue()


def build():
    from timm.layers import resample_abs_pos_embed
    gen = torch.Generator().manual_seed(0)
    names, tensors = [], []
    for old, new, prefix in CASES:
        name = f"g{old}_{new}_p{prefix}"
        pos = torch.randn(1, prefix + old * old, DIM, generator=gen, dtype=torch.float32)
        want = resize(pos.double(), old, new, prefix).float()
        timm_out = resample_abs_pos_embed(pos, [new, new], num_prefix_tokens=prefix,
                                          antialias=False)
        err = ((timm_out - want).abs().max() / want.abs().max()).item()
        assert err < 1e-5, f"{name}: timm differs by {err:.1e}"
        names.append(name)
        tensors += [(name + ".in", pos), (name + ".out", want)]
    return encode([("cases", ",".join(names)), ("dim", str(DIM))], tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = ap.parse_args()
    blob = build()
    if args.check:
        same = os.path.exists(PATH) and open(PATH, "rb").read() == blob
        print(f"{PATH}: {'current' if same else 'STALE'}")
        return 0 if same else 1
    with open(PATH, "wb") as f:
        f.write(blob)
    print(f"wrote {PATH} ({len(blob)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
