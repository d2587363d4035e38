"""Reference models: ONNX export matches PyTorch, import + TVM's untuned build matches ONNX Runtime.

Sizes: ResNet-18, MobileNet-V2, BERT-tiny and the small CNN run at their real input sizes
(TVM's untuned build runs ResNet-18 at 224x224 in a few seconds here); ResNet3D-18 runs at
1x3x4x32x32 by default and at its real 1x3x16x112x112 only with ``-m slow``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import tvm
from onnx import TensorProto, helper
from tvm import relax

from alt_tvm.bench import (
    onnxruntime_session,
    time_callable,
    torch_runner,
    tvm_default_build,
)
from alt_tvm.graph.frontend import ImportedModel, ModelImportError, load_model
from alt_tvm.models import MODEL_NAMES, MODELS, check_onnx, export_onnx, get_model

# Input-size options per model in the default run (reduced only where it costs minutes).
FAST_OPTIONS: dict[str, dict] = {
    "resnet18": {},
    "resnet3d_18": {"frames": 4, "size": 32},
    "mobilenet_v2": {},
    "bert_tiny": {},
    "small_cnn": {},
}
CONV_MODELS = ("resnet18", "resnet3d_18", "mobilenet_v2", "small_cnn")


def _assert_close(got: list[np.ndarray], expected: list[np.ndarray], name: str) -> None:
    info = MODELS[name]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=info.rtol, atol=info.atol)


class _Case:
    """One model exported once per test module: the module, inputs, ONNX file and ORT outputs."""

    def __init__(self, name: str, options: dict, folder: Path) -> None:
        self.name, self.options = name, options
        self.module, inputs = get_model(name, **options)
        self.inputs = inputs
        self.args = [x.numpy() for x in inputs]
        self.path = export_onnx(name, folder / f"{name}.onnx", **options)
        self.ort_outputs = onnxruntime_session(self.path, threads=1)(*self.args)


@pytest.fixture(scope="module", params=MODEL_NAMES)
def case(request, tmp_path_factory) -> _Case:
    return _Case(request.param, FAST_OPTIONS[request.param], tmp_path_factory.mktemp(request.param))


# ------------------------------------------------------------------------------------------- models


def test_model_names():
    assert set(MODEL_NAMES) == {"resnet18", "resnet3d_18", "mobilenet_v2", "bert_tiny", "small_cnn"}
    assert set(FAST_OPTIONS) == set(MODEL_NAMES)


@pytest.mark.parametrize(
    ("name", "options", "shapes"),
    [
        ("resnet18", {}, [(1, 3, 224, 224)]),
        ("mobilenet_v2", {}, [(1, 3, 224, 224)]),
        ("resnet3d_18", {}, [(1, 3, 16, 112, 112)]),
        ("bert_tiny", {}, [(1, 128), (1, 128)]),
        ("bert_tiny", {"with_mask": False}, [(1, 128)]),
        ("small_cnn", {"batch": 2}, [(2, 3, 64, 64)]),
    ],
)
def test_default_input_shapes(name, options, shapes):
    _, inputs = get_model(name, **options)
    assert [tuple(x.shape) for x in inputs] == shapes


def test_architecture_sizes():
    """Parameter counts of the torchvision architectures (fc/classifier included, BN affine included)."""
    counts = {name: sum(p.numel() for p in get_model(name, **FAST_OPTIONS[name])[0].parameters())
              for name in MODEL_NAMES}
    assert counts["resnet18"] == 11_689_512  # torchvision resnet18
    assert counts["mobilenet_v2"] == 3_504_872  # torchvision mobilenet_v2
    assert counts["resnet3d_18"] == 33_371_472  # torchvision r3d_18
    # The published BERT-tiny has 4,385,920 with its 128x128 pooler (16,512), which is left out here.
    assert counts["bert_tiny"] == 4_385_920 - 16_512


def test_weights_deterministic_and_batchnorm_nontrivial():
    a, (xa,) = get_model("small_cnn", seed=3)
    b, (xb,) = get_model("small_cnn", seed=3)
    c, _ = get_model("small_cnn", seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa) and torch.equal(xa, xb)
    assert not torch.equal(sa["features.0.weight"], sc["features.0.weight"])
    bn = a.features[1]
    assert not a.training
    assert bn.running_mean.abs().max() > 0.01 and (bn.running_var - 1).abs().max() > 0.01
    # Calibrated statistics keep activations of order one through the whole network.
    with torch.no_grad():
        out = a(xa)
    assert 0.05 < out.abs().max() < 50


def test_weights_do_not_depend_on_batch():
    a, _ = get_model("mobilenet_v2", batch=1, size=32)
    b, _ = get_model("mobilenet_v2", batch=2, size=64)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("alexnet", {}, "unknown model 'alexnet'"),
        ("resnet18", {"size": 16}, "size must be >= 32"),
        ("resnet18", {"batch": 0}, "batch must be a positive int"),
        ("resnet18", {"frames": 4}, "bad options for model 'resnet18'"),
        ("bert_tiny", {"seq_len": 600}, "seq_len must be in"),
        ("small_cnn", {"seed": -1}, "seed must be a non-negative int"),
    ],
)
def test_get_model_rejects_bad_arguments(name, options, match):
    with pytest.raises(ValueError, match=match):
        get_model(name, **options)


def test_bert_mask_changes_output_only_through_padding():
    module, (ids, mask) = get_model("bert_tiny", batch=2, seq_len=16, vocab_size=100)
    with torch.no_grad():
        masked, unmasked = module(ids, mask), module(ids)
    assert mask[0, -1] == 0 and mask[0, 0] == 1
    assert not torch.allclose(masked, unmasked)


# ---------------------------------------------------------------------------------------- ONNX export


def test_export_matches_torch(case):
    model = onnx.load(str(case.path))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    ops = {n.op_type for n in model.graph.node}
    if case.name in CONV_MODELS:
        assert "BatchNormalization" in ops  # left for the compiler to fold
    with torch.no_grad():
        expected = case.module(*case.inputs)
    _assert_close(case.ort_outputs, [expected.numpy()], case.name)


def test_export_fold_batchnorm(tmp_path):
    path = export_onnx("small_cnn", tmp_path / "folded.onnx", fold_batchnorm=True)
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(str(path)).graph.node}
    check = check_onnx("small_cnn", path)
    assert check.ok and check.max_abs_error < 1e-4 and check.rtol == 1e-4


def test_export_rejects_old_opset(tmp_path):
    with pytest.raises(ValueError, match="opset must be an int >= 17"):
        export_onnx("small_cnn", tmp_path / "x.onnx", opset=13)


def test_export_script(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import export_models
    finally:
        sys.path.pop(0)
    assert export_models.main(["--out-dir", str(tmp_path), "--names", "small_cnn", "--batch", "2"]) == 0
    assert (tmp_path / "small_cnn.onnx").is_file()
    assert "ok" in capsys.readouterr().out
    shape = onnx.load(str(tmp_path / "small_cnn.onnx")).graph.input[0].type.tensor_type.shape
    assert [d.dim_value for d in shape.dim] == [2, 3, 64, 64]  # fixed batch


# -------------------------------------------------------------------------------------- import + TVM


def _check_signature(imported: ImportedModel, case: _Case, source: str) -> None:
    assert imported.source == source
    assert isinstance(imported.mod, tvm.IRModule)
    assert imported.input_shapes == tuple(tuple(x.shape) for x in case.inputs)
    assert imported.input_dtypes == tuple(str(x.dtype).replace("torch.", "") for x in case.inputs)
    assert len(imported.input_names) == len(case.inputs) and len(imported.output_names) == 1
    # Weights are constants in the module: main takes the model inputs only.
    assert len(imported.mod["main"].params) == len(case.inputs)


def test_onnx_import_tvm_build_matches_ort(case):
    imported = load_model(case.path, input_shapes=None)
    _check_signature(imported, case, "onnx")
    assert imported.input_names == MODELS[case.name].input_names[: len(case.inputs)]
    assert imported.output_names == MODELS[case.name].output_names
    _assert_close(tvm_default_build(imported)(*case.args), case.ort_outputs, case.name)


def test_torch_import_tvm_build_matches_ort(case):
    imported = load_model(case.module, example_inputs=case.inputs)
    _check_signature(imported, case, "torch")
    _assert_close(tvm_default_build(imported.mod)(*case.args), case.ort_outputs, case.name)


@pytest.mark.slow
def test_resnet3d_full_size_matches_ort(tmp_path):
    full = _Case("resnet3d_18", {}, tmp_path)
    _assert_close(tvm_default_build(load_model(full.path))(*full.args), full.ort_outputs, "resnet3d_18")


def test_onnx_proto_and_relax_passthrough(tmp_path):
    path = export_onnx("small_cnn", tmp_path / "m.onnx", size=16)
    from_proto = load_model(onnx.load(str(path)))
    assert from_proto.source == "onnx" and from_proto.input_shapes == ((1, 3, 16, 16),)
    passed = load_model(from_proto.mod)
    assert passed.source == "relax" and passed.mod is from_proto.mod
    assert passed.input_shapes == from_proto.input_shapes and passed.input_dtypes == ("float32",)
    assert passed.output_names == ("output_0",)


def test_relax_symbolic_dims_fixed_by_input_shapes():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(y)
    mod = bb.get()
    with pytest.raises(ModelImportError, match="symbolic dim n"):
        load_model(mod)
    imported = load_model(mod, input_shapes={"x": (3, 4)})
    assert imported.input_shapes == ((3, 4),)
    assert mod["main"].params[0].ty.shape.values[0].same_as(n)  # the caller's module is unchanged
    out = tvm_default_build(imported)(np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(out[0], np.full((3, 4), 2, np.float32))


def _dynamic_onnx() -> onnx.ModelProto:
    """y = relu(x) with x of shape (N, 4), N symbolic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_dynamic_dims_fixed_at_import():
    assert load_model(_dynamic_onnx()).input_shapes == ((1, 4),)
    imported = load_model(_dynamic_onnx(), input_shapes={"x": [3, 4]})
    assert imported.input_shapes == ((3, 4),)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(tvm_default_build(imported, pipeline="zero")(x)[0], np.maximum(x, 0))


