"""Functional forms of bsjit's ops: the torch.ops.bsjit operators with the layout's sizes filled in."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from . import _C, _attention, _conv, _direct, _ops
from .layout import ConvLayout, Layout, as_masks, lookup, mask_set_handle

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


def matmul_autotune(x: Tensor, w: Tensor, layout: LayoutLike, *, feature_axis: str = "last",
                    ops=("forward", "backward_data", "backward_weight")) -> dict:
    """Times every tile shape each op of matmul(x, w, layout) can run with on x's GPU at x's rows
    (scratch operands of the call's sizes) and keeps the fastest for the layout, block, dtype and
    feature axis at that batch class (N ≤ 128, or above): later calls, and later processes sharing
    the kernel cache, run it (bsjit::MatMul::autotune). Returns {op: (shape kept, [(shape, ms), ...])};
    an op whose kernel has one shape (fp32, features first, block 8) reports that one. x must be a
    CUDA tensor of w's dtype; the gated kernel takes the same choice."""
    if x.device.type != "cuda":
        raise ValueError(f"bsjit.matmul_autotune: x must be a CUDA tensor (it is on {x.device})")
    h, c, k = _sizes(layout, _ops._check_weight("matmul_autotune", w))
    axis = _axis(feature_axis)
    n = _ops._check_activation("matmul_autotune", "x", x, c, axis, w)
    if n <= 0:
        raise ValueError(f"bsjit.matmul_autotune: x has no rows (shape {tuple(x.shape)})")
    obj = _ops.matmul_object(h, int(w.shape[1]), w.dtype, axis)
    with _direct.on_device(x.device):
        stream = _direct.stream(x.device)
        return {op: obj.autotune(op, n, stream) for op in ops}


def attention(q: Tensor, k: Tensor, v: Tensor, mask, block: int, *, causal: bool = False,
              key_padding_mask: Optional[Tensor] = None, scale: Optional[float] = None, return_lse: bool = False,
              order: str = "bshd"):
    """softmax(scale · q·kᵀ + mask) · v over the key blocks the block mask gives each query block
    (fused: no score matrix in memory). q, k, v: fp16 or bf16, [batch, seq, heads, d] ("bshd") or
    [batch, heads, seq, d] ("bhsd"), d 32, 64 or 128; k and v may have fewer heads than q, a divisor
    of its count (grouped-query attention: query head h attends key/value head h // (heads / kv heads);
    one key/value head is multi-query attention), and their gradients are summed over each group. mask: [seq_q / block, seq_k / block] for every
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


def _per_dim(value, dims: int, name: str) -> list[int]:
    """An int or a tuple of `dims` ints as the D, H, W list (leading dimensions 1)."""
    v = [int(value)] * dims if isinstance(value, int) else [int(x) for x in value]
    if len(v) != dims:
        raise ValueError(f"bsjit.conv: {name} must be an int or {dims} ints, got {value!r}")
    return [1] * (3 - dims) + v


def conv_geometry(spatial, kernel, stride=1, padding=0, dilation=1) -> list[int]:
    """The 18 ints of a convolution over spatial (1 to 3 sizes): padding an int or a tuple (the same
    before and after), a tuple of (before, after) pairs, "valid" (none) or "same" (TensorFlow's:
    the output ceil(in / stride), the odd pad after)."""
    dims = len(spatial)
    if not 1 <= dims <= 3:
        raise ValueError(f"bsjit.conv: 1 to 3 spatial dimensions, got {dims}")
    size = [1] * (3 - dims) + [int(x) for x in spatial]
    k, st, dil = _per_dim(kernel, dims, "kernel_size"), _per_dim(stride, dims, "stride"), _per_dim(dilation, dims,
                                                                                                    "dilation")
    if padding == "valid":
        before = after = [0, 0, 0]
    elif padding == "same":
        total = [max((-(-size[i] // st[i]) - 1) * st[i] + dil[i] * (k[i] - 1) + 1 - size[i], 0) for i in range(3)]
        before, after = [t // 2 for t in total], [t - t // 2 for t in total]
    elif isinstance(padding, int) or all(isinstance(p, int) for p in padding):
        before = after = [0] * (3 - dims) + _per_dim(padding, dims, "padding")[3 - dims:]
    else:
        pairs = [tuple(p) for p in padding]
        if len(pairs) != dims or any(len(p) != 2 for p in pairs):
            raise ValueError(f"bsjit.conv: padding as pairs must give (before, after) for each of {dims} dimensions")
        before = [0] * (3 - dims) + [int(p[0]) for p in pairs]
        after = [0] * (3 - dims) + [int(p[1]) for p in pairs]
    return size + k + st + dil + list(before) + list(after)


def _is_channels_last(x: Tensor) -> bool:
    """Whether x [N, C, *spatial] is stored channels last (and not also channels first)."""
    return not x.is_contiguous() and x.movedim(1, -1).is_contiguous()


def _conv_setup(x: Tensor, filter: Tensor, layout, kernel_size, stride, padding, dilation, deconv: bool,
                output_size):
    """conv's layout, its handle and the geometry (conv_geometry's ints) of x's convolution."""
    cl = layout if isinstance(layout, ConvLayout) else lookup(layout)
    handle = layout.handle if isinstance(layout, ConvLayout) else int(layout)
    dims = x.dim() - 2
    if kernel_size is None:
        if filter.dim() != 3 + dims:
            raise ValueError("bsjit.conv: give kernel_size, or the filter as [blocks, K_b, C_b, *kernel]")
        kernel_size = tuple(filter.shape[3:])
    spatial = list(x.shape[2:])
    if deconv:
        k, st, dil = (_per_dim(v, dims, n)[3 - dims:] for v, n in ((kernel_size, "kernel_size"), (stride, "stride"),
                                                                   (dilation, "dilation")))
        if output_size is None:
            if isinstance(padding, str):
                raise ValueError("bsjit.conv: a deconvolution with padding 'same' or 'valid' needs output_size")
            pad = _per_dim(padding, dims, "padding")[3 - dims:]
            output_size = [(spatial[i] - 1) * st[i] - 2 * pad[i] + dil[i] * (k[i] - 1) + 1 for i in range(dims)]
        geometry = conv_geometry(list(output_size)[-dims:], kernel_size, stride, padding, dilation)
        if _conv.out_spatial(geometry)[3 - dims:] != spatial:
            raise ValueError(f"bsjit.conv: a convolution of {list(output_size)} does not give {spatial} with this "
                             "kernel, stride, padding and dilation")
    else:
        geometry = conv_geometry(spatial, kernel_size, stride, padding, dilation)
    return cl, handle, geometry


