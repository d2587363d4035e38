"""OpenVINO as a peer: its CPU plugin (oneDNN's JIT kernels) on an ONNX file. Optional:
``openvino`` is imported only when a session is made (``pip install alt-tvm[bench]``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .base import check_threads, process_affinity

__all__ = ["ISA_CAPS", "ISA_ENV", "OpenVINORunner", "load_failure", "openvino_available", "openvino_kernel_isas",
           "openvino_session"]

#: The environment variable that caps the instruction set of OpenVINO's CPU kernels (its oneDNN
#: reads it once, when the process makes its first kernel: set it before that, e.g. in a child
#: process's environment). ONNX Runtime has no such cap: it always runs the machine's widest.
ISA_ENV = "ONEDNN_MAX_CPU_ISA"
#: Values of :data:`ISA_ENV` a benchmark may ask for, and the word OpenVINO's kernels then carry in
#: their names (``brgconv_avx2_f32``).
ISA_CAPS = {"AVX2": "avx2", "AVX512_CORE": "avx512"}


class OpenVINORunner:
    """An OpenVINO model compiled for the CPU; call with NumPy arrays in input order.

    Attributes
    ----------
    compiled : openvino.CompiledModel
    request : openvino.InferRequest
        The one request every call runs (a latency setting: one call at a time).
    threads : int
        Inference threads.
    """

    name = "openvino"

    def __init__(self, compiled: Any, *, threads: int = 1) -> None:
        self.compiled = compiled
        self.threads = threads
        self.request = compiled.create_infer_request()
        self.inputs = len(compiled.inputs)

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        if len(args) != self.inputs:
            raise ValueError(f"the model takes {self.inputs} inputs, got {len(args)}")
        self.request.infer(dict(enumerate(args)))
        return [self.request.get_output_tensor(i).data.copy() for i in range(len(self.compiled.outputs))]


def openvino_available() -> str:
    """Empty if OpenVINO imports here, else why not (for a skipped peer's note)."""
    try:
        import openvino  # noqa: F401
    except ImportError as err:
        return f"OpenVINO is not installed ({err}; pip install 'alt-tvm[bench]')"
    return ""


def openvino_session(path: str | os.PathLike, *, threads: int = 1, profile: bool = False) -> OpenVINORunner:
    """OpenVINO's CPU plugin on an ONNX file, as a latency-oriented user would set it:
    ``threads`` inference threads, the latency hint, FP32 (no bf16 or f16 downcast), threads
    not pinned to cores (pinned, they would fight the runtime timed next to them). ``profile``
    turns its per-node counters on (the request's ``profiling_info``; not for timing a run).

    Raises
    ------
    ImportError
        Where OpenVINO is not installed (``pip install 'alt-tvm[bench]'``).
    RuntimeError
        Where OpenVINO cannot convert or compile the model: one line naming the file, the
        operator and what OpenVINO said of it (:func:`load_failure`).
    ValueError
        If ``threads`` is not an int >= 1.
    """
    check_threads(threads)
    import openvino

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": "f32", "ENABLE_CPU_PINNING": "NO", "PERF_COUNT": bool(profile)}
    with process_affinity():
        try:
            compiled = openvino.Core().compile_model(os.fspath(path), "CPU", config)
        except RuntimeError as err:
            raise RuntimeError(f"OpenVINO could not load {os.fspath(path)}: {load_failure(err)}") from err
    return OpenVINORunner(compiled, threads=threads)


#: Lines of OpenVINO's error messages that frame what failed: source locations, checks, summaries.
_FRAMING = ("Exception from", "Check ", "While validating", "--", "Summary", "FrontEnd API failed",
            "Model wasn't fully converted")


def load_failure(err: Exception) -> str:
    """What an OpenVINO error says failed, in one line: the operators it names
    (``-- AveragePool-17 with a message:``) and the last line that is not framing (source
    locations, checks, the summary), e.g. ``AveragePool-17: Kernel after dilation has size (dim:
    1280) larger than the data shape after padding (dim: 7) at axis 0.`` for Hugging Face
    EfficientNet-B0's pool, whose window is larger than its map."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    ops = [line[3:].split(" with a message")[0] for line in lines
           if line.startswith("-- ") and "with a message" in line]
    said = [line for line in lines if not line.startswith(_FRAMING)]
    text = (said or lines or [type(err).__name__])[-1][:300]
    return f"{', '.join(ops)}: {text}" if ops else text


def openvino_kernel_isas(path: str | os.PathLike, *, threads: int = 1) -> dict[str, int]:
    """How many of OpenVINO's kernels for ``path`` name each instruction set (:data:`ISA_CAPS`' words;
    ``"unnamed"``: kernels whose name gives none, such as MLAS's GEMMs, which pick the machine's
    widest themselves), from one profiled call on zeros: how a run shows how far a cap
    (:data:`ISA_ENV`) reached. It binds oneDNN's kernels (convolutions, pooling); OpenVINO's own
    JIT kernels (a reduction, fused element-wise subgraphs) and MLAS may still use wider vectors.

    Raises
    ------
    ImportError
        Where OpenVINO is not installed.
    """
    check_threads(threads)
    import openvino

    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True}
    compiled = openvino.Core().compile_model(os.fspath(path), "CPU", config)
    request = compiled.create_infer_request()
    request.infer({i: np.zeros([d.get_length() for d in port.get_partial_shape()], np.float32)
                   for i, port in enumerate(compiled.inputs)})
    counts: dict[str, int] = {}
    for info in request.profiling_info:
        if info.exec_type in ("undef", "unknown_f32") or info.node_type in ("Parameter", "Result", "Reshape"):
            continue  # not run, or no kernel of its own
        word = next((w for w in ISA_CAPS.values() if f"_{w}" in info.exec_type), "unnamed")
        counts[word] = counts.get(word, 0) + 1
    return counts
