"""The ``alt-tvm`` console command dispatches to its subcommands and refuses bad ones."""

import json
import subprocess
import sys

import pytest

from alt_tvm.cli import main


def test_dse_subcommand_prints_the_counts_as_json(capsys):
    assert main(["dse", "--shape", "400", "120", "--json", "--count-only"]) == 0
    obj = json.loads(capsys.readouterr().out)
    counts = {k: obj[k] for k in ("all", "alignment", "vectorization", "initial_layer", "scalability")}
    assert counts["all"] >= counts["alignment"] >= counts["vectorization"] >= counts["scalability"]


def test_unknown_subcommand_and_bad_model_are_clear_errors(capsys, tmp_path):
    assert main(["bogus"]) == 2
    assert "unknown command 'bogus'; choose from tune, build, bench, profile, dse" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["tune", "no_such_model", "--trials", "4", "--log", str(tmp_path / "x.jsonl")])
    assert exited.value.code == 2
    assert "neither a file nor a reference model" in capsys.readouterr().err


def _one_line_error(capsys, argv):
    with pytest.raises(SystemExit) as exited:
        main(["tune", *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("alt-tvm tune: error: "), err
    return err


@pytest.mark.parametrize("argv, match", [
    (["--trials", "0"], "--trials must be an int >= 2, got 0"),
    (["--trials", "-3"], "--trials must be an int >= 2, got -3"),
    (["--trials", "abc"], "argument --trials: invalid int value: 'abc'"),
    (["--trials", "8", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["--trials", "8", "--threads", "-2"], "--threads must be >= 1, got -2"),
    (["--trials", "8", "--joint-fraction", "1.5"], "--joint-fraction must be a number in [0, 1], got 1.5"),
    (["--trials", "8", "--revalidate", "-1"], "--revalidate must be an int >= 0, got -1"),
    (["--trials", "8", "--seed", "-1"], "--seed must be an int >= 0, got -1"),
    (["--trials", "8", "--tracker", "127.0.0.1:9190"], "--tracker and --key go together"),
    (["--trials", "8", "--in-flight", "0"], "--in-flight must be an int >= 1, got 0"),
    (["--trials", "8", "--boards", "2"], "--boards needs --tracker"),
    (["--trials", "8", "--build-workers", "0"], "--build-workers must be >= 1, got 0"),
    (["--trials", "8", "--build-workers", "2", "--target", "kirin990"], "--target kirin990 does not run here"),
    (["--trials", "8", "--in-flight", "2"], "--in-flight needs --tracker"),
    (["--trials", "8", "--lookahead", "1"], "--lookahead needs --tracker"),
    (["--trials", "8", "--tracker", "h:1", "--key", "k", "--lookahead", "-1"],
     "--lookahead must be an int >= 0, got -1"),
    (["--trials", "8", "--tracker", "h:1", "--key", "k", "--boards", "0"], "--boards must be >= 1, got 0"),
    (["--trials", "8", "--scheduler", "fifo"], "argument --scheduler: invalid choice: 'fifo'"),
    (["--trials", "8", "--tracker", "nohost", "--key", "rasp"], "--tracker must be host:port"),
    (["--trials", "8", "--target", "no_such_board"], "--target: unknown board 'no_such_board'; known boards: "),
    (["--trials", "8"], "neither a file nor a reference model"),  # the model below is replaced
])
def test_bad_arguments_are_one_line_errors_with_status_2(capsys, tmp_path, argv, match):
    model = "no_such_model" if "neither" in match else "small_cnn"
    err = _one_line_error(capsys, [model, "--log", str(tmp_path / "x.jsonl"), *argv])
    assert match in err


def test_bad_log_paths_are_one_line_errors_with_status_2(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    err = _one_line_error(capsys, ["small_cnn", "--trials", "8", "--log", str(tmp_path)])
    assert f"--log: '{tmp_path}' is a directory, not a file" in err
    err = _one_line_error(capsys, ["small_cnn", "--trials", "8", "--log", str(afile / "sub" / "x.jsonl")])
    assert f"--log: cannot create directory '{afile / 'sub'}': '{afile}' is not a directory" in err
    err = _one_line_error(capsys, ["small_cnn", "--trials", "8", "--log", str(tmp_path / "x.jsonl"),
                                   "--plot", str(afile / "x.png")])
    assert "--plot: cannot create directory" in err
    assert not (tmp_path / "x.jsonl").exists()


def test_argument_errors_come_before_tvm_is_imported():
    code = ("import sys\nfrom alt_tvm.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    print(e.code, 'tvm' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, "tune", "small_cnn", "--trials", "8", "--threads", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"]
    assert done.stderr == "alt-tvm tune: error: --threads must be >= 1, got 0\n"


def test_a_task_without_a_successful_measurement_fails_the_command(capsys, tmp_path, monkeypatch):
    import math

    import alt_tvm.integration
    from alt_tvm.tuning.driver import TaskSummary

    def tune(model, **options):
        return [TaskSummary("conv2d|1x8x12x12", 1, 8, 2.0, 1.0),
                TaskSummary("dense|1x16", 1, 8, math.inf, math.inf, error="BUILD_ERROR: no kernel"),
                TaskSummary("conv2d|1x16x12x12", 1, 6, math.inf, 1.5, pending=2)]

    monkeypatch.setattr(alt_tvm.integration, "tune", tune)
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    log = tmp_path / "logs" / "m.jsonl"
    assert main(["tune", str(model), "--trials", "16", "--log", str(log), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    table = out.splitlines()[:4]
    assert not any(word in line for line in table for word in ("inf", "nan"))
    assert "2.00x" in table[1] and "failed" in table[2] and "failed" in table[3] and "1.500" in table[3]
    assert err.splitlines() == [
        "alt-tvm tune: task 2 (dense): no candidate measured successfully; last error: BUILD_ERROR: no kernel",
        "alt-tvm tune: task 3 (conv2d): 2 measurement(s) failed transiently (RPC, connection, remote timeout); "
        "run again with --resume to make them"]
    assert log.parent.is_dir()


def test_tune_with_build_workers_builds_batches_in_workers_and_times_them_here(capsys, tmp_path):
    import torch

    from alt_tvm.records import load_records

    model = tmp_path / "conv.onnx"
    torch.onnx.export(torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU()).eval(),
                      (torch.randn(1, 8, 16, 16),), str(model), dynamo=False, opset_version=17)
    log = tmp_path / "bw.jsonl"
    status = main(["tune", str(model), "--trials", "3", "--log", str(log), "--build-workers", "2", "--revalidate",
                   "0", "--features", "knobs", "--no-verify", "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0, out
    records = load_records(log)
    # built in a worker (in-process tuning records no build time), timed here
    assert len(records) == 3 and all(r.ok and r.build_s > 0 for r in records)
    assert "candidates per board (1 at once, 2 build workers):" in out and "this machine: 3 timed, 0 lost" in out


def test_console_script_is_installed():
    done = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points as e; "
                           "print([x.value for x in e(group='console_scripts') if x.name == 'alt-tvm'])"],
                          capture_output=True, text=True, check=True)
    assert "alt_tvm.cli:main" in done.stdout
