"""GPU (CUDA) loop schedules for the ALT conv and GEMM templates.

The TE and the tensors' layouts are exactly the CPU path's (``alt_conv`` / ``alt_gmm``
build them; this module only swaps the loop schedule), so layout propagation between
partitions does not depend on the target. The schedule is the classic GPU tiling:

* block tile -> ``blockIdx.x``: one output tile of the layout (times ``block_o`` channel
  tiles) for a conv, ``bm x bn`` outputs for a GEMM;
* thread tile -> ``threadIdx.x``, with a contiguous per-thread register tile accumulated
  in ``"local"`` memory (threads along channels read the staged weights at a stride of
  the tile, which falls on distinct shared-memory banks for tiles up to 4);
* reduction split into stages whose input and weight tiles are fetched cooperatively
  into ``"shared"`` memory by all the block's threads;
* optional ``pragma_auto_unroll_max_step``; the element-wise epilogue is fused into the
  write-back of the accumulators.

``bind=False`` builds the same loop nest with no thread bindings and ordinary buffers
instead of shared ones, so the schedule's arithmetic can be run (and checked) on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import tvm
from tvm import te

from alt_tvm.graph.lower import attrs_dict, tiles_for
from alt_tvm.graph.partition import static_shape
from alt_tvm.target import HardwareTarget

__all__ = [
    "CudaConvTiling",
    "CudaGemmTiling",
    "GpuLimits",
    "conv_block_usage",
    "conv_tiling_problem",
    "cuda_conv_space",
    "cuda_gemm_space",
    "default_cuda_conv_tiling",
    "default_cuda_gemm_tiling",
    "gemm_block_usage",
    "gemm_tiling_problem",
    "gpu_channel_tile",
    "implement_cuda_conv",
    "implement_cuda_gemm",
    "is_cuda",
    "schedule_cuda_conv",
    "schedule_cuda_gemm",
    "gpu_kernel_violations",
    "verify_gpu_kernels",
]

#: Bytes of one float32 element (the strategies are float32 only).
_ELEM = 4
#: Most accumulators one thread keeps (V100: 255 registers per thread, inputs need some).
MAX_ACCUMULATORS = 64
#: Values ``unroll`` may take (0: no unroll pragma).
UNROLL_STEPS = (0, 16, 64, 512)


@dataclass(frozen=True)
class GpuLimits:
    """The per-block limits of a CUDA device that the schedule must respect.

    ``HardwareTarget`` does not carry them as fields; :meth:`from_target` reads them from
    its TVM target dict (``max_threads_per_block``, ``max_shared_memory_per_block``, ...)
    and takes the SM count from ``num_cores``.
    """

    max_threads_per_block: int = 1024
    max_shared_memory_per_block: int = 48 * 1024
    warp_size: int = 32
    registers_per_block: int = 65536
    num_sms: int = 80

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GpuLimits.{f.name} must be a positive int, got {value!r}")

    @classmethod
    def from_target(cls, target: HardwareTarget) -> GpuLimits:
        """Limits of ``target`` (a CUDA board); missing entries keep the V100 defaults.

        Raises
        ------
        ValueError
            If ``target`` is not a CUDA target.
        """
        if not is_cuda(target):
            raise ValueError(f"GpuLimits.from_target: {target.name!r} is not a CUDA target "
                             f"(kind {target.tvm_target.get('kind')!r})")
        spec = target.tvm_target
        default = cls()
        return cls(
            max_threads_per_block=int(spec.get("max_threads_per_block", default.max_threads_per_block)),
            max_shared_memory_per_block=int(spec.get("max_shared_memory_per_block",
                                                     default.max_shared_memory_per_block)),
            warp_size=int(spec.get("thread_warp_size", default.warp_size)),
            registers_per_block=int(spec.get("registers_per_block", default.registers_per_block)),
            num_sms=int(target.num_cores) if target.num_cores > 0 else default.num_sms)


def is_cuda(target: HardwareTarget) -> bool:
    """True if ``target`` generates CUDA code."""
    return target.to_tvm().kind.name == "cuda"


def _check_positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


def _check_unroll(owner: str, unroll: int) -> None:
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 0:
        raise ValueError(f"{owner}.unroll must be an int >= 0, got {unroll!r}")


# --------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaConvTiling:
    """Layout tiles (as the CPU template) and the GPU loop parameters of a conv.

    Layout: ``spatial`` output tiles, ``ot`` / ``it`` channel tiles of the output / input,
    ``weight_ot`` / ``weight_it`` of the weight (0: same as ``ot`` / ``it``).
    Loops: a block computes ``block_o`` consecutive layout tiles along channels; each
    thread computes ``tile_s`` positions of the last spatial tile times ``tile_o``
    channels; the reduction channels are staged ``rc_split`` at a time (in shared memory
    when ``shared``); ``unroll`` is the auto-unroll step (0: off).
    """

    spatial: tuple[int, ...]
    ot: int
    it: int
    weight_ot: int = 0
    weight_it: int = 0
    block_o: int = 1
    tile_o: int = 1
    tile_s: int = 1
    rc_split: int = 1
    shared: bool = True
    unroll: int = 64

    def __post_init__(self) -> None:
        if not self.spatial:
            raise ValueError("CudaConvTiling.spatial must have one tile per spatial dim, got ()")
        for d, s in enumerate(self.spatial):
            _check_positive("CudaConvTiling", **{f"spatial[{d}]": s})
        _check_positive("CudaConvTiling", ot=self.ot, it=self.it, block_o=self.block_o, tile_o=self.tile_o,
                        tile_s=self.tile_s, rc_split=self.rc_split)
        for name in ("weight_ot", "weight_it"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"CudaConvTiling.{name} must be an int >= 0, got {value!r}")
        _check_unroll("CudaConvTiling", self.unroll)
        if self.ot % self.tile_o:
            raise ValueError(f"CudaConvTiling.tile_o={self.tile_o} must divide ot={self.ot}")
        if self.spatial[-1] % self.tile_s:
            raise ValueError(f"CudaConvTiling.tile_s={self.tile_s} must divide the last spatial tile "
                             f"{self.spatial[-1]}")

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.block_o * math.prod(self.spatial[:-1]) * (self.spatial[-1] // self.tile_s) * \
            (self.ot // self.tile_o)

    def to_json(self) -> dict[str, Any]:
        return {"spatial": list(self.spatial), "ot": self.ot, "it": self.it, "weight_ot": self.weight_ot,
                "weight_it": self.weight_it, "block_o": self.block_o, "tile_o": self.tile_o, "tile_s": self.tile_s,
                "rc_split": self.rc_split, "shared": self.shared, "unroll": self.unroll}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> CudaConvTiling:
        """Parse :meth:`to_json` output; raises ``ValueError`` naming the record if it is not one."""
        try:
            return cls(spatial=tuple(int(s) for s in record["spatial"]), ot=int(record["ot"]), it=int(record["it"]),
                       weight_ot=int(record.get("weight_ot", 0)), weight_it=int(record.get("weight_it", 0)),
                       block_o=int(record["block_o"]), tile_o=int(record["tile_o"]), tile_s=int(record["tile_s"]),
                       rc_split=int(record["rc_split"]), shared=bool(record.get("shared", True)),
                       unroll=int(record.get("unroll", 0)))
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a CUDA conv tiling record: {record!r} ({err!r})") from None

    def cpu_layout_params(self) -> dict[str, Any]:
        """The CPU template's parameters with the same layouts (``DefaultConvTiling`` JSON)."""
        return {"spatial": list(self.spatial), "ot": self.ot, "it": self.it, "reg": 1,
                "weight_ot": self.weight_ot, "weight_it": self.weight_it}


