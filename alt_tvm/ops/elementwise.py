"""Element-wise and broadcast operators, one ``te.compute`` each.

Tags follow TVM's conventions so layout propagation can find paths of element-wise ops:
``"elemwise"`` when the output has the shape of every tensor operand, ``"broadcast"`` otherwise.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import tvm
from tvm import te

from . import ieee
from ._utils import check_tensor, dtype_of, index_dtype, index_shape, shape_of

__all__ = [
    "add",
    "bias_add",
    "clip",
    "identity",
    "multiply",
    "relu",
    "sigmoid",
    "subtract",
]


def _unary(data: te.Tensor, fn: Callable[[tvm.ir.Expr], tvm.ir.Expr], name: str, attrs=None) -> te.Tensor:
    check_tensor(data, "data")
    return te.compute(data.shape, lambda *idx: fn(data(*idx)), name=name, tag="elemwise", attrs=attrs)


def relu(data: te.Tensor, *, name: str = "relu", fast_math: bool = False) -> te.Tensor:
    """``max(x, 0)``, tagged ``"elemwise"``; NaN stays NaN unless ``fast_math`` (:mod:`.ieee`)."""
    zero = tvm.tirx.const(0, dtype_of(data))
    return _unary(data, lambda x: ieee.max_expr(x, zero, fast_math=fast_math, nan_free=(False, True)), name)


def identity(data: te.Tensor, *, name: str = "identity") -> te.Tensor:
    """A copy of ``data`` as its own stage, tagged ``"elemwise"``."""
    return _unary(data, lambda x: x, name)


def sigmoid(data: te.Tensor, *, name: str = "sigmoid") -> te.Tensor:
    """Logistic function ``1 / (1 + exp(-x))`` for float tensors, tagged ``"elemwise"``.

    Raises
    ------
    ValueError
        If ``data`` is not a floating-point tensor.
    """
    check_tensor(data, "data")
    if not dtype_of(data).startswith(("float", "bfloat")):
        raise ValueError(f"sigmoid needs a floating-point tensor, got dtype {dtype_of(data)}")
    return _unary(data, sigmoid_expr, name)


def clip(data: te.Tensor, *, a_min: float, a_max: float, name: str = "clip",
         fast_math: bool = False) -> te.Tensor:
    """Clamp every element to ``[a_min, a_max]``, tagged ``"elemwise"``; NaN stays NaN.

    Parameters
    ----------
    data : te.Tensor
        Any shape.
    a_min, a_max : float
        Bounds, cast to the dtype of ``data``; ``a_min <= a_max``. An infinite or NaN bound
        (ONNX: no bound) clamps nothing on its side.
    name : str, optional
        Name of the compute stage.
    fast_math : bool, optional
        Allow the form that maps NaN to a bound (:mod:`alt_tvm.ops.ieee`).

    Raises
    ------
    ValueError
        If ``a_min > a_max``.
    """
    check_tensor(data, "data")
    if a_min > a_max:
        raise ValueError(f"clip needs a_min <= a_max, got a_min={a_min!r} > a_max={a_max!r}")
    return _unary(
        data,
        lambda x: ieee.clamp_expr(x, lo=float(a_min), hi=float(a_max), fast_math=fast_math),
        name,
        attrs={"a_min": float(a_min), "a_max": float(a_max)},
    )


def bias_add(data: te.Tensor, bias: te.Tensor, *, axis: int = 1, name: str = "bias_add") -> te.Tensor:
    """Add a 1-D ``bias`` along ``axis`` of ``data``, tagged ``"broadcast"``.

    Parameters
    ----------
    data : te.Tensor
        Any rank >= 1, e.g. ``N C H W``.
    bias : te.Tensor
        ``[data.shape[axis]]``.
    axis : int, optional
        The channel axis; negative values count from the end.
    name : str, optional
        Name of the compute stage.

    Raises
    ------
    ValueError
        On an axis out of range, a bias that is not 1-D or does not match that dimension,
        or mismatched dtypes.
    """
    check_tensor(data, "data")
    check_tensor(bias, "bias")
    ndim = len(data.shape)
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for data of rank {ndim}")
    axis %= ndim
    if len(bias.shape) != 1:
        raise ValueError(f"bias must be 1-D, got shape {list(bias.shape)}")
    size, b_size = shape_of(data)[axis], shape_of(bias)[0]
    if isinstance(size, int) and isinstance(b_size, int) and size != b_size:
        raise ValueError(
            f"bias length {b_size} does not match data dim {axis} of size {size} (data shape {list(data.shape)})"
        )
    _same_dtype(data, bias)
    return te.compute(
        data.shape,
        lambda *idx: data(*idx) + bias(idx[axis]),
        name=name,
        tag="broadcast",
        attrs={"axis": axis},
    )


def _same_dtype(a: te.Tensor, b: te.Tensor) -> None:
    if dtype_of(a) != dtype_of(b):
        raise ValueError(f"operands must have the same dtype, got {dtype_of(a)} and {dtype_of(b)}")


def _broadcast_shape(lhs: tuple, rhs: tuple) -> tuple:
    """NumPy broadcasting of two shapes (constant dims compared; symbolic must be equal)."""
    out = []
    for i in range(1, max(len(lhs), len(rhs)) + 1):
        a = lhs[-i] if i <= len(lhs) else 1
        b = rhs[-i] if i <= len(rhs) else 1
        if isinstance(a, int) and a == 1:
            out.append(b)
        elif isinstance(b, int) and b == 1:
            out.append(a)
        elif isinstance(a, int) and isinstance(b, int):
            if a != b:
                raise ValueError(f"shapes {list(lhs)} and {list(rhs)} are not broadcastable (dim -{i}: {a} vs {b})")
            out.append(a)
        elif a is b or (not isinstance(a, int) and not isinstance(b, int) and a.same_as(b)):
            out.append(a)
        else:
            raise ValueError(
                f"shapes {list(lhs)} and {list(rhs)} are not broadcastable: dim -{i} "
                f"({a} vs {b}) cannot be proven equal"
            )
    return tuple(reversed(out))


def _operand_index(shape: tuple, out_ndim: int, idx: tuple) -> list:
    """Right-aligned index into an operand, 0 on its size-1 (broadcast) dims."""
    offset = out_ndim - len(shape)
    zero = tvm.tirx.IntImm(dtype_of(idx[0]), 0) if idx else 0
    return [zero if isinstance(dim, int) and dim == 1 else idx[offset + i] for i, dim in enumerate(shape)]


def _binary(
    lhs: te.Tensor | float,
    rhs: te.Tensor | float,
    fn: Callable[[tvm.ir.Expr, tvm.ir.Expr], tvm.ir.Expr],
    name: str,
) -> te.Tensor:
    tensors = [t for t in (lhs, rhs) if isinstance(t, te.Tensor)]
    for t, what in ((lhs, "lhs"), (rhs, "rhs")):
        if not isinstance(t, te.Tensor | numbers.Number) or isinstance(t, bool):
            raise TypeError(f"{what} must be a te.Tensor or a number, got {type(t).__name__}")
    if not tensors:
        raise ValueError("at least one operand must be a te.Tensor, got two numbers")
    if len(tensors) == 2:
        _same_dtype(lhs, rhs)
    dtype = dtype_of(tensors[0])
    shapes = [shape_of(t) for t in tensors]
    out_shape = shapes[0] if len(shapes) == 1 else _broadcast_shape(*shapes)
    out_ndim = len(out_shape)
    # "elemwise" only when no operand is broadcast: propagation relies on equal shapes.
    same = all(len(s) == out_ndim and _dims_equal(s, out_shape) for s in shapes)

    def operand(x, idx):
        if isinstance(x, te.Tensor):
            return x(*_operand_index(shape_of(x), out_ndim, idx))
        return tvm.tirx.const(x, dtype)

    return te.compute(
        index_shape(out_shape, index_dtype(tensors[0])),
        lambda *idx: fn(operand(lhs, idx), operand(rhs, idx)),
        name=name,
        tag="elemwise" if same else "broadcast",
    )


def _dims_equal(a: tuple, b: tuple) -> bool:
    return all(
        x == y if isinstance(x, int) and isinstance(y, int) else x is y or x.same_as(y)
        for x, y in zip(a, b, strict=True)
    )


_BINARY_DOC = """Element-wise ``lhs {op} rhs`` with NumPy broadcasting.

    Parameters
    ----------
    lhs, rhs : te.Tensor or number
        Tensors of the same dtype; either may have lower rank or size-1 dims, or be a
        Python number (cast to the tensor dtype).
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        Tagged ``"elemwise"`` when no operand is broadcast, ``"broadcast"`` otherwise.

    Raises
    ------
    ValueError
        On shapes that do not broadcast or mismatched dtypes.
    """


def add(lhs: te.Tensor | float, rhs: te.Tensor | float, *, name: str = "add") -> te.Tensor:
    return _binary(lhs, rhs, lambda a, b: a + b, name)


def subtract(lhs: te.Tensor | float, rhs: te.Tensor | float, *, name: str = "subtract") -> te.Tensor:
    return _binary(lhs, rhs, lambda a, b: a - b, name)


def multiply(lhs: te.Tensor | float, rhs: te.Tensor | float, *, name: str = "multiply") -> te.Tensor:
    return _binary(lhs, rhs, lambda a, b: a * b, name)


add.__doc__ = _BINARY_DOC.format(op="+")
subtract.__doc__ = _BINARY_DOC.format(op="-")
multiply.__doc__ = _BINARY_DOC.format(op="*")


def divide(lhs: te.Tensor | float, rhs: te.Tensor | float, *, name: str = "divide") -> te.Tensor:
    return _binary(lhs, rhs, lambda a, b: a / b, name)


def maximum(lhs: te.Tensor | float, rhs: te.Tensor | float, *, name: str = "maximum", fast_math: bool = False,
            nan_free: tuple[bool, bool] = (False, False)) -> te.Tensor:
    free = _nan_free(lhs, rhs, nan_free)
    return _binary(lhs, rhs, lambda a, b: ieee.max_expr(a, b, fast_math=fast_math, nan_free=free), name)


def minimum(lhs: te.Tensor | float, rhs: te.Tensor | float, *, name: str = "minimum", fast_math: bool = False,
            nan_free: tuple[bool, bool] = (False, False)) -> te.Tensor:
    free = _nan_free(lhs, rhs, nan_free)
    return _binary(lhs, rhs, lambda a, b: ieee.min_expr(a, b, fast_math=fast_math, nan_free=free), name)


def _nan_free(lhs: te.Tensor | float, rhs: te.Tensor | float, declared: tuple[bool, bool]) -> tuple[bool, bool]:
    """Which operands cannot be NaN: those declared so, and Python numbers other than NaN."""
    return tuple(bool(flag) or (isinstance(x, numbers.Number) and not math.isnan(x))
                 for x, flag in zip((lhs, rhs), declared, strict=True))


divide.__doc__ = _BINARY_DOC.format(op="/")
_EXTREMUM_DOC = """Element-wise ``{op}(lhs, rhs)`` with NumPy broadcasting; NaN if either operand is NaN.

    The IEEE 754-2019 rule of ONNX Runtime and PyTorch (:mod:`alt_tvm.ops.ieee`).

    Parameters
    ----------
    lhs, rhs : te.Tensor or number
        As for :func:`add`.
    name : str, optional
        Name of the compute stage.
    fast_math : bool, optional
        Allow the form that drops a NaN ``lhs``.
    nan_free : pair of bool, optional
        Operands known to hold no NaN (constants): their NaN test is skipped.

    Returns
    -------
    te.Tensor
        Tagged ``"elemwise"`` when no operand is broadcast, ``"broadcast"`` otherwise.

    Raises
    ------
    ValueError
        On shapes that do not broadcast or mismatched dtypes.
    """
maximum.__doc__ = _EXTREMUM_DOC.format(op="max")
minimum.__doc__ = _EXTREMUM_DOC.format(op="min")


def tanh(data: te.Tensor, *, name: str = "tanh") -> te.Tensor:
    """Hyperbolic tangent, tagged ``"elemwise"``."""
    return _unary(data, tanh_expr, name)


#: Odd numerator and even denominator of the float32 rational approximation of erf on
#: [-4, 4] used by Eigen and by TVM's ``fast_erf`` (highest power first).
_ERF_NUMERATOR = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                  -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_DENOMINATOR = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                    -1.42647390514189e-02)


def erf_expr(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``erf(x)`` as a TIR expression that vectorises.

    LLVM has no vector erf, so ``tirx.erf`` becomes one libm call per lane; a GELU
    epilogue then costs more than its GEMM. For float32 this is a rational polynomial
    (error below 1e-6, exact sign and limits beyond |x| = 4, NaN kept); other dtypes keep
    ``tirx.erf``.
    """
    if dtype_of(x) != "float32":
        return tvm.tirx.erf(x)
    f32 = lambda v: tvm.tirx.const(v, "float32")  # noqa: E731 - a short local constant maker
    numerator = [f32(c) for c in reversed(_ERF_NUMERATOR)]
    denominator = [f32(c) for c in reversed(_ERF_DENOMINATOR)]

    def rational(original: tvm.tirx.Var, x: tvm.tirx.Var) -> tvm.ir.Expr:
        return _let(x * x, "x2", lambda x2: tvm.tirx.Select(
            ieee.is_nan(original), original, x * _horner(x2, numerator) / _horner(x2, denominator)))

    return _let(x, "x", lambda x: _let(tvm.tirx.max(tvm.tirx.min(x, f32(4.0)), f32(-4.0)), "clamped",
                                       lambda clamped: rational(x, clamped)))


