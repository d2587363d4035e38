"""Optimised TT einsum kernels and the TT layer's einsum chain (Anthimopoulos et al., Listing 1, §4.3).

Every einsum of a TT layer is ``Y[m, b, r] = sum_{n, k} G[r, n, m, k] * X[b, n, k]``
(Listing 2, ``"rnmk,bnk->mbr"``) with ``G`` a core ``(r_{t-1}, n_t, m_t, r_t)``, so ``r`` (the
output rank, the paper's ``rt``) is ``r_{t-1}`` and ``k`` (the contracted rank, ``rt_1``) is
``r_t``. Three variants (§6.3): the *first* einsum has ``k = 1``, the *middle* ones ``r = k``,
the *final* one ``r = 1``.

The paper's optimisations, as alt-tvm primitives:

* array packing of ``G`` (§4.3.1, §4.3.3-4): a :class:`~alt_tvm.layout.Layout` on the core
  ``(r, n, m, k) -> (m, r / V, n * k, V)`` with ``V = vec * Rr`` (``(m, n * k)`` for the final
  einsum), applied to the constant offline (:func:`pack_core`) and by the rewrite pass to the
  kernel's reads;
* reshapes fused away by indexing (§4.3.2): buffers are contiguous, so the next einsum reads
  ``X[b, n, k]`` at flat position ``(b * n_t + n) * r + k`` of the previous output; in a chain
  the unravelled index folds back to that affine form after TVM's simplification;
* vectorisation of the ``r`` loop, or of the ``k`` loop with a horizontal add in the final
  einsum (§4.3.3), ``vec = gcd(rank, lanes)``;
* register blocking (§4.3.4): :func:`choose_register_block` minimises the load/store counts
  of eqs. (20)-(25) under the register budget of eq. (19);
* L2 tiling and loop order (§4.3.5): :func:`choose_loop_order` applies eqs. (26)-(28);
* threads by per-einsum FLOPs (§4.2.3): :func:`threads_for`, with thresholds measured on a
  2-core x86 host (:data:`HOST_THREAD_THRESHOLDS`).

Two additions to the paper, both measured on the Table 3 sizes (``docs/tt_einsum.md``):

* *m-pairing* (first/middle einsums): with ``r = 8`` and 16 float lanes (AVX-512) the paper's
  ``r``-vector fills half a register; ``pair = lanes / r`` consecutive ``m`` share one vector,
  ``G`` is packed ``(m / pair, n * k, pair * r)`` and the accumulator laid out so that the
  pair is adjacent (:attr:`EinsumPlan.pair`);
* the *b-vector final kernel* (short ``n * k``): the horizontal add per output dominates
  when ``n * k`` is a few vectors, so a tile of ``X`` is transposed to ``[n * k, b]`` once per
  ``b`` tile and ``b`` is vectorised like a GEMM's ``N`` (:attr:`EinsumPlan.b_lanes`). The
  k-vector kernel, where kept, vectorises ``j = (n, k)`` at the full width when ``n * k``
  allows (whole ``n`` per vector).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tvm
from tvm import te

from alt_tvm import lowering
from alt_tvm.layout import Layout, create_prim_func
from alt_tvm.target import HardwareTarget, host

__all__ = [
    "B_VECTOR_MAX_NK",
    "HOST_THREAD_THRESHOLDS",
    "PAPER_THREAD_THRESHOLDS",
    "TABLE3",
    "EinsumKernel",
    "EinsumPlan",
    "EinsumShape",
    "L2Cache",
    "LoopOrder",
    "RegisterBlock",
    "TTChain",
    "build_chain",
    "build_einsum",
    "chain_shapes",
    "choose_loop_order",
    "choose_register_block",
    "core_layout",
    "default_thresholds",
    "einsum_reference",
    "l2_cache",
    "load_store_count",
    "pack_core",
    "plan_einsum",
    "threads_for",
]

Kind = Literal["first", "middle", "final"]


# --------------------------------------------------------------------------- shapes


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class EinsumShape:
    """Loop bounds of one einsum ``"rnmk,bnk->mbr"``.

    Parameters
    ----------
    m, bt, n : int
        Output factor ``m_t``, batch-like extent ``b_t`` and contracted input factor ``n_t``.
    r_out : int
        Output rank ``r`` (the paper's ``rt``; 1 in the final einsum).
    r_in : int
        Contracted rank ``k`` (the paper's ``rt_1``; 1 in the first einsum).
    """

    m: int
    bt: int
    n: int
    r_out: int
    r_in: int

    def __post_init__(self) -> None:
        for name in ("m", "bt", "n", "r_out", "r_in"):
            _positive(f"EinsumShape.{name}", getattr(self, name))

    @property
    def kind(self) -> Kind:
        """``"final"`` when ``r_out == 1``, ``"first"`` when ``r_in == 1``, else ``"middle"``."""
        if self.r_out == 1:
            return "final"
        return "first" if self.r_in == 1 else "middle"

    @property
    def flops(self) -> int:
        """``2 m b n r k``: eq. (13) for this einsum."""
        return 2 * self.m * self.bt * self.n * self.r_out * self.r_in

    @property
    def core_shape(self) -> tuple[int, int, int, int]:
        """Canonical core shape ``(r, n, m, k)``."""
        return (self.r_out, self.n, self.m, self.r_in)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.bt, self.n, self.r_in)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return (self.m, self.bt, self.r_out)


def _table3() -> dict[str, dict[Kind, EinsumShape]]:
    # Table 3 of the paper, rank 8 (rows partly lost their rank column in the text; the FLOPs
    # column confirms r = k = 8 everywhere).
    first = [(512, 32, 128), (64, 64, 64), (128, 1024, 4), (256, 64, 784), (32, 64, 392),
             (512, 896, 28), (100, 12, 64), (16, 4, 150)]
    middle = [(48, 224, 2), (64, 3582, 4), (96, 128, 14), (64, 64, 32), (256, 128, 4), (32, 9, 7),
              (4, 16383, 28), (64, 1020, 28)]
    final = [(32, 126, 256), (64, 64, 128), (32, 126, 4), (256, 16, 7), (8, 510, 896), (32, 250, 4),
             (124, 9, 16), (48, 21, 4)]
    return {
        f"CB{i}": {
            "first": EinsumShape(m=f[0], bt=f[1], n=f[2], r_out=8, r_in=1),
            "middle": EinsumShape(m=mi[0], bt=mi[1], n=mi[2], r_out=8, r_in=8),
            "final": EinsumShape(m=fi[0], bt=fi[1], n=fi[2], r_out=1, r_in=8),
        }
        for i, (f, mi, fi) in enumerate(zip(first, middle, final))
    }


#: The CB0-CB7 einsum sizes of Table 3 (rank 8), by id and kind.
TABLE3: dict[str, dict[Kind, EinsumShape]] = _table3()


# --------------------------------------------------------------------------- register blocking


@dataclass(frozen=True)
class RegisterBlock:
    """Register-blocking (unroll-and-jam) factors of §4.3.4.

    ``rm``, ``rb`` unroll the ``m`` and ``b`` loops; ``rr`` counts vectors along ``r`` (along
    ``k`` in the final einsum); ``rk`` unrolls the contracted loop.
    """

    rm: int = 1
    rb: int = 1
    rr: int = 1
    rk: int = 1

    def __post_init__(self) -> None:
        for name in ("rm", "rb", "rr", "rk"):
            _positive(f"RegisterBlock.{name}", getattr(self, name))

    def registers(self) -> int:
        """Left side of eq. (19): ``Rm Rb Rr + min(Rb Rk, Rm Rr) + 1``."""
        return self.rm * self.rb * self.rr + min(self.rb * self.rk, self.rm * self.rr) + 1


def _vector_width(shape: EinsumShape, lanes: int) -> int:
    # Ranks are multiples of the DSE's vl; a rank below the machine's lanes uses a narrower
    # vector (8 floats = one ymm on AVX-512) rather than padding.
    rank = shape.r_in if shape.kind == "final" else shape.r_out
    vec = math.gcd(rank, lanes)
    if shape.kind == "final" and vec == rank and (shape.n * rank) % lanes == 0:
        # The final einsum's j = (n, k) is contiguous in G' and X: whole n per vector, full width.
        return lanes
    return vec


def load_store_count(shape: EinsumShape, block: RegisterBlock, *, vl: int, count_padding: bool = True) -> float:
    """Load/store instructions of the register-blocked kernel, eqs. (20)-(25).

    ``rt / vl`` is the number of vectors along the vectorised rank. Remainder ("padding")
    micro-kernels add, for each loop the factor does not divide, the product of the other
    loops' bounds (eq. (22) with the Kronecker delta of eq. (23)).

    Parameters
    ----------
    shape : EinsumShape
    block : RegisterBlock
    vl : int
        Vector length in elements.
    count_padding : bool
        Include the remainder kernels (the paper's current model); ``False`` is the model of
        its earlier work.

    Returns
    -------
    float
    """
    vl = _positive("vl", vl)
    final = shape.kind == "final"
    mt, bt = shape.m, shape.bt
    # Vectorised rank and the other, scalar, contracted extent.
    rv = max(1, (shape.r_in if final else shape.r_out) // vl)
    nk = shape.n * (1 if final else shape.r_in)
    pad = 1.0 if count_padding else 0.0

    def delta(x: int) -> float:
        return pad if x else 0.0

    g = mt * (bt // block.rb) * rv * nk + delta(bt % block.rb) * mt * rv * nk
    inp = ((mt // block.rm) * bt * (rv // block.rr) * nk + delta(mt % block.rm) * bt * rv * nk
           + delta(rv % block.rr) * mt * bt * nk)
    if final:
        # One scalar store per (m, b) after the horizontal add, amended as §4.3.4 says.
        out = mt * bt
    else:
        out = mt * (bt // block.rb) * (rv // block.rr) + delta(bt % block.rb) * mt * rv + delta(rv % block.rr) * mt * bt
    return float(g + inp + out)


def choose_register_block(shape: EinsumShape, *, vector_registers: int, vl: int, count_padding: bool = True,
                          divisors_only: bool = False, max_factor: int = 16) -> RegisterBlock:
    """Enumerate RB factors under eq. (19) and keep the one with fewest loads/stores (eq. (20)).

    Ties go to the fewest registers, then to factors that divide their loops.

    Parameters
    ----------
    shape : EinsumShape
    vector_registers : int
        Available vector registers (``HardwareTarget.vector_registers``).
    vl : int
        Vector length in elements of the vectorised loop.
    count_padding : bool
        See :func:`load_store_count`.
    divisors_only : bool
        Only factors that divide their loops. TVM expresses a remainder as a predicate inside
        the unrolled body, not as the separate padding micro-kernel eq. (22) prices, and that
        costs far more (CB2 middle: 28 GFLOP/s with 5x5 vs 58-67 with 4x4 or 2x8), so
        :func:`plan_einsum` sets it.
    max_factor : int
        Largest unroll factor tried per loop.

    Returns
    -------
    RegisterBlock
    """
    regs = _positive("vector_registers", vector_registers)
    vl = _positive("vl", vl)
    rv = max(1, (shape.r_in if shape.kind == "final" else shape.r_out) // vl)
    best: tuple | None = None
    rr_range = [d for d in range(1, rv + 1) if rv % d == 0]
    for rm, rb, rr in itertools.product(range(1, min(max_factor, shape.m) + 1),
                                        range(1, min(max_factor, shape.bt) + 1), rr_range):
        if divisors_only and (shape.m % rm or shape.bt % rb):
            continue
        block = RegisterBlock(rm, rb, rr, 1)  # rk adds registers but never saves a load (eqs. (21)-(25))
        if block.registers() > regs:
            continue
        cost = load_store_count(shape, block, vl=vl, count_padding=count_padding)
        key = (cost, block.registers(), (shape.m % rm != 0) + (shape.bt % rb != 0), rm, rb, rr)
        if best is None or key < best[0]:
            best = (key, block)
    if best is None:
        raise ValueError(f"no register block fits {regs} registers (eq. (19) needs at least 3)")
    return best[1]


# --------------------------------------------------------------------------- L2 tiling, loop order


@dataclass(frozen=True)
class L2Cache:
    """The cache level tiled for: total bytes and associativity (``L2.assoc`` of eq. (26))."""

    size_bytes: int
    assoc: int

    def __post_init__(self) -> None:
        _positive("L2Cache.size_bytes", self.size_bytes)
        _positive("L2Cache.assoc", self.assoc)

    @property
    def way_bytes(self) -> int:
        """Bytes per way (``L2.way`` of eq. (26))."""
        return self.size_bytes // self.assoc


def l2_cache(target: HardwareTarget, *, assoc: int | None = None) -> L2Cache:
    """L2 of ``target``; associativity from sysfs for the host, else ``assoc`` or 16.

    The SpacemiT K1's L2 associativity is not in the board description; 16 is an assumption
    (typical for 512 KiB L2s) and can be overridden.
    """
    if assoc is None:
        assoc = 16
        sysfs = Path("/sys/devices/system/cpu/cpu0/cache/index2/ways_of_associativity")
        if target.name == "host" and sysfs.exists():
            try:
                assoc = int(sysfs.read_text().strip())
            except ValueError:
                pass
    return L2Cache(target.l2_bytes, assoc)


@dataclass(frozen=True)
class LoopOrder:
    """Result of §4.3.5: permutation, parallel loop and the ``b`` tile (``None``: untiled)."""

    order: Literal["mbr", "bmr"]
    b_tile: int | None = None


def _ways(nbytes: int, cache: L2Cache) -> int:
    return -(-nbytes // cache.way_bytes)


def choose_loop_order(shape: EinsumShape, *, threads: int, cache: L2Cache, dtype_bytes: int = 4) -> LoopOrder:
    """Loop permutation and L2 tiling by eqs. (26)-(28).

    Step 1: ``{m, b, r, nk}`` with ``m`` parallel if eq. (26) holds; step 2: ``{b, m, r, nk}``
    with ``b`` parallel if eq. (27) holds; step 3: ``{m, b, r, nk}`` with ``b`` tiled by the
    largest ``Btl`` satisfying eq. (28). If even ``Btl = 1`` fails (never seen in the paper),
    the smallest tile is returned rather than discarding the kernel.
    """
    t = _positive("threads", threads)
    e = dtype_bytes
    bt, rt, nk = shape.bt, shape.r_out, shape.n * shape.r_in
    if t * _ways(bt * rt * e, cache) + t * _ways(rt * nk * e, cache) + _ways(bt * nk * e, cache) <= cache.assoc:
        return LoopOrder("mbr")
    if 1 + _ways(shape.m * rt * nk * e, cache) + t * _ways(nk * e, cache) <= cache.assoc:
        return LoopOrder("bmr")
    best = 1
    for btl in range(1, bt + 1):
        if t * _ways(btl * rt * e, cache) + t * _ways(rt * nk * e, cache) + _ways(btl * nk * e, cache) <= cache.assoc:
            best = btl
        else:
            break
    return LoopOrder("mbr", best)


# --------------------------------------------------------------------------- threads

#: §4.2.3 on the SpacemiT K1 (4 cores): FLOPs from which 2, 3, 4 threads pay off.
PAPER_THREAD_THRESHOLDS: tuple[int, ...] = (2_000_000, 4_000_000, 8_000_000)

#: A 2-core x86 host under load from other processes: two threads lose to one up to 8.4e6
#: FLOPs per einsum and are even (0.93x-1.33x) at 3.4e7, so the second thread starts at 3.2e7.
#: On an idle machine the crossover is likely lower; the TT benchmark's ``--threshold-sweep``
#: measures it (docs/tt_einsum.md).
HOST_THREAD_THRESHOLDS: tuple[int, ...] = (32_000_000,)


def threads_for(flops: int, *, thresholds: Sequence[int] = HOST_THREAD_THRESHOLDS,
                max_threads: int | None = None) -> int:
    """Threads for an einsum of ``flops``: 1 plus the number of thresholds reached.

    Parameters
    ----------
    flops : int
    thresholds : sequence of int
        Increasing FLOPs at which one more thread pays off.
    max_threads : int, optional
        Cap (e.g. the core count).
    """
    if flops < 0:
        raise ValueError(f"flops must be >= 0, got {flops}")
    if list(thresholds) != sorted(thresholds):
        raise ValueError(f"thresholds must be increasing, got {tuple(thresholds)}")
    n = 1 + sum(flops >= th for th in thresholds)
    return min(n, max_threads) if max_threads else n


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class EinsumPlan:
    """Every schedule decision for one einsum.

    Attributes
    ----------
    vec : int
        Vector width in elements along ``r`` (``k`` in the final einsum).
    block : RegisterBlock
    loop : LoopOrder
    threads : int
        1: serial; more: the loop of :class:`LoopOrder` is parallel.
    pair : int
        ``m`` values sharing one vector with the ``r`` lanes (first/middle einsums): a rank
        below the machine's lanes (``r = 8`` with 16 float lanes) fills a whole vector with
        ``pair = lanes / r`` consecutive ``m``; then ``block.rm`` counts groups of ``pair``.
    b_lanes : int
        Final einsum only: 0 for the paper's kernel (``k`` in vectors, a horizontal add per
        output); else the vector width along ``b``: a tile of ``X`` is transposed to
        ``[n*k, b]`` once and reused by every ``m``, and ``block.rm`` rows times ``block.rb``
        vectors of ``b`` accumulate with no horizontal add. Chosen when ``n*k`` is too short
        to amortise the horizontal adds.
    """

    vec: int
    block: RegisterBlock
    loop: LoopOrder
    threads: int
    pair: int = 1
    b_lanes: int = 0

    def __post_init__(self) -> None:
        _positive("EinsumPlan.pair", self.pair)
        if self.b_lanes < 0:
            raise ValueError(f"EinsumPlan.b_lanes must be >= 0, got {self.b_lanes}")
        if self.pair > 1 and self.block.rr != 1:
            raise ValueError(f"pair={self.pair} needs block.rr == 1, got {self.block.rr}")

    @property
    def pack(self) -> int:
        """Innermost packed extent of ``G``: ``V = vec * Rr`` (§4.3.4, ``{m, r/(2 vl), nk, 2 vl}``)."""
        return self.vec * self.block.rr


#: Final einsums with ``n * k`` up to this use the b-vector kernel (:attr:`EinsumPlan.b_lanes`):
#: on the Table 3 finals, n*k = 32..128 gain 1.4-8x, 1024 is even, 2048 and 7168 lose 2-10x.
B_VECTOR_MAX_NK = 256


def _b_vector_block(shape: EinsumShape, *, lanes: int, vector_registers: int) -> RegisterBlock:
    """``Rm`` rows x ``Rb`` vectors of ``b`` for the b-vector final kernel.

    Loads per tile and ``j = (n, k)`` step are ``Rm`` broadcasts of ``G`` plus ``Rb`` vectors of
    the transposed ``X`` (eqs. (20)-(21) with ``b`` in the role of ``r``); padding ``bt`` to
    ``lanes * Rb`` wastes lanes. Minimise total loads over divisors ``Rm`` of ``m`` under
    ``Rm * Rb + Rb + 1`` registers (eq. (19)).
    """
    best = None
    nvec = -(-shape.bt // lanes)
    for rb in range(1, min(nvec, 8) + 1):
        for rm in (d for d in range(1, min(shape.m, 16) + 1) if shape.m % d == 0):
            if rm * rb + rb + 1 > vector_registers:
                continue
            tiles_b = -(-nvec // rb)
            loads = (shape.m // rm) * tiles_b * (rm + rb)
            key = (loads, rm * rb + rb, -rm)
            if best is None or key < best[0]:
                best = (key, RegisterBlock(rm=rm, rb=rb))
    if best is None:
        raise ValueError(f"no b-vector register block fits {vector_registers} registers (needs at least 3)")
    return best[1]


def default_thresholds(target: HardwareTarget) -> tuple[int, ...]:
    """Thread thresholds for ``target``: the paper's for the Banana Pi, this machine's otherwise."""
    return PAPER_THREAD_THRESHOLDS if target.name == "bananapi-f3" else HOST_THREAD_THRESHOLDS


def plan_einsum(shape: EinsumShape, *, target: HardwareTarget | None = None,
                thresholds: Sequence[int] | None = None, threads: int | None = None,
                cache: L2Cache | None = None) -> EinsumPlan:
    """The paper's analytic schedule for ``shape`` on ``target`` (default: the host).

    Parameters
    ----------
    shape : EinsumShape
    target : HardwareTarget, optional
    thresholds : sequence of int, optional
        Thread thresholds; default :func:`default_thresholds` of the target.
    threads : int, optional
        Force a thread count instead of :func:`threads_for`.
    cache : L2Cache, optional
        Default :func:`l2_cache` of the target.
    """
    target = target or host()
    lanes = target.vector_lanes("float32")
    vec = _vector_width(shape, lanes)
    regs = target.vector_registers or 16
    pair = lanes // vec if shape.kind != "final" and vec == shape.r_out else 1
    if pair > 1 and shape.m % pair == 0:
        # m-pairs fill the vector: the model sees m / pair rows of pair * r lanes.
        paired = EinsumShape(m=shape.m // pair, bt=shape.bt, n=shape.n, r_out=shape.r_out * pair, r_in=shape.r_in)
        block = choose_register_block(paired, vector_registers=regs, vl=lanes, divisors_only=True)
    else:
        pair = 1
        block = choose_register_block(shape, vector_registers=regs, vl=vec, divisors_only=True)
    if thresholds is None:
        thresholds = default_thresholds(target)
    n_threads = threads if threads is not None else threads_for(shape.flops, thresholds=thresholds,
                                                                 max_threads=target.num_cores)
    n_threads = _positive("threads", n_threads)
    loop = choose_loop_order(shape, threads=n_threads, cache=cache or l2_cache(target))
    if loop.b_tile is not None:
        # The tile holds whole register blocks.
        loop = LoopOrder(loop.order, max(block.rb, loop.b_tile // block.rb * block.rb))
    b_lanes = 0
    if shape.kind == "final" and shape.n * shape.r_in <= B_VECTOR_MAX_NK:
        bblock = _b_vector_block(shape, lanes=lanes, vector_registers=regs)
        tiles = -(-shape.bt // (lanes * bblock.rb))
        if n_threads == 1 or tiles >= n_threads:
            block, b_lanes = bblock, lanes
    return EinsumPlan(vec, block, loop, n_threads, pair, b_lanes)


# --------------------------------------------------------------------------- packing of G


def core_layout(shape: EinsumShape, *, plan: EinsumPlan) -> Layout:
    """Array packing of the core (§4.3.1): ``(r, n, m, k) -> (m, r / V, n * k, V)``.

    For the final einsum (``r = 1``, ``k`` vectorised) it is ``(m, n * k)``.
    """
    lay = Layout(shape.core_shape).reorder([2, 0, 1, 3])  # (m, r, n, k)
    if shape.kind == "final":
        return lay.fuse([1, 2, 3])  # (m, n*k): k contiguous for the k-vectors
    v = plan.pack
    if shape.r_out % v:
        raise ValueError(f"pack width {v} does not divide r_out={shape.r_out}")
    if plan.pair > 1:
        p = plan.pair
        if shape.m % p or v != shape.r_out:
            raise ValueError(f"pair {p} needs m % pair == 0 and one r-vector, got m={shape.m}, r={shape.r_out}, V={v}")
        # (m/P, P, r, n, k) -> (m/P, n, k, P, r) -> (m/P, n*k, P*r)
        return lay.split(0, [shape.m // p, p]).reorder([0, 3, 4, 1, 2]).fuse([1, 2]).fuse([2, 3])
    # (m, r/V, V, n, k) -> (m, r/V, n, k, V) -> (m, r/V, n*k, V)
    return lay.split(1, [shape.r_out // v, v]).reorder([0, 1, 3, 4, 2]).fuse([2, 3])


def pack_core(core: np.ndarray, *, shape: EinsumShape, plan: EinsumPlan | None) -> np.ndarray:
    """The core in the kernel's packed layout (offline, NumPy); ``plan=None``: unchanged."""
    core = np.asarray(core, np.float32)
    if core.shape != shape.core_shape:
        raise ValueError(f"core has shape {core.shape}, the einsum expects {shape.core_shape}")
    if plan is None:
        return np.ascontiguousarray(core)
    return np.ascontiguousarray(core_layout(shape, plan=plan).apply(core))


# --------------------------------------------------------------------------- TE


def _einsum_te(shape: EinsumShape, g: te.Tensor, read: Callable[[Any, Any, Any], Any], name: str,
               split_k: bool | int, b_pad: int = 0) -> list[te.Tensor]:
    """``Y[m, b, r] = sum G[r, n, m, k] X(b, n, k)``; with ``split_k`` (True or the lane count,
    a multiple of ``k`` dividing ``n * k``) the final einsum's vectorised ``k`` goes to an
    explicit partial-sum stage, then a horizontal add; with
    ``b_pad`` (b-vector final kernel) ``X`` is transposed to ``[n*k, b_pad]`` (zeros past
    ``bt``), accumulated as ``[m, b_pad]`` and, if padded, copied to ``Y``."""
    if b_pad:
        k_, nk, bt = shape.r_in, shape.n * shape.r_in, shape.bt
        zero = te.const(0.0, "float32")
        xt = te.compute((nk, b_pad), lambda j, b: te.if_then_else(b < bt, read(b, j // k_, j % k_), zero),
                        name=f"{name}_xt")
        rj = te.reduce_axis((0, nk), name="j")
        acc_shape = shape.output_shape if b_pad == bt else (shape.m, b_pad, 1)
        acc = te.compute(acc_shape, lambda m, b, r: te.sum(g[0, rj // k_, m, rj % k_] * xt[rj, b], axis=rj),
                         name=name if b_pad == bt else f"{name}_acc")
        if b_pad == bt:
            return [xt, acc]
        return [xt, acc, te.compute(shape.output_shape, lambda m, b, r: acc[m, b, r], name=name)]
    rn = te.reduce_axis((0, shape.n), name="n")
    if split_k:
        # Partial sums over lanes l of j = (n, k) = jo * L + l, contiguous in G' and X; L = k,
        # or a multiple of k (whole n in one vector) when the machine's vector is longer.
        k_ = shape.r_in
        width = split_k if split_k is not True and split_k > 1 else k_
        rj = te.reduce_axis((0, shape.n * k_ // width), name="n")

        def term(m, b, lane):
            j = rj * width + lane
            return g[0, j // k_, m, j % k_] * read(b, j // k_, j % k_)

        part = te.compute((shape.m, shape.bt, width), lambda m, b, lane: te.sum(term(m, b, lane), axis=rj),
                          name=f"{name}_part")
        rk = te.reduce_axis((0, width), name="k")
        out = te.compute(shape.output_shape, lambda m, b, r: te.sum(part[m, b, rk], axis=rk), name=name)
        return [part, out]
    if shape.r_in == 1:  # first einsum: no k loop (Listing 2 with rt_1 = 1)
        out = te.compute(shape.output_shape, lambda m, b, r: te.sum(g[r, rn, m, 0] * read(b, rn, 0), axis=rn),
                         name=name)
        return [out]
    rk = te.reduce_axis((0, shape.r_in), name="k")
    out = te.compute(shape.output_shape,
                     lambda m, b, r: te.sum(g[r, rn, m, rk] * read(b, rn, rk), axis=[rn, rk]), name=name)
    return [out]


def _split(sch: tvm.s_tir.Schedule, loop: Any, factor: int) -> tuple[Any, Any]:
    outer, inner = sch.split(loop, [None, factor])
    return outer, inner


def _schedule(sch: tvm.s_tir.Schedule, shape: EinsumShape, plan: EinsumPlan, name: str) -> None:
    """Vectorise, register-block, order, tile and parallelise one einsum inside ``sch``."""
    blk = plan.block
    if plan.b_lanes:
        _schedule_b_vector(sch, shape, plan, name)
        return
    block = sch.get_sblock(name)
    if shape.kind == "final":
        # Partial sums over n with k in vectors (the rf stage), then one horizontal add per
        # (m, b), computed right after each register block while the partials are in registers.
        part = sch.get_sblock(f"{name}_part")
        m, b, k, n = sch.get_loops(part)
        mo, mi = _split(sch, m, blk.rm)
        bo, bi = _split(sch, b, blk.rb)
        ko, kv = _split(sch, k, plan.vec)
        outer = [bo, mo] if plan.loop.order == "bmr" else [mo, bo]
        sch.reorder(*outer, n, mi, bi, ko, kv)
        sch.set_scope(part, 0, "local")
        sch.reverse_compute_at(block, outer[-1])
        _parallel(sch, outer, plan.threads)
        sch.vectorize(kv)
        for loop in (ko, bi, mi):
            sch.unroll(loop)
        init = sch.decompose_reduction(part, n)
        sch.vectorize(sch.get_loops(init)[-1])
        return
    m, b, r, *red = sch.get_loops(block)
    pair = plan.pair
    if pair > 1:
        mo, mi, mp = sch.split(m, [None, blk.rm, pair])
    else:
        mo, mi = _split(sch, m, blk.rm)
    if plan.loop.b_tile is not None and plan.loop.b_tile < shape.bt:
        bt_, b = _split(sch, b, plan.loop.b_tile)
    else:
        bt_ = None
    bo, bi = _split(sch, b, blk.rb)
    ro, rr, rv = sch.split(r, [None, blk.rr, plan.vec])
    outer = [bo, mo] if plan.loop.order == "bmr" else [mo, bo]
    if bt_ is not None:
        outer = [bt_, *outer]
    if pair > 1:
        sch.reorder(*outer, ro, *red, mi, bi, rr, mp, rv)
    else:
        sch.reorder(*outer, ro, *red, mi, bi, rr, rv)
    # Accumulators in registers: a local block written back once per (m, b, r) block.
    acc = sch.cache_write(block, 0, "local")
    if pair > 1:
        # (m, b, r) -> (m/P, b, P, r): the P m-values of one vector are adjacent in the accumulator.
        sch.transform_layout(block, ("write", 0), lambda m_, b_, r_: (m_ // pair, b_, m_ % pair, r_))
        rv = sch.fuse(mp, rv)
    sch.reverse_compute_at(acc, ro)
    par = outer[1:] if bt_ is not None else outer
    _parallel(sch, par, plan.threads)
    for loop in (mi, bi, rr):
        sch.unroll(loop)
    sch.vectorize(rv)
    sch.vectorize(sch.get_loops(acc)[-1])
    # Decompose last: vectorize refuses a loop over a reduction update without its init.
    init = sch.decompose_reduction(block, red[0])
    sch.vectorize(sch.get_loops(init)[-1])


def _split_k(shape: EinsumShape, plan: EinsumPlan | None) -> int:
    """Lanes of the final einsum's partial-sum stage (0: no such stage)."""
    if plan is None or shape.kind != "final" or plan.b_lanes:
        return 0
    return plan.vec


def _b_padded(shape: EinsumShape, plan: EinsumPlan | None) -> int:
    """Padded ``b`` extent of the b-vector final kernel (0 if the plan does not use it)."""
    if plan is None or not plan.b_lanes:
        return 0
    tile = plan.b_lanes * plan.block.rb
    return -(-shape.bt // tile) * tile


def _schedule_b_vector(sch: tvm.s_tir.Schedule, shape: EinsumShape, plan: EinsumPlan, name: str) -> None:
    """``{b/(V Rb), m/Rm, j, Rm, Rb, V}``: the transposed ``X`` tile is built once per ``b`` tile."""
    blk, lanes = plan.block, plan.b_lanes
    padded = _b_padded(shape, plan) != shape.bt
    acc_name = f"{name}_acc" if padded else name
    block = sch.get_sblock(acc_name)
    m, b, r, j = sch.get_loops(block)
    mo, mi = _split(sch, m, blk.rm)
    bo, bi, bv = sch.split(b, [None, blk.rb, lanes])
    sch.reorder(bo, mo, r, j, mi, bi, bv)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, mo)
    xt = sch.get_sblock(f"{name}_xt")
    sch.compute_at(xt, bo)
    if plan.threads > 1:
        sch.parallel(bo)
    sch.unroll(mi)
    sch.unroll(bi)
    sch.vectorize(bv)
    wl = sch.get_loops(local)
    _, wv = _split(sch, sch.fuse(wl[-2], wl[-1]), lanes)
    sch.vectorize(wv)
    init = sch.decompose_reduction(block, j)
    sch.vectorize(sch.get_loops(init)[-1])
    if padded:
        copy = sch.get_sblock(name)
        if plan.threads > 1:
            sch.parallel(sch.get_loops(copy)[0])


def _parallel(sch: tvm.s_tir.Schedule, loops: list, threads: int) -> None:
    if threads <= 1:
        return
    # The first loop in order is parallel (m for {m,b,r,nk}, b for {b,m,r,nk}); fuse the second in
    # when the first is too short to balance the threads.
    extent = int(sch.get(loops[0]).extent)
    if extent < 4 * threads and len(loops) > 1:
        sch.parallel(sch.fuse(loops[0], loops[1]))
    else:
        sch.parallel(loops[0])


# --------------------------------------------------------------------------- single einsum


@dataclass(frozen=True)
class EinsumKernel:
    """One einsum: its (scheduled) module and the packing its core needs.

    Attributes
    ----------
    shape : EinsumShape
    plan : EinsumPlan or None
        ``None`` for the naive (unscheduled, unpacked) build.
    mod : tvm.IRModule
        ``main(X[bt, n, k], G_packed, Y[m, bt, r])``.
    """

    shape: EinsumShape
    plan: EinsumPlan | None
    mod: Any = field(hash=False, compare=False)

    def pack(self, core: np.ndarray) -> np.ndarray:
        """The core as the kernel reads it."""
        return pack_core(core, shape=self.shape, plan=self.plan)

    def compile(self, target: HardwareTarget | None = None) -> Any:
        """:func:`alt_tvm.lowering.compile` for ``target`` (default: the host)."""
        return lowering.compile(self.mod, target=(target or host()).to_tvm())


def build_einsum(shape: EinsumShape, *, plan: EinsumPlan | None = None, optimized: bool = True,
                 target: HardwareTarget | None = None) -> EinsumKernel:
    """TE + schedule of one einsum ``"rnmk,bnk->mbr"``.

    Parameters
    ----------
    shape : EinsumShape
    plan : EinsumPlan, optional
        Default :func:`plan_einsum` for ``target``.
    optimized : bool
        ``False``: the naive TE kernel (canonical layouts, no schedule), the paper's baseline.
    target : HardwareTarget, optional
        Used for the default plan (host by default).
    """
    x = te.placeholder(shape.input_shape, name="X")
    g = te.placeholder(shape.core_shape, name="G")
    if not optimized:
        outs = _einsum_te(shape, g, lambda b, n, k: x[b, n, k], "Y", split_k=False)
        return EinsumKernel(shape, None, tvm.IRModule({"main": te.create_prim_func([x, g, outs[-1]])}))
    plan = plan or plan_einsum(shape, target=target)
    outs = _einsum_te(shape, g, lambda b, n, k: x[b, n, k], "Y", split_k=_split_k(shape, plan),
                      b_pad=_b_padded(shape, plan))
    func = create_prim_func([x, g, outs[-1]], layouts={g: core_layout(shape, plan=plan)})
    sch = tvm.s_tir.Schedule(func)
    _schedule(sch, shape, plan, "Y")
    return EinsumKernel(shape, plan, sch.mod)


def einsum_reference(core: np.ndarray, x: np.ndarray) -> np.ndarray:
    """NumPy ``einsum("rnmk,bnk->mbr", core, x)``."""
    return np.einsum("rnmk,bnk->mbr", core, x)


# --------------------------------------------------------------------------- the chain


def chain_shapes(*, in_factors: Sequence[int], out_factors: Sequence[int], ranks: Sequence[int],
                 batch: int) -> list[EinsumShape]:
    """Einsum shapes of Listing 1 in execution order (core ``d`` first).

    Einsum ``t`` reads ``B * n_1..n_t * m_{t+1}..m_d * r_t`` elements as ``(b_t, n_t, r_t)``.
    """
    d = len(in_factors)
    if d < 1 or len(out_factors) != d or len(ranks) != d + 1:
        raise ValueError(f"need len(in_factors) == len(out_factors) == len(ranks) - 1 >= 1, got "
                         f"{tuple(in_factors)}, {tuple(out_factors)}, {tuple(ranks)}")
    if ranks[0] != 1 or ranks[-1] != 1:
        raise ValueError(f"ranks must start and end with 1, got {tuple(ranks)}")
    batch = _positive("batch", batch)
    shapes = []
    for t in reversed(range(d)):
        bt = batch * math.prod(in_factors[:t]) * math.prod(out_factors[t + 1:])
        shapes.append(EinsumShape(m=int(out_factors[t]), bt=int(bt), n=int(in_factors[t]),
                                  r_out=int(ranks[t]), r_in=int(ranks[t + 1])))
    return shapes


@dataclass(frozen=True)
class TTChain:
    """A TT layer as one PrimFunc: ``main(x[B, N], G_d', ..., G_1', bias[M], y[B, M])``.

    Attributes
    ----------
    shapes : list of EinsumShape
        Execution order (core ``d`` first).
    plans : list of EinsumPlan or None
        ``None`` entries: naive stages.
    mod : tvm.IRModule
    batch, n_in, n_out : int
    """

    shapes: tuple[EinsumShape, ...]
    plans: tuple[EinsumPlan | None, ...]
    batch: int
    n_in: int
    n_out: int
    mod: Any = field(hash=False, compare=False)

    @property
    def flops(self) -> int:
        """Einsum FLOPs plus the bias (eq. (14)) for the whole batch."""
        return sum(s.flops for s in self.shapes) + self.batch * self.n_out

    def pack(self, cores: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Packed cores in argument order (``G_d`` first) from ``G_1..G_d``."""
        if len(cores) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} cores, got {len(cores)}")
        return [pack_core(c, shape=s, plan=p) for c, s, p in zip(reversed(cores), self.shapes, self.plans)]

    def compile(self, target: HardwareTarget | None = None) -> Any:
        return lowering.compile(self.mod, target=(target or host()).to_tvm())


def _unravel(flat: Any, dims: Sequence[int]) -> list[Any]:
    """Row-major multi-index of ``flat`` over ``dims`` (``//`` and ``%`` that TVM folds back)."""
    idx = []
    for d in reversed(dims[1:]):
        idx.append(flat % d)
        flat = flat // d
    idx.append(flat)
    return idx[::-1]


def _flat(idx: Sequence[Any], dims: Sequence[int]) -> Any:
    flat = idx[0]
    for i, d in zip(idx[1:], dims[1:]):
        flat = flat * d + i
    return flat


def build_chain(*, in_factors: Sequence[int], out_factors: Sequence[int], ranks: Sequence[int], batch: int,
                optimized: bool = True, target: HardwareTarget | None = None,
                thresholds: Sequence[int] | None = None, threads: int | None = None,
                input_shape: Sequence[int] | None = None,
                epilogue: Callable[[te.Tensor], tuple[Sequence[te.Tensor], Sequence[te.Tensor]]] | None = None,
                ) -> TTChain:
    """The einsum chain of Listing 1 plus bias (and an element-wise epilogue) as one PrimFunc.

    Reshapes are fused by indexing (§4.3.2): einsum ``t`` reads the previous output at flat
    position ``(b * n_t + n) * r_t + k`` through an unravel that TVM folds back to that
    affine form. The final output ``[m_1, .., m_d, B]`` is written to ``y[B, M]`` with the
    bias added in a last, cheap stage.

    Parameters
    ----------
    in_factors, out_factors, ranks : sequence of int
        As in :class:`~alt_tvm.strategies.tt.dse.TTSolution`.
    batch : int
        Rows of the layer: the product of the activation's leading dimensions.
    optimized : bool
        ``False``: naive TE (no packing, no schedule).
    target : HardwareTarget, optional
    thresholds : sequence of int, optional
        Thread thresholds per einsum (default :func:`default_thresholds`).
    threads : int, optional
        Force the thread count of every einsum.
    input_shape : sequence of int, optional
        The activation's shape ``(*lead, N)`` with ``prod(lead) == batch`` (default
        ``(batch, N)``), e.g. ``(B, S, N)`` in a transformer. The leading dimensions are
        flattened by indexing, not copied; ``y`` has shape ``(*lead, M)``.
    epilogue : callable, optional
        ``epilogue(y) -> (stages, inputs)``: element-wise TE stages applied after the biased
        output ``y`` (the last stage is the function's output) and the placeholders they
        read, which become arguments after ``bias``. Intermediate stages are inlined.

    Returns
    -------
    TTChain
        ``main(x, G_d', ..., G_1', bias[M], *inputs, out)``.
    """
    shapes = chain_shapes(in_factors=in_factors, out_factors=out_factors, ranks=ranks, batch=batch)
    n_in, n_out = math.prod(in_factors), math.prod(out_factors)
    if input_shape is None:
        input_shape = (batch, n_in)
    input_shape = tuple(_positive("input_shape", d) for d in input_shape)
    if len(input_shape) < 2 or input_shape[-1] != n_in or math.prod(input_shape[:-1]) != batch:
        raise ValueError(f"input_shape must be (*lead, N) with N = {n_in} and prod(lead) = batch = {batch}, "
                         f"got {input_shape}")
    lead = input_shape[:-1]
    target = target or host()
    plans = [plan_einsum(s, target=target, thresholds=thresholds, threads=threads) if optimized else None
             for s in shapes]
    x = te.placeholder(input_shape, name="x")
    bias = te.placeholder((n_out,), name="bias")
    cores, layouts, stages = [], {}, []

    def read_x(row: Any, col: Any) -> Any:
        return x[(*_unravel(row, lead), col)]

    def reader(prev: te.Tensor | None, prev_shape: EinsumShape | None, shape: EinsumShape):
        if prev is None:
            return lambda b, n, k: read_x((b * shape.n + n) // n_in, (b * shape.n + n) % n_in)
        # The previous output (m', b', r) viewed as (b, n, r): flat row b * n_t + n = m' * b'_t + b'.
        return lambda b, n, k: prev[(b * shape.n + n) // prev_shape.bt, (b * shape.n + n) % prev_shape.bt, k]

    prev, prev_shape = None, None
    for i, (shape, plan) in enumerate(zip(shapes, plans)):
        t = len(shapes) - i  # core index 1..d
        g = te.placeholder(shape.core_shape, name=f"G{t}")
        cores.append(g)
        if plan is not None:
            layouts[g] = core_layout(shape, plan=plan)
        outs = _einsum_te(shape, g, reader(prev, prev_shape, shape), f"E{t}", split_k=_split_k(shape, plan),
                          b_pad=_b_padded(shape, plan))
        stages.append(f"E{t}")
        prev, prev_shape = outs[-1], shape
    last = prev
    m1 = int(out_factors[0])
    rest = n_out // m1
    y = te.compute((*lead, n_out), lambda *i: last[i[-1] // rest, (i[-1] % rest) * batch + _flat(i[:-1], lead), 0]
                   + bias[i[-1]], name="y")
    out, extra, inline = y, [], []
    if epilogue is not None:
        ep_stages, extra = epilogue(y)
        ep_stages, extra = list(ep_stages), list(extra)
        if not ep_stages:
            raise ValueError("epilogue returned no stages")
        out = ep_stages[-1]
        inline = [y, *ep_stages[:-1]]
    func = create_prim_func([x, *cores, bias, *extra, out], layouts=layouts)
    sch = tvm.s_tir.Schedule(func)
    if optimized:
        for shape, plan, name in zip(shapes, plans, stages):
            _schedule(sch, shape, plan, name)
    for stage in inline:
        # Element-wise stages fold into the output loop (a stage read twice stays separate).
        try:
            sch.compute_inline(sch.get_sblock(stage.op.name))
        except tvm.error.TVMError:
            pass
    if optimized:
        loops = sch.get_loops(sch.get_sblock(out.op.name))
        if batch == 1 and len(loops) == len(out.shape) and int(out.shape[-1]) == n_out:
            _, yv = _split(sch, loops[-1], math.gcd(n_out, target.vector_lanes("float32")))
            sch.vectorize(yv)
    return TTChain(tuple(shapes), tuple(plans), batch, n_in, n_out, sch.mod)
