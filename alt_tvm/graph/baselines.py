"""Baselines for whole models: TVM's untuned build, ONNX Runtime, PyTorch, and a wall-clock timer.

Every runner is a callable taking NumPy arrays (the model inputs, in order) and returning a
list of NumPy arrays (the outputs, in order), so tests and the end-to-end benchmark treat
all of them alike, and timings include the same host-side conversions.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import tvm
from tvm import relax

from alt_tvm.deploy.model import flatten_outputs
from alt_tvm.native_log import tvm_output_to_log

from .frontend import ImportedModel

__all__ = [
    "ORTRunner",
    "OpenVINORunner",
    "TVMRunner",
    "TorchRunner",
    "onnxruntime_session",
    "openvino_session",
    "quiet_tvm_pool",
    "time_callable",
    "time_interleaved",
    "torch_runner",
    "tvm_default_build",
]

Pipeline = Literal["default", "zero", "cpu"]


def _check_threads(threads: int) -> int:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    return threads


class TVMRunner:
    """A compiled Relax module on the CPU through ``relax.VirtualMachine``; call with NumPy arrays.

    Attributes
    ----------
    executable : tvm.runtime.Executable
        What ``tvm.compile`` returned.
    vm : tvm.relax.VirtualMachine
        The virtual machine running ``main``.
    """

    def __init__(self, executable: Any, device: Any | None = None) -> None:
        self.device = device if device is not None else tvm.cpu()
        self.executable = executable
        with tvm_output_to_log():
            self.vm = relax.VirtualMachine(executable, self.device)
        self._main = self.vm["main"]

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        # not np.ascontiguousarray: it turns a 0-d input into shape (1,), which the VM rejects
        tensors = [tvm.runtime.tensor(np.asarray(a, order="C"), self.device) for a in args]
        return flatten_outputs(self._main(*tensors))


def tvm_default_build(mod: tvm.IRModule | ImportedModel, target: Any | None = None, *,
                      pipeline: Pipeline = "default") -> TVMRunner:
    """Build a Relax module with TVM's own, untuned flow and return a runner for it.

    Parameters
    ----------
    mod : tvm.IRModule or ImportedModel
        The Relax module (weights bound as constants), e.g. ``load_model(...).mod``.
    target : tvm.target.Target or dict or str, optional
        Compilation target; the host's LLVM target (``alt_tvm.target.host().to_tvm()``) if omitted.
    pipeline : {"default", "zero", "cpu"}
        Which of TVM 0.27's stock Relax pipelines runs before code generation:

        * ``"default"`` -- the untuned default, i.e. exactly ``tvm.compile(mod, target)``:
          ``relax_pipeline="default"`` is ``relax.pipeline.default_build_pipeline()`` on CPU
          targets (DispatchSampling, DispatchSortScan, LegalizeOps, then the VM lowering passes
          RewriteDataflowReshape ... AttachGlobalSymbol), with *no* FoldConstant and *no*
          operator fusion; ``tir_pipeline="default"`` lowers the legalised PrimFuncs with no
          schedule (no parallel loops, no explicit vectorisation).
        * ``"zero"`` -- ``relax.get_pipeline("zero")`` first (LegalizeOps,
          AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR), then ``tvm.compile``: the
          flow that MetaSchedule tuning starts from, untuned.
        * ``"cpu"`` -- ``relax.get_default_pipeline(target)``, the cpu_generic backend pipeline
          (library dispatch, legalize + fold + fuse, lowering) that ``tvm.compile`` uses only
          for GPU targets.

    Returns
    -------
    TVMRunner
        Callable on NumPy arrays returning the outputs as a list of NumPy arrays.
    """
    if isinstance(mod, ImportedModel):
        mod = mod.mod
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule or an ImportedModel, got {type(mod).__name__}")
    if target is None:
        from alt_tvm.target import host

        target = host().to_tvm()
    target = tvm.target.Target(target)
    if pipeline not in ("default", "zero", "cpu"):
        raise ValueError(f"pipeline must be 'default', 'zero' or 'cpu', got {pipeline!r}")
    with tvm_output_to_log():
        if pipeline == "default":
            executable = tvm.compile(mod, target)
        elif pipeline == "zero":
            with target:
                mod = relax.get_pipeline("zero")(mod)
            executable = tvm.compile(mod, target)
        else:
            executable = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
    return TVMRunner(executable)


class ORTRunner:
    """An ONNX Runtime CPU session; call with NumPy arrays in the order of the model's inputs.

    Attributes
    ----------
    session : onnxruntime.InferenceSession
    input_names, output_names : tuple of str
    """

    def __init__(self, session: Any) -> None:
        self.session = session
        self.input_names = tuple(i.name for i in session.get_inputs())
        self.output_names = tuple(o.name for o in session.get_outputs())

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        if len(args) != len(self.input_names):
            raise ValueError(f"the model takes {len(self.input_names)} inputs {self.input_names}, got {len(args)}")
        return list(self.session.run(None, dict(zip(self.input_names, args))))


class OpenVINORunner:
    """An OpenVINO model compiled for the CPU; call with NumPy arrays in input order.

    Attributes
    ----------
    compiled : openvino.CompiledModel
    request : openvino.InferRequest
        The one request every call runs (a latency setting: one call at a time).
    """

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.inputs = len(compiled.inputs)

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        if len(args) != self.inputs:
            raise ValueError(f"the model takes {self.inputs} inputs, got {len(args)}")
        self.request.infer(dict(enumerate(args)))
        return [self.request.get_output_tensor(i).data.copy() for i in range(len(self.compiled.outputs))]


def openvino_session(path: str | os.PathLike, *, threads: int = 1) -> OpenVINORunner:
    """OpenVINO's CPU plugin (oneDNN's JIT kernels) on an ONNX file, as a latency-oriented
    user would set it: ``threads`` inference threads, FP32 (no bf16 or f16 downcast), threads
    not pinned to cores (pinned, they would fight the runtime timed next to them).

    Raises
    ------
    ImportError
        Where OpenVINO is not installed (``pip install openvino==2026.4.1``).
    """
    import openvino

    config = {"INFERENCE_NUM_THREADS": _check_threads(threads), "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": "f32", "ENABLE_CPU_PINNING": "NO"}
    return OpenVINORunner(openvino.Core().compile_model(os.fspath(path), "CPU", config))


def onnxruntime_session(path_or_proto: str | os.PathLike | Any, *, threads: int = 1) -> ORTRunner:
    """An ONNX Runtime session on the CPU with ``threads`` intra-op threads and all graph optimisations.

    Parameters
    ----------
    path_or_proto : str, os.PathLike or onnx.ModelProto
        The model.
    threads : int
        Intra-op thread count (inter-op is 1, sequential execution), so ORT uses the same
        number of cores as the compiled code it is compared with. Idle intra-op threads do
        not spin (``session.intra_op.allow_spinning = "0"``): a spinning pool would take the
        cores from the runtime timed next to it in the same process.

    Returns
    -------
    ORTRunner
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = _check_threads(threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = path_or_proto
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    elif not isinstance(model, (str, bytes)):
        model = model.SerializeToString()  # an onnx.ModelProto
    return ORTRunner(ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]))


