"""CUDA tilings of the ALT conv and GEMM templates, and the device limits they must respect.

A tiling fixes a block's threads, per-thread register tile, reduction stage and unroll
step; :func:`conv_tiling_problem` / :func:`gemm_tiling_problem` say why one does not fit
an operator or a device before anything is built (the tuning space rejects such points),
and :func:`default_cuda_conv_tiling` / :func:`default_cuda_gemm_tiling` are the untuned
choice. The schedules that apply them are in :mod:`alt_tvm.strategies.alt.conv_cuda`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import tvm

from alt_tvm.strategies.base import tiles_for
from alt_tvm.target import HardwareTarget

__all__ = [
    "BlockUsage",
    "CudaConvTiling",
    "CudaGemmTiling",
    "GpuLimits",
    "conv_block_usage",
    "conv_tiling_problem",
    "default_cuda_conv_tiling",
    "default_cuda_gemm_tiling",
    "gemm_block_usage",
    "gemm_tiling_problem",
    "gpu_channel_tile",
    "gpu_kernel_violations",
    "is_cuda",
    "verify_gpu_kernels",
]

#: Bytes of one float32 element (the strategies are float32 only).
_ELEM = 4
#: Most accumulators one thread keeps (V100: 255 registers per thread, inputs need some).
MAX_ACCUMULATORS = 64
#: Values ``unroll`` may take (0: no unroll pragma).
UNROLL_STEPS = (0, 16, 64, 512)
#: The untuned conv and GEMM tilings split the reduction of a layer with fewer output blocks
#: than SMs among blocks (split-K) until there are this many blocks per SM. On an H100,
#: ResNet-18's 7x7 layer (112 output blocks) runs in 144, 139 and 67 us with 4, 8 and 16 splits
#: (3.4, 6.8 and 13.6 blocks per SM), its classifier at batch 1 (40 blocks) in 11.2, 8.0 and
#: 7.9 us with 1, 8 and 16 splits (docs/gpu.md).
SPLIT_K_BLOCKS_PER_SM = 8
#: ... but no block's share of the reduction falls below this many products. The classifier's
#: 512 products split 8, 16 and 32 ways (64, 32 and 16 per block) run in 7.7, 9.2 and 10.7 us
#: on an H100 (the partial sums outweigh the reduction they split); the convs' stages hold
#: 288 products or more (docs/gpu.md).
SPLIT_K_MIN_PRODUCTS = 64


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
    when ``shared``); ``unroll`` is the auto-unroll step (0: off). ``split_k`` > 1 splits
    the stages among that many blocks per output tile (split-K): each sums its share into a
    partial output and a second kernel adds the partials, for convs with too few output
    tiles to fill the GPU's multiprocessors.
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
    split_k: int = 1

    def __post_init__(self) -> None:
        if not self.spatial:
            raise ValueError("CudaConvTiling.spatial must have one tile per spatial dim, got ()")
        for d, s in enumerate(self.spatial):
            _check_positive("CudaConvTiling", **{f"spatial[{d}]": s})
        _check_positive("CudaConvTiling", ot=self.ot, it=self.it, block_o=self.block_o, tile_o=self.tile_o,
                        tile_s=self.tile_s, rc_split=self.rc_split, split_k=self.split_k)
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
                "rc_split": self.rc_split, "shared": self.shared, "unroll": self.unroll, "split_k": self.split_k}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> CudaConvTiling:
        """Parse :meth:`to_json` output; raises ``ValueError`` naming the record if it is not one."""
        try:
            return cls(spatial=tuple(int(s) for s in record["spatial"]), ot=int(record["ot"]), it=int(record["it"]),
                       weight_ot=int(record.get("weight_ot", 0)), weight_it=int(record.get("weight_it", 0)),
                       block_o=int(record["block_o"]), tile_o=int(record["tile_o"]), tile_s=int(record["tile_s"]),
                       rc_split=int(record["rc_split"]), shared=bool(record.get("shared", True)),
                       unroll=int(record.get("unroll", 0)), split_k=int(record.get("split_k", 1)))
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
    ``k_split`` reduction steps are staged at a time (in shared memory when ``shared``);
    ``split_k`` > 1 shares the stages among that many blocks per output tile, with a second
    kernel adding their partial sums (split-K, as for the conv).
    """

    nt: int
    thread_m: int = 1
    tile_m: int = 1
    thread_n: int = 1
    tile_n: int = 1
    k_split: int = 1
    shared: bool = True
    unroll: int = 64
    split_k: int = 1

    def __post_init__(self) -> None:
        _check_positive("CudaGemmTiling", nt=self.nt, thread_m=self.thread_m, tile_m=self.tile_m,
                        thread_n=self.thread_n, tile_n=self.tile_n, k_split=self.k_split, split_k=self.split_k)
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
                "tile_n": self.tile_n, "k_split": self.k_split, "shared": self.shared, "unroll": self.unroll,
                "split_k": self.split_k}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> CudaGemmTiling:
        """Parse :meth:`to_json` output; raises ``ValueError`` naming the record if it is not one."""
        try:
            return cls(nt=int(record["nt"]), thread_m=int(record["thread_m"]), tile_m=int(record["tile_m"]),
                       thread_n=int(record["thread_n"]), tile_n=int(record["tile_n"]),
                       k_split=int(record["k_split"]), shared=bool(record.get("shared", True)),
                       split_k=int(record.get("split_k", 1)),
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
    if why is None and (in_channels_per_group // t.rc_split) % t.split_k:
        return (f"split_k={t.split_k} does not divide the {in_channels_per_group // t.rc_split} reduction stages "
                f"({in_channels_per_group} channels per group / rc_split={t.rc_split})")
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
    if (k // t.k_split) % t.split_k:
        return f"split_k={t.split_k} does not divide the {k // t.k_split} stages (K={k} / k_split={t.k_split})"
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
    one tile) as fit; when none fits, inputs are read from global memory. When the output
    tiles give fewer blocks than SMs (small late-stage maps), the stages are split among
    blocks (``split_k``, the smallest divisor of the stage count that gives
    :data:`SPLIT_K_BLOCKS_PER_SM` blocks per SM, or one stage per block).
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
    split_k = _default_split_k(blocks=tiles * channel_tiles // best.block_o, stages=reduce // best.rc_split,
                               stage_products=best.rc_split * math.prod(kernel), limits=limits)
    return dataclasses.replace(best, split_k=split_k)


def default_cuda_gemm_tiling(*, m: int, n: int, k: int, limits: GpuLimits) -> CudaGemmTiling:
    """Analytic GPU GEMM tiling: a warp of threads along N (up to 256 threads), 4x4 outputs per
    thread when the problem is big enough to keep every SM busy, ``nt`` up to 32 dividing the
    block's columns, and the largest ``k_split`` (up to 16) whose stage fits half the shared
    memory. When the blocks are fewer than the SMs (a batch-1 dense layer), the stages are
    split among blocks as in :func:`default_cuda_conv_tiling`."""
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
    best = best or CudaGemmTiling(nt, thread_m, tile_m, thread_n, tile_n, 1, shared=False)
    block_m, block_n = best.block
    blocks = (m // block_m) * (n // block_n)
    return dataclasses.replace(best, split_k=_default_split_k(blocks=blocks, stages=k // best.k_split,
                                                              stage_products=best.k_split, limits=limits))


def _default_split_k(*, blocks: int, stages: int, stage_products: int, limits: GpuLimits) -> int:
    """1 when the output blocks fill every SM once; else the smallest divisor of ``stages`` that
    gives :data:`SPLIT_K_BLOCKS_PER_SM` blocks per SM, and no more splits than leave each block
    :data:`SPLIT_K_MIN_PRODUCTS` products of the reduction (``stage_products`` per stage).

    Only layers of fewer blocks than SMs were timed (112 and 40 blocks on 132 SMs); a split
    of layers that already fill the SMs adds partial sums to write and read, unmeasured.
    """
    if blocks >= limits.num_sms:
        return 1
    allowed = _divisors(stages, max(1, stages * stage_products // SPLIT_K_MIN_PRODUCTS))
    return next((split_k for split_k in allowed if blocks * split_k >= SPLIT_K_BLOCKS_PER_SM * limits.num_sms),
                allowed[-1])


def _divisors(extent: int, cap: int) -> list[int]:
    return [d for d in range(1, max(1, min(extent, cap)) + 1) if extent % d == 0]


# --------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------
