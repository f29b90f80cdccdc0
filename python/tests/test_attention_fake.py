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


@pytest.mark.parametrize("order", ["bshd", "bhsd"])
def test_grouped_query_attention_shapes_and_gradients_on_meta(order):
    """k and v with fewer heads than q (grouped-query, multi-query attention): out like q, dk and dv like k."""
    per_head = np.stack([CAUSAL4, np.eye(4, dtype=bool), CAUSAL4, np.ones((4, 4), bool)])
    for kv_heads, masks in ((2, CAUSAL4), (1, CAUSAL4), (2, per_head), (1, per_head)):
        q = qkv(order, "meta", h=4, grad=True)[0]
        k, v = qkv(order, "meta", h=kv_heads, grad=True)[:2]
        out, lse = F.attention(q, k, v, masks, 64, causal=True, order=order, return_lse=True)
        assert out.shape == q.shape and lse.shape == (2, 4, 256)
        out.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    q = qkv(order, "meta", h=4)[0]
    k, v = qkv(order, "meta", h=3)[:2]
    with pytest.raises(ValueError, match="heads do not divide"):
        F.attention(q, k, v, CAUSAL4, 64, order=order)


def test_grouped_query_decomposed_ops_on_meta():
    from bsjit.nn import DecomposedAttention

    ops = DecomposedAttention(CAUSAL4, 64, 64, causal=True)
    q = qkv("bshd", "meta", h=4, grad=True)[0]
    k, v = qkv("bshd", "meta", h=2, grad=True)[:2]
    o = ops(q, k, v)
    assert o.shape == q.shape
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    # probs_t sums each group's query heads into its key/value head's rows
    p = ops.softmax(ops.scores(q.detach(), k.detach()))
    dk = torch.ops.bsjit.attention_probs_t(p, q.detach(), ops._handle, 64, True, 0, 4, 64, 2)
    assert dk.shape == k.shape
    with pytest.raises(ValueError, match="not a multiple of kv_group = 3"):
        torch.ops.bsjit.attention_probs_t(p, q.detach(), ops._handle, 64, True, 0, 4, 64, 3)


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


def bits_by_hand(masks, block, keep_of):
    """ElementMasks::bits as include/bsjit/attention_ops.hpp defines them: pair (r, c) of nonzero block
    i (counted over every mask, each in row-major block order) is bit i·b² + r·b + c."""
    words = []
    i = 0
    for h, m in enumerate(masks):
        for qb, kb in zip(*np.nonzero(m)):
            for r in range(block):
                for c in range(block):
                    n = i * block * block + r * block + c
                    if n % 32 == 0:
                        words.append(0)
                    if keep_of(h, qb * block + r, kb * block + c):
                        words[-1] |= 1 << (n % 32)
            i += 1
    return words


def test_element_mask_bits_from_arrays_and_from_a_callback():
    from bsjit.layout import as_masks, element_mask_bits

    b = 16
    rng = np.random.default_rng(3)
    block_mask = np.array([[1, 0, 1], [0, 1, 1]], bool)
    shared = rng.random((2 * b, 3 * b)) < 0.6
    masks, bits = element_mask_bits(as_masks(block_mask), b, shared)
    assert len(masks) == 1
    assert np.frombuffer(bits, "<u4").tolist() == bits_by_hand([block_mask], b, lambda h, r, c: shared[r, c])
    # openai/blocksparse's callback form gives the same bits
    _, from_callback = element_mask_bits(as_masks(block_mask), b, lambda h, qb, kb: torch.from_numpy(
        shared[qb * b:(qb + 1) * b, kb * b:(kb + 1) * b]))
    assert from_callback == bits
    # one element mask per head over one block mask: the block mask is repeated per head
    per_head = rng.random((3, 2 * b, 3 * b)) < 0.5
    masks, bits = element_mask_bits(as_masks(block_mask), b, torch.from_numpy(per_head))
    assert len(masks) == 3
    assert np.frombuffer(bits, "<u4").tolist() == bits_by_hand([block_mask] * 3, b, lambda h, r, c: per_head[h, r, c])
    with pytest.raises(ValueError, match=r"\[32, 48\]"):
        element_mask_bits(as_masks(block_mask), b, shared[:, :40])
    with pytest.raises(ValueError, match="2 element masks for 3 block masks"):
        element_mask_bits(as_masks([block_mask] * 3), b, per_head[:2])
    with pytest.raises(ValueError, match="callback returned shape"):
        element_mask_bits(as_masks(block_mask), b, lambda h, qb, kb: np.ones((b, b + 1)))


