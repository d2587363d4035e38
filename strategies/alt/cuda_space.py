"""Search spaces for the CUDA schedules: the CPU templates' layout knobs plus GPU loop knobs.

Layout knobs are the split factors of the same §5.1 templates as :class:`ConvSpace` /
:class:`GemmSpace` (so tuned layouts propagate the same way); the loop knobs are those
of :mod:`alt_tvm.strategies.alt.cuda_tiling`: threads (channel tiles per block / threads
along M and N), the per-thread register tile, the reduction stage size, shared-memory
staging on/off, the unroll step, and the split of the reduction among blocks (split-K).
:meth:`check` computes a point's threads, shared memory and accumulators per block and
rejects it before anything is built when they exceed the device's limits.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from alt_tvm.strategies.space import Knob, Space, divisors

from .cuda_tiling import (
    UNROLL_STEPS,
    CudaConvTiling,
    CudaGemmTiling,
    GpuLimits,
    conv_tiling_problem,
    gemm_tiling_problem,
)

__all__ = ["CudaConvSpace", "CudaGemmSpace"]

_BOOL = (False, True)


def _clamp(knobs: Sequence[Knob], point: dict[str, Any]) -> dict[str, Any]:
    """Move each value to its knob's nearest choice (a cap may have cut the analytic value)."""
    return {k.name: k.nearest(float(point[k.name])) for k in knobs}


class _GpuSpace(Space):
    """A space whose points decode to a GPU tiling checked against the device limits."""

    def check(self, layout: dict[str, Any], loop: dict[str, Any]) -> str | None:
        """``None`` for a valid point, else why not (knob values, tiles, threads, shared memory, registers)."""
        why = super().check(layout, loop)
        if why is not None:
            return why
        try:
            tiling = self._tiling(layout, loop)
        except ValueError as err:
            return str(err)
        return self._problem(tiling)

    @abc.abstractmethod
    def _tiling(self, layout: dict[str, Any], loop: dict[str, Any]) -> Any:
        """The tiling dataclass of a point (raises ``ValueError`` if it cannot be one)."""

    @abc.abstractmethod
    def _problem(self, tiling: Any) -> str | None:
        """Why ``tiling`` does not fit the operator or the device, or None."""


