"""Eager calls past torch's op dispatch.

A torch.library custom op defined in Python costs some 50-100 us of host time per call in eager mode
(its dispatch, autograd and alias checks; an H100 host measured 52 us for BlockSparseLinear's
forward against 7 us for the extension's MatMul.run, tools/bench/dispatch_overhead.py, 2026-12-05),
more than the kernel itself on small problems. So where nothing needs the op (no torch.compile
tracing, no dispatch mode such as FakeTensorMode, plain CUDA tensors), the public calls run the op's
implementation and its registered backward as a torch.autograd.Function instead; torch.compile,
export and fake tensors still see the registered ops.
"""

from __future__ import annotations

import contextlib

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def eager(*tensors) -> bool:
    """True where a call may run its implementation directly: eager mode, no dispatch mode active,
    and every tensor given (None skipped) a plain CUDA tensor."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    return all(t is None or (type(t) in _PLAIN and t.is_cuda) for t in tensors)


def records(*tensors) -> bool:
    """True where autograd would record a call on these tensors (None skipped): grad mode on and one
    of them requiring grad. Where it would not, the public calls run the implementation alone: an
    autograd.Function's apply costs some 10-20 us of host time even when it records nothing."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def function(name: str, impl, setup_context, backward) -> type:
    """A torch.autograd.Function running impl with the op's setup_context and backward (as given to
    torch.library.register_autograd); ctx.direct tells the backward to call implementations too."""

    def forward(ctx, *inputs):
        ctx.direct = True
        output = impl(*inputs)
        setup_context(ctx, inputs, output)
        return output

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})


def stream(device: torch.device) -> int:
    """The handle of torch's current stream on a CUDA device."""
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else
                                              torch.cuda.current_device())


def on_device(device: torch.device):
    """A context in which device's CUDA context is current (bsjit launches in the current one)."""
    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)
