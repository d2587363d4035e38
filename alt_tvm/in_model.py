"""Tuning decisions made in the whole model: each workload's finalists, its default and the
other applicable strategies are timed inside the built model, and the model is verified.

A kernel that wins alone can lose in the model: alone, its weights stay hot in cache
between timed calls and its input comes in the layout the benchmark chose; in the model
it runs after its producer and may need a layout conversion (ALT paper §6 judges a layout
with the conversions it causes). So after the search (:mod:`alt_tvm.tuning`), each
workload's candidates are timed where they will run:

1. *Variants*: build ``k`` copies of the model, copy ``v`` lowering every workload with
   its ``v``-th candidate (copy 0: every workload at its defaults, i.e. the untuned
   model), so ``k`` builds time the candidates of all workloads at once. A workload's
   candidates are its defaults, the search's best candidates measured faster than the
   defaults alone, and the defaults of the other exact strategies that apply, in that order,
   the first ``k``; ``k`` is one batch of parallel builds unless set
   (:attr:`~alt_tvm.options.InModelConfig.copies`), since the builds are the stage's cost.
   A fused workload (a block, a GEMM with its layer norm) also has its pieces as a
   candidate, after its best finalist: the copy is partitioned without that fusion, and
   the pieces' kernels are timed as the fused workload.
2. Run the copies in interleaved rounds with per-kernel timing
   (:meth:`alt_tvm.deploy.model.RunnableModel.profile`); a workload's time in a copy is
   its kernels' plus the layout conversions its layout choice caused.
3. Per workload, keep the candidate whose time, paired round by round with the default's,
   is lowest, if it beats the default by more than ``margin``; else the defaults.
4. Build the model with those choices, and where they switch a strategy the same without
   the switches, in one batch; profile the choices against the untuned model: a choice
   whose kernels no longer gain there goes back to the defaults (the layout a producer now
   writes changes what its consumer pays), and a model it changed is built again. Then
   time whole models, interleaved: the untuned one, the choices, and the choices without
   strategy switches; the fastest is kept if it beats the untuned model by more than
   ``margin``, else every workload goes back to its defaults.

The choices are appended to the log as *decision* records (:func:`alt_tvm.records.is_decision`)
which ``alt_tvm.build(records=...)`` applies, strategy included, and the whole-model times
as a *model check* record. This module depends on the build and the records; nothing but
:mod:`alt_tvm.integration` depends on it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alt_tvm.bench.timing import run_interleaved
from alt_tvm.deploy.model import RunnableModel, aligned, seeded_inputs
from alt_tvm.deploy.profile import KernelProfile
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.partition import strategy_named
from alt_tvm.graph.variants import BuiltVariant, VariantBuilder
from alt_tvm.options import BuildOptions, InModelConfig, build_options
from alt_tvm.records import (
    RecordWriter,
    TunedLog,
    TuningRecord,
    candidate_key,
    iter_records,
    rank_candidates,
    target_key,
    tvm_version,
)
from alt_tvm.strategies import registry
from alt_tvm.target import HardwareTarget

__all__ = ["Choice", "InModelConfig", "InModelResult", "WorkloadDecision", "decide_in_model", "model_inputs",
           "choices_log", "profile_rounds", "untuned_times"]

logger = logging.getLogger(__name__)

#: ``profile(model, arrays) -> KernelProfile``: how a built copy is timed per kernel (one round).
Profiler = Callable[[RunnableModel, Sequence[np.ndarray]], KernelProfile]
#: ``time(model, arrays) -> ms``: how a whole built model is timed (one round).
ModelTimer = Callable[[RunnableModel, Sequence[np.ndarray]], float]


@dataclass(frozen=True)
class Choice:
    """One way to lower a workload: a strategy and its parameters (None: its defaults); a
    fused workload with ``fused`` false is built as its pieces, each at its defaults."""

    strategy: str
    params: Mapping[str, Any] | None
    label: str
    fused: bool = True


@dataclass
class WorkloadDecision:
    """What the model said about one workload.

    Attributes
    ----------
    key
        The workload key.
    choice
        What it is built with from now on.
    times_ms
        Median time in the model of every candidate timed (label -> ms, conversions it
        caused included).
    ratio
        Median over rounds of the choice's time over the default's (1.0 for the default).
    reason
        Why (written into the decision record).
    """

    key: str
    choice: Choice
    times_ms: dict[str, float]
    ratio: float
    reason: str
    samples_ms: tuple[float, ...] = ()


@dataclass
class InModelResult:
    """The decisions and the whole-model check (:func:`decide_in_model`)."""

    decisions: list[WorkloadDecision]
    untuned_ms: float
    tuned_ms: float
    #: whether the choices were kept (False: the tuned model was not faster, all reverted)
    kept: bool
    builds: int = 0
    seconds: float = 0.0
    untuned_samples: tuple[float, ...] = field(default=(), repr=False)
    tuned_samples: tuple[float, ...] = field(default=(), repr=False)

    @property
    def paired_ratio(self) -> float:
        """Tuned over untuned whole-model time: the median of the per-round ratios, which the
        check decides on (on a noisy host it can differ from the ratio of the medians)."""
        if self.tuned_samples and self.untuned_samples:
            return _paired_ratio(self.tuned_samples, self.untuned_samples)
        return self.tuned_ms / self.untuned_ms if self.untuned_ms > 0 else math.nan

    @property
    def speedup(self) -> float:
        """Untuned over tuned whole-model time (as built from the log from now on)."""
        return 1.0 / self.paired_ratio if self.kept else 1.0

    def summary(self) -> str:
        """Lines for people: the whole-model times and each workload's decision."""
        changed = [d for d in self.decisions if d.choice.label != "default"]
        verdict = "kept" if self.kept else "reverted to the defaults (not faster)"
        lines = [f"in-model verification: untuned {self.untuned_ms:.3f} ms, tuned {self.tuned_ms:.3f} ms "
                 f"(medians; tuned / untuned per round {self.paired_ratio:.3f}) -> {verdict}; "
                 f"{len(changed)} of {len(self.decisions)} workloads changed ({self.builds} builds, "
                 f"{self.seconds:.0f} s)"]
        for d in self.decisions:
            times = ", ".join(f"{label} {ms:.3f}" for label, ms in d.times_ms.items())
            lines.append(f"  {d.key.split('|')[0]}: {d.choice.label} ({times} ms in the model)")
        return "\n".join(lines)


