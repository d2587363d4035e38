"""alt_tvm.bench: the peers' sessions, alt-tvm against the faster peer, results' place, and the
A/B comparison of two builds (``alt-tvm bench --compare``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import runnable, x86_description

import alt_tvm
from alt_tvm.bench import (
    CPU_PEERS,
    AtPeak,
    ORTRunner,
    Runner,
    against_faster_peer,
    check_threads,
    cpu_peers,
    describe_against_faster_peer,
    faster_peer,
    machine_kind,
    onnxruntime_session,
    openvino_available,
    results_path,
    torch_runner,
    write_results,
)
from alt_tvm.bench.compare import changed_kernels, compare_builds, output_mismatch, parse_config
from alt_tvm.cli import main


@pytest.fixture(scope="module")
def conv_onnx(tmp_path_factory):
    """A two-conv ONNX model whose first conv (and only it) a fast_math build changes: the
    ReLU's NaN test goes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 1)).eval()
    path = tmp_path_factory.mktemp("bench") / "two_convs.onnx"
    torch.onnx.export(model, (torch.randn(1, 16, 14, 14),), str(path), dynamo=False, opset_version=17)
    return path


def test_importing_the_package_imports_no_build_code():
    code = ("import sys, alt_tvm.bench\n"
            "print(sorted(m for m in sys.modules if m.startswith(('alt_tvm.graph', 'alt_tvm.integration', "
            "'alt_tvm.tuning', 'alt_tvm.strategies'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_results_go_to_one_file_per_suite_and_machine_kind(tmp_path):
    kind = machine_kind()
    assert kind and "/" not in kind
    assert results_path("ops", root=tmp_path) == tmp_path / kind / "ops.json"
    assert results_path("cnn_suite", kind="znver4", root=tmp_path) == tmp_path / "znver4" / "cnn_suite.json"
    with pytest.raises(ValueError, match=r"unknown suite 'cnn-suite'; known: cnn_suite, "):
        results_path("cnn-suite")
    written = write_results("ops", {"rows": [1, 2]}, path=tmp_path / "x" / "ops.json", peak_gflops=100.0, threads=2)
    document = json.loads(written.read_text())
    assert document["suite"] == "ops" and document["results"] == {"rows": [1, 2]}
    assert document["peak_gflops"] == 100.0
    assert document["machine"]["kind"] == kind and document["machine"]["threads"] == 2


def test_peers_are_runners_with_the_same_threads_and_no_spinning(conv_onnx):
    session = onnxruntime_session(conv_onnx, threads=2)
    assert isinstance(session, ORTRunner) and isinstance(session, Runner)
    assert (session.name, session.threads) == ("onnxruntime", 2)
    options = session.session.get_session_options()
    assert options.intra_op_num_threads == 2 and options.inter_op_num_threads == 1
    for pool in ("intra_op", "inter_op"):
        assert options.get_session_config_entry(f"session.{pool}.allow_spinning") == "0"
    module = torch.nn.Conv2d(3, 4, 1)
    runner = torch_runner(module, threads=1)
    assert isinstance(runner, Runner) and (runner.name, runner.threads) == ("pytorch", 1)
    with pytest.raises(ValueError, match=r"threads must be a positive int, got 0"):
        onnxruntime_session(conv_onnx, threads=0)
    with pytest.raises(ValueError, match=r"threads must be a positive int, got True"):
        check_threads(True)
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got str"):
        torch_runner("model")


def test_an_ort_session_without_graph_optimisation_keeps_every_node(conv_onnx):
    x = np.random.default_rng(0).standard_normal((1, 16, 14, 14)).astype("float32")
    optimised, plain = onnxruntime_session(conv_onnx), onnxruntime_session(conv_onnx, optimize=False)
    assert output_mismatch(optimised(x), plain(x)) is None


def test_openvino_is_an_optional_peer_that_computes_what_ort_does(conv_onnx):
    if why := openvino_available():
        assert "pip install" in why
        pytest.skip(why)
    from alt_tvm.bench import openvino_session

    runner = openvino_session(conv_onnx, threads=1)
    assert isinstance(runner, Runner) and (runner.name, runner.threads) == ("openvino", 1)
    x = np.random.default_rng(0).standard_normal((1, 16, 14, 14)).astype("float32")
    assert output_mismatch(onnxruntime_session(conv_onnx)(x), runner(x)) is None


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_an_instruction_set_cap_binds_openvinos_convolutions(conv_onnx, isa):
    if why := openvino_available():
        pytest.skip(why)
    from alt_tvm.bench.openvino import ISA_CAPS, ISA_ENV

    target = runnable(x86_description(isa))  # a cap to a set the machine lacks does not bind
    cap = next(name for name, word in ISA_CAPS.items() if word == isa)
    # oneDNN reads the cap once per process, at its first kernel: a child process of its own.
    script = ("import json, sys; from alt_tvm.bench import openvino_kernel_isas; "
              "print(json.dumps(openvino_kernel_isas(sys.argv[1])))")
    done = subprocess.run([sys.executable, "-c", script, str(conv_onnx)], capture_output=True, text=True,
                          env={**os.environ, ISA_ENV: cap}, check=True)
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts.get(isa, 0) >= 1 and set(counts) <= {isa, "unnamed"}, (target.name, counts)


def test_cpu_peers_are_onnx_runtime_and_openvino_on_one_thread_count(conv_onnx):
    made, skipped = cpu_peers(conv_onnx, threads=2)
    assert CPU_PEERS == ("onnxruntime", "openvino")
    if why := openvino_available():
        assert list(made) == ["onnxruntime"] and skipped == {"openvino": why}
        pytest.skip(why)
    assert list(made) == ["onnxruntime", "openvino"] and not skipped
    assert all(runner.threads == 2 for runner in made.values())
    compiled = made["openvino"].compiled  # the CPU plugin as a latency-oriented user sets it
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
    assert str(compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
    assert str(compiled.get_property("INFERENCE_PRECISION_HINT")) in ("f32", "<Type: 'float32'>")
    assert compiled.get_property("ENABLE_CPU_PINNING") is False
    with pytest.raises(ValueError, match=r"unknown peers \['tensorrt'\]; known: onnxruntime, openvino"):
        cpu_peers(conv_onnx, threads=1, peers=["tensorrt"])


@pytest.fixture(scope="module")
def wide_pool_onnx(tmp_path_factory):
    """Hugging Face EfficientNet-B0's pool: a window larger than the map, which ONNX Runtime
    computes (ceil mode: one output) and OpenVINO's ONNX frontend refuses."""
    import onnx
    from onnx import TensorProto, helper

    pool = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[16, 16], strides=[16, 16], ceil_mode=1)
    graph = helper.make_graph([pool], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])])
    path = tmp_path_factory.mktemp("wide_pool") / "wide_pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_model_openvino_cannot_load_leaves_it_out_with_the_reason(wide_pool_onnx):
    path = wide_pool_onnx
    made, skipped = cpu_peers(path, threads=1)
    assert list(made) == ["onnxruntime"]
    x = np.arange(196, dtype=np.float32).reshape(1, 4, 7, 7)
    np.testing.assert_allclose(made["onnxruntime"](x)[0].ravel(), x.mean(axis=(2, 3)).ravel(), rtol=1e-6)
    if why := openvino_available():
        assert skipped == {"openvino": why}
        pytest.skip(why)
    assert skipped["openvino"].startswith(f"OpenVINO could not load {path}: AveragePool"), skipped
    assert "larger than the data shape" in skipped["openvino"]


