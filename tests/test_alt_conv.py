"""The ALT conv2d template of the R18 case study: every layout kind, scheduled, matches PyTorch."""

import dataclasses

import numpy as np
import pytest
import torch
import tvm
from conftest import host_target, one_record_log
from tvm import te

from alt_tvm.layout import rewrite
from alt_tvm.strategies.alt.case_study import (
    R18_FIRST_LAYER,
    Conv2dWorkload,
    ConvTiling,
    conv2d_graph,
    conv2d_layouts,
    schedule_conv2d,
)


def _build_and_check(workload, kind, tiling):
    graph = conv2d_graph(workload)
    result = rewrite([graph.out], layouts=conv2d_layouts(graph, workload, kind=kind, tiling=tiling))
    func = te.create_prim_func(result.args(graph.args))
    module = tvm.compile(schedule_conv2d(func, graph, kind=kind, tiling=tiling), target=host_target()).jit()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((workload.n, workload.c, workload.h, workload.w), dtype=np.float32)
    w = rng.standard_normal((workload.o, workload.c, workload.kh, workload.kw), dtype=np.float32)
    b = rng.standard_normal((workload.o,), dtype=np.float32)
    out_layout = result.layout_of(graph.out)
    dev = tvm.cpu()
    y = tvm.runtime.tensor(np.zeros(out_layout.shape, np.float32), dev)
    module["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(result.layout_of(graph.weight).apply(w), dev),
                   tvm.runtime.tensor(b, dev), y)
    ref = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                                                stride=workload.stride, padding=workload.pad,
                                                dilation=workload.dilation)).numpy()
    np.testing.assert_allclose(out_layout.inverse_apply(y.numpy()), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    return result


SMALL = Conv2dWorkload(n=1, c=3, h=30, w=34, o=24, kh=7, kw=7, stride=2, pad=3)


@pytest.mark.parametrize("kind", ["tiled", "nchw", "nhwc"])
@pytest.mark.parametrize("vec_axis", ["o", "w"])
def test_scheduled_conv_matches_pytorch_in_every_layout(kind, vec_axis):
    # 15x17 outputs and 24 channels: none of the tiles divides, so padding is exercised.
    tiling = ConvTiling(ht=4, wt=8, ot=16, w_reg=4, o_reg=4, vec_axis=vec_axis)
    _build_and_check(SMALL, kind, tiling)


def test_r18_first_layer_tiled_layout_matches_pytorch():
    result = _build_and_check(R18_FIRST_LAYER, "tiled", ConvTiling())
    graph_out = [t for t in result.tensors if t.op.name == "relu"][0]
    assert result.layout_of(graph_out).shape == (1, 28, 7, 4, 4, 16, 16)  # N H/4 W/16 O/16 4 16 16


def test_conv_tiling_rejects_bad_values():
    with pytest.raises(ValueError, match="w_reg=3 must divide wt=16"):
        ConvTiling(w_reg=3)
    with pytest.raises(ValueError, match="ConvTiling.ht must be a positive int, got 0"):
        ConvTiling(ht=0)
    with pytest.raises(ValueError, match="vec_axis"):
        ConvTiling(vec_axis="h")
    with pytest.raises(ValueError, match="unknown layout kind 'nhcw'"):
        graph = conv2d_graph(SMALL)
        conv2d_layouts(graph, SMALL, kind="nhcw", tiling=ConvTiling())


def test_measured_peak_is_vector_fma_speed():
    from alt_tvm.bench.peak import measure_peak_gflops

    peak = measure_peak_gflops(threads=1, steps=4096, repeat=3)
    # One core issuing vector FMAs does far better than a few scalar GFLOP/s.
    assert peak > 8.0
    # The FLOPs count every pass: 4 passes over 4x the scalars are the same work as 16 passes.
    assert measure_peak_gflops(threads=1, steps=4 * 4096, passes=4, repeat=3) == pytest.approx(peak, rel=0.5)
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        measure_peak_gflops(threads=0)
    with pytest.raises(ValueError, match="passes must be >= 1, got 0"):
        measure_peak_gflops(threads=1, passes=0)
    import tvm

    pool = int(tvm.get_global_func("runtime.NumThreads")())
    with pytest.raises(ValueError, match=f"TVM's thread pool has {pool} thread"):
        measure_peak_gflops(threads=pool + 1)  # would silently measure `pool` threads


def test_default_tiling_follows_registers_and_l1():
    from alt_tvm.strategies.alt.tiling import default_conv_tiling

    big = default_conv_tiling((1, 64, 56, 56), 64, 64, lanes=16, registers=32, l1_bytes=48 * 1024)
    # two vectors of channels; two rows of 7 positions: 28 accumulators, 4 registers left
    assert big.ot == 32 and big.spatial == (2, 28) and big.reg == 7
    assert default_conv_tiling((1, 256, 14, 14), 256, 256, lanes=16, registers=32).spatial == (2, 14)
    small_l1 = default_conv_tiling((1, 64, 56, 56), 64, 64, lanes=16, registers=32, l1_bytes=8 * 1024)
    assert small_l1.spatial[0] * small_l1.spatial[1] * 16 * 4 <= 2 * 1024 < big.spatial[0] * big.spatial[1] * 64
    few_regs = default_conv_tiling((1, 64, 56, 56), 64, 64, lanes=8, registers=16, l1_bytes=32 * 1024)
    assert few_regs.spatial[0] * few_regs.reg * 2 <= 12 and few_regs.ot == 16
    narrow = default_conv_tiling((1, 48, 56, 56), 48, 48, lanes=16, registers=32, l1_bytes=48 * 1024)
    assert narrow.ot == 16  # 48 channels are not two whole vectors


def test_weights_over_half_the_l2_run_channel_tiles_outermost():
    from alt_tvm.strategies.alt.tiling import default_conv_tiling

    def tiling(channels, size):
        return default_conv_tiling((1, channels, size, size), channels, channels, lanes=16, registers=32,
                                   l1_bytes=48 * 1024, l2_bytes=2 << 20, weight_bytes=channels * channels * 9 * 4)

    assert tiling(512, 7).parallel_channels is True  # 9.4 MB of weights
    assert tiling(256, 14).parallel_channels is True  # 2.4 MB
    assert tiling(128, 28).parallel_channels is None  # 0.6 MB: the schedule decides from the task count
    # With a 2 MiB L2 every channel tile's slab of weights (at most 590 KiB) stays in it: each conv
    # keeps the one-level order, with the epilogue in the register block.
    for t in (tiling(512, 7), tiling(256, 14), tiling(128, 28)):
        assert not (t.reduction_outer or t.prefetch) and t.epilogue_in_block


def test_streamed_weights_stay_inside_spatial_tiles_where_the_input_is_the_bigger_stream():
    from alt_tvm.strategies.alt.tiling import channels_outermost, default_conv_tiling

    # SegFormer-B0's decoder: 1024 -> 256 1x1 on a 64x64 map. Weights once per spatial tile move
    # 64 MiB, the input once per channel tile 128 MiB: spatial tiles stay outermost.
    fuse = default_conv_tiling((1, 256, 64, 64), 1024, 256, lanes=16, registers=32, l1_bytes=32 << 10,
                               l2_bytes=1 << 20, weight_bytes=256 * 1024 * 4, input_bytes=1024 * 64 * 64 * 4)
    # Its parallel tasks are spatial tiles, each reading an input tile of its own: the next one
    # is fetched while this one computes, though the weights stream too.
    assert fuse.parallel_channels is None and fuse.prefetch_input
    # ResNet-18's 512-channel 3x3 conv on 7x7: its 9.4 MB of weights are the bigger stream.
    resnet = default_conv_tiling((1, 512, 7, 7), 512, 512, lanes=16, registers=32, l1_bytes=32 << 10,
                                 l2_bytes=1 << 20, weight_bytes=512 * 512 * 9 * 4, input_bytes=512 * 9 * 9 * 4)
    assert resnet.parallel_channels is True and not resnet.prefetch_input  # the next task reads the same tile
    assert channels_outermost(weight_bytes=1, spatial_tiles=1, input_bytes=0, channel_tiles=9)  # input unknown
    assert not channels_outermost(weight_bytes=1 << 20, spatial_tiles=64, input_bytes=16 << 20, channel_tiles=8)


@pytest.mark.parametrize("l1_kib,outer", [(48, True), (32, False)])
def test_a_slab_of_weights_over_half_the_l2_runs_the_reduction_outermost_where_a_block_fits_the_l1(l1_kib, outer):
    from alt_tvm.strategies.alt.tiling import default_conv_tiling, reads_weight_blocks_from_l1

    def tiling(out, inp, size, window):
        return default_conv_tiling((1, out, size, size), inp, out, lanes=16, registers=32, l1_bytes=l1_kib << 10,
                                   l2_bytes=1 << 20, weight_bytes=out * inp * window * 4)

    # 512 -> 512 3x3: a 590 KiB slab per 32-channel tile, blocks of 32 input channels of 36 KiB.
    big = tiling(512, 512, 7, 9)
    assert (big.reduction_outer, big.prefetch, big.epilogue_in_block) == (outer, outer, not outer)
    assert big.parallel_channels and not big.prefetch_input
    # A 295 KiB slab (256 -> 512 3x3) and a 128 KiB one (1024 -> 2048 1x1) stay in the L2.
    assert not tiling(512, 256, 7, 9).reduction_outer and not tiling(2048, 1024, 7, 1).reduction_outer
    # Unknown caches, or no split reduction (every input channel in one block): never.
    assert not reads_weight_blocks_from_l1(in_channels_per_group=512, window=9, ot=32, it=32, l1_bytes=0,
                                           l2_bytes=1 << 20)
    assert not reads_weight_blocks_from_l1(in_channels_per_group=32, window=49 * 9, ot=32, it=32,
                                           l1_bytes=1 << 30, l2_bytes=1 << 20)


def test_channel_tiles_pad_to_whole_vectors_when_that_uses_the_lanes_better():
    from alt_tvm.strategies.alt.tiling import channel_tile, reduction_block

    tiles = {c: channel_tile(c, 16) for c in (3, 12, 20, 24, 40, 48, 56, 58, 72, 88, 104, 116, 120, 232, 440, 512,
                                             1000)}
    # Divisors where they use the lanes as well, or padding would waste more than 1/12.
    assert tiles[3] == 3 and tiles[12] == 12 and tiles[20] == 10
    # A tile under a vector grows to three or five half vectors where they divide: 24 and 72 in
    # tiles of 24, 40 in tiles of 40 (8-lane pieces); 36 stays in tiles of 12, 56 in tiles of 8.
    assert tiles[24] == 24 and tiles[72] == 24 and tiles[40] == 40 and channel_tile(36, 16) == 12
    assert channel_tile(56, 16) == 8 and channel_tile(12, 8) == 12 and channel_tile(80, 16) == 16
    # A divisor LLVM would split into a piece under a quarter vector (10 = 8 + 2, 14 = 8 + 4 + 2,
    # 11, 15) gives way to a half vector: 56 and 88 in 8-lane tiles; 120 then pads to 128.
    assert tiles[56] == 8 and tiles[88] == 8 and tiles[120] == 32
    assert tiles[48] == 16 and tiles[512] == 32
    # Padded: 58 -> 64 and 116 -> 128 (two vectors: one would pad as much), 104 -> 112 and
    # 232 -> 240 (one vector), 440 -> 448 and 1000 -> 1024 (two vectors waste under 1/16).
    assert (tiles[58], tiles[116], tiles[104], tiles[232], tiles[440], tiles[1000]) == (32, 32, 16, 16, 32, 32)
    assert channel_tile(200, 16, max_waste=0) == 40 and channel_tile(58, 16, max_waste=0) == 32
    assert channel_tile(184, 16, max_waste=0) == 8
    # A reduction over 104 channels stored in padded tiles of 16 runs in blocks of 8.
    assert reduction_block(104, 16) == 8 and reduction_block(512, 32) == 32


def test_a_tile_of_one_and_a_half_vectors_is_vectorized_in_half_vectors():
    from alt_tvm.strategies.alt.tiling import default_conv_tiling
    from alt_tvm.strategies.alt.vectors import vector_piece, vector_registers

    assert [vector_piece(t, 16) for t in (8, 12, 16, 24, 32, 40, 48)] == [8, 12, 16, 8, 32, 8, 16]
    assert [vector_registers(t, 16) for t in (8, 12, 16, 24, 32, 40)] == [1, 1, 1, 3, 2, 5]
    # Three registers per position: the register block holds 8 positions (24 of 28 accumulators).
    tiling = default_conv_tiling((1, 24, 56, 56), 144, 24, lanes=16, registers=32)
    assert tiling.ot == 24 and tiling.spatial[0] * tiling.reg * 3 <= 28


@pytest.mark.parametrize("full_rate", [True, False])
def test_convs_and_a_block_in_tiles_of_one_and_a_half_vectors_match_pytorch(full_rate):
    """1x1 convs to and from 3/2-vector tiles, and a fused block with such a middle map, vectorize
    in half-vector pieces (no vector of 3/2 lanes, which LLVM compiles 4-15x slower). Where half
    vectors take a whole vector's issue slot, the 9/2-vector middle map is padded to whole vectors."""
    import dataclasses

    import alt_tvm
    from alt_tvm.target import host

    machine = dataclasses.replace(host(), half_vectors_full_rate=full_rate)
    lanes = machine.vector_lanes("float32")
    c = 3 * lanes // 2  # 24 channels with AVX-512, 12 with AVX2
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, c, 1), torch.nn.ReLU(),
                                torch.nn.Conv2d(c, 3 * c, 1), torch.nn.ReLU6(),
                                torch.nn.Conv2d(3 * c, 3 * c, 3, padding=1, groups=3 * c), torch.nn.ReLU6(),
                                torch.nn.Conv2d(3 * c, c, 1)).eval()
    x = torch.randn(1, 16, 28, 28)
    for fuse in (False, "always"):  # "always": AVX2's 16 registers do not fuse blocks by default
        built = alt_tvm.build(model, target=machine, example_inputs=[x],
                              strategy_options={"alt": {"fuse_blocks": fuse}})
        ref = model(x).detach().numpy()
        np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
        scripts = _kernel_scripts(built)
        assert len(scripts) == (2 if fuse else 4), list(scripts)
        tiles = {}  # each kernel's output tile (its stored layout's innermost extent)
        for name, script in scripts.items():
            signature = script.split("def ")[1].split("\n")[0]
            tiles[name] = int(signature.split("T.Buffer((")[-1].split(")")[0].split(", ")[-1])
            assert f"T.vectorized({c})" not in script, (fuse, name)
            if tiles[name] == c:  # a 3/2-vector tile is written in half-vector pieces
                assert f"T.vectorized({lanes // 2})" in script, (fuse, name)
        # The middle map (3c channels): 3/2-vector tiles, or padded to whole vectors.
        assert sorted(tiles.values()) == ([c, c] if fuse else [c, c, c, c] if full_rate else [lanes, lanes, c, c])


