"""Exact reorders of linear operators (:mod:`alt_tvm.graph.reorder`).

A segmentation head in the shape of SegFormer's all-MLP decoder: feature maps of three sizes
projected by 1x1 convolutions, upsampled to the largest size, concatenated and mixed by one
1x1 convolution. The rule must move the mixing convolution's slices before the upsampling
resizes, leave what it cannot prove equal alone, and keep the built model's results.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import torch_to_onnx
from test_canonical import ort_run

import alt_tvm
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.prepare import prepare
from alt_tvm.strategies.base import static_shape


class Head(torch.nn.Module):
    """``sizes``: each input map's side; the maps are resized to ``out`` with ``mode``."""

    def __init__(self, *, out: int = 16, mode: str = "bilinear", align_corners: bool | None = False,
                 mix: int = 1, also_return_concat: bool = False):
        super().__init__()
        self.out, self.mode, self.align_corners = out, mode, align_corners
        self.also_return_concat = also_return_concat
        # 16 channels: whole vectors of 16 and 8 lanes, so the resizes can write channel vectors
        self.proj = torch.nn.ModuleList(torch.nn.Conv2d(c, 16, 1) for c in (4, 6, 10))
        self.fuse = torch.nn.Conv2d(48, 16, mix, padding=mix // 2, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, a, b, c):
        parts = []
        for proj, x in zip(self.proj, (a, b, c)):
            y = proj(x)
            parts.append(F.interpolate(y, size=(self.out, self.out), mode=self.mode, align_corners=self.align_corners))
        cat = torch.cat(parts[::-1], dim=1)
        out = torch.relu(self.bn(self.fuse(cat)))
        return (out, cat) if self.also_return_concat else out


def inputs(sides=(16, 8, 4)):
    torch.manual_seed(0)
    return tuple(torch.randn(1, c, s, s) for c, s in zip((4, 6, 10), sides))


def prepared(model, xs):
    return prepare(load_model(model, example_inputs=xs).mod)["main"]


def bindings(func, op):
    return [b for block in func.body.blocks for b in block.bindings
            if getattr(getattr(b.value, "op", None), "name", None) == op]


def shape(expr):
    return static_shape(expr)


def build_quietly(model, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return alt_tvm.build(model, **options)


@pytest.mark.parametrize("mode, align_corners", [("bilinear", False), ("bilinear", True), ("nearest", None)])
def test_the_mixing_convolution_moves_before_each_upsampling(mode, align_corners):
    torch.manual_seed(1)
    model, xs = Head(mode=mode, align_corners=align_corners).eval(), inputs()
    func = prepared(model, xs)
    assert not bindings(func, "relax.concat")
    convs = bindings(func, "relax.nn.conv2d")
    # three projections, the 16x16 map's slice (its resize to its own size dropped), two low-resolution slices
    assert sorted(shape(b.var)[1:] for b in convs) == [(16, 4, 4), (16, 4, 4), (16, 8, 8), (16, 8, 8),
                                                       (16, 16, 16), (16, 16, 16)]
    resizes = bindings(func, "relax.image.resize2d")
    assert sorted(shape(b.value.args[0])[2] for b in resizes) == [4, 8]
    built = build_quietly(model, example_inputs=xs)
    (out,) = built(*(x.numpy() for x in xs))
    np.testing.assert_allclose(out, model(*xs).detach().numpy(), rtol=1e-4, atol=1e-4)
    # the resizes write channel vectors, which the mixing convolution's epilogue reads as such
    resizes = [k for k in built.report.kernels if "relax.image.resize2d" in k.ops]
    assert len(resizes) == 2 and all(k.layout for k in resizes), [(k.ops, k.layout) for k in resizes]


@pytest.mark.parametrize("dynamo", [False, True])
def test_the_rewritten_onnx_head_matches_onnxruntime(dynamo, tmp_path):
    model, xs = Head().eval(), inputs()
    path = tmp_path / "head.onnx"
    torch_to_onnx(model, xs, path, dynamo=dynamo)
    assert not bindings(prepare(load_model(str(path)).mod)["main"], "relax.concat")
    built = build_quietly(str(path))
    (out,) = built(*(x.numpy() for x in xs))
    np.testing.assert_allclose(out, ort_run(path, xs)[0], rtol=1e-4, atol=1e-4)


def test_what_the_rule_cannot_prove_cheaper_or_equal_stays():
    xs = inputs()
    # the concatenation is also a result: computing it anyway, nothing is saved
    assert bindings(prepared(Head(also_return_concat=True).eval(), xs), "relax.concat")
    # a 3x3 mixing convolution does not commute with a resize
    assert bindings(prepared(Head(mix=3).eval(), xs), "relax.concat")
    # every map resized down (to 4x4): no part is upsampled, so nothing is gained
    assert bindings(prepared(Head(out=4).eval(), xs), "relax.concat")


def test_a_downsampled_part_stays_concatenated_with_the_unresized_ones():
    model, xs = Head(out=8).eval(), inputs()  # 16x16 down to 8x8, 8x8 kept, 4x4 up to 8x8
    func = prepared(model, xs)
    (concat,) = bindings(func, "relax.concat")
    assert [shape(f)[1] for f in concat.value.args[0].fields] == [16, 16]  # the downsampled map and the 8x8 one
    (resize_up,) = [b for b in bindings(func, "relax.image.resize2d") if shape(b.value.args[0])[2] == 4]
    assert shape(resize_up.var) == (1, 16, 8, 8)
    built = build_quietly(model, example_inputs=xs)
    (out,) = built(*(x.numpy() for x in xs))
    np.testing.assert_allclose(out, model(*xs).detach().numpy(), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ multi-branch blocks in training form


def bn(channels: int) -> torch.nn.BatchNorm2d:
    norm = torch.nn.BatchNorm2d(channels)
    with torch.no_grad():  # non-trivial statistics, so a wrong merge shows
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
        norm.weight.uniform_(0.5, 2)
        norm.bias.uniform_(-1, 1)
    return norm


class RepBlock(torch.nn.Module):
    """RepVGG / MobileOne: ``kernel`` conv + BN, 1x1 conv + BN and (stride 1) BN of the input, summed."""

    def __init__(self, channels: int = 8, *, kernel: int = 3, stride: int = 1, groups: int = 1,
                 identity: bool = True):
        super().__init__()
        self.big = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, kernel, stride, kernel // 2,
                                                       groups=groups, bias=False), bn(channels))
        self.small = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 1, stride, groups=groups, bias=False),
                                         bn(channels))
        self.identity = bn(channels) if identity and stride == 1 else None

    def forward(self, x):
        y = self.big(x) + self.small(x)
        return torch.relu(y + self.identity(x) if self.identity is not None else y)


