"""Reference models in plain PyTorch, with seeded weights, and their ONNX export.

torchvision does not import beside torch 2.13 here, so the end-to-end reference models are
written out: ``resnet18``, ``resnet3d_18`` (torchvision ``r3d_18``), ``mobilenet_v2``,
``bert_tiny`` and ``small_cnn``. Every model is a pure function of its seed and
has no data-dependent control flow, so ``torch.export`` and ``torch.onnx.export`` both trace it.

>>> from alt_tvm.models import get_model, export_onnx
>>> module, inputs = get_model("resnet3d_18", frames=4, size=32)   # reduced input for tests
>>> path = export_onnx("small_cnn", "models/small_cnn.onnx")
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .bert import bert_tiny
from .mobilenet import mobilenet_v2
from .resnet import resnet3d_18, resnet18
from .small_cnn import small_cnn

__all__ = ["MODEL_NAMES", "MODELS", "ModelInfo", "OnnxCheck", "check_onnx", "export_onnx", "get_model", "model_info"]


@dataclass(frozen=True)
class ModelInfo:
    """How to build one reference model and how closely compiled versions must match it.

    Attributes
    ----------
    name : str
        Registry name.
    builder : callable
        ``builder(*, batch, seed, **options) -> (module, example_inputs)``.
    input_names, output_names : tuple of str
        Names used for the ONNX graph's inputs and outputs.
    rtol, atol : float
        Tolerances for comparing two implementations (ORT, TVM, PyTorch) on this model.
    description : str
        One line: architecture and default input.
    """

    name: str
    builder: Callable[..., tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    rtol: float
    atol: float
    description: str


MODELS: dict[str, ModelInfo] = {
    info.name: info
    for info in (
        ModelInfo("resnet18", resnet18, ("input",), ("logits",), 1e-4, 1e-4,
                  "ResNet-18 (torchvision), 1x3x224x224 -> 1000 logits"),
        ModelInfo("resnet3d_18", resnet3d_18, ("input",), ("logits",), 1e-4, 1e-4,
                  "ResNet3D-18 (torchvision r3d_18), 1x3x16x112x112 -> 400 logits"),
        ModelInfo("mobilenet_v2", mobilenet_v2, ("input",), ("logits",), 1e-4, 1e-4,
                  "MobileNet-V2 width 1.0 (torchvision), 1x3x224x224 -> 1000 logits"),
        # Softmax and LayerNorm over long reductions: looser for BERT.
        ModelInfo("bert_tiny", bert_tiny, ("input_ids", "attention_mask"), ("last_hidden_state",), 1e-3, 1e-3,
                  "BERT-tiny (2 layers, hidden 128, 2 heads), int64 1x128 ids + mask -> 1x128x128"),
        ModelInfo("small_cnn", small_cnn, ("input",), ("logits",), 1e-4, 1e-4,
                  "small CNN: six conv3x3+BN+ReLU, 1x3x64x64 -> 10 logits"),
    )
}

MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


def model_info(name: str) -> ModelInfo:
    """The registry entry of ``name``; ``ValueError`` listing the known names otherwise."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}") from None


def get_model(name: str, *, batch: int = 1, seed: int = 0,
              **options: object) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Build a reference model in eval mode and example inputs for it.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES`.
    batch : int
        Batch size of the example inputs (fixed at export/import time).
    seed : int
        Seed of the weights (including BatchNorm running statistics) and of the inputs.
    **options
        Model-specific input sizes, to shrink a model for tests: ``size`` (image models),
        ``frames`` and ``size`` (``resnet3d_18``), ``seq_len``, ``vocab_size`` and
        ``with_mask`` (``bert_tiny``), ``num_classes`` (classifiers).

    Returns
    -------
    tuple
        ``(module, example_inputs)``: the ``torch.nn.Module`` in eval mode and a tuple of
        tensors to call it with.
    """
    info = model_info(name)
    try:
        module, inputs = info.builder(batch=batch, seed=seed, **options)
    except TypeError as err:
        raise ValueError(f"bad options for model {name!r}: {err}") from None
    return module.eval(), inputs


def export_onnx(name: str, path: str | os.PathLike, *, batch: int = 1, seed: int = 0, opset: int = 17,
                fold_batchnorm: bool = False, **options: object) -> Path:
    """Export a reference model to an ONNX file with a fixed batch size.

    Uses PyTorch's TorchScript-based exporter (``dynamo=False``): the ``torch.export``-based
    one, the default since torch 2.9, needs the ``onnxscript`` package, which this environment
    does not install. Constant sub-graphs are folded either way.

    By default BatchNorm stays a ``BatchNormalization`` node (the module is exported with
    ``TrainingMode.PRESERVE``; it is in eval mode, so the node is in inference form), which
    leaves folding it into the convolution to the compiler under test. With
    ``fold_batchnorm=True`` the exporter's eval-mode peephole folds it into the preceding
    ``Conv`` instead, as a plain ``torch.onnx.export`` call would.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES`.
    path : str or os.PathLike
        File to write; parent folders are created.
    batch, seed, **options
        As in :func:`get_model`.
    opset : int
        ONNX opset (at least 17, which has ``LayerNormalization``).
    fold_batchnorm : bool
        Fold BatchNorm into the convolutions at export time (see above).

    Returns
    -------
    pathlib.Path
        The written file.
    """
    if not isinstance(opset, int) or opset < 17:
        raise ValueError(f"opset must be an int >= 17, got {opset!r}")
    info = model_info(name)
    module, inputs = get_model(name, batch=batch, seed=seed, **options)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=opset,
                          input_names=list(info.input_names[:len(inputs)]), output_names=list(info.output_names),
                          do_constant_folding=True,
                          training=torch.onnx.TrainingMode.EVAL if fold_batchnorm else torch.onnx.TrainingMode.PRESERVE)
    return path


@dataclass(frozen=True)
class OnnxCheck:
    """Result of comparing an exported ONNX model (run by ONNX Runtime) with its PyTorch module.

    ``ok`` means every output satisfies ``|ort - torch| <= atol + rtol * |torch|`` elementwise
    (NumPy's ``allclose`` rule) with the model's tolerances.
    """

    name: str
    max_abs_error: float
    rtol: float
    atol: float
    ok: bool


def check_onnx(name: str, path: str | os.PathLike, *, batch: int = 1, seed: int = 0,
               **options: object) -> OnnxCheck:
    """Run ``path`` with ONNX Runtime (CPU, one thread) and compare it with the PyTorch model.

    ``name``, ``batch``, ``seed`` and ``options`` must be those the file was exported with.

    Returns
    -------
    OnnxCheck
    """
    import numpy as np

    from alt_tvm.bench.onnxruntime import onnxruntime_session

    info = model_info(name)
    module, inputs = get_model(name, batch=batch, seed=seed, **options)
    with torch.no_grad():
        expected = module(*inputs)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    session = onnxruntime_session(path, threads=1)
    got = session(*(x.numpy() for x in inputs))
    if len(got) != len(expected):
        raise ValueError(f"{path}: ONNX Runtime returned {len(got)} outputs, PyTorch {len(expected)}")
    max_err, ok = 0.0, True
    for out, ref in zip(got, (e.numpy() for e in expected)):
        if out.shape != ref.shape:
            raise ValueError(f"{path}: output shape {out.shape} differs from PyTorch's {ref.shape}")
        max_err = max(max_err, float(np.abs(out - ref).max(initial=0.0)))
        ok = ok and bool(np.allclose(out, ref, rtol=info.rtol, atol=info.atol))
    return OnnxCheck(name, max_err, info.rtol, info.atol, ok)