def model_inputs(model: RunnableModel, *, seed: int = 0,
                 example_inputs: Sequence[Any] | None = None) -> list[np.ndarray]:
    """Inputs to time ``model`` on: ``example_inputs`` as arrays, else :func:`seeded_inputs` of
    its shapes; :func:`aligned`, so every build reads them in place."""
    if example_inputs is not None:
        return [aligned(x.detach().numpy() if hasattr(x, "detach") else x) for x in example_inputs]
    return seeded_inputs(shapes=model.input_shapes, dtypes=model.input_dtypes, seed=seed)


def _profile_once(model: RunnableModel, arrays: Sequence[np.ndarray]) -> KernelProfile:
    return model.profile(*arrays, repeat=3)


def _time_once(model: RunnableModel, arrays: Sequence[np.ndarray]) -> float:
    return model.time(*arrays, number=3, repeat=1)[1]


def choices_log(name: str, target: str, picks: Mapping[str, Choice]) -> TunedLog:
    """A log (as :func:`alt_tvm.records.read_log` returns) that lowers each workload with its
    pick: ``alt_tvm.build(model, records=choices_log(...))`` builds one copy.

    Parameters
    ----------
    name
        What the build's report names as its log.
    target
        The target's JSON string (:func:`alt_tvm.records.target_key`).
    picks
        Workload key -> :class:`Choice`.
    """
    best, strategies, defaults, unfused = {}, {}, {}, {}
    for key, choice in picks.items():
        strategies[key] = choice.strategy
        if not choice.fused:
            unfused[key] = name
        if choice.params is None:
            defaults[key] = f"{choice.label} ({name})"
        else:
            best[key] = TuningRecord(workload_key=key, target=target, latencies_ms=(1.0,), source=name,
                                     candidate={"decision": "variant", "strategy": choice.strategy,
                                                "params": dict(choice.params)})
    return TunedLog(name, target, best, {}, {}, strategies, defaults, unfused)


