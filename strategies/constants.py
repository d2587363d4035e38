"""The data of Relax constants, for strategies and epilogues alike (a leaf module: both
:mod:`.base` and :mod:`.epilogue` read constants, and neither may import the other)."""

from __future__ import annotations

import numpy as np
from tvm import relax


def const_value(expr: relax.Expr) -> np.ndarray | None:
    """The NumPy data of a Relax constant, or None for anything else."""
    value = getattr(expr, "value", None)
    if value is None or not hasattr(value, "numpy"):
        return None
    return value.numpy()
