"""The torch.ops.bsjit operators: block-sparse matmul's three products, registered with torch.library.

Each op has a fake (meta) implementation, so shapes propagate under FakeTensorMode, meta tensors
and torch.compile, and `bsjit::matmul` has its autograd registered, so torch.compile(fullgraph=True)
traces a model using it with no graph break. The real implementations launch bsjit's kernels on
torch's current stream and take every output from torch's allocator.

A layout reaches an op as an int handle (bsjit.layout: Layout.handle, a registry slot), with the
sizes the fake implementations need passed as ints, so no op reads the registry while tracing.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C, _direct
from ._objects import ObjectCache
from .layout import lookup

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_BLOCKS = (8, 16, 32, 64, 128)
FEATURE_AXES = ("last", "first")  # feature_axis 0: x is [..., C]; 1: x is [C, N]

# One bsjit.MatMul per (layout, block, dtype, feature axis, tf32, SM count).
_objects = ObjectCache(256)


def matmul_object(handle: int, block: int, dtype: torch.dtype, feature_axis: int, sms: int = 0) -> _C.MatMul:
    """The MatMul of a layout's kernels; sms > 0 plans its Hopper schedules for that many SMs (precompile
    for other GPUs), 0 for the GPU it runs on."""
    layout = lookup(handle)
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    key = (layout.hash, layout.shape, block, dtype, feature_axis, tf32, sms)
    return _objects.get(
        key, lambda: _C.MatMul(layout._layout, block, _DTYPES[dtype], FEATURE_AXES[feature_axis], tf32, sms=sms))


def _fail(op: str, message: str):
    raise ValueError(f"bsjit.{op}: {message}")


def _check_weight(op: str, w: Tensor) -> int:
    if w.dim() != 3 or w.shape[1] != w.shape[2]:
        _fail(op, f"the weight must be [blocks, b, b], got shape {tuple(w.shape)}")
    block = int(w.shape[1])
    if block not in _BLOCKS:
        _fail(op, f"block size {block} is not supported; expected one of {_BLOCKS}")
    if w.dtype not in _DTYPES:
        _fail(op, f"dtype {w.dtype} is not supported; expected float32, float16 or bfloat16")
    return block


def _check_activation(op: str, name: str, x: Tensor, features: int, feature_axis: int, w: Tensor) -> int:
    """Checks x against its feature count; returns N, the rows the kernel runs over."""
    if feature_axis not in (0, 1):
        _fail(op, f"feature_axis must be 0 (last) or 1 (first), got {feature_axis}")
    if x.dtype != w.dtype:
        _fail(op, f"{name} is {x.dtype} but the weight is {w.dtype}; both must have one dtype")
    if x.device != w.device:
        _fail(op, f"{name} is on {x.device} but the weight on {w.device}")
    if feature_axis == 0:
        if x.dim() < 1 or x.shape[-1] != features:
            _fail(op, f"{name} must be [..., {features}] (features last), got shape {tuple(x.shape)}")
        return x.numel() // features if features else 0
    if x.dim() != 2 or x.shape[0] != features:
        _fail(op, f"{name} must be [{features}, N] (features first), got shape {tuple(x.shape)}")
    return int(x.shape[1])


def _check_gate(op: str, gate: Optional[Tensor], w: Tensor) -> None:
    if gate is None:
        return
    if gate.dtype != torch.float32 or gate.dim() != 1 or gate.shape[0] != w.shape[0]:
        _fail(op, f"the gate must be float32 [{w.shape[0]}] (one per block), got {gate.dtype} {tuple(gate.shape)}")
    if gate.device != w.device:
        _fail(op, f"the gate is on {gate.device} but the weight on {w.device}")


def _out_shape(x: Tensor, features: int, feature_axis: int) -> list[int]:
    return [*x.shape[:-1], features] if feature_axis == 0 else [features, x.shape[1]]


def workspace(bytes_: int, device: torch.device) -> tuple[Optional[Tensor], int, int]:
    """A workspace of bytes_ from torch's allocator (bsjit then allocates nothing, as CUDA graph
    capture requires), its leading arrival counters zeroed (the kernels leave them zero): the tensor
    (None for 0 bytes, kept alive by the caller until the launch is enqueued), its address and size."""
    if not bytes_:
        return None, 0, 0
    w = torch.empty(bytes_, dtype=torch.uint8, device=device)
    w[: _C.MatMul.workspace_counter_bytes()].zero_()
    return w, w.data_ptr(), bytes_


def _launch(op: str, handle: int, w: Tensor, a: Tensor, b: Tensor, out: Tensor, n: int, gate: Optional[Tensor],
            feature_axis: int) -> None:
    if out.device.type != "cuda":
        _fail(op, f"bsjit runs on CUDA tensors; these are on {out.device}")
    mm = matmul_object(handle, int(w.shape[1]), w.dtype, feature_axis)
    with _direct.on_device(out.device):
        stream = _direct.stream(out.device)
        # the workspace of the kernels that split or pace their wave (0 bytes: none)
        bytes_ = mm.workspace_size(op, n, gate is not None)
        _held, ptr, size = workspace(bytes_, out.device)
        mm.run(op, a.data_ptr(), b.data_ptr(), out.data_ptr(), n, stream, False,
               gate.data_ptr() if gate is not None else 0, ptr, size)


# --- forward: y = x · W (W the layout's blocks, gate-scaled) ------------------------------------


def _matmul(x: Tensor, w: Tensor, layout: int, in_features: int, out_features: int, feature_axis: int,
            gate: Optional[Tensor]) -> Tensor:
    n = _check_forward(x, w, in_features, out_features, feature_axis, gate)
    return _product("forward", x, w, layout, out_features, feature_axis, gate, n)


matmul = torch.library.custom_op("bsjit::matmul", _matmul, mutates_args=())


def _product(op: str, a: Tensor, w: Tensor, layout: int, features: int, feature_axis: int, gate: Optional[Tensor],
             n: int) -> Tensor:
    """a · W (forward) or a · Wᵀ (backward-data) over n rows: `features` output features."""
    a = a.contiguous()
    out = a.new_empty(_out_shape(a, features, feature_axis))
    if n == 0 or w.shape[0] == 0:
        return out.zero_()
    _launch(op, layout, w, a, w.contiguous(), out, n, gate.contiguous() if gate is not None else None, feature_axis)
    return out


def _check_forward(x, w, in_features, out_features, feature_axis, gate) -> int:
    block = _check_weight("matmul", w)
    if in_features % block or out_features % block:
        _fail("matmul", f"features {in_features} → {out_features} are not multiples of the block size {block}")
    _check_gate("matmul", gate, w)
    return _check_activation("matmul", "x", x, in_features, feature_axis, w)


@matmul.register_fake
def _(x, w, layout, in_features, out_features, feature_axis, gate):
    _check_forward(x, w, in_features, out_features, feature_axis, gate)
    return x.new_empty(_out_shape(x, out_features, feature_axis))


# --- backward-data: dx = dy · Wᵀ ---------------------------------------------------------------


def _matmul_backward_data(dy: Tensor, w: Tensor, layout: int, in_features: int, out_features: int,
                          feature_axis: int, gate: Optional[Tensor]) -> Tensor:
    n = _check_backward_data(dy, w, in_features, out_features, feature_axis, gate)
    return _product("backward_data", dy, w, layout, in_features, feature_axis, gate, n)


matmul_backward_data = torch.library.custom_op("bsjit::matmul_backward_data", _matmul_backward_data,
                                               mutates_args=())


def _check_backward_data(dy, w, in_features, out_features, feature_axis, gate) -> int:
    _check_weight("matmul_backward_data", w)
    _check_gate("matmul_backward_data", gate, w)
    return _check_activation("matmul_backward_data", "dy", dy, out_features, feature_axis, w)


@matmul_backward_data.register_fake
def _(dy, w, layout, in_features, out_features, feature_axis, gate):
    _check_backward_data(dy, w, in_features, out_features, feature_axis, gate)
    return dy.new_empty(_out_shape(dy, in_features, feature_axis))


# --- backward-weight: dW = xᵀ · dy on the layout's blocks (gate-scaled) --------------------------


def _matmul_backward_weight(x: Tensor, dy: Tensor, w: Tensor, layout: int, in_features: int, out_features: int,
                            feature_axis: int, gate: Optional[Tensor]) -> Tensor:
    n = _check_backward_weight(x, dy, w, in_features, out_features, feature_axis, gate)
    dw = torch.empty_like(w, memory_format=torch.contiguous_format)
    if n == 0 or w.shape[0] == 0:
        return dw.zero_()
    _launch("backward_weight", layout, w, x.contiguous(), dy.contiguous(), dw, n,
            gate.contiguous() if gate is not None else None, feature_axis)
    return dw


matmul_backward_weight = torch.library.custom_op("bsjit::matmul_backward_weight", _matmul_backward_weight,
                                                 mutates_args=())


def _check_backward_weight(x, dy, w, in_features, out_features, feature_axis, gate) -> int:
    op = "matmul_backward_weight"
    _check_weight(op, w)
    _check_gate(op, gate, w)
    n = _check_activation(op, "x", x, in_features, feature_axis, w)
    if _check_activation(op, "dy", dy, out_features, feature_axis, w) != n:
        _fail(op, f"x {tuple(x.shape)} and dy {tuple(dy.shape)} have different numbers of rows")
    return n


@matmul_backward_weight.register_fake
def _(x, dy, w, layout, in_features, out_features, feature_axis, gate):
    _check_backward_weight(x, dy, w, in_features, out_features, feature_axis, gate)
    return torch.empty_like(w, memory_format=torch.contiguous_format)


# --- autograd of the forward --------------------------------------------------------------------


def _setup_matmul(ctx, inputs, output):
    x, w, layout, in_features, out_features, feature_axis, gate = inputs
    ctx.save_for_backward(x, w, gate)
    ctx.sizes = (layout, in_features, out_features, feature_axis)


def _matmul_backward(ctx, dy):
    x, w, gate = ctx.saved_tensors
    layout, c, k, axis = ctx.sizes
    direct = getattr(ctx, "direct", False)  # called by _MatMulFunction: call implementations, not ops
    backward_data = _matmul_backward_data if direct else matmul_backward_data
    backward_weight = _matmul_backward_weight if direct else matmul_backward_weight
    dx = dw = dgate = None
    if ctx.needs_input_grad[0]:
        dx = backward_data(dy, w, layout, c, k, axis, gate)
    gate_grad = gate is not None and ctx.needs_input_grad[6]
    if gate_grad:
        # y = x · (g ∘ W): dW = g ∘ (xᵀ dy) and dg = Σ W ∘ (xᵀ dy) over each block (blocksparse's gate_grad)
        g = backward_weight(x, dy, w, layout, c, k, axis, None).float()
        dgate = (g * w.float()).sum(dim=(1, 2))
        if ctx.needs_input_grad[1]:
            dw = (g * gate[:, None, None]).to(w.dtype)
    elif ctx.needs_input_grad[1]:
        dw = backward_weight(x, dy, w, layout, c, k, axis, gate)
    return dx, dw, None, None, None, None, dgate


torch.library.register_autograd("bsjit::matmul", _matmul_backward, setup_context=_setup_matmul)

_MatMulFunction = _direct.function("_MatMulFunction", _matmul, _setup_matmul, _matmul_backward)


def matmul_call(x: Tensor, w: Tensor, layout: int, in_features: int, out_features: int, feature_axis: int,
                gate: Optional[Tensor]) -> Tensor:
    """bsjit::matmul, run directly in eager mode on CUDA tensors (bsjit._direct) and as the op otherwise."""
    if _direct.eager(x, w, gate):
        if not _direct.records(x, w, gate):
            return _matmul(x, w, layout, in_features, out_features, feature_axis, gate)
        return _MatMulFunction.apply(x, w, layout, in_features, out_features, feature_axis, gate)
    return matmul(x, w, layout, in_features, out_features, feature_axis, gate)