def test_a_reduction_outer_record_prefetches_weights_read_in_half_vector_pieces(tmp_path):
    """A tuned record with the reduction-outer order and the weight prefetch on a 3/2-vector
    output tile: the prefetch counts the loop over the pieces among the weight reads."""
    import alt_tvm
    from alt_tvm.integration import extract_tasks
    from alt_tvm.target import host

    c = 3 * host().vector_lanes("float32") // 2
    torch.manual_seed(0)
    model = torch.nn.Conv2d(96, c, 1).eval()
    x = torch.randn(1, 96, 28, 28)
    (task,) = extract_tasks(model, example_inputs=[x])
    layout, loop = task.space.default()
    assert layout["ot"] == c
    params = task.space.params(layout, dict(loop, reduction_outer=True, prefetch=True, epilogue_in_block=False,
                                            prefetch_input=False, window_outer=False))
    built = alt_tvm.build(model, example_inputs=[x], records=one_record_log(tmp_path / "log.jsonl", task, params))
    assert built.report.tuned == 1
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    (script,) = _kernel_scripts(built).values()
    assert "T.prefetch(" in script and f"T.vectorized({c})" not in script


@pytest.mark.parametrize("data, weight, groups, outer", [
    ((1, 48, 56, 56), (48, 8, 3, 3), 6, True),  # RegNetY: 8 channels per group, one tile
    ((1, 8, 14, 14), (64, 8, 3, 3), 1, True),  # 8 channels: one tile
    ((1, 64, 14, 14), (64, 64, 3, 3), 1, False),  # two 32-channel blocks: a split reduction
    ((1, 3, 224, 224), (64, 3, 7, 7), 1, False),  # an image stem
    ((1, 48, 28, 28), (48, 1, 3, 3), 48, False),  # depthwise: no channel loop
])
def test_a_conv_reading_one_channel_tile_runs_its_window_outside_the_channels(data, weight, groups, outer,
                                                                            x86_target):
    from alt_tvm.strategies.alt.conv import AltConvStrategy, ConvGeometry

    pad = (weight[2] - 1) // 2
    out = (1, weight[0], data[2] + 2 * pad - weight[2] + 1, data[3] + 2 * pad - weight[3] + 1)
    geometry = ConvGeometry(rank=2, transposed=False, data_shape=data, weight_shape=weight, out_shape=out,
                            strides=(1, 1), dilation=(1, 1), pads=(pad,) * 4, groups=groups, transposed_input=False)
    assert AltConvStrategy.default_tiling(geometry, x86_target).window_outer is outer


