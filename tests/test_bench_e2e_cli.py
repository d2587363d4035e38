"""benchmarks/bench_e2e.py's command line: ``--reuse-logs`` times logs already written, and says
which are missing before anything is built or timed; every alt-tvm build is read against the
faster of ONNX Runtime and OpenVINO."""

import pytest
import torch
from conftest import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("bench_e2e")


def test_reuse_logs_needs_a_trial_count(script):
    with pytest.raises(SystemExit, match="--reuse-logs needs --trials N"):
        script.main(["--models", "resnet18", "--reuse-logs"])


def test_reuse_logs_names_every_missing_log_before_any_work(script, tmp_path):
    model = tmp_path / "one.onnx"
    torch.onnx.export(torch.nn.Conv2d(3, 8, 3).eval(), (torch.randn(1, 3, 16, 16),), str(model), dynamo=False,
                      opset_version=17)
    other = tmp_path / "two.onnx"
    other.write_bytes(model.read_bytes())
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "e2e_one.onnx_8.jsonl").write_text("")
    args = ["--models", str(model), str(other), "--trials", "8", "--log-dir", str(logs), "--reuse-logs"]
    with pytest.raises(SystemExit) as err:
        script.main(args)
    message = str(err.value)
    assert "e2e_two.onnx_8.jsonl" in message and "e2e_one.onnx_8.jsonl" not in message
    assert script.tuning_log(script.parse_args(args), str(model)) == str(logs / "e2e_one.onnx_8.jsonl")


def test_a_budget_too_small_for_a_models_tasks_times_it_untuned_and_keeps_the_results(script, tmp_path):
    import json

    model = tmp_path / "two_convs.onnx"
    torch.onnx.export(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 1)).eval(),
                      (torch.randn(1, 3, 16, 16),), str(model), dynamo=False, opset_version=17)
    out = tmp_path / "out.json"
    code = script.main(["--models", str(model), "--trials", "2", "--skip-ms", "--skip-tvm-default", "--rounds", "1",
                        "--repeat", "1", "--threads", "1", "--log-dir", str(tmp_path / "logs"), "--json", str(out)])
    assert code == 0
    results = json.loads(out.read_text())["results"]["rows"]
    (error,) = [r for r in results if "error" in r]
    assert "trials=2 is too small for 2 tasks" in error["error"]
    runners = {r["runner"] for r in results if "median_ms" in r}
    from alt_tvm.bench import openvino_available

    peers = {"onnxruntime"} | (set() if openvino_available() else {"openvino"})
    assert runners == {"alt-tvm (alt)"} | peers  # timed untuned, no tuned build
    (alt,) = [r for r in results if r.get("runner") == "alt-tvm (alt)"]
    times = {r["runner"]: r["median_ms"] for r in results if "median_ms" in r}
    faster = min(peers, key=times.get)
    assert alt["faster_peer"] == faster
    assert alt["ratio_vs_faster_peer"] == pytest.approx(times[faster] / times["alt-tvm (alt)"])
    low, high = alt["ratio_interval"]  # from the same rounds, paired
    assert 0 < low <= high
    summary = json.loads(out.read_text())["results"]["against_faster_peer"]["alt-tvm (alt)"]
    assert summary["models"] == 1
    assert summary["geomean_ratio_vs_faster_peer"] == pytest.approx(alt["ratio_vs_faster_peer"])


def test_the_run_is_summed_up_per_build_against_the_faster_peer(script):
    rows = [{"runner": "fp32 peak"},
            {"model": "a", "runner": "alt-tvm (alt)", "median_ms": 1.0, "ratio_vs_faster_peer": 2.0},
            {"model": "a", "runner": "alt-tvm (alt, tuned)", "median_ms": 0.5, "ratio_vs_faster_peer": 4.0},
            {"model": "a", "runner": "onnxruntime", "median_ms": 2.0},
            {"model": "b", "runner": "alt-tvm (alt)", "median_ms": 4.0, "ratio_vs_faster_peer": 0.5},
            {"model": "b", "runner": "tuning alt-tvm", "tune_s": 3.0}]
    summary = script.summaries(rows)
    assert list(summary) == ["alt-tvm (alt)", "alt-tvm (alt, tuned)"]
    assert summary["alt-tvm (alt)"]["geomean_ratio_vs_faster_peer"] == pytest.approx(1.0)
    assert summary["alt-tvm (alt)"]["behind"] == ["b"] and summary["alt-tvm (alt)"]["models_behind_faster_peer"] == 1
    assert summary["alt-tvm (alt, tuned)"]["models"] == 1
    assert script.faster_peer_fields({"onnxruntime": 3.0, "openvino": 1.5, "pytorch": 1.0}, 2.0) == {
        "faster_peer": "openvino", "faster_peer_ms": 1.5, "ratio_vs_faster_peer": 0.75,
        "ratios_vs_peers": {"onnxruntime": 1.5, "openvino": 0.75}}
    assert script.faster_peer_fields({"pytorch": 1.0}, 2.0) == {}
    fields = script.faster_peer_fields({"onnxruntime": 3.0}, 2.0, rounds_ms={"onnxruntime": [3.0, 2.0, 4.0]},
                                       alt_rounds_ms=[2.0, 2.0, 2.0])
    assert fields["ratio_interval"] == [1.0, 2.0]  # three rounds: their range
    rows[1]["ratio_interval"], rows[4]["ratio_interval"] = [1.2, 1.4], [0.4, 0.6]
    assert script.summaries(rows)["alt-tvm (alt)"]["behind_beyond_noise"] == ["b"]


def test_alt_tvm_rows_are_read_against_the_runs_peak(script):
    # 0.5 GFLOP at 250 GFLOP/s take 2 ms: the peer at 2.4 ms reaches 83% of the peak.
    alt = {"model": "a", "runner": "alt-tvm (alt)", "median_ms": 2.5,
           **script.faster_peer_fields({"onnxruntime": 3.0, "openvino": 2.4}, 2.5)}
    rows = [{"runner": "fp32 peak"}, alt, {"model": "a", "runner": "openvino", "median_ms": 2.4},
            {"model": "b", "runner": "alt-tvm (alt)", "median_ms": 1.0,
             **script.faster_peer_fields({"onnxruntime": 2.0}, 1.0)}]
    script.add_at_peak(rows, gflop={"a": 0.5}, peak_gflops=250.0)
    assert alt["alt_share_of_peak"] == pytest.approx(0.8) and alt["peer_share_of_peak"] == pytest.approx(2 / 2.4)
    assert alt["ceiling_vs_faster_peer"] == pytest.approx(1.2)
    assert "gflop" not in rows[2] and "gflop" not in rows[3]  # a peer's row; a model not counted
    assert "geomean_ceiling_vs_faster_peer" not in script.summaries(rows)["alt-tvm (alt)"]
    assert script.summaries(rows[:3])["alt-tvm (alt)"]["geomean_ceiling_vs_faster_peer"] == pytest.approx(1.2)
