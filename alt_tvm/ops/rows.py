"""Reductions along the last axis written for vector units: softmax and layer norm.

Transformers normalise rows of 49 to 3072 elements, often not a multiple of the vector
width (197 tokens in ViT). The row is read once into a buffer padded to whole vectors,
``[..., n / lanes, lanes]``, so every pass over it is whole vector instructions; a
reduction keeps one partial per lane (``lanes`` accumulators, each over the row's vectors)
and combines the lanes at the end. The padding holds the reduction's identity (``-inf``
for a max, 0 for a sum), so it never changes a result.

Every function returns the output and the stages that hold one row's values, which a
schedule computes inside the loop over rows (:func:`alt_tvm.strategies.alt.rows.schedule_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import te

from ._utils import check_tensor, dtype_of, shape_of
from .elementwise import exp_expr

__all__ = ["RowKernel", "lane_reduce", "layer_norm_rows", "softmax_rows"]


@dataclass(frozen=True)
class RowKernel:
    """A row-wise computation: ``output`` and the stages that hold one row's values."""

    output: te.Tensor
    #: per-row stages, producers first (padded rows ``[..., vectors, lanes]``, lane partials, scalars)
    row_stages: tuple[te.Tensor, ...]
    lanes: int
    #: softmax only: ``output = numerator * scale`` (padded rows times one value per row), so a
    #: consumer may normalise the padded rows itself (attention's weights, in vectors)
    numerator: te.Tensor | None = None
    scale: te.Tensor | None = None


def _check(data: te.Tensor, lanes: int, what: str) -> tuple[tuple, int]:
    check_tensor(data, "data")
    shape = shape_of(data)
    if dtype_of(data) != "float32":
        raise ValueError(f"{what} rows are float32 here, got {dtype_of(data)}")
    if not shape or not all(isinstance(s, int) for s in shape):
        raise ValueError(f"{what} needs a static shape of rank >= 1, got {list(shape)}")
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    return tuple(shape[:-1]), int(shape[-1])


