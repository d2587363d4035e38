"""Measuring a batch of candidates at once: parallel builds, every board busy, results as they finish.

The tuner hands a round's top-k candidates over as one batch. :class:`PipelinedMeasure`
lowers them, builds each in its own worker (``build_workers`` at a time) and hands each
built kernel to a runner as soon as it is built, ``boards`` runs at a time (for an RPC
runner: one session per board the tracker holds for the key), so builds overlap with runs
and with each other. Results come back to the caller one by one, as each finishes, in the
caller's thread (the tuner writes each to its log at once: a batch interrupted half-way
leaves the finished half in the log, and a resumed run measures only the other half).

A transient failure (a board that died or hung, see
:func:`~alt_tvm.tuning.measure.is_transient`) is measured once more on whichever board the
runner gets next; the failed attempt is reported with the outcome, so the log keeps it.
This follows MetaSchedule's builder/runner split with ``max_workers`` (Chen et al., TVM,
§5.3 "distributed device pool"; Zheng et al., Ansor, §6 measurer), with runs started as
their builds finish rather than after the whole batch is built.
"""

from __future__ import annotations

import collections
import math
import queue
import statistics
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import tvm

from .measure import Builder, ErrorCode, MeasureInput, MeasureResult, Runner, is_transient
from .task import Task

__all__ = ["Attempt", "Outcome", "PipelinedMeasure"]


@dataclass(frozen=True)
class Attempt:
    """A transient failure that was measured again (kept for the log)."""

    error_code: str
    error_msg: str
    board: str = ""
    build_s: float = 0.0
    run_s: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """The final measurement of one candidate of a batch.

    ``latency_ms`` is the median of the runner's repeats (``inf`` on failure, with
    ``error_code`` the :class:`~alt_tvm.tuning.measure.ErrorCode` name); ``retried`` holds the
    transient failures measured again before this outcome.
    """

    latency_ms: float
    error_code: str | None = None
    error_msg: str = ""
    board: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    retried: tuple[Attempt, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error_code is None

    @classmethod
    def from_result(cls, result: MeasureResult, retried: Sequence[Attempt] = ()) -> Outcome:
        return cls(result.median_ms, None if result.ok else result.error_code.name, result.error_msg,
                   result.board, result.build_s, result.run_s, tuple(retried))


@dataclass
class FleetStats:
    """What a :class:`PipelinedMeasure` did so far: per board, and the build and run rates."""

    ran: collections.Counter = field(default_factory=collections.Counter)  # board -> candidates timed
    failed: collections.Counter = field(default_factory=collections.Counter)  # board -> transient failures
    build_s: list[float] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)


