"""The ALT GEMM template: ``matmul`` with a constant right-hand side, epilogue fused.

The weight ``B[K, N]`` is a constant, so its layout is chosen freely and packed at
compile time: ``N/nt . K . nt`` (each k step reads one contiguous vector of ``nt``
outputs). Activations and the output keep the canonical row-major layout, which is
already "N innermost" and needs no conversion around LayerNorm/softmax in transformers.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import tvm
from tvm import relax, te

from alt_tvm.layout import Layout
from alt_tvm.layout.rewrite import TensorMap
from alt_tvm.ops.rows import layer_norm_rows
from alt_tvm.strategies.base import (
    OpInfo,
    Strategy,
    dtype_of,
    fusion_option,
    static_shape,
    tiles_for,
)
from alt_tvm.strategies.pattern import Match
from alt_tvm.strategies.registry import register_strategy
from alt_tvm.target import HardwareTarget

from .gemm_norm import (
    gemm_rows_te,
    group_blocks,
    group_cap,
    group_unit,
    norm_fits,
    padded_rows,
    schedule_gemm_norm,
    schedule_norm_gemm,
)
from .patterns import NORM_AFTER, NORM_BEFORE, norm_before, norm_of
from .prefetch import prefetch_next_block
from .tiling import streams_from_memory


def schedule_gemm(func: tvm.tirx.PrimFunc, *, gemm: te.Tensor, stages: list, batch: int, mt: int, nt: int,
                  vec: int, kt: int = 1, fold_batch: bool = False, pad: te.Tensor | None = None,
                  panels_outer: bool = False, kc: int = 0, panel_groups: int = 0,
                  prefetch: bool = False) -> tvm.IRModule:
    """``batch.. m_o n_o | k | m_i n_i`` with ``m_i x n_i`` accumulators in registers.

    ``panels_outer`` puts ``n_o`` outermost, before the batch loops too: each ``K x nt`` panel
    of the right-hand side is then read from memory once and reused by every row block of
    every batch entry from L2, and the rows are re-read per panel instead (:func:`panels_first`).
    With ``kc`` as well, ``k`` is split in chunks of ``kc``: ``n_o batch.. | k_o | m_o | k_i |
    m_i n_i``, so that a panel's chunk stays in L1 while every row block of a batch entry uses
    it, and those ``M x nt`` outputs are accumulated in a buffer of their own in between
    (:func:`k_chunk`). ``panel_groups`` (chunked only) then cuts the panels into that many
    groups, one parallel task each, and runs ``k_o`` outside a group's panels: ``g batch.. | k_o |
    n_o | m_o | k_i | m_i n_i``. A chunk of every row then stays in L2 for all the group's
    panels, and the group's ``M x N / panel_groups`` outputs are accumulated in between
    (:func:`groups_panels`); 0 runs each panel by itself.

    ``prefetch`` (chunked only) prefetches, while the row blocks use a panel's chunk, the
    chunk needed next (:func:`.prefetch.prefetch_next_block`): the next ``k`` chunk of the
    panel, or with ``panel_groups`` the same chunk of the group's next panel.

    ``kt > 1`` splits ``k`` and unrolls ``kt`` steps of it (more independent loads in flight).
    ``fold_batch`` takes the batch dimensions as more rows (a weight shared by every batch
    entry): ``[197, 1, 768] x [768, 2304]`` then has 197 rows in blocks of ``mt``, not 197
    one-row products that each re-read the whole weight.

    ``pad`` is a stage that copies the right-hand side with its columns zero-padded to a
    multiple of ``nt`` (:func:`padded_columns`). The product then exists only as one
    ``mt x nt`` tile in registers, and ``stages[0]`` (its copy to the unpadded output, then
    the epilogue) writes the tile's valid columns: whole vectors for any ``N``.
    """
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock(gemm.op.name)
    loops = sch.get_loops(block)
    lead, m, n, k = loops[:batch], loops[batch], loops[batch + 1], loops[batch + 2]
    if fold_batch and lead:
        lead, m = [], sch.fuse(*lead, m)
    mo, mi = sch.split(m, [None, mt])
    no, ni = sch.split(n, [None, nt])
    chunked = panels_outer and kc > 0 and pad is None and kt == 1
    if prefetch and not chunked:
        raise ValueError(f"prefetch needs the chunked order (panels_outer=1, kc > 0, kt=1, no padded columns); got "
                         f"panels_outer={int(panels_outer)}, kc={kc}, kt={kt}, padded={pad is not None}")
    # Panels first: also outside the batch loops, whose entries share the weight (ConvNeXt's
    # [1, 7, 7, 768] rows would otherwise stream its 9.4 MB weight once per image row).
    parallel = [no, *lead] if panels_outer else [*lead, mo, no]
    if chunked and panel_groups:
        k_outer, k = sch.split(k, [None, kc])
        group, no = sch.split(no, [panel_groups, None])
        sch.reorder(group, *lead, k_outer, no, mo, k, mi, ni)
        parallel, k_loops, streamed = [group], [k_outer, k], no
    elif chunked:
        k_outer, k = sch.split(k, [None, kc])
        sch.reorder(*parallel, k_outer, mo, k, mi, ni)
        k_loops, streamed = [k_outer, k], k_outer
    else:
        k_loops = list(sch.split(k, [None, kt])) if kt > 1 else [k]
        if panels_outer:
            parallel.append(mo)
        sch.reorder(*parallel, *k_loops, mi, ni)
        if kt > 1:
            sch.unroll(k_loops[1])
    k = k_loops[0]
    if pad is None:
        write = sch.cache_write(block, 0, "local")
    else:
        sch.set_scope(block, 0, "local")
        for stage in stages[:-1]:
            sch.compute_inline(sch.get_sblock(stage.op.name))
        write = sch.get_sblock(stages[-1].op.name)
    sch.reverse_compute_at(write, parallel[-1])
    sch.parallel(sch.fuse(*parallel) if len(parallel) > 1 else parallel[0])
    nio, nii = sch.split(ni, [None, vec])
    if vec > 1:  # TVM refuses to vectorize a unit loop (an N with no small divisor, e.g. 197)
        sch.vectorize(nii)
    sch.unroll(nio)
    sch.unroll(mi)
    init = sch.decompose_reduction(block, k)
    if chunked:
        # The accumulators live in a buffer across the k chunks, zeroed once per panel or group,
        # in one serial loop of vectors under the parallel one: as nested loops LLVM turns each
        # row into a memset and unrolls the rows into a straight block of them (a group's
        # M x N / groups outputs), whose code generation took 3.3 s for 128 x 768 x 768 and
        # 7.8 s for GPT-2's 64 x 768 x 2304 in 2 groups, 0.1-0.2 s as one loop.
        shared = {sch.get(loop) for loop in sch.get_loops(block)}
        own = [loop for loop in sch.get_loops(init)[:-1] if sch.get(loop) not in shared]
        if len(own) > 1:
            sch.fuse(*own)
    if pad is not None:
        # Per batch entry and k row: one parallel copy of a padded row (small next to the product).
        pad_loops = sch.get_loops(sch.get_sblock(pad.op.name))
        sch.parallel(sch.fuse(*pad_loops[:-1]))
        return sch.mod
    if vec > 1:
        # A group's write-back (N / groups columns, wider than a panel) in vectors of the
        # register block's width: one vector over GPT-2's 1152 columns written into the
        # attention heads' layout is an LLVM vector of 1152 lanes, each with its own address,
        # and took 590 s of code generation (0.2 s in vectors of 16).
        last = sch.get_loops(write)[-1]
        extent = int(sch.get(last).extent)
        if extent > nt and extent % vec == 0:
            last = sch.split(last, [None, vec])[1]
        sch.vectorize(last)
    if stages:
        # Inline the epilogue DAG into its last stage, then that stage into the write-back.
        for stage in stages[:-1]:
            sch.compute_inline(sch.get_sblock(stage.op.name))
        sch.reverse_compute_inline(sch.get_sblock(stages[-1].op.name))
    if not prefetch:
        return sch.mod
    update = sch.get_sblock(f"{gemm.op.name}_update")
    m_extent = int(sch.get(mo).extent) * mt
    rows = int(gemm.shape[-2]) * (math.prod(int(s) for s in gemm.shape[:-2]) if fold_batch else 1)
    if rows % mt and m_extent > mt:
        # The partial last row block in a loop of its own: the full ones then run with no
        # guard (LLVM no longer splits the loop itself once the hints are in its body).
        mo = sch.loop_partition(mo, [rows // mt, None])[0]
        update = next(b for b in sch.get_child_blocks(mo) if sch.get(b).name_hint.startswith(f"{gemm.op.name}_update"))
    k_inner, _, nio, nii = sch.get_loops(update)[-4:]
    var = lambda rv: sch.get(rv).loop_var  # noqa: E731
    func = prefetch_next_block(sch.mod["main"], block=sch.get(update).name_hint,
                               buffer=gemm.op.input_tensors[1].op.name, outer=var(streamed), spread=[var(mo)],
                               reads=[var(k_inner), var(nio)], vector=var(nii))
    return tvm.IRModule({"main": func})


def row_tile(m: int, preferred: int) -> int:
    """Rows per register block: the largest divisor of ``m`` up to ``preferred`` if it is at
    least half of it, else ``preferred`` with a partial last block. A row block of 1 (M = 197,
    ViT's tokens, is prime) re-reads the whole weight for every row: 3x slower than 4 rows."""
    tile = tiles_for(m, preferred)
    return tile if 2 * tile >= min(preferred, m) else min(preferred, m)


def padded_columns(n: int, lanes: int, registers: int) -> int:
    """Columns per register block for an ``n`` that no vector divides (197 tokens): the block
    of two or three vectors that pads ``n`` least (ties: three). One vector per block would
    leave the FMA units half idle; a scalar block (the unpadded alternative) runs at 5% of
    peak."""
    widths = [w * lanes for w in (3, 2) if 4 * w + w < registers] or [lanes]
    return min(widths, key=lambda width: -(-n // width) * width)


def panels_first(*, rows: int, k: int, n: int, l2_bytes: int) -> bool:
    """Loop over weight panels outside row blocks when the weight does not fit in half of L2
    and the rows do (float32). Then the weight streams from memory once, instead of once per
    row block; the other way round, a small weight stays in L2 while the rows stream.

    ViT-B/16 (768 x 3072 weights, 197 rows) is 6% faster in the model with panels first;
    ConvNeXt-T's first linear layer (3136 rows of 96, a 96 x 384 weight) 3% slower that way.
    """
    weight, activations = 4 * k * n, 4 * rows * k
    return streams_from_memory(weight, l2_bytes) and activations < weight


#: Rows from which a k chunk fills three quarters of L1 rather than half. With a 32 KiB L1 and
#: 768-deep weights in 96-column panels (64-deep chunks instead of 32), BERT-base (128 rows)
#: takes 0.93x the time, Swin-T and ConvNeXt-T 0.98x, ViT-B/16 (197 rows) 1.01x and GPT-2
#: (64 rows) 1.02-1.05x, hence the bound.
WIDE_CHUNK_ROWS = 128


def k_chunk(*, k: int, nt: int, l1_bytes: int, rows: int) -> int:
    """``kc`` of :func:`schedule_gemm`: the largest divisor of ``k`` (from 32) whose ``kc x nt``
    float32 chunk of a weight panel fills at most half of L1 (three quarters with at least
    ``WIDE_CHUNK_ROWS`` rows, whose row blocks reuse it more); 0 (no chunks) when the whole
    panel fits: 6-12% faster than whole panels on transformer GEMMs (768 and 3072 deep,
    24-column panels)."""
    share = 3 / 4 if rows >= WIDE_CHUNK_ROWS else 1 / 2
    budget = int(l1_bytes * share) // (4 * nt)
    if k <= budget:
        return 0
    return max((c for c in range(32, budget + 1) if k % c == 0), default=0)


MAX_ROWS = 8
"""Rows per register block at most (as the tuning space's row blocks): narrow GEMMs (two
vectors) would otherwise take 11 rows of broadcasts per step, a shape not measured."""


#: A register block whose rows divide ``M`` is taken over a better one with a partial last
#: block while it scores at least this share of it (:func:`register_tile`'s ``whole_blocks``).
WHOLE_BLOCK_SHARE = 0.75


def register_tile(m: int, n: int, lanes: int, registers: int, *, whole_blocks: bool = False) -> tuple[int, int]:
    """``(mt, nt)`` of the GEMM template: the register block of ``mt`` rows by ``nt / lanes``
    vectors that does the most FMAs per load, ``mt * v / (mt + v)`` (each ``k`` step broadcasts
    ``mt`` values of ``A`` and loads ``v`` weight vectors), times the share of its last row
    block that is real rows. The ``mt * v`` accumulators, the ``v`` weight vectors and a
    broadcast must fit in the vector registers. That gives AVX2's 16 registers 4 rows of 3
    vectors and AVX-512's 32 registers 6 rows of 4 (4 of 6 where 4 divides ``M``).

    On AVX-512 (alone, weights flushed from the caches), 6 x 4 beats 4 x 3 by 10% on ViT-B's
    ``197 x 3072 x 768`` and ``197 x 768 x 768`` GEMMs and by 40% on a ``198 x 256 x 256`` one
    that fits in L2.

    ``whole_blocks`` is for a schedule that keeps a partial last row block in the same loop as
    the others: it takes the best block whose rows divide ``M`` where that scores at least
    :data:`WHOLE_BLOCK_SHARE` of the best one. With the row bound checked at each ``k`` step,
    SegFormer-B0's ``4096 x 32 x 256`` GEMM took 0.65x the time in 4 x 4 blocks than in 6 x 4
    with a partial last one; with the full blocks' tasks versioned off their guards
    (:func:`alt_tvm.lowering.peel_partial_blocks`), partial blocks the score prefers take
    0.96-1.06x the whole blocks' time (SegFormer-B0, Swin-T's windows, LeViT), no reason to
    change the choice.

    ``m < 4`` takes :func:`stream_tile`; ``n`` without a vector multiple keeps :func:`column_tile`
    with :func:`row_tile`.
    """
    if m < 4:
        return m, stream_tile(n, lanes)
    if n % lanes:
        nt = column_tile(n, lanes, registers)
        return row_tile(m, 4), nt

    def score(tile: tuple[int, int]) -> tuple[float, int]:
        rows, vectors = tile
        real = m / (-(-m // rows) * rows)
        return rows * vectors / (rows + vectors) * real, -vectors

    tiles = [(rows, vectors) for vectors in range(1, n // lanes + 1) if n % (vectors * lanes) == 0
             for rows in range(1, min(m, MAX_ROWS) + 1) if rows * vectors + vectors + 1 <= registers]
    rows, vectors = max(tiles, key=score)
    whole = [tile for tile in tiles if m % tile[0] == 0] if whole_blocks and m % rows else []
    if whole and score(max(whole, key=score))[0] >= WHOLE_BLOCK_SHARE * score((rows, vectors))[0]:
        rows, vectors = max(whole, key=score)
    return rows, vectors * lanes


#: ``k`` steps unrolled in a product of fewer than 4 rows (:func:`stream_tile`).
STREAM_UNROLL = 4


def stream_tile(n: int, lanes: int) -> int:
    """Columns per weight panel of a product with fewer than 4 rows (a classifier's one): a
    single vector, the widest power of two up to ``lanes`` that divides ``n``, with ``k``
    unrolled :data:`STREAM_UNROLL` steps. Such a product reads each weight once and is bound by
    memory, so what counts is that each panel streams as one run of whole vectors.

    Alone with warm caches on 2 AVX-512 cores, one 8-lane vector over ResNet-50's ``2048 x 1000``
    weight takes 0.71 ms against 1.61 ms for five 5-lane vectors, and one 16-lane vector over
    MobileNet-V3's ``960 x 1280`` 0.22 ms against 0.33 ms for five (two or four: 0.23 ms).
    """
    width = lanes
    while width > 1 and n % width:
        width //= 2
    return width if width > 1 else tiles_for(n, lanes)


def groups_panels(*, m: int, n: int, k: int, nt: int, cores: int) -> int:
    """``panel_groups`` of :func:`schedule_gemm` (chunked ``k``): one group of weight panels per
    core when a group's outputs (``M x N / cores``) are smaller than the rows (``M x K``), which
    that order reads once per ``k`` chunk instead of once per panel; 0 (each panel by itself)
    otherwise, or when the panels do not divide among the cores.

    Alone on 2 AVX-512 cores with 6 x 4 register blocks, grouping takes ``197 x 3072 x 768``
    from 3.10 to 2.78 ms, ``128 x 3072 x 768`` 2.18 -> 2.00 ms, ``197 x 768 x 768`` 0.81 ->
    0.77 ms; ``197 x 768 x 3072`` (outputs 2x the rows) stays faster by panel (2.99 against
    3.09 ms).
    """
    panels = n // nt
    if cores < 2 or panels % cores or n // cores >= k:
        return 0
    return cores


def column_tile(n: int, lanes: int, registers: int) -> int:
    """Columns per register block: three vectors when they divide ``n`` and a 4-row block
    of them leaves registers for the weights (4 x 3 = 12 accumulators of AVX2's 16 vector
    registers: about 10% faster than 4 x 2 on transformer and ConvNeXt GEMMs), else two, else
    one: whole vectors before a wider block (1000 classes: 8 columns, not 10 in vectors of 5)."""
    if n % (3 * lanes) == 0 and 4 * 3 + 3 < registers:
        return 3 * lanes
    for width in (2 * lanes, lanes):
        if n % width == 0:
            return width
    return tiles_for(n, 2 * lanes)


def fuses_norm(strategy: Strategy, anchor: relax.VarBinding, match: Match, target: HardwareTarget,
               options: Any = None) -> bool:
    """Fuse the layer norm before or after the GEMM (:data:`.patterns.NORM_BEFORE`,
    :data:`.patterns.NORM_AFTER`, :mod:`.gemm_norm`) where the weight stays in L2
    (:func:`.gemm_norm.norm_fits`). The option ``fuse_norms``: True (that rule), False (never),
    ``"always"`` (any float32 row up to :data:`.rows.MAX_ROW` elements)."""
    norm = (match.prologue or match.tail)[0]
    fuse = fusion_option(options, "fuse_norms")
    if fuse is False or target.to_tvm().kind.name != "llvm":
        return False
    if any(dtype_of(arg) not in (None, "float32") for arg in norm.value.args):
        return False
    _, n, k = _gemm_extents(anchor)
    row = k if norm.var.same_as(anchor.value.args[0]) else n
    return norm_fits(row=row, n=n, k=k, l2_bytes=0 if fuse == "always" else target.l2_bytes) is None


class AltGemmStrategy(Strategy):
    """Matmul with a constant 2-D right-hand side (dense / linear layers) on CPUs.

    Subclasses for other targets keep the TE and the weight layout and swap the loop
    schedule (:meth:`layout_params`, :meth:`schedule`).
    """

    name = "alt"
    ops = ("relax.matmul",)
    target_kinds = ("llvm",)
    priority = 10
    patterns = (NORM_BEFORE.where(fuses_norm), NORM_AFTER.where(fuses_norm))

    def applicable(self, info: OpInfo) -> str | None:
        if info.input_dtypes[0] != "float32" or info.input_dtypes[1] != "float32":
            return f"dtypes {info.input_dtypes} (needs float32)"
        if 1 not in info.constants:
            return "right-hand side is not a constant"
        if len(info.input_shapes[1]) != 2 or len(info.input_shapes[0]) < 2:
            return f"shapes {info.input_shapes} (needs [..., M, K] x [K, N])"
        return None

    def layout_params(self, anchor: Any, context: Any) -> dict[str, int]:
        """``{"nt", "mt", "vec", "kt", "panels_outer", "kc", "panel_groups"}``: ``nt`` tiles the
        packed weight, the rest are loop parameters."""
        if context.params is not None:
            return context.params
        return self._defaults(*_gemm_extents(anchor, fold_batch=True), context, entries=_batch_entries(anchor))

    def schedule(self, *, anchor: Any, gemm: te.Tensor, stages: list, batch: int, params: dict[str, int],
                 context: Any) -> Any:
        """The loop schedule: ``PrimFunc -> IRModule``."""
        nt, mt, vec, kt = int(params["nt"]), int(params["mt"]), int(params["vec"]), int(params.get("kt", 1))
        # Records written before a knob existed get the rule's choice.
        defaults = self._defaults(*_gemm_extents(anchor, fold_batch=True), context, entries=_batch_entries(anchor))
        panels = params.get("panels_outer", defaults["panels_outer"])
        kc = params.get("kc", defaults["kc"] if nt == defaults["nt"] else 0)
        groups = params.get("panel_groups", defaults["panel_groups"] if nt == defaults["nt"] else 0)
        # A record of an unchunked order gets no prefetch (it has none to act on).
        chunked = panels and kc and kt == 1
        prefetch = params.get("prefetch", defaults["prefetch"] if nt == defaults["nt"] and chunked else 0)
        return lambda f: schedule_gemm(f, gemm=gemm, stages=stages, batch=batch, mt=mt, nt=nt, vec=vec, kt=kt,
                                       fold_batch=folds_batch(m=int(gemm.shape[-2])), panels_outer=bool(panels),
                                       kc=int(kc), panel_groups=int(groups), prefetch=bool(prefetch))

    def implement(self, anchor, context) -> Any:
        if norm_of(context.partition) is not None or norm_before(context.partition) is not None:
            return self._implement_norm(anchor, context)
        call = anchor.value
        a = context.te_input(call.args[0], "a")
        b = context.te_input(call.args[1], "b")
        *lead, m, kdim = (int(s) for s in a.shape)
        rows = m * math.prod(lead) if folds_batch(m=m) else m
        n = int(b.shape[1])
        k = te.reduce_axis((0, kdim), "k")
        gemm = te.compute((*lead, m, n), lambda *i: te.sum(a(*i[:-1], k) * b(k, i[-1]), axis=k),
                          name="matmul", tag="matmul")
        stages = context.epilogue_te(gemm)
        requested = context.output_layout
        if requested is not None and requested.orig_shape == (*lead, m, n):
            # The last stage writes the layout the consumer asked for (Q, K, V in their
            # heads' blocks); a bare product gets a copy stage to do it, inlined as well.
            stages = stages or [te.compute(gemm.shape, lambda *i: gemm(*i), name="relayout")]
        else:
            requested = None
        final = stages[-1] if stages else gemm
        params = self.layout_params(anchor, context)
        nt, mt, vec, kt = int(params["nt"]), int(params["mt"]), int(params["vec"]), int(params.get("kt", 1))
        kc, groups = int(params.get("kc", 0)), int(params.get("panel_groups", 0))
        if (n % nt or nt % vec or kdim % kt or not 1 <= mt <= rows or kc < 0 or (kc and kdim % kc) or groups < 0
                or (groups and (n // nt) % groups)):
            raise ValueError(f"GEMM parameters {params} do not fit M={rows}, N={n}, K={kdim} (nt must divide N, "
                             "vec nt, kt and kc (0: no chunks) K, panel_groups (0: none) the N/nt panels; "
                             "1 <= mt <= M, the last row block may be partial)")
        layouts = TensorMap([(b, Layout((kdim, n)).split(1, [n // nt, nt]).reorder([1, 0, 2]))])
        if requested is not None:
            layouts[final] = requested
        return context.finish(output=final, layouts=layouts, strategy=self.name,
                              schedule=self.schedule(anchor=anchor, gemm=gemm, stages=stages, batch=len(lead),
                                                     params=params, context=context))

    def _implement_norm(self, anchor, context) -> Any:
        """GEMM, epilogue and a layer norm before or after them as one kernel of row groups
        (:mod:`.gemm_norm`), with the analytic register block; the weight packed as in
        :meth:`implement`."""
        before = norm_before(context.partition)
        norm = before if before is not None else norm_of(context.partition)
        lanes = context.target.vector_lanes("float32")
        attrs = norm.value.attrs
        gamma = context.te_input(norm.value.args[1], "gamma") if bool(attrs.scale) else None
        beta = context.te_input(norm.value.args[2], "beta") if bool(attrs.center) else None

        def normalise(data: te.Tensor):
            return layer_norm_rows(data, gamma, beta, epsilon=float(attrs.epsilon), lanes=lanes)

        a = context.te_input(before.value.args[0] if before is not None else anchor.value.args[0], "a")
        b = context.te_input(anchor.value.args[1], "b")
        *lead, m, kdim = (int(s) for s in a.shape)
        rows, n = m * math.prod(lead), int(b.shape[1])
        params = context.params or self._norm_defaults(rows, n, kdim, context)
        mt, nt, vec, kt = (int(params[name]) for name in ("mt", "nt", "vec", "kt"))
        scale = float(params.get("group_scale", 1.0))
        if n % nt or nt % vec or kdim % kt or min(mt, nt, vec, kt) < 1 or scale <= 0:
            raise ValueError(f"fused GEMM + norm parameters {params} do not fit rows={rows}, N={n}, K={kdim} "
                             f"(nt must divide N, vec nt, kt K; all positive)")
        unit = group_unit(mt=mt, shape=a.shape)
        # A group buffers its product rows, and before the product its normalised rows too.
        row_bytes = 4 * (n + (kdim if before is not None else 0))
        cap = group_cap(unit=unit, row_bytes=row_bytes, l2_bytes=context.target.l2_bytes)
        blocks = group_blocks(rows=rows, mt=unit, cores=context.target.num_cores, max_blocks=cap)
        group_rows = unit * min(-(-rows // unit), max(1, round(blocks * scale)))
        padded = padded_rows(a, group_rows=group_rows)
        normed = normalise(padded) if before is not None else None
        product, view = gemm_rows_te(normed.output if normed is not None else padded, b, shape=(*lead, m, n))
        stages = context.epilogue_te(view)
        layouts = TensorMap([(b, Layout((kdim, n)).split(1, [n // nt, nt]).reorder([1, 0, 2]))])
        if normed is not None:
            output = stages[-1] if stages else view
            schedule = partial(schedule_norm_gemm, norm=normed, product=product,
                               inlined=[padded, view, *stages[:-1]] if stages else [padded], output=output)
        else:
            kernel = normalise(stages[-1] if stages else view)
            output = kernel.output
            schedule = partial(schedule_gemm_norm, product=product, inlined=[padded, view, *stages], kernel=kernel)
        return context.finish(output=output, layouts=layouts, strategy=self.name,
                              schedule=lambda f: schedule(f, group_rows=group_rows, mt=mt, nt=nt, vec=vec, kt=kt))

    @staticmethod
    def _norm_defaults(rows: int, n: int, k: int, context) -> dict[str, Any]:
        """The fused kernel's analytic register block (:func:`register_tile`), one vector per
        column step, ``k`` not unrolled, the rule's groups."""
        lanes = context.target.vector_lanes("float32")
        mt, nt = register_tile(rows, n, lanes, context.target.vector_registers or 16)
        return {"nt": nt, "mt": mt, "vec": tiles_for(nt, lanes), "kt": 1, "group_scale": 1.0}

    @staticmethod
    def _defaults(m: int, n: int, k: int, context, *, entries: int = 1) -> dict[str, int]:
        target = context.target
        shape = (m, n, target.vector_lanes("float32"), target.vector_registers or 16)
        params = AltGemmStrategy._loop_defaults(m, n, k, register_tile(*shape), target, entries=entries)
        # Only the prefetching order runs a partial last row block in a loop of its own.
        if m % params["mt"] and not params["prefetch"]:
            whole = register_tile(*shape, whole_blocks=True)
            params = AltGemmStrategy._loop_defaults(m, n, k, whole, target, entries=entries)
        return params

    @staticmethod
    def _loop_defaults(m: int, n: int, k: int, tile: tuple[int, int], target, *, entries: int) -> dict[str, int]:
        """The rules' parameters for the register block ``tile`` (``(mt, nt)``)."""
        lanes = target.vector_lanes("float32")
        mt, nt = tile
        kt = tiles_for(k, STREAM_UNROLL) if m < 4 else 1
        # Chunks pay off with several row blocks to reuse them; chunked, only the panels (or
        # their groups, one per core) run in parallel: 8 panels or a group per core. A PyTorch
        # encoder's 128 x 1024 x 256 feed-forward GEMM (4 panels in 2 groups): 0.57x the time.
        groups = groups_panels(m=m, n=n, k=k, nt=nt, cores=target.num_cores)
        kc = k_chunk(k=k, nt=nt, l1_bytes=target.l1d_bytes, rows=m) if (n // nt >= 8 or groups) and m > 8 else 0
        panels = int(panels_first(rows=m, k=k, n=n, l2_bytes=target.l2_bytes))
        return {"nt": nt, "mt": mt, "vec": tiles_for(nt, lanes), "kt": kt, "panels_outer": panels, "kc": kc,
                # Groups act in the chunked order only (panels outermost too): else no knob.
                "panel_groups": groups if kc and panels else 0,
                # The chunked order streams its weight from memory: fetch the next chunk ahead.
                # With batch entries run one by one (ConvNeXt's [1, 14, 14, 384] rows), each
                # panel stays in L2 after the first entry, and the hints only cost.
                "prefetch": int(bool(panels and kc) and entries == 1)}

    def space(self, anchor, context) -> Any:
        from .space import GemmNormSpace, GemmSpace

        before = norm_before(context.partition)
        if before is not None or norm_of(context.partition) is not None:
            a_shape = static_shape((before or anchor).value.args[0])
            rows, n, k = math.prod(a_shape[:-1]), static_shape(anchor.value.args[1])[-1], a_shape[-1]
            return GemmNormSpace(rows=rows, n=n, k=k, lanes=context.target.vector_lanes("float32"),
                                 default=self._norm_defaults(rows, n, k, context))
        m, n, k = _gemm_extents(anchor, fold_batch=True)
        return GemmSpace(m=m, n=n, k=k, default=self._defaults(m, n, k, context, entries=_batch_entries(anchor)),
                         lanes=context.target.vector_lanes("float32"), cores=context.target.num_cores)


def folds_batch(*, m: int) -> bool:
    """Whether a GEMM with a shared weight takes its batch dimensions as more rows: where a
    batch entry is one row (``[197, 1, 768]``: sequence-first attention). Where it has more,
    the fused row index (``r // 14``, ``r % 14`` for ConvNeXt's ``[1, 14, 14, 384]``) costs
    more than the partial row blocks it saves (ConvNeXt-T runs 1.45x slower folded)."""
    return m == 1


def _batch_entries(anchor: Any) -> int:
    """Batch entries a matmul anchor runs one by one (1 where they fold into rows)."""
    a_shape = static_shape(anchor.value.args[0])
    return 1 if folds_batch(m=a_shape[-2]) else math.prod(a_shape[:-2])


def _gemm_extents(anchor: Any, *, fold_batch: bool = False) -> tuple[int, int, int]:
    """``(M, N, K)`` of a matmul anchor; ``fold_batch``: M counts the rows of every batch entry
    where :func:`folds_batch`."""
    a_shape, b_shape = static_shape(anchor.value.args[0]), static_shape(anchor.value.args[1])
    m = math.prod(a_shape[:-1]) if fold_batch and folds_batch(m=a_shape[-2]) else a_shape[-2]
    return m, b_shape[-1], a_shape[-1]


register_strategy(AltGemmStrategy())
