"""Public architectures exported three ways build to the same partitions and the same outputs.

PyTorch offers the TorchScript ONNX exporter (``dynamo=False``), the default ``torch.export``-based
one (``dynamo=True``, opset 18 and up, written by ``onnxscript``) and ``torch.export`` programs.
The three graphs differ (the dynamo exporter decomposes and renames), but a model must build
to the same kernels from each. The models are Hugging Face ``transformers`` definitions built
from small configs (no download)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch

import alt_tvm
from alt_tvm.graph.frontend import ModelImportError

hf = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")


class Logits(torch.nn.Module):
    """The classifier with one tensor output (``transformers`` returns an output object)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, pixel_values):
        return self.inner(pixel_values=pixel_values).logits


def _models() -> dict:
    return {
        "resnet": lambda: hf.ResNetForImageClassification(hf.ResNetConfig(
            depths=[1, 1], hidden_sizes=[16, 32], embedding_size=16, layer_type="basic", num_labels=10)),
        "vit": lambda: hf.ViTForImageClassification(hf.ViTConfig(
            image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, num_labels=10)),
    }


def _exports(module: torch.nn.Module, x: torch.Tensor) -> dict:
    legacy = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), legacy, dynamo=False, opset_version=17)
        dynamo = torch.onnx.export(module, (x,), dynamo=True, verbose=False).model_proto
    return {
        "torchscript-onnx": onnx.load_from_string(legacy.getvalue()),
        "dynamo-onnx": dynamo,
        "exported-program": torch.export.export(module, (x,)),
    }


@pytest.mark.parametrize("name", sorted(_models()))
def test_every_exporter_builds_to_the_same_partitions_and_outputs(name):
    torch.manual_seed(0)
    module = Logits(_models()[name]()).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    want = module(x).detach().numpy()
    kernels = {}
    for how, exported in _exports(module, x).items():
        built = alt_tvm.build(exported)
        got = built(x.numpy())
        got = got[0] if isinstance(got, (list, tuple)) else got
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5, err_msg=how)
        kernels[how] = [(strategy, op) for strategy, op, _ in built.report.partitions]
    assert kernels["torchscript-onnx"], "no alt-tvm partition: the strategies did not run"
    assert kernels["dynamo-onnx"] == kernels["torchscript-onnx"]
    assert kernels["exported-program"] == kernels["torchscript-onnx"]


def test_an_exported_program_with_dynamic_shapes_is_a_clear_error():
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    batch = torch.export.Dim("batch", min=2, max=8)
    program = torch.export.export(Double(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    with pytest.raises(ModelImportError, match="dynamic shape .* for input 'x'"):
        alt_tvm.build(program)
    with pytest.raises(ModelImportError, match="do not pass example_inputs"):
        alt_tvm.build(torch.export.export(Double(), (torch.randn(4, 3),)), example_inputs=(torch.randn(4, 3),))
