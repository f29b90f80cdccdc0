"""bsjit's convolution in PyTorch without a GPU: the ConvLayout forms, geometry against torch's own
convolution sizes, shapes and storage of every op under meta tensors and fake CUDA tensors,
autograd (the gate's too), torch.compile(fullgraph=True), the module's dense filter, and errors."""

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import bsjit
import bsjit.functional as F
from bsjit.nn import BlockSparseConv1d, BlockSparseConv2d, BlockSparseConv3d

MASK = np.array([[1, 0, 1], [0, 1, 1]], dtype=bool)  # C = 2b, K = 3b, 4 blocks
B = 16


def test_conv_ops_are_registered():
    for name in ("conv", "conv_backward_input", "conv_backward_filter"):
        assert hasattr(torch.ops.bsjit, name), name


def test_conv_layouts():
    u = bsjit.ConvLayout.from_mask(MASK, B)
    assert (u.C, u.K, u.blocks, u.uniform_block) == (2 * B, 3 * B, 4, B)
    assert u.channel_blocks()[1] == (list(range(B)), list(range(2 * B, 3 * B)))  # mask entry (0, 2)
    assert u.filter_elements(9) == 4 * B * B * 9
    g = bsjit.ConvLayout.from_blocks(6, 4, [([0, 5], [3]), ([1], [0, 1, 2])])
    assert (g.C, g.K, g.blocks, g.uniform_block, g.block_sizes) == (6, 4, 2, 0, ((1, 2), (3, 1)))
    assert g.filter_elements(3) == (2 + 3) * 3
    with pytest.raises(bsjit.Error, match="twice"):
        bsjit.ConvLayout.from_blocks(6, 4, [([0, 0], [1])])
    assert bsjit.ConvLayout.from_mask(bsjit.Layout(MASK), B).hash == u.hash


@pytest.mark.parametrize("spatial,kernel,stride,padding,dilation", [
    ((9,), 3, 1, 1, 1), ((9, 10), (3, 3), 2, 0, 1), ((9, 10), (3, 1), (1, 2), (1, 0), 2),
    ((5, 6, 7), 3, 2, 1, 1), ((11,), 5, 1, 0, 2)])
def test_geometry_gives_torch_output_sizes(spatial, kernel, stride, padding, dilation):
    g = F.conv_geometry(spatial, kernel, stride, padding, dilation)
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[len(spatial)]
    k = (kernel,) * len(spatial) if isinstance(kernel, int) else kernel
    y = conv(torch.zeros(1, 1, *spatial), torch.zeros(1, 1, *k), stride=stride, padding=padding, dilation=dilation)
    assert bsjit._conv.out_spatial(g)[3 - len(spatial):] == list(y.shape[2:])


