"""bsjit's torch ops on a GPU (skipped without one): every op and gradient against the dense torch
computation with the mask expanded, in double precision; torch.library.opcheck; torch.compile
training steps; CUDA graph capture and replay; two streams; a layout change with no NVRTC run."""

import numpy as np
import pytest
import torch

import bsjit
import bsjit.functional as F
from bsjit.layout import as_masks, mask_set_handle
from bsjit.nn import BlockSparseLinear

from conftest import requires_gpu

pytestmark = requires_gpu

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def random_mask(rows, cols, density, seed):
    rng = np.random.default_rng(seed)
    m = rng.random((rows, cols)) < density
    m[0, 0] = True
    return m


def dense_weight(w, layout, block, gate=None):
    w = w.double() if gate is None else w.double() * gate.double()[:, None, None]
    out = torch.zeros(layout.rows * block, layout.cols * block, dtype=torch.float64, device=w.device)
    for i, (r, c) in enumerate(layout.coords()):
        out[r * block:(r + 1) * block, c * block:(c + 1) * block] = w[i]
    return out


def blocks_of(dense, layout, block):
    return torch.stack([dense[r * block:(r + 1) * block, c * block:(c + 1) * block] for r, c in layout.coords()])


def rel_err(got, want):
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("feature_axis", ["last", "first"])
@pytest.mark.parametrize("gated", [False, True])
def test_matmul_autotune_keeps_the_fastest_shape_and_stays_correct(feature_axis, gated):
    """autotune times every tile shape of each op at x's rows, keeps the fastest, and the layer
    still matches the dense computation (a gated layer runs the general kernel, which takes the
    same choice)."""
    torch.manual_seed(3)
    block = 64
    layer = BlockSparseLinear(random_mask(6, 5, 0.5, seed=11), block, bias=False, feature_axis=feature_axis,
                              gated=gated, device="cuda", dtype=torch.bfloat16)
    if gated:
        with torch.no_grad():
            layer.gate.uniform_(0.5, 1.5)
    x = torch.randn(1000, layer.in_features, device="cuda", dtype=torch.bfloat16)
    if feature_axis == "first":
        x = x.t().contiguous()
    x.requires_grad_()
    result = layer.autotune(x)
    assert set(result) == {"forward", "backward_data", "backward_weight"}
    for op, (kept, times) in result.items():
        names = [name for name, _ in times]
        assert kept in names, op
        assert len(set(names)) == len(names), op
        assert all(ms > 0 for _, ms in times), op
        assert dict(times)[kept] == min(ms for _, ms in times), op
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    layout = layer.layout
    gate = layer.gate.detach() if gated else None
    W = dense_weight(layer.weight.detach(), layout, block, gate)
    xd = x.detach().double() if feature_axis == "last" else x.detach().double().t()
    dyd = dy.double() if feature_axis == "last" else dy.double().t()
    g = gate.double()[:, None, None] if gated else 1.0
    got_y = y.detach() if feature_axis == "last" else y.detach().t()
    got_dx = x.grad if feature_axis == "last" else x.grad.t()
    assert rel_err(got_y, xd @ W) < 1e-2
    assert rel_err(got_dx, dyd @ W.t()) < 1e-2
    assert rel_err(layer.weight.grad, blocks_of(xd.t() @ dyd, layout, block) * g) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("feature_axis", ["last", "first"])
