"""A small rebuilder for TE/TIR expressions.

TVM 0.27 exposes no expression mutator to Python, so this walks the node types TE
bodies use and rebuilds only what changed. Tensor reads in TE are ``Call`` nodes of
the ``te.tensor_load`` op with arguments ``(tensor, *indices)``; in TIR they are
``TensorLoad`` nodes of a buffer, which :func:`rebuild` handles the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tvm
from tvm import tirx
from tvm.ir import prim
from tvm.ir.expr import Call, TensorLoad, Var

_BINARY = tuple(
    getattr(prim.expr, name)
    for name in ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max",
                 "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "LShift", "RShift", "BitwiseAnd",
                 "BitwiseOr", "BitwiseXor")
)
_LEAVES = (prim.expr.IntImm, prim.expr.FloatImm, tvm.ir.expr.StringImm)

LoadFn = Callable[[Any, list], Any]


def is_tensor_load(node: Any) -> bool:
    return isinstance(node, Call) and getattr(node.op, "name", None) == "te.tensor_load"


def rebuild(expr: Any, *, vmap: Mapping[Var, Any] | None = None, load: LoadFn | None = None) -> Any:
    """Return ``expr`` with variables substituted by ``vmap`` and tensor reads passed to ``load``.

    ``load(tensor, indices)`` receives the read's tensor (a TIR buffer for a TIR load)
    and its already rebuilt indices and returns the replacement expression.
    """
    vmap = vmap or {}

    def visit(node: Any) -> Any:
        if isinstance(node, Var):
            return vmap.get(node, node)
        if isinstance(node, _LEAVES):
            return node
        if isinstance(node, _BINARY):
            a, b = visit(node.a), visit(node.b)
            return node if a.same_as(node.a) and b.same_as(node.b) else type(node)(a, b)
        if is_tensor_load(node):
            tensor, *indices = node.args
            indices = [visit(i) for i in indices]
            if load is not None:
                return load(tensor, indices)
            return tensor(*indices)
        if isinstance(node, TensorLoad):
            indices = [visit(i) for i in node.indices]
            if load is not None:
                return load(node.source, indices)
            return tirx.BufferLoad(node.source, indices)
        if isinstance(node, Call):
            args = [visit(a) for a in node.args]
            if all(x.same_as(y) for x, y in zip(args, node.args)):
                return node
            return Call(node.op, args, attrs=node.attrs, ty_args=node.ty_args, ret_ty=node.ty)
        if isinstance(node, (prim.expr.Not, prim.expr.BitwiseNot)):
            return type(node)(visit(node.a))
        if isinstance(node, prim.expr.Select):
            return prim.expr.Select(visit(node.condition), visit(node.true_value), visit(node.false_value))
        if isinstance(node, prim.expr.Cast):
            return prim.expr.Cast(node.ty, visit(node.value))
        if isinstance(node, prim.expr.Let):
            return prim.expr.Let(node.var, visit(node.value), visit(node.body))
        if isinstance(node, tirx.Reduce):
            return tirx.Reduce(node.combiner, [visit(s) for s in node.source], node.axis,
                               visit(node.condition), node.value_index,
                               [visit(i) for i in node.init] or None)
        raise TypeError(f"alt_tvm.layout cannot rewrite expression node {type(node).__name__}: {node}")

    return visit(expr)


def tensor_loads(expr: Any) -> list[tuple[Any, list]]:
    """All ``(tensor, indices)`` reads in ``expr``."""
    found: list[tuple[Any, list]] = []

    def record(tensor: Any, indices: list) -> Any:
        found.append((tensor, indices))
        return tensor(*indices)

    rebuild(expr, load=record)
    return found
