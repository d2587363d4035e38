"""Per-kernel times of a built model, measured while the whole model runs.

A kernel timed alone runs with its weights hot in cache and its input in the layout the
benchmark chose; inside the model it runs after its producer, with whatever that left in
the caches. What users pay is the second, so tuning decisions that involve the model
(ALT paper §6: a layout is judged with the conversions it causes) are made from these
times. The Relax VM calls an instrument before and after every function it calls; the
time between the two is the kernel's (CPU kernels are synchronous).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["KernelInfo", "KernelProfile", "KernelRow", "profile_vm"]


@dataclass(frozen=True)
class KernelInfo:
    """What a kernel of a built model computes, for reading its time.

    Attributes
    ----------
    kind
        ``"partition"``, ``"conversion"`` or ``"elementwise"`` for kernels alt-tvm emitted
        (:class:`~alt_tvm.graph.report.Kernel`), ``"tvm"`` for ops TVM's legalization lowered.
    ops
        The operators it covers, in program order.
    layout
        The layout it writes its output in ("" for the canonical row-major layout).
    flops
        Floating-point operations of one call: for a partition with convolutions or matrix
        products, their multiply-adds (2 FLOPs each, :mod:`alt_tvm.flops`); otherwise TVM's
        ``estimate_tir_flops`` of its body.
    bytes
        Bytes of its arguments and result: what it must read and write at least once.
    digest
        TVM's structural hash of the kernel's TIR, in hex ("" where unknown): a kernel of two
        builds with the same name and digest is the same code, so it can serve as the noise
        control when the two builds are timed against each other.
    tuning
        For a partition's kernel: ``"tuned"`` (built from a tuning log's parameters or its
        in-model choice of strategy), ``"learned"`` (changed by the learned defaults of the
        target, :mod:`alt_tvm.priors`), ``"default"`` (its strategy has a tuning space; built
        with the defaults); "" for a kernel no tuning space covers.
    """

    kind: str
    ops: tuple[str, ...] = ()
    layout: str = ""
    flops: float = 0.0
    bytes: int = 0
    digest: str = ""
    tuning: str = ""


@dataclass(frozen=True)
class KernelRow:
    """One line of :meth:`KernelProfile.rows`: a kernel's median time in the model and its rates."""

    kernel: str
    kind: str
    ops: tuple[str, ...]
    layout: str
    ms: float
    share: float  # of the model's median run time
    gflops: float  # GFLOP/s achieved (0 when it computes nothing)
    gbytes: float  # GB/s of the minimum traffic (arguments and result once per call)
    calls: int = 1  # calls per run: ``ms`` is their sum, the rates count every call
    tuning: str = ""  # KernelInfo.tuning


