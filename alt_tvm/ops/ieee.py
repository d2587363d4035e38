"""How a max, a min and a clamp treat NaN: the one rule every alt-tvm kernel follows.

IEEE 754-2019 ``maximum``/``minimum`` (what ONNX Runtime, PyTorch and NumPy's ``np.maximum``
compute): the result is NaN when either operand is NaN, so a NaN entering ReLU, ReLU6, a
clip, a max-pool window or a max reduction comes out as NaN. TVM's ``tirx.max(a, b)`` is
``select(a > b, a, b)`` in LLVM, an ordered compare that returns ``b`` whenever ``a`` is NaN:
``max(NaN, 0)`` is 0, so a ReLU silently turns NaN into zeros.

Every expression here is a ``select`` on an ordered compare, arranged so that the operand that
may be NaN is the one an unordered compare returns; only when both operands may be NaN is an
explicit NaN test added (:func:`is_nan`). With ``fast_math=True`` the plain ``tirx.max`` /
``tirx.min`` forms are used (NaN may be dropped). Integer types never hold NaN and always use
the plain forms.

Two traps this module avoids, both of TVM 0.27: the arithmetic simplifier rewrites ``x != x``
to ``False`` and ``select(a < b, b, select(a >= b, a, c))`` to ``select(a < b, b, a)`` (it
reasons about floats as if they were ordered), and ``tirx.isnan`` is not vectorizable (a loop
using it is scalarised). :func:`is_nan` therefore tests the bit pattern.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import tvm
from tvm import tirx

from ._utils import dtype_of

__all__ = ["clamp_expr", "highest", "is_float", "is_nan", "is_not_finite", "lowest", "max_expr", "max_of",
           "max_reducer", "min_expr", "min_reducer"]

#: (exponent bits, mantissa bits) of the IEEE-style float types whose NaN test is a bit test.
_FLOAT_FORMATS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}


def is_float(dtype: str) -> bool:
    """True for floating-point dtypes (the only ones that hold NaN and infinities)."""
    return str(dtype).startswith(("float", "bfloat"))


def is_nan(value: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
    """A vectorizable NaN test: exponent all ones and a non-zero mantissa.

    The bits of ``|value|`` as a signed integer exceed those of ``inf`` exactly for NaN
    (``fabs`` rather than a bit mask: alt-tvm's layout rewriter knows no ``&``). Float
    types without a known format use ``tirx.isnan``.
    """
    bits = _magnitude_and_infinity(value)
    return tirx.isnan(value) if bits is None else bits[0] > bits[1]


def is_not_finite(value: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
    """A vectorizable test for NaN and infinities: exponent all ones (as :func:`is_nan`, with
    ``>=`` instead of ``>``)."""
    bits = _magnitude_and_infinity(value)
    return tirx.Not(tirx.isfinite(value)) if bits is None else bits[0] >= bits[1]


def _magnitude_and_infinity(value: tvm.ir.PrimExpr) -> tuple[tvm.ir.PrimExpr, tvm.ir.PrimExpr] | None:
    """The bits of ``|value|`` and of infinity as signed integers (None for a float type of
    unknown format): ``|value|`` is NaN above, infinite at, finite below."""
    dtype = dtype_of(value)
    if dtype not in _FLOAT_FORMATS:
        return None
    exponent, mantissa = _FLOAT_FORMATS[dtype]
    itype = f"int{1 + exponent + mantissa}"
    return tirx.reinterpret(itype, tirx.abs(value)), tirx.const(((1 << exponent) - 1) << mantissa, itype)


def max_expr(a: tvm.ir.PrimExpr, b: tvm.ir.PrimExpr, *, fast_math: bool = False,
             nan_free: Sequence[bool] = (False, False)) -> tvm.ir.PrimExpr:
    """``max(a, b)``, NaN if either operand is NaN (unless ``fast_math``).

    Parameters
    ----------
    a, b : PrimExpr
        Operands of the same dtype.
    fast_math : bool, optional
        Use ``tirx.max``, which returns ``b`` when ``a`` is NaN.
    nan_free : pair of bool, optional
        Operands known to hold no NaN (constants): their NaN handling is skipped, which makes
        ``max(x, c)`` a single compare-and-select.

    Returns
    -------
    PrimExpr
    """
    return _extremum(a, b, larger=True, fast_math=fast_math, nan_free=nan_free)


def min_expr(a: tvm.ir.PrimExpr, b: tvm.ir.PrimExpr, *, fast_math: bool = False,
             nan_free: Sequence[bool] = (False, False)) -> tvm.ir.PrimExpr:
    """``min(a, b)``, NaN if either operand is NaN (unless ``fast_math``); as :func:`max_expr`."""
    return _extremum(a, b, larger=False, fast_math=fast_math, nan_free=nan_free)


def _extremum(a: tvm.ir.PrimExpr, b: tvm.ir.PrimExpr, *, larger: bool, fast_math: bool,
              nan_free: Sequence[bool]) -> tvm.ir.PrimExpr:
    a_free, b_free = (bool(f) for f in nan_free)
    if fast_math or not is_float(dtype_of(a)) or (a_free and b_free):
        return tirx.max(a, b) if larger else tirx.min(a, b)

    def beats(x, y):  # ordered: False whenever x or y is NaN
        return x > y if larger else x < y

    if b_free:
        return tirx.Select(beats(b, a), b, a)  # unordered means a is NaN: a
    picked = tirx.Select(beats(a, b), a, b)  # unordered: b, NaN if b is
    return picked if a_free else tirx.Select(is_nan(a), a, picked)


def clamp_expr(value: tvm.ir.PrimExpr, *, lo: float | None, hi: float | None,
               fast_math: bool = False) -> tvm.ir.PrimExpr:
    """``min(max(value, lo), hi)`` with NaN ``value`` kept NaN (unless ``fast_math``).

    A bound that is None, NaN (ONNX: no bound) or the infinity on its side is left out.
    """
    dtype = dtype_of(value)
    if lo is not None and not math.isnan(lo) and lo != -math.inf:
        value = max_expr(value, tirx.const(lo, dtype), fast_math=fast_math, nan_free=(False, True))
    if hi is not None and not math.isnan(hi) and hi != math.inf:
        value = min_expr(value, tirx.const(hi, dtype), fast_math=fast_math, nan_free=(False, True))
    return value


def max_reducer(*, fast_math: bool = False) -> Callable[..., tvm.ir.PrimExpr]:
    """A max reduction whose result is NaN if any element is NaN; identity ``-inf`` for floats
    (the lowest finite value would turn a window of ``-inf`` into a finite number)."""
    if fast_math:
        return tirx.comm_reducer(lambda x, y: tirx.max(x, y), lowest, name="max")
    return tirx.comm_reducer(lambda acc, value: _reduce_step(acc, value, larger=True), lowest, name="ieee_max")


def min_reducer(*, fast_math: bool = False) -> Callable[..., tvm.ir.PrimExpr]:
    """A min reduction whose result is NaN if any element is NaN; identity ``+inf`` for floats."""
    if fast_math:
        return tirx.comm_reducer(lambda x, y: tirx.min(x, y), highest, name="min")
    return tirx.comm_reducer(lambda acc, value: _reduce_step(acc, value, larger=False), highest, name="ieee_min")


def max_of(values: Sequence[tvm.ir.PrimExpr], *, fast_math: bool = False) -> tvm.ir.PrimExpr:
    """The max of several values, NaN if any of them is NaN (unless ``fast_math``).

    ``tirx.max`` over all of them, then one select on "any of them is NaN": each value appears
    twice, so the expression stays linear in their number. (Chaining :func:`max_expr` or a
    reduction step repeats each partial result in the next step, and TVM's passes walk
    expressions as trees: nine chained steps made a 3x3 pool take seconds to compile.)

    Raises
    ------
    ValueError
        If ``values`` is empty.
    """
    values = list(values)
    if not values:
        raise ValueError("max_of needs at least one value")
    peak = functools.reduce(tirx.max, values)
    dtype = dtype_of(values[0])
    if fast_math or not is_float(dtype) or len(values) == 1:
        return peak
    any_nan = functools.reduce(tirx.Or, [tirx.isnan(value) for value in values])
    return tirx.Select(any_nan, tirx.const(math.nan, dtype), peak)


def _reduce_step(acc: tvm.ir.PrimExpr, value: tvm.ir.PrimExpr, *, larger: bool) -> tvm.ir.PrimExpr:
    """One step of a NaN-propagating max/min reduction: take ``value`` if it is NaN or beats ``acc``.

    A NaN ``acc`` stays (every ordered compare with it is false). Only the incoming value is
    tested, with ``tirx.isnan``: testing the accumulator (as :func:`max_expr` must when both
    operands may be NaN) keeps a 3x3 max-pool 12x slower than TVM's, this form about 1.2x,
    on a (1, 64, 112, 112) input. The reduction loop is innermost and not
    vectorized, so :func:`is_nan`'s vectorizable bit test buys nothing here.
    """
    if not is_float(dtype_of(value)):
        return tirx.max(acc, value) if larger else tirx.min(acc, value)
    beats = value > acc if larger else value < acc
    return tirx.Select(tirx.Or(tirx.isnan(value), beats), value, acc)


def lowest(dtype: str) -> tvm.ir.PrimExpr:
    """The identity of a max: ``-inf`` for floats, the smallest value for integers."""
    return tirx.const(-math.inf, dtype) if is_float(dtype) else tirx.min_value(dtype)


def highest(dtype: str) -> tvm.ir.PrimExpr:
    """The identity of a min: ``+inf`` for floats, the largest value for integers."""
    return tirx.const(math.inf, dtype) if is_float(dtype) else tirx.max_value(dtype)
