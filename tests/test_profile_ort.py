"""ONNX Runtime's per-node times (scripts/profile_ort.py): read from its trace, which is not left behind."""

from pathlib import Path

import numpy as np
from conftest import load_script
from onnx import TensorProto, helper, numpy_helper, save


def test_node_times_are_printed_and_the_trace_is_removed(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv_node", pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [weight])
    path = tmp_path / "m.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    import onnxruntime

    traces = []
    end_profiling = onnxruntime.InferenceSession.end_profiling
    monkeypatch.setattr(onnxruntime.InferenceSession, "end_profiling",
                        lambda self: traces.append(Path(end_profiling(self))) or traces[-1])
    assert load_script("profile_ort").main([str(path), "--threads", "1", "--runs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("m.onnx: ONNX Runtime") and "1 threads" in lines[0]
    conv = [line for line in lines[2:] if " ms  " in line and "Conv" in line]
    assert conv and conv[0].split()[3].endswith("%"), conv  # its GFLOP/s and share of the peak
    # Found by ONNX Runtime's NCHWc name (the tensor it writes) through the fused Relu, or the
    # node's own name; a node that computes no product gets no count.
    flops = 2 * (8 * 16 * 16) * (4 * 3 * 3)
    from alt_tvm.bench.onnx_flops import kernel_flops

    assert kernel_flops(str(path), ["y_nchwc", "c_nchwc", "conv_node", "conv_node/WithoutBiases", "ReorderOutput"]) \
        == {"y_nchwc": flops, "c_nchwc": flops, "conv_node": flops, "conv_node/WithoutBiases": flops}
    # written outside the working directory (an interrupted run would leave it there) and removed
    assert len(traces) == 1 and traces[0].resolve().parent != work.resolve() and not traces[0].exists()
    assert list(work.iterdir()) == []
