"""N-D convolution (1, 2 or 3 spatial dims) in canonical layout, written once in TE.

Layouts are PyTorch's: data ``N C [D] H W``, weight ``O I/groups K...``, output ``N O [D] H W``.
The convolution compute takes an already padded input; the ``conv1d/2d/3d`` wrappers add a
separate ``pad`` stage first.

Access form (a contract with :mod:`alt_tvm.layout`, which rewrites input accesses by matching
it): inside the convolution body the input is read as::

    data[n, g*Ig + c, V*y + D*ky, V*x + D*kx]          (channel index just ``c`` if groups == 1)

where ``y, x`` are output iteration variables, ``c, ky, kx`` are the reduce axes (in that order;
``c`` ranges over ``Ig = C / groups``), ``g = o // Og`` and every spatial index is built as
``Add(Mul(IntImm(V), y), Mul(IntImm(D), ky))`` -- always, even when ``V`` or ``D`` is 1, so the
pattern is never folded away. The weight is read as ``weight[o, c, ky, kx]``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import tvm
from tvm import te
from tvm.ir.prim import expr as _expr

from ._utils import (
    check_tensor,
    dtype_of,
    index_dtype,
    index_shape,
    ntuple,
    reduce_axis,
    shape_of,
    static_dims,
)
from .pad import pad

__all__ = ["conv", "conv1d", "conv2d", "conv3d", "window_index"]

# Names for the output iteration variables and spatial reduce axes, by spatial rank.
_SPATIAL_NAMES = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}
_LAYOUTS = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


def window_index(stride: int, out_var: tvm.ir.Expr, dilation: int, reduce_var: tvm.ir.Expr) -> tvm.ir.Expr:
    """Build the sliding-window index ``stride*out_var + dilation*reduce_var``.

    The nodes are constructed directly so that multiplications by 1 survive (Python operators
    on TVM expressions fold ``1*y`` to ``y``), which keeps the form the layout rewriter matches.
    """
    dtype = dtype_of(out_var)
    if dtype_of(reduce_var) != dtype:
        reduce_var = reduce_var.astype(dtype)
    return _expr.Add(
        _expr.Mul(tvm.tirx.IntImm(dtype, stride), out_var),
        _expr.Mul(tvm.tirx.IntImm(dtype, dilation), reduce_var),
    )


def _conv_compute(
    data: te.Tensor,
    *,
    out_channels: int,
    kernel: tuple[int, ...],
    in_per_group: int,
    out_per_group: int,
    groups: int,
    strides: tuple[int, ...],
    dilation: tuple[int, ...],
    weight_load: Callable[..., tvm.ir.Expr],
    out_dtype: str,
    name: str,
    tag: str,
    attrs: dict,
) -> te.Tensor:
    """Shared convolution body for :func:`conv` and the transposed convolution.

    ``weight_load(o, g, c, ks)`` returns the weight value for output channel ``o``, group
    index ``g``, in-group input channel ``c`` and kernel offsets ``ks``.
    """
    nsp = len(kernel)
    in_shape = shape_of(data)
    spatial_in = in_shape[2:]
    out_spatial = tuple(
        (size - d * (k - 1) - 1) // s + 1 for size, k, s, d in zip(spatial_in, kernel, strides, dilation, strict=True)
    )
    idx_dtype = index_dtype(data)

    rc = reduce_axis(in_per_group, "rc", idx_dtype)
    rks = [reduce_axis(k, "r" + sp, idx_dtype) for k, sp in zip(kernel, _SPATIAL_NAMES[nsp], strict=True)]

    def body(n, o, *spatial):
        if groups == 1:
            g = None
            channel = rc.var
        else:
            g = tvm.tirx.floordiv(o, out_per_group)
            channel = g * in_per_group + rc.var
        src = [window_index(s, y, d, r.var) for s, y, d, r in zip(strides, spatial, dilation, rks, strict=True)]
        x = data(n, channel, *src)
        w = weight_load(o, g, rc.var, [r.var for r in rks])
        if dtype_of(x) != out_dtype:
            x = x.astype(out_dtype)
        if dtype_of(w) != out_dtype:
            w = w.astype(out_dtype)
        return te.sum(x * w, axis=[rc, *rks])

    return te.compute(
        index_shape((in_shape[0], out_channels, *out_spatial), idx_dtype),
        body,
        name=name,
        tag=tag,
        attrs=attrs,
        varargs_names=list(_SPATIAL_NAMES[nsp]),
    )


def _check_ranks(data: te.Tensor, weight: te.Tensor, nsp: int | None) -> int:
    """Check data/weight ranks agree and return the number of spatial dims."""
    check_tensor(data, "data")
    check_tensor(weight, "weight")
    ndim = len(data.shape)
    if nsp is None:
        nsp = ndim - 2
        if nsp not in (1, 2, 3):
            raise ValueError(
                f"data must have rank 3, 4 or 5 (N C [D] H W), got rank {ndim} with shape {list(data.shape)}"
            )
    elif ndim != nsp + 2:
        raise ValueError(
            f"data for a {nsp}-D convolution must have rank {nsp + 2}, got rank {ndim} with shape {list(data.shape)}"
        )
    if len(weight.shape) != nsp + 2:
        raise ValueError(
            f"weight for a {nsp}-D convolution must have rank {nsp + 2}, got rank "
            f"{len(weight.shape)} with shape {list(weight.shape)}"
        )
    if dtype_of(data) != dtype_of(weight):
        raise ValueError(f"data and weight must have the same dtype, got {dtype_of(data)} and {dtype_of(weight)}")
    return nsp


def _check_groups(groups: int) -> int:
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    return int(groups)


def conv(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    strides: int | Sequence[int],
    dilation: int | Sequence[int],
    groups: int = 1,
    out_dtype: str | None = None,
    name: str = "conv",
) -> te.Tensor:
    """Grouped N-D convolution of an already padded input.

    Parameters
    ----------
    data : te.Tensor
        Padded input, ``N C W``, ``N C H W`` or ``N C D H W``.
    weight : te.Tensor
        Filters, ``O C/groups K...`` (PyTorch layout).
    strides, dilation : int or sequence of int
        Per spatial dimension, each ``>= 1``.
    groups : int, optional
        Number of channel groups; ``C`` and ``O`` must be divisible by it.
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the dtype of ``data``.
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        ``N O [D'] H' W'`` with ``H' = (H - dilation*(K-1) - 1) // stride + 1``, tagged
        ``"conv1d"``, ``"conv2d"`` or ``"conv3d"``; attrs ``strides``, ``dilation``,
        ``groups``, ``kernel_size``, ``data_layout``, ``kernel_layout``, ``out_dtype``. See the
        module docstring for the exact input access form.

    Raises
    ------
    ValueError
        On ranks other than 3-5, mismatched ranks or dtypes, channel counts not matching
        ``groups``, non-positive strides or dilation, or a dilated kernel larger than the input.
    """
    nsp = _check_ranks(data, weight, None)
    return _conv_checked(
        data,
        weight,
        nsp=nsp,
        strides=strides,
        dilation=dilation,
        groups=groups,
        out_dtype=out_dtype,
        name=name,
    )


def _conv_checked(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    nsp: int,
    strides: int | Sequence[int],
    dilation: int | Sequence[int],
    groups: int,
    out_dtype: str | None,
    name: str,
) -> te.Tensor:
    strides_t = ntuple(strides, nsp, "strides", minimum=1)
    dilation_t = ntuple(dilation, nsp, "dilation", minimum=1)
    groups = _check_groups(groups)
    (channels,) = static_dims(data, [1], "data")
    spatial = static_dims(data, range(2, nsp + 2), "data")
    out_channels, w_in, *kernel = static_dims(weight, range(nsp + 2), "weight")
    if channels % groups:
        raise ValueError(f"input channels ({channels}) must be divisible by groups ({groups})")
    if out_channels % groups:
        raise ValueError(f"output channels ({out_channels}, weight dim 0) must be divisible by groups ({groups})")
    if w_in != channels // groups:
        raise ValueError(
            f"weight dim 1 must be input channels / groups = {channels}/{groups} = "
            f"{channels // groups}, got {w_in} (weight shape {list(weight.shape)})"
        )
    for axis, (size, k, d) in enumerate(zip(spatial, kernel, dilation_t, strict=True)):
        if k < 1:
            raise ValueError(f"kernel size must be >= 1, got {list(kernel)}")
        span = d * (k - 1) + 1
        if span > size:
            raise ValueError(
                f"dilated kernel extent {span} (kernel {k}, dilation {d}) is larger than "
                f"the padded input size {size} in spatial dim {axis}"
            )
    out_dtype = out_dtype or dtype_of(data)
    data_layout, kernel_layout = _LAYOUTS[nsp]
    attrs = {
        "strides": list(strides_t),
        "dilation": list(dilation_t),
        "groups": groups,
        "kernel_size": list(kernel),
        "data_layout": data_layout,
        "kernel_layout": kernel_layout,
        "out_dtype": out_dtype,
    }
    return _conv_compute(
        data,
        out_channels=out_channels,
        kernel=tuple(kernel),
        in_per_group=channels // groups,
        out_per_group=out_channels // groups,
        groups=groups,
        strides=strides_t,
        dilation=dilation_t,
        weight_load=lambda o, g, c, ks: weight(o, c, *ks),
        out_dtype=out_dtype,
        name=name,
        tag=f"conv{nsp}d",
        attrs=attrs,
    )


def _conv_nd(
    data: te.Tensor,
    weight: te.Tensor,
    nsp: int,
    stride: int | Sequence[int],
    padding: int | Sequence[int],
    dilation: int | Sequence[int],
    groups: int,
    out_dtype: str | None,
) -> te.Tensor:
    _check_ranks(data, weight, nsp)
    # Normalise here so that messages use the wrapper's argument names (stride, not strides).
    stride = ntuple(stride, nsp, "stride", minimum=1)
    dilation = ntuple(dilation, nsp, "dilation", minimum=1)
    pads = ntuple(padding, nsp, "padding")
    padded = pad(data, (0, 0, *pads), (0, 0, *pads), name="pad")
    return _conv_checked(
        padded,
        weight,
        nsp=nsp,
        strides=stride,
        dilation=dilation,
        groups=groups,
        out_dtype=out_dtype,
        name=f"conv{nsp}d",
    )


def conv1d(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    out_dtype: str | None = None,
) -> te.Tensor:
    """1-D convolution with PyTorch semantics (``torch.nn.functional.conv1d``).

    Parameters
    ----------
    data : te.Tensor
        ``N C W``.
    weight : te.Tensor
        ``O C/groups K``.
    stride, padding, dilation : int or sequence of int, optional
        Padding is symmetric, zero-filled, and added by a separate ``"pad"`` stage.
    groups : int, optional
        Channel groups.
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the input dtype.

    Returns
    -------
    te.Tensor
        ``N O W'``, tagged ``"conv1d"``.

    Raises
    ------
    ValueError
        See :func:`conv`; also on negative padding.
    """
    return _conv_nd(data, weight, 1, stride, padding, dilation, groups, out_dtype)


def conv2d(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    out_dtype: str | None = None,
) -> te.Tensor:
    """2-D convolution with PyTorch semantics (``torch.nn.functional.conv2d``).

    Parameters
    ----------
    data : te.Tensor
        ``N C H W``.
    weight : te.Tensor
        ``O C/groups KH KW``.
    stride, padding, dilation : int or sequence of int, optional
        Padding is symmetric, zero-filled, and added by a separate ``"pad"`` stage.
    groups : int, optional
        Channel groups (``groups == C == O`` is depthwise).
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the input dtype.

    Returns
    -------
    te.Tensor
        ``N O H' W'``, tagged ``"conv2d"``.

    Raises
    ------
    ValueError
        See :func:`conv`; also on negative padding.
    """
    return _conv_nd(data, weight, 2, stride, padding, dilation, groups, out_dtype)


def conv3d(
    data: te.Tensor,
    weight: te.Tensor,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    out_dtype: str | None = None,
) -> te.Tensor:
    """3-D convolution with PyTorch semantics (``torch.nn.functional.conv3d``).

    Parameters
    ----------
    data : te.Tensor
        ``N C D H W``.
    weight : te.Tensor
        ``O C/groups KD KH KW``.
    stride, padding, dilation : int or sequence of int, optional
        Padding is symmetric, zero-filled, and added by a separate ``"pad"`` stage.
    groups : int, optional
        Channel groups.
    out_dtype : str, optional
        Accumulation and output dtype; defaults to the input dtype.

    Returns
    -------
    te.Tensor
        ``N O D' H' W'``, tagged ``"conv3d"``.

    Raises
    ------
    ValueError
        See :func:`conv`; also on negative padding.
    """
    return _conv_nd(data, weight, 3, stride, padding, dilation, groups, out_dtype)
