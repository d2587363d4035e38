"""TT-SVD of a dense weight matrix into the cores of a TT layer (Anthimopoulos et al., §2).

A dense layer ``y = x @ W.T + b`` with ``W`` of shape ``[M, N]`` (M outputs, N inputs) is
approximated by cores ``G_t`` of shape ``(r_{t-1}, n_t, m_t, r_t)``, ``t = 1..d``, with
``M = prod m_t``, ``N = prod n_t`` and ``r_0 = r_d = 1``, such that::

    W[(i_1..i_d), (j_1..j_d)] ~= G_1[:, j_1, i_1, :] @ G_2[:, j_2, i_2, :] @ ... @ G_d[:, j_d, i_d, :]

where ``(i_1..i_d)`` is the row-major multi-index of an output (``i_1`` most significant) and
``(j_1..j_d)`` that of an input. This is the TT-matrix format of Novikov et al. that T3F uses
and that the einsum chain of Listing 1 evaluates (:func:`tt_forward`).

The cores come from the TT-SVD of Oseledets (2011): the weight is reshaped to the order-``d``
tensor with merged mode pairs ``(m_t, n_t)`` and split by successive truncated SVDs, keeping
the ``r_t`` leading singular triplets at cut ``t``. Truncation at every cut is optimal for that
cut, so the error is within ``sqrt(d - 1)`` of the best TT approximation with those ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .dse import TTSolution, rank_bounds

__all__ = ["TTDecomposition", "decompose", "reconstruct", "tt_forward", "tt_svd"]


@dataclass(frozen=True)
class TTDecomposition:
    """The TT cores of one weight matrix and how well they approximate it.

    Attributes
    ----------
    cores : tuple of numpy.ndarray
        ``G_1..G_d``, core ``t`` of shape ``(r_{t-1}, n_t, m_t, r_t)``.
    in_factors, out_factors : tuple of int
        ``(n_1..n_d)`` and ``(m_1..m_d)``.
    ranks : tuple of int
        ``(r_0..r_d)`` actually used (a requested rank above the bound of its cut is lowered).
    rel_error : float
        ``||W - W_tt||_F / ||W||_F`` (0 for an all-zero ``W``).
    """

    cores: tuple[np.ndarray, ...]
    in_factors: tuple[int, ...]
    out_factors: tuple[int, ...]
    ranks: tuple[int, ...]
    rel_error: float

    @property
    def params(self) -> int:
        """Number of core parameters (eq. (4) without the bias)."""
        return sum(int(c.size) for c in self.cores)


def _check_factors(weight: np.ndarray, in_factors: Sequence[int], out_factors: Sequence[int],
                   ranks: Sequence[int]) -> None:
    if weight.ndim != 2:
        raise ValueError(f"weight must be a 2-D [M, N] matrix, got shape {weight.shape}")
    d = len(in_factors)
    if d < 1 or len(out_factors) != d:
        raise ValueError(f"in_factors {tuple(in_factors)} and out_factors {tuple(out_factors)} "
                         f"need equal length >= 1")
    if any(int(f) < 1 for f in (*in_factors, *out_factors)):
        raise ValueError(f"factors must be >= 1, got in {tuple(in_factors)}, out {tuple(out_factors)}")
    m, n = weight.shape
    if math.prod(out_factors) != m:
        raise ValueError(f"out_factors {tuple(out_factors)} multiply to {math.prod(out_factors)}, "
                         f"not the weight's M={m} rows")
    if math.prod(in_factors) != n:
        raise ValueError(f"in_factors {tuple(in_factors)} multiply to {math.prod(in_factors)}, "
                         f"not the weight's N={n} columns")
    if len(ranks) != d + 1:
        raise ValueError(f"ranks {tuple(ranks)} must have length d + 1 = {d + 1}")
    if ranks[0] != 1 or ranks[-1] != 1:
        raise ValueError(f"ranks must start and end with 1 (r_0 = r_d = 1), got {tuple(ranks)}")
    if any(int(r) < 1 for r in ranks):
        raise ValueError(f"ranks must be >= 1, got {tuple(ranks)}")


def tt_svd(weight: np.ndarray, *, in_factors: Sequence[int], out_factors: Sequence[int],
           ranks: Sequence[int]) -> TTDecomposition:
    """TT-SVD of ``weight`` with the given factorisation and maximal ranks.

    Parameters
    ----------
    weight : numpy.ndarray
        Real ``[M, N]`` matrix (PyTorch's ``nn.Linear.weight`` layout).
    in_factors, out_factors : sequence of int
        ``(n_1..n_d)`` with product ``N`` and ``(m_1..m_d)`` with product ``M``.
    ranks : sequence of int
        ``(1, r_1, ..., r_{d-1}, 1)``; each ``r_t`` is capped by the rank bound of its cut
        (:func:`alt_tvm.strategies.tt.dse.rank_bounds`) and by the rank the SVD finds.

    Returns
    -------
    TTDecomposition
        Cores in the input's floating dtype (float64 for integer input).

    Raises
    ------
    ValueError
        If the factors do not multiply to the weight's shape, or the ranks are malformed.
    """
    weight = np.asarray(weight)
    _check_factors(weight, in_factors, out_factors, ranks)
    dtype = weight.dtype if np.issubdtype(weight.dtype, np.floating) else np.float64
    ins, outs = tuple(int(f) for f in in_factors), tuple(int(f) for f in out_factors)
    d = len(ins)
    # (m_1..m_d, n_1..n_d) -> (m_1, n_1, m_2, n_2, ...): cut t of the TT separates pairs <= t.
    tensor = weight.astype(np.float64).reshape(outs + ins)
    tensor = tensor.transpose([p for t in range(d) for p in (t, d + t)])
    bounds = (1,) + rank_bounds(ins, outs) + (1,)
    cores: list[np.ndarray] = []
    used = [1]
    rest = tensor.reshape(1, -1)
    for t in range(d - 1):
        rest = rest.reshape(used[-1] * outs[t] * ins[t], -1)
        u, s, vt = np.linalg.svd(rest, full_matrices=False)
        r = max(1, min(int(ranks[t + 1]), bounds[t + 1], int(s.size)))
        # (r_{t-1}, m_t, n_t, r_t) -> (r_{t-1}, n_t, m_t, r_t), the layout the einsums read.
        cores.append(u[:, :r].reshape(used[-1], outs[t], ins[t], r).transpose(0, 2, 1, 3))
        rest = s[:r, None] * vt[:r]
        used.append(r)
    cores.append(rest.reshape(used[-1], outs[-1], ins[-1], 1).transpose(0, 2, 1, 3))
    used.append(1)
    cores_t = tuple(np.ascontiguousarray(c, dtype=dtype) for c in cores)
    approx = reconstruct(cores_t)
    norm = float(np.linalg.norm(weight))
    err = float(np.linalg.norm(weight.astype(np.float64) - approx)) / norm if norm > 0 else 0.0
    return TTDecomposition(cores_t, ins, outs, tuple(used), err)


def decompose(weight: np.ndarray, *, solution: TTSolution) -> TTDecomposition:
    """TT-SVD of ``weight`` for a DSE solution (its factors and ranks).

    Parameters
    ----------
    weight : numpy.ndarray
        ``[M, N]`` with ``M = prod(solution.out_factors)``, ``N = prod(solution.in_factors)``.
    solution : TTSolution
        From :func:`alt_tvm.strategies.tt.dse.solutions`.

    Returns
    -------
    TTDecomposition
    """
    return tt_svd(weight, in_factors=solution.in_factors, out_factors=solution.out_factors,
                  ranks=solution.ranks)


def _check_cores(cores: Sequence[np.ndarray]) -> None:
    if len(cores) < 1:
        raise ValueError("need at least one core")
    for t, c in enumerate(cores):
        if np.ndim(c) != 4:
            raise ValueError(f"core {t} must be 4-D (r_prev, n, m, r_next), got shape {np.shape(c)}")
    if np.shape(cores[0])[0] != 1 or np.shape(cores[-1])[3] != 1:
        raise ValueError(f"the first core must start and the last end with rank 1, got shapes "
                         f"{np.shape(cores[0])} and {np.shape(cores[-1])}")
    for t in range(len(cores) - 1):
        if np.shape(cores[t])[3] != np.shape(cores[t + 1])[0]:
            raise ValueError(f"rank mismatch between core {t} {np.shape(cores[t])} and core {t + 1} "
                             f"{np.shape(cores[t + 1])}")


def reconstruct(cores: Sequence[np.ndarray]) -> np.ndarray:
    """The dense ``W_tt`` of shape ``[M, N]`` that the cores represent (float64).

    Raises
    ------
    ValueError
        If the cores' shapes do not chain (``r_t`` of one core = ``r_{t-1}`` of the next).
    """
    _check_cores(cores)
    # acc[(i_1..i_t), (j_1..j_t), r_t], grown one core at a time.
    acc = np.asarray(cores[0], np.float64)[0].transpose(1, 0, 2)  # (m_1, n_1, r_1)
    for core in cores[1:]:
        c = np.asarray(core, np.float64)
        acc = np.einsum("abr,rnms->ambns", acc, c)
        a, m, b, n, s = acc.shape
        acc = acc.reshape(a * m, b * n, s)
    return acc[:, :, 0]


def tt_forward(x: np.ndarray, *, cores: Sequence[np.ndarray], bias: np.ndarray | None = None) -> np.ndarray:
    """The TT layer on a batch, as the einsum chain of Listing 1 (NumPy reference).

    Parameters
    ----------
    x : numpy.ndarray
        ``[B, N]`` inputs.
    cores : sequence of numpy.ndarray
        ``G_1..G_d`` of shapes ``(r_{t-1}, n_t, m_t, r_t)``.
    bias : numpy.ndarray, optional
        ``[M]``.

    Returns
    -------
    numpy.ndarray
        ``[B, M]``, equal to ``x @ reconstruct(cores).T + bias`` up to rounding.
    """
    _check_cores(cores)
    x = np.asarray(x)
    n_total = math.prod(np.shape(c)[1] for c in cores)
    if x.ndim != 2 or x.shape[1] != n_total:
        raise ValueError(f"x must be [B, N={n_total}], got shape {x.shape}")
    batch = x.shape[0]
    cur = x.reshape(-1)
    for core in reversed(cores):  # Listing 1 starts with the last core (t = d)
        r_out, n, _, r_in = core.shape
        cur = np.einsum("rnmk,bnk->mbr", core, cur.reshape(-1, n, r_in)).reshape(-1)
    # cur is [m_1, ..., m_d, B] flattened: the batch index ends up innermost.
    y = cur.reshape(-1, batch).T
    return y + bias if bias is not None else y
