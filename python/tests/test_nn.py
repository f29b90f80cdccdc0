"""bsjit.nn.BlockSparseLinear without a GPU: initialization, dense round trips, state_dict, the meta
device, changing layouts, and torch.compile(fullgraph=True) tracing a model with no graph break."""

import numpy as np
import pytest
import torch

import bsjit
from bsjit.nn import BlockSparseLinear

B = 16


def random_mask(rows, cols, density, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.random((rows, cols)) < density
    m[np.arange(min(rows, cols)), np.arange(min(rows, cols))] = True
    return m


def test_shapes_and_init_like_nn_linear_per_column_fan_in():
    mask = np.zeros((8, 3), bool)
    mask[:, 0] = True  # column 0: 8 blocks feed it
    mask[0, 1] = True  # column 1: one block
    layer = BlockSparseLinear(mask, B)  # column 2: no input at all
    assert (layer.in_features, layer.out_features) == (8 * B, 3 * B)
    assert layer.weight.shape == (9, B, B)
    w = layer.weight.detach()
    col0 = [i for i, (_, c) in enumerate(layer.layout.coords()) if c == 0]
    assert w[col0].abs().max() <= 1 / np.sqrt(8 * B)
    assert w[col0].abs().max() > 0.9 / np.sqrt(8 * B)
    (col1,) = [i for i, (_, c) in enumerate(layer.layout.coords()) if c == 1]
    assert w[col1].abs().max() > 0.9 / np.sqrt(B)
    assert torch.all(layer.bias[2 * B:] == 0), "an output no input feeds gets no bias"
    assert layer.bias[:B].abs().max() <= 1 / np.sqrt(8 * B)


def test_from_dense_and_to_dense_round_trip():
    mask = random_mask(4, 6, 0.4)
    linear = torch.nn.Linear(4 * B, 6 * B)
    layer = BlockSparseLinear.from_dense(linear, mask, B)
    expanded = torch.from_numpy(np.kron(mask, np.ones((B, B)))).bool()
    torch.testing.assert_close(layer.to_dense(), linear.weight.detach().t() * expanded)
    torch.testing.assert_close(layer.bias, linear.bias)
    with pytest.raises(ValueError, match="features"):
        BlockSparseLinear.from_dense(torch.nn.Linear(10, 10), mask, B)


def test_state_dict_round_trip_restores_layout_and_values():
    a = BlockSparseLinear(random_mask(4, 4, 0.5, seed=1), B, gated=True)
    b = BlockSparseLinear(random_mask(4, 4, 0.5, seed=2), B, gated=True)
    assert a.layout != b.layout
    b.load_state_dict(a.state_dict())
    assert b.layout == a.layout
    torch.testing.assert_close(b.to_dense(), a.to_dense())
    assert "layout_mask" in a.state_dict()


def test_meta_device_then_reset_parameters():
    layer = BlockSparseLinear(random_mask(4, 4, 0.5), B, device="meta", dtype=torch.bfloat16)
    assert layer.weight.is_meta and layer.weight.dtype == torch.bfloat16
    assert layer.layout_mask.is_meta  # buffers live with the parameters (DDP broadcasts them)
    layer.to_empty(device="cpu")
    layer.reset_parameters()
    assert torch.isfinite(layer.weight).all() and layer.weight.abs().max() > 0
    assert torch.equal(layer.layout_mask, layer.layout.to_dense_mask())


def test_set_layout_keeps_shared_blocks_and_handle():
    old = np.eye(4, dtype=bool)
    new = old.copy()
    new[0, 0] = False
    new[0, 3] = True
    layer = BlockSparseLinear(old, B)
    handle = layer._handle
    before = layer.to_dense().detach()
    layer.set_layout(new)
    assert layer._handle == handle and layer.layout == bsjit.Layout(new)
    assert layer.weight.shape == (4, B, B)
    after = layer.to_dense().detach()
    torch.testing.assert_close(after[B:, B:], before[B:, B:])
    assert torch.all(after[:B] == 0), "block (0, 0) is gone, block (0, 3) starts at zero"
    assert torch.equal(layer.layout_mask, torch.from_numpy(new))
    # gates follow their blocks; a new block's starts at one
    gated = BlockSparseLinear(old, B, gated=True)
    with torch.no_grad():
        gated.gate.copy_(torch.tensor([2.0, 3.0, 4.0, 5.0]))
    gated.set_layout(new)  # blocks (0, 3), (1, 1), (2, 2), (3, 3)
    assert gated.gate.tolist() == [1.0, 3.0, 4.0, 5.0]


def test_ortho_and_identity_init():
    layer = BlockSparseLinear(random_mask(6, 3, 0.6), B, bias=False)
    layer.ortho_init()
    w = layer.to_dense().detach()
    for c in range(3):
        col = w[:, c * B:(c + 1) * B]
        fan_in = int((col.abs().sum(1) > 0).sum())
        if fan_in >= B:
            torch.testing.assert_close(col.t() @ col, torch.eye(B), atol=1e-5, rtol=0)
    layer.identity_init(2.0)
    x = torch.randn(5, 6 * B)
    torch.testing.assert_close((x @ layer.to_dense())[:, :3 * B], 2 * x[:, :3 * B])


class TwoLayers(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.a = BlockSparseLinear(random_mask(4, 8, 0.5), B, device=device)
        self.b = BlockSparseLinear(random_mask(8, 4, 0.5, seed=3), B, device=device, gated=True)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_torch_compile_fullgraph_traces_forward_and_backward():
    model = TwoLayers("meta")
    x = torch.empty(32, 4 * B, device="meta", requires_grad=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    y = compiled(x)
    assert y.shape == (32, 4 * B)
    y.sum().backward()
    assert model.a.weight.grad.shape == model.a.weight.shape
    assert model.b.gate.grad.shape == model.b.gate.shape
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("bsjit.matmul" in t for t in targets) == 2, targets


def test_export_holds_the_ops():
    model = TwoLayers("meta")
    ep = torch.export.export(model, (torch.empty(8, 4 * B, device="meta"),))
    assert "torch.ops.bsjit.matmul" in str(ep.graph)


def test_precompile_a_model_without_a_gpu(tmp_path):
    """bsjit.precompile compiles a model's kernels for an arch on a machine without a GPU, into the
    cache directory; a second call finds them there and compiles nothing."""
    previous = bsjit.cache_directory()
    bsjit.set_cache_directory(str(tmp_path))
    try:
        model = torch.nn.Sequential(BlockSparseLinear(random_mask(4, 4, 0.5, 7), B, dtype=torch.bfloat16))
        before = bsjit.cache_stats()["compiles"]
        assert bsjit.precompile(model, "sm_80", ops=["forward"], calls="plain") == 1
        assert bsjit.cache_stats()["compiles"] > before
        assert any(p.suffix == ".bsjit" for p in tmp_path.iterdir())
        assert bsjit.precompile(model, "sm_80", ops=["forward"], calls="plain") == 0
        with pytest.raises(bsjit.Error, match="sm_99"):
            bsjit.precompile(model, "sm_99", ops=["forward"])
        # Hopper kernels planned for another SM count (H100 PCIe): their own cache entries
        assert bsjit.precompile(model, "sm_90a", ops=["forward"], calls="plain", sms=114) == 1
        assert bsjit.precompile(model, "sm_90a", ops=["forward"], calls="plain", sms=114) == 0
        assert any("-sm114-" in p.name for p in tmp_path.iterdir())
        with pytest.raises(bsjit.Error, match="sms 300"):
            bsjit.precompile(model, "sm_90a", ops=["forward"], sms=300)
    finally:
        bsjit.set_cache_directory(previous)
