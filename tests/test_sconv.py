"""SConv: CSA against hand-computed equations, the TIR kernel against PyTorch, the build strategy."""


import re

import numpy as np
import pytest
import torch
import tvm
from kernel_digests import PINNED

from alt_tvm.strategies.sconv.csa import (
    PAPER_AVX512,
    ConvShape,
    CSAParams,
    MicroKernel,
    analyze,
    conv_cycles,
    fit_filters,
    micro_kernel_for,
    micro_kernel_for_conv,
    schedule_cost,
)
from alt_tvm.strategies.sconv.kernel import SConvOptions, build_sconv, lower_sconv, sconv_geometry
from alt_tvm.target import HardwareTarget, board, host

# The paper's x86 machine (Table 1): Xeon Silver 4208, AVX-512, 32 KiB L1d, 1 MiB L2, 4 MiB L3.
CASCADE_LAKE = HardwareTarget(
    name="cascadelake", description="Xeon Silver 4208 (paper Table 1)",
    tvm_target={"kind": "llvm", "mcpu": "cascadelake"}, num_cores=1, vector_bits=512, vector_registers=32,
    l1d_bytes=32 * 1024, l2_bytes=1 << 20, l3_bytes=4 << 20, cache_line_bytes=64)
AVX2 = HardwareTarget(
    name="avx2", description="AVX2 desktop", tvm_target={"kind": "llvm", "mcpu": "haswell"}, num_cores=4,
    vector_bits=256, vector_registers=16, l1d_bytes=32 * 1024, l2_bytes=256 * 1024, l3_bytes=8 << 20,
    cache_line_bytes=64)
R18_3X3 = ConvShape.symmetric(n=1, c=64, h=56, w=56, k=64, r=3, s=3, pad=1)


# ------------------------------------------------------------------------------------ CSA
def test_micro_kernel_is_sized_by_fma_and_load_throughput():
    # AVX-512, 24 accumulators: 16 x 24 (the paper's, PAPER_AVX512) needs 25 loads per 24 FMAs,
    # 12.5 cycles on two load ports; 2 window vectors x 12 filters need 14 loads: FMA-bound, 12.
    avx512 = micro_kernel_for(CASCADE_LAKE)
    assert (avx512.n_win, avx512.n_f, avx512.window_vectors) == (32, 12, 2)
    assert (PAPER_AVX512.n_win, PAPER_AVX512.n_f) == (16, 24)
    # One load port: loads bind earlier, so more window vectors (3 x 8: 11 loads, 11 cycles).
    assert micro_kernel_for(CASCADE_LAKE, load_ports=1).window_vectors == 3
    mk = micro_kernel_for(host())
    assert mk.n_f * mk.window_vectors <= 0.75 * host().vector_registers
    # NEON: lane-indexed FMAs make filter loads cheap, FMA-bound already with 1 vector x 24 filters.
    assert (micro_kernel_for(board("kirin990")).n_win, micro_kernel_for(board("kirin990")).n_f) == (4, 24)
    # RVV 256-bit: 8 lanes, 32 registers, scalar-operand FMAs -> 2 vectors x 12 filters.
    assert (micro_kernel_for(board("bananapi-f3")).n_win, micro_kernel_for(board("bananapi-f3")).n_f) == (16, 12)
    # AVX2: 16 registers, 12 accumulators, 2 vectors x 6 filters (8 loads, FMA-bound).
    assert (micro_kernel_for(AVX2).n_win, micro_kernel_for(AVX2).n_f) == (16, 6)
    with pytest.raises(ValueError, match="vector registers"):
        micro_kernel_for(board("v100"))
    with pytest.raises(ValueError, match="load_ports"):
        micro_kernel_for(host(), load_ports=0)


def test_fit_filters_narrows_n_f_to_pad_output_channels_least():
    avx512 = PAPER_AVX512  # 16 x 24; candidates 16..24
    assert [fit_filters(avx512, k).n_f for k in (16, 48, 64, 50, 1000)] == [16, 24, 16, 17, 20]
    assert fit_filters(avx512, 5).n_f == 16  # a single tile either way: the smallest allowed
    assert [fit_filters(micro_kernel_for(CASCADE_LAKE), k).n_f for k in (64, 96, 1000)] == [8, 12, 10]
    with pytest.raises(ValueError, match="out_channels"):
        fit_filters(avx512, 0)


