"""Transposed (fractionally strided) convolution, PyTorch semantics and weight layout.

Computed as two stages so the second is an ordinary stride-1 convolution that the layout
rewriter treats like any other:

1. ``dilate_pad``: insert ``stride-1`` zeros between input elements and pad each border by
   ``dilation*(K-1) - padding`` (plus ``output_padding`` at the end). A negative border --
   ``padding > dilation*(K-1)`` -- crops instead, handled by the same index arithmetic.
2. a stride-1, dilation-``D`` convolution reading ``dp[n, g*Ig + c, 1*y + D*ky, ...]`` (same
   access form as :func:`alt_tvm.ops.conv`) with the weight transposed and flipped in its
   index: ``weight[g*Ig + c, o % Og, K-1-ky, ...]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import te

from ._utils import dtype_of, index_dtype, index_shape, ntuple, shape_of, static_dims
from .conv import _LAYOUTS, _check_groups, _check_ranks, _conv_compute

__all__ = ["conv_transpose", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]


def _dilate_pad(
    data: te.Tensor,
    stride: tuple[int, ...],
    before: tuple[int, ...],
    after: tuple[int, ...],
) -> te.Tensor:
    """Zero-insertion by ``stride`` plus (possibly negative) border padding."""
    in_shape = shape_of(data)
    spatial = in_shape[2:]
    out_spatial = tuple(
        (size - 1) * s + 1 + b + a for size, s, b, a in zip(spatial, stride, before, after, strict=True)
    )
    dtype = dtype_of(data)
    zero = tvm.tirx.const(0, dtype)

    def body(n, c, *idx):
        conds = []
        src = []
        for i, s, b, size in zip(idx, stride, before, spatial, strict=True):
            # Position in the zero-inserted (dilated) input; only multiples of s hold data.
            pos = i - b if b else i
            if b > 0:
                conds.append(pos >= 0)
            conds.append(pos < (size - 1) * s + 1)
            if s > 1:
                conds.append(tvm.tirx.floormod(pos, s) == 0)
                src.append(tvm.tirx.floordiv(pos, s))
            else:
                src.append(pos)
        cond = conds[0]
        for extra in conds[1:]:
            cond = tvm.tirx.all(cond, extra)
        return tvm.tirx.if_then_else(cond, data(n, c, *src), zero)

    return te.compute(
        index_shape((in_shape[0], in_shape[1], *out_spatial), index_dtype(data)),
        body,
        name="dilate_pad",
        tag="dilate_pad",
        attrs={"strides": list(stride), "pad_before": list(before), "pad_after": list(after)},
    )


def conv_transpose(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    stride: int | Sequence[int],
    padding: int | Sequence[int],
    output_padding: int | Sequence[int],
    dilation: int | Sequence[int],
    groups: int = 1,
    out_dtype: str | None = None,
    name: str = "conv_transpose",
) -> te.Tensor:
    """Transposed N-D convolution (1, 2 or 3 spatial dims) with PyTorch semantics.

    Parameters
    ----------
    data : te.Tensor
        ``N C [D] H W``.
    weight : te.Tensor
        ``C O/groups K...`` (PyTorch ``ConvTranspose`` layout).
    stride, padding, output_padding, dilation : int or sequence of int
        As in ``torch.nn.functional.conv_transpose2d``; ``output_padding`` must be smaller
        than ``stride`` or ``dilation`` in each dimension.
    groups : int, optional
        Channel groups; ``C`` must be divisible by it.
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the dtype of ``data``.
    name : str, optional
        Name of the convolution stage (the first stage is always ``"dilate_pad"``).

    Returns
    -------
    te.Tensor
        ``N O [D'] H' W'`` with ``H' = (H-1)*stride - 2*padding + dilation*(K-1)
        + output_padding + 1``, tagged ``"conv{1,2,3}d_transpose"``. Its attrs describe
        the stride-1 convolution actually computed (``strides`` all 1, ``dilation``,
        ``groups``, ``kernel_size``) plus the transposed ``transpose_strides``,
        ``padding`` and ``output_padding``.

    Raises
    ------
    ValueError
        On bad ranks or dtypes, channel counts not matching ``groups``, non-positive
        stride/dilation, negative padding, too large ``output_padding``, or an empty output.
    """
    nsp = _check_ranks(data, weight, None)
    return _conv_transpose_checked(
        data,
        weight,
        nsp=nsp,
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=dilation,
        groups=groups,
        out_dtype=out_dtype,
        name=name,
    )


def _conv_transpose_checked(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    nsp: int,
    stride: int | Sequence[int],
    padding: int | Sequence[int],
    output_padding: int | Sequence[int],
    dilation: int | Sequence[int],
    groups: int,
    out_dtype: str | None,
    name: str,
) -> te.Tensor:
    stride_t = ntuple(stride, nsp, "stride", minimum=1)
    padding_t = ntuple(padding, nsp, "padding")
    outpad_t = ntuple(output_padding, nsp, "output_padding")
    dilation_t = ntuple(dilation, nsp, "dilation", minimum=1)
    groups = _check_groups(groups)
    (channels,) = static_dims(data, [1], "data")
    spatial = static_dims(data, range(2, nsp + 2), "data")
    w_in, out_per_group, *kernel = static_dims(weight, range(nsp + 2), "weight")
    if channels % groups:
        raise ValueError(f"input channels ({channels}) must be divisible by groups ({groups})")
    if w_in != channels:
        raise ValueError(
            f"weight dim 0 must equal input channels {channels} (layout C, O/groups, K...), "
            f"got {w_in} (weight shape {list(weight.shape)})"
        )
    for op, s, d in zip(outpad_t, stride_t, dilation_t, strict=True):
        if op >= max(s, d):
            raise ValueError(
                f"output_padding {list(outpad_t)} must be smaller than stride "
                f"{list(stride_t)} or dilation {list(dilation_t)} in each dim"
            )
    before = tuple(d * (k - 1) - p for k, d, p in zip(kernel, dilation_t, padding_t, strict=True))
    after = tuple(b + op for b, op in zip(before, outpad_t, strict=True))
    out_spatial = tuple(
        (size - 1) * s + 1 + b + a - d * (k - 1)
        for size, s, b, a, d, k in zip(spatial, stride_t, before, after, dilation_t, kernel, strict=True)
    )
    if min(out_spatial) < 1:
        raise ValueError(
            f"padding {list(padding_t)} is too large: output spatial size would be "
            f"{list(out_spatial)} for input {list(spatial)}, kernel {list(kernel)}, "
            f"stride {list(stride_t)}, dilation {list(dilation_t)}"
        )
    out_dtype = out_dtype or dtype_of(data)
    in_per_group = channels // groups
    out_channels = out_per_group * groups
    dilated = _dilate_pad(data, stride_t, before, after)
    data_layout, _ = _LAYOUTS[nsp]
    attrs = {
        "strides": [1] * nsp,
        "dilation": list(dilation_t),
        "groups": groups,
        "kernel_size": list(kernel),
        "data_layout": data_layout,
        "kernel_layout": "IO" + data_layout[2:],
        "out_dtype": out_dtype,
        "transpose_strides": list(stride_t),
        "padding": list(padding_t),
        "output_padding": list(outpad_t),
    }

    def weight_load(o, g, c, ks):
        # Transposed weight: (in-channel, out-channel-in-group) and every kernel axis flipped.
        in_channel = c if g is None else g * in_per_group + c
        o_in_group = o if groups == 1 else tvm.tirx.floormod(o, out_per_group)
        flipped = [k - 1 - r for k, r in zip(kernel, ks, strict=True)]
        return weight(in_channel, o_in_group, *flipped)

    return _conv_compute(
        dilated,
        out_channels=out_channels,
        kernel=tuple(kernel),
        in_per_group=in_per_group,
        out_per_group=out_per_group,
        groups=groups,
        strides=(1,) * nsp,
        dilation=dilation_t,
        weight_load=weight_load,
        out_dtype=out_dtype,
        name=name,
        tag=f"conv{nsp}d_transpose",
        attrs=attrs,
    )


def _conv_transpose_nd(data, weight, nsp, stride, padding, output_padding, dilation, groups, out_dtype):
    _check_ranks(data, weight, nsp)
    return _conv_transpose_checked(
        data,
        weight,
        nsp=nsp,
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=dilation,
        groups=groups,
        out_dtype=out_dtype,
        name=f"conv{nsp}d_transpose",
    )


_WRAPPER_DOC = """Transposed {n}-D convolution, like ``torch.nn.functional.conv_transpose{n}d``.

    Parameters
    ----------
    data : te.Tensor
        ``{data}``.
    weight : te.Tensor
        ``{weight}`` (PyTorch layout).
    stride, padding, output_padding, dilation : int or sequence of int, optional
        PyTorch semantics.
    groups : int, optional
        Channel groups.
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the input dtype.

    Returns
    -------
    te.Tensor
        Tagged ``"conv{n}d_transpose"``; see :func:`conv_transpose`.

    Raises
    ------
    ValueError
        See :func:`conv_transpose`.
    """


def conv_transpose1d(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    output_padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    out_dtype: str | None = None,
) -> te.Tensor:
    return _conv_transpose_nd(data, weight, 1, stride, padding, output_padding, dilation, groups, out_dtype)


def conv_transpose2d(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    output_padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    out_dtype: str | None = None,
) -> te.Tensor:
    return _conv_transpose_nd(data, weight, 2, stride, padding, output_padding, dilation, groups, out_dtype)


def conv_transpose3d(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    output_padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    out_dtype: str | None = None,
) -> te.Tensor:
    return _conv_transpose_nd(data, weight, 3, stride, padding, output_padding, dilation, groups, out_dtype)


conv_transpose1d.__doc__ = _WRAPPER_DOC.format(n=1, data="N C W", weight="C O/groups K")
conv_transpose2d.__doc__ = _WRAPPER_DOC.format(n=2, data="N C H W", weight="C O/groups KH KW")
conv_transpose3d.__doc__ = _WRAPPER_DOC.format(n=3, data="N C D H W", weight="C O/groups KD KH KW")
