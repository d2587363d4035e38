"""Every reference model, built by alt-tvm with every variant, matches ONNX Runtime."""

import numpy as np
import pytest

from alt_tvm.bench import onnxruntime_session
from alt_tvm.graph.build import build
from alt_tvm.graph.frontend import ModelImportError
from alt_tvm.models import MODELS, export_onnx, get_model

# Reduced inputs where the architecture allows it keep the suite fast; the full-size
# models are the benchmark's business (benchmarks/bench_e2e.py) and the slow tests'.
FAST = {"small_cnn": {}, "resnet18": {"size": 64}, "mobilenet_v2": {"size": 64},
        "bert_tiny": {"seq_len": 32}, "resnet3d_18": {"frames": 4, "size": 32}}


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


def _check(name, options, variant, onnx_dir):
    path = export_onnx(name, onnx_dir / f"{name}_{abs(hash(tuple(options.items())))}.onnx", **options)
    _, inputs = get_model(name, **options)
    arrays = [x.numpy() for x in inputs]
    compiled = build(str(path), variant=variant)
    reference = onnxruntime_session(str(path), threads=1)(*arrays)
    got = compiled(*arrays)
    info = MODELS[name]
    assert len(got) == len(reference)
    for g, r in zip(got, reference):
        np.testing.assert_allclose(g, r, rtol=info.rtol, atol=info.atol)
    return compiled


#: The ablation variants of the models that build slowest run with the slow tests (CI time).
_SLOW_ABLATIONS = {"mobilenet_v2", "resnet3d_18"}


@pytest.mark.parametrize("name, variant", [
    pytest.param(name, variant, marks=[pytest.mark.slow] if variant != "alt" and name in _SLOW_ABLATIONS else [])
    for name in sorted(FAST) for variant in ("alt", "alt-wp", "alt-ol")])
def test_reference_model_matches_onnxruntime(name, variant, onnx_dir):
    compiled = _check(name, FAST[name], variant, onnx_dir)
    anchors = {op for _, op, _ in compiled.report.partitions}
    assert anchors, "no partition used an alt-tvm strategy"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["alt", "alt-wp", "alt-ol"])
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_tiny", "resnet3d_18"])
def test_full_size_reference_model_matches_onnxruntime(name, variant, onnx_dir):
    _check(name, {}, variant, onnx_dir)


def test_invalid_model_file_and_wrong_inputs_give_clear_errors(tmp_path, onnx_dir):
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"this is not a protobuf")
    with pytest.raises(ModelImportError, match="model.onnx"):
        build(str(bogus))
    compiled = _check("small_cnn", {}, "alt", onnx_dir)
    # Global average pooling and the flatten have no alt-tvm strategy: TVM legalizes them,
    # and the report says so.
    assert compiled.report.fallbacks["relax.mean"] == ["no alt-tvm strategy"]
    assert "fell back to TVM's legalization: relax.mean" in compiled.report.summary()
    expected = r"input 'input' has shape \(1, 3, 32, 32\), the model expects \(1, 3, 64, 64\)"
    with pytest.raises(ValueError, match=expected):
        compiled(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(ValueError, match=r"model takes 1 inputs"):
        compiled()
    with pytest.raises(FileNotFoundError, match="tuning log 'no-such-log.jsonl' does not exist"):
        build(str(bogus), records="no-such-log.jsonl")
