"""An embedding of the GEMM intrinsic into an operator, and TVM's old static one (the reference).

An embedding maps each intrinsic axis (``x``, ``y``, ``z``) onto an axis-parallel hyper-rectangle
of the operator's instance set: a list of levels ``(dim, factor, stride)``, innermost first, so
that intrinsic index ``k`` on that axis sits at offset ``((k // P_l) % factor_l) * stride_l``
along ``dim_l`` (``P_l`` the product of the inner factors). ``swapped`` says the operator's
second input (the weight) plays the intrinsic's ``A`` operand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .dfg import GemmShape
from .polyhedral import TensorOp

__all__ = ["Level", "Embedding", "static_embedding"]

Level = tuple[str, int, int]  # (dim, factor, stride)


@dataclass(frozen=True)
class Embedding:
    """One solution of the CSP (or the static reference)."""

    shape: GemmShape
    axes: tuple[tuple[str, tuple[Level, ...]], ...]  # (("x", levels), ("y", ...), ("z", ...))
    swapped: bool = False
    origin: tuple[tuple[str, int], ...] = ()
    nodes: dict | None = field(default=None, compare=False, hash=False, repr=False)

    def levels(self, axis: str) -> tuple[Level, ...]:
        return dict(self.axes)[axis]

    @property
    def factors(self) -> dict[str, int]:
        """Tile factor per mapped operator dimension."""
        return {d: f for _, lv in self.axes for d, f, _ in lv}

    @property
    def strides(self) -> dict[str, int]:
        return {d: t for _, lv in self.axes for d, _, t in lv}

    @property
    def is_dense(self) -> bool:
        return all(t == 1 for t in self.strides.values())

    def offset(self, axis: str, k: int) -> dict[str, int]:
        """Operator-space offset of intrinsic index ``k`` along ``axis``."""
        out, period = {}, 1
        for d, f, t in self.levels(axis):
            out[d] = ((k // period) % f) * t
            period *= f
        return out

    def key(self) -> tuple:
        """Structure only (origin and raw nodes excluded), to compare mappings."""
        return (self.swapped, tuple((a, lv) for a, lv in self.axes if lv))

    def __str__(self) -> str:
        parts = []
        for a, lv in self.axes:
            body = "·".join(f"{d}:{f}" + (f"/{t}" if t != 1 else "") for d, f, t in reversed(lv)) or "-"
            parts.append(f"{a}<-{body}")
        return ("[B=data] " if self.swapped else "") + " ".join(parts)


def static_embedding(op: TensorOp, shape: GemmShape) -> Embedding:
    """TVM's old static template: ``x <- batch``, ``y <- output channel``, ``z <- input channel``.

    Each axis takes one operator dimension with the intrinsic's full size (the dimension is padded
    up to it when smaller or not a multiple), e.g. ``ic`` is padded to ``BLOCK_IN``.
    """
    if not op.static:
        raise ValueError(f"operator {op.name!r} declares no static mapping")
    axes = []
    for a, size in shape.axes.items():
        d = op.static[a]
        op.dim(d)
        axes.append((a, ((d, size, 1),) if size > 1 else ()))
    return Embedding(shape, tuple(axes), swapped=False)
