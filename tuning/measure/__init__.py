"""Measuring candidates: build kernels in worker processes, time them locally or over RPC.

The tuner hands a batch of :class:`MeasureInput` (a workload key, the candidate's JSON
description and its scheduled ``tvm.IRModule``) to a :class:`Builder`, which returns one
:class:`BuildResult` per input (a shared object on disk, or an error code); a
:class:`Runner` then times each built kernel and returns one :class:`MeasureResult` per
input. Nothing here raises for a bad candidate: a kernel that fails to build, crashes,
hangs or cannot reach its board gives an :class:`ErrorCode`, so one bad point never stops
a tuning run; :func:`is_transient` tells which codes say nothing about the candidate
(a lost board: measure it again). :func:`measure` chains the two, and
:meth:`MeasureResult.to_record` turns a result into a
:class:`~alt_tvm.records.TuningRecord` for the log. These contracts live in ``base``;
each implementation has its own module:

* :class:`LocalBuilder` (``builder``) compiles with ``tvm.compile`` in a pool of worker
  processes (``pool``: TVM's ``PopenWorker``, so a compiler crash or hang kills a worker,
  not the tuner) and exports a shared object; for a board with a ``cross_compiler``
  (``alt_tvm.target``) it links with that gcc (``cross_compiler``), and for CUDA targets
  it also returns the CUDA C source.
* :class:`LocalRunner` (``local_runner``) loads and times each kernel in a worker process
  (a segfaulting kernel kills the worker, not the tuner) with ``time_evaluator`` on random
  inputs.
* :class:`RPCRunner` (``rpc_runner``) uploads each kernel through a ``tvm.rpc`` tracker to
  a server with the given key (e.g. a board running ``python -m tvm.exec.rpc_server``) and
  times it there.

Example
-------
>>> with LocalBuilder(target=host()) as builder, LocalRunner() as runner:  # doctest: +SKIP
...     results = measure([MeasureInput(workload_key="mm", candidate={}, mod=sch.mod)],
...                       builder=builder, runner=runner)
"""

from .base import (
    REMOTE_PREFIX,
    ArgSpec,
    Builder,
    BuildResult,
    ErrorCode,
    MeasureInput,
    MeasureResult,
    Runner,
    argument_specs,
    classify_exception,
    is_transient,
    measure,
    random_arguments,
)
from .builder import LocalBuilder
from .cross_compiler import CrossCompilerNotFoundError
from .local_runner import LocalRunner
from .rpc_runner import RPCRunner

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
    "REMOTE_PREFIX",
    "argument_specs",
    "classify_exception",
    "is_transient",
    "measure",
    "random_arguments",
]
