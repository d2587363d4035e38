"""The ``alt`` strategy for convolutions: ALT's tiled layouts (paper §5.1) with analytic tiles
and a register-blocked loop schedule.

Any conv (1-3 spatial dims, grouped, depthwise, dilated, transposed) with its epilogue is
lowered in the tiled template, its tiles chosen from the target (:mod:`.tiling`) or from a
tuning record (:mod:`.space`); a zero pad or transpose feeding it, a squeeze-excitation scale
before a 1x1 conv and an inverted-residual block after it are fused where the strategy's
patterns (:mod:`.patterns`) say. The paper's single-layer case study is :mod:`.case_study`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tvm
from tvm import relax, te

from alt_tvm import ops
from alt_tvm.layout import Layout
from alt_tvm.layout.rewrite import TensorMap
from alt_tvm.layout.templates import (
    conv_input_unfolded,
    conv_output_tiled,
    conv_output_two_level,
    conv_weight_tiled,
    weight_channels_last,
)
from alt_tvm.strategies.base import (
    OpInfo,
    Strategy,
    attrs_dict,
    equivalent,
    fusion_option,
    static_shape,
)
from alt_tvm.strategies.constants import const_value
from alt_tvm.strategies.pattern import Match
from alt_tvm.strategies.registry import register_strategy
from alt_tvm.target import HardwareTarget

from .block import (
    BLOCK_MIN_REGISTERS,
    MAX_INTENSITY,
    MAX_SHORT_WORK_RATIO,
    MAX_WORK_RATIO,
    BlockGeometry,
    BlockTiling,
    default_block_tiling,
    implement_block,
    stays_in_l2,
    work_ratio,
)
from .patterns import ABSORBED_INPUT, BLOCK, CHANNEL_SCALE, block_output_conv
from .prefetch import prefetch_next_block, prefetch_next_tile
from .tiling import DefaultConvTiling, default_conv_tiling, is_depthwise, reduction_block, window_per_channel_tile
from .vectors import vectorize_channels
from .window import partition_at_tile_edges, vectorize_lanes
from .winograd import (
    MIN_TILES,
    schedule_winograd,
    stored_in_output_layout,
    transform_weight,
    vector_block,
    winograd_conv,
    winograd_tile,
)

_CONV_OPS = {
    "relax.nn.conv1d": (1, False), "relax.nn.conv2d": (2, False), "relax.nn.conv3d": (3, False),
    "relax.nn.conv1d_transpose": (1, True), "relax.nn.conv2d_transpose": (2, True),
    "relax.nn.conv3d_transpose": (3, True),
}
#: Input channels up to which a conv's input is treated as an image
#: (:attr:`ConvGeometry.image_channels`). Unpadded and row-major, it is read in place: its
#: unfolded copy would cost a pass over the image and buys no vector loads (SqueezeNet's
#: 3 -> 64 stride-2 stem with its pool and 1x1: 0.56 -> 0.51 ms, Zen 4, 2 threads). Padded, its
#: copy is not vectorized over its channels, and a large window is copied per task
#: (:attr:`ConvGeometry.copies_window_per_task`).
IMAGE_CHANNELS = 4
_CANONICAL = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}
_CANONICAL_T = {1: ("NCW", "IOW"), 2: ("NCHW", "IOHW"), 3: ("NCDHW", "IODHW")}


def schedule_tiled_conv(func: tvm.tirx.PrimFunc, *, conv: te.Tensor, stages: list, source: te.Tensor | None,
                        rank: int, reg: int, loop_tiles: DefaultConvTiling | None = None,
                        channel_tile: int = 1, cores: int = 2,
                        parallel_channels: bool | None = None, two_level: bool = False,
                        unroll_window: bool = False, window_outer: bool = False,
                        epilogue_in_block: bool = False, pad_in_tile: bool = False, pad_per_task: bool = False,
                        reduction_outer: bool = False, prefetch: bool = False,
                        prefetch_input: bool = False, pad_lanes: bool = True, lanes: int = 0) -> tvm.IRModule:
    """Schedule a conv in the tiled template (any spatial rank) with its epilogue fused.

    With ``loop_tiles`` the tiling is done by loop splits instead of the layout (the
    layout's tiles are then whole extents, e.g. channels-last): the ALT-OL ablation.
    ``two_level`` says the output layout is :func:`conv_output_two_level` (one more level
    of tile loops between the parallel blocks and the register tiles). The other flags are
    the loop knobs of :class:`DefaultConvTiling`; ``pad_in_tile`` computes the pad stage
    per output channel tile. That suits depthwise convs, whose channel tile reads only its
    own input channels: 2x faster with stride 2, up to 1.2x with stride 1. A dense conv
    would pad all input channels once per output channel tile: 1.3x slower. ``pad_per_task``
    computes it once per parallel task instead, before the task's channel tiles: for a conv
    with few input channels and a large window (:attr:`ConvGeometry.copies_window_per_task`).

    ``reduction_outer`` orders the loops ``parallel(channel tiles) . rc_o . spatial tiles .
    register blocks . window . rc_i`` (it needs a split reduction, one-level tiles and the
    window inside the channel blocks); the register blocks accumulate into the output tile.
    With ResNet's 512-channel 3x3 convs on a 7x7 map, in a chain of eight whose weights come
    from memory, it takes 0.73 ms per conv against 0.95 ms. ``prefetch`` (with
    ``reduction_outer`` only) adds :func:`.prefetch.prefetch_next_block` for the weights.
    ``prefetch_input`` adds :func:`.prefetch.prefetch_next_tile` for the input tile the conv
    reads (in place or padded) where the parallel loop runs spatial tiles alone.
    ``pad_lanes`` vectorizes a pad stage copied whole over its channel tile; off for an
    image read row-major, whose channels lie a plane apart. ``lanes`` (the target's; 0: the
    channel tile as one vector) sets the pieces the output channel tile is vectorized in
    (:func:`.vectors.vector_piece`).
    """
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock(conv.op.name)
    loops = sch.get_loops(block)
    n, outer, oo = loops[0], list(loops[1:1 + rank]), loops[1 + rank]
    at = 2 + rank
    middle = []  # the two-level template's block loops: t'..., ot'
    if two_level:
        middle, at = list(loops[at:at + rank + 1]), at + rank + 1
    inner, oi = list(loops[at:at + rank]), loops[at + rank]
    reduce = loops[at + rank + 1:]
    channel_outer = [oo]
    if loop_tiles is not None:
        split = [sch.split(loop, [None, t]) for loop, t in zip(inner, loop_tiles.spatial)]
        outer += [o for o, _ in split]
        inner = [i for _, i in split]
        oo2, oi = sch.split(oi, [None, loop_tiles.ot])
        channel_outer.append(oo2)
    oo = channel_outer[-1]
    last_o, last_i = sch.split(inner[-1], [None, reg])
    reduce = list(reduce)
    window = reduce[1:]
    extent = int(conv.op.reduce_axis[0].dom.extent)
    channel = [reduce[0]]
    channel_tile = reduction_block(extent, channel_tile)  # a padded input tile: its divisor
    if 1 < channel_tile < extent:
        # rc = rc_o * it + rc_i, with rc_i after the window loops: the input's and the
        # weight's innermost (it) dimension is then read in order, with no div/mod.
        channel = list(sch.split(reduce[0], [None, channel_tile]))
    if len(channel) == 2:
        reduce = [*window, *channel] if window_outer else [channel[0], *window, channel[1]]
    else:
        reduce = [*window, *channel] if window_outer else [*channel, *window]
    if reduction_outer:
        if len(channel) != 2 or middle or window_outer:
            raise ValueError(f"reduction_outer needs the input channels ({extent}) split into blocks "
                             f"(channel_tile {channel_tile}), one-level tiles (two_level={two_level}) and "
                             f"window_outer=False ({window_outer})")
        return _schedule_reduction_outer(sch, block, order=[*channel_outer, channel[0], n, *outer, last_o, *window,
                                                            channel[1], *inner[:-1], last_i, oi],
                                         channel_loops=len(channel_outer), unrolled=[*inner[:-1], last_i],
                                         stages=stages, source=source, pad_lanes=pad_lanes, lanes=lanes,
                                         prefetch=_WeightPrefetch(conv, spatial=[n, *outer, last_o],
                                                                  reads=[*window, channel[1]], vector=oi)
                                         if prefetch else None)
    if prefetch:
        raise ValueError("prefetch needs reduction_outer=True (the next weight block is fetched while the "
                         "spatial tiles use the current one)")
    if prefetch_input and (pad_in_tile or pad_per_task):
        raise ValueError("prefetch_input needs pad_in_tile=False and pad_per_task=False: a per-tile window copy "
                         "reads the input, not the conv")
    if pad_per_task and (pad_in_tile or middle or source is None):
        raise ValueError(f"pad_per_task needs a pad stage ({source is not None}), one-level tiles "
                         f"(two_level={two_level}) and pad_in_tile=False ({pad_in_tile})")
    sch.reorder(n, *outer, *channel_outer, *middle, last_o, *reduce, *inner[:-1], last_i, oi)
    # Parallel over output tiles; with few spatial tiles (7x7 maps) also over channel tiles.
    tasks = 1
    for loop in [n, *outer]:
        tasks *= int(sch.get(loop).extent)
    if parallel_channels is None:
        parallel_channels = tasks < 4 * cores
    if not parallel_channels:
        task_loop = sch.fuse(n, *outer)
        sch.parallel(task_loop)
    else:
        # Channel tiles outermost: each thread then runs all spatial tiles of one channel
        # tile in a row, so that tile's weights are read from memory once, not once per
        # spatial tile (7x7 maps have few spatial tiles and large weights).
        sch.reorder(*channel_outer, n, *outer)
        oo = task_loop = sch.fuse(*channel_outer, n, *outer)
        sch.parallel(oo)
    # Accumulate the register block in a local buffer (registers after unrolling).
    write = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write, last_o)
    vectorize_channels(sch, oi, lanes=lanes)
    sch.unroll(last_i)
    for loop in inner[:-1]:
        sch.unroll(loop)
    if unroll_window:
        for loop in window:
            sch.unroll(loop)
    sch.decompose_reduction(block, reduce[0])
    vectorize_channels(sch, sch.get_loops(write)[-1], lanes=lanes)
    if stages:
        for stage in stages[:-1]:
            sch.compute_inline(sch.get_sblock(stage.op.name))
        final = sch.get_sblock(stages[-1].op.name)
        sch.reverse_compute_at(final, last_o if epilogue_in_block else (middle[-1] if middle else oo))
        vectorize_channels(sch, sch.get_loops(final)[-1], lanes=lanes)
    if source is not None and (pad_in_tile or pad_per_task):
        # Pad each output tile's window right before it is read (it stays in L1): the
        # input is streamed once instead of copied whole first; its loops split where the
        # input's tiles end, so no copy divides by the tile.
        pad = sch.get_sblock(source.op.name)
        where = task_loop if pad_per_task else oo
        sch.compute_at(pad, where)
        vectorize_lanes(sch, pad, lanes=lanes)
        pad_loops = sch.get_loops(pad)
        at = [i for i, loop in enumerate(pad_loops) if sch.get(loop).same_as(sch.get(where))]
        if at:  # the window's rows and columns: the loops inside the tile loop, less the lanes
            partition_at_tile_edges(sch, pad, loops=pad_loops[at[0] + 1:-1])
    elif source is not None:
        _schedule_whole_pad(sch, source, vectorized=pad_lanes, lanes=lanes)
    if prefetch_input and not parallel_channels:
        data = conv.op.input_tensors[0]  # the input as the conv reads it: in place, or its padded copy
        var = lambda rv: sch.get(rv).loop_var  # noqa: E731
        task = sch.get_loops(sch.get_sblock(conv.op.name + "_update"))[0]
        func = prefetch_next_tile(sch.mod["main"], block=f"{conv.op.name}_update", buffer=data.op.name,
                                  outer=var(task), spread=[var(loop) for loop in [*channel_outer, *middle, last_o]])
        return tvm.IRModule({"main": func})
    return sch.mod


def pads_per_channel_tile(geometry: ConvGeometry, tiling: DefaultConvTiling, *, loop_tiles: Any = None) -> bool:
    """Whether the conv pads each output tile's window inside its channel tile loop
    (``pad_in_tile``, :func:`.tiling.window_per_channel_tile`). Always for a depthwise conv;
    for a grouped one unless its tiling reads the input as the conv does (``prefetch_input``,
    ``reduction_outer``: a tuning record may ask for those) or tiles it by loops (ALT-OL)."""
    if is_depthwise(geometry.in_per_group, geometry.out_per_group):
        return True
    if tiling.prefetch_input or tiling.reduction_outer or geometry.transposed or loop_tiles is not None:
        return False
    return window_per_channel_tile(geometry.out_shape[1], geometry.in_per_group, geometry.out_per_group, tiling.ot)


def _schedule_whole_pad(sch: tvm.s_tir.Schedule, source: te.Tensor, *, vectorized: bool, lanes: int) -> None:
    """The pad stage copied whole before the conv: parallel over its outer loops and, if
    ``vectorized``, vectorized over its channel tile (for the target's ``lanes``). Grouped convs
    that copy wider channel tiles than they read (RegNetY's stride-2 convs: 16-channel tiles
    into 8-channel ones) pad per tile instead (:func:`pads_per_channel_tile`) unless a record
    asks for the prefetch: 0.44-0.74x the time in the model."""
    pad = sch.get_sblock(source.op.name)
    sch.parallel(sch.fuse(*sch.get_loops(pad)[:2]))
    if vectorized:
        vectorize_lanes(sch, pad, lanes=lanes)


def _schedule_reduction_outer(sch: tvm.s_tir.Schedule, block: Any, *, order: list, channel_loops: int,
                              unrolled: list, stages: list, source: te.Tensor | None, pad_lanes: bool,
                              lanes: int = 0, prefetch: Any = None) -> tvm.IRModule:
    """The loop order of :func:`schedule_tiled_conv`'s ``reduction_outer``: ``order`` starts with
    the ``channel_loops`` loops of output channel tiles and ends with the register tile's
    ``unrolled`` loops and its vector loop. The register block accumulates straight into the conv's output,
    so its partial sums persist from one input channel block to the next. ``prefetch`` (a
    :class:`_WeightPrefetch`) then adds the prefetch of the next weight block."""
    sch.reorder(*order)
    tile = sch.fuse(*order[:channel_loops])
    sch.parallel(tile)
    pieces, vector = vectorize_channels(sch, order[-1], lanes=lanes)
    if prefetch is not None and pieces is not None:  # the weight read is a loop of pieces of vectors
        prefetch = replace(prefetch, reads=[*prefetch.reads, pieces], vector=vector)
    for loop in unrolled:
        sch.unroll(loop)
    sch.decompose_reduction(block, order[channel_loops])
    if stages:
        for stage in stages[:-1]:
            sch.compute_inline(sch.get_sblock(stage.op.name))
        final = sch.get_sblock(stages[-1].op.name)
        sch.reverse_compute_at(final, tile)
        vectorize_channels(sch, sch.get_loops(final)[-1], lanes=lanes)
    if source is not None:
        _schedule_whole_pad(sch, source, vectorized=pad_lanes, lanes=lanes)
    if prefetch is not None:
        return prefetch.apply(sch, order[channel_loops])
    return sch.mod


@dataclass(frozen=True)
class _WeightPrefetch:
    """The :func:`.prefetch.prefetch_next_block` step of the reduction-outer order: while
    the tile's spatial blocks (``spatial``) use one block of weights, the next one is
    prefetched, a share per spatial block."""

    conv: te.Tensor
    spatial: list
    reads: list
    vector: Any

    def apply(self, sch: tvm.s_tir.Schedule, outer: Any) -> tvm.IRModule:
        var = lambda rv: sch.get(rv).loop_var  # noqa: E731
        weight = self.conv.op.input_tensors[1]
        func = prefetch_next_block(sch.mod["main"], block=f"{self.conv.op.name}_update", buffer=weight.op.name,
                                   outer=var(outer), spread=[var(loop) for loop in self.spatial],
                                   reads=[var(loop) for loop in self.reads], vector=var(self.vector))
        return tvm.IRModule({"main": func})


#: Output channels times kernel taps from which a stem's per-task window copy
#: (:attr:`ConvGeometry.copies_window_per_task`) is small next to the task's work.
WINDOW_WORK = 1024


@dataclass(frozen=True)
class ConvGeometry:
    """A conv partition's shapes and attributes, read from its Relax call (no TE built)."""

    rank: int
    transposed: bool
    #: the data the partition reads (before an absorbed pad op; in the conv's order for a transpose)
    data_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    strides: tuple[int, ...]
    dilation: tuple[int, ...]
    #: padding before then after each spatial dim, an absorbed zero pad op included
    pads: tuple[int, ...]
    groups: int
    #: the partition reads the data through an absorbed transpose
    transposed_input: bool
    #: the data is scaled per input channel first (an absorbed squeeze-excitation multiply)
    scaled_input: bool = False

    @property
    def in_per_group(self) -> int:
        return self.data_shape[1] // self.groups

    @property
    def out_per_group(self) -> int:
        return self.weight_shape[1] if self.transposed else self.weight_shape[0] // self.groups

    @property
    def conv_strides(self) -> tuple[int, ...]:
        """Strides of the direct conv computed (a transposed conv runs stride 1 over its dilated input)."""
        return (1,) * self.rank if self.transposed else self.strides

    @property
    def image_channels(self) -> bool:
        """Whether the data has at most :data:`IMAGE_CHANNELS` channels, as an image has."""
        return self.data_shape[1] <= IMAGE_CHANNELS

    @property
    def copies_window_per_task(self) -> bool:
        """Whether the pad stage is computed per parallel task (the output's spatial tile, before
        its channel tiles) rather than in a pass of its own: a dense conv with a few input channels
        (a network's stem), padded, with at least :data:`WINDOW_WORK` output channels times kernel
        taps. Its window copy per task is then small next to the task's work and stays in L1,
        where the pass wrote an unfolded copy of the input (2.4x the image for ResNet's 7x7 stem)
        to read back. Inside the model the 7x7 stems (64 channels x 49 taps) of ResNet-18/50,
        GoogLeNet and DenseNet-121 run 3-9% faster so; ShuffleNet-V2's 3x3 stem (24 x 9) 19%
        slower, its copy as large as its work (the threshold's reason; docs/strategies.md)."""
        taps = math.prod(self.weight_shape[2:])
        return (not self.transposed and self.groups == 1 and self.image_channels
                and any(self.pads) and self.out_per_group * taps >= WINDOW_WORK)

    @classmethod
    def of(cls, anchor: Any, prologue: Sequence[Any] = ()) -> ConvGeometry:
        call = anchor.value
        rank, transposed = _CONV_OPS[str(call.op.name)]
        attrs = attrs_dict(call.attrs)
        pads = list(attrs.get("padding", [0] * (2 * rank)))
        data_shape = static_shape(call.args[0])
        absorbs_transpose = bool(prologue) and str(prologue[0].value.op.name) == "relax.permute_dims"
        scaled = bool(prologue) and str(prologue[0].value.op.name) == "relax.multiply"
        if prologue and not absorbs_transpose and not scaled and not transposed:
            # An explicit pad op before the conv joins the conv's own padding (one pad stage).
            widths = [int(w) for w in prologue[0].value.attrs.pad_width]
            before, after = widths[4::2], widths[5::2]
            pads = [p + b for p, b in zip(pads[:rank], before)] + [p + a for p, a in zip(pads[rank:], after)]
            data_shape = static_shape(prologue[0].value.args[0])
        out_shape, weight_shape = static_shape(anchor.var), static_shape(call.args[1])
        strides, dilation = tuple(attrs.get("strides", [1] * rank)), tuple(attrs.get("dilation", [1] * rank))
        if not transposed:
            pads = _read_padding(pads, data_shape[2:], out_shape[2:], weight_shape[2:], strides, dilation)
        return cls(rank=rank, transposed=transposed, data_shape=data_shape,
                   weight_shape=weight_shape, out_shape=out_shape, strides=strides, dilation=dilation,
                   pads=tuple(pads), groups=int(attrs.get("groups", 1)), transposed_input=absorbs_transpose,
                   scaled_input=scaled)


def _read_padding(pads: list[int], extents: Sequence[int], outputs: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dilation: Sequence[int]) -> list[int]:
    """``pads`` without the trailing padding no output reads (:func:`ops.reached_padding_after`):
    the unfolded input then has one tile per output tile, not one more. ResNet's stride-2 3x3
    convs (padding 1 on an even map) padded a row and a column that no window reaches, and
    their pad stage wrote 2x the windows the conv read."""
    rank = len(extents)
    after = [min(pads[rank + d], ops.reached_padding_after(extent=extents[d], before=pads[d], outputs=outputs[d],
                                                           window=kernel[d], stride=strides[d],
                                                           dilation=dilation[d]))
             for d in range(rank)]
    return [*pads[:rank], *after]


@dataclass(frozen=True)
class ConvLayouts:
    """The layouts of one conv partition's tensors, and the tiling they come from."""

    tiling: DefaultConvTiling
    #: ALT-OL: the loop tiling applied by splits over whole-extent layout tiles (None otherwise)
    loop_tiles: DefaultConvTiling | None
    output: Layout
    source: Layout  # the direct conv's input (the pad stage's output, or the data itself)
    weight: Layout | None


def fuses_block(strategy: AltConvStrategy, anchor: relax.VarBinding, match: Match, target: HardwareTarget,
                options: Any = None) -> bool:
    """Fuse an inverted-residual block (:data:`.patterns.BLOCK`, :mod:`.block`) where a band
    of rows fits half the L2 cache with a band per core. By default, on targets with at least
    :data:`.block.BLOCK_MIN_REGISTERS` vector registers, and only where

    - the recomputed rows leave the fused kernel at most :data:`.block.MAX_WORK_RATIO` times
      the three kernels' work (:data:`.block.MAX_SHORT_WORK_RATIO` times the two kernels' for
      a block that ends at its depthwise conv),
    - the convs do at most :data:`.block.MAX_INTENSITY` FLOPs per byte fusion keeps out of
      memory, and
    - the weights stay in the L2 cache beside a band (:func:`.block.stays_in_l2`).

    The option ``fuse_blocks``: True (that rule), False (never), ``"always"`` (wherever a
    band fits)."""
    fuse = fusion_option(options, "fuse_blocks")
    if fuse is False or target.to_tvm().kind.name != "llvm":
        return False
    if fuse is True and (target.vector_registers or 16) < BLOCK_MIN_REGISTERS:
        return False
    try:
        geometry = BlockGeometry.of(anchor, match.tail)
        rows = strategy._default_block_tiling(geometry, match.tail, target).band_rows
    except ValueError:  # not a block the kernel computes, or no band fits
        return False
    if fuse == "always":
        return True
    bound = MAX_WORK_RATIO if geometry.project else MAX_SHORT_WORK_RATIO
    return work_ratio(geometry, rows, cores=target.num_cores) <= bound and geometry.intensity <= MAX_INTENSITY \
        and stays_in_l2(geometry, rows, l2_bytes=target.l2_bytes)


class AltConvStrategy(Strategy):
    """ALT's conv template with analytic tiles (the ``alt`` default strategy for convs on CPUs).

    Subclasses for other targets keep the TE and the layouts and swap the loop schedule
    (:meth:`layout_params`, :meth:`schedule`), so layout propagation does not depend on
    the target.
    """

    name = "alt"
    ops = tuple(_CONV_OPS)
    target_kinds = ("llvm",)
    priority = 10
    patterns = (ABSORBED_INPUT, CHANNEL_SCALE, BLOCK.where(fuses_block))

    def applicable(self, info: OpInfo) -> str | None:
        rank, transposed = _CONV_OPS[info.op]
        data_layout, kernel_layout = (_CANONICAL_T if transposed else _CANONICAL)[rank]
        if info.attrs.get("data_layout", data_layout) != data_layout or \
                info.attrs.get("kernel_layout", kernel_layout) != kernel_layout:
            return (f"layouts {info.attrs.get('data_layout')}/{info.attrs.get('kernel_layout')} "
                    f"(needs {data_layout}/{kernel_layout})")
        if info.input_dtypes[0] not in ("float32",):
            return f"dtype {info.input_dtypes[0]} (needs float32)"
        if 1 not in info.constants:
            return "weight is not a constant"
        if transposed:
            pads = list(info.attrs.get("padding", [0] * (2 * rank)))
            if pads[:rank] != pads[rank:]:
                return f"asymmetric padding {pads}"
        return None

    @staticmethod
    def default_tiling(geometry: ConvGeometry, target: HardwareTarget) -> DefaultConvTiling:
        """The analytic tiling for ``target`` (the untuned build's choice). A conv that copies its
        input window per task (:attr:`ConvGeometry.copies_window_per_task`) prefetches no input
        tile: it reads the copy.

        A dense conv whose input channels (per group) fit one channel tile runs the window loops
        outside the channel loop (``window_outer``), reading the tile whole at each window
        position, as a split reduction reads each block. In the model (Zen 4, 2 threads, both
        orders): RegNetY-400MF's grouped 3x3 convs (8 channels per group) 0.51-0.85x the time,
        GoogLeNet's 3x3 24 -> 64 conv 0.58-0.76x; an image's stem (GoogLeNet's 7x7) ran 3-4%
        slower that way and keeps the channel loop outside.
        """
        tiling = default_conv_tiling(geometry.out_shape, geometry.in_per_group, geometry.out_per_group,
                                     in_channels=geometry.data_shape[1], lanes=target.vector_lanes("float32"),
                                     registers=target.vector_registers or 16, l1_bytes=target.l1d_bytes,
                                     l2_bytes=target.l2_bytes, weight_bytes=4 * math.prod(geometry.weight_shape),
                                     input_bytes=4 * math.prod(geometry.data_shape),
                                     half_vectors_full_rate=target.half_vectors_full_rate,
                                     fma_chains=target.fma_chains)
        if geometry.copies_window_per_task:
            tiling = replace(tiling, prefetch_input=False)
        if not geometry.image_channels and 1 < geometry.in_per_group <= tiling.it:
            tiling = replace(tiling, window_outer=True)
        return tiling

    def space(self, anchor, context) -> Any:
        """The tuning space of this partition (the defaults are the untuned build's choice):
        a :class:`.space.ConvSpace`, or a :class:`.space.BlockSpace` for a fused block."""
        from .space import BlockSpace, ConvSpace

        machine = context.target
        if context.partition.tail:
            geometry = BlockGeometry.of(anchor, context.partition.tail)
            return BlockSpace(geometry=geometry,
                              default=self._default_block_tiling(geometry, context.partition.tail, machine),
                              registers=machine.vector_registers or 16, lanes=machine.vector_lanes("float32"),
                              cores=machine.num_cores, l2_bytes=machine.l2_bytes)

        geometry = ConvGeometry.of(anchor)
        levels = int((context.options or {}).get("layout_levels", 1))
        return ConvSpace(out_shape=geometry.out_shape, in_channels_per_group=geometry.in_per_group,
                         out_channels_per_group=geometry.out_per_group,
                         default=self.default_tiling(geometry, machine).to_json(),
                         registers=machine.vector_registers or 16, lanes=machine.vector_lanes("float32"),
                         levels=levels, winograd=self.winograd_tile(geometry, context))

    def _default_block_tiling(self, geometry: BlockGeometry, tail: Any, target: HardwareTarget) -> BlockTiling:
        output_conv = ConvGeometry.of(block_output_conv(tail))
        return default_block_tiling(geometry, self.default_tiling(output_conv, target), target=target)

    def layout_params(self, geometry: ConvGeometry, context: Any) -> tuple[DefaultConvTiling, str]:
        """The tiling the layouts come from, and the variant they follow (``"alt"`` or ``"alt-ol"``)."""
        if context.params is not None:
            return DefaultConvTiling.from_json(context.params), context.variant
        return self.default_tiling(geometry, context.target), context.variant

    def layouts(self, geometry: ConvGeometry, context: Any, *, tiling: DefaultConvTiling | None = None) -> ConvLayouts:
        """The layouts of the partition's tensors (the paper's §5.1 templates), from
        ``tiling`` (default: :meth:`layout_params`')."""
        if tiling is None:
            tiling, variant = self.layout_params(geometry, context)
        else:
            variant = context.variant
        out_shape = geometry.out_shape
        source_shape = list(geometry.data_shape)
        if not geometry.transposed:
            source_shape[2:] = [s + geometry.pads[d] + geometry.pads[d + geometry.rank]
                                for d, s in enumerate(geometry.data_shape[2:])]
        else:  # the dilated, padded input of the equivalent direct conv
            windows = zip(out_shape[2:], geometry.weight_shape[2:], geometry.dilation)
            source_shape[2:] = [o + d * (k - 1) for o, k, d in windows]
        kernel = list(geometry.weight_shape[2:])
        strides, dilation = list(geometry.conv_strides), list(geometry.dilation)
        if variant == "alt-ol":
            # Loop-only: channels-last storage (whole-extent layout tiles), tiling by loops.
            # Whole-extent tiles: N.1.1.1.H.W.O stores exactly like NHWO, and keeps the loop
            # structure the schedule expects.
            loop_tiles = tiling
            tiling = DefaultConvTiling(tuple(out_shape[2:]), out_shape[1], geometry.data_shape[1], tiling.reg,
                                       parallel_channels=tiling.parallel_channels)
            output = conv_output_tiled(out_shape, spatial_tiles=out_shape[2:], channel_tile=out_shape[1])
            source = conv_input_unfolded(source_shape, spatial_tiles=out_shape[2:], channel_tile=source_shape[1],
                                         kernel=kernel, strides=strides, dilation=dilation)
            weight = None if geometry.transposed else weight_channels_last(list(geometry.weight_shape))
            return ConvLayouts(tiling, loop_tiles, output, source, weight)
        output = conv_output_tiled(out_shape, spatial_tiles=tiling.spatial, channel_tile=tiling.ot) \
            if not tiling.two_level else \
            conv_output_two_level(out_shape, spatial_tiles=tiling.spatial, channel_tile=tiling.ot,
                                  outer_spatial_tiles=tiling.outer_spatial, outer_channel_tile=tiling.outer_ot)
        source = conv_input_unfolded(source_shape, spatial_tiles=tiling.spatial, channel_tile=tiling.it,
                                     kernel=kernel, strides=strides, dilation=dilation)
        weight = _weight_layout(list(geometry.weight_shape), tiling, geometry.transposed)
        return ConvLayouts(tiling, None, output, source, weight)

    def preferred_input_layout(self, anchor, context) -> Layout | None:
        geometry = ConvGeometry.of(anchor, context.partition.prologue)
        if geometry.transposed or geometry.transposed_input or any(geometry.pads):
            return None  # a pad stage (or the absorbed transpose) writes the input layout for free
        if context.partition.tail:  # a fused block reads its input as the unfused expand conv would
            return self.layouts(geometry, context, tiling=self.default_tiling(geometry, context.target)).source
        return self.layouts(geometry, context).source

    def schedule(self, *, conv: te.Tensor, stages: list, pad_stage: te.Tensor | None, geometry: ConvGeometry,
                 layouts: ConvLayouts, context: Any) -> Any:
        """The loop schedule: ``PrimFunc -> IRModule``."""
        tiling, loop_tiles = layouts.tiling, layouts.loop_tiles
        return lambda f: schedule_tiled_conv(
            f, conv=conv, stages=stages, source=pad_stage, rank=geometry.rank, reg=tiling.reg,
            loop_tiles=loop_tiles, channel_tile=(tiling.rc_split or tiling.it) if loop_tiles is None else 1,
            cores=context.target.num_cores, parallel_channels=tiling.parallel_channels,
            two_level=tiling.two_level and loop_tiles is None, unroll_window=tiling.unroll_window,
            window_outer=tiling.window_outer, epilogue_in_block=tiling.epilogue_in_block,
            pad_in_tile=pads_per_channel_tile(geometry, tiling, loop_tiles=loop_tiles),
            pad_per_task=geometry.copies_window_per_task and loop_tiles is None and not tiling.two_level
            and not (tiling.prefetch_input or tiling.reduction_outer),
            reduction_outer=tiling.reduction_outer, prefetch=tiling.prefetch, prefetch_input=tiling.prefetch_input,
            pad_lanes=not geometry.image_channels, lanes=context.target.vector_lanes("float32"))

    def winograd_tile(self, geometry: ConvGeometry, context: Any) -> int:
        """The Winograd output tile ``m`` (:mod:`.winograd`) this conv is lowered with, or 0 for
        the direct template. Only dense stride-1 3x3 convs padded by one on every side qualify,
        without an absorbed prologue, on a CPU target. A tuning record's ``winograd`` (its
        :class:`.space.ConvSpace` knob) decides when there is one; otherwise the option
        ``winograd``: True (the default: where :func:`.winograd.winograd_tile` finds enough
        tiles), False (never), ``"always"`` (any conv that qualifies, whatever its tile count)."""
        mode = fusion_option(context.options, "winograd")
        if context.params is not None:
            chosen = int(context.params.get("winograd", 0))
            if chosen and chosen != self._winograd_fit(geometry, context, min_tiles=1):
                raise ValueError(f"a tuning record asks for Winograd tiles of {chosen}: this conv "
                                 f"({geometry.weight_shape} on {geometry.out_shape}) allows "
                                 f"{self._winograd_fit(geometry, context, min_tiles=1) or 'none'}")
            return chosen
        if mode is False:
            return 0
        return self._winograd_fit(geometry, context, min_tiles=MIN_TILES if mode is True else 1)

    @staticmethod
    def _winograd_fit(geometry: ConvGeometry, context: Any, *, min_tiles: int) -> int:
        """:func:`.winograd.winograd_tile` for a conv the kernel can compute, else 0."""
        if context.partition.prologue or context.target.to_tvm().kind.name != "llvm":
            return 0
        if (geometry.rank != 2 or geometry.transposed or geometry.groups != 1 or geometry.strides != (1, 1)
                or geometry.dilation != (1, 1) or geometry.weight_shape[2:] != (3, 3) or geometry.pads != (1,) * 4):
            return 0
        batch, channels = geometry.data_shape[:2]
        m, _ = winograd_tile(out_hw=geometry.out_shape[2:], batch=batch, in_channels=channels,
                             out_channels=geometry.out_shape[1], lanes=context.target.vector_lanes("float32"),
                             min_tiles=min_tiles)
        return m

    def _implement_winograd(self, anchor: Any, context: Any, geometry: ConvGeometry, m: int) -> Any:
        """Lower the conv and its epilogue as :func:`.winograd.winograd_conv`."""
        call = anchor.value
        data = context.te_input(call.args[0], "data")
        weight = context.te_input(call.args[1], "weight")
        u = context.te_input(relax.const(transform_weight(np.asarray(const_value(call.args[1])), m)),
                             "winograd_weight")
        lanes = context.target.vector_lanes("float32")
        conv = winograd_conv(data, u, weight, m=m, pads=geometry.pads, out_hw=geometry.out_shape[2:], lanes=lanes)
        stored = stored_in_output_layout(conv)
        stages = context.epilogue_te(conv)
        current = context.input_layouts.get(call.args[0])
        inner = current.innermost_dim if current is not None else None
        if inner is None or inner[0] != 1 or inner[1] % lanes:
            # The transform reads vectors of input channels: have them stored innermost.
            context.require_layout(data, conv_output_tiled(geometry.data_shape, spatial_tiles=[1, 1],
                                                           channel_tile=lanes))
        output = conv_output_tiled(geometry.out_shape, spatial_tiles=[m, m], channel_tile=lanes)
        block = vector_block(vectors=geometry.out_shape[1] // lanes, registers=context.target.vector_registers)
        tiled = [(t, conv_output_tiled([int(e) for e in t.shape], spatial_tiles=[m, m], channel_tile=lanes))
                 for t in stored]
        return context.finish(output=stages[-1] if stages else conv,
                              layouts=TensorMap([*tiled, *((t, output) for t in [conv, *stages])]), strategy=self.name,
                              schedule=lambda f: schedule_winograd(f, stages=[conv, *stages], lanes=lanes,
                                                                   vectors_per_block=block))

    def implement(self, anchor, context) -> Any:
        if context.partition.tail:
            if context.params is not None:
                tiling = BlockTiling.from_json(context.params)
            else:
                tail = context.partition.tail
                tiling = self._default_block_tiling(BlockGeometry.of(anchor, tail), tail, context.target)
            return implement_block(anchor, context, strategy=self.name, tiling=tiling)
        call = anchor.value
        geometry = ConvGeometry.of(anchor, context.partition.prologue)
        m = self.winograd_tile(geometry, context)
        if m:
            return self._implement_winograd(anchor, context, geometry, m)
        rank = geometry.rank
        prologue = context.partition.prologue
        if geometry.transposed_input:
            # Read the transpose's input through the inverse permutation: no transpose kernel.
            axes = [int(a) for a in prologue[0].value.attrs.axes]
            view = Layout(geometry.data_shape).reorder([axes.index(d) for d in range(len(axes))])
            data = context.te_view(prologue[0].value.args[0], shape=geometry.data_shape, layout=view, name="data")
        elif geometry.scaled_input:
            # x * s before a 1x1 conv: sum_c W[o, c] s[c] x[c], with W * s computed in the kernel.
            full, vector = sorted(prologue[0].value.args, key=lambda a: static_shape(a)[2:] == (1, 1))
            data = context.te_input(full, "data")
            scale = context.te_input(vector, "scale")
        elif prologue and not geometry.transposed:
            data = context.te_input(prologue[0].value.args[0], "data")
        else:
            data = context.te_input(call.args[0], "data")
        weight = packed = context.te_input(call.args[1], "weight")
        if geometry.scaled_input:
            weight = te.compute(packed.shape, lambda o, c, *k: packed(o, c, *k) * scale(0, c, 0, 0),
                                name="scaled_weight")
        pads = geometry.pads
        if geometry.transposed:
            attrs = attrs_dict(call.attrs)
            conv = ops.conv_transpose(data, weight, stride=geometry.strides, padding=tuple(pads[:rank]),
                                      output_padding=tuple(attrs.get("output_padding", [0] * rank)),
                                      dilation=geometry.dilation, groups=geometry.groups)
        else:
            padded = ops.pad(data, [0, 0, *pads[:rank]], [0, 0, *pads[rank:]])
            conv = ops.conv(padded, weight, strides=geometry.strides, dilation=geometry.dilation,
                            groups=geometry.groups)
        stages = context.epilogue_te(conv)
        final = stages[-1] if stages else conv
        source = conv.op.input_tensors[0]
        chosen = self.layouts(geometry, context)
        if source.same_as(data) and context.params is None:
            chosen = self._producer_channel_tile(geometry, context, chosen, context.source_of(data))
        if tuple(int(s) for s in source.shape) != tuple(chosen.source.orig_shape):
            raise ValueError(f"conv input stage has shape {[int(s) for s in source.shape]}, the layout was "
                             f"derived for {list(chosen.source.orig_shape)}")
        layouts = TensorMap((t, chosen.output) for t in [conv, *stages])
        if chosen.weight is not None:
            layouts[weight] = chosen.weight
            layouts[packed] = chosen.weight  # (the same tensor, or the one the scaled weights read)
        if source.same_as(data):
            current = context.input_layouts.get(context.source_of(data))
            image = current is None and geometry.image_channels and not geometry.transposed
            readable = current is not None and current.stores_each_once \
                and current.shape[-1] == chosen.source.shape[-1]
            if not (image or readable):
                # No pad stage to convert for free. (A strided 1x1 conv reads its producer's
                # tiles directly when they end in the same channel vector: no conversion.)
                context.require_layout(data, chosen.source)
            pad_stage = None
        else:
            layouts[source] = chosen.source  # the pad stage writes the conv's input layout
            pad_stage = source
        schedule = self.schedule(conv=conv, stages=stages, pad_stage=pad_stage, geometry=geometry, layouts=chosen,
                                 context=context)
        if weight is not packed:
            schedule = _with_scaled_weights(schedule, weight)
        return context.finish(output=final, layouts=layouts, strategy=self.name, schedule=schedule)


    def _producer_channel_tile(self, geometry: ConvGeometry, context: Any, chosen: ConvLayouts,
                               source: Any) -> ConvLayouts:
        """``chosen``, or the same layouts with the input channel tile its producer stored.

        A conv without a pad stage reads its input as stored. When the producer is a grouped
        conv, its channel tile is its group width (RegNet: 8), not the 16 lanes this conv's
        analytic tiling takes for 48 channels: reading that tile costs nothing, converting
        to 16 costs a pass over the map.
        """
        current = context.input_layouts.get(source)
        if current is None or not current.stores_each_once or equivalent(current, chosen.source, geometry.data_shape):
            return chosen
        tile = int(current.shape[-1])
        if tile == chosen.tiling.it or geometry.in_per_group % tile:
            return chosen
        other = self.layouts(geometry, context, tiling=replace(chosen.tiling, it=tile, rc_split=0))
        # A producer whose spatial tiles differ (a Winograd conv's m x m tiles) is read in
        # place all the same when it stores whole vectors of ``tile`` channels innermost.
        vectors = current.innermost_dim == (1, tile)
        return other if vectors or equivalent(current, other.source, geometry.data_shape) else chosen


def _with_scaled_weights(schedule: Any, scaled: te.Tensor) -> Any:
    """``schedule``, then the scaled weights computed once per call with whole vectors."""
    def apply(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
        sch = tvm.s_tir.Schedule(schedule(func))
        sch.vectorize(sch.get_loops(sch.get_sblock(scaled.op.name))[-1])
        return sch.mod

    return apply


def _weight_layout(shape: list[int], tiling: DefaultConvTiling, transposed: bool) -> Layout:
    ot, it = tiling.weight_ot or tiling.ot, tiling.weight_it or tiling.it
    if not transposed:
        return conv_weight_tiled(shape, out_tile=ot, in_tile=it)
    # Transposed weights are I x O/g x K...: tile I by it and O/g by ot, O innermost. The
    # output's channel tile may span groups (one output channel per group, as in a
    # depthwise conv): the weight's O/g tile is then only what divides O/g.
    ot, it = math.gcd(ot, shape[1]), math.gcd(it, shape[0])
    rank = len(shape) - 2
    layout = Layout(shape).split(1, [shape[1] // ot, ot]).split(0, [shape[0] // it, it])
    # Now: I/it, it, O/ot, ot, K...
    return layout.reorder([0, 2, *range(4, 4 + rank), 1, 3])


register_strategy(AltConvStrategy())
