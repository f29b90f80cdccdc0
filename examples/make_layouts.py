#!/usr/bin/env python3
"""Writes the bundled example layouts (standard library only, so it runs anywhere).

random_d25.npy   32 × 32 blocks, each present with probability 0.25 (uint8, C order)
banded.json      16 × 16 blocks, |row - col| <= 2, as a coordinate list
strided_bool_f.npy  24 × 20 blocks, bool in Fortran order: local band plus every 4th column
conv_overlapping.json  a convolution's channel blocks (bsjit::ConvLayout): 8 blocks of 16 input
                   channels → 32 output channels at strides 8 and 16, so that neighbours overlap
"""
import json
import os
import random
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layouts")


def write_npy(path, rows, cols, mask, descr="|u1", fortran=False):
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%d, %d), }" % (
        descr, "True" if fortran else "False", rows, cols)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    order = [(r, c) for c in range(cols) for r in range(rows)] if fortran else \
            [(r, c) for r in range(rows) for c in range(cols)]
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(bytes(1 if mask[r][c] else 0 for r, c in order))


def main():
    os.makedirs(HERE, exist_ok=True)
    rng = random.Random(25)
    m = [[rng.random() < 0.25 for _ in range(32)] for _ in range(32)]
    write_npy(os.path.join(HERE, "random_d25.npy"), 32, 32, m)
    blocks = [[r, c] for r in range(16) for c in range(16) if abs(r - c) <= 2]
    with open(os.path.join(HERE, "banded.json"), "w") as f:
        json.dump({"rows": 16, "cols": 16, "blocks": blocks}, f)
        f.write("\n")
    s = [[abs(r - c) <= 1 or c % 4 == 0 for c in range(20)] for r in range(24)]
    write_npy(os.path.join(HERE, "strided_bool_f.npy"), 24, 20, s, descr="|b1", fortran=True)
    conv = [{"c": list(range(8 * g, 8 * g + 16)), "k": list(range(16 * g, 16 * g + 32))} for g in range(8)]
    with open(os.path.join(HERE, "conv_overlapping.json"), "w") as f:
        json.dump({"C": 72, "K": 144, "blocks": conv}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
