"""make_safetensors.py - a safetensors file written from a PyTorch ViT's state_dict.

Writes tests/fixtures/vit_token_bf.safetensors: the state_dict of the reference ViT of the
vit_token_bf fixture (same config, same seed, so the same float32 weights), the way timm /
Hugging Face publish ViT weights. tests/test_weights.c loads it into vithost and checks the
logits against the fixture's.

    /usr/bin/python3 tests/reference/make_safetensors.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True

import make_fixtures  # noqa: E402
import safetensors_io  # noqa: E402
import vit_reference as ref  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "vit_token_bf.safetensors")


def main():
    cfg = make_fixtures.FIXTURES["vit_token_bf"]
    model = ref.init_params(ref.build(cfg), cfg["seed"])
    safetensors_io.save(OUT, model.state_dict(), {"format": "pt", "source": "vit_reference.py"})
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes, "
          f"{len(model.state_dict())} tensors)")


if __name__ == "__main__":
    main()
