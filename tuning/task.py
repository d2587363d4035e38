"""Tuning tasks: one partition that a tunable strategy implements, and its search space.

Tasks are extracted from a model by :func:`alt_tvm.integration.extract_tasks`, with the
same partitioning and strategy selection as ``alt_tvm.build``, so a tuned point is keyed by
exactly the workload the build later looks up. Lowering a task's point goes through the
strategy's own ``implement`` with the build's variant and options, so what is measured is
what the build will run. This module knows strategies, not models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from alt_tvm import lowering
from alt_tvm.bench.timing import TimingPolicy, check_cache_flush
from alt_tvm.strategies.base import Partition, PartitionContext, Strategy, const_value, dtype_of, static_shape
from alt_tvm.strategies.space import Space
from alt_tvm.target import HardwareTarget


@dataclass
class Lowered:
    """A lowered point: the scheduled function and the shapes/dtypes of its arguments."""

    func: tvm.tirx.PrimFunc
    arg_specs: list[tuple[tuple[int, ...], str]]  # inputs then the output
    constants: dict[int, np.ndarray] = field(default_factory=dict)  # argument index -> packed data
    #: argument index -> layout an activation is converted to before the call
    conversions: dict[int, Any] = field(default_factory=dict)
    #: layout of the output (None: canonical)
    output_layout: Any = None

    def run(self, kernel: Any, activations: Sequence[np.ndarray], device: Any) -> np.ndarray:
        """Call the compiled ``kernel`` on ``activations`` and return its output in canonical layout.

        Parameters
        ----------
        kernel
            The compiled function (e.g. ``tvm.compile(self.func, target)["main"]``).
        activations
            The non-constant inputs in argument order, in canonical layout; each is converted
            to the layout the kernel reads, as the build converts it.
        device
            TVM device the kernel runs on (``tvm.cpu()``, ``tvm.cuda(0)``, a remote one).

        Raises
        ------
        ValueError
            If the number or a shape of ``activations`` differs from the partition's.
        """
        *args, out = (tvm.runtime.tensor(a, device) for a in self.arrays(activations))
        kernel(*args, out)
        return self.canonical_output(out.numpy())

    def arrays(self, activations: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The kernel's arguments as C-contiguous arrays: the constants, ``activations``
        (canonical layout) converted to the layouts the kernel reads, and an output filled with
        NaN (zeros for integers), so that an element the kernel does not write shows.

        Raises
        ------
        ValueError
            If the number or a shape of ``activations`` differs from the partition's.
        """
        inputs = [i for i in range(len(self.arg_specs) - 1) if i not in self.constants]
        if len(activations) != len(inputs):
            raise ValueError(f"the kernel takes {len(inputs)} activation(s), got {len(activations)}")
        args = []
        fed = iter(activations)
        for i, (shape, dtype) in enumerate(self.arg_specs[:-1]):
            data = self.constants.get(i)
            if data is None:
                data = np.asarray(next(fed), dtype=dtype)
                if i in self.conversions:
                    data = self.conversions[i].apply(data)
                if tuple(data.shape) != tuple(shape):
                    raise ValueError(f"activation for argument {i} has shape {tuple(data.shape)}, "
                                     f"the kernel takes {tuple(shape)}")
            args.append(np.require(data, dtype=dtype, requirements="C"))  # keeps 0-d arrays 0-d
        shape, dtype = self.arg_specs[-1]
        args.append(np.full(shape, np.nan, dtype) if "float" in dtype else np.zeros(shape, dtype))
        return args

    def canonical_output(self, result: np.ndarray) -> np.ndarray:
        """The kernel's output ``result`` in the canonical layout."""
        return self.output_layout.inverse_apply(result) if self.output_layout is not None else result


@dataclass
class Task:
    """One tunable partition (occurring ``weight`` times in the model)."""

    key: str
    strategy: Strategy
    partition: Partition
    target: HardwareTarget
    space: Space
    weight: int = 1
    #: its kernels' time in one run of the untuned model, all occurrences (ms; None: not profiled)
    time_ms: float | None = None
    #: the build variant and the build's options for ``strategy`` (lowered exactly as the build lowers)
    variant: str = "alt"
    options: Any = None

    def lower(self, params: dict[str, Any] | None) -> Lowered:
        """Lower the partition with ``params`` (None: the strategy's defaults)."""
        context = PartitionContext(self.partition, self.target, self.variant, {}, params=params,
                                   options=self.options)
        lowered = self.strategy.implement(self.partition.anchor, context)
        specs, constants, conversions = [], {}, {}
        for i, arg in enumerate(lowered.args):
            data = const_value(arg)
            if data is not None:
                specs.append((tuple(data.shape), str(data.dtype)))
                constants[i] = data
            elif arg in context.conversions:
                specs.append((context.conversions[arg].shape, dtype_of(arg)))
                conversions[i] = context.conversions[arg]
            else:
                specs.append((static_shape(arg), dtype_of(arg)))
        specs.append((lowered.output_shape, lowered.output_dtype))
        return Lowered(lowered.func, specs, constants, conversions, lowered.output_layout)


def measure_in_process(task: Task, params: dict[str, Any] | None, *, number: int = 5, repeat: int = 3,
                       seed: int = 0, cache_flush: bool = True) -> float:
    """Build ``params`` and time it here (median of ``repeat`` latencies, each the mean of ``number`` calls, in ms).

    The simplest measure function for :class:`~alt_tvm.tuning.tuner.Tuner`: no process
    isolation, so use it for trusted templates (the process-pool and RPC runners in
    ``alt_tvm.tuning.measure`` isolate crashes and time remote boards). Timed with the
    runners' :class:`~alt_tvm.bench.timing.TimingPolicy`; it runs in this process's TVM thread
    pool, as it is.

    Parameters
    ----------
    task : Task
    params : dict or None
        The point to build (None: the strategy's defaults).
    number, repeat : int
        Calls per latency, and latencies.
    seed : int
        Seed of the random inputs.
    cache_flush : bool
        Flush every argument but the first (the activation) from the CPU caches before each
        timed call, so the weights are read from memory as in the model; False: time on hot
        caches.

    Raises
    ------
    RuntimeError
        ``"BUILD_ERROR: ..."`` if the candidate does not lower or compile (see
        :func:`~alt_tvm.tuning.measure.classify_exception`); errors of the run propagate.
    TypeError
        If ``cache_flush`` is not a bool.
    ValueError
        If ``number`` or ``repeat`` is not an int > 0.
    """
    timing = TimingPolicy(number=number, repeat=repeat, cache_flush=check_cache_flush(cache_flush))
    try:
        lowered = task.lower(params)
        executable = lowering.compile(lowered.func, target=task.target.to_tvm()).jit()
    except OSError:
        raise  # the machine's fault, not the candidate's (e.g. no space for the object file)
    except Exception as err:  # noqa: BLE001 - the candidate's own failure
        raise RuntimeError(f"BUILD_ERROR: {type(err).__name__}: {err}") from err
    rng = np.random.default_rng(seed)
    dev = tvm.cpu()
    args = []
    for i, (shape, dtype) in enumerate(lowered.arg_specs):
        data = lowered.constants.get(i)
        if data is None:
            data = rng.standard_normal(shape).astype(dtype) if "float" in dtype else np.zeros(shape, dtype)
        args.append(tvm.runtime.tensor(data, dev))
    executable["main"](*args)
    return float(np.median(timing.time(executable, "main", dev, args)))