def test_same_padding_is_tensorflows():
    g = F.conv_geometry((9, 10), 3, 2, "same")
    assert bsjit._conv.out_spatial(g)[1:] == [5, 5]  # ceil(in / stride)
    assert g[12:18] == [0, 1, 0, 0, 1, 1]  # before (D, H, W), after: the odd pad after
    assert F.conv_geometry((9,), 3, 1, "valid")[12:] == [0] * 6


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("device", ["meta", "fake-cuda"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_shapes_and_storage_propagate(dims, device, channels_last):
    layout = bsjit.ConvLayout.from_mask(MASK, B)
    layout.handle  # registered outside: the registry's lock cannot be traced
    spatial = (5, 9, 8)[3 - dims:]

    def run():
        dev = "cuda" if device == "fake-cuda" else "meta"
        x = torch.empty(2, 2 * B, *spatial, dtype=torch.bfloat16, device=dev)
        if channels_last:
            x = x.movedim(1, -1).contiguous().movedim(-1, 1)
        f = torch.empty(4, B, B, *([3] * dims), dtype=torch.bfloat16, device=dev)
        y = F.conv(x, f, layout, stride=2, padding=1)
        want = [(s + 2 - 3) // 2 + 1 for s in spatial]
        assert list(y.shape) == [2, 3 * B, *want] and y.device.type == dev
        assert F._is_channels_last(y) == channels_last
        geometry = F.conv_geometry(spatial, 3, 2, 1)
        args = (layout.handle, layout.C, layout.K, layout.blocks, layout.filter_elements(3 ** dims), geometry,
                channels_last, False, None)
        assert torch.ops.bsjit.conv_backward_input(y, f, *args).shape == x.shape
        assert torch.ops.bsjit.conv_backward_filter(x, y, f, *args).shape == f.shape
        # the deconvolution of the same layout: y's shape back to x's
        z = F.conv(y, f, layout, stride=2, padding=1, deconv=True, output_size=spatial)
        assert z.shape == x.shape

    if device == "fake-cuda":
        with FakeTensorMode(allow_non_fake_inputs=False):
            run()
    else:
        run()


@pytest.mark.parametrize("module,dims", [(BlockSparseConv1d, 1), (BlockSparseConv2d, 2), (BlockSparseConv3d, 3)])
def test_modules_train_through_meta_tensors(module, dims):
    layer = module(MASK, 3, stride=1, padding="same", block=B, gated=True, device="meta")
    x = torch.empty(2, 2 * B, *([6] * dims), device="meta", requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 3 * B, *([6] * dims))
    y.sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == layer.weight.shape
    assert layer.gate.grad.shape == (4,) and layer.bias.grad.shape == (3 * B,)


def test_torch_compile_fullgraph_forward_and_backward():
    layer = BlockSparseConv2d(MASK, 3, padding=1, block=B, device="meta")
    step = torch.compile(lambda t: layer(t).float().square().mean(), fullgraph=True, backend="aot_eager")
    x = torch.empty(2, 2 * B, 7, 7, device="meta", requires_grad=True)
    step(x).backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == layer.weight.shape


def test_the_dense_filter_of_a_module():
    layout = bsjit.ConvLayout.from_blocks(6, 4, [([0, 5], [3]), ([1], [0, 1, 2]), ([5], [3])])  # overlapping
    layer = BlockSparseConv1d(layout, 3, bias=False)
    assert layer.weight.shape == (layout.filter_elements(3),)
    dense = layer.to_dense()
    w = layer.weight.detach()
    assert dense.shape == (4, 6, 3)
    assert torch.equal(dense[3, 0], w[0:3])
    assert torch.equal(dense[3, 5], w[3:6] + w[15:18])  # two blocks map channel 5 to channel 3: they add
    assert torch.equal(dense[1, 1], w[9:12])
    assert dense[0, 0].abs().sum() == 0
    # every filter row bounded by 1 / sqrt(its output channel's fan-in), as torch's conv initializes
    assert w[0:6].abs().max() <= 1 / np.sqrt(3 * 3) + 1e-6  # channel 3: 3 inputs × 3 taps


def test_wrong_inputs_raise_with_the_reason():
    layout = bsjit.ConvLayout.from_mask(MASK, B)
    f = torch.empty(4, B, B, 3, 3, device="meta")
    x = torch.empty(2, 2 * B, 8, 8, device="meta")
    with pytest.raises(ValueError, match=r"must be \[N, 32, 8, 8\]"):
        F.conv(torch.empty(2, 2 * B + 1, 8, 8, device="meta"), f, layout)
    with pytest.raises(ValueError, match="one dtype"):
        F.conv(x.bfloat16(), f, layout)
    with pytest.raises(ValueError, match="holds 6912 elements"):
        F.conv(x, torch.empty(3, B, B, 3, 3, device="meta"), layout)
    with pytest.raises(ValueError, match="kernel_size"):
        F.conv(x, f.reshape(-1), layout)
    with pytest.raises(ValueError, match="a gate needs the filter as"):
        F.conv(x, f.reshape(-1), layout, kernel_size=3, gate=torch.empty(4, device="meta"))
    with pytest.raises(ValueError, match="does not give"):
        F.conv(torch.empty(2, 3 * B, 5, 5, device="meta"), f, layout, stride=2, padding=1, deconv=True,
               output_size=(7, 7))
    with pytest.raises(ValueError, match="CUDA tensors"):
        F.conv(torch.zeros(2, 2 * B, 8, 8), torch.zeros(4, B, B, 3, 3), layout)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # autotune times kernels on a GPU
        BlockSparseConv2d(MASK, 3, padding=1, block=B, device="meta").autotune(x)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        F.conv_autotune(torch.zeros(2, 2 * B, 8, 8), torch.zeros(4, B, B, 3, 3), layout)
    with pytest.raises(ValueError, match="block="):
        BlockSparseConv2d(MASK, 3)
    with pytest.raises(ValueError, match="one size"):
        BlockSparseConv1d(bsjit.ConvLayout.from_blocks(6, 4, [([0, 5], [3])]), 3, gated=True)


def test_precompile_a_conv_model_without_a_gpu(tmp_path):
    previous = bsjit.cache_directory()
    bsjit.set_cache_directory(str(tmp_path))
    try:
        model = torch.nn.Sequential(BlockSparseConv2d(MASK, 3, padding=1, block=B, dtype=torch.bfloat16),
                                    BlockSparseConv1d(bsjit.ConvLayout.from_blocks(48, 8, [(range(48), range(8))]),
                                                      5, dtype=torch.bfloat16))
        before = bsjit.cache_stats()["compiles"]
        assert bsjit.precompile(model, "sm_80") == 4  # two layers × channels first and last
        # One compile per dtype and storage, whatever the layout: the direct kernels (5) channels
        # first, for both layers; channels last the first layer's uniform layout runs the tensor-core
        # kernels (5, and the direct l2_normalize pair), the second layer's the direct fprop, bprop
        # and updat (3, sharing that pair).
        assert bsjit.cache_stats()["compiles"] == before + 5 + 7 + 3
        assert bsjit.precompile(model, "sm_80") == 0
        assert len(list(tmp_path.glob("*.bsjit"))) == (5 + 7) + (5 + 5)  # each layer's entries
    finally:
        bsjit.set_cache_directory(previous)


def test_l2_normalize_shapes_and_autograd_on_meta():
    layout = bsjit.ConvLayout.from_mask(MASK, B)
    layout.handle  # registered outside: the registry's lock cannot be traced
    f = torch.empty(4, B, B, 3, 3, device="meta", requires_grad=True)
    gain = torch.empty(4 * B, device="meta", requires_grad=True)  # a row per output channel of each block
    out = F.conv_l2_normalize(f, layout, (3, 3), gain=gain)
    assert out.shape == f.shape
    out.sum().backward()
    assert f.grad.shape == f.shape and gain.grad.shape == gain.shape
    with pytest.raises(ValueError, match=r"float32 \[64\]"):
        F.conv_l2_normalize(f, layout, (3, 3), gain=torch.empty(5, device="meta"))
    # a deconvolution's rows are the blocks' input channels: as many here (square blocks)
    assert F.conv_l2_normalize(f.detach(), layout, (3, 3), deconv=True).shape == f.shape


def test_edge_bias_shapes_and_autograd_on_meta():
    g = F.conv_geometry((4, 4), 3, 1, "same")
    assert F.conv_edge_bias_shape(g, 6) == (8, 6)  # four corners and four sides
    assert F.conv_edge_bias_shape(g, 6, channels_last=False) == (6, 8)
    y = torch.empty(2, 6, 4, 4, device="meta", requires_grad=True)
    gain = torch.empty(6, 8, device="meta", requires_grad=True)
    bias = torch.empty(6, 8, device="meta", requires_grad=True)
    out = F.conv_edge_bias(y, gain, bias, g)
    assert out.shape == y.shape
    out.sum().backward()
    assert y.grad.shape == y.shape and gain.grad.shape == gain.shape and bias.grad.shape == bias.shape
    with pytest.raises(ValueError, match=r"float32 \[6, edges\]"):
        F.conv_edge_bias(y, torch.empty(8, 6, device="meta"), bias, g)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_transposed_modules_give_torch_sizes(dims):
    from bsjit.nn import BlockSparseConvTranspose1d, BlockSparseConvTranspose2d, BlockSparseConvTranspose3d
    module = {1: BlockSparseConvTranspose1d, 2: BlockSparseConvTranspose2d, 3: BlockSparseConvTranspose3d}[dims]
    layer = module(MASK, 3, stride=2, padding=1, output_padding=1, block=B, device="meta")
    assert (layer.in_channels, layer.out_channels) == (3 * B, 2 * B)
    x = torch.empty(2, 3 * B, *([5] * dims), device="meta", requires_grad=True)
    y = layer(x)
    conv_t = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
              3: torch.nn.functional.conv_transpose3d}[dims]
    want = conv_t(torch.zeros(1, 1, *([5] * dims)), torch.zeros(1, 1, *([3] * dims)), stride=2, padding=1,
                  output_padding=1).shape[2:]
    assert y.shape == (2, 2 * B, *want)
    y.sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == layer.weight.shape
    with pytest.raises(ValueError, match="padding as ints"):
        module(MASK, 3, padding="same", block=B)
