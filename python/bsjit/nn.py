"""bsjit.nn: modules over bsjit's ops."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from . import _ops
from . import _attention_ops, functional
from .functional import _axis
from .layout import ConvLayout, Layout, as_masks, element_mask_bits, mask_set_handle, rebind, register


class BlockSparseLinear(nn.Module):
    """y = x · W + bias with W [in_features, out_features] block-sparse: only the layout's blocks are
    stored, as the parameter `weight` [blocks, block, block] (row-major block order, Layout.coords).

    layout: a bsjit.Layout (or a mask it takes) of [in_features / block, out_features / block].
    feature_axis: "last" (x is [..., in_features]) or "first" (x is [in_features, N]).
    gated: a float32 parameter `gate` [blocks] scales each block (openai/blocksparse's gated matmul),
    with its gradient.

    The weight is an ordinary dense parameter, so optimizers, DDP and FSDP2 treat it as any other.
    The layout is saved in the state_dict (`layout_mask`), so a checkpoint reloads to the same
    layer. Constructible on the meta device; reset_parameters() initializes it later.
    """

    def __init__(self, layout, block: int, bias: bool = True, *, feature_axis: str = "last", gated: bool = False,
                 device=None, dtype=None):
        super().__init__()
        layout = layout if isinstance(layout, Layout) else Layout(layout)
        self.block = int(block)
        self.feature_axis = feature_axis
        self._axis = _axis(feature_axis)
        self.in_features = layout.rows * self.block
        self.out_features = layout.cols * self.block
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(layout.blocks, self.block, self.block, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        self.gate = nn.Parameter(torch.ones(layout.blocks, device=device, dtype=torch.float32)) if gated else None
        self._layout = layout
        self._handle = register(layout)  # this layer's own slot: set_layout repoints it
        # on the parameters' device: DDP and FSDP broadcast buffers with the parameters' backend
        self.register_buffer("layout_mask", torch.empty(layout.shape, dtype=torch.bool, device=device),
                             persistent=True)
        self.reset_parameters()

    @property
    def layout(self) -> Layout:
        return self._layout

    def set_layout(self, layout, weight: Optional[Tensor] = None) -> None:
        """Changes the sparsity (pruning, RigL): a layout of the same shape, and its blocks' values
        (default: the blocks both layouts hold keep theirs, new blocks start at zero; so do the gates,
        new ones at one). The layer keeps its handle, so a compiled graph runs the new layout without
        being traced again (its weight's shape changes with the block count, which torch.compile
        treats as a new input shape)."""
        layout = layout if isinstance(layout, Layout) else Layout(layout)
        if layout.shape != self._layout.shape:
            raise ValueError(f"bsjit: set_layout needs a {self._layout.shape} mask, got {layout.shape}")
        old_mask, new_mask = self._layout.to_numpy(), layout.to_numpy()
        # per new block (row-major), its index among the old blocks, -1 where the old layout had none
        old_index = np.full(old_mask.shape, -1, dtype=np.int64)
        old_index[old_mask] = np.arange(self._layout.blocks)
        source = old_index[new_mask]
        kept = np.flatnonzero(source >= 0)
        with torch.no_grad():
            def carried(old: Tensor, fresh: Tensor) -> Tensor:  # fresh with the kept blocks' old values
                if len(kept):
                    fresh[torch.from_numpy(kept).to(old.device)] = old[torch.from_numpy(source[kept]).to(old.device)]
                return fresh

            if weight is None:
                weight = carried(self.weight, self.weight.new_zeros(layout.blocks, self.block, self.block))
            self.weight = nn.Parameter(weight.to(self.weight.dtype), requires_grad=self.weight.requires_grad)
            if self.gate is not None:
                self.gate = nn.Parameter(carried(self.gate, self.gate.new_ones(layout.blocks)))
            self.layout_mask = torch.from_numpy(new_mask).to(self.layout_mask.device)
        self._layout = layout
        rebind(self._handle, layout)

    def _fan_in(self) -> np.ndarray:
        """Inputs feeding each output block column: its blocks times the block size."""
        per_col = np.bincount([c for _, c in self._layout.coords()], minlength=self._layout.cols)
        return per_col * self.block

    def reset_parameters(self) -> None:
        """As nn.Linear: weight and bias uniform in ±1/sqrt(fan_in), fan_in counting only the blocks
        that feed each output column."""
        fan_in = self._fan_in()
        bound = 1.0 / np.sqrt(np.maximum(fan_in, 1))
        cols = np.array([c for _, c in self._layout.coords()], dtype=np.int64)
        with torch.no_grad():
            self.layout_mask.copy_(torch.from_numpy(self._layout.to_numpy()))
            per_block = torch.tensor(bound[cols] if len(cols) else np.zeros(0), dtype=torch.float32)
            self.weight.uniform_(-1.0, 1.0)
            self.weight.mul_(per_block.to(self.weight.device, self.weight.dtype)[:, None, None])
            if self.bias is not None:
                per_feature = torch.tensor(np.repeat(np.where(fan_in > 0, bound, 0.0), self.block), dtype=torch.float32)
                self.bias.uniform_(-1.0, 1.0)
                self.bias.mul_(per_feature.to(self.bias.device, self.bias.dtype))
            if self.gate is not None:
                self.gate.fill_(1.0)

    def ortho_init(self) -> None:
        """Each output block column's weights (its blocks stacked over the inputs, [fan_in, block])
        get orthonormal columns (QR of a Gaussian), so the layer maps onto each column's outputs
        without changing norms; where a column has fewer inputs than outputs, its rows are
        orthonormal instead."""
        coords = self._layout.coords()
        with torch.no_grad():
            w = torch.zeros(self.weight.shape, dtype=torch.float32)
            for col in range(self._layout.cols):
                idx = [i for i, (_, c) in enumerate(coords) if c == col]
                if not idx:
                    continue
                q, r = torch.linalg.qr(torch.randn(len(idx) * self.block, self.block))
                q = q * torch.sign(torch.diagonal(r))  # a uniform draw over orthogonal matrices
                w[idx] = q.reshape(len(idx), self.block, self.block)
            self.weight.copy_(w.to(self.weight.device, self.weight.dtype))

    def identity_init(self, scale: float = 1.0) -> None:
        """Diagonal blocks (row == column) scale · I, every other block zero: y = scale · x on the
        features the diagonal covers."""
        with torch.no_grad():
            w = torch.zeros(self.weight.shape, dtype=torch.float32)
            for i, (r, c) in enumerate(self._layout.coords()):
                if r == c:
                    w[i] = scale * torch.eye(self.block)
            self.weight.copy_(w.to(self.weight.device, self.weight.dtype))

    @classmethod
    def from_dense(cls, linear: nn.Linear, layout, block: int, **kwargs) -> "BlockSparseLinear":
        """The layout's blocks of a trained nn.Linear (y = x · Aᵀ + b, so W = Aᵀ), on its device and
        dtype: the rest is dropped."""
        layout = layout if isinstance(layout, Layout) else Layout(layout)
        if (layout.rows * block, layout.cols * block) != (linear.in_features, linear.out_features):
            raise ValueError(
                f"bsjit: a {layout.shape} layout at block {block} is {layout.rows * block} → {layout.cols * block} "
                f"features; the linear layer is {linear.in_features} → {linear.out_features}")
        layer = cls(layout, block, bias=linear.bias is not None, device=linear.weight.device,
                    dtype=linear.weight.dtype, **kwargs)
        with torch.no_grad():
            dense = linear.weight.t()
            for i, (r, c) in enumerate(layout.coords()):
                layer.weight[i] = dense[r * block:(r + 1) * block, c * block:(c + 1) * block]
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def to_dense(self) -> Tensor:
        """W as a dense [in_features, out_features] tensor (zeros outside the layout; gate applied)."""
        w = self.weight if self.gate is None else self.weight * self.gate[:, None, None].to(self.weight.dtype)
        dense = w.new_zeros(self.in_features, self.out_features)
        b = self.block
        for i, (r, c) in enumerate(self._layout.coords()):
            dense[r * b:(r + 1) * b, c * b:(c + 1) * b] = w[i]
        return dense

    def autotune(self, x: Tensor, ops=("forward", "backward_data", "backward_weight")) -> dict:
        """Times every tile shape of each op at x's rows on x's GPU and keeps the fastest, for this
        process and, through the kernel cache, later ones (bsjit.functional.matmul_autotune). Returns
        {op: (shape kept, [(shape, ms), ...])}."""
        return functional.matmul_autotune(x, self.weight, self._handle, feature_axis=self.feature_axis, ops=ops)

    def forward(self, x: Tensor) -> Tensor:
        y = _ops.matmul_call(x, self.weight, self._handle, self.in_features, self.out_features, self._axis, self.gate)
        if self.bias is not None:
            y = y + (self.bias if self._axis == 0 else self.bias[:, None])
        return y

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        mask = state_dict.get(prefix + "layout_mask")
        if mask is not None and not np.array_equal(mask.cpu().numpy() != 0, self._layout.to_numpy()):
            self.set_layout(Layout(mask), weight=state_dict.get(prefix + "weight"))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, block={self.block}, "
                f"blocks={self._layout.blocks}, bias={self.bias is not None}, feature_axis={self.feature_axis!r}"
                + (", gated=True" if self.gate is not None else ""))


class BlockSparseAttention(nn.Module):
    """bsjit's fused block-sparse attention as a module: forward(q, k, v, key_padding_mask=None) is
    bsjit.functional.attention with this module's masks (one for every head, one per head, or a
    [heads, q blocks, k blocks] array), block, causal, scale and tensor order. It holds no
    parameters; the masks are saved in the state_dict (`masks`)."""

    def __init__(self, mask, block: int, *, causal: bool = False, scale: Optional[float] = None,
                 order: str = "bshd"):
        super().__init__()
        self.block, self.causal, self.scale, self.order = int(block), bool(causal), scale, order
        self._set_masks(as_masks(mask))
        self.register_buffer("masks", torch.stack([m.to_dense_mask() for m in self._masks]), persistent=True)

    def _set_masks(self, masks) -> None:
        self._masks = masks
        self._handle = mask_set_handle(masks)  # looked up here, not while torch.compile traces forward

    def forward(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        return functional.attention(q, k, v, self._handle, self.block, causal=self.causal,
                                    key_padding_mask=key_padding_mask, scale=self.scale, order=self.order)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        masks = state_dict.get(prefix + "masks")
        if masks is not None:
            self._set_masks(as_masks(masks.cpu().numpy()))
            self.masks = masks.clone()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        rows, cols = self._masks[0].shape
        return (f"masks={len(self._masks)} × {rows}x{cols} blocks, block={self.block}, causal={self.causal}, "
                f"order={self.order!r}")


class DecomposedAttention(nn.Module):
    """Block-sparse attention as its ops (bsjit::AttentionOps, openai/blocksparse's BlocksparseTransformer
    ops), for models that need the score matrix itself: forward(q, k, v) is
    probs_v(softmax(scores(q, k)), v), each step differentiable and usable alone. Block-sparse
    tensors (the scores and probabilities) are [batch, sparse elements]: each head's nonzero blocks
    in its mask's row-major order, each block row-major (query, key). head_dim is fixed at
    construction (the kernels are built for it).

    element_mask: masks inside the blocks, applied by softmax with causal and key padding (True
    keeps a query-key pair): a [seq_q, seq_k] array for every head, [heads, seq_q, seq_k] one per
    head, or openai/blocksparse's callback f(head, query_block, key_block) → [block, block]
    (bsjit.layout.element_mask_bits)."""

    def __init__(self, mask, block: int, head_dim: int, *, causal: bool = False, scale: Optional[float] = None,
                 order: str = "bshd", element_mask=None):
        super().__init__()
        from . import _attention

        if order not in _attention.ORDERS:
            raise ValueError(f"bsjit: order must be 'bshd' or 'bhsd', not {order!r}")
        self.block, self.head_dim, self.causal, self.scale = int(block), int(head_dim), bool(causal), scale
        self.order = order
        self._order = _attention.ORDERS.index(order)
        self._masks, bits = as_masks(mask), b""
        if element_mask is not None:
            self._masks, bits = element_mask_bits(self._masks, self.block, element_mask)
        self._handle = mask_set_handle(self._masks, bits)

    def _heads_of(self, sparse: Tensor) -> int:
        if len(self._masks) > 1:
            return len(self._masks)
        return int(sparse.shape[1]) // (self._masks[0].blocks * self.block * self.block)

    def _config(self, heads: int) -> tuple:
        return (self._handle, self.block, self.causal, self._order, heads, self.head_dim)

    def _heads_of_dense(self, t: Tensor) -> int:
        return int(t.shape[2] if self._order == 0 else t.shape[1])

    def _kv_group(self, heads: int, kv: Tensor) -> int:
        """Query heads per key/value head: k and v may have fewer heads than q (grouped-query attention)."""
        kv_heads = self._heads_of_dense(kv)
        return heads // kv_heads if kv_heads > 0 and heads % kv_heads == 0 else 1  # else the op says what is wrong

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q · kᵀ on the masks' blocks, unscaled. k (and v) may have fewer heads than q, a divisor of
        its count (grouped-query attention)."""
        heads = self._heads_of_dense(q)
        return _attention_ops.scores(q, k, *self._config(heads), self._kv_group(heads, k))

    def softmax(self, s: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """softmax(scale · s) over each query row's blocks (causal, key padding: True marks a padded key)."""
        padding = None if key_padding_mask is None else (~key_padding_mask.bool()).to(torch.uint8).contiguous()
        return _attention_ops.softmax(s, *self._config(self._heads_of(s)),
                                      float(self.scale) if self.scale is not None else 0.0, padding)

    def probs_v(self, p: Tensor, v: Tensor) -> Tensor:
        """p · v: shaped like q."""
        heads = self._heads_of(p)
        return _attention_ops.probs_v(p, v, *self._config(heads), self._kv_group(heads, v))

    def forward(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        return self.probs_v(self.softmax(self.scores(q, k), key_padding_mask), v)


class _BlockSparseConvNd(nn.Module):
    _dims = 0
    _transposed = False

    def __init__(self, layout, kernel_size, stride=1, padding=0, dilation=1, bias: bool = True, *,
                 block: Optional[int] = None, gated: bool = False, output_padding=0, device=None, dtype=None):
        super().__init__()
        if self._transposed and isinstance(padding, str):
            raise ValueError("bsjit: a transposed convolution takes padding as ints (and output_padding), not "
                             f"{padding!r}")
        self.output_padding = output_padding
        if not isinstance(layout, ConvLayout):
            if block is None:
                raise ValueError("bsjit: a block mask as a conv layout needs block=")
            layout = ConvLayout.from_mask(layout, block)
        self._layout = layout
        self._handle = layout.handle  # registered here, outside any compiled region
        d = self._dims
        self.kernel_size = (kernel_size,) * d if isinstance(kernel_size, int) else tuple(kernel_size)
        if len(self.kernel_size) != d:
            raise ValueError(f"bsjit: kernel_size must be an int or {d} ints, got {kernel_size!r}")
        self.stride, self.padding, self.dilation = stride, padding, dilation
        # a transposed convolution reads the layout's output channels and writes its input channels
        self.in_channels, self.out_channels = (layout.K, layout.C) if self._transposed else (layout.C, layout.K)
        taps = math.prod(self.kernel_size)
        b = layout.uniform_block
        shape = (layout.blocks, b, b, *self.kernel_size) if b else (layout.filter_elements(taps),)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(shape, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_channels, **factory)) if bias else None
        if gated and not b:
            raise ValueError("bsjit: a gated convolution needs blocks of one size (its filter [blocks, b, b, *kernel])")
        self.gate = nn.Parameter(torch.ones(layout.blocks, device=device, dtype=torch.float32)) if gated else None
        self.reset_parameters()

    @property
    def layout(self) -> ConvLayout:
        return self._layout

    def _fan_in_bounds(self) -> Tensor:
        """Per filter element, 1 / sqrt(fan-in of its output channel) (torch's conv initialization):
        the fan-in of channel k counts the input channels of every block writing k, times the taps."""
        taps = math.prod(self.kernel_size)
        blocks = self._layout.channel_blocks()
        fan = np.zeros(self._layout.K)
        for c, k in blocks:
            fan[np.asarray(k)] += len(c) * taps
        bounds = [np.repeat(1.0 / np.sqrt(np.maximum(fan[np.asarray(k)], 1)), len(c) * taps) for c, k in blocks]
        return torch.from_numpy(np.concatenate(bounds))

    def reset_parameters(self) -> None:
        if self.weight.device.type == "meta":
            return
        with torch.no_grad():
            bound = self._fan_in_bounds().to(self.weight.device, torch.float32)
            w = (torch.rand(bound.shape, device=self.weight.device) * 2 - 1) * bound
            self.weight.copy_(w.view(self.weight.shape))
            if self.bias is not None:
                # the mean fan-in of an output channel
                fan = max(1.0, self._layout.filter_elements(math.prod(self.kernel_size)) / self.out_channels)
                nn.init.uniform_(self.bias, -1 / math.sqrt(fan), 1 / math.sqrt(fan))
            if self.gate is not None:
                self.gate.fill_(1.0)

    def to_dense(self, weight: Optional[Tensor] = None) -> Tensor:
        """The filter (`weight`'s values where given: any dtype, differentiable) as a dense
        [layout.K, layout.C, *kernel] one, gate applied; overlapping blocks add. With torch's own
        convolution (conv_transpose for the transposed modules: the same array is its weight) it
        computes what the module does."""
        weight = self.weight if weight is None else weight
        dense = weight.new_zeros(self._layout.K, self._layout.C, *self.kernel_size)
        flat = weight.reshape(-1)
        if self.gate is not None:
            flat = (weight * self.gate.view(-1, *([1] * (weight.dim() - 1))).to(weight.dtype)).reshape(-1)
        taps, at = math.prod(self.kernel_size), 0
        for c, k in self._layout.channel_blocks():
            n = len(c) * len(k) * taps
            block = flat[at:at + n].view(len(k), len(c), *self.kernel_size)
            index = (torch.as_tensor(k, device=dense.device)[:, None], torch.as_tensor(c, device=dense.device))
            dense = dense.index_put(index, block, accumulate=True)
            at += n
        return dense

    def _output_size(self, x: Tensor) -> Optional[list[int]]:
        """A transposed module's output size for x (torch's rule, output_padding included); None otherwise."""
        if not self._transposed:
            return None
        d = self._dims
        st, pad, dil, extra = (functional._per_dim(v, d, n)[3 - d:] for v, n in (
            (self.stride, "stride"), (self.padding, "padding"), (self.dilation, "dilation"),
            (self.output_padding, "output_padding")))
        return [(int(x.shape[2 + i]) - 1) * st[i] - 2 * pad[i] + dil[i] * (self.kernel_size[i] - 1) + 1 + extra[i]
                for i in range(d)]

    def autotune(self, x: Tensor, ops=("fprop", "bprop", "updat")) -> dict:
        """Times every kernel of each op (fprop: the forward, bprop: the input's gradient, updat: the
        filter's) at x's shape and storage on x's GPU and keeps the fastest, for this process and,
        through the kernel cache, later ones (bsjit.functional.conv_autotune). Returns {op: (kernel
        kept, [(kernel, ms), ...])}."""
        return functional.conv_autotune(x, self.weight, self._handle, kernel_size=self.kernel_size, stride=self.stride,
                                        padding=self.padding, dilation=self.dilation, deconv=self._transposed,
                                        output_size=self._output_size(x), ops=ops)

    def forward(self, x: Tensor) -> Tensor:
        y = functional.conv(x, self.weight, self._handle, kernel_size=self.kernel_size, stride=self.stride,
                            padding=self.padding, dilation=self.dilation, gate=self.gate, deconv=self._transposed,
                            output_size=self._output_size(x))
        if self.bias is not None:
            y = y + self.bias.view(1, -1, *([1] * self._dims))
        return y

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, blocks={self._layout.blocks}, "
                f"bias={self.bias is not None}")


