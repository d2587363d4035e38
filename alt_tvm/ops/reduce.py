"""Max/min reductions over axes and over pooling windows, NaN-propagating (:mod:`.ieee`).

TOPI's ``max``, ``min`` and ``pool*d(pool_type="max")`` drop NaN (``tirx.max`` in the
reducer) and start from the lowest finite value instead of ``-inf`` (a window holding only
``-inf`` gives ``-3.4e38``). These are the same computations with the reducers of
:mod:`.ieee`; window positions in the padding are skipped, as ONNX Runtime and PyTorch do.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from tvm import te

from . import ieee
from ._utils import check_tensor, dtype_of, index_dtype, index_shape, ntuple, reduce_axis, shape_of
from .pad import pad, reached_padding_after

__all__ = ["max_pool", "reduce_max", "reduce_min"]

_SPATIAL = "DHW"
#: Windows of at most this many taps are one expression over all taps (:func:`ieee.max_of`),
#: larger ones a reduction loop. In a reduction, LLVM keeps the accumulator in memory and
#: splits its vector in halves: unrolled, ResNet-18's stem 3x3 pool takes 0.204 ms instead of
#: 0.256, GoogLeNet's 13 pools 0.62 ms instead of 0.87 (in the model, 2 threads).
UNROLLED_TAPS = 27


def reduce_max(data: te.Tensor, *, axis: int | Sequence[int] | None = None, keepdims: bool = False,
               fast_math: bool = False, name: str = "max") -> te.Tensor:
    """The maximum over ``axis`` (all axes if None); NaN if any reduced element is NaN.

    Parameters
    ----------
    data : te.Tensor
        Any shape.
    axis : int or sequence of int, optional
        Axes to reduce; negative values count from the end.
    keepdims : bool, optional
        Keep the reduced axes with size 1.
    fast_math : bool, optional
        Allow the reducer that drops NaN.
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        Tagged ``"comm_reduce"``.

    Raises
    ------
    ValueError
        On an axis out of range or repeated.
    """
    return _reduce(data, axis, keepdims, ieee.max_reducer(fast_math=fast_math), name)


def reduce_min(data: te.Tensor, *, axis: int | Sequence[int] | None = None, keepdims: bool = False,
               fast_math: bool = False, name: str = "min") -> te.Tensor:
    """The minimum over ``axis``; NaN if any reduced element is NaN (as :func:`reduce_max`)."""
    return _reduce(data, axis, keepdims, ieee.min_reducer(fast_math=fast_math), name)


def _reduce(data: te.Tensor, axis, keepdims: bool, reducer, name: str) -> te.Tensor:
    check_tensor(data, "data")
    shape = shape_of(data)
    ndim = len(shape)
    axes = list(range(ndim)) if axis is None else [axis] if isinstance(axis, int) else [int(a) for a in axis]
    if any(not -ndim <= a < ndim for a in axes):
        raise ValueError(f"axis {axis!r} is out of range for data of rank {ndim}")
    axes = sorted(a % ndim for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"axis {axis!r} repeats an axis")
    itype = index_dtype(data)
    rk = {a: reduce_axis(shape[a], f"k{a}", itype) for a in axes}
    kept = [a for a in range(ndim) if a not in rk]
    out_shape = [1 if a in rk else shape[a] for a in range(ndim)] if keepdims else [shape[a] for a in kept]

    def body(*idx):
        if keepdims:
            coords = [rk[a] if a in rk else idx[a] for a in range(ndim)]
        else:
            by_axis = dict(zip(kept, idx))
            coords = [rk[a] if a in rk else by_axis[a] for a in range(ndim)]
        return reducer(data(*coords), axis=[rk[a] for a in axes])

    return te.compute(index_shape(out_shape, itype), body, name=name, tag="comm_reduce")


def max_pool(data: te.Tensor, *, pool_size: Sequence[int], strides: Sequence[int] | int = 1,
             padding: Sequence[int] | int = 0, dilation: Sequence[int] | int = 1, ceil_mode: bool = False,
             layout: str = "NCHW", fast_math: bool = False, name: str = "max_pool") -> te.Tensor:
    """Max pooling over the ``D``/``H``/``W`` axes of ``layout``, NaN-propagating.

    Parameters
    ----------
    data : te.Tensor
        Laid out as ``layout`` (``"NCW"``, ``"NCHW"``, ``"NHWC"``, ``"NCDHW"`` ...).
    pool_size : sequence of int
        Window extent per spatial axis, in the order the axes appear in ``layout``.
    strides, dilation : int or sequence of int, optional
        Per spatial axis.
    padding : int or sequence of int, optional
        ``2 * spatial`` entries, all befores then all afters (Relax's order), or one int.
    ceil_mode : bool, optional
        Round the output size up (Relax's, PyTorch's and ONNX's rule: ``stride - 1`` added
        before the division, minus one window if the last would start in the right padding).
    layout : str, optional
        One letter per axis of ``data``, no split axes.
    fast_math : bool, optional
        Allow the reducer that drops NaN.
    name : str, optional
        Name of the compute stage.

    Returns
    -------
    te.Tensor
        Tagged ``"pool_max"``; window positions in the padding contribute nothing (a window
        entirely in the padding gives ``-inf``). A window of at most :data:`UNROLLED_TAPS`
        positions is one expression over its taps, a larger one a reduction over the window.

    Raises
    ------
    ValueError
        On a layout that does not match ``data`` or arguments of the wrong length.
    """
    check_tensor(data, "data")
    shape = shape_of(data)
    spatial = [i for i, c in enumerate(layout) if c in _SPATIAL]
    if len(layout) != len(shape) or len(set(layout)) != len(layout) or not layout.isupper() or not spatial:
        raise ValueError(f"layout {layout!r} does not describe the {len(shape)}-D data of shape {list(shape)} "
                         f"(one upper-case letter per axis, at least one of D, H, W)")
    nsp = len(spatial)
    kernel = ntuple(pool_size, nsp, "pool_size", minimum=1)
    stride = ntuple(strides, nsp, "strides", minimum=1)
    dil = ntuple(dilation, nsp, "dilation", minimum=1)
    pads = ntuple(padding, 2 * nsp, "padding") if not isinstance(padding, int) else (padding,) * (2 * nsp)
    before, after = pads[:nsp], pads[nsp:]
    itype = index_dtype(data)
    out_shape = list(shape)
    for j, axis in enumerate(spatial):
        span = shape[axis] + before[j] + after[j] - dil[j] * (kernel[j] - 1) - 1 + (stride[j] - 1 if ceil_mode else 0)
        out_shape[axis] = span // stride[j] + 1
        if ceil_mode and (out_shape[axis] - 1) * stride[j] >= shape[axis] + before[j]:
            out_shape[axis] -= 1  # rounding up never adds a window that starts in the right padding
    rk = [reduce_axis(k, f"r{c}", itype) for k, c in zip(kernel, (layout[a].lower() for a in spatial))]
    reducer = ieee.max_reducer(fast_math=fast_math)
    # Padding in its own stage (as TVM's pool does): a bounds test inside the reduction keeps
    # the loop 4x slower than a padded read. Only what a window reaches is padded after.
    pad_before, pad_after = [0] * len(shape), [0] * len(shape)
    for j, axis in enumerate(spatial):
        pad_before[axis] = before[j]
        pad_after[axis] = reached_padding_after(extent=shape[axis], before=before[j], outputs=out_shape[axis],
                                                window=kernel[j], stride=stride[j], dilation=dil[j])
    padded = pad(data, pad_before, pad_after, value=float(ieee.lowest(dtype_of(data)).value),
                 name=f"{name}_pad")

    def tap(idx, offsets):
        coords = list(idx)
        for j, axis in enumerate(spatial):
            coords[axis] = idx[axis] * stride[j] + offsets[j] * dil[j]
        return padded(*coords)

    if math.prod(kernel) <= UNROLLED_TAPS:
        def body(*idx):
            taps = [tap(idx, offsets) for offsets in itertools.product(*(range(k) for k in kernel))]
            return ieee.max_of(taps, fast_math=fast_math)
    else:
        def body(*idx):
            return reducer(tap(idx, rk), axis=rk)

    return te.compute(index_shape(out_shape, itype), body, name=name, tag="pool_max")
