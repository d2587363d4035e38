"""The machine's ceilings that kernels are read against: FP32 FMA peak and memory bandwidth."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm

__all__ = ["PeakReadings", "measure_memory_bandwidth", "measure_peak_gflops"]


def measure_peak_gflops(*, threads: int, target=None, accumulators: int = 12, lanes: int | None = None,
                        steps: int = 65536, passes: int = 16, repeat: int = 7) -> float:
    """Measured FP32 FMA throughput of this machine with ``threads`` parallel workers.

    Each worker keeps ``accumulators`` vectors in registers and multiply-adds a broadcast
    scalar into all of them, ``passes`` times over ``steps`` scalars, so the loop is bound by
    FMA issue, not memory. The best of ``repeat`` runs is returned: the ceiling that kernels
    are reported against. The TVM runtime's own thread pool runs it, so ``TVM_NUM_THREADS``
    must allow ``threads``. ``passes`` makes a run long enough (about ``passes`` times 0.1 ms
    on two cores) for every worker to join: with one pass, two readings of nine came out at the
    1-thread peak. A shared host can also take a core away for longer than any run, so a
    benchmark reads the peak more than once (:class:`PeakReadings`).

    Raises
    ------
    ValueError
        If ``threads < 1``, or TVM's thread pool has fewer than ``threads`` workers (its
        default is one per *physical* core guess, e.g. 1 on a 2-vCPU machine): the
        measurement would silently report the throughput of fewer threads.
    """
    from alt_tvm.facts import fma_arguments, fma_kernel
    from alt_tvm.target import host

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    _check_pool(threads)
    machine = host()
    lanes = lanes or machine.vector_lanes("float32")
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    module, lanes_per_call = fma_kernel(threads=threads, accumulators=accumulators, lanes=lanes, steps=steps,
                                        passes=passes, target=target or machine.to_tvm())
    args = fma_arguments(threads=threads, accumulators=accumulators, lanes=lanes, steps=steps)
    module["main"](*args)
    result = module.time_evaluator("main", tvm.cpu(), number=10, repeat=repeat)(*args)
    return 2.0 * lanes_per_call / min(result.results) / 1e9


@dataclass
class PeakReadings:
    """The FP32 FMA peak of one run: the best of the readings taken through it.

    A reading lasts milliseconds, and a shared host can take a core away for seconds, so one
    reading may show the peak of fewer threads. Kernels are read against the ceiling, so a
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