def _padded(data: te.Tensor, lead: tuple, n: int, lanes: int, fill: float, name: str) -> te.Tensor:
    """``data`` as ``[..., ceil(n / lanes), lanes]`` rows, ``fill`` past the end."""
    fill_value = tvm.tirx.const(fill, "float32")
    return te.compute((*lead, -(-n // lanes), lanes),
                      lambda *i: tvm.tirx.if_then_else(i[-2] * lanes + i[-1] < n, data(*i[:-2], i[-2] * lanes + i[-1]),
                                                       fill_value), name=name)


def lane_reduce(rows: te.Tensor, lead: tuple, reducer, name: str, element=None) -> tuple[te.Tensor, te.Tensor]:
    """One partial per lane over the row's vectors (of ``element(rows value)``), then one
    value per row."""
    vectors, lanes = (int(s) for s in rows.shape[-2:])
    element = element or (lambda value: value)
    v = te.reduce_axis((0, vectors), f"{name}_v")
    partial = te.compute((*lead, lanes), lambda *i: reducer(element(rows(*i[:-1], v, i[-1])), axis=v),
                         name=f"{name}_lanes")
    lane = te.reduce_axis((0, lanes), f"{name}_l")
    total = te.compute(lead, lambda *i: reducer(partial(*i, lane), axis=lane), name=name)
    return partial, total


def softmax_rows(data: te.Tensor, *, lanes: int, name: str = "softmax") -> RowKernel:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` over the last axis, with :func:`exp_expr`.

    Parameters
    ----------
    data : te.Tensor
        float32 ``[..., n]`` with a static shape.
    lanes : int
        Vector lanes: rows are padded to a multiple of it.
    name : str, optional
        Name of the output stage.

    Returns
    -------
    RowKernel
        Output of ``data``'s shape. A row holding NaN gives NaN, as ``torch.softmax``.

    Raises
    ------
    ValueError
        On a dtype other than float32, a dynamic shape or ``lanes < 1``.
    """
    lead, n = _check(data, lanes, "softmax")
    rows = _padded(data, lead, n, lanes, float("-inf"), f"{name}_in")
    max_lanes, row_max = lane_reduce(rows, lead, te.max, f"{name}_max")
    exps = te.compute(rows.shape, lambda *i: exp_expr(rows(*i) - row_max(*i[:-2])), name=f"{name}_exp")
    sum_lanes, row_sum = lane_reduce(exps, lead, te.sum, f"{name}_sum")
    inverse = te.compute(lead, lambda *i: tvm.tirx.const(1.0, "float32") / row_sum(*i), name=f"{name}_inv")
    out = te.compute((*lead, n), lambda *i: exps(*i[:-1], i[-1] // lanes, i[-1] % lanes) * inverse(*i[:-1]),
                     name=name, tag="softmax")
    return RowKernel(out, (rows, max_lanes, row_max, exps, sum_lanes, row_sum, inverse), lanes, exps, inverse)


def layer_norm_rows(data: te.Tensor, gamma: te.Tensor | None, beta: te.Tensor | None, *, epsilon: float, lanes: int,
                    name: str = "layer_norm") -> RowKernel:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis.

    The variance is the mean of the squared deviations from the mean (passes over the row
    in cache), not ``E[x^2] - E[x]^2``, which cancels badly when the mean is large.

    Parameters
    ----------
    data : te.Tensor
        float32 ``[..., n]`` with a static shape.
    gamma, beta : te.Tensor or None
        ``[n]`` scale and shift (None: 1 and 0).
    epsilon : float
        Added to the variance.
    lanes : int
        Vector lanes: rows are padded to a multiple of it.
    name : str, optional
        Name of the output stage.

    Returns
    -------
    RowKernel
        Output of ``data``'s shape.

    Raises
    ------
    ValueError
        On a dtype other than float32, a dynamic shape, ``lanes < 1`` or a ``gamma``/``beta``
        that is not ``[n]``.
    """
    lead, n = _check(data, lanes, "layer_norm")
    for what, param in (("gamma", gamma), ("beta", beta)):
        if param is not None and tuple(shape_of(param)) != (n,):
            raise ValueError(f"layer_norm {what} must have shape [{n}] (the normalised axis), "
                             f"got {list(shape_of(param))}")
    f32 = lambda v: tvm.tirx.const(v, "float32")  # noqa: E731 - a short local constant maker
    rows = _padded(data, lead, n, lanes, 0.0, f"{name}_in")
    sum_lanes, row_sum = lane_reduce(rows, lead, te.sum, f"{name}_sum")
    mean = te.compute(lead, lambda *i: row_sum(*i) * f32(1.0 / n), name=f"{name}_mean")
    centered = te.compute(rows.shape, lambda *i: tvm.tirx.Select(
        i[-2] * lanes + i[-1] < n, rows(*i) - mean(*i[:-2]), f32(0.0)), name=f"{name}_centered")
    # The mean's own rounding, measured on the centred row and taken out ("corrected
    # two-pass" variance, Chan, Golub and LeVeque 1983). On rows whose mean is 1e4 times
    # their spread, the largest error against float64 went from 3e-3 to 6e-7 (PyTorch's
    # layer_norm: 1e-3).
    residual_lanes, residual = lane_reduce(centered, lead, te.sum, f"{name}_residual")
    shift = te.compute(lead, lambda *i: residual(*i) * f32(1.0 / n), name=f"{name}_shift")
    sq_lanes, sq_sum = lane_reduce(centered, lead, te.sum, f"{name}_var", element=lambda value: value * value)
    scale = te.compute(lead, lambda *i: f32(1.0) / tvm.tirx.sqrt(
        (sq_sum(*i) - residual(*i) * shift(*i)) * f32(1.0 / n) + f32(epsilon)), name=f"{name}_rstd")

    def body(*i):
        value = (centered(*i[:-1], i[-1] // lanes, i[-1] % lanes) - shift(*i[:-1])) * scale(*i[:-1])
        if gamma is not None:
            value = value * gamma(i[-1])
        return value + beta(i[-1]) if beta is not None else value

    out = te.compute((*lead, n), body, name=name, tag="layer_norm")
    return RowKernel(out, (rows, sum_lanes, row_sum, mean, centered, residual_lanes, residual, shift, sq_lanes, sq_sum,
                                  scale), lanes)