class PipelinedMeasure:
    """Build a batch in parallel and run it on every board at once; a measure function for the tuner.

    Parameters
    ----------
    builder
        Builds one candidate per call (e.g. :class:`~alt_tvm.tuning.measure.LocalBuilder`
        with ``n_parallel`` >= ``build_workers``).
    runner
        Times built candidates (e.g. :class:`~alt_tvm.tuning.measure.RPCRunner` with
        ``n_parallel`` >= ``boards``).
    build_workers
        Candidates built at once.
    boards
        Candidates run at once: the boards that can time them in parallel (1 for this
        machine's CPU, where parallel runs disturb each other).
    retries
        Times a transiently failed candidate is measured again (0: never).
    overlap
        Start each run as soon as its build is done (True), or only once the whole batch
        is built (False: on a machine that both builds and times, a build beside a timed
        run disturbs the timing).

    Calling the object measures one candidate (``measure(task, params) -> ms``, raising
    ``RuntimeError("<ErrorCode name>: ...")`` on failure), so it also serves where the
    tuner measures one at a time; :meth:`measure_batch` is the batched form.
    """

    def __init__(self, *, builder: Builder, runner: Runner, build_workers: int = 1, boards: int = 1,
                 retries: int = 1, overlap: bool = True) -> None:
        for name, value, low in (("build_workers", build_workers, 1), ("boards", boards, 1), ("retries", retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.builder, self.runner = builder, runner
        self.build_workers, self.boards, self.retries = build_workers, boards, retries
        self.overlap = bool(overlap)
        self.stats = FleetStats()
        self._builds = ThreadPoolExecutor(max_workers=build_workers, thread_name_prefix="alt_tvm_build")
        self._runs = ThreadPoolExecutor(max_workers=boards, thread_name_prefix="alt_tvm_run")
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ measuring
    def __call__(self, task: Task, params: dict[str, Any]) -> float:
        ((_, outcome),) = list(self.measure_batch(task, [params]))
        if not outcome.ok:
            raise RuntimeError(f"{outcome.error_code}: {outcome.error_msg}")
        return outcome.latency_ms

    def measure_batch(self, task: Task, batch: Sequence[dict[str, Any]]) -> Iterator[tuple[int, Outcome]]:
        """Measure every point of ``batch``; yields ``(index in batch, Outcome)`` as each finishes.

        Every point is yielded exactly once, in the caller's thread. Closing the iterator
        early (an interrupted tuner) stops handing out work; runs already started finish
        in the background.
        """
        done: queue.SimpleQueue[tuple[int, Outcome]] = queue.SimpleQueue()
        stop = threading.Event()
        built = _Built(len(batch))
        for index, params in enumerate(batch):
            self._builds.submit(self._build_then_run, task, index, params, done, stop, built)
        try:
            for _ in range(len(batch)):
                yield done.get()
        finally:
            stop.set()

    def _build_then_run(self, task: Task, index: int, params: dict[str, Any], done: queue.SimpleQueue,
                        stop: threading.Event, built: _Built) -> None:
        runs = []
        if not stop.is_set():
            stage = "lowering"
            try:
                item = _measure_input(task, params)
                stage = "building"
                (build,) = self.builder.build([item])
            except Exception as err:  # noqa: BLE001 - the candidate's own failure (or a builder that raised)
                message = f"{stage} failed: {type(err).__name__}: {err}"
                done.put((index, Outcome(math.inf, ErrorCode.BUILD_ERROR.name, message)))
            else:
                if build.ok:
                    with self._lock:
                        self.stats.build_s.append(build.build_s)
                runs.append((item, build, index))
        for item, build, index in runs if self.overlap else built.add(runs):
            self._runs.submit(self._run, item, build, index, done, stop, [])

    def _run(self, item: MeasureInput, build: Any, index: int, done: queue.SimpleQueue, stop: threading.Event,
             retried: list[Attempt]) -> None:
        try:
            (result,) = self.runner.run([item], [build])
        except Exception as err:  # noqa: BLE001 - a runner must not raise; if it does, report it
            result = MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=f"{type(err).__name__}: {err}",
                                   build_s=build.build_s)
        transient = not result.ok and is_transient(result.error_code, result.error_msg)
        with self._lock:
            if result.ok:
                self.stats.ran[result.board] += 1
                self.stats.run_s.append(result.run_s)
            elif transient:
                self.stats.failed[result.board] += 1
        if transient and len(retried) < self.retries and not stop.is_set():
            retried.append(Attempt(result.error_code.name, result.error_msg, result.board, result.build_s,
                                   result.run_s))
            self._runs.submit(self._run, item, build, index, done, stop, retried)
            return
        done.put((index, Outcome.from_result(result, retried)))

    # ------------------------------------------------------------------ sizing
    def expected_wall_s(self, trials: int) -> float | None:
        """Expected wall time of ``trials`` more measurements at the rates seen so far (None: none seen).

        In steady state builds and runs overlap, so the slower stage sets the pace: the mean
        build time over ``build_workers``, or the mean run time over ``boards``.
        """
        with self._lock:
            if not self.stats.run_s:
                return None
            build = statistics.fmean(self.stats.build_s) if self.stats.build_s else 0.0
            run = statistics.fmean(self.stats.run_s)
        return trials * max(build / self.build_workers, run / self.boards)

    def board_report(self) -> str:
        """One line per board: candidates timed, transient failures."""
        with self._lock:
            boards = sorted(set(self.stats.ran) | set(self.stats.failed))
            return "\n".join(f"{b or 'this machine'}: {self.stats.ran[b]} timed, {self.stats.failed[b]} lost"
                             for b in boards)

    def close(self) -> None:
        """Stop the thread pools and close the builder and runner."""
        self._builds.shutdown(wait=True)
        self._runs.shutdown(wait=True)
        self.builder.close()
        self.runner.close()

    def __enter__(self) -> PipelinedMeasure:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Built:
    """The builds of one batch, held until the last is done (for ``overlap=False``)."""

    def __init__(self, count: int) -> None:
        self.left, self.ready, self.lock = count, [], threading.Lock()

    def add(self, runs: list) -> list:
        """Adds one candidate's build (none if it failed); every build once the batch is built, else []."""
        with self.lock:
            self.ready.extend(runs)
            self.left -= 1
            return self.ready if self.left == 0 else []


def _measure_input(task: Task, params: dict[str, Any]) -> MeasureInput:
    lowered = task.lower(params)
    return MeasureInput(task.key, {"params": params}, tvm.IRModule({"main": lowered.func}))

