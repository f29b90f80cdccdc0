"""bsjit's attention ops without a GPU: shapes on fake CUDA and meta tensors, both tensor orders, per-head
masks in blocksparse's 3-D form, errors, autograd, and torch.compile(fullgraph=True) tracing."""

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import bsjit
import bsjit.functional as F
from bsjit.nn import BlockSparseAttention

CAUSAL4 = np.tril(np.ones((4, 4), bool))


def qkv(order, device, b=2, h=3, s=256, d=64, dtype=torch.bfloat16, grad=False):
    shape = (b, s, h, d) if order == "bshd" else (b, h, s, d)
    return [torch.empty(shape, device=device, dtype=dtype, requires_grad=grad) for _ in range(3)]


def test_ops_are_registered():
    assert hasattr(torch.ops.bsjit, "attention") and hasattr(torch.ops.bsjit, "attention_backward")


@pytest.mark.parametrize("order", ["bshd", "bhsd"])
def test_shapes_on_fake_cuda_tensors(order):
    with FakeTensorMode():
        q, k, v = qkv(order, "cuda")
        out, lse = F.attention(q, k, v, CAUSAL4, 64, causal=True, order=order, return_lse=True)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (2, 3, 256) and lse.dtype == torch.float32


def test_per_head_masks_in_blocksparse_3d_form_and_padding():
    masks = np.stack([CAUSAL4, np.eye(4, dtype=bool), np.ones((4, 4), bool)])
    q, k, v = qkv("bhsd", "meta")
    pad = torch.zeros(2, 256, dtype=torch.bool, device="meta")
    assert F.attention(q, k, v, masks, 64, order="bhsd", key_padding_mask=pad).shape == q.shape
    with pytest.raises(ValueError, match="2 masks for 3 heads"):
        F.attention(q, k, v, masks[:2], 64, order="bhsd")


def test_backward_through_meta_tensors():
    q, k, v = qkv("bshd", "meta", grad=True)
    F.attention(q, k, v, CAUSAL4, 64, causal=True).sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_wrong_inputs_raise_with_the_reason():
    q, k, v = qkv("bshd", "meta")
    with pytest.raises(ValueError, match="need 256 and 256 positions, not 256 and 128"):
        F.attention(q, k[:, :128], v[:, :128], CAUSAL4, 64)
    with pytest.raises(ValueError, match="head dim 48"):
        F.attention(*qkv("bshd", "meta", d=48), CAUSAL4, 64)
    with pytest.raises(ValueError, match="float32 is not supported"):
        F.attention(*qkv("bshd", "meta", dtype=torch.float32), CAUSAL4, 64)
    with pytest.raises(ValueError, match="order"):
        F.attention(q, k, v, CAUSAL4, 64, order="sbhd")
    with pytest.raises(ValueError, match="CUDA tensors"):
        F.attention(*qkv("bshd", "cpu"), CAUSAL4, 64)


def test_module_state_dict_and_compile_fullgraph():
    a = BlockSparseAttention(CAUSAL4, 64, causal=True)
    b = BlockSparseAttention(np.eye(4, dtype=bool), 64, causal=True)
    b.load_state_dict(a.state_dict())
    assert b._masks == a._masks
    q, k, v = qkv("bshd", "meta", grad=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    out = torch.compile(b, backend=backend, fullgraph=True)(q, k, v)
    out.sum().backward()
    assert q.grad.shape == q.shape and len(graphs) == 1
    assert any("bsjit.attention" in str(n.target) for n in graphs[0].graph.nodes)


def test_decomposed_ops_shapes_and_autograd_on_meta():
    from bsjit.nn import DecomposedAttention

    per_head = [CAUSAL4, np.eye(4, dtype=bool), np.ones((4, 4), bool)]
    for masks, stored in ((CAUSAL4, 3 * 10), (per_head, 10 + 4 + 16)):
        ops = DecomposedAttention(masks, 64, 64, causal=True)
        q, k, v = qkv("bshd", "meta", grad=True)
        s = ops.scores(q, k)
        assert s.shape == (2, stored * 64 * 64)
        p = ops.softmax(s)
        o = ops.probs_v(p, v)
        assert o.shape == q.shape
        o.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    with pytest.raises(ValueError, match="block-sparse tensor"):
        ops.softmax(torch.empty(2, 5, device="meta", dtype=torch.bfloat16))
    with FakeTensorMode():
        q, k, v = qkv("bhsd", "cuda")
        ops = DecomposedAttention(CAUSAL4, 64, 64, order="bhsd")
        assert ops(q, k, v).shape == q.shape
    for name in ("attention_scores", "attention_softmax", "attention_softmax_grad", "attention_probs_v",
                 "attention_probs_t"):
        assert hasattr(torch.ops.bsjit, name), name