@pytest.mark.parametrize("gated", [False, True])
def test_ops_and_gradients_match_the_dense_computation(dtype, block, feature_axis, gated):
    if feature_axis == "first" and dtype != torch.float32 and block > 64:
        pytest.skip("covered at smaller blocks")
    torch.manual_seed(block)
    layout = bsjit.Layout(random_mask(5, 7, 0.4, seed=block))
    n, C, K = 300, layout.rows * block, layout.cols * block
    x = torch.randn(n, C, device="cuda", dtype=dtype)
    if feature_axis == "first":
        x = x.t().contiguous()
    w = torch.randn(layout.blocks, block, block, device="cuda", dtype=dtype) / block
    gate = torch.rand(layout.blocks, device="cuda") if gated else None
    x.requires_grad_(True), w.requires_grad_(True)
    if gate is not None:
        gate.requires_grad_(True)
    y = F.matmul(x, w, layout, feature_axis=feature_axis, gate=gate)
    dy = torch.randn_like(y)
    y.backward(dy)
    W = dense_weight(w.detach(), layout, block, gate.detach() if gated else None)
    xd = x.detach().double() if feature_axis == "last" else x.detach().double().t()
    dyd = dy.double() if feature_axis == "last" else dy.double().t()
    want_y = xd @ W
    want_dx = dyd @ W.t()
    grad_dense = xd.t() @ dyd
    g = gate.detach().double()[:, None, None] if gated else 1.0
    want_dw = blocks_of(grad_dense, layout, block) * g
    got_y = y.detach() if feature_axis == "last" else y.detach().t()
    got_dx = x.grad if feature_axis == "last" else x.grad.t()
    assert rel_err(got_y, want_y) < TOL[dtype]
    assert rel_err(got_dx, want_dx) < TOL[dtype]
    assert rel_err(w.grad, want_dw) < TOL[dtype]
    if gated:
        want_dg = (blocks_of(grad_dense, layout, block) * w.detach().double()).sum((1, 2))
        assert rel_err(gate.grad, want_dg) < TOL[dtype]


