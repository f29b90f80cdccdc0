"""bsjit for PyTorch: block-sparse matmul with kernels generated per layout and compiled at run time.

    import bsjit
    layout = bsjit.Layout(mask)                          # [in/b, out/b] bool mask
    layer = bsjit.nn.BlockSparseLinear(layout, block=32, dtype=torch.bfloat16, device="cuda")
    y = layer(x)                                         # x [..., in]; autograd, torch.compile
    y = bsjit.functional.matmul(x, w, layout)            # w [blocks, 32, 32]
    o = bsjit.functional.attention(q, k, v, mask, 64, causal=True)   # block-sparse attention
    conv = bsjit.nn.BlockSparseConv2d(mask, 3, padding=1, block=32)  # channel-block-sparse conv

The C++ library (bsjit._C) does the work: kernels compile with NVRTC at first use and are cached in
memory and on disk (BSJIT_CACHE_DIR, default ~/.cache/bsjit), so a later process loads them.
"""

from __future__ import annotations

from . import _C, _attention, _attention_ops, _conv, _ops, functional, nn
from ._C import Error
from .layout import ConvLayout, Layout
from .deploy import cache_directory, cache_stats, precompile, set_cache_directory, set_strict_cache, warmup

__all__ = ["Error", "Layout", "ConvLayout", "functional", "nn", "precompile", "warmup", "cache_stats",
           "cache_directory", "set_cache_directory", "set_strict_cache"]
__version__ = "0.1.0"
