"""The ALT paper's §7.1 single-operator suite: its configurations and its timing harness.

Nine operator families (C2D, GRP, DEP, DIL, C3D, C1D, GMM, T2D, T3D), drawn with a fixed seed
(:func:`draw_configs`); one :class:`Row` of measurements per configuration; a runner that
fails is recorded (:func:`attempt`) and the others go on. Every runner of a configuration is
timed in interleaved rounds (:func:`interleaved_medians`, on :func:`~.timing.run_interleaved`),
each turn one untimed call, then samples of enough calls to last a few milliseconds
(:func:`calibrated`); the median over rounds is reported. :func:`report` prints the tables.
The benchmark that tunes and builds each runner is ``benchmarks/bench_ops.py``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .timing import run_interleaved, time_callable

__all__ = ["FAMILIES", "RUNNERS", "STAGES", "Interleaved", "OpConfig", "Row", "Timed", "attempt", "calibrated",
           "canonical_kernel", "check_result", "draw_configs", "failure_message", "flops", "geomean",
           "interleaved_medians", "out_spatial", "plan_calls", "read_runs", "rel_error", "report", "time_row",
           "timing_line", "torch_module", "torch_timed", "tvm_timed"]


FAMILIES = ("C2D", "GRP", "DEP", "DIL", "C3D", "C1D", "GMM", "T2D", "T3D")


@dataclass(frozen=True)
class OpConfig:
    """One operator configuration: ``family`` and its shape parameters."""

    family: str
    batch: int
    in_channels: int
    out_channels: int
    spatial: tuple[int, ...]  # input spatial extents; GMM: (M,) rows, in_channels = K, out_channels = N
    kernel: int = 1
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1

    @property
    def rank(self) -> int:
        return len(self.spatial)

    def describe(self) -> str:
        if self.family == "GMM":
            return f"M={self.batch * self.spatial[0]} K={self.in_channels} N={self.out_channels}"
        size = "x".join(map(str, self.spatial))
        extra = "".join([f" s{self.stride}" if self.stride > 1 else "", f" d{self.dilation}" if self.dilation > 1
                         else "", f" g{self.groups}" if self.groups > 1 else ""])
        return f"b{self.batch} {self.in_channels}->{self.out_channels} {size} k{self.kernel} p{self.padding}{extra}"


def out_spatial(cfg: OpConfig) -> tuple[int, ...]:
    k_eff = cfg.dilation * (cfg.kernel - 1) + 1
    if cfg.family in ("T2D", "T3D"):
        return tuple((s - 1) * cfg.stride - 2 * cfg.padding + k_eff for s in cfg.spatial)
    return tuple((s + 2 * cfg.padding - k_eff) // cfg.stride + 1 for s in cfg.spatial)


def flops(cfg: OpConfig) -> float:
    if cfg.family == "GMM":
        return 2.0 * cfg.batch * cfg.spatial[0] * cfg.in_channels * cfg.out_channels
    if cfg.family in ("T2D", "T3D"):  # every input point scatters into a kernel window
        points = cfg.batch * math.prod(cfg.spatial)
        return 2.0 * points * cfg.in_channels * (cfg.out_channels // cfg.groups) * cfg.kernel ** cfg.rank
    points = cfg.batch * math.prod(out_spatial(cfg))
    return 2.0 * points * cfg.out_channels * (cfg.in_channels // cfg.groups) * cfg.kernel ** cfg.rank


def draw_configs(*, families, per_family: int, seed: int) -> list[OpConfig]:
    """``per_family`` configurations per family, drawn reproducibly, 5 MFLOP .. 1.5 GFLOP each."""
    import numpy as np

    configs = []
    for family in families:
        # One generator per family: a family's configurations do not depend on which others run.
        rng = np.random.default_rng([seed, FAMILIES.index(family)])
        pick = lambda xs, rng=rng: xs[int(rng.integers(len(xs)))]  # noqa: E731
        found = 0
        while found < per_family:
            batch = pick([1, 1, 2])
            cin, cout = pick([3, 16, 32, 64, 128, 256]), pick([16, 32, 64, 128, 256])
            if family in ("C2D", "DIL", "GRP"):
                kernel = pick([1, 3, 3, 5]) if family == "C2D" else 3
                size = pick([7, 14, 28, 56])
                stride = pick([1, 1, 2]) if family != "DIL" else 1
                dilation = 2 if family == "DIL" else 1
                groups = pick([2, 4, 8]) if family == "GRP" else 1
                if family == "GRP":
                    cin, cout = pick([32, 64, 128, 256]), pick([32, 64, 128, 256])
                cfg = OpConfig(family, batch, cin, cout, (size, size), kernel, stride,
                               dilation * (kernel // 2), dilation, groups)
            elif family == "DEP":
                channels, kernel = pick([32, 64, 96, 144, 256, 512]), pick([3, 3, 5])
                size = pick([7, 14, 28, 56, 112])
                cfg = OpConfig(family, batch, channels, channels, (size, size), kernel, pick([1, 1, 2]),
                               kernel // 2, 1, channels)
            elif family == "C3D":
                kernel, size, depth = 3, pick([14, 28, 56]), pick([4, 8, 16])
                cfg = OpConfig(family, batch, pick([3, 16, 32, 64]), pick([16, 32, 64]), (depth, size, size),
                               kernel, pick([1, 1, 2]), 1)
            elif family == "C1D":
                kernel = pick([3, 5, 7])
                cfg = OpConfig(family, batch, cin, cout, (pick([64, 128, 256, 512, 1024]),), kernel,
                               pick([1, 1, 2]), kernel // 2)
            elif family == "GMM":
                cfg = OpConfig(family, 1, pick([256, 512, 768, 1024]), pick([256, 512, 768, 1024]),
                               (pick([1, 16, 64, 128, 256]),))
            elif family == "T2D":
                cfg = OpConfig(family, batch, pick([16, 32, 64, 128]), pick([16, 32, 64]),
                               (pick([7, 14, 28]),) * 2, pick([3, 4]), 2, 1)
            elif family == "T3D":
                cfg = OpConfig(family, batch, pick([16, 32, 64]), pick([16, 32]),
                               (pick([4, 8]), pick([7, 14]), pick([7, 14])), pick([3, 4]), 2, 1)
            else:
                raise SystemExit(f"unknown family {family!r}; choose from {list(FAMILIES)}")
            if family == "GRP" and (cfg.in_channels % cfg.groups or cfg.out_channels % cfg.groups):
                continue
            if 5e6 <= flops(cfg) <= 1.5e9 and min(out_spatial(cfg)) >= 1 and cfg not in configs:
                configs.append(cfg)
                found += 1
    return configs


def torch_module(cfg: OpConfig, seed: int):
    """The one-operator PyTorch model and its input."""
    import torch

    torch.manual_seed(seed)
    kw = dict(kernel_size=cfg.kernel, stride=cfg.stride, padding=cfg.padding, dilation=cfg.dilation,
              groups=cfg.groups, bias=False)
    if cfg.family == "GMM":
        module = torch.nn.Linear(cfg.in_channels, cfg.out_channels, bias=False)
        x = torch.randn(cfg.batch * cfg.spatial[0], cfg.in_channels)
    else:
        cls = {"C1D": torch.nn.Conv1d, "C3D": torch.nn.Conv3d, "T2D": torch.nn.ConvTranspose2d,
               "T3D": torch.nn.ConvTranspose3d}.get(cfg.family, torch.nn.Conv2d)
        module = cls(cfg.in_channels, cfg.out_channels, **kw)
        x = torch.randn(cfg.batch, cfg.in_channels, *cfg.spatial)
    return module.eval(), x


def canonical_kernel(cfg: OpConfig, weight_shape, *, channels_last: bool):
    """The operator as TVM users write it (``alt_tvm.ops``), NCHW-style or channels-last."""
    from tvm import te

    from alt_tvm import ops
    from alt_tvm.layout import create_prim_func
    from alt_tvm.layout.templates import channels_last as cl
    from alt_tvm.layout.templates import weight_channels_last

    if cfg.family == "GMM":
        data = te.placeholder((cfg.batch * cfg.spatial[0], cfg.in_channels), name="data")
        weight = te.placeholder(tuple(weight_shape), name="weight")
        out = ops.dense(data, weight)
        return create_prim_func([data, weight, out], layouts={}), {}
    data = te.placeholder((cfg.batch, cfg.in_channels, *cfg.spatial), name="data")
    weight = te.placeholder(tuple(weight_shape), name="weight")
    kw = dict(stride=cfg.stride, padding=cfg.padding, dilation=cfg.dilation, groups=cfg.groups)
    fn = {"C1D": ops.conv1d, "C3D": ops.conv3d, "T2D": ops.conv_transpose2d,
          "T3D": ops.conv_transpose3d}.get(cfg.family, ops.conv2d)
    out = fn(data, weight, **kw)
    if not channels_last:
        return create_prim_func([data, weight, out], layouts={}), {}
    shape = lambda t: tuple(int(s) for s in t.shape)  # noqa: E731
    layouts = {data: cl(shape(data)), out: cl(shape(out)), weight: weight_channels_last(shape(weight))}
    source = out.op.input_tensors[0]  # the pad / dilate stage between data and the window reads
    if isinstance(source.op, te.ComputeOp):
        layouts[source] = cl(shape(source))
    return create_prim_func([data, weight, out], layouts=layouts), {"data": layouts[data], "weight": layouts[weight],
                                                                     "out": layouts[out]}


#: Every runner a configuration is timed with: its label (JSON, failures) and its name in the output.
RUNNERS = {
    "torch": "PyTorch",
    "tvm_untuned": "TVM untuned",
    "ms_nchw": "MetaSchedule (nchw)",
    "ms_nhwc": "MetaSchedule (nhwc)",
    "alt_default": "alt-tvm default schedule",
    "alt_kernel": "alt-tvm tuned kernel",
    "alt_model": "alt-tvm model (with conversions)",
}
#: Stages whose failure leaves several runners without a kernel.
STAGES = {"alt": "alt-tvm (tune, build, check)"}
_STAGE_OF = {"alt_default": "alt", "alt_kernel": "alt", "alt_model": "alt"}
MESSAGE_CHARS = 200

#: ``timed(number, repeat)``: the median over ``repeat`` samples of the mean latency (ms) of ``number`` calls.
Timed = Callable[[int, int], float]


@dataclass
class Row:
    """One configuration's measurements (ms), tuning wall times (s) and failed runners."""

    config: OpConfig
    gflop: float
    torch_ms: float = math.nan
    tvm_untuned_ms: float = math.nan
    ms_ms: dict = field(default_factory=dict)  # layout -> best kernel ms
    ms_tune_s: dict = field(default_factory=dict)
    alt_kernel_ms: float = math.nan
    alt_default_ms: float = math.nan
    alt_model_ms: float = math.nan
    alt_tune_s: float = math.nan
    alt_params: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)  # anything not tied to one runner
    failures: dict = field(default_factory=dict)  # runner or stage label -> "Type: first line of the error"
    skipped: list = field(default_factory=list)  # runner labels not run on request (e.g. --skip-ms)
    round_ms: dict = field(default_factory=dict)  # runner label -> its latency in each timing round

    @property
    def ms_best_ms(self) -> float:
        good = [v for v in self.ms_ms.values() if math.isfinite(v)]
        return min(good) if good else math.nan

    def get_ms(self, label: str) -> float:
        """The latency of runner ``label`` (``"ms"``: MetaSchedule's best layout), NaN if none."""
        if label == "ms":
            return self.ms_best_ms
        if label.startswith("ms_"):
            return float(self.ms_ms.get(label[3:], math.nan))
        return float(getattr(self, f"{label}_ms"))

    def set_ms(self, label: str, value: float) -> None:
        if label.startswith("ms_"):
            self.ms_ms[label[3:]] = value
        else:
            setattr(self, f"{label}_ms", value)

    def outcome(self, label: str) -> float | str:
        """Runner ``label``'s latency, or why there is none: ``"failed"``, ``"skipped"`` or ``"n/a"``."""
        value = self.get_ms(label)
        if math.isfinite(value):
            return value
        failed = label in self.failures or _STAGE_OF.get(label) in self.failures
        if label == "ms":  # every requested layout failed
            failed = any(key.startswith("ms_") for key in self.failures)
        if failed:
            return "failed"
        if label in self.skipped or (label == "ms" and any(key.startswith("ms_") for key in self.skipped)):
            return "skipped"
        return "n/a"  # e.g. a row of an older JSON file


