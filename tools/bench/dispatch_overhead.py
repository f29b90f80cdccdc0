#!/usr/bin/env python3
"""What a call through PyTorch costs on the host: microseconds per call of bsjit's ops on a problem so
small that the GPU waits on the host (N rows, C = K features, block b, bf16), next to torch's dense
equivalent and to the extension's MatMul.run called directly (the floor under the torch.ops layer),
eager and as a CUDA graph replay. Needs a GPU and the bsjit package.

    python3 tools/bench/dispatch_overhead.py [--n 64] [--features 1024] [--block 64] [--calls 400]
"""

import argparse
import time

import numpy as np
import torch

import bsjit
from bsjit import _ops
from bsjit.nn import BlockSparseLinear


def per_call_us(fn, calls):
    """Host microseconds per call over `calls` calls (a synchronize before and after; the launch
    queue, about a thousand entries, is not filled at these counts), and the GPU's own time per call
    from events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    host = (time.perf_counter() - t) * 1e6 / calls
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) * 1e3 / calls


def graphed(fn):
    """fn captured once into a CUDA graph; the returned callable replays it."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--calls", type=int, default=400)
    a = ap.parse_args()
    dt, b, f = torch.bfloat16, a.block, a.features
    mask = np.random.default_rng(0).random((f // b, f // b)) < a.density
    layer = BlockSparseLinear(mask, b, bias=False, device="cuda", dtype=dt)
    dense = torch.nn.Linear(f, f, bias=False, device="cuda", dtype=dt)
    x = torch.randn(a.n, f, device="cuda", dtype=dt)
    xg = x.clone().requires_grad_(True)
    w = layer.weight.detach()
    out = torch.empty(a.n, f, device="cuda", dtype=dt)
    mm = _ops.matmul_object(layer._handle, b, dt, 0)
    stream = torch.cuda.current_stream().cuda_stream

    def direct():
        mm.run("forward", x.data_ptr(), w.data_ptr(), out.data_ptr(), a.n, stream, False, 0, 0, 0)

    def op():
        with torch.no_grad():
            layer(x)

    def dense_op():
        with torch.no_grad():
            dense(x)

    cases = [
        ("MatMul.run (extension, no torch)", direct),
        ("torch.ops.bsjit.matmul via BlockSparseLinear", op),
        ("torch nn.Linear, dense", dense_op),
        ("BlockSparseLinear forward + backward", lambda: layer(xg).sum().backward()),
        ("nn.Linear forward + backward, dense", lambda: dense(xg).sum().backward()),
    ]
    print(f"{torch.cuda.get_device_name()}, bf16, N = {a.n}, C = K = {f}, block {b}, d = {a.density}, "
          f"{layer.layout.blocks} blocks; {a.calls} calls each; bsjit {bsjit.__version__}")
    print(f"{'call':48s} | host us/call | GPU us/call")
    for name, fn in cases:
        host, gpu = per_call_us(fn, a.calls)
        print(f"{name:48s} | {host:12.1f} | {gpu:11.1f}")
    for name, fn in (("graph replay: BlockSparseLinear forward", op), ("graph replay: nn.Linear forward", dense_op)):
        host, gpu = per_call_us(graphed(fn), a.calls)
        print(f"{name:48s} | {host:12.1f} | {gpu:11.1f}")


if __name__ == "__main__":
    main()
