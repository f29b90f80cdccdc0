"""The torch.ops.bsjit convolution operators: block-sparse convolution over channels (bsjit::Conv),
its input's gradient and its filter's, registered with torch.library like the matmul ops (fake
implementations, autograd of the forward, torch's current stream and allocator).

Activations are logical [N, C, *spatial] tensors (1 to 3 spatial dimensions, as torch's conv1d-3d
take them), stored channels first or channels last (torch.channels_last / channels_last_3d, or the
same strides for 1-D): `channels_last` names which, and outputs come in the same storage. The filter
is the layout's blocks' filters one after the other: flat [filter elements], or [blocks, K_b, C_b,
*kernel] where every block has one size (a gate needs that shape). `geometry` is the convolution's
18 ints: input size, kernel, stride, dilation, padding before, padding after (D, H, W each; unused
dimensions 1 and 0). A deconvolution (deconv) is that convolution transposed: its input has the
convolution's output shape, its output the convolution's input shape.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C, _direct
from ._objects import ObjectCache
from ._ops import _DTYPES, workspace
from .layout import lookup

# One bsjit.Conv per (layout, geometry, dtype, storage, direction).
_objects = ObjectCache(256)


def conv_object(handle: int, geometry: list[int], dtype: torch.dtype, channels_last: bool,
                deconv: bool) -> _C.Conv:
    layout = lookup(handle)
    key = (layout.hash, tuple(geometry), dtype, channels_last, deconv)
    return _objects.get(key, lambda: _C.Conv(layout._layout, list(geometry), _DTYPES[dtype], channels_last, deconv))


def out_spatial(geometry: list[int]) -> list[int]:
    """The convolution's output size (M, P, Q) for its geometry."""
    g = geometry
    return [(g[i] + g[12 + i] + g[15 + i] - g[9 + i] * (g[3 + i] - 1) - 1) // g[6 + i] + 1 for i in range(3)]


def _fail(op: str, message: str):
    raise ValueError(f"bsjit.{op}: {message}")


def _stored(x: Tensor, channels_last: bool) -> Tensor:
    """x as a contiguous block of memory in the order the kernels read."""
    return x.movedim(1, -1).contiguous().movedim(-1, 1) if channels_last else x.contiguous()


def _empty(like: Tensor, shape: list[int], channels_last: bool) -> Tensor:
    if channels_last:
        return like.new_empty([shape[0], *shape[2:], shape[1]]).movedim(-1, 1)
    return like.new_empty(shape)


def _sides(C: int, K: int, geometry: list[int], dims: int, deconv: bool):
    """(channels, spatial) of the op's input and of its output (fprop)."""
    x = (C, list(geometry[3 - dims:3]))
    y = (K, out_spatial(geometry)[3 - dims:])
    return (y, x) if deconv else (x, y)


def _check(op: str, t: Tensor, name: str, channels: int, spatial: list[int], f: Tensor) -> None:
    if t.dim() != 2 + len(spatial) or t.shape[1] != channels or list(t.shape[2:]) != spatial:
        _fail(op, f"{name} must be [N, {channels}, {', '.join(map(str, spatial))}], got shape {tuple(t.shape)}")
    if t.dtype != f.dtype:
        _fail(op, f"{name} is {t.dtype} but the filter is {f.dtype}; both must have one dtype")
    if t.device != f.device:
        _fail(op, f"{name} is on {t.device} but the filter on {f.device}")


def _check_filter(op: str, f: Tensor, filter_elements: int, blocks: int, gate: Optional[Tensor]) -> None:
    if f.dtype not in _DTYPES:
        _fail(op, f"dtype {f.dtype} is not supported; expected float32, float16 or bfloat16")
    if f.numel() != filter_elements:
        _fail(op, f"the filter holds {f.numel()} elements; the layout's blocks need {filter_elements}")
    if gate is not None:
        if f.dim() < 4 or f.shape[0] != blocks:
            _fail(op, f"a gate needs the filter as [blocks, K_b, C_b, *kernel], got shape {tuple(f.shape)}")
        if gate.dtype != torch.float32 or gate.dim() != 1 or gate.shape[0] != blocks:
            _fail(op, f"the gate must be float32 [{blocks}] (one per block), got {gate.dtype} {tuple(gate.shape)}")
        if gate.device != f.device:
            _fail(op, f"the gate is on {gate.device} but the filter on {f.device}")


def _launch(op: str, kernel_op: str, handle: int, geometry: list[int], channels_last: bool, deconv: bool,
            a: Tensor, b: Tensor, out: Tensor, n: int, gate: Optional[Tensor]) -> None:
    if out.device.type != "cuda":
        _fail(op, f"bsjit runs on CUDA tensors; these are on {out.device}")
    conv = conv_object(handle, geometry, out.dtype, channels_last, deconv)
    with _direct.on_device(out.device):
        # the staging (a filter packed per tap, fp32 filter-gradient sums, a 1×1 convolution's matmul
        # workspace, whose arrival counters lead it) from torch's allocator
        _held, ptr, size = workspace(conv.workspace_size(kernel_op, n, gate is not None), out.device)
        conv.run(kernel_op, a.data_ptr(), b.data_ptr(), out.data_ptr(), n, _direct.stream(out.device), False,
                 gate.data_ptr() if gate is not None else 0, ptr, size)


def _gate(gate: Optional[Tensor]) -> Optional[Tensor]:
    return gate.contiguous() if gate is not None else None


# --- fprop (y = conv(x, F)) and bprop (dx from dy): the same product in two directions ----------------


def _check_product(op: str, name: str, reads: int, a: Tensor, f: Tensor, C: int, K: int, blocks: int,
                   filter_elements: int, geometry: list[int], deconv: bool, gate: Optional[Tensor]):
    """Checks a, which is side `reads` of the op (0 its input, 1 its output: fprop reads side 0,
    bprop side 1); returns the (channels, spatial) of the side it writes."""
    _check_filter(op, f, filter_elements, blocks, gate)
    if a.dim() not in (3, 4, 5):
        _fail(op, f"{name} must be [N, channels, *spatial] with 1 to 3 spatial dimensions, got {tuple(a.shape)}")
    sides = _sides(C, K, geometry, a.dim() - 2, deconv)
    _check(op, a, name, *sides[reads], f)
    return sides[1 - reads]


def _product(op: str, kernel_op: str, name: str, reads: int, a: Tensor, f: Tensor, layout: int, C: int, K: int,
             blocks: int, filter_elements: int, geometry: list[int], channels_last: bool, deconv: bool,
             gate: Optional[Tensor]) -> Tensor:
    channels, spatial = _check_product(op, name, reads, a, f, C, K, blocks, filter_elements, geometry, deconv, gate)
    out = _empty(a, [a.shape[0], channels, *spatial], channels_last)
    if out.numel() == 0:
        return out
    _launch(op, kernel_op, layout, geometry, channels_last, deconv, _stored(a, channels_last), f.contiguous(), out,
            int(a.shape[0]), _gate(gate))
    return out


def _conv(x: Tensor, f: Tensor, layout: int, C: int, K: int, blocks: int, filter_elements: int,
          geometry: list[int], channels_last: bool, deconv: bool, gate: Optional[Tensor]) -> Tensor:
    return _product("conv", "fprop", "the input", 0, x, f, layout, C, K, blocks, filter_elements, geometry,
                    channels_last, deconv, gate)


conv = torch.library.custom_op("bsjit::conv", _conv, mutates_args=())


@conv.register_fake
def _(x, f, layout, C, K, blocks, filter_elements, geometry, channels_last, deconv, gate):
    co, so = _check_product("conv", "the input", 0, x, f, C, K, blocks, filter_elements, geometry, deconv, gate)
    return _empty(x, [x.shape[0], co, *so], channels_last)


def _conv_backward_input(dy: Tensor, f: Tensor, layout: int, C: int, K: int, blocks: int, filter_elements: int,
                         geometry: list[int], channels_last: bool, deconv: bool, gate: Optional[Tensor]) -> Tensor:
    return _product("conv_backward_input", "bprop", "the output's gradient", 1, dy, f, layout, C, K, blocks,
                    filter_elements, geometry, channels_last, deconv, gate)


conv_backward_input = torch.library.custom_op("bsjit::conv_backward_input", _conv_backward_input, mutates_args=())


@conv_backward_input.register_fake
def _(dy, f, layout, C, K, blocks, filter_elements, geometry, channels_last, deconv, gate):
    ci, si = _check_product("conv_backward_input", "the output's gradient", 1, dy, f, C, K, blocks, filter_elements,
                            geometry, deconv, gate)
    return _empty(dy, [dy.shape[0], ci, *si], channels_last)


# --- updat: dF on the layout's blocks ----------------------------------------------------------------


def _conv_backward_filter(x: Tensor, dy: Tensor, f: Tensor, layout: int, C: int, K: int, blocks: int,
                          filter_elements: int, geometry: list[int], channels_last: bool, deconv: bool,
                          gate: Optional[Tensor]) -> Tensor:
    _check_backward_filter(x, dy, f, C, K, blocks, filter_elements, geometry, deconv, gate)
    df = torch.empty_like(f, memory_format=torch.contiguous_format)
    if x.shape[0] == 0:
        return df.zero_()
    _launch("conv_backward_filter", "updat", layout, geometry, channels_last, deconv, _stored(x, channels_last),
            _stored(dy, channels_last), df, int(x.shape[0]), _gate(gate))
    return df


conv_backward_filter = torch.library.custom_op("bsjit::conv_backward_filter", _conv_backward_filter,
                                               mutates_args=())


def _check_backward_filter(x, dy, f, C, K, blocks, filter_elements, geometry, deconv, gate):
    op = "conv_backward_filter"
    _check_filter(op, f, filter_elements, blocks, gate)
    if x.dim() not in (3, 4, 5) or dy.dim() != x.dim() or dy.shape[0] != x.shape[0]:
        _fail(op, f"the input {tuple(x.shape)} and the output's gradient {tuple(dy.shape)} must be [N, channels, "
                  "*spatial] with the same N and 1 to 3 spatial dimensions")
    (ci, si), (co, so) = _sides(C, K, geometry, x.dim() - 2, deconv)
    _check(op, x, "the input", ci, si, f)
    _check(op, dy, "the output's gradient", co, so, f)


@conv_backward_filter.register_fake
def _(x, dy, f, layout, C, K, blocks, filter_elements, geometry, channels_last, deconv, gate):
    _check_backward_filter(x, dy, f, C, K, blocks, filter_elements, geometry, deconv, gate)
    return torch.empty_like(f, memory_format=torch.contiguous_format)


# --- autograd of fprop -----------------------------------------------------------------------------


def _setup_conv(ctx, inputs, output):
    x, f, layout, C, K, blocks, filter_elements, geometry, channels_last, deconv, gate = inputs
    ctx.save_for_backward(x, f, gate)
    ctx.args = (layout, C, K, blocks, filter_elements, geometry, channels_last, deconv)


def _conv_backward(ctx, dy):
    x, f, gate = ctx.saved_tensors
    args = ctx.args
    direct = getattr(ctx, "direct", False)  # called by _ConvFunction: call implementations, not ops
    backward_input = _conv_backward_input if direct else conv_backward_input
    backward_filter = _conv_backward_filter if direct else conv_backward_filter
    dx = df = dgate = None
    if ctx.needs_input_grad[0]:
        dx = backward_input(dy, f, *args, gate)
    if gate is not None and ctx.needs_input_grad[10]:
        # y = conv(x, g ∘ F) block by block: dF = g ∘ raw and dg = Σ F ∘ raw over each block
        raw = backward_filter(x, dy, f, *args, None).float()
        dgate = (raw * f.float()).flatten(1).sum(1)
        if ctx.needs_input_grad[1]:
            df = (raw * gate.view(-1, *([1] * (f.dim() - 1)))).to(f.dtype)
    elif ctx.needs_input_grad[1]:
        df = backward_filter(x, dy, f, *args, gate)
    return dx, df, None, None, None, None, None, None, None, None, dgate


torch.library.register_autograd("bsjit::conv", _conv_backward, setup_context=_setup_conv)

_ConvFunction = _direct.function("_ConvFunction", _conv, _setup_conv, _conv_backward)


def conv_call(x: Tensor, f: Tensor, layout: int, C: int, K: int, blocks: int, filter_elements: int,
              geometry: list[int], channels_last: bool, deconv: bool, gate: Optional[Tensor]) -> Tensor:
    """bsjit::conv, run directly in eager mode on CUDA tensors (bsjit._direct) and as the op otherwise."""
    if _direct.eager(x, f, gate):
        if not _direct.records(x, f, gate):
            return _conv(x, f, layout, C, K, blocks, filter_elements, geometry, channels_last, deconv, gate)
        return _ConvFunction.apply(x, f, layout, C, K, blocks, filter_elements, geometry, channels_last, deconv, gate)
    return conv(x, f, layout, C, K, blocks, filter_elements, geometry, channels_last, deconv, gate)


# --- blocksparse's filter l2_normalize -------------------------------------------------------------


def _check_l2(op: str, f: Tensor, gain: Optional[Tensor], filter_elements: int, rows: int) -> None:
    _check_filter(op, f, filter_elements, 0, None)
    if gain is not None and (gain.dtype != torch.float32 or gain.dim() != 1 or gain.shape[0] != rows
                             or gain.device != f.device):
        _fail(op, f"the gain must be float32 [{rows}] (one per filter row) on {f.device}, got {gain.dtype} "
                  f"{tuple(gain.shape)} on {gain.device}")


def _l2_object(f: Tensor, layout: int, kernel: list[int], deconv: bool) -> _C.Conv:
    kernel3 = [1] * (3 - len(kernel)) + list(kernel)
    geometry = kernel3 + kernel3 + [1, 1, 1] + [1, 1, 1] + [0] * 6  # the kernels depend on the taps only
    return conv_object(layout, geometry, f.dtype, True, deconv)


def _conv_l2_normalize(f: Tensor, gain: Optional[Tensor], layout: int, filter_elements: int, rows: int,
                       kernel: list[int], deconv: bool, epsilon: float) -> tuple[Tensor, Tensor]:
    _check_l2("conv_l2_normalize", f, gain, filter_elements, rows)
    f = f.contiguous()
    out = torch.empty_like(f)
    sums = torch.empty(rows, dtype=torch.float32, device=f.device)
    if out.device.type != "cuda":
        _fail("conv_l2_normalize", f"bsjit runs on CUDA tensors; these are on {out.device}")
    with _direct.on_device(out.device):
        _l2_object(f, layout, kernel, deconv).l2_normalize(
            f.data_ptr(), gain.contiguous().data_ptr() if gain is not None else 0, out.data_ptr(), sums.data_ptr(),
            epsilon, _direct.stream(out.device))
    return out, sums


conv_l2_normalize = torch.library.custom_op("bsjit::conv_l2_normalize", _conv_l2_normalize, mutates_args=())


@conv_l2_normalize.register_fake
def _(f, gain, layout, filter_elements, rows, kernel, deconv, epsilon):
    _check_l2("conv_l2_normalize", f, gain, filter_elements, rows)
    return torch.empty_like(f, memory_format=torch.contiguous_format), f.new_empty(rows, dtype=torch.float32)


def _conv_l2_normalize_backward(grad_out: Tensor, f: Tensor, gain: Optional[Tensor], sums: Tensor, layout: int,
                                filter_elements: int, rows: int, kernel: list[int], deconv: bool,
                                epsilon: float) -> tuple[Tensor, Tensor]:
    _check_l2("conv_l2_normalize_backward", f, gain, filter_elements, rows)
    f, grad_out = f.contiguous(), grad_out.contiguous()
    grad_f = torch.empty_like(f)
    grad_gain = torch.empty(rows if gain is not None else 0, dtype=torch.float32, device=f.device)
    with _direct.on_device(f.device):
        _l2_object(f, layout, kernel, deconv).l2_normalize_backward(
            grad_out.data_ptr(), f.data_ptr(), gain.contiguous().data_ptr() if gain is not None else 0,
            sums.contiguous().data_ptr(), grad_f.data_ptr(), grad_gain.data_ptr() if gain is not None else 0, epsilon,
            _direct.stream(f.device))
    return grad_f, grad_gain


conv_l2_normalize_backward = torch.library.custom_op("bsjit::conv_l2_normalize_backward",
                                                     _conv_l2_normalize_backward, mutates_args=())


@conv_l2_normalize_backward.register_fake
def _(grad_out, f, gain, sums, layout, filter_elements, rows, kernel, deconv, epsilon):
    _check_l2("conv_l2_normalize_backward", f, gain, filter_elements, rows)
    return (torch.empty_like(f, memory_format=torch.contiguous_format),
            f.new_empty(rows if gain is not None else 0, dtype=torch.float32))


def _setup_l2(ctx, inputs, output):
    f, gain, *args = inputs
    ctx.save_for_backward(f, gain, output[1])
    ctx.args = args


def _l2_backward(ctx, grad_out, _grad_sums):
    f, gain, sums = ctx.saved_tensors
    grad_f, grad_gain = conv_l2_normalize_backward(grad_out, f, gain, sums, *ctx.args)
    return grad_f, (grad_gain if gain is not None else None), None, None, None, None, None, None


torch.library.register_autograd("bsjit::conv_l2_normalize", _l2_backward, setup_context=_setup_l2)


# --- blocksparse's ConvEdgeBias ----------------------------------------------------------------------

_edge_objects = ObjectCache(64)


def edge_bias_object(geometry: list[int], channels: int, dtype: torch.dtype, channels_last: bool,
                     deconv: bool) -> _C.ConvEdgeBias:
    key = (tuple(geometry), channels, dtype, channels_last, deconv)
    return _edge_objects.get(key, lambda: _C.ConvEdgeBias(list(geometry), channels, _DTYPES[dtype], channels_last,
                                                           deconv))


def _check_edge(op: str, y: Tensor, gain: Tensor, bias: Tensor, edges: int, channels_last: bool) -> None:
    channels = y.shape[1] if y.dim() >= 3 else -1
    want = [edges, channels] if channels_last else [channels, edges]
    for name, t in (("gain", gain), ("bias", bias)):
        if t.dtype != torch.float32 or list(t.shape) != want or t.device != y.device:
            shape, order = (f"[edges, {channels}]", "last") if channels_last else (f"[{channels}, edges]", "first")
            _fail(op, f"the {name} must be float32 {shape} on {y.device} (channels {order}; conv_edge_bias_shape), "
                      f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if y.dtype not in _DTYPES:
        _fail(op, f"dtype {y.dtype} is not supported; expected float32, float16 or bfloat16")


def _conv_edge_bias(y: Tensor, gain: Tensor, bias: Tensor, geometry: list[int], edges: int, channels_last: bool,
                    deconv: bool) -> Tensor:
    _check_edge("conv_edge_bias", y, gain, bias, edges, channels_last)
    out = _empty(y, list(y.shape), channels_last)
    if out.device.type != "cuda":
        _fail("conv_edge_bias", f"bsjit runs on CUDA tensors; these are on {out.device}")
    x = _stored(y, channels_last)
    with _direct.on_device(out.device):
        edge_bias_object(geometry, int(y.shape[1]), y.dtype, channels_last, deconv).forward(
            x.data_ptr(), gain.contiguous().data_ptr(), bias.contiguous().data_ptr(), out.data_ptr(), int(y.shape[0]),
            _direct.stream(out.device))
    return out


conv_edge_bias = torch.library.custom_op("bsjit::conv_edge_bias", _conv_edge_bias, mutates_args=())


@conv_edge_bias.register_fake
def _(y, gain, bias, geometry, edges, channels_last, deconv):
    _check_edge("conv_edge_bias", y, gain, bias, edges, channels_last)
    return _empty(y, list(y.shape), channels_last)


def _conv_edge_bias_backward(dy: Tensor, y: Tensor, gain: Tensor, geometry: list[int], edges: int,
                             channels_last: bool, deconv: bool) -> tuple[Tensor, Tensor, Tensor]:
    _check_edge("conv_edge_bias_backward", y, gain, gain, edges, channels_last)
    dx = _empty(dy, list(dy.shape), channels_last)
    grad_gain, grad_bias = torch.empty_like(gain), torch.empty_like(gain)
    with _direct.on_device(dy.device):
        edge_bias_object(geometry, int(y.shape[1]), y.dtype, channels_last, deconv).backward(
            _stored(dy, channels_last).data_ptr(), _stored(y, channels_last).data_ptr(), gain.contiguous().data_ptr(),
            dx.data_ptr(), grad_gain.data_ptr(), grad_bias.data_ptr(), int(y.shape[0]), _direct.stream(dy.device))
    return dx, grad_gain, grad_bias


conv_edge_bias_backward = torch.library.custom_op("bsjit::conv_edge_bias_backward", _conv_edge_bias_backward,
                                                  mutates_args=())


@conv_edge_bias_backward.register_fake
def _(dy, y, gain, geometry, edges, channels_last, deconv):
    _check_edge("conv_edge_bias_backward", y, gain, gain, edges, channels_last)
    return _empty(dy, list(dy.shape), channels_last), torch.empty_like(gain), torch.empty_like(gain)


def _setup_edge(ctx, inputs, output):
    y, gain, bias, *args = inputs
    ctx.save_for_backward(y, gain)
    ctx.args = args


def _edge_backward(ctx, grad):
    y, gain = ctx.saved_tensors
    dx, grad_gain, grad_bias = conv_edge_bias_backward(grad, y, gain, *ctx.args)
    return dx, grad_gain, grad_bias, None, None, None, None


torch.library.register_autograd("bsjit::conv_edge_bias", _edge_backward, setup_context=_setup_edge)
