"""How many threads a model call uses, chosen from the latencies the calls see.

TVM's thread pool splits every parallel loop statically, one block per thread, and each
parallel kernel ends in a barrier. When another process holds one of the cores, the OS
deschedules one of the model's threads for whole time slices, and every kernel waits for
it: on 2 cores with one busy process, ResNet-18 takes 108 ms instead of 26 ms with two
threads, while one thread (on the free core) takes 49 ms quiet or busy (the load benchmark,
``docs/shared_machine.md``).

:class:`ThreadGovernor` watches each call's wall time. While the latency with all threads
stays near the best seen, nothing changes (a quiet machine pays nothing but the clock
reads). When most of the latest calls take ``slack`` times that best, it runs a few calls
on one thread, and keeps one thread if that is faster; every ``retry_s`` it tries all
threads again and returns to them once they are faster. TVM's ``runtime.config_threadpool``
changes the pool's thread count between calls (about 20 us); the parallel loops then run in
fewer, larger blocks, so the code is the same.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ThreadGovernor", "ThreadPolicy", "set_tvm_pool_threads", "tvm_pool_threads"]


@dataclass(frozen=True)
class ThreadPolicy:
    """When :class:`ThreadGovernor` leaves all threads for one, and when it comes back.

    Attributes
    ----------
    slack
        When the median of the latest ``samples`` calls on all threads is this many times
        the best seen, a one-thread trial starts (not before ``4 * samples`` calls on all
        threads: a model's first calls are slow).
    retry_s
        Seconds between trials of all threads while running on one.
    forget_s
        The best latency seen is forgotten after this long (the machine or input may change).
    samples
        Calls counted per trial and per retry (after one uncounted call). A trial's median
        is compared with the median of the latest ``4 * samples`` calls on all threads, a
        retry's with the latest ``samples`` calls on one thread.
    """

    slack: float = 1.3
    retry_s: float = 0.5
    forget_s: float = 30.0
    samples: int = 3

    def __post_init__(self) -> None:
        if not (isinstance(self.slack, (int, float)) and self.slack > 1.0):
            raise ValueError(f"slack must be a number > 1, got {self.slack!r}")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"samples must be an int >= 1, got {self.samples!r}")
        for name in ("retry_s", "forget_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")


class ThreadGovernor:
    """Chooses each call's thread count: all ``cores`` while they pay, else one (see the module doc).

    States: ``"all"`` (all threads), ``"trial"`` (``samples`` calls on one thread once the
    latest calls slowed down), ``"one"`` (one thread), ``"retry"`` (``samples`` calls on all threads
    while on one). A switch compares medians of several calls on each side: under load,
    single calls on all threads vary several-fold.

    Parameters
    ----------
    cores
        The threads the model's kernels were built for.
    policy
        When to switch.
    set_threads, get_threads
        Set and read the thread count of the calling thread's pool (default: TVM's
        ``runtime.config_threadpool`` and ``runtime.NumThreads``; another model in the
        process may have changed it since); replaced in tests.
    clock
        Seconds, monotonic (default ``time.perf_counter``).
    """

    def __init__(self, cores: int, *, policy: ThreadPolicy = ThreadPolicy(),
                 set_threads: Callable[[int], None] | None = None, get_threads: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"cores must be an int >= 1, got {cores!r}")
        self.cores, self.policy, self._clock = cores, policy, clock
        self._set = set_threads or set_tvm_pool_threads
        self._get = get_threads or tvm_pool_threads
        self.state = "all"
        self._best, self._best_at = math.inf, -math.inf  # best latency on all threads, and when
        # latest latencies on all threads: a trial is judged against more than the slow ones that started it
        self._all: deque[float] = deque(maxlen=4 * policy.samples)
        self._one: deque[float] = deque(maxlen=policy.samples)  # latest latencies on one thread
        self._left = 0  # calls left in a trial or retry
        self._no_trial_until = -math.inf
        self._next_retry = math.inf
        self.switches = 0  # thread-count changes so far

    @property
    def threads(self) -> int:
        """The thread count of the next call."""
        return 1 if self.state in ("trial", "one") else self.cores

    def before_call(self) -> None:
        """Apply the thread count chosen for this call."""
        if self.cores > 1 and self._get() != self.threads:
            self._set(self.threads)
            self.switches += 1

    def _enter(self, state: str) -> None:
        # One call more than the samples: the first after a switch is not counted (the pool
        # has just re-pinned its threads, and its caches are cold).
        self.state, self._left = state, self.policy.samples + 1

    def after_call(self, seconds: float) -> None:
        """Record the call's wall time (seconds) and choose the next call's thread count."""
        if self.cores == 1:
            return
        now = self._clock()
        if self.state in ("trial", "retry") and self._left == self.policy.samples + 1:
            self._left -= 1  # the first call after the switch
            return
        if self.state in ("all", "retry"):
            self._all.append(seconds)
            if now - self._best_at > self.policy.forget_s:
                self._best = math.inf
            if seconds <= self._best:
                self._best, self._best_at = seconds, now
        else:
            self._one.append(seconds)
        if self.state == "all":
            # Not before a full window: a model's first calls are slow (page faults, cold caches,
            # the pool starting), and a trial judged against them kept one thread on a quiet machine.
            recent = list(self._all)[-self.policy.samples:]
            slowed = (len(self._all) == self._all.maxlen
                      and statistics.median(recent) > self.policy.slack * self._best)
            if slowed and now >= self._no_trial_until:
                self._enter("trial")
            return
        self._left -= 1
        if self.state == "one":
            if now >= self._next_retry:
                self._enter("retry")
        elif self._left > 0:
            return  # the trial or retry goes on
        elif self.state == "trial":
            if statistics.median(self._one) < statistics.median(self._all):
                self.state, self._next_retry = "one", now + self.policy.retry_s
            else:  # one thread is no better: back, and no new trial for a while
                self.state, self._no_trial_until = "all", now + self.policy.retry_s
        elif statistics.median(list(self._all)[-self.policy.samples:]) < statistics.median(self._one):
            # retry: all threads pay again
            self.state = "all"
        else:
            self.state, self._next_retry = "one", now + self.policy.retry_s


def tvm_pool_threads() -> int:
    """The thread count of TVM's thread pool."""
    from .runtime import ffi

    return int(ffi().get_global_func("runtime.NumThreads")())


def set_tvm_pool_threads(threads: int) -> None:
    """Make TVM's thread pool run ``threads`` threads."""
    from .runtime import ffi

    # mode 1: TVM's "big cores" (all cores on a homogeneous CPU); the count caps it.
    ffi().get_global_func("runtime.config_threadpool")(1, threads)
