"""Tuning logs: append-only JSON lines, one record per finished measurement.

A log is a text file with one JSON object per line (schema below). :class:`RecordWriter`
appends a record as soon as its measurement finishes and forces it to disk, so a tuner
that crashes or is killed loses no finished record; at worst the line being written is
cut short. Readers (:func:`load_records`, :func:`load_best`, :func:`best_params`, :func:`finished_candidates`)
skip such a line, and any other corrupt line or record of an unknown schema version, with
a :class:`RecordWarning` that names the file and the line number.

Line schema (version 3)::

    {"schema_version": 3, "tvm_version": "0.27.0.post1",
     "target": "<the tvm.target.Target as its JSON string>",
     "workload_key": "<str>",
     "candidate": {"layout": {...}, "loop": {...}},   # opaque to this module
     "latencies_ms": [0.41, 0.40, ...],                # empty for an error
     "error": null | {"code": "BUILD_ERROR", "message": "..."},
     "build_s": 0.8, "run_s": 0.3, "timestamp": 1763760000.0,
     "trial": 17, "seed": 0, "board": "10.0.0.7:9090"}  # "" when measured here

Version 3 added ``board``: the RPC server (``host:port`` as the tracker gave it) that timed
the candidate, so a fleet's work can be counted per board. Version-2 lines are read as
version 3 with ``board`` empty. Version 2 changed only the workload keys (canonical attribute spelling, see
:func:`alt_tvm.strategies.base.workload_key`): version-1 keys would not match any partition,
so version-1 lines are skipped like any other schema.

A target whose ``model`` is :data:`EMULATED_MODEL` (``"model":"qemu"`` in the line's target, as
for the ``emulated-arm64`` board) was timed under an emulator: its latencies rank candidates
for that target only and say nothing about a real board's speed (:func:`is_emulated`,
:attr:`TuningRecord.emulated`).

Two kinds of candidate are not search points. A *decision* (``{"decision": "in-model",
"strategy": "alt", "params": {...} | null, ...}``) is what the in-model verification of
:mod:`alt_tvm.in_model` chose for a workload after timing its finalists, its default and the
other applicable strategies inside the whole built model; its latencies are the in-model
times of the choice. The last decision of a workload overrides every measurement of it
(``params`` null: build it with the strategy's defaults). A *model check*
(``{"model_check": ...}``, workload key ``model|...``) records whole-model times.

This module imports neither TVM nor NumPy at load time (a child process that only writes
records starts fast).
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "RecordWarning",
    "RecordWriter",
    "TuningRecord",
    "best_params",
    "EMULATED_MODEL",
    "candidate_key",
    "choose_best",
    "is_emulated",
    "finished_candidates",
    "iter_records",
    "load_best",
    "load_records",
    "is_decision",
    "rank_candidates",
    "read_log",
    "target_key",
    "tvm_version",
    "TunedLog",
]

#: Version of the line schema written by this module; readers skip versions not in READABLE_VERSIONS.
SCHEMA_VERSION = 3
#: Versions the readers accept (a version-2 line has no ``board``).
READABLE_VERSIONS = (2, 3)

# Beyond this many warnings per file, the rest are summarised in one warning.
_MAX_WARNINGS_PER_FILE = 20

_FIELDS = (
    "schema_version",
    "tvm_version",
    "target",
    "workload_key",
    "candidate",
    "latencies_ms",
    "error",
    "build_s",
    "run_s",
    "timestamp",
    "trial",
    "seed",
    "board",
)


def _readable() -> str:
    return " or ".join(str(v) for v in READABLE_VERSIONS)


class RecordWarning(UserWarning):
    """A line of a tuning log was skipped (corrupt, truncated or of another schema version)."""


@functools.lru_cache(maxsize=1)
def tvm_version() -> str:
    """The installed TVM's version: records of another version do not apply to this one."""
    # Lazy: importing TVM costs seconds, and only the default value of a field needs it.
    import tvm

    return str(tvm.__version__)