def test_csa_resnet18_3x3_on_the_papers_x86_by_hand():
    plan = analyze(R18_3X3, CASCADE_LAKE, micro=PAPER_AVX512)
    # Eq. (1)-(2): Nc halves 64 -> 32 -> 16; at 16: 16*16*9*4 + 24*16*9*4 + 16*24*4 = 24576 <= 0.9*32768.
    assert 64 * 9 * 4 * (16 + 24) + 1536 > 0.9 * 32768 and 32 * 9 * 4 * (16 + 24) + 1536 > 0.9 * 32768
    assert (plan.n_c, plan.channel_sets) == (16, 4)
    assert (plan.in_tile_bytes, plan.fs_tile_bytes, plan.out_tile_bytes) == (9216, 13824, 1536)
    assert (plan.in_tiles, plan.fs_tiles) == (196, 3)  # eq. (3): ceil(56*56/16), ceil(64/24)
    is_cost, ws_cost = plan.costs
    # IS, eq. (4): 9216 + 3*(13824+1536) <= 0.9 MiB -> K2 = #FS = 3; eq. (5): K3 = #IN = 196.
    assert (is_cost.k2, is_cost.k3) == (3, 196)
    # WS, eq. (4): 13824 + K2*(9216+1536) <= 943718.4 -> K2 <= 86: 196 -> 98 -> 49.
    # eq. (5): 13824*K3 + 49*9216 + 49*1536*K3 <= 3774873.6 -> K3 <= 37: K3 = #FS = 3.
    assert (ws_cost.k2, ws_cost.k3) == (49, 3)
    # Eqs. (6)-(14), computed by hand (cost per line: L2 14, L3 50, DRAM 200 cycles).
    dram1 = 4 * (196 * 9216 + 3 * 13824) / 64
    assert is_cost.n_dram1 == ws_cost.n_dram1 == dram1 == 115488
    assert (is_cost.n_dram2, is_cost.n_l3, is_cost.n_l2) == (0, 0, 4 * 195 * 3 * 13824 / 64)
    assert is_cost.total == 200 * dram1 + 14 * 505440
    assert (ws_cost.n_dram2, ws_cost.n_l3, ws_cost.n_l2) == (0, 4 * 3 * 3 * 13824 / 64, 4 * 2 * 196 * 9216 / 64)
    assert ws_cost.total == 200 * dram1 + 50 * 7776 + 14 * 225792
    # §7.2: the 24-filter x86 micro-kernel makes WS the cheaper schedule ...
    assert plan.schedule == "WS" and (plan.k2, plan.k3) == (49, 3)
    # ... and POWER10's 8x16 micro-kernel makes IS cheaper on the same caches.
    p10 = analyze(R18_3X3, CASCADE_LAKE, micro=MicroKernel(n_win=16, n_f=8, lanes=4, window_vectors=4,
                                                            registers=64))
    assert p10.schedule == "IS" and p10.n_c == 32


def test_csa_dram_reloads_when_filters_do_not_fit_l2():
    # Eqs. (9)-(11): K2 < #FS and K3 < #IN -> (#IN/K3 - 1) extra passes over all filters.
    cost = schedule_cost(schedule="IS", channel_sets=2, in_tiles=8, fs_tiles=6, in_bytes=640, fs_bytes=1280,
                         k2=2, k3=4, line=64, params=CSAParams())
    assert cost.n_dram2 == 2 * 1 * 1 * 6 * 1280 / 64
    assert cost.n_l3 == 2 * 2 * 8 * 640 / 64  # FS_fit = 6/2 - 1 = 2
    assert cost.n_l2 == 2 * 7 * 6 * 1280 / 64


def test_small_images_take_a_narrower_micro_kernel_when_it_wastes_less():
    from conftest import x86_description

    avx512 = x86_description("avx512")  # the counts below are for 16 lanes and 32 registers
    small = ConvShape.symmetric(n=1, c=48, h=7, w=7, k=128, r=5, s=5, pad=2)  # GoogLeNet inception5b.b3b
    wide = fit_filters(micro_kernel_for(avx512), 128)
    narrow = micro_kernel_for_conv(small, avx512)
    # 73 windows ((7-1) x 11 + 7): 3 tiles of 32 x 16 filter tiles x 8 cycles per update,
    # or 5 tiles of 16 x 8 filter tiles of 16 x 8.5 cycles (17 loads over 2 ports).
    assert (wide.n_win, wide.n_f, narrow.n_win, narrow.n_f) == (32, 8, 16, 16)
    assert conv_cycles(small, wide, avx512) == 3 * 16 * 48 * 25 * 8
    assert conv_cycles(small, narrow, avx512) == 5 * 8 * 48 * 25 * 8.5
    assert micro_kernel_for_conv(R18_3X3, host()) == fit_filters(micro_kernel_for(host()), 64)
    # 13x13 pointwise, 48 filters: 6 tiles of 32 x 4 x 12 cycles vs 11 of 16 x 2 x 12.5 (4.5% less)
    squeeze = ConvShape.symmetric(n=1, c=256, h=13, w=13, k=48, r=1, s=1)
    assert micro_kernel_for_conv(squeeze, avx512).n_win == 16
    assert micro_kernel_for_conv(squeeze, avx512, margin=0.05).n_win == 32
    assert micro_kernel_for_conv(small, host(), fit=False).n_f >= micro_kernel_for_conv(small, host()).n_f
    with pytest.raises(ValueError, match="margin"):
        micro_kernel_for_conv(small, host(), margin=1.5)


