#!/usr/bin/env python3
"""A block-sparse layer trained with DistributedDataParallel or FSDP2 (fully_shard), one process per
GPU. The weight of a BlockSparseLinear is an ordinary dense parameter ([blocks, b, b]), so both wrap
it as any other; every rank builds the same layout from the same seed. Needs GPUs and bsjit.

    torchrun --nproc-per-node 2 examples/python/ddp_train.py [--fsdp] [--steps 50]
"""

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist

import bsjit
from bsjit.nn import BlockSparseLinear


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 (torch.distributed.fsdp.fully_shard) instead of DDP")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--features", type=int, default=2048)
    ap.add_argument("--block", type=int, default=64)
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    side = a.features // a.block
    layout = bsjit.Layout(np.random.default_rng(0).random((side, side)) < 0.25)  # the same on every rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        BlockSparseLinear(layout, a.block, device="cuda", dtype=torch.bfloat16),
        torch.nn.GELU(),
        BlockSparseLinear(layout.transposed(), a.block, device="cuda", dtype=torch.bfloat16),
    )
    if a.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, BlockSparseLinear):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    target = torch.nn.Linear(a.features, a.features, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    torch.manual_seed(1 + rank)  # each rank its own data
    for step in range(a.steps + 1):
        x = torch.randn(2048, a.features, device="cuda", dtype=torch.bfloat16)
        loss = torch.nn.functional.mse_loss(model(x).float(), target(x).float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:4d}  loss {loss.item():.5f}  ({'FSDP2' if a.fsdp else 'DDP'}, {world} ranks)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
