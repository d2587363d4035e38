"""The CPU peers a benchmark times beside alt-tvm, and alt-tvm read against the faster of them.

The CPU peers are the runtimes a user would otherwise deploy the same ONNX file with: ONNX
Runtime (:mod:`.onnxruntime`) and OpenVINO (:mod:`.openvino`, optional). :func:`cpu_peers` makes
both with the same thread count, or says why OpenVINO is missing. On each model alt-tvm is
read against the faster of the peers timed (:func:`faster_peer`): a single peer can be the
slow one on a model, and beating it there says little. Over a run, :func:`against_faster_peer`
gives the geometric mean of those ratios and the models where alt-tvm is behind.

Every ratio is a peer's time over alt-tvm's, measured in the same interleaved rounds: above 1,
alt-tvm is faster. Given each round's times, a ratio also has an interval: the distribution-free
confidence interval of the median of the rounds' paired ratios (:func:`median_interval`). A
model whose whole interval is below 1 is behind beyond the run's noise; one behind with the
interval reaching 1 is not distinguishable from level in that run.

:class:`AtPeak` reads the same times against the run's FP32 FMA peak: each runner's share of it
on the model's convolution and matrix-product arithmetic, and the *ceiling*, the most any
runtime could be ahead of the faster peer at that peak. Where the faster peer already runs
near the peak, no kernel work moves the ratio far, and the ceiling says by how much at most.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Runner
from .onnxruntime import onnxruntime_session
from .openvino import openvino_available, openvino_session

__all__ = ["CPU_PEERS", "INTERVAL_CONFIDENCE", "AtPeak", "FasterPeer", "against_faster_peer", "cpu_peers",
           "describe_against_faster_peer", "describe_interval", "faster_peer", "median_interval"]

#: The CPU peers, in the order a tie between their times is broken.
CPU_PEERS = ("onnxruntime", "openvino")

#: The coverage :func:`median_interval` aims for (at least, where the rounds allow it).
INTERVAL_CONFIDENCE = 0.9


def cpu_peers(path: str | os.PathLike, *, threads: int,
              peers: Sequence[str] = CPU_PEERS) -> tuple[dict[str, Runner], dict[str, str]]:
    """The CPU peers' sessions on an ONNX file, all on ``threads`` threads.

    Parameters
    ----------
    path : str or os.PathLike
        The ONNX file.
    threads : int
        Threads of every peer.
    peers : sequence of str
        Which of :data:`CPU_PEERS` to make.

    Returns
    -------
    tuple of dict
        Label -> runner for the peers made, and label -> why for those skipped: OpenVINO where
        it is not installed, or where it cannot load the model (its ONNX frontend refuses
        Hugging Face EfficientNet-B0's average pool, whose window is larger than the map).

    Raises
    ------
    ValueError
        If a name is not one of :data:`CPU_PEERS`, or ``threads`` is not an int >= 1.
    Exception
        ONNX Runtime's own error where it cannot load the model: it is the reference every
        run checks against, so it is never left out.
    """
    unknown = [p for p in peers if p not in CPU_PEERS]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; known: {', '.join(CPU_PEERS)}")
    made: dict[str, Runner] = {}
    skipped: dict[str, str] = {}
    for name in peers:
        if name == "onnxruntime":
            made[name] = onnxruntime_session(path, threads=threads)
        elif why := openvino_available():
            skipped[name] = why
        else:
            try:
                made[name] = openvino_session(path, threads=threads)
            except RuntimeError as err:  # the model is one OpenVINO cannot convert or compile
                skipped[name] = str(err)
    return made, skipped


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def median_interval(values: Sequence[float], *, confidence: float = INTERVAL_CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of ``values``.

    Sorted, the ``k``-th smallest and ``k``-th largest values bound the median with probability
    ``1 - 2 P(B < k)``, ``B`` binomial with ``n = len(values)`` trials of one half, whatever the
    distribution (Conover, *Practical Nonparametric Statistics*, 3rd ed., Sec. 3.2). ``k`` is the
    largest giving at least ``confidence``; with too few values for that (fewer than 5 at 0.9),
    the interval is their whole range. Twelve rounds at 0.9: the 3rd to the 10th (96%).

    Raises
    ------
    ValueError
        If ``values`` is empty or ``confidence`` is not in (0, 1).
    """
    if not values:
        raise ValueError("median_interval needs at least one value, got none")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    ordered, n = sorted(values), len(values)
    k, below = 1, 1 / 2 ** n  # below: P(B < k)
    while k < (n + 1) // 2:
        below_next = below + math.comb(n, k) / 2 ** n
        if 1 - 2 * below_next < confidence:
            break
        k, below = k + 1, below_next
    return ordered[k - 1], ordered[n - k]


@dataclass(frozen=True)
class FasterPeer:
    """alt-tvm against the faster CPU peer on one model.

    Attributes
    ----------
    peer : str
        The faster peer's label.
    peer_ms, alt_ms : float
        Its median time and alt-tvm's.
    ratios : dict
        Every peer timed -> its time / alt-tvm's time.
    interval : tuple of float, optional
        :func:`median_interval` of the faster peer's time over alt-tvm's, round by round (None
        without the rounds' times).
    """

    peer: str
    peer_ms: float
    alt_ms: float
    ratios: dict[str, float]
    interval: tuple[float, float] | None = None

    @property
    def ratio(self) -> float:
        """The faster peer's time / alt-tvm's time (above 1: alt-tvm is faster)."""
        return self.peer_ms / self.alt_ms

    def to_json(self) -> dict[str, Any]:
        """The fields every results file uses for it."""
        fields = {"faster_peer": self.peer, "faster_peer_ms": self.peer_ms, "ratio_vs_faster_peer": self.ratio,
                  "ratios_vs_peers": dict(self.ratios)}
        if self.interval is not None:
            fields["ratio_interval"] = list(self.interval)
        return fields

    def describe(self) -> str:
        """``1.04x`` or, with its interval, ``1.04x [0.98, 1.07]``."""
        return f"{self.ratio:.2f}x{describe_interval(self.interval)}"


def describe_interval(interval: Sequence[float] | None) -> str:
    """`` [0.98, 1.07]`` for an interval (a results row's ``ratio_interval``), ``""`` for None."""
    return "" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]"


