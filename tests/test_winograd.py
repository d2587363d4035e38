"""3x3 convs by Winograd's F(m x m, 3 x 3) (``strategies/alt/winograd.py``): the transforms
against a direct correlation, the rule that picks it, and ResNet basic blocks exported by
both of PyTorch's exporters against PyTorch, built for AVX2 (8 lanes, 16 registers) and
AVX-512 (16 lanes, 32 registers) wherever this machine runs the code."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from conftest import torch_to_onnx
from torch import nn

import alt_tvm
from alt_tvm.integration import extract_tasks
from alt_tvm.strategies.alt.winograd import (
    MIN_TILES,
    transform_weight,
    vector_block,
    winograd_matrices,
    winograd_tile,
)


@pytest.mark.parametrize("m", [2, 4])
def test_transforms_compute_a_tile_of_the_correlation(m):
    a, b, _ = winograd_matrices(m)
    rng = np.random.default_rng(m)
    tile, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    u = transform_weight(g[None, None].astype(np.float32), m)[:, :, 0, 0].astype(np.float64)
    y = a.T @ (u * (b.T @ tile @ b)) @ a
    direct = np.array([[np.sum(tile[i:i + 3, j:j + 3] * g) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(y, direct, rtol=1e-5, atol=1e-5)


def test_tile_rule_follows_the_tile_count():
    tile = functools.partial(winograd_tile, lanes=16)
    assert tile(out_hw=(56, 56), batch=1, in_channels=64, out_channels=64)[0] == 4
    assert tile(out_hw=(28, 28), batch=1, in_channels=128, out_channels=128)[0] == 4
    assert tile(out_hw=(14, 14), batch=1, in_channels=256, out_channels=256)[0] == 2
    m, why = tile(out_hw=(7, 7), batch=1, in_channels=512, out_channels=512)
    assert m == 0 and "2x2 or 4x4" in why
    m, why = tile(out_hw=(8, 8), batch=1, in_channels=512, out_channels=512)
    assert m == 0 and f"needs {MIN_TILES}" in why  # 16 tiles of 2x2
    assert tile(out_hw=(8, 8), batch=4, in_channels=16, out_channels=16)[0] == 2  # 64 tiles
    m, why = tile(out_hw=(56, 56), batch=1, in_channels=24, out_channels=64)
    assert m == 0 and "multiples of 16" in why
    # 24 channels are three AVX2 vectors.
    assert winograd_tile(out_hw=(56, 56), batch=1, in_channels=24, out_channels=64, lanes=8)[0] == 4
    # Ragged outputs in whole tiles while that adds at most 10% work (SqueezeNet's maps).
    assert tile(out_hw=(55, 55), batch=1, in_channels=16, out_channels=64) == (4, "196 output tiles of 4x4")
    assert tile(out_hw=(27, 27), batch=1, in_channels=32, out_channels=128)[0] == 4
    assert tile(out_hw=(23, 23), batch=1, in_channels=16, out_channels=16)[0] == 2  # 24x24: +9%
    m, why = tile(out_hw=(13, 13), batch=1, in_channels=64, out_channels=256)  # 14x14: +16%
    assert m == 0 and "too far" in why


@pytest.mark.parametrize("vectors, registers, block", [
    (4, 32, 4),  # AVX-512: 6 x 4 accumulators, 4 weight vectors, a broadcast: 29 registers
    (6, 32, 3), (1, 32, 1),
    (4, 16, 2),  # AVX2: 6 x 2 + 2 + 1 = 15
    (3, 16, 1), (8, 16, 2),
])
def test_the_gemm_register_block_fits_the_registers(vectors, registers, block):
    assert vector_block(vectors=vectors, registers=registers) == block
    with pytest.raises(ValueError, match="F\\(2x2, 3x3\\) and F\\(4x4, 3x3\\) only"):
        winograd_matrices(3)
    with pytest.raises(ValueError, match="O x C x 3 x 3"):
        transform_weight(np.zeros((4, 4, 5, 5), np.float32), 2)


class _BasicBlock(nn.Module):
    """ResNet's basic block (He et al. 2016): conv-bn-relu, conv-bn, + input, relu."""

    def __init__(self, channels: int, bias: bool = True) -> None:
        super().__init__()
        self.a = nn.Conv2d(channels, channels, 3, padding=1, bias=bias)
        self.b = nn.Conv2d(channels, channels, 3, padding=1, bias=bias)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))) + x)


def _build(model: nn.Module, x: torch.Tensor, tmp_path, target, *, dynamo: bool = False, winograd=True):
    """The model built for ``target`` from its ONNX export, its output checked against PyTorch's."""
    path = str(tmp_path / "model.onnx")
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    built = alt_tvm.build(path, target=target, strict=True, strategy_options={"alt": {"winograd": winograd}})
    with torch.no_grad():
        expected = model(x).numpy()
    got = built(x.numpy())[0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())
    return built


