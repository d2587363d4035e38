"""SConv direct convolution: CSO macro-kernel, packing on demand, micro-kernel.

From Ferrari et al., "Advancing Direct Convolution using Convolution Slicing Optimization
and ISA Extensions", §4-§6. The analysis (CSA) is in :mod:`alt_tvm.strategies.sconv.csa`,
the build strategy in :mod:`alt_tvm.strategies.sconv.strategy`. This module generates the
convolution as TE plus an ``s_tir`` schedule:

* **Phase image** ``X[n, c, a, b, f]`` — the padded input, split into ``stride_h x
  stride_w`` phases and flattened with row length ``Wq`` (one pass over the input, the
  paper's "padding at the start"). In it every convolution has unit stride and the
  windows of consecutive output positions ``q = oh * Wq + ow`` start at consecutive
  addresses, so an input tile of ``N_win`` windows is read with contiguous vector loads,
  across output rows. The ``Wq - OUT_w`` extra columns per row are computed and dropped.
  Pointwise convolutions need no phase image: their tiles are packed from the input,
  the last one shifted back to end at the image's end (it overlaps its predecessor).
* **Packing on demand** ``P[n, t, c, r, s, v]`` (Fig. 7): for input tile ``t``, the
  element at filter position ``(r, s)`` of each of its ``N_win`` windows, stored
  consecutively; computed inside the macro-kernel, one tile (IS) or ``K2`` tiles (WS) at
  a time, into a buffer that lives in L1/L2.
* **Filters** ``Kt x C x R x S x N_f``, packed once at compile time through an
  :class:`alt_tvm.layout.Layout` (the weight is a constant).
* **Micro-kernel**: ``N_f x N_win`` accumulators in registers; per ``(c, r, s)`` one
  vector load of windows and ``N_f`` broadcast FMAs (an outer product).
* **Macro-kernel** (Fig. 5): channel sets (layer 5) outermost, then sets of ``K3`` and
  ``K2`` tiles in the order of the chosen schedule (IS or WS); partial sums of a channel
  set are added into the output tile.
* **Vector-Based Packing** (§6.2) for unit stride: a packed row ``P[.., r, 0:S, :]`` is
  built from ``ceil((N_win + S - 1) / lanes)`` vector loads and ``S`` register shuffles
  (``shufflevector``, ``valignd`` on AVX-512) instead of ``S`` loads, by tensorizing the
  packing loops with a TIR intrinsic written with ``T.Shuffle``.

Edge tiles (windows, filters, channels that the tile sizes do not divide) are computed as
full tiles over zero-padded filters/channels and extra windows that are then dropped.

The accumulated output goes through one more pass, the crop (plus the epilogue), into
NCHW — except for a pointwise convolution reduced in one channel set, whose micro-kernel
writes its registers (through the epilogue) straight into the NCHW output: each tile's
windows are consecutive positions of the output plane, and the overlapping last tile
writes the same values twice instead of running past the plane. s_tir cannot express
that write (two tiles cover some outputs), so it is a TIR rewrite after scheduling
(:func:`_write_output_from_registers`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import tvm
from tvm import te, tirx

from alt_tvm import lowering
from alt_tvm.layout import Layout, create_prim_func
from alt_tvm.layout.expr import rebuild
from alt_tvm.target import HardwareTarget, host

from .csa import ConvShape, CSAParams, MicroKernel, TilingPlan, analyze, fit_filters, micro_kernel_for_conv

__all__ = [
    "PackingFunctions",
    "SConvKernel",
    "SConvOptions",
    "SConvGeometry",
    "build_sconv",
    "build_sconv_packing",
    "lower_sconv",
    "micro_kernel",
    "sconv_geometry",
    "sconv_pack_te",
    "sconv_te",
    "sconv_weight_layout",
    "schedule_sconv",
]

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SConvOptions:
    """Code-generation switches (the analysis decides everything else).

    Attributes
    ----------
    vbp
        Vector-Based Packing for unit-stride convolutions (§6.2); off: one vector load per
        packed row element.
    schedule
        Force ``"IS"``/``"WS"``; ``None`` lets CSA's cost model choose.
    threads
        Parallel tasks for the macro-kernel (1 = serial, as in the paper); ``None``: the
        target's core count.
    params
        CSA parameters (alpha, beta, gamma, level costs).
    fit_filters
        Narrow the micro-kernel's ``N_f`` so that the output channels split into whole
        tiles with the least zero padding (:func:`~alt_tvm.strategies.sconv.csa.fit_filters`).
    micro
        Use this micro-kernel (e.g. the paper's
        :data:`~alt_tvm.strategies.sconv.csa.PAPER_AVX512`) instead of
        :func:`~alt_tvm.strategies.sconv.csa.micro_kernel_for`'s choice; ``fit_filters``
        still applies.
    """

    vbp: bool = True
    schedule: Literal["IS", "WS"] | None = None
    threads: int | None = None
    params: CSAParams = CSAParams()
    fit_filters: bool = True
    micro: MicroKernel | None = None

    def __post_init__(self) -> None:
        if self.schedule not in (None, "IS", "WS"):
            raise ValueError(f"SConvOptions.schedule must be None, 'IS' or 'WS', got {self.schedule!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"SConvOptions.threads must be a positive int or None, got {self.threads!r}")


@dataclass(frozen=True)
class SConvGeometry:
    """The CSA plan turned into the extents of the generated kernel.

    Attributes
    ----------
    plan
        CSA's result.
    wq, hx, span
        Phase-image row length, rows (with slack), and flat length ``hx * wq``.
    tiles, k2, k3
        Input tiles actually computed (a multiple of the schedule's input-tile set size)
        and the schedule's set sizes, balanced so that sets divide the tile counts.
    kp, cp
        Output / input channels padded to whole filter tiles / channel sets.
    direct
        Pointwise with at least one whole tile of windows in the image: tiles are packed
        from the input itself (no phase image; see :func:`sconv_pack_te`).
    tile_major
        (Property) the accumulated output is laid out by tile (see :func:`sconv_te`).
    """

    plan: TilingPlan
    wq: int
    hx: int
    span: int
    tiles: int
    fs_tiles: int
    k2: int
    k3: int
    kp: int
    cp: int
    n_c: int
    direct: bool = False

    @property
    def tile_major(self) -> bool:
        """Accumulate in (n, tile, filter, window) order, or (n, filter, q).

        Tile-major pays off where each output takes many MACs (+13-23% on 3x3
        convolutions with 256 channels); where it takes few (1x1, the 3-channel first
        layer) the gathering crop costs more than it saves.
        """
        sh = self.shape
        return not sh.pointwise and sh.c * sh.r * sh.s >= 512

    @property
    def writes_output(self) -> bool:
        """The micro-kernel stores into the NCHW output (direct, one channel set)."""
        return self.direct and self.plan.channel_sets == 1

    def tile_start(self, t: Any) -> Any:
        """First output position (``oh * W + ow``) of direct tile ``t``: the last whole
        tile ends at the plane's end, and padding tiles repeat it."""
        plane = self.shape.out_h * self.shape.out_w
        return tirx.min(t * self.n_win, plane - self.n_win)

    def window_of(self, p: Any) -> Any:
        """Accumulator column ``q`` holding direct output position ``p`` (inverse of
        :meth:`tile_start` for the whole tiles; the overlap is read from the last tile)."""
        plane, nw = self.shape.out_h * self.shape.out_w, self.n_win
        last = _ceil_div(plane, nw) - 1
        shift = (last + 1) * nw - plane
        return p + tirx.if_then_else(p >= last * nw, shift, 0) if shift else p

    @property
    def shape(self) -> ConvShape:
        return self.plan.shape

    @property
    def n_win(self) -> int:
        return self.plan.n_win

    @property
    def n_f(self) -> int:
        return self.plan.n_f

    @property
    def schedule(self) -> str:
        return self.plan.schedule

    @property
    def q(self) -> int:
        return self.tiles * self.n_win


def _balanced(total: int, per_set: int) -> tuple[int, int]:
    """(set size, padded total): as many sets as CSA asked for, sizes evened out."""
    sets = _ceil_div(total, max(1, min(per_set, total)))
    size = _ceil_div(total, sets)
    return size, sets * size


def sconv_geometry(plan: TilingPlan) -> SConvGeometry:
    """Extents of the kernel for ``plan`` (see :class:`SConvGeometry`)."""
    sh = plan.shape
    hp = sh.h + sh.pad_top + sh.pad_bottom
    wq = sh.phase_row
    tiles = _ceil_div(sh.phase_windows, plan.n_win)
    fs_tiles = plan.fs_tiles
    # IS: K2 counts filter tiles, K3 input tiles; WS the other way round.
    in_set, fs_set = (plan.k3, plan.k2) if plan.schedule == "IS" else (plan.k2, plan.k3)
    in_set, tiles = _balanced(tiles, in_set)
    fs_set, fs_tiles = _balanced(fs_tiles, fs_set)
    k3, k2 = (in_set, fs_set) if plan.schedule == "IS" else (fs_set, in_set)
    n_c = _ceil_div(sh.c, plan.channel_sets)  # same number of sets, less zero padding
    # Furthest phase-image element a window of the last tile reads, plus one vector of
    # slack for whole-vector loads (VBP), rounded up to whole rows.
    lanes = plan.micro.lanes
    last = tiles * plan.n_win - 1 + ((sh.r - 1) // sh.stride_h) * wq + (sh.s - 1) // sh.stride_w
    hx = max(_ceil_div(last + 1 + lanes, wq), _ceil_div(hp, sh.stride_h))
    return SConvGeometry(plan=plan, wq=wq, hx=hx, span=hx * wq, tiles=tiles, fs_tiles=fs_tiles, k2=k2, k3=k3,
                         kp=fs_tiles * plan.n_f, cp=plan.channel_sets * n_c, n_c=n_c,
                         direct=sh.pointwise and sh.h * sh.w >= plan.n_win)


def sconv_weight_layout(geometry: SConvGeometry) -> Layout:
    """``K C R S`` -> ``Kt C' R S N_f`` (zero-padded filters and channels): the filter packing."""
    sh = geometry.shape
    layout = Layout((sh.k, sh.c, sh.r, sh.s))
    if geometry.kp > sh.k:
        layout = layout.pad(0, geometry.kp - sh.k)
    if geometry.cp > sh.c:
        layout = layout.pad(1, geometry.cp - sh.c)
    return layout.split(0, [geometry.kp // geometry.n_f, geometry.n_f]).reorder([0, 2, 3, 4, 1])


def sconv_pack_te(data: te.Tensor, geometry: SConvGeometry) -> tuple[te.Tensor | None, te.Tensor]:
    """The phase image ``X`` (None for a direct pointwise one) and the packed tiles ``P`` (Fig. 7).

    A pointwise convolution's input already is its phase image (row length ``W``), so its
    tiles are packed straight from ``data``, one contiguous vector per channel; the last
    tile starts ``N_win`` positions before the plane's end (:meth:`SConvGeometry.tile_start`).
    """
    sh, g = geometry.shape, geometry
    c_in, sth, stw = sh.c, sh.stride_h, sh.stride_w
    wq, nw = g.wq, g.n_win
    if g.direct:

        def pack_direct(n, t, c, r, s, v):
            f = g.tile_start(t) + v
            value = data[n, tirx.min(c, c_in - 1), f // sh.w, f % sh.w]
            return tirx.if_then_else(c < c_in, value, tirx.const(0, data.dtype)) if g.cp > c_in else value

        return None, te.compute((sh.n, g.tiles, g.cp, 1, 1, nw), pack_direct, name="sconv_pack")

    def phase(n, c, a, b, f):
        row = (f // wq) * sth + a - sh.pad_top
        col = (f % wq) * stw + b - sh.pad_left
        inside = tirx.all(c < c_in, row >= 0, row < sh.h, col >= 0, col < sh.w)
        return tirx.if_then_else(inside, data[n, c, row, col], tirx.const(0, data.dtype))

    # Only phases a filter tap lands on: a 1x1 stride-2 convolution reads one of four.
    x = te.compute((sh.n, g.cp, min(sth, sh.r), min(stw, sh.s), g.span), phase, name="sconv_phase")

    def pack(n, t, c, r, s, v):
        return x[n, c, r % sth, s % stw, t * nw + v + (r // sth) * wq + s // stw]

    return x, te.compute((sh.n, g.tiles, g.cp, sh.r, sh.s, nw), pack, name="sconv_pack")


def sconv_te(data: te.Tensor, weight: te.Tensor, geometry: SConvGeometry) -> te.Tensor:
    """The SConv stages in TE; returns the NCHW output (``weight`` is read in OIHW terms).

    Reads of ``weight`` beyond ``K``/``C`` land in the zero padding of
    :func:`sconv_weight_layout`, so the weight must be given that layout.
    """
    sh, g = geometry.shape, geometry
    n_img, wq, nw, nc = sh.n, g.wq, g.n_win, g.n_c
    _, packed = sconv_pack_te(data, geometry)
    ci = te.reduce_axis((0, nc), "ci")
    rr = te.reduce_axis((0, sh.r), "rr")
    rs = te.reduce_axis((0, sh.s), "rs")
    n_sets = geometry.plan.channel_sets
    if g.tile_major:
        # (n, tile, filter, window): a micro-kernel call writes one contiguous block, not
        # n_f rows an image apart; the crop below then gathers, which 1x1 convolutions
        # (little work per output) cannot afford.
        acc_shape = (n_img, g.tiles, g.kp, nw)

        def part_at(n, cs, t, k, v):
            return packed[n, t, cs * nc + ci, rr, rs, v] * weight[k, cs * nc + ci, rr, rs]

        def read(tensor, n, k, q):
            return tensor[n, q // nw, k, q % nw]
    else:
        acc_shape = (n_img, g.kp, g.q)

        def part_at(n, cs, k, q):
            return packed[n, q // nw, cs * nc + ci, rr, rs, q % nw] * weight[k, cs * nc + ci, rr, rs]

        def read(tensor, n, k, q):
            return tensor[n, k, g.window_of(q) if g.direct else q]
    part = te.compute((n_img, n_sets, *acc_shape[1:]), lambda n, cs, *i: te.sum(part_at(n, cs, *i), axis=[ci, rr, rs]),
                      name="sconv_part")
    if n_sets == 1:
        # One channel set: the micro-kernel's registers go straight out, no zeroing pass.
        acc = te.compute(acc_shape, lambda n, *i: part[(n, 0, *i)], name="sconv_acc")
    else:
        cs = te.reduce_axis((0, n_sets), "cs")
        acc = te.compute(acc_shape, lambda n, *i: te.sum(part[(n, cs, *i)], axis=cs), name="sconv_acc")
    return te.compute((n_img, sh.k, sh.out_h, sh.out_w), lambda n, k, oh, ow: read(acc, n, k, oh * wq + ow),
                      name="sconv_out")


# ---------------------------------------------------------------------- Vector-Based Packing
@functools.cache
def _vbp_intrin(width: int, n_win: int, lanes: int) -> str:
    """Register (once) the VBP intrinsic for ``width`` filter columns; returns its name.

    ``B[s, v] = A[s + v]`` for ``s < width``, ``v < n_win``: the ``n_win + width - 1``
    source elements are loaded as ``nvec`` whole vectors (reading up to ``lanes - 1``
    elements past the tile: the phase image has that much slack), and each packed row is a
    ``shufflevector`` of them with the compile-time mask ``s .. s + n_win - 1`` (a shift
    by ``s`` elements: ``valignd``/``vpermt2ps`` on AVX-512). Both functions are
    generated as TVMScript text because every row needs its own constant mask.
    """
    need = n_win + width - 1
    nvec = _ceil_div(need, lanes)
    name = f"alt_sconv_vbp_{width}x{n_win}_l{lanes}"
    head = (
        "@T.prim_func(private=True, s_tir=True)\n"
        "def func(a: T.handle, b: T.handle):\n"
        f"    A = T.match_buffer(a, ({need},), 'float32', offset_factor=1)\n"
        f"    B = T.match_buffer(b, ({width}, {n_win}), 'float32', offset_factor=1)\n"
        "    with T.sblock('root'):\n"
        f"        T.reads(A[0:{need}])\n"
        f"        T.writes(B[0:{width}, 0:{n_win}])\n"
    )
    desc = head + (
        f"        for s, v in T.grid({width}, {n_win}):\n"
        "            with T.sblock('pack'):\n"
        "                vs, vv = T.axis.remap('SS', [s, v])\n"
        "                B[vs, vv] = A[vs + vv]\n"
    )
    sources = ", ".join(f"A[T.Ramp({i * lanes}, 1, {lanes})]" for i in range(nvec))
    impl = head + "".join(
        f"        B[{s}, 0:{n_win}] = T.Shuffle([{sources}], {list(range(s, s + n_win))})\n"
        for s in range(width))
    tvm.s_tir.TensorIntrin.register(name, tvm.script.from_source(desc), tvm.script.from_source(impl),
                                    override=True)
    return name


# ---------------------------------------------------------------------------- the schedule
def _schedule_phase(sch: Any, g: SConvGeometry, threads: int) -> None:
    """Phase image: one pass, rows of the flat image split out so indices stay affine."""
    if g.direct:
        return  # only the small tail tile, left serial
    pn, pc, _, _, pf = sch.get_loops(sch.get_sblock("sconv_phase"))
    _, pj = sch.split(pf, [g.hx, g.wq])
    sh = g.shape
    if sh.pad_left == sh.pad_right == 0 and sh.w % sh.stride_w == 0:
        # Every column is inside the image: only the row test remains, and it is the same
        # for the whole vector, so the copy vectorises without reading out of bounds.
        sch.vectorize(pj)
    if threads > 1:
        sch.parallel(sch.fuse(pn, pc))


def _schedule_pack_rows(sch: Any, pack: Any, g: SConvGeometry, vbp: bool, lanes: int) -> None:
    """Vectorise a packed row, or build it with VBP register shifts (unit stride, S > 1)."""
    loops = sch.get_loops(pack)
    sh = g.shape
    if vbp and sh.stride_w == 1 and sh.s > 1 and g.n_win % lanes == 0:
        sch.tensorize(loops[-2], _vbp_intrin(sh.s, g.n_win, lanes))
    else:
        sch.vectorize(loops[-1])


def _splits_windows(extent: int, lanes: int) -> bool:
    """Whether :func:`_vectorize_windows` splits a window loop of ``extent`` into registers."""
    return extent > lanes and extent % lanes == 0


def _vectorize_windows(sch: Any, loop: Any, lanes: int) -> None:
    """Vectorise a loop over windows one register at a time (outer part unrolled).

    Several window vectors per tile would otherwise become one wide LLVM vector
    (``<48 x float>`` with three AVX-512 registers), which LLVM legalises badly.
    """
    extent = int(sch.get(loop).extent)
    if _splits_windows(extent, lanes):
        outer, inner = sch.split(loop, [None, lanes])
        sch.unroll(outer)
        sch.vectorize(inner)
    else:
        sch.vectorize(loop)


def _parallel_choice(sch: Any, loops: list, threads: int, *, balance: float = 0.85) -> Any | None:
    """The outermost of ``loops`` that splits over ``threads`` with ``balance`` or better.

    Outermost first: every iteration of the loops around the parallel one starts a
    parallel region, and an inner choice (e.g. 8 filter tiles under 400 tile/channel-set
    iterations) spends more time starting regions than computing. Falls back to the
    best-balanced loop.
    """
    if threads <= 1:
        return None
    best, best_eff = None, 0.0
    for loop in loops:
        extent = int(sch.get(loop).extent)
        if extent < 2:
            continue
        eff = extent / (_ceil_div(extent, threads) * threads)
        if extent >= threads and eff >= balance:
            return loop
        if eff > best_eff + 1e-9:
            best, best_eff = loop, eff
    return best


def schedule_sconv(func: tirx.PrimFunc, geometry: SConvGeometry, *, final: str = "sconv_out",
                   inline: tuple[str, ...] = (), options: SConvOptions | None = None,
                   lanes: int = 16) -> tvm.IRModule:
    """The five-layer macro-kernel (Fig. 5) around the micro-kernel, for IS or WS.

    Loops of the accumulation (outer to inner)::

        IS: n . channel set . t/K3 . kt/K2 . [t in K3: pack tile] . [kt in K2] . micro-kernel
        WS: n . channel set . kt/K3 . t/K2 . [pack K2 tiles] . [kt in K3] . [t in K2] . micro-kernel
        micro-kernel: c . r . s . (N_f unrolled) . (N_win vectorised)

    ``final`` is the last stage (the NCHW output or the epilogue's last stage) and
    ``inline`` the stages between ``sconv_out`` and it, inlined into it.
    """
    options = options or SConvOptions()
    g = geometry
    threads = options.threads or 1
    sch = tvm.s_tir.Schedule(func)
    acc = sch.get_sblock("sconv_acc")
    if g.tile_major:
        n, t, k, v, *cs = sch.get_loops(acc)  # no channel-set loop when there is one set
    else:
        n, k, q, *cs = sch.get_loops(acc)
        t, v = sch.split(q, [None, g.n_win])
    kt, kf = sch.split(k, [None, g.n_f])
    if g.schedule == "IS":
        t3, t2 = sch.split(t, [None, g.k3])
        k3, k1 = sch.split(kt, [None, g.k2])
        sch.reorder(n, *cs, t3, k3, t2, k1, kf, v)
        pack_at, micro_at, par_loops = t2, k1, [t3, k3, t2, k1]
    else:
        k3, k1 = sch.split(kt, [None, g.k3])
        t3, t1 = sch.split(t, [None, g.k2])
        sch.reorder(n, *cs, k3, t3, k1, t1, kf, v)
        pack_at, micro_at, par_loops = t3, t1, [k3, t3, k1, t1]

    def below(block: Any, loop: Any) -> list:
        """The loops of ``block`` nested inside ``loop``."""
        loops = sch.get_loops(block)
        at = [i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(loop))][0]
        return loops[at + 1:]

    # Micro-kernel: the channel set's partial sums in registers. Loops of extent 1 vanish
    # under compute_at, so the loops are found by position: (kf, v, reduction loops...).
    part = sch.get_sblock("sconv_part")
    sch.compute_at(part, micro_at)
    sch.set_scope(part, 0, "local")
    p_kf, p_v, *p_red = below(part, micro_at)
    if p_red:
        sch.reorder(*p_red, p_kf, p_v)
    sch.unroll(p_kf)
    sch.unroll(kf)
    for loop in (p_v, v):
        _vectorize_windows(sch, loop, lanes)
    # Packing on demand, at layer 2 (IS: one tile) or layer 3 (WS: K2 tiles).
    pack = sch.get_sblock("sconv_pack")
    sch.compute_at(pack, pack_at)
    # Parallel loops are set before the reductions are decomposed (s_tir checks dataflow).
    par = _parallel_choice(sch, par_loops, threads)
    if par is not None:
        sch.parallel(par)
        inner = [lp for lp in par_loops[2:] if sch.get(par).same_as(sch.get(lp))]
        if g.schedule == "WS" and g.k2 >= threads and inner:
            # WS packs K2 tiles outside an inner parallel loop: split that packing over threads too.
            sch.parallel(below(pack, pack_at)[0])
    init = sch.decompose_reduction(part, p_red[0] if p_red else p_kf)
    i_loops = sch.get_loops(init)[-3 if _splits_windows(g.n_win, lanes) else -2:]
    for loop in i_loops[:-1]:
        sch.unroll(loop)
    sch.vectorize(i_loops[-1])
    _schedule_pack_rows(sch, pack, g, options.vbp, lanes)
    if cs:
        acc_init = sch.decompose_reduction(acc, cs[0])
        init_loops = sch.get_loops(acc_init)
        sch.vectorize(init_loops[-1])
        # The init loops copy the parallel annotation of the loops they come from, if any.
        if threads > 1 and len(init_loops) > 1 and \
                not any(int(sch.get(lp).kind) == int(tirx.ForKind.PARALLEL) for lp in init_loops):
            sch.parallel(sch.fuse(*init_loops[:-1]))
    _schedule_phase(sch, g, threads)
    sch.compute_inline(sch.get_sblock("sconv_out")) if final != "sconv_out" else None
    for name in inline:
        sch.compute_inline(sch.get_sblock(name))
    if g.writes_output:
        return _write_output_from_registers(sch.mod, g, final)
    # Crop (+ epilogue): a parallel pass over the NCHW output.
    out_loops = sch.get_loops(sch.get_sblock(final))
    if threads > 1 and len(out_loops) >= 2:
        sch.parallel(sch.fuse(*out_loops[:2]))
    if int(sch.get(out_loops[-1]).extent) <= 64:
        sch.vectorize(out_loops[-1])
    return sch.mod


def _rebuild_stmt(stmt: Any, visit: Any) -> Any:
    """``stmt`` with every block realize ``r`` replaced by ``visit(r)`` (None: keep and
    descend). Covers the statements an SConv schedule produces (TVM 0.27 gives Python no
    statement mutator)."""
    if isinstance(stmt, tirx.For):
        body = _rebuild_stmt(stmt.body, visit)
        return stmt if body.same_as(stmt.body) else tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations, stmt.step)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rebuild_stmt(x, visit) for x in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        new = visit(stmt)
        if new is not None:
            return new
        blk = stmt.block
        body = _rebuild_stmt(blk.body, visit)
        if body.same_as(blk.body):
            return stmt
        block = tvm.s_tir.SBlock(blk.iter_vars, blk.reads, blk.writes, blk.name_hint, body, blk.init,
                                 blk.alloc_buffers, blk.match_buffers, blk.annotations)
        return tvm.s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
    if isinstance(stmt, (tirx.BufferStore, tirx.Evaluate)):
        return stmt
    raise TypeError(f"unexpected statement {type(stmt).__name__} in an SConv schedule")


def _write_output_from_registers(mod: tvm.IRModule, g: SConvGeometry, final: str) -> tvm.IRModule:
    """Fuse the crop (and epilogue) pass into the micro-kernel's write-back.

    The block ``final`` computes ``out[n, k, oh, ow] = E(acc[n, k, window_of(p)], ...)``
    in a pass of its own. Here its expression ``E`` moves into the ``sconv_acc`` block
    (``acc[n, k, q] = registers``), which then stores ``E(registers)`` at output position
    ``p = tile_start(q // N_win) + q % N_win``; the pass and the accumulator buffer go.
    """
    func = mod["main"]
    root = func.body.block
    nests = list(root.body.seq)
    found = {r.block.name_hint: r.block for nest in nests for r in _realizes(nest)}
    missing = [name for name in (final, "sconv_acc") if name not in found]
    if missing:
        raise RuntimeError(f"SConv write-back: scheduled blocks {missing} not found (have {sorted(found)})")
    fin, acc = found[final], found["sconv_acc"]
    store, acc_store = fin.body, acc.body
    acc_buf = acc_store.buffer
    an, ak, aq = (iv.var for iv in acc.iter_vars)
    sh, nw = g.shape, g.n_win
    p = g.tile_start(tirx.floordiv(aq, nw)) + tirx.floormod(aq, nw)
    fn, fk, fh, fw = (iv.var for iv in fin.iter_vars)
    vmap = {fn: an, fk: ak, fh: tirx.floordiv(p, sh.out_w), fw: tirx.floormod(p, sh.out_w)}

    def load(buf: Any, indices: list) -> Any:
        return acc_store.value if buf.same_as(acc_buf) else tirx.BufferLoad(buf, indices)

    value = rebuild(store.value, vmap=vmap, load=load)
    indices = [rebuild(i, vmap=vmap) for i in store.indices]
    body = tirx.BufferStore(store.buffer, value, indices)
    if g.kp > sh.k:
        body = tirx.IfThenElse(ak < sh.k, body, None)  # zero-padded filters are not stored

    def region(r: Any) -> Any:
        return tirx.BufferRegion(r.source, [tvm.ir.Range.from_min_extent(rebuild(x.min, vmap=vmap),
                                                                         rebuild(x.extent, vmap=vmap))
                                            for x in r.region])

    reads = [*acc.reads, *(region(r) for r in fin.reads if not r.source.same_as(acc_buf))]
    writes = [tirx.BufferRegion(store.buffer, [tvm.ir.Range.from_min_extent(i, 1) for i in indices])]
    fused = tvm.s_tir.SBlock(acc.iter_vars, reads, writes, acc.name_hint, body, None, acc.alloc_buffers,
                             acc.match_buffers, acc.annotations)

    def visit(r: Any) -> Any:
        if r.block.same_as(acc):
            return tvm.s_tir.SBlockRealize(r.iter_values, r.predicate, fused)
        return None

    kept = [_rebuild_stmt(nest, visit) for nest in nests
            if not any(r.block.same_as(fin) for r in _realizes(nest))]
    new_root = tvm.s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                                tirx.SeqStmt(kept) if len(kept) > 1 else kept[0], root.init,
                                [b for b in root.alloc_buffers if not b.same_as(acc_buf)], root.match_buffers,
                                root.annotations)
    body = tvm.s_tir.SBlockRealize(func.body.iter_values, func.body.predicate, new_root)
    return tvm.IRModule({"main": func.with_body(body)})


def _realizes(stmt: Any) -> list:
    """Every block realize in ``stmt``, outer first."""
    found: list = []
    _rebuild_stmt(stmt, found.append)  # append returns None: keep and descend
    return found


# ------------------------------------------------------------------------ standalone use
def micro_kernel(shape: ConvShape, target: HardwareTarget, options: SConvOptions) -> MicroKernel:
    if options.micro is None:
        return micro_kernel_for_conv(shape, target, dtype_bytes=options.params.dtype_bytes, fit=options.fit_filters)
    return fit_filters(options.micro, shape.k) if options.fit_filters else options.micro



@dataclass(frozen=True)
class SConvKernel:
    """A compiled SConv convolution (no bias) and what was decided for it.

    Call it with NumPy NCHW data; the weight was packed when the kernel was built.
    """

    geometry: SConvGeometry
    options: SConvOptions
    module: Any
    packed_weight: Any  # tvm.runtime.Tensor

    @property
    def plan(self) -> TilingPlan:
        return self.geometry.plan

    @functools.cached_property
    def main(self) -> Any:
        """The compiled function ``main(data, packed_weight, out)``, looked up once (a lookup
        costs 10-20 us, a third of a small convolution)."""
        return self.module["main"]

    def __call__(self, data: np.ndarray, *, out: Any = None) -> np.ndarray:
        dev = tvm.cpu()
        sh = self.geometry.shape
        x = data if isinstance(data, tvm.runtime.Tensor) else tvm.runtime.tensor(
            np.ascontiguousarray(data, dtype=np.float32), dev)
        y = out or tvm.runtime.tensor(np.empty((sh.n, sh.k, sh.out_h, sh.out_w), np.float32), dev)
        self.main(x, self.packed_weight, y)
        return y.numpy() if out is None else y


def build_sconv(shape: ConvShape, weight: np.ndarray, *, target: HardwareTarget | None = None,
                options: SConvOptions | None = None) -> SConvKernel:
    """Analyse, generate and compile SConv for ``shape`` with the constant ``weight`` (OIHW).

    Raises
    ------
    ValueError
        If ``weight`` does not have shape ``(k, c, r, s)`` of ``shape``.
    """
    target = target or host()
    options = options or SConvOptions()
    expected = (shape.k, shape.c, shape.r, shape.s)
    if tuple(weight.shape) != expected:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected {expected} (OIHW) for {shape}")
    mod, geometry = lower_sconv(shape, target=target, options=options)
    opts = dataclasses.replace(options, threads=options.threads or target.num_cores)
    module = lowering.compile(mod, target=target.to_tvm()).jit()
    layout = sconv_weight_layout(geometry)
    packed = tvm.runtime.tensor(np.ascontiguousarray(layout.apply(np.asarray(weight, np.float32))), tvm.cpu())
    return SConvKernel(geometry, opts, module, packed)


def lower_sconv(shape: ConvShape, *, target: HardwareTarget | None = None,
                options: SConvOptions | None = None) -> tuple[tvm.IRModule, SConvGeometry]:
    """The scheduled TIR of SConv for ``shape`` (``main(data, packed weight, out)``) and its geometry."""
    target = target or host()
    options = options or SConvOptions()
    plan = analyze(shape, target, params=options.params, schedule=options.schedule,
                   micro=micro_kernel(shape, target, options))
    geometry = sconv_geometry(plan)
    data = te.placeholder((shape.n, shape.c, shape.h, shape.w), name="data")
    w = te.placeholder((shape.k, shape.c, shape.r, shape.s), name="weight")
    out = sconv_te(data, w, geometry)
    func = create_prim_func([data, w, out], layouts={w: sconv_weight_layout(geometry)})
    opts = dataclasses.replace(options, threads=options.threads or target.num_cores)
    return schedule_sconv(func, geometry, options=opts, lanes=target.vector_lanes("float32")), geometry


@dataclass(frozen=True)
class PackingFunctions:
    """Compiled packing-only functions of one SConv kernel (see :func:`build_sconv_packing`).

    ``phase`` and ``pack`` are modules whose ``main`` takes the NCHW data and an output of
    ``phase_shape`` / ``pack_shape``; ``phase`` is None where there is no phase image
    (pointwise convolutions packed from the input).
    """

    phase: Any | None
    pack: Any
    repacks: int
    geometry: SConvGeometry
    phase_shape: tuple[int, ...] | None
    pack_shape: tuple[int, ...]


def build_sconv_packing(shape: ConvShape, *, target: HardwareTarget | None = None,
                        options: SConvOptions | None = None) -> PackingFunctions:
    """Compiled phase-image and phase+packing functions, for measuring packing time.

    ``pack`` packs every input tile once per channel set into a full buffer, with the
    same row code as the kernel (VBP or vector loads); ``repacks`` is how many times the
    macro-kernel packs each tile (one per filter-tile set visited around it). Packing time
    ~= phase + (pack - phase) x repacks; the full buffer goes to memory where the
    kernel's tile stays in L1, so this over-estimates.
    """
    target = target or host()
    options = options or SConvOptions()
    plan = analyze(shape, target, params=options.params, schedule=options.schedule,
                   micro=micro_kernel(shape, target, options))
    g = sconv_geometry(plan)
    threads = options.threads or target.num_cores
    lanes = target.vector_lanes("float32")
    data = te.placeholder((shape.n, shape.c, shape.h, shape.w), name="data")
    first, packed = sconv_pack_te(data, g)
    modules = []
    for out in (first, packed):
        if out is None:
            modules.append(None)
            continue
        sch = tvm.s_tir.Schedule(te.create_prim_func([data, out]))
        _schedule_phase(sch, g, threads)
        if out is packed:
            block = sch.get_sblock("sconv_pack")
            if threads > 1:
                sch.parallel(sch.fuse(*sch.get_loops(block)[:2]))
            _schedule_pack_rows(sch, block, g, options.vbp, lanes)
        modules.append(lowering.compile(sch.mod, target=target.to_tvm()).jit())
    fs_set = g.k2 if plan.schedule == "IS" else g.k3
    return PackingFunctions(modules[0], modules[1], g.fs_tiles // fs_set, g,
                            None if first is None else tuple(int(x) for x in first.shape),
                            tuple(int(x) for x in packed.shape))
