"""Measuring candidates: build kernels in worker processes, time them locally or over RPC.

The tuner hands a batch of :class:`MeasureInput` (a workload key, the candidate's JSON
description and its scheduled ``tvm.IRModule``) to a :class:`Builder`, which returns one
:class:`BuildResult` per input (a shared object on disk, or an error code); a
:class:`Runner` then times each built kernel and returns one :class:`MeasureResult` per
input. Nothing here raises for a bad candidate: a kernel that fails to build, crashes,
hangs or cannot reach its board gives an :class:`ErrorCode`, so one bad point never stops
a tuning run. :func:`measure` chains the two, and :meth:`MeasureResult.to_record` turns a
result into a :class:`~alt_tvm.records.TuningRecord` for the log.

Implementations:

* :class:`LocalBuilder` compiles with ``tvm.compile`` in a pool of worker processes
  (TVM's ``PopenWorker``: a compiler crash or hang kills a worker, not the tuner) and
  exports a shared object; for a board with a ``cross_compiler`` (``alt_tvm.target``)
  it links with that gcc, and for CUDA targets it also returns the CUDA C source.
* :class:`LocalRunner` loads and times each kernel in a worker process (a segfaulting
  kernel kills the worker, not the tuner) with ``time_evaluator`` on random inputs.
* :class:`RPCRunner` uploads each kernel through a ``tvm.rpc`` tracker to a server with
  the given key (e.g. a board running ``python -m tvm.exec.rpc_server``) and times it
  there.

Example
-------
>>> with LocalBuilder(target=host()) as builder, LocalRunner() as runner:  # doctest: +SKIP
...     results = measure([MeasureInput(workload_key="mm", candidate={}, mod=sch.mod)],
...                       builder=builder, runner=runner)
"""

from __future__ import annotations

import abc
import enum
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import numpy as np
import tvm
from alt_tvm.records import TuningRecord, candidate_key, target_key
from tvm.support.popen_pool import PopenWorker, kill_child_processes

from alt_tvm.target import HardwareTarget, board

__all__ = [
    "ArgSpec",
    "BuildResult",
    "Builder",
    "CrossCompilerNotFoundError",
    "ErrorCode",
    "LocalBuilder",
    "LocalRunner",
    "MeasureInput",
    "MeasureResult",
    "RPCRunner",
    "Runner",
    "argument_specs",
    "measure",
    "random_arguments",
]

# Error messages kept in results and logs are cut to this many characters (tracebacks).
_MAX_MSG = 4000
# The parent kills a worker this long after the worker's own timeout should have fired (it
# cannot fire if a C++ call holds the GIL).
_WATCHDOG_GRACE_S = 2.0


class ErrorCode(enum.IntEnum):
    """Outcome of building and running one candidate (``NONE``: success)."""

    NONE = 0
    BUILD_ERROR = 1
    BUILD_TIMEOUT = 2
    RUN_ERROR = 3
    RUN_TIMEOUT = 4
    #: Reserved for runners that check outputs against a reference (none does yet).
    WRONG_ANSWER = 5
    RPC_ERROR = 6


class CrossCompilerNotFoundError(RuntimeError):
    """The gcc needed to link kernels for a board is not installed (the message says how)."""


