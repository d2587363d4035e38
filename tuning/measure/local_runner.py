"""The local runner: times built kernels on this machine, each in a worker process."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import tvm

from alt_tvm.bench.timing import TimingPolicy, check_cache_flush
from alt_tvm.target import process_cores

from .base import (
    _DEVICES,
    ArgSpec,
    BuildResult,
    ErrorCode,
    MeasureInput,
    MeasureResult,
    Runner,
    _check_timing,
    _format_exception,
    _positive,
    _time_module,
    argument_specs,
)
from .pool import _Status, _WorkerPool

__all__ = ["LocalRunner"]


def _run_task(
    artifact_path: str, func_name: str, specs: tuple[ArgSpec, ...], device: str, timing: TimingPolicy, seed: int,
    threads: int,
) -> tuple:
    """In a worker: load, warm up and time a kernel; ("ok", [ms, ...], s) or ("error", message, s)."""
    started = time.perf_counter()
    _use_threads(threads)
    try:
        module = tvm.runtime.load_module(artifact_path)
    except Exception as err:  # noqa: BLE001 - reported as RUN_ERROR
        return ("error", "cannot load the kernel: " + _format_exception(err), time.perf_counter() - started)
    try:
        latencies = _time_module(module, func_name, tvm.device(device, 0), specs, timing, seed)
        return ("ok", latencies, time.perf_counter() - started)
    except Exception as err:  # noqa: BLE001 - reported as RUN_ERROR
        return ("error", _format_exception(err), time.perf_counter() - started)


def _use_threads(threads: int) -> None:
    """In a worker: make TVM's thread pool run ``threads`` threads, as the model does.

    The pool reads ``TVM_NUM_THREADS`` once, when it starts: here, on the worker's first
    task, before any kernel ran. The worker inherited the parent's environment when it
    started, which may predate the parent's own setting or lack it (TVM's default is then
    half the logical CPUs on x86, not the model's count). Like the model's, the pool runs
    no more threads than this machine has cores.
    """
    os.environ["TVM_NUM_THREADS"] = str(threads)


def _model_threads(num_cores: int) -> int:
    """Threads TVM's pool runs when a model built for ``num_cores`` cores runs in this process.

    As ``alt_tvm.deploy.model.use_runtime_threads`` sets it: ``TVM_NUM_THREADS``, else
    ``OMP_NUM_THREADS`` (read like TVM's runtime: ``atoi``, at least 1), else ``num_cores``.
    """
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name)
        if value is not None:
            match = re.match(r"\s*[+-]?\d+", value)
            return max(int(match.group()) if match else 0, 1)
    return num_cores


class LocalRunner(Runner):
    """Times built kernels on this machine, each in a worker process.

    Kernels run as in the built model: on a CPU each timed call starts with every argument
    but the first evicted from the caches (``cache_flush``), and TVM's thread pool in the
    workers runs as many threads as the model's (``num_cores``).

    Parameters
    ----------
    number : int
        Calls per timed repeat (their mean is one latency).
    repeat : int
        Latencies per candidate.
    min_repeat_ms : int
        Minimum duration of one repeat; ``number`` grows until it is reached (0: off). Only
        with ``cache_flush=False``.
    cache_flush : bool
        Flush the CPU caches before every timed call (see :class:`~alt_tvm.bench.timing.TimingPolicy`:
        the weights are cold, as in the model); False: time on hot caches. Does not apply
        to ``device="cuda"``.
    num_cores : int, optional
        Cores of the target the kernels were built for (``HardwareTarget.num_cores``); the
        workers run TVM's pool with as many threads as the built model will
        (``alt_tvm.deploy.model.use_runtime_threads``): this process's ``TVM_NUM_THREADS`` or
        ``OMP_NUM_THREADS`` when the workers start, else ``num_cores``. Default: the cores
        this process may run on.
    timeout_s : float
        Limit per candidate (load + warm-up + timing), else ``RUN_TIMEOUT``.
    n_parallel : int
        Candidates timed at once (1 unless the machine has cores to spare: parallel runs
        disturb each other's timings).
    device : {"cpu", "cuda"}
        Device the kernels run on.
    seed : int
        Seed of the random inputs (the same for every candidate).
    """

    def __init__(
        self,
        *,
        number: int = 10,
        repeat: int = 3,
        min_repeat_ms: int = 0,
        timeout_s: float = 30.0,
        n_parallel: int = 1,
        device: str = "cpu",
        seed: int = 0,
        cache_flush: bool = True,
        num_cores: int | None = None,
    ) -> None:
        check_cache_flush(cache_flush)
        self.timing = TimingPolicy(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms, cache_flush=cache_flush)
        _check_timing(timeout_s, n_parallel)
        if device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if num_cores is not None:
            _positive("num_cores", num_cores, integer=True)
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms
        self.cache_flush, self.num_cores = cache_flush, num_cores
        self.timeout_s, self.n_parallel, self.device, self.seed = float(timeout_s), n_parallel, device, seed
        self._pool: _WorkerPool | None = None
        self._pool_lock = threading.Lock()
        self._threads: int | None = None
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads of TVM's pool in the workers (fixed at the first :meth:`run`)."""
        if self._threads is not None:
            return self._threads
        return _model_threads(self.num_cores if self.num_cores is not None else process_cores())

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[MeasureResult]:
        """Time every built input in a worker process (see :meth:`Runner.run`)."""
        if self._closed:
            raise ValueError("LocalRunner is closed")
        self._check_batch(inputs, builds)
        self._threads = self.threads  # from now on fixed: the workers' pools keep their size
        results: list[MeasureResult | None] = [None if b.ok else self._from_failed_build(b) for b in builds]
        todo = [i for i, r in enumerate(results) if r is None]
        tasks = []
        for i in list(todo):
            try:
                specs = argument_specs(inputs[i].func)
            except ValueError as err:
                results[i] = MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=str(err),
                                           build_s=builds[i].build_s)
                todo.remove(i)
                continue
            tasks.append((builds[i].artifact_path, inputs[i].func_name, specs, self.device, self.timing, self.seed,
                          self.threads))
        if tasks:
            with self._pool_lock:  # batches may come from several threads (a pipelined measure)
                if self._pool is None:
                    self._pool = _WorkerPool(self.n_parallel)
            outcomes = self._pool.map(_run_task, tasks, timeout_s=self.timeout_s)
            for i, (status, value, seconds) in zip(todo, outcomes):
                results[i] = _run_result(status, value, seconds, builds[i].build_s, self.timeout_s)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the worker processes."""
        if not self._closed:
            self._closed = True
            if self._pool is not None:
                self._pool.close()


def _run_result(status: _Status, value: Any, seconds: float, build_s: float, timeout_s: float) -> MeasureResult:
    if status is _Status.TIMEOUT:
        return MeasureResult(error_code=ErrorCode.RUN_TIMEOUT, error_msg=f"run exceeded {timeout_s:g} s",
                             build_s=build_s, run_s=seconds)
    if status is _Status.CRASH:
        return MeasureResult(error_code=ErrorCode.RUN_ERROR,
                             error_msg="the runner process died (the kernel crashed, e.g. a segfault)",
                             build_s=build_s, run_s=seconds)
    if status is _Status.ERROR:
        return MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=_format_exception(value), build_s=build_s,
                             run_s=seconds)
    if value[0] != "ok":
        return MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=value[1], build_s=build_s, run_s=value[2])
    return MeasureResult(latencies_ms=tuple(value[1]), build_s=build_s, run_s=value[2])