class TorchRunner:
    """A PyTorch module run in inference mode with a fixed intra-op thread count.

    ``torch.set_num_threads`` is process-wide: the runner sets it before each call if another
    piece of code changed it.
    """

    def __init__(self, module: Any, threads: int) -> None:
        self.module = module
        self.threads = threads

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        import torch

        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            # np.asarray keeps a 0-d input 0-d (np.ascontiguousarray makes it shape (1,))
            return flatten_outputs(self.module(*(torch.from_numpy(np.asarray(a, order="C")) for a in args)))


def torch_runner(module: Any, *, threads: int = 1) -> TorchRunner:
    """A runner for ``module`` (put in eval mode) using ``threads`` intra-op threads.

    Parameters
    ----------
    module : torch.nn.Module
    threads : int

    Returns
    -------
    TorchRunner
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    return TorchRunner(module.eval(), _check_threads(threads))


def time_callable(fn: Callable[..., Any], args: Sequence[Any], *, warmup: int = 3,
                  repeat: int = 20) -> tuple[float, float]:
    """Wall-clock latency of ``fn(*args)``: ``warmup`` untimed calls, then ``repeat`` timed ones.

    Parameters
    ----------
    fn : callable
    args : sequence
        Positional arguments of every call.
    warmup : int
        Calls before timing (first-call allocation, thread-pool start-up, caches).
    repeat : int
        Timed calls, each measured on its own with ``time.perf_counter``.

    Returns
    -------
    tuple of float
        ``(min_ms, median_ms)``.
    """
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be a positive int, got {repeat!r}")
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - start) * 1e3)
    return min(times), statistics.median(times)


def quiet_tvm_pool() -> None:
    """Make TVM's thread pool stop polling soon after each call (``TVM_THREAD_POOL_SPIN_COUNT``
    = :data:`alt_tvm.deploy.model.POOL_SPIN_COUNT`) unless the user set it, for timing TVM
    beside another runtime in one process.

    TVM's pool reads the variable when it starts (its first parallel kernel), so call this
    before. With TVM's own default (300000 polls) a worker keeps its core long after a model
    call, and ONNX Runtime, timed next, runs slower (MobileNet-V2 at batch 1 on 2 threads:
    4.92 ms instead of 4.04 ms). Not polling at all (0) costs alt-tvm 8-16% instead (a
    sleeping worker is woken for every kernel). The short poll alt-tvm's build sets anyway
    (:func:`alt_tvm.deploy.model.use_runtime_threads`) does neither.
    """
    from alt_tvm.deploy.model import POOL_SPIN_COUNT

    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(POOL_SPIN_COUNT))


def round_order(count: int, round_index: int) -> list[int]:
    """Indices ``0..count-1`` in the order round ``round_index`` runs them: rotated by one each
    round, so no runner always goes first (after another runner, or after a pause)."""
    shift = round_index % count
    return list(range(shift, count)) + list(range(shift))


def run_interleaved(count: int, *, rounds: int, run: Callable[[int], Any]) -> list[list[Any]]:
    """``run(i)`` for each of ``count`` runners in ``rounds`` rounds, a different one first each
    round (:func:`round_order`); per runner, its results in round order. The one interleaving
    loop of every comparison here (timings, profiles, A/B builds)."""
    results: list[list[Any]] = [[] for _ in range(count)]
    for r in range(rounds):
        for i in round_order(count, r):
            results[i].append(run(i))
    return results


def time_interleaved(runners: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]], *, rounds: int = 7,
                     repeat: int = 10, warmup: int = 3, pause_s: float = 0.02) -> dict[str, tuple[float, list[float]]]:
    """Time several runners in interleaved rounds, so drifts of the machine's load hit all alike.

    Each round times every runner once (``repeat`` calls, their median), starting with a
    different runner each round; the result per runner is the median over the rounds.
    Each turn starts with a pause of ``pause_s`` and one untimed call, so no runner pays
    for the caches or the threads another left behind. That is not enough next to a TVM
    model whose pool spins: its worker, pinned to a core, keeps ONNX Runtime's second
    thread off it (ORT's MobileNet-V2: 8.75 ms instead of 4.85 ms). Run such comparisons
    with :func:`quiet_tvm_pool` set before TVM's first parallel kernel.

    Parameters
    ----------
    runners
        Label -> (callable, its positional arguments).
    rounds, repeat, warmup
        Rounds; timed calls per runner and round; untimed calls per runner before round 1.
    pause_s
        Seconds of sleep before each runner's turn.

    Returns
    -------
    dict
        Label -> (median over rounds in ms, the rounds' medians).
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    labels = list(runners)
    for label in labels:
        fn, args = runners[label]
        for _ in range(warmup):
            fn(*args)
    def one(i: int) -> float:
        fn, args = runners[labels[i]]
        time.sleep(pause_s)
        return time_callable(fn, args, warmup=1, repeat=repeat)[1]

    samples = run_interleaved(len(labels), rounds=rounds, run=one)
    return {label: (statistics.median(values), values) for label, values in zip(labels, samples)}
