"""What a build did: the kernels it emitted itself (:class:`Kernel`) and its
:class:`BuildReport` (strategies per partition, fallbacks, conversions, what the tuning log
changed)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from alt_tvm.deploy.profile import KernelProfile

__all__ = ["ALT_KERNEL_ATTR", "BuildReport", "Kernel"]

#: PrimFunc attribute marking kernels that alt-tvm scheduled itself (TVM's fusion and the
#: fallbacks' schedule leave them alone).
ALT_KERNEL_ATTR = "alt_tvm.kernel"


@dataclass(frozen=True)
class Kernel:
    """A kernel the build emitted itself, and what it is for.

    Attributes
    ----------
    name
        Its function name in the built module (what per-kernel timing reports). Call sites
        whose kernels are structurally equal share one function, and so one name.
    kind
        ``"partition"`` (a strategy's kernel), ``"conversion"`` (a layout conversion),
        ``"elementwise"`` (an element-wise op computed in its consumer's layout) or
        ``"operator"`` (an op without a strategy, legalized by TVM and computed in its
        operands' layouts: :mod:`alt_tvm.graph.in_layout`).
    workload
        The workload key of the partition it computes or, for a conversion, of the
        partition whose layout choice made it necessary (its consumer for an input
        conversion, its producer for a conversion back to the canonical layout); "" if none.
    detail
        For a conversion: the tensor shape and the two layouts.
    ops
        The Relax operators it computes, in program order.
    layout
        The layout of its output ("" for the canonical one).
    boundary
        For a conversion: it converts a model input or output (the user's row-major
        arrays), not a value between two kernels.
    flops
        For a partition: the FLOPs of its convolutions and matrix products
        (:func:`alt_tvm.flops.relax_flops`); None where it has none.
    """

    name: str
    kind: str
    workload: str = ""
    detail: str = ""
    ops: tuple[str, ...] = ()
    layout: str = ""
    boundary: bool = False
    flops: int | None = None


@dataclass
class BuildReport:
    """What the build did: strategies per partition, fallbacks, conversions inserted."""

    partitions: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (strategy, anchor op, ops)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)  # op -> reasons no strategy applied
    conversions: int = 0
    tuned: int = 0  # partitions built with tuned parameters
    #: workload key of every partition a strategy lowered, in program order (what tuning records key)
    workloads: list[str] = field(default_factory=list)
    #: the tuning log applied (None: built with the strategies' analytic defaults)
    log: str | None = None
    #: (workload key, why the log tuned it not) for each tunable partition built untuned
    untuned: list[tuple[str, str]] = field(default_factory=list)
    #: (workload key, why) for each tunable partition the log's in-model decision keeps at the defaults
    kept_default: list[tuple[str, str]] = field(default_factory=list)
    #: workload key -> why the strategy the log chose for it was not used
    refused: dict[str, str] = field(default_factory=dict)
    #: workload key -> the strategy the log chose for it instead of the priority rule's
    chosen_strategies: dict[str, str] = field(default_factory=dict)
    #: workload keys of fused partitions the log's decisions built as their pieces; the pieces'
    #: kernels (and the conversions their layouts cause) carry the fused workload's key
    unfused: set[str] = field(default_factory=set)
    #: workload keys of the partitions whose strategy has a tuning space, and of the operator
    #: kernels (:class:`~alt_tvm.graph.in_layout.OperatorKernel`: each has loop knobs)
    tunable: set[str] = field(default_factory=set)
    #: workload keys of the partitions built with tuned parameters and of the operator kernels
    #: built with tuned knobs
    tuned_workloads: set[str] = field(default_factory=set)
    #: kernel name -> workload key of a kernel TVM fused from ops no strategy took (its
    #: schedule's knobs are tunable as an operator kernel's)
    fused: dict[str, str] = field(default_factory=dict)
    #: workload key -> what the learned defaults (:mod:`alt_tvm.priors`) changed for it, and the
    #: decision it came from
    learned: dict[str, str] = field(default_factory=dict)
    #: every kernel the build emitted itself, in program order
    kernels: list[Kernel] = field(default_factory=list)
    #: workload key -> why its strategy failed; the partition was left to TVM's legalization
    failed: dict[str, str] = field(default_factory=dict)
    #: kernel calls that write their output over an operand they are the last use of
    #: (:mod:`alt_tvm.graph.inplace`)
    in_place: int = 0
    #: kernel name -> why a pass after lowering left that kernel as it was (the fallbacks'
    #: scheduling, the in-place rewrite): the build goes on without that pass's change to it
    left_as_is: dict[str, str] = field(default_factory=dict)

    def tuning_of(self, workload: str) -> str:
        """``"tuned"`` for a partition the log tuned (its parameters, or the strategy its in-model
        decision chose), ``"learned"`` for one the learned defaults changed, ``"default"`` for
        one with a tuning space built with the defaults, "" for one without a space (and for a
        kernel of no partition)."""
        if workload and (workload in self.tuned_workloads or workload in self.chosen_strategies
                         or workload in self.unfused):
            return "tuned"
        if workload and workload in self.learned:
            return "learned"
        return "default" if workload in self.tunable else ""

    @property
    def changed_by_log(self) -> bool:
        """Whether the log changed any kernel: a partition built with tuned parameters or
        with the strategy the log chose, or a fusion built as its pieces. False without a log,
        and where the log's in-model check kept every default (the build then emits the
        untuned build's kernels)."""
        return self.tuned > 0 or bool(self.chosen_strategies) or bool(self.tuned_operators) or bool(self.unfused)

    @property
    def timed_kernels(self) -> list[Kernel]:
        """:attr:`kernels` and the kernels TVM fused that carry a workload (kind ``"tvm"``): what
        :meth:`~alt_tvm.deploy.profile.KernelProfile.by_workload` reads to time each workload."""
        return [*self.kernels, *(Kernel(name, "tvm", key) for name, key in self.fused.items())]

    @property
    def tuned_operators(self) -> set[str]:
        """Workload keys of the operator kernels (not partitions) built with tuned knobs."""
        return self.tuned_workloads - set(self.workloads)

    def tuning_summary(self) -> str:
        """How much of the model the log tuned, and why the rest was not ("" without a log)."""
        if self.log is None:
            return ""
        total = self.tuned + len(self.untuned) + len(self.kept_default)
        line = f"{self.tuned} of {total} tunable partitions tuned from {self.log}"
        if self.kept_default:
            line += f", {len(self.kept_default)} kept at the defaults by the log's in-model decisions"
        reasons: dict[str, int] = {}
        for _, reason in self.untuned:
            reasons[reason] = reasons.get(reason, 0) + 1
        if self.tuned_operators:
            line += f"; {len(self.tuned_operators)} operator kernels with tuned loop knobs"
        lines = [line]
        if self.chosen_strategies:
            names = sorted(set(self.chosen_strategies.values()))
            lines.append(f"{len(self.chosen_strategies)} partitions lowered with the strategy the log chose "
                         f"by in-model time ({', '.join(names)})")
        if self.unfused:
            lines.append(f"{len(self.unfused)} fused workloads built as their pieces, as the log decided by "
                         f"in-model time")
        lines += [f"  {n} untuned: {reason}" for reason, n in reasons.items()]
        lines += [f"  {key.split('|')[0]}: {reason}" for key, reason in self.refused.items()]
        return "\n".join(lines)

    def summary(self, profile: KernelProfile | None = None) -> str:
        """What the build did; with a ``profile`` (:meth:`~alt_tvm.graph.compiled.CompiledModel.profile`), every layout
        conversion is listed with its measured time in the model."""
        boundary = sum(k.boundary for k in self.kernels)
        lines = [f"{len(self.partitions)} partitions ({self.tuned} tuned), {self.conversions} layout conversions"
                 + (f" ({boundary} of model inputs/outputs)" if boundary else "")]
        in_layout = sum(k.kind == "operator" for k in self.kernels)
        if in_layout:
            lines[0] += f", {in_layout} ops without a strategy computed in their operands' layouts"
        if self.in_place:
            lines[0] += f", {self.in_place} kernel calls writing over a dead operand"
        if self.log is not None:
            lines.append(self.tuning_summary())
        if self.learned:
            lines.append(f"{len(self.learned)} partitions took the learned defaults of this target (alt_tvm.priors)")
        for op, reasons in sorted(self.fallbacks.items()):
            lines.append(f"fell back to TVM's legalization: {op}" + (f" ({'; '.join(reasons)})" if reasons else ""))
        lines += [f"kernel {name} {why}" for name, why in sorted(self.left_as_is.items())]
        if profile is not None and self.conversions:
            rows = profile.conversions(self.kernels)
            total = sum(ms for *_, ms in rows)
            share = total / statistics.median(profile.totals_ms) * 100 if profile.totals_ms else 0.0
            lines.append(f"layout conversions in the model: {total:.3f} ms ({share:.1f}% of a run)")
            lines += [f"  {name}: {ms:.3f} ms for {op}: {detail}" for name, detail, op, ms in rows]
        return "\n".join(lines)
