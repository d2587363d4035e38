"""GPU (CUDA) loop schedules for the ALT conv and GEMM templates.

The TE and the tensors' layouts are exactly the CPU path's (the strategies here subclass
:class:`~alt_tvm.strategies.alt.conv.AltConvStrategy` and
:class:`~alt_tvm.strategies.alt.gemm.AltGemmStrategy` and swap only the loop schedule), so layout propagation between
partitions does not depend on the target. The schedule is the classic GPU tiling:

* block tile -> ``blockIdx.x``: one output tile of the layout (times ``block_o`` channel
  tiles) for a conv, ``bm x bn`` outputs for a GEMM;
* thread tile -> ``threadIdx.x``, with a contiguous per-thread register tile accumulated
  in ``"local"`` memory (threads along channels read the staged weights at a stride of
  the tile, which falls on distinct shared-memory banks for tiles up to 4);
* reduction split into stages whose input and weight tiles are fetched cooperatively
  into ``"shared"`` memory by all the block's threads;
* optionally (``split_k``) the stages shared among several blocks per output tile, with
  a second kernel adding their partial sums, for layers whose few output tiles would
  leave most multiprocessors idle (the "split-K" of GEMM libraries; TVM's ``rfactor``);
* optional ``pragma_auto_unroll_max_step``; the element-wise epilogue is fused into the
  write-back of the accumulators.

``bind=False`` builds the same loop nest with no thread bindings and ordinary buffers
instead of shared ones, so the schedule's arithmetic can be run (and checked) on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
from tvm import te

from alt_tvm.strategies.registry import register_strategy

from .conv import AltConvStrategy, ConvGeometry, fuses_block
from .cuda_tiling import (
    BlockUsage,
    CudaConvTiling,
    CudaGemmTiling,
    GpuLimits,
    default_cuda_conv_tiling,
    default_cuda_gemm_tiling,
    gemm_block_usage,
    verify_gpu_kernels,
)
from .gemm import AltGemmStrategy, _gemm_extents
from .patterns import ABSORBED_INPUT, BLOCK
from .tiling import DefaultConvTiling

__all__ = [
    "AltConvCudaStrategy",
    "AltGemmCudaStrategy",
    "schedule_cuda_conv",
    "schedule_cuda_gemm",
]


def _stage_inputs(sch: tvm.s_tir.Schedule, block: Any, *, at: Any, threads: int, scope: str, bind: bool,
                  inline: Sequence[str] = ()) -> None:
    """Stage every input buffer of ``block`` in ``scope`` at loop ``at``, fetched by all threads.

    Producers named in ``inline`` (a pad stage) are inlined into the fetch, so the staged
    tile is written straight from the un-padded input, in the producer's (tiled) layout.
    """
    at_stmt = sch.get(at)
    depth = 1 + next(i for i, loop in enumerate(sch.get_loops(block)) if sch.get(loop).same_as(at_stmt))
    reads = [r.source.name for r in sch.get(block).reads]
    own = {w.source.name for w in sch.get(block).writes}
    for index, name in enumerate(reads):
        if name in own:
            continue
        stage = sch.cache_read(block, index, scope)
        if name in inline:
            sch.compute_inline(sch.get_sblock(name))
        sch.compute_at(stage, at, preserve_unit_loops=True)
        copy = sch.get_loops(stage)[depth:]
        fused = sch.fuse(*copy) if copy else None
        if fused is None:
            continue
        _, tx = sch.split(fused, [None, threads])
        if bind:
            sch.bind(tx, "threadIdx.x")


def _epilogue(sch: tvm.s_tir.Schedule, stages: Sequence[te.Tensor]) -> None:
    """Fold the element-wise epilogue into the write-back of the accumulators (after ``cache_write``)."""
    if not stages:
        return
    for stage in stages[:-1]:
        sch.compute_inline(sch.get_sblock(stage.op.name))
    sch.reverse_compute_inline(sch.get_sblock(stages[-1].op.name))


#: Threads per block of the kernel that adds split-K partials (one output per thread).
_SUM_THREADS = 256


def _split_k(sch: tvm.s_tir.Schedule, block: Any, reduction: Any, *, split_k: int, bind: bool) -> Any:
    """Split-K: ``split_k`` blocks share the ``reduction`` loop of ``block``.

    Returns the rfactor block, which sums each share into a partial output; its loop nest is
    rebuilt with the share index, now spatial, where ``reduction`` was (the caller schedules
    it like the unsplit block). ``block`` becomes the second kernel: it adds the partials and
    keeps the epilogue that follows it.
    """
    share, _ = sch.split(reduction, [split_k, None])
    partial = sch.rfactor(share, factor_axis=0)
    _schedule_split_k_sum(sch, block, bind=bind)
    return partial


def _schedule_split_k_sum(sch: tvm.s_tir.Schedule, block: Any, *, bind: bool) -> None:
    """The second kernel of a split-K conv or GEMM: one thread per output adds the ``split_k``
    partials (consecutive threads on consecutive elements of the stored layout: coalesced)."""
    *spatial, rk = sch.get_loops(block)
    bx, tx = sch.split(sch.fuse(*spatial), [None, _SUM_THREADS])
    if bind:
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    write = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write, tx, preserve_unit_loops=True)
    sch.decompose_reduction(block, rk)


def _check_fits(usage: BlockUsage, limits: GpuLimits | None, what: str) -> None:
    if limits is None:
        return
    why = usage.violation(limits)
    if why is not None:
        raise ValueError(f"{what}: {why}")


def schedule_cuda_conv(func: tvm.tirx.PrimFunc, *, conv: te.Tensor, stages: Sequence[te.Tensor],
                       source: te.Tensor | None, rank: int, tiling: CudaConvTiling, limits: GpuLimits | None = None,
                       target: tvm.target.Target | None = None, bind: bool = True) -> tvm.IRModule:
    """Schedule a tiled-layout conv (any spatial rank) for a GPU, epilogue fused.

    Parameters
    ----------
    func
        The PrimFunc of the partition (conv stage in the tiled template: loops
        ``n, S/s..., O/ot, s..., ot, rc, k...``).
    conv, stages, source
        The conv's TE tensor, its epilogue stages and its pad stage (None: reads its
        argument directly).
    rank
        Spatial dims.
    tiling
        The layout tiles (already applied in ``func``) and the loop parameters.
    limits
        If given, the block is checked against them first.
    target
        With ``limits``: the scheduled kernel is also lowered for it and checked by TVM's
        GPU verifier (shared memory as TVM really allocates it).
    bind
        False: no thread bindings and ``"global"`` staging buffers, to run the same loop
        nest on a CPU.

    Returns
    -------
    tvm.IRModule

    Raises
    ------
    ValueError
        If the loop parameters do not divide the loops, or the block exceeds ``limits``.
    """
    t = tiling
    if len(t.spatial) != rank:
        raise ValueError(f"schedule_cuda_conv: tiling has {len(t.spatial)} spatial tiles for a rank-{rank} conv")
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock(conv.op.name)
    loops = sch.get_loops(block)
    n, outer, oo = loops[0], list(loops[1:1 + rank]), loops[1 + rank]
    inner, oi = list(loops[2 + rank:2 + 2 * rank]), loops[2 + 2 * rank]
    rc, kernel_loops = loops[3 + 2 * rank], list(loops[4 + 2 * rank:])
    extents = {name: int(sch.get(loop).extent) for name, loop in
               (("O/ot", oo), ("ot", oi), ("s_last", inner[-1]), ("rc", rc))}
    for knob, value, extent in (("block_o", t.block_o, "O/ot"), ("tile_o", t.tile_o, "ot"),
                                ("tile_s", t.tile_s, "s_last"), ("rc_split", t.rc_split, "rc")):
        if extents[extent] % value:
            raise ValueError(f"schedule_cuda_conv: {knob}={value} does not divide the {extent} loop "
                             f"(extent {extents[extent]})")
    if tuple(int(sch.get(loop).extent) for loop in inner) != tuple(t.spatial):
        raise ValueError(f"schedule_cuda_conv: tiling.spatial={t.spatial} is not the layout's tile "
                         f"{tuple(int(sch.get(loop).extent) for loop in inner)}")
    if limits is not None and t.threads > limits.max_threads_per_block:
        raise ValueError(f"schedule_cuda_conv: {t.threads} threads per block exceed "
                         f"max_threads_per_block={limits.max_threads_per_block}")
    if (extents["rc"] // t.rc_split) % t.split_k:
        raise ValueError(f"schedule_cuda_conv: split_k={t.split_k} does not divide the "
                         f"{extents['rc'] // t.rc_split} reduction stages (rc {extents['rc']} / rc_split {t.rc_split})")
    rk = None
    if t.split_k > 1:
        block = _split_k(sch, block, rc, split_k=t.split_k, bind=bind)
        loops = sch.get_loops(block)  # n, S/s.., O/ot, s.., ot, rk (the share), rc, k..
        n, outer, oo = loops[0], list(loops[1:1 + rank]), loops[1 + rank]
        inner, oi = list(loops[2 + rank:2 + 2 * rank]), loops[2 + 2 * rank]
        rk, rc, kernel_loops = loops[3 + 2 * rank], loops[4 + 2 * rank], list(loops[5 + 2 * rank:])
    oo_b, oo_t = sch.split(oo, [None, t.block_o])
    # Each thread owns a contiguous register tile: its accumulators' write-back (placed
    # by reverse_compute_at) is then exactly its own elements. Strided tiles would need
    # virtual threads, as a bounding box would also cover other threads' outputs.
    s_thr, s_reg = sch.split(inner[-1], [None, t.tile_s])
    o_thr, o_reg = sch.split(oi, [None, t.tile_o])
    rc_o, rc_i = sch.split(rc, [None, t.rc_split])
    grid = [n, *outer, oo_b] if rk is None else [rk, n, *outer, oo_b]
    sch.reorder(*grid, oo_t, *inner[:-1], s_thr, o_thr, rc_o, rc_i, *kernel_loops, s_reg, o_reg)
    bx = sch.fuse(*grid)
    tx = sch.fuse(oo_t, *inner[:-1], s_thr, o_thr)
    if bind:
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    write = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write, tx, preserve_unit_loops=True)
    _epilogue(sch, stages)
    inline = [source.op.name] if source is not None else []
    if t.shared:
        _stage_inputs(sch, block, at=rc_o, threads=t.threads, scope="shared" if bind else "global", bind=bind,
                      inline=inline)
    elif source is not None:
        sch.compute_inline(sch.get_sblock(source.op.name))  # read the input straight through the padding
    sch.decompose_reduction(block, rc_o)
    if t.unroll:
        sch.annotate(bx, "pragma_auto_unroll_max_step", t.unroll)
        sch.annotate(bx, "pragma_unroll_explicit", 1)
    if bind and target is not None and limits is not None:
        verify_gpu_kernels(sch.mod, target=target, limits=limits)
    return sch.mod


def schedule_cuda_gemm(func: tvm.tirx.PrimFunc, *, gemm: te.Tensor, stages: Sequence[te.Tensor], batch: int,
                       tiling: CudaGemmTiling, limits: GpuLimits | None = None,
                       target: tvm.target.Target | None = None, bind: bool = True) -> tvm.IRModule:
    """Schedule ``batch.. M N | K`` matmul for a GPU: ``bm x bn`` blocks, register tiles, shared stages.

    Parameters
    ----------
    func
        The PrimFunc (gemm stage loops ``batch..., m, n, k``).
    gemm, stages
        The matmul's TE tensor and its epilogue stages.
    batch
        Leading batch dims.
    tiling
        Loop parameters (``nt`` is the weight layout, already applied in ``func``).
    limits
        If given, the block is checked against them first.
    target
        With ``limits``: the scheduled kernel is also checked by TVM's GPU verifier.
    bind
        False: no thread bindings and ``"global"`` staging buffers (runs on a CPU).

    Returns
    -------
    tvm.IRModule

    Raises
    ------
    ValueError
        If the block tile does not divide M or N, ``k_split`` does not divide K, ``split_k``
        does not divide the stages, or the block exceeds ``limits``.
    """
    t = tiling
    _check_fits(gemm_block_usage(t), limits, "schedule_cuda_gemm")
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock(gemm.op.name)
    loops = sch.get_loops(block)
    lead, m, n, k = loops[:batch], loops[batch], loops[batch + 1], loops[batch + 2]
    bm, bn = t.block
    for knob, value, loop in (("thread_m * tile_m", bm, m), ("thread_n * tile_n", bn, n), ("k_split", t.k_split, k)):
        extent = int(sch.get(loop).extent)
        if extent % value:
            raise ValueError(f"schedule_cuda_gemm: {knob}={value} does not divide the loop extent {extent}")
    steps = int(sch.get(k).extent) // t.k_split
    if steps % t.split_k:
        raise ValueError(f"schedule_cuda_gemm: split_k={t.split_k} does not divide the {steps} reduction stages")
    grid = []
    if t.split_k > 1:
        block = _split_k(sch, block, k, split_k=t.split_k, bind=bind)
        loops = sch.get_loops(block)  # batch.., m, n, rk (the share), k
        lead, m, n, k = loops[:batch], loops[batch], loops[batch + 1], loops[batch + 3]
        grid.append(loops[batch + 2])
    m_b, m_t, m_r = sch.split(m, [None, t.thread_m, t.tile_m])  # contiguous per-thread tiles (see the conv)
    n_b, n_t, n_r = sch.split(n, [None, t.thread_n, t.tile_n])
    k_o, k_i = sch.split(k, [None, t.k_split])
    grid += [*lead, m_b, n_b]
    sch.reorder(*grid, m_t, n_t, k_o, k_i, m_r, n_r)
    bx = sch.fuse(*grid)
    tx = sch.fuse(m_t, n_t)
    if bind:
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    write = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write, tx, preserve_unit_loops=True)
    _epilogue(sch, stages)
    if t.shared:
        _stage_inputs(sch, block, at=k_o, threads=t.threads, scope="shared" if bind else "global", bind=bind)
    sch.decompose_reduction(block, k_o)
    if t.unroll:
        sch.annotate(bx, "pragma_auto_unroll_max_step", t.unroll)
        sch.annotate(bx, "pragma_unroll_explicit", 1)
    if bind and target is not None and limits is not None:
        verify_gpu_kernels(sch.mod, target=target, limits=limits)
    return sch.mod


# --------------------------------------------------------------------------------------
# Strategy glue: the CPU strategies build TE and layouts, the schedule is swapped here
# --------------------------------------------------------------------------------------


def _cpu_emulation(context: Any) -> bool:
    """``strategy_options={"alt": {"cuda_cpu_emulation": True}}``: build the GPU loop nest
    without thread bindings or shared buffers, to check its arithmetic on a CPU."""
    options = getattr(context, "options", None)
    return isinstance(options, dict) and bool(options.get("cuda_cpu_emulation", False))


def _conv_shapes(geometry: ConvGeometry) -> dict[str, Any]:
    """The conv's extents as :func:`default_cuda_conv_tiling` and the space take them."""
    return {"out_shape": tuple(geometry.out_shape), "in_channels_per_group": geometry.in_per_group,
            "out_channels_per_group": geometry.out_per_group, "in_channels": geometry.data_shape[1],
            "kernel": tuple(geometry.weight_shape[2:]),
            # A transposed conv is computed as a stride-1 conv over its dilated input.
            "strides": tuple(geometry.conv_strides), "dilation": tuple(geometry.dilation)}


