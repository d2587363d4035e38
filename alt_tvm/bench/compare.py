"""A/B comparison of two builds of one model, timed in one process.

Two configurations of one model (two tuning logs, two build options, two artifacts written by
two versions of the code) are checked against each other on the same inputs, then timed in
interleaved rounds (:func:`~.timing.run_interleaved`): the paired ratio per round, its median,
and how many rounds ``b`` won. With ``per_kernel`` each round profiles both instead, and the
kernels whose code differs (by TIR digest, :attr:`~alt_tvm.deploy.profile.KernelInfo.digest`)
are summed apart from the rest. The rest is the same code in both builds, so its ratio is the
run's noise control: two identical builds in one process do not run alike, and a change is
read only where the changed kernels move beyond that control.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .peers import median_interval
from .timing import run_interleaved, time_callable

__all__ = ["Comparison", "changed_kernels", "compare_builds", "output_mismatch"]

#: Outputs of two builds must match within this, relative to the output's largest magnitude.
RTOL = 1e-3


def output_mismatch(want: Sequence[np.ndarray], got: Sequence[Any], *, rtol: float = RTOL) -> str | None:
    """Why ``got`` does not match ``want`` (None where it does): output count, shapes, or the
    largest error relative to each output's largest magnitude above ``rtol``."""
    if len(want) != len(got):
        return f"{len(got)} outputs instead of {len(want)}"
    for i, (a, b) in enumerate(zip(want, got)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"output {i} has shape {b.shape} instead of {a.shape}"
        scale = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-30)
        error = float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) / scale if a.size else 0.0
        if not error <= rtol:
            return f"output {i} differs by {error:.2e} of its largest magnitude (allowed {rtol:g})"
    return None


def changed_kernels(a: Any, b: Any) -> set[str] | None:
    """Kernels whose code differs between models ``a`` and ``b`` (or that one lacks), by their
    TIR digests (``model.kernel_info()``); None where a model records no digests."""
    info_a, info_b = a.kernel_info(), b.kernel_info()
    if not all(info.digest for info in [*info_a.values(), *info_b.values()]):
        return None
    return {name for name in info_a.keys() | info_b.keys()
            if name not in info_a or name not in info_b or info_a[name].digest != info_b[name].digest}


@dataclass(frozen=True)
class Comparison:
    """Two builds of one model timed interleaved.

    Attributes
    ----------
    labels : tuple of str
        The two configurations, ``(a, b)``.
    a_ms, b_ms : float
        Median over rounds of each build's time (whole model; with ``per_kernel``, the
        profiled run totals).
    b_over_a : float
        Median over rounds of the paired ratio ``b / a`` (below 1: ``b`` is faster).
    rounds_b_faster : int
        Rounds in which ``b`` was faster.
    rounds : int
    changed : tuple of str or None
        Kernels whose code differs (None: a model records no digests).
    changed_b_over_a, unchanged_b_over_a : float or None
        With ``per_kernel``: the paired ratio of the changed kernels' summed time, and of the
        rest's (the noise control); NaN where a build has none of them.
    kernels : dict
        With ``per_kernel``: kernel -> (median ms in ``a``, median ms in ``b``).
    b_over_a_interval : tuple of float or None
        :func:`~alt_tvm.bench.peers.median_interval` of the rounds' paired ratios ``b / a``
        (where it holds 1, the run does not tell the two apart).
    """

    labels: tuple[str, str]
    a_ms: float
    b_ms: float
    b_over_a: float
    rounds_b_faster: int
    rounds: int
    changed: tuple[str, ...] | None
    changed_b_over_a: float | None = None
    unchanged_b_over_a: float | None = None
    kernels: dict[str, tuple[float, float]] = field(default_factory=dict)
    b_over_a_interval: tuple[float, float] | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        interval = list(self.b_over_a_interval) if self.b_over_a_interval is not None else None
        return {"a": self.labels[0], "b": self.labels[1], "a_ms": self.a_ms, "b_ms": self.b_ms,
                "b_over_a": self.b_over_a, "b_over_a_interval": interval,
                "rounds_b_faster": self.rounds_b_faster, "rounds": self.rounds,
                "changed_kernels": list(self.changed) if self.changed is not None else None,
                "changed_b_over_a": self.changed_b_over_a, "unchanged_b_over_a": self.unchanged_b_over_a,
                "kernels": {k: list(v) for k, v in self.kernels.items()}}


def _summed(kernels: dict[str, list[float]], *, rounds: int, keep: Callable[[str], bool]) -> np.ndarray:
    return np.array([sum(samples[r] for kernel, samples in kernels.items() if keep(kernel)) for r in range(rounds)])


def _paired(top: np.ndarray, bottom: np.ndarray) -> float:
    return float(np.median(top / bottom)) if len(bottom) and bottom.all() else float("nan")


def _paired_interval(top: np.ndarray, bottom: np.ndarray) -> tuple[float, float] | None:
    return median_interval([float(r) for r in top / bottom]) if len(bottom) and bottom.all() else None


