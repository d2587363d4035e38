"""Row kernels on CPUs: softmax and layer norm over the last axis, epilogue fused.

The computation is :mod:`alt_tvm.ops.rows` (rows padded to whole vectors, one partial per
lane). The schedule runs rows in parallel and keeps each row's intermediate values in a
buffer of one row, inside the loop over rows: the row is read from memory once and every
later pass over it hits the L1 cache. An operand stored in a tiled layout is read in that
layout (the rewriter maps the accesses), so these ops need no layout conversion.
"""

from __future__ import annotations

import abc
import math
from typing import Any

import tvm

from alt_tvm.layout.rewrite import TensorMap
from alt_tvm.ops.rows import RowKernel, layer_norm_rows, softmax_rows
from alt_tvm.strategies.base import OpInfo, Strategy, static_shape
from alt_tvm.strategies.registry import register_strategy

#: Longest row kept in one buffer (64 KiB of float32): a row lives on a thread's stack.
MAX_ROW = 16384


def schedule_rows(func: tvm.tirx.PrimFunc, *, kernel: RowKernel, stages: list, rows: int = 1) -> tvm.IRModule:
    """Rows in parallel (``rows`` per parallel task); per row, its stages computed in order
    into row buffers.

    Padded rows are written and read as whole vectors; each lane partial keeps ``lanes``
    accumulators in one vector register over the row's vectors.
    """
    sch = tvm.s_tir.Schedule(func)
    chain = [kernel.output, *stages]
    for stage in chain[:-1]:
        sch.compute_inline(sch.get_sblock(stage.op.name))
    rank = len(kernel.output.shape)
    row = None
    if rank > 1:
        loops = sch.get_loops(sch.get_sblock(chain[-1].op.name))
        row = sch.fuse(*loops[:rank - 1]) if rank > 2 else loops[0]
        if rows > 1:
            task, row = sch.split(row, [None, rows])
            sch.parallel(task)
        else:
            sch.parallel(row)
    for stage in reversed(kernel.row_stages):
        if row is not None:
            sch.compute_at(sch.get_sblock(stage.op.name), row, preserve_unit_loops=True)
    vectorize_row_stages(sch, kernel)
    return sch.mod


def vectorize_row_stages(sch: tvm.s_tir.Schedule, kernel: RowKernel) -> None:
    """Vector loops over the lanes of a row kernel's padded rows and lane partials (each
    partial's ``lanes`` accumulators in one register), once the stages have their places."""
    lanes = kernel.lanes
    for stage in kernel.row_stages:
        block = sch.get_sblock(stage.op.name)
        if int(stage.shape[-1]) != lanes or lanes == 1:
            continue  # a per-row scalar, or a reduction over the lanes
        if isinstance(stage.op.body[0], tvm.tirx.Reduce):
            *_, lane, vector = sch.get_loops(block)
            sch.reorder(vector, lane)
            sch.vectorize(lane)
            sch.decompose_reduction(block, vector)  # the initialisation keeps the vector loop
        else:
            sch.vectorize(sch.get_loops(block)[-1])


def _float32_last_axis(info: OpInfo, axes: list[int]) -> str | None:
    if not info.input_dtypes or info.input_dtypes[0] != "float32":
        return f"dtype {info.input_dtypes[0] if info.input_dtypes else None!r} (needs float32)"
    rank = len(info.input_shapes[0])
    if rank == 0 or [a % rank for a in axes] != [rank - 1]:
        return f"axes {axes} of a rank-{rank} input (needs the last axis alone)"
    if info.input_shapes[0][-1] > MAX_ROW:
        return f"row of {info.input_shapes[0][-1]} elements (at most {MAX_ROW})"
    return None


#: Rows of at most this many vectors keep their partial sums in half vectors (:func:`row_lanes`)
#: where half vectors issue at the full rate of lanes, and where they issue at half of it.
HALF_LANE_VECTORS = 7
HALF_RATE_HALF_LANE_VECTORS = 4