def conv(x: Tensor, filter: Tensor, layout, *, kernel_size=None, stride=1, padding=0, dilation=1,
         gate: Optional[Tensor] = None, deconv: bool = False, output_size=None) -> Tensor:
    """Block-sparse convolution over channels (openai/blocksparse's BlocksparseConv; with deconv, its
    BlocksparseDeconv, the transposed convolution). x: [N, C, *spatial] with 1 to 3 spatial
    dimensions, stored channels first or channels last (the output comes in the same storage).
    layout: a bsjit.ConvLayout (or its handle, read outside torch.compile). filter: the blocks'
    filters one after the other, [blocks, K_b, C_b, *kernel] or flat (then give kernel_size).
    padding: as conv_geometry. gate: float32 [blocks] scaling each block (needs the blocked filter).
    A deconvolution reads [N, K, *spatial] and writes [N, C, *output_size]; output_size defaults to
    the smallest input of the convolution it transposes. Differentiable in x, filter and gate."""
    cl, handle, geometry = _conv_setup(x, filter, layout, kernel_size, stride, padding, dilation, deconv, output_size)
    taps = geometry[3] * geometry[4] * geometry[5]
    return _conv.conv_call(x, filter, handle, cl.C, cl.K, cl.blocks, cl.filter_elements(taps), geometry,
                           _is_channels_last(x), bool(deconv), gate)


