"""The single-operator suite's harness (alt_tvm.bench.ops) and its benchmark (benchmarks/bench_ops.py):
failures are shown, rounds interleave."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict

import numpy as np
import pytest
from conftest import load_script

import alt_tvm.bench.ops as bench
from alt_tvm.graph.metaschedule import first_candidate_error

script = load_script("bench_ops")
GMM = bench.OpConfig("GMM", 1, 32, 16, (8,))


def _row(**ms) -> bench.Row:
    row = bench.Row(GMM, bench.flops(GMM) / 1e9)
    for label, value in ms.items():
        row.set_ms(label, value)
    return row


def test_failure_message_is_type_and_first_line_cut_to_200_chars():
    assert bench.failure_message(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert bench.failure_message(ValueError()) == "ValueError"
    long = bench.failure_message(RuntimeError("x" * 500))
    assert len(long) == 200 and long.endswith("...")


def test_a_baseline_that_raises_is_shown_failed_with_its_message(capsys):
    row = _row(torch=0.5, tvm_untuned=9.0, alt_default=0.7, alt_kernel=0.4, alt_model=0.45)

    def tune():
        raise RuntimeError("no valid schedule in 24 trials: building failed: TVMError: boom\ntraceback...")

    assert bench.attempt(row, "ms_nhwc", tune) is None
    bench.report([row], trials=24, threads=2, peak=100.0, ms_import_s=0.0)
    out = capsys.readouterr().out
    table_line = next(line for line in out.splitlines() if line.startswith("GMM") and "0.500" in line)
    assert table_line.split()[7] == "failed"  # the MS column
    assert ("MetaSchedule (nhwc) on GMM M=8 K=32 N=16: RuntimeError: no valid schedule in 24 trials: "
            "building failed: TVMError: boom") in out
    assert "traceback" not in out and "nan" not in out


def test_alt_stage_failure_marks_its_three_runners_and_skipped_ms_says_so(capsys):
    row = _row(torch=0.5)
    bench.attempt(row, "alt", lambda: 1 / 0)
    row.skipped.append("ms_nchw")
    assert [row.outcome(k) for k in ("alt_kernel", "alt_default", "alt_model", "ms", "tvm_untuned")] == [
        "failed", "failed", "failed", "skipped", "n/a"]
    bench.report([row], trials=4, threads=2, peak=100.0, ms_import_s=0.0)
    out = capsys.readouterr().out
    assert "alt-tvm (tune, build, check) on GMM M=8 K=32 N=16: ZeroDivisionError: division by zero" in out
    assert "nan" not in out


def test_one_failed_layout_keeps_the_other_layouts_ms_value():
    row = _row(ms_nchw=1.5)
    row.failures["ms_nhwc"] = "RuntimeError: x"
    assert row.outcome("ms") == 1.5 and row.outcome("ms_nhwc") == "failed"


def test_rounds_rotate_the_order_and_report_medians():
    calls = []
    values = {"a": iter([1.0, 5.0, 3.0]), "b": iter([10.0, 30.0, 20.0]), "c": iter([7.0, 7.0, 100.0])}

    def runner(label):
        def run():
            calls.append(label)
            return next(values[label])
        return run

    result = bench.interleaved_medians({k: runner(k) for k in "abc"}, rounds=3)
    assert calls == list("abc") + list("bca") + list("cab")  # a different runner first each round
    assert result.order == [list("abc"), list("bca"), list("cab")]  # (reversed in rounds 4-6: round_order)
    assert result.medians == {"a": 3.0, "b": 20.0, "c": 7.0}
    assert result.rounds["c"] == [7.0, 7.0, 100.0] and result.failures == {}
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        bench.interleaved_medians({}, rounds=0)


def test_a_runner_raising_while_timing_is_dropped_and_reported_the_others_go_on():
    state = {"n": 0}

    def flaky():
        state["n"] += 1
        if state["n"] == 2:
            raise RuntimeError("segfault-ish\nmore")
        return 1.0

    row = _row()
    bench.time_row(row, {"torch": lambda: 2.0, "alt_kernel": flaky}, rounds=4)
    assert state["n"] == 2  # not called again after it failed
    assert row.torch_ms == 2.0 and math.isnan(row.alt_kernel_ms)
    assert row.failures == {"alt_kernel": "while timing: RuntimeError: segfault-ish"}
    assert row.outcome("alt_kernel") == "failed"


def test_plan_calls_is_one_rule_for_fast_and_slow_kernels():
    assert bench.plan_calls(call_ms=0.1, repeat=20) == (50, 20)  # samples of >= 5 ms
    assert bench.plan_calls(call_ms=1500.0, repeat=20) == (1, 3)  # slow: at least 3 samples
    assert bench.plan_calls(call_ms=200.0, repeat=20) == (1, 10)  # 2 s per round
    assert bench.plan_calls(call_ms=1500.0, repeat=2) == (1, 2)


def test_calibrated_warms_up_every_turn_and_keeps_its_first_plan():
    seen = []

    def timed(number, repeat):
        seen.append((number, repeat))
        return 0.1

    run = bench.calibrated(timed, repeat=7, min_sample_ms=5.0)
    run()
    run()
    warmup, plan = seen[0], seen[1]
    assert warmup == (1, 1) and plan[1] == 7 and plan[0] >= 1
    assert seen == [(1, 1), plan, (1, 1), plan]


def test_gmm_is_tuned_once_whichever_layout_is_asked_and_its_failure_is_kept(monkeypatch, tmp_path):
    # GMM has no layout to choose: --ms-layouts nhwc must still tune it, or its MetaSchedule column is a silent nan.
    cfg = bench.OpConfig("GMM", 1, 16, 8, (4,))
    monkeypatch.setattr(script, "_alt_tvm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("alt off")))
    monkeypatch.setattr(script, "_untuned", lambda *a, **k: (lambda number, repeat: 1.0))
    asked = []

    def fake_ms(*args, layout, **kwargs):
        asked.append(layout)
        return (lambda number, repeat: 2.0), 1.0, 0.5
    monkeypatch.setattr(script, "_metaschedule", fake_ms)
    args = argparse.Namespace(seed=0, ms_layouts=["nhwc"], skip_ms=False, trials=2)
    row = bench.Row(cfg, bench.flops(cfg) / 1e9)
    timed, import_s = script._set_up(cfg, row, index=0, args=args, threads=1, machine=_FakeMachine(),
                                    log_dir=str(tmp_path))
    assert asked == ["nhwc"] and "ms_nhwc" in timed and import_s == 0.5
    assert set(timed) == {"torch", "tvm_untuned", "ms_nhwc"} and "alt" in row.failures

    def failing_ms(*args, **kwargs):
        raise RuntimeError("no valid schedule in 2 trials: running failed: x")
    monkeypatch.setattr(script, "_metaschedule", failing_ms)
    row = bench.Row(cfg, bench.flops(cfg) / 1e9)
    script._set_up(cfg, row, index=0, args=args, threads=1, machine=_FakeMachine(), log_dir=str(tmp_path))
    assert row.outcome("ms") == "failed"
    assert row.failures["ms_nhwc"] == "RuntimeError: no valid schedule in 2 trials: running failed: x"



def test_a_log_that_keeps_the_default_schedule_times_the_default_as_the_tuned_kernel(monkeypatch, tmp_path):
    # best_params has no entry when alt-tvm's in-model check kept the defaults; {} would not lower (KeyError).
    cfg = bench.OpConfig("GMM", 1, 16, 8, (4,))
    compiled = type("Compiled", (), {"time": lambda self, x, number, repeat: (1.0, 1.0)})()
    monkeypatch.setattr(script, "_alt_tvm", lambda *a, row, **k: ("task", compiled, None))
    monkeypatch.setattr(script, "_untuned", lambda *a, **k: (lambda number, repeat: 1.0))
    lowered = []
    monkeypatch.setattr(script, "_task_timed", lambda task, params, seed: lowered.append(params) or (lambda n, r: 1.0))
    args = argparse.Namespace(seed=0, ms_layouts=["nchw"], skip_ms=True, trials=2)
    row = bench.Row(cfg, bench.flops(cfg) / 1e9)
    timed, _ = script._set_up(cfg, row, index=0, args=args, threads=1, machine=_FakeMachine(), log_dir=str(tmp_path))
    assert lowered == [None, None] and row.failures == {} and row.skipped == ["ms_nchw"]
    assert {"alt_kernel", "alt_default", "alt_model"} <= set(timed)

class _FakeMachine:
    def to_tvm(self):
        return None


def test_report_of_a_saved_run_keeps_its_failures(tmp_path, capsys):
    row = _row(torch=0.5, alt_kernel=0.4)
    row.failures["ms_nchw"] = "RuntimeError: boom"
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"trials": 4, "threads": 2, "peak_gflops": 100.0, "ms_import_s": 0.0,
                                "timing": "timing: test", "rows": [asdict(row)]}, default=str))
    assert script.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "timing: test" in out and "MetaSchedule (nchw) on GMM M=8 K=32 N=16: RuntimeError: boom" in out


def test_first_candidate_error_reads_metaschedules_task_log(tmp_path):
    assert first_candidate_error(tmp_path) is None
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tvm.s_tir.meta_schedule.logging.task_0_main.log").write_text(
        "2026-11-23 20:27:10 [INFO] [task_scheduler.cc:134] [Task #0: main] Trial #1: Error in building:\n"
        "LocalBuilder: An exception occurred\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "    raise RuntimeError(...)\n"
        "RuntimeError: boom first line\n"
        "second line\n"
        "\n"
        "# from tvm.script import ir as I\n"
        "2026-11-23 20:27:11 [INFO] [task_scheduler.cc:134] [Task #0: main] Trial #2: Error in running:\n"
        "LocalRunner: Timeout, killed after 60 seconds\n")
    assert first_candidate_error(tmp_path) == "building failed: RuntimeError: boom first line"
    (logs / "tvm.s_tir.meta_schedule.logging.task_0_main.log").write_text(
        "2026-11-23 20:27:11 [INFO] [task_scheduler.cc:134] [Task #0: main] Trial #2: Error in running:\n"
        "LocalRunner: Timeout, killed after 60 seconds\n")
    assert first_candidate_error(tmp_path) == "running failed: LocalRunner: Timeout, killed after 60 seconds"


def test_a_real_tvm_kernel_through_the_harness():
    import tvm
    from tvm import te

    a = te.placeholder((256,), name="a")
    b = te.compute((256,), lambda i: a[i] * 2.0, name="b")
    lib = tvm.compile(te.create_prim_func([a, b]), target="llvm")
    args = [tvm.runtime.tensor(np.ones(256, "float32")), tvm.runtime.tensor(np.zeros(256, "float32"))]
    row = _row()
    bench.time_row(row, {"tvm_untuned": bench.calibrated(bench.tvm_timed(lib.mod, args), repeat=3)}, rounds=2)
    assert 0 < row.tvm_untuned_ms < 10 and len(row.round_ms["tvm_untuned"]) == 2
    np.testing.assert_allclose(args[1].numpy(), 2.0)
