"""Design-space exploration (DSE) of tensor-train (TT) factorised FC layers (Anthimopoulos et al., §2, §4).

An FC layer ``y = W x + b`` with ``N`` inputs and ``M`` outputs (the paper writes its shape as
``[N, M]``, e.g. LeNet300's ``[784, 300]``) is replaced by a chain of ``d`` einsums over TT cores
``G_t`` of shape ``r_{t-1} x n_t x m_t x r_t`` with ``N = prod n_t``, ``M = prod m_t`` and
``r_0 = r_d = 1``. The design space is every pair of equal-length factorisations together with
every choice of intermediate ranks; it is pruned in the paper's order:

1. ``all``: ordered factorisations (factors >= 2, ``d >= 2``), each intermediate rank ``r_t``
   ranging independently over ``1..min(A_t, MN / A_t)`` with ``A_t = prod_{i<=t} m_i n_i``
   (the TT-rank bound of the unfolding at cut ``t``).
2. ``alignment`` (Definition 1, Proposition 4): one permutation per multiset pair, the aligned one
   (``m`` non-increasing, ``n`` non-decreasing), ranks as in step 1.
3. ``vectorization`` (§4.2.1): ranks are uniform (``r_t = R``, the paper's "hereafter R") and a
   multiple of the vector length ``vl``, up to the smallest rank bound of the shape.
4. ``initial_layer`` (§4.2.2): keep a solution only if both its FLOPs (eq. (11)) and parameters
   (eq. (4)) are below the dense layer's ``2MN + M`` and ``MN + M``.
5. ``scalability`` (§4.2.3, second step): drop solutions with a long combination
   (``d > max_length``) *and* poor scalability (the heaviest einsum below ``8e6`` FLOPs).

These conventions reproduce the first four columns of most rows
of Tables 1-2 to the printed two digits. The scalability text is ambiguous ("exceeding four
(d>5)"); ``max_length=4`` (drop ``d > 4``) is the default because it reproduces the rows where
the two readings differ (e.g. ``[784, 300]``: 5.6E+02, ``[512, 512]``: 3.2E+02, ``[4096, 2048]``:
3.1E+03), while ``d > 5`` does not (5.7E+02, 3.6E+02, 3.7E+03).

Nothing is materialised before the vectorization step: ``all`` is a dynamic programme over
prefix products, ``alignment`` a product of independent rank ranges per aligned shape, and the
later steps use that FLOPs and parameters grow monotonically with ``R`` (so survivors form a
prefix of the rank range, found by bisection). :func:`solutions` materialises survivors only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache

STAGES: tuple[str, ...] = ("all", "alignment", "vectorization", "initial_layer", "scalability")

#: Heaviest-einsum FLOPs below which a long solution counts as poorly scalable (§4.2.3: above
#: 8e6 FLOPs four threads pay off on the paper's 4-core cluster).
POOR_SCALABILITY_FLOPS: int = 8_000_000


@dataclass(frozen=True)
class DSEConfig:
    """Pruning parameters of the TT design-space exploration.

    Parameters
    ----------
    vl : int
        Vector length in elements; ranks must be multiples of it (§4.2.1). 8 is a 256-bit RVV
        register of float32.
    max_length : int
        Scalability rule (§4.2.3): solutions with ``d > max_length`` whose heaviest einsum has
        fewer than ``min_heavy_flops`` FLOPs are dropped. 4 reads "exceeding four" literally
        and reproduces the tables; 5 reads the formula "(d>5)".
    min_heavy_flops : int
        Poor-scalability threshold on the heaviest einsum's FLOPs.
    """

    vl: int = 8
    max_length: int = 4
    min_heavy_flops: int = POOR_SCALABILITY_FLOPS

    def __post_init__(self) -> None:
        # bool is an int subclass; a vector length of True is a typo, not 1.
        if isinstance(self.vl, bool) or not isinstance(self.vl, int) or self.vl < 1:
            raise ValueError(f"vl must be an integer >= 1, got {self.vl!r}")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2, got {self.max_length!r}")
        if self.min_heavy_flops < 0:
            raise ValueError(f"min_heavy_flops must be >= 0, got {self.min_heavy_flops!r}")


DEFAULT_CONFIG = DSEConfig()


@dataclass(frozen=True)
class TTSolution:
    """One TT factorisation of an FC layer.

    Attributes
    ----------
    in_factors : tuple of int
        ``(n_1, ..., n_d)``, ``prod = N`` (aligned: non-decreasing).
    out_factors : tuple of int
        ``(m_1, ..., m_d)``, ``prod = M`` (aligned: non-increasing).
    ranks : tuple of int
        ``(r_0, ..., r_d)`` with ``r_0 = r_d = 1``.
    flops : int
        Total FLOPs, eq. (11)/(14), bias included.
    params : int
        Parameters, eq. (4), bias included.
    einsum_flops : tuple of int
        ``FLOPs^(t)`` of eq. (13) for ``t = 1..d`` (the chain runs ``t = d`` first).
    """

    in_factors: tuple[int, ...]
    out_factors: tuple[int, ...]
    ranks: tuple[int, ...]
    flops: int
    params: int
    einsum_flops: tuple[int, ...]

    @property
    def d(self) -> int:
        """Combination length (number of cores / einsums)."""
        return len(self.in_factors)

    @property
    def rank(self) -> int:
        """The uniform intermediate rank ``R`` (max of the ranks)."""
        return max(self.ranks)

    def to_dict(self) -> dict:
        """JSON-friendly form."""
        return {
            "in_factors": list(self.in_factors),
            "out_factors": list(self.out_factors),
            "ranks": list(self.ranks),
            "rank": self.rank,
            "d": self.d,
            "flops": self.flops,
            "params": self.params,
            "einsum_flops": list(self.einsum_flops),
        }


# --------------------------------------------------------------------------- formulas


def _check_shape(in_factors: Sequence[int], out_factors: Sequence[int], ranks: Sequence[int]) -> int:
    d = len(in_factors)
    if d < 1 or len(out_factors) != d:
        raise ValueError(f"in_factors {tuple(in_factors)} and out_factors {tuple(out_factors)} need equal length >= 1")
    if len(ranks) != d + 1:
        raise ValueError(f"ranks {tuple(ranks)} must have length d + 1 = {d + 1}")
    return d


def einsum_flops(in_factors: Sequence[int], out_factors: Sequence[int], ranks: Sequence[int]) -> tuple[int, ...]:
    """FLOPs of each einsum, eq. (13): ``FLOPs^(t) = 2 r_t r_{t-1} m_t...m_d n_1...n_t``.

    Eqs. (6)/(9) are the ``t = d`` case (the first einsum executed) and eq. (10) its ``r_d = 1``
    simplification.

    Parameters
    ----------
    in_factors, out_factors : sequence of int
        ``(n_1..n_d)`` and ``(m_1..m_d)``.
    ranks : sequence of int
        ``(r_0..r_d)``.

    Returns
    -------
    tuple of int
        ``(FLOPs^(1), ..., FLOPs^(d))``.
    """
    d = _check_shape(in_factors, out_factors, ranks)
    return tuple(
        2 * ranks[t + 1] * ranks[t] * math.prod(out_factors[t:]) * math.prod(in_factors[: t + 1]) for t in range(d)
    )


def tt_flops(in_factors: Sequence[int], out_factors: Sequence[int], ranks: Sequence[int]) -> int:
    """Total FLOPs of a TT layer, eqs. (5), (11), (14): ``M + sum_t FLOPs^(t)``."""
    return math.prod(out_factors) + sum(einsum_flops(in_factors, out_factors, ranks))


def tt_params(in_factors: Sequence[int], out_factors: Sequence[int], ranks: Sequence[int]) -> int:
    """Parameters of a TT layer, eq. (4): ``M + sum_i r_{i-1} m_i n_i r_i`` (bias + cores)."""
    d = _check_shape(in_factors, out_factors, ranks)
    return math.prod(out_factors) + sum(ranks[i] * out_factors[i] * in_factors[i] * ranks[i + 1] for i in range(d))


def dense_flops(n: int, m: int) -> int:
    """FLOPs of the dense layer (MVM plus bias), ``2MN + M`` (§4.2.2)."""
    return 2 * m * n + m


def dense_params(n: int, m: int) -> int:
    """Parameters of the dense layer, ``MN + M`` (§2, "Computing the number of parameters")."""
    return m * n + m


def rank_bounds(in_factors: Sequence[int], out_factors: Sequence[int]) -> tuple[int, ...]:
    """Upper bounds of the intermediate ranks ``r_1..r_{d-1}``.

    ``r_t <= min(A_t, MN / A_t)`` with ``A_t = prod_{i<=t} m_i n_i``: the rank of the
    unfolding of ``W`` at cut ``t`` (a larger TT rank adds parameters but no expressiveness).
    """
    mn = math.prod(in_factors) * math.prod(out_factors)
    out, a = [], 1
    for t in range(len(in_factors) - 1):
        a *= in_factors[t] * out_factors[t]
        out.append(min(a, mn // a))
    return tuple(out)


# --------------------------------------------------------------------------- factorisations


def _divisors(x: int) -> tuple[int, ...]:
    small = [k for k in range(1, math.isqrt(x) + 1) if x % k == 0]
    return tuple(sorted(set(small + [x // k for k in small])))


def _multiset_factorizations(x: int) -> list[tuple[int, ...]]:
    """Unordered factorisations of ``x`` (factors >= 2, length >= 1) as non-increasing tuples."""
    out: list[tuple[int, ...]] = []
    divs = _divisors(x)

    def rec(rem: int, cap: int, cur: tuple[int, ...]) -> None:
        if rem == 1:
            out.append(cur)
            return
        for f in divs:
            if f > cap or f > rem:
                break
            if f >= 2 and rem % f == 0:
                rec(rem // f, f, cur + (f,))

    rec(x, x, ())
    return out


def _validate_layer(n: int, m: int) -> None:
    for name, v in (("n", n), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an integer, got {v!r}")
        if v < 4:
            raise ValueError(f"{name}={v} is too small to factorise (need >= 4)")
        if len(_divisors(v)) == 2:
            raise ValueError(f"{name}={v} is prime: it has no factorisation into >= 2 factors")


def aligned_shapes(n: int, m: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Aligned combination shapes (Definition 1), one per multiset pair, ``d >= 2``.

    Yields ``(in_factors, out_factors)`` with ``n_1 <= ... <= n_d`` and ``m_1 >= ... >= m_d``.
    """
    _validate_layer(n, m)
    by_len_n: dict[int, list[tuple[int, ...]]] = {}
    for f in _multiset_factorizations(n):
        by_len_n.setdefault(len(f), []).append(f[::-1])
    by_len_m: dict[int, list[tuple[int, ...]]] = {}
    for f in _multiset_factorizations(m):
        by_len_m.setdefault(len(f), []).append(f)
    for d in sorted(set(by_len_n) & set(by_len_m)):
        if d < 2:  # d = 1 is the dense layer itself, not a factorisation
            continue
        for ins in by_len_n[d]:
            for outs in by_len_m[d]:
                yield ins, outs


