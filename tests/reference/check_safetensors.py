"""check_safetensors.py - does a vithost checkpoint load back into the PyTorch ViT?

    /usr/bin/python3 tests/reference/check_safetensors.py MODEL.safetensors FIXTURE.vhfx

Loads the file with load_state_dict(strict=True) into the reference ViT built from the
fixture's config, runs the fixture's input, and compares the logits with the fixture's
(relative to their largest entry, tolerance 1e-4). Exit 0 when they agree; prints one
SKIPPED line and exits 0 where PyTorch is not installed.
"""

import os
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np
    import torch
except ImportError as e:  # the check needs PyTorch; the C tests do not
    print(f"SKIPPED: check_safetensors: PyTorch is not available ({e})")
    sys.exit(0)

import safetensors_io  # noqa: E402
import vit_reference as ref  # noqa: E402


def read_vhfx(path):
    raw = open(path, "rb").read()
    pos = 8
    u32 = lambda: struct.unpack_from("<I", raw, pos)[0]  # noqa: E731
    config, tensors = {}, {}
    n = u32(); pos += 4
    for _ in range(n):
        k = u32(); pos += 4; key = raw[pos:pos + k].decode(); pos += k
        v = u32(); pos += 4; config[key] = raw[pos:pos + v].decode(); pos += v
    n = u32(); pos += 4
    for _ in range(n):
        k = u32(); pos += 4; name = raw[pos:pos + k].decode(); pos += k
        dtype = u32(); pos += 4
        ndim = u32(); pos += 4
        dims = struct.unpack_from(f"<{ndim}I", raw, pos); pos += 4 * ndim
        count = int(np.prod(dims)) if ndim else 1
        arr = np.frombuffer(raw, dtype=np.int32 if dtype == 1 else np.float32, count=count,
                            offset=pos).reshape(dims)
        pos += 4 * count
        tensors[name] = torch.from_numpy(arr.copy())
    return config, tensors


def main():
    model_path, fixture_path = sys.argv[1], sys.argv[2]
    config, tensors = read_vhfx(fixture_path)
    cfg = {k: v for k, v in config.items()}
    for k in ("image_height", "image_width", "channels", "patch_size", "dim", "depth", "heads",
              "mlp_dim", "num_classes", "batch"):
        cfg[k] = int(cfg[k])
    cfg["eps"] = float(cfg["eps"])
    model = ref.build(cfg)
    state, meta = safetensors_io.load(model_path)
    model.load_state_dict(state, strict=True)  # names and shapes must match timm's
    with torch.no_grad():
        logits = model(tensors["input"])
    want = tensors["logits"]
    err = ((logits - want).abs().max() / want.abs().max()).item()
    print(f"check_safetensors: {model_path}: {len(state)} tensors loaded into PyTorch, "
          f"logits err {err:.2e} (metadata {meta})")
    sys.exit(0 if err <= 1e-4 else 1)


if __name__ == "__main__":
    main()