def _gemm_shapes(anchor: Any) -> dict[str, int]:
    m, n, k = _gemm_extents(anchor)
    return {"m": m, "n": n, "k": k}


class AltConvCudaStrategy(AltConvStrategy):
    """The ALT conv template on a CUDA target: the CPU template's TE and layouts, GPU loops.

    ``context.params`` is :class:`CudaConvTiling` JSON (None: :func:`default_cuda_conv_tiling`).
    """

    target_kinds = ("cuda",)
    # No channel scale: the GPU schedule has no block for the scaled weights.
    patterns = (ABSORBED_INPUT, BLOCK.where(fuses_block))

    def _tiling(self, geometry: ConvGeometry, context: Any) -> CudaConvTiling:
        if context.params is not None:
            return CudaConvTiling.from_json(context.params)
        return default_cuda_conv_tiling(**_conv_shapes(geometry), limits=GpuLimits.from_target(context.target))

    def layout_params(self, geometry: ConvGeometry, context: Any) -> tuple[DefaultConvTiling, str]:
        # ALT-OL's whole-extent layouts are a CPU ablation: the GPU path always tiles.
        return DefaultConvTiling.from_json(self._tiling(geometry, context).cpu_layout_params()), "alt"

    def schedule(self, *, conv: te.Tensor, stages: list, pad_stage: te.Tensor | None, geometry: ConvGeometry,
                 layouts: Any, context: Any) -> Any:
        tiling = self._tiling(geometry, context)
        limits = GpuLimits.from_target(context.target)
        target, bind = context.target.to_tvm(), not _cpu_emulation(context)
        return lambda f: schedule_cuda_conv(f, conv=conv, stages=stages, source=pad_stage, rank=geometry.rank,
                                            tiling=tiling, limits=limits, target=target, bind=bind)

    def space(self, anchor: Any, context: Any) -> Any:
        from .cuda_space import CudaConvSpace

        shapes = _conv_shapes(ConvGeometry.of(anchor))
        limits = GpuLimits.from_target(context.target)
        default = default_cuda_conv_tiling(**shapes, limits=limits)
        return CudaConvSpace(**shapes, default=default.to_json(), limits=limits)