def _count_all(n: int, m: int) -> int:
    """Ordered factorisation pairs weighted by their rank-range sizes, by DP over prefixes.

    The weight of a cut depends only on the prefix products ``(prod m_i, prod n_i)``, so the
    number of states is ``#div(M) * #div(N)`` however many sequences there are.
    """
    mn = m * n
    dm = [k for k in _divisors(m) if k >= 2]
    dn = [k for k in _divisors(n) if k >= 2]

    @cache
    def ways(pm: int, pn: int) -> int:
        if pm == m and pn == n:
            return 1
        rm, rn = m // pm, n // pn
        total = 0
        for a in dm:
            if a > rm:
                break
            if rm % a:
                continue
            for b in dn:
                if b > rn:
                    break
                if rn % b:
                    continue
                qm, qn = pm * a, pn * b
                if qm == m and qn == n:
                    total += 1
                elif qm != m and qn != n:  # both sequences must end together
                    cut = qm * qn
                    total += min(cut, mn // cut) * ways(qm, qn)
        return total

    total = ways(1, 1) - 1  # minus the d = 1 "factorisation" (M, N)
    ways.cache_clear()
    return total


# --------------------------------------------------------------------------- uniform-rank pruning


class _UniformShape:
    """Closed forms for one aligned shape with uniform rank ``R`` (``r_0 = r_d = 1``)."""

    __slots__ = ("ins", "outs", "d", "m", "bound", "s", "p_edge", "p_mid", "f_edge", "f_mid")

    def __init__(self, ins: tuple[int, ...], outs: tuple[int, ...]) -> None:
        self.ins, self.outs, self.d = ins, outs, len(ins)
        self.m = math.prod(outs)
        self.bound = min(rank_bounds(ins, outs))
        # s_t = m_t..m_d n_1..n_t, so FLOPs^(t) = 2 r_t r_{t-1} s_t (eq. (13)).
        self.s = [math.prod(outs[t:]) * math.prod(ins[: t + 1]) for t in range(self.d)]
        # With uniform R the edge einsums (t = 1, d) scale with R and the inner ones with R^2.
        self.f_edge = 2 * (self.s[0] + self.s[-1])
        self.f_mid = 2 * sum(self.s[1:-1])
        self.p_edge = outs[0] * ins[0] + outs[-1] * ins[-1]
        self.p_mid = sum(outs[t] * ins[t] for t in range(1, self.d - 1))

    def flops(self, r: int) -> int:
        return self.m + r * self.f_edge + r * r * self.f_mid

    def params(self, r: int) -> int:
        return self.m + r * self.p_edge + r * r * self.p_mid

    def heaviest(self, r: int) -> int:
        # d >= 2: edge einsums carry one rank, inner ones two.
        return max(2 * r * (r if 0 < t < self.d - 1 else 1) * st for t, st in enumerate(self.s))

    def ranks(self, r: int) -> tuple[int, ...]:
        return (1,) + (r,) * (self.d - 1) + (1,)


def _last_true(k_max: int, pred) -> int:
    """Largest ``k`` in ``0..k_max`` with ``pred(k)`` (``pred`` monotone decreasing, ``pred(0)``)."""
    lo, hi = 0, k_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _survivors(sh: _UniformShape, n: int, config: DSEConfig) -> tuple[int, int, int]:
    """Number of multiples of ``vl`` (as ``k``) surviving vectorization, initial-layer, scalability.

    Survivors of each step are a prefix ``R = vl..k*vl``: FLOPs, parameters and the heaviest
    einsum all increase with ``R``. Scalability drops ``R <= k_poor*vl`` for long shapes.
    """
    vl = config.vl
    k_vec = sh.bound // vl
    fd, pd = dense_flops(n, sh.m), dense_params(n, sh.m)
    k_init = _last_true(k_vec, lambda k: k == 0 or (sh.flops(k * vl) < fd and sh.params(k * vl) < pd))
    k_poor = 0
    if sh.d > config.max_length:
        k_poor = _last_true(k_init, lambda k: k == 0 or sh.heaviest(k * vl) < config.min_heavy_flops)
    return k_vec, k_init, k_init - k_poor


# --------------------------------------------------------------------------- public API


def count(n: int, m: int, *, config: DSEConfig = DEFAULT_CONFIG) -> dict[str, int]:
    """Size of the design space after each pruning step.

    Parameters
    ----------
    n : int
        Input features ``N`` (first entry of the paper's ``[N, M]``).
    m : int
        Output features ``M``.
    config : DSEConfig
        Vector length and scalability rule.

    Returns
    -------
    dict
        Exact integer counts under keys ``all``, ``alignment``, ``vectorization``,
        ``initial_layer``, ``scalability`` (see the module docstring for the conventions).

    Raises
    ------
    ValueError
        If ``n`` or ``m`` is below 4 or prime, or ``config`` is invalid.
    """
    _validate_layer(n, m)
    counts = dict.fromkeys(STAGES, 0)
    counts["all"] = _count_all(n, m)
    for ins, outs in aligned_shapes(n, m):
        counts["alignment"] += math.prod(rank_bounds(ins, outs))
        k_vec, k_init, k_scal = _survivors(_UniformShape(ins, outs), n, config)
        counts["vectorization"] += k_vec
        counts["initial_layer"] += k_init
        counts["scalability"] += k_scal
    return counts


def solutions(n: int, m: int, *, config: DSEConfig = DEFAULT_CONFIG, stage: str = "scalability") -> list[TTSolution]:
    """Materialise the solutions that survive up to ``stage``.

    Parameters
    ----------
    n, m : int
        Input and output features (the paper's ``[N, M]``).
    config : DSEConfig
        Vector length and scalability rule.
    stage : {"vectorization", "initial_layer", "scalability"}
        Last pruning step applied. Earlier stages are too large to list.

    Returns
    -------
    list of TTSolution
        Sorted by FLOPs, then parameters.
    """
    stages = STAGES[2:]
    if stage not in stages:
        raise ValueError(f"stage must be one of {stages}, got {stage!r}")
    _validate_layer(n, m)
    keep_idx = stages.index(stage)
    out: list[TTSolution] = []
    for ins, outs in aligned_shapes(n, m):
        sh = _UniformShape(ins, outs)
        k_vec, k_init, k_scal = _survivors(sh, n, config)
        k_lo = k_init - k_scal + 1 if keep_idx == 2 else 1  # scalability drops the low ranks
        k_hi = (k_vec, k_init, k_init)[keep_idx]
        for k in range(k_lo, k_hi + 1):
            ranks = sh.ranks(k * config.vl)
            ef = einsum_flops(ins, outs, ranks)
            out.append(TTSolution(ins, outs, ranks, sh.m + sum(ef), tt_params(ins, outs, ranks), ef))
    out.sort(key=lambda s: (s.flops, s.params, s.d))
    return out
