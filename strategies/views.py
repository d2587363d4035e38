"""Data-movement ops a kernel can read through instead of running them (views).

Between a projection GEMM and attention, models move Q, K and V into the heads' layout with
reshapes, transposes, ``expand_dims``/``squeeze``, a ``split`` or ``strided_slice`` of a packed
QKV projection or ``take`` of one of its thirds, and a scalar scale. Each of these only renames elements (or
scales them): a kernel that reads its operand through the composed index map reads the
projection's output where it lies, and the copies never run. This is ALT's layout
propagation (Xu et al. 2023, §4.2) applied to the views in front of an operator: the
operand's layout is the one its producer wrote, described by the ops in between.

:func:`view_source` says which bindings qualify (and what they view); :func:`view_te` gives
one renaming's TE on its operand's (inlined when the kernel is scheduled); :class:`ViewReader`
reads a partition's operands through its views, with the factor of any scalar scale on the
way (it commutes with the renamings, so the kernel applies it once, where it is cheapest).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tvm import ir, relax, te, tirx
from tvm.sym import Analyzer

from alt_tvm.layout import Layout

from .base import op_name, static_shape
from .constants import const_value

#: Ops that only rename elements: their output is an index map of their input's elements.
RENAMING_OPS = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze")


def view_source(binding: relax.VarBinding, producers: dict) -> relax.Expr | None:
    """The tensor ``binding`` renames, or scales by a constant scalar; None if it does neither.

    ``producers`` maps variables to their bindings (to see through a ``split``'s tuple).
    """
    value = binding.value
    if isinstance(value, relax.TupleGetItem):
        split = producers.get(value.tuple_value)
        if split is not None and op_name(split.value) == "relax.split" and static_shape(split.value.args[0]):
            return split.value.args[0]
        return None
    name = op_name(value)
    if name is None or static_shape(binding.var) is None or static_shape(value.args[0]) is None:
        return None
    if name in RENAMING_OPS:
        return value.args[0]
    if name == "relax.take" and _constant_index(value.args[1]) is not None:
        return value.args[0]
    if name == "relax.strided_slice" and _slice_starts(value) is not None:
        return value.args[0]
    scaled = _scaled(binding)
    return None if scaled is None else scaled[0]


def _scaled(binding: relax.VarBinding) -> tuple[relax.Expr, float] | None:
    """``(x, c)`` for ``multiply(x, c)`` or ``multiply(c, x)`` with a constant scalar ``c``."""
    value = binding.value
    if op_name(value) != "relax.multiply" or len(value.args) != 2:
        return None
    for data, other in ((const_value(value.args[1]), value.args[0]), (const_value(value.args[0]), value.args[1])):
        if data is not None and data.size == 1 and static_shape(other) == static_shape(binding.var):
            return other, float(data.reshape(-1)[0])
    return None


class ViewReader:
    """A partition's operands read through the views of its prologue.

    :meth:`operand` gives the TE of an operand as an index map of the tensor its views start
    from (a placeholder of the kernel), and the product of the scales met on the way;
    :attr:`stages` are the views' stages, for the schedule to inline.
    """

    def __init__(self, context) -> None:
        self.context = context
        self.producers = {b.var: b for b in context.partition.prologue}
        self.stages: list[te.Tensor] = []
        self._read: dict = {}  # var -> (tensor, factor)

    def operand(self, expr: relax.Expr, name: str) -> tuple[te.Tensor, float]:
        """``(tensor, factor)``: ``expr`` equals ``factor * tensor``."""
        binding = self.producers.get(expr)
        if binding is None:
            return self.context.te_input(expr, name), 1.0
        if expr not in self._read:
            source, factor = self.operand(view_source(binding, self.producers), name)
            scaled = _scaled(binding)
            if scaled is not None:
                self._read[expr] = (source, factor * scaled[1])
            else:
                stage = view_te(binding, source, self.producers, name=f"{name}_view{len(self.stages)}")
                self.stages.append(stage)
                self._read[expr] = (stage, factor)
        return self._read[expr]


def index_map(binding: relax.VarBinding, source_shape: Sequence[int], producers: dict
              ) -> Callable[[Sequence[Any]], list[Any]]:
    """The index in its source of each element of the renaming ``binding``: a function of the
    output index, written with ``+ * // %`` only, so that it maps TIR expressions (a kernel's
    loads) and NumPy index arrays (:func:`source_positions`) alike."""
    value = binding.value
    shape = static_shape(binding.var)
    rank = len(source_shape)
    if isinstance(value, relax.TupleGetItem):
        split = producers[value.tuple_value].value
        axis = int(split.attrs.axis) % rank
        start = split_starts(split, int(source_shape[axis]))[int(value.index)]
        return lambda i: [*i[:axis], i[axis] + start, *i[axis + 1:]]
    op = op_name(value)
    if op == "relax.permute_dims":
        axes = permute_axes(value, rank)
        where = {axis: k for k, axis in enumerate(axes)}  # source axis -> output axis
        return lambda i: [i[where[a]] for a in range(rank)]
    if op == "relax.take":
        axis = int(value.attrs.axis) % rank
        index = _constant_index(value.args[1])
        return lambda i: [*i[:axis], index, *i[axis:]]
    if op == "relax.strided_slice":
        starts = _slice_starts(value)
        return lambda i: [x + start for x, start in zip(i, starts)]
    # reshape, expand_dims, squeeze: the same elements in row-major order.
    sizes = [int(s) for s in source_shape]
    if math.prod(shape) != math.prod(sizes):
        raise ValueError(f"{op} of {tuple(sizes)} to {shape} changes the element count")

    def unravel(i):
        flat = 0
        for index, extent in zip(i, shape):
            flat = flat * extent + index
        unravelled = []
        for extent in reversed(sizes):
            unravelled.append(flat % extent)
            flat = flat // extent
        return unravelled[::-1]

    return unravel


def permute_axes(call: relax.Call, rank: int) -> list[int]:
    """The axes of a ``permute_dims`` call, non-negative (none given: reversed, as NumPy's)."""
    return list(range(rank))[::-1] if call.attrs.axes is None else [int(a) % rank for a in call.attrs.axes]


def renaming_layout(binding: relax.VarBinding) -> Layout | None:
    """A ``permute_dims`` or ``reshape`` as a layout: over the op's output shape, mapping it to
    its input's shape, so that the output is the input's buffer read through it (ALT's
    propagation through data-movement ops, Xu et al. 2023, §4.2). None for another op."""
    value = binding.value
    out_shape, in_shape = static_shape(binding.var), static_shape(value.args[0]) if value.args else None
    if out_shape is None or in_shape is None:
        return None
    op = op_name(value)
    if op == "relax.permute_dims":
        axes = permute_axes(value, len(in_shape))
        return Layout(out_shape).reorder([axes.index(d) for d in range(len(in_shape))])
    if op != "relax.reshape" or math.prod(out_shape) != math.prod(in_shape):
        return None
    groups = _reshape_groups(out_shape, in_shape)
    if groups is None:  # through the flat position: every index a division and a remainder
        layout = Layout(out_shape)
        if len(out_shape) > 1:
            layout = layout.fuse(list(range(len(out_shape))))
        return layout.split(0, list(in_shape)) if len(in_shape) > 1 else layout
    # Group by group, so that a split of (4096,) into (64, 64) reads position h * 64 + w
    # rather than a flat position's quotient and remainder, which the kernels cannot vectorise.
    layout = Layout(out_shape)
    for outs, ins in reversed(groups):
        if len(outs) > 1:
            layout = layout.fuse(outs)
        if len(ins) > 1:
            layout = layout.split(outs[0], [in_shape[d] for d in ins])
    return layout


def _reshape_groups(out_shape: Sequence[int], in_shape: Sequence[int]) -> list | None:
    """Consecutive dims of ``out_shape`` and ``in_shape`` (lists of indices, pairwise) whose
    extents multiply to the same size, each group as small as it can be; dims of extent 1 join
    the group before them. None for a shape with an extent 0 or below."""
    if min((*out_shape, *in_shape), default=1) < 1:
        return None
    groups: list = []
    i = j = 0
    while i < len(out_shape) and j < len(in_shape):
        outs, ins = [i], [j]
        size_out, size_in = out_shape[i], in_shape[j]
        i, j = i + 1, j + 1
        while size_out != size_in:
            if size_out < size_in:
                outs.append(i)
                size_out *= out_shape[i]
                i += 1
            else:
                ins.append(j)
                size_in *= in_shape[j]
                j += 1
        groups.append((outs, ins))
    if not groups:
        return None
    # trailing dims of extent 1 on either side
    groups[-1] = (groups[-1][0] + list(range(i, len(out_shape))), groups[-1][1] + list(range(j, len(in_shape))))
    return groups


def view_te(binding: relax.VarBinding, source: te.Tensor, producers: dict, *, name: str = "view") -> te.Tensor:
    """``binding``'s renaming of ``source`` (its input's stage) as TE, a stage named ``name``."""
    shape = static_shape(binding.var)
    mapping = index_map(binding, [int(s) for s in source.shape], producers)

    def element(*i):
        # Simplified within the output's bounds, ``(s * 768 + h * 64 + d) % 768`` is
        # ``h * 64 + d``: no division is left in the kernel's inner loops.
        analyzer = Analyzer()
        for index, extent in zip(i, shape):
            analyzer.bind(index, ir.Range(0, extent))
        return source(*(analyzer.simplify(tirx.const(0, "int32") + x) for x in mapping(i)))

    return te.compute(shape, element, name=name)


def source_positions(expr: relax.Expr, producers: dict) -> tuple[relax.Expr, np.ndarray]:
    """``(source, positions)``: the tensor that ``expr`` views through the bindings of
    ``producers``, and for each element of ``expr`` its row-major position in ``source``."""
    binding = producers.get(expr)
    inner = view_source(binding, producers) if binding is not None else None
    if inner is None:
        shape = static_shape(expr)
        return expr, np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    source, positions = source_positions(inner, producers)
    if _scaled(binding) is not None:
        return source, positions
    index = index_map(binding, positions.shape, producers)(list(np.indices(static_shape(binding.var))))
    return source, positions[tuple(np.broadcast_to(np.asarray(x), static_shape(binding.var)) for x in index)]


def contiguous_layout(shape: Sequence[int], reads: Sequence[np.ndarray]) -> Layout | None:
    """A layout (splits and a reorder) of a tensor of ``shape`` in which each of ``reads`` is
    one contiguous row-major block, or None if there is none.

    ``reads`` are :func:`source_positions` arrays of operands of one shape, each at its own
    offset (Q, K and V as thirds of a packed projection, or one operand alone). Each must
    be an affine map of its index whose strides and offsets, sorted, factor ``shape``'s
    rows: ``[s, 3 * 12 * 64]`` read as ``[3 x] [1, 12, s, 64]`` becomes
    ``[s, 3, 12, 64] -> [3, 12, s, 64]``, and the heads are contiguous per operand.
    """
    shape = [int(e) for e in shape]
    if not reads or any(r.shape != reads[0].shape for r in reads):
        return None
    operand = reads[0].shape
    grid = np.indices(operand).reshape(len(operand), -1)
    digits = []  # (stride, extent, order): order places the digit in the layout
    for axis, extent in enumerate(operand):
        if extent > 1:
            unit = [0] * len(operand)
            unit[axis] = 1
            digits.append((int(reads[0][tuple(unit)] - reads[0].flat[0]), extent, 1 + axis))
    offsets = sorted(int(r.flat[0]) for r in reads)
    for positions in reads:
        affine = positions.flat[0] + sum(stride * grid[order - 1] for stride, _, order in digits)
        if not np.array_equal(positions.reshape(-1), affine):
            return None
    if len(offsets) > 1:
        step = offsets[1] - offsets[0]
        if step <= 0 or offsets != [offsets[0] + k * step for k in range(len(offsets))]:
            return None
        digits.append((step, len(offsets), 0))  # which operand: outermost
    if offsets[0] != 0:
        return None
    digits.sort()
    covered = 1
    for stride, extent, _ in digits:
        if stride != covered:
            return None
        covered *= extent
    if covered != math.prod(shape):
        return None
    # Each digit inside one axis of ``shape``; split every axis into its digits (outer first).
    layout, position, placed = Layout(shape), 0, []  # placed: the order of each current dim
    axis_stride = math.prod(shape)
    for extent in shape:
        axis_stride //= extent
        inside = sorted((d for d in digits if axis_stride <= d[0] < axis_stride * extent), reverse=True)
        if math.prod(d[1] for d in inside) != extent:
            return None
        if len(inside) > 1:
            layout = layout.split(position, [d[1] for d in inside])
        placed.extend([d[2] for d in inside] or [-1])  # a unit axis goes first
        position += max(1, len(inside))
    perm = sorted(range(len(placed)), key=lambda k: placed[k])
    return layout.reorder(perm) if perm != list(range(len(placed))) else layout


def _constant_index(expr: relax.Expr) -> int | None:
    data = const_value(expr)
    if data is None or data.ndim != 0 or data.dtype.kind not in "iu":
        return None
    return int(data)


def _slice_starts(call: relax.Call) -> list[int] | None:
    """Per axis, where a ``strided_slice`` with constant bounds and unit steps starts; None
    for any other slice (a step other than 1 is not a block of its input)."""
    shape = static_shape(call.args[0])
    if len(call.args) < 4 or shape is None:
        return None
    try:
        axes, begins, ends = ([int(v.value) for v in arg.fields] for arg in call.args[1:4])
        steps = [int(v.value) for v in call.args[4].fields] if len(call.args) > 4 else [1] * len(axes)
    except (AttributeError, TypeError, ValueError):
        return None
    starts = [0] * len(shape)
    for axis, begin, end, step in zip(axes, begins, ends, steps):
        axis %= len(shape)
        begin = begin + shape[axis] if begin < 0 else begin
        if step != 1 or not 0 <= begin < shape[axis] or end <= begin:
            return None
        starts[axis] = begin
    return starts


def split_starts(split: relax.Call, extent: int) -> list[int]:
    """Where each output of ``split`` starts along its axis."""
    sections = split.attrs.indices_or_sections
    if isinstance(sections, (list, tuple)) or hasattr(sections, "__len__"):
        return [0, *(int(i) for i in sections)]
    count = int(sections)
    return [k * (extent // count) for k in range(count)]