def test_register_block_is_ragged_only_when_divisors_starve_the_fma_units():
    from alt_tvm.strategies.alt.tiling import default_conv_tiling, register_block

    assert register_block(28, 6) == 4  # a divisor that fills 4 of 6 accumulators: kept
    assert register_block(7, 6) == 4  # divisors 1 and 7: 4 + 3 instead of 1 accumulator
    assert register_block(14, 6) == 5  # 5 + 5 + 4 instead of 2
    assert register_block(7, 12) == 7 and register_block(7, 1) == 1
    assert register_block(27, 14) == 9  # 9 of 14 is kept: a ragged 14 + 13 ran 2x slower
    # ResNet-50's last stage (7x7, 512 channels = 2 AVX2 vectors): 8 accumulators, not 2.
    late = default_conv_tiling((1, 512, 7, 7), 512, 512, lanes=8, registers=16)
    assert late.spatial == (1, 7) and late.ot == 16 and late.reg == 4


@pytest.mark.parametrize("size", [7, 14])
def test_ragged_register_block_conv_matches_pytorch_in_a_model(size):
    """A conv whose register block does not divide its tile (a predicated tail) is exact."""
    from alt_tvm.graph.build import build

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(256, 256, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(256, 256, 1)).eval()
    x = torch.randn(1, 256, size, size)
    built = build(model, example_inputs=[x])
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("kernel,stride", [(3, 1), (3, 2), (5, 2), (7, 1)])
def test_depthwise_conv_padding_per_tile_matches_pytorch(kernel, stride):
    """Depthwise convs pad each output tile's window inside the tile loop (pad_in_tile)."""
    from alt_tvm.graph.build import build

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(48, 48, kernel, stride=stride, padding=kernel // 2, groups=48),
                                torch.nn.ReLU6()).eval()
    x = torch.randn(1, 48, 28, 28)
    built = build(model, example_inputs=[x])
    assert not built.report.failed
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_depthwise_conv_keeps_its_maps_tiles_with_fewer_accumulators_and_its_epilogue_in_the_block():
    from alt_tvm.strategies.alt.tiling import default_conv_tiling

    common = dict(lanes=16, registers=32, l1_bytes=32 << 10, l2_bytes=1 << 20, fma_chains=8)
    depthwise = default_conv_tiling((1, 480, 14, 14), 1, 1, in_channels=480, weight_bytes=480 * 9 * 4, **common)
    dense = default_conv_tiling((1, 480, 14, 14), 480, 480, in_channels=480, weight_bytes=480 * 480 * 4, **common)
    assert depthwise.spatial == dense.spatial  # the map's tiles: no conversion between them
    vectors = -(-depthwise.ot // 16)
    assert depthwise.spatial[0] * depthwise.reg * vectors <= common["fma_chains"] < \
        dense.spatial[0] * dense.reg * -(-dense.ot // 16)
    assert depthwise.epilogue_in_block and dense.epilogue_in_block  # each applies it per register block


@pytest.mark.parametrize("lanes,registers", [(16, 32), (8, 16)])
def test_a_wide_depthwise_window_takes_more_positions_per_register_block(lanes, registers):
    """ConvNeXt's 7x7 depthwise convs (49 FMAs per output): 4 positions per block share each weight
    vector, where 6 FMA chains alone would leave one position of two rows and two vectors; a 3x3
    one keeps the chains' block. The block stays within the register file (AVX2: 16 registers)."""
    from alt_tvm.strategies.alt.tiling import (
        RESERVED_REGISTERS,
        WIDE_WINDOW_POSITIONS,
        WIDE_WINDOW_TAPS,
        default_conv_tiling,
    )

    common = dict(lanes=lanes, registers=registers, l1_bytes=32 << 10, l2_bytes=1 << 20, fma_chains=6)
    assert WIDE_WINDOW_TAPS == 25
    blocks = {}
    for taps in (9, 25, 49):
        tiling = default_conv_tiling((1, 96, 56, 56), 1, 1, in_channels=96, weight_bytes=96 * taps * 4, **common)
        accumulators = tiling.spatial[0] * tiling.reg * -(-tiling.ot // lanes)
        assert accumulators <= registers - RESERVED_REGISTERS
        blocks[taps] = (tiling.reg, accumulators)
    assert blocks[25] == blocks[49]
    if registers == 32:  # two rows of two vectors: 4 positions fit
        assert blocks[9] == (1, 4) and blocks[49] == (WIDE_WINDOW_POSITIONS, 16)
    else:  # 12 accumulators: the widest block that fits
        assert blocks[49][0] > blocks[9][0]


def test_large_weights_are_read_once_per_channel_tile_in_the_model(tmp_path):
    """512 -> 512 3x3 on a 7x7 map (9.4 MB of weights), built for AVX-512 with a 32 KiB L1 and a
    2 MiB L2: the parallel loop runs channel tiles alone. By default a task runs its rows in the
    one-level order; a tuning record may ask the reduction-outer order, in which the reduction's
    channel blocks run outside the rows, so a thread reads each block of weights once and reuses
    it for every row."""
    import dataclasses

    from conftest import runnable, x86_description

    import alt_tvm
    from alt_tvm.integration import extract_tasks

    machine = dataclasses.replace(runnable(x86_description("avx512")), l1d_bytes=32 << 10, l2_bytes=2 << 20,
                                  num_cores=2)
    torch.manual_seed(0)
    model = torch.nn.Conv2d(512, 512, 3, padding=1).eval()
    x = torch.randn(1, 512, 7, 7)

    def kernel_script(built):
        np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-3)
        kernel = next(k for k in built.report.kernels if k.kind == "partition")
        return next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == kernel.name).script()

    script = kernel_script(alt_tvm.build(model, target=machine, example_inputs=[x]))
    parallel = [line.split()[1] for line in script.splitlines() if "T.parallel(" in line]
    assert "o_o_n_h_o_w_o_fused" in parallel, parallel  # the 16 channel tiles of 32 outermost
    assert "rc_0, n, h_o" not in script and "T.prefetch(" not in script

    (task,) = extract_tasks(model, target=machine, example_inputs=[x])
    layout, loop = task.space.default()
    params = task.space.params(layout, dict(loop, reduction_outer=True, prefetch=True, epilogue_in_block=False,
                                            prefetch_input=False))
    log = one_record_log(tmp_path / "reduction_outer.jsonl", task, params, target=machine)
    built = alt_tvm.build(model, target=machine, example_inputs=[x], records=log)
    assert built.report.tuned == 1
    lines = kernel_script(built).splitlines()
    tiles = next(i for i, line in enumerate(lines) if "rc_0, n, h_o" in line)
    assert lines[tiles].split(" in ")[0].split()[1:4] == ["rc_0,", "n,", "h_o,"], lines[tiles]
    # Each row tile prefetches its share of the next block of weights (rc_0 + 1) before its
    # register block runs, outside the reduction loops that hold the partial sums.
    reduction = next(i for i, line in enumerate(lines) if "rh, rw, rc_1 in T.grid" in line)
    hints = [i for i, line in enumerate(lines) if "T.prefetch(" in line]
    assert hints and all(tiles < i < reduction for i in hints), (tiles, hints, reduction)
    assert "weight[o_o_fused, ((rc_0 + 1) *" in lines[hints[0]], lines[hints[0]]
    assert any("for prefetch_j in range(" in line for line in lines[tiles:reduction])

    # With a 1 MiB L2 and a 48 KiB L1 (Zen 5) the untuned build takes that order itself.
    zen5 = dataclasses.replace(machine, l1d_bytes=48 << 10, l2_bytes=1 << 20)
    script = kernel_script(alt_tvm.build(model, target=zen5, example_inputs=[x]))
    assert "rc_0, n, h_o" in script and "T.prefetch(" in script


def test_prefetch_needs_the_reduction_outer_order():
    from alt_tvm.strategies.alt.tiling import DefaultConvTiling

    with pytest.raises(ValueError, match="prefetch=True needs reduction_outer=True"):
        DefaultConvTiling((1, 7), 32, 32, 7, prefetch=True)
    tiling = DefaultConvTiling((1, 7), 32, 32, 7, reduction_outer=True, prefetch=True)
    assert DefaultConvTiling.from_json(tiling.to_json()) == tiling
    assert DefaultConvTiling.from_json({k: v for k, v in tiling.to_json().items() if k != "prefetch"}).prefetch is False


def test_prefetch_input_needs_the_one_level_spatial_order():
    from alt_tvm.strategies.alt.tiling import DefaultConvTiling, default_conv_tiling

    with pytest.raises(ValueError, match=r"prefetch_input=True needs the one-level template .* reduction_outer=False"):
        DefaultConvTiling((1, 7), 32, 32, 7, reduction_outer=True, prefetch=True, prefetch_input=True)
    with pytest.raises(ValueError, match=r"outer_spatial \[1, 7\]"):
        DefaultConvTiling((1, 7), 32, 32, 7, outer_spatial=(1, 7), outer_ot=1, prefetch_input=True)
    tiling = DefaultConvTiling((2, 28), 32, 32, 7, prefetch_input=True)
    assert DefaultConvTiling.from_json(tiling.to_json()) == tiling
    # A record written before the knob existed ran without it.
    assert not DefaultConvTiling.from_json({k: v for k, v in tiling.to_json().items() if k != "prefetch_input"}) \
        .prefetch_input
    common = dict(lanes=16, registers=32, l1_bytes=32 << 10, l2_bytes=1 << 20)
    dense = default_conv_tiling((1, 256, 56, 56), 64, 256, in_channels=64, weight_bytes=64 * 256 * 4, **common)
    depthwise = default_conv_tiling((1, 64, 56, 56), 1, 1, in_channels=64, weight_bytes=64 * 9 * 4, **common)
    # Groups of 8 in tiles of 8 (RegNetY): each tile pads its own window, as a depthwise conv does.
    grouped = default_conv_tiling((1, 208, 14, 14), 8, 8, in_channels=208, weight_bytes=208 * 8 * 36, **common)
    assert grouped.ot == 8 and not grouped.prefetch_input
    streamed = default_conv_tiling((1, 512, 7, 7), 512, 512, in_channels=512, weight_bytes=512 * 512 * 36,
                                   **common)
    assert dense.prefetch_input and not depthwise.prefetch_input
    assert streamed.parallel_channels and not streamed.prefetch_input  # its tasks are channel tiles


def _kernel_scripts(built) -> dict[str, str]:
    """Each partition kernel's TIR script, by kernel name, in the model's order."""
    return {k.name: built.mod[next(g for g in built.mod.get_global_vars() if g.name_hint == k.name)].script()
            for k in built.report.kernels if k.kind == "partition"}


def test_a_dense_conv_prefetches_the_next_tasks_input_tile_in_the_model():
    """A 1x1 conv reads its input in place and a strided 3x3 conv its padded copy: each
    register block of a task fetches a share of the next task's input tile (a run in the
    tiled layout), outside the reduction; a depthwise conv (window copy) fetches none."""
    import alt_tvm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 64, 1), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 64, 3, padding=1, groups=64), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 32, 3, stride=2, padding=1)).eval()  # direct, not Winograd
    x = torch.randn(1, 32, 56, 56)  # 28x28 out: enough spatial tiles to run them alone in parallel
    built = alt_tvm.build(model, example_inputs=[x], strategy_options={"alt": {"fuse_blocks": False}})
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    scripts = _kernel_scripts(built)
    assert len(scripts) == 3, list(scripts)
    names = list(scripts)  # in the model's order: the 1x1, the depthwise and the 3x3 conv
    prefetching = [name for name in names if "T.prefetch(" in scripts[name]]
    assert prefetching == [names[0], names[2]], (names, prefetching)
    for name in prefetching:
        lines = scripts[name].splitlines()
        hint = next(i for i, line in enumerate(lines) if "T.prefetch(" in line)
        reduction = next(i for i, line in enumerate(lines) if "rc_" in line and "T.grid" in line or "for rc" in line)
        assert hint < reduction, (name, hint, reduction)
        assert "_lines[" in lines[hint] and "fused" in lines[hint], lines[hint]


