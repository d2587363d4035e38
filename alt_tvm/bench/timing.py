"""Fair timing, the same way in every benchmark, the CLI and the tuner.

Kernels: :class:`TimingPolicy` is the one policy the tuner's measure functions and runners
time candidates with (:func:`~alt_tvm.tuning.task.measure_in_process`, ``LocalRunner``,
``RPCRunner``): by default each timed call starts with the weights and outputs evicted from
the CPU caches, as in the model, where the layers before a kernel have evicted them.
:func:`time_compiled` times with the same code, hot by default (benchmarks of whole kernels
or models).

Runtimes side by side: :func:`time_interleaved` times several runners (:mod:`.base`) in
rounds (each first once and after every other equally often: :func:`round_order`) and reports
the median of the rounds; :func:`run_interleaved` is the one interleaving loop behind every
comparison (timings, per-kernel profiles, A/B builds). :func:`quiet_tvm_pool` keeps TVM's idle workers from
spinning against the runtime timed next to it; the peers' sessions (:mod:`.onnxruntime`,
:mod:`.openvino`) do not spin either, and every runner gets the same thread count.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

__all__ = ["CACHE_FLUSH_FUNC", "Timing", "TimingPolicy", "balanced_rounds", "check_cache_flush", "is_cpu",
           "quiet_tvm_pool", "round_order", "run_interleaved", "time_callable", "time_compiled", "time_interleaved"]

#: The TVM runtime builtin that MetaSchedule's ``enable_cpu_cache_flush`` uses: it evicts
#: every argument but the first from the CPU caches. The first argument is the activation,
#: which the producer kernel has just written, so it is warm in the model too. TVM 0.27
#: flushes on x86-64 (``clflush``) and AArch64 (``dc civac``) only; on other CPUs (RISC-V)
#: the builtin does nothing.
CACHE_FLUSH_FUNC = "cache_flush_cpu_non_first_arg"

_KDL_CPU = 1  # DLDeviceType of the CPU
_RPC_SESS_MASK = 128  # a remote device's type is its own plus a multiple of this


def check_cache_flush(value: Any) -> bool:
    """Return ``value`` if it is a bool.

    Raises
    ------
    TypeError
        Naming ``value`` otherwise (a truthy ``1`` or ``"no"`` is refused: it is a typo
        more often than an intent).
    """
    if not isinstance(value, bool):
        raise TypeError(f"cache_flush must be a bool, got {value!r}")
    return value


def is_cpu(device: Any) -> bool:
    """Whether ``device`` (a local device or an RPC session's) is a CPU."""
    return device.dlpack_device_type() % _RPC_SESS_MASK == _KDL_CPU


def _check_count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int {'> 0' if minimum else '>= 0'}, got {value!r}")


@dataclass(frozen=True)
class TimingPolicy:
    """How a kernel is timed: ``repeat`` latencies, each the mean of ``number`` calls.

    Parameters
    ----------
    number : int
        Calls per latency.
    repeat : int
        Latencies.
    min_repeat_ms : int
        Without ``cache_flush``: minimum duration of one latency's calls (``time_evaluator``
        grows ``number`` until it is reached; 0: off). Must be 0 with ``cache_flush``: more
        calls per flush would time them on caches the first call warmed.
    cache_flush : bool
        On a CPU, evict every argument but the first from the caches (:data:`CACHE_FLUSH_FUNC`)
        before each timed call, so a layer's weights (often MBs) are read from memory as in
        the model, not from caches a previous call warmed. Off: every call after the first
        finds the data the previous one left in cache (the hot-cache timing).

    Raises
    ------
    ValueError
        If ``number`` or ``repeat`` is not an int > 0, ``min_repeat_ms`` not an int >= 0,
        or ``min_repeat_ms > 0`` with ``cache_flush``.
    TypeError
        If ``cache_flush`` is not a bool.

    Notes
    -----
    ``time_evaluator`` runs its ``f_preproc`` once per repeat, before the repeat's calls.
    So with ``cache_flush`` a CPU kernel is timed as ``number * repeat`` repeats of one
    call each, every one after a flush; consecutive groups of ``number`` are averaged into
    the ``repeat`` latencies. The kernel is called as often as without the flush (the
    flushes themselves are not timed). On other devices (CUDA) the flush does not apply:
    the builtin would treat device pointers as host memory, and a GPU's caches are not the
    host's. There the policy times as without ``cache_flush``.
    """

    number: int = 10
    repeat: int = 3
    min_repeat_ms: int = 0
    cache_flush: bool = True

    def __post_init__(self) -> None:
        _check_count("number", self.number, 1)
        _check_count("repeat", self.repeat, 1)
        _check_count("min_repeat_ms", self.min_repeat_ms, 0)
        check_cache_flush(self.cache_flush)
        if self.cache_flush and self.min_repeat_ms:
            raise ValueError(f"min_repeat_ms={self.min_repeat_ms} needs cache_flush=False: it times several calls "
                             f"per cache flush")

    def flushes(self, device: Any) -> bool:
        """Whether calls on ``device`` are timed after a cache flush (``cache_flush`` and a CPU)."""
        return self.cache_flush and is_cpu(device)

    def time(self, module: Any, func_name: str, device: Any, args: Sequence[Any]) -> list[float]:
        """Latencies in ms of ``module[func_name](*args)`` on ``device``, one per repeat.

        ``module`` is a runtime module, local or an RPC session's (then ``args`` live on
        that session's ``device``, and the flush runs there). ``time_evaluator`` makes one
        untimed call first.
        """
        if self.flushes(device):
            timer = module.time_evaluator(func_name, device, number=1, repeat=self.number * self.repeat,
                                          f_preproc=CACHE_FLUSH_FUNC)
            calls = np.asarray(timer(*args).results, dtype=np.float64)
            return [float(x) * 1e3 for x in calls.reshape(self.repeat, self.number).mean(axis=1)]
        timer = module.time_evaluator(func_name, device, number=self.number, repeat=self.repeat,
                                      min_repeat_ms=self.min_repeat_ms)
        return [float(x) * 1e3 for x in timer(*args).results]


@dataclass(frozen=True)
class Timing:
    """Latency statistics in milliseconds over ``repeat`` runs of ``number`` calls each."""

    min_ms: float
    median_ms: float
    repeat: int
    number: int

    def gflops(self, flops: int) -> float:
        """Throughput at the median latency."""
        return flops / (self.median_ms * 1e-3) / 1e9


def time_compiled(executable, args: list, *, number: int = 10, repeat: int = 5,
                  func_name: str = "main", device=None, cache_flush: bool = False) -> Timing:
    """Time ``executable`` (the result of ``tvm.compile``) on ``args`` after one warm-up call.

    ``cache_flush=True`` times every call after evicting all arguments but the first from
    the CPU caches (see :class:`TimingPolicy`); the default times hot, as before.
    """
    if number < 1 or repeat < 1:
        raise ValueError(f"number and repeat must be >= 1, got number={number}, repeat={repeat}")
    policy = TimingPolicy(number=number, repeat=repeat, cache_flush=cache_flush)
    device = device or tvm.cpu()
    module = executable.jit() if hasattr(executable, "jit") else executable
    module[func_name](*args)
    results_ms = np.asarray(policy.time(module, func_name, device, args))
    return Timing(float(results_ms.min()), float(np.median(results_ms)), repeat, number)


def time_callable(fn: Callable[..., Any], args: Sequence[Any], *, warmup: int = 3,
                  repeat: int = 20) -> tuple[float, float]:
    """Wall-clock latency of ``fn(*args)``: ``warmup`` untimed calls, then ``repeat`` timed ones.

    Parameters
    ----------
    fn : callable
    args : sequence
        Positional arguments of every call.
    warmup : int
        Calls before timing (first-call allocation, thread-pool start-up, caches).
    repeat : int
        Timed calls, each measured on its own with ``time.perf_counter``.

    Returns
    -------
    tuple of float
        ``(min_ms, median_ms)``.
    """
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be a positive int, got {repeat!r}")
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - start) * 1e3)
    return min(times), statistics.median(times)