def row_lanes(length: int, lanes: int, *, half_vectors_full_rate: bool) -> int:
    """Vector width of a row kernel's padded rows and lane partials for rows of ``length``:
    half a vector for rows of at most :data:`HALF_LANE_VECTORS` vectors where half vectors
    issue at the full rate of lanes (the target's ``half_vectors_full_rate``), of at most
    :data:`HALF_RATE_HALF_LANE_VECTORS` where they issue at half of it; else a whole one.

    Each row ends in reductions across the partials' lanes, a fixed cost that a short row does
    not amortise, and a half vector's takes one step less; where half vectors also take half
    the lanes per cycle, the row's own work costs more in them and the bound is lower. Layer
    norms alone on Zen 4, half against whole vectors: 16 lanes (full rate) rows of 32 floats
    0.63-0.65x the time, 64 0.80-0.85x, 96 0.93x, 112 0.95-0.96x; 128 1.03x, 160 1.06x, 384
    1.36-1.44x; the AVX2 build (8 lanes, half rate) 16 floats 0.89x, 24 0.94x, 32 0.97x;
    48 1.14x, 64 1.28x, 96 1.43x."""
    bound = HALF_LANE_VECTORS if half_vectors_full_rate else HALF_RATE_HALF_LANE_VECTORS
    return lanes // 2 if lanes >= 8 and length <= bound * lanes else lanes


class _RowStrategy(Strategy):
    """A row kernel with the partition's epilogue fused: subclasses say which kernel."""

    name = "alt"
    target_kinds = ("llvm",)
    priority = 10

    @abc.abstractmethod
    def kernel(self, call: Any, context: Any, lanes: int) -> RowKernel:
        """The row kernel computing ``call`` with ``lanes``-wide vectors."""

    def implement(self, anchor, context) -> Any:
        shape = static_shape(anchor.value.args[0])
        params = context.params or {"rows": 1, "lanes": self._rule_lanes(shape[-1], context.target)}
        rows, lanes = int(params["rows"]), int(params["lanes"])
        if rows < 1 or lanes < 1:
            raise ValueError(f"row kernel parameters {params} must be positive (rows per task, vector lanes)")
        kernel = self.kernel(anchor.value, context, lanes)
        stages = context.epilogue_te(kernel.output)
        return context.finish(output=stages[-1] if stages else kernel.output, layouts=TensorMap(),
                              strategy=self.name,
                              schedule=lambda f: schedule_rows(f, kernel=kernel, stages=stages, rows=rows))

    def space(self, anchor, context) -> Any:
        from .space import RowSpace

        shape = static_shape(anchor.value.args[0])
        return RowSpace(rows=math.prod(shape[:-1]), lanes=context.target.vector_lanes("float32"),
                        default_lanes=self._rule_lanes(shape[-1], context.target))

    @staticmethod
    def _rule_lanes(length: int, target: Any) -> int:
        """:func:`row_lanes` for rows of ``length`` on ``target``: the untuned build's width."""
        return row_lanes(length, target.vector_lanes("float32"), half_vectors_full_rate=target.half_vectors_full_rate)


class AltSoftmaxStrategy(_RowStrategy):
    """``relax.nn.softmax`` over the last axis (attention scores, classifier outputs)."""

    ops = ("relax.nn.softmax",)

    def applicable(self, info: OpInfo) -> str | None:
        return _float32_last_axis(info, [int(info.attrs.get("axis", -1))])

    def kernel(self, call: Any, context: Any, lanes: int) -> RowKernel:
        return softmax_rows(context.te_input(call.args[0], "data"), lanes=lanes)


class AltLayerNormStrategy(_RowStrategy):
    """``relax.nn.layer_norm`` over the last axis (transformers; ConvNeXt after its permute)."""

    ops = ("relax.nn.layer_norm",)

    def applicable(self, info: OpInfo) -> str | None:
        why = _float32_last_axis(info, [int(a) for a in info.attrs.get("axes", [])])
        if why is None and any(d != "float32" for d in info.input_dtypes):
            return f"dtypes {info.input_dtypes} (needs float32)"
        return why

    def kernel(self, call: Any, context: Any, lanes: int) -> RowKernel:
        data = context.te_input(call.args[0], "data")
        attrs = call.attrs
        gamma = context.te_input(call.args[1], "gamma") if bool(attrs.scale) else None
        beta = context.te_input(call.args[2], "beta") if bool(attrs.center) else None
        return layer_norm_rows(data, gamma, beta, epsilon=float(attrs.epsilon), lanes=lanes)


register_strategy(AltSoftmaxStrategy())
register_strategy(AltLayerNormStrategy())