def failure_message(err: BaseException, *, limit: int = MESSAGE_CHARS) -> str:
    """``"Type: first line of the message"``, cut to ``limit`` characters.

    Parameters
    ----------
    err : BaseException
        The error a runner's setup or timing raised.
    limit : int
        Longest message returned; a cut one ends with ``"..."``.

    Returns
    -------
    str
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def attempt(row: Row, label: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or None with the error recorded as ``row.failures[label]``.

    Parameters
    ----------
    row : Row
    label : str
        A key of :data:`RUNNERS` or :data:`STAGES`.
    fn : callable
        Sets one runner (or stage) up, e.g. tunes and checks it.

    Returns
    -------
    object or None
        What ``fn`` returned; None if it raised (the run goes on with the other runners).
    """
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - any baseline's failure is reported, not fatal
        row.failures[label] = failure_message(err)
        print(f"    ! {RUNNERS.get(label) or STAGES.get(label, label)} failed: {row.failures[label]}", flush=True)
        return None


def plan_calls(*, call_ms: float, repeat: int, min_sample_ms: float = 5.0,
               max_round_ms: float = 2000.0) -> tuple[int, int]:
    """``(number, repeat)`` for one runner's turn in a round, the same rule for every runner.

    Parameters
    ----------
    call_ms : float
        Latency of one call (from an untimed warm-up call).
    repeat : int
        Samples wanted per round.
    min_sample_ms : float
        A sample averages enough calls to last this long (timer resolution, call overhead).
    max_round_ms : float
        Slow kernels (e.g. TVM's untuned build) take fewer samples, at least 3, to stay
        within this per round.

    Returns
    -------
    tuple of int
        Calls per sample and samples per round.
    """
    call_ms = max(call_ms, 1e-6)
    number = max(1, math.ceil(min_sample_ms / call_ms))
    fits = int(max_round_ms // (number * call_ms))
    return number, max(min(repeat, 3), min(repeat, fits))


def calibrated(timed: Timed, *, repeat: int, min_sample_ms: float = 5.0,
               max_round_ms: float = 2000.0) -> Callable[[], float]:
    """A runner for :func:`interleaved_medians`: one untimed call, then ``timed`` per :func:`plan_calls`.

    Parameters
    ----------
    timed : callable
        ``timed(number, repeat)`` -> median ms per call.
    repeat, min_sample_ms, max_round_ms
        As in :func:`plan_calls`; the plan is fixed at the first turn.

    Returns
    -------
    callable
        No arguments; the median latency (ms) of this turn's samples.
    """
    plan: list[tuple[int, int]] = []

    def run() -> float:
        start = time.perf_counter()
        timed(1, 1)  # warm-up: caches and this runtime's threads, after the previous runner's turn
        if not plan:
            call_ms = (time.perf_counter() - start) * 1e3
            plan.append(plan_calls(call_ms=call_ms, repeat=repeat, min_sample_ms=min_sample_ms,
                                   max_round_ms=max_round_ms))
        return timed(*plan[0])
    return run


@dataclass
class Interleaved:
    """What :func:`interleaved_medians` measured: per-runner medians, round values and errors."""

    medians: dict[str, float]
    rounds: dict[str, list[float]]
    failures: dict[str, str]
    order: list[list[str]]  # the runners in the order each round timed them


def interleaved_medians(runners: Mapping[str, Callable[[], float]], *, rounds: int,
                        pause_s: float = 0.0) -> Interleaved:
    """Time every runner once per round, for ``rounds`` rounds, and take each runner's median.

    A different runner goes first each round and each follows every other equally often
    (:func:`~.timing.round_order`), and load drifting during the run affects all of them alike.

    Parameters
    ----------
    runners : mapping of str to callable
        ``label -> run()``; ``run()`` returns a latency (ms).
    rounds : int
        Rounds (>= 1).
    pause_s : float
        Sleep before each turn, so the previous runtime's idle threads stop spinning.

    Returns
    -------
    Interleaved
        A runner that raises is dropped from later rounds; its error is in ``failures``
        and it has no median.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    labels = list(runners)
    failures: dict[str, str] = {}
    order: list[list[str]] = [[] for _ in range(rounds)]
    turns = dict.fromkeys(labels, 0)  # each runner's turns so far: the round it is in

    def turn(i: int) -> float | None:
        label = labels[i]
        r, turns[label] = turns[label], turns[label] + 1
        if label in failures:  # dropped from the rounds after it failed
            return None
        order[r].append(label)
        if pause_s > 0:
            time.sleep(pause_s)
        try:
            return float(runners[label]())
        except Exception as err:  # noqa: BLE001 - reported with the runner, the others go on
            failures[label] = failure_message(err)
            return None

    samples = run_interleaved(len(labels), rounds=rounds, run=turn) if labels else []
    values = {label: [v for v in got if v is not None] for label, got in zip(labels, samples)}
    medians = {label: statistics.median(v) for label, v in values.items() if v and label not in failures}
    return Interleaved(medians, {k: v for k, v in values.items() if v}, failures, order)


def time_row(row: Row, runners: Mapping[str, Callable[[], float]], *, rounds: int, pause_s: float = 0.0) -> None:
    """Time ``runners`` interleaved (:func:`interleaved_medians`) and store the medians and failures in ``row``."""
    result = interleaved_medians(runners, rounds=rounds, pause_s=pause_s)
    for label, value in result.medians.items():
        row.set_ms(label, value)
    for label, message in result.failures.items():
        row.failures[label] = f"while timing: {message}"
        print(f"    ! {RUNNERS.get(label, label)} failed while timing: {message}", flush=True)
    row.round_ms.update(result.rounds)


def geomean(values) -> float:
    values = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def timing_line(*, threads: int, cores: int, rounds: int, repeat: int, pause_s: float) -> str:
    """How every runtime of this run is timed, printed before the measurements."""
    cores_note = "the target's cores" if threads == cores else f"--threads; the target has {cores} cores"
    return (f"timing: {threads} thread(s) for every runtime ({cores_note}): TVM_NUM_THREADS={threads} (alt-tvm, "
            f"MetaSchedule, TVM untuned), torch.set_num_threads({threads}); ONNX Runtime is not used. "
            f"{rounds} interleaved rounds, each runner first once and after every other equally often; each turn: "
            f"{pause_s * 1e3:.0f} ms pause, one untimed call, then up to {repeat} samples (at least 3, fewer only "
            f"if over 2 s) of enough calls for >= 5 ms each; a round's value is the median sample, the table the "
            f"median over rounds. TVM kernels are timed by time_evaluator, PyTorch by perf_counter around its "
            f"Python calls. GFLOP/s are reported against the FP32 FMA peak (alt_tvm.bench.measure_peak_gflops, "
            f"{threads} thread(s)) measured at the start and after every configuration, the best of them.")


def rel_error(got, want) -> float:
    import numpy as np

    return float(np.abs(got - want).max() / max(1e-6, float(np.abs(want).max())))


def check_result(got, want, what: str) -> None:
    """Raise if ``got`` is not PyTorch's result: a wrong kernel is a failed baseline, not a timing."""
    error = rel_error(got, want)
    if not error <= 1e-3:
        raise RuntimeError(f"{what} differs from PyTorch: relative error {error:.2e}")


def torch_timed(module, x, *, threads: int) -> Timed:
    """PyTorch's eager call, inference mode, ``threads`` intra-op threads (reset if changed)."""
    import torch

    def timed(number: int, repeat: int) -> float:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        with torch.inference_mode():
            calls = lambda: [module(x) for _ in range(number)]  # noqa: E731
            return time_callable(calls, [], warmup=0, repeat=repeat)[1] / number
    return timed


def tvm_timed(module, args_nd) -> Timed:
    """A compiled TVM kernel's ``main`` through ``time_evaluator``."""
    import numpy as np
    import tvm

    def timed(number: int, repeat: int) -> float:
        evaluator = module.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)
        return float(np.median(evaluator(*args_nd).results) * 1e3)
    return timed


