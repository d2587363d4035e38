"""The contract every peer runtime meets: a :class:`Runner`.

A runner is a callable on NumPy arrays (the model inputs, in order) returning a list of
NumPy arrays (the outputs, in order), so the timing loops treat every runtime alike and
every timing includes the same host-side conversions. It names itself and says how many
threads it runs on: a fair comparison gives every runner the same count.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Runner", "check_threads"]


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
