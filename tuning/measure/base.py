"""The measuring contract: what the tuner hands to builders and runners, and what comes back.

:class:`MeasureInput`, :class:`BuildResult`, :class:`MeasureResult` and :class:`ErrorCode`
are the data exchanged; :class:`Builder` and :class:`Runner` are the interfaces the
implementations of the sibling modules fill in, and :func:`measure` chains one of each.
The helpers every implementation shares (argument specs and random inputs, parameter
checks, error messages, the timing loop of both runners) live here too, so no
implementation imports another. How a kernel is timed (:class:`TimingPolicy`, re-exported
from :mod:`alt_tvm.bench.timing`) is defined once, for the runners and
:func:`~alt_tvm.tuning.task.measure_in_process` alike.
"""

from __future__ import annotations

import abc
import enum
import os
import re
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from alt_tvm.bench.timing import TimingPolicy
from alt_tvm.records import TuningRecord, candidate_key, target_key

__all__ = [
    "ArgSpec",
    "BuildResult",
    "Builder",
    "ErrorCode",
    "MeasureInput",
    "MeasureResult",
    "Runner",
    "REMOTE_PREFIX",
    "TimingPolicy",
    "argument_specs",
    "classify_exception",
    "is_transient",
    "measure",
    "random_arguments",
]

# Error messages kept in results and logs are cut to this many characters (tracebacks).
_MAX_MSG = 4000


class ErrorCode(enum.IntEnum):
    """Outcome of building and running one candidate (``NONE``: success).

    :func:`is_transient` tells which failures say nothing about the candidate.
    """

    NONE = 0
    BUILD_ERROR = 1
    BUILD_TIMEOUT = 2
    RUN_ERROR = 3
    RUN_TIMEOUT = 4
    #: Reserved for runners that check outputs against a reference (none does yet).
    WRONG_ANSWER = 5
    #: The measuring machinery failed, not the candidate: no RPC session, a lost
    #: connection, or an ``OSError`` raised by a measure function.
    RPC_ERROR = 6


#: Start of the error message of every failure on a remote device (:class:`RPCRunner`).
REMOTE_PREFIX = "remote: "

_CODE_PREFIX = re.compile(r"([A-Z_]+):\s?(.*)", re.DOTALL)


def _code_named(name: str) -> ErrorCode | None:
    code = ErrorCode.__members__.get(name)
    return None if code is None or code is ErrorCode.NONE else code


def classify_exception(err: BaseException) -> tuple[ErrorCode, str]:
    """The error code and message to log for an exception raised by a measure function.

    A ``RuntimeError`` whose message starts with an :class:`ErrorCode` name and a colon
    (what :mod:`alt_tvm.tuning.remote`'s measure functions raise) gives that code and the
    rest of the message; an ``OSError`` (``ConnectionError``, ``TimeoutError``, ...) or a
    TVM RPC error gives ``RPC_ERROR``; anything else ``RUN_ERROR``.
    """
    if isinstance(err, RuntimeError):
        match = _CODE_PREFIX.match(str(err))
        code = _code_named(match.group(1)) if match else None
        if code is not None:
            return code, _short(match.group(2))
    if isinstance(err, OSError | tvm.error.RPCError):
        return ErrorCode.RPC_ERROR, _format_exception(err)
    return ErrorCode.RUN_ERROR, _format_exception(err)


def is_transient(error_code: ErrorCode | str | None, error_msg: str = "") -> bool:
    """Whether a failure says nothing about the candidate, so it should be measured again.

    Transient: ``RPC_ERROR`` (see :class:`ErrorCode`) and a ``RUN_TIMEOUT`` on a remote
    device (its message starts with :data:`REMOTE_PREFIX`: the board may be busy or gone).
    Build errors, build timeouts, run errors and local run timeouts are the candidate's
    own and final. ``None`` (a success) is not transient. (Logs without error codes are of
    schema version 1, which readers skip.)

    Parameters
    ----------
    error_code
        An :class:`ErrorCode`, its name (a record's ``error_code``), or None.
    error_msg
        The failure's message (a record's ``error_msg``).
    """
    if error_code is None:
        return False
    name = error_code.name if isinstance(error_code, ErrorCode) else str(error_code)
    return name == "RPC_ERROR" or (name == "RUN_TIMEOUT" and error_msg.startswith(REMOTE_PREFIX))


