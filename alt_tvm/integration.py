"""Tuning a whole model: the integration of the tuner with the model build.

The build (:mod:`alt_tvm.graph`) and the tuner (:mod:`alt_tvm.tuning`) know nothing of
each other; this module depends on both and nothing in them depends on it (the role
MetaSchedule's ``relax_integration`` plays in TVM). :func:`extract_tasks` partitions a
model with :func:`alt_tvm.graph.partition.plan_partitions`, the rule ``alt_tvm.build``
applies, so every task is keyed and lowered exactly as the build will key and lower its
partition; :func:`tune` tunes those tasks into a log that ``alt_tvm.build(records=...)``
applies.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from alt_tvm.deploy.model import use_runtime_threads
from alt_tvm.graph.build import VARIANTS
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.partition import plan_partitions
from alt_tvm.graph.prepare import prepare
from alt_tvm.in_model import InModelConfig, InModelResult, Profiler, decide_in_model
from alt_tvm.strategies.base import PartitionContext
from alt_tvm.strategies.registry import check_names, check_strategy_options
from alt_tvm.target import HardwareTarget, resolve, runs_on_host
from alt_tvm.tuning.driver import TaskSummary, check_options, tune_tasks
from alt_tvm.tuning.task import Task

__all__ = ["TuneOutcome", "extract_tasks", "tune"]


class TuneOutcome(list):
    """What :func:`tune` returns: one :class:`~alt_tvm.tuning.driver.TaskSummary` per task
    (it is that list), and ``in_model``, the in-model decisions and whole-model check
    (:class:`~alt_tvm.in_model.InModelResult`; None when ``verify=False``)."""

    def __init__(self, summaries: Sequence[TaskSummary], in_model: InModelResult | None) -> None:
        super().__init__(summaries)
        self.in_model = in_model


def _space_options(options: Any, layout_levels: int) -> Any:
    """The build's options for a strategy, plus the layout-template depth its space is built for."""
    if options is None or isinstance(options, Mapping):
        return {**(options or {}), "layout_levels": layout_levels}
    return options  # a strategy's own options object: its space has no layout levels


def extract_tasks(model: Any, *, target: HardwareTarget | str | None = None,
                  example_inputs: Sequence[Any] | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, strategies: Sequence[str] | None = None,
                  variant: str = "alt", strategy_options: Mapping[str, Any] | None = None,
                  layout_levels: int = 1) -> list[Task]:
    """The tunable tasks of ``model``, in topological order.

    Parameters
    ----------
    model, target, example_inputs, input_shapes, strategies, variant, strategy_options
        As for :func:`alt_tvm.build`: the tasks are the partitions that build lowers with a
        strategy that has a tuning space, with the same options.
    layout_levels
        1 or 2: the one- or two-level layout templates (ALT paper §5.1) for the strategies
        that have both.

    Returns
    -------
    list of Task
        Identical workloads (e.g. repeated ResNet blocks) are one task with a ``weight``.
    """
    imported = load_model(model, example_inputs=example_inputs, input_shapes=input_shapes)
    return _extract(imported.mod, target=resolve(target), strategies=strategies, variant=variant,
                    strategy_options=strategy_options, layout_levels=layout_levels)


def _extract(mod: Any, *, target: HardwareTarget, strategies: Sequence[str] | None, variant: str,
             strategy_options: Mapping[str, Any] | None, layout_levels: int) -> list[Task]:
    if layout_levels not in (1, 2):
        raise ValueError(f"layout_levels must be 1 or 2, got {layout_levels!r}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {list(VARIANTS)}")
    options = check_strategy_options(strategy_options)
    func = prepare(mod)["main"]
    plan = plan_partitions(func, target=target, variant=variant, allowed=check_names(strategies),
                           strategy_options=options)
    tasks: dict[str, Task] = {}
    for partition in plan.partitions:
        strategy = plan.strategy_of(partition)
        build_options = options.get(strategy.name)
        context = PartitionContext(partition, target, variant, {},
                                   options=_space_options(build_options, layout_levels))
        space = strategy.space(partition.anchor, context)
        if space is None:
            continue
        key = context.workload_key
        if key in tasks:
            tasks[key].weight += 1
        else:
            tasks[key] = Task(key, strategy, partition, target, space, variant=variant, options=build_options)
    return list(tasks.values())


