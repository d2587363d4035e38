"""The intrinsic as a small dataflow graph (Rieber et al., §3.1): VTA's GEMM ``C[x,y] += A[x,z]*B[y,z]``.

Nodes are scalar: data nodes ``A[x,z]`` and ``B[y,z]`` (int8), one multiply per ``(x,y,z)`` and
one accumulating add per ``(x,y)`` (the reduction is a sequential self-edge, so the add node
stands for the output element ``C[x,y]``, int32). Spatial edges between add nodes are kept as a
star (one hub, ``k-1`` leaves), as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GemmShape", "Node", "Edge", "IntrinsicDFG", "gemm_dfg"]


@dataclass(frozen=True)
class GemmShape:
    """GEMM intrinsic shape ``(x, y, z) = (batch, block_out, block_in)`` and its dtypes."""

    batch: int = 1
    block_out: int = 16
    block_in: int = 16
    in_dtype: str = "int8"
    acc_dtype: str = "int32"

    def __post_init__(self) -> None:
        for name in ("batch", "block_out", "block_in"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GemmShape.{name} must be a positive int, got {v!r}")

    @property
    def axes(self) -> dict[str, int]:
        return {"x": self.batch, "y": self.block_out, "z": self.block_in}

    @property
    def macs(self) -> int:
        return self.batch * self.block_out * self.block_in


@dataclass(frozen=True)
class Node:
    """``kind`` is ``"A"``, ``"B"`` (data), ``"mul"`` or ``"add"`` (operation); ``pos`` its indices."""

    kind: str
    pos: tuple[int, ...]

    @property
    def label(self) -> str:
        return "data" if self.kind in ("A", "B") else "operation"


@dataclass(frozen=True)
class Edge:
    src: Node
    dst: Node
    kind: str  # "sequential" or "spatial"


@dataclass(frozen=True)
class IntrinsicDFG:
    shape: GemmShape
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]

    def of_kind(self, kind: str) -> list[Node]:
        return [n for n in self.nodes if n.kind == kind]


def gemm_dfg(shape: GemmShape) -> IntrinsicDFG:
    """Build the DFG of one GEMM instruction of the given shape."""
    X, Y, Z = shape.batch, shape.block_out, shape.block_in
    a = {(x, z): Node("A", (x, z)) for x in range(X) for z in range(Z)}
    b = {(y, z): Node("B", (y, z)) for y in range(Y) for z in range(Z)}
    m = {(x, y, z): Node("mul", (x, y, z)) for x in range(X) for y in range(Y) for z in range(Z)}
    s = {(x, y): Node("add", (x, y)) for x in range(X) for y in range(Y)}
    edges = []
    for (x, y, z), node in m.items():
        edges.append(Edge(a[x, z], node, "sequential"))
        edges.append(Edge(b[y, z], node, "sequential"))
        edges.append(Edge(node, s[x, y], "sequential"))
    for add in s.values():
        edges.append(Edge(add, add, "sequential"))  # commutative reduction self-edge
    hub = s[0, 0]
    for key, add in s.items():
        if key != (0, 0):
            edges.append(Edge(hub, add, "spatial"))
    nodes = (*a.values(), *b.values(), *m.values(), *s.values())
    return IntrinsicDFG(shape, nodes, tuple(edges))