@pytest.mark.parametrize("out_channels, kernel, per_task", [(64, 7, True), (24, 3, False)],
                         ids=["7x7-stem-per-task", "3x3-stem-own-pass"])
def test_a_stem_with_a_large_window_copies_it_per_task(out_channels, kernel, per_task, tmp_path):
    """An image's 3 channels padded for a 7x7 window x 64 channels: each parallel task pads its
    own window (one parallel loop, no separate pass, no input prefetch). A 3x3 window x 24
    channels, whose copy would be as large as its work, keeps the pass and the prefetch; so
    does the 7x7 stem when a tuning record asks for the input prefetch."""
    import alt_tvm
    from alt_tvm.integration import extract_tasks
    from alt_tvm.target import host

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, out_channels, kernel, stride=2, padding=kernel // 2),
                                torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 64, 64)
    built = alt_tvm.build(model, example_inputs=[x])
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    (script,) = _kernel_scripts(built).values()
    assert script.count("T.parallel(") == (1 if per_task else 2), script
    assert ("T.prefetch(" in script) is not per_task
    (task,) = extract_tasks(model, target=host(), example_inputs=[x])
    layout, loop = task.space.default()
    assert loop["prefetch_input"] is not per_task
    if per_task:
        params = task.space.params(layout, dict(loop, prefetch_input=True))
        log = one_record_log(tmp_path / "prefetch.jsonl", task, params)
        tuned = alt_tvm.build(model, example_inputs=[x], records=log)
        assert tuned.report.tuned == 1
        np.testing.assert_allclose(tuned(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
        (script,) = _kernel_scripts(tuned).values()
        assert script.count("T.parallel(") == 2 and "T.prefetch(" in script


def test_an_input_prefetch_asked_of_a_depthwise_conv_is_refused_by_name(monkeypatch):
    """A depthwise conv reads its input through its per-tile window copy: a tiling that asks
    it for the input prefetch fails that partition with the reason, and the build goes on."""
    import dataclasses

    import alt_tvm
    import alt_tvm.strategies.alt.conv as conv_strategy

    default_tiling = conv_strategy.default_conv_tiling
    monkeypatch.setattr(conv_strategy, "default_conv_tiling",
                        lambda *a, **k: dataclasses.replace(default_tiling(*a, **k), prefetch_input=True))
    torch.manual_seed(0)
    model = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32).eval()
    x = torch.randn(1, 32, 28, 28)
    built = alt_tvm.build(model, example_inputs=[x])
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    assert "prefetch_input needs pad_in_tile=False" in built.report.summary()


def _scale(width: int):
    """``b[t, i, :] = a[i, :] * (t + 1)`` over rows ``i`` of ``width`` floats, two passes ``t``."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def scale(a: T.Buffer((4, width), "float32"), b: T.Buffer((2, 4, width), "float32")):
        for i, t, j in T.grid(4, 2, width):
            with T.sblock("scale"):
                vi, vt, vj = T.axis.remap("SSS", [i, t, j])
                b[vt, vi, vj] = a[vi, vj] * T.float32(vt + 1)

    return scale


def _loop_vars(func) -> dict:
    """The loop variables of ``func`` by name."""
    import tvm_ffi

    found = {}
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, lambda loop: found.update({loop.loop_var.name: loop.loop_var})))
    return found


def test_prefetch_rewrite_names_what_it_cannot_find():
    from alt_tvm.strategies.alt.prefetch import prefetch_next_block

    scale = _scale(16)
    loops = _loop_vars(scale)
    i, t, j = loops["i"], loops["t"], loops["j"]
    with pytest.raises(ValueError, match="no block named 'conv_update'"):
        prefetch_next_block(scale, block="conv_update", buffer="a", outer=i, spread=[t], reads=[], vector=j)
    with pytest.raises(ValueError, match="reads no buffer named 'w'"):
        prefetch_next_block(scale, block="scale", buffer="w", outer=i, spread=[t], reads=[], vector=j)
    with pytest.raises(ValueError, match=r"loops \['k'\] are not in the function"):
        prefetch_next_block(scale, block="scale", buffer="a", outer=i, spread=[tvm.tirx.Var("k", "int32")],
                            reads=[], vector=j)
    with pytest.raises(ValueError, match="spread needs at least one loop"):
        prefetch_next_block(scale, block="scale", buffer="a", outer=i, spread=[], reads=[], vector=j)
    with pytest.raises(ValueError, match=r"spread loops must not index 'a' \(got \['j'\]\)"):
        prefetch_next_block(scale, block="scale", buffer="a", outer=i, spread=[j], reads=[], vector=j)
    with pytest.raises(ValueError, match="does not depend on loop t"):
        prefetch_next_block(scale, block="scale", buffer="a", outer=t, spread=[j], reads=[], vector=j)
    # Row i + 1 of ``a`` (one line of 16 floats) while the two passes of t read row i: one
    # line, a share of one per pass (the spare one wraps around the block, no guard).
    out = prefetch_next_block(scale, block="scale", buffer="a", outer=i, spread=[t], reads=[], vector=j)
    script = out.script()
    assert "T.prefetch(T.address_of(a[i + 1, " in script and "for prefetch_j in range(1)" in script, script
    module = tvm.compile(out, target=host_target())
    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    y = tvm.runtime.tensor(np.zeros((2, 4, 16), np.float32))
    module["main"](tvm.runtime.tensor(x), y)
    np.testing.assert_array_equal(y.numpy(), np.stack([x, 2 * x]))  # the hints change no result


def test_prefetch_next_tile_fetches_the_next_tasks_run():
    from tvm.script import tirx as T

    from alt_tvm.strategies.alt.prefetch import prefetch_next_tile

    scale = _scale(32)

    @T.prim_func(s_tir=True)
    def pairs(a: T.Buffer((2, 32), "float32"), b: T.Buffer((4, 32), "float32")):
        for i, j in T.grid(4, 32):
            with T.sblock("pairs"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi // 2, vj]

    loops = _loop_vars(scale)
    # Task i reads row i (32 floats, two lines); the two passes of t fetch a line each of row i + 1.
    out = prefetch_next_tile(scale, block="scale", buffer="a", outer=loops["i"], spread=[loops["t"]])
    script = out.script()
    assert "for prefetch_j in range(1)" in script and \
        "T.prefetch(T.address_of(a_lines[i * 32 + 32 + (t + prefetch_j) * 16])" in script, script
    module = tvm.compile(out, target=host_target())
    x = np.arange(128, dtype=np.float32).reshape(4, 32)
    y = tvm.runtime.tensor(np.zeros((2, 4, 32), np.float32))
    module["main"](tvm.runtime.tensor(x), y)
    np.testing.assert_array_equal(y.numpy(), np.stack([x, 2 * x]))  # the hints change no result
    with pytest.raises(ValueError, match="are not a step apart"):  # rows i // 2: tasks share a tile
        prefetch_next_tile(pairs, block="pairs", buffer="a", outer=_loop_vars(pairs)["i"],
                           spread=[_loop_vars(pairs)["j"]])
    with pytest.raises(ValueError, match="reads no buffer named 'w'"):
        prefetch_next_tile(scale, block="scale", buffer="w", outer=loops["i"], spread=[loops["t"]])
    with pytest.raises(ValueError, match="loop k is not in the function"):
        prefetch_next_tile(scale, block="scale", buffer="a", outer=tvm.tirx.Var("k", "int32"), spread=[loops["t"]])


@pytest.mark.parametrize("size,stride,kernel,pad", [(28, 2, 3, 1), (29, 2, 3, 1), (32, 2, 7, 3), (14, 1, 3, 1)])
def test_strided_conv_pads_only_what_its_windows_read(size, stride, kernel, pad):
    """A stride that skips the last padded row or column (3x3 stride 2 on an even map): the
    unfolded input has one tile per output tile (not one more along each dim, 2x the
    windows), and the result is unchanged."""
    import re

    import alt_tvm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 32, kernel, stride=stride, padding=pad), torch.nn.ReLU()).eval()
    x = torch.randn(1, 32, size, size)
    # The direct template's pad stage is the subject (14x14 stride 1 would be Winograd).
    built = alt_tvm.build(model, example_inputs=[x], strategy_options={"alt": {"winograd": False}})
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    kernel_info = next(k for k in built.report.kernels if k.kind == "partition")
    script = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == kernel_info.name).script()
    padded = [int(d) for d in re.search(r"pad = T.sblock_alloc_buffer\(\(([\d, ]+)\)", script).group(1).split(",")]
    out_tiles = [int(d) for d in kernel_info.layout.split("x")[1:3]]
    assert padded[1:3] == out_tiles, (padded, kernel_info.layout)


@pytest.mark.parametrize("channels, converted", [(3, False), (16, True)])
def test_an_unpadded_conv_reads_an_image_as_stored(tmp_path, channels, converted):
    """SqueezeNet's stem (3x3 stride 2, no padding) reads the user's row-major image in place:
    no conversion kernel before it; a 16-channel input is still converted to the unfolded
    layout, whose vectors of channels the conv loads."""
    import alt_tvm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(channels, 32, 3, stride=2), torch.nn.ReLU()).eval()
    x = torch.randn(1, channels, 23, 23)
    path = str(tmp_path / "stem.onnx")
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
    built = alt_tvm.build(path)
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    kinds = [k.kind for k in built.report.kernels]
    assert kinds[0] == ("conversion" if converted else "partition")


@pytest.mark.parametrize("activation", [torch.nn.Hardswish, torch.nn.SiLU])
def test_an_epilogue_over_padded_channels_reads_a_padded_bias_unguarded(tmp_path, x86_runnable, activation):
    """100 channels stored in 7 vectors of 16 (13 of 8): the bias is padded with them, so the
    epilogue loads whole vectors (no ``if_then_else``, whose loads TVM masks) and one select
    writes the padding's zeros. Checked against PyTorch through the ONNX export that spells
    hard-swish as add, clip, divide and multiply."""
    import alt_tvm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(48, 100, 1), activation(), torch.nn.Conv2d(100, 100, 1),
                                activation()).eval()
    x = torch.randn(1, 48, 14, 14)
    path = tmp_path / "padded.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    # Where half vectors issue at the full rate (a fact measured on the host), 100 channels keep
    # tiles of 10 lanes rather than pad by 12%: pin the fact under which they are padded.
    target = dataclasses.replace(x86_runnable, half_vectors_full_rate=False)
    built = alt_tvm.build(str(path), target)
    lanes = target.vector_lanes()
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    convs = [built.mod[g] for g in built.mod.get_global_vars() if g.name_hint.startswith("alt_conv2d")]
    assert len(convs) == 2
    for func in convs:
        script = func.script()
        assert "if_then_else" not in script and f"T.Select(v_i1_o * {lanes} + v_i1_i < 100" in script
        assert "< 100 and" not in script  # the layout's steps test the same index once, not three times
        assert f'T.Buffer((1, {-(-100 // lanes) * lanes}, 1, 1), "float32")' in script  # the bias, padded


def test_pad_copies_run_per_group_tile_or_whole_in_vectors_but_an_images_stays_scalar(x86_runnable):
    """A grouped 3x3 conv whose channel tile lies within a group (RegNetY's groups of 8) pads each
    tile's window inside its own parallel loop, as a depthwise conv does; a dense strided 3x3 conv
    copies its input whole first, a vector at a time; an image's pad stage reads its 3 channels a
    plane apart and stays scalar. All checked against PyTorch."""
    import re

    import alt_tvm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 48, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(48, 48, 1), torch.nn.ReLU(),
                                torch.nn.Conv2d(48, 48, 3, stride=2, padding=1, groups=6), torch.nn.ReLU(),
                                torch.nn.Conv2d(48, 32, 3, stride=2, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 64, 64)
    built = alt_tvm.build(model, target=x86_runnable, example_inputs=[x])
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())

    def pad_copy(name):  # (the loop right around the whole pad block, parallel loops, pad blocks)
        script = built.mod[name].script()
        found = re.search(r"for [\w, ]+ in (T\.\w+)\(([\d, ]+)\):\n\s+with T.sblock\(\"pad\"\)", script)
        return (found.groups() if found else None), script.count("T.parallel"), script.count('T.sblock("pad')

    assert pad_copy("alt_conv2d_1") == (("T.grid", "1, 1, 5, 65, 3"), 2, 1)  # the stem: a pass of its own
    assert pad_copy("alt_conv2d_2") == (None, 1, 0)  # the 1x1 reads its input in place
    grouped = pad_copy("alt_conv2d_3")  # the window padded per tile inside the conv's loop, split at its edges
    assert grouped[:2] == (None, 1) and grouped[2] > 1
    assert "T.vectorized(8)" in built.mod["alt_conv2d_3"].script()
    lanes = str(x86_runnable.vector_lanes())
    assert pad_copy("alt_conv2d_4") == (("T.vectorized", lanes), 2, 1)  # dense: whole, in vectors
