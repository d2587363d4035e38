"""The CPU peers' own per-node times (scripts/profile_peer.py), with the products' share of the peak."""

from pathlib import Path

import numpy as np
import pytest
from conftest import load_script
from onnx import TensorProto, helper, numpy_helper, save

FLOPS = 2 * (8 * 16 * 16) * (4 * 3 * 3)


def _conv_relu(path):
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv_node", pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"], name="relu_node")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [weight])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_onnx_runtime_node_times_are_printed_and_the_trace_is_removed(tmp_path, monkeypatch, capsys):
    path = _conv_relu(tmp_path / "m.onnx")
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    import onnxruntime

    traces = []
    end_profiling = onnxruntime.InferenceSession.end_profiling
    monkeypatch.setattr(onnxruntime.InferenceSession, "end_profiling",
                        lambda self: traces.append(Path(end_profiling(self))) or traces[-1])
    assert load_script("profile_peer").main([str(path), "--threads", "1", "--runs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("m.onnx: ONNX Runtime") and "1 threads" in lines[0]
    conv = [line for line in lines[2:] if " ms  " in line and "Conv" in line]
    assert conv and conv[0].split()[3].endswith("%"), conv  # its GFLOP/s and share of the peak
    # written outside the working directory (an interrupted run would leave it there) and removed
    assert len(traces) == 1 and traces[0].resolve().parent != work.resolve() and not traces[0].exists()
    assert list(work.iterdir()) == []


def test_openvino_node_times_are_printed_with_the_convolutions_share_of_the_peak(tmp_path, capsys):
    pytest.importorskip("openvino")
    path = _conv_relu(tmp_path / "m.onnx")
    argv = [str(path), "--peer", "openvino", "--threads", "1", "--runs", "3", "--peak", "100"]
    assert load_script("profile_peer").main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("m.onnx: OpenVINO") and "1 threads" in lines[0] and "peak 100 GFLOP/s" in lines[0]
    # One kernel for the convolution and its fused Relu, named with the kernel OpenVINO chose.
    (conv,) = [line for line in lines[2:] if "Convolution" in line]
    assert conv.split()[3].endswith("%") and "_f32" in conv, lines


def test_a_peers_node_is_found_by_its_name_or_its_tensors_through_fused_ops(tmp_path):
    from alt_tvm.bench.onnx_flops import kernel_flops

    path = _conv_relu(tmp_path / "m.onnx")
    # ONNX Runtime's NCHWc names (the tensor written), OpenVINO's bias-split name, the node's own
    # name; a node that computes no product gets no count.
    names = ["y_nchwc", "c_nchwc", "conv_node", "conv_node/WithoutBiases", "ReorderOutput"]
    assert kernel_flops(str(path), names) == {name: FLOPS for name in names[:4]}


@pytest.mark.parametrize("argv,message", [(["--runs", "0"], "--runs and --threads must be >= 1"),
                                          (["--peak", "-1"], "--peak must be positive, got -1.0"),
                                          (["--peer", "tvm"], "invalid choice: 'tvm'")])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, argv, message):
    path = _conv_relu(tmp_path / "m.onnx")
    with pytest.raises(SystemExit):
        load_script("profile_peer").main([str(path), *argv])
    assert message in capsys.readouterr().err
