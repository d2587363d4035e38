"""Tuning a whole model: the integration of the tuner with the model build.

The build (:mod:`alt_tvm.graph`) and the tuner (:mod:`alt_tvm.tuning`) know nothing of
each other; this module depends on both and nothing in them depends on it (the role
MetaSchedule's ``relax_integration`` plays in TVM). :func:`extract_tasks` partitions a
model with :func:`alt_tvm.graph.partition.plan_partitions`, the rule ``alt_tvm.build``
applies, so every task is keyed and lowered exactly as the build will key and lower its
partition; :func:`tune` tunes those tasks into a log that ``alt_tvm.build(records=...)``
applies. Both take the model's :class:`~alt_tvm.options.BuildOptions`; :func:`tune` takes
them inside a :class:`~alt_tvm.options.TuneOptions`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from alt_tvm.deploy.model import use_runtime_threads
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.partition import plan_partitions
from alt_tvm.graph.prepare import prepare
from alt_tvm.in_model import InModelResult, Profiler, decide_in_model, untuned_times
from alt_tvm.operator_tasks import operator_tasks
from alt_tvm.options import BuildOptions, TuneOptions, build_options, check_layout_levels, tune_options
from alt_tvm.strategies.base import PartitionContext
from alt_tvm.target import runs_on_host
from alt_tvm.tuning.driver import TaskSummary, check_measure, tune_tasks
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


def extract_tasks(model: Any, options: BuildOptions | None = None, *,
                  example_inputs: Sequence[Any] | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, layout_levels: int = 1,
                  operators: int = 0, **keywords: Any) -> list[Task]:
    """The tunable tasks of ``model``, in topological order.

    Parameters
    ----------
    model, options, example_inputs, input_shapes, **keywords
        As for :func:`alt_tvm.build`: the tasks are the partitions that build lowers with a
        strategy that has a tuning space, with the same options (the keywords are fields of
        :class:`~alt_tvm.options.BuildOptions`).
    layout_levels
        1 or 2: the one- or two-level layout templates (ALT paper §5.1) for the strategies
        that have both.
    operators
        Also this many tasks for the kernels no strategy implements
        (:func:`alt_tvm.operator_tasks.operator_tasks`), those moving the most bytes
        (buffer sizes x call sites) first, after the partitions' tasks.

    Returns
    -------
    list of Task
        Identical workloads (e.g. repeated ResNet blocks) are one task with a ``weight``.
    """
    options = build_options(options, caller="extract_tasks", **keywords)
    layout_levels = check_layout_levels(layout_levels)
    imported = load_model(model, example_inputs=example_inputs, input_shapes=input_shapes)
    return _extract(imported.mod, options, layout_levels=layout_levels, operators=operators)


def _extract(mod: Any, options: BuildOptions, *, layout_levels: int, operators: int = 0) -> list[Task]:
    target, variant = options.target, options.variant
    func = prepare(mod)["main"]
    plan = plan_partitions(func, target=target, variant=variant, allowed=options.strategies,
                           strategy_options=options.strategy_options)
    tasks: dict[str, Task] = {}
    for partition in plan.partitions:
        strategy = plan.strategy_of(partition)
        strategy_options = options.strategy_options.get(strategy.name)
        context = PartitionContext(partition, target, variant, {},
                                   options=_space_options(strategy_options, layout_levels))
        space = strategy.space(partition.anchor, context)
        if space is None:
            continue
        key = context.workload_key
        if key in tasks:
            tasks[key].weight += 1
        else:
            tasks[key] = Task(key, strategy, partition, target, space, variant=variant, options=strategy_options)
    return [*tasks.values(), *(operator_tasks(mod, options, limit=operators) if operators > 0 else [])]


def _operator_budget(trials: int, strategy_tasks: int) -> int:
    """How many operator kernels a run of ``trials`` tunes besides ``strategy_tasks`` tasks: as
    many as leave every task 2 trials, at most ``trials // 8``."""
    return max(0, min(trials // 8, (trials - 2 * strategy_tasks) // 2))


def tune(model: Any, options: TuneOptions | None = None, *, example_inputs: Sequence[Any] | None = None,
         input_shapes: Mapping[str, Sequence[int]] | None = None,
         measure: Callable[[Task, dict[str, Any]], float] | None = None, profiler: Profiler | None = None,
         **keywords: Any) -> TuneOutcome:
    """Tune every tunable partition of ``model``, then decide and verify in the whole model.

    Parameters
    ----------
    model, example_inputs, input_shapes
        As for :func:`alt_tvm.build`.
    options
        The run (:class:`~alt_tvm.options.TuneOptions`: the budget, the log, the search
        settings, ``build``, the model's :class:`~alt_tvm.options.BuildOptions`, and the
        in-model stage).
    measure
        ``measure(task, params) -> ms``, as for :func:`alt_tvm.tuning.driver.tune_tasks`
        (default: build and time in this process).
    profiler
        Replaces the in-model stage's per-kernel timing (for tests).
    **keywords
        Fields of :class:`~alt_tvm.options.TuneOptions` or of
        :class:`~alt_tvm.options.BuildOptions` (``trials=``, ``log=``, ``target=``,
        ``strategies=`` ...), replacing those of ``options``.

    With ``verify`` (the default), the search's finalists of every task, its defaults and
    the other applicable strategies are then timed inside the built model, the fastest in
    the model is chosen per task, and the model built with the choices is timed against
    the untuned model (:func:`alt_tvm.in_model.decide_in_model`, configured by
    ``in_model``). The decisions go into ``log``, so ``alt_tvm.build(records=log)`` builds
    what was verified; a log whose tuned model is not faster than the untuned one builds
    the untuned model. Verification needs the model to run here: it is skipped (with a
    warning) for another target.

    Returns
    -------
    TuneOutcome
        One summary per task, and ``.in_model``.
    """
    options = tune_options(options, caller="tune", **keywords)
    # The search and the in-model decisions are relative to the strategies' own defaults,
    # which the learned defaults are fitted from.
    options = dataclasses.replace(options, build=dataclasses.replace(options.build, priors=None))
    check_measure(measure, options)
    machine = options.build.target
    if runs_on_host(machine):
        use_runtime_threads(machine.num_cores)  # candidates are timed with the threads the built model has
    imported = load_model(model, example_inputs=example_inputs, input_shapes=input_shapes)
    tasks = _extract(imported.mod, options.build, layout_levels=options.layout_levels)
    budget = _operator_budget(options.trials, len(tasks)) if options.operators else 0
    if budget > 0:
        tasks += operator_tasks(imported.mod, options.build, limit=budget)
    if options.shares == "time" and options.verify and runs_on_host(machine):
        times = untuned_times(imported.mod, tasks, options.build, example_inputs=example_inputs,
                              input_shapes=input_shapes, seed=options.in_model.seed, profiler=profiler)
        for task in tasks:
            task.time_ms = times[task.key]
    summaries = tune_tasks(tasks, options, measure=measure)
    result = None
    if options.verify and not runs_on_host(machine):
        warnings.warn(f"tune: the in-model verification needs the model to run here; target "
                      f"{machine.name!r} does not, so the log holds the search's best records unverified",
                      stacklevel=2)
    elif options.verify and any(s.ok for s in summaries):
        result = decide_in_model(imported.mod, tasks, options.build, log=options.log, config=options.in_model,
                                 example_inputs=example_inputs, profiler=profiler, progress=options.progress)
    return TuneOutcome(summaries, result)
