"""An inverted-residual block as one kernel: expand 1x1 -> depthwise -> project 1x1.

The same chain with a larger first conv is a network's stem: MobileNet-V2 and MNASNet start
with a 3x3 stride-2 conv on the image, a depthwise conv and a 1x1 conv, whose two 32-channel
112x112 maps (1.6 MB each) would otherwise go through memory twice. The first conv then
reads its input rows through its own window and padding.

MobileNetV2 (Sandler et al. 2018, §3.3 and §5.1) notes that the block's expanded
intermediate need never be materialised whole. Computed one op at a time, the expanded map
(``M = 6 C`` channels at full resolution: 4.8 MB for MobileNet-V2's second block) is written
to memory by the expand conv and read back by the depthwise conv, whose output is written
and read again by the project conv: on a CPU these kernels run at the memory roof.

Here each parallel task takes a band of ``R`` output rows (:func:`band_rows`) and computes,
in order, the expanded rows that band's depthwise windows read (with the expand conv's
epilogue), the depthwise rows (with its epilogue) and the band's output (with the project
conv's epilogue, e.g. the residual add). The band's intermediates live in cache. Interior
bands recompute the ``K - S`` expanded rows their windows share with the next band: the
band is chosen to keep that recomputation small while its buffers fit in the L2 cache.

Where other ops read the depthwise map too (EfficientNet's squeeze-excitation reads it for
its mean and its scale), the kernel ends at the depthwise conv and writes that map: it saves
the expanded map's trip through memory only, so it is fused where little is recomputed
(:data:`MAX_SHORT_WORK_RATIO`).

Layouts (ALT paper §5.1): the expanded and depthwise maps are stored per band as rows of
channel vectors (``N H 1 M/mt 1 W mt``: a depthwise tap reads one vector, a 1x1 conv reads
the channels of one position contiguously); the output is stored as the unfused project
conv would store it, so the consumers see the same layout either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax, te

from alt_tvm import ops
from alt_tvm.layout.rewrite import TensorMap
from alt_tvm.layout.templates import conv_output_tiled, conv_weight_tiled
from alt_tvm.strategies.base import attrs_dict, static_shape
from alt_tvm.target import HardwareTarget

from .patterns import block_output_conv, split_block_tail
from .tiling import DefaultConvTiling, channel_tile, register_block
from .vectors import vector_registers, vectorize_channels

__all__ = ["MAX_INTENSITY", "MAX_SHORT_WORK_RATIO", "MAX_WORK_RATIO", "STEM_EXPAND_POSITIONS", "BlockGeometry",
           "BlockTiling", "band_rows", "default_block_tiling", "implement_block", "stays_in_l2", "work_ratio"]


@dataclass(frozen=True)
class BlockGeometry:
    """The shapes of an expand -> depthwise -> project chain, or of expand -> depthwise
    (``project`` False) (NCHW, batch ``n``).

    The expand conv is a 1x1 conv by default; a network's first conv (MobileNet-V2's 3x3,
    stride 2, on the image) has its kernel, stride and padding in the ``expand_*`` fields
    and its input's size in ``in_hw``.
    """

    n: int
    c: int  #: input channels
    m: int  #: expanded channels
    o: int  #: output channels
    h: int  #: the expanded map's height (the depthwise conv's input)
    w: int
    oh: int
    ow: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    #: depthwise padding: top, left, bottom, right
    pads: tuple[int, int, int, int]
    expand_kernel: tuple[int, int] = (1, 1)
    expand_stride: tuple[int, int] = (1, 1)
    #: the expand conv's padding: top, left, bottom, right
    expand_pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    #: the input's height and width (None: the expanded map's, as for a 1x1 expand conv)
    in_hw: tuple[int, int] | None = None
    #: whether a 1x1 project conv follows; False: the kernel ends at the depthwise map (``o = m``)
    project: bool = True

    @classmethod
    def of(cls, anchor: relax.VarBinding, tail: Sequence[relax.VarBinding]) -> BlockGeometry:
        depthwise, _, project, _ = split_block_tail(tail)
        n, c, ih, iw = static_shape(anchor.value.args[0])
        _, m, h, w = static_shape(anchor.var)
        attrs = attrs_dict(depthwise.value.attrs)
        expand = attrs_dict(anchor.value.attrs)
        for conv, what in ((attrs, "depthwise"), (expand, "expand")):
            if any(int(d) != 1 for d in conv.get("dilation", [1, 1])):
                raise ValueError(f"block fusion needs an undilated {what} conv, got dilation {conv['dilation']}")
        if int(expand.get("groups", 1)) != 1:
            raise ValueError(f"block fusion needs a dense expand conv, got groups={expand['groups']}")
        _, o, oh, ow = static_shape(block_output_conv(tail).var)
        return cls(n=n, c=c, m=m, o=o, h=h, w=w, oh=oh, ow=ow, project=project is not None,
                   kernel=tuple(static_shape(depthwise.value.args[1])[2:]),
                   stride=tuple(int(s) for s in attrs.get("strides", [1, 1])),
                   pads=tuple(int(p) for p in attrs.get("padding", [0, 0, 0, 0])),
                   expand_kernel=tuple(static_shape(anchor.value.args[1])[2:]),
                   expand_stride=tuple(int(s) for s in expand.get("strides", [1, 1])),
                   expand_pads=tuple(int(p) for p in expand.get("padding", [0, 0, 0, 0])),
                   in_hw=(ih, iw))

    @property
    def pointwise_expand(self) -> bool:
        """Is the expand conv 1x1, stride 1, unpadded (an inverted-residual block's)?"""
        return self.expand_kernel == (1, 1) and self.expand_stride == (1, 1) and not any(self.expand_pads)

    @property
    def padded_w(self) -> int:
        """The width of the depthwise conv's padded input (the expand rows' width)."""
        return self.w + self.pads[1] + self.pads[3]

    @property
    def expand_taps(self) -> int:
        return self.expand_kernel[0] * self.expand_kernel[1]

    def expanded_rows(self, rows: int) -> int:
        """Padded expanded rows the depthwise windows of ``rows`` output rows read."""
        return (rows - 1) * self.stride[0] + self.kernel[0]

    @property
    def weight_bytes(self) -> int:
        """The expand, depthwise and project weights, in bytes: every band reads them all."""
        project = self.m * self.o if self.project else 0
        return 4 * (self.c * self.expand_taps * self.m + self.kernel[0] * self.kernel[1] * self.m + project)

    @property
    def expanded_bytes(self) -> int:
        return 4 * self.n * self.m * self.h * self.w

    def band_bytes(self, rows: int) -> int:
        """The band's expanded (padded) and depthwise buffers (none for the depthwise map where
        the kernel ends there), and a stem's copy of the input rows they read, in bytes."""
        padded_w = self.padded_w
        buffers = self.m * (self.expanded_rows(rows) * padded_w + (rows * self.ow if self.project else 0))
        if not self.pointwise_expand:
            (kh, kw), (sy, sx) = self.expand_kernel, self.expand_stride
            buffers += self.c * ((self.expanded_rows(rows) - 1) * sy + kh) * ((padded_w - 1) * sx + kw)
        return 4 * buffers

    @property
    def unfused_flops(self) -> float:
        """FLOPs of the two or three convs computed one at a time."""
        project = 2 * self.m * self.o * self.oh * self.ow if self.project else 0
        return float(self.n * (2 * self.c * self.expand_taps * self.m * self.h * self.w
                               + 2 * self.kernel[0] * self.kernel[1] * self.m * self.oh * self.ow + project))

    @property
    def saved_bytes(self) -> int:
        """Bytes the unfused convs write and read back that the fused kernel keeps in cache:
        the expanded map, and the depthwise map where a project conv reads it."""
        depthwise = 4 * self.n * self.m * self.oh * self.ow if self.project else 0
        return 2 * (self.expanded_bytes + depthwise)

    @property
    def intensity(self) -> float:
        """FLOPs per byte of memory traffic fusion saves (:data:`MAX_INTENSITY` bounds it)."""
        return self.unfused_flops / self.saved_bytes

    def flops(self, rows: int) -> float:
        """FLOPs of one band of ``rows`` output rows, its expanded rows recomputed."""
        expand = 2 * self.c * self.expand_taps * self.m * self.w * min(self.expanded_rows(rows), self.h)
        depthwise = 2 * self.kernel[0] * self.kernel[1] * self.m * rows * self.ow
        project = 2 * self.m * self.o * rows * self.ow if self.project else 0
        return float(expand + depthwise + project)


#: Fuse by default while the fused kernel's estimated work (recomputed rows, bands in rounds
#: over the cores) is at most this multiple of the three kernels'. In MobileNet-V2 on 2 cores,
#: blocks at 1.05-1.54x the work run 1.14-1.85x faster fused; the 7x7 blocks, whose bands are
#: single rows (1.89x and 2.25x the work), run 0.84-0.93x as fast.
MAX_WORK_RATIO = 1.6
#: The same bound for a block that ends at its depthwise conv, which saves one map's trip
#: through memory instead of two. In EfficientNet-B0 on 2 cores, its stem and depthwise conv
#: (1.11x the work) take 0.91x the two kernels' time, its 112x112 expand with a stride-2
#: depthwise conv (1.11x) 0.97x, and its two 56x56 blocks (1.35x and 1.48x) 1.29x.
MAX_SHORT_WORK_RATIO = 1.15


#: Fuse by default only while the convs do at most this many FLOPs per byte that fusion keeps
#: out of memory. The fused kernel runs its 1x1 stages on 3/4 of the registers, below the
#: unfused convs' rate: fusion pays where the expanded maps are wide against the convs'
#: work (an inverted residual's 6x expansion: 5-13 FLOP/B), not where a depthwise conv sits
#: between two convs of similar width, nor where the 1x1 convs are wide enough to run near
#: the peak unfused. On Zen 4 (2 threads) MobileNet-V1's blocks (25 and 49 FLOP/B, the stem's
#: 12.5 kept) took 0.93x the model's time unfused, MobileNet-V2's 14x14 blocks (21 and 28)
#: 0.98x, MobileViT-S's 64 -> 256 -> 64 blocks on 64x64 maps (17 and 18) 0.90x; none measured
#: faster fused above 13.
MAX_INTENSITY = 16.0


def work_ratio(geometry: BlockGeometry, rows: int, *, cores: int) -> float:
    """The fused kernel's work with bands of ``rows`` rows over ``cores``, over the unfused kernels'."""
    bands = geometry.n * geometry.oh // rows
    return -(-bands // cores) * cores * geometry.flops(rows) / geometry.unfused_flops


def stays_in_l2(geometry: BlockGeometry, rows: int, *, l2_bytes: int) -> bool:
    """Do a band's buffers and the three stages' weights fit one core's L2 cache together?

    Every band reads all the weights; where they do not stay in the L2 beside the band's maps,
    each band streams them from the next level. The unfused convs read them once per tile.
    MobileNet-V1's 14x14 blocks (1.5 and 3 MB of weights, a 1 MB L2) ran 0.54x and 0.72x the
    time unfused on Zen 4 (2 threads); every inverted-residual block fused in MobileNet-V2,
    MNASNet, MobileNet-V3 and EfficientNet-B0 there has at most 0.6 MB.
    """
    return geometry.weight_bytes + geometry.band_bytes(rows) <= l2_bytes


def band_rows(geometry: BlockGeometry, *, row_tile: int, cores: int, l2_bytes: int) -> int | None:
    """Output rows per parallel band: a multiple of the output layout's ``row_tile`` that
    divides the output height, leaves at least one band per core, and whose buffers fit
    half the L2 cache, with the least estimated time (FLOPs with recomputed rows, times the
    rounds of bands over ``cores``). None when no band qualifies."""
    best = None
    for rows in range(row_tile, geometry.oh + 1, row_tile):
        bands = geometry.n * geometry.oh // rows
        if geometry.oh % rows or bands < cores or geometry.band_bytes(rows) > l2_bytes // 2:
            continue
        rounds = -(-bands // cores)
        cost = rounds * geometry.flops(rows)
        if best is None or cost < best[0]:
            best = (cost, rows)
    return None if best is None else best[1]


@dataclass(frozen=True)
class BlockTiling:
    """The layout and loop parameters of the fused block kernel (analytic or tuned).

    Layout: the output's ``spatial`` tiles (rows, columns) and channel tile ``ot``, as the
    unfused project conv stores them, and ``mt``, the channel vector of the expanded and
    depthwise maps (and of the expand and depthwise weights). Loops: ``band_rows`` output
    rows per parallel task, and the register blocks (positions per block along a row) of
    the three stages. In a block that ends at its depthwise conv, that conv is the output
    stage: ``project_reg`` is its register block, ``dw_reg`` is 0 and ``ot`` is ``mt``.
    """

    spatial: tuple[int, int]
    ot: int
    mt: int
    band_rows: int
    expand_reg: int
    dw_reg: int
    project_reg: int

    def to_json(self) -> dict[str, Any]:
        return {"spatial": list(self.spatial), "ot": self.ot, "mt": self.mt, "band_rows": self.band_rows,
                "expand_reg": self.expand_reg, "dw_reg": self.dw_reg, "project_reg": self.project_reg}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> BlockTiling:
        try:
            return cls(spatial=tuple(int(s) for s in record["spatial"]), ot=int(record["ot"]), mt=int(record["mt"]),
                       band_rows=int(record["band_rows"]), expand_reg=int(record["expand_reg"]),
                       dw_reg=int(record["dw_reg"]), project_reg=int(record["project_reg"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a block tiling record: {record!r} ({err!r})") from None

    def check(self, geometry: BlockGeometry) -> None:
        """Raise ``ValueError`` naming the value if this tiling cannot lower ``geometry``."""
        g = geometry
        if len(self.spatial) != 2 or min(self.spatial) < 1 or g.oh % self.spatial[0] or g.ow % self.spatial[1]:
            raise ValueError(f"block tiling: spatial tiles {list(self.spatial)} must divide the {g.oh}x{g.ow} output")
        if self.band_rows < 1 or g.oh % self.band_rows or self.band_rows % self.spatial[0]:
            raise ValueError(f"block tiling: band_rows={self.band_rows} must divide the {g.oh} output rows and be "
                             f"a multiple of the row tile {self.spatial[0]}")
        if min(self.ot, self.mt) < 1:
            raise ValueError(f"block tiling: channel tiles ot={self.ot} and mt={self.mt} must be at least 1")
        stages = (("expand_reg", g.padded_w), ("dw_reg", g.ow), ("project_reg", self.spatial[1]))
        if not g.project:
            if self.dw_reg != 0 or self.ot != self.mt:
                raise ValueError(f"block tiling: a block that ends at its depthwise conv writes that map from its "
                                 f"channel vectors with project_reg's blocks: dw_reg must be 0 (got {self.dw_reg}) "
                                 f"and ot equal mt (got ot={self.ot}, mt={self.mt})")
            stages = (stages[0], stages[2])
        for name, extent in stages:
            if not 1 <= getattr(self, name) <= extent:
                raise ValueError(f"block tiling: {name}={getattr(self, name)} must be in [1, {extent}]")
        if self.spatial[0] == self.project_reg == self.ot == 1:
            raise ValueError("block tiling: a register block of one output value (row tile 1, project_reg=1, "
                             "ot=1) has no loop to vectorize")


#: Positions per register block of a stem's first conv (the expand stage of a block whose
#: first conv has a window: 27 taps per position on a 3-channel image). Against the
#: 3/4-of-the-registers rule's 19 positions, this bound (6 positions on a 112-wide map) makes
#: the stem block 0.82-0.98x the time in MobileNet-V2, MNASNet and EfficientNet-B0, the other
#: kernels unchanged.
STEM_EXPAND_POSITIONS = 8


#: Vector registers from which a block is fused by default (:func:`.conv.fuses_block`). The fused
#: kernel keeps three stages' register blocks in 3/4 of the registers (:func:`block_register_budget`);
#: with AVX2's 16 they are too small to pay for the recomputed rows. Built for AVX2 (on a
#: Cascade Lake guest, 2 threads), the unfused models take 0.79 (MobileNet-V2), 0.81 (MNASNet),
#: 0.88 (MobileNet-V3-L) and 0.97 (EfficientNet-B0) of the fused time; built for its AVX-512,
#: 0.98, 0.96, 0.97 and 0.86, where on Zen 4 fusion made MobileNet-V2 1.23x and MNASNet 1.09x
#: faster: with 32 registers the choice depends on the machine beyond this rule.
BLOCK_MIN_REGISTERS = 32


def block_register_budget(registers: int) -> int:
    """Vector registers a fused block's register blocks use by default: 3/4 of them, not the
    unfused conv's all-but-four, since the three stages keep more values live (28 of 32 make
    MobileNet-V2 2.5% and MNASNet 4.6% slower)."""
    return max(1, registers * 3 // 4)


def default_block_tiling(geometry: BlockGeometry, project_tiling: DefaultConvTiling, *,
                         target: HardwareTarget) -> BlockTiling:
    """The untuned build's tiling: the output stored as the unfused project conv's analytic
    ``project_tiling`` stores it, :func:`band_rows` bands, register blocks of 3/4 of the registers
    (a stem's expand stage: at most :data:`STEM_EXPAND_POSITIONS` positions). In a block that
    ends at its depthwise conv, ``project_tiling`` is that conv's, whose spatial tiles the
    output keeps, in the expanded map's channel vectors.

    Raises
    ------
    ValueError
        If ``project_tiling`` is two-level (the block stores one level) or no band of rows
        fits half the L2 cache: :func:`.conv.fuses_block` then does not fuse.
    """
    g = geometry
    if project_tiling.two_level:
        raise ValueError(f"a fused block stores its output in one level of tiles; the project conv's "
                         f"analytic tiling has two ({project_tiling})")
    lanes = target.vector_lanes("float32")
    budget = block_register_budget(target.vector_registers or 16)
    rows = band_rows(g, row_tile=project_tiling.spatial[0], cores=target.num_cores, l2_bytes=target.l2_bytes)
    if rows is None:
        raise ValueError(f"no band of output rows of {g} fits half the L2 cache ({target.l2_bytes} B)")
    # Padded only where the divisor fills at most a quarter of a vector (ShuffleNet's 58
    # channels: 2 lanes): padding guards every epilogue (MobileNet-V3's 200 channels: 1.4x
    # slower padded to 208 than in tiles of 8).
    mt = channel_tile(g.m, lanes, max_waste=0)
    mt_vectors = vector_registers(mt, lanes)
    expand_budget = budget if g.pointwise_expand else min(budget, STEM_EXPAND_POSITIONS)
    expand_reg = register_block(g.padded_w, max(1, expand_budget // mt_vectors))
    if not g.project:
        spatial = tuple(project_tiling.spatial)
        return BlockTiling(spatial=spatial, ot=mt, mt=mt, band_rows=rows, expand_reg=expand_reg, dw_reg=0,
                           project_reg=register_block(spatial[1], budget // (spatial[0] * mt_vectors)))
    return BlockTiling(spatial=tuple(project_tiling.spatial), ot=project_tiling.ot, mt=mt, band_rows=rows,
                       expand_reg=expand_reg, dw_reg=register_block(g.ow, budget // mt_vectors),
                       project_reg=project_tiling.reg)


def implement_block(anchor: relax.VarBinding, context: Any, *, tiling: BlockTiling, strategy: str) -> Any:
    """Lower the partition ``context.partition`` (a dense conv with a block tail) to one kernel
    with ``tiling`` (:func:`default_block_tiling` untuned). A tail that ends at the depthwise
    conv makes that conv the output stage: its map is written in ``tiling``'s output layout.

    Raises
    ------
    ValueError
        If ``tiling`` does not fit the block (:meth:`BlockTiling.check`).
    """
    geometry = BlockGeometry.of(anchor, context.partition.tail)
    tiling.check(geometry)
    depthwise, dw_epilogue, project, project_epilogue = split_block_tail(context.partition.tail)
    g = geometry
    top, left, bottom, right = g.pads
    hp, wp = g.h + top + bottom, g.w + left + right
    data = context.te_input(anchor.value.args[0], "data")
    expand_w = context.te_input(anchor.value.args[1], "expand_weight")
    dw_w = context.te_input(depthwise.value.args[1], "depthwise_weight")
    project_w = None if project is None else context.te_input(project.value.args[1], "project_weight")
    # The expand conv and its epilogue run over the depthwise conv's padded domain, at clamped
    # (always valid) positions of the expanded map; the last stage zeroes the border. So the
    # depthwise conv reads the expanded rows as they are written, with no pad stage between.
    expand_input, expand = _expand_te(data, expand_w, g)
    expand_stages = context.epilogue_te(expand)
    last = expand_stages[-1] if expand_stages else expand
    zero = tvm.tirx.const(0.0, "float32")
    padded = te.compute((g.n, g.m, hp, wp), lambda n, m, y, x: tvm.tirx.if_then_else(
        tvm.tirx.all(y >= top, y < top + g.h, x >= left, x < left + g.w), last(n, m, y, x), zero), name="expand_pad")
    dw = ops.conv(padded, dw_w, strides=g.stride, dilation=1, groups=g.m, name="depthwise")
    first = len(context.partition.epilogue)
    dw_stages = context.epilogue_te(dw, anchor=depthwise, epilogue=dw_epilogue, first=first)
    mt = tiling.mt
    layouts = TensorMap()
    if project is None:
        buffered, out = [(expand, [*expand_stages, padded])], (dw, dw_stages)
    else:
        pw = ops.conv(dw_stages[-1] if dw_stages else dw, project_w, strides=1, dilation=1, name="project")
        pw_stages = context.epilogue_te(pw, anchor=project, epilogue=project_epilogue,
                                        first=first + len(dw_epilogue))
        buffered, out = [(expand, [*expand_stages, padded]), (dw, dw_stages)], (pw, pw_stages)
        layouts[project_w] = conv_weight_tiled([g.o, g.m, 1, 1], out_tile=tiling.ot, in_tile=1)
    for conv, stages in buffered:
        shape = [int(s) for s in conv.shape]
        rows_of_vectors = conv_output_tiled(shape, spatial_tiles=[1, shape[3]], channel_tile=mt)
        layouts.update((t, rows_of_vectors) for t in [conv, *stages])
    output = conv_output_tiled([int(s) for s in out[0].shape], spatial_tiles=list(tiling.spatial),
                               channel_tile=tiling.ot)
    layouts.update((t, output) for t in [out[0], *out[1]])
    layouts[expand_w] = conv_weight_tiled([g.m, g.c, *g.expand_kernel], out_tile=mt, in_tile=1)
    layouts[dw_w] = conv_weight_tiled([g.m, 1, *g.kernel], out_tile=mt, in_tile=1)
    params = dict(band=tiling.band_rows // tiling.spatial[0], expand_reg=tiling.expand_reg, channel_vector=mt,
                  dw_reg=tiling.dw_reg, project_reg=tiling.project_reg,
                  lanes=context.target.vector_lanes("float32"))

    def schedule(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
        return schedule_block(func, expand_input=expand_input, pointwise=g.pointwise_expand,
                              expand=(expand, [*expand_stages, padded]),
                              depthwise=(dw, dw_stages) if project is not None else None, project=out, **params)

    return context.finish(output=out[1][-1] if out[1] else out[0], layouts=layouts, strategy=strategy,
                          schedule=schedule)


def _expand_te(data: te.Tensor, weight: te.Tensor, g: BlockGeometry) -> tuple[te.Tensor, te.Tensor]:
    """The expand conv over the depthwise conv's padded domain ``(n, m, hp, wp)``, and the
    stage it reads its input from.

    A 1x1 conv computes each position as the expanded map's nearest one (its input stage
    reads clamped positions, and is inlined). A larger conv (a stem) reads a zero-padded copy
    of its input, padded further by the rows and columns the depthwise padding adds, so every
    position reads valid input through affine indices: the schedule copies a band's input rows
    right before the band's expand rows read them. The border positions compute the conv of
    zeros there; the depthwise padding stage zeroes them either way.
    """
    top, left, bottom, right = g.pads
    hp, wp = g.h + top + bottom, g.w + left + right
    if g.pointwise_expand:
        clamped = te.compute((g.n, g.c, hp, wp), lambda n, c, y, x: data(
            n, c, te.max(te.min(y - top, g.h - 1), 0), te.max(te.min(x - left, g.w - 1), 0)), name="expand_input")
        return clamped, ops.conv(clamped, weight, strides=1, dilation=1, name="expand")
    (kh, kw), (sy, sx), (ih, iw) = g.expand_kernel, g.expand_stride, g.in_hw
    oy, ox = top * sy + g.expand_pads[0], left * sx + g.expand_pads[1]  # input (0, 0) in the copy
    zero = tvm.tirx.const(0.0, "float32")
    padded = te.compute((g.n, g.c, (hp - 1) * sy + kh, (wp - 1) * sx + kw), lambda n, c, y, x: tvm.tirx.if_then_else(
        tvm.tirx.all(y >= oy, y < oy + ih, x >= ox, x < ox + iw), data(n, c, y - oy, x - ox), zero),
        name="expand_input")
    return padded, ops.conv(padded, weight, strides=(sy, sx), dilation=1, name="expand")


def _registers(sch: tvm.s_tir.Schedule, block: Any, stages: list, *, at: Any, positions: Any, vector: Any,
               reduction: Any, lanes: int) -> Any:
    """Accumulate ``block`` in registers, written back (through ``stages``, its epilogue,
    inlined) once per register block at loop ``at``; returns the write-back block."""
    for stage in stages[:-1]:
        sch.compute_inline(sch.get_sblock(stage.op.name))
    write = sch.cache_write(block, 0, "local")
    if stages:
        sch.reverse_compute_inline(sch.get_sblock(stages[-1].op.name))
    sch.reverse_compute_at(write, at)
    vectorize_channels(sch, vector, lanes=lanes)
    sch.unroll(positions)
    sch.decompose_reduction(block, reduction)
    vectorize_channels(sch, sch.get_loops(write)[-1], lanes=lanes)
    return write


def schedule_block(func: tvm.tirx.PrimFunc, *, expand_input: te.Tensor, pointwise: bool, expand: tuple,
                   depthwise: tuple | None, project: tuple, band: int, expand_reg: int, dw_reg: int, project_reg: int,
                   channel_vector: int, lanes: int = 0) -> tvm.IRModule:
    """Loops (outer to inner)::

        parallel(n, bands)
          (a stem: its input rows, zero-padded)
          padded expanded rows . M/mt . Wp/reg . C . (Kh . Kw) . reg . mt  (+ epilogue per register block)
          depthwise rows . M/mt . OW/reg . Kh . Kw . reg . mt      (+ epilogue)
          band rows . OW/wt . O/ot . wt/reg . M/mt . ht . reg . mt . ot (+ epilogue)

    ``depthwise`` None: the block ends at the depthwise conv, which ``project`` then holds; its
    band rows run ``OW/wt . M/mt . wt/reg . Kh . Kw . ht . reg . mt`` from the expanded rows.
    ``lanes`` (the target's; 0: each channel tile as one vector) sets the pieces a channel tile
    is vectorized in (:func:`.vectors.vector_piece`).
    """
    sch = tvm.s_tir.Schedule(func)
    if pointwise:
        sch.compute_inline(sch.get_sblock(expand_input.op.name))
    # The output stage (the project conv, or the depthwise conv): the output layout's loops,
    # rows grouped into bands.
    pw, pw_stages = project
    block = sch.get_sblock(pw.op.name)
    n, ho, wo, oo, hi, wi, oi, rc, *window = sch.get_loops(block)
    bands, ho = sch.split(ho, [None, band])
    wio, wii = sch.split(wi, [None, project_reg])
    if depthwise is None:  # one input channel per group: the window is the reduction
        sch.reorder(n, bands, ho, wo, oo, wio, rc, *window, hi, wii, oi)
        reduction = rc
    else:
        reduction, rci = sch.split(rc, [None, channel_vector])  # the depthwise map's channel vectors
        sch.reorder(n, bands, ho, wo, oo, wio, reduction, *window, rci, hi, wii, oi)
    task = sch.fuse(n, bands)
    sch.parallel(task)
    sch.unroll(hi)
    _registers(sch, block, pw_stages, at=wio, positions=wii, vector=oi, reduction=reduction, lanes=lanes)
    # The depthwise conv and the expand conv: rows of channel vectors, per band.
    buffered = [(expand, expand_reg)] if depthwise is None else [(depthwise, dw_reg), (expand, expand_reg)]
    for (conv, stages), reg in buffered:
        for stage in stages[:-1]:
            sch.compute_inline(sch.get_sblock(stage.op.name))
        final = sch.cache_write(sch.get_sblock(conv.op.name), 0, "local")
        if stages:
            sch.reverse_compute_inline(sch.get_sblock(stages[-1].op.name))
        sch.compute_at(final, task, preserve_unit_loops=True)
        conv_block = sch.get_sblock(conv.op.name)
        sch.compute_at(conv_block, task, preserve_unit_loops=True)
        _, h, _, mo, _, w, mi, *reduce = sch.get_loops(conv_block)[1:]
        wo_, wi_ = sch.split(w, [None, reg])
        channels, window = reduce[0], reduce[1:]
        sch.reorder(h, mo, wo_, channels, *window, wi_, mi)
        vectorize_channels(sch, mi, lanes=lanes)
        sch.unroll(wi_)
        sch.decompose_reduction(conv_block, channels)
        sch.reverse_compute_at(final, wo_)
        vectorize_channels(sch, sch.get_loops(final)[-1], lanes=lanes)
    if not pointwise:  # a stem's zero-padded input rows, copied per band
        copy = sch.get_sblock(expand_input.op.name)
        sch.compute_at(copy, task, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(copy)[-1])
    return sch.mod
