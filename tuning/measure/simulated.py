"""A builder and a runner that only sleep: boards simulated, for sizing a fleet and for tests.

They let the scheduling of a batch (parallel builds, runs on several boards, lost boards)
be timed on any machine: a build takes ``build_s`` seconds of sleep, a run ``run_s`` on the
first free simulated board, so the result depends on the scheduling alone, not on this
machine's cores. Nothing is compiled or timed: the latency a run reports is a
deterministic function of the candidate, meaningless as a kernel's speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from .base import Builder, BuildResult, ErrorCode, MeasureInput, MeasureResult, Runner

__all__ = ["SleepBuilder", "SleepRunner"]


class SleepBuilder(Builder):
    """Builds nothing: sleeps ``build_s`` per candidate; ``most`` is the most builds seen at once."""

    def __init__(self, build_s: float) -> None:
        if not build_s >= 0:
            raise ValueError(f"build_s must be a number of seconds >= 0, got {build_s!r}")
        self.build_s, self.active, self.most = float(build_s), 0, 0
        self._lock = threading.Lock()

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.build_s * len(inputs))
        with self._lock:
            self.active -= 1
        return [BuildResult("/nonexistent.so", build_s=self.build_s) for _ in inputs]


class SleepRunner(Runner):
    """``boards`` simulated boards named ``sim:<i>``: a run sleeps ``run_s`` on the first free one.

    ``lose`` lists run numbers (0-based, in start order) whose board is lost mid-run: they
    report ``RPC_ERROR``, as :class:`~alt_tvm.tuning.measure.RPCRunner` does for a lost board.
    """

    def __init__(self, boards: int, run_s: float, lose: Sequence[int] = ()) -> None:
        if isinstance(boards, bool) or not isinstance(boards, int) or boards < 1:
            raise ValueError(f"boards must be an int >= 1, got {boards!r}")
        if not run_s >= 0:
            raise ValueError(f"run_s must be a number of seconds >= 0, got {run_s!r}")
        self.free = list(range(boards))
        self.run_s, self.lose, self.started = float(run_s), set(lose), 0
        self._ready = threading.Condition()

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[MeasureResult]:
        results = []
        for item, build in zip(inputs, builds):
            with self._ready:
                while not self.free:
                    self._ready.wait()
                board, number = self.free.pop(0), self.started
                self.started += 1
            time.sleep(self.run_s)
            with self._ready:
                self.free.append(board)
                self._ready.notify()
            name = f"sim:{board}"
            if number in self.lose:
                results.append(MeasureResult(error_code=ErrorCode.RPC_ERROR, error_msg="remote: connection lost",
                                             board=name))
                continue
            latency = 1.0 + len(repr(item.candidate.get("params"))) % 7 / 10
            results.append(MeasureResult(latencies_ms=(latency,), board=name, build_s=build.build_s,
                                         run_s=self.run_s))
        return results
