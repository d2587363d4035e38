"""A build with a tuning log says how much of the model it tuned and why the rest was not;
a record whose parameters the strategy rejects is skipped with its file:line; bad build
arguments and guessed shapes are clear errors. Logs are written with a fake measure."""

from __future__ import annotations

import json
import warnings
import zlib

import numpy as np
import onnx
import pytest
import torch
from conftest import build_messages
from onnx import TensorProto, helper

import alt_tvm
from alt_tvm.graph.frontend import ModelImportError, load_model
from alt_tvm.integration import extract_tasks, tune
from alt_tvm.models import get_model
from alt_tvm.records import candidate_key, read_log, target_key
from alt_tvm.target import board

MODEL, INPUTS = get_model("small_cnn")
TUNABLE = 7  # small_cnn: 6 convolutions and the classifier's matmul


def fake_measure(task, params) -> float:
    return 1.0 + zlib.crc32(candidate_key(params).encode()) % 1000 / 1000


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("log") / "small_cnn.jsonl"
    tune(MODEL, verify=False, example_inputs=INPUTS, trials=2 * TUNABLE, log=path, measure=fake_measure,
         cost_model=None,
         features="knobs", progress=False, revalidate=0)
    return path


def edited(log, tmp_path, edit) -> str:
    """A copy of ``log`` with ``edit(record dict)`` applied to every line."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for obj in lines:
        edit(obj)
    path = tmp_path / "edited.jsonl"
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    return str(path)


def build(model=MODEL, **options):
    with build_messages() as messages:
        built = alt_tvm.build(model, example_inputs=INPUTS if model is MODEL else None, **options)
    return built, messages


def check_numerics(built):
    (out,) = built(INPUTS[0].numpy())
    np.testing.assert_allclose(out, MODEL(*INPUTS).detach().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("edit, reason", [
    (lambda r: r.update(target=target_key(board("kirin990"))), "measured only on other targets (llvm cortex-a76)"),
    (lambda r: r.update(tvm_version="0.26.0"), "measured only with TVM 0.26.0"),
    (lambda r: r.update(schema_version=1), "lines of another schema version were skipped"),
    (lambda r: r.update(workload_key=r["workload_key"].replace("(1, 3, 64, 64)", "(1, 3, 32, 32)")
                        .replace("(1, 16, 64, 64)", "(1, 16, 32, 32)")), "no record of this workload"),
], ids=["other-target", "other-tvm", "other-schema", "other-model"])
def test_a_log_that_does_not_apply_says_why(log, tmp_path, edit, reason):
    path = edited(log, tmp_path, edit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built, messages = build(records=path)
    report = built.report
    assert report.log == path and report.tuned + len(report.untuned) == TUNABLE
    assert report.untuned and all(reason in why for _, why in report.untuned), report.untuned
    summary = report.tuning_summary()
    assert summary.startswith(f"{report.tuned} of {TUNABLE} tunable partitions tuned from {path}") and reason in summary
    assert any("untuned" in m and reason in m for m in messages)  # the build says so, not only the report
    check_numerics(built)


def test_a_matching_log_tunes_every_partition_and_says_so(log):
    built, messages = build(records=str(log))
    assert (built.report.tuned, built.report.untuned) == (TUNABLE, [])
    assert not any("untuned" in m for m in messages)
    assert read_log(log).why_not(built.report.workloads[0]) == ""
    check_numerics(built)


def test_a_record_with_parameters_the_strategy_rejects_is_skipped_with_its_line(log, tmp_path):
    lines = log.read_text().splitlines()
    first = json.loads(lines[0])
    bad = dict(first, candidate=dict(first["candidate"], params={"bogus": [1, 2]}), latencies_ms=[1e-6])
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines + [json.dumps(bad)]) + "\n")
    built, messages = build(records=str(path))
    where = f"{path}:{len(lines) + 1}"
    assert any(m.startswith(f"{where}: skipped tuned parameters") for m in messages), messages
    assert built.report.tuned == TUNABLE - 1
    ((key, why),) = built.report.untuned
    assert key == first["workload_key"] and where in why and "rejected" in why
    check_numerics(built)


@pytest.mark.parametrize("call, error, match", [
    (lambda: alt_tvm.build(MODEL, example_inputs=INPUTS, target=42), TypeError, "target must be .* got int 42"),
    (lambda: alt_tvm.build(MODEL, example_inputs=INPUTS, target="pi5"), ValueError, "unknown board 'pi5'"),
    (lambda: alt_tvm.build(MODEL, example_inputs=INPUTS, strategies="sconv"), TypeError,
     r"strategies must be a list of strategy names, e.g. \['sconv'\], not the string"),
    (lambda: alt_tvm.build(MODEL, example_inputs=INPUTS, strategies=[3]), TypeError, "strategy names"),
    (lambda: alt_tvm.build(MODEL, example_inputs=INPUTS, records=42), TypeError, "records must be the path"),
    (lambda: alt_tvm.build(MODEL, example_inputs=INPUTS, records="/nonexistent/log.jsonl"), FileNotFoundError,
     "does not exist"),
    (lambda: alt_tvm.build(MODEL, example_inputs=INPUTS, strategy_options=[1]), TypeError,
     "strategy_options must be a dict"),
    (lambda: alt_tvm.build(""), ModelImportError, "the model path is empty"),
    (lambda: extract_tasks(MODEL, example_inputs=INPUTS, target=42), TypeError, "target must be"),
    (lambda: tune(MODEL, verify=False, example_inputs=INPUTS, trials=14, log=None), TypeError, "log must be the path"),
    (lambda: tune(MODEL, verify=False, example_inputs=INPUTS, trials=14, log="x.jsonl", measure=42), TypeError,
     "measure must be None or a function"),
    (lambda: tune(MODEL, verify=False, example_inputs=INPUTS, trials="4", log="x.jsonl"), TypeError, "trials"),
    (lambda: tune(MODEL, example_inputs=INPUTS, trials=14, log="x.jsonl", strategies="alt_conv"), TypeError,
     "not the string"),
])
def test_bad_build_and_tune_arguments_are_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def dynamic_onnx(dims) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph([helper.make_node("Relu", ["image"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_dynamic_spatial_dim_is_an_error_naming_the_input_the_dim_and_the_fix():
    model = dynamic_onnx(["N", 3, "height", "width"])
    with pytest.raises(ModelImportError, match=r"input 'image' has a dynamic dim 2 \('height'\).*"
                                               r"input_shapes=\{'image': \(1, 3, <height>, <width>\)\}"):
        load_model(model)
    assert load_model(model, input_shapes={"image": (1, 3, 8, 8)}).input_shapes == ((1, 3, 8, 8),)
    assert load_model(dynamic_onnx(["N", 3, 8, 8])).input_shapes == ((1, 3, 8, 8),)  # the batch only
    with pytest.raises(ModelImportError, match="dynamic dim 1 \\('seq'\\)"):
        load_model(dynamic_onnx(["batch", "seq"]))


def test_a_torch_module_is_built_at_its_example_shapes_never_a_guess():
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    x = torch.randn(1, 3, 20, 24)
    assert load_model(conv, example_inputs=(x,)).input_shapes == ((1, 3, 20, 24),)


def test_a_compiled_model_refuses_none_as_input():
    built, _ = build()
    with pytest.raises(TypeError, match="input 'x' is None; the model expects an array of shape"):
        built(None)


def scalar_clip_onnx() -> onnx.ModelProto:
    """ONNX Clip whose bounds are 0-d runtime inputs (as in ONNX's own test_clip)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    bounds = [helper.make_tensor_value_info(name, TensorProto.FLOAT, []) for name in ("lo", "hi")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    graph = helper.make_graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], "g", [x, *bounds], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_compiled_model_takes_0d_inputs_and_names_a_wrong_shape_or_dtype():
    from alt_tvm.bench import tvm_default_build

    model = scalar_clip_onnx()
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    lo, hi = np.array(-1, np.float32), np.array(0.5, np.float32)
    built, _ = build(model)
    # 0-d inputs reach the VM 0-d (np.ascontiguousarray made them shape (1,): a raw TVM check failure)
    np.testing.assert_array_equal(built(x, lo, hi)[0], np.clip(x, -1, 0.5))
    np.testing.assert_array_equal(tvm_default_build(load_model(model))(x, lo, hi)[0], np.clip(x, -1, 0.5))
    with pytest.raises(ValueError, match=r"input 'lo' has shape \(1,\), the model expects \(\)"):
        built(x, lo.reshape(1), hi)
    with pytest.raises(ValueError, match="input 'hi' has dtype float64, the model expects float32"):
        built(x, lo, np.float64(0.5))


def test_the_torch_baseline_takes_a_0d_input():
    from alt_tvm.bench import torch_runner

    class Scale(torch.nn.Module):
        def forward(self, x, s):
            return x.sum() * s

    (out,) = torch_runner(Scale())(np.ones(3, np.float32), np.array(2, np.float32))
    assert out.shape == () and out == 6  # a 0-d input made 1-d would give shape (1,)
