"""The torch.ops.bsjit attention operators: bsjit's fused block-sparse attention (flash-style forward
with the log-sum-exp, and its backward), registered with torch.library with fake implementations
and autograd, launched on torch's current stream with every output and the backward's workspace
from torch's allocator.

A mask set (one block mask shared by every head, or one per head) reaches the ops as an int handle
(bsjit.layout.mask_set_handle).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C, _direct
from ._objects import ObjectCache
from .layout import lookup

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
ORDERS = ("bshd", "bhsd")  # order 0: q is [batch, seq, heads, head_dim]; 1: [batch, heads, seq, head_dim]

_objects = ObjectCache(64)


def attention_object(masks: int, block: int, head_dim: int, dtype: torch.dtype, order: int, causal: bool,
                     kv_group: int = 1) -> _C.Attention:
    layouts = lookup(masks)
    key = (tuple(m.hash for m in layouts), block, head_dim, dtype, order, causal, kv_group)
    return _objects.get(key, lambda: _C.Attention([m._layout for m in layouts], block, head_dim, _DTYPES[dtype],
                                                  ORDERS[order], causal, kv_group=kv_group))


def _fail(message: str):
    raise ValueError(f"bsjit.attention: {message}")


def _dims(q: Tensor, order: int) -> tuple[int, int, int, int]:
    """(batch, heads, seq, head_dim) of a q-shaped tensor."""
    if q.dim() != 4:
        _fail(f"q, k and v must be 4-D ([batch, seq, heads, d] or [batch, heads, seq, d]), got {tuple(q.shape)}")
    b, x, y, d = q.shape
    return (b, y, x, d) if order == 0 else (b, x, y, d)


def _check(q, k, v, masks: int, block: int, order: int, key_padding) -> tuple[int, int, int, int, int]:
    """(batch, heads, seq_q, head_dim, query heads per key/value head) of a valid call."""
    if order not in (0, 1):
        _fail(f"order must be 0 (bshd) or 1 (bhsd), got {order}")
    if q.dtype not in _DTYPES:
        _fail(f"dtype {q.dtype} is not supported; expected float16 or bfloat16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            _fail(f"{name} is {t.dtype} on {t.device}; q is {q.dtype} on {q.device}")
        if t.shape != k.shape:
            _fail(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    b, h, sq, d = _dims(q, order)
    kb, kh, sk, kd = _dims(k, order)
    if (kb, kd) != (b, d) or kh < 1 or h % kh != 0:
        _fail(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head dim, or its heads do not "
              f"divide q's (grouped-query attention: k and v with heads / group heads)")
    if d not in (32, 64, 128):
        _fail(f"head dim {d} is not supported; expected 32, 64 or 128")
    layouts = lookup(masks)
    if layouts.element_bits:
        _fail("element masks are applied by the decomposed ops (bsjit.nn.DecomposedAttention); the fused "
              "attention takes block masks, causal and key padding")
    rows, cols = layouts[0].shape
    if (sq, sk) != (rows * block, cols * block):
        _fail(f"the masks are {rows} × {cols} blocks of {block}: q and k need {rows * block} and {cols * block} "
              f"positions, not {sq} and {sk}")
    if len(layouts) not in (1, h):
        _fail(f"{len(layouts)} masks for {h} heads: give one mask, or one per head")
    if key_padding is not None and (key_padding.dtype != torch.uint8 or tuple(key_padding.shape) != (b, sk)):
        _fail(f"key padding must be uint8 [{b}, {sk}], got {key_padding.dtype} {tuple(key_padding.shape)}")
    return b, h, sq, d, h // kh


def _attention(q: Tensor, k: Tensor, v: Tensor, masks: int, block: int, causal: bool, order: int, scale: float,
               key_padding: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    b, h, sq, d, group = _check(q, k, v, masks, block, order, key_padding)
    if q.device.type != "cuda":
        _fail(f"bsjit runs on CUDA tensors; these are on {q.device}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(b, h, sq, dtype=torch.float32, device=q.device)
    obj = attention_object(masks, block, d, q.dtype, order, causal, group)
    with _direct.on_device(q.device):
        obj.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), b, h,
                    _direct.stream(q.device), scale, key_padding.data_ptr() if key_padding is not None else 0)
    return out, lse


attention = torch.library.custom_op("bsjit::attention", _attention, mutates_args=())


@attention.register_fake
def _(q, k, v, masks, block, causal, order, scale, key_padding):
    b, h, sq, d, _ = _check(q, k, v, masks, block, order, key_padding)
    return torch.empty_like(q), q.new_empty((b, h, sq), dtype=torch.float32)


def _attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, masks: int,
                        block: int, causal: bool, order: int, scale: float,
                        key_padding: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    b, h, sq, d, group = _check(q, k, v, masks, block, order, key_padding)
    if dout.shape != q.shape or dout.dtype != q.dtype:
        _fail(f"dout must be shaped and typed like q, got {dout.dtype} {tuple(dout.shape)}")
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    obj = attention_object(masks, block, d, q.dtype, order, causal, group)
    workspace = torch.empty(obj.backward_workspace_size(b, h), dtype=torch.uint8, device=q.device)
    with _direct.on_device(q.device):
        obj.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.contiguous().data_ptr(),
                     dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), b, h, _direct.stream(q.device),
                     scale, key_padding.data_ptr() if key_padding is not None else 0, workspace.data_ptr(),
                     workspace.numel())
    return dq, dk, dv


attention_backward = torch.library.custom_op("bsjit::attention_backward", _attention_backward, mutates_args=())


@attention_backward.register_fake
def _(q, k, v, out, lse, dout, masks, block, causal, order, scale, key_padding):
    _check(q, k, v, masks, block, order, key_padding)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, masks, block, causal, order, scale, key_padding = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)  # the log-sum-exp is returned for inspection, not trained through
    ctx.save_for_backward(q, k, v, out, lse, key_padding)
    ctx.args = (masks, block, causal, order, scale)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, key_padding = ctx.saved_tensors
    masks, block, causal, order, scale = ctx.args
    backward = _attention_backward if getattr(ctx, "direct", False) else attention_backward
    dq, dk, dv = backward(q, k, v, out, lse, dout.contiguous(), masks, block, causal, order, scale, key_padding)
    return dq, dk, dv, None, None, None, None, None, None


torch.library.register_autograd("bsjit::attention", _backward, setup_context=_setup)

_AttentionFunction = _direct.function("_AttentionFunction", _attention, _setup, _backward)


def attention_call(q: Tensor, k: Tensor, v: Tensor, masks: int, block: int, causal: bool, order: int, scale: float,
                   key_padding: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """bsjit::attention, run directly in eager mode on CUDA tensors (bsjit._direct) and as the op otherwise."""
    if _direct.eager(q, k, v, key_padding):
        if not _direct.records(q, k, v):
            return _attention(q, k, v, masks, block, causal, order, scale, key_padding)
        return _AttentionFunction.apply(q, k, v, masks, block, causal, order, scale, key_padding)
    return attention(q, k, v, masks, block, causal, order, scale, key_padding)
