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


def test_a_faster_peer_ratio_with_an_interval_gets_a_whisker(plot, tmp_path, monkeypatch):
    sweep = [{"model": "tv_resnet18", "ms": {"alt-tvm torchscript": 2.0, "onnxruntime": 3.0},
              "exporters": {"torchscript": {"ratio_vs_faster_peer": 1.5, "ratio_interval": [1.4, 1.6]}}},
             {"model": "tv_vgg", "ms": {"alt-tvm torchscript": 2.0, "onnxruntime": 1.0},
              "exporters": {"torchscript": {"ratio_vs_faster_peer": 0.5}}}]  # no rounds: no whisker
    intervals = {}
    plot.suite_ratios(rows=sweep, intervals=intervals)
    assert intervals == {"resnet18": {"faster peer / alt-tvm": (1.4, 1.6)}}
    e2e = [{"model": "m", "runner": "alt-tvm (alt)", "median_ms": 2.0, "ratio_vs_faster_peer": 0.8,
            "ratio_interval": [0.7, 1.1]}, {"model": "m", "runner": "onnxruntime", "median_ms": 1.6}]
    intervals = {}
    plot.runner_ratios(rows=e2e, intervals=intervals)
    assert intervals == {"m": {"faster peer / alt-tvm (alt)": (0.7, 1.1)}}
    drawn = []
    original = plot.plt.Axes.vlines
    monkeypatch.setattr(plot.plt.Axes, "vlines", lambda ax, x, lo, hi, **kw: drawn.append((list(x), list(lo), list(hi)))
                        or original(ax, x, lo, hi, **kw))
    path = tmp_path / "znver4" / "public_sweep.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"suite": "public_sweep", "results": {"rows": sweep, "against_faster_peer": {}}}))
    plot.plot_suite(path=str(path))
    ((xs, lows, highs),) = drawn  # one whisker, on resnet18's faster-peer bar
    assert len(xs) == 1 and (lows, highs) == ([1.4], [1.6])