def fmt(value: float | str, spec: str) -> str:
    """A number, or the word that says why there is none (never a bare ``nan``)."""
    if isinstance(value, str):
        return value
    return format(value, spec) if math.isfinite(value) else "-"


def ratio(row: Row, num: str, den: str) -> float:
    return row.get_ms(num) / row.get_ms(den)


COLUMNS = (("torch", "torch"), ("tvm-unt", "tvm_untuned"), ("MS", "ms"), ("alt-def", "alt_default"),
            ("alt", "alt_kernel"), ("alt+cvt", "alt_model"))


def report(rows: Sequence[Row], *, trials: int, threads: int, peak: float, ms_import_s: float) -> None:
    """Latency table (ms), throughput table (GFLOP/s, % of peak), failures, speedups, tuning time."""
    print("\nlatency (ms, median of the interleaved rounds); failed = see the list below, - = ratio undefined")
    print(f"{'family':6} {'configuration':38} {'GFLOP':>7} " + " ".join(f"{name:>9}" for name, _ in COLUMNS)
          + f" {'vsMS':>6} {'vsTorch':>7}")
    for r in rows:
        print(f"{r.config.family:6} {r.config.describe()[:38]:38} {r.gflop:7.3f} "
              + " ".join(f"{fmt(r.outcome(label), '.3f'):>9}" for _, label in COLUMNS)
              + f" {fmt(ratio(r, 'ms', 'alt_kernel'), '.2f'):>6} {fmt(ratio(r, 'torch', 'alt_kernel'), '.2f'):>7}")

    print(f"\nthroughput: GFLOP/s (% of the {peak:.0f} GFLOP/s FP32 FMA peak measured with {threads} thread(s))")
    print(f"{'family':6} {'configuration':38} " + " ".join(f"{name:>12}" for name, _ in COLUMNS))
    for r in rows:
        cells = []
        for _, label in COLUMNS:
            value = r.outcome(label)
            if isinstance(value, str):
                cells.append(f"{value:>12}")
            else:
                rate = r.gflop / (value / 1e3)
                cells.append(f"{rate:7.1f} ({100 * rate / peak:2.0f}%)" if math.isfinite(peak) and peak > 0
                             else f"{rate:12.1f}")
        print(f"{r.config.family:6} {r.config.describe()[:38]:38} " + " ".join(cells))

    notes = [(r, label, message) for r in rows for label, message in r.failures.items()]
    notes += [(r, "", error) for r in rows for error in r.errors]
    if notes:
        print("\nfailed:")
        for n, (r, label, message) in enumerate(notes, 1):
            who = RUNNERS.get(label) or STAGES.get(label) or "note"
            print(f"  [{n}] {who} on {r.config.family} {r.config.describe()}: {message}")

    print(f"\ngeometric-mean speedup of alt-tvm (tuned kernel) — {trials} trials each, {threads} threads, "
          f"measured peak {peak:.0f} GFLOP/s (failed runners left out)")
    print(f"{'family':8} {'vs MS':>7} {'vs torch':>9} {'vs TVM-untuned':>15} {'vs alt-default':>15} "
          f"{'vs MS (incl. cvt)':>18}")
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.config.family, []).append(r)
    groups["overall"] = rows
    for name, group in groups.items():
        speedups = [geomean([ratio(r, num, den) for r in group]) for num, den in (
            ("ms", "alt_kernel"), ("torch", "alt_kernel"), ("tvm_untuned", "alt_kernel"),
            ("alt_default", "alt_kernel"), ("ms", "alt_model"))]
        print(f"{name:8} {fmt(speedups[0], '.2f'):>7} {fmt(speedups[1], '.2f'):>9} {fmt(speedups[2], '.1f'):>15} "
              f"{fmt(speedups[3], '.2f'):>15} {fmt(speedups[4], '.2f'):>18}")
    alt_s = sum(r.alt_tune_s for r in rows if math.isfinite(r.alt_tune_s))
    ms_s = sum(sum(r.ms_tune_s.values()) for r in rows)
    print(f"\ntuning wall time: alt-tvm {alt_s:.0f} s, MetaSchedule {ms_s:.0f} s "
          f"(+ {ms_import_s:.0f} s one-time intrinsic import)")


def read_runs(paths: Sequence[str]) -> tuple[dict[str, Any], list[Row]]:
    """The rows of earlier runs' JSON files, merged (a later file's row replaces an earlier row
    of the same configuration), and the first run's facts."""
    merged: dict = {}
    meta: dict[str, Any] | None = None
    for path in paths:
        with open(path) as fh:
            run = json.load(fh)
        if isinstance(run, dict) and "suite" in run and "results" in run:  # written by write_results
            run = run["results"]
        meta = meta or run
        for raw in run["rows"]:
            cfg = dict(raw["config"])
            cfg["spatial"] = tuple(cfg["spatial"])
            raw = {k: v for k, v in raw.items() if k not in ("config", "ms_best_ms")}
            row = Row(OpConfig(**cfg), **raw)
            merged[row.config] = row
    if meta is None:
        raise ValueError("no results file given")
    return meta, list(merged.values())