@dataclass(frozen=True)
class KernelProfile:
    """Times of every function the VM called, per run of the model.

    Attributes
    ----------
    times_ms : dict of str to tuple of float
        Function name -> its time in each run (ms; summed if it is called several times
        in one run).
    totals_ms : tuple of float
        Wall time of each run (ms), instrument overhead included.
    calls : dict of str to int
        Function name -> how many times one run calls it (1 where absent). A function TVM
        shares between identical ops (ConvNeXt's layer-scale transposes, once per block) is
        timed as the sum of its calls, so its rates count every call.
    """

    times_ms: Mapping[str, tuple[float, ...]]
    totals_ms: tuple[float, ...]
    #: kernel name -> what it computes (filled by :meth:`CompiledModel.profile`)
    info: Mapping[str, KernelInfo] = field(default_factory=dict)
    calls: Mapping[str, int] = field(default_factory=dict)

    def with_info(self, info: Mapping[str, KernelInfo]) -> KernelProfile:
        """This profile, with ``info`` describing its kernels."""
        return replace(self, info=dict(info))

    def rows(self) -> list[KernelRow]:
        """Every kernel the model called, slowest first."""
        total = statistics.median(self.totals_ms) if self.totals_ms else 0.0
        rows = []
        for name in self.times_ms:
            ms = self.median(name)
            info = self.info.get(name, KernelInfo("tvm" if self.info else "", (name,)))
            calls = self.calls.get(name, 1)
            seconds = ms * 1e-3 / calls  # per call
            rows.append(KernelRow(name, info.kind, info.ops or (name,), info.layout, ms,
                                  ms / total if total else 0.0,
                                  info.flops / seconds * 1e-9 if seconds > 0 else 0.0,
                                  info.bytes / seconds * 1e-9 if seconds > 0 else 0.0, calls, info.tuning))
        return sorted(rows, key=lambda r: -r.ms)

    def tuning_shares(self) -> tuple[float, float]:
        """Shares of the kernels' time (the VM's builtins left out: allocation and shape checks,
        timed with the instrument's own cost) spent in kernels a tuning space covers, and in
        kernels built tuned (:attr:`KernelInfo.tuning`)."""
        rows = [r for r in self.rows() if not is_builtin(r.kernel)]
        total = sum(r.ms for r in rows)
        if not total:
            return 0.0, 0.0
        return (sum(r.ms for r in rows if r.tuning in ("tuned", "learned", "default")) / total,
                sum(r.ms for r in rows if r.tuning == "tuned") / total)

    def builtin_share(self) -> float:
        """Share of the model's median run time in the VM's builtins (instrument cost included)."""
        return sum(r.share for r in self.rows() if is_builtin(r.kernel))

    def table(self, *, limit: int | None = None, peak_gflops: float | None = None,
              bandwidth_gbs: float | None = None) -> str:
        """The per-kernel table as text: kernel, kind, operators, output layout, median ms,
        share of a run, GFLOP/s and GB/s; a last line sums the rows by kind.

        With the machine's measured FMA peak and memory bandwidth
        (:func:`~alt_tvm.bench.peak.measure_peak_gflops`, :func:`~alt_tvm.bench.peak.measure_memory_bandwidth`),
        a ``roof`` column gives how close each kernel is to the nearer of the two roofs:
        ``max(GFLOP/s / peak, GB/s / bandwidth)``.

        Raises
        ------
        ValueError
            If only one of ``peak_gflops`` and ``bandwidth_gbs`` is given.
        """
        if (peak_gflops is None) != (bandwidth_gbs is None):
            raise ValueError(f"the roof column needs both peak_gflops and bandwidth_gbs, got "
                             f"peak_gflops={peak_gflops!r}, bandwidth_gbs={bandwidth_gbs!r}")
        rows = self.rows()
        total = statistics.median(self.totals_ms) if self.totals_ms else 0.0
        roofs = peak_gflops is not None
        lines = [f"{'kernel':28s} {'kind':11s} {'tuning':7s} {'ms':>8s} {'share':>6s} {'GFLOP/s':>8s} {'GB/s':>6s} "
                 + (f"{'roof':>5s} " if roofs else "") + " operators / output layout"]
        for row in rows[:limit]:
            ops = "+".join(op.removeprefix("relax.").removeprefix("nn.") for op in row.ops)
            roof = f"{max(row.gflops / peak_gflops, row.gbytes / bandwidth_gbs) * 100:4.0f}% " if roofs else ""
            layout = f" -> {row.layout}" if row.layout else ""
            name = row.kernel if row.calls == 1 else f"{row.kernel[:23]} x{row.calls}"
            lines.append(f"{name[:28]:28s} {row.kind:11s} {row.tuning or '-':7s} {row.ms:8.3f} {row.share * 100:5.1f}% "
                         f"{row.gflops:8.1f} {row.gbytes:6.1f} {roof} {ops}{layout}")
        if limit is not None and len(rows) > limit:
            rest = rows[limit:]
            lines.append(f"... {len(rest)} more kernels: {sum(r.ms for r in rest):.3f} ms")
        kinds: dict[str, float] = {}
        for row in rows:
            kinds[row.kind] = kinds.get(row.kind, 0.0) + row.ms
        lines.append(f"model {total:.3f} ms per run; " + ", ".join(
            f"{kind or 'kernels'} {ms:.3f} ms ({sum(r.kind == kind for r in rows)})" for kind, ms in kinds.items()))
        if any(r.tuning for r in rows):
            space, tuned = self.tuning_shares()
            lines.append(f"in kernels with a tuning space: {space * 100:.1f}% of the kernels' time (tuned: "
                         f"{tuned * 100:.1f}%); VM builtins {self.builtin_share() * 100:.1f}% of a run")
        return "\n".join(lines)

    def median(self, name: str) -> float:
        """Median time (ms) of kernel ``name`` per run; 0.0 if the model never called it."""
        samples = self.times_ms.get(name)
        return statistics.median(samples) if samples else 0.0

    def per_run(self, names: Sequence[str]) -> tuple[float, ...]:
        """The summed time of ``names`` in each run (ms)."""
        runs = len(self.totals_ms)
        return tuple(sum(self.times_ms[n][r] for n in names if n in self.times_ms) for r in range(runs))

    def by_workload(self, kernels: Sequence, *, conversions: bool = True) -> dict[str, tuple[float, ...]]:
        """Per-run time of each workload's kernels in the model (ms), from a build's ``report.kernels``.

        With ``conversions``, the layout conversions a workload's layout choice caused
        (:class:`~alt_tvm.graph.report.Kernel`'s ``workload``) count towards it: a layout
        that needs a conversion pays for it. A function that several call sites share (the
        build emits structurally equal kernels once) counts per call: each call site takes
        ``1 / calls`` of its time.
        """
        runs = len(self.totals_ms)
        per_workload: dict[str, list[float]] = {}
        for kernel in kernels:
            if kernel.workload and (kernel.kind != "conversion" or conversions):
                share = self.per_call(kernel.name)
                total = per_workload.setdefault(kernel.workload, [0.0] * runs)
                for r in range(runs):
                    total[r] += share[r]
        return {key: tuple(times) for key, times in per_workload.items()}

    def per_call(self, name: str) -> tuple[float, ...]:
        """Kernel ``name``'s time in each run divided by its calls per run (ms): one call site's share."""
        calls = self.calls.get(name, 1)
        return tuple(t / calls for t in self.per_run([name]))

    def conversions(self, kernels: Sequence) -> list[tuple[str, str, str, float]]:
        """(kernel, detail, workload's op, median ms of one call) of every layout conversion, in program order."""
        return [(k.name, k.detail, k.workload.split("|")[0] or "-", statistics.median(self.per_call(k.name)))
                for k in kernels if k.kind == "conversion"]


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of the Relax VM's builtins (``vm.builtin.alloc_tensor`` ...), not a kernel."""
    return name.startswith("vm.builtin.")