def faster_peer(*, times_ms: Mapping[str, float], alt_ms: float, peers: Sequence[str] = CPU_PEERS,
                rounds_ms: Mapping[str, Sequence[float]] | None = None,
                alt_rounds_ms: Sequence[float] | None = None) -> FasterPeer | None:
    """alt-tvm's time against the fastest of ``peers`` found in ``times_ms``.

    Parameters
    ----------
    times_ms : mapping
        Runner label -> median ms; labels that are not in ``peers`` (alt-tvm's, PyTorch's) are
        ignored.
    alt_ms : float
        alt-tvm's median ms in the same rounds.
    peers : sequence of str
        The peers' labels; on equal times the first listed is named.
    rounds_ms, alt_rounds_ms : optional
        Label -> each round's time, and alt-tvm's in the same rounds: with both, the result
        has its :attr:`FasterPeer.interval`.

    Returns
    -------
    FasterPeer or None
        None where no peer was timed.

    Raises
    ------
    ValueError
        If ``alt_ms`` or a time is not a positive finite number, or the faster peer's rounds
        and alt-tvm's differ in number.
    """
    alt_ms = _positive("alt_ms", alt_ms)
    timed = {p: _positive(f"the time of {p}", times_ms[p]) for p in peers if times_ms.get(p) is not None}
    if not timed:
        return None
    best = min(timed, key=lambda p: timed[p])  # min keeps the first of equal times
    interval = None
    peer_rounds = (rounds_ms or {}).get(best)
    if peer_rounds is not None and alt_rounds_ms is not None:
        if len(peer_rounds) != len(alt_rounds_ms) or not peer_rounds:
            raise ValueError(f"the rounds of {best} and of alt-tvm must pair up, got {len(peer_rounds)} and "
                             f"{len(alt_rounds_ms)} times")
        interval = median_interval([_positive(f"a round of {best}", p) / _positive("a round of alt-tvm", a)
                                    for p, a in zip(peer_rounds, alt_rounds_ms)])
    return FasterPeer(best, timed[best], alt_ms, {p: ms / alt_ms for p, ms in timed.items()}, interval)