def test_bench_vs_a_peer_that_cannot_load_the_model_is_one_line_and_status_1(wide_pool_onnx, capsys):
    if why := openvino_available():
        pytest.skip(why)
    assert main(["bench", str(wide_pool_onnx), "--vs", "openvino", "--rounds", "1", "--repeat", "1",
                 "--threads", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("alt-tvm bench: --vs openvino: OpenVINO could not load"), err
    assert "AveragePool" in err[0]


def test_an_openvino_failure_is_told_in_one_line():
    from alt_tvm.bench.openvino import load_failure

    assert load_failure(RuntimeError("boom")) == "boom"
    assert load_failure(RuntimeError("")) == "RuntimeError"
    wrapped = ("Exception from src/core.cpp:132:\nCheck 'false' failed at x.cpp:1:\nFrontEnd API failed with "
               "OpConversionFailure:\n-- Foo-1 with a message:\nWhile validating node 'Foo':\n"
               "the window is too wide\n\nSummary:\n-- Conversion is failed for: Foo-1\n")
    assert load_failure(RuntimeError(wrapped)) == "Foo-1: the window is too wide"


def test_openvino_not_installed_is_skipped_with_the_reason(conv_onnx, monkeypatch):
    import alt_tvm.bench.peers as peers

    monkeypatch.setattr(peers, "openvino_available", lambda: "OpenVINO is not installed (pip install ...)")
    made, skipped = peers.cpu_peers(conv_onnx, threads=1)
    assert list(made) == ["onnxruntime"] and skipped == {"openvino": "OpenVINO is not installed (pip install ...)"}


def test_the_faster_peer_is_the_one_with_the_lower_time_and_the_ratio_its_time_over_alt_tvms():
    times = {"alt-tvm": 2.0, "onnxruntime": 3.0, "openvino": 2.5, "pytorch": 1.0}  # pytorch is no CPU peer
    against = faster_peer(times_ms=times, alt_ms=times["alt-tvm"])
    assert (against.peer, against.peer_ms, against.alt_ms) == ("openvino", 2.5, 2.0)
    assert against.ratio == pytest.approx(1.25)
    assert against.ratios == pytest.approx({"onnxruntime": 1.5, "openvino": 1.25})
    assert against.to_json() == {"faster_peer": "openvino", "faster_peer_ms": 2.5,
                                 "ratio_vs_faster_peer": pytest.approx(1.25),
                                 "ratios_vs_peers": pytest.approx({"onnxruntime": 1.5, "openvino": 1.25})}
    # One peer timed (OpenVINO not installed): it is the faster peer; none timed: no reading.
    assert faster_peer(times_ms={"onnxruntime": 1.0}, alt_ms=2.0).ratio == 0.5
    assert faster_peer(times_ms={"alt-tvm": 1.0, "openvino": None}, alt_ms=1.0) is None
    # Equal times: the first of CPU_PEERS is named.
    assert faster_peer(times_ms={"openvino": 1.0, "onnxruntime": 1.0}, alt_ms=1.0).peer == "onnxruntime"
    with pytest.raises(ValueError, match="alt_ms must be a positive finite number, got 0"):
        faster_peer(times_ms=times, alt_ms=0)
    with pytest.raises(ValueError, match="the time of openvino must be a positive finite number, got nan"):
        faster_peer(times_ms={"openvino": float("nan")}, alt_ms=1.0)


def test_the_median_interval_takes_the_order_statistics_that_cover_the_median():
    from alt_tvm.bench import median_interval

    # Twelve values at 0.9: P(B <= 2) = 79 / 4096, so the 3rd and 10th (coverage 96%); the 4th
    # and 9th would cover only 85%.
    values = [float(v) for v in (12, 3, 7, 1, 9, 5, 11, 2, 8, 4, 10, 6)]
    assert median_interval(values) == (3.0, 10.0)
    assert median_interval(values, confidence=0.8) == (4.0, 9.0)
    # Too few values for the coverage: their whole range.
    assert median_interval([2.0, 1.0, 3.0]) == (1.0, 3.0)
    assert median_interval([5.0]) == (5.0, 5.0)
    with pytest.raises(ValueError, match="at least one value"):
        median_interval([])
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 1.0"):
        median_interval(values, confidence=1.0)


def test_with_each_rounds_times_the_faster_peer_has_the_interval_of_the_paired_ratios():
    # Rounds pair up: the ratio of each round (peer / alt-tvm), not of sorted times.
    alt, ort, ov = [1.0, 2.0, 1.0, 1.0, 1.0], [1.1, 2.2, 1.2, 1.3, 1.0], [3.0] * 5
    against = faster_peer(times_ms={"onnxruntime": 1.2, "openvino": 3.0}, alt_ms=1.0,
                          rounds_ms={"onnxruntime": ort, "openvino": ov}, alt_rounds_ms=alt)
    assert against.peer == "onnxruntime" and against.interval == pytest.approx((1.0, 1.3))
    assert against.to_json()["ratio_interval"] == pytest.approx([1.0, 1.3])
    assert against.describe() == "1.20x [1.00, 1.30]"
    assert faster_peer(times_ms={"onnxruntime": 1.2}, alt_ms=1.0).describe() == "1.20x"
    with pytest.raises(ValueError, match="the rounds of onnxruntime and of alt-tvm must pair up, got 5 and 4"):
        faster_peer(times_ms={"onnxruntime": 1.2}, alt_ms=1.0, rounds_ms={"onnxruntime": ort}, alt_rounds_ms=alt[:4])
    with pytest.raises(ValueError, match="a round of alt-tvm must be a positive finite number, got 0"):
        faster_peer(times_ms={"onnxruntime": 1.2}, alt_ms=1.0, rounds_ms={"onnxruntime": ort},
                    alt_rounds_ms=[0, 1, 1, 1, 1])


def test_over_a_run_the_geometric_mean_and_the_models_behind_the_faster_peer():
    summary = against_faster_peer(ratios={"a": 2.0, "b": 0.5, "c": 1.0, "d": 4.0})
    assert summary["models"] == 4
    assert summary["geomean_ratio_vs_faster_peer"] == pytest.approx(2 ** 0.5)  # (2 * 0.5 * 1 * 4) ** (1/4)
    assert summary["models_behind_faster_peer"] == 1 and summary["behind"] == ["b"]  # 1.0 is level, not behind
    line = describe_against_faster_peer(summary, what="alt-tvm (alt)")
    assert "alt-tvm (alt) against the faster peer" in line and "over 4 model(s): geometric mean 1.41x" in line
    assert line.endswith("behind on 1 (b)")
    assert "beyond the rounds' spread" not in line  # no intervals given
    with_intervals = against_faster_peer(ratios={"a": 2.0, "b": 0.5, "c": 0.98},
                                         intervals={"a": (1.9, 2.1), "b": (0.4, 0.6), "c": (0.95, 1.01)})
    assert with_intervals["behind"] == ["b", "c"] and with_intervals["behind_beyond_noise"] == ["b"]
    assert describe_against_faster_peer(with_intervals).endswith(
        "behind on 2 (b, c), 1 beyond the rounds' spread (its whole interval below 1: b)")
    # An interval for only some of the models says nothing of the run's.
    assert "behind_beyond_noise" not in against_faster_peer(ratios={"a": 1.0, "b": 0.9}, intervals={"b": (0.8, 0.95)})
    assert against_faster_peer(ratios={}) == {"models": 0, "geomean_ratio_vs_faster_peer": None,
                                              "models_behind_faster_peer": 0, "behind": []}
    assert "no model timed with a peer" in describe_against_faster_peer(against_faster_peer(ratios={}))
    with pytest.raises(ValueError, match="the ratio of b must be a positive finite number, got -1"):
        against_faster_peer(ratios={"a": 1.0, "b": -1})


def test_a_model_read_against_the_peak_gives_shares_and_the_ceiling_over_the_faster_peer():
    # 2 GFLOP at 200 GFLOP/s take 10 ms: alt-tvm at 12.5 ms reaches 80% of the peak, the peer at
    # 11 ms 91%, and nothing could be more than 1.1x ahead of that peer.
    at_peak = AtPeak(2.0, 200.0)
    assert at_peak.floor_ms == pytest.approx(10.0)
    against = faster_peer(times_ms={"openvino": 11.0, "onnxruntime": 14.0}, alt_ms=12.5)
    assert at_peak.to_json(against) == {"gflop": 2.0, "alt_share_of_peak": pytest.approx(0.8),
                                        "peer_share_of_peak": pytest.approx(10 / 11),
                                        "ceiling_vs_faster_peer": pytest.approx(1.1)}
    summary = against_faster_peer(ratios={"a": 0.88, "b": 2.0}, ceilings={"a": 1.1, "b": 4.4})
    assert summary["geomean_ceiling_vs_faster_peer"] == pytest.approx((1.1 * 4.4) ** 0.5)
    assert "a runtime at the run's FP32 FMA peak: 2.20x" in describe_against_faster_peer(summary)
    # A ceiling for only some of the models is no geometric mean of the run's.
    assert "geomean_ceiling_vs_faster_peer" not in against_faster_peer(ratios={"a": 1.0, "b": 1.0}, ceilings={"a": 2})
    for bad in ({"gflop": 0.0, "peak_gflops": 1.0}, {"gflop": 1.0, "peak_gflops": float("inf")}):
        with pytest.raises(ValueError, match="must be a positive finite number"):
            AtPeak(**bad)
    with pytest.raises(ValueError, match="ms must be a positive finite number, got -1"):
        at_peak.share(-1)


def test_output_mismatch_says_what_differs():
    a = [np.ones((2, 3), "float32")]
    assert output_mismatch(a, [a[0] + 1e-5]) is None
    assert output_mismatch(a, []) == "0 outputs instead of 1"
    assert output_mismatch(a, [np.ones((3, 2))]) == "output 0 has shape (3, 2) instead of (2, 3)"
    assert "differs by 1.00e+00 of its largest magnitude (allowed 0.001)" in output_mismatch(a, [a[0] * 2])


def test_a_configuration_is_default_a_log_an_artifact_or_build_options(tmp_path):
    log = tmp_path / "model.jsonl"
    log.write_text("")
    artifact = tmp_path / "model.alt"
    artifact.mkdir()
    assert parse_config("default") == {}
    assert parse_config(str(log)) == {"records": str(log)}
    with pytest.raises(ValueError, match="is a directory but not an artifact"):
        parse_config(str(artifact))
    (artifact / "model.json").write_text("{}")
    assert parse_config(str(artifact)) == {"artifact": str(artifact)}
    assert parse_config(f"fast_math=true,records={log},strategies=alt+sconv") == {
        "fast_math": True, "records": str(log), "strategies": ["alt", "sconv"]}
    for bad, message in (("fast", r"neither 'default'.*key=value pairs of records, fast_math, variant"),
                         ("fast_math=yes", "fast_math must be true or false, got 'yes'"),
                         ("speed=1", r"unknown build option 'speed' in 'speed=1'; allowed: records, fast_math"),
                         ("records=/no/such.jsonl", r"records: tuning log '/no/such.jsonl' does not exist")):
        with pytest.raises(ValueError, match=message):
            parse_config(bad)


def test_two_builds_are_checked_then_timed_with_their_unchanged_kernels_as_control(conv_onnx, tmp_path):
    built = {name: alt_tvm.build(str(conv_onnx), fast_math=fast_math)
             for name, fast_math in (("a", False), ("b", True))}
    for name, model in built.items():
        model.export(tmp_path / name / "net")
    models = {name: alt_tvm.load(tmp_path / name / "net") for name in ("a", "b")}
    assert models["a"].kernel_info() == built["a"].kernel_info()  # the digests travel with the artifact
    first, second = (k.name for k in built["a"].report.kernels if k.name.startswith("alt_conv2d"))
    assert changed_kernels(models["a"], models["b"]) == {first}
    whole = compare_builds(models["a"], models["b"], rounds=2, repeat=1)
    assert whole.rounds == 2 and 0 <= whole.rounds_b_faster <= 2 and whole.changed == (first,)
    assert whole.a_ms > 0 and whole.b_ms > 0 and np.isfinite(whole.b_over_a) and whole.b_over_a > 0
    low, high = whole.b_over_a_interval  # two rounds: their paired ratios' range
    assert 0 < low <= whole.b_over_a <= high
    kernels = compare_builds(built["a"], built["b"], labels=("ieee", "fast"), rounds=2, repeat=1, per_kernel=True)
    assert kernels.labels == ("ieee", "fast") and second in kernels.kernels
    assert all(np.isfinite(r) and r > 0 for r in (kernels.changed_b_over_a, kernels.unchanged_b_over_a))
    assert json.loads(json.dumps(kernels.to_json()))["changed_kernels"] == [first]
    with pytest.raises(ValueError, match="rounds must be a positive int, got 0"):
        compare_builds(models["a"], models["b"], rounds=0)


def test_builds_that_compute_different_things_are_not_timed(conv_onnx):
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1)).eval()
    a = alt_tvm.build(str(conv_onnx))
    b = alt_tvm.build(other, example_inputs=[torch.randn(1, 16, 14, 14)])
    with pytest.raises(ValueError, match=r"'b' does not compute what 'a' does: output 0 differs by"):
        compare_builds(a, b, rounds=1, repeat=1)


