"""bsjit.Layout: conversions from numpy, torch, coordinates, BSR tensors and FlexAttention block masks,
checked against masks written out by hand."""

import json

import numpy as np
import pytest
import torch

import bsjit
from bsjit.layout import lookup, rebind

MASK = np.array([[1, 0, 1], [0, 1, 0]], dtype=np.int32)  # blocks (0,0), (0,2), (1,1)


def test_from_numpy_and_torch_agree_with_the_hand_written_mask():
    for mask in (MASK, MASK.astype(bool), torch.from_numpy(MASK), torch.from_numpy(MASK).bool(), MASK * 7):
        l = bsjit.Layout(mask)
        assert (l.rows, l.cols, l.blocks) == (2, 3, 3)
        assert l.coords() == [(0, 0), (0, 2), (1, 1)]
        np.testing.assert_array_equal(l.to_numpy(), MASK.astype(bool))
        assert torch.equal(l.to_dense_mask(), torch.from_numpy(MASK).bool())


def test_from_coords_merges_duplicates_and_orders_row_major():
    l = bsjit.Layout.from_coords(2, 3, [(1, 1), (0, 2), (0, 0), (0, 2)])
    assert l == bsjit.Layout(MASK)
    assert l.hash == bsjit.Layout(MASK).hash
    assert len(l.hash) == 32
    assert l.hash != bsjit.Layout(MASK.T).hash


def test_from_bsr_tensor():
    b = 4
    dense = torch.zeros(2 * b, 3 * b)
    for r, c in [(0, 0), (0, 2), (1, 1)]:
        dense[r * b:(r + 1) * b, c * b:(c + 1) * b] = torch.randn(b, b)
    l = bsjit.Layout.from_bsr(dense.to_sparse_bsr((b, b)))
    assert l == bsjit.Layout(MASK)
    with pytest.raises(TypeError, match="BSR"):
        bsjit.Layout.from_bsr(dense)


def test_from_flex_attention_block_mask_tables():
    # 1 batch, 2 heads, 3 query blocks, 4 key blocks; head 0 causal, head 1 the diagonal only
    kv_num = torch.tensor([[[1, 2, 3], [1, 1, 1]]])
    kv_idx = torch.tensor([[[[0, 9, 9, 9], [0, 1, 9, 9], [0, 1, 2, 9]], [[0, 9, 9, 9], [1, 9, 9, 9], [2, 9, 9, 9]]]])
    heads = bsjit.Layout.from_block_mask(kv_num, kv_idx)[0]
    np.testing.assert_array_equal(heads[0].to_numpy(), np.tril(np.ones((3, 4), bool)))
    np.testing.assert_array_equal(heads[1].to_numpy(), np.eye(3, 4, dtype=bool))
    with pytest.raises(ValueError, match="kv_num_blocks"):
        bsjit.Layout.from_block_mask(kv_num[0], kv_idx)


def test_files_round_trip(tmp_path):
    l = bsjit.Layout(MASK)
    for name in ("l.npy", "l.json"):
        l.save(tmp_path / name)
        assert bsjit.Layout(tmp_path / name) == l
    assert json.loads((tmp_path / "l.json").read_text())["rows"] == 2


def test_bad_masks_raise_with_the_reason():
    with pytest.raises(ValueError, match="2-D"):
        bsjit.Layout(np.ones((2, 2, 2)))
    with pytest.raises(TypeError, match="bool or integer"):
        bsjit.Layout(np.ones((2, 2), dtype=np.float32))
    with pytest.raises(bsjit.Error, match="no_such_file"):
        bsjit.Layout("no_such_file.npy")


def test_stats():
    s = bsjit.Layout(MASK).stats()
    assert s["blocks"] == 3 and s["max_blocks_per_row"] == 2 and s["empty_cols"] == 0
    assert s["density"] == pytest.approx(0.5)


def test_registry_handles_and_rebind():
    a, b = bsjit.Layout(MASK), bsjit.Layout(1 - MASK)
    h = a.handle
    assert a.handle == h and lookup(h) is a
    rebind(h, b)
    assert lookup(h) is b
    with pytest.raises(ValueError, match="cannot replace"):
        rebind(h, bsjit.Layout(np.ones((3, 3), bool)))
    with pytest.raises(KeyError):
        lookup(10**9)
