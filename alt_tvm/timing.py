"""Timing of compiled TVM functions, the same way in every benchmark."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm


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
                  func_name: str = "main", device=None) -> Timing:
    """Time ``executable`` (the result of ``tvm.compile``) on ``args`` after one warm-up call."""
    if number < 1 or repeat < 1:
        raise ValueError(f"number and repeat must be >= 1, got number={number}, repeat={repeat}")
    device = device or tvm.cpu()
    module = executable.jit() if hasattr(executable, "jit") else executable
    module[func_name](*args)
    result = module.time_evaluator(func_name, device, number=number, repeat=repeat)(*args)
    results_ms = np.asarray(result.results) * 1e3
    return Timing(float(results_ms.min()), float(np.median(results_ms)), repeat, number)


def measure_peak_gflops(*, threads: int, target=None, accumulators: int = 12, lanes: int | None = None,
                        steps: int = 65536, repeat: int = 7) -> float:
    """Measured FP32 FMA throughput of this machine with ``threads`` parallel workers.

    Each worker keeps ``accumulators`` vectors in registers and multiply-adds a broadcast
    scalar into all of them, so the loop is bound by FMA issue, not memory. The best of
    ``repeat`` runs is returned: the ceiling that kernels are reported against. The TVM
    runtime's own thread pool runs it, so ``TVM_NUM_THREADS`` must allow ``threads``.

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
    pool = int(tvm.get_global_func("runtime.NumThreads")())
    if threads > pool:
        raise ValueError(f"TVM's thread pool has {pool} thread(s), fewer than threads={threads}: set "
                         f"TVM_NUM_THREADS={threads} before TVM runs its first parallel kernel")
    machine = host()
    lanes = lanes or machine.vector_lanes("float32")
    x = te.placeholder((threads, accumulators, lanes), name="x")
    y = te.placeholder((steps,), name="y")
    k = te.reduce_axis((0, steps), "k")
    out = te.compute((threads, accumulators, lanes), lambda t, r, v: te.sum(x[t, r, v] * y[k], axis=k), name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y, out]))
    block = sch.get_sblock("out")
    t, r, v, kk = sch.get_loops(block)
    sch.reorder(t, kk, r, v)
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), t)
    sch.parallel(t)
    sch.unroll(r)
    sch.vectorize(v)
    sch.decompose_reduction(block, kk)
    module = tvm.compile(sch.mod, target=target or machine.to_tvm()).jit()
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    shapes = ((threads, accumulators, lanes), (steps,))
    args = [tvm.runtime.tensor(rng.random(s, dtype=np.float32), dev) for s in shapes]
    args.append(tvm.runtime.tensor(np.zeros((threads, accumulators, lanes), np.float32), dev))
    module["main"](*args)
    result = module.time_evaluator("main", dev, number=10, repeat=repeat)(*args)
    return 2.0 * threads * accumulators * lanes * steps / min(result.results) / 1e9
