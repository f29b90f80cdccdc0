#!/usr/bin/env python3
"""What a layout change costs a training step through PyTorch (bsjit.nn.BlockSparseLinear.set_layout):
the step's wall time (forward and backward, synchronized) with the layout it has, and set_layout's
time and the first step's after a change to a layout with its block columns moved and after a change
to a fresh random layout, with the cache's compile counts: a layout whose kernels have a source
already compiled costs no NVRTC run; one for which the generator picks a kernel variant not yet
compiled for the shape costs one, once. Needs a GPU and the bsjit package.

    python3 tools/bench/layout_change.py [--n 8192] [--features 4096] [--blocks 32,64] [--density 0.25]
"""

import argparse
import statistics
import time

import numpy as np
import torch

import bsjit
from bsjit.nn import BlockSparseLinear


def timed(fn, reps=1):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--blocks", default="32,64")
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--changes", type=int, default=5)
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, bf16, N = {a.n}, C = K = {a.features}, d = {a.density}")
    print("block | step ms (same layout) | change to moved columns: set_layout ms + first step ms, NVRTC runs "
          "| change to a fresh layout: the same")
    for b in (int(x) for x in a.blocks.split(",")):
        rng = np.random.default_rng(b)
        side = a.features // b
        mask = rng.random((side, side)) < a.density
        layer = BlockSparseLinear(mask, b, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(a.n, a.features, device="cuda", dtype=torch.bfloat16, requires_grad=True)

        def step():
            layer(x).sum().backward()

        step()
        steady = timed(step, 10)
        rows = []
        for change in ("moved", "fresh"):
            set_ms, step_ms, compiles = [], [], []
            for i in range(a.changes):
                new = np.roll(mask, i + 1, axis=1) if change == "moved" else rng.random((side, side)) < a.density
                before = bsjit.cache_stats()["compiles"]
                set_ms.append(timed(lambda: layer.set_layout(new)))
                step_ms.append(timed(step))
                compiles.append(bsjit.cache_stats()["compiles"] - before)
            # medians, so a change that compiled shows only where most did
            rows.append(f"{statistics.median(set_ms):6.2f} + {statistics.median(step_ms):8.2f} ms, "
                        f"{sum(compiles)} in {a.changes} (max step {max(step_ms):.0f} ms)")
        print(f"{b:5d} | {steady:8.2f} | {rows[0]} | {rows[1]}")


if __name__ == "__main__":
    main()
