"""bsjit.Layout: a block mask over a weight matrix, and the registry that hands layouts to the ops.

The ops take a layout as an int handle (torch.library ops take tensors and scalars only): `handle`
names a slot of this process's registry. A slot can be pointed at another layout of the same shape
(`rebind`), so a model whose sparsity changes while training keeps its handle, and a compiled graph
that holds the handle as a constant runs the new layout without being traced again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Iterable, Sequence

import numpy as np

from . import _C


class Layout:
    """A [rows, cols] block mask: block (r, c) of a weight W[C, K] = [rows·b, cols·b] is stored when
    the mask is nonzero there. The nonzero blocks are ordered row-major over the mask (numpy.nonzero
    order, as openai/blocksparse's block_coord), the order of the weight's first dimension."""

    __slots__ = ("_layout", "_handle", "_rows", "_cols", "_blocks", "_hash")

    def __init__(self, mask):
        """mask: a 2-D numpy array or torch tensor (bool or integer; nonzero marks a block), or a
        path to a .npy or .json layout file."""
        if isinstance(mask, _C.Layout):
            self._layout = mask
        elif isinstance(mask, (str, os.PathLike)):
            self._layout = _C.Layout.load(os.fspath(mask))
        else:
            m = _as_numpy(mask)
            if m.ndim != 2:
                raise ValueError(f"bsjit.Layout: a mask must be 2-D [rows, cols], not of shape {tuple(m.shape)}")
            if not (m.dtype == np.bool_ or np.issubdtype(m.dtype, np.integer)):
                raise TypeError(f"bsjit.Layout: a mask must be bool or integer, not {m.dtype}")
            rows, cols = m.shape
            self._layout = _C.Layout.from_mask(rows, cols, np.ascontiguousarray(m != 0, dtype=np.uint8).tobytes())
        self._handle = None
        # plain attributes: torch.compile reads them as constants
        self._rows, self._cols, self._blocks = self._layout.rows, self._layout.cols, self._layout.blocks
        self._hash = self._layout.hash()

    @classmethod
    def from_coords(cls, rows: int, cols: int, coords: Iterable[Sequence[int]]) -> "Layout":
        """The layout of the blocks at coords [(row, col), ...] (any order; duplicates merge)."""
        return cls(_C.Layout.from_coords(int(rows), int(cols), [(int(r), int(c)) for r, c in coords]))

    @classmethod
    def from_bsr(cls, tensor) -> "Layout":
        """The block mask of a torch sparse BSR tensor (Tensor.to_sparse_bsr): its blocks' positions;
        the block size is the tensor's."""
        import torch

        if tensor.layout != torch.sparse_bsr:
            raise TypeError(f"bsjit.Layout.from_bsr: expected a sparse BSR tensor, got layout {tensor.layout}")
        crow = tensor.crow_indices().cpu().numpy()
        col = tensor.col_indices().cpu().numpy()
        b0, b1 = tensor.values().shape[-2:]
        rows, cols = tensor.shape[-2] // b0, tensor.shape[-1] // b1
        coords = [(r, int(c)) for r in range(rows) for c in col[crow[r] : crow[r + 1]]]
        return cls.from_coords(rows, cols, coords)

    @classmethod
    def from_block_mask(cls, kv_num_blocks, kv_indices, kv_blocks: int | None = None):
        """Layouts from a FlexAttention BlockMask's kv_num_blocks [B, H, q blocks] and kv_indices
        [B, H, q blocks, k blocks] (pass `block_mask.kv_num_blocks, block_mask.kv_indices`): one per
        (batch, head), as a list of lists; kv_blocks (default: kv_indices' last dimension) is the
        number of key blocks."""
        n = _as_numpy(kv_num_blocks)
        idx = _as_numpy(kv_indices)
        if n.ndim != 3 or idx.ndim != 4 or idx.shape[:3] != n.shape:
            raise ValueError(
                f"bsjit.Layout.from_block_mask: kv_num_blocks must be [B, H, Q] and kv_indices [B, H, Q, K]; "
                f"got {tuple(n.shape)} and {tuple(idx.shape)}"
            )
        k = int(kv_blocks if kv_blocks is not None else idx.shape[3])
        out = []
        for b in range(n.shape[0]):
            heads = []
            for h in range(n.shape[1]):
                coords = [(q, int(c)) for q in range(n.shape[2]) for c in idx[b, h, q, : int(n[b, h, q])]]
                heads.append(cls.from_coords(n.shape[2], k, coords))
            out.append(heads)
        return out

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self._cols

    @property
    def blocks(self) -> int:
        return self._blocks

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def hash(self) -> str:
        """A 128-bit content hash (32 hex digits), the layout's part of every cache key."""
        return self._hash

    def stats(self) -> dict:
        return self._layout.stats()

    def coords(self) -> list[tuple[int, int]]:
        """(row, col) of each stored block, in the weight's block order."""
        return self._layout.coords()

    def to_numpy(self) -> np.ndarray:
        """The mask as a [rows, cols] bool array."""
        return np.frombuffer(self._layout.dense(), dtype=np.uint8).reshape(self.rows, self.cols).astype(bool)

    def to_dense_mask(self, device=None):
        """The mask as a [rows, cols] bool torch tensor."""
        import torch

        return torch.from_numpy(self.to_numpy()).to(device) if device is not None else torch.from_numpy(self.to_numpy())

    def transposed(self) -> "Layout":
        return Layout(self._layout.transposed())

    def save(self, path) -> None:
        """Writes the layout to a .npy or .json file (bsjit precompile, bsjit inspect read them)."""
        self._layout.save(os.fspath(path))

    @property
    def handle(self) -> int:
        """This layout's slot in the registry the ops read (registered on first use)."""
        if self._handle is None:
            self._handle = register(self)
        return self._handle

    def __eq__(self, other) -> bool:
        return isinstance(other, Layout) and self._layout == other._layout

    def __hash__(self) -> int:
        return hash(self.hash)

    def __repr__(self) -> str:
        return f"bsjit.Layout({self.rows}x{self.cols}, {self.blocks} blocks)"


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


_lock = threading.Lock()
_slots: dict[int, Layout] = {}
_next = [1]


def register(layout: Layout) -> int:
    """A new registry slot holding layout; returns its handle."""
    with _lock:
        h = _next[0]
        _next[0] += 1
        _slots[h] = layout
        return h


def rebind(handle: int, layout: Layout) -> None:
    """Points an existing slot at another layout of the same shape (rows and cols)."""
    with _lock:
        old = _slots.get(handle)
        if old is None:
            raise KeyError(f"bsjit: no layout handle {handle}")
        if old.shape != layout.shape:
            raise ValueError(f"bsjit: layout handle {handle} holds a {old.shape} mask; a {layout.shape} one cannot replace it")
        _slots[handle] = layout


def lookup(handle: int):
    """The Layout a handle names (or, for an attention mask set, its tuple of Layouts; for a
    convolution, its ConvLayout)."""
    layout = _slots.get(int(handle))
    if layout is None:
        raise KeyError(f"bsjit: no layout handle {handle} (handles come from Layout.handle, in this process)")
    return layout


class MaskSet(tuple):
    """An attention mask set as the registry holds it: a tuple of Layouts (one shared by every head,
    or one per head) and, for the decomposed ops, element masks inside their blocks as
    bsjit::ElementMasks' bits (little-endian uint32 bytes; empty when none) with a digest of them."""

    def __new__(cls, masks, element_bits: bytes = b""):
        self = super().__new__(cls, masks)
        self.element_bits = element_bits
        self.element_digest = hashlib.blake2b(element_bits, digest_size=16).hexdigest() if element_bits else ""
        return self


_mask_sets: dict[tuple, int] = {}


def mask_set_handle(masks, element_bits: bytes = b"") -> int:
    """The handle of an attention mask set: one Layout shared by every head, or one per head, with
    element masks' bits (element_mask_bits) or none; the same masks get the same handle."""
    masks = MaskSet(masks, element_bits)
    key = tuple(m.hash for m in masks) + tuple(m.shape for m in masks) + (masks.element_digest,)
    with _lock:
        h = _mask_sets.get(key)
    if h is None:
        h = register(masks)
        with _lock:
            h = _mask_sets.setdefault(key, h)
    return h


def element_mask_bits(masks, block: int, element_mask) -> tuple[tuple, bytes]:
    """Element masks inside the masks' nonzero blocks, as the decomposed attention ops apply them in
    softmax (True or nonzero keeps a query-key pair):
    - an array (numpy or torch) [seq_q, seq_k] for every head, or [heads, seq_q, seq_k] one per head;
    - or a callable f(head, query_block, key_block) returning a [block, block] array for the block
      (openai/blocksparse's mask callback), called once per nonzero block of each mask (head 0 for a
      shared mask).
    Returns the masks (a shared mask repeated per head when the element masks are per head) and the
    bits. A block whose pairs are all kept costs nothing at run time."""
    masks = tuple(masks)
    rows, cols = masks[0].shape
    b = int(block)
    if callable(element_mask):
        parts = []
        for h, m in enumerate(masks):
            for r, c in m.coords():
                keep = _as_numpy(element_mask(h, r, c))
                if keep.shape != (b, b):
                    raise ValueError(f"bsjit: the element mask callback returned shape {keep.shape} for block "
                                     f"({r}, {c}) of mask {h}; expected ({b}, {b})")
                parts.append(keep.reshape(-1) != 0)
        keep = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    else:
        em = _as_numpy(element_mask)
        em = em[None] if em.ndim == 2 else em
        if em.ndim != 3 or em.shape[1:] != (rows * b, cols * b):
            raise ValueError(f"bsjit: an element mask must be [{rows * b}, {cols * b}] or [heads, {rows * b}, "
                             f"{cols * b}] (the masks' positions), got shape {tuple(em.shape)}")
        if em.shape[0] > 1 and len(masks) == 1:
            masks = masks * em.shape[0]  # per-head element masks over one block mask
        if em.shape[0] != len(masks):
            raise ValueError(f"bsjit: {em.shape[0]} element masks for {len(masks)} block masks")
        # [heads, rows, b, cols, b] → per head, the nonzero blocks in row-major order, each [b, b]
        blocks = em.reshape(em.shape[0], rows, b, cols, b).transpose(0, 1, 3, 2, 4) != 0
        keep = np.concatenate([blocks[h][m.to_numpy() != 0].reshape(-1) for h, m in enumerate(masks)])
    return masks, np.packbits(keep, bitorder="little").tobytes()


def as_masks(mask) -> tuple:
    """Attention masks as a tuple of Layouts: a Layout, a list of them (one per head), a 2-D mask
    (every head) or a 3-D [heads, query blocks, key blocks] one (openai/blocksparse's form)."""
    if isinstance(mask, Layout):
        return (mask,)
    if isinstance(mask, (list, tuple)):
        return tuple(m if isinstance(m, Layout) else Layout(m) for m in mask)
    m = _as_numpy(mask)
    if m.ndim == 3:
        return tuple(Layout(m[h]) for h in range(m.shape[0]))
    return (Layout(m),)


class ConvLayout:
    """The channel blocks of a block-sparse convolution (bsjit::ConvLayout, openai/blocksparse's BCK):
    each block a list of input channels and a list of output channels, with its own filter
    [K_b, C_b, *kernel]; the layout's filter is the blocks' filters one after the other. Blocks may
    overlap (their outputs add). `from_mask` makes the common uniform layout of a [C / b, K / b] mask,
    whose blocks are ordered as the mask's nonzero entries (row-major)."""

    __slots__ = ("_layout", "_handle", "_C", "_K", "_sizes", "_area", "_hash")

    def __init__(self, layout: "_C.ConvLayout"):
        self._layout = layout
        self._handle = None
        blocks = layout.blocks()
        # plain attributes: torch.compile reads them as constants
        self._C, self._K = layout.C, layout.K
        self._sizes = tuple((len(k), len(c)) for c, k in blocks)
        self._area = sum(k * c for k, c in self._sizes)
        self._hash = hashlib.sha256(repr((self._C, self._K, blocks)).encode()).hexdigest()[:32]

    @classmethod
    def from_mask(cls, mask, block: int) -> "ConvLayout":
        """The uniform layout of a [C / block, K / block] block mask (a Layout, array or tensor):
        block (r, c) maps input channels [r·block, (r+1)·block) to output channels [c·block, ...)."""
        layout = mask if isinstance(mask, Layout) else Layout(mask)
        return cls(_C.ConvLayout.from_mask(layout._layout, int(block)))

    @classmethod
    def from_blocks(cls, C: int, K: int, blocks) -> "ConvLayout":
        """blocks: [(input channels, output channels), ...], as blocksparse's BCK."""
        return cls(_C.ConvLayout.from_blocks(int(C), int(K), [(list(map(int, c)), list(map(int, k)))
                                                               for c, k in blocks]))

    @classmethod
    def load(cls, path, block: int = 0) -> "ConvLayout":
        """A ConvLayout JSON file, or (block > 0) a layout file read as a block mask."""
        return cls(_C.ConvLayout.load(os.fspath(path), int(block)))

    @property
    def C(self) -> int:
        return self._C

    @property
    def K(self) -> int:
        return self._K

    @property
    def shape(self) -> tuple[int, int]:
        return (self._C, self._K)

    @property
    def blocks(self) -> int:
        return len(self._sizes)

    @property
    def block_sizes(self) -> tuple:
        """(K_b, C_b) of every block."""
        return self._sizes

    @property
    def uniform_block(self) -> int:
        """b where every block maps b input channels to b output channels, else 0."""
        b = self._sizes[0][0]
        return b if all(k == b and c == b for k, c in self._sizes) else 0

    @property
    def hash(self) -> str:
        return self._hash

    def channel_blocks(self) -> list:
        """[(input channels, output channels), ...] per block."""
        return self._layout.blocks()

    def filter_elements(self, taps: int) -> int:
        """Elements of the layout's filter at `taps` filter taps: Σ K_b · C_b · taps."""
        return self._area * int(taps)

    @property
    def handle(self) -> int:
        """This layout's registry handle (registered on first use)."""
        if self._handle is None:
            self._handle = register(self)
        return self._handle

    def __repr__(self) -> str:
        return f"bsjit.ConvLayout(C={self._C}, K={self._K}, {self.blocks} blocks)"