class AltGemmCudaStrategy(AltGemmStrategy):
    """The ALT GEMM template on a CUDA target: the CPU template's TE and weight layout, GPU loops.

    ``context.params`` is :class:`CudaGemmTiling` JSON (None: :func:`default_cuda_gemm_tiling`).
    """

    target_kinds = ("cuda",)

    def _tiling(self, anchor: Any, context: Any) -> CudaGemmTiling:
        if context.params is not None:
            return CudaGemmTiling.from_json(context.params)
        return default_cuda_gemm_tiling(**_gemm_shapes(anchor), limits=GpuLimits.from_target(context.target))

    def layout_params(self, anchor: Any, context: Any) -> dict[str, int]:
        return {"nt": self._tiling(anchor, context).nt, "mt": 1, "vec": 1}

    def schedule(self, *, anchor: Any, gemm: te.Tensor, stages: list, batch: int, params: dict[str, Any],
                 context: Any) -> Any:
        tiling = self._tiling(anchor, context)
        limits = GpuLimits.from_target(context.target)
        target, bind = context.target.to_tvm(), not _cpu_emulation(context)
        return lambda f: schedule_cuda_gemm(f, gemm=gemm, stages=stages, batch=batch, tiling=tiling, limits=limits,
                                            target=target, bind=bind)

    def space(self, anchor: Any, context: Any) -> Any:
        from .cuda_space import CudaGemmSpace

        shapes = _gemm_shapes(anchor)
        limits = GpuLimits.from_target(context.target)
        return CudaGemmSpace(**shapes, default=default_cuda_gemm_tiling(**shapes, limits=limits).to_json(),
                             limits=limits)


register_strategy(AltConvCudaStrategy())
register_strategy(AltGemmCudaStrategy())
