"""make_layer_decay_fixture.py - timm's layer-wise lr decay scales for vithost's vit, per parameter.

    ~/torch-venv/bin/python tests/reference/make_layer_decay_fixture.py          # write
    ~/torch-venv/bin/python tests/reference/make_layer_decay_fixture.py --check  # exit 1 if stale

Needs torch and timm (pip install timm torchvision pillow numpy in that venv). For each case it
builds timm's VisionTransformer of the same depth, classifier and names as vithost's vit
(token: class token, final `norm`; pooled: no class token, `global_pool='avg'`, `fc_norm`), runs
timm.optim._param_groups.param_groups_layer_decay (the vit's group_matcher: stem = cls_token,
pos_embed, patch_embed; blocks.i; `norm` joins the last block; the rest -- fc_norm, head -- is the
top layer) and writes tests/fixtures/layer_decay_<case>.txt:

    @classifier token
    @depth 4
    @layer_decay 0.75
    cls_token 0.2373046875          one line per parameter, state_dict order, scale as repr(float)

tests/test_finetune.c compares the mta plugin's per-parameter learning-rate scale with it.
"""
import argparse
import os
import sys

import torch
from timm.models.vision_transformer import VisionTransformer
from timm.optim._param_groups import param_groups_layer_decay

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "..", "fixtures")

# (case name, classifier, depth, layer_decay)
CASES = [
    ("pooled_d4", "pooled", 4, 0.75),  # the main job's shape
    ("token_d4", "token", 4, 0.75),
    ("token_d12", "token", 12, 0.65),  # ViT-B/16 fine-tuning depth and BEiT's decay
]


def make_text(classifier, depth, decay):
    token = classifier == "token"
    m = VisionTransformer(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=16,
                          depth=depth, num_heads=2, mlp_ratio=2.0,
                          global_pool="token" if token else "avg", class_token=token)
    name_of = {id(p): n for n, p in m.named_parameters()}
    scale_of = {}
    for g in param_groups_layer_decay(m, weight_decay=0.05, layer_decay=decay):
        for p in g["params"]:
            scale_of[name_of[id(p)]] = g["lr_scale"]
    lines = [f"@classifier {classifier}", f"@depth {depth}", f"@layer_decay {decay!r}"]
    lines += [f"{n} {scale_of[n]!r}" for n, _ in m.named_parameters()]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    args = ap.parse_args()
    torch.manual_seed(0)
    stale = 0
    for name, classifier, depth, decay in CASES:
        path = os.path.join(OUT_DIR, f"layer_decay_{name}.txt")
        text = make_text(classifier, depth, decay)
        if args.check:
            old = open(path).read() if os.path.exists(path) else None
            print(f"{path}: {'current' if old == text else 'STALE'}")
            stale |= old != text
        else:
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
