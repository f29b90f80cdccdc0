"""Kernels ready before they are needed: precompile (no GPU needed: build machines, CI) and warm-up
(load every kernel a model uses into the current GPU at start, so the first step pays nothing)."""

from __future__ import annotations

from typing import Iterable, Union

import torch

from . import _C, _ops
from .layout import Layout

_ALL_OPS = ["forward", "backward_data", "backward_weight"]


def _layers(target) -> list:
    """The BlockSparseLinear layers of a module, or the module itself when it is one."""
    from .nn import BlockSparseLinear

    if isinstance(target, BlockSparseLinear):
        return [target]
    if isinstance(target, torch.nn.Module):
        return [m for m in target.modules() if isinstance(m, BlockSparseLinear)]
    raise TypeError(f"bsjit: expected a torch.nn.Module or a list of (layout, block, dtype), got {type(target)}")


def _objects(target, dtype=None, ops=None) -> list[tuple[_C.MatMul, list[str]]]:
    if isinstance(target, torch.nn.Module):
        out = []
        for layer in _layers(target):
            dt = dtype or layer.weight.dtype
            out.append((_ops.matmul_object(layer._handle, layer.block, dt, layer._axis), ops or _ALL_OPS))
        return out
    out = []
    for item in target:  # (layout, block, dtype[, feature_axis])
        layout, block, dt, *axis = item
        layout = layout if isinstance(layout, Layout) else Layout(layout)
        fa = _ops.FEATURE_AXES.index(axis[0]) if axis else 0
        out.append((_ops.matmul_object(layout.handle, int(block), dt, fa), ops or _ALL_OPS))
    return out


def precompile(target: Union[torch.nn.Module, Iterable[tuple]], arch: str = "sm_90a", *, dtype=None,
               ops: Iterable[str] | None = None, calls: str = "all") -> int:
    """Compiles the kernels of a model's BlockSparseLinear layers (or of (layout, block, dtype[,
    feature_axis]) tuples) for arch into the kernel cache; no GPU needed. Returns how many layers
    had a kernel compiled now (0: the cache held them all)."""
    ops = list(ops) if ops is not None else None
    return sum(bool(mm.precompile(o, arch, calls)) for mm, o in _objects(target, dtype, ops))


def warmup(target: Union[torch.nn.Module, Iterable[tuple]], *, dtype=None, ops: Iterable[str] | None = None,
           calls: str = "all") -> None:
    """Loads the kernels of a model's BlockSparseLinear layers into the current GPU (compiling what the
    cache lacks, unless strict mode forbids it), so the first training or serving step pays nothing."""
    ops = list(ops) if ops is not None else None
    for mm, o in _objects(target, dtype, ops):
        mm.prepare(o, calls)


set_cache_directory = _C.set_cache_directory
cache_directory = _C.cache_directory
set_strict_cache = _C.set_strict_cache
cache_stats = _C.cache_stats