def test_csa_reduces_pointwise_convolutions_in_one_channel_set():
    shape = ConvShape.symmetric(n=1, c=1024, h=14, w=14, k=256, r=1, s=1)
    assert analyze(shape, host()).channel_sets == 1 and analyze(shape, host()).schedule == "IS"
    paper = analyze(shape, host(), params=CSAParams(pointwise_one_set=False))
    # eq. (2) alone: input tile + filter tile + output tile within alpha * L1
    assert paper.channel_sets > 1 and (paper.in_tile_bytes + paper.fs_tile_bytes + paper.out_tile_bytes
                                       <= 0.9 * host().l1d_bytes)
    strided = ConvShape.symmetric(n=1, c=1024, h=14, w=14, k=256, r=1, s=1, stride=2)
    assert analyze(strided, host()).channel_sets > 1  # not pointwise in the paper's sense


def test_csa_edges_absent_l3_and_parameters():
    shape = ConvShape.symmetric(n=1, c=3, h=17, w=19, k=50, r=7, s=7, stride=2, pad=3)
    plan = analyze(shape, host(), micro=PAPER_AVX512)
    assert plan.n_c == 3 and plan.edge_channels == 3
    assert plan.edge_filters == 50 - 2 * 24 and plan.edge_windows == 9 * 10 - 5 * 16
    # No L3 (the RISC-V board): eq. (5) never holds, so K3 falls to 1.
    rv = analyze(R18_3X3, board("bananapi-f3"))
    assert (rv.costs[0].k3, rv.costs[1].k3) == (1, 1)
    # alpha scales the L1 budget: a quarter of it halves Nc twice more.
    assert analyze(R18_3X3, CASCADE_LAKE, params=CSAParams(alpha=0.9 / 4), micro=PAPER_AVX512).n_c == 4
    assert analyze(R18_3X3, CASCADE_LAKE, schedule="IS").schedule == "IS"
    with pytest.raises(ValueError, match="alpha"):
        CSAParams(alpha=1.5)
    with pytest.raises(ValueError, match="ConvShape.k"):
        ConvShape.symmetric(n=1, c=3, h=8, w=8, k=0, r=3, s=3)
    with pytest.raises(ValueError, match="larger than the padded input"):
        ConvShape.symmetric(n=1, c=3, h=2, w=8, k=4, r=3, s=3)
    with pytest.raises(ValueError, match="schedule"):
        analyze(R18_3X3, host(), schedule="XS")


# --------------------------------------------------------------------------------- kernel
CASES = [
    # n, c, h, w, k, r, s, stride, pad, schedule, vbp
    (1, 16, 12, 12, 32, 3, 3, 1, 1, "IS", True),
    (1, 16, 12, 12, 32, 3, 3, 1, 1, "WS", True),
    (1, 16, 12, 12, 32, 3, 3, 1, 1, "WS", False),
    (2, 5, 13, 11, 7, 3, 3, 1, 0, None, True),  # batch 2, nothing divides
    (1, 3, 17, 19, 50, 7, 7, 2, 3, None, True),  # stride 2, pad 3, odd sizes, 2 filter tiles + edge
    (1, 24, 15, 9, 40, 3, 3, 2, 1, "IS", False),  # stride 2
    (2, 20, 9, 11, 30, 1, 1, 1, 0, None, True),  # pointwise, batch 2
    (1, 64, 14, 14, 100, 1, 1, 2, 0, "WS", True),  # 1x1 stride 2
    (1, 80, 7, 7, 33, 3, 3, 1, 1, None, True),  # several channel sets (edge set) on a 7x7 map
]


