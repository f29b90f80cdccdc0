#!/usr/bin/env python3
"""Trains a block-sparse MLP and the same MLP dense, side by side, on data generated here, and prints
both losses as they fall. Needs a GPU and the bsjit package (pip install .).

The task: regress y = f(x) where f is a random two-layer network with a block-sparse hidden layer,
so a block-sparse model of the right layout can fit it exactly and a dense one has 1/density times
the weights to fit it with.

    python3 examples/python/train_sparse_mlp.py [--steps 300] [--features 1024] [--block 32] [--density 0.25]
"""

import argparse
import time

import numpy as np
import torch

import bsjit
from bsjit.nn import BlockSparseLinear


class SparseMLP(torch.nn.Module):
    def __init__(self, features, hidden, block, layouts, dtype):
        super().__init__()
        self.up = BlockSparseLinear(layouts[0], block, device="cuda", dtype=dtype)
        self.down = BlockSparseLinear(layouts[1], block, device="cuda", dtype=dtype)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class DenseMLP(torch.nn.Module):
    def __init__(self, features, hidden, dtype):
        super().__init__()
        self.up = torch.nn.Linear(features, hidden, device="cuda", dtype=dtype)
        self.down = torch.nn.Linear(hidden, features, device="cuda", dtype=dtype)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--compile", action="store_true", help="torch.compile both models (fullgraph)")
    a = ap.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    b = a.block
    layouts = [bsjit.Layout(rng.random((a.features // b, a.hidden // b)) < a.density),
               bsjit.Layout(rng.random((a.hidden // b, a.features // b)) < a.density)]
    dtype = torch.bfloat16
    teacher = SparseMLP(a.features, a.hidden, b, layouts, dtype).requires_grad_(False)
    sparse = SparseMLP(a.features, a.hidden, b, layouts, dtype)
    dense = DenseMLP(a.features, a.hidden, dtype)
    print(f"{torch.cuda.get_device_name()}: {a.features} → {a.hidden} → {a.features}, block {b}, "
          f"density {a.density}; weights: sparse {sum(p.numel() for p in sparse.parameters()):,}, "
          f"dense {sum(p.numel() for p in dense.parameters()):,}")
    bsjit.warmup(sparse)  # every kernel compiled or loaded before the first step
    models = {"sparse": sparse, "dense": dense}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=2e-3) for k, m in models.items()}

    def step(model, opt, x, y):
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    steps = {k: (torch.compile(step, fullgraph=False) if a.compile else step) for k in models}
    seconds = {k: 0.0 for k in models}
    for i in range(a.steps + 1):
        x = torch.randn(a.batch, a.features, device="cuda", dtype=dtype)
        y = teacher(x)
        losses = {}
        for k, m in models.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            losses[k] = steps[k](m, optims[k], x, y).item()
            seconds[k] += time.perf_counter() - t
        if i % max(1, a.steps // 10) == 0:
            print(f"step {i:5d}   loss sparse {losses['sparse']:.5f}   dense {losses['dense']:.5f}")
    print(f"time per step: sparse {1e3 * seconds['sparse'] / (a.steps + 1):.2f} ms, "
          f"dense {1e3 * seconds['dense'] / (a.steps + 1):.2f} ms (the first steps include compiles)")


if __name__ == "__main__":
    main()