def candidate_key(candidate: Mapping[str, Any]) -> str:
    """Canonical JSON string of a candidate: equal candidates give equal keys.

    Keys are sorted and separators fixed, so the key does not depend on insertion order.

    Raises
    ------
    TypeError
        If ``candidate`` is not a mapping or holds values JSON cannot represent.
    """
    if not isinstance(candidate, Mapping):
        raise TypeError(f"candidate must be a mapping (JSON object), got {type(candidate).__name__}")
    try:
        return json.dumps(candidate, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"candidate is not JSON-serialisable: {err}") from None


def target_key(target: Any) -> str:
    """The string a record stores for ``target``: TVM 0.27 prints a Target as its JSON.

    Parameters
    ----------
    target : tvm.target.Target, Mapping, HardwareTarget or str
        A Target, the dict accepted by ``tvm.target.Target`` (canonicalised through TVM,
        so the same target gives the same string either way), an
        :class:`alt_tvm.target.HardwareTarget`, or an already-printed string.
    """
    if isinstance(target, str):
        return target
    import tvm

    if isinstance(target, Mapping):
        return str(tvm.target.Target(dict(target)))
    if isinstance(target, tvm.target.Target):
        return str(target)
    # alt_tvm.target.HardwareTarget (and anything else that converts itself).
    if hasattr(target, "to_tvm"):
        return str(target.to_tvm())
    raise TypeError(f"target must be a tvm.target.Target, a dict or a str, got {type(target).__name__}")


#: The ``model`` attribute of a target run by an emulator (qemu-user), not by the hardware.
EMULATED_MODEL = "qemu"


def is_emulated(target: Any) -> bool:
    """Whether ``target`` (anything :func:`target_key` takes) names an emulated machine: its
    ``model`` is :data:`EMULATED_MODEL`, so its timings measure the emulator, not the hardware."""
    if hasattr(target, "tvm_target"):  # alt_tvm.target.HardwareTarget: no TVM needed
        return target.tvm_target.get("model") == EMULATED_MODEL
    try:
        parsed = json.loads(target_key(target))
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("model") == EMULATED_MODEL