def _alternatives(task: Any, target: HardwareTarget, allowed: Sequence[str] | None,
                  options: Mapping[str, Any]) -> list[Choice]:
    """The defaults of every other exact strategy that applies to ``task``'s anchor (none for an
    operator kernel's task, which has no partition) and lowers the fusion pattern that is part
    of its workload key: another builds partitions of other keys, which time as no candidate."""
    found: list[Choice] = []
    if task.partition is None:
        return found
    pattern = task.partition.pattern
    for strategy in registry.registered_strategies():
        if strategy.name == task.strategy.name or not strategy.exact:
            continue
        if pattern is not None and pattern.key is not None and all(p.name != pattern.name for p in strategy.patterns):
            continue
        if allowed is not None and strategy.name not in allowed:
            continue
        chosen, _ = strategy_named(task.partition.anchor, strategy.name, target, options=options)
        if chosen is not None and all(c.strategy != chosen.name for c in found):
            found.append(Choice(chosen.name, None, chosen.name))
    return found


def _candidates(tasks: Sequence[Any], ranked: Mapping[str, list[TuningRecord]], config: InModelConfig,
                target: HardwareTarget, allowed: Sequence[str] | None,
                options: Mapping[str, Any], *, copies: int | None = None) -> dict[str, list[Choice]]:
    """Each task's candidates, the default first, at most ``copies`` (None: all)."""
    choices: dict[str, list[Choice]] = {}
    for task in tasks:
        name = task.strategy.name
        found = [Choice(name, None, "default")]
        try:  # a finalist at the default point is the default: not timed twice
            default_key = candidate_key(task.space.params(*task.space.default()))
        except (AttributeError, ValueError):
            default_key = None
        seen, tuned = {default_key}, 0
        records = [r for r in ranked.get(task.key, []) if isinstance(r.candidate.get("params"), dict)
                   and r.candidate.get("strategy", name) == name]
        # A candidate the search measured slower than the defaults is no finalist: it would cost
        # a copy's build and, being slower alone, gain in the model only by the profile's noise.
        default_ms = next((r.median_ms for r in records if candidate_key(r.candidate["params"]) == default_key),
                          math.inf)
        for record in records:
            if tuned >= config.finalists:
                break
            params = record.candidate["params"]
            if candidate_key(params) not in seen and record.median_ms < default_ms:
                seen.add(candidate_key(params))
                tuned += 1
                found.append(Choice(name, params, f"tuned#{tuned}"))
        if config.unfused and _splittable(task):
            # After the best finalist: whether a fusion pays depends on the machine beyond the
            # rule that fuses it (the block's register-count rule, strategies/alt/block.py).
            found.insert(min(2, len(found)), Choice(name, None, "unfused", fused=False))
        if config.alternatives:
            found += _alternatives(task, target, allowed, options)
        if copies is not None and len(found) > copies:
            logger.debug("in-model: %s: %s not timed (%d copies)", task.key,
                         ", ".join(c.label for c in found[copies:]), copies)
        choices[task.key] = found[:copies]
    return choices


def _copies(config: InModelConfig, workers: int, tasks: Sequence[Any]) -> int:
    """The copies the stage builds: ``config.copies``, else one batch of the ``workers`` (at
    least 2), and 3 where a fused workload's pieces are a candidate (after its best finalist)."""
    if config.copies is not None:
        return config.copies
    split = config.unfused and any(_splittable(t) for t in tasks)
    return max(3 if split else 2, workers)


def _splittable(task: Any) -> bool:
    """Whether ``task`` is a fused workload that can be built as its pieces."""
    return task.partition is not None and bool(task.partition.pieces())


def _configs(decisions: Sequence[WorkloadDecision],
             defaults: Mapping[str, Choice]) -> dict[str, dict[str, Choice]]:
    """The whole models the check times, by label: the choices, and where they switch a
    strategy and keep another change, the same without the switches (none without a change)."""
    picks = {d.key: d.choice for d in decisions}
    if all(c.label == "default" for c in picks.values()):
        return {}
    named = {"choices": picks}
    same = {k: c if c.strategy == defaults[k].strategy else defaults[k] for k, c in picks.items()}
    if same != picks and any(c.label != "default" for c in same.values()):
        named["choices without strategy switches"] = same
    return named


