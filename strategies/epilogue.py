"""TE for the element-wise Relax ops that an epilogue fuses (bias, activations, residuals).

Every stage gets a unique name (``<op>_<k>``) so schedules can address its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tvm import relax, te, tirx

from alt_tvm import ops

from .constants import const_value

#: Element-wise Relax ops an epilogue may contain (binary ones broadcast their other operand).
UNARY_EPILOGUE = ("relax.nn.relu", "relax.nn.relu6", "relax.clip", "relax.sigmoid", "relax.tanh",
                  "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.erf", "relax.exp",
                  "relax.sqrt", "relax.negative", "relax.abs")
BINARY_EPILOGUE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
                   "relax.minimum", "relax.power")

_BINARY = {
    "relax.add": ops.add,
    "relax.subtract": ops.subtract,
    "relax.multiply": ops.multiply,
    "relax.divide": ops.divide,
    "relax.maximum": ops.maximum,
    "relax.minimum": ops.minimum,
}


_UNARY_TIR = {
    "relax.erf": ops.erf_expr,
    "relax.exp": ops.exp_expr,
    "relax.sqrt": tirx.sqrt,
    "relax.negative": lambda x: -x,
    "relax.abs": tirx.abs,
}


def _scalar(value: Any) -> float:
    inner = getattr(value, "value", value)
    inner = getattr(inner, "value", inner)
    return float(inner)


def _nan_free(arg: relax.Expr) -> bool:
    """True for a constant argument without NaN (a max/min with it needs no NaN test)."""
    data = const_value(arg)
    return data is not None and not np.isnan(data).any()


def joinable(call: relax.Call) -> bool:
    """Whether an epilogue can compute ``call``: an op above, and ``power`` only with a
    constant scalar exponent (GPT-2's GELU cubes its input)."""
    name = str(getattr(getattr(call, "op", None), "name", ""))
    if name == "relax.power":
        exponent = const_value(call.args[1])
        return exponent is not None and exponent.size == 1
    return name in UNARY_EPILOGUE or name in BINARY_EPILOGUE


def _power(base: te.Tensor, exponent: float, name: str) -> te.Tensor:
    """``base ** exponent``: repeated products for a small whole exponent (vector code, within
    an ulp or two of ``pow``), else ``pow`` itself."""
    if exponent == int(exponent) and 1 <= exponent <= 4:
        def body(*i):
            value = base(*i)
            for _ in range(int(exponent) - 1):
                value = value * base(*i)
            return value
        return te.compute(base.shape, body, name=name, tag="elemwise")
    return te.compute(base.shape, lambda *i: tirx.power(base(*i), tirx.const(exponent, base.dtype)), name=name,
                      tag="elemwise")


def epilogue_te(call: relax.Call, operands: Sequence[te.Tensor | None], *, index: int,
                fast_math: bool = False) -> te.Tensor:
    """TE of one epilogue op given the TE tensors of its tensor arguments (None for scalars).

    Parameters
    ----------
    call : relax.Call
        The epilogue op.
    operands : sequence of te.Tensor or None
        The TE tensor of each argument.
    index : int
        Position in the epilogue, for unique stage names.
    fast_math : bool, optional
        Allow max/min/clip forms that drop NaN; by default NaN propagates as in ONNX Runtime
        and PyTorch (:mod:`alt_tvm.ops.ieee`).

    Returns
    -------
    te.Tensor
    """
    name = str(call.op.name)
    chain = operands[0]
    stage = f"{name.split('.')[-1]}_{index}"
    if name in ("relax.maximum", "relax.minimum"):
        lhs, rhs = operands
        nan_free = tuple(_nan_free(arg) for arg in call.args)
        return _BINARY[name](lhs, rhs, name=stage, fast_math=fast_math, nan_free=nan_free)
    if name == "relax.power":
        return _power(chain, float(const_value(call.args[1])), stage)
    if name in _BINARY:
        lhs, rhs = operands
        return _BINARY[name](lhs, rhs, name=stage)
    if name == "relax.nn.relu":
        return ops.relu(chain, name=stage, fast_math=fast_math)
    if name == "relax.nn.relu6":
        return ops.clip(chain, a_min=0.0, a_max=6.0, name=stage, fast_math=fast_math)
    if name == "relax.clip":
        return ops.clip(chain, a_min=_scalar(call.args[1]), a_max=_scalar(call.args[2]), name=stage,
                        fast_math=fast_math)
    if name == "relax.sigmoid":
        return ops.sigmoid(chain, name=stage)
    if name == "relax.tanh":
        return ops.tanh(chain, name=stage)
    if name == "relax.nn.silu":
        return ops.multiply(chain, ops.sigmoid(chain, name=f"{stage}_sigmoid"), name=stage)
    if name == "relax.nn.gelu":
        return ops.erf_gelu(chain, name=stage)
    if name == "relax.nn.gelu_tanh":
        return ops.tanh_gelu(chain, name=stage)
    if name in _UNARY_TIR:
        fn = _UNARY_TIR[name]
        return te.compute(chain.shape, lambda *i: fn(chain(*i)), name=stage, tag="elemwise")
    raise ValueError(f"no epilogue lowering for {name}")
