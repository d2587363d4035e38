"""Cheaper orders of linear operators: exact rewrites that remove arithmetic.

Unlike :mod:`alt_tvm.graph.canonical`, which picks one spelling of the same computation,
each rule here changes what is computed into an equal (in exact arithmetic) result that
costs less; results differ from the original order by rounding only.

* ``merge_parallel_convs``: a sum of linear functions of one map ``x`` (convolutions of it,
  per-channel multiples of it and of such sums, per-channel constants) is one convolution of
  ``x`` whose weight is the terms' weights added, each smaller kernel at its place in the
  largest (and ``x`` itself a centre tap where each output channel reads its own input
  channel). This is the structural re-parameterisation of multi-branch blocks (RepVGG,
  Ding et al. 2021, Sec. 3.3; MobileOne and FastViT's RepMixer, Vasu et al. 2023, Sec. 3.1)
  for models exported in their training form: FastViT-T8 from timm sums a 3x3 and a 1x1
  depthwise conv and two batch norms of the input in each RepMixer.
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
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from alt_tvm.strategies.base import const_value, dtype_of, op_name, static_shape

from .canonical import RuleGraph, RuleMatch, apply_rule, per_channel_vector, plain_layouts

__all__ = ["convs_before_resizes", "merge_parallel_convs", "reorder"]

#: Resize modes that are one linear map per channel: ``tf_crop_and_resize`` fills outside
#: its region with a constant, which does not commute with a weighted sum of channels.
_LINEAR_RESIZE_METHODS = ("nearest_neighbor", "linear", "cubic")
#: Coordinate modes that sample a resize to its own size at the input's own positions
#: (``tf_half_pixel_for_nn`` samples half a pixel off).
_ALIGNED_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def reorder(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply every rule of this module to ``main`` (see the module docstring)."""
    return convs_before_resizes(merge_parallel_convs(mod))


def convs_before_resizes(mod: tvm.IRModule) -> tvm.IRModule:
    """Split each 1x1 convolution over a concatenation that has an upsampled part.

    The rule applies to an NCHW ``conv2d`` with a constant 1x1 weight, unit strides and
    dilation, no padding and one group, whose input is a concatenation along channels used by
    it alone. The parts that are no resize stay concatenated under one convolution; every
    upsampling resize used by the concatenation alone gets its slice of the weight applied to
    its input, and the terms are summed (the convolution's epilogue takes the sums).
    """
    return apply_rule(mod, _convs_over_concats)


def _convs_over_concats(graph: RuleGraph) -> Iterator[RuleMatch]:
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

        yield RuleMatch(var, make, (value.args[0], *dropped))


def _pointwise_weight(value: relax.Expr) -> np.ndarray | None:
    """The constant weight of a plain NCHW 1x1 ``conv2d`` (else None)."""
    weight = _plain_weight(value) if op_name(value) == "relax.nn.conv2d" else None
    attrs = value.attrs if weight is not None else None
    if weight is None or weight.shape[2:] != (1, 1) or int(attrs.groups) != 1:
        return None
    if any(int(s) != 1 for s in attrs.strides) or any(int(p) for p in attrs.padding):
        return None
    return weight


def _split_parts(graph: RuleGraph, concat_var: relax.Var, parts, weight: np.ndarray):
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


# ----------------------------------------------------------------------------- parallel convolutions


_SUM_OPS = ("relax.add", "relax.subtract", "relax.multiply")


@dataclass(frozen=True)
class _Term:
    """``scale * conv(x)`` (``conv`` set), ``scale * x`` (``x`` set) or a constant ``scale``."""

    scale: np.ndarray  # per output channel, float64
    conv: relax.Call | None = None
    x: relax.Expr | None = None


def merge_parallel_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """Merge each sum of linear branches of one map into one convolution.

    A sum (``add``/``subtract``, per-channel ``multiply`` by constants) is read down through
    values only the sum uses (one it uses twice counts twice); its leaves are NCHW ``conv2d``
    with constant weights (one group count, strides and output shape, unit dilation), the map
    ``x`` they read, and constants along the channels. It merges when it has a convolution and
    another term, every smaller kernel lies inside the largest one's window, and ``x`` itself
    (if a term) has the output's shape and reads each output channel from its own input channel.
    """
    return apply_rule(mod, _parallel_convs)


def _parallel_convs(graph: RuleGraph) -> Iterator[RuleMatch]:
    found = {}
    for var, value in graph.values.items():
        if op_name(value) not in ("relax.add", "relax.subtract"):
            continue
        shape = static_shape(var)
        if shape is None or len(shape) != 4 or dtype_of(var) not in ("float32", "float64"):
            continue
        tree = _sum_tree(graph, var, shape)
        merged = _merged(_linear_terms(graph, var, np.ones(shape[1]), shape, tree), shape)
        if merged is not None:
            found[var] = (merged, [v for v in tree if v is not var])
    inner = {m for _, members in found.values() for m in members}
    for var, ((x, conv, weight, bias), members) in found.items():
        if var in inner:
            continue  # part of a larger sum

        def make(visit, x=x, conv=conv, weight=weight, bias=bias):
            return relax.op.add(_conv(conv, visit(x), weight), relax.const(bias))

        yield RuleMatch(var, make, tuple(members))