def _positive(name: str, value: Any, *, integer: bool = False, allow_zero: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "an int" if integer else "a number"
        raise ValueError(f"{name} must be {kind} {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_MSG else "..." + text[-_MAX_MSG:]


def _format_exception(err: BaseException) -> str:
    return _short(f"{type(err).__name__}: {err}")


# --------------------------------------------------------------------------------------
# Data passed between the tuner, builders and runners


@dataclass(frozen=True)
class ArgSpec:
    """Shape and dtype of one tensor argument of a kernel."""

    shape: tuple[int, ...]
    dtype: str


def argument_specs(func: tvm.tirx.PrimFunc) -> tuple[ArgSpec, ...]:
    """Shapes and dtypes of a PrimFunc's tensor parameters, in order.

    In TVM 0.27 a PrimFunc has no ``buffer_map``: each tensor parameter is a ``Var`` whose
    type is a ``BufferType`` carrying ``shape`` and ``dtype``.

    Raises
    ------
    TypeError
        If ``func`` is not a PrimFunc.
    ValueError
        If a parameter is a scalar or a tensor with a symbolic shape (a runner cannot
        invent values for those).
    """
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise TypeError(f"expected a tvm.tirx.PrimFunc, got {type(func).__name__}")
    specs = []
    for param in func.params:
        if not isinstance(param.ty, tvm.tirx.buffer.BufferType):
            raise ValueError(f"parameter {param.name!r} is a scalar ({param.ty}); only tensor parameters are supported")
        shape = []
        for dim in param.shape:
            if not isinstance(dim, int | tvm.tirx.IntImm):
                raise ValueError(f"parameter {param.name!r} has a symbolic shape {tuple(param.shape)}")
            shape.append(int(dim))
        specs.append(ArgSpec(tuple(shape), str(param.dtype)))
    return tuple(specs)


def random_arguments(specs: Sequence[ArgSpec], device: Any, *, seed: int) -> list[Any]:
    """Tensors on ``device`` (local or an RPC session's) filled with seeded random values.

    Floats are uniform in [-1, 1), signed integers in [-8, 8), unsigned in [0, 16), bools
    fair coins: small values keep integer kernels from overflowing. The same seed gives
    the same inputs, so every candidate of a workload runs on the same data.
    """
    rng = np.random.default_rng(seed)
    args = []
    for spec in specs:
        tensor = tvm.runtime.empty(spec.shape, spec.dtype, device)
        dtype = np.dtype(spec.dtype)
        if dtype == np.bool_:
            values = rng.random(spec.shape) < 0.5
        elif np.issubdtype(dtype, np.signedinteger):
            values = rng.integers(-8, 8, size=spec.shape)
        elif np.issubdtype(dtype, np.unsignedinteger):
            values = rng.integers(0, 16, size=spec.shape)
        else:
            values = rng.uniform(-1.0, 1.0, size=spec.shape)
        tensor.copyfrom(np.asarray(values.astype(dtype), order="C"))  # keeps a 0-d argument 0-d
        args.append(tensor)
    return args


@dataclass(frozen=True)
class MeasureInput:
    """One candidate to build and time.

    Parameters
    ----------
    workload_key : str
        The operator instance the candidate implements (records group by it).
    candidate : dict
        JSON description of the candidate (``{"layout": ..., "loop": ...}``); opaque here,
        logged as is.
    mod : tvm.IRModule
        The scheduled module to build (e.g. ``tvm.s_tir.Schedule(...).mod``).
    func_name : str, optional
        The PrimFunc to run; default: the module's only PrimFunc (or ``"main"``).

    Raises
    ------
    TypeError, ValueError
        For ill-typed fields, or a ``func_name`` that is not a PrimFunc of ``mod``.
    """

    workload_key: str
    candidate: dict[str, Any] = field(hash=False)
    mod: tvm.IRModule = field(hash=False, compare=False, repr=False)
    func_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.workload_key, str) or not self.workload_key:
            raise ValueError(f"MeasureInput.workload_key must be a non-empty str, got {self.workload_key!r}")
        candidate_key(self.candidate)  # validates: a JSON object
        if not isinstance(self.mod, tvm.IRModule):
            raise TypeError(f"MeasureInput.mod must be a tvm.IRModule, got {type(self.mod).__name__}")
        prim_funcs = [gv.name_hint for gv, f in self.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        name = self.func_name
        if name is None:
            name = prim_funcs[0] if len(prim_funcs) == 1 else "main"
            object.__setattr__(self, "func_name", name)
        if name not in prim_funcs:
            raise ValueError(f"MeasureInput.func_name {name!r} is not a PrimFunc of the module (has {prim_funcs})")

    @property
    def func(self) -> tvm.tirx.PrimFunc:
        """The PrimFunc that is timed."""
        return self.mod[self.func_name]


@dataclass(frozen=True)
class BuildResult:
    """A built candidate: the shared object to run, or why there is none.

    Attributes
    ----------
    artifact_path : str or None
        The exported shared object (``None`` on error). It lives in the builder's work
        directory until the builder is closed (or :func:`measure` removes it).
    error_code : ErrorCode
        ``NONE``, ``BUILD_ERROR`` or ``BUILD_TIMEOUT``.
    error_msg : str
        Detail of the error ("" on success).
    build_s : float
        Seconds spent (wall clock, as the parent saw it).
    device_source : str or None
        For CUDA targets, the generated CUDA C source (the kernel can be inspected or
        compile-tested without a GPU); else ``None``.
    """

    artifact_path: str | None
    error_code: ErrorCode = ErrorCode.NONE
    error_msg: str = ""
    build_s: float = 0.0
    device_source: str | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """True if the build succeeded."""
        return self.error_code == ErrorCode.NONE


@dataclass(frozen=True)
class MeasureResult:
    """Latencies of one candidate, or the error that prevented them.

    Attributes
    ----------
    latencies_ms : tuple of float
        One entry per repeat (each the mean of ``number`` calls), in milliseconds; with
        ``cache_flush`` (the runners' default), every call was timed on flushed CPU caches
        (see :class:`~alt_tvm.bench.timing.TimingPolicy`).
    error_code : ErrorCode
    error_msg : str
    build_s, run_s : float
        Seconds spent building and running (wall clock).
    board : str
        The RPC server that ran it (``host:port`` as the tracker gave it); "" for a local
        run, or a failure before a server was assigned.
    """

    latencies_ms: tuple[float, ...] = ()
    error_code: ErrorCode = ErrorCode.NONE
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    board: str = ""

    @property
    def ok(self) -> bool:
        """True if the candidate ran and was timed."""
        return self.error_code == ErrorCode.NONE

    @property
    def median_ms(self) -> float:
        """Median latency in ms (``inf`` on error, so failures sort last)."""
        return statistics.median(self.latencies_ms) if self.ok and self.latencies_ms else float("inf")

    def to_record(
        self, measure_input: MeasureInput, *, target: Any, trial: int, seed: int | None = None
    ) -> TuningRecord:
        """The log line for this result (see :class:`~alt_tvm.records.TuningRecord`).

        ``target`` is a Target, a target dict, a HardwareTarget or its JSON string.
        """
        return TuningRecord(
            workload_key=measure_input.workload_key,
            target=target_key(target),
            candidate=measure_input.candidate,
            latencies_ms=self.latencies_ms if self.ok else (),
            error_code=None if self.ok else self.error_code.name,
            error_msg=self.error_msg,
            build_s=self.build_s,
            run_s=self.run_s,
            trial=trial,
            seed=seed,
            board=self.board,
        )


# --------------------------------------------------------------------------------------
# Interfaces


class Builder(abc.ABC):
    """Turns :class:`MeasureInput` into :class:`BuildResult`; a context manager."""

    @abc.abstractmethod
    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """Build every input; one result per input, in order. Never raises for a bad candidate."""

    def close(self) -> None:  # noqa: B027 - optional hook, most builders hold resources
        """Release worker processes and temporary files (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Runner(abc.ABC):
    """Times built candidates; a context manager."""

    @abc.abstractmethod
    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[MeasureResult]:
        """Time every successfully built input; one result per input, in order.

        A failed build gives a result with the build's error code. Never raises for a bad
        candidate.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release worker processes (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _check_batch(inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> None:
        if len(inputs) != len(builds):
            raise ValueError(f"got {len(inputs)} inputs but {len(builds)} build results")
        for item in inputs:
            if not isinstance(item, MeasureInput):
                raise TypeError(f"inputs must be MeasureInput, got {type(item).__name__}")
        for item in builds:
            if not isinstance(item, BuildResult):
                raise TypeError(f"builds must be BuildResult, got {type(item).__name__}")

    @staticmethod
    def _from_failed_build(build: BuildResult) -> MeasureResult:
        return MeasureResult(error_code=build.error_code, error_msg=build.error_msg, build_s=build.build_s)


def measure(
    inputs: Sequence[MeasureInput], *, builder: Builder, runner: Runner, keep_artifacts: bool = False
) -> list[MeasureResult]:
    """Build then run ``inputs``; one result per input, in order.

    Parameters
    ----------
    keep_artifacts : bool
        Keep the built shared objects (default: each is deleted once timed).
    """
    builds = builder.build(inputs)
    try:
        return runner.run(inputs, builds)
    finally:
        if not keep_artifacts:
            for build in builds:
                if build.artifact_path:
                    shutil.rmtree(os.path.dirname(build.artifact_path), ignore_errors=True)


# --------------------------------------------------------------------------------------
# Shared by the runners


def _check_timing(timeout_s: float, n_parallel: int) -> None:
    # number, repeat, min_repeat_ms and cache_flush are checked by TimingPolicy
    _positive("timeout_s", timeout_s)
    _positive("n_parallel", n_parallel, integer=True)


_DEVICES = ("cpu", "cuda")


def _time_module(module: Any, func_name: str, dev: Any, specs: tuple[ArgSpec, ...], timing: TimingPolicy,
                 seed: int) -> list[float]:
    """Latencies (ms) of ``module[func_name]`` on ``dev`` (local or remote), after a warm-up call.

    Timed with ``timing`` (by default on flushed CPU caches: see
    :class:`~alt_tvm.bench.timing.TimingPolicy`).
    """
    args = random_arguments(specs, dev, seed=seed)
    module[func_name](*args)  # warm-up; also surfaces run errors before timing
    dev.sync()
    return timing.time(module, func_name, dev, args)
