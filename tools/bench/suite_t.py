#!/usr/bin/env python3
"""Suite T of BENCH.md (training through PyTorch), in one process with torch's own CUDA-event timing:

- mlp: a block-sparse MLP layer pair (4096 -> 16384 -> 4096, GELU, bf16, N = 8192 tokens, b = 64 and
  128, d = 0.25 and 0.1): a forward + backward step of bsjit.nn.BlockSparseLinear against the same
  model with nn.Linear (dense) and with torch BSR (to_sparse_bsr + F.linear, forward and, where
  torch differentiates it, backward), each eager, under torch.compile and replayed from a CUDA
  graph; and the step's time against the sum of its kernels' times (torch.profiler), the target
  being within 1.05x.
- attention: suite A's causal and window cells (B = 4, H = 16, S = 8192, bf16, [b, h, s, d]) through
  bsjit.functional.attention against flex_attention (compiled) and dense SDPA, forward and
  forward + backward.
- host: microseconds of host time per call on a tiny problem: bsjit's matmul op against torch.mm,
  and BlockSparseLinear against nn.Linear with their weights requiring grad
  (tools/bench/dispatch_overhead.py has the full comparison).

Needs a GPU and the bsjit package:  python3 tools/bench/suite_t.py [--parts mlp attention host]
[--reps 20] [--json out.json]
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import bsjit
from bsjit.layout import as_masks, mask_set_handle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dispatch_overhead import graphed  # noqa: E402  (a CUDA graph of fn after warm-up calls)
from torch_attention import block_mask_table, median_ms  # noqa: E402  (suite A's masks and timing)

ROWS = []


def report(**kv):
    ROWS.append(kv)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kv.items()), flush=True)


def kernel_ms(fn):
    """Milliseconds the GPU spends in kernels during one call of fn (torch.profiler's CUDA events)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    # the kernels (and copies) the GPU ran: events on the CUDA device, each its own interval
    total_us = sum(e.time_range.elapsed_us() for e in prof.events() if str(e.device_type).endswith("CUDA"))
    return total_us / 1e3


def balanced_mask(rows, cols, density, seed):
    """[rows, cols] blocks, round(density · rows) in every column, rows drawn at random."""
    rng = np.random.default_rng(seed)
    per_column = max(1, round(density * rows))
    mask = np.zeros((rows, cols), dtype=bool)
    for c in range(cols):
        mask[rng.choice(rows, per_column, replace=False), c] = True
    return mask


def mlp_part(reps):
    n, d_model, d_hidden = 8192, 4096, 16384
    x = torch.randn(n, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(n, d_model, device="cuda", dtype=torch.bfloat16)

    def make_step(model):
        params = [x, *model.parameters()]

        def step():
            return torch.autograd.grad(model(x), params, dy)
        return step

    def run(name, block, density, model):
        step = make_step(model)
        eager = median_ms(step, reps)
        compiled_model = torch.compile(model)
        compiled = median_ms(make_step(compiled_model), reps)
        replay = graphed(step)
        graph = median_ms(replay, reps)
        kernels = kernel_ms(step)
        report(part="mlp", impl=name, block=block, density=density, eager_ms=eager, compiled_ms=compiled,
               graph_ms=graph, kernels_ms=kernels, eager_over_kernels=eager / kernels if kernels else 0.0)
        return eager

    torch._dynamo.reset()
    dense = torch.nn.Sequential(torch.nn.Linear(d_model, d_hidden), torch.nn.GELU(),
                                torch.nn.Linear(d_hidden, d_model)).to("cuda", torch.bfloat16)
    dense_ms = run("dense", 0, 1.0, dense)
    for block in (64, 128):
        for density in (0.25, 0.1):
            torch._dynamo.reset()
            model = torch.nn.Sequential(
                bsjit.nn.BlockSparseLinear(balanced_mask(d_model // block, d_hidden // block, density, 1), block,
                                           device="cuda", dtype=torch.bfloat16),
                torch.nn.GELU(),
                bsjit.nn.BlockSparseLinear(balanced_mask(d_hidden // block, d_model // block, density, 2), block,
                                           device="cuda", dtype=torch.bfloat16))
            bsjit.warmup(model)
            sparse_ms = run("bsjit", block, density, model)
            report(part="mlp", impl="bsjit vs dense", block=block, density=density, speedup=dense_ms / sparse_ms)
            bsr_part(model, block, density, x, dy, reps)


def bsr_part(model, block, density, x, dy, reps):
    """The same weights as torch BSR tensors through F.linear: forward, and forward + backward where
    torch differentiates it (reported as n/a where it raises)."""
    weights = []
    for layer in (model[0], model[2]):
        with torch.no_grad():
            dense_w = layer.to_dense()  # [in, out]; F.linear takes [out, in]
        weights.append((dense_w.t().contiguous().to_sparse_bsr((block, block)), layer.bias))

    def forward():
        h = F.gelu(F.linear(x, weights[0][0], weights[0][1]))
        return F.linear(h, weights[1][0], weights[1][1])
    try:
        fwd = median_ms(lambda: forward(), reps)
    except Exception as e:  # noqa: BLE001  (a torch build without the BSR kernel for this dtype)
        report(part="mlp", impl="torch bsr", block=block, density=density, note=f"{type(e).__name__}: {str(e)[:120]}")
        return
    try:
        step = median_ms(lambda: torch.autograd.grad(forward(), [x], dy), reps)
    except Exception as e:  # noqa: BLE001
        step = float("nan")
        print(f"torch bsr backward b{block} d{density}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    report(part="mlp", impl="torch bsr", block=block, density=density, forward_ms=fwd, step_ms=step)


def attention_part(reps):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    B, H, S, d = 4, 16, 8192, 128
    q, k, v = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16)

    def timed(name, block, fwd):
        t_f = median_ms(fwd, reps)
        t_fb = median_ms(lambda: torch.autograd.grad(fwd(), (q, k, v), grad), reps)
        report(part="attention", impl=name, mask=mask_name, block=block, d=d, fwd_ms=t_f, bwd_ms=t_fb - t_f)

    mask_name = "causal(dense)"
    timed("sdpa", 0, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    for block in (128, 64):
        for mask_name in ("causal", "window1024+global256"):
            table = block_mask_table(mask_name, S // block, block)
            # the masks' handle computed once, as BlockSparseAttention keeps it
            handle = mask_set_handle(as_masks(table.numpy()))
            timed("bsjit", block, lambda: bsjit.functional.attention(q, k, v, handle, block, causal=True, order="bhsd"))
            cuda_table = table.cuda()

            def mask_mod(b, h, qi, ki):
                return (qi >= ki) & cuda_table[qi // block, ki // block]

            bm = create_block_mask(mask_mod, None, None, S, S, device="cuda", BLOCK_SIZE=max(block, 128))
            torch._dynamo.reset()
            flex = torch.compile(flex_attention)
            with contextlib.suppress(Exception):
                timed("flex", block, lambda: flex(q, k, v, block_mask=bm))


def host_part(calls=400):
    """Host microseconds per call, back to back on a tiny problem (the GPU waits on the host): the op
    (bsjit.functional.matmul, nothing requiring grad) against torch.mm, as BENCH.md's target reads,
    and the layer with its weight requiring grad (autograd records the call) against nn.Linear."""
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    layer = bsjit.nn.BlockSparseLinear(balanced_mask(16, 16, 0.25, 3), 64, bias=False, device="cuda",
                                       dtype=torch.bfloat16)
    blocks = layer.weight.detach().clone()
    dense = torch.nn.Linear(1024, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    bsjit.warmup(layer)
    handle = layer._handle
    for name, fn in (("bsjit matmul", lambda: bsjit.functional.matmul(x, blocks, handle)),
                     ("torch.mm", lambda: torch.mm(x, w)),
                     ("BlockSparseLinear, weight requiring grad", lambda: layer(x)),
                     ("nn.Linear, weight requiring grad", lambda: dense(x))):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        host_us = (time.perf_counter() - t) * 1e6 / calls
        torch.cuda.synchronize()
        report(part="host", impl=name, host_us=host_us)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["mlp", "attention", "host"], choices=["mlp", "attention", "host"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("suite_t: no CUDA device", file=sys.stderr)
        return 2
    for part in args.parts:
        {"mlp": mlp_part, "attention": attention_part, "host": lambda reps: host_part()}[part](args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
