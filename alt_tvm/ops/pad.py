"""Constant padding as its own compute stage."""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import te

from ._utils import check_tensor, dtype_of, index_dtype, index_shape, ntuple, shape_of

__all__ = ["pad", "reached_padding_after"]


def pad(
    data: te.Tensor,
    pad_before: Sequence[int],
    pad_after: Sequence[int],
    *,
    value: float = 0.0,
    name: str = "pad",
) -> te.Tensor:
    """Pad every dimension of ``data`` with a constant.

    Parameters
    ----------
    data : te.Tensor
        Tensor of any rank.
    pad_before, pad_after : sequence of int
        Non-negative amounts added before / after each dimension; one entry per dimension.
    value : float, optional
        The fill value, cast to the dtype of ``data``.
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        A compute tagged ``"pad"`` with attrs ``pad_before``, ``pad_after``, ``pad_value``;
        ``data`` itself when every amount is zero (no stage is created then).

    Raises
    ------
    ValueError
        If a list has the wrong length or holds a negative amount.
    """
    check_tensor(data, "data")
    ndim = len(data.shape)
    before = ntuple(pad_before, ndim, "pad_before")
    after = ntuple(pad_after, ndim, "pad_after")
    if not any(before) and not any(after):
        return data

    dtype = dtype_of(data)
    fill = tvm.tirx.const(value, dtype)
    in_shape = shape_of(data)
    out_shape = tuple(s + b + a for s, b, a in zip(in_shape, before, after, strict=True))

    def body(*idx):
        src = []
        conds = []
        for i, b, a, size in zip(idx, before, after, in_shape, strict=True):
            src.append(i - b if b else i)
            # Only padded dims get a guard, so unpadded dims keep a plain index.
            if b:
                conds.append(i >= b)
            if a:
                conds.append(i < size + b)
        cond = conds[0]
        for extra in conds[1:]:
            cond = tvm.tirx.all(cond, extra)
        return tvm.tirx.if_then_else(cond, data(*src), fill)

    return te.compute(
        index_shape(out_shape, index_dtype(data)),
        body,
        name=name,
        tag="pad",
        attrs={"pad_before": list(before), "pad_after": list(after), "pad_value": float(value)},
    )


def reached_padding_after(*, extent: int, before: int, outputs: int, window: int, stride: int = 1,
                          dilation: int = 1) -> int:
    """The padding after one spatial dim that a sliding window actually reads.

    ``outputs`` windows of ``window`` taps (``dilation`` apart), ``stride`` apart, start
    ``before`` elements ahead of the data's ``extent``: the last one reaches
    ``(outputs - 1) * stride + (window - 1) * dilation + 1`` elements. A stride that skips the
    last padded row (a 3x3 stride-2 window with padding 1 on an even extent) reads none of the
    padding after, and a padded copy that includes it is work for nothing.
    """
    reach = (outputs - 1) * stride + (window - 1) * dilation + 1
    return max(0, reach - before - extent)
