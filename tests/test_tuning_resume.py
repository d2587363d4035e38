"""Resuming a tuning run: re-validation finished after a kill, transient failures measured again,
tasks without a successful measurement reported, bad options refused (fake measurements)."""

import math

import pytest
from test_tuning_driver import INPUTS, MODEL, fake_measure

from alt_tvm.integration import extract_tasks
from alt_tvm.records import candidate_key, load_records
from alt_tvm.tuning.driver import BudgetError, tune_tasks
from alt_tvm.tuning.measure import REMOTE_PREFIX, ErrorCode, classify_exception, is_transient
from alt_tvm.tuning.tuner import point_key

OPTIONS = {"cost_model": None, "progress": False, "features": "knobs"}


@pytest.fixture(scope="module")
def tasks():
    return extract_tasks(MODEL, example_inputs=INPUTS)


def killed_at(call, calls):
    """fake_measure, but the ``call``-th call (1-based) raises KeyboardInterrupt (a kill)."""
    honest = fake_measure(calls)

    def measure(task, params):
        if len(calls) + 1 == call:
            raise KeyboardInterrupt
        return honest(task, params)
    return measure


def test_resume_after_a_kill_during_revalidation_makes_the_missing_measurements(tasks, tmp_path):
    # The report: 16 trials (12 search + 2 finalists x 2 rounds), killed during re-validation,
    # resumed: the log ended with 14 records and the summary said 12 trials.
    log = tmp_path / "tune.jsonl"
    calls = []
    with pytest.raises(KeyboardInterrupt):
        tune_tasks(tasks[:1], trials=16, log=log, measure=killed_at(15, calls), **OPTIONS)
    assert len(calls) == 14 and len(load_records(log)) == 14
    resumed = []
    (summary,) = tune_tasks(tasks[:1], trials=16, log=log, measure=fake_measure(resumed), **OPTIONS)
    records = load_records(log)
    assert len(resumed) == 2 and len(records) == 16  # only the two missing re-measurements
    again = [r for r in records if r.candidate.get("revalidation")]
    per_finalist = {}
    for record in again:
        key = candidate_key(record.candidate["params"])
        per_finalist[key] = per_finalist.get(key, 0) + 1
    assert sorted(per_finalist.values()) == [2, 2]
    assert (summary.trials, summary.pending, summary.ok, summary.error) == (16, 0, True, "")
    # A fresh run gives the same summary; resuming once more measures nothing.
    fresh = tune_tasks(tasks[:1], trials=16, log=tmp_path / "fresh.jsonl", measure=fake_measure([]), **OPTIONS)
    assert fresh[0] == summary
    nothing = []
    assert tune_tasks(tasks[:1], trials=16, log=log, measure=fake_measure(nothing), **OPTIONS)[0] == summary
    assert nothing == [] and len(load_records(log)) == 16


def dying_server(calls, *, after):
    """fake_measure until ``after`` calls, then the board is gone (three kinds of transient error);
    the second call is a candidate that does not build (deterministic)."""
    honest = fake_measure([])

    def measure(task, params):
        calls.append(params)
        n = len(calls)
        if n == 2:
            raise RuntimeError("BUILD_ERROR: no valid tiling")
        if n > after:
            raise [RuntimeError("RPC_ERROR: connection lost"), ConnectionResetError("peer reset"),
                   RuntimeError(f"RUN_TIMEOUT: {REMOTE_PREFIX}running exceeded the 10 s limit")][n % 3]
        return honest(task, params)
    return measure


def test_transient_failures_are_measured_again_on_resume_and_build_errors_are_not(tasks, tmp_path):
    log = tmp_path / "tune.jsonl"
    first = []
    (summary,) = tune_tasks(tasks[:1], trials=12, log=log, measure=dying_server(first, after=6), revalidate=0,
                            **OPTIONS)
    records = load_records(log)
    codes = [r.error_code for r in records]
    assert codes.count("BUILD_ERROR") == 1 and "RUN_ERROR" not in codes
    transient = [r for r in records if r.error_code in ("RPC_ERROR", "RUN_TIMEOUT")]
    # 6 search points failed transiently, each measured once more in the run (failing again).
    assert len(records) == 18 and len(transient) == 12
    assert {r.error_code for r in transient} == {"RPC_ERROR", "RUN_TIMEOUT"}
    assert (summary.trials, summary.pending) == (6, 6)
    lost = {point_key(r.candidate["layout"], r.candidate["loop"]) for r in transient}
    assert len(lost) == 6
    # The board is back: a resumed run measures exactly those points again, not the one that does not build.
    resumed = []
    (summary,) = tune_tasks(tasks[:1], trials=12, log=log, measure=fake_measure(resumed), revalidate=0, **OPTIONS)
    remeasured = {point_key(r.candidate["layout"], r.candidate["loop"]) for r in load_records(log)[18:]}
    assert len(resumed) == 6 and remeasured == lost
    assert (summary.trials, summary.pending, summary.ok) == (12, 0, True)
    final = {point_key(r.candidate["layout"], r.candidate["loop"]) for r in load_records(log) if r.ok
             or r.error_code == "BUILD_ERROR"}
    assert len(final) == 12  # one final outcome per requested trial
    nothing = []
    tune_tasks(tasks[:1], trials=12, log=log, measure=fake_measure(nothing), revalidate=0, **OPTIONS)
    assert nothing == []


