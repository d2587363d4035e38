"""The parameters of the ALT conv template (ALT paper §5.1): layout tiles and loop knobs.

:class:`DefaultConvTiling` is what a tuning record of a conv stores (its JSON form) and
what the conv strategy lowers; :func:`default_conv_tiling` is the analytic, untuned choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from alt_tvm.strategies.base import tiles_for

from .vectors import vector_registers, whole_llvm_pieces

__all__ = ["DefaultConvTiling", "channel_tile", "channels_outermost", "default_conv_tiling", "is_depthwise",
           "reduction_block", "register_block"]


#: Vector registers left for the weights, the broadcast input and addresses: the rest
#: hold accumulators.
RESERVED_REGISTERS = 4

#: Taps (``kh x kw``) from which a depthwise conv's register block takes
#: :data:`WIDE_WINDOW_POSITIONS` output positions (:func:`default_conv_tiling`).
WIDE_WINDOW_TAPS = 25
WIDE_WINDOW_POSITIONS = 4


def is_depthwise(in_channels_per_group: int, out_channels_per_group: int) -> bool:
    """One input and one output channel per group: each output channel reads only its own."""
    return in_channels_per_group == out_channels_per_group == 1


def window_per_channel_tile(out_channels: int, in_channels_per_group: int, out_channels_per_group: int,
                            ot: int) -> bool:
    """Whether each output channel tile of ``ot`` channels reads the input channels of one group
    only, so the conv's padded input window can be copied per tile, holding no channel another
    tile needs: depthwise convs, and grouped convs whose tile lies within a group (RegNetY's
    groups of 8 in tiles of 8)."""
    if is_depthwise(in_channels_per_group, out_channels_per_group):
        return True
    return out_channels_per_group < out_channels and out_channels_per_group % ot == 0


@dataclass(frozen=True)
class DefaultConvTiling:
    """The layout and loop parameters of the conv template (analytic defaults or tuned).

    Layout: ``spatial`` output tiles and ``ot`` (output), ``it`` (input), ``weight_ot`` /
    ``weight_it`` (weight, ``o_t'`` / ``i_t'`` in the paper; 0 = same as ``ot`` / ``it``).
    Two-level layout (paper §5.1): ``outer_spatial`` / ``outer_ot`` group the tiles into
    blocks stored contiguously (empty / 0 = one level).
    Loops: ``reg`` register block along the last spatial dim, ``rc_split`` the inner
    channel block of the reduction (0 = ``it``), ``parallel_channels`` also runs channel
    tiles in parallel (None = when spatial tiles are few), ``unroll_window`` unrolls the
    kernel-window loops, ``window_outer`` orders the window loops before the channel
    blocks of the reduction, ``epilogue_in_block`` computes the fused epilogue right after
    each register block instead of after the whole channel tile (not with ``reduction_outer``,
    whose register blocks hold partial sums), ``reduction_outer`` runs the
    reduction's channel blocks outside the spatial tiles of each channel tile (parallel over
    channel tiles alone): a block of weights is then read from memory once and reused from L1
    by every row of the tile, and the partial sums stay in the output tile between blocks.
    ``prefetch`` (with ``reduction_outer``) prefetches the next block of weights to the L2
    while the spatial tiles use the current one. ``prefetch_input`` prefetches the input tile
    of the parallel loop's next task to the L2 while the current task computes
    (:func:`.prefetch.prefetch_next_tile`); it applies where the parallel loop runs spatial
    tiles (with channel tiles in it, the next task mostly reads the same input tile).
    """

    spatial: tuple[int, ...]
    ot: int
    it: int
    reg: int
    weight_ot: int = 0
    weight_it: int = 0
    rc_split: int = 0
    parallel_channels: bool | None = None
    outer_spatial: tuple[int, ...] = ()
    outer_ot: int = 0
    unroll_window: bool = False
    window_outer: bool = False
    epilogue_in_block: bool = False
    reduction_outer: bool = False
    prefetch: bool = False
    prefetch_input: bool = False

    def __post_init__(self) -> None:
        if self.outer_spatial and len(self.outer_spatial) != len(self.spatial):
            raise ValueError(f"outer_spatial {list(self.outer_spatial)} needs one tile per spatial dim "
                             f"({len(self.spatial)}: {list(self.spatial)})")
        if self.outer_spatial and self.outer_ot < 1:
            raise ValueError(f"a two-level tiling needs outer_ot >= 1, got {self.outer_ot}")
        if self.prefetch and not self.reduction_outer:
            raise ValueError("prefetch=True needs reduction_outer=True (the weight blocks it fetches ahead are "
                             "those of the reduction-outer loop order)")
        if self.prefetch_input and (self.reduction_outer or self.outer_spatial):
            raise ValueError(f"prefetch_input=True needs the one-level template (outer_spatial "
                             f"{list(self.outer_spatial)}) and reduction_outer=False ({self.reduction_outer}): it "
                             f"fetches one stored input tile per parallel task of spatial tiles")
        if any(t < 1 for t in (*self.spatial, *self.outer_spatial, self.ot, self.it, self.reg)):
            raise ValueError(f"tiles must be positive: spatial={list(self.spatial)} ot={self.ot} it={self.it} "
                             f"reg={self.reg} outer_spatial={list(self.outer_spatial)}")

    @property
    def two_level(self) -> bool:
        return bool(self.outer_spatial)

    def to_json(self) -> dict[str, Any]:
        record = {"spatial": list(self.spatial), "ot": self.ot, "it": self.it, "reg": self.reg,
                  "weight_ot": self.weight_ot, "weight_it": self.weight_it, "rc_split": self.rc_split,
                  "parallel_channels": self.parallel_channels, "unroll_window": self.unroll_window,
                  "window_outer": self.window_outer, "epilogue_in_block": self.epilogue_in_block,
                  "reduction_outer": self.reduction_outer, "prefetch": self.prefetch,
                  "prefetch_input": self.prefetch_input}
        if self.two_level:
            record.update(outer_spatial=list(self.outer_spatial), outer_ot=self.outer_ot)
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> DefaultConvTiling:
        try:
            return cls(spatial=tuple(int(s) for s in record["spatial"]), ot=int(record["ot"]), it=int(record["it"]),
                       reg=int(record["reg"]), weight_ot=int(record.get("weight_ot", 0)),
                       weight_it=int(record.get("weight_it", 0)), rc_split=int(record.get("rc_split", 0)),
                       parallel_channels=record.get("parallel_channels"),
                       outer_spatial=tuple(int(s) for s in record.get("outer_spatial", ())),
                       outer_ot=int(record.get("outer_ot", 0)),
                       unroll_window=bool(record.get("unroll_window", False)),
                       window_outer=bool(record.get("window_outer", False)),
                       epilogue_in_block=bool(record.get("epilogue_in_block", False)),
                       reduction_outer=bool(record.get("reduction_outer", False)),
                       prefetch=bool(record.get("prefetch", False)),
                       # Records written before the knob existed ran without it.
                       prefetch_input=bool(record.get("prefetch_input", False)))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a conv tiling record: {record!r} ({err})") from None


def default_conv_tiling(out_shape, in_channels_per_group: int, out_channels_per_group: int, *,
                        lanes: int, registers: int, in_channels: int | None = None,
                        l1_bytes: int = 0, l2_bytes: int = 0, weight_bytes: int = 0, input_bytes: int = 0,
                        half_vectors_full_rate: bool = False, fma_chains: int = 8) -> DefaultConvTiling:
    """Tiles that divide the extents (so layouts propagate), sized to the vector registers and L1.

    Channel tiles are :func:`channel_tile`'s, padding up to :data:`CHANNEL_MAX_WASTE` of the
    channels where half vectors issue at the full rate of lanes (``half_vectors_full_rate``,
    Zen 4) and up to :data:`HALF_RATE_MAX_WASTE` elsewhere.

    ``ot`` is one vector of output channels (within a group, so grouped reads stay
    contiguous); the innermost spatial tile is up to 32 wide, outer ones up to 4 (2-D)
    or 1 (3-D); the register block keeps ``outer tiles x reg`` accumulators of ``ot``
    lanes in all but :data:`RESERVED_REGISTERS` of the register file. A depthwise conv's block
    holds ``fma_chains`` accumulators (the machine's FMA latency x pipes): each output channel
    reads only its own input channel, so more accumulators reuse nothing and only add register
    pressure (the 28 of a dense conv's block make MNASNet's and EfficientNet-B0's depthwise
    convs slower than 8). One with at least :data:`WIDE_WINDOW_TAPS` taps (5x5, 7x7) does 25-49
    FMAs per output, and the positions of a block share each weight vector it loads: its block
    takes at least :data:`WIDE_WINDOW_POSITIONS` positions where the registers allow. Alone on
    Zen 4 (``fma_chains`` 6, so 1 position of two rows and two vectors), 4 positions took
    ConvNeXt-T's 7x7 convs 0.63-0.80x the time and EfficientNet-B0's 5x5 ones 0.92-0.97x;
    3x3 ones (MobileNet-V2, FastViT-T8) 1.00-1.07x, hence the bound. An output tile of one channel
    vector must fit a quarter of the L1 data cache (``l1_bytes``; 0: no limit), leaving
    the rest to the input window and the weights it is reused with.

    Weights larger than half the L2 cache (``weight_bytes``, ``l2_bytes``; 0: unknown) set
    ``parallel_channels`` where :func:`channels_outermost` says so: the parallel loop then runs
    channel tiles outermost, so each channel tile's weights are read from memory once rather
    than once per spatial tile (ResNet-18's 512-channel 3x3 convs, 9.4 MB of weights on a 7x7
    map: 1.9x faster), and the input once per channel tile instead.
    The reduction-outer loop order (``reduction_outer``, ``prefetch``) is mostly left to the
    tuner: with the per-task tiles on the stack and the epilogue in the register block, the
    one-level order is faster for most convs (3-22% inside ResNet-18/50, MobileNet-V2, MNASNet
    and DenseNet-121). It is the default only where :func:`reads_weight_blocks_from_l1` holds.
    """

    spatial = list(out_shape[2:])
    # With one output channel per group (depthwise), input channel o reads channel o:
    # a vector may span groups. Otherwise stay inside a group so reads stay contiguous.
    waste = CHANNEL_MAX_WASTE if half_vectors_full_rate else HALF_RATE_MAX_WASTE
    ot = channel_tile(out_shape[1] if out_channels_per_group == 1 else out_channels_per_group, lanes, max_waste=waste)
    it = channel_tile(in_channels_per_group if in_channels_per_group > 1 else (in_channels or 1), lanes,
                      max_waste=waste)
    budget = max(1, registers - RESERVED_REGISTERS)  # accumulators that fit the register file
    # The spatial tiles depend on the spatial extents only (not on the channel tile), so
    # a producer and a 1x1 consumer of the same map agree and no conversion is needed.
    # Leading spatial dims: tile rows of 1..4 (1 for 3-D, so the block stays 2-D).
    lead_cap = 4 if len(spatial) == 2 else 1
    best = None
    for lead in _divisors_upto(spatial[0], lead_cap) if len(spatial) > 1 else [1]:
        for wt in _divisors_upto(spatial[-1], 32):
            if l1_bytes and lead * wt * lanes * 4 > l1_bytes // 4 and wt > 1:
                continue
            for reg in _divisors_upto(wt, budget // lead):
                # Most accumulators first, then two-row tiles, then wider tiles (fewer
                # tile switches). Two rows of 7 positions x 2 vectors (28 accumulators)
                # ran ResNet's 3x3 convs 5-28% faster than four rows of 2.
                score = (lead * reg, -abs(lead - 2), wt)
                if best is None or score > best[0]:
                    best = (score, lead, wt)
    _, lead, wt = best
    vectors = vector_registers(ot, lanes)
    tiles = ([lead] + [1] * (len(spatial) - 2) + [wt]) if len(spatial) > 1 else [wt]
    streams = streams_from_memory(weight_bytes, l2_bytes)
    # Every conv applies its epilogue to each register block while it is in registers: for a
    # depthwise conv, with a few FLOPs per output, a second pass over the output tile costs as
    # much as the conv, and a dense conv saves a pass over memory (3-6% in the model). A
    # depthwise conv keeps its map's tiles and takes fewer accumulators.
    depthwise = is_depthwise(in_channels_per_group, out_channels_per_group)
    accumulators = min(budget, fma_chains) if depthwise else budget
    positions = accumulators // (lead * vectors)
    taps = weight_bytes // (4 * out_shape[1] * in_channels_per_group) if weight_bytes else 0
    if depthwise and taps >= WIDE_WINDOW_TAPS:
        positions = max(positions, min(WIDE_WINDOW_POSITIONS, budget // (lead * vectors)))
    outer = streams and not depthwise and reads_weight_blocks_from_l1(
        in_channels_per_group=in_channels_per_group, window=taps, ot=ot, it=it, l1_bytes=l1_bytes, l2_bytes=l2_bytes)
    spatial_tiles = out_shape[0] * math.prod(-(-extent // tile) for extent, tile in zip(spatial, tiles))
    channels_outer = streams and channels_outermost(weight_bytes=weight_bytes, spatial_tiles=spatial_tiles,
                                                    input_bytes=input_bytes, channel_tiles=-(-out_shape[1] // ot))
    # A dense conv's input tile of the next task is fetched while this one computes: inside a
    # model it comes from the L3 or memory, in an order (channel blocks of a few positions)
    # the hardware prefetchers do not follow. A depthwise conv, or a grouped one whose channel
    # tile lies within a group, reads its input through a per-tile window copy instead, which
    # holds only that tile's channels. With channel tiles in the parallel loop, the next task
    # mostly reads the same input tile; with spatial tiles there, it reads a new one even where
    # the weights stream (SegFormer-B0's 1024 -> 256 fuse conv on a 64x64 map: 0.91x the time alone).
    per_tile_window = window_per_channel_tile(out_shape[1], in_channels_per_group, out_channels_per_group, ot)
    prefetch_input = not per_tile_window and not channels_outer and not outer
    return DefaultConvTiling(tuple(tiles), ot, it, register_block(wt, positions),
                             epilogue_in_block=not outer, parallel_channels=True if channels_outer else None,
                             reduction_outer=outer, prefetch=outer, prefetch_input=prefetch_input)


def reads_weight_blocks_from_l1(*, in_channels_per_group: int, window: int, ot: int, it: int,
                                l1_bytes: int, l2_bytes: int) -> bool:
    """Whether a dense conv whose weights stream from memory runs its reduction's channel
    blocks outermost (``reduction_outer`` with ``prefetch``) by default.

    In the one-level order each register block reads the channel tile's whole slab of weights
    (every input channel and tap of ``ot`` outputs). Over half the L2 it does not stay there
    beside the input, so every register block fetches it again from the L3 or memory. The
    reduction-outer order reads one block (``it`` input channels) once and reuses it from the
    L1 for every row of the tile: that pays where the block fits the L1 with a quarter left
    for the input rows and the partial sums. ResNet's 512-channel 3x3 convs on 7x7 maps
    (590 KiB slabs, 36 KiB blocks) run 1.27-1.38x faster that way with a 48 KiB L1; in a
    32 KiB L1 the block does not fit and the one-level order stays. ``window``: taps per
    channel; 0 in ``l1_bytes`` or ``l2_bytes`` (unknown): False.
    """
    block = reduction_block(in_channels_per_group, it)
    if not (l1_bytes and l2_bytes) or not 1 < block < in_channels_per_group:
        return False  # no split reduction to run outermost
    slab = 4 * in_channels_per_group * window * ot
    return slab > l2_bytes // 2 and 4 * block * window * ot <= l1_bytes - l1_bytes // 4


def channels_outermost(*, weight_bytes: int, spatial_tiles: int, input_bytes: int, channel_tiles: int) -> bool:
    """Whether a conv whose weights stream from memory runs its channel tiles outermost: where
    reading the weights once per spatial tile would move more bytes than reading the input
    once per channel tile. On a large map the input is the bigger stream: SegFormer-B0's
    decoder fuses 1024 channels into 256 on a 64x64 map (1 MiB of weights in 64 spatial tiles,
    16 MiB of input in 8 channel tiles) and runs 1.6x faster with spatial tiles outermost.
    ``input_bytes`` 0 (unknown): channel tiles outermost."""
    return not input_bytes or weight_bytes * spatial_tiles >= input_bytes * channel_tiles


def streams_from_memory(weight_bytes: int, l2_bytes: int) -> bool:
    """Whether a weight read in full once per tile of the other operand comes from memory
    each time: more than half the L2 (the rest holds the activations). The conv and GEMM
    templates then loop over weight tiles outermost. False when ``l2_bytes`` is unknown (0)."""
    return bool(l2_bytes) and weight_bytes > l2_bytes // 2


def register_block(extent: int, cap: int) -> int:
    """Output positions per register block along a tile of ``extent``, at most ``cap``.

    A divisor of ``extent`` when one keeps at least half the ``cap`` accumulators busy
    (SqueezeNet's 27-wide maps: 9; a ragged 14 + 13 ran 2x slower while the partial block's
    guards sat in every reduction step, and 1.01x the time since
    :func:`alt_tvm.lowering.peel_partial_blocks` runs the full blocks without them). Otherwise
    (7- and 14-wide maps: a divisor would leave 1-2 accumulators, too few to hide the FMA
    latency) the fewest blocks of at most ``cap``, as even as possible; the last one is
    partial.
    """
    cap = max(1, min(cap, extent))
    divisor = max(_divisors_upto(extent, cap))
    if 2 * divisor >= cap:
        return divisor
    blocks = -(-extent // cap)
    return -(-extent // blocks)


#: Layers with at least this many channels (a multiple of two vectors) get two-vector channel tiles.
WIDE_CHANNELS = 64

#: Most channels :func:`channel_tile` pads by default, as a share of them, rather than keep a
#: tile of half vectors, where those issue at the full rate of lanes (Zen 4).
CHANNEL_MAX_WASTE = 1 / 12

#: The same where a half vector takes a whole vector's issue slot: five 8-lane pieces of a
#: 40-channel tile cost what five 16-lane vectors do, so padding pays more often: 40 -> 48 and
#: 72 -> 80 channels make MobileNet-V3-Large's and EfficientNet-B0's 1x1 convs to them
#: 1.10-1.19x faster.
HALF_RATE_MAX_WASTE = 1 / 4


def channel_tile(channels: int, lanes: int, *, max_waste: float = CHANNEL_MAX_WASTE) -> int:
    """The channel tile for ``channels``: one vector, two for wide layers.

    A function of the channel count alone, so a producer's output tile equals its
    consumer's input tile and 1x1 convolutions read their input without conversion.
    Two vectors per accumulator row keep the register block full on small maps.

    A count that whole vectors do not divide is padded (the layout ``pad`` primitive,
    ALT paper §4.1) to whole vectors when that uses more of each vector than the largest
    divisor up to a vector would (ShuffleNet's 58 channels: 58 of 64 lanes used, against 2
    of 16; SqueezeNet's 1000: 1000 of 1024 against 10 of 16). The padded tile is two vectors
    when that wastes at most 1/16 of the channels or no more than one vector does.

    A divisor that fills more than a quarter of a vector is kept when padding would add more
    than ``max_waste`` of the channels (half-vector tiles cost less than that much more
    work: MobileNet-V3 and MNASNet run 2.7% slower with 40 -> 48 and 72 -> 80). A fused
    kernel's internal channels pass 0: padding them guards every epilogue.

    LLVM compiles a vector of a width that is not a power of two as one instruction per
    power-of-two piece (12 lanes: 8 + 4; 15: 8 + 4 + 2 + 1). A divisor with a piece under a
    quarter vector is replaced by a half vector where that divides the channels, and the
    rules above then choose between it and padding: 40 channels in 8-lane tiles instead of
    10, 120 padded to 128 instead of 15-lane tiles (MobileNet-V3-Large's 120-channel 1x1
    convs 2.4x faster, its 40-channel ones 15%). Divisors of whole pieces (12 lanes) stay: 24
    channels in 8-lane tiles make ShuffleNet-V2's stem pool slower.

    A divisor under a vector gives way to an odd multiple of half a vector that divides the
    channels (:func:`_odd_pieces`): 24 and 72 channels in 24-lane tiles, 40 in 40-lane tiles,
    vectorized as three or five half vectors (:func:`.vectors.vector_piece`).
    """
    if channels >= WIDE_CHANNELS and channels % (2 * lanes) == 0:
        return 2 * lanes
    divisor = tiles_for(channels, lanes)
    half = lanes // 2
    if divisor > half and channels % half == 0 and not whole_llvm_pieces(divisor, lanes):
        divisor = half  # 40 channels: 8-lane tiles, not 10 (8 + 2 lanes, the 2 nearly scalar)
    one, two = _ceil_to(channels, lanes), _ceil_to(channels, 2 * lanes)
    if channels * lanes <= divisor * one:  # the divisor uses the vectors as well
        return _odd_pieces(channels, divisor, lanes)
    if 4 * divisor > lanes and one - channels > max_waste * channels:
        return _odd_pieces(channels, divisor, lanes)
    return 2 * lanes if two == one or 16 * (two - channels) <= channels else lanes


#: Most half vectors in one channel tile: a register block holds a register per piece and
#: position, so five leave five positions of 28 accumulators.
MAX_TILE_PIECES = 5


def _odd_pieces(channels: int, divisor: int, lanes: int) -> int:
    """``divisor`` (a channel tile under a vector), or the largest odd multiple of half a
    vector, up to :data:`MAX_TILE_PIECES` halves, that divides ``channels`` and is wider.

    A 12-lane tile (of 16) is an 8- and a 4-lane FMA for 12 lanes, and an 8-lane tile one FMA
    per input broadcast; in tiles of three or five 8-lane pieces, which issue at the full rate
    of lanes on Zen 4, each broadcast feeds three or five (the 1x1 convs of EfficientNet-B0,
    MobileNet-V3-Large and ShuffleNet-V2 to 24, 40 and 72 channels take 0.72-0.94x the time).
    """
    half = lanes // 2
    if divisor >= lanes or half < 2:
        return divisor
    for pieces in range(MAX_TILE_PIECES, 2, -1):
        if pieces % 2 and pieces * half > divisor and channels % (pieces * half) == 0:
            return pieces * half
    return divisor


def reduction_block(extent: int, tile: int) -> int:
    """The inner block of a reduction over ``extent`` channels stored in tiles of ``tile``
    (padded when ``tile`` does not divide ``extent``): the largest size that divides both,
    so a block never straddles two stored tiles or reaches into the padding."""
    return math.gcd(extent, tile)


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _divisors_upto(extent: int, cap: int) -> list[int]:
    return [d for d in range(1, max(1, min(extent, cap)) + 1) if extent % d == 0]