def conv_autotune(x: Tensor, filter: Tensor, layout, *, kernel_size=None, stride=1, padding=0, dilation=1,
                  deconv: bool = False, output_size=None, ops=("fprop", "bprop", "updat")) -> dict:
    """Times every kernel each op of conv(x, filter, layout, ...) can run with on x's GPU, at x's batch
    (scratch operands of the call's sizes), and keeps the fastest: later calls, and later processes
    sharing the kernel cache, run it (bsjit::Conv::autotune; on sm_90a the kernels fed by TMA, the
    warpgroup ones and mma.sync). Returns {op: (kernel kept, [(kernel, ms), ...])}. x must be a CUDA
    tensor; filter only gives the kernel size when kernel_size is not."""
    if x.device.type != "cuda":
        raise ValueError(f"bsjit.conv_autotune: x must be a CUDA tensor (it is on {x.device})")
    _cl, handle, geometry = _conv_setup(x, filter, layout, kernel_size, stride, padding, dilation, deconv, output_size)
    obj = _conv.conv_object(handle, geometry, x.dtype, _is_channels_last(x), bool(deconv))
    with _direct.on_device(x.device):
        stream = _direct.stream(x.device)
        return {op: obj.autotune(op, int(x.shape[0]), stream) for op in ops}


def conv_l2_normalize(filter: Tensor, layout, kernel_size, *, gain: Optional[Tensor] = None, epsilon: float = 1e-12,
                      deconv: bool = False) -> Tensor:
    """openai/blocksparse's filter l2_normalize (weight normalization): each row of the layout's filter
    (a block's output channel: C_b · taps elements; with deconv a block's input channel) divided by
    its L2 norm (at least sqrt(epsilon)), then multiplied by gain[row] where a float32 gain
    [rows] is given (rows in block order). Differentiable in the filter and the gain; the result has
    the filter's shape."""
    cl = layout if isinstance(layout, ConvLayout) else lookup(layout)
    handle = layout.handle if isinstance(layout, ConvLayout) else int(layout)
    kernel = [int(kernel_size)] if isinstance(kernel_size, int) else [int(k) for k in kernel_size]
    taps = 1
    for k in kernel:
        taps *= k
    rows = sum(c for _, c in cl.block_sizes) if deconv else sum(k for k, _ in cl.block_sizes)
    out, _ = _conv.conv_l2_normalize(filter, gain, handle, cl.filter_elements(taps), rows, kernel, bool(deconv),
                                     float(epsilon))
    return out.view(filter.shape)


def conv_edge_bias_shape(geometry: list[int], channels: int, *, channels_last: bool = True,
                         deconv: bool = False) -> tuple[int, int]:
    """The shape of conv_edge_bias's gain and bias for a convolution of `geometry` (conv_geometry's
    ints) with `channels` output channels: [edges, channels] for channels-last activations,
    [channels, edges] otherwise (edges: the groups of output positions padding reaches)."""
    edges = _C.ConvEdgeBias(list(geometry), int(channels), "f32", channels_last, deconv).edges
    return (edges, int(channels)) if channels_last else (int(channels), edges)


def conv_edge_bias(y: Tensor, gain: Tensor, bias: Tensor, geometry: list[int], *, deconv: bool = False) -> Tensor:
    """openai/blocksparse's ConvEdgeBias: y · gain + bias at the output positions whose receptive field
    reaches padding, one float32 gain and bias per channel for each group of positions missing the
    same filter taps (conv_edge_bias_shape), y unchanged elsewhere. y: the convolution's output
    [N, K, *spatial] (a deconvolution's with deconv), stored channels first or last; geometry: the
    convolution's (conv_geometry). Differentiable in y, gain and bias."""
    last = _is_channels_last(y)
    edges = gain.shape[0] if last else gain.shape[1]
    return _conv.conv_edge_bias(y, gain, bias, list(geometry), int(edges), last, bool(deconv))
