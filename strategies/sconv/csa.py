"""SConv's Convolution Slicing Analysis (CSA): tile sizes, cache distribution, IS vs WS.

Pure Python, no TVM. Follows Ferrari et al., "Advancing Direct Convolution using
Convolution Slicing Optimization and ISA Extensions" (Ferrari et al.), §4.1 and §5:

* the micro-kernel fixes ``N_win`` (windows per input tile, along vector lanes) and ``N_f``
  (filters per filter tile, one accumulator vector each) from the target's vector registers
  (:func:`micro_kernel_for`);
* ``N_c`` is the largest channel count, found by halving from ``IN_c``, with
  ``|IN^T| + |FS^T| + |OUT^T| <= alpha * L1`` (eqs. 1-2);
* ``K2`` and ``K3`` — tiles kept in L2 and L3 — by halving from the tile counts until
  eqs. (4)-(5) hold, for Input-Stationary (IS) and, with the roles of input and filter
  tiles swapped, Weight-Stationary (WS);
* the cost model (6)-(14) picks the schedule with fewer cycles spent loading tiles.

Ratios such as ``#FS^T / K2`` are counts of tile *sets*, so they are rounded up (the paper
writes plain divisions, which agree whenever the sizes divide). A cache level of size 0
(absent) satisfies no inequality, so its ``K`` falls to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from alt_tvm.target import HardwareTarget

__all__ = [
    "CSAParams",
    "PAPER_AVX512",
    "conv_cycles",
    "micro_kernel_for_conv",
    "ConvShape",
    "MicroKernel",
    "ScheduleCost",
    "TilingPlan",
    "analyze",
    "fit_filters",
    "micro_kernel_for",
    "schedule_cost",
]

Schedule = Literal["IS", "WS"]


@dataclass(frozen=True)
class ConvShape:
    """One 2-D convolution, NCHW / OIHW (batch ``n``; the analysis is per image).

    Padding is ``(top, left, bottom, right)`` as in Relax; use :meth:`symmetric` for the
    common case.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride_h: int = 1
    stride_w: int = 1
    pad_top: int = 0
    pad_left: int = 0
    pad_bottom: int = 0
    pad_right: int = 0

    def __post_init__(self) -> None:
        for name in ("n", "c", "h", "w", "k", "r", "s", "stride_h", "stride_w"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ConvShape.{name} must be a positive int, got {value!r}")
        for name in ("pad_top", "pad_left", "pad_bottom", "pad_right"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ConvShape.{name} must be a non-negative int, got {value!r}")
        if self.h + self.pad_top + self.pad_bottom < self.r or self.w + self.pad_left + self.pad_right < self.s:
            raise ValueError(f"filter {self.r}x{self.s} is larger than the padded input "
                             f"{self.h + self.pad_top + self.pad_bottom}x{self.w + self.pad_left + self.pad_right}")

    @classmethod
    def symmetric(cls, *, n: int, c: int, h: int, w: int, k: int, r: int, s: int, stride: int = 1,
                  pad: int = 0) -> ConvShape:
        """Same stride in both dims and the same padding on every side."""
        return cls(n, c, h, w, k, r, s, stride, stride, pad, pad, pad, pad)

    @property
    def out_h(self) -> int:
        return (self.h + self.pad_top + self.pad_bottom - self.r) // self.stride_h + 1

    @property
    def out_w(self) -> int:
        return (self.w + self.pad_left + self.pad_right - self.s) // self.stride_w + 1

    @property
    def flops(self) -> int:
        return 2 * self.n * self.k * self.out_h * self.out_w * self.c * self.r * self.s

    @property
    def phase_row(self) -> int:
        """``Wq``: row length of a phase of the padded input (see ``sconv_geometry``)."""
        return -(-(self.w + self.pad_left + self.pad_right) // self.stride_w)

    @property
    def phase_windows(self) -> int:
        """Windows computed over the flat phase image: ``q = oh * Wq + ow`` up to the last
        valid output (the ``Wq - OUT_w`` extra columns of each row included)."""
        return (self.out_h - 1) * self.phase_row + self.out_w

    @property
    def pointwise(self) -> bool:
        """1x1, unit stride, no padding: a plain GEMM (the paper's §7.5 case)."""
        return (self.r, self.s, self.stride_h, self.stride_w) == (1, 1, 1, 1) and \
            not (self.pad_top or self.pad_left or self.pad_bottom or self.pad_right)


@dataclass(frozen=True)
class MicroKernel:
    """Outer-product micro-kernel: ``n_f`` filters x ``n_win`` windows of accumulators.

    ``window_vectors`` vectors of ``lanes`` windows each; ``n_f * window_vectors``
    accumulator registers.
    """

    n_win: int
    n_f: int
    lanes: int
    window_vectors: int
    registers: int


@dataclass(frozen=True)
class CSAParams:
    """Knobs of the analysis.

    Attributes
    ----------
    alpha, beta, gamma
        Share of L1, L2, L3 available to tiles (eqs. 2, 4, 5); the paper uses 0.9.
    dtype_bytes
        ``DT``: 4 for float32.
    cost_l2, cost_l3, cost_dram
        Cycles per cache-line load from L2, L3 and main memory (eq. 6). Typical of recent
        x86 server parts; only their ratios matter for the IS/WS choice.
    pointwise_one_set
        Reduce a unit-stride pointwise convolution over all its channels in one set instead
        of the largest ``N_c`` of eq. (2). Its micro-kernel then writes finished outputs
        through the epilogue straight into the output, where several sets would add partial
        sums into an accumulator that a final pass copies out. One set is 0-18% faster on the
        20 multi-set pointwise layers of the SConv benchmark on x86, never slower beyond
        noise (docs/sconv.md). Such a plan is always IS.
    """

    alpha: float = 0.9
    beta: float = 0.9
    gamma: float = 0.9
    dtype_bytes: int = 4
    cost_l2: float = 14.0
    cost_l3: float = 50.0
    cost_dram: float = 200.0
    pointwise_one_set: bool = True

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"CSAParams.{name} must be in (0, 1], got {value!r}")
        if self.dtype_bytes < 1:
            raise ValueError(f"CSAParams.dtype_bytes must be >= 1, got {self.dtype_bytes!r}")
        for name in ("cost_l2", "cost_l3", "cost_dram"):
            if getattr(self, name) < 0:
                raise ValueError(f"CSAParams.{name} must be >= 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ScheduleCost:
    """Eqs. (6)-(14) for one schedule: line loads per level and the total in cycles."""

    schedule: Schedule
    k2: int
    k3: int
    n_dram1: float
    n_dram2: float
    n_l3: float
    n_l2: float
    total: float


@dataclass(frozen=True)
class TilingPlan:
    """CSA's result for one convolution.

    Attributes
    ----------
    micro : MicroKernel
        ``n_win``, ``n_f`` come from here.
    n_c, channel_sets
        Channels per tile, and ``ceil(IN_c / n_c)`` channel sets (layer 5).
    in_tiles, fs_tiles
        ``#IN^T = ceil(OUT_h * OUT_w / N_win)`` and ``#FS^T = ceil(OUT_c / N_f)`` (eq. 3).
    in_tile_bytes, fs_tile_bytes, out_tile_bytes
        Eq. (1).
    schedule, k2, k3
        The chosen schedule and its L2/L3 tile counts. In IS, ``k2`` counts filter tiles
        and ``k3`` input tiles; in WS the other way round.
    costs
        Both schedules' costs (eq. 6), IS first.
    edge_channels, edge_windows, edge_filters
        Sizes of the last, smaller channel set / input tile / filter tile (equal to the
        full size when the extents divide).
    """

    shape: ConvShape
    micro: MicroKernel
    params: CSAParams
    n_c: int
    channel_sets: int
    in_tiles: int
    fs_tiles: int
    in_tile_bytes: int
    fs_tile_bytes: int
    out_tile_bytes: int
    schedule: Schedule
    k2: int
    k3: int
    costs: tuple[ScheduleCost, ScheduleCost] = field(repr=False)
    edge_channels: int
    edge_windows: int
    edge_filters: int

    @property
    def n_win(self) -> int:
        return self.micro.n_win

    @property
    def n_f(self) -> int:
        return self.micro.n_f

    def summary(self) -> str:
        """One line, for logs and benchmark tables."""
        return (f"{self.schedule} Nwin={self.n_win} Nf={self.n_f} Nc={self.n_c} sets={self.channel_sets} "
                f"#IN={self.in_tiles} #FS={self.fs_tiles} K2={self.k2} K3={self.k3}")


def _broadcast_cost(target: HardwareTarget) -> float:
    """Loads spent per broadcast filter value in the micro-kernel.

    NEON multiplies by a lane of a loaded vector (one load serves ``lanes`` filters).
    Everywhere else a filter value costs one load: AVX-512's broadcast memory operand
    (``{1to16}``) saves the register and the instruction, not the load-port slot, and AVX2
    and RVV broadcast or load one scalar per filter.
    """
    triple = str(target.tvm_target.get("mtriple", ""))
    if str(target.tvm_target.get("kind", "llvm")) == "llvm" and triple.startswith(("aarch64", "arm")):
        return 1.0 / target.vector_lanes("float32")
    return 1.0


# The paper's AVX-512 micro-kernel (§5.2, OpenBLAS's): 16 windows x 24 filters.
PAPER_AVX512 = MicroKernel(n_win=16, n_f=24, lanes=16, window_vectors=1, registers=32)


def micro_kernel_for(target: HardwareTarget, *, dtype_bytes: int = 4, accumulator_share: float = 0.75,
                     fma_ports: int = 2, load_ports: int = 2) -> MicroKernel:
    """Size the outer-product micro-kernel for ``target``'s vector register file.

    Accumulators ``n_f x window_vectors`` may take ``accumulator_share`` of the registers
    (the rest hold the window vectors, broadcasts and addresses). Among shapes with the
    most accumulators, the one with the fewest cycles per rank-1 update wins — FMAs over
    ``fma_ports`` or loads (``window_vectors + n_f x broadcast cost``) over ``load_ports``,
    whichever binds — then the fewest window vectors (fewer wasted windows at edges).

    On AVX-512 this gives 32 windows x 12 filters, not the paper's 16 x 24
    (:data:`PAPER_AVX512`): 16 x 24 needs 25 loads per 24 FMAs, more than two load ports
    issue while two FMA ports retire 24 FMAs, so it is load-bound: about 25% slower on
    AVX-512 (docs/sconv.md).

    Raises
    ------
    ValueError
        If the target has no vector registers (a GPU), ``accumulator_share`` is not in
        (0, 1) or a port count is < 1.
    """
    if target.vector_registers < 4:
        raise ValueError(f"target {target.name!r} has {target.vector_registers} vector registers; "
                         "SConv's micro-kernel needs a SIMD CPU")
    if not 0.0 < accumulator_share < 1.0:
        raise ValueError(f"accumulator_share must be in (0, 1), got {accumulator_share!r}")
    if fma_ports < 1 or load_ports < 1:
        raise ValueError(f"fma_ports and load_ports must be >= 1, got {fma_ports}, {load_ports}")
    lanes = max(1, target.vector_bits // (8 * dtype_bytes))
    regs = target.vector_registers
    budget = int(regs * accumulator_share)
    best = None
    for vecs in range(1, budget + 1):
        micro = _largest_kernel(vecs, lanes, regs, budget)
        if micro is None:
            continue
        key = (-(vecs * micro.n_f), _update_cycles(micro, target, fma_ports, load_ports), vecs)
        if best is None or key < best[0]:
            best = (key, micro)
    return best[1]


def _largest_kernel(vecs: int, lanes: int, registers: int, budget: int) -> MicroKernel | None:
    """The micro-kernel of ``vecs`` window vectors with the most filters whose accumulators fit
    ``budget`` registers, leaving room for the window vectors and one spare (None: none fits)."""
    n_f = min(budget // vecs, (registers - vecs - 1) // vecs)
    return MicroKernel(vecs * lanes, n_f, lanes, vecs, registers) if n_f >= 1 else None


def _update_cycles(micro: MicroKernel, target: HardwareTarget, fma_ports: int, load_ports: int) -> float:
    """Cycles per rank-1 update: FMAs over ``fma_ports`` or loads over ``load_ports``."""
    vecs, n_f = micro.window_vectors, micro.n_f
    return max(vecs * n_f / fma_ports, (vecs + n_f * _broadcast_cost(target)) / load_ports)


def conv_cycles(shape: ConvShape, micro: MicroKernel, target: HardwareTarget, *, fma_ports: int = 2,
                load_ports: int = 2) -> float:
    """Modelled micro-kernel cycles for the whole convolution, edge tiles computed in full.

    ``ceil(windows / N_win) x ceil(K / N_f)`` micro-kernel calls of ``C x R x S`` rank-1
    updates each, where ``windows`` counts the positions the flat phase image computes
    (``(OUT_h - 1) x Wq + OUT_w``).
    """
    calls = _sets(shape.phase_windows, micro.n_win) * _sets(shape.k, micro.n_f)
    return calls * shape.c * shape.r * shape.s * _update_cycles(micro, target, fma_ports, load_ports)


def micro_kernel_for_conv(shape: ConvShape, target: HardwareTarget, *, dtype_bytes: int = 4,
                          accumulator_share: float = 0.75, fit: bool = True, margin: float = 0.02) -> MicroKernel:
    """The micro-kernel for one convolution: :func:`micro_kernel_for`, unless a narrower one
    wastes enough less work on edge tiles.

    Candidates are the largest kernel of each window-vector count (filters fitted to ``K``
    by :func:`fit_filters` when ``fit``); one replaces the target's kernel only if
    :func:`conv_cycles` models it at least ``margin`` faster, since the model ignores
    packing and memory. Small images gain: a 7x7 output with 5x5 filters and padding 2
    computes 73 windows, as 3 tiles of 32 or 5 tiles of 16 (1.23x faster with 16); 13x13
    pointwise maps (169 windows: 192 or 176 computed) 1.02-1.10x. On AVX-512 every 1x1 layer
    modelled >= 2.5% cheaper with 16 windows runs faster, and those modelled 1.4% cheaper or
    less go either way (docs/sconv.md), hence 2%.

    Raises
    ------
    ValueError
        If ``margin`` is not in [0, 1), or as :func:`micro_kernel_for`.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin!r}")
    base = micro_kernel_for(target, dtype_bytes=dtype_bytes, accumulator_share=accumulator_share)
    best = fit_filters(base, shape.k) if fit else base
    best_cycles = conv_cycles(shape, best, target)
    budget = int(base.registers * accumulator_share)
    for vecs in range(1, base.window_vectors):
        cand = _largest_kernel(vecs, base.lanes, base.registers, budget)
        if cand is None:
            continue
        cand = fit_filters(cand, shape.k) if fit else cand
        cycles = conv_cycles(shape, cand, target)
        if cycles < (1.0 - margin) * best_cycles:
            best, best_cycles = cand, cycles
    return best


def fit_filters(micro: MicroKernel, out_channels: int, *, min_share: float = 2 / 3) -> MicroKernel:
    """Narrow ``n_f`` so that ``OUT_c`` splits into whole filter tiles with little padding.

    The paper computes a smaller edge tile when ``N_f`` does not divide ``OUT_c``; our
    kernel computes every tile at full size over zero filters, so instead the micro-kernel
    takes the ``n_f`` in ``[min_share * N_f, N_f]`` that pads ``OUT_c`` least (the largest
    on ties): e.g. 64 channels become 8 tiles of 8, not 6 tiles of 12 over 72 filters.

    Raises
    ------
    ValueError
        If ``out_channels < 1`` or ``min_share`` is not in (0, 1].
    """
    if out_channels < 1:
        raise ValueError(f"out_channels must be >= 1, got {out_channels}")
    if not 0.0 < min_share <= 1.0:
        raise ValueError(f"min_share must be in (0, 1], got {min_share!r}")
    low = max(1, math.ceil(micro.n_f * min_share))
    best = min(range(low, micro.n_f + 1), key=lambda nf: (_sets(out_channels, nf) * nf, -nf))
    return MicroKernel(n_win=micro.n_win, n_f=best, lanes=micro.lanes, window_vectors=micro.window_vectors,
                       registers=micro.registers)


def _halve(start: int, fits) -> int:
    """The paper's heuristic: start high, halve (rounding up) until ``fits``; at least 1."""
    value = max(1, start)
    while value > 1 and not fits(value):
        value = -(-value // 2)
    return value


def _sets(total: int, per_set: int) -> int:
    return -(-total // per_set)


def schedule_cost(*, schedule: Schedule, channel_sets: int, in_tiles: int, fs_tiles: int, in_bytes: int,
                  fs_bytes: int, k2: int, k3: int, line: int, params: CSAParams) -> ScheduleCost:
    """Eqs. (6)-(14) for ``schedule``; for WS input and filter tiles trade places.

    ``k2``/``k3`` are that schedule's counts (IS: filter tiles in L2, input tiles in L3).
    """
    if schedule not in ("IS", "WS"):
        raise ValueError(f"schedule must be 'IS' or 'WS', got {schedule!r}")
    if line < 1:
        raise ValueError(f"cache line size must be positive, got {line}")
    # The stationary operand ("IN" in the paper's IS equations) and the streamed one.
    n_st, b_st, n_mv, b_mv = ((in_tiles, in_bytes, fs_tiles, fs_bytes) if schedule == "IS"
                              else (fs_tiles, fs_bytes, in_tiles, in_bytes))
    sets = channel_sets
    n_dram1 = sets * (n_st * b_st + n_mv * b_mv) / line  # (8)
    mv_fitmin = min(_sets(n_mv, k2) - 1, 1)  # (9)
    st_fit = _sets(n_st, k3) - 1  # (10)
    n_dram2 = sets * mv_fitmin * st_fit * n_mv * b_mv / line  # (11)
    mv_fit = _sets(n_mv, k2) - 1  # (12)
    n_l3 = sets * mv_fit * n_st * b_st / line  # (13)
    n_l2 = sets * (n_st - 1) * n_mv * b_mv / line  # (14)
    total = params.cost_dram * (n_dram1 + n_dram2) + params.cost_l3 * n_l3 + params.cost_l2 * n_l2  # (6), (7)
    return ScheduleCost(schedule, k2, k3, n_dram1, n_dram2, n_l3, n_l2, total)


def analyze(shape: ConvShape, target: HardwareTarget, *, params: CSAParams | None = None,
            micro: MicroKernel | None = None, schedule: Schedule | None = None) -> TilingPlan:
    """Run CSA on one convolution for ``target``.

    Parameters
    ----------
    shape
        The convolution.
    target
        Cache sizes, line size and vector registers (``alt_tvm.target.host()`` or a board).
    params
        alpha/beta/gamma and the per-level costs; defaults to :class:`CSAParams()`.
    micro
        Override the micro-kernel (e.g. the paper's POWER10 8x16); default
        :func:`micro_kernel_for`.
    schedule
        Force ``"IS"`` or ``"WS"`` instead of the cost model's choice.

    Returns
    -------
    TilingPlan
    """
    if not isinstance(shape, ConvShape):
        raise ValueError(f"shape must be a ConvShape, got {type(shape).__name__}")
    if schedule not in (None, "IS", "WS"):
        raise ValueError(f"schedule must be None, 'IS' or 'WS', got {schedule!r}")
    params = params or CSAParams()
    micro = micro or micro_kernel_for(target, dtype_bytes=params.dtype_bytes)
    dt = params.dtype_bytes
    window = shape.r * shape.s
    n_win, n_f = micro.n_win, micro.n_f

    def in_bytes(nc: int) -> int:
        return n_win * nc * window * dt

    def fs_bytes(nc: int) -> int:
        return n_f * nc * window * dt

    out_bytes = n_win * n_f * dt
    l1 = target.l1d_bytes * params.alpha
    one_set = params.pointwise_one_set and shape.pointwise
    if one_set:
        n_c = shape.c
    else:
        n_c = _halve(shape.c, lambda nc: in_bytes(nc) + fs_bytes(nc) + out_bytes <= l1)  # (2)
    channel_sets = _sets(shape.c, n_c)
    in_tiles = _sets(shape.out_h * shape.out_w, n_win)  # (3)
    fs_tiles = _sets(shape.k, n_f)
    b_in, b_fs = in_bytes(n_c), fs_bytes(n_c)
    l2, l3 = target.l2_bytes * params.beta, target.l3_bytes * params.gamma

    def counts(sched: Schedule) -> tuple[int, int]:
        # IS: K2 filter tiles share L2 with the stationary input tile, K3 input tiles sit in L3.
        n_st, b_st, n_mv, b_mv = ((in_tiles, b_in, fs_tiles, b_fs) if sched == "IS"
                                  else (fs_tiles, b_fs, in_tiles, b_in))
        k2 = _halve(n_mv, lambda k: b_st + k * (b_mv + out_bytes) <= l2)  # (4)
        k3 = _halve(n_st, lambda k: k * b_st + k2 * b_mv + k2 * k * out_bytes <= l3)  # (5)
        return k2, k3

    costs = []
    for sched in ("IS", "WS"):
        k2, k3 = counts(sched)
        costs.append(schedule_cost(schedule=sched, channel_sets=channel_sets, in_tiles=in_tiles,
                                   fs_tiles=fs_tiles, in_bytes=b_in, fs_bytes=b_fs, k2=k2, k3=k3,
                                   line=target.cache_line_bytes, params=params))
    # Ties go to IS: its packing happens one tile at a time, right before use. A pointwise
    # convolution in one set packs each tile once whichever the order, and WS's K2 tiles
    # packed ahead (C x N_win each) leave L1: IS is 0-7% faster on the 8 such layers benchmarked.
    chosen = schedule or ("IS" if one_set or costs[0].total <= costs[1].total else "WS")
    pick = costs[0] if chosen == "IS" else costs[1]
    windows = shape.out_h * shape.out_w
    return TilingPlan(
        shape=shape, micro=micro, params=params, n_c=n_c, channel_sets=channel_sets, in_tiles=in_tiles,
        fs_tiles=fs_tiles, in_tile_bytes=b_in, fs_tile_bytes=b_fs, out_tile_bytes=out_bytes, schedule=chosen,
        k2=pick.k2, k3=pick.k3, costs=(costs[0], costs[1]),
        edge_channels=shape.c - (channel_sets - 1) * n_c,
        edge_windows=windows - (in_tiles - 1) * n_win,
        edge_filters=shape.k - (fs_tiles - 1) * n_f,
    )

