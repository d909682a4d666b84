#!/usr/bin/env python3
"""Writes Fashion-MNIST (or MNIST) IDX files as CSV for the `csv` example plugin.

    python3 make_csv.py /usr/share/datasets/fashion-mnist OUT_DIR [--limit N]

OUT_DIR/fashion-mnist-train.csv and fashion-mnist-test.csv: a header line, then
one row per image: label,p0,...,p783 (0..255). Standard library only.
"""
import argparse
import gzip
import os
import struct


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an IDX file of bytes")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def find(root, stem):
    for name in (stem + ".gz", stem):
        if os.path.exists(os.path.join(root, name)):
            return os.path.join(root, name)
    raise SystemExit(f"{root}: no {stem}[.gz]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=0, help="rows per split (0: all)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        (n, h, w), pixels = read_idx(find(a.root, f"{prefix}-images-idx3-ubyte"))
        (_,), labels = read_idx(find(a.root, f"{prefix}-labels-idx1-ubyte"))
        if a.limit:
            n = min(n, a.limit)
        path = os.path.join(a.out, f"fashion-mnist-{split}.csv")
        with open(path, "w") as f:
            f.write("label," + ",".join(f"p{i}" for i in range(h * w)) + "\n")
            for i in range(n):
                row = pixels[i * h * w:(i + 1) * h * w]
                f.write(str(labels[i]) + "," + ",".join(map(str, row)) + "\n")
        print(f"wrote {path}: {n} rows")


if __name__ == "__main__":
    main()
