"""benchmarks/bench_blocks.py's whole-model bookkeeping: every build read against the faster of
ONNX Runtime and OpenVINO, and the default build summed up over the models."""

import pytest
from conftest import load_script

from alt_tvm.bench import faster_peer


@pytest.fixture(scope="module")
def bench_blocks():
    return load_script("bench_blocks")


def test_each_build_is_read_against_the_faster_peer_and_the_default_build_summed_up(bench_blocks):
    model_ms = {"unfused": 4.0, "default": 2.0, "always": 2.5, "onnxruntime": 3.0, "openvino": 2.4}
    against = {name: faster_peer(times_ms=model_ms, alt_ms=model_ms[name]) for name in ("unfused", "default", "always")}
    assert {a.peer for a in against.values()} == {"openvino"}
    table = bench_blocks.whole_model_table(model_ms, against).splitlines()
    assert table[1] == "| runner | model ms | vs unfused | faster peer | peer / build |"
    assert table[3] == "| unfused | 4.000 | 1.000x | openvino | 0.60x |"
    assert table[4] == "| default | 2.000 | 2.000x | openvino | 1.20x |"
    assert table[7] == "| openvino | 2.400 | 1.667x |  |  |"
    assert all(line.count("|") == 6 for line in table[1:])
    results = [{"model": "a.onnx", "against_faster_peer": {"default": against["default"].to_json()}},
               {"model": "b.onnx", "against_faster_peer": {"default": {"ratio_vs_faster_peer": 0.3}}}]
    summary = bench_blocks.summary_of(results)
    assert summary["geomean_ratio_vs_faster_peer"] == pytest.approx(0.6)  # (1.2 * 0.3) ** 0.5
    assert summary["behind"] == ["b.onnx"] and summary["models_behind_faster_peer"] == 1