@dataclass(frozen=True)
class AtPeak:
    """A model's arithmetic against the run's FP32 FMA peak.

    Attributes
    ----------
    gflop : float
        The model's convolution and matrix-product GFLOP per inference
        (:func:`alt_tvm.bench.onnx_flops.count_flops`; elementwise work is left out, so the
        time at the peak is a lower bound).
    peak_gflops : float
        The FMA peak measured in the run, on the threads the runtimes were given.
    """

    gflop: float
    peak_gflops: float

    def __post_init__(self) -> None:
        _positive("gflop", self.gflop)
        _positive("peak_gflops", self.peak_gflops)

    @property
    def floor_ms(self) -> float:
        """The time of that arithmetic at the peak."""
        return 1e3 * self.gflop / self.peak_gflops

    def share(self, ms: float) -> float:
        """The share of the peak a runtime taking ``ms`` reaches (1: at the peak)."""
        return self.floor_ms / _positive("ms", ms)

    def ceiling(self, peer_ms: float) -> float:
        """The most a runtime at the peak could be ahead of a peer taking ``peer_ms``: the peer's
        time over :attr:`floor_ms`."""
        return _positive("peer_ms", peer_ms) / self.floor_ms

    def to_json(self, against: FasterPeer) -> dict[str, Any]:
        """The fields a results row adds beside :meth:`FasterPeer.to_json`."""
        return {"gflop": self.gflop, "alt_share_of_peak": self.share(against.alt_ms),
                "peer_share_of_peak": self.share(against.peer_ms),
                "ceiling_vs_faster_peer": self.ceiling(against.peer_ms)}


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def against_faster_peer(*, ratios: Mapping[str, float], ceilings: Mapping[str, float] | None = None,
                        intervals: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """alt-tvm against the faster peer over a run's models.

    Parameters
    ----------
    ratios : mapping
        Model -> the faster peer's time / alt-tvm's time on it (:attr:`FasterPeer.ratio`).
    ceilings : mapping, optional
        Model -> :meth:`AtPeak.ceiling` of its faster peer, for the models whose arithmetic
        was counted.
    intervals : mapping, optional
        Model -> :attr:`FasterPeer.interval` ``(low, high)``, for the models timed in rounds.

    Returns
    -------
    dict
        ``models`` (count), ``geomean_ratio_vs_faster_peer`` (None without models),
        ``models_behind_faster_peer`` (count of ratios below 1) and ``behind`` (those models);
        with ``ceilings`` for every model of ``ratios``, also ``geomean_ceiling_vs_faster_peer``;
        with ``intervals`` for every model, also ``behind_beyond_noise``: the models whose whole
        interval is below 1.

    Raises
    ------
    ValueError
        If a ratio or a ceiling is not a positive finite number.
    """
    values = {model: _positive(f"the ratio of {model}", r) for model, r in ratios.items()}
    behind = [model for model, r in values.items() if r < 1]
    summary = {"models": len(values), "geomean_ratio_vs_faster_peer": _geomean(list(values.values())),
               "models_behind_faster_peer": len(behind), "behind": behind}
    ceilings = {m: _positive(f"the ceiling of {m}", c) for m, c in (ceilings or {}).items() if m in values}
    if values and len(ceilings) == len(values):
        summary["geomean_ceiling_vs_faster_peer"] = _geomean(list(ceilings.values()))
    intervals = {m: tuple(i) for m, i in (intervals or {}).items() if m in values}
    if values and len(intervals) == len(values):
        summary["behind_beyond_noise"] = [m for m in values if intervals[m][1] < 1]
    return summary


def describe_against_faster_peer(summary: Mapping[str, Any], *, what: str = "alt-tvm") -> str:
    """One line for a table's foot from :func:`against_faster_peer`'s ``summary``.

    Parameters
    ----------
    summary : mapping
        :func:`against_faster_peer`'s result.
    what : str
        The build the ratios are of.
    """
    if not summary["models"]:
        return f"{what} against the faster peer: no model timed with a peer"
    behind = summary["behind"]
    names = f" ({', '.join(behind)})" if behind else ""
    ceiling = summary.get("geomean_ceiling_vs_faster_peer")
    at_peak = f"; a runtime at the run's FP32 FMA peak: {ceiling:.2f}x" if ceiling is not None else ""
    beyond = summary.get("behind_beyond_noise")
    noise = "" if beyond is None else (f", {len(beyond)} beyond the rounds' spread (its whole interval below 1"
                                       f"{': ' + ', '.join(beyond) if beyond else ''})")
    return (f"{what} against the faster peer (peer ms / alt-tvm ms, above 1: alt-tvm faster) over "
            f"{summary['models']} model(s): geometric mean {summary['geomean_ratio_vs_faster_peer']:.2f}x, "
            f"behind on {summary['models_behind_faster_peer']}{names}{noise}{at_peak}")