class CudaConvSpace(_GpuSpace):
    """The conv template (any spatial rank) with GPU loop knobs.

    Parameters
    ----------
    out_shape
        Conv output ``N O S...``.
    in_channels_per_group, out_channels_per_group
        Channel extents of one group.
    in_channels
        All input channels (the input channel tile splits them for depthwise convs).
    kernel, strides, dilation
        Per spatial dim, of the conv as computed (a transposed conv: stride 1).
    default
        :class:`~alt_tvm.strategies.alt.conv_cuda.CudaConvTiling` JSON, the untuned choice.
    limits
        The device's per-block limits that :meth:`check` enforces.
    """

    def __init__(self, *, out_shape: Sequence[int], in_channels_per_group: int, out_channels_per_group: int,
                 in_channels: int, kernel: Sequence[int], strides: Sequence[int], dilation: Sequence[int],
                 default: dict[str, Any], limits: GpuLimits) -> None:
        self.out_shape = tuple(int(s) for s in out_shape)
        spatial = self.out_shape[2:]
        self.rank = len(spatial)
        for name, values in (("kernel", kernel), ("strides", strides), ("dilation", dilation)):
            if len(values) != self.rank:
                raise ValueError(f"CudaConvSpace: {name}={tuple(values)} needs {self.rank} entries "
                                 f"(output {self.out_shape})")
        self.kernel, self.strides, self.dilation = tuple(kernel), tuple(strides), tuple(dilation)
        self.in_channels_per_group = in_channels_per_group
        self.out_channels_per_group = out_channels_per_group
        self.limits = limits
        self._default = dict(default)
        one_per_group = out_channels_per_group == 1
        o_extent = self.out_shape[1] if one_per_group else out_channels_per_group
        i_extent = in_channels_per_group if in_channels_per_group > 1 else in_channels
        knobs = [Knob(f"s{d}", divisors(s, cap=8 if d < self.rank - 1 else 32), s) for d, s in enumerate(spatial)]
        knobs += [Knob("ot", divisors(o_extent, cap=64), o_extent), Knob("it", divisors(i_extent, cap=64), i_extent),
                  Knob("weight_ot", divisors(o_extent, cap=64), o_extent),
                  Knob("weight_it", divisors(i_extent, cap=64), i_extent)]
        self._layout = tuple(knobs)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return self._layout

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        ot, last = layout["ot"], layout[f"s{self.rank - 1}"]
        return (Knob("block_o", divisors(self.out_shape[1] // ot, cap=8)),
                Knob("tile_o", divisors(ot, cap=8)),
                Knob("tile_s", divisors(last, cap=8)),
                Knob("rc_split", divisors(self.in_channels_per_group, cap=64)),
                Knob("shared", _BOOL),
                Knob("unroll", UNROLL_STEPS),
                Knob("split_k", divisors(self.in_channels_per_group, cap=32)))

    def _tiling(self, layout: dict[str, Any], loop: dict[str, Any]) -> CudaConvTiling:
        return CudaConvTiling(spatial=tuple(layout[f"s{d}"] for d in range(self.rank)), ot=layout["ot"],
                              it=layout["it"], weight_ot=layout["weight_ot"], weight_it=layout["weight_it"],
                              block_o=loop["block_o"], tile_o=loop["tile_o"], tile_s=loop["tile_s"],
                              rc_split=loop["rc_split"], shared=bool(loop["shared"]), unroll=loop["unroll"],
                              split_k=loop["split_k"])

    def _problem(self, tiling: Any) -> str | None:
        return conv_tiling_problem(tiling, in_channels_per_group=self.in_channels_per_group,
                                   out_channels_per_group=self.out_channels_per_group, kernel=self.kernel,
                                   strides=self.strides, dilation=self.dilation, limits=self.limits)

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self._default
        layout = {f"s{k}": v for k, v in enumerate(d["spatial"])}
        layout.update(ot=d["ot"], it=d["it"], weight_ot=d.get("weight_ot") or d["ot"],
                      weight_it=d.get("weight_it") or d["it"])
        layout = _clamp(self.layout_knobs, layout)
        loop = _clamp(self.loop_knobs(layout), {**{k: d[k] for k in ("block_o", "tile_o", "tile_s", "rc_split",
                                                                     "shared", "unroll")},
                                                "split_k": d.get("split_k", 1)})
        return layout, loop

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        """``CudaConvTiling`` JSON of a point :meth:`check` accepted."""
        return self._tiling(layout, loop).to_json()


class CudaGemmSpace(_GpuSpace):
    """The GMM template (packed weight ``N/nt . K . nt``) with GPU loop knobs.

    Parameters
    ----------
    m, n, k
        Rows of the activations, columns of the weight, reduction length.
    default
        :class:`~alt_tvm.strategies.alt.conv_cuda.CudaGemmTiling` JSON, the untuned choice.
    limits
        The device's per-block limits that :meth:`check` enforces.
    """

    def __init__(self, *, m: int, n: int, k: int, default: dict[str, Any], limits: GpuLimits) -> None:
        for name, value in (("m", m), ("n", n), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CudaGemmSpace: {name} must be a positive int, got {value!r}")
        self.m, self.n, self.k = m, n, k
        self.limits = limits
        self._default = dict(default)
        self._layout = (Knob("nt", divisors(n, cap=64), n),)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return self._layout

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        return (Knob("thread_m", divisors(self.m, cap=32)), Knob("tile_m", divisors(self.m, cap=8)),
                Knob("thread_n", divisors(self.n, cap=256)), Knob("tile_n", divisors(self.n, cap=8)),
                Knob("k_split", divisors(self.k, cap=64)), Knob("shared", _BOOL), Knob("unroll", UNROLL_STEPS),
                Knob("split_k", divisors(self.k, cap=32)))

    def _tiling(self, layout: dict[str, Any], loop: dict[str, Any]) -> CudaGemmTiling:
        return CudaGemmTiling(nt=layout["nt"], thread_m=loop["thread_m"], tile_m=loop["tile_m"],
                              thread_n=loop["thread_n"], tile_n=loop["tile_n"], k_split=loop["k_split"],
                              shared=bool(loop["shared"]), unroll=loop["unroll"], split_k=loop["split_k"])

    def _problem(self, tiling: Any) -> str | None:
        return gemm_tiling_problem(tiling, m=self.m, n=self.n, k=self.k, limits=self.limits)

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self._default
        layout = _clamp(self.layout_knobs, {"nt": d["nt"]})
        loop = _clamp(self.loop_knobs(layout), {**{k: d[k] for k in ("thread_m", "tile_m", "thread_n", "tile_n",
                                                                     "k_split", "shared", "unroll")},
                                                "split_k": d.get("split_k", 1)})
        return layout, loop

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        """``CudaGemmTiling`` JSON of a point :meth:`check` accepted."""
        return self._tiling(layout, loop).to_json()
