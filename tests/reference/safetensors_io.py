"""safetensors_io.py - the safetensors format in plain Python, for the fixtures and checks.

The format (huggingface/safetensors): u64 little-endian header length, a JSON header
{"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}, then the
bytes of every tensor. Written here without the safetensors package (not in Debian 12).
"""

import json
import struct

import numpy as np
import torch

_DTYPES = {"F32": (np.float32, torch.float32)}


def save(path, tensors, metadata=None):
    """tensors: {name: torch tensor}; written as F32 in the given order."""
    header = {"__metadata__": metadata or {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    """{name: torch tensor} of an F32 safetensors file, and its metadata."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}")
        b, e = info["data_offsets"]
        arr = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np.float32).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta
