"""The FLOP count behind the CNN ceiling table (scripts/count_flops.py), on small ONNX graphs."""

import json

import numpy as np
import onnx
import pytest
from conftest import load_script
from onnx import TensorProto, helper, numpy_helper


@pytest.fixture(scope="module")
def script():
    return load_script("count_flops")


def _model(path, *, groups: int = 1, split: bool = False) -> str:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 4 // groups, 3, 3)).astype(np.float32), "w")
    dense = numpy_helper.from_array(rng.standard_normal((10, 8 * 6 * 6)).astype(np.float32), "d")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], group=groups),
             helper.make_node("Flatten", ["c"], ["f"]),
             helper.make_node("Gemm", ["f", "d"], ["y"], transB=1)]
    initializers = [weight, dense]
    if split:  # the conv's input comes through a Split whose sizes shape inference does not see
        nodes.insert(0, helper.make_node("Split", ["x2", "sizes"], ["x", "rest"], axis=1))
        initializers.append(numpy_helper.from_array(np.array([4, 4], dtype=np.int64), "sizes"))
        inputs = [helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 8, 12, 12])]
    else:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("split", [False, True])
def test_conv_and_gemm_flops_are_two_per_multiply_add(script, tmp_path, groups, split):
    path = _model(tmp_path / "m.onnx", groups=groups, split=split)
    conv = 2 * (8 * 6 * 6) * (4 // groups * 3 * 3)  # output elements x taps per output
    gemm = 2 * 10 * (8 * 6 * 6)
    assert script.count_flops(path) == conv + gemm


def test_the_table_sets_each_runtime_against_the_time_at_the_peak(script, tmp_path):
    _model(tmp_path / "m.onnx")
    flops = script.count_flops(str(tmp_path / "m.onnx"))
    sweep = [{"model": "m", "ms": {"onnxruntime": 2.0, "alt-tvm torchscript": 1.0}},
             {"model": "absent", "ms": {"onnxruntime": 2.0, "alt-tvm torchscript": 1.0}}]
    (row,) = script.rows(sweep, models_dir=str(tmp_path), peak_gflops=1.0)
    floor_ms = flops / 1e9 * 1e3
    assert row["ort_over_alt"] == 2.0 and row["ort_over_floor"] == pytest.approx(2.0 / floor_ms)
    assert row["alt_peak"] == pytest.approx(floor_ms)
    sweep_path = tmp_path / "s.jsonl"
    sweep_path.write_text(json.dumps(sweep[0]) + "\n")
    with pytest.raises(SystemExit):
        script.main(["--sweep", str(sweep_path), "--models-dir", str(tmp_path), "--peak", "0"])
    assert script.main(["--sweep", str(sweep_path), "--models-dir", str(tmp_path / "none"), "--peak", "1"]) == 2
    results = tmp_path / "cnn_suite.json"  # a sweep's results file reads as its journal does
    results.write_text(json.dumps({"suite": "cnn_suite", "results": {"rows": sweep[:1]}}))
    assert script.read_sweep(str(results)) == script.read_sweep(str(sweep_path)) == sweep[:1]


@pytest.mark.parametrize("content", [None, "{not json\n"])
def test_a_missing_or_corrupt_sweep_is_a_clear_error(script, tmp_path, capsys, content):
    sweep = tmp_path / "s.jsonl"
    if content is not None:
        sweep.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--sweep", str(sweep), "--models-dir", str(tmp_path), "--peak", "1"])
    assert exit_info.value.code == 2
    assert f"--sweep {sweep}: not a readable results or JSON-lines file" in capsys.readouterr().err


def test_a_model_with_token_id_inputs_is_counted_on_integer_ids(tmp_path):
    from alt_tvm.bench.onnx_flops import count_flops

    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((100, 16)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [table, weight])
    path = tmp_path / "ids.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert count_flops(str(path)) == 2 * 5 * 16 * 8