def test_opcheck_every_op():
    layout = bsjit.Layout(random_mask(4, 4, 0.5, seed=0))
    b = 32
    x = torch.randn(64, 4 * b, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(layout.blocks, b, b, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 4 * b, device="cuda", dtype=torch.bfloat16)
    h, c, k = layout.handle, 4 * b, 4 * b
    torch.library.opcheck(torch.ops.bsjit.matmul, (x, w, h, c, k, 0, None))
    torch.library.opcheck(torch.ops.bsjit.matmul_backward_data, (dy, w.detach(), h, c, k, 0, None))
    torch.library.opcheck(torch.ops.bsjit.matmul_backward_weight, (x.detach(), dy, w.detach(), h, c, k, 0, None))


def make_model(dtype=torch.bfloat16):
    return torch.nn.Sequential(
        BlockSparseLinear(random_mask(8, 16, 0.3, 1), 32, device="cuda", dtype=dtype),
        torch.nn.GELU(),
        BlockSparseLinear(random_mask(16, 8, 0.3, 2), 32, device="cuda", dtype=dtype),
    )


def test_torch_compile_training_steps_match_eager():
    torch.manual_seed(0)
    eager = make_model()
    compiled_model = make_model()
    compiled_model.load_state_dict(eager.state_dict())
    step = torch.compile(lambda m, x: m(x).float().pow(2).mean(), fullgraph=True)
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        for m, loss_of in ((eager, lambda m, x: m(x).float().pow(2).mean()), (compiled_model, step)):
            m.zero_grad()
            loss_of(m, x).backward()
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.1 * p.grad
    for a, b in zip(eager.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_cuda_graph_capture_and_replay():
    model = make_model()
    x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    bsjit.warmup(model)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # the warm-up runs torch wants before capture
        for _ in range(2):
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = model(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(y, model(x), atol=1e-2, rtol=1e-2)


def test_two_streams_give_the_results_of_one():
    layout = bsjit.Layout(random_mask(8, 8, 0.5, 3))
    w = torch.randn(layout.blocks, 32, 32, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(512, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    want = [F.matmul(x, w, layout) for x in xs]
    streams = [torch.cuda.Stream() for _ in xs]
    got = []
    for s, x in zip(streams, xs):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got.append(F.matmul(x, w, layout))
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


def test_a_new_layout_of_a_compiled_shape_costs_no_nvrtc_run():
    """Layouts whose kernels have one source share one compile: here the mask with its block columns
    moved cyclically (each column keeps its block count), as the C++ test MatMulGpuSharedCode does."""
    mask = random_mask(8, 8, 0.5, 4)
    layer = BlockSparseLinear(mask, 32, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    layer(x).sum().backward()
    before = bsjit.cache_stats()
    for shift in range(1, 4):
        layer.set_layout(np.roll(mask, shift, axis=1))
        layer(x).sum().backward()
    torch.cuda.synchronize()
    after = bsjit.cache_stats()
    assert after["compiles"] == before["compiles"]
    assert after["shared_compiles"] > before["shared_compiles"]


def test_backward_weight_takes_its_workspace_from_torch():
    """A layout of few blocks splits backward-weight along N: its workspace comes from torch's
    allocator (bsjit allocates none), so the call can be captured in a CUDA graph."""
    layout = bsjit.Layout.from_coords(8, 8, [(0, 0), (3, 5), (7, 7)])
    x = torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(3, 64, 64, device="cuda", dtype=torch.bfloat16)
    want = F.matmul_backward_weight(x, dy, w, layout)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        F.matmul_backward_weight(x, dy, w, layout)  # loaded before capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        got = F.matmul_backward_weight(x, dy, w, layout)
    graph.replay()
    torch.testing.assert_close(got, want)
    dense = x.double().t() @ dy.double()
    blocks = torch.stack([dense[r * 64:(r + 1) * 64, c * 64:(c + 1) * 64] for r, c in layout.coords()])
    assert rel_err(want, blocks) < TOL[torch.bfloat16]


def dense_attention(q, k, v, masks, block, causal, pad, scale, order, keep=None):
    """The double-precision reference: [b, h, s, d] scores with the block masks expanded (and element
    masks keep [h or 1, sq, sk], True keeping a pair)."""
    if order == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = q.double(), k.double(), v.double()
    h, sq, sk = q.shape[1], q.shape[2], k.shape[2]
    allowed = torch.stack([torch.from_numpy(np.kron(m.to_numpy(), np.ones((block, block)))).bool() for m in masks])
    allowed = allowed.expand(h, sq, sk).to(q.device)
    if causal:
        allowed = allowed & torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
    if keep is not None:
        allowed = allowed & keep.to(q.device)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    if pad is not None:
        s = s.masked_fill(pad[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = p @ v
    return out.transpose(1, 2) if order == "bshd" else out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("order", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block,d", [(64, 64), (128, 128), (32, 64)])
def test_attention_and_gradients_match_the_dense_computation(dtype, order, causal, block, d):
    torch.manual_seed(block + d)
    b, h, blocks = 2, 3, 4
    s = blocks * block
    rng = np.random.default_rng(block)
    per_head = [bsjit.Layout(np.tril(np.ones((blocks, blocks), bool))),
                bsjit.Layout((rng.random((blocks, blocks)) < 0.5) | np.eye(blocks, dtype=bool)),
                bsjit.Layout(np.eye(blocks, dtype=bool))]
    shape = (b, s, h, d) if order == "bshd" else (b, h, s, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    pad = torch.zeros(b, s, dtype=torch.bool, device="cuda")
    pad[0, -5:] = True
    out, lse = F.attention(q, k, v, per_head, block, causal=causal, key_padding_mask=pad, order=order,
                           return_lse=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = dense_attention(qd, kd, vd, per_head, block, causal, pad, d ** -0.5, order)
    want.backward(dout.double())
    assert rel_err(out.detach(), want.detach()) < 1e-2
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert rel_err(got, ref) < 1e-2
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32


@pytest.mark.parametrize("order", ["bshd", "bhsd"])
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("block,d", [(64, 64), (128, 128), (32, 64)])
def test_grouped_query_attention_matches_repeated_keys(order, kv_heads, block, d):
    """k and v with fewer heads than q: the dense computation on k and v repeated over each group,
    their gradients summed back; the decomposed ops alike."""
    torch.manual_seed(7 * block + kv_heads)
    b, h, blocks = 2, 4, 4
    s = blocks * block
    mask = bsjit.Layout(np.tril(np.ones((blocks, blocks), bool)))
    heads_dim = 2 if order == "bshd" else 1
    q_shape = (b, s, h, d) if order == "bshd" else (b, h, s, d)
    kv_shape = (b, s, kv_heads, d) if order == "bshd" else (b, kv_heads, s, d)
    q = torch.randn(q_shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(kv_shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = F.attention(q, k, v, mask, block, causal=True, order=order)
    dout = torch.randn_like(out)
    out.backward(dout)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    group = h // kv_heads
    want = dense_attention(qd, kd.repeat_interleave(group, heads_dim), vd.repeat_interleave(group, heads_dim),
                           [mask], block, True, None, d ** -0.5, order)
    want.backward(dout.double())
    assert rel_err(out.detach(), want.detach()) < 1e-2
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert got.shape == ref.shape and rel_err(got, ref) < 1e-2
    if block == 64:
        from bsjit.nn import DecomposedAttention

        ops = DecomposedAttention(mask, block, d, causal=True, order=order)
        q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out2 = ops(q2, k2, v2)
        out2.backward(dout)
        assert rel_err(out2.detach(), want.detach()) < 1e-2
        for got, ref in ((q2.grad, qd.grad), (k2.grad, kd.grad), (v2.grad, vd.grad)):
            assert rel_err(got, ref) < 1e-2


def test_attention_module_compiles_and_captures():
    layer = bsjit.nn.BlockSparseAttention(np.tril(np.ones((8, 8), bool)), 64, causal=True)
    q, k, v = (torch.randn(2, 512, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    compiled = torch.compile(layer, fullgraph=True)
    compiled(q, k, v).sum().backward()
    eager_grad = q.grad.clone()
    q.grad = None
    layer(q, k, v).sum().backward()
    torch.testing.assert_close(q.grad, eager_grad)
    torch.library.opcheck(torch.ops.bsjit.attention,
                          (q.detach(), k.detach(), v.detach(), layer._handle, 64, True, 0, 0.0, None))
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        layer(q, k, v).sum().backward()  # loaded before capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        out = layer(q, k, v)
        out.sum().backward()
    graph.replay()
    torch.testing.assert_close(out, layer(q, k, v))


@pytest.mark.parametrize("order", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
def test_decomposed_attention_matches_the_dense_computation(order, causal):
    from bsjit.nn import DecomposedAttention

    torch.manual_seed(7)
    block, d, b, h, blocks = 64, 64, 2, 3, 4
    s = blocks * block
    rng = np.random.default_rng(3)
    per_head = [bsjit.Layout(np.tril(np.ones((blocks, blocks), bool))),
                bsjit.Layout((rng.random((blocks, blocks)) < 0.5) | np.eye(blocks, dtype=bool)),
                bsjit.Layout(np.eye(blocks, dtype=bool))]
    shape = (b, s, h, d) if order == "bshd" else (b, h, s, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    ops = DecomposedAttention(per_head, block, d, causal=causal, order=order)
    probs = ops.softmax(ops.scores(q, k))
    out = ops.probs_v(probs, v)
    dout = torch.randn_like(out)
    out.backward(dout)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = dense_attention(qd, kd, vd, per_head, block, causal, None, d ** -0.5, order)
    want.backward(dout.double())
    assert rel_err(out.detach(), want.detach()) < 1e-2
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert rel_err(got, ref) < 1e-2
    fused = F.attention(q.detach(), k.detach(), v.detach(), per_head, block, causal=causal, order=order)
    assert rel_err(out.detach(), fused.double()) < 1e-2


def test_element_masks_match_the_dense_computation():
    """DecomposedAttention's element masks (one per head, over one shared block mask) against the
    dense computation with both masks expanded; forward and gradients."""
    from bsjit.nn import DecomposedAttention

    torch.manual_seed(11)
    block, d, b, h, blocks = 32, 64, 2, 3, 4
    s = blocks * block
    block_mask = np.tril(np.ones((blocks, blocks), bool))
    keep = torch.rand(h, s, s) < 0.7
    keep[:, torch.arange(s), torch.arange(s)] = True  # no row without a key
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    ops = DecomposedAttention(block_mask, block, d, element_mask=keep)
    out = ops(q, k, v)
    dout = torch.randn_like(out)
    out.backward(dout)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = dense_attention(qd, kd, vd, [bsjit.Layout(block_mask)], block, False, None, d ** -0.5, "bshd", keep)
    want.backward(dout.double())
    assert rel_err(out.detach(), want.detach()) < 1e-2
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert rel_err(got, ref) < 1e-2


def test_warmup_loads_every_kernel_of_a_model_with_attention():
    """After bsjit.warmup, a training step of a model with linear and attention modules compiles
    and loads nothing new."""
    from bsjit.nn import BlockSparseAttention, BlockSparseLinear

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = BlockSparseLinear(random_mask(4, 4, 0.5, 5), 64, device="cuda", dtype=torch.bfloat16)
            self.attn = BlockSparseAttention(np.tril(np.ones((4, 4), bool)), 64, causal=True)

        def forward(self, x):
            y = self.proj(x).view(2, 256, 4, 64)
            return self.attn(y, y, y)

    model = Block()
    bsjit.warmup(model, head_dim=64)
    before = bsjit.cache_stats()
    model(torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)).sum().backward()
    torch.cuda.synchronize()
    after = bsjit.cache_stats()
    assert after["compiles"] == before["compiles"] and after["disk_hits"] == before["disk_hits"]


def test_direct_eager_calls_match_the_registered_ops():
    """In eager mode the public calls run the ops' implementations as an autograd.Function
    (bsjit._direct); outputs and gradients are those of the registered ops, bit for bit."""
    from bsjit import _attention, _direct, _ops

    layout = bsjit.Layout(random_mask(4, 6, 0.5, 9))
    x = torch.randn(200, 4 * 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(layout.blocks, 64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gate = torch.rand(layout.blocks, device="cuda", requires_grad=True)
    assert _direct.eager(x, w, gate)
    results = []
    for call in (_ops.matmul_call, _ops.matmul):
        y = call(x, w, layout.handle, 4 * 64, 6 * 64, 0, gate)
        y.backward(torch.ones_like(y))
        results.append([y.detach(), x.grad, w.grad, gate.grad])
        x.grad = w.grad = gate.grad = None
    for direct, op in zip(*results):
        assert torch.equal(direct, op)
    masks = mask_set_handle(as_masks(np.tril(np.ones((4, 4), bool))))
    q, k, v = (torch.randn(2, 256, 3, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    results = []
    for call in (_attention.attention_call, _attention.attention):
        out, lse = call(q, k, v, masks, 64, True, 0, 0.0, None)
        out.backward(torch.ones_like(out))
        results.append([out.detach(), lse, q.grad, k.grad, v.grad])
        q.grad = k.grad = v.grad = None
    for direct, op in zip(*results):
        assert torch.equal(direct, op)
    # where autograd records nothing (no grad mode, or nothing requiring grad) the implementations
    # run alone: the same outputs, no graph
    expected = _ops.matmul(x, w, layout.handle, 4 * 64, 6 * 64, 0, gate).detach()
    with torch.no_grad():
        y = _ops.matmul_call(x, w, layout.handle, 4 * 64, 6 * 64, 0, gate)
    assert y.grad_fn is None and torch.equal(y, expected)
    y = _ops.matmul_call(x.detach(), w.detach(), layout.handle, 4 * 64, 6 * 64, 0, gate.detach())
    assert y.grad_fn is None and torch.equal(y, expected)
    expected = _attention.attention(q, k, v, masks, 64, True, 0, 0.0, None)[0].detach()
    with torch.no_grad():
        out, _ = _attention.attention_call(q, k, v, masks, 64, True, 0, 0.0, None)
    assert out.grad_fn is None and torch.equal(out, expected)


# --- convolution ---------------------------------------------------------------------------------

_TORCH_CONV = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}
_TORCH_DECONV = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
                 3: torch.nn.functional.conv_transpose3d}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_conv_and_gradients_match_torch_on_the_dense_filter(dtype, dims, channels_last, gated):
    mask = random_mask(3, 4, 0.5, 7 + dims)
    module = {1: bsjit.nn.BlockSparseConv1d, 2: bsjit.nn.BlockSparseConv2d, 3: bsjit.nn.BlockSparseConv3d}[dims]
    layer = module(mask, 3, stride=2, padding=1, dilation=1, block=16, gated=gated, device="cuda", dtype=dtype)
    if gated:
        with torch.no_grad():
            layer.gate.copy_(torch.linspace(-1.5, 2.0, layer.gate.numel()))
            layer.gate[1] = 0
    x = torch.randn(3, 48, *([7, 9, 8][3 - dims:]), device="cuda", dtype=dtype)
    if channels_last:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    x.requires_grad_()
    y = layer(x)
    assert bsjit.functional._is_channels_last(y) == channels_last
    dy = torch.randn_like(y)
    y.backward(dy)
    # the reference: torch's convolution in double on the module's filter made dense
    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    y64 = _TORCH_CONV[dims](x64, layer.to_dense(w64), layer.bias.double(), stride=2, padding=1)
    y64.backward(dy.double())
    tol = TOL[dtype]
    assert rel_err(y.double(), y64) < tol
    assert rel_err(x.grad.double(), x64.grad) < tol
    assert rel_err(layer.weight.grad.double(), w64.grad) < tol


def test_conv_cuda_graph_captures_on_a_stream_bsjit_has_not_seen():
    """The conv ops stage in workspaces from torch's allocator (Conv::workspace_size), so capturing
    them on torch's capture stream allocates nothing; a scratch of bsjit's own per stream would be
    allocated there at its first call, which capture forbids. A 3 × 3 convolution on the tensor
    cores and a 1 × 1 one that runs as a matmul, forward and both gradients."""
    model = torch.nn.Sequential(
        bsjit.nn.BlockSparseConv2d(random_mask(4, 4, 0.5, 21), 3, padding=1, block=64, device="cuda",
                                   dtype=torch.bfloat16),
        bsjit.nn.BlockSparseConv2d(random_mask(4, 4, 0.5, 22), 1, block=64, device="cuda", dtype=torch.bfloat16))
    x = torch.randn(2, 256, 8, 8, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    x.requires_grad_()
    dy = torch.randn(2, 256, 8, 8, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    weights = [m.weight for m in model]

    def step():
        y = model(x)
        return (y, *torch.autograd.grad(y, [x, *weights], dy))

    step()  # one eager call on the current stream: kernels loaded, the 1 × 1 block order uploaded
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
    graph.replay()
    for got, want in zip(captured, step()):
        assert rel_err(got.double(), want.double()) < 1e-2


@pytest.mark.parametrize("transposed", [False, True])
def test_conv_autotune_keeps_the_fastest_kernel_and_stays_correct(transposed):
    """autotune times every kernel of each op at x's shape (on an H100/H200 at b = 64: the kernels
    fed by TMA where they apply, the warpgroup ones and mma.sync), keeps the fastest, and the module
    still matches torch's convolution on its dense filter with the kept kernels."""
    module = bsjit.nn.BlockSparseConvTranspose2d if transposed else bsjit.nn.BlockSparseConv2d
    layer = module(random_mask(2, 3, 0.6, 23), 3, padding=1, block=64, bias=False, device="cuda",
                   dtype=torch.bfloat16)
    x = torch.randn(2, layer.in_channels, 10, 12, device="cuda", dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last).requires_grad_()
    result = layer.autotune(x)
    assert set(result) == {"fprop", "bprop", "updat"}
    for op, (kept, times) in result.items():
        names = [name for name, _ in times]
        assert kept in names, op
        assert all(ms > 0 for _, ms in times), op
        assert dict(times)[kept] == min(ms for _, ms in times), op
        if torch.cuda.get_device_capability() == (9, 0):
            assert {"wgmma", "mma.sync"} <= set(names), op
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    conv = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    y64 = conv(x64, layer.to_dense(w64), padding=1)
    y64.backward(dy.double())
    assert rel_err(y.double(), y64) < 1e-2
    assert rel_err(x.grad.double(), x64.grad) < 1e-2
    assert rel_err(layer.weight.grad.double(), w64.grad) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deconv_matches_torch_conv_transpose(dtype):
    layout = bsjit.ConvLayout.from_blocks(40, 24, [(range(0, 16), range(0, 8)), (range(8, 40), range(4, 24))])
    layer = bsjit.nn.BlockSparseConv2d(layout, 3, bias=False, device="cuda", dtype=dtype)
    z = torch.randn(2, 24, 5, 6, device="cuda", dtype=dtype, requires_grad=True)
    out = bsjit.functional.conv(z, layer.weight, layout, kernel_size=3, stride=2, padding=1, deconv=True,
                                output_size=(10, 12))
    assert out.shape == (2, 40, 10, 12)
    g = torch.randn_like(out)
    out.backward(g)
    z64 = z.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    ref = torch.nn.functional.conv_transpose2d(z64, layer.to_dense(w64), stride=2, padding=1, output_padding=1)
    ref.backward(g.double())
    assert rel_err(out.double(), ref) < TOL[dtype]
    assert rel_err(z.grad.double(), z64.grad) < TOL[dtype]


def test_opcheck_conv_ops():
    layout = bsjit.ConvLayout.from_mask(random_mask(2, 3, 0.6, 11), 16)
    x = torch.randn(2, 32, 6, 6, device="cuda", requires_grad=True)
    f = torch.randn(layout.blocks, 16, 16, 3, 3, device="cuda", requires_grad=True)
    g = bsjit.functional.conv_geometry((6, 6), 3, 1, 1)
    args = (layout.handle, layout.C, layout.K, layout.blocks, layout.filter_elements(9), g, False, False, None)
    torch.library.opcheck(torch.ops.bsjit.conv, (x, f, *args))
    y = torch.ops.bsjit.conv(x, f, *args).detach()
    torch.library.opcheck(torch.ops.bsjit.conv_backward_input, (y, f.detach(), *args))
    torch.library.opcheck(torch.ops.bsjit.conv_backward_filter, (x.detach(), y, f.detach(), *args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("deconv", [False, True])
def test_conv_l2_normalize_matches_torch(dtype, deconv):
    layout = bsjit.ConvLayout.from_mask(random_mask(3, 2, 0.7, 13), 16)
    f = torch.randn(layout.blocks, 16, 16, 3, 3, device="cuda", dtype=dtype, requires_grad=True)
    gain = torch.linspace(0.5, 2.0, layout.blocks * 16, device="cuda").requires_grad_()
    out = bsjit.functional.conv_l2_normalize(f, layout, (3, 3), gain=gain, deconv=deconv)
    g = torch.randn_like(out)
    out.backward(g)
    # the definition: rows over (C_b, taps) for a convolution, (K_b, taps) for a deconvolution
    f64 = f.detach().double().requires_grad_()
    gain64 = gain.detach().double().requires_grad_()
    rows = f64.transpose(1, 2) if deconv else f64  # [blocks, rows, other, 3, 3]
    ref = torch.nn.functional.normalize(rows.flatten(2), dim=2, eps=1e-6) * gain64.view(layout.blocks, 16, 1)
    ref = ref.view_as(rows)
    ref = ref.transpose(1, 2) if deconv else ref
    ref.backward(g.double())
    tol = TOL[dtype]
    assert rel_err(out.double(), ref) < tol
    assert rel_err(f.grad.double(), f64.grad) < tol
    assert rel_err(gain.grad.double(), gain64.grad) < tol


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_edge_bias_matches_its_definition(channels_last):
    g = bsjit.functional.conv_geometry((6, 7), 3, 2, "same")
    shape = bsjit.functional.conv_edge_bias_shape(g, 5, channels_last=channels_last)
    y = torch.randn(2, 5, 3, 4, device="cuda")
    if channels_last:
        y = y.to(memory_format=torch.channels_last)
    y.requires_grad_()
    gain = (torch.rand(shape, device="cuda") + 0.5).requires_grad_()
    bias = torch.randn(shape, device="cuda").requires_grad_()
    out = bsjit.functional.conv_edge_bias(y, gain, bias, g)
    grad = torch.randn_like(out)
    out.backward(grad)
    # the definition on the library's groups of positions (checked by hand in the C++ tests)
    group = torch.tensor(bsjit._C.ConvEdgeBias(g, 5, "f32", channels_last, False).position_edges(), device="cuda")
    assert group.numel() == 12
    y64, g64, b64 = (t.detach().double().requires_grad_() for t in (y, gain, bias))
    gain_kp = g64 if not channels_last else g64.t()  # [channels, edges]
    bias_kp = b64 if not channels_last else b64.t()
    flat = y64.flatten(2)  # [N, K, positions]
    inside = group < 0
    idx = group.clamp_min(0)
    ref = torch.where(inside, flat, flat * gain_kp[:, idx] + bias_kp[:, idx]).view_as(y64)
    ref.backward(grad.double())
    assert rel_err(out.double(), ref) < 1e-5
    assert rel_err(y.grad.double(), y64.grad) < 1e-5
    assert rel_err(gain.grad.double(), g64.grad) < 1e-5
    assert rel_err(bias.grad.double(), b64.grad) < 1e-5


def test_transposed_conv_module_matches_torch():
    layer = bsjit.nn.BlockSparseConvTranspose2d(random_mask(2, 3, 0.6, 17), 3, stride=2, padding=1, output_padding=1,
                                                block=16, device="cuda")
    x = torch.randn(2, 48, 5, 6, device="cuda", requires_grad=True)
    y = layer(x)
    g = torch.randn_like(y)
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    ref = torch.nn.functional.conv_transpose2d(x64, layer.to_dense(w64), layer.bias.double(), stride=2, padding=1,
                                               output_padding=1)
    ref.backward(g.double())
    assert rel_err(y.double(), ref) < 1e-5
    assert rel_err(x.grad.double(), x64.grad) < 1e-5
    assert rel_err(layer.weight.grad.double(), w64.grad) < 1e-5
