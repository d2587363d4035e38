"""ONNX Runtime as a peer: a CPU session set up the one way every comparison here uses."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .base import check_threads, process_affinity

__all__ = ["ORTRunner", "onnxruntime_cuda_session", "onnxruntime_session"]


class ORTRunner:
    """An ONNX Runtime CPU session; call with NumPy arrays in the order of the model's inputs.

    Attributes
    ----------
    session : onnxruntime.InferenceSession
    input_names, output_names : tuple of str
    threads : int
        Intra-op threads of the session.
    """

    name = "onnxruntime"

    def __init__(self, session: Any, *, threads: int = 1) -> None:
        self.session = session
        self.threads = threads
        self.input_names = tuple(i.name for i in session.get_inputs())
        self.output_names = tuple(o.name for o in session.get_outputs())

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        if len(args) != len(self.input_names):
            raise ValueError(f"the model takes {len(self.input_names)} inputs {self.input_names}, got {len(args)}")
        return list(self.session.run(None, dict(zip(self.input_names, args))))


def onnxruntime_session(path_or_proto: str | os.PathLike | Any, *, threads: int = 1, optimize: bool = True,
                        profile_prefix: str | None = None) -> ORTRunner:
    """An ONNX Runtime session on the CPU with ``threads`` intra-op threads.

    Parameters
    ----------
    path_or_proto : str, os.PathLike, bytes or onnx.ModelProto
        The model.
    threads : int
        Intra-op thread count (inter-op is 1, sequential execution), so ORT uses the same
        number of cores as the compiled code it is compared with. Idle intra-op threads do
        not spin (``session.intra_op.allow_spinning = "0"``, and the inter-op pool's likewise):
        a spinning pool would take the cores from the runtime timed next to it in the same
        process.
    optimize : bool
        All of ORT's graph optimisations (its default); False keeps every node of the graph
        as it is (a run that reads intermediate tensors).
    profile_prefix : str, optional
        Turn ORT's profiler on, writing its trace to files starting with this prefix
        (``session.end_profiling()`` returns the trace's path).

    Returns
    -------
    ORTRunner

    Raises
    ------
    ValueError
        If ``threads`` is not an int >= 1.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = check_threads(threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    model = path_or_proto
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    elif not isinstance(model, (str, bytes)):
        model = model.SerializeToString()  # an onnx.ModelProto
    with process_affinity():
        return ORTRunner(ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]), threads=threads)


def onnxruntime_cuda_session(path: str | os.PathLike, *, tf32: bool = False) -> ORTRunner:
    """An ONNX Runtime session on the first CUDA GPU (its CUDA execution provider), TF32 on or
    off (``use_tf32``), all graph optimisations.

    Raises
    ------
    RuntimeError
        If this ONNX Runtime has no CUDA execution provider (the ``onnxruntime`` package is
        CPU-only; ``onnxruntime-gpu`` has it).
    """
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError(f"ONNX Runtime {ort.__version__} has no CUDAExecutionProvider "
                           f"(providers: {', '.join(ort.get_available_providers())})")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers = [("CUDAExecutionProvider", {"device_id": 0, "use_tf32": int(tf32)})]
    return ORTRunner(ort.InferenceSession(os.fspath(path), options, providers=providers))
