"""Learned defaults: what tuning kept on a target, applied to the untuned build there.

The in-model stage of :func:`alt_tvm.tune` ends every tuned workload with a *decision*: the
strategy and parameters that ran fastest inside the whole model, or the defaults
(:mod:`alt_tvm.records`). Decisions that beat the defaults say something about the target
beyond one workload: on a 2-vCPU Zen 3 guest, SConv beat the ALT template on every dense 3x3
convolution of ResNet-18 (0.34-0.96x the time). :class:`Priors` keeps such decisions per
target and answers, for a workload of another model on that target, with the decision of its
nearest decided workload of the same kind (same operator, kernel window, strides and
grouping) when every extent is within a factor of :data:`RADIUS` of it. Only what carries
across shapes is taken: the choice of strategy, whether a fused workload is built as its
pieces, and the on/off loop knobs of a tuned candidate (tile sizes depend on the extents and
are left to the defaults).

:func:`fit_priors` reads tuning logs; :func:`shipped_priors` loads the file fitted from the
logs that ship with alt-tvm (``logs/reference/``, by ``scripts/fit_priors.py``). A build
applies them where no tuning log covers a workload (:class:`alt_tvm.options.BuildOptions`'s
``priors``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PRIORS_ENV", "RADIUS", "LearnedDecision", "Priors", "fit_priors", "shipped_priors", "workload_kind"]

SCHEMA_VERSION = 1

#: A decision carries to a workload of the same kind whose every extent is within this factor
#: of the decided one's (and no farther than any other decided workload).
RADIUS = 2.0
#: A decision counts as a finding when the choice took at most this share of the defaults'
#: time in the model: closer than that, it is within the in-model timing's noise.
MIN_GAIN = 0.95

#: Environment variable that turns the shipped priors off (``0``) for a process.
PRIORS_ENV = "ALT_TVM_PRIORS"

#: The file :func:`shipped_priors` reads.
SHIPPED = Path(__file__).resolve().parent / "data" / "priors.json"

_SHAPE = re.compile(r"\(([\d, ]*)\)")
_STRIDES = re.compile(r'"strides":\s*(\[[\d, ]*\])')


@dataclass(frozen=True)
class LearnedDecision:
    """One in-model decision of a tuning log.

    Attributes
    ----------
    target
        The target's JSON string (:func:`alt_tvm.records.target_key`) it was measured on.
    workload
        Its workload key.
    strategy
        The strategy it chose.
    switches
        The on/off loop knobs of the tuned candidate it chose (empty for a strategy's defaults).
    ratio
        In-model time of the choice over the defaults' (below 1: faster).
    source
        ``"<log path>:<line>"``.
    fused
        False where it built a fused workload as its pieces (``candidate["fuse"]``).
    """

    target: str
    workload: str
    strategy: str
    switches: Mapping[str, bool] = field(default_factory=dict)
    ratio: float = 1.0
    source: str = ""
    fused: bool = True

    @property
    def finding(self) -> bool:
        """Whether the choice beat the defaults by :data:`MIN_GAIN` (else the defaults held,
        and a workload nearest to this one keeps its defaults too)."""
        return self.ratio <= MIN_GAIN

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "workload": self.workload, "strategy": self.strategy,
                "switches": dict(sorted(self.switches.items())), "ratio": round(self.ratio, 4),
                "source": self.source, **({} if self.fused else {"fused": False})}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> LearnedDecision:
        """A decision from its JSON form.

        Raises
        ------
        ValueError
            If a field is missing or of the wrong type (the message shows the record).
        """
        try:
            switches = {str(k): v for k, v in dict(record.get("switches", {})).items()}
            if not all(isinstance(v, bool) for v in switches.values()):
                raise TypeError("switches must map knob names to true/false")
            fused = record.get("fused", True)
            if not isinstance(fused, bool):
                raise TypeError("fused must be true or false")
            return cls(str(record["target"]), str(record["workload"]), str(record["strategy"]), switches,
                       float(record.get("ratio", 1.0)), str(record.get("source", "")), fused)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a learned decision: {record!r} ({err})") from None


def workload_kind(workload: str) -> tuple[str, tuple[float, ...]] | None:
    """``(kind, log2 extents)`` of a workload key, or None for one it cannot read.

    The kind is the operator, the shapes' ranks and the attributes, with ``groups`` reduced
    to whether the op is dense, depthwise (one channel per group) or grouped, and the ops a
    fusion pattern adds (a block's convs, a layer norm); the extents are every dimension of
    the operands and the output. Two workloads of one kind differ only in their extents.
    """
    parts = workload.split("|")
    if len(parts) < 2:
        return None
    shapes = [tuple(int(d) for d in s.split(",") if d.strip()) for s in _SHAPE.findall(parts[1])]
    out = next((p for p in parts[2:] if p.startswith("out=")), "")
    shapes += [tuple(int(d) for d in s.split(",") if d.strip()) for s in _SHAPE.findall(out)]
    if not shapes or any(d < 1 for s in shapes for d in s):
        return None
    attrs: dict[str, Any] = {}
    if len(parts) > 2 and parts[2].startswith("{"):
        try:
            attrs = json.loads(parts[2])
        except ValueError:
            return None
    groups = int(attrs.pop("groups", 1) or 1)
    if groups > 1:
        channels = shapes[0][1] if len(shapes[0]) > 1 else 0
        attrs["grouping"] = "depthwise" if groups == channels else "grouped"
    kind = f"{parts[0]}|{[len(s) for s in shapes]}|{json.dumps(attrs, sort_keys=True)}"
    # The window's extents belong to the kind: a 3x3 decision says nothing of a 1x1 conv.
    if parts[0].startswith("nn.conv") and len(shapes) > 1:
        kind += f"|window={shapes[1][2:]}"
    # A fusion's part of the key (``then=<op>:<shapes>:<attrs>+<op>...``): its ops and their
    # strides (a block's depthwise conv may halve the map), not its extents.
    for part in parts[2:]:
        if part.startswith(("then=", "prologue=")):
            ops = [piece.split(":", 1)[0] + "".join(_STRIDES.findall(piece)) for piece in part.split("+")]
            kind += "|" + "+".join(ops)
    return kind, tuple(math.log2(d) for s in shapes for d in s)


@dataclass(frozen=True)
class Priors:
    """The learned decisions of one or more targets (:func:`fit_priors`)."""

    decisions: tuple[LearnedDecision, ...] = ()

    def for_target(self, target: str) -> Priors:
        """The decisions measured on ``target`` (its JSON string) only."""
        return Priors(tuple(d for d in self.decisions if d.target == target))

    @functools.cached_property
    def _by_kind(self) -> dict[tuple[str, str], list[tuple[tuple[float, ...], LearnedDecision]]]:
        by_kind: dict = {}
        for decision in self.decisions:
            read = workload_kind(decision.workload)
            if read is not None:
                by_kind.setdefault((decision.target, read[0]), []).append((read[1], decision))
        return by_kind

    def nearest(self, workload: str, *, target: str) -> LearnedDecision | None:
        """The decision ``workload`` takes on ``target``: its nearest decided workload of the
        same kind (largest extent ratio), if within :data:`RADIUS`; ties go to the larger gain."""
        read = workload_kind(workload)
        if read is None:
            return None
        kind, extents = read
        radius = math.log2(RADIUS)
        best = None
        for decided, decision in self._by_kind.get((target, kind), []):
            distance = max(abs(a - b) for a, b in zip(extents, decided))
            if distance <= radius and (best is None or (distance, decision.ratio) < best[0]):
                best = ((distance, decision.ratio), decision)
        return None if best is None else best[1]

    def strategies(self, workloads: Iterable[str], *, target: str) -> dict[str, str]:
        """Workload key -> the strategy its nearest decision chose, for each that has one."""
        chosen = {}
        for workload in workloads:
            decision = self.nearest(workload, target=target)
            if decision is not None and decision.finding:
                chosen[workload] = decision.strategy
        return chosen

    def unfused(self, workloads: Iterable[str], *, target: str) -> set[str]:
        """The fused workloads among ``workloads`` whose nearest decision built its own as its
        pieces (:attr:`LearnedDecision.fused`), faster by :data:`MIN_GAIN`."""
        split = set()
        for workload in workloads:
            decision = self.nearest(workload, target=target)
            if decision is not None and decision.finding and not decision.fused:
                split.add(workload)
        return split

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "decisions": [d.to_json() for d in self.decisions]}

    @classmethod
    def read(cls, path: str | os.PathLike) -> Priors:
        """The priors a :meth:`to_json` file holds.

        Raises
        ------
        ValueError
            If the file is not a priors file of this schema (the message names the path).
        """
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read priors from {os.fspath(path)!r}: {err}") from None
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"{os.fspath(path)!r} is not a priors file of schema {SCHEMA_VERSION} "
                             f"(got {str(data)[:80]!r})")
        return cls(tuple(LearnedDecision.from_json(d) for d in data.get("decisions", [])))


def apply_switches(space: Any, switches: Mapping[str, bool]) -> dict[str, Any] | None:
    """The parameters of ``space``'s default point with the on/off loop knobs set as in
    ``switches`` (those the space has and admits), or None where that changes nothing or the
    space rejects the point."""
    layout, loop = space.default()
    changed = dict(loop)
    for knob in space.loop_knobs(layout):
        value = switches.get(knob.name)
        if value is not None and value in knob.choices:
            changed[knob.name] = value
    if changed == loop or space.check(layout, changed) is not None:
        return None
    return space.params(layout, changed)


def fit_priors(logs: Sequence[str | os.PathLike], *, min_logs: int = 1) -> Priors:
    """The in-model decisions of the tuning ``logs``: those that beat the defaults by
    :data:`MIN_GAIN` and those that kept them (a workload nearest to one of these keeps its
    defaults).

    The decisions a whole-model check did not keep (the tuned build lost to the untuned one
    in the model) are dropped: a check covers the decisions written before it since the
    previous one. The last decision per (target, workload) wins, as in a build.

    Parameters
    ----------
    logs : sequence of path
        Tuning logs written by :func:`alt_tvm.tune`.
    min_logs : int
        A finding is kept only where the findings of at least this many of the logs (its own
        included) made the same choice on workloads of its kind within :data:`RADIUS` of it:
        what tuning keeps across models rather than what one model's context favoured. On a
        2-vCPU Zen 4 guest, the single-model findings of eighteen public models made
        torchvision's RegNetY-400MF (not among them) 1.27x slower: FastViT-T8's SConv choice
        for its 1x1 convolutions carried to RegNet's, where it lost.

    Raises
    ------
    FileNotFoundError
        For a log that does not exist.
    ValueError
        If ``min_logs`` is not an int >= 1.
    """
    if isinstance(min_logs, bool) or not isinstance(min_logs, int) or min_logs < 1:
        raise ValueError(f"min_logs must be an int >= 1, got {min_logs!r}")
    from alt_tvm.records import iter_records

    decided: dict[tuple[str, str], LearnedDecision] = {}
    for log in logs:
        if not os.path.exists(log):
            raise FileNotFoundError(f"tuning log {os.fspath(log)!r} does not exist")
        found: dict[tuple[str, str], LearnedDecision] = {}
        for record in iter_records(log):
            candidate = record.candidate
            if "model_check" in candidate:
                if candidate.get("kept", True):
                    decided.update(found)
                found = {}
                continue
            # Operator kernels' decisions (strategy "in_layout") are keyed by their function's
            # structure: they have no neighbours to carry to.
            if candidate.get("decision") != "in-model" or candidate.get("strategy") == "in_layout":
                continue
            key = (record.target, record.workload_key)
            ratio = 1.0 if candidate.get("label") == "default" else float(candidate.get("ratio", 1.0))
            params = candidate.get("params") or {}
            switches = {k: v for k, v in params.items() if isinstance(v, bool)} if ratio <= MIN_GAIN else {}
            found[key] = LearnedDecision(record.target, record.workload_key, str(candidate["strategy"]), switches,
                                         ratio, record.source, candidate.get("fuse") is not False)
        decided.update(found)  # decisions no check has judged yet
    kept = [d for d in decided.values() if not d.finding or _logs_agreeing(d, decided.values()) >= min_logs]
    return Priors(tuple(sorted(kept, key=lambda d: (d.target, d.workload))))


def _logs_agreeing(decision: LearnedDecision, decisions: Iterable[LearnedDecision]) -> int:
    """How many logs hold a finding with ``decision``'s choice on a workload of its kind within
    :data:`RADIUS` of it (its own log included)."""
    read = workload_kind(decision.workload)
    if read is None:
        return 1
    choice = (decision.strategy, decision.fused, sorted(decision.switches.items()))
    logs = set()
    for other in decisions:
        other_read = workload_kind(other.workload)
        if (not other.finding or other.target != decision.target or other_read is None or other_read[0] != read[0]
                or (other.strategy, other.fused, sorted(other.switches.items())) != choice):
            continue
        if max(abs(a - b) for a, b in zip(read[1], other_read[1])) <= math.log2(RADIUS):
            logs.add(other.source.rsplit(":", 1)[0])
    return len(logs)


@functools.cache
def shipped_priors() -> Priors:
    """The priors fitted from the tuning logs that ship with alt-tvm (empty where the file is
    missing, or where :data:`PRIORS_ENV` is ``0``)."""
    if os.environ.get(PRIORS_ENV, "").strip() == "0" or not SHIPPED.is_file():
        return Priors()
    return Priors.read(SHIPPED)