def _paired_ratio(samples: Sequence[float], default: Sequence[float]) -> float:
    return statistics.median(s / d if d > 0 and math.isfinite(s) and math.isfinite(d) else math.inf
                             for s, d in zip(samples, default))


def untuned_times(mod: Any, tasks: Sequence[Any], options: BuildOptions, *,
                  example_inputs: Sequence[Any] | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
                  seed: int = 0, profiler: Profiler | None = None) -> dict[str, float]:
    """Each task's kernels' time in one run of the untuned model (ms, all its occurrences and
    the conversions its layout causes; 0 for a task none of whose kernels ran): the median of
    a profile after a warm-up run. Tuning shares its trials by it (``TuneOptions.shares``).

    ``mod`` is the imported Relax module, built here with ``options`` and no tuning log.
    """
    profiler = profiler or _profile_once
    with VariantBuilder(mod, options, input_shapes=input_shapes, workers=1) as builder:
        (untuned,) = builder.build([choices_log("<untuned>", target_key(options.target.to_tvm()), {})])
        arrays = model_inputs(untuned.model, seed=seed, example_inputs=example_inputs)
        profiler(untuned.model, arrays)  # a model's first runs after a build are slower
        per_workload = profiler(untuned.model, arrays).by_workload(untuned.kernels)
    return {task.key: statistics.median(per_workload[task.key]) if per_workload.get(task.key) else 0.0
            for task in tasks}


