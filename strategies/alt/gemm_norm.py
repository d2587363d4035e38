"""GEMM, epilogue and a layer norm before or after them in one kernel: row groups that own
whole rows.

A post-norm transformer layer ends in ``LayerNorm(x W + b + residual)`` (BERT; Vaswani et
al. 2017, §3.1); a pre-norm one starts its attention and feed-forward blocks with
``LayerNorm(x) W`` (GPT-2, ViT, Swin). A layer norm needs every column of a row, while the
GEMM template (:mod:`.gemm`) runs register blocks of a few rows and one weight panel as
parallel tasks. Here each parallel task is a group of rows. After the product, it computes
every weight panel of its rows' product, panel by panel over its register blocks, into a
buffer of the group's rows, then normalises those rows while they are still in its cache
(:mod:`alt_tvm.ops.rows`). Before it, it normalises its rows into a buffer first, and the
product reads them from there. Either way the layer-norm kernel, and the pass over memory
between the two, are gone.

Each group reads the whole weight, so the rule (:func:`norm_fits`) fuses only where the
weight stays in the L2 cache; larger weights keep the GEMM's own order and a layer-norm
kernel after it. The product is computed for whole register blocks of rows, the last group
included: rows past the end repeat the last row (its index clamped), so no register block
needs a guard in its inner loop (a guarded one keeps its accumulators in memory, 2.5x slower).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm
from tvm import te

from alt_tvm.ops.rows import RowKernel

from .rows import MAX_ROW, vectorize_row_stages
from .tiling import streams_from_memory


def norm_fits(*, row: int, n: int, k: int, l2_bytes: int) -> str | None:
    """None where the fused kernel's order costs the product nothing, else why not.

    ``row`` is the normalised row's length (``N`` after the product, ``K`` before it).

    Every row group reads the whole ``K x N`` float32 weight: that is free while it stays in
    L2 (at most half of it, :func:`.tiling.streams_from_memory`). Fused against the GEMM
    template and a row kernel, BERT-tiny's ``128 x 128 x 128`` and ``128 x 512 x 128`` are
    even (0.97-1.09x the time), BERT-base's 2.4 and 9.4 MB weights 0.95x and 0.84x.
    """
    if row > MAX_ROW:
        return f"rows of {row} elements (at most {MAX_ROW})"
    if streams_from_memory(4 * k * n, l2_bytes):
        return f"a {k} x {n} weight ({4 * k * n} bytes) does not stay in half the L2 ({l2_bytes} bytes)"
    return None


def group_unit(*, mt: int, shape: Sequence[int]) -> int:
    """Rows that a group's size is a multiple of: the register block ``mt``, and with leading
    axes (``[1, 56, 56, C]``) whole ones of the second-to-last axis as well, so that a group's
    rows are a box of the output and the product's rows a group reads are known exactly."""
    *lead, m, _ = (int(s) for s in shape)
    return mt if math.prod(lead) == 1 else math.lcm(mt, m)


