"""Candidate selection (Rieber et al., §4.4): rank embeddings by weighted MAC and data-movement overhead.

``o = [MAC_total - MAC_min, Data_total - Data_min]`` (data in tensor elements, as in the paper);
the score is ``o · w`` for a user weight vector ``w`` (both terms are non-negative, so this is the
weighted L1 norm). The CSP enumerates; ranking happens here on the enumerated set, which gives the
same order as adding the term as an objective but keeps every candidate for inspection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .embedding import Embedding
from .polyhedral import TensorOp
from .rewrite import Plan, plan, tile_counts

__all__ = ["Candidate", "rank"]


@dataclass(frozen=True, eq=False)
class Candidate:
    embedding: Embedding
    mac_overhead: int
    data_overhead: int
    score: float
    counts: dict  # calls and tile counts (:func:`tile_counts`)

    def plan(self, op: TensorOp) -> Plan:
        """The full tiling plan (built on demand: it enumerates every GEMM call)."""
        return plan(op, self.embedding)


def rank(op: TensorOp, embeddings, *, weights: tuple[float, float] = (1.0, 1.0), top: int | None = None
         ) -> list[Candidate]:
    """Score and sort dense embeddings (non-dense ones are skipped: they cannot be lowered).

    Parameters
    ----------
    op : TensorOp
    embeddings : iterable of Embedding
    weights : (float, float)
        ``w = [w_MAC, w_Data]``, each >= 0.
    top : int, optional
        Keep only the best ``top``.
    """
    if len(weights) != 2 or any(w < 0 for w in weights):
        raise ValueError(f"weights must be two non-negative numbers, got {weights!r}")
    out, seen = [], set()
    for e in embeddings:
        if not e.is_dense or e.key() in seen:
            continue
        seen.add(e.key())
        n = tile_counts(op, e)
        g = e.shape
        mac_total = n["calls"] * g.macs
        data_total = n["A"] * g.batch * g.block_in + n["B"] * g.block_out * g.block_in + n["C"] * g.batch * g.block_out
        data_min = sum(int(np.prod(a.shape)) for a in (op.output, *op.inputs))
        om, od = mac_total - op.macs, data_total - data_min
        out.append(Candidate(e, om, od, weights[0] * om + weights[1] * od, n))
    out.sort(key=lambda c: (c.score, c.mac_overhead, str(c.embedding)))
    return out[:top] if top else out