def tune(model: Any, *, trials: int, log: str | os.PathLike[str], target: HardwareTarget | str | None = None,
         seed: int = 0, joint_fraction: float = 0.3, example_inputs: Sequence[Any] | None = None,
         input_shapes: Mapping[str, Sequence[int]] | None = None, strategies: Sequence[str] | None = None,
         variant: str = "alt", strategy_options: Mapping[str, Any] | None = None, resume: bool = True,
         measure: Callable[[Task, dict[str, Any]], float] | None = None, cost_model: Any = "xgb",
         progress: bool = True, plot: str | os.PathLike[str] | None = None, layout_levels: int = 1,
         features: str = "tir", batch: int = 128, top_k: int = 8, revalidate: int = 3,
         revalidate_rounds: int = 2, scheduler: str | Any = "static", in_flight: int = 1, lookahead: int = 0,
         verify: bool = True,
         in_model: InModelConfig | None = None, fast_math: bool = False,
         profiler: Profiler | None = None) -> TuneOutcome:
    """Tune every tunable partition of ``model``, then decide and verify in the whole model.

    ``model`` and the build options (``target``, ``example_inputs``, ``input_shapes``,
    ``strategies``, ``variant``, ``strategy_options``, ``fast_math``) are those of
    :func:`alt_tvm.build`; ``layout_levels`` is :func:`extract_tasks`'s; the search options
    are those of :func:`alt_tvm.tuning.driver.tune_tasks`.

    With ``verify`` (the default), the search's finalists of every task, its defaults and
    the other applicable strategies are then timed inside the built model, the fastest in
    the model is chosen per task, and the model built with the choices is timed against
    the untuned model (:func:`alt_tvm.in_model.decide_in_model`, configured by
    ``in_model``; ``profiler`` replaces its per-kernel timing, for tests). The decisions go
    into ``log``, so ``alt_tvm.build(records=log)`` builds what was verified; a log whose
    tuned model is not faster than the untuned one builds the untuned model. Verification
    needs the model to run here: it is skipped (with a warning) for another target.

    Returns
    -------
    TuneOutcome
        One summary per task, and ``.in_model``.
    """
    check_options(trials=trials, seed=seed, joint_fraction=joint_fraction, batch=batch, top_k=top_k,
                  revalidate=revalidate, revalidate_rounds=revalidate_rounds, features=features, log=log,
                  measure=measure)
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be a bool, got {verify!r}")
    if in_model is not None and not isinstance(in_model, InModelConfig):
        raise TypeError(f"in_model must be an alt_tvm.in_model.InModelConfig, got {type(in_model).__name__}")
    machine = resolve(target)
    if runs_on_host(machine):
        use_runtime_threads(machine.num_cores)  # candidates are timed with the threads the built model has
    imported = load_model(model, example_inputs=example_inputs, input_shapes=input_shapes)
    tasks = _extract(imported.mod, target=machine, strategies=strategies, variant=variant,
                     strategy_options=strategy_options, layout_levels=layout_levels)
    summaries = tune_tasks(tasks, trials=trials, log=log, seed=seed, joint_fraction=joint_fraction, resume=resume,
                           measure=measure, cost_model=cost_model, progress=progress, plot=plot, features=features,
                           batch=batch, top_k=top_k, revalidate=revalidate, revalidate_rounds=revalidate_rounds,
                           scheduler=scheduler, in_flight=in_flight, lookahead=lookahead)
    result = None
    if verify and not runs_on_host(machine):
        warnings.warn(f"tune: the in-model verification needs the model to run here; target "
                      f"{machine.name!r} does not, so the log holds the search's best records unverified",
                      stacklevel=2)
    elif verify and any(s.ok for s in summaries):
        options = {"variant": variant, "strategies": strategies, "strategy_options": strategy_options,
                   "fast_math": fast_math}
        result = decide_in_model(imported.mod, tasks, log=log, target=machine, config=in_model or InModelConfig(),
                                 build_options=options, example_inputs=example_inputs, profiler=profiler,
                                 progress=progress)
    return TuneOutcome(summaries, result)
