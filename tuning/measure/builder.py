"""The local builder: compiles candidates with alt-tvm's TIR pipeline (:func:`alt_tvm.lowering.compile`, as
the model build does) in worker processes on this machine."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm

from alt_tvm import lowering
from alt_tvm.target import process_cores
from alt_tvm.toolchain import export_library, require_cross_compiler

from .base import Builder, BuildResult, ErrorCode, MeasureInput, _format_exception, _positive
from .cross_compiler import _resolve_target
from .pool import _Status, _WorkerPool

__all__ = ["LocalBuilder"]


def _build_task(mod_json: str, target_json: str, cross_compiler: str | None, out_dir: str) -> tuple:
    """In a worker: compile and export; ("ok", path, cuda source, s) or ("error", message, s)."""
    started = time.perf_counter()
    try:
        mod = tvm.ir.load_json(mod_json)
        target = tvm.target.Target(json.loads(target_json))
        executable = lowering.compile(mod, target=target)
        source = None
        if target.kind.name == "cuda":
            sources = [m.inspect_source() for m in executable.mod.imports if m.kind == "cuda"]
            if not sources:
                message = "no CUDA kernel was generated (are the loops bound to blockIdx/threadIdx?)"
                return ("error", message, time.perf_counter() - started)
            source = "\n".join(sources)
        path = os.path.join(out_dir, "kernel.so")
        export_library(executable, path, cross_compiler=cross_compiler)
        return ("ok", path, source, time.perf_counter() - started)
    except Exception as err:  # noqa: BLE001 - reported as BUILD_ERROR
        return ("error", _format_exception(err), time.perf_counter() - started)


class LocalBuilder(Builder):
    """Builds candidates with :func:`alt_tvm.lowering.compile` in worker processes on this machine.

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
            require_cross_compiler(self.cross_compiler, purpose=f"links kernels for target {name!r}")
        if n_parallel is None:
            n_parallel = process_cores()
        _positive("n_parallel", n_parallel, integer=True)
        _positive("timeout_s", timeout_s)
        self.n_parallel = n_parallel
        self.timeout_s = float(timeout_s)
        self._owns_dir = work_dir is None
        self.work_dir = Path(tempfile.mkdtemp(prefix="alt_tvm_build_") if work_dir is None else work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._target_json = str(self.target)
        self._pool: _WorkerPool | None = None
        self._pool_lock = threading.Lock()
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
        with self._pool_lock:  # batches may come from several threads (a pipelined measure)
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