def _check_number(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"TuningRecord.{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class TuningRecord:
    """One finished measurement of one candidate (a line of the log).

    Parameters
    ----------
    workload_key : str
        Identifies the operator instance (shapes, dtypes, attributes) being tuned.
    target : str
        The target's JSON string (see :func:`target_key`).
    candidate : dict
        The point measured, e.g. ``{"layout": {...}, "loop": {...}}``; any JSON object.
        It is stored as a canonical deep copy (so later changes to the caller's dict do
        not leak in); treat it as read-only.
    latencies_ms : tuple of float
        Measured latencies in milliseconds; empty if the measurement failed.
    error_code : str or None
        ``None`` for success, else the name of the error (``"BUILD_ERROR"``, ...; see
        :class:`alt_tvm.tuning.measure.ErrorCode`).
    error_msg : str
        Human-readable detail of the error ("" on success).
    build_s, run_s : float
        Seconds spent building and running.
    timestamp : float
        Wall-clock time (seconds since the epoch) the measurement finished.
    trial : int
        Index of the measurement in the tuning run (0-based).
    seed : int or None
        Seed of the tuning run.
    tvm_version : str
        TVM version that built the kernel (default: the installed one).
    schema_version : int
        Line schema version (default :data:`SCHEMA_VERSION`).
    source : str
        ``"<log path>:<line>"`` for a record read from a log ("" otherwise); not written.

    Raises
    ------
    ValueError, TypeError
        For inconsistent or ill-typed values: a success without latencies, an error with
        latencies, negative or non-finite numbers, a candidate that is not a JSON object.
    """

    workload_key: str
    target: str
    candidate: dict[str, Any] = field(hash=False)
    latencies_ms: tuple[float, ...] = ()
    error_code: str | None = None
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    trial: int = 0
    seed: int | None = None
    tvm_version: str = field(default_factory=tvm_version)
    schema_version: int = SCHEMA_VERSION
    source: str = field(default="", compare=False)
    board: str = ""

    def __post_init__(self) -> None:
        for name in ("workload_key", "target", "tvm_version", "error_msg", "board"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"TuningRecord.{name} must be a str, got {type(getattr(self, name)).__name__}")
        if not self.workload_key:
            raise ValueError("TuningRecord.workload_key must not be empty")
        # A canonical deep copy: validates JSON-ability and detaches it from the caller.
        object.__setattr__(self, "candidate", json.loads(candidate_key(self.candidate)))
        if isinstance(self.latencies_ms, str | bytes) or not isinstance(self.latencies_ms, Sequence):
            raise TypeError(f"TuningRecord.latencies_ms must be a sequence of numbers, got {self.latencies_ms!r}")
        for value in self.latencies_ms:
            _check_number("latencies_ms item", value)
        object.__setattr__(self, "latencies_ms", tuple(float(v) for v in self.latencies_ms))
        if self.error_code is None:
            if not self.latencies_ms:
                raise ValueError("TuningRecord without error_code must have at least one latency")
        else:
            if not isinstance(self.error_code, str) or not self.error_code:
                raise TypeError(f"TuningRecord.error_code must be None or a non-empty str, got {self.error_code!r}")
            if self.latencies_ms:
                raise ValueError(f"TuningRecord with error_code {self.error_code!r} must have no latencies")
        for name in ("build_s", "run_s", "timestamp"):
            _check_number(name, getattr(self, name))
        if isinstance(self.trial, bool) or not isinstance(self.trial, int) or self.trial < 0:
            raise ValueError(f"TuningRecord.trial must be an int >= 0, got {self.trial!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"TuningRecord.seed must be an int or None, got {self.seed!r}")
        if isinstance(self.schema_version, bool) or not isinstance(self.schema_version, int):
            raise TypeError(f"TuningRecord.schema_version must be an int, got {self.schema_version!r}")

    @property
    def ok(self) -> bool:
        """True for a successful measurement (no error, at least one latency)."""
        return self.error_code is None

    @property
    def emulated(self) -> bool:
        """True when the target was emulated (see :func:`is_emulated`): the latencies measure
        the emulator and say nothing about the hardware's speed."""
        return is_emulated(self.target)

    @property
    def median_ms(self) -> float:
        """Median latency in ms; ``inf`` for a failed measurement (sorts last)."""
        return statistics.median(self.latencies_ms) if self.ok else math.inf

    @property
    def candidate_key(self) -> str:
        """Canonical JSON string of :attr:`candidate` (see :func:`candidate_key`)."""
        return candidate_key(self.candidate)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to the log (see the module docstring)."""
        error = None if self.error_code is None else {"code": self.error_code, "message": self.error_msg}
        return {
            "schema_version": self.schema_version,
            "tvm_version": self.tvm_version,
            "target": self.target,
            "workload_key": self.workload_key,
            "candidate": self.candidate,
            "latencies_ms": list(self.latencies_ms),
            "error": error,
            "build_s": self.build_s,
            "run_s": self.run_s,
            "timestamp": self.timestamp,
            "trial": self.trial,
            "seed": self.seed,
            "board": self.board,
        }

    def to_json(self) -> str:
        """One log line, without the trailing newline."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], *, source: str = "") -> TuningRecord:
        """Inverse of :meth:`to_dict` (``source``: where the line was read, for messages).

        Raises
        ------
        ValueError
            If a field is missing or unknown, or the schema version is not one of
            :data:`READABLE_VERSIONS`.
        TypeError
            If a field has the wrong type.
        """
        if not isinstance(obj, Mapping):
            raise TypeError(f"a record must be a JSON object, got {type(obj).__name__}")
        version = obj.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"schema version {version!r} is not supported (this alt-tvm reads {_readable()})")
        if version == 2:
            obj = {**obj, "board": ""}
        missing = [k for k in _FIELDS if k not in obj]
        unknown = sorted(set(obj) - set(_FIELDS))
        if missing or unknown:
            raise ValueError(f"record fields: missing {missing}, unknown {unknown}")
        error = obj["error"]
        if error is not None and (not isinstance(error, Mapping) or set(error) != {"code", "message"}):
            raise TypeError(f"record 'error' must be null or {{'code', 'message'}}, got {error!r}")
        return cls(
            workload_key=obj["workload_key"],
            target=obj["target"],
            candidate=obj["candidate"],
            latencies_ms=obj["latencies_ms"],
            error_code=None if error is None else error["code"],
            error_msg="" if error is None else error["message"],
            build_s=obj["build_s"],
            run_s=obj["run_s"],
            timestamp=obj["timestamp"],
            trial=obj["trial"],
            seed=obj["seed"],
            tvm_version=obj["tvm_version"],
            schema_version=SCHEMA_VERSION,
            source=source,
            board=obj["board"],
        )

    @classmethod
    def from_json(cls, line: str) -> TuningRecord:
        """Parse one log line (see :meth:`from_dict` for the errors; bad JSON is a ValueError)."""
        return cls.from_dict(json.loads(line))


class RecordWriter:
    """Appends :class:`TuningRecord` lines to a log, each forced to disk before returning.

    The file is created if missing and appended to if it exists (resume). Each record is
    written with one ``write`` on an ``O_APPEND`` descriptor and then ``fsync``-ed, so a
    crash loses no record that :meth:`write` returned for. If the file ends in a partial
    line (a writer was killed mid-line), a newline is added first so that the damage stays
    confined to that line. Thread-safe; a context manager.

    Parameters
    ----------
    path : str or Path
        The log file. Its directory must exist.

    Raises
    ------
    FileNotFoundError
        If the directory of ``path`` does not exist.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise FileNotFoundError(
                f"cannot create tuning log {self.path}: directory {self.path.parent} does not exist"
            )
        created = not self.path.exists()
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if created:
            # Make the new directory entry durable too (a crash could otherwise lose the file).
            _fsync_dir(self.path.parent)
        elif _ends_in_partial_line(self.path):
            _write_all(self._fd, b"\n")

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._fd is None

    def write(self, record: TuningRecord) -> None:
        """Append ``record`` as one line and flush it to disk.

        Raises
        ------
        TypeError
            If ``record`` is not a :class:`TuningRecord`.
        ValueError
            If the writer is closed.
        """
        if not isinstance(record, TuningRecord):
            raise TypeError(f"RecordWriter.write expects a TuningRecord, got {type(record).__name__}")
        data = (record.to_json() + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"RecordWriter for {self.path} is closed")
            _write_all(self._fd, data)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        return f"RecordWriter({str(self.path)!r}{', closed' if self.closed else ''})"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # os.write may write less than asked (signals, nearly full disks)
        view = view[os.write(fd, view):]
    os.fsync(fd)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform/filesystem; the file itself is still synced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _ends_in_partial_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _open_log(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"tuning log {path} does not exist (a RecordWriter creates it when a tuning run starts)"
        )
    if path.is_dir():
        raise IsADirectoryError(f"tuning log {path} is a directory, not a JSON-lines file")
    return path


def iter_records(path: str | os.PathLike[str], *, workload_key: str | None = None) -> Iterator[TuningRecord]:
    """Yield the valid records of a log in file order, skipping bad lines with a warning.

    Parameters
    ----------
    path : str or Path
        The log.
    workload_key : str, optional
        Yield only records of this workload.

    Warns
    -----
    RecordWarning
        For each skipped line (``"<path>:<line>: ..."``): invalid UTF-8 or JSON (e.g. a
        line cut short by a crash), a record that fails validation, or a schema version
        not in :data:`READABLE_VERSIONS`. Blank lines are skipped silently.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    for record in _valid(path, {}):
        if workload_key is None or record.workload_key == workload_key:
            yield record


def _valid(path: str | os.PathLike[str], skipped: dict[str, int]) -> Iterator[TuningRecord]:
    """The valid records of ``path``; each bad line warned about and counted in ``skipped`` by kind."""
    count = 0
    for lineno, record, reason in _scan(path):
        if reason is None:
            yield record
            continue
        kind = "schema" if reason.startswith("schema version") else "corrupt"
        skipped[kind] = skipped.get(kind, 0) + 1
        count += 1
        if count <= _MAX_WARNINGS_PER_FILE:
            warnings.warn(f"{path}:{lineno}: skipped {reason}", RecordWarning, stacklevel=3)
    if count > _MAX_WARNINGS_PER_FILE:
        warnings.warn(f"{path}: {count - _MAX_WARNINGS_PER_FILE} more bad lines skipped ({count} in all)",
                      RecordWarning, stacklevel=3)


def _scan(path: str | os.PathLike[str]) -> Iterator[tuple[int, TuningRecord | None, str | None]]:
    """``(line number, record, None)`` for each valid line, ``(line number, None, reason)`` for a bad one."""
    path = _open_log(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
                if not isinstance(obj, dict):
                    raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
                version = obj.get("schema_version")
                if version not in READABLE_VERSIONS:
                    yield lineno, None, f"schema version {version!r} (this alt-tvm reads version {_readable()})"
                    continue
                record = TuningRecord.from_dict(obj, source=f"{path}:{lineno}")
            except (UnicodeDecodeError, ValueError, TypeError) as err:
                yield lineno, None, f"corrupt or truncated record ({type(err).__name__}: {str(err)[:200]})"
                continue
            yield lineno, record, None


def load_records(path: str | os.PathLike[str], *, workload_key: str | None = None) -> list[TuningRecord]:
    """All valid records of a log, in file order (see :func:`iter_records`)."""
    return list(iter_records(path, workload_key=workload_key))


def is_decision(record: TuningRecord) -> bool:
    """Whether ``record`` is an in-model decision rather than a measurement of a search point."""
    return "decision" in record.candidate


def _identity(candidate: Mapping[str, Any]) -> str:
    """What makes two measurements the same candidate: its decoded ``params`` where present
    (two points decoding to the same strategy parameters build the same kernel), else the
    whole candidate; the ``revalidation`` mark is not part of it."""
    if "params" in candidate:
        return candidate_key(candidate["params"])
    return candidate_key({k: v for k, v in candidate.items() if k != "revalidation"})


def rank_candidates(records: Iterable[TuningRecord]) -> dict[str, list[TuningRecord]]:
    """Each workload's distinct successful candidates, best first: the one ranking rule.

    Re-validated candidates (records whose candidate carries ``"revalidation": true``: the
    fastest candidates measured again, interleaved) come first, ordered by the median over
    *all* their measurements, so one lucky draw of another candidate cannot beat them; each
    is returned as its first search record holding all those measurements. The others
    follow, ordered by their fastest record's median; ties go to the earlier record.
    Decisions (:func:`is_decision`) and model checks are not measurements of candidates
    and are ignored.
    """
    samples: dict[tuple[str, str], list[float]] = {}
    first: dict[tuple[str, str], TuningRecord] = {}
    fastest: dict[tuple[str, str], TuningRecord] = {}
    revalidated: set[tuple[str, str]] = set()
    for record in records:
        if not record.ok or is_decision(record) or "model_check" in record.candidate:
            continue
        key = (record.workload_key, _identity(record.candidate))
        samples.setdefault(key, []).extend(record.latencies_ms)
        if record.candidate.get("revalidation"):
            revalidated.add(key)
        else:
            first.setdefault(key, record)
        if key not in fastest or record.median_ms < fastest[key].median_ms:
            fastest[key] = record
    ranked: dict[str, list[tuple[tuple, TuningRecord]]] = {}
    for order, key in enumerate(samples):
        if key in revalidated:
            rank = (0, statistics.median(samples[key]), order)
            record = replace(first.get(key) or fastest[key], latencies_ms=tuple(samples[key]))
        else:
            rank = (1, fastest[key].median_ms, order)
            record = fastest[key]
        ranked.setdefault(key[0], []).append((rank, record))
    return {workload: [record for _, record in sorted(items, key=lambda item: item[0])]
            for workload, items in ranked.items()}


def choose_best(records: Iterable[TuningRecord]) -> dict[str, TuningRecord]:
    """The best successful record of each workload: the first of :func:`rank_candidates`.

    :func:`read_log` applies a workload's in-model decision on top of it.
    """
    return {workload: ranked[0] for workload, ranked in rank_candidates(records).items()}


def load_best(
    path: str | os.PathLike[str], *, workload_key: str, target: Any | None = None
) -> TuningRecord | None:
    """The best successful record of ``workload_key`` (the rule of :func:`choose_best`).

    Parameters
    ----------
    path : str or Path
        The log.
    workload_key : str
        The workload.
    target : optional
        Consider only records measured on this target (a Target, dict or JSON string; see
        :func:`target_key`). ``None``: any target.

    Returns
    -------
    TuningRecord or None
        ``None`` if the log has no successful record of the workload.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    if not isinstance(workload_key, str):
        raise TypeError(f"workload_key must be a str, got {type(workload_key).__name__}")
    wanted = None if target is None else target_key(target)
    records = (r for r in iter_records(path, workload_key=workload_key) if wanted is None or r.target == wanted)
    return choose_best(records).get(workload_key)


def best_params(path: str | os.PathLike[str], *, target: Any | None = None) -> dict[str, dict[str, Any]]:
    """The tuned strategy parameters per workload key in a log, as a build applies them.

    Only records measured on ``target`` (default: this host) with this TVM version that
    carry decoded ``params`` count; the best of each workload is chosen by
    :func:`choose_best`. See :func:`read_log` for why a workload has none.
    """
    return read_log(path, target=target).params


@dataclass(frozen=True)
class TunedLog:
    """What a tuning log offers a build on one target (made by :func:`read_log`).

    Attributes
    ----------
    path : str
        The log.
    target : str
        The target's JSON string (:func:`target_key`).
    best : dict of str to TuningRecord
        The record whose ``params`` each workload is built with (this target, this TVM
        version): the workload's last decision where it has one, else its best measurement
        (:func:`choose_best`); ``best[key].source`` is its ``path:line``.
    elsewhere : dict of str to str
        For workloads that have records but none applicable: why (measured on another
        target or with another TVM version, or every measurement failed).
    skipped : dict of str to int
        Lines skipped, by kind (``"schema"``: another schema version; ``"corrupt"``).
    strategies : dict of str to str
        The strategy each decided workload is lowered with (its last decision's).
    defaults : dict of str to str
        Workloads whose last decision keeps the strategy's defaults, and why.
    unfused : dict of str to str
        Fused workloads (a block, a GEMM with its layer norm) whose last decision builds them
        as their pieces (``candidate["fuse"]`` false), and where that decision is.
    """

    path: str
    target: str
    best: Mapping[str, TuningRecord]
    elsewhere: Mapping[str, str]
    skipped: Mapping[str, int]
    strategies: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, str] = field(default_factory=dict)
    unfused: Mapping[str, str] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, dict[str, Any]]:
        """The tuned strategy parameters by workload key."""
        return {key: record.candidate["params"] for key, record in self.best.items()}

    def params_for(self, workload_key: str, strategy: str) -> TuningRecord | None:
        """The record whose ``params`` a partition lowered with ``strategy`` takes, if any.

        Parameters of another strategy do not apply (a record names its strategy under
        ``candidate["strategy"]``; records without one were measured with the strategy the
        build selects by priority, which is the one asking).
        """
        record = self.best.get(workload_key)
        if record is None or record.candidate.get("strategy", strategy) != strategy:
            return None
        return record

    def why_not(self, workload_key: str) -> str:
        """Why the log tunes no parameters for ``workload_key`` ("" if it does)."""
        if workload_key in self.best:
            return ""
        if workload_key in self.defaults:
            return self.defaults[workload_key]
        if workload_key in self.elsewhere:
            return self.elsewhere[workload_key]
        reason = "no record of this workload in the log (tuned for another model, input shape or dtype)"
        if self.skipped.get("schema"):
            reason += f"; {self.skipped['schema']} lines of another schema version were skipped (re-tune)"
        return reason


def read_log(path: str | os.PathLike[str], *, target: Any | None = None) -> TunedLog:
    """Read a tuning log for building on ``target`` (default: this host).

    A record applies when it was measured on ``target`` with the installed TVM version
    (timings of another version's code do not rank candidates for this one) and carries
    decoded ``params``; the best per workload is chosen by :func:`choose_best`, and a
    workload's last decision (:func:`is_decision`) overrides it. Bad lines are skipped with
    a :class:`RecordWarning` naming ``path:line``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    if target is None:
        from alt_tvm.target import host

        target = host()
    wanted, version = target_key(target), tvm_version()
    applicable: list[TuningRecord] = []
    decisions: dict[str, TuningRecord] = {}
    seen: dict[str, dict[str, set[str]]] = {}  # workload -> {"targets": ..., "versions": ..., "ok": ...}
    skipped: dict[str, int] = {}
    for record in _valid(path, skipped):
        if "model_check" in record.candidate:
            continue
        facts = seen.setdefault(record.workload_key, {"targets": set(), "versions": set(), "ok": set()})
        facts["targets"].add(record.target)
        facts["versions"].add(record.tvm_version)
        if record.ok:
            facts["ok"].add("yes")
        if record.target != wanted or record.tvm_version != version:
            continue
        if is_decision(record):
            decisions[record.workload_key] = record
        elif "params" in record.candidate:
            applicable.append(record)
    best = choose_best(applicable)
    strategies, defaults, unfused = {}, {}, {}
    for key, decision in decisions.items():
        if isinstance(decision.candidate.get("strategy"), str):
            strategies[key] = decision.candidate["strategy"]
        if decision.candidate.get("fuse") is False:
            unfused[key] = decision.source
        if isinstance(decision.candidate.get("params"), dict):
            best[key] = decision
        else:
            best.pop(key, None)
            why = decision.candidate.get("reason") or "the in-model verification chose the defaults"
            defaults[key] = f"{why} ({decision.source})"
    elsewhere = {}
    for key, facts in seen.items():
        if key in best or key in defaults:
            continue
        if wanted not in facts["targets"]:
            others = ", ".join(sorted(_short_target(t) for t in facts["targets"]))
            elsewhere[key] = f"measured only on other targets ({others}), not {_short_target(wanted)}"
        elif version not in facts["versions"]:
            elsewhere[key] = (f"measured only with TVM {', '.join(sorted(facts['versions']))} "
                              f"(this is TVM {version}); re-tune")
        elif not facts["ok"]:
            elsewhere[key] = "every measurement of this workload in the log failed"
        else:
            elsewhere[key] = "its records carry no decoded strategy parameters"
    return TunedLog(str(path), wanted, best, elsewhere, skipped, strategies, defaults, unfused)


def _short_target(target: str) -> str:
    """A target's name for messages (kind and ``mcpu``/``arch``), from its JSON string."""
    try:
        spec = json.loads(target)
    except ValueError:
        return target[:60]
    if not isinstance(spec, dict):
        return target[:60]
    detail = spec.get("mcpu") or spec.get("arch") or spec.get("mtriple")
    return " ".join(str(part) for part in (spec.get("kind"), detail) if part) or target[:60]


def finished_candidates(path: str | os.PathLike[str], workload_key: str, *,
                        retry: Callable[[TuningRecord], bool] | None = None) -> set[str]:
    """Keys (:func:`candidate_key`) of every candidate of ``workload_key`` already measured.

    Failed measurements count as finished (re-measuring a kernel that does not build would
    fail again), except those for which ``retry(record)`` is true (e.g. a lost connection:
    :func:`alt_tvm.tuning.measure.is_transient` of its error). A missing log means nothing is
    finished yet: the result is empty, so a ``--resume`` of a run that never started works.
    """
    if not isinstance(workload_key, str):
        raise TypeError(f"workload_key must be a str, got {type(workload_key).__name__}")
    if not Path(path).exists():
        return set()
    return {record.candidate_key for record in iter_records(path, workload_key=workload_key)
            if record.ok or retry is None or not retry(record)}