@dataclass(frozen=True)
class CudaGemmTiling:
    """Layout tile ``nt`` (the packed weight ``N/nt . K . nt``) and the GPU loop parameters.

    A block computes ``(thread_m * tile_m) x (thread_n * tile_n)`` outputs with
    ``thread_m * thread_n`` threads, each holding ``tile_m x tile_n`` accumulators;
    ``k_split`` reduction steps are staged at a time (in shared memory when ``shared``).
    """

    nt: int
    thread_m: int = 1
    tile_m: int = 1
    thread_n: int = 1
    tile_n: int = 1
    k_split: int = 1
    shared: bool = True
    unroll: int = 64

    def __post_init__(self) -> None:
        _check_positive("CudaGemmTiling", nt=self.nt, thread_m=self.thread_m, tile_m=self.tile_m,
                        thread_n=self.thread_n, tile_n=self.tile_n, k_split=self.k_split)
        _check_unroll("CudaGemmTiling", self.unroll)

    @property
    def threads(self) -> int:
        return self.thread_m * self.thread_n

    @property
    def block(self) -> tuple[int, int]:
        """Outputs per block along M and N."""
        return self.thread_m * self.tile_m, self.thread_n * self.tile_n

    def to_json(self) -> dict[str, Any]:
        return {"nt": self.nt, "thread_m": self.thread_m, "tile_m": self.tile_m, "thread_n": self.thread_n,
                "tile_n": self.tile_n, "k_split": self.k_split, "shared": self.shared, "unroll": self.unroll}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> CudaGemmTiling:
        """Parse :meth:`to_json` output; raises ``ValueError`` naming the record if it is not one."""
        try:
            return cls(nt=int(record["nt"]), thread_m=int(record["thread_m"]), tile_m=int(record["tile_m"]),
                       thread_n=int(record["thread_n"]), tile_n=int(record["tile_n"]),
                       k_split=int(record["k_split"]), shared=bool(record.get("shared", True)),
                       unroll=int(record.get("unroll", 0)))
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a CUDA GEMM tiling record: {record!r} ({err!r})") from None