def test_decomposed_attention_with_element_masks():
    from bsjit import _C
    from bsjit.layout import lookup
    from bsjit.nn import DecomposedAttention

    keep = np.tril(np.ones((256, 256), bool))  # a causal mask given as element masks
    ops = DecomposedAttention(np.ones((4, 4), bool), 64, 64, element_mask=keep)
    same = DecomposedAttention(np.ones((4, 4), bool), 64, 64, element_mask=keep.copy())
    plain = DecomposedAttention(np.ones((4, 4), bool), 64, 64)
    assert ops._handle == same._handle != plain._handle
    assert len(lookup(ops._handle).element_bits) == 16 * 64 * 64 // 8 and not lookup(plain._handle).element_bits
    q, k, v = qkv("bshd", "meta", grad=True)
    ops(q, k, v).sum().backward()
    assert q.grad.shape == q.shape
    # the fused attention has no element masks: the handle of a set that has them is refused
    with pytest.raises(ValueError, match="decomposed ops"):
        F.attention(*qkv("bshd", "meta"), ops._handle, 64)
    # the library checks the bits' length against the masks' blocks
    layouts = [m._layout for m in lookup(ops._handle)]
    with pytest.raises(bsjit.Error, match="element mask bits hold 8 words"):
        _C.AttentionOps(layouts, 64, 64, "bf16", element_bits=bytes(32))
    with pytest.raises(bsjit.Error, match="whole 32-bit words"):
        _C.AttentionOps(layouts, 64, 64, "bf16", element_bits=bytes(6))


def test_precompile_and_warmup_cover_the_attention_modules(tmp_path):
    """bsjit.precompile compiles a model's attention modules too (fused: forward and backward;
    decomposed: its five kernels), with head_dim for the fused one; a second call compiles nothing."""
    from bsjit.nn import BlockSparseLinear, DecomposedAttention

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = BlockSparseLinear(np.eye(4, dtype=bool), 32, dtype=torch.bfloat16)
            self.attn = BlockSparseAttention(CAUSAL4, 32, causal=True)
            self.scores = DecomposedAttention(CAUSAL4, 32, 32, causal=True)

    previous = bsjit.cache_directory()
    bsjit.set_cache_directory(str(tmp_path))
    try:
        model = Block()
        with pytest.raises(ValueError, match="pass head_dim="):
            bsjit.precompile(model, "sm_80")
        before = bsjit.cache_stats()["compiles"]
        assert bsjit.precompile(model, "sm_80", ops=["forward"], calls="plain", head_dim=32) == 3
        compiled = bsjit.cache_stats()["compiles"] - before
        assert compiled >= 1 + 3 + 5  # a matmul kernel, attention forward + backward (prep, dq, main), five ops
        assert bsjit.precompile(model, "sm_80", ops=["forward"], calls="plain", head_dim=32) == 0
        assert bsjit.cache_stats()["compiles"] - before == compiled
        # grouped-query attention: the fused kernels of the group (5: the dK/dV conversion too) and
        # the decomposed ops of the group; the ungrouped ones stay cached
        assert bsjit.precompile(model, "sm_80", ops=["forward"], calls="plain", head_dim=32, kv_group=2) == 2
        assert bsjit.cache_stats()["compiles"] - before == compiled + 5 + 5
        with pytest.raises(ValueError, match="kv_group = 0"):
            bsjit.precompile(model, "sm_80", head_dim=32, kv_group=0)
        # attention's dtype comes from the model's one 16-bit dtype, or must be given
        model.proj.float()
        with pytest.raises(ValueError, match="pass dtype="):
            bsjit.precompile(model, "sm_80", head_dim=32)
        with pytest.raises(ValueError, match="float16 or bfloat16"):
            bsjit.precompile(model.attn, "sm_80", head_dim=32, dtype=torch.float32)
    finally:
        bsjit.set_cache_directory(previous)