# ------------------------------------------------------------------------------------------- errors


def test_missing_file(tmp_path):
    with pytest.raises(ModelImportError, match="does not exist"):
        load_model(tmp_path / "nope.onnx")
    with pytest.raises(ModelImportError, match="is not a file"):
        load_model(tmp_path)


@pytest.mark.parametrize("content", [b"", b"this is not a protobuf \xff\xfe", b"\x08\x07"])
def test_not_an_onnx_file(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelImportError, match="is not a valid ONNX model"):
        load_model(str(path))


def test_torch_module_errors():
    module, inputs = get_model("small_cnn", size=16)
    with pytest.raises(ModelImportError, match="needs example_inputs"):
        load_model(module)
    with pytest.raises(ModelImportError, match="must be a torch.Tensor or a tuple"):
        load_model(module, example_inputs=[np.zeros((1, 3, 16, 16))])
    with pytest.raises(ModelImportError, match="differs from the example input's shape"):
        load_model(module, example_inputs=inputs, input_shapes={"x": (2, 3, 16, 16)})
    module.train()
    with pytest.raises(ModelImportError, match="training mode"):
        load_model(module, example_inputs=inputs)


@pytest.mark.parametrize("obj", [42, [1, 2], None, np.zeros(3)])
def test_unsupported_object(obj):
    with pytest.raises(ModelImportError, match="cannot import an object of type"):
        load_model(obj)


