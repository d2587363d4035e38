"""GEMM, epilogue and the layer norm after it in one kernel: row groups that own whole rows.

A post-norm transformer layer ends in ``LayerNorm(x W + b + residual)`` (BERT; Vaswani et
al. 2017, §3.1). A layer norm needs every column of a row, while the GEMM template
(:mod:`.gemm`) runs register blocks of a few rows and one weight panel as parallel tasks.
Here each parallel task is a group of rows: it computes every weight panel of its rows'
product, panel by panel over its register blocks, into a buffer of the group's rows, then
normalises those rows while they are still in its cache (:mod:`alt_tvm.ops.rows`). The
separate layer-norm kernel, and the pass over memory between the two, are gone.

Each group reads the whole weight, so the rule (:func:`norm_fits`) fuses only where the
weight stays in the L2 cache; larger weights keep the GEMM's own order and a layer-norm
kernel after it. The product is computed for whole register blocks of rows, the last group
included: rows past the end repeat the last row (its index clamped), so no register block
needs a guard in its inner loop (a guarded one kept its accumulators in memory, 2.5x slower).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm
from tvm import te

from alt_tvm.ops.rows import RowKernel

from .rows import MAX_ROW, vectorize_row_stages
from .tiling import streams_from_memory


def norm_fits(*, n: int, k: int, l2_bytes: int) -> str | None:
    """None where the fused kernel's order costs the product nothing, else why not.

    Every row group reads the whole ``K x N`` float32 weight: that is free while it stays in
    L2 (at most half of it, :func:`.tiling.streams_from_memory`). Measured alone on the
    2-vCPU AVX-512 guest, GEMM + layer norm fused against the GEMM template and a row kernel:
    ``128 x 128 x 128`` and ``128 x 512 x 128`` (BERT-tiny) 0.97-1.09x, even; ``128 x 768 x
    768`` 0.95x and ``128 x 3072 x 768`` (BERT-base, 2.4 and 9.4 MB of weights) 0.84x.
    """
    if n > MAX_ROW:
        return f"rows of {n} elements (at most {MAX_ROW})"
    if streams_from_memory(4 * k * n, l2_bytes):
        return f"a {k} x {n} weight ({4 * k * n} bytes) does not stay in half the L2 ({l2_bytes} bytes)"
    return None


def group_blocks(*, rows: int, mt: int, cores: int) -> int:
    """Register blocks of ``mt`` rows per group: the fewest groups whose blocks, dealt out to
    ``cores`` threads, give the shortest longest thread (128 rows in 22 blocks of 6 on two
    cores: two groups of 11 blocks). Fewer groups read the weight fewer times."""
    blocks = -(-rows // mt)

    def longest(per_group: int) -> tuple[int, int]:
        groups = -(-blocks // per_group)
        return -(-groups // cores) * per_group, groups

    return min(range(1, blocks + 1), key=longest)


def gemm_rows_te(a: te.Tensor, b: te.Tensor, *, group_rows: int) -> tuple[te.Tensor, te.Tensor]:
    """``(product, view)``: the product ``[rows, N]`` over every row of ``a``'s ``[..., M, K]``
    (leading axes folded into rows), padded to whole groups of ``group_rows`` by repeating
    the last row, and ``view``, the product in ``a``'s leading shape for the epilogue."""
    *lead, m, kdim = (int(s) for s in a.shape)
    n = int(b.shape[1])
    rows = m * math.prod(lead)
    padded = -(-rows // group_rows) * group_rows
    k = te.reduce_axis((0, kdim), "k")

    def source_row(r):
        index, r = [], te.min(r, rows - 1)
        for extent in reversed((*lead, m)):
            index.append(r % extent)
            r = r // extent
        return reversed(index)

    product = te.compute((padded, n), lambda r, j: te.sum(a(*source_row(r), k) * b(k, j), axis=k),
                         name="matmul", tag="matmul")

    def flat(index: Sequence) -> tvm.tirx.PrimExpr:
        row = 0
        for extent, i in zip((*lead, m), index):
            row = row * extent + i
        return row

    view = te.compute((*lead, m, n), lambda *i: product(flat(i[:-1]), i[-1]), name="matmul_rows")
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
    sch.compute_at(block, group)
    m, n, k = sch.get_loops(block)[-3:]
    mo, mi = sch.split(m, [None, mt])
    no, ni = sch.split(n, [None, nt])
    k_loops = list(sch.split(k, [None, kt])) if kt > 1 else [k]
    sch.reorder(no, mo, *k_loops, mi, ni)
    if kt > 1:
        sch.unroll(k_loops[1])
    write = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write, mo)
    nio, nii = sch.split(ni, [None, vec])
    if vec > 1:
        sch.vectorize(nii)
        sch.vectorize(sch.get_loops(write)[-1])
    sch.unroll(nio)
    sch.unroll(mi)
    sch.decompose_reduction(block, k_loops[0])
    vectorize_row_stages(sch, kernel)
    return sch.mod