def compare_builds(a: Any, b: Any, *, labels: tuple[str, str] = ("a", "b"), arrays: Sequence[np.ndarray] | None = None,
                   rounds: int = 15, repeat: int = 10, per_kernel: bool = False, pause_s: float = 0.02,
                   rtol: float = RTOL) -> Comparison:
    """Check two builds of one model agree, then time them interleaved.

    Parameters
    ----------
    a, b : RunnableModel
        The two builds (:class:`~alt_tvm.deploy.model.RunnableModel`: built or loaded).
    labels : tuple of str
        Their names in the result.
    arrays : sequence of numpy.ndarray, optional
        The inputs (default ``a.random_inputs(seed=0)``).
    rounds, repeat : int
        Interleaved rounds; calls (profiled runs with ``per_kernel``) per build and round.
    per_kernel : bool
        Profile the kernels inside the runs and time the changed ones apart from the rest.
    pause_s : float
        Seconds of sleep before each turn.
    rtol : float
        Allowed difference of the outputs (:func:`output_mismatch`).

    Returns
    -------
    Comparison

    Raises
    ------
    ValueError
        If ``rounds`` or ``repeat`` is not an int >= 1, or the builds' outputs differ.
    """
    for name, value in (("rounds", rounds), ("repeat", repeat)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    arrays = list(arrays) if arrays is not None else a.random_inputs(seed=0)
    problem = output_mismatch(a(*arrays), b(*arrays), rtol=rtol)
    if problem is not None:
        raise ValueError(f"{labels[1]!r} does not compute what {labels[0]!r} does: {problem}")
    models = (a, b)
    changed = changed_kernels(a, b)
    if not per_kernel:
        for model in models:  # the first calls after a build or load are slower (page faults, a cold pool)
            time_callable(model, arrays, warmup=3, repeat=1)

        def turn(i: int) -> float:
            time.sleep(pause_s)
            return time_callable(models[i], arrays, warmup=1, repeat=repeat)[1]

        ta, tb = (np.array(samples) for samples in run_interleaved(2, rounds=rounds, run=turn))
        return Comparison(labels, statistics.median(ta), statistics.median(tb), _paired(tb, ta),
                          int((tb < ta).sum()), rounds, tuple(sorted(changed)) if changed is not None else None,
                          b_over_a_interval=_paired_interval(tb, ta))
    for model in models:
        model.profile(*arrays, repeat=2)
    runs = run_interleaved(2, rounds=rounds, run=lambda i: models[i].profile(*arrays, repeat=repeat))
    totals = [np.array([float(np.median(p.totals_ms)) for p in profiles]) for profiles in runs]
    kernels: list[dict[str, list[float]]] = [{}, {}]
    for side, profiles in enumerate(runs):
        for profile in profiles:
            for kernel in profile.times_ms:
                kernels[side].setdefault(kernel, []).append(profile.median(kernel))
    parts: dict[str, float | None] = {"changed": None, "unchanged": None}
    if changed is not None:
        for part, wanted in (("changed", True), ("unchanged", False)):
            keep = (lambda k, wanted=wanted: (k in changed) == wanted)  # noqa: E731
            parts[part] = _paired(_summed(kernels[1], rounds=rounds, keep=keep),
                                  _summed(kernels[0], rounds=rounds, keep=keep))
    medians = {k: (float(np.median(kernels[0].get(k, [0.0]))), float(np.median(kernels[1].get(k, [0.0]))))
               for k in sorted(kernels[0].keys() | kernels[1].keys())}
    ta, tb = totals
    return Comparison(labels, statistics.median(ta), statistics.median(tb), _paired(tb, ta), int((tb < ta).sum()),
                      rounds, tuple(sorted(changed)) if changed is not None else None, parts["changed"],
                      parts["unchanged"], medians, _paired_interval(tb, ta))


#: The build keywords a configuration of :func:`parse_config` may set, and how each value is read.
CONFIG_KEYS = ("records", "fast_math", "variant", "strategies")


def parse_config(text: str) -> dict[str, Any]:
    """A build configuration of the A/B tool from its command-line form.

    ``"default"`` (alt-tvm's untuned build), an artifact directory (``{"artifact": path}``),
    a tuning log (``{"records": path}``), or ``key=value`` pairs joined by commas, of
    :data:`CONFIG_KEYS`: ``records=LOG``, ``fast_math=true``, ``variant=NAME``,
    ``strategies=alt+sconv`` (names joined by ``+``).

    Raises
    ------
    ValueError
        Naming the bad part and what is allowed.
    """
    import os

    if text == "default":
        return {}
    if os.path.isdir(text):
        if not os.path.isfile(os.path.join(text, "model.json")):
            raise ValueError(f"{text!r} is a directory but not an artifact (no model.json)")
        return {"artifact": text}
    if os.path.isfile(text):
        return {"records": text}
    if "=" not in text:
        raise ValueError(f"configuration {text!r} is neither 'default', an artifact directory, a tuning log, "
                         f"nor key=value pairs of {', '.join(CONFIG_KEYS)}")
    config: dict[str, Any] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in CONFIG_KEYS:
            raise ValueError(f"unknown build option {key!r} in {text!r}; allowed: {', '.join(CONFIG_KEYS)}")
        if key == "fast_math":
            if value.lower() not in ("true", "false"):
                raise ValueError(f"fast_math must be true or false, got {value!r}")
            config[key] = value.lower() == "true"
        elif key == "strategies":
            config[key] = [name for name in value.split("+") if name]
        elif key == "records" and not os.path.isfile(value):
            raise ValueError(f"records: tuning log {value!r} does not exist")
        else:
            config[key] = value
    return config