class BlockSparseConv1d(_BlockSparseConvNd):
    """A 1-D convolution whose channels are block-sparse: x [N, C, W] → [N, K, Q].

    layout: a bsjit.ConvLayout (blocks of any channel lists, openai/blocksparse's BCK), or a
    [C / block, K / block] block mask with block=. The filter parameter `weight` holds only the
    blocks' filters: [blocks, b, b, *kernel] for blocks of one size b, else flat. padding: an int,
    a tuple, (before, after) pairs, "same" or "valid". gated: a float32 parameter `gate` [blocks]
    scales each block. Inputs stored channels last (torch.channels_last) run the channels-last
    kernels and give channels-last outputs. Autograd, torch.compile and fake tensors work as for
    BlockSparseLinear."""

    _dims = 1


class BlockSparseConv2d(_BlockSparseConvNd):
    """BlockSparseConv1d in 2-D: x [N, C, H, W] → [N, K, P, Q]."""

    _dims = 2


class BlockSparseConv3d(_BlockSparseConvNd):
    """BlockSparseConv1d in 3-D: x [N, C, D, H, W] → [N, K, M, P, Q]."""

    _dims = 3


class BlockSparseConvTranspose1d(_BlockSparseConvNd):
    """The transposed convolution of BlockSparseConv1d's layout (openai/blocksparse's
    BlocksparseDeconv): x [N, layout.K, W] → [N, layout.C, Q], Q = (W − 1) · stride − 2 · padding +
    dilation · (kernel − 1) + 1 + output_padding, as torch's ConvTranspose1d; the filter parameter
    holds the same blocks as the convolution's (to_dense() is conv_transpose1d's weight)."""

    _dims = 1
    _transposed = True


class BlockSparseConvTranspose2d(_BlockSparseConvNd):
    """BlockSparseConvTranspose1d in 2-D."""

    _dims = 2
    _transposed = True


class BlockSparseConvTranspose3d(_BlockSparseConvNd):
    """BlockSparseConvTranspose1d in 3-D."""

    _dims = 3
    _transposed = True
