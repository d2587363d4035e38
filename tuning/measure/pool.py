"""The worker processes that builders and runners use, so a crash or hang kills a worker, not the tuner."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from queue import SimpleQueue
from typing import Any

from tvm.support.popen_pool import PopenWorker, kill_child_processes

# The parent kills a worker this long after the worker's own timeout should have fired (it
# cannot fire if a C++ call holds the GIL).
_WATCHDOG_GRACE_S = 2.0


class _Status(enum.Enum):
    OK = "ok"
    ERROR = "error"  # the task reported an exception
    TIMEOUT = "timeout"
    CRASH = "crash"  # the worker process died


class _WorkerPool:
    """``size`` TVM ``PopenWorker`` processes, each task with its own timeout.

    TVM's ``PopenPoolExecutor`` fixes one timeout per pool; the builder and runner need
    per-call limits and a parent-side watchdog, so tasks are dispatched here by hand.
    Workers start lazily (each imports TVM, seconds) and are reused; a worker that timed
    out or crashed is killed and restarted on its next task. A (re)started worker first
    runs :func:`_worker_ready` with no time limit, so its start never counts against a
    task's timeout.
    """

    def __init__(self, size: int) -> None:
        self._workers = [PopenWorker(initializer=_worker_ready) for _ in range(size)]
        self._idle: SimpleQueue[PopenWorker] = SimpleQueue()
        for worker in self._workers:
            self._idle.put(worker)
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="alt_tvm_measure")
        self._closed = False

    def map(
        self, fn: Callable[..., Any], arg_tuples: Sequence[tuple], *, timeout_s: float
    ) -> list[tuple[_Status, Any, float]]:
        """(status, value, wall seconds) of ``fn(*args)`` for each args tuple, in order."""
        if self._closed:
            raise ValueError("the worker pool is closed")
        return list(self._threads.map(lambda args: self._call(fn, args, timeout_s), arg_tuples))

    def _call(self, fn: Callable[..., Any], args: tuple, timeout_s: float) -> tuple[_Status, Any, float]:
        worker = self._idle.get()
        fired = threading.Event()

        def watchdog() -> None:
            fired.set()
            proc = worker._proc  # PopenWorker has no public handle; killing makes recv() return
            if proc is not None:
                kill_child_processes(proc.pid)
                proc.kill()

        timer = None
        started = time.perf_counter()
        try:
            worker.send(fn, args, timeout=timeout_s)  # (re)starts the worker first if needed
            started = time.perf_counter()
            timer = threading.Timer(timeout_s + _WATCHDOG_GRACE_S, watchdog)
            timer.daemon = True
            timer.start()
            status, value = _Status.OK, worker.recv()
        except TimeoutError:
            status, value = _Status.TIMEOUT, None
        except ChildProcessError as err:
            status, value = (_Status.TIMEOUT, None) if fired.is_set() else (_Status.CRASH, err)
        except Exception as err:  # noqa: BLE001 - any task failure is reported, not raised
            status, value = _Status.ERROR, err
        finally:
            if timer is not None:
                timer.cancel()
            self._idle.put(worker)
        return status, value, time.perf_counter() - started

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.kill()
        self._threads.shutdown(wait=True)


def _worker_ready() -> None:
    """Initializer of every worker: unpickling it imports this package (and TVM) up front."""
