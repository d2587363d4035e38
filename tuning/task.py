"""Tuning tasks: the partitions of a model that a tunable strategy implements.

A task is extracted with the same partitioner and strategy selection as
``alt_tvm.build``, so a tuned point is keyed by exactly the workload the build later
looks up. Lowering a task's point goes through the strategy's own ``implement``, so
what is measured is what the build will run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from alt_tvm.graph import registry
from alt_tvm.graph.build import load_builtin_strategies, op_info, prepare
from alt_tvm.graph.lower import PartitionContext, const_value
from alt_tvm.graph.partition import Partition, dtype_of, find_partitions, op_name, static_shape
from alt_tvm.target import HardwareTarget, host

from .space import Space


@dataclass
class Lowered:
    """A lowered point: the scheduled function and the shapes/dtypes of its arguments."""

    func: tvm.tirx.PrimFunc
    arg_specs: list[tuple[tuple[int, ...], str]]  # inputs then the output
    constants: dict[int, np.ndarray] = field(default_factory=dict)  # argument index -> packed data


@dataclass
class Task:
    """One tunable partition (occurring ``weight`` times in the model)."""

    key: str
    strategy: registry.Strategy
    partition: Partition
    target: HardwareTarget
    space: Space
    weight: int = 1

    def lower(self, params: dict[str, Any] | None) -> Lowered:
        """Lower the partition with ``params`` (None: the strategy's defaults)."""
        context = PartitionContext(self.partition, self.target, "alt", {}, params=params)
        lowered = self.strategy.implement(self.partition.anchor, context)
        specs, constants = [], {}
        for i, arg in enumerate(lowered.args):
            data = const_value(arg)
            if data is not None:
                specs.append((tuple(data.shape), str(data.dtype)))
                constants[i] = data
            elif arg in context.conversions:
                specs.append((context.conversions[arg].shape, dtype_of(arg)))
            else:
                specs.append((static_shape(arg), dtype_of(arg)))
        specs.append((lowered.output_shape, lowered.output_dtype))
        return Lowered(lowered.func, specs, constants)


def extract_tasks(model: Any, *, target: HardwareTarget | None = None, example_inputs: Sequence[Any] | None = None,
                  strategies: Sequence[str] | None = None, layout_levels: int = 1) -> list[Task]:
    """The tunable tasks of ``model`` (same inputs as ``alt_tvm.build``), in topological order.

    Identical workloads (e.g. repeated ResNet blocks) are one task with a ``weight``.
    ``layout_levels`` selects the one- or two-level layout templates (paper §5.1) for the
    strategies that have both.
    """
    if layout_levels not in (1, 2):
        raise ValueError(f"layout_levels must be 1 or 2, got {layout_levels!r}")
    from alt_tvm.graph.frontend import load_model

    load_builtin_strategies()
    target = target or host()
    allowed = registry.check_names(strategies)
    imported = load_model(model, example_inputs=example_inputs)
    func = prepare(imported.mod)["main"]
    selected: dict = {}

    def is_anchor(binding) -> bool:
        if not any(op_name(binding.value) in s.ops for s in registry.registered_strategies()):
            return False
        strategy, _ = registry.select(op_info(binding, target), allowed=allowed)
        if strategy is None:
            return False
        selected[binding.var] = strategy
        return True

    tasks: dict[str, Task] = {}
    for partition in find_partitions(func, is_anchor=is_anchor, absorbs_pad=lambda b: selected[b.var].absorbs_pad):
        strategy = selected[partition.anchor.var]
        context = PartitionContext(partition, target, "alt", {}, options={"layout_levels": layout_levels})
        space = strategy.space(partition.anchor, context)
        if space is None:
            continue
        key = context.workload_key
        if key in tasks:
            tasks[key].weight += 1
        else:
            tasks[key] = Task(key, strategy, partition, target, space)
    return list(tasks.values())


def measure_in_process(task: Task, params: dict[str, Any] | None, *, number: int = 5, repeat: int = 3,
                       seed: int = 0) -> float:
    """Build ``params`` and time it here (median of ``repeat`` runs of ``number`` calls, in ms).

    The simplest measure function for :class:`~alt_tvm.tuning.tuner.Tuner`: no process
    isolation, so use it for trusted templates (the process-pool and RPC runners in
    ``alt_tvm.tuning.measure`` isolate crashes and time remote boards).
    """
    lowered = task.lower(params)
    executable = tvm.compile(lowered.func, target=task.target.to_tvm()).jit()
    rng = np.random.default_rng(seed)
    dev = tvm.cpu()
    args = []
    for i, (shape, dtype) in enumerate(lowered.arg_specs):
        data = lowered.constants.get(i)
        if data is None:
            data = rng.standard_normal(shape).astype(dtype) if "float" in dtype else np.zeros(shape, dtype)
        args.append(tvm.runtime.tensor(data, dev))
    executable["main"](*args)
    result = executable.time_evaluator("main", dev, number=number, repeat=repeat)(*args)
    return float(np.median(result.results) * 1e3)