@pytest.mark.parametrize("n,c,h,w,k,r,s,stride,pad,schedule,vbp", CASES)
def test_sconv_matches_pytorch(n, c, h, w, k, r, s, stride, pad, schedule, vbp):
    rng = np.random.default_rng(n * 1000 + c * 10 + k)
    shape = ConvShape.symmetric(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=stride, pad=pad)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((k, c, r, s), dtype=np.float32)
    kernel = build_sconv(shape, wt, options=SConvOptions(schedule=schedule, vbp=vbp))
    if schedule:
        assert kernel.plan.schedule == schedule
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), stride=stride, padding=pad).numpy()
    np.testing.assert_allclose(kernel(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("micro", [PAPER_AVX512, MicroKernel(n_win=48, n_f=8, lanes=16, window_vectors=3,
                                                            registers=32)], ids=["paper-16x24", "3-vectors"])
@pytest.mark.parametrize("stride,vbp", [(1, True), (2, False)])
def test_sconv_other_micro_kernels_match_pytorch(micro, stride, vbp):
    shape = ConvShape.symmetric(n=1, c=12, h=15, w=13, k=30, r=3, s=3, stride=stride, pad=1)
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((1, 12, 15, 13), dtype=np.float32)
    wt = rng.standard_normal((30, 12, 3, 3), dtype=np.float32)
    kernel = build_sconv(shape, wt, options=SConvOptions(micro=micro, vbp=vbp))
    assert (kernel.plan.n_win, kernel.plan.micro.window_vectors) == (micro.n_win, micro.window_vectors)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), stride=stride, padding=1).numpy()
    np.testing.assert_allclose(kernel(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_sconv_asymmetric_padding_and_several_channel_sets():
    shape = ConvShape(1, 40, 10, 9, 26, 3, 2, 1, 2, 0, 1, 2, 0)  # pads top 0, left 1, bottom 2, right 0
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 40, 10, 9), dtype=np.float32)
    wt = rng.standard_normal((26, 40, 3, 2), dtype=np.float32)
    kernel = build_sconv(shape, wt, options=SConvOptions(params=CSAParams(alpha=0.2)))
    assert kernel.plan.channel_sets > 1
    xp = np.pad(x, ((0, 0), (0, 0), (0, 2), (1, 0)))
    ref = torch.nn.functional.conv2d(torch.from_numpy(xp), torch.from_numpy(wt), stride=(1, 2)).numpy()
    np.testing.assert_allclose(kernel(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("n,c,h,w,k,one_set", [
    (1, 16, 9, 11, 24, True),  # 99 positions: the last tile overlaps its predecessor
    (2, 20, 9, 8, 13, True),  # batch 2; 13 filters padded to 16, the 3 padding rows not stored
    (1, 96, 7, 9, 40, False),  # several channel sets: accumulate, then crop through the overlap
])
def test_pointwise_writes_the_output_from_registers(n, c, h, w, k, one_set):
    shape = ConvShape.symmetric(n=n, c=c, h=h, w=w, k=k, r=1, s=1)
    rng = np.random.default_rng(c)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((k, c, 1, 1), dtype=np.float32)
    params = CSAParams() if one_set else CSAParams(alpha=0.1, pointwise_one_set=False)
    options = SConvOptions(params=params, threads=2)
    kernel = build_sconv(shape, wt, options=options)
    g = kernel.geometry
    assert g.direct and g.tiles * g.n_win > h * w and (g.kp > k) == (k == 13)
    assert g.writes_output == (g.plan.channel_sets == 1) == one_set
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt)).numpy()
    np.testing.assert_allclose(kernel(x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # With one channel set, no accumulator buffer and no crop pass remain.
    script = lower_sconv(shape, options=options)[0].script()
    assert ("sconv_acc = T.sblock_alloc_buffer" in script) != g.writes_output
    assert ('T.sblock("sconv_out")' in script) != g.writes_output


def test_phase_image_holds_only_the_phases_filter_taps_read():
    from alt_tvm.strategies.sconv.kernel import build_sconv_packing

    down = ConvShape.symmetric(n=1, c=8, h=14, w=14, k=16, r=1, s=1, stride=2)  # ResNet downsample
    assert build_sconv_packing(down).phase_shape[2:4] == (1, 1)
    first = ConvShape.symmetric(n=1, c=3, h=20, w=20, k=8, r=7, s=7, stride=2, pad=3)
    assert build_sconv_packing(first).phase_shape[2:4] == (2, 2)
    assert build_sconv_packing(ConvShape.symmetric(n=1, c=8, h=9, w=9, k=8, r=1, s=1)).phase is None


#: Register shifts and permutes: AVX2's lane-crossing pair and AVX-512's two-source permutes.
SHIFT_OPS = re.compile(r"\n\s+(vperm2f128|vshufps|valignd|vpermt2ps|vpermi2ps|vpalignr)\b")


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_vector_based_packing_emits_register_shifts(isa):
    # Code generation only, for pinned descriptions: the AVX-512 code is read, not run.
    shape = ConvShape.symmetric(n=1, c=8, h=10, w=10, k=24, r=3, s=3, pad=1)
    weight = np.ones((24, 8, 3, 3), np.float32)

    def shifts(vbp: bool) -> int:
        kernel = build_sconv(shape, weight, target=PINNED[isa], options=SConvOptions(vbp=vbp))
        return len(SHIFT_OPS.findall(kernel.module.inspect_source("asm")))

    assert shifts(True) > 0 and shifts(False) == 0


#: An AVX-512 CPU pinned whole (16 float lanes, 32 vector registers, its cores and caches): the
#: geometry below is worked out for it, whatever machine runs the tests.
AVX512 = PINNED["avx512"]


def test_geometry_pads_tiles_to_whole_sets_and_the_weight_shape_is_checked():
    plan = analyze(R18_3X3, AVX512)
    geo = sconv_geometry(plan)
    # 64 channels x 3x3 = 576 MACs per output: accumulate tile-major; 1x1 and the 3-channel
    # first layer keep filter-major rows (their crop would have to gather).
    assert geo.tile_major
    assert not sconv_geometry(analyze(ConvShape.symmetric(n=1, c=3, h=32, w=32, k=16, r=7, s=7, stride=2, pad=3),
                                      AVX512)).tile_major
    assert not geo.direct and sconv_geometry(analyze(ConvShape.symmetric(n=1, c=8, h=9, w=9, k=8, r=1, s=1),
                                                     AVX512)).direct
    assert geo.wq == 58 and geo.q >= 55 * 58 + 56 and geo.q % 16 == 0
    in_set = geo.k3 if plan.schedule == "IS" else geo.k2
    assert geo.tiles % in_set == 0 and geo.kp % 24 == 0 and geo.kp >= 64
    with pytest.raises(ValueError, match="expected"):
        build_sconv(R18_3X3, np.zeros((64, 64, 3, 1), np.float32))
    with pytest.raises(ValueError, match="schedule"):
        SConvOptions(schedule="both")


# ---------------------------------------------------------------------------- the build
class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.c = torch.nn.Conv2d(32, 32, 1)
        self.d = torch.nn.Conv2d(32, 24, 1)
        self.fc = torch.nn.Linear(24, 10)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.relu(self.b(y))
        y = torch.relu(self.c(y) + y)  # pointwise: bias, residual and ReLU written from registers
        y = self.d(y) + 1.0
        return self.fc(y.mean(dim=(2, 3)))


def test_sconv_strategy_builds_a_cnn_that_matches_pytorch():
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    import alt_tvm.strategies.sconv.kernel  # noqa: F401 - registers "sconv"
    from alt_tvm.graph.prepare import prepare
    from alt_tvm.graph.propagate import AltLayoutPass

    torch.manual_seed(0)
    model = SmallCNN().eval()
    x = torch.rand(2, 3, 20, 18)
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=False)
    alt_pass = AltLayoutPass(strategies=["sconv"])
    mod = alt_pass(prepare(mod))
    strategies = [p[0] for p in alt_pass.report.partitions]
    assert strategies == ["sconv"] * 4, alt_pass.report.partitions
    vm = relax.VirtualMachine(tvm.compile(mod, target=host().to_tvm()), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy(), tvm.cpu()))
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(out[0].numpy(), ref, rtol=1e-4, atol=1e-4)


