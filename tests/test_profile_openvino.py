"""OpenVINO's per-node times (scripts/profile_openvino.py), with the products' share of the peak."""

import numpy as np
import pytest
from conftest import load_script
from onnx import TensorProto, helper, numpy_helper, save

pytest.importorskip("openvino")


def _conv_relu(path):
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv_node", pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"], name="relu_node")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [weight])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_node_times_are_printed_with_the_convolutions_share_of_the_peak(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    _conv_relu(path)
    assert load_script("profile_openvino").main([str(path), "--threads", "1", "--runs", "3", "--peak", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("m.onnx: OpenVINO") and "1 threads" in lines[0] and "peak 100 GFLOP/s" in lines[0]
    conv = [line for line in lines[2:] if "Convolution" in line]
    # The Relu is fused into the convolution's kernel; its node is found under either name.
    assert len(conv) == 1 and conv[0].split()[3].endswith("%"), lines


@pytest.mark.parametrize("argv,message", [(["--runs", "0"], "--runs and --threads must be >= 1"),
                                          (["--peak", "-1"], "--peak must be positive, got -1.0")])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, argv, message):
    path = tmp_path / "m.onnx"
    _conv_relu(path)
    with pytest.raises(SystemExit):
        load_script("profile_openvino").main([str(path), *argv])
    assert message in capsys.readouterr().err