# --------------------------------------------------------------------------------------
# Resource use of a block (checked before anything is built)
# --------------------------------------------------------------------------------------


def _box(length: int, tile: int, align: int) -> int:
    """Elements of the bounding box that a run of ``length`` indices occupies in a dim split by ``tile``.

    The run starts at a multiple of ``align``; the worst start is taken. This is what
    ``cache_read`` allocates for such a run (outer x inner extents of the split dim).
    """
    worst = 0
    for offset in range(0, tile, math.gcd(max(1, align), tile)):
        spanned = -(-(offset + length) // tile)
        worst = max(worst, length if spanned == 1 else spanned * tile)
    return worst


@dataclass(frozen=True)
class BlockUsage:
    """Threads, shared bytes and accumulators per thread of one thread block."""

    threads: int
    shared_bytes: int
    accumulators: int

    def violation(self, limits: GpuLimits) -> str | None:
        """Why the block does not fit ``limits``, or ``None``."""
        if self.threads > limits.max_threads_per_block:
            return f"{self.threads} threads per block exceed max_threads_per_block={limits.max_threads_per_block}"
        if self.shared_bytes > limits.max_shared_memory_per_block:
            return (f"{self.shared_bytes} bytes of shared memory per block exceed "
                    f"max_shared_memory_per_block={limits.max_shared_memory_per_block}")
        if self.accumulators > MAX_ACCUMULATORS:
            return f"{self.accumulators} accumulators per thread exceed {MAX_ACCUMULATORS}"
        if self.threads * min(255, 2 * self.accumulators + 16) > limits.registers_per_block:
            return (f"{self.threads} threads x ~{2 * self.accumulators + 16} registers exceed "
                    f"registers_per_block={limits.registers_per_block}")
        return None


def conv_block_usage(tiling: CudaConvTiling, *, in_channels_per_group: int, out_channels_per_group: int,
                     kernel: Sequence[int], strides: Sequence[int], dilation: Sequence[int]) -> BlockUsage:
    """Threads, shared memory (upper bound) and accumulators of a conv block.

    Shared memory: the input window of one layout tile (``(s-1)*stride + (k-1)*dilation + 1``
    per spatial dim) for the stage's input channels, and the weights of the block's
    output channels for the stage's channels, as bounding boxes in the tiled layouts.
    Zero when ``tiling.shared`` is off.
    """
    t = tiling
    accumulators = t.tile_o * t.tile_s
    if not t.shared:
        return BlockUsage(t.threads, 0, accumulators)
    outputs = t.block_o * t.ot
    aligned = outputs % out_channels_per_group == 0 or out_channels_per_group % outputs == 0
    groups = -(-outputs // out_channels_per_group) + (0 if aligned else 1)  # groups the block's outputs touch
    if in_channels_per_group == 1:
        # One input channel per group: the input channel follows the output channel.
        in_box = _box(groups, t.it, groups if outputs % out_channels_per_group == 0 else 1)
    else:
        channels = (groups - 1) * in_channels_per_group + t.rc_split
        in_box = _box(channels, t.it, math.gcd(t.rc_split, in_channels_per_group))
    window = math.prod((s - 1) * v + (k - 1) * d + 1 for s, k, v, d in zip(t.spatial, kernel, strides, dilation))
    weight_o = _box(outputs, t.weight_ot or t.ot, outputs)
    weight_i = _box(t.rc_split, t.weight_it or t.it, t.rc_split)
    shared = (in_box * window + weight_o * weight_i * math.prod(kernel)) * _ELEM
    return BlockUsage(t.threads, shared, accumulators)


def gemm_block_usage(tiling: CudaGemmTiling) -> BlockUsage:
    """Threads, shared memory (upper bound) and accumulators of a GEMM block."""
    t = tiling
    bm, bn = t.block
    shared = (bm * t.k_split + t.k_split * _box(bn, t.nt, bn)) * _ELEM if t.shared else 0
    return BlockUsage(t.threads, shared, t.tile_m * t.tile_n)


def conv_tiling_problem(tiling: CudaConvTiling, *, in_channels_per_group: int, out_channels_per_group: int,
                        kernel: Sequence[int], strides: Sequence[int], dilation: Sequence[int],
                        limits: GpuLimits) -> str | None:
    """Why ``tiling`` cannot run on a device with ``limits``, or ``None``.

    Besides the block's resources, a staged tile must consist of whole layout tiles
    (``weight_ot`` dividing the block's channels, ``it`` / ``weight_it`` dividing the
    stage's channels): otherwise TVM's buffer compaction cannot bound the shared buffer
    tightly (it indexes a tile with div/mod of thread indices), allocates far more than
    the tile, and the estimate here would not bound the real allocation.
    """
    t = tiling
    usage = conv_block_usage(t, in_channels_per_group=in_channels_per_group,
                             out_channels_per_group=out_channels_per_group, kernel=kernel, strides=strides,
                             dilation=dilation)
    why = usage.violation(limits)
    if why is None and t.shared:
        outputs = t.block_o * t.ot
        if outputs % (t.weight_ot or t.ot):
            return f"weight_ot={t.weight_ot or t.ot} does not divide the block's {outputs} output channels"
        if in_channels_per_group > 1:
            for name, tile in (("it", t.it), ("weight_it", t.weight_it or t.it)):
                if t.rc_split % tile:
                    return f"{name}={tile} does not divide rc_split={t.rc_split}"
        elif outputs % t.it:
            return f"it={t.it} does not divide the block's {outputs} channels (one input channel per group)"
    return why


def gemm_tiling_problem(tiling: CudaGemmTiling, *, m: int, n: int, k: int, limits: GpuLimits) -> str | None:
    """Why ``tiling`` cannot run an ``M x N x K`` GEMM on a device with ``limits``, or ``None``.

    The block's columns must be whole ``nt`` tiles when staged (see :func:`conv_tiling_problem`).
    """
    t = tiling
    bm, bn = t.block
    if m % bm:
        return f"block rows thread_m*tile_m={bm} do not divide M={m}"
    if n % bn:
        return f"block columns thread_n*tile_n={bn} do not divide N={n}"
    if k % t.k_split:
        return f"k_split={t.k_split} does not divide K={k}"
    why = gemm_block_usage(t).violation(limits)
    if why is None and t.shared and bn % t.nt:
        return f"nt={t.nt} does not divide the block's {bn} columns"
    return why


def gpu_kernel_violations(mod: tvm.IRModule, *, target: tvm.target.Target, limits: GpuLimits) -> list[str]:
    """Lower ``mod`` with the target's TIR pipeline; the device kernels ``verify_gpu_code`` rejects.

    Raises
    ------
    ValueError
        If lowering produced no device kernel at all (nothing was bound to the GPU).
    """
    import importlib

    lowered = tvm.tirx.transform.BindTarget(target)(mod)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(target)
    # (tvm.tirx.build is shadowed by the build function; the module holds the splitter.)
    _, device = importlib.import_module("tvm.tirx.build").split_host_device_mods(pipeline(lowered))
    constraints = {"max_shared_memory_per_block": limits.max_shared_memory_per_block,
                   "max_threads_per_block": limits.max_threads_per_block,
                   "max_thread_x": limits.max_threads_per_block, "max_thread_y": limits.max_threads_per_block,
                   "max_thread_z": 64}
    kernels = [(gv.name_hint, f) for m in device.values() for gv, f in m.functions.items()]
    if not kernels:
        raise ValueError("no device kernel after lowering: the schedule binds nothing to the GPU")
    return [name for name, f in kernels if not tvm.s_tir.analysis.verify_gpu_code(f, constraints)]


def verify_gpu_kernels(mod: tvm.IRModule, *, target: tvm.target.Target, limits: GpuLimits) -> None:
    """Raise ``ValueError`` if a kernel of ``mod`` exceeds ``limits`` (threads, shared memory as
    TVM allocates it), after lowering with the target's TIR pipeline."""
    bad = gpu_kernel_violations(mod, target=target, limits=limits)
    if bad:
        raise ValueError(f"kernels {bad} exceed the device limits (threads <= {limits.max_threads_per_block}, "
                         f"shared memory <= {limits.max_shared_memory_per_block} bytes)")


# --------------------------------------------------------------------------------------
# Analytic defaults
# --------------------------------------------------------------------------------------


def gpu_channel_tile(channels: int) -> int:
    """The channel tile on a GPU: the largest divisor of ``channels`` up to one warp (32).

    A function of the channel count alone (as on the CPU), so a producer's output tile
    equals its consumer's input tile and no conversion runs between them.
    """
    _check_positive("gpu_channel_tile", channels=channels)
    return tiles_for(channels, 32)


def gpu_spatial_tiles(spatial: Sequence[int]) -> tuple[int, ...]:
    """Output tiles of the spatial dims: up to 8 along the last, 4 along the one before, 1 else.

    A function of the extents alone, so producer and consumer layouts agree.
    """
    spatial = list(spatial)
    tiles = [1] * len(spatial)
    tiles[-1] = tiles_for(spatial[-1], 8)
    if len(spatial) > 1:
        tiles[-2] = tiles_for(spatial[-2], 4)
    return tuple(tiles)


def default_cuda_conv_tiling(*, out_shape: Sequence[int], in_channels_per_group: int, out_channels_per_group: int,
                             in_channels: int, kernel: Sequence[int], strides: Sequence[int],
                             dilation: Sequence[int], limits: GpuLimits) -> CudaConvTiling:
    """Analytic GPU tiling: warp-wide channel tiles, 2-4 accumulators per thread, ~256 threads.

    Threads are added (more channel tiles per block) while the block stays within 256
    threads, there are still blocks for every SM, and the staged tiles fit the shared
    memory. The reduction stage takes as many channels (whole input tiles, up to 16 or
    one tile) as fit; when none fits, inputs are read from global memory.
    """
    out_shape = [int(s) for s in out_shape]
    o_extent = out_shape[1] if out_channels_per_group == 1 else out_channels_per_group
    ot = gpu_channel_tile(o_extent)
    it = gpu_channel_tile(in_channels_per_group if in_channels_per_group > 1 else in_channels)
    spatial = gpu_spatial_tiles(out_shape[2:])
    tile_o = tiles_for(ot, 4)
    tile_s = tiles_for(spatial[-1], 2)
    reduce = in_channels_per_group
    budget = limits.max_shared_memory_per_block
    usage = {"in_channels_per_group": in_channels_per_group,
             "out_channels_per_group": out_channels_per_group, "kernel": kernel, "strides": strides,
             "dilation": dilation}
    tiles = out_shape[0] * math.prod(s // t for s, t in zip(out_shape[2:], spatial))
    channel_tiles = out_shape[1] // ot

    def fits(t: CudaConvTiling) -> bool:
        u = conv_block_usage(t, **usage)
        return u.shared_bytes <= budget and conv_tiling_problem(t, **usage, limits=limits) is None

    best = None
    # Stages of whole input tiles (see conv_tiling_problem), up to 16 channels or one tile.
    stages = [d for d in _divisors(reduce, reduce) if d % it == 0 and d <= max(16, it)] if reduce > 1 else [1]
    for rc_split in sorted(stages, reverse=True):
        base = CudaConvTiling(spatial, ot, it, tile_o=tile_o, tile_s=tile_s, rc_split=rc_split)
        if fits(base):
            best = base
            break
    if best is None:  # even one channel per stage is too big: do not stage
        best = CudaConvTiling(spatial, ot, it, tile_o=tile_o, tile_s=tile_s, rc_split=1, shared=False)
    for block_o in _divisors(channel_tiles, channel_tiles):
        candidate = CudaConvTiling(spatial, ot, it, block_o=block_o, tile_o=tile_o, tile_s=tile_s,
                                   rc_split=best.rc_split, shared=best.shared)
        enough_blocks = tiles * (channel_tiles // block_o) >= limits.num_sms
        if candidate.threads <= 256 and enough_blocks and fits(candidate):
            best = candidate
    return best


def default_cuda_gemm_tiling(*, m: int, n: int, k: int, limits: GpuLimits) -> CudaGemmTiling:
    """Analytic GPU GEMM tiling: a warp of threads along N (up to 256 threads), 4x4 outputs per
    thread when the problem is big enough to keep every SM busy, ``nt`` up to 32 dividing the
    block's columns, and the largest ``k_split`` (up to 16) whose stage fits half the shared
    memory."""
    _check_positive("default_cuda_gemm_tiling", m=m, n=n, k=k)
    per_thread = 4 if m * n >= limits.num_sms * 256 * 16 else 2 if m * n >= limits.num_sms * 256 * 4 else 1
    tile_n = tiles_for(n, per_thread)
    tile_m = tiles_for(m, per_thread)
    thread_n = tiles_for(n // tile_n, 32)
    thread_m = tiles_for(m // tile_m, max(1, 256 // thread_n))
    nt = tiles_for(thread_n * tile_n, 32)  # whole weight tiles per block (see gemm_tiling_problem)
    best = None
    for k_split in sorted(_divisors(k, 16), reverse=True):
        t = CudaGemmTiling(nt, thread_m, tile_m, thread_n, tile_n, k_split)
        usage = gemm_block_usage(t)
        if usage.shared_bytes <= limits.max_shared_memory_per_block // 2 and \
                gemm_tiling_problem(t, m=m, n=n, k=k, limits=limits) is None:
            best = t
            break
    return best or CudaGemmTiling(nt, thread_m, tile_m, thread_n, tile_n, 1, shared=False)


def _divisors(extent: int, cap: int) -> list[int]:
    return [d for d in range(1, max(1, min(extent, cap)) + 1) if extent % d == 0]


# --------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------


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
    oo_b, oo_t = sch.split(oo, [None, t.block_o])
    # Each thread owns a contiguous register tile: its accumulators' write-back (placed
    # by reverse_compute_at) is then exactly its own elements. Strided tiles would need
    # virtual threads, as a bounding box would also cover other threads' outputs.
    s_thr, s_reg = sch.split(inner[-1], [None, t.tile_s])
    o_thr, o_reg = sch.split(oi, [None, t.tile_o])
    rc_o, rc_i = sch.split(rc, [None, t.rc_split])
    sch.reorder(n, *outer, oo_b, oo_t, *inner[:-1], s_thr, o_thr, rc_o, rc_i, *kernel_loops, s_reg, o_reg)
    bx = sch.fuse(n, *outer, oo_b)
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
        If the block tile does not divide M or N, ``k_split`` does not divide K, or the
        block exceeds ``limits``.
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
    m_b, m_t, m_r = sch.split(m, [None, t.thread_m, t.tile_m])  # contiguous per-thread tiles (see the conv)
    n_b, n_t, n_r = sch.split(n, [None, t.thread_n, t.tile_n])
    k_o, k_i = sch.split(k, [None, t.k_split])
    sch.reorder(*lead, m_b, n_b, m_t, n_t, k_o, k_i, m_r, n_r)
    bx = sch.fuse(*lead, m_b, n_b)
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


class _CudaContext:
    """A partition context that hands the CPU strategy fixed layout params and swaps its schedule.

    Everything else (placeholders, epilogue, conversions) goes to the real context, so the
    TE and the layouts are the CPU template's, built by the same code.
    """

    def __init__(self, context: Any, params: dict[str, Any], schedule: Any) -> None:
        self._context = context
        self.params = params
        self.variant = "alt"  # ALT-OL's whole-extent layouts are a CPU ablation
        self._schedule = schedule

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def finish(self, *, output: te.Tensor, layouts: dict, schedule: Any, strategy: str) -> Any:
        del schedule  # the CPU loop schedule
        return self._context.finish(output=output, layouts=layouts, strategy=strategy,
                                    schedule=self._schedule(output))


def _anchor_of(output: te.Tensor) -> tuple[te.Tensor, list[te.Tensor]]:
    """The reduction stage under an element-wise epilogue, and the epilogue's stages (output last).

    The epilogue may be a DAG (e.g. ``x * sigmoid(x)``): every computed stage reachable
    from ``output`` without passing the reduction belongs to it.
    """
    anchors, stages, seen = [], [], set()
    stack = [output]
    while stack:
        tensor = stack.pop()
        if tensor.op in seen:
            continue
        seen.add(tensor.op)
        if getattr(tensor.op, "reduce_axis", None):
            anchors.append(tensor)
            continue
        if tensor is not output:
            stages.append(tensor)
        stack.extend(x for x in tensor.op.input_tensors if isinstance(x.op, te.ComputeOp))
    if len({a.op for a in anchors}) != 1:
        raise ValueError(f"expected one reduction stage under {output.op.name!r}, found "
                         f"{[a.op.name for a in anchors]}")
    return anchors[0], ([*stages, output] if output is not anchors[0] else [])


def implement_cuda_conv(strategy: Any, anchor: Any, context: Any) -> Any:
    """``AltConvStrategy.implement`` for a CUDA target: the CPU template's TE and layouts, GPU loops.

    ``context.params`` is :class:`CudaConvTiling` JSON (None: :func:`default_cuda_conv_tiling`).
    """
    from .alt_conv import _CONV_OPS

    rank, _ = _CONV_OPS[str(anchor.value.op.name)]
    limits = GpuLimits.from_target(context.target)
    target = context.target.to_tvm()
    bind = not _cpu_emulation(context)
    if context.params is not None:
        tiling = CudaConvTiling.from_json(context.params)
    else:
        tiling = default_cuda_conv_tiling(**_conv_shapes(anchor), limits=limits)

    def schedule_for(output: te.Tensor):
        conv, stages = _anchor_of(output)
        source = conv.op.input_tensors[0]
        pad_stage = source if isinstance(source.op, te.ComputeOp) else None
        return lambda f: schedule_cuda_conv(f, conv=conv, stages=stages, source=pad_stage, rank=rank,
                                            tiling=tiling, limits=limits, target=target, bind=bind)

    return type(strategy).implement(strategy, anchor, _CudaContext(context, tiling.cpu_layout_params(),
                                                                    schedule_for))


def implement_cuda_gemm(strategy: Any, anchor: Any, context: Any) -> Any:
    """``AltGemmStrategy.implement`` for a CUDA target: the CPU template's TE and layout, GPU loops.

    ``context.params`` is :class:`CudaGemmTiling` JSON (None: :func:`default_cuda_gemm_tiling`).
    """
    limits = GpuLimits.from_target(context.target)
    target = context.target.to_tvm()
    bind = not _cpu_emulation(context)
    if context.params is not None:
        tiling = CudaGemmTiling.from_json(context.params)
    else:
        tiling = default_cuda_gemm_tiling(**_gemm_shapes(anchor), limits=limits)
    batch = len(static_shape(anchor.value.args[0])) - 2

    def schedule_for(output: te.Tensor):
        gemm, stages = _anchor_of(output)
        return lambda f: schedule_cuda_gemm(f, gemm=gemm, stages=stages, batch=batch, tiling=tiling, limits=limits,
                                            target=target, bind=bind)

    return type(strategy).implement(strategy, anchor, _CudaContext(context, {"nt": tiling.nt, "mt": 1, "vec": 1},
                                                                    schedule_for))


def _cpu_emulation(context: Any) -> bool:
    """``strategy_options={"alt": {"cuda_cpu_emulation": True}}``: build the GPU loop nest
    without thread bindings or shared buffers, to check its arithmetic on a CPU."""
    options = getattr(context, "options", None)
    return isinstance(options, dict) and bool(options.get("cuda_cpu_emulation", False))


def wants_cuda(context: Any) -> bool:
    """True if a strategy should hand ``context`` to this module (a CUDA target, not already handed)."""
    return not isinstance(context, _CudaContext) and is_cuda(context.target)


def _conv_shapes(anchor: Any) -> dict[str, Any]:
    """The conv's extents as :func:`default_cuda_conv_tiling` and the space take them."""
    from .alt_conv import _CONV_OPS

    call = anchor.value
    rank, transposed = _CONV_OPS[str(call.op.name)]
    attrs = attrs_dict(call.attrs)
    data_shape, weight_shape = static_shape(call.args[0]), static_shape(call.args[1])
    groups = int(attrs.get("groups", 1))
    in_per_group = data_shape[1] // groups
    out_per_group = weight_shape[1] if transposed else weight_shape[0] // groups
    return {"out_shape": tuple(static_shape(anchor.var)), "in_channels_per_group": in_per_group,
            "out_channels_per_group": out_per_group, "in_channels": data_shape[1],
            "kernel": tuple(weight_shape[2:]),
            # A transposed conv is computed as a stride-1 conv over its dilated input.
            "strides": (1,) * rank if transposed else tuple(attrs.get("strides", [1] * rank)),
            "dilation": tuple(attrs.get("dilation", [1] * rank))}


def _gemm_shapes(anchor: Any) -> dict[str, int]:
    a_shape, b_shape = static_shape(anchor.value.args[0]), static_shape(anchor.value.args[1])
    return {"m": a_shape[-2], "n": b_shape[-1], "k": a_shape[-1]}


def cuda_conv_space(anchor: Any, context: Any) -> Any:
    """``AltConvStrategy.space`` for a CUDA target."""
    from alt_tvm.tuning.cuda_space import CudaConvSpace

    shapes = _conv_shapes(anchor)
    limits = GpuLimits.from_target(context.target)
    default = default_cuda_conv_tiling(**shapes, limits=limits)
    return CudaConvSpace(**shapes, default=default.to_json(), limits=limits)


def cuda_gemm_space(anchor: Any, context: Any) -> Any:
    """``AltGemmStrategy.space`` for a CUDA target."""
    from alt_tvm.tuning.cuda_space import CudaGemmSpace

    shapes = _gemm_shapes(anchor)
    limits = GpuLimits.from_target(context.target)
    return CudaGemmSpace(**shapes, default=default_cuda_gemm_tiling(**shapes, limits=limits).to_json(),
                         limits=limits)
