"""Functional forms of bsjit's ops: the torch.ops.bsjit operators with the layout's sizes filled in."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from . import _attention, _ops
from .layout import Layout, as_masks, lookup, mask_set_handle

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
    in x, w and gate. Inside torch.compile, give a Layout whose `handle` was read outside (registering
    it takes a lock, which is not traced), or the handle itself; BlockSparseLinear does."""
    h, c, k = _sizes(layout, int(w.shape[-1]))
    return _ops.matmul_call(x, w, h, c, k, _axis(feature_axis), gate)


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


def attention(q: Tensor, k: Tensor, v: Tensor, mask, block: int, *, causal: bool = False,
              key_padding_mask: Optional[Tensor] = None, scale: Optional[float] = None, return_lse: bool = False,
              order: str = "bshd"):
    """softmax(scale · q·kᵀ + mask) · v over the key blocks the block mask gives each query block
    (fused: no score matrix in memory). q, k, v: fp16 or bf16, [batch, seq, heads, d] ("bshd") or
    [batch, heads, seq, d] ("bhsd"), d 32, 64 or 128. mask: [seq_q / block, seq_k / block] for every
    head, or one per head (a list of them, or a 3-D [heads, q blocks, k blocks] array as
    openai/blocksparse took it); causal also masks the keys after each query inside the diagonal
    blocks; inside torch.compile pass the masks' handle (bsjit.layout.mask_set_handle, computed
    outside; BlockSparseAttention does). key_padding_mask: [batch, seq_k] bool, True where a key is padding (PyTorch's
    convention). scale: default 1 / sqrt(d). Differentiable in q, k and v; with return_lse also the
    log-sum-exp [batch, heads, seq_q] (fp32, natural log; not differentiable)."""
    if order not in _attention.ORDERS:
        raise ValueError(f"bsjit: order must be 'bshd' or 'bhsd', not {order!r}")
    handle = mask if isinstance(mask, int) else mask_set_handle(as_masks(mask))
    padding = None
    if key_padding_mask is not None:
        padding = (~key_padding_mask.bool()).to(torch.uint8).contiguous()
    out, lse = _attention.attention_call(q, k, v, handle, int(block), bool(causal), _attention.ORDERS.index(order),
                                    float(scale) if scale is not None else 0.0, padding)
    return (out, lse) if return_lse else out
