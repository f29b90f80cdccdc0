#!/usr/bin/env python3
"""Suite A's baselines on the same GPU run as `bsjit-bench --suite A`: dense SDPA (causal, flash
backend) and FlexAttention (compiled) with the block masks bsjit runs: causal, and a causal sliding
window of 1024 keys plus the first 256 keys global, at blocks 128 and 64, element-causal inside
the diagonal blocks, and causal grouped-query attention over 2 key/value heads (enable_gqa). B = 4,
H = 16, S = 8192, bf16, [batch, heads, seq, d]. Forward and forward +
backward times (median ms); one line per case, JSON with --json.

Timed as bsjit-bench times (tools/bench/baselines.hpp): each run after a read of a 256 MiB buffer
on the stream (L2 then holds none of the inputs, and the GPU is busy while the host enqueues the
run), CUDA events around the run alone, the median of --reps runs after 3 warm-ups. Each
FlexAttention configuration gets its own compiled function after a reset of the compiler's caches
(sharing one, the head-dim-64 cases ran past its recompile limit), and the backward is
torch.autograd.grad, so that no gradient accumulates across runs.

The masks follow bsjit::layouts (include/bsjit/attention_layouts.hpp): causal(i, j) = j <= i;
sliding_window(w)(i, j) = 0 <= i - j < w; global_tokens(g)(i, j) = j < g and j <= i.
"""
import argparse
import contextlib
import json
import sys

import torch
import statistics

B, H, S = 4, 16, 8192


def block_mask_table(name, blocks, block):
    i = torch.arange(blocks).view(-1, 1)
    j = torch.arange(blocks).view(1, -1)
    if name == "causal":
        return j <= i
    window, glob = 1024 // block, 256 // block
    return ((i - j >= 0) & (i - j < window)) | ((j < glob) & (j <= i))


def median_ms(fn, reps, flush=None):
    """Median of `reps` CUDA-event timings of fn after 3 warm-up calls; with `flush` (a large
    buffer), each run after a read of it, so that L2 holds none of fn's inputs."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.max()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch.nn.functional as F

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def ms(fn):  # each run after a read of 256 MiB
        return median_ms(fn, args.reps, flush)

    def fwd_bwd(attention):  # forward and backward, no gradient accumulated in q, k, v
        return lambda: torch.autograd.grad(attention(), (q, k, v), grad)

    rows = []

    def report(**kv):
        rows.append(kv)
        print("torch", " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kv.items()), flush=True)

    for d in (128, 64):
        q, k, v = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16)
        # dense causal SDPA: torch's default choice of backend (cuDNN or flash on the H200), and flash
        for backend in (None, SDPBackend.FLASH_ATTENTION):
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                t_f = ms(fwd)
                t_fb = ms(fwd_bwd(fwd))
            report(impl="sdpa" if backend is None else "sdpa-flash", mask="causal(dense)", block=0, d=d, fwd_ms=t_f,
                   bwd_ms=t_fb - t_f)
        for block in (128, 64):
            for name in ("causal", "window1024+global256"):
                table = block_mask_table(name, S // block, block).cuda()

                def mask_mod(b, h, qi, ki):
                    return (qi >= ki) & table[qi // block, ki // block]

                # FlexAttention's compiled kernel takes blocks of 128: at block 64 the same element
                # mask is given over 128-blocks (mask_mod keeps it exact)
                bm = create_block_mask(mask_mod, None, None, S, S, device="cuda", BLOCK_SIZE=max(block, 128))
                torch._dynamo.reset()  # one compiled function per configuration
                flex = torch.compile(flex_attention)
                fwd = lambda: flex(q, k, v, block_mask=bm)
                try:
                    t_f = ms(fwd)
                    t_fb = ms(fwd_bwd(fwd))
                    report(impl="flex", mask=name, block=block, d=d, fwd_ms=t_f, bwd_ms=t_fb - t_f)
                except Exception as e:  # e.g. a block size the compiled kernel does not take
                    print(f"torch flex {name} b{block} d{d} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        # grouped-query attention as bsjit-bench's "causal, 2 kv heads": k and v with 2 heads
        q_all, k_all, v_all = q, k, v
        k, v = (t[:, :2].detach().clone().requires_grad_(True) for t in (k_all, v_all))
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        try:
            t_f = ms(fwd)
            t_fb = ms(fwd_bwd(fwd))
            report(impl="sdpa", mask="causal(dense), 2 kv heads", block=0, d=d, fwd_ms=t_f, bwd_ms=t_fb - t_f)
        except Exception as e:
            print(f"torch sdpa gqa d{d} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        for block in (128, 64):
            table = block_mask_table("causal", S // block, block).cuda()

            def mask_mod(b, h, qi, ki):
                return (qi >= ki) & table[qi // block, ki // block]

            bm = create_block_mask(mask_mod, None, None, S, S, device="cuda", BLOCK_SIZE=max(block, 128))
            torch._dynamo.reset()
            flex = torch.compile(flex_attention)
            fwd = lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)
            try:
                t_f = ms(fwd)
                t_fb = ms(fwd_bwd(fwd))
                report(impl="flex", mask="causal, 2 kv heads", block=block, d=d, fwd_ms=t_f, bwd_ms=t_fb - t_f)
            except Exception as e:
                print(f"torch flex gqa b{block} d{d} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del q, k, v, grad, q_all, k_all, v_all
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
