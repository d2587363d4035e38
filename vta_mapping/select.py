"""Candidate selection (seed 002 §4.4): rank embeddings by weighted MAC and data-movement overhead.

``o = [MAC_total - MAC_min, Data_total - Data_min]`` (data in tensor elements, as in the paper);
the score is ``o · w`` for a user weight vector ``w`` (both terms are non-negative, so this is the
weighted L1 norm). The CSP enumerates; ranking happens here on the enumerated set, which gives the
same order as adding the term as an objective but keeps every candidate for inspection.
"""

from __future__ import annotations

from dataclasses import dataclass

from .embedding import Embedding
from .polyhedral import TensorOp
from .rewrite import Plan, plan

__all__ = ["Candidate", "rank"]


@dataclass(frozen=True, eq=False)
class Candidate:
    embedding: Embedding
    plan: Plan
    mac_overhead: int
    data_overhead: int
    score: float


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
        p = plan(op, e)
        om, od = p.mac_total - op.macs, p.data_total - p.data_min
        out.append(Candidate(e, p, om, od, weights[0] * om + weights[1] * od))
    out.sort(key=lambda c: (c.score, c.mac_overhead, str(c.embedding)))
    return out[:top] if top else out
