"""Timing of compiled TVM functions, the same way in every benchmark and in the tuner.

:class:`TimingPolicy` is the one policy the tuner's measure functions and runners time
candidates with (:func:`~alt_tvm.tuning.task.measure_in_process`, ``LocalRunner``,
``RPCRunner``): by default each timed call starts with the weights and outputs evicted
from the CPU caches, as in the model, where the layers before a kernel have evicted them.
:func:`time_compiled` times with the same code, hot by default (benchmarks of whole
kernels or models).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

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


def measure_peak_gflops(*, threads: int, target=None, accumulators: int = 12, lanes: int | None = None,
                        steps: int = 65536, passes: int = 16, repeat: int = 7) -> float:
    """Measured FP32 FMA throughput of this machine with ``threads`` parallel workers.

    Each worker keeps ``accumulators`` vectors in registers and multiply-adds a broadcast
    scalar into all of them, ``passes`` times over ``steps`` scalars, so the loop is bound by
    FMA issue, not memory. The best of ``repeat`` runs is returned: the ceiling that kernels
    are reported against. The TVM runtime's own thread pool runs it, so ``TVM_NUM_THREADS``
    must allow ``threads``. A run lasts about ``passes`` times 0.1 ms on the 2-vCPU guest:
    with one pass (0.1 ms) 2 readings of 9 came out at the 1-thread peak (the second thread
    did not join in time), with 16 passes 2 of 29. The host can also take a vCPU away for
    longer than any run, so a benchmark reads the peak more than once (:class:`PeakReadings`).

    Raises
    ------
    ValueError
        If ``threads < 1``, or TVM's thread pool has fewer than ``threads`` workers (its
        default here is one per *physical* core guess, e.g. 1 on a 2-vCPU guest): the
        measurement would silently report the throughput of fewer threads.
    """
    from tvm import te

    from alt_tvm.target import host

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    _check_pool(threads)
    machine = host()
    lanes = lanes or machine.vector_lanes("float32")
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    x = te.placeholder((threads, accumulators, lanes), name="x")
    y = te.placeholder((steps,), name="y")
    p = te.reduce_axis((0, passes), "p")
    k = te.reduce_axis((0, steps), "k")
    out = te.compute((threads, accumulators, lanes), lambda t, r, v: te.sum(x[t, r, v] * y[k], axis=[p, k]),
                     name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y, out]))
    block = sch.get_sblock("out")
    t, r, v, pp, kk = sch.get_loops(block)
    sch.reorder(t, pp, kk, r, v)
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), t)
    sch.parallel(t)
    sch.unroll(r)
    sch.vectorize(v)
    sch.decompose_reduction(block, pp)
    module = tvm.compile(sch.mod, target=target or machine.to_tvm()).jit()
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    shapes = ((threads, accumulators, lanes), (steps,))
    args = [tvm.runtime.tensor(rng.random(s, dtype=np.float32), dev) for s in shapes]
    args.append(tvm.runtime.tensor(np.zeros((threads, accumulators, lanes), np.float32), dev))
    module["main"](*args)
    result = module.time_evaluator("main", dev, number=10, repeat=repeat)(*args)
    return 2.0 * threads * accumulators * lanes * steps * passes / min(result.results) / 1e9


@dataclass
class PeakReadings:
    """The FP32 FMA peak of one run: the best of the readings taken through it.

    A reading lasts milliseconds, and a shared host can take a vCPU away for seconds: one
    profile on the 2-vCPU guest read 117 GFLOP/s on 2 threads (the 1-thread peak) where the
    readings before and after it gave 228-231. Kernels are read against the ceiling, so a
    run measures again as it goes (:meth:`measure`) and keeps the best.

    Attributes
    ----------
    threads
        Threads of every reading (:func:`measure_peak_gflops`).
    readings
        GFLOP/s of each reading so far, in order.
    """

    threads: int
    readings: list[float] = field(default_factory=list)

    def measure(self) -> float:
        """Take one more reading; returns the best so far."""
        self.readings.append(measure_peak_gflops(threads=self.threads))
        return self.best

    @property
    def best(self) -> float:
        """The highest reading (ValueError before the first)."""
        if not self.readings:
            raise ValueError("no FMA peak reading yet: call measure() first")
        return max(self.readings)

    def describe(self) -> str:
        """``"229 GFLOP/s (best of 228, 229)"``, for a run's log."""
        readings = ", ".join(f"{r:.0f}" for r in self.readings)
        return f"{self.best:.0f} GFLOP/s (best of {readings})" if len(self.readings) > 1 else f"{self.best:.0f} GFLOP/s"


def measure_memory_bandwidth(*, threads: int, target=None, megabytes: int = 64, repeat: int = 7) -> float:
    """Measured memory bandwidth (GB/s) of this machine with ``threads`` parallel workers.

    A vectorised scaled copy ``b = 2 * a`` of two ``megabytes`` float32 arrays (far beyond
    the caches), counting the bytes read and written once; the best of ``repeat`` runs.
    The ceiling that memory-bound kernels (depthwise convs, element-wise ops) are read
    against, as the FMA peak (:func:`measure_peak_gflops`) is for compute-bound ones.

    Raises
    ------
    ValueError
        If ``threads < 1`` or ``megabytes < 1``, or TVM's pool has fewer than ``threads``
        workers.
    """
    from tvm import te

    from alt_tvm.target import host

    if threads < 1 or megabytes < 1:
        raise ValueError(f"threads and megabytes must be >= 1, got threads={threads}, megabytes={megabytes}")
    _check_pool(threads)
    machine = host()
    lanes = machine.vector_lanes("float32")
    rows = megabytes * (1 << 20) // (4 * 1024)
    a = te.placeholder((rows, 1024), name="a")
    b = te.compute((rows, 1024), lambda i, j: a[i, j] * tvm.tirx.const(2.0, "float32"), name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    i, j = sch.get_loops(sch.get_sblock("b"))
    sch.parallel(i)
    sch.vectorize(sch.split(j, [None, lanes])[1])
    module = tvm.compile(sch.mod, target=target or machine.to_tvm()).jit()
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.ones((rows, 1024), np.float32), dev),
            tvm.runtime.tensor(np.zeros((rows, 1024), np.float32), dev)]
    module["main"](*args)
    result = module.time_evaluator("main", dev, number=3, repeat=repeat)(*args)
    return 2.0 * rows * 1024 * 4 / min(result.results) / 1e9


def _check_pool(threads: int) -> None:
    """A measurement with ``threads`` workers needs TVM's pool to have that many."""
    pool = int(tvm.get_global_func("runtime.NumThreads")())
    if threads > pool:
        raise ValueError(f"TVM's thread pool has {pool} thread(s), fewer than threads={threads}: set "
                         f"TVM_NUM_THREADS={threads} before TVM runs its first parallel kernel")
