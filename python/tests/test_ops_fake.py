"""The torch.ops.bsjit operators without a GPU: registration, shape propagation under FakeTensorMode
and on the meta device (fake CUDA tensors included), errors, and autograd's graph."""

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import bsjit
import bsjit.functional as F

MASK = np.array([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 0, 0]], dtype=bool)  # 3 × 4 blocks, 6 stored
B = 32
C, K = 3 * B, 4 * B


def test_ops_are_registered():
    for name in ("matmul", "matmul_backward_data", "matmul_backward_weight"):
        assert hasattr(torch.ops.bsjit, name), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", ["meta", "fake-cuda"])
def test_shapes_propagate(dtype, device):
    layout = bsjit.Layout(MASK)
    layout.handle  # registered outside: the registry's lock cannot be traced

    def run():
        dev = "cuda" if device == "fake-cuda" else "meta"
        x = torch.empty(5, 7, C, dtype=dtype, device=dev)
        w = torch.empty(layout.blocks, B, B, dtype=dtype, device=dev)
        y = F.matmul(x, w, layout)
        assert y.shape == (5, 7, K) and y.dtype == dtype and y.device.type == dev
        dy = torch.empty_like(y)
        assert F.matmul_backward_data(dy, w, layout).shape == x.shape
        assert F.matmul_backward_weight(x, dy, w, layout).shape == w.shape
        xt = torch.empty(C, 11, dtype=dtype, device=dev)
        assert F.matmul(xt, w, layout, feature_axis="first").shape == (K, 11)

    if device == "fake-cuda":
        with FakeTensorMode(allow_non_fake_inputs=False):
            run()
    else:
        run()


def test_autograd_through_meta_tensors():
    layout = bsjit.Layout(MASK)
    layout.handle  # registered outside: the registry's lock cannot be traced
    x = torch.empty(16, C, device="meta", requires_grad=True)
    w = torch.empty(layout.blocks, B, B, device="meta", requires_grad=True)
    gate = torch.empty(layout.blocks, device="meta", requires_grad=True)
    y = F.matmul(x, w, layout, gate=gate)
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and gate.grad.shape == gate.shape


def wrong_inputs(layout, device):
    """(x, w, keyword arguments, the error's pattern) of matmul calls refused before any kernel."""
    w = torch.empty(layout.blocks, B, B, device=device)
    return [
        (torch.empty(4, C + 1, device=device), w, {}, r"must be \[\.\.\., 96\]"),
        (torch.empty(4, C, device=device, dtype=torch.bfloat16), w, {}, "one dtype"),
        (torch.empty(4, 72, device=device), torch.empty(6, 24, 24, device=device), {}, "block size 24"),
        (torch.empty(4, C, device=device), w, {"gate": torch.empty(5, device=device)}, "float32 \\[6\\]"),
        (torch.empty(4, C, device=device), w, {"feature_axis": "middle"}, "feature_axis"),
        (torch.empty(4, C, dtype=torch.float64, device=device),
         torch.empty(6, B, B, dtype=torch.float64, device=device), {}, "dtype torch.float64"),
    ]


def test_wrong_inputs_raise_with_the_reason():
    layout = bsjit.Layout(MASK)
    layout.handle  # registered outside: the registry's lock cannot be traced
    for x, w, kwargs, match in wrong_inputs(layout, "meta"):
        with pytest.raises(ValueError, match=match):
            F.matmul(x, w, layout, **kwargs)


def test_cpu_tensors_are_refused_not_run():
    layout = bsjit.Layout(MASK)
    layout.handle  # registered outside: the registry's lock cannot be traced
    with pytest.raises(ValueError, match="CUDA tensors"):
        F.matmul(torch.randn(4, C), torch.randn(layout.blocks, B, B), layout)


def test_autotune_needs_a_gpu_and_checks_its_inputs_first():
    layout = bsjit.Layout(MASK)
    layout.handle  # registered outside: the registry's lock cannot be traced
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # autotune times kernels on a GPU
        F.matmul_autotune(torch.randn(4, C), torch.randn(layout.blocks, B, B), layout)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        bsjit.nn.BlockSparseLinear(MASK, B, device="meta").autotune(torch.empty(4, C, device="meta"))
    with FakeTensorMode():  # CUDA tensors without a GPU: the checks run before any kernel
        for x, w, kwargs, match in wrong_inputs(layout, "cuda"):
            if "gate" not in kwargs:  # autotune takes no gate
                with pytest.raises(ValueError, match=match):
                    F.matmul_autotune(x, w, layout, **kwargs)
        with pytest.raises(ValueError, match="no rows"):
            F.matmul_autotune(torch.empty(0, C, device="cuda"), torch.empty(layout.blocks, B, B, device="cuda"),
                              layout)


def test_calls_that_autograd_would_not_record_skip_the_function():
    """bsjit._direct.records: an eager call runs its implementation alone where grad mode is off or
    no tensor given requires grad (None skipped), and through the autograd.Function otherwise."""
    from bsjit import _direct

    plain, tracked = torch.empty(4), torch.empty(4, requires_grad=True)
    assert not _direct.records(plain, None, plain)
    assert _direct.records(plain, None, tracked)
    with torch.no_grad():
        assert not _direct.records(plain, tracked)
    with torch.inference_mode():
        assert not _direct.records(tracked)


def test_eager_calls_take_the_op_wherever_something_needs_it():
    """The public calls skip torch's op dispatch only for plain CUDA tensors in eager mode
    (bsjit._direct); meta and fake tensors, dispatch modes and torch.compile see the registered op."""
    from bsjit import _direct

    meta = torch.empty(4, device="meta")
    assert not _direct.eager(meta)
    assert not _direct.eager(torch.empty(4))  # CPU: the op, whose implementation gives bsjit's error
    with FakeTensorMode():
        fake = torch.empty(4, device="cuda")
        assert not _direct.eager(fake)
    seen = []

    def backend(gm, inputs):
        seen.append(str(gm.graph))
        return gm

    layout = bsjit.Layout(MASK)
    layout.handle  # registered outside: the registry's lock cannot be traced

    @torch.compile(backend=backend, fullgraph=True)
    def f(x, w):
        return F.matmul(x, w, layout)

    f(torch.empty(8, C, device="meta"), torch.empty(6, B, B, device="meta"))
    assert "bsjit.matmul" in seen[0]
