#!/usr/bin/env python3
"""Compares bsjit-bench CSV files (--csv) of the same cells: each cell's TFLOP/s side by side, the
last file against the first, then the geometric mean of that ratio per op and block size.

    tools/bench/compare.py BASE.csv [OTHER.csv ...] NEW.csv
"""
import csv
import math
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as f:
        return {(r["suite"], r["layout"], r["block"], r["density"], r["op"]): r for r in csv.DictReader(f)}


def main(paths):
    if not paths:
        sys.exit(__doc__)
    runs = [load(p) for p in paths]
    ratios = defaultdict(list)
    for key, first in runs[0].items():
        rows = [run.get(key) for run in runs]
        if any(r is None for r in rows):
            continue
        tflops = [float(r["tflops"]) for r in rows]
        sol = "/".join(r["sol"] for r in rows)
        ratio = tflops[-1] / tflops[0] if tflops[0] > 0 else float("nan")
        ratios[(key[4], int(key[2]))].append(ratio)
        cells = " ".join(f"{t:8.1f}" for t in tflops)
        print(f"{key[1]:9} b{key[2]:>3} d{key[3]:<5} {key[4]:15} {cells}  x{ratio:.3f}  SOL {sol}")
    if len(runs) > 1:
        for (op, block), rs in sorted(ratios.items()):
            mean = math.exp(sum(math.log(r) for r in rs) / len(rs))
            up = sum(r > 1 for r in rs)
            print(f"geomean {op:15} b{block:>3}: x{mean:.4f} ({up} of {len(rs)} up, {min(rs):.3f}-{max(rs):.3f})")


if __name__ == "__main__":
    main(sys.argv[1:])
