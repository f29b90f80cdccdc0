"""Kernels ready before they are needed: precompile (no GPU needed: build machines, CI) and warm-up
(load every kernel a model uses into the current GPU at start, so the first step pays nothing)."""

from __future__ import annotations

from typing import Iterable, Union

import torch

from . import _C, _ops
from .layout import Layout

_ALL_OPS = ["forward", "backward_data", "backward_weight"]
_ATTENTION_DTYPES = (torch.float16, torch.bfloat16)


def _attention_dtype(model: torch.nn.Module, dtype, name: str):
    """The dtype of an attention module's kernels: dtype when given, else the one 16-bit dtype of the
    model's floating parameters; an error when neither decides it."""
    if dtype is not None:
        if dtype not in _ATTENTION_DTYPES:
            raise ValueError(f"bsjit: attention runs in float16 or bfloat16, not {dtype} ({name})")
        return dtype
    found = {p.dtype for p in model.parameters() if p.dtype.is_floating_point}
    if len(found) == 1 and next(iter(found)) in _ATTENTION_DTYPES:
        return next(iter(found))
    raise ValueError(f"bsjit: the dtype of attention module '{name}' is not known from the model's parameters "
                     f"({sorted(map(str, found)) or 'none'}); pass dtype=torch.bfloat16 or torch.float16")


def _module_objects(model: torch.nn.Module, dtype, ops, head_dim, sms, kv_group=1) -> list:
    """(kernel object, ops) of every bsjit module in model: BlockSparseLinear's MatMul with the ops
    asked (all three by default), BlockSparseAttention's Attention (forward and backward; head_dim
    and the query heads per key/value head from the arguments), DecomposedAttention's AttentionOps
    (its five kernels; with a key/value group also the grouped scores and products) and the
    BlockSparseConv modules' Conv (fprop, bprop and updat, channels first and last: the kernels
    depend on the layout, kernel size, dtype and storage, not on the image size)."""
    from . import _attention, _attention_ops, _conv, functional
    from .nn import BlockSparseAttention, BlockSparseLinear, DecomposedAttention, _BlockSparseConvNd

    out = []
    for name, m in model.named_modules():
        name = name or type(m).__name__
        if isinstance(m, BlockSparseLinear):
            out.append((_ops.matmul_object(m._handle, m.block, dtype or m.weight.dtype, m._axis, sms), ops or _ALL_OPS))
        elif isinstance(m, BlockSparseAttention):
            if head_dim is None:
                raise ValueError(f"bsjit: attention module '{name}' takes its head dim from q at run time; pass "
                                 f"head_dim= to compile its kernels ahead")
            dt = _attention_dtype(model, dtype, name)
            out.append((_attention.attention_object(m._handle, m.block, int(head_dim), dt,
                                                    _attention.ORDERS.index(m.order), m.causal, kv_group), None))
        elif isinstance(m, DecomposedAttention):
            dt = _attention_dtype(model, dtype, name)
            for group in sorted({1, kv_group}):  # softmax's kernels are the ungrouped object's
                out.append((_attention_ops.ops_object(m._handle, m.block, m.causal, m._order, m.head_dim, dt, group),
                            None))
        elif isinstance(m, _BlockSparseConvNd):
            geometry = functional.conv_geometry(m.kernel_size, m.kernel_size)
            for channels_last in (False, True):
                conv = _conv.conv_object(m._handle, geometry, dtype or m.weight.dtype, channels_last, False)
                out.append((conv, None))
    return out


def _objects(target, dtype=None, ops=None, head_dim=None, sms=0, kv_group=1) -> list:
    if int(kv_group) < 1:
        raise ValueError(f"bsjit: kv_group = {kv_group}: the query heads per key/value head, 1 or more")
    if isinstance(target, torch.nn.Module):
        return _module_objects(target, dtype, ops, head_dim, sms, int(kv_group))
    if isinstance(target, (str, bytes)) or not hasattr(target, "__iter__"):
        raise TypeError(f"bsjit: expected a torch.nn.Module or a list of (layout, block, dtype), got {type(target)}")
    out = []
    for item in target:  # (layout, block, dtype[, feature_axis])
        layout, block, dt, *axis = item
        layout = layout if isinstance(layout, Layout) else Layout(layout)
        fa = _ops.FEATURE_AXES.index(axis[0]) if axis else 0
        out.append((_ops.matmul_object(layout.handle, int(block), dt, fa, sms), ops or _ALL_OPS))
    return out


def precompile(target: Union[torch.nn.Module, Iterable[tuple]], arch: str = "sm_90a", *, dtype=None,
               ops: Iterable[str] | None = None, calls: str = "all", head_dim: int | None = None,
               sms: int = 0, kv_group: int = 1) -> int:
    """Compiles the kernels of a model's bsjit modules (BlockSparseLinear, BlockSparseAttention,
    DecomposedAttention, BlockSparseConv1d/2d/3d), or of (layout, block, dtype[, feature_axis])
    tuples, for arch into the kernel cache; no GPU needed. ops and calls choose BlockSparseLinear's
    products and call kinds; head_dim is BlockSparseAttention's (it is read from q at run time), and
    kv_group the attention modules' query heads per key/value head (read from k at run time);
    dtype defaults to each layer's weight and, for attention, to the model's one 16-bit parameter
    dtype. sms plans the Hopper matmul kernels for GPUs of that many SMs (default 132, H100 / H200
    SXM; 114: H100 PCIe). Returns how many kernel objects had a kernel compiled now (0: the cache
    held them all)."""
    ops = list(ops) if ops is not None else None
    done = 0
    for obj, o in _objects(target, dtype, ops, head_dim, sms, kv_group):
        done += bool(obj.precompile(o, arch, calls) if o is not None else obj.precompile(arch))
    return done


def warmup(target: Union[torch.nn.Module, Iterable[tuple]], *, dtype=None, ops: Iterable[str] | None = None,
           calls: str = "all", head_dim: int | None = None, kv_group: int = 1) -> None:
    """Loads the kernels of a model's bsjit modules (as precompile chooses them) into the current GPU,
    compiling what the cache lacks unless strict mode forbids it, so the first training or serving
    step pays nothing."""
    ops = list(ops) if ops is not None else None
    for obj, o in _objects(target, dtype, ops, head_dim, kv_group=kv_group):
        obj.prepare(o, calls) if o is not None else obj.load()


set_cache_directory = _C.set_cache_directory
cache_directory = _C.cache_directory
set_strict_cache = _C.set_strict_cache
cache_stats = _C.cache_stats