def decide_in_model(model: Any, tasks: Sequence[Any], options: BuildOptions | None = None, *,
                    log: str | os.PathLike[str], config: InModelConfig | None = None,
                    example_inputs: Sequence[Any] | None = None,
                    input_shapes: Mapping[str, Sequence[int]] | None = None, profiler: Profiler | None = None,
                    model_timer: ModelTimer | None = None, progress: bool = True,
                    **keywords: Any) -> InModelResult:
    """Decide, inside the whole model, how each task's workload is built, and verify it.

    Parameters
    ----------
    model
        The model as :func:`alt_tvm.build` takes it (imported once here; the copies are
        built from the Relax module).
    tasks
        The tuned tasks (:func:`alt_tvm.integration.extract_tasks`): their ``key``,
        ``strategy`` and ``partition`` are used.
    options, **keywords
        The build options the tasks were extracted with
        (:class:`~alt_tvm.options.BuildOptions`, or its fields as keywords); its target is
        the one the log was tuned for (the host: the copies run here). Each copy is built
        with them and a log of its picks.
    log
        The tuning log: its measurements rank each task's finalists, and the decisions
        and the model check are appended to it.
    config
        See :class:`~alt_tvm.options.InModelConfig` (None: its defaults).
    example_inputs, input_shapes
        As for :func:`alt_tvm.build`; ``example_inputs`` are also the inputs the model is
        timed on (default: :func:`model_inputs`).
    profiler, model_timer
        How one round times a copy per kernel and a whole model (defaults: the VM's
        per-kernel instrument, :meth:`RunnableModel.profile`, and
        :meth:`RunnableModel.time`); replaceable for tests of the bookkeeping.
    progress
        Log each step at INFO level (``logging``) rather than DEBUG.

    Returns
    -------
    InModelResult
    """
    started = time.perf_counter()
    options = build_options(options, caller="decide_in_model", **keywords)
    config = config or InModelConfig()
    say = logger.info if progress else logger.debug
    mod = load_model(model, example_inputs=example_inputs, input_shapes=input_shapes).mod
    target = options.target
    profiler = profiler or _profile_once
    model_timer = model_timer or _time_once
    target_json = target_key(target.to_tvm())
    keys = {task.key for task in tasks}
    records = [r for r in iter_records(log) if r.workload_key in keys and r.target == target_json
               and r.tvm_version == tvm_version()]
    source = model if isinstance(model, (str, os.PathLike)) and example_inputs is None else None
    with VariantBuilder(mod, options, source=source, input_shapes=input_shapes,
                        workers=config.build_workers) as builder:
        choices = _candidates(tasks, rank_candidates(records), config, target, options.strategies,
                              options.strategy_options, copies=_copies(config, builder.workers, tasks))
        copies = max(len(c) for c in choices.values())

        def build_copies(named: Mapping[str, Mapping[str, Choice]]) -> list[BuiltVariant]:
            started_builds = time.perf_counter()
            copies_built = builder.build([choices_log(f"<in-model {name}>", target_json, picks)
                                          for name, picks in named.items()])
            say("in-model: built %s in %.0f s", ", ".join(named), time.perf_counter() - started_builds)
            return copies_built

        built = build_copies({f"copy {v}": {key: c[v] if v < len(c) else c[0] for key, c in choices.items()}
                              for v in range(copies)})
        arrays = model_inputs(built[0].model, seed=config.seed, example_inputs=example_inputs)
        times = profile_rounds(built, arrays, keys=keys, rounds=config.rounds, profiler=profiler)
        decisions = [_decide(task.key, choices[task.key], times[task.key], config.margin) for task in tasks]
        defaults = {key: c[0] for key, c in choices.items()}
        builds = copies
        untuned, untuned_samples, tuned_samples = built[0], [], []
        kept = any(d.choice.label != "default" for d in decisions)
        if kept:
            # The choices were timed each in its own copy; together, the layout a producer now
            # writes changes what its consumer pays (a conversion, or a pad stage that converts).
            # Time them together, drop the choices whose kernels no longer gain, then time whole
            # models: these choices, and the same without strategy switches (a switch changes
            # the layout the neighbours see most), against the untuned model. Both are built in
            # one batch; one is built again only where a dropped choice changed it.
            wanted = _configs(decisions, defaults)
            configs: dict[str, BuiltVariant | None] = dict(zip(wanted, build_copies(wanted)))
            builds += len(wanted)
            together = profile_rounds([untuned, configs["choices"]], arrays, keys=keys, rounds=config.rounds,
                                      profiler=profiler)
            dropped = 0
            for d in decisions:
                ratio = _paired_ratio(together[d.key][1], together[d.key][0])
                if d.choice.label != "default" and not ratio < 1.0 - config.margin:
                    dropped += 1
                    _revert(d, defaults[d.key], times[d.key][0],
                            f"{d.choice.label} gained in its copy but took {ratio:.3f}x the default's time in "
                            f"the model with every workload's choice; defaults kept")
            if dropped:
                kept_picks = _configs(decisions, defaults)
                configs = {label: configs[label] if wanted.get(label) == chosen else None
                           for label, chosen in kept_picks.items()}
                missing = {label: kept_picks[label] for label, built in configs.items() if built is None}
                if missing:
                    configs.update(zip(missing, build_copies(missing)))
                    builds += len(missing)
            kept = False
            if configs:
                samples = _time_rounds([untuned.model, *(c.model for c in configs.values())], arrays,
                                       config.model_rounds, model_timer)
                untuned_samples = samples[0]
                ratios = {label: _paired_ratio(samples[i + 1], untuned_samples) for i, label in enumerate(configs)}
                best = min(ratios, key=ratios.get)
                tuned_samples = samples[1 + list(configs).index(best)]
                kept = ratios[best] < 1.0 - config.margin
                for d in decisions:
                    if not kept:
                        _revert(d, defaults[d.key], times[d.key][0],
                                f"the model with the {best} took {ratios[best]:.3f}x the untuned model's time "
                                f"(not faster by more than {config.margin:.0%}); defaults kept")
                    elif best != "choices" and d.choice.strategy != defaults[d.key].strategy:
                        _revert(d, defaults[d.key], times[d.key][0],
                                f"the model without strategy switches was fastest ({ratios[best]:.3f}x the "
                                f"untuned model's time, with them {ratios['choices']:.3f}x); defaults kept")
        if not untuned_samples:
            untuned_samples = [model_timer(untuned.model, arrays) for _ in range(config.model_rounds)]
            tuned_samples = list(untuned_samples)
    if not untuned_samples:
        untuned_samples = [model_timer(untuned, arrays) for _ in range(config.model_rounds)]
        tuned_samples = list(untuned_samples)
    result = InModelResult(decisions, statistics.median(untuned_samples), statistics.median(tuned_samples), kept,
                           builds, time.perf_counter() - started, tuple(untuned_samples), tuple(tuned_samples))
    _write(log, target_json, result)
    say("%s", result.summary())
    return result


