"""benchmarks/plot.py on the results files' fields: each peer and the faster peer over alt-tvm."""

import json

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def plot():
    return load_script("plot")


def test_the_sweeps_and_e2e_plots_draw_the_faster_peer_ratio(plot, tmp_path):
    sweep = [{"model": "tv_resnet18", "ms": {"alt-tvm torchscript": 2.0, "onnxruntime": 3.0, "openvino": 2.5},
              "exporters": {"torchscript": {"faster_peer": "openvino", "ratio_vs_faster_peer": 1.25}}}]
    assert plot.suite_ratios(rows=sweep) == {"resnet18": pytest.approx(
        {"onnxruntime / alt-tvm": 1.5, "openvino / alt-tvm": 1.25, "faster peer / alt-tvm": 1.25})}
    e2e = [{"runner": "fp32 peak"},
           {"model": "m", "runner": "alt-tvm (alt)", "median_ms": 2.0, "ratio_vs_faster_peer": 0.8},
           {"model": "m", "runner": "onnxruntime", "median_ms": 1.6}, {"model": "m", "runner": "openvino",
                                                                      "median_ms": 3.0}]
    assert plot.runner_ratios(rows=e2e) == {"m": pytest.approx(
        {"onnxruntime / alt-tvm (alt)": 0.8, "openvino / alt-tvm (alt)": 1.5, "faster peer / alt-tvm (alt)": 0.8})}
    path = tmp_path / "znver4" / "public_sweep.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"suite": "public_sweep", "results": {"rows": sweep, "against_faster_peer": {}}}))
    assert plot.plot_suite(path=str(path)) == str(path.with_suffix(".png")) and path.with_suffix(".png").is_file()