def _sum_tree(graph: RuleGraph, root: relax.Var, shape) -> set:
    """The values a sum at ``root`` may read through: ``root``, and each ``add``,
    ``subtract``, ``multiply`` or ``conv2d`` of ``shape`` that only values of the tree use (a
    value used twice in the sum, as PyTorch's dynamo export shares a batch norm, is one)."""
    tree, changed = {root}, True
    while changed:
        changed = False
        for var in list(tree):
            value = graph.values[var]
            if op_name(value) not in _SUM_OPS:
                continue
            for operand in value.args:
                if (operand in tree or operand not in graph.values or static_shape(operand) != tuple(shape)
                        or op_name(graph.values[operand]) not in (*_SUM_OPS, "relax.nn.conv2d")):
                    continue
                if all(user in tree for user in graph.users.get(operand, [])):
                    tree.add(operand)
                    changed = True
    return tree


def _linear_terms(graph: RuleGraph, expr: relax.Expr, scale: np.ndarray, shape, tree: set) -> list[_Term]:
    """The terms of ``expr`` times ``scale``, read down through the values of ``tree``."""
    constant = per_channel_vector(expr, 4, shape[1])
    if constant is not None:
        return [_Term(scale * constant)]
    if expr not in tree:
        return [_Term(scale, x=expr)]
    value = graph.values[expr]
    name = op_name(value)
    if name == "relax.nn.conv2d":
        return [_Term(scale, conv=value)] if _plain_weight(value) is not None else [_Term(scale, x=expr)]
    lhs, rhs = value.args
    if name == "relax.multiply":
        factor = per_channel_vector(rhs, 4, shape[1])
        if factor is None:
            lhs, factor = rhs, per_channel_vector(lhs, 4, shape[1])
        if factor is None:
            return [_Term(scale, x=expr)]
        parts = [(lhs, scale * factor)]
    else:
        parts = [(lhs, scale), (rhs, scale if name == "relax.add" else -scale)]
    return [term for operand, factor in parts for term in _linear_terms(graph, operand, factor, shape, tree)]


def _plain_weight(conv: relax.Call) -> np.ndarray | None:
    """The constant weight of a plain NCHW ``conv2d`` with unit dilation (else None)."""
    weight = const_value(conv.args[1])
    if weight is None or weight.ndim != 4 or any(int(d) != 1 for d in conv.attrs.dilation):
        return None
    return weight if plain_layouts(conv) else None


def _merged(terms: list[_Term], shape) -> tuple | None:
    """``(x, widest conv call, merged weight, bias [1, O, 1, 1])`` or None (see
    :func:`merge_parallel_convs`)."""
    convs = [t for t in terms if t.conv is not None]
    maps = [t for t in terms if t.x is not None]
    if not convs or len(convs) + len(maps) < 2:
        return None
    x = convs[0].conv.args[0]
    if any(not t.conv.args[0].same_as(x) for t in convs) or any(not t.x.same_as(x) for t in maps):
        return None
    geometry = {(tuple(int(v) for v in t.conv.attrs.strides), int(t.conv.attrs.groups)) for t in convs}
    if len(geometry) != 1:
        return None
    (strides, groups), = geometry
    base = max(convs, key=lambda t: const_value(t.conv.args[1]).shape[2] * const_value(t.conv.args[1]).shape[3])
    weight0 = const_value(base.conv.args[1])
    top, left = int(base.conv.attrs.padding[0]), int(base.conv.attrs.padding[1])
    kh, kw = weight0.shape[2:]
    merged = np.zeros(weight0.shape, np.float64)
    for term in convs:
        weight = const_value(term.conv.args[1])
        dy, dx = top - int(term.conv.attrs.padding[0]), left - int(term.conv.attrs.padding[1])
        if (weight.shape[:2] != weight0.shape[:2] or dy < 0 or dx < 0 or dy + weight.shape[2] > kh
                or dx + weight.shape[3] > kw):
            return None
        merged[:, :, dy:dy + weight.shape[2], dx:dx + weight.shape[3]] += (
            term.scale[:, None, None, None] * weight.astype(np.float64))
    if maps:
        # x itself: a centre tap, where output channel c reads input channel c of its group
        channels = static_shape(x)
        per_group = weight0.shape[1]
        if (channels != tuple(shape) or strides != (1, 1) or top >= kh or left >= kw
                or weight0.shape[0] // groups != per_group):
            return None
        outputs = np.arange(shape[1])
        merged[outputs, outputs % per_group, top, left] += sum(t.scale for t in maps)
    bias = sum((t.scale for t in terms if t.conv is None and t.x is None), np.zeros(shape[1]))
    dtype = weight0.dtype
    return x, base.conv, merged.astype(dtype), bias.astype(dtype).reshape(1, -1, 1, 1)
