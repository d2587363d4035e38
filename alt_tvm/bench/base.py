"""The contract every peer runtime meets: a :class:`Runner`.

A runner is a callable on NumPy arrays (the model inputs, in order) returning a list of
NumPy arrays (the outputs, in order), so the timing loops treat every runtime alike and
every timing includes the same host-side conversions. It names itself and says how many
threads it runs on: a fair comparison gives every runner the same count.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Runner", "check_threads", "process_affinity"]


@runtime_checkable
class Runner(Protocol):
    """A model run by one runtime.

    Attributes
    ----------
    name : str
        The runtime's label in tables and results (``"onnxruntime"``, ``"openvino"``, ...).
    threads : int
        Threads the runtime computes on.
    """

    name: str
    threads: int

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """The model's outputs on ``arrays``."""
        ...


def check_threads(threads: Any) -> int:
    """``threads`` if it is an int >= 1.

    Raises
    ------
    ValueError
        Naming ``threads`` otherwise.
    """
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    return threads


@contextlib.contextmanager
def process_affinity() -> Iterator[None]:
    """Let the calling thread run on every CPU of the process while a peer runtime starts.

    Once a TVM kernel has run, TVM's pool may have pinned the calling thread to one core;
    a runtime started on that thread sizes its threads by, and creates them with, that one
    core's mask (OpenVINO then runs one inference thread, ONNX Runtime two threads on one
    core). The thread's own mask is restored afterwards.
    """
    from alt_tvm.target import _AFFINITY_AT_IMPORT

    try:
        own = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        yield
        return
    wide = set(_AFFINITY_AT_IMPORT) | set(own)
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            wide |= os.sched_getaffinity(int(task))
    try:
        os.sched_setaffinity(0, wide)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)
