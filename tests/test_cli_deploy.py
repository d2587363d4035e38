"""``alt-tvm build / bench / profile``: artifacts from the command line, fair tables, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import unpinned
from test_deploy import load_in_fresh_process

import alt_tvm
from alt_tvm.cli import main
from alt_tvm.models import get_model
from alt_tvm.records import read_log
from alt_tvm.target import host

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_LOGS = ROOT / "logs" / "reference"


@pytest.fixture(scope="module")
def small_artifact(tmp_path_factory):
    """small_cnn built by ``alt-tvm build`` (in this process): (artifact path, its JSON output)."""
    out = tmp_path_factory.mktemp("cli") / "small.alt"
    done = subprocess.run([sys.executable, "-m", "alt_tvm.cli.build", "small_cnn", "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=300, preexec_fn=unpinned)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # a clean build writes nothing it was not asked for
    return out, json.loads(done.stdout)


def test_build_writes_an_artifact_that_computes_the_model(small_artifact):
    path, printed = small_artifact
    assert printed["artifact"] == str(path) and printed["target"] == "host"
    assert printed["partitions"] >= 5 and printed["failed"] == {}
    module, inputs = get_model("small_cnn")
    loaded = alt_tvm.load(path)
    with torch.no_grad():
        want = module(*inputs).numpy()
    np.testing.assert_allclose(loaded(inputs[0].numpy())[0], want, rtol=1e-4, atol=1e-4)


def test_bench_prints_ratios_against_baselines_and_draws_them(small_artifact, tmp_path, capsys):
    path, _ = small_artifact
    png = tmp_path / "bench.png"
    assert main(["bench", str(path), "--vs", "onnxruntime", "tvm", "--rounds", "2", "--repeat", "2",
                 "--threads", "1", "--png", str(png), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    runners = result["runners"]
    assert list(runners) == ["alt-tvm", "onnxruntime", "tvm"] and result["threads"] == 1
    for row in runners.values():
        # 2 rounds asked, 6 run: the interleaving design of three runners (balanced_rounds)
        assert row["median_ms"] > 0 and len(row["rounds_ms"]) == 6
        assert row["ratio_vs_alt_tvm"] == pytest.approx(row["median_ms"] / runners["alt-tvm"]["median_ms"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert main(["bench", str(path), "--vs", "--rounds", "1", "--repeat", "1", "--threads", "1"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == ["runtime", "ms", "its", "time", "/", "alt-tvm"] and table[2].startswith("alt-tvm")


def test_profile_lists_kernels_with_their_share(small_artifact, capsys):
    path, _ = small_artifact
    assert main(["profile", str(path), "--json", "--limit", "3", "--repeat", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    kernels = result["kernels"]
    assert len(kernels) == 3 and kernels[0]["ms"] >= kernels[1]["ms"] >= kernels[2]["ms"] > 0
    assert any("relax.nn.conv2d" in k["ops"] and k["gflops"] > 0 and k["layout"] for k in kernels)
    assert 0 < sum(k["share"] for k in kernels) <= 1.0
    # The artifact keeps which kernels a tuning space covers: the convs' strategy has one.
    assert all(k["tuning"] == "default" for k in kernels if "relax.nn.conv2d" in k["ops"])
    assert result["share_tuned"] == 0.0 and 0 < result["share_with_space"] <= 1.0
    assert main(["profile", str(path), "--limit", "2", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["kernel", "kind", "tuning", "ms"] and "more kernels" in lines[3]
    assert lines[-1].startswith("in kernels with a tuning space: ")
    # --roof: the peak (best of a reading before and after) and the bandwidth; calls per run
    assert main(["profile", str(path), "--json", "--limit", "50", "--repeat", "1", "--threads", "1", "--roof"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["peak_gflops"] > 8.0 and result["bandwidth_gbs"] > 0.5
    assert all(k["calls"] >= 1 for k in result["kernels"])
    assert all(k["calls"] == 1 for k in result["kernels"] if k["kernel"].startswith("alt_"))


def _one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv, match", [
    (["build", "no_such_model"], "alt-tvm build: error: 'no_such_model' is neither an ONNX file nor a reference"),
    (["build", "small_cnn", "--target", "pdp11"], "--target: unknown board 'pdp11'"),
    (["build", "small_cnn", "--records", "/no/such.jsonl"], "--records: tuning log '/no/such.jsonl' does not"),
    (["build", "small_cnn", "--priors", "/no/such.json"],
     "--priors: '/no/such.json' is neither auto, none nor a priors"),
    (["bench", "small_cnn", "--threads", "0"], "alt-tvm bench: error: --threads must be >= 1, got 0"),
    (["bench", "small_cnn", "--vs", "mxnet"], "argument --vs: invalid choice: 'mxnet'"),
    (["bench", "no_such_model"], "neither an ONNX file, an artifact directory nor a reference model"),
    (["profile", "small_cnn", "--limit", "0"], "alt-tvm profile: error: --limit must be >= 1, got 0"),
    (["profile", "small_cnn", "--repeat", "x"], "argument --repeat: invalid int value: 'x'"),
])
def test_bad_arguments_are_one_line_errors(capsys, argv, match):
    assert match in _one_line_error(capsys, argv)


def test_argument_errors_that_need_the_files(capsys, small_artifact, tmp_path):
    path, _ = small_artifact
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "is an existing file; an artifact is a directory" in _one_line_error(
        capsys, ["build", "small_cnn", "-o", str(afile)])
    assert "--records applies when building MODEL" in _one_line_error(
        capsys, ["bench", str(path), "--records", str(afile)])
    assert "is a directory but not an artifact" in _one_line_error(capsys, ["profile", str(tmp_path)])
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"")
    assert "--vs torch needs a reference model" in _one_line_error(capsys, ["bench", str(onnx_file), "--vs", "torch"])


def test_help_texts_show_examples(capsys):
    for command in ("build", "bench", "profile"):
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0
        assert f"alt-tvm {command} " in capsys.readouterr().out  # an example line


def test_reference_logs_apply_here_or_say_they_are_for_another_target(tmp_path):
    """The committed example logs load; a ResNet-18 built with its log takes the log's decisions
    on the machine it was made on, and says the log is for another target elsewhere; its
    artifact loads in a fresh process in under a second and computes the model."""
    logs = sorted(REFERENCE_LOGS.glob("*.jsonl"))
    assert {p.stem for p in logs} == {"resnet18", "mobilenet_v2", "bert_tiny"}
    same_machine = {}
    for path in logs:
        log = read_log(path, target=host())
        assert not log.skipped, log.skipped  # every line is a valid record of this schema
        same_machine[path.stem] = bool(log.best or log.defaults)  # defaults: decided to keep them, here
        if not same_machine[path.stem]:
            assert log.elsewhere and all("measured only on other targets" in why for why in log.elsewhere.values())
    out = tmp_path / "r18.alt"
    done = subprocess.run([sys.executable, "-m", "alt_tvm.cli.build", "resnet18", "--records",
                           str(REFERENCE_LOGS / "resnet18.jsonl"), "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, preexec_fn=unpinned)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["report"]
    if same_machine["resnet18"]:
        assert "lowered with the strategy the log chose by in-model time (sconv)" in report, report
        assert done.stderr == ""
    else:
        assert "measured only on other targets" in report + done.stderr
    module, inputs = get_model("resnet18")
    with torch.no_grad():
        want = module(*inputs).numpy()
    got, load_s = load_in_fresh_process(out, inputs[0].numpy(), tmp_path)
    assert load_s < 1.0  # ResNet-18: its build takes about 13 s
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))


def test_a_clean_python_build_of_resnet18_prints_nothing(tmp_path):
    code = ("import alt_tvm\nfrom alt_tvm.models import get_model\n"
            "m, x = get_model('resnet18')\nalt_tvm.build(m, example_inputs=x)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONWARNINGS": "default"}, preexec_fn=unpinned)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
