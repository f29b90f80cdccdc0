"""The decomposed attention ops (bsjit::AttentionOps, openai/blocksparse's BlocksparseTransformer ops) as
torch.ops.bsjit operators with fake implementations and autograd, for models that need the score
matrix itself:

    S = scores(Q, K)     P = softmax(S)     O = probs_v(P, V)

Block-sparse tensors (S, P and their gradients) are [batch, sparse elements]: each head's nonzero
blocks in its mask's row-major order, each block row-major (query, key). Every op takes the mask
set's handle, the block, causal, the tensor order (0 bshd, 1 bhsd), heads and head_dim as ints, so
that the fake implementations know every shape. The ops that read or write K-shaped tensors (scores'
b, probs_v's v, probs_t's output) take kv_group last: query heads per key/value head (grouped-query
attention; those tensors have heads / kv_group heads, and probs_t sums over each group's heads).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C, _direct
from ._attention import ORDERS, _DTYPES, _fail
from ._objects import ObjectCache
from .layout import lookup

_objects = ObjectCache(64)


def ops_object(masks: int, block: int, causal: bool, order: int, head_dim: int, dtype,
               kv_group: int = 1) -> _C.AttentionOps:
    layouts = lookup(masks)
    key = (tuple(m.hash for m in layouts), layouts.element_digest, block, causal, order, head_dim, dtype, kv_group)
    return _objects.get(key, lambda: _C.AttentionOps([m._layout for m in layouts], block, head_dim, _DTYPES[dtype],
                                                     ORDERS[order], causal, element_bits=layouts.element_bits,
                                                     kv_group=kv_group))


def sparse_elements(masks: int, block: int, heads: int) -> int:
    """One batch's elements of a block-sparse tensor: each head's blocks · block²."""
    layouts = lookup(masks)
    if len(layouts) == 1:
        return heads * layouts[0].blocks * block * block
    if len(layouts) != heads:
        _fail(f"{len(layouts)} masks for {heads} heads: give one mask, or one per head")
    return sum(m.blocks for m in layouts) * block * block


def dense_shape(masks: int, block: int, order: int, batch: int, heads: int, head_dim: int, keys: bool,
                kv_group: int = 1) -> list:
    """The shape of a Q-shaped tensor, or (keys) a K-shaped one: heads / kv_group heads."""
    rows, cols = lookup(masks)[0].shape
    seq = (cols if keys else rows) * block
    if keys:
        if kv_group < 1 or heads % kv_group != 0:
            _fail(f"heads = {heads} is not a multiple of kv_group = {kv_group} (query heads per key/value head)")
        heads //= kv_group
    return [batch, seq, heads, head_dim] if order == 0 else [batch, heads, seq, head_dim]


def _check_dense(name, t, masks, block, order, heads, head_dim, keys, kv_group=1) -> int:
    if t.dim() != 4 or t.dtype not in _DTYPES:
        _fail(f"{name} must be a 4-D float16 or bfloat16 tensor, got {t.dtype} {tuple(t.shape)}")
    want = dense_shape(masks, block, order, t.shape[0], heads, head_dim, keys, kv_group)
    if list(t.shape) != want:
        _fail(f"{name} must be {want} ({ORDERS[order]}), got {list(t.shape)}")
    return int(t.shape[0])


def _check_sparse(name, t, masks, block, heads, batch=None) -> int:
    e = sparse_elements(masks, block, heads)
    if t.dim() != 2 or t.shape[1] != e or (batch is not None and t.shape[0] != batch):
        _fail(f"{name} must be a block-sparse tensor [{batch if batch is not None else 'batch'}, {e}], "
              f"got {tuple(t.shape)}")
    return int(t.shape[0])


def _run(op, x, y, out, masks, block, causal, order, heads, head_dim, batch, scale=0.0, key_padding=None,
         kv_group=1):
    if out.device.type != "cuda":
        _fail(f"bsjit runs on CUDA tensors; these are on {out.device}")
    obj = ops_object(masks, block, causal, order, head_dim, out.dtype, kv_group)
    with _direct.on_device(out.device):
        obj.run(op, x.contiguous().data_ptr(), y.contiguous().data_ptr() if y is not None else 0, out.data_ptr(),
                batch, heads, _direct.stream(out.device), scale,
                key_padding.data_ptr() if key_padding is not None else 0)
    return out


# --- scores: S = A · Bᵀ on the mask's blocks (A like Q, B like K) ---------------------------------


@torch.library.custom_op("bsjit::attention_scores", mutates_args=())
def scores(a: Tensor, b: Tensor, masks: int, block: int, causal: bool, order: int, heads: int,
           head_dim: int, kv_group: int = 1) -> Tensor:
    n = _scores_check(a, b, masks, block, order, heads, head_dim, kv_group)
    out = a.new_empty(n, sparse_elements(masks, block, heads))
    return _run("scores", a, b, out, masks, block, causal, order, heads, head_dim, n, kv_group=kv_group)


def _scores_check(a, b, masks, block, order, heads, head_dim, kv_group):
    n = _check_dense("a", a, masks, block, order, heads, head_dim, False)
    if _check_dense("b", b, masks, block, order, heads, head_dim, True, kv_group) != n or b.dtype != a.dtype:
        _fail(f"b {b.dtype} {tuple(b.shape)} does not match a {a.dtype} {tuple(a.shape)}")
    return n


@scores.register_fake
def _(a, b, masks, block, causal, order, heads, head_dim, kv_group=1):
    n = _scores_check(a, b, masks, block, order, heads, head_dim, kv_group)
    return a.new_empty(n, sparse_elements(masks, block, heads))


# --- softmax: P = softmax(scale · S) over each query row's blocks, masked --------------------------


@torch.library.custom_op("bsjit::attention_softmax", mutates_args=())
def softmax(s: Tensor, masks: int, block: int, causal: bool, order: int, heads: int, head_dim: int, scale: float,
            key_padding: Optional[Tensor]) -> Tensor:
    n = _check_sparse("s", s, masks, block, heads)
    return _run("softmax", s, None, torch.empty_like(s), masks, block, causal, order, heads, head_dim, n, scale,
                key_padding)


@softmax.register_fake
def _(s, masks, block, causal, order, heads, head_dim, scale, key_padding):
    _check_sparse("s", s, masks, block, heads)
    return torch.empty_like(s)


@torch.library.custom_op("bsjit::attention_softmax_grad", mutates_args=())
def softmax_grad(p: Tensor, dp: Tensor, masks: int, block: int, causal: bool, order: int, heads: int, head_dim: int,
                 scale: float) -> Tensor:
    n = _check_sparse("p", p, masks, block, heads)
    _check_sparse("dp", dp, masks, block, heads, n)
    return _run("softmax_grad", p, dp, torch.empty_like(p), masks, block, causal, order, heads, head_dim, n, scale)


@softmax_grad.register_fake
def _(p, dp, masks, block, causal, order, heads, head_dim, scale):
    n = _check_sparse("p", p, masks, block, heads)
    _check_sparse("dp", dp, masks, block, heads, n)
    return torch.empty_like(p)


# --- probs_v: O = P · V (O like Q); probs_t: O = Pᵀ · X (X like Q, O like K) -------------------------


def _product_check(p, x, masks, block, order, heads, head_dim, x_keys, kv_group):
    n = _check_sparse("p", p, masks, block, heads)
    if _check_dense("x", x, masks, block, order, heads, head_dim, x_keys, kv_group) != n or x.dtype != p.dtype:
        _fail(f"x {x.dtype} {tuple(x.shape)} does not match p {p.dtype} {tuple(p.shape)}")
    return n


@torch.library.custom_op("bsjit::attention_probs_v", mutates_args=())
def probs_v(p: Tensor, v: Tensor, masks: int, block: int, causal: bool, order: int, heads: int,
            head_dim: int, kv_group: int = 1) -> Tensor:
    n = _product_check(p, v, masks, block, order, heads, head_dim, True, kv_group)
    out = v.new_empty(dense_shape(masks, block, order, n, heads, head_dim, False))
    return _run("probs_v", p, v, out, masks, block, causal, order, heads, head_dim, n, kv_group=kv_group)


@probs_v.register_fake
def _(p, v, masks, block, causal, order, heads, head_dim, kv_group=1):
    n = _product_check(p, v, masks, block, order, heads, head_dim, True, kv_group)
    return v.new_empty(dense_shape(masks, block, order, n, heads, head_dim, False))


@torch.library.custom_op("bsjit::attention_probs_t", mutates_args=())
def probs_t(p: Tensor, x: Tensor, masks: int, block: int, causal: bool, order: int, heads: int,
            head_dim: int, kv_group: int = 1) -> Tensor:
    n = _product_check(p, x, masks, block, order, heads, head_dim, False, 1)
    out = x.new_empty(dense_shape(masks, block, order, n, heads, head_dim, True, kv_group))
    return _run("probs_t", p, x, out, masks, block, causal, order, heads, head_dim, n, kv_group=kv_group)


@probs_t.register_fake
def _(p, x, masks, block, causal, order, heads, head_dim, kv_group=1):
    n = _product_check(p, x, masks, block, order, heads, head_dim, False, 1)
    return x.new_empty(dense_shape(masks, block, order, n, heads, head_dim, True, kv_group))


# --- autograd -------------------------------------------------------------------------------------
# S = A·Bᵀ: dA = dS·B (probs_v), dB = dSᵀ·A (probs_t). P = softmax(S): dS = softmax_grad(P, dP).
# O = P·V: dP = dO·Vᵀ (scores), dV = Pᵀ·dO (probs_t). O = Pᵀ·X: dP = X·dOᵀ (scores), dX = P·dO (probs_v).


def _setup_pair(ctx, inputs, output):
    x, y, *config = inputs
    ctx.save_for_backward(x, y)
    ctx.config = config


def _scores_backward(ctx, ds):
    a, b = ctx.saved_tensors
    return (probs_v(ds, b, *ctx.config), probs_t(ds, a, *ctx.config), *([None] * len(ctx.config)))


def _probs_v_backward(ctx, dout):
    p, v = ctx.saved_tensors
    return (scores(dout.contiguous(), v, *ctx.config), probs_t(p, dout.contiguous(), *ctx.config),
            *([None] * len(ctx.config)))


def _probs_t_backward(ctx, dout):
    p, x = ctx.saved_tensors
    return (scores(x, dout.contiguous(), *ctx.config), probs_v(p, dout.contiguous(), *ctx.config),
            *([None] * len(ctx.config)))


def _setup_softmax(ctx, inputs, output):
    s, masks, block, causal, order, heads, head_dim, scale, key_padding = inputs
    ctx.save_for_backward(output)
    ctx.config = (masks, block, causal, order, heads, head_dim, scale)


def _softmax_backward(ctx, dp):
    (p,) = ctx.saved_tensors
    return (softmax_grad(p, dp.contiguous(), *ctx.config), *([None] * 8))


torch.library.register_autograd("bsjit::attention_scores", _scores_backward, setup_context=_setup_pair)
torch.library.register_autograd("bsjit::attention_probs_v", _probs_v_backward, setup_context=_setup_pair)
torch.library.register_autograd("bsjit::attention_probs_t", _probs_t_backward, setup_context=_setup_pair)
torch.library.register_autograd("bsjit::attention_softmax", _softmax_backward, setup_context=_setup_softmax)