def quiet_tvm_pool() -> None:
    """Make TVM's thread pool stop polling soon after each call (``TVM_THREAD_POOL_SPIN_COUNT``
    = :data:`alt_tvm.deploy.model.POOL_SPIN_COUNT`) unless the user set it, for timing TVM
    beside another runtime in one process.

    TVM's pool reads the variable when it starts (its first parallel kernel), so call this
    before. With TVM's own default (300000 polls) a worker keeps its core long after a model
    call, and ONNX Runtime, timed next, runs slower; not polling at all (0) slows alt-tvm
    instead (a sleeping worker is woken for every kernel). The short poll alt-tvm's build
    sets anyway (:func:`alt_tvm.deploy.model.use_runtime_threads`, whose constant records the
    measurement) does neither.
    """
    from alt_tvm.deploy.model import POOL_SPIN_COUNT

    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(POOL_SPIN_COUNT))


def round_order(count: int, round_index: int) -> list[int]:
    """Indices ``0..count-1`` in the order round ``round_index`` runs them: the rows of a
    Williams design (Williams 1949), a Latin square in which, over ``count`` rounds (``2 *
    count`` for an odd count), every runner goes first once and follows every other runner
    equally often. A runner's turn can pay for what the one before left behind (another
    runtime's pool still awake, its data in the caches); a plain rotation always puts the same
    runner before it, so a fixed share of that cost falls on one runner only."""
    if count < 1 or round_index < 0:
        raise ValueError(f"round_order needs count >= 1 and round_index >= 0, got {count}, {round_index}")
    # 0, 1, n-1, 2, n-2, ...: neighbours differ by 1, -2, 3, -4, ... (each difference once mod n)
    base = [0] + [(k + 1) // 2 if k % 2 else count - k // 2 for k in range(1, count)]
    order = [(i + round_index) % count for i in base]
    return order[::-1] if count % 2 and (round_index // count) % 2 else order


def run_interleaved(count: int, *, rounds: int, run: Callable[[int], Any]) -> list[list[Any]]:
    """``run(i)`` for each of ``count`` runners in ``rounds`` rounds, in the orders of
    :func:`round_order`; per runner, its results in round order. The one interleaving
    loop of every comparison here (timings, profiles, A/B builds)."""
    results: list[list[Any]] = [[] for _ in range(count)]
    for r in range(rounds):
        for i in round_order(count, r):
            results[i].append(run(i))
    return results


def balanced_rounds(count: int, rounds: int) -> int:
    """The fewest rounds, at least ``rounds``, that complete :func:`round_order`'s design for
    ``count`` runners: a multiple of ``count`` for an even count, of ``2 * count`` for an odd one.

    Stopped short of that, some runner follows another more often than the rest do. Two loads
    of one model timed beside ONNX Runtime and OpenVINO in 9 rounds (the second load follows
    the first in rounds 1, 5 and 9, in the others an other runtime) read 0.98-0.99x apart in
    two runs, in 8 rounds 0.99-1.00x."""
    if count < 1 or rounds < 1:
        raise ValueError(f"balanced_rounds needs count >= 1 and rounds >= 1, got {count}, {rounds}")
    cycle = 1 if count == 1 else count if count % 2 == 0 else 2 * count
    return -(-rounds // cycle) * cycle


def time_interleaved(runners: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]], *, rounds: int = 7,
                     repeat: int = 10, warmup: int = 3, pause_s: float = 0.02) -> dict[str, tuple[float, list[float]]]:
    """Time several runners in interleaved rounds, so drifts of the machine's load hit all alike.

    Each round times every runner once (``repeat`` calls, their median), starting with a
    different runner each round; the result per runner is the median over the rounds. The
    rounds complete the order's design (:func:`balanced_rounds`), so every runner follows every
    other equally often.
    Each turn starts with a pause of ``pause_s`` and one untimed call, so no runner pays
    for the caches or the threads another left behind. That is not enough next to a TVM
    model whose pool spins: its worker keeps ONNX Runtime's threads off its core. Run such
    comparisons with :func:`quiet_tvm_pool` set before TVM's first parallel kernel.

    Parameters
    ----------
    runners
        Label -> (callable, its positional arguments).
    rounds, repeat, warmup
        Rounds at least (rounded up by :func:`balanced_rounds`); timed calls per runner and
        round; untimed calls per runner before round 1.
    pause_s
        Seconds of sleep before each runner's turn.

    Returns
    -------
    dict
        Label -> (median over rounds in ms, the rounds' medians).
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    labels = list(runners)
    for label in labels:
        fn, args = runners[label]
        for _ in range(warmup):
            fn(*args)
    def one(i: int) -> float:
        fn, args = runners[labels[i]]
        time.sleep(pause_s)
        return time_callable(fn, args, warmup=1, repeat=repeat)[1]

    samples = run_interleaved(len(labels), rounds=balanced_rounds(len(labels), rounds), run=one)
    return {label: (statistics.median(values), values) for label, values in zip(labels, samples)}