def group_blocks(*, rows: int, mt: int, cores: int, max_blocks: int = 0) -> int:
    """Blocks of ``mt`` rows (a :func:`group_unit`) per group: the fewest groups whose blocks,
    dealt out to ``cores`` threads, give the shortest longest thread (128 rows in 22 blocks
    of 6 on two cores: two groups of 11 blocks). Fewer groups read the weight fewer times.
    ``max_blocks`` (0: no bound) caps a group, so that its row buffers stay in cache."""
    blocks = -(-rows // mt)

    def longest(per_group: int) -> tuple[int, int]:
        groups = -(-blocks // per_group)
        return -(-groups // cores) * per_group, groups

    most = min(blocks, max_blocks) if max_blocks else blocks
    return min(range(1, most + 1), key=longest)


def group_cap(*, unit: int, row_bytes: int, l2_bytes: int) -> int:
    """The most blocks of ``unit`` rows a group may hold (0: no bound) so that its row buffers,
    ``row_bytes`` per row, fit half the L2 cache beside the weight (:func:`norm_fits` keeps that
    in the other half). With two groups of 1568 rows, ConvNeXt-T's first stage (``LayerNorm ->
    96 x 384 GEMM -> GELU`` on 3136 rows: 3 MB of row buffers per group) runs its fused kernel
    7% slower in the model. 0 when ``l2_bytes`` is unknown."""
    if l2_bytes <= 0:
        return 0
    return max(1, l2_bytes // 2 // (unit * row_bytes))


def padded_rows(a: te.Tensor, *, group_rows: int) -> te.Tensor:
    """``a``'s ``[..., M, K]`` as ``[rows, K]`` (leading axes folded into rows), padded to whole
    groups of ``group_rows`` by repeating the last row."""
    *lead, m, kdim = (int(s) for s in a.shape)
    rows = m * math.prod(lead)

    def source(r, k):
        index, r = [], te.min(r, rows - 1)
        for extent in reversed((*lead, m)):
            index.append(r % extent)
            r = r // extent
        return a(*reversed(index), k)

    return te.compute((-(-rows // group_rows) * group_rows, kdim), source, name="rows")


def gemm_rows_te(rows: te.Tensor, b: te.Tensor, *, shape: Sequence[int]) -> tuple[te.Tensor, te.Tensor]:
    """``(product, view)``: ``rows [R, K] x b [K, N]``, and the product's first rows as
    ``shape`` (``[..., M, N]``: the anchor's output, for the epilogue)."""
    *lead, m, n = (int(s) for s in shape)
    k = te.reduce_axis((0, int(rows.shape[1])), "k")
    product = te.compute((int(rows.shape[0]), n), lambda r, j: te.sum(rows(r, k) * b(k, j), axis=k),
                         name="matmul", tag="matmul")

    def flat(index: Sequence) -> tvm.tirx.PrimExpr:
        row = 0
        for extent, i in zip((*lead, m), index):
            row = row * extent + i
        return row

    view = te.compute(tuple(shape), lambda *i: product(flat(i[:-1]), i[-1]), name="matmul_rows")
    return product, view


def schedule_gemm_norm(func: tvm.tirx.PrimFunc, *, product: te.Tensor, inlined: Sequence[te.Tensor],
                       kernel: RowKernel, group_rows: int, mt: int, nt: int, vec: int,
                       kt: int = 1) -> tvm.IRModule:
    """``group | (n_o m_o | k | m_i n_i) (row | norm stages)``: per group of ``group_rows`` rows,
    every weight panel of the product over its register blocks, then per row the norm's
    stages in row buffers. ``inlined`` (the product's view and the epilogue) become part of
    the norm's first pass over a row."""
    sch = tvm.s_tir.Schedule(func)
    out = sch.get_sblock(kernel.output.op.name)
    loops = sch.get_loops(out)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    group, row = sch.split(row, [None, group_rows])
    sch.parallel(group)
    for stage in reversed(kernel.row_stages):
        sch.compute_at(sch.get_sblock(stage.op.name), row, preserve_unit_loops=True)
    for stage in inlined:
        sch.compute_inline(sch.get_sblock(stage.op.name))
    block = sch.get_sblock(product.op.name)
    sch.compute_at(block, group, preserve_unit_loops=True)  # the register block needs its row loop, 1 row or not
    _register_blocks(sch, block, mt=mt, nt=nt, vec=vec, kt=kt)
    vectorize_row_stages(sch, kernel)
    return sch.mod


def _register_blocks(sch: tvm.s_tir.Schedule, block, *, mt: int, nt: int, vec: int, kt: int) -> None:
    """The product of one group (its loops ``rows, N | K`` under the group's loop): weight
    panels outermost, then register blocks of ``mt x nt`` accumulators over ``k``."""
    m, n, k = sch.get_loops(block)[-3:]
    mo, mi = sch.split(m, [None, mt])
    no, ni = sch.split(n, [None, nt])
    k_loops = list(sch.split(k, [None, kt])) if kt > 1 else [k]
    sch.reorder(no, mo, *k_loops, mi, ni)
    if kt > 1:
        sch.unroll(k_loops[1])
    tile_in_registers(sch, block, at=mo, rows=mi, columns=ni, vec=vec, reduction=k_loops[0])


def schedule_norm_gemm(func: tvm.tirx.PrimFunc, *, norm: RowKernel, product: te.Tensor, inlined: Sequence[te.Tensor],
                       output: te.Tensor, group_rows: int, mt: int, nt: int, vec: int, kt: int = 1) -> tvm.IRModule:
    """``group | (row | norm stages) (n_o m_o | k | m_i n_i) (row | epilogue)``: per group of
    ``group_rows`` rows, the norm's rows into a buffer of the group's rows, then every weight
    panel of the product over its register blocks, then the epilogue (``inlined``, the
    product's view and all epilogue stages but the last, computed in ``output``) over the
    group's rows."""
    sch = tvm.s_tir.Schedule(func)
    for stage in inlined:
        sch.compute_inline(sch.get_sblock(stage.op.name))
    out = sch.get_sblock(output.op.name)
    loops = sch.get_loops(out)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    group, _ = sch.split(row, [None, group_rows])
    sch.parallel(group)
    if vec > 1:
        _, lane = sch.split(sch.get_loops(out)[-1], [None, vec])
        sch.vectorize(lane)
    block = sch.get_sblock(product.op.name)
    sch.compute_at(block, group, preserve_unit_loops=True)  # the register block needs its row loop, 1 row or not
    normed = sch.get_sblock(norm.output.op.name)
    sch.compute_at(normed, group)
    norm_row = sch.get_loops(normed)[1]
    for stage in reversed(norm.row_stages):
        sch.compute_at(sch.get_sblock(stage.op.name), norm_row, preserve_unit_loops=True)
    _register_blocks(sch, block, mt=mt, nt=nt, vec=vec, kt=kt)
    vectorize_row_stages(sch, norm)
    return sch.mod


def tile_in_registers(sch: tvm.s_tir.Schedule, block, *, at, rows, columns, vec: int, reduction) -> None:
    """Accumulate ``block``'s ``rows x columns`` tile (the innermost loops, under ``reduction``)
    in registers, written back once per tile at loop ``at``; columns in vectors of ``vec``."""
    write = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write, at)
    outer, inner = sch.split(columns, [None, vec])
    if vec > 1:
        sch.vectorize(inner)
        sch.vectorize(sch.get_loops(write)[-1])
    sch.unroll(outer)
    sch.unroll(rows)
    sch.decompose_reduction(block, reduction)