def test_an_artifact_without_kernel_digests_reads_as_unknown():
    from alt_tvm.deploy.model import kernel_info_from_json

    info = kernel_info_from_json({"k": {"kind": "partition", "ops": ["relax.add"], "layout": "", "flops": 1.0,
                                        "bytes": 8}})
    assert info["k"].digest == ""

    class Model:
        def kernel_info(self):
            return info

    assert changed_kernels(Model(), Model()) is None


def test_bench_compare_on_the_command_line(conv_onnx, capsys):
    assert main(["bench", str(conv_onnx), "--compare", "fast_math=false", "fast_math=true", "--rounds", "2",
                 "--repeat", "1", "--threads", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["a"], printed["b"], printed["rounds"]) == ("fast_math=false", "fast_math=true", 2)
    assert len(printed["changed_kernels"]) == 1 and printed["b_over_a"] > 0
    assert main(["bench", str(conv_onnx), "--compare", "default", "default", "--per-kernel", "--rounds", "1",
                 "--repeat", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "kernels whose code differs: 0" in out and "B/A" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--per-kernel"], "--per-kernel applies with --compare A B"),
    (["--compare", "default", "speed=1"], "--compare: unknown build option 'speed'"),
    (["--compare", "default", "default", "--records", "x.jsonl"], "--records does not apply with --compare"),
])
def test_bench_compare_errors_are_one_line(conv_onnx, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", str(conv_onnx), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_bench_times_openvino_beside_alt_tvm_where_it_is_installed(conv_onnx, capsys):
    if why := openvino_available():
        pytest.skip(why)
    assert main(["bench", str(conv_onnx), "--vs", "openvino", "onnxruntime", "--rounds", "1", "--repeat", "1",
                 "--threads", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed["runners"]) == ["alt-tvm", "openvino", "onnxruntime"]
    assert all(r["median_ms"] > 0 for r in printed["runners"].values())
    times = {label: r["median_ms"] for label, r in printed["runners"].items()}
    faster = min(("onnxruntime", "openvino"), key=times.get)
    against = printed["against_faster_peer"]
    assert against["faster_peer"] == faster
    assert against["ratio_vs_faster_peer"] == pytest.approx(times[faster] / times["alt-tvm"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="needs two CPUs to pin the caller to one")
def test_a_peer_started_on_a_thread_pinned_to_one_core_still_gets_its_threads(conv_onnx):
    """TVM's pool may pin the calling thread to one core; a peer started there is sized by the
    process's CPUs, and the caller's own mask is restored."""
    if why := openvino_available():
        pytest.skip(why)
    from alt_tvm.bench.openvino import openvino_session

    own = os.sched_getaffinity(0)
    one = {min(own)}
    os.sched_setaffinity(0, one)
    try:
        runner = openvino_session(conv_onnx, threads=2)
        assert os.sched_getaffinity(0) == one
    finally:
        os.sched_setaffinity(0, own)
    assert runner.compiled.get_property("INFERENCE_NUM_THREADS") == 2
