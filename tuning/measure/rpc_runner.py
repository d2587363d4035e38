"""The RPC runner: times built kernels on remote boards reached through a ``tvm.rpc`` tracker."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import tvm

from alt_tvm.bench.timing import CACHE_FLUSH_FUNC, TimingPolicy, check_cache_flush
from alt_tvm.rpc import call_with_timeout, request_session, tracker_problem
from alt_tvm.toolchain import elf_machine

from .base import (
    _DEVICES,
    REMOTE_PREFIX,
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

__all__ = ["RPCRunner"]


class RPCRunner(Runner):
    """Times built kernels on remote devices reached through a ``tvm.rpc`` tracker.

    Each candidate gets its own session (``tracker.request(key)``): the shared object is
    uploaded, loaded and timed with ``time_evaluator`` on the remote device, with random
    inputs allocated there. Build the kernels for the board (e.g.
    ``LocalBuilder(target="kirin990")`` cross-compiles them).

    The RPC calls run in daemon threads of this process (the kernel itself runs on the
    server, so a crash there cannot kill the tuner): a call that exceeds ``timeout_s`` is
    abandoned, and the server ends its session after ``session_timeout_s``. The message of
    every failure on the tracker or the board starts with
    :data:`~alt_tvm.tuning.measure.REMOTE_PREFIX` (a remote ``RUN_TIMEOUT`` is transient:
    see :func:`~alt_tvm.tuning.measure.is_transient`).

    Parameters
    ----------
    tracker_host : str
    tracker_port : int
    key : str
        Device key the servers registered with (``rpc_server --key``).
    number, repeat, min_repeat_ms : int
        As for :class:`LocalRunner`.
    cache_flush : bool
        Flush the board's CPU caches before every timed call, as :class:`LocalRunner` does
        (see :class:`~alt_tvm.bench.timing.TimingPolicy`); False: time on hot caches. The
        server's TVM runtime must have the builtin ``cache_flush_cpu_non_first_arg`` (else
        ``RPC_ERROR``, "checking the cache flush"); TVM flushes on x86-64 and AArch64 only,
        so for kernels built for another CPU (RISC-V) a ``RuntimeWarning`` says they are
        timed hot. Does not apply to ``device="cuda"``.
    timeout_s : float
        Limit per candidate (getting a session, upload, load, warm-up, timing).
    session_timeout_s : float, optional
        Lifetime the server grants each session (default ``timeout_s + 10``): it frees the
        board from a kernel that hangs.
    connect_timeout_s : float
        Limit for reaching the tracker; an unreachable tracker gives ``RPC_ERROR`` for the
        whole batch at once.
    n_parallel : int
        Sessions at once (useful with several boards under one key).
    device : {"cpu", "cuda"}
        Remote device (``remote.cpu()`` or ``remote.cuda()``).
    seed : int
        Seed of the random inputs.
    threads : int, optional
        The thread count the kernels were built for (the target's cores). When a server's
        TVM runs fewer (its pool defaults to half the logical CPUs on x86 and cannot grow
        once started), a ``RuntimeWarning`` says to start it with ``TVM_NUM_THREADS``
        (once per runner): its kernels would be timed on fewer threads than they get.
    """

    def __init__(
        self,
        *,
        tracker_host: str,
        tracker_port: int,
        key: str,
        number: int = 10,
        repeat: int = 3,
        min_repeat_ms: int = 0,
        timeout_s: float = 30.0,
        session_timeout_s: float | None = None,
        connect_timeout_s: float = 5.0,
        n_parallel: int = 1,
        device: str = "cpu",
        seed: int = 0,
        cache_flush: bool = True,
        threads: int | None = None,
    ) -> None:
        if not isinstance(tracker_host, str) or not tracker_host:
            raise ValueError(f"tracker_host must be a non-empty str, got {tracker_host!r}")
        if isinstance(tracker_port, bool) or not isinstance(tracker_port, int) or not 0 < tracker_port < 65536:
            raise ValueError(f"tracker_port must be an int in 1..65535, got {tracker_port!r}")
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty str, got {key!r}")
        check_cache_flush(cache_flush)
        self.timing = TimingPolicy(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms, cache_flush=cache_flush)
        _check_timing(timeout_s, n_parallel)
        session_timeout_s = timeout_s + 10.0 if session_timeout_s is None else session_timeout_s
        _positive("session_timeout_s", session_timeout_s)
        _positive("connect_timeout_s", connect_timeout_s)
        if device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.tracker_host, self.tracker_port, self.key = tracker_host, tracker_port, key
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms
        self.cache_flush = cache_flush
        self._warned_hot = False  # the RuntimeWarning for a CPU TVM cannot flush is given once
        if threads is not None:
            _positive("threads", threads, integer=True)
        self.threads, self._checked_threads = threads, False
        self.timeout_s, self.session_timeout_s = float(timeout_s), float(session_timeout_s)
        self.connect_timeout_s, self.n_parallel, self.device, self.seed = (
            float(connect_timeout_s), n_parallel, device, seed)

    def check_tracker(self) -> str | None:
        """Why the tracker cannot serve this runner's key now (``None``: it can); see
        :func:`alt_tvm.rpc.tracker_problem` (``connect_timeout_s`` bounds each step)."""
        return tracker_problem(self.tracker_host, self.tracker_port, self.key, timeout_s=self.connect_timeout_s)

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[MeasureResult]:
        """Time every built input on a remote device (see :meth:`Runner.run`)."""
        self._check_batch(inputs, builds)
        results: list[MeasureResult | None] = [None if b.ok else self._from_failed_build(b) for b in builds]
        todo = [i for i, r in enumerate(results) if r is None]
        if not todo:
            return results  # type: ignore[return-value]
        problem = self.check_tracker()
        if problem is not None:
            for i in todo:
                results[i] = MeasureResult(error_code=ErrorCode.RPC_ERROR, error_msg=REMOTE_PREFIX + problem,
                                           build_s=builds[i].build_s)
            return results  # type: ignore[return-value]
        with ThreadPoolExecutor(max_workers=self.n_parallel) as pool:
            for i, result in zip(todo, pool.map(lambda i: self._run_one(inputs[i], builds[i]), todo)):
                results[i] = result
        return results  # type: ignore[return-value]

    def _run_one(self, item: MeasureInput, build: BuildResult) -> MeasureResult:
        try:
            specs = argument_specs(item.func)
        except ValueError as err:
            return MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=str(err), build_s=build.build_s)
        self._warn_if_not_flushed(build.artifact_path)
        phase = ["requesting a session"]  # updated by the worker thread, read on timeout

        board = [""]  # the server the tracker assigned, once it has

        def task() -> list[float]:
            remote, board[0] = request_session(self.tracker_host, self.tracker_port, self.key,
                                               session_timeout=self.session_timeout_s)
            dev = remote.cuda(0) if self.device == "cuda" else remote.cpu(0)
            if self.threads is not None and self.device == "cpu" and not self._checked_threads:
                self._checked_threads = True
                phase[0] = "asking the server's thread count"
                running = int(remote.get_function("runtime.NumThreads")())
                if running < self.threads:
                    warnings.warn(f"the RPC server with key {self.key!r} runs {running} TVM thread(s) for kernels "
                                  f"built for {self.threads}: they are timed on fewer threads than they get; start "
                                  f"it with TVM_NUM_THREADS={self.threads}", RuntimeWarning, stacklevel=2)
            if self.timing.flushes(dev):
                # time_evaluator looks the flush up on the server by name; check first so a
                # server without it gives a clear error (the server's fault, not the kernel's).
                phase[0] = "checking the cache flush"
                try:
                    remote.get_function(CACHE_FLUSH_FUNC)
                except AttributeError as err:
                    raise RuntimeError(f"the server's TVM runtime has no {CACHE_FLUSH_FUNC!r} to flush the CPU "
                                       f"caches before each timed call; update it, or pass cache_flush=False "
                                       f"to time on hot caches") from err
            phase[0] = "uploading"
            name = f"alt_tvm_{uuid.uuid4().hex}.so"
            remote.upload(build.artifact_path, name)
            phase[0] = "loading"
            module = remote.load_module(name)
            phase[0] = "running"
            return _time_module(module, item.func_name, dev, specs, self.timing, self.seed)

        started = time.perf_counter()
        outcome = call_with_timeout(task, self.timeout_s)
        seconds = time.perf_counter() - started
        if outcome[0] == "ok":
            return MeasureResult(latencies_ms=tuple(outcome[1]), build_s=build.build_s, run_s=seconds,
                                 board=board[0])
        if outcome[0] == "timeout":
            if phase[0] == "requesting a session":
                code, msg = ErrorCode.RPC_ERROR, f"no free server with key {self.key!r} within {self.timeout_s:g} s"
            else:
                code, msg = ErrorCode.RUN_TIMEOUT, f"{phase[0]} exceeded the {self.timeout_s:g} s limit"
            return MeasureResult(error_code=code, error_msg=REMOTE_PREFIX + msg, build_s=build.build_s,
                                 run_s=seconds, board=board[0])
        machinery = ("requesting a session", "asking the server's thread count", "checking the cache flush",
                     "uploading")
        # A lost connection while loading or running is the board's failure (it died or the
        # network did), so the candidate is measured again elsewhere; a kernel that crashes
        # its server looks the same, and the retry limits bound what it costs.
        lost = isinstance(outcome[1], OSError | tvm.error.RPCError)
        code = ErrorCode.RPC_ERROR if phase[0] in machinery or lost else ErrorCode.RUN_ERROR
        return MeasureResult(error_code=code, error_msg=f"{REMOTE_PREFIX}{phase[0]}: {_format_exception(outcome[1])}",
                             build_s=build.build_s, run_s=seconds, board=board[0])

    def _warn_if_not_flushed(self, artifact_path: str | None) -> None:
        # TVM's builtin silently does nothing on other CPUs: say so (once) rather than
        # log hot timings as flushed ones.
        if not self.cache_flush or self.device != "cpu" or self._warned_hot:
            return
        machine = elf_machine(artifact_path)
        if machine is not None and machine not in _FLUSHING_MACHINES:
            self._warned_hot = True
            warnings.warn(f"TVM's {CACHE_FLUSH_FUNC} flushes the caches of x86-64 and AArch64 CPUs only, not of "
                          f"this board's ({machine}): its kernels are timed on hot caches",
                          RuntimeWarning, stacklevel=2)


#: The CPUs whose caches TVM's flush builtin evicts.
_FLUSHING_MACHINES = ("x86_64", "aarch64")
