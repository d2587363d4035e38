"""Index arithmetic that works the same on Python ints, NumPy arrays and TIR expressions.

Layout primitives describe their index maps once, with these helpers, so the same
code packs constants in NumPy, checks values in tests and rewrites TE accesses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Index = Any  # int | np.ndarray | tvm PrimExpr


def _is_prim_expr(value: Index) -> bool:
    return not isinstance(value, (int, np.integer, np.ndarray))


def index_min(a: Index, b: Index) -> Index:
    """``min(a, b)`` for ints, arrays or TIR expressions."""
    if _is_prim_expr(a) or _is_prim_expr(b):
        from tvm import tirx

        return tirx.min(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)


def product(values: tuple[int, ...] | list[int]) -> int:
    """Product of integers (1 for an empty sequence)."""
    out = 1
    for v in values:
        out *= int(v)
    return out
