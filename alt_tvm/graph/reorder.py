"""Cheaper orders of linear operators: exact rewrites that remove arithmetic.

Unlike :mod:`alt_tvm.graph.canonical`, which picks one spelling of the same computation,
each rule here changes what is computed into an equal (in exact arithmetic) result that
costs less; results differ from the original order by rounding only.

* ``convs_before_resizes``: a 1x1 convolution over a channel concatenation is the sum of a
  1x1 convolution per part (the weight sliced along its input channels). A part that is a
  resize (``image.resize2d``) that upsamples is a per-channel linear map of space, which
  commutes with the convolution's mixing of channels, so that part's convolution runs
  before the resize, at the smaller size. A resize to its own size is the identity and is
  dropped. Segmentation heads that upsample every stage's features to one size and mix them
  (SegFormer's all-MLP decoder, Xie et al. 2021, Sec. 3.2) spend most of their time in that
  convolution: SegFormer-B0's 1024 -> 256 at 1/4 of the input's size is 44% of its model.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tvm
from tvm import relax

from alt_tvm.strategies.base import const_value, op_name, static_shape

from .canonical import _apply, _Graph, _Match

__all__ = ["convs_before_resizes", "reorder"]

#: Resize modes that are one linear map per channel: ``tf_crop_and_resize`` fills outside
#: its region with a constant, which does not commute with a weighted sum of channels.
_LINEAR_RESIZE_METHODS = ("nearest_neighbor", "linear", "cubic")
#: Coordinate modes that sample a resize to its own size at the input's own positions
#: (``tf_half_pixel_for_nn`` samples half a pixel off).
_ALIGNED_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def reorder(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply every rule of this module to ``main`` (see the module docstring)."""
    return convs_before_resizes(mod)


def convs_before_resizes(mod: tvm.IRModule) -> tvm.IRModule:
    """Split each 1x1 convolution over a concatenation that has an upsampled part.

    The rule applies to an NCHW ``conv2d`` with a constant 1x1 weight, unit strides and
    dilation, no padding and one group, whose input is a concatenation along channels used by
    it alone. The parts that are no resize stay concatenated under one convolution; every
    upsampling resize used by the concatenation alone gets its slice of the weight applied to
    its input, and the terms are summed (the convolution's epilogue takes the sums).
    """
    return _apply(mod, _convs_over_concats)


def _convs_over_concats(graph: _Graph) -> Iterator[_Match]:
    for var, value in graph.values.items():
        weight = _pointwise_weight(value)
        if weight is None:
            continue
        concat = graph.producer(value.args[0], "relax.concat")
        if concat is None or graph.only_user(value.args[0]) != var or not isinstance(concat.args[0], relax.Tuple):
            continue
        if int(concat.attrs.axis) % 4 != 1:
            continue
        split = _split_parts(graph, value.args[0], concat.args[0].fields, weight)
        if split is None:
            continue
        direct, resized, dropped = split

        def make(visit, conv=value, direct=tuple(direct), resized=tuple(resized)):
            terms = []
            if direct:
                inputs = [visit(part) for part, _ in direct]
                data = inputs[0] if len(inputs) == 1 else relax.op.concat(inputs, axis=1)
                terms.append(_conv(conv, data, np.concatenate([w for _, w in direct], axis=1)))
            for resize, w in resized:
                low = _conv(conv, visit(resize.args[0]), w)
                terms.append(relax.Call(resize.op, [low, *(visit(a) for a in resize.args[1:])], resize.attrs))
            total = terms[0]
            for term in terms[1:]:
                total = relax.op.add(total, term)
            return total

        yield _Match(var, make, (value.args[0], *dropped))


def _pointwise_weight(value: relax.Expr) -> np.ndarray | None:
    """The constant weight of a plain NCHW 1x1 ``conv2d`` (else None)."""
    if op_name(value) != "relax.nn.conv2d":
        return None
    weight = const_value(value.args[1])
    attrs = value.attrs
    out_layout = str(attrs.out_layout) if attrs.out_layout else str(attrs.data_layout)
    if weight is None or weight.ndim != 4 or weight.shape[2:] != (1, 1) or int(attrs.groups) != 1:
        return None
    if (str(attrs.data_layout), str(attrs.kernel_layout), out_layout) != ("NCHW", "OIHW", "NCHW"):
        return None
    if any(int(s) != 1 for s in (*attrs.strides, *attrs.dilation)) or any(int(p) for p in attrs.padding):
        return None
    return weight


def _split_parts(graph: _Graph, concat_var: relax.Var, parts, weight: np.ndarray):
    """``(direct [(part, weight)], resized [(resize call, weight)], dropped vars)`` or None.

    None when no part is an upsampling resize (nothing to gain) or a shape is unknown.
    """
    direct, resized, dropped, offset = [], [], [], 0
    for part in parts:
        shape = static_shape(part)
        if shape is None or len(shape) != 4:
            return None
        w = weight[:, offset:offset + shape[1]]
        offset += shape[1]
        resize = graph.producer(part, "relax.image.resize2d")
        if resize is None or graph.only_user(part) != concat_var or not _per_channel_resize(resize):
            direct.append((part, w))
            continue
        source = static_shape(resize.args[0])
        if source is None:
            return None
        if source == shape and str(resize.attrs.coordinate_transformation_mode) in _ALIGNED_MODES:
            direct.append((resize.args[0], w))
        elif source[2] * source[3] < shape[2] * shape[3]:
            resized.append((resize, w))
        else:
            direct.append((part, w))
            continue
        dropped.append(part)
    if not resized or offset != weight.shape[1]:
        return None
    return direct, resized, dropped


def _per_channel_resize(resize: relax.Call) -> bool:
    attrs = resize.attrs
    return (str(attrs.layout) == "NCHW" and str(attrs.method) in _LINEAR_RESIZE_METHODS
            and str(attrs.coordinate_transformation_mode) != "tf_crop_and_resize")


def _conv(conv: relax.Call, data: relax.Expr, weight: np.ndarray) -> relax.Call:
    return relax.Call(conv.op, [data, relax.const(np.ascontiguousarray(weight))], conv.attrs)