def test_error_codes_and_transience_are_decided_in_one_place():
    assert classify_exception(RuntimeError("RPC_ERROR: connection lost")) == (ErrorCode.RPC_ERROR, "connection lost")
    assert classify_exception(RuntimeError("BUILD_ERROR: bad")) == (ErrorCode.BUILD_ERROR, "bad")
    assert classify_exception(ConnectionResetError("reset"))[0] == ErrorCode.RPC_ERROR
    assert classify_exception(TimeoutError("slow"))[0] == ErrorCode.RPC_ERROR
    assert classify_exception(ValueError("x")) == (ErrorCode.RUN_ERROR, "ValueError: x")
    assert classify_exception(RuntimeError("NONE: x")) == (ErrorCode.RUN_ERROR, "RuntimeError: NONE: x")
    assert is_transient("RPC_ERROR") and is_transient(ErrorCode.RPC_ERROR, "no free server")
    assert is_transient("RUN_TIMEOUT", REMOTE_PREFIX + "running exceeded the 10 s limit")
    assert not is_transient("RUN_TIMEOUT", "run exceeded 10 s")  # a local hang is the kernel's
    for final in ("BUILD_ERROR", "BUILD_TIMEOUT", "RUN_ERROR", "WRONG_ANSWER", None):
        assert not is_transient(final, "whatever")
    assert not is_transient("RUN_ERROR", "RuntimeError: kernel crashed")


def test_a_task_without_a_successful_measurement_is_reported_not_printed_as_inf(tasks, tmp_path):
    broken = tasks[1].key

    def measure(task, params):
        if task.key == broken:
            raise RuntimeError("BUILD_ERROR: no kernel for this workload")
        return fake_measure([])(task, params)

    summaries = tune_tasks(tasks, trials=24, log=tmp_path / "tune.jsonl", measure=measure, **OPTIONS)
    assert [s.ok for s in summaries] == [True, False, True]
    bad = summaries[1]
    assert bad.error == "BUILD_ERROR: no kernel for this workload"
    assert math.isinf(bad.best_ms) and bad.pending == 0 and bad.trials > 0
    assert all(s.error == "" and math.isfinite(s.best_ms) for s in summaries if s.ok)


@pytest.mark.parametrize("option, value, error, match", [
    ("trials", "4", TypeError, r"trials must be an int >= 2, got '4' of type str"),
    ("trials", True, TypeError, r"trials must be an int >= 2, got True of type bool"),
    ("trials", 4.0, TypeError, r"trials must be an int >= 2, got 4.0"),
    ("trials", 1, ValueError, r"trials must be an int >= 2, got 1"),
    ("trials", 5, BudgetError, r"trials=5 is too small for 3 tasks: give at least 6"),
    ("seed", -1, ValueError, r"seed must be an int >= 0, got -1"),
    ("seed", "0", TypeError, r"seed must be an int >= 0, got '0'"),
    ("joint_fraction", 1.5, ValueError, r"joint_fraction must be a number in \[0, 1\], got 1.5"),
    ("joint_fraction", math.nan, ValueError, r"joint_fraction must be a number in \[0, 1\], got nan"),
    ("joint_fraction", "0.3", TypeError, r"joint_fraction must be a number in \[0, 1\], got '0.3'"),
    ("batch", 0, ValueError, r"batch must be an int >= 1, got 0"),
    ("top_k", 0, ValueError, r"top_k must be an int >= 1, got 0"),
    ("revalidate", -1, ValueError, r"revalidate must be an int >= 0, got -1"),
    ("revalidate_rounds", 2.0, TypeError, r"revalidate_rounds must be an int >= 0, got 2.0"),
])
def test_bad_options_are_refused_before_anything_is_measured(tasks, tmp_path, option, value, error, match):
    log = tmp_path / "tune.jsonl"
    calls = []
    options = {"trials": 24, option: value}
    with pytest.raises(error, match=match):
        tune_tasks(tasks, log=log, measure=fake_measure(calls), **options, **OPTIONS)
    assert calls == [] and not log.exists()
