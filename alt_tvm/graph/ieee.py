"""Legalizations for the ops no strategy took (``lower_fallbacks``): NaN-propagating, and vectorisable.

TVM's own legalizations of ReLU, clip, maximum/minimum, max pooling and max/min reductions
use ``tirx.max``/``tirx.min``, which drop a NaN operand, and start max pooling from the lowest
finite value. :func:`legalize_overrides` maps those Relax ops to the TE of :mod:`alt_tvm.ops`,
which follows the one rule of :mod:`alt_tvm.ops.ieee` (the same the strategies' epilogues use).
Calls these cannot express (integer dtypes, symbolic clip bounds, differing in/out pooling
layouts) go to TVM's legalization. GELU (erf and tanh forms) is legalized to the same TE as
the epilogues' GELU, whose polynomials vectorise, with or without ``fast_math``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from alt_tvm import ops
from alt_tvm.ops.ieee import is_float
from alt_tvm.strategies.base import static_shape

__all__ = ["legalize_overrides"]

LegalizeFunc = Callable[[relax.BlockBuilder, relax.Call], relax.Expr]


def legalize_overrides(*, fast_math: bool = False) -> dict[str, LegalizeFunc]:
    """The ``customize_legalize_map`` of ``relax.transform.LegalizeOps`` for IEEE NaN semantics
    and vectorisable GELU.

    Parameters
    ----------
    fast_math : bool, optional
        True: only the GELU overrides; TVM's legalizations (which may drop NaN) for the rest.

    Returns
    -------
    dict
        Relax op name -> ``function(block_builder, call) -> expr``.
    """
    # GELU's erf and tanh forms as the epilogues compute them: polynomials that vectorise. TVM's
    # legalization calls libm's erff once per element: SegFormer's largest standalone GELUs took
    # 14x the time of this TE.
    vectorised = {"relax.nn.gelu": _unary(ops.erf_gelu, "gelu"),
                  "relax.nn.gelu_tanh": _unary(ops.tanh_gelu, "gelu_tanh")}
    if fast_math:
        return {name: _float_only(name, fn) for name, fn in vectorised.items()}
    overrides = {
        **vectorised,
        "relax.nn.relu": _relu,
        "relax.clip": _clip,
        "relax.maximum": _extremum(ops.maximum),
        "relax.minimum": _extremum(ops.minimum),
        "relax.max": _reduction(ops.reduce_max),
        "relax.min": _reduction(ops.reduce_min),
        "relax.nn.max_pool1d": _max_pool,
        "relax.nn.max_pool2d": _max_pool,
        "relax.nn.max_pool3d": _max_pool,
    }
    return {name: _float_only(name, fn) for name, fn in overrides.items()}


def _float_only(name: str, legalize: LegalizeFunc) -> LegalizeFunc:
    """``legalize`` for floating-point results, TVM's own legalization otherwise."""
    default = tvm.ir.Op.get(name).get_attr("FLegalize")

    def dispatch(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        dtype = getattr(call.ty, "dtype", None)
        result = legalize(bb, call) if dtype is not None and is_float(str(dtype)) else None
        return default(bb, call) if result is None else result

    return dispatch


def _unary(op: Callable[..., tvm.te.Tensor], hint: str) -> LegalizeFunc:
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        return bb.call_te(op, call.args[0], primfunc_name_hint=hint)

    return legalize


def _relu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    return bb.call_te(ops.relu, call.args[0], primfunc_name_hint="relu")


def _scalar(value: relax.Expr) -> float | None:
    """A constant clip bound as a float; None when it is symbolic."""
    inner = getattr(value, "value", value)
    inner = getattr(inner, "value", inner)
    return float(inner) if isinstance(inner, int | float) else None


def _clip(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    lo, hi = _scalar(call.args[1]), _scalar(call.args[2])
    if lo is None or hi is None or lo > hi:
        return None  # symbolic (or contradictory) bounds: TVM's clip
    return bb.call_te(ops.clip, call.args[0], a_min=lo, a_max=hi, primfunc_name_hint="clip")


def _constant(expr: relax.Expr) -> np.ndarray | None:
    value = getattr(expr, "value", None)
    return value.numpy() if hasattr(value, "numpy") else None


def _extremum(op: Callable[..., tvm.te.Tensor]) -> LegalizeFunc:
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        args, nan_free = [], []
        for arg in call.args:
            data = _constant(arg)
            nan_free.append(data is not None and not np.isnan(data).any())
            # A scalar constant becomes an immediate, as TVM's legalization does.
            args.append(data.item() if data is not None and data.ndim == 0 else arg)
        return bb.call_te(op, *args, nan_free=tuple(nan_free), primfunc_name_hint=op.__name__)

    return legalize


def _reduction(op: Callable[..., tvm.te.Tensor]) -> LegalizeFunc:
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        axis = call.attrs.axis
        axis = None if axis is None else [int(a) for a in axis]
        return bb.call_te(op, call.args[0], axis=axis, keepdims=bool(call.attrs.keepdims),
                          primfunc_name_hint=op.__name__)

    return legalize


def _max_pool(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    attrs = call.attrs
    if str(attrs.out_layout) != str(attrs.layout):
        return None
    ints = lambda values: [int(v) for v in values]
    pooled = bb.call_te(ops.max_pool, call.args[0], pool_size=ints(attrs.pool_size), strides=ints(attrs.strides),
                        padding=ints(attrs.padding), dilation=ints(attrs.dilation), ceil_mode=bool(attrs.ceil_mode),
                        layout=str(attrs.layout), primfunc_name_hint="max_pool")
    got, want = static_shape(bb.normalize(pooled)), static_shape(call)
    if got != want:
        # ops.max_pool's output-size rule must be Relax's; differing here is a bug, not bad input.
        raise RuntimeError(f"alt-tvm's max_pool gives shape {got} where Relax infers {want} for {call}")
    return pooled
