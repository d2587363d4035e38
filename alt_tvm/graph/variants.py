"""Build one model several times, each with its own tuning log, in worker processes at once.

The in-model stage of tuning (:mod:`alt_tvm.in_model`) times several copies of a model that
differ only in how some workloads are lowered. Each copy is a whole build (import, layout
pass, LLVM code generation), single-threaded, so on a machine with ``n`` cores ``n`` copies
build in about the time of one. A worker imports the model itself (from its file, or from
the Relax module serialised once with ``tvm.ir.save_json``), builds a copy, exports it as an
artifact (:mod:`alt_tvm.deploy.artifact`) and returns the kernels it emitted; this process
loads the artifact. Workers are TVM ``PopenWorker`` processes, so a compiler crash kills a
worker, not the tuner: a copy whose worker failed is built again here, where a real error
is raised.

A copy is only timed, never deployed, and the VM calls its kernels with the buffers the
build planned, so its kernels are compiled without their argument checks
(``tirx.disable_assert``): the checks, per argument and dimension, are half the machine
code of a kernel with many inputs (DenseNet-121: 39 s -> 20 s of object code per copy), and
cost every copy the same per call.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from alt_tvm.deploy.artifact import load_local
from alt_tvm.deploy.model import RunnableModel
from alt_tvm.options import BuildOptions
from alt_tvm.records import TunedLog
from alt_tvm.target import process_cores

from .build import build
from .frontend import load_model
from .report import Kernel

__all__ = ["BuiltVariant", "VariantBuilder"]

logger = logging.getLogger(__name__)

#: The Relax module a worker last imported, by source, so a worker building several copies
#: imports the model once.
_WORKER_MODULE: dict[tuple, Any] = {}


@dataclass(frozen=True)
class BuiltVariant:
    """One built copy: the model to run, and the kernels its per-kernel timing attributes
    to workloads (:attr:`~alt_tvm.graph.report.BuildReport.timed_kernels`)."""

    model: RunnableModel
    kernels: tuple[Kernel, ...]


class VariantBuilder:
    """Builds copies of one imported model with :func:`~alt_tvm.graph.build.build`.

    Parameters
    ----------
    mod
        The imported Relax module (:func:`~alt_tvm.graph.frontend.load_model`).
    options
        The build options of every copy (each copy adds its own ``records``).
    source
        The model file ``mod`` was imported from, with ``input_shapes``: a worker imports it
        again, which is faster than deserialising ``mod``; None: workers read ``mod`` from
        JSON.
    workers
        Copies built at once in worker processes (None: the cores this process may use); 1
        builds each copy in this process.

    Use it as a context manager (or call :meth:`close`): the artifacts live in a temporary
    directory until then.
    """

    def __init__(self, mod: Any, options: BuildOptions, *, source: str | os.PathLike[str] | None = None,
                 input_shapes: Mapping[str, Sequence[int]] | None = None, workers: int | None = None) -> None:
        if workers is None:
            workers = process_cores()
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"VariantBuilder: workers must be an int >= 1 or None, got {workers!r}")
        self.mod, self.options, self.workers = mod, options, workers
        self._shapes = None if input_shapes is None else {k: tuple(int(d) for d in v) for k, v in input_shapes.items()}
        self._source = None if source is None else os.fspath(source)
        self._dir: tempfile.TemporaryDirectory | None = None
        self._pool: Any = None
        self._count = 0

    def __enter__(self) -> VariantBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self, logs: Sequence[TunedLog]) -> list[BuiltVariant]:
        """One copy per log, in order (several at once with more than one worker)."""
        if self.workers == 1 or len(logs) == 1:
            return [self._build_here(log) for log in logs]
        source = self._worker_source()
        futures = []
        for log in logs:
            out = Path(self._directory(), f"copy{self._count}")
            self._count += 1
            futures.append((log, out, self._executor(len(logs)).submit(_build_in_worker, source, self.options, log,
                                                               os.fspath(out))))
        built = []
        for log, out, future in futures:
            try:
                kernels = future.result()
                built.append(BuiltVariant(load_local(out), tuple(kernels)))
            except Exception as err:  # noqa: BLE001 - a worker's failure is retried here, where it raises
                logger.warning("variant %s: the worker's build failed (%s: %s); building it in this process",
                               log.path, type(err).__name__, err)
                built.append(self._build_here(log))
        return built

    def close(self) -> None:
        """Stop the workers and delete the artifacts (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def _build_here(self, log: TunedLog) -> BuiltVariant:
        with warnings.catch_warnings(), _unchecked():
            warnings.filterwarnings("ignore", message="alt-tvm:")  # each copy's partition summary
            compiled = build(self.mod, self.options, records=log)
        return BuiltVariant(compiled, tuple(compiled.report.timed_kernels))

    def _directory(self) -> str:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="alt_tvm_variants_")
        return self._dir.name

    def _executor(self, batch: int) -> Any:
        if self._pool is None:  # no more workers than the first (largest) batch has copies
            from tvm.support.popen_pool import PopenPoolExecutor

            self._pool = PopenPoolExecutor(max_workers=min(self.workers, batch))
        return self._pool

    def _worker_source(self) -> tuple:
        if self._source is not None:
            return ("file", self._source, tuple(sorted((self._shapes or {}).items())))
        path = Path(self._directory(), "model.json")
        if not path.exists():
            path.write_text(tvm.ir.save_json(self.mod))
        return ("json", os.fspath(path))


def _build_in_worker(source: tuple, options: BuildOptions, log: TunedLog, out: str) -> list[Kernel]:
    """In a worker: import the model (once per worker), build it with ``log``, export it to ``out``."""
    mod = _WORKER_MODULE.get(source)
    if mod is None:
        if source[0] == "file":
            mod = load_model(source[1], input_shapes=dict(source[2]) or None).mod
        else:
            mod = tvm.ir.load_json(Path(source[1]).read_text())
        _WORKER_MODULE.clear()
        _WORKER_MODULE[source] = mod
    with warnings.catch_warnings(), _unchecked():
        warnings.filterwarnings("ignore", message="alt-tvm:")
        compiled = build(mod, options, records=log)
        compiled.export(out)
    return list(compiled.report.timed_kernels)


def _unchecked() -> tvm.transform.PassContext:
    """The context a copy is built (and its object code emitted) in: kernels without argument checks."""
    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(opt_level=current.opt_level, required_pass=current.required_pass,
                                     disabled_pass=current.disabled_pass, instruments=current.instruments,
                                     config={**current.config, "tirx.disable_assert": True})
