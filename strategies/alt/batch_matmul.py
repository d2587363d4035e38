"""Products of two activations on CPUs: batched matmul, and attention fused around it.

``A[.., M, K] x B[.., K, N]`` has nothing constant, so layouts stay canonical (``N`` is
already contiguous in ``B`` and in the output) and the schedule is the GEMM template's
(:func:`~alt_tvm.strategies.alt.gemm.schedule_gemm`): ``mt x nt`` outputs in registers,
batch and row blocks in parallel. A width that no vector divides (197 tokens) is computed
over a zero-padded copy of ``B``.

Attention: when the partition goes on through the softmax of the scores and their product
with ``V`` (:attr:`~alt_tvm.strategies.base.Partition.tail`), one kernel computes, for each
batch entry (head) and block of ``mt`` queries, the block's scores (with the epilogue:
scale, mask, position bias), their softmax (normalised once per row, in vectors), and the
block's ``mt x Dv`` context, whose inner loop is one FMA per vector of ``V`` with a weight
broadcast from memory. The scores exist only
as ``mt`` rows in cache, never as the whole ``M x N`` matrix per head (the idea of
FlashAttention, Dao et al. 2022, without its online softmax: a block holds its full rows of
keys, which fits L1 up to a few thousand keys).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm import te

from alt_tvm.layout.rewrite import TensorMap
from alt_tvm.ops import ieee
from alt_tvm.ops.rows import RowKernel, lane_reduce, softmax_rows
from alt_tvm.strategies.base import (
    OpInfo,
    Strategy,
    op_name,
    static_shape,
    tiles_for,
)
from alt_tvm.strategies.registry import register_strategy
from alt_tvm.strategies.space import divisors
from alt_tvm.strategies.views import ViewReader, contiguous_layout, source_positions

from .gemm import column_tile, padded_columns, row_tile, schedule_gemm
from .gemm_norm import tile_in_registers
from .patterns import ATTENTION, attention_operands, split_attention_tail
from .rows import vectorize_row_stages


def _columns(n: int, lanes: int, registers: int) -> tuple[int, int]:
    """``(nt, width)``: register-block columns and ``n`` padded to a multiple of them."""
    nt = column_tile(n, lanes, registers) if n % lanes == 0 or lanes == 1 else padded_columns(n, lanes, registers)
    return nt, -(-n // nt) * nt


def _checked(params: dict[str, Any], *, n: int, dv: int = 0) -> dict[str, Any]:
    """``params`` if its tiles fit (``vec`` divides ``nt``, ``column`` divides ``dv``), else a
    ValueError naming them."""
    bad = params["nt"] < 1 or params["mt"] < 1 or params["vec"] < 1 or params["nt"] % params["vec"]
    if dv:
        bad = bad or params["column"] < 1 or dv % params["column"] or params["column"] % params["column_vec"]
    if bad:
        raise ValueError(f"batch matmul parameters {params} do not fit N={n}" + (f", Dv={dv}" if dv else "")
                         + " (vec must divide nt; column divide Dv and column_vec column; all positive)")
    return params


def _padded_rhs(b: te.Tensor, n: int, width: int, factor: float = 1.0) -> te.Tensor:
    """``factor * B`` with its columns zero-padded to ``width``. The padding reads the last
    column (a clamped index, not a branch): both sides of the select are computed, so the
    copy stays whole vectors."""
    def value(*i):
        column = b(*i[:-1], tvm.te.min(i[-1], n - 1))
        return column if factor == 1.0 else column * tvm.tirx.const(factor, b.dtype)
    return te.compute((*b.shape[:-1], width),
                      lambda *i: tvm.tirx.Select(i[-1] < n, value(*i), tvm.tirx.const(0, b.dtype)),
                      name="rhs_padded")


class AltBatchMatmulStrategy(Strategy):
    """Matmul of two activations (attention scores and context): ``A[.., M, K] x B[.., K, N]``."""

    name = "alt"
    ops = ("relax.matmul",)
    priority = 9
    patterns = (ATTENTION,)

    def applicable(self, info: OpInfo) -> str | None:
        if any(d != "float32" for d in info.input_dtypes):
            return f"dtypes {info.input_dtypes} (needs float32)"
        a, b = info.input_shapes
        if len(a) < 2 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2]:
            return f"shapes {info.input_shapes} (needs [..., M, K] x [..., K, N] with equal batch dims)"
        return None

    def preferred_source_layouts(self, partition) -> dict:
        """For attention reading Q, K and V through views of its projections' outputs: each
        projection written so that every head's rows are contiguous (``[s, 12 * 64]`` as
        ``[12, s, 64]``, a packed ``[s, 3 * 12 * 64]`` as ``[3, 12, s, 64]``). The kernel's
        reads are then whole rows in place, and its packed ``K^T`` a transpose inside one
        head's block (:func:`~alt_tvm.strategies.views.contiguous_layout`)."""
        if not partition.tail or not partition.prologue:
            return {}
        producers = {b.var: b for b in partition.prologue}
        reads: dict = {}
        for expr, transposed in zip(attention_operands(partition), (False, True, False)):
            source, positions = source_positions(expr, producers)
            if source is not expr:  # K^T is read as K: its heads' rows contiguous like Q's and V's
                reads.setdefault(source, []).append(np.swapaxes(positions, -1, -2) if transposed else positions)
        layouts = {}
        for source, positions in reads.items():
            layout = contiguous_layout(static_shape(source), positions)
            if layout is not None and not layout.is_identity:
                layouts[source] = layout
        return layouts

    def implement(self, anchor, context) -> Any:
        if context.partition.tail:
            return self._attention(anchor, context)
        call = anchor.value
        a = context.te_input(call.args[0], "a")
        b = context.te_input(call.args[1], "b")
        *lead, m, kdim = (int(s) for s in a.shape)
        n = int(b.shape[-1])
        k = te.reduce_axis((0, kdim), "k")
        params = _checked(context.params or self.defaults(m=m, n=n, context=context), n=n)
        nt = int(params["nt"])
        width = -(-n // nt) * nt
        pad = _padded_rhs(b, n, width) if width != n else None
        rhs = pad if pad is not None else b
        gemm = te.compute((*lead, m, width), lambda *i: te.sum(a(*i[:-1], k) * rhs(*i[:-2], k, i[-1]), axis=k),
                          name="batch_matmul", tag="batch_matmul")
        if pad is None:
            stages = context.epilogue_te(gemm)
        else:
            unpadded = te.compute((*lead, m, n), lambda *i: gemm(*i), name="unpad")
            stages = [unpadded, *context.epilogue_te(unpadded)]
        final = stages[-1] if stages else gemm
        return context.finish(
            output=final, layouts=TensorMap(), strategy=self.name,
            schedule=lambda f: schedule_gemm(f, gemm=gemm, stages=stages, batch=len(lead), mt=int(params["mt"]),
                                             nt=nt, vec=int(params["vec"]), pad=pad))

    @staticmethod
    def defaults(*, m: int, n: int, context, dv: int = 0, entries: int = 1) -> dict[str, Any]:
        """The analytic register blocks (:func:`.gemm.row_tile`, :func:`_columns`,
        :func:`.gemm.column_tile`) and, for attention (``dv``: the context's width), whether
        the heads alone run in parallel (:func:`entries_in_parallel`)."""
        lanes = context.target.vector_lanes("float32")
        registers = context.target.vector_registers or 16
        nt, _ = _columns(n, lanes, registers)
        if not dv:
            return {"mt": row_tile(m, 4), "nt": nt, "vec": tiles_for(nt, lanes)}
        column = column_tile(dv, lanes, registers)
        return {"mt": attention_rows(m, vectors=-(-max(nt, column) // lanes), registers=registers), "nt": nt,
                "vec": tiles_for(nt, lanes), "column": column, "column_vec": tiles_for(column, lanes),
                "per_entry": entries_in_parallel(entries, context.target.num_cores)}

    def space(self, anchor, context) -> Any:
        from .space import BatchMatmulSpace

        a_shape, b_shape = static_shape(anchor.value.args[0]), static_shape(anchor.value.args[1])
        m, n = a_shape[-2], b_shape[-1]
        dv = 0
        if context.partition.tail:
            _, _, v_expr = attention_operands(context.partition)
            dv = static_shape(v_expr)[-1]
        default = self.defaults(m=m, n=n, context=context, dv=dv, entries=math.prod(a_shape[:-2]))
        return BatchMatmulSpace(m=m, n=n, dv=dv, lanes=context.target.vector_lanes("float32"), default=default)

    def _attention(self, anchor, context) -> Any:
        softmax, guard, product, heads = split_attention_tail(context.partition.tail)
        # Q, K and V as the projections wrote them, read through the reshapes and transposes
        # to heads (the partition's prologue); their scales all go to the packed K.
        views = ViewReader(context)
        q_expr, k_expr, v_expr = attention_operands(context.partition)
        q, q_factor = views.operand(q_expr, "q")
        keys, k_factor = views.operand(k_expr, "k")
        v, v_factor = views.operand(v_expr, "v")
        if v_factor != 1.0:
            v = te.compute(v.shape, lambda *i, v=v: v(*i) * tvm.tirx.const(v_factor, v.dtype), name="v_scaled")
            views.stages.append(v)
        *lead, m, depth = (int(s) for s in q.shape)
        n, dv = int(keys.shape[-1]), int(v.shape[-1])
        lanes = context.target.vector_lanes("float32")
        tiles = _checked(context.params or self.defaults(m=m, n=n, context=context, dv=dv,
                                                         entries=math.prod(lead)), n=n, dv=dv)
        nt = int(tiles["nt"])
        width = -(-n // nt) * nt
        # K^T packed (padded, scaled) when it is not already whole vectors of keys in place.
        packed = width != n or q_factor * k_factor != 1.0 or k_expr in views.producers
        pad = _padded_rhs(keys, n, width, q_factor * k_factor) if packed else None
        rhs = pad if pad is not None else keys
        d = te.reduce_axis((0, depth), "d")
        scores = te.compute((*lead, m, width), lambda *i: te.sum(q(*i[:-1], d) * rhs(*i[:-2], d, i[-1]), axis=d),
                            name="scores")
        valid = te.compute((*lead, m, n), lambda *i: scores(*i), name="scores_valid")
        epilogue = context.epilogue_te(valid)
        logits = epilogue[-1] if epilogue else valid
        # Rows of the padded width, -inf past n (nothing in the softmax). The padding reads
        # its padded scores (zeros, NaN only where the row is NaN anyway) so that a query
        # block computes whole register blocks of scores; operands of the epilogue (a mask
        # of n keys) are read at clamped indices, in bounds when both sides are evaluated.
        zero, minus_inf = tvm.tirx.const(0.0, "float32"), tvm.tirx.const(float("-inf"), "float32")
        rows = te.compute((*lead, m, width), lambda *i: tvm.tirx.Select(
            i[-1] < n, logits(*i[:-1], tvm.te.min(i[-1], n - 1)), scores(*i) * zero + minus_inf), name="logits_padded")
        soft = softmax_rows(rows, lanes=lanes, name="attention_softmax")
        numerator, scale = soft.numerator, soft.scale
        guard_ops = [op_name(b.value) for b in guard]
        if guard_ops and guard_ops != ["relax.isnan", "relax.where"] and guard_ops[:1] != ["relax.equal"]:
            raise ValueError(f"no attention kernel for the softmax guard {guard_ops}")
        live = ()
        if guard_ops[:1] == ["relax.equal"]:
            # PyTorch's zero weights for a row of -inf scores only (NaN scores stay NaN).
            padded_rows = soft.row_stages[0]  # [..., vectors, lanes]
            live = lane_reduce(padded_rows, (*lead, m), te.max, "attention_live", element=lambda x: (
                tvm.tirx.Select(x == minus_inf, zero, tvm.tirx.const(1.0, "float32"))))

        def normalized(*i):  # softmax(scores) in the padded row, guarded as PyTorch's export writes it
            value = numerator(*i) * scale(*i[:-2])
            if guard_ops == ["relax.isnan", "relax.where"]:
                return tvm.tirx.Select(ieee.is_nan(value), zero, value)
            if live:
                return tvm.tirx.Select(live[1](*i[:-2]) == zero, zero, value)
            return value

        # The weights, normalised once per row in vectors: the context's inner loop then
        # multiplies a value of V by a weight broadcast straight from memory.
        weights = te.compute(numerator.shape, normalized, name="attention_weights")
        j = te.reduce_axis((0, n), "j")

        # The context is written with the heads put back where the model does so next
        # (``[b, h, s, d]`` stored as ``[b, s, h, d]``): output axis k is axis ``order[k]``.
        rank = len(lead) + 2
        order = list(range(rank)) if heads is None else [int(a) % rank for a in heads.value.attrs.axes]
        position = {axis: k for k, axis in enumerate(order)}

        def context_value(*p):
            i = [p[position[axis]] for axis in range(rank)]
            return te.sum(weights(*i[:-1], j // lanes, j % lanes) * v(*i[:-2], j, i[-1]), axis=j)

        shape = (*lead, m, dv)
        out = te.compute([shape[axis] for axis in order], context_value, name="attention")
        soft = RowKernel(soft.output, (*soft.row_stages, *live, weights), lanes, soft.numerator, soft.scale)
        params = {"batch": len(lead), "mt": int(tiles["mt"]), "nt": nt, "vec": int(tiles["vec"]),
                  "column": int(tiles["column"]), "column_vec": int(tiles["column_vec"]),
                  "per_entry": bool(tiles["per_entry"]), "order": order}
        inlined = [*views.stages, valid, *epilogue, rows]
        return context.finish(output=out, layouts=TensorMap(), strategy=self.name,
                              schedule=lambda f: schedule_attention(f, scores=scores, pad=pad, inlined=inlined,
                                                                    soft=soft, out=out, **params))


def attention_rows(m: int, *, vectors: int, registers: int, preferred: int = 4) -> int:
    """Queries per register block of attention: the smallest divisor of ``m`` from
    ``preferred`` up whose accumulators (``vectors`` per row), one row of the other operand
    and a broadcast fit the registers, else :func:`.gemm.row_tile`'s partial last block.
    Swin's 7 x 7 windows (49 queries) run in blocks of 7: 1.2x faster than 12 blocks of 4
    and a block of 1, whose guards stay in every unrolled row."""
    most = (registers - 1) // vectors - 1
    fits = [t for t in divisors(m) if preferred <= t <= most]
    return fits[0] if fits else row_tile(m, preferred)


def entries_in_parallel(entries: int, cores: int) -> bool:
    """Whether attention's batch entries (heads) are enough parallel tasks by themselves:
    as many as the cores, in equal shares or four per core at least."""
    return entries >= cores and (entries % cores == 0 or entries >= 4 * cores)


def schedule_attention(func: tvm.tirx.PrimFunc, *, scores: te.Tensor, pad: te.Tensor | None, inlined: list,
                       soft: RowKernel, out: te.Tensor, batch: int, mt: int, nt: int, vec: int, column: int,
                       column_vec: int, per_entry: bool = False, order: list[int] | None = None) -> tvm.IRModule:
    """Per batch entry and block of ``mt`` queries (the parallel loop): the block's scores in
    ``mt x nt`` register tiles, its softmax rows (:mod:`alt_tvm.ops.rows`), then its context
    in ``mt x column`` register tiles over every key.

    ``per_entry`` runs the batch entries (heads) in parallel and their query blocks in turn,
    each entry's packed ``K^T`` made first, while it stays in cache for all its blocks;
    otherwise ``K^T`` is packed for every entry in a parallel pass of its own first.
    ``order`` (the context's axes as stored, last one last) says which loop is which.
    """
    sch = tvm.s_tir.Schedule(func)
    for stage in inlined:
        sch.compute_inline(sch.get_sblock(stage.op.name))
    # The context product, as the GEMM template computes it.
    block = sch.get_sblock(out.op.name)
    *stored, j = sch.get_loops(block)
    loops = [stored[(order or list(range(len(stored)))).index(axis)] for axis in range(len(stored))]
    lead, m, e = loops[:batch], loops[batch], loops[batch + 1]
    mo, mi = sch.split(m, [None, mt])
    eo, ei = sch.split(e, [None, column])
    sch.reorder(*lead, mo, eo, j, mi, ei)
    per_entry = per_entry and pad is not None and bool(lead)
    if per_entry:
        entry = sch.fuse(*lead) if len(lead) > 1 else lead[0]
        sch.parallel(entry)
        query_block = mo
    else:
        query_block = sch.fuse(*lead, mo)
        sch.parallel(query_block)
    tile_in_registers(sch, block, at=eo, rows=mi, columns=ei, vec=column_vec, reduction=j)
    # The block's softmax rows and scores, computed inside the query block.
    for stage in reversed(soft.row_stages):
        sch.compute_at(sch.get_sblock(stage.op.name), query_block, preserve_unit_loops=True)
    score_block = sch.get_sblock(scores.op.name)
    sch.compute_at(score_block, query_block, preserve_unit_loops=True)
    *_, rows, cols, depth = sch.get_loops(score_block)
    co, ci = sch.split(cols, [None, nt])
    sch.reorder(co, depth, rows, ci)
    tile_in_registers(sch, score_block, at=co, rows=rows, columns=ci, vec=vec, reduction=depth)
    vectorize_row_stages(sch, soft)
    if pad is not None:
        keys = sch.get_sblock(pad.op.name)
        if per_entry:
            sch.compute_at(keys, entry, preserve_unit_loops=True)
        _schedule_keys(sch, keys, batch=batch, parallel=not per_entry)
    return sch.mod


#: Side of the square tiles in which K is transposed into its packed copy.
KEY_TILE = 16


def _schedule_keys(sch: tvm.s_tir.Schedule, block, *, batch: int, parallel: bool) -> None:
    """The packed ``K^T[.., d, s]`` (``parallel``: per batch entry and tile of keys). From K
    stored ``[.., s, d]`` it is a transpose: copied in ``KEY_TILE`` square tiles, each tile's
    rows of keys as vectors (gathered from ``KEY_TILE`` rows of K, stored whole), so that a
    tile reads and writes ``KEY_TILE`` cache lines instead of one element per line read."""
    *lead, depth, keys = sch.get_loops(block)[-(batch + 2):]
    extents = [int(sch.get(loop).extent) for loop in (depth, keys)]
    if any(extent % KEY_TILE for extent in extents):
        if parallel:
            sch.parallel(sch.fuse(*lead, depth))
        return
    depth_o, depth_i = sch.split(depth, [None, KEY_TILE])
    keys_o, keys_i = sch.split(keys, [None, KEY_TILE])
    sch.reorder(keys_o, depth_o, depth_i, keys_i)
    sch.vectorize(keys_i)
    if parallel:
        sch.parallel(sch.fuse(*lead, keys_o))


register_strategy(AltBatchMatmulStrategy())