def profile_vm(vm: Any, args: Sequence, *, repeat: int = 5, warmup: int = 1,
               func_name: str = "main", sync: Callable[[], Any] | None = None) -> KernelProfile:
    """Run ``vm[func_name](*args)`` ``warmup + repeat`` times and time every call it makes.

    ``sync`` waits for the device (a GPU's ``device.sync``): it is called before each clock
    read, so an asynchronous kernel launch is timed to its end.

    The instrument stays installed on ``vm`` (a :class:`~alt_tvm.deploy.runtime.VirtualMachine`
    or TVM's ``relax.VirtualMachine``): give it a VM of its own (one per executable costs little).

    Raises
    ------
    ValueError
        If ``repeat < 1`` or ``warmup < 0``.
    """
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int >= 1, got {repeat!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    started: dict[str, float] = {}
    current: dict[str, float] = {}
    calls: dict[str, int] = {}

    def instrument(func, symbol, before_run, ret_value, *call_args) -> int:
        if sync is not None:
            sync()
        now = time.perf_counter()
        if before_run:
            started[symbol] = now
        else:
            current[symbol] = current.get(symbol, 0.0) + (now - started.pop(symbol, now)) * 1e3
            calls[symbol] = calls.get(symbol, 0) + 1
        return 0  # VMInstrumentReturnKind.kNoOp: run the call as usual

    vm.set_instrument(instrument)
    function = vm[func_name]
    for _ in range(warmup):
        function(*args)
    runs: list[dict[str, float]] = []
    totals = []
    for _ in range(repeat):
        current.clear()
        calls.clear()
        begin = time.perf_counter()
        function(*args)
        if sync is not None:
            sync()
        totals.append((time.perf_counter() - begin) * 1e3)
        runs.append(dict(current))
    names = {name for run in runs for name in run}
    times = {name: tuple(run.get(name, 0.0) for run in runs) for name in sorted(names)}
    return KernelProfile(times, tuple(totals), calls={name: count for name, count in calls.items() if count > 1})