def _conv_layouts(built) -> list[str]:
    return [k.layout for k in built.report.kernels if k.kind == "partition"]


def _tiled(shape, m: int, lanes: int) -> str:
    """The Winograd output layout of an ``N x C x H x W`` map: ``m x m`` tiles, ``lanes`` channels."""
    n, c, h, w = shape
    return f"{n}x{-(-h // m)}x{-(-w // m)}x{c // lanes}x{m}x{m}x{lanes}"


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("shape, m", [((1, 16, 8, 8), 2), ((2, 32, 24, 24), 4)])
def test_basic_block_matches_pytorch(tmp_path, x86_runnable, dynamo, shape, m):
    torch.manual_seed(0)
    model = _BasicBlock(shape[1]).eval()
    built = _build(model, torch.randn(*shape), tmp_path, x86_runnable, dynamo=dynamo, winograd="always")
    tiled = _tiled(shape, m, x86_runnable.vector_lanes())
    assert _conv_layouts(built) == [tiled, tiled]  # both convs, the residual add in the second's epilogue


def test_conv_without_epilogue_and_the_direct_template_when_off(tmp_path, x86_runnable):
    torch.manual_seed(1)
    model = nn.Conv2d(16, 32, 3, padding=1, bias=False).eval()
    x = torch.randn(1, 16, 12, 12)
    tiled = _tiled((1, 32, 12, 12), 2, x86_runnable.vector_lanes())
    assert _conv_layouts(_build(model, x, tmp_path, x86_runnable, winograd="always")) == [tiled]
    assert _conv_layouts(_build(model, x, tmp_path, x86_runnable, winograd=False))[0] != tiled


def test_rule_keeps_small_maps_on_the_direct_template(tmp_path, x86_runnable):
    torch.manual_seed(2)
    model = _BasicBlock(16).eval()
    lanes = x86_runnable.vector_lanes()
    small = torch.randn(1, 16, 8, 8)  # 16 tiles of 2x2: the direct template
    assert _tiled((1, 16, 8, 8), 2, lanes) not in _conv_layouts(_build(model, small, tmp_path, x86_runnable))
    tasks = extract_tasks(model, example_inputs=(small,), target=x86_runnable)
    assert [t.space.default()[1]["winograd"] for t in tasks] == [0, 0]
    large = torch.randn(1, 16, 24, 24)  # 36 tiles of 4x4: Winograd
    assert _conv_layouts(_build(model, large, tmp_path, x86_runnable)) == [_tiled((1, 16, 24, 24), 4, lanes)] * 2


def test_tuning_chooses_between_winograd_and_the_direct_template(x86_target):
    """The conv's space offers Winograd (its default) and the direct template; a Winograd
    point has no other knobs, and a record's choice is what the kernel computes."""
    torch.manual_seed(5)
    model = _BasicBlock(16).eval()
    x = torch.randn(1, 16, 24, 24)
    lanes = x86_target.vector_lanes()
    task = extract_tasks(model, example_inputs=(x,), target=x86_target)[0]
    layout, loop = task.space.default()
    assert loop["winograd"] == 4 and task.space.check(layout, loop) is None
    assert "no other knobs" in task.space.check(layout, {**loop, "unroll_window": not loop["unroll_window"]})
    direct = {**loop, "winograd": 0}
    assert task.space.check(layout, direct) is None
    assert [int(s) for s in task.lower(task.space.params(layout, loop)).output_layout.shape[-3:]] == [4, 4, lanes]
    assert [int(s) for s in task.lower(task.space.params(layout, direct)).output_layout.shape[-3:]] != [4, 4, lanes]
    with pytest.raises(ValueError, match="Winograd tiles of 2: this conv .* allows 4"):
        task.lower({**task.space.params(layout, loop), "winograd": 2})


