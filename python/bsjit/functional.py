"""Functional forms of bsjit's ops: the torch.ops.bsjit operators with the layout's sizes filled in."""

from __future__ import annotations

from typing import Optional, Union

from torch import Tensor

from . import _ops
from .layout import Layout, lookup

LayoutLike = Union[Layout, int]


def _sizes(layout: LayoutLike, block: int) -> tuple[int, int, int]:
    """(handle, in features, out features) of a layout, or of a registry handle."""
    if isinstance(layout, Layout):
        return layout.handle, layout.rows * block, layout.cols * block
    l = lookup(layout)
    return int(layout), l.rows * block, l.cols * block


def _axis(feature_axis: str) -> int:
    if feature_axis not in _ops.FEATURE_AXES:
        raise ValueError(f"bsjit: feature_axis must be 'last' or 'first', not {feature_axis!r}")
    return _ops.FEATURE_AXES.index(feature_axis)


def matmul(x: Tensor, w: Tensor, layout: LayoutLike, *, feature_axis: str = "last",
           gate: Optional[Tensor] = None) -> Tensor:
    """y = x · W, W the layout's nonzero blocks w [blocks, b, b] (each scaled by gate[i] when a
    float32 gate [blocks] is given; its gradient is computed when it requires grad).
    x: [..., C] with feature_axis "last" (C = layout.rows · b), or [C, N] with "first". Differentiable
    in x, w and gate."""
    h, c, k = _sizes(layout, int(w.shape[-1]))
    return _ops.matmul(x, w, h, c, k, _axis(feature_axis), gate)


def matmul_backward_data(dy: Tensor, w: Tensor, layout: LayoutLike, *, feature_axis: str = "last",
                         gate: Optional[Tensor] = None) -> Tensor:
    """dx = dy · Wᵀ."""
    h, c, k = _sizes(layout, int(w.shape[-1]))
    return _ops.matmul_backward_data(dy, w, h, c, k, _axis(feature_axis), gate)


def matmul_backward_weight(x: Tensor, dy: Tensor, w: Tensor, layout: LayoutLike, *, feature_axis: str = "last",
                           gate: Optional[Tensor] = None) -> Tensor:
    """dW = xᵀ · dy on the layout's blocks only ([blocks, b, b], w's shape and dtype)."""
    h, c, k = _sizes(layout, int(w.shape[-1]))
    return _ops.matmul_backward_weight(x, dy, w, h, c, k, _axis(feature_axis), gate)