def _positive(name: str, value: Any, *, integer: bool = False, allow_zero: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "an int" if integer else "a number"
        raise ValueError(f"{name} must be {kind} {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_MSG else "..." + text[-_MAX_MSG:]


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
        tensor.copyfrom(np.ascontiguousarray(values.astype(dtype)))
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
        One entry per repeat (each the mean of ``number`` calls), in milliseconds.
    error_code : ErrorCode
    error_msg : str
    build_s, run_s : float
        Seconds spent building and running (wall clock).
    """

    latencies_ms: tuple[float, ...] = ()
    error_code: ErrorCode = ErrorCode.NONE
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0

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
# Worker processes


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
    """Initializer of every worker: unpickling it imports this module (and TVM) up front."""


def _format_exception(err: BaseException) -> str:
    return _short(f"{type(err).__name__}: {err}")


def _build_task(mod_json: str, target_json: str, cross_compiler: str | None, out_dir: str) -> tuple:
    """In a worker: compile and export; ("ok", path, cuda source, s) or ("error", message, s)."""
    started = time.perf_counter()
    try:
        from tvm.support import cc

        mod = tvm.ir.load_json(mod_json)
        target = tvm.target.Target(json.loads(target_json))
        executable = tvm.compile(mod, target=target)
        source = None
        if target.kind.name == "cuda":
            sources = [m.inspect_source() for m in executable.mod.imports if m.kind == "cuda"]
            if not sources:
                message = "no CUDA kernel was generated (are the loops bound to blockIdx/threadIdx?)"
                return ("error", message, time.perf_counter() - started)
            source = "\n".join(sources)
        path = os.path.join(out_dir, "kernel.so")
        if cross_compiler:
            executable.export_library(path, fcompile=cc.cross_compiler(cross_compiler))
        else:
            executable.export_library(path)
        return ("ok", path, source, time.perf_counter() - started)
    except Exception as err:  # noqa: BLE001 - reported as BUILD_ERROR
        return ("error", _format_exception(err), time.perf_counter() - started)


def _run_task(
    artifact_path: str, func_name: str, specs: tuple[ArgSpec, ...], device: str, number: int, repeat: int,
    min_repeat_ms: int, seed: int,
) -> tuple:
    """In a worker: load, warm up and time a kernel; ("ok", [ms, ...], s) or ("error", message, s)."""
    started = time.perf_counter()
    try:
        module = tvm.runtime.load_module(artifact_path)
    except Exception as err:  # noqa: BLE001 - reported as RUN_ERROR
        return ("error", "cannot load the kernel: " + _format_exception(err), time.perf_counter() - started)
    try:
        latencies = _time_module(module, func_name, tvm.device(device, 0), specs, number, repeat, min_repeat_ms, seed)
        return ("ok", latencies, time.perf_counter() - started)
    except Exception as err:  # noqa: BLE001 - reported as RUN_ERROR
        return ("error", _format_exception(err), time.perf_counter() - started)


def _time_module(module: Any, func_name: str, dev: Any, specs: tuple[ArgSpec, ...], number: int, repeat: int,
                 min_repeat_ms: int, seed: int) -> list[float]:
    """Latencies (ms) of ``module[func_name]`` on ``dev`` (local or remote), after a warm-up call."""
    args = random_arguments(specs, dev, seed=seed)
    module[func_name](*args)  # warm-up; also surfaces run errors before timing
    dev.sync()
    timer = module.time_evaluator(func_name, dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return [float(r) * 1e3 for r in timer(*args).results]


# --------------------------------------------------------------------------------------
# Targets and cross compilers

# Debian packages providing a cross gcc and the C library it links shared objects against.
_DEBIAN_LIBC = {"aarch64-linux-gnu": "libc6-dev-arm64-cross", "riscv64-linux-gnu": "libc6-dev-riscv64-cross",
                "arm-linux-gnueabihf": "libc6-dev-armhf-cross"}


def _debian_packages(compiler: str) -> str:
    triple = compiler[: -len("-gcc")] if compiler.endswith("-gcc") else compiler
    return " ".join(p for p in (f"gcc-{triple}", _DEBIAN_LIBC.get(triple)) if p)


@cache
def _cross_compiler_problem(compiler: str) -> str | None:
    """Why ``compiler`` cannot link a shared object here (``None``: it can)."""
    if shutil.which(compiler) is None:
        return f"cross compiler {compiler!r} is not installed"
    with tempfile.TemporaryDirectory(prefix="alt_tvm_cc_") as tmp:
        probe = subprocess.run(
            [compiler, "-x", "c", "-shared", "-fPIC", "-o", os.path.join(tmp, "probe.so"), "-"],
            input=b"int alt_tvm_probe(void) { return 0; }\n", capture_output=True, timeout=60,
        )
    if probe.returncode != 0:
        detail = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        return f"cross compiler {compiler!r} cannot link a shared object ({detail[0]})"
    return None


def _resolve_target(target: Any, cross_compiler: str | None) -> tuple[tvm.target.Target, str | None, str]:
    """(Target, the gcc that links for it or None for the host's, a name for messages)."""
    if isinstance(target, str):
        target = board(target)
    if isinstance(target, HardwareTarget):
        name, board_cc, target = target.name, target.cross_compiler, target.to_tvm()
    else:
        if isinstance(target, Mapping):
            target = tvm.target.Target(dict(target))
        if not isinstance(target, tvm.target.Target):
            raise TypeError(
                "target must be a board name, an alt_tvm.target.HardwareTarget, a tvm.target.Target or a "
                f"target dict, got {type(target).__name__}"
            )
        name, board_cc = target.kind.name, None
    if cross_compiler is not None:
        if not isinstance(cross_compiler, str) or not cross_compiler:
            raise TypeError(f"cross_compiler must be a non-empty str, got {cross_compiler!r}")
        return target, cross_compiler, name
    arch = _foreign_arch(target)
    if arch is None:
        return target, None, name  # also a board of this machine's architecture: the native gcc links
    return target, board_cc or _default_cross_compiler(arch), name


def _foreign_arch(target: tvm.target.Target) -> str | None:
    """The architecture of an LLVM target's triple if it is not this machine's, else ``None``."""
    if target.kind.name != "llvm":
        return None  # device targets export with the host compiler (their host is llvm)
    arch = str(target.attrs.get("mtriple", "") or "").split("-")[0]
    host_arch = platform.machine().lower()
    if not arch or arch == host_arch or (arch, host_arch) in {("x86_64", "amd64"), ("arm64", "aarch64")}:
        return None
    return arch


def _default_cross_compiler(arch: str) -> str:
    if arch in ("aarch64", "arm64"):
        return "aarch64-linux-gnu-gcc"
    if arch.startswith("riscv64"):
        return "riscv64-linux-gnu-gcc"
    raise ValueError(f"targets for {arch!r} need a cross compiler: pass cross_compiler='<gcc driver>'")


# --------------------------------------------------------------------------------------
# Builders and runners


class LocalBuilder(Builder):
    """Builds candidates with ``tvm.compile`` in worker processes on this machine.

    Parameters
    ----------
    target : str, HardwareTarget, tvm.target.Target or dict
        What to build for: a board name of :func:`alt_tvm.target.board` (``"host"``,
        ``"kirin990"``, ...), a board description, a Target or a target dict.
    n_parallel : int, optional
        Worker processes (default: the CPUs this process may use).
    timeout_s : float
        Limit per candidate (compile + export); beyond it the worker is killed and the
        result is ``BUILD_TIMEOUT``.
    cross_compiler : str, optional
        gcc driver that links the shared object (e.g. ``"aarch64-linux-gnu-gcc"``).
        Default: the board's ``cross_compiler``, or one inferred from the target's
        ``mtriple`` if it names another architecture; ``None`` for the host.
    work_dir : str or Path, optional
        Where artifacts go (kept on :meth:`close`). Default: a temporary directory that
        :meth:`close` deletes.

    Raises
    ------
    CrossCompilerNotFoundError
        If the cross compiler is missing or cannot link; the message names the Debian
        packages to install.
    ValueError, TypeError
        For bad parameters.
    """

    def __init__(
        self,
        *,
        target: Any,
        n_parallel: int | None = None,
        timeout_s: float = 30.0,
        cross_compiler: str | None = None,
        work_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.target, self.cross_compiler, name = _resolve_target(target, cross_compiler)
        if self.cross_compiler is not None:
            problem = _cross_compiler_problem(self.cross_compiler)
            if problem:
                raise CrossCompilerNotFoundError(
                    f"{problem}; it links kernels for target {name!r}. On Debian/Ubuntu install it with "
                    f"`apt-get install {_debian_packages(self.cross_compiler)}` (or run .ci/install-cross.sh)"
                )
        if n_parallel is None:
            n_parallel = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        _positive("n_parallel", n_parallel, integer=True)
        _positive("timeout_s", timeout_s)
        self.n_parallel = n_parallel
        self.timeout_s = float(timeout_s)
        self._owns_dir = work_dir is None
        self.work_dir = Path(tempfile.mkdtemp(prefix="alt_tvm_build_") if work_dir is None else work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._target_json = str(self.target)
        self._pool: _WorkerPool | None = None
        self._closed = False

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """Build every input in the worker pool (see :meth:`Builder.build`)."""
        if self._closed:
            raise ValueError("LocalBuilder is closed")
        for item in inputs:
            if not isinstance(item, MeasureInput):
                raise TypeError(f"inputs must be MeasureInput, got {type(item).__name__}")
        if not inputs:
            return []
        if self._pool is None:
            self._pool = _WorkerPool(self.n_parallel)
        tasks = []
        for item in inputs:
            out_dir = self.work_dir / uuid.uuid4().hex
            out_dir.mkdir()
            # JSON text crosses the process boundary (save_json is TVM's own serialisation).
            tasks.append((tvm.ir.save_json(item.mod), self._target_json, self.cross_compiler, str(out_dir)))
        outcomes = self._pool.map(_build_task, tasks, timeout_s=self.timeout_s)
        results = []
        for (status, value, seconds), task in zip(outcomes, tasks):
            results.append(self._result(status, value, seconds))
            if not results[-1].ok:
                shutil.rmtree(task[3], ignore_errors=True)
        return results

    def _result(self, status: _Status, value: Any, seconds: float) -> BuildResult:
        # seconds: as the parent saw it (includes a worker's start); a finished task's own time replaces it.
        if status is _Status.TIMEOUT:
            return BuildResult(None, ErrorCode.BUILD_TIMEOUT, f"build exceeded {self.timeout_s:g} s", seconds)
        if status is _Status.CRASH:
            return BuildResult(None, ErrorCode.BUILD_ERROR, "the build process died (crash in the compiler)", seconds)
        if status is _Status.ERROR:
            return BuildResult(None, ErrorCode.BUILD_ERROR, _format_exception(value), seconds)
        if value[0] != "ok":
            return BuildResult(None, ErrorCode.BUILD_ERROR, value[1], value[2])
        return BuildResult(value[1], ErrorCode.NONE, "", value[3], value[2])

    def close(self) -> None:
        """Stop the workers; delete the work directory if the builder created it."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.close()
        if self._owns_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def _check_timing(number: int, repeat: int, min_repeat_ms: int, timeout_s: float, n_parallel: int) -> None:
    _positive("number", number, integer=True)
    _positive("repeat", repeat, integer=True)
    _positive("min_repeat_ms", min_repeat_ms, integer=True, allow_zero=True)
    _positive("timeout_s", timeout_s)
    _positive("n_parallel", n_parallel, integer=True)


_DEVICES = ("cpu", "cuda")


class LocalRunner(Runner):
    """Times built kernels on this machine, each in a worker process.

    Parameters
    ----------
    number : int
        Calls per timed repeat (their mean is one latency).
    repeat : int
        Latencies per candidate.
    min_repeat_ms : int
        Minimum duration of one repeat; ``number`` grows until it is reached (0: off).
    timeout_s : float
        Limit per candidate (load + warm-up + timing), else ``RUN_TIMEOUT``.
    n_parallel : int
        Candidates timed at once (1 unless the machine has cores to spare: parallel runs
        disturb each other's timings).
    device : {"cpu", "cuda"}
        Device the kernels run on.
    seed : int
        Seed of the random inputs (the same for every candidate).
    """

    def __init__(
        self,
        *,
        number: int = 10,
        repeat: int = 3,
        min_repeat_ms: int = 0,
        timeout_s: float = 30.0,
        n_parallel: int = 1,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        _check_timing(number, repeat, min_repeat_ms, timeout_s, n_parallel)
        if device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms
        self.timeout_s, self.n_parallel, self.device, self.seed = float(timeout_s), n_parallel, device, seed
        self._pool: _WorkerPool | None = None
        self._closed = False

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[MeasureResult]:
        """Time every built input in a worker process (see :meth:`Runner.run`)."""
        if self._closed:
            raise ValueError("LocalRunner is closed")
        self._check_batch(inputs, builds)
        results: list[MeasureResult | None] = [None if b.ok else self._from_failed_build(b) for b in builds]
        todo = [i for i, r in enumerate(results) if r is None]
        tasks = []
        for i in list(todo):
            try:
                specs = argument_specs(inputs[i].func)
            except ValueError as err:
                results[i] = MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=str(err),
                                           build_s=builds[i].build_s)
                todo.remove(i)
                continue
            tasks.append((builds[i].artifact_path, inputs[i].func_name, specs, self.device, self.number,
                          self.repeat, self.min_repeat_ms, self.seed))
        if tasks:
            if self._pool is None:
                self._pool = _WorkerPool(self.n_parallel)
            outcomes = self._pool.map(_run_task, tasks, timeout_s=self.timeout_s)
            for i, (status, value, seconds) in zip(todo, outcomes):
                results[i] = _run_result(status, value, seconds, builds[i].build_s, self.timeout_s)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the worker processes."""
        if not self._closed:
            self._closed = True
            if self._pool is not None:
                self._pool.close()


def _run_result(status: _Status, value: Any, seconds: float, build_s: float, timeout_s: float) -> MeasureResult:
    if status is _Status.TIMEOUT:
        return MeasureResult(error_code=ErrorCode.RUN_TIMEOUT, error_msg=f"run exceeded {timeout_s:g} s",
                             build_s=build_s, run_s=seconds)
    if status is _Status.CRASH:
        return MeasureResult(error_code=ErrorCode.RUN_ERROR,
                             error_msg="the runner process died (the kernel crashed, e.g. a segfault)",
                             build_s=build_s, run_s=seconds)
    if status is _Status.ERROR:
        return MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=_format_exception(value), build_s=build_s,
                             run_s=seconds)
    if value[0] != "ok":
        return MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=value[1], build_s=build_s, run_s=value[2])
    return MeasureResult(latencies_ms=tuple(value[1]), build_s=build_s, run_s=value[2])


class RPCRunner(Runner):
    """Times built kernels on remote devices reached through a ``tvm.rpc`` tracker.

    Each candidate gets its own session (``tracker.request(key)``): the shared object is
    uploaded, loaded and timed with ``time_evaluator`` on the remote device, with random
    inputs allocated there. Build the kernels for the board (e.g.
    ``LocalBuilder(target="kirin990")`` cross-compiles them).

    The RPC calls run in daemon threads of this process (the kernel itself runs on the
    server, so a crash there cannot kill the tuner): a call that exceeds ``timeout_s`` is
    abandoned, and the server ends its session after ``session_timeout_s``.

    Parameters
    ----------
    tracker_host : str
    tracker_port : int
    key : str
        Device key the servers registered with (``rpc_server --key``).
    number, repeat, min_repeat_ms : int
        As for :class:`LocalRunner`.
    timeout_s : float
        Limit per candidate (getting a session, upload, load, warm-up, timing).
    session_timeout_s : float, optional
        Lifetime the server grants each session (default ``timeout_s + 10``): it frees the
        board from a kernel that hangs.
    connect_timeout_s : float
        Limit for reaching the tracker; an unreachable tracker gives ``RPC_ERROR`` for the
        whole batch at once.
    n_parallel : int
        Sessions at once (useful with several boards under one key).
    device : {"cpu", "cuda"}
        Remote device (``remote.cpu()`` or ``remote.cuda()``).
    seed : int
        Seed of the random inputs.
    """

    def __init__(
        self,
        *,
        tracker_host: str,
        tracker_port: int,
        key: str,
        number: int = 10,
        repeat: int = 3,
        min_repeat_ms: int = 0,
        timeout_s: float = 30.0,
        session_timeout_s: float | None = None,
        connect_timeout_s: float = 5.0,
        n_parallel: int = 1,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        if not isinstance(tracker_host, str) or not tracker_host:
            raise ValueError(f"tracker_host must be a non-empty str, got {tracker_host!r}")
        if isinstance(tracker_port, bool) or not isinstance(tracker_port, int) or not 0 < tracker_port < 65536:
            raise ValueError(f"tracker_port must be an int in 1..65535, got {tracker_port!r}")
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty str, got {key!r}")
        _check_timing(number, repeat, min_repeat_ms, timeout_s, n_parallel)
        session_timeout_s = timeout_s + 10.0 if session_timeout_s is None else session_timeout_s
        _positive("session_timeout_s", session_timeout_s)
        _positive("connect_timeout_s", connect_timeout_s)
        if device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.tracker_host, self.tracker_port, self.key = tracker_host, tracker_port, key
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms
        self.timeout_s, self.session_timeout_s = float(timeout_s), float(session_timeout_s)
        self.connect_timeout_s, self.n_parallel, self.device, self.seed = (
            float(connect_timeout_s), n_parallel, device, seed)

    @property
    def _address(self) -> str:
        return f"{self.tracker_host}:{self.tracker_port}"

    def check_tracker(self) -> str | None:
        """Why the tracker cannot serve this runner's key now (``None``: it can).

        Checks that the tracker accepts connections within ``connect_timeout_s`` (TVM's
        own client would retry a refused connection for a minute) and that a server with
        ``key`` has registered.
        """
        try:
            socket.create_connection((self.tracker_host, self.tracker_port), timeout=self.connect_timeout_s).close()
        except OSError as err:
            return f"cannot reach tracker {self._address}: {err}"
        outcome = _call_with_timeout(self._summary, self.connect_timeout_s)
        if outcome[0] != "ok":
            return f"tracker {self._address} did not answer a summary request: {outcome[1]}"
        summary = outcome[1]
        keys = set(summary.get("queue_info", {}))
        keys |= {str(s.get("key", "")).split(":", 1)[-1] for s in summary.get("server_info", [])}
        if self.key not in keys:
            return (f"no RPC server with key {self.key!r} is registered at tracker {self._address} "
                    f"(registered keys: {sorted(keys)})")
        return None

    def _summary(self) -> dict:
        tracker = tvm.rpc.connect_tracker(self.tracker_host, self.tracker_port)
        try:
            return tracker.summary()
        finally:
            tracker.close()

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[MeasureResult]:
        """Time every built input on a remote device (see :meth:`Runner.run`)."""
        self._check_batch(inputs, builds)
        results: list[MeasureResult | None] = [None if b.ok else self._from_failed_build(b) for b in builds]
        todo = [i for i, r in enumerate(results) if r is None]
        if not todo:
            return results  # type: ignore[return-value]
        problem = self.check_tracker()
        if problem is not None:
            for i in todo:
                results[i] = MeasureResult(error_code=ErrorCode.RPC_ERROR, error_msg=problem,
                                           build_s=builds[i].build_s)
            return results  # type: ignore[return-value]
        with ThreadPoolExecutor(max_workers=self.n_parallel) as pool:
            for i, result in zip(todo, pool.map(lambda i: self._run_one(inputs[i], builds[i]), todo)):
                results[i] = result
        return results  # type: ignore[return-value]

    def _run_one(self, item: MeasureInput, build: BuildResult) -> MeasureResult:
        try:
            specs = argument_specs(item.func)
        except ValueError as err:
            return MeasureResult(error_code=ErrorCode.RUN_ERROR, error_msg=str(err), build_s=build.build_s)
        phase = ["requesting a session"]  # updated by the worker thread, read on timeout

        def task() -> list[float]:
            tracker = tvm.rpc.connect_tracker(self.tracker_host, self.tracker_port)
            try:
                remote = tracker.request(self.key, priority=1, session_timeout=self.session_timeout_s, max_retry=1)
            finally:
                tracker.close()
            phase[0] = "uploading"
            name = f"alt_tvm_{uuid.uuid4().hex}.so"
            remote.upload(build.artifact_path, name)
            phase[0] = "loading"
            module = remote.load_module(name)
            phase[0] = "running"
            dev = remote.cuda(0) if self.device == "cuda" else remote.cpu(0)
            return _time_module(module, item.func_name, dev, specs, self.number, self.repeat, self.min_repeat_ms,
                                self.seed)

        started = time.perf_counter()
        outcome = _call_with_timeout(task, self.timeout_s)
        seconds = time.perf_counter() - started
        if outcome[0] == "ok":
            return MeasureResult(latencies_ms=tuple(outcome[1]), build_s=build.build_s, run_s=seconds)
        if outcome[0] == "timeout":
            if phase[0] == "requesting a session":
                code, msg = ErrorCode.RPC_ERROR, f"no free server with key {self.key!r} within {self.timeout_s:g} s"
            else:
                code, msg = ErrorCode.RUN_TIMEOUT, f"{phase[0]} exceeded the {self.timeout_s:g} s limit"
            return MeasureResult(error_code=code, error_msg=msg, build_s=build.build_s, run_s=seconds)
        code = ErrorCode.RPC_ERROR if phase[0] in ("requesting a session", "uploading") else ErrorCode.RUN_ERROR
        return MeasureResult(error_code=code, error_msg=f"{phase[0]}: {outcome[1]}", build_s=build.build_s,
                             run_s=seconds)


def _call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[str, Any]:
    """("ok", value), ("error", message) or ("timeout", None); a hung call is left in a daemon thread."""
    box: list[tuple[str, Any]] = []

    def target() -> None:
        try:
            box.append(("ok", fn()))
        except Exception as err:  # noqa: BLE001 - reported to the caller
            box.append(("error", _format_exception(err)))

    thread = threading.Thread(target=target, name="alt_tvm_rpc", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else ("timeout", None)