def test_onnx_input_shape_errors():
    with pytest.raises(ModelImportError, match=r"names unknown inputs \['y'\]"):
        load_model(_dynamic_onnx(), input_shapes={"y": (1, 4)})
    with pytest.raises(ModelImportError, match="does not fit the ONNX input's shape"):
        load_model(_dynamic_onnx(), input_shapes={"x": (1, 5)})
    with pytest.raises(ModelImportError, match="positive dims"):
        load_model(_dynamic_onnx(), input_shapes={"x": (0, 4)})
    assert issubclass(ModelImportError, ValueError)


# ---------------------------------------------------------------------------------------- baselines


def test_runners_agree_and_timer():
    module, inputs = get_model("small_cnn", size=16)
    args = [x.numpy() for x in inputs]
    torch_out = torch_runner(module, threads=1)(*args)
    proto = onnx.load_from_string(_export_bytes(module, inputs))
    ort_out = onnxruntime_session(proto, threads=1)(*args)
    _assert_close(ort_out, torch_out, "small_cnn")
    fastest, median = time_callable(lambda: None, [], warmup=0, repeat=3)
    assert 0 <= fastest <= median
    with pytest.raises(ValueError, match="repeat"):
        time_callable(lambda: None, [], repeat=0)
    with pytest.raises(ValueError, match="threads"):
        onnxruntime_session(proto, threads=0)
    with pytest.raises(ValueError, match="pipeline"):
        tvm_default_build(load_model(proto), pipeline="O3")


def _export_bytes(module: torch.nn.Module, inputs: tuple) -> bytes:
    import io
    import warnings

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=17)
    return buffer.getvalue()
