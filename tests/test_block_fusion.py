"""Inverted-residual blocks (expand 1x1 -> depthwise -> project 1x1), and a network's first
conv -> depthwise -> 1x1 (its stem), lowered as one kernel.

Each block is built fused (``fuse_blocks="always"``, as these maps are small enough to stay
in cache either way) and checked against PyTorch; the IR checks say what was fused.
"""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from alt_tvm.graph.build import build
from alt_tvm.graph.partition import plan_partitions, tail_pieces
from alt_tvm.graph.prepare import prepare
from alt_tvm.strategies.alt import block, conv
from alt_tvm.target import describe_cpu, resolve


class _InvertedResidual(nn.Module):  # MobileNet-V2's block: ReLU6 after expand and depthwise
    def __init__(self, c, o, *, expand=6, kernel=3, stride=1, residual=True, act=nn.ReLU6):
        super().__init__()
        m = c * expand
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.expand, self.act1 = nn.Conv2d(c, m, 1), act()
        self.dw, self.act2 = nn.Conv2d(m, m, kernel, stride, kernel // 2, groups=m), act()
        self.project = nn.Conv2d(m, o, 1)
        self.residual = residual and stride == 1 and c == o

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = self.project(self.act2(self.dw(self.act1(self.expand(x)))))
        return y + x if self.residual else y


CASES = {
    "stride1_residual": (dict(c=16, o=16), (1, 3, 20, 20)),
    "stride2": (dict(c=8, o=24, stride=2), (1, 3, 28, 28)),
    "kernel5_silu": (dict(c=8, o=16, kernel=5, act=nn.SiLU), (1, 3, 14, 14)),
    "odd_map_stride2": (dict(c=16, o=32, stride=2, expand=4), (1, 3, 15, 15)),
    "batch2": (dict(c=8, o=8), (2, 3, 12, 12)),
}

ALWAYS = {"alt": {"fuse_blocks": "always"}}


def _fused(built):
    return [k for k in built.report.kernels if k.kind == "partition" and k.ops.count("relax.nn.conv2d") == 3]


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_block_matches_pytorch(case):
    kwargs, shape = CASES[case]
    torch.manual_seed(0)
    model = _InvertedResidual(**kwargs).eval()
    x = torch.randn(*shape)
    built = build(model, example_inputs=[x], strategy_options=ALWAYS, strict=True)
    fused = _fused(built)
    assert len(fused) == 1, [k.ops for k in built.report.kernels]
    assert "then=nn.conv2d" in fused[0].workload
    if model.residual:
        assert fused[0].ops[-1] == "relax.add"  # the residual add is the project conv's epilogue
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert not [k for k in built.report.kernels if k.kind == "conversion" and not k.boundary]


class _Stem(nn.Module):  # MobileNet-V2 / MNASNet: first conv on the image, depthwise, pointwise
    def __init__(self, *, c=3, m=16, o=8, kernel=3, stride=2, padding=1, dw_kernel=3, dw_stride=1):
        super().__init__()
        self.first = nn.Conv2d(c, m, kernel, stride, padding)
        self.dw = nn.Conv2d(m, m, dw_kernel, dw_stride, dw_kernel // 2, groups=m)
        self.project = nn.Conv2d(m, o, 1)

    def forward(self, x):
        return self.project(nn.functional.relu6(self.dw(nn.functional.relu6(self.first(x)))))


STEMS = {
    "3x3_stride2": (dict(), (1, 3, 32, 32)),
    "3x3_stride2_odd_input": (dict(), (1, 3, 29, 29)),  # the conv's bottom/right padding is read
    "5x5_stride1_dw_stride2": (dict(c=4, kernel=5, stride=1, padding=2, dw_stride=2), (1, 4, 20, 20)),
    "3x3_unpadded": (dict(padding=0, dw_kernel=5), (1, 3, 30, 30)),
    "batch2": (dict(), (2, 3, 16, 16)),
}


@pytest.mark.parametrize("case", sorted(STEMS))
def test_a_first_conv_depthwise_pointwise_chain_is_one_kernel_and_matches_pytorch(case):
    """The stem's first conv (any kernel, stride and padding) is the block's expand conv: its
    output rows are computed per band from the input through the conv's window and padding."""
    kwargs, shape = STEMS[case]
    torch.manual_seed(0)
    model = _Stem(**kwargs).eval()
    x = torch.randn(*shape)
    built = build(model, example_inputs=[x], strategy_options=ALWAYS, strict=True)
    fused = _fused(built)
    assert len(fused) == 1 and [k for k in built.report.kernels if k.kind == "partition"] == fused
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    geometry = block.BlockGeometry.of(*_anchor_and_tail(model, x))
    assert not geometry.pointwise_expand and geometry.expand_taps == kwargs.get("kernel", 3) ** 2


#: This machine described with 32 vector registers (AVX-512), where blocks are fused by default.
WIDE = describe_cpu("skylake-avx512")


def _plan(model, x, options=None, target=None):
    """The build's partition plan of ``model`` on ``target`` (default: this machine)."""
    from alt_tvm.graph.frontend import load_model

    return plan_partitions(prepare(load_model(model, example_inputs=[x]).mod)["main"],
                           target=target or resolve(None), strategy_options=options)


def _anchor_and_tail(model, x):
    (fused,) = [p for p in _plan(model, x, ALWAYS).partitions if p.tail]
    return fused.anchor, fused.tail


#: MobileNet-V2's stem: 3x3 stride-2 conv on a 224x224 image, depthwise 3x3, 1x1 to 16 channels
STEM = block.BlockGeometry(n=1, c=3, m=32, o=16, h=112, w=112, oh=112, ow=112, kernel=(3, 3), stride=(1, 1),
                           pads=(1, 1, 1, 1), expand_kernel=(3, 3), expand_stride=(2, 2), expand_pads=(1, 1, 1, 1),
                           in_hw=(224, 224))


def _pointwise_like(geometry, channels):
    """The same block with a 1x1 expand conv of ``channels`` inputs."""
    return dataclasses.replace(geometry, c=channels, expand_kernel=(1, 1), expand_stride=(1, 1),
                               expand_pads=(0, 0, 0, 0), in_hw=None)


def test_a_stem_blocks_work_counts_the_first_convs_window():
    """The rule weighs the recomputed rows of a 3x3 first conv by its 27 taps per output, not 3."""
    stem, pointwise = STEM, _pointwise_like(STEM, 27)
    assert stem.flops(8) == pointwise.flops(8)  # 3 channels x 9 taps cost what 27 channels x 1 do
    assert block.work_ratio(stem, 8, cores=2) == pytest.approx(block.work_ratio(pointwise, 8, cores=2))
    assert 1 < block.work_ratio(stem, 8, cores=2) < block.MAX_WORK_RATIO


def test_single_row_bands_are_not_fused_by_default_and_nothing_with_the_option_off():
    """On a 7x7 map every band is one output row, whose three expanded rows are recomputed
    by the next band: more work than the rule allows (:data:`block.MAX_WORK_RATIO`)."""
    torch.manual_seed(0)
    model = _InvertedResidual(32, 32).eval()
    x = torch.randn(1, 3, 7, 7)
    for options in (None, {"alt": {"fuse_blocks": False}}):
        plan = _plan(model, x, options, target=WIDE)
        assert [p for p in plan.partitions if p.tail] == []
        assert sum(p.anchor.value.op.name == "relax.nn.conv2d" for p in plan.partitions) == 4


def test_fuse_blocks_option_rejects_other_values():
    torch.manual_seed(0)
    model = _InvertedResidual(8, 8).eval()
    with pytest.raises(ValueError, match="fuse_blocks.*True, False or 'always'.*'yes'"):
        build(model, example_inputs=[torch.randn(1, 3, 8, 8)], strategy_options={"alt": {"fuse_blocks": "yes"}})


def test_a_block_with_cheap_bands_is_fused_by_default_with_32_registers_and_not_with_16():
    torch.manual_seed(0)
    model = _InvertedResidual(16, 24, stride=2).eval()
    x = torch.randn(1, 3, 56, 56)
    narrow = describe_cpu("haswell")  # AVX2: 16 vector registers
    assert narrow.vector_registers < block.BLOCK_MIN_REGISTERS <= WIDE.vector_registers
    assert [p for p in _plan(model, x, target=narrow).partitions if p.tail] == []
    assert len([p for p in _plan(model, x, ALWAYS, target=narrow).partitions if p.tail]) == 1
    tails = [p for p in _plan(model, x, target=WIDE).partitions if p.tail]
    assert len(tails) == 1 and len(tail_pieces(tails[0])) == 3
    assert [len(piece.epilogue) for piece in tail_pieces(tails[0])] == [2, 2, 1]  # bias + clip, bias + clip, bias
    geometry = block.BlockGeometry.of(tails[0].anchor, tails[0].tail)
    assert (geometry.c, geometry.m, geometry.o, geometry.oh, geometry.stride) == (16, 96, 24, 28, (2, 2))


def test_a_fused_block_that_fails_is_lowered_as_three_kernels(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this block")

    monkeypatch.setattr("alt_tvm.strategies.alt.conv.implement_block", broken)
    torch.manual_seed(0)
    model = _InvertedResidual(16, 16).eval()
    x = torch.randn(1, 3, 12, 12)
    built = build(model, example_inputs=[x], strategy_options=ALWAYS)
    assert _fused(built) == []
    assert any("no kernel for this block" in why for why in built.report.failed.values())
    convs = [k for k in built.report.kernels if k.kind == "partition" and k.ops[0] == "relax.nn.conv2d"]
    assert len(convs) == 4  # stem, expand, depthwise, project: each an alt-tvm kernel, none left to TVM
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def _unfused_log(path, key, target):
    from alt_tvm.records import RecordWriter, TuningRecord, target_key

    with RecordWriter(path) as writer:
        writer.write(TuningRecord(workload_key=key, target=target_key(target.to_tvm()), latencies_ms=(1.0,),
                                  candidate={"decision": "in-model", "strategy": "alt", "params": None,
                                             "label": "unfused", "fuse": False}))
    return path


def test_a_log_that_builds_a_block_as_its_pieces_lowers_three_kernels_timed_as_the_block(tmp_path):
    from alt_tvm.records import read_log

    torch.manual_seed(0)
    model = _InvertedResidual(16, 16).eval()
    x = torch.randn(1, 3, 12, 12)
    (fused,) = _fused(build(model, example_inputs=[x], strategy_options=ALWAYS))
    log = read_log(_unfused_log(tmp_path / "log.jsonl", fused.workload, resolve(None)))
    assert set(log.unfused) == {fused.workload}
    built = build(model, example_inputs=[x], strategy_options=ALWAYS, records=log, strict=True)
    assert _fused(built) == [] and built.report.unfused == {fused.workload} and built.report.changed_by_log
    pieces = [k for k in built.report.kernels if k.kind == "partition" and k.workload == fused.workload]
    # expand, depthwise, project: each its own kernel, timed as the block the decision split
    assert [k.ops.count("relax.nn.conv2d") for k in pieces] == [1, 1, 1]
    assert built.report.tuning_of(fused.workload) == "tuned"
    assert "1 fused workloads built as their pieces" in built.report.tuning_summary()
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_splitting_a_workload_that_fuses_nothing_here_is_refused_with_the_reason():
    from alt_tvm.strategies.base import workload_key

    torch.manual_seed(0)
    model = _InvertedResidual(16, 16).eval()
    x = torch.randn(1, 3, 12, 12)
    from alt_tvm.graph.frontend import load_model

    func = prepare(load_model(model, example_inputs=[x]).mod)["main"]
    plan = plan_partitions(func, target=resolve(None), strategy_options=ALWAYS)
    stem = next(p for p in plan.partitions if not p.tail)
    (block_part,) = [p for p in plan.partitions if p.tail]
    keys = {workload_key(stem), workload_key(block_part)}
    split = plan_partitions(func, target=resolve(None), strategy_options=ALWAYS, unfused=keys)
    assert split.split == {workload_key(block_part)} and not [p for p in split.partitions if p.tail]
    assert "fuses nothing here" in split.refused[workload_key(stem)]
    # the pieces' anchors map to the block they came from; the stem is no piece
    assert sorted(set(split.pieces_of.values())) == [workload_key(block_part)] and len(split.pieces_of) == 3


def test_intensity_counts_the_convs_flops_per_byte_of_the_maps_fusion_keeps_out_of_memory():
    g = block.BlockGeometry(n=1, c=16, m=96, o=24, h=28, w=28, oh=14, ow=14, kernel=(3, 3), stride=(2, 2),
                            pads=(1, 1, 1, 1))
    flops = 2 * (16 * 96 * 28 * 28 + 9 * 96 * 14 * 14 + 96 * 24 * 14 * 14)
    assert g.unfused_flops == flops
    assert g.saved_bytes == 2 * 4 * 96 * (28 * 28 + 14 * 14)  # each map written once and read once
    assert g.intensity == pytest.approx(flops / g.saved_bytes)
    short = dataclasses.replace(g, o=96, project=False)  # ends at the depthwise map, which it writes
    assert short.saved_bytes == 2 * 4 * 96 * 28 * 28


def test_a_depthwise_conv_between_two_convs_of_its_width_is_not_fused_by_default(monkeypatch):
    """MobileNet-V1's shape (no expansion): the convs' work per byte of the maps fusion would
    keep in cache is above :data:`block.MAX_INTENSITY`; an inverted residual's 6x expansion
    of the same map is below it. Both are fused with the option ``"always"``."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 28, 28)
    narrow, wide = _InvertedResidual(128, 128, expand=1).eval(), _InvertedResidual(16, 16).eval()
    geometries = {}
    for name, model in (("narrow", narrow), ("wide", wide)):
        assert len([p for p in _plan(model, x, ALWAYS, target=WIDE).partitions if p.tail]) == 1
        (part,) = [p for p in _plan(model, x, ALWAYS, target=WIDE).partitions if p.tail]
        geometries[name] = block.BlockGeometry.of(part.anchor, part.tail)
    assert geometries["wide"].intensity <= block.MAX_INTENSITY < geometries["narrow"].intensity
    assert [p for p in _plan(narrow, x, target=WIDE).partitions if p.tail] == []
    assert len([p for p in _plan(wide, x, target=WIDE).partitions if p.tail]) == 1
    monkeypatch.setattr(conv, "MAX_INTENSITY", float("inf"))  # the bound alone decided
    assert len([p for p in _plan(narrow, x, target=WIDE).partitions if p.tail]) == 1


def test_the_intensity_bound_keeps_6x_expansions_fused_and_mobilevits_4x_blocks_of_64_channels_not():
    def geometry(c, m, o, size, stride=1):
        return block.BlockGeometry(n=1, c=c, m=m, o=o, h=size, w=size, oh=size // stride, ow=size // stride,
                                   kernel=(3, 3), stride=(stride, stride), pads=(1, 1, 1, 1))

    # MobileNet-V2's 6x expansions (5-13 FLOP/B), measured faster fused ...
    assert all(geometry(c, 6 * c, o, size).intensity <= block.MAX_INTENSITY
               for c, o, size in ((24, 24, 56), (32, 32, 28), (16, 24, 112)))
    # ... and MobileViT-S's 64 -> 256 -> 64 blocks on 64x64 maps (17, and 18 for the stride-2
    # one to 96 channels), measured faster as three kernels.
    assert geometry(64, 256, 64, 64).intensity == pytest.approx(17.125)
    assert block.MAX_INTENSITY < geometry(64, 256, 64, 64).intensity < geometry(64, 256, 96, 64, 2).intensity


def test_a_block_whose_weights_leave_no_room_in_the_l2_cache_for_a_band_is_not_fused():
    g = block.BlockGeometry(n=1, c=256, m=512, o=512, h=14, w=14, oh=14, ow=14, kernel=(3, 3), stride=(1, 1),
                            pads=(1, 1, 1, 1))
    assert g.weight_bytes == 4 * (256 * 512 + 9 * 512 + 512 * 512)
    rows = block.band_rows(g, row_tile=2, cores=2, l2_bytes=1 << 20)
    assert rows is not None  # the band alone fits half the cache ...
    assert not block.stays_in_l2(g, rows, l2_bytes=1 << 20)  # ... but not beside 1.5 MB of weights
    assert block.stays_in_l2(g, rows, l2_bytes=g.weight_bytes + g.band_bytes(rows))


def test_band_rows_fit_half_the_l2_cache_and_divide_the_output():
    geometry = block.BlockGeometry(n=1, c=16, m=96, o=24, h=112, w=112, oh=56, ow=56, kernel=(3, 3),
                                   stride=(2, 2), pads=(1, 1, 1, 1))
    rows = block.band_rows(geometry, row_tile=4, cores=2, l2_bytes=2 << 20)
    assert rows is not None and rows % 4 == 0 and 56 % rows == 0
    assert geometry.band_bytes(rows) <= 1 << 20
    assert block.band_rows(geometry, row_tile=4, cores=2, l2_bytes=64 << 10) is None  # no band fits 32 KiB


class _SqueezeExciteProject(nn.Module):  # EfficientNet's MBConv tail: SE scaling, then the project conv
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.reduce, self.expand = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
        self.project = nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = nn.functional.silu(self.dw(torch.relu(self.stem(x))))
        s = torch.sigmoid(self.expand(nn.functional.silu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return self.project(y * s)


@pytest.mark.parametrize("batch", [1, 2])
def test_squeeze_excitation_scaling_is_folded_into_the_next_conv_at_batch_1(batch):
    torch.manual_seed(0)
    model = _SqueezeExciteProject().eval()
    x = torch.randn(batch, 3, 14, 14)
    built = build(model, example_inputs=[x], strict=True)
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    scaled = [k for k in built.report.kernels if k.kind == "partition" and k.workload.endswith("|prologue=multiply")]
    multiplies = [k for k in built.report.kernels if k.ops == ("relax.multiply",)]
    if batch == 1:  # one weight scaling per call serves the whole map
        assert len(scaled) == 1 and multiplies == []
        func = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == scaled[0].name)
        assert "scaled_weight" in func.script()
    else:  # a scale per sample: the multiply stays a kernel of its own
        assert scaled == [] and len(multiplies) == 1
    assert not [k for k in built.report.kernels if k.kind == "conversion" and not k.boundary]


def test_a_stem_bands_buffers_count_its_input_rows():
    # 10 expanded rows of 114 positions read 21 input rows of 229 columns, 3 channels
    assert STEM.band_bytes(8) - _pointwise_like(STEM, 3).band_bytes(8) == 4 * 3 * 21 * 229


class _MBConv(nn.Module):  # EfficientNet's block: expand, depthwise, squeeze-excitation, project
    def __init__(self, *, c=8, m=48, o=16, kernel=3, stride=2):
        super().__init__()
        self.first = nn.Conv2d(3, c, 3, padding=1)
        self.expand = nn.Conv2d(c, m, 1)
        self.dw = nn.Conv2d(m, m, kernel, stride, kernel // 2, groups=m)
        self.reduce, self.restore = nn.Conv2d(m, 4, 1), nn.Conv2d(4, m, 1)
        self.project = nn.Conv2d(m, o, 1)

    def forward(self, x):
        y = nn.functional.silu(self.dw(nn.functional.silu(self.expand(torch.relu(self.first(x))))))
        s = torch.sigmoid(self.restore(nn.functional.silu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return self.project(y * s)


SHORT = {
    "stride2": (dict(), (1, 3, 16, 16)),
    "kernel5": (dict(kernel=5, stride=1), (1, 3, 12, 12)),
    "odd_map": (dict(m=40, stride=2), (1, 3, 15, 15)),
}


def _two_conv_kernels(built):
    return [k for k in built.report.kernels if k.kind == "partition" and k.ops.count("relax.nn.conv2d") == 2]


@pytest.mark.parametrize("case", sorted(SHORT))
def test_a_block_whose_depthwise_map_feeds_a_squeeze_excitation_ends_there_and_matches_pytorch(case):
    """The depthwise map has three readers (the mean, the scale, and through it the project
    conv): the fused kernel computes the expanded rows per band and writes the depthwise map,
    whose squeeze-excitation scale is still folded into the project conv's weights."""
    kwargs, shape = SHORT[case]
    torch.manual_seed(0)
    model = _MBConv(**kwargs).eval()
    x = torch.randn(*shape)
    built = build(model, example_inputs=[x], strategy_options=ALWAYS, strict=True)
    (fused,) = _two_conv_kernels(built)
    assert fused.ops == ("relax.nn.conv2d", "relax.add", "relax.sigmoid", "relax.multiply") * 2
    assert "then=nn.conv2d" in fused.workload and "groups" in fused.workload.split("then=")[1]
    assert [k for k in built.report.kernels if k.kind == "partition" and k.workload.endswith("|prologue=multiply")]
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert not [k for k in built.report.kernels if k.kind == "conversion" and not k.boundary]


def test_a_short_tail_that_fails_is_lowered_as_two_kernels(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this block")

    monkeypatch.setattr("alt_tvm.strategies.alt.conv.implement_block", broken)
    torch.manual_seed(0)
    model = _MBConv().eval()
    x = torch.randn(1, 3, 16, 16)
    (short,) = [p for p in _plan(model, x, ALWAYS).partitions if p.tail]
    assert [piece.anchor for piece in tail_pieces(short)] == [short.anchor, short.tail[0]]
    built = build(model, example_inputs=[x], strategy_options=ALWAYS)
    assert _two_conv_kernels(built) == []
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


#: EfficientNet-B0's 112x112 expand with a stride-2 depthwise conv, and its 56x56 block
#: (3x3, stride 1), each ending at the depthwise map
SHORT_112 = block.BlockGeometry(n=1, c=16, m=96, o=96, h=112, w=112, oh=56, ow=56, kernel=(3, 3), stride=(2, 2),
                                pads=(1, 1, 1, 1), project=False)
SHORT_56 = block.BlockGeometry(n=1, c=24, m=144, o=144, h=56, w=56, oh=56, ow=56, kernel=(3, 3), stride=(1, 1),
                               pads=(1, 1, 1, 1), project=False)


def test_a_short_tail_saves_one_map_so_it_allows_less_recomputation():
    """Without a project conv the fused kernel's work and buffers count two stages, and the
    default rule fuses only where recomputed rows add at most 15%: EfficientNet-B0's 112x112
    stride-2 block (1.11x the work, 0.88-0.92x the time) but not its 56x56 block (1.35x the
    work, 1.29x the time with the next one)."""
    assert SHORT_112.flops(4) == 2 * 16 * 96 * 112 * 9 + 2 * 9 * 96 * 4 * 56
    assert SHORT_112.band_bytes(4) == 4 * 96 * 9 * 114  # expanded rows only: no depthwise buffer
    assert block.work_ratio(SHORT_112, 4, cores=2) <= block.MAX_SHORT_WORK_RATIO
    assert block.MAX_SHORT_WORK_RATIO < block.work_ratio(SHORT_56, 8, cores=2) <= block.MAX_WORK_RATIO


def test_a_short_tails_tiling_writes_the_map_from_its_channel_vectors():
    tiling = block.BlockTiling(spatial=(2, 28), ot=32, mt=32, band_rows=4, expand_reg=8, dw_reg=0, project_reg=7)
    tiling.check(SHORT_112)
    for edit, message in ((dict(dw_reg=4), "dw_reg must be 0 \\(got 4\\)"), (dict(ot=16), "ot=16, mt=32")):
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(tiling, **edit).check(SHORT_112)


def test_a_stem_blocks_first_conv_takes_fewer_positions_per_register_block():
    """A stem's expand stage (27 taps per position) runs blocks of at most
    :data:`block.STEM_EXPAND_POSITIONS` positions; a 1x1 expand stage of the same block
    keeps the register budget's wider blocks."""
    from alt_tvm.strategies.alt.conv import ConvGeometry
    from alt_tvm.strategies.alt.patterns import split_block_tail

    torch.manual_seed(0)
    model = _Stem(m=32, o=16).eval()
    x = torch.randn(1, 3, 64, 64)
    plan = _plan(model, x, ALWAYS)
    (fused,) = [p for p in plan.partitions if p.tail]
    strategy, target = plan.strategy_of(fused), resolve(None)
    geometry = block.BlockGeometry.of(fused.anchor, fused.tail)
    project_tiling = strategy.default_tiling(ConvGeometry.of(split_block_tail(fused.tail)[2]), target)
    stem = block.default_block_tiling(geometry, project_tiling, target=target)
    pointwise = block.default_block_tiling(_pointwise_like(geometry, 27), project_tiling, target=target)
    assert stem.expand_reg <= block.STEM_EXPAND_POSITIONS < pointwise.expand_reg
    assert strategy._default_block_tiling(geometry, fused.tail, target) == stem