def profile_rounds(copies: Sequence[BuiltVariant], arrays: Sequence[np.ndarray], *, keys: set[str], rounds: int,
                   profiler: Profiler | None = None) -> dict[str, list[list[float]]]:
    """``times[key][v]``: per round, the time of workload ``key``'s kernels (and the conversions
    its layout caused) in ``copies[v]``; the copies run interleaved
    (:func:`~alt_tvm.bench.timing.round_order`). ``profiler`` times one run per kernel (default
    :meth:`RunnableModel.profile`)."""
    profiler = profiler or _profile_once
    for copy in copies:  # a model's first runs after a build are slower (page faults, a cold pool)
        profiler(copy.model, arrays)
    runs = run_interleaved(len(copies), rounds=rounds,
                           run=lambda v: profiler(copies[v].model, arrays).by_workload(copies[v].kernels))
    return {key: [[statistics.median(per_workload.get(key, (math.nan,))) for per_workload in runs[v]]
                  for v in range(len(copies))] for key in keys}


def _time_rounds(models: Sequence[RunnableModel], arrays: Sequence[np.ndarray], rounds: int,
                 model_timer: ModelTimer) -> list[list[float]]:
    """Whole-model times of ``models``, interleaved (:func:`~alt_tvm.bench.timing.round_order`)."""
    return run_interleaved(len(models), rounds=rounds, run=lambda v: model_timer(models[v], arrays))


def _decide(key: str, found: Sequence[Choice], times: Sequence[Sequence[float]], margin: float) -> WorkloadDecision:
    """The fastest of ``found`` in the model (``times[v]``: candidate ``v``'s per-round times;
    ``found[0]`` is the default), if it beats the default by more than ``margin``."""
    measured = {found[v].label: v for v in range(min(len(found), len(times)))}
    medians = {label: statistics.median(times[v]) for label, v in measured.items()}
    ratios = {label: _paired_ratio(times[v], times[0]) for label, v in measured.items()}
    label = min(ratios, key=ratios.get)
    if label == "default":
        reason = "the defaults were fastest in the model"
    elif not ratios[label] < 1.0 - margin:
        reason = (f"no candidate beat the defaults in the model by more than {margin:.0%} "
                  f"(best {label}: {ratios[label]:.3f}x the default's time)")
        label = "default"
    else:
        reason = f"{label} took {ratios[label]:.3f}x the default's time in the model"
    v = measured[label]
    return WorkloadDecision(key, found[v], medians, ratios[label], reason, tuple(times[v]))


def _revert(decision: WorkloadDecision, default: Choice, samples: Sequence[float], reason: str) -> None:
    decision.choice, decision.ratio, decision.reason, decision.samples_ms = default, 1.0, reason, tuple(samples)


def _write(log: str | os.PathLike[str], target_json: str, result: InModelResult) -> None:
    """Append the decisions and the model check to the log."""
    with RecordWriter(log) as writer:
        for d in result.decisions:
            samples = [s for s in d.samples_ms if math.isfinite(s) and s >= 0] or [0.0]
            writer.write(TuningRecord(
                workload_key=d.key, target=target_json, latencies_ms=samples,
                candidate={"decision": "in-model", "strategy": d.choice.strategy,
                           "params": None if d.choice.params is None else dict(d.choice.params),
                           "label": d.choice.label, "reason": d.reason, "ratio": _finite(d.ratio),
                           "in_model_ms": {k: _finite(v) for k, v in d.times_ms.items()},
                           **({} if d.choice.fused else {"fuse": False})}))
        digest = hashlib.sha1("\n".join(sorted(d.key for d in result.decisions)).encode()).hexdigest()[:16]
        writer.write(TuningRecord(
            workload_key=f"model|{digest}", target=target_json, latencies_ms=result.tuned_samples or (0.0,),
            candidate={"model_check": "in-model", "kept": result.kept, "untuned_ms": list(result.untuned_samples),
                       "workloads": len(result.decisions)}))


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