#: Cephes' ``expf`` polynomial for exp(r) - 1 - r over r^2, |r| <= ln(2)/2 (highest power first).
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
             5.0000001201e-1)


#: Exp's input range: ``exp(88.72283)`` is the largest float below inf, ``exp(-87.33654)`` the
#: smallest normal one.
_EXP_RANGE = (-87.33654, 88.72283)
#: 1.5 * 2^23: adding it to a float below 2^22 in magnitude rounds the float to an integer
#: held in the sum's low mantissa bits, whose bit pattern is ``_ROUNDING_BITS + n``.
_ROUNDING, _ROUNDING_BITS = 12582912.0, 0x4B400000


def exp_expr(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``exp(x)`` as a TIR expression that vectorises (float32; other dtypes: ``tirx.exp``).

    As for erf, LLVM has no vector exp: an exp epilogue or a softmax would run one libm
    call per lane (about 3 ns per element, slower than the convolution they follow).
    Range reduction ``x = n ln2 + r`` and a degree-7 polynomial (relative error about
    2e-7); ``2^n`` is built in the exponent bits. NaN stays NaN, overflow gives ``inf``
    and underflow 0 (denormal results are flushed).
    """
    if dtype_of(x) != "float32":
        return tvm.tirx.exp(x)
    f32 = lambda v: tvm.tirx.const(v, "float32")  # noqa: E731 - a short local constant maker
    return _let(x, "x", lambda x: tvm.tirx.Select(x < f32(_EXP_RANGE[0]), f32(0.0), tvm.tirx.Select(
        x > f32(_EXP_RANGE[1]), f32(float("inf")), _exp_clamped(x))))


def _exp_clamped(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``exp`` of float32 ``x`` clamped to :data:`_EXP_RANGE` (NaN stays NaN, ``ieee.clamp_expr``).

    ``n = round(x / ln2)`` by the :data:`_ROUNDING` addition, which also leaves ``n`` in the
    sum's bits for ``2^n``: no float-to-int conversion (undefined in LLVM for NaN) and no
    floor, two vector instructions fewer than ``floor`` and a conversion. Each intermediate
    is bound once (:func:`_let`).
    """
    f32 = lambda v: tvm.tirx.const(v, "float32")  # noqa: E731 - a short local constant maker
    poly = [f32(c) for c in reversed(_EXP_POLY)]

    def scaled(x: tvm.tirx.Var, rounded: tvm.tirx.Var, n: tvm.tirx.Var) -> tvm.ir.Expr:
        # 2^n as 2 * 2^(n-1): n reaches 128 at the top of the range, beyond a float's exponent.
        bits = tvm.tirx.reinterpret("int32", rounded) + tvm.tirx.const(126 - _ROUNDING_BITS, "int32")
        return _let(x - n * f32(0.693359375) + n * f32(2.12194440e-4), "r",  # ln 2 in two parts: r exact
                    lambda r: (_horner(r, poly) * r * r + r + f32(1.0))
                    * tvm.tirx.reinterpret("float32", bits << 23) * f32(2.0))

    def reduced(x: tvm.tirx.Var, rounded: tvm.tirx.Var) -> tvm.ir.Expr:
        # (Through two reinterpret casts: TVM's simplifier folds ``(v + c) - c`` to ``v``.)
        n = tvm.tirx.reinterpret("float32", tvm.tirx.reinterpret("int32", rounded)) - f32(_ROUNDING)
        return _let(n, "n", lambda n: scaled(x, rounded, n))

    return _let(ieee.clamp_expr(x, lo=_EXP_RANGE[0], hi=_EXP_RANGE[1]), "clamped", lambda x: _let(
        x * f32(1.4426950408889634) + f32(_ROUNDING), "rounded", lambda rounded: reduced(x, rounded)))


#: ``sigmoid(x) - 1/2 = x A(x^2) / B(x^2)`` on [-18, 18] (lowest power first): fitted by
#: ``scripts/fit_sigmoid_rational.py`` (weighted least squares, Lawson's reweighting) to a
#: relative error of 2e-8 in exact arithmetic. ONNX Runtime's MLAS also computes its logistic
#: as a rational function on [-18, 18].
_SIGMOID_NUMERATOR = (0.24999999489854552, 0.008363145756569558, 5.4618668308764846e-05, 8.050431558568508e-08,
                      1.3041559102696245e-11)
_SIGMOID_DENOMINATOR = (1.0, 0.1167858722068874, 0.0016173133462516745, 5.133815300846555e-06,
                        3.0377119037393308e-09)
_SIGMOID_FIT_BOUND = 18.0
#: Where the input is clamped: past the fit, where the rational exceeds 1/2 by 4 ulps in
#: float32, so the clamp on the result makes every ``|x| >= 19`` give exactly 0 or 1 (the
#: float32 sigmoid is within 6e-9 of them there).
_SIGMOID_CLAMP = 19.0


def _centred_sigmoid(x: tvm.ir.Expr, *, scale: float) -> tvm.ir.Expr:
    """``scale * (sigmoid(scale * x) - 1/2)`` for float32 ``x``: ``x A(x^2) / B(x^2)`` with
    the fitted coefficients times powers of ``scale`` (exact for a power of two), ``x``
    clamped to ``19 / scale`` and the result to ``scale / 2`` in magnitude (float32
    rounding takes the rational up to 3e-7 past 1/2 near the clamp). NaN stays NaN
    (``ieee.clamp_expr``). ``scale = 2`` gives tanh.

    Four clamps, a square, eight FMAs, a product and a division: a SiLU built on it takes
    3.9 ns per 16 lanes against 5.0 for ``1 / (1 + exp(-x))`` (one AVX-512 thread, L2).
    """
    f32 = lambda v: tvm.tirx.const(v, "float32")  # noqa: E731 - a short local constant maker

    def rational(x: tvm.tirx.Var) -> tvm.ir.Expr:
        return _let(x * x, "x2", lambda x2: _let(x * _horner(x2, numerator) / _horner(x2, denominator), "ratio",
                                                 lambda r: ieee.clamp_expr(r, lo=-scale / 2, hi=scale / 2)))

    numerator = [f32(c * scale ** (2 * k + 2)) for k, c in enumerate(_SIGMOID_NUMERATOR)]
    denominator = [f32(c * scale ** (2 * k)) for k, c in enumerate(_SIGMOID_DENOMINATOR)]
    bound = _SIGMOID_CLAMP / scale
    return _let(x, "x", lambda x: _let(ieee.clamp_expr(x, lo=-bound, hi=bound), "clamped", rational))


def _horner(x: tvm.ir.Expr, coefficients: Sequence[tvm.ir.Expr]) -> tvm.ir.Expr:
    """``sum c_k x^k`` (``coefficients`` lowest power first) by Horner's rule."""
    value = coefficients[-1]
    for coef in coefficients[-2::-1]:
        value = value * x + coef
    return value


def _let(value: tvm.ir.Expr, name: str, body: Callable[[tvm.tirx.Var], tvm.ir.Expr]) -> tvm.ir.Expr:
    """``body(v)`` with ``v`` bound to ``value`` once: an operand used several times (a clamp's
    compare and select, a polynomial's powers) would otherwise be copied into the expression
    each time (273 copies of a sigmoid's input make EfficientNet-B0's build 4x slower)."""
    var = tvm.tirx.Var(name, dtype_of(value))
    return tvm.tirx.Let(var, value, body(var))


def sigmoid_expr(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``1 / (1 + exp(-x))`` as ``1/2 + x A(x^2) / B(x^2)`` (float32; ``tirx.sigmoid``
    otherwise): within 3 ulps of the exact value for ``x >= 0`` and within 1e-7 absolute
    below, in [0, 1] everywhere, exactly 0 or 1 for ``|x| >= 19``; NaN stays NaN. Like
    ONNX Runtime's, a tiny result for a very negative ``x`` is accurate in absolute, not
    relative, terms (``scripts/fit_sigmoid_rational.py`` checks every float32)."""
    if dtype_of(x) != "float32":
        return tvm.tirx.sigmoid(x)
    return _centred_sigmoid(x, scale=1.0) + tvm.tirx.const(0.5, "float32")


def tanh_expr(x: tvm.ir.Expr) -> tvm.ir.Expr:
    """``tanh(x) = 2 sigmoid(2x) - 1``, evaluated as :func:`_centred_sigmoid` with scale 2:
    relative error below 4e-7, small ``x`` included, exactly odd, in [-1, 1] and exactly
    ``±1`` for ``|x| >= 9.5`` (float32; ``tirx.tanh`` otherwise)."""
    if dtype_of(x) != "float32":
        return tvm.tirx.tanh(x)
    return _centred_sigmoid(x, scale=2.0)


def erf_gelu(data: te.Tensor, *, name: str = "gelu") -> te.Tensor:
    """GELU with the exact erf form ``x/2 * (1 + erf(x/sqrt(2)))``, tagged ``"elemwise"``."""
    dtype = dtype_of(data)
    half, one = tvm.tirx.const(0.5, dtype), tvm.tirx.const(1.0, dtype)
    inv_sqrt2 = tvm.tirx.const(0.7071067811865476, dtype)
    return _unary(data, lambda x: half * x * (one + erf_expr(x * inv_sqrt2)), name)


def tanh_gelu(data: te.Tensor, *, name: str = "gelu_tanh") -> te.Tensor:
    """GELU with the tanh approximation, tagged ``"elemwise"``."""
    dtype = dtype_of(data)
    c, k = tvm.tirx.const(0.7978845608028654, dtype), tvm.tirx.const(0.044715, dtype)
    half, one = tvm.tirx.const(0.5, dtype), tvm.tirx.const(1.0, dtype)
    return _unary(data, lambda x: half * x * (one + tanh_expr(c * (x + k * x * x * x))), name)
