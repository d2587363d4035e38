"""Small helpers shared by the operator definitions (shapes, dtypes, argument checks)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import tvm
from tvm import te

__all__ = [
    "check_tensor",
    "dtype_of",
    "index_dtype",
    "index_shape",
    "ntuple",
    "reduce_axis",
    "shape_of",
    "static_dims",
]


def check_tensor(value: object, what: str) -> te.Tensor:
    """Return ``value`` if it is a TE tensor, else raise ``TypeError`` naming ``what``."""
    if not isinstance(value, te.Tensor):
        raise TypeError(f"{what} must be a tvm.te.Tensor, got {type(value).__name__}")
    return value


def dtype_of(value: te.Tensor | tvm.ir.Expr) -> str:
    """The element type as a string; TVM 0.27 returns ``PrimType`` objects, not strings."""
    if isinstance(value, te.Tensor):
        return str(value.dtype)
    return str(value.ty)


def shape_of(tensor: te.Tensor) -> tuple[int | tvm.ir.Expr, ...]:
    """Shape with constant dimensions as Python ints and symbolic ones left as expressions."""
    dims: list[int | tvm.ir.Expr] = []
    for dim in tensor.shape:
        if isinstance(dim, tvm.tirx.IntImm):
            dims.append(int(dim.value))
        else:
            dims.append(dim)
    return tuple(dims)


def static_dims(tensor: te.Tensor, axes: Sequence[int], what: str) -> tuple[int, ...]:
    """Constant sizes of ``axes`` of ``tensor``; symbolic sizes raise ``ValueError``."""
    shape = shape_of(tensor)
    out = []
    for axis in axes:
        dim = shape[axis]
        if isinstance(dim, int):
            out.append(dim)
            continue
        raise ValueError(f"{what} dimension {axis} must be a constant, got symbolic {dim} (shape {list(tensor.shape)})")
    return tuple(out)


def index_dtype(tensor: te.Tensor) -> str:
    """Integer type of the tensor's shape (int64 under Relax ``call_te``, int32 from Python ints)."""
    for dim in tensor.shape:
        return dtype_of(dim)
    return "int32"


def ntuple(value: int | Sequence[int], n: int, name: str, *, minimum: int = 0) -> tuple[int, ...]:
    """Normalise an int-or-sequence argument to an ``n``-tuple of ints ``>= minimum``.

    Wrong types raise ``TypeError``; a wrong length or a value below ``minimum`` raises
    ``ValueError``. Both messages name the argument and repeat the bad value.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {value!r}")
    if isinstance(value, numbers.Integral):
        items = (int(value),) * n
    else:
        try:
            items = tuple(value)
        except TypeError:
            raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {value!r}") from None
        if len(items) != n:
            raise ValueError(f"{name} must have {n} entries (one per spatial dim), got {value!r}")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise TypeError(f"{name} entries must be ints, got {value!r}")
        if item < minimum:
            raise ValueError(f"{name} entries must be >= {minimum}, got {value!r}")
    return tuple(int(item) for item in items)


def index_shape(dims: Sequence[int | tvm.ir.Expr], dtype: str) -> tuple[tvm.ir.Expr, ...]:
    """Output shape with constant dims as ``IntImm(dtype)``.

    Keeps iteration variables in the input's index type: Relax ``call_te`` hands over int64
    shapes, and Python ints alone would give int32 loop variables mixed with int64 ones.
    """
    return tuple(tvm.tirx.IntImm(dtype, d) if isinstance(d, int) else d for d in dims)


def reduce_axis(extent: int | tvm.ir.Expr, name: str, dtype: str) -> tvm.tirx.IterVar:
    """A reduce axis ``[0, extent)`` whose variable has the integer type ``dtype``."""
    if isinstance(extent, int):
        extent = tvm.tirx.IntImm(dtype, extent)
    return te.reduce_axis((tvm.tirx.IntImm(dtype, 0), extent), name=name)