class RepMixer(torch.nn.Module):
    """FastViT's mixer in training form: ``x + scale * (mixer(x) - norm(x))``, where the mixer
    sums a 3x3 and a 1x1 depthwise conv and a BN of ``x``; ``norm(x)`` is used twice."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.dw3 = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 3, 1, 1, groups=channels, bias=False),
                                       bn(channels))
        self.dw1 = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 1, groups=channels, bias=False),
                                       bn(channels))
        self.norm = bn(channels)
        self.scale = torch.nn.Parameter(torch.rand(channels, 1, 1))

    def forward(self, x):
        normed = self.norm(x)
        mixed = self.dw3(x) + self.dw1(x) + normed
        return torch.nn.functional.gelu(x + self.scale * (mixed - normed))


def conv_count(model, xs) -> int:
    return len(bindings(prepared(model, xs), "relax.nn.conv2d"))


@pytest.mark.parametrize("block", [RepBlock(), RepBlock(stride=2), RepBlock(groups=2), RepBlock(groups=8, kernel=5),
                                   RepMixer()], ids=["repvgg", "strided", "grouped", "depthwise-5x5", "repmixer"])
def test_a_sum_of_branches_over_one_map_is_one_convolution(block):
    torch.manual_seed(0)
    model = block.eval()
    x = torch.randn(1, 16 if isinstance(block, RepMixer) else 8, 12, 12)
    assert conv_count(model, (x,)) == 1
    built = build_quietly(model, example_inputs=(x,))
    (out,) = built(x.numpy())
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dynamo", [False, True])
def test_both_exports_of_a_repmixer_merge_and_match_onnxruntime(dynamo, tmp_path):
    torch.manual_seed(0)
    model, x = RepMixer().eval(), torch.randn(1, 16, 12, 12)
    path = tmp_path / "mixer.onnx"
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    assert len(bindings(prepare(load_model(str(path)).mod)["main"], "relax.nn.conv2d")) == 1
    (out,) = build_quietly(str(path))(x.numpy())
    np.testing.assert_allclose(out, ort_run(path, (x,))[0], rtol=1e-4, atol=1e-4)


class Crossed(torch.nn.Module):
    """A 5x1 and a 1x5 conv of one map (the merged 5x5 would cost five times more)."""

    def __init__(self):
        super().__init__()
        self.tall = torch.nn.Conv2d(8, 8, (5, 1), padding=(2, 0))
        self.wide = torch.nn.Conv2d(8, 8, (1, 5), padding=(0, 2))

    def forward(self, x):
        return self.tall(x) + self.wide(x)


class TwoMaps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 1)

    def forward(self, x, y):
        return self.a(x) + self.b(y)


def test_branches_that_would_not_merge_into_the_widest_window_stay_apart():
    torch.manual_seed(0)
    x = torch.randn(1, 8, 12, 12)
    assert conv_count(Crossed().eval(), (x,)) == 2
    assert conv_count(TwoMaps().eval(), (x, x.clone())) == 2
    dilated = RepBlock(identity=False).eval()
    dilated.big[0].dilation, dilated.big[0].padding = (2, 2), (2, 2)
    assert conv_count(dilated, (x,)) == 2