def test_sconv_is_not_chosen_over_alt_by_default():
    import alt_tvm.strategies.alt.conv  # noqa: F401
    from alt_tvm.strategies import registry

    conv = [s for s in registry.registered_strategies() if "relax.nn.conv2d" in s.ops]
    by_name = {s.name: s.priority for s in conv}
    assert by_name["sconv"] < by_name["alt"]


@pytest.mark.slow
def test_resnet18_built_with_sconv_matches_onnx_runtime(tmp_path):
    """ResNet-18 built whole with SConv convolutions (about 25 s to build); run with ``-m slow``."""
    models = pytest.importorskip("alt_tvm.models")
    ort = pytest.importorskip("onnxruntime")
    import alt_tvm.strategies.sconv.kernel  # noqa: F401
    from alt_tvm.graph.build import build

    model, inputs = models.get_model("resnet18", batch=1)
    compiled = build(model, strategies=["sconv"], example_inputs=inputs)
    assert [p[0] for p in compiled.report.partitions] == ["sconv"] * 20
    out = compiled(*[x.numpy() for x in inputs])
    out = out[0] if isinstance(out, (list, tuple)) else out
    out = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    path = tmp_path / "resnet18.onnx"
    models.export_onnx("resnet18", path, batch=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: inputs[0].numpy()})[0]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