def _specials_where_pytorch_puts_them(model: nn.Module, x: torch.Tensor, tmp_path, target, *, layout: str):
    """``model`` (one conv) built by default for ``target`` from its export, its conv stored in
    ``layout``, and its NaN and infinities where PyTorch's are; returns (alt-tvm's output,
    PyTorch's)."""
    with torch.no_grad():
        expected = model(x).numpy()
    path = str(tmp_path / "special.onnx")
    torch_to_onnx(model, (x,), path, dynamo=False)
    built = alt_tvm.build(path, target=target)
    assert _conv_layouts(built) == [layout]
    got = built(x.numpy())[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    np.testing.assert_array_equal(got[np.isinf(got)], expected[np.isinf(expected)])
    return got, expected


@pytest.mark.parametrize("special", [1e38, np.inf, -np.inf, np.nan])
def test_tiles_with_a_special_value_are_computed_directly(tmp_path, x86_runnable, special):
    """A NaN or an infinity reaches every output of its tiles through the transforms (and 1e38
    may overflow them); those tiles are computed again directly, so the result has NaN and
    infinities exactly where PyTorch's direct conv has them, and the other outputs of those
    tiles are finite and right."""
    torch.manual_seed(4)
    model = nn.Conv2d(16, 32, 3, padding=1).eval()
    x = torch.randn(1, 16, 24, 24)
    x[0, 3, 5, 5] = special
    x[0, 9, 20, 0] = special
    got, expected = _specials_where_pytorch_puts_them(model, x, tmp_path, x86_runnable,
                                                      layout=_tiled((1, 32, 24, 24), 4, x86_runnable.vector_lanes()))
    assert np.isfinite(expected).all() == np.isfinite(special)
    # Outputs whose windows miss the special inputs, most of them in the special inputs'
    # tiles: to the precision of ordinary values after a NaN or an infinity (their tiles are
    # direct); after 1e38, relative to the largest output (1e36), as the transforms mix the
    # tile's inputs (Winograd's accuracy: Barabasz et al. 2018).
    far = np.ones(expected.shape, bool)
    far[..., 4:7, 4:7] = far[..., 19:22, :2] = False
    scale = np.abs(expected[np.isfinite(expected)]).max()
    np.testing.assert_allclose(got[far], expected[far], rtol=1e-4, atol=1e-5 * scale)
    near = np.isfinite(expected) & ~far  # 1e38 times a weight: finite, large
    np.testing.assert_allclose(got[near], expected[near], rtol=1e-4)


def test_strided_and_grouped_convs_stay_direct(tmp_path, x86_runnable):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.Conv2d(32, 32, 3, padding=1, groups=2))
    layouts = _conv_layouts(_build(model.eval(), torch.randn(1, 16, 16, 16), tmp_path, x86_runnable,
                                   winograd="always"))
    lanes = x86_runnable.vector_lanes()
    assert not any(layout.endswith((f"x2x2x{lanes}", f"x4x4x{lanes}")) for layout in layouts)


def test_bad_option_is_named(tmp_path):
    model = nn.Conv2d(16, 16, 3, padding=1).eval()
    with pytest.raises(ValueError, match="'winograd'.*True, False or 'always'"):
        _build(model, torch.randn(1, 16, 8, 8), tmp_path, None, winograd="fast")


def test_a_1x1_conv_reads_the_winograd_output_in_place(tmp_path, x86_runnable):
    """A bottleneck's 1x1 conv after a Winograd conv reads its 4x4-tiled output as stored (it
    takes the channel vector as its input channel tile): no conversion between them."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 1), nn.ReLU()).eval()
    built = _build(model, torch.randn(1, 16, 24, 24), tmp_path, x86_runnable)
    assert _conv_layouts(built)[0] == _tiled((1, 32, 24, 24), 4, x86_runnable.vector_lanes())
    assert [k.name for k in built.report.kernels if k.kind == "conversion" and not k.boundary] == []


class _Fire(nn.Module):
    """SqueezeNet's fire module (Iandola et al. 2016): a 1x1 squeeze, then 1x1 and 3x3
    expands concatenated along channels."""

    def __init__(self, channels: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(channels, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x):
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1x1(s)), torch.relu(self.expand3x3(s))], 1)


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_ragged_output_is_computed_in_whole_tiles(tmp_path, x86_runnable, dynamo):
    """A 23x23 map is twelve 2x2 tiles a side, the last ones half past the edge: the output is
    stored padded to 24x24 and the concatenation after it reads the 23x23 inside."""
    torch.manual_seed(7)
    model = _Fire(32, 16, 32).eval()
    built = _build(model, torch.randn(1, 32, 23, 23), tmp_path, x86_runnable, dynamo=dynamo)
    assert _tiled((1, 32, 23, 23), 2, x86_runnable.vector_lanes()) in _conv_layouts(built)
    assert [k.name for k in built.report.kernels if k.kind == "conversion" and not k.boundary] == []


@pytest.mark.parametrize("special", [np.inf, np.nan])
def test_a_special_value_at_a_ragged_edge_lands_where_the_direct_conv_puts_it(tmp_path, x86_runnable, special):
    """The last tiles of a ragged output cover outputs past the edge; a special value in the
    last input row and column flags them, and the direct recomputation of the tile (past
    the edge too) keeps the result exact where PyTorch's is."""
    torch.manual_seed(8)
    model = nn.Conv2d(16, 16, 3, padding=1).eval()
    x = torch.randn(1, 16, 23, 23)
    x[0, 2, 22, 22] = special
    got, expected = _specials_where_pytorch_puts_them(model, x, tmp_path, x86_runnable,
                                                      layout=_tiled((1, 16, 23, 23), 2, x86_runnable.vector_lanes()))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-4, atol=1e-5 * np.abs(expected[finite]).max())
